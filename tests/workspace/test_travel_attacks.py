"""Attacks on a resumed fork and on the leases a rewind, a fork or an observation takes
for itself (ledger/step/fork.py `resumable`, `registered_fork`, `materialize`;
ledger/step/rewind.py `own_lease`, `holder_gone`; docs/time-travel.md "Fork", "Rewind").

A fork run again goes on from what its target holds when that is nothing but its own,
and a one-call lease whose process is gone is taken over. These try to turn either into
a way to adopt, replace or delete a person's file, or to take a live worker's lease with
its writes still landing. Each shows the attack fails: what the person saved stays, and
a taken-over worker's writes are refused by the fence.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger import InvalidInput, LeaseHeld, Ledger, holders, run_fenced_step
from ledger.gc.audit import audit
from ledger.step import fork as forking
from ledger.step.rewind import holder_gone
from test_travel_crashes import World, fork, kill_at, one_call, temporaries, tree


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped: the pid names no process now
    return pid


def _everything(root: Path) -> dict[str, Any]:
    """Every name under `root` (links as links), with its bytes or target."""
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = (("link", os.readlink(p)) if p.is_symlink() else
                    p.read_bytes() if p.is_file() else "dir")
    return out


# -- a fork run again into a directory that is not all its own --------------------------


@pytest.mark.parametrize("planted", ["a file link", "a directory link"])
def test_a_link_planted_where_the_fork_writes_is_refused_and_left(
        world: World, planted: str) -> None:
    """The link's target holds exactly the fork's bytes for that path: hashed through
    the link it would pass. It is refused as a link, nothing written, nothing moved."""
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "ws-rename", 2)
    mine = world.tmp / "mine"
    (mine / "lib").mkdir(parents=True)
    (mine / "app.py").write_bytes(b"v1\n")  # the fork's app.py as of s1, to the byte
    (mine / "lib" / "util.py").write_bytes(b"util\n")
    for p in target.rglob("*"):  # whatever the kill landed: as if never written
        if p.is_file():
            p.unlink()
    if planted == "a file link":
        (target / "app.py").symlink_to(mine / "app.py")
    else:
        os.rmdir(target / "lib") if (target / "lib").exists() else None
        (target / "lib").symlink_to(mine / "lib")
    before, theirs = _everything(target), _everything(mine)
    with Ledger.open(world.path) as led:
        head = led.head()
        with pytest.raises(InvalidInput, match="holds what this fork does not write"):
            fork(led, target)
        assert led.head() == head
    assert _everything(target) == before and _everything(mine) == theirs


def test_a_hard_link_a_resumed_fork_adopts_never_changes_the_persons_file(
        world: World) -> None:
    """A planned path, and a temporary's name, are hard links to a person's files holding
    the fork's bytes (a prefix of them, for the temporary). The fork adopts the one and
    removes the other name: the person's files keep their bytes, then and after a step
    in the fork rewrites that path."""
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "ws-rename", 1)  # one staged, none in
    [temp] = [p for p in target.rglob("*") if ".steptrail-" in p.name]
    staged = temp.read_bytes()
    mine = world.tmp / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_bytes(staged[:1])  # a prefix of what the temporary stages
    temp.unlink()
    os.link(mine / "keep.txt", temp)
    (mine / "app.py").write_bytes(b"v1\n")
    os.link(mine / "app.py", target / "app.py")
    with Ledger.open(world.path) as led:
        got = fork(led, target)
        assert tree(target) == world.s1 and not temporaries(target)
        lease = led.workspaces.acquire(got.workspace, holder="agent", ttl_s=600)
        run_fenced_step(led, got.workspace, "edit", lambda read: [
            read.read("app.py").write(b"the fork's own\n")], epoch=lease.epoch
        ).raise_for_status()
        assert led.verify().ok and audit(led).ok
    assert (mine / "app.py").read_bytes() == b"v1\n"
    assert (mine / "keep.txt").read_bytes() == staged[:1]
    assert (target / "app.py").read_bytes() == b"the fork's own\n"


def test_a_save_between_the_check_and_the_write_is_never_replaced(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target is found to hold only the fork's own; then a person saves a file where
    the fork is about to write. The fork's write lands beside nothing: it does not replace
    the save, and the fork is not registered."""
    target = world.tmp / "try2"
    checked = forking.resumable

    def then_saved(site: Any, where: str, content: dict[str, str]) -> Any:
        found = checked(site, where, content)
        (Path(where) / "lib").mkdir(parents=True, exist_ok=True)
        (Path(where) / "lib" / "util.py").write_bytes(b"a person's save\n")
        return found

    monkeypatch.setattr(forking, "resumable", then_saved)
    with Ledger.open(world.path) as led:
        with pytest.raises(InvalidInput, match="appeared while it was being written"):
            fork(led, target)
        assert [w.name for w in led.workspaces.list()] == ["w"]
    assert (target / "lib" / "util.py").read_bytes() == b"a person's save\n"


def test_another_name_or_another_point_never_adopts_a_half_made_fork(world: World) -> None:
    """A fork registered and killed before its baseline: the same directory given under
    another name is another workspace's (refused), and the same name as of another step
    finds files that are not its own (refused) — nothing written either time."""
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "commit", 2)  # after registering
    landed = _everything(target)
    with Ledger.open(world.path) as led:
        head = led.head()
        with pytest.raises(InvalidInput):
            led.workspaces.fork("w", "s1", target, name="other")
        with pytest.raises(InvalidInput, match="holds what this fork does not write"):
            led.workspaces.fork("w", "s2", target)  # app.py v2, notes.txt gone
        assert led.head() == head
        assert _everything(target) == landed
        got = fork(led, target)  # the fork itself still goes on
        assert tree(target) == world.s1 and got.baseline


def test_a_persons_registered_workspace_is_not_taken_for_a_fork(world: World) -> None:
    """A workspace a person registered (never observed) at the directory and name a fork
    is given: its files are not the fork's, the fork is refused and writes nothing."""
    mine = world.tmp / "mine"
    mine.mkdir()
    (mine / "app.py").write_bytes(b"my work\n")
    with Ledger.open(world.path) as led:
        led.workspaces.add("mine", str(mine))
        head = led.head()
        with pytest.raises(InvalidInput):
            led.workspaces.fork("w", "s1", mine, name="mine")
        assert led.head() == head
    assert _everything(mine) == {"app.py": b"my work\n"}


# -- leases taken over -----------------------------------------------------------------


@pytest.mark.parametrize("op", ["ws-write", "ws-fsync", "ws-hide", "ws-rename",
                                "ws-dirfsync", "ws-unlink"])
def test_a_live_worker_whose_lease_looks_gone_is_fenced_mid_apply(world: World,
                                                                  op: str) -> None:
    """A worker names itself as a one-call lease of a process that is gone (spoofed, or a
    copied holder string): a rewind takes its lease over while the worker's step is at
    `op`. The takeover settles the step; the worker's commit is refused (stale epoch);
    the tree ends exactly as the rewind left it, every byte in it known to the ledger."""
    spoof = one_call("observe", _dead_pid())
    with Ledger.open(world.path) as led:
        [base] = [r.step for r in led.read(kind="observed")]
    seen = [0]

    def on_op(name: str) -> None:
        if name == op and not seen[0]:
            seen[0] = 1
            with Ledger.open(world.path) as other:  # another caller, mid-apply
                assert other.workspaces.rewind("w", base).verdict == "applied"

    with Ledger.open(world.path, on_op=on_op) as agent:
        lease = agent.workspaces.acquire("w", holder=spoof, ttl_s=600)
        out = run_fenced_step(agent, "w", "agent-edit", lambda read: [
            read.read("app.py").write(b"the worker's\n")], epoch=lease.epoch)
        assert seen[0]
        files = tree(world.root)
        assert files == {"app.py": b"v0\n", "notes.txt": b"notes\n"}, (out.status, files)
        assert not temporaries(world.root)
        assert agent.verify().ok and audit(agent).ok
        if op != "ws-unlink":  # before its commit: refused, undone
            assert out.status == "stale_epoch" and agent.step("agent-edit").state == "compensated"
        assert agent.workspaces.lease("w").holder != spoof


@pytest.mark.parametrize("tail", ["+{pid}:0", " {pid}:0", "{pid} :0", "0{pid}:0", "{pid}", "{pid}:",
                                  "{pid}:0x", "{pid}:-1", "0:0", "00:0", "-1:0", "١٢٣:0",
                                  "99999999999:0", "0x1f:0", "{pid}:0:0"])
def test_a_holder_string_that_is_not_a_gone_one_call_lease_is_waited_for(
        world: World, tail: str) -> None:
    holder = one_call("rewind", 1).rsplit(":", 2)[0] + ":" + tail.format(pid=_dead_pid())
    assert not holder_gone(holder)
    with Ledger.open(world.path) as led:
        led.workspaces.acquire("w", holder=holder[:255], ttl_s=600)
        with pytest.raises(LeaseHeld):
            led.workspaces.rewind("w", "s1")
    assert tree(world.root) == {"app.py": b"v2\n", "lib/util.py": b"util\n"}


def test_another_machines_gone_looking_lease_is_waited_for(world: World) -> None:
    """The pid is dead here, but the holder names another host: its process may be
    running there (a ledger on shared storage). Never taken over."""
    holder = f"steptrail-fork@{socket.gethostname()}.other:{_dead_pid()}"
    (world.root / "app.py").write_bytes(b"a person's edit\n")
    with Ledger.open(world.path) as led:
        led.workspaces.acquire("w", holder=holder, ttl_s=600)
        with pytest.raises(LeaseHeld):
            led.workspaces.observe("w")
        with pytest.raises(LeaseHeld):
            led.workspaces.rewind("w", "s1")
        assert led.workspaces.lease("w").holder == holder
    with Ledger.open(world.path) as led:
        assert led.verify().ok
    assert (world.root / "app.py").read_bytes() == b"a person's edit\n"


def test_another_machine_under_this_host_name_is_waited_for(world: World) -> None:
    """Same host name, another kernel or pid namespace (``MACHINE`` differs): a pid dead
    here may be a live process there. Never taken over."""
    holder = one_call("rewind", _dead_pid()).replace(f"+{holders.machine()}:", "+" + "ab" * 6 + ":")
    assert holders.machine() != "ab" * 6
    with Ledger.open(world.path) as led:
        led.workspaces.acquire("w", holder=holder, ttl_s=600)
        with pytest.raises(LeaseHeld):
            led.workspaces.rewind("w", "s1")
        assert led.workspaces.lease("w").holder == holder
    assert tree(world.root) == {"app.py": b"v2\n", "lib/util.py": b"util\n"}


def _unshare() -> list[str] | None:
    """The command that runs a process in a new pid namespace (with its own /proc), or
    None where this machine does not allow it (not root, no unshare(1))."""
    command = ["unshare", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") is None:
        return None
    try:
        done = subprocess.run([*command, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return command if done.returncode == 0 else None


@pytest.mark.skipif(_unshare() is None, reason="no new pid namespace here (unshare needs root)")
def test_a_rewind_in_another_pid_namespace_never_takes_a_live_lease(world: World) -> None:
    """Two containers share a host name and a ledger (a bind mount): a live process here
    holds a rewind's own lease; a rewind started in another pid namespace — a real one
    (unshare), where that pid names nothing — judged the holder gone by its host name and
    pid and took the lease over. The holder name now carries the kernel boot and pid
    namespace; there it is not this machine's, and the lease is waited for."""
    code = ("import sys, time\n"
            "from ledger import Ledger\n"
            "from ledger.step.observe import default_holder\n"
            "led = Ledger.open(sys.argv[1])\n"
            "lease = led.workspaces.acquire('w', default_holder('rewind'), 600)\n"
            "print(lease.holder, flush=True)\n"
            "time.sleep(120)\n")
    holder_proc = subprocess.Popen([sys.executable, "-c", code, world.path],
                                   stdout=subprocess.PIPE, text=True)
    try:
        held = (holder_proc.stdout.readline() if holder_proc.stdout else "").strip()
        assert held.startswith("steptrail-rewind@"), held
        rewind = ("import sys\n"
                  "from ledger import LeaseHeld, Ledger\n"
                  "with Ledger.open(sys.argv[1]) as led:\n"
                  "    try:\n"
                  "        print(led.workspaces.rewind('w', 's1').verdict)\n"
                  "    except LeaseHeld:\n"
                  "        print('held')\n")
        done = subprocess.run([*(_unshare() or []), sys.executable, "-c", rewind, world.path],
                              capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == "held", (done.stdout, done.stderr[-2000:])
        assert holder_proc.poll() is None  # the holder is alive throughout
        with Ledger.open(world.path) as led:
            assert led.workspaces.lease("w").holder == held
            assert led.verify().ok
        assert tree(world.root) == {"app.py": b"v2\n", "lib/util.py": b"util\n"}
    finally:
        holder_proc.kill()
        holder_proc.wait()
        if holder_proc.stdout is not None:
            holder_proc.stdout.close()

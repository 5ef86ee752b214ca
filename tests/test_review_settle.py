"""Issue 11, item 18: settling a dead attempt that created a file, and what `lease acquire`
and `metrics` report about it.

An attempt's apply pins the pre-images it finds before its first rename. That pin is
evidence, for the whole attempt, that a call got as far as its renames: a file the
attempt created (no pre-image of its own to pin) holding exactly its post-image, at its
base rev, is taken back by the next epoch's settling like a modified file is restored.
Without the evidence (an attempt that never reached its apply, or a pin that only its
planning made) matching bytes may be a person's: a conflict, left as found, which
`lease acquire` reports like `lease settle` does (exit 1, the lease held all the same).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import CliOut, digest_of, run_cli

from ledger import Ledger
from ledger.errors import StorageFailure
from ledger.events import LeaseAcquired
from ledger.workspace.protocol import StepPlan, Write
from ledger.workspace.directory import WorkspaceDir

h = digest_of
MODIFIED = 40  # the review used 300; 40 shows the same and keeps the test fast


class World:
    """A ledger (the CLI's, in-process) and a workspace of MODIFIED files, leased."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        for i in range(MODIFIED):
            (self.dir / f"f{i:03}.py").write_text(f"v0 {i}")
        (self.dir / "app.py").write_text("v0")
        self.path = tmp / "ledger.db"
        assert self.cli("init").code == 0
        assert self.cli("workspace", "add", "w", str(self.dir)).code == 0
        self.epoch = self.acquire("agent-1").json["epoch"]

    def cli(self, *args: str) -> CliOut:
        return run_cli(["--ledger", str(self.path), *args])

    def acquire(self, holder: str, *extra: str) -> CliOut:
        return self.cli("--workspace", "w", "lease", "acquire", "--holder", holder, "--ttl",
                        "10m", "--json", *extra)

    def open(self, **kwargs: Any) -> Ledger:
        return Ledger.open(self.path, **kwargs)

    def admit(self, *writes: Write) -> None:
        with self.open() as led:
            assert led.workspaces.admit("w", self.epoch, [StepPlan("s1", writes, run="r")]) == [None]

    def read(self, path: str) -> str | None:
        p = self.dir / path
        return p.read_text() if p.exists() else None


def _modify_all() -> list[Write]:
    return [Write(f"f{i:03}.py", f"v1 {i}".encode(), h(f"v0 {i}")) for i in range(MODIFIED)]


def _kill_right_after(w: World, path: str, index: int) -> None:
    """Apply s1 in a forked child, SIGKILLed at the first disk operation after the rename
    that makes `path` (its `index`-th write) appear: before the `fenced` commit."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        renames = 0

        def on_op(name: str) -> None:
            nonlocal renames
            if renames > index:  # the rename of `path` has happened
                os.kill(os.getpid(), signal.SIGKILL)
            renames += name == "ws-rename"

        Ledger.open(w.path, on_op=on_op).apply("s1", epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert w.read(path) == "created"
    with w.open(readonly=True) as led:
        assert led.step("s1").state == "planned"  # nothing of the apply is recorded


# --- the review's scenario, with a real SIGKILL -------------------------------------------


@pytest.mark.parametrize("created", ["last", "first"])
def test_a_killed_step_that_created_a_file_is_settled_whole(tmp_path: Path, created: str) -> None:
    """A step modifies MODIFIED files and creates new.txt; the worker is SIGKILLed right
    after new.txt appears. The next epoch (`lease acquire --force`) puts every write
    back — new.txt removed like the modified files are restored — marks nothing a
    conflict, exits 0; `metrics` counts one compensation that succeeded.

    `last`: every rename landed (the review's case). `first`: only new.txt landed; the
    evidence is the pre-images of the modified files, pinned before any rename."""
    w = World(tmp_path)
    new = Write("new.txt", b"created", None)
    writes = [*_modify_all(), new] if created == "last" else [new, *_modify_all()]
    w.admit(*writes)
    _kill_right_after(w, "new.txt", writes.index(new))
    landed = {x.path for x in writes[:writes.index(new) + 1]}
    assert all(w.read(x.path) == x.content.decode() for x in writes if x.path in landed)  # type: ignore[union-attr]

    r = w.acquire("agent-2", "--force")
    # every write put back: the pre-images, and new.txt absent again
    assert w.read("new.txt") is None
    assert all(w.read(f"f{i:03}.py") == f"v0 {i}" for i in range(MODIFIED))
    assert r.code == 0, r
    assert r.json["epoch"] == w.epoch + 1 and r.json["live"] is True
    assert r.json["settled"] == ["s1"] and r.json["conflicts"] == [] and r.json["unsettled"] == []
    assert "conflict" not in r.err
    with w.open(readonly=True) as led:
        comp = next(iter(led.read(step="s1", kind="compensated"))).event
        assert sorted((x.path, x.outcome) for x in comp.restored) == sorted(
            (p, "restored") for p in landed)
        assert led.step("s1").state == "compensated"
        # what the ledger says each path holds is what is on disk
        for path, (_, digest) in led.workspaces.paths("w").items():
            assert digest == (None if w.read(path) is None else h(w.read(path))), path
        assert led.verify().ok

    m = w.cli("metrics", "--json")
    assert m.code == 0
    assert m.json["compensation_success_rate"] == {
        "rate": 1.0, "compensations": 1, "with_restores": 1, "succeeded": 1, "conflicted": 0}


# --- without evidence: fail-safe -------------------------------------------------------------


def test_without_evidence_a_created_file_stays_a_conflict_and_acquire_says_so(
        tmp_path: Path) -> None:
    """The attempt never reached its apply (no pre-image pinned): a person created
    new.txt with exactly the bytes it planned. Those bytes are left as found, recorded
    as a conflict; `lease acquire` says so like `lease settle` (exit 1, the conflicts on
    stderr and in --json), and the new epoch is live all the same."""
    w = World(tmp_path)
    w.admit(Write("app.py", b"v1", h("v0")), Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")  # by hand, the same bytes

    r = w.acquire("agent-2", "--force")
    assert r.code == 1, r
    assert w.read("new.txt") == "created" and w.read("app.py") == "v0"
    assert r.json["epoch"] == w.epoch + 1 and r.json["live"] is True
    assert r.json["settled"] == ["s1"]
    assert r.json["conflicts"] == [{"step": "s1", "attempt": 1, "path": "new.txt", "rev": 0,
                                    "digest": h("created")}]
    assert "s1:new.txt" in r.err and "1 path conflict" in r.err
    assert f"the lease is held (epoch {w.epoch + 1})" in r.err
    assert r.err.count("\n") == 1  # one line
    shown = w.cli("--workspace", "w", "lease", "show", "--json").json
    assert shown["epoch"] == w.epoch + 1 and shown["live"] is True and shown["unsettled"] == []
    m = w.cli("metrics", "--json").json["compensation_success_rate"]
    assert (m["rate"], m["conflicted"]) == (0.0, 1)


def test_acquire_text_output_lists_the_conflicts(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.admit(Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")
    r = w.cli("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force")
    assert r.code == 1, r
    assert r.out.startswith(f"epoch {w.epoch + 1}: workspace w leased by agent-2")
    assert "settled (compensated) older epochs' steps: s1" in r.out
    assert "s1:new.txt" in r.err and "the lease is held" in r.err


def test_a_plan_time_pin_is_no_evidence_for_settling(tmp_path: Path) -> None:
    """b.txt's pre-image is a.txt's post-image, so the planning itself pinned that digest
    (as a post-image). That pin existed before any apply: no evidence. The attempt never
    reached its apply and a person wrote exactly b.txt's planned bytes: left as found."""
    w = World(tmp_path)
    (w.dir / "a.txt").write_text("X")
    (w.dir / "b.txt").write_text("Y")
    w.admit(Write("a.txt", b"Y", h("X")), Write("b.txt", b"Z", h("Y")))
    (w.dir / "b.txt").write_text("Z")  # by hand
    r = w.acquire("agent-2", "--force")
    assert w.read("b.txt") == "Z" and w.read("a.txt") == "X"
    assert r.code == 1 and [c["path"] for c in r.json["conflicts"]] == ["b.txt"]


def test_a_plan_time_pin_is_no_evidence_for_a_rejection(tmp_path: Path) -> None:
    """The same on the rejection path (a same-epoch replay rejected, `_undo_landed`)."""
    w = World(tmp_path)
    (w.dir / "a.txt").write_text("X")
    (w.dir / "b.txt").write_text("Y")
    w.admit(Write("a.txt", b"Y", h("X"), 5),  # a stale base rev: the fence rejects
            Write("b.txt", b"Z", h("Y")))
    (w.dir / "b.txt").write_text("Z")  # by hand
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "rejected:stale_rev"
        rejected = next(iter(led.read(step="s1", kind="rejected"))).event
        assert [(u.path, u.outcome) for u in rejected.undone] == [("b.txt", "conflict")]
        assert led.verify().ok
    assert w.read("b.txt") == "Z" and w.read("a.txt") == "X"


def test_a_move_that_never_ran_leaves_a_hand_copy_alone(tmp_path: Path) -> None:
    """A move (a.txt deleted, b.txt created with its bytes) is planned; its post-image is
    a.txt's pre-image, pinned by the planning. The worker dies before applying and a
    person copies a.txt to b.txt by hand: nothing pinned a pre-image, so the copy —
    identical to the planned post-image — is a conflict, not removed."""
    w = World(tmp_path)
    (w.dir / "a.txt").write_text("X")
    w.admit(Write("a.txt", None, h("X")), Write("b.txt", b"X", None))
    (w.dir / "b.txt").write_text("X")  # cp a.txt b.txt
    r = w.acquire("agent-2", "--force")
    assert w.read("b.txt") == "X" and w.read("a.txt") == "X"
    assert r.code == 1 and [c["path"] for c in r.json["conflicts"]] == ["b.txt"]


# --- reporting -----------------------------------------------------------------------------


def test_already_and_restored_both_count_as_a_successful_compensation(tmp_path: Path) -> None:
    """An applied attempt of an old epoch: one file was put back by hand (``already``),
    the other still holds the post-image (``restored``). The settling succeeded: exit 0,
    rate 1.0, and the ``already`` is an ambiguous reconciliation."""
    w = World(tmp_path)
    w.admit(Write("f000.py", b"v1 0", h("v0 0")), Write("f001.py", b"v1 1", h("v0 1")))
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"
    (w.dir / "f000.py").write_text("v0 0")  # put back by hand
    r = w.acquire("agent-2", "--force")
    assert r.code == 0 and r.json["conflicts"] == [], r
    with w.open(readonly=True) as led:
        comp = next(iter(led.read(step="s1", kind="compensated"))).event
    assert sorted((x.path, x.outcome) for x in comp.restored) == [
        ("f000.py", "already"), ("f001.py", "restored")]
    m = w.cli("metrics", "--json").json
    assert m["compensation_success_rate"] == {
        "rate": 1.0, "compensations": 1, "with_restores": 1, "succeeded": 1, "conflicted": 0}
    assert m["ambiguous_reconciliations"]["already_restores"] == 1


def test_acquire_that_could_not_settle_a_step_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settling fails for a step (the disk refuses the restore): the lease is acquired,
    the step is listed as unsettled (stderr, --json) and the exit is 1."""
    w = World(tmp_path)
    w.admit(Write("app.py", b"v1", h("v0")))
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"

    def refuse(self: WorkspaceDir, path: str, *_: object, **__: object) -> None:
        raise StorageFailure(os.path.join(self.root, path), "Input/output error")

    monkeypatch.setattr(WorkspaceDir, "land", refuse)
    r = w.acquire("agent-2", "--force")
    assert r.code == 1, r
    assert r.json["epoch"] == w.epoch + 1 and r.json["unsettled"] == ["s1"]
    assert r.json["settled"] == [] and r.json["conflicts"] == []
    assert "Unsettled:" in r.err and "(s1)" in r.err and "lease settle --epoch" in r.err
    assert r.json["error"]["type"] == "Unsettled" and r.err.count("\n") == 1
    monkeypatch.undo()
    s = w.cli("--workspace", "w", "lease", "settle", "--epoch", str(w.epoch + 1), "--json")
    assert s.code == 0 and s.json["conflicts"] == [] and w.read("app.py") == "v0"


def test_lease_settle_json_lists_the_conflicts_as_acquire_does(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.admit(Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")
    with w.open() as led:  # a new epoch whose acquire died before settling
        now = led.clock()
        led.append(LeaseAcquired(workspace="w", epoch=w.epoch + 1, holder="agent-2",
                                 expires_ns=now + 600 * 10**9, forced=True))
    r = w.cli("--workspace", "w", "lease", "settle", "--epoch", str(w.epoch + 1), "--json")
    assert r.code == 1
    assert r.json["conflicts"] == [{"step": "s1", "attempt": 1, "path": "new.txt", "rev": 0,
                                    "digest": h("created")}]
    assert r.json["settled"][0]["conflicts"] == ["new.txt"]



#: Each test runs on SQLite and on PostgreSQL (tests/conftest.py).
BOTH_STORES = True

"""Revision fences, the apply journal, epoch leases and compensation (issue 4).

The fence-mode verdict table (docs/design.md "Fence modes") is asserted cell by
cell; each column switches one mechanism off, so a cell where a mechanism matters shows
the other outcome in the neighbouring column.
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, LedgerAt, sqlite_at

from ledger import Ledger
from ledger.errors import (
    CompensationWindowClosed,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerError,
    PathEscapes,
    ReplanRefused,
    StaleEpoch,
    UnknownWorkspace,
)
from ledger.step.values import StepPlan, Write
from ledger.step.undo import answer_compensation


def h(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class World:
    """A ledger, one workspace directory holding app.py = "v0", and a live lease. The
    ledger is at `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: Path, fence: str = "step", journal: bool = True,
                 clock: FakeClock | None = None, *, at: LedgerAt = sqlite_at,
                 **options: Any) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0")
        self.clock = clock or FakeClock()
        self.path = at(tmp / "ledger.db")
        self.ledger = Ledger.init(self.path, clock=self.clock, **options)
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        self.fence, self.journal = fence, journal

    def write(self, step: str, new: str, pre: str | None, base: int | None = None,
              path: str = "app.py") -> StepPlan:
        return StepPlan(step, [Write(path, new.encode(), None if pre is None else h(pre), base)],
                        run="run-1")

    def admit(self, *plans: StepPlan, run_fence: str | None = None) -> list[Any]:
        return self.ledger.workspaces.admit("w", self.epoch, list(plans), fence=run_fence or self.fence,
                                 journal=self.journal)

    def apply(self, step: str, attempt: int | None = None, ledger: Ledger | None = None) -> str:
        return (ledger or self.ledger).workspaces.apply(step, attempt, epoch=self.epoch).verdict

    def commit(self, step: str) -> None:
        self.ledger.publish(step)
        self.ledger.ack(step)

    def disk(self, path: str = "app.py") -> str:
        return (self.dir / path).read_text()

    def human_through_steptrail(self, new: str) -> None:
        rev, digest = self.ledger.workspaces.snapshot("w", "app.py")
        self.ledger.workspaces.admit("w", self.epoch, [StepPlan("human", [Write("app.py", new.encode(),
                                                                     digest, rev)], run="human")])
        assert self.ledger.workspaces.apply("human", epoch=self.epoch).verdict == "applied"
        self.commit("human")


MODES = {  # column -> (fence, journal)
    "none": ("none", False),
    "plan": ("plan", False),
    "step": ("step", False),
    "step+journal": ("step", True),
}


def concurrent_edit(w: World) -> str:
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    w.human_through_steptrail("human-refactor")
    return w.apply("s2")


def untracked_edit(w: World) -> str:
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    (w.dir / "app.py").write_text("human edit on disk")
    return w.apply("s2")


def preemption_retry(w: World) -> str:
    w.admit(w.write("s1", "v1", "v0"))
    assert w.apply("s1") == "applied"
    w.ledger.publish("s1")  # the ack is lost
    fresh = Ledger.open(w.path, clock=w.clock)  # a fresh executor, same persisted ledger
    try:
        verdict = w.apply("s1", 1, ledger=fresh)
    finally:
        fresh.close()
    if verdict == "applied":
        return "applied twice"
    return verdict


def replan_drift(w: World) -> str:
    w.admit(w.write("s1", "v1", "v0"))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    rev, digest = w.ledger.workspaces.snapshot("w", "app.py")  # the new model reads the current state
    w.admit(StepPlan("s2", [Write("app.py", b"v1-tail", digest, rev)], run="run-1"))
    return w.apply("s2")


def stale_replan(w: World) -> str:
    w.admit(w.write("s1", "v1", "v0"))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    w.admit(w.write("s2", "v0-tail", "v0", base=0))  # the new model plans on the old base
    return w.apply("s2")


TABLE: dict[str, tuple[Callable[[World], str], dict[str, str]]] = {
    "concurrent_edit": (concurrent_edit, {"none": "applied", "plan": "rejected:stale_rev",
                                          "step": "rejected:stale_rev",
                                          "step+journal": "rejected:stale_rev"}),
    "untracked_edit": (untracked_edit, {"none": "applied", "plan": "rejected:stale_rev",
                                        "step": "rejected:pre_hash",
                                        "step+journal": "rejected:pre_hash"}),
    "preemption_retry": (preemption_retry, {"none": "applied twice", "plan": "rejected:stale_rev",
                                            "step": "rejected:stale_rev",
                                            "step+journal": "deduped"}),
    "replan_drift": (replan_drift, {"none": "applied", "plan": "rejected:stale_rev",
                                    "step": "applied", "step+journal": "applied"}),
    "stale_replan": (stale_replan, {"none": "applied", "plan": "rejected:stale_rev",
                                    "step": "rejected:stale_rev",
                                    "step+journal": "rejected:stale_rev"}),
}


@pytest.mark.parametrize("column", list(MODES))
@pytest.mark.parametrize("scenario", list(TABLE))
def test_verdict_table(tmp_path: Path, ledger_at: LedgerAt, scenario: str, column: str) -> None:
    fence, journal = MODES[column]
    w = World(tmp_path, fence, journal, at=ledger_at)
    run, expected = TABLE[scenario]
    assert run(w) == expected[column]
    assert w.ledger.verify().ok


def test_lost_updates_are_real_without_a_fence(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """`applied` under fence=none in the table is a lost update: the human's bytes are gone."""
    w = World(tmp_path, "none", False, at=ledger_at)
    concurrent_edit(w)
    assert w.disk() == "v2"  # "human-refactor" was overwritten
    w2 = (World(tmp_path / "b", "step", True, at=ledger_at) if (tmp_path / "b").mkdir() is None
          else None)
    assert w2 is not None
    concurrent_edit(w2)
    assert w2.disk() == "human-refactor"


def test_preemption_retry_with_journal_returns_the_first_receipt(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    first = w.ledger.workspaces.apply("s1", epoch=w.epoch)
    again = w.ledger.workspaces.apply("s1", 1, epoch=w.epoch)
    assert again.verdict == "deduped" and again.receipt == first.receipt
    assert w.ledger.workspaces.get("w").rev == 1
    assert sum(1 for e in w.ledger.read(kind="fenced")) == 1


def test_without_journal_a_redelivery_applies_twice(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, "none", False, at=ledger_at)
    preemption_retry(w)
    assert sum(1 for e in w.ledger.read(kind="fenced")) == 2
    assert w.ledger.workspaces.get("w").rev == 2


# --- plan admission ----------------------------------------------------------------------


def test_siblings_writing_one_path_must_chain(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    out = w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v0"))  # s2 not on s1's result
    assert [r.verdict for r in out] == ["rejected:overlap", "rejected:overlap"]
    assert w.ledger.step("s1").state == "rejected"
    assert w.disk() == "v0"


def test_chained_siblings_apply_in_order(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    assert w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"),
                   w.write("s3", "v3", "v2")) == [None, None, None]
    for s in ("s1", "s2", "s3"):
        assert w.apply(s) == "applied"
        w.commit(s)
    assert w.disk() == "v3" and w.ledger.workspaces.get("w").rev == 3


def test_plan_fence_refuses_even_an_undisturbed_second_step(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The table's point: a plan-level fence is loud in the wrong places."""
    w = World(tmp_path, "plan", True, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    assert w.apply("s1") == "applied"
    assert w.apply("s2") == "rejected:stale_rev"


# --- epochs and leases ------------------------------------------------------------------


def test_one_live_lease_and_epochs_grow(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    with pytest.raises(LeaseHeld):
        w.ledger.workspaces.acquire("w", "other", ttl_s=60)
    forced = w.ledger.workspaces.acquire("w", "other", ttl_s=60, force=True)
    assert forced.epoch == w.epoch + 1
    w.clock.advance(61)
    assert not w.ledger.workspaces.lease("w").live
    with pytest.raises(StaleEpoch):  # an expired lease is never revived
        w.ledger.workspaces.heartbeat("w", forced.epoch, ttl_s=60)
    assert w.ledger.workspaces.acquire("w", "third", ttl_s=60).epoch == forced.epoch + 1


def test_heartbeat_extends_the_live_lease(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.clock.advance(3000)
    lease = w.ledger.workspaces.heartbeat("w", w.epoch, ttl_s=3600)
    w.clock.advance(3000)
    assert lease.live and w.ledger.workspaces.lease("w").live


def test_a_bare_lease_is_a_lease_with_no_directory(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """`acquire(bare=True)` on a name no workspace has makes a lease with no directory
    (a LangGraph thread's claim, issue 26): epochs, takeover, heartbeat and release as a
    workspace's; not a workspace (not listed, nothing admitted under it, its name not
    addable); a registered workspace's lease is taken as usual; rebuilt alike."""
    w = World(tmp_path, at=ledger_at)
    with pytest.raises(UnknownWorkspace):
        w.ledger.workspaces.acquire("thread-lease", "a", ttl_s=60)  # without `bare`, as before
    first = w.ledger.workspaces.acquire("thread-lease", "a", ttl_s=60, bare=True)
    assert first.epoch == 1
    with pytest.raises(LeaseHeld):
        w.ledger.workspaces.acquire("thread-lease", "b", ttl_s=60, bare=True)
    second = w.ledger.workspaces.acquire("thread-lease", "b", ttl_s=60, force=True, bare=True)
    assert second.epoch == 2 and w.ledger.workspaces.heartbeat("thread-lease", 2, ttl_s=60).live
    with pytest.raises(StaleEpoch):
        w.ledger.workspaces.release("thread-lease", 1)
    assert w.ledger.workspaces.release("thread-lease", 2).released
    assert [r.name for r in w.ledger.workspaces.list()] == ["w"]
    with pytest.raises(UnknownWorkspace):  # no directory: nothing writes under it
        w.ledger.workspaces.admit("thread-lease", 2, [w.write("s1", "v1", "v0")])
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(IllegalTransition, match="bare lease"):
        w.ledger.workspaces.add("thread-lease", other)
    assert w.ledger.workspaces.acquire("w", "agent-2", ttl_s=60, force=True, bare=True).epoch == 2
    assert w.ledger.verify().ok
    w.ledger.rebuild()
    lease = w.ledger.workspaces.lease("thread-lease")
    assert (lease.epoch, lease.holder, lease.released) == (2, "b", True)


def test_zombie_worker_cannot_commit_anything(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The zombie that keeps running after its timeout: its every effect is refused."""
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    zombie = w.epoch
    w.clock.advance(3601)  # the lease expired; a new worker takes over
    w.epoch = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600).epoch
    count = w.ledger.count()
    with pytest.raises(StaleEpoch):
        w.ledger.workspaces.apply("s1", epoch=zombie)
    assert w.disk() == "v0"
    # the settle compensated the zombie's attempt; nothing it sends moves anything
    assert w.ledger.step("s1").state == "compensated"
    with pytest.raises(StaleEpoch):
        w.ledger.workspaces.admit("w", zombie, [w.write("s9", "x", "v0")])
    assert w.ledger.count() == count


def test_late_200_after_the_sandbox_was_reclaimed(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """apply_patch answered 200 (epoch 1), the sandbox was reclaimed (epoch 2) before the
    result was recorded: the settle put the pre-image back, the late publish is refused."""
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    result = w.ledger.workspaces.apply("s1", epoch=w.epoch)
    assert w.disk() == "v1"
    new = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    assert new.settled == ("s1",)
    assert w.disk() == "v0"
    with pytest.raises(StaleEpoch):
        w.ledger.publish("s1", receipt=result.receipt)
    assert not w.ledger.step("s1").live
    with pytest.raises(InvalidInput, match="empty body"):
        w.ledger.publish("s1", receipt=b"")
    assert w.ledger.verify().ok


def test_a_redelivered_event_of_a_dead_epoch_returns_the_first_result(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    manifest = w.ledger.publish("s1")
    first = w.ledger.ack("s1")
    w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    assert w.ledger.publish("s1") == manifest
    again = w.ledger.ack("s1")
    assert again.deduped and again.seq == first.seq


def test_a_new_epoch_settles_an_unpublished_attempt_and_the_step_goes_on(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    w.epoch = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True).epoch
    assert w.disk() == "v0" and w.ledger.step("s1").state == "compensated"
    attempt = w.ledger.workspaces.replan("s1", epoch=w.epoch)  # every pre_hash still holds
    assert attempt == 2
    assert w.ledger.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"
    w.commit("s1")
    assert w.disk() == "v1" and w.ledger.step("s1").live


def test_settle_never_overwrites_a_human_edit(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    (w.dir / "app.py").write_text("human")
    new = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    assert w.disk() == "human"
    comp = answer_compensation(w.ledger.workspaces.site, "s1", 1)
    assert [r.outcome for r in comp.restored] == ["conflict"]
    with pytest.raises(ReplanRefused):
        w.ledger.workspaces.replan("s1", epoch=new.epoch)


# --- compensation -----------------------------------------------------------------------


def test_compensate_restores_only_where_rev_and_post_image_hold(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    w.commit("s1")
    comp = w.ledger.workspaces.compensate("s1", epoch=w.epoch, reason="tests failed")
    assert [r.outcome for r in comp.restored] == ["restored"]
    assert w.disk() == "v0" and not w.ledger.step("s1").live
    assert w.ledger.manifest("s1", 0) is not None  # kept for audit
    again = w.ledger.workspaces.compensate("s1", epoch=w.epoch, reason="tests failed")
    assert again.deduped and again.seq == comp.seq


def test_compensation_after_a_b_a_is_a_conflict(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """s1 v0->v1, then v1->v0 and v0->v1 again by others: the bytes match s1's
    post-image but the rev does not; undoing would be wrong."""
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    w.commit("s1")
    w.human_through_steptrail("v0")
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("again", [Write("app.py", b"v1", h("v0"), None)])])
    w.apply("again")
    w.commit("again")
    comp = w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert [r.outcome for r in comp.restored] == ["conflict"]
    assert w.disk() == "v1"


def test_compensation_window(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, compensation_window_s=60, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    w.commit("s1")
    w.clock.advance(61)
    w.ledger.workspaces.heartbeat("w", w.epoch, ttl_s=3600)
    with pytest.raises(CompensationWindowClosed):
        w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert w.disk() == "v1"


def test_compensating_a_rejected_attempt_is_illegal(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0", base=5))
    assert w.apply("s1") == "rejected:stale_rev"
    with pytest.raises(IllegalTransition):
        w.ledger.workspaces.compensate("s1", epoch=w.epoch)


# --- confinement and bad input ----------------------------------------------------------


def test_paths_cannot_escape_the_workspace(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    outside = tmp_path / "outside"
    outside.mkdir()
    (w.dir / "link").symlink_to(outside)
    for path in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(InvalidInput):
            w.admit(StepPlan("bad", [Write(path, b"x", None)]))
    w.admit(StepPlan("sym", [Write("link/x", b"x", None)]))
    with pytest.raises(PathEscapes):
        w.ledger.workspaces.apply("sym", epoch=w.epoch)
    assert not (outside / "x").exists()


def test_unknown_workspace_and_bad_epoch(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    with pytest.raises(UnknownWorkspace):
        w.ledger.workspaces.admit("nope", 1, [w.write("s", "x", "v0")])
    with pytest.raises(InvalidInput):
        w.ledger.workspaces.admit("w", 0, [w.write("s", "x", "v0")])


# --- a crash between the rename and the ledger commit (a real SIGKILL) --------------------


def _crash_after_rename(w: World) -> None:
    """Fork a child that applies s1 and is SIGKILLed right after the rename, before the
    fenced transaction commits."""
    w.admit(w.write("s1", "v1", "v0"))
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        seen: list[str] = []

        def on_op(name: str) -> None:
            seen.append(name)
            if name == "ws-dirfsync" and "ws-rename" in seen:
                os.kill(os.getpid(), signal.SIGKILL)

        child = Ledger.open(w.path, clock=w.clock, on_op=on_op)
        child.workspaces.apply("s1", epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    w.ledger = Ledger.open(w.path, clock=w.clock)
    assert w.ledger.step("s1").state == "planned"  # the fenced commit never happened
    assert w.disk() == "v1"  # but the rename did


def test_crash_between_rename_and_commit_is_settled_on_replay(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    _crash_after_rename(w)
    result = w.ledger.workspaces.apply("s1", epoch=w.epoch)
    assert result.verdict == "applied" and result.receipt is not None and result.receipt.settled
    assert w.ledger.workspaces.snapshot("w", "app.py") == (1, h("v1"))
    w.commit("s1")
    assert w.ledger.verify().ok


def test_a_human_edit_in_the_crash_window_is_never_overwritten(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    _crash_after_rename(w)
    (w.dir / "app.py").write_text("human")
    assert w.apply("s1") == "rejected:pre_hash"
    assert w.disk() == "human"


def test_the_next_epoch_settles_a_crashed_apply(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    _crash_after_rename(w)
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=60, force=True)
    assert lease.settled == ("s1",)
    assert w.disk() == "v0"  # the pre-image, pinned before the rename, went back
    assert w.ledger.verify().ok


def test_a_rejected_replay_puts_back_the_writes_that_landed(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Found by the model-based fault machine: the first apply of a two-write step is
    SIGKILLed after app.py's rename and before b.py's; a human then edits b.py. The
    replay is rejected (pre_hash on b.py) — and must not leave app.py's post-image
    behind, recorded nowhere: it puts the pinned pre-image back and says so."""
    w = World(tmp_path, at=ledger_at)
    (w.dir / "b.py").write_text("b0")
    w.admit(StepPlan("s1", [Write("app.py", b"v1", h("v0")), Write("b.py", b"b1", h("b0"))]))
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        renames: list[str] = []

        def on_op(name: str) -> None:
            if name == "ws-rename":
                renames.append(name)
                if len(renames) == 2:  # app.py's exchange landed; b.py's not begun
                    os.kill(os.getpid(), signal.SIGKILL)

        Ledger.open(w.path, clock=w.clock, on_op=on_op).workspaces.apply("s1", epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    w.ledger = Ledger.open(w.path, clock=w.clock)
    assert w.disk() == "v1" and (w.dir / "b.py").read_text() == "b0"
    (w.dir / "b.py").write_text("human")
    assert w.apply("s1") == "rejected:pre_hash"
    assert w.disk() == "v0"  # put back, not left as an unrecorded post-image
    assert (w.dir / "b.py").read_text() == "human"  # the human's edit is never touched
    rejected = next(iter(w.ledger.read(step="s1", kind="rejected"))).event
    assert [(r.path, r.outcome, r.digest) for r in rejected.undone] == [
        ("app.py", "restored", h("v0"))]
    assert w.ledger.workspaces.snapshot("w", "app.py") == (0, h("v0"))  # what the ledger says
    assert w.ledger.verify().ok
    # redelivered, the rejection is the answer again and nothing moves
    assert w.apply("s1") == "rejected:pre_hash" and w.disk() == "v0"


def test_a_rejection_without_evidence_leaves_matching_bytes_as_a_conflict(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The other side: an attempt that never got to its exchanges (no slot of it holds
    anything it displaced) is rejected on its first apply, and a human had written
    exactly the bytes it planned for a new file. Those bytes are the human's: left as
    found and recorded as a conflict, never removed."""
    w = World(tmp_path, at=ledger_at)
    w.admit(StepPlan("s1", [Write("app.py", b"v1", h("v0"), 5),  # stale: rejected
                            Write("new.txt", b"n", None)]))
    (w.dir / "new.txt").write_bytes(b"n")  # by hand, the same bytes
    assert w.apply("s1") == "rejected:stale_rev"
    assert (w.dir / "new.txt").read_bytes() == b"n" and w.disk() == "v0"
    rejected = next(iter(w.ledger.read(step="s1", kind="rejected"))).event
    assert [(r.path, r.outcome) for r in rejected.undone] == [("new.txt", "conflict")]
    assert w.ledger.verify().ok


def test_fence_verdict_rules(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The verdict rules: reject and re-plan; replay the stored result;
    compensate to the checkpoint; accept a rebase."""
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    first = w.ledger.workspaces.apply("s1", epoch=w.epoch)
    w.commit("s1")
    w.human_through_steptrail("h1")
    # stale base -> reject, then re-plan from the current rev (a rebase) -> accept
    assert w.apply("s2") == "rejected:stale_rev"
    rev, digest = w.ledger.workspaces.snapshot("w", "app.py")
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s2", [Write("app.py", b"v2 on h1", digest, rev)])])
    assert w.ledger.step("s2").attempt == 2
    assert w.apply("s2") == "applied"
    # journal hit -> the stored result
    assert w.ledger.workspaces.apply("s1", 1, epoch=w.epoch).receipt == first.receipt
    # applied but its tests fail -> compensate to the checkpoint (h1)
    comp = w.ledger.workspaces.compensate("s2", epoch=w.epoch, reason="tests failed")
    assert [r.outcome for r in comp.restored] == ["restored"] and w.disk() == "h1"
    assert w.ledger.verify().ok


def test_replayed_apply_after_a_crash_with_two_writes(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """One write landed before the crash (SIGKILL between the two exchanges), the other
    did not: the replay records the first as found and applies the second. The same
    bytes written by a person, with no exchange behind them, are a conflict instead."""
    w = World(tmp_path, at=ledger_at)
    (w.dir / "b.py").write_text("b0")
    w.admit(StepPlan("s", [Write("app.py", b"v1", h("v0")), Write("b.py", b"b1", h("b0"))]))
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        renames: list[str] = []

        def on_op(name: str) -> None:
            if name == "ws-rename":
                renames.append(name)
                if len(renames) == 2:
                    os.kill(os.getpid(), signal.SIGKILL)

        Ledger.open(w.path, clock=w.clock, on_op=on_op).workspaces.apply("s", epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    w.ledger = Ledger.open(w.path, clock=w.clock)
    assert w.disk() == "v1" and (w.dir / "b.py").read_text() == "b0"
    result = w.ledger.workspaces.apply("s", epoch=w.epoch)
    assert result.verdict == "applied" and result.receipt is not None and result.receipt.settled
    assert (w.dir / "b.py").read_text() == "b1"
    assert w.ledger.workspaces.paths("w") == {"app.py": (1, h("v1")), "b.py": (2, h("b1"))}
    assert sorted(p.name for p in w.dir.iterdir() if p.name.startswith(".")) == [".steptrail"] \
        or not any(".steptrail-" in p.name for p in w.dir.iterdir())  # no slot left behind
    w.commit("s")
    comp = w.ledger.workspaces.compensate("s", epoch=w.epoch)  # its pre-image was kept from the slot
    assert [r.outcome for r in comp.restored] == ["restored", "restored"]
    assert w.disk() == "v0" and (w.dir / "b.py").read_text() == "b0"


def test_the_planned_bytes_written_by_a_person_are_not_taken_for_a_crash(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    (w.dir / "b.py").write_text("b0")
    w.admit(StepPlan("s", [Write("app.py", b"v1", h("v0")), Write("b.py", b"b1", h("b0"))]))
    (w.dir / "app.py").write_text("v1")  # a person, not an exchange
    assert w.apply("s") == "rejected:pre_hash"
    assert w.disk() == "v1" and (w.dir / "b.py").read_text() == "b0"


def test_creating_and_deleting_files(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(StepPlan("new", [Write("pkg/new.py", b"x", None)]))
    assert w.apply("new") == "applied" and (w.dir / "pkg" / "new.py").read_text() == "x"
    w.commit("new")
    w.admit(StepPlan("rm", [Write("pkg/new.py", None, h("x"))]))
    assert w.apply("rm") == "applied" and not (w.dir / "pkg" / "new.py").exists()
    comp = w.ledger.workspaces.compensate("rm", epoch=w.epoch)
    assert [r.outcome for r in comp.restored] == ["restored"]
    assert (w.dir / "pkg" / "new.py").read_text() == "x"
    w.admit(StepPlan("exists", [Write("app.py", b"y", None)]))  # planned as absent
    assert w.apply("exists") == "rejected:pre_hash"


# --- the workspace protocol is a collaborator, not a mixin ----------------------------


def test_the_workspace_protocol_is_one_object_on_the_ledger(tmp_path: Path,
                                                           ledger_at: LedgerAt) -> None:
    """Users reach the workspace protocol as `ledger.workspaces` (one `Workspaces`), not
    through delegations on `Ledger`: no public method of `Workspaces` is also on `Ledger`."""
    from ledger.workspaces import Workspaces

    names = {n for n, v in vars(Workspaces).items() if callable(v) and not n.startswith("_")}
    assert {"acquire", "add", "admit", "apply", "compensate", "settle", "restore",
            "confined"} <= names
    assert names & {n for n in dir(Ledger) if not n.startswith("_")} == set()
    assert not issubclass(Ledger, Workspaces)
    w = World(tmp_path, at=ledger_at)
    assert isinstance(w.ledger.workspaces, Workspaces)
    assert w.ledger.workspaces.list() == [w.ledger.workspaces.get("w")]


def test_admit_refuses_a_different_plan_in_the_library(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "app.py").write_bytes(b"v0")
    with Ledger.init(tmp_path / "l.db") as led:
        led.workspaces.add("w", str(tmp_path / "ws"))
        epoch = led.workspaces.acquire("w", "a").epoch
        plan = [StepPlan("s1", [Write("app.py", b"v1", h("v0"))])]
        assert led.workspaces.admit("w", epoch, plan) == [None]
        n = led.count()
        assert led.workspaces.admit("w", epoch, plan) == [None]  # idempotent
        other = [StepPlan("s2", [Write("b.py", b"b", None)]),
                 StepPlan("s1", [Write("app.py", b"v2", h("v0"))])]
        with pytest.raises(LedgerError) as caught:  # (PlanConflict)
            led.workspaces.admit("w", epoch, other)
        assert type(caught.value).__name__ == "PlanConflict"
        assert caught.value.exit_code == 1 and "new content" in str(caught.value)
        assert led.count() == n and led.find_step("s2") is None  # nothing of the batch


def test_an_apply_result_is_typed_beside_its_verdict_text() -> None:
    """`outcome` and `reason` are the verdict as types (the JSON contract keeps the text)."""
    from ledger.step.values import ApplyResult

    rejected = ApplyResult(verdict="rejected:pre_hash", step="s", attempt=1)
    assert (rejected.outcome, rejected.reason, rejected.applied) == ("rejected", "pre_hash", False)
    for verdict in ("applied", "deduped", "compensated"):
        done = ApplyResult(verdict=verdict, step="s", attempt=1)
        assert (done.outcome, done.reason) == (verdict, None)
    assert ApplyResult(verdict="deduped", step="s", attempt=1).applied


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True

"""The I3/I4/I5 checkers catch the broken variants: no fence, no journal, no epoch check.

Each broken variant is built by recording the events a protocol without that mechanism
would record (through the raw append API, which does not fence, or the test-only path
that skips the epoch guard); the same step through the real protocol is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LedgerAt
from test_fences import World, h

from ledger import invariants
from ledger.errors import StaleEpoch
from ledger.events import (
    Acked,
    AppliedWrite,
    Compensated,
    Fenced,
    Planned,
    PlannedWrite,
    Rejected,
    Restored,
)
from ledger.invariants import Checker
from ledger.testing.broken import append_unchecked


def breaches(w: World) -> list[invariants.Breach]:
    return invariants.check(w.ledger.read())


def test_a_clean_protocol_run_has_no_breach(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    w.apply("s1")
    w.commit("s1")
    w.human_through_steptrail("human")
    assert w.apply("s2") == "rejected:stale_rev"
    w.ledger.workspaces.compensate("s1", epoch=w.epoch)  # a conflict: the human moved the rev
    w.ledger.workspaces.acquire("w", "b", ttl_s=60, force=True)
    assert breaches(w) == []
    assert w.ledger.verify().ok


def test_i3_catches_a_write_applied_without_the_fence(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"), w.write("s2", "v2", "v1"))
    w.apply("s1")
    w.commit("s1")
    w.human_through_steptrail("human")  # app.py is at rev 2 now; s2 planned on rev 1
    assert w.apply("s2") == "rejected:stale_rev"  # the mechanism
    w2 = World(tmp_path / "broken", at=ledger_at) if (tmp_path / "broken").mkdir() is None else None
    assert w2 is not None
    w2.admit(w2.write("s1", "v1", "v0"), w2.write("s2", "v2", "v1"))
    w2.apply("s1")
    w2.commit("s1")
    w2.human_through_steptrail("human")
    # an executor without the fence applies s2 anyway and records it
    w2.ledger.append(Fenced(step="s2", attempt=1, run="run-1", workspace="w", epoch=w2.epoch,
                            rev=3, writes=(AppliedWrite(path="app.py", rev=3, pre_hash=h("v1"),
                                                        post_hash=h("v2")),)))
    found = breaches(w2)
    assert [b.invariant for b in found] == ["I3"]
    assert "planned against rev 1" in found[0].message
    report = w2.ledger.verify()
    assert not report.ok and [f.check for f in report.findings] == ["I3"]


def test_i3_catches_a_compensation_that_ignores_the_rev(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """A -> B -> A: bytes equal the attempt's post-image, the rev does not."""
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.apply("s1")
    w.commit("s1")
    w.human_through_steptrail("v0")
    rev, _ = w.ledger.workspaces.snapshot("w", "app.py")
    ws_rev = w.ledger.workspaces.get("w").rev
    w.ledger.append(Compensated(step="s1", attempt=1, run="run-1", workspace="w", epoch=w.epoch,
                                rev=ws_rev + 1, restored=(Restored(path="app.py", rev=ws_rev + 1,
                                                                   digest=h("v0")),)))
    assert [b.invariant for b in breaches(w)] == ["I3"]
    assert rev == 2


def test_i4_catches_an_executor_that_ignores_the_journal(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)  # the plan uses the journal
    w.admit(w.write("s1", "v1", "v0"))
    first = w.ledger.workspaces.apply("s1", epoch=w.epoch)
    assert w.ledger.workspaces.apply("s1", 1, epoch=w.epoch).verdict == "deduped"  # the mechanism
    # an executor that keys each apply by its result instead re-applies and records it
    w.ledger.append(Fenced(step="s1", attempt=1, run="run-1", workspace="w", epoch=w.epoch,
                           rev=2, journal=False,
                           writes=(AppliedWrite(path="app.py", rev=2, pre_hash=h("v1"),
                                                post_hash=h("v1")),)))
    assert first.receipt is not None
    found = breaches(w)
    # the re-apply also wrote on a moved rev (I3); the journal breach is the point here
    assert [b.invariant for b in found] == ["I4", "I3"]
    assert "applied again" in found[0].message


def test_i5_catches_an_effect_under_a_dead_epoch(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.admit(w.write("s1", "v1", "v0"))
    w.clock.advance(3601)  # the lease expired
    late = Fenced(step="s1", attempt=1, run="run-1", workspace="w", epoch=w.epoch, rev=1,
                  writes=(AppliedWrite(path="app.py", rev=1, pre_hash=h("v0"), post_hash=h("v1")),))
    with pytest.raises(StaleEpoch):  # the mechanism: the guard refuses it
        w.ledger.append(late)
    append_unchecked(w.ledger, late)  # a ledger without the epoch check records it
    found = breaches(w)
    assert [b.invariant for b in found] == ["I5"]
    assert "live epoch was None" in found[0].message


def test_invariant_checker_forgets_attempts_that_ended(tmp_path: Path) -> None:
    """The I3/I4 checker keeps an attempt's plan only while it may still be applied or
    compensated as planned: acked and rejected attempts leave nothing behind."""
    checker = Checker()
    seq = 0
    for i in range(500):
        step = f"s{i}"
        write = PlannedWrite(path=f"f{i % 7}", base_rev=0, pre_hash=None, post_hash="a" * 64)
        events = [Planned(step=step, attempt=1, workspace="w", writes=(write,))]
        if i % 2:
            events += [Fenced(step=step, attempt=1, workspace="w", rev=i + 1, writes=(
                AppliedWrite(path=write.path, rev=i + 1, pre_hash=None, post_hash="a" * 64),)),
                Acked(step=step, attempt=1)]
        else:
            events.append(Rejected(step=step, attempt=1, workspace="w", reason="stale_rev"))
        for e in events:
            seq += 1
            checker.feed(seq, seq, e)
    assert checker.st.plans == {}
    assert len(checker.st.path_rev) == 7  # one entry per path, not per write


#: The tests that take `ledger_at` run on SQLite and on PostgreSQL (tests/conftest.py).
BOTH_STORES = True

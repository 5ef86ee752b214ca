"""`ledger.metrics`: each number on a constructed scenario, with exact expectations.

The clock stands still unless a test advances it (FakeClock(step_ns=0)), so every
duration below is exact.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import FakeClock, LedgerAt, sqlite_at

from ledger import Ledger
from ledger.step.values import Write
from ledger.metrics import compute

S = 1_000_000_000


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class World:
    """The ledger at `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: Path, *, at: LedgerAt = sqlite_at) -> None:
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0")
        self.clock = FakeClock(step_ns=0)
        self.path = at(tmp / "ledger.db")
        self.ledger = Ledger.init(self.path, clock=self.clock)
        self.ledger.workspaces.add("w", str(self.dir))

    def plan(self, step: str, epoch: int, path: str, new: str, pre: str | None,
             base: int | None = None) -> None:
        assert self.ledger.workspaces.plan_step(
            step, workspace="w", epoch=epoch,
            writes=[Write(path, new.encode(), None if pre is None else h(pre), base)],
        ) is None

    def apply(self, step: str, epoch: int) -> str:
        return self.ledger.workspaces.apply(step, epoch=epoch).verdict


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> World:
    w = World(tmp_path, at=ledger_at)
    yield w
    w.ledger.close()


def test_an_empty_ledger_has_no_numbers(world: World) -> None:
    m = compute(world.ledger)
    assert m.events == 1  # workspace-added
    assert m.checkpoint_age_s.max is None
    assert [(c.workspace, c.age_s, c.step) for c in m.checkpoint_age_s.workspaces] == [
        ("w", None, None)]
    assert m.lease_expiration_rate.rate is None and m.lease_expiration_rate.leases == 0
    assert m.ambiguous_reconciliations.count == 0
    assert m.compensation_success_rate.rate is None
    assert m.time_to_resume_s.median is None and m.time_to_resume_s.max is None
    assert m.drift.writes == 0 and m.drift.mean is None and m.drift.max is None


def test_lease_outcomes_resume_times_checkpoint_age_and_drift(world: World) -> None:
    led, clock = world.ledger, world.clock
    t0 = clock.now
    assert led.workspaces.acquire("w", "a", ttl_s=60).epoch == 1          # expires t0+60
    clock.advance(61)
    assert led.workspaces.acquire("w", "b", ttl_s=60).epoch == 2          # after e1's expiry: expired
    clock.advance(5)
    world.plan("s1", 2, "app.py", "v1", "v0", base=0)          # drift 0 (ws rev 0)
    clock.advance(2)
    assert world.apply("s1", 2) == "applied"                   # e2 resumed after 7 s
    led.workspaces.release("w", 2)                                        # released before expiry
    clock.advance(1)
    e3 = led.workspaces.acquire("w", "c", ttl_s=100)                      # settles s1 (restored)
    assert e3.epoch == 3 and e3.settled == ("s1",)
    clock.advance(10)
    assert led.workspaces.acquire("w", "d", ttl_s=100, force=True).epoch == 4  # e3 preempted, no apply
    clock.advance(3)
    world.plan("s2", 4, "other.txt", "o", None)                # ws rev 2, base 0: drift 2
    assert world.apply("s2", 4) == "applied"                   # e4 resumed after 3 s
    led.publish("s2")
    assert clock.now == t0 + 82 * S

    m = compute(led, now_ns=clock.now + 10 * S)
    le = m.lease_expiration_rate
    assert (le.leases, le.expired, le.released, le.preempted, le.live, le.ended) == (4, 1, 1, 1, 1, 3)
    assert le.rate == pytest.approx(1 / 3)
    tr = m.time_to_resume_s
    assert (tr.median, tr.max, tr.resumes, tr.unresumed) == (5.0, 7.0, 2, 1)
    cp = m.checkpoint_age_s
    assert cp.max == 10.0
    assert [(c.workspace, c.age_s, c.step) for c in cp.workspaces] == [("w", 10.0, "s2")]
    assert cp.workspaces[0].last_commit_ns == t0 + 82 * S
    assert (m.drift.writes, m.drift.mean, m.drift.max, m.drift.drifted) == (2, 1.0, 2, 1)
    cs = m.compensation_success_rate
    assert (cs.compensations, cs.with_restores, cs.succeeded, cs.conflicted, cs.rate) == (1, 1, 1, 0, 1.0)

    # the live lease (e4, expires t0+179) expires: it counts as expired from then on
    later = compute(led, now_ns=t0 + 179 * S)
    le = later.lease_expiration_rate
    assert (le.expired, le.live, le.ended, le.rate) == (2, 0, 4, 0.5)
    assert later.checkpoint_age_s.max == 97.0


def test_a_lease_released_after_it_expired_counts_as_expired(world: World) -> None:
    world.ledger.workspaces.acquire("w", "a", ttl_s=10)
    world.clock.advance(11)
    world.ledger.workspaces.release("w", 1)  # allowed: the latest epoch, given up late
    le = compute(world.ledger).lease_expiration_rate
    assert (le.expired, le.released, le.rate) == (1, 0, 1.0)


def test_heartbeats_move_the_expiry_a_takeover_is_judged_by(world: World) -> None:
    led, clock = world.ledger, world.clock
    led.workspaces.acquire("w", "a", ttl_s=10)
    clock.advance(8)
    led.workspaces.heartbeat("w", 1, ttl_s=10)       # now expires at +18
    clock.advance(9)                      # +17: live thanks to the heartbeat
    led.workspaces.acquire("w", "b", ttl_s=10, force=True)
    le = compute(led).lease_expiration_rate
    assert (le.preempted, le.expired, le.live) == (1, 0, 1)


class Crash(Exception):
    pass


def test_ambiguous_reconciliations_and_compensation_outcomes(world: World, tmp_path: Path) -> None:
    led = world.ledger
    epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    # 1. a crash between the rename and the fenced commit, settled on replay
    world.plan("s1", epoch, "app.py", "v1", "v0")
    seen: list[str] = []

    def on_op(name: str) -> None:
        seen.append(name)
        if name == "ws-dirfsync" and "ws-rename" in seen:
            raise Crash

    crashing = Ledger.open(world.path, clock=world.clock, on_op=on_op)
    try:
        with pytest.raises(Crash):
            crashing.workspaces.apply("s1", epoch=epoch)
    finally:
        crashing.close()
    assert (world.dir / "app.py").read_text() == "v1" and led.step("s1").state == "planned"
    result = led.workspaces.apply("s1", epoch=epoch)
    assert result.verdict == "applied" and result.receipt is not None and result.receipt.settled
    led.publish("s1")
    led.ack("s1")

    # 2. the pre-image is already back when the compensation runs ("already")
    world.plan("s2", epoch, "new.txt", "x", None)
    assert world.apply("s2", epoch) == "applied"
    (world.dir / "new.txt").unlink()
    comp = led.workspaces.compensate("s2", epoch=epoch, reason="undo")
    assert [r.outcome for r in comp.restored] == ["already"]

    # 3. a human edited the path since: a conflict, nothing overwritten
    world.plan("s3", epoch, "app.py", "v3", "v1")
    assert world.apply("s3", epoch) == "applied"
    (world.dir / "app.py").write_text("human")
    comp = led.workspaces.compensate("s3", epoch=epoch, reason="undo")
    assert [r.outcome for r in comp.restored] == ["conflict"]

    # 4. an artifact-only step's compensation has nothing to restore
    led.plan("report", artifacts=["out/r.txt"])
    assert led.workspaces.compensate("report", reason="not needed").restored == ()

    m = compute(led)
    am = m.ambiguous_reconciliations
    assert (am.count, am.settled_applies, am.already_restores) == (2, 1, 1)
    cs = m.compensation_success_rate
    assert (cs.compensations, cs.with_restores, cs.succeeded, cs.conflicted) == (3, 2, 1, 1)
    assert cs.rate == 0.5
    # the settled apply committed: the checkpoint is that publish, 0 s ago
    assert m.checkpoint_age_s.max == 0.0 and m.checkpoint_age_s.workspaces[0].step == "s1"


@pytest.mark.sqlite_only
def test_metrics_are_read_only(world: World) -> None:
    world.ledger.workspaces.acquire("w", "a", ttl_s=10)
    world.ledger.close()
    before = world.path.read_bytes()
    with Ledger.open(world.path, readonly=True, clock=world.clock) as ro:
        m = compute(ro)
    assert m.lease_expiration_rate.leases == 1
    assert world.path.read_bytes() == before
    world.ledger = Ledger.open(world.path, clock=world.clock)


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True

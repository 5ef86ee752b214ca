"""A write planned on a revision that only observations moved since is carried over
(ledger/step/admit.py `carried_over`; docs/time-travel.md "At each lease").

An observation records the edits made outside the steps as they were found: it moves the
revision of every path it records (the baseline: every file). A write its writer planned
on what it read before — the bytes still there — was refused as stale, so observing at
each lease refused an MCP client's first write after its read. Now such a write is
admitted on the revision of now. Never carried: a step's write or an undo in between (an
A-B-A through steps), other bytes, a path a batch wrote before; and the fence still checks
the disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger
from ledger.errors import LedgerError
from ledger.step import admit as admit_mod
from ledger.step.values import StepPlan


@pytest.fixture
def led(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "w"
    root.mkdir()
    (root / "app.py").write_bytes(b"A\n")
    (root / "notes.txt").write_bytes(b"n\n")
    ledger = Ledger.init(str(tmp_path / "ledger.db"))
    ledger.workspaces.add("w", str(root))
    ledger.root = root  # type: ignore[attr-defined]
    yield ledger
    ledger.close()


def _apply(led: Ledger, epoch: int, step: str, write):  # type: ignore[no-untyped-def]
    [verdict] = led.workspaces.admit("w", epoch, [StepPlan(step, [write])])
    if verdict is not None:
        return verdict.verdict
    return led.workspaces.apply(step, epoch=epoch).verdict


def test_a_read_before_the_baseline_is_carried_over(led: Ledger) -> None:
    read = led.workspaces.read_file("w", "app.py")  # rev 0: the ledger never recorded it
    lease = led.workspaces.acquire("w", "agent", ttl_s=600, observe=True)  # the baseline
    assert lease.observed_changes == 2
    assert _apply(led, lease.epoch, "s1", read.write(b"B\n")) == "applied"
    assert (led.root / "app.py").read_bytes() == b"B\n"  # type: ignore[attr-defined]
    [planned] = [e.event for e in led.read(step="s1", kind="planned")]
    assert planned.writes[0].base_rev > 0  # recorded on the revision of now
    # a retried admission of the same plan (its read's revision) is the same plan
    assert led.workspaces.admit("w", lease.epoch, [StepPlan("s1", [read.write(b"B\n")])]) \
        == [None]
    assert led.verify().ok


def test_the_checker_fails_without_the_carry_over(led: Ledger,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: without it, the same write is refused as stale."""
    monkeypatch.setattr(admit_mod, "carried_over", lambda *a, **k: False)
    read = led.workspaces.read_file("w", "app.py")
    lease = led.workspaces.acquire("w", "agent", ttl_s=600, observe=True)
    assert _apply(led, lease.epoch, "s1", read.write(b"B\n")) == "rejected:stale_rev"


def test_an_edit_observed_back_to_what_was_read_is_carried_over(led: Ledger) -> None:
    """A person changes the file and changes it back, each recorded: it holds what the
    writer read; the person's intermediate version stays in the history."""
    root: Path = led.root  # type: ignore[attr-defined]
    led.workspaces.observe("w", by="test")
    read = led.workspaces.read_file("w", "app.py")
    (root / "app.py").write_bytes(b"person\n")
    led.workspaces.observe("w", by="test", full=True)
    (root / "app.py").write_bytes(b"A\n")
    led.workspaces.observe("w", by="test", full=True)
    lease = led.workspaces.acquire("w", "agent", ttl_s=600)
    assert _apply(led, lease.epoch, "s1", read.write(b"B\n")) == "applied"


def test_a_steps_write_in_between_is_never_carried_over(led: Ledger) -> None:
    """A-B-A through steps: the same bytes, but another writer's work in between."""
    read = led.workspaces.read_file("w", "app.py")
    lease = led.workspaces.acquire("w", "agent", ttl_s=600)
    b = led.workspaces.read_file("w", "app.py").write(b"other\n")
    assert _apply(led, lease.epoch, "x1", b) == "applied"
    back = led.workspaces.read_file("w", "app.py").write(b"A\n")
    assert _apply(led, lease.epoch, "x2", back) == "applied"
    assert _apply(led, lease.epoch, "s1", read.write(b"B\n")) == "rejected:stale_rev"
    assert (led.root / "app.py").read_bytes() == b"A\n"  # type: ignore[attr-defined]


def test_other_bytes_observed_are_never_carried_over(led: Ledger) -> None:
    root: Path = led.root  # type: ignore[attr-defined]
    read = led.workspaces.read_file("w", "app.py")
    (root / "app.py").write_bytes(b"the person's fix\n")
    lease = led.workspaces.acquire("w", "agent", ttl_s=600, observe=True)
    verdict = _apply(led, lease.epoch, "s1", read.write(b"B\n"))
    assert verdict in ("rejected:stale_rev", "rejected:pre_hash")
    assert (root / "app.py").read_bytes() == b"the person's fix\n"


def test_an_undone_observation_in_between_is_never_carried_over(led: Ledger) -> None:
    root: Path = led.root  # type: ignore[attr-defined]
    led.workspaces.observe("w", by="test")
    read = led.workspaces.read_file("w", "app.py")
    (root / "app.py").write_bytes(b"person\n")
    seen = led.workspaces.observe("w", by="test", full=True)
    lease = led.workspaces.acquire("w", "agent", ttl_s=600)
    [step] = seen.steps
    led.workspaces.compensate(step, epoch=lease.epoch)  # the person's edit taken back: A
    assert (root / "app.py").read_bytes() == b"A\n"
    assert _apply(led, lease.epoch, "s1", read.write(b"B\n")) == "rejected:stale_rev"


def test_a_plan_that_does_not_fit_is_still_refused_whole(led: Ledger) -> None:
    """Two writes, one carried over, one stale by a step: nothing is written."""
    root: Path = led.root  # type: ignore[attr-defined]
    app = led.workspaces.read_file("w", "app.py")
    notes = led.workspaces.read_file("w", "notes.txt")
    lease = led.workspaces.acquire("w", "agent", ttl_s=600, observe=True)
    other = led.workspaces.read_file("w", "notes.txt").write(b"step\n")
    assert _apply(led, lease.epoch, "x1", other) == "applied"
    [verdict] = led.workspaces.admit("w", lease.epoch, [StepPlan(
        "s1", [app.write(b"B\n"), notes.write(b"N\n")])])
    out = verdict.verdict if verdict is not None else \
        led.workspaces.apply("s1", epoch=lease.epoch).verdict
    assert out.startswith("rejected:")
    assert (root / "app.py").read_bytes() == b"A\n"
    assert (root / "notes.txt").read_bytes() == b"step\n"
    with pytest.raises(LedgerError):
        led.workspaces.apply("s1", epoch=lease.epoch + 1)

"""Holds: a run or a step kept out of `seal`, and its blobs out of `gc`, until released
(`Ledger.hold`, ``steptrail hold``; docs/time-travel.md "Holds").

A hold is a `held` event and its release a `hold-released` one; the holds in force are read
from those events (few: a person places them), never from a table, so a rebuild or a copy
carries them as the log does. A step is held when it is held itself or its run is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput
from .events import Held, HoldReleased, check_step_id


@dataclass(frozen=True)
class Hold:
    """A hold in force: `scope` run or step, its `target`, why and by whom, and the seq of
    its `held` event."""

    scope: str
    target: str
    reason: str
    by: str
    seq: int
    n: int


def holds_of(records: Iterable[Any]) -> dict[tuple[str, str], Hold]:
    """(scope, target) -> the hold in force, from `held`/`hold-released` records."""
    out: dict[tuple[str, str], Hold] = {}
    for r in records:
        e = r.event
        if isinstance(e, Held):
            out[(e.scope, e.target)] = Hold(e.scope, e.target, e.reason, e.by, r.seq, e.n)
        elif isinstance(e, HoldReleased):
            held = out.get((e.scope, e.target))
            if held is not None and held.n == e.n:
                del out[(e.scope, e.target)]
    return out


def read_holds(log: Any) -> dict[tuple[str, str], Hold]:
    """The holds in force in the ledger of event log `log`."""
    return holds_of(r for kind in ("held", "hold-released") for r in log.read(kind=kind))


def check_scope(scope: str, target: str) -> None:
    if scope not in ("run", "step"):
        raise InvalidInput(f"scope {scope!r} is not 'run' or 'step'")
    check_step_id(target)


def held_event(log: Any, scope: str, target: str, reason: str, by: str) -> Held | None:
    """The `held` event that places a new hold, or None when one is in force already."""
    check_scope(scope, target)
    if (scope, target) in read_holds(log):
        return None
    n = sum(1 for r in log.read(kind="held")
            if isinstance(r.event, Held) and (r.event.scope, r.event.target) == (scope, target))
    return Held(scope=scope, target=target, n=n, reason=reason, by=by)  # type: ignore[arg-type]


def release_event(log: Any, scope: str, target: str, by: str) -> HoldReleased | None:
    """The `hold-released` event of the hold in force, or None when there is none."""
    check_scope(scope, target)
    held = read_holds(log).get((scope, target))
    if held is None:
        return None
    return HoldReleased(scope=scope, target=target, n=held.n, by=by)  # type: ignore[arg-type]


__all__ = ["Hold", "check_scope", "held_event", "holds_of", "read_holds", "release_event"]

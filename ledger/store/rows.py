"""The projection tables' rows as the stores read and write them: the step table's
states and `StepRow`, the workspace table's `WsRow`, a path's `PathState`. Plain data
(no fold logic: that is `ledger.projections`, which re-exports these names), so that the
stores need nothing from the projections above them.
"""

from __future__ import annotations

from typing import ClassVar, Final

import msgspec

PLANNED, FENCED, STORED = "planned", "fenced", "blob-stored"
PUBLISHED, ACKED, COMPENSATED, REJECTED = "manifest-published", "acked", "compensated", "rejected"
#: An undo under way: its intent is recorded, its `compensated` not yet.
COMPENSATING = "compensating"
#: A sealed step's tombstone (docs/design.md "Sealed runs"): its events are archived.
SEALED = "sealed"
STATES: Final = (PLANNED, FENCED, STORED, PUBLISHED, ACKED, COMPENSATING, COMPENSATED, REJECTED,
                 SEALED)
#: The states a run's steps must all be in for the run to be sealed.
SETTLED: Final = frozenset({ACKED, COMPENSATED, REJECTED})
#: States in which the attempt is over: only here may a new attempt begin.
ENDED: Final = frozenset({COMPENSATED, REJECTED})
#: States in which the attempt may still change (settling finishes them).
IN_FLIGHT: Final = frozenset({PLANNED, FENCED, STORED, COMPENSATING})

class StepRow(msgspec.Struct, kw_only=True, gc=False):
    """One row of the `steps` table: a step's current state (its latest attempt's).

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     row = ledger.plan("fetch", run="nightly")
    >>> row.step_id, row.run, row.state, row.attempt
    ('fetch', 'nightly', 'planned', 1)
    """

    step_id: str
    run: str
    workspace: str
    state: str
    attempt: int
    epoch: int
    rev: int
    manifest_rev: int  # the latest manifest revision (-1: none ever published)
    manifest_digest: str | None  # the live manifest's digest, None when not live
    live: bool  # a live manifest: published and not compensated since (committed)
    committed_bytes: int  # bytes the live manifest names
    stored_bytes: int  # bytes stored by the latest attempt
    first_seq: int
    last_seq: int
    updated_ns: int

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "step_id", "run", "workspace", "state", "attempt", "epoch", "rev", "manifest_rev",
        "manifest_digest", "live", "committed_bytes", "stored_bytes", "first_seq",
        "last_seq", "updated_ns",
    )

    def as_tuple(self) -> tuple[object, ...]:
        return (
            self.step_id, self.run, self.workspace, self.state, self.attempt, self.epoch,
            self.rev, self.manifest_rev, self.manifest_digest, int(self.live),
            self.committed_bytes, self.stored_bytes, self.first_seq, self.last_seq,
            self.updated_ns,
        )

    @classmethod
    def from_tuple(cls, row: tuple[object, ...]) -> StepRow:
        for name, value in zip(cls.COLUMNS, row, strict=True):
            want = _STEP_TYPES[name]
            if type(value) is not want and not (value is None and name == "manifest_digest"):
                raise TypeError(f"steps row {row[0]!r}: {name} is {type(value).__name__},"
                                f" not {want.__name__}")
        values = dict(zip(cls.COLUMNS, row, strict=True))
        values["live"] = bool(values["live"])
        return cls(**values)  # type: ignore[arg-type]

    @property
    def committed(self) -> bool:
        return self.live

    # -- the state in words: what front ends ask of a row (none compares state strings)

    @property
    def planned(self) -> bool:
        """Its latest attempt is planned and nothing of it is applied yet."""
        return self.state == PLANNED

    @property
    def in_flight(self) -> bool:
        """Its latest attempt may still change (planned, applied, storing, undoing):
        settling finishes it."""
        return self.state in IN_FLIGHT

    @property
    def unacked(self) -> bool:
        """Committed (its manifest published), the ack still owed."""
        return self.state == PUBLISHED

    @property
    def acked(self) -> bool:
        """Committed and acknowledged: done."""
        return self.state == ACKED

    @property
    def ended(self) -> bool:
        """Its latest attempt is over (rejected or compensated): the next run is a new
        attempt."""
        return self.state in ENDED

    @property
    def rejected(self) -> bool:
        """Its latest attempt was refused (the fence, an overlap, a dead epoch)."""
        return self.state == REJECTED

    @property
    def compensating(self) -> bool:
        """An undo of its latest attempt is under way (its intent recorded)."""
        return self.state == COMPENSATING

    @property
    def compensated(self) -> bool:
        """Its latest attempt was undone (settled, or compensated on purpose)."""
        return self.state == COMPENSATED

    @property
    def settled_unpublished(self) -> bool:
        """Undone before it ever committed (a dead worker's attempt, settled)."""
        return self.state == COMPENSATED and self.manifest_rev < 0


#: The storage class each column holds (a damaged record can yield another on read).
_STEP_TYPES: Final[dict[str, type]] = {
    c: str if c in ("step_id", "run", "workspace", "state", "manifest_digest") else int
    for c in StepRow.COLUMNS
}


class WsRow(msgspec.Struct, kw_only=True, gc=False):
    """One row of the `workspaces` table.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> [(row.name, row.epoch, row.holder) for row in ledger.workspaces.list()]
    [('repo', 1, 'agent-1')]
    >>> ledger.close()
    """

    name: str
    root: str  # "" for a bare lease (`lease-acquired` with `bare`): no directory
    rev: int = 0
    epoch: int = 0  # the latest epoch ever acquired (0: never leased)
    holder: str = ""
    expires_ns: int = 0
    released: bool = False
    acquired_ns: int = 0
    last_seq: int = 0

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "name", "root", "rev", "epoch", "holder", "expires_ns", "released", "acquired_ns",
        "last_seq",
    )

    def as_tuple(self) -> tuple[object, ...]:
        return (self.name, self.root, self.rev, self.epoch, self.holder, self.expires_ns,
                int(self.released), self.acquired_ns, self.last_seq)

    @classmethod
    def from_tuple(cls, row: tuple[object, ...]) -> WsRow:
        for name, value in zip(cls.COLUMNS, row, strict=True):
            want = str if name in ("name", "root", "holder") else int
            if type(value) is not want:
                raise TypeError(f"workspaces row {row[0]!r}: {name} is {type(value).__name__},"
                                f" not {want.__name__}")
        values = dict(zip(cls.COLUMNS, row, strict=True))
        values["released"] = bool(values["released"])
        return cls(**values)  # type: ignore[arg-type]

    def live_epoch(self, now_ns: int) -> int | None:
        """The live epoch at `now_ns`, or None when no lease is live."""
        if self.epoch == 0 or self.released or now_ns >= self.expires_ns:
            return None
        return self.epoch


PathState = tuple[int, str | None, int]  # (rev, hash or None for absent, seq)


__all__ = [
    "ACKED", "COMPENSATED", "COMPENSATING", "ENDED", "FENCED", "IN_FLIGHT", "PLANNED",
    "PUBLISHED", "REJECTED", "SEALED", "SETTLED", "STATES", "STORED", "PathState", "StepRow",
    "WsRow",
]

"""A decision made with no store lock held, recorded by one transaction that checks it
again: the `Draft` an apply or an undo reads through while its files are worked on
(docs/design.md "Epochs and leases": the write lock covers commits only), and the two
signals that end such a transaction without writing (`Answered`, `Moved`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from ..events import Compensated, Event, Fenced
from ..projections.steps import StepRow
from ..projections.workspaces import WsRow
from ..store import EventQuery, Tx


class Answered(Exception):
    """Raised inside a transaction to roll it back and answer without writing."""

    def __init__(self, result: Any) -> None:
        super().__init__("answered")
        self.result = result


class Moved(Exception):
    """Raised inside the transaction that would record a draft (`Draft`): something the
    draft decided on moved since it was read. Rolls the transaction back; the caller
    takes back what the draft landed (an apply) or goes on from the disk (an undo) and
    decides again."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


#: How many times an apply or an undo decides again after what it read moved under its
#: file work (`Moved`) before it gives up (StorageFailure: apply again).
DRAFT_ROUNDS: Final = 3


def step_key(row: StepRow | None) -> tuple[int, str] | None:
    return None if row is None else (row.attempt, row.state)


class Draft:
    """What a builder reads and writes, for a builder run with no store lock held: the
    checks of an apply or an undo and its file work (docs/design.md "Epochs and leases":
    the write lock covers commits only).

    It stands where the transaction stood for `_fence`, `_roll_back`, `_undo`: each read
    goes to the store's latest commit (no snapshot or lock is held across the file
    work) and is remembered; the inline bytes the builder would write are kept for the
    transaction that records its events (`flush`), which first asks `moved` whether
    anything the draft decided on reads otherwise now."""

    def __init__(self, view: Any, now: int, step_row: Any,
                 before_path: Any = None) -> None:
        self._view = view
        self._step_row = step_row
        #: Called with a path before the builder first reads its state (an undo's check
        #: of its epoch before it works on that path).
        self._before_path = before_path
        #: The time the builder decides at (its clock's now; the commit judges again).
        self.time_ns = now
        self._started = time.monotonic_ns()
        self.inline: dict[str, bytes] = {}
        self.steps: dict[str, tuple[int, str] | None] = {}
        self.journal: dict[str, bool] = {}
        self.workspaces: dict[str, WsRow | None] = {}
        self.paths: dict[tuple[str, str], Any] = {}
        self.in_flight: dict[tuple[Any, ...], list[tuple[str, int]]] = {}
        self.blobs: dict[str, bool] = {}

    # -- reads, each remembered --------------------------------------------------------

    def step(self, step_id: str) -> StepRow | None:
        row = self._step_row(step_id)
        self.steps.setdefault(step_id, step_key(row))
        return row  # type: ignore[no-any-return]

    def journal_lookup(self, key: str) -> Any:
        row = self._view.journal_lookup(key)
        self.journal.setdefault(key, row is not None)
        return row

    def workspace(self, name: str) -> WsRow | None:
        row = self._view.workspace(name)
        self.workspaces.setdefault(name, row)
        return row  # type: ignore[no-any-return]

    def path_state(self, workspace: str, path: str) -> Any:
        if self._before_path is not None:
            self._before_path(path)
        state = self._view.path_state(workspace, path)
        self.paths.setdefault((workspace, path), state)
        return state

    def steps_in_flight(self, workspace: str, before_epoch: int | None = None, *,
                        limit: int | None = None, oldest_first: bool = False
                        ) -> list[tuple[str, int]]:
        got = self._view.steps_in_flight(workspace, before_epoch, limit=limit,
                                         oldest_first=oldest_first)
        self.in_flight.setdefault((workspace, before_epoch, limit, oldest_first), list(got))
        return got  # type: ignore[no-any-return]

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        found = self._view.blob_size(digest)
        self.blobs.setdefault(digest, found is not None)
        return found  # type: ignore[no-any-return]

    def events(self, query: EventQuery) -> Any:
        return self._view.events(query)  # immutable rows: nothing to check again

    def path_rows(self) -> Any:
        """Every path a step wrote, per workspace (whether the ledger ever knew a file
        under a directory: a path's row, once there, stays — nothing to check again)."""
        return self._view.path_rows()

    # -- writes, kept for the transaction ----------------------------------------------

    def put_inline(self, blobs: dict[str, bytes], _stored_ns: int) -> None:
        self.inline.update(blobs)

    def flush(self, tx: Tx, now: int) -> None:
        if self.inline:
            tx.put_inline(self.inline, now)

    # -- the check at the commit -------------------------------------------------------

    def moved(self, tx: Tx) -> str | None:
        """What the draft read that `tx` reads otherwise (None: nothing): a path's state,
        the steps in flight, a blob the draft found stored (it stored the others
        itself). The step row, the journal and the workspace (its live epoch; its rev,
        for a plan-fenced apply) are the caller's to compare."""
        for (workspace, path), state in self.paths.items():
            if tx.path_state(workspace, path) != state:
                return f"{path} was written meanwhile"
        for (workspace, before, limit, oldest), got in self.in_flight.items():
            if list(tx.steps_in_flight(workspace, before, limit=limit,
                                       oldest_first=oldest)) != got:
                return f"the steps in flight in {workspace} changed"
        for digest, present in self.blobs.items():
            if present and tx.blob_size(digest) is None:
                return f"blob {digest[:12]} is gone"
        return None

    def now(self) -> int:
        """The clock's time now, as the draft's time and the time since (no clock read:
        on a store whose clock is the server's, that would be a round trip a landing)."""
        return self.time_ns + time.monotonic_ns() - self._started

    def rev_shift(self, name: str, now: WsRow) -> int:
        """How far workspace `name`'s rev moved since the draft read it (other paths'
        writes, committed meanwhile): the draft's revs move as far."""
        row = self.workspaces.get(name)
        return 0 if row is None else now.rev - row.rev


def shifted(events: Sequence[Event], delta: int) -> list[Event]:
    """`events` with the revs a draft gave its `fenced` or `compensated` event moved by
    `delta` (the workspace's rev moved by that much before the commit: the fold gives
    each write the next revs of its workspace)."""
    if not delta:
        return list(events)
    out: list[Event] = []
    for e in events:
        if isinstance(e, Fenced):
            e = msgspec.structs.replace(
                e, rev=e.rev + delta,
                writes=tuple(msgspec.structs.replace(w, rev=w.rev + delta) for w in e.writes))
        elif isinstance(e, Compensated) and e.rev:
            e = msgspec.structs.replace(
                e, rev=e.rev + delta,
                restored=tuple(r if r.outcome == "conflict" else
                               msgspec.structs.replace(r, rev=r.rev + delta)
                               for r in e.restored))
        out.append(e)
    return out

"""The read side: projections folded from the events.

Projections are derived: the inline ones are written in the append transaction
together with their checkpoint (the last folded seq and the projection version),
and every one of them can be rebuilt from the events at any time.

- `StepsProjector` is the inline writer the log calls inside each append.
- `rebuild` refolds everything into the tables inside one write transaction: readers
  see the old tables or the new ones, never a mix. It folds in memory and writes each
  row once through the store's rebuild sink, keeping only unfinished steps in memory
  (finished ones are written out and dropped), so memory follows the live steps, not
  the events.
- `catch_up` folds a lagging tail (after an upgrade or a projection change) on the
  first read-write open; `read_steps` folds it in memory for read-only callers, who
  never write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from ..errors import CorruptLedger, IllegalTransition, InvalidInput, UnknownStep
from ..events import StepEvent, check_step_id
from ..log import EventLog
from ..store import FOLLOWS, Checkpoint, EventReader, ProjectionChanges, ProjectionSink, ReadView
from . import refs as refs_mod
from . import steps as steps_mod
from . import workspaces as ws_mod
from .lite import decode_for_fold
from .refs import RefsFold
from .workspaces import WorkspacesFold
from .steps import (
    ACKED,
    COMPENSATED,
    REJECTED,
    SEALED,
    StepRow,
    fold,
    tombstones,
)

Progress = Callable[[int, int], None]

#: How many unfinished steps a rebuild keeps in memory before it writes them all out.
WORKING_SET_MAX: Final = 50_000
_FINISHED: Final = frozenset({ACKED, REJECTED, COMPENSATED, SEALED})


#: The checkpoint a rebuild or a catch-up leaves: the tables follow the log.
FOLLOWING: Final = Checkpoint(FOLLOWS, steps_mod.VERSION)


def checkpoint(view: EventReader) -> Checkpoint:
    """How far the inline projections have folded (none yet: nothing, this version)."""
    cp = view.checkpoint()
    return Checkpoint(0, steps_mod.VERSION) if cp is None else cp


class StepsProjector:
    """The inline projections (see `ledger.store.Projector`): step rows, pins, manifests,
    workspaces.

    Step rows are folded on a copy and handed to the store once per transaction
    (`flush`), and so are the ref tables' changes, netted in memory (`RefsBatch`), and
    the workspaces'. Rows this connection committed are cached for the next append (the
    log drops the cache when another connection commits: the store's generation).
    """

    CACHE_MAX: Final = 10_000

    def __init__(self) -> None:
        self.view: ReadView | None = None
        self.pending: dict[str, StepRow] = {}
        self.cache: dict[str, StepRow] = {}
        self.refs = refs_mod.RefsBatch()
        self.ws = WorkspacesFold()
        # Rows a builder read in this transaction (`peek`), None for a step with no
        # row: `current` answers from them instead of reading again. Dropped when the
        # transaction ends (`committed`, `forget`).
        self.seen: dict[str, StepRow | None] = {}

    def peek(self, view: ReadView, step_id: str) -> StepRow | None:
        """A step's row as a builder sees it inside the transaction (a copy: the caller
        may keep it); read once, then remembered for `current` until the transaction
        ends."""
        row = self.pending.get(step_id) or self.cache.get(step_id)
        if row is None:
            if step_id in self.seen:
                row = self.seen[step_id]
            else:
                row = self.seen[step_id] = view.step(step_id)
        return None if row is None else row.__copy__()

    def prefetch(self, view: ReadView, step_ids: set[str]) -> None:
        """Read the rows of a batch's steps this transaction has not seen yet in one
        statement (`seen`), instead of one read a step as `check` meets them."""
        unknown = [s for s in step_ids
                   if s not in self.pending and s not in self.cache and s not in self.seen]
        if len(unknown) < 2:
            return  # one read either way
        found = {r.step_id: r for r in view.steps_by_id(unknown)}
        for s in unknown:
            self.seen[s] = found.get(s)

    def begin(self, view: ReadView) -> None:
        self.view, self.pending = view, {}
        self.refs = refs_mod.RefsBatch()
        self.ws = WorkspacesFold(view.workspace, view.path_state)

    def current(self, step_id: str) -> StepRow | None:
        """The step's row as this transaction sees it (pending changes included)."""
        row = self.pending.get(step_id) or self.cache.get(step_id)
        if row is None and self.view is not None:
            if step_id in self.seen:
                return self.seen[step_id]
            row = self.view.step(step_id)
        return row

    def check(
        self, event: object, seq: int, time_ns: int
    ) -> tuple[object, int, int, StepRow | None] | None:
        kind = event.__struct_config__.tag  # type: ignore[attr-defined]
        if kind in ws_mod.KINDS:
            self.ws.validate(event, time_ns)
        if kind == "run-sealed":  # its tombstones replace its steps' rows
            return event, seq, time_ns, tombstones(event, seq, time_ns)  # type: ignore[arg-type]
        if not isinstance(event, StepEvent):
            return (event, seq, time_ns, None) if kind in ws_mod.KINDS else None
        row = self.current(event.step)
        new = fold(None if row is None else row.__copy__(), event, seq, time_ns)  # type: ignore[arg-type]
        return event, seq, time_ns, new

    def accept(self, change: object) -> None:
        if change is None:
            return
        event, seq, time_ns, row = change  # type: ignore[misc]
        if isinstance(row, list):
            for r in row:
                self.pending[r.step_id] = r
        elif row is not None:
            self.pending[row.step_id] = row
        kind = event.__struct_config__.tag
        if kind == "planned":
            self.refs.began(event.step, event.attempt)
        elif kind in refs_mod.KINDS:
            self.refs.fold(event, seq)
        if kind in ws_mod.KINDS:
            self.ws.apply(event, seq, time_ns)

    def flush(self, last_seq: int) -> ProjectionChanges:
        """Every change kept in this transaction. No checkpoint: the tables follow the
        log (`ledger.store.FOLLOWS`, written by the catch-up every read-write open makes),
        so a commit does not rewrite the checkpoint's row."""
        refs = self.refs
        # A pin or a manifest naming a blob un-condemns it (GC re-checks anyway).
        named = {d for (_s, _a, d) in refs.pins} | {e.digest for e in refs.entries}
        return refs.changes([r.as_tuple() for r in self.pending.values()], self.ws.changes(),
                            named, None)

    def committed(self) -> None:
        if len(self.cache) + len(self.pending) > self.CACHE_MAX:
            self.cache.clear()
        self.cache.update(self.pending)
        self.pending = {}
        self.seen = {}

    def forget(self) -> None:
        self.cache.clear()
        self.pending = {}
        self.seen = {}


def fold_rows(
    log: EventLog,
    after_seq: int,
    working: dict[str, StepRow],
    lookup: Callable[[str], StepRow | None],
    evict: Callable[[StepRow], None] | None,
    progress: Progress | None,
    total: int,
    refs: RefsFold | None = None,
    ws: WorkspacesFold | None = None,
) -> int:
    """Fold raw event rows after `after_seq` into `working` (and `refs`, `ws`); return the
    last seq seen. With `evict`, a step that finishes leaves `working` through it and
    comes back through `lookup` (see `StepSpill`): memory follows the unfinished steps."""
    last = 0
    done = 0
    # locals: this loop runs once per event of the ledger
    ws_kinds, step_kinds = ws_mod.KINDS, steps_mod.STEP_KIND_TAGS
    folded_kinds = step_kinds | ws_kinds
    refs_kinds, finished = refs_mod.KINDS, _FINISHED
    step_fold, get, pop = fold, working.get, working.pop
    bad = (msgspec.DecodeError, msgspec.ValidationError, InvalidInput, ValueError, TypeError)
    for seq, time_ns, kind, v, payload in log.store.view.fold_rows(after_seq):
        if not (type(seq) is int and type(time_ns) is int and type(kind) is str
                and type(v) is int and type(payload) is bytes):
            raise CorruptLedger(log.path, f"event #{seq!r} has a cell of the wrong type"
                                " (a damaged row)")
        last = seq  # type: ignore[assignment]
        done += 1
        if progress is not None and done % 10_000 == 0:
            progress(done, total)
        if kind not in folded_kinds:
            continue  # no projection folds it
        try:
            event = decode_for_fold(kind, payload, v)  # type: ignore[arg-type]
        except bad as exc:
            raise CorruptLedger(log.path, f"event #{seq} cannot be decoded: {exc}") from None
        if ws is not None and kind in ws_kinds:
            try:
                ws.validate(event, time_ns)  # type: ignore[arg-type]
            except IllegalTransition as exc:
                raise CorruptLedger(log.path, f"event #{seq} breaks the lifecycle: {exc}") from None
            ws.apply(event, seq, time_ns)  # type: ignore[arg-type]
        if kind not in step_kinds:
            continue
        if refs is not None and kind in refs_kinds:
            refs.fold(event, seq)  # type: ignore[arg-type]
        if kind == "run-sealed":
            for row in tombstones(event, seq, time_ns):  # type: ignore[arg-type]
                pop(row.step_id, None)
                if evict is not None:
                    evict(row)
                else:
                    working[row.step_id] = row
            continue
        step_id = event.step  # type: ignore[union-attr]
        current = get(step_id)
        if current is None and not (kind == "planned" and event.attempt == 1):  # type: ignore[union-attr]
            current = lookup(step_id)
        try:
            current = step_fold(current, event, seq, time_ns)  # type: ignore[arg-type]
        except IllegalTransition as exc:
            raise CorruptLedger(log.path, f"event #{seq} breaks the lifecycle: {exc}") from None
        assert current is not None
        if evict is not None and current.state in finished:
            pop(step_id, None)
            evict(current)
        else:
            working[step_id] = current
            if evict is not None and len(working) > WORKING_SET_MAX:
                for r in working.values():
                    evict(r)
                working.clear()
    if progress is not None:
        progress(done, total)
    return last


def _first(row: tuple[object, ...]) -> object:
    return row[0]


class StepSpill:
    """Finished step rows written out of memory through a `ProjectionSink` (in key-ordered
    chunks) and read back when a step continues: the `evict` / `lookup` pair `fold_rows`
    takes, so a fold's memory follows the unfinished steps. `rebuild` spills into the
    ledger's own tables; `verify` into its scratch copy."""

    CHUNK: Final = 5_000

    def __init__(self, sink: ProjectionSink) -> None:
        self.sink = sink
        self.written: list[tuple[object, ...]] = []

    def evict(self, row: StepRow) -> None:
        self.written.append(row.as_tuple())
        if len(self.written) >= self.CHUNK:
            self.flush()

    def lookup(self, step_id: str) -> StepRow | None:
        self.flush()
        return self.sink.step(step_id)  # type: ignore[no-any-return]

    def flush(self) -> None:
        if self.written:
            self.written.sort(key=_first)  # by step id (stable): B-tree inserts in key order
            self.sink.put_steps(self.written)
            self.written.clear()


def fold_into(log: EventLog, sink: ProjectionSink, progress: Progress | None = None,
              total: int = 0) -> tuple[RefsFold, WorkspacesFold, int]:
    """Fold the whole log into `sink` (step rows and manifests: what memory does not
    keep); return the refs fold (its live pins), the workspaces fold and the last seq."""
    spill = StepSpill(sink)
    working: dict[str, StepRow] = {}
    refs = RefsFold(drain_to=sink)  # manifests stream out; only live pins stay
    ws = WorkspacesFold()
    last = fold_rows(log, 0, working, spill.lookup, spill.evict, progress, total, refs, ws)
    for row in working.values():
        spill.evict(row)
    spill.flush()
    refs.drain(sink)
    return refs, ws, last


def rebuild(log: EventLog, progress: Progress | None = None) -> int:
    """Recompute every projection from the events and swap them in atomically.

    Returns the number of steps. Runs in one write transaction.
    """
    with log.store.transaction() as tx:
        total = log.count()
        with tx.rebuild_projections() as sink:
            refs, ws, last = fold_into(log, sink, progress, total)
            sink.put_workspaces(*ws.changes())
            refs.write(sink)
            steps = sink.step_count()
        tx.write_projection(ProjectionChanges(checkpoint=FOLLOWING))
        return steps


def catch_up(log: EventLog) -> int:
    """Bring the tables up to the log on a read-write open; return events folded.

    A projection version change means a full rebuild; a lagging checkpoint folds the
    tail into the tables. Both write rows and checkpoint in one transaction.
    """
    store = log.store
    with store.read() as view:
        cp = checkpoint(view)
        head = view.head().seq
        follows = any(name == steps_mod.NAME and last == FOLLOWS
                      for name, last, _ in view.checkpoint_rows())
    if cp.version != steps_mod.VERSION:
        rebuild(log)
        return head
    if follows:
        return 0
    with store.transaction() as tx:
        cp = checkpoint(tx)
        working: dict[str, StepRow] = {}
        refs = refs_mod.RefsBatch()  # the inline writer's netting, over the whole tail
        ws = WorkspacesFold(tx.workspace, tx.path_state)
        last = fold_rows(log, cp.last_seq, working, tx.step, None, None, 0, refs, ws)
        # folded to the head under the write lock: from here every append projects itself
        tx.write_projection(refs.changes(
            [r.as_tuple() for r in working.values()], ws.changes(), set(), FOLLOWING))
        return max(0, last - cp.last_seq)


def fold_all(
    log: EventLog,
    progress: Progress | None = None,
    refs: RefsFold | None = None,
    ws: WorkspacesFold | None = None,
) -> dict[str, StepRow]:
    """Every step (and, given `refs` / `ws`, every pin, manifest and workspace) folded in
    memory from seq 1."""
    working: dict[str, StepRow] = {}
    fold_rows(log, 0, working, lambda s: None, None, progress, log.count(), refs, ws)
    return working


def read_workspaces(log: EventLog) -> WorkspacesFold:
    """Every workspace and path state as of now, read-only: the tables, or a fold when
    they lag the log."""
    with log.store.read() as view:
        cp = checkpoint(view)
        if cp.version != steps_mod.VERSION or cp.last_seq < view.head().seq:
            fold = WorkspacesFold()
            fold_all(log, ws=fold)
            return fold
        fold = WorkspacesFold()
        for r in view.workspace_rows():
            fold.rows[r.name] = r
        for wsname, path, rev, digest, seq in view.path_rows():
            fold.paths[(wsname, path)] = (rev, digest, seq)  # type: ignore[index,assignment]
    return fold


def read_refs(log: EventLog) -> RefsFold:
    """Pins and manifests as of now, read-only: the tables, or a fold when they lag."""
    fold = RefsFold()
    with log.store.read() as view:
        cp = checkpoint(view)
        if cp.version != steps_mod.VERSION or cp.last_seq < view.head().seq:
            fold_all(log, refs=fold)
            return fold
        for step, attempt, digest, role, seq in view.pin_rows():
            fold.pins[(step, attempt, digest)] = (role, seq)  # type: ignore[index,assignment]
        fold.manifests = view.manifest_rows()  # type: ignore[assignment]
        fold.entries = view.entry_rows()  # type: ignore[assignment]
    return fold


class StepLookup:
    """A step's current row as this process serves it (`Ledger.find_step`, and the
    workspace protocol's `Core.step`): a writer whose store says no other connection
    committed since its last look answers from the rows it committed itself, or with a
    single query; otherwise (another writer, a read-only ledger) the rows are read as
    `read_steps` reads them."""

    __slots__ = ("log", "projector")

    def __init__(self, log: EventLog, projector: StepsProjector | None) -> None:
        self.log, self.projector = log, projector

    def current(self) -> bool:
        """Whether the projection tables are as this writer left them (caught up at open,
        then by every append of its own, and no other connection has committed since):
        then a row is read with one statement, no lag check."""
        return self.projector is not None and self.log.fresh()

    def find(self, step_id: str) -> StepRow | None:
        """The step's row, or None if it has no events."""
        check_step_id(step_id)
        if self.projector is not None and self.log.fresh():
            cached = self.projector.cache.get(step_id)
            if cached is not None:
                return cached.__copy__()
            return self.log.store.view.step(step_id)
        # the row and the lag check in one statement; a fold only when the tables lag
        current, row = self.log.store.view.step_if_current(step_id, steps_mod.VERSION)
        if current:
            return row  # type: ignore[no-any-return]
        rows = read_steps(self.log, step_id=step_id)
        return rows[0] if rows else None

    def in_tx(self, tx: ReadView, step_id: str) -> StepRow | None:
        """The step's row as a builder sees it inside its write transaction, read once
        and remembered for the fold that follows (`StepsProjector.peek`; a read-only
        ledger's log has no projector: read)."""
        if self.projector is None:
            return tx.step(step_id)  # type: ignore[no-any-return]
        return self.projector.peek(tx, step_id)

    def get(self, step_id: str) -> StepRow:
        """The step's row; UnknownStep if it has no events."""
        row = self.find(step_id)
        if row is None:
            raise UnknownStep(step_id)
        return row


def read_steps(
    log: EventLog, *, state: str | None = None, step_id: str | None = None,
    contains: str | None = None, limit: int | None = None,
) -> list[StepRow]:
    """Current step rows, exactly as a caught-up projection would hold them. Read-only.

    When the tables lag the log (a crash of an older version, a projection upgrade),
    the missing tail is folded in memory and nothing is written.
    """
    if state is not None and state not in steps_mod.STATES:
        raise InvalidInput(f"state {state!r} is not one of {', '.join(steps_mod.STATES)}")
    with log.store.read() as view:
        cp = checkpoint(view)
        head = view.head().seq
        if cp.version != steps_mod.VERSION:
            rows = list(fold_all(log).values())
        else:
            # (a limit only where the tables are the whole answer: an overlay may add rows)
            rows = view.steps(state=state, step_id=step_id, contains=contains,
                              limit=limit if cp.last_seq >= head else None)
            if cp.last_seq < head:
                overlay: dict[str, StepRow] = {}
                fold_rows(log, cp.last_seq, overlay, view.step, None, None, 0)
                rows = [overlay.pop(r.step_id, r) for r in rows] + list(overlay.values())
    out = [
        r for r in rows
        if (state is None or r.state == state) and (step_id is None or r.step_id == step_id)
        and (contains is None or contains in r.step_id)
    ]
    out.sort(key=lambda r: r.first_seq)
    return out if limit is None else out[:limit]


__all__ = [
    "Checkpoint",
    "StepRow",
    "StepLookup",
    "StepSpill",
    "StepsProjector",
    "catch_up",
    "checkpoint",
    "fold_all",
    "fold_into",
    "fold_rows",
    "read_refs",
    "read_steps",
    "read_workspaces",
    "rebuild",
]

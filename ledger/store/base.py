"""What every store shares: the append loop, and reading event rows back as events.

`TxBase.append` is the one place an append is decided (docs/storage.md "Append, written
once"): each event is checked by the projector (an illegal transition raises), guarded
(a blob that is not durable, a dead epoch), chained and inserted; a journal key already
recorded is answered by `_answer` — the original event, or IdempotencyConflict. A backend
provides four primitives: `_insert_many` and `_insert_one` (raising `DuplicateKey`), a
savepoint (`_savepoint`, `_rollback_savepoint`, `_release_savepoint`) and
`journal_lookup`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from ..blobs import digest_of
from ..errors import IdempotencyConflict, IllegalTransition, LedgerError
from ..events import GUARDED_KINDS, Envelope, RecordedEvent, chain_hash, decode, row_version
from . import (ROW_ERRORS, ROW_NAMES, ROW_TYPES, DuplicateKey, EventRow, EventCheck, Head, Prepared, Projector,
               make_event_row)



def row_problem(row: tuple[Any, ...]) -> str | None:
    """What is wrong with the cell types of an events row (None: every cell as declared)."""
    if len(row) != len(ROW_TYPES):
        return f"it has {len(row)} columns"
    for name, value, want in zip(ROW_NAMES, row, ROW_TYPES, strict=True):
        if type(value) is not want:
            return f"its {name} is {type(value).__name__}, not {want.__name__}"
    return None


def check_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """`row` if its cells hold their declared types, else ValueError naming the cell."""
    if tuple(map(type, row)) != ROW_TYPES:
        raise ValueError(row_problem(row) or "a cell of the wrong type")
    return row


def row_to_recorded(row: tuple[Any, ...], *, deduped: bool = False) -> RecordedEvent:
    (seq, time_ns, _ws, _run, _step, _attempt, _epoch, _rev, key, kind, v, payload,
     prev_hash, digest) = row
    return RecordedEvent(
        seq=seq, time_ns=time_ns, journal_key=key, kind=kind, hash=digest,
        prev_hash=prev_hash, event=decode(payload, v), v=v, deduped=deduped,
    )


class _Duplicate(Exception):
    """The fast path met a journal key already recorded: retry row by row."""


class TxBase:
    """The append loop of a write transaction, over a backend's primitives."""

    # -- the primitives a backend provides -------------------------------------------

    def _insert_many(self, rows: list[EventRow]) -> None:
        """Insert every row, or raise DuplicateKey having inserted none."""
        raise NotImplementedError

    def _insert_one(self, row: EventRow) -> None:
        """Insert the row, or raise DuplicateKey."""
        raise NotImplementedError

    def _whole_insert(self, n: int) -> bool:
        """Whether `_insert_many` of `n` rows inserts every row or none (raising
        DuplicateKey) and leaves the transaction as it was: then the fast path needs no
        savepoint around it."""
        return False

    def _savepoint(self) -> None:
        raise NotImplementedError

    def _rollback_savepoint(self) -> None:
        raise NotImplementedError

    def _release_savepoint(self) -> None:
        raise NotImplementedError

    def journal_lookup(self, key: str) -> EventRow | None:
        raise NotImplementedError

    # A group commit's primitives (docs/design.md "Group commit"): a savepoint around one
    # caller's share of the transaction, and whether an error left the transaction as it
    # was (a refusal of ours does; a driver's I/O error may have rolled it all back).

    def _open_part(self) -> None:
        raise NotImplementedError

    def _undo_part(self) -> None:
        raise NotImplementedError

    def _close_part(self) -> None:
        raise NotImplementedError

    def _intact(self, exc: BaseException) -> bool:
        raise NotImplementedError

    # -- inline rows this transaction wrote ---------------------------------------------
    # Those whose bytes hash to their digest (digest -> size): the guard's look-ups of
    # them are answered from here — they cannot change but through this transaction
    # (`put_inline`, `delete_inline`, a part undone) — instead of reading back, and
    # hashing again, what was just written. A store's `put_inline` calls `_wrote_inline`,
    # its `delete_inline` `_unwrote`, its `blob_size` and `check_blob` ask `_wrote_size`.

    def _wrote_inline(self, digest: str, data: bytes) -> None:
        wrote = self.__dict__.setdefault("_wrote", {})
        if digest_of(data) == digest:
            wrote[digest] = len(data)
        else:  # bytes not of their name: the guard reads them back and refuses
            wrote.pop(digest, None)

    def _unwrote(self, digest: str) -> None:
        self.__dict__.get("_wrote", {}).pop(digest, None)

    def _wrote_size(self, digest: str) -> int | None:
        return self.__dict__.get("_wrote", {}).get(digest)  # type: ignore[no-any-return]

    # -- one caller's part of a group transaction --------------------------------------

    def open_part(self) -> None:
        """Start one caller's part of a shared transaction (a savepoint)."""
        self._open_part()
        self.__dict__["_wrote_before_part"] = dict(self.__dict__.get("_wrote", {}))

    def close_part(self) -> None:
        """Keep the part (it commits with the transaction)."""
        self._close_part()

    def undo_part(self, exc: BaseException) -> bool:
        """Roll the part back after `exc` and say so (True): the other parts stand. False:
        `exc` may have ended the whole transaction (nothing undone; the group fails)."""
        if not isinstance(exc, Exception) or not self._intact(exc):
            return False
        self.__dict__["_wrote"] = self.__dict__.get("_wrote_before_part", {})
        try:
            self._undo_part()
        except Exception:
            return False
        return True

    # -- the loop ----------------------------------------------------------------------

    def append(self, prepared: Sequence[Prepared], *, head: Head, time_ns: int,
               projector: Projector | None, guard: EventCheck | None) -> list[RecordedEvent]:
        """Append `prepared` after `head` at `time_ns`; return each as recorded (a
        redelivery: the original, `deduped`). Raises what refuses the first refused event
        (IllegalTransition, IdempotencyConflict, the guard's error)."""
        # Fast path: every event is new; rows go in with one multi-row insert. A journal
        # key already present (a redelivery that the lifecycle allows, such as a second
        # pin) rolls the savepoint back and takes the slow path, which inserts row by row
        # and answers each duplicate.
        if len(prepared) == 1:  # nothing to batch: row by row, no savepoint
            return self._append_rows(prepared, head, time_ns, projector, guard, fast=False)
        if self._whole_insert(len(prepared)):
            # The fast path writes nothing before its one insert, which writes all or
            # nothing: a refusal or a duplicate leaves the transaction as it was.
            try:
                return self._append_rows(prepared, head, time_ns, projector, guard, fast=True)
            except (_Duplicate, LedgerError):
                return self._append_rows(prepared, head, time_ns, projector, guard, fast=False)
        self._savepoint()
        try:
            recorded = self._append_rows(prepared, head, time_ns, projector, guard, fast=True)
        except (_Duplicate, LedgerError):
            # A refusal on the fast path may come after an unseen duplicate: the slow
            # path answers exactly, naming the first refused event.
            self._rollback_savepoint()
            recorded = self._append_rows(prepared, head, time_ns, projector, guard, fast=False)
        self._release_savepoint()
        return recorded

    def _append_rows(
        self,
        prepared: Sequence[Prepared],
        head: Head,
        time_ns: int,
        projector: Projector | None,
        guard: EventCheck | None,
        *,
        fast: bool,
    ) -> list[RecordedEvent]:
        if projector is not None:
            projector.begin(self)
            if len(prepared) > 1:
                projector.prefetch(self, {p[4].step for p in prepared if p[4].step})
        seq, prev = head.seq, head.hash
        recorded: list[RecordedEvent] = []
        rows = []
        for event, payload, key, kind, env in prepared:
            change = None
            if projector is not None:
                try:
                    change = projector.check(event, seq + 1, time_ns)
                except IllegalTransition:
                    # A redelivery of an old transition is legal: the journal answers.
                    original = self._answer(key, kind, env, payload)
                    if original is None:
                        if guard is not None and env.epoch > 0:
                            guard(self, event)  # a dead epoch is the truer answer (StaleEpoch)
                        raise
                    recorded.append(original)
                    continue
            if guard is not None and (kind in GUARDED_KINDS or env.epoch > 0):
                # A redelivery is answered by the journal even if the guard refuses
                # it: it reports the past (its blob may be gone since), and a different
                # payload under its key is a conflict, not a blob error. The journal is
                # asked only after a refusal (a fresh event costs no lookup); on the
                # fast path a refusal sends the whole batch down the slow path.
                try:
                    guard(self, event)
                except LedgerError:
                    if fast:
                        raise
                    original = self._answer(key, kind, env, payload)
                    if original is None:
                        raise
                    recorded.append(original)
                    continue
            v = row_version(kind)
            digest = chain_hash(prev, seq + 1, time_ns, env, key, kind, v, payload)
            row = make_event_row((seq + 1, time_ns, env.workspace, env.run, env.step,
                                  env.attempt, env.epoch, env.rev, key, kind, v,
                                  payload, prev, digest))
            if fast:
                rows.append(row)
            else:
                try:
                    self._insert_one(row)
                except DuplicateKey as dup:
                    original = self._answer(key, kind, env, payload)
                    if original is None:
                        raise (dup.error or dup) from None
                    recorded.append(original)
                    continue
            recorded.append(
                RecordedEvent(seq=seq + 1, time_ns=time_ns, journal_key=key, kind=kind,
                              hash=digest, prev_hash=prev, event=event)  # type: ignore[arg-type]
            )
            seq, prev = seq + 1, digest
            if projector is not None:
                projector.accept(change)
        if rows:
            try:
                self._insert_many(rows)
            except DuplicateKey:
                raise _Duplicate from None
        return recorded

    def _answer(self, key: str, kind: str, env: Envelope, payload: bytes) -> RecordedEvent | None:
        """The one place a redelivery is judged: the event recorded under `key` if it is
        this one (`deduped`), IdempotencyConflict if it is another, None if none is."""
        row = self.journal_lookup(key)
        if row is None:
            return None
        same = (
            row.kind == kind
            and bytes(row.payload) == payload
            and (row.workspace, row.run, row.step, row.attempt, row.epoch, row.rev)
            == (env.workspace, env.run, env.step, env.attempt, env.epoch, env.rev)
        )
        if not same:
            raise IdempotencyConflict(key, row.seq)
        return row_to_recorded(row, deduped=True)


_END: Final = object()


class Paged:
    """Rows in batches of at most `batch_max`, paging on the first column (seq):
    `fetch(last, batch)` returns the next batch after `last` as a list (each its own
    statement, so no read holds a long statement nor the log in memory); at most
    `limit` rows. The fold loop runs through this once per event, so a row costs one
    call here; the lock (`lock`, set by a locked view: `locked_view`) is taken once a
    batch, around its fetch and the move to it, never once a row."""

    __slots__ = ("_fetch", "_last", "_remaining", "_batch_max", "_rows", "_done", "lock")

    def __init__(self, fetch: Callable[[int, int], list[Any]], start: int,
                 limit: int | None, batch_max: int) -> None:
        self._fetch, self._last, self._remaining = fetch, start, limit
        self._batch_max = batch_max
        self._rows: Iterator[Any] = iter(())
        self._done = False
        self.lock: Any = None

    def __iter__(self) -> Paged:
        return self

    def __next__(self) -> Any:
        row = next(self._rows, _END)
        return self._more() if row is _END else row

    def _more(self) -> Any:
        if self.lock is None:
            return self._next_batch()
        with self.lock:
            return self._next_batch()

    def _next_batch(self) -> Any:
        # (under the lock, for an iterator shared by threads: another may have fetched
        # the next batch while this one waited — its rows first, never a batch skipped
        # or read twice)
        row = next(self._rows, _END)
        if row is not _END:
            return row
        remaining = self._remaining
        batch = self._batch_max if remaining is None else min(self._batch_max, remaining)
        if self._done or batch <= 0:
            raise StopIteration
        got = self._fetch(self._last, batch)
        if len(got) < batch:
            self._done = True
        if not got:
            raise StopIteration
        self._last = got[-1][0]
        if remaining is not None:
            self._remaining = remaining - len(got)
        self._rows = iter(got)
        return next(self._rows)


def paged(fetch: Callable[[int, int], list[Any]], start: int, limit: int | None,
          batch_max: int) -> Paged:
    """The rows of a paged read (`Paged`)."""
    return Paged(fetch, start, limit, batch_max)


class _LockedIterator:
    """An iterator over a store's connection that holds the store's lock for each step,
    a row it cannot read a typed error (`translate`)."""

    __slots__ = ("_it", "_lock", "_translate")

    def __init__(self, it: Any, lock: Any, translate: Callable[[BaseException], Exception]
                 ) -> None:
        self._it, self._lock, self._translate = it, lock, translate

    def __iter__(self) -> _LockedIterator:
        return self

    def __next__(self) -> Any:
        with self._lock:
            try:
                return next(self._it)
            except ROW_ERRORS as exc:
                raise self._translate(exc) from exc


#: A view's methods that hand out a lazy iterator over the connection.
ITERATING: Final = frozenset({"events", "fold_rows", "checked_rows", "table_rows"})


def _locked(name: str, fn: Any) -> Any:
    # A row the view cannot read (a damaged cell: ROW_ERRORS) is the view's to name — a
    # damaged ledger, CorruptLedger, through its driver's `read_error` — here, where it
    # is met: never the caller's own exception further out (a read transaction passes
    # those through as they are).
    if name in ITERATING:
        @functools.wraps(fn)
        def iterate(self: Any, *args: Any, **kwargs: Any) -> Any:
            lock = self._store.lock.reads_lock
            with lock:
                try:
                    it = fn(self, *args, **kwargs)
                except ROW_ERRORS as exc:
                    raise self._q.read_error(exc) from exc
            if isinstance(it, Paged):  # (it locks each batch's read itself)
                it.lock = lock
                return it
            return _LockedIterator(iter(it), lock, self._q.read_error)
        return iterate

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._store.lock.reads_lock:
            try:
                return fn(self, *args, **kwargs)
            except ROW_ERRORS as exc:
                raise self._q.read_error(exc) from exc
    return call


def locked_view(view: type, doc: str) -> type:
    """A subclass of a store's read view (`store.view`) whose every public method holds
    the store's lock (re-entrant; `StoreLock.reads_lock`: a read never appends, so its
    owner need not be kept) for its call, or for each step of the iterator it returns —
    for each batch's read of a paged one (`Paged`): a read outside a transaction never
    meets another thread's use of the connection."""
    methods: dict[str, Any] = {}
    for cls in reversed(view.__mro__[:-1]):  # the most derived definition wins
        methods.update({name: fn for name, fn in vars(cls).items()
                        if not name.startswith("_") and callable(fn)})
    methods = {name: _locked(name, fn) for name, fn in methods.items()}
    return type(f"_Locked{view.__name__}", (view,), {"__doc__": doc, **methods})


__all__ = ["GUARDED_KINDS", "ITERATING", "Paged", "TxBase", "check_row", "locked_view", "paged", "row_problem",
           "row_to_recorded"]

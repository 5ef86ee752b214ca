"""The event log: append, read, head — over the store (docs/storage.md).

The events are the ledger's ground truth; projections are rebuilt from them. The log is
their only writer and only ever appends (the SQLite store's triggers refuse UPDATE and
DELETE even from raw SQL). One append is one store transaction that holds the events,
their journal keys, the hash chain and the inline projection updates: either all of it
is written or none of it. The append loop itself is `ledger.store.base.TxBase.append`;
the log prepares the events (validation, journal keys, envelopes, the batch limit),
keeps the head cached while no other connection wrote, runs builders under the write
lock, flushes the projector and calls the commit hooks.

Journal keys make appends idempotent: the same key with the same event returns the
original row and writes nothing; the same key with a different event raises
IdempotencyConflict and writes nothing.

Group commit (docs/design.md "Group commit"): appends from several threads at once share
one transaction and one fsync. The first caller to find nobody committing leads: it takes
every append waiting, runs each under its own savepoint inside one write transaction (a
caller's refusal rolls back its part alone and is raised to it alone), calls
`before_commit` once with the final head, commits once, and hands each caller its own
result or its own error. A lone caller takes exactly the path it always took.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

import msgspec

from .errors import CorruptLedger, InvalidInput
from .events import (Built, Event, RecordedEvent, encode_built, envelope, journal_key, kind_of,
                     validate)
from .store import (ROW_ERRORS, ROW_NAMES, ROW_TYPES, EventCheck, EventQuery, Head, Prepared,
                    Projector, Scope, Store, Tx)
from .store.base import GUARDED_KINDS, check_row, row_problem, row_to_recorded

BATCH_SIZE_MAX: Final = 100_000
#: What reading an undecodable row raises (named CorruptLedger by `read`).
_DECODE_ERRORS: Final = (msgspec.DecodeError, msgspec.ValidationError, InvalidInput, *ROW_ERRORS)

#: A builder: events decided inside the transaction, at its time.
Builder = Callable[[Tx, int], Sequence[Event | Built]]
#: Run inside the transaction after its events and projection rows are written (a seal
#: deletes the rows its event covers there: docs/design.md "Sealed runs").
After = Callable[[Tx, list[RecordedEvent]], None]
#: The most appends one group transaction takes (the rest wait for the next one).
GROUP_MAX: Final = 256


class _Call:
    """One caller's append, waiting for (or run by) a group transaction's leader."""

    __slots__ = ("prepared", "build", "inline", "inline_ns", "guard", "after", "scope", "done",
                 "result", "error")

    def __init__(self, prepared: list[Prepared], build: Builder | None,
                 inline: Mapping[str, bytes] | None, inline_ns: int, guard: EventCheck | None,
                 after: After | None = None, scope: Scope = Scope()) -> None:
        self.prepared, self.build, self.inline, self.inline_ns, self.guard = (
            prepared, build, inline, inline_ns, guard)
        self.after = after
        self.scope = scope
        self.done = False
        self.result: list[RecordedEvent] | None = None
        self.error: BaseException | None = None


def _copy_error(exc: BaseException) -> BaseException:
    """A copy of `exc` to raise in one more thread (the same object if it cannot be
    copied faithfully): a failure every caller of a group shares, each raising its own."""
    cls = type(exc)
    try:
        new = cls.__new__(cls, *exc.args)  # no __init__: its arguments are the class's own
        new.args = exc.args
        new.__dict__.update(getattr(exc, "__dict__", {}))
    except Exception:
        return exc
    if str(new) != str(exc):
        return exc
    new.__cause__, new.__context__ = exc.__cause__, exc.__context__
    new.__suppress_context__ = exc.__suppress_context__
    return new.with_traceback(exc.__traceback__)


#: Events that register a workspace's root: decided against every other workspace's.
_REGISTRATIONS: Final = frozenset({"workspace-added", "workspace-restored", "workspace-rebound"})


def _scope_of(prepared: Sequence[Prepared]) -> Scope:
    """The scope events given up front confine their transaction to: their one workspace,
    or (events of several, or of none) the whole ledger."""
    if any(kind in _REGISTRATIONS for _e, _p, _k, kind, _env in prepared):
        return Scope()  # a root is checked against every other workspace's
    names = {env.workspace for _e, _p, _k, _kind, env in prepared}
    if len(names) == 1:
        (name,) = names
        if name:
            return Scope(name)
    return Scope()


def _check_scope(prepared: Sequence[Prepared], scope: Scope) -> None:
    """A builder of a workspace's transaction decides events of that workspace only (the
    transaction holds that workspace's lock, not the others')."""
    if scope.workspace is None:
        return
    for event, _p, _k, kind, env in prepared:
        if env.workspace != scope.workspace:
            raise InvalidInput(f"a transaction of workspace {scope.workspace!r} built a {kind}"
                               f" event of workspace {env.workspace!r}; nothing was written")


class EventLog:
    """The ledger's events: append, read, head."""

    def __init__(self, store: Store, projector: Projector | None = None) -> None:
        self.store = store
        self.projector = projector
        # The head after our last commit, valid while the store's generation says no
        # other connection has committed since.
        self._head: Head | None = None
        self._generation: object = None
        #: Called with the new head after every commit that appended (the witness).
        self.on_commit: Callable[[Head], None] | None = None
        #: Called inside the transaction, before COMMIT, with the head it will commit.
        self.before_commit: Callable[[Tx, Head], None] | None = None
        #: The head the current (or last) write transaction appends after, read under
        #: its write lock: `before_commit` may compare it with a head it saw before.
        self.start_head: Head | None = None
        # The head after this log's last commit, and where its run of back-to-back
        # commits began (each started from the head the one before it committed): every
        # event between the two is this log's own (`only_mine_since`).
        self._last_end: Head | None = None
        self._run_from: Head | None = None
        #: Concurrent appends (threads) share one transaction and one fsync; off: each
        #: append is its own transaction, the threads taking turns.
        self.group_commit = True
        #: Events of each kind this log has appended (counted before their commit, so a
        #: cache of rarely-changing state keyed on it is never stale: the workspaces'
        #: registrations, see `Workspaces.registration`).
        self.appended: Counter[str] = Counter()
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Call] = []
        self._leading = False

    @property
    def path(self) -> str:
        """Where the log is (for messages)."""
        return self.store.info.location

    @property
    def genesis(self) -> bytes:
        return self.store.genesis

    def head(self) -> Head:
        return self.store.view.head()

    # -- writing ---------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Event] | Builder,
        *,
        inline: Mapping[str, bytes] | None = None,
        inline_ns: int = 0,
        guard: EventCheck | None = None,
        after: After | None = None,
        scope: Scope | None = None,
    ) -> list[RecordedEvent]:
        """Append events atomically; return them as recorded, in order.

        Each event is validated and keyed as docs/design.md says (`events.journal_key`). A
        key already recorded with the same event yields the original row with
        `deduped=True`; with a different event, IdempotencyConflict. An illegal
        transition raises IllegalTransition. On any error nothing is written.
        `events` may be a builder, `build(tx, time_ns)`, run under the write lock.
        `inline` (digest -> bytes, stored at `inline_ns`; 0: at the transaction's time, the
        one its events carry — no clock read of its own) is written first inside the
        transaction: the inline blob bytes the events name commit with them.
        `guard(tx, event)` runs before the insert of each new `blob-stored` or
        `manifest-published` (and each event under an epoch) and raises to refuse it.
        `after(tx, recorded)` runs in the transaction once the events and their projection
        rows are written (an append with it is never grouped with others').
        """
        build = events if callable(events) else None
        prepared = [] if build is not None else self._prepare(events)  # type: ignore[arg-type]
        if scope is None:
            scope = _scope_of(prepared)
        call = _Call(prepared, build, inline, inline_ns, guard, after, scope)
        lock = self.store.lock
        if self.store.reading_here():
            raise InvalidInput("an append inside a read transaction (storage.read()) cannot"
                               " commit: append after the read, or inside a write"
                               " transaction (storage.transaction())")
        if not self.group_commit or self.store.held_here() or after is not None:
            # Group commit off, or this thread holds the store's lock already (inside
            # its own transaction, or a section it locked: a nested append): alone, as
            # it always was — never queued behind a leader waiting for that lock.
            with lock:
                return self._alone(call)
        cond = self._cond
        with cond:
            alone = not self._leading and not self._queue
            if alone:
                self._leading = True
        if alone:
            # Nobody committing, nobody waiting: the lone caller's path, no queue.
            try:
                with lock:
                    if not self._queue:
                        return self._alone(call)
                    with cond:  # others queued while this one waited for the lock
                        self._queue.insert(0, call)
                    self._lead()
            finally:
                with cond:
                    self._leading = False
                    cond.notify_all()  # the next leader, or the callers it committed
            return self._outcome(call)
        with cond:
            self._queue.append(call)
            while not call.done:
                if self._leading:
                    cond.wait()  # the leader's transaction may take this call too
                    continue
                self._leading = True
                cond.release()
                try:
                    self._lead()
                finally:
                    cond.acquire()
                    self._leading = False
                    cond.notify_all()
        return self._outcome(call)

    @staticmethod
    def _outcome(call: _Call) -> list[RecordedEvent]:
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _lead(self) -> None:
        """Commit the appends waiting (this thread's among them, or first in line)."""
        with self.store.lock:  # held until the hooks after COMMIT have run
            with self._cond:
                batch, self._queue = self._queue[:GROUP_MAX], self._queue[GROUP_MAX:]
            try:
                if len(batch) == 1:
                    call = batch[0]
                    try:
                        call.result = self._alone(call)
                    except BaseException as exc:
                        call.error = exc
                        if not isinstance(exc, Exception):
                            raise
                else:
                    self._group(batch)
            finally:
                with self._cond:
                    for call in batch:
                        call.done = True

    def _alone(self, call: _Call) -> list[RecordedEvent]:
        """One append, one transaction (the caller holds the store's lock)."""
        prepared = call.prepared
        try:
            with self.store.transaction(call.scope) as tx:
                self._sync()
                # the events' time, and the clock guards judge lease expiry by: the log
                # alone can re-check every decision
                time_ns = tx.time_ns
                if call.build is not None:
                    # Events decided under the write lock, at this transaction's time
                    # (a lease, a fence): nothing can change between the check and them.
                    prepared = self._prepare(call.build(tx, time_ns))
                    _check_scope(prepared, call.scope)
                if call.inline:
                    tx.put_inline(call.inline, call.inline_ns or time_ns)
                # The head last: a store that lets transactions of several workspaces run
                # at once takes its chain lock here (docs/design.md "Many writers").
                head = self._head if self._head is not None else tx.head()
                self.start_head = head
                self.appended.update(p[3] for p in prepared)
                recorded = tx.append(prepared, head=head, time_ns=time_ns,
                                     projector=self.projector, guard=call.guard)
                new = [r for r in recorded if not r.deduped]
                if self.projector is not None and new:
                    tx.write_projection(self.projector.flush(new[-1].seq))
                if call.after is not None:
                    call.after(tx, recorded)
                if new and self.before_commit is not None:
                    self.before_commit(tx, Head(new[-1].seq, new[-1].hash))
        except BaseException:
            self._forget()
            raise
        if new:
            self._head = Head(new[-1].seq, new[-1].hash)
            self._extend_run(head, self._head)
        if self.projector is not None:
            self.projector.committed()
        if new and self.on_commit is not None:
            self.on_commit(self._head)  # type: ignore[arg-type]
        return recorded

    def _group(self, batch: list[_Call]) -> None:
        """Several appends, one transaction: each under its own savepoint (a refusal
        undoes that part only and goes to its caller), one `before_commit` with the
        final head, one COMMIT, one `on_commit`. A failure of the transaction itself
        (the COMMIT, a driver error, `before_commit`) goes to every caller whose part
        stood. The caller holds the store's lock."""
        projector = self.projector
        kept: list[tuple[_Call, list[RecordedEvent]]] = []
        try:
            scopes = {call.scope for call in batch}
            scope = scopes.pop() if len(scopes) == 1 else Scope()
            with self.store.transaction(scope) as tx:
                self._sync()
                start = head = self._head if self._head is not None else tx.head()
                self.start_head = start
                time_ns = tx.time_ns  # one transaction, one time for every part
                for call in batch:
                    tx.open_part()
                    try:
                        if call.inline:
                            tx.put_inline(call.inline, call.inline_ns or time_ns)
                        prepared = (call.prepared if call.build is None
                                    else self._prepare(call.build(tx, time_ns)))
                        _check_scope(prepared, scope)
                        self.appended.update(p[3] for p in prepared)
                        recorded = tx.append(prepared, head=head, time_ns=time_ns,
                                             projector=projector, guard=call.guard)
                        new = [r for r in recorded if not r.deduped]
                        if projector is not None and new:
                            # each part writes its own projection changes, inside its
                            # savepoint: undoing the part undoes them
                            tx.write_projection(projector.flush(new[-1].seq))
                    except BaseException as exc:
                        if not tx.undo_part(exc):
                            raise
                        call.error = exc  # this caller's alone; the others go on
                        continue
                    tx.close_part()
                    if projector is not None:
                        # the rows it cached describe the tables before this part: the
                        # next part reads them from the transaction
                        projector.forget()
                    if new:
                        head = Head(new[-1].seq, new[-1].hash)
                    kept.append((call, recorded))
                if head.seq != start.seq and self.before_commit is not None:
                    self.before_commit(tx, head)
        except BaseException as exc:
            self._forget()
            for call in batch:
                if call.error is None:
                    call.error = _copy_error(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if projector is not None:
            projector.forget()
        if head.seq != start.seq:
            self._head = head
            self._extend_run(start, head)
            if self.on_commit is not None:
                try:
                    self.on_commit(head)
                except Exception as exc:  # committed, but the caller must hear it
                    for call, _recorded in kept:
                        call.error = _copy_error(exc)
                    return
        for call, recorded in kept:
            call.result = recorded

    @staticmethod
    def _prepare(events: Sequence[Event | Built]) -> list[Prepared]:
        if not events:
            raise InvalidInput("append() needs at least one event")
        if len(events) > BATCH_SIZE_MAX:
            raise InvalidInput(
                f"a batch of {len(events)} events is too large; the limit is {BATCH_SIZE_MAX}"
            )
        prepared = []
        for event in events:
            if type(event) is Built:  # built from checked fields: not decoded again
                event = event.event
                payload = encode_built(event)
            else:
                payload = validate(event)
            prepared.append((event, payload, journal_key(event), kind_of(event), envelope(event)))
        return prepared

    def _sync(self) -> None:
        """Drop cached state if another connection committed since our last look."""
        generation = self.store.generation()
        if generation != self._generation:
            self._forget()
            self._generation = generation

    def _forget(self) -> None:
        self._head = None
        self._generation = None
        if self.projector is not None:
            self.projector.forget()

    def _extend_run(self, start: Head, end: Head) -> None:
        """A commit of this log appended after `start` up to `end`."""
        if start != self._last_end or self._run_from is None:
            self._run_from = start  # someone else appended since our last commit
        self._last_end = end

    def only_mine_since(self, then: Head, now: Head) -> bool:
        """Whether every event appended after head `then` up to head `now` is this
        log's own (both read from the store; `now` the newer): nothing was appended, or
        `now` is this log's last commit and `then` lies within its run of back-to-back
        commits."""
        if then == now:
            return True
        run_from, last = self._run_from, self._last_end
        return (run_from is not None and now == last
                and run_from.seq <= then.seq <= now.seq)

    def fresh(self) -> bool:
        """Whether no other connection has committed since this log's last look (its
        cached rows are the tables' then)."""
        return self.store.generation() == self._generation

    # -- reading ---------------------------------------------------------------------

    def read(
        self,
        after_seq: int = 0,
        *,
        step: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        run: str | None = None,
        workspace: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events with seq > `after_seq`, in order, read in bounded batches."""
        query = EventQuery(after_seq=after_seq, step=step, limit=limit, run=run,
                           workspace=workspace,
                           kinds=None if kind is None else frozenset((kind,)))
        for row in self.store.view.events(query):
            try:
                yield row_to_recorded(check_row(row))
            except _DECODE_ERRORS as exc:
                raise CorruptLedger(self.path, f"event #{row.seq} cannot be decoded: {exc}") from None

    def count(self) -> int:
        return self.store.view.count()


__all__ = ["GUARDED_KINDS", "ROW_NAMES", "ROW_TYPES", "EventLog", "Head", "Projector",
           "row_problem", "row_to_recorded"]


"""Append-only event storage.

The `events` table is the ledger's ground truth; projections are rebuilt from it.
This module is its only writer and only ever INSERTs (triggers refuse UPDATE and
DELETE even from raw SQL). One append is one ``BEGIN IMMEDIATE`` transaction that
holds the events, their journal keys, the hash chain and the inline projection
updates: either all of it is written or none of it.

Journal keys make appends idempotent: the same key with the same event returns the
original row and writes nothing; the same key with a different event raises
IdempotencyConflict and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Protocol

import apsw
import msgspec

from .store.sqlite.file import ROW_ERRORS, Database, read_error
from .errors import (
    CorruptLedger,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LedgerError,
)
from .store import ROW_NAMES, ROW_TYPES, Head
from .store.base import check_row, row_problem, row_to_recorded
from .events import (
    EVENT_VERSION,
    Envelope,
    Event,
    RecordedEvent,
    chain_hash,
    envelope,
    genesis_hash,
    journal_key,
    kind_of,
    validate,
)

BATCH_SIZE_MAX: Final = 100_000
READ_BATCH: Final = 2_000

INSERT_SQL: Final = (
    "INSERT INTO events(seq, time_ns, workspace, run, step, attempt, epoch, rev,"
    " journal_key, kind, v, payload, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
#: The columns a projection fold needs.
FOLD_COLUMNS: Final = "seq, time_ns, kind, v, payload"
ROW_COLUMNS: Final = (
    "seq, time_ns, workspace, run, step, attempt, epoch, rev, journal_key, kind, v,"
    " payload, prev_hash, hash"
)


class Projector(Protocol):
    """Inline projections, updated in the append transaction.

    `check` folds one event into a copy of the current state and returns the change
    (raising IllegalTransition for an illegal one); `accept` keeps a change once its
    event is certain to be inserted; `flush` writes every kept change and the
    checkpoint. `committed` is called after COMMIT (the projector may cache what it
    wrote); `forget` drops any cache (another connection wrote, or we rolled back).
    """

    def begin(self, conn: apsw.Connection) -> None: ...
    def check(self, event: Any, seq: int, time_ns: int) -> object: ...
    def accept(self, change: object) -> None: ...
    def flush(self, conn: apsw.Connection, last_seq: int) -> None: ...
    def committed(self) -> None: ...
    def forget(self) -> None: ...


class _Duplicate(Exception):
    """The fast path met a journal key already recorded: retry row by row."""


#: Kinds whose events name blobs that the guard checks.
GUARDED_KINDS: Final = frozenset({"blob-stored", "manifest-published"})


class EventLog:
    """The `events` table: append, read, head."""

    def __init__(
        self, db: Database, clock: Callable[[], int], projector: Projector | None = None
    ) -> None:
        self.db = db
        self.clock = clock
        self.projector = projector
        self._genesis: bytes | None = None
        # The head after our last commit, valid while `PRAGMA data_version` says no other
        # connection has committed since (SQLite bumps it only for other connections).
        self._head: Head | None = None
        self._data_version: int | None = None
        #: The time of the transaction in progress (its events' `time_ns`): guards judge
        #: lease expiry by it, so the log alone can re-check every decision.
        self.txn_time_ns = 0
        #: Called with the new head after every commit that appended (the witness).
        self.on_commit: Callable[[Head], None] | None = None
        #: Called inside the transaction, before COMMIT, with the head it will commit.
        self.before_commit: Callable[[apsw.Connection, Head], None] | None = None

    @property
    def genesis(self) -> bytes:
        if self._genesis is None:
            self._genesis = genesis_hash(self.db.meta("ledger_id"))
        return self._genesis

    def head(self) -> Head:
        try:
            row = self.db.conn.execute(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        except apsw.Error as exc:
            raise read_error(exc, self.db.path) from None
        if row is None:
            return Head(0, self.genesis)
        if not isinstance(row[1], bytes):
            raise CorruptLedger(self.db.path, f"event #{row[0]}'s hash is not a blob")
        return Head(row[0], row[1])

    # -- writing ---------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Event] | Callable[[apsw.Connection, int], Sequence[Event]],
        *,
        before: Callable[[apsw.Connection], None] | None = None,
        guard: Callable[[apsw.Connection, Event], None] | None = None,
    ) -> list[RecordedEvent]:
        """Append events atomically; return them as recorded, in order.

        Each event is validated and keyed as docs/design.md says (`events.journal_key`). A
        key already recorded with the same event yields the original row with
        `deduped=True`; with a different event, IdempotencyConflict. An illegal
        transition raises IllegalTransition. On any error nothing is written.
        `before(conn)` runs first inside the transaction (to write rows the events
        need, such as inline blob bytes); `guard(conn, event)` runs before the INSERT
        of each new `blob-stored` or `manifest-published` and raises to refuse it.
        """
        build = events if callable(events) else None
        prepared = [] if build is not None else self._prepare(events)  # type: ignore[arg-type]

        try:
            with self.db.transaction() as conn:
                self._sync(conn)
                head = self._head if self._head is not None else self.head()
                if before is not None:
                    before(conn)
                time_ns = self.clock()
                self.txn_time_ns = time_ns
                if build is not None:
                    # Events decided under the write lock, at this transaction's time
                    # (a lease, a fence): nothing can change between the check and them.
                    prepared = self._prepare(build(conn, time_ns))
                # Fast path: every event is new; rows go in with one executemany. A
                # journal key already present (a redelivery that the lifecycle allows,
                # such as a second pin) rolls the savepoint back and takes the slow
                # path, which inserts row by row and answers each duplicate.
                if len(prepared) == 1:  # nothing to batch: row by row, no savepoint
                    recorded = self._append_rows(conn, prepared, head, time_ns, guard, fast=False)
                else:
                    conn.execute("SAVEPOINT append_batch")
                    try:
                        recorded = self._append_rows(conn, prepared, head, time_ns, guard, fast=True)
                    except (_Duplicate, LedgerError):
                        # A refusal on the fast path may come after an unseen duplicate:
                        # the slow path answers exactly, naming the first refused event.
                        conn.execute("ROLLBACK TO append_batch")
                        recorded = self._append_rows(conn, prepared, head, time_ns, guard, fast=False)
                    conn.execute("RELEASE append_batch")
                new = [r for r in recorded if not r.deduped]
                if self.projector is not None and new:
                    self.projector.flush(conn, new[-1].seq)
                if new and self.before_commit is not None:
                    self.before_commit(conn, Head(new[-1].seq, new[-1].hash))
        except BaseException:
            self._forget()
            raise
        if new:
            self._head = Head(new[-1].seq, new[-1].hash)
        if self.projector is not None:
            self.projector.committed()
        if new and self.on_commit is not None:
            self.on_commit(self._head)  # type: ignore[arg-type]
        return recorded

    @staticmethod
    def _prepare(events: Sequence[Event]) -> list[tuple[Event, bytes, str, str, Envelope]]:
        if not events:
            raise InvalidInput("append() needs at least one event")
        if len(events) > BATCH_SIZE_MAX:
            raise InvalidInput(
                f"a batch of {len(events)} events is too large; the limit is {BATCH_SIZE_MAX}"
            )
        prepared = []
        for event in events:
            payload = validate(event)
            prepared.append((event, payload, journal_key(event), kind_of(event), envelope(event)))
        return prepared

    def _sync(self, conn: apsw.Connection) -> None:
        """Drop cached state if another connection committed since our last look."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._forget()
            self._data_version = version

    def _forget(self) -> None:
        self._head = None
        self._data_version = None
        if self.projector is not None:
            self.projector.forget()

    def _append_rows(
        self,
        conn: apsw.Connection,
        prepared: list[tuple[Event, bytes, str, str, Envelope]],
        head: Head,
        time_ns: int,
        guard: Callable[[apsw.Connection, Event], None] | None,
        *,
        fast: bool,
    ) -> list[RecordedEvent]:
        projector = self.projector
        if projector is not None:
            projector.begin(conn)
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
                    original = self._journal_hit(conn, key, kind, env, payload)
                    if original is None:
                        if guard is not None and env.epoch > 0:
                            guard(conn, event)  # a dead epoch is the truer answer (StaleEpoch)
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
                    guard(conn, event)
                except LedgerError:
                    if fast:
                        raise
                    original = self._journal_hit(conn, key, kind, env, payload)
                    if original is None:
                        raise
                    recorded.append(original)
                    continue
            digest = chain_hash(prev, seq + 1, time_ns, env, key, kind, EVENT_VERSION, payload)
            row = (seq + 1, time_ns, env.workspace, env.run, env.step, env.attempt, env.epoch,
                   env.rev, key, kind, EVENT_VERSION, payload, prev, digest)
            if fast:
                rows.append(row)
            else:
                try:
                    conn.execute(INSERT_SQL, row)
                except apsw.ConstraintError:
                    original = self._journal_hit(conn, key, kind, env, payload)
                    if original is None:
                        raise
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
                conn.executemany(INSERT_SQL, rows)
            except apsw.ConstraintError:
                raise _Duplicate from None
        return recorded

    def _journal_hit(
        self, conn: apsw.Connection, key: str, kind: str, env: Envelope, payload: bytes
    ) -> RecordedEvent | None:
        row = conn.execute(
            f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        same = (
            row[9] == kind
            and bytes(row[11]) == payload
            and (row[2], row[3], row[4], row[5], row[6], row[7])
            == (env.workspace, env.run, env.step, env.attempt, env.epoch, env.rev)
        )
        if not same:
            raise IdempotencyConflict(key, row[0])
        return row_to_recorded(row, deduped=True)

    # -- reading ---------------------------------------------------------------------

    def read(
        self,
        after_seq: int = 0,
        *,
        step: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events with seq > `after_seq`, in order, read in bounded batches."""
        for row in self.rows(after_seq, step=step, kind=kind, limit=limit):
            try:
                yield row_to_recorded(check_row(row))
            except (msgspec.DecodeError, msgspec.ValidationError, InvalidInput, *ROW_ERRORS) as exc:
                raise CorruptLedger(self.db.path, f"event #{row[0]} cannot be decoded: {exc}") from None

    def rows(
        self,
        after_seq: int = 0,
        *,
        step: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        columns: str = ROW_COLUMNS,
    ) -> Iterator[tuple[Any, ...]]:
        """Raw event rows (seq order) in batches of READ_BATCH, each its own query.

        `columns` must start with ``seq`` (it pages on it)."""
        where, params = ["seq > ?"], []
        if step is not None:
            where.append("step = ?")
            params.append(step)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        sql = f"SELECT {columns} FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        remaining = limit
        last = after_seq
        while True:
            batch = READ_BATCH if remaining is None else min(READ_BATCH, remaining)
            if batch <= 0:
                return
            try:
                got = self.db.conn.execute(sql, (last, *params, batch)).fetchall()
            except (apsw.Error, UnicodeDecodeError) as exc:
                raise read_error(exc, self.db.path) from None
            yield from got
            if len(got) < batch:
                return
            last = got[-1][0]
            if remaining is not None:
                remaining -= len(got)

    def count(self) -> int:
        return int(self.db.conn.execute("SELECT count(*) FROM events").fetchone()[0])


__all__ = ["EventLog", "Head", "Projector", "row_to_recorded"]

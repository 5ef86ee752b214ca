"""The PostgreSQL store: a ledger in a PostgreSQL database, its blobs in it too.

`PgStore` implements `ledger.store.Store` over one psycopg connection (autocommit, with
explicit transactions), so it behaves as the SQLite store does: `PgView` reads it (a
``REPEATABLE READ`` transaction inside `read()`: one snapshot), `PgTx` writes it (a
``READ COMMITTED`` transaction that first takes the ledger's chain lock, an advisory
transaction lock, so appends are serialized exactly where the hash chain needs them: the
head a transaction appends after cannot move under it). The append loop is `TxBase`'s;
this module provides its primitives. Blob bytes live in the database (`blobs.PgFiles`:
chunk rows and a pointer row committed in one transaction before any event names them).

Time: a transaction's time (`Tx.time_ns`: its events' time, and the clock leases are
judged by) is the database server's ``clock_timestamp()``, never a worker's, unless a
clock is injected (tests).

Threads: as on SQLite, `lock` (re-entrant) is held by every use of the connection.

Errors: a lost connection is `DatabaseUnavailable` (the next use reconnects); a commit
cut off may or may not have committed, which a retry with the same journal key answers.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from ...errors import (
    AccessDenied,
    CorruptLedger,
    DatabaseUnavailable,
    InvalidInput,
    LedgerBusy,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    ReadOnlyLedger,
    StorageFailure,
)
from ...blobs import pulse_with
from ...events import genesis_hash
from ..rows import IN_FLIGHT, PathState, StepRow, WsRow
from .. import (
    BUSY_TIMEOUT_MS,
    COPY_TABLES,
    BlobStat,
    Checkpoint,
    DuplicateKey,
    EntryRow,
    EventQuery,
    EventRow,
    FoldRow,
    Head,
    Held,
    PinHold,
    ProjectionChanges,
    RowsUnreadable,
    Scope,
    StoreInfo,
    make_entry_row,
    make_event_row,
    make_fold_row,
    make_pin_hold,
)
from ..lock import StoreLock
from ..base import TxBase, locked_view, paged, row_problem
from . import schema as sch
from .driver import _first_line, _psycopg
from .location import SCHEMES, check_url, is_url, shown_location, without_secrets
from . import sql as q
from ..sql import if_current, many_rows

CHECKPOINT_NAME: Final = "steps"
#: The most parameters one multi-row statement carries (the protocol's limit: 65,535).
PARAMS_MAX: Final = 30_000
READ_BATCH: Final = 2_000
#: The advisory lock class of every steptrail lock ('STLG' as a signed 32-bit int).
LOCK_CLASS: Final = 0x53544C47
#: The advisory lock class of the workspaces' locks: a class of their own, so that no
#: workspace name (its key a crc32 anyone can aim) can take the ledger's, the chain's or
#: the collector's lock; two workspaces whose keys collide only take turns.
LOCK_CLASS_WS: Final = 0x53544C48
#: How long a connection attempt may take.
CONNECT_TIMEOUT_S: Final = 10
#: The server's time in nanoseconds (microsecond resolution).
_NOW_NS: Final = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint * 1000"
#: A session idle inside a transaction this long is ended by the server (its transaction
#: rolled back, its locks freed): a writer stalled or cut off mid-transaction holds the
#: other writers up for at most this, never until TCP gives up.
IDLE_IN_TRANSACTION_MS: Final = 60_000
#: A write transaction silent this long is ended by the server (see docs/design.md,
#: "Many writers"): a frozen or cut-off writer lets go of its workspace's lock (a takeover
#: waits at most this) and of the ledger lock. A builder's long file work inside it
#: (hashing a large displaced file, streaming it to the blob rows) keeps the session
#: alive with a round trip a second (`_pulse`), so only a writer that stopped making
#: progress is ended.
WRITE_IDLE_MS: Final = 10_000
#: Once a transaction holds the chain lock — the one lock every writer needs — it does
#: database work only (chain, insert, COMMIT); silent this long, the server ends it.
CHAIN_IDLE_MS: Final = 5_000
#: A whole-ledger transaction (gc, a registration, a seal) asks for the ledger lock
#: without queuing for this long first: PostgreSQL grants locks in queue order, so a
#: queued exclusive request would hold up every workspace transaction that comes after
#: it behind whichever slow builder it waits for. Past this it queues (no starvation).
EXCLUSIVE_POLL_MS: Final = 5_000
#: The longest a builder's file work goes without a round trip (`_pulse`).
PULSE_S: Final = 1.0
#: TCP keepalives on every connection: a server gone silent is noticed in ~25 s.
KEEPALIVES: Final = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                     "keepalives_count": 3}


def _lock_key(name: str) -> int:
    """A stable signed 32-bit key for lock `name` (crc32: the same in every process)."""
    k = zlib.crc32(name.encode())
    return k - (1 << 32) if k >= 1 << 31 else k


class PgView:
    """Reads of the store's connection (inside `read()`: one snapshot)."""

    def __init__(self, store: PgStore) -> None:
        self._store = store

    def _all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._store._run(sql, params).fetchall()  # type: ignore[no-any-return]

    def _one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self._store._run(sql, params).fetchone()  # type: ignore[no-any-return]

    # -- events ------------------------------------------------------------------------

    def head(self) -> Head:
        row = self._one(q.S.HEAD)
        if row is None:
            return Head(0, self._store.genesis)
        if not isinstance(row[1], bytes):
            raise CorruptLedger(self._store.location, f"event #{row[0]}'s hash is not bytes")
        return Head(row[0], row[1])

    def count(self) -> int:
        return int(self._one(q.S.COUNT)[0])  # type: ignore[index]

    def events(self, query: EventQuery = EventQuery()) -> Iterator[EventRow]:
        sql, params = q.query(query)
        start = 2**63 - 1 if query.descending else query.after_seq
        return self._paged(sql, params, start, query.limit, make_event_row)  # type: ignore[return-value]

    def fold_rows(self, after_seq: int = 0) -> Iterator[FoldRow]:
        sql, params = q.query(EventQuery(after_seq=after_seq), q.FOLD_COLUMNS)
        return self._paged(sql, params, after_seq, None, make_fold_row)  # type: ignore[return-value]

    def _paged(self, sql: str, params: list[Any], start: int, limit: int | None,
               make: Callable[[Any], tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        return paged(lambda last, batch: list(map(make, self._all(sql, (last, *params, batch)))),  # type: ignore[no-any-return]
                     start, limit, READ_BATCH)

    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]:
        """Every row after `after_seq` with what is wrong with its cells (the columns'
        types make most damage impossible here; None: nothing)."""
        last = after_seq
        while True:
            try:
                got = self._all(q.S.CHECKED, (last, READ_BATCH))
            except LedgerError as exc:
                raise RowsUnreadable(str(exc)) from None
            for r in got:
                yield make_event_row(r), row_problem(r)
            if len(got) < READ_BATCH:
                return
            last = got[-1][0]

    def journal_lookup(self, key: str) -> EventRow | None:
        row = self._one(q.S.JOURNAL, (key,))
        return None if row is None else make_event_row(row)

    def journal_newest(self, prefix: str, kind: str | None = None) -> EventRow | None:
        from ..sql import prefix_range
        low, high = prefix_range(prefix)
        if kind is None:
            row = self._one(q.JOURNAL_RANGE.format(""), (low, high))
        else:
            row = self._one(q.JOURNAL_RANGE.format(" AND kind = %s"), (low, high, kind))
        return None if row is None else make_event_row(row)

    # -- projections, meta -------------------------------------------------------------

    def checkpoint(self) -> Checkpoint | None:
        row = self._one(q.S.SELECT_CHECKPOINT, (CHECKPOINT_NAME,))
        return None if row is None else Checkpoint(row[0], row[1])

    def step(self, step_id: str) -> StepRow | None:
        row = self._one(q.S.SELECT_STEP, (step_id,))
        return None if row is None else StepRow.from_tuple(row)

    def step_if_current(self, step_id: str, version: int) -> tuple[bool, StepRow | None]:
        return self._if_current(q.S.STEP_IF_CURRENT, step_id, version, StepRow.from_tuple)

    def workspace_if_current(self, name: str, version: int) -> tuple[bool, WsRow | None]:
        return self._if_current(q.S.WS_IF_CURRENT, name, version, WsRow.from_tuple)

    def _if_current(self, sql: str, key: str, version: int, make: Any) -> tuple[bool, Any]:
        row = self._one(sql, (CHECKPOINT_NAME, CHECKPOINT_NAME, key))
        try:
            return if_current(row, version, make)
        except (TypeError, ValueError) as exc:  # a damaged row's cells
            raise CorruptLedger(self._store.location, str(exc)) from None

    def steps_by_id(self, step_ids: Sequence[str]) -> list[StepRow]:
        return [StepRow.from_tuple(r) for r in self._all(q.S.SELECT_STEPS_IN, (list(step_ids),))]

    def steps(self, *, state: str | None = None, step_id: str | None = None,
              contains: str | None = None, limit: int | None = None) -> list[StepRow]:
        sql, params = q.select_steps(state, step_id, contains, limit)
        return [StepRow.from_tuple(r) for r in self._all(sql, params)]

    def steps_in_flight(self, workspace: str, before_epoch: int | None = None, *,
                        limit: int | None = None, oldest_first: bool = False
                        ) -> list[tuple[str, int]]:
        sql = q.in_flight(before_epoch is not None, oldest_first, limit is not None)
        params: list[object] = [workspace]
        if before_epoch is not None:
            params.append(before_epoch)
        params.extend(sorted(IN_FLIGHT))
        if limit is not None:
            params.append(limit)
        return [(r[0], int(r[1])) for r in self._all(sql, params)]

    def workspace(self, name: str) -> WsRow | None:
        row = self._one(q.S.SELECT_ONE_WS, (name,))
        return None if row is None else WsRow.from_tuple(row)

    def workspace_rows(self) -> list[WsRow]:
        return [WsRow.from_tuple(r) for r in self._all(q.S.SELECT_WS)]

    def path_state(self, workspace: str, path: str) -> PathState | None:
        row = self._one(q.S.SELECT_PATH, (workspace, path))
        return None if row is None else (int(row[0]), row[1], int(row[2]))

    def path_rows(self) -> list[tuple[object, ...]]:
        return self._all(q.S.SELECT_PATHS)

    def pin_rows(self) -> list[tuple[object, ...]]:
        return self._all(q.S.SELECT_PINS)

    def manifest_rows(self) -> list[tuple[object, ...]]:
        return self._all(q.S.SELECT_MANIFESTS)

    def entry_rows(self) -> list[EntryRow]:
        return list(map(make_entry_row, self._all(q.S.SELECT_ENTRIES)))

    def meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = %s", (key,))
        return None if row is None else row[0]

    def meta_all(self) -> dict[str, object]:
        return dict(self._all("SELECT key, value FROM meta"))  # type: ignore[arg-type]

    # -- blobs: the inline row, else the blob's chunk rows ------------------------------

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        row = self._one(q.S.INLINE_SIZE, (digest,))
        if row is not None:
            return int(row[0]), True
        row = self._one("SELECT size FROM blob_files WHERE digest = %s", (digest,))
        return None if row is None else (int(row[0]), False)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        from ..inline import check_blob
        check_blob(self, self._store.files, digest, size, hash_file=hash_file)

    def inline_blob(self, digest: str) -> tuple[int, bytes] | None:
        row = self._one(q.S.INLINE_BLOB, (digest,))
        return None if row is None else (row[0], row[1])

    def inline_stat(self, digest: str) -> BlobStat | None:
        row = self._one(q.S.INLINE_STAT, (digest,))
        return None if row is None else BlobStat(digest, int(row[0]), True, int(row[1]))

    def inline_blobs(self) -> Iterator[BlobStat]:
        return iter([BlobStat(d, n, True, t) for d, n, t in self._all(q.S.INLINE_ALL)])

    # -- what GC and audit read ---------------------------------------------------------

    def pin_holds(self, digest: str | None = None) -> list[PinHold]:
        if digest is None:
            return list(map(make_pin_hold, self._all(q.S.PIN_HOLDS)))
        return list(map(make_pin_hold, self._all(q.S.PIN_HOLDS_OF, (digest,))))

    def manifest_digests(self) -> set[str]:
        return {r[0] for r in self._all(q.S.MANIFEST_DIGESTS)}

    def names_digest(self, digest: str) -> bool:
        return self._one(q.S.NAMES_DIGEST, (digest,)) is not None

    def entries_naming(self, digest: str, limit: int) -> list[tuple[str, int, str]]:
        return self._all(q.S.ENTRIES_NAMING, (digest, limit))  # type: ignore[return-value]

    def live_entries(self) -> list[tuple[str, int]]:
        return self._all(q.S.LIVE_ENTRIES)  # type: ignore[return-value]

    def event_totals(self, bucket_ns: int) -> tuple[list[tuple[str, str, int, int, int, int]],
                                                     list[tuple[int, int, int]]]:
        by_run = [(str(r), str(k), int(n), int(b), int(t0), int(t1))
                  for r, k, n, b, t0, t1 in self._all(q.S.TOTALS_BY_RUN)]
        by_time = [(int(t), int(n), int(b)) for t, n, b in
                   self._all(q.TOTALS_BY_TIME, (bucket_ns, bucket_ns))]
        return by_run, by_time

    def live_step_count(self) -> int:
        return int(self._one(q.S.LIVE_STEPS)[0])  # type: ignore[index]

    def step_totals(self, states: frozenset[str]) -> tuple[int, int]:
        n, b = self._one(q.S.STEP_TOTALS, (sorted(states),))  # type: ignore[misc]
        return int(n), int(b)

    def condemned(self) -> dict[str, tuple[int, bool]]:
        return {d: (int(n), bool(i)) for d, n, i in self._all(q.S.SELECT_CONDEMNED)}

    def condemned_entry(self, digest: str) -> tuple[int, bool] | None:
        row = self._one(q.S.SELECT_ONE_CONDEMNED, (digest,))
        return None if row is None else (int(row[0]), bool(row[1]))

    def condemned_count(self) -> int:
        return int(self._one(q.S.COUNT_CONDEMNED)[0])  # type: ignore[index]

    # -- what verify reads -------------------------------------------------------------

    def integrity_problems(self) -> list[str]:
        """The blob pointer rows whose chunks do not add up (PostgreSQL checks its own
        pages; what it cannot see is a pointer row that lies)."""
        rows = self._all(
            "SELECT f.digest, f.size, f.chunks, count(c.n), coalesce(sum(octet_length(c.data)), 0)"
            " FROM blob_files f LEFT JOIN blob_chunks c ON c.digest = f.digest"
            " GROUP BY f.digest, f.size, f.chunks"
            " HAVING count(c.n) <> f.chunks OR coalesce(sum(octet_length(c.data)), 0) <> f.size"
            " ORDER BY f.digest LIMIT 20")
        return [f"blob {d}: its pointer row says {n} bytes in {k} chunks, {got_k} chunks"
                f" of {got_n} bytes are stored" for d, n, k, got_k, got_n in rows]

    def checkpoint_rows(self) -> list[tuple[object, object, object]]:
        return self._all(q.S.CHECKPOINT_ROWS)  # type: ignore[return-value]

    def inline_row_problems(self, limit: int) -> list[tuple[object, object, object]]:
        return self._all(q.S.INLINE_ROW_PROBLEMS, (limit,))  # type: ignore[return-value]

    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        """Every row of a `COPY_TABLES` table, in its columns' order, streamed through a
        server-side cursor (call inside `read()`: one snapshot)."""
        columns = COPY_TABLES[table]
        order = " ORDER BY seq" if table == "events" else ""
        store = self._store
        conn = store._connect()
        with store._translated(), conn.cursor(name=f"copy_{table}") as cur:
            cur.itersize = READ_BATCH
            cur.execute(f"SELECT {', '.join(columns)} FROM {table}{order}")
            yield from cur

    def scratch(self) -> contextlib.AbstractContextManager[Any]:
        from .scratch import scratch
        return scratch(self._store)


#: `store.view`: each read outside a transaction holds the store's lock.
_LockedView = locked_view(PgView, "The store's view outside a transaction (locked reads).")


class PgTx(PgView, TxBase):
    """A write transaction holding the ledger's chain lock (see the module docstring)."""

    def __init__(self, store: PgStore, scope: Scope) -> None:
        self._store = store
        self.scope = scope
        self._time_ns: int | None = None

    def __enter__(self) -> PgTx:
        store = self._store
        if store.readonly:
            raise ReadOnlyLedger(store.location)
        store.lock.acquire()
        try:
            store._begin(write=True, scope=self.scope)
        except BaseException:
            store.lock.release()
            raise
        store.lock.writes += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        store = self._store
        try:
            if exc_type is None:
                if store.on_op is not None:
                    store.on_op("commit")
                store._end(commit=True)
            else:
                store._end(commit=False)
        finally:
            store.lock.writes -= 1
            store.lock.release()

    @property
    def time_ns(self) -> int:
        if self._time_ns is None:
            store = self._store
            self._time_ns = (store.injected_clock() if store.injected_clock is not None
                             else store._tx_time_ns or store.now_ns())
        return self._time_ns

    # -- the chain lock: taken before anything reads the head or writes shared rows -------

    def head(self) -> Head:
        self._store._chain()
        return PgView.head(self)

    def append(self, prepared: Any, **kwargs: Any) -> Any:
        self._store._chain()
        return TxBase.append(self, prepared, **kwargs)

    # -- TxBase's primitives -------------------------------------------------------------

    def _insert_many(self, rows: list[EventRow]) -> None:
        psycopg = _psycopg()
        try:
            self._store._run_many(q.S.INSERT_EVENT, rows)
        except psycopg.errors.UniqueViolation as exc:  # (`_translated` lets it through)
            raise DuplicateKey(exc) from None

    def _insert_one(self, row: EventRow) -> None:
        cur = self._store._run(q.INSERT_EVENT_OR_NOTHING, row)
        if cur.rowcount != 1:
            raise DuplicateKey()

    def _savepoint(self) -> None:
        self._store._run("SAVEPOINT append_batch")

    def _rollback_savepoint(self) -> None:
        self._store._run("ROLLBACK TO SAVEPOINT append_batch")

    def _release_savepoint(self) -> None:
        self._store._run("RELEASE SAVEPOINT append_batch")

    def _open_part(self) -> None:
        self._store._run("SAVEPOINT group_part")

    def _undo_part(self) -> None:
        self._store._run("ROLLBACK TO SAVEPOINT group_part")
        self._store._run("RELEASE SAVEPOINT group_part")

    def _close_part(self) -> None:
        self._store._run("RELEASE SAVEPOINT group_part")

    def _intact(self, exc: BaseException) -> bool:
        # A refusal of ours leaves the transaction as it was; a driver error (a lost
        # connection, a statement the server refused) ends the group.
        psycopg = _psycopg()
        if isinstance(exc, (psycopg.Error, DatabaseUnavailable, StorageFailure)):
            return False
        conn = self._store._conn
        return conn is not None and not conn.broken and \
            conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS

    # -- other writes ------------------------------------------------------------------

    def put_inline(self, blobs: Mapping[str, bytes], stored_ns: int) -> None:
        self._store._chain()
        for digest, data in blobs.items():
            # one upsert; the data column is rewritten only when its bytes differ (an
            # intact row keeps its stored value: no new TOAST copy of the same bytes)
            self._store._run(q.INLINE_UPSERT, (digest, len(data), data, stored_ns))
            self._wrote_inline(digest, data)

    def delete_inline(self, digest: str) -> None:
        self._store._chain()
        self._unwrote(digest)
        self._store._run(q.S.INLINE_DELETE, (digest,))

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        size = self._wrote_size(digest)
        return (size, True) if size is not None else PgView.blob_size(self, digest)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        if self._wrote_size(digest) != size:
            PgView.check_blob(self, digest, size, hash_file=hash_file)

    def set_meta(self, key: str, value: str) -> None:
        self._store._chain()
        self._store._run("INSERT INTO meta(key, value) VALUES (%s, %s)"
                         " ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def write_projection(self, changes: ProjectionChanges) -> None:
        """One transaction's inline projection changes (`Statements.projection_writes`)."""
        self._store._chain()
        for sql, rows in q.S.projection_writes(changes, CHECKPOINT_NAME):
            self._store._run_many(sql, rows)

    def rebuild_projections(self) -> contextlib.AbstractContextManager[Any]:
        self._store._chain()
        from .scratch import rebuilding
        return rebuilding(self._store)

    def condemn(self, rows: Sequence[tuple[str, int, bool]], condemned_ns: int,
                collection: str) -> None:
        self._store._chain()
        self._store._run_many(q.S.CONDEMN, [(d, n, int(i), condemned_ns, collection)
                                          for d, n, i in rows])

    def uncondemn(self, digests: Iterable[str]) -> None:
        self._store._chain()
        self._store._run_many(q.S.UNCONDEMN, [(d,) for d in digests])

    def load_rows(self, table: str, rows: Sequence[tuple[object, ...]]) -> None:
        self._store._chain()
        columns = COPY_TABLES[table]
        if rows:
            self._store._run_many(f"INSERT INTO {table}({', '.join(columns)}) VALUES"
                                  f" ({', '.join(['%s'] * len(columns))})", rows)

    def seal_rows(self, run: str, ranges: Sequence[tuple[int, int]], seal_seq: int) -> int:
        self._store._chain()
        self._store._run_many(q.S.ADD_SEALED_RANGE, [(a, b, run, seal_seq) for a, b in ranges])
        removed = 0
        for a, b in ranges:
            removed += self._store._run(q.S.DELETE_SEALED, (a, b, run)).rowcount
        return removed


class PgStore:
    """A ledger in a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, clock: Callable[[], int] | None = None,
                 readonly: bool = False, forensic: bool = False,
                 on_op: Callable[[str], None] | None = None,
                 busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.url = url
        #: How long a writer waits for another's lock before LedgerBusy (as on SQLite).
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.location = shown_location(url)
        self.injected_clock = clock
        self.readonly = readonly
        self.forensic = forensic
        self.on_op = on_op
        self.lock = StoreLock()
        self._conn: Any = None
        self._depth = 0  # open transactions of this connection (read or write)
        self._writing = False
        self._genesis: bytes | None = None
        self.version = sch.SCHEMA_VERSION
        self.schema_changes: tuple[str, ...] = ()
        self._schema = ""
        self._chain_key = 0
        self._ledger_key = 0
        self._chained = False
        self._pulsed = 0.0
        self._tx_time_ns = 0
        self._gc_key = 0
        self.view: PgView = _LockedView(self)
        from .blobs import PgBlobs, PgFiles
        #: Blob bytes: the inline rows, else the chunk rows (`PgFiles`).
        self.files = PgFiles(self)
        self.blobs = PgBlobs(self)
        self._held: dict[str, Any] = {}

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, clock: Callable[[], int] | None = None, readonly: bool = False,
             forensic: bool = False, on_op: Callable[[str], None] | None = None,
             busy_timeout_ms: int = 30_000) -> PgStore:
        """Open the ledger at `url`: LedgerNotFound if the database holds none,
        NotALedger / LedgerTooNew as the SQLite store (nothing is written to a database
        that is refused)."""
        store = cls(url, clock=clock, readonly=readonly, forensic=forensic, on_op=on_op,
                    busy_timeout_ms=busy_timeout_ms)
        try:
            with store.lock:
                conn = store._connect()
                version = sch.read_marker(conn, store.location)
                if version is None:
                    raise LedgerNotFound(store.location)
                store._judge(conn, version)
        except BaseException:
            store.close(refused=True)
            raise
        return store

    @classmethod
    def create(cls, url: str, *, clock: Callable[[], int] | None = None,
               on_op: Callable[[str], None] | None = None,
               busy_timeout_ms: int = 30_000) -> tuple[PgStore, bool]:
        """Create the ledger's tables in the database at `url` (one transaction, under a
        lock, so that two concurrent inits make one ledger), or open the one there; and
        whether it was created."""
        import uuid
        store = cls(url, clock=clock, on_op=on_op, busy_timeout_ms=busy_timeout_ms)
        try:
            with store.lock:
                conn = store._connect()
                version = sch.read_marker(conn, store.location)
                created = False
                if version is None:
                    with store._translated():
                        conn.execute("BEGIN")
                        try:
                            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                                         (LOCK_CLASS, _lock_key("init:" + store._schema)))
                            if sch.read_marker(conn, store.location) is None:
                                for stmt in sch.create_statements():
                                    conn.execute(stmt)
                                conn.execute(
                                    "INSERT INTO meta(key, value) VALUES ('ledger_id', %s),"
                                    " ('created_ns', ((extract(epoch FROM clock_timestamp())"
                                    " * 1000000)::bigint * 1000)::text)", (uuid.uuid4().hex,))
                                created = True
                            conn.execute("COMMIT")
                        except BaseException:
                            if not conn.broken:
                                conn.execute("ROLLBACK")
                            raise
                    version = sch.read_marker(conn, store.location)
                store._judge(conn, version)  # type: ignore[arg-type]
        except BaseException:
            store.close(refused=True)
            raise
        return store, created

    def _judge(self, conn: Any, version: int) -> None:
        if version < sch.SCHEMA_VERSION and not self.readonly:  # an older ledger: migrated
            try:
                with self._translated():
                    version = sch.migrate(conn, version,
                                          (LOCK_CLASS, _lock_key("init:" + self._schema)))
            except AccessDenied:
                pass  # a worker's role may not replace the owner's function: the owner's
                # next open does; v4's tables are v5's, so the worker goes on meanwhile
        self.version = version
        readable = version in (4, sch.SCHEMA_VERSION)  # (v4: the same tables)
        if not readable:
            raise LedgerTooNew(self.location, version, sch.SCHEMA_VERSION) \
                if version > sch.SCHEMA_VERSION else _too_old(self.location, version)
        self.schema_changes = sch.check_schema(conn, self.location, forensic=self.forensic,
                                               version=version)
        ledger_id = self.view.meta("ledger_id")
        if not isinstance(ledger_id, str) or not ledger_id:
            raise CorruptLedger(self.location, "meta has no ledger_id (the chain's genesis)")

    def _connect(self) -> Any:
        psycopg = _psycopg()
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        if self._depth:
            raise DatabaseUnavailable(self.location, "the connection was lost inside a"
                                      " transaction, which did not commit", reading=self.readonly)
        check_url(self.url)  # libpq would read part of a password as the host
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name="steptrail", **KEEPALIVES)
        except psycopg.ProgrammingError as exc:
            raise InvalidInput(f"{self.location} is not a usable PostgreSQL URL: "
                               f"{without_secrets(_first_line(exc), self.url)}"
                               ) from None
        except psycopg.OperationalError as exc:
            msg = without_secrets(_first_line(exc), self.url)
            if "password authentication failed" in msg or "permission denied" in msg \
                    or "role" in msg and "does not exist" in msg:
                raise AccessDenied(self.location, msg, "check the user and password in the"
                                   " URL", readers_work=False) from None
            if "database" in msg and "does not exist" in msg:
                # no database to hold a ledger: init cannot make one (a server's
                # databases are its operator's), so say how
                try:
                    name = psycopg.conninfo.conninfo_to_dict(self.url).get("dbname") or "NAME"
                except Exception:  # (the URL was accepted by connect: a name is there)
                    name = "NAME"
                fact = (f"the database {name!r} does not exist on the server of"
                        f" {self.location}; create it first (createdb {name}, or in psql:"
                        f" CREATE DATABASE \"{name}\" ENCODING 'UTF8'), then")
                raise LedgerNotFound(self.location, f"{fact} Ledger.init(URL)").at_a_shell(
                    f"{fact} 'steptrail --ledger {self.location} init'") from None
            raise DatabaseUnavailable(self.location, msg, reading=self.readonly) from None
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"{self.location} is not a usable PostgreSQL URL: "
                               f"{without_secrets(str(exc), self.url)}") from None
        try:
            enc = conn.execute("SHOW server_encoding").fetchone()[0]
            if enc.upper() not in ("UTF8", "UTF-8"):
                conn.close()
                raise InvalidInput(f"the database at {self.location} uses encoding {enc}; a"
                                   " ledger needs UTF8 (CREATE DATABASE ... ENCODING 'UTF8')")
            schema = conn.execute("SELECT current_schema()").fetchone()[0]
            conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(self.location, _first_line(exc), reading=self.readonly) from None
        self._schema = schema or ""
        self._chain_key = _lock_key("chain:" + self._schema)
        self._ledger_key = _lock_key("ledger:" + self._schema)
        self._gc_key = _lock_key("gc:" + self._schema)
        self._conn = conn
        return conn

    # -- running statements --------------------------------------------------------------

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        psycopg = _psycopg()
        try:
            yield
        except psycopg.errors.UniqueViolation:
            raise
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            raise LedgerBusy(self.location, self.busy_timeout_ms / 1000) from None
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(self.location, _first_line(exc), reading=self.readonly) from None
        except psycopg.errors.IdleInTransactionSessionTimeout as exc:
            raise DatabaseUnavailable(self.location, _first_line(exc), reading=self.readonly) from None
        except psycopg.errors.ReadOnlySqlTransaction:
            raise ReadOnlyLedger(self.location) from None
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.errors.InsufficientPrivilege):
                if "append-only" in str(exc):
                    raise CorruptLedger(self.location, _first_line(exc)) from None
                raise AccessDenied(self.location, _first_line(exc), "grant this role what"
                                   " docs/operations.md \"A ledger on PostgreSQL\" lists, or"
                                   " use the role that owns the ledger") from None
            raise StorageFailure(self.location, f"{type(exc).__name__}: {_first_line(exc)}") \
                from None

    def _run(self, sql: str, params: Sequence[object] | None = None, *, raw: bool = False) -> Any:
        """Execute one statement on the connection (reconnecting outside a transaction)."""
        conn = self._connect()
        if raw:
            return conn.execute(sql, params)
        with self._translated():
            return conn.execute(sql, params)

    def _run_many(self, sql: str, rows: Sequence[Sequence[object]], *, raw: bool = False) -> None:
        """Execute `sql` for each of `rows`: as few multi-row statements as
        `many_rows` makes of it (chunks of at most PARAMS_MAX parameters), else one
        statement a row. Never the driver's executemany: it runs in pipeline mode, and a
        writer frozen right after one was never ended by the server's idle bound — the
        fleet waited on its locks (tests/test_postgres_frozen.py, the chain stage)."""
        conn = self._connect()
        width = len(rows[0]) if rows else 1
        step = max(1, PARAMS_MAX // max(1, width))
        multi = len(rows) > 1 and many_rows(sql, min(len(rows), step), "%s") is not None
        with contextlib.nullcontext() if raw else self._translated(), conn.cursor() as cur:
            if not multi:
                for row in rows:
                    cur.execute(sql, row)
                return
            for i in range(0, len(rows), step):
                chunk = rows[i:i + step]
                cur.execute(many_rows(sql, len(chunk), "%s"),  # type: ignore[arg-type]
                            [cell for row in chunk for cell in row])

    def _begin(self, *, write: bool, scope: Scope = Scope()) -> None:
        """BEGIN, and the scope's locks (docs/design.md "Many writers"): a transaction of
        one workspace holds the ledger lock shared and the workspace's lock, so those of
        different workspaces run at once; one of the whole ledger (GC, a registration, a
        seal, a rebuild) holds the ledger lock alone. The chain lock comes later
        (`_chain`), when the transaction first reads the head or writes a shared row."""
        if self._depth:
            if write and not self._writing:
                raise RuntimeError("a write transaction inside a read transaction")
            self._depth += 1
            if write:
                self._chain()  # a nested append: the rest of the transaction in chain order
            return
        conn = self._connect()
        with self._translated():
            if write:
                # One round trip: BEGIN, the lock timeout, the scope's locks and the
                # server's time once they are held (the transaction's time: read after
                # the workspace's lock, so one workspace's times follow its commits).
                if scope.workspace is None:
                    self._depth, self._writing, self._chained = 1, True, False
                    try:
                        self._take_ledger_exclusively(conn)
                    except BaseException:
                        self._abort()
                        raise
                    locks = f"pg_advisory_xact_lock({LOCK_CLASS}, {self._chain_key})"
                else:
                    ws_key = _lock_key(f"workspace:{self._schema}:{scope.workspace}")
                    locks = (f"pg_advisory_xact_lock_shared({LOCK_CLASS}, {self._ledger_key}),"
                             f" pg_advisory_xact_lock({LOCK_CLASS_WS}, {ws_key})")
                self._depth, self._writing, self._chained = 1, True, False
                try:
                    # The idle bound: a writer that stops (SIGSTOP, a frozen VM, a cut
                    # network) is ended by the server and its locks freed; a builder at
                    # work proves it is alive (`_pulse`, and a round trip before each
                    # rename or unlink) and stops when the server has ended it.
                    begun = "" if scope.workspace is None else (
                        "BEGIN ISOLATION LEVEL READ COMMITTED;"
                        f" SET LOCAL lock_timeout = {max(1, int(self.busy_timeout_ms))};")
                    idle = CHAIN_IDLE_MS if scope.workspace is None else WRITE_IDLE_MS
                    cur = conn.execute(
                        begun + f" SET LOCAL idle_in_transaction_session_timeout = {idle};"
                        f" SELECT {locks}, {_NOW_NS}")
                    while cur.nextset():
                        pass
                    self._tx_time_ns = int(cur.fetchone()[-1])
                except BaseException:
                    self._abort()
                    raise
                self._pulsed = 0.0
                pulse_with(self._pulse)
                self._chained = scope.workspace is None
            else:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                self._depth, self._writing = 1, False

    def _take_ledger_exclusively(self, conn: Any) -> None:
        """BEGIN a whole-ledger transaction and take the ledger lock exclusively: asked
        without queuing for up to `EXCLUSIVE_POLL_MS` (workspace transactions arriving
        meanwhile are not held up behind this request), then queued for the rest of the
        busy timeout."""
        import time
        timeout_ms = max(1, int(self.busy_timeout_ms))
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED;"
                     f" SET LOCAL lock_timeout = {timeout_ms};"
                     f" SET LOCAL idle_in_transaction_session_timeout = {WRITE_IDLE_MS}")
        start = time.monotonic()
        poll_s = min(EXCLUSIVE_POLL_MS, timeout_ms) / 1000
        nap = 0.002
        while True:
            got = conn.execute(f"SELECT pg_try_advisory_xact_lock({LOCK_CLASS},"
                               f" {self._ledger_key})").fetchone()[0]
            if got:
                return
            waited = time.monotonic() - start
            if waited >= poll_s:
                break
            time.sleep(min(nap, poll_s - waited))
            nap = min(nap * 2, 0.1)
        rest = max(1, timeout_ms - int((time.monotonic() - start) * 1000))
        conn.execute(f"SET LOCAL lock_timeout = {rest};"
                     f" SELECT pg_advisory_xact_lock({LOCK_CLASS}, {self._ledger_key})")

    def _pulse(self) -> None:
        """During a builder's long file work (every chunk read, see `blobs.fd_chunks`): a
        round trip at most once a `PULSE_S`, so the server's idle bound ends only a writer
        that stopped — and this one stops (DatabaseUnavailable) once it was ended."""
        import time
        now = time.monotonic()
        if self._writing and now - self._pulsed >= PULSE_S:
            self._pulsed = now
            self._alive()

    def _alive(self) -> None:
        """A round trip inside the write transaction: DatabaseUnavailable if the server
        ended it (its locks are gone)."""
        conn = self._conn
        if conn is None or conn.broken or conn.closed:
            raise DatabaseUnavailable(self.location, "the connection was lost inside a"
                                      " transaction, which did not commit", reading=self.readonly)
        with self._translated():
            conn.execute("SELECT 1")

    def _chain(self) -> None:
        """Take the chain lock (once per transaction): from here to COMMIT, this
        transaction is the one appending after the head."""
        if self._chained or not self._writing:
            return
        with self._translated():
            cur = self._connect().execute(
                f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, {self._chain_key});"
                f" SET LOCAL idle_in_transaction_session_timeout = {CHAIN_IDLE_MS}")
            while cur.nextset():
                pass
        self._chained = True

    def _end(self, *, commit: bool) -> None:
        self._depth -= 1
        if self._depth:
            return
        if self._writing:
            pulse_with(None)
        self._writing = self._chained = False
        conn = self._conn
        if not commit:
            self._abort()
            return
        psycopg = _psycopg()
        try:
            conn.execute("COMMIT")
        except psycopg.errors.IdleInTransactionSessionTimeout:
            raise DatabaseUnavailable(self.location, "the server ended this write transaction,"
                                      " silent past its idle bound, before its COMMIT (nothing"
                                      " of it committed); retry", reading=self.readonly) from None
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(self.location, "the connection was lost at COMMIT (the"
                                      " transaction may or may not have committed): "
                                      + _first_line(exc), reading=self.readonly) from None
        except psycopg.Error as exc:
            self._abort()
            raise StorageFailure(self.location, f"COMMIT failed: {_first_line(exc)}") from None

    def _abort(self) -> None:
        if self._writing:
            pulse_with(None)
        self._depth, self._writing, self._chained = 0, False, False
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")

    def now_ns(self) -> int:
        """The time as the database server has it (or the injected clock's)."""
        if self.injected_clock is not None:
            return self.injected_clock()
        with self.lock:
            return int(self._run(f"SELECT {_NOW_NS}").fetchone()[0])

    # -- the Store interface -------------------------------------------------------------

    @property
    def clock(self) -> Callable[[], int]:
        return self.now_ns

    @property
    def info(self) -> StoreInfo:
        return StoreInfo(location=self.location, version=self.version, readonly=self.readonly,
                         forensic=self.forensic, schema_changes=self.schema_changes)

    @property
    def genesis(self) -> bytes:
        if self._genesis is None:
            ledger_id = self.view.meta("ledger_id")
            if ledger_id is None:
                raise CorruptLedger(self.location, "meta has no ledger_id")
            self._genesis = genesis_hash(ledger_id)
        return self._genesis

    @contextlib.contextmanager
    def read(self) -> Iterator[PgView]:
        """A read transaction: every read inside sees one snapshot (inside a write
        transaction: the transaction's own)."""
        with self.lock:
            self._begin(write=False)
            self.lock.reads += 1
            try:
                yield self.view
            except BaseException:
                self._end(commit=False)
                raise
            finally:
                self.lock.reads -= 1
            self._end(commit=True)

    def held_here(self) -> bool:
        """Whether this thread holds the store's lock (inside a transaction, a read, or
        any section it locked)."""
        return self.lock.owned()

    def reading_here(self) -> bool:
        """Whether this thread is inside a read transaction of the store and no write
        transaction: an append there cannot commit."""
        return self.lock.reading_only()

    def transaction(self, scope: Scope = Scope()) -> PgTx:
        return PgTx(self, scope)

    def generation(self) -> object:
        """Always new: other machines commit without telling this process, and no cheap
        exact signal says they did, so the log re-reads the head inside each transaction
        (under the chain lock, where it is exact)."""
        return object()

    @contextlib.contextmanager
    def exclusive(self, name: str, *, wait: bool = False) -> Iterator[None]:
        """Hold lock `name` (a session advisory lock on a connection of its own, so it
        is held however the store's connection is used) for the block; Held when another
        session holds it and not `wait`."""
        psycopg = _psycopg()
        key = _lock_key(f"{name}:{self._schema}")
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name=f"steptrail {name} lock")
        except psycopg.Error as exc:
            raise DatabaseUnavailable(self.location, _first_line(exc), reading=self.readonly) from None
        try:
            if wait:
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, key))
            elif not conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                  (LOCK_CLASS, key)).fetchone()[0]:
                raise Held(name, f"advisory lock {name!r} of {self.location}")
            yield
        finally:
            with contextlib.suppress(Exception):
                conn.close()  # the session's advisory locks go with it

    def held_elsewhere(self, name: str) -> bool:
        key = _lock_key(f"{name}:{self._schema}")
        with self.lock:
            row = self._run(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid"
                " AND objid = %s::oid AND granted AND pid <> pg_backend_pid()",
                (LOCK_CLASS & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
        return bool(row[0])

    def snapshot(self, path: str) -> None:
        """A consistent copy of the whole ledger into a new SQLite file at `path` (one
        REPEATABLE READ snapshot): what `backup` keeps."""
        from ..transfer import snapshot_to_sqlite
        snapshot_to_sqlite(self, path)

    def __del__(self) -> None:
        # A ledger dropped without close(): its connections go with it, quietly (the
        # server rolls back whatever it had not committed).
        with contextlib.suppress(Exception):
            if self._conn is not None:
                self._conn.close()
            self.files.close()

    def close(self, *, refused: bool = False) -> None:
        with self.lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            self.files.close()


def _too_old(location: str, version: int) -> LedgerError:
    from ...errors import NotALedger
    return NotALedger(location, f"it records schema version {version}; this steptrail"
                      f" makes and reads v{sch.SCHEMA_VERSION} PostgreSQL ledgers")


__all__ = ["PgStore", "PgTx", "PgView", "SCHEMES", "is_url", "shown_location"]

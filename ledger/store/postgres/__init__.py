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
from collections.abc import Callable, Iterator, Sequence
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
from .. import (
    BUSY_TIMEOUT_MS,
    COPY_TABLES,
    DuplicateKey,
    EventRow,
    Head,
    Held,
    RowsUnreadable,
    Scope,
    StoreInfo,
    make_event_row,
)
from ..lock import StoreLock
from ..base import TxBase, locked_view, row_problem
from ..view import READ_BATCH, SqlTx, SqlView
from . import schema as sch
from .driver import PgDriver, _first_line, _psycopg
from .location import SCHEMES, check_url, is_url, shown_location, without_secrets
from . import sql as q
from ..sql import many_rows

#: The most parameters one multi-row statement carries (the protocol's limit: 65,535).
PARAMS_MAX: Final = PgDriver.params_max
#: The advisory lock class of every steptrail lock ('STLG' as a signed 32-bit int).
LOCK_CLASS: Final = 0x53544C47
#: The advisory lock class of the workspaces' locks: a class of their own, so that no
#: workspace name (its key a crc32 anyone can aim) can take the ledger's, the chain's or
#: the collector's lock; two workspaces whose keys collide only take turns.
LOCK_CLASS_WS: Final = 0x53544C48
#: How long a connection attempt may take.
CONNECT_TIMEOUT_S: Final = 10
#: The most text the held writes (`PgStore._defer`) carry before they go on their own:
#: a transaction of many inline blobs and no read sends them in messages of this size,
#: not one message of all of them (the server takes at most 1 GB in one).
PENDING_MAX: Final = 4 << 20
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


class PgView(SqlView):
    """Reads of the store's connection (inside `read()`: one snapshot): the shared reads
    (`ledger.store.view.SqlView`) over `PgDriver`, and PostgreSQL's own — verify's
    checked read, the blob pointer rows' check, a table streamed through a server-side
    cursor, the scratch tables."""

    S = q.S
    JOURNAL_RANGE = q.JOURNAL_RANGE

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self._q = store.driver

    def _totals_by_time(self, bucket_ns: int) -> tuple[str, Sequence[object]]:
        return q.TOTALS_BY_TIME, (bucket_ns, bucket_ns)

    def _file_size(self, digest: str) -> int | None:
        # in this view's snapshot (the blob store reads on its own connection)
        row = self._q.one("SELECT size FROM blob_files WHERE digest = %s", (digest,))
        return None if row is None else int(row[0])

    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]:
        """Every row after `after_seq` with what is wrong with its cells (the columns'
        types make most damage impossible here; None: nothing)."""
        last = after_seq
        while True:
            try:
                got = self._q.all(q.S.CHECKED, (last, READ_BATCH))
            except LedgerError as exc:
                raise RowsUnreadable(str(exc)) from None
            for r in got:
                yield make_event_row(r), row_problem(r)
            if len(got) < READ_BATCH:
                return
            last = got[-1][0]

    def integrity_problems(self) -> list[str]:
        """The blob pointer rows whose chunks do not add up (PostgreSQL checks its own
        pages; what it cannot see is a pointer row that lies)."""
        rows = self._q.all(
            "SELECT f.digest, f.size, f.chunks, count(c.n), coalesce(sum(octet_length(c.data)), 0)"
            " FROM blob_files f LEFT JOIN blob_chunks c ON c.digest = f.digest"
            " GROUP BY f.digest, f.size, f.chunks"
            " HAVING count(c.n) <> f.chunks OR coalesce(sum(octet_length(c.data)), 0) <> f.size"
            " ORDER BY f.digest LIMIT 20")
        return [f"blob {d}: its pointer row says {n} bytes in {k} chunks, {got_k} chunks"
                f" of {got_n} bytes are stored" for d, n, k, got_k, got_n in rows]

    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        """Every row of a `COPY_TABLES` table, in its columns' order, streamed through a
        server-side cursor (call inside `read()`: one snapshot)."""
        columns = COPY_TABLES[table]
        order = " ORDER BY seq" if table == "events" else ""
        store = self._store
        if store._pending:
            store._run("SELECT 1")  # the held writes first: a read sees them
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


class PgTx(PgView, SqlTx):
    """A write transaction holding the ledger's chain lock (see the module docstring):
    the shared writes (`ledger.store.view.SqlTx`), each after the chain lock
    (`_before_write`), and PostgreSQL's event inserts."""

    def __init__(self, store: PgStore, scope: Scope) -> None:
        self._store, self._q = store, store.driver
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

    def _before_write(self) -> None:
        self._store._chain(held=True)  # sent with the write, before it

    def head(self) -> Head:
        self._store._chain()
        return PgView.head(self)

    def append(self, prepared: Any, **kwargs: Any) -> Any:
        self._store._chain()
        return TxBase.append(self, prepared, **kwargs)

    # -- TxBase's primitives -------------------------------------------------------------

    def _insert_many(self, rows: list[EventRow]) -> None:
        psycopg = _psycopg()
        store = self._store
        try:
            store._run_many(q.S.INSERT_EVENT, rows, duplicate=True)
        except psycopg.errors.UniqueViolation as exc:  # (`_translated` lets it through)
            if exc.diag.table_name not in (None, "events"):  # a held write's, not ours
                raise StorageFailure(store.location, f"{type(exc).__name__}:"
                                     f" {_first_line(exc)}") from None
            raise DuplicateKey(exc) from None

    def _insert_one(self, row: EventRow) -> None:
        cur = self._store._run(q.INSERT_EVENT_OR_NOTHING, row)
        if cur.rowcount != 1:
            raise DuplicateKey()

    def _intact(self, exc: BaseException) -> bool:
        # A refusal of ours leaves the transaction as it was; a driver error (a lost
        # connection, a statement the server refused) ends the group.
        psycopg = _psycopg()
        if isinstance(exc, (psycopg.Error, DatabaseUnavailable, StorageFailure)):
            return False
        conn = self._store._conn
        return conn is not None and not conn.broken and \
            conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS

    @property
    def _inline_upsert(self) -> str:
        # the data column rewritten only when its bytes differ (an intact row keeps its
        # stored value: no new TOAST copy of the same bytes)
        return q.INLINE_UPSERT

    def rebuild_projections(self) -> contextlib.AbstractContextManager[Any]:
        self._store._chain()
        from .scratch import rebuilding
        return rebuilding(self._store)


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
        #: The statements' way to the connection (`ledger.store.view.Driver`).
        self.driver = PgDriver(self)
        self.view: PgView = _LockedView(self)
        from .blobs import PgBlobs, PgFiles
        #: Blob bytes: the inline rows, else the chunk rows (`PgFiles`).
        self.files = PgFiles(self)
        self.blobs = PgBlobs(self)
        self._held: dict[str, Any] = {}
        #: Writes held for the next statement this write transaction sends (`_defer`),
        #: their parameters bound as literals.
        self._pending: list[str] = []
        self._pending_size = 0
        self._held_since = 0.0
        self._binder: Any = None

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
            with store.lock, store._translated():  # (a server lost mid-check: unavailable)
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
            with store.lock, store._translated():
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
        denied = False
        if version < sch.SCHEMA_VERSION and not self.readonly:  # an older ledger: migrated
            try:
                with self._translated():
                    version = sch.migrate(conn, version,
                                          (LOCK_CLASS, _lock_key("init:" + self._schema)))
            except AccessDenied:
                denied = True  # a worker's role may not change the owner's schema
        self.version = version
        readable = version in sch.READABLE  # (the same tables)
        if not readable:
            raise LedgerTooNew(self.location, version, sch.SCHEMA_VERSION) \
                if version > sch.SCHEMA_VERSION else _too_old(self.location, version)
        self.schema_changes = sch.check_schema(conn, self.location, forensic=self.forensic,
                                               version=version)
        if version < sch.SCHEMA_VERSION and not self.readonly:
            # Never written as it is: today's writers do not rewrite the checkpoint each
            # commit, so an unmigrated ledger's tables would read as lagging behind
            # events they already hold.
            raise AccessDenied(
                self.location, f"it is in format v{version}, which this steptrail reads but"
                f" writes only once migrated to v{sch.SCHEMA_VERSION}"
                + (", and this role may not change its schema" if denied else ""),
                "have the ledger's owner open it read-write once with this version (it"
                " migrates in one transaction; workers of older versions are refused from"
                " then on), then retry")
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
    def _translated(self, *, duplicate: bool = False) -> Iterator[None]:
        """The driver's errors as the ledger's. `duplicate`: a unique violation passes
        as it is (the event insert's: `PgTx._insert_many` answers it as a duplicate
        journal key); anywhere else it is a StorageFailure."""
        psycopg = _psycopg()
        try:
            yield
        except psycopg.errors.UniqueViolation as exc:
            if duplicate:
                raise
            raise StorageFailure(self.location, f"{type(exc).__name__}: {_first_line(exc)}") \
                from None
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

    def _run(self, sql: str, params: Sequence[object] | None = None, *, raw: bool = False,
             duplicate: bool = False) -> Any:
        """Execute one statement on the connection (reconnecting outside a transaction);
        the writes held for it (`_defer`) go first, in the same round trip."""
        conn = self._connect()
        with contextlib.nullcontext() if raw else self._translated(duplicate=duplicate):
            if not self._pending:
                return conn.execute(sql, params)
            cur = conn.execute(self._with_pending(self._bind(sql, params)))
            while cur.nextset():
                pass
            return cur

    # -- writes held for the next round trip ---------------------------------------------

    def _bind(self, sql: str, params: Sequence[object] | None) -> str:
        """`sql` with `params` as literals: psycopg's client-side binding, the text a
        simple query carries (several statements in one round trip)."""
        if not params:
            return sql
        binder = self._binder
        if binder is None or binder.connection is not self._conn:
            binder = self._binder = _psycopg().ClientCursor(self._conn)
        return binder.mogrify(sql, params)  # type: ignore[no-any-return]

    def _defer(self, sql: str, params: Sequence[object] | None = ()) -> None:
        """Hold a write nobody reads the answer of until the next statement this write
        transaction sends — a read, the event insert, the COMMIT — and send it in that
        statement's round trip (`_with_pending`). Its error, if any, then comes from that
        statement, which does not run, and the transaction does not commit (the server
        runs a simple query's statements in order and stops at the first error). Outside
        a write transaction it runs now. Not the driver's pipeline mode: a writer frozen
        between pipelined statements is not idle in its transaction, so the server's idle
        bound never ends it (see `_run_many`); held writes are only text in this process
        until they go, with a Sync, in one message."""
        if not (self._writing and self._depth) or self._conn is None:
            self._run(sql, params)
            return
        import time
        now = time.monotonic()
        with self._translated():
            text = self._bind(sql, params)
            if not self._pending:
                self._held_since = now
            self._pending.append(text)
            self._pending_size += len(text)
            # Held at most a `PULSE_S` (the session looks idle to the server meanwhile:
            # its idle bound must keep ending only a writer that stopped) and at most
            # `PENDING_MAX` of text.
            if self._pending_size > PENDING_MAX or now - self._held_since >= PULSE_S:
                self._conn.execute(self._with_pending("SELECT 1"))

    def _defer_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """`_run_many`'s statements, each held as `_defer` holds one."""
        if not rows:
            return
        if not (self._writing and self._depth):
            self._run_many(sql, rows)
            return
        width = len(rows[0])
        step = max(1, PARAMS_MAX // max(1, width))
        if len(rows) == 1 or many_rows(sql, min(len(rows), step), "%s") is None:
            for row in rows:
                self._defer(sql, row)
            return
        for i in range(0, len(rows), step):
            chunk = rows[i:i + step]
            self._defer(many_rows(sql, len(chunk), "%s"),  # type: ignore[arg-type]
                        [cell for row in chunk for cell in row])

    def _with_pending(self, sql: str) -> str:
        """`sql` after the held writes, which are let go (sent with it, or never)."""
        if not self._pending:
            return sql
        text = ";\n".join([*self._pending, sql])
        self._pending.clear()
        self._pending_size = 0
        return text

    def _run_many(self, sql: str, rows: Sequence[Sequence[object]], *, raw: bool = False,
                  duplicate: bool = False) -> None:
        """Execute `sql` for each of `rows`: as few multi-row statements as
        `many_rows` makes of it (chunks of at most PARAMS_MAX parameters), else one
        statement a row. Never the driver's executemany: it runs in pipeline mode, and a
        writer frozen right after one was never ended by the server's idle bound — the
        fleet waited on its locks (tests/postgres/test_postgres_frozen.py, the chain stage)."""
        conn = self._connect()
        width = len(rows[0]) if rows else 1
        step = max(1, PARAMS_MAX // max(1, width))
        multi = len(rows) > 1 and many_rows(sql, min(len(rows), step), "%s") is not None
        if self._pending and rows:  # the held writes go with the first statement
            first = many_rows(sql, min(len(rows), step), "%s") if multi else sql
            count = min(len(rows), step) if multi else 1
            self._run(first, [cell for row in rows[:count] for cell in row],  # type: ignore[arg-type]
                      raw=raw, duplicate=duplicate)
            rows = rows[count:]
            if not rows:
                return
            multi = len(rows) > 1 and many_rows(sql, min(len(rows), step), "%s") is not None
        with contextlib.nullcontext() if raw else self._translated(duplicate=duplicate), \
                conn.cursor() as cur:
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
        self._pending.clear()
        self._pending_size = 0
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
                    # ... and the format, read under those locks: a worker left running
                    # while another migrated the ledger to a newer format is refused
                    # here, at its next write, before it writes anything.
                    cur = conn.execute(
                        begun + f" SET LOCAL idle_in_transaction_session_timeout = {idle};"
                        f" SELECT {locks}, (SELECT max(version) FROM stepledger_schema),"
                        f" {_NOW_NS}")
                    while cur.nextset():
                        pass
                    row = cur.fetchone()
                    if row[-2] is not None and row[-2] > sch.SCHEMA_VERSION:
                        raise LedgerTooNew(self.location, row[-2], sch.SCHEMA_VERSION)
                    self._tx_time_ns = int(row[-1])
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
            conn.execute(self._with_pending("SELECT 1"))

    def _chain(self, *, held: bool = False) -> None:
        """Take the chain lock (once per transaction): from here to COMMIT, this
        transaction is the one appending after the head. `held`: before a write, the
        lock goes first in the message that sends the write (`_defer`), not alone — the
        server takes it before the write, and the transaction holds it a round trip less."""
        if self._chained or not self._writing:
            return
        take = (f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, {self._chain_key});"
                f" SET LOCAL idle_in_transaction_session_timeout = {CHAIN_IDLE_MS}")
        if held and self._conn is not None:
            self._chained = True
            self._pending.append(take)
            if len(self._pending) == 1:
                import time
                self._held_since = time.monotonic()
            return
        with self._translated():
            cur = self._connect().execute(self._with_pending(take))
            while cur.nextset():
                pass
        self._chained = True

    def _end(self, *, commit: bool) -> None:
        self._depth -= 1
        if self._depth:
            return
        writing = self._writing
        if writing:
            pulse_with(None)
        self._writing = self._chained = False
        conn = self._conn
        if not commit:
            self._abort()
            return
        psycopg = _psycopg()
        text = self._with_pending("COMMIT")
        try:
            cur = conn.execute(text)
            while cur.nextset():
                pass
        except psycopg.errors.IdleInTransactionSessionTimeout:
            raise DatabaseUnavailable(self.location, "the server ended this write transaction,"
                                      " silent past its idle bound, before its COMMIT (nothing"
                                      " of it committed); retry", reading=self.readonly) from None
        except psycopg.Error as exc:
            if conn.broken or conn.closed:  # no answer: the server may have committed
                raise DatabaseUnavailable(self.location, "the connection was lost at COMMIT"
                                          " (the transaction may or may not have committed): "
                                          + _first_line(exc), reading=self.readonly) from None
            # The server answered with an error — the COMMIT itself, or a write held for
            # its message (a lock timeout, a full disk, a refusal): nothing committed.
            self._abort()
            if isinstance(exc, (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected,
                                psycopg.errors.InsufficientPrivilege,
                                psycopg.errors.ReadOnlySqlTransaction)):
                with self._translated():
                    raise
            raise StorageFailure(self.location, "COMMIT failed, nothing of the transaction"
                                 f" committed: {type(exc).__name__}: {_first_line(exc)}"
                                 ) from None
        if writing and cur.statusmessage != "COMMIT":
            # A transaction a statement had failed in (its error caught and not re-raised
            # by the caller) is rolled back by its COMMIT, silently: never report it done.
            raise StorageFailure(self.location, "the transaction had failed and was rolled"
                                 f" back at its COMMIT ({cur.statusmessage}): nothing of it"
                                 " committed; retry it")

    def _abort(self) -> None:
        if self._writing:
            pulse_with(None)
        self._depth, self._writing, self._chained = 0, False, False
        self._pending.clear()
        self._pending_size = 0
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

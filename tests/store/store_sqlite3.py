"""A third store's skeleton: the ledger over Python's own `sqlite3` module (issue 38).

What a new SQL store costs: a `Driver` (six methods), a view and a transaction that
override only what differs in more than form (`ledger.store.view`), its schema, and the
`Store` around them (transactions, locks, a snapshot) — nothing from `ledger.store.sqlite`
(tests/store/test_store_skeleton.py checks that, and that it stays under 400 lines) and no
change outside this file. It passes the whole store contract (tests/store/store_contract.py).

A skeleton, not a product: no defensive open of a foreign file, no schema check or
migration, no append-only triggers, no fault handling beyond the typed errors the
contract asks for. Those are what the real stores add (docs/storage.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ledger.blobs import BlobStore
from ledger.errors import CorruptLedger, LedgerBusy, LedgerError, StorageFailure
from ledger.events import genesis_hash
from ledger.store import COPY_TABLES, DuplicateKey, EventRow, Held, RowsUnreadable, Scope, StoreInfo
from ledger.store import make_event_row
from ledger.store.base import locked_view, row_problem
from ledger.store.inline import InlineBlobs
from ledger.store.lock import StoreLock
from ledger.store.scratch import Scratch, empty_projections
from ledger.store.sql import ROW_COLUMNS, SQLITE, Statements
from ledger.store.view import READ_BATCH, Driver, SqlTx, SqlView

S = Statements(SQLITE)
#: Each table's key (the columns are `COPY_TABLES`'): the schema, in one place.
KEYS = {"meta": "key", "projection_checkpoint": "name", "steps": "step_id",
        "blob_data": "digest", "pins": "step, attempt, digest",
        "manifests": "step, manifest_rev", "manifest_entries": "step, manifest_rev, role, path",
        "workspaces": "name", "ws_paths": "workspace, path", "condemned": "digest",
        "sealed_ranges": "first_seq"}
SCHEMA = ["CREATE TABLE events(" + ", ".join(SQLITE.event_columns()) + ")",
          "CREATE INDEX events_step ON events(step, seq)",
          *(f"CREATE TABLE {t}({', '.join(COPY_TABLES[t])}, PRIMARY KEY({k}))"
            for t, k in KEYS.items())]
JOURNAL_RANGE = (f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key >= ? AND journal_key < ?"
                 "{} ORDER BY seq DESC LIMIT 1")
TOTALS_BY_TIME = (f"SELECT (time_ns / ?) * ?, count(*), sum({S.EVENT_BYTES}) FROM events"
                  " GROUP BY time_ns / ? ORDER BY 1")


def translate(exc: BaseException, where: str) -> LedgerError:
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return LedgerBusy(where, 5.0)
    if isinstance(exc, sqlite3.DatabaseError | UnicodeDecodeError):
        return CorruptLedger(where, f"{type(exc).__name__}: {exc}")
    return StorageFailure(where, f"{type(exc).__name__}: {exc}")


class Sqlite3Driver(Driver):
    mark = "?"
    params_max = 16_000
    raw_errors = (sqlite3.Error, UnicodeDecodeError)

    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        self.conn, self.where = conn, where

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self.conn.execute(sql, params).fetchone()  # type: ignore[no-any-return]

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    def execute_each(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)

    def read_error(self, exc: BaseException) -> LedgerError:
        return translate(exc, self.where)


class Space:
    """`ledger.store.scratch.Space` on the connection (the rebuild sink, the scratch)."""

    q = S
    page = None

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def run(self, sql: str, params: Sequence[object] | None = None) -> Any:
        return self.conn.execute(sql, params or ())

    def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)

    def rows(self, sql: str) -> Any:
        return self.conn.execute(sql)

    @staticmethod
    def table(name: str) -> str:
        return f"main.{name}"

    @staticmethod
    def temp(name: str) -> str:
        return f"temp.{name}"

    def create_temp_like(self, table: str, temp: str) -> None:
        self.conn.execute(f"CREATE TEMP TABLE {temp} AS SELECT * FROM main.{table} WHERE 0")
        key = KEYS.get(table)
        if key:  # (a rebuild upserts by the key)
            self.conn.execute(f"CREATE UNIQUE INDEX temp.{temp}_key ON {temp}({key})")


class View(SqlView):
    S = S
    JOURNAL_RANGE = JOURNAL_RANGE

    def __init__(self, store: Sqlite3Store) -> None:
        self._store, self._q = store, store.driver

    def _totals_by_time(self, bucket_ns: int) -> tuple[str, Sequence[object]]:
        return TOTALS_BY_TIME, (bucket_ns, bucket_ns, bucket_ns)

    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]:
        last = after_seq
        while True:
            try:
                got = self._q.all(S.CHECKED, (last, READ_BATCH))
            except sqlite3.Error as exc:
                raise RowsUnreadable(str(exc)) from None
            for r in got:
                yield make_event_row(r), row_problem(r)
            if len(got) < READ_BATCH:
                return
            last = got[-1][0]

    def integrity_problems(self) -> list[str]:
        found = [r[0] for r in self._q.all("PRAGMA quick_check")]
        return [] if found == ["ok"] else [f"quick_check: {m}" for m in found]

    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        order = " ORDER BY seq" if table == "events" else ""
        return iter(self._q.conn.execute(  # type: ignore[attr-defined]
            f"SELECT {', '.join(COPY_TABLES[table])} FROM {table}{order}"))

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Scratch]:
        s = Scratch(Space(self._q.conn))  # type: ignore[attr-defined]
        try:
            s.create()
            yield s
        finally:
            with contextlib.suppress(sqlite3.Error):
                s.drop()


_LockedView = locked_view(View, "The view outside a transaction (locked reads).")


class Tx(View, SqlTx):
    def __init__(self, store: Sqlite3Store, scope: Scope) -> None:
        self._store, self._q, self.scope = store, store.driver, scope
        self._time_ns: int | None = None

    def __enter__(self) -> Tx:
        store = self._store
        store.lock.acquire()
        try:
            store.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            store.lock.release()
            raise translate(exc, store.path) from None
        store.lock.writes += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        store = self._store
        try:
            if exc_type is None:
                if store.on_op is not None:
                    store.on_op("commit")
                store.conn.execute("COMMIT")
            elif store.conn.in_transaction:
                store.conn.execute("ROLLBACK")
        except sqlite3.Error as error:
            raise translate(error, store.path) from None
        finally:
            store.lock.writes -= 1
            store.lock.release()

    @property
    def time_ns(self) -> int:
        if self._time_ns is None:
            self._time_ns = self._store.clock()
        return self._time_ns

    def _insert_many(self, rows: list[EventRow]) -> None:
        self._savepoint()
        try:
            self._q.execute_each(S.INSERT_EVENT, rows)
        except sqlite3.IntegrityError as exc:
            self._rollback_savepoint()
            self._release_savepoint()
            raise DuplicateKey(exc) from None
        self._release_savepoint()

    def _insert_one(self, row: EventRow) -> None:
        try:
            self._q.run(S.INSERT_EVENT, row)
        except sqlite3.IntegrityError as exc:
            raise DuplicateKey(exc) from None

    def _intact(self, exc: BaseException) -> bool:
        return not isinstance(exc, sqlite3.Error) and self._store.conn.in_transaction

    @contextlib.contextmanager
    def rebuild_projections(self) -> Iterator[Any]:
        yield empty_projections(Space(self._store.conn))


class Sqlite3Store:
    """A ledger in one file, through the standard library's `sqlite3`."""

    def __init__(self, path: str, clock: Callable[[], int], *, create: bool = False) -> None:
        self.path, self.clock, self.on_op = path, clock, None
        self.conn = sqlite3.connect(path, timeout=5, isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        if create and not self.conn.execute("SELECT 1 FROM sqlite_schema").fetchone():
            with contextlib.suppress(sqlite3.OperationalError):  # another creator won
                self.conn.execute("BEGIN IMMEDIATE")
                for ddl in SCHEMA:
                    self.conn.execute(ddl)
                self.conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)",
                                      [("ledger_id", uuid.uuid4().hex),
                                       ("created_ns", str(clock()))])
                self.conn.execute("COMMIT")
        self.driver = Sqlite3Driver(self.conn, path)
        self.files = BlobStore(os.path.join(os.path.dirname(path), "blobs"))
        self.blobs = InlineBlobs(self)
        self.lock = StoreLock()
        self.view = _LockedView(self)
        self.info = StoreInfo(location=path, version=1, readonly=False)
        self._genesis: bytes | None = None

    @property
    def genesis(self) -> bytes:
        if self._genesis is None:
            self._genesis = genesis_hash(self.view.meta("ledger_id"))
        return self._genesis

    @contextlib.contextmanager
    def read(self) -> Iterator[View]:
        with self.lock:
            outer = not self.conn.in_transaction
            if outer:
                self.conn.execute("BEGIN")
            self.lock.reads += 1
            try:
                yield self.view
            finally:
                self.lock.reads -= 1
                if outer and self.conn.in_transaction:
                    self.conn.execute("COMMIT")

    def held_here(self) -> bool:
        return self.lock.owned()

    def reading_here(self) -> bool:
        return self.lock.reading_only()

    def transaction(self, scope: Scope = Scope()) -> Tx:
        return Tx(self, scope)

    def generation(self) -> int:
        with self.lock:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def _lock_path(self, name: str) -> str:
        return os.path.join(os.path.dirname(self.path), f".{name}.lock")

    @contextlib.contextmanager
    def exclusive(self, name: str, *, wait: bool = False) -> Iterator[None]:
        fd = os.open(self._lock_path(name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise Held(name, self._lock_path(name)) from None
            yield
        finally:
            os.close(fd)

    def held_elsewhere(self, name: str) -> bool:
        try:
            fd = os.open(self._lock_path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        finally:
            os.close(fd)

    def snapshot(self, path: str) -> None:
        if os.path.exists(path):
            raise StorageFailure(path, "the snapshot's file exists already")
        with self.lock:
            self.conn.execute("VACUUM INTO ?", (path,))

    def vacuum(self) -> None:
        with self.lock:
            self.conn.execute("VACUUM")

    def close(self, *, refused: bool = False) -> None:
        with self.lock:
            self.conn.close()


def open_sqlite3(location: str, clock: Callable[[], int], create: bool) -> Sqlite3Store:
    """The contract's opener (module level: the other processes call it too)."""
    return Sqlite3Store(location, clock, create=create)


__all__ = ["Sqlite3Store", "open_sqlite3"]

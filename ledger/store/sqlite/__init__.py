"""The SQLite store: a ledger in one SQLite file (WAL) and its blob files beside it.

`SqliteStore` implements `ledger.store.Store` over one apsw connection (`Database`:
opened defensively, schema allow-listed, ``BEGIN IMMEDIATE`` writes). `SqliteView` is a
read snapshot of that connection, `SqliteTx` a write transaction: the append loop is
`TxBase`'s; this module provides its primitives (a multi-row insert, a single insert, a
savepoint, the journal lookup). Inline blobs (up to the ledger's inline threshold) live
in the `blob_data` table and are written in the transaction that records them; larger
ones are files (`ledger.blobs.BlobStore`).

Every read maps what SQLite raises to a typed error (`read_error`): an undecodable or
wrongly typed cell is CorruptLedger, like a failing read.

Threads: the store's one connection is used by one thread at a time. `SqliteStore.lock`
(re-entrant) is held by every write transaction, every read transaction and every read
outside one (`store.view`'s methods; an iterator holds it for each step), so a thread
never reads another thread's uncommitted transaction and no two threads use the
connection at once (docs/design.md "Group commit").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import apsw

from ...blobs import BlobStore, FileOps
from .database import (
    BUSY_TIMEOUT_MS,
    GC_LOCK_NAME,
    LEDGER_FILE_MODE,
    ROW_ERRORS,
    Database,
    Synchronous,
    flock_held,
    translate,
)
from ...errors import InvalidInput
from ...events import genesis_hash
from .. import COPY_TABLES, DuplicateKey, EventRow, Held, RowsUnreadable, Scope, StoreInfo
from ..lock import StoreLock
from ..base import locked_view
from ..view import CHECKPOINT_NAME, SqlTx, SqlView
from .driver import SqliteDriver
from . import blobs as bl
from . import sql as q
from . import scratch as sc

#: What `exclusive(name)` locks: a file beside the ledger, held with flock.
LOCK_FILES: Final = {"gc": GC_LOCK_NAME}


class SqliteView(SqlView):
    """Reads of the store's connection (inside `read()`: one snapshot): the shared reads
    (`ledger.store.view.SqlView`) over `SqliteDriver`, and SQLite's own — verify's
    checked read (typeless cells; an invalid UTF-8 cell named, not raised), its
    ``quick_check``, a table read through a cursor, the scratch tables.

    Rows are fetched whole (`fetchall`) before they are decoded: a cursor left open by a
    row that fails to decode would keep its table locked (a comprehension's frame, held
    by the traceback, holds the cursor), and the caller's cleanup — verify drops its
    scratch tables — would fail.
    """

    S = q.S
    JOURNAL_RANGE = q.JOURNAL_RANGE

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._db = store.db
        self._q = store.driver

    def _totals_by_time(self, bucket_ns: int) -> tuple[str, Sequence[object]]:
        return q.TOTALS_BY_TIME, (bucket_ns, bucket_ns, bucket_ns)

    def _typed(self, table: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
        return q.check_types(table, row)

    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]:
        """Every row after `after_seq` with what is wrong with its cells (None: nothing);
        an invalid UTF-8 cell is named, not raised. A failing read raises RowsUnreadable
        (verify reports how far it got)."""
        rows = q.checked_rows(self._db.conn, after_seq)
        while True:
            try:
                got = next(rows, None)
            except apsw.Error as exc:
                raise RowsUnreadable(str(exc)) from None
            if got is None:
                return
            yield got  # type: ignore[misc]

    def meta(self, key: str) -> str | None:
        return self._db.meta_value(key)

    def integrity_problems(self) -> list[str]:
        """SQLite's ``quick_check`` (a failing check is its own problem)."""
        try:
            found = [r[0] for r in self._db.conn.execute("PRAGMA quick_check")]
        except apsw.Error as exc:
            return [f"SQLite quick_check: {exc}"]
        return [] if found == ["ok"] else [f"SQLite quick_check: {m}" for m in found]

    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        """Every row of a `COPY_TABLES` table, in its columns' order (a cursor: call
        inside `read()`, which holds one snapshot)."""
        columns = COPY_TABLES[table]
        order = " ORDER BY seq" if table == "events" else ""
        return iter(self._db.conn.execute(f"SELECT {', '.join(columns)} FROM {table}{order}"))

    def scratch(self) -> contextlib.AbstractContextManager[sc.Scratch]:
        """A rebuild's scratch copy in TEMP tables beside this view (`ledger.store.Scratch`)."""
        return sc.scratch(self._db.conn)


#: `store.view`: each read outside a transaction holds the store's lock (a thread in a
#: transaction holds it already: the lock is re-entrant).
_LockedView = locked_view(SqliteView, "The store's view outside a transaction (locked reads).")


class SqliteTx(SqliteView, SqlTx):
    """A ``BEGIN IMMEDIATE`` transaction (the store holds the write lock, and this thread
    the store's `lock`): the shared writes (`ledger.store.view.SqlTx`) and SQLite's
    event inserts."""

    def __init__(self, store: SqliteStore, scope: Scope) -> None:
        self._store, self._db, self._q = store, store.db, store.driver
        self.scope = scope
        self._time_ns: int | None = None
        self._cm = store.db.transaction()

    def __enter__(self) -> SqliteTx:
        lock = self._store.lock
        lock.acquire()
        try:
            self._cm.__enter__()
        except BaseException:
            lock.release()
            raise
        lock.writes += 1
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        lock = self._store.lock
        try:
            return self._cm.__exit__(*exc)
        finally:
            lock.writes -= 1
            lock.release()

    @property
    def time_ns(self) -> int:
        if self._time_ns is None:
            self._time_ns = self._store.clock()
        return self._time_ns

    # -- TxBase's primitives -------------------------------------------------------------

    def _whole_insert(self, n: int) -> bool:
        return n <= q.MULTI_ROW_MAX

    def _insert_many(self, rows: list[EventRow]) -> None:
        try:
            if len(rows) <= q.MULTI_ROW_MAX:
                # one statement: every row or none (a constraint error undoes the statement)
                self._db.conn.execute(q.insert_events(len(rows)),
                                      [cell for row in rows for cell in row])
            else:
                self._db.conn.executemany(q.S.INSERT_EVENT, rows)
        except apsw.ConstraintError as exc:
            raise DuplicateKey(exc) from None

    def _insert_one(self, row: EventRow) -> None:
        try:
            self._db.conn.execute(q.S.INSERT_EVENT, row)
        except apsw.ConstraintError as exc:
            raise DuplicateKey(exc) from None

    def _intact(self, exc: BaseException) -> bool:
        # A driver error (I/O, disk full, ...) may have rolled the whole transaction
        # back: it ends the group. A refusal of ours leaves the transaction as it was.
        return not isinstance(exc, apsw.Error) and self._db.conn.in_transaction

    def rebuild_projections(self) -> contextlib.AbstractContextManager[sc.RebuildSink]:
        return sc.rebuilding(self._db.conn)


class SqliteStore:
    """A ledger file and its blob files (see the module docstring)."""

    @classmethod
    def open(cls, path: str, *, clock: Callable[[], int], readonly: bool = False,
             synchronous: Synchronous = "FULL", busy_timeout_ms: int = BUSY_TIMEOUT_MS,
             vfs: str | None = None, forensic: bool = False,
             blob_root: str | os.PathLike[str] | None = None,
             on_op: Callable[[str], None] | None = None,
             immutable: bool = False) -> SqliteStore:
        """Open the ledger file at `path` (refused files stay untouched: `Database.open`)
        and its blob files (`blob_root`, default ``<ledger dir>/blobs``)."""
        db = Database.open(path, readonly=readonly, synchronous=synchronous,
                           busy_timeout_ms=busy_timeout_ms, vfs=vfs, forensic=forensic,
                           immutable=immutable)
        return cls._over(db, clock, blob_root, on_op)

    @classmethod
    def create(cls, path: str, *, clock: Callable[[], int], synchronous: Synchronous = "FULL",
               busy_timeout_ms: int = BUSY_TIMEOUT_MS, vfs: str | None = None,
               blob_root: str | os.PathLike[str] | None = None,
               on_op: Callable[[str], None] | None = None) -> tuple[SqliteStore, bool]:
        """Create the ledger file at `path`, or open the one there; and whether it was
        created (`Database.create`)."""
        db, created = Database.create(path, synchronous=synchronous,
                                      busy_timeout_ms=busy_timeout_ms, vfs=vfs)
        return cls._over(db, clock, blob_root, on_op), created

    @staticmethod
    def check_writable(path: str) -> None:
        """NotALedger, before anything is opened or created, if one of the ledger's own
        files at `path` (the database, its -wal, -shm, -lockq) is a symlink: a writer
        follows none. A symlinked directory above them is resolved, not refused."""
        Database.refuse_symlinks(path)

    @classmethod
    def _over(cls, db: Database, clock: Callable[[], int],
              blob_root: str | os.PathLike[str] | None,
              on_op: Callable[[str], None] | None) -> SqliteStore:
        try:
            root = blob_root if blob_root is not None else os.path.join(
                os.path.dirname(db.path), "blobs")
            store = cls(db, clock, BlobStore(root, FileOps(on_op)))
            store.on_op = on_op
        except BaseException:
            db.close_refused()
            raise
        return store

    def __init__(self, db: Database, clock: Callable[[], int], files: BlobStore | None = None
                 ) -> None:
        self.db = db
        #: The statements' way to the connection (`ledger.store.view.Driver`).
        self.driver = SqliteDriver(db)
        self.clock = clock
        root = os.path.join(os.path.dirname(db.path), "blobs")
        #: The blob files (what the inline threshold leaves out of the ledger file).
        self.files = files if files is not None else BlobStore(root)
        #: Blob bytes outside a transaction: the inline rows, else the files.
        self.blobs = bl.SqliteBlobs(self)
        #: Held by every use of the connection (re-entrant): a write transaction, a read
        #: transaction, each read outside one (`view`). Threads take turns; none reads
        #: another's uncommitted transaction.
        self.lock = StoreLock()
        #: Reads outside a read transaction (each statement sees the latest commit).
        self.view: SqliteView = _LockedView(self)
        self._genesis: bytes | None = None

    @property
    def info(self) -> StoreInfo:
        db = self.db
        return StoreInfo(location=db.path, version=db.version, readonly=db.readonly,
                         forensic=db.forensic, schema_changes=db.schema_changes)

    @property
    def on_op(self) -> Callable[[str], None] | None:
        return self.db.on_op

    @on_op.setter
    def on_op(self, value: Callable[[str], None] | None) -> None:
        self.db.on_op = value

    @property
    def genesis(self) -> bytes:
        if self._genesis is None:
            with self.lock:
                self._genesis = genesis_hash(self.db.meta("ledger_id"))
        return self._genesis

    @contextlib.contextmanager
    def read(self) -> Iterator[SqliteView]:
        """A read transaction: every read inside sees one state (inside a transaction:
        the transaction's)."""
        with self.lock, self.db.read_transaction():
            self.lock.reads += 1
            try:
                yield self.view
            finally:
                self.lock.reads -= 1

    def held_here(self) -> bool:
        """Whether this thread holds the store's lock (inside a transaction, a read, or
        any section it locked)."""
        return self.lock.owned()

    def reading_here(self) -> bool:
        """Whether this thread is inside a read transaction of the store and no write
        transaction: an append there cannot commit."""
        return self.lock.reading_only()

    def transaction(self, scope: Scope = Scope()) -> SqliteTx:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (`with store.transaction() as tx:`)."""
        return SqliteTx(self, scope)

    def generation(self) -> int:
        """Changes when another connection commits (``PRAGMA data_version``)."""
        with self.lock:
            self.db.follow_migration()
            return self.db.conn.execute("PRAGMA data_version").fetchone()[0]  # type: ignore[no-any-return]

    # -- locks beside the ledger -------------------------------------------------------

    def _lock_path(self, name: str) -> str:
        return os.path.join(os.path.dirname(self.db.path), LOCK_FILES[name])

    @contextlib.contextmanager
    def exclusive(self, name: str, *, wait: bool = False) -> Iterator[None]:
        """Hold lock `name` (a flock on a file beside the ledger) for the block; Held
        when another process holds it and not `wait`."""
        path = self._lock_path(name)
        try:  # one of the ledger's own files: never through a symlink (file._refuse_symlinks)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                         LEDGER_FILE_MODE)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise InvalidInput(f"{path} is a symlink; a writer never follows one (another"
                               " file could be written through it): remove it") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise Held(name, path) from None
                raise
            yield
        finally:
            os.close(fd)

    def held_elsewhere(self, name: str) -> bool:
        """Whether another process holds lock `name` now (a shared probe; creates nothing)."""
        return flock_held(self._lock_path(name))

    def snapshot(self, path: str) -> None:
        """`VACUUM INTO` a new file (`Database.snapshot`): one read transaction."""
        with self.lock:
            self.db.snapshot(path)
    def vacuum(self) -> None:
        """Rewrite the file without its free pages (VACUUM), then checkpoint the WAL into
        it and truncate the WAL: deleted rows (a seal's) shrink the file only so."""
        with self.lock:
            conn = self.db.conn
            # VACUUM works through an attached copy; the hardened connection allows none
            attached = conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 1)
            try:
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except apsw.Error as exc:
                raise translate(exc, self.db.path) from None
            finally:
                conn.limit(apsw.SQLITE_LIMIT_ATTACHED, attached)

    def close(self, *, refused: bool = False) -> None:
        with self.lock:
            if refused:
                self.db.close_refused()
            else:
                self.db.close()


__all__ = ["CHECKPOINT_NAME", "Held", "ROW_ERRORS", "SqliteStore", "SqliteTx", "SqliteView"]

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    read_error,
    translate,
)
from ...errors import CorruptLedger, InvalidInput
from ...events import genesis_hash
from .. import (
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
from ..base import TxBase, locked_view
from ..rows import IN_FLIGHT, PathState, StepRow, WsRow
from . import blobs as bl
from . import sql as q
from ..sql import if_current
from . import scratch as sc

#: The projection checkpoint's row (the inline projections are checkpointed together).
CHECKPOINT_NAME: Final = "steps"
#: What `exclusive(name)` locks: a file beside the ledger, held with flock.
LOCK_FILES: Final = {"gc": GC_LOCK_NAME}

_SELECT_META: Final = "SELECT value FROM meta WHERE key = ?"
_UPSERT_META: Final = ("INSERT INTO meta(key, value) VALUES (?, ?)"
                       " ON CONFLICT(key) DO UPDATE SET value = excluded.value")

class SqliteView:
    """Reads of the store's connection (inside `read()`: one snapshot).

    Rows are fetched whole (`fetchall`) before they are decoded: a cursor left open by a
    row that fails to decode would keep its table locked (a comprehension's frame, held
    by the traceback, holds the cursor), and the caller's cleanup — verify drops its
    scratch tables — would fail.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._db = store.db

    # -- events ------------------------------------------------------------------------

    def head(self) -> Head:
        try:
            row = self._db.conn.execute(q.S.HEAD).fetchone()
        except apsw.Error as exc:
            raise read_error(exc, self._db.path) from None
        if row is None:
            return Head(0, self._store.genesis)
        if not isinstance(row[1], bytes):
            raise CorruptLedger(self._db.path, f"event #{row[0]}'s hash is not a blob")
        return Head(row[0], row[1])

    def count(self) -> int:
        return int(self._db.conn.execute(q.S.COUNT).fetchone()[0])

    def events(self, query: EventQuery = EventQuery()) -> Iterator[EventRow]:
        """Event rows matching `query`, in bounded batches (each its own statement)."""
        sql, params = q.query(query)
        start = 2**63 - 1 if query.descending else query.after_seq
        return q.paged(self._db, sql, params, start, query.limit, make_event_row)  # type: ignore[return-value]

    def fold_rows(self, after_seq: int = 0) -> Iterator[FoldRow]:
        sql, params = q.query(EventQuery(after_seq=after_seq), q.FOLD_COLUMNS)
        return q.paged(self._db, sql, params, after_seq, None, make_fold_row)  # type: ignore[return-value]

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

    def journal_lookup(self, key: str) -> EventRow | None:
        row = self._db.conn.execute(q.S.JOURNAL, (key,)).fetchone()
        return None if row is None else make_event_row(row)

    def journal_newest(self, prefix: str, kind: str | None = None) -> EventRow | None:
        """The newest event whose journal key starts with `prefix` (and, given `kind`, of
        that kind): a seek on the key's index, however long the log."""
        low, high = q.prefix_range(prefix)
        if kind is None:
            row = self._db.conn.execute(q.JOURNAL_RANGE.format(""), (low, high)).fetchone()
        else:
            row = self._db.conn.execute(q.JOURNAL_RANGE.format(" AND kind = ?"),
                                        (low, high, kind)).fetchone()
        return None if row is None else make_event_row(row)

    # -- projections, meta -------------------------------------------------------------

    def checkpoint(self) -> Checkpoint | None:
        row = self._db.conn.execute(q.S.SELECT_CHECKPOINT, (CHECKPOINT_NAME,)).fetchone()
        return None if row is None else Checkpoint(row[0], row[1])

    def step(self, step_id: str) -> StepRow | None:
        return q.load_step(self._db.conn, step_id)

    def step_if_current(self, step_id: str, version: int) -> tuple[bool, StepRow | None]:
        return self._if_current(q.S.STEP_IF_CURRENT, step_id, version, StepRow.from_tuple)

    def workspace_if_current(self, name: str, version: int) -> tuple[bool, WsRow | None]:
        return self._if_current(q.S.WS_IF_CURRENT, name, version, WsRow.from_tuple)

    def _if_current(self, sql: str, key: str, version: int, make: Any) -> tuple[bool, Any]:
        try:
            row = self._db.conn.execute(sql, (CHECKPOINT_NAME, CHECKPOINT_NAME, key)).fetchone()
            return if_current(row, version, make)
        except apsw.Error as exc:
            raise read_error(exc, self._db.path) from None
        except (TypeError, ValueError) as exc:  # a damaged row's cells
            raise CorruptLedger(self._db.path, str(exc)) from None

    def steps_by_id(self, step_ids: Sequence[str]) -> list[StepRow]:
        out: list[StepRow] = []
        conn, ids = self._db.conn, list(step_ids)
        for i in range(0, len(ids), q.PARAMS_MAX):
            chunk = ids[i:i + q.PARAMS_MAX]
            out.extend(StepRow.from_tuple(r) for r in conn.execute(
                q.S.SELECT_STEPS_IN.format(", ".join("?" * len(chunk))), chunk).fetchall())
        return out

    def steps(self, *, state: str | None = None, step_id: str | None = None,
              contains: str | None = None, limit: int | None = None) -> list[StepRow]:
        """The step rows (of one state, or one step, or whose id holds `contains`; at
        most `limit`), oldest first."""
        sql, params = q.select_steps(state, step_id, contains, limit)
        return [StepRow.from_tuple(r) for r in self._db.conn.execute(sql, params).fetchall()]

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
        return [(r[0], int(r[1])) for r in self._db.conn.execute(sql, params).fetchall()]

    def workspace(self, name: str) -> WsRow | None:
        return q.load_workspace(self._db.conn, name)

    def workspace_rows(self) -> list[WsRow]:
        return [WsRow.from_tuple(r) for r in self._db.conn.execute(q.S.SELECT_WS).fetchall()]

    def path_state(self, workspace: str, path: str) -> PathState | None:
        return q.load_path(self._db.conn, workspace, path)

    def path_rows(self) -> list[tuple[object, ...]]:
        """(workspace, path, rev, hash, seq) of every path a step wrote."""
        return [q.check_types("ws_paths", r)
                for r in self._db.conn.execute(q.S.SELECT_PATHS).fetchall()]

    def pin_rows(self) -> list[tuple[object, ...]]:
        return [q.check_types("pins", r) for r in self._db.conn.execute(q.S.SELECT_PINS).fetchall()]

    def manifest_rows(self) -> list[tuple[object, ...]]:
        return [q.check_types("manifests", r)
                for r in self._db.conn.execute(q.S.SELECT_MANIFESTS).fetchall()]

    def entry_rows(self) -> list[EntryRow]:
        return [make_entry_row(q.check_types("manifest_entries", r))
                for r in self._db.conn.execute(q.S.SELECT_ENTRIES).fetchall()]

    def meta(self, key: str) -> str | None:
        """A meta value; None if the key is absent (CorruptLedger if it cannot be read)."""
        return self._db.meta_value(key)

    def meta_all(self) -> dict[str, object]:
        return dict(self._db.conn.execute("SELECT key, value FROM meta").fetchall())

    # -- blobs (docs/storage.md: the inline row, else the blob file) ---------------------

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        """(size, inline) of a stored blob — the inline row, else the blob file —, looked
        up now: never cached across calls."""
        row = self._db.conn.execute(q.S.INLINE_SIZE, (digest,)).fetchone()
        if row is not None:
            return int(row[0]), True
        size = self._store.files.size(digest)
        return None if size is None else (size, False)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes and
        hashes to its name (an inline row is always re-hashed; a file when `hash_file`)."""
        bl.check_blob(self, self._store.files, digest, size, hash_file=hash_file)

    def inline_blob(self, digest: str) -> tuple[int, bytes] | None:
        """(recorded size, bytes) of an inline blob row; None when there is none."""
        row = self._db.conn.execute(q.S.INLINE_BLOB, (digest,)).fetchone()
        return None if row is None else (row[0], row[1])

    def inline_stat(self, digest: str) -> BlobStat | None:
        """An inline blob row's size and stored time (no bytes read); None: none."""
        row = self._db.conn.execute(q.S.INLINE_STAT, (digest,)).fetchone()
        return None if row is None else BlobStat(digest, int(row[0]), True, int(row[1]))

    def inline_blobs(self) -> Iterator[BlobStat]:
        rows = self._db.conn.execute(q.S.INLINE_ALL).fetchall()
        return iter([BlobStat(digest, size, True, stored_ns) for digest, size, stored_ns in rows])

    # -- what GC and audit read ---------------------------------------------------------

    def pin_holds(self, digest: str | None = None) -> list[PinHold]:
        conn = self._db.conn
        if digest is None:
            return list(map(make_pin_hold, conn.execute(q.S.PIN_HOLDS).fetchall()))
        return list(map(make_pin_hold, conn.execute(q.S.PIN_HOLDS_OF, (digest,)).fetchall()))

    def manifest_digests(self) -> set[str]:
        return {r[0] for r in self._db.conn.execute(q.S.MANIFEST_DIGESTS).fetchall()}

    def names_digest(self, digest: str) -> bool:
        return self._db.conn.execute(q.S.NAMES_DIGEST, (digest,)).fetchone() is not None

    def entries_naming(self, digest: str, limit: int) -> list[tuple[str, int, str]]:
        return self._db.conn.execute(q.S.ENTRIES_NAMING,  # type: ignore[no-any-return]
                                     (digest, limit)).fetchall()

    def live_entries(self) -> list[tuple[str, int]]:
        return self._db.conn.execute(q.S.LIVE_ENTRIES).fetchall()  # type: ignore[no-any-return]

    def event_totals(self, bucket_ns: int) -> tuple[list[tuple[str, str, int, int, int, int]],
                                                     list[tuple[int, int, int]]]:
        conn = self._db.conn
        by_run = [(str(r), str(k), int(n), int(b), int(t0), int(t1))
                  for r, k, n, b, t0, t1 in conn.execute(q.S.TOTALS_BY_RUN)]
        by_time = [(int(t), int(n), int(b)) for t, n, b in
                   conn.execute(q.TOTALS_BY_TIME, (bucket_ns, bucket_ns, bucket_ns))]
        return by_run, by_time

    def live_step_count(self) -> int:
        return int(self._db.conn.execute(q.S.LIVE_STEPS).fetchone()[0])

    def step_totals(self, states: frozenset[str]) -> tuple[int, int]:
        n, b = self._db.conn.execute(q.S.STEP_TOTALS.format(", ".join("?" * len(states))),
                                     tuple(sorted(states))).fetchone()
        return int(n), int(b)

    def condemned(self) -> dict[str, tuple[int, bool]]:
        return {d: (int(n), bool(i))
                for d, n, i in self._db.conn.execute(q.S.SELECT_CONDEMNED).fetchall()}

    def condemned_entry(self, digest: str) -> tuple[int, bool] | None:
        row = self._db.conn.execute(q.S.SELECT_ONE_CONDEMNED, (digest,)).fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    def condemned_count(self) -> int:
        return int(self._db.conn.execute(q.S.COUNT_CONDEMNED).fetchone()[0])

    # -- what verify reads -------------------------------------------------------------

    def integrity_problems(self) -> list[str]:
        """SQLite's ``quick_check`` (a failing check is its own problem)."""
        try:
            found = [r[0] for r in self._db.conn.execute("PRAGMA quick_check")]
        except apsw.Error as exc:
            return [f"SQLite quick_check: {exc}"]
        return [] if found == ["ok"] else [f"SQLite quick_check: {m}" for m in found]

    def checkpoint_rows(self) -> list[tuple[object, object, object]]:
        return self._db.conn.execute(q.S.CHECKPOINT_ROWS).fetchall()  # type: ignore[no-any-return]

    def inline_row_problems(self, limit: int) -> list[tuple[object, object, object]]:
        return self._db.conn.execute(q.S.INLINE_ROW_PROBLEMS,  # type: ignore[no-any-return]
                                     (limit,)).fetchall()

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


class SqliteTx(SqliteView, TxBase):
    """A ``BEGIN IMMEDIATE`` transaction (the store holds the write lock, and this thread
    the store's `lock`)."""

    def __init__(self, store: SqliteStore, scope: Scope) -> None:
        self._store, self._db = store, store.db  # (SqliteView's, set here: one call less)
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

    def _savepoint(self) -> None:
        self._db.conn.execute("SAVEPOINT append_batch")

    def _rollback_savepoint(self) -> None:
        self._db.conn.execute("ROLLBACK TO append_batch")

    def _release_savepoint(self) -> None:
        self._db.conn.execute("RELEASE append_batch")

    def _open_part(self) -> None:
        self._db.conn.execute("SAVEPOINT group_part")

    def _undo_part(self) -> None:
        conn = self._db.conn
        conn.execute("ROLLBACK TO group_part")
        conn.execute("RELEASE group_part")

    def _close_part(self) -> None:
        self._db.conn.execute("RELEASE group_part")

    def _intact(self, exc: BaseException) -> bool:
        # A driver error (I/O, disk full, ...) may have rolled the whole transaction
        # back: it ends the group. A refusal of ours leaves the transaction as it was.
        return not isinstance(exc, apsw.Error) and self._db.conn.in_transaction

    # -- other writes ------------------------------------------------------------------

    def put_inline(self, blobs: Mapping[str, bytes], stored_ns: int) -> None:
        """Write inline blob rows: a damaged row is rewritten, an intact one freshened
        (its `stored_ns`: GC's grace window counts from it)."""
        conn = self._db.conn
        for digest, data in blobs.items():
            # one upsert: SQLite rewrites in place only the bytes that differ, so an
            # intact row's data pages stay clean
            conn.execute(q.S.INLINE_UPSERT, (digest, len(data), data, stored_ns))
            self._wrote_inline(digest, data)

    def delete_inline(self, digest: str) -> None:
        self._unwrote(digest)
        self._db.conn.execute(q.S.INLINE_DELETE, (digest,))

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        size = self._wrote_size(digest)
        return (size, True) if size is not None else SqliteView.blob_size(self, digest)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        if self._wrote_size(digest) != size:
            SqliteView.check_blob(self, digest, size, hash_file=hash_file)

    def set_meta(self, key: str, value: str) -> None:
        self._db.conn.execute(_UPSERT_META, (key, value))

    def write_projection(self, changes: ProjectionChanges) -> None:
        conn = self._db.conn
        for sql, rows in q.S.projection_writes(changes, CHECKPOINT_NAME):
            q.run_many(conn, sql, rows)

    def rebuild_projections(self) -> contextlib.AbstractContextManager[sc.RebuildSink]:
        return sc.rebuilding(self._db.conn)

    def condemn(self, rows: Sequence[tuple[str, int, bool]], condemned_ns: int,
                collection: str) -> None:
        self._db.conn.executemany(q.S.CONDEMN, [(d, n, int(i), condemned_ns, collection)
                                               for d, n, i in rows])

    def uncondemn(self, digests: Iterable[str]) -> None:
        self._db.conn.executemany(q.S.UNCONDEMN, [(d,) for d in digests])

    def load_rows(self, table: str, rows: Sequence[tuple[object, ...]]) -> None:
        columns = COPY_TABLES[table]
        self._db.conn.executemany(
            f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            rows)

    def seal_rows(self, run: str, ranges: Sequence[tuple[int, int]], seal_seq: int) -> int:
        conn = self._db.conn
        conn.executemany(q.S.ADD_SEALED_RANGE, [(a, b, run, seal_seq) for a, b in ranges])
        removed = 0
        for a, b in ranges:
            conn.execute(q.S.DELETE_SEALED, (a, b, run))
            removed += conn.changes()
        return removed


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

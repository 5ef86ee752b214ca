"""The PostgreSQL store's blob bytes: inline rows (`blob_data`, as on SQLite), else chunk
rows in the database (`blob_chunks`) under a pointer row (`blob_files`).

A blob larger than the inline threshold is written on a connection of its own (never
inside a ledger transaction, as a blob file is written before its event): every chunk,
then the pointer row, in one transaction, hashed as it goes; nothing commits unless the
bytes hash to their name (ContentChanged). So content is durable before any pointer to it
exists, and the pointer before any event names the blob. Reads stream one chunk at a
time (`CHUNK` bytes), checking the size and hash by the last: memory stays bounded
however large the blob.

`PgFiles` answers what the rest of the ledger asks of the SQLite store's blob files
(`ledger.blobs.BlobStore`): stat, read, stream, check, put, delete, list. GC and audit
account these rows as they account files.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Final

from ...blobs import CHUNK, BlobFile, Content, FileOps, PutResult, TempFile, content_chunks, \
    content_digest, put_digest
from ...errors import BlobCorrupt, BlobNotFound, ContentChanged, DatabaseUnavailable, \
    StorageFailure
from ...events import check_digest
from ..inline import InlineBlobs

_STAT: Final = "SELECT size, chunks, stored_ns FROM blob_files WHERE digest = %s"
_CHUNK: Final = "SELECT data FROM blob_chunks WHERE digest = %s AND n = %s"
_NOW: Final = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint * 1000"


class PgFiles:
    """Blob bytes in chunk rows (see the module docstring)."""

    root = None  # nothing on a disk of this machine: no workspace can overlap it

    def __init__(self, store: Any) -> None:
        self._store = store
        #: The workspace's file operations (the store's `on_op` hook sees them, as on
        #: SQLite: the chaos harness and the demo kill a worker between two of them).
        self.ops = FileOps(self._workspace_op)
        self._conn: Any = None
        self._lock = threading.RLock()

    def _workspace_op(self, name: str) -> None:
        """Before each workspace file operation: the store's hook; and before a rename or
        an unlink inside a write transaction, proof that the transaction is still the
        server's. A session the server ended (killed, cut off) has let go of its
        workspace's lock, and another worker may own the files now: the builder stops
        there (DatabaseUnavailable) instead of changing them unlocked."""
        store = self._store
        if store.on_op is not None:
            store.on_op(name)
        if name in ("ws-rename", "ws-unlink") and store._writing:
            store._alive()

    # -- the connection ----------------------------------------------------------------

    def _connection(self) -> Any:
        from .driver import _first_line, _psycopg
        psycopg = _psycopg()
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        try:
            self._conn = psycopg.connect(self._store.url, autocommit=True, connect_timeout=10,
                                         application_name="steptrail blobs")
            self._conn.execute(f"SET search_path TO {_quote(self._store._schema)}")
        except psycopg.Error as exc:
            raise DatabaseUnavailable(self._store.location, _first_line(exc)) from None
        return self._conn

    @contextlib.contextmanager
    def _using(self) -> Iterator[Any]:
        """The blob connection, errors typed."""
        from .driver import _first_line, _psycopg
        psycopg = _psycopg()
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except psycopg.OperationalError as exc:
                raise DatabaseUnavailable(self._store.location, _first_line(exc)) from None
            except psycopg.errors.UniqueViolation:
                raise
            except psycopg.Error as exc:
                raise StorageFailure(self._store.location, _first_line(exc)) from None

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _now(self, conn: Any) -> int:
        clock = self._store.injected_clock
        return clock() if clock is not None else int(conn.execute(_NOW).fetchone()[0])

    # -- reading -----------------------------------------------------------------------

    def size(self, digest: str) -> int | None:
        found = self.stat(digest)
        return None if found is None else found.size

    def stat(self, digest: str) -> BlobFile | None:
        check_digest(digest)
        with self._using() as conn:
            row = conn.execute(_STAT, (digest,)).fetchone()
        return None if row is None else BlobFile(digest, int(row[0]), int(row[2]))

    def read(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes:
        data = b"".join(self._pieces(digest, size, verify=verify))
        return data

    def chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """The bytes in `CHUNK` pieces: BlobNotFound at once when there is no such blob;
        size and hash checked as the last piece is read."""
        check_digest(digest)
        if self.stat(digest) is None:
            raise BlobNotFound(digest)
        return self._pieces(digest, size, verify=True)

    def _pieces(self, digest: str, size: int | None, *, verify: bool) -> Iterator[bytes]:
        check_digest(digest)
        with self._using() as conn:
            row = conn.execute(_STAT, (digest,)).fetchone()
        if row is None:
            raise BlobNotFound(digest)
        recorded, count = int(row[0]), int(row[1])
        h = hashlib.sha256()
        n = 0
        for i in range(count):
            with self._using() as conn:
                got = conn.execute(_CHUNK, (digest, i)).fetchone()
            if got is None:
                raise BlobCorrupt(digest, f"its chunk {i} of {count} is missing")
            piece = bytes(got[0])
            h.update(piece)
            n += len(piece)
            yield piece
        if n != recorded:
            raise BlobCorrupt(digest, f"its chunks hold {n} bytes, its pointer row {recorded}")
        if size is not None and n != size:
            raise BlobCorrupt(digest, f"it holds {n} bytes, {size} were recorded")
        if verify and h.hexdigest() != digest:
            raise BlobCorrupt(digest, "its bytes do not hash to its name")

    def check(self, digest: str) -> int:
        """Re-hash a stored blob; return its size. BlobNotFound / BlobCorrupt otherwise."""
        n = 0
        for piece in self._pieces(digest, None, verify=True):
            n += len(piece)
        return n

    # -- writing -----------------------------------------------------------------------

    def check_writable(self, digest: str) -> None:
        check_digest(digest)

    def put(self, data: bytes | memoryview, digest: str | None = None, *,
            verified: bool = False) -> PutResult:
        return self.put_stream((data,), put_digest(data, digest, verified=verified))

    def put_content(self, content: Content, digest: str) -> PutResult:
        if isinstance(content, bytes):
            return self.put(content, digest, verified=True)
        return self.put_stream(content_chunks(content), digest)

    def put_file(self, path: str) -> PutResult:
        with open(path, "rb") as f:
            return self.put_content(f, content_digest(f)[0])

    def put_stream(self, chunks: Iterable[bytes | memoryview], digest: str) -> PutResult:
        """Store the bytes `chunks` yields as blob `digest`, durable on return. An intact
        blob already stored is a dedup hit (re-hashed, freshened; `chunks` not read);
        otherwise chunks and pointer commit together, only if they hash to `digest`."""
        from .driver import _psycopg
        psycopg = _psycopg()
        check_digest(digest)
        for attempt in range(2):
            try:
                return self._put_once(chunks, digest)
            except psycopg.errors.UniqueViolation:
                if attempt:
                    raise StorageFailure(self._store.location, f"blob {digest} was being"
                                         " written by another session twice over") from None
                continue  # another session stored it meanwhile: its copy is checked
        raise AssertionError("unreachable")

    def _put_once(self, chunks: Iterable[bytes | memoryview], digest: str) -> PutResult:
        replaced = False
        if self.stat(digest) is not None:
            try:
                n = self.check(digest)
            except (BlobCorrupt, BlobNotFound):
                replaced = True
            else:
                with self._using() as conn:
                    freshened = conn.execute(
                        "UPDATE blob_files SET stored_ns = %s WHERE digest = %s",
                        (self._now(conn), digest)).rowcount
                if freshened == 1:
                    return PutResult(digest, n, deduped=True)
                # collected between the check and the freshen: stored again below
        with self._using() as conn, _transaction(conn):
            # one transaction: the chunks, then the pointer row
            conn.execute("DELETE FROM blob_chunks WHERE digest = %s", (digest,))
            h = hashlib.sha256()
            size, index = 0, 0
            pending = bytearray()
            for chunk in chunks:
                h.update(chunk)
                size += len(chunk)
                pending += chunk
                while len(pending) >= CHUNK:
                    conn.execute("INSERT INTO blob_chunks(digest, n, data) VALUES (%s, %s, %s)",
                                 (digest, index, bytes(pending[:CHUNK])))
                    del pending[:CHUNK]
                    index += 1
            if pending or index == 0:
                conn.execute("INSERT INTO blob_chunks(digest, n, data) VALUES (%s, %s, %s)",
                             (digest, index, bytes(pending)))
                index += 1
            if h.hexdigest() != digest:
                raise ContentChanged(digest, h.hexdigest())
            conn.execute(
                "INSERT INTO blob_files(digest, size, chunks, stored_ns) VALUES (%s,%s,%s,%s)"
                " ON CONFLICT(digest) DO UPDATE SET size = excluded.size,"
                " chunks = excluded.chunks, stored_ns = excluded.stored_ns",
                (digest, size, index, self._now(conn)))
        return PutResult(digest, size, deduped=False, replaced=replaced)

    def delete(self, digest: str) -> bool:
        """Remove a blob's pointer and chunks (one transaction); False: not there."""
        check_digest(digest)
        with self._using() as conn, _transaction(conn):
            gone = conn.execute("DELETE FROM blob_files WHERE digest = %s", (digest,)).rowcount
            conn.execute("DELETE FROM blob_chunks WHERE digest = %s", (digest,))
        return bool(gone)

    def sync_absent(self, digest: str) -> None:
        """Nothing to make durable: a delete commits."""

    def delete_temp(self, name: str) -> bool:
        return False

    # -- listing -----------------------------------------------------------------------

    def files(self) -> dict[str, tuple[int, int]]:
        with self._using() as conn:
            rows = conn.execute("SELECT digest, size, stored_ns FROM blob_files").fetchall()
        return {d: (int(n), int(t)) for d, n, t in rows}

    def scan(self) -> Iterator[BlobFile]:
        return iter([BlobFile(d, n, t) for d, (n, t) in sorted(self.files().items())])

    def temp_files(self) -> Iterator[TempFile]:
        return iter(())

    def make_private(self) -> None:
        """The bytes are the database's: its roles and grants guard them."""


class PgBlobs(InlineBlobs):
    """`ledger.store.BlobBackend` for the PostgreSQL store: the inline row, else chunks
    (`InlineBlobs`, the rule both stores' blobs follow, over `PgFiles`)."""

    root = None  # type: ignore[assignment]  # in the database: no directory here


@contextlib.contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    """BEGIN … COMMIT on an autocommit connection; ROLLBACK (when the connection still
    can) on any exception."""
    conn.execute("BEGIN")
    try:
        yield
    except BaseException:
        if not conn.broken:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = ["PgBlobs", "PgFiles"]

"""The SQLite store's blob bytes: inline rows (`blob_data`), else blob files.

One rule, written here once: a digest with an inline row is that row (written in the
transaction that records it; up to the ledger's inline threshold), anything else is the
blob file of that name (`ledger.blobs.BlobStore`: fsynced, renamed, directory fsynced
before any event names it). Reads check the size they are given and the hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

from ...blobs import BlobStore, PutResult, digest_of
from ...errors import BlobCorrupt, BlobNotFound
from .. import BlobStat, ReadView

INLINE_SIZE: Final = "SELECT size FROM blob_data WHERE digest = ?"
INLINE_BLOB: Final = "SELECT size, data FROM blob_data WHERE digest = ?"
INLINE_STAT: Final = "SELECT size, stored_ns FROM blob_data WHERE digest = ?"
INLINE_DATA: Final = "SELECT data FROM blob_data WHERE digest = ?"
INLINE_FRESHEN: Final = "UPDATE blob_data SET stored_ns = ? WHERE digest = ?"
INLINE_PUT: Final = ("INSERT OR REPLACE INTO blob_data(digest, size, data, stored_ns)"
                     " VALUES (?,?,?,?)")
INLINE_DELETE: Final = "DELETE FROM blob_data WHERE digest = ?"
INLINE_ALL: Final = "SELECT digest, size, stored_ns FROM blob_data ORDER BY digest"


def inline_bytes(digest: str, data: Any, size: int | None, verify: bool) -> bytes:
    """An inline row's bytes, checked against `size` and (if `verify`) the hash."""
    data = bytes(data)
    if size is not None and len(data) != size:
        raise BlobCorrupt(digest, f"the inline row holds {len(data)} bytes, {size} recorded")
    if verify and digest_of(data) != digest:
        raise BlobCorrupt(digest, "the inline row's bytes do not hash to its name")
    return data


def check_blob(view: ReadView, files: BlobStore, digest: str, size: int, *,
               hash_file: bool) -> None:
    """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes and
    hashes to its name (an inline row is always re-hashed; a file when `hash_file`)."""
    row = view.inline_blob(digest)
    if row is not None:
        if row[0] != size or len(row[1]) != size:
            raise BlobCorrupt(digest, f"the inline row holds {len(row[1])} bytes, {size} recorded")
        if digest_of(row[1]) != digest:
            raise BlobCorrupt(digest, "the inline row's bytes do not hash to its name")
        return
    found = files.size(digest)
    if found is None:
        raise BlobNotFound(digest)
    if found != size:
        raise BlobCorrupt(digest, f"the file holds {found} bytes, {size} were recorded")
    if hash_file:
        files.check(digest)


class SqliteBlobs:
    """`ledger.store.BlobBackend` for the SQLite store (see the module docstring)."""

    def __init__(self, store: Any) -> None:  # the SqliteStore (not imported: no cycle)
        self._store = store

    @property
    def root(self) -> str:
        return self._store.files.root

    def stat(self, digest: str) -> BlobStat | None:
        with self._store.read() as view:
            found = view.inline_stat(digest)
        if found is not None:
            return found
        f = self._store.files.stat(digest)
        return None if f is None else BlobStat(digest, f.size, False, f.mtime_ns)

    def read(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes:
        with self._store.read() as view:
            row = view.inline_blob(digest)
        if row is None:
            return self._store.files.read(digest, size=size, verify=verify)
        return inline_bytes(digest, row[1], size, verify)

    def chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """The bytes in bounded pieces (an inline row is one piece): BlobNotFound at once
        when missing; size and hash checked by the time the last piece is read."""
        with self._store.read() as view:
            row = view.inline_blob(digest)
        if row is None:
            return self._store.files.chunks(digest, size=size)
        return iter((inline_bytes(digest, row[1], size, True),))

    def put_stream(self, chunks: Iterable[bytes | memoryview], digest: str) -> PutResult:
        """Store bytes too large to be inline: a blob file, durable on return."""
        return self._store.files.put_stream(chunks, digest)

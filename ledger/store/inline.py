"""Blob bytes as both stores keep them: an inline row (`blob_data`), else the store's
larger blobs (SQLite: blob files; PostgreSQL: chunk rows).

One rule, written here once: a digest with an inline row is that row (written in the
transaction that records it; up to the ledger's inline threshold), anything else is the
store's `files` blob of that name (durable before any event names it). Reads check the
size they are given and the hash. `InlineBlobs` is each store's `BlobBackend`
(`SqliteBlobs`, `PgBlobs`); the store supplies `read()` (a view with the inline reads)
and `files` (its larger blobs: size, stat, read, chunks, check, put_stream).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..blobs import PutResult, digest_of
from ..errors import BlobCorrupt, BlobNotFound
from . import BlobStat, ReadView


def inline_bytes(digest: str, data: Any, size: int | None, verify: bool) -> bytes:
    """An inline row's bytes, checked against `size` and (if `verify`) the hash."""
    data = bytes(data)
    if size is not None and len(data) != size:
        raise BlobCorrupt(digest, f"the inline row holds {len(data)} bytes, {size} recorded")
    if verify and digest_of(data) != digest:
        raise BlobCorrupt(digest, "the inline row's bytes do not hash to its name")
    return data


def check_blob(view: ReadView, files: Any, digest: str, size: int, *,
               hash_file: bool) -> None:
    """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes and
    hashes to its name (an inline row is always re-hashed; a larger blob when
    `hash_file`). `files`: the store's larger blobs."""
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


class InlineBlobs:
    """`ledger.store.BlobBackend` over a store's inline rows and its `files` (see the
    module docstring)."""

    def __init__(self, store: Any) -> None:  # the store (not imported: no cycle)
        self._store = store

    @property
    def root(self) -> str | None:
        """The directory of the larger blobs (None: they are not on this machine's disk)."""
        return self._store.files.root

    # Each look-up below is one statement: the store's view, no read transaction.

    def stat(self, digest: str) -> BlobStat | None:
        found = self._store.view.inline_stat(digest)
        if found is not None:
            return found
        f = self._store.files.stat(digest)
        return None if f is None else BlobStat(digest, f.size, False, f.mtime_ns)

    def read(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes:
        row = self._store.view.inline_blob(digest)
        if row is None:
            return self._store.files.read(digest, size=size, verify=verify)
        return inline_bytes(digest, row[1], size, verify)

    def chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """The bytes in bounded pieces (an inline row is one piece): BlobNotFound at once
        when missing; size and hash checked by the time the last piece is read."""
        row = self._store.view.inline_blob(digest)
        if row is None:
            return self._store.files.chunks(digest, size=size)
        return iter((inline_bytes(digest, row[1], size, True),))

    def put_stream(self, chunks: Iterable[bytes | memoryview], digest: str) -> PutResult:
        """Store bytes too large to be inline: the store's larger blob, durable on return."""
        return self._store.files.put_stream(chunks, digest)


__all__ = ["InlineBlobs", "check_blob", "inline_bytes"]

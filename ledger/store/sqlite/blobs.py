"""The SQLite store's blob bytes: inline rows (`blob_data`), else blob files.

The rule (`ledger.store.inline`): a digest with an inline row is that row, anything
else is the blob file of that name (`ledger.blobs.BlobStore`: fsynced, renamed,
directory fsynced before any event names it). The inline rows' statements are the
shared ones (`ledger.store.sql`), rendered for SQLite.
"""

from __future__ import annotations

from typing import Final

from ..inline import InlineBlobs, check_blob, inline_bytes
from ..sql import SQLITE, Statements

_S: Final = Statements(SQLITE)
INLINE_SIZE: Final = _S.INLINE_SIZE
INLINE_BLOB: Final = _S.INLINE_BLOB
INLINE_STAT: Final = _S.INLINE_STAT
INLINE_DATA: Final = _S.INLINE_DATA
INLINE_FRESHEN: Final = _S.INLINE_FRESHEN
INLINE_PUT: Final = _S.INLINE_PUT
INLINE_DELETE: Final = _S.INLINE_DELETE
INLINE_ALL: Final = _S.INLINE_ALL


class SqliteBlobs(InlineBlobs):
    """`ledger.store.BlobBackend` for the SQLite store: the inline row, else the blob
    file (`InlineBlobs` over the store's `BlobStore`)."""


__all__ = ["SqliteBlobs", "check_blob", "inline_bytes"]

"""The SQLite store's blob bytes: inline rows (`blob_data`), else blob files.

The rule (`ledger.store.inline`): a digest with an inline row is that row, anything
else is the blob file of that name (`ledger.blobs.BlobStore`: fsynced, renamed,
directory fsynced before any event names it). The inline rows' statements are the
shared ones (`ledger.store.sql`), rendered for SQLite in `sql.S`.
"""

from __future__ import annotations

from ..inline import InlineBlobs, check_blob, inline_bytes


class SqliteBlobs(InlineBlobs):
    """`ledger.store.BlobBackend` for the SQLite store: the inline row, else the blob
    file (`InlineBlobs` over the store's `BlobStore`)."""


__all__ = ["SqliteBlobs", "check_blob", "inline_bytes"]

"""``steptrail export``'s reading: the ledger file's tables as plain rows, read-only.

The rows are read through sqlite-utils over a connection of the standard library's
sqlite3 module opened on a read-only URI (``mode=ro``: it never writes the file) with
``trusted_schema=OFF``, as a person pointing sqlite-utils or Datasette at the file would
read it: `events` by seq (the payload as JSON, the hashes in hex) and `steps` by first
seq (``live`` as a boolean). A row that cannot be read or decoded is a damaged ledger
(CorruptLedger, raised while iterating).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any, Final

import sqlite_utils

from ...errors import CorruptLedger
from .database import _readonly_uri

#: What each table is exported by.
_QUERIES: Final = {
    "events": "SELECT * FROM events ORDER BY seq",
    "steps": "SELECT * FROM steps ORDER BY first_seq",
}


def unexportable(path: str, exc: BaseException) -> CorruptLedger:
    """The error for a row of the ledger at `path` that cannot be exported."""
    return CorruptLedger(path, f"a row cannot be exported ({type(exc).__name__}: {exc})")


def _event(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row["payload"] = json.loads(row["payload"])
    row["prev_hash"] = bytes(row["prev_hash"]).hex()
    row["hash"] = bytes(row["hash"]).hex()
    return row


def _step(row: dict[str, Any]) -> dict[str, Any]:
    return dict(row, live=bool(row["live"]))


def _decoded(path: str, rows: Iterator[dict[str, Any]], what: str) -> Iterator[dict[str, Any]]:
    decode = _event if what == "events" else _step
    try:
        for row in rows:
            yield decode(row)
    except (sqlite3.Error, ValueError, TypeError, KeyError) as exc:  # a damaged row
        raise unexportable(path, exc) from None


@contextlib.contextmanager
def exported_rows(path: str, what: str) -> Iterator[Iterator[dict[str, Any]]]:
    """The rows of table `what` (``events`` or ``steps``) of the ledger file at `path`, in
    order, as dicts (see the module docstring); the connection is closed with the block."""
    conn = None
    try:
        conn = sqlite3.connect(_readonly_uri(path), uri=True)
        conn.execute("PRAGMA trusted_schema=OFF")
        db = sqlite_utils.Database(conn)
        yield _decoded(path, db.query(_QUERIES[what]), what)
    except sqlite3.Error as exc:
        raise unexportable(path, exc) from None
    finally:
        if conn is not None:
            conn.close()


__all__ = ["exported_rows", "unexportable"]

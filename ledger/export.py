"""The rows `steptrail export` prints: a ledger file's tables as plain rows, read-only.

A public module: the command line reaches the SQLite store's export through it. The
reading is the store's (`ledger/store/sqlite/export.py`: sqlite-utils over a read-only
connection of the standard library's sqlite3, as a person pointing sqlite-utils or
Datasette at the file would read it): `events` by seq (the payload as JSON, the hashes
in hex), `steps` by first seq (``live`` as a boolean). A ledger in a PostgreSQL
database is not exported here: copy it to a file first (`ledger.copying`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from .errors import CorruptLedger, InvalidInput
from .store import locate

#: The tables that can be exported: the event log and the step projection.
TABLES: Final = ("events", "steps")


def check_exportable(path: str) -> None:
    """InvalidInput, before anything is opened, unless `path` names a ledger file."""
    if not locate(path).local_file:
        raise InvalidInput("export reads a SQLite ledger file; for a PostgreSQL ledger copy"
                           " it to a file first: steptrail copy URL ledger.db, then"
                           " steptrail --ledger ledger.db export")


@contextlib.contextmanager
def export_rows(path: str, what: str) -> Iterator[Iterator[dict[str, Any]]]:
    """The rows of table `what` (one of `TABLES`) of the ledger file at `path`, in order,
    as dicts (see the module docstring), read-only; the connection is closed with the
    block. A row that cannot be read or decoded is CorruptLedger, raised while
    iterating. The file is not checked to be a ledger: open it first (`Ledger.open`)."""
    check_exportable(path)
    if what not in TABLES:
        raise InvalidInput(f"export {what!r}: not one of {', '.join(TABLES)}")
    with locate(path).backend.exported_rows(path, what) as rows:
        yield rows


def unexportable(path: str, exc: BaseException) -> CorruptLedger:
    """The error for a row of the ledger file at `path` that cannot be exported (its
    values cannot be written out: `exc`)."""
    return locate(path).backend.unexportable(path, exc)


__all__ = ["TABLES", "check_exportable", "export_rows", "unexportable"]

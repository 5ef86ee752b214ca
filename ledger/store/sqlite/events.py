"""The `events` table's SQL on SQLite: the insert, the columns (the shared statements,
`ledger.store.sql`, rendered for SQLite), paged reads.

Every read pages on `seq` in batches of READ_BATCH, each batch its own statement, so a
read of the whole log holds neither a long statement nor the log in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import apsw

from .. import ROW_NAMES, ROW_TYPES, make_event_row
from ..base import paged as base_paged
from ..base import row_problem
from ..sql import FOLD_COLUMNS, ROW_COLUMNS, prefix_range
from .errors import read_error
from .file import Database
from .tables import S  # the shared statements, rendered once for SQLite

READ_BATCH: Final = 2_000

INSERT_SQL: Final = S.INSERT_EVENT
HEAD_SQL: Final = S.HEAD
COUNT_SQL: Final = S.COUNT
TOTALS_BY_RUN_SQL: Final = S.TOTALS_BY_RUN
TOTALS_BY_TIME_SQL: Final = (f"SELECT (time_ns / ?) * ?, count(*), sum({S.EVENT_BYTES})"
                             " FROM events GROUP BY time_ns / ? ORDER BY 1")
JOURNAL_SQL: Final = S.JOURNAL
#: The newest event whose journal key lies in [low, high) (a seek on the key's index).
JOURNAL_RANGE_SQL: Final = (f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key >= ?"
                            " AND journal_key < ?{} ORDER BY seq DESC LIMIT 1")

_TEXT_COLUMNS: Final = frozenset({"workspace", "run", "step", "journal_key", "kind"})
_CHECKED_SQL: Final = S.CHECKED
#: The same with TEXT cells read as bytes: apsw decodes TEXT strictly, so one invalid
#: UTF-8 cell fails its whole batch; that batch is read again this way, row by row.
_RAW_SQL: Final = "SELECT {} FROM events WHERE seq > ? ORDER BY seq LIMIT ?".format(", ".join(
    f"CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END" if c in _TEXT_COLUMNS
    else c for c in ROW_NAMES))


query_sql = S.query


def paged(db: Database, sql: str, params: list[Any], start: int, limit: int | None,
          make: Callable[[Any], tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Rows of `sql` in batches of READ_BATCH (`store.base.paged`), paging on the first
    column (seq), each made by `make` (`make_event_row`, `make_fold_row`); a failed read
    is a typed error (`read_error`)."""
    def fetch(last: int, batch: int) -> list[tuple[Any, ...]]:
        try:
            return list(map(make, db.conn.execute(sql, (last, *params, batch)).fetchall()))
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise read_error(exc, db.path) from None

    return base_paged(fetch, start, limit, READ_BATCH)  # type: ignore[no-any-return]


def checked_rows(conn: apsw.Connection, after_seq: int = 0
                 ) -> Iterator[tuple[tuple[Any, ...], str | None]]:
    """Every events row in seq order with what is wrong with its cells (None: nothing)."""
    last = after_seq
    while True:
        try:
            got = [(make_event_row(r), None if tuple(map(type, r)) == ROW_TYPES else row_problem(r))
                   for r in conn.execute(_CHECKED_SQL, (last, READ_BATCH)).fetchall()]
        except UnicodeDecodeError:
            got = [_decode_row(r) for r in conn.execute(_RAW_SQL, (last, READ_BATCH)).fetchall()]
        yield from got
        if len(got) < READ_BATCH:
            return
        last = got[-1][0][0]


def _decode_row(row: tuple[Any, ...]) -> tuple[tuple[Any, ...], str | None]:
    """The row with its TEXT cells decoded, and what is wrong with it (None: nothing)."""
    out = list(row)
    for i, name in enumerate(ROW_NAMES):
        if name in _TEXT_COLUMNS and isinstance(out[i], bytes):
            try:
                out[i] = out[i].decode("utf-8")
            except UnicodeDecodeError:
                return make_event_row(out), f"its {name} is not valid UTF-8"
    return make_event_row(out), row_problem(tuple(out))


__all__ = ["FOLD_COLUMNS", "READ_BATCH", "ROW_COLUMNS", "checked_rows", "paged", "prefix_range", "query_sql"]

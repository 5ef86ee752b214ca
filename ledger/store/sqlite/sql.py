"""The SQLite store's statements: the shared ones (`ledger.store.sql`) rendered for
SQLite (`S`), the few that differ in more than form (the newest journal key of a range,
the totals by time), and the reads that run them: paged event reads and the checked
reads of damaged rows, one projection row by key.

Every events read pages on `seq` in batches of READ_BATCH, each batch its own
statement, so a read of the whole log holds neither a long statement nor the log in
memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import apsw

from .. import ROW_NAMES, ROW_TYPES, make_event_row
from ..base import paged as base_paged
from ..base import row_problem
from ..rows import PathState, StepRow, WsRow
from ..sql import (FOLD_COLUMNS, ROW_COLUMNS, SQLITE, STEP_COLUMNS, WS_COLUMNS, Statements,
                   many_rows, prefix_range)
from .driver import read_error
from .database import Database

S: Final = Statements(SQLITE)
in_flight = S.in_flight
select_steps = S.select_steps
query = S.query

READ_BATCH: Final = 2_000

#: The most events one INSERT statement carries (14 parameters a row, well under
#: SQLite's 32,766); a larger batch is inserted row by row under a savepoint.
MULTI_ROW_MAX: Final = 1_000


@functools.lru_cache(maxsize=64)
def insert_events(n: int) -> str:
    """One INSERT of `n` event rows."""
    one = "(" + ", ".join("?" * len(ROW_NAMES)) + ")"
    return f"INSERT INTO events({ROW_COLUMNS}) VALUES " + ", ".join([one] * n)


#: The most parameters one statement `run_many` makes carries (SQLite's limit: 32,766).
PARAMS_MAX: Final = 16_000


def run_many(conn: apsw.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run `sql` for each of `rows`: in as few statements as `many_rows` allows (chunks of
    at most PARAMS_MAX parameters), else one statement a row."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
        return
    width = len(rows[0]) if rows else 1
    step = max(1, PARAMS_MAX // max(1, width))
    if not rows or many_rows(sql, min(len(rows), step), "?") is None:
        conn.executemany(sql, rows)
        return
    for i in range(0, len(rows), step):
        chunk = rows[i:i + step]
        conn.execute(many_rows(sql, len(chunk), "?"), [cell for row in chunk for cell in row])

TOTALS_BY_TIME: Final = (f"SELECT (time_ns / ?) * ?, count(*), sum({S.EVENT_BYTES})"
                         " FROM events GROUP BY time_ns / ? ORDER BY 1")
#: The newest event whose journal key lies in [low, high) (a seek on the key's index).
JOURNAL_RANGE: Final = (f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key >= ?"
                        " AND journal_key < ?{} ORDER BY seq DESC LIMIT 1")

_TEXT_COLUMNS: Final = frozenset({"workspace", "run", "step", "journal_key", "kind"})
_CHECKED_SQL: Final = S.CHECKED
#: The same with TEXT cells read as bytes: apsw decodes TEXT strictly, so one invalid
#: UTF-8 cell fails its whole batch; that batch is read again this way, row by row.
_RAW_SQL: Final = "SELECT {} FROM events WHERE seq > ? ORDER BY seq LIMIT ?".format(", ".join(
    f"CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END" if c in _TEXT_COLUMNS
    else c for c in ROW_NAMES))



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


def load_step(conn: apsw.Connection, step_id: str) -> StepRow | None:
    row = conn.execute(S.SELECT_STEP, (step_id,)).fetchone()
    return None if row is None else StepRow.from_tuple(row)


def load_workspace(conn: apsw.Connection, name: str) -> WsRow | None:
    row = conn.execute(S.SELECT_ONE_WS, (name,)).fetchone()
    return None if row is None else WsRow.from_tuple(row)


def load_path(conn: apsw.Connection, workspace: str, path: str) -> PathState | None:
    row = conn.execute(S.SELECT_PATH, (workspace, path)).fetchone()
    return None if row is None else (int(row[0]), row[1], int(row[2]))


_TYPES: Final = {
    "ws_paths": (str, str, int, (str, None), int),
    "pins": (str, int, str, str, int),
    "manifests": (str, int, int, str, (str, None), int),
    "manifest_entries": (str, int, str, str, str, int),
}


def check_types(table: str, row: tuple[object, ...]) -> tuple[object, ...]:
    """`row` if its cells hold their declared storage class (a damaged record can yield
    NULL or another class), else TypeError — which a read reports as CorruptLedger."""
    for value, want in zip(row, _TYPES[table], strict=True):
        if isinstance(want, tuple):
            if value is None and None in want:
                continue
            want = want[0]
        if type(value) is not want:
            raise TypeError(f"a {table} row holds a {type(value).__name__} where a"
                            f" {want.__name__} belongs")  # type: ignore[union-attr]
    return row


__all__ = ["FOLD_COLUMNS", "READ_BATCH", "ROW_COLUMNS", "STEP_COLUMNS", "WS_COLUMNS", "check_types",
           "checked_rows", "in_flight", "load_path", "load_step", "load_workspace", "paged",
           "prefix_range", "query", "select_steps"]

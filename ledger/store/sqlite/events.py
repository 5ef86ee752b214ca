"""The `events` table's SQL: the insert, the columns, paged reads.

Every read pages on `seq` in batches of READ_BATCH, each batch its own statement, so a
read of the whole log holds neither a long statement nor the log in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import apsw

from ...store import ROW_NAMES, ROW_TYPES, EventQuery
from ...store.base import paged as base_paged
from ...store.base import row_problem
from .errors import read_error
from .file import Database

READ_BATCH: Final = 2_000

ROW_COLUMNS: Final = ", ".join(ROW_NAMES)
INSERT_SQL: Final = (
    f"INSERT INTO events({ROW_COLUMNS}) VALUES ({', '.join('?' * len(ROW_NAMES))})"
)
#: The columns a projection fold needs.
FOLD_COLUMNS: Final = "seq, time_ns, kind, v, payload"
HEAD_SQL: Final = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
COUNT_SQL: Final = "SELECT count(*) FROM events"
#: an event's bytes as `steptrail stats` counts them: payload, journal key, two hashes
_EVENT_BYTES: Final = "length(payload) + length(CAST(journal_key AS BLOB)) + 64"
TOTALS_BY_RUN_SQL: Final = (f"SELECT run, kind, count(*), sum({_EVENT_BYTES}), min(time_ns),"
                            " max(time_ns) FROM events GROUP BY run, kind ORDER BY run, kind")
TOTALS_BY_TIME_SQL: Final = (f"SELECT (time_ns / ?) * ?, count(*), sum({_EVENT_BYTES})"
                             " FROM events GROUP BY time_ns / ? ORDER BY 1")
JOURNAL_SQL: Final = f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key = ?"
#: The newest event whose journal key lies in [low, high) (a seek on the key's index).
JOURNAL_RANGE_SQL: Final = (f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key >= ?"
                            " AND journal_key < ?{} ORDER BY seq DESC LIMIT 1")

_TEXT_COLUMNS: Final = frozenset({"workspace", "run", "step", "journal_key", "kind"})
_CHECKED_SQL: Final = f"SELECT {ROW_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
#: The same with TEXT cells read as bytes: apsw decodes TEXT strictly, so one invalid
#: UTF-8 cell fails its whole batch; that batch is read again this way, row by row.
_RAW_SQL: Final = "SELECT {} FROM events WHERE seq > ? ORDER BY seq LIMIT ?".format(", ".join(
    f"CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END" if c in _TEXT_COLUMNS
    else c for c in ROW_NAMES))


def query_sql(q: EventQuery, columns: str = ROW_COLUMNS) -> tuple[str, list[Any]]:
    """The paged statement for `q` (its first parameter: the seq to page from, its last:
    the batch size) and the parameters in between."""
    where = ["seq < ?" if q.descending else "seq > ?"]
    params: list[Any] = []
    if q.descending and q.after_seq:
        where.append("seq > ?")
        params.append(q.after_seq)
    if q.step is not None:
        where.append("step = ?")
        params.append(q.step)
    if q.attempt is not None:
        where.append("attempt = ?")
        params.append(q.attempt)
    if q.kinds is not None:
        kinds = sorted(q.kinds)
        where.append("kind = ?" if len(kinds) == 1 else f"kind IN ({', '.join('?' * len(kinds))})")
        params.extend(kinds)
    if q.run is not None:
        where.append("run = ?")
        params.append(q.run)
    if q.workspace is not None:
        where.append("workspace = ?")
        params.append(q.workspace)
    order = "seq DESC" if q.descending else "seq"
    return f"SELECT {columns} FROM events WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?", params


def paged(db: Database, sql: str, params: list[Any], start: int, limit: int | None
          ) -> Iterator[tuple[Any, ...]]:
    """Rows of `sql` in batches of READ_BATCH (`store.base.paged`), paging on the first
    column (seq); a failed read is a typed error (`read_error`)."""
    def fetch(last: int, batch: int) -> list[tuple[Any, ...]]:
        try:
            return db.conn.execute(sql, (last, *params, batch)).fetchall()  # type: ignore[no-any-return]
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise read_error(exc, db.path) from None

    return base_paged(fetch, start, limit, READ_BATCH)  # type: ignore[no-any-return]


def checked_rows(conn: apsw.Connection, after_seq: int = 0
                 ) -> Iterator[tuple[tuple[Any, ...], str | None]]:
    """Every events row in seq order with what is wrong with its cells (None: nothing)."""
    last = after_seq
    while True:
        try:
            got = [(r, None if tuple(map(type, r)) == ROW_TYPES else row_problem(r))
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
                return tuple(out), f"its {name} is not valid UTF-8"
    return tuple(out), row_problem(tuple(out))


def prefix_range(prefix: str) -> tuple[str, str]:
    """[low, high): exactly the texts that start with `prefix`, in byte order (SQLite's
    BINARY collation compares UTF-8 bytes, which sort as code points do)."""
    if not prefix:
        raise ValueError("an empty prefix names every key")
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)

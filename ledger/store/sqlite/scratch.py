"""Whole-log folds in SQLite (`ledger.store.scratch`, with what SQLite does its own way):
the scratch tables are connection-private TEMP tables (disk-backed: SQLite's temp
store, never in the ledger file), each made from the very DDL of the ledger's table;
the ledger's tables are named ``main.``, the scratch ones ``temp.``; a rebuild drops the
secondary indexes for its bulk load and makes them again; the live entries are one
streamed statement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import apsw

from .. import RowsUnreadable
from ..scratch import RebuildSink, Scratch, TableSink, empty_projections
from ..sql import SQLITE, Statements

_Q: Final = Statements(SQLITE)
_INDEXES: Final = ("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
                   " AND tbl_name IN ('pins', 'manifest_entries') ORDER BY name")


class SqliteSpace:
    """`ledger.store.scratch.Space` on one SQLite connection."""

    q = _Q
    page: int | None = None  # one streamed statement

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn

    def run(self, sql: str, params: Sequence[object] | None = None) -> Any:
        return self.conn.execute(sql, params)

    def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)

    def rows(self, sql: str) -> Iterable[tuple[Any, ...]]:
        return self.conn.execute(sql)  # type: ignore[no-any-return]  # a cursor, not a list

    @staticmethod
    def table(name: str) -> str:
        return f"main.{name}"

    @staticmethod
    def temp(name: str) -> str:
        return f"temp.{name}"

    def create_temp_like(self, table: str, temp: str) -> None:
        """CREATE TEMP TABLE `temp` from the very DDL of the ledger's `table` (same
        columns, types, key); TypeError when that DDL is not the one steptrail wrote."""
        row = self.conn.execute("SELECT sql FROM main.sqlite_schema WHERE type = 'table'"
                                " AND name = ?", (table,)).fetchone()
        prefix = f"CREATE TABLE {table}("
        if row is None or not isinstance(row[0], str) or not row[0].startswith(prefix):
            raise TypeError(f"the {table} table's schema is not the one steptrail created")
        self.conn.execute(f"CREATE TEMP TABLE {temp}(" + row[0][len(prefix):])


@contextlib.contextmanager
def rebuilding(conn: apsw.Connection) -> Iterator[RebuildSink]:
    """Empty the projection tables for a bulk load inside the caller's write transaction:
    the secondary indexes (random digests) are dropped and made again from their own SQL
    at the end (DDL is transactional: a crash leaves them as they were)."""
    indexes = conn.execute(_INDEXES).fetchall()
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    yield empty_projections(SqliteSpace(conn))
    for _, sql in indexes:
        conn.execute(sql)


@contextlib.contextmanager
def scratch(conn: apsw.Connection) -> Iterator[Scratch]:
    """The scratch copy for the block; what SQLite cannot read while making or comparing
    it (a damaged page, a malformed schema) is RowsUnreadable, which verify reports."""
    s = Scratch(SqliteSpace(conn))
    try:
        s.create()
        yield s
    except apsw.Error as exc:
        raise RowsUnreadable(f"{type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(apsw.Error):
            s.drop()


__all__ = ["RebuildSink", "Scratch", "SqliteSpace", "TableSink", "rebuilding", "scratch"]

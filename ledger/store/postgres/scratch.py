"""Whole-log folds on PostgreSQL (`ledger.store.scratch`, with what PostgreSQL does its
own way): the scratch tables are TEMP tables of the session (beside a REPEATABLE READ
snapshot), each made LIKE the ledger's table; both are named as the search path finds
them (the session's temporary schema first), but a drop names ``pg_temp``, so it can
never drop a ledger table; the live entries are read in pages (a client-side cursor
holds its whole result). As on SQLite, memory follows the unfinished steps, not the
events: the server spills the comparisons (EXCEPT both ways).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from ...errors import StorageFailure
from .. import RowsUnreadable
from ..scratch import RebuildSink, Scratch, TableSink, empty_projections
from ..sql import POSTGRES, Statements

_Q: Final = Statements(POSTGRES)


class PgSpace:
    """`ledger.store.scratch.Space` on the store's connection."""

    q = _Q
    page: int | None = 2000

    def __init__(self, store: Any) -> None:
        self.store = store

    def run(self, sql: str, params: Sequence[object] | None = None) -> Any:
        return self.store._run(sql, params)

    def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.store._run_many(sql, rows)

    def rows(self, sql: str) -> Iterable[tuple[Any, ...]]:
        return self.store._run(sql).fetchall()  # type: ignore[no-any-return]

    @staticmethod
    def table(name: str) -> str:
        return name

    @staticmethod
    def temp(name: str) -> str:
        return name

    def create_temp_like(self, table: str, temp: str) -> None:
        self.store._run(f"CREATE TEMP TABLE {temp} (LIKE {table} INCLUDING ALL)")


@contextlib.contextmanager
def rebuilding(store: Any) -> Iterator[RebuildSink]:
    """Empty the projection tables inside the caller's write transaction (readers see the
    old rows until it commits)."""
    yield empty_projections(PgSpace(store))


@contextlib.contextmanager
def scratch(store: Any) -> Iterator[Scratch]:
    s = Scratch(PgSpace(store))
    try:
        s.create()
        yield s
    except StorageFailure as exc:
        raise RowsUnreadable(str(exc)) from None
    finally:
        with contextlib.suppress(Exception):
            s.drop()


__all__ = ["PgSpace", "RebuildSink", "Scratch", "TableSink", "rebuilding", "scratch"]

"""The PostgreSQL driver, imported on first use: psycopg 3 is an extra
(``pip install 'steptrail[postgres]'``), so the core imports without it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import InvalidInput
from ..view import Driver


def _psycopg() -> Any:
    """The psycopg module, or InvalidInput naming the extra that installs it."""
    try:
        import psycopg
    except ImportError:
        from ...extras import install_hint

        raise InvalidInput("a postgresql:// ledger needs the PostgreSQL extra: "
                           + install_hint("postgres")) from None
    return psycopg


class _Never(Exception):
    """Raised by nothing: what `driver_errors` names when psycopg is not installed."""


def driver_errors() -> tuple[type[BaseException], type[BaseException]]:
    """(a lost connection, any other driver error) as psycopg names them, for the
    command line's last resort (it imports no driver)."""
    try:
        import psycopg
    except ImportError:
        return _Never, _Never
    return psycopg.OperationalError, psycopg.Error


def _first_line(exc: BaseException) -> str:
    """The first line of a driver error's message (the rest is the server's detail)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__




class PgDriver(Driver):
    """`ledger.store.view.Driver` over a `PgStore`'s connection: every statement runs
    through the store (`_run`: reconnecting outside a transaction, errors translated), a
    set of values is one array parameter, and many rows go as `_run_many` makes them
    (multi-row statements, never the driver's pipelined executemany); a write nobody
    reads the answer of (`later`) waits, in a write transaction, for the next statement
    sent (`PgStore._defer`)."""

    mark = "%s"
    #: The most parameters one multi-row statement carries (the protocol's limit: 65,535).
    params_max = 30_000

    def __init__(self, store: Any) -> None:
        self._store = store
        self.where = store.location

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self._store._run(sql, params).fetchone()  # type: ignore[no-any-return]

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._store._run(sql, params).fetchall()  # type: ignore[no-any-return]

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return int(self._store._run(sql, params).rowcount)

    def many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._store._run_many(sql, rows)

    execute_each = many

    def later(self, sql: str, params: Sequence[object] = ()) -> None:
        self._store._defer(sql, params)

    def many_later(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._store._defer_many(sql, rows)

    def in_values(self, template: str, values: Sequence[object],
                  before: Sequence[object] = ()) -> Iterator[tuple[str, list[object]]]:
        yield template, [*before, list(values)]


__all__ = ["PgDriver", "_first_line", "_psycopg", "driver_errors"]

"""The PostgreSQL driver, imported on first use: psycopg 3 is an extra
(``pip install 'steptrail[postgres]'``), so the core imports without it."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidInput


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


__all__ = ["_first_line", "_psycopg", "driver_errors"]

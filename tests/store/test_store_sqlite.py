"""The SQLite store passes the store contract (tests/store/store_contract.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from store_contract import StoreContract

from ledger.store.sqlite.database import Database
from ledger.store.sqlite import SqliteStore


def open_sqlite(location: str, clock: Callable[[], int], create: bool) -> SqliteStore:
    db = Database.create(location)[0] if create else Database.open(location)
    return SqliteStore(db, clock)


class TestSqliteStore(StoreContract):
    opener = staticmethod(open_sqlite)

    def location(self, tmp_path: Path) -> str:
        return str(tmp_path / "ledger.db")

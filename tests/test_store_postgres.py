"""The PostgreSQL store passes the store contract (tests/store_contract.py), on a
throwaway server the test run starts (tests/conftest.py: `pg_url`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store_contract import StoreContract

from ledger.store import Store
from ledger.store.postgres import PgStore, is_url
from ledger.store.sqlite import SqliteStore
from ledger.store.sqlite.file import Database


def open_pg(location: str, clock: Callable[[], int], create: bool) -> Store:
    """A PostgreSQL store at a URL; a path is a SQLite file (what `snapshot` writes)."""
    if not is_url(location):
        return SqliteStore(Database.open(location), clock)
    if create:
        return PgStore.create(location, clock=clock)[0]
    return PgStore.open(location, clock=clock)


class TestPostgresStore(StoreContract):
    opener = staticmethod(open_pg)

    @pytest.fixture
    def where(self, pg_url: str, tmp_path: Path) -> str:
        self._tmp = tmp_path
        return pg_url

    def snapshot_target(self, where: str) -> str:
        return os.path.join(self._tmp, "snapshot.db")

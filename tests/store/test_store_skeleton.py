"""The cost of a third store (issue 38): `store_sqlite3.py`, a store over Python's own
`sqlite3` module, written against `ledger.store.view`'s driver, passes the whole store
contract — in under 400 lines, importing nothing of the SQLite store's."""

from __future__ import annotations

import ast
from pathlib import Path

from store_contract import StoreContract
from store_sqlite3 import open_sqlite3

SKELETON = Path(__file__).parent / "store_sqlite3.py"


class TestSqlite3Skeleton(StoreContract):
    opener = staticmethod(open_sqlite3)

    def location(self, tmp_path: Path) -> str:
        return str(tmp_path / "ledger.db")


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_the_skeleton_is_small_and_its_own() -> None:
    lines = len(SKELETON.read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"the skeleton store is {lines} lines"
    theirs = {m for m in imports_of(SKELETON) if m.startswith("ledger.store.sqlite")
              or m.startswith("ledger.store.postgres") or m == "apsw"}
    assert not theirs, f"the skeleton imports another store's code: {theirs}"


def test_the_check_catches_a_borrowed_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from ledger.store.sqlite.driver import translate\n")
    assert "ledger.store.sqlite.driver" in imports_of(planted)

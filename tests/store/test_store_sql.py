"""The stores' SQL rendered from one source (`ledger.store.sql`): each store's statements
in its dialect, the events table defined once, and neither store importing the other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ledger.store import ROW_NAMES
from ledger.store.sql import EVENT_COLUMNS, POSTGRES, SQLITE, Statements

STORE = Path(__file__).resolve().parents[2] / "ledger" / "store"

#: The events table as version 1 of the SQLite schema wrote it: every ledger file holds
#: this text verbatim (`sqlite_schema`), and its schema check compares it, so the
#: rendering from `EVENT_COLUMNS` must never change it.
SQLITE_EVENTS_V1 = """CREATE TABLE events(
  seq INTEGER PRIMARY KEY,
  time_ns INTEGER NOT NULL,
  workspace TEXT NOT NULL,
  run TEXT NOT NULL,
  step TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  rev INTEGER NOT NULL,
  journal_key TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  v INTEGER NOT NULL,
  payload BLOB NOT NULL,
  prev_hash BLOB NOT NULL,
  hash BLOB NOT NULL
) STRICT;"""

PG_EVENTS = ('seq bigint PRIMARY KEY, time_ns bigint NOT NULL, workspace text COLLATE "C"'
             ' NOT NULL, run text COLLATE "C" NOT NULL, step text COLLATE "C" NOT NULL,'
             ' attempt bigint NOT NULL, epoch bigint NOT NULL, rev bigint NOT NULL,'
             ' journal_key text COLLATE "C" NOT NULL UNIQUE, kind text COLLATE "C" NOT NULL,'
             ' v bigint NOT NULL, payload bytea NOT NULL, prev_hash bytea NOT NULL,'
             ' hash bytea NOT NULL')


def test_the_events_table_is_defined_once_and_renders_as_each_store_wrote_it() -> None:
    from ledger.store.postgres.schema import TABLES
    from ledger.store.sqlite.archive import SCHEMA
    from ledger.store.sqlite.schema import MIGRATIONS, events_table

    assert tuple(c[0] for c in EVENT_COLUMNS) == ROW_NAMES
    assert events_table() == SQLITE_EVENTS_V1
    assert "\n" + SQLITE_EVENTS_V1 + "\n" in MIGRATIONS[1]
    # a seal's archive: the same columns, no UNIQUE journal key (format version 1)
    archived = SQLITE_EVENTS_V1.replace("journal_key TEXT NOT NULL UNIQUE",
                                        "journal_key TEXT NOT NULL")
    assert "\n" + archived + "\n" in SCHEMA
    assert TABLES["events"] == PG_EVENTS


def _attributes(s: Statements) -> dict[str, str]:
    return {k: v for k, v in vars(s).items() if k.isupper() and isinstance(v, str)}


def test_each_dialect_renders_its_own_placeholders_and_forms() -> None:
    lite, pg = _attributes(Statements(SQLITE)), _attributes(Statements(POSTGRES))
    assert lite.keys() == pg.keys() and len(lite) > 40
    for name in lite:
        assert "%s" not in lite[name], name
        assert "?" not in pg[name], name
        for sqlite_only in ("INSERT OR", "GLOB", "CAST(", "CROSS JOIN"):
            assert sqlite_only not in pg[name], name
        assert "ON CONFLICT DO NOTHING" not in lite[name] and "octet_length" not in lite[name]
    assert lite["ADD_PINS"].startswith("INSERT OR IGNORE INTO pins(")
    assert pg["ADD_PINS"].endswith(" ON CONFLICT DO NOTHING")
    assert lite["ADD_MANIFESTS"].startswith("INSERT OR REPLACE INTO {}(")
    assert pg["ADD_MANIFESTS"].endswith(" ON CONFLICT(step, manifest_rev) DO UPDATE SET"
                                        " attempt = excluded.attempt, digest = excluded.digest,"
                                        " supersedes = excluded.supersedes, seq = excluded.seq")
    assert lite["INLINE_UPSERT"].endswith(" ON CONFLICT(digest) DO UPDATE SET size = excluded.size,"
                                          " data = excluded.data, stored_ns = excluded.stored_ns")
    # what is the same on both stores is the same text
    assert lite["SELECT_STEP"].replace("?", "%s") == pg["SELECT_STEP"]
    assert lite["UPSERT_STEP"].replace("?", "%s") == pg["UPSERT_STEP"]


def test_a_literal_percent_is_refused_on_postgres() -> None:
    with pytest.raises(ValueError):
        POSTGRES.render("SELECT 1 WHERE x LIKE 'a%'")
    assert SQLITE.render("SELECT 1 WHERE x LIKE 'a%'") == "SELECT 1 WHERE x LIKE 'a%'"


def _imported(path: Path, package: str) -> set[str]:
    """The modules `path` (a module of `package`) imports, lazy ones included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = parent + ("." + base if base else "")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("store, other", [("sqlite", "postgres"), ("postgres", "sqlite")])
def test_no_store_imports_the_other(store: str, other: str) -> None:
    found = {}
    for path in sorted((STORE / store).rglob("*.py")):
        package = "ledger.store." + ".".join(path.relative_to(STORE).parent.parts)
        bad = sorted(m for m in _imported(path, package)
                     if m == f"ledger.store.{other}" or m.startswith(f"ledger.store.{other}."))
        if bad:
            found[path.name] = bad
    assert found == {}


def test_the_neutral_modules_import_no_store() -> None:
    for name in ("sql.py", "inline.py", "scratch.py"):
        imported = _imported(STORE / name, "ledger.store")
        assert not {m for m in imported if m.startswith(("ledger.store.sqlite",
                                                         "ledger.store.postgres"))}, name

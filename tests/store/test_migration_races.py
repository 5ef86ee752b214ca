"""Opens racing a migration (found by a red team of format v6; each failed before its fix).

1. Two first read-write opens of a v5 file: both read version 5 before the write lock;
   the loser re-ran migration 6 on the migrated file and its open failed with a raw
   apsw.SQLError. The version is read again under the write lock.
2. The same race on PostgreSQL: `migrate` judged the schema against v5 before its lock,
   saw v6's trigger as "added" and the sound ledger was refused. Judged under the lock.
3. The read-only stand-ins (TEMP tables for the tables a v1-v3 file lacks) outlived the
   file's migration by another process: the reader's empty TEMP tables shadowed the real
   ones. A read-only connection follows the file's version and drops them.
4. catch_up took any checkpoint row saying FOLLOWS for the steps' own.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from ledger import Ledger
from ledger.store.sqlite import database as sqlite_database
from ledger.store.sqlite import schema as sqlite_schema

pytestmark = pytest.mark.sqlite_only

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ledgers"


def unpack(version: int, into: Path) -> str:
    with tarfile.open(FIXTURES / f"v{version}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return str(into / "ledger" / "ledger.db")


def test_two_first_opens_of_a_v5_file_both_succeed(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The race, made deterministic: between this open's version check and its migration
    transaction, another opener migrates the file (what happens when several workers start
    together after an upgrade; tools: six processes racing hit it in 3 of 6 trials)."""
    db = unpack(5, tmp_path)
    original = sqlite_database.Database._migrate
    raced = []

    def migrate_after_another_opener(self: sqlite_database.Database, version: int) -> None:
        if not raced:
            raced.append(True)
            Ledger.open(db).close()  # the other opener wins the write lock first
        original(self, version)

    monkeypatch.setattr(sqlite_database.Database, "_migrate", migrate_after_another_opener)
    with Ledger.open(db) as led:  # fails: SQLError trigger checkpoint_follows_insert exists
        assert led.storage.info.version == sqlite_schema.SCHEMA_VERSION
        assert led.verify().ok


def test_a_reader_open_across_a_migration_sees_the_real_tables(tmp_path: Path) -> None:
    db = unpack(1, tmp_path)
    root = tmp_path / "ws-root"
    root.mkdir()
    with Ledger.open(db, readonly=True) as reader:  # a v1 file: TEMP stand-ins made
        assert reader.workspaces.list() == []
        with Ledger.open(db) as writer:  # another process migrates it and goes on
            writer.workspaces.add("w1", str(root))
            assert [w.name for w in writer.workspaces.list()] == ["w1"]
            head = writer.head()
        assert reader.head() == head  # the reader sees the new events ...
        # ... but not the workspace: the empty TEMP `workspaces` shadows the real one
        assert [w.name for w in reader.workspaces.list()] == ["w1"]
        report = reader.verify()
        assert report.ok, report.findings


def test_two_first_opens_of_a_v5_postgresql_ledger_both_succeed(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race on PostgreSQL: `migrate` judges `schema_changes(conn, 5)` before it
    takes the init lock; when another opener migrated meanwhile, the ledger's v6 trigger
    reads as 'added' to a v5 schema, so nothing is migrated and the open is refused
    (NotALedger) although the ledger is a sound v6 one."""
    import psycopg

    from ledger.store.postgres import schema as sch
    Ledger.init(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what a v5 writer leaves
        conn.execute("DROP TRIGGER checkpoint_follows ON projection_checkpoint")
        conn.execute("DROP FUNCTION stepledger_checkpoint_follows()")
        conn.execute("UPDATE projection_checkpoint SET last_seq ="
                     " coalesce((SELECT max(seq) FROM events), 0)")
        conn.execute("UPDATE stepledger_schema SET version = 5")
    original = sch.migrate
    raced = []

    def migrate_after_another_opener(conn, version, init_lock):  # type: ignore[no-untyped-def]
        if not raced:
            raced.append(True)
            Ledger.open(pg_url).close()  # the other opener migrates first
        return original(conn, version, init_lock)

    monkeypatch.setattr(sch, "migrate", migrate_after_another_opener)
    with Ledger.open(pg_url) as led:
        assert led.storage.info.version == sch.SCHEMA_VERSION


def test_a_stray_following_row_does_not_hide_a_lagging_steps_checkpoint(
        tmp_path: Path) -> None:
    import apsw

    from ledger.runner import run_step
    db = str(tmp_path / "ledger.db")
    with Ledger.init(db) as led:
        run_step(led, "a", {"a.txt": b"a"})
        mark = led.head().seq
        run_step(led, "b", {"b.txt": b"b"})
    conn = apsw.Connection(db)
    conn.execute("DELETE FROM steps WHERE step_id = 'b'; DELETE FROM manifests WHERE step = 'b';"
                 " DELETE FROM manifest_entries WHERE step = 'b'; DELETE FROM pins WHERE step = 'b'")
    conn.execute("UPDATE projection_checkpoint SET last_seq = ?", (mark,))
    conn.execute("INSERT INTO projection_checkpoint VALUES ('stray', -1, 1)")
    conn.close()
    with Ledger.open(db) as led:  # catches the steps' checkpoint up despite the stray row
        assert led.step("b").state == "acked" and led.projection_lag() == 0
        with led.storage.read() as view:
            assert ("steps", -1) in [(n, last) for n, last, _ in view.checkpoint_rows()]

"""`steptrail backup` of a ledger in PostgreSQL: the snapshot is a SQLite copy of its
tables, the blobs come out of its chunk rows; the backup restores as a SQLite ledger
(then `copy` moves it back into a database) with the same head."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from ledger import Ledger
from ledger.backup import backup
from ledger.copying import copy_ledger
from ledger.demo import run_demo


def test_a_postgresql_ledger_backs_up_restores_and_copies_back(pg_url: str, pg_server,
                                                              tmp_path: Path) -> None:
    run_demo(echo=lambda *_: None, ledger=pg_url)
    with Ledger.open(pg_url, readonly=True) as led:
        head = str(led.head())
    dest = tmp_path / "backup"
    report = backup(pg_url, dest)
    assert report.blobs >= 1 and f"{report.head_seq}:{report.head_hash}" == head
    again = backup(pg_url, dest)
    assert again.unchanged
    assert run_cli(["backup", "verify", str(dest)]).code == 0
    got = run_cli(["backup", "restore", str(dest), str(tmp_path / "restored")])
    assert got.code == 0, got.err
    restored = tmp_path / "restored" / "ledger.db"
    with Ledger.open(restored, readonly=True) as led:
        assert str(led.head()) == head and led.verify().ok
    back = pg_server.create_database("backup_copied_back")
    copy_ledger(str(restored), back)
    with Ledger.open(back, readonly=True) as led:
        assert str(led.head()) == head and led.verify().ok

"""Concurrent creators of one ledger: every `Ledger.init` gets the one ledger.

A creator that judged the file while another init was midway (page 1 switched to WAL,
no schema yet) and looked again after that init finished used to refuse a finished
ledger as NotALedger (application_id 0): about 1 in 90 of several MCP servers starting
at once on a fresh workspace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledger import Ledger, NotALedger
from ledger.store.sqlite import database as dbmod

CREATE = """
import sys, time
from ledger import Ledger
path, start = sys.argv[1], float(sys.argv[2])
while time.time() < start:
    pass
with Ledger.init(path) as led:
    assert led.verify().ok
"""


def test_a_ledger_finished_between_two_looks_is_opened_not_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race made deterministic: the first judgement sees the midway state (refused
    as never initialized), the look after it sees a finished ledger."""
    path = str(tmp_path / "ledger.db")
    Ledger.init(path).close()
    real_open = dbmod.Database.open.__func__  # type: ignore[attr-defined]
    calls = []

    def open_midway(cls, p, **kw):  # type: ignore[no-untyped-def]
        calls.append(p)
        if len(calls) == 1:
            raise NotALedger(p, "SQLite application_id is 0x0, not steptrail's")
        return real_open(cls, p, **kw)

    monkeypatch.setattr(dbmod.Database, "open", classmethod(open_midway))
    db, created = dbmod.Database.create(path)
    db.close()
    assert created is False and len(calls) == 2


def test_a_file_that_is_not_a_ledger_is_still_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"not a ledger, " * 20)
    before = path.read_bytes()
    with pytest.raises(NotALedger):
        Ledger.init(str(path))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]


def test_many_processes_creating_one_ledger_all_get_it(tmp_path: Path) -> None:
    import time
    for round_ in range(6):
        path = tmp_path / f"r{round_}" / "ledger.db"
        start = time.time() + 0.4
        procs = [subprocess.Popen([sys.executable, "-c", CREATE, str(path), str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(6)]
        results = [p.communicate(timeout=60) for p in procs]
        failed = [(p.returncode, err) for p, (_, err) in zip(procs, results, strict=True)
                  if p.returncode != 0]
        assert not failed, failed
        with Ledger.open(str(path)) as led:
            assert led.verify().ok


def test_switching_a_new_file_to_wal_waits_for_another_writer(tmp_path: Path) -> None:
    """SQLite answers ``PRAGMA journal_mode=WAL`` with SQLITE_BUSY at once, without the busy
    handler, while another connection holds a write lock on the file — what a second
    process creating the same ledger at the same moment does. `Database.create` waits for it, as
    long as the busy timeout (it reported "locked for 30s" at once)."""
    import threading

    import apsw

    path = tmp_path / "ledger.db"
    path.touch()
    reader = apsw.Connection(str(path))
    reader.execute("BEGIN IMMEDIATE")  # a write lock on the file, still in rollback mode
    released = threading.Event()

    def release() -> None:
        released.wait(0.3)
        reader.execute("COMMIT")

    threading.Thread(target=release).start()
    db, created = dbmod.Database.create(str(path))
    try:
        assert created and db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()
        reader.close()

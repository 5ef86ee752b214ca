"""`steptrail copy SRC DST`: a ledger moved between stores, SQLite -> PostgreSQL -> SQLite,
with every event, hash and blob unchanged (ledger/copying.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from ledger import InvalidInput, Ledger
from ledger.copying import copy_ledger
from ledger.demo import run_demo
from ledger.gc.audit import audit


def _everything(location: str) -> tuple[list[tuple[object, ...]], dict[str, bytes], str]:
    """Every event row, every blob's bytes (inline or not) and the head of a ledger."""
    with Ledger.open(location, readonly=True) as led:
        with led.storage.read() as view:
            events = [tuple(r) for r in view.events()]
            digests = sorted({r[4] for r in view.entry_rows()} | {r[2] for r in view.pin_rows()}
                             | {b.digest for b in view.inline_blobs()})
        blobs = {d: led.storage.blobs.read(d) for d in digests
                 if led.storage.blobs.stat(d) is not None}
        return events, blobs, str(led.head())


@pytest.fixture(scope="module")
def demo_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("demo") / "run"
    run_demo(keep=str(root), echo=lambda *_: None)
    return str(root / ".steptrail" / "ledger.db")


def test_a_demo_ledger_round_trips_sqlite_postgres_sqlite(demo_ledger: str, pg_url: str,
                                                          tmp_path: Path) -> None:
    back = str(tmp_path / "back.db")
    first = copy_ledger(demo_ledger, pg_url)
    second = copy_ledger(pg_url, back)
    assert first.head == second.head and first.events == second.events > 0
    assert first.blobs >= 1 and first.blob_bytes > 0  # blob files became chunk rows, and back
    src, mid, end = (_everything(x) for x in (demo_ledger, pg_url, back))
    assert src == mid == end  # the same rows, hashes and bytes on all three
    for where in (demo_ledger, pg_url, back):
        with Ledger.open(where, readonly=True) as led:
            report = led.verify()
            assert report.ok, report.findings
            assert audit(led, deep=True).ok


def test_the_cli_copies_and_verifies_both_ends(demo_ledger: str, pg_url: str) -> None:
    got = run_cli(["copy", demo_ledger, pg_url, "--json"])
    assert got.code == 0, got.err
    doc = json.loads(got.out)
    assert doc["ok"] and doc["same_head"] and doc["source_verify"]["ok"] and doc["dest_verify"]["ok"]
    assert run_cli(["--ledger", pg_url, "head"]).out.strip() == doc["head"]


def test_a_destination_that_holds_a_ledger_is_refused(demo_ledger: str, pg_url: str,
                                                      tmp_path: Path) -> None:
    copy_ledger(demo_ledger, pg_url)
    with Ledger.open(pg_url, readonly=True) as led:
        before = str(led.head())
    with pytest.raises(InvalidInput, match="already holds a ledger"):
        copy_ledger(demo_ledger, pg_url)
    with Ledger.open(pg_url, readonly=True) as led:
        assert str(led.head()) == before
    existing = tmp_path / "exists.db"
    existing.write_bytes(b"")
    with pytest.raises(InvalidInput, match="exists"):
        copy_ledger(demo_ledger, str(existing))
    assert existing.read_bytes() == b""
    got = run_cli(["copy", demo_ledger, str(existing)])
    assert got.code == 2 and "InvalidInput" in got.err


def test_an_empty_initialized_database_is_a_new_destination(demo_ledger: str,
                                                            pg_url: str) -> None:
    with Ledger.init(pg_url):
        pass
    report = copy_ledger(demo_ledger, pg_url)
    with Ledger.open(pg_url, readonly=True) as led:
        assert str(led.head()) == report.head and led.verify().ok
        with Ledger.open(demo_ledger, readonly=True) as src:
            assert led.ledger_id == src.ledger_id  # the same genesis: the chain is the same


KILLED_COPY = r"""
import os, signal, sys
from ledger.copying import copy_ledger
def progress(stage, n):
    if stage == "blobs":  # inside the destination's transaction, before its COMMIT
        os.kill(os.getpid(), signal.SIGKILL)
copy_ledger(sys.argv[1], sys.argv[2], progress=progress)
"""


def test_a_copy_killed_before_its_commit_is_completed_by_running_it_again(
        demo_ledger: str, tmp_path: Path) -> None:
    """A `copy` to a file SIGKILLed midway (its blob files written, its tables not
    committed) leaves no file at DEST — only a hidden temporary beside it — so running
    the same command again copies the whole ledger, and DEST appears only whole."""
    import os
    import subprocess
    import sys

    dest = tmp_path / "out" / "copy.db"
    dest.parent.mkdir()
    killed = subprocess.run([sys.executable, "-c", KILLED_COPY, demo_ledger, str(dest)],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert not dest.exists()
    assert any(p.startswith(".copy.db.steptrail-copy") for p in os.listdir(dest.parent)), "the kill did not land inside the copy"
    again = run_cli(["copy", demo_ledger, str(dest), "--json"])
    assert again.code == 0, again
    assert again.json["dest"] == str(dest)
    assert _everything(str(dest)) == _everything(demo_ledger)
    assert sorted(p for p in os.listdir(dest.parent) if p.startswith(".")) == []

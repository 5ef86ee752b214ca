"""Every format a release left opens under today's code: the ledgers in
tests/fixtures/ledgers were written by the old code itself (tools/make_old_ledgers.py,
one per SQLite schema version 1-5), with what that code read back (expect.json).

For each: a read-only open reads it as it is and writes nothing; the first read-write
open migrates it to today's version; the steps, manifests and artifact bytes are what the
old code recorded; the chain verifies across the boundary (the old events unchanged, new
ones appended after them); audit is clean; the ledger takes new steps; a seal archive the
old code wrote still verifies, and a backup it made restores.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import apsw
import pytest

from conftest import lock_files_aside, snapshot_dir
from ledger import Ledger, LedgerTooNew
from ledger.gc.audit import audit
from ledger.runner import run_step
from ledger.store.sqlite import schema as sqlite_schema

pytestmark = pytest.mark.sqlite_only

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ledgers"
VERSIONS = sorted(int(p.name[1:-len(".tar.gz")]) for p in FIXTURES.glob("v*.tar.gz"))


def test_every_earlier_version_has_a_fixture() -> None:
    assert VERSIONS == list(range(1, sqlite_schema.SCHEMA_VERSION))


def unpack(version: int, into: Path) -> tuple[Path, dict[str, Any]]:
    with tarfile.open(FIXTURES / f"v{version}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "ledger" / "ledger.db", json.loads((into / "expect.json").read_text())


def file_version(path: Path) -> int:
    conn = apsw.Connection(f"file:{path}?immutable=1",
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def steps_of(led: Ledger) -> list[list[Any]]:
    return sorted([s.step_id, s.state, s.attempt, s.manifest_digest] for s in led.steps())


def check_contents(led: Ledger, expect: dict[str, Any]) -> None:
    assert steps_of(led) == expect["steps"]
    for key, digest in expect["artifacts"].items():
        step, path = key.split("/", 1)
        manifest = led.manifest(step)
        assert manifest is not None
        got = {a.path: a.digest for a in manifest.artifacts}
        assert got[path] == digest
        assert hashlib.sha256(led.read_blob(digest)).hexdigest() == digest


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_ledger_is_read_as_it_is_then_migrated_and_goes_on(
        tmp_path: Path, version: int) -> None:
    db, expect = unpack(version, tmp_path)
    assert file_version(db) == version
    before = snapshot_dir(tmp_path)
    with Ledger.open(str(db), readonly=True) as led:  # read as it is: nothing written
        assert led.storage.info.version == version
        check_contents(led, expect)
        assert led.head().seq == expect["head"]
        report = led.verify()
        assert report.ok, report.findings
    assert lock_files_aside(snapshot_dir(tmp_path)) == lock_files_aside(before)
    assert file_version(db) == version

    with Ledger.open(str(db)) as led:  # the first read-write open migrates it
        assert led.storage.info.version == sqlite_schema.SCHEMA_VERSION
        check_contents(led, expect)
        old_head = led.head()
        assert old_head.seq == expect["head"]
        report = led.verify()
        assert report.ok and report.projection_lag == 0, report.findings
        assert audit(led).ok
        # it goes on: a new step chains onto the old head
        run_step(led, "after-migration", {"new.txt": b"written by today's code"})
        first_new = next(iter(led.read(after_seq=old_head.seq)))
        assert first_new.prev_hash == old_head.hash
        report = led.verify()
        assert report.ok, report.findings
    assert file_version(db) == sqlite_schema.SCHEMA_VERSION
    with Ledger.open(str(db), readonly=True) as led:
        assert led.verify().ok and led.projection_lag() == 0
        assert led.step("after-migration").state == "acked"


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 4])
def test_an_old_seal_archive_verifies_and_an_old_backup_restores(
        tmp_path: Path, version: int) -> None:
    from ledger.backup import restore_backup
    from ledger.seal import sealed_runs, verify_archive

    db, expect = unpack(version, tmp_path)
    with Ledger.open(str(db)) as led:
        infos = sealed_runs(led)
        assert [i.run for i in infos] == [expect["sealed"]] and infos[0].present
        archive = os.path.join(str(db.parent), "archive", os.path.basename(infos[0].archive))
        report = verify_archive(archive, led)
        assert report.ok, report.findings
    restored = restore_backup(tmp_path / expect["backup"], tmp_path / "restored")
    with Ledger.open(restored.path) as led:
        assert led.storage.info.version == sqlite_schema.SCHEMA_VERSION
        assert led.verify().ok
        check_contents(led, expect)


def test_a_newer_file_is_refused_with_the_versions_named(tmp_path: Path) -> None:
    """The other direction: a file of a format after this code's is refused, typed."""
    db, _ = unpack(VERSIONS[-1], tmp_path)
    with Ledger.open(str(db)):
        pass
    conn = apsw.Connection(str(db))
    conn.execute(f"PRAGMA user_version={sqlite_schema.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerTooNew) as info:
        Ledger.open(str(db))
    assert info.value.found == sqlite_schema.SCHEMA_VERSION + 1  # type: ignore[attr-defined]


def test_an_older_writer_left_running_cannot_commit_into_the_new_format(
        tmp_path: Path) -> None:
    """A v5 writer rewrites the checkpoint at every commit, to its last event's seq. On a
    file migrated under it, that write is refused — the fix named — and its whole
    transaction (its events too) rolls back: nothing of it lands in the v6 file."""
    db, _ = unpack(5, tmp_path)
    with Ledger.open(str(db)) as led:
        head = led.head().seq
    conn = apsw.Connection(str(db))
    # what a v5 commit does after its events: the checkpoint upsert, to its head
    with pytest.raises(apsw.ConstraintError, match="upgrade steptrail"):
        with conn:
            conn.execute("INSERT INTO projection_checkpoint(name, last_seq, version)"
                         " VALUES ('steps', ?, 5) ON CONFLICT(name) DO UPDATE SET"
                         " last_seq = excluded.last_seq, version = excluded.version",
                         (head,))
    conn.close()
    with Ledger.open(str(db), readonly=True) as led:  # untouched
        assert led.head().seq == head
        assert led.verify().ok and led.projection_lag() == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_ledger_copies_into_todays_format(tmp_path: Path, version: int) -> None:
    """`copy` from a file of any earlier version (read as it is, never migrated: the
    source is only read) makes a ledger of today's version with the same chain, steps
    and artifacts, which verifies and catches nothing up."""
    from ledger.copying import copy_ledger

    db, expect = unpack(version, tmp_path / "old")
    before = snapshot_dir(tmp_path / "old")
    (tmp_path / "new").mkdir()
    report = copy_ledger(str(db), str(tmp_path / "new" / "ledger.db"))
    assert lock_files_aside(snapshot_dir(tmp_path / "old")) == lock_files_aside(before)
    assert file_version(db) == version
    # (the projection tables come as the source had them: an older projection version
    # is refolded by the copy's first read-write open, and read folded until then)
    with Ledger.open(str(tmp_path / "new" / "ledger.db"), readonly=True) as led:
        assert led.storage.info.version == sqlite_schema.SCHEMA_VERSION
        assert str(led.head()) == report.head and led.head().seq == expect["head"]
        check_contents(led, expect)
    with Ledger.open(str(tmp_path / "new" / "ledger.db")) as led:
        assert led.projection_lag() == 0
        check_contents(led, expect)
        report_v = led.verify()
        assert report_v.ok, report_v.findings


@pytest.mark.parametrize("version", [1, VERSIONS[-1]])
def test_an_old_ledger_copies_into_postgresql(tmp_path: Path, pg_url: str,
                                              version: int) -> None:
    from ledger.copying import copy_ledger

    db, expect = unpack(version, tmp_path / "old")
    copy_ledger(str(db), pg_url, archive_dir=str(tmp_path / "archive"))
    with Ledger.open(pg_url) as led:
        check_contents(led, expect)
        assert led.head().seq == expect["head"] and led.projection_lag() == 0
        run_step(led, "after-copy", {"a.txt": b"a"})
        assert led.verify().ok

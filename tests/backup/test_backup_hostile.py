"""Issue 18: a damaged or foreign backup is refused with a typed error, never a traceback,
and nothing is written: a tampered marker, a truncated or swapped database, a foreign
SQLite file, a corrupt, missing or symlinked blob, a marker that is a symlink or not JSON.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import apsw
import msgspec
import pytest
from click.testing import CliRunner
from test_backup import World

from ledger import BackupIncomplete, BackupInvalid, Ledger
from ledger.backup import MARKER, BackupMarker, _marker_digest, backup, check_backup, read_backup, restore_backup
from ledger.cli import cli


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    w = World(tmp)
    w.populate(3)
    w.close()
    backup(w.path, tmp / "backup")
    other = Ledger.init(tmp / "other" / "ledger.db")
    other.close()
    backup(tmp / "other" / "ledger.db", tmp / "other-backup")
    return tmp


def _marker(dest: Path) -> dict[str, object]:
    return json.loads((dest / MARKER).read_text())


def _rewrite(dest: Path, **changes: object) -> None:
    """Change marker fields and recompute its digest (a careful forger)."""
    doc = {**_marker(dest), **changes}
    marker = msgspec.convert(doc, BackupMarker)
    marker = msgspec.structs.replace(marker, digest=_marker_digest(marker))
    (dest / MARKER).write_bytes(msgspec.json.encode(marker))


def _blob_files(dest: Path) -> list[Path]:
    return sorted(p for p in (dest / "blobs").glob("??/*") if len(p.name) == 64)


def _db(dest: Path) -> Path:
    return dest / str(_marker(dest)["db"])


def _writable(p: Path) -> None:
    p.chmod(0o600)


def tamper_field(dest: Path, _src: Path) -> None:
    doc = _marker(dest)
    doc["head_seq"] = int(doc["head_seq"]) + 1  # type: ignore[call-overload]
    (dest / MARKER).write_text(json.dumps(doc))


def marker_garbage(dest: Path, _src: Path) -> None:
    (dest / MARKER).write_bytes(b"\x00not json{")


def marker_symlink(dest: Path, _src: Path) -> None:
    (dest / "elsewhere.json").write_bytes((dest / MARKER).read_bytes())
    (dest / MARKER).unlink()
    (dest / MARKER).symlink_to(dest / "elsewhere.json")


def marker_removed(dest: Path, _src: Path) -> None:
    (dest / MARKER).unlink()


def db_truncated(dest: Path, _src: Path) -> None:
    db = _db(dest)
    _writable(db)
    with open(db, "r+b") as f:
        f.truncate(db.stat().st_size // 2)


def db_truncated_forged(dest: Path, src: Path) -> None:
    """Truncated, and the marker rewritten to match (digest and all)."""
    db_truncated(dest, src)
    from ledger.backup import _sha256_file

    sha, n = _sha256_file(str(_db(dest)))
    _rewrite(dest, db_sha256=sha, db_bytes=n)


def db_swapped(dest: Path, src: Path) -> None:
    """Another ledger's snapshot put in its place, the marker forged to match it."""
    other = src / "other-backup"
    theirs = other / str(_marker(other)["db"])
    db = _db(dest)
    _writable(db)
    shutil.copy(theirs, db)
    from ledger.backup import _sha256_file

    sha, n = _sha256_file(str(db))
    _rewrite(dest, db_sha256=sha, db_bytes=n)


def db_foreign_sqlite(dest: Path, _src: Path) -> None:
    db = _db(dest)
    db.unlink()
    conn = apsw.Connection(str(db))
    conn.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
    conn.close()
    from ledger.backup import _sha256_file

    sha, n = _sha256_file(str(db))
    _rewrite(dest, db_sha256=sha, db_bytes=n)


def blob_corrupt(dest: Path, _src: Path) -> None:
    blob = _blob_files(dest)[0]
    blob.parent.chmod(0o700)
    _writable(blob)
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))


def blob_missing(dest: Path, _src: Path) -> None:
    _blob_files(dest)[0].unlink()


def blob_symlinked(dest: Path, src: Path) -> None:
    blob = _blob_files(dest)[0]
    copy = src / f"outside-{blob.name}"
    if not copy.exists():
        shutil.copy(blob, copy)
    blob.unlink()
    blob.symlink_to(copy)


HOSTILE: dict[str, tuple[Callable[[Path, Path], None], type[Exception]]] = {
    "a marker field edited": (tamper_field, BackupInvalid),
    "a marker that is not JSON": (marker_garbage, BackupInvalid),
    "a marker that is a symlink": (marker_symlink, BackupInvalid),
    "no marker": (marker_removed, BackupIncomplete),
    "a truncated database": (db_truncated, BackupInvalid),
    "a truncated database, marker forged": (db_truncated_forged, BackupInvalid),
    "another ledger's database, marker forged": (db_swapped, BackupInvalid),
    "a foreign SQLite file, marker forged": (db_foreign_sqlite, BackupInvalid),
    "a corrupt blob": (blob_corrupt, BackupInvalid),
    "a missing blob": (blob_missing, BackupInvalid),
    "a symlinked blob": (blob_symlinked, BackupInvalid),
}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_backup_is_refused_and_nothing_is_written(name: str, pristine: Path,
                                                            tmp_path: Path) -> None:
    damage, error = HOSTILE[name]
    dest = tmp_path / "backup"
    shutil.copytree(pristine / "backup", dest, symlinks=True)
    for p in dest.rglob("*"):
        if p.is_dir():
            p.chmod(0o700)
    damage(dest, pristine if name != "a symlinked blob" else tmp_path)
    before = _tree(dest)
    with pytest.raises(error):
        check_backup(dest)
    with pytest.raises(error):
        restore_backup(dest, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert _tree(dest) == before  # read-only
    # the command line: one typed line, exit 2, no traceback
    got = CliRunner().invoke(cli, ["backup", "restore", str(dest), str(tmp_path / "r2")])
    assert got.exit_code == 2, got.output
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"steptrail: error: {error.__name__}: ")
    assert not (tmp_path / "r2").exists()
    got = CliRunner().invoke(cli, ["backup", "verify", str(dest), "--json"])
    assert got.exit_code == 2 and json.loads(got.output.splitlines()[0])["error"]["type"] == error.__name__


def test_a_damaged_backup_in_dest_is_not_written_over(pristine: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    shutil.copytree(pristine / "backup", dest)
    tamper_field(dest, pristine)
    before = (dest / MARKER).read_bytes()
    with pytest.raises(BackupInvalid):
        backup(pristine / "src" / "ledger.db", dest)
    assert (dest / MARKER).read_bytes() == before


def test_the_pristine_backup_is_sound(pristine: Path) -> None:
    found = check_backup(pristine / "backup")
    assert found.blobs == len(_blob_files(pristine / "backup")) > 0
    assert read_backup(pristine / "backup").head_seq == found.head_seq

"""Sealed runs of a ledger in PostgreSQL (docs/design.md "Sealed runs", "Where a ledger
keeps its archives"): the archive directory the first seal recorded in the ledger is
where `seal list`, `seal verify`, `backup` and `copy` find the archives; `copy` carries
every archive across (beside a file destination, into the `--archive-dir` recorded for a
database destination), and nothing looks under the current directory for them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli

from ledger import Ledger
from ledger.runner import run_step


def _sealed(location: str, archive_dir: Path | None) -> None:
    """Two runs, one sealed (with `archive_dir` given, on the command line)."""
    with Ledger.open(location) as led:
        for i in range(3):
            run_step(led, f"a/s{i}", {"out.txt": b"a %d\n" % i,
                                      "big.bin": bytes([i]) * (led.inline_max_bytes * 2)},
                     run="runa")
            run_step(led, f"b/s{i}", {"out.txt": b"b %d\n" % i}, run="runb")
    args = ["--ledger", location, "seal", "run", "runa"]
    got = run_cli(args + (["--archive-dir", str(archive_dir)] if archive_dir else []))
    assert got.code == 0, got.err


def _events(location: str) -> int:
    with Ledger.open(location, readonly=True) as led, led.storage.read() as view:
        return view.count()


def _check_sealed(location: str) -> None:
    """`verify`, `seal list` (the archive present) and `seal verify` of `location`."""
    assert run_cli(["--ledger", location, "verify"]).code == 0
    listed = run_cli(["--ledger", location, "seal", "list", "--json"])
    assert listed.code == 0, listed.err
    assert [(s["run"], s["present"]) for s in listed.json] == [("runa", True)]
    checked = run_cli(["--ledger", location, "seal", "verify", "--json"])
    assert checked.code == 0 and checked.json["ok"], checked.out + checked.err
    assert len(checked.json["archives"]) == 1


@pytest.fixture
def sealed_pg(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A PostgreSQL ledger with a sealed run, its archives in tmp_path/pg-archive; the
    current directory is an empty one of its own (nothing may be looked for there)."""
    Ledger.init(pg_url).close()
    _sealed(pg_url, tmp_path / "pg-archive")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return pg_url


def test_seal_list_and_verify_find_the_archives_where_the_seal_recorded_them(
        sealed_pg: str, tmp_path: Path) -> None:
    _check_sealed(sealed_pg)
    assert os.listdir(".") == []  # nothing was looked for, or made, under $CWD
    with Ledger.open(sealed_pg, readonly=True) as led:
        assert led.storage.view.meta("archive_dir") == str(tmp_path / "pg-archive")
    # the archive gone: a finding naming the recorded directory, never $CWD/postgresql:/…
    (name,) = os.listdir(tmp_path / "pg-archive")
    os.rename(tmp_path / "pg-archive" / name, tmp_path / name)
    got = run_cli(["--ledger", sealed_pg, "seal", "verify"])
    assert got.code == 1 and str(tmp_path / "pg-archive" / name) in got.out, got.out
    assert "MISSING" in run_cli(["--ledger", sealed_pg, "seal", "list"]).out


def test_the_archive_directory_is_absolute_and_one_per_ledger(pg_url: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A relative --archive-dir would mean another place in every current directory; a
    second directory would split the archives: both refused, exit 2, nothing written.
    A later seal without --archive-dir uses the recorded one."""
    Ledger.init(pg_url).close()
    monkeypatch.chdir(tmp_path)
    with Ledger.open(pg_url) as led:
        for run in ("r1", "r2"):
            run_step(led, f"{run}/s0", {"out.txt": run.encode()}, run=run)
    before = _events(pg_url)
    got = run_cli(["--ledger", pg_url, "seal", "run", "r1", "--archive-dir", "rel"])
    assert got.code == 2 and "absolute" in got.err, got.err
    assert _events(pg_url) == before and not (tmp_path / "rel").exists()
    assert run_cli(["--ledger", pg_url, "seal", "run", "r1", "--archive-dir",
                    str(tmp_path / "one")]).code == 0
    got = run_cli(["--ledger", pg_url, "seal", "run", "r2", "--archive-dir", str(tmp_path / "two")])
    assert got.code == 2 and str(tmp_path / "one") in got.err, got.err
    assert not (tmp_path / "two").exists()
    assert run_cli(["--ledger", pg_url, "seal", "run", "r2"]).code == 0
    assert len(os.listdir(tmp_path / "one")) == 2
    got = run_cli(["--ledger", pg_url, "seal", "verify", "--archive-dir", "rel"])
    assert got.code == 2 and "absolute" in got.err, got.err


def test_a_sealed_postgresql_ledger_backs_up_verifies_and_restores_with_its_archives(
        sealed_pg: str, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    got = run_cli(["--ledger", sealed_pg, "backup", str(dest), "--json"])
    assert got.code == 0, got.err
    assert got.json["archives"] == got.json["archives_copied"] == 1
    assert run_cli(["backup", "verify", str(dest)]).code == 0
    got = run_cli(["backup", "restore", str(dest), str(tmp_path / "restored")])
    assert got.code == 0, got.err
    _check_sealed(str(tmp_path / "restored" / "ledger.db"))


def test_a_sealed_postgresql_ledger_copies_to_a_file_with_its_archives(
        sealed_pg: str, tmp_path: Path) -> None:
    dest = tmp_path / "copy" / "ledger.db"
    dest.parent.mkdir()
    got = run_cli(["copy", sealed_pg, str(dest)])
    assert got.code == 0, got.err
    _check_sealed(str(dest))
    assert os.listdir(dest.parent / "archive") == os.listdir(tmp_path / "pg-archive")


def test_a_sealed_file_ledger_copies_into_postgresql_given_an_archive_dir(
        pg_url: str, pg_server, tmp_path: Path) -> None:
    src = tmp_path / "src" / ".steptrail" / "ledger.db"
    Ledger.init(str(src)).close()
    _sealed(str(src), None)
    # no --archive-dir: refused before the database is touched (the copy below finds
    # it new)
    got = run_cli(["copy", str(src), pg_url])
    assert got.code == 2 and "--archive-dir" in got.err, got.err
    got = run_cli(["copy", str(src), pg_url, "--archive-dir", str(tmp_path / "pg-archive")])
    assert got.code == 0, got.err
    _check_sealed(pg_url)
    # and back out of the database into a file: the archives come along again
    back = tmp_path / "back" / "ledger.db"
    back.parent.mkdir()
    assert run_cli(["copy", pg_url, str(back)]).code == 0
    _check_sealed(str(back))
    # a second database given the first one's directory: refused (the copies would
    # share and overwrite each other's archives)
    other = pg_server.create_database("seal_copy_shared_dir")
    got = run_cli(["copy", pg_url, other, "--archive-dir", str(tmp_path / "pg-archive")])
    assert got.code == 2 and "pg-archive" in got.err, got.err


def test_a_backup_or_copy_without_an_archive_is_refused_naming_it(
        sealed_pg: str, tmp_path: Path) -> None:
    (name,) = os.listdir(tmp_path / "pg-archive")
    os.rename(tmp_path / "pg-archive" / name, tmp_path / name)
    got = run_cli(["--ledger", sealed_pg, "backup", str(tmp_path / "backup")])
    assert got.code == 2 and name in got.err, got.err
    assert not (tmp_path / "backup").exists()
    dest = tmp_path / "copy" / "ledger.db"
    dest.parent.mkdir()
    got = run_cli(["copy", sealed_pg, str(dest)])
    assert got.code == 2 and name in got.err, got.err
    assert os.listdir(dest.parent) == []

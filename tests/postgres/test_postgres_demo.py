"""`steptrail demo --ledger postgresql://...`: the seed scenario across processes that
share nothing but the database URL (a worker SIGKILLed mid-step loses its directory; a
worker elsewhere restores from the database, takes a new epoch and finishes; the dead
worker's late receipt is refused)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import run_cli


def test_the_demo_runs_on_postgresql(pg_url: str) -> None:
    child = subprocess.run([sys.executable, "-m", "ledger", "demo", "--ledger", pg_url, "--json"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    assert report["ok"] and all(report["checks"].values())
    assert report["checks"]["worker 1 died by SIGKILL mid-step"]
    assert report["checks"]["the late receipt of a dead epoch commits nothing (StaleEpoch)"]
    assert report["ledger"].startswith("postgresql://")
    # the ledger outlived every worker's directory: it verifies from the database alone
    assert run_cli(["--ledger", pg_url, "verify"]).code == 0


def test_the_demo_refuses_a_database_that_holds_a_ledger(pg_url: str) -> None:
    assert run_cli(["--ledger", pg_url, "init"]).code == 0
    assert run_cli(["demo", "--ledger", pg_url, "--json"]).code == 0  # empty: taken
    with_events = run_cli(["--ledger", pg_url, "head"]).out
    got = run_cli(["demo", "--ledger", pg_url])
    assert got.code == 2 and "already holds a ledger" in got.err
    assert run_cli(["--ledger", pg_url, "head"]).out == with_events  # nothing written
    got = run_cli(["demo", "--ledger", "ledger.db"])
    assert got.code == 2 and "postgresql://" in got.err


def test_sealing_a_database_ledger_is_refused_and_writes_nothing(pg_url: str,
                                                                 tmp_path) -> None:
    from ledger import Ledger
    from ledger.runner import run_step

    with Ledger.init(pg_url) as led:
        run_step(led, "s1", {"a.txt": b"x"}, run="nightly")
        head = str(led.head())
    got = run_cli(["--ledger", pg_url, "seal", "run", "nightly"])
    assert got.code == 1 and "NotSealable" in got.err and "PostgreSQL" in got.err
    got = run_cli(["--ledger", pg_url, "seal", "vacuum"])
    assert got.code == 2 and "InvalidInput" in got.err
    assert run_cli(["--ledger", pg_url, "head"]).out.strip() == head
    assert run_cli(["--ledger", pg_url, "seal", "list"]).code == 0


def test_a_refused_demo_leaves_no_directory_behind(pg_url: str, tmp_path, monkeypatch) -> None:
    """A demo refused on a database that holds a ledger left its empty temporary
    directory behind (issue 26, item 16): the refusal comes before the directory."""
    import tempfile

    from ledger import Ledger

    with Ledger.init(pg_url) as led:
        led.workspaces.add("w", str(tmp_path))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    got = run_cli(["demo", "--ledger", pg_url])
    assert got.code == 2 and "already holds a ledger" in got.err
    assert list(scratch.iterdir()) == []
    got = run_cli(["demo", "--ledger", pg_url, "--keep", str(tmp_path / "keep")])
    assert got.code == 2 and not (tmp_path / "keep").exists()

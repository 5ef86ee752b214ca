"""Crash at every operation: a real process killed by SIGKILL before operation k, for all k."""

from __future__ import annotations

import json
import pathlib

import pytest

from click.testing import CliRunner

from ledger.testing.chaos import run_chaos
from ledger.cli import cli


def test_chaos_five_artifacts_every_index_safe(tmp_path: pathlib.Path) -> None:
    report = run_chaos(5, workdir=str(tmp_path))
    ops = [r.operation.split(" ")[0] for r in report.rows]
    # a fresh step with a file blob is two commits (plan + pins; every blob-stored + the
    # manifest + the ack), and each file artifact one durable create (write, fsync,
    # rename, dirfsync)
    assert ops.count("commit") == 2, ops
    files = ops.count("write")
    assert files >= 1 and ops.count("fsync") == ops.count("rename") == files, ops
    assert report.indices == len(ops) >= 2 + 4 * files
    assert all(r.died for r in report.rows), "each child must really die at its index"
    assert {r.after_crash for r in report.rows} == {"no-commit"}
    assert report.violations == 0 and report.violations_after_replay == 0
    assert report.committed_after_replay == report.indices
    ops = {r.operation.split(" ")[0] for r in report.rows}
    assert {"write", "fsync", "rename", "dirfsync", "commit"} <= ops
    # the last operation is the commit of the manifest: killed before it, nothing is
    # committed, and the replay continues the planned attempt
    assert report.rows[-1].operation.startswith("commit")
    assert "store + publish + ack" in report.rows[-1].operation


def test_chaos_one_inline_artifact_is_one_commit(tmp_path: pathlib.Path) -> None:
    """All inline: the whole step is one commit; killed before it, nothing at all was
    recorded, and the replay runs the step afresh."""
    report = run_chaos(1, workdir=str(tmp_path))
    assert [r.operation for r in report.rows] == ["commit (whole step)"], report.rows
    assert report.rows[0].died and report.rows[0].after_crash == "no-commit"
    assert report.violations == report.violations_after_replay == 0
    assert report.committed_after_replay == 1


def test_wrong_order_is_caught(tmp_path: pathlib.Path) -> None:
    """The negative control: manifest before blobs must produce violations."""
    report = run_chaos(5, wrong_order=True, workdir=str(tmp_path))
    assert report.violations > 0


def test_chaos_cli_json_and_exit_codes(tmp_path: pathlib.Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["chaos", "--artifacts", "2", "--json", "--dir", str(tmp_path / "a")])
    data = json.loads(ok.stdout)
    assert ok.exit_code == 0
    assert data["artifacts"] == 2 and data["violations"] == 0
    assert data["committed_after_replay"] == data["indices"] > 0
    bad = runner.invoke(cli, ["chaos", "--artifacts", "2", "--wrong-order", "--dir", str(tmp_path / "b")])
    assert bad.exit_code == 1 and "violations after crash" in bad.stdout


@pytest.mark.parametrize("shape", ["rotation", "swap", "move"])
def test_a_fenced_permutation_killed_at_every_operation_goes_wholly_back_or_forward(
        tmp_path: pathlib.Path, shape: str) -> None:
    from ledger.testing.chaos import run_fenced_chaos

    report = run_fenced_chaos(shape, workdir=str(tmp_path))
    assert report.indices > 5 and all(r.died for r in report.rows)
    assert report.violations == 0 and report.violations_after_replay == 0, [
        r for r in report.rows if "VIOLATION" in r.after_crash + r.after_replay]
    assert report.committed_after_replay == report.indices
    # a kill before any exchange, and at every exchange, is rolled back by settling
    assert sum(r.after_crash == "rolled back" for r in report.rows) > len(report.rows) // 2


def test_the_fenced_chaos_checker_catches_a_settle_that_does_not_roll_back(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: settling that leaves landed writes where they are (what the
    core did before slots) is reported as violations."""
    from ledger.testing.chaos import run_fenced_chaos
    from ledger.workspace import placing
    from ledger.workspace.placing import TakeBack

    monkeypatch.setattr(placing, "roll_back",
                        lambda wsdir, found, post, **_: TakeBack(found.path, False, found.now))
    report = run_fenced_chaos("rotation", workdir=str(tmp_path))
    assert report.violations > 0


def test_chaos_fenced_from_the_command_line(tmp_path: pathlib.Path) -> None:
    r = CliRunner().invoke(cli, ["chaos", "--fenced", "swap", "--dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["shape"] == "swap" and doc["violations"] == 0 and doc["indices"] > 5

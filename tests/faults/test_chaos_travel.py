"""A rewind and a fork killed by SIGKILL before every one of their operations, checked
against a model of what was written (ledger/testing/chaos_travel.py)."""

from __future__ import annotations

import functools
import json
import os
import pathlib

import pytest
from click.testing import CliRunner

from ledger.cli import cli
from ledger.testing import chaos_travel
from ledger.testing.chaos_travel import MODEL, run_fork_chaos, run_rewind_chaos


def _violations(report: chaos_travel.ChaosReport) -> list[object]:
    return [r for r in report.rows if "VIOLATION" in r.after_crash + r.after_replay]


def test_the_model_is_folded_from_the_writes() -> None:
    """The expected trees are the test's own, not the ledger's: a rewind to s1 brings the
    deleted file back, removes what was created later and drops the person's edit."""
    assert MODEL["s1"] == {"app.py": b"v1\n", "notes.txt": b"notes\n", "sub/mod.py": b"m1\n",
                           "run.sh": b"#!/bin/sh\necho hi\n", "cfg": b"c1\n"}
    assert set(MODEL["now"]) - set(MODEL["s1"]) == {"later.txt", "sub/deep/new.py",
                                                     "cfg/local.toml"}
    assert "notes.txt" not in MODEL["now"] and MODEL["now"]["app.py"] == b"a person's edit\n"
    assert "cfg" not in MODEL["now"]  # a directory cfg/ stands where the file was
    assert set(MODEL["s2"]) == set(MODEL["s1"]) - {"cfg"} | {"later.txt", "sub/deep/new.py"}


def test_a_rewind_killed_at_every_operation_goes_back_or_is_finished_by_a_rerun(
        tmp_path: pathlib.Path) -> None:
    report = run_rewind_chaos(workdir=str(tmp_path))
    assert report.shape == "rewind" and report.indices >= 15
    assert all(r.died for r in report.rows), "each child must really die at its index"
    assert report.violations == report.violations_after_replay == 0, _violations(report)
    assert report.committed_after_replay == report.indices
    ops = [r.operation for r in report.rows]
    # the lease, the plan, the staged files, their exchanges, the apply's commit, the
    # displaced files' removal, the release: each killed
    assert ops[0] == "commit (lease)" and ops[-1] == "commit (release)"
    assert {"commit (plan)", "commit (apply)", "ws-rename (apply)", "ws-unlink (apply)"} <= set(ops)
    # two steps (cfg and cfg/ traded places): killed before the first apply's commit, a
    # new lease puts every file back; between the two commits, what the first removed
    # stays removed (its own step, committed); after the second, the rewind stands
    settled = [r.after_crash.split(" (")[0] for r in report.rows]
    first, second = [i for i, op in enumerate(ops) if op == "commit (apply)"]
    assert set(settled[:first + 1]) == {"rolled back"}
    assert set(settled[first + 1:second + 1]) == {"cleared"}
    assert set(settled[second + 1:]) == {"committed"}
    assert "ws-rmdir" in ops[first:second]  # the emptied cfg/ goes, each point killed


def test_the_rewind_checker_catches_a_takeover_that_does_not_settle(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: a new lease that leaves what the killed rewind landed where
    it is (no settling) is reported as violations."""
    from ledger.step import undo

    monkeypatch.setattr(undo, "settle_all", lambda site, workspace, epoch: ([], []))
    report = run_rewind_chaos(workdir=str(tmp_path), only={19, 21})  # mid-landing
    assert report.indices == 2 and report.violations == 2, report.rows


def test_a_fork_killed_at_every_operation_is_finished_by_running_it_again(
        tmp_path: pathlib.Path) -> None:
    report = run_fork_chaos(workdir=str(tmp_path))
    assert report.shape == "fork" and report.indices >= 25
    assert all(r.died for r in report.rows), "each child must really die at its index"
    assert report.violations == report.violations_after_replay == 0, _violations(report)
    assert report.committed_after_replay == report.indices
    left = [r.after_crash for r in report.rows]
    # every stage of it was killed: writing the files, registering, the baseline
    assert {"not registered", "registered, no baseline", "registered, baseline taken"} \
        == set(left)
    ops = [r.operation for r in report.rows]
    assert ops[0] == "ws-mkdir (files)" and ops[-1] == "commit (release)"
    assert {"ws-write (files)", "ws-rename (files)", "commit (register)",
            "commit (baseline)"} <= set(ops)


def test_the_fork_checker_catches_a_rerun_that_refuses_what_a_kill_left(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: a fork that refuses any directory not empty (what it did
    before it could resume) leaves the forks killed midway unfinished: violations."""
    from ledger.step import fork as forking

    def refuse_unless_empty(site: object, target: str, content: object) -> object:
        return {} if not os.path.exists(target) or not os.listdir(target) else None

    monkeypatch.setattr(forking, "resumable", refuse_unless_empty)
    report = run_fork_chaos(workdir=str(tmp_path), only={5, 12})
    assert report.indices == 2 and report.violations_after_replay == 2, report.rows
    assert all("InvalidInput" in r.after_replay for r in report.rows)


@pytest.mark.parametrize("flag", ["--rewind", "--fork"])
def test_the_sweeps_from_the_command_line(tmp_path: pathlib.Path, flag: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`steptrail chaos --rewind` / `--fork` run the sweeps (here on two indices)."""
    for name in ("run_rewind_chaos", "run_fork_chaos"):
        monkeypatch.setattr(chaos_travel, name, functools.partial(
            getattr(chaos_travel, name), only={1, 2}))
    r = CliRunner().invoke(cli, ["chaos", flag, "--dir", str(tmp_path / "j"), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["shape"] == flag[2:] and doc["indices"] == 2 and doc["violations"] == 0
    assert doc["violations_after_replay"] == 0 and doc["committed_after_replay"] == 2
    assert [row["index"] for row in doc["rows"]] == [1, 2]


def test_the_sweeps_table(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos_travel, "run_fork_chaos", functools.partial(
        chaos_travel.run_fork_chaos, only={1}))
    r = CliRunner().invoke(cli, ["chaos", "--fork", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["INDEX", "OPERATION", "LEFT", "BY", "THE", "KILL", "AFTER",
                                "REPLAY"]
    assert lines[1].split() == ["1", "ws-mkdir", "(files)", "not", "registered", "committed"]
    assert lines[-1].startswith("chaos: a fork: 1 crash point, 0 violations after the kill,"
                                " 0 violations after running it again, 1/1 complete")

"""`steptrail step run PLAN [FILE]...`: one step whole — plan, apply, store, publish, ack
— in one process, from the plan file `step plan` takes (docs/cli-json.md "step run").

A re-run answers from the journal: after a real SIGKILL at every stage between the
parts it finishes the step, applying its writes once; on a committed step it changes
nothing. A fence rejection keeps a person's edit; bad input writes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

from conftest import CLEAN_ENV, run_cli

from ledger import Ledger

STAGES = ("after-plan", "after-commit")

#: `steptrail ARGS...` in a process that SIGKILLs itself when `step run` reaches STAGE
#: (the hook `main` hands the command): `python -c KILLED_AT STAGE ARGS...`.
KILLED_AT = """
import os, signal, sys
import ledger.cli

def kill_at(stage):
    if stage == sys.argv[1]:
        os.kill(os.getpid(), signal.SIGKILL)

ledger.cli.main(sys.argv[2:], obj={"on_stage": kill_at})
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def setup(tmp_path: pathlib.Path) -> dict[str, Any]:
    """A ledger, workspace w (repo/app.py holding v0), epoch 1, and plan.json: s1 writes
    v1 into app.py and declares the artifact out/log.txt (a file beside the plan)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_bytes(b"v0\n")
    db = tmp_path / "l.db"
    with Ledger.init(str(db)) as led:
        led.workspaces.add("w", str(repo))
        epoch = led.workspaces.acquire("w", "agent-1", 600).epoch
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "log.txt").write_bytes(b"12 passed\n")
    plan = {"step": "s1", "artifacts": ["out/log.txt"],
            "writes": [{"path": "app.py", "base_rev": 0, "pre_hash": sha(b"v0\n"),
                        "content": "v1\n"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return {"dir": tmp_path, "db": str(db), "repo": repo, "epoch": epoch}


def argv(s: dict[str, Any], *extra: str) -> list[str]:
    return ["--ledger", s["db"], "--workspace", "w", "step", "run", str(s["dir"] / "plan.json"),
            "out/log.txt", "--epoch", str(s["epoch"]), *extra]


def run(s: dict[str, Any], *extra: str) -> Any:
    old = os.getcwd()
    os.chdir(s["dir"])  # the artifact FILE is named by its path relative to here
    try:
        return run_cli(argv(s, *extra))
    finally:
        os.chdir(old)


def events_of(db: str, step: str = "s1") -> list[str]:
    with Ledger.open(db, readonly=True) as led:
        return [r.kind for r in led.read(0, step=step)]


def ledger_files(s: dict[str, Any]) -> dict[str, bytes]:
    d = pathlib.Path(s["db"]).parent
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())
            if p.is_file() and p.name.startswith("l.db")}


def test_one_call_runs_the_whole_step(setup: dict[str, Any]) -> None:
    r = run(setup, "--json")
    assert r.code == 0, r
    doc = r.json
    assert set(doc) == {"workspace", "epoch", "step", "attempt", "ok", "committed",
                        "already_committed", "plan", "apply", "stored", "manifest", "ack"}
    assert doc["ok"] and doc["committed"] and not doc["already_committed"]
    assert doc["plan"] == {"step": "s1", "attempt": 1, "verdict": "admitted", "detail": ""}
    assert doc["apply"]["verdict"] == "applied" and doc["apply"]["receipt"]["rev"] == 1
    assert [(e["path"], e["digest"], e["file"]) for e in doc["stored"]] == [
        ("out/log.txt", sha(b"12 passed\n"), "out/log.txt")]
    m = doc["manifest"]
    assert m["live"] and [w["digest"] for w in m["writes"]] == [sha(b"v1\n")]
    assert [a["path"] for a in m["artifacts"]] == ["out/log.txt"]
    assert doc["ack"]["deduped"] is False
    assert (setup["repo"] / "app.py").read_bytes() == b"v1\n"
    with Ledger.open(setup["db"], readonly=True) as led:
        assert led.step("s1").state == "acked" and led.step("s1").live
        assert led.verify().ok
    text = run(setup)  # the text form: one line per part, as the commands print them
    assert text.code == 0 and "unchanged" in text.out and "deduped" in text.out, text


def test_a_rerun_of_a_committed_step_changes_nothing(setup: dict[str, Any]) -> None:
    first = run(setup, "--json")
    assert first.code == 0, first
    before, app = ledger_files(setup), (setup["repo"] / "app.py").read_bytes()
    again = run(setup, "--json")
    assert again.code == 0, again
    doc = again.json
    assert doc["already_committed"] and doc["committed"]
    assert doc["plan"]["verdict"] == "unchanged" and doc["apply"]["verdict"] == "deduped"
    assert doc["stored"] == [] and doc["ack"]["deduped"]
    assert doc["manifest"] == first.json["manifest"]
    assert doc["apply"]["receipt"] == first.json["apply"]["receipt"]
    with Ledger.open(setup["db"], readonly=True) as led:
        assert led.count() == 9  # workspace, lease, planned + pin, fenced + pin, stored, manifest, ack
    assert (setup["repo"] / "app.py").read_bytes() == app
    assert ledger_files(setup)["l.db"] == before["l.db"]


def killed_run(s: dict[str, Any], stage: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in {**os.environ, **CLEAN_ENV}.items() if v is not None}
    return subprocess.run([sys.executable, "-c", KILLED_AT, stage, *argv(s, "--json")],
                          cwd=s["dir"], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stage", STAGES)
def test_a_rerun_after_a_sigkill_finishes_the_step_once(setup: dict[str, Any], stage: str) -> None:
    died = killed_run(setup, stage)
    assert died.returncode == -signal.SIGKILL, died
    assert died.stdout == ""
    with Ledger.open(setup["db"], readonly=True) as led:
        assert led.verify().ok
        assert not led.step("s1").live or stage == "after-commit"
    r = run(setup, "--json")
    assert r.code == 0, r
    doc = r.json
    assert doc["committed"] and doc["already_committed"] == (stage == "after-commit")
    assert doc["apply"]["verdict"] == ("applied" if stage == "after-plan" else "deduped")
    kinds = events_of(setup["db"])
    assert kinds.count("planned") == 1 and kinds.count("fenced") == 1  # applied once
    assert kinds.count("manifest-published") == 1 and kinds.count("acked") == 1
    assert (setup["repo"] / "app.py").read_bytes() == b"v1\n"
    with Ledger.open(setup["db"], readonly=True) as led:
        assert led.verify().ok
        n = led.count()
    assert run(setup).code == 0  # and once more: nothing changes
    with Ledger.open(setup["db"], readonly=True) as led:
        assert led.count() == n


def test_the_fence_rejects_a_plan_a_person_edited_under(setup: dict[str, Any]) -> None:
    (setup["repo"] / "app.py").write_bytes(b"my fix\n")
    r = run(setup, "--json")
    assert r.code == 1, r
    doc = r.json
    assert doc["ok"] is False and doc["error"]["type"] == "StepRejected"
    assert doc["error"]["reason"] == "pre_hash" and doc["apply"]["verdict"] == "rejected:pre_hash"
    assert doc["committed"] is False and doc["manifest"] is None and doc["ack"] is None
    assert r.err.startswith("steptrail: error: StepRejected:")
    assert (setup["repo"] / "app.py").read_bytes() == b"my fix\n"


def test_a_dead_epoch_is_refused_with_how_far_it_got(setup: dict[str, Any]) -> None:
    with Ledger.open(setup["db"]) as led:
        led.workspaces.acquire("w", "agent-2", 600, force=True)  # epoch 2: the run's epoch 1 is dead
    r = run(setup, "--json")
    assert r.code == 1 and r.json["error"]["type"] == "StaleEpoch", r
    assert r.json["plan"] is None and r.json["committed"] is False
    assert (setup["repo"] / "app.py").read_bytes() == b"v0\n"


def test_an_artifact_only_step(setup: dict[str, Any]) -> None:
    (setup["dir"] / "plan.json").write_text(json.dumps({"step": "t1", "artifacts": ["logs/a.log"]}))
    r = run(setup, "--as", "logs/a.log", "--json")
    assert r.code == 0, r
    assert r.json["manifest"]["artifacts"][0]["path"] == "logs/a.log"
    assert r.json["manifest"]["writes"] == []


@pytest.mark.parametrize("plan, extra, message", [
    ({"steps": [{"step": "a"}, {"step": "b"}]}, (), "runs one step"),
    ({"step": "s1", "artifacts": ["other.txt"]}, (), "no FILE for other.txt"),
    ({"step": "s1"}, (), "not in the plan's artifacts: out/log.txt"),
    ({"step": "s1", "fence": "none"}, (), "OperatorOnly"),
    ({"step": "s1", "writes": [{"path": "../x", "pre_hash": None, "content": "x"}],
      "artifacts": ["out/log.txt"]}, (), "InvalidInput"),
])
def test_bad_input_writes_nothing(setup: dict[str, Any], plan: dict[str, Any],
                                  extra: tuple[str, ...], message: str) -> None:
    (setup["dir"] / "plan.json").write_text(json.dumps(plan))
    before = ledger_files(setup)
    r = run(setup, "--json", *extra)
    assert r.code == 2, r
    assert message in r.err and r.json["ok"] is False
    assert ledger_files(setup) == before
    assert (setup["repo"] / "app.py").read_bytes() == b"v0\n"


def test_the_epoch_is_required(setup: dict[str, Any]) -> None:
    r = run_cli(["--ledger", setup["db"], "--workspace", "w", "step", "run",
                 str(setup["dir"] / "plan.json"), str(setup["dir"] / "out" / "log.txt"),
                 "--as", "out/log.txt"])
    assert r.code == 2 and "needs the live epoch" in r.err, r

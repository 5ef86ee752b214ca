"""tools/bench_peers.py runs end to end: every row of its table, valid JSON (no timing checks).

It needs the bench extra (the peers: LangGraph's SqliteSaver, eventsourcing, DBOS); without
it the test is skipped, so `make test` does not need the extra.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("langgraph.checkpoint.sqlite", "eventsourcing", "dbos")


def _missing() -> list[str]:
    out = []
    for name in PEERS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(name)
    return out


pytestmark = pytest.mark.skipif(
    bool(_missing()), reason="the bench extra is not installed (pip install -e '.[bench]')")


def test_smoke_run_gives_every_row_as_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_peers.py"), "--quick", "--smoke", "--json",
         "--writers", "1,2", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout)
    assert res["skipped"] == {}, res["skipped"]
    rows = {(r["system"], r["workload"], r["writers"], r["mode"]): r for r in res["rows"]}
    raw, ours, lg, es, dbos = ("raw apsw", "steptrail", "langgraph SqliteSaver",
                               "eventsourcing", "dbos")
    floor = "steptrail floor"
    expected = {
        (raw, "step-4k", 1, "own"), (ours, "step-4k", 1, "own"), (lg, "step-4k", 1, "own"),
        (floor, "step-4k", 1, "own"), (floor, "step-4k", 2, "own"),
        (es, "step-4k", 1, "own"), (dbos, "step-4k", 1, "shared"),
        (raw, "step-4k", 2, "own"), (ours, "step-4k", 2, "own"),
        (lg, "step-4k", 2, "own"), (lg, "step-4k", 2, "shared"),
        (es, "step-4k", 2, "own"), (es, "step-4k", 2, "shared"), (dbos, "step-4k", 2, "shared"),
        (raw, "append-small", 1, "own"), (ours, "append-small", 1, "own"),
        (lg, "append-small", 1, "own"), (es, "append-small", 1, "own"),
        (raw, "bulk-100", 1, "own"), (ours, "bulk-100", 1, "own"), (es, "bulk-100", 1, "own"),
    }
    shared = (ours, "step-4k", 2, "shared")
    assert expected | {shared} == set(rows), set(rows) ^ (expected | {shared})
    assert not any("steptrail shared mode" in n for n in res["notes"]), res["notes"]
    for key, row in rows.items():
        assert row["error"] is None, (key, row["error"])
        assert row["ops_s"] > 0 and row["to_raw"] > 0 and row["to_steptrail"] > 0, key
        assert row["cpu_ms_per_op"] > 0, key
    for name in (raw, ours, lg, es, dbos):
        assert res["settings"][name], name
    for name in (raw, lg, es, dbos):  # every SQLite commit fsynced: synchronous=FULL (2)
        assert res["settings"][name]["synchronous"] == 2, (name, res["settings"][name])
    goals = [t for t in res["targets"] if not t.get("info")]
    assert goals and all(t["pass"] in (True, False) for t in goals), res["targets"]
    # the ceiling line: the design's rows as raw SQL against the fastest peer
    (ceiling,) = [t for t in res["targets"] if t.get("info")]
    assert ceiling["ours"].startswith(floor) and ceiling["ratio"] > 0

"""tools/bench_stores.py runs end to end on both stores: every row of its table, the raw
loops, the PostgresSaver peer and the targets, as valid JSON (no timing checks).

It starts its own throwaway PostgreSQL server, so it is skipped without the server
binaries (or without psycopg); the peer's rows are expected only when
langgraph-checkpoint-postgres (the bench extra) is installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.testing.pgserver import INSTALL_HINT, find_bindir

ROOT = Path(__file__).resolve().parents[2]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


pytestmark = [
    pytest.mark.skipif(find_bindir() is None, reason=INSTALL_HINT),
    pytest.mark.skipif(not _has("psycopg"), reason="psycopg is not installed (the postgres"
                       " extra: pip install -e '.[postgres]')"),
]

ROW_KEYS = {"store", "writers", "steps_per_s", "commits_per_step", "commits_per_s",
            "raw_commits_per_s", "ratio_to_raw", "scaling", "raw_scaling", "p50_ms", "p99_ms",
            "cpus_busy", "own_cpus", "client_cpu_ms_per_step", "server_cpu_ms_per_step",
            "lock_held_ms_per_step", "lock_wait_ms_per_step"}


def test_quick_run_gives_every_row_as_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_stores.py"), "--quick", "--writers", "1,2",
         "--json", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout)
    assert res["tool"] == "bench_stores" and res["mode"] == "quick"
    assert res["stores"] == ["sqlite", "postgres"] and res["writers"] == [1, 2]

    rows = {(r["store"], r["writers"]): r for r in res["rows"]}
    assert set(rows) == {("sqlite", 1), ("sqlite", 2), ("postgres", 1), ("postgres", 2)}
    for key, row in rows.items():
        assert ROW_KEYS <= set(row), (key, ROW_KEYS - set(row))
        # every figure was measured (> 0), none is asserted against a speed
        for field in ("steps_per_s", "commits_per_s", "raw_commits_per_s", "ratio_to_raw",
                      "scaling", "raw_scaling"):
            assert isinstance(row[field], float | int) and row[field] > 0, (key, field, row)
        assert row["commits_per_step"] >= 1, (key, row)
    for store in ("sqlite", "postgres"):
        assert rows[(store, 1)]["scaling"] == 1.0
        assert len(res["commits_per_step"][store]) >= 1
        assert all(c >= 1 for c in res["commits_per_step"][store])
        assert res["raw_payload_bytes"][store] > 0

    # a durable server: synchronous commit and fsync on, read back from it
    settings = res["postgres"]["settings"]
    assert settings["synchronous_commit"] == "on" and settings["fsync"] == "on", settings
    assert res["postgres"]["own_server"] is True
    assert "@" in res["postgres"]["url"] and "password" not in res["postgres"]["url"]

    if _has("langgraph.checkpoint.postgres"):
        assert res["skipped"] == {}, res["skipped"]
        peer = {r["writers"]: r for r in res["peer"]}
        assert set(peer) == {1, 2}
        for r in peer.values():
            assert r["puts_per_s"] > 0 and r["scaling"] > 0, r
        assert res["peer_commits_per_put"] > 0
    else:
        assert "PostgresSaver" in res["skipped"] and res["peer"] == []

    targets = {t["target"]: t for t in res["targets"]}
    assert len(targets) == 3, targets  # 16 writers vs 1 on PostgreSQL; 1 writer vs raw x 2
    scaling = [t for t in res["targets"] if "16 writers" in t["target"]]
    assert len(scaling) == 1 and scaling[0]["pass"] is None  # 16 was not measured here
    for t in res["targets"]:
        if t is not scaling[0]:
            assert t["pass"] in (True, False) and t["value"] > 0, t
    assert res["machine"]["cpus"] >= 1 and len(res["machine"]["load_before"]) == 3

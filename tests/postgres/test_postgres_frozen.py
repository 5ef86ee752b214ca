"""A frozen writer does not stop a PostgreSQL fleet (docs/design.md "Many writers").

Real processes, a real server: worker A (a child process) SIGSTOPs itself during its
apply — in its file work, after its first exchange (no transaction open: the store's
write lock covers commits only, docs/design.md "Epochs and leases"), or just before
COMMIT (inside the write transaction, holding the chain lock every writer needs).
Meanwhile the parent, worker B, keeps committing steps on another workspace, and takes
A's workspace over. Stopped in its file work A holds nothing; stopped in its commit, the
server ends A's silent session at the idle bound (`CHAIN_IDLE_MS`, `WRITE_IDLE_MS`;
shortened here so the test runs in seconds). So B's steps wait at most that long, the
takeover succeeds, and once A is continued it hears a typed error, commits nothing, and
its files are back as they were.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, StepStatus, run_fenced_step

psycopg = pytest.importorskip("psycopg")

WRITE_IDLE_MS = 1500
CHAIN_IDLE_MS = 1000

CHILD = r"""
import json, os, signal, sys
import ledger.store.postgres as pg
pg.WRITE_IDLE_MS, pg.CHAIN_IDLE_MS = int(sys.argv[3]), int(sys.argv[4])
from ledger import Ledger, StepPlan, Write
from ledger.blobs import digest_of
url, stage = sys.argv[1], sys.argv[2]
seen = []
def on_op(name):
    seen.append(name)
    hit = (stage == "chain" and name == "commit" and "ws-rename" in seen) or (
        stage == "files" and name == "ws-rename" and seen.count("ws-rename") == 2)
    if hit and not os.environ.get("STOPPED_ONCE"):
        os.environ["STOPPED_ONCE"] = "1"
        print("STOPPED", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
led = Ledger.open(url, on_op=on_op)
epoch = int(sys.argv[5])
try:
    led.workspaces.admit("w1", epoch, [StepPlan("a1", [
        Write("a.txt", b"A's a\n", digest_of(b"a0\n")),
        Write("b.txt", b"A's b\n", digest_of(b"b0\n"))])])
    out = led.workspaces.apply("a1", epoch=epoch).verdict
    print(json.dumps({"verdict": out}), flush=True)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
"""


def _sessions(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(int(r[0]), str(r[1])) for r in conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'steptrail' AND pid <> pg_backend_pid()").fetchall()]


@pytest.mark.parametrize("stage", ["files", "chain"])
def test_a_frozen_writer_loses_its_session_and_the_fleet_goes_on(
        pg_url: str, tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.store.postgres as pg
    monkeypatch.setattr(pg, "WRITE_IDLE_MS", WRITE_IDLE_MS)
    monkeypatch.setattr(pg, "CHAIN_IDLE_MS", CHAIN_IDLE_MS)
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    w1.mkdir()
    w2.mkdir()
    (w1 / "a.txt").write_bytes(b"a0\n")
    (w1 / "b.txt").write_bytes(b"b0\n")
    (w2 / "app.py").write_bytes(b"0\n")
    led = Ledger.init(pg_url, busy_timeout_ms=8000)
    led.workspaces.add("w1", str(w1))
    led.workspaces.add("w2", str(w2))
    a_epoch = led.workspaces.acquire("w1", "A", ttl_s=3600).epoch
    b_epoch = led.workspaces.acquire("w2", "B", ttl_s=3600).epoch
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, pg_url, stage, str(WRITE_IDLE_MS), str(CHAIN_IDLE_MS),
         str(a_epoch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "STOPPED", (line, child.stderr.read() if child.stderr else "")
        frozen_at = time.monotonic()
        # in its file work A holds no transaction (nothing to wait for); in its commit, one
        idle = any(state == "idle in transaction" for _pid, state in _sessions(pg_url))
        assert idle is (stage == "chain")
        # B keeps committing on its own workspace: the first step waits at most the idle
        # bound of what A holds (the chain: CHAIN_IDLE_MS; in its file work A holds nothing
        # B needs), the rest do not wait at all
        waits = []
        for i in range(5):
            t0 = time.monotonic()
            out = run_fenced_step(led, "w2", f"b{i}",
                                  lambda r, i=i: [r.read("app.py").write(f"{i}\n".encode())],
                                  epoch=b_epoch)
            waits.append(time.monotonic() - t0)
            assert out.status is StepStatus.APPLIED, out
        assert max(waits) < (CHAIN_IDLE_MS + WRITE_IDLE_MS) / 1000 + 3, waits
        # a takeover of A's workspace succeeds within the write bound (A's workspace
        # lock goes with its session; in its file work A holds none), and settles A's
        # attempt
        lease = led.workspaces.acquire("w1", "B", ttl_s=3600, force=True)
        took = time.monotonic() - frozen_at
        assert lease.epoch > a_epoch
        assert took < WRITE_IDLE_MS / 1000 + 5, took
        assert not any(state == "idle in transaction" for _pid, state in _sessions(pg_url))
        assert (w1 / "a.txt").read_bytes() == b"a0\n"
        assert (w1 / "b.txt").read_bytes() == b"b0\n"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        rest, err = child.communicate(timeout=60)
    answer: dict[str, Any] = json.loads(rest.strip().splitlines()[-1])
    assert answer.get("error") in ("DatabaseUnavailable", "StaleEpoch"), (answer, err)
    assert "Traceback" not in err, err
    # A committed nothing; its files are what they were; the ledger verifies
    assert led.find_step("a1").state in ("compensated", "rejected"), led.find_step("a1")
    assert (w1 / "a.txt").read_bytes() == b"a0\n"
    assert (w1 / "b.txt").read_bytes() == b"b0\n"
    assert not [p for p in os.listdir(w1) if p.startswith(".")], os.listdir(w1)
    assert led.verify().ok
    led.close()


def test_the_documented_bounds_are_the_code_s() -> None:
    """docs/design.md and docs/operations.md state the bounds this module uses."""
    import ledger.store.postgres as pg
    root = Path(__file__).resolve().parents[2]
    design = (root / "docs" / "design.md").read_text()
    ops = (root / "docs" / "operations.md").read_text()
    for value in (pg.WRITE_IDLE_MS, pg.CHAIN_IDLE_MS, pg.EXCLUSIVE_POLL_MS):
        shown = f"{value // 1000} s"
        assert shown in design and shown in ops, shown

"""gc's collection of workspace temporaries against a live worker's apply.

`gc` removes, in every workspace, the temporaries no live stager can own
(`Workspaces.remove_abandoned_temporaries`): for the live epoch, those of attempts
that are over. It read the attempts in flight once, before it listed the workspace's
directories: an attempt admitted and staged between that read and the listing was taken
for one that is over, its staged file was removed, and the worker's apply was refused
(its bytes were held by the ledger: a false refusal, not a loss). Played here in that
order, deterministically: gc's read, then the worker's admit and staging (the worker
held at its first rename, its landing), then gc's listing, then the landing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import ledger.step.tidy as tidy_mod
from ledger import Ledger, run_fenced_step
from ledger.step.values import StepPlan


def test_gc_between_a_workers_admit_and_landing_leaves_its_staged_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0\n")
    db = str(tmp_path / "ledger.db")
    staged, go = threading.Event(), threading.Event()
    renames = [0]

    def on_op(name: str) -> None:
        if name == "ws-rename" and threading.current_thread().name == "worker":
            renames[0] += 1
            if renames[0] == 1:  # the landing's first move: the staged file is in place
                staged.set()
                assert go.wait(30)

    with Ledger.init(db) as setup:
        setup.workspaces.add("w", str(ws))
        epoch = setup.workspaces.acquire("w", "worker", ttl_s=3600).epoch
        # a step before: the ledger knows the root's paths (gc looks where it knows some)
        done = run_fenced_step(setup, "w", "s0", lambda read: [read.read("app.py").write(b"v1\n")],
                               epoch=epoch)
        assert done.status == "applied", done
    worker = Ledger.open(db, on_op=on_op)
    collector = Ledger.open(db)
    out: dict[str, object] = {}

    def work() -> None:
        try:
            read = worker.workspaces.read_file("w", "app.py")
            plan = StepPlan("s1", [read.write(b"the worker's\n")])
            assert worker.workspaces.admit("w", epoch, [plan]) == [None]
            out["verdict"] = worker.workspaces.apply("s1", epoch=epoch).verdict
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc
            staged.set()

    real = tidy_mod.staging.remove_temporaries

    def between(*args: object, **kwargs: object) -> int:
        if threading.current_thread().name == "worker":  # the apply's own clean-up
            return real(*args, **kwargs)  # type: ignore[arg-type]
        # gc has read the attempts in flight (none): the worker admits and stages now
        thread = threading.Thread(target=work, name="worker")
        thread.start()
        out["thread"] = thread
        assert staged.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tidy_mod.staging, "remove_temporaries", between)
    try:
        removed = collector.workspaces.remove_abandoned_temporaries(time.time_ns())
        monkeypatch.setattr(tidy_mod.staging, "remove_temporaries", real)
        go.set()
        out["thread"].join(30)  # type: ignore[attr-defined]
        assert "error" not in out, out
        assert out["verdict"] == "applied", (out, removed)
        assert (ws / "app.py").read_bytes() == b"the worker's\n"
        assert [p.name for p in ws.iterdir()] == ["app.py"]
        assert worker.verify().ok
    finally:
        go.set()
        worker.close()
        collector.close()

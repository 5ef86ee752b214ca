"""A real LangGraph graph on the saver, SIGKILLed mid-run in a subprocess and resumed
from the ledger in a fresh process, ends in the state an uninterrupted run ends in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("langgraph.graph")

ROOT = Path(__file__).resolve().parents[2]

GRAPH = r'''
import json, operator, os, sys, time
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph
from ledger import Ledger
from ledger.langgraph import LedgerSaver

class State(TypedDict):
    log: Annotated[list, operator.add]
    total: int

def node(k):
    def run(state):
        if os.environ.get("HANG_AT") == str(k):
            # the checkpoint before this node is durable first: LangGraph writes it in
            # the background (async durability), so a kill timed only by reaching this
            # node could land before any checkpoint committed on a loaded machine
            while True:
                got = saver.get_tuple(config)
                if got is not None and f"node-{k - 1}" in got.checkpoint[
                        "channel_values"].get("log", []):
                    break
                time.sleep(0.02)
            open(os.environ["MARK"], "w").write("reached")
            time.sleep(120)  # the parent SIGKILLs us here, mid-run
        return {"log": [f"node-{k}"], "total": state["total"] * 2 + k}
    return run

builder = StateGraph(State)
for k in range(1, 7):
    builder.add_node(f"n{k}", node(k))
builder.add_edge(START, "n1")
for k in range(1, 6):
    builder.add_edge(f"n{k}", f"n{k + 1}")
builder.add_edge("n6", END)

db, thread, mode = sys.argv[1], sys.argv[2], sys.argv[3]
with (Ledger.open(db) if os.path.exists(db) else Ledger.init(db)) as ledger:
    saver = LedgerSaver(ledger)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}
    out = graph.invoke({"log": [], "total": 1} if mode == "start" else None, config)
    print(json.dumps(out))
'''


def run(script: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          timeout=120)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_sigkilled_graph_resumes_from_the_ledger_to_the_same_state(tmp_path: Path) -> None:
    script = tmp_path / "graph.py"
    script.write_text(GRAPH)
    db = str(tmp_path / "ledger.db")
    expected = run(script, db, "uninterrupted", "start")
    mark = tmp_path / "reached"
    proc = subprocess.Popen([sys.executable, str(script), db, "killed", "start"],
                            env={**os.environ, "PYTHONPATH": str(ROOT), "HANG_AT": "4",
                                 "MARK": str(mark)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the graph never reached node 4"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    resumed = run(script, db, "killed", "resume")  # a fresh process, the same thread
    assert resumed == expected
    assert resumed["log"] == [f"node-{k}" for k in range(1, 7)]  # node 4 ran once, durably

    from ledger import Ledger
    with Ledger.open(db) as ledger:
        assert ledger.verify().ok

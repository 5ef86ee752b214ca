"""A LangGraph graph checkpointed in a steptrail ledger: thread ownership, then prune + GC.

    python examples/langgraph_graph.py [LEDGER]     # default: .steptrail/ledger.db here

Needs the extra: pip install 'steptrail[langgraph]'. Any ledger location works,
a postgresql:// URL included. What it shows:

1. worker A claims thread "ticket-42" and runs the graph twice (each run adds a
   paragraph to a draft, so every checkpoint has a new, growing value);
2. worker B presumes A dead and claims the thread with takeover (a new epoch of the
   thread's lease) and runs it once more;
3. A's late run is refused: its first checkpoint write raises StaleEpoch, and nothing of
   it lands — the thread's history is B's alone (LangGraph's own savers would fork it);
4. B prunes the thread (keep_latest: what a resume needs stays) and GC reclaims the
   pruned checkpoints' values.
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from ledger import Ledger, StaleEpoch
from ledger.gc import audit, collect
from ledger.langgraph import LedgerSaver


class State(TypedDict):
    draft: Annotated[str, operator.add]  # each run appends; never replaced
    runs: Annotated[int, operator.add]


def write(state: State) -> dict:
    n = state["runs"] + 1
    return {"draft": f"Paragraph {n}. " + "All work and no play. " * 30 + "\n", "runs": 1}


builder = StateGraph(State)
builder.add_node("write", write)
builder.add_edge(START, "write")
builder.add_edge("write", END)

THREAD = {"configurable": {"thread_id": "ticket-42"}}
NOTHING_NEW: State = {"draft": "", "runs": 0}  # a run's input: the reducers add nothing


def main() -> int:
    location = sys.argv[1] if len(sys.argv) > 1 else ".steptrail/ledger.db"
    with Ledger.init(location) as ledger:
        saver_a, saver_b = LedgerSaver(ledger), LedgerSaver(ledger)  # two workers' savers
        graph_a = builder.compile(checkpointer=saver_a)
        graph_b = builder.compile(checkpointer=saver_b)

        # 1. A owns the thread: its checkpoints carry the epoch of the thread's lease.
        print("A claims, epoch", saver_a.claim("ticket-42", holder="worker-a").epoch)
        for _ in range(2):
            graph_a.invoke(NOTHING_NEW, THREAD)
        print("after A: runs =", graph_a.get_state(THREAD).values["runs"])

        # 2. B takes over (A missed its deadline). From now on A's writes are refused.
        print("B takes over, epoch",
              saver_b.claim("ticket-42", holder="worker-b", takeover=True).epoch)
        graph_b.invoke(NOTHING_NEW, THREAD)

        # 3. A, not knowing, runs again: refused at its first write, nothing recorded.
        try:
            graph_a.invoke(NOTHING_NEW, THREAD)
            print("A's late run landed (should not happen)")
            return 1
        except StaleEpoch as exc:
            print("A's late run refused: StaleEpoch:", exc)
        state = graph_b.get_state(THREAD).values
        print("after B: runs =", state["runs"], "paragraphs =", state["draft"].count("Paragraph"))

        # 4. Prune (a write too: the owner does it) and collect. keep_latest keeps the
        # newest checkpoint and its pending writes; the others' values become orphans.
        before = len(list(saver_b.list(THREAD)))
        saver_b.prune(["ticket-42"], strategy="keep_latest")
        after = len(list(saver_b.list(THREAD)))
        print(f"checkpoints: {before} before prune, {after} after")
        # grace_s=0 (with force) only for the example: a scheduled gc keeps a 24 h window
        report = collect(ledger, grace_s=0, force=True)
        print(f"gc reclaimed {report.collected} blobs, {report.reclaimed_bytes} bytes")
        print("the thread resumes from:", graph_b.get_state(THREAD).values["runs"], "runs")
        print("audit", "ok" if audit(ledger).ok else "FAILED",
              "| verify", "ok" if ledger.verify().ok else "FAILED")

        saver_b.release("ticket-42")  # done with the thread; A's claim stays lost
        saver_a.close()
        saver_b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

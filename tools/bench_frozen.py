#!/usr/bin/env python3
"""A frozen writer against a PostgreSQL fleet: the others' steps/s, and the takeover.

    .venv/bin/python tools/bench_frozen.py            # 120 s a side, 3 writers
    .venv/bin/python tools/bench_frozen.py --quick    # 20 s a side
    .venv/bin/python tools/bench_frozen.py --json

Two sides on one throwaway PostgreSQL server, `--seconds` each, in
`--rounds` alternating rounds: the writers (processes, each a loop of `run_fenced_step`
on a workspace of its own), alone; and the same writers while one more worker SIGSTOPs
itself inside a write transaction holding the chain lock (the worst place: every writer
needs that lock) and stays stopped for the whole round (a new one each round). Printed: the writers' steps/s in both runs and their ratio (goal:
at least 0.8), the longest any one step waited, and how long a `lease acquire --force`
of the frozen worker's workspace took (goal: within the write idle bound,
`ledger.store.postgres.WRITE_IDLE_MS`, plus a second).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

WRITER = r"""
import json, sys, time
from ledger import Ledger, StepStatus, run_fenced_step
url, ws, until, tag = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
led = Ledger.open(url)
epoch = led.workspaces.acquire(ws, "bench-" + ws, ttl_s=3600, force=True).epoch
n, longest = 0, 0.0
while time.time() < until:
    t0 = time.monotonic()
    out = run_fenced_step(led, ws, f"{tag}-{ws}-{n}",
                          lambda r: [r.read("app.py").write(f"{n}\n".encode() * 64)],
                          epoch=epoch)
    longest = max(longest, time.monotonic() - t0)
    assert out.status is StepStatus.APPLIED, out
    n += 1
print(json.dumps({"steps": n, "longest_s": longest}))
led.close()
"""

FROZEN = r"""
import os, signal, sys
from ledger import Ledger, StepPlan, Write
from ledger.blobs import digest_of
url, ws = sys.argv[1], sys.argv[2]
seen = []
def on_op(name):
    seen.append(name)
    if name == "commit" and "ws-rename" in seen:
        print("STOPPED", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
led = Ledger.open(url, on_op=on_op)
epoch = led.workspaces.acquire(ws, "frozen", ttl_s=3600).epoch
led.workspaces.admit(ws, epoch, [StepPlan("frozen-1", [Write("app.py", b"frozen\n", digest_of(b"0\n"))])])
led.workspaces.apply("frozen-1", epoch=epoch)
"""


def _run(url: str, names: list[str], seconds: float, frozen: str | None,
         tag: str) -> dict[str, Any]:
    stopped = None
    took = None
    if frozen is not None:
        stopped = subprocess.Popen([sys.executable, "-c", FROZEN, url, frozen],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert stopped.stdout is not None
        if stopped.stdout.readline().strip() != "STOPPED":
            raise SystemExit("the frozen worker did not reach its transaction")
    until = time.time() + seconds
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, ws, str(until), tag],
                              stdout=subprocess.PIPE, text=True) for ws in names]
    try:
        if frozen is not None:
            from ledger import Ledger
            with Ledger.open(url) as led:
                t0 = time.monotonic()
                led.workspaces.acquire(frozen, "takeover", ttl_s=3600, force=True)
                took = time.monotonic() - t0
        outs = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
            stopped.wait(60)
    return {"steps_per_s": sum(o["steps"] for o in outs) / seconds,
            "longest_step_s": max(o["longest_s"] for o in outs), "takeover_s": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 s a side")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seconds = args.seconds or (20.0 if args.quick else 120.0)
    from ledger import Ledger
    from ledger.store import postgres as pg
    from ledger.testing.pgserver import PgServer
    server = PgServer.start()
    root = tempfile.mkdtemp(prefix="bench-frozen-")
    made = iter(range(1_000_000))

    def fresh_ledger(names: list[str]) -> str:
        """A new, empty ledger for one side of one round: every side starts from the
        same size, so neither pays for the other's history."""
        n = next(made)
        url = server.create_database(f"bench_frozen_{n}")
        with Ledger.init(url) as led:
            for ws in names:
                os.makedirs(os.path.join(root, f"{n}", ws))
                with open(os.path.join(root, f"{n}", ws, "app.py"), "wb") as f:
                    f.write(b"0\n")
                led.workspaces.add(ws, os.path.join(root, f"{n}", ws))
        return url

    try:
        names = [f"w{i}" for i in range(args.writers)]
        # the two sides interleaved round by round (a noisy machine drifts over minutes)
        per = seconds / args.rounds
        alones, frozens = [], []
        for r in range(args.rounds):
            for side in ("alone", "frozen"):
                frozen = "frozen" if side == "frozen" else None
                url = fresh_ledger([*names, "frozen"])
                got = _run(url, names, per, frozen, f"{side}{r}")
                (frozens if frozen else alones).append(got)
        alone = {"steps_per_s": sum(a["steps_per_s"] for a in alones) / args.rounds,
                 "longest_step_s": max(a["longest_step_s"] for a in alones)}
        with_frozen = {"steps_per_s": sum(f["steps_per_s"] for f in frozens) / args.rounds,
                       "longest_step_s": max(f["longest_step_s"] for f in frozens),
                       "takeover_s": max(f["takeover_s"] for f in frozens)}
    finally:
        server.close()
    ratio = with_frozen["steps_per_s"] / alone["steps_per_s"]
    bound = pg.WRITE_IDLE_MS / 1000
    result = {
        "seconds": seconds, "writers": args.writers, "rounds": args.rounds,
        "alone_steps_per_s": round(alone["steps_per_s"], 1),
        "with_frozen_steps_per_s": round(with_frozen["steps_per_s"], 1),
        "ratio": round(ratio, 3), "ratio_goal": 0.8,
        "ratio_verdict": "PASS" if ratio >= 0.8 else "FAIL",
        "longest_step_alone_s": round(alone["longest_step_s"], 3),
        "longest_step_with_frozen_s": round(with_frozen["longest_step_s"], 3),
        "takeover_s": round(with_frozen["takeover_s"], 3), "takeover_bound_s": bound,
        "takeover_verdict": "PASS" if with_frozen["takeover_s"] <= bound + 1 else "FAIL",
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.writers} writers on PostgreSQL, {seconds:.0f} s a side in {args.rounds}"
          " alternating rounds")
    print(f"  alone                        {result['alone_steps_per_s']:8.1f} steps/s"
          f"  (longest step {result['longest_step_alone_s']} s)")
    print(f"  one more worker SIGSTOPped   {result['with_frozen_steps_per_s']:8.1f} steps/s"
          f"  (longest step {result['longest_step_with_frozen_s']} s)")
    print(f"  ratio                        {ratio:8.3f}  goal >= 0.8: {result['ratio_verdict']}")
    print(f"  takeover of its workspace    {result['takeover_s']:8.3f} s  bound {bound:.0f} s"
          f" + 1: {result['takeover_verdict']}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Group commit: durable steps/s of 16 concurrent step runners in one process against
one runner, measured in the same run.

Run from the repository root::

    .venv/bin/python tools/bench_group.py            # full run (about 2 minutes)
    .venv/bin/python tools/bench_group.py --quick    # fewer steps and repetitions
    .venv/bin/python tools/bench_group.py --json     # machine-readable results on stdout

Each step is ``ledger.runner.run_step`` with one 4 KiB artifact (inline): plan, pin,
the bytes, ``blob-stored``, ``manifest-published`` and ``acked`` — 1 commit when
alone, on a ledger with default options (WAL, ``synchronous=FULL``). Cases, each on a
fresh ledger, interleaved in every repetition:

* ``1 runner``: one thread, steps one after another (the baseline);
* ``16 threads``: 16 threads in one process, each running its own steps on one
  ``Ledger`` (group commit: concurrent appends share a transaction and its fsync);
* ``16 tasks``: 16 asyncio tasks on one ``ledger.aio.AsyncLedger``
  (``ledger.aio.run_step``);
* ``16 threads, no group``: the 16 threads with ``ledger.log.group_commit = False`` —
  each append its own transaction, the threads taking turns (what concurrency buys
  without group commit).

Target: 16 runners (threads, and asyncio tasks) >= 5x one runner's steps/s.

Where the ceiling is: the commits are counted (``on_op``), so the run prints how many
appends each COMMIT carried. With one fsync shared by many steps, what remains per step
is CPU: Python (validation, keys, folds, the runner) under one GIL, and SQLite's own
work, on a 2-core machine shared with the fsync. ``cpu ceiling`` is one runner's steps/s
with ``synchronous=OFF`` (the same work, no fsync at all): no number of runners sharing
fsyncs in one process can go faster than the CPU lets one of them go without fsyncs, so
``ceiling ratio`` = that / one runner's durable steps/s bounds the ratio on this machine.
``fsync per commit`` is the time a COMMIT adds with ``synchronous=FULL`` over OFF.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import apsw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: fsinfo
from fsinfo import fs_info  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger.aio import AsyncLedger  # noqa: E402
from ledger.aio import run_step as arun_step  # noqa: E402
from ledger.runner import run_step  # noqa: E402

TARGET = 5.0
RUNNERS = 16
DATA = 4 * 1024


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def payload(tag: str) -> bytes:
    seed = tag.encode()
    return (seed * (DATA // len(seed) + 1))[:DATA]


class Case:
    def __init__(self, scratch: str, name: str, *, synchronous: str = "FULL") -> None:
        self.dir = tempfile.mkdtemp(prefix=name.replace(" ", "_").replace(",", ""), dir=scratch)
        self.commits = 0

        def on_op(op: str) -> None:
            if op == "commit":
                self.commits += 1

        self.ledger = Ledger.init(os.path.join(self.dir, "ledger.db"), on_op=on_op,
                                  synchronous=synchronous)  # type: ignore[arg-type]

    def close(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def one_runner(case: Case, steps: int, tag: str) -> float:
    led = case.ledger
    t0 = time.perf_counter()
    for n in range(steps):
        step = f"{tag}-{n}"
        run_step(led, step, {"out.bin": payload(step)})
    return time.perf_counter() - t0


def threads(case: Case, steps: int, tag: str, runners: int) -> float:
    led = case.ledger
    per = steps // runners
    errors: list[BaseException] = []
    start = threading.Barrier(runners + 1)

    def work(t: int) -> None:
        start.wait()
        try:
            for n in range(per):
                step = f"{tag}-{t}-{n}"
                run_step(led, step, {"out.bin": payload(step)})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(runners)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return took


def tasks(case: Case, steps: int, tag: str, runners: int) -> float:
    per = steps // runners

    async def main() -> float:
        aled = AsyncLedger(case.ledger, max_workers=runners)

        async def work(t: int) -> None:
            for n in range(per):
                step = f"{tag}-{t}-{n}"
                await arun_step(aled, step, {"out.bin": payload(step)})

        t0 = time.perf_counter()
        await asyncio.gather(*(work(t) for t in range(runners)))
        took = time.perf_counter() - t0
        await aled.aclose()
        return took

    return asyncio.run(main())


def run_case(scratch: str, name: str, steps: int, rep: int, runners: int) -> dict[str, Any]:
    sync = "OFF" if name == "cpu ceiling" else "FULL"
    case = Case(scratch, f"{name}-{rep}-", synchronous=sync)
    try:
        tag = f"r{rep}"
        before = case.commits
        cpu0 = time.process_time()
        if name in ("1 runner", "cpu ceiling"):
            took = one_runner(case, steps, tag)
        elif name == "16 threads":
            took = threads(case, steps, tag, runners)
        elif name == "16 threads, no group":
            case.ledger.log.group_commit = False
            took = threads(case, steps, tag, runners)
        else:
            took = tasks(case, steps, tag, runners)
        cpu = time.process_time() - cpu0
        done = steps if name in ("1 runner", "cpu ceiling") else (steps // runners) * runners
        if not case.ledger.verify().ok:
            raise SystemExit(f"{name}: the ledger does not verify")
        return {"steps": done, "seconds": took, "steps_per_s": done / took,
                "commits_per_step": (case.commits - before) / done,
                "cpu_ms_per_step": 1000 * cpu / done}
    finally:
        case.close()


def fsync_cost(scratch: str, n: int) -> dict[str, float]:
    """ms per COMMIT of a one-row transaction, synchronous=FULL and OFF (raw apsw)."""
    out: dict[str, float] = {}
    for sync in ("FULL", "OFF"):
        path = os.path.join(scratch, f"raw-{sync}.db")
        conn = apsw.Connection(path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute("CREATE TABLE t(x BLOB)")
        t0 = time.perf_counter()
        for _ in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 200,))
            conn.execute("COMMIT")
        out[sync] = 1000 * (time.perf_counter() - t0) / n
        conn.close()
    return out


CASES = ("1 runner", "16 threads", "16 tasks", "16 threads, no group", "cpu ceiling")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--steps", type=int, help="steps per case and repetition")
    ap.add_argument("--reps", type=int, help="repetitions (the cases interleaved in each)")
    ap.add_argument("--dir", metavar="DIR", help="parent of the scratch directory (default:"
                    " the repository root; never a RAM file system, fsync is the point)")
    args = ap.parse_args(argv)
    steps = args.steps or (160 if args.quick else 480)
    reps = args.reps or (3 if args.quick else 5)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    scratch = tempfile.mkdtemp(prefix=".bench_group-", dir=os.path.abspath(args.dir or repo))
    fs = fs_info(scratch)
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CASES}
    try:
        fsync = fsync_cost(scratch, 100 if args.quick else 300)
        for rep in range(reps):
            order = CASES if rep % 2 == 0 else tuple(reversed(CASES))
            for name in order:
                runs[name].append(run_case(scratch, name, steps, rep, RUNNERS))
                log(f"  rep {rep + 1}/{reps} {name:22} {runs[name][-1]['steps_per_s']:8.1f} steps/s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def ratio(name: str) -> tuple[float, float, float]:
        per = [runs[name][i]["steps_per_s"] / runs["1 runner"][i]["steps_per_s"]
               for i in range(reps)]
        return statistics.median(per), min(per), max(per)

    res: dict[str, Any] = {
        "meta": {"python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
                 "cpus": os.cpu_count(), "quick": args.quick, "steps": steps, "reps": reps,
                 "runners": RUNNERS, "artifact_bytes": DATA, "scratch_fs": fs,
                 "target": TARGET, "loadavg": os.getloadavg(),
                 "seconds": time.perf_counter() - t0},
        "fsync_ms_per_commit": {"FULL": fsync["FULL"], "OFF": fsync["OFF"],
                                "fsync": fsync["FULL"] - fsync["OFF"]},
        "cases": {name: {"steps_per_s": med(name, "steps_per_s"),
                         "commits_per_step": med(name, "commits_per_step"),
                         "cpu_ms_per_step": med(name, "cpu_ms_per_step"),
                         "ratio": ratio(name), "runs": runs[name]} for name in CASES},
    }
    verdicts = {name: ratio(name)[0] >= TARGET for name in ("16 threads", "16 tasks")}
    res["pass"] = all(verdicts.values())
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("steptrail group commit: 16 concurrent step runners in one process vs one runner")
    print(f"  python {platform.python_version()}  SQLite {apsw.sqlite_lib_version()}  cpus"
          f" {os.cpu_count()}  steps {steps}  reps {reps}  load {os.getloadavg()[0]:.1f}"
          f"  ({res['meta']['seconds']:.0f} s)")
    print(f"  scratch: {fs['fstype']} on {fs['mount']}; raw COMMIT {fsync['FULL']:.2f} ms"
          f" (FULL) vs {fsync['OFF']:.2f} ms (OFF): fsync per commit"
          f" {fsync['FULL'] - fsync['OFF']:.2f} ms")
    print("  step: run_step, one 4 KiB inline artifact (1 commit alone); medians, ratio ="
          " median of per-rep ratios [min-max]")
    print(f"  {'case':24} {'steps/s':>9} {'vs 1':>20} {'commits/step':>13} {'cpu ms/step':>12}")
    for name in CASES:
        c = res["cases"][name]
        r = c["ratio"]
        verdict = ""
        if name in verdicts:
            verdict = f"  target >= {TARGET:.0f}x  {'PASS' if verdicts[name] else 'FAIL'}"
        print(f"  {name:24} {c['steps_per_s']:9.1f} {r[0]:7.2f}x [{r[1]:.2f}-{r[2]:.2f}]"
              f" {c['commits_per_step']:13.2f} {c['cpu_ms_per_step']:12.2f}{verdict}")
    ceiling = res["cases"]["cpu ceiling"]["ratio"][0]
    print(f"  ceiling: one runner without any fsync does {ceiling:.2f}x one durable runner;"
          " 16 runners sharing fsyncs under one GIL cannot pass that")
    print(f"RESULT: {'PASS' if res['pass'] else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

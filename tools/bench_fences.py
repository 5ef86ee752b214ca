#!/usr/bin/env python3
"""Benchmark a fenced workspace step against its raw I/O floor, in the same run.

    .venv/bin/python tools/bench_fences.py            # 300 steps per side, 3 rounds
    .venv/bin/python tools/bench_fences.py --quick    # 60 steps, 1 round
    .venv/bin/python tools/bench_fences.py --json
    .venv/bin/python tools/bench_fences.py --compare /tmp/base   # and another checkout

Two ways of running the same step are timed: `run_fenced_step` (one call: the plan, then
the apply with its manifest and ack in one more commit) and the four calls `admit`,
`apply`, `publish`, `ack` one after the other. ``--compare DIR`` also times the four
calls on another checkout of the package (``git worktree add /tmp/base REV``), in a
child process with that tree first on the path, interleaved round by round with ours:
the before/after of a change, measured in the same run.

A step (ours): `admit` one write of 1 KiB to a file under a live lease, `apply` it
(pre-image pinned, post-image staged, fence checked, renamed, `fenced` recorded),
`publish`, `ack` — every commit `synchronous=FULL`. The floor does the same number
of commits (counted through the ledger's `on_op` hook, not assumed) as single-row
INSERTs in a bare WAL database with the same pragmas, plus the same durable file
replacement (write a temporary file, fsync, rename over the target, fsync the
directory). Ratios, not absolute times: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import apsw

from ledger import Ledger, StepPlan, Write
from ledger.blobs import digest_of

SIZE = 1024


def one_call(root: str, n: int) -> tuple[float, Counter[str]]:
    """The same steps through `run_fenced_step`."""
    from ledger import StepStatus, run_fenced_step

    def step(led: Ledger, epoch: int, i: int, content: bytes) -> None:
        out = run_fenced_step(led, "w", f"s{i}",
                              lambda read: [read.read("app.py").write(content)], epoch=epoch)
        assert out.status is StepStatus.APPLIED, out

    return _timed(root, n, step)


def other_tree(tree: str, n: int) -> float:
    """`ours` (the four calls) on the checkout at `tree`, in a child process."""
    env = dict(os.environ, PYTHONPATH=tree)
    code = ("import sys, json, tempfile; sys.path.insert(0, sys.argv[1]);"
            " sys.path.insert(1, sys.argv[2]); import bench_fences as b;"
            " d = tempfile.mkdtemp(); print(json.dumps(b.ours(d + '/x', int(sys.argv[3]))[0]))")
    done = subprocess.run([sys.executable, "-c", code, tree, os.path.dirname(__file__), str(n)],
                          env=env, capture_output=True, text=True, check=True, cwd=tree)
    return float(done.stdout.strip().splitlines()[-1])


def ours(root: str, n: int) -> tuple[float, Counter[str]]:
    """The four calls (also run on another checkout: only what every version has)."""
    def step(led: Ledger, epoch: int, i: int, content: bytes) -> None:
        rev, pre = led.workspaces.snapshot("w", "app.py")
        led.workspaces.admit("w", epoch, [StepPlan(f"s{i}", [Write("app.py", content, pre, rev)])])
        result = led.workspaces.apply(f"s{i}", epoch=epoch)
        assert result.verdict == "applied", result
        led.publish(f"s{i}")
        led.ack(f"s{i}")

    return _timed(root, n, step)


def _timed(root: str, n: int, step: Any) -> tuple[float, Counter[str]]:
    """`n` steps of one 1 KiB write to app.py in a fresh ledger under `root`: steps/s and
    the durable operations counted through the ledger's `on_op` hook."""
    ops: Counter[str] = Counter()
    ws = os.path.join(root, "ws")
    os.makedirs(ws)
    with open(os.path.join(ws, "app.py"), "wb") as f:
        f.write(b"0" * SIZE)
    with Ledger.init(os.path.join(root, "l.db"), on_op=lambda name: ops.update([name])) as led:
        led.workspaces.add("w", ws)
        epoch = led.workspaces.acquire("w", "bench", ttl_s=3600).epoch
        ops.clear()
        t0 = time.perf_counter()
        for i in range(n):
            step(led, epoch, i, f"{i:08d}".encode() * (SIZE // 8))
        return n / (time.perf_counter() - t0), ops


def floor(root: str, n: int, commits_per_step: int) -> float:
    os.makedirs(root)
    conn = apsw.Connection(os.path.join(root, "raw.db"))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB)")
    d = os.path.join(root, "raw")
    os.makedirs(d)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    t0 = time.perf_counter()
    k = 0
    for i in range(n):
        content = f"{i:08d}".encode() * (SIZE // 8)
        for _ in range(commits_per_step):
            k += 1
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (k, digest_of(content).encode()))
            conn.execute("COMMIT")
        fd = os.open("tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
        os.write(fd, content)
        os.fsync(fd)
        os.close(fd)
        os.rename("tmp", "app.py", src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    rate = n / (time.perf_counter() - t0)
    os.close(dfd)
    conn.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="another checkout of the package: its four-call step, timed beside")
    args = ap.parse_args()
    if args.compare and not os.path.isfile(os.path.join(args.compare, "ledger", "fences.py")):
        ap.error(f"--compare {args.compare}: no ledger/fences.py there")
    n, rounds = (60, 1) if args.quick else (300, 3)
    ours_rates, one_rates, floor_rates, base_rates = [], [], [], []
    counts: Counter[str] = Counter()
    one_counts: Counter[str] = Counter()
    for _ in range(rounds):
        root = tempfile.mkdtemp(prefix="bench-fences-", dir=args.dir)
        try:
            rate, one_counts = one_call(os.path.join(root, "c"), n)
            one_rates.append(rate)
            rate, counts = ours(os.path.join(root, "a"), n)
            commits = counts["commit"] // n
            ours_rates.append(rate)
            floor_rates.append(floor(os.path.join(root, "b"), n, commits))
            if args.compare:
                base_rates.append(other_tree(os.path.abspath(args.compare), n))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    o, f = statistics.median(ours_rates), statistics.median(floor_rates)
    c = statistics.median(one_rates)
    result: dict[str, object] = {
        "steps": n, "rounds": rounds, "ours_steps_per_s": round(o, 1),
        "one_call_steps_per_s": round(c, 1),
        "floor_steps_per_s": round(f, 1), "ratio": round(o / f, 3),
        "per_step_ops": {k: round(v / n, 2) for k, v in sorted(counts.items())},
        "one_call_per_step_ops": {k: round(v / n, 2) for k, v in sorted(one_counts.items())},
    }
    if base_rates:
        b = statistics.median(base_rates)
        result.update({"compare": args.compare, "base_steps_per_s": round(b, 1),
                       "one_call_vs_base": round(c / b, 3), "four_calls_vs_base": round(o / b, 3),
                       "target_2x": "PASS" if c / b >= 2 else "FAIL"})
    if args.json:
        print(json.dumps(result))
    else:
        print(f"fenced step (1 write of {SIZE} B), {n} steps x {rounds}")
        print(f"  one call (run_fenced_step)      {c:8.1f} steps/s,"
              f" durable operations per step: {result['one_call_per_step_ops']}")
        print(f"  four calls (admit..ack)         {o:8.1f} steps/s,"
              f" durable operations per step: {result['per_step_ops']}")
        print(f"  floor (same commits as 4 calls) {f:8.1f} steps/s  (+ one durable file replace, raw)")
        print(f"  four calls / floor              {o / f:8.3f}")
        if base_rates:
            print(f"  base checkout, four calls       {result['base_steps_per_s']:8.1f} steps/s"
                  f"  ({args.compare})")
            print(f"  one call / base                 {result['one_call_vs_base']:8.3f}"
                  f"  target >= 2.0: {result['target_2x']}")
            print(f"  four calls / base               {result['four_calls_vs_base']:8.3f}")


if __name__ == "__main__":
    main()

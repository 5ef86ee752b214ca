#!/usr/bin/env python3
"""Benchmark a fenced workspace step against its raw I/O floor, in the same run.

    .venv/bin/python tools/bench_fences.py            # 300 steps per side, 3 rounds
    .venv/bin/python tools/bench_fences.py --quick    # 60 steps, 1 round
    .venv/bin/python tools/bench_fences.py --json

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
import tempfile
import time
from collections import Counter

import apsw

from ledger import Ledger, StepPlan, Write
from ledger.blobs import digest_of

SIZE = 1024


def ours(root: str, n: int) -> tuple[float, Counter[str]]:
    ops: Counter[str] = Counter()
    ws = os.path.join(root, "ws")
    os.makedirs(ws)
    with open(os.path.join(ws, "app.py"), "wb") as f:
        f.write(b"0" * SIZE)
    with Ledger.init(os.path.join(root, "l.db"), on_op=lambda name: ops.update([name])) as led:
        led.add_workspace("w", ws)
        epoch = led.acquire("w", "bench", ttl_s=3600).epoch
        ops.clear()
        t0 = time.perf_counter()
        for i in range(n):
            rev, pre = led.snapshot("w", "app.py")
            content = f"{i:08d}".encode() * (SIZE // 8)
            led.admit("w", epoch, [StepPlan(f"s{i}", [Write("app.py", content, pre, rev)])])
            result = led.apply(f"s{i}", epoch=epoch)
            assert result.verdict == "applied", result
            led.publish(f"s{i}")
            led.ack(f"s{i}")
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
    args = ap.parse_args()
    n, rounds = (60, 1) if args.quick else (300, 3)
    ours_rates, floor_rates = [], []
    counts: Counter[str] = Counter()
    for _ in range(rounds):
        root = tempfile.mkdtemp(prefix="bench-fences-", dir=args.dir)
        try:
            rate, counts = ours(os.path.join(root, "a"), n)
            commits = counts["commit"] // n
            ours_rates.append(rate)
            floor_rates.append(floor(os.path.join(root, "b"), n, commits))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    o, f = statistics.median(ours_rates), statistics.median(floor_rates)
    result = {
        "steps": n, "rounds": rounds, "ours_steps_per_s": round(o, 1),
        "floor_steps_per_s": round(f, 1), "ratio": round(o / f, 3),
        "per_step_ops": {k: round(v / n, 2) for k, v in sorted(counts.items())},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"fenced step (admit, apply, publish, ack; 1 write of {SIZE} B), {n} steps x {rounds}")
        print(f"  durable operations per step: {result['per_step_ops']}")
        print(f"  ours  {o:8.1f} steps/s")
        print(f"  floor {f:8.1f} steps/s  (same commits + one durable file replace, raw)")
        print(f"  ratio {o / f:8.3f}")


if __name__ == "__main__":
    main()

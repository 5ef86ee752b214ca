#!/usr/bin/env python3
"""Total fenced-step throughput of N writer processes on one ledger, against one writer.

    .venv/bin/python tools/bench_contention.py                 # N = 1, 2, 4, 8; 3 rounds
    .venv/bin/python tools/bench_contention.py --shm --json    # scratch on /dev/shm
    .venv/bin/python tools/bench_contention.py --procs 1,8 --rounds 5 --seconds 3

Every writer is a separate interpreter (this file run with ``--child``) with its own
`Ledger` (its own connection, the library's defaults: ``synchronous=FULL``, the busy
timeout) on workspace ``w<i>`` of one ledger; it acquires its own lease, then runs
full fenced steps — the step ``tools/stress_processes.py``'s writers run: snapshot the
path's rev and on-disk hash, admit one small write planned against them, apply, store a
small inline artifact every ``--artifact-every`` steps, publish, ack — until the window
closes. Everybody opens first; at one "go" every writer starts, and the steps that both
start and end inside the measured window (``--warmup`` s after the go, ``--seconds``
long) are counted, and their latencies (snapshot to ack) kept.

Each round runs every N on a fresh ledger, so N = 1 (the baseline) is measured in the
same run, on the same disk, under the same load as the others; the figures are the
medians over the rounds and the verdicts ratios against N = 1: the target is a total of
at least 0.9x one writer's for every N. The round also runs `tools/bench_fences.py`'s
in-process step (no snapshot, no artifact) for the same time, so that the N = 1 figure
can be read against that benchmark's.

Beside each figure: the CPU the machine spent (both cores = 2.0), and from the writers'
`Database.stats` where a transaction's time went — waiting for the write lock (busy
handler sleeps, stepping aside for a waiter), holding it, its COMMIT, checkpoints.

``--floor`` runs the same windows with no steptrail code at all: each writer does the
fenced step's commits (counted from a real step) as raw one-row SQLite transactions on
one shared file, and its durable file replace. Its ratios are the ceiling of N
processes on one SQLite file on this machine: no library above SQLite does better.

Ratios, not absolute numbers: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsinfo import mount_of  # noqa: E402
from ledger import Ledger, StepPlan, Write  # noqa: E402

LEDGER = "ledger.db"
FILE = "f.txt"
TARGET = 0.9


def content(i: int, k: int) -> bytes:
    return (f"writer {i} step {k}\n" * 8).encode()  # stress_processes' writer content


def artifact(i: int, k: int) -> bytes:
    return f"log of writer {i} step {k}: ok\n".encode() * 4


def fenced_step(led: Ledger, ws: str, epoch: int, step: str, data: bytes,
                art: bytes | None = None, run: str = "") -> None:
    """One full fenced step on workspace `ws` under the lease `epoch`: the step every writer
    here runs (and `tools/bench_stores.py`'s, on either store) — snapshot `FILE`'s rev and
    on-disk hash, admit one write of `data` planned against them, apply it (pre-image
    pinned, post-image staged, fence checked, renamed into place, `fenced` recorded), store
    the inline artifact `art` when given, publish, ack."""
    rev, pre = led.workspaces.snapshot(ws, FILE)
    plan = StepPlan(step, [Write(FILE, data, pre, rev)],
                    artifacts=("out/log.txt",) if art is not None else (), run=run)
    if led.workspaces.admit(ws, epoch, [plan]) != [None]:
        raise AssertionError(f"{step}: not admitted")
    applied = led.workspaces.apply(step, epoch=epoch)
    if applied.verdict != "applied":
        raise AssertionError(f"{step}: {applied.verdict} {applied.detail}")
    if art is not None:
        led.store(step, applied.attempt, "out/log.txt", art)
    led.publish(step)
    led.ack(step, epoch=epoch)


# -- a writer process --------------------------------------------------------------------


def step_commits(parent: str | None, artifact_every: int) -> list[int]:
    """How many COMMITs each of `artifact_every` consecutive fenced steps makes (counted
    through the ledger's `on_op` hook on one writer): what `--floor` replays."""
    root = tempfile.mkdtemp(prefix="bench-contention-count-", dir=parent)
    try:
        ops: list[str] = []
        with Ledger.init(os.path.join(root, LEDGER), on_op=ops.append) as led:
            d = os.path.join(root, "ws")
            os.makedirs(d)
            with open(os.path.join(d, FILE), "wb") as f:
                f.write(b"initial\n")
            led.workspaces.add("w0", d)
            epoch = led.workspaces.acquire("w0", "count", ttl_s=3600).epoch
            counts = []
            for k in range(max(1, artifact_every)):
                ops.clear()
                art = artifact_every > 0 and k % artifact_every == 0
                fenced_step(led, "w0", epoch, f"c{k}", content(0, k),
                            artifact(0, k) if art else None)
                counts.append(ops.count("commit"))
        return counts
    finally:
        shutil.rmtree(root, ignore_errors=True)


def floor_child(args: argparse.Namespace) -> None:
    """`--floor`: the same step as raw SQL and raw file calls, no steptrail code — per
    step, as many one-row ``BEGIN IMMEDIATE; INSERT; COMMIT`` transactions as the fenced
    step commits, on one shared database file (WAL, ``synchronous=FULL``, SQLite's own
    busy handler), and the workspace file replaced durably (temporary file written and
    fsynced, renamed, directory fsynced) where the step applies it. What N processes on
    one SQLite file can do on this machine whatever runs above it."""
    import apsw
    i = args.index
    conn = apsw.Connection(os.path.join(args.root, "floor.db"))
    conn.setbusytimeout(30_000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    commits = [int(x) for x in args.floor_commits.split(",")]
    wsdir = os.path.join(args.root, "ws", f"w{i}")
    target = os.path.join(wsdir, FILE)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    start, end = (float(x) for x in sys.stdin.readline().split())
    while time.monotonic() < start - args.warmup:
        time.sleep(0.0005)
    lat: list[float] = []
    cpu0 = cpu1 = 0.0
    started = False
    payload = b"x" * 300
    k = 0
    while True:
        t0 = time.monotonic()
        if t0 >= end:
            break
        if not started and t0 >= start:
            started, cpu0 = True, time.process_time()
        n = commits[k % len(commits)]
        for c in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t(key, value) VALUES (?, ?)", (f"{i}/{k}/{c}", payload))
            conn.execute("COMMIT")
            if c == 1:  # the apply: the workspace file replaced durably, then `fenced`
                tmp = f"{target}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, content(i, k))
                os.fsync(fd)
                os.close(fd)
                os.rename(tmp, target)
                dfd = os.open(wsdir, os.O_RDONLY)
                os.fsync(dfd)
                os.close(dfd)
        t1 = time.monotonic()
        if t0 >= start and t1 <= end:
            lat.append(t1 - t0)
            cpu1 = time.process_time()
        k += 1
    conn.close()
    json.dump({"index": i, "latencies": lat, "stats": {}, "cpu_s": cpu1 - cpu0,
               "steps_run": k}, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


def child(args: argparse.Namespace) -> None:
    if args.floor_commits:
        floor_child(args)
        return
    path = os.path.join(args.root, LEDGER)
    ws, i = f"w{args.index}", args.index
    profile = None
    if args.cprofile:
        import cProfile
        profile = cProfile.Profile(time.process_time)
    with Ledger.open(path) as led:
        epoch = led.workspaces.acquire(ws, f"writer-{i}", ttl_s=3600).epoch
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        start, end = (float(x) for x in sys.stdin.readline().split())
        db = led._store.db
        lat: list[float] = []
        k = 0
        while time.monotonic() < start - args.warmup:
            time.sleep(0.0005)
        before = after = None
        cpu0 = cpu1 = 0.0
        if profile is not None:
            profile.enable()
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                break
            if before is None and t0 >= start:
                before, cpu0 = dataclasses.replace(db.stats), time.process_time()
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
            step = f"p{i}-s{k:06d}"
            held = db.write_lock() if args.hold_step else contextlib.nullcontext()
            held.__enter__()
            with_artifact = args.artifact_every > 0 and k % args.artifact_every == 0
            fenced_step(led, ws, epoch, step, content(i, k),
                        artifact(i, k) if with_artifact else None, run=f"run-{i}")
            held.__exit__(None, None, None)
            t1 = time.monotonic()
            if t0 >= start and t1 <= end:
                lat.append(t1 - t0)
                after, cpu1 = dataclasses.replace(db.stats), time.process_time()
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
            k += 1
        if profile is not None:
            profile.disable()
            profile.dump_stats(os.path.join(args.root, f"writer-{i}.pstats"))
        stats: dict[str, float] = {}
        if before is not None and after is not None:
            a, b = dataclasses.asdict(after), dataclasses.asdict(before)
            stats = {key: a[key] - b[key] for key in a}
            stats["switches"] = (ru1.ru_nvcsw + ru1.ru_nivcsw) - (ru0.ru_nvcsw + ru0.ru_nivcsw)
        json.dump({"index": i, "latencies": lat, "stats": stats, "cpu_s": cpu1 - cpu0,
                   "steps_run": k}, sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()


# -- the parent --------------------------------------------------------------------------


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def case(parent: str | None, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `n` writers on a fresh ledger: total steps/s, latencies, where it went."""
    root = tempfile.mkdtemp(prefix="bench-contention-", dir=parent)
    try:
        with Ledger.init(os.path.join(root, LEDGER)) as led:
            for i in range(n):
                d = os.path.join(root, "ws", f"w{i}")
                os.makedirs(d)
                with open(os.path.join(d, FILE), "wb") as f:
                    f.write(b"initial\n")
                led.workspaces.add(f"w{i}", d)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--root", root,
               "--artifact-every", str(args.artifact_every), "--warmup", str(args.warmup)]
        if args.cprofile:
            cmd += ["--cprofile", root]
        if args.hold_step:
            cmd.append("--hold-step")
        if args.floor:
            import apsw
            c = apsw.Connection(os.path.join(root, "floor.db"))
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
                      " value BLOB)")
            c.close()
            cmd += ["--floor-commits", args.floor]
        procs = [subprocess.Popen([*cmd, "--index", str(i)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for i in range(n)]
        try:
            for p in procs:
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a writer failed to start (rc {p.wait()})")
            start = time.monotonic() + 0.2 + args.warmup
            end = start + args.seconds
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{start} {end}\n")
                p.stdin.flush()
            while time.monotonic() < start:
                time.sleep(0.001)
            cpu0 = _cpu_busy()
            while time.monotonic() < end:
                time.sleep(0.005)
            cpu1 = _cpu_busy()
            results = []
            for p in procs:
                out, _ = p.communicate(timeout=600)
                if p.returncode:
                    raise RuntimeError(f"a writer failed (rc {p.returncode})")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if args.cprofile:
            keep = os.path.join(args.cprofile, f"n{n}")
            os.makedirs(keep, exist_ok=True)
            for i in range(n):
                shutil.copy(os.path.join(root, f"writer-{i}.pstats"), keep)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lat = [x for r in results for x in r["latencies"]]
    steps = len(lat)
    busy, total = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    stats: dict[str, float] = {}
    for r in results:
        for key, v in r["stats"].items():
            stats[key] = stats.get(key, 0) + v
    per_step = {key: (v / steps if steps else 0.0) for key, v in stats.items()}
    return {
        "n": n, "steps": steps, "steps_per_s": steps / args.seconds,
        "p50_ms": _pct(lat, 0.5) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
        "per_writer_steps": [len(r["latencies"]) for r in results],
        "cpus_busy": (busy / total * (os.cpu_count() or 1)) if total else 0.0,
        "writer_cpu_ms_per_step": sum(r["cpu_s"] for r in results) / steps * 1e3 if steps else 0.0,
        # per step, all writers together: milliseconds (counts as they are)
        "per_step": {key: (v * 1e3 if key.endswith("_s") else v) for key, v in per_step.items()},
    }


def fences_reference(parent: str | None, seconds: float) -> float:
    """`tools/bench_fences.py`'s own step (in-process), run for about `seconds`."""
    from bench_fences import ours

    root = tempfile.mkdtemp(prefix="bench-contention-ref-", dir=parent)
    try:
        rate, _ = ours(os.path.join(root, "a"), 40)
        n = max(40, int(rate * seconds))
        shutil.rmtree(os.path.join(root, "a"))
        rate, _ = ours(os.path.join(root, "a"), n)
        return rate
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="1,2,4,8", help="writer counts (default 1,2,4,8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured window per case")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--artifact-every", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch parent (default: the temp dir)")
    ap.add_argument("--shm", action="store_true", help="scratch on /dev/shm (tmpfs)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the in-process bench_fences step")
    ap.add_argument("--cprofile", default=None, metavar="DIR",
                    help="keep each writer's cProfile stats under DIR/n<N>/ (slows them)")
    ap.add_argument("--hold-step", action="store_true",
                    help="each writer holds the write lock across its whole step")
    ap.add_argument("--floor", action="store_const", const="count",
                    help="no steptrail: each writer does the step's commits as raw one-row"
                    " SQLite transactions and its durable file replace (the ceiling of N"
                    " processes on one SQLite file here)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--floor-commits", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    parent = "/dev/shm" if args.shm else args.dir
    if args.floor == "count":
        args.floor = ",".join(map(str, step_commits(parent, args.artifact_every)))
        args.no_reference = True
    ns = [int(x) for x in args.procs.split(",")]
    if 1 not in ns:
        ns.insert(0, 1)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in ns}
    refs: list[float] = []
    for r in range(args.rounds):
        order = ns if r % 2 == 0 else list(reversed(ns))  # no N always first or last
        for n in order:
            runs[n].append(case(parent, n, args))
            if not args.json:
                c = runs[n][-1]
                print(f"  round {r + 1} N={n}: {c['steps_per_s']:.1f} steps/s", file=sys.stderr)
        if not args.no_reference:
            refs.append(fences_reference(parent, args.seconds))
    base = statistics.median(c["steps_per_s"] for c in runs[1])
    rows = []
    for n in ns:
        cs = runs[n]
        rate = statistics.median(c["steps_per_s"] for c in cs)
        ratios = [c["steps_per_s"] / b["steps_per_s"] for c, b in zip(cs, runs[1], strict=True)]
        mid = sorted(cs, key=lambda c: c["steps_per_s"])[len(cs) // 2]  # the median run
        rows.append({
            "n": n, "steps_per_s": round(rate, 1), "ratio": round(rate / base, 3),
            "round_ratios": [round(x, 3) for x in ratios],
            "p50_ms": round(statistics.median(c["p50_ms"] for c in cs), 2),
            "p99_ms": round(statistics.median(c["p99_ms"] for c in cs), 2),
            "cpus_busy": round(statistics.median(c["cpus_busy"] for c in cs), 2),
            "writer_cpu_ms_per_step": round(statistics.median(
                c["writer_cpu_ms_per_step"] for c in cs), 2),
            "per_writer_steps": mid["per_writer_steps"],
            "per_step": {k: round(v, 3) for k, v in mid["per_step"].items()},
            "verdict": None if n == 1 else ("PASS" if rate / base >= TARGET else "FAIL"),
        })
    result = {
        "mode": "floor" if args.floor else "hold-step" if args.hold_step else "steptrail",
        "floor_commits_per_step": [int(x) for x in args.floor.split(",")] if args.floor else None,
        "fs": mount_of(parent or tempfile.gettempdir())[1], "cpus": os.cpu_count(),
        "rounds": args.rounds, "seconds": args.seconds, "artifact_every": args.artifact_every,
        "target": TARGET, "rows": rows,
        "bench_fences_step_per_s": round(statistics.median(refs), 1) if refs else None,
        "ok": all(r["verdict"] != "FAIL" for r in rows),
    }
    if args.json:
        print(json.dumps(result))
        return
    if args.floor:
        print(f"FLOOR: no steptrail code; per step {args.floor} raw one-row commits (the"
              " fenced step's, counted) and one durable file replace")
    print(f"fenced steps, N writer processes on N workspaces of one ledger ({result['fs']},"
          f" {result['cpus']} CPUs, synchronous=FULL); median of {args.rounds} rounds of"
          f" {args.seconds:g} s")
    print(f"  {'N':>2} {'steps/s':>8} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'cpus':>5}"
          f" {'cpu/step':>8}  lock wait / held / commit / ckpt ms per step; busy sleeps,"
          f" yields per step")
    for r in rows:
        ps = r["per_step"]
        verdict = f"  {r['verdict']} (>= {TARGET}x)" if r["verdict"] else "  (baseline)"
        print(f"  {r['n']:>2} {r['steps_per_s']:>8.1f} {r['ratio']:>5.2f}x {r['p50_ms']:>7.2f}"
              f" {r['p99_ms']:>7.2f} {r['cpus_busy']:>5.2f} {r['writer_cpu_ms_per_step']:>8.2f}"
              f"  {ps.get('wait_s', 0):.2f} / {ps.get('held_s', 0):.2f} /"
              f" {ps.get('commit_s', 0):.2f} / {ps.get('checkpoint_s', 0):.2f};"
              f" {ps.get('busy_calls', 0):.1f} sleeps ({ps.get('busy_sleep_s', 0):.2f} ms),"
              f" {ps.get('yields', 0):.2f} yields ({ps.get('yield_s', 0):.2f} ms),"
              f" {ps.get('switches', 0):.1f} context switches{verdict}")
    if result["bench_fences_step_per_s"]:
        print(f"  bench_fences.py's step in-process, same rounds: "
              f"{result['bench_fences_step_per_s']} steps/s")
    print("  OK" if result["ok"] else "  FAILED: total throughput fell below the target")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How long a fenced step's apply holds the store's write lock, and how long a forced
takeover of a worker SIGSTOPped in its file work takes.

    .venv/bin/python tools/bench_lock_hold.py             # SQLite, and PostgreSQL if its
    .venv/bin/python tools/bench_lock_hold.py --json      # server binaries are installed
    .venv/bin/python tools/bench_lock_hold.py --steps 3 --no-postgres

Per workload (how many files a step writes, and how large each is), `--steps` steps,
each an admit and then `workspaces.apply(..., commit=True)` (the runner's second commit:
the apply, the manifest and the ack): the write transactions opened during the apply are
timed from the moment the store handed the transaction out (its lock taken, BEGIN done)
to the moment its COMMIT returned — the time every other writer of the workspace (on
SQLite: of the ledger) waits for. Printed: the median and the largest per step, and the
apply's whole wall time beside them. Runs against whichever `ledger` is imported, so the
same tool measures a tree before and after a change (PYTHONPATH=/path/to/other/tree).

The takeover: a worker process stops itself (SIGSTOP) before its second exchange; a
`lease acquire --force` in this process is timed (it gives up at the busy timeout, 30 s
on SQLite, when the stopped worker holds the lock).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

WORKLOADS = [("1 x 1 KiB", 1, 1024), ("10 x 1 KiB", 10, 1024), ("1 x 16 MiB", 1, 16 << 20),
             ("4 x 4 MiB", 4, 4 << 20)]

FROZEN = r"""
import os, signal, sys
from ledger import Ledger
renames = 0
def on_op(name):
    global renames
    if name == "ws-rename":
        renames += 1
        if renames == 2:
            print("STOPPED", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
led = Ledger.open(sys.argv[1], on_op=on_op)
try:
    led.workspaces.apply("frozen", epoch=int(sys.argv[2]))
except Exception as exc:
    print(type(exc).__name__, flush=True)
"""


def _timed_transactions(storage: Any, held: list[float]) -> Any:
    """Wrap `storage.transaction` so each write transaction's held time goes to `held`."""
    original = storage.transaction

    @contextlib.contextmanager
    def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        t0 = None
        try:
            with original(*args, **kwargs) as tx:
                t0 = time.perf_counter()  # the lock taken, BEGIN done
                yield tx
        finally:  # COMMIT (or ROLLBACK) returned: the lock is let go
            if t0 is not None:
                held.append(time.perf_counter() - t0)

    storage.transaction = timed
    return original


def _workload(location: str, root: str, name: str, files: int, size: int,
              steps: int) -> dict[str, Any]:
    from ledger import Ledger, StepPlan

    ws = os.path.join(root, name.replace(" ", ""))
    os.makedirs(ws)
    for i in range(files):
        with open(os.path.join(ws, f"f{i}.bin"), "wb") as f:
            f.write(os.urandom(size))
    held_per_step, wall = [], []
    with Ledger.open(location) as led:
        led.workspaces.add(ws.rsplit("/", 1)[-1], ws)
        wname = ws.rsplit("/", 1)[-1]
        epoch = led.workspaces.acquire(wname, "bench", ttl_s=3600).epoch
        storage = led.workspaces.core.storage
        for n in range(steps):
            writes = []
            for i in range(files):
                read = led.workspaces.read_file(wname, f"f{i}.bin")
                writes.append(read.write(os.urandom(size)))
            step = f"{wname}-{n}"
            led.workspaces.admit(wname, epoch, [StepPlan(step, writes)])
            held: list[float] = []
            original = _timed_transactions(storage, held)
            try:
                t0 = time.perf_counter()
                out = led.workspaces.apply(step, epoch=epoch, commit=True)
                wall.append(time.perf_counter() - t0)
            finally:
                storage.transaction = original
            assert out.committed, out
            held_per_step.append(sum(held))
    return {"workload": name, "steps": steps,
            "held_median_ms": round(statistics.median(held_per_step) * 1000, 2),
            "held_max_ms": round(max(held_per_step) * 1000, 2),
            "apply_median_ms": round(statistics.median(wall) * 1000, 2)}


def _takeover(location: str, root: str) -> float:
    from ledger import Ledger, StepPlan, Write
    from ledger.blobs import digest_of

    ws = os.path.join(root, "frozen")
    os.makedirs(ws)
    for name in ("a", "b"):
        with open(os.path.join(ws, name), "wb") as f:
            f.write(b"0\n")
    with Ledger.open(location) as led:
        led.workspaces.add("frozen", ws)
        epoch = led.workspaces.acquire("frozen", "worker", ttl_s=3600).epoch
        led.workspaces.admit("frozen", epoch, [StepPlan("frozen", [
            Write("a", b"1\n", digest_of(b"0\n")), Write("b", b"1\n", digest_of(b"0\n"))])])
    # (run where no `ledger` package lies: the child imports the one this process did)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(sys.modules["ledger"].__file__ or ""))))
    child = subprocess.Popen([sys.executable, "-c", FROZEN, location, str(epoch)], cwd=root,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "STOPPED":
            raise SystemExit("the worker did not reach its second exchange")
        with Ledger.open(location) as led:
            t0 = time.monotonic()
            try:
                led.workspaces.acquire("frozen", "takeover", ttl_s=3600, force=True)
            except Exception as exc:  # noqa: BLE001 - LedgerBusy before the change
                print(f"  (the takeover failed: {type(exc).__name__})", file=sys.stderr)
            return time.monotonic() - t0
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.wait(120)


def _store(kind: str, location: str, root: str, steps: int) -> dict[str, Any]:
    from ledger import Ledger

    Ledger.init(location).close()
    rows = []
    for name, files, size in WORKLOADS:
        n = steps if size < 1 << 20 else max(1, steps // 2)
        rows.append(_workload(location, root, name, files, size, n))
    return {"store": kind, "workloads": rows, "takeover_s": round(_takeover(location, root), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="steps per small workload (half"
                    " as many for the large ones)")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import ledger

    results = []
    root = tempfile.mkdtemp(prefix="bench-lock-hold-")
    results.append(_store("sqlite", os.path.join(root, "ledger.db"), root, args.steps))
    if not args.no_postgres:
        from ledger.testing.pgserver import PgServer, find_bindir
        if find_bindir() is not None:
            with PgServer.start() as server:
                pg_root = os.path.join(root, "pg")
                os.makedirs(pg_root)
                results.append(_store("postgres", server.create_database("bench_lock_hold"),
                                      pg_root, args.steps))
    if args.json:
        print(json.dumps({"ledger": os.path.dirname(ledger.__file__), "results": results}))
        return
    print(f"ledger imported from {os.path.dirname(ledger.__file__)}")
    for r in results:
        print(f"{r['store']}: write lock held per fenced step (apply, commit=True)")
        for w in r["workloads"]:
            print(f"  {w['workload']:12} held median {w['held_median_ms']:9.2f} ms"
                  f"  max {w['held_max_ms']:9.2f} ms   apply median {w['apply_median_ms']:9.2f}"
                  f" ms  ({w['steps']} steps)")
        print(f"  takeover of a worker SIGSTOPped before its 2nd exchange: {r['takeover_s']} s")


if __name__ == "__main__":
    main()

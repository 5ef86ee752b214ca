"""LedgerSaver beside LangGraph's SqliteSaver and AsyncSqliteSaver, on the same workload.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python tools/bench_langgraph.py [--quick] [--json]

Measured in one run, each saver on a fresh file in one temporary directory:

- puts/s and get_tuple/s for a small state (two short channels, both changing);
- on-disk size after N checkpoints (1,000; 200 with --quick) of a thread whose state
  carries a 100 KiB value that changes every 100th checkpoint: the ledger's db + wal +
  blob files, against SqliteSaver's db + wal, both after a WAL checkpoint(TRUNCATE);
- the ledger's size after prune(keep_latest) + `ledger.gc.collect` + VACUUM (the
  file shrinks only when vacuumed: SQLite reuses freed pages otherwise).

Targets: put rate >= 1.0x SqliteSaver's; size <= 1/10 of SqliteSaver's; after pruning
and GC the space is reclaimed. Prints ratios with targets and PASS/FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from ledger import Ledger
from ledger.gc import collect
from ledger.langgraph import LedgerSaver

BIG = 100 * 1024


def checkpoint(saver: Any, i: int, values: dict[str, Any], changed: list[str]) -> tuple[Any, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = {ch: f"{(i if ch in changed else 0) + 1:032}.0" for ch in values}
    new = {ch: cp["channel_versions"][ch] for ch in (changed if i else values)}
    return cp, new


def small_state(i: int) -> dict[str, Any]:
    return {"messages": [f"message {i}", "hello"], "count": i}


def config(thread: str, parent: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        conf["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return conf


def rates_sync(saver: Any, n: int) -> tuple[float, float]:
    parent = None
    t0 = time.perf_counter()
    for i in range(n):
        cp, new = checkpoint(saver, i, small_state(i), ["messages", "count"])
        parent = saver.put(config("small", parent), cp, {"step": i}, new)
    puts = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n):
        assert saver.get_tuple({"configurable": {"thread_id": "small"}}) is not None
    return puts, n / (time.perf_counter() - t0)


async def rates_async(saver: Any, n: int) -> tuple[float, float]:
    parent = None
    t0 = time.perf_counter()
    for i in range(n):
        cp, new = checkpoint(saver, i, small_state(i), ["messages", "count"])
        parent = await saver.aput(config("small", parent), cp, {"step": i}, new)
    puts = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n):
        assert await saver.aget_tuple({"configurable": {"thread_id": "small"}}) is not None
    return puts, n / (time.perf_counter() - t0)


def big_thread(saver: Any, n: int, thread: str = "big") -> None:
    parent = None
    for i in range(n):
        version = i // 100
        values = {"doc": bytes([version % 256]) * BIG, "count": i}
        cp = empty_checkpoint()
        cp["channel_values"] = values
        cp["channel_versions"] = {"doc": f"{version + 1:032}.0", "count": f"{i + 1:032}.0"}
        new = {"count": cp["channel_versions"]["count"]}
        if i % 100 == 0:
            new["doc"] = cp["channel_versions"]["doc"]
        parent = saver.put(config(thread, parent), cp, {"step": i}, new)


def files_size(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


def sqlite_checkpoint(db: Path, vacuum: bool = False) -> None:
    conn = sqlite3.connect(db)
    if vacuum:
        conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def ledger_files(db: Path) -> list[Path]:
    return [db, Path(f"{db}-wal"), db.parent / "blobs"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations (a smoke run)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:
        print("needs the [bench] extra: .venv/bin/pip install -e '.[bench]'", file=sys.stderr)
        return 2
    n_small = 300 if args.quick else 2_000
    n_big = 200 if args.quick else 1_000
    out: dict[str, Any] = {"small_ops": n_small, "big_checkpoints": n_big}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        with SqliteSaver.from_conn_string(str(root / "sqlite-small.db")) as s:
            out["sqlite_puts_s"], out["sqlite_gets_s"] = rates_sync(s, n_small)

        async def async_sqlite() -> tuple[float, float]:
            async with AsyncSqliteSaver.from_conn_string(str(root / "asqlite-small.db")) as s:
                return await rates_async(s, n_small)
        out["asqlite_puts_s"], out["asqlite_gets_s"] = asyncio.run(async_sqlite())
        with Ledger.init(root / "ls" / "ledger.db") as ledger:
            saver = LedgerSaver(ledger)
            out["ledger_puts_s"], out["ledger_gets_s"] = rates_sync(saver, n_small)
            saver.close()

        async def async_ledger() -> tuple[float, float]:
            with Ledger.init(root / "la" / "ledger.db") as ledger:
                saver = LedgerSaver(ledger)
                try:
                    return await rates_async(saver, n_small)
                finally:
                    await saver.aclose()
        out["ledger_async_puts_s"], out["ledger_async_gets_s"] = asyncio.run(async_ledger())

        sq = root / "sqlite-big.db"
        with SqliteSaver.from_conn_string(str(sq)) as s:
            big_thread(s, n_big)
        sqlite_checkpoint(sq)
        out["sqlite_bytes"] = files_size([sq, Path(f"{sq}-wal")])
        db = root / "lb" / "ledger.db"
        with Ledger.init(db) as ledger:
            saver = LedgerSaver(ledger)
            big_thread(saver, n_big)
        sqlite_checkpoint(db)
        out["ledger_bytes"] = files_size(ledger_files(db))
        out["ledger_blob_file_bytes"] = files_size([db.parent / "blobs"])
        with Ledger.open(db) as ledger:
            saver = LedgerSaver(ledger)
            saver.prune(["big"], strategy="keep_latest")
            gc = collect(ledger, grace_s=0, force=True, now_ns=ledger.clock() + 10**12)
            saver.close()
            out["gc_reclaimed_bytes"] = gc.reclaimed_bytes
        sqlite_checkpoint(db, vacuum=True)
        out["ledger_bytes_after_prune_gc_vacuum"] = files_size(ledger_files(db))
        out["ledger_blob_file_bytes_after"] = files_size([db.parent / "blobs"])
    out["put_ratio"] = out["ledger_puts_s"] / out["sqlite_puts_s"]
    out["async_put_ratio"] = out["ledger_async_puts_s"] / out["asqlite_puts_s"]
    out["size_ratio"] = out["ledger_bytes"] / out["sqlite_bytes"]
    pruned_values = (n_big // 100 - 1) * BIG
    # The event log only grows (pruning appends its events): reclaimed means GC removed
    # the pruned values' bytes and the blob files on disk shrank by at least as much.
    out["reclaimed"] = (out["gc_reclaimed_bytes"] >= pruned_values and
                        out["ledger_blob_file_bytes"] - out["ledger_blob_file_bytes_after"]
                        >= pruned_values)
    checks = {
        "put rate >= 1.0x SqliteSaver": out["put_ratio"] >= 1.0,
        "size <= 1/10 of SqliteSaver": out["size_ratio"] <= 0.1,
        "space reclaimed after prune + GC": out["reclaimed"],
    }
    out["checks"] = checks
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"small state, {n_small} ops          puts/s     get_tuple/s")
    print(f"  SqliteSaver (sync)         {out['sqlite_puts_s']:9.0f}  {out['sqlite_gets_s']:12.0f}")
    print(f"  LedgerSaver (sync)         {out['ledger_puts_s']:9.0f}  {out['ledger_gets_s']:12.0f}")
    print(f"  AsyncSqliteSaver           {out['asqlite_puts_s']:9.0f}  {out['asqlite_gets_s']:12.0f}")
    print(f"  LedgerSaver (async)        {out['ledger_async_puts_s']:9.0f}"
          f"  {out['ledger_async_gets_s']:12.0f}")
    print(f"{n_big} checkpoints with a 100 KiB value changing every 100th:")
    print(f"  SqliteSaver db+wal         {out['sqlite_bytes']:>12,} bytes")
    print(f"  ledger db+wal+blobs        {out['ledger_bytes']:>12,} bytes")
    print(f"  after prune+GC+VACUUM      {out['ledger_bytes_after_prune_gc_vacuum']:>12,} bytes"
          f" (GC reclaimed {out['gc_reclaimed_bytes']:,}; blob files"
          f" {out['ledger_blob_file_bytes']:,} -> {out['ledger_blob_file_bytes_after']:,})")
    print(f"put ratio {out['put_ratio']:.2f}x (async {out['async_put_ratio']:.2f}x),"
          f" size ratio {out['size_ratio']:.4f}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

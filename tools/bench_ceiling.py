#!/usr/bin/env python3
"""The best append ratio any CPython implementation of docs/design.md can reach here.

    .venv/bin/python tools/bench_ceiling.py            # ~1 minute
    .venv/bin/python tools/bench_ceiling.py --json

`tools/bench_ledger.py` compares `Ledger.append` / `append_batch` with raw apsw
inserting rows that were encoded, keyed and hashed *outside* the timed region. This
script asks what ratio is possible at all: it times, in one run on the same file
system, the raw baseline of bench_ledger (R0) against the least work the design
requires per event, with every line of the ledger's own plumbing taken away:

- **SQL the design requires** (R1): the same events row, plus the inline step
  projection row (the real `steps` upsert, one per step touched) and the projection
  checkpoint, in the same transaction — raw apsw statements, no Python between them.
- **Python the design requires** (P), timed alone in memory: validating the event's
  field constraints (`ledger.events.validate`: msgspec checks `Meta` constraints only
  on decode), its journal key, its envelope, its chain hash, and the lifecycle fold on
  a copy of the step's row (`ledger.projections.steps.fold`).

Left out — so the ceiling printed is an upper bound, generous to us: the blob
durability guard (a stat per file blob, a re-hash of small blobs on publish), the
pins and manifests tables, the journal lookup on a redelivery, transaction and
error-translation wrappers, the witness.

ceiling = rate(R1 + P) / rate(R0). If it is below a target of issue 2, no
implementation of this design in CPython meets that target on this machine; the
printed split shows which part (SQL or Python) takes the budget.

The same for `tools/bench_steps.py`'s tightest case, one 4 KiB inline artifact: its
floor (bare rows in the step's three commits) against the floor plus the projection
rows those commits require (a step row and the checkpoint per commit, the pin taken
and released, the manifest and its entry) plus P for each of the step's five events.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from hashlib import sha256
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_ledger as B  # noqa: E402  (the workload, raw rows and raw connection)

from ledger.store.sqlite.database import MIGRATIONS  # noqa: E402
from ledger.events import (  # noqa: E402
    EVENT_VERSION,
    Acked,
    BlobPinned,
    BlobStored,
    ManifestEntry,
    ManifestPublished,
    Planned,
    chain_hash,
    envelope,
    journal_key,
    kind_of,
    manifest_digest,
    validate,
)
from ledger.projections.steps import StepRow, fold  # noqa: E402
from ledger.store.sqlite.sql import S  # noqa: E402
UPSERT_SQL = S.UPSERT_STEP

CHECKPOINT_SQL = (
    "INSERT INTO projection_checkpoint(name, last_seq, version) VALUES ('steps', ?, 0)"
    " ON CONFLICT(name) DO UPDATE SET last_seq = excluded.last_seq"
)
TARGETS = {"single": 0.8, "batch_100": 0.5, "batch_1000": 0.5}


def step_rows(events: list[Any], rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The steps row after each event (what the inline projection writes), untimed."""
    current: dict[str, StepRow] = {}
    out = []
    for ev, row in zip(events, rows, strict=True):
        new = fold(current.get(ev.step), ev, row[0], row[1])
        assert new is not None
        current[ev.step] = new
        out.append(new.as_tuple())
    return out


def python_floor(events: list[Any]) -> float:
    """Seconds per event of the Python the design requires (no I/O), best of 5."""
    best = float("inf")
    prev, rows = b"\0" * 32, {}
    for _ in range(5):
        t0 = time.perf_counter()
        for seq, ev in enumerate(events, 1):
            payload = validate(ev)
            key, kind, env = journal_key(ev), kind_of(ev), envelope(ev)
            prev = chain_hash(prev, seq, B.TIME_NS, env, key, kind, EVENT_VERSION, payload)
            row = rows.get(ev.step)
            rows[ev.step] = fold(None if row is None else row.__copy__(), ev, seq, B.TIME_NS)
        best = min(best, (time.perf_counter() - t0) / len(events))
        rows.clear()
    return best


PIN_SQL = "INSERT INTO pins(step, attempt, digest, role, seq) VALUES (?,?,?,?,?)"
UNPIN_SQL = "DELETE FROM pins WHERE step = ? AND attempt = ?"
BLOB_SQL = "INSERT INTO blob_data(digest, size, data, stored_ns) VALUES (?,?,?,?)"
MANIFEST_SQL = ("INSERT INTO manifests(step, manifest_rev, attempt, digest, supersedes, seq)"
                " VALUES (?,?,?,?,?,?)")
ENTRY_SQL = ("INSERT INTO manifest_entries(step, manifest_rev, role, path, digest, size)"
             " VALUES (?,?,?,?,?,?)")


def step_events(i: int) -> tuple[list[Any], bytes]:
    """A one-artifact step of bench_steps' smallest case (4 KiB inline): the five events
    `run_step` records, and the artifact's bytes."""
    data = os.urandom(4096)
    digest = sha256(data).hexdigest()
    step = f"step-{i:07d}"
    entries = (ManifestEntry(path="out.bin", digest=digest, size=len(data)),)
    return [
        Planned(step=step, attempt=1, artifacts=("out.bin",)),
        BlobPinned(step=step, attempt=1, digest=digest, role="artifact"),
        BlobStored(step=step, attempt=1, digest=digest, size=len(data), path="out.bin",
                   inline=True),
        ManifestPublished(step=step, attempt=1, manifest_rev=0, artifacts=entries,
                          digest=manifest_digest(step, (), entries)),
        Acked(step=step, attempt=1, manifest_rev=0),
    ], data


def run_step_case(scratch: str, reps: int, p: float, n: int = 150) -> dict[str, Any]:
    """bench_steps' 1 x 4 KiB inline step in its three commits: the floor (bare event
    rows and the blob row, as bench_steps' floor) against the floor plus the projection
    SQL those commits require (a step row and the checkpoint per commit, the pin taken
    and released, the manifest and its entry) plus the Python of its five events."""
    f0 = full_schema(os.path.join(scratch, "step-floor.db"))
    f1 = full_schema(os.path.join(scratch, "step-required.db"))
    raw0, raw1 = B.RawRows(), B.RawRows()
    t0s, t1s, k = [], [], 0
    for rep in range(reps):
        steps = [step_events(k + j) for j in range(n)]
        k += n
        prepared = []
        for raw in (raw0, raw1):
            prepared.append([(raw.rows(evs), data) for evs, data in steps])
        srows = [step_rows(evs, rows) for (evs, _), (rows, _) in zip(steps, prepared[1])]
        times = [0.0, 0.0]
        for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
            conn = (f0, f1)[side]
            t = time.perf_counter()
            for j, (rows, data) in enumerate(prepared[side]):
                ev, srow, name = steps[j][0], srows[j], rows[0][4]
                digest = ev[1].digest
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(B.RAW_INSERT, rows[:2])
                if side:
                    conn.execute(UPSERT_SQL, srow[1])
                    conn.execute(PIN_SQL, (name, 1, digest, "artifact", rows[1][0]))
                    conn.execute(CHECKPOINT_SQL, (rows[1][0],))
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(BLOB_SQL, (digest, len(data), data, B.TIME_NS))
                conn.executemany(B.RAW_INSERT, rows[2:4])
                if side:
                    conn.execute(UPSERT_SQL, srow[3])
                    conn.execute(MANIFEST_SQL, (name, 0, 1, ev[3].digest, None, rows[3][0]))
                    conn.execute(ENTRY_SQL, (name, 0, "artifact", "out.bin", digest, len(data)))
                    conn.execute(CHECKPOINT_SQL, (rows[3][0],))
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(B.RAW_INSERT, rows[4])
                if side:
                    conn.execute(UPSERT_SQL, srow[4])
                    conn.execute(UNPIN_SQL, (name, 1))
                    conn.execute(CHECKPOINT_SQL, (rows[4][0],))
                conn.execute("COMMIT")
            times[side] = (time.perf_counter() - t) / n
        t0s.append(times[0])
        t1s.append(times[1])
        B.log(f"  step rep {rep + 1}/{reps}: floor {1 / times[0]:,.0f} steps/s,"
              f" required SQL {1 / times[1]:,.0f} steps/s")
    f0.close()
    f1.close()
    t0, t1 = statistics.median(t0s), statistics.median(t1s)
    ceiling = t0 / (t1 + 5 * p)
    return {
        "floor_steps_s": 1 / t0, "required_sql_steps_s": 1 / t1, "sql_only_ratio": t0 / t1,
        "ceiling_steps_s": 1 / (t1 + 5 * p), "ceiling_ratio": ceiling,
        "budget_us_per_step": (t0 / 0.8 - t0) * 1e6,
        "required_us_per_step": (t1 - t0 + 5 * p) * 1e6,
        "target": 0.8, "reachable": ceiling >= 0.8,
    }


def full_schema(path: str) -> Any:
    """A raw connection on a file with the ledger's whole schema (all migrations)."""
    return B.raw_open(path, [MIGRATIONS[v] for v in sorted(MIGRATIONS)])


def run(scratch: str, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    steps = B.Steps()
    probe = steps.take(4000)
    p = python_floor(probe)
    out["python_us_per_event"] = p * 1e6
    for name, batch, per_rep in (("single", 1, 400), ("batch_100", 100, 4000),
                                 ("batch_1000", 1000, 8000)):
        r0 = B.raw_open(os.path.join(scratch, f"{name}-r0.db"), B.events_ddl())
        r1 = full_schema(os.path.join(scratch, f"{name}-r1.db"))
        raw0, raw1 = B.RawRows(), B.RawRows()
        t0s, t1s = [], []
        for rep in range(reps):
            evs = steps.take(per_rep)
            rows0, rows1 = raw0.rows(evs), raw1.rows(evs)
            srows = step_rows(evs, rows1)
            t_r0 = t_r1 = 0.0
            for b, start in enumerate(range(0, per_rep, batch)):
                chunk = slice(start, start + batch)
                for side in ((0, 1) if (b + rep) % 2 == 0 else (1, 0)):
                    t = time.perf_counter()
                    if side == 0:
                        r0.execute("BEGIN IMMEDIATE")
                        r0.executemany(B.RAW_INSERT, rows0[chunk])
                        r0.execute("COMMIT")
                        t_r0 += time.perf_counter() - t
                    else:
                        last = {s[0]: s for s in srows[chunk]}  # one upsert per step
                        r1.execute("BEGIN IMMEDIATE")
                        r1.executemany(B.RAW_INSERT, rows1[chunk])
                        r1.executemany(UPSERT_SQL, list(last.values()))
                        r1.execute(CHECKPOINT_SQL, (rows1[chunk][-1][0],))
                        r1.execute("COMMIT")
                        t_r1 += time.perf_counter() - t
            t0s.append(t_r0 / per_rep)
            t1s.append(t_r1 / per_rep)
            B.log(f"  {name} rep {rep + 1}/{reps}: raw {1 / t0s[-1]:,.0f} ev/s,"
                  f" required SQL {1 / t1s[-1]:,.0f} ev/s")
        r0.close()
        r1.close()
        t0, t1 = statistics.median(t0s), statistics.median(t1s)
        ceiling = t0 / (t1 + p)
        out[name] = {
            "raw_ev_s": 1 / t0, "required_sql_ev_s": 1 / t1, "sql_only_ratio": t0 / t1,
            "ceiling_ev_s": 1 / (t1 + p), "ceiling_ratio": ceiling,
            "budget_us_per_event": (t0 / TARGETS[name] - t0) * 1e6,
            "required_us_per_event": (t1 - t0 + p) * 1e6,
            "target": TARGETS[name], "reachable": ceiling >= TARGETS[name],
        }
    out["step_1x4k_inline"] = run_step_case(scratch, reps, p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per case (median)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: under cwd)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix=".bench_ceiling-", dir=args.dir or os.getcwd())
    try:
        res = run(scratch, args.reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("the ceiling of this design in CPython vs raw apsw (bench_ledger's baseline)")
    print(f"  required Python per event (validate, key, envelope, chain hash, fold):"
          f" {res['python_us_per_event']:.1f} us")
    for name in TARGETS:
        r = res[name]
        print(f"  {name:10s} raw {r['raw_ev_s']:9,.0f} ev/s   required SQL alone"
              f" {r['sql_only_ratio']:.2f}x   SQL+Python ceiling {r['ceiling_ratio']:.2f}x"
              f"   target {r['target']}x   {'reachable' if r['reachable'] else 'UNREACHABLE'}")
        print(f"  {'':10s} the target leaves {r['budget_us_per_event']:.1f} us/event over raw;"
              f" the design requires {r['required_us_per_event']:.1f} us/event")
    r = res["step_1x4k_inline"]
    print(f"  step (bench_steps, 1 x 4 KiB inline, 3 commits): floor {r['floor_steps_s']:,.0f}"
          f" steps/s   required SQL alone {r['sql_only_ratio']:.2f}x   SQL+Python ceiling"
          f" {r['ceiling_ratio']:.2f}x   target 0.8x"
          f"   {'reachable' if r['reachable'] else 'UNREACHABLE'}")
    print(f"  {'':10s} the target leaves {r['budget_us_per_step']:.0f} us/step over the floor;"
          f" the design requires {r['required_us_per_step']:.0f} us/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

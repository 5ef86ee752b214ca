#!/usr/bin/env python3
"""Benchmark steptrail against raw apsw on the same file system, in one run.

Run from the repository root::

    .venv/bin/python tools/bench_ledger.py            # full run (a few minutes)
    .venv/bin/python tools/bench_ledger.py --quick    # smaller sizes, a sanity run
    .venv/bin/python tools/bench_ledger.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_ledger.py --dir DIR  # scratch files under DIR
    .venv/bin/python tools/bench_ledger.py --only single,batch   # some sections only
                                              # (single, batch, keys, diag, rebuild)

Every figure is printed beside a baseline measured in the same run with raw apsw and
the same settings (WAL, ``synchronous=FULL``, SQLite's default page size, the ledger's
busy timeout), as a ratio ours / raw. Ours and raw runs are interleaved (blocks of
work alternate, and which side goes first alternates) so that drift on a shared
machine hits both; each section repeats and reports the median (the spread of the
per-repetition ratio is printed too; the JSON has every repetition). Scratch files
live in a temporary directory on the same file system as the current directory by
default: fsync cost is the point, so never use a RAM file system (the script warns
if it finds one).

The workload is realistic: step ``run-7/step-NNNNNN`` goes through
``Planned(attempt=1) -> BlobStored(digest) -> ManifestPublished(manifest_rev=0,
digest, artifacts=(ManifestEntry,)) -> Acked(manifest_rev=0)``: four events whose
payloads average ~216 bytes. The ledger accepts ``blob-stored`` and
``manifest-published`` only for blobs that are durable, so 1024 distinct 4 KiB
artifacts are first put (untimed) into the blob store all scratch ledgers share
(``<scratch>/blobs``) and step i names artifact i mod 1024; the ledger's own checks
of those blobs inside the append (a stat, and a re-hash on publish) count as ours.

The raw baseline writes, for the same events, the exact row the ledger writes (same
journal keys, payload bytes, envelope columns and 32-byte hashes, precomputed outside
the timed region) into a table created from the ledger's own DDL for ``events``
(``ledger.store.sqlite.schema.MIGRATIONS``: seq INTEGER PRIMARY KEY, journal_key TEXT NOT NULL UNIQUE,
index events_step(step, seq)): the table and its indexes only, none of the ledger's
triggers on ``events`` nor its projection tables (steps, checkpoint, pins,
manifests). Whatever those cost is counted as ours.

The numbers
-----------
1. Durable single-event appends/s. Ours: ``Ledger.append(event)``, one event per
   transaction. Raw: ``BEGIN IMMEDIATE; INSERT; COMMIT``. Each side does one COMMIT
   per event, and in WAL mode with ``synchronous=FULL`` each COMMIT appends the
   transaction's dirty pages as WAL frames and fsyncs (fdatasync) the WAL once;
   whenever a commit takes the WAL past 1000 pages SQLite's auto-checkpoint copies
   the WAL into the database and fsyncs both (so a side that dirties more pages
   per commit also checkpoints more often). Ours also runs the head query, the
   step-row lookup, the ``steps`` upsert and the projection checkpoint upsert in
   the same transaction (7 statements against 3; see the diagnostics). Target:
   ours >= 0.8x raw.
2. Batched appends/s at 100 and 1000 events per transaction. Ours:
   ``Ledger.append_batch(events)``; raw: ``BEGIN IMMEDIATE; executemany(INSERT);
   COMMIT``. One COMMIT (one WAL fsync, plus the occasional checkpoint) per batch
   on each side. Target: ours >= 0.5x raw at both sizes.
3. Journal-key index cost (raw only, information): 1000-row transactions into two
   events tables growing in lockstep, one whose journal keys arrive in index order
   (the ledger's own keys) and one whose keys are random uuid4-style hex of the same
   length. A random key dirties a random leaf of the UNIQUE index, so once the index
   outgrows SQLite's page cache each commit writes (and fsyncs) many more WAL pages.
   Printed as ordered rate / random rate per window of table size; the headline is
   the last window (expected 4-6x at 200k+ rows; the table grows to 300k rows, 100k
   with --quick).
4. Rebuild of an N-event ledger (1,000,000 by default) in events/s. Ours:
   ``Ledger.rebuild()`` (one ``BEGIN IMMEDIATE`` transaction: delete and rewrite the
   ``steps`` table, one COMMIT, then the auto-checkpoint of the WAL it grew). Raw:
   ``SELECT seq, kind, payload FROM events ORDER BY seq`` + ``msgspec.json.Decoder(
   AnyEvent)`` + a fold into a dict ``step -> (state, attempt, last_seq)``; it reads
   only and commits nothing. Both run in fresh subprocesses on the same file, normally
   warm in the OS page cache (it was just written; a VM's proactive reclaim may not
   keep it there, which then costs both sides alike). The ledger is built with
   ``append_batch`` of 1000 events (one COMMIT each); the build rate is printed for
   information. Target: ours >= 0.6x the raw fold.
   Memory: the peak of Python allocations during the rebuild only (tracemalloc, in
   its own subprocess since tracing slows Python down) and the growth of the
   process's peak RSS during the timed rebuilds (VmHWM after a reset through
   /proc/self/clear_refs minus VmRSS before; ru_maxrss where /proc is missing; it
   also sees SQLite's page cache). Measured on the N-event ledger and on an
   N/4-event one: every step is acked, so the live working set is empty in both and
   memory should not follow the event count. Target: peak at N <= 1.5x peak at N/4
   (+1 MiB slack). --quick uses N = 100,000.

Diagnostics (no target): WAL frames written and SQL statements executed per commit,
ours vs raw, for single and 1000-event appends, measured in a separate pass with a
WAL hook and an exec tracer (so not timed).

The exit status is 0 whatever the figures say; read PASS/FAIL (or ``"pass"`` and
``"failed"`` in the JSON). Progress goes to stderr. The header prints which ``ledger``
package was measured and a digest of its sources, so figures can be tied to code.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from hashlib import sha256
from typing import Any

import apsw
import msgspec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: fsinfo
from fsinfo import fs_info  # noqa: E402
import ledger
from ledger import Acked, BlobStored, Ledger, ManifestEntry, ManifestPublished, Planned
from ledger.store.sqlite.database import BUSY_TIMEOUT_MS, MIGRATIONS
from ledger.events import (
    EVENT_VERSION,
    AnyEvent,
    Event,
    chain_hash,
    encode,
    envelope,
    journal_key,
    kind_of,
)

RUN = "run-7"
EVENTS_PER_STEP = 4
BLOB_POOL = 1024  # distinct artifacts the steps cycle through (stored once, untimed)
BLOB_SIZE = 4096
TIME_NS = 1_767_225_600_000_000_000  # a fixed clock for the raw rows
MiB = 1024 * 1024

RAW_INSERT = (
    "INSERT INTO events(seq, time_ns, workspace, run, step, attempt, epoch, rev,"
    " journal_key, kind, v, payload, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)

TARGETS = {"single": 0.8, "batch_100": 0.5, "batch_1000": 0.5, "rebuild": 0.6}
MEMORY_GROWTH_MAX = 1.5  # peak(N) <= 1.5 * peak(N/4) + 1 MiB
MEMORY_SLACK = 1 * MiB


# -- sizes ---------------------------------------------------------------------------


class Sizes(msgspec.Struct, frozen=True):
    single_reps: int
    single_events: int  # per rep and side
    single_block: int  # events per interleaved block
    batch_reps: int
    batch_events: dict[int, int]  # batch size -> events per rep and side
    index_rows: int  # final table size of the key-order comparison
    index_window: int  # rows per reported window
    rebuild_events: int
    rebuild_reps: int


FULL = Sizes(
    single_reps=9, single_events=1000, single_block=100,
    batch_reps=5, batch_events={100: 10_000, 1000: 20_000},
    index_rows=300_000, index_window=50_000,
    rebuild_events=1_000_000, rebuild_reps=3,
)
QUICK = Sizes(
    single_reps=3, single_events=400, single_block=100,
    batch_reps=3, batch_events={100: 4_000, 1000: 8_000},
    index_rows=100_000, index_window=25_000,
    rebuild_events=100_000, rebuild_reps=2,
)


# -- the workload ----------------------------------------------------------------------


@functools.cache
def blob_pool() -> list[tuple[str, bytes]]:
    """BLOB_POOL distinct artifacts of BLOB_SIZE bytes: (sha256 hex, bytes)."""
    out = []
    for k in range(BLOB_POOL):
        data = (f"steptrail bench artifact {k:04d}\n".encode() * BLOB_SIZE)[:BLOB_SIZE]
        out.append((sha256(data).hexdigest(), data))
    return out


def store_blobs(scratch: str) -> dict[str, Any]:
    """Put the pool into the blob store every scratch ledger uses (``<dir>/blobs``).

    The ledger refuses `blob-stored` / `manifest-published` events naming blobs that
    are not durable, so the artifacts are stored first, untimed, through the ledger's
    own BlobStore (one file, fsynced, per blob).
    """
    try:
        from ledger.blobs import BlobStore
    except ImportError:  # a ledger without a blob store does not check blobs
        return {"blobs": 0}
    store = BlobStore(os.path.join(scratch, "blobs"))
    t0 = time.perf_counter()
    for _, data in blob_pool():
        store.put(data)
    return {"blobs": BLOB_POOL, "blob_size": BLOB_SIZE, "seconds": time.perf_counter() - t0}


def step_events(i: int) -> list[Event]:
    """The four events of one finished step; its artifact is blob i mod BLOB_POOL."""
    step = f"{RUN}/step-{i:06d}"
    blob, data = blob_pool()[i % BLOB_POOL]
    manifest = sha256(b"manifest\0" + step.encode()).hexdigest()
    path = f"out/{i:06d}.json"
    return [
        Planned(step=step, attempt=1, run=RUN),
        BlobStored(step=step, attempt=1, run=RUN, digest=blob, size=len(data)),
        ManifestPublished(
            step=step, attempt=1, run=RUN, manifest_rev=0, digest=manifest,
            artifacts=(ManifestEntry(path=path, digest=blob, size=len(data)),),
        ),
        Acked(step=step, attempt=1, run=RUN, manifest_rev=0),
    ]


class Steps:
    """Hands out consecutive steps' events: the same sequence for ours and raw."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n_events: int) -> list[Event]:
        assert n_events % EVENTS_PER_STEP == 0, n_events
        out: list[Event] = []
        for i in range(self.next, self.next + n_events // EVENTS_PER_STEP):
            out.extend(step_events(i))
        self.next += n_events // EVENTS_PER_STEP
        return out


class RawRows:
    """The rows the ledger writes for the same events (seq, key, payload, hashes)."""

    def __init__(self) -> None:
        self.seq = 0
        self.prev = sha256(b"raw-genesis").digest()

    def rows(self, events: Sequence[Event]) -> list[tuple[Any, ...]]:
        out = []
        for ev in events:
            self.seq += 1
            env, payload, key, kind = envelope(ev), encode(ev), journal_key(ev), kind_of(ev)
            digest = chain_hash(
                self.prev, self.seq, TIME_NS, env, key, kind, EVENT_VERSION, payload
            )
            out.append((self.seq, TIME_NS, env.workspace, env.run, env.step, env.attempt,
                        env.epoch, env.rev, key, kind, EVENT_VERSION, payload, self.prev, digest))
            self.prev = digest
        return out


def events_ddl() -> list[str]:
    """CREATE statements of the real `events` table and its `events_step` index."""
    mem = apsw.Connection(":memory:")
    try:
        for v in sorted(MIGRATIONS):
            mem.execute(MIGRATIONS[v])
        rows = mem.execute(
            "SELECT type, name, sql FROM sqlite_schema WHERE tbl_name = 'events'"
            " AND type IN ('table', 'index') AND sql IS NOT NULL ORDER BY type DESC"
        ).fetchall()
    finally:
        mem.close()
    names = {(t, n) for t, n, _ in rows}
    assert ("table", "events") in names and ("index", "events_step") in names, names
    return [sql for _, _, sql in rows]


def raw_open(path: str, ddl: Sequence[str] = ()) -> apsw.Connection:
    """A plain apsw connection with the ledger's pragmas (and `ddl` run once)."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise SystemExit(f"{path}: SQLite answered journal_mode={mode!r}, not wal")
    conn.execute("PRAGMA synchronous=FULL")
    for sql in ddl:
        conn.execute(sql)
    return conn


def pragmas(conn: apsw.Connection) -> dict[str, Any]:
    def one(name: str) -> Any:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]

    return {
        "journal_mode": one("journal_mode"),
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(one("synchronous")),
        "page_size": one("page_size"),
        "cache_size": one("cache_size"),
        "busy_timeout_ms": one("busy_timeout"),
        "wal_autocheckpoint": one("wal_autocheckpoint"),
    }


def raw_commit_one(conn: apsw.Connection, row: tuple[Any, ...]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(RAW_INSERT, row)
    conn.execute("COMMIT")


def raw_commit_many(conn: apsw.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(RAW_INSERT, rows)
    conn.execute("COMMIT")


def ledger_conn(led: Ledger) -> apsw.Connection | None:
    """The ledger's apsw connection, for pragmas and diagnostics only (private API)."""
    db = getattr(led, "_db", None)
    return getattr(db, "conn", None)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- 1. single-event appends -----------------------------------------------------------


def bench_single(scratch: str, sizes: Sizes) -> dict[str, Any]:
    ours = Ledger.init(os.path.join(scratch, "single-ours.db"))
    raw = raw_open(os.path.join(scratch, "single-raw.db"), events_ddl())
    steps, raw_rows = Steps(), RawRows()
    try:
        # Warm-up (untimed): the same first steps on both sides.
        warm = steps.take(20 * EVENTS_PER_STEP)
        for ev in warm:
            ours.append(ev)
        for row in raw_rows.rows(warm):
            raw_commit_one(raw, row)

        reps = []
        block = sizes.single_block
        for rep in range(sizes.single_reps):
            evs = steps.take(sizes.single_events)
            rows = raw_rows.rows(evs)
            t_ours = t_raw = 0.0
            for b, start in enumerate(range(0, len(evs), block)):
                for side in (("ours", "raw") if (b + rep) % 2 == 0 else ("raw", "ours")):
                    t0 = time.perf_counter()
                    if side == "ours":
                        for ev in evs[start:start + block]:
                            ours.append(ev)
                        t_ours += time.perf_counter() - t0
                    else:
                        for row in rows[start:start + block]:
                            raw_commit_one(raw, row)
                        t_raw += time.perf_counter() - t0
            reps.append({"ours": len(evs) / t_ours, "raw": len(evs) / t_raw})
            log(f"  single rep {rep + 1}/{sizes.single_reps}: ours {reps[-1]['ours']:,.0f}/s"
                f"  raw {reps[-1]['raw']:,.0f}/s")
        assert ours.count() == raw.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        ours.close()
        raw.close()
    return summarize(reps, "single", f"{sizes.single_reps} reps x {sizes.single_events} events,"
                     f" interleaved in blocks of {block}")


def both_pragmas(scratch: str) -> dict[str, Any]:
    """The settings each side's connection actually runs with (read back, not assumed)."""
    path_ours = os.path.join(scratch, "pragmas-ours.db")
    path_raw = os.path.join(scratch, "pragmas-raw.db")
    with Ledger.init(path_ours) as ours:
        conn = ledger_conn(ours)
        got_ours = pragmas(conn) if conn is not None else None
    raw = raw_open(path_raw, events_ddl())
    got_raw = pragmas(raw)
    raw.close()
    return {"ours": got_ours, "raw": got_raw}


# -- 2. batched appends ----------------------------------------------------------------


def bench_batch(scratch: str, sizes: Sizes, batch: int) -> dict[str, Any]:
    ours = Ledger.init(os.path.join(scratch, f"batch{batch}-ours.db"))
    raw = raw_open(os.path.join(scratch, f"batch{batch}-raw.db"), events_ddl())
    steps, raw_rows = Steps(), RawRows()
    per_rep = sizes.batch_events[batch]
    try:
        warm = steps.take(batch)  # one untimed batch each
        ours.append_batch(warm)
        raw_commit_many(raw, raw_rows.rows(warm))
        reps = []
        for rep in range(sizes.batch_reps):
            evs = steps.take(per_rep)
            rows = raw_rows.rows(evs)
            t_ours = t_raw = 0.0
            for b, start in enumerate(range(0, per_rep, batch)):
                for side in (("ours", "raw") if (b + rep) % 2 == 0 else ("raw", "ours")):
                    t0 = time.perf_counter()
                    if side == "ours":
                        ours.append_batch(evs[start:start + batch])
                        t_ours += time.perf_counter() - t0
                    else:
                        raw_commit_many(raw, rows[start:start + batch])
                        t_raw += time.perf_counter() - t0
            reps.append({"ours": per_rep / t_ours, "raw": per_rep / t_raw})
            log(f"  batch {batch} rep {rep + 1}/{sizes.batch_reps}: ours {reps[-1]['ours']:,.0f}/s"
                f"  raw {reps[-1]['raw']:,.0f}/s")
        assert ours.count() == raw.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        ours.close()
        raw.close()
    return summarize(reps, f"batch_{batch}",
                     f"{sizes.batch_reps} reps x {per_rep // batch} transactions of {batch}")


def summarize(reps: list[dict[str, float]], name: str, how: str) -> dict[str, Any]:
    ours = statistics.median(r["ours"] for r in reps)
    raw = statistics.median(r["raw"] for r in reps)
    ratio = ours / raw
    per_rep = [r["ours"] / r["raw"] for r in reps]
    how += f"; per-rep ratio {min(per_rep):.2f}-{max(per_rep):.2f}"
    return {
        "ours": ours, "raw": raw, "ratio": ratio,
        "best_ours": max(r["ours"] for r in reps), "best_raw": max(r["raw"] for r in reps),
        "target": TARGETS[name], "pass": ratio >= TARGETS[name], "how": how, "reps": reps,
    }


# -- 3. journal-key order --------------------------------------------------------------


def bench_key_order(scratch: str, sizes: Sizes) -> dict[str, Any]:
    ddl = events_ddl()
    ordered = raw_open(os.path.join(scratch, "keys-ordered.db"), ddl)
    shuffled = raw_open(os.path.join(scratch, "keys-random.db"), ddl)
    rng = random.Random(7)
    steps, raw_rows = Steps(), RawRows()
    windows = []
    t_ord = t_rnd = 0.0
    total = 0
    try:
        for b in range(sizes.index_rows // 1000):
            rows = raw_rows.rows(steps.take(1000))
            # Same row, same key length, but a uniformly random position in the index.
            rnd = [
                r[:8] + ((f"{rng.getrandbits(128):032x}" + r[8])[:len(r[8])],) + r[9:]
                for r in rows
            ]
            for side in (("ord", "rnd") if b % 2 == 0 else ("rnd", "ord")):
                t0 = time.perf_counter()
                if side == "ord":
                    raw_commit_many(ordered, rows)
                    t_ord += time.perf_counter() - t0
                else:
                    raw_commit_many(shuffled, rnd)
                    t_rnd += time.perf_counter() - t0
            total += 1000
            if total % sizes.index_window == 0:
                w = sizes.index_window
                windows.append({"rows_from": total - w, "rows_to": total,
                                "ordered": w / t_ord, "random": w / t_rnd, "ratio": t_rnd / t_ord})
                t_ord = t_rnd = 0.0
                log(f"  keys {total - w:,}-{total:,} rows: in order {windows[-1]['ordered']:,.0f}/s"
                    f"  random {windows[-1]['random']:,.0f}/s  ({windows[-1]['ratio']:.2f}x)")
        index_pages = ordered.execute("PRAGMA page_count").fetchone()[0]
    finally:
        ordered.close()
        shuffled.close()
    last = windows[-1]
    return {"rows": sizes.index_rows, "window": sizes.index_window, "windows": windows,
            "ordered": last["ordered"], "random": last["random"], "ratio": last["ratio"],
            "expected": [4.0, 6.0], "db_pages_ordered": index_pages,
            "in_expected_range": 4.0 <= last["ratio"] <= 6.0}


# -- 4. rebuild ------------------------------------------------------------------------


def build_ledger(path: str, n_events: int) -> dict[str, Any]:
    """A ledger of n_events (n/4 finished steps), appended 1000 events per batch."""
    steps = Steps()
    t0 = time.perf_counter()
    report = max(n_events // 10, 1000)
    with Ledger.init(path) as led:
        done = 0
        while done < n_events:
            n = min(1000, n_events - done)
            led.append_batch(steps.take(n))
            done += n
            if done % report == 0 or done == n_events:
                dt = time.perf_counter() - t0
                log(f"  building {os.path.basename(path)}: {done:,}/{n_events:,} events"
                    f" ({done / dt:,.0f}/s, {dt:.0f}s)")
        assert led.count() == n_events
    dt = time.perf_counter() - t0
    return {"events": n_events, "seconds": dt, "rate": n_events / dt,
            "bytes": os.path.getsize(path)}


def start_worker(mode: str, path: str) -> subprocess.Popen[str]:
    flags = ["-S"] if sys.flags.no_site else []  # keep the interpreter setup (and ledger) we run
    cmd = [sys.executable, *flags, os.path.abspath(__file__), "--_worker", mode, path]
    env = dict(os.environ, BENCH_LEDGER_DIGEST=code_digest())
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)


def finish_worker(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"worker {proc.args} failed with status {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def run_worker(mode: str, path: str) -> dict[str, Any]:
    return finish_worker(start_worker(mode, path))


def bench_rebuild(scratch: str, sizes: Sizes) -> dict[str, Any]:
    n_big = sizes.rebuild_events
    n_small = n_big // 4
    big = os.path.join(scratch, f"rebuild-{n_big}.db")
    small = os.path.join(scratch, f"rebuild-{n_small}.db")
    build = build_ledger(big, n_big)
    build_small = build_ledger(small, n_small)

    reps = []
    for rep in range(sizes.rebuild_reps):
        got: dict[str, dict[str, Any]] = {}
        for side in (("ours", "raw") if rep % 2 == 0 else ("raw", "ours")):
            got[side] = run_worker("rebuild" if side == "ours" else "fold", big)
        reps.append(got)
        log(f"  rebuild rep {rep + 1}/{sizes.rebuild_reps}: ours {got['ours']['rate']:,.0f} ev/s"
            f" ({got['ours']['seconds']:.1f}s)  raw fold {got['raw']['rate']:,.0f} ev/s"
            f" ({got['raw']['seconds']:.1f}s)")
    ours = statistics.median(r["ours"]["rate"] for r in reps)
    raw = statistics.median(r["raw"]["rate"] for r in reps)
    for r in reps:
        assert r["ours"]["steps"] == n_big // EVENTS_PER_STEP, r
        assert r["raw"]["steps"] == n_big // EVENTS_PER_STEP, r

    small_run = run_worker("rebuild", small)
    log("  memory: rebuilds under tracemalloc (several times slower; untimed, run side by side)")
    procs = start_worker("trace", big), start_worker("trace", small)
    trace_big, trace_small = (finish_worker(proc) for proc in procs)
    rss_big = max(r["ours"]["rss_delta"] for r in reps)
    peak_big, peak_small = trace_big["peak"], trace_small["peak"]
    growth = peak_big / max(peak_small, 1)
    mem_pass = peak_big <= MEMORY_GROWTH_MAX * peak_small + MEMORY_SLACK
    return {
        "events": n_big, "steps": n_big // EVENTS_PER_STEP,
        "ours": ours, "raw": raw, "ratio": ours / raw,
        "best_ours": max(r["ours"]["rate"] for r in reps),
        "best_raw": max(r["raw"]["rate"] for r in reps),
        "target": TARGETS["rebuild"], "pass": ours / raw >= TARGETS["rebuild"],
        "reps": reps, "build": build, "build_small": build_small,
        "memory": {
            "large": {"events": n_big, "tracemalloc_peak": peak_big, "rss_delta": rss_big,
                      "raw_fold_rss_delta": max(r["raw"]["rss_delta"] for r in reps),
                      "traced_seconds": trace_big["seconds"]},
            "small": {"events": n_small, "tracemalloc_peak": peak_small,
                      "rss_delta": small_run["rss_delta"], "rebuild_rate": small_run["rate"],
                      "traced_seconds": trace_small["seconds"]},
            "growth": growth, "target": MEMORY_GROWTH_MAX, "pass": mem_pass,
        },
    }


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_reset() -> int:
    """Reset the peak-RSS mark to the current RSS (Linux); return the baseline in bytes.

    ru_maxrss cannot be used as is in a child: Linux carries the parent's peak over
    fork+exec, so the child's ru_maxrss starts at the (large) peak of this benchmark.
    Writing 5 to /proc/self/clear_refs resets VmHWM to VmRSS instead.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss = _proc_status_kib("VmRSS")
        if rss is not None:
            return rss * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_peak() -> int:
    """The peak RSS since `rss_reset` (VmHWM), in bytes; ru_maxrss where /proc is missing."""
    hwm = _proc_status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(mode: str, path: str) -> dict[str, Any]:
    """One measurement in a fresh process (so ru_maxrss is this measurement's)."""
    if mode == "fold":
        conn = raw_open(path)
        decoder = msgspec.json.Decoder(AnyEvent)
        gc.collect()
        rss0 = rss_reset()
        t0 = time.perf_counter()
        folded: dict[str, tuple[str, int, int]] = {}
        n = 0
        scan = conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq")
        for seq, kind, payload in scan:
            n += 1
            ev = decoder.decode(payload)
            step = getattr(ev, "step", None)
            if step is None:
                continue
            if kind == "planned":
                folded[step] = (kind, ev.attempt, seq)
            else:
                prev = folded.get(step)
                if prev is None or prev[1] != ev.attempt:
                    raise SystemExit(f"event #{seq} does not follow its step's attempt")
                folded[step] = (kind, prev[1], seq)
        dt = time.perf_counter() - t0
        rss1 = rss_peak()
        assert all(s[0] == "acked" for s in folded.values())
        conn.close()
        return {"events": n, "steps": len(folded), "seconds": dt, "rate": n / dt,
                "rss_delta": rss1 - rss0}
    with Ledger.open(path) as led:
        n = led.count()
        gc.collect()
        if mode == "trace":
            tracemalloc.start()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        rss0 = rss_reset()
        t0 = time.perf_counter()
        n_steps = led.rebuild()
        dt = time.perf_counter() - t0
        rss1 = rss_peak()
        out = {"events": n, "steps": n_steps, "seconds": dt, "rate": n / dt,
               "rss_delta": rss1 - rss0}
        if mode == "trace":
            out["peak"] = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
        return out


# -- diagnostics: WAL frames and statements per commit ---------------------------------


def commit_profile(scratch: str) -> dict[str, Any]:
    """WAL frames and SQL statements per commit, ours vs raw (hooks on; untimed)."""
    ours = Ledger.init(os.path.join(scratch, "diag-ours.db"))
    raw = raw_open(os.path.join(scratch, "diag-raw.db"), events_ddl())
    oconn = ledger_conn(ours)
    if oconn is None:
        ours.close()
        raw.close()
        return {}
    steps, raw_rows = Steps(), RawRows()
    try:
        warm = steps.take(400)
        ours.append_batch(warm)
        raw_commit_many(raw, raw_rows.rows(warm))

        def measure(
            conn: apsw.Connection, work: Callable[[], None], commits: int
        ) -> dict[str, Any]:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages: list[int] = []
            stmts: Counter[str] = Counter()

            def hook(_c: apsw.Connection, _name: str, n: int) -> int:
                pages.append(n)
                return apsw.SQLITE_OK

            def trace(_cur: apsw.Cursor, sql: str, _b: Any) -> bool:
                stmts[" ".join(sql.split()[:3])] += 1
                return True

            conn.set_wal_hook(hook)  # replaces auto-checkpoint while it is set
            conn.exec_trace = trace
            try:
                work()
            finally:
                conn.exec_trace = None
                conn.set_wal_hook(None)
                conn.wal_autocheckpoint(1000)
            assert len(pages) == commits, (len(pages), commits)
            frames = pages[-1] / commits  # the WAL was empty and never reset meanwhile
            return {"wal_frames_per_commit": frames, "kib_per_commit": frames * 4.0,
                    "statements_per_commit": sum(stmts.values()) / commits,
                    "statements": dict(stmts.most_common()),
                    "commits_per_checkpoint": 1000 / frames}

        def ours_work(evs: list[Event], batch: int) -> Callable[[], None]:
            def work() -> None:
                for i in range(0, len(evs), batch):
                    if batch == 1:
                        ours.append(evs[i])
                    else:
                        ours.append_batch(evs[i:i + batch])
            return work

        def raw_work(rows: list[tuple[Any, ...]], batch: int) -> Callable[[], None]:
            def work() -> None:
                for i in range(0, len(rows), batch):
                    if batch == 1:
                        raw_commit_one(raw, rows[i])
                    else:
                        raw_commit_many(raw, rows[i:i + batch])
            return work

        out: dict[str, Any] = {}
        for case, batch, n in (("single", 1, 200), ("batch_1000", 1000, 3000)):
            evs = steps.take(n)
            rows = raw_rows.rows(evs)
            out[case] = {"ours": measure(oconn, ours_work(evs, batch), n // batch),
                         "raw": measure(raw, raw_work(rows, batch), n // batch)}
        return out
    finally:
        ours.close()
        raw.close()


# -- report ----------------------------------------------------------------------------


def code_digest() -> str:
    """sha256 over the ledger package's sources: which code these figures are for."""
    root = os.path.dirname(os.path.abspath(ledger.__file__))
    h = sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                h.update(os.path.relpath(full, root).encode() + b"\0")
                with open(full, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def fmt_mib(x: float) -> str:
    return f"{x / MiB:,.1f} MiB"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_report(res: dict[str, Any]) -> None:
    m = res["meta"]
    p = print
    p("steptrail benchmark: ours (ledger API) vs raw apsw, same run, same file system")
    p(f"  python {m['python']}  SQLite {m['sqlite']}  apsw {m['apsw']}  msgspec {m['msgspec']}"
      f"  cpus {m['cpus']}  mode {'quick' if m['quick'] else 'full'}"
      + ("" if m["sections"] == list(SECTIONS) else f"  sections {','.join(m['sections'])}"))
    p(f"  ledger code: {m['ledger_file']} (sources sha256 {m['ledger_digest']})")
    fs = m["scratch_fs"]
    p(f"  scratch: {fs['path']} ({fs['fstype']} on {fs['mount']}"
      f"{', same file system as cwd' if fs['same_fs'] else ', NOT the file system of cwd'})")
    p(f"  pragmas  ours: {m['pragmas']['ours']}")
    p(f"           raw:  {m['pragmas']['raw']}")
    p("  workload: run-7/step-NNNNNN, planned -> blob-stored -> manifest-published -> acked;"
      f" mean payload {m['payload_mean']:.0f} B, mean journal key {m['key_mean']:.0f} B")
    p("  figures: median over repetitions, ours and raw interleaved")
    p("")

    def row(label: str, r: dict[str, Any], unit: str = "ev/s") -> None:
        p(f"  {label:<34} ours {r['ours']:>10,.0f} {unit}   raw {r['raw']:>10,.0f} {unit}"
          f"   {r['ratio']:5.2f}x   target >= {r['target']:.1f}x   {verdict(r['pass'])}")
        p(f"  {'':<34} ({r['how']}; best ours {r['best_ours']:,.0f},"
          f" best raw {r['best_raw']:,.0f})")

    if "single" in res:
        p("1. durable single-event appends (1 event, 1 COMMIT, 1 WAL fsync per append)")
        row("Ledger.append vs INSERT+COMMIT", res["single"])
        p("")
    if "batch_100" in res:
        p("2. batched appends (1 COMMIT per batch)")
        row("append_batch(100) vs executemany", res["batch_100"])
        row("append_batch(1000) vs executemany", res["batch_1000"])
        p("")
    k = res.get("key_index")
    if k:
        p(f"3. journal-key index cost: raw 1000-row transactions, table grown to {k['rows']:,} rows"
          f" ({k['db_pages_ordered'] * 4096 / MiB:,.0f} MiB file with in-order keys)")
        for w in k["windows"]:
            p(f"  rows {w['rows_from']:>9,}-{w['rows_to']:<9,} in order {w['ordered']:>9,.0f} ev/s"
              f"   random uuid4-style {w['random']:>9,.0f} ev/s"
              f"   in order is {w['ratio']:4.2f}x faster")
        p(f"  => at {k['rows'] - k['window']:,}-{k['rows']:,} rows random keys cost"
          f" {k['ratio']:.2f}x"
          f" (expected 4-6x on a large table: {'yes' if k['in_expected_range'] else 'no'};"
          " information, no target)")
        p("")
    rb = res.get("rebuild")
    if rb:
        p(f"4. rebuild of a {rb['events']:,}-event ledger ({rb['steps']:,} steps, all acked)")
        p(f"  built with append_batch(1000): {rb['build']['rate']:,.0f} ev/s"
          f" ({rb['build']['seconds']:.0f}s, {rb['build']['bytes'] / MiB:,.0f} MiB file)")
        p(f"  {'Ledger.rebuild vs scan+decode+fold':<34} ours {rb['ours']:>10,.0f} ev/s   raw"
          f" {rb['raw']:>10,.0f} ev/s   {rb['ratio']:5.2f}x   target >= {rb['target']:.1f}x"
          f"   {verdict(rb['pass'])}")
        p(f"  {'':<34} ({len(rb['reps'])} reps each in a fresh process; best ours"
          f" {rb['best_ours']:,.0f}, best raw {rb['best_raw']:,.0f})")
        mem = rb["memory"]
        lg, sm = mem["large"], mem["small"]
        p(f"  memory of Ledger.rebuild   {'events':>10}  {'tracemalloc peak':>17}"
          f"  {'peak RSS growth':>17}")
        for d in (lg, sm):
            p(f"  {'':<26} {d['events']:>10,}  {fmt_mib(d['tracemalloc_peak']):>17}"
              f"  {fmt_mib(d['rss_delta']):>17}")
        p(f"  peak at {lg['events']:,} / peak at {sm['events']:,} = {mem['growth']:.2f}x"
          f" (4x the events and steps)   target <= {mem['target']:.1f}x (+1 MiB)   "
          f"{verdict(mem['pass'])}")
        p(f"  (for contrast the raw fold, which keeps every step in a dict, grew peak RSS by"
          f" {fmt_mib(lg['raw_fold_rss_delta'])})")
        p("")
    d = res.get("commit_profile")
    if d:
        p("diagnostics: per commit, ours vs raw (separate untimed pass with a WAL hook)")
        for case in ("single", "batch_1000"):
            o, r = d[case]["ours"], d[case]["raw"]
            p(f"  {case:<11} WAL frames {o['wal_frames_per_commit']:7.1f} vs"
              f" {r['wal_frames_per_commit']:6.1f}   statements"
              f" {o['statements_per_commit']:7.1f} vs {r['statements_per_commit']:6.1f}"
              f"   checkpoint every {o['commits_per_checkpoint']:6.1f} vs"
              f" {r['commits_per_checkpoint']:6.1f} commits")
        p(f"  ours single-append statements: {d['single']['ours']['statements']}")
        p("")
    p("SUMMARY")
    for key, label in (("single", "single-event appends"),
                       ("batch_100", "batched appends, 100/txn"),
                       ("batch_1000", "batched appends, 1000/txn"), ("rebuild", "rebuild")):
        if key in res:
            r = res[key]
            if key == "rebuild":
                label = f"rebuild {r['events']:,} events"
            p(f"  {label:<30} {r['ratio']:5.2f}x raw   target >= {r['target']:.1f}x"
              f"   {verdict(r['pass'])}")
    if rb:
        mem = rb["memory"]
        p(f"  {'rebuild memory bounded':<30} {mem['growth']:5.2f}x       target <="
          f" {mem['target']:.1f}x   {verdict(mem['pass'])}")
    if k:
        p(f"  {'journal-key order (info)':<30} {k['ratio']:5.2f}x       expected 4-6x at"
          f" {k['rows']:,} rows")
    failed = res["failed"]
    p(f"  {'failed targets: ' + ', '.join(failed) if failed else 'every target met'}"
      f"; total time {m['seconds']:.0f}s")


# -- main ------------------------------------------------------------------------------

SECTIONS = ("single", "batch", "keys", "diag", "rebuild")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a fast sanity run")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--dir", metavar="DIR",
                    help="parent of the scratch directory (default: the current directory;"
                    " never a RAM file system, fsync cost is the point)")
    ap.add_argument("--only", metavar="LIST",
                    help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch files")
    ap.add_argument("--_worker", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        expected = os.environ.get("BENCH_LEDGER_DIGEST")
        if expected and expected != code_digest():
            log(f"the ledger sources under {os.path.dirname(ledger.__file__)} changed during"
                " the benchmark run (the worker sees other code than the ledger was built"
                " with); rerun the benchmark")
            return 2
        print(json.dumps(worker(*args._worker)))
        return 0

    sections = list(SECTIONS)
    if args.only:
        sections = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = sorted(set(sections) - set(SECTIONS))
        if unknown:
            ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    sizes = QUICK if args.quick else FULL
    parent = os.path.abspath(args.dir or os.getcwd())
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".bench_ledger-", dir=parent)
    fs = fs_info(scratch, beside=os.getcwd())
    if fs["fstype"] in ("tmpfs", "ramfs"):
        log(f"warning: {scratch} is on {fs['fstype']}: fsync costs nothing there,"
            " so these are not durable-write figures")
    sample = [e for i in range(25) for e in step_events(i)]
    t0 = time.perf_counter()
    res: dict[str, Any] = {"meta": {
        "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(), "msgspec": msgspec.__version__,
        "cpus": os.cpu_count(), "quick": args.quick, "sections": sections,
        "sizes": msgspec.to_builtins(sizes),
        "ledger_file": os.path.dirname(ledger.__file__), "ledger_digest": code_digest(),
        "scratch_fs": fs,
        "payload_mean": statistics.mean(len(encode(e)) for e in sample),
        "key_mean": statistics.mean(len(journal_key(e)) for e in sample),
    }}
    try:
        log(f"scratch directory {scratch}")
        res["meta"]["blob_setup"] = store_blobs(scratch)
        res["meta"]["pragmas"] = both_pragmas(scratch)
        if "single" in sections:
            log("1. single-event appends")
            res["single"] = bench_single(scratch, sizes)
        if "batch" in sections:
            log("2. batched appends")
            for batch in (100, 1000):
                res[f"batch_{batch}"] = bench_batch(scratch, sizes, batch)
        if "keys" in sections:
            log("3. journal-key order")
            res["key_index"] = bench_key_order(scratch, sizes)
        if "diag" in sections:
            log("diagnostics: frames and statements per commit")
            res["commit_profile"] = commit_profile(scratch)
        if "rebuild" in sections:
            log(f"4. rebuild ({sizes.rebuild_events:,} events; building takes a while)")
            res["rebuild"] = bench_rebuild(scratch, sizes)
    finally:
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    res["meta"]["seconds"] = time.perf_counter() - t0
    failed = [k for k in TARGETS if k in res and not res[k]["pass"]]
    if "rebuild" in res and not res["rebuild"]["memory"]["pass"]:
        failed.append("rebuild_memory")
    res["failed"] = failed
    res["pass"] = not failed
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

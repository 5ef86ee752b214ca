#!/usr/bin/env python3
"""Benchmark blob GC and the byte audit against a bare file walk, in the same run.

Run from the repository root::

    .venv/bin/python tools/bench_gc.py              # 100,000 blobs (about 2-3 minutes)
    .venv/bin/python tools/bench_gc.py --quick      # 10,000 blobs
    .venv/bin/python tools/bench_gc.py --blobs N    # N blobs (10% of them orphans)
    .venv/bin/python tools/bench_gc.py --json       # machine-readable results on stdout
    .venv/bin/python tools/bench_gc.py --dir DIR    # scratch directory under DIR
    .venv/bin/python tools/bench_gc.py --profile    # + cProfile of one collect and one audit
    .venv/bin/python tools/bench_gc.py --keep       # keep the scratch directory

What is measured
----------------
A store of N blob FILES (``Ledger.init(path, inline_max_bytes=0)``: nothing lives
inline), 64-256 bytes each, every one distinct. 90% are referenced by committed
manifests: steps of up to 100 artifacts each, ``planned -> blob-pinned x k ->
blob-stored x k -> manifest-published -> acked``. 10% are orphans: the same, but the
attempt ends ``compensated`` instead of publishing, so its blobs are stored, named by
``blob-stored`` events and referenced by nothing (every 10th blob, so orphans are
spread over every fan-out directory). Every file's mtime is two days old, past the
3600 s grace window both timed calls are given.

* GC. Ours: ``collect(ledger, grace_s=3600)`` (scan every file, read references and
  pins, condemn the orphans in one transaction, then per batch of 500 one BEGIN
  IMMEDIATE that re-checks each, unlinks it, fsyncs its directory and records
  ``blob-collected``). Bare: the same tree walked with ``os.scandir`` (one lstat per
  file through ``DirEntry.stat``), then the same orphan files unlinked, each followed
  by an fsync of its fan-out directory, as ``BlobStore.delete`` does for durability.
  The bare side is handed the list of orphan names (read before its clock starts): it
  decides nothing and commits nothing. Ours' SQLite commits are part of what it costs.
* Audit. Ours: ``audit(ledger, grace_s=3600)`` on the full store (before any GC):
  every stored byte in its bucket. Bare: the same ``os.scandir`` walk with one lstat
  per file, summing sizes; nothing else (it keeps no per-file state, so it also sets
  the floor for memory).

Figures are ratios ours / bare of wall seconds (lower is better), targets: GC within
3x of bare, audit within 2x. Ratios, never absolute times: this is a shared, noisy VM.

Method
------
The fixture is built untimed. Blob files are written straight into the blob store's
layout (``<blobs>/<2 hex>/<sha256>``, mode 0444, no per-file fsync: ``BlobStore.put``
would fsync twice per file, minutes of setup for nothing measured) and into a bare
twin tree with the same names and bytes (copies, not hard links: unlinking the last
link is what frees an inode). The ledger's own append guard re-stats (and, for
publishes, re-hashes) every blob an event names, so the layout is checked by the
library. The ledger is built with ``synchronous=OFF`` for setup speed only, closed,
and everything is flushed with ``os.sync()``; every timed phase reopens it with the
default ``synchronous=FULL``. Before timing, both trees are walked once untimed, so
both run with warm dentry and inode caches.

Each timed call runs in its own fresh subprocess (opening the ledger and importing
the package are outside the clock). Audit is read-only: it repeats, alternating which
side goes first. GC is destructive: between repetitions the orphan files are written
back (same names, bytes and old mtimes) in both trees and ``os.sync()`` runs again;
ours' event log keeps growing by N/10 ``blob-collected`` events per repetition (the
next collect reads references from manifests and compensations only, so this changes
little). Each figure is the median over repetitions (7 audit, 5 gc; the ratio is the
median of the per-repetition ratios, printed with its min-max spread).

Peak memory: in each worker process, the peak RSS during the timed call minus the RSS
just before it (Linux: VmHWM after resetting it through /proc/self/clear_refs, as
tools/bench_ledger.py does; ru_maxrss where that is missing, which over-reports). It
counts everything the call touches: Python objects, SQLite's page cache, the
interpreter's arenas. tracemalloc is not used in timed runs: it slows Python down
several times, which would distort the ratio.

Durable operations of ours' GC are counted through the ledger's ``on_op`` hook and
printed (commit, unlink, dirfsync). Each worker also reports its CPU seconds (user +
sys, ``time.process_time``) for the timed call; the CPU ratio is printed as a
diagnostic for a busy box (it hides fsync waits, so it is never the GC target), with
the load average at the start and end of the run. The figures are for the sources
whose sha256 is printed; a warning says when they changed during the run. Progress goes
to stderr; exit status is 0 whatever the figures say. Scratch files go under the
repository root (or --dir), never on a RAM file system (fsync cost is the point; the
script warns if it finds tmpfs).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import json
import os
import platform
import pstats
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import apsw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: fsinfo
from fsinfo import fs_info  # noqa: E402
import ledger
from ledger import (
    Acked,
    BlobPinned,
    BlobStored,
    Compensated,
    Ledger,
    ManifestEntry,
    ManifestPublished,
    Planned,
)
from ledger.events import manifest_digest
from ledger.gc import audit, collect

GRACE_S = 3600
AGE_S = 2 * 24 * 3600  # every file's mtime: well past the grace window
ARTIFACTS_PER_STEP = 100
STEPS_PER_BATCH = 10  # append_batch of ~2000 events
ORPHAN_EVERY = 10  # blob i is an orphan when i % 10 == 9
TARGETS = {"gc": 3.0, "audit": 2.0}
FULL_BLOBS, QUICK_BLOBS = 100_000, 10_000
REPS = {"audit": 7, "gc": 5}  # audit is read-only and cheap; each gc rep restores orphans


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- fixture -------------------------------------------------------------------------


def blob_bytes(i: int) -> bytes:
    """Blob i: distinct (a counter), 64-256 bytes."""
    head = b"steptrail bench-gc blob %09d\n" % i
    size = 64 + (i * 7919) % 193
    return head + b"x" * (size - len(head))


def is_orphan(i: int) -> bool:
    return i % ORPHAN_EVERY == ORPHAN_EVERY - 1


class Tree:
    """A fan-out tree ``<root>/<2 hex>/<digest>`` written without per-file fsync."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.fds: dict[str, int] = {}
        for i in range(256):
            name = f"{i:02x}"
            path = os.path.join(root, name)
            os.makedirs(path, exist_ok=True)
            self.fds[name] = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def write(self, digest: str, data: bytes, mtime_ns: int) -> None:
        fd = os.open(digest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444,
                     dir_fd=self.fds[digest[:2]])
        try:
            os.write(fd, data)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def fixture_paths(root: str) -> dict[str, str]:
    return {
        "db": os.path.join(root, "ours", "ledger.db"),
        "blobs": os.path.join(root, "ours", "blobs"),
        "bare": os.path.join(root, "bare"),
        "orphans": os.path.join(root, "orphans.json"),
    }


def step_events(step: str, entries: list[ManifestEntry], commit: bool) -> list[Any]:
    common: dict[str, Any] = {"step": step, "attempt": 1}
    events: list[Any] = [Planned(**common, artifacts=tuple(e.path for e in entries))]
    events += [BlobPinned(**common, digest=e.digest) for e in entries]
    events += [BlobStored(**common, digest=e.digest, size=e.size, path=e.path, inline=False)
               for e in entries]
    if commit:
        arts = tuple(entries)
        events.append(ManifestPublished(**common, manifest_rev=0, expected_rev=-1,
                                        digest=manifest_digest(step, (), arts), artifacts=arts))
        events.append(Acked(**common, manifest_rev=0))
    else:
        events.append(Compensated(**common, reason="bench-gc: the attempt was abandoned"))
    return events


def build_fixture(root: str, n: int) -> dict[str, Any]:
    """Blob files in both trees, then the ledger's events (untimed)."""
    p = fixture_paths(root)
    t0 = time.perf_counter()
    old_ns = time.time_ns() - AGE_S * 1_000_000_000
    ours, bare = Tree(p["blobs"]), Tree(p["bare"])
    os.makedirs(os.path.join(p["blobs"], "tmp"))  # as a put would leave it (empty)
    committed: list[ManifestEntry] = []
    orphans: list[ManifestEntry] = []
    orphan_index: list[tuple[int, str]] = []
    for i in range(n):
        data = blob_bytes(i)
        digest = hashlib.sha256(data).hexdigest()
        ours.write(digest, data, old_ns)
        bare.write(digest, data, old_ns)
        entry = ManifestEntry(path=f"out/a{i:07d}.bin", digest=digest, size=len(data))
        if is_orphan(i):
            orphans.append(entry)
            orphan_index.append((i, digest))
        else:
            committed.append(entry)
        if (i + 1) % 20_000 == 0:
            log(f"  files: {i + 1:,}/{n:,} ({time.perf_counter() - t0:.0f}s)")
    ours.close()
    bare.close()
    files_s = time.perf_counter() - t0

    def chunk(kind: str, entries: list[ManifestEntry], commit: bool) -> list[Any]:
        return [(f"bench-gc/{kind}{k // ARTIFACTS_PER_STEP:06d}",
                 entries[k:k + ARTIFACTS_PER_STEP], commit)
                for k in range(0, len(entries), ARTIFACTS_PER_STEP)]

    committed_steps, orphan_steps = chunk("c", committed, True), chunk("o", orphans, False)
    # the log order a real ledger would have: one abandoned step after every nine commits
    steps: list[tuple[str, list[ManifestEntry], bool]] = []
    per = ORPHAN_EVERY - 1
    for k in range(max(len(orphan_steps), -(-len(committed_steps) // per))):
        steps += committed_steps[k * per:(k + 1) * per] + orphan_steps[k:k + 1]
    assert len(steps) == len(committed_steps) + len(orphan_steps)
    t1 = time.perf_counter()
    n_events = 0
    with Ledger.init(p["db"], synchronous="OFF", inline_max_bytes=0) as led:
        for k in range(0, len(steps), STEPS_PER_BATCH):
            batch = [e for s in steps[k:k + STEPS_PER_BATCH] for e in step_events(*s)]
            led.append_batch(batch)
            n_events += len(batch)
        assert led.count() == n_events
    events_s = time.perf_counter() - t1
    with open(p["orphans"], "w") as f:
        json.dump(orphan_index, f)
    t2 = time.perf_counter()
    os.sync()
    sync_s = time.perf_counter() - t2
    return {"blobs": n, "orphans": len(orphans), "referenced": len(committed),
            "committed_steps": len(committed_steps), "orphan_steps": len(orphan_steps),
            "events": n_events, "files_s": round(files_s, 1),
            "events_s": round(events_s, 1), "sync_s": round(sync_s, 1),
            "ledger_bytes": os.path.getsize(p["db"])}


def restore_orphans(root: str) -> None:
    """Write the collected orphans back into both trees (untimed, between GC reps)."""
    p = fixture_paths(root)
    with open(p["orphans"]) as f:
        orphan_index = json.load(f)
    old_ns = time.time_ns() - AGE_S * 1_000_000_000
    ours, bare = Tree(p["blobs"]), Tree(p["bare"])
    try:
        for i, digest in orphan_index:
            data = blob_bytes(i)
            for tree in (ours, bare):
                try:
                    tree.write(digest, data, old_ns)
                except FileExistsError:
                    pass
    finally:
        ours.close()
        bare.close()
    os.sync()


# -- the bare sides ----------------------------------------------------------------------


def bare_walk(root: str) -> tuple[int, int]:
    """os.scandir over the fan-out directories, one lstat (DirEntry.stat) per file."""
    count = size = 0
    with os.scandir(root) as top:
        fan = sorted(e.path for e in top if len(e.name) == 2 and e.is_dir(follow_symlinks=False))
    for path in fan:
        with os.scandir(path) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                count += 1
                size += st.st_size
    return count, size


def bare_unlink(root: str, names: list[str]) -> int:
    """Unlink each file, fsync its directory after each unlink (as BlobStore.delete)."""
    fds: dict[str, int] = {}
    try:
        for name in names:
            fd = fds.get(name[:2])
            if fd is None:
                fd = fds[name[:2]] = os.open(os.path.join(root, name[:2]),
                                             os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.unlink(name, dir_fd=fd)
            os.fsync(fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(names)


# -- workers (one timed call per fresh process) --------------------------------------------


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_reset() -> tuple[int, str]:
    """Reset the peak-RSS mark to the current RSS; return (baseline bytes, method).

    A child's ru_maxrss starts at its parent's peak on Linux (carried over fork+exec),
    so it is not used when /proc/self/clear_refs can reset VmHWM to VmRSS instead.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss = _proc_status_kib("VmRSS")
        if rss is not None:
            return rss * 1024, "VmHWM"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"


def rss_peak() -> int:
    hwm = _proc_status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(mode: str, root: str) -> dict[str, Any]:
    p = fixture_paths(root)
    with open(p["orphans"]) as f:
        orphan_names = sorted(d for _i, d in json.load(f))
    out: dict[str, Any] = {"mode": mode}
    if mode in ("bare-audit", "bare-gc"):
        gc.collect()
        rss0, how = rss_reset()
        c0, t0 = time.process_time(), time.perf_counter()
        count, size = bare_walk(p["bare"])
        unlinked = bare_unlink(p["bare"], orphan_names) if mode == "bare-gc" else 0
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.update(seconds=dt, cpu_s=cpu, rss_delta=rss_peak() - rss0, rss_method=how,
                   files=count, bytes=size, unlinked=unlinked)
        return out
    ops: Counter[str] = Counter()
    with Ledger.open(p["db"], inline_max_bytes=0, on_op=lambda name: ops.update([name])) as led:
        prof = cProfile.Profile() if mode.endswith("-profile") else None
        ops.clear()  # count the call's operations only (an open may catch projections up)
        gc.collect()
        rss0, how = rss_reset()
        if prof is not None:
            prof.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        if mode.startswith("ours-gc"):
            report: Any = collect(led, grace_s=GRACE_S)
        else:
            report = audit(led, grace_s=GRACE_S)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if prof is not None:
            prof.disable()
        out.update(seconds=dt, cpu_s=cpu, rss_delta=rss_peak() - rss0, rss_method=how,
                   ops=dict(ops), report=report.as_dict())
    if prof is not None:
        out["profile"] = {}
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
            out["profile"][key] = strip_profile(buf.getvalue())
    return out


def strip_profile(text: str) -> str:
    """pstats output without its preamble, file paths cut to their last two components."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    short = re.compile(r"(?:/[^/\s:()]+)+/([^/\s:()]+/[^/\s:()]+:\d+)")
    return "\n".join(short.sub(r"\1", line) for line in lines[start:] if line.strip())


def run_worker(mode: str, root: str) -> dict[str, Any]:
    flags = ["-S"] if sys.flags.no_site else []
    cmd = [sys.executable, *flags, os.path.abspath(__file__), "--_worker", mode, root]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"worker {mode} failed with status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- checks ------------------------------------------------------------------------------


def check_audit(got: dict[str, Any], fx: dict[str, Any]) -> None:
    r = got["report"]
    assert r["ok"], r
    assert r["stored_blobs"] == fx["blobs"], r
    assert r["referenced"]["count"] == fx["referenced"], r
    assert r["orphan_old"]["count"] == fx["orphans"], r


def check_gc(got: dict[str, Any], fx: dict[str, Any]) -> None:
    r = got["report"]
    assert r["scanned"] == fx["blobs"], r
    assert r["referenced"] == fx["referenced"], r
    assert r["orphans"] == r["collected"] == fx["orphans"], r
    assert r["remaining"] == 0 and not r["stopped"] and r["spared"] == 0, r


def check_bare(got: dict[str, Any], fx: dict[str, Any], gc_mode: bool) -> None:
    assert got["files"] == fx["blobs"], got
    assert got["unlinked"] == (fx["orphans"] if gc_mode else 0), got


# -- the run ----------------------------------------------------------------------------


def timed_pair(kind: str, root: str, fx: dict[str, Any], rep: int) -> dict[str, dict[str, Any]]:
    order = ("ours", "bare") if rep % 2 == 0 else ("bare", "ours")
    got: dict[str, dict[str, Any]] = {}
    for side in order:
        got[side] = run_worker(f"{side}-{kind}", root)
    if kind == "audit":
        check_audit(got["ours"], fx)
    else:
        check_gc(got["ours"], fx)
    check_bare(got["bare"], fx, kind == "gc")
    return got


def summarize(kind: str, reps: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    ours = statistics.median(r["ours"]["seconds"] for r in reps)
    bare = statistics.median(r["bare"]["seconds"] for r in reps)
    ratios = [r["ours"]["seconds"] / r["bare"]["seconds"] for r in reps]
    ratio = statistics.median(ratios)
    cpu_ratio = statistics.median(r["ours"]["cpu_s"] / max(r["bare"]["cpu_s"], 1e-9) for r in reps)
    last = reps[-1]["ours"]
    return {
        "ours_s": ours, "bare_s": bare, "ratio": ratio,
        "ours_cpu_s": statistics.median(r["ours"]["cpu_s"] for r in reps),
        "bare_cpu_s": statistics.median(r["bare"]["cpu_s"] for r in reps), "cpu_ratio": cpu_ratio,
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "target": TARGETS[kind], "pass": ratio <= TARGETS[kind],
        "ours_rss_delta": max(r["ours"]["rss_delta"] for r in reps),
        "bare_rss_delta": max(r["bare"]["rss_delta"] for r in reps),
        "rss_method": last["rss_method"],
        "ours_ops": last.get("ops", {}),
        "reps": [{s: {k: v for k, v in r[s].items() if k not in ("report",)} for s in r}
                 for r in reps],
        "report": last["report"],
    }


def code_digest() -> str:
    """sha256 over the sources these figures depend on (gc, blobs, log, the store, ledger)."""
    base = os.path.dirname(os.path.abspath(ledger.__file__))
    names = ["blobs.py", "events.py", "ledger.py", "log.py"]
    names += [os.path.join("store", n) for n in sorted(os.listdir(os.path.join(base, "store")))
              if n.endswith(".py")]
    names += [os.path.join("store", "sqlite", n)
              for n in sorted(os.listdir(os.path.join(base, "store", "sqlite"))) if n.endswith(".py")]
    names += [os.path.join("gc", n) for n in sorted(os.listdir(os.path.join(base, "gc")))
              if n.endswith(".py")]
    names += [os.path.join("projections", n)
              for n in sorted(os.listdir(os.path.join(base, "projections"))) if n.endswith(".py")]
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0")
        with open(os.path.join(base, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def print_report(res: dict[str, Any]) -> None:
    m, fx = res["meta"], res["fixture"]
    p = print
    p("steptrail GC benchmark: collect() and audit() vs a bare os.scandir walk, same run")
    p(f"  python {m['python']}  SQLite {m['sqlite']}  cpus {m['cpus']}"
      f"  mode {m['mode']}  ({m['seconds']:.0f} s)"
      f"  ledger sources sha256 {m['ledger_digest']}")
    fs = m["scratch_fs"]
    p(f"  scratch: {fs['path']} ({fs['fstype']} on {fs['mount']})")
    p(f"  store: {fx['blobs']:,} blob files (64-256 B, inline_max_bytes=0),"
      f" {fx['referenced']:,} referenced by {fx['committed_steps']:,} committed steps,"
      f" {fx['orphans']:,} orphans ({fx['orphan_steps']:,} compensated steps); {fx['events']:,} events,"
      f" ledger {mib(fx['ledger_bytes'])}")
    p(f"  setup (untimed, synchronous=OFF then os.sync; timed phases reopen with FULL):"
      f" files {fx['files_s']}s, events {fx['events_s']}s, sync {fx['sync_s']}s")
    p("  a shared, noisy VM: read the ratios (same run, fresh process per call), not the seconds;"
      f" load average {m['load_start']} at start, {m['load_end']} at end")
    p("")
    p(f"{'':<7}{'ours':>9} {'bare':>9}  {'ours/bare':<20} {'target':>7}        "
      f"{'peak RSS ours':>13} {'bare':>9}")
    for kind, label in (("audit", "audit"), ("gc", "gc")):
        s = res[kind]
        p(f"{label:<7}{s['ours_s']:>8.2f}s {s['bare_s']:>8.2f}s  {s['ratio']:5.2f}x"
          f" [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]{'':<4} <= {s['target']:.0f}x"
          f"  {'PASS' if s['pass'] else 'FAIL'}  {mib(s['ours_rss_delta']):>13}"
          f" {mib(s['bare_rss_delta']):>9}")
    g = res["gc"]
    ops = g["ours_ops"]
    p("")
    p("  CPU seconds of the timed calls (user + sys, medians; a diagnostic for a busy box,"
      " not the target):")
    for kind in ("audit", "gc"):
        s = res[kind]
        p(f"    {kind:<6} ours {s['ours_cpu_s']:6.2f}s  bare {s['bare_cpu_s']:6.2f}s"
          f"  ours/bare {s['cpu_ratio']:5.2f}x")
    p(f"  medians of {len(res['audit']['reps'])} audit and {len(g['reps'])} gc repetitions;"
      f" peak RSS = max over reps of (peak during the call - RSS before it, {g['rss_method']})")
    p(f"  audit bare: os.scandir walk + one lstat per file;"
      f" gc bare: the same walk + {fx['orphans']:,} x (unlink + fsync of its directory)")
    p(f"  ours gc durable ops: {ops.get('commit', 0)} commits, {ops.get('unlink', 0)} unlinks,"
      f" {ops.get('dirfsync', 0)} dir fsyncs;"
      f" collected {g['report']['collected']:,} ({g['report']['reclaimed_bytes']:,} B)")
    if m.get("ledger_changed"):
        p("  WARNING: the ledger sources changed during the run: rerun")
    p("")
    failed = [k for k in ("gc", "audit") if not res[k]["pass"]]
    p("RESULT: " + ("PASS (gc <= 3x, audit <= 2x the bare walk)" if not failed
                    else f"FAIL ({', '.join(failed)} over target)"))
    for kind in ("gc", "audit"):
        prof = res.get("profile", {}).get(kind)
        if prof:
            p("")
            p(f"cProfile of one {kind} (separate, untimed run; {prof['seconds']:.2f}s under the"
              " profiler), top by tottime:")
            p(prof["profile"]["tottime"])
            p("")
            p(f"cProfile of one {kind}, top by cumulative:")
            p(prof["profile"]["cumulative"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_BLOBS:,} blobs")
    ap.add_argument("--blobs", type=int, help=f"blobs in the store (default {FULL_BLOBS:,})")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--dir", metavar="DIR", help="parent of the scratch directory (default:"
                    " the repository root; never a RAM file system)")
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile one collect and one audit (untimed, extra runs)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--_worker", nargs=2, metavar=("MODE", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        print(json.dumps(worker(*args._worker)))
        return 0

    n = args.blobs or (QUICK_BLOBS if args.quick else FULL_BLOBS)
    if n < ORPHAN_EVERY:
        ap.error(f"--blobs must be at least {ORPHAN_EVERY}")
    reps = REPS
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = os.path.abspath(args.dir or repo)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".bench_gc-", dir=parent)
    fs = fs_info(scratch)
    if fs["fstype"] in ("tmpfs", "ramfs"):
        log(f"warning: {scratch} is on {fs['fstype']}: fsync costs nothing there")
    digest = code_digest()
    t0 = time.perf_counter()
    res: dict[str, Any] = {"meta": {
        "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(), "cpus": os.cpu_count(), "quick": args.quick,
        "mode": "quick" if args.quick and not args.blobs else "full" if not args.blobs
        else f"--blobs {n}", "load_start": loadavg(),
        "blobs": n, "reps": reps, "grace_s": GRACE_S, "targets": TARGETS,
        "ledger_digest": digest, "scratch_fs": fs,
    }}
    try:
        log(f"scratch directory {scratch}; building {n:,} blobs")
        fx = res["fixture"] = build_fixture(scratch, n)
        log(f"  fixture: {fx}")
        p = fixture_paths(scratch)
        for tree in (p["blobs"], p["bare"]):  # warm both trees' dentries and inodes alike
            bare_walk(tree)

        audit_reps = []
        for r in range(reps["audit"]):
            got = timed_pair("audit", scratch, fx, r)
            audit_reps.append(got)
            log(f"  audit rep {r + 1}/{reps['audit']}: ours {got['ours']['seconds']:.2f}s"
                f"  bare {got['bare']['seconds']:.2f}s")
        res["audit"] = summarize("audit", audit_reps)
        if args.profile:
            got = run_worker("ours-audit-profile", scratch)
            check_audit(got, fx)
            res.setdefault("profile", {})["audit"] = got

        gc_reps = []
        for r in range(reps["gc"]):
            if r:
                restore_orphans(scratch)
                for tree in (p["blobs"], p["bare"]):
                    bare_walk(tree)
            got = timed_pair("gc", scratch, fx, r)
            gc_reps.append(got)
            log(f"  gc rep {r + 1}/{reps['gc']}: ours {got['ours']['seconds']:.2f}s"
                f"  bare {got['bare']['seconds']:.2f}s  ops {got['ours']['ops']}")
        res["gc"] = summarize("gc", gc_reps)
        if args.profile:
            restore_orphans(scratch)
            bare_walk(p["blobs"])
            got = run_worker("ours-gc-profile", scratch)
            check_gc(got, fx)
            res.setdefault("profile", {})["gc"] = got
    finally:
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    res["meta"]["seconds"] = time.perf_counter() - t0
    res["meta"]["load_end"] = loadavg()
    if code_digest() != digest:
        res["meta"]["ledger_changed"] = True
        log("warning: the ledger sources changed during the run: rerun")
    res["pass"] = res["gc"]["pass"] and res["audit"]["pass"]
    if args.json:
        print(json.dumps(res, indent=2, default=str))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

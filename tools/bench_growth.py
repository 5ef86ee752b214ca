#!/usr/bin/env python3
"""Benchmark sealed runs: how much a ledger shrinks, and what verifying it costs.

Run from the repository root::

    .venv/bin/python tools/bench_growth.py            # 1,000,000 events over 1,000 runs
    .venv/bin/python tools/bench_growth.py --quick    # 100,000 events over 100 runs
    .venv/bin/python tools/bench_growth.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_growth.py --dir DIR  # scratch files under DIR

The ledger is built fast with `Ledger.append_batch`: every run is artifact-only steps of
four events (planned, blob-stored with a unique inline artifact of 64-192 bytes,
manifest-published, acked), written ten runs at a time in batches of 25 steps taken in
turn, so each run's rows interleave with nine others' (ten gaps per run, not one).

1. The unsealed ledger is vacuumed (a compact baseline: no free pages) and measured
   (the file plus its WAL), then verified (`Ledger.verify`: chain, rows, projections,
   the durability of every live manifest's blobs) — timed.
2. 90% of the runs are sealed (`ledger.seal.seal_run`, into archive files beside it);
   GC collects the blobs only the sealed runs named (forced, grace 0: the archives
   hold them); the file is vacuumed and measured again.
3. The ledger plus every archive is verified (`ledger.seal.verify_sealed`: the ledger's
   chain across every gap, then each archive row by row against its seal) — timed.
4. The sealed ledger is backed up (`ledger.backup.backup`: snapshot, blobs, archives,
   verify, marker) into a fresh directory — timed — then again into the same one, the
   ledger unchanged — timed, with the blobs and archives it copied.

Targets (issue 18): the ledger file shrinks >= 5x; verify of ledger plus archives runs
within 1.5x of verifying the unsealed ledger; a second backup of the unchanged ledger
copies no blob or archive again and costs <= 0.1x the first. The archives' own bytes are printed too:
sealing moves history out of the ledger file, it does not delete it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledger import Ledger  # noqa: E402
from ledger.backup import backup  # noqa: E402
from ledger.events import Acked, BlobStored, ManifestEntry, ManifestPublished, Planned, manifest_digest  # noqa: E402
from ledger.gc.collector import collect  # noqa: E402
from ledger.seal import file_bytes, seal_run, vacuum, verify_sealed  # noqa: E402

SHRINK_TARGET = 5.0
VERIFY_TARGET = 1.5
BACKUP_TARGET = 0.1
EVENTS_PER_STEP = 4
STEPS_PER_BATCH = 25
CONCURRENT_RUNS = 10


def build(ledger: Ledger, runs: int, events_per_run: int) -> None:
    steps = events_per_run // EVENTS_PER_STEP
    for first in range(0, runs, CONCURRENT_RUNS):
        group = list(range(first, min(runs, first + CONCURRENT_RUNS)))
        for start in range(0, steps, STEPS_PER_BATCH):
            for r in group:
                events, inline = [], {}
                for i in range(start, min(steps, start + STEPS_PER_BATCH)):
                    step, run = f"run-{r:04d}/step-{i:04d}", f"run-{r:04d}"
                    data = f"artifact of {step}\n".encode() * (2 + (i % 5))
                    digest = hashlib.sha256(data).hexdigest()
                    inline[digest] = data
                    entry = ManifestEntry(path="out.txt", digest=digest, size=len(data))
                    events += [
                        Planned(step=step, attempt=1, run=run, artifacts=("out.txt",)),
                        BlobStored(step=step, attempt=1, run=run, digest=digest,
                                   size=len(data), path="out.txt", inline=True),
                        ManifestPublished(step=step, attempt=1, run=run, manifest_rev=0,
                                          digest=manifest_digest(step, (), (entry,)),
                                          artifacts=(entry,)),
                        Acked(step=step, attempt=1, run=run, manifest_rev=0),
                    ]
                ledger.append_batch(events, inline=inline)


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events over 100 runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one here)")
    args = parser.parse_args()
    runs, per_run = (100, 1000) if args.quick else (1000, 1000)
    sealed_runs = runs * 9 // 10
    scratch = tempfile.mkdtemp(prefix="bench-growth-", dir=args.dir or ".")
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        path = os.path.join(scratch, ".steptrail", "ledger.db")
        with Ledger.init(path) as ledger:
            t = time.perf_counter()
            build(ledger, runs, per_run)
            build_s = time.perf_counter() - t
            events = ledger.count()
            log(f"built {events} events over {runs} runs in {build_s:.1f}s")
            vacuum(ledger)
            before = file_bytes(path)
            t = time.perf_counter()
            report = ledger.verify()
            verify_before_s = time.perf_counter() - t
            assert report.ok, report.findings[:3]
            log(f"unsealed: {before / 2**20:.1f} MiB, verify {verify_before_s:.1f}s")
            t = time.perf_counter()
            for r in range(sealed_runs):
                seal_run(ledger, f"run-{r:04d}")
            seal_s = time.perf_counter() - t
            gc = collect(ledger, grace_s=0, force=True,
                         now_ns=ledger.clock() + 30 * 86400 * 10**9)
            t = time.perf_counter()
            vacuum(ledger)
            vacuum_s = time.perf_counter() - t
            after = file_bytes(path)
            archives = dir_bytes(os.path.join(scratch, ".steptrail", "archive"))
            log(f"sealed {sealed_runs} runs in {seal_s:.1f}s; gc collected {gc.collected}"
                f" blobs; vacuum {vacuum_s:.1f}s; ledger {after / 2**20:.1f} MiB,"
                f" archives {archives / 2**20:.1f} MiB")
            t = time.perf_counter()
            full = verify_sealed(ledger)
            verify_after_s = time.perf_counter() - t
            assert full.ok, (full.ledger.findings[:3], full.findings[:3])
            remaining = ledger.count()
        dest = os.path.join(scratch, "backup")
        t = time.perf_counter()
        first = backup(path, dest)
        backup_first_s = time.perf_counter() - t
        t = time.perf_counter()
        again = backup(path, dest)
        backup_again_s = time.perf_counter() - t
        log(f"backup {backup_first_s:.2f}s ({first.archives} archives), again"
            f" {backup_again_s:.3f}s ({again.blobs_copied} blobs, {again.archives_copied}"
            " archives copied)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    shrink = before / after
    verify_ratio = verify_after_s / verify_before_s
    results = {
        "events": events, "runs": runs, "sealed_runs": sealed_runs,
        "events_after": remaining, "build_s": build_s, "seal_s": seal_s,
        "ledger_bytes_before": before, "ledger_bytes_after": after,
        "archive_bytes": archives, "gc_collected": gc.collected,
        "shrink": shrink, "shrink_target": SHRINK_TARGET, "shrink_pass": shrink >= SHRINK_TARGET,
        "verify_before_s": verify_before_s, "verify_after_s": verify_after_s,
        "verify_ratio": verify_ratio, "verify_target": VERIFY_TARGET,
        "verify_pass": verify_ratio <= VERIFY_TARGET,
        "backup_first_s": backup_first_s, "backup_again_s": backup_again_s,
        "backup_again_copied": again.blobs_copied + again.archives_copied,
        "backup_ratio": backup_again_s / backup_first_s, "backup_target": BACKUP_TARGET,
        "backup_pass": (backup_again_s / backup_first_s <= BACKUP_TARGET
                        and again.blobs_copied + again.archives_copied == 0),
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"ledger file: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB: shrinks"
              f" {shrink:.2f}x (target >= {SHRINK_TARGET:g}x)"
              f" {'PASS' if results['shrink_pass'] else 'FAIL'}")
        print(f"verify: unsealed {verify_before_s:.2f}s, ledger + archives {verify_after_s:.2f}s:"
              f" {verify_ratio:.2f}x (target <= {VERIFY_TARGET:g}x)"
              f" {'PASS' if results['verify_pass'] else 'FAIL'}")
        print(f"archives: {archives / 2**20:.1f} MiB in {sealed_runs} files (history moved,"
              " not deleted)")
        print(f"backup: first {backup_first_s:.2f}s, the unchanged ledger again"
              f" {backup_again_s:.3f}s copying {results['backup_again_copied']} files:"
              f" {results['backup_ratio']:.3f}x (target <= {BACKUP_TARGET:g}x, nothing copied)"
              f" {'PASS' if results['backup_pass'] else 'FAIL'}")
    return 0 if results["shrink_pass"] and results["verify_pass"] and results["backup_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark `backup`: a second backup of an unchanged ledger against the first.

Run from the repository root::

    .venv/bin/python tools/bench_backup.py            # 1,000 steps x 256 KiB blob files
    .venv/bin/python tools/bench_backup.py --quick    # 200 steps
    .venv/bin/python tools/bench_backup.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_backup.py --dir DIR  # scratch directory under DIR

What is measured
----------------
A ledger of N committed steps (`ledger.runner.run_step`), each with one artifact of
256 KiB (a blob file: above the inline threshold) and one small inline one. Then, in one
run and one scratch directory:

* first: ``backup(ledger, DEST)`` into an empty DEST — snapshot, every blob copied
  (hashed on the way), the copy verified, the marker written;
* second: ``backup(ledger, DEST)`` again, nothing changed — the target: no blob copied
  again, and at most 0.1x the first's wall time;
* incremental (reported, no target): 1% more steps, then ``backup`` again — only the new
  blobs copied.

Figures are ratios of wall seconds in the same run (a shared, noisy VM: never absolute
times). Exit status 0 when the target holds (PASS), 1 otherwise (FAIL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ledger import Ledger  # noqa: E402
from ledger.backup import backup  # noqa: E402
from ledger.runner import run_step  # noqa: E402

FULL_STEPS = 1000
QUICK_STEPS = 200
BLOB_BYTES = 256 * 1024
TARGET_RATIO = 0.1


def _content(i: int) -> bytes:
    label = f"artifact {i}:".encode()
    return (label * (BLOB_BYTES // len(label) + 1))[:BLOB_BYTES]


def _steps(led: Ledger, start: int, n: int) -> None:
    for i in range(start, start + n):
        run_step(led, f"s{i}", {"big.bin": _content(i), "small.txt": f"small {i}".encode()})


def run(steps: int, root: str) -> dict[str, object]:
    path = os.path.join(root, "src", "ledger.db")
    dest = os.path.join(root, "backup")
    with Ledger.init(path) as led:
        _steps(led, 0, steps)
    t = time.perf_counter()
    first = backup(path, dest)
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    second = backup(path, dest)
    second_s = time.perf_counter() - t
    more = max(1, steps // 100)
    with Ledger.open(path) as led:
        _steps(led, steps, more)
    t = time.perf_counter()
    third = backup(path, dest)
    third_s = time.perf_counter() - t
    ratio = second_s / first_s
    passed = second.blobs_copied == 0 and second.unchanged and ratio <= TARGET_RATIO
    return {
        "steps": steps, "blob_bytes": BLOB_BYTES, "blobs": first.blobs,
        "db_bytes": first.db_bytes, "first_s": round(first_s, 4),
        "first_blobs_copied": first.blobs_copied, "first_bytes_copied": first.bytes_copied,
        "second_s": round(second_s, 4), "second_blobs_copied": second.blobs_copied,
        "second_unchanged": second.unchanged, "ratio_second_first": round(ratio, 4),
        "incremental_steps": more, "incremental_s": round(third_s, 4),
        "incremental_blobs_copied": third.blobs_copied,
        "ratio_incremental_first": round(third_s / first_s, 4),
        "target_ratio": TARGET_RATIO, "pass": passed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps")
    ap.add_argument("--steps", type=int, help=f"steps in the ledger (default {FULL_STEPS})")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--dir", metavar="DIR", help="parent of the scratch directory")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    root = tempfile.mkdtemp(prefix="bench-backup-", dir=args.dir)
    try:
        r = run(steps, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(r))
    else:
        mib = BLOB_BYTES * int(r["blobs"]) / 2**20  # type: ignore[call-overload]
        print(f"ledger: {steps} steps, {r['blobs']} blob files ({mib:.0f} MiB),"
              f" db {int(r['db_bytes']) / 2**20:.1f} MiB")  # type: ignore[call-overload]
        print(f"first backup      {r['first_s']:>8.3f} s  {r['first_blobs_copied']} blobs copied")
        print(f"second, unchanged {r['second_s']:>8.3f} s  {r['second_blobs_copied']} blobs copied"
              f"  ratio {r['ratio_second_first']:.3f} (target <= {TARGET_RATIO})")
        print(f"incremental +{r['incremental_steps']}  {r['incremental_s']:>8.3f} s"
              f"  {r['incremental_blobs_copied']} blobs copied  ratio"
              f" {r['ratio_incremental_first']:.3f} (no target)")
        print("RESULT: " + ("PASS" if r["pass"] else "FAIL")
              + f" (second backup of an unchanged ledger copies no blob, <= {TARGET_RATIO}x the first)")
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

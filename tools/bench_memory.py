#!/usr/bin/env python3
"""Peak memory of the commands that read, hash and copy whole files, and of verify.

Run from the repository root::

    .venv/bin/python tools/bench_memory.py            # files of 64 and 256 MiB;
                                                      # verify at 50k and 200k events
    .venv/bin/python tools/bench_memory.py --large    # adds a 1 GiB file and 1M events
    .venv/bin/python tools/bench_memory.py --only files        # or: verify
    .venv/bin/python tools/bench_memory.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_memory.py --dir DIR  # scratch files under DIR

Every figure is the peak resident set size (VmHWM, reset through
/proc/self/clear_refs once the process has imported steptrail and before the command
runs; ru_maxrss where /proc is missing) of a fresh process that runs ONE command line
through the real CLI entry point (``ledger.cli:cli``) in process. The baseline is the
same kind of process running ``steptrail head`` on the same ledger, in the same run:
the memory any command needs. Each figure is printed as its peak, the peak above the
baseline, and the ratio peak / baseline. Nothing is timed.

Files (per size N): ``workspace snapshot`` of an N-MiB file; ``step plan`` of a write
whose content is an N-MiB ``content_file``; ``step apply`` of that write over the
N-MiB file (the pre-image is pinned into the blob store, the post-image staged from
it); ``step store`` of an N-MiB artifact. Streaming work keeps the peak flat: the
check is that the peak above the baseline grows by far less than the file size
(reported as ``growth``: (peak above baseline at the largest N - at the smallest N)
/ (largest N - smallest N), 0 when flat, 1 when the whole file is held once).

Verify (per event count E): ``verify`` of a ledger of E events (E/4 acked artifact
steps, built as tools/bench_ledger.py builds its rebuild ledger), and ``rebuild`` on
the same file for comparison. Every step is finished, so the live working set is
empty: verify's peak should not follow E.

The exit status is 0 whatever the figures say.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: bench_ledger
from bench_ledger import build_ledger, log, rss_peak, rss_reset, store_blobs  # noqa: E402

MiB = 1024 * 1024
FILE_SIZES_MIB = (64, 256)
FILE_SIZES_LARGE_MIB = (*FILE_SIZES_MIB, 1024)
EVENT_COUNTS = (50_000, 200_000)
EVENT_COUNTS_LARGE = (*EVENT_COUNTS, 1_000_000)


# -- one measured command, in its own process --------------------------------------------


def worker(cwd: str, argv: list[str]) -> dict[str, Any]:
    """Run one CLI command line in this (fresh) process; its peak RSS and exit code."""
    from ledger.cli import cli

    os.chdir(cwd)
    gc.collect()
    base = rss_reset()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        try:
            cli.main(args=argv, prog_name="steptrail", standalone_mode=False)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return {"argv": argv, "exit": code, "base": base, "peak": rss_peak()}


def measure(cwd: str, *argv: str) -> dict[str, Any]:
    """`worker` in a fresh interpreter; raises when the command fails."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", cwd, *argv]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if got["exit"] != 0:
        raise SystemExit(f"steptrail {' '.join(argv)} exited {got['exit']}")
    return got


# -- the file commands --------------------------------------------------------------------


def write_file(path: str, size: int, tag: bytes) -> str:
    """A file of `size` bytes (distinct per `tag`), written in 1 MiB pieces; its sha256."""
    h = hashlib.sha256()
    block = (tag * (MiB // len(tag) + 1))[:MiB]
    with open(path, "wb") as f:
        for i in range(size // MiB):
            piece = i.to_bytes(8, "big") + block[8:]
            f.write(piece)
            h.update(piece)
    return h.hexdigest()


def bench_files(scratch: str, size_mib: int) -> dict[str, Any]:
    """Snapshot, plan, apply and store of N-MiB files, each in its own process."""
    d = os.path.join(scratch, f"files-{size_mib}")
    ws = os.path.join(d, "ws")
    os.makedirs(ws)
    size = size_mib * MiB
    pre = write_file(os.path.join(ws, "big.bin"), size, b"pre-image ")
    write_file(os.path.join(d, "new.bin"), size, b"post-image ")
    write_file(os.path.join(d, "art.bin"), size, b"artifact ")
    g = ["--ledger", os.path.join(d, "ledger.db"), "--workspace", "w"]
    measure(d, *g, "init")
    measure(d, *g, "workspace", "add", "w", ws)
    measure(d, *g, "lease", "acquire", "--holder", "bench", "--ttl", "24h")
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump({"step": "s1", "writes": [
            {"path": "big.bin", "pre_hash": pre, "content_file": "new.bin"}]}, f)
    out = {
        "size_mib": size_mib,
        "baseline": measure(d, *g, "head")["peak"],
        "snapshot": measure(d, *g, "workspace", "snapshot", "big.bin")["peak"],
        "plan": measure(d, *g, "step", "plan", "--epoch", "1", "plan.json")["peak"],
        "apply": measure(d, *g, "step", "apply", "s1", "--epoch", "1")["peak"],
        "store": measure(d, *g, "step", "store", "s2", "art.bin")["peak"],
    }
    shutil.rmtree(d)
    return out


# -- verify ----------------------------------------------------------------------------


def bench_verify(scratch: str, n_events: int) -> dict[str, Any]:
    path = os.path.join(scratch, f"verify-{n_events}.db")
    build_ledger(path, n_events)
    g = ["--ledger", path]
    out = {
        "events": n_events,
        "baseline": measure(scratch, *g, "head")["peak"],
        "verify": measure(scratch, *g, "verify")["peak"],
        "rebuild": measure(scratch, *g, "rebuild")["peak"],
    }
    for name in os.listdir(scratch):
        if name.startswith(os.path.basename(path)):
            os.unlink(os.path.join(scratch, name))
    return out


# -- report --------------------------------------------------------------------------


def fmt(n: int) -> str:
    return f"{n / MiB:8.1f} MiB"


def growth(rows: list[dict[str, Any]], key: str, unit: str) -> float:
    """(peak above baseline at the last row - at the first) / (the unit's difference)."""
    first, last = rows[0], rows[-1]
    above = [r[key] - r["baseline"] for r in (first, last)]
    span = (last[unit] - first[unit]) * (MiB if unit == "size_mib" else 1)
    return (above[1] - above[0]) / span


def print_report(res: dict[str, Any]) -> None:
    if "files" in res:
        print("peak RSS per command vs file size (above: peak - baseline; x: peak / baseline)")
        for r in res["files"]:
            print(f"  {r['size_mib']:5d} MiB file   baseline (head) {fmt(r['baseline'])}")
            for k in ("snapshot", "plan", "apply", "store"):
                print(f"    {k:<9} {fmt(r[k])}   above {fmt(r[k] - r['baseline'])}"
                      f"   x{r[k] / r['baseline']:.2f}")
        print("  growth per byte of file (0 flat, 1 = the whole file held once):")
        for k, v in res["files_growth"].items():
            print(f"    {k:<9} {v:.4f}")
    if "verify" in res:
        print("peak RSS of verify and rebuild vs event count")
        for r in res["verify"]:
            print(f"  {r['events']:>9,} events   baseline (head) {fmt(r['baseline'])}")
            for k in ("verify", "rebuild"):
                print(f"    {k:<9} {fmt(r[k])}   above {fmt(r[k] - r['baseline'])}"
                      f"   x{r[k] / r['baseline']:.2f}")
        print("  growth per event (bytes above baseline per extra event):")
        for k, v in res["verify_growth"].items():
            print(f"    {k:<9} {v:.1f}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--_worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", action="store_true", help="add a 1 GiB file and 1M events")
    ap.add_argument("--only", choices=("files", "verify"), help="one section only")
    ap.add_argument("--json", action="store_true", help="print JSON on stdout")
    ap.add_argument("--dir", help="where the scratch directory goes (default: here)")
    args = ap.parse_args()
    parent = os.path.abspath(args.dir or os.getcwd())
    scratch = tempfile.mkdtemp(prefix=".bench_memory-", dir=parent)
    res: dict[str, Any] = {}
    try:
        if args.only in (None, "files"):
            res["files"] = []
            for n in FILE_SIZES_LARGE_MIB if args.large else FILE_SIZES_MIB:
                log(f"files of {n} MiB")
                res["files"].append(bench_files(scratch, n))
            res["files_growth"] = {k: growth(res["files"], k, "size_mib")
                                   for k in ("snapshot", "plan", "apply", "store")}
        if args.only in (None, "verify"):
            store_blobs(scratch)
            res["verify"] = []
            for n in EVENT_COUNTS_LARGE if args.large else EVENT_COUNTS:
                log(f"verify of {n:,} events")
                res["verify"].append(bench_verify(scratch, n))
            res["verify_growth"] = {k: growth(res["verify"], k, "events")
                                    for k in ("verify", "rebuild")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The witness's cost per commit, beside the append benchmark.

    .venv/bin/python tools/bench_witness.py [--events 2000] [--json] [--dir DIR]

Two ledgers on the same disk, one with a witness file (in another directory; on a real
deployment another volume), one without; single-event durable appends
(`synchronous=FULL`), interleaved in blocks so both see the same machine load. The
witness adds one `pwrite` + `fdatasync` per commit. Prints appends/s for both, the
ratio, and the added cost per commit in microseconds. The append benchmark's targets
(tools/bench_ledger.py) are stated without a witness; this is its price.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from ledger import Ledger, Planned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = os.path.abspath(tempfile.mkdtemp(prefix="bench-witness-", dir=args.dir))  # a witness path is absolute
    try:
        os.makedirs(os.path.join(root, "elsewhere"))
        plain = Ledger.init(os.path.join(root, "plain", "l.db"))
        witnessed = Ledger.init(os.path.join(root, "witnessed", "l.db"),
                                witness=os.path.join(root, "elsewhere", "ledger.witness"))
        t = {"plain": 0.0, "witnessed": 0.0}
        n = 0
        for b in range(args.events // args.block):
            order = (("plain", plain), ("witnessed", witnessed))
            for name, led in (order if b % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                for i in range(args.block):
                    led.append(Planned(step=f"s{b}-{i}", attempt=1))
                t[name] += time.perf_counter() - t0
            n += args.block
        plain.close()
        witnessed.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rate = {k: n / v for k, v in t.items()}
    result = {"events": n, "plain_per_s": round(rate["plain"], 1),
              "witnessed_per_s": round(rate["witnessed"], 1),
              "ratio": round(rate["witnessed"] / rate["plain"], 3),
              "added_us_per_commit": round((t["witnessed"] - t["plain"]) / n * 1e6, 1)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"single-event durable appends, {n} per side, interleaved blocks of {args.block}")
        print(f"  without witness {rate['plain']:8.1f}/s")
        print(f"  with witness    {rate['witnessed']:8.1f}/s   ratio {result['ratio']:.3f}")
        print(f"  the witness adds {result['added_us_per_commit']:.0f} us per commit"
              " (one pwrite + fdatasync)")


if __name__ == "__main__":
    main()

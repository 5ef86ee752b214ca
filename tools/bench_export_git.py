#!/usr/bin/env python3
"""What `steptrail export git` costs for a run of N steps (default 1,000): the first export
(every commit written), a re-export (the same commits: nothing new), and an export after
one more step — beside `git fast-import` of the same stream with no ledger reading (its
floor), in the same run.

    .venv/bin/python tools/bench_export_git.py              # 1,000 steps, one write each
    .venv/bin/python tools/bench_export_git.py --steps 200 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ledger import Ledger, run_fenced_step  # noqa: E402
from ledger.export_git import _stream, export_git  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-export-git-", dir=args.dir)
    out: dict[str, Any] = {"steps": args.steps}
    try:
        repo = os.path.join(scratch, "repo")
        os.makedirs(repo)
        subprocess.run(["git", "init", "-q", repo], check=True)
        for i in range(20):
            with open(os.path.join(repo, f"f{i}.py"), "w") as f:
                f.write(f"# file {i}\n" * 50)
        subprocess.run(["git", "-C", repo, "add", "-A"], check=True)
        subprocess.run(["git", "-C", repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit",
                        "-qm", "base"], check=True)
        with Ledger.init(os.path.join(scratch, "ledger.db")) as led:
            led.workspaces.add("w", repo)
            lease = led.workspaces.acquire("w", holder="bench", ttl_s=3600)
            for k in range(args.steps):
                path = f"f{k % 20}.py"
                run_fenced_step(led, "w", f"s{k}", lambda read, k=k, path=path: [
                    read.read(path).write(f"# step {k}\n".encode() * 50)],
                    epoch=lease.epoch, run="r").raise_for_status()
            t = time.perf_counter()
            first = export_git(led, "r")
            out["first_s"] = time.perf_counter() - t
            t = time.perf_counter()
            export_git(led, "r")
            out["again_s"] = time.perf_counter() - t
            run_fenced_step(led, "w", "extra", lambda read: [
                read.read("f0.py").write(b"# extra\n")], epoch=lease.epoch,
                run="r").raise_for_status()
            t = time.perf_counter()
            later = export_git(led, "r")
            out["one_more_s"] = time.perf_counter() - t
            out["commits"] = later.commits
            # the floor: fast-import of the same stream, no ledger reading
            stream, _n = _stream(led, "r", "w", "refs/steptrail/floor", first.base, "b <b@b>",
                                 "", [])
            t = time.perf_counter()
            subprocess.run(["git", "-C", repo, "fast-import", "--quiet"], input=stream,
                           check=True, capture_output=True)
            out["fast_import_s"] = time.perf_counter() - t
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"export git of a run of {args.steps:,} steps (one 600-byte write each):")
    print(f"  first export          {out['first_s']:7.2f} s  ({out['commits']} commits after one more)")
    print(f"  re-export (the same)  {out['again_s']:7.2f} s")
    print(f"  after one more step   {out['one_more_s']:7.2f} s")
    print(f"  git fast-import alone {out['fast_import_s']:7.2f} s  (the floor; the rest reads the"
          " ledger and builds the stream)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

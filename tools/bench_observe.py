#!/usr/bin/env python3
"""What `observe` costs on a tree of N files (default 10,000): the baseline, a look with
nothing changed, a look with a few files changed, a fenced step with and without
observing first (`run_fenced_step(observe=True)`) — beside a bare stat walk of the same
tree (the floor: ``os.scandir`` + ``lstat`` of every entry, no hashing, no ledger) and
``git status --porcelain`` on the same tree (the tool people already run for this), in
the same run.

    .venv/bin/python tools/bench_observe.py                  # 10,000 files of ~2 KiB
    .venv/bin/python tools/bench_observe.py --files 2000 --rounds 3 --json
    .venv/bin/python tools/bench_observe.py --dir DIR        # the tree under DIR

Each look runs `--rounds` times (medians). "nothing changed" is measured after the
files have aged past the 2 s window in which a file is read again whatever its stat
(their times are set back an hour, then one warming look caches them), so it is the
steady state of a workspace a person is not editing this second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ledger import Ledger  # noqa: E402


def make_tree(root: str, files: int, size: int) -> None:
    per_dir = 50
    body = (b"x" * (size - 16))
    for i in range(files):
        d = os.path.join(root, f"pkg{i // per_dir // 20:03d}", f"mod{i // per_dir:04d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}.py"), "wb") as f:
            f.write(f"# {i:012d}\n".encode() + body)


def age(root: str) -> None:
    old = time.time_ns() - 3600 * 10**9
    for dirpath, _dirs, names in os.walk(root):
        if ".steptrail" in dirpath or ".git" in dirpath:
            continue
        for n in names:
            os.utime(os.path.join(dirpath, n), ns=(old, old))


def stat_walk(root: str) -> int:
    n = 0
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                n += 1
                if e.is_dir(follow_symlinks=False) and e.name not in (".git", ".steptrail"):
                    stack.append(e.path)
                del st
    return n


def timed(fn: Any, rounds: int) -> float:
    got = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        got.append(time.perf_counter() - t)
    return statistics.median(got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=2048, help="bytes a file (default 2048)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-observe-", dir=args.dir)
    out: dict[str, Any] = {"files": args.files, "size": args.size, "rounds": args.rounds}
    try:
        root = os.path.join(scratch, "repo")
        os.makedirs(root)
        make_tree(root, args.files, args.size)
        git = shutil.which("git")
        if git:
            subprocess.run([git, "init", "-q", root], check=True)
            subprocess.run([git, "-C", root, "add", "-A"], check=True)
            subprocess.run([git, "-C", root, "-c", "user.name=b", "-c", "user.email=b@b",
                            "commit", "-qm", "tree"], check=True)
        with Ledger.init(os.path.join(scratch, "ledger.db")) as led:
            led.workspaces.add("w", root)
            t = time.perf_counter()
            base = led.workspaces.observe("w", by="bench")
            out["baseline_s"] = time.perf_counter() - t
            out["baseline_changes"] = len(base.changes)
            age(root)
            if git:  # the index's stat data fresh again, as in a repository at rest (an
                # observation's own git runs never write the index)
                subprocess.run([git, "-C", root, "update-index", "-q", "--refresh"],
                               check=False)
            time.sleep(2.2)  # past the window in which a just-changed file is read anyway
            led.workspaces.observe("w", by="bench")  # caches every file, now aged
            looks = []

            def quiet() -> None:
                got = led.workspaces.observe("w", by="bench")
                assert not got.changes, got.changes[:3]
                looks.append(got.hashed)

            out["unchanged_s"] = timed(quiet, args.rounds)
            out["unchanged_hashed"] = looks[-1]
            out["stat_walk_s"] = timed(lambda: stat_walk(root), args.rounds)
            if git:
                out["git_status_s"] = timed(lambda: subprocess.run(
                    [git, "-C", root, "status", "--porcelain"], capture_output=True,
                    check=True), args.rounds)
            edits = []

            def ten() -> None:
                k = len(edits)
                edits.append(k)
                for i in range(10):
                    path = os.path.join(root, "pkg000", "mod0000", f"f{i:05d}.py")
                    with open(path, "ab") as f:
                        f.write(f"# edit {k}\n".encode())
                got = led.workspaces.observe("w", by="bench")
                assert len(got.changes) == 10, got.changes

            out["ten_changed_s"] = timed(ten, args.rounds)
            # a fenced step of one small write, with and without observing first
            from ledger import run_fenced_step

            lease = led.workspaces.acquire("w", holder="bench", ttl_s=3600)
            n = [0]

            def step(observe: bool) -> None:
                n[0] += 1
                k = n[0]
                run_fenced_step(led, "w", f"s{k}", lambda read: [read.read(
                    "pkg000/mod0001/f00050.py").write(f"# step {k}\n".encode())],
                    epoch=lease.epoch, observe=observe).raise_for_status()

            steps = max(args.rounds, 5)
            out["step_s"] = timed(lambda: step(False), steps)
            out["step_observing_s"] = timed(lambda: step(True), steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    n = out["files"]
    print(f"observe on {n:,} files of {args.size:,} bytes (median of {args.rounds}):")
    print(f"  baseline (every file read and stored)   {out['baseline_s']:8.3f} s")
    print(f"  nothing changed                          {out['unchanged_s'] * 1e3:8.1f} ms"
          f"  ({out['unchanged_hashed']} files read)")
    print(f"  10 files changed                         {out['ten_changed_s'] * 1e3:8.1f} ms")
    print(f"  a fenced step (one small write)          {out['step_s'] * 1e3:8.1f} ms")
    print(f"  the same step, observing first           {out['step_observing_s'] * 1e3:8.1f} ms")
    print(f"  bare stat walk (the floor)               {out['stat_walk_s'] * 1e3:8.1f} ms"
          f"  -> nothing changed = {out['unchanged_s'] / out['stat_walk_s']:.1f}x the floor")
    if "git_status_s" in out:
        print(f"  git status --porcelain                   {out['git_status_s'] * 1e3:8.1f} ms"
              f"  -> nothing changed = {out['unchanged_s'] / out['git_status_s']:.1f}x git")
    return 0


if __name__ == "__main__":
    sys.exit(main())

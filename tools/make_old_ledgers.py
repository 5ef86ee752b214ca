"""Write the ledgers every earlier format version left, with the code that wrote them.

For each SQLite schema version before the current one, this checks out (a detached git
worktree under a scratch directory) the last commit that wrote that version, runs one
workload with *that* code, and keeps the result under ``tests/fixtures/ledgers/`` as
``v<N>.tar.gz``: ``ledger/`` (the ledger file, its blobs, its seal archives from v4),
``ws/`` (the workspace it wrote, from v2), ``backup/`` (a backup the old code made, from
v4), and ``expect.json`` — what the old code itself read back (every step's state,
attempt and manifest digest, each artifact's bytes' digest, the head) — so a test of the
current code can open it, migrate it and check the result against what was written.

    .venv/bin/python tools/make_old_ledgers.py            # every version, into the tests
    .venv/bin/python tools/make_old_ledgers.py --versions 4,5 --out /tmp/old

Run from a clone with its history. The fixtures are committed: the tests never need git
or the old code, and they test the very bytes the old releases wrote.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: version -> the last commit whose code wrote that schema version.
COMMITS = {
    1: "4164cfeb077cd2cd04440dd506b94f87c323e2bc",
    2: "a25503383f2b11fb2c86059aa11e49aba884dde5",
    3: "a6227351f0c4d874122e076741457c1c2fe5bd1b",
    4: "eb501a65c0e167ff298f4b0a767c964766040cdb",
    5: "424ed0253dfd24352ac4920d87f3f5168c8b8170",
}

#: The workload, run by the old code (its checkout first on sys.path). It uses only what
#: each version has, found by name, and writes expect.json from the old code's own reads.
WORKLOAD = r'''
import hashlib, json, os, sys
out = sys.argv[1]
import ledger
from ledger import Ledger
try:
    from ledger.runner import run_step
except ImportError:
    from ledger.steps import run_step
os.makedirs(os.path.join(out, "ledger"))
path = os.path.join(out, "ledger", "ledger.db")
ws_root = os.path.join(out, "ws")
os.makedirs(ws_root)
expect = {"artifacts": {}, "files": {}}
with Ledger.init(path) as led:
    for i in range(4):
        run_step(led, f"art-{i}", {"small.txt": b"small %d" % i,
                                   "big.bin": bytes([i]) * (70_000 + i)}, run="r-art")
    row = led.plan("open", artifacts=["o.txt"])
    led.store("open", row.attempt, "o.txt", b"stored, never published")
    comp = led.plan("comp", artifacts=["c.txt"])
    led.store("comp", comp.attempt, "c.txt", b"to be compensated")
    led.append(ledger.Compensated(step="comp", attempt=comp.attempt))
    fences = getattr(led, "workspaces", None)
    add = getattr(led, "add_workspace", None) or (
        fences.add if fences and hasattr(fences, "add") else None)
    if add is not None:  # v2 on: a workspace and fenced writes
        ws = fences if fences is not None and hasattr(fences, "plan_step") else led
        Write = getattr(ledger, "Write", None)
        if Write is None:
            from ledger.fences import Write
        add("w", ws_root)
        lease = ws.acquire("w", "maker")
        have = {}
        for i in range(3):
            name = f"f{i % 2}.txt"
            content = b"version %d of %s\n" % (i, name.encode())
            pre = have.get(name)
            ws.plan_step(f"write-{i}", workspace="w", epoch=lease.epoch,
                         writes=[Write(name, content, pre)])
            ws.apply(f"write-{i}", epoch=lease.epoch)
            have[name] = hashlib.sha256(content).hexdigest()
        expect["files"] = {n: h for n, h in have.items()}
    seal_run = None
    try:
        from ledger.seal import seal_run
    except ImportError:
        pass
    if seal_run is not None:  # v4 on: a sealed run
        run_step(led, "sealed-0", {"s.txt": b"sealed away"}, run="r-sealed")
        seal_run(led, "r-sealed")
        expect["sealed"] = "r-sealed"
    expect["head"] = led.head().seq
    expect["steps"] = sorted([s.step_id, s.state, s.attempt, s.manifest_digest]
                             for s in led.steps())
    for s in led.steps():
        m = led.manifest(s.step_id)
        if m is not None:
            for a in m.artifacts:
                expect["artifacts"][f"{s.step_id}/{a.path}"] = a.digest
    report = led.verify()
    assert report.ok, report
try:
    from ledger.backup import backup
except ImportError:
    backup = None
if backup is not None:  # v4 on: a backup the old code made, of the closed ledger
    backup(path, os.path.join(out, "backup"))
    expect["backup"] = "backup"
with open(os.path.join(out, "expect.json"), "w") as f:
    json.dump(expect, f, indent=1, sort_keys=True)
'''


def make(version: int, out_dir: str, scratch: str) -> str:
    commit = COMMITS[version]
    tree = os.path.join(scratch, f"src-v{version}")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", tree, commit],
                   check=True, capture_output=True)
    try:
        work = os.path.join(scratch, f"v{version}")
        os.makedirs(work)
        env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
        ran = subprocess.run([sys.executable, "-c", WORKLOAD, work], env=env, cwd=scratch,
                             capture_output=True, text=True)
        if ran.returncode:
            sys.exit(f"v{version} ({commit[:10]}): the workload failed:\n{ran.stderr}")
        made = subprocess.run(
            [sys.executable, "-c", "import apsw,sys; c=apsw.Connection(sys.argv[1]);"
             " print(c.execute('PRAGMA user_version').fetchone()[0])",
             os.path.join(work, "ledger", "ledger.db")], check=True, capture_output=True, text=True)
        assert int(made.stdout) == version, (version, made.stdout)
        target = os.path.join(out_dir, f"v{version}.tar.gz")
        with tarfile.open(target, "w:gz") as tar:
            for name in sorted(os.listdir(work)):
                tar.add(os.path.join(work, name), arcname=name)
        return target
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree],
                       capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default=",".join(map(str, COMMITS)))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "ledgers"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="old-ledgers-")
    try:
        for v in (int(x) for x in args.versions.split(",")):
            made = make(v, args.out, scratch)
            print(made, os.path.getsize(made), "bytes")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

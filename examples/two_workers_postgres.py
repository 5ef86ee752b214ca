"""Two workers, one PostgreSQL ledger, and a takeover.

    python examples/two_workers_postgres.py postgresql://me@db.internal/ledger [--workdir DIR]
    STEPTRAIL_LEDGER=postgresql://... python examples/two_workers_postgres.py

The URL's database must exist (a throwaway one: `URL=$(python -m ledger.testing.pgserver
start /tmp/pg)`); the ledger's tables are created in it if needed. It needs the extra:
pip install 'steptrail[postgres]'.

What happens, each worker a process of its own that shares only the URL (and the
workspace directory: in real life a volume the next sandbox mounts):

1. worker A takes the workspace's lease (epoch 1, a 2 s TTL it would keep renewing),
   commits step-1 and step-2, then applies step-3 — the file changes on disk — and
   freezes with the receipt in hand, before publishing it (the commit point);
2. this script SIGSTOPs A: a frozen VM, a stuck process. Its lease stops being renewed;
3. worker B asks for the lease (LeaseHeld while A's lasts), gets epoch 2 when it lapses:
   taking it settles A's unpublished step-3 (the file gets its previous content back);
   then B runs the job's steps from the top: step-1 and step-2 are committed (deduped),
   step-3 runs again (attempt 2) and step-4 runs;
4. this script SIGCONTs A, which publishes its late receipt: refused with StaleEpoch,
   nothing of it lands.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ledger import LeaseHeld, Ledger, StaleEpoch, StepReader, Write, run_fenced_step

WORKSPACE = "shared"
STEPS = ["step-1", "step-2", "step-3", "step-4"]


def planner(step: str, worker: str):
    """A step's planner: append one line to notes.txt, fenced on what was read."""

    def plan(read: StepReader) -> list[Write]:
        notes = read.read("notes.txt")
        return [notes.write((notes.content or b"") + f"{step} by {worker}\n".encode())]

    return plan


def worker_a(url: str) -> int:
    with Ledger.open(url) as ledger:
        lease = ledger.workspaces.acquire(WORKSPACE, holder="worker-a", ttl_s=2)
        print(f"A: epoch {lease.epoch}", flush=True)
        for step in STEPS[:2]:
            out = run_fenced_step(ledger, WORKSPACE, step, planner(step, "worker-a"),
                                  epoch=lease.epoch)
            print(f"A: {step} {out.status}", flush=True)

        # step-3 the long way, as an executor that applies and reports back does:
        # plan (durable intent), apply (the files change), and only then publish.
        step = STEPS[2]
        got = ledger.workspaces.read_file(WORKSPACE, "notes.txt")
        ledger.workspaces.plan_step(step, workspace=WORKSPACE, epoch=lease.epoch,
                                    writes=[got.write(got.content + b"step-3 by worker-a\n")])
        receipt = ledger.workspaces.apply(step, epoch=lease.epoch).receipt
        print(f"A: {step} applied at rev {receipt.rev}, not published yet", flush=True)
        sys.stdin.readline()  # where A freezes (the orchestrator stops it here)

        try:  # A wakes up and reports its result: a late receipt of a dead epoch
            ledger.publish(step, receipt=receipt)
            print(f"A: {step} published (should not happen)", flush=True)
            return 1
        except StaleEpoch as exc:
            print(f"A: late receipt refused: StaleEpoch: {exc}", flush=True)
            return 0


def worker_b(url: str) -> int:
    with Ledger.open(url) as ledger:
        while True:  # A's lease is live until it lapses; nobody renews it now
            try:
                lease = ledger.workspaces.acquire(WORKSPACE, holder="worker-b", ttl_s=60)
                break
            except LeaseHeld as exc:
                print(f"B: waiting: {exc}", flush=True)
                time.sleep(1)
        print(f"B: epoch {lease.epoch}, settled {', '.join(lease.settled) or 'nothing'}",
              flush=True)
        for step in STEPS:  # the whole job again: the ledger knows what is done
            out = run_fenced_step(ledger, WORKSPACE, step, planner(step, "worker-b"),
                                  epoch=lease.epoch)
            print(f"B: {step} {out.status} (attempt {out.attempt})", flush=True)
            if not out.committed:
                return 1
        ledger.workspaces.release(WORKSPACE, lease.epoch)
        return 0


def orchestrate(url: str, workdir: Path) -> int:
    (workdir / "notes.txt").write_text("")
    with Ledger.init(url) as ledger:  # creates the tables, or opens the ledger there
        ledger.workspaces.add(WORKSPACE, workdir)
    me = [sys.executable, __file__, "--url", url, "--workdir", str(workdir)]

    a = subprocess.Popen([*me, "--role", "a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert a.stdout is not None and a.stdin is not None
    for line in a.stdout:  # until A has applied step-3
        print(line, end="", flush=True)
        if "not published yet" in line:
            break
    os.kill(a.pid, signal.SIGSTOP)
    print(f"-- worker A (pid {a.pid}) stopped; notes.txt now ends with: "
          f"{(workdir / 'notes.txt').read_text().splitlines()[-1]!r}", flush=True)

    b = subprocess.run([*me, "--role", "b"], check=False)
    os.kill(a.pid, signal.SIGCONT)
    print("-- worker A continued", flush=True)
    a.stdin.write("\n")
    a.stdin.close()
    for line in a.stdout:
        print(line, end="", flush=True)
    a_code = a.wait()

    with Ledger.open(url) as ledger:
        ok = ledger.verify().ok
    print("notes.txt:\n" + (workdir / "notes.txt").read_text(), end="")
    print(f"verify {'ok' if ok else 'FAILED'}")
    return 0 if ok and a_code == 0 and b.returncode == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("STEPTRAIL_LEDGER"),
                        help="the ledger's postgresql:// URL (default: $STEPTRAIL_LEDGER)")
    parser.add_argument("--url", dest="url_opt", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help="the workspace directory (default: a new"
                        " temporary one)")
    parser.add_argument("--role", choices=["a", "b"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.url_opt or args.url
    if not url:
        parser.error("give the ledger's URL, or set STEPTRAIL_LEDGER")
    if args.role == "a":
        return worker_a(url)
    if args.role == "b":
        return worker_b(url)
    if args.workdir is not None:  # the caller's directory: kept, as given
        args.workdir.mkdir(parents=True, exist_ok=True)
        print(f"workspace {WORKSPACE!r} at {args.workdir}", flush=True)
        return orchestrate(url, args.workdir)
    # a temporary one of our own: removed when the demonstration ends, however it ends
    with tempfile.TemporaryDirectory(prefix="steptrail-shared-") as tmp:
        print(f"workspace {WORKSPACE!r} at {tmp} (removed at the end; --workdir DIR keeps"
              " one)", flush=True)
        return orchestrate(url, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())

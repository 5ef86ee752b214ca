"""An agent loop that survives being killed: N fenced edits to a small project.

    python examples/agent_loop.py DIR [--edits N] [--pause-at K]

Each edit is one step, `edit-<i>`, that appends a line to DIR/CHANGELOG.md and writes the
version into DIR/VERSION: an edit done twice would show as a repeated line, a lost one as
a missing line. The ledger lives inside the project (DIR/.steptrail/ledger.db, like .git).

Kill the process at any moment (SIGKILL, a reclaimed sandbox) and run the same command
again: it takes a new lease (which puts back whatever the dead run left half done), then
walks the same list of steps. Steps the ledger calls committed are answered from the
ledger ("deduped": the planner is not called again); the rest run. `--pause-at K` stops
the process for good once edit K's plan is durable, before it touches a file: a known
point to kill it at (tests/docs/test_examples.py does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ledger import Ledger, StepReader, Write, run_fenced_step

WORKSPACE = "project"  # the name the ledger knows the directory by
HOLDER = "agent-loop"  # who holds the lease: this script, whichever run of it


def edit(i: int):
    """The planner of edit i: read through the ledger, return the writes.

    The reads are what the writes are fenced on: if a person changes CHANGELOG.md between
    this read and the apply, the step is refused with a diff (CONFLICT), never applied
    over their change."""

    def plan(read: StepReader) -> list[Write]:
        log = read.read("CHANGELOG.md")
        version = read.read("VERSION")
        return [log.write(log.content + f"- edit {i}: bumped to 0.{i}\n".encode()),
                version.write(f"0.{i}\n".encode())]

    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path, help="the project directory (made if missing)")
    parser.add_argument("--edits", type=int, default=5, help="how many edits (default 5)")
    parser.add_argument("--pause-at", type=int, metavar="K",
                        help="stop forever once edit K is planned (a point to kill at)")
    args = parser.parse_args()

    # The project the agent edits. Plain files: the ledger records nothing about them
    # until a step writes them.
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, content in {"CHANGELOG.md": "# Changelog\n", "VERSION": "0.0\n"}.items():
        if not (args.dir / name).exists():
            (args.dir / name).write_text(content)

    # `init` creates the ledger or opens the one a previous run made; `add` of the same
    # name and directory again is a no-op.
    with Ledger.init(args.dir / ".steptrail" / "ledger.db") as ledger:
        ledger.workspaces.add(WORKSPACE, args.dir)

        # A lease on the workspace: every write carries its epoch, and a new epoch refuses
        # the old one's writes. A live lease held by HOLDER can only be a run of this
        # script that died (it is the one agent of this project), so take it over (force).
        # The new epoch first settles the dead run's unfinished step: a file it already
        # wrote gets its previous content back.
        held = ledger.workspaces.lease(WORKSPACE)
        if held.live and held.holder != HOLDER:
            print(f"the workspace is leased to {held.holder}; not taking it over", file=sys.stderr)
            return 1
        lease = ledger.workspaces.acquire(WORKSPACE, holder=HOLDER, ttl_s=600, force=True)
        print(f"epoch {lease.epoch}" + (f" (settled: {', '.join(lease.settled)})"
                                         if lease.settled else ""), flush=True)

        def on_planned(step: str) -> None:  # called once the step's plan is durable
            if step == f"edit-{args.pause_at}":
                print(f"paused in {step} pid={os.getpid()}", flush=True)
                while True:  # wait to be killed
                    time.sleep(3600)

        # The loop: the same step ids, in the same order, on every run.
        for i in range(1, args.edits + 1):
            out = run_fenced_step(ledger, WORKSPACE, f"edit-{i}", edit(i), epoch=lease.epoch,
                                  run="agent-loop", on_planned=on_planned)
            print(f"{out.step} {out.status} (attempt {out.attempt})", flush=True)
            if not out.committed:  # CONFLICT (a person's edit), STALE_EPOCH (taken over)
                print(out.detail or "\n".join(c.diff for c in out.conflicts), file=sys.stderr)
                return 1

        ledger.workspaces.release(WORKSPACE, lease.epoch)
        report = ledger.verify()  # the hash chain, the projections, the fences, the blobs
        print("done; verify", "ok" if report.ok else "FAILED", flush=True)
        return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""An agent's steps and a person's edits between them, all in one history.

    python examples/outside_edits.py DIR

The agent makes three fenced edits to DIR/app.py. Between them a person edits
DIR/README.md with `sed -i` and deletes DIR/notes.txt with `rm` — edits no step made.
`observe` records them (who asked, what changed), so the workspace's history holds every
edit: the script prints it, undoes the person's edit (putting back what the ledger knew
before it, while their bytes stay in the ledger), and restores the whole workspace into
DIR-restored, equal to DIR (a restore makes its directory the workspace's from then on:
`steptrail restore --help`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ledger import Ledger, StepReader, Write, run_fenced_step


def bump(i: int):
    def plan(read: StepReader) -> list[Write]:
        return [read.read("app.py").write(f'print("v{i}")\n'.encode())]
    return plan


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("project")
    root.mkdir(parents=True)
    (root / "app.py").write_text('print("v0")\n')
    (root / "README.md").write_text("hello\n")
    (root / "notes.txt").write_text("todo\n")
    with Ledger.init(root / ".steptrail" / "ledger.db") as ledger:
        ledger.workspaces.add("project", root)
        first = ledger.workspaces.observe("project", by="example", label="before the agent")
        print(f"baseline: {len(first.changes)} files")                    # baseline: 3 files
        for i in (1, 2, 3):
            lease = ledger.workspaces.acquire("project", holder="agent", ttl_s=600)
            run_fenced_step(ledger, "project", f"edit-{i}", bump(i),
                            epoch=lease.epoch).raise_for_status()
            ledger.workspaces.release("project", lease.epoch)
            if i == 1:  # a person, by hand, between the agent's steps
                subprocess.run(["sed", "-i", "s/hello/hello, world/", str(root / "README.md")],
                               check=True)
                subprocess.run(["rm", str(root / "notes.txt")], check=True)
                seen = ledger.workspaces.observe("project", by="person:alice")
                print("observed:", ", ".join(f"{c.kind} {c.path}" for c in seen.changes))
        person_step = seen.steps[0]

        print("history:")
        for row in ledger.steps():
            writes = [w.path for e in ledger.read(step=row.step_id, kind="fenced")
                      for w in e.event.writes]
            print(f"  {row.step_id[:24]:24}  {row.run or '-':8}  {', '.join(writes)}")

        lease = ledger.workspaces.acquire("project", holder="alice", ttl_s=600)
        undone = ledger.workspaces.compensate(person_step, epoch=lease.epoch,
                                              reason="not what I meant")
        ledger.workspaces.release("project", lease.epoch)
        print("undone:", ", ".join(f"{r.path} {r.outcome}" for r in undone.restored))
        print((root / "README.md").read_text(), end="")                  # hello
        print((root / "notes.txt").read_text(), end="")                  # todo

        again = root.with_name(root.name + "-restored")
        ledger.workspaces.restore("project", again)
        same = all((again / p).read_bytes() == (root / p).read_bytes()
                   for p in ("app.py", "README.md", "notes.txt"))
        print("restored equal:", same)                                    # restored equal: True
        assert ledger.verify().ok
    return 0


if __name__ == "__main__":
    sys.exit(main())

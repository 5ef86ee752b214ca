"""The workspace protocol: a step's writes to a directory, fenced, journaled, undoable.

Users reach it as one object, ``ledger.workspaces`` (a `Workspaces`):

    with Ledger.init("ws/.steptrail/ledger.db") as led:
        led.workspaces.add("w", "ws")
        lease = led.workspaces.acquire("w", "agent-1", ttl_s=60)
        led.workspaces.admit("w", lease.epoch, [StepPlan("s1", [Write("a.txt", b"hi", None)])])
        led.workspaces.apply("s1", epoch=lease.epoch, commit=True)

The modules, from the top down:

- `protocol` — `Workspaces`: registration, epoch leases, plan/admit/apply,
  compensation, settling, reads (`read_file`, `snapshot`), `restore`, `confined`; and
  the values it takes and answers (`Write`, `StepPlan`, `Lease`, `ApplyResult`, …).
- `restore` — a workspace's committed content written to a new directory.
- `confined` — `Confined`: a workspace directory as a tool lists, walks, searches and
  ``mkdir -p``-s it under the protocol's boundary (the MCP file tools use it).
- `directory` — `WorkspaceDir`: the one walk from the root (no symlink followed, the
  ledger's own files out of reach), staging, exchange-and-verify landing, slots.
- `exchange` — the atomic rename-exchange system call and its fallbacks.
- `core` — `Core`: what the protocol is handed of a ledger (log, storage, clock,
  options, the append guard, the boundary), never the `Ledger` itself.

Nothing here imports `ledger.ledger`: the dependency points one way.
"""

from .confined import Confined, Entry, FsRefused, Walk, glob_match
from .directory import LEDGER_DIR_NAME, Boundary, WorkspaceDir, is_git_name, is_ledger_dir_name
from .protocol import (
    ApplyResult,
    Compensation,
    FileRead,
    KeptFile,
    Lease,
    Receipt,
    SettleConflict,
    StepPlan,
    Workspaces,
    Write,
    settle_conflicts,
)
from .restore import RestoreReport

__all__ = [
    "ApplyResult", "Boundary", "Compensation", "Confined", "Entry", "FileRead", "FsRefused",
    "KeptFile",
    "Lease", "Receipt", "RestoreReport", "SettleConflict", "StepPlan", "Walk", "Workspaces",
    "WorkspaceDir", "Write", "glob_match", "settle_conflicts", "LEDGER_DIR_NAME", "is_git_name",
    "is_ledger_dir_name",
]

"""Places on disk and their rules: where workspaces live, how a step's bytes reach
them, how they are walked and restored. The step's lifecycle that uses them is
`ledger.step`; users reach both as ``ledger.workspaces`` (`ledger.workspaces.Workspaces`).

The modules, from the top down:

- `places` — `Places`: registration (a directory recorded with its device and inode),
  the ledger where it was registered, the confined way in (`wsdir`), a planner's reads,
  the files kept under a visible name, `restore`.
- `leases` — `Leases`: epochs begun, renewed, released; the live epoch checked; the
  steps an older epoch left in flight; one workspace's threads in turn.
- `restore` — a workspace's committed content written to a new directory.
- `confined` — `Confined`: a workspace directory as a tool lists, walks, searches and
  ``mkdir -p``-s it under the same boundary (the MCP file tools use it).
- `directory` — `WorkspaceDir`: the one walk from the root (no symlink followed, the
  ledger's own files out of reach), staging, exchange-and-verify landing, slots.
- `moves` — the one verified primitive every byte move goes through.
- `exchange` — the atomic rename-exchange system call and its fallbacks.
- `place` — where the ledger itself is (a copied or moved project).
- `core` — `Core`: what is handed down of a ledger (log, storage, clock, options, the
  append guard, the boundary), never the `Ledger` itself.

Nothing here imports `ledger.ledger` or `ledger.step`: the dependency points one way.
"""

from .confined import Confined, Entry, FsRefused, Walk, glob_match
from .boundary import LEDGER_DIR_NAME, Boundary, is_git_name, is_ledger_dir_name
from .directory import WorkspaceDir
from .restore import RestoreReport

#: Names this package exported before the step's lifecycle moved to `ledger.step`,
#: kept for their importers (each is also exported from `ledger`): imported on first use.
_MOVED = {
    "Workspaces": "ledger.workspaces",
    **{name: "ledger.step.values" for name in (
        "ApplyResult", "Compensation", "FileRead", "KeptFile", "Lease", "Receipt",
        "SettleConflict", "StepPlan", "Write", "settle_conflicts")},
}


def __getattr__(name: str) -> object:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module 'ledger.workspace' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "Boundary", "Confined", "Entry", "FsRefused", "RestoreReport", "Walk", "WorkspaceDir",
    "glob_match", "LEDGER_DIR_NAME", "is_git_name", "is_ledger_dir_name",
]

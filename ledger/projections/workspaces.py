"""Workspaces: revisions, per-path revisions and hashes, and the lease — as a fold.

A workspace's monotonic `rev` grows by one per applied write (and per path a
compensation puts back); each path remembers the rev of its last applied write and
the hash of the content that write left. The lease is the live epoch, its holder
and its expiry. All of it is derived from events (`workspace-added`, `lease-*`,
`fenced`, `compensated`) and written inline with them, so the fence, the epoch
check and the journal key commit in one transaction.

`validate` raises before anything changes; `apply` changes the fold. The inline
writer calls them per event (validate, then — if the event is inserted — apply),
`rebuild` and `catch_up` over the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from ..errors import IllegalWorkspaceTransition
from ..store import EventReader
from ..store.rows import PathState, WsRow  # the workspace table's row lives with the stores
from ..events import (
    Compensated,
    Fenced,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    WorkspaceAdded,
    WorkspaceRebound,
    WorkspaceRestored,
    decode,
    journal_key,
    kinds_folded_by,
)

KINDS: Final = kinds_folded_by("workspaces")
#: The events that say where a workspace lives and what it may write; the newest wins.
REGISTRATION_KINDS: Final = ("workspace-added", "workspace-restored", "workspace-rebound")


class WorkspacesFold:
    """Workspace rows and path states, loaded lazily (through `loader`, `path_loader`:
    the store's current rows) and folded; a pure function of the events and those rows.

    Without loaders it folds from nothing (rebuild, verify, read-only lag).
    """

    def __init__(self, loader: Callable[[str], WsRow | None] | None = None,
                 path_loader: Callable[[str, str], PathState | None] | None = None) -> None:
        self.loader, self.path_loader = loader, path_loader
        self.rows: dict[str, WsRow | None] = {}
        self.paths: dict[tuple[str, str], PathState | None] = {}
        self.dirty_rows: set[str] = set()
        self.dirty_paths: set[tuple[str, str]] = set()

    # -- state ---------------------------------------------------------------------------

    def row(self, name: str) -> WsRow | None:
        if name not in self.rows:
            self.rows[name] = None if self.loader is None else self.loader(name)
        return self.rows[name]

    def path(self, workspace: str, path: str) -> PathState | None:
        key = (workspace, path)
        if key not in self.paths:
            self.paths[key] = None if self.path_loader is None else self.path_loader(workspace, path)
        return self.paths[key]

    def path_rev(self, workspace: str, path: str) -> int:
        state = self.path(workspace, path)
        return 0 if state is None else state[0]

    # -- the fold --------------------------------------------------------------------------

    def validate(self, event: object, time_ns: int) -> None:
        """Raise IllegalWorkspaceTransition unless `event` follows; change nothing."""
        kind = type(event).__struct_config__.tag  # type: ignore[attr-defined]
        if kind not in KINDS:
            return
        name = getattr(event, "workspace", "")
        if not name:
            return  # a step with no workspace (artifact-only)
        row = self.row(name)

        def refuse(why: str) -> None:
            raise IllegalWorkspaceTransition(name, kind, why)

        if isinstance(event, WorkspaceAdded):
            if row is not None:
                refuse(f"it was already added with root {row.root!r}" if row.root else
                       "the name is a bare lease's (no directory: a LangGraph thread's claim)")
            return
        if isinstance(event, LeaseAcquired) and event.bare:
            if row is not None:
                refuse("a bare lease makes its name, and this one exists already")
            row = WsRow(name=name, root="")  # what `apply` will make: no lease yet
        if row is None:
            refuse("the workspace was never added")
        assert row is not None
        if isinstance(event, LeaseAcquired):
            if event.epoch != row.epoch + 1:
                refuse(f"the next epoch is {row.epoch + 1}")
            live = row.live_epoch(time_ns)
            if live is not None and not event.forced:
                refuse(f"epoch {live} held by {row.holder!r} is live")
            if event.expires_ns <= time_ns:
                refuse("the lease would expire before it starts")
        elif isinstance(event, LeaseRenewed):
            if event.epoch != row.live_epoch(time_ns):
                refuse(f"epoch {event.epoch} is not live; an expired lease is never revived")
            if event.expires_ns < row.expires_ns:
                refuse("a heartbeat only extends a lease")
        elif isinstance(event, LeaseReleased):
            if event.epoch != row.epoch or row.released:
                refuse(f"epoch {event.epoch} is not the latest unreleased lease")
        elif isinstance(event, Fenced):
            if event.rev != row.rev + len(event.writes):
                refuse(f"the workspace is at rev {row.rev}; {len(event.writes)} writes end at"
                       f" {row.rev + len(event.writes)}, not {event.rev}")
            for i, w in enumerate(event.writes, 1):
                if w.rev != row.rev + i:
                    refuse(f"write {w.path!r} must get rev {row.rev + i}")
        elif isinstance(event, Compensated):
            moved = [r for r in event.restored if r.outcome != "conflict"]
            if moved and event.rev != row.rev + len(moved):
                refuse(f"the workspace is at rev {row.rev}; {len(moved)} restores end at"
                       f" {row.rev + len(moved)}, not {event.rev}")
            for i, r in enumerate(moved, 1):
                if r.rev != row.rev + i:
                    refuse(f"restore of {r.path!r} must get rev {row.rev + i}")

    def apply(self, event: object, seq: int, time_ns: int) -> None:
        kind = type(event).__struct_config__.tag  # type: ignore[attr-defined]
        if kind not in KINDS:
            return
        name = getattr(event, "workspace", "")
        if not name:
            return
        if isinstance(event, WorkspaceAdded):
            self.rows[name] = WsRow(name=name, root=event.root, last_seq=seq)
            self.dirty_rows.add(name)
            return
        row = self.row(name)
        if row is None and isinstance(event, LeaseAcquired) and event.bare:
            # a bare lease: the name's row, with no directory (root "")
            row = self.rows[name] = WsRow(name=name, root="")
        if row is None:  # validated before; a fold over a damaged log skips it
            return
        if isinstance(event, WorkspaceRestored | WorkspaceRebound):
            row.root = event.root  # materialized or re-registered: steps write there now
        elif isinstance(event, LeaseAcquired):
            row.epoch, row.holder, row.expires_ns = event.epoch, event.holder, event.expires_ns
            row.released, row.acquired_ns = False, time_ns
        elif isinstance(event, LeaseRenewed):
            row.expires_ns = event.expires_ns
        elif isinstance(event, LeaseReleased):
            row.released = True
        elif isinstance(event, Fenced):
            for w in event.writes:
                self._set_path(name, w.path, (w.rev, w.post_hash, seq))
            row.rev = max(row.rev, event.rev)
        elif isinstance(event, Compensated):
            for r in event.restored:
                if r.outcome != "conflict":
                    self._set_path(name, r.path, (r.rev, r.digest, seq))
            row.rev = max(row.rev, event.rev)
        row.last_seq = seq
        self.dirty_rows.add(name)

    def _set_path(self, workspace: str, path: str, state: PathState) -> None:
        self.paths[(workspace, path)] = state
        self.dirty_paths.add((workspace, path))

    # -- tables --------------------------------------------------------------------------

    def changes(self) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        """The rows and paths this fold changed since the last call (as table rows, in
        key order), for the store to write."""
        if not self.dirty_rows and not self.dirty_paths:
            return [], []  # (most appends: no workspace event)
        rows = [r.as_tuple() for n in sorted(self.dirty_rows) if (r := self.rows[n]) is not None]
        paths = [(ws, p, *s) for (ws, p) in sorted(self.dirty_paths)
                 if (s := self.paths[(ws, p)]) is not None]
        self.dirty_rows.clear()
        self.dirty_paths.clear()
        return rows, paths

    def table_rows(self) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        """This fold's content in the tables' canonical order (for comparison)."""
        rows = sorted(r.as_tuple() for r in self.rows.values() if r is not None)
        paths = sorted((ws, p, *s) for (ws, p), s in self.paths.items() if s is not None)
        return rows, paths  # type: ignore[return-value]


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """Where a workspace lives and what it may write, as its newest registration event
    (`workspace-added`, `-restored` or `-rebound`) recorded it. `dev`/`ino` None: a
    registration written before identities were recorded (no identity to check).
    `ledger_dir`/`ledger_dev`/`ledger_ino`: where the ledger itself was then (None: a
    ledger in a database, or a registration written before it was recorded)."""

    root: str
    dev: int | None
    ino: int | None
    allow_git: bool
    seq: int
    ledger_dir: str | None = None
    ledger_dev: int | None = None
    ledger_ino: int | None = None

    @property
    def identity(self) -> tuple[int, int] | None:
        return None if self.dev is None or self.ino is None else (self.dev, self.ino)

    @property
    def ledger_place(self) -> tuple[str, int, int] | None:
        """(real path, device, inode) of the ledger's directory when this registration
        was recorded; None when it was not."""
        if self.ledger_dir is None or self.ledger_dev is None or self.ledger_ino is None:
            return None
        return (self.ledger_dir, self.ledger_dev, self.ledger_ino)


def load_registration(view: EventReader, name: str) -> Registration | None:
    """The workspace's newest registration event, read from the log by its journal keys
    (an index seek per kind: `["workspace-added", name]` and the newest key extending
    `["workspace-restored", name, ...]` / `["workspace-rebound", name, ...]`); None
    when it was never added."""
    added = journal_key(WorkspaceAdded(workspace=name, root="/"))  # ["workspace-added", name]
    rows = [row for row in [view.journal_lookup(added)] if row is not None]
    for kind in REGISTRATION_KINDS[1:]:
        # every key extending [kind, name]: its "," then the extras
        prefix = added.replace('"workspace-added"', msgspec.json.encode(kind).decode(), 1)[:-1]
        row = view.journal_newest(prefix + ",")
        if row is not None:
            rows.append(row)
    best = max(rows, default=None, key=lambda r: int(r.seq))
    if best is None:
        return None
    event = decode(bytes(best.payload), int(best.v))
    if not isinstance(event, WorkspaceAdded | WorkspaceRestored | WorkspaceRebound):
        raise TypeError(f"event #{best.seq} under a workspace registration key is a"
                        f" {type(event).__name__}")
    return Registration(root=event.root, dev=event.dev, ino=event.ino,
                        allow_git=event.allow_git, seq=int(best[0]),
                        ledger_dir=event.ledger_dir, ledger_dev=event.ledger_dev,
                        ledger_ino=event.ledger_ino)


Loader = Callable[[str], WsRow | None]

__all__ = [
    "KINDS",
    "IllegalWorkspaceTransition",
    "PathState",
    "REGISTRATION_KINDS",
    "Registration",
    "WorkspacesFold",
    "WsRow",
    "load_registration",
]

"""Restore: materialize a workspace's committed content on a fresh directory.

The literal "outlive the machine": every path the ledger knows at its committed content
— its newest committed change by revision: the post-image of a write whose attempt
published a manifest (then or later), or the pre-image a compensation put back — each a
blob a manifest or a compensation record references (invariant I9), verified by hash as
it is written. Revision order, not publish order: an attempt retried to its publish
after a newer step wrote the same path does not bring its older bytes back. A
`workspace-restored` event records the new root with its device and inode, and where the
ledger itself is (see `ledger.workspace.place`); steps write there from then on. The target is never the ledger's own directory nor inside another
workspace. Files steptrail never wrote (untracked) are not in the ledger and are not
restored. Each file gets the mode the ledger recorded for it (events written before
modes were: 0o666 less the umask).

The target must be new or empty — or hold nothing but part of the committed content
(a restore that was killed, midway or before its event): then the retry goes on where
it stopped, removes the dead one's temporaries, and records the restore.

`restore` works through the workspace protocol (`Workspaces`, seen as `RestoreSource`:
what it uses of it) and the ledger's `Core` it holds: the log and one read view of the
storage, never the `Ledger` (this module imports neither; `ledger.workspaces.restore`
calls in).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Protocol

import msgspec

from ..errors import InvalidInput, LeaseHeld, LedgerError, PathEscapes
from ..events import (
    Compensated,
    Fenced,
    ManifestPublished,
    WorkspaceRestored,
    check_step_id,
)
from ..log import EventLog
from ..projections.workspaces import Registration, WsRow
from ..store import Scope, Store
from .core import Core
from . import staging
from .boundary import FileIdentity, identity_of
from .directory import WorkspaceDir
from .names import temp_stamp


class RestoreSource(Protocol):
    """What `restore` uses of the workspace protocol (`Workspaces`)."""

    core: Core

    def get(self, name: str) -> WsRow: ...
    def registration(self, name: str) -> Registration: ...
    def check_root(self, name: str, real: str, ident: FileIdentity | None) -> None: ...

#: One committed change of a path: (its workspace rev, digest or None for absent, mode).
_Change = tuple[int, str | None, int | None]


class CommittedFold:
    """Per (workspace, path): the digest of its committed content (None: absent) and
    the mode recorded with it (`mode`; None: not recorded).

    A path's committed content is its highest-rev committed change, whatever order the
    events that commit them come in: the post-image of a write whose attempt published a
    manifest (then or later — a retry may publish an attempt after a newer step wrote the
    same path), or the pre-image a compensation put back (never a ``conflict``, which
    left the path as found). Revs are the workspace's, so this is the order the changes
    were applied in — the order the workspace projection's path hashes follow: once no
    attempt is in flight, and nothing but steps changed the files, the two agree.
    Writes of an attempt that never publishes (compensated, or still in flight) never
    count; a rejected attempt has no applied writes (its `undone` puts back writes no
    `fenced` recorded, leaving the path's rev alone)."""

    def __init__(self) -> None:
        #: (step, attempt) -> (workspace, path) -> (rev, post-image digest, its mode)
        self.pending: dict[tuple[str, int], dict[tuple[str, str], _Change]] = {}
        #: (workspace, path) -> its highest-rev committed change
        self.changes: dict[tuple[str, str], _Change] = {}

    def feed(self, event: object) -> None:
        if isinstance(event, Fenced) and event.workspace:
            writes = self.pending.setdefault((event.step, event.attempt), {})
            for w in event.writes:
                writes[(event.workspace, w.path)] = (w.rev, w.post_hash, w.post_mode)
        elif isinstance(event, ManifestPublished):
            for key, change in self.pending.pop((event.step, event.attempt), {}).items():
                self._commit(key, change)
        elif isinstance(event, Compensated):
            self.pending.pop((event.step, event.attempt), None)
            for r in event.restored:
                if r.outcome != "conflict":
                    self._commit((event.workspace, r.path), (r.rev, r.digest, r.mode))

    def _commit(self, key: tuple[str, str], change: _Change) -> None:
        held = self.changes.get(key)
        if held is None or change[0] > held[0]:
            self.changes[key] = change

    @property
    def committed(self) -> dict[tuple[str, str], str | None]:
        """(workspace, path) -> the digest of its committed content (None: absent)."""
        return {key: change[1] for key, change in self.changes.items()}

    def mode(self, workspace: str, path: str) -> int | None:
        """The mode recorded with the path's committed content (None: not recorded)."""
        change = self.changes.get((workspace, path))
        return None if change is None else change[2]

    def paths(self, workspace: str) -> dict[str, str | None]:
        return {p: c[1] for (w, p), c in sorted(self.changes.items()) if w == workspace}


class RestoreReport(msgspec.Struct, kw_only=True):
    """What a restore wrote: `paths` files (`bytes` in all) and `absent` paths left out
    (committed as deleted) under `root`, the workspace at `rev`; `seq`: its
    `workspace-restored` event (`deduped`: the journal answered, nothing was recorded)."""

    workspace: str
    root: str
    paths: int
    absent: int
    bytes: int
    rev: int
    seq: int
    deduped: bool = False
    #: with `replace`: the files that held other bytes at a restored path, each kept
    #: beside it under a visible name (``NAME.steptrail-kept-TAG``), never removed
    kept: list[str] = msgspec.field(default_factory=list)


class Events(Protocol):
    """Where the events are: a `Ledger`, or its `Core`."""

    @property
    def storage(self) -> Store: ...
    @property
    def log(self) -> EventLog: ...


def _committed_fold(source: Events) -> CommittedFold:
    """The whole log folded, in one consistent snapshot of the storage."""
    fold = CommittedFold()
    with source.storage.read():
        for recorded in source.log.read():
            fold.feed(recorded.event)
    return fold


def committed_content(source: Events, workspace: str) -> dict[str, str | None]:
    """Each path the ledger (or its `Core`) knows in `workspace` -> the digest of its
    committed content."""
    return _committed_fold(source).paths(workspace)


def _own_partial(workspace: str, target: str, content: dict[str, str | None],
                 ledger_dir: str | None = None) -> set[str] | None:
    """What `target` holds when it is nothing but (part of) the committed content: files
    at committed paths with their committed bytes, the directories above them, and the
    temporaries a restore stages (returned: the directories holding those) — and the
    ledger's own directory (`ledger_dir`, real path) when it is right inside: a backup
    restored into ``fresh/.steptrail``, then its workspace restored into ``fresh``. None
    when it holds anything else — a file the ledger did not commit there, other bytes, a
    symlink: not a restore's output, never written into. A missing target: empty."""
    if not os.path.lexists(target):
        return set()
    if os.path.islink(target) or not os.path.isdir(target):
        return None
    present = {p: d for p, d in content.items() if d is not None}
    above = {p.rsplit("/", i)[0] for p in present for i in range(1, p.count("/") + 1)}
    out = WorkspaceDir(workspace, target)
    temps: set[str] = set()
    for top, dirs, files in os.walk(target):
        rel = os.path.relpath(top, target)
        rel = "" if rel == "." else rel + "/"
        if not rel and ledger_dir is not None:
            dirs[:] = [d for d in dirs if os.path.islink(os.path.join(top, d))
                       or os.path.realpath(os.path.join(top, d)) != ledger_dir]
        for name in dirs:
            if os.path.islink(os.path.join(top, name)) or rel + name not in above:
                return None
        for name in files:
            path = rel + name
            if os.path.islink(os.path.join(top, name)):
                return None  # restore writes no symlinks
            stamp = temp_stamp(name)
            if stamp is not None and stamp[0] == 0:  # staged by a restore (epoch 0)
                temps.add(rel.rstrip("/"))
                continue
            try:
                if path not in present or out.hash(path) != present[path]:
                    return None
            except (LedgerError, OSError):
                return None
    return temps


def _check_target(target: str, to: object) -> None:
    """The nearest existing ancestor of `target` must be a directory (a regular file
    there is bad input, not an environment failure); refused before anything is read."""
    parent = os.path.dirname(target)
    while parent and not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if parent and os.path.lexists(parent) and not os.path.isdir(parent):
        raise InvalidInput(f"restore target {to} is below {parent}, which is not a directory;"
                           " give a new or empty directory")
    for part in target.split(os.sep):
        if len(os.fsencode(part)) > 255:
            raise InvalidInput(f"restore target {str(to)[:80]!r}… has a component longer than"
                               " 255 bytes; give a shorter path")


def restore(workspaces: RestoreSource, workspace: str, to: str | os.PathLike[str], *,
            force: bool = False, replace: bool = False) -> RestoreReport:
    """Write the workspace's committed content under `to` (new or empty) and record it.

    Every blob is checked (present, size, hash) before the first file is written; a
    missing one raises BlobNotFound and nothing is written. `replace`: `to` may hold
    anything — each committed path is written there, and a file holding other bytes at
    it is first kept under a visible name beside it (`RestoreReport.kept`; files the
    ledger does not know are left alone). Refused while a lease is
    live (its holder may still write to the old directory) unless `force`: take a new
    epoch right after (`acquire(..., force=True)`), which settles the old one's
    attempts against the restored files.
    """
    check_step_id(workspace)
    core = workspaces.core
    row = workspaces.get(workspace)
    reg = workspaces.registration(workspace)
    target = os.path.realpath(os.fspath(to))
    fold = _committed_fold(core)
    content = fold.paths(workspace)
    here = core.own.place()  # where the ledger is
    own = None if here is None else os.path.realpath(here[0])
    # a killed restore's output: resumed; the ledger's own directory inside: allowed
    temps = _own_partial(workspace, target, content, own)
    if temps is None and replace:  # over whatever is there, through the verified moves
        temps = set()
    if temps is None:  # (bad input is said first, before the lease's state)
        raise InvalidInput(f"restore target {to} exists and is not an empty directory"
                           " (nor one holding only this ledger's own directory);"
                           " give a new or empty directory (nothing was written)")
    _check_target(target, to)
    if row.live_epoch(core.clock()) is not None and not force:
        raise LeaseHeld(workspace, row.epoch, row.holder, row.expires_ns)
    # never into the ledger's own directory or another workspace (by path and by the
    # identity of whatever exists of it); checked again once it exists
    workspaces.check_root(workspace, target, None)
    sizes: dict[str, int] = {}  # every blob read through (hashed) once, in bounded pieces
    for path, digest in content.items():
        if digest is not None and digest not in sizes:
            sizes[digest] = sum(len(c) for c in core.blob_chunks(digest))
    try:
        os.makedirs(target, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise InvalidInput(f"restore target {to} cannot be created ({exc.strerror}); give a"
                           " new or empty directory") from None
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
            raise
        raise InvalidInput(f"restore target {to} cannot be created ({exc.strerror}); give a"
                           " shorter path to a new or empty directory") from None
    st = os.stat(target)
    workspaces.check_root(workspace, target, identity_of(st))
    out = WorkspaceDir(workspace, target, core.storage.files.ops, identity=identity_of(st),
                       boundary=core.own.boundary(), allow_git=reg.allow_git)
    staging.remove_temporaries(out, temps, lambda epoch, _tag: epoch == 0,
                               held=lambda digest: core.blob_size(digest) is not None)
    written = absent = size = 0
    for path, digest in content.items():
        if digest is None:
            absent += 1
            continue
        try:
            # copied piece by piece, checked again
            if replace and out.hash(path) == digest:
                written += 1  # already these bytes: nothing to move
                size += sizes[digest]
                continue
            staging.put(out, path, core.blob_chunks(digest), mode=fold.mode(workspace, path),
                        replace=replace)
        except PathEscapes as exc:
            # the path is the ledger's, not the caller's to change: what is in the target's
            # way (a symlink, a file where a directory goes) is what to move
            raise InvalidInput(
                f"restore target {to}: {path} cannot be written there ({exc.why}); nothing"
                " is written through a symlink or over a directory: move that entry away,"
                " then run again (what was restored so far stays)") from None
        written += 1
        size += sizes[digest]
    for path, digest in content.items():  # read back: what is on disk is what was committed
        try:
            found = out.hash(path)
        except PathEscapes:
            # not a regular file there (a directory now stands where a deleted file was,
            # or a deleted directory's name is a file now): no file's bytes, as for absent
            found = None
        if found != digest:
            raise InvalidInput(f"restored {path} does not read back as {digest}; check {target}")
    event = WorkspaceRestored(workspace=workspace, root=target, rev=row.rev, paths=written,
                              dev=st.st_dev, ino=st.st_ino, allow_git=reg.allow_git,
                              ledger_dir=None if here is None else here[0],
                              ledger_dev=None if here is None else here[1],
                              ledger_ino=None if here is None else here[2])

    def build(_tx: Any, _now: int) -> list[Any]:
        # The root checked again under the write lock of the whole ledger: a workspace
        # added meanwhile inside (or around) the target is refused, not registered beside.
        workspaces.check_root(workspace, target, identity_of(st))
        return [event]

    recorded = core.log.append(build, guard=core.guard(), scope=Scope())[0]
    return RestoreReport(workspace=workspace, root=target, paths=written, absent=absent,
                         bytes=size, rev=row.rev, seq=recorded.seq, deduped=recorded.deduped,
                         kept=[os.path.join(p.rpartition("/")[0], k) if "/" in p else k
                               for p, k in out.kept])


__all__ = ["CommittedFold", "Events", "RestoreReport", "committed_content", "restore"]

"""Restore: materialize a workspace's committed content on a fresh directory.

The literal "outlive the machine": every path the ledger knows at its committed content
— the post-image of its last committed write (its step published a manifest), or the
pre-image a compensation put back — each a blob a manifest or a compensation record
references (invariant I9), verified by hash as it is written. A `workspace-restored`
event records the new root with its device and inode; steps write there from then on.
The target is never the ledger's own directory nor inside another workspace. Files stepledger never
wrote (untracked) are not in the ledger and are not restored.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import msgspec

from .errors import InvalidInput, LeaseHeld
from .events import (
    Compensated,
    Fenced,
    ManifestPublished,
    WorkspaceRestored,
    check_step_id,
)
from .workspace import WorkspaceDir, identity_of

if TYPE_CHECKING:
    from .ledger import Ledger


class CommittedFold:
    """Per (workspace, path): the digest of its committed content (None: absent)."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], dict[tuple[str, str], str | None]] = {}
        self.committed: dict[tuple[str, str], str | None] = {}

    def feed(self, event: object) -> None:
        if isinstance(event, Fenced) and event.workspace:
            writes = self.pending.setdefault((event.step, event.attempt), {})
            for w in event.writes:
                writes[(event.workspace, w.path)] = w.post_hash
        elif isinstance(event, ManifestPublished):
            self.committed.update(self.pending.pop((event.step, event.attempt), {}))
        elif isinstance(event, Compensated):
            self.pending.pop((event.step, event.attempt), None)
            for r in event.restored:
                if r.outcome != "conflict":
                    self.committed[(event.workspace, r.path)] = r.digest

    def paths(self, workspace: str) -> dict[str, str | None]:
        return {p: d for (w, p), d in sorted(self.committed.items()) if w == workspace}


class RestoreReport(msgspec.Struct, kw_only=True):
    workspace: str
    root: str
    paths: int
    absent: int
    bytes: int
    rev: int
    seq: int
    deduped: bool = False


def committed_content(ledger: Ledger, workspace: str) -> dict[str, str | None]:
    """Each path the ledger knows in `workspace` -> the digest of its committed content."""
    fold = CommittedFold()
    with ledger._db.snapshot():
        for recorded in ledger._log.read():
            fold.feed(recorded.event)
    return fold.paths(workspace)


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


def restore(ledger: Ledger, workspace: str, to: str | os.PathLike[str], *,
            force: bool = False) -> RestoreReport:
    """Write the workspace's committed content under `to` (new or empty) and record it.

    Every blob is checked (present, size, hash) before the first file is written; a
    missing one raises BlobNotFound and nothing is written. Refused while a lease is
    live (its holder may still write to the old directory) unless `force`: take a new
    epoch right after (`acquire(..., force=True)`), which settles the old one's
    attempts against the restored files.
    """
    check_step_id(workspace)
    row = ledger.workspace(workspace)
    reg = ledger.registration(workspace)
    if row.live_epoch(ledger.clock()) is not None and not force:
        raise LeaseHeld(workspace, row.epoch, row.holder, row.expires_ns)
    target = os.path.realpath(os.fspath(to))
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise InvalidInput(f"restore target {to} exists and is not an empty directory;"
                           " give a new or empty directory")
    _check_target(target, to)
    # never into the ledger's own directory or another workspace (by path and by the
    # identity of whatever exists of it); checked again once it exists
    ledger._check_root(workspace, target, None)
    content = committed_content(ledger, workspace)
    blobs: dict[str, bytes] = {}
    for path, digest in content.items():
        if digest is not None and digest not in blobs:
            blobs[digest] = ledger.read_blob(digest, verify=True)
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
    ledger._check_root(workspace, target, identity_of(st))
    out = WorkspaceDir(workspace, target, ledger.blobs.ops, identity=identity_of(st),
                       boundary=ledger._boundary(), allow_git=reg.allow_git)
    written = absent = size = 0
    for path, digest in content.items():
        if digest is None:
            absent += 1
            continue
        out.put(path, blobs[digest])
        written += 1
        size += len(blobs[digest])
    for path, digest in content.items():  # read back: what is on disk is what was committed
        if out.hash(path) != digest:
            raise InvalidInput(f"restored {path} does not read back as {digest}; check {target}")
    recorded = ledger.append(WorkspaceRestored(workspace=workspace, root=target, rev=row.rev,
                                               paths=written, dev=st.st_dev, ino=st.st_ino,
                                               allow_git=reg.allow_git))
    return RestoreReport(workspace=workspace, root=target, paths=written, absent=absent,
                         bytes=size, rev=row.rev, seq=recorded.seq, deduped=recorded.deduped)


__all__ = ["CommittedFold", "RestoreReport", "committed_content", "restore"]

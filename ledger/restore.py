"""Restore: materialize a workspace's committed content on a fresh directory.

The literal "outlive the machine": every path the ledger knows at its committed content
— the post-image of its last committed write (its step published a manifest), or the
pre-image a compensation put back — each a blob a manifest or a compensation record
references (invariant I9), verified by hash as it is written. A `workspace-restored`
event records the new root; steps write there from then on. Files stepledger never
wrote (untracked) are not in the ledger and are not restored. Each file gets the mode
the ledger recorded for it (events written before modes were: 0o666 less the umask).

The files are written into a staging directory beside the target and renamed onto it
at the end, so a restore that is killed leaves the target as it was (new or empty) and
its retry goes ahead; the retry removes the dead one's staging directory. A restore
killed after that rename and before its event finds the target holding exactly the
committed content, and records it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from typing import TYPE_CHECKING, Final

import msgspec

from .errors import InvalidInput, LeaseHeld, LedgerError
from .events import (
    Compensated,
    Fenced,
    ManifestPublished,
    WorkspaceRestored,
    check_step_id,
)
from .workspace import TMP_MARK, WorkspaceDir

if TYPE_CHECKING:
    from .ledger import Ledger


class CommittedFold:
    """Per (workspace, path): the digest of its committed content (None: absent) and
    the mode recorded with it (`modes`; None: not recorded)."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], dict[tuple[str, str], tuple[str | None, int | None]]] = {}
        self.committed: dict[tuple[str, str], str | None] = {}
        self.modes: dict[tuple[str, str], int | None] = {}

    def feed(self, event: object) -> None:
        if isinstance(event, Fenced) and event.workspace:
            writes = self.pending.setdefault((event.step, event.attempt), {})
            for w in event.writes:
                writes[(event.workspace, w.path)] = (w.post_hash, w.post_mode)
        elif isinstance(event, ManifestPublished):
            for key, (digest, mode) in self.pending.pop((event.step, event.attempt), {}).items():
                self.committed[key], self.modes[key] = digest, mode
        elif isinstance(event, Compensated):
            self.pending.pop((event.step, event.attempt), None)
            for r in event.restored:
                if r.outcome != "conflict":
                    key = (event.workspace, r.path)
                    self.committed[key], self.modes[key] = r.digest, r.mode

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


def _committed_fold(ledger: Ledger) -> CommittedFold:
    fold = CommittedFold()
    with ledger._db.snapshot():
        for recorded in ledger._log.read():
            fold.feed(recorded.event)
    return fold


def committed_content(ledger: Ledger, workspace: str) -> dict[str, str | None]:
    """Each path the ledger knows in `workspace` -> the digest of its committed content."""
    return _committed_fold(ledger).paths(workspace)


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
    if row.live_epoch(ledger.clock()) is not None and not force:
        raise LeaseHeld(workspace, row.epoch, row.holder, row.expires_ns)
    target = os.path.realpath(os.fspath(to))
    fold = _committed_fold(ledger)
    content = fold.paths(workspace)
    done = _holds_exactly(workspace, target, content)  # a restore killed before its event
    if not done and os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise InvalidInput(f"restore target {to} exists and is not an empty directory;"
                           " give a new or empty directory")
    _check_target(target, to)
    blobs: dict[str, bytes] = {}
    for path, digest in content.items():
        if digest is not None and digest not in blobs:
            blobs[digest] = ledger.read_blob(digest, verify=True)
    parent, base = os.path.split(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise InvalidInput(f"restore target {to} cannot be created ({exc.strerror}); give a"
                           " new or empty directory") from None
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
            raise
        raise InvalidInput(f"restore target {to} cannot be created ({exc.strerror}); give a"
                           " shorter path to a new or empty directory") from None
    written = absent = size = 0
    for path, digest in content.items():
        if digest is None:
            absent += 1
        else:
            written += 1
            size += len(blobs[digest])
    if not done:
        _remove_dead_staging(parent, base)
        staging = os.path.join(parent, f"{_staging_prefix(base)}{TMP_MARK}restore-"
                                       f"{secrets.token_hex(4)}")
        try:
            os.mkdir(staging, 0o700)
            out = WorkspaceDir(workspace, staging, ledger.blobs.ops)
            for path, digest in content.items():
                if digest is not None:
                    out.put(path, blobs[digest], mode=fold.modes.get((workspace, path)))
            for path, digest in content.items():  # read back: on disk is what was committed
                if out.hash(path) != digest:
                    raise InvalidInput(f"restored {path} does not read back as {digest};"
                                       f" check {parent}")
            # the new directory follows the umask, an empty target its own mode
            umask_mode = 0o777 & ~_umask()
            os.chmod(staging, _mode(target) if os.path.isdir(target) else umask_mode)
            try:
                os.rename(staging, target)  # onto a missing or empty directory: atomic
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                raise InvalidInput(f"restore target {to} was filled while restoring; give a"
                                   " new or empty directory") from None
            _fsync_dir(parent)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(staging)
            raise
    recorded = ledger.append(WorkspaceRestored(workspace=workspace, root=target, rev=row.rev,
                                               paths=written))
    return RestoreReport(workspace=workspace, root=target, paths=written, absent=absent,
                         bytes=size, rev=row.rev, seq=recorded.seq, deduped=recorded.deduped)


def _holds_exactly(workspace: str, target: str, content: dict[str, str | None]) -> bool:
    """Whether `target` is a directory holding exactly the committed files (each with
    its committed hash, nothing else, not empty): a restore's complete output whose
    event was never written."""
    present = {p: d for p, d in content.items() if d is not None}
    if not present or not os.path.isdir(target) or os.path.islink(target):
        return False
    found = set()
    for top, dirs, files in os.walk(target):
        rel = os.path.relpath(top, target)
        if any(os.path.islink(os.path.join(top, d)) for d in dirs):
            return False  # restore writes no symlinks
        for name in files:
            found.add(name if rel == "." else f"{rel}/{name}")
        if len(found) > len(present):
            return False
    if found != present.keys():
        return False
    out = WorkspaceDir(workspace, target)
    try:
        return all(out.hash(p) == d for p, d in present.items())
    except (LedgerError, OSError):
        return False


_STAGING: Final = re.compile(re.escape(TMP_MARK) + r"restore-[0-9a-f]{8}")


def _remove_dead_staging(parent: str, base: str) -> None:
    """Remove the staging directories of restores of `base` that died (a restore that is
    still running is the retry's own caller or a concurrent restore of the same target:
    one of the two could not rename anyway)."""
    prefix = _staging_prefix(base)
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if name.startswith(prefix) and _STAGING.fullmatch(name[len(prefix):]):
                path = os.path.join(parent, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)


def _umask() -> int:
    """The process's umask (read without changing it where /proc says it)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _staging_prefix(base: str) -> str:
    """The start of a staging directory's name beside `base` (at most 81 bytes)."""
    return "." + base.encode()[:80].decode("utf-8", "ignore")


def _mode(path: str) -> int:
    return os.stat(path).st_mode & 0o7777


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["CommittedFold", "RestoreReport", "committed_content", "restore"]

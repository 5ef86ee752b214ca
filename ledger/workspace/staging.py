"""Writing a step's bytes into a workspace under a temporary name, and collecting
what a crash left of such writes.

A write is staged first (`stage`: a temporary file beside its target, written and
fsynced, outside the ledger's write lock) and put in place later (placing.py) under the
lock. A staged file gets the mode the file ends with: an edited file keeps its
permission bits, a created one follows the umask. A temporary's name carries the epoch
and the attempt that staged it (names.py), so the one that left it behind in a crash is
recognised and removed later (`remove_temporaries`) — never a live stager's, never a
user's file, and never bytes the ledger does not hold: those are kept under a visible
name. `put` is a restore's write: to an absent path, or over the same bytes.

Functions over one attempt's `WorkspaceDir` (directory.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .boundary import FileIdentity, identity_of
from .directory import MODE_BITS, DirectoryMoved, WorkspaceDir, mode_of
from .moves import ABSENT, Mover, Seen, UnsafeFallbackRefused, look, stat_at
from . import names
from .names import is_scratch, leaf_of_temp, slot_role, temp_name, temp_stamp
from ..errors import AccessDenied, InvalidInput, LedgerError, StorageFailure, UnsafeRename


@dataclass
class Staged:
    """A temporary file holding a write's new content, durable, not yet visible."""

    path: str
    tmp_name: str
    digest: str
    size: int
    mode: int  # the permission bits the file has once installed
    pre_mode: int | None  # the target's bits (None: it did not exist)
    follows_target: bool = False  # `mode` is the target's: `install` follows a chmod since
    identity: FileIdentity | None = None  # the staged file's (device, inode)


class StagingLost(Exception):
    """A staged file removed before it was complete (see `WorkspaceDir.stage`): the
    write has no staged file; the fence decides what that means (StaleEpoch for a
    zombie)."""


def stage(wsdir: WorkspaceDir, path: str, data: bytes | Iterable[bytes], *, mode: int | None = None,
          slot: str | None = None, make_dirs: bool = True) -> Staged:
    """Write `data` (bytes, or pieces of them: held one piece at a time) to a fsynced
    temporary file beside `path` (parents created). Whatever stops the copy — an OS
    error, or a source that raises (a blob found corrupt by its last piece) — removes
    the temporary file and propagates.

    The file gets `mode` when given (a recorded mode put back), else the permission
    bits of the file it will replace, else (a new file) 0o666 less the umask. It is
    created no wider than that and set exactly before its first byte is written, so
    a 0600 secret is never readable by others, not even while staged. A name the file
    system can never hold is InvalidInput (a retry cannot help). `slot`: stage under
    the write's deterministic name (`slot`), replacing what a crashed call left there.
    `make_dirs` False (an edit: its directory existed when it was planned): a missing
    directory is DirectoryMoved, never made again.
    """
    try:
        opened = wsdir.held_parent(path, check=False, create=make_dirs)
    except DirectoryMoved as moved:
        wsdir.staging_moved[path] = moved
        raise
    except OSError as exc:
        raise storage_error(wsdir, path, exc) from None
    if opened is None:
        # (`make_dirs` False: an edit's directory, gone since the plan — renamed or
        # moved by a person — is never made again)
        moved = DirectoryMoved(path, path.rpartition("/")[0], None)
        wsdir.staging_moved[path] = moved
        raise moved
    dir_fd, leaf = opened
    mover = wsdir.mover()
    # Written under a fresh name, then renamed to the slot once whole and fsynced: a
    # slot holds a complete post-image or, after the exchange, the displaced bytes —
    # never a copy cut short by a kill (`landed` tells the two apart by content).
    tmp = temp_name(leaf, wsdir.epoch, wsdir.tag, names.name_max(dir_fd))
    final_name = tmp if slot is None else wsdir.slot(path, slot)
    h = hashlib.sha256()
    size = 0
    mine: tuple[int, int] | None = None
    try:
        pre_mode = mode_of(leaf, dir_fd)
        want = mode if mode is not None else pre_mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666 if want is None else want & MODE_BITS, dir_fd=dir_fd)
        try:
            mine = identity_of(os.fstat(fd))
            if want is not None:
                os.fchmod(fd, want & MODE_BITS)
            final = stat.S_IMODE(os.fstat(fd).st_mode)
            for chunk in (data,) if isinstance(data, bytes) else data:
                h.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    wsdir.ops.tick("ws-write")
                    view = view[os.write(fd, view):]
            wsdir.ops.tick("ws-fsync")
            os.fsync(fd)
        finally:
            os.close(fd)
        mover.check_safe(dir_fd, tmp)
        if final_name != tmp:
            # what a crashed call left in the slot (judged by the caller: a copy of
            # these bytes) goes, verified; anything else is kept visible
            kept = mover.drop(dir_fd, final_name, expect=frozenset({h.hexdigest()}),
                              keep_for=leaf)
            if kept is not None:
                wsdir.kept.append((path, kept))
            try:
                mover.hide(dir_fd, tmp, final_name)
            except FileNotFoundError:
                # removed meanwhile as a dead stager's leftover: a newer epoch's
                # cleanup (this stager is a zombie), or a second apply of the attempt
                raise StagingLost(path) from None
    except BaseException as exc:
        if mine is not None:
            with contextlib.suppress(OSError):
                mover.drop_own(dir_fd, tmp, mine)
        if isinstance(exc, UnsafeFallbackRefused):
            raise UnsafeRename(os.path.join(wsdir.root, path)) from None
        if isinstance(exc, OSError):
            raise storage_error(wsdir, path, exc) from None
        raise
    finally:
        os.close(dir_fd)
    return Staged(path, final_name, h.hexdigest(), size, final, pre_mode,
                  follows_target=mode is None and pre_mode is not None, identity=mine)


def storage_error(wsdir: WorkspaceDir, path: str, exc: OSError) -> LedgerError:
    """The typed error for an OSError on `path`: a name too long for the file system
    is bad input (it will never fit); anything else the environment's failure."""
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidInput(f"{path[:80]!r} has a name too long for the file system under"
                            f" {wsdir.root}; plan a shorter name")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = os.path.dirname(os.path.join(wsdir.root, path))
        why = "a read-only file system" if exc.errno == errno.EROFS else \
            "this user may not write there"
        return AccessDenied(where, why, "make the workspace writable by this user (or"
                            " run as its owner), then apply again", readers_work=False)
    return StorageFailure(os.path.join(wsdir.root, path), os.strerror(exc.errno or 0))


def check_fits(wsdir: WorkspaceDir, path: str) -> None:
    """Refuse (InvalidInput) a path with a component longer than the workspace's file
    system holds (NAME_MAX: 255 bytes on most, less on some, e.g. eCryptfs)."""
    limit = names.name_max(wsdir.root)
    for part in path.split("/"):
        if len(part.encode()) > limit:
            raise InvalidInput(f"{path[:80]!r} has a component of {len(part.encode())} bytes;"
                               f" the file system under workspace {wsdir.name!r} holds at"
                               f" most {limit}: plan a shorter name")


def remove_temporaries(wsdir: WorkspaceDir, dirs: Iterable[str], dead: Callable[[int, str], bool],
                       keep: Callable[[], frozenset[tuple[str, str]]] = frozenset,
                       held: Callable[[str], bool] | None = None,
                       restored: Mapping[str, str] | None = None) -> int:
    """Collect the temporaries steptrail staged and left behind (a killed apply,
    compensation or settle) from each directory in `dirs` (relative; "" is the root).

    Only a regular file with a name `temp_name` makes, whose (epoch, attempt tag)
    `dead` says no live stager can own, is looked at; anything else — a user's file,
    a symlink, a directory, a live temporary, a (directory, name) in `keep()` (the
    slots of attempts in flight: what their crashed writes displaced; asked for only
    when a dead temporary is found) — stays. A dead temporary is removed only once its
    bytes are shown to be held by the ledger (`held(digest)`) or by a file beside it
    of the same name prefix; otherwise it is kept under a visible name
    (``NAME.steptrail-kept-TAG``): it may hold a person's save a crash displaced.
    `restored`: the paths an undo has just recorded as holding a digest (its commit
    made): a ``y`` slot of an older epoch (what a landing without the exchange call
    moved aside) holding that digest beside its empty name is that file on its way
    between its name and the slot — moved aside since by a worker of that epoch still
    running, about to link its staged file in or put it back — and goes back to its
    name (never over anything), not away: that the ledger holds the bytes does not
    make the path's only copy on disk a leftover.
    Best effort: a directory that is missing or not a plain directory is skipped.
    Returns how many files went (kept ones not counted)."""
    removed = 0
    kept: frozenset[tuple[str, str]] | None = None
    for d in sorted(set(dirs)):
        try:
            dir_fd = wsdir.open_dir_fd(d)
        except (LedgerError, OSError):
            continue
        if dir_fd is None:
            continue
        here = 0
        moved = False
        try:
            for name in os.listdir(dir_fd):
                stamp = temp_stamp(name)
                if stamp is None or not dead(*stamp):
                    continue
                if kept is None:
                    kept = keep()
                if (d, name) in kept:
                    continue
                st = stat_at(dir_fd, name)
                if st is None or not stat.S_ISREG(st.st_mode):
                    continue
                mover = Mover(wsdir.ops, stamp[1] or "0" * 8)  # (a name from before tags)
                leaf = leaf_of_temp(name)
                if is_scratch(name) and st.st_nlink == 1:
                    # a dead stager's own copy, whole or cut short by a kill: no move
                    # ever gives such a name to bytes it did not write itself
                    mover.drop_own(dir_fd, name, identity_of(st))
                    here += 1
                    continue
                beside = look(dir_fd, leaf) if leaf else ABSENT
                back = restored.get(os.path.join(d, leaf) if d else leaf) \
                    if restored and leaf else None
                if back is not None and beside.digest is None and stamp[0] < wsdir.epoch \
                        and slot_role(name) == "y":
                    if look(dir_fd, name).digest == back:
                        try:
                            if mover.put(dir_fd, name, leaf):
                                moved = True
                                continue
                        except FileNotFoundError:
                            continue  # (put back by its worker meanwhile)
                        beside = look(dir_fd, leaf)  # (taken meanwhile)

                def ours(digest: str, beside: Seen = beside) -> bool:
                    return digest == beside.digest or (held is not None and held(digest))

                if mover.drop(dir_fd, name, held=ours, keep_for=leaf or None) is None:
                    here += 1
                else:
                    wsdir.kept.append((os.path.join(d, leaf) if d else leaf, name))
            if here or moved:
                wsdir.ops.tick("ws-dirfsync")
                os.fsync(dir_fd)
            removed += here
        except OSError:
            continue
        finally:
            os.close(dir_fd)
    return removed


def discard(wsdir: WorkspaceDir, staged: Staged) -> None:
    """Remove a staged file that will not be installed, once it is shown to hold the
    staged bytes (best effort: a parent that is gone or became a symlink leaves it to
    `remove_temporaries`; a file that is not the staged one is kept visible)."""
    opened = wsdir.held_parent(staged.path, check=False)
    if opened is None:
        return
    dir_fd, leaf = opened
    try:
        kept = wsdir.mover().drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                                  keep_for=leaf)
        if kept is not None:
            wsdir.kept.append((staged.path, kept))
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def remove_created_dirs(wsdir: WorkspaceDir) -> None:
    """Remove the directories this object created that are still empty, deepest
    first, from the descriptors held since they were made (best effort: a directory
    something was put in since stays; one a person moved is left where it went)."""
    while wsdir.created_dirs:
        rel = wsdir.created_dirs.pop()
        parent, _, leaf = rel.rpartition("/")
        held = wsdir.held_dirs.get(parent)
        try:
            fd = os.dup(held[0]) if held is not None else wsdir.open_dir_fd(parent)
        except (LedgerError, OSError):
            continue
        if fd is None:
            continue
        try:
            mine = wsdir.held_dirs.get(rel)
            st = stat_at(fd, leaf)
            if mine is not None and (st is None or identity_of(st) != mine[1]):
                continue  # not the directory this object made (moved, replaced)
            if wsdir.mover().rmdir(fd, leaf):
                os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def put(wsdir: WorkspaceDir, path: str, data: bytes | Iterable[bytes], *,
        mode: int | None = None, replace: bool = False) -> int:
    """Make `path` — absent, or holding these very bytes already (a killed restore's
    output) — hold `data` durably (pieces: see `stage`); returns the file's mode. A
    file of other bytes at the path is never replaced: InvalidInput, nothing lost —
    unless `replace`: then it is first given a visible name beside the path
    (``NAME.steptrail-kept-TAG``, in `kept`: never removed) and the path takes
    `data`. Anything but a regular file there is refused either way."""
    staged = stage(wsdir, path, data, mode=mode)
    opened = wsdir.held_parent(path, check=False)
    assert opened is not None
    dir_fd, leaf = opened
    mover = wsdir.mover()
    try:
        there = stat_at(dir_fd, leaf)
        if replace and there is not None:
            if not stat.S_ISREG(there.st_mode):
                mover.drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                           keep_for=leaf)
                raise InvalidInput(f"{os.path.join(wsdir.root, path)} is not a regular"
                                   " file; a restore replaces files only: move it away,"
                                   " then run again")
            if look(dir_fd, leaf).digest != staged.digest:
                wsdir.kept.append((path, mover.keep(dir_fd, leaf, leaf)))
        if not mover.put(dir_fd, staged.tmp_name, leaf):
            now = look(dir_fd, leaf)
            mover.drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                       keep_for=leaf)
            if now.digest != staged.digest:
                raise InvalidInput(
                    f"{os.path.join(wsdir.root, path)} appeared while it was being"
                    " written and holds other bytes; it was left as it is: remove it"
                    " or give another directory, then run again")
        wsdir.ops.tick("ws-dirfsync")
        os.fsync(dir_fd)
    except UnsafeFallbackRefused:
        raise UnsafeRename(os.path.join(wsdir.root, path)) from None
    except OSError as exc:
        raise StorageFailure(os.path.join(wsdir.root, path),
                             os.strerror(exc.errno or 0)) from None
    finally:
        os.close(dir_fd)
    return staged.mode


__all__ = ["Staged", "StagingLost", "check_fits", "discard", "put", "remove_created_dirs",
           "remove_temporaries", "stage"]

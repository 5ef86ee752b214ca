"""A workspace directory on disk, reached the one confined way: the handle every move uses.

Every path is relative to the workspace root and opened one component at a time
relative to its parent's descriptor, with ``O_NOFOLLOW``: a symlink anywhere below
the root — a directory or the file itself — is refused (PathEscapes), so a step can
never write outside its workspace. The root is stored resolved, so it is reached the
same way from ``/`` (no component may be a symlink), and must be the directory it was
registered as: the same device and inode (`identity`); otherwise WorkspaceMoved.

A `Boundary` (boundary.py) names what no step may touch even inside the root: the
ledger's own directories and files, and — unless the workspace opted in — any ``.git``
component. The same walk serves apply, compensate, settle, restore and snapshot, so a
check at admit cannot be raced past.

A `WorkspaceDir` is one attempt's handle on its workspace: the walk, the descriptors of
the directories it reached (held from then on: a directory a person renames while the
step runs is still the one its files go to, `held_parent`), the stamp its temporaries
carry (epoch and attempt, names.py) and what the attempt met on the way (directories
gone or moved, files it had to keep under a visible name). What is done with it lives
beside it, one concern a module, as functions over the handle:

- staging.py: writing a step's bytes under a temporary name (`stage`), a restore's
  `put`, and collecting what a crash left (`remove_temporaries`);
- placing.py: putting a write in place and verifying what it displaced (`land`),
  taking it back (`unland`, `roll_back`), and removing what was displaced once recorded
  (`release`);
- leftovers.py: what a crashed call of the attempt left on disk (`landed`), found even
  in a directory a person moved after the kill.

Nothing here holds a file whole: `hash` reads in bounded pieces and `open` hands out a
descriptor. Every operation goes through `FileOps` (the blob store's seam), so tests
inject faults and the crash harness kills the process at an exact operation:
``ws-write``, ``ws-fsync``, ``ws-rename``, ``ws-dirfsync``, ``ws-unlink``, ``ws-mkdir``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Final

from .boundary import (LEDGER_DIR_NAME, LEDGER_FIX, Boundary, FileIdentity, identity_of,
                       is_git_name, is_ledger_dir_name)
from .moves import Mover
from . import names
from .names import TMP_MARK, temp_name, temp_stamp
from ..blobs import FileOps, fd_chunks, hash_chunks
from ..errors import (
    InvalidInput,
    LedgerError,
    PathEscapes,
    PathForbidden,
    StorageFailure,
    WorkspaceMoved,
    WorkspaceOverlap,
)
from ..events import check_relpath

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The root's ancestors are only passed through: O_PATH needs search permission, not read.
_PASS_FLAGS: Final = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The permission bits a staged file takes over (setuid, setgid and sticky are not:
#: the kernel drops setuid/setgid too when an unprivileged process writes a file).
MODE_BITS: Final = 0o777


class WorkspaceDir:
    """The files of one workspace, below `root`."""

    def __init__(self, name: str, root: str, ops: FileOps | None = None, *,
                 identity: FileIdentity | None = None, boundary: Boundary | None = None,
                 allow_git: bool = False, epoch: int = 0, tag: str = "00000000") -> None:
        self.name = name
        self.root = os.path.normpath(os.path.abspath(root))
        self.ops = ops or FileOps()
        #: The root's (st_dev, st_ino) at registration; None: not recorded (old ledger).
        self.identity = identity
        self.boundary = boundary or Boundary()
        self.allow_git = allow_git
        #: The stamp of the temporaries this object stages: the epoch and the attempt
        #: (`attempt_tag`) it works for.
        self.epoch, self.tag = epoch, tag
        #: Directories this object created (relative paths, in creation order), so that a
        #: refused apply can take them back (`remove_created_dirs`).
        self.created_dirs: list[str] = []
        #: The root's descriptor from the last full walk, with its identity: reused while
        #: the root's name still names that directory (`open_root`).
        self._root: tuple[int, FileIdentity] | None = None
        #: Directory (relative path) -> (descriptor, identity), held from the first time
        #: this object reached it: every later move in it goes through this descriptor,
        #: never a walk by name (`held_parent`).
        self.held_dirs: dict[str, tuple[int, FileIdentity]] = {}
        #: The attempt's planned paths, when known: a search for a directory moved after
        #: a kill matches the planned directories gone from their names to the
        #: directories holding their slots (`leftovers`).
        self.planned: frozenset[str] = frozenset()
        #: That search's findings, made once per handle (`leftovers`): the directories
        #: holding this attempt's names, and where each planned directory went.
        self.walked: dict[str, tuple[FileIdentity, frozenset[str]]] | None = None
        self.moved_to: dict[str, str | None] | None = None
        #: Directories of the plan's edits and deletes absent at their names when the
        #: apply began (renamed, moved or removed since the plan): nothing is staged in
        #: them and the fence refuses the step (`Workspaces.apply`).
        self.gone_dirs: frozenset[str] = frozenset()
        #: Path -> the directory made for it while staging and renamed or removed at
        #: once (`stage` raised DirectoryMoved): the fence refuses the step.
        self.staging_moved: dict[str, DirectoryMoved] = {}
        #: Directories (relative) to collect temporaries from besides the plan's: where
        #: a settle found a planned directory moved to (`moved_dirs`).
        self.also_dirs: set[str] = set()
        #: (path, visible name) of every file this object had to keep (`moves.Mover.keep`)
        #: instead of removing it: reported by the caller.
        self.kept: list[tuple[str, str]] = []

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Drop the cached root descriptor (an object is usable again after: the next
        call walks from ``/`` anew)."""
        root, self._root = getattr(self, "_root", None), None
        if root is not None:
            with contextlib.suppress(OSError):
                os.close(root[0])
        held, self.held_dirs = getattr(self, "held_dirs", {}), {}
        for fd, _ in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- descriptors -------------------------------------------------------------------

    def escape(self, path: str, why: str) -> PathEscapes:
        return PathEscapes(self.name, path, why)

    def open_root(self) -> int:
        """A descriptor of the root, reached from ``/`` one component at a time without
        following symlinks, checked against the registered identity and the boundary.

        The walk's result is kept: a later call costs one ``lstat`` of the root's name
        (not a walk of every ancestor) while that name is still the same directory, not a
        symlink (the walk's descriptor is then the directory the name shows); otherwise
        the walk runs again and judges what is there now."""
        root = self._root
        if root is not None:
            try:
                same = identity_of(os.stat(self.root, follow_symlinks=False)) == root[1]
            except OSError:
                same = False
            if same:
                return os.dup(root[0])
            self.close()
        fd = self._walk_root()
        self._root = (os.dup(fd), identity_of(os.fstat(fd)))
        return fd

    def _walk_root(self) -> int:
        parts = [p for p in self.root.split("/") if p]
        fd = os.open("/", _PASS_FLAGS if parts else _DIR_FLAGS)
        try:
            here = identity_of(os.fstat(fd))
            if not parts and here in self.boundary.dirs:
                raise WorkspaceOverlap(self.root, "", "/", "is")
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                try:
                    child = os.open(part, _DIR_FLAGS if last else _PASS_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise InvalidInput(
                        f"workspace {self.name!r} directory {self.root} does not exist;"
                        " recreate it or restore the workspace"
                    ) from None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise WorkspaceMoved(self.name, self.root,
                                             f"{'/' + '/'.join(parts[: i + 1])} is a symlink or"
                                             " not a directory") from None
                    raise StorageFailure(self.root, os.strerror(exc.errno or 0)) from None
                os.close(fd)
                fd = child
                here = identity_of(os.fstat(fd))
                if here in (self.boundary.dirs if last else self.boundary.stores):
                    raise WorkspaceOverlap(self.root, "", "/" + "/".join(parts[: i + 1]),
                                           "is or lies inside")
            if self.identity is not None and here != self.identity:
                raise WorkspaceMoved(self.name, self.root, "another device and inode than at"
                                     " registration: it was moved, replaced or restored")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_root(self) -> None:
        """Refuse now (WorkspaceMoved, WorkspaceOverlap) a root that is not the registered
        directory, before anything is recorded about its files."""
        os.close(self.open_root())

    def _check_dir(self, fd: int, shown: str, path: str) -> None:
        """Refuse to enter a directory of the boundary (the ledger's own)."""
        if self.boundary.dirs and identity_of(os.fstat(fd)) in self.boundary.dirs:
            raise PathForbidden(self.name, path, f"{shown} is the ledger's own directory",
                                LEDGER_FIX)

    def check_path(self, path: str) -> None:
        """Refuse a path no step may write, by name: ``.git`` (unless the workspace opted
        in) or a boundary path. The walk to it checks the same by identity."""
        check_relpath(path)
        if not self.allow_git and any(is_git_name(p) for p in path.split("/")):
            raise PathForbidden(
                self.name, path, "it is .git or inside it: a step writing git's internals"
                " (hooks, config) runs code the next time a person runs git",
                f"if steps must write there, opt in with ledger.workspaces.add({self.name!r},"
                " DIR, rebind=True, allow_git=True)",
                f"if steps must write there, opt in with 'steptrail workspace add {self.name}"
                " DIR --rebind --allow-git'")
        hit = self.boundary.names(self.root, path)
        if hit is not None:
            raise PathForbidden(self.name, path, f"it is or lies inside {hit}, the ledger's"
                                " own", LEDGER_FIX)
        if any(is_ledger_dir_name(p) for p in path.split("/")):
            # another ledger's directory (a nested project's, or one an MCP client's roots
            # once made): its history is changed only through steptrail, never by a step
            raise PathForbidden(self.name, path, f"it is or lies inside a {LEDGER_DIR_NAME}"
                                " directory: a ledger's files, which no step writes",
                                "write somewhere else; a ledger changes only through steptrail")

    def check_write(self, path: str) -> None:
        """The boundary of a write to `path`, checked now without creating anything
        (admit): the names, the root, then the identity of every directory that exists on
        the way and of the file. A symlink on the way is left for the walk at apply to
        refuse (PathEscapes) — it may be gone by then; the boundary is judged again there.
        A name of the shape steptrail gives its own temporaries is refused too: the next
        apply, settle or gc of the workspace removes such files as a crash's leftovers."""
        self.check_path(path)
        leaf = path.rsplit("/", 1)[-1]
        if temp_stamp(leaf) is not None:
            raise PathForbidden(
                self.name, path, "its name has the shape of steptrail's own temporary files"
                f" ('.NAME{TMP_MARK}EPOCH-TAG-RANDOM.tmp'), which are removed as a crash's"
                " leftovers", "give the file another name")
        with contextlib.suppress(PathEscapes):
            opened = self.open_parent(path, create=False)
            if opened is not None:
                os.close(opened[0])

    def open_parent(self, path: str, *, create: bool) -> tuple[int, str] | None:
        """(descriptor of the path's parent directory, leaf name); None when a parent is
        missing and not `create`. The caller closes the descriptor."""
        self.check_path(path)
        parts = path.split("/")
        fd = self._walk(path, parts[:-1], create=create)
        if fd is None:
            return None
        try:
            self.check_leaf(fd, parts[-1], path)
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    @contextlib.contextmanager
    def open_dir(self, path: str) -> Iterator[int | None]:
        """A descriptor of the directory at `path` ("": the root), reached the way every
        write is: from the root, one component at a time, no symlink followed, the
        ledger's own directories and (unless allowed) ``.git`` refused — the one walk the
        library and the MCP tools share. None: a component does not exist. A symlink or
        a file on the way is PathEscapes; closed on exit."""
        fd = self.open_dir_fd(path)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def has_dir(self, path: str) -> bool:
        """True when `path` ("": the root) names a directory, reached as `open_dir` does
        (a symlink or a file on the way: False)."""
        try:
            fd = self.open_dir_fd(path)
        except (LedgerError, OSError):
            return False
        if fd is not None:
            os.close(fd)
        return fd is not None

    def open_dir_fd(self, path: str) -> int | None:
        """`open_dir`'s descriptor, owned by the caller (None: missing)."""
        if path in ("", "."):
            return self.open_root()
        self.check_path(path)
        return self._walk(path, path.split("/"), create=False)

    def _walk(self, path: str, parts: list[str], *, create: bool) -> int | None:
        """The descriptor of the directory `parts` names below the root (created when
        missing and `create`; None when missing otherwise), every component checked."""
        fd = self.open_root()
        try:
            for i, part in enumerate(parts):
                try:
                    try:
                        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:
                        if not create:
                            os.close(fd)
                            return None
                        with contextlib.suppress(FileExistsError):
                            self.ops.tick("ws-mkdir")
                            os.mkdir(part, 0o755, dir_fd=fd)
                            self.created_dirs.append("/".join(parts[: i + 1]))
                            self.ops.tick("ws-dirfsync")
                            os.fsync(fd)
                        # what is there now may have been put there since (a symlink
                        # swapped in during staging): refused like any other
                        try:
                            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                        except FileNotFoundError:
                            # made, then renamed or removed at once (a person's `mv`):
                            # never made again behind them
                            raise DirectoryMoved(path, "/".join(parts[: i + 1]),
                                                 None) from None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self.escape(path, f"{'/'.join(parts[: i + 1])!r} is a symlink"
                                           " or not a directory") from None
                    raise
                os.close(fd)
                fd = child
                self._check_dir(fd, os.path.join(self.root, *parts[: i + 1]), path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_leaf(self, dir_fd: int, leaf: str, path: str) -> None:
        """Refuse a leaf that is one of the ledger's own files or directories."""
        if not (self.boundary.leaves or self.boundary.dirs):
            return
        try:
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if identity_of(st) in self.boundary.leaves | self.boundary.dirs:
            raise PathForbidden(self.name, path, "it is one of the ledger's own files",
                                LEDGER_FIX)

    # -- reading -----------------------------------------------------------------------

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[int | None]:
        """A read-only descriptor of the regular file at `path` (None: it does not
        exist), closed on exit. A symlink or anything not a regular file is refused
        (PathEscapes); opening never blocks (a FIFO is refused, not waited on)."""
        with self._open_beside(path, None, strict=True) as fd:
            yield fd

    @contextlib.contextmanager
    def open_if_file(self, path: str) -> Iterator[int | None]:
        """Like `open`, but None (not PathEscapes) for a symlink or anything not a
        regular file at the leaf: a target a person swapped for another kind."""
        with self._open_beside(path, None, strict=False) as fd:
            yield fd

    @contextlib.contextmanager
    def _open_beside(self, path: str, name: str | None, *, strict: bool
                     ) -> Iterator[int | None]:
        """A read-only descriptor of `name` in `path`'s directory (None: `path`'s own
        leaf). `strict`: a symlink or a non-regular file is PathEscapes; otherwise it is
        None, like an absent one."""
        opened = self.open_parent(path, create=False)
        if opened is None:
            yield None
            return
        dir_fd, leaf = opened
        try:
            try:
                fd = os.open(leaf if name is None else name, READ_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                fd = None
            except OSError as exc:
                if not strict:
                    fd = None
                elif exc.errno == errno.ELOOP:
                    raise self.escape(path, "it is a symlink") from None
                else:
                    raise
        finally:
            os.close(dir_fd)
        if fd is None:
            yield None
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                if strict:
                    raise self.escape(path, "it is not a regular file")
                yield None
            else:
                yield fd
        finally:
            os.close(fd)

    def hash(self, path: str) -> str | None:
        """sha256 of the file's bytes as they are on disk now (None: absent), read in
        bounded pieces whatever the file's size."""
        with self.open(path) as fd:
            return None if fd is None else hash_chunks(fd_chunks(fd))[0]

    def mode(self, path: str, name: str | None = None) -> int | None:
        """The permission bits of the regular file at `path` — or of `name` beside it (a
        slot) — None: absent, or not a regular file."""
        opened = self.open_parent(path, create=False)
        if opened is None:
            return None
        dir_fd, leaf = opened
        try:
            return mode_of(leaf if name is None else name, dir_fd)
        finally:
            os.close(dir_fd)

    def sync(self, path: str) -> None:
        """Make the file's bytes and its name durable (fsync it and its directory): for a
        write found already on disk, whose own fsyncs may never have run. Absent: the
        directory alone."""
        opened = self.open_parent(path, create=False)
        if opened is None:
            return
        dir_fd, leaf = opened
        try:
            try:
                fd = os.open(leaf, READ_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                fd = None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self.escape(path, "it is a symlink") from None
                raise
            try:
                if fd is not None:
                    self.ops.tick("ws-fsync")
                    os.fsync(fd)
            finally:
                if fd is not None:
                    os.close(fd)
            self.ops.tick("ws-dirfsync")
            os.fsync(dir_fd)
        except OSError as exc:
            raise StorageFailure(os.path.join(self.root, path), os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)

    def dirs_below(self, path: str, limit: int = 10_000) -> tuple[list[str], bool]:
        """(the directory at `path` and every directory under it, reached as `open_dir`
        does, no symlink followed; whether they hold nothing else — no file, no link).
        ([], True) when `path` is no directory; at most `limit` directories (more: not
        only directories, as far as this says)."""
        out: list[str] = []
        only = True
        stack = [path]
        while stack:
            if len(out) >= limit:
                return out, False
            rel = stack.pop()
            try:
                fd = self.open_dir_fd(rel)
            except (LedgerError, OSError):
                return out, False
            if fd is None:
                if rel != path:
                    only = False  # went between the listing and the look
                continue
            out.append(rel)
            try:
                for e in os.scandir(fd):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(f"{rel}/{e.name}")
                    else:
                        only = False
            except OSError:
                only = False
            finally:
                os.close(fd)
        return out, only

    def remove_empty_dirs(self, path: str) -> bool:
        """Remove the directory at `path` and the directories under it when they hold
        nothing else, deepest first, each only while it is empty — rmdir never takes a
        byte: a file put into one meanwhile keeps it and the directories above it. A
        tree holding anything else is left whole. True when nothing is left at `path`."""
        dirs, only = self.dirs_below(path)
        if not only:
            return False
        for rel in sorted(dirs, key=lambda d: d.count("/"), reverse=True):
            parent, _, leaf = rel.rpartition("/")
            try:
                fd = self.open_dir_fd(parent)
            except (LedgerError, OSError):
                return False
            if fd is None:
                return False
            try:
                if not self.mover().rmdir(fd, leaf):
                    return False
                os.fsync(fd)
            finally:
                os.close(fd)
        return True

    # -- what the modules beside this one use ------------------------------------------

    def mover(self) -> Mover:
        """The verified primitive (`moves.Mover`), its kept names stamped with this
        handle's attempt."""
        return Mover(self.ops, self.tag)

    def held_parent(self, path: str, *, check: bool = True, create: bool = False
                    ) -> tuple[int, str] | None:
        """(descriptor of `path`'s directory, leaf), the caller closes it. The directory
        is the one this object first reached for it (held since: staging or the first
        landing), never found again by name: a directory a person renamed or moved while
        the step ran is still the one its files went to. `check`: that held directory
        must still be at its name (a landing never goes into a directory moved away:
        `DirectoryMoved`, naming where it is now). None: missing (not `create`)."""
        self.check_path(path)
        d, _, leaf = path.rpartition("/")
        held = self.held_dirs.get(d)
        if held is None:
            opened = self.open_parent(path, create=create)
            if opened is None:
                return None
            fd = opened[0]
            self.held_dirs[d] = (os.dup(fd), identity_of(os.fstat(fd)))
            return fd, leaf
        if check:
            try:
                fresh = self.open_dir_fd(d)
            except PathEscapes:
                fresh = None
            try:
                now = None if fresh is None else identity_of(os.fstat(fresh))
            finally:
                if fresh is not None:
                    os.close(fresh)
            if now != held[1]:
                raise DirectoryMoved(path, d, self.where_now(held[0]))
        fd = os.dup(held[0])
        try:
            self.check_leaf(fd, leaf, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, leaf

    def where_now(self, fd: int) -> str | None:
        """Where a held directory is now, relative to the root (None: not known, or
        outside it)."""
        with contextlib.suppress(OSError):
            real = os.readlink(f"/proc/self/fd/{fd}")
            if real == self.root or real.startswith(self.root + "/"):
                return os.path.relpath(real, self.root)
        return None

    def slot(self, path: str, role: str) -> str:
        """The name, beside `path`, of this attempt's write to it in `role` under this
        object's epoch (``x``: a write's staged post-image, which after the exchange
        holds the displaced bytes; ``y``: the displaced bytes' name where there is no
        exchange call; ``u``: an undo's). The same in every call, so what a crashed
        call left is found again (`landed`). It has a temporary's shape: only the
        attempt's own apply, settle or undo removes it while the attempt is in flight."""
        leaf = path.rsplit("/", 1)[-1]
        return temp_name(leaf, self.epoch, self.tag, names.name_max(self.root), slot=role)


class DirectoryMoved(Exception):
    """The directory a step's path lies in is not at its name any more (renamed or
    moved while the step ran): nothing is landed there. `now`: where it went, relative
    to the root (None: not known, or out of the workspace)."""

    def __init__(self, path: str, directory: str, now: str | None) -> None:
        super().__init__(path, directory, now)
        self.path, self.directory, self.now = path, directory, now


def chmod_at(dir_fd: int, name: str, mode: int,
             only: FileIdentity | None = None) -> None:
    """chmod the file at `name` (never through a symlink; a FIFO is not waited on):
    only a regular file — and, given `only`, only that inode."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and (only is None or identity_of(st) == only):
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def mode_of(leaf: str, dir_fd: int) -> int | None:
    """The permission bits of the regular file `leaf` (None: absent or not a file)."""
    try:
        st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) & MODE_BITS if stat.S_ISREG(st.st_mode) else None


__all__ = ["MODE_BITS", "DirectoryMoved", "WorkspaceDir", "chmod_at", "mode_of"]

"""A workspace directory on disk: confined reads, staged writes, renames, fsyncs.

Every path is relative to the workspace root and opened one component at a time
relative to its parent's descriptor, with ``O_NOFOLLOW``: a symlink anywhere below
the root — a directory or the file itself — is refused (PathEscapes), so a step can
never write outside its workspace. The root is stored resolved, so it is reached the
same way from ``/`` (no component may be a symlink), and must be the directory it was
registered as: the same device and inode (`identity`); otherwise WorkspaceMoved.

A `Boundary` names what no step may touch even inside the root: the ledger's own
directories (checked by device and inode for every directory the walk passes
through, the root included) and files (checked for the leaf), and — unless the
workspace opted in — any ``.git`` component. The same walk serves apply, compensate,
settle, restore and snapshot, so a check at admit cannot be raced past.

Nothing here holds a file whole: `hash` reads in bounded pieces, `open` hands out a
descriptor, and `stage` writes its content piece by piece (from bytes or an iterable of
them, such as a blob store's `chunks`).

A write is staged first (`stage`: a temporary file beside its target, written and
fsynced, outside the ledger's write lock) and made visible later (`install`: rename
over the target, fsync the directory) under the lock. A staged file gets the mode the
file ends with (see `stage`): an edited file keeps its permission bits, a created one
follows the umask. A temporary's name carries the epoch and the attempt that staged
it (`temp_name`), so the one that left it behind in a crash is recognised and removed
later (`remove_temporaries`) — never a live stager's, never a user's file.

Every operation goes through `FileOps` (the blob store's seam), so tests inject faults
and the crash harness kills the process at an exact operation: ``ws-write``,
``ws-fsync``, ``ws-rename``, ``ws-dirfsync``, ``ws-unlink``, ``ws-mkdir``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from . import exchange
from .moves import ABSENT, ANY_FILE, NOT_A_FILE, Mover, Seen, UnsafeFallbackRefused, look, stat_at
from ..blobs import FileOps, fd_chunks, hash_chunks
from ..errors import (
    AccessDenied,
    InvalidInput,
    LedgerError,
    PathEscapes,
    PathForbidden,
    StorageFailure,
    UnsafeRename,
    WorkspaceMoved,
    WorkspaceOverlap,
)
from ..events import check_relpath

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The root's ancestors are only passed through: O_PATH needs search permission, not read.
_PASS_FLAGS: Final = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Code points HFS+ ignores in names (git's is_hfs_dotgit): ".gi\u200ct" is ".git" there.
_HFS_IGNORED: Final = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F),
                                     *range(0x206A, 0x2070), 0xFEFF])
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TMP_MARK: Final = ".steptrail-"
#: Bytes of the target's name a temporary's name repeats (for a person reading a
#: listing); the rest of the name is the mark, the stamp and the random part.
TMP_PREFIX_BYTES_MAX: Final = 80
#: A staged temporary: ``.<name prefix>.steptrail-<epoch hex>-<attempt tag>-<random>.tmp``.
#: ``.<name prefix>.steptrail-<12 hex>.tmp`` is what steptrail before modes and stamps
#: left (epoch 0: dead under any live epoch).
_TMP_NAME: Final = re.compile(
    r"\..*\.steptrail-(?:([0-9a-f]{1,16})-([0-9a-f]{8})-[0-9a-f]{8}|[0-9a-f]{12})\.tmp",
    re.DOTALL)
#: The permission bits a staged file takes over (setuid, setgid and sticky are not:
#: the kernel drops setuid/setgid too when an unprivileged process writes a file).
MODE_BITS: Final = 0o777


def attempt_tag(step: str, attempt: int) -> str:
    """The 8 hex digits that name an attempt in its temporaries' names."""
    return hashlib.sha256(f"{step}\0{attempt}".encode()).hexdigest()[:8]


def temp_name(leaf: str, epoch: int, tag: str, name_max: int = 255,
              slot: str | None = None) -> str:
    """A temporary's name beside `leaf`, at most `name_max` bytes: the leaf is cut (at a
    character boundary) to what the budget leaves after the stamp. Fresh (random) unless
    `slot` is given: then the same (leaf, epoch, attempt, slot) always gives the same name
    — a fenced write's journal on disk (`WorkspaceDir.slot`)."""
    tail = secrets.token_hex(4) if slot is None else \
        hashlib.sha256(f"{slot}\0{leaf}".encode()).hexdigest()[:8]
    suffix = f"{TMP_MARK}{epoch:x}-{tag}-{tail}.tmp"
    budget = min(TMP_PREFIX_BYTES_MAX, name_max - 1 - len(suffix))
    prefix = leaf.encode()[:max(budget, 0)].decode("utf-8", "ignore")
    return f".{prefix}{suffix}"


#: The roles of slot names (`WorkspaceDir.slot`): a fixed name per (path, epoch, attempt,
#: role). ``t`` is a take-back's: where it moves the step's own file aside to check it.
SLOT_ROLES: Final = "xyut"


def is_scratch(name: str) -> bool:
    """True for a temporary `temp_name` made with a fresh random tail (a stager's own
    scratch copy: only ever written by its stager, from bytes the ledger holds), False
    for a slot (`WorkspaceDir.slot`: it may hold what a move displaced) — or a name too
    long to tell (its leaf cut short): judged as a slot, by its content."""
    m = _TMP_NAME.fullmatch(name)
    if m is None or m.group(1) is None:
        return False
    leaf = name[1:].split(TMP_MARK, 1)[0]
    if len(leaf.encode()) >= TMP_PREFIX_BYTES_MAX - 4:
        return False
    tail = name[-12:-4]
    return all(tail != hashlib.sha256(f"{r}\0{leaf}".encode()).hexdigest()[:8]
               for r in SLOT_ROLES)


def temp_stamp(name: str) -> tuple[int, str] | None:
    """(epoch, attempt tag) of a name `temp_name` made; None for any other name."""
    m = _TMP_NAME.fullmatch(name)
    if m is None:
        return None
    return (0, "") if m.group(1) is None else (int(m.group(1), 16), m.group(2))


FileIdentity = tuple[int, int]  # (st_dev, st_ino)


def _same_file(st: os.stat_result | None, other: os.stat_result) -> bool:
    return st is not None and identity_of(st) == identity_of(other)


def identity_of(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino)


#: The directory a ledger lives in by default (`.steptrail/ledger.db`).
LEDGER_DIR_NAME: Final = ".steptrail"


def is_ledger_dir_name(name: str) -> bool:
    """True for a path component that names a ledger's default directory (any case, the
    same normalisation as `is_git_name`)."""
    return name.translate(_HFS_IGNORED).rstrip(". ").casefold() == LEDGER_DIR_NAME


def is_git_name(name: str) -> bool:
    """True for a path component git would read as ``.git``: any case, HFS+-ignored code
    points removed, NTFS trailing dots and spaces stripped."""
    return name.translate(_HFS_IGNORED).rstrip(". ").casefold() == ".git"


@dataclass(frozen=True)
class Boundary:
    """What no step may touch inside any workspace: the ledger's own files.

    `dirs`: identities of directories no walk enters and no root is — the ledger's
    directory (the ledger file, its ``-wal``/``-shm``/``-lockq``, the GC lock) and the
    blob root; `stores`: identities of directories no root lies inside (the blob root);
    `leaves`: identities of files never opened (the ledger file, the witness);
    `dir_paths`/`leaf_paths`: their resolved paths, so that one not created yet (a
    witness made on first use) is refused by name as well. A root below the ledger's
    directory but outside the blob root reaches none of them (the ledger's files are
    direct entries of its directory) and is allowed: `ledger.db` beside `ws/`.
    """

    dirs: frozenset[FileIdentity] = frozenset()
    stores: frozenset[FileIdentity] = frozenset()
    leaves: frozenset[FileIdentity] = frozenset()
    dir_paths: tuple[str, ...] = ()
    leaf_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, ledger_dir: str | None, blob_root: str | None, files: list[str]) -> Boundary:
        """The boundary of a ledger (missing paths count by name only; a ledger in a
        database has no directory or blob root here: None)."""
        if ledger_dir is None or blob_root is None:
            return cls(frozenset(), frozenset(), frozenset(
                identity_of(os.stat(p)) for p in files if os.path.exists(p)),
                (), tuple(os.path.realpath(p) for p in files))
        def ids(paths: list[str]) -> frozenset[FileIdentity]:
            out = set()
            for p in paths:
                with contextlib.suppress(OSError):
                    out.add(identity_of(os.stat(p)))
            return frozenset(out)

        return cls(ids([ledger_dir, blob_root]), ids([blob_root]), ids(files),
                   (os.path.realpath(ledger_dir), os.path.realpath(blob_root)),
                   tuple(os.path.realpath(p) for p in files))

    def names(self, root: str, path: str) -> str | None:
        """The boundary path inside `root` that `root/path` equals or lies under, if any
        (case-insensitively: a case-insensitive file system reaches it under any case)."""
        inside = root.rstrip("/").casefold() + "/"
        target = (inside + path).casefold()
        for p in self.dir_paths + self.leaf_paths:
            q = p.casefold()
            if q.startswith(inside) and (target == q or target.startswith(q + "/")):
                return p
        return None


_LEDGER_FIX: Final = ("steps never write the ledger's own files; keep the ledger outside the"
                      " paths steps write (its default place, .steptrail/ at the workspace"
                      " root, is such a place)")


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
        #: the root's name still names that directory (`_open_root`).
        self._root: tuple[int, FileIdentity] | None = None
        #: Directory (relative path) -> (descriptor, identity), held from the first time
        #: this object reached it: every later move in it goes through this descriptor,
        #: never a walk by name (`_held_parent`).
        self._held: dict[str, tuple[int, FileIdentity]] = {}
        self._walked: dict[str, tuple[FileIdentity, frozenset[str]]] | None = None
        #: The attempt's planned paths, when known: a search for a directory moved after
        #: a kill matches the planned directories gone from their names to the
        #: directories holding their slots (`_moved_dirs_found`).
        self.planned: frozenset[str] = frozenset()
        self._moved_to: dict[str, str | None] | None = None
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
        held, self._held = getattr(self, "_held", {}), {}
        for fd, _ in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- descriptors -------------------------------------------------------------------

    def _escape(self, path: str, why: str) -> PathEscapes:
        return PathEscapes(self.name, path, why)

    def _open_root(self) -> int:
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
        os.close(self._open_root())

    def _check_dir(self, fd: int, shown: str, path: str) -> None:
        """Refuse to enter a directory of the boundary (the ledger's own)."""
        if self.boundary.dirs and identity_of(os.fstat(fd)) in self.boundary.dirs:
            raise PathForbidden(self.name, path, f"{shown} is the ledger's own directory",
                                _LEDGER_FIX)

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
                                " own", _LEDGER_FIX)
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
            opened = self._open_parent(path, create=False)
            if opened is not None:
                os.close(opened[0])

    def _open_parent(self, path: str, *, create: bool) -> tuple[int, str] | None:
        """(descriptor of the path's parent directory, leaf name); None when a parent is
        missing and not `create`. The caller closes the descriptor."""
        self.check_path(path)
        parts = path.split("/")
        fd = self._walk(path, parts[:-1], create=create)
        if fd is None:
            return None
        try:
            self._check_leaf(fd, parts[-1], path)
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
        fd = self._dir_fd(path)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def has_dir(self, path: str) -> bool:
        """True when `path` ("": the root) names a directory, reached as `open_dir` does
        (a symlink or a file on the way: False)."""
        try:
            fd = self._dir_fd(path)
        except (LedgerError, OSError):
            return False
        if fd is not None:
            os.close(fd)
        return fd is not None

    def _dir_fd(self, path: str) -> int | None:
        """`open_dir`'s descriptor, owned by the caller (None: missing)."""
        if path in ("", "."):
            return self._open_root()
        self.check_path(path)
        return self._walk(path, path.split("/"), create=False)

    def _walk(self, path: str, parts: list[str], *, create: bool) -> int | None:
        """The descriptor of the directory `parts` names below the root (created when
        missing and `create`; None when missing otherwise), every component checked."""
        fd = self._open_root()
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
                        raise self._escape(path, f"{'/'.join(parts[: i + 1])!r} is a symlink"
                                           " or not a directory") from None
                    raise
                os.close(fd)
                fd = child
                self._check_dir(fd, os.path.join(self.root, *parts[: i + 1]), path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_leaf(self, dir_fd: int, leaf: str, path: str) -> None:
        """Refuse a leaf that is one of the ledger's own files or directories."""
        if not (self.boundary.leaves or self.boundary.dirs):
            return
        try:
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if identity_of(st) in self.boundary.leaves | self.boundary.dirs:
            raise PathForbidden(self.name, path, "it is one of the ledger's own files",
                                _LEDGER_FIX)

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
        opened = self._open_parent(path, create=False)
        if opened is None:
            yield None
            return
        dir_fd, leaf = opened
        try:
            try:
                fd = os.open(leaf if name is None else name, _READ_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                fd = None
            except OSError as exc:
                if not strict:
                    fd = None
                elif exc.errno == errno.ELOOP:
                    raise self._escape(path, "it is a symlink") from None
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
                    raise self._escape(path, "it is not a regular file")
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

    # -- writing -----------------------------------------------------------------------

    def stage(self, path: str, data: bytes | Iterable[bytes], *, mode: int | None = None,
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
            opened = self._held_parent(path, check=False, create=make_dirs)
        except DirectoryMoved as moved:
            self.staging_moved[path] = moved
            raise
        except OSError as exc:
            raise self._storage(path, exc) from None
        if opened is None:
            # (`make_dirs` False: an edit's directory, gone since the plan — renamed or
            # moved by a person — is never made again)
            moved = DirectoryMoved(path, path.rpartition("/")[0], None)
            self.staging_moved[path] = moved
            raise moved
        dir_fd, leaf = opened
        mover = self._mover()
        # Written under a fresh name, then renamed to the slot once whole and fsynced: a
        # slot holds a complete post-image or, after the exchange, the displaced bytes —
        # never a copy cut short by a kill (`landed` tells the two apart by content).
        tmp = temp_name(leaf, self.epoch, self.tag, _name_max(dir_fd))
        final_name = tmp if slot is None else self.slot(path, slot)
        h = hashlib.sha256()
        size = 0
        mine: tuple[int, int] | None = None
        try:
            pre_mode = _mode_of(leaf, dir_fd)
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
                        self.ops.tick("ws-write")
                        view = view[os.write(fd, view):]
                self.ops.tick("ws-fsync")
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
                    self.kept.append((path, kept))
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
                raise UnsafeRename(os.path.join(self.root, path)) from None
            if isinstance(exc, OSError):
                raise self._storage(path, exc) from None
            raise
        finally:
            os.close(dir_fd)
        return Staged(path, final_name, h.hexdigest(), size, final, pre_mode,
                      follows_target=mode is None and pre_mode is not None, identity=mine)

    def _storage(self, path: str, exc: OSError) -> LedgerError:
        """The typed error for an OSError on `path`: a name too long for the file system
        is bad input (it will never fit); anything else the environment's failure."""
        if exc.errno == errno.ENAMETOOLONG:
            return InvalidInput(f"{path[:80]!r} has a name too long for the file system under"
                                f" {self.root}; plan a shorter name")
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            where = os.path.dirname(os.path.join(self.root, path))
            why = "a read-only file system" if exc.errno == errno.EROFS else \
                "this user may not write there"
            return AccessDenied(where, why, "make the workspace writable by this user (or"
                                " run as its owner), then apply again", readers_work=False)
        return StorageFailure(os.path.join(self.root, path), os.strerror(exc.errno or 0))

    def check_fits(self, path: str) -> None:
        """Refuse (InvalidInput) a path with a component longer than the workspace's file
        system holds (NAME_MAX: 255 bytes on most, less on some, e.g. eCryptfs)."""
        limit = _name_max(self.root)
        for part in path.split("/"):
            if len(part.encode()) > limit:
                raise InvalidInput(f"{path[:80]!r} has a component of {len(part.encode())} bytes;"
                                   f" the file system under workspace {self.name!r} holds at"
                                   f" most {limit}: plan a shorter name")

    def mode(self, path: str, name: str | None = None) -> int | None:
        """The permission bits of the regular file at `path` — or of `name` beside it (a
        slot) — None: absent, or not a regular file."""
        opened = self._open_parent(path, create=False)
        if opened is None:
            return None
        dir_fd, leaf = opened
        try:
            return _mode_of(leaf if name is None else name, dir_fd)
        finally:
            os.close(dir_fd)

    def remove_temporaries(self, dirs: Iterable[str], dead: Callable[[int, str], bool],
                           keep: Callable[[], frozenset[tuple[str, str]]] = frozenset,
                           held: Callable[[str], bool] | None = None) -> int:
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
        Best effort: a directory that is missing or not a plain directory is skipped.
        Returns how many files went (kept ones not counted)."""
        removed = 0
        kept: frozenset[tuple[str, str]] | None = None
        for d in sorted(set(dirs)):
            try:
                dir_fd = self._dir_fd(d)
            except (LedgerError, OSError):
                continue
            if dir_fd is None:
                continue
            here = 0
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
                    mover = Mover(self.ops, stamp[1] or "0" * 8)  # (a name from before tags)
                    leaf = _leaf_of_temp(name)
                    if is_scratch(name) and st.st_nlink == 1:
                        # a dead stager's own copy, whole or cut short by a kill: no move
                        # ever gives such a name to bytes it did not write itself
                        mover.drop_own(dir_fd, name, identity_of(st))
                        here += 1
                        continue
                    beside = look(dir_fd, leaf) if leaf else ABSENT

                    def ours(digest: str, beside: Seen = beside) -> bool:
                        return digest == beside.digest or (held is not None and held(digest))

                    if mover.drop(dir_fd, name, held=ours, keep_for=leaf or None) is None:
                        here += 1
                    else:
                        self.kept.append((os.path.join(d, leaf) if d else leaf, name))
                if here:
                    self.ops.tick("ws-dirfsync")
                    os.fsync(dir_fd)
                removed += here
            except OSError:
                continue
            finally:
                os.close(dir_fd)
        return removed

    def sync(self, path: str) -> None:
        """Make the file's bytes and its name durable (fsync it and its directory): for a
        write found already on disk, whose own fsyncs may never have run. Absent: the
        directory alone."""
        opened = self._open_parent(path, create=False)
        if opened is None:
            return
        dir_fd, leaf = opened
        try:
            try:
                fd = os.open(leaf, _READ_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                fd = None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._escape(path, "it is a symlink") from None
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

    def discard(self, staged: Staged) -> None:
        """Remove a staged file that will not be installed, once it is shown to hold the
        staged bytes (best effort: a parent that is gone or became a symlink leaves it to
        `remove_temporaries`; a file that is not the staged one is kept visible)."""
        opened = self._held_parent(staged.path, check=False)
        if opened is None:
            return
        dir_fd, leaf = opened
        try:
            kept = self._mover().drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                                      keep_for=leaf)
            if kept is not None:
                self.kept.append((staged.path, kept))
        except OSError:
            pass
        finally:
            os.close(dir_fd)

    def remove_created_dirs(self) -> None:
        """Remove the directories this object created that are still empty, deepest
        first, from the descriptors held since they were made (best effort: a directory
        something was put in since stays; one a person moved is left where it went)."""
        while self.created_dirs:
            rel = self.created_dirs.pop()
            parent, _, leaf = rel.rpartition("/")
            held = self._held.get(parent)
            try:
                fd = os.dup(held[0]) if held is not None else self._dir_fd(parent)
            except (LedgerError, OSError):
                continue
            if fd is None:
                continue
            try:
                mine = self._held.get(rel)
                st = stat_at(fd, leaf)
                if mine is not None and (st is None or identity_of(st) != mine[1]):
                    continue  # not the directory this object made (moved, replaced)
                if self._mover().rmdir(fd, leaf):
                    os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    # -- fenced writes: exchange, then verify --------------------------------------------

    def _mover(self) -> Mover:
        return Mover(self.ops, self.tag)

    def _held_parent(self, path: str, *, check: bool = True, create: bool = False
                     ) -> tuple[int, str] | None:
        """(descriptor of `path`'s directory, leaf), the caller closes it. The directory
        is the one this object first reached for it (held since: staging or the first
        landing), never found again by name: a directory a person renamed or moved while
        the step ran is still the one its files went to. `check`: that held directory
        must still be at its name (a landing never goes into a directory moved away:
        `DirectoryMoved`, naming where it is now). None: missing (not `create`)."""
        self.check_path(path)
        d, _, leaf = path.rpartition("/")
        held = self._held.get(d)
        if held is None:
            opened = self._open_parent(path, create=create)
            if opened is None:
                return None
            fd = opened[0]
            self._held[d] = (os.dup(fd), identity_of(os.fstat(fd)))
            return fd, leaf
        if check:
            try:
                fresh = self._dir_fd(d)
            except PathEscapes:
                fresh = None
            try:
                now = None if fresh is None else identity_of(os.fstat(fresh))
            finally:
                if fresh is not None:
                    os.close(fresh)
            if now != held[1]:
                raise DirectoryMoved(path, d, self._where(held[0]))
        fd = os.dup(held[0])
        try:
            self._check_leaf(fd, leaf, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, leaf

    def _where(self, fd: int) -> str | None:
        """Where a held directory is now, relative to the root (None: not known, or
        outside it)."""
        with contextlib.suppress(OSError):
            real = os.readlink(f"/proc/self/fd/{fd}")
            if real == self.root or real.startswith(self.root + "/"):
                return os.path.relpath(real, self.root)
        return None

    def _trash(self, path: str, dir_fd: int, post: str) -> str:
        """The take-back's slot (``t``) beside `path`, cleared first: what a crashed
        take-back left there goes only once it is shown to be the step's own bytes or
        held by the ledger — here, the displaced file it was about to put back is kept
        visible otherwise (`Mover.drop`)."""
        trash = self.slot(path, "t")
        leaf = path.rpartition("/")[2]
        kept = self._mover().drop(dir_fd, trash, keep_for=leaf, expect=frozenset({post}))
        if kept is not None:
            self.kept.append((path, kept))
        return trash

    def slot(self, path: str, role: str) -> str:
        """The name, beside `path`, of this attempt's write to it in `role` under this
        object's epoch (``x``: a write's staged post-image, which after the exchange
        holds the displaced bytes; ``y``: the displaced bytes' name where there is no
        exchange call; ``u``: an undo's). The same in every call, so what a crashed
        call left is found again (`landed`). It has a temporary's shape: only the
        attempt's own apply, settle or undo removes it while the attempt is in flight."""
        leaf = path.rsplit("/", 1)[-1]
        return temp_name(leaf, self.epoch, self.tag, _name_max(self.root), slot=role)

    def land(self, path: str, staged: Staged | None, expect: str | None, *,
             check: bool = True, role: str = "x") -> Landing:
        """Put one write in place atomically and verify what it displaced (`moves`).

        `staged` None deletes: the file is moved aside (to its `slot`) without replacing
        anything, then hashed. Otherwise `expect` None creates: the staged file is
        hard-linked to the target, which fails if anything holds the name. Otherwise the
        staged file and the target are exchanged (one system call) and the displaced
        bytes, now under the staged name, are hashed. Unless they are `expect` (the
        planned pre-image; anything when not `check`) the move is undone on the spot and
        the Landing says ``ok=False`` with what was found: a person's save made at any
        moment before is never overwritten, and one made between the move and its undo
        is kept under a visible name (`Landing.kept`).

        Where the system has no exchange call the target is moved aside, hashed there,
        and the staged file linked in: the name is absent between the two, and a file a
        person makes in that moment wins (the write is refused).

        The directory is the one held since staging (`_held_parent`): if it was renamed
        or moved since, nothing is written and the Landing says where it went (`moved`).
        The displaced bytes stay under the slot name (`Landing.displaced`) until `release`
        — after the ledger recorded the write — so a crash at any point leaves each
        path's before and after on disk, for `landed` to find. Directories are not
        fsynced here (`sync_dirs`, once per directory, before the commit).
        """
        try:
            opened = self._held_parent(path, create=staged is not None)
        except DirectoryMoved as moved:
            return Landing(path, False, None, None, moved=moved.now or "")
        if opened is None:  # a delete whose directory is gone: nothing there to delete
            return Landing(path, False, None, None)
        dir_fd, leaf = opened
        try:
            if staged is None:
                return self._land_delete(dir_fd, leaf, path, expect, check, role)
            if expect is None and check:
                return self._land_create(dir_fd, leaf, path, staged)
            return self._land_exchange(dir_fd, leaf, path, staged, expect, check)
        except UnsafeFallbackRefused:
            raise UnsafeRename(os.path.join(self.root, path)) from None
        except OSError as exc:
            raise StorageFailure(os.path.join(self.root, path),
                                 os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)

    def _land_create(self, dir_fd: int, leaf: str, path: str, staged: Staged) -> Landing:
        mover = self._mover()
        if not mover.link(dir_fd, staged.tmp_name, leaf):
            return Landing(path, False, look(dir_fd, leaf).digest, None)
        linked = stat_at(dir_fd, staged.tmp_name) is not None
        return Landing(path, True, None, staged.tmp_name if linked else None,
                       post_mode=staged.mode, post=staged.digest)

    def _land_delete(self, dir_fd: int, leaf: str, path: str, expect: str | None,
                     check: bool, role: str) -> Landing:
        aside = self.slot(path, role)
        mover = self._mover()
        # a slot left by a crashed call of this attempt was judged by the caller
        mover.drop(dir_fd, aside, expect=frozenset({expect} - {None}), keep_for=leaf)
        move = mover.aside(dir_fd, leaf, aside, expect if check else ANY_FILE)
        if move.verdict == "absent":
            return Landing(path, False, None, None)
        if not move.ok:
            return Landing(path, False, move.found, None, kept=move.kept)
        return Landing(path, True, move.seen.digest, aside, pre_mode=_mode_of(aside, dir_fd),
                       seen=move.seen)

    def _land_exchange(self, dir_fd: int, leaf: str, path: str, staged: Staged,
                       expect: str | None, check: bool) -> Landing:
        st = stat_at(dir_fd, leaf)
        if st is not None and staged.follows_target and stat.S_ISREG(st.st_mode) \
                and stat.S_IMODE(st.st_mode) & MODE_BITS != staged.mode:
            _chmod_at(dir_fd, staged.tmp_name, stat.S_IMODE(st.st_mode) & MODE_BITS)
            staged.mode = staged.pre_mode = stat.S_IMODE(st.st_mode) & MODE_BITS
        if st is None:
            if check:
                return Landing(path, False, None, None)
            return self._land_create(dir_fd, leaf, path, staged)  # fence "none": created
        want = expect if check else ANY_FILE
        mover = self._mover()
        ours = stat_at(dir_fd, staged.tmp_name)
        if mover.can_exchange():
            try:
                move = mover.exchange(dir_fd, leaf, staged.tmp_name, want, staged.digest)
            except FileNotFoundError:
                return Landing(path, False, None, None)
            except exchange.Unsupported:
                pass
            else:
                if not move.ok:
                    return Landing(path, False, move.found, None, kept=move.kept)
                self._follow_chmod(dir_fd, leaf, staged.tmp_name, staged, ours)
                return Landing(path, True, move.seen.digest, staged.tmp_name,
                               pre_mode=_mode_of(staged.tmp_name, dir_fd),
                               post_mode=staged.mode, seen=move.seen, post=staged.digest)
        # No exchange here: the target moved aside and checked, then the staged file
        # linked in (the name is absent in between: a file made then wins).
        aside = self.slot(path, "y")
        mover.drop(dir_fd, aside, expect=frozenset({expect} - {None}), keep_for=leaf)
        move = mover.aside(dir_fd, leaf, aside, want)
        if move.verdict == "absent":
            return Landing(path, False, None, None)
        if not move.ok:
            return Landing(path, False, move.found, None, kept=move.kept)
        try:
            linked = mover.link(dir_fd, staged.tmp_name, leaf)
        except FileNotFoundError:
            linked = False  # the staged name gone: finished by another call, or lost
        if not linked and ours is not None and _same_file(stat_at(dir_fd, leaf), ours) \
                and look(dir_fd, leaf).digest == staged.digest:
            # another call finished this landing in the moment between the two
            # (`finish_aside`: a settle under a newer epoch, meeting it half done,
            # linked the staged file in): landed, the name holding the staged file
            return Landing(path, True, move.seen.digest, aside,
                           pre_mode=_mode_of(aside, dir_fd), post_mode=staged.mode,
                           seen=move.seen, post=staged.digest)
        if not linked:
            # a file made in the moment the name was absent (or the staged file
            # removed under it): it stays; what was moved aside (the pre-image) is
            # kept beside it, visible
            found = look(dir_fd, leaf).digest
            kept = mover.keep(dir_fd, aside, leaf)
            return Landing(path, False, found, None, kept=kept)
        self._follow_chmod(dir_fd, leaf, aside, staged, ours)
        # the staged name stays a second link of the file now at the name until the
        # ledger recorded the write (`release`)
        return Landing(path, True, move.seen.digest, aside,
                       pre_mode=_mode_of(aside, dir_fd), post_mode=staged.mode,
                       seen=move.seen, post=staged.digest, link=staged.tmp_name)

    def _follow_chmod(self, dir_fd: int, leaf: str, gone: str, staged: Staged,
                      ours: os.stat_result | None) -> None:
        """An edit keeps its file's bits: a chmod made between the check before the
        landing and the move (the file now hidden as `gone` has bits other than the
        staged file's) is carried to the step's file at the name — that inode only."""
        if not staged.follows_target or ours is None:
            return
        theirs = _mode_of(gone, dir_fd)
        if theirs is None or theirs == staged.mode:
            return
        with contextlib.suppress(OSError):
            _chmod_at(dir_fd, leaf, theirs, only=identity_of(ours))
            staged.mode = staged.pre_mode = theirs

    def unland(self, landing: Landing, post: str | None) -> TakeBack:
        """Take back a write this call landed (a later path of the step conflicted):
        the displaced file goes back only if the path still holds what was put there
        (`post`), each move verified (`moves`). Otherwise the path is left as found —
        a save made after the write landed is kept — and what the write displaced is
        kept under a visible name (`TakeBack.kept`), never removed."""
        if landing.displaced is None:
            if landing.ok and landing.post is not None and post is not None:
                return self._take_back_unlinked_create(landing.path, post)
            return TakeBack(landing.path, True, None)
        return self._take_back(landing.path, landing.displaced, post, landing.found,
                               landed=True, post_mode=landing.post_mode)

    def _take_back_unlinked_create(self, path: str, post: str) -> TakeBack:
        """Take back a create made by renaming (a file system without hard links: no
        second name was left): the file goes aside, checked, then away."""
        opened = self._held_parent(path, check=False)
        if opened is None:
            return TakeBack(path, False, None, error="its directory is gone")
        dir_fd, leaf = opened
        mover = self._mover()
        try:
            trash = self._trash(path, dir_fd, post)
            move = mover.aside(dir_fd, leaf, trash, post)
            if move.verdict == "absent":
                return TakeBack(path, True, None)
            if not move.ok:
                return TakeBack(path, False, move.found, kept=move.kept)
            return TakeBack(path, True, None, kept=mover.drop(dir_fd, trash, move.seen,
                                                              keep_for=leaf))
        except OSError as exc:
            return TakeBack(path, False, None, error=os.strerror(exc.errno or 0))
        finally:
            os.close(dir_fd)

    def roll_back(self, found: Found, post: str | None, *,
                  displaced_stored: bool = False, post_mode: int | None = None) -> TakeBack:
        """Undo a crashed call's landed write (`landed`): the displaced bytes go back
        where they were, only if the path still holds what the write put there. Otherwise
        nothing of the path is touched (a conflict for a human) and what the write
        displaced is kept under a visible name — or, when the caller stores it in the
        transaction that records this (`displaced_stored`), left in its slot, collected
        (verified) once that has committed. `post_mode`: the bits the write gave its
        file (None: those of the file it replaced); a person's chmod of the step's file
        since is carried over to the file put back, never undone."""
        if found.slot is None:
            return TakeBack(found.path, True, None)
        return self._take_back(found.path, found.slot, post, found.displaced, landed=False,
                               stored=displaced_stored, post_mode=post_mode)

    def _take_back(self, path: str, displaced: str, post: str | None, pre: str | None, *,
                   landed: bool, stored: bool = False, post_mode: int | None = None
                   ) -> TakeBack:
        try:
            opened = self._held_parent(path, check=False)
        except (LedgerError, OSError) as exc:
            return TakeBack(path, False, None, error=str(exc))
        if opened is None:
            return TakeBack(path, False, None, error="its directory is gone")
        dir_fd, leaf = opened
        where = None
        d = path.rpartition("/")[0]
        if d in self._held:
            now = self._where(dir_fd)
            if now is not None and now != (d or "."):
                where = now
        try:
            back = self._unland(dir_fd, leaf, path, displaced, post, pre, landed, stored,
                                post_mode)
        except UnsafeFallbackRefused as exc:
            back = TakeBack(path, False, None, error=exc.strerror or "")
        except OSError as exc:
            back = TakeBack(path, False, None, error=os.strerror(exc.errno or 0))
        finally:
            os.close(dir_fd)
        return back if where is None else dataclasses.replace(back, moved=where)

    def _unland(self, dir_fd: int, leaf: str, path: str, displaced: str, post: str | None,
                pre: str | None, landed: bool, stored: bool = False,
                post_mode: int | None = None) -> TakeBack:
        mover = self._mover()

        def keep_displaced() -> str | None:
            """What the write displaced, when it cannot go back: visible — or, stored by
            the caller's transaction, left in its slot for the collection after it."""
            return None if stored else mover.keep(dir_fd, displaced, leaf)

        here = stat_at(dir_fd, leaf)
        there = stat_at(dir_fd, displaced)
        if there is None:
            return TakeBack(path, False, look(dir_fd, leaf).digest,
                            error="what the write displaced is gone")
        if post_mode is None and pre is not None and stat.S_ISREG(there.st_mode):
            # a crashed call's write with no mode of its own: its staged file took the
            # bits of the file it replaced — the ones the displaced file still has
            post_mode = stat.S_IMODE(there.st_mode) & MODE_BITS
        if post is None:  # a delete: its file goes back from aside, over nothing
            if mover.put(dir_fd, displaced, leaf):
                return TakeBack(path, True, pre)
            now = look(dir_fd, leaf).digest
            return TakeBack(path, False, now, kept=keep_displaced())
        if here is not None and identity_of(here) == identity_of(there):  # a create's link
            trash = self._trash(path, dir_fd, post)
            move = mover.aside(dir_fd, leaf, trash, post)
            if move.ok:
                mover.drop(dir_fd, displaced, twin=trash, expect=frozenset({post}),
                           keep_for=leaf)
                kept = mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
                return TakeBack(path, True, None, kept=kept)
            if move.verdict == "absent":  # deleted since: as it was before the step
                mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
                return TakeBack(path, True, None)
            # not the step's file any more: left as found; the step's own copy goes
            kept = mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
            return TakeBack(path, False, move.found, kept=move.kept or kept)
        if pre is None:  # a create whose link is gone: nothing of the step at the path
            mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
            return TakeBack(path, False, look(dir_fd, leaf).digest)
        if here is None:
            staged = self.slot(path, "x")
            if not landed and displaced != staged and look(dir_fd, staged).digest == post:
                # the fallback stopped between moving the file aside and linking the
                # new one in: the name was never given the step's bytes
                if mover.put(dir_fd, displaced, leaf):
                    mover.drop(dir_fd, staged, expect=frozenset({post}), keep_for=leaf)
                    return TakeBack(path, True, pre)
            # deleted since the write landed: stays deleted; the displaced file is kept
            return TakeBack(path, False, None, kept=keep_displaced())
        if mover.can_exchange():
            try:
                move = mover.exchange(dir_fd, leaf, displaced, post, pre or "")
            except exchange.Unsupported:
                pass
            else:
                if move.ok:  # the step's bytes are in the slot now, checked
                    self._keep_persons_mode(dir_fd, leaf, displaced, post_mode,
                                            identity_of(there))
                    kept = mover.drop(dir_fd, displaced, move.seen, keep_for=leaf)
                    return TakeBack(path, True, pre, kept=kept)
                kept = move.kept or keep_displaced()
                return TakeBack(path, False, look(dir_fd, leaf).digest, kept=kept)
        trash = self._trash(path, dir_fd, post)
        move = mover.aside(dir_fd, leaf, trash, post)
        if not move.ok:
            kept = move.kept if move.kept else keep_displaced()
            return TakeBack(path, False, look(dir_fd, leaf).digest, kept=kept)
        if not mover.put(dir_fd, displaced, leaf):
            # a file made while the name was absent: it stays, the pre-image beside it
            now = look(dir_fd, leaf).digest
            kept = keep_displaced()
            mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
            return TakeBack(path, False, now, kept=kept)
        self._keep_persons_mode(dir_fd, leaf, trash, post_mode, identity_of(there))
        kept = mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
        return TakeBack(path, True, pre, kept=kept)

    def finish_aside(self, path: str, role: str) -> bool:
        """Finish a landing the fallback (no exchange call) began and a kill stopped
        between moving the file aside (to the ``y`` slot) and linking the staged one (the
        `role` slot) in: the name is absent then, and gets the staged file, never over
        anything. True when that was done."""
        opened = self._open_parent(path, create=False)
        if opened is None:
            return False
        dir_fd, leaf = opened
        try:
            staged, aside = self.slot(path, role), self.slot(path, "y")
            if stat_at(dir_fd, leaf) is not None or stat_at(dir_fd, aside) is None:
                return False
            st = stat_at(dir_fd, staged)
            if st is None or not stat.S_ISREG(st.st_mode):
                return False
            mover = self._mover()
            if not mover.link(dir_fd, staged, leaf):
                return False
            mover.drop(dir_fd, staged, twin=leaf)
            return True
        except OSError:
            return False
        finally:
            os.close(dir_fd)

    def _keep_persons_mode(self, dir_fd: int, leaf: str, gone: str,
                           step_mode: int | None, only: FileIdentity | None = None) -> None:
        """A take-back or an undo replaced the step's file (now `gone`, hidden) with what
        was there before: if a person had chmodded the step's file since (its mode is
        not the one the step gave it, `step_mode`), the file at the name takes that mode
        — a person's chmod is kept, never undone."""
        if step_mode is None:
            return
        theirs = _mode_of(gone, dir_fd)
        here = _mode_of(leaf, dir_fd)  # None: not a regular file (a person's directory)
        if theirs is not None and theirs != step_mode and here is not None and here != theirs:
            with contextlib.suppress(OSError):  # (`only`: the file put back, no later save)
                _chmod_at(dir_fd, leaf, theirs, only=only)

    def keep_persons_mode(self, path: str, gone: str | None, step_mode: int | None,
                          only: FileIdentity | None = None) -> int | None:
        """After an undo's landing (slot `gone` beside `path` holds the step's file it
        displaced): keep a person's chmod of it on the file put back
        (`_keep_persons_mode`); returns the file's mode now."""
        if gone is None:
            return None
        opened = self._held_parent(path, check=False)
        if opened is None:
            return None
        dir_fd, leaf = opened
        try:
            self._keep_persons_mode(dir_fd, leaf, gone, step_mode, only)
            return _mode_of(leaf, dir_fd)
        finally:
            os.close(dir_fd)

    def landed(self, path: str, pre: str | None, post: str | None, role: str = "x", *,
               search: bool = False, mode: int | None = None) -> Found:
        """What a crashed call of this attempt left of its write to `path` (planned from
        `pre` to `post`): whether the write landed, and what it displaced.

        Read from the names alone: a modify landed when its slot (another inode than the
        path's) holds anything but `post` — a slot is only ever the whole staged
        post-image or, after the exchange, the displaced bytes; a create when the path
        and its slot are one inode (the link); a delete when its slot exists and the path
        does not hold that same inode. `Found.now` says what the path holds now (a
        person may have changed it since). Anything else did not land. `search`: a
        settle's — look for the directory where a person moved it (`_found_parent`).
        `mode`: the bits the write sets, when the plan gives them (a mode change)."""
        # the slots that are evidence of this write (a create's link is in its role's
        # slot only; what an edit or a delete displaced may be in ``y`` too): a search
        # looks for these alone (a move's source and destination share a leaf)
        evidence = {self.slot(path, role)} | ({self.slot(path, "y")} if pre is not None
                                              else set())
        opened = self._found_parent(path, search, evidence)
        if opened is None:
            return Found(path, False, None, None, None)
        dir_fd, leaf = opened
        try:
            here = stat_at(dir_fd, leaf)
            now = look(dir_fd, leaf).digest
            aside = self.slot(path, "y")
            if here is None and pre is not None and post is not None \
                    and stat_at(dir_fd, aside) is not None \
                    and stat_at(dir_fd, self.slot(path, role)) is not None:
                # the fallback cut between its move aside and its link: the name is
                # absent, the file it held aside (even when its bytes are the post-image's:
                # a mode change)
                return Found(path, True, None, aside, look(dir_fd, aside).digest)
            for name in (self.slot(path, role), aside):
                there = stat_at(dir_fd, name)
                if there is not None and not stat.S_ISREG(there.st_mode) \
                        and pre is not None and (now == post or here is None):
                    # what a person had put at the name — a directory, a symlink —
                    # exchanged (or moved aside) into the slot, and a kill before the
                    # check could swap it back: it landed, displacing that
                    return Found(path, True, now, name, NOT_A_FILE)
                if there is None or not stat.S_ISREG(there.st_mode):
                    continue
                same = here is not None and identity_of(here) == identity_of(there)
                if post is None:
                    if not same:
                        return Found(path, True, now, name, look(dir_fd, name).digest)
                elif pre is None:
                    if same:
                        return Found(path, True, now, name, None)
                elif not same:
                    # the slot held the whole staged post-image until the exchange: any
                    # other content there is what the exchange displaced (the path may
                    # have changed again since: `now` says what it holds)
                    displaced = look(dir_fd, name).digest
                    if displaced != post or (pre == post and mode is not None
                                             and _mode_of(name, dir_fd) != mode):
                        # (a mode change, `mode` the bits it sets: the same bytes in
                        # the slot, with other bits, are the file it displaced)
                        return Found(path, True, now, name, displaced)
            return Found(path, False, now, None, None)
        finally:
            os.close(dir_fd)

    def _found_parent(self, path: str, search: bool, names: set[str]
                      ) -> tuple[int, str] | None:
        """`path`'s directory for reading what a crashed call left there: the one held
        already; else the one at its name (held from then on when it holds `path`'s
        slots `names`); else, with `search` (a settle after a kill, never a first apply)
        and only when no directory has that name any more — a directory a person renamed
        or moved after the kill (``git mv src lib``), which a new process cannot follow
        by a held descriptor — where `_moved_dirs_found` says it went, held from then on,
        so the take-back happens inside it and says where it went (`TakeBack.moved`)."""
        d, _, leaf = path.rpartition("/")
        if d in self._held:
            return self._held_parent(path, check=False)
        opened = self._open_parent(path, create=False)
        if opened is not None and any(stat_at(opened[0], n) is not None for n in names):
            # held from here: the take-back goes where its evidence is, even if the
            # directory is renamed in between
            self._held[d] = (os.dup(opened[0]), identity_of(os.fstat(opened[0])))
        if opened is not None or not search:
            return opened
        rel = self._moved_dirs_found().get(d)
        if rel is None:
            return None
        try:
            fd = self._dir_fd(rel)
        except (LedgerError, OSError):
            return None
        if fd is None:
            return None
        self._held[d] = (os.dup(fd), identity_of(os.fstat(fd)))
        return fd, leaf

    def _moved_dirs_found(self) -> dict[str, str | None]:
        """Each planned directory gone from its name -> where it is now (None: not
        found, or not told apart). One walk (`_attempt_dirs`) gives the directories
        holding this attempt's names; a directory's score for a planned one is how many
        of the slot names of its planned paths it holds (a slot's name comes from the
        leaf alone: a move's source and destination share one, so a single name does
        not tell). Pairs are taken best score first, each directory and each planned
        one at most once; a tie between two unmatched pairs sharing either is not
        guessed (a ``cp -a`` of the moved directory: its slots are given visible names
        in both copies, `_keep_slots`). A directory that is a planned one at its own
        name is never a candidate."""
        if self._moved_to is not None:
            return self._moved_to
        planned_dirs = {p.rpartition("/")[0] for p in self.planned}
        gone = sorted(x for x in planned_dirs if not self.has_dir(x))
        out: dict[str, str | None] = {x: None for x in gone}
        self._moved_to = out
        if not gone:
            return out
        at_names = set()
        for x in planned_dirs - set(gone):
            with contextlib.suppress(LedgerError, OSError):
                fd = self._dir_fd(x)
                if fd is not None:
                    at_names.add(identity_of(os.fstat(fd)))
                    os.close(fd)
        wanted = {x: {self.slot(p, r) for p in self.planned if p.rpartition("/")[0] == x
                      for r in SLOT_ROLES} for x in gone}
        pairs = sorted(((len(inside & wanted[x]), rel, x)
                        for rel, (ident, inside) in self._attempt_dirs().items()
                        if ident not in at_names for x in gone if inside & wanted[x]),
                       reverse=True)
        used: set[str] = set()
        for score, rel, x in pairs:
            if rel in used or out[x] is not None or x in used:
                continue
            rivals = [r for r in pairs if r[0] == score and (r[1], r[2]) != (rel, x)
                      and (r[1] == rel or r[2] == x)
                      and r[1] not in used and out[r[2]] is None and r[2] not in used]
            if rivals:
                used.add(x)  # not told apart: nothing guessed; the originals made visible
                for _, r, y in [(score, rel, x), *rivals]:
                    names = sorted(self._attempt_dirs()[r][1] & wanted[y])
                    for leaf in {n[1:].split(TMP_MARK, 1)[0] for n in names}:
                        self._keep_slots(r, [n for n in names
                                             if n[1:].split(TMP_MARK, 1)[0] == leaf], leaf)
                continue
            out[x] = rel
            used.add(rel)
        return out

    def _keep_slots(self, rel: str, names: list[str], leaf: str) -> None:
        """Give the slot files `names` in directory `rel` visible names beside `leaf`
        (`Mover.keep`): nothing is removed."""
        with contextlib.suppress(LedgerError, OSError):
            fd = self._dir_fd(rel)
            if fd is None:
                return
            try:
                for n in names:
                    st = stat_at(fd, n)
                    if st is not None and stat.S_ISREG(st.st_mode):
                        kept = self._mover().keep(fd, n, leaf)
                        self.kept.append((f"{rel}/{leaf}" if rel else leaf, kept))
            finally:
                os.close(fd)

    def moved_dirs(self, *, search: bool = False) -> set[str]:
        """Where the directories this object holds are now (relative), for those no
        longer at the name they were reached by (a settle found them there:
        `_found_parent`), and every directory a search for them saw this attempt's names
        in (`search`: search now): a settle collects its temporaries there too."""
        if search:
            self._attempt_dirs()
        out = set(self._walked or ())  # and any directory a search saw its names in
        for d, (fd, _) in self._held.items():
            now = self._where(fd)
            if now is not None and now != (d or "."):
                out.add(now)
        return out

    def _attempt_dirs(self) -> dict[str, tuple[FileIdentity, frozenset[str]]]:
        """Every directory of the workspace holding a name of this attempt under this
        epoch (relative path -> (identity, those names)): one walk, not following
        symlinks, skipping the ledger's directories and ``.git``; made once per object
        (the settling of one crashed attempt), only when a path's slots are not beside
        it by name."""
        if self._walked is not None:
            return self._walked
        out: dict[str, tuple[FileIdentity, frozenset[str]]] = {}
        with contextlib.suppress(OSError):
            root = self._open_root()
            try:
                for top, dirs, files, fd in os.fwalk(".", dir_fd=root):
                    dirs[:] = [x for x in dirs
                               if not is_ledger_dir_name(x) and not is_git_name(x)]
                    mine = frozenset(n for n in files
                                     if temp_stamp(n) == (self.epoch, self.tag))
                    if mine:
                        rel = os.path.normpath(top)
                        out["" if rel == "." else rel] = (identity_of(os.fstat(fd)), mine)
            finally:
                os.close(root)
        self._walked = out
        return out

    @contextlib.contextmanager
    def open_slot(self, path: str, name: str) -> Iterator[int | None]:
        """A read-only descriptor of slot `name` beside `path` (None: absent, or not a
        regular file): a crashed write's displaced pre-image, on its way into the store.
        Read from the directory held since the landing (wherever it went)."""
        try:
            opened = self._held_parent(path, check=False)
        except (LedgerError, OSError):
            opened = None
        if opened is None:
            yield None
            return
        dir_fd, _ = opened
        try:
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
            except OSError:
                fd = None
        finally:
            os.close(dir_fd)
        if fd is None:
            yield None
            return
        try:
            yield fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)

    def release(self, landings: Iterable[Landing]) -> list[tuple[str, str]]:
        """After the ledger recorded the writes: remove what they displaced (bytes the
        blob store holds now), each only if it is still the file checked at the landing
        (same inode, size and times) — or, for a create, the second link of the file at
        the path, or the step's own bytes. A displaced file written since (a process that
        held it open, such as a logger with O_APPEND) is kept under a visible name:
        returns those (path, kept name). Not fsynced, and best effort: what a crash or a
        failure leaves is a temporary the next apply, settle or gc of the workspace
        collects (verified the same way)."""
        out: list[tuple[str, str]] = []
        for landing in landings:
            if landing.displaced is None:
                continue
            try:
                opened = self._held_parent(landing.path, check=False)
            except (LedgerError, OSError):
                continue
            if opened is None:
                continue
            dir_fd, leaf = opened
            try:
                # the file checked at the landing; a create's link (the path's twin); or
                # the displaced or the step's bytes (a crashed call's landing, found)
                kept = self._mover().drop(
                    dir_fd, landing.displaced, landing.seen, keep_for=leaf,
                    twin=leaf if landing.found is None else None,
                    expect=frozenset({landing.found, landing.post} - {None, NOT_A_FILE}))
                if kept is not None:
                    out.append((landing.path, kept))
                if landing.link is not None:
                    kept = self._mover().drop(dir_fd, landing.link, twin=leaf, keep_for=leaf,
                                              expect=frozenset({landing.post} - {None}))
                    if kept is not None:
                        out.append((landing.path, kept))
            except OSError:
                pass
            finally:
                os.close(dir_fd)
        self.kept.extend(out)
        return out

    def discard_slots(self, path: str, roles: str = "xy",
                      held: Callable[[str], bool] | None = None) -> None:
        """Remove this attempt's leftovers in `path`'s slots (an attempt that is over),
        each only once its bytes are shown to be held by the ledger (`held`) or by the
        path itself; anything else is kept under a visible name."""
        with contextlib.suppress(LedgerError, OSError):
            opened = self._open_parent(path, create=False)
            if opened is None:
                return
            dir_fd, leaf = opened
            try:
                beside = look(dir_fd, leaf).digest
                for role in roles:
                    kept = self._mover().drop(
                        dir_fd, self.slot(path, role), keep_for=leaf,
                        held=lambda d: d == beside or (held is not None and held(d)))
                    if kept is not None:
                        self.kept.append((path, kept))
            finally:
                os.close(dir_fd)

    def sync_dirs(self, paths: Iterable[str]) -> None:
        """fsync the directory of each path once (the one held since the landing): a
        step's renames made durable before the ledger records them."""
        seen: set[str] = set()
        for p in sorted(paths):
            d = p.rpartition("/")[0]
            if d in seen:
                continue
            seen.add(d)
            try:
                opened = self._held_parent(p, check=False)
            except PathEscapes:
                continue
            if opened is None:
                continue
            dir_fd = opened[0]
            try:
                self.ops.tick("ws-dirfsync")
                os.fsync(dir_fd)
            except OSError as exc:
                raise StorageFailure(os.path.join(self.root, d), os.strerror(exc.errno or 0)
                                     ) from None
            finally:
                os.close(dir_fd)

    def put(self, path: str, data: bytes | Iterable[bytes], *,
            mode: int | None = None, replace: bool = False) -> int:
        """Make `path` — absent, or holding these very bytes already (a killed restore's
        output) — hold `data` durably (pieces: see `stage`); returns the file's mode. A
        file of other bytes at the path is never replaced: InvalidInput, nothing lost —
        unless `replace`: then it is first given a visible name beside the path
        (``NAME.steptrail-kept-TAG``, in `kept`: never removed) and the path takes
        `data`. Anything but a regular file there is refused either way."""
        staged = self.stage(path, data, mode=mode)
        opened = self._held_parent(path, check=False)
        assert opened is not None
        dir_fd, leaf = opened
        mover = self._mover()
        try:
            there = stat_at(dir_fd, leaf)
            if replace and there is not None:
                if not stat.S_ISREG(there.st_mode):
                    mover.drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                               keep_for=leaf)
                    raise InvalidInput(f"{os.path.join(self.root, path)} is not a regular"
                                       " file; a restore replaces files only: move it away,"
                                       " then run again")
                if look(dir_fd, leaf).digest != staged.digest:
                    self.kept.append((path, mover.keep(dir_fd, leaf, leaf)))
            if not mover.put(dir_fd, staged.tmp_name, leaf):
                now = look(dir_fd, leaf)
                mover.drop(dir_fd, staged.tmp_name, expect=frozenset({staged.digest}),
                           keep_for=leaf)
                if now.digest != staged.digest:
                    raise InvalidInput(
                        f"{os.path.join(self.root, path)} appeared while it was being"
                        " written and holds other bytes; it was left as it is: remove it"
                        " or give another directory, then run again")
            self.ops.tick("ws-dirfsync")
            os.fsync(dir_fd)
        except UnsafeFallbackRefused:
            raise UnsafeRename(os.path.join(self.root, path)) from None
        except OSError as exc:
            raise StorageFailure(os.path.join(self.root, path),
                                 os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)
        return staged.mode


class StagingLost(Exception):
    """A staged file removed before it was complete (see `WorkspaceDir.stage`): the
    write has no staged file; the fence decides what that means (StaleEpoch for a
    zombie)."""


class DirectoryMoved(Exception):
    """The directory a step's path lies in is not at its name any more (renamed or
    moved while the step ran): nothing is landed there. `now`: where it went, relative
    to the root (None: not known, or out of the workspace)."""

    def __init__(self, path: str, directory: str, now: str | None) -> None:
        super().__init__(path, directory, now)
        self.path, self.directory, self.now = path, directory, now


@dataclass
class Landing:
    """One write put in place by `WorkspaceDir.land`: `ok`, or refused with what was
    `found` (the digest displaced or in the way; None: absent); `displaced`, the name
    in the path's directory now holding what the write displaced (for a create, a
    second link to the new file), removed by `release` once the ledger recorded it;
    `seen`, that file as it was checked; `kept`, a refused landing's race: a file it
    could not put back, under this visible name beside the path; `moved`, the path's
    directory was moved away before the landing (where it is now; "" unknown)."""

    path: str
    ok: bool
    found: str | None
    displaced: str | None
    pre_mode: int | None = None
    post_mode: int | None = None
    seen: Seen | None = None
    post: str | None = None
    kept: str | None = None
    moved: str | None = None
    link: str | None = None  # the fallback's staged name: a second link of the new file


@dataclass(frozen=True)
class TakeBack:
    """How taking one landed write back ended: `ok` (the path holds what it held before
    the write: `now`), or not (left as found, holding `now`). `kept`: a file put under
    this visible name beside the path (what the write displaced, when it could not go
    back; or a person's save met on the way); `moved`: the path's directory is now at
    this place (a person moved it while the step ran); `error`: why nothing was done."""

    path: str
    ok: bool
    now: str | None
    kept: str | None = None
    moved: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Found:
    """What a crashed call left of one write (`WorkspaceDir.landed`): whether it
    `landed`; `now`, the digest the path holds; `slot`, the name holding what it
    displaced (a create: its link); `displaced`, that content's digest."""

    path: str
    landed: bool
    now: str | None
    slot: str | None
    displaced: str | None


def _leaf_of_temp(name: str) -> str:
    """The target's name a temporary's name repeats (cut, possibly: then not a name)."""
    return name[1:].split(TMP_MARK, 1)[0]


def _chmod_at(dir_fd: int, name: str, mode: int,
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


def _mode_of(leaf: str, dir_fd: int) -> int | None:
    """The permission bits of the regular file `leaf` (None: absent or not a file)."""
    try:
        st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) & MODE_BITS if stat.S_ISREG(st.st_mode) else None


def _name_max(where: int | str) -> int:
    """NAME_MAX of the file system holding a directory (a descriptor or a path); 255
    when the system does not say."""
    try:
        limit = os.fpathconf(where, "PC_NAME_MAX") if isinstance(where, int) else \
            os.pathconf(where, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
    return limit if limit > 0 else 255


__all__ = ["NOT_A_FILE", "TMP_MARK", "Boundary", "DirectoryMoved", "FileIdentity", "Found",
           "Landing", "Staged", "StagingLost", "TakeBack",
           "WorkspaceDir", "attempt_tag",
           "identity_of", "is_git_name", "temp_name", "temp_stamp"]

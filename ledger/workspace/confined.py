"""A workspace directory as tools may walk it: `Confined` (``ledger.workspaces.confined``).

The workspace protocol reads and writes files (`Workspaces.read_file`, steps); listing a
directory, walking a tree, searching, a directory's metadata and creating an empty
directory are done here, under the same boundary rules the protocol applies to a file
(the same `Boundary`, the same walk from the root: `WorkspaceDir.open_dir`):

- the root is reached from ``/`` one component at a time without following a symlink
  and must be the directory the workspace was registered as (device and inode);
- below it every directory is opened relative to its parent with ``O_NOFOLLOW``: a
  symlink is never followed (a listing shows it as a symlink, a walk does not enter it,
  a path through one is refused);
- the ledger's own directory (by device and inode, whatever its name), the ledger file,
  its witness and ``.git`` (any case, unless the workspace allows git) are never listed,
  entered, or created into; steptrail's own temporaries are not listed;
- every walk is bounded (entries scanned, entries returned, depth, time), so a huge tree
  answers with a truncated result instead of hanging or filling memory.

The MCP server's file tools are built on it; so can any harness's.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ..errors import LedgerError
from .boundary import Boundary, identity_of, is_git_name
from .directory import WorkspaceDir
from .moves import Mover

#: A subdirectory entered during a bounded walk, relative to its confined parent.
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: steptrail's staged temporaries: ``.<name>.steptrail-<stamp>.tmp``.
_TEMP_NAME: Final = re.compile(r"^\..*\.steptrail-[0-9a-f-]+\.tmp$")
_BAD_CHARS: Final = re.compile(r"[\x00-\x1f\x7f\\]")


class FsRefused(Exception):
    """A path or operation the boundary refuses; the message is one line for the agent."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@dataclass
class Entry:
    path: str  # relative to the workspace root ('' is the root)
    name: str
    kind: str  # file, directory, symlink, other
    size: int = 0
    mtime_ns: int = 0


@dataclass
class Walk:
    """The result of a bounded walk: what was found and whether a bound stopped it;
    `hidden`, the paths left out (the ledger's, .git, temporaries, names that are not
    UTF-8: a name no tool can pass back is not shown)."""

    entries: list[Entry] = field(default_factory=list)
    truncated: bool = False
    why: str = ""
    hidden: list[str] = field(default_factory=list)


def _kind(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "other"


#: As the ledger bounds every path a step may name (events.PATH_MAX, NAME_MAX).
PATH_MAX: Final = 4096
NAME_MAX: Final = 255


def check_rel(rel: str) -> list[str]:
    """The components of a workspace-relative path ('' for the root), refusing what no
    plain relative path holds — the same bounds a write's path has: at most 4096
    characters, components of at most 255 bytes, valid UTF-8. (`..` never gets here:
    the path layer refuses it.)"""
    if rel == "":
        return []
    if _BAD_CHARS.search(rel):
        raise FsRefused(f"path {rel!r} contains a control character or backslash; use '/'"
                        " separators")
    if len(rel) > PATH_MAX:
        raise FsRefused(f"path of {len(rel)} characters is too long; the limit is {PATH_MAX}")
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise FsRefused(f"path {rel!r} is not valid UTF-8 text (a lone surrogate)") from None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise FsRefused(f"path {rel!r} is not a plain relative path")
    for p in parts:
        if len(p.encode("utf-8")) > NAME_MAX:
            raise FsRefused(f"path {rel!r}: a component of {len(p.encode())} bytes is too long;"
                            f" the limit is {NAME_MAX}")
    return parts


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Confined:
    """One workspace directory, walked without following symlinks (see the module): the
    protocol's own confined directory (`WorkspaceDir`) does every walk from the
    root; this adds what the tools need on top — listings, bounded walks, searches,
    ``mkdir -p`` — and turns a refusal into one line for the agent."""

    def __init__(self, wsdir: WorkspaceDir, boundary: Boundary, *, allow_git: bool) -> None:
        self.wsdir, self.boundary, self.allow_git = wsdir, boundary, allow_git
        self.name, self.root = wsdir.name, wsdir.root
        self._own = boundary.dirs | boundary.leaves  # the ledger's, by identity

    def hides(self, name: str, st: os.stat_result | None) -> bool:
        """Whether an entry is kept out of every listing: ``.git`` (unless the workspace
        allows it), steptrail's temporaries, the ledger's own files and directories."""
        if name.isascii() and not name.startswith("."):
            # (the common case, fast: an ASCII name git reads as .git, or a temporary's,
            # starts with a dot; the code points HFS+ ignores are not ASCII)
            return st is not None and identity_of(st) in self._own
        if not self.allow_git and is_git_name(name):
            return True
        if _TEMP_NAME.match(name):
            return True
        return st is not None and identity_of(st) in self._own

    # -- descriptors ----------------------------------------------------------------------

    def _check_names(self, rel: str) -> list[str]:
        parts = check_rel(rel)
        if parts and self.boundary.names(self.root, rel):
            raise FsRefused(f"path {rel!r} is the ledger's own: out of the agent's reach")
        return parts

    def _refuse_component(self, rel: str, part: str, st: os.stat_result | None) -> None:
        if not self.allow_git and is_git_name(part):
            raise FsRefused(f"path {rel!r} is .git or inside it: git's internals are out of"
                            " the agent's reach")
        if st is not None and identity_of(st) in self._own:
            raise FsRefused(f"path {rel!r} is the ledger's own: out of the agent's reach")

    @contextlib.contextmanager
    def open_dir(self, rel: str) -> Iterator[int]:
        """A descriptor of the directory at `rel` (the root for ''), reached by the
        library's walk (`WorkspaceDir.open_dir`): every component opened without
        following symlinks and checked against the boundary."""
        parts = self._check_names(rel)
        for part in parts:
            self._refuse_component(rel, part, None)
        try:
            opening = self.wsdir.open_dir("/".join(parts))
            fd = opening.__enter__()
        except LedgerError as exc:
            raise FsRefused(_one_line(exc)) from None
        try:
            if fd is None:
                raise FsRefused(f"{rel!r} does not exist")
            yield fd
        finally:
            opening.__exit__(None, None, None)

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry at `rel` itself (a symlink is not followed); None when absent."""
        parts = self._check_names(rel)
        if not parts:
            with self.open_dir("") as fd:
                return os.fstat(fd)
        try:
            with self.open_dir("/".join(parts[:-1])) as fd:
                try:
                    st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return None
        except FsRefused as exc:
            if "does not exist" in str(exc):
                return None
            raise
        self._refuse_component(rel, parts[-1], st)
        return st

    # -- listings -------------------------------------------------------------------------

    def _scan(self, fd: int, base: str, max_scan: int,
              hidden: list[str] | None = None) -> tuple[list[Entry], bool]:
        """The visible entries of the open directory `fd`, sorted by name; at most
        `max_scan` are read (True: more were there). What is left out goes to `hidden`."""
        out: list[Entry] = []
        more = False
        with os.scandir(fd) as it:
            for n, de in enumerate(it):
                if n >= max_scan:
                    more = True
                    break
                try:
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                path = f"{base}/{de.name}" if base else de.name
                if self.hides(de.name, st) or not _utf8(de.name):
                    if hidden is not None:
                        hidden.append(path)
                    continue
                out.append(Entry(path, de.name, _kind(st), st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                 st.st_mtime_ns))
        out.sort(key=lambda e: e.name)
        return out, more

    def list_dir(self, rel: str, *, max_entries: int) -> Walk:
        hidden: list[str] = []
        with self.open_dir(rel) as fd:
            entries, more = self._scan(fd, rel, max_entries * 4, hidden)
        walk = Walk(entries[:max_entries], hidden=hidden)
        if more or len(entries) > max_entries:
            walk.truncated, walk.why = True, f"more than {max_entries} entries"
        return walk

    def walk(self, rel: str, *, max_entries: int, max_depth: int, max_scan: int,
             deadline_s: float, exclude: list[str] | None = None) -> Walk:
        """Entries below `rel`, depth first in name order (a directory before its
        contents), never entering a symlink or a hidden directory; bounded."""
        walk = Walk()
        scanned = 0
        stop = time.monotonic() + deadline_s
        patterns = exclude or []

        def excluded(path: str, name: str) -> bool:
            return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p)
                       or glob_match(path, p) for p in patterns)

        def visit(fd: int, base: str, depth: int) -> bool:
            nonlocal scanned
            entries, more = self._scan(fd, base, max_scan - scanned + 1, walk.hidden)
            scanned += len(entries)
            if more or scanned > max_scan:
                walk.truncated, walk.why = True, f"more than {max_scan} entries scanned"
                return False
            for e in entries:
                if time.monotonic() > stop:
                    walk.truncated, walk.why = True, f"took longer than {deadline_s:g}s"
                    return False
                if excluded(e.path, e.name):
                    continue
                if len(walk.entries) >= max_entries:
                    walk.truncated, walk.why = True, f"more than {max_entries} entries"
                    return False
                walk.entries.append(e)
                if e.kind == "directory" and depth < max_depth:
                    try:
                        child = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue  # swapped for a symlink, gone, unreadable: not entered
                    try:
                        if identity_of(os.fstat(child)) in self.boundary.dirs:
                            continue
                        if not visit(child, e.path, depth + 1):
                            return False
                    finally:
                        os.close(child)
                elif e.kind == "directory":
                    walk.truncated, walk.why = True, f"deeper than {max_depth} levels"
            return True

        with self.open_dir(rel) as fd:
            visit(fd, rel, 1)
        return walk

    # -- the one write: an empty directory ------------------------------------------------

    def mkdir(self, rel: str) -> list[str]:
        """Create the directory at `rel` and any missing parents (like ``mkdir -p``),
        each created in its parent as the library's walk reaches it (no symlink
        followed). Returns the directories created (none: it was there already)."""
        parts = self._check_names(rel)
        created: list[str] = []
        for i, part in enumerate(parts):
            shown = "/".join(parts[: i + 1])
            self._refuse_component(rel, part, None)
            with self.open_dir("/".join(parts[:i])) as fd:
                try:
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is None:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                        created.append(shown)
                        os.fsync(fd)
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                self._refuse_component(rel, part, st)
                if stat.S_ISLNK(st.st_mode):
                    raise FsRefused(f"{shown!r} is a symlink; symlinks are not followed")
                if not stat.S_ISDIR(st.st_mode):
                    raise FsRefused(f"{shown!r} exists and is not a directory")
        if parts:
            with self.open_dir(rel):  # what was made is reachable, and not the ledger's
                pass
        return created

    def rmdir_empty(self, rel: str) -> bool:
        """Remove the directory at `rel` if it is empty (never anything else)."""
        parts = check_rel(rel)
        if not parts:
            return False
        try:
            with self.open_dir("/".join(parts[:-1])) as fd:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    return False
                if not Mover(self.wsdir.ops, "rmdir").rmdir(fd, parts[-1]):
                    return False
                os.fsync(fd)
                return True
        except (OSError, FsRefused):
            return False

    def chmod_file(self, rel: str, mode: int) -> None:
        """Set the permission bits of the regular file at `rel` (no symlink followed)."""
        parts = check_rel(rel)
        with self.open_dir("/".join(parts[:-1])) as dfd:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fchmod(fd, stat.S_IMODE(mode))
            finally:
                os.close(fd)


def glob_match(path: str, pattern: str) -> bool:
    """Whether the relative `path` matches the glob `pattern`: ``*``, ``?`` and ``[...]``
    stay inside one component, a ``**`` component spans any number of them; a pattern
    without ``/`` matches the last component (``*.py`` finds every Python file).

    Matched component by component (`fnmatch`, which does not backtrack without bound)
    over a table of (pattern component, path component) pairs: no agent-written pattern
    can make it take longer than that table, whatever its stars."""
    if "/" not in pattern and "**" not in pattern:
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    pat = [p for p in pattern.split("/") if p]
    parts = [p for p in path.split("/") if p]
    # reach[j]: the pattern so far can match the first j path components
    reach = [True] + [False] * len(parts)
    for p in pat:
        if p == "**":
            first = next((j for j, r in enumerate(reach) if r), None)
            reach = [first is not None and j >= first for j in range(len(parts) + 1)]
            continue
        reach = [False] + [reach[j - 1] and fnmatch.fnmatchcase(parts[j - 1], p)
                           for j in range(1, len(parts) + 1)]
        if not any(reach):
            return False
    return reach[-1]

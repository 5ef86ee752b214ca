"""A workspace directory on disk: confined reads, staged writes, renames, fsyncs.

Every path is relative to the workspace root and opened one component at a time
relative to its parent's descriptor, with ``O_NOFOLLOW``: a symlink anywhere below
the root — a directory or the file itself — is refused (PathEscapes), so a step can
never write outside its workspace. The root itself may be reached through symlinks
(the user chose it).

A write is staged first (`stage`: a temporary file beside its target, written and
fsynced, outside the ledger's write lock) and made visible later (`install`: rename
over the target, fsync the directory) under the lock. Every operation goes through
`FileOps` (the blob store's seam), so tests inject faults and the crash harness
kills the process at an exact operation: ``ws-write``, ``ws-fsync``, ``ws-rename``,
``ws-dirfsync``, ``ws-unlink``, ``ws-mkdir``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Final

from .blobs import FileOps, digest_of
from .errors import InvalidInput, PathEscapes, StorageFailure
from .events import check_relpath

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TMP_MARK: Final = ".stepledger-"
READ_MAX: Final = 1 << 30


@dataclass
class Staged:
    """A temporary file holding a write's new content, durable, not yet visible."""

    path: str
    tmp_name: str
    digest: str
    size: int


class WorkspaceDir:
    """The files of one workspace, below `root`."""

    def __init__(self, name: str, root: str, ops: FileOps | None = None) -> None:
        self.name = name
        self.root = os.path.normpath(root)
        self.ops = ops or FileOps()
        #: Directories this object created (relative paths, in creation order), so that a
        #: refused apply can take them back (`remove_created_dirs`).
        self.created_dirs: list[str] = []

    # -- descriptors -------------------------------------------------------------------

    def _escape(self, path: str, why: str) -> PathEscapes:
        return PathEscapes(self.name, path, why)

    def _open_root(self) -> int:
        try:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInput(
                f"workspace {self.name!r} directory {self.root} does not exist; recreate it"
                " or restore the workspace"
            ) from None
        except OSError as exc:
            raise StorageFailure(self.root, os.strerror(exc.errno or 0)) from None

    def _open_parent(self, path: str, *, create: bool) -> tuple[int, str] | None:
        """(descriptor of the path's parent directory, leaf name); None when a parent is
        missing and not `create`. The caller closes the descriptor."""
        check_relpath(path)
        parts = path.split("/")
        fd = self._open_root()
        try:
            for i, part in enumerate(parts[:-1]):
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
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._escape(path, f"{'/'.join(parts[: i + 1])!r} is a symlink"
                                           " or not a directory") from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    # -- reading -----------------------------------------------------------------------

    def read(self, path: str) -> bytes | None:
        """The file's current bytes, or None when it does not exist."""
        opened = self._open_parent(path, create=False)
        if opened is None:
            return None
        dir_fd, leaf = opened
        try:
            try:
                fd = os.open(leaf, _READ_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._escape(path, "it is a symlink") from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise self._escape(path, "it is not a regular file")
                if st.st_size > READ_MAX:
                    raise InvalidInput(f"{path} is {st.st_size} bytes; the limit is {READ_MAX}")
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)

    def hash(self, path: str) -> str | None:
        """sha256 of the file's bytes as they are on disk now (None: absent)."""
        data = self.read(path)
        return None if data is None else digest_of(data)

    # -- writing -----------------------------------------------------------------------

    def stage(self, path: str, data: bytes) -> Staged:
        """Write `data` to a fsynced temporary file beside `path` (parents created)."""
        opened = self._open_parent(path, create=True)
        assert opened is not None
        dir_fd, leaf = opened
        tmp = f".{leaf[:80]}{TMP_MARK}{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=dir_fd)
            try:
                view = memoryview(data)
                while view:
                    self.ops.tick("ws-write")
                    view = view[os.write(fd, view):]
                self.ops.tick("ws-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise StorageFailure(os.path.join(self.root, path), os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)
        return Staged(path, tmp, digest_of(data), len(data))

    def install(self, staged: Staged) -> None:
        """Rename a staged file over its target and fsync the directory."""
        opened = self._open_parent(staged.path, create=True)
        assert opened is not None
        dir_fd, leaf = opened
        try:
            try:
                st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise self._escape(staged.path, "it is a symlink or not a regular file")
            self.ops.tick("ws-rename")
            os.rename(staged.tmp_name, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            self.ops.tick("ws-dirfsync")
            os.fsync(dir_fd)
        except OSError as exc:
            raise StorageFailure(os.path.join(self.root, staged.path),
                                 os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)

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
        """Remove a staged file that will not be installed (best effort)."""
        opened = self._open_parent(staged.path, create=False)
        if opened is None:
            return
        dir_fd, _ = opened
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged.tmp_name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def remove_created_dirs(self) -> None:
        """Remove the directories this object created that are still empty, deepest
        first (best effort: a directory something was put in since stays)."""
        while self.created_dirs:
            rel = self.created_dirs.pop()
            parent, _, leaf = rel.rpartition("/")
            try:
                fd = os.open(os.path.join(self.root, parent) if parent else self.root,
                             _DIR_FLAGS)
            except OSError:
                continue
            try:
                os.rmdir(leaf, dir_fd=fd)
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def remove(self, path: str) -> None:
        """Delete the file (a write whose new content is "absent") and fsync its directory."""
        opened = self._open_parent(path, create=False)
        if opened is None:
            return
        dir_fd, leaf = opened
        try:
            try:
                st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISREG(st.st_mode):
                raise self._escape(path, "it is a symlink or not a regular file")
            self.ops.tick("ws-unlink")
            os.unlink(leaf, dir_fd=dir_fd)
            self.ops.tick("ws-dirfsync")
            os.fsync(dir_fd)
        except OSError as exc:
            raise StorageFailure(os.path.join(self.root, path), os.strerror(exc.errno or 0)) from None
        finally:
            os.close(dir_fd)

    def put(self, path: str, data: bytes | None) -> None:
        """Make `path` hold `data` (None: absent) durably: stage + install, or remove."""
        if data is None:
            self.remove(path)
        else:
            self.install(self.stage(path, data))


__all__ = ["TMP_MARK", "Staged", "WorkspaceDir"]

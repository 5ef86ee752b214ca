"""Content-addressed blob files, named by sha256, beside the ledger.

Layout: ``<root>/<first two hex>/<digest>`` for blobs, ``<root>/tmp/`` for files
being written. A put writes a temporary file (``O_CREAT|O_EXCL|O_NOFOLLOW``),
fsyncs it, renames it into place and fsyncs the directory; only then is the blob
durable and may a ledger event name it. Content is never held whole when it need not
be: `put_stream` writes pieces while hashing them and renames only a file whose hash is
the digest it was put under (ContentChanged otherwise); `chunks` reads a blob back in
pieces and checks its hash by the last one.

Nothing here follows a symlink anywhere inside the store: ``O_NOFOLLOW`` guards only
a path's last component, so every directory is opened one component at a time
relative to its parent's descriptor (``dir_fd``). Names that are not 64 lowercase
hex characters are refused before they touch a path. An existing file is never
trusted on the dedup path: its bytes are re-hashed, and a planted file with the
right name and wrong bytes is replaced. A file whose bytes do not hash to its name
is corrupt (BlobCorrupt), never valid.

Every file operation goes through `FileOps`, the fault-injection seam: tests make
it fail with ENOSPC or EIO, and the chaos harness counts operations to kill the
process at an exact one. This module knows nothing of the ledger.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from .errors import (AccessDenied, BlobCorrupt, BlobNotFound, ContentChanged, InvalidInput,
                     StorageFailure)
from .events import check_digest

TMP_DIR: Final = "tmp"
#: A blob file's name: a sha256 in lower-case hex, nothing else.
_DIGEST_NAME: Final = re.compile(r"[0-9a-f]{64}")
TMP_SUFFIX: Final = ".tmp"
CHUNK: Final = 1 << 20
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Blobs are every version of every file a step wrote (a `.env`'s tokens included): their
#: directories are the owner's alone, and a blob file is read-only to its owner.
BLOB_DIR_MODE: Final = 0o700
BLOB_FILE_MODE: Final = 0o400


class FileOps:
    """The file system calls the blob store makes; override to inject faults.

    `on_op(name)` is called before each durable-relevant operation: ``write``,
    ``fsync``, ``rename``, ``dirfsync``, ``unlink``, ``mkdir``. This default calls `os`
    directly; a fault harness hands `BlobStore` its own subclass (this module imports
    none).
    """

    def __init__(self, on_op: Callable[[str], None] | None = None) -> None:
        self.on_op = on_op

    def tick(self, name: str) -> None:
        if self.on_op is not None:
            self.on_op(name)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.tick("write")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.tick("fsync")
        os.fsync(fd)

    def dirfsync(self, fd: int) -> None:
        self.tick("dirfsync")
        os.fsync(fd)

    def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        self.tick("rename")
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, name: str, dir_fd: int) -> None:
        self.tick("unlink")
        os.unlink(name, dir_fd=dir_fd)

    def mkdir(self, name: str, dir_fd: int) -> None:
        self.tick("mkdir")
        os.mkdir(name, BLOB_DIR_MODE, dir_fd=dir_fd)


@dataclass(frozen=True)
class PutResult:
    digest: str
    size: int
    deduped: bool  # an intact file was already there (it was freshened, not rewritten)
    replaced: bool = False  # a file with this name and the wrong bytes was replaced


@dataclass(frozen=True)
class BlobFile:
    digest: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class TempFile:
    name: str
    size: int
    mtime_ns: int


def digest_of(data: bytes | memoryview) -> str:
    """The name of `data` in the blob store: its SHA-256, in hex.

    >>> from ledger import digest_of
    >>> digest_of(b"hello")
    '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824'
    """
    return hashlib.sha256(data).hexdigest()


def put_digest(data: bytes | memoryview, digest: str | None, *, verified: bool) -> str:
    """The name bytes are put under: `digest` when given (checked against the bytes,
    unless the caller has just computed it from these very bytes: `verified`), else
    their sha256. InvalidInput when they differ."""
    if digest is not None and verified:
        return check_digest(digest)
    actual = digest_of(data)
    if digest is not None and check_digest(digest) != actual:
        raise InvalidInput(f"digest {digest} does not match the bytes given ({actual})")
    return actual


class BlobStore:
    """Blob files under `root` (created on first put).

    >>> from ledger import BlobStore, digest_of
    >>> blobs = BlobStore("blobs")
    >>> _ = blobs.put(b"hello")
    >>> blobs.read(digest_of(b"hello"))
    b'hello'
    """

    def __init__(self, root: str | os.PathLike[str], ops: FileOps | None = None) -> None:
        # normalized: with a trailing "/" or "/." the kernel follows a symlinked root
        # even under O_NOFOLLOW
        self.root = os.path.normpath(os.fspath(root))
        self.ops = ops or FileOps()
        # Directories whose entry this instance has made durable. A directory left by a
        # put that died between its mkdir and the parent's fsync is reused as it is, so
        # the first writer to use one in a process fsyncs its parent again.
        self._synced: set[str] = set()

    # -- descriptors -------------------------------------------------------------------

    def _open_root(self, create: bool) -> int | None:
        for _ in range(2):
            try:
                fd = os.open(self.root, _DIR_FLAGS)
                if create and "" not in self._synced:
                    # the root's own entry: its mkdir's parent fsync may have failed or
                    # never run (a crash); the first writer of this instance makes it durable
                    parent = os.open(os.path.dirname(os.path.abspath(self.root)),
                                     os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    try:
                        self.ops.dirfsync(parent)
                    finally:
                        os.close(parent)
                    self._synced.add("")
                return fd
            except FileNotFoundError:
                if not create:
                    return None
                # created through the seam (ops.mkdir) like every other directory
                parent, name = os.path.split(os.path.abspath(self.root))
                parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    with contextlib.suppress(FileExistsError):
                        self.ops.mkdir(name, parent_fd)
                        self.ops.dirfsync(parent_fd)
                        self._synced.add("")
                finally:
                    os.close(parent_fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                raise BlobCorrupt("*", f"the blob store {self.root} is a symlink or not a directory") from None
        raise StorageFailure(self.root, "cannot create the blob store directory")

    def _open_dir(self, parent_fd: int, name: str, create: bool) -> int | None:
        """Open `name` under `parent_fd` without following a symlink; maybe create it."""
        for _ in range(2):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
                if create and name not in self._synced:
                    self.ops.dirfsync(parent_fd)
                    self._synced.add(name)
                return fd
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    self.ops.mkdir(name, parent_fd)
                    self.ops.dirfsync(parent_fd)
                    self._synced.add(name)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise BlobCorrupt(
                        "*", f"{os.path.join(self.root, name)} is a symlink or not a directory;"
                        " the blob store never follows links — remove it"
                    ) from None
                raise
        raise StorageFailure(self.root, f"cannot create directory {name}")

    @contextlib.contextmanager
    def _dirs(self, digest: str, create: bool) -> Iterator[tuple[int, int] | None]:
        """(root fd, fan-out fd) for a digest, or None when absent and not creating."""
        root_fd = self._open_root(create)
        if root_fd is None:
            yield None
            return
        try:
            fan_fd = self._open_dir(root_fd, digest[:2], create)
            if fan_fd is None:
                yield None
                return
            try:
                yield root_fd, fan_fd
            finally:
                os.close(fan_fd)
        finally:
            os.close(root_fd)

    # -- reading -----------------------------------------------------------------------

    def size(self, digest: str) -> int | None:
        """The stored file's size, re-stat'ed now (None: no such blob). Never cached."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            if fds is None:
                return None
            try:
                st = os.stat(digest, dir_fd=fds[1], follow_symlinks=False)
            except FileNotFoundError:
                return None
        if not stat.S_ISREG(st.st_mode):
            raise BlobCorrupt(digest, "it is a symlink or not a regular file")
        return st.st_size

    def stat(self, digest: str) -> BlobFile | None:
        """The stored file's size and mtime, re-stat'ed now (None: no such blob)."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            if fds is None:
                return None
            try:
                st = os.stat(digest, dir_fd=fds[1], follow_symlinks=False)
            except FileNotFoundError:
                return None
        if not stat.S_ISREG(st.st_mode):
            raise BlobCorrupt(digest, "it is a symlink or not a regular file")
        return BlobFile(digest, st.st_size, st.st_mtime_ns)

    def _open_blob(self, fan_fd: int, digest: str) -> int | None:
        try:
            # O_NONBLOCK: a planted FIFO must not block the open (no effect on regular files)
            fd = os.open(
                digest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fan_fd
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BlobCorrupt(digest, "it is a symlink") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BlobCorrupt(digest, "it is not a regular file")
        return fd

    def read(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes:
        """The blob's bytes; its size checked against `size` and, by default, its hash."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            fd = None if fds is None else self._open_blob(fds[1], digest)
            if fd is None:
                raise BlobNotFound(digest)
            try:
                chunks = []
                while chunk := os.read(fd, CHUNK):
                    chunks.append(chunk)
            finally:
                os.close(fd)
        data = b"".join(chunks)
        if size is not None and len(data) != size:
            raise BlobCorrupt(digest, f"it holds {len(data)} bytes, {size} were recorded")
        if verify and digest_of(data) != digest:
            raise BlobCorrupt(digest, "its bytes do not hash to its name")
        return data

    def chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """The blob's bytes in `CHUNK` pieces, for copying it in bounded memory.

        Checked at once (BlobNotFound / BlobCorrupt before any piece when it is missing
        or not a regular file); its size and hash are checked as the last piece is
        read, so a consumer that finishes the iteration has verified content, and one
        stopped by an error (BlobCorrupt) must discard what it wrote.
        """
        if self.size(digest) is None:
            raise BlobNotFound(digest)
        return self._verified_chunks(digest, size)

    def _verified_chunks(self, digest: str, size: int | None) -> Iterator[bytes]:
        h = hashlib.sha256()
        n = 0
        try:
            with self._dirs(digest, create=False) as fds:
                fd = None if fds is None else self._open_blob(fds[1], digest)
                if fd is None:
                    raise BlobNotFound(digest)  # removed since `chunks` looked
                try:
                    while chunk := os.read(fd, CHUNK):
                        h.update(chunk)
                        n += len(chunk)
                        yield chunk
                finally:
                    os.close(fd)
        except OSError as exc:
            raise _storage_error(self.root, exc) from exc
        if size is not None and n != size:
            raise BlobCorrupt(digest, f"it holds {n} bytes, {size} were recorded")
        if h.hexdigest() != digest:
            raise BlobCorrupt(digest, "its bytes do not hash to its name")

    def check(self, digest: str) -> int:
        """Re-hash a stored blob; return its size. BlobNotFound / BlobCorrupt otherwise."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            fd = None if fds is None else self._open_blob(fds[1], digest)
            if fd is None:
                raise BlobNotFound(digest)
            try:
                h, n = _hash_fd(fd)
            finally:
                os.close(fd)
        if h != digest:
            raise BlobCorrupt(digest, "its bytes do not hash to its name")
        return n

    # -- writing -----------------------------------------------------------------------

    def check_writable(self, digest: str) -> None:
        """Refuse, before anything is written or pinned, a put that would have to cross
        a symlink (or a non-directory) at the root, the fan-out or tmp directory: the
        BlobCorrupt `put` would raise. Opens without following links, creates nothing."""
        check_digest(digest)
        root_fd = self._open_root(create=False)
        if root_fd is None:
            return
        try:
            for name in (digest[:2], TMP_DIR):
                fd = self._open_dir(root_fd, name, create=False)
                if fd is not None:
                    os.close(fd)
        finally:
            os.close(root_fd)

    def put(
        self, data: bytes | memoryview, digest: str | None = None, *, verified: bool = False
    ) -> PutResult:
        """Store bytes durably (file fsynced, renamed, directory fsynced); dedup by content.

        `digest`, when given, must be the bytes' sha256 (checked, unless the caller has
        just computed it from these very bytes: `verified=True`). An existing file is
        re-hashed before it is trusted; if it is wrong it is replaced.
        """
        return self._put((data,), put_digest(data, digest, verified=verified), check=False)

    def _put(self, chunks: Iterable[bytes | memoryview], digest: str, *, check: bool) -> PutResult:
        """`put` and `put_stream`: dedup on an intact file, else write (`check`: hash the
        bytes as they are written, see `_write_new`)."""
        self.check_writable(digest)  # refused before any directory is created
        try:
            with self._dirs(digest, create=True) as fds:
                assert fds is not None
                root_fd, fan_fd = fds
                replaced = False
                try:
                    fd = self._open_blob(fan_fd, digest)
                except BlobCorrupt:
                    st = os.stat(digest, dir_fd=fan_fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        raise  # a rename cannot replace a directory: a human must look
                    fd, replaced = None, True  # a symlink, a FIFO: replace the name
                if fd is not None:
                    try:
                        h, n = _hash_fd(fd)
                        if h == digest:
                            os.utime(fd)  # freshen: a dedup hit is a new use
                            # the put that wrote it may have died before its fsyncs:
                            # make file and name durable before reporting success
                            self.ops.fsync(fd)
                            self.ops.dirfsync(fan_fd)
                            return PutResult(digest, n, deduped=True)
                    finally:
                        os.close(fd)
                    replaced = True
                written = self._write_new(root_fd, fan_fd, digest, chunks, check=check)
                return PutResult(digest, written, deduped=False, replaced=replaced)
        except OSError as exc:
            raise _storage_error(self.root, exc) from exc

    def put_stream(self, chunks: Iterable[bytes | memoryview], digest: str) -> PutResult:
        """Store the bytes `chunks` yields, durably, as blob `digest`, in bounded memory.

        The same guarantees as `put`, for content that is never held whole: an intact
        file already named `digest` is a dedup hit (re-hashed, freshened, fsynced) and
        `chunks` is not consumed at all; otherwise they are written to a temporary file
        while being hashed, and the file is renamed into place only when the hash is
        `digest` (ContentChanged, nothing stored, when it is not: the source changed
        since its digest was taken).
        """
        check_digest(digest)
        return self._put(chunks, digest, check=True)

    def put_content(self, content: Content, digest: str) -> PutResult:
        """Store `content` whose digest the caller took (`content_digest`): bytes as
        `put(verified=True)`, a file streamed as `put_stream` (ContentChanged if it
        changed since)."""
        if isinstance(content, bytes):
            return self.put(content, digest, verified=True)
        return self.put_stream(content_chunks(content), digest)

    def put_file(self, path: str | os.PathLike[str]) -> PutResult:
        """Store a file's bytes: hashed in one streaming pass, copied in a second (both
        in `CHUNK` pieces); ContentChanged if it changed in between."""
        with open(path, "rb") as f:
            return self.put_content(f, content_digest(f)[0])

    def _write_new(self, root_fd: int, fan_fd: int, digest: str,
                   chunks: Iterable[bytes | memoryview], *, check: bool) -> int:
        """Write `chunks` to a temporary file, fsync it, rename it to `digest`, fsync the
        directory; return the size. With `check`, the bytes are hashed as they are
        written and nothing is renamed unless they hash to `digest` (ContentChanged)."""
        tmp_fd_dir = self._open_dir(root_fd, TMP_DIR, create=True)
        assert tmp_fd_dir is not None
        name = f"{digest}.{secrets.token_hex(6)}{TMP_SUFFIX}"
        h = hashlib.sha256() if check else None
        size = 0
        try:
            fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                BLOB_FILE_MODE,
                dir_fd=tmp_fd_dir,
            )
            try:
                for chunk in chunks:
                    if h is not None:
                        h.update(chunk)
                    view = memoryview(chunk)
                    size += len(view)
                    while view:
                        written = self.ops.write(fd, view)
                        view = view[written:]
                if h is not None and h.hexdigest() != digest:
                    raise ContentChanged(digest, h.hexdigest())
                self.ops.fsync(fd)
            finally:
                os.close(fd)
            self.ops.rename(name, digest, tmp_fd_dir, fan_fd)
            self.ops.dirfsync(fan_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=tmp_fd_dir)
            raise
        finally:
            os.close(tmp_fd_dir)
        return size

    def delete(self, digest: str) -> bool:
        """Unlink a blob file and fsync its directory; False if it was not there."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            if fds is None:
                return False
            try:
                self.ops.unlink(digest, fds[1])
            except FileNotFoundError:
                return False
            self.ops.dirfsync(fds[1])
            return True

    def sync_absent(self, digest: str) -> None:
        """Make a blob's absence durable (fsync its fan-out directory): before recording a
        collection whose unlink may not have been made durable (an interrupted run)."""
        check_digest(digest)
        with self._dirs(digest, create=False) as fds:
            if fds is not None:
                self.ops.dirfsync(fds[1])

    def delete_temp(self, name: str) -> bool:
        if (not isinstance(name, str) or "/" in name or "\x00" in name
                or not name.endswith(TMP_SUFFIX)):
            raise InvalidInput(f"{name!r} is not a blob-store temporary file name")
        root_fd = self._open_root(create=False)
        if root_fd is None:
            return False
        try:
            tmp_fd = self._open_dir(root_fd, TMP_DIR, create=False)
            if tmp_fd is None:
                return False
            try:
                self.ops.unlink(name, tmp_fd)
                self.ops.dirfsync(tmp_fd)
                return True
            except FileNotFoundError:
                return False
            finally:
                os.close(tmp_fd)
        finally:
            os.close(root_fd)

    # -- scanning ----------------------------------------------------------------------

    def scan(self) -> Iterator[BlobFile]:
        """Every blob file (lstat only, no hashing). Names that are not digests are skipped;
        anything that is not a regular file raises BlobCorrupt."""
        for entries in self._scan_dirs():
            for name, (size, mtime_ns) in entries.items():
                yield BlobFile(name, size, mtime_ns)

    def make_private(self) -> None:
        """Take group and other access off the store's root directory (a store made before
        blobs were private): no other user can reach a blob file through it, whatever the
        file's own mode. Best effort: a root owned by someone else is left as it is."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return  # none yet (created private on first put), or not ours to fix
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o077:
                os.fchmod(fd, mode & ~0o077)
        except OSError:
            pass
        finally:
            os.close(fd)

    def files(self) -> dict[str, tuple[int, int]]:
        """`scan` as one dict, digest -> (size, mtime_ns): what GC and audit walk."""
        out: dict[str, tuple[int, int]] = {}
        for entries in self._scan_dirs():
            out.update(entries)
        return out

    def _scan_dirs(self) -> Iterator[dict[str, tuple[int, int]]]:
        """Per fan-out directory, in name order: its blob files, digest -> (size, mtime)."""
        root_fd = self._open_root(create=False)
        if root_fd is None:
            return
        is_digest, is_reg = _DIGEST_NAME.fullmatch, stat.S_ISREG
        try:
            for entry in sorted(os.listdir(root_fd)):
                if entry == TMP_DIR or len(entry) != 2:
                    continue
                fan_fd = self._open_dir(root_fd, entry, create=False)
                if fan_fd is None:
                    continue
                found: dict[str, tuple[int, int]] = {}
                try:
                    # scandir on the directory's descriptor: each stat is an fstatat
                    # relative to it (no path walk, no symlink followed)
                    with os.scandir(fan_fd) as it:
                        for dent in it:
                            name = dent.name
                            if not name.startswith(entry) or is_digest(name) is None:
                                continue
                            try:
                                st = dent.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue  # unlinked since the listing (a collector, a human)
                            if not is_reg(st.st_mode):
                                raise BlobCorrupt(name, "it is a symlink or not a regular file")
                            found[name] = (st.st_size, st.st_mtime_ns)
                finally:
                    os.close(fan_fd)
                yield found
        finally:
            os.close(root_fd)

    def temp_files(self) -> Iterator[TempFile]:
        """Leftovers of interrupted puts: never blobs, never read as blobs."""
        root_fd = self._open_root(create=False)
        if root_fd is None:
            return
        try:
            tmp_fd = self._open_dir(root_fd, TMP_DIR, create=False)
            if tmp_fd is None:
                return
            try:
                for name in sorted(os.listdir(tmp_fd)):
                    try:
                        st = os.stat(name, dir_fd=tmp_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # a put renamed it into place since the listing
                    if stat.S_ISREG(st.st_mode):  # a directory or a link is not a put's
                        yield TempFile(name, st.st_size, st.st_mtime_ns)
            finally:
                os.close(tmp_fd)
        finally:
            os.close(root_fd)


def _io_errors(method: Callable[..., object]) -> Callable[..., object]:
    """Report an OS failure of a blob-store method as StorageFailure (exit code 3)."""

    @functools.wraps(method)
    def wrapper(self: BlobStore, *args: object, **kwargs: object) -> object:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            raise _storage_error(self.root, exc) from exc

    return wrapper


for _name in ("size", "stat", "read", "check", "delete", "delete_temp", "sync_absent",
              "check_writable"):
    setattr(BlobStore, _name, _io_errors(getattr(BlobStore, _name)))


#: Per thread: called after each chunk `fd_chunks` reads (`pulse_with`).
_PULSE = threading.local()


def pulse_with(fn: Callable[[], None] | None) -> None:
    """Have `fd_chunks` call `fn` after every chunk it reads, on this thread (None: stop).
    A store whose server ends a silent transaction sets it for its write transactions, so
    that long file work inside one (hashing a large file) proves the writer alive."""
    _PULSE.fn = fn


def fd_chunks(fd: int) -> Iterator[bytes]:
    """The bytes of an open descriptor from its offset, in `CHUNK` pieces."""
    while chunk := os.read(fd, CHUNK):
        yield chunk
        beat = getattr(_PULSE, "fn", None)
        if beat is not None:
            beat()


def file_chunks(f: BinaryIO) -> Iterator[bytes]:
    """The bytes of a binary file object from its position, in `CHUNK` pieces."""
    while chunk := f.read(CHUNK):
        yield chunk


def hash_chunks(chunks: Iterable[bytes | memoryview]) -> tuple[str, int]:
    """(sha256 hex, size) of the concatenated chunks, holding one chunk at a time."""
    h = hashlib.sha256()
    n = 0
    for chunk in chunks:
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


#: Content handed to the ledger: bytes, or a binary file object open for reading and
#: seekable, whose whole content (from offset 0) is meant. A file is never held whole:
#: it is hashed in one pass and copied in another (ContentChanged if it changed).
Content = bytes | BinaryIO


def check_content(content: object, what: str) -> None:
    """InvalidInput unless `content` is bytes or a readable, seekable binary file."""
    if isinstance(content, bytes):
        return
    try:
        ok = content.readable() and content.seekable()  # type: ignore[attr-defined]
        ok = ok and not isinstance(content.read(0), str)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        ok = False
    if not ok:
        raise InvalidInput(f"{what} must be bytes or a binary file open for reading (seekable),"
                           f" not {type(content).__name__}")


def content_chunks(content: Content) -> Iterable[bytes]:
    """The content's bytes, in pieces (a file from offset 0, `CHUNK` at a time)."""
    if isinstance(content, bytes):
        return (content,)
    content.seek(0)
    return file_chunks(content)


def content_digest(content: Content) -> tuple[str, int]:
    """(sha256 hex, size) of the content, hashed in bounded memory."""
    if isinstance(content, bytes):
        return digest_of(content), len(content)
    return hash_chunks(content_chunks(content))


def content_bytes(content: Content, digest: str) -> bytes:
    """The content as bytes (for small content only: it is held whole), checked to hash
    to `digest` (ContentChanged when a file changed since it was hashed)."""
    if isinstance(content, bytes):
        return content
    data = b"".join(content_chunks(content))
    if digest_of(data) != digest:
        raise ContentChanged(digest, digest_of(data))
    return data


def _hash_fd(fd: int) -> tuple[str, int]:
    return hash_chunks(fd_chunks(fd))


def _storage_error(root: str, exc: OSError) -> Exception:
    if exc.errno == errno.EROFS:
        return AccessDenied(root, "the blob store is on a read-only file system",
                           "remount it read-write or copy the ledger somewhere writable")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied(root, f"this user may not write the blob store"
                           f" ({exc.filename or root}: {os.strerror(exc.errno)})",
                           "run as the ledger's owner or fix the store's permissions")
    if exc.errno == errno.ENOSPC:
        return StorageFailure(root, "the disk holding the blob store is full (ENOSPC)")
    if exc.errno == errno.EDQUOT:
        return StorageFailure(root, "the disk quota for the blob store is exhausted (EDQUOT)")
    return StorageFailure(root, f"{os.strerror(exc.errno or 0)} ({exc.filename or 'blob store'})")

__all__ = [
    "BlobFile", "BlobStore", "Content", "FileOps", "PutResult", "TempFile", "check_content",
    "content_bytes", "content_chunks", "content_digest", "digest_of", "fd_chunks",
    "file_chunks", "hash_chunks",
]

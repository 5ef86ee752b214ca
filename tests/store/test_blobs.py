"""The content-addressed blob file store (ledger/blobs.py).

Round-trip and layout, verification on read, dedup that never trusts a planted file,
digest names refused before they touch a path, symlinks refused at every level of the
store, crash leftovers in tmp/, the FileOps fault-injection seam, and properties.

Every hostile fixture is shown to be effective first (the planted link resolves, the
naive open would serve it), so a check that passed only because the fixture was
broken cannot pass here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.blobs import CHUNK, BlobStore, FileOps, digest_of
from ledger.errors import (
    EXIT_ENVIRONMENT,
    EXIT_NO,
    EXIT_USAGE,
    BlobCorrupt,
    BlobNotFound,
    ContentChanged,
    InvalidInput,
    StorageFailure,
)

DATA = b"the quick brown fox jumps over the lazy dog\n" * 100
MiB = 1 << 20
OLD_NS = 1_000_000_000 * 1_000_000_000  # 2001-09-09, far in the past


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_path(root: Path, digest: str) -> Path:
    return root / digest[:2] / digest


def listing(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (links not followed): path -> bytes, link target or 'dir'."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


def recorder() -> tuple[FileOps, list[str]]:
    seen: list[str] = []
    return FileOps(on_op=seen.append), seen


def overwrite(path: Path, data: bytes) -> None:
    """Change a blob file's bytes in place (the store makes it read-only)."""
    os.chmod(path, 0o644)
    path.write_bytes(data)


class Hung(Exception):
    """Raised by the alarm when a call blocks (deliberately not an OSError)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise Hung(f"blocked for more than {seconds}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


@pytest.fixture
def store(root: Path) -> BlobStore:
    return BlobStore(root)


# -- round trip, layout, dedup -----------------------------------------------------------


def test_put_read_round_trip_and_layout(store: BlobStore, root: Path) -> None:
    assert not root.exists()
    res = store.put(DATA)
    assert res.digest == sha(DATA) == digest_of(DATA)
    assert (res.size, res.deduped, res.replaced) == (len(DATA), False, False)
    path = blob_path(root, res.digest)
    st_ = os.lstat(path)
    assert stat.S_ISREG(st_.st_mode)
    assert stat.S_IMODE(st_.st_mode) & 0o222 == 0, "a blob file must be read-only"
    assert path.read_bytes() == DATA
    # nothing else in the store: one fan-out dir holding one file, and an empty tmp/
    assert sorted(os.listdir(root)) == sorted({res.digest[:2], "tmp"})
    assert os.listdir(root / res.digest[:2]) == [res.digest]
    assert os.listdir(root / "tmp") == []
    assert store.read(res.digest) == DATA
    assert store.read(res.digest, size=len(DATA)) == DATA
    assert store.size(res.digest) == len(DATA)
    assert store.check(res.digest) == len(DATA)


def test_put_with_given_digest_is_checked(store: BlobStore, root: Path) -> None:
    assert store.put(DATA, digest=sha(DATA)).digest == sha(DATA)
    with pytest.raises(InvalidInput, match="does not match"):
        store.put(b"other bytes", digest=sha(DATA))
    with pytest.raises(InvalidInput):
        store.put(DATA, digest=sha(DATA).upper())
    assert [b.digest for b in store.scan()] == [sha(DATA)]


def test_empty_blob(store: BlobStore) -> None:
    res = store.put(b"")
    assert res.digest == sha(b"") and res.size == 0
    assert store.read(res.digest, size=0) == b""
    assert store.check(res.digest) == 0 and store.size(res.digest) == 0


def test_identical_content_stored_once_and_freshened(store: BlobStore, root: Path) -> None:
    first = store.put(DATA)
    path = blob_path(root, first.digest)
    os.utime(path, ns=(OLD_NS, OLD_NS))
    inode = os.lstat(path).st_ino
    assert os.lstat(path).st_mtime_ns == OLD_NS

    ops, seen = recorder()
    second = BlobStore(root, ops).put(DATA)
    assert second.digest == first.digest and second.size == len(DATA)
    assert second.deduped is True and second.replaced is False
    # not rewritten: same file, no write, no rename
    assert os.lstat(path).st_ino == inode
    assert "write" not in seen and "rename" not in seen
    # freshened: a dedup hit is a new use (GC's grace window counts from it)
    assert os.lstat(path).st_mtime_ns > OLD_NS
    blobs = list(store.scan())
    assert [(b.digest, b.size) for b in blobs] == [(first.digest, len(DATA))]
    assert blobs[0].mtime_ns == os.lstat(path).st_mtime_ns > OLD_NS


def test_partial_writes_are_completed(store: BlobStore, root: Path) -> None:
    class Trickle(FileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            return super().write(fd, bytes(data[:7]))

    res = BlobStore(root, Trickle()).put(DATA)
    assert store.read(res.digest) == DATA


# -- reads verify --------------------------------------------------------------------------


def test_read_checks_recorded_size(store: BlobStore) -> None:
    d = store.put(DATA).digest
    with pytest.raises(BlobCorrupt, match=f"{len(DATA)} bytes, {len(DATA) + 1} were recorded"):
        store.read(d, size=len(DATA) + 1)
    with pytest.raises(BlobCorrupt):
        store.read(d, size=0, verify=False)


def test_read_verifies_hash_by_default(store: BlobStore, root: Path) -> None:
    d = store.put(DATA).digest
    flipped = bytearray(DATA)
    flipped[10] ^= 0x01
    overwrite(blob_path(root, d), bytes(flipped))
    with pytest.raises(BlobCorrupt, match="do not hash") as exc:
        store.read(d)
    assert exc.value.exit_code == EXIT_NO and exc.value.digest == d
    # the same length: only the hash can tell
    with pytest.raises(BlobCorrupt):
        store.read(d, size=len(DATA))
    with pytest.raises(BlobCorrupt, match="do not hash"):
        store.check(d)
    assert store.size(d) == len(DATA)  # size() is a stat, not a verdict


def test_read_verify_false_skips_hashing(
    store: BlobStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = store.put(DATA).digest
    flipped = bytes(b ^ 0xFF for b in DATA)
    overwrite(blob_path(root, d), flipped)
    calls: list[int] = []

    def counting_digest_of(data: bytes | memoryview) -> str:
        calls.append(len(data))
        return sha(bytes(data))

    monkeypatch.setattr("ledger.blobs.digest_of", counting_digest_of)
    assert store.read(d, verify=False) == flipped
    assert store.read(d, size=len(DATA), verify=False) == flipped
    assert calls == []
    with pytest.raises(BlobCorrupt):
        store.read(d)
    assert calls == [len(DATA)]  # the default path does hash (the counter works)


def test_check_rehashes_and_reports(store: BlobStore, root: Path) -> None:
    d = store.put(DATA).digest
    assert store.check(d) == len(DATA)
    overwrite(blob_path(root, d), DATA[:-1] + b"!")
    with pytest.raises(BlobCorrupt):
        store.check(d)
    os.unlink(blob_path(root, d))
    with pytest.raises(BlobNotFound) as exc:
        store.check(d)
    assert exc.value.exit_code == EXIT_NO
    with pytest.raises(BlobNotFound):
        store.read(d)
    assert store.size(d) is None


def test_missing_blob_in_missing_store(store: BlobStore, root: Path) -> None:
    d = sha(DATA)
    assert store.size(d) is None
    with pytest.raises(BlobNotFound):
        store.read(d)
    with pytest.raises(BlobNotFound):
        store.check(d)
    assert store.delete(d) is False
    assert list(store.scan()) == [] and list(store.temp_files()) == []
    assert store.delete_temp(f"{d}.abc123.tmp") is False
    assert not root.exists(), "reading must never create the store"


# -- bad digests -----------------------------------------------------------------------------

GOOD = sha(DATA)
BAD_DIGESTS = [
    "",
    GOOD[:63],
    GOOD + "0",
    GOOD.upper(),
    "A" + GOOD[1:],
    "g" * 64,
    GOOD[:63] + "\n",
    " " + GOOD[1:],
    "../" + GOOD[3:],
    "../../" + GOOD[6:],
    GOOD[:2] + "/../" + GOOD[6:],
    GOOD[:2] + "/" + GOOD[3:],
    "/" + GOOD[1:],
    GOOD[:63] + "\x00",
    "\u0660" * 64,  # ARABIC-INDIC DIGIT ZERO: a unicode digit, not hex
    GOOD.encode(),
    None,
]


@pytest.mark.parametrize("method", ["size", "read", "check", "delete"])
@pytest.mark.parametrize("bad", BAD_DIGESTS, ids=repr)
def test_bad_digest_refused_before_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, bad: object
) -> None:
    root = tmp_path / "blobs"
    BlobStore(root).put(DATA)  # a real store with a real blob a traversal could reach
    before = listing(root)
    ops, seen = recorder()
    store = BlobStore(root, ops)

    def touched(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the file system was touched: {args!r}")

    with monkeypatch.context() as m:
        for name in ("open", "stat", "lstat", "listdir", "unlink", "mkdir", "rename", "utime"):
            m.setattr(os, name, touched)
        with pytest.raises(InvalidInput, match="not a sha256 digest") as exc:
            getattr(store, method)(bad)
    assert exc.value.exit_code == EXIT_USAGE
    assert seen == []
    assert listing(root) == before


@pytest.mark.parametrize("bad", [b for b in BAD_DIGESTS if b])
def test_bad_digest_refused_by_put(store: BlobStore, root: Path, bad: object) -> None:
    with pytest.raises(InvalidInput):
        store.put(DATA, digest=bad)  # type: ignore[arg-type]
    assert not root.exists()


# -- symlinks, at every level ----------------------------------------------------------------


def test_symlinked_blob_file_is_refused_and_replaced(tmp_path: Path, store: BlobStore, root: Path) -> None:
    d = sha(DATA)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(DATA)  # the right content: only the link itself is wrong
    outside_stat = os.stat(outside)
    (root / d[:2]).mkdir(parents=True)
    link = blob_path(root, d)
    link.symlink_to(outside)
    assert link.read_bytes() == DATA, "fixture: a naive open would serve the link"

    with pytest.raises(BlobCorrupt, match="symlink"):
        store.read(d)
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.read(d, verify=False)
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.size(d)
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.check(d)
    with pytest.raises(BlobCorrupt):
        list(store.scan())

    assert link.is_symlink()
    res = store.put(DATA)
    assert (res.deduped, res.replaced) == (False, True)
    assert not link.is_symlink() and stat.S_ISREG(os.lstat(link).st_mode)
    assert store.read(d) == DATA
    # the outside file is untouched: same inode, bytes and mtime
    after = os.lstat(outside)
    assert stat.S_ISREG(after.st_mode) and outside.read_bytes() == DATA
    assert (after.st_ino, after.st_mtime_ns) == (outside_stat.st_ino, outside_stat.st_mtime_ns)


def test_symlinked_fanout_dir_is_never_followed(tmp_path: Path, store: BlobStore, root: Path) -> None:
    d = sha(DATA)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / d).write_bytes(DATA)  # a valid-looking blob outside the store
    os.utime(elsewhere / d, ns=(OLD_NS, OLD_NS))
    root.mkdir()
    (root / d[:2]).symlink_to(elsewhere, target_is_directory=True)
    assert blob_path(root, d).read_bytes() == DATA, "fixture: a naive open follows the dir link"
    before = listing(elsewhere)

    for call in (
        lambda: store.read(d),
        lambda: store.read(d, verify=False),
        lambda: store.size(d),
        lambda: store.check(d),
        lambda: list(store.scan()),
    ):
        with pytest.raises(BlobCorrupt, match="symlink"):
            call()
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.put(DATA)
    fresh = next(c for i in range(100_000) if sha(c := b"fresh %d" % i)[:2] == d[:2])
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.put(fresh)  # new content with that prefix: a naive put writes into elsewhere/
    with pytest.raises(BlobCorrupt, match="symlink"):
        store.delete(d)  # a naive delete would unlink the outside file
    assert listing(elsewhere) == before
    assert os.lstat(elsewhere / d).st_mtime_ns == OLD_NS, "the outside blob was freshened"
    assert (root / d[:2]).is_symlink()
    assert list(store.temp_files()) == []


def test_symlinked_tmp_dir_is_refused(tmp_path: Path, store: BlobStore, root: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = elsewhere / "x.tmp"
    planted.write_bytes(b"keep me")
    root.mkdir()
    (root / "tmp").symlink_to(elsewhere, target_is_directory=True)
    assert (root / "tmp" / "x.tmp").exists(), "fixture: the link resolves"

    with pytest.raises(BlobCorrupt, match="symlink"):
        store.put(DATA)
    assert listing(elsewhere) == {"x.tmp": b"keep me"}, "a temp file was written outside"
    assert store.size(sha(DATA)) is None
    with pytest.raises(BlobCorrupt):
        list(store.temp_files())
    with pytest.raises(BlobCorrupt):
        store.delete_temp("x.tmp")  # a naive delete_temp would unlink the outside file
    assert planted.read_bytes() == b"keep me"


def test_symlinked_root_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    BlobStore(real).put(DATA)
    before = listing(real)
    root = tmp_path / "blobs"
    root.symlink_to(real, target_is_directory=True)
    assert blob_path(root, sha(DATA)).read_bytes() == DATA, "fixture: the link resolves"
    store = BlobStore(root)
    d = sha(DATA)
    for call in (
        lambda: store.read(d),
        lambda: store.size(d),
        lambda: store.check(d),
        lambda: store.put(DATA),
        lambda: store.put(b"new content"),
        lambda: store.delete(d),
        lambda: list(store.scan()),
        lambda: list(store.temp_files()),
    ):
        with pytest.raises(BlobCorrupt, match="symlink or not a directory"):
            call()
    assert listing(real) == before


@pytest.mark.parametrize("suffix", ["/", "/.", "//", "/./"])
def test_symlinked_root_spelled_with_trailing_slash_is_refused(tmp_path: Path, suffix: str) -> None:
    real = tmp_path / "real"
    real.mkdir()
    root = tmp_path / "blobs"
    root.symlink_to(real, target_is_directory=True)
    store = BlobStore(str(root) + suffix)
    assert os.path.isdir(str(root) + suffix), "fixture: the spelling resolves through the link"
    with pytest.raises(BlobCorrupt, match="symlink or not a directory"):
        store.put(DATA)
    with pytest.raises(BlobCorrupt):
        list(store.scan())
    assert os.listdir(real) == []


def test_dangling_root_symlink_is_refused_not_created(tmp_path: Path) -> None:
    target = tmp_path / "not-yet"
    root = tmp_path / "blobs"
    root.symlink_to(target, target_is_directory=True)
    with pytest.raises(BlobCorrupt):
        BlobStore(root).put(DATA)
    assert not target.exists() and root.is_symlink()


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "blobs"
    root.write_bytes(b"not a dir")
    store = BlobStore(root)
    with pytest.raises(BlobCorrupt):
        store.put(DATA)
    with pytest.raises(BlobCorrupt):
        store.read(sha(DATA))
    assert root.read_bytes() == b"not a dir"


def test_fifo_at_blob_name_does_not_hang(store: BlobStore, root: Path) -> None:
    d = sha(DATA)
    (root / d[:2]).mkdir(parents=True)
    os.mkfifo(blob_path(root, d))
    with deadline(2.0):
        with pytest.raises(BlobCorrupt, match="not a regular file"):
            store.read(d)
        with pytest.raises(BlobCorrupt):
            store.check(d)
        with pytest.raises(BlobCorrupt):
            store.size(d)
        res = store.put(DATA)
    assert res.replaced is True
    assert stat.S_ISREG(os.lstat(blob_path(root, d)).st_mode)
    assert store.read(d) == DATA


# -- planted files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "planted",
    [bytes(b ^ 0x20 for b in DATA), DATA[:-1], b"", DATA + b"x"],
    ids=["same-size", "truncated", "empty", "longer"],
)
def test_planted_wrong_bytes_detected_and_replaced(store: BlobStore, root: Path, planted: bytes) -> None:
    d = sha(DATA)
    path = blob_path(root, d)
    path.parent.mkdir(parents=True)
    path.write_bytes(planted)
    inode = os.lstat(path).st_ino
    with pytest.raises(BlobCorrupt):
        store.read(d)
    ops, seen = recorder()
    res = BlobStore(root, ops).put(DATA)
    assert (res.digest, res.size, res.deduped, res.replaced) == (d, len(DATA), False, True)
    assert seen[-4:] == ["write", "fsync", "rename", "dirfsync"]
    assert path.read_bytes() == DATA and os.lstat(path).st_ino != inode
    assert store.read(d) == DATA and store.check(d) == len(DATA)
    assert [(b.digest, b.size) for b in store.scan()] == [(d, len(DATA))]


# -- crash leftovers in tmp/ --------------------------------------------------------------------


def test_leftover_temp_files(store: BlobStore, root: Path) -> None:
    d = sha(DATA)
    name = f"{d}.abc123.tmp"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp" / name).write_bytes(DATA[:100])  # a put killed mid-write

    temps = list(store.temp_files())
    assert [(t.name, t.size) for t in temps] == [(name, 100)]
    assert list(store.scan()) == []
    assert store.size(d) is None
    with pytest.raises(BlobNotFound):
        store.read(d)
    with pytest.raises(BlobNotFound):
        store.read(d, verify=False)
    with pytest.raises(BlobNotFound):
        store.check(d)

    # a new put does not mistake the leftover for the blob, and cleans up only its own temp
    res = store.put(DATA)
    assert (res.deduped, res.replaced) == (False, False)
    assert [t.name for t in store.temp_files()] == [name]
    assert [b.digest for b in store.scan()] == [d]

    for bad in ("a/b.tmp", f"../tmp/{name}", "../x.tmp", name[:-4], f"{name}.bak", "", "tmp"):
        with pytest.raises(InvalidInput):
            store.delete_temp(bad)
    assert [t.name for t in store.temp_files()] == [name]

    ops, seen = recorder()
    assert BlobStore(root, ops).delete_temp(name) is True
    assert seen == ["unlink", "dirfsync"]
    assert list(store.temp_files()) == []
    assert store.delete_temp(name) is False
    assert store.read(d) == DATA


# -- the fault-injection seam -------------------------------------------------------------------


def temp_names(root: Path) -> list[str]:
    return os.listdir(root / "tmp") if (root / "tmp").is_dir() else []


def test_enospc_on_write(store: BlobStore, root: Path) -> None:
    mid_put: list[list[str]] = []

    class DiskFull(FileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            self.tick("write")
            mid_put.append(temp_names(root))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(StorageFailure, match="full") as exc:
        BlobStore(root, DiskFull()).put(DATA)
    assert "ENOSPC" in str(exc.value)
    assert exc.value.exit_code == EXIT_ENVIRONMENT
    assert isinstance(exc.value.__cause__, OSError)
    assert len(mid_put) == 1 and len(mid_put[0]) == 1, "fixture: a temp file existed mid-put"
    assert list(store.scan()) == []
    assert store.size(sha(DATA)) is None
    assert list(store.temp_files()) == [] and temp_names(root) == []
    # the store still works once the disk has room
    assert store.put(DATA).deduped is False and store.read(sha(DATA)) == DATA


def test_enospc_midway_through_a_large_blob(store: BlobStore, root: Path) -> None:
    data = random.Random(7).randbytes(3 * CHUNK + 5)

    class FullAfterOneMiB(FileOps):
        written = 0

        def write(self, fd: int, data: bytes | memoryview) -> int:
            if self.written >= CHUNK:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = super().write(fd, data[: CHUNK // 2])
            self.written += n
            return n

    with pytest.raises(StorageFailure, match="full"):
        BlobStore(root, FullAfterOneMiB()).put(data)
    assert list(store.scan()) == [] and list(store.temp_files()) == []


def test_eio_on_fsync(store: BlobStore, root: Path) -> None:
    class BadDisk(FileOps):
        def fsync(self, fd: int) -> None:
            self.tick("fsync")
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    ops = BadDisk()
    seen: list[str] = []
    ops.on_op = seen.append
    with pytest.raises(StorageFailure, match="Input/output error") as exc:
        BlobStore(root, ops).put(DATA)
    assert exc.value.exit_code == EXIT_ENVIRONMENT
    assert "rename" not in seen, "an unsynced file must never be renamed into place"
    assert list(store.scan()) == [] and store.size(sha(DATA)) is None
    with pytest.raises(BlobNotFound):
        store.read(sha(DATA))
    assert list(store.temp_files()) == []


def test_op_sequence_fresh_put(store: BlobStore, root: Path) -> None:
    root.mkdir()
    ops, seen = recorder()
    BlobStore(root, ops).put(DATA)
    # the root's own entry (once per instance), the fan-out dir, then tmp/, then the write
    assert seen == ["dirfsync", "mkdir", "dirfsync", "mkdir", "dirfsync", "write", "fsync",
                    "rename", "dirfsync"]

    ops, seen = recorder()
    BlobStore(root, ops).put(b"another blob")  # tmp/ exists; maybe the fan-out dir too
    assert seen[-4:] == ["write", "fsync", "rename", "dirfsync"]
    # a fresh instance fsyncs the parent of each existing directory it first writes
    # through (a dir left by a put that died before its parent's fsync is made durable)
    assert seen[:-4] in (["dirfsync", "dirfsync", "dirfsync"],
                         ["dirfsync", "mkdir", "dirfsync", "dirfsync"])

    ops, seen = recorder()
    assert BlobStore(root, ops).put(DATA).deduped is True
    assert "write" not in seen and "rename" not in seen and "mkdir" not in seen


def test_op_sequence_creates_root_through_the_seam(tmp_path: Path) -> None:
    root = tmp_path / "new" / "blobs"
    root.parent.mkdir()
    ops, seen = recorder()
    BlobStore(root, ops).put(DATA)
    assert seen[:2] == ["mkdir", "dirfsync"], "the root is created (and its parent synced) via FileOps"
    assert seen.count("mkdir") == 3  # root, fan-out, tmp
    assert seen[-4:] == ["write", "fsync", "rename", "dirfsync"]

    class NoRoom(FileOps):
        def mkdir(self, name: str, dir_fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    other = tmp_path / "new" / "other"
    with pytest.raises(StorageFailure, match="full"):
        BlobStore(other, NoRoom()).put(DATA)
    assert not other.exists()


def test_dedup_makes_a_half_finished_put_durable(store: BlobStore, root: Path) -> None:
    """A put that died after its rename but before the directory fsync left a blob that
    hashes right but whose name may not survive power loss. A later put of the same bytes
    dedups it; before it reports success it must make the name durable."""

    class DirSyncFailsAfterRename(FileOps):
        renamed = False

        def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
            super().rename(src, dst, src_dir_fd, dst_dir_fd)
            self.renamed = True

        def dirfsync(self, fd: int) -> None:
            if self.renamed:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().dirfsync(fd)

    with pytest.raises(StorageFailure):
        BlobStore(root, DirSyncFailsAfterRename()).put(DATA)
    assert store.check(sha(DATA)) == len(DATA), "fixture: the name is there, not yet durable"

    ops, seen = recorder()
    assert BlobStore(root, ops).put(DATA).deduped is True
    # the fan-out dir's entry is re-synced on first use, then the file and its directory
    # the root's entry and the fan-out dir (once per instance), then the file and its dir
    assert seen == ["dirfsync", "dirfsync", "fsync", "dirfsync"], (
        "a dedup hit must fsync the file and its directory")


# -- delete -------------------------------------------------------------------------------------


def test_put_stream_stores_nothing_when_the_content_changed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = b"x" * (3 * MiB + 5)
    with pytest.raises(ContentChanged):
        store.put_stream(iter([data[:MiB], b"y" * MiB, data[2 * MiB:]]), digest_of(data))
    assert store.size(digest_of(data)) is None
    assert list(store.temp_files()) == []
    got = store.put_stream(iter([data[:MiB], data[MiB:]]), digest_of(data))
    assert (got.size, got.deduped) == (len(data), False)

    def untouchable() -> object:
        raise AssertionError("a dedup hit must not read its source")
        yield b""

    assert store.put_stream(untouchable(), digest_of(data)).deduped  # type: ignore[arg-type]
    assert b"".join(store.chunks(digest_of(data))) == data



def test_delete(store: BlobStore, root: Path) -> None:
    d = store.put(DATA).digest
    other = store.put(b"keep").digest
    ops, seen = recorder()
    assert BlobStore(root, ops).delete(d) is True
    assert seen == ["unlink", "dirfsync"]
    assert not blob_path(root, d).exists()
    assert store.size(d) is None
    with pytest.raises(BlobNotFound):
        store.read(d)
    assert [b.digest for b in store.scan()] == [other]

    ops, seen = recorder()
    assert BlobStore(root, ops).delete(d) is False  # fan-out dir present, file absent
    assert seen == ["unlink"]
    absent = "00" * 32 if other[:2] != "00" else "ff" * 32
    assert store.delete(absent) is False  # fan-out dir absent
    assert store.read(other) == b"keep"


# -- properties ---------------------------------------------------------------------------------

SIZES_AROUND_CHUNK = [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3]
contents = st.one_of(
    st.binary(max_size=2048),
    st.binary(max_size=2048),
    st.builds(
        lambda seed, n: random.Random(seed).randbytes(n),
        st.integers(0, 2**32),
        st.sampled_from(SIZES_AROUND_CHUNK),
    ),
)


@contextlib.contextmanager
def fresh_store(base: Path) -> Iterator[BlobStore]:
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield BlobStore(Path(d) / "blobs")


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=contents)
def test_property_put_then_read(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    with fresh_store(tmp_path_factory.getbasetemp()) as store:
        res = store.put(data)
        assert res.digest == hashlib.sha256(data).hexdigest()
        assert res.size == len(data) and not res.deduped
        assert store.read(res.digest) == data
        assert store.read(res.digest, size=len(data)) == data
        assert store.check(res.digest) == len(data)


@settings(max_examples=50, deadline=None, database=None)
@given(items=st.lists(st.binary(max_size=24), max_size=12))
def test_property_scan_lists_distinct_digests(
    tmp_path_factory: pytest.TempPathFactory, items: list[bytes]
) -> None:
    with fresh_store(tmp_path_factory.getbasetemp()) as store:
        results = [store.put(item) for item in items]
        expected = {sha(item): len(item) for item in items}
        scanned = [(b.digest, b.size) for b in store.scan()]
        assert sorted(scanned) == sorted(expected.items())
        assert len(scanned) == len(expected)  # each content stored once
        assert sum(r.deduped for r in results) == len(items) - len(expected)
        assert list(store.temp_files()) == []

"""Online backups of a whole ledger, and a whole ledger restored from one.

A backup is a directory (docs/design.md "Backup"):

```
DEST/BACKUP.json                  the completion marker, written last (atomically)
DEST/ledger-<seq>-<hash12>.db     the database snapshot at head <seq> (immutable)
DEST/blobs/xx/<sha256>            every file blob the snapshot needs (content-addressed)
DEST/tmp/                         a snapshot being written
```

`backup` takes the snapshot through the store (`Store.snapshot`: SQLite's ``VACUUM
INTO``, one read transaction, writers go on), copies exactly the file blobs the
snapshot's tables name (what GC keeps: live manifests and compensation records, plus
whatever pins name that is still there) that DEST lacks, verifies the copy read-only
(chain, projections, every blob a live manifest names against DEST's bytes), and only
then writes the marker: the ledger id, the head, the database file's size and sha256,
the blob count and bytes, and a digest of all of it. Until the marker names a database
file, that file is not part of a backup; every reader (`read_backup`) checks the marker
and the database's digest first, so an interrupted backup is never taken for
complete, and the previous complete backup in DEST stays valid until the new marker
replaces it. GC is held off (its lock) while the backup runs, so a blob the snapshot
needs cannot be collected before it is copied.

`restore_backup` writes a new ledger directory from a backup (checked first, whole:
nothing is written for a damaged or incomplete one) and, for a witnessed ledger,
re-anchors a fresh witness at the backup's head — a restored ledger is behind its old
witness by construction, so this is an explicit, recorded step, never a silent one.

What this module does not do: copy a ledger's lock files or its `-wal` (the snapshot
holds every committed transaction), or copy a backup off the machine (docs/operations.md
"Backups" gives the recipe: the marker goes last).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from typing import Final

import msgspec

from . import BlobIndex, BlobStore, Head, Ledger, ReadView, __version__
from .find import ignore_in_git
from .errors import (
    ArchiveMissing,
    BackupIncomplete,
    BackupInvalid,
    BlobCorrupt,
    BlobNotFound,
    CorruptLedger,
    InvalidInput,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    NotALedger,
)
from .events import BACKUP_DB_NAME, BACKUP_MARKER
from .gc import read_references
from .verify import verify
from .witness import anchor_problems, recorded_anchor

#: The completion marker's name; nothing reads a backup without it.
MARKER: Final = BACKUP_MARKER
#: What the marker says it is, and the newest format this code reads.
FORMAT: Final = "stepledger-backup"
FORMAT_VERSION: Final = 1
BLOBS_DIR: Final = "blobs"
#: Sealed runs' archive files (ledger.seal), under the same name in DEST as beside the
#: ledger: a backup holds every archive its snapshot's seals name.
ARCHIVE_DIR: Final = "archive"
_ARCHIVE_RE: Final = re.compile(r"[0-9a-f]{12}-[0-9a-f]{16}-[0-9]+\.slarchive", re.ASCII)
TMP_DIR: Final = "tmp"
LOCK_NAME: Final = ".backup.lock"
_DB_NAME_RE: Final = BACKUP_DB_NAME
_SNAP_RE: Final = re.compile(r"snap-[0-9a-f]{12}\.db", re.ASCII)
#: The largest marker read: one lists every sealed run's archive (about 150 bytes each),
#: so this bounds a backup to about 400,000 archives. The writer refuses to write a
#: larger one (it could not be read back).
_MARKER_MAX_BYTES: Final = 64 * 1024 * 1024
_CHUNK: Final = 1 << 20
_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o400
#: A restore's database before it is renamed into place (after its blobs).
_RESTORING_SUFFIX: Final = ".restoring"

Progress = Callable[[int, int], None]


class BackupMarker(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """BACKUP.json: what a complete backup holds. `digest` is the sha256 of the other
    fields' canonical JSON (damage, not forgery: whoever can write DEST can recompute
    it; the chain and `verify` are what make a forged database fail)."""

    format: str
    version: int
    ledger_id: str
    source: str  # the ledger file backed up (its path then)
    source_name: str  # its file name: a restore creates LEDGER_DIR/<source_name>
    db: str  # the snapshot's file name in DEST
    db_bytes: int
    db_sha256: str
    head_seq: int
    head_hash: str
    blob_count: int  # file blobs the snapshot needs, all in DEST/blobs
    blob_bytes: int
    witnessed: bool
    witness: str  # the witness location the ledger recorded ("" none)
    created_ns: int
    steptrail: str
    #: (file name, bytes, sha256) of every sealed run's archive the snapshot's seals name
    #: and the ledger's archive directory held, all in DEST/archive
    archives: tuple[tuple[str, int, str], ...] = ()
    digest: str = ""


class BackupReport(msgspec.Struct, kw_only=True):
    """What `backup` did (`steptrail backup --json`)."""

    dest: str
    db: str
    ledger_id: str
    head_seq: int
    head_hash: str
    unchanged: bool  # the backup in DEST already held this head: nothing was copied
    db_bytes: int
    blobs: int
    blob_bytes: int
    blobs_copied: int
    bytes_copied: int
    blobs_skipped: int
    pinned_absent: int  # blobs only a pin names that were already collected (not needed)
    archives: int = 0  # sealed runs' archive files the backup holds
    archives_copied: int = 0
    #: always empty: a seal's archive not found refuses the backup (ArchiveMissing); kept,
    #: as every --json field is
    archives_absent: list[str] = msgspec.field(default_factory=list)
    gc_held: bool = False
    verified: bool
    elapsed_s: float


class BackupCheck(msgspec.Struct, kw_only=True):
    """What `check_backup` found: a complete backup that verifies."""

    path: str
    db: str
    ledger_id: str
    head_seq: int
    head_hash: str
    blobs: int
    blob_bytes: int
    witnessed: bool
    created_ns: int
    deep: bool


class RestoredLedger(msgspec.Struct, kw_only=True):
    """What `restore_backup` did (`steptrail backup restore --json`)."""

    path: str
    ledger_id: str
    head_seq: int
    head_hash: str
    blobs: int
    blob_bytes: int
    witness: str | None  # the fresh witness anchored for it (None: not witnessed)
    anchored_seq: int | None  # its witness-anchored event
    previous_witness: str  # the location the backup recorded ("" none)
    workspaces: list[str]
    # those whose lease was live in the backup and still is by the clock: the lease is
    # a relic here (its holder writes to the original), and `restore` needs --force
    live_leases: list[str]
    elapsed_s: float


# -- the marker ---------------------------------------------------------------------------

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(BackupMarker)


def _marker_digest(marker: BackupMarker) -> str:
    return hashlib.sha256(_encoder.encode(msgspec.structs.replace(marker, digest=""))).hexdigest()


def _sha256_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
            n += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest(), n


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(directory: str, name: str, data: bytes) -> None:
    """`data` as `directory/name`: a temporary file, fsynced, renamed, the directory fsynced."""
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes of `fd` (os.read may return fewer than asked in one call)."""
    parts, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(_CHUNK, limit - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_backup(path: str | os.PathLike[str]) -> BackupMarker:
    """The marker of the complete backup at `path`, after checking it and the database
    file it names (present, a regular file, its size and sha256). Read-only.

    BackupIncomplete: no marker (an interrupted backup); BackupInvalid: not a backup
    directory, a damaged or edited marker, a database that does not match it.
    """
    where = os.fspath(path)
    if not os.path.lexists(where):
        raise BackupInvalid(where, "there is no such directory", "give the directory a"
                            " backup was written to (backup's DEST)").at_a_shell(
            f"backup {where} is not usable: there is no such directory; give the directory a"
            " backup was written to ('steptrail backup DEST')")
    st = os.lstat(where)
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(where)
    if not stat.S_ISDIR(st.st_mode):
        raise BackupInvalid(where, "it is not a directory", "give the directory a backup was"
                            " written to")
    marker_path = os.path.join(where, MARKER)
    try:
        fd = os.open(marker_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.listdir(where):
            raise BackupIncomplete(where, f"it has no {MARKER} (the completion marker)") from None
        raise BackupInvalid(where, "the directory is empty", "give the directory a backup"
                            " was written to") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BackupInvalid(where, f"{MARKER} is a symlink") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BackupInvalid(where, f"{MARKER} is not a regular file")
        raw = _read_at_most(fd, _MARKER_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MARKER_MAX_BYTES:
        raise BackupInvalid(where, f"{MARKER} is larger than any marker steptrail writes")
    try:
        marker = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BackupInvalid(where, f"{MARKER} is damaged or not steptrail's ({exc})") from None
    if marker.format != FORMAT:
        raise BackupInvalid(where, f"{MARKER} says format {marker.format!r}, not {FORMAT!r}")
    if marker.version > FORMAT_VERSION:
        raise BackupInvalid(where, f"its format version {marker.version} is newer than this"
                            f" steptrail reads ({FORMAT_VERSION})", "upgrade steptrail")
    if marker.digest != _marker_digest(marker):
        raise BackupInvalid(where, f"{MARKER} does not match its own digest (edited or damaged)")
    if not _DB_NAME_RE.fullmatch(marker.db) or "/" in marker.source_name \
            or marker.source_name in ("", ".", ".."):
        raise BackupInvalid(where, f"{MARKER} names files steptrail never writes")
    db = os.path.join(where, marker.db)
    try:
        dst = os.lstat(db)
    except FileNotFoundError:
        raise BackupInvalid(where, f"its database {marker.db} is missing") from None
    if not stat.S_ISREG(dst.st_mode):
        raise BackupInvalid(where, f"its database {marker.db} is not a regular file")
    if dst.st_size != marker.db_bytes:
        raise BackupInvalid(where, f"its database {marker.db} holds {dst.st_size} bytes, the"
                            f" marker says {marker.db_bytes} (truncated or replaced)")
    digest, _n = _sha256_file(db)
    if digest != marker.db_sha256:
        raise BackupInvalid(where, f"its database {marker.db} does not hash to the marker's"
                            " sha256 (damaged or replaced)")
    for name, size, _sha in marker.archives:
        if not _ARCHIVE_RE.fullmatch(name):
            raise BackupInvalid(where, f"{MARKER} names files steptrail never writes")
        try:
            ast = os.lstat(os.path.join(where, ARCHIVE_DIR, name))
        except FileNotFoundError:
            raise BackupInvalid(where, f"its archive {name} is missing") from None
        if not stat.S_ISREG(ast.st_mode) or ast.st_size != size:
            raise BackupInvalid(where, f"its archive {name} is not the {size}-byte file the"
                                " marker names (truncated or replaced)")
    return marker


def _check_archives(archives: tuple[tuple[str, int, str], ...], where: str, copy: Ledger
                    ) -> None:
    """Every archive listed hashes to its sha256 and verifies as the archive of a seal in
    the backup's own database (ledger.seal.verify_archive)."""
    from .seal import seal_events, verify_archive

    if not archives:
        return
    seals = seal_events(copy)  # read once: each archive is checked against its seal
    for name, _size, sha in archives:
        path = os.path.join(where, ARCHIVE_DIR, name)
        if _sha256_file(path)[0] != sha:
            raise BackupInvalid(where, f"its archive {name} does not hash to the marker's"
                                " sha256 (damaged or replaced)")
        try:
            report = verify_archive(path, copy, seals=seals)
        except LedgerError as exc:
            raise BackupInvalid(where, f"its archive {name} is damaged: {exc}") from None
        if not report.ok:
            raise BackupInvalid(where, f"its archive {name} does not match its seal: "
                                + "; ".join(f.message for f in report.findings[:2]))


# -- what a snapshot needs ------------------------------------------------------------------


class _Needs(msgspec.Struct):
    required: dict[str, int]  # file blob digest -> size: must be in the backup
    optional: dict[str, int]  # only a pin names it, and it is still there: copied
    pinned_absent: int


def _needs(view: BlobIndex, size_of: Callable[[str], tuple[int, bool] | None] | None = None
           ) -> _Needs:
    """The file blobs a snapshot (read through `view`, whose blob files are where the
    blobs are read from) needs: every blob GC keeps (live manifests, compensation
    records) — missing is damage —, and whatever a pin names that is still stored."""
    refs = read_references(view)
    blob_size = size_of or view.blob_size
    required: dict[str, int] = {}
    optional: dict[str, int] = {}
    absent = 0
    for digest in sorted(refs.referenced):
        found = blob_size(digest)
        if found is None:
            raise BlobNotFound(digest, "a committed manifest or compensation names it")
        size, inline = found
        if not inline:
            required[digest] = size
    pinned = {hold.digest for hold in view.pin_holds()}
    for digest in sorted(pinned - refs.referenced):
        found = blob_size(digest)
        if found is None:
            absent += 1
        elif not found[1]:
            optional[digest] = found[0]
    return _Needs(required, optional, absent)


def _open_copy(db: str, blob_root: str, where: str) -> Ledger:
    """A backup's database, read-only, its blob files under `blob_root`; what it is not
    (not a ledger, damaged, too new) is BackupInvalid."""
    try:
        return Ledger.open(db, readonly=True, witness_check=False, blob_root=blob_root)
    except (NotALedger, CorruptLedger, LedgerTooNew, LedgerNotFound) as exc:
        raise BackupInvalid(where, f"its database is not a usable ledger ({exc})") from None


def _check_copy(copy: Ledger, marker_head: Head, where: str, *, deep: bool
                ) -> tuple[_Needs, int]:
    """Verify a backup's database (chain, projections, every blob a live manifest names,
    the recorded anchors) ending at `marker_head`, and that every blob it needs is in
    its blob store; return the needs and their bytes. BackupInvalid on any finding."""
    problems: list[str] = []

    def blob_check(digest: str, size: int) -> str | None:
        try:
            copy.check_blob(digest, size, deep=deep)
        except BlobNotFound:
            return "missing"
        except BlobCorrupt as exc:
            return f"corrupt: {exc.why}"
        return None

    report = verify(copy.storage, copy.log, expect_head=marker_head, blob_check=blob_check)
    problems.extend(f"[{f.check}] {f.message}" for f in report.findings)
    with copy.storage.read() as view:
        problems.extend(message for _seq, message in anchor_problems(view))
        try:
            needs = _needs(view)
        except BlobNotFound as exc:
            needs = _Needs({}, {}, 0)
            problems.append(f"blob {exc.digest[:12]}… is missing from the backup")
        except BlobCorrupt as exc:
            needs = _Needs({}, {}, 0)
            problems.append(f"blob {exc.digest[:12]}… is corrupt in the backup ({exc.why})")
    for digest, size in needs.required.items():
        problem = blob_check(digest, size)
        if problem is not None:
            problems.append(f"blob {digest[:12]}… is {problem}")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise BackupInvalid(where, "; ".join(problems[:3]) + more)
    return needs, sum(needs.required.values())


def check_backup(path: str | os.PathLike[str], *, deep: bool = True) -> BackupCheck:
    """Check a backup whole, read-only: the marker, the database's digest, verify of the
    database at the marker's head, every blob it needs (`deep`: re-hashed). Raises
    BackupIncomplete / BackupInvalid; returns what it holds."""
    where = os.path.abspath(os.fspath(path))
    marker = read_backup(where)
    copy = _open_copy(os.path.join(where, marker.db), os.path.join(where, BLOBS_DIR), where)
    try:
        _check_identity(copy, marker, where)
        needs, size = _check_copy(copy, Head(marker.head_seq, bytes.fromhex(marker.head_hash)),
                                  where, deep=deep)
        if deep:
            _check_archives(marker.archives, where, copy)
    finally:
        copy.close()
    return BackupCheck(path=where, db=marker.db, ledger_id=marker.ledger_id,
                       head_seq=marker.head_seq, head_hash=marker.head_hash,
                       blobs=len(needs.required), blob_bytes=size, witnessed=marker.witnessed,
                       created_ns=marker.created_ns, deep=deep)


def _check_identity(copy: Ledger, marker: BackupMarker, where: str) -> None:
    if copy.ledger_id != marker.ledger_id:
        raise BackupInvalid(where, f"its database is ledger {copy.ledger_id}, the marker says"
                            f" {marker.ledger_id} (a database from elsewhere)")
    head = copy.head()
    if head.seq != marker.head_seq or head.hash.hex() != marker.head_hash:
        raise BackupInvalid(where, f"its database ends at #{head.seq}, the marker says"
                            f" #{marker.head_seq}")


# -- taking a backup -------------------------------------------------------------------------


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _check_dest(dest: str, ledger_dir: str) -> None:
    if _inside(dest, ledger_dir):
        raise InvalidInput(f"backup destination {dest} is inside the ledger's directory"
                           f" {ledger_dir}; give a directory elsewhere (another volume)")
    if _inside(ledger_dir, dest):
        raise InvalidInput(f"backup destination {dest} contains the ledger's directory"
                           f" {ledger_dir}; give a directory of its own")
    if os.path.lexists(dest):
        if not os.path.isdir(dest):
            raise InvalidInput(f"backup destination {dest} is not a directory; give a new"
                               " directory or an earlier backup of this ledger")
        ours = {MARKER, BLOBS_DIR, ARCHIVE_DIR, TMP_DIR, LOCK_NAME}
        foreign = [n for n in os.listdir(dest) if n not in ours
                   and not _DB_NAME_RE.fullmatch(n) and not n.startswith(f".{MARKER}.")]
        if foreign:
            raise InvalidInput(f"backup destination {dest} holds files that are not a"
                               f" steptrail backup ({', '.join(sorted(foreign)[:3])}); give a"
                               " new or empty directory, or an earlier backup of this ledger")
        _own_directories(dest, "backup destination")


def _own_directories(root: str, what: str) -> None:
    """The directories a backup or a restore writes inside `root` must be its own: a
    symlink (or a file) in the place of blobs/, archive/ or tmp/ would send its writes
    elsewhere. Refused, nothing written."""
    for sub in (BLOBS_DIR, ARCHIVE_DIR, TMP_DIR):
        place = os.path.join(root, sub)
        if os.path.lexists(place) and (os.path.islink(place) or not os.path.isdir(place)):
            raise InvalidInput(f"{what} {root}: its {sub}/ is a symlink or not a"
                               f" directory; remove {place} (a backup writes only into"
                               " directories of its own)")


@contextlib.contextmanager
def _flock(path: str):  # type: ignore[no-untyped-def]
    """One backup at a time writes a destination (a second waits for the first)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _gc_held(source: Ledger):  # type: ignore[no-untyped-def]
    """Hold the collector's lock (waiting for a running collection to finish), so no
    blob the snapshot names is collected before it is copied. Where the lock cannot be
    created (a read-only ledger directory) no collector can run either."""
    try:
        held = source.storage.exclusive("gc", wait=True)
        held.__enter__()
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield False
        return
    try:
        yield True
    finally:
        held.__exit__(None, None, None)


def backup(
    ledger: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    deep: bool = False,
    witness: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> BackupReport:
    """Write a consistent, verified backup of the ledger file `ledger` into `dest`.

    Online: the database snapshot is one read transaction (writers go on); GC waits
    until the backup is done. Incremental: a blob already in DEST with the right size
    (`deep`: and hash) is not copied again, and a DEST whose backup already holds the
    ledger's head is checked (marker, database digest, blobs present) and left as it is.
    Verified: the copy is verified read-only before its marker is written; a failure
    raises (BackupInvalid) and leaves no marker for it (an earlier complete backup in
    DEST stays complete). Bad input (DEST inside the ledger's directory, a file, another
    ledger's backup, a directory of other files) is refused with nothing written.
    """
    started = time.perf_counter()
    from . import locate, shown_location

    url = not locate(ledger).local_file
    path = str(ledger) if url else os.path.abspath(os.fspath(ledger))
    shown = shown_location(path)  # what the report and BACKUP.json record (no password)
    where = os.path.abspath(os.fspath(dest))
    if not url:  # (a ledger in a database has no directory a DEST could lie in)
        ledger_dir = os.path.realpath(os.path.dirname(path))
        _check_dest(os.path.realpath(where), ledger_dir)
    previous: BackupMarker | None = None
    if os.path.lexists(os.path.join(where, MARKER)):
        previous = read_backup(where)
    with Ledger.open(path, readonly=True, witness=witness) as source:
        if previous is not None and previous.ledger_id != source.ledger_id:
            raise BackupInvalid(where, f"it is a backup of ledger {previous.ledger_id}, not of"
                                f" {source.ledger_id} ({shown})", "give each ledger a backup"
                                " directory of its own")
        _archives_there(source, shown)  # refused before anything is written
        os.makedirs(where, _DIR_MODE, exist_ok=True)
        with _flock(os.path.join(where, LOCK_NAME)), _gc_held(source) as gc_held:
            if previous is not None:  # read again under the lock: another backup may have run
                previous = read_backup(where)
            report = _backup_locked(source, shown, where,
                                    previous, deep=deep,
                                    progress=progress, clock=clock)
            report.gc_held = gc_held
    report.elapsed_s = round(time.perf_counter() - started, 6)
    return report


def _backup_locked(source: Ledger, path: str, where: str, previous: BackupMarker | None, *,
                   deep: bool, progress: Progress | None, clock: Callable[[], int]
                   ) -> BackupReport:
    from . import locate

    head = source.head()
    dest_files = BlobStore(os.path.join(where, BLOBS_DIR))
    if previous is not None and previous.head_seq == head.seq \
            and previous.head_hash == head.hash.hex():
        return _unchanged(previous, where, dest_files, deep=deep)
    tmp = os.path.join(where, TMP_DIR)
    os.makedirs(tmp, _DIR_MODE, exist_ok=True)
    for name in os.listdir(tmp):  # what a killed backup left (never part of one)
        if _SNAP_RE.fullmatch(name):
            os.unlink(os.path.join(tmp, name))
    for leftover in list(dest_files.temp_files()):  # a killed copy's (DEST is ours: locked)
        dest_files.delete_temp(leftover.name)
    snap = os.path.join(tmp, f"snap-{secrets.token_hex(6)}.db")
    source.storage.snapshot(snap)
    try:
        # The snapshot's tables, its blobs read where the live ledger keeps them.
        snapshot = Ledger.open(snap, readonly=True, witness_check=False,
                               blob_root=source.blobs.root)
        try:
            snap_head = snapshot.head()
            with snapshot.storage.read() as view:
                def stored_size(d: str, view: ReadView = view) -> tuple[int, bool] | None:
                    # the snapshot's inline rows, else the source's chunk rows (which
                    # the collector's lock keeps)
                    return view.blob_size(d) or source.storage.view.blob_size(d)

                # a ledger in a database has its blobs there, not beside the snapshot
                needs = _needs(view, stored_size if source.blobs.root is None else None)
                found = recorded_anchor(view, snap)
                witnessed = found is not None or view.meta("witness_tag") is not None
            ledger_id = snapshot.ledger_id
            from .seal import archive_dir_of, seals_in
            archive_names = sorted({seal.archive for _seq, seal
                                    in seals_in(snapshot.storage.view).values()})
            archive_src = archive_dir_of(source)
        finally:
            snapshot.close()
        copied = skipped = bytes_copied = 0
        todo = {**needs.required, **needs.optional}
        for i, (digest, size) in enumerate(sorted(todo.items())):
            if _present(dest_files, digest, size, deep=deep):
                skipped += 1
            else:
                dest_files.put_stream(source.blobs.chunks(digest, size=size), digest)
                copied += 1
                bytes_copied += size
            if progress is not None:
                progress(i + 1, len(todo))
        if archive_names and archive_src is None:
            raise ArchiveMissing(path, None, archive_names)
        archives, archives_copied, absent = _copy_archives(archive_names, archive_src or "",
                                                           where)
        if absent:  # moved away since the check in `backup`: still never a backup without
            raise ArchiveMissing(path, archive_src, absent)
        name = f"ledger-{snap_head.seq}-{snap_head.hash.hex()[:12]}.db"
        db = os.path.join(where, name)
        os.rename(snap, db)
        _fsync_dir(where)
        snap = db
        copy = _open_copy(db, dest_files.root, where)
        try:
            # just copied (hashed on the way) or present: sizes, unless deep
            _check_copy(copy, snap_head, where, deep=deep)
            # every archive copied now is verified against the snapshot's seals (one
            # already in DEST was when it was copied, and its sha256 still matches)
            _check_archives(tuple(a for a in archives if a[0] in archives_copied), where, copy)
        finally:
            copy.close()
        os.chmod(db, _FILE_MODE)
        db_sha, db_bytes = _sha256_file(db)
        marker = BackupMarker(
            format=FORMAT, version=FORMAT_VERSION, ledger_id=ledger_id, source=path,
            source_name=os.path.basename(path) if locate(path).local_file else "ledger.db", db=name,
            db_bytes=db_bytes, db_sha256=db_sha,
            head_seq=snap_head.seq, head_hash=snap_head.hash.hex(),
            blob_count=len(needs.required) + len(needs.optional),
            blob_bytes=sum(needs.required.values()) + sum(needs.optional.values()),
            witnessed=witnessed, witness=found[1].witness if found is not None else "",
            created_ns=clock(), steptrail=__version__, archives=tuple(archives))
        marker = msgspec.structs.replace(marker, digest=_marker_digest(marker))
        encoded = msgspec.json.format(_encoder.encode(marker)) + b"\n"
        if len(encoded) > _MARKER_MAX_BYTES:
            raise BackupInvalid(where, f"its marker would be {len(encoded)} bytes, more than"
                                f" a reader accepts ({_MARKER_MAX_BYTES})", "seal fewer,"
                                " larger runs, or split the ledger")
        _write_atomically(where, MARKER, encoded)
    except BaseException:
        if os.path.basename(snap) != (previous.db if previous is not None else None):
            with contextlib.suppress(OSError):
                os.unlink(snap)
        raise
    # the marker names the new database: the older ones are no longer part of the backup
    for old in os.listdir(where):
        if _DB_NAME_RE.fullmatch(old) and old != name:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(where, old))
    return BackupReport(
        dest=where, db=name, ledger_id=ledger_id, head_seq=snap_head.seq,
        head_hash=snap_head.hash.hex(), unchanged=False, db_bytes=db_bytes,
        blobs=marker.blob_count, blob_bytes=marker.blob_bytes, blobs_copied=copied,
        bytes_copied=bytes_copied, blobs_skipped=skipped, pinned_absent=needs.pinned_absent,
        archives=len(archives), archives_copied=len(archives_copied), archives_absent=absent,
        gc_held=False, verified=True, elapsed_s=0.0)


def _archives_there(source: Ledger, shown: str) -> None:
    """Every archive the ledger's seals name is in its archive directory (beside a
    SQLite file, or the one a ledger in a database recorded), else `ArchiveMissing`: a
    backup of a sealed ledger holds every archive, or is not taken."""
    from .seal import archive_dir_of, missing_archives, seals_in

    seals = seals_in(source.storage.view)
    if seals:
        directory = archive_dir_of(source)
        missing = missing_archives(seals, directory)
        if missing:
            raise ArchiveMissing(shown, directory, missing)


def _copy_archives(names: list[str], src_dir: str, where: str
                   ) -> tuple[list[tuple[str, int, str]], set[str], list[str]]:
    """Copy the named archive files from the ledger's archive directory into
    DEST/archive (one already there with the same sha256 is kept: archives never change
    once written). Returns (name, bytes, sha256) of each held, the names copied now, and
    the names a seal names that the archive directory does not hold (the caller refuses
    the backup: `ArchiveMissing`)."""
    dest_dir = os.path.join(where, ARCHIVE_DIR)
    held: list[tuple[str, int, str]] = []
    copied: set[str] = set()
    absent: list[str] = []
    for name in names:
        src = os.path.join(src_dir, name)
        if not os.path.isfile(src):
            absent.append(name)
            continue
        sha, size = _sha256_file(src)
        dst = os.path.join(dest_dir, name)
        if os.path.isfile(dst) and not os.path.islink(dst) and _sha256_file(dst) == (sha, size):
            held.append((name, size, sha))
            continue
        os.makedirs(dest_dir, _DIR_MODE, exist_ok=True)
        tmp = os.path.join(dest_dir, f".{name}.{secrets.token_hex(4)}.tmp")
        _copy_file(src, tmp, sha, "archive")
        os.replace(tmp, dst)
        _fsync_dir(dest_dir)
        held.append((name, size, sha))
        copied.add(name)
    return held, copied, absent


def _present(files: BlobStore, digest: str, size: int, *, deep: bool) -> bool:
    """Whether DEST already holds the blob: a regular file of `size` bytes (`deep`: that
    hashes to its name). A symlink or a wrong file is not present (it is replaced)."""
    try:
        st = files.stat(digest)
        if st is None or st.size != size:
            return False
        if deep:
            files.check(digest)
    except BlobCorrupt:
        return False
    return True


def _unchanged(previous: BackupMarker, where: str, dest_files: BlobStore, *, deep: bool
               ) -> BackupReport:
    """DEST already holds a complete backup at the ledger's head: check its blobs are
    all there (`deep`: re-hashed), copy nothing."""
    copy = _open_copy(os.path.join(where, previous.db), dest_files.root, where)
    try:
        with copy.storage.read() as view:
            needs = _needs(view)
    except (BlobNotFound, BlobCorrupt) as exc:
        raise BackupInvalid(where, f"blob {exc.digest[:12]}… is missing or damaged in it"
                            ) from None
    finally:
        copy.close()
    if deep:
        copy = _open_copy(os.path.join(where, previous.db), dest_files.root, where)
        try:
            _check_archives(previous.archives, where, copy)
        finally:
            copy.close()
    for digest, size in {**needs.required, **needs.optional}.items():
        if not _present(dest_files, digest, size, deep=deep):
            raise BackupInvalid(where, f"blob {digest[:12]}… is missing or damaged in it",
                                "take the backup into a new directory, or remove BACKUP.json"
                                " to have this one written again")
    return BackupReport(
        dest=where, db=previous.db, ledger_id=previous.ledger_id, head_seq=previous.head_seq,
        head_hash=previous.head_hash, unchanged=True, db_bytes=previous.db_bytes,
        blobs=previous.blob_count, blob_bytes=previous.blob_bytes, blobs_copied=0,
        bytes_copied=0, blobs_skipped=previous.blob_count, pinned_absent=needs.pinned_absent,
        archives=len(previous.archives), gc_held=False, verified=True, elapsed_s=0.0)


# -- restoring a whole ledger ---------------------------------------------------------------


def restore_backup(
    backup_dir: str | os.PathLike[str],
    ledger_dir: str | os.PathLike[str],
    *,
    witness: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> RestoredLedger:
    """Write the ledger a backup holds into `ledger_dir` (new or empty) as
    ``ledger_dir/<its file name>``, its blob files under ``ledger_dir/blobs``.

    The backup is checked whole first (marker, database digest, verify, every blob
    re-hashed): a damaged, incomplete or foreign one is refused with nothing written.
    The database is renamed into place after its blobs, so a killed restore leaves no
    ledger (run it again: it resumes into the same directory). A witnessed ledger needs
    `witness` (an absolute path to a new file): the restored ledger is behind its old
    witness by construction, so a fresh witness is anchored at the backup's head and
    the `witness-anchored` event records what it replaced (`previous_state`, and, if
    the old witness was there and ahead, the mismatch it was forced over).
    """
    started = time.perf_counter()
    where = os.path.abspath(os.fspath(backup_dir))
    target_dir = os.path.abspath(os.fspath(ledger_dir))
    if witness is not None:
        witness = os.fspath(witness)
        if not os.path.isabs(witness):
            raise InvalidInput(f"witness {witness} is not absolute; give an absolute path")
    marker = read_backup(where)
    if _inside(os.path.realpath(target_dir), os.path.realpath(where)) or _inside(
            os.path.realpath(where), os.path.realpath(target_dir)):
        raise InvalidInput(f"restore target {target_dir} and backup {where} overlap; give a"
                           " directory outside the backup")
    name = marker.source_name
    target = os.path.join(target_dir, name)
    restoring = os.path.join(target_dir, f".{name}{_RESTORING_SUFFIX}")
    if os.path.lexists(target_dir):
        if not os.path.isdir(target_dir):
            raise InvalidInput(f"restore target {target_dir} is not a directory; give a new or"
                               " empty directory")
        _own_directories(target_dir, "restore target")
        archive_dir = os.path.join(target_dir, ARCHIVE_DIR)
        if os.path.isdir(archive_dir):  # only what a killed restore of this backup left
            stray = [n for n in os.listdir(archive_dir)
                     if n not in {a[0] for a in marker.archives}
                     and n not in {f".{a[0]}.restoring" for a in marker.archives}]
            if stray:
                raise InvalidInput(f"restore target {target_dir} has an archive directory"
                                   f" holding other files ({', '.join(sorted(stray)[:3])}); give"
                                   " a new or empty directory (nothing was written)")
        leftovers = set(os.listdir(target_dir)) - {BLOBS_DIR, ARCHIVE_DIR,
                                                   os.path.basename(restoring)}
        if name in leftovers and leftovers <= {name, name + "-wal", name + "-shm",
                                               name + "-lockq"}:
            # Only the restored ledger is there: a restore that died after renaming it
            # into place, before (or while) anchoring its new witness, or one that ended.
            fact = (f"restore target {target_dir} already holds the restored ledger {name}"
                    " (a restore that died before anchoring its witness, or one that"
                    " finished): check it with")
            raise InvalidInput(
                f"{fact} Ledger.open({target!r}).verify(); a witnessed one whose witness was"
                f" never anchored is finished with Ledger.anchor_witness({target!r}, NEW,"
                " force=True) (nothing was written)"
            ).at_a_shell(f"{fact} 'steptrail --ledger {target} verify'; a witnessed one whose"
                         " witness was never anchored is finished with 'steptrail --ledger"
                         f" {target} witness anchor --witness NEW --force' (nothing was written)")
        if leftovers:
            raise InvalidInput(f"restore target {target_dir} is not empty"
                               f" ({', '.join(sorted(leftovers)[:3])}); give a new or empty"
                               " directory (nothing was written)")
    copy = _open_copy(os.path.join(where, marker.db), os.path.join(where, BLOBS_DIR), where)
    try:
        _check_identity(copy, marker, where)
        needs, _size = _check_copy(copy, Head(marker.head_seq, bytes.fromhex(marker.head_hash)),
                                   where, deep=True)
        _check_archives(marker.archives, where, copy)
        workspaces = sorted(row.name for row in copy.workspaces.list())
    finally:
        copy.close()
    if marker.witnessed and witness is None:
        raise InvalidInput(f"backup {where} is of a witnessed ledger (its witness was"
                           f" {marker.witness or 'not recorded'}); a restored ledger is behind"
                           " that witness by construction: name a new witness for it with"
                           " --witness /absolute/path (anchored at the backup's head, recorded)")
    if witness is not None:
        if not os.path.isdir(os.path.dirname(witness)):
            raise InvalidInput(f"the witness directory {os.path.dirname(witness)} does not"
                               " exist; create it (on another volume) first")
        if os.path.lexists(witness):
            raise InvalidInput(f"witness {witness} exists; name a new file for the restored"
                               " ledger's witness")
    os.makedirs(target_dir, _DIR_MODE, exist_ok=True)
    files = BlobStore(os.path.join(target_dir, BLOBS_DIR))
    backup_files = BlobStore(os.path.join(where, BLOBS_DIR))
    todo = sorted({**needs.required, **needs.optional}.items())
    for i, (digest, size) in enumerate(todo):
        files.put_stream(backup_files.chunks(digest, size=size), digest)
        if progress is not None:
            progress(i + 1, len(todo))
    if marker.archives:
        archive_dir = os.path.join(target_dir, ARCHIVE_DIR)
        os.makedirs(archive_dir, _DIR_MODE, exist_ok=True)
        for name, _size, sha in marker.archives:
            tmp = os.path.join(archive_dir, f".{name}.restoring")
            _copy_file(os.path.join(where, ARCHIVE_DIR, name), tmp, sha, "archive")
            os.replace(tmp, os.path.join(archive_dir, name))
        _fsync_dir(archive_dir)
    _copy_file(os.path.join(where, marker.db), restoring, marker.db_sha256)
    os.rename(restoring, target)
    ignore_in_git(target_dir)  # last: a killed restore's directory is still its own
    _fsync_dir(target_dir)
    anchored_seq = None
    if witness is not None:
        recorded = Ledger.anchor_witness(target, witness, force=marker.witnessed)
        anchored_seq = recorded.seq
    with Ledger.open(target, readonly=True) as restored:
        report = restored.verify()
        if not report.ok:
            raise BackupInvalid(where, "the restored ledger does not verify: " + "; ".join(
                f"[{f.check}] {f.message}" for f in report.findings[:3]))
        head = restored.head()
        ledger_id = restored.ledger_id
        now = restored.clock()
        live_leases = sorted(row.name for row in restored.workspaces.list()
                             if row.live_epoch(now) is not None)
    return RestoredLedger(
        path=target, ledger_id=ledger_id, head_seq=head.seq, head_hash=head.hash.hex(),
        blobs=len(todo), blob_bytes=sum(size for _d, size in todo),
        witness=None if witness is None else os.fspath(witness), anchored_seq=anchored_seq,
        previous_witness=marker.witness, workspaces=workspaces, live_leases=live_leases,
        elapsed_s=round(time.perf_counter() - started, 6))


def _copy_file(src: str, dst: str, sha256: str, what: str = "database") -> None:
    """Copy `src` to the new file `dst` (0600), hashing on the way (it must be `sha256`:
    the backup did not change under the copy), fsynced."""
    h = hashlib.sha256()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dst)  # a killed restore's
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
        try:
            while chunk := os.read(fin, _CHUNK):
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fout, view):]
            os.fsync(fout)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    if h.hexdigest() != sha256:
        os.unlink(dst)
        raise BackupInvalid(os.path.dirname(src), f"its {what} changed while it was copied")


__all__ = ["BackupCheck", "BackupMarker", "BackupReport", "RestoredLedger", "backup",
           "check_backup", "read_backup", "restore_backup"]

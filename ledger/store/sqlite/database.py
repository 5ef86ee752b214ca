"""The SQLite file: opening it defensively, its schema and version, transactions.

A ledger file may come from elsewhere, so nothing here trusts it: the 100-byte
header is read with plain file I/O first (magic, application id, schema version),
and a file that is not a ledger, or is newer than this code, is refused before
SQLite ever opens it, so it stays byte-identical with no ``-wal``/``-shm`` created.
A file that claims to be a ledger is then inspected read-only with triggers and
views disabled, ``trusted_schema=OFF`` and defensive mode, and must match the
schema allow-list exactly (a planted trigger or view never runs).

Writes go through one apsw connection: WAL (the answer of ``PRAGMA journal_mode``
is checked, since SQLite can answer ``delete`` on an I/O error without raising),
``synchronous=FULL`` by default, a busy timeout, and ``BEGIN IMMEDIATE`` for every
write transaction (a deferred read-then-write fails with BUSY_SNAPSHOT at once,
which no busy handler can retry).

This module knows tables, not events; of ours it imports only the driver's errors and the schema.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import stat
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

import apsw

from .. import Synchronous
from ...find import ignore_in_git

from ...errors import (
    AccessDenied,
    CorruptLedger,
    InvalidInput,
    LedgerError,
    LedgerNotFound,
    LedgerBusy,
    LedgerTooNew,
    NotALedger,
    ReadOnlyLedger,
    StorageFailure,
)
from .driver import (
    BUSY_TIMEOUT_MS,
    ROW_ERRORS,
    VALUE_SIZE_MAX,
    access_denied,
    read_error,
    translate,
    wal_path,
)
from .schema import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    check_contents,
    expected_schema,
    drop_stand_ins,
    schema_changes,
    stand_ins,
)

SQLITE_MAGIC: Final = b"SQLite format 3\x00"
#: The ledger holds every version of every file a step wrote: its directory (when
#: steptrail creates it) and its files (the database, -wal, -shm, -lockq, the GC lock)
#: are the owner's alone. SQLite gives the -wal and -shm the database file's mode.
LEDGER_DIR_MODE: Final = 0o700
LEDGER_FILE_MODE: Final = 0o600
#: The -wal size (pages) at which a writer checkpoints, as SQLite's autocheckpoint would.
CHECKPOINT_PAGES: Final = 1000
#: The collector's lock file, beside the ledger (GC holds it exclusively while it runs).
GC_LOCK_NAME: Final = ".steptrail-gc.lock"



@dataclass(frozen=True)
class Header:
    """What the first 100 bytes of a SQLite file say, read without SQLite."""

    application_id: int
    user_version: int
    wal: bool


def read_header(path: str) -> Header | None:
    """Inspect a file's SQLite header with plain I/O.

    Returns None when the header is not conclusive because the file's content is still
    only in its ``-wal`` (a crash right after ``init``). Raises LedgerNotFound,
    NotALedger or LedgerTooNew; never creates or changes a file.
    """
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LedgerNotFound(path) from None
    except IsADirectoryError:
        raise NotALedger(path, "it is a directory") from None
    except PermissionError:
        raise AccessDenied(path, "this user may not read it", "run as the ledger's owner"
                           " (a ledger is private to it: it holds every version of every"
                           " file its steps wrote)", readers_work=False) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise NotALedger(path, "it is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise NotALedger(path, "it is not a regular file (a FIFO, a socket or a device)")
        head = os.pread(fd, 100, 0)
    finally:
        os.close(fd)
    has_wal = os.path.exists(wal_path(path)) and os.path.getsize(wal_path(path)) > 0
    if len(head) < 100:
        if has_wal:
            return None
        raise NotALedger(path, "the file is empty" if not head else "it is too short to be SQLite")
    if head[:16] != SQLITE_MAGIC:
        if has_wal and _wal_header_valid(path):
            # A checkpoint torn while rewriting page 1: SQLite recovers it from the WAL.
            return None
        raise NotALedger(path, "it is not a SQLite database")
    user_version, application_id = struct.unpack(">I4xI", head[60:72])
    if application_id == 0 and user_version == 0 and has_wal:
        return None
    if application_id != APPLICATION_ID:
        raise NotALedger(path, f"SQLite application_id is {application_id:#x}, not steptrail's")
    if user_version > SCHEMA_VERSION:
        raise LedgerTooNew(path, user_version, SCHEMA_VERSION)
    return Header(application_id, user_version, wal=head[18] == 2)


def _harden(conn: apsw.Connection, *, allow_triggers: bool) -> None:
    """Settings from SQLite's security.html for a file we did not write."""
    conn.config(apsw.SQLITE_DBCONFIG_DEFENSIVE, 1)
    conn.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 1 if allow_triggers else 0)
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_VIEW, 1 if allow_triggers else 0)
    conn.limit(apsw.SQLITE_LIMIT_LENGTH, VALUE_SIZE_MAX)
    conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 0)
    conn.execute("PRAGMA cell_size_check=ON")
    conn.execute("PRAGMA mmap_size=0")


def _readonly_uri(path: str, *, immutable: bool = False) -> str:
    """A read-only URI: `mode=ro` reads with SQLite's locks (consistent beside writers;
    creates an empty -wal and a -shm when absent); `immutable=1` takes no locks and
    creates nothing, so it is only consistent while no writer can run."""
    quoted = path.replace("?", "%3f").replace("#", "%23")
    return f"file:{quoted}?immutable=1" if immutable else f"file:{quoted}?mode=ro"


@dataclass
class WriteStats:
    """Where a writer's time goes, as plain counters (`tools/bench_contention.py` reads
    them): what waiting for the write lock, holding it and committing cost."""

    transactions: int = 0
    #: transactions that waited in the writers' queue; the busy handler's calls and sleeps
    waited: int = 0
    busy_calls: int = 0
    busy_sleep_s: float = 0.0
    #: entering `transaction()` until BEGIN IMMEDIATE returned (the queue's wait included)
    wait_s: float = 0.0
    #: BEGIN returned until COMMIT returned (the lock held); the COMMIT statement alone
    held_s: float = 0.0
    commit_s: float = 0.0
    #: the WAL checkpoints this connection ran (after its commits, the lock let go)
    checkpoints: int = 0
    checkpoint_s: float = 0.0


def set_busy(conn: apsw.Connection, timeout_ms: int, stats: WriteStats | None = None) -> None:
    """Wait for a lock SQLite reports busy polling every 0.2-3 ms (jittered) until
    `timeout_ms`.

    Between steptrail's writers the write lock is taken in `WriterQueue` first, so
    this handler only runs against what does not queue there: a reader's snapshot
    during WAL recovery, a closing connection's checkpoint, another program's
    connection, an init's transaction. SQLite's default handler sleeps 1, 2, 5 … up to
    100 ms between tries and its lock has no queue: short jittered polls catch the gaps.
    """
    start: list[float] = [0.0]
    deadline = timeout_ms / 1000

    def handler(prior_calls: int) -> bool:
        now = time.monotonic()
        if prior_calls == 0:
            start[0] = now
        if now - start[0] >= deadline:
            return False
        pause = random.uniform(0.0002, 0.001 if prior_calls < 50 else 0.003)
        time.sleep(pause)
        if stats is not None:
            stats.busy_calls += 1
            stats.busy_sleep_s += pause
        return True

    conn.set_busy_handler(handler)


#: Linux's open-file-description locks (fcntl F_OFD_SETLK/SETLKW) on bytes of the
#: -lockq: per open file like flock, so two connections of one process exclude each
#: other, released by the kernel when the process dies. Elsewhere: flock on the file.
_OFD: Final = (getattr(fcntl, "F_OFD_SETLK", None), getattr(fcntl, "F_OFD_SETLKW", None))
_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", 0)
#: The bytes of the -lockq locked: the turnstile, the room (the writer lock) and the flag
#: of a waiter that waited longer than STARVING_AFTER_S.
_TURN, _ROOM, _STARVING = 0, 1, 2
#: How long a queued writer lets others take the lock before it, from the moment it
#: queued: then it raises the flag, and every writer queues behind it until it is in.
STARVING_AFTER_S: Final = 0.02


def _range_lock(fd: int, byte: int, kind: int, wait: bool) -> bool:
    """Lock (F_WRLCK) or unlock (F_UNLCK) one byte; False when it is held (non-blocking)."""
    cmd = _OFD[1] if wait else _OFD[0]
    try:
        fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", kind, os.SEEK_SET, byte, 1, 0))
    except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: another holds it
        return False
    return True


def _held_by_another(fd: int, byte: int) -> bool:
    """Whether another open file holds a lock on the byte (F_OFD_GETLK)."""
    got = fcntl.fcntl(fd, _OFD_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET,
                                                   byte, 1, 0))
    return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK


class WriterQueue:
    """The write lock steptrail's writers take before ``BEGIN IMMEDIATE`` and hold
    until after ``COMMIT``, on ``<ledger>-lockq``: a waiter blocks in the kernel and
    wakes the moment the lock is let go, instead of polling SQLite's lock (which has
    no queue: a poller sleeps past the release, and a writer that commits and begins
    again within microseconds wins every gap a sleeping poller leaves).

    Three bytes of the file (docs/internals.md, "Writers and the write lock"): the room
    is the lock. A writer takes it at once if it is free; otherwise it queues: it
    takes the turnstile (waiting), then the room (waiting), then lets the turnstile
    go, so only one waiter at a time waits on the room. A free room may be taken past
    the queue (the lock is not left idle while the next in line is scheduled, and a
    writer's transactions run back to back with warm caches) until a waiter has
    waited STARVING_AFTER_S: it raises the flag, and while the flag is up everyone
    queues at the turnstile — the writer that just left behind the one waiting there.
    (Without byte-range locks per open file, off Linux: the room alone, as flock.)

    The kernel's lock waits have no timeout; a wait runs in a helper thread while the
    caller waits for it up to the busy timeout. A wait given up is kept: the helper
    lets the lock go as soon as it gets it, or hands it to the next `wait`.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.ranges = _OFD[0] is not None and _OFD[1] is not None
        self._start_helper_state()

    def _start_helper_state(self) -> None:
        self._pid = os.getpid()  # a forked child has no helper thread: it starts its own
        self._mutex = threading.Lock()
        self._go = threading.Semaphore(0)       # a wait to run (or the close)
        self._granted = threading.Semaphore(0)  # the helper took the lock for the caller
        self._waiting = False  # the helper is in a blocking wait
        self._wanted = False   # a caller wants what that wait takes
        self._taken = False    # what the last wait came to
        self._closed = False
        self._helper: threading.Thread | None = None

    def try_take(self) -> bool:
        """Take the lock if it is free and no waiter has raised the flag, without waiting."""
        with self._mutex:
            if self._waiting:
                return False  # the helper waits on this file already: join its wait
        if not self.ranges:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
        if _held_by_another(self.fd, _STARVING):
            return False  # a waiter waited too long: queue behind it
        return _range_lock(self.fd, _ROOM, fcntl.F_WRLCK, wait=False)

    def wait(self, timeout_s: float) -> bool:
        """Wait (blocked in the kernel) up to `timeout_s` for the lock; whether it is held.
        OSError when the wait failed."""
        if self._pid != os.getpid():
            self._start_helper_state()
        with self._mutex:
            self._wanted = True
            if not self._waiting:
                self._waiting = True
                if self._helper is None:
                    self._helper = threading.Thread(target=self._run, daemon=True,
                                                    name="steptrail-writer-queue")
                    self._helper.start()
                self._go.release()
        deadline = time.monotonic() + timeout_s
        patience = STARVING_AFTER_S if self.ranges else timeout_s
        flag = False
        try:
            while not self._granted.acquire(
                    timeout=max(0.0, min(deadline - time.monotonic(), patience))):
                if time.monotonic() >= deadline:
                    with self._mutex:
                        if self._wanted:  # not granted: the helper lets it go when it gets it
                            self._wanted = False
                            return False
                    self._granted.acquire()  # granted between the timeout and the mutex
                    break
                # waited long enough: from now on nobody takes the lock past the queue
                # (held by another already: the same effect while that waiter waits)
                flag = flag or _range_lock(self.fd, _STARVING, fcntl.F_WRLCK, wait=False)
                patience = timeout_s if flag else STARVING_AFTER_S
        finally:
            if flag:
                _range_lock(self.fd, _STARVING, fcntl.F_UNLCK, wait=False)
        if not self._taken:
            raise OSError("the writers' queue wait failed")
        return True

    def release(self) -> None:
        if self.ranges:
            _range_lock(self.fd, _ROOM, fcntl.F_UNLCK, wait=False)
        else:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _take(self) -> None:
        if not self.ranges:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return
        _range_lock(self.fd, _TURN, fcntl.F_WRLCK, wait=True)
        try:
            _range_lock(self.fd, _ROOM, fcntl.F_WRLCK, wait=True)
        finally:
            _range_lock(self.fd, _TURN, fcntl.F_UNLCK, wait=False)

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self._closed:
                break
            try:
                self._take()
                taken = True
            except OSError:
                taken = False
            with self._mutex:
                self._waiting = False
                if self._wanted:
                    self._wanted, self._taken = False, taken
                    self._granted.release()
                    continue
            if taken:
                self.release()  # nobody wants it any more
            if self._closed:
                break
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def close(self) -> None:
        """Close the file, or leave it to the helper while its wait is under way (its
        descriptor must not be reused under it)."""
        with self._mutex:
            self._closed = True
            helper = self._helper if self._pid == os.getpid() else None
            waiting = self._waiting
            if helper is not None:
                self._go.release()  # ends an idle helper; a waiting one ends after its wait
        if helper is None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        elif not waiting:
            helper.join(timeout=5)


class Database:
    """One apsw connection to a ledger file, opened defensively."""

    def __init__(self, conn: apsw.Connection, path: str, version: int, readonly: bool) -> None:
        self.conn, self.path, self.version, self.readonly = conn, path, version, readonly
        #: Called with "commit" just before each COMMIT (the chaos harness counts these).
        self.on_op: Callable[[str], None] | None = None
        # A read-only open of a file with no -wal reads it `immutable=1` (nothing created);
        # such a connection would never see a later writer, so each read transaction first
        # checks whether the file moved on and, if so, reopens (`_refresh`).
        self._immutable: tuple[int, int] | None = None
        self._reopen: Callable[[], apsw.Connection] | None = None
        # The WAL write lock has no queue. A writer that waits announces it by holding a
        # shared flock on `<ledger>-lockq`; a writer about to BEGIN first tries an
        # exclusive one and, while anyone waits, steps aside for a few ms (bounded).
        self._lockq: int | None = None
        self._queue: WriterQueue | None = None
        self._busy_timeout_s = BUSY_TIMEOUT_MS / 1000
        self._held = 0  # depth of `write_lock`
        # The checkpoint policy (`_wal_hook`, `_checkpoint`).
        self._wal_pages = 0
        self._checkpoint_at = CHECKPOINT_PAGES
        self._checkpoint_due = False
        self.stats = WriteStats()
        #: The lock files (-shm, -wal) a read-only open created: `close_refused` removes them.
        self._created: list[str] = []
        #: A forensic open (see `open`) and how its schema differs from the allow-list.
        self.forensic = False
        self.schema_changes: tuple[str, ...] = ()

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        *,
        readonly: bool = False,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        vfs: str | None = None,
        forensic: bool = False,
        immutable: bool = False,
    ) -> Database:
        """Open an existing ledger. Refused files are left byte-identical.

        `forensic` (read-only only: `verify`) also opens a ledger whose schema differs
        outside its tables (its append-only triggers dropped, say) and lists how in
        `schema_changes`, so that it can be examined rather than refused.

        The file is judged first (plain-I/O header, then the schema allow-list through
        a connection that creates nothing: `immutable=1` when no ``-wal`` exists), so a
        refused file gets no ``-wal``/``-shm``. A read-only open of an accepted ledger
        then reads with SQLite's real locks (`mode=ro`), which creates an empty ``-wal``
        and a ``-shm`` when absent and never changes the file: its read transactions
        are consistent snapshots while writers commit and checkpoint beside it. Only
        where those cannot be created (read-only media, a directory it may not write)
        does it read `immutable=1`, which is consistent because no writer can run there
        without creating a ``-wal`` (`_refresh` reopens once one has).
        """
        synchronous = _check_sync(synchronous)
        if forensic and not readonly:
            raise InvalidInput("a forensic open is read-only: pass readonly=True")
        path = resolved(path)
        if not readonly:
            _refuse_symlinks(path)
        header = read_header(path)
        version = _judge(path, header, busy_timeout_ms, vfs, forensic)
        if not readonly:
            make_private(path)  # a ledger made before its files were private
            return cls._open_writer(path, synchronous, busy_timeout_ms, vfs)
        shm, wal = path + "-shm", wal_path(path)
        if immutable:
            # asked for: a ledger nobody writes, read without creating anything beside it
            if os.path.exists(wal) and os.path.getsize(wal) > 0:
                raise InvalidInput(
                    f"ledger {path} has a -wal holding commits: a writer is or was live, and"
                    " an immutable read would miss them; open it read-only (not immutable),"
                    " or copy the ledger with 'steptrail backup' and read the copy")
            return cls._immutable_reader(path, busy_timeout_ms, vfs, forensic, asked=True)
        shm_existed, wal_existed = os.path.lexists(shm), os.path.lexists(wal)
        try:
            conn = _reader(path, busy_timeout_ms, vfs, immutable=False)
            # again: the file may have been swapped
            version = check_contents(conn, path, forensic=forensic)
        except (apsw.CantOpenError, apsw.ReadOnlyError):
            # No -shm can be created here. With no committed -wal content, reading the
            # main file alone is complete, and no writer can run without creating one.
            if os.path.exists(wal) and os.path.getsize(wal) > 0:
                # a ledger, readable elsewhere: the place, not the file, is the problem
                raise AccessDenied(path, "its -wal holds committed data and SQLite cannot"
                                   " create the -shm it needs to read it beside it (the"
                                   " directory is read-only to this user)",
                                   "copy the ledger and its -wal somewhere writable, or read"
                                   " it as a user who may write its directory",
                                   readers_work=False) from None
            _remove_created(shm, shm_existed)
            _remove_created(wal, wal_existed)
            return cls._immutable_reader(path, busy_timeout_ms, vfs, forensic)
        except BaseException as exc:
            _remove_created(shm, shm_existed)
            _remove_created(wal, wal_existed)
            if isinstance(exc, apsw.Error | UnicodeDecodeError):
                raise NotALedger(path, f"SQLite cannot read it: {exc}") from None
            raise
        db = cls(conn, path, version, readonly=True)
        db._created = [p for p, existed in ((shm, shm_existed), (wal, wal_existed)) if not existed]
        db._forensic(forensic)
        stand_ins(conn, version)
        return db

    @staticmethod
    def refuse_symlinks(path: str) -> None:
        """NotALedger if one of the ledger's own files at `path` is a symlink (see
        `_refuse_symlinks`); its directory may be one (`resolved`)."""
        _refuse_symlinks(resolved(path))

    def _forensic(self, forensic: bool) -> None:
        self.forensic = forensic
        if forensic:
            self.schema_changes = tuple(schema_changes(self.conn, self.version))

    @classmethod
    def _immutable_reader(cls, path: str, busy_timeout_ms: int, vfs: str | None,
                          forensic: bool, *, asked: bool = False) -> Database:
        """A reader of a ledger beside which no -shm can be created (see `open`), or
        one `asked` for: that one never creates anything, and refuses to read on once a
        writer has appeared (a -wal) rather than miss its commits."""
        try:
            st = os.stat(path)
            conn = _reader(path, busy_timeout_ms, vfs, immutable=True)
            version = check_contents(conn, path, forensic=forensic)
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise NotALedger(path, f"SQLite cannot read it: {exc}") from None
        except OSError as exc:
            raise translate(exc, path) from None
        db = cls(conn, path, version, readonly=True)
        db._immutable = (st.st_mtime_ns, st.st_size)
        db._forensic(forensic)
        stand_ins(conn, version)

        def reopen() -> apsw.Connection:
            if asked and os.path.exists(wal_path(path)):
                raise InvalidInput(f"ledger {path} is being written (a -wal appeared) since it"
                                   " was opened immutable; open it read-only instead")
            fresh = _reader(path, busy_timeout_ms, vfs, immutable=not os.path.exists(wal_path(path)))
            stand_ins(fresh, check_contents(fresh, path, forensic=forensic))
            return fresh

        db._reopen = reopen
        return db

    @classmethod
    def _open_writer(
        cls, path: str, synchronous: Synchronous, busy_timeout_ms: int, vfs: str | None
    ) -> Database:
        kwargs = {"vfs": vfs} if vfs else {}
        try:
            conn = apsw.Connection(
                path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW, **kwargs
            )
        except apsw.Error as exc:
            raise translate(exc, path) from None
        try:
            _harden(conn, allow_triggers=False)
            set_busy(conn, busy_timeout_ms)
            version = check_contents(conn, path)  # again: the file may have been swapped
            conn.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 1)  # our own, just verified
            _set_wal(conn, path, busy_timeout_ms)
            conn.execute(f"PRAGMA synchronous={_check_sync(synchronous)}")
            db = cls(conn, path, version, readonly=False)
            db._open_lockq(busy_timeout_ms)
            if version < SCHEMA_VERSION:
                db._migrate(version)
            return db
        except apsw.Error as exc:
            conn.close()
            raise translate(exc, path) from None
        except BaseException:
            conn.close()
            raise

    @classmethod
    def create(
        cls,
        path: str,
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        vfs: str | None = None,
    ) -> tuple[Database, bool]:
        """Create a ledger at `path`, or open the one already there.

        Returns the database and whether it was created. A file that exists and is not a
        ledger is refused untouched; an empty file, or a SQLite file that never held a
        schema (a crash inside `init`), is initialized.
        """
        synchronous = _check_sync(synchronous)  # bad input writes nothing, not even a file
        path = resolved(path)
        _refuse_symlinks(path)
        try:
            if os.path.getsize(path) > 0 or os.path.exists(wal_path(path)):
                return cls.open(path, synchronous=synchronous,
                                busy_timeout_ms=busy_timeout_ms, vfs=vfs), False
        except FileNotFoundError:
            pass
        except NotALedger as refused:
            if not _never_initialized(path):
                # Judged while a concurrent init was midway (page 1 switched to WAL, no
                # schema yet), looked at again after it finished: the file is a ledger
                # now. Judge it once more; a file that is not a ledger is refused again,
                # untouched.
                try:
                    return cls.open(path, synchronous=synchronous,
                                    busy_timeout_ms=busy_timeout_ms, vfs=vfs), False
                except NotALedger:
                    raise refused from None
        parent = os.path.dirname(os.path.abspath(path))
        made: os.stat_result | None = None  # the empty file this init created
        try:
            _makedirs_durably(parent)
            ignore_in_git(parent)
            with contextlib.suppress(FileExistsError):  # a concurrent init made it first
                # created private before SQLite sees it (it would create it 0644 & ~umask)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, LEDGER_FILE_MODE)
                made = os.fstat(fd)
                os.close(fd)
            conn = apsw.Connection(
                path,
                flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
                | apsw.SQLITE_OPEN_NOFOLLOW,
                **({"vfs": vfs} if vfs else {}),
            )
        except (apsw.Error, OSError) as exc:
            _remove_made(path, made)
            raise translate(exc, path) from None
        try:
            _harden(conn, allow_triggers=True)
            set_busy(conn, busy_timeout_ms)
            _set_wal(conn, path, busy_timeout_ms)
            conn.execute(f"PRAGMA synchronous={_check_sync(synchronous)}")
            created = False
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Two concurrent inits: the loser finds the schema and only verifies it.
                if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                    if conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]:
                        raise NotALedger(path, "it is a SQLite database with other tables")
                    for v in range(1, SCHEMA_VERSION + 1):
                        conn.execute(MIGRATIONS[v])
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES ('ledger_id', ?), ('created_ns', ?)",
                        (uuid.uuid4().hex, str(time.time_ns())),
                    )
                    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    created = True
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled back already (an I/O error)
                    with contextlib.suppress(apsw.Error):
                        conn.execute("ROLLBACK")
                raise
            # Put the header (application id, version) into the main file so that the
            # plain-I/O header check recognises the ledger from now on.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            version = check_contents(conn, path)
            db = cls(conn, path, version, readonly=False)
            db._open_lockq(busy_timeout_ms)
            return db, created
        except apsw.Error as exc:
            _close_quietly(conn)
            _remove_made(path, made)
            raise translate(exc, path) from None
        except BaseException:
            _close_quietly(conn)
            _remove_made(path, made)
            raise

    def _migrate(self, version: int) -> None:
        with self.transaction():
            # Read again under the write lock: another opener may have migrated the file
            # since `version` was read (workers starting together after an upgrade), and
            # a migration does not run twice (v6 copies a table and makes triggers).
            now = int(self.conn.execute("PRAGMA user_version").fetchone()[0])
            if now != version:
                now = check_contents(self.conn, self.path)
            for v in range(now + 1, SCHEMA_VERSION + 1):
                self.conn.execute(MIGRATIONS[v])
            if now < SCHEMA_VERSION:
                self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self.version = SCHEMA_VERSION

    def follow_migration(self) -> None:
        """A read-only connection to a file of an older version reads the tables later
        versions added from empty stand-ins (`schema.stand_ins`); once another process
        has migrated the file, the real tables are there and the stand-ins would hide
        them (TEMP is searched first): dropped, and the version read again."""
        if not self.readonly or self.version >= SCHEMA_VERSION:
            return
        now = int(self.conn.execute("PRAGMA main.user_version").fetchone()[0])
        if now != self.version:
            drop_stand_ins(self.conn, self.version, now)
            self.version = now

    # -- transactions --------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[apsw.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: either everything inside is written or nothing.

        A COMMIT that raised may still have been durable; the caller retries with the
        same journal keys, which is why they exist.
        """
        if self.readonly:
            raise ReadOnlyLedger(self.path)
        conn, stats = self.conn, self.stats
        t0 = time.perf_counter()
        # (inside a transaction BEGIN fails as it did before: the queue is left alone,
        # its lock belongs to the transaction already open)
        queued = not conn.in_transaction and not self._held and self._take_write_lock()
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except apsw.Error as exc:
                raise translate(exc, self.path) from None
            t1 = time.perf_counter()
            stats.transactions += 1
            stats.wait_s += t1 - t0
            try:
                yield conn
                if self.on_op is not None:
                    self.on_op("commit")
                t2 = time.perf_counter()
                conn.execute("COMMIT")
                t3 = time.perf_counter()
                stats.commit_s += t3 - t2
                stats.held_s += t3 - t1
            except BaseException as exc:
                if conn.in_transaction:
                    with contextlib.suppress(apsw.Error):
                        conn.execute("ROLLBACK")
                if isinstance(exc, apsw.Error):
                    raise translate(exc, self.path) from exc
                raise
        finally:
            if queued and self._queue is not None and self._lockq is not None:
                self._queue.release()
        if self._checkpoint_due and not self._held:
            self._checkpoint()

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold the writers' queue lock across several transactions (one step's), so
        that no other writer commits between them; `transaction` inside takes nothing."""
        if self._held:
            self._held += 1
            try:
                yield
            finally:
                self._held -= 1
            return
        queued = self._take_write_lock()
        self._held = 1
        try:
            yield
        finally:
            self._held = 0
            if queued and self._queue is not None and self._lockq is not None:
                self._queue.release()
        if self._checkpoint_due:
            self._checkpoint()

    # -- the writers' queue -----------------------------------------------------------

    def _open_lockq(self, busy_timeout_ms: int) -> None:
        set_busy(self.conn, busy_timeout_ms, self.stats)
        self.conn.set_wal_hook(self._wal_hook)
        self._busy_timeout_s = busy_timeout_ms / 1000
        try:
            self._lockq = os.open(self.path + "-lockq", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                                  | os.O_NOFOLLOW, LEDGER_FILE_MODE)
        except OSError:
            self._lockq = None  # no queue (a read-only directory): SQLite's lock alone
            return
        self._queue = WriterQueue(self._lockq)

    def _wal_hook(self, _conn: apsw.Connection, _name: str, pages: int) -> int:
        """After each of this connection's commits, with the -wal's size in pages: note
        a checkpoint due; `transaction` runs it once the writers' queue is let go (see
        `_checkpoint`). Replaces SQLite's autocheckpoint, which runs inside the COMMIT
        — under the queue's lock, every other writer waiting on it."""
        if pages < self._wal_pages:  # the -wal started over
            self._checkpoint_at = CHECKPOINT_PAGES
        self._wal_pages = pages
        self._checkpoint_due = pages >= self._checkpoint_at
        return apsw.SQLITE_OK

    def _checkpoint(self) -> None:
        """A PASSIVE checkpoint, out of the writers' way: it copies what no reader still
        needs from the -wal into the file (fsynced) while other writers commit. The next
        writer starts the -wal over if it copied everything and no reader is reading
        the -wal then; otherwise the -wal grows on, and this connection checkpoints
        again once it has grown by another CHECKPOINT_PAGES — not after every commit,
        which is what SQLite's autocheckpoint does then (each attempt an fsync of the
        file). A failure is left to the next attempt, as SQLite's own autocheckpoint
        leaves it (the commit was durable in the -wal already)."""
        self._checkpoint_due = False
        t0 = time.perf_counter()
        try:
            log, done = self.conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.Error:
            log, done = self._wal_pages, -1
        self.stats.checkpoints += 1
        self.stats.checkpoint_s += time.perf_counter() - t0
        del log, done  # complete or not: the -wal starts over only when no reader is in it
        self._checkpoint_at = self._wal_pages + CHECKPOINT_PAGES

    def _take_write_lock(self) -> bool:
        """Take the writers' queue lock (see `WriterQueue`); False where there is none.
        LedgerBusy when it stays held for the busy timeout."""
        queue = self._queue
        if queue is None or self._lockq is None:
            return False
        if queue.try_take():
            return True
        self.stats.waited += 1
        try:
            if queue.wait(self._busy_timeout_s):
                return True
        except OSError:
            return False  # the queue failed (it never should): SQLite's own lock still holds
        raise LedgerBusy(self.path, self._busy_timeout_s)

    def _refresh(self) -> None:
        """Reopen an `immutable=1` reader whose file a writer has changed since."""
        if self._immutable is None or self._reopen is None:
            return
        try:
            st = os.stat(self.path)
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) == self._immutable and not os.path.exists(
                wal_path(self.path)):
            return
        try:
            fresh = self._reopen()
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise read_error(exc, self.path) from None
        self.conn.close()
        self.conn = fresh
        self._immutable = None if os.path.exists(wal_path(self.path)) else (st.st_mtime_ns, st.st_size)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[apsw.Connection]:
        """A read transaction: every query inside sees one consistent state."""
        conn = self.conn
        if conn.in_transaction:
            yield conn
            return
        if self._immutable is not None:
            self._refresh()
            conn = self.conn
        try:
            conn.execute("BEGIN")
            self.follow_migration()
        except apsw.Error as exc:
            raise translate(exc, self.path) from None
        try:
            yield conn
        except LedgerError:
            raise
        except apsw.Error as exc:
            # (a row the view could not read is named where it was met: `locked_view`;
            # any other exception is the caller's own and passes through as it is)
            raise read_error(exc, self.path) from exc
        finally:
            if conn.in_transaction:
                with contextlib.suppress(apsw.Error):
                    conn.execute("COMMIT")

    def snapshot(self, path: str) -> None:
        """Write a consistent copy of the database to the new file `path` and fsync it.

        ``VACUUM INTO`` reads in one read transaction, so the copy is one committed state
        while WAL writers go on (they are never blocked; checkpoints stop at the reader's
        mark until it ends) and it is compact: no free pages, no -wal, rollback-journal
        mode, so a reader of the copy creates no lock files beside it. The connection's
        attach limit (0: see `_harden`) is lifted to 1 for the statement, which attaches
        the output internally. `path` must not exist.
        """
        if self.conn.in_transaction:
            raise InvalidInput("a snapshot cannot be taken inside a transaction")
        if os.path.lexists(path):
            raise InvalidInput(f"snapshot target {path} exists; give a new file")
        if self._immutable is not None:
            self._refresh()
        self.conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 1)
        try:
            self.conn.execute("VACUUM INTO ?", (path,))
        except apsw.Error as exc:
            raise translate(exc, path) from None
        finally:
            self.conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 0)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise translate(exc, path) from None

    def meta_value(self, key: str) -> str | None:
        """A meta value; None if the key is absent (CorruptLedger if it cannot be read)."""
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except (apsw.Error, UnicodeDecodeError) as exc:
            raise read_error(exc, self.path) from None
        if row is None:
            return None
        if not isinstance(row[0], str):
            raise CorruptLedger(self.path, f"meta key {key!r} holds a {type(row[0]).__name__}, not text")
        return row[0]

    def meta(self, key: str) -> str:
        value = self.meta_value(key)
        if value is None:
            raise CorruptLedger(self.path, f"meta key {key!r} is missing")
        return value

    def close_refused(self) -> None:
        """Close a ledger its opener refused after it opened (damaged beyond the schema, off
        its witness): errors of the close are suppressed (the refusal says more), and the
        -shm and still empty -wal a read-only open created are removed, so a refused file
        is left as it was found."""
        with contextlib.suppress(LedgerError):
            self.close()
        for sidecar in self._created:
            _remove_created(sidecar, existed=False)

    def close(self) -> None:
        """Close; a failing final checkpoint is an environment error (exit 3), typed —
        what was committed is durable in the WAL either way. A reader's close writes
        nothing of the ledger (it cannot checkpoint): a failure there (releasing its
        locks, say) is not reported."""
        if self._queue is not None and self._lockq is not None:
            self._queue.close()  # closes the -lockq (or leaves it to a wait still under way)
        elif self._lockq is not None:
            with contextlib.suppress(OSError):
                os.close(self._lockq)
        self._lockq, self._queue = None, None
        try:
            self.conn.close()
        except apsw.Error as exc:
            with contextlib.suppress(apsw.Error):
                self.conn.close(True)
            if not self.readonly:
                raise translate(exc, self.path) from None


def _remove_created(sidecar: str, existed: bool) -> None:
    """Remove the -shm, or the empty -wal, that a refused read-only open created (never
    one that was there before the open)."""
    if existed:
        return
    with contextlib.suppress(OSError):
        st = os.lstat(sidecar)
        if stat.S_ISREG(st.st_mode) and (sidecar.endswith("-shm") or st.st_size == 0):
            os.unlink(sidecar)


def _reader(path: str, busy_timeout_ms: int, vfs: str | None, *, immutable: bool
            ) -> apsw.Connection:
    """A hardened read-only connection (`immutable=1`: no locks, nothing created)."""
    conn = apsw.Connection(_readonly_uri(path, immutable=immutable),
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI,
                           **({"vfs": vfs} if vfs else {}))
    try:
        _harden(conn, allow_triggers=False)
        set_busy(conn, busy_timeout_ms)
    except BaseException:
        _close_quietly(conn)
        raise
    return conn


#: How often `_judge` re-reads a file that a writer changed under it.
JUDGE_TRIES: Final = 5


def _file_state(path: str) -> tuple[int, int, int, bool]:
    """What changes when a writer moves the file on: inode, size, mtime, a -wal."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, os.path.exists(wal_path(path))


def _judge(path: str, header: Header | None, busy_timeout_ms: int, vfs: str | None,
           forensic: bool = False) -> int:
    """Check the contents (application id, version, schema allow-list) without leaving a
    file behind; return the version. With no -wal the check reads `immutable=1`, which
    takes no locks: a refusal seen while a writer changed the file (a checkpoint, a new
    -wal) may be a torn read, so the file is judged again, up to JUDGE_TRIES times. With
    a -wal it reads through it, which creates a -shm; a refusal removes that -shm."""
    shm = path + "-shm"
    for tries_left in range(JUDGE_TRIES - 1, -1, -1):
        shm_existed = os.path.lexists(shm)
        # (an empty -wal, as readers leave it, holds nothing to read through)
        through_wal = os.path.exists(wal_path(path)) and os.path.getsize(wal_path(path)) > 0
        try:
            before = _file_state(path)
        except OSError as exc:
            raise translate(exc, path) from None
        try:
            conn = _reader(path, busy_timeout_ms, vfs, immutable=not through_wal)
        except apsw.Error as exc:
            _remove_created(shm, shm_existed)
            raise NotALedger(path, f"SQLite cannot open it: {exc}") from None
        try:
            version = check_contents(conn, path, forensic=forensic)
        except BaseException as exc:
            with contextlib.suppress(apsw.Error):  # the error being raised says more
                conn.close()
            if through_wal:
                _remove_created(shm, shm_existed)
            with contextlib.suppress(OSError):
                if (tries_left and not through_wal and isinstance(exc, LedgerError | apsw.Error)
                        and _file_state(path) != before):
                    continue
            if isinstance(exc, NotALedger) and through_wal and header is not None:
                # The main file's header is a ledger's: what SQLite read came from the -wal.
                raise NotALedger(wal_path(path), f"the ledger's own header is fine, but through"
                                 f" this -wal SQLite reads another database ({exc.why}): the"
                                 " -wal belongs to another file; move it aside") from None
            if (isinstance(exc, apsw.CantOpenError | apsw.ReadOnlyError) and through_wal
                    and header is not None and not shm_existed
                    and not os.access(os.path.dirname(path) or ".", os.W_OK)):
                # a ledger by its header, readable elsewhere: it is the place — a directory
                # this user may not create the -shm in — that SQLite cannot read it from
                raise AccessDenied(path, "its -wal holds committed data and SQLite cannot"
                                   " create the -shm it needs to read it beside it (the"
                                   " directory is read-only to this user)",
                                   "copy the ledger and its -wal somewhere writable, or read"
                                   " it as a user who may write its directory",
                                   readers_work=False) from None
            if isinstance(exc, apsw.Error | UnicodeDecodeError):
                raise NotALedger(path, f"SQLite cannot read it: {exc}") from None
            raise
        _close_quietly(conn)  # a reader: its close writes nothing of the ledger
        return version
    raise AssertionError("unreachable: the last try returns or raises")


def resolved(path: str) -> str:
    """`path` with the directory it names resolved once, symlinks and all (``/tmp`` and
    ``/var`` are symlinks on macOS), and its last component kept as it is: SQLite's
    SQLITE_OPEN_NOFOLLOW refuses a symlink anywhere in a path, and only the ledger's own
    files must not be one (`_refuse_symlinks`). A path whose directory holds no symlink
    is returned unchanged (messages keep naming it as it was given)."""
    directory, name = os.path.split(os.path.abspath(path))
    real = os.path.realpath(directory)
    return path if real == directory else os.path.join(real, name)


#: The ledger's own files beside it (`path` + suffix): a writer never follows a symlink
#: to any of them.
OWN_SUFFIXES: Final = ("", "-wal", "-shm", "-lockq")


def _refuse_symlinks(path: str) -> None:
    """A writer opens the ledger with SQLITE_OPEN_NOFOLLOW, which fails on a symlinked
    file (or -wal/-shm) with a bare CANTOPEN; name the symlink instead, before any file
    is created (exit 2: the path is the problem, not the disk). Only the ledger's own
    files are judged: a symlinked directory above them was resolved (`resolved`)."""
    for p in (path + suffix for suffix in OWN_SUFFIXES):
        if os.path.islink(p):
            raise NotALedger(p, "it is a symlink (a writer never follows one: another file"
                             " could be written through it); give the real path, or remove"
                             " the symlink")


def _remove_made(path: str, made: os.stat_result | None) -> None:
    """Remove the empty file a failed `create` made (`made`: its stat when created), and
    the empty -wal and the -shm SQLite made beside it: an init that fails leaves nothing
    behind. A file another process has since written to (a concurrent init) stays."""
    if made is None:
        return
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        wal = os.lstat(wal_path(path)).st_size if os.path.lexists(wal_path(path)) else 0
        if (st.st_ino, st.st_dev) == (made.st_ino, made.st_dev) and st.st_size == 0 \
                and wal == 0:
            for p in (wal_path(path), path + "-shm", path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)


def _close_quietly(conn: apsw.Connection) -> None:
    """Close on an error path: the first error is the one to report."""
    with contextlib.suppress(apsw.Error):
        conn.close(True)


def make_private(path: str) -> None:
    """Take group and other access off the ledger's own files (a ledger made before they
    were created private): the database, its -wal, -shm and -lockq. Only ever removes
    permissions, and never follows a symlink; best effort (a file owned by someone else
    is left as it is). The directory is not touched: it may be the user's own."""
    for p in (path, wal_path(path), path + "-shm", path + "-lockq"):
        try:
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o077)
        except OSError:
            continue


def _makedirs_durably(directory: str) -> None:
    """`os.makedirs` (the ledger's own directory private), then fsync the parent of every
    directory it created (a new directory's entry is durable only once its parent is
    fsynced)."""
    missing = []
    d = directory
    while d and not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    os.makedirs(directory, mode=LEDGER_DIR_MODE, exist_ok=True)  # the mode: the leaf only
    for created in reversed(missing):
        fd = os.open(os.path.dirname(created) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def flock_held(path: str) -> bool:
    """Whether another process holds an exclusive flock on the file at `path` now (a
    shared probe that creates nothing; no file: nobody ever held it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also releases the probe's lock (flock: per open file)
    return False


def _never_initialized(path: str) -> bool:
    """Whether `path` is what a crash inside `init` leaves: an empty file, or a SQLite
    header that never held a schema (schema cookie, user version and application id all
    0: switching an empty file to WAL writes page 1 before any table exists), with a
    ``-wal`` through which nothing was committed (no frame, or frames SQLite itself
    does not count as committed: the power went before the commit frame was durable).
    The file is never opened by SQLite here: plain I/O, and SQLite on a copy."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
        wal_size = os.path.getsize(wal_path(path)) if os.path.exists(wal_path(path)) else 0
    except OSError:
        return False
    if head and not (
        len(head) == 100
        and head[:16] == SQLITE_MAGIC
        and head[40:44] == bytes(4)  # schema cookie
        and head[60:64] == bytes(4)  # user_version
        and head[68:72] == bytes(4)  # application_id
    ):
        return False
    return not wal_size or not _wal_has_frames(path) or _wal_commits_nothing(path)


#: A -wal larger than this is not what an interrupted `init` writes (its schema is a few
#: dozen pages): such a file is never taken for a crashed init.
INIT_WAL_MAX: Final = 1 << 20


def _wal_commits_nothing(path: str) -> bool:
    """Whether SQLite, reading a copy of the file and its -wal (WAL recovery included),
    finds nothing committed: no table, user version and application id 0. A foreign
    database whose content lives in its -wal has tables there and is refused; the file
    itself is not touched (a connection closing on it would checkpoint its -wal)."""
    try:
        if os.path.getsize(wal_path(path)) > INIT_WAL_MAX or os.path.getsize(path) > INIT_WAL_MAX:
            return False
        probe_dir = tempfile.mkdtemp(prefix="steptrail-init-probe-")
    except OSError:
        return False
    try:
        probe = os.path.join(probe_dir, "probe.db")
        shutil.copyfile(path, probe, follow_symlinks=False)
        shutil.copyfile(wal_path(path), wal_path(probe), follow_symlinks=False)
        conn = apsw.Connection(probe, flags=apsw.SQLITE_OPEN_READWRITE)
        try:
            _harden(conn, allow_triggers=False)
            tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
            ids = (conn.execute("PRAGMA user_version").fetchone()[0],
                   conn.execute("PRAGMA application_id").fetchone()[0])
        finally:
            conn.close()
        return tables == 0 and ids == (0, 0)
    except (apsw.Error, OSError):
        return False
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


WAL_MAGIC: Final = (0x377F0682, 0x377F0683)
WAL_HEADER: Final = 32
WAL_FRAME_HEADER: Final = 24


def _wal_head(path: str) -> tuple[int, int, int] | None:
    """(magic, page size, file size) of the -wal's header; None when it has none."""
    try:
        size = os.path.getsize(wal_path(path))
        with open(wal_path(path), "rb") as f:
            head = f.read(WAL_HEADER)
    except OSError:
        return None
    if len(head) < WAL_HEADER:
        return None
    magic, _version, page_size = struct.unpack(">III", head[:12])
    return magic, page_size, size


def _wal_header_valid(path: str) -> bool:
    """Whether the -wal starts with a WAL header (magic and a sane page size)."""
    head = _wal_head(path)
    if head is None:
        return False
    magic, page_size, _ = head
    return magic in WAL_MAGIC and page_size >= 512 and page_size & (page_size - 1) == 0


def _wal_has_frames(path: str) -> bool:
    """Whether the -wal holds at least one whole frame (a crash inside init can leave a
    bare 32-byte header: nothing was ever committed through it)."""
    head = _wal_head(path)
    if head is None:
        return False
    _, page_size, size = head
    return size >= WAL_HEADER + WAL_FRAME_HEADER + max(page_size, 512)


def _set_wal(conn: apsw.Connection, path: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
    # Switching a new file to WAL needs its exclusive lock, and SQLite answers SQLITE_BUSY
    # at once, without the busy handler, while another connection holds any lock on it:
    # two processes creating one ledger at the same moment. Retried here, for as long as
    # the busy timeout would have waited.
    deadline = time.monotonic() + busy_timeout_ms / 1000
    pause = 0.001
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            break
        except apsw.BusyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    if str(mode).lower() != "wal":
        raise StorageFailure(path, f"SQLite answered journal_mode={mode!r} instead of 'wal'")


def _check_sync(value: str) -> str:
    value = value.upper()
    if value not in ("FULL", "EXTRA", "NORMAL", "OFF"):
        raise InvalidInput(f"synchronous={value!r} is not one of FULL, EXTRA, NORMAL, OFF")
    return value



#: A backup directory's completion marker, and the name of the database snapshot it
#: names (`ledger.backup`): such a file is never opened to write.
from ...events import BACKUP_DB_NAME, BACKUP_MARKER  # noqa: E402  (the backup format's)


def refuse_a_backups_database(path: str) -> None:
    """InvalidInput, before anything is opened, for a backup's database (a
    ``ledger-<seq>-<hash>.db`` beside a ``BACKUP.json``) opened to write: a backup stays
    what its marker says; it is restored (`backup restore`), or read read-only."""
    where, name = os.path.split(os.path.abspath(path))
    if BACKUP_DB_NAME.fullmatch(name) and os.path.lexists(os.path.join(where, BACKUP_MARKER)):
        fact = f"{path} is the database of the backup in {where}, which is never written to;"
        raise InvalidInput(
            f"{fact} restore it first (restore_backup({where!r}, NEW_DIR) from ledger.backup)"
            " and use the ledger that makes, or open this one with readonly=True"
        ).at_a_shell(f"{fact} restore it first ('steptrail backup restore {where} NEW_DIR') and"
                     " use the ledger that makes, or read this one with read-only commands"
                     " (verify, show, events)")

__all__ = [
    "APPLICATION_ID", "BUSY_TIMEOUT_MS", "GC_LOCK_NAME", "LEDGER_DIR_MODE", "LEDGER_FILE_MODE",
    "MIGRATIONS", "ROW_ERRORS", "SCHEMA_VERSION", "SQLITE_MAGIC", "VALUE_SIZE_MAX", "Database",
    "Header", "Synchronous", "access_denied", "expected_schema", "flock_held", "make_private",
    "read_error", "read_header", "schema_changes", "set_busy", "translate", "wal_path", "WriteStats", "WriterQueue",
]

"""What SQLite and the OS raise, as steptrail's typed errors (exit code 3 or 2).

Most failures are mapped where they happen (`translate`, `read_error`). What the driver
raises past every boundary is told apart by `BUSY_ERRORS`, `STORAGE_ERRORS` and
`DAMAGE_ERRORS` (the command line's last resort catches through them, so it imports no
driver)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any, Final

import apsw

from .. import BUSY_TIMEOUT_MS, ROW_ERRORS  # declared by the interface
from ..view import Driver

from ...errors import (
    AccessDenied,
    CorruptLedger,
    InvalidInput,
    LedgerBusy,
    LedgerError,
    NotALedger,
    StorageFailure,
)

VALUE_SIZE_MAX: Final = 64 * 1024 * 1024  # SQLITE_LIMIT_LENGTH: bounds any row we read


def wal_path(path: str) -> str:
    return path + "-wal"


#: What SQLite and the OS raise when a file or directory cannot be written (the cause
#: is then looked up by `access_denied`).
_WRITE_REFUSED: Final = (apsw.CantOpenError, apsw.ReadOnlyError, apsw.PermissionsError)
_WRITE_REFUSED_ERRNOS: Final = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def access_denied(path: str, what: str = "the ledger") -> AccessDenied | None:
    """Why `path` (a ledger file, or a directory of the ledger's) cannot be written here,
    as a typed error naming the fix; None when nothing says so (another failure)."""
    target = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    existing = target
    while existing and not os.path.exists(existing):  # init: the nearest existing parent
        existing = os.path.dirname(existing)
    try:
        if os.statvfs(existing or "/").f_flag & os.ST_RDONLY:
            return AccessDenied(path, f"{existing} is on a read-only file system",
                               f"remount it read-write or copy {what} somewhere writable")
    except OSError:
        pass
    if existing and not os.access(existing, os.W_OK | os.X_OK):
        return AccessDenied(path, f"this user may not create files in {existing} (a writer"
                           f" creates the -wal and -shm beside the ledger, and blobs)",
                           f"run as the owner of {what} or give this user write permission"
                           " on the directory")
    for p in (path, wal_path(path), path + "-shm"):
        if os.path.isfile(p) and not os.access(p, os.W_OK):
            return AccessDenied(path, f"this user may not write {p}",
                               "run as its owner or make it writable (chmod u+w)")
    return None


def translate(exc: BaseException, path: str) -> LedgerError:
    """Map an apsw or OS failure to our typed error (exit code 3 or 2)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, apsw.CantOpenError) \
            and getattr(exc, "extendedresult", None) == apsw.SQLITE_CANTOPEN_SYMLINK:
        # SQLITE_OPEN_NOFOLLOW met a symlink on the way (one swapped in after the
        # directory was resolved): the path is the problem, not the disk
        return NotALedger(path, "a symlink was met on its path (a writer never follows"
                          " one: another file could be written through it); give the"
                          " real path")
    if isinstance(exc, _WRITE_REFUSED) or (
            isinstance(exc, OSError) and exc.errno in _WRITE_REFUSED_ERRNOS):
        found = access_denied(path)
        if found is not None:
            return found
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return LedgerBusy(path, BUSY_TIMEOUT_MS / 1000)
    if isinstance(exc, apsw.FullError):
        return StorageFailure(path, "the disk is full")
    if isinstance(exc, apsw.CorruptError | apsw.NotADBError):
        return CorruptLedger(path, str(exc))
    if isinstance(exc, apsw.TooBigError):
        return InvalidInput(f"a value is too large for the ledger (SQLite's limit is"
                            f" {VALUE_SIZE_MAX} bytes): {exc}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return StorageFailure(path, "the disk is full")
    if isinstance(exc, apsw.IOError | apsw.CantOpenError | OSError | apsw.ReadOnlyError):
        return StorageFailure(path, f"{type(exc).__name__}: {exc}")
    raise exc


def read_error(exc: BaseException, path: str) -> LedgerError:
    """Map a failure while *reading* the ledger to a typed error: what translate() knows,
    and any other SQLite error or undecodable row as a damaged ledger (exit 2)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, apsw.Error):
        try:
            return translate(exc, path)
        except apsw.Error:
            return CorruptLedger(path, f"SQLite cannot read it: {exc}")
    if isinstance(exc, ROW_ERRORS):
        return CorruptLedger(path, f"a row cannot be read ({type(exc).__name__}: {exc})")
    raise exc


#: The driver's errors, by what they mean when no boundary mapped them (catch them in this
#: order: each later tuple holds the earlier ones' types): the ledger stayed locked by
#: another writer (LedgerBusy, exit 3) ...
BUSY_ERRORS: Final = (apsw.BusyError,)
#: ... the storage failed: a full disk, an I/O error (StorageFailure, exit 3) ...
STORAGE_ERRORS: Final = (apsw.FullError, apsw.IOError)
#: ... anything else of the driver's, or a TEXT cell it cannot decode: the file is
#: damaged (CorruptLedger, exit 2).
DAMAGE_ERRORS: Final = (apsw.Error, UnicodeDecodeError)


class SqliteDriver(Driver):
    """`ledger.store.view.Driver` over a `Database`'s apsw connection (read at each call:
    an immutable reader's connection is replaced when it refreshes). Reads raise apsw's
    errors (`raw_errors`) where the view does not map them; writes raise them to the
    transaction, which tells a driver error (`_intact`) from a refusal of ours."""

    mark: Final = "?"
    #: The most parameters one statement carries (SQLite's limit: 32,766).
    params_max: Final = 16_000
    raw_errors: Final = (apsw.Error, UnicodeDecodeError)

    def __init__(self, db: Any) -> None:
        self._db = db
        self.where = db.path

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self._db.conn.execute(sql, params).fetchone()  # type: ignore[no-any-return]

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._db.conn.execute(sql, params).fetchall()  # type: ignore[no-any-return]

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        conn = self._db.conn
        conn.execute(sql, params)
        return int(conn.changes())

    def execute_each(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._db.conn.executemany(sql, rows)

    def read_error(self, exc: BaseException) -> LedgerError:
        return read_error(exc, self._db.path)

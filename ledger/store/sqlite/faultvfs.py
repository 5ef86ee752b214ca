"""The SQLite half of the fault harness (`ledger.testing.faults`): a fault-injecting VFS.

`FaultVFS` is an apsw VFS over the default one whose files report every ``xWrite``,
``xTruncate`` and ``xSync`` to a simulated disk (a `FaultDisk`: the harness's
`PowerLossDisk`) before doing it, so a crash at operation k, an injected I/O error or a
full disk is one instant for the SQLite files and the blob directory alike. The disk
decides (count, fail, lose power) and keeps the durability model; this module only turns
its verdicts into SQLite error codes. Also here: what plain SQLite reads from a copy of
a ledger file (`sqlite_view`), the WAL recovery an operator would run (`recover_wal`),
and the hook that keeps the VFS errors SQLite swallowed quiet (`quiet_vfs_errors`).

Nothing in the runtime imports this module; the harness does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

import apsw

#: A failed operation's SQLite error code, by (operation kind, the disk's verdict).
_SQLITE_ERR = {
    ("db-write", "eio"): apsw.SQLITE_IOERR_WRITE,
    ("db-sync", "eio"): apsw.SQLITE_IOERR_FSYNC,
    ("db-truncate", "eio"): apsw.SQLITE_IOERR_TRUNCATE,
    ("db-write", "full"): apsw.SQLITE_FULL,
    ("db-sync", "full"): apsw.SQLITE_IOERR_FSYNC,
    ("db-truncate", "full"): apsw.SQLITE_FULL,
}


class FaultDisk(Protocol):
    """What `FaultVFS` asks of the simulated disk under it."""

    #: Also fsync for real (off: the model alone says what is durable).
    real_fsync: bool

    def sql_opened(self, path: str) -> None: ...

    def sql_deleted(self, path: str) -> None: ...

    def sql_op(self, kind: str, path: str, nbytes: int = 0) -> str | None:
        """Count one operation (``db-write``, ``db-sync``, ``db-truncate``): None (do it),
        ``"skip"`` (report success, do nothing), ``"eio"`` / ``"full"`` (fail it); an
        OSError once the power is off."""
        ...

    def sql_written(self, path: str, offset: int, data: bytes) -> None: ...

    def sql_truncated(self, path: str, size: int) -> None: ...

    def sql_synced(self, path: str) -> None: ...


class FaultFile(apsw.VFSFile):
    """One SQLite file: real I/O plus the disk's bookkeeping."""

    def __init__(self, vfs: FaultVFS, name: Any, flags: list[int]) -> None:
        super().__init__(vfs.parent, name, flags)
        self.disk = vfs.disk
        self.path = name.filename() if isinstance(name, apsw.URIFilename) else name
        self.disk.sql_opened(self.path)

    def _go(self, kind: str, nbytes: int = 0) -> bool:
        """Ask the disk; True: do the operation, False: report success without it."""
        try:
            verdict = self.disk.sql_op(kind, self.path, nbytes)
        except OSError:  # the power is off
            raise apsw.exception_for(apsw.SQLITE_IOERR) from None
        if verdict == "skip":
            return False
        if verdict is not None:
            raise apsw.exception_for(_SQLITE_ERR[(kind, verdict)])
        return True

    def xWrite(self, data: bytes, offset: int) -> None:
        if self._go("db-write", len(data)):
            super().xWrite(data, offset)
            self.disk.sql_written(self.path, offset, bytes(data))

    def xTruncate(self, size: int) -> None:
        if self._go("db-truncate"):
            super().xTruncate(size)
            self.disk.sql_truncated(self.path, size)

    def xSync(self, flags: int) -> None:
        if not self._go("db-sync"):
            return  # a swallowed failure (negative control): nothing became durable
        if self.disk.real_fsync:
            super().xSync(flags)
        self.disk.sql_synced(self.path)


class FaultVFS(apsw.VFS):
    """A registered VFS (over the default one) whose files live on `disk`; open a
    connection with ``vfs=FaultVFS(disk).name``. A context manager (unregisters on exit)."""

    _names = itertools.count()

    def __init__(self, disk: FaultDisk, name: str | None = None, parent: str = "") -> None:
        self.disk, self.parent = disk, parent
        self.name = name or f"faultfs{os.getpid()}-{next(self._names)}"
        super().__init__(self.name, parent)

    def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
        if name is None:  # an anonymous temporary file: not part of the ledger
            return apsw.VFSFile(self.parent, name, flags)
        return FaultFile(self, name, flags)

    def xDelete(self, name: str, syncdir: bool) -> None:
        super().xDelete(name, syncdir)
        self.disk.sql_deleted(name)

    def __enter__(self):  # returns self (typing.Self needs 3.11 in annotations)
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


@contextlib.contextmanager
def quiet_vfs_errors() -> Iterator[None]:
    """The driver reports VFS exceptions SQLite swallowed through sys.unraisablehook:
    silence them for the block (a fault run raises them by design)."""
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: None
    try:
        yield
    finally:
        sys.unraisablehook = old


def sqlite_view(path: str) -> dict[str, Any] | None:
    """What plain SQLite (WAL recovery included) reads from a copy of the ledger file:
    ``quick_check``, ``application_id``, ``user_version`` and ``schema`` (how many schema
    objects); None when there is no file or SQLite cannot read it."""
    tmp = tempfile.mkdtemp(prefix="view-", dir=os.path.dirname(path))
    try:
        for suffix in ("", "-wal"):
            if os.path.exists(path + suffix):
                shutil.copyfile(path + suffix, os.path.join(tmp, "l.db" + suffix))
        if not os.path.exists(os.path.join(tmp, "l.db")):
            return None
        conn = apsw.Connection(os.path.join(tmp, "l.db"))
        try:
            return {
                "quick_check": conn.execute("PRAGMA quick_check").fetchone()[0],
                "application_id": conn.execute("PRAGMA application_id").fetchone()[0],
                "user_version": conn.execute("PRAGMA user_version").fetchone()[0],
                "schema": conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0],
            }
        finally:
            conn.close()
    except apsw.Error:
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def recover_wal(path: str) -> None:
    """What an operator would do with a file SQLite can read and the ledger refuses: let
    plain SQLite recover it (open it, checkpoint the -wal into the file, truncate it)."""
    conn = apsw.Connection(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


__all__ = ["FaultDisk", "FaultFile", "FaultVFS", "quiet_vfs_errors", "recover_wal",
           "sqlite_view"]

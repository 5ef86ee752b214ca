"""A seal's archive file: one SQLite file holding a sealed run's rows verbatim, the blobs
they name, and a header (docs/design.md "Sealed runs").

Written once, durably (a temporary file beside it, fsynced, renamed, its directory
fsynced), and never changed after; read with SQLite's `immutable` flag after a
plain-I/O check of its header, so a foreign or damaged file is refused (`ArchiveInvalid`)
before SQLite parses more than its first page, and nothing is ever written to it.
This module knows the format only; what the rows must prove is `ledger.seal`'s.
"""

from __future__ import annotations

import contextlib
import os
import struct
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import apsw

from ...errors import ArchiveInvalid, StorageFailure
from .. import ROW_NAMES, EventRow, make_event_row
from .database import resolved
from .schema import events_table

APPLICATION_ID: Final = 0x53544C41  # 'STLA'
FORMAT_VERSION: Final = 1
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
ARCHIVE_FILE_MODE: Final = 0o600
_BATCH: Final = 2_000

SCHEMA: Final = """
CREATE TABLE header(
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) STRICT;

""" + events_table(unique_journal_key=False) + """

CREATE TABLE blobs(
  digest TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  data BLOB NOT NULL
) STRICT;
"""
_COLUMNS: Final = ", ".join(ROW_NAMES)


def _expected_schema() -> frozenset[tuple[str, str]]:
    conn = apsw.Connection(":memory:")
    conn.execute(SCHEMA)
    rows = frozenset(conn.execute("SELECT name, sql FROM sqlite_schema").fetchall())
    conn.close()
    return rows


_EXPECTED: Final = _expected_schema()


def write_archive(path: str, header: dict[str, str], rows: Iterable[EventRow],
                  blobs: Iterable[tuple[str, bytes]],
                  on_op: Callable[[str], None] | None = None) -> None:
    """Write the archive at `path` durably: a temporary file beside it, committed,
    fsynced, renamed over `path`, the directory fsynced. `on_op(name)` is called before
    each of those operations (the crash tests kill the process there)."""
    op = on_op or (lambda _name: None)
    # resolved once: SQLITE_OPEN_NOFOLLOW refuses a symlinked directory anywhere above
    directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        op("archive-create")
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, ARCHIVE_FILE_MODE))
        conn = apsw.Connection(tmp, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW)
        try:
            conn.execute("PRAGMA journal_mode=OFF")
            conn.execute("PRAGMA synchronous=OFF")  # fsynced below, once, whole
            conn.execute("BEGIN")
            conn.execute(SCHEMA)
            conn.executemany("INSERT INTO header(key, value) VALUES (?, ?)",
                             sorted(header.items()))
            conn.executemany(f"INSERT INTO events({_COLUMNS}) VALUES"
                             f" ({', '.join('?' * len(ROW_NAMES))})", rows)
            conn.executemany("INSERT INTO blobs(digest, size, data) VALUES (?, ?, ?)",
                             ((d, len(b), b) for d, b in blobs))
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={FORMAT_VERSION}")
            op("archive-commit")
            conn.execute("COMMIT")
        finally:
            conn.close()
        op("archive-fsync")
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        op("archive-rename")
        os.replace(tmp, path)
        op("archive-dir-fsync")
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except (OSError, apsw.Error) as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageFailure(path, f"writing the archive failed: {exc}") from None


def remove_stray_temporaries(directory: str) -> int:
    """Remove archive temporaries a crashed writer left in `directory` (only files of
    their name shape whose writer process is gone); return how many."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if not (name.startswith(".") and ".tmp-" in name):
            continue
        pid = name.rsplit(".tmp-", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ArchiveFile:
    """An archive opened read-only (immutable: no -wal, no -shm, no write)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._check_header_bytes()
        uri = "file:" + urllib.parse.quote(os.path.abspath(resolved(path))) \
            + "?mode=ro&immutable=1"
        try:
            self.conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY
                                        | apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_NOFOLLOW)
        except apsw.Error as exc:
            raise ArchiveInvalid(path, f"SQLite cannot open it: {exc}") from None
        try:
            self.conn.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
            self.conn.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
            found = frozenset(self.conn.execute("SELECT name, sql FROM sqlite_schema").fetchall())
            if found != _EXPECTED:
                raise ArchiveInvalid(path, "its schema is not a steptrail archive's")
            self.header: dict[str, str] = dict(
                self.conn.execute("SELECT key, value FROM header").fetchall())
        except apsw.Error as exc:
            self.conn.close()
            raise ArchiveInvalid(path, f"it cannot be read: {exc}") from None
        except BaseException:
            self.conn.close()
            raise

    def _check_header_bytes(self) -> None:
        try:
            with open(self.path, "rb") as f:
                head = f.read(100)
        except FileNotFoundError:
            raise ArchiveInvalid(self.path, "there is no such file") from None
        except IsADirectoryError:
            raise ArchiveInvalid(self.path, "it is a directory") from None
        except OSError as exc:
            raise ArchiveInvalid(self.path, f"it cannot be read: {exc.strerror}") from None
        if len(head) < 100 or head[:16] != SQLITE_MAGIC:
            raise ArchiveInvalid(self.path, "it is not a SQLite file")
        user_version, application_id = struct.unpack(">I4xI", head[60:72])
        if application_id != APPLICATION_ID:
            raise ArchiveInvalid(self.path, f"its application_id is {application_id:#x},"
                                 " not a steptrail archive's")
        if user_version != FORMAT_VERSION:
            raise ArchiveInvalid(self.path, f"its format version is {user_version}; this"
                                 f" steptrail reads version {FORMAT_VERSION}")

    def rows(self) -> Iterator[EventRow]:
        """Every archived row, in seq order (paged: the archive is never held in memory)."""
        last = 0
        while True:
            try:
                got = self.conn.execute(f"SELECT {_COLUMNS} FROM events WHERE seq > ?"
                                        " ORDER BY seq LIMIT ?", (last, _BATCH)).fetchall()
            except (apsw.Error, UnicodeDecodeError) as exc:
                raise ArchiveInvalid(self.path, f"its events cannot be read: {exc}") from None
            yield from map(make_event_row, got)
            if len(got) < _BATCH:
                return
            last = got[-1][0]

    def blobs(self) -> Iterator[tuple[Any, Any, Any]]:
        """(digest, size, data) of every archived blob, by digest."""
        try:
            yield from self.conn.execute("SELECT digest, size, data FROM blobs ORDER BY digest")
        except apsw.Error as exc:
            raise ArchiveInvalid(self.path, f"its blobs cannot be read: {exc}") from None

    def blob(self, digest: str) -> bytes | None:
        try:
            row = self.conn.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
        except apsw.Error as exc:
            raise ArchiveInvalid(self.path, f"its blobs cannot be read: {exc}") from None
        return None if row is None else bytes(row[0])

    def integrity_problems(self) -> list[str]:
        try:
            rows = self.conn.execute("PRAGMA quick_check").fetchall()
        except apsw.Error as exc:
            return [str(exc)]
        return [] if rows == [("ok",)] else [str(r[0]) for r in rows[:10]]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ArchiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["APPLICATION_ID", "FORMAT_VERSION", "ArchiveFile", "remove_stray_temporaries",
           "write_archive"]

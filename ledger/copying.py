"""Moving a ledger between stores: `steptrail copy SRC DST` (SQLite -> PostgreSQL and
back), and the PostgreSQL store's `snapshot` (a consistent SQLite copy, for `backup`).

What moves is the ledger itself, unchanged: every event row as stored (seq, time, the
journal key, the payload bytes, both hashes), the projection rows, the meta facts (the
ledger id, so the chain's genesis is the same), GC's condemned rows, the inline blobs,
and every blob outside them (blob files on SQLite, chunk rows on PostgreSQL). Both stores
hold the same tables in the same format (docs/design.md "One format, two stores"), so no
row is re-encoded and no hash recomputed: `verify` on the copy checks the very chain the
source holds, and `head` is the same.

The order keeps the copy's guarantees: the source is read in one snapshot, under its
collector's lock (no blob it names is deleted meanwhile); the copy's tables are written
in one transaction of the destination, and every blob outside them is stored (durable)
before that transaction commits — content before pointer, as every write does. A copy
cut off anywhere leaves the destination empty of events (its tables commit at once or
not at all), and `copy` run again into it starts over.

The destination must be new: a file that does not exist, or a database that holds no
ledger (or an empty one, made by `init` and never written).

A ledger with sealed runs moves with every archive its seals name (docs/design.md
"Sealed runs"): from the source's archive directory (beside a SQLite file, or the one a
database ledger recorded) into the copy's — ``archive/`` beside a file destination; for a
database destination the absolute `archive_dir` given, which the copy records. Each is
copied before the tables commit, hashed on the way and verified against its seal. An
archive the source directory lacks is `ArchiveMissing`, a database destination without
`archive_dir` or the source's own directory `InvalidInput`: refused before the
destination is opened, nothing written.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .workspace import exchange
from .errors import InvalidInput
from .store import ARCHIVE_DIR_META, ReadView, Store, create_store, locate, open_store
from .store.transfer import _wall, copy_tables

#: What a fresh ledger holds before its first write (init's own facts).
_INIT_META: Final = frozenset({"ledger_id", "created_ns", "compensation_window_s"})

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class CopyReport:
    """What `copy_ledger` moved."""

    source: str
    dest: str
    head: str
    events: int
    rows: int
    blobs: int
    blob_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "dest": self.dest, "head": self.head,
                "events": self.events, "rows": self.rows, "blobs": self.blobs,
                "blob_bytes": self.blob_bytes}


def _open_store(location: str, *, create: bool, readonly: bool = False) -> tuple[Store, bool]:
    if create:
        return create_store(location, clock=_wall)
    return open_store(location, clock=_wall, readonly=readonly), False


def _check_empty(dst: Store, location: str) -> None:
    """Refuse a destination that already holds a ledger's rows."""
    with dst.read() as view:
        n = view.count()
        extra = set(view.meta_all()) - _INIT_META
        steps = view.steps()
    if n or extra or steps:
        raise InvalidInput(f"the destination {location} already holds a ledger ({n} events);"
                           " copy into a new file or an empty database")


#: Beside a file destination while it is copied: ``.<name>`` + this.
COPY_TMP_SUFFIX: Final = ".steptrail-copy.tmp"
_SQLITE_SIDE_FILES: Final = ("", "-wal", "-shm", "-journal", "-lockq")


def copy_ledger(source: str, dest: str, *, archive_dir: str | None = None,
                progress: Progress | None = None) -> CopyReport:
    """Copy the ledger at `source` to the new ledger `dest` (a path or a postgresql://
    URL each; see the module docstring). InvalidInput for a destination that is not new.
    `archive_dir` (absolute): where a database destination keeps its archives (needed
    when the source has sealed runs; a file destination keeps them beside it).

    A file destination appears only whole: the copy is made under a temporary name beside
    it (``.NAME.steptrail-copy.tmp``) and renamed to `dest` last (never over a file that
    appeared meanwhile). A copy killed midway leaves that temporary; the next copy to the
    same name removes it and starts over."""
    where = locate(dest)
    if archive_dir is not None:
        if where.archives_beside:
            raise InvalidInput("--archive-dir is for a destination in a database; a file"
                               " destination keeps its archives beside it (archive/)")
        if not os.path.isabs(archive_dir):
            raise InvalidInput(f"archive directory {archive_dir[:200]} is relative; give it as"
                               " /absolute/path (a ledger in a database records it)")
        archive_dir = os.path.normpath(archive_dir)
    if not where.local_file:
        return _copy(source, dest, None, progress, archive_dir)
    if os.path.lexists(dest):
        raise InvalidInput(f"the destination {dest} exists; give a new file (copy never"
                           " writes over a ledger)")
    import fcntl

    where, name = os.path.split(os.path.abspath(dest))
    if not os.path.isdir(where):
        raise InvalidInput(f"the destination's directory {where} does not exist; create it"
                           " first")
    tmp = os.path.join(where, f".{name}{COPY_TMP_SUFFIX}")
    # one copy into a directory at a time: the directory itself is the lock (a lock file
    # beside the copy could be unlinked under a holder, and leave a stray behind)
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidInput(f"another copy into {where} is running; wait for it") from None
        for side in _SQLITE_SIDE_FILES:  # a killed copy's leftovers: started over
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp + side)
        report = _copy(source, tmp, dest, progress, os.path.join(where, "archive"))
        try:
            dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                try:
                    exchange.rename_noreplace(dfd, os.path.basename(tmp), name)
                except exchange.Unsupported:
                    if os.path.lexists(dest):
                        raise FileExistsError(dest) from None
                    os.rename(tmp, dest)
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except FileExistsError:
            raise InvalidInput(f"the destination {dest} appeared while the copy ran; the"
                               f" copy is left at {tmp}") from None
        for side in _SQLITE_SIDE_FILES[1:]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp + side)
        return report
    finally:
        os.close(fd)


def _copy(source: str, dest: str, shown: str | None, progress: Progress | None,
          archive_dir: str | None) -> CopyReport:
    """The copy into `dest` (a new file or a database), reported as `shown`, its
    archives into `archive_dir` (None: a database destination given none)."""
    from .seal import archive_dir_at, carry_archives, seals_in

    recorded_archives = not locate(dest).archives_beside
    src, _ = _open_store(source, create=False, readonly=True)
    try:
        where = src.info.location

        def archives(view: ReadView, *, check_only: bool) -> None:
            seals = seals_in(view)
            source_dir = archive_dir_at(source, view)
            if seals and archive_dir is None:
                raise InvalidInput(f"{where} has sealed runs: a copy into a database needs the"
                                   " absolute directory it will keep their archives in"
                                   " (--archive-dir /absolute/path, copy_ledger(archive_dir=...))"
                                   " (nothing was written)")
            if archive_dir is None:
                return
            if (recorded_archives and source_dir is not None
                    and os.path.realpath(source_dir) == os.path.realpath(archive_dir)):
                raise InvalidInput(f"the copy's archive directory {archive_dir[:200]} is the"
                                   " source's: the two ledgers would write over each other's"
                                   " archives; give the copy a directory of its own (nothing"
                                   " was written)")
            carry_archives(seals, source_dir, archive_dir, shown=where, check_only=check_only)

        with src.read() as view:  # refused before the destination is touched
            archives(view, check_only=True)
        dst, created = _open_store(dest, create=True)
        try:
            if not created:
                _check_empty(dst, dst.info.location)
            moved = {"n": 0, "bytes": 0}

            def copy_blobs(view: ReadView) -> None:
                for digest, (size, _mtime) in sorted(src_files.files().items()):
                    if dst_files.size(digest) == size:
                        continue
                    dst_files.put_stream(src_files.chunks(digest, size=size), digest)
                    moved["n"] += 1
                    moved["bytes"] += size
                    if progress is not None:
                        progress("blobs", moved["n"])
                archives(view, check_only=False)  # the snapshot's seals, before its commit

            src_files, dst_files = src.files, dst.files
            with src.exclusive("gc", wait=True):
                events, rows, head = copy_tables(
                    src, dst, progress=progress, before_commit=copy_blobs,
                    meta={ARCHIVE_DIR_META: archive_dir}
                    if archive_dir is not None and recorded_archives else None)
            report = CopyReport(source=src.info.location,
                                dest=dst.info.location if shown is None else shown,
                                head=str(head), events=events, rows=rows, blobs=moved["n"],
                                blob_bytes=moved["bytes"])
        finally:
            dst.close()
    finally:
        src.close()
    return report


__all__ = ["CopyReport", "copy_ledger"]

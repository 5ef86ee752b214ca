"""What the ledger's collaborators may use of its core, and nothing else: `Core`.

`Ledger` composes the event log, the storage and the read side; the step's lifecycle
(`ledger.step`, through its `Site`), the places and leases and `restore` work on top
of them. They are handed a
`Core` — the log (appends with builders, guards and inline bytes; reads), the storage
(read views, transactions, blob bytes and files), the clock, the options they read, and
three collaborators made below the ledger (the append guard, `ledger.guard`; the
ledger's own files, `OwnFiles`; a step's row, `ledger.projections.StepLookup`) — never
the `Ledger` itself, and nothing defined in `ledger.ledger`: no call of theirs goes
back up into it. No module of `ledger.workspace` or `ledger.step` imports
`ledger.ledger`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from ..errors import StorageFailure
from ..events import check_digest
from ..guard import AppendGuard
from ..log import EventLog
from ..projections import StepLookup
from ..store import Store
from .boundary import Boundary

#: Unix nanoseconds, injected (leaf code never reads the time itself).
Clock = Callable[[], int]


@dataclass(frozen=True, slots=True)
class Options:
    """The ledger's options the protocol reads (fixed when the ledger is opened)."""

    #: Blobs up to this size are written inside the transaction that records them.
    inline_max_bytes: int
    #: Blobs up to this size are re-hashed (not only re-stat'ed) before a publish commits.
    hash_check_max_bytes: int
    #: How long a committed step may still be compensated (a fact of the ledger).
    compensation_window_s: float


class OwnFiles:
    """The ledger's own files, which no workspace may overlap and no walk may touch
    (`boundary()`): its directory (the file, ``-wal``/``-shm``/``-lockq``, the GC lock),
    the blob root, the witness. `witness` is set by the ledger when it has one."""

    __slots__ = ("path", "storage", "witness", "_kept", "_dir", "_place")

    def __init__(self, path: str, storage: Store) -> None:
        self.path, self.storage = path, storage
        #: The witness file's path, if the ledger keeps one.
        self.witness: str | None = None
        self._kept: tuple[object, Boundary] | None = None
        # the ledger's directory as opened (relative to the working directory then)
        self._dir = (None if storage.files.root is None
                     else os.path.dirname(os.path.abspath(path)))
        self._place: tuple[str, int, int] | None = None

    def place(self) -> tuple[str, int, int] | None:
        """Where the ledger lives: its directory's real path, device and inode (None: a
        ledger in a database has no directory). The directory, not a file in it: a copy
        of the project carries the files, never the directory's identity. Kept once
        known (the directory cannot move under an open ledger); StorageFailure when it
        cannot be looked at."""
        if self._dir is None:
            return None
        if self._place is None:
            real = os.path.realpath(self._dir)
            try:
                st = os.stat(real)
            except OSError as exc:
                raise StorageFailure(real, os.strerror(exc.errno or 0)) from None
            self._place = (real, st.st_dev, st.st_ino)
        return self._place

    def boundary(self) -> Boundary:
        """The ledger's own files as a `Boundary`. The ledger's directory and files cannot
        move under an open ledger, so it is kept, and looked up again only when what may
        appear later did (a witness made on first use, the blob root made by the first
        file blob)."""
        witness = [self.witness] if self.witness is not None else []
        root = self.storage.files.root
        key = (tuple(os.path.exists(p) for p in witness), tuple(witness),
               root is not None and os.path.isdir(root))
        if self._kept is not None and self._kept[0] == key:
            return self._kept[1]
        if root is None:  # a ledger in a database: only the witness is local
            found = Boundary.of(None, None, witness)
        else:
            # the ledger file and its side files (a hard link to its WAL in a workspace
            # must not be read as a person's file), the witness
            found = Boundary.of(os.path.dirname(os.path.abspath(self.path)), root,
                                [self.path, *(self.path + s for s in _SIDE_FILES), *witness])
        self._kept = (key, found)
        return found


#: SQLite's files beside the ledger file (write-ahead log, shared memory, the lock queue).
_SIDE_FILES: Final = ("-wal", "-shm", "-lockq")


@dataclass(frozen=True, slots=True)
class Core:
    """The parts of a ledger its collaborators work through (see the module)."""

    #: The event log: the only writer of events (`append`, builders run under the write
    #: lock at the transaction's time), and their reader.
    log: EventLog
    #: The storage: one consistent snapshot (`read()`), write transactions, blob bytes.
    storage: Store
    options: Options
    clock: Clock
    #: Makes a fresh append guard (blobs durable, epochs live; it memoizes per
    #: transaction): `guard()`.
    guard: AppendGuard
    #: The ledger's own files, which no workspace may overlap and no walk may touch.
    own: OwnFiles
    #: A step's current row: `steps.get(id)` (UnknownStep when it has no events).
    steps: StepLookup

    def blob_chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """A blob's bytes in bounded pieces, its size and hash checked by the last."""
        check_digest(digest)
        return self.storage.blobs.chunks(digest, size=size)

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        """(size, inline) of a stored blob, looked up now (one statement); None: it is
        not stored."""
        return self.storage.view.blob_size(digest)  # type: ignore[no-any-return]


__all__ = ["Clock", "Core", "Options", "OwnFiles"]

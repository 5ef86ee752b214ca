"""What the ledger's collaborators may use of its core, and nothing else: `Core`.

`Ledger` composes the event log, the storage and the read side; the workspace protocol
(`fences.Workspaces`) and `restore` work on top of them. They are handed a `Core` —
the log (appends with builders, guards and inline bytes; reads), the storage (read
views, transactions, blob bytes), the clock, the options they read, and a few
callables the ledger answers (the append guard, its boundary, a step's row, the blob
files, the workspace fold) — never the `Ledger` itself. This module imports neither
`ledger.ledger` (nor does any module of `ledger.workspace`): the dependency points one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..blobs import BlobStore
from ..events import check_digest
from ..log import EventLog, Guard
from ..projections.steps import StepRow
from ..projections.workspaces import WorkspacesFold
from ..store import Store
from .directory import Boundary

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
    #: A fresh append guard (blobs durable, epochs live; it memoizes per transaction).
    guard: Callable[[], Guard]
    #: The ledger's own files, which no workspace may overlap and no walk may touch.
    boundary: Callable[[], Boundary]
    #: A step's current row (UnknownStep when it has no events).
    step: Callable[[str], StepRow]
    #: The blob files as they are now (the fault harness swaps them on the ledger).
    files: Callable[[], BlobStore]
    #: Every workspace row and path state as of now (the tables, or a fold of the log).
    workspace_fold: Callable[[], WorkspacesFold]

    def blob_chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """A blob's bytes in bounded pieces, its size and hash checked by the last."""
        check_digest(digest)
        return self.storage.blobs.chunks(digest, size=size)

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        """(size, inline) of a stored blob, looked up now; None: it is not stored."""
        with self.storage.read() as view:
            return view.blob_size(digest)


__all__ = ["Clock", "Core", "Options"]

"""The append guard: the check the event log runs inside every append transaction,
before it inserts an event (`ledger.store.EventCheck`).

It refuses an event that would make the log lie about the world: a writing step's
effect whose epoch is no longer its workspace's live one (I5), a `blob-stored` whose
bytes are not stored as it says, a manifest naming a blob that is not durable (I4). It
reads the transaction's own view — the projector's rows with this transaction's
earlier events folded in, the store's blob index — so nothing can change between the
check and the insert. A blob or an epoch checked once is not checked again in the same
transaction.
"""

from __future__ import annotations

from .errors import BlobCorrupt, BlobNotFound, StaleEpoch
from .events import BlobStored, Event, ManifestPublished, StepEvent
from .store import EventCheck
from .projections import StepsProjector
from .store import BlobIndex, Tx


def check_blob(view: BlobIndex, digest: str, size: int, *, deep: bool,
               hash_check_max_bytes: int) -> None:
    """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes
    (and, when `deep` or no larger than `hash_check_max_bytes`, hashes to its name)."""
    view.check_blob(digest, size, hash_file=deep or size <= hash_check_max_bytes)


class AppendGuard:
    """Makes a fresh guard for each append (calling it): see the module."""

    __slots__ = ("projector", "hash_check_max_bytes")

    def __init__(self, projector: StepsProjector, hash_check_max_bytes: int) -> None:
        self.projector = projector
        self.hash_check_max_bytes = hash_check_max_bytes

    def __call__(self) -> EventCheck:
        seen: set[tuple[object, ...]] = set()
        projector, hash_max = self.projector, self.hash_check_max_bytes

        def guard(tx: Tx, event: Event) -> None:
            if isinstance(event, StepEvent) and event.epoch > 0 and event.workspace:
                # I5: a writing step's every new effect carries its epoch, which must be
                # the workspace's live one at this transaction's time.
                key = ("epoch", event.workspace, event.epoch)
                if key not in seen:
                    # the projector's view: this transaction's earlier events included
                    ws = projector.ws.row(event.workspace)
                    live = None if ws is None else ws.live_epoch(tx.time_ns)
                    if live != event.epoch:
                        raise StaleEpoch(event.workspace, event.epoch, live)
                    seen.add(key)
            if isinstance(event, BlobStored):
                if (event.digest, event.size, event.inline) in seen:
                    return
                found = tx.blob_size(event.digest)
                if found is None:
                    raise BlobNotFound(event.digest, "store the bytes before recording blob-stored")
                if found != (event.size, event.inline):
                    where = "inline" if found[1] else "a file"
                    raise BlobCorrupt(event.digest, f"it is stored as {where} of {found[0]} bytes,"
                                      f" the event says {event.size}")
                seen.add((event.digest, event.size, event.inline))
            elif isinstance(event, ManifestPublished):
                for entry in (*event.writes, *event.artifacts):
                    if (entry.digest, entry.size) not in seen:
                        check_blob(tx, entry.digest, entry.size, deep=False,
                                   hash_check_max_bytes=hash_max)
                        seen.add((entry.digest, entry.size))

        return guard


__all__ = ["AppendGuard", "check_blob"]

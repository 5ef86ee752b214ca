"""Rows moved between stores as they are: `copy_tables` (what `steptrail copy` does
under `ledger.copying`) and `snapshot_to_sqlite` (the PostgreSQL store's `snapshot`).

Every `COPY_TABLES` table is read from one snapshot of the source and written into the
empty destination in one transaction; `before_commit` runs just before that commit, with
the source's snapshot, so a caller stores the blobs and the seals' archives the rows name
first (content before pointer). The meta facts move as they are but for the source's
archive directory (`ARCHIVE_DIR_META`): a location, which the caller gives the copy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import InvalidInput
from . import (ARCHIVE_DIR_META, COPY_TABLES, FOLLOWS, Checkpoint, Head, ProjectionChanges,
               ReadView, Store)
from .view import CHECKPOINT_NAME

#: Rows written per statement batch.
BATCH: Final = 1_000

Progress = Callable[[str, int], None]


def _wall() -> int:
    return time.time_ns()


def copy_tables(src: Store, dst: Store, *, progress: Progress | None = None,
                before_commit: Callable[[ReadView], None] | None = None,
                meta: Mapping[str, str] | None = None) -> tuple[int, int, Head]:
    """Copy every `COPY_TABLES` row of `src` (one snapshot) into the empty `dst` (one
    transaction); `before_commit(view)` runs just before it commits, with the source's
    snapshot (the blob and archive copy). `meta`: facts the copy records beside the
    source's (its archive directory). Returns (events, rows, the source's head)."""
    rows_total = 0
    with src.read() as view:
        head = view.head()
        events = view.count()
        with dst.transaction() as tx:
            for table in COPY_TABLES:
                if table == "meta":
                    _replace_meta(tx, view, meta or {})
                    continue
                if table == "projection_checkpoint":
                    _copy_checkpoint(tx, view, head)
                    continue
                batch: list[tuple[object, ...]] = []
                for row in view.table_rows(table):
                    batch.append(tuple(row))
                    if len(batch) >= BATCH:
                        tx.load_rows(table, batch)
                        rows_total += len(batch)
                        batch = []
                        if progress is not None:
                            progress(table, rows_total)
                if batch:
                    tx.load_rows(table, batch)
                    rows_total += len(batch)
                if progress is not None:
                    progress(table, rows_total)
            if before_commit is not None:
                before_commit(view)
    return events, rows_total, head


def _copy_checkpoint(tx: Any, view: Any, head: Head) -> None:
    """The destination's checkpoint says what the source's does, in today's form: one at
    the source's head (an older format rewrote it each commit) follows the log; a lag
    stays a lag; none at all (nothing folded) is a projection version no code folds,
    so the destination's first read-write open rebuilds its tables."""
    rows = {name: (last, version) for name, last, version in view.checkpoint_rows()}
    if CHECKPOINT_NAME in rows:
        last, version = rows[CHECKPOINT_NAME]
        cp = Checkpoint(FOLLOWS if last == FOLLOWS or last >= head.seq else last, version)
    else:
        cp = Checkpoint(FOLLOWS if head.seq == 0 else 0, 0)
    tx.write_projection(ProjectionChanges(checkpoint=cp))


def _replace_meta(tx: Any, view: Any, extra: Mapping[str, str]) -> None:
    """The destination's meta becomes the source's (its ledger id: the same genesis),
    but for the source's archive directory, and with `extra`."""
    rows = [tuple(r) for r in view.table_rows("meta")]
    for key, value in rows:
        if key != ARCHIVE_DIR_META:
            tx.set_meta(key, value)
    for key, value in extra.items():
        tx.set_meta(key, value)


def snapshot_to_sqlite(src: Store, path: str) -> None:
    """A consistent copy of `src`'s tables (one snapshot) in the new SQLite file `path`,
    durable on return; blob bytes outside the inline rows are not copied (`backup` copies
    them itself)."""
    from .sqlite import SqliteStore

    if os.path.lexists(path):
        raise InvalidInput(f"snapshot target {path} exists; give a new file")
    dst, _ = SqliteStore.create(path, clock=_wall)
    try:
        copy_tables(src, dst)
    finally:
        dst.close()


__all__ = ["BATCH", "copy_tables", "snapshot_to_sqlite"]

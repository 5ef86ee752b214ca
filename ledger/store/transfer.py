"""Rows moved between stores as they are: `copy_tables` (what `steptrail copy` does
under `ledger.copying`) and `snapshot_to_sqlite` (the PostgreSQL store's `snapshot`).

Every `COPY_TABLES` table is read from one snapshot of the source and written into the
empty destination in one transaction; `before_commit` runs just before that commit, so
a caller stores the blobs the rows name first (content before pointer).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final

from ..errors import InvalidInput
from . import COPY_TABLES, Head, Store

#: Rows written per statement batch.
BATCH: Final = 1_000

Progress = Callable[[str, int], None]


def _wall() -> int:
    return time.time_ns()


def copy_tables(src: Store, dst: Store, *, progress: Progress | None = None,
                before_commit: Callable[[], None] | None = None) -> tuple[int, int, Head]:
    """Copy every `COPY_TABLES` row of `src` (one snapshot) into the empty `dst` (one
    transaction); `before_commit` runs just before it commits (the blob copy). Returns
    (events, rows, the source's head)."""
    rows_total = 0
    with src.read() as view:
        head = view.head()
        if any(True for _ in view.table_rows("sealed_ranges")):
            raise InvalidInput(f"{src.info.location} has sealed runs, whose archives are"
                               " files beside it; copy a ledger without sealed runs, or keep"
                               " it with 'steptrail backup'")
        events = view.count()
        with dst.transaction() as tx:
            for table in COPY_TABLES:
                if table == "meta":
                    _replace_meta(tx, view)
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
                before_commit()
    return events, rows_total, head


def _replace_meta(tx: Any, view: Any) -> None:
    """The destination's meta becomes the source's (its ledger id: the same genesis)."""
    rows = [tuple(r) for r in view.table_rows("meta")]
    for key, value in rows:
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

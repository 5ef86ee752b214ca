"""The projection tables' SQL on SQLite: steps, workspaces and paths, pins, manifests,
the checkpoint, the condemned rows (the shared statements, `ledger.store.sql`, rendered
for SQLite) — and `write_projection`, one append's inline changes written in a fixed
order (one multi-row statement per table)."""

from __future__ import annotations

from typing import Final

import apsw

from ..rows import PathState, StepRow, WsRow
from .. import ProjectionChanges
from ..sql import SQLITE, STEP_COLUMNS, WS_COLUMNS, Statements

_S: Final = Statements(SQLITE)
SELECT_STEP: Final = _S.SELECT_STEP
UPSERT_STEP: Final = _S.UPSERT_STEP
SELECT_WS: Final = _S.SELECT_WS
SELECT_ONE_WS: Final = _S.SELECT_ONE_WS
UPSERT_WS: Final = _S.UPSERT_WS
SELECT_PATH: Final = _S.SELECT_PATH
SELECT_PATHS: Final = _S.SELECT_PATHS
UPSERT_PATH: Final = _S.UPSERT_PATH
DROP_ENTRIES: Final = _S.DROP_ENTRIES
DROP_MANIFESTS: Final = _S.DROP_MANIFESTS
DROP_PINS: Final = _S.DROP_PINS
RELEASE_ACKED: Final = _S.RELEASE_ACKED
RELEASE_ENDED: Final = _S.RELEASE_ENDED
ADD_PINS: Final = _S.ADD_PINS
ADD_MANIFESTS: Final = _S.ADD_MANIFESTS
ADD_ENTRIES: Final = _S.ADD_ENTRIES
UNCONDEMN: Final = _S.UNCONDEMN
CONDEMN: Final = _S.CONDEMN
SELECT_CONDEMNED: Final = _S.SELECT_CONDEMNED
SELECT_ONE_CONDEMNED: Final = _S.SELECT_ONE_CONDEMNED
COUNT_CONDEMNED: Final = _S.COUNT_CONDEMNED
PIN_HOLDS: Final = _S.PIN_HOLDS
PIN_HOLDS_OF: Final = _S.PIN_HOLDS_OF
MANIFEST_DIGESTS: Final = _S.MANIFEST_DIGESTS
NAMES_DIGEST: Final = _S.NAMES_DIGEST
ENTRIES_NAMING: Final = _S.ENTRIES_NAMING
LIVE_ENTRIES: Final = _S.LIVE_ENTRIES
LIVE_STEPS: Final = _S.LIVE_STEPS
#: a template: one ``?`` per state
STEP_TOTALS: Final = _S.STEP_TOTALS
CHECKPOINT_ROWS: Final = _S.CHECKPOINT_ROWS
INLINE_ROW_PROBLEMS: Final = _S.INLINE_ROW_PROBLEMS
SELECT_CHECKPOINT: Final = _S.SELECT_CHECKPOINT
SET_CHECKPOINT: Final = _S.SET_CHECKPOINT
SELECT_PINS: Final = _S.SELECT_PINS
SELECT_MANIFESTS: Final = _S.SELECT_MANIFESTS
SELECT_ENTRIES: Final = _S.SELECT_ENTRIES
ADD_SEALED_RANGE: Final = _S.ADD_SEALED_RANGE
DELETE_SEALED: Final = _S.DELETE_SEALED
in_flight_sql = _S.in_flight
select_steps = _S.select_steps


def load_step(conn: apsw.Connection, step_id: str) -> StepRow | None:
    row = conn.execute(SELECT_STEP, (step_id,)).fetchone()
    return None if row is None else StepRow.from_tuple(row)


def load_workspace(conn: apsw.Connection, name: str) -> WsRow | None:
    row = conn.execute(SELECT_ONE_WS, (name,)).fetchone()
    return None if row is None else WsRow.from_tuple(row)


def load_path(conn: apsw.Connection, workspace: str, path: str) -> PathState | None:
    row = conn.execute(SELECT_PATH, (workspace, path)).fetchone()
    return None if row is None else (int(row[0]), row[1], int(row[2]))


def write_projection(conn: apsw.Connection, changes: ProjectionChanges, checkpoint_name: str
                     ) -> None:
    """One transaction's inline projection changes, in this order: step rows; pins
    released (an ack: its artifact and post-image pins; an end: all), pins taken (deletes
    first: every pin still pending was taken after the last release of its attempt);
    manifests and their entries; the manifests, entries and pins of steps a seal
    archived; workspace rows and paths; blobs un-condemned (a pin or a
    manifest named them); the checkpoint."""
    if changes.steps:
        conn.executemany(UPSERT_STEP, changes.steps)
    if changes.releases:
        acked = [(s, a, *changes.released_on_ack) for s, a, ack in changes.releases if ack]
        ended = [(s, a) for s, a, ack in changes.releases if not ack]
        if acked:
            conn.executemany(RELEASE_ACKED, acked)
        if ended:
            conn.executemany(RELEASE_ENDED, ended)
    if changes.pins:
        conn.executemany(ADD_PINS, changes.pins)
    if changes.manifests:
        conn.executemany(ADD_MANIFESTS.format("manifests"), changes.manifests)
        conn.executemany(ADD_ENTRIES.format("manifest_entries"), changes.entries)
    if changes.dropped_steps:
        dropped = [(s,) for s in changes.dropped_steps]
        conn.executemany(DROP_ENTRIES, dropped)
        conn.executemany(DROP_MANIFESTS, dropped)
        conn.executemany(DROP_PINS, dropped)
    if changes.workspaces:
        conn.executemany(UPSERT_WS, changes.workspaces)
    if changes.paths:
        conn.executemany(UPSERT_PATH, changes.paths)
    if changes.uncondemn:
        conn.executemany(UNCONDEMN, [(d,) for d in changes.uncondemn])
    if changes.checkpoint is not None:
        conn.execute(SET_CHECKPOINT, (checkpoint_name, changes.checkpoint.last_seq,
                                      changes.checkpoint.version))


_TYPES: Final = {
    "ws_paths": (str, str, int, (str, None), int),
    "pins": (str, int, str, str, int),
    "manifests": (str, int, int, str, (str, None), int),
    "manifest_entries": (str, int, str, str, str, int),
}


def check_types(table: str, row: tuple[object, ...]) -> tuple[object, ...]:
    """`row` if its cells hold their declared storage class (a damaged record can yield
    NULL or another class), else TypeError — which a read reports as CorruptLedger."""
    for value, want in zip(row, _TYPES[table], strict=True):
        if isinstance(want, tuple):
            if value is None and None in want:
                continue
            want = want[0]
        if type(value) is not want:
            raise TypeError(f"a {table} row holds a {type(value).__name__} where a"
                            f" {want.__name__} belongs")  # type: ignore[union-attr]
    return row


__all__ = ["STEP_COLUMNS", "WS_COLUMNS", "check_types", "in_flight_sql", "load_path", "load_step",
           "load_workspace", "select_steps", "write_projection"]

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

S: Final = Statements(SQLITE)
in_flight_sql = S.in_flight
select_steps = S.select_steps


def load_step(conn: apsw.Connection, step_id: str) -> StepRow | None:
    row = conn.execute(S.SELECT_STEP, (step_id,)).fetchone()
    return None if row is None else StepRow.from_tuple(row)


def load_workspace(conn: apsw.Connection, name: str) -> WsRow | None:
    row = conn.execute(S.SELECT_ONE_WS, (name,)).fetchone()
    return None if row is None else WsRow.from_tuple(row)


def load_path(conn: apsw.Connection, workspace: str, path: str) -> PathState | None:
    row = conn.execute(S.SELECT_PATH, (workspace, path)).fetchone()
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
        conn.executemany(S.UPSERT_STEP, changes.steps)
    if changes.releases:
        acked = [(s, a, *changes.released_on_ack) for s, a, ack in changes.releases if ack]
        ended = [(s, a) for s, a, ack in changes.releases if not ack]
        if acked:
            conn.executemany(S.RELEASE_ACKED, acked)
        if ended:
            conn.executemany(S.RELEASE_ENDED, ended)
    if changes.pins:
        conn.executemany(S.ADD_PINS, changes.pins)
    if changes.manifests:
        conn.executemany(S.ADD_MANIFESTS.format("manifests"), changes.manifests)
        conn.executemany(S.ADD_ENTRIES.format("manifest_entries"), changes.entries)
    if changes.dropped_steps:
        dropped = [(s,) for s in changes.dropped_steps]
        conn.executemany(S.DROP_ENTRIES, dropped)
        conn.executemany(S.DROP_MANIFESTS, dropped)
        conn.executemany(S.DROP_PINS, dropped)
    if changes.workspaces:
        conn.executemany(S.UPSERT_WS, changes.workspaces)
    if changes.paths:
        conn.executemany(S.UPSERT_PATH, changes.paths)
    if changes.uncondemn:
        conn.executemany(S.UNCONDEMN, [(d,) for d in changes.uncondemn])
    if changes.checkpoint is not None:
        conn.execute(S.SET_CHECKPOINT, (checkpoint_name, changes.checkpoint.last_seq,
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

"""The projection tables' SQL: steps, workspaces and paths, pins, manifests, the
checkpoint, the condemned rows — and `write_projection`, one append's inline changes
written in a fixed order (one multi-row statement per table)."""

from __future__ import annotations

from typing import Final

import apsw

from ...projections.steps import IN_FLIGHT, StepRow
from ...projections.workspaces import PathState, WsRow
from .. import ProjectionChanges

STEP_COLUMNS: Final = ", ".join(StepRow.COLUMNS)
SELECT_STEP: Final = f"SELECT {STEP_COLUMNS} FROM steps WHERE step_id = ?"
# Updated in place (not REPLACE, which deletes and reinserts the row).
UPSERT_STEP: Final = (
    f"INSERT INTO steps({STEP_COLUMNS}) VALUES ({', '.join('?' * len(StepRow.COLUMNS))})"
    " ON CONFLICT(step_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in StepRow.COLUMNS[1:])
)
#: The latest attempts of a workspace's steps still in flight under an epoch (> 0), of
#: epochs before `?` when given.
_IN_FLIGHT: Final = ("SELECT step_id, attempt FROM steps WHERE workspace = ? AND epoch > 0{}"
                     " AND state IN ({}) ORDER BY {}{}")

WS_COLUMNS: Final = ", ".join(WsRow.COLUMNS)
SELECT_WS: Final = f"SELECT {WS_COLUMNS} FROM workspaces"
SELECT_ONE_WS: Final = f"SELECT {WS_COLUMNS} FROM workspaces WHERE name = ?"
UPSERT_WS: Final = (
    f"INSERT INTO workspaces({WS_COLUMNS}) VALUES ({', '.join('?' * len(WsRow.COLUMNS))})"
    " ON CONFLICT(name) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in WsRow.COLUMNS[1:])
)
SELECT_PATH: Final = "SELECT rev, hash, seq FROM ws_paths WHERE workspace = ? AND path = ?"
SELECT_PATHS: Final = "SELECT workspace, path, rev, hash, seq FROM ws_paths"
UPSERT_PATH: Final = (
    "INSERT INTO ws_paths(workspace, path, rev, hash, seq) VALUES (?,?,?,?,?)"
    " ON CONFLICT(workspace, path) DO UPDATE SET rev = excluded.rev, hash = excluded.hash,"
    " seq = excluded.seq"
)

_DROP_ENTRIES: Final = "DELETE FROM manifest_entries WHERE step = ?"
_DROP_MANIFESTS: Final = "DELETE FROM manifests WHERE step = ?"
_DROP_PINS: Final = "DELETE FROM pins WHERE step = ?"
_RELEASE_ACKED: Final = "DELETE FROM pins WHERE step = ? AND attempt = ? AND role IN (?, ?)"
_RELEASE_ENDED: Final = "DELETE FROM pins WHERE step = ? AND attempt = ?"
ADD_PINS: Final = ("INSERT OR IGNORE INTO pins(step, attempt, digest, role, seq)"
                    " VALUES (?,?,?,?,?)")
# OR REPLACE: a catch-up may fold again a manifest whose rows are already there
ADD_MANIFESTS: Final = ("INSERT OR REPLACE INTO {}(step, manifest_rev, attempt, digest,"
                        " supersedes, seq) VALUES (?,?,?,?,?,?)")
ADD_ENTRIES: Final = ("INSERT OR REPLACE INTO {}(step, manifest_rev, role, path, digest, size)"
                      " VALUES (?,?,?,?,?,?)")
UNCONDEMN: Final = "DELETE FROM condemned WHERE digest = ?"
CONDEMN: Final = ("INSERT OR IGNORE INTO condemned(digest, size, inline, condemned_ns, collection)"
                  " VALUES (?, ?, ?, ?, ?)")
SELECT_CONDEMNED: Final = "SELECT digest, size, inline FROM condemned"
SELECT_ONE_CONDEMNED: Final = "SELECT size, inline FROM condemned WHERE digest = ?"
COUNT_CONDEMNED: Final = "SELECT count(*) FROM condemned"
#: Pins with what decides whether they hold (`ledger.store.PinHold`).
PIN_HOLDS: Final = ("SELECT p.digest, p.role, s.state, p.attempt, s.attempt, s.updated_ns"
                    " FROM pins p LEFT JOIN steps s ON s.step_id = p.step")
MANIFEST_DIGESTS: Final = "SELECT DISTINCT digest FROM manifest_entries"
NAMES_DIGEST: Final = "SELECT 1 FROM manifest_entries WHERE digest = ? LIMIT 1"
ENTRIES_NAMING: Final = ("SELECT step, manifest_rev, path FROM manifest_entries WHERE digest = ?"
                         " LIMIT ?")
# from the live steps outward (CROSS JOIN keeps SQLite from starting at the entries'
# digest index and probing a step for each of them)
LIVE_ENTRIES: Final = ("SELECT e.digest, e.size FROM steps s CROSS JOIN manifest_entries e"
                       " ON e.step = s.step_id AND e.manifest_rev = s.manifest_rev"
                       " WHERE s.live = 1")
LIVE_STEPS: Final = "SELECT count(*) FROM steps WHERE live = 1"
STEP_TOTALS: Final = ("SELECT count(*), coalesce(sum(stored_bytes), 0) FROM steps"
                      " WHERE state IN ({})")
CHECKPOINT_ROWS: Final = "SELECT name, last_seq, version FROM projection_checkpoint"
INLINE_ROW_PROBLEMS: Final = ("SELECT digest, size, length(data) FROM blob_data"
                              " WHERE size != length(data) OR length(digest) != 64"
                              " OR digest GLOB '*[^0-9a-f]*' LIMIT ?")

SELECT_CHECKPOINT: Final = "SELECT last_seq, version FROM projection_checkpoint WHERE name = ?"
SET_CHECKPOINT: Final = (
    "INSERT INTO projection_checkpoint(name, last_seq, version) VALUES (?, ?, ?)"
    " ON CONFLICT(name) DO UPDATE SET last_seq = excluded.last_seq, version = excluded.version"
)


def in_flight_sql(before: bool, oldest_first: bool, limit: bool) -> str:
    return _IN_FLIGHT.format(" AND epoch < ?" if before else "",
                             ", ".join("?" * len(IN_FLIGHT)),
                             "first_seq" if oldest_first else "step_id",
                             " LIMIT ?" if limit else "")


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
            conn.executemany(_RELEASE_ACKED, acked)
        if ended:
            conn.executemany(_RELEASE_ENDED, ended)
    if changes.pins:
        conn.executemany(ADD_PINS, changes.pins)
    if changes.manifests:
        conn.executemany(ADD_MANIFESTS.format("manifests"), changes.manifests)
        conn.executemany(ADD_ENTRIES.format("manifest_entries"), changes.entries)
    if changes.dropped_steps:
        dropped = [(s,) for s in changes.dropped_steps]
        conn.executemany(_DROP_ENTRIES, dropped)
        conn.executemany(_DROP_MANIFESTS, dropped)
        conn.executemany(_DROP_PINS, dropped)
    if changes.workspaces:
        conn.executemany(UPSERT_WS, changes.workspaces)
    if changes.paths:
        conn.executemany(UPSERT_PATH, changes.paths)
    if changes.uncondemn:
        conn.executemany(UNCONDEMN, [(d,) for d in changes.uncondemn])
    if changes.checkpoint is not None:
        conn.execute(SET_CHECKPOINT, (checkpoint_name, changes.checkpoint.last_seq,
                                      changes.checkpoint.version))



SELECT_PINS: Final = "SELECT step, attempt, digest, role, seq FROM pins"
SELECT_MANIFESTS: Final = "SELECT step, manifest_rev, attempt, digest, supersedes, seq FROM manifests"
SELECT_ENTRIES: Final = ("SELECT step, manifest_rev, role, path, digest, size FROM"
                         " manifest_entries")
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


def select_steps(state: str | None, step_id: str | None) -> tuple[str, list[object]]:
    where, params = [], []
    if state is not None:
        where.append("state = ?")
        params.append(state)
    if step_id is not None:
        where.append("step_id = ?")
        params.append(step_id)
    sql = f"SELECT {STEP_COLUMNS} FROM steps"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + " ORDER BY first_seq", params

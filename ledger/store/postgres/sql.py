"""The PostgreSQL store's statements: the SQLite store's, in PostgreSQL's dialect.

Most statements are the SQLite store's own text with ``%s`` placeholders (`pg`): the
tables, columns and queries are the same on both stores, so they are written once. The
few that differ are here: SQLite's ``INSERT OR IGNORE`` / ``OR REPLACE`` become
``ON CONFLICT``, ``GLOB`` a regular expression, ``length(CAST(x AS BLOB))``
``octet_length``.
"""

from __future__ import annotations

from typing import Final

from ...projections.steps import StepRow
from ...projections.workspaces import WsRow
from ..sqlite import blobs as sqlite_blobs
from ..sqlite import events as sqlite_events
from ..sqlite import tables as sqlite_tables


def pg(sql: str) -> str:
    """A SQLite statement with ``?`` placeholders as a psycopg one (``%s``)."""
    if "%" in sql:
        raise ValueError(f"a literal % in {sql!r}")
    return sql.replace("?", "%s")


T = sqlite_tables
E = sqlite_events
B = sqlite_blobs

ROW_COLUMNS: Final = E.ROW_COLUMNS
FOLD_COLUMNS: Final = E.FOLD_COLUMNS
INSERT_EVENT: Final = pg(E.INSERT_SQL)
#: a single insert that says "already there" by inserting nothing (the transaction goes on)
INSERT_EVENT_OR_NOTHING: Final = INSERT_EVENT + " ON CONFLICT DO NOTHING"
HEAD: Final = E.HEAD_SQL
COUNT: Final = E.COUNT_SQL
JOURNAL: Final = pg(E.JOURNAL_SQL)
#: The newest event whose journal key lies in [low, high) (a prefix: the newest
#: registration of a workspace, say). Not SQLite's statement: given `ORDER BY seq DESC
#: LIMIT 1`, PostgreSQL's planner may walk the whole events table backwards by seq,
#: testing each key — every call O(events) when nothing matches (no workspace was ever
#: restored), which made every step slower as the ledger grew (measured: 85 -> 47 -> 32
#: steps/s over three epochs of 600 steps). The materialized range is the key index's
#: few rows, whatever the statistics say.
JOURNAL_RANGE: Final = (
    "WITH r AS MATERIALIZED (SELECT seq FROM events WHERE journal_key >= %s"
    " AND journal_key < %s{}) SELECT " + E.ROW_COLUMNS + " FROM events"
    " WHERE seq = (SELECT max(seq) FROM r)")
_EVENT_BYTES: Final = "octet_length(payload) + octet_length(journal_key) + 64"
TOTALS_BY_RUN: Final = (f"SELECT run, kind, count(*), sum({_EVENT_BYTES}), min(time_ns),"
                        " max(time_ns) FROM events GROUP BY run, kind ORDER BY run, kind")
TOTALS_BY_TIME: Final = (f"SELECT t.b * %s, count(*), sum(t.n) FROM (SELECT time_ns / %s AS b,"
                         f" {_EVENT_BYTES} AS n FROM events) t GROUP BY t.b ORDER BY 1")
CHECKED: Final = (f"SELECT {ROW_COLUMNS} FROM events WHERE seq > %s ORDER BY seq LIMIT %s")

STEP_COLUMNS: Final = T.STEP_COLUMNS
SELECT_STEP: Final = pg(T.SELECT_STEP)
UPSERT_STEP: Final = pg(T.UPSERT_STEP)
SELECT_WS: Final = T.SELECT_WS
SELECT_ONE_WS: Final = pg(T.SELECT_ONE_WS)
UPSERT_WS: Final = pg(T.UPSERT_WS)
SELECT_PATH: Final = pg(T.SELECT_PATH)
SELECT_PATHS: Final = T.SELECT_PATHS
UPSERT_PATH: Final = pg(T.UPSERT_PATH)
SELECT_PINS: Final = T.SELECT_PINS
SELECT_MANIFESTS: Final = T.SELECT_MANIFESTS
SELECT_ENTRIES: Final = T.SELECT_ENTRIES
DROP_ENTRIES: Final = pg(T._DROP_ENTRIES)
DROP_MANIFESTS: Final = pg(T._DROP_MANIFESTS)
DROP_PINS: Final = pg(T._DROP_PINS)
RELEASE_ACKED: Final = pg(T._RELEASE_ACKED)
RELEASE_ENDED: Final = pg(T._RELEASE_ENDED)
ADD_PINS: Final = ("INSERT INTO pins(step, attempt, digest, role, seq) VALUES (%s,%s,%s,%s,%s)"
                   " ON CONFLICT DO NOTHING")
ADD_MANIFESTS: Final = ("INSERT INTO {}(step, manifest_rev, attempt, digest, supersedes, seq)"
                        " VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT(step, manifest_rev) DO UPDATE"
                        " SET attempt = excluded.attempt, digest = excluded.digest,"
                        " supersedes = excluded.supersedes, seq = excluded.seq")
ADD_ENTRIES: Final = ("INSERT INTO {}(step, manifest_rev, role, path, digest, size)"
                      " VALUES (%s,%s,%s,%s,%s,%s) ON CONFLICT(step, manifest_rev, role, path)"
                      " DO UPDATE SET digest = excluded.digest, size = excluded.size")
UNCONDEMN: Final = pg(T.UNCONDEMN)
CONDEMN: Final = ("INSERT INTO condemned(digest, size, inline, condemned_ns, collection)"
                  " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING")
SELECT_CONDEMNED: Final = T.SELECT_CONDEMNED
SELECT_ONE_CONDEMNED: Final = pg(T.SELECT_ONE_CONDEMNED)
COUNT_CONDEMNED: Final = T.COUNT_CONDEMNED
PIN_HOLDS: Final = T.PIN_HOLDS
MANIFEST_DIGESTS: Final = T.MANIFEST_DIGESTS
NAMES_DIGEST: Final = pg(T.NAMES_DIGEST)
ENTRIES_NAMING: Final = pg(T.ENTRIES_NAMING)
LIVE_ENTRIES: Final = ("SELECT e.digest, e.size FROM steps s JOIN manifest_entries e"
                       " ON e.step = s.step_id AND e.manifest_rev = s.manifest_rev"
                       " WHERE s.live = 1")
LIVE_STEPS: Final = T.LIVE_STEPS
STEP_TOTALS: Final = ("SELECT count(*), coalesce(sum(stored_bytes), 0) FROM steps"
                      " WHERE state = ANY(%s)")
CHECKPOINT_ROWS: Final = T.CHECKPOINT_ROWS
INLINE_ROW_PROBLEMS: Final = ("SELECT digest, size, octet_length(data) FROM blob_data"
                              " WHERE size <> octet_length(data) OR length(digest) <> 64"
                              " OR digest ~ '[^0-9a-f]' LIMIT %s")
SELECT_CHECKPOINT: Final = pg(T.SELECT_CHECKPOINT)
SET_CHECKPOINT: Final = pg(T.SET_CHECKPOINT)

INLINE_SIZE: Final = pg(B.INLINE_SIZE)
INLINE_BLOB: Final = pg(B.INLINE_BLOB)
INLINE_STAT: Final = pg(B.INLINE_STAT)
INLINE_DATA: Final = pg(B.INLINE_DATA)
INLINE_FRESHEN: Final = pg(B.INLINE_FRESHEN)
INLINE_PUT: Final = ("INSERT INTO blob_data(digest, size, data, stored_ns) VALUES (%s,%s,%s,%s)"
                     " ON CONFLICT(digest) DO UPDATE SET size = excluded.size,"
                     " data = excluded.data, stored_ns = excluded.stored_ns")
INLINE_DELETE: Final = pg(B.INLINE_DELETE)
INLINE_ALL: Final = B.INLINE_ALL

ADD_SEALED_RANGE: Final = ("INSERT INTO sealed_ranges(first_seq, last_seq, run, seal_seq)"
                           " VALUES (%s, %s, %s, %s)")
DELETE_SEALED: Final = "DELETE FROM events WHERE seq BETWEEN %s AND %s AND run = %s"

STEP_COLUMN_NAMES: Final = StepRow.COLUMNS
WS_COLUMN_NAMES: Final = WsRow.COLUMNS
MANIFEST_COLUMNS: Final = "step, manifest_rev, attempt, digest, supersedes, seq"
ENTRY_COLUMNS: Final = "step, manifest_rev, role, path, digest, size"


def in_flight(before: bool, oldest_first: bool, limit: bool) -> str:
    return pg(T.in_flight_sql(before, oldest_first, limit))


def select_steps(state: str | None, step_id: str | None) -> tuple[str, list[object]]:
    sql, params = T.select_steps(state, step_id)
    return pg(sql), params


def query(q: object, columns: str = ROW_COLUMNS) -> tuple[str, list[object]]:
    sql, params = E.query_sql(q, columns)  # type: ignore[arg-type]
    return pg(sql), params

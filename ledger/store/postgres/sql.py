"""The PostgreSQL store's statements: the shared ones (`ledger.store.sql`) rendered for
PostgreSQL (`POSTGRES`: ``%s`` placeholders, ON CONFLICT for SQLite's INSERT OR IGNORE /
OR REPLACE, a regular expression for GLOB, ``octet_length``), and the few that differ
in more than form.
"""

from __future__ import annotations

from typing import Final

from .. import ROW_NAMES
from ..sql import FOLD_COLUMNS, POSTGRES, ROW_COLUMNS, STEP_COLUMNS, Statements

_S: Final = Statements(POSTGRES)

INSERT_EVENT: Final = _S.INSERT_EVENT
#: a single insert that says "already there" by inserting nothing (the transaction goes on)
INSERT_EVENT_OR_NOTHING: Final = POSTGRES.render(POSTGRES.insert_or_ignore("events", ROW_NAMES))
HEAD: Final = _S.HEAD
COUNT: Final = _S.COUNT
JOURNAL: Final = _S.JOURNAL
#: The newest event whose journal key lies in [low, high) (a prefix: the newest
#: registration of a workspace, say). Not SQLite's statement: given `ORDER BY seq DESC
#: LIMIT 1`, PostgreSQL's planner may walk the whole events table backwards by seq,
#: testing each key — every call O(events) when nothing matches (no workspace was ever
#: restored), which made every step slower as the ledger grew (measured: 85 -> 47 -> 32
#: steps/s over three epochs of 600 steps). The materialized range is the key index's
#: few rows, whatever the statistics say.
JOURNAL_RANGE: Final = (
    "WITH r AS MATERIALIZED (SELECT seq FROM events WHERE journal_key >= %s"
    " AND journal_key < %s{}) SELECT " + ROW_COLUMNS + " FROM events"
    " WHERE seq = (SELECT max(seq) FROM r)")
TOTALS_BY_RUN: Final = _S.TOTALS_BY_RUN
#: (a subquery, not SQLite's GROUP BY of the expression: PostgreSQL cannot tell that
#: the select list's expression of one parameter is the GROUP BY's of another)
TOTALS_BY_TIME: Final = (f"SELECT t.b * %s, count(*), sum(t.n) FROM (SELECT time_ns / %s AS b,"
                         f" {_S.EVENT_BYTES} AS n FROM events) t GROUP BY t.b ORDER BY 1")
CHECKED: Final = _S.CHECKED

SELECT_STEP: Final = _S.SELECT_STEP
UPSERT_STEP: Final = _S.UPSERT_STEP
SELECT_WS: Final = _S.SELECT_WS
SELECT_ONE_WS: Final = _S.SELECT_ONE_WS
UPSERT_WS: Final = _S.UPSERT_WS
SELECT_PATH: Final = _S.SELECT_PATH
SELECT_PATHS: Final = _S.SELECT_PATHS
UPSERT_PATH: Final = _S.UPSERT_PATH
SELECT_PINS: Final = _S.SELECT_PINS
SELECT_MANIFESTS: Final = _S.SELECT_MANIFESTS
SELECT_ENTRIES: Final = _S.SELECT_ENTRIES
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
#: one parameter: the states as an array
STEP_TOTALS: Final = _S.STEP_TOTALS
CHECKPOINT_ROWS: Final = _S.CHECKPOINT_ROWS
INLINE_ROW_PROBLEMS: Final = _S.INLINE_ROW_PROBLEMS
SELECT_CHECKPOINT: Final = _S.SELECT_CHECKPOINT
SET_CHECKPOINT: Final = _S.SET_CHECKPOINT

INLINE_SIZE: Final = _S.INLINE_SIZE
INLINE_BLOB: Final = _S.INLINE_BLOB
INLINE_STAT: Final = _S.INLINE_STAT
INLINE_DATA: Final = _S.INLINE_DATA
INLINE_FRESHEN: Final = _S.INLINE_FRESHEN
INLINE_PUT: Final = _S.INLINE_PUT
INLINE_DELETE: Final = _S.INLINE_DELETE
INLINE_ALL: Final = _S.INLINE_ALL

ADD_SEALED_RANGE: Final = _S.ADD_SEALED_RANGE
DELETE_SEALED: Final = _S.DELETE_SEALED

in_flight = _S.in_flight
select_steps = _S.select_steps
query = _S.query

__all__ = ["FOLD_COLUMNS", "ROW_COLUMNS", "STEP_COLUMNS", "in_flight", "query", "select_steps"]

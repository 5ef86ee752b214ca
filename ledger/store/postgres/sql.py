"""The PostgreSQL store's statements: the shared ones (`ledger.store.sql`) rendered for
PostgreSQL (`POSTGRES`: ``%s`` placeholders, ON CONFLICT for SQLite's INSERT OR IGNORE /
OR REPLACE, a regular expression for GLOB, ``octet_length``), and the few that differ
in more than form.
"""

from __future__ import annotations

from typing import Final

from .. import ROW_NAMES
from ..sql import FOLD_COLUMNS, POSTGRES, ROW_COLUMNS, STEP_COLUMNS, Statements

S: Final = Statements(POSTGRES)

#: a single insert that says "already there" by inserting nothing (the transaction goes on)
INSERT_EVENT_OR_NOTHING: Final = POSTGRES.render(POSTGRES.insert_or_ignore("events", ROW_NAMES))
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
#: (a subquery, not SQLite's GROUP BY of the expression: PostgreSQL cannot tell that
#: the select list's expression of one parameter is the GROUP BY's of another)
TOTALS_BY_TIME: Final = (f"SELECT t.b * %s, count(*), sum(t.n) FROM (SELECT time_ns / %s AS b,"
                         f" {S.EVENT_BYTES} AS n FROM events) t GROUP BY t.b ORDER BY 1")




#: Insert an inline blob, or make the row of its digest these bytes at this time: the
#: data column rewritten only when it differs (an update of an equal value would still
#: write a new copy of it).
INLINE_UPSERT: Final = (
    "INSERT INTO blob_data(digest, size, data, stored_ns) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT(digest) DO UPDATE SET size = excluded.size, stored_ns = excluded.stored_ns,"
    " data = CASE WHEN blob_data.data = excluded.data THEN blob_data.data"
    " ELSE excluded.data END")

in_flight = S.in_flight
select_steps = S.select_steps
query = S.query

__all__ = ["FOLD_COLUMNS", "ROW_COLUMNS", "STEP_COLUMNS", "in_flight", "query", "select_steps"]

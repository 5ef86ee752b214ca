"""The ledger's schema: its migrations, the allow-list they imply, and the check of a file
against it (application id, version, every schema object).

The allow-list of a version is whatever its migrations produce in an empty database, so
the two cannot drift.
"""

from __future__ import annotations

from functools import cache
from typing import Final

import apsw

from ...errors import LedgerTooNew, NotALedger
from ..sql import SQLITE

APPLICATION_ID: Final = 0x53544C47  # 'STLG'
SCHEMA_VERSION: Final = 6


def events_table(*, unique_journal_key: bool = True) -> str:
    """The events table's CREATE TABLE (its columns: `ledger.store.sql.EVENT_COLUMNS`),
    as version 1 wrote it — text a ledger file (and a seal's archive, without the
    UNIQUE journal key) holds verbatim, and its schema check compares."""
    columns = SQLITE.event_columns(unique_journal_key=unique_journal_key)
    return "CREATE TABLE events(\n  " + ",\n  ".join(columns) + "\n) STRICT;"


# Each version's statements, applied in order to reach it. The allow-list of a version
# is whatever these statements produce in an empty database, so the two cannot drift.
MIGRATIONS: Final[dict[int, str]] = {
    1: """
CREATE TABLE meta(
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) STRICT;

""" + events_table() + """

CREATE INDEX events_step ON events(step, seq);

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'stepledger events are append-only: UPDATE refused'); END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'stepledger events are append-only: DELETE refused'); END;

CREATE TRIGGER events_no_replace BEFORE INSERT ON events
WHEN EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq OR journal_key = NEW.journal_key)
BEGIN SELECT RAISE(ABORT, 'stepledger events are append-only: REPLACE refused'); END;

CREATE TABLE projection_checkpoint(
  name TEXT PRIMARY KEY,
  last_seq INTEGER NOT NULL,
  version INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE steps(
  step_id TEXT PRIMARY KEY,
  run TEXT NOT NULL,
  workspace TEXT NOT NULL,
  state TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  rev INTEGER NOT NULL,
  manifest_rev INTEGER NOT NULL,
  manifest_digest TEXT,
  live INTEGER NOT NULL,
  committed_bytes INTEGER NOT NULL,
  stored_bytes INTEGER NOT NULL,
  first_seq INTEGER NOT NULL,
  last_seq INTEGER NOT NULL,
  updated_ns INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE blob_data(
  digest TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  data BLOB NOT NULL,
  stored_ns INTEGER NOT NULL
) STRICT;

CREATE TABLE pins(
  step TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  digest TEXT NOT NULL,
  role TEXT NOT NULL,
  seq INTEGER NOT NULL,
  PRIMARY KEY(step, attempt, digest)
) STRICT, WITHOUT ROWID;

CREATE INDEX pins_digest ON pins(digest);

CREATE TABLE manifests(
  step TEXT NOT NULL,
  manifest_rev INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  digest TEXT NOT NULL,
  supersedes TEXT,
  seq INTEGER NOT NULL,
  PRIMARY KEY(step, manifest_rev)
) STRICT, WITHOUT ROWID;

CREATE TABLE manifest_entries(
  step TEXT NOT NULL,
  manifest_rev INTEGER NOT NULL,
  role TEXT NOT NULL,
  path TEXT NOT NULL,
  digest TEXT NOT NULL,
  size INTEGER NOT NULL,
  PRIMARY KEY(step, manifest_rev, role, path)
) STRICT, WITHOUT ROWID;

CREATE INDEX manifest_entries_digest ON manifest_entries(digest);
""",
    # Workspaces (issue 4): revisions, per-path revisions and hashes, the lease.
    2: """
CREATE TABLE workspaces(
  name TEXT PRIMARY KEY,
  root TEXT NOT NULL,
  rev INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  holder TEXT NOT NULL,
  expires_ns INTEGER NOT NULL,
  released INTEGER NOT NULL,
  acquired_ns INTEGER NOT NULL,
  last_seq INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE ws_paths(
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  rev INTEGER NOT NULL,
  hash TEXT,
  seq INTEGER NOT NULL,
  PRIMARY KEY(workspace, path)
) STRICT, WITHOUT ROWID;
""",
    # GC (issue 5): blobs a collector condemned and has not collected yet. Not derived
    # from events: the collector's own resumable state; a publish or a pin un-condemns.
    3: """
CREATE TABLE condemned(
  digest TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  inline INTEGER NOT NULL,
  condemned_ns INTEGER NOT NULL,
  collection TEXT NOT NULL
) STRICT, WITHOUT ROWID;
""",
    # Sealed runs (issue 18): the ranges of rows a seal removed, and the one exception to
    # the append-only rule. A DELETE of an events row is allowed only inside a range
    # registered here, of that range's run, whose `run-sealed` event is already in the
    # log after it: the seal's own transaction inserts its event, then its ranges, then
    # deletes. Every other DELETE is refused as before. The index finds a run's rows.
    4: """
CREATE TABLE sealed_ranges(
  first_seq INTEGER PRIMARY KEY,
  last_seq INTEGER NOT NULL,
  run TEXT NOT NULL,
  seal_seq INTEGER NOT NULL
) STRICT;

CREATE INDEX events_run ON events(run, seq);

DROP TRIGGER events_no_delete;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (
  SELECT 1 FROM sealed_ranges r JOIN events s ON s.seq = r.seal_seq
  WHERE r.first_seq = (SELECT max(first_seq) FROM sealed_ranges WHERE first_seq <= OLD.seq)
    AND OLD.seq <= r.last_seq AND OLD.run = r.run AND r.seal_seq > r.last_seq
    AND s.kind = 'run-sealed')
BEGIN SELECT RAISE(ABORT, 'stepledger events are append-only: DELETE refused'); END;
""",
    # The exception holds only for the exact range and run its seal event records (one of
    # its `gaps`, of its `sealed_run`): a row forged into `sealed_ranges` that names an
    # unsealed event and some genuine seal deletes nothing.
    5: """
DROP TRIGGER events_no_delete;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (
  SELECT 1 FROM sealed_ranges r JOIN events s ON s.seq = r.seal_seq
  WHERE r.first_seq = (SELECT max(first_seq) FROM sealed_ranges WHERE first_seq <= OLD.seq)
    AND OLD.seq <= r.last_seq AND OLD.run = r.run AND r.seal_seq > r.last_seq
    AND s.kind = 'run-sealed'
    AND json_extract(CAST(s.payload AS TEXT), '$.sealed_run') = r.run
    AND EXISTS (SELECT 1 FROM json_each(CAST(s.payload AS TEXT), '$.gaps') g
                WHERE json_extract(g.value, '$[0]') = r.first_seq
                  AND json_extract(g.value, '$[1]') = r.last_seq))
BEGIN SELECT RAISE(ABORT, 'stepledger events are append-only: DELETE refused'); END;
""",
    # Format v6 (issue 39): fewer pages a commit.
    # - Inline blobs keyed by their digest alone (WITHOUT ROWID): one b-tree, not a rowid
    #   table and the digest's index — a page less each commit that stores one of less
    #   than ~1000 bytes (a larger one spills into overflow pages as before). The bytes
    #   last: a scan of names, sizes and times (GC, stat) reads no overflow page.
    # - The projection checkpoint follows the log (`ledger.store.FOLLOWS`, -1): every
    #   append writes its events' projection in its own transaction, so no commit
    #   rewrites the checkpoint's page. One at the head becomes FOLLOWS; a lagging one
    #   stays, for the next read-write open to catch up.
    # - An older writer rewrites the checkpoint at every commit, to its last event's seq:
    #   the triggers refuse exactly that, so a writer of an older version left running on
    #   a file another process migrated fails its first commit, the fix named, instead
    #   of writing a checkpoint that would make the tables read as lagging.
    6: """
CREATE TABLE blob_data_v6(
  digest TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  stored_ns INTEGER NOT NULL,
  data BLOB NOT NULL
) STRICT, WITHOUT ROWID;

INSERT INTO blob_data_v6(digest, size, stored_ns, data)
SELECT digest, size, stored_ns, data FROM blob_data;

DROP TABLE blob_data;

ALTER TABLE blob_data_v6 RENAME TO blob_data;

UPDATE projection_checkpoint SET last_seq = -1
WHERE last_seq >= coalesce((SELECT max(seq) FROM events), 0);

CREATE TRIGGER checkpoint_follows_insert BEFORE INSERT ON projection_checkpoint
WHEN NEW.last_seq <> -1 AND NEW.last_seq >= coalesce((SELECT max(seq) FROM events), 0)
BEGIN SELECT RAISE(ABORT, 'this steptrail ledger is in format v6 or later, which this version of steptrail cannot write: upgrade steptrail'); END;

CREATE TRIGGER checkpoint_follows_update BEFORE UPDATE ON projection_checkpoint
WHEN NEW.last_seq <> -1 AND NEW.last_seq >= coalesce((SELECT max(seq) FROM events), 0)
BEGIN SELECT RAISE(ABORT, 'this steptrail ledger is in format v6 or later, which this version of steptrail cannot write: upgrade steptrail'); END;
""",
}


@cache
def expected_schema(version: int) -> frozenset[tuple[str, str, str, str | None]]:
    """The exact sqlite_schema rows a ledger of `version` holds (the allow-list)."""
    conn = apsw.Connection(":memory:")
    for v in range(1, version + 1):
        conn.execute(MIGRATIONS[v])
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema").fetchall()
    conn.close()
    return frozenset(rows)


@cache
def tables_of(version: int) -> frozenset[str]:
    """The names of the tables a ledger of `version` has."""
    return frozenset(n for t, n, _, _ in expected_schema(version) if t == "table")


def stand_ins(conn: apsw.Connection, version: int) -> None:
    """On a read-only connection to a ledger of an older `version` (read as it is, not
    migrated), the tables later versions added, empty and TEMP (the temporary database:
    nothing is written to the file): every read of today's code finds them, and finds
    in them what such a file holds of them — nothing."""
    for t, name, _, sql in sorted(expected_schema(SCHEMA_VERSION)):
        if t == "table" and name not in tables_of(version):
            assert sql.startswith("CREATE TABLE ")
            conn.execute("CREATE TEMP TABLE " + sql[len("CREATE TABLE "):])


def drop_stand_ins(conn: apsw.Connection, was: int, now: int) -> None:
    """The stand-ins `stand_ins(conn, was)` made for tables a file of version `now` has."""
    for name in sorted((tables_of(now) - tables_of(was)) & tables_of(SCHEMA_VERSION)):
        conn.execute(f"DROP TABLE IF EXISTS temp.{name}")


def _text(value: object) -> str:
    """A schema row's type or name as text: its value when TEXT, else a printable stand-in."""
    return value if isinstance(value, str) else f"<{type(value).__name__} {value!r:.40}>"


def schema_changes(conn: apsw.Connection, version: int) -> list[str]:
    """How the file's schema differs from the allow-list of `version`, one line per object
    (added, dropped or changed); empty when it matches exactly."""
    # A damaged schema row may hold any value type in any column (a flipped bit turns a
    # name's TEXT into a BLOB): compared and named as text, so one damaged row is one
    # line of the answer, never an error of its own.
    found = {(_text(t), _text(n)): sql for t, n, _, sql in
             conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema")}
    expected = {(t, n): sql for t, n, _, sql in expected_schema(version)}
    out = []
    for key in sorted(found.keys() | expected.keys()):
        kind, name = key
        if key not in found:
            out.append(f"{kind} {name} was dropped")
        elif key not in expected:
            out.append(f"{kind} {name} was added")
        elif found[key] != expected[key]:
            out.append(f"{kind} {name} was changed")
    return out


def check_contents(conn: apsw.Connection, path: str, *, forensic: bool = False) -> int:
    """Check the application id, the version and the schema allow-list; return the version.

    `forensic` (read-only opens for `verify`) accepts a schema that differs only outside
    its tables (a dropped, changed or added trigger, view or index): every table reads as
    a ledger's, so everything else can still be checked; `schema_changes` names the rest.
    """
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if application_id != APPLICATION_ID:
        raise NotALedger(path, f"SQLite application_id is {application_id:#x}, not steptrail's")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise LedgerTooNew(path, version, SCHEMA_VERSION)
    if version < 1:
        raise NotALedger(path, "it has no steptrail schema version")
    found = frozenset(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema"))
    extra = found - expected_schema(version)
    missing = expected_schema(version) - found
    if forensic and not {r for r in extra | missing if r[0] == "table"}:
        return int(version)
    if extra or missing:
        names = sorted({f"{t} {n}" for t, n, _, _ in extra | missing})
        raise NotALedger(
            path, f"its schema differs from a steptrail v{version} ledger: {', '.join(names)}"
        )
    return int(version)

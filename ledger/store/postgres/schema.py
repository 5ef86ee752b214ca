"""The PostgreSQL ledger's schema: the same tables, columns and rules as the SQLite
ledger's (docs/storage.md), in PostgreSQL's types, and the check of a database against it.

A ledger is the set of steptrail tables in one schema of one database (the connection's
first `search_path` schema; ``?options=-csearch_path%3Dname`` in the URL picks another).
What marks it as a ledger is the `stepledger_schema` row (the application's name and the
schema version: what the SQLite file's application id and ``user_version`` say), and
every object is then checked against the allow-list this module defines: the tables,
their columns and constraints, the indexes, the append-only triggers (no WHEN, no column
list) and the function they run (its source, language and search path), each enabled. A database that holds other tables is not refused for them; a ledger whose
objects differ is (`NotALedger`), except by a forensic open, which `verify` makes to
report a dropped or disabled trigger as a finding.

Text columns are ``COLLATE "C"``: byte order, as SQLite's BINARY collation sorts, so
step ids, journal key ranges and every ORDER BY come out the same on both stores.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from ...errors import LedgerTooNew, NotALedger
from ..sql import POSTGRES

APPLICATION: Final = "stepledger"
#: The same version numbers as the SQLite schema: a v4 ledger holds the same rows.
SCHEMA_VERSION: Final = 6

#: The versions this code reads as they are (their tables are today's); it writes only
#: `SCHEMA_VERSION`, migrating an older one at a read-write open.
READABLE: Final = frozenset({4, 5, SCHEMA_VERSION})

_TN: Final = POSTGRES.TYPES["text"]  # text COLLATE "C"
_T: Final = f"{_TN} NOT NULL"

#: The tables, in creation order: name -> column definitions (and keys).
TABLES: Final[dict[str, str]] = {
    "stepledger_schema": "application text NOT NULL, version integer NOT NULL",
    "meta": f"key {_T} PRIMARY KEY, value {_T}",
    # its columns are both stores' (`ledger.store.sql.EVENT_COLUMNS`)
    "events": ", ".join(POSTGRES.event_columns()),
    "projection_checkpoint": f"name {_T} PRIMARY KEY, last_seq bigint NOT NULL,"
                             " version bigint NOT NULL",
    "steps": (
        f"step_id {_T} PRIMARY KEY, run {_T}, workspace {_T}, state {_T},"
        " attempt bigint NOT NULL, epoch bigint NOT NULL, rev bigint NOT NULL,"
        f" manifest_rev bigint NOT NULL, manifest_digest {_TN}, live bigint NOT NULL,"
        " committed_bytes bigint NOT NULL, stored_bytes bigint NOT NULL,"
        " first_seq bigint NOT NULL, last_seq bigint NOT NULL, updated_ns bigint NOT NULL"
    ),
    # inline blobs: written in the transaction that records them (as on SQLite)
    "blob_data": f"digest {_T} PRIMARY KEY, size bigint NOT NULL, data bytea NOT NULL,"
                 " stored_ns bigint NOT NULL",
    # larger blobs: the pointer row, written in the transaction that wrote every chunk
    "blob_files": f"digest {_T} PRIMARY KEY, size bigint NOT NULL, chunks bigint NOT NULL,"
                  " stored_ns bigint NOT NULL",
    "blob_chunks": f"digest {_T}, n bigint NOT NULL, data bytea NOT NULL,"
                   " PRIMARY KEY(digest, n)",
    "pins": f"step {_T}, attempt bigint NOT NULL, digest {_T}, role {_T},"
            " seq bigint NOT NULL, PRIMARY KEY(step, attempt, digest)",
    "manifests": f"step {_T}, manifest_rev bigint NOT NULL, attempt bigint NOT NULL,"
                 f" digest {_T}, supersedes {_TN}, seq bigint NOT NULL,"
                 " PRIMARY KEY(step, manifest_rev)",
    "manifest_entries": f"step {_T}, manifest_rev bigint NOT NULL, role {_T}, path {_T},"
                        f" digest {_T}, size bigint NOT NULL,"
                        " PRIMARY KEY(step, manifest_rev, role, path)",
    "workspaces": f"name {_T} PRIMARY KEY, root {_T}, rev bigint NOT NULL,"
                  f" epoch bigint NOT NULL, holder {_T}, expires_ns bigint NOT NULL,"
                  " released bigint NOT NULL, acquired_ns bigint NOT NULL,"
                  " last_seq bigint NOT NULL",
    "ws_paths": f"workspace {_T}, path {_T}, rev bigint NOT NULL, hash {_TN},"
                " seq bigint NOT NULL, PRIMARY KEY(workspace, path)",
    "condemned": f"digest {_T} PRIMARY KEY, size bigint NOT NULL, inline bigint NOT NULL,"
                 f" condemned_ns bigint NOT NULL, collection {_T}",
    "sealed_ranges": f"first_seq bigint PRIMARY KEY, last_seq bigint NOT NULL, run {_T},"
                     " seal_seq bigint NOT NULL",
}

INDEXES: Final[dict[str, str]] = {
    "events_step": "CREATE INDEX events_step ON events(step, seq)",
    "events_run": "CREATE INDEX events_run ON events(run, seq)",
    "pins_digest": "CREATE INDEX pins_digest ON pins(digest)",
    "manifest_entries_digest": "CREATE INDEX manifest_entries_digest ON manifest_entries(digest)",
}

#: The append-only rule, in the database itself: UPDATE and TRUNCATE of events are
#: refused to every connection, DELETE too except inside a range a `run-sealed` event
#: already in the log registered — one of the ranges (`gaps`) that very event records,
#: of its `sealed_run` (the SQLite trigger's very condition). Version 4's body trusted
#: any `sealed_ranges` row naming some seal; a v4 ledger is brought to v5 by its first
#: read-write open (`migrate`).
_APPEND_ONLY_V4: Final = """
BEGIN
  IF TG_OP = 'DELETE' AND EXISTS (
      SELECT 1 FROM sealed_ranges r JOIN events s ON s.seq = r.seal_seq
      WHERE r.first_seq = (SELECT max(first_seq) FROM sealed_ranges WHERE first_seq <= OLD.seq)
        AND OLD.seq <= r.last_seq AND OLD.run = r.run AND r.seal_seq > r.last_seq
        AND s.kind = 'run-sealed') THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION 'stepledger events are append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
"""
_APPEND_ONLY_V5: Final = """
BEGIN
  IF TG_OP = 'DELETE' AND EXISTS (
      SELECT 1 FROM sealed_ranges r JOIN events s ON s.seq = r.seal_seq
      WHERE r.first_seq = (SELECT max(first_seq) FROM sealed_ranges WHERE first_seq <= OLD.seq)
        AND OLD.seq <= r.last_seq AND OLD.run = r.run AND r.seal_seq > r.last_seq
        AND s.kind = 'run-sealed'
        AND convert_from(s.payload, 'UTF8')::jsonb ->> 'sealed_run' = r.run
        AND EXISTS (SELECT 1 FROM jsonb_array_elements(
                        convert_from(s.payload, 'UTF8')::jsonb -> 'gaps') g
                    WHERE (g ->> 0)::bigint = r.first_seq
                      AND (g ->> 1)::bigint = r.last_seq)) THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION 'stepledger events are append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
"""
#: Format v6: the projection checkpoint follows the log (`ledger.store.FOLLOWS`, -1) and
#: no commit rewrites it. A writer of an older version rewrites it at every commit, to
#: the seq of its last event (the head): this refuses exactly that write, so an older
#: worker left running on a ledger another worker migrated fails its first commit with
#: the fix named, never writing into v6 a checkpoint that would make the tables read
#: as lagging. A lag set by hand (behind the head) is still written.
_CHECKPOINT_FOLLOWS: Final = """
BEGIN
  IF NEW.last_seq <> -1 AND NEW.last_seq >= coalesce((SELECT max(seq) FROM events), 0) THEN
    RAISE EXCEPTION 'this steptrail ledger is in format v6 or later, which this version of steptrail cannot write: upgrade steptrail on this worker'
      USING ERRCODE = 'feature_not_supported';
  END IF;
  RETURN NEW;
END
"""
#: The append-only function's body by schema version (what a ledger of that version holds).
APPEND_ONLY_BODIES: Final = {4: _APPEND_ONLY_V4, 5: _APPEND_ONLY_V5, 6: _APPEND_ONLY_V5}
FUNCTIONS: Final[dict[str, str]] = {"stepledger_events_append_only": _APPEND_ONLY_V5,
                                    "stepledger_checkpoint_follows": _CHECKPOINT_FOLLOWS}


class Trigger(NamedTuple):
    table: str
    when: str
    function: str
    #: pg_trigger.tgtype (ROW 1, BEFORE 2, INSERT 4, DELETE 8, UPDATE 16, TRUNCATE 32)
    tgtype: int
    #: the first schema version that has it
    since: int = 4


TRIGGERS: Final[dict[str, Trigger]] = {
    "events_no_update": Trigger("events", "BEFORE UPDATE ON events FOR EACH ROW",
                                "stepledger_events_append_only", 19),
    "events_no_delete": Trigger("events", "BEFORE DELETE ON events FOR EACH ROW",
                                "stepledger_events_append_only", 11),
    "events_no_truncate": Trigger("events", "BEFORE TRUNCATE ON events FOR EACH STATEMENT",
                                  "stepledger_events_append_only", 34),
    "checkpoint_follows": Trigger(
        "projection_checkpoint", "BEFORE INSERT OR UPDATE ON projection_checkpoint"
        " FOR EACH ROW", "stepledger_checkpoint_follows", 23, since=6),
}


def _body(function: str, version: int) -> str | None:
    """The source `function` has in a ledger of `version`."""
    if function == "stepledger_events_append_only":
        return APPEND_ONLY_BODIES.get(version)
    return FUNCTIONS[function]


def _function_statements(name: str, body: str, *, replace: bool = False) -> list[str]:
    """The trigger function `name` with `body`, and its search path."""
    return [f"CREATE {'OR REPLACE ' if replace else ''}FUNCTION {name}() RETURNS trigger"
            f" LANGUAGE plpgsql AS $body${body}$body$",
            # Its names resolve in the ledger's schema, and a session's temporary tables
            # last: PostgreSQL searches pg_temp first unless the path names it, so with the
            # path a `FROM CURRENT` captured, a temporary `sealed_ranges` and `events` let
            # any role that may DELETE events delete any of them. (CREATE OR REPLACE
            # resets it: set again.)
            f"DO $do$BEGIN EXECUTE format('ALTER FUNCTION {name}() SET search_path"
            " = %I, pg_temp', current_schema()); END$do$"]


def create_statements() -> list[str]:
    """Every statement that makes an empty schema a v`SCHEMA_VERSION` ledger."""
    out = [f"CREATE TABLE {name}({cols})" for name, cols in TABLES.items()]
    out += list(INDEXES.values())
    for name, body in FUNCTIONS.items():
        out += _function_statements(name, body)
    for name, t in TRIGGERS.items():
        out.append(f"CREATE TRIGGER {name} {t.when} EXECUTE FUNCTION {t.function}()")
    # large random chunks: stored out of line, never compressed (it cannot shrink them)
    out.append("ALTER TABLE blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    out.append("ALTER TABLE blob_data ALTER COLUMN data SET STORAGE EXTERNAL")
    out.append("INSERT INTO stepledger_schema(application, version)"
               f" VALUES ('{APPLICATION}', {SCHEMA_VERSION})")
    return out


# -- checking a database ----------------------------------------------------------------

_COLUMNS_SQL: Final = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(co.collname, '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relkind IN ('r', 'p')
  AND a.attnum > 0 AND NOT a.attisdropped AND c.relname = ANY(%s)
"""
_INDEXES_SQL: Final = """
SELECT i.relname, t.relname, pg_get_indexdef(i.oid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relnamespace = quote_ident(current_schema())::regnamespace AND t.relname = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                  WHERE k.conindid = x.indexrelid AND k.conrelid = x.indrelid)
"""
_TRIGGERS_SQL: Final = """
SELECT t.tgname, c.relname, t.tgenabled, p.proname, p.prosrc, t.tgtype,
       t.tgqual IS NULL AND t.tgnargs = 0 AND t.tgattr::text = ''
         AND t.tgoldtable IS NULL AND t.tgnewtable IS NULL,
       l.lanname = 'plpgsql' AND NOT p.prosecdef AND p.proconfig IS NOT DISTINCT FROM
         ARRAY['search_path=' || quote_ident(current_schema()) || ', pg_temp']
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
JOIN pg_language l ON l.oid = p.prolang
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relname = ANY(%s)
  AND NOT t.tgisinternal
"""
#: The constraints of the ledger's tables (NOT NULL is a column's, not one of these).
_CONSTRAINTS_SQL: Final = """
SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relname = ANY(%s)
  AND k.contype IN ('p', 'u', 'c', 'f', 'x', 't')
"""
_RULES_SQL: Final = """
SELECT r.rulename, c.relname FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relname = ANY(%s)
  AND r.rulename <> '_RETURN'
"""
_POLICIES_SQL: Final = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = quote_ident(current_schema())::regnamespace AND c.relname = ANY(%s)
  AND (c.relrowsecurity OR c.relkind <> 'r')
"""


def read_marker(conn: Any, location: str) -> int | None:
    """The schema version the `stepledger_schema` row records; None: the schema holds no
    steptrail tables at all (an empty database). NotALedger / LedgerTooNew otherwise."""
    row = conn.execute("SELECT to_regclass(quote_ident(current_schema()) || '.stepledger_schema'),"
                       " to_regclass(quote_ident(current_schema()) || '.events'),"
                       " current_schema()").fetchone()
    if row[2] is None:
        raise NotALedger(location, "the connection has no schema to use (its search_path"
                         " names none that exists)")
    if row[0] is None:
        if row[1] is not None:
            raise NotALedger(location, f"schema {row[2]} has an events table but no"
                             " stepledger_schema row: another application's")
        return None
    rows = conn.execute("SELECT application, version FROM stepledger_schema").fetchall()
    if len(rows) != 1 or rows[0][0] != APPLICATION or type(rows[0][1]) is not int:
        raise NotALedger(location, "its stepledger_schema table does not hold one"
                         " steptrail row")
    version = rows[0][1]
    if version > SCHEMA_VERSION:
        raise LedgerTooNew(location, version, SCHEMA_VERSION)
    if version < 1:
        raise NotALedger(location, f"it records schema version {version}")
    return int(version)


def _to_v5(conn: Any) -> None:
    """v4 -> v5: the append-only function's stricter body."""
    for stmt in _function_statements("stepledger_events_append_only", _APPEND_ONLY_V5,
                                     replace=True):
        conn.execute(stmt)


def _to_v6(conn: Any) -> None:
    """v5 -> v6: the checkpoint follows the log. A checkpoint at the head becomes
    `FOLLOWS` (a lagging one stays: the next read-write open catches up), and the
    trigger that refuses an older writer's per-commit checkpoint is made."""
    conn.execute("UPDATE projection_checkpoint SET last_seq = -1"
                 " WHERE last_seq >= coalesce((SELECT max(seq) FROM events), 0)")
    for stmt in _function_statements("stepledger_checkpoint_follows", _CHECKPOINT_FOLLOWS):
        conn.execute(stmt)
    t = TRIGGERS["checkpoint_follows"]
    conn.execute(f"CREATE TRIGGER checkpoint_follows {t.when} EXECUTE FUNCTION {t.function}()")


#: Each version's step from the one before.
_STEPS: Final = {5: _to_v5, 6: _to_v6}


def migrate(conn: Any, version: int, init_lock: tuple[int, int]) -> int:
    """Bring a ledger of an older `version` to `SCHEMA_VERSION` in one transaction (under
    the init lock, so two opens migrate once); the version it is at now. A ledger whose
    objects are not exactly its version's is left alone (its open refuses it, naming the
    difference)."""
    if version not in range(4, SCHEMA_VERSION):
        return version
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", init_lock)
        # judged under the lock: another opener may have migrated it meanwhile (its
        # objects are then the newer version's, not "added" to this one's)
        now = int(conn.execute("SELECT max(version) FROM stepledger_schema").fetchone()[0])
        if now == version and not schema_changes(conn, version):
            for v in range(version + 1, SCHEMA_VERSION + 1):
                _STEPS[v](conn)
            conn.execute(f"UPDATE stepledger_schema SET version = {SCHEMA_VERSION}")
            now = SCHEMA_VERSION
        conn.execute("COMMIT")
    except BaseException:
        if not conn.broken:
            conn.execute("ROLLBACK")
        raise
    return now


def schema_changes(conn: Any, version: int = SCHEMA_VERSION) -> list[str]:
    """How the schema's ledger objects differ from the allow-list of `version`, one line
    per object (empty: exactly what `create_statements` makes, at that version)."""
    names = list(TABLES)
    out: list[str] = []
    found_cols: dict[str, dict[str, tuple[str, bool, str]]] = {}
    for table, col, typ, notnull, coll in conn.execute(_COLUMNS_SQL, (names,)).fetchall():
        found_cols.setdefault(table, {})[col] = (typ, bool(notnull), coll)
    expected = _expected_columns()
    for table in names:
        if table not in found_cols:
            out.append(f"table {table} was dropped")
        elif found_cols[table] != expected[table]:
            out.append(f"table {table} was changed")
    found_idx = {name: (table, sql) for name, table, sql in
                 conn.execute(_INDEXES_SQL, (names,)).fetchall()}
    for name, sql in INDEXES.items():
        if name not in found_idx:
            out.append(f"index {name} was dropped")
        elif not found_idx[name][1].endswith(sql.split(" ON ", 1)[1].replace("(", " USING btree (", 1)):
            out.append(f"index {name} was changed")
    for name in sorted(set(found_idx) - set(INDEXES)):
        out.append(f"index {name} was added")
    found_trg = {r[0]: r for r in conn.execute(_TRIGGERS_SQL, (names,)).fetchall()}
    triggers = {n: t for n, t in TRIGGERS.items() if t.since <= version}
    for name, t in triggers.items():
        got = found_trg.get(name)
        if got is None:
            out.append(f"trigger {name} was dropped")
        elif got[1] != t.table or got[3] != t.function \
                or got[4] != _body(t.function, version) \
                or got[5] != t.tgtype or not got[6] or not got[7]:
            out.append(f"trigger {name} was changed")
        elif got[2] != "O":
            out.append(f"trigger {name} was disabled")
    for name in sorted(set(found_trg) - set(triggers)):
        out.append(f"trigger {name} was added")
    expected_keys = _expected_constraints()
    found_keys: list[tuple[str, str]] = []
    for table, name, kind, sql in conn.execute(_CONSTRAINTS_SQL, (names,)).fetchall():
        if (table, f"{kind} {sql}") in expected_keys:
            found_keys.append((table, f"{kind} {sql}"))
        else:  # (a CHECK runs code on every insert; a UNIQUE refuses events)
            out.append(f"table {table} was changed: constraint {name} was added")
    for table, key in sorted(set(expected_keys) - set(found_keys)):
        out.append(f"table {table} was changed: its {key[2:]} was dropped")
    for rule, table in conn.execute(_RULES_SQL, (names,)).fetchall():
        out.append(f"rule {rule} on {table} was added")
    for (table,) in conn.execute(_POLICIES_SQL, (names,)).fetchall():
        out.append(f"table {table} has row security or is not a plain table")
    return out


def check_schema(conn: Any, location: str, *, forensic: bool,
                 version: int = SCHEMA_VERSION) -> tuple[str, ...]:
    """Refuse (NotALedger) a ledger whose objects differ from the allow-list; a forensic
    open accepts differences outside its tables (triggers, indexes, rules), returned for
    verify to report."""
    changes = schema_changes(conn, version)
    if not changes:
        return ()
    tables_differ = [c for c in changes if c.startswith("table ")]
    if forensic and not tables_differ:
        return tuple(changes)
    raise NotALedger(location, "its schema differs from a steptrail"
                     f" v{SCHEMA_VERSION} ledger: {', '.join(changes)}")


def _expected_columns() -> dict[str, dict[str, tuple[str, bool, str]]]:
    out: dict[str, dict[str, tuple[str, bool, str]]] = {}
    types = {"text": "text", "bigint": "bigint", "integer": "integer", "bytea": "bytea"}
    for table, cols in TABLES.items():
        got: dict[str, tuple[str, bool, str]] = {}
        for part in _split(cols):
            words = part.split()
            if words[0].upper() == "PRIMARY":
                continue
            name, typ = words[0], types[words[1]]
            notnull = "NOT NULL" in part or "PRIMARY KEY" in part
            coll = "C" if 'COLLATE "C"' in part else ""
            got[name] = (typ, notnull, coll)
        # a composite primary key makes its columns NOT NULL
        for part in _split(cols):
            if part.startswith("PRIMARY KEY("):
                for col in part[len("PRIMARY KEY("):-1].split(","):
                    typ, _, coll = got[col.strip()]
                    got[col.strip()] = (typ, True, coll)
        out[table] = got
    return out


def _expected_constraints() -> list[tuple[str, str]]:
    """(table, "contype definition") of each constraint `create_statements` makes, as
    pg_get_constraintdef prints it: every primary key, and the journal key's UNIQUE."""
    out = []
    for table, cols in TABLES.items():
        for part in _split(cols):
            words = part.split()
            if part.startswith("PRIMARY KEY("):
                keys = [c.strip() for c in part[len("PRIMARY KEY("):-1].split(",")]
                out.append((table, f"p PRIMARY KEY ({', '.join(keys)})"))
            elif "PRIMARY KEY" in part:
                out.append((table, f"p PRIMARY KEY ({words[0]})"))
            elif part.endswith(" UNIQUE") or " UNIQUE " in part:
                out.append((table, f"u UNIQUE ({words[0]})"))
    return out


def _split(cols: str) -> list[str]:
    """Column definitions split on the commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in cols:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


__all__ = ["APPLICATION", "SCHEMA_VERSION", "check_schema", "create_statements", "read_marker",
           "schema_changes"]

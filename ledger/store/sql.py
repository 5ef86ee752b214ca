"""The SQL both stores run, written once, and the `Dialect` that renders it for each.

The two stores hold the same tables, columns and keys (docs/storage.md), so most of
their statements are the same text: they are written here once, with ``?`` placeholders,
and `Statements(dialect)` renders every one of them for a store (`SQLITE`, `POSTGRES`).
Where the dialects say one thing in two forms, the `Dialect` writes the form: the
placeholder (``?`` / ``%s``), INSERT OR IGNORE / ON CONFLICT DO NOTHING, INSERT OR
REPLACE / an upsert, GLOB / a regular expression, ``length(CAST(x AS BLOB))`` /
``octet_length``, an IN list / ``= ANY`` of one array, a join order fixed by CROSS JOIN
/ a plain JOIN, the column types. What differs in more than form stays with its store
(`sqlite/sql.py`, `postgres/sql.py`: the newest journal key of a range, the totals by
time). The events table's columns are defined here once (`EVENT_COLUMNS`): the SQLite
schema, a seal's archive and the PostgreSQL schema render them.

Each store's modules render from here and from nothing of the other store's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, Final

from .rows import IN_FLIGHT, StepRow, WsRow
from . import COPY_TABLES, FOLLOWS, ROW_NAMES, EventQuery, ProjectionChanges

#: The events table: (column, kind, constraint) in `ROW_NAMES` order; a kind is "int",
#: "text" or "bytes" (`Dialect.TYPES`). Every column is NOT NULL (the primary key is by
#: being one).
EVENT_COLUMNS: Final = (
    ("seq", "int", "PRIMARY KEY"),
    ("time_ns", "int", ""),
    ("workspace", "text", ""),
    ("run", "text", ""),
    ("step", "text", ""),
    ("attempt", "int", ""),
    ("epoch", "int", ""),
    ("rev", "int", ""),
    ("journal_key", "text", "UNIQUE"),
    ("kind", "text", ""),
    ("v", "int", ""),
    ("payload", "bytes", ""),
    ("prev_hash", "bytes", ""),
    ("hash", "bytes", ""),
)

ROW_COLUMNS: Final = ", ".join(ROW_NAMES)
#: The columns a projection fold needs.
FOLD_COLUMNS: Final = "seq, time_ns, kind, v, payload"
STEP_COLUMNS: Final = ", ".join(StepRow.COLUMNS)
WS_COLUMNS: Final = ", ".join(WsRow.COLUMNS)
# each table's columns, as the interface lists them
PATH_COLUMNS: Final = COPY_TABLES["ws_paths"]
PIN_COLUMNS: Final = COPY_TABLES["pins"]
MANIFEST_COLUMNS: Final = COPY_TABLES["manifests"]
ENTRY_COLUMNS: Final = COPY_TABLES["manifest_entries"]
CONDEMNED_COLUMNS: Final = COPY_TABLES["condemned"]
INLINE_COLUMNS: Final = COPY_TABLES["blob_data"]
SEALED_COLUMNS: Final = COPY_TABLES["sealed_ranges"]


class Dialect:
    """How one store's SQL says what the dialects say differently (see the module
    docstring). `SQLITE` and `POSTGRES` are the two."""

    name: str
    #: The driver's placeholder.
    PARAM: str
    #: Column kind -> the column type.
    TYPES: dict[str, str]
    #: The schema of the connection's temporary tables.
    TEMP_SCHEMA: str
    #: A join the planner must take in the order written: SQLite's CROSS JOIN; a plain
    #: JOIN on PostgreSQL (whose CROSS JOIN takes no ON; its planner needs no hint there).
    ORDERED_JOIN: str

    def render(self, sql: str) -> str:
        """`sql` (written with ``?`` placeholders) in this dialect."""
        return sql

    def marks(self, n: int) -> str:
        return ", ".join("?" * n)

    def insert(self, table: str, columns: Sequence[str]) -> str:
        return f"INSERT INTO {table}({', '.join(columns)}) VALUES ({self.marks(len(columns))})"

    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """Insert, or update the row of the same `key` in place (both dialects' form)."""
        return (self.insert(table, columns) + f" ON CONFLICT({', '.join(key)}) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key))

    def insert_or_ignore(self, table: str, columns: Sequence[str]) -> str:
        """Insert, or nothing when a row of the same key is there."""
        raise NotImplementedError

    def insert_or_replace(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """Insert, or make the row of the same `key` this one."""
        raise NotImplementedError

    def octets(self, expr: str, *, text: bool = False) -> str:
        """The length in bytes of a bytes (or, `text`, a text) value."""
        raise NotImplementedError

    def has_char_outside(self, expr: str, chars: str) -> str:
        """Whether `expr` holds a character outside the bracket class `chars`."""
        raise NotImplementedError

    def in_set(self, column: str) -> str:
        """`column` is one of a set of values (see each dialect for its parameters)."""
        raise NotImplementedError

    def column(self, name: str, kind: str, constraint: str = "") -> str:
        """A column definition: its type, NOT NULL (but for a primary key), `constraint`."""
        out = f"{name} {self.TYPES[kind]}"
        if constraint != "PRIMARY KEY":
            out += " NOT NULL"
        return f"{out} {constraint}" if constraint else out

    def event_columns(self, *, unique_journal_key: bool = True) -> list[str]:
        """The events table's column definitions (`EVENT_COLUMNS`); a seal's archive
        declares no UNIQUE journal key (`unique_journal_key=False`)."""
        return [self.column(n, k, c if unique_journal_key or c != "UNIQUE" else "")
                for n, k, c in EVENT_COLUMNS]


class _Sqlite(Dialect):
    name = "sqlite"
    PARAM = "?"
    TYPES = {"int": "INTEGER", "text": "TEXT", "bytes": "BLOB"}
    TEMP_SCHEMA = "temp"
    # CROSS JOIN: SQLite keeps the order written (from the live steps outward)
    ORDERED_JOIN = "CROSS JOIN"

    def insert_or_ignore(self, table: str, columns: Sequence[str]) -> str:
        return "INSERT OR IGNORE" + self.insert(table, columns)[len("INSERT"):]

    def contains(self, column: str) -> str:
        """`column` holds the text of one ``?`` (case-sensitive, no wildcards)."""
        return f"instr({column}, ?) > 0"

    def insert_or_replace(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        return "INSERT OR REPLACE" + self.insert(table, columns)[len("INSERT"):]

    def octets(self, expr: str, *, text: bool = False) -> str:
        return f"length(CAST({expr} AS BLOB))" if text else f"length({expr})"

    def has_char_outside(self, expr: str, chars: str) -> str:
        return f"{expr} GLOB '*[^{chars}]*'"

    def in_set(self, column: str) -> str:
        """One ``?`` per value: a template, formatted with as many marks as values."""
        return f"{column} IN ({{}})"


class _Postgres(Dialect):
    name = "postgres"
    PARAM = "%s"
    # COLLATE "C": byte order, as SQLite's BINARY collation sorts
    TYPES = {"int": "bigint", "text": 'text COLLATE "C"', "bytes": "bytea"}
    TEMP_SCHEMA = "pg_temp"
    ORDERED_JOIN = "JOIN"

    def render(self, sql: str) -> str:
        if "%" in sql:
            raise ValueError(f"a literal % in {sql!r}")  # psycopg would read it as a mark
        return sql.replace("?", self.PARAM)

    def insert_or_ignore(self, table: str, columns: Sequence[str]) -> str:
        return self.insert(table, columns) + " ON CONFLICT DO NOTHING"

    def contains(self, column: str) -> str:
        return f"strpos({column}, ?) > 0"

    def insert_or_replace(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        return self.upsert(table, columns, key)

    def octets(self, expr: str, *, text: bool = False) -> str:
        return f"octet_length({expr})"

    def has_char_outside(self, expr: str, chars: str) -> str:
        return f"{expr} ~ '[^{chars}]'"

    def in_set(self, column: str) -> str:
        """One parameter: the values as an array."""
        return f"{column} = ANY(?)"


SQLITE: Final[Dialect] = _Sqlite()
POSTGRES: Final[Dialect] = _Postgres()


class Statements:
    """Every shared statement, rendered in one dialect (each store's module names the
    ones it runs). Names with ``{}`` are templates (a table name, a clause)."""

    def __init__(self, dialect: Dialect) -> None:
        d = self.dialect = dialect
        r = d.render

        # -- events ------------------------------------------------------------------
        self.INSERT_EVENT: Final = r(d.insert("events", ROW_NAMES))
        self.HEAD: Final = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
        self.COUNT: Final = "SELECT count(*) FROM events"
        self.JOURNAL: Final = r(f"SELECT {ROW_COLUMNS} FROM events WHERE journal_key = ?")
        #: every row after a seq, a batch of them (verify's checked read)
        self.CHECKED: Final = r(f"SELECT {ROW_COLUMNS} FROM events WHERE seq > ?"
                                " ORDER BY seq LIMIT ?")
        #: an event's bytes as `steptrail stats` counts them: payload, journal key, two
        #: hashes
        self.EVENT_BYTES: Final = (f"{d.octets('payload')}"
                                   f" + {d.octets('journal_key', text=True)} + 64")
        self.TOTALS_BY_RUN: Final = (
            f"SELECT run, kind, count(*), sum({self.EVENT_BYTES}), min(time_ns),"
            " max(time_ns) FROM events GROUP BY run, kind ORDER BY run, kind")
        self.ADD_SEALED_RANGE: Final = r(d.insert("sealed_ranges", SEALED_COLUMNS))
        self.DELETE_SEALED: Final = r("DELETE FROM events WHERE seq BETWEEN ? AND ? AND run = ?")

        # -- savepoints (templates: the name), the same text in both dialects -------
        self.SAVEPOINT: Final = "SAVEPOINT {}"
        self.ROLLBACK_TO: Final = "ROLLBACK TO SAVEPOINT {}"
        self.RELEASE: Final = "RELEASE SAVEPOINT {}"

        # -- meta ---------------------------------------------------------------------
        self.SELECT_META: Final = r("SELECT value FROM meta WHERE key = ?")
        self.META_ALL: Final = "SELECT key, value FROM meta"
        self.UPSERT_META: Final = r(d.upsert("meta", ("key", "value"), ("key",)))

        # -- steps, workspaces, paths -------------------------------------------------
        self.SELECT_STEP: Final = r(f"SELECT {STEP_COLUMNS} FROM steps WHERE step_id = ?")
        #: the rows of a set of steps (`Dialect.in_set`: its parameters)
        self.SELECT_STEPS_IN: Final = r(f"SELECT {STEP_COLUMNS} FROM steps WHERE "
                                        + d.in_set("step_id"))
        # Updated in place (not REPLACE, which deletes and reinserts the row).
        self.UPSERT_STEP: Final = r(d.upsert("steps", StepRow.COLUMNS, ("step_id",)))
        self.SELECT_WS: Final = f"SELECT {WS_COLUMNS} FROM workspaces"
        self.SELECT_ONE_WS: Final = r(f"SELECT {WS_COLUMNS} FROM workspaces WHERE name = ?")
        #: One row with what says whether the tables are caught up, in one statement
        #: (one snapshot): the checkpoint's last seq and version, the head's seq, then the
        #: row's columns (NULLs when there is none). Parameters: the checkpoint's name
        #: twice, the key.
        self.STEP_IF_CURRENT: Final = r(_if_current("steps", "step_id", StepRow.COLUMNS))
        self.WS_IF_CURRENT: Final = r(_if_current("workspaces", "name", WsRow.COLUMNS))
        self.UPSERT_WS: Final = r(d.upsert("workspaces", WsRow.COLUMNS, ("name",)))
        self.SELECT_PATH: Final = r("SELECT rev, hash, seq FROM ws_paths"
                                    " WHERE workspace = ? AND path = ?")
        self.SELECT_PATHS: Final = f"SELECT {', '.join(PATH_COLUMNS)} FROM ws_paths"
        self.UPSERT_PATH: Final = r(d.upsert("ws_paths", PATH_COLUMNS, ("workspace", "path")))
        self.LIVE_STEPS: Final = "SELECT count(*) FROM steps WHERE live = 1"
        #: the step count and stored bytes of the steps in a set of states
        #: (`Dialect.in_set`: its parameters)
        self.STEP_TOTALS: Final = r("SELECT count(*), coalesce(sum(stored_bytes), 0)"
                                    " FROM steps WHERE " + d.in_set("state"))

        # -- pins, manifests ----------------------------------------------------------
        self.SELECT_PINS: Final = f"SELECT {', '.join(PIN_COLUMNS)} FROM pins"
        self.SELECT_MANIFESTS: Final = f"SELECT {', '.join(MANIFEST_COLUMNS)} FROM manifests"
        self.SELECT_ENTRIES: Final = f"SELECT {', '.join(ENTRY_COLUMNS)} FROM manifest_entries"
        self.DROP_ENTRIES: Final = r("DELETE FROM manifest_entries WHERE step = ?")
        self.DROP_MANIFESTS: Final = r("DELETE FROM manifests WHERE step = ?")
        self.DROP_PINS: Final = r("DELETE FROM pins WHERE step = ?")
        self.RELEASE_ACKED: Final = r("DELETE FROM pins WHERE step = ? AND attempt = ?"
                                      " AND role IN (?, ?)")
        self.RELEASE_ENDED: Final = r("DELETE FROM pins WHERE step = ? AND attempt = ?")
        self.ADD_PINS: Final = r(d.insert_or_ignore("pins", PIN_COLUMNS))
        # or replace: a catch-up may fold again a manifest whose rows are already there
        #: (the table: a template)
        self.ADD_MANIFESTS: Final = r(d.insert_or_replace("{}", MANIFEST_COLUMNS,
                                                          ("step", "manifest_rev")))
        self.ADD_ENTRIES: Final = r(d.insert_or_replace("{}", ENTRY_COLUMNS,
                                                        ("step", "manifest_rev", "role", "path")))
        #: Pins with what decides whether they hold (`ledger.store.PinHold`).
        self.PIN_HOLDS: Final = ("SELECT p.digest, p.role, s.state, p.attempt, s.attempt,"
                                 " s.updated_ns FROM pins p LEFT JOIN steps s"
                                 " ON s.step_id = p.step")
        self.PIN_HOLDS_OF: Final = r(self.PIN_HOLDS + " WHERE p.digest = ?")
        self.MANIFEST_DIGESTS: Final = "SELECT DISTINCT digest FROM manifest_entries"
        self.NAMES_DIGEST: Final = r("SELECT 1 FROM manifest_entries WHERE digest = ? LIMIT 1")
        self.ENTRIES_NAMING: Final = r("SELECT step, manifest_rev, path FROM manifest_entries"
                                       " WHERE digest = ? LIMIT ?")
        # from the live steps outward (on SQLite, CROSS JOIN keeps it from starting at the
        # entries' digest index and probing a step for each of them)
        self.LIVE_ENTRIES: Final = (f"SELECT e.digest, e.size FROM steps s {d.ORDERED_JOIN}"
                                    " manifest_entries e ON e.step = s.step_id"
                                    " AND e.manifest_rev = s.manifest_rev WHERE s.live = 1")

        # -- the checkpoint, the condemned rows -----------------------------------------
        #: the checkpoint as read: a stored FOLLOWS is the head's seq (one statement)
        self.SELECT_CHECKPOINT: Final = r(
            f"SELECT CASE WHEN last_seq = {FOLLOWS} THEN coalesce((SELECT max(seq) FROM"
            " events), 0) ELSE last_seq END, version FROM projection_checkpoint WHERE name = ?")
        self.SET_CHECKPOINT: Final = r(d.upsert("projection_checkpoint",
                                                COPY_TABLES["projection_checkpoint"], ("name",)))
        self.CHECKPOINT_ROWS: Final = "SELECT name, last_seq, version FROM projection_checkpoint"
        self.CONDEMN: Final = r(d.insert_or_ignore("condemned", CONDEMNED_COLUMNS))
        self.UNCONDEMN: Final = r("DELETE FROM condemned WHERE digest = ?")
        self.SELECT_CONDEMNED: Final = "SELECT digest, size, inline FROM condemned"
        self.SELECT_ONE_CONDEMNED: Final = r("SELECT size, inline FROM condemned WHERE digest = ?")
        self.COUNT_CONDEMNED: Final = "SELECT count(*) FROM condemned"

        # -- inline blobs ---------------------------------------------------------------
        self.INLINE_SIZE: Final = r("SELECT size FROM blob_data WHERE digest = ?")
        self.INLINE_BLOB: Final = r("SELECT size, data FROM blob_data WHERE digest = ?")
        self.INLINE_STAT: Final = r("SELECT size, stored_ns FROM blob_data WHERE digest = ?")
        #: Insert, or make the row of the same digest these bytes at this time (in place).
        self.INLINE_UPSERT: Final = r(d.upsert("blob_data", INLINE_COLUMNS, ("digest",)))
        self.INLINE_DELETE: Final = r("DELETE FROM blob_data WHERE digest = ?")
        self.INLINE_ALL: Final = "SELECT digest, size, stored_ns FROM blob_data ORDER BY digest"
        #: inline rows whose cells cannot be a blob's (verify)
        self.INLINE_ROW_PROBLEMS: Final = r(
            f"SELECT digest, size, {d.octets('data')} FROM blob_data"
            f" WHERE size <> {d.octets('data')} OR length(digest) <> 64"
            f" OR {d.has_char_outside('digest', '0-9a-f')} LIMIT ?")

    # -- built per call -----------------------------------------------------------------

    def query(self, q: EventQuery, columns: str = ROW_COLUMNS) -> tuple[str, list[Any]]:
        """The paged statement for `q` (its first parameter: the seq to page from, its
        last: the batch size) and the parameters in between."""
        where = ["seq < ?" if q.descending else "seq > ?"]
        params: list[Any] = []
        if q.descending and q.after_seq:
            where.append("seq > ?")
            params.append(q.after_seq)
        if q.step is not None:
            where.append("step = ?")
            params.append(q.step)
        if q.attempt is not None:
            where.append("attempt = ?")
            params.append(q.attempt)
        if q.kinds is not None:
            kinds = sorted(q.kinds)
            where.append("kind = ?" if len(kinds) == 1
                         else f"kind IN ({', '.join('?' * len(kinds))})")
            params.extend(kinds)
        if q.run is not None:
            where.append("run = ?")
            params.append(q.run)
        if q.workspace is not None:
            where.append("workspace = ?")
            params.append(q.workspace)
        order = "seq DESC" if q.descending else "seq"
        return self.dialect.render(f"SELECT {columns} FROM events WHERE {' AND '.join(where)}"
                                   f" ORDER BY {order} LIMIT ?"), params

    def select_steps(self, state: str | None, step_id: str | None, contains: str | None = None,
                     limit: int | None = None) -> tuple[str, list[object]]:
        where, params = [], []
        if state is not None:
            where.append("state = ?")
            params.append(state)
        if step_id is not None:
            where.append("step_id = ?")
            params.append(step_id)
        if contains is not None:
            where.append(self.dialect.contains("step_id"))
            params.append(contains)
        sql = f"SELECT {STEP_COLUMNS} FROM steps"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY first_seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return self.dialect.render(sql), params

    def in_flight(self, before: bool, oldest_first: bool, limit: bool) -> str:
        """The latest attempts of a workspace's steps still in flight under an epoch
        (> 0), of epochs before a given one when `before`; parameters: the workspace,
        [the epoch], the `IN_FLIGHT` states (sorted), [the limit]."""
        return self.dialect.render(
            "SELECT step_id, attempt FROM steps WHERE workspace = ? AND epoch > 0"
            + (" AND epoch < ?" if before else "")
            + f" AND state IN ({', '.join('?' * len(IN_FLIGHT))})"
            + f" ORDER BY {'first_seq' if oldest_first else 'step_id'}"
            + (" LIMIT ?" if limit else ""))

    # -- whole-log folds into tables (`ledger.store.scratch`) ---------------------------------

    def select_step_in(self, table: str) -> str:
        return self.dialect.render(f"SELECT {STEP_COLUMNS} FROM {table} WHERE step_id = ?")

    def upsert_step_into(self, table: str) -> str:
        return self.dialect.render(self.dialect.upsert(table, StepRow.COLUMNS, ("step_id",)))

    @staticmethod
    def count_rows(table: str) -> str:
        return f"SELECT count(*) FROM {table}"

    @staticmethod
    def empty(table: str) -> str:
        return f"DELETE FROM {table}"

    def drop_temp(self, name: str) -> str:
        return f"DROP TABLE IF EXISTS {self.dialect.TEMP_SCHEMA}.{name}"

    @staticmethod
    def copy_steps(source: str, target: str) -> str:
        return f"INSERT INTO {target} SELECT {STEP_COLUMNS} FROM {source}"

    @staticmethod
    def step_differences(fresh: str, current: str) -> str:
        """The ids of the steps whose rows differ between step tables `fresh` and
        `current` (or that only one holds), in order."""
        return (f"SELECT step_id FROM (SELECT {STEP_COLUMNS} FROM {fresh} EXCEPT"
                f" SELECT {STEP_COLUMNS} FROM {current}) a UNION SELECT step_id FROM"
                f" (SELECT {STEP_COLUMNS} FROM {current} EXCEPT SELECT {STEP_COLUMNS}"
                f" FROM {fresh}) b ORDER BY step_id")

    @staticmethod
    def rows_not_in(columns: Sequence[str], a: str, b: str) -> str:
        """Up to 3 rows of table `a` that table `b` does not hold (in `columns`)."""
        cols = ", ".join(columns)
        return f"SELECT {cols} FROM {a} EXCEPT SELECT {cols} FROM {b} LIMIT 3"

    def live_entries_of(self, entries: str, steps: str, *, after: bool = False,
                        page: int | None = None) -> str:
        """The entries of the live manifests in tables `entries` and `steps`, ordered;
        `after`: past the row given (six parameters), `page`: that many rows at most."""
        return self.dialect.render(
            f"SELECT e.step, e.manifest_rev, e.role, e.path, e.digest, e.size FROM {entries} e"
            f" JOIN {steps} s ON s.step_id = e.step AND s.manifest_rev = e.manifest_rev"
            " AND s.live = 1"
            + (" WHERE (e.step, e.manifest_rev, e.role, e.path, e.digest, e.size)"
               " > (?, ?, ?, ?, ?, ?)" if after else "")
            + " ORDER BY 1, 2, 3, 4, 5, 6" + (f" LIMIT {int(page)}" if page is not None else ""))

    @staticmethod
    def condemned_checks(entries: str) -> str:
        """The condemned rows with their inline row's size and whether a manifest entry
        of table `entries` names them."""
        return ("SELECT c.digest, c.size, c.inline, c.condemned_ns, c.collection, b.size,"
                f" c.digest IN (SELECT digest FROM {entries})"
                " FROM condemned c LEFT JOIN blob_data b ON b.digest = c.digest"
                " ORDER BY c.digest")

    def projection_writes(self, changes: ProjectionChanges, checkpoint_name: str
                          ) -> Iterator[tuple[str, Sequence[tuple[Any, ...]]]]:
        """One transaction's inline projection changes (`Tx.write_projection`) as
        (statement, rows) to run with the driver's executemany, in this order: step rows;
        pins released (an ack: its artifact and post-image pins; an end: all), pins taken
        (deletes first: every pin still pending was taken after the last release of its
        attempt); manifests and their entries; the manifests, entries and pins of steps a
        seal archived; workspace rows and paths; blobs un-condemned (a pin or a manifest
        named them: in digest order, so two stores lock them alike); the checkpoint."""
        if changes.steps:
            yield self.UPSERT_STEP, changes.steps
        if changes.releases:
            acked = [(s, a, *changes.released_on_ack) for s, a, ack in changes.releases if ack]
            ended = [(s, a) for s, a, ack in changes.releases if not ack]
            if acked:
                yield self.RELEASE_ACKED, acked
            if ended:
                yield self.RELEASE_ENDED, ended
        if changes.pins:
            yield self.ADD_PINS, changes.pins
        if changes.manifests:
            yield self.ADD_MANIFESTS.format("manifests"), changes.manifests
            yield self.ADD_ENTRIES.format("manifest_entries"), changes.entries
        if changes.dropped_steps:
            dropped = [(s,) for s in changes.dropped_steps]
            yield self.DROP_ENTRIES, dropped
            yield self.DROP_MANIFESTS, dropped
            yield self.DROP_PINS, dropped
        if changes.workspaces:
            yield self.UPSERT_WS, changes.workspaces
        if changes.paths:
            yield self.UPSERT_PATH, changes.paths
        if changes.uncondemn:
            yield self.UNCONDEMN, [(d,) for d in sorted(changes.uncondemn)]
        if changes.checkpoint is not None:
            yield self.SET_CHECKPOINT, [(checkpoint_name, changes.checkpoint.last_seq,
                                         changes.checkpoint.version)]


def _if_current(table: str, key: str, columns: Sequence[str]) -> str:
    return ("SELECT (SELECT last_seq FROM projection_checkpoint WHERE name = ?),"
            " (SELECT version FROM projection_checkpoint WHERE name = ?),"
            " (SELECT seq FROM events ORDER BY seq DESC LIMIT 1), "
            + ", ".join(f"t.{c}" for c in columns)
            + f" FROM (SELECT 1) AS one LEFT JOIN {table} t ON t.{key} = ?")


def if_current(row: Sequence[Any], version: int, make: Any) -> tuple[bool, Any]:
    """(whether the tables are caught up at `version`, the row made by `make` or None)
    from an `*_IF_CURRENT` statement's row; (False, None) when they lag."""
    last, ver, head, *cells = row
    if ver != version or last is None or (last != FOLLOWS and last < (head or 0)):
        return False, None
    return True, None if cells[0] is None else make(tuple(cells))


@functools.lru_cache(maxsize=256)
def many_rows(sql: str, n: int, mark: str) -> str | None:
    """`sql` — an INSERT of one VALUES row, or a DELETE by one key (``WHERE k = <mark>``),
    `mark` the driver's placeholder — as one statement for `n` rows (the VALUES row
    repeated, an IN list); None for any other statement. Both databases run the rows of
    one statement in order, as a loop of single statements would, and a failing
    statement leaves no row of it behind."""
    if sql.startswith("INSERT"):
        start = sql.find(" VALUES (")
        end = sql.find(")", start)
        if start < 0 or end < 0:
            return None
        row = sql[start + len(" VALUES "):end + 1]
        return sql[:start] + " VALUES " + ", ".join([row] * n) + sql[end + 1:]
    tail = f" = {mark}"
    if sql.startswith("DELETE") and sql.endswith(tail) and sql.count(mark) == 1:
        return sql[:-len(tail)] + " IN (" + ", ".join([mark] * n) + ")"
    return None


def prefix_range(prefix: str) -> tuple[str, str]:
    """[low, high): exactly the texts that start with `prefix`, in byte order (both
    stores compare text as UTF-8 bytes, which sort as code points do)."""
    if not prefix:
        raise ValueError("an empty prefix names every key")
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


__all__ = ["EVENT_COLUMNS", "FOLD_COLUMNS", "POSTGRES", "ROW_COLUMNS", "SQLITE", "STEP_COLUMNS",
           "Dialect", "Statements", "if_current", "many_rows", "prefix_range"]

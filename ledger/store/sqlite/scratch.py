"""Whole-log folds in SQLite: the rebuild's sink (the ledger's own projection tables,
emptied inside its write transaction) and verify's scratch copy (connection-private
TEMP tables beside a read snapshot, compared with the tables in SQL and dropped after).

Both spill what a fold does not keep in memory — finished steps, manifests and their
entries — so memory follows the unfinished steps and the live pins, not the events;
SQLite spills the comparisons (EXCEPT both ways), not Python.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Final

import apsw

from ...projections.steps import StepRow
from .. import CondemnedCheck, EntryRow, RowsUnreadable
from . import tables as tb

#: The rebuild verify compares the tables with: TEMP tables (disk-backed: SQLite's temp
#: store), never in the ledger file.
_FRESH: Final = {"steps": "verify_steps", "manifests": "verify_manifests",
                 "manifest_entries": "verify_manifest_entries"}
#: The steps table with a lagging tail folded over it (`overlay_steps`).
_CURRENT: Final = "verify_current_steps"
_COLS: Final = tb.STEP_COLUMNS
#: The tables a rebuild empties (every projection, the condemned rows excepted: those
#: are GC's state, not derived from events).
_PROJECTION_TABLES: Final = ("steps", "pins", "manifests", "manifest_entries", "workspaces",
                             "ws_paths")
_INDEXES: Final = ("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
                   " AND tbl_name IN ('pins', 'manifest_entries') ORDER BY name")


class TableSink:
    """Step rows and manifests written into the tables named `steps`, `manifests` and
    `entries` (qualified names: ``main.steps``, ``temp.verify_steps``)."""

    def __init__(self, conn: apsw.Connection, steps: str, manifests: str, entries: str) -> None:
        self.conn = conn
        self._steps, self._manifests, self._entries = steps, manifests, entries
        self._upsert = tb.UPSERT_STEP.replace("INSERT INTO steps(", f"INSERT INTO {steps}(", 1)
        self._select = f"SELECT {_COLS} FROM {steps} WHERE step_id = ?"

    def put_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        self.conn.executemany(self._upsert, rows)

    def step(self, step_id: str) -> StepRow | None:
        row = self.conn.execute(self._select, (step_id,)).fetchone()
        return None if row is None else StepRow.from_tuple(row)

    def put_manifests(self, manifests: Sequence[tuple[object, ...]],
                      entries: Sequence[tuple[object, ...]]) -> None:
        self.conn.executemany(tb.ADD_MANIFESTS.format(self._manifests), manifests)
        self.conn.executemany(tb.ADD_ENTRIES.format(self._entries), entries)

    def step_count(self) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {self._steps}").fetchone()[0])


class RebuildSink(TableSink):
    """The ledger's projection tables, emptied: a rebuild writes each row once."""

    def __init__(self, conn: apsw.Connection) -> None:
        super().__init__(conn, "main.steps", "main.manifests", "main.manifest_entries")

    def put_pins(self, rows: Sequence[tuple[object, ...]]) -> None:
        self.conn.executemany(tb.ADD_PINS, rows)

    def put_workspaces(self, rows: Sequence[tuple[object, ...]],
                       paths: Sequence[tuple[object, ...]]) -> None:
        self.conn.executemany(tb.UPSERT_WS, rows)
        self.conn.executemany(tb.UPSERT_PATH, paths)


@contextlib.contextmanager
def rebuilding(conn: apsw.Connection) -> Iterator[RebuildSink]:
    """Empty the projection tables for a bulk load inside the caller's write transaction:
    the secondary indexes (random digests) are dropped and made again from their own SQL
    at the end (DDL is transactional: a crash leaves them as they were)."""
    indexes = conn.execute(_INDEXES).fetchall()
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    for table in _PROJECTION_TABLES:
        conn.execute(f"DELETE FROM {table}")
    yield RebuildSink(conn)
    for _, sql in indexes:
        conn.execute(sql)


class Scratch(TableSink):
    """A rebuild in TEMP tables beside the ledger's (see the module docstring)."""

    def __init__(self, conn: apsw.Connection) -> None:
        super().__init__(conn, f"temp.{_FRESH['steps']}", f"temp.{_FRESH['manifests']}",
                         f"temp.{_FRESH['manifest_entries']}")
        self.current = "main.steps"

    def create(self) -> None:
        self.drop()
        for table, temp in _FRESH.items():
            _create_temp_like(self.conn, table, temp)

    def drop(self) -> None:
        for temp in (*_FRESH.values(), _CURRENT):
            self.conn.execute(f"DROP TABLE IF EXISTS temp.{temp}")

    def overlay_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        _create_temp_like(self.conn, "steps", _CURRENT)
        self.conn.execute(f"INSERT INTO temp.{_CURRENT} SELECT * FROM main.steps")
        upsert = tb.UPSERT_STEP.replace("INSERT INTO steps(", f"INSERT INTO temp.{_CURRENT}(", 1)
        self.conn.executemany(upsert, sorted(rows, key=_first))
        self.current = f"temp.{_CURRENT}"

    def step_differences(self) -> list[tuple[str, StepRow | None, StepRow | None]]:
        fresh, current, conn = self._steps, self.current, self.conn
        differ = conn.execute(
            f"SELECT step_id FROM (SELECT {_COLS} FROM {fresh} EXCEPT SELECT {_COLS} FROM"
            f" {current}) UNION SELECT step_id FROM (SELECT {_COLS} FROM {current} EXCEPT"
            f" SELECT {_COLS} FROM {fresh}) ORDER BY step_id").fetchall()
        out = []
        for (step_id,) in differ:
            a, b = (conn.execute(f"SELECT {_COLS} FROM {t} WHERE step_id = ?",
                                 (step_id,)).fetchone() for t in (fresh, current))
            out.append((step_id, None if a is None else StepRow.from_tuple(a),
                        None if b is None else StepRow.from_tuple(b)))
        return out

    def ref_differences(self) -> list[tuple[str, list[object], list[object]]]:
        out = []
        conn = self.conn
        for name, table in (("manifests", "manifests"), ("manifest entries", "manifest_entries")):
            cols = ", ".join(c[1] for c in conn.execute(f"PRAGMA main.table_info({table})"))
            temp = f"temp.{_FRESH[table]}"
            extra, missing = (conn.execute(f"SELECT {cols} FROM {x} EXCEPT SELECT {cols} FROM {y}"
                                           " LIMIT 3").fetchall()
                              for x, y in ((f"main.{table}", temp), (temp, f"main.{table}")))
            out.append((name, extra, missing))
        return out

    def live_entries(self) -> Iterator[EntryRow]:
        # a cursor, not a list: every committed step's entries can be many
        return self.conn.execute(  # type: ignore[no-any-return]
            f"SELECT e.step, e.manifest_rev, e.role, e.path, e.digest, e.size"
            f" FROM {self._entries} e JOIN {self._steps} s"
            " ON s.step_id = e.step AND s.manifest_rev = e.manifest_rev AND s.live"
            " ORDER BY 1, 2, 3, 4, 5, 6")

    def condemned_checks(self) -> Iterator[CondemnedCheck]:
        for r in self.conn.execute(
                "SELECT c.digest, c.size, c.inline, c.condemned_ns, c.collection, b.size,"
                f" c.digest IN (SELECT digest FROM {self._entries})"
                " FROM condemned c LEFT JOIN blob_data b ON b.digest = c.digest"
                " ORDER BY c.digest"):
            yield CondemnedCheck(*r[:6], referenced=bool(r[6]))


@contextlib.contextmanager
def scratch(conn: apsw.Connection) -> Iterator[Scratch]:
    """The scratch copy for the block; what SQLite cannot read while making or comparing
    it (a damaged page, a malformed schema) is RowsUnreadable, which verify reports."""
    s = Scratch(conn)
    try:
        s.create()
        yield s
    except apsw.Error as exc:
        raise RowsUnreadable(f"{type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(apsw.Error):
            s.drop()


def _create_temp_like(conn: apsw.Connection, table: str, temp: str) -> None:
    """CREATE TEMP TABLE `temp` from the very DDL of the ledger's `table` (same columns,
    types, key); TypeError when that DDL is not the one steptrail wrote."""
    row = conn.execute("SELECT sql FROM main.sqlite_schema WHERE type = 'table' AND name = ?",
                       (table,)).fetchone()
    prefix = f"CREATE TABLE {table}("
    if row is None or not isinstance(row[0], str) or not row[0].startswith(prefix):
        raise TypeError(f"the {table} table's schema is not the one steptrail created")
    conn.execute(f"CREATE TEMP TABLE {temp}(" + row[0][len(prefix):])


def _first(row: tuple[object, ...]) -> object:
    return row[0]


__all__ = ["RebuildSink", "Scratch", "TableSink", "rebuilding", "scratch"]

"""Whole-log folds on PostgreSQL: the rebuild's sink (the ledger's own projection tables,
emptied inside its write transaction) and verify's scratch copy (TEMP tables of the
session, beside a REPEATABLE READ snapshot, compared with the tables in SQL and dropped
after). As on SQLite, memory follows the unfinished steps, not the events: the server
spills the comparisons (EXCEPT both ways).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Final

from ...errors import StorageFailure
from ...projections.steps import StepRow
from .. import CondemnedCheck, EntryRow, RowsUnreadable
from . import sql as q

_FRESH: Final = {"steps": "verify_steps", "manifests": "verify_manifests",
                 "manifest_entries": "verify_manifest_entries"}
_CURRENT: Final = "verify_current_steps"
_COLS: Final = q.STEP_COLUMNS
_PROJECTION_TABLES: Final = ("steps", "pins", "manifests", "manifest_entries", "workspaces",
                             "ws_paths")
_TABLE_COLUMNS: Final = {"manifests": q.MANIFEST_COLUMNS, "manifest_entries": q.ENTRY_COLUMNS}


class TableSink:
    """Step rows and manifests written into the tables named `steps`, `manifests` and
    `entries`."""

    def __init__(self, store: Any, steps: str, manifests: str, entries: str) -> None:
        self.store = store
        self._steps, self._manifests, self._entries = steps, manifests, entries
        self._upsert = q.UPSERT_STEP.replace("INSERT INTO steps(", f"INSERT INTO {steps}(", 1)
        self._select = f"SELECT {_COLS} FROM {steps} WHERE step_id = %s"

    def _run(self, sql: str, params: Any = None) -> Any:
        return self.store._run(sql, params)

    def put_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.store._run_many(self._upsert, rows)

    def step(self, step_id: str) -> StepRow | None:
        row = self._run(self._select, (step_id,)).fetchone()
        return None if row is None else StepRow.from_tuple(row)

    def put_manifests(self, manifests: Sequence[tuple[object, ...]],
                      entries: Sequence[tuple[object, ...]]) -> None:
        if manifests:
            self.store._run_many(q.ADD_MANIFESTS.format(self._manifests), manifests)
        if entries:
            self.store._run_many(q.ADD_ENTRIES.format(self._entries), entries)

    def step_count(self) -> int:
        return int(self._run(f"SELECT count(*) FROM {self._steps}").fetchone()[0])


class RebuildSink(TableSink):
    def __init__(self, store: Any) -> None:
        super().__init__(store, "steps", "manifests", "manifest_entries")

    def put_pins(self, rows: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.store._run_many(q.ADD_PINS, rows)

    def put_workspaces(self, rows: Sequence[tuple[object, ...]],
                       paths: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.store._run_many(q.UPSERT_WS, rows)
        if paths:
            self.store._run_many(q.UPSERT_PATH, paths)


@contextlib.contextmanager
def rebuilding(store: Any) -> Iterator[RebuildSink]:
    """Empty the projection tables inside the caller's write transaction (readers see the
    old rows until it commits)."""
    for table in _PROJECTION_TABLES:
        store._run(f"DELETE FROM {table}")
    yield RebuildSink(store)


class Scratch(TableSink):
    def __init__(self, store: Any) -> None:
        super().__init__(store, _FRESH["steps"], _FRESH["manifests"], _FRESH["manifest_entries"])
        self.current = "steps"

    def create(self) -> None:
        self.drop()
        for table, temp in _FRESH.items():
            self._run(f"CREATE TEMP TABLE {temp} (LIKE {table} INCLUDING ALL)")

    def drop(self) -> None:
        for temp in (*_FRESH.values(), _CURRENT):
            self._run(f"DROP TABLE IF EXISTS pg_temp.{temp}")

    def overlay_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        self._run(f"DROP TABLE IF EXISTS pg_temp.{_CURRENT}")
        self._run(f"CREATE TEMP TABLE {_CURRENT} (LIKE steps INCLUDING ALL)")
        self._run(f"INSERT INTO {_CURRENT} SELECT {_COLS} FROM steps")
        upsert = q.UPSERT_STEP.replace("INSERT INTO steps(", f"INSERT INTO {_CURRENT}(", 1)
        if rows:
            self.store._run_many(upsert, sorted(rows, key=lambda r: r[0]))
        self.current = _CURRENT

    def step_differences(self) -> list[tuple[str, StepRow | None, StepRow | None]]:
        fresh, current = self._steps, self.current
        differ = self._run(
            f"SELECT step_id FROM (SELECT {_COLS} FROM {fresh} EXCEPT SELECT {_COLS} FROM"
            f" {current}) a UNION SELECT step_id FROM (SELECT {_COLS} FROM {current} EXCEPT"
            f" SELECT {_COLS} FROM {fresh}) b ORDER BY step_id").fetchall()
        out = []
        for (step_id,) in differ:
            a, b = (self._run(f"SELECT {_COLS} FROM {t} WHERE step_id = %s",
                              (step_id,)).fetchone() for t in (fresh, current))
            out.append((step_id, None if a is None else StepRow.from_tuple(a),
                        None if b is None else StepRow.from_tuple(b)))
        return out

    def ref_differences(self) -> list[tuple[str, list[object], list[object]]]:
        out = []
        for name, table in (("manifests", "manifests"), ("manifest entries", "manifest_entries")):
            cols = _TABLE_COLUMNS[table]
            temp = _FRESH[table]
            extra, missing = (self._run(f"SELECT {cols} FROM {x} EXCEPT SELECT {cols} FROM {y}"
                                        " LIMIT 3").fetchall()
                              for x, y in ((table, temp), (temp, table)))
            out.append((name, extra, missing))
        return out

    def live_entries(self) -> Iterator[EntryRow]:
        last: tuple[Any, ...] | None = None
        sql = (f"SELECT e.step, e.manifest_rev, e.role, e.path, e.digest, e.size"
               f" FROM {self._entries} e JOIN {self._steps} s"
               " ON s.step_id = e.step AND s.manifest_rev = e.manifest_rev AND s.live = 1"
               " {} ORDER BY 1, 2, 3, 4, 5, 6 LIMIT 2000")
        while True:
            if last is None:
                rows = self._run(sql.format("")).fetchall()
            else:
                rows = self._run(sql.format("WHERE (e.step, e.manifest_rev, e.role, e.path,"
                                            " e.digest, e.size) > (%s, %s, %s, %s, %s, %s)"),
                                 last).fetchall()
            yield from rows
            if len(rows) < 2000:
                return
            last = rows[-1]

    def condemned_checks(self) -> Iterator[CondemnedCheck]:
        rows = self._run(
            "SELECT c.digest, c.size, c.inline, c.condemned_ns, c.collection, b.size,"
            f" c.digest IN (SELECT digest FROM {self._entries})"
            " FROM condemned c LEFT JOIN blob_data b ON b.digest = c.digest"
            " ORDER BY c.digest").fetchall()
        for r in rows:
            yield CondemnedCheck(*r[:6], referenced=bool(r[6]))


@contextlib.contextmanager
def scratch(store: Any) -> Iterator[Scratch]:
    s = Scratch(store)
    try:
        s.create()
        yield s
    except StorageFailure as exc:
        raise RowsUnreadable(str(exc)) from None
    finally:
        with contextlib.suppress(Exception):
            s.drop()

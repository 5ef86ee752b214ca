"""Whole-log folds into tables, written once for both stores: the rebuild's sink (the
ledger's own projection tables, emptied inside its write transaction) and verify's
scratch copy (temporary tables of the connection beside a read snapshot, compared with
the ledger's tables in SQL and dropped after).

Both spill what a fold does not keep in memory — finished steps, manifests and their
entries — so memory follows the unfinished steps and the live pins, not the events; the
database spills the comparisons (EXCEPT both ways), not Python.

What differs between the stores is their `Space` (`sqlite/scratch.py`,
`postgres/scratch.py`): how a statement runs, how a ledger table and a scratch table are
named, how a scratch table is made like a ledger table, whether a long read is paged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Protocol

from .rows import StepRow
from . import CondemnedCheck, EntryRow, make_entry_row
from .sql import ENTRY_COLUMNS, MANIFEST_COLUMNS, Statements

#: The rebuild verify compares the tables with: scratch tables, never the ledger's.
FRESH: Final = {"steps": "verify_steps", "manifests": "verify_manifests",
                "manifest_entries": "verify_manifest_entries"}
#: The steps table with a lagging tail folded over it (`Scratch.overlay_steps`).
CURRENT: Final = "verify_current_steps"
#: The tables a rebuild empties (every projection, the condemned rows excepted: those
#: are GC's state, not derived from events).
PROJECTION_TABLES: Final = ("steps", "pins", "manifests", "manifest_entries", "workspaces",
                            "ws_paths")
_COMPARED: Final = (("manifests", "manifests", MANIFEST_COLUMNS),
                    ("manifest entries", "manifest_entries", ENTRY_COLUMNS))


class Space(Protocol):
    """What a store supplies: its statements and how it runs them, names its tables,
    makes its scratch tables."""

    #: The store's statements (`Statements` in its dialect).
    q: Statements
    #: Live entries are read this many at a time (None: in one statement, streamed).
    page: int | None

    def run(self, sql: str, params: Sequence[object] | None = None) -> Any:
        """Execute one statement; its cursor (fetchone, fetchall)."""
        ...

    def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...

    def rows(self, sql: str) -> Iterable[tuple[Any, ...]]:
        """The rows of a statement (streamed where the driver streams)."""
        ...

    def table(self, name: str) -> str:
        """A ledger table as the statements name it."""
        ...

    def temp(self, name: str) -> str:
        """A scratch table as the statements name it."""
        ...

    def create_temp_like(self, table: str, temp: str) -> None:
        """Create scratch table `temp` with the columns, types and key of `table`."""
        ...


class TableSink:
    """Step rows and manifests written into the tables named `steps`, `manifests` and
    `entries` (as the statements name them)."""

    def __init__(self, space: Space, steps: str, manifests: str, entries: str) -> None:
        self.space = space
        self._steps, self._manifests, self._entries = steps, manifests, entries
        self._upsert = space.q.upsert_step_into(steps)
        self._select = space.q.select_step_in(steps)

    def put_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.space.run_many(self._upsert, rows)

    def step(self, step_id: str) -> StepRow | None:
        row = self.space.run(self._select, (step_id,)).fetchone()
        return None if row is None else StepRow.from_tuple(row)

    def put_manifests(self, manifests: Sequence[tuple[object, ...]],
                      entries: Sequence[tuple[object, ...]]) -> None:
        q = self.space.q
        if manifests:
            self.space.run_many(q.ADD_MANIFESTS.format(self._manifests), manifests)
        if entries:
            self.space.run_many(q.ADD_ENTRIES.format(self._entries), entries)

    def step_count(self) -> int:
        return int(self.space.run(self.space.q.count_rows(self._steps)).fetchone()[0])


class RebuildSink(TableSink):
    """The ledger's projection tables, emptied: a rebuild writes each row once."""

    def __init__(self, space: Space) -> None:
        super().__init__(space, space.table("steps"), space.table("manifests"),
                         space.table("manifest_entries"))

    def put_pins(self, rows: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.space.run_many(self.space.q.ADD_PINS, rows)

    def put_workspaces(self, rows: Sequence[tuple[object, ...]],
                       paths: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self.space.run_many(self.space.q.UPSERT_WS, rows)
        if paths:
            self.space.run_many(self.space.q.UPSERT_PATH, paths)


def empty_projections(space: Space) -> RebuildSink:
    """Empty the projection tables (inside the caller's write transaction: readers see
    the old rows until it commits); the sink a rebuild fills them through."""
    for table in PROJECTION_TABLES:
        space.run(space.q.empty(table))
    return RebuildSink(space)


class Scratch(TableSink):
    """A rebuild in scratch tables beside the ledger's (see the module docstring)."""

    def __init__(self, space: Space) -> None:
        super().__init__(space, space.temp(FRESH["steps"]), space.temp(FRESH["manifests"]),
                         space.temp(FRESH["manifest_entries"]))
        self.current = space.table("steps")

    def create(self) -> None:
        self.drop()
        for table, temp in FRESH.items():
            self.space.create_temp_like(table, temp)

    def drop(self) -> None:
        for temp in (*FRESH.values(), CURRENT):
            self.space.run(self.space.q.drop_temp(temp))

    def overlay_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        space = self.space
        space.run(space.q.drop_temp(CURRENT))
        space.create_temp_like("steps", CURRENT)
        current = space.temp(CURRENT)
        space.run(space.q.copy_steps(space.table("steps"), current))
        if rows:
            space.run_many(space.q.upsert_step_into(current), sorted(rows, key=_first))
        self.current = current

    def step_differences(self) -> list[tuple[str, StepRow | None, StepRow | None]]:
        space, fresh, current = self.space, self._steps, self.current
        differ = space.run(space.q.step_differences(fresh, current)).fetchall()
        out = []
        for (step_id,) in differ:
            a, b = (space.run(space.q.select_step_in(t), (step_id,)).fetchone()
                    for t in (fresh, current))
            out.append((step_id, None if a is None else StepRow.from_tuple(a),
                        None if b is None else StepRow.from_tuple(b)))
        return out

    def ref_differences(self) -> list[tuple[str, list[object], list[object]]]:
        space = self.space
        out = []
        for name, table, cols in _COMPARED:
            ours, fresh = space.table(table), space.temp(FRESH[table])
            extra, missing = (space.run(space.q.rows_not_in(cols, x, y)).fetchall()
                              for x, y in ((ours, fresh), (fresh, ours)))
            out.append((name, extra, missing))
        return out

    def live_entries(self) -> Iterator[EntryRow]:
        space, page = self.space, self.space.page
        if page is None:  # one statement, streamed: every committed step's entries
            yield from map(make_entry_row, space.rows(space.q.live_entries_of(self._entries, self._steps)))
            return
        first = space.q.live_entries_of(self._entries, self._steps, page=page)
        rest = space.q.live_entries_of(self._entries, self._steps, after=True, page=page)
        last: tuple[Any, ...] | None = None
        while True:
            rows = (space.run(first) if last is None else space.run(rest, last)).fetchall()
            yield from map(make_entry_row, rows)
            if len(rows) < page:
                return
            last = rows[-1]

    def condemned_checks(self) -> Iterator[CondemnedCheck]:
        for r in self.space.rows(self.space.q.condemned_checks(self._entries)):
            yield CondemnedCheck(*r[:6], referenced=bool(r[6]))


def _first(row: tuple[object, ...]) -> object:
    return row[0]


__all__ = ["CURRENT", "FRESH", "PROJECTION_TABLES", "RebuildSink", "Scratch", "Space",
           "TableSink", "empty_projections"]

"""The reads and writes every SQL store runs, written once over a small `Driver`.

A SQL store (SQLite, PostgreSQL, a third one) gives a `Driver` — six methods: `one`,
`all`, `run`, `many`, the rows of a set of values (`in_values`), and how its errors
read (`raw_errors`, `read_error`) — and `SqlView` and `SqlTx` run the shared statements
(`ledger.store.sql.Statements`, rendered in the store's dialect) through it: every read
of `ledger.store.ReadView` and every write of `Tx` but the few that differ in more than
form. Those stay with the store, as overrides: verify's checked read of damaged rows
(SQLite's typeless cells), the engine's own integrity check, a streamed table read, the
scratch tables of a rebuild, the insert of event rows and what a driver error does to a
transaction (`_insert_many`, `_insert_one`, `_intact`), and the transaction's bounds.

Savepoints are plain SQL (`Statements.SAVEPOINT`, ``ROLLBACK_TO``, ``RELEASE``: both
dialects read the same text). No SQL is written here: it is all `Statements`'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from ..errors import CorruptLedger, LedgerError
from . import (
    COPY_TABLES,
    ROW_ERRORS,
    BlobStat,
    Checkpoint,
    EntryRow,
    EventQuery,
    EventRow,
    FoldRow,
    Head,
    PinHold,
    ProjectionChanges,
    make_entry_row,
    make_event_row,
    make_fold_row,
    make_pin_hold,
)
from .base import TxBase, paged
from .rows import IN_FLIGHT, PathState, StepRow, WsRow
from .sql import Statements, if_current, many_rows, prefix_range

#: The projection checkpoint's row (the inline projections are checkpointed together).
CHECKPOINT_NAME: Final = "steps"
#: How many rows one read of a paged statement fetches.
READ_BATCH: Final = 2_000


class Driver:
    """What a SQL store gives `SqlView` and `SqlTx`: statements run on its connection.

    `one` and `all` run a read; `run` a write and answer how many rows it changed;
    `many` one statement for each of many rows (as few statements as `many_rows` makes of
    it, at most `params_max` parameters each); `in_values` the statements that read a
    set of values (a template with the dialect's `in_set`). What the driver raises:
    a store whose reads raise the driver's own errors names them in `raw_errors`, and
    `read_error` makes each a typed error (a store that translates in `one`/`all`
    leaves `raw_errors` empty)."""

    #: The ledger's location, as errors name it.
    where: str
    #: The driver's placeholder (``?``, ``%s``).
    mark: str
    #: The most parameters one statement carries.
    params_max: int
    #: What `one`/`all` may raise untranslated (see the class).
    raw_errors: tuple[type[BaseException], ...] = ()

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        raise NotImplementedError

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        raise NotImplementedError

    def execute_each(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """`sql` once per row (the driver's loop or executemany)."""
        raise NotImplementedError

    def read_error(self, exc: BaseException) -> LedgerError:
        raise exc

    def later(self, sql: str, params: Sequence[object] = ()) -> None:
        """A write inside a write transaction whose answer nobody reads: a store may hold
        it and send it with the next statement that needs an answer, or with the COMMIT
        (one round trip for many). Its error then comes from that statement, and the
        transaction does not commit. The default runs it now."""
        self.run(sql, params)

    def many_later(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """`many`, held as `later` holds one statement."""
        self.many(sql, rows)

    def many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """Run `sql` for each of `rows`: in as few statements as `many_rows` allows,
        else one statement a row (`execute_each`)."""
        if not rows:
            return
        if len(rows) == 1:
            self.run(sql, rows[0])
            return
        step = max(1, self.params_max // max(1, len(rows[0])))
        if many_rows(sql, min(len(rows), step), self.mark) is None:
            self.execute_each(sql, rows)
            return
        for i in range(0, len(rows), step):
            chunk = rows[i:i + step]
            self.run(many_rows(sql, len(chunk), self.mark),  # type: ignore[arg-type]
                     [cell for row in chunk for cell in row])

    def in_values(self, template: str, values: Sequence[object],
                  before: Sequence[object] = ()) -> Iterator[tuple[str, list[object]]]:
        """The statements (and their parameters) that read `values` through a template
        with one ``{}`` where the dialect's `in_set` puts its marks: one mark a value,
        in chunks of at most `params_max`. (PostgreSQL's form: one array.)"""
        values = list(values)
        for i in range(0, len(values), self.params_max):
            chunk = values[i:i + self.params_max]
            yield template.format(", ".join([self.mark] * len(chunk))), [*before, *chunk]


class SqlView:
    """The reads of `ledger.store.ReadView` over a `Driver` (see the module docstring).
    A store's view sets `S` (its `Statements`), `JOURNAL_RANGE` (a template: the newest
    event of a key range, with ``{}`` for a kind clause) and answers `_totals_by_time`,
    `_file_size` and `_typed`; it reads inside the store's `read()` or transaction."""

    S: Statements
    JOURNAL_RANGE: str
    _q: Driver
    _store: Any

    # -- what differs in more than form (the store's) -------------------------------------

    def _totals_by_time(self, bucket_ns: int) -> tuple[str, Sequence[object]]:
        raise NotImplementedError

    def _file_size(self, digest: str) -> int | None:
        """The size of a blob held outside the inline rows (None: none)."""
        return self._store.files.size(digest)  # type: ignore[no-any-return]

    def _typed(self, table: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """`row` of `table` if its cells hold their declared types (a typeless store
        checks; a typed one's columns already say so)."""
        return row

    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]:
        raise NotImplementedError

    def integrity_problems(self) -> list[str]:
        raise NotImplementedError

    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        raise NotImplementedError

    def scratch(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    # -- events --------------------------------------------------------------------------

    def head(self) -> Head:
        q = self._q
        try:
            row = q.one(self.S.HEAD)
        except q.raw_errors as exc:
            raise q.read_error(exc) from None
        if row is None:
            return Head(0, self._store.genesis)
        if not isinstance(row[1], bytes):
            raise CorruptLedger(q.where, f"event #{row[0]}'s hash is not bytes")
        return Head(row[0], row[1])

    def count(self) -> int:
        return int(self._q.one(self.S.COUNT)[0])  # type: ignore[index]

    def events(self, query: EventQuery = EventQuery()) -> Iterator[EventRow]:
        """Event rows matching `query`, in bounded batches (each its own statement)."""
        sql, params = self.S.query(query)
        start = 2**63 - 1 if query.descending else query.after_seq
        return self._paged(sql, params, start, query.limit, make_event_row)  # type: ignore[return-value]

    def fold_rows(self, after_seq: int = 0) -> Iterator[FoldRow]:
        from .sql import FOLD_COLUMNS
        sql, params = self.S.query(EventQuery(after_seq=after_seq), FOLD_COLUMNS)
        return self._paged(sql, params, after_seq, None, make_fold_row)  # type: ignore[return-value]

    def _paged(self, sql: str, params: list[Any], start: int, limit: int | None,
               make: Callable[[Any], tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        """Rows of `sql` in batches of READ_BATCH (`store.base.paged`), paging on seq,
        each made by `make`; a failed read is a typed error."""
        q = self._q

        def fetch(last: int, batch: int) -> list[tuple[Any, ...]]:
            try:
                return list(map(make, q.all(sql, (last, *params, batch))))
            except (*q.raw_errors, *ROW_ERRORS) as exc:  # (a row it cannot make: damaged)
                raise q.read_error(exc) from None

        return paged(fetch, start, limit, READ_BATCH)  # type: ignore[no-any-return]

    def journal_lookup(self, key: str) -> EventRow | None:
        row = self._q.one(self.S.JOURNAL, (key,))
        return None if row is None else make_event_row(row)

    def journal_newest(self, prefix: str, kind: str | None = None) -> EventRow | None:
        """The newest event whose journal key starts with `prefix` (and, given `kind`, of
        that kind): a seek on the key's index, however long the log."""
        low, high = prefix_range(prefix)
        if kind is None:
            row = self._q.one(self.JOURNAL_RANGE.format(""), (low, high))
        else:
            row = self._q.one(self.JOURNAL_RANGE.format(
                self.S.dialect.render(" AND kind = ?")), (low, high, kind))
        return None if row is None else make_event_row(row)

    # -- projections, meta ---------------------------------------------------------------

    def checkpoint(self) -> Checkpoint | None:
        row = self._q.one(self.S.SELECT_CHECKPOINT, (CHECKPOINT_NAME,))
        return None if row is None else Checkpoint(row[0], row[1])

    def step(self, step_id: str) -> StepRow | None:
        row = self._q.one(self.S.SELECT_STEP, (step_id,))
        return None if row is None else StepRow.from_tuple(row)

    def step_if_current(self, step_id: str, version: int) -> tuple[bool, StepRow | None]:
        return self._if_current(self.S.STEP_IF_CURRENT, step_id, version, StepRow.from_tuple)

    def workspace_if_current(self, name: str, version: int) -> tuple[bool, WsRow | None]:
        return self._if_current(self.S.WS_IF_CURRENT, name, version, WsRow.from_tuple)

    def _if_current(self, sql: str, key: str, version: int, make: Any) -> tuple[bool, Any]:
        q = self._q
        try:
            row = q.one(sql, (CHECKPOINT_NAME, CHECKPOINT_NAME, key))
            return if_current(row, version, make)  # type: ignore[arg-type]
        except q.raw_errors as exc:
            raise q.read_error(exc) from None
        except (TypeError, ValueError) as exc:  # a damaged row's cells
            raise CorruptLedger(q.where, str(exc)) from None

    def steps_by_id(self, step_ids: Sequence[str]) -> list[StepRow]:
        return [StepRow.from_tuple(r) for sql, params
                in self._q.in_values(self.S.SELECT_STEPS_IN, step_ids)
                for r in self._q.all(sql, params)]

    def steps(self, *, state: str | None = None, step_id: str | None = None,
              contains: str | None = None, limit: int | None = None) -> list[StepRow]:
        """The step rows (of one state, or one step, or whose id holds `contains`; at
        most `limit`), oldest first."""
        sql, params = self.S.select_steps(state, step_id, contains, limit)
        return [StepRow.from_tuple(r) for r in self._q.all(sql, params)]

    def steps_in_flight(self, workspace: str, before_epoch: int | None = None, *,
                        limit: int | None = None, oldest_first: bool = False
                        ) -> list[tuple[str, int]]:
        sql = self.S.in_flight(before_epoch is not None, oldest_first, limit is not None)
        params: list[object] = [workspace]
        if before_epoch is not None:
            params.append(before_epoch)
        params.extend(sorted(IN_FLIGHT))
        if limit is not None:
            params.append(limit)
        return [(r[0], int(r[1])) for r in self._q.all(sql, params)]

    def workspace(self, name: str) -> WsRow | None:
        row = self._q.one(self.S.SELECT_ONE_WS, (name,))
        return None if row is None else WsRow.from_tuple(row)

    def workspace_rows(self) -> list[WsRow]:
        return [WsRow.from_tuple(r) for r in self._q.all(self.S.SELECT_WS)]

    def path_state(self, workspace: str, path: str) -> PathState | None:
        row = self._q.one(self.S.SELECT_PATH, (workspace, path))
        return None if row is None else (int(row[0]), row[1], int(row[2]))

    def path_rows(self) -> list[tuple[object, ...]]:
        """(workspace, path, rev, hash, seq) of every path a step wrote."""
        return [self._typed("ws_paths", r) for r in self._q.all(self.S.SELECT_PATHS)]

    def pin_rows(self) -> list[tuple[object, ...]]:
        return [self._typed("pins", r) for r in self._q.all(self.S.SELECT_PINS)]

    def manifest_rows(self) -> list[tuple[object, ...]]:
        return [self._typed("manifests", r) for r in self._q.all(self.S.SELECT_MANIFESTS)]

    def entry_rows(self) -> list[EntryRow]:
        return [make_entry_row(self._typed("manifest_entries", r))
                for r in self._q.all(self.S.SELECT_ENTRIES)]

    def meta(self, key: str) -> str | None:
        """A meta value; None if the key is absent (CorruptLedger if it cannot be read)."""
        q = self._q
        try:
            row = q.one(self.S.SELECT_META, (key,))
        except q.raw_errors as exc:
            raise q.read_error(exc) from None
        if row is None:
            return None
        if not isinstance(row[0], str):
            raise CorruptLedger(q.where, f"meta key {key!r} holds a {type(row[0]).__name__},"
                                " not text")
        return row[0]

    def meta_all(self) -> dict[str, object]:
        return dict(self._q.all(self.S.META_ALL))  # type: ignore[arg-type]

    # -- blobs (docs/storage.md: the inline row, else the store's larger blobs) ----------

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        """(size, inline) of a stored blob — the inline row, else the larger blob —,
        looked up now: never cached across calls."""
        row = self._q.one(self.S.INLINE_SIZE, (digest,))
        if row is not None:
            return int(row[0]), True
        size = self._file_size(digest)
        return None if size is None else (size, False)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes and
        hashes to its name (an inline row is always re-hashed; a larger one when
        `hash_file`)."""
        from .inline import check_blob
        check_blob(self, self._store.files, digest, size, hash_file=hash_file)  # type: ignore[arg-type]

    def inline_blob(self, digest: str) -> tuple[int, bytes] | None:
        """(recorded size, bytes) of an inline blob row; None when there is none."""
        row = self._q.one(self.S.INLINE_BLOB, (digest,))
        return None if row is None else (row[0], row[1])

    def inline_stat(self, digest: str) -> BlobStat | None:
        """An inline blob row's size and stored time (no bytes read); None: none."""
        row = self._q.one(self.S.INLINE_STAT, (digest,))
        return None if row is None else BlobStat(digest, int(row[0]), True, int(row[1]))

    def inline_blobs(self) -> Iterator[BlobStat]:
        return iter([BlobStat(d, n, True, t) for d, n, t in self._q.all(self.S.INLINE_ALL)])

    # -- what GC and audit read -----------------------------------------------------------

    def pin_holds(self, digest: str | None = None) -> list[PinHold]:
        if digest is None:
            return list(map(make_pin_hold, self._q.all(self.S.PIN_HOLDS)))
        return list(map(make_pin_hold, self._q.all(self.S.PIN_HOLDS_OF, (digest,))))

    def manifest_digests(self) -> set[str]:
        return {r[0] for r in self._q.all(self.S.MANIFEST_DIGESTS)}

    def names_digest(self, digest: str) -> bool:
        return self._q.one(self.S.NAMES_DIGEST, (digest,)) is not None

    def entries_naming(self, digest: str, limit: int) -> list[tuple[str, int, str]]:
        return self._q.all(self.S.ENTRIES_NAMING, (digest, limit))  # type: ignore[return-value]

    def live_entries(self) -> list[tuple[str, int]]:
        return self._q.all(self.S.LIVE_ENTRIES)  # type: ignore[return-value]

    def event_totals(self, bucket_ns: int) -> tuple[list[tuple[str, str, int, int, int, int]],
                                                     list[tuple[int, int, int]]]:
        by_run = [(str(r), str(k), int(n), int(b), int(t0), int(t1))
                  for r, k, n, b, t0, t1 in self._q.all(self.S.TOTALS_BY_RUN)]
        sql, params = self._totals_by_time(bucket_ns)
        by_time = [(int(t), int(n), int(b)) for t, n, b in self._q.all(sql, params)]
        return by_run, by_time

    def live_step_count(self) -> int:
        return int(self._q.one(self.S.LIVE_STEPS)[0])  # type: ignore[index]

    def step_totals(self, states: frozenset[str]) -> tuple[int, int]:
        n = b = 0
        for sql, params in self._q.in_values(self.S.STEP_TOTALS, sorted(states)):
            got_n, got_b = self._q.one(sql, params)  # type: ignore[misc]
            n, b = n + int(got_n), b + int(got_b)
        return n, b

    def condemned(self) -> dict[str, tuple[int, bool]]:
        return {d: (int(n), bool(i)) for d, n, i in self._q.all(self.S.SELECT_CONDEMNED)}

    def condemned_entry(self, digest: str) -> tuple[int, bool] | None:
        row = self._q.one(self.S.SELECT_ONE_CONDEMNED, (digest,))
        return None if row is None else (int(row[0]), bool(row[1]))

    def condemned_count(self) -> int:
        return int(self._q.one(self.S.COUNT_CONDEMNED)[0])  # type: ignore[index]

    # -- what verify reads ----------------------------------------------------------------

    def checkpoint_rows(self) -> list[tuple[object, object, object]]:
        return self._q.all(self.S.CHECKPOINT_ROWS)  # type: ignore[return-value]

    def inline_row_problems(self, limit: int) -> list[tuple[object, object, object]]:
        return self._q.all(self.S.INLINE_ROW_PROBLEMS, (limit,))  # type: ignore[return-value]


class SqlTx(SqlView, TxBase):
    """The writes of `ledger.store.Tx` over a `Driver` (see the module docstring). A
    store's transaction adds its bounds (`__enter__`, `__exit__`, `time_ns`), the event
    inserts (`_insert_many`, `_insert_one`), `_intact`, and `_before_write` (what must
    be held before a shared row is written: PostgreSQL's chain lock)."""

    #: The inline blob upsert (a store may rewrite the data only when it differs).
    @property
    def _inline_upsert(self) -> str:
        return self.S.INLINE_UPSERT

    def _before_write(self) -> None:
        """Called before each write of a shared row."""

    # -- TxBase's savepoints ------------------------------------------------------------------

    def _savepoint(self) -> None:
        self._q.later(self.S.SAVEPOINT.format("append_batch"))

    def _rollback_savepoint(self) -> None:
        self._q.run(self.S.ROLLBACK_TO.format("append_batch"))

    def _release_savepoint(self) -> None:
        self._q.later(self.S.RELEASE.format("append_batch"))

    def _open_part(self) -> None:
        self._q.later(self.S.SAVEPOINT.format("group_part"))

    def _undo_part(self) -> None:
        self._q.run(self.S.ROLLBACK_TO.format("group_part"))
        self._q.run(self.S.RELEASE.format("group_part"))

    def _close_part(self) -> None:
        self._q.later(self.S.RELEASE.format("group_part"))

    # -- other writes ----------------------------------------------------------------------

    def put_inline(self, blobs: Mapping[str, bytes], stored_ns: int) -> None:
        """Write inline blob rows: a damaged row is rewritten, an intact one freshened
        (its `stored_ns`: GC's grace window counts from it)."""
        self._before_write()
        for digest, data in blobs.items():
            self._q.later(self._inline_upsert, (digest, len(data), data, stored_ns))
            self._wrote_inline(digest, data)

    def delete_inline(self, digest: str) -> None:
        self._before_write()
        self._unwrote(digest)
        self._q.run(self.S.INLINE_DELETE, (digest,))

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        size = self._wrote_size(digest)
        return (size, True) if size is not None else SqlView.blob_size(self, digest)

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        if self._wrote_size(digest) != size:
            SqlView.check_blob(self, digest, size, hash_file=hash_file)

    def set_meta(self, key: str, value: str) -> None:
        self._before_write()
        self._q.later(self.S.UPSERT_META, (key, value))

    def write_projection(self, changes: ProjectionChanges) -> None:
        """One transaction's inline projection changes (`Statements.projection_writes`)."""
        self._before_write()
        for sql, rows in self.S.projection_writes(changes, CHECKPOINT_NAME):
            self._q.many_later(sql, rows)

    def condemn(self, rows: Sequence[tuple[str, int, bool]], condemned_ns: int,
                collection: str) -> None:
        self._before_write()
        self._q.execute_each(self.S.CONDEMN, [(d, n, int(i), condemned_ns, collection)
                                              for d, n, i in rows])

    def uncondemn(self, digests: Iterable[str]) -> None:
        self._before_write()
        self._q.execute_each(self.S.UNCONDEMN, [(d,) for d in digests])

    def load_rows(self, table: str, rows: Sequence[tuple[object, ...]]) -> None:
        self._before_write()
        if rows:
            self._q.execute_each(self.S.dialect.render(
                self.S.dialect.insert(table, COPY_TABLES[table])), rows)

    def seal_rows(self, run: str, ranges: Sequence[tuple[int, int]], seal_seq: int) -> int:
        self._before_write()
        self._q.execute_each(self.S.ADD_SEALED_RANGE, [(a, b, run, seal_seq) for a, b in ranges])
        return sum(self._q.run(self.S.DELETE_SEALED, (a, b, run)) for a, b in ranges)


__all__ = ["CHECKPOINT_NAME", "READ_BATCH", "Driver", "SqlTx", "SqlView"]

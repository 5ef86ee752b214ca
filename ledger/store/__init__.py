"""The storage interface: what the ledger needs from a store, and nothing else.

docs/storage.md is the design. In short: a `Store` hands out read views (`read()`: one
consistent snapshot) and write transactions (`transaction()`: everything inside commits
or nothing does). The append loop — journal answers, the fast and slow paths, the guard
and projector calls — is written once, in `store.base.TxBase`; a backend provides a few
primitives under it. Rows cross the boundary as named tuples (`EventRow`, `FoldRow`,
`PinHold`, `EntryRow`: tuples in `ROW_NAMES` order, read by field name; no struct per
row on the hot paths). The interface is split by role (`EventReader`, `ProjectionReader`,
`BlobIndex`, `Forensics`; `EventWriter`, `ProjectionWriter`, `BlobWriter`, `Maintenance`):
`ReadView` and `Tx` are their unions, and a caller names the narrowest it uses. This
module holds types and Protocols only: no driver, no SQL. The SQLite store lives in
`ledger.store.sqlite`.

Designed with a second backend in view (PostgreSQL: per-connection transactions, no file
header and no ``-wal``, bytes in the database, many writers at once): a transaction names
its `Scope` (the workspace it is confined to, or the whole ledger), takes its time from
the store (`Tx.time_ns`), and the head it appends after is the head of that scope.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, Protocol

import msgspec

from ..errors import InvalidInput
from ..events import Envelope, Event, RecordedEvent

if TYPE_CHECKING:
    from ..blobs import BlobStore

#: How long a writer waits for the write lock before LedgerBusy (exit 3), every store.
BUSY_TIMEOUT_MS: Final = 30_000
#: A SQLite ledger's durability (``PRAGMA synchronous``); a database's is the server's.
Synchronous = Literal["FULL", "EXTRA", "NORMAL", "OFF"]


class EventRow(NamedTuple):
    """An event row, in `ROW_NAMES` order (a tuple: it unpacks and compares as one)."""

    seq: int
    time_ns: int
    workspace: str
    run: str
    step: str
    attempt: int
    epoch: int
    rev: int
    journal_key: str
    kind: str
    v: int
    payload: bytes
    prev_hash: bytes
    hash: bytes


ROW_NAMES: Final = ("seq", "time_ns", "workspace", "run", "step", "attempt", "epoch", "rev",
                    "journal_key", "kind", "v", "payload", "prev_hash", "hash")
#: The type each cell of an `EventRow` holds (a damaged row can yield another on read).
ROW_TYPES: Final = (int, int, str, str, str, int, int, int, str, str, int, bytes, bytes, bytes)


class FoldRow(NamedTuple):
    """What the folds read of an event."""

    seq: int
    time_ns: int
    kind: str
    v: int
    payload: bytes


#: An event ready to append: the event, its encoded payload, journal key, kind, envelope.
Prepared = tuple[Event, bytes, str, str, Envelope]

#: What reading a damaged row can raise in any store: a strictly decoded text cell
#: (UnicodeDecodeError), a cell of another type than declared (TypeError, ValueError), a
#: short or odd row (KeyError, IndexError). Readers report these as damage, typed.
ROW_ERRORS: Final = (UnicodeDecodeError, TypeError, ValueError, KeyError, IndexError)


class PinHold(NamedTuple):
    """A pin and what decides whether it still holds (docs/design.md "GC"): the step's
    state, the pinned attempt, the step's latest attempt, its last update (`state`,
    `latest`, `updated_ns` None: the step has no row)."""

    digest: str
    role: str
    state: str | None
    attempt: int
    latest: int | None
    updated_ns: int | None


class EntryRow(NamedTuple):
    """A manifest entry."""

    step: str
    manifest_rev: int
    role: str
    path: str
    digest: str
    size: int


#: Fast constructors for rows read from a store (no length check: the SELECT fixes the
#: columns): `list(map(make_event_row, rows))`.
make_event_row: Final = partial(tuple.__new__, EventRow)
make_fold_row: Final = partial(tuple.__new__, FoldRow)
make_pin_hold: Final = partial(tuple.__new__, PinHold)
make_entry_row: Final = partial(tuple.__new__, EntryRow)

#: Every table a ledger holds, with its columns, in the order `copy` moves them (the same
#: names on every store): what `ReadView.table_rows` reads and `Tx.load_rows` writes.
#: Blob bytes outside the inline rows move through `BlobBackend`/the blob files.
COPY_TABLES: Final[dict[str, tuple[str, ...]]] = {
    "meta": ("key", "value"),
    "events": ROW_NAMES,
    "projection_checkpoint": ("name", "last_seq", "version"),
    "steps": ("step_id", "run", "workspace", "state", "attempt", "epoch", "rev",
              "manifest_rev", "manifest_digest", "live", "committed_bytes", "stored_bytes",
              "first_seq", "last_seq", "updated_ns"),
    "blob_data": ("digest", "size", "data", "stored_ns"),
    "pins": ("step", "attempt", "digest", "role", "seq"),
    "manifests": ("step", "manifest_rev", "attempt", "digest", "supersedes", "seq"),
    "manifest_entries": ("step", "manifest_rev", "role", "path", "digest", "size"),
    "workspaces": ("name", "root", "rev", "epoch", "holder", "expires_ns", "released",
                   "acquired_ns", "last_seq"),
    "ws_paths": ("workspace", "path", "rev", "hash", "seq"),
    "condemned": ("digest", "size", "inline", "condemned_ns", "collection"),
    "sealed_ranges": ("first_seq", "last_seq", "run", "seal_seq"),
}

#: The meta fact naming the directory a ledger in a database keeps its seals' archives in
#: (absolute; written by its first seal, in the seal's transaction). A SQLite ledger keeps
#: them beside its file and records none. A location, not history: `copy` never carries
#: it over, it sets the destination's own (docs/design.md "Sealed runs").
ARCHIVE_DIR_META: Final = "archive_dir"

_HEAD_RE: Final = re.compile(r"([0-9]+):([0-9a-fA-F]{64})", re.ASCII)


class Head(msgspec.Struct, frozen=True):
    """The chain head: the last seq and its hash (seq 0: an empty ledger).

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     empty = ledger.head()
    ...     _ = ledger.plan("fetch")
    ...     print(empty.seq, ledger.head().seq)
    0 1
    """

    seq: int
    hash: bytes

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash.hex()}"

    @classmethod
    def parse(cls, text: str) -> Head:
        # A strict grammar: int() and bytes.fromhex() alone would also take "1_0", "+1",
        # non-ASCII digits and spaces between hex pairs.
        match = _HEAD_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            fact = f"head {text!r} is not SEQ:HASH (a seq and 64 hex characters), as"
            raise InvalidInput(f"{fact} str(ledger.head()) gives").at_a_shell(
                f"{fact} printed by 'steptrail head'")
        return cls(int(match[1]), bytes.fromhex(match[2]))


#: A stored checkpoint's `last_seq` that says the tables follow the log (format v6): every
#: append writes its own events' projection in its own transaction, so the tables are
#: at the head whatever it is, and no commit rewrites the checkpoint row. A lag is an
#: explicit seq (a rebuild or catch-up interrupted, a hand-made lag): the tables hold the
#: log up to it. `ReadView.checkpoint()` answers the head's seq for it.
FOLLOWS: Final = -1


class Checkpoint(msgspec.Struct, frozen=True):
    """How far the inline projections have folded the log, and in which version (as read:
    a stored `FOLLOWS` reads as the head's seq)."""

    last_seq: int
    version: int


class ProjectionChanges(msgspec.Struct, kw_only=True):
    """One transaction's inline projection changes, for `Tx.write_projection` (rows as
    tuples in the tables' column order): step rows to upsert; pins released (step,
    attempt, whether by an ack, which releases only the `released_on_ack` roles) and
    taken; manifests and their entries published; workspace rows and path states;
    blobs a pin or a manifest named (no longer condemned); the new checkpoint."""

    steps: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    releases: list[tuple[str, int, bool]] = msgspec.field(default_factory=list)
    released_on_ack: tuple[str, ...] = ()
    pins: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    manifests: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    entries: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    workspaces: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    paths: list[tuple[object, ...]] = msgspec.field(default_factory=list)
    uncondemn: set[str] = msgspec.field(default_factory=set)
    checkpoint: Checkpoint | None = None
    #: Steps a seal archived: their manifests, entries and pins leave the tables.
    dropped_steps: list[str] = msgspec.field(default_factory=list)


class Scope(msgspec.Struct, frozen=True):
    """What a write transaction is confined to: one workspace, or (None) the whole ledger.
    A store may let transactions of different scopes run at once; SQLite has one writer
    and ignores it."""

    workspace: str | None = None


class BlobStat(msgspec.Struct, frozen=True):
    """A stored blob: its size, where it is (`inline`: in the ledger, written with a
    transaction; else the blob backend), and when it was stored or last freshened."""

    digest: str
    size: int
    inline: bool
    mtime_ns: int


class EventQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Which events to read: seq > `after_seq`, optionally one step's (and attempt's),
    some kinds', one run's in one workspace; at most `limit`; in seq order, or newest
    first (`descending`)."""

    after_seq: int = 0
    step: str | None = None
    attempt: int | None = None
    kinds: frozenset[str] | None = None
    run: str | None = None
    workspace: str | None = None
    limit: int | None = None
    descending: bool = False


class StoreInfo(msgspec.Struct, kw_only=True):
    """What a store is: where (a path or a URL), its schema version, how it was opened.
    `schema_changes` (a forensic open only): how its schema differs from what this
    version creates."""

    location: str
    version: int
    readonly: bool
    forensic: bool = False
    schema_changes: tuple[str, ...] = ()


class DuplicateKey(Exception):
    """A backend primitive met a row that is already there (a journal key, a seq): the
    append loop asks the journal what it holds. `error`: the backend's own exception."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__("duplicate key")
        self.error = error


class Held(Exception):
    """`Store.exclusive(name)` found the lock held by another process (`where`: the
    lock, as the store names it)."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(f"{name} is held: {where}")
        self.name, self.where = name, where


class RowsUnreadable(Exception):
    """The store cannot read the events past some point (verify reports how far it got)."""


class CondemnedCheck(msgspec.Struct, frozen=True):
    """A condemned row as verify checks it, its cells as stored (a planted row may hold
    anything): the blob, its size and place, when and by which collection it was
    condemned; `stored_inline`: the size of the inline row under that digest (None:
    none); `referenced`: whether a manifest of the rebuild names it."""

    digest: object
    size: object
    inline: object
    condemned_ns: object
    collection: object
    stored_inline: object
    referenced: bool


class ProjectionSink(Protocol):
    """Where a whole-log fold puts what it does not keep in memory (docs/storage.md
    "Rebuild and verify"): finished step rows and manifests, written as the fold goes
    and read back when a step continues, so memory follows the unfinished steps. A
    rebuild's sink is the ledger's own (emptied) projection tables, inside its write
    transaction; verify's is a private scratch copy (`Scratch`)."""

    def put_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        """Upsert step rows (as `StepRow.as_tuple()`), given in step-id order."""
        ...

    def step(self, step_id: str) -> Any: ...
    def put_manifests(self, manifests: Sequence[tuple[object, ...]],
                      entries: Sequence[tuple[object, ...]]) -> None: ...
    def step_count(self) -> int: ...


class RebuildSink(ProjectionSink, Protocol):
    """The ledger's projection tables, emptied for a rebuild (`Tx.rebuild_projections`)."""

    def put_pins(self, rows: Sequence[tuple[object, ...]]) -> None: ...
    def put_workspaces(self, rows: Sequence[tuple[object, ...]],
                       paths: Sequence[tuple[object, ...]]) -> None: ...


class Scratch(ProjectionSink, Protocol):
    """A rebuild folded beside the ledger's tables, never into them (`ReadView.scratch`):
    verify compares it with the tables. Gone when its block exits."""

    def overlay_steps(self, rows: Sequence[tuple[object, ...]]) -> None:
        """Make the current steps the ledger's step table with `rows` (a lagging tail
        folded in memory) upserted over it, as `read_steps` answers."""
        ...

    def step_differences(self) -> list[tuple[str, Any, Any]]:
        """(step id, the rebuild's row, the current row), for each step whose rows
        differ (None: the step has no row there), in step-id order."""
        ...

    def ref_differences(self) -> list[tuple[str, list[Any], list[Any]]]:
        """For the manifests and the manifest entries: (what, up to 3 rows the tables
        hold and the rebuild does not, up to 3 the rebuild holds and they do not)."""
        ...

    def live_entries(self) -> Iterator[EntryRow]:
        """The entries of the rebuild's live manifests (each committed step's), ordered."""
        ...

    def condemned_checks(self) -> Iterator[CondemnedCheck]: ...


class Projector(Protocol):
    """Inline projections, updated in the append transaction.

    `begin(view)` starts a transaction (the view reads the current rows); `check` folds
    one event into a copy of the current state and returns the change (raising
    IllegalTransition for an illegal one); `accept` keeps a change once its event is
    certain to be inserted; `flush` returns every kept change and the checkpoint, which
    the log hands to `Tx.write_projection`. `committed` is called after COMMIT (the projector may cache what it
    wrote); `forget` drops any cache (another connection wrote, or we rolled back).
    """

    def begin(self, tx: Any) -> None: ...
    def prefetch(self, tx: Any, step_ids: set[str]) -> None: ...
    def check(self, event: Any, seq: int, time_ns: int) -> object: ...
    def accept(self, change: object) -> None: ...
    def flush(self, last_seq: int) -> ProjectionChanges: ...
    def committed(self) -> None: ...
    def forget(self) -> None: ...


class EventReader(Protocol):
    """What the log's readers use: the chain head, the events, the journal, the checkpoint."""

    def head(self) -> Head: ...
    def count(self) -> int: ...
    def events(self, query: EventQuery = ...) -> Iterator[EventRow]: ...
    def fold_rows(self, after_seq: int = 0) -> Iterator[FoldRow]: ...
    def checked_rows(self, after_seq: int = 0) -> Iterator[tuple[EventRow, str | None]]: ...
    def journal_lookup(self, key: str) -> EventRow | None: ...
    def journal_newest(self, prefix: str, kind: str | None = None) -> EventRow | None: ...
    def checkpoint(self) -> Checkpoint | None: ...


class ProjectionReader(Protocol):
    """The inline projections' rows: steps, workspaces and their paths, pins, manifests."""

    def step(self, step_id: str) -> Any: ...
    def step_if_current(self, step_id: str, version: int) -> tuple[bool, Any]:
        """(True, the step's row or None) when the tables are caught up with the log at
        projection `version`, read with the lag check in one statement; (False, None)
        when they lag (fold the log instead)."""
        ...

    def workspace_if_current(self, name: str, version: int) -> tuple[bool, Any]:
        """`step_if_current` for a workspace's row."""
        ...

    def steps_by_id(self, step_ids: Sequence[str]) -> list[Any]:
        """The rows of those of `step_ids` that have one, in one read (any order)."""
        ...

    def steps(self, *, state: str | None = None, step_id: str | None = None,
              contains: str | None = None, limit: int | None = None) -> list[Any]: ...
    def steps_in_flight(self, workspace: str, before_epoch: int | None = None, *,
                        limit: int | None = None, oldest_first: bool = False
                        ) -> list[tuple[str, int]]:
        """(step, attempt) of the workspace's steps whose latest attempt, under an epoch
        (before `before_epoch`), is still in flight; by step id or oldest first."""
        ...

    def workspace(self, name: str) -> Any: ...
    def workspace_rows(self) -> list[Any]: ...
    def path_state(self, workspace: str, path: str) -> tuple[int, str | None, int] | None: ...
    def path_rows(self) -> list[tuple[object, ...]]: ...
    def pin_rows(self) -> list[tuple[object, ...]]: ...
    def manifest_rows(self) -> list[tuple[object, ...]]: ...
    def entry_rows(self) -> list[EntryRow]: ...
    def live_step_count(self) -> int: ...
    def step_totals(self, states: frozenset[str]) -> tuple[int, int]:
        """(steps, their stored bytes) of the steps in `states`."""
        ...


class BlobIndex(Protocol):
    """What GC, audit and the blob readers use: stored blobs, what holds them, what is condemned.

    >>> from ledger import BlobIndex
    >>> callable(getattr(BlobIndex, "blob_rows", None)) or BlobIndex.__name__
    'BlobIndex'
    """

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        """(size, inline) of a stored blob, looked up now; None: it is not stored."""
        ...

    def check_blob(self, digest: str, size: int, *, hash_file: bool) -> None:
        """Raise BlobNotFound / BlobCorrupt unless the blob is present with `size` bytes and
        hashes to its name (bytes outside the ledger's rows: only when `hash_file`)."""
        ...

    def inline_blob(self, digest: str) -> tuple[int, bytes] | None: ...
    def inline_stat(self, digest: str) -> BlobStat | None: ...
    def inline_blobs(self) -> Iterator[BlobStat]: ...
    def pin_holds(self, digest: str | None = None) -> list[PinHold]:
        """Every pin (of `digest` only, when given) with what decides whether it holds."""
        ...

    def manifest_digests(self) -> set[str]:
        """Every digest a manifest entry names (live or superseded)."""
        ...

    def names_digest(self, digest: str) -> bool:
        """Whether a manifest entry names `digest`."""
        ...

    def entries_naming(self, digest: str, limit: int) -> list[tuple[str, int, str]]:
        """(step, manifest_rev, path) of up to `limit` entries naming `digest`."""
        ...

    def live_entries(self) -> list[tuple[str, int]]:
        """(digest, size) of every entry of a committed step's live manifest."""
        ...

    def condemned(self) -> dict[str, tuple[int, bool]]:
        """GC's condemned rows: digest -> (size, inline)."""
        ...

    def condemned_entry(self, digest: str) -> tuple[int, bool] | None: ...
    def condemned_count(self) -> int: ...


class Forensics(Protocol):
    """What verify, copy and stats read: cells as stored, meta, the engine's own checks."""

    def integrity_problems(self) -> list[str]:
        """What the storage engine's own consistency check reports (empty: nothing)."""
        ...

    def checkpoint_rows(self) -> list[tuple[object, object, object]]:
        """Every projection checkpoint row as stored: (name, last_seq, version)."""
        ...

    def inline_row_problems(self, limit: int) -> list[tuple[object, object, object]]:
        """Up to `limit` inline blob rows not named by a digest or whose size column is
        not their data's length: (digest, size, length)."""
        ...

    def scratch(self) -> AbstractContextManager[Scratch]: ...
    def table_rows(self, table: str) -> Iterator[tuple[object, ...]]:
        """Every row of `table` (a `COPY_TABLES` name) in its columns' order, streamed in
        bounded batches (events in seq order): what `copy` reads."""
        ...

    def meta(self, key: str) -> str | None: ...
    def meta_all(self) -> dict[str, object]: ...
    def event_totals(self, bucket_ns: int) -> tuple[list[tuple[str, str, int, int, int, int]],
                                                     list[tuple[int, int, int]]]:
        """What `steptrail stats` reads: per (run, kind) (run, kind, events, bytes, first
        time_ns, last time_ns), and per time bucket of `bucket_ns` (bucket start, events,
        bytes), in order. An event's bytes: its payload, journal key and two hashes."""
        ...


class ReadView(EventReader, ProjectionReader, BlobIndex, Forensics, Protocol):
    """One consistent snapshot of the ledger (inside a `Tx`: the transaction's own): every
    read role. A caller that needs only some names those (`EventReader`, `BlobIndex`, …).

    >>> from ledger import ReadView
    >>> [name for name in ("head", "step") if hasattr(ReadView, name)]
    ['head', 'step']
    """


#: The check an append runs on each event inside its transaction, before inserting it
#: (`ledger.guard.AppendGuard` makes one): raises to refuse the event.
EventCheck = Callable[[Any, Event], None]


class EventWriter(Protocol):
    """Appending events, at the transaction's time."""

    @property
    def time_ns(self) -> int:
        """This transaction's time: its events' `time_ns`, and the clock leases are
        judged by inside it (read once, when first asked)."""
        ...

    def append(self, prepared: Sequence[Prepared], *, head: Head, time_ns: int,
               projector: Projector | None, guard: EventCheck | None) -> list[RecordedEvent]: ...


class ProjectionWriter(Protocol):
    """Writing the inline projections (an append's changes; a rebuild)."""

    def write_projection(self, changes: ProjectionChanges) -> None: ...
    def rebuild_projections(self) -> AbstractContextManager[RebuildSink]:
        """Empty every projection table for a rebuild and hand out the sink it writes
        through (a store may drop and rebuild its secondary indexes around it)."""
        ...


class BlobWriter(Protocol):
    """Inline blob rows and GC's condemned rows."""

    def put_inline(self, blobs: Mapping[str, bytes], stored_ns: int) -> None: ...
    def delete_inline(self, digest: str) -> None: ...
    def condemn(self, rows: Sequence[tuple[str, int, bool]], condemned_ns: int,
                collection: str) -> None:
        """Record GC's condemned rows (digest, size, inline); one already there stays."""
        ...

    def uncondemn(self, digests: Iterable[str]) -> None: ...


class Maintenance(Protocol):
    """Meta, seals, copy's loads, and a group commit's parts."""

    def set_meta(self, key: str, value: str) -> None: ...
    def seal_rows(self, run: str, ranges: Sequence[tuple[int, int]], seal_seq: int) -> int:
        """Register `ranges` (first, last seq) as sealed by event `seal_seq` (already
        appended in this transaction) and delete `run`'s rows inside them; return how
        many (docs/design.md "Sealed runs")."""
        ...

    def load_rows(self, table: str, rows: Sequence[tuple[object, ...]]) -> None:
        """Insert `rows` of `table` (a `COPY_TABLES` name) as they are: what `copy`
        writes into an empty ledger (events keep their seq, hashes and time)."""
        ...

    # One caller's part of a group commit (docs/design.md "Group commit"): a savepoint.
    def open_part(self) -> None: ...
    def close_part(self) -> None: ...
    def undo_part(self, exc: BaseException) -> bool:
        """Roll the part back after `exc` (True), or say the transaction cannot go on
        (False: `exc` may have ended it; every part fails)."""
        ...


class Tx(ReadView, EventWriter, ProjectionWriter, BlobWriter, Maintenance, Protocol):
    """A write transaction: any exception rolls all of it back."""

    scope: Scope


class BlobBackend(Protocol):
    """Blob bytes outside a transaction (SQLite: the inline rows and the blob files;
    PostgreSQL: chunk rows). Every read checks the size it is given and the hash."""

    root: str | None  # a directory (what a workspace may not overlap); None: in the database

    def stat(self, digest: str) -> BlobStat | None: ...
    def read(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes: ...
    def chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]: ...
    def put_stream(self, chunks: Iterable[bytes | memoryview], digest: str) -> Any:
        """Store bytes under `digest` (ContentChanged if they do not hash to it): durable
        when it returns, before any event names them."""
        ...


class Store(Protocol):
    """A ledger's storage."""

    info: StoreInfo
    blobs: BlobBackend
    #: Called with "commit" just before each COMMIT (the chaos harness counts these).
    on_op: Callable[[str], None] | None
    #: The time (ns) leases and records are judged by: the caller's, or, for a store many
    #: machines share, the database's.
    clock: Callable[[], int]
    #: The blob bytes kept outside the inline rows (files, or a database's chunk rows),
    #: with `BlobStore`'s interface.
    files: BlobStore
    #: Re-entrant; held by every use of the store's connection (transactions, read
    #: transactions, each read of `view`): threads take turns, none sees another's
    #: uncommitted writes.
    lock: Any

    def held_here(self) -> bool:
        """Whether this thread holds the store's lock — inside one of its transactions,
        read transactions, or a section it locked (an append from there is nested: it
        joins that transaction, never a group another thread leads)."""
        ...

    def reading_here(self) -> bool:
        """Whether this thread is inside a read transaction and no write transaction (an
        append from there is refused: it could not commit)."""
        ...

    @property
    def genesis(self) -> bytes: ...
    @property
    def view(self) -> ReadView:
        """Reads outside a read transaction: each call sees the latest commit."""
        ...

    def read(self) -> AbstractContextManager[ReadView]: ...
    def transaction(self, scope: Scope = ...) -> AbstractContextManager[Tx]: ...
    def generation(self) -> object: ...
    def exclusive(self, name: str, *, wait: bool = False) -> AbstractContextManager[None]: ...
    def held_elsewhere(self, name: str) -> bool: ...
    def snapshot(self, path: str) -> None:
        """Write a consistent copy of the whole store (events, projections, inline blobs,
        meta) to the new file `path`, durable on return, while writers go on (`backup`);
        the copy opens as a store of its own. Blob files are not copied."""
        ...

    def close(self, *, refused: bool = False) -> None: ...


from .registry import (  # noqa: E402  (the registry's Protocols name Store)
    Location,
    Unmapped,
    create_store,
    locate,
    open_store,
    shown_location,
    unmapped_error,
)

__all__ = [
    "ARCHIVE_DIR_META", "BUSY_TIMEOUT_MS", "Location", "Synchronous", "Unmapped", "create_store",
    "locate", "open_store", "shown_location", "unmapped_error", "COPY_TABLES", "ROW_ERRORS", "ROW_NAMES", "ROW_TYPES", "BlobBackend", "BlobStat", "Checkpoint",
    "FOLLOWS",
    "CondemnedCheck", "DuplicateKey", "EntryRow", "EventQuery", "EventRow", "FoldRow",
    "EventCheck", "Head", "Held", "PinHold", "Prepared", "ProjectionChanges", "ProjectionSink",
    "Projector", "ReadView", "RebuildSink", "RowsUnreadable", "Scope", "Scratch", "Store",
    "StoreInfo", "Tx",
    # the roles ReadView and Tx are made of
    "BlobIndex", "BlobWriter", "EventReader", "EventWriter", "Forensics", "Maintenance",
    "ProjectionReader", "ProjectionWriter",
    "make_entry_row", "make_event_row", "make_fold_row", "make_pin_hold",
]

"""`Ledger`: the one obvious entry point, composing the file, the log and the read side.

It holds the storage, the event log and the inline projector, keeps the witness, and
implements the artifact protocol (plan, store, publish, ack) itself; the workspace
protocol is a collaborator it composes (`fences.Workspaces`, handed the ledger's
`core.Core`), and restore a function over that collaborator. Neither imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any


from .blobs import BlobStore, Content
from .errors import BlobCorrupt, BlobNotFound, CorruptLedger, InvalidInput, NotALedger, UnknownStep
from .events import (
    Built,
    KINDS,
    STEP_ID_MAX,
    WitnessAnchored,
    BlobStored,
    Event,
    Manifest,
    RecordedEvent,
    check_digest,
    check_int,
    check_utf8,
    check_step_id,
)
from . import holds as holds_mod
from . import opening
from .holds import Hold
from .guard import AppendGuard, check_blob
from .workspace.core import Clock, Core, Options, OwnFiles
from .step import artifacts as artifacts_mod
from .step.attempt import Attempt, read_attempt
from .step.values import Receipt
from .workspaces import Workspaces
from .log import EventLog, Head
from .store import BUSY_TIMEOUT_MS, Store, Synchronous
from .projections import (
    StepRow,
    StepLookup,
    StepsProjector,
    catch_up,
    checkpoint,
    read_steps,
    rebuild,
)
from .projections.steps import VERSION as STEPS_VERSION
from .verify import VerifyReport, exposure_warnings, verify
from .witness_keeper import WitnessKeeper, anchor_witness
from .witness import Witness, WitnessStatus

Progress = Callable[[int, int], None]

DEFAULT_PATH = os.path.join(".steptrail", "ledger.db")
"""Where a ledger lives when no path is given: `.steptrail/ledger.db`, relative to the current
directory (like `.git`, inside the project).

>>> import os
>>> from ledger import DEFAULT_PATH
>>> DEFAULT_PATH == os.path.join(".steptrail", "ledger.db")
True
"""

#: Artifacts up to this size live inside the ledger file, written in the transaction
#: that records `blob-stored` (one WAL fsync instead of a file create + 2 fsyncs).
INLINE_MAX_DEFAULT = 64 * 1024
#: Blobs up to this size are re-hashed (not only re-stat'ed) before a publish commits.
HASH_CHECK_MAX_DEFAULT = 1 << 20



def _refuse_anchor(events: Sequence[Event]) -> None:
    """What `append` and `append_batch` refuse before anything is read: the library's
    own trusted wrapper (`events.Built`: a caller's events are validated whole, always);
    a witness-anchored event (only `Ledger.anchor_witness`, which verifies first, and a
    first witnessed open record where the witness is)."""
    if any(type(e) is Built for e in events):
        raise InvalidInput("append takes events (ledger.events), each validated whole; the"
                           " library's own wrapper events.Built is not accepted")
    if any(isinstance(e, WitnessAnchored) for e in events):
        raise InvalidInput("a witness-anchored event is recorded by Ledger.anchor_witness"
                           " ('steptrail witness anchor'), which verifies the ledger first;"
                           " append does not take one")



class Ledger:
    """A steptrail ledger file.

    >>> from ledger import Ledger, Planned
    >>> with Ledger.init("ws/.steptrail/ledger.db") as ledger:
    ...     _ = ledger.append(Planned(step="fetch", attempt=1))
    ...     print(ledger.step("fetch").state)
    planned

    Writers open read-write (the default); inspection opens `readonly=True` and never
    writes: not the file, not its log, not a projection catch-up (it reads under SQLite's
    locks, which may create an empty ``-wal`` and a ``-shm``). Time is injected
    (`clock` returns Unix nanoseconds), never read in leaf code.

    The workspace protocol (registrations, leases, admit, apply, compensate, settle,
    restore) is one object, `ledger.workspaces` (`ledger.workspaces.Workspaces`):
    ``ledger.workspaces.acquire("w", "agent-1")``.
    """

    INLINE_MAX_DEFAULT = INLINE_MAX_DEFAULT


    def __init__(
        self,
        store: Store,
        clock: Clock,
        created: bool = False,
        *,
        inline_max_bytes: int = INLINE_MAX_DEFAULT,
        hash_check_max_bytes: int = HASH_CHECK_MAX_DEFAULT,
        compensation_window_s: float | None = None,
        witness: str | os.PathLike[str] | None = None,
        witness_check: bool = True,
    ) -> None:
        opening.check_options(inline_max_bytes=inline_max_bytes, hash_check_max_bytes=hash_check_max_bytes,
                       compensation_window_s=compensation_window_s)
        info = store.info
        #: The options the protocol reads, fixed at open (the compensation window is the
        #: ledger's own, recorded at init: `opening.compensation_window`).
        self.options = Options(
            inline_max_bytes=inline_max_bytes, hash_check_max_bytes=hash_check_max_bytes,
            compensation_window_s=opening.compensation_window(store, compensation_window_s,
                                                              created))
        #: The ledger's storage (docs/storage.md): on SQLite, the file and its blob files.
        self._store = store
        self.clock = clock
        self.created = created
        self._steps = StepsProjector()
        self._log = EventLog(store, None if info.readonly else self._steps)
        #: A step's current row (served from this writer's own commits while fresh).
        self._rows = StepLookup(self._log, None if info.readonly else self._steps)
        #: The check every append runs before inserting an event (blobs durable, epochs live).
        self._guard = AppendGuard(self._steps, hash_check_max_bytes)
        #: The ledger's own files, which no workspace may overlap.
        self._own = OwnFiles(info.location, store)
        if not witness_check and not info.readonly:
            raise InvalidInput("witness_check=False is for read-only inspection; a writer"
                               " keeps the witness (to replace one, use anchor_witness)")
        #: The witness as this ledger keeps it (`ledger.witness_keeper`).
        self._witness = WitnessKeeper(info.location, lambda: self.ledger_id, self._log, store,
                                      readonly=info.readonly, given=witness,
                                      check=witness_check, own=self._own)
        #: What the step's lifecycle and restore work through (never this object).
        self._core = Core(
            log=self._log, storage=self._store, options=self.options, clock=clock,
            guard=self._guard, own=self._own, steps=self._rows)
        #: The workspace protocol (`ledger.workspaces.Workspaces`): registration, leases and
        #: epochs, plan/admit/apply/compensate/settle, reads, restore — one object.
        self.workspaces = Workspaces(self._core)
        #: What the step's lifecycle works through (`ledger.step.site.Site`).
        self._site = self.workspaces.site

    @property
    def witness(self) -> Witness | None:
        """The witness in use (the one given, else the one the ledger records); None if
        the ledger is not witnessed and none was given."""
        return self._witness.witness

    @witness.setter
    def witness(self, witness: Witness | None) -> None:
        self._witness.witness = witness

    @property
    def witnessed(self) -> bool:
        """Whether the ledger records that it is witnessed (a `witness-anchored` event, or
        the witness tag of a ledger witnessed before locations were recorded)."""
        return self._witness.witnessed

    @property
    def witness_lag(self) -> int:
        """Commits the ledger is ahead of its witness, found when it opened (1: an honest
        crash between a COMMIT and the witness's write)."""
        return self._witness.lag

    @property
    def inline_max_bytes(self) -> int:
        """Artifacts up to this size live inside the ledger file."""
        return self.options.inline_max_bytes

    @property
    def hash_check_max_bytes(self) -> int:
        """Blobs up to this size are re-hashed before a publish commits."""
        return self.options.hash_check_max_bytes

    @property
    def compensation_window_s(self) -> float:
        """How long a committed step may still be compensated (a fact of the ledger)."""
        return self.options.compensation_window_s

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        *,
        readonly: bool = False,
        clock: Clock | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        vfs: str | None = None,
        forensic: bool = False,
        immutable: bool = False,
        **options: Any,
    ) -> Ledger:
        """Open an existing ledger; refused files (not a ledger, newer, damaged) stay untouched.

        `forensic` (with `readonly`: what `verify` opens) also opens a ledger that every
        other open refuses for a schema changed outside its tables (dropped append-only
        triggers) or an out-of-range meta fact, so that `verify` reports them as findings.
        A read-write open brings lagging projections up to the log first. `options`:
        `blob_root` (default ``<ledger dir>/blobs``), `inline_max_bytes`,
        `hash_check_max_bytes`, `on_op` (a hook called before each durable operation),
        `compensation_window_s` (how long a committed step may still be compensated),
        `witness` (an absolute path: the witness file; default: the one the ledger
        records — a witnessed ledger is never opened without it), `witness_check`
        (False: a read-only open that reports witness problems from `verify` instead
        of refusing).

        `immutable` (with `readonly`, a SQLite file only): read with SQLite's
        ``immutable`` flag, so not one byte of the ledger's directory changes — no
        ``-wal`` or ``-shm`` is created — for a forensic copy that nobody writes. Refused
        while a ``-wal`` holds committed data; a read after a writer appeared fails
        (`InvalidInput`) rather than miss its commits: unsafe on a live ledger, by design.

        Without `path`: the project's ledger, the nearest ``.steptrail/ledger.db`` at or
        above the working directory, found as git finds ``.git`` (`ledger.find`); a
        path given is used as given.
        """
        if path is DEFAULT_PATH:
            from .find import find_ledger

            path = find_ledger() or path
        where, resolve = opening.check_open(path, readonly, forensic, immutable, options)
        more = {"immutable": True} if immutable else {}
        if not readonly and resolve:
            # Judge the file against its witness (the one given, or the one it records)
            # through a read-only open first: closing a read-write connection checkpoints
            # the WAL, which would change a file that is about to be refused.
            cls.open(path, readonly=True, clock=clock, vfs=vfs, witness=options.get("witness")).close()
        store = where.open(clock=clock, readonly=readonly, synchronous=synchronous,
                           busy_timeout_ms=busy_timeout_ms, vfs=vfs, forensic=forensic,
                           blob_root=options.pop("blob_root", None),
                           on_op=options.pop("on_op", None), **more)
        try:
            ledger = cls(store, store.clock, **options)
            if resolve:
                ledger._witness.attach()
            if not readonly:
                catch_up(ledger._log)
                ledger.blobs.make_private()  # a store made before blobs were private
        except BaseException:
            store.close(refused=True)
            raise
        return ledger

    @classmethod
    def init(
        cls,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        *,
        clock: Clock | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        vfs: str | None = None,
        parents: bool = True,
        **options: Any,
    ) -> Ledger:
        """Create a ledger (parent directories included), or open the one already there.

        `ledger.created` tells which happened. `options` as for `open`. With
        ``parents=False`` (the command line's way) only the ledger's own directory is
        created: a path whose directory's parent is missing is refused with InvalidInput,
        nothing written.
        """
        where = opening.check_init(path, parents, options)  # bad input writes nothing
        if where.may_exist():
            try:
                cls.open(path, readonly=True, clock=clock, vfs=vfs,
                         witness=options.get("witness"),
                         witness_check=options.get("witness_check", True)).close()
            except NotALedger:
                pass  # the store's `create` judges it: an interrupted init is finished
        store, created = where.create(
            clock=clock, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, vfs=vfs,
            blob_root=options.pop("blob_root", None), on_op=options.pop("on_op", None))
        try:
            ledger = cls(store, store.clock, created, **options)
            ledger._witness.attach()
            # (a new ledger too: its first catch-up writes the checkpoint that says the
            # tables follow the log, before any append relies on it)
            catch_up(ledger._log)
        except BaseException:
            store.close()
            raise
        return ledger

    @classmethod
    def anchor_witness(
        cls,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        witness: str | os.PathLike[str] | None = None,
        *,
        force: bool = False,
        clock: Clock | None = None,
        vfs: str | None = None,
        progress: Progress | None = None,
    ) -> RecordedEvent:
        """Start a new witness for the ledger at `path` and record it: the operator's way
        back when a witness is lost, damaged, or is to move (the only way to replace one).

        `witness` is the new location (absolute; default: the recorded one, to replace a
        lost witness in place). First, read-only, the whole ledger is verified (chain,
        seqs, projections, blobs, the recorded anchors) and the old witness is judged
        (``ok``, ``missing``, ``blank``, ``damaged``, or ``mismatch``: the ledger behind
        it or off its chain). Findings of verify or a ``mismatch`` refuse it
        (`AnchorRefused`, nothing written) unless `force`, which records them in the
        event. Then, under the write lock and only if the head is still the one verified,
        the new witness is written (a fresh key) and a `witness-anchored` event committed
        (the new witness then holds it). Returns that event as recorded.
        """
        return anchor_witness(cls.open, path, witness, force=force, clock=clock, vfs=vfs,
                              progress=progress)

    def witness_status(self) -> WitnessStatus:
        """Where the witness is and what it says about this ledger. Read-only; reports,
        never refuses (open with ``witness_check=False`` to ask about a refused ledger)."""
        return self._witness.status()

    def check_witness(self) -> int:
        """Raise WitnessMismatch unless the chain contains the witnessed head; return how
        many commits the ledger is ahead of it (0, or 1 after an honest crash)."""
        return self._witness.check()

    @property
    def blobs(self) -> BlobStore:
        """The blob files (the fault harness swaps in a store with its own file operations)."""
        return self._store.files

    @blobs.setter
    def blobs(self, files: BlobStore) -> None:
        self._store.files = files

    @property
    def storage(self) -> Store:
        """The ledger's storage (docs/storage.md): read views, write transactions, blob
        bytes, named locks. GC, audit, verify and restore work through it."""
        return self._store

    @property
    def log(self) -> EventLog:
        """The event log: the only writer of events (append, with builders run under the
        write lock), and their reader."""
        return self._log

    @property
    def path(self) -> str:
        """Where the ledger is (the store's location: the SQLite file's path)."""
        return self._store.info.location

    @property
    def readonly(self) -> bool:
        return self._store.info.readonly

    @property
    def ledger_id(self) -> str:
        """The ledger's id (meta, fixed at init; the genesis hash binds the chain to it)."""
        value = self._store.view.meta("ledger_id")
        if value is None:
            raise CorruptLedger(self.path, "meta key 'ledger_id' is missing")
        return value

    def close(self) -> None:
        if self.witness is not None:
            self.witness.close()
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------

    def append(self, event: Event) -> RecordedEvent:
        """Append one event in its own durable transaction.

        Returns it as recorded; `deduped` is True when its journal key was already
        recorded with the same event (nothing was written). Raises
        IdempotencyConflict, IllegalTransition or InvalidInput, writing nothing.
        """
        _refuse_anchor([event])
        return self._log.append([event], guard=self._guard())[0]

    def append_batch(self, events: Sequence[Event], *,
                     inline: Mapping[str, bytes] | None = None,
                     epochs: Mapping[str, int] | None = None) -> list[RecordedEvent]:
        """Append many events in one transaction: all of them are written, or none.

        Like `append`, a `blob-stored` or `manifest-published` event is accepted only if
        every blob it names is present with its size (publishing before the content is
        durable is impossible through this API). `inline` (digest -> bytes, each at most
        `inline_max_bytes`) are blob bytes written into the ledger file in this very
        transaction, so a batch that stores small blobs is one commit (the step
        runner's fast path, for callers that build their own steps: ledger.langgraph).

        `epochs` (lease name -> epoch) fences the batch on leases its events need not
        name, checked inside the transaction: each named lease's live epoch must be the
        one given (StaleEpoch otherwise), and 0 means that no lease on it may be live
        (LeaseHeld while one is; a name never leased has none). The LangGraph saver
        fences a thread's writes this way: a claimant's under its epoch (an ended
        attempt of the thread it compensates may name no lease), everyone else's under 0,
        so a thread another worker claimed refuses them.
        """

        events = list(events)
        _refuse_anchor(events)
        small = opening.check_inline(inline or {}, self.inline_max_bytes)
        if epochs:
            for name, epoch in epochs.items():
                check_step_id(name)
                check_int(epoch, "epoch", 0)
            return self.workspaces.leases.append_fenced(events, dict(epochs), small)
        if small:
            return self._log.append(events, guard=self._guard(), inline=small)
        return self._log.append(events, guard=self._guard())

    # -- blobs -----------------------------------------------------------------------

    def read_blob(self, digest: str, *, size: int | None = None, verify: bool = True) -> bytes:
        """A blob's bytes (inline row or file), checked against `size` and its hash."""
        check_digest(digest)
        return self._store.blobs.read(digest, size=size, verify=verify)

    def blob_chunks(self, digest: str, *, size: int | None = None) -> Iterator[bytes]:
        """A blob's bytes in bounded pieces (an inline row is one piece): BlobNotFound at
        once when it is missing; its size and hash are checked by the time the last piece
        is read (BlobCorrupt then: whoever wrote the pieces somewhere discards them)."""
        return self._core.blob_chunks(digest, size=size)

    def check_blob(self, digest: str, size: int, *, deep: bool = True) -> None:
        """Raise BlobNotFound / BlobCorrupt unless the blob is intact (re-hashed if `deep`)."""
        check_digest(digest)
        with self._store.read() as view:
            check_blob(view, digest, size, deep=deep,
                       hash_check_max_bytes=self.hash_check_max_bytes)

    def blob_list(self) -> list[dict[str, Any]]:
        """Every stored blob (inline rows, files) and leftover temporary file, with its
        holders: `referenced` (named by some manifest revision) and `pinned`. Read-only."""
        from .gc.inventory import list_blobs
        return list_blobs(self._log, self._store, self.blobs)

    # -- the artifact protocol (`ledger.step.artifacts`) ---------------------------------

    def find_step(self, step_id: str) -> StepRow | None:
        """A step's current state, or None if it has no events."""
        return self._rows.find(step_id)

    def attempt(self, step: str, attempt: int | None = None, *,
                kind: str | None = None) -> Attempt:
        """What the ledger recorded of one attempt of a step (None: its latest), in log
        order: its plan, applies, stored artifacts, manifests, ack, undo intent and end
        (`ledger.step.attempt.Attempt`; `kind`: only that kind's events are read).
        UnknownStep if the step has no events."""
        if not isinstance(step, str):
            raise InvalidInput(f"a step id is a string, not {type(step).__name__}")
        if kind is not None and kind not in KINDS:
            raise InvalidInput(f"kind {kind!r} is not an event kind; give one of"
                               f" {', '.join(KINDS)}, or none for all")
        row = self._rows.get(step)
        if attempt is not None:
            check_int(attempt, "attempt", 1)
            if attempt > row.attempt:
                raise InvalidInput(f"step {step!r} has no attempt {attempt}: its latest is"
                                   f" attempt {row.attempt}")
        return read_attempt(self._log, step, row.attempt if attempt is None else attempt,
                            kind=kind)

    def plan(
        self,
        step: str,
        *,
        run: str = "",
        artifacts: Sequence[str] = (),
        workspace: str = "",
        epoch: int = 0,
        pins: Sequence[str] = (),
    ) -> StepRow:
        """Start the step's next attempt, or return the one in flight.

        A committed step (live manifest) is returned as it is: nothing runs again. An
        attempt still in flight is returned to be continued (a replay after a crash).
        Otherwise — no attempt yet, or the latest ended rejected or compensated — a new
        attempt is planned (a durable `planned` event, before any write). `pins`: the
        digests of blobs the new attempt will store, pinned in that same commit (what
        `pin` does one commit each; ignored when no new attempt is planned).
        """
        return artifacts_mod.plan(self._site, step, run=run, artifacts=artifacts,
                                  workspace=workspace, epoch=epoch, pins=pins)

    def pin(self, step: str, attempt: int, digest: str, role: str = "artifact") -> RecordedEvent:
        """Record, in its own committed transaction, that the attempt will use this blob.

        Taken before the blob is written or deduplicated, so GC never collects it. The
        same event `store` records, so pinning first and storing later is idempotent.
        """
        return artifacts_mod.pin(self._site, step, attempt, digest, role)

    def store(self, step: str, attempt: int, path: str, data: Content) -> BlobStored:
        """Store one artifact of an attempt: pin, durable bytes, then `blob-stored`.

        Bytes up to `inline_max_bytes` go into the ledger file in the very transaction
        that records `blob-stored`; larger ones are written as a blob file (fsynced,
        renamed, directory fsynced) before it. Identical content is stored once. `data`
        may be a binary file open for reading: it is hashed, then streamed into the
        blob store, never held whole (ContentChanged, nothing recorded as stored, if it
        changed in between).
        """
        return artifacts_mod.store(self._site, step, attempt, path, data)

    def manifest(self, step: str, manifest_rev: int | None = None) -> Manifest | None:
        """The step's live manifest (or revision `manifest_rev`, live or not); None if none."""
        return artifacts_mod.manifest_of(self._site, step, manifest_rev)

    def publish(
        self,
        step: str,
        attempt: int | None = None,
        *,
        expected_rev: int = -1,
        receipt: Receipt | dict[str, Any] | bytes | str | None = None,
    ) -> Manifest:
        """Publish the attempt's manifest: the commit point, a compare-and-swap.

        `expected_rev=-1` creates: when the step already has a live manifest, that one is
        returned unchanged (the first to land wins). `expected_rev=k` supersedes live
        revision k (ManifestConflict otherwise), recording both digests. The manifest
        names, per path, the latest blob the attempt stored; inside the publishing
        transaction every one is re-stat'ed (and small ones re-hashed): a missing blob
        raises BlobNotFound and nothing is published. A step that writes the workspace
        publishes only after its apply, under its live epoch, and its manifest names each
        written path's post-image; given a `receipt` (from an executor that ran apart),
        it must match the apply the ledger recorded.
        """
        return artifacts_mod.publish(self._site, step, attempt, expected_rev=expected_rev,
                                     receipt=receipt)

    def ack(self, step: str, attempt: int | None = None, *, epoch: int | None = None) -> RecordedEvent:
        """Record that the client learned the step's live manifest (idempotent).

        For a step that writes a workspace the ack is an effect under the live epoch:
        `epoch` (default: the step's own) must be live. An ack lost across a preemption
        is recorded under the new epoch. A step already acked returns that ack (its live
        manifest's).
        """
        return artifacts_mod.ack(self._site, step, attempt, epoch=epoch)

    # -- holds -----------------------------------------------------------------------

    def hold(self, target: str, *, scope: str = "run", reason: str = "",
             by: str = "") -> Hold:
        """Hold run `target` (or step, `scope="step"`): `seal` refuses it and `gc` keeps
        its blobs even where a releasing compensation would let them go, until
        `release_hold`. Holding what is held already is a no-op returning that hold
        (ledger/holds.py)."""
        event = holds_mod.held_event(self._log, scope, target, reason, by)
        if event is not None:
            self.append(event)
        return holds_mod.read_holds(self._log)[(scope, target)]

    def release_hold(self, target: str, *, scope: str = "run", by: str = "") -> bool:
        """Release the hold on `target`; False when none was in force (nothing written)."""
        event = holds_mod.release_event(self._log, scope, target, by)
        if event is None:
            return False
        self.append(event)
        return True

    def holds(self) -> list[Hold]:
        """The holds in force, oldest first."""
        return sorted(holds_mod.read_holds(self._log).values(), key=lambda h: h.seq)

    # -- reading ---------------------------------------------------------------------

    def head(self) -> Head:
        """The chain head (seq and hash); record it elsewhere to detect a cut-off tail."""
        with self._store.read():
            return self._log.head()

    def read(
        self,
        after_seq: int = 0,
        *,
        step: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        run: str | None = None,
        workspace: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events after `after_seq` in seq order, optionally one step's, one kind's, one
        run's (``""``: events of no run) or one workspace's; at most `limit`. The filters
        are the store's (a run's events come from an index), so a page of one run's
        steps costs that page, not a scan of the log."""
        if kind is not None and kind not in KINDS:
            raise InvalidInput(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        if step is not None:
            check_step_id(step)
        for value, what in ((run, "run"), (workspace, "workspace")):
            if value is not None and (not isinstance(value, str) or len(value) > STEP_ID_MAX):
                raise InvalidInput(f"{what} {value!r} must be a name of at most {STEP_ID_MAX}"
                                   " characters")
            if value is not None:
                check_utf8(value, what)
        check_int(after_seq, "after_seq")
        if limit is not None:
            check_int(limit, "limit")
        return self._log.read(after_seq, step=step, kind=kind, limit=limit, run=run,
                              workspace=workspace)

    def steps(self, state: str | None = None, *, contains: str | None = None,
              limit: int | None = None) -> list[StepRow]:
        """Every step's current state (optionally only those in `state`, or whose id
        holds the text `contains`: case-sensitive, no wildcards, found by the store),
        oldest first; at most `limit`."""
        if contains is not None and (not isinstance(contains, str) or len(contains) > 256):
            raise InvalidInput("contains takes a text of at most 256 characters")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise InvalidInput(f"limit {limit!r} must be a whole number >= 0")
        return read_steps(self._log, state=state, contains=contains, limit=limit)

    def step(self, step_id: str) -> StepRow:
        """One step's current state; UnknownStep if it has no events."""
        return self._rows.get(step_id)

    def timeline(self, step_id: str) -> list[RecordedEvent]:
        """Every event of one step, in order; UnknownStep if it has none."""
        check_step_id(step_id)
        with self._store.read():
            events = list(self._log.read(step=step_id))
        if not events:
            raise UnknownStep(step_id)
        return events

    def count(self) -> int:
        """How many events the log holds."""
        return self._log.count()

    def projection_lag(self) -> int:
        """How many events the projection tables have not folded yet (0 when caught up).

        Only a read-only open of a file written by an older or interrupted version sees a
        lag; read-write opens catch up first.
        """
        with self._store.read() as view:
            cp = checkpoint(view)
            head = view.head().seq
        return head if cp.version != STEPS_VERSION else max(0, head - cp.last_seq)

    # -- maintenance -----------------------------------------------------------------

    def rebuild(self, progress: Progress | None = None) -> int:
        """Refold every projection from the events, atomically; return the step count."""
        self._log._forget()  # cached rows and head describe the tables being replaced
        try:
            return rebuild(self._log, progress)
        finally:
            self._log._forget()

    def verify(
        self, *, expect_head: Head | str | None = None, progress: Progress | None = None
    ) -> VerifyReport:
        """Check integrity, the hash chain, seq density and projections. Writes nothing."""
        if isinstance(expect_head, str):
            expect_head = Head.parse(expect_head)
        elif expect_head is not None and not isinstance(expect_head, Head):
            raise InvalidInput(f"expect_head {expect_head!r} is not a head: give a Head, or"
                               " SEQ:HASH as str(ledger.head()) gives")
        extra, seen = self._witness.findings()
        if seen is not None and expect_head is None:
            expect_head = Head(seen.seq, seen.hash)
        report = verify(self._store, self._log, expect_head=expect_head, progress=progress,
                        blob_check=self.blob_problem)
        if self.blobs.root is not None:
            report.warnings.extend(exposure_warnings(self.path, self.blobs.root))
        if extra:
            report.findings.extend(extra)
            report.ok = False
        return report

    def blob_problem(self, digest: str, size: int) -> str | None:
        """None if the blob is present, `size` bytes and hashes to its name; else what is
        wrong with it ("missing", "corrupt: …")."""
        try:
            self.check_blob(digest, size, deep=True)
        except BlobNotFound:
            return "missing"
        except BlobCorrupt as exc:
            return f"corrupt: {exc.why}"
        return None

    def classify(self, step_id: str) -> str:
        """The durability checker for one step: ``committed`` (a live manifest whose every
        blob is intact), ``no-commit`` (no live manifest: replay it) or ``VIOLATION: …``
        (a visible manifest naming a missing or corrupt blob)."""
        row = self.find_step(step_id)
        if row is None or not row.live:
            return "no-commit"
        manifest = self.manifest(step_id)
        if manifest is None:
            return "VIOLATION: the step is live but its manifest event is missing"
        for entry in (*manifest.writes, *manifest.artifacts):
            problem = self.blob_problem(entry.digest, entry.size)
            if problem is not None:
                return f"VIOLATION: {entry.path} -> blob {entry.digest[:12]}… is {problem}"
        return "committed"

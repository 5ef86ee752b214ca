"""`Ledger`: the one obvious entry point, composing the file, the log and the read side."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType

from .db import BUSY_TIMEOUT_MS, Database, Synchronous
from .errors import InvalidInput, UnknownStep
from .events import KINDS, Event, RecordedEvent, check_step_id
from .log import EventLog, Head
from .projections import StepRow, StepsProjector, catch_up, checkpoint, read_steps, rebuild
from .projections.steps import VERSION as STEPS_VERSION
from .verify import VerifyReport, verify

Clock = Callable[[], int]
Progress = Callable[[int, int], None]

DEFAULT_PATH = os.path.join(".stepledger", "ledger.db")


class Ledger:
    """A stepledger ledger file.

    >>> with Ledger.init("ws/.stepledger/ledger.db") as ledger:   # doctest: +SKIP
    ...     ledger.append(Planned(step="fetch", attempt=1))

    Writers open read-write (the default); inspection opens `readonly=True` and never
    writes: not the file, not a ``-wal``, not a projection catch-up. Time is injected
    (`clock` returns Unix nanoseconds), never read in leaf code.
    """

    def __init__(self, db: Database, clock: Clock, created: bool = False) -> None:
        self._db = db
        self.clock = clock
        self.created = created
        self._steps = StepsProjector()
        self._log = EventLog(db, clock, None if db.readonly else self._steps)

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
    ) -> Ledger:
        """Open an existing ledger; refused files (not a ledger, newer, damaged) stay untouched.

        A read-write open brings lagging projections up to the log first.
        """
        db = Database.open(
            os.fspath(path), readonly=readonly, synchronous=synchronous,
            busy_timeout_ms=busy_timeout_ms, vfs=vfs,
        )
        ledger = cls(db, clock or time.time_ns)
        if not readonly:
            try:
                catch_up(db, ledger._log)
            except BaseException:
                db.close()
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
    ) -> Ledger:
        """Create a ledger (parent directories included), or open the one already there.

        `ledger.created` tells which happened.
        """
        db, created = Database.create(
            os.fspath(path), synchronous=synchronous, busy_timeout_ms=busy_timeout_ms, vfs=vfs
        )
        ledger = cls(db, clock or time.time_ns, created)
        if not created:
            catch_up(db, ledger._log)
        return ledger

    @property
    def path(self) -> str:
        return self._db.path

    @property
    def readonly(self) -> bool:
        return self._db.readonly

    @property
    def ledger_id(self) -> str:
        return self._db.meta("ledger_id")

    def close(self) -> None:
        self._db.close()

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
        return self._log.append([event])[0]

    def append_batch(self, events: Sequence[Event]) -> list[RecordedEvent]:
        """Append many events in one transaction: all of them are written, or none."""
        return self._log.append(list(events))

    # -- reading ---------------------------------------------------------------------

    def head(self) -> Head:
        """The chain head (seq and hash); record it elsewhere to detect a cut-off tail."""
        with self._db.snapshot():
            return self._log.head()

    def read(
        self,
        after_seq: int = 0,
        *,
        step: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events after `after_seq` in seq order, optionally one step's or one kind's."""
        if kind is not None and kind not in KINDS:
            raise InvalidInput(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        if step is not None:
            check_step_id(step)
        return self._log.read(after_seq, step=step, kind=kind, limit=limit)

    def steps(self, state: str | None = None) -> list[StepRow]:
        """Every step's current state (optionally only those in `state`), oldest first."""
        return read_steps(self._db, self._log, state=state)

    def step(self, step_id: str) -> StepRow:
        """One step's current state; UnknownStep if it has no events."""
        check_step_id(step_id)
        rows = read_steps(self._db, self._log, step_id=step_id)
        if not rows:
            raise UnknownStep(step_id)
        return rows[0]

    def timeline(self, step_id: str) -> list[RecordedEvent]:
        """Every event of one step, in order; UnknownStep if it has none."""
        check_step_id(step_id)
        with self._db.snapshot():
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
        with self._db.snapshot() as conn:
            cp = checkpoint(conn)
            head = self._log.head().seq
        return head if cp.version != STEPS_VERSION else max(0, head - cp.last_seq)

    # -- maintenance -----------------------------------------------------------------

    def rebuild(self, progress: Progress | None = None) -> int:
        """Refold every projection from the events, atomically; return the step count."""
        return rebuild(self._db, self._log, progress)

    def verify(
        self, *, expect_head: Head | str | None = None, progress: Progress | None = None
    ) -> VerifyReport:
        """Check integrity, the hash chain, seq density and projections. Writes nothing."""
        if isinstance(expect_head, str):
            expect_head = Head.parse(expect_head)
        return verify(self._db, self._log, expect_head=expect_head, progress=progress)

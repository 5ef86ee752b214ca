"""Failure classification for a step executor: what to do after a step raised.

Every failure is one of four outcomes, each with one action:

    transient      retry with bounded exponential backoff, under a new lease
    deterministic  stop, with the evidence: the same input fails the same way
    ambiguous      reconcile external state (read the ledger and the workspace)
                   before any retry: the effect may or may not have happened
    irreversible   ask a human; recorded, not retried

`classify` maps an exception to a `Classified` (outcome, one-line reason, evidence).
A step marked irreversible or authority-expanding (it touches something outside the
workspace: a deploy, a payment, a permission grant) is irreversible whatever it
raised. A storage failure or a timeout raised by a COMMIT that was attempted is
ambiguous, not transient: the commit may have been durable, and only the journal
says. An exception nothing here knows is ambiguous: an unknown failure is never
guessed safe to retry.

`retry_transient` runs a callable and retries it only while its failures classify
as transient, sleeping `Backoff.delays` between attempts (``sleep`` is injected, so
tests never sleep); any other outcome re-raises at once, and the last failure is
re-raised when the attempts run out.
"""

from __future__ import annotations

import errno
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, TypeVar

from .errors import (
    BlobCorrupt,
    BlobNotFound,
    CompensationWindowClosed,
    CorruptLedger,
    EnvironmentFailure,
    HeadMismatch,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerBusy,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    ManifestConflict,
    NotALedger,
    ReadOnlyLedger,
    ReplanRefused,
    StaleEpoch,
    StorageFailure,
    UnknownStep,
    UnknownWorkspace,
    Unsettled,
)

T = TypeVar("T")


class Outcome(StrEnum):
    TRANSIENT = "transient"
    DETERMINISTIC = "deterministic"
    AMBIGUOUS = "ambiguous"
    IRREVERSIBLE = "irreversible"


ACTIONS: Final[dict[Outcome, str]] = {
    Outcome.TRANSIENT: "retry with backoff under a new lease",
    Outcome.DETERMINISTIC: "stop; fix the input or the plan",
    Outcome.AMBIGUOUS: "reconcile: read the ledger and the workspace before retrying",
    Outcome.IRREVERSIBLE: "ask a human; recorded, not retried",
}

STORAGE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EIO})
"""Raw OSError errnos treated like a StorageFailure."""

_DETERMINISTIC: Final[tuple[type[BaseException], ...]] = (
    InvalidInput,  # includes PathEscapes
    IllegalTransition,
    IdempotencyConflict,
    ManifestConflict,
    ReplanRefused,
    CompensationWindowClosed,
    UnknownStep,
    UnknownWorkspace,
    CorruptLedger,
    BlobCorrupt,
    NotALedger,
    # Not a usable ledger, or history rolled back: retrying cannot change the answer.
    LedgerNotFound,
    LedgerTooNew,
    ReadOnlyLedger,
    HeadMismatch,
)

_SCALARS: Final = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Classified:
    """The verdict on one failure. `retry` and `needs_human` follow from `outcome`."""

    outcome: Outcome
    reason: str
    retry: bool
    needs_human: bool
    evidence: dict[str, object] = field(hash=False)
    action: str


def _evidence(exc: BaseException) -> dict[str, object]:
    cls = type(exc)
    ev: dict[str, object] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc),
    }
    if isinstance(exc, LedgerError):
        ev["exit_code"] = exc.exit_code
    if isinstance(exc, OSError) and exc.errno is not None:
        ev["errno"] = errno.errorcode.get(exc.errno, exc.errno)
    fields = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in vars(exc).items()
        if not k.startswith("_") and k != "cli_message"  # (the command line's words: not a fact)
        and (
            isinstance(v, _SCALARS)
            or (isinstance(v, list | tuple) and all(isinstance(x, _SCALARS) for x in v))
        )
    }
    if fields:
        ev["fields"] = fields
    cause = exc.__cause__
    if cause is None and not exc.__suppress_context__:
        cause = exc.__context__
    if cause is not None:
        ev["cause"] = f"{type(cause).__name__}: {cause}"
    return ev


def _verdict(outcome: Outcome, reason: str, exc: BaseException) -> Classified:
    return Classified(
        outcome=outcome,
        reason=f"{type(exc).__name__}: {reason}",
        retry=outcome is Outcome.TRANSIENT,
        needs_human=outcome is Outcome.IRREVERSIBLE,
        evidence=_evidence(exc),
        action=ACTIONS[outcome],
    )


def classify(
    exc: BaseException, *, irreversible: bool = False, commit_attempted: bool = False
) -> Classified:
    """Classify `exc` raised by a step.

    `irreversible`: the step is marked irreversible or authority-expanding.
    `commit_attempted`: the failure came from (or after) a COMMIT, which may have
    been durable.
    """
    if irreversible:
        return _verdict(
            Outcome.IRREVERSIBLE,
            "the step is irreversible or authority-expanding; a human decides",
            exc,
        )
    maybe_durable = "a commit was attempted and may have been durable; read the journal"
    if isinstance(exc, LedgerBusy):
        return _verdict(Outcome.TRANSIENT, "the ledger is locked by another writer", exc)
    if isinstance(exc, LeaseHeld):
        return _verdict(Outcome.TRANSIENT, "another holder's lease is live", exc)
    if isinstance(exc, StaleEpoch):
        return _verdict(Outcome.TRANSIENT, "lost the lease; retry under a new lease", exc)
    if isinstance(exc, Unsettled):
        return _verdict(
            Outcome.AMBIGUOUS, "attempts of an older epoch must be settled first", exc
        )
    if isinstance(exc, BlobNotFound):
        return _verdict(
            Outcome.TRANSIENT, "a blob is missing; re-store the blob, then retry", exc
        )
    if isinstance(exc, _DETERMINISTIC):
        return _verdict(Outcome.DETERMINISTIC, "the same input fails the same way", exc)
    if isinstance(exc, StorageFailure | EnvironmentFailure):
        if commit_attempted:
            return _verdict(Outcome.AMBIGUOUS, f"storage failed; {maybe_durable}", exc)
        return _verdict(Outcome.TRANSIENT, "the environment failed before any commit", exc)
    if isinstance(exc, TimeoutError | ConnectionError):
        if commit_attempted:
            return _verdict(Outcome.AMBIGUOUS, f"timed out or disconnected; {maybe_durable}", exc)
        return _verdict(Outcome.TRANSIENT, "timed out or disconnected before any commit", exc)
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        name = errno.errorcode[exc.errno]  # type: ignore[index]
        if commit_attempted:
            return _verdict(Outcome.AMBIGUOUS, f"{name}; {maybe_durable}", exc)
        return _verdict(Outcome.TRANSIENT, f"{name} before any commit", exc)
    return _verdict(
        Outcome.AMBIGUOUS, "unknown failure; never assumed safe to retry", exc
    )


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"Backoff.{name}={value!r} is not a finite number; give one")
    return float(value)


@dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff: `attempts` calls in all, so ``attempts - 1`` delays.

    Delay ``i`` is ``min(max_s, base_s * factor**i)``, scaled by a uniform factor in
    ``[1 - jitter, 1 + jitter]`` and clamped to ``[0, max_s]``.
    """

    base_s: float = 0.05
    factor: float = 2.0
    max_s: float = 5.0
    attempts: int = 6
    jitter: float = 0.1

    def __post_init__(self) -> None:
        base_s = _number("base_s", self.base_s)
        factor = _number("factor", self.factor)
        max_s = _number("max_s", self.max_s)
        jitter = _number("jitter", self.jitter)
        if base_s < 0:
            raise InvalidInput(f"Backoff.base_s={base_s!r} is negative; give a delay >= 0")
        if factor < 1:
            raise InvalidInput(
                f"Backoff.factor={factor!r} would shrink the delays; give a factor >= 1"
            )
        if max_s < base_s:
            raise InvalidInput(
                f"Backoff.max_s={max_s!r} is below base_s={base_s!r}; give max_s >= base_s"
            )
        if not 0 <= jitter <= 1:
            raise InvalidInput(
                f"Backoff.jitter={jitter!r} is not a fraction; give 0 <= jitter <= 1"
            )
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise InvalidInput(
                f"Backoff.attempts={self.attempts!r} is not an integer; give an int >= 1"
            )
        if self.attempts < 1:
            raise InvalidInput(
                f"Backoff.attempts={self.attempts!r} allows no call; give an int >= 1"
            )

    def delays(self, rng: random.Random | None = None) -> list[float]:
        """The ``attempts - 1`` sleeps between calls; the same for the same `rng` state."""
        rng = rng if rng is not None else random.Random()
        out: list[float] = []
        delay = float(self.base_s)
        for _ in range(self.attempts - 1):
            jittered = delay * (1 + rng.uniform(-self.jitter, self.jitter)) if self.jitter else delay
            out.append(min(float(self.max_s), max(0.0, jittered)))
            delay = min(float(self.max_s), delay * self.factor)  # capped: never overflows
        return out


def retry_transient(
    fn: Callable[[], T],
    *,
    backoff: Backoff = Backoff(),
    sleep: Callable[[float], object] = time.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, Classified], None] | None = None,
    renew: Callable[[], None] | None = None,
    commit_attempted: bool = False,
) -> T:
    """Call `fn`, retrying while its failures classify as transient.

    At most ``backoff.attempts`` calls. After transient failure number ``n`` (from 1):
    ``on_retry(n, classified)``, sleep the n-th delay, then ``renew()`` (e.g. acquire a
    new lease) just before the next call, so the backoff does not age the new lease. A
    `renew` that raises counts as that attempt's failure and is classified the same
    way. A failure of any other outcome is re-raised at once, unchanged; when the
    attempts run out the last failure is re-raised.
    """
    delays = backoff.delays(rng)
    for n in range(1, backoff.attempts + 1):
        try:
            if n > 1 and renew is not None:
                renew()
            return fn()
        except Exception as exc:
            verdict = classify(exc, commit_attempted=commit_attempted)
            if verdict.outcome is not Outcome.TRANSIENT or n == backoff.attempts:
                raise
            if on_retry is not None:
                on_retry(n, verdict)
            sleep(delays[n - 1])
    raise AssertionError("unreachable: the last attempt returns or raises")


__all__ = [
    "ACTIONS",
    "STORAGE_ERRNOS",
    "Backoff",
    "Classified",
    "Outcome",
    "classify",
    "retry_transient",
]

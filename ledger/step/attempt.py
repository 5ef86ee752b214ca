"""One attempt of a step, read from its events: `Attempt`, by `read_attempt` — the one
reader every part of the library and every front end uses (``Ledger.attempt(step,
attempt)``), and what an attempt's events answer (`end_result`, `check_receipt`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import IllegalTransition, InvalidInput
from ..events import (
    Acked,
    AppliedWrite,
    BlobStored,
    Compensated,
    Compensating,
    Fenced,
    ManifestEntry,
    ManifestPublished,
    Planned,
    Rejected,
)
from ..log import EventLog
from .values import ApplyResult, Receipt, receipt_of


@dataclass(frozen=True, slots=True)
class Attempt:
    """What the ledger recorded of one attempt of a step, in log order.

    >>> from ledger import Ledger, run_step
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = run_step(ledger, "build-1", {"report.txt": b"ok\\n"})
    ...     attempt = ledger.attempt("build-1")
    >>> attempt.attempt, attempt.planned.artifacts, attempt.acked is not None
    (1, ('report.txt',), True)
    >>> [e.path for e in attempt.artifacts]
    ['report.txt']
    """

    step: str
    attempt: int
    #: The attempt's plan (None: no `planned` event — an attempt that never began).
    planned: Planned | None = None
    #: Each recorded apply, (seq, event): one, or several with the journal off.
    fenced: tuple[tuple[int, Fenced], ...] = ()
    #: The latest blob stored for each artifact path, (seq, event).
    stored: tuple[tuple[int, BlobStored], ...] = ()
    #: Each manifest revision it published, (seq, event).
    published: tuple[tuple[int, ManifestPublished], ...] = ()
    #: Its newest ack, (seq, event): the live manifest's (a supersede is acked again).
    acked: tuple[int, Acked] | None = None
    #: An undo's intent, (seq, event), recorded before it touched a file.
    compensating: tuple[int, Compensating] | None = None
    #: How it ended, (seq, event): rejected or compensated (None: not ended).
    end: tuple[int, Rejected | Compensated] | None = None

    @property
    def receipt(self) -> Receipt | None:
        """The receipt of its latest apply (None: never applied)."""
        if not self.fenced:
            return None
        seq, event = self.fenced[-1]
        return receipt_of(event, seq)

    @property
    def applied(self) -> dict[str, AppliedWrite] | None:
        """Per path, its latest recorded write (None: never applied)."""
        if not self.fenced:
            return None
        return {w.path: w for _seq, e in self.fenced for w in e.writes}

    @property
    def artifacts(self) -> tuple[ManifestEntry, ...]:
        """Per artifact path, the latest blob it stored, by path."""
        return tuple(ManifestEntry(path=e.path or "", digest=e.digest, size=e.size)
                     for _seq, e in sorted(self.stored, key=lambda s: s[1].path or ""))


def read_attempt(log: EventLog, step: str, attempt: int, *, kind: str | None = None) -> Attempt:
    """Attempt `attempt` of `step` as its events recorded it (one read of the step's
    events; `kind`: only events of that kind are read, the rest left empty — a page that
    needs only the plan reads only plans)."""
    planned: Planned | None = None
    fenced: list[tuple[int, Fenced]] = []
    stored: dict[str, tuple[int, BlobStored]] = {}
    published: list[tuple[int, ManifestPublished]] = []
    acked: tuple[int, Acked] | None = None
    compensating: tuple[int, Compensating] | None = None
    end: tuple[int, Rejected | Compensated] | None = None
    for recorded in log.read(step=step, kind=kind):
        e = recorded.event
        if getattr(e, "attempt", None) != attempt:
            continue
        if isinstance(e, Planned):
            planned = e
        elif isinstance(e, Fenced):
            fenced.append((recorded.seq, e))
        elif isinstance(e, BlobStored):
            if e.path is not None:
                stored[e.path] = (recorded.seq, e)
        elif isinstance(e, ManifestPublished):
            published.append((recorded.seq, e))
        elif isinstance(e, Acked):
            acked = (recorded.seq, e)
        elif isinstance(e, Rejected | Compensated):
            end = (recorded.seq, e)
        elif isinstance(e, Compensating):
            compensating = (recorded.seq, e)
    return Attempt(step=step, attempt=attempt, planned=planned, fenced=tuple(fenced),
                   stored=tuple(stored.values()), published=tuple(published), acked=acked,
                   compensating=compensating, end=end)


def end_result(step: str, attempt: int, ev: Attempt) -> ApplyResult:
    """The answer an ended attempt gives an apply (its rejection, or its compensation)."""
    if ev.end is None:
        raise IllegalTransition(step, attempt, "fenced", "the attempt is not over")
    end = ev.end[1]
    if isinstance(end, Rejected):
        return ApplyResult(verdict=f"rejected:{end.reason}", step=step, attempt=attempt,
                           detail=end.detail)
    return ApplyResult(verdict="compensated", step=step, attempt=attempt, receipt=ev.receipt,
                       detail=end.reason)


def check_receipt(log: EventLog, receipt: Receipt | dict[str, Any] | bytes | str) -> Receipt:
    """Parse a receipt handed back by an executor and check it against the ledger.
    (`Workspaces.check_receipt` says what it promises.)"""
    if isinstance(receipt, bytes | str):
        if not receipt.strip():
            raise InvalidInput("the receipt is empty: a 200 with an empty body moves"
                               " nothing; re-apply the step to get its receipt")
        try:
            receipt = msgspec.json.decode(receipt, type=Receipt)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise InvalidInput(f"the receipt is not a steptrail receipt: {exc}") from None
    elif isinstance(receipt, dict):
        try:
            receipt = msgspec.convert(receipt, type=Receipt)
        except msgspec.ValidationError as exc:
            raise InvalidInput(f"the receipt is not a steptrail receipt: {exc}") from None
    elif not isinstance(receipt, Receipt):
        raise InvalidInput(f"the receipt is a {type(receipt).__name__}, not a steptrail"
                           " receipt (a Receipt, its JSON text or its dict)")
    ev = read_attempt(log, receipt.step, receipt.attempt)
    match = [f for seq, f in ev.fenced if seq == receipt.seq]
    if not match or receipt_of(match[0], receipt.seq) != receipt:
        raise IllegalTransition(receipt.step, receipt.attempt, "manifest-published",
                                "the receipt does not match the apply the ledger recorded")
    return receipt


__all__ = ["Attempt", "check_receipt", "end_result", "read_attempt"]

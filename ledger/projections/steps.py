"""Step state: the attempt lifecycle as a fold over events.

`fold` is the one place the lifecycle of docs/design.md lives. The writer calls it on a
copy before it INSERTs an event (an illegal transition raises and nothing is
written); `rebuild` and the read-only catch-up call it in place over the log.
Folding is idempotent per row: an event at or below the row's `last_seq` is
skipped, so folding a tail twice cannot double-apply it.

    attempt n:  planned -> fenced -> blob-stored* -> manifest-published -> acked
                planned -> blob-stored* -> ...        (no workspace writes)
                planned -> rejected
                planned | fenced | blob-stored | manifest-published | acked -> compensated
"""

from __future__ import annotations

from typing import Final

from ..errors import IllegalTransition, StepSealed
from ..events import AnyEvent, ManifestPublished, Sealed, kinds_folded_by
from ..store.rows import (  # the step table's states and row live with the stores
    ACKED,
    COMPENSATED,
    COMPENSATING,
    ENDED,
    FENCED,
    IN_FLIGHT,
    PLANNED,
    PUBLISHED,
    REJECTED,
    SEALED,
    SETTLED,
    STATES,
    STORED,
    StepRow,
)
from .lite import SlimEvent, SlimPublished

#: Bump when the fold or the table changes: the next read-write open rebuilds.
VERSION: Final = 5  # 2: workspaces (schema v2); 3: workspace-restored; 4: settled epoch; 5: compensating
NAME: Final = "steps"

_OPEN: Final = frozenset({PLANNED, FENCED, STORED, PUBLISHED, ACKED})

# kind -> states of the latest attempt it may follow
ALLOWED_AFTER: Final[dict[str, frozenset[str]]] = {
    "fenced": frozenset({PLANNED}),
    "observed": frozenset({PLANNED}),  # an annotation: the state stays planned
    "blob-pinned": _OPEN,
    "blob-stored": _OPEN,
    "manifest-published": _OPEN,
    "acked": frozenset({PUBLISHED}),
    "compensating": _OPEN,
    "compensated": _OPEN | {COMPENSATING},
    "rejected": frozenset({PLANNED}),
}


#: The tags the steps projection folds (`KIND_SPECS`): the step transitions, each folded
#: by `fold`, and the seal (`tombstones`).
STEP_KIND_TAGS: Final = kinds_folded_by("steps")


def tombstones(event: Sealed, seq: int, time_ns: int) -> list[StepRow]:
    """The rows a `run-sealed` event leaves for its steps: a function of the event alone,
    so the inline projection (which had the steps' rows) and a rebuild (which never sees
    their archived events) agree."""
    assert event.__struct_config__.tag == "run-sealed"
    return [StepRow(step_id=s.step, run=event.sealed_run, workspace="", state=SEALED,
                    attempt=s.attempt, epoch=0, rev=0, manifest_rev=s.manifest_rev,
                    manifest_digest=None, live=False, committed_bytes=0, stored_bytes=0,
                    first_seq=seq, last_seq=seq, updated_ns=time_ns) for s in event.steps]


def fold(row: StepRow | None, event: AnyEvent | SlimEvent, seq: int, time_ns: int) -> StepRow | None:
    """Apply one event to a step's row, in place; return the row (new for `planned`).

    Raises IllegalTransition when the event does not follow from the row. Events that
    are not step transitions leave the row alone and return it.
    """
    kind = event.__struct_config__.tag
    if kind not in STEP_KIND_TAGS or kind == "run-sealed":
        return row  # not a transition (the seal's rows: `tombstones`)
    if row is not None and seq <= row.last_seq:
        return row  # already folded
    if row is not None and row.state == SEALED:
        raise StepSealed(event.step, event.attempt, kind, row.first_seq)
    # Dispatch on the kind, not the class: rebuild folds slim events (projections.lite).
    if kind == "planned":
        expected = 1 if row is None else row.attempt + 1
        if row is not None and row.state not in ENDED:
            raise IllegalTransition(
                event.step, event.attempt, kind,
                f"attempt {row.attempt} is still {row.state}; a new attempt may start only"
                " after the latest ended rejected or compensated",
            )
        if event.attempt != expected:
            raise IllegalTransition(
                event.step, event.attempt, kind, f"the next attempt is {expected}"
            )
        if row is None:
            return StepRow(
                step_id=event.step, run=event.run, workspace=event.workspace, state=PLANNED,
                attempt=event.attempt, epoch=event.epoch, rev=event.rev, manifest_rev=-1,
                manifest_digest=None, live=False, committed_bytes=0, stored_bytes=0,
                first_seq=seq, last_seq=seq, updated_ns=time_ns,
            )
        row.run, row.workspace, row.state = event.run, event.workspace, PLANNED
        row.attempt, row.epoch, row.rev, row.stored_bytes = event.attempt, event.epoch, event.rev, 0
        row.last_seq, row.updated_ns = seq, time_ns
        return row

    if row is None:
        raise IllegalTransition(event.step, event.attempt, kind, "the step was never planned")
    if event.attempt != row.attempt:
        raise IllegalTransition(
            event.step, event.attempt, kind,
            f"the latest attempt is {row.attempt} ({row.state})",
        )
    if event.workspace != row.workspace:
        # An attempt belongs to the workspace it was planned in: an event of it naming
        # another would also be decided under that other workspace's lock, not its own.
        raise IllegalTransition(
            event.step, event.attempt, kind,
            f"the attempt was planned in workspace {row.workspace!r}, not"
            f" {event.workspace!r}",
        )
    allowed = ALLOWED_AFTER[kind]
    if kind == "fenced" and not event.journal:  # type: ignore[union-attr]
        allowed = _OPEN  # the journal-off comparison mode: an apply may repeat
    if row.state not in allowed:
        raise IllegalTransition(
            event.step, event.attempt, kind,
            f"the attempt is {row.state}; {kind} may follow only "
            + " or ".join(sorted(allowed)),
        )

    if kind == "fenced":
        row.rev = event.rev  # type: ignore[union-attr]
        if row.state == PLANNED:
            row.state = FENCED
    elif kind == "blob-stored":
        row.stored_bytes += event.size  # type: ignore[union-attr]
        if row.state in IN_FLIGHT:
            row.state = STORED
    elif kind == "manifest-published":
        _check_publish(row, event)  # type: ignore[arg-type]
        row.state, row.manifest_rev, row.live = PUBLISHED, event.manifest_rev, True
        row.manifest_digest = event.digest
        row.committed_bytes = sum(e.size for e in event.writes) + sum(  # type: ignore[union-attr]
            e.size for e in event.artifacts  # type: ignore[union-attr]
        )
    elif kind == "acked":
        if event.manifest_rev != row.manifest_rev:  # type: ignore[union-attr]
            raise IllegalTransition(
                event.step, event.attempt, kind,
                f"the live manifest is revision {row.manifest_rev}, not"
                f" {event.manifest_rev}",  # type: ignore[union-attr]
            )
        row.state = ACKED
    elif kind == "compensating":
        row.state = COMPENSATING
    elif kind == "compensated":
        row.state, row.live, row.manifest_digest, row.committed_bytes = COMPENSATED, False, None, 0
        if event.rev:  # type: ignore[union-attr]
            row.rev = event.rev  # type: ignore[union-attr]
    elif kind == "rejected":
        row.state = REJECTED
    if kind not in ("compensated", "compensating"):
        # the attempt's epoch; a compensation may come from a newer epoch settling it
        row.epoch = event.epoch or row.epoch
    row.last_seq, row.updated_ns = seq, time_ns
    return row


def _check_publish(row: StepRow, event: ManifestPublished | SlimPublished) -> None:
    """The manifest compare-and-swap, as a lifecycle rule."""
    why = None
    if event.manifest_rev != row.manifest_rev + 1:
        why = f"the next manifest revision is {row.manifest_rev + 1}"
    elif event.expected_rev == -1 and row.live:
        why = f"the step already has live manifest revision {row.manifest_rev}"
    elif event.expected_rev != -1 and (not row.live or event.expected_rev != row.manifest_rev):
        live = f"revision {row.manifest_rev}" if row.live else "none"
        why = f"expected live revision {event.expected_rev}, the live one is {live}"
    elif event.expected_rev != -1 and event.supersedes != row.manifest_digest:
        why = "a supersede must name the digest of the manifest it replaces"
    elif event.expected_rev == -1 and event.supersedes is not None:
        why = "a create (expected -1) supersedes nothing"
    if why:
        raise IllegalTransition(event.step, event.attempt, "manifest-published", why)


__all__ = [
    "ACKED",
    "ALLOWED_AFTER",
    "COMPENSATED",
    "COMPENSATING",
    "ENDED",
    "FENCED",
    "IN_FLIGHT",
    "PLANNED",
    "PUBLISHED",
    "REJECTED",
    "STATES",
    "SEALED",
    "SETTLED",
    "STORED",
    "StepRow",
    "fold",
    "tombstones",
]

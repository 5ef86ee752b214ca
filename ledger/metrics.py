"""Operational metrics of a ledger: how durable, how contended, how often reconciled.

A pure, read-only computation over the event log (`Ledger.read`) and the workspace
projection (`Ledger.workspaces`): nothing is written, nothing on disk is read besides the
ledger. Time comes from the caller (`now_ns`, default the ledger's clock), so the same
ledger and the same `now_ns` always give the same numbers.

The metrics (docs/cli-json.md "metrics --json" is the contract):

- `checkpoint_age_s`: per workspace, seconds since its latest committed step (the
  latest `manifest-published` of a step writing it), and the maximum over workspaces.
- `lease_expiration_rate`: of the leases that ended, the fraction that ended by
  expiring (the next acquire came after the expiry, or none came and the lease is
  expired now) rather than by release (or by a forced takeover before expiry).
- `ambiguous_reconciliations`: crash windows reconciled from what was on disk: `fenced`
  events with ``settled=true`` (the post-image was found in place) plus compensations
  that found a pre-image already back (an ``already`` entry).
- `compensation_success_rate`: of the compensations that had workspace writes to undo,
  the fraction with no ``conflict`` entry (nothing left for a human).
- `time_to_resume_s`: for every epoch after the first, seconds from its
  `lease-acquired` to its first `fenced` event (work resumed): median and max.
- `drift`: per planned write of a workspace-writing step, the workspace rev at dispatch
  minus the write's `base_rev` (the dispatch-vs-plan drift the executor records).
- `weakened`: planned attempts an operator ran with the protection off: a fence mode
  other than ``step``, or the apply journal off (verify warns about each).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from .events import (
    Compensated,
    Fenced,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    ManifestPublished,
    Planned,
)

if TYPE_CHECKING:
    from .ledger import Ledger

NS = 1_000_000_000


class WorkspaceCheckpoint(msgspec.Struct, kw_only=True):
    workspace: str
    age_s: float | None  # None: no step writing this workspace was ever committed
    last_commit_ns: int | None
    step: str | None  # the step of that latest commit
    seq: int | None  # its manifest-published event


class CheckpointAge(msgspec.Struct, kw_only=True):
    max: float | None
    workspaces: list[WorkspaceCheckpoint]


class LeaseExpiration(msgspec.Struct, kw_only=True):
    rate: float | None  # expired / ended; None when no lease has ended
    leases: int  # lease-acquired events
    ended: int  # expired + released + preempted
    expired: int
    released: int
    preempted: int  # a forced acquire took over before the expiry, without a release
    live: int


class AmbiguousReconciliations(msgspec.Struct, kw_only=True):
    count: int  # settled_applies + already_restores
    settled_applies: int  # fenced events with settled=true
    already_restores: int  # compensated events with an "already" entry


class CompensationSuccess(msgspec.Struct, kw_only=True):
    rate: float | None  # succeeded / with_restores; None when none had writes to undo
    compensations: int  # every compensated event
    with_restores: int  # those with per-path entries (workspace writes to undo)
    succeeded: int  # ... and no "conflict" entry
    conflicted: int  # ... and at least one "conflict" entry


class TimeToResume(msgspec.Struct, kw_only=True):
    median: float | None
    max: float | None
    resumes: int  # epochs after the first that applied something
    unresumed: int  # epochs after the first with no fenced event (yet)


class Drift(msgspec.Struct, kw_only=True):
    writes: int  # planned writes of workspace-writing steps
    mean: float | None
    max: int | None
    drifted: int  # writes with drift > 0


class Weakened(msgspec.Struct, kw_only=True):
    attempts: int  # planned attempts with the fence not "step" or the journal off
    fence_plan: int
    fence_none: int
    journal_off: int


class Metrics(msgspec.Struct, kw_only=True):
    now_ns: int
    events: int
    checkpoint_age_s: CheckpointAge
    lease_expiration_rate: LeaseExpiration
    ambiguous_reconciliations: AmbiguousReconciliations
    compensation_success_rate: CompensationSuccess
    time_to_resume_s: TimeToResume
    drift: Drift
    weakened: Weakened


@dataclass
class _Lease:
    workspace: str
    epoch: int
    acquired_ns: int
    expires_ns: int
    released_ns: int | None = None
    next_acquired_ns: int | None = None
    first_fenced_ns: int | None = None


@dataclass
class _Fold:
    events: int = 0
    leases: dict[tuple[str, int], _Lease] = field(default_factory=dict)
    latest_epoch: dict[str, int] = field(default_factory=dict)
    commits: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # ws -> (ns, step, seq)
    settled_applies: int = 0
    already_restores: int = 0
    compensations: int = 0
    with_restores: int = 0
    conflicted: int = 0
    drifts: list[int] = field(default_factory=list)
    weakened: Weakened = field(default_factory=lambda: Weakened(
        attempts=0, fence_plan=0, fence_none=0, journal_off=0))


def _ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def compute(ledger: Ledger, now_ns: int | None = None) -> Metrics:
    """Every metric, over the whole log, as of `now_ns` (default: the ledger's clock)."""
    now = ledger.clock() if now_ns is None else now_ns
    f = _Fold()
    for r in ledger.read():
        f.events += 1
        ev = r.event
        if isinstance(ev, LeaseAcquired):
            prev = f.latest_epoch.get(ev.workspace)
            if prev is not None and (ev.workspace, prev) in f.leases:
                f.leases[(ev.workspace, prev)].next_acquired_ns = r.time_ns
            f.leases[(ev.workspace, ev.epoch)] = _Lease(ev.workspace, ev.epoch, r.time_ns,
                                                        ev.expires_ns)
            f.latest_epoch[ev.workspace] = ev.epoch
        elif isinstance(ev, LeaseRenewed):
            lease = f.leases.get((ev.workspace, ev.epoch))
            if lease is not None:
                lease.expires_ns = max(lease.expires_ns, ev.expires_ns)
        elif isinstance(ev, LeaseReleased):
            lease = f.leases.get((ev.workspace, ev.epoch))
            if lease is not None and lease.released_ns is None:
                lease.released_ns = r.time_ns
        elif isinstance(ev, Fenced):
            if ev.settled:
                f.settled_applies += 1
            lease = f.leases.get((ev.workspace, ev.epoch))
            if lease is not None and lease.first_fenced_ns is None:
                lease.first_fenced_ns = r.time_ns
        elif isinstance(ev, Compensated):
            f.compensations += 1
            outcomes = {x.outcome for x in ev.restored}
            if "already" in outcomes:
                f.already_restores += 1
            if ev.restored:
                f.with_restores += 1
                if "conflict" in outcomes:
                    f.conflicted += 1
        elif isinstance(ev, ManifestPublished):
            if ev.workspace:
                f.commits[ev.workspace] = (r.time_ns, ev.step, r.seq)
        elif isinstance(ev, Planned):
            if ev.workspace and ev.epoch > 0:
                f.drifts.extend(ev.rev - w.base_rev for w in ev.writes)
            if ev.fence != "step" or not ev.journal:
                wk = f.weakened
                wk.attempts += 1
                wk.fence_plan += ev.fence == "plan"
                wk.fence_none += ev.fence == "none"
                wk.journal_off += not ev.journal
    return Metrics(
        now_ns=now,
        events=f.events,
        checkpoint_age_s=_checkpoints(ledger, f, now),
        lease_expiration_rate=_leases(f, now),
        ambiguous_reconciliations=AmbiguousReconciliations(
            count=f.settled_applies + f.already_restores,
            settled_applies=f.settled_applies, already_restores=f.already_restores,
        ),
        compensation_success_rate=CompensationSuccess(
            rate=_ratio(f.with_restores - f.conflicted, f.with_restores),
            compensations=f.compensations, with_restores=f.with_restores,
            succeeded=f.with_restores - f.conflicted, conflicted=f.conflicted,
        ),
        time_to_resume_s=_resume(f),
        drift=Drift(
            writes=len(f.drifts),
            mean=statistics.fmean(f.drifts) if f.drifts else None,
            max=max(f.drifts) if f.drifts else None,
            drifted=sum(1 for d in f.drifts if d > 0),
        ),
        weakened=f.weakened,
    )


def _checkpoints(ledger: Ledger, f: _Fold, now: int) -> CheckpointAge:
    rows = []
    for ws in ledger.workspaces.list():
        commit = f.commits.get(ws.name)
        if commit is None:
            rows.append(WorkspaceCheckpoint(workspace=ws.name, age_s=None, last_commit_ns=None,
                                            step=None, seq=None))
        else:
            ns, step, seq = commit
            rows.append(WorkspaceCheckpoint(workspace=ws.name, age_s=max(0, now - ns) / NS,
                                            last_commit_ns=ns, step=step, seq=seq))
    ages = [r.age_s for r in rows if r.age_s is not None]
    return CheckpointAge(max=max(ages) if ages else None, workspaces=rows)


def _leases(f: _Fold, now: int) -> LeaseExpiration:
    expired = released = preempted = live = 0
    for lease in f.leases.values():
        if lease.released_ns is not None and lease.released_ns < lease.expires_ns:
            released += 1
        elif lease.next_acquired_ns is not None:
            if lease.next_acquired_ns >= lease.expires_ns:
                expired += 1
            else:
                preempted += 1
        elif lease.released_ns is not None or now >= lease.expires_ns:
            expired += 1  # released only after it had expired counts as expired
        else:
            live += 1
    ended = expired + released + preempted
    return LeaseExpiration(rate=_ratio(expired, ended), leases=len(f.leases), ended=ended,
                           expired=expired, released=released, preempted=preempted, live=live)


def _resume(f: _Fold) -> TimeToResume:
    samples: list[float] = []
    unresumed = 0
    for lease in f.leases.values():
        if lease.epoch <= 1:
            continue
        if lease.first_fenced_ns is None:
            unresumed += 1
        else:
            samples.append((lease.first_fenced_ns - lease.acquired_ns) / NS)
    return TimeToResume(
        median=statistics.median(samples) if samples else None,
        max=max(samples) if samples else None,
        resumes=len(samples), unresumed=unresumed,
    )


__all__ = [
    "AmbiguousReconciliations",
    "CheckpointAge",
    "CompensationSuccess",
    "Drift",
    "LeaseExpiration",
    "Metrics",
    "TimeToResume",
    "WorkspaceCheckpoint",
    "compute",
]

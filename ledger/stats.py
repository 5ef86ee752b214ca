"""`steptrail stats`: what a ledger holds, where its bytes are, how it grew.

Read-only. Everything comes from one read transaction of the ledger (events grouped by
run and kind, by time bucket; the step rows) plus the blob accounting `audit` does
(without re-hashing): so the figures agree with each other and with `audit`.

- **events** by kind and in all, with their bytes (payload, journal key and the two
  hashes of each row: what sealing a run takes out of the ledger file);
- **steps** by state, **runs** with their steps, states, events, bytes and time span;
- **blobs**: inline rows and files, and how `audit` buckets them (referenced, pinned,
  orphans, temporary files);
- **growth**: events and bytes per hour, day or week;
- **sealable**: the runs `ledger.seal` could seal now (every step settled — acked,
  compensated or rejected — no pin held, no workspace written, not sealed yet), and
  what sealing them would take out of the ledger file. Steps recorded without a run
  are never sealable (a seal archives whole runs).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import msgspec

from .errors import InvalidInput

if TYPE_CHECKING:
    from .ledger import Ledger

#: Growth buckets `--by` accepts, in nanoseconds.
BUCKETS: Final = {"hour": 3600 * 10**9, "day": 86400 * 10**9, "week": 7 * 86400 * 10**9}


class Count(msgspec.Struct, kw_only=True):
    count: int = 0
    bytes: int = 0


class RunStats(msgspec.Struct, kw_only=True):
    run: str
    steps: int = 0
    states: dict[str, int] = msgspec.field(default_factory=dict)
    events: int = 0
    event_bytes: int = 0
    committed_bytes: int = 0  # bytes its live manifests name
    first_ns: int = 0
    last_ns: int = 0
    settled: bool = False  # sealable now (ledger.seal.sealable)
    why_not: str | None = None  # why it may not be sealed now (None: it may)
    held: bool = False  # the run, or one of its steps, is held (`steptrail hold`)


class Growth(msgspec.Struct, kw_only=True):
    start_ns: int
    events: int
    bytes: int


class HoldStats(msgspec.Struct, kw_only=True):
    """A hold in force (`ledger.holds`)."""

    scope: str
    target: str
    reason: str
    by: str
    seq: int


class StatsReport(msgspec.Struct, kw_only=True):
    path: str
    file_bytes: int  # the ledger file and its -wal on disk now
    head_seq: int
    events: Count
    by_kind: dict[str, Count]
    steps: int
    by_state: dict[str, int]
    #: per state, the bytes its steps' latest attempts stored (blobs, each as named)
    bytes_by_state: dict[str, int]
    #: per state, the bytes its committed steps' manifests reference (inline artifacts
    #: too: a step committed in one commit stores no blob file, its bytes are still there)
    committed_bytes_by_state: dict[str, int] = msgspec.field(default_factory=dict)
    runs_total: int
    runs: list[RunStats]  # the largest first (`top` of them; all with top=0)
    blobs: dict[str, Count]  # inline, files, and audit's buckets
    bucket: str
    growth: list[Growth]
    sealable: Count  # events and their bytes in settled runs
    sealable_runs: int
    #: the runs that may not be sealed now, by cause (`ledger.seal.RunCandidate.cause`):
    #: unsettled, live-thread, workspace, pinned, sealed
    not_sealable: dict[str, int] = msgspec.field(default_factory=dict)
    #: the holds in force, oldest first
    holds: list[HoldStats] = msgspec.field(default_factory=list)
    #: workspace file versions a retention policy released (`history-released`)
    history_released: int = 0

    def as_dict(self) -> dict[str, object]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


def stats(ledger: Ledger, *, by: str = "day", top: int = 20) -> StatsReport:
    """The ledger's figures (see the module docstring). `by`: hour, day or week; `top`:
    how many runs to list, largest first (0: every run)."""
    if by not in BUCKETS:
        raise InvalidInput(f"--by {by!r} is not a bucket; use one of {', '.join(BUCKETS)}")
    if not isinstance(top, int) or isinstance(top, bool) or top < 0:
        raise InvalidInput(f"top {top!r} must be a whole number >= 0 (0 lists every run)")
    from .gc.audit import audit

    with ledger.storage.read() as view:
        head = view.head().seq
        by_run, by_time = view.event_totals(BUCKETS[by])
        rows = view.steps()
    runs: dict[str, RunStats] = {}
    by_kind: dict[str, Count] = {}
    total = Count()
    for run, kind, n, nbytes, t0, t1 in by_run:
        r = runs.setdefault(run, RunStats(run=run, first_ns=t0, last_ns=t1))
        r.events += n
        r.event_bytes += nbytes
        r.first_ns, r.last_ns = min(r.first_ns, t0), max(r.last_ns, t1)
        k = by_kind.setdefault(kind, Count())
        k.count += n
        k.bytes += nbytes
        total.count += n
        total.bytes += nbytes
    by_state: dict[str, int] = {}
    bytes_by_state: dict[str, int] = {}
    committed_by_state: dict[str, int] = {}
    for row in rows:
        by_state[row.state] = by_state.get(row.state, 0) + 1
        bytes_by_state[row.state] = bytes_by_state.get(row.state, 0) + row.stored_bytes
        committed_by_state[row.state] = committed_by_state.get(row.state, 0) + (
            row.committed_bytes if row.live else 0)
        r = runs.setdefault(row.run, RunStats(run=row.run))
        r.steps += 1
        r.states[row.state] = r.states.get(row.state, 0) + 1
        r.committed_bytes += row.committed_bytes if row.live else 0
    # What sealing would take out: the runs `ledger.seal` would seal now (every step
    # settled, no pin held, no workspace written, not sealed yet), with their events'
    # bytes as counted here.
    from .seal import sealable as seal_candidates

    candidates = {c.run: c for c in seal_candidates(ledger).runs}
    sealable, sealable_runs = Count(), 0
    not_sealable: dict[str, int] = {}
    for r in runs.values():
        c = candidates.get(r.run)
        r.settled = c is not None and c.sealable
        if c is None:  # steps recorded without a run
            r.why_not = "steps recorded without a run are never sealed"
            not_sealable["no-run"] = not_sealable.get("no-run", 0) + 1
        elif not c.sealable:
            r.why_not = c.why
            cause = c.cause or "other"
            not_sealable[cause] = not_sealable.get(cause, 0) + 1
        if r.settled:
            sealable_runs += 1
            sealable.count += r.events
            sealable.bytes += r.event_bytes
    holds = ledger.holds()
    held_steps = {h.target for h in holds if h.scope == "step"}
    held_runs = {h.target for h in holds if h.scope == "run"}
    for row in rows:
        if row.step_id in held_steps:
            held_runs.add(row.run)
    for r in runs.values():
        r.held = r.run in held_runs
    from .retention import released_keys

    report = audit(ledger)
    blobs = {name: Count(count=b.count, bytes=b.bytes) for name, b in (
        ("inline", report.inline), ("files", report.files), ("referenced", report.referenced),
        ("pinned", report.pinned), ("orphan_young", report.orphan_young),
        ("orphan_old", report.orphan_old), ("temporary", report.temporary))}
    listed = sorted(runs.values(), key=lambda r: (-r.event_bytes, r.run))
    file_bytes = sum(os.path.getsize(p) for p in (ledger.path, ledger.path + "-wal")
                     if os.path.exists(p))
    return StatsReport(
        path=ledger.path, file_bytes=file_bytes, head_seq=head, events=total,
        by_kind=dict(sorted(by_kind.items())), steps=len(rows),
        by_state=dict(sorted(by_state.items())),
        bytes_by_state=dict(sorted(bytes_by_state.items())),
        committed_bytes_by_state=dict(sorted(committed_by_state.items())), runs_total=len(runs),
        runs=listed[:top] if top else listed, blobs=blobs, bucket=by,
        growth=[Growth(start_ns=t, events=n, bytes=b) for t, n, b in by_time],
        sealable=sealable, sealable_runs=sealable_runs,
        not_sealable=dict(sorted(not_sealable.items())),
        holds=[HoldStats(scope=h.scope, target=h.target, reason=h.reason, by=h.by, seq=h.seq)
               for h in holds],
        history_released=len(released_keys(ledger)),
    )


__all__ = ["BUCKETS", "Count", "Growth", "HoldStats", "RunStats", "StatsReport", "stats"]

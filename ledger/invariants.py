"""Log-level checkers for the fence, journal and epoch invariants (I3, I4, I5).

Each checker replays the events in seq order and names every event that breaks its
invariant. They need nothing but the log — the workspace revisions and the leases
are folded from it, and lease expiry is judged by each event's own `time_ns`, the
time the writer judged it by — so `verify` runs them on any ledger, and the fault
tests run them after every injected crash. What the log cannot show (the bytes that
were on disk at apply time) the fuzz harness checks against its shadow of the disk.

- I3 fence: every write applied by an attempt planned with ``fence="step"`` saw its
  planned base_rev as the path's rev (``fence="plan"``: the workspace rev as the
  plan's rev); every compensation restored a path only where the path's rev was
  still the attempt's. (``fence="none"`` is the comparison mode that fences
  nothing; its attempts are not judged.)
- I4 journal: at most one apply per ``(workspace, step, attempt)`` for attempts that
  use the journal.
- I5 epochs: every effect of a writing step (an event with a workspace and an epoch)
  carries the workspace's live epoch at its time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .events import (
    Acked,
    Compensated,
    Fenced,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    Planned,
    RecordedEvent,
    Rejected,
    StepEvent,
)


@dataclass(frozen=True)
class Breach:
    invariant: str  # "I3", "I4", "I5"
    seq: int
    message: str


@dataclass
class _Lease:
    epoch: int = 0
    expires_ns: int = 0
    released: bool = False

    def live(self, now_ns: int) -> int | None:
        if self.epoch == 0 or self.released or now_ns >= self.expires_ns:
            return None
        return self.epoch


@dataclass
class _Plan:
    """What the checks need of an attempt's plan, kept while it may still be applied or
    compensated as planned: from `planned` to its ack or end."""

    journal: bool
    fence: str
    plan_rev: int
    bases: dict[str, int]
    first_apply: int = 0  # seq of its first `fenced` (0: none yet)
    applied: dict[str, int] = field(default_factory=dict)  # path -> rev its writes left


@dataclass
class _State:
    """Bounded by the live attempts (`plans`), the workspaces and their paths — not by
    the events: an attempt's plan is dropped when it is acked or ends."""

    plans: dict[tuple[str, int], _Plan] = field(default_factory=dict)
    #: (workspace, path) -> (rev, step, attempt) of the event that last set the path's rev
    #: (a compensation's restore: step "")
    path_rev: dict[tuple[str, str], tuple[int, str, int]] = field(default_factory=dict)
    ws_rev: dict[str, int] = field(default_factory=dict)
    leases: dict[str, _Lease] = field(default_factory=dict)


class Checker:
    """Feed events in seq order; `breaches` accumulates what they break."""

    def __init__(self) -> None:
        self.st = _State()
        self.breaches: list[Breach] = []

    def feed(self, seq: int, time_ns: int, e: object) -> None:
        st, out = self.st, self.breaches
        if isinstance(e, LeaseAcquired):
            st.leases[e.workspace] = _Lease(e.epoch, e.expires_ns)
            return
        if isinstance(e, LeaseRenewed):
            st.leases.setdefault(e.workspace, _Lease()).expires_ns = e.expires_ns
            return
        if isinstance(e, LeaseReleased):
            st.leases.setdefault(e.workspace, _Lease()).released = True
            return
        if not isinstance(e, StepEvent):
            return
        kind = type(e).__struct_config__.tag
        if e.workspace and e.epoch > 0:
            live = st.leases.get(e.workspace, _Lease()).live(time_ns)
            if live != e.epoch:
                out.append(Breach("I5", seq, f"{kind} of step {e.step!r} attempt {e.attempt}"
                                  f" under epoch {e.epoch}, live epoch was {live}"))
        if isinstance(e, Planned):
            st.plans[(e.step, e.attempt)] = _Plan(
                e.journal, e.fence, e.plan_rev if e.plan_rev is not None else e.rev,
                {w.path: w.base_rev for w in e.writes})
        elif isinstance(e, Fenced):
            _check_fenced(st, seq, e, out)
        elif isinstance(e, Compensated):
            _check_compensated(st, seq, e, out)
            st.plans.pop((e.step, e.attempt), None)
        elif isinstance(e, Acked | Rejected):
            # acked: a later compensation is judged by the paths' own state (`path_rev`);
            # rejected: the attempt is over
            st.plans.pop((e.step, e.attempt), None)


def check(events: Iterable[RecordedEvent]) -> list[Breach]:
    """Every breach of I3, I4 and I5 in the log, in seq order."""
    checker = Checker()
    for r in events:
        checker.feed(r.seq, r.time_ns, r.event)
    return checker.breaches


def _check_fenced(st: _State, seq: int, e: Fenced, out: list[Breach]) -> None:
    plan = st.plans.get((e.step, e.attempt))
    ws = e.workspace
    if plan is not None and plan.journal:
        if plan.first_apply:
            out.append(Breach("I4", seq, f"step {e.step!r} attempt {e.attempt} applied again"
                              f" (first at #{plan.first_apply})"))
        else:
            plan.first_apply = seq
    if plan is not None and plan.fence == "plan":
        if st.ws_rev.get(ws, 0) != plan.plan_rev:
            out.append(Breach("I3", seq, f"step {e.step!r} attempt {e.attempt} applied at"
                              f" workspace rev {st.ws_rev.get(ws, 0)}, its plan was admitted"
                              f" at rev {plan.plan_rev}"))
    if plan is not None and plan.fence == "step":
        bases = plan.bases
        for w in e.writes:
            now = st.path_rev.get((ws, w.path), (0, "", 0))[0]
            if w.path not in bases:
                out.append(Breach("I3", seq, f"step {e.step!r} applied {w.path}, which its"
                                  " plan does not write"))
            elif now != bases[w.path]:
                out.append(Breach("I3", seq, f"step {e.step!r} attempt {e.attempt} wrote"
                                  f" {w.path} at rev {now}, planned against rev {bases[w.path]}"))
    for w in e.writes:
        st.path_rev[(ws, w.path)] = (w.rev, e.step, e.attempt)
        if plan is not None:
            plan.applied[w.path] = w.rev
    st.ws_rev[ws] = max(st.ws_rev.get(ws, 0), e.rev)


def _check_compensated(st: _State, seq: int, e: Compensated, out: list[Breach]) -> None:
    ws = e.workspace
    plan = st.plans.get((e.step, e.attempt))
    for r in e.restored:
        if r.outcome == "conflict":
            continue
        now, step, attempt = st.path_rev.get((ws, r.path), (0, "", 0))
        if plan is not None:  # in flight: what it applied, or (never recorded) its base
            expected = plan.applied.get(r.path, plan.bases.get(r.path))
            bad, left = expected is None or now != expected, f"rev {expected}"
        else:  # acked (or never planned): its own write must still be the path's latest
            bad, left = (step, attempt) != (e.step, e.attempt), "another rev"
        if bad:
            out.append(Breach("I3", seq, f"compensation of step {e.step!r} attempt {e.attempt}"
                              f" restored {r.path} at rev {now}, the attempt left it at {left}"))
        st.path_rev[(ws, r.path)] = (r.rev, "", 0)
    if e.rev:
        st.ws_rev[ws] = max(st.ws_rev.get(ws, 0), e.rev)


__all__ = ["Breach", "Checker", "check"]

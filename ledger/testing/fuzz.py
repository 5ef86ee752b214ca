"""`steptrail fuzz`: interleaving search over the fence protocol (docs/design.md "Fence modes").

A fixed plan of four chained steps over two files is driven, one op at a time, by a
schedule that mixes the main line (``advance``) with the ordinary interferences of an
agent's life — a human edit, a preempted sandbox, a blind client retry, a re-route to
another model that re-plans, a duplicate delivery, a late receipt from a zombie. Every
schedule runs against a real temporary workspace directory and a real ledger; after
every op the checkers fold the ledger's new events, together with a shadow of the disk
the harness maintains (it knows every untracked edit it made) and compare it with the
true disk:

- **P1** every applied write (`fenced`) saw, at apply time, its path at the planned
  base rev and the disk at the planned pre_hash (a write recorded ``settled`` that found
  its post-image already on disk is fine: a crash replayed).
- **P2** one apply journal key ``(workspace, step, attempt)``, at most one `fenced`;
  and a duplicate delivery never changes the workspace.
- **P3** no content is replaced by a write — or a compensation's restore — planned
  against an older revision than the path's current one.
- **I5** every effect of a writing step (fenced, blob-pinned, blob-stored,
  manifest-published, acked, compensated) carries the epoch that was live at its time,
  replayed from the lease events; and a zombie's late receipt moves nothing.
- **I6/I7** at the end of each schedule `Ledger.verify()` is ok (projections equal a
  rebuild, the chain verifies).

Per event the most specific diagnosis is named first (a second application of one key
is P2 even though it also fails P1); the others are listed in `Violation.also`.

With the fences on no schedule may violate anything. With ``fence="none"`` the search
finds a lost update and `shrink` reduces it to a 1-minimal op list (removing any single
op makes the violation disappear), which tests/step/test_fuzz.py keeps as a regression test.

An op is a name from `OPS`, optionally with arguments after colons; `schedule` always
emits the fully specified form, so an op list alone replays exactly (and shrinking one
op never changes what another means):

- ``human_edit:<a.py|b.py>:<disk|ledger|same>`` — an untracked edit on disk (``h<k>``),
  an edit through steptrail (a step planned from `snapshot`, applied, published,
  acked), or an untracked edit writing exactly the content the agent's next planned
  write to that file would (``same``: settling must not mistake it for the agent's own
  unrecorded rename);
- ``replan:<restamp|fresh>`` — `ledger.workspaces.replan` (falls back to fresh when a pre_hash no
  longer holds), or a new plan from `snapshot` with new content.

Bare ``human_edit`` / ``replan`` draw their arguments from ``random.Random(seed)``.

This module imports no click; the CLI wires `run` (see `FuzzReport.as_dict`).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self

from .. import (AppliedWrite, ApplyResult, IdempotencyConflict, InvalidInput, Ledger, Planned,
               PlannedWrite, ProtocolRefused, Receipt, ReplanRefused, StepPlan, Write)
from ..events import kind_of
from ..step.values import FENCE_MODES
from ..projections.steps import (
    ACKED,
    ENDED,
    FENCED,
    IN_FLIGHT,
    PLANNED,
    PUBLISHED,
    STORED,
)

OPS: Final = ("advance", "human_edit", "preempt", "retry", "replan", "duplicate_delivery",
              "late_receipt")
INTERFERENCE: Final = OPS[1:]
PROPS: Final = ("P1", "P2", "P3", "I5", "I6/I7")
#: Event kinds that are effects of a writing step (I5).
EFFECT_KINDS: Final = frozenset({"fenced", "blob-pinned", "blob-stored", "manifest-published",
                                 "acked", "compensated"})

WORKSPACE: Final = "w"
RUN: Final = "run-1"
FILES: Final = {"a.py": b"a0", "b.py": b"b0"}
#: The fixed step list: (step, path, content before, content after), admitted as one
#: chained batch (s3 is planned on s1's result, s4 on s2's).
STEPS: Final = (
    ("s1", "a.py", b"a0", b"a1"),
    ("s2", "b.py", b"b0", b"b1"),
    ("s3", "a.py", b"a1", b"a2"),
    ("s4", "b.py", b"b1", b"b2"),
)
STEP_IDS: Final = tuple(s[0] for s in STEPS)
HUMAN_MODES: Final = ("disk", "ledger", "same")
#: The human modes `schedule` draws: all of them. ``same`` (the human makes, by hand,
#: exactly the change the agent planned) found a settle bug once (see
#: tests/step/test_fuzz.py::test_settle_keeps_a_hand_edit_equal_to_an_unapplied_post_image).
SCHEDULED_HUMAN_MODES: Final = HUMAN_MODES
REPLAN_MODES: Final = ("restamp", "fresh")
LEASE_TTL_S: Final = 24 * 3600  # never expires inside a schedule: only preempt ends an epoch
SCHEDULE_LENGTH: Final = 16
START_NS: Final = 1_700_000_000_000_000_000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _short(digest: str | None) -> str:
    return "absent" if digest is None else digest[:8]


class FakeClock:
    """Deterministic Unix nanoseconds: +1 µs per read (as tests/conftest.py's FakeClock;
    copied, the package never imports tests)."""

    def __init__(self, start_ns: int = START_NS, step_ns: int = 1_000) -> None:
        self.now = start_ns
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1_000_000_000)


# --- results ---------------------------------------------------------------------------


@dataclass
class Violation:
    """A property that failed: which, why, and the schedule up to (and including) the op
    after which it was found."""

    prop: str
    detail: str
    seed: int
    ops: list[str]
    also: list[str] = field(default_factory=list)  # other properties the same finding fails
    seq: int = 0  # the event that failed it (0: not an event: a disk or verify check)
    trace: list[str] = field(default_factory=list)  # per op: what the ledger answered

    def as_dict(self) -> dict[str, Any]:
        return {"property": self.prop, "detail": self.detail, "seed": self.seed,
                "ops": list(self.ops), "also": list(self.also), "seq": self.seq,
                "trace": list(self.trace)}


@dataclass
class FuzzReport:
    seeds: int
    violations: int  # seeds with at least one violation
    fence: str
    journal: bool
    first: Violation | None
    counterexample: list[str] | None  # the first violation's schedule, shrunk
    elapsed_s: float  # the search (without shrinking)
    events: int  # ledger events across all seeds
    start: int = 0
    shrink_s: float = 0.0
    counterexample_violation: Violation | None = None  # the shrunk schedule replayed
    counterexample_trace: list[str] | None = None  # ... and what each of its ops got
    by_property: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seeds": self.seeds, "violations": self.violations, "fence": self.fence,
            "journal": self.journal, "elapsed_s": round(self.elapsed_s, 3),
            "events": self.events, "start": self.start,
            "per_seed_ms": round(1000 * self.elapsed_s / self.seeds, 2) if self.seeds else 0.0,
            "by_property": dict(self.by_property),
        }
        if self.violations and self.first is not None:
            cx = self.counterexample_violation or self.first
            out.update({
                "counterexample": list(self.counterexample or self.first.ops),
                "property": self.first.prop, "detail": cx.detail, "also": list(cx.also),
                "seed": self.first.seed,
                "schedule": list(self.first.ops), "schedule_detail": self.first.detail,
                "shrink_s": round(self.shrink_s, 3),
                "trace": list(self.counterexample_trace or self.first.trace),
            })
        return out


# --- the checkers (pure: a model folded from events, testable on synthetic input) -------


@dataclass
class Model:
    """What the checkers know: plans, per-path revs and the shadow disk, the apply keys
    seen, and the leases — folded from recorded events (anything with `seq`, `time_ns`
    and `event`) and the untracked edits the harness reports (`edit`)."""

    disk: dict[tuple[str, str], str | None] = field(default_factory=dict)
    revs: dict[tuple[str, str], int] = field(default_factory=dict)
    plans: dict[tuple[str, int], Planned] = field(default_factory=dict)
    applied: dict[tuple[str, int], dict[str, AppliedWrite]] = field(default_factory=dict)
    fenced_keys: dict[tuple[str, str, int], int] = field(default_factory=dict)
    leases: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    #: who put each path's current content there: ("initial",), ("untracked",),
    #: ("fenced", step, attempt), ("restored", step, attempt), or what `edit` said
    writer: dict[tuple[str, str], tuple[object, ...]] = field(default_factory=dict)
    edits: deque[tuple[int, str, str, str | None, tuple[object, ...]]] = field(
        default_factory=deque)
    last_seq: int = 0

    def edit(self, after_seq: int, workspace: str, path: str, digest: str | None,
             writer: tuple[object, ...] = ("untracked",)) -> None:
        """A change of the disk that no event records, made after event `after_seq`.

        The model assumes no crash: an attempt's bytes reach the disk only with its
        `fenced`. A crash harness reports a rename that beat its commit as
        ``writer=("fenced", step, attempt)``."""
        self.edits.append((after_seq, workspace, path, digest, writer))

    def live_epoch(self, workspace: str, time_ns: int) -> int | None:
        lease = self.leases.get(workspace)
        if lease is None:
            return None
        epoch, expires_ns, released = lease
        return None if released or time_ns >= expires_ns else epoch

    def _planned_write(self, step: str, attempt: int, path: str) -> PlannedWrite | None:
        plan = self.plans.get((step, attempt))
        if plan is None:
            return None
        for w in plan.writes:
            if w.path == path:
                return w
        return None


def check_p1(m: Model, rec: Any) -> list[str]:
    """Each write of a `fenced` saw its planned base rev and pre_hash."""
    e = rec.event
    if kind_of(e) != "fenced":
        return []
    out = []
    for w in e.writes:
        p = m._planned_write(e.step, e.attempt, w.path)
        if p is None:
            out.append(f"#{rec.seq} {e.step}/{e.attempt} wrote {w.path}, which it never planned")
            continue
        key = (e.workspace, w.path)
        rev, disk = m.revs.get(key, 0), m.disk.get(key)
        if rev != p.base_rev:
            out.append(f"#{rec.seq} {e.step}/{e.attempt} wrote {w.path} at rev {rev}, planned"
                       f" against rev {p.base_rev}")
        # the post-image already there loses nothing: the protocol records it as found
        # (a replay after a crash), and rewriting identical bytes is no lost update
        if not (disk == p.pre_hash or disk == p.post_hash):
            out.append(f"#{rec.seq} {e.step}/{e.attempt} wrote {w.path} over content"
                       f" {_short(disk)}, planned against {_short(p.pre_hash)}")
    return out


def check_p2(m: Model, rec: Any) -> list[str]:
    """At most one `fenced` per apply key (workspace, step, attempt)."""
    e = rec.event
    if kind_of(e) != "fenced":
        return []
    first = m.fenced_keys.get((e.workspace, e.step, e.attempt))
    if first is None:
        return []
    return [(f"#{rec.seq} applies {e.step}/{e.attempt} a second time (first applied at"
             f" #{first})")]


def check_p3(m: Model, rec: Any) -> list[str]:
    """No write, and no compensation restore, replaces content at a newer revision than
    the one it was planned against."""
    e = rec.event
    kind = kind_of(e)
    out = []
    if kind == "fenced":
        for w in e.writes:
            p = m._planned_write(e.step, e.attempt, w.path)
            rev = m.revs.get((e.workspace, w.path), 0)
            if p is not None and p.base_rev < rev:
                out.append(f"#{rec.seq} {e.step}/{e.attempt} replaced {w.path} at rev {rev}"
                           f" with a write planned against rev {p.base_rev} (a lost update)")
    elif kind == "compensated":
        for r in e.restored:
            if r.outcome != "restored":
                continue
            a = m.applied.get((e.step, e.attempt), {}).get(r.path)
            key = (e.workspace, r.path)
            if a is not None:
                want_rev, want_disk = a.rev, a.post_hash
            else:  # never recorded as applied: only a rename that beat a crash may be undone
                p = m._planned_write(e.step, e.attempt, r.path)
                if p is None:
                    out.append(f"#{rec.seq} compensation of {e.step}/{e.attempt} restored"
                               f" {r.path}, which the attempt never planned")
                    continue
                want_rev, want_disk = p.base_rev, p.post_hash
                who = m.writer.get(key, ("initial",))
                if who != ("fenced", e.step, e.attempt):
                    out.append(f"#{rec.seq} compensation of {e.step}/{e.attempt}, which never"
                               f" applied, restored {r.path} over content it never wrote"
                               f" (written by {' '.join(map(str, who))})")
            rev, disk = m.revs.get(key, 0), m.disk.get(key)
            if rev != want_rev:
                out.append(f"#{rec.seq} compensation of {e.step}/{e.attempt} restored {r.path}"
                           f" at rev {rev}; the attempt's write was rev {want_rev}")
            if disk != want_disk:
                out.append(f"#{rec.seq} compensation of {e.step}/{e.attempt} restored {r.path}"
                           f" over {_short(disk)}, which it did not write ({_short(want_disk)})")
    return out


def check_i5(m: Model, rec: Any) -> list[str]:
    """An effect of a writing step carries the epoch live at its time."""
    e = rec.event
    kind = kind_of(e)
    if kind not in EFFECT_KINDS or not getattr(e, "workspace", "") or e.epoch <= 0:
        return []
    live = m.live_epoch(e.workspace, rec.time_ns)
    if live == e.epoch:
        return []
    have = "no live lease" if live is None else f"epoch {live} live"
    return [f"#{rec.seq} {kind} of {e.step}/{e.attempt} under dead epoch {e.epoch} ({have})"]


#: Per event, in this order: the first failing property is the one reported.
CHECKERS: Final[tuple[tuple[str, Callable[[Model, Any], list[str]]], ...]] = (
    ("P2", check_p2), ("P1", check_p1), ("P3", check_p3), ("I5", check_i5),
)


def fold(m: Model, rec: Any) -> None:
    """Fold one recorded event into the model (after it was checked)."""
    e = rec.event
    kind = kind_of(e)
    ws = getattr(e, "workspace", "")
    if kind == "planned":
        m.plans[(e.step, e.attempt)] = e
    elif kind == "fenced":
        for w in e.writes:
            m.revs[(ws, w.path)] = w.rev
            m.disk[(ws, w.path)] = w.post_hash
            m.writer[(ws, w.path)] = ("fenced", e.step, e.attempt)  # settled: adopted
            m.applied.setdefault((e.step, e.attempt), {})[w.path] = w
        m.fenced_keys.setdefault((ws, e.step, e.attempt), rec.seq)
    elif kind == "compensated":
        for r in e.restored:
            if r.outcome == "conflict":
                continue
            m.revs[(ws, r.path)] = r.rev
            if r.outcome == "restored":
                m.disk[(ws, r.path)] = r.digest
                m.writer[(ws, r.path)] = ("restored", e.step, e.attempt)
    elif kind == "lease-acquired":
        m.leases[ws] = (e.epoch, e.expires_ns, False)
    elif kind == "lease-renewed":
        epoch, _, released = m.leases.get(ws, (e.epoch, 0, False))
        m.leases[ws] = (epoch, e.expires_ns, released)
    elif kind == "lease-released":
        epoch, expires, _ = m.leases.get(ws, (e.epoch, 0, True))
        m.leases[ws] = (epoch, expires, True)
    m.last_seq = max(m.last_seq, rec.seq)


def _apply_edits(m: Model, before_seq: int | None) -> None:
    while m.edits and (before_seq is None or m.edits[0][0] < before_seq):
        _, ws, path, digest, writer = m.edits.popleft()
        m.disk[(ws, path)] = digest
        m.writer[(ws, path)] = writer


def check_events(m: Model, records: Iterable[Any]) -> list[tuple[str, str, int]]:
    """Check then fold each record (seq order), interleaving the untracked edits.
    Returns every finding as (property, detail, seq)."""
    found: list[tuple[str, str, int]] = []
    for rec in records:
        _apply_edits(m, rec.seq)
        for prop, checker in CHECKERS:
            found.extend((prop, d, rec.seq) for d in checker(m, rec))
        fold(m, rec)
    _apply_edits(m, None)
    return found


# --- the world --------------------------------------------------------------------------


@dataclass
class Executor:
    """A sandbox generation: its holder name and epoch. Once preempted, a zombie that
    remembers the step it was on, that attempt, and how far it believes it got."""

    name: str
    epoch: int
    step: str | None = None
    attempt: int = 0
    view: str = ""  # the attempt's state when this executor died
    receipt: Receipt | None = None
    sent: int = 0  # late effects sent so far
    last_effect: str = ""


#: A zombie's next effect, by the state it believes its attempt is in.
_ZOMBIE_NEXT: Final = {PLANNED: "apply", FENCED: "publish", STORED: "publish",
                       PUBLISHED: "ack", ACKED: "compensate"}
_ZOMBIE_AFTER: Final = {"apply": "publish", "publish": "ack", "ack": "compensate",
                        "compensate": "compensate"}


def parse_op(op: str) -> tuple[str, tuple[str, ...]]:
    """``"human_edit:a.py:disk"`` -> ("human_edit", ("a.py", "disk")); InvalidInput for
    anything that is not an op of `OPS` with valid arguments."""
    if not isinstance(op, str):
        raise InvalidInput(f"op {op!r} is not a string")
    name, *args = op.split(":")
    if name not in OPS:
        raise InvalidInput(f"op {op!r}: {name!r} is not one of {', '.join(OPS)}")
    if name == "human_edit" and args:
        if len(args) != 2 or args[0] not in FILES or args[1] not in HUMAN_MODES:
            raise InvalidInput(f"op {op!r}: give human_edit:<{'|'.join(FILES)}>:"
                               f"<{'|'.join(HUMAN_MODES)}>")
    elif name == "replan" and args:
        if len(args) != 1 or args[0] not in REPLAN_MODES:
            raise InvalidInput(f"op {op!r}: give replan:<{'|'.join(REPLAN_MODES)}>")
    elif args:
        raise InvalidInput(f"op {op!r}: {name} takes no arguments")
    return name, tuple(args)


def _tmp_parent(workdir: str | None) -> str | None:
    if workdir is not None:
        return workdir
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


class World:
    """One schedule's world: a temporary directory holding a ledger and a workspace
    (a.py = "a0", b.py = "b0"), the step list admitted under executor 1's lease, and the
    checkers' model. `do(op)` runs one op; `check()` runs the checkers over what
    happened since the last check; `close()` removes everything."""

    def __init__(self, *, fence: str = "step", journal: bool = True,
                 workdir: str | None = None, seed: int = 0) -> None:
        if fence not in FENCE_MODES:
            raise InvalidInput(f"fence {fence!r} is not one of {', '.join(FENCE_MODES)}")
        self.fence, self.journal, self.seed = fence, bool(journal), seed
        self.rng = random.Random(seed)  # only for bare human_edit / replan
        self.tmp = tempfile.mkdtemp(prefix="steptrail-fuzz-", dir=_tmp_parent(workdir))
        self.ledger: Ledger | None = None
        try:
            self.clock = FakeClock()
            self.db_path = os.path.join(self.tmp, "ledger.db")
            # Fuzzing is about the order of events, not power loss: no fsync of the
            # SQLite file (the chaos harness and the fault VFS test durability).
            self.ledger = Ledger.init(self.db_path, clock=self.clock, synchronous="OFF")
            self.root = os.path.join(self.tmp, "ws")
            os.mkdir(self.root)
            for path, content in FILES.items():
                with open(os.path.join(self.root, path), "wb") as f:
                    f.write(content)
            self.ledger.workspaces.add(WORKSPACE, self.root)
            lease = self.ledger.workspaces.acquire(WORKSPACE, "exec-1", ttl_s=LEASE_TTL_S)
            self.live = Executor("exec-1", lease.epoch)
            self.executors = 1
            self.zombies: list[Executor] = []
            self.contents = {s: new for s, _, _, new in STEPS}
            self.paths = {s: p for s, p, _, _ in STEPS}
            plans = [StepPlan(s, [Write(p, new, sha(old), None)], run=RUN)
                     for s, p, old, new in STEPS]
            out = self.ledger.workspaces.admit(WORKSPACE, self.live.epoch, plans, fence=fence,
                                    journal=self.journal)
            assert out == [None] * len(STEPS), out
            self.original: dict[str, PlannedWrite] = {}
            for rec in self.ledger.read(kind="planned"):
                ev = rec.event
                assert isinstance(ev, Planned)
                self.original[ev.step] = ev.writes[0]
            self.model = Model(disk={(WORKSPACE, p): sha(c) for p, c in FILES.items()})
            self.last_apply: tuple[str, int, int] | None = None
            self.human_k = 0
            self.replan_k = 0
            self.late_k = 0
            self.ops: list[str] = []
            self.trace: list[str] = []
            self.pending: list[tuple[str, str]] = []  # op-level findings (disk checks)
            self.closed = False
        except BaseException:
            self.close()
            raise

    # -- plumbing --------------------------------------------------------------------------

    @property
    def led(self) -> Ledger:
        assert self.ledger is not None
        return self.ledger

    def close(self) -> None:
        if getattr(self, "closed", False):
            return
        self.closed = True
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def head(self) -> int:
        return self.led.head().seq

    def read_disk(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for path in FILES:
            try:
                with open(os.path.join(self.root, path), "rb") as f:
                    out[path] = f.read()
            except FileNotFoundError:
                out[path] = None
        return out

    def kinds(self) -> list[str]:
        return [r.kind for r in self.led.read()]

    def current_step(self) -> str | None:
        """The first step of the list the client has not seen committed (acked)."""
        for s in STEP_IDS:
            if self.led.step(s).state != ACKED:
                return s
        return None

    def _next_planned_content(self, path: str) -> bytes | None:
        """The content the agent's next change to `path` would write: the post-image of
        the latest attempt of the first uncommitted step that writes it."""
        for s in STEP_IDS:
            if self.paths[s] != path:
                continue
            row = self.led.step(s)
            if row.state == ACKED:
                continue
            for rec in self.led.read(step=s, kind="planned"):
                ev = rec.event
                if isinstance(ev, Planned) and ev.attempt == row.attempt:
                    post = ev.writes[0].post_hash
                    return None if post is None else self.led.read_blob(post)
        return None

    def _apply(self, ledger: Ledger, step: str, attempt: int, epoch: int,
               executor: Executor | None) -> str:
        self.last_apply = (step, attempt, epoch)
        res: ApplyResult = ledger.workspaces.apply(step, attempt, epoch=epoch)
        if executor is not None and res.receipt is not None:
            executor.step, executor.attempt, executor.receipt = step, attempt, res.receipt
        return f"apply {step}/{attempt}@{epoch} -> {res.verdict}"

    def _commit(self, step: str, attempt: int) -> str:
        self.led.publish(step, attempt)
        self.led.ack(step, attempt)
        return f"{step}/{attempt} published, acked"

    # -- ops ---------------------------------------------------------------------------------

    def do(self, op: str) -> str:
        """Run one op; protocol refusals are outcomes, recorded in the trace."""
        name, args = parse_op(op)
        try:
            outcome = getattr(self, "op_" + name)(*args)
        except IdempotencyConflict:
            raise  # a different payload under one key: a harness (caller) bug, never expected
        except ProtocolRefused as exc:
            outcome = f"refused: {type(exc).__name__}: {str(exc).split(';')[0]}"
        self.ops.append(op)
        self.trace.append(f"{op}: {outcome}")
        return outcome

    def op_advance(self) -> str:
        step = self.current_step()
        if step is None:
            return "every step is committed"
        row = self.led.step(step)
        if row.state == PLANNED:
            return self._apply(self.led, step, row.attempt, self.live.epoch, self.live)
        if row.state in (FENCED, STORED):
            return self._commit(step, row.attempt)
        if row.state == PUBLISHED:
            self.led.ack(step, row.attempt)
            return f"{step}/{row.attempt} acked"
        return f"{step}/{row.attempt} is {row.state}: waits for a retry or a replan"

    def op_human_edit(self, path: str | None = None, mode: str | None = None) -> str:
        if path is None:
            path = self.rng.choice(sorted(FILES))
            mode = self.rng.choice(SCHEDULED_HUMAN_MODES)
        self.human_k += 1
        content = f"h{self.human_k}".encode()
        if mode == "same":
            planned = self._next_planned_content(path)
            if planned is not None:
                content = planned
            mode = "disk"
        if mode == "disk":
            after = self.head()
            with open(os.path.join(self.root, path), "wb") as f:
                f.write(content)
            self.model.edit(after, WORKSPACE, path, sha(content))
            return f"{path} := {content.decode()} on disk (untracked)"
        step = f"human-{self.human_k}"
        rev, digest = self.led.workspaces.snapshot(WORKSPACE, path)
        epoch = self.live.epoch
        out = self.led.workspaces.admit(WORKSPACE, epoch, [StepPlan(step, [Write(path, content, digest, rev)],
                                                         run="human")], fence="step", journal=True)
        if out[0] is not None:
            return f"{step} admission {out[0].verdict}"
        res = self._apply(self.led, step, 1, epoch, None)
        if not res.endswith("applied"):
            return res
        self._commit(step, 1)
        return f"{path} := {content.decode()} through steptrail ({step}, rev {rev} -> committed)"

    def op_preempt(self) -> str:
        old = self.live
        step = self.current_step() or STEP_IDS[-1]
        row = self.led.step(step)
        old.step, old.attempt, old.view = step, row.attempt, row.state
        if old.receipt is not None and (old.receipt.step, old.receipt.attempt) != (step, row.attempt):
            old.receipt = None
        self.executors += 1
        name = f"exec-{self.executors}"
        lease = self.led.workspaces.acquire(WORKSPACE, name, ttl_s=LEASE_TTL_S, force=True)
        self.live = Executor(name, lease.epoch)
        self.zombies.append(old)
        return f"epoch {lease.epoch}, settled {list(lease.settled)}"

    def op_retry(self) -> str:
        step = self.current_step()
        if step is None:
            return "nothing to retry"
        row = self.led.step(step)
        epoch = self.live.epoch
        if row.state not in ENDED:
            # a blind retry of the request in flight: the same apply again
            return self._apply(self.led, step, row.attempt, epoch, self.live)
        orig = self.original[step]
        out = self.led.workspaces.admit(WORKSPACE, epoch, [StepPlan(
            step, [Write(orig.path, self.contents[step], orig.pre_hash, orig.base_rev)], run=RUN,
        )], fence=self.fence, journal=self.journal)  # type: ignore[arg-type]
        if out[0] is not None:
            return f"retry admission {out[0].verdict}"
        return self._apply(self.led, step, self.led.step(step).attempt, epoch, self.live)

    def op_replan(self, mode: str | None = None) -> str:
        if mode is None:
            mode = self.rng.choice(REPLAN_MODES)
        step = self.current_step()
        if step is None:
            return "nothing to replan"
        row = self.led.step(step)
        epoch = self.live.epoch
        notes = []
        if row.state in IN_FLIGHT:
            # the new model abandons the old one's attempt: it ends (compensated) first
            comp = self.led.workspaces.compensate(step, row.attempt, epoch=epoch, reason="re-routed")
            notes.append(f"compensated {step}/{row.attempt} "
                         f"{[r.outcome for r in comp.restored]}")
        elif row.state not in ENDED:
            return f"{step} is {row.state}: committed, nothing to replan"
        if mode == "restamp":
            try:
                attempt = self.led.workspaces.replan(step, epoch=epoch)
                notes.append(f"re-stamped as attempt {attempt}")
                notes.append(self._apply(self.led, step, attempt, epoch, self.live))
                return "; ".join(notes)
            except ReplanRefused:
                notes.append("re-stamp refused (a pre_hash no longer holds)")
        self.replan_k += 1
        path = self.paths[step]
        rev, digest = self.led.workspaces.snapshot(WORKSPACE, path)
        content = f"{step}-r{self.replan_k}".encode()
        out = self.led.workspaces.admit(WORKSPACE, epoch, [StepPlan(step, [Write(path, content, digest, rev)],
                                                         run=RUN)],
                             fence=self.fence, journal=self.journal)  # type: ignore[arg-type]
        if out[0] is not None:
            notes.append(f"fresh plan admission {out[0].verdict}")
            return "; ".join(notes)
        notes.append(f"fresh plan {content.decode()} on rev {rev}")
        notes.append(self._apply(self.led, step, self.led.step(step).attempt, epoch, self.live))
        return "; ".join(notes)

    def op_duplicate_delivery(self) -> str:
        if self.last_apply is None:
            return "no apply was sent yet"
        step, attempt, epoch = self.last_apply
        before = self.read_disk()
        fresh = Ledger.open(self.db_path, clock=self.clock, synchronous="OFF")
        try:
            try:
                verdict = fresh.workspaces.apply(step, attempt, epoch=epoch).verdict
            except IdempotencyConflict:
                raise
            except ProtocolRefused as exc:
                verdict = f"refused: {type(exc).__name__}"
        finally:
            fresh.close()
        after = self.read_disk()
        if self.journal and verdict == "applied" and step in self.contents:
            # with the journal a redelivery returns the first result (deduped) or the
            # attempt's end; an apply it did not answer was never delivered before
            self.pending.append(("P2", (f"the journal did not answer a redelivered apply of"
                                        f" {step}/{attempt}@{epoch}: it applied")))
        if after != before:
            self.pending.append(("P2", (f"a redelivered apply of {step}/{attempt}@{epoch}"
                                        f" ({verdict}) changed the workspace: {before} -> {after}")))
        return f"redelivered apply {step}/{attempt}@{epoch} -> {verdict}"

    def op_late_receipt(self) -> str:
        notes = []
        if not self.zombies:
            notes.append(f"preempt ({self.op_preempt()})")
            zombie = self.zombies[-1]
            effect = "publish"  # the late 200: the old executor's publish arrives now
        else:
            zombie = self.zombies[self.late_k % len(self.zombies)]
            effect = (_ZOMBIE_AFTER[zombie.last_effect] if zombie.last_effect
                      else _ZOMBIE_NEXT.get(zombie.view, "apply"))
        self.late_k += 1
        zombie.sent += 1
        zombie.last_effect = effect
        step, attempt, z = zombie.step, zombie.attempt, zombie.epoch
        assert step is not None
        before_disk, before_head = self.read_disk(), self.head()
        what = f"zombie {zombie.name}@{z} {effect} {step}/{attempt}"
        try:
            if effect == "apply":
                outcome = self._apply(self.led, step, attempt, z, None)
            elif effect == "publish":
                receipt = zombie.receipt
                m = self.led.publish(step, attempt, receipt=receipt)
                outcome = f"answered with the live manifest of {m.step}/{m.attempt}"
            elif effect == "ack":
                r = self.led.ack(step, attempt)
                outcome = "deduped" if r.deduped else "acked"
            else:
                c = self.led.workspaces.compensate(step, attempt, epoch=z, reason="late")
                outcome = "deduped" if c.deduped else "compensated"
        except IdempotencyConflict:
            raise
        except ProtocolRefused as exc:
            outcome = f"refused: {type(exc).__name__}"
        after_disk, after_head = self.read_disk(), self.head()
        if after_head != before_head:
            kinds = [r.kind for r in self.led.read(before_head)]
            self.pending.append(("I5", f"{what} under dead epoch {z} was recorded: {kinds}"))
        if after_disk != before_disk:
            self.pending.append(("I5", (f"{what} under dead epoch {z} changed the workspace:"
                                        f" {before_disk} -> {after_disk}")))
        notes.append(f"{what} -> {outcome}")
        return "; ".join(notes)

    # -- checking ----------------------------------------------------------------------------

    def check(self, props: Iterable[str] | None = None) -> Violation | None:
        """Run the checkers over the events since the last check, the op-level findings
        and the shadow disk against the true disk; the first finding (of `props`)."""
        wanted = set(PROPS if props is None else props)
        findings = check_events(self.model, self.led.read(self.model.last_seq))
        op = parse_op(self.ops[-1])[0] if self.ops else ""
        findings += [(p, d, 0) for p, d in self.pending]
        self.pending = []
        true = self.read_disk()
        for path, data in true.items():
            shadow = self.model.disk.get((WORKSPACE, path))
            if (None if data is None else sha(data)) != shadow:
                prop = {"duplicate_delivery": "P2", "late_receipt": "I5"}.get(op, "P1")
                findings.append((prop, (f"{path} on disk is {data!r} but no event or untracked"
                                        f" edit accounts for it (shadow {_short(shadow)})"), 0))
                self.model.disk[(WORKSPACE, path)] = None if data is None else sha(data)
        return self._violation(findings, wanted)

    def final_check(self, props: Iterable[str] | None = None) -> Violation | None:
        """I6/I7: the projections equal a rebuild and the chain verifies."""
        wanted = set(PROPS if props is None else props)
        report = self.led.verify()
        if report.ok:
            return None
        detail = "; ".join(f"{f.check} #{f.seq}: {f.message}" for f in report.findings[:5])
        return self._violation([("I6/I7", f"verify: {detail}", 0)], wanted)

    def _violation(self, findings: list[tuple[str, str, int]], wanted: set[str]) -> Violation | None:
        findings = [f for f in findings if f[0] in wanted]
        if not findings:
            return None
        prop, detail, seq = findings[0]
        same_point = [f for f in findings if f[2] == seq]
        also = sorted({p for p, _, _ in same_point if p != prop})
        return Violation(prop=prop, detail=detail, seed=self.seed, ops=list(self.ops),
                         also=also, seq=seq, trace=list(self.trace))


# --- running ------------------------------------------------------------------------------


def schedule(seed: int, length: int = SCHEDULE_LENGTH, *,
             human_modes: Sequence[str] = SCHEDULED_HUMAN_MODES) -> list[str]:
    """The seed's op list: `length` ops, 1–8 of them interferences (drawn with
    replacement), the rest ``advance``, shuffled; arguments drawn too. Deterministic."""
    if length < 2:
        raise InvalidInput(f"a schedule needs at least 2 ops, not {length}")
    rng = random.Random(seed)
    n = rng.randint(1, min(8, length - 1))
    ops = ["advance"] * (length - n) + [rng.choice(INTERFERENCE) for _ in range(n)]
    rng.shuffle(ops)
    out = []
    for op in ops:
        if op == "human_edit":
            op = f"human_edit:{rng.choice(sorted(FILES))}:{rng.choice(tuple(human_modes))}"
        elif op == "replan":
            op = f"replan:{rng.choice(REPLAN_MODES)}"
        out.append(op)
    return out


@dataclass
class _Outcome:
    violation: Violation | None
    events: int
    kinds: list[str]
    trace: list[str]


def _run(ops: Sequence[str], *, fence: str, journal: bool, workdir: str | None, seed: int,
         props: Iterable[str] | None = None, kinds: bool = False) -> _Outcome:
    for op in ops:
        parse_op(op)  # bad input before any world is built
    wanted = None if props is None else tuple(props)
    with World(fence=fence, journal=journal, workdir=workdir, seed=seed) as world:
        violation = None
        try:
            for op in ops:
                world.do(op)
                violation = world.check(wanted)
                if violation is not None:
                    break
            else:
                violation = world.final_check(wanted)
        except Exception as exc:
            exc.add_note(f"steptrail fuzz: seed {seed}, fence {fence}, journal {journal},"
                         f" after ops {world.ops} (next {ops[len(world.ops)]!r})"
                         if len(world.ops) < len(ops) else f"seed {seed}")
            raise
        return _Outcome(violation, world.led.count(), world.kinds() if kinds else [],
                        list(world.trace))


def run_schedule(ops: Sequence[str], *, fence: str = "step", journal: bool = True,
                 workdir: str | None = None, seed: int = 0,
                 props: Iterable[str] | None = None) -> Violation | None:
    """Run one op list in a fresh world, checking after every op (and verify at the
    end); the first violation (of `props`, default all), or None."""
    return _run(ops, fence=fence, journal=journal, workdir=workdir, seed=seed,
                props=props).violation


def event_kinds(ops: Sequence[str], *, fence: str = "step", journal: bool = True,
                workdir: str | None = None, seed: int = 0) -> list[str]:
    """The kinds of every event one op list records (for determinism checks)."""
    return _run(ops, fence=fence, journal=journal, workdir=workdir, seed=seed,
                kinds=True).kinds


def trace(ops: Sequence[str], *, fence: str = "step", journal: bool = True,
          workdir: str | None = None, seed: int = 0) -> list[str]:
    """Per op, what the ledger answered (the whole list, even past a violation)."""
    with World(fence=fence, journal=journal, workdir=workdir, seed=seed) as world:
        for op in ops:
            world.do(op)
        return list(world.trace)


def shrink(ops: Sequence[str], *, fence: str = "none", journal: bool = True,
           prop: str | None = None, seed: int = 0, workdir: str | None = None,
           max_runs: int = 5000) -> list[str]:
    """Greedy delta debugging: drop chunks of ops, halving the chunk size, then single
    ops, while a violation of the same property persists (and cut each candidate at
    the op where it was found). The result is 1-minimal: removing any one op makes the
    violation disappear. ValueError if `ops` violates nothing."""
    cache: dict[tuple[str, ...], Violation | None] = {}

    def test(candidate: list[str]) -> Violation | None:
        key = tuple(candidate)
        if key not in cache:
            if len(cache) >= max_runs:
                return None
            cache[key] = run_schedule(candidate, fence=fence, journal=journal,
                                      workdir=workdir, seed=seed,
                                      props=None if prop is None else (prop,))
        return cache[key]

    first = test(list(ops))
    if first is None:
        raise ValueError("the schedule violates nothing (of the property): nothing to shrink")
    prop = prop or first.prop
    current = list(first.ops)
    granularity = 2
    while len(current) >= 2:
        size = max(1, len(current) // granularity)
        progress = False
        i = 0
        while i < len(current):
            candidate = current[:i] + current[i + size:]
            v = test(candidate) if candidate else None
            if v is not None:
                current = list(v.ops)
                progress = True
            else:
                i += size
        if progress:
            granularity = max(granularity - 1, 2)
        elif size == 1:
            break
        else:
            granularity = min(granularity * 2, len(current))
    return current


def run(seeds: int, *, fence: str = "step", journal: bool = True, start: int = 0,
        workdir: str | None = None, progress: Callable[[int, int], None] | None = None,
        shrink: bool = True, length: int = SCHEDULE_LENGTH,
        human_modes: Sequence[str] = SCHEDULED_HUMAN_MODES) -> FuzzReport:
    """Run seeds ``start .. start+seeds-1``; count the seeds with a violation; shrink the
    first one found (unless `shrink` is False)."""
    if not isinstance(seeds, int) or seeds < 0:
        raise InvalidInput(f"seeds {seeds!r} must be a non-negative integer")
    if fence not in FENCE_MODES:
        raise InvalidInput(f"fence {fence!r} is not one of {', '.join(FENCE_MODES)}")
    t0 = time.perf_counter()
    violations = events = 0
    first: Violation | None = None
    by_property: dict[str, int] = {}
    for i in range(seeds):
        seed = start + i
        out = _run(schedule(seed, length, human_modes=human_modes), fence=fence, journal=journal, workdir=workdir,
                   seed=seed)
        events += out.events
        if out.violation is not None:
            violations += 1
            by_property[out.violation.prop] = by_property.get(out.violation.prop, 0) + 1
            if first is None:
                first = out.violation
        if progress is not None:
            progress(i + 1, seeds)
    elapsed = time.perf_counter() - t0
    counterexample = None
    shrink_s = 0.0
    cx: Violation | None = None
    if first is not None:
        counterexample = list(first.ops)
        if shrink:
            t1 = time.perf_counter()
            counterexample = _shrink(first.ops, fence=fence, journal=journal, prop=first.prop,
                                     seed=first.seed, workdir=workdir)
            shrink_s = time.perf_counter() - t1
        cx = run_schedule(counterexample, fence=fence, journal=journal, workdir=workdir,
                          seed=first.seed, props=(first.prop,))
    return FuzzReport(seeds=seeds, violations=violations, fence=fence, journal=bool(journal),
                      first=first, counterexample=counterexample, elapsed_s=elapsed,
                      events=events, start=start, shrink_s=shrink_s,
                      counterexample_violation=cx,
                      counterexample_trace=None if cx is None else cx.trace,
                      by_property=by_property)


_shrink = shrink

__all__ = [
    "CHECKERS",
    "EFFECT_KINDS",
    "OPS",
    "PROPS",
    "STEPS",
    "FakeClock",
    "FuzzReport",
    "Model",
    "Violation",
    "World",
    "check_events",
    "check_i5",
    "check_p1",
    "check_p2",
    "check_p3",
    "event_kinds",
    "fold",
    "parse_op",
    "run",
    "run_schedule",
    "schedule",
    "shrink",
    "trace",
]

"""Model-based fault testing: a hypothesis state machine over the public API, with power
loss and process kill as rules, checking the invariants after every rule.

One witnessed ledger is opened through `ledger.testing.faults` (the fault-injecting VFS and
the blob-dir power-loss model: one simulated disk under the SQLite files and the blob
store). Its witness lives outside the ledger's directory and the workspace; the ledger
records where, so every open uses it, and its write after each COMMIT is one more disk
operation of the machine (a fault can land between the two: the ledger one commit ahead
of its witness, an honest crash every reopen must accept). The rules are public-API
calls of a client —

- ``append`` a planned step; ``artifact_step``: `run_step` with an inline and/or a file
  blob; ``abandoned_step``: plan, store, compensate (orphans for GC);
- ``workspace_step``: admit / apply / publish / ack under the live lease, writing
  app.py and/or lib/new.txt (created in a new directory, or deleted);
- ``compensate`` a step the client started; ``rebuild``; ``gc`` (grace 0, forced);
  ``acquire`` a new epoch (which settles the old one); ``restore_workspace`` (the
  sandbox is reclaimed: restore into a new directory, then a new epoch there);
  ``time_passes`` (25 h: the lease expires, the compensation window closes);
- hostile calls, refused every time with nothing changed: ``ledger_write`` (a plan
  writing the ledger file, its ``-wal``, a blob or the ledger's directory, with the
  bytes' own hash as pre_hash, while the workspace contains the ledger — the machine
  starts in that embedded layout, ``ws/.steptrail/g<n>/ledger.db``) and ``root_swap``
  (between steps the root is swapped for a symlink to, or replaced by, a copy of
  itself: snapshot and admit must refuse, WorkspaceMoved; then it is swapped back);
- hostile acts on the witness, between processes (the client exits cleanly first), after
  which every way in — open read-only, read-write, naming the witness, ``init`` — must be
  refused with exactly the error named and nothing under the ledger's directory or the
  witness's written: ``witness_lost`` (deleted, emptied or zero-filled: WitnessMissing;
  then the operator's ``anchor_witness`` re-anchors it in place and the run goes on under
  the new witness); ``keep_copy`` keeps a copy of the ledger's directory (the newest
  two), and ``rollback`` puts one older than the witnessed head back with the witness
  intact (WitnessMismatch, and an unforced anchor: AnchorRefused) or, ``rollback_hidden``,
  with the witness deleted or zero-filled (WitnessMissing); then the attack is undone;
- ``retry`` a call whose outcome is unknown; ``redeliver`` an acknowledged one (its
  answer was lost: it must get the first answer and change nothing, I4) —

and the faults:

- ``power_loss(model, seed)``: the machine loses power now. What the platter holds per
  `model` (unsynced writes dropped / a random subset / garbage / a prefix / torn, the
  SQLite files and the blob directory together; the workspace keeps what was done to
  it, see ledger.testing.faults "Limits") is written to a fresh directory, reopened there with the
  ordinary VFS (WAL recovery, projections caught up) and closed, and the run goes on
  over it through a fresh simulated disk whose durable baseline is that image;
- ``process_kill()``: the current `Ledger` is abandoned like a SIGKILLed process — it
  changes no file any more (every operation it still attempts fails), the page cache is
  kept (unsynced writes stay unsynced: a later power loss can still drop them), it is
  never closed — and a new `Ledger` is opened on the same files;
- every call rule also takes ``crash``: ``Crash('power'|'kill', at=k, ...)`` cuts that
  call at its k-th disk operation (power loss or kill mid-call). Its outcome is then
  unknown (Jepsen's *info*): the model accepts either, and `retry` finishes it.

The model keeps what was acknowledged (calls that returned — also one that returned
after the fault fired under it: the client saw the answer). After every rule:

- ``verify()`` is ok (integrity, hash chain, seq, projections == rebuild, I3/I4/I5, I1)
  and the chain still holds the head seen after the last acknowledged call (nothing
  acknowledged rolled back);
- acked <= present <= attempted: every acknowledged commit is still committed with the
  manifest it was answered with, its blobs readable and intact (I1); every acknowledged
  end is still an end; every acknowledged planned step exists; no step the client never
  started, no compensation or rejection of an artifact step nobody asked for, no commit
  more often than compensations allow;
- no transition twice for one attempt (I4); I9 (every committed workspace path is a
  readable blob); the epoch never goes back; the GC audit (deep) finds nothing dangling
  or corrupt and puts every byte in one bucket; the workspace directory holds what the
  ledger says once no workspace call is in doubt (a cut workspace step is not once its
  attempt ended: settled), or a recorded conflict — but not one settling should have
  taken back: the machine writes no file by hand, so the attempt's own unrecorded write,
  holding its post-image while the attempt pinned a pre-image, is its leftover; then
  too, restore's committed content is the projection's path state (but where a recorded
  conflict left a path); the checks themselves wrote nothing.

Default: 60 examples x 20 rules, derandomized (the same run every time, ~5 s; the file
~25 s). STEPTRAIL_MODEL_FULL=1: 400 examples x 40 rules, random (~2-6 min).

Negative controls (each must fail; the shrunk counterexample is printed, ``-s``): the
same machine with synchronous=OFF, with synchronous=NORMAL, and with the blob directory
fsync removed (power loss shows them); an artifact step that publishes before it stores,
with the kill as the only fault (a kill keeps the page cache: only ordering shows); a
witness check that takes a missing witness for none, and one that lets a ledger behind
its witness through (the witness rules show them).

What the machine found is kept below as explicit rule sequences, each a regression test:
a client-protocol finding, and a ledger bug (a rejected replay left the writes that had
landed before a crash in the workspace, recorded nowhere; fixed in ledger/step/).
Also kept: what it missed and a replay of a real project's history found (issue 11 item
18: settling left a file the dead attempt had created as a conflict), which the
workspace check above now catches; the honest crash between COMMIT and the witness
write, cut deterministically; and a client finding of the witnessed run (a retried
restore redid a restore its cut call had recorded).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import apsw
from ledger.testing import faults as F
import pytest

from ledger.witness_keeper import WitnessKeeper
from conftest import damage_witness
from hypothesis import HealthCheck, Phase, reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ledger import (
    BlobPinned,
    Compensated,
    CompensationWindowClosed,
    Fenced,
    IllegalTransition,
    Ledger,
    LedgerError,
    PathForbidden,
    Planned,
    Rejected,
    StepPlan,
    WorkspaceMoved,
    WorkspaceRestored,
    Write,
)
from ledger.blobs import BlobStore
from ledger.gc import collect
from ledger.projections.steps import ENDED
from ledger.workspace.restore import committed_content
from ledger.runner import run_step
from ledger.testing.broken import run_step_wrong_order
from ledger.witness import AnchorRefused, Witness, WitnessMismatch, WitnessMissing

FULL = os.environ.get("STEPTRAIL_MODEL_FULL", "") not in ("", "0")
DAY = 24 * 3600
WS_PATH = "app.py"  # exists before the first step
NEW_PATH = "lib/new.txt"  # created (in a new directory) and deleted by steps
WS_PATHS = (WS_PATH, NEW_PATH)
SWAP_PATH = "b.txt"  # swapped with app.py (each write's pre-image the other's post-image)
MOVED_PATH = "lib2/moved.txt"  # NEW_PATH moved here and back (a delete and a create)
V0 = b"v0\n"


def _bytes(tag: str, size: int) -> bytes:
    seed = hashlib.sha256(tag.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: A few contents per size class, so steps deduplicate against each other, against
#: orphans GC is about to collect and against blobs it collected.
SMALL = [_bytes(f"small-{j}", 1_500 + 100 * j) for j in range(3)]  # inline rows
LARGE = [_bytes(f"large-{j}", 70_000 + 1_000 * j) for j in range(3)]  # blob files (> 64 KiB)
WS_CONTENT = [_bytes(f"ws-small-{j}", 900 + j) for j in range(2)] + \
             [_bytes(f"ws-large-{j}", 80_000 + j) for j in range(2)]


class InvariantBroken(AssertionError):
    """An invariant of docs/design.md does not hold (the message says which)."""


class UnexpectedFailure(AssertionError):
    """A call failed although no fault was injected into it."""


# --- the simulated machine ------------------------------------------------------------


class KillableDisk(F.PowerLossDisk):
    """A `PowerLossDisk` that can also be SIGKILLed: from `kill_at` on every operation
    fails (the process is gone: it changes nothing more), but nothing is lost — the page
    cache is the truth and what was unsynced stays unsynced. `revive()` is the restart."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kill_at: int | None = None
        self.killed = False

    def tick(self, kind: str, target: str = "") -> str | None:
        if self.killed:
            raise F.PowerLost()
        if self.kill_at is not None and not self.crashed and self.ops + 1 >= self.kill_at:
            self.ops += 1
            self.trace.append(kind)
            self.targets.append(target)
            self.killed = True
            raise F.PowerLost()
        return super().tick(kind, target)

    @property
    def dead(self) -> bool:
        return self.killed or self.crashed

    def revive(self) -> None:
        self.killed, self.kill_at = False, None


class GuardedVFS(F.FaultVFS):
    """`FaultVFS` whose dead process deletes nothing either (``xDelete`` is not a counted
    operation: without this guard the abandoned connection's close could remove a
    ``-wal`` the new process needs)."""

    def xDelete(self, name: str, syncdir: bool) -> None:
        if self.disk.dead:  # type: ignore[attr-defined]
            raise apsw.exception_for(apsw.SQLITE_IOERR_DELETE)
        super().xDelete(name, syncdir)


class Crash:
    """Cut the call at its `at`-th disk operation: power loss (per `model`) or a kill."""

    __slots__ = ("at", "kind", "model", "seed")

    def __init__(self, kind: str, at: int, model: str = "drop", seed: int = 0) -> None:
        self.kind, self.at, self.model, self.seed = kind, at, model, seed

    def __repr__(self) -> str:
        if self.kind == "kill":
            return f"Crash('kill', at={self.at})"
        return f"Crash('power', at={self.at}, model={self.model!r}, seed={self.seed})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # how hypothesis prints it
        p.text(repr(self))


CRASHES = st.one_of(
    st.none(),
    st.builds(Crash, kind=st.just("power"), at=st.integers(1, 120),
              model=st.sampled_from(F.MODELS + F.EXTRA_MODELS), seed=st.integers(0, 3)),
    st.builds(Crash, kind=st.just("kill"), at=st.integers(1, 120)),
)


# --- the operations (idempotent by step id: running one again is the client's retry) ---


@dataclass
class Op:
    """One call of the client: `kind` on `step` with `args`; its fate in the model."""

    key: str
    kind: str
    step: str
    args: dict[str, Any] = field(default_factory=dict)
    acked: bool = False
    answer: str = ""  # what the acknowledged call said

    @property
    def touches_workspace(self) -> bool:
        return self.kind in ("ws", "perm", "acquire", "restore") or (self.kind == "compensate" and self.step.startswith("ws-"))


def _tree(root: str) -> dict[str, bytes]:
    """Every file under `root` with its bytes (symlinks not followed; a `-shm`, whose
    read marks a reader moves, left out)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith("-shm"):
                continue
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def _live_epoch(led: Ledger) -> int:
    epoch = led.workspaces.get("w").live_epoch(led.clock())
    if epoch is None:  # the lease expired (time_passes): a new epoch, which settles the old
        epoch = led.workspaces.acquire("w", "agent", ttl_s=DAY).epoch
    return epoch


def do_append(led: Ledger, op: Op) -> str:
    led.append(Planned(step=op.step, attempt=1, run="r"))
    return "planned"


def do_artifact(led: Ledger, op: Op) -> str:
    result = run_step(led, op.step, op.args["outputs"], run="r")
    return f"committed:{result.manifest.digest}"


def do_artifact_wrong_order(led: Ledger, op: Op) -> str:
    """THE BROKEN PROTOCOL (negative control): the manifest is published before its blobs
    are stored (`ledger.testing.broken.run_step_wrong_order`)."""
    run_step_wrong_order(led, op.step, op.args["outputs"])
    m = led.manifest(op.step)
    return f"committed:{m.digest if m is not None else '?'}"


def do_abandon(led: Ledger, op: Op) -> str:
    """An attempt that stored its blobs and died: ended by whoever knows (orphans)."""
    row = led.find_step(op.step)
    if row is not None and row.state in ENDED and not row.live:
        return "ended"
    outputs = op.args["outputs"]
    row = led.plan(op.step, run="r", artifacts=tuple(outputs))
    for path in sorted(outputs):
        led.store(op.step, row.attempt, path, outputs[path])
    led.workspaces.compensate(op.step, reason="abandoned")
    return "ended"


def do_workspace(led: Ledger, op: Op) -> str:
    epoch = _live_epoch(led)
    if led.workspaces.unsettled("w", epoch):  # an acquire died while settling: settle, then new work
        led.workspaces.settle("w", epoch)
    # Admitted every time: a step in flight or committed is left as it is when the client
    # resends the plan recorded for it (a retried admission puts back a post-image file a
    # crash lost; another plan would be refused, PlanConflict), an ended or never
    # recorded one gets a new attempt planned against what the workspace holds now.
    row = led.find_step(op.step)
    recorded = row is not None and (row.live or row.state not in ENDED)
    writes = op.args.get("plan") if recorded or op.kind == "perm" else None
    if writes is None:
        writes = []
        for i, path in enumerate(op.args["paths"]):
            rev, digest = led.workspaces.snapshot("w", path)
            content = op.args["content"]
            if content is None and digest is None:
                content = 0  # nothing to delete: create it instead
            data = None if content is None else WS_CONTENT[(content + i) % len(WS_CONTENT)]
            writes.append(Write(path, data, digest, rev))
        op.args["plan"] = writes  # what a redelivery resends
    led.workspaces.admit("w", epoch, [StepPlan(op.step, writes, run="r")])
    row = led.step(op.step)
    if not row.live:
        verdict = led.workspaces.apply(op.step, epoch=epoch).verdict
        if verdict not in ("applied", "deduped"):
            return verdict  # the fence said no: an answer, the attempt ended
        led.publish(op.step)
    led.ack(op.step, epoch=epoch)
    m = led.manifest(op.step)
    return f"committed:{m.digest if m is not None else '?'}"


def _permutation(led: Ledger, shape: str) -> list[Write]:
    """A step whose pre-images are its own post-images: app.py and b.txt swapped (b.txt
    created first when it is absent), or lib/new.txt moved to lib2/moved.txt and back."""
    if shape == "swap":
        a, b = led.workspaces.read_file("w", WS_PATH), led.workspaces.read_file("w", SWAP_PATH)
        if b.content is None:
            return [b.write(WS_CONTENT[1])]  # nothing to swap with yet: create it
        if a.content is None:
            return [a.write(b.content)]
        return [a.write(b.content), b.write(a.content)]
    src, dst = led.workspaces.read_file("w", NEW_PATH), led.workspaces.read_file("w", MOVED_PATH)
    if src.content is None and dst.content is None:
        return [src.write(WS_CONTENT[0])]  # nothing to move: create it
    if src.content is not None and dst.content is None:
        return [src.write(None), dst.write(src.content)]
    if src.content is None:
        return [dst.write(None), src.write(dst.content)]
    return [dst.write(None)]  # both present: a move over an existing file is not planned


def do_permute(led: Ledger, op: Op) -> str:
    """A swap or a move, planned from what the files hold now (`_permutation`), then
    admitted, applied, published and acked like any workspace step (`do_workspace`)."""
    row = led.find_step(op.step)
    if row is None or not (row.live or row.state not in ENDED) or "plan" not in op.args:
        op.args["plan"] = _permutation(led, op.args["shape"])  # (again, once ended)
        if len(op.args["plan"]) == 2:
            LedgerModel.STATS[f"permutation:{op.args['shape']}"] += 1
    return do_workspace(led, op)


def do_compensate(led: Ledger, op: Op) -> str:
    row = led.find_step(op.step)
    if row is None:
        return "unknown-step"  # the call that would have created it never landed
    kwargs: dict[str, Any] = {}
    planned = [r.event for r in led.read(step=op.step, kind="planned")
               if r.event.attempt == row.attempt]
    if planned and planned[0].workspace:
        kwargs["epoch"] = _live_epoch(led)
    try:
        c = led.workspaces.compensate(op.step, reason="model", **kwargs)
    except IllegalTransition:
        return "refused"  # its latest attempt was rejected: nothing to end
    except CompensationWindowClosed:
        return "refused"  # committed longer ago than the window: revert with a new step
    return "conflict" if c.conflicts else "ended"


def do_rebuild(led: Ledger, op: Op) -> str:
    led.rebuild()
    return "rebuilt"


def do_gc(led: Ledger, op: Op) -> str:
    report = collect(led, grace_s=0, force=True)
    return f"collected {report.collected}"


def do_acquire(led: Ledger, op: Op) -> str:
    lease = led.workspaces.acquire("w", "agent", ttl_s=DAY, force=True)
    op.args["epoch"] = lease.epoch
    return f"epoch {lease.epoch}" + (f" unsettled {list(lease.unsettled)}" if lease.unsettled else "")


def do_restore(led: Ledger, op: Op) -> str:
    """The sandbox was reclaimed: materialize the committed workspace in a new directory
    (forced: the old lease may be live), then take a new epoch there, which settles the
    old one's attempts against the restored files."""
    target = op.args["target"]
    recorded = any(r.event.root == target for r in led.read(kind="workspace-restored"))
    if not recorded:  # a retry after a restore cut before it was recorded: start it over
        shutil.rmtree(target, ignore_errors=True)
        led.workspaces.restore("w", target, force=True)
    # (recorded: the cut call landed; a later restore may have moved the root on since,
    # and restoring into `target` again would be another call, not this one's retry)
    lease = led.workspaces.acquire("w", "agent", ttl_s=DAY, force=True)
    return f"restored, epoch {lease.epoch}"


RUN = {"append": do_append, "art": do_artifact, "abandon": do_abandon, "ws": do_workspace,
       "compensate": do_compensate, "rebuild": do_rebuild, "gc": do_gc, "acquire": do_acquire,
       "restore": do_restore, "perm": do_permute}


# --- the machine ---------------------------------------------------------------------------

_SCRATCH: str | None = None


def _scratch() -> str:
    global _SCRATCH
    if _SCRATCH is None or not os.path.isdir(_SCRATCH):
        _SCRATCH = tempfile.mkdtemp(prefix="model-faults-", dir=F.scratch_root())
        atexit.register(shutil.rmtree, _SCRATCH, True)
    return _SCRATCH


@pytest.fixture(autouse=True, scope="module")
def _clean_scratch() -> Iterator[None]:
    yield
    if _SCRATCH is not None:
        shutil.rmtree(_SCRATCH, ignore_errors=True)


class LedgerModel(RuleBasedStateMachine):
    """The machine; subclasses change only how durable the storage is (controls)."""

    SYNC = "FULL"
    SKIP: frozenset[str] = frozenset()
    RUN: ClassVar[dict[str, Callable[[Ledger, Op], str]]] = RUN
    KILL_ONLY = False  # a control whose only fault is the kill (power loss: example rejected)
    #: What the runs did, summed over examples (printed by the test: coverage evidence).
    STATS: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="m-", dir=_scratch())
        self.ws_dir = os.path.realpath(os.path.join(self.root, "ws"))
        os.makedirs(self.ws_dir)
        with open(os.path.join(self.ws_dir, WS_PATH), "wb") as f:
            f.write(V0)
        # the witness lives outside the ledger's directory and the workspace (another
        # volume, in spirit); the ledger records where, so every open below uses it
        self.vol = os.path.join(self.root, "vol")
        os.makedirs(self.vol)
        self.witness = os.path.join(self.vol, "ledger.witness")
        self.clock = F.Clock()
        self._hook = sys.unraisablehook
        sys.unraisablehook = lambda u: None  # apsw reports VFS errors SQLite swallowed
        self.gen = 0
        # the ledger, the workspace and the first lease exist before the disk starts
        # (power loss inside init is test_power_loss's sweep)
        with Ledger.init(os.path.join(self._gdir(), "ledger.db"), clock=self.clock,
                         witness=self.witness) as led:
            led.workspaces.add("w", self.ws_dir)
            self.acked_epoch = led.workspaces.acquire("w", "agent", ttl_s=DAY).epoch
            self.acked_head = led.head()
        self.vfss: list[GuardedVFS] = []
        self.zombies: list[Ledger] = []
        self.led: Ledger | None = None
        self.history: list[str] = []  # what happened, for the failure report
        self.ops: dict[str, Op] = {}
        self.pending: list[str] = []  # keys of calls whose outcome is unknown
        self.expect: dict[str, tuple[str, Any]] = {}  # step -> ("committed", digest) | ("ended",) | ("present",)
        self.steps_attempted: set[str] = set()
        self.step_order: list[str] = []  # step ids in the order they were first attempted
        self.last_op: dict[str, str] = {}  # step -> key of the latest call on it
        self.compensations: Counter[str] = Counter()  # step -> compensate calls attempted
        self.counters: Counter[str] = Counter()  # per kind: ids stay put when shrinking
        self.copies: list[tuple[str, int]] = []  # kept copies of the ledger's directory: (dir, head seq)
        self._attach()

    # -- plumbing --------------------------------------------------------------------

    def _gdir(self) -> str:
        d = os.path.join(self.ws_dir, ".steptrail", f"g{self.gen}")  # inside the workspace
        os.makedirs(d, exist_ok=True)
        return d

    @property
    def path(self) -> str:
        return os.path.join(self._gdir(), "ledger.db")

    def _attach(self) -> None:
        """A fresh simulated disk whose durable baseline is the current directory."""
        self.disk = KillableDisk()
        self.disk.adopt_tree(os.path.join(self._gdir(), "blobs"))
        self.vfs = GuardedVFS(self.disk)
        self.vfss.append(self.vfs)
        self.fileops = F.PowerLossFileOps(self.disk, skip=self.SKIP)
        self._open()

    def _open(self) -> None:
        try:
            led = Ledger.open(self.path, vfs=self.vfs.name, synchronous=self.SYNC,  # type: ignore[arg-type]
                              clock=self.clock)
        except Exception as exc:
            raise InvariantBroken(f"the ledger does not reopen after the fault:"
                                  f" {type(exc).__name__}: {exc}") from exc
        led.blobs = BlobStore(led.blobs.root, self.fileops)
        write = led._log.on_commit
        if write is not None:
            # The witness write is a disk operation of the machine too: a fault may land
            # after COMMIT and before it (the ledger one commit ahead: an honest crash)
            disk = self.disk

            def on_commit(head: Any) -> None:
                disk.tick("witness-write")
                write(head)

            led._log.on_commit = on_commit
        self._witness_lag(led)
        self.led = led

    def _witness_lag(self, led: Ledger) -> None:
        """Count a reopen that found the ledger ahead of its witness (and accepted it)."""
        if led.witness_lag:
            self.STATS["accepted:witness-behind"] += 1
            self.history.append(f"reopened {led.witness_lag} commit(s) ahead of the witness: accepted")

    def _bury(self) -> None:
        """Abandon the current Ledger like a SIGKILLed process: its connection is never
        closed (a close would checkpoint: not what a kill does), its fds the kernel would
        drop are dropped (the lockq flock) and a transaction the kill cut is rolled back
        (in WAL mode that touches no file). The dead handle stays referenced, unused,
        until teardown. (Unlike a real kill its SQLite handle keeps the shared lock on
        the -shm, so the next open reuses the wal-index instead of rebuilding it from
        the -wal; the bytes it reads are the same.)"""
        led, self.led = self.led, None
        if led is None:
            return
        assert self.disk.dead
        db = led._store.db
        if db._lockq is not None:
            with contextlib.suppress(OSError):
                os.close(db._lockq)
            db._lockq = None
        if db.conn.in_transaction:
            with contextlib.suppress(Exception):
                db.conn.execute("ROLLBACK")
        if led.witness is not None:
            led.witness.close()  # so is the witness's fd
        self.zombies.append(led)

    def _power_loss(self, model: str, seed: int) -> None:
        if self.KILL_ONLY:
            reject()
        if not self.disk.crashed:
            self.disk.model, self.disk.rng = model, random.Random(seed)
            self.disk.freeze()
        self._bury()
        old = self._gdir()
        self.gen += 1
        self.disk.materialize(old, self._gdir())
        # the restart: the surviving image is opened with the ordinary VFS (read-write:
        # WAL recovery, projections caught up) and closed; then the run goes on over it
        # through a fresh simulated disk whose durable baseline is that image
        try:
            with Ledger.open(self.path, clock=self.clock) as led:
                self._witness_lag(led)
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding
            self.fail(f"the surviving image does not reopen: {type(exc).__name__}: {exc}")
        self._attach()

    def _kill(self) -> None:
        self.disk.killed = True
        self._bury()
        self.disk.revive()
        self._open()

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            if self.led is not None:
                self.led.close()
        for z in self.zombies:
            with contextlib.suppress(Exception):
                z._store.db.conn.close(True)
        for v in self.vfss:
            with contextlib.suppress(Exception):
                v.unregister()
        sys.unraisablehook = self._hook
        shutil.rmtree(self.root, ignore_errors=True)

    # -- running one call under the model -----------------------------------------------

    def _new(self, kind: str, step: str = "", **args: Any) -> Op:
        self.counters[kind] += 1
        n = self.counters[kind]
        op = Op(f"{kind}#{n}", kind, step.format(n=n), args)
        self.ops[op.key] = op
        return op

    def _call(self, op: Op, crash: Crash | None) -> bool:
        """Run one call; True when it returned (acknowledged), False when a fault cut it."""
        assert self.led is not None
        redelivery = op.acked  # the first answer stands, whatever happens to this one
        if op.kind == "compensate":
            self.compensations[op.step] += 1
        prior = None
        if op.step:
            self.last_op[op.step] = op.key
            if op.step not in self.steps_attempted:
                self.step_order.append(op.step)
            self.steps_attempted.add(op.step)
            if op.kind != "append" and not redelivery:
                prior = self.expect.pop(op.step, None)  # in doubt until the call returns
        disk = self.disk
        if crash is not None:
            if crash.kind == "power":
                disk.crash_at = disk.ops + crash.at
                disk.model, disk.rng = crash.model, random.Random(crash.seed)
            else:
                disk.kill_at = disk.ops + crash.at
        start = disk.ops
        error: BaseException | None = None
        answer = ""
        try:
            answer = self.RUN[op.kind](self.led, op)
        except Exception as exc:  # noqa: BLE001 - judged below
            error = exc
        fired = disk.dead
        self.STATS[f"call:{op.kind}"] += 1
        self.STATS[f"max-ops:{op.kind}"] = max(self.STATS[f"max-ops:{op.kind}"], disk.ops - start)
        if fired:
            self.STATS[f"cut:{crash.kind if crash else '?'}:{op.kind}"] += 1
        disk.crash_at = None
        disk.kill_at = None
        used = disk.ops - start
        if fired and error is not None:
            self.history.append(f"{op.key} {op.step}: cut by {crash} after {used} ops"
                                f" ({type(error).__name__}) -> in doubt")
            if op.key not in self.pending and not redelivery:
                self.pending.append(op.key)
            if crash is not None and crash.kind == "power":
                self._power_loss(crash.model, crash.seed)
            else:
                self._kill()
            return False
        if error is not None:
            raise UnexpectedFailure(f"{op.key} {op.kind} {op.step}: no fault was injected but the"
                                    f" call failed: {type(error).__name__}: {error}") from error
        # the call returned: acknowledged (even if the machine died under it afterwards —
        # the client saw the answer; what it was told must survive)
        op.acked, op.answer = True, answer
        if fired:
            self.STATS[f"returned-after-the-fault:{op.kind}:{disk.trace[-1]}"] += 1
        self.STATS[f"acked:{op.kind}:{answer.split(':')[0].split(' ')[0]}"] += 1
        if op.key in self.pending:
            self.pending.remove(op.key)
        self._learn(op, prior)
        with contextlib.suppress(Exception):
            self.acked_head = self.led.head()
        self.history.append(f"{op.key} {op.step}: {answer}" + (
            f" (then {crash} fired after {used} ops)" if fired else
            f" ({crash} not reached: the call used {used} ops)" if crash else ""))
        if fired:
            if crash is not None and crash.kind == "power":
                self._power_loss(crash.model, crash.seed)
            else:
                self._kill()
        return True

    def _learn(self, op: Op, prior: tuple[str, Any] | None) -> None:
        """What an acknowledged call tells the model."""
        assert self.led is not None
        if op.kind == "append":
            self.expect.setdefault(op.step, ("present",))
        elif op.kind == "art":
            self.expect[op.step] = ("committed", op.answer.split(":", 1)[1])
        elif op.kind in ("ws", "perm"):
            if op.answer.startswith("committed:"):
                self.expect[op.step] = ("committed", op.answer.split(":", 1)[1])
            else:
                self.expect[op.step] = ("ended",)
        elif op.kind in ("abandon", "compensate"):
            if op.answer == "refused":  # a typed refusal: nothing changed
                if prior is not None:
                    self.expect[op.step] = prior
            elif op.answer != "unknown-step":
                self.expect[op.step] = ("ended",)
        elif op.kind == "acquire":
            self.acked_epoch = max(self.acked_epoch, op.args["epoch"])

    # -- rules: the public API ----------------------------------------------------------

    @rule(crash=CRASHES)
    def append(self, crash: Crash | None) -> None:
        self._call(self._new("append", "app-{n}"), crash)

    @rule(inline=st.sampled_from([None, 0, 1, 2]), file=st.sampled_from([None, 0, 1, 2]),
          crash=CRASHES)
    def artifact_step(self, inline: int | None, file: int | None, crash: Crash | None) -> None:
        outputs = {}
        if inline is not None:
            outputs["log.txt"] = SMALL[inline]
        if file is not None:
            outputs["out.bin"] = LARGE[file]
        if not outputs:
            outputs["log.txt"] = SMALL[0]
        self._call(self._new("art", "art-{n}", outputs=outputs), crash)

    @rule(inline=st.sampled_from([None, 0, 1]), file=st.sampled_from([None, 0, 1]), crash=CRASHES)
    def abandoned_step(self, inline: int | None, file: int | None, crash: Crash | None) -> None:
        outputs = {}
        if inline is not None:
            outputs["note.txt"] = SMALL[inline]
        if file is not None:
            outputs["scratch.bin"] = LARGE[file]
        if not outputs:
            outputs["scratch.bin"] = LARGE[0]
        self._call(self._new("abandon", "ab-{n}", outputs=outputs), crash)

    @rule(paths=st.sampled_from([(WS_PATH,), (NEW_PATH,), WS_PATHS]),
          content=st.sampled_from([*range(len(WS_CONTENT)), None]), crash=CRASHES)
    def workspace_step(self, paths: tuple[str, ...], content: int | None,
                       crash: Crash | None) -> None:
        """Write `paths` (content None: delete them), under the live lease."""
        self._call(self._new("ws", "ws-{n}", paths=paths, content=content), crash)

    @rule(shape=st.sampled_from(["swap", "move"]), crash=CRASHES)
    def permutation_step(self, shape: str, crash: Crash | None) -> None:
        """Swap app.py and b.txt, or move lib/new.txt to lib2/moved.txt (or back): each
        write's pre-image is another write's post-image, so only the apply's own journal
        (its slots) tells a landed exchange from a file nobody touched."""
        self._call(self._new("perm", "ws-perm-{n}", shape=shape), crash)

    @precondition(lambda self: bool(self.step_order))
    @rule(pick=st.integers(0, 7), crash=CRASHES)
    def compensate(self, pick: int, crash: Crash | None) -> None:
        """Compensate a step the client started (pick 0: the latest one)."""
        step = self.step_order[-1 - pick % len(self.step_order)]
        self._call(self._new("compensate", step), crash)

    @rule(crash=CRASHES)
    def rebuild(self, crash: Crash | None) -> None:
        self._call(self._new("rebuild"), crash)

    @rule(crash=CRASHES)
    def gc(self, crash: Crash | None) -> None:
        self._call(self._new("gc"), crash)

    @rule(crash=CRASHES)
    def acquire(self, crash: Crash | None) -> None:
        self._call(self._new("acquire"), crash)

    @rule(crash=CRASHES)
    def restore_workspace(self, crash: Crash | None) -> None:
        n = self.counters["restore"] + 1
        self._call(self._new("restore", target=os.path.join(self.root, f"ws-restored-{n}")), crash)

    @rule(hours=st.sampled_from([1, 25]))
    def time_passes(self, hours: int) -> None:
        """The clock jumps: 25 h expires the lease (the next workspace call acquires a new
        epoch, which settles the old one), closes the compensation window and lets
        pre-image pins go (GC may take them)."""
        self.history.append(f"{hours} h pass")
        self.clock.now += hours * 3600 * 1_000_000_000

    @precondition(lambda self: bool(self.pending))
    @rule(pick=st.integers(0, 3), crash=CRASHES)
    def retry(self, pick: int, crash: Crash | None) -> None:
        """The client retries a call whose outcome it does not know."""
        op = self.ops[self.pending[pick % len(self.pending)]]
        self._call(op, crash)

    def _redeliverable(self) -> list[str]:
        """Acknowledged calls whose step nothing touched since, and whose effect a
        redelivery must answer from the ledger (a commit, a planned step, an end)."""
        return [k for k, op in self.ops.items()
                if op.acked and op.step and self.last_op.get(op.step) == k
                and (op.kind in ("append", "abandon") or op.answer.startswith("committed:"))]

    @precondition(lambda self: bool(self._redeliverable()))
    @rule(pick=st.integers(0, 3), crash=CRASHES)
    def redeliver(self, pick: int, crash: Crash | None) -> None:
        """The answer was lost and the client sends the same call again (I4): it must get
        the first answer, and the step must not change."""
        keys = self._redeliverable()
        op = self.ops[keys[-1 - pick % len(keys)]]
        first = op.answer
        assert self.led is not None
        before = [r.seq for r in self.led.read(step=op.step)]
        if not self._call(op, crash):
            return  # cut by the fault: the first answer stands (the invariants check it)
        if op.answer != first:
            self.fail(f"I4: redelivered {op.key} answered {op.answer!r}, first {first!r}")
        assert self.led is not None
        after = [r.seq for r in self.led.read(step=op.step)]
        if after != before:
            self.fail(f"I4: redelivered {op.key} changed {op.step}: events {before} -> {after}")

    # -- rules: hostile calls (refused, nothing changes) ---------------------------------

    def _embedded(self) -> bool:
        assert self.led is not None
        root = self.led.workspaces.get("w").root
        return self._gdir().startswith(root.rstrip("/") + "/")

    def _refused(self, what: str, call: Callable[[], Any], error: type[Exception],
                 untouched: str) -> None:
        """`call` must raise `error`, and neither the log nor the files under `untouched`
        may change."""
        assert self.led is not None
        head, before = self.led.head(), _tree(untouched)
        try:
            call()
        except error:
            pass
        except Exception as exc:  # noqa: BLE001 - the wrong answer is the finding
            self.fail(f"{what}: {type(exc).__name__}: {exc} (expected {error.__name__})")
        else:
            self.fail(f"{what}: accepted (expected {error.__name__})")
        if self.led.head() != head or _tree(untouched) != before:
            self.fail(f"{what}: refused, but something changed")
        self.STATS[f"refused:{what.split(' ')[0]}"] += 1

    @precondition(lambda self: self._embedded())
    @rule(into=st.sampled_from(["ledger.db", "ledger.db-wal", "blob", "blobs/00/new", ""]))
    def ledger_write(self, into: str) -> None:
        """A plan writes into the ledger's own directory, which the workspace contains,
        with the bytes there as its pre_hash (a blob's name is its hash): refused at
        admit, PathForbidden."""
        assert self.led is not None
        gdir = self._gdir()
        if into == "blob":
            files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(gdir, "blobs"))
                     for f in fs]
            into = os.path.relpath(sorted(files)[0], gdir) if files else "blobs/ab/cd"
        path = os.path.relpath(os.path.join(gdir, into), self.led.workspaces.get("w").root)
        try:
            with open(os.path.join(gdir, into), "rb") as f:
                pre: str | None = sha(f.read())
        except OSError:
            pre = None
        epoch = self.led.workspaces.get("w").epoch
        self.history.append(f"hostile: plan writing {path}")
        self._refused(f"ledger_write {path}", lambda: self.led.workspaces.admit(  # type: ignore[union-attr]
            "w", epoch, [StepPlan(f"evil-{self.counters['evil']}", [Write(path, b"EVIL", pre)])]),
            PathForbidden, gdir)
        self.counters["evil"] += 1

    @precondition(lambda self: not self._embedded())
    @rule(how=st.sampled_from(["symlink", "directory"]))
    def root_swap(self, how: str) -> None:
        """Between steps the root (moved away from the ledger by a restore) is swapped
        for a symlink to a copy of itself, or replaced by that copy: the same bytes, so
        a fence on hashes would pass. snapshot and admit refuse (WorkspaceMoved); the
        copy is untouched; then the root is put back."""
        assert self.led is not None
        root = self.led.workspaces.get("w").root
        decoy, real = root + ".decoy", root + ".real"
        shutil.copytree(root, decoy, symlinks=True)
        os.rename(root, real)
        if how == "symlink":
            os.symlink(decoy, root)
        else:
            os.rename(decoy, root)
            decoy = root
        self.history.append(f"hostile: root swapped ({how})")
        try:
            rev_hash = {}
            with contextlib.suppress(OSError):
                with open(os.path.join(decoy, WS_PATH), "rb") as f:
                    rev_hash[WS_PATH] = sha(f.read())
            epoch = self.led.workspaces.get("w").epoch
            self._refused(f"root_swap {how} snapshot",
                          lambda: self.led.workspaces.snapshot("w", WS_PATH),  # type: ignore[union-attr]
                          WorkspaceMoved, decoy)
            self._refused(f"root_swap {how} admit", lambda: self.led.workspaces.admit(  # type: ignore[union-attr]
                "w", epoch, [StepPlan(f"evil-{self.counters['evil']}",
                                      [Write(WS_PATH, b"EVIL", rev_hash.get(WS_PATH))])]),
                WorkspaceMoved, decoy)
            self.counters["evil"] += 1
        finally:
            if how == "symlink":
                os.unlink(root)
                shutil.rmtree(decoy)
            else:
                shutil.rmtree(root)
            os.rename(real, root)

    # -- rules: the witness taken away, the ledger rolled back (refused, nothing written) --

    def _exit(self) -> str:
        """The client process exits cleanly (the hostile witness rules act between
        processes); returns the ledger's directory."""
        assert self.led is not None
        gdir = self._gdir()
        self.led.close()
        self.led = None
        return gdir

    def _opens_refused(self, what: str, error: type[Exception], gdir: str,
                       anchor: bool = False) -> None:
        """Every way in — open read-only, read-write, naming the witness, `init`, and (with
        `anchor`) an operator's unforced `anchor_witness` (AnchorRefused) — must be refused
        with exactly `error`, and nothing under the ledger's directory or the witness's
        may change (no fresh witness either)."""
        path = os.path.join(gdir, "ledger.db")
        ways: dict[str, tuple[Callable[[], Any], type[Exception]]] = {
            "open read-only": (lambda: Ledger.open(path, readonly=True, clock=self.clock), error),
            "open": (lambda: Ledger.open(path, clock=self.clock), error),
            "open --witness": (lambda: Ledger.open(path, witness=self.witness, clock=self.clock), error),
            "init": (lambda: Ledger.init(path, clock=self.clock), error),
        }
        if anchor:
            ways["anchor"] = (lambda: Ledger.anchor_witness(path, clock=self.clock), AnchorRefused)
        before = (_tree(gdir), _tree(self.vol))
        for way, (call, expected) in ways.items():
            try:
                opened = call()
            except Exception as exc:  # noqa: BLE001 - the wrong answer is the finding
                if type(exc) is not expected:
                    self.fail(f"{what}: {way}: {type(exc).__name__}: {exc}"
                              f" (expected {expected.__name__})")
            else:
                with contextlib.suppress(Exception):
                    opened.close()
                self.fail(f"{what}: {way} accepted (expected {expected.__name__})")
        if (_tree(gdir), _tree(self.vol)) != before:
            self.fail(f"{what}: refused, but something changed")
        self.STATS[f"refused:{what}"] += 1

    @rule(how=st.sampled_from(["deleted", "empty", "zeros"]))
    def witness_lost(self, how: str) -> None:
        """Between processes the witness is deleted, emptied or zero-filled: every way in is
        refused (WitnessMissing), nothing written — no fresh witness started from whatever
        head the file holds. Then the operator re-anchors it in place (`anchor_witness`,
        which verifies the ledger first; through the machine's disk) and the run goes on
        under the new witness."""
        gdir = self._exit()
        damage_witness(self.witness, how)
        self.history.append(f"hostile: witness {how}")
        self._opens_refused("witness_lost", WitnessMissing, gdir)
        Ledger.anchor_witness(os.path.join(gdir, "ledger.db"), clock=self.clock, vfs=self.vfs.name)
        self.STATS["anchored"] += 1
        self.history.append("operator: witness anchored")
        self._open()
        assert self.led is not None
        self.acked_head = self.led.head()

    @rule()
    def keep_copy(self) -> None:
        """Someone keeps a copy of the ledger's directory as it is now (a backup, a VM
        snapshot), for `rollback` to put back later; the newest two are kept."""
        assert self.led is not None
        self.counters["copy"] += 1
        n = self.counters["copy"]
        dst = os.path.join(self.root, "copies", f"c{n}")
        shutil.copytree(self._gdir(), dst, ignore=shutil.ignore_patterns("*-shm"))
        seq = self.led.head().seq
        self.copies.append((dst, seq))
        if len(self.copies) > 2:
            shutil.rmtree(self.copies.pop(0)[0])
        self.history.append(f"copy c{n} kept at #{seq}")
        self.STATS["kept-copy"] += 1

    def _older_copies(self) -> list[tuple[str, int]]:
        """The kept copies behind the witnessed head. (A copy at the witnessed head of a
        ledger one commit ahead of its witness is what an honest crash leaves: accepted.)"""
        if not self.copies or self.led is None:
            return []
        seen = Witness(self.witness, self.led.ledger_id).read()
        return [c for c in self.copies if seen is not None and c[1] < seen.seq]

    @precondition(lambda self: bool(self._older_copies()))
    @rule(pick=st.integers(0, 1))
    def rollback(self, pick: int) -> None:
        """Between processes the ledger's directory is rolled back to a kept copy older
        than the witnessed head, its witness intact: every way in is refused,
        WitnessMismatch, and so is an unforced anchor (AnchorRefused); nothing written.
        Then the attack is undone (the current directory put back); the run goes on."""
        self._rollback(pick, "intact")

    @precondition(lambda self: bool(self._older_copies()))
    @rule(pick=st.integers(0, 1), how=st.sampled_from(["deleted", "zeros"]))
    def rollback_hidden(self, pick: int, how: str) -> None:
        """`rollback`, with the witness deleted or zero-filled to hide it: refused all the
        same (WitnessMissing), nothing written; then the directory and the witness are
        put back."""
        self._rollback(pick, how)

    def _rollback(self, pick: int, witness: str) -> None:
        copies = self._older_copies()
        src, seq = copies[pick % len(copies)]
        gdir = self._exit()
        aside = gdir + ".now"
        with open(self.witness, "rb") as f:
            witnessed = f.read()
        os.rename(gdir, aside)
        try:
            shutil.copytree(src, gdir)
            self.history.append(f"hostile: rolled back to {os.path.basename(src)} (#{seq}),"
                                f" witness {witness}")
            if witness == "intact":
                self._opens_refused("rollback", WitnessMismatch, gdir, anchor=True)
            else:
                damage_witness(self.witness, witness)
                self._opens_refused("rollback_hidden", WitnessMissing, gdir)
        finally:
            shutil.rmtree(gdir)
            os.rename(aside, gdir)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.witness)
            fd = os.open(self.witness, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(witnessed)
        self._open()

    # -- rules: the faults ---------------------------------------------------------------

    @rule(model=st.sampled_from(F.MODELS + F.EXTRA_MODELS), seed=st.integers(0, 3))
    def power_loss(self, model: str, seed: int) -> None:
        self.history.append(f"power loss ({model}, seed {seed})")
        self.STATS["power_loss"] += 1
        self._power_loss(model, seed)

    @rule()
    def process_kill(self) -> None:
        self.history.append("process kill")
        self.STATS["process_kill"] += 1
        self._kill()

    # -- the invariants ------------------------------------------------------------------

    @staticmethod
    def _in_doubt(op: Op, rows: dict[str, Any]) -> bool:
        """Whether a call cut by a fault may have left the workspace other than the ledger
        says. A cut workspace step may not once its step is unknown (cut before its plan
        committed) or its attempt is ended or committed (settled, rejected, published):
        every write it made is recorded, put back, or a recorded conflict."""
        if op.kind in ("ws", "perm"):
            row = rows.get(op.step)
            return row is not None and row.state not in ENDED and not row.live
        return op.touches_workspace

    def fail(self, what: str) -> None:
        raise InvariantBroken(what + "\nhistory:\n  " + "\n  ".join(self.history[-20:]))

    @invariant()
    def invariants_hold(self) -> None:
        self.STATS["checks"] += 1
        led = self.led
        assert led is not None
        ops_before = self.disk.ops
        # verify: integrity, chain, seq, projections == rebuild, I3/I4/I5, I1; and the
        # chain still holds the head seen after the last acknowledged call
        rep = led.verify(expect_head=self.acked_head)
        if not rep.ok:
            self.fail("verify: " + "; ".join(f"{f.check} #{f.seq}: {f.message}"
                                             for f in rep.findings[:5]))
        rows = {s.step_id: s for s in led.steps()}
        # present <= attempted
        unexpected = sorted(set(rows) - self.steps_attempted)
        if unexpected:
            self.fail(f"steps nobody attempted: {unexpected}")
        # acked <= present, with what the acknowledgement said
        for step, exp in sorted(self.expect.items()):
            row = rows.get(step)
            if exp[0] == "present" and row is None:
                self.fail(f"I1/lost: acknowledged planned step {step} is gone")
            elif exp[0] == "committed":
                c = led.classify(step)
                if c != "committed":
                    self.fail(f"I1/lost: acknowledged commit {step} is now {c!r}"
                              f" (state {row.state if row else None})")
                m = led.manifest(step)
                if m is None or m.digest != exp[1]:
                    self.fail(f"acknowledged manifest of {step} was {exp[1][:12]}…, the ledger"
                              f" says {m.digest[:12] if m else None}")
                for e in (*m.writes, *m.artifacts):
                    try:
                        data = led.read_blob(e.digest)
                    except LedgerError as exc:
                        self.fail(f"I1: {step} {e.path} -> {e.digest[:12]}…: {exc}")
                    if sha(data) != e.digest or len(data) != e.size:
                        self.fail(f"I1: {step} {e.path} reads back wrong bytes")
            elif exp[0] == "ended" and (row is None or row.live or row.state not in ENDED):
                self.fail(f"acknowledged end of {step} is undone: "
                          f"{None if row is None else (row.state, row.live)}")
        for step in rows:
            c = led.classify(step)
            if c.startswith("VIOLATION"):
                self.fail(f"I1 {step}: {c}")
        # nothing the client did not ask for: an artifact or planned step ends only when
        # it was compensated, is never rejected (only a fence rejects), and commits at
        # most once per compensation asked for (a retry continues the attempt in flight)
        published = Counter(r.event.step for r in led.read(kind="manifest-published"))
        for step, row in rows.items():
            if step.startswith(("art-", "app-")):
                if row.state == "compensated" and not self.compensations[step]:
                    self.fail(f"unexpected: {step} was compensated, nobody asked")
                if row.state == "rejected":
                    self.fail(f"unexpected: {step} was rejected")
                if published[step] > 1 + self.compensations[step]:
                    self.fail(f"duplicated: {step} published {published[step]} times with"
                              f" {self.compensations[step]} compensation(s) asked for")
        # I4: one transition per attempt
        seen = Counter((r.event.step, r.event.attempt, r.kind) for r in led.read()
                       if r.kind in ("planned", "fenced", "manifest-published", "acked",
                                     "compensated", "rejected"))
        twice = sorted(k for k, n in seen.items() if n > 1)
        if twice:
            self.fail(f"I4: transitions recorded twice: {twice[:5]}")
        # I9: every path's committed content is a readable blob
        for problem in F.i9_problems(led):
            self.fail(problem)
        # I5: epochs never go back
        epoch = led.workspaces.get("w").epoch
        if epoch < self.acked_epoch:
            self.fail(f"epoch went back: {epoch} < acknowledged {self.acked_epoch}")
        # the byte audit
        for problem in F.audit_problems(led):
            self.fail(problem)
        # the workspace holds what the ledger says, once no workspace call is in doubt (a
        # cut workspace step is not, once its attempt is ended or committed: settled), or a
        # recorded conflict only a step without the evidence of its apply may leave
        if not any(self._in_doubt(self.ops[k], rows) for k in self.pending):
            in_flight = [s for s in led.steps() if s.workspace == "w" and s.state not in ENDED
                         and not s.live]
            if not in_flight:
                paths = led.workspaces.paths("w")
                left = _left_for_a_human(led)
                # what restore would write is what the projection says (revision order,
                # whatever order the steps published in), but where a conflict was left
                committed = committed_content(led, "w")
                for path, (_rev, digest) in paths.items():
                    if path not in left and committed.get(path, "?") != digest:
                        self.fail(f"{path}: restore's committed content is"
                                  f" {str(committed.get(path))[:12]}…, the projection's"
                                  f" {str(digest)[:12]}…")
                root = led.workspaces.get("w").root  # moved by a restore
                # app.py's v0 predates the ledger: a restore knows only what steps wrote
                v0 = sha(V0) if root == self.ws_dir else None
                for path, before in ((WS_PATH, v0), (NEW_PATH, None), (SWAP_PATH, None),
                                     (MOVED_PATH, None)):
                    try:
                        with open(os.path.join(root, path), "rb") as f:
                            on_disk: str | None = sha(f.read())
                    except FileNotFoundError:
                        on_disk = None
                    said = paths.get(path, (0, before))[1]
                    conflict = left.get(path)
                    if on_disk != said and (conflict is None or conflict[0] != on_disk):
                        self.fail(f"workspace {path} holds {str(on_disk)[:12]}…, the ledger"
                                  f" says {str(said)[:12]}…")
                    if on_disk != said and conflict is not None and conflict[1]:
                        self.fail(f"workspace {path}: settling left {str(on_disk)[:12]}… as a"
                                  " conflict, though the attempt's pre-image pins prove it"
                                  " reached its renames (its own write: take it back)")
        if self.disk.ops != ops_before:
            self.fail(f"the checks wrote: {self.disk.trace[ops_before:][:8]}")


def _left_for_a_human(led: Ledger) -> dict[str, tuple[str | None, bool]]:
    """Per path, the latest ``conflict`` a compensation or a rejection recorded and no
    later event changed: (the digest it left, whether it is the attempt's own write that
    settling should have taken back — never recorded as applied, holding exactly its
    planned post-image, while the attempt had pinned a pre-image: the evidence that it
    reached its renames)."""
    left: dict[str, tuple[str | None, bool]] = {}
    posts: dict[tuple[str, int], dict[str, str | None]] = {}
    fenced: set[tuple[str, int]] = set()
    pinned: set[tuple[str, int]] = set()  # attempts that pinned a pre-image
    for r in led.read():
        ev = r.event
        attempt = (getattr(ev, "step", ""), getattr(ev, "attempt", 0))
        if isinstance(ev, WorkspaceRestored):
            left.clear()  # another directory, holding what was committed
            continue
        if isinstance(ev, Planned):
            posts[attempt] = {w.path: w.post_hash for w in ev.writes}
            continue
        if isinstance(ev, BlobPinned) and ev.role == "pre-image":
            pinned.add(attempt)
            continue
        if isinstance(ev, Fenced):
            fenced.add(attempt)
            outcomes = [(w.path, "applied", None) for w in ev.writes]
        elif isinstance(ev, Compensated):
            outcomes = [(x.path, x.outcome, x.digest) for x in ev.restored]
        elif isinstance(ev, Rejected):  # its own call's pins are no evidence: not judged
            outcomes = [(x.path, x.outcome, x.digest) for x in ev.undone]
        else:
            continue
        for path, outcome, digest in outcomes:
            if outcome != "conflict":
                left.pop(path, None)
                continue
            own = (isinstance(ev, Compensated) and attempt in pinned and attempt not in fenced
                   and path in posts.get(attempt, {}) and posts[attempt][path] == digest)
            left[path] = (digest, own)
    return left


class NoSyncModel(LedgerModel):
    """Negative control: synchronous=OFF (no WAL fsync): acknowledged commits are lost."""

    SYNC = "OFF"


class NormalSyncModel(LedgerModel):
    """Negative control: synchronous=NORMAL (a commit is durable only at a checkpoint)."""

    SYNC = "NORMAL"


class WrongOrderModel(LedgerModel):
    """Negative control for the kill alone (page cache kept: only ordering bugs show):
    an artifact step that publishes its manifest before storing its blobs."""

    RUN: ClassVar[dict[str, Callable[[Ledger, Op], str]]] = {**RUN, "art": do_artifact_wrong_order}
    KILL_ONLY = True
    # only the rules this control is about (a rule set to None is no rule)
    append = abandoned_step = workspace_step = compensate = None  # type: ignore[assignment]
    rebuild = gc = acquire = restore_workspace = time_passes = redeliver = None  # type: ignore[assignment]
    power_loss = witness_lost = keep_copy = rollback = rollback_hidden = None  # type: ignore[assignment]


class NoDirFsyncModel(LedgerModel):
    """Negative control: the blob directory is never fsynced: a manifest outlives its blob."""

    SKIP = frozenset({"dirfsync"})


# --- the tests ------------------------------------------------------------------------------


def _settings(**kw: Any) -> settings:
    base: dict[str, Any] = {
        "max_examples": 400 if FULL else 60,
        "stateful_step_count": 40 if FULL else 20,
        "deadline": None,
        "derandomize": not FULL,
        "database": None,
        "suppress_health_check": list(HealthCheck),
        "print_blob": True,
        "report_multiple_bugs": False,
        "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    }
    base.update(kw)
    return settings(**base)


def test_model_with_power_loss_and_process_kill() -> None:
    LedgerModel.STATS.clear()
    t0 = time.perf_counter()
    run_state_machine_as_test(LedgerModel, settings=_settings())
    stats = dict(sorted(LedgerModel.STATS.items()))
    print(f"model: {'full' if FULL else 'default'} run passed in {time.perf_counter() - t0:.1f}s;"
          f" {stats}")
    # the run exercised what it claims: every call kind, both faults, calls cut mid-way
    # and retried, and every invariant check ran
    for kind in RUN:
        assert stats.get(f"call:{kind}", 0) > 0, kind
    assert stats.get("power_loss", 0) > 0 and stats.get("process_kill", 0) > 0
    # swaps and moves (pre-images that are the step's own post-images), some cut midway
    assert stats.get("permutation:swap", 0) > 0 and stats.get("permutation:move", 0) > 0
    assert stats.get("cut:kill:perm", 0) > 0 and stats.get("cut:power:perm", 0) > 0
    assert any(k.startswith("cut:power") for k in stats) and any(k.startswith("cut:kill") for k in stats)
    assert stats.get("refused:ledger_write", 0) > 0 and stats.get("refused:root_swap", 0) > 0
    # the witness: taken away (then re-anchored), the ledger rolled back with it intact
    # and with it taken away — refused every time. (An honest crash between COMMIT and
    # the witness write, the ledger one commit ahead of it, is accepted: the sweep meets
    # it in about one example of 60 — 0 in some runs since format v6 changed how many
    # disk operations a commit makes —, so it is proven where it is certain to be met,
    # at that very operation with both faults:
    # test_regression_a_crash_between_commit_and_the_witness_write_is_accepted.)
    for what in ("witness_lost", "rollback", "rollback_hidden"):
        assert stats.get(f"refused:{what}", 0) > 0, what
    assert stats.get("anchored", 0) > 0


def _find_counterexample(machine: type[LedgerModel], max_examples: int) -> str:
    """Run a control machine; it must fail. Return the shrunk sequence hypothesis reports."""
    t0 = time.perf_counter()
    with pytest.raises((InvariantBroken, UnexpectedFailure)) as info:
        run_state_machine_as_test(machine, settings=_settings(
            max_examples=max_examples, stateful_step_count=8, derandomize=True))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    text = (f"{machine.__name__}: caught in {time.perf_counter() - t0:.1f}s\n{notes}\n"
            f"{str(info.value).splitlines()[0]}")
    print(text)
    return text


def test_negative_control_synchronous_off_is_caught() -> None:
    text = _find_counterexample(NoSyncModel, 300)
    assert "power_loss" in text or "Crash('power'" in text
    assert "lost" in text or "head" in text or "rolled back" in text


def test_negative_control_synchronous_normal_is_caught() -> None:
    text = _find_counterexample(NormalSyncModel, 300)
    assert "power_loss" in text or "Crash('power'" in text


def test_negative_control_publish_before_store_is_caught_by_a_kill() -> None:
    text = _find_counterexample(WrongOrderModel, 300)
    assert "Crash('kill'" in text or "process_kill" in text
    assert "missing" in text


def test_negative_control_no_blob_dir_fsync_is_caught() -> None:
    text = _find_counterexample(NoDirFsyncModel, 300)
    assert "power_loss" in text or "Crash('power'" in text
    assert "missing" in text or "I1" in text


def _witness_fails_open(real: Callable[[WitnessKeeper], int]) -> Callable[[WitnessKeeper], int]:
    """THE BROKEN CHECK (negative control): a missing, empty or zero-filled witness is
    taken for no witness at all — the defect of issue 11 item 8 (a writer then starts a
    fresh witness from whatever head the file holds)."""

    def check_witness(self: WitnessKeeper) -> int:
        assert self.witness is not None
        if self.witness.read() is None:
            return 0
        return real(self)

    return check_witness


def _witness_behind_accepted(real: Callable[[WitnessKeeper], int]) -> Callable[[WitnessKeeper], int]:
    """THE BROKEN CHECK (negative control): a present witness is read, but a ledger behind
    it or off its chain is let through (only a missing witness is refused)."""

    def check_witness(self: WitnessKeeper) -> int:
        try:
            return real(self)
        except WitnessMissing:
            raise
        except WitnessMismatch:
            return 0

    return check_witness


@pytest.mark.parametrize("broken", [_witness_fails_open, _witness_behind_accepted],
                         ids=["missing-witness-fails-open", "rollback-let-through"])
def test_negative_control_a_witness_check_that_fails_open_is_caught(
        monkeypatch: pytest.MonkeyPatch, broken: Callable[..., Any]) -> None:
    """Negative controls for the witness rules: with the witness check broken
    (`WitnessKeeper.check`, what `Ledger.check_witness` and every open run), the same
    machine finds an open that should have been refused (witness_lost or rollback_hidden;
    rollback)."""
    monkeypatch.setattr(WitnessKeeper, "check", broken(WitnessKeeper.check))
    text = _find_counterexample(LedgerModel, 300)
    if broken is _witness_fails_open:
        assert "witness_lost" in text or "rollback_hidden" in text, text
        assert "expected WitnessMissing" in text, text
    else:
        assert "state.rollback(" in text and "keep_copy" in text, text
        assert "expected WitnessMismatch" in text or "expected AnchorRefused" in text, text


# --- regressions: counterexamples the machine found, as explicit rule sequences ----------


def replay(machine: type[LedgerModel], *calls: tuple[str, dict[str, Any]],
           inspect: Callable[[LedgerModel], None] | None = None) -> LedgerModel:
    """Run one rule sequence the way hypothesis does: the invariants after every rule
    (then `inspect`, before the teardown closes the ledger)."""
    state = machine()
    try:
        state.invariants_hold()
        for name, kwargs in calls:
            getattr(state, name)(**kwargs)
            state.invariants_hold()
        if inspect is not None:
            inspect(state)
    finally:
        state.teardown()
    return state


def rule_trace(rule: str, *before: tuple[str, dict[str, Any]], **kwargs: Any) -> list[str]:
    """The kinds of the disk operations, in order, a fresh machine's uncut
    `rule(**kwargs)` makes after the rules `before`: a `Crash(..., at=i)` cuts it at the
    i-th (1-based)."""
    probe = LedgerModel()
    try:
        for name, args in before:
            getattr(probe, name)(**args)
        start = probe.disk.ops
        getattr(probe, rule)(**kwargs, crash=None)
        return probe.disk.trace[start:]
    finally:
        probe.teardown()


def workspace_step_trace(paths: tuple[str, ...], content: int) -> list[str]:
    """`rule_trace` of a fresh machine's `workspace_step(paths, content)`."""
    return rule_trace("workspace_step", paths=paths, content=content)


def _blob_ops_of_a_workspace_step() -> list[int]:
    """The disk operations (1-based, into the call) of the post-image put a fresh
    workspace step with a file-sized post-image makes inside `admit`."""
    trace = workspace_step_trace((WS_PATH,), 2)
    return [i for i, kind in enumerate(trace, 1) if kind in F.BLOB_KINDS]


def test_regression_kill_inside_admit_then_retry() -> None:
    """Found by the FULL run (3 of 4 seeds), shrunk to two rules:

        state.workspace_step(content=2, crash=Crash('kill', at=18))   # op 18: the blob
        state.retry(crash=None, pick=0)                               # root's mkdir

    The kill lands after `admit` committed the planned attempt and pinned its post-image
    (a file-sized blob) but before the blob file exists. The retry then failed with
    BlobNotFound from `apply` (staging the post-image). Not a ledger bug: the model's
    client skipped `admit` for a step already in flight and went straight to `apply`;
    the documented recovery is the retried admission, which puts back the post-image
    file its recorded plan names (`admit` -> `_restore_post_images`). The client now
    always re-admits; this pins that the recovery works at every blob-store operation
    of the put, after a kill and after a power loss."""
    replay(LedgerModel, ("workspace_step", {"paths": (WS_PATH,), "content": 2, "crash": Crash("kill", at=18)}),
           ("retry", {"pick": 0, "crash": None}))
    points = _blob_ops_of_a_workspace_step()
    assert len(points) >= 4, points  # mkdirs, write, fsync, rename, dirfsync
    for at in points:
        for crash in (Crash("kill", at=at), Crash("power", at=at, model="drop")):
            state = replay(LedgerModel, ("workspace_step", {"paths": (WS_PATH,), "content": 2, "crash": crash}),
                           ("retry", {"pick": 0, "crash": None}))
            op = state.ops["ws#1"]
            assert "cut by" in state.history[0], (crash, state.history)
            assert op.acked and op.answer.startswith("committed:"), (crash, state.history)


def _kill_between_renames_and_fenced() -> int:
    """The disk operation (1-based, into the call) where a two-path workspace step's
    `fenced` commit starts: both renames have landed, nothing records them yet."""
    trace = workspace_step_trace(WS_PATHS, 3)
    last_rename = max(i for i, kind in enumerate(trace, 1) if kind == "ws-rename")
    return next(i for i, kind in enumerate(trace, 1) if i > last_rename and kind == "db-write")


def _cut_between_renames_and_fenced_then(
    *then: tuple[str, dict[str, Any]], kind: str
) -> Iterator[tuple[Crash, LedgerModel, list[tuple[str, str]], bool]]:
    """A two-path workspace step (app.py changed, lib/new.txt created) cut after both
    renames and before `fenced` — by a kill, then by a power loss — and the rules `then`.
    Per crash: the state, the (path, outcome) entries of the `kind` events (`rejected`:
    `undone`; `compensated`: `restored`), whether lib/new.txt is on disk at the end."""
    at = _kill_between_renames_and_fenced()
    for crash in (Crash("kill", at=at), Crash("power", at=at, model="drop")):
        entries: list[tuple[str, str]] = []
        created: list[bool] = []

        def inspect(state: LedgerModel) -> None:
            assert state.led is not None
            for r in state.led.read(kind=kind):
                entries.extend((x.path, x.outcome) for x in
                               (r.event.undone if kind == "rejected" else r.event.restored))
            root = state.led.workspaces.get("w").root
            created.append(os.path.exists(os.path.join(root, NEW_PATH)))

        state = replay(LedgerModel,
                       ("workspace_step", {"paths": WS_PATHS, "content": 3, "crash": crash}),
                       *then, inspect=inspect)
        yield crash, state, entries, created[0]


def test_regression_rejected_replay_puts_back_the_writes_that_landed() -> None:
    """Found by the FULL run (1 of 4 seeds; its 33-rule sequence reduces to these 3):

        state.workspace_step(paths=('app.py', 'lib/new.txt'), content=3,
                             crash=Crash('kill', at=61))   # after both renames, before `fenced`
        state.workspace_step(paths=('app.py',), content=0, crash=None)  # committed
        state.retry(pick=0, crash=None)                     # ws-1 -> rejected:stale_rev

    Before the fix, after the last rule `lib/new.txt` held ws-1's post-image while the
    ledger said the path was never written: the replay of attempt 1 was rejected on
    app.py (ws-2 had moved its rev) and neither undid nor recorded lib/new.txt's landed
    rename, and a rejected attempt is ended (compensate refuses it, settling skips it).
    Now a rejecting replay puts such writes back first and lists them in the event's
    `undone` (ledger/step/undo.py). The same holds with a power loss in
    place of the kill, and every invariant is checked after each rule."""
    for crash, state, undone, _ in _cut_between_renames_and_fenced_then(
            ("workspace_step", {"paths": (WS_PATH,), "content": 0, "crash": None}),
            ("retry", {"pick": 0, "crash": None}), kind="rejected"):
        assert state.ops["ws#1"].answer == "rejected:stale_rev", state.history
        assert undone == [(NEW_PATH, "restored")], (crash, undone)


def test_regression_settling_takes_back_the_file_the_attempt_created() -> None:
    """Issue 11 item 18 (found by replaying a project's history with SIGKILLs):

        state.workspace_step(paths=('app.py', 'lib/new.txt'), content=3,
                             crash=Crash('kill', at=61))   # after both renames, before `fenced`
        state.acquire(crash=None)                           # the next epoch settles ws-1

    Before the fix the settling restored app.py but called lib/new.txt — created by the
    dead attempt itself — a human's conflict and left it on disk (the invariant "the
    workspace holds what the ledger says, or a conflict only an attempt without the
    evidence of its apply leaves" fails). Its apply had pinned app.py's pre-image before
    any rename: evidence for the whole attempt, so the created file is removed. The same
    with a power loss in place of the kill."""
    for crash, state, restored, created in _cut_between_renames_and_fenced_then(
            ("acquire", {"crash": None}), kind="compensated"):
        assert "cut by" in state.history[0], (crash, state.history)
        assert sorted(restored) == [(WS_PATH, "restored"), (NEW_PATH, "restored")], (crash, restored)
        assert not created, crash


def _witness_write_op(rule: str, **kwargs: Any) -> int:
    """The disk operation (1-based, into the call) of the first witness write of `rule`
    run on a fresh machine: its first commit has landed, the witness does not know it."""
    return rule_trace(rule, **kwargs).index("witness-write") + 1


def test_regression_a_crash_between_commit_and_the_witness_write_is_accepted() -> None:
    """The honest crash the witness must accept: the call is cut after its COMMIT and
    before the witness heard of it (a kill, a power loss), so the ledger reopens one
    commit ahead of its witness — accepted, every invariant holds, and the retry
    finishes the call under the same witness."""
    at = _witness_write_op("artifact_step", inline=0, file=0)
    for crash in (Crash("kill", at=at), Crash("power", at=at, model="drop")):
        state = replay(LedgerModel, ("artifact_step", {"inline": 0, "file": 0, "crash": crash}),
                       ("retry", {"pick": 0, "crash": None}))
        assert "cut by" in state.history[0], (crash, state.history)
        assert any("ahead of the witness: accepted" in h for h in state.history), state.history
        assert state.ops["art#1"].acked, (crash, state.history)


def test_regression_a_restore_retried_after_a_later_restore() -> None:
    """Found by the witnessed machine (its rules moved the default run onto it):

        state.restore_workspace(crash=Crash('kill', at=16))  # recorded, then the kill
        state.restore_workspace(crash=None)                  # the root moves on
        state.retry(crash=None, pick=0)                      # IdempotencyConflict

    Not a ledger bug: the model's client redid the restore into the first target because
    the root was no longer there, which is another call (a new directory: another
    identity), not a retry; the journal rightly refused it. A retried restore now asks
    the ledger whether its restore was recorded; the same with a power loss."""
    at = _witness_write_op("restore_workspace")
    for crash in (Crash("kill", at=at), Crash("power", at=at, model="drop")):
        state = replay(LedgerModel, ("restore_workspace", {"crash": crash}),
                       ("restore_workspace", {"crash": None}), ("retry", {"pick": 0, "crash": None}))
        assert "cut by" in state.history[0], (crash, state.history)
        assert state.ops["restore#1"].answer.startswith("restored"), (crash, state.history)


@pytest.mark.xfail(strict=True, raises=InvariantBroken, reason=(
    "open (found by the witnessed FULL run; also on the unwitnessed machine): after a"
    " settled attempt's compensation ends in a conflict, workspace_paths still says the"
    " fenced post-image while a restore materializes the path absent"))
def test_regression_restore_after_a_settled_conflict_agrees_with_workspace_paths() -> None:
    """Found by the witnessed machine's FULL run (shrunk):

        state.acquire(crash=None)
        state.workspace_step(paths=('app.py',), content=0,
                             crash=Crash('power', at=66, model='drop', seed=0))
        state.restore_workspace(crash=None)   # app.py absent there (never published)
        state.restore_workspace(crash=None)   # "app.py: restore's committed content is
                                              # None, the projection's" ws-1's post-image

    ws-1 is fenced (app.py rev 1, its post-image) and never published; the power loss
    lands after `fenced`. The first restore writes the committed content (app.py is not
    in it: its v0 predates the ledger), and the new epoch settles ws-1: the pre-image
    cannot be put back over nothing, `compensated` records a conflict (digest None).
    `workspace_paths` still says app.py is ws-1's post-image, rev 1; the second restore
    writes app.py absent (and `committed_content` says so). The ledger's two views of the
    committed workspace disagree once the new root's WorkspaceRestored ends the conflict.
    Left for the owners of restore/settling (the same sequence fails on the machine
    without a witness at the equivalent operation); kept as a strict xfail.

    Diagnosis: the workspaces fold keeps a path's state through a compensation that ends
    in a conflict (no rev, no state change) and through `workspace-restored` (only the
    root changes), while a restore writes the committed content. Fences read only the
    path's rev, so no write is let through or lost by it; what is wrong is the hash the
    projection reports (`workspaces.paths`, the UI, `workspace show`). The fix: at
    `workspace-restored` the fold sets the workspace's path states to what the restore
    wrote — its committed content, which means the fold follows `manifest-published` as
    restore's own fold does (a projection change, so a version bump of the fold)."""
    trace = rule_trace("workspace_step", ("acquire", {"crash": None}), paths=(WS_PATH,), content=0)
    renamed = max(i for i, kind in enumerate(trace, 1) if kind == "ws-rename")
    at = next(i for i, kind in enumerate(trace, 1) if i > renamed and kind == "witness-write")
    replay(LedgerModel, ("acquire", {"crash": None}),
           ("workspace_step", {"paths": (WS_PATH,), "content": 0,
                               "crash": Crash("power", at=at, model="drop")}),
           ("restore_workspace", {"crash": None}), ("restore_workspace", {"crash": None}))

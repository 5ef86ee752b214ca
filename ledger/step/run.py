"""The runners: a step's whole lifecycle in one call, safe to call again after a crash.

`run_step` — an artifact-only step, in the order that makes it durable:

    local write -> pin -> durable blobs -> blob-stored -> manifest (commit point) -> ack

A fresh attempt whose artifacts all fit inline is ONE commit: `planned`, the inline
bytes with every `blob-stored` (no pins: nothing exists before that commit to hold),
`manifest-published` and `acked`. With a file blob among them it is two: `planned` with
every artifact's pin (before any byte is written), then — the files made durable first
— the inline bytes, every `blob-stored`, `manifest-published` and `acked` in one
transaction. A committed step returns its live manifest and runs nothing; an attempt in
flight is continued from what the ledger recorded, transition by transition — journal
keys make each one idempotent.

`run_fenced_step` — a step that writes a workspace: read, plan, admit, apply and commit,
or — called again — resumed from what the ledger recorded (a committed step answered,
an attempt in flight finished forward, a settled or refused one planned again from
fresh reads). A refusal is an outcome (`FencedOutcome`), not an exception.

Replay policy (a step that died between its blob upload and its manifest, replayed
with byte-different output): replay under the same step id and let the ledger decide.
The first manifest to land wins; a replay of a committed step is answered from the
ledger. An attempt that died before publishing is either continued by the same runner
or ended by whoever knows it is dead (compensation, or a new epoch's settling for
workspace-writing steps), and the next run is a new attempt whose publish creates the
manifest; the dead attempt's blobs become orphans for GC once unpinned. Replacing a
live manifest on purpose is a supersede (`publish(expected_rev=live)`), recording both
digests.

Functions over the ledger's `Site`; `ledger.runner` is the public front
(``run_step(ledger, …)``, ``run_fenced_step(ledger, …)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..blobs import Content, digest_of
from ..diffs import unified_diff
from ..errors import BlobNotFound, InvalidInput, LedgerError, PathEscapes, PlanConflict, StaleEpoch
from ..events import Manifest
from ..projections.steps import COMPENSATING, ENDED, PLANNED, StepRow
from . import artifacts, undo
from .admit import admit
from .apply import apply
from .artifacts import artifact_bytes
from .attempt import read_attempt
from .site import Site
from .tidy import tidy
from .values import ApplyResult, FenceMode, FileRead, Receipt, StepPlan, Write


Outputs = Mapping[str, bytes] | Callable[[], Mapping[str, bytes]]


@dataclass(frozen=True)
class StepResult:
    """What `run_step` did: `ran` is False when the step was already committed.

    >>> from ledger import Ledger, run_step
    >>> with Ledger.init("ledger.db") as ledger:
    ...     first = run_step(ledger, "build-1", {"report.txt": b"ok\\n"})
    ...     again = run_step(ledger, "build-1", lambda: {"report.txt": b"other"})
    >>> first.ran, again.ran, again.manifest == first.manifest
    (True, False, True)
    """

    step: str
    attempt: int
    manifest: Manifest
    ran: bool


def run_step(site: Site, step: str, outputs: Outputs, *, run: str = "") -> StepResult:
    """`ledger.runner.run_step`, over the ledger's `Site`."""
    # Bytes given (not a callable to run only when needed): the step's state is read
    # inside the transaction that records it, not before.
    row = site.core.steps.find(step) if callable(outputs) else None
    if row is not None and row.live:
        return _committed_result(site, row)
    produced = dict(outputs() if callable(outputs) else outputs)
    produced = {path: artifact_bytes(path, data) for path, data in produced.items()}
    digested = {path: (digest_of(data), data) for path, data in produced.items()}
    fresh = row is None or row.state in ENDED
    if fresh and all(len(data) <= site.core.options.inline_max_bytes for _, data in digested.values()):
        # Every artifact fits inline: nothing is written outside the ledger, so the whole
        # attempt — plan, pins, bytes, stores, manifest, ack — is one commit.
        done = artifacts.step_in_one_commit(site, step, run, digested)
        if isinstance(done, tuple):
            return StepResult(step, done[0], done[1], ran=True)
        # not fresh (committed, or in flight: continue it), or another runner's attempt
        row = site.core.steps.find(step) if done is None else done
        if row is not None and row.live:
            return _committed_result(site, row)
        fresh = False
    elif row is None:
        row = site.core.steps.find(step)
        if row is not None and row.live:
            return _committed_result(site, row)
        fresh = row is None or row.state in ENDED
    row = artifacts.plan(site, step, run=run, artifacts=tuple(produced),
                       pins=[d for d, _ in digested.values()] if fresh else ())
    if row.live:  # a concurrent runner committed it meanwhile
        manifest = artifacts.manifest_of(site, step)
        assert manifest is not None
        if row.state != "acked":
            artifacts.ack(site, step, row.attempt)
        return StepResult(step, row.attempt, manifest, ran=False)
    attempt = row.attempt
    if fresh and row.state == "planned":
        # This call planned the attempt (its pins committed with it) and a file blob is
        # among its artifacts: the files are made durable, then every blob-stored, the
        # manifest and the ack go in one transaction — 2 commits a step.
        try:
            fast = artifacts.store_and_publish(site, row, attempt, digested)
        except BlobNotFound:
            fast = None  # a blob vanished before the commit: the step-by-step path below
        if fast is not None:
            return StepResult(step, attempt, fast, ran=True)
    # Continuing an attempt found in flight (a replay): transition by transition.
    for path in sorted(produced):
        artifacts.store(site, step, attempt, path, produced[path])
    try:
        manifest = artifacts.publish(site, step, attempt)
    except BlobNotFound:
        # A blob vanished between its store and the publish (a collector, a human):
        # the publish refused cleanly; store the bytes again and publish once more.
        for path in sorted(produced):
            artifacts.store(site, step, attempt, path, produced[path])
        manifest = artifacts.publish(site, step, attempt)
    artifacts.ack(site, step, attempt)
    return StepResult(step, attempt, manifest, ran=True)


def _committed_result(site: Site, row: StepRow) -> StepResult:
    """A committed step's answer: its live manifest (acked first if it died between the
    publish and the ack: the ack releases its pins); nothing runs."""
    manifest = artifacts.manifest_of(site, row.step_id)
    assert manifest is not None
    if row.state != "acked":
        artifacts.ack(site, row.step_id, row.attempt)
    return StepResult(row.step_id, row.attempt, manifest, ran=False)


# -- the fenced step -------------------------------------------------------------------


class StepStatus(StrEnum):
    """How a fenced step came out (`FencedOutcome.status`).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepStatus, run_fenced_step
    >>> plan = lambda read: [read.read("app.py").write(b"v1\\n")]
    >>> _ = run_fenced_step(ledger, "repo", "edit-1", plan, epoch=lease.epoch)
    >>> again = run_fenced_step(ledger, "repo", "edit-1", plan, epoch=lease.epoch)
    >>> again.status is StepStatus.DEDUPED
    True
    >>> ledger.close()
    """

    APPLIED = "applied"  # this call planned (or continued) the step and committed it
    DEDUPED = "deduped"  # it was committed before: nothing ran, its manifest is the answer
    CONFLICT = "conflict"  # the fence refused it: a path no longer holds what was read
    STALE_EPOCH = "stale_epoch"  # the lease moved on: this caller commits nothing
    REJECTED = "rejected"  # refused for another reason (`reason`)


class RejectReason(StrEnum):
    """Why the fence refused an attempt (the `rejected` event's reason).

    >>> from ledger import RejectReason
    >>> RejectReason("pre_hash")
    <RejectReason.PRE_HASH: 'pre_hash'>
    """

    STALE_REV = "stale_rev"
    PRE_HASH = "pre_hash"
    STALE_EPOCH = "stale_epoch"
    OVERLAP = "overlap"


@dataclass(frozen=True)
class PathConflict:
    """One path a fence refused: what the planner read and what is there now.

    `read_hash`/`read_rev`: the write's `pre_hash` and `base_rev`; `on_disk_hash` (None:
    absent) and `on_disk_rev`: now; `diff`: what was read → what is there, when the
    planner read the bytes through this call's reader and both are text-sized.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import run_fenced_step
    >>> def edit(read):
    ...     got = read.read("app.py")
    ...     _ = Path("repo/app.py").write_text("a person's fix\\n")   # the file changes under it
    ...     return [got.write(b"v1\\n")]
    >>> out = run_fenced_step(ledger, "repo", "edit-1", edit, epoch=lease.epoch)
    >>> out.status.value, out.conflicts[0].path
    ('conflict', 'app.py')
    >>> ledger.close()
    """

    path: str
    read_hash: str | None
    read_rev: int | None
    on_disk_hash: str | None
    on_disk_rev: int
    diff: str = ""


@dataclass(frozen=True)
class FencedOutcome:
    """What `run_fenced_step` did. `ran`: the planner was called in this call.
    `receipt` and `manifest`: the committed apply (APPLIED, DEDUPED); `reason`,
    `conflicts`, `detail`: why not (CONFLICT, REJECTED, STALE_EPOCH).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import run_fenced_step
    >>> out = run_fenced_step(ledger, "repo", "edit-1",
    ...                       lambda read: [read.read("app.py").write(b"v1\\n")], epoch=lease.epoch)
    >>> out.status.value, out.ran, [e.path for e in out.manifest.writes]
    ('applied', True, ['app.py'])
    >>> ledger.close()
    """

    status: StepStatus
    step: str
    attempt: int
    ran: bool = False
    receipt: Receipt | None = None
    manifest: Manifest | None = None
    reason: RejectReason | None = None
    conflicts: tuple[PathConflict, ...] = ()
    detail: str = ""
    #: STALE_EPOCH: the refusal as the ledger raised it, for a caller that raises on
    error: StaleEpoch | None = None

    @property
    def committed(self) -> bool:
        return self.status in (StepStatus.APPLIED, StepStatus.DEDUPED)

    def raise_for_status(self) -> FencedOutcome:
        """Return this outcome when the step committed (APPLIED, DEDUPED); raise
        otherwise — `StaleEpoch` when the lease moved on, `StepRejected` (with the
        conflicting paths in `facts`) for a conflict or another rejection. A conflict is
        a return value, easy to ignore: a loop that ignores it silently skips an edit;
        this makes it an exception, as ``requests``' method of that name does.

        >>> from pathlib import Path
        >>> from ledger import Ledger, StepRejected, run_fenced_step
        >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
        >>> ledger = Ledger.init("ledger.db")
        >>> _ = ledger.workspaces.add("repo", "repo")
        >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
        >>> def edit(read):
        ...     got = read.read("app.py")
        ...     _ = Path("repo/app.py").write_text("a person's edit\\n")
        ...     return [got.write(b"v1\\n")]
        >>> try:
        ...     run_fenced_step(ledger, "repo", "e1", edit, epoch=lease.epoch).raise_for_status()
        ... except StepRejected as e:
        ...     print(e.reason, e.facts["paths"])
        pre_hash ['app.py']
        >>> ledger.close()
        """
        if self.committed:
            return self
        if self.status is StepStatus.STALE_EPOCH and self.error is not None:
            raise self.error
        from ..errors import StepRejected

        raise StepRejected(self.step, self.attempt, str(self.reason or self.status),
                           self.detail, {"paths": [c.path for c in self.conflicts]})


class StepReader:
    """What a planner reads through: `read(path)` returns the bytes with the rev and hash
    to fence on (`ledger.workspaces.read_file`), and remembers them, so a refusal can show a diff
    from exactly what was read.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepReader
    >>> StepReader(ledger, "repo").read("app.py").content
    b'v0\\n'
    >>> ledger.close()
    """

    def __init__(self, source: Any, workspace: str) -> None:
        #: Where the reads go: a `Ledger` (its ``workspaces``), or anything with its
        #: ``read_file(workspace, path, max_bytes=)``.
        self.source = getattr(source, "workspaces", source)
        self.workspace = workspace
        self.reads: dict[str, FileRead] = {}

    def read(self, path: str, *, max_bytes: int | None = None) -> FileRead:
        got = self.source.read_file(self.workspace, path, max_bytes=max_bytes)
        self.reads[path] = got
        return got


Planner = Callable[[StepReader], Sequence[Write]] | Sequence[Write]


def run_fenced_step(site: Site, workspace: str, step: str, plan: Planner, *, epoch: int,
                    run: str = "", fence: FenceMode = "step", journal: bool = True,
                    plan_rev: int | None = None, irreversible: bool = False,
                    artifacts: Mapping[str, Content] | None = None,
                    on_planned: Callable[[str], None] | None = None,
                    on_stage: Callable[[str], None] | None = None,
                    observe: bool = False) -> FencedOutcome:
    """`ledger.runner.run_fenced_step`, over the ledger's `Site`."""

    def stage(name: str) -> None:
        try:
            if name == "planned" and on_planned is not None:
                on_planned(step)
            if on_stage is not None:
                on_stage(name)
        except Exception as exc:  # the harness's own: carried past this call's handling
            raise _FromHook(exc) from exc

    reader = StepReader(site.places, workspace)
    outputs = {p: d if not isinstance(d, bytes | bytearray | memoryview)
               else artifact_bytes(p, d) for p, d in (artifacts or {}).items()}
    options = _Options(run, fence, journal, plan_rev, irreversible)
    try:
        if observe:
            from .observe import observe as observe_outside

            observe_outside(site, workspace, epoch, by=f"runner:{step}"[:255])
        out = _run_fenced(site, workspace, step, plan, reader, epoch, options, outputs, stage)
    except _FromHook as hook:
        # the hook's exception ends the call where it was raised, as it is: never read
        # as this call's own outcome (a StaleEpoch of another workspace is not this step's)
        raise hook.exc from None
    except StaleEpoch as exc:
        row = site.core.steps.find(step)
        return FencedOutcome(StepStatus.STALE_EPOCH, step, row.attempt if row else 0,
                             reason=RejectReason.STALE_EPOCH, detail=str(exc), error=exc)
    if out.status is StepStatus.APPLIED:
        try:
            stage("committed")
        except _FromHook as hook:
            raise hook.exc from None
    return out


class _FromHook(Exception):
    """An exception a stage hook raised, carried out of the runner unread."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


@dataclass(frozen=True)
class _Options:
    run: str
    fence: FenceMode
    journal: bool
    plan_rev: int | None
    irreversible: bool


def _run_fenced(site: Site, workspace: str, step: str, plan: Planner, reader: StepReader,
                epoch: int, opt: _Options, outputs: dict[str, Content],
                stage: Callable[[str], None]) -> FencedOutcome:
    row = site.core.steps.find(step)
    if row is not None and row.workspace not in ("", workspace):
        raise InvalidInput(f"step {step!r} writes workspace {row.workspace!r}, not"
                           f" {workspace!r}; give each workspace's steps their own ids")
    if row is not None and row.live and row.state != COMPENSATING:
        out = _committed(site, step, row, epoch, ran=False, before=True)
        tidy(site, step)  # a kill after its commit left slots
        return out
    if row is not None and row.state not in ENDED and row.epoch < epoch:
        undo.settle(site, workspace, epoch)  # an older epoch's attempt: settled, then anew
        row = site.core.steps.find(step)
    elif row is not None and row.state == COMPENSATING:
        undo.compensate(site, step, epoch=epoch)  # an undo killed halfway: finished first
        row = site.core.steps.find(step)
    ran = False
    if row is not None and row.state not in ENDED and row.state != PLANNED \
            and row.epoch == epoch:
        # applied under this epoch and recorded, not committed (a stop after the apply):
        # finished forward from the recorded apply — never applied again, which with
        # the journal off would meet the step's own write as a stale rev
        receipt = read_attempt(site.core.log, step, row.attempt).receipt
        if receipt is not None:
            result = ApplyResult(verdict="deduped", step=step, attempt=row.attempt,
                                 receipt=receipt)
            return _answer(site, workspace, step, result, reader, epoch, ran, outputs, stage)
    if row is not None and row.state not in ENDED:
        # in flight under this epoch: continue the recorded plan (a kill between its
        # exchanges is finished forward) — unless a post-image it needs was never
        # stored (a kill between the plan's commit and a large file's write)
        try:
            result = _apply(site, step, row.attempt, epoch, outputs)
        except BlobNotFound:
            row = None if row.state != PLANNED else row
            if row is None:
                raise
        else:
            return _answer(site, workspace, step, result, reader, epoch, ran, outputs, stage)
    writes = list(plan(reader) if callable(plan) else plan)
    ran = True
    planned = StepPlan(step, writes, artifacts=tuple(sorted(outputs)), run=opt.run,
                       irreversible=opt.irreversible)

    def admit_plan() -> ApplyResult | None:
        return admit(site, workspace, epoch, [planned], fence=opt.fence,
                            journal=opt.journal, plan_rev=opt.plan_rev)[0]

    try:
        refused = admit_plan()  # a first plan; or the recorded one again (it stores its
        # post-images anew)
    except PlanConflict:
        # planned before from other reads (the disk moved on since): that attempt
        # never applied anything; it ends and this plan is the next attempt
        undo.compensate(site, step, epoch=epoch, reason="planned again from fresh reads")
        refused = admit_plan()
    if refused is not None:
        return _refused(site, workspace, step, refused, reader, ran)
    stage("planned")
    result = _apply(site, step, None, epoch, outputs)  # (the attempt just planned)
    return _answer(site, workspace, step, result, reader, epoch, ran, outputs, stage)


def _apply(site: Site, step: str, attempt: int | None, epoch: int,
           outputs: dict[str, Content]) -> ApplyResult:
    """The apply that commits the step when every artifact fits in a row: they are
    stored with the apply, the manifest and the ack, in one transaction. With a larger
    one the apply commits alone; the artifacts are stored (pinned, durable, recorded:
    after the apply, as the lifecycle orders them) and the step published by the caller
    (`_answer`)."""
    inline = {p: d for p, d in outputs.items()
              if isinstance(d, bytes) and len(d) <= site.core.options.inline_max_bytes}
    if len(inline) != len(outputs):
        return apply(site, step, attempt, epoch=epoch)
    return apply(site, step, attempt, epoch=epoch, commit=True, inline_artifacts=inline)


def _answer(site: Site, workspace: str, step: str, result: ApplyResult,
            reader: StepReader, epoch: int, ran: bool,
            outputs: dict[str, Content], stage: Callable[[str], None]) -> FencedOutcome:
    if not result.applied:
        return _refused(site, workspace, step, result, reader, ran)
    stage("applied")
    if result.committed and result.manifest is not None:  # committed by this very call
        return FencedOutcome(StepStatus.APPLIED, step, result.attempt, ran=ran,
                             receipt=result.receipt, manifest=result.manifest)
    row = site.core.steps.get(step)
    if not row.live:  # applied before (a replay): its artifacts stored, then committed
        for path in sorted(outputs):
            artifacts.store(site, step, row.attempt, path, outputs[path])
    return _committed(site, step, row, epoch, ran=ran, receipt=result.receipt)


def _committed(site: Site, step: str, row: StepRow, epoch: int, *, ran: bool,
               receipt: Receipt | None = None, before: bool = False) -> FencedOutcome:
    """Finish a step that is applied or committed: publish, ack, answer (DEDUPED when it
    was committed `before` this call)."""
    if not row.live:
        artifacts.publish(site, step, row.attempt)
        row = site.core.steps.get(step)
    if not row.acked:
        artifacts.ack(site, step, row.attempt, epoch=epoch)
    manifest = artifacts.manifest_of(site, step)
    if receipt is None:
        receipt = read_attempt(site.core.log, step, row.attempt).receipt
    return FencedOutcome(StepStatus.DEDUPED if before else StepStatus.APPLIED, step, row.attempt,
                         ran=ran, receipt=receipt, manifest=manifest)


def _refused(site: Site, workspace: str, step: str, result: ApplyResult,
             reader: StepReader, ran: bool) -> FencedOutcome:
    reason = RejectReason(result.reason) if result.reason in set(RejectReason) else None
    if result.outcome == "compensated" or reason is None:
        return FencedOutcome(StepStatus.REJECTED, step, result.attempt, ran=ran,
                             detail=result.detail or result.verdict)
    conflicts = []
    planned = read_attempt(site.core.log, step, result.attempt).planned
    for w in planned.writes if planned is not None else ():
        try:
            rev, now = site.places.snapshot(workspace, w.path)
        except PathEscapes:  # a symlink, a directory, a FIFO swapped in: no bytes to show
            conflicts.append(PathConflict(w.path, w.pre_hash, w.base_rev, None, w.base_rev, ""))
            continue
        if now == w.pre_hash and rev == w.base_rev:
            continue  # this path still holds what was read
        diff = ""
        got = reader.reads.get(w.path)
        if got is not None and (now is None or got.content is not None):
            try:
                after = None if now is None else site.places.read_file(workspace, w.path).content
            except LedgerError:
                after = None
            diff = unified_diff(got.content, after, w.path, before_label="read",
                                after_label="on disk now")
        conflicts.append(PathConflict(w.path, w.pre_hash, w.base_rev, now, rev, diff))
    status = StepStatus.REJECTED if reason == RejectReason.OVERLAP else StepStatus.CONFLICT
    return FencedOutcome(status, step, result.attempt, ran=ran, reason=reason,
                         conflicts=tuple(conflicts), detail=result.detail)


__all__ = ["FencedOutcome", "PathConflict", "Planner", "RejectReason", "StepReader",
           "StepResult", "StepStatus", "run_fenced_step", "run_step"]

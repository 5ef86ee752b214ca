"""Workspaces, epoch leases, revision fences, the apply journal, compensation.

docs/design.md "The commit protocol" steps 1–2 and "Epochs and leases": `Workspaces`, the
collaborator `Ledger` composes and users reach as ``ledger.workspaces``, working through
the ledger's `Core` (`ledger.workspace.core`) — the
log, the storage, the clock, the options — never the `Ledger` itself. The order is the
point:

1. plan (`admit`, `plan_step`, `replan`): a durable `planned` event with each write's
   path, base_rev, pre_hash and post-image digest; the post-images are pinned and
   stored in the same step, before anything is applied.
2. apply: the store's write lock covers the commit only. With no lock held, the
   pre-images on disk are stored and the post-images are staged (temporary files,
   fsynced); then the checks: the journal — `(workspace, step, attempt)` — answers a
   redelivery; the epoch must be live; each write's path rev must equal its base_rev
   and the bytes on disk must hash to its pre_hash (`fence="step"`; `plan` compares the
   workspace rev with the run's admitted plan rev; `none` checks nothing); then the
   staged files are exchanged into place — the epoch read again before each — and their
   directories fsynced. Then one transaction checks again what may have moved (the
   journal, the live epoch, the attempt, the revs) and records `fenced` with the new
   revisions and hashes. A takeover during the file work is seen at the next landing or
   at the commit: what landed is taken back, and the caller hears StaleEpoch.
3. compensate: fenced like a write — a pre-image goes back only where the path's rev
   is still the attempt's and its bytes still hash to the attempt's post-image.

A crash between a rename and the `fenced` commit is settled when the attempt is
applied again under the same epoch (the post-image on disk with the path rev still at
base is recorded, `settled=True`), or by the next epoch's settling (which compensates
it). Opening a ledger never does either on its own.
"""

from __future__ import annotations

import builtins  # (annotations: `Workspaces.list` shadows the builtin in the class)
import contextlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from ..blobs import (
    Content,
    check_content,
    content_bytes,
    content_digest,
    digest_of,
    fd_chunks,
)
from ..errors import (
    BlobCorrupt,
    BlobNotFound,
    ContentChanged,
    CompensationWindowClosed,
    DatabaseUnavailable,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerError,
    LedgerMoved,
    PathEscapes,
    PlanConflict,
    ReplanRefused,
    StaleEpoch,
    StorageFailure,
    UnknownStep,
    UnknownWorkspace,
    Unsettled,
    WorkspaceMoved,
    WorkspaceOverlap,
)
from ..events import (
    Acked,
    AppliedWrite,
    TEXT_MAX,
    BlobStored,
    BlobPinned,
    Compensated,
    Compensating,
    Event,
    Fenced,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    Manifest,
    ManifestEntry,
    ManifestPublished,
    Planned,
    PlannedWrite,
    RecordedEvent,
    Rejected,
    Restored,
    WorkspaceAdded,
    WorkspaceRebound,
    check_digest,
    check_int,
    check_relpath,
    check_step_id,
    journal_key,
    manifest_digest,
)
from .confined import Confined
from .core import Core
from .moves import KEPT_MARK, stat_at
from .place import ledger_moved
from .restore import RestoreReport, restore
from ..projections import read_workspaces
from ..projections.steps import (
    COMPENSATED,
    COMPENSATING,
    ENDED,
    IN_FLIGHT,
    PLANNED,
    REJECTED,
    StepRow,
)
from ..projections.steps import VERSION as STEPS_VERSION
from ..projections.workspaces import REGISTRATION_KINDS, Registration, WsRow, load_registration
from ..store import EventQuery, Head, Scope, Tx
from .directory import (
    NOT_A_FILE,
    DirectoryMoved,
    FileIdentity,
    Found,
    Landing,
    Staged,
    StagingLost,
    TakeBack,
    WorkspaceDir,
    attempt_tag,
    identity_of,
)

FenceMode = Literal["step", "plan", "none"]
FENCE_MODES: Final = ("step", "plan", "none")
#: A committed step may be compensated this long after it was published.
COMPENSATION_WINDOW_S_DEFAULT: Final = 24 * 3600
TTL_MAX_S: Final = 7 * 24 * 3600


@dataclass(frozen=True)
class Write:
    """One file a step will change, as its planner saw it.

    `pre_hash` is the sha256 of the content the write was planned against (None: the
    file did not exist); `content` the new bytes (None: delete the file) — or a binary
    file open for reading (seekable) holding them, which admission hashes and streams
    into the blob store without holding it whole (large post-images); `base_rev` the
    path's rev the planner read (None: the path's current rev, or — in a batch — the
    rev an earlier sibling's write to the same path will get).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> write = ledger.workspaces.read_file("repo", "app.py").write(b"v1\\n")
    >>> write.path, write.base_rev
    ('app.py', 0)
    >>> ledger.close()
    """

    path: str
    content: Content | None
    pre_hash: str | None
    base_rev: int | None = None
    #: The permission bits a file this write creates gets (None: the umask's); a move
    #: gives its source's, so the file is never wider than the source, not even staged.
    #: A write over an existing file keeps that file's bits.
    mode: int | None = None


@dataclass(frozen=True)
class FileRead:
    """What a planner read of one workspace path: its bytes and the facts to fence on.

    `pre_hash` is the sha256 of exactly `content` (None, like `content`: the file did
    not exist) and `rev` the path's revision read just before it, so a write planned
    from this read is refused if anything — another step or a person's edit — changed
    the path after the planner saw it. `write(new)` builds that write.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> read.rev, read.content
    (0, b'v0\\n')
    >>> ledger.close()
    """

    workspace: str
    path: str
    rev: int
    pre_hash: str | None
    content: bytes | None

    def write(self, content: Content | None) -> Write:
        """The write that changes this path from what was read to `content` (None:
        delete it), fenced on this read's revision and hash."""
        return Write(self.path, content, pre_hash=self.pre_hash, base_rev=self.rev)


@dataclass(frozen=True)
class StepPlan:
    """A step as a planner emits it: its writes and declared artifacts.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepPlan
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> steps = [StepPlan("edit-1", [read.write(b"v1\\n")])]
    >>> _ = ledger.workspaces.admit("repo", lease.epoch, steps)
    >>> ledger.step("edit-1").state
    'planned'
    >>> ledger.close()
    """

    step: str
    writes: Sequence[Write] = ()
    artifacts: Sequence[str] = ()
    run: str = ""
    irreversible: bool = False


class SettleConflict(msgspec.Struct, frozen=True, kw_only=True):
    """A path settling left as found for a human: a ``conflict`` entry of the
    compensation that ended `step`'s `attempt` (nothing was overwritten).

    >>> from ledger import SettleConflict, digest_of
    >>> conflict = SettleConflict(step="edit-1", attempt=1, path="app.py", rev=2,
    ...                           digest=digest_of(b"v1\\n"))
    >>> conflict.path
    'app.py'
    """

    step: str
    attempt: int
    path: str
    rev: int  # the path's rev in the ledger
    digest: str | None  # what the path held (None: absent, or not a regular file)


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace's lease as the ledger holds it.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> lease.epoch, lease.holder, lease.live
    (1, 'agent-1', True)
    >>> ledger.close()
    """

    workspace: str
    epoch: int
    holder: str
    expires_ns: int
    live: bool
    released: bool
    settled: tuple[str, ...] = ()  # steps an acquire compensated (older epochs' in flight)
    unsettled: tuple[str, ...] = ()  # steps settling failed for (see `settle`): retry it
    # paths the acquire's settling left for a human (the lease is acquired all the same)
    conflicts: tuple[SettleConflict, ...] = ()


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What applying an attempt returns: hand it to `publish(receipt=...)`.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepPlan
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> steps = [StepPlan("edit-1", [read.write(b"v1\\n")])]
    >>> _ = ledger.workspaces.admit("repo", lease.epoch, steps)
    >>> receipt = ledger.workspaces.apply("edit-1", epoch=lease.epoch).receipt
    >>> ledger.publish("edit-1", receipt=receipt).writes[0].path
    'app.py'
    >>> ledger.close()
    """

    workspace: str
    step: str
    attempt: int
    epoch: int
    rev: int
    writes: tuple[AppliedWrite, ...]
    seq: int
    settled: bool = False


#: What an apply came to (`ApplyResult.outcome`).
Outcome = Literal["applied", "deduped", "rejected", "compensated"]
#: Why an attempt was rejected (`ApplyResult.reason`; the `rejected` event records it).
RejectReason = Literal["stale_rev", "pre_hash", "stale_epoch", "overlap"]


class ApplyResult(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict of an apply and, when the writes are (or were) applied, the receipt.

    `verdict`: ``applied``; ``deduped`` (the journal answered: the receipt is the first
    apply's); ``rejected:<reason>``; or the attempt's end when it is over
    (``compensated``).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepPlan
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> steps = [StepPlan("edit-1", [read.write(b"v1\\n")])]
    >>> _ = ledger.workspaces.admit("repo", lease.epoch, steps)
    >>> result = ledger.workspaces.apply("edit-1", epoch=lease.epoch)
    >>> result.verdict, Path("repo/app.py").read_bytes()
    ('applied', b'v1\\n')
    >>> ledger.close()
    """

    verdict: str
    step: str
    attempt: int
    receipt: Receipt | None = None
    detail: str = ""
    #: what the fence saw when this call rejected the attempt (``pre_hash``: `path`,
    #: `on_disk` — the hash found, null: absent —, `pre_hash`, `post_hash`;
    #: ``stale_rev``: `path`, `path_rev`, `base_rev` or `workspace_rev`, `plan_rev`;
    #: ``overlap``: `paths`). Empty when the verdict was read back from the log.
    facts: dict[str, Any] = msgspec.field(default_factory=dict)
    #: the same transaction published the manifest and acked it (`apply(commit=True)`)
    committed: bool = False
    #: that manifest, when `committed` (not part of `step apply --json`)
    manifest: Manifest | None = None

    @property
    def applied(self) -> bool:
        return self.verdict in ("applied", "deduped")

    @property
    def outcome(self) -> Outcome:
        """The verdict without its reason: ``applied``, ``deduped``, ``rejected`` or
        ``compensated`` (`verdict` keeps the ``rejected:<reason>`` text of the JSON
        contract)."""
        return self.verdict.partition(":")[0]  # type: ignore[return-value]

    @property
    def reason(self) -> RejectReason | None:
        """Why the attempt was rejected (``pre_hash``, ``stale_rev``, ``overlap``, …);
        None unless `outcome` is ``rejected``."""
        kind, _, why = self.verdict.partition(":")
        return why if kind == "rejected" else None  # type: ignore[return-value]


class Compensation(msgspec.Struct, frozen=True, kw_only=True):
    """What a compensation did, per path (``restored``, ``already``, ``conflict``).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepPlan
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> steps = [StepPlan("edit-1", [read.write(b"v1\\n")])]
    >>> _ = ledger.workspaces.admit("repo", lease.epoch, steps)
    >>> _ = ledger.workspaces.apply("edit-1", epoch=lease.epoch)
    >>> done = ledger.workspaces.compensate("edit-1", epoch=lease.epoch)
    >>> [r.outcome for r in done.restored], Path("repo/app.py").read_bytes()
    (['restored'], b'v0\\n')
    >>> ledger.close()
    """

    step: str
    attempt: int
    seq: int
    restored: tuple[Restored, ...]
    deduped: bool = False

    @property
    def conflicts(self) -> tuple[Restored, ...]:
        return tuple(r for r in self.restored if r.outcome == "conflict")


def settle_conflicts(done: Sequence[Compensation]) -> tuple[SettleConflict, ...]:
    """Every path the compensations `done` left as found, in their order.

    >>> from ledger import settle_conflicts
    >>> settle_conflicts([])
    ()
    """
    return tuple(SettleConflict(step=c.step, attempt=c.attempt, path=r.path, rev=r.rev,
                                digest=r.digest) for c in done for r in c.conflicts)


class KeptFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file steptrail kept under a visible name instead of removing it (a person raced
    a step: what a take-back or an undo could not put back): `kept`, its path in the
    workspace; `path`, the step's path it belongs beside; the step and attempt whose
    refusal or compensation recorded it (`seq`) — or, for one kept after a commit (what
    a write displaced had been appended to since; a dead stager's temporary gc could not
    show the ledger holds), found on disk by its name: `seq` 0, the step and attempt its
    name's tag belongs to ("" and 0 when the ledger knows none); `present`, whether it
    is still there (a person removes it once they have kept what they need)."""

    workspace: str
    path: str
    kept: str
    step: str
    attempt: int
    seq: int
    present: bool


class _Answered(Exception):
    """Raised inside a transaction to roll it back and answer without writing."""

    def __init__(self, result: Any) -> None:
        super().__init__("answered")
        self.result = result


class _Moved(Exception):
    """Raised inside the transaction that would record a draft (`_Draft`): something the
    draft decided on moved since it was read. Rolls the transaction back; the caller
    takes back what the draft landed (an apply) or goes on from the disk (an undo) and
    decides again."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


#: How many times an apply or an undo decides again after what it read moved under its
#: file work (`_Moved`) before it gives up (StorageFailure: apply again).
DRAFT_ROUNDS: Final = 3


def _step_key(row: StepRow | None) -> tuple[int, str] | None:
    return None if row is None else (row.attempt, row.state)


class _Draft:
    """What a builder reads and writes, for a builder run with no store lock held: the
    checks of an apply or an undo and its file work (docs/design.md "Epochs and leases":
    the write lock covers commits only).

    It stands where the transaction stood for `_fence`, `_roll_back`, `_undo`: each read
    goes to the store's latest commit (no snapshot or lock is held across the file
    work) and is remembered; the inline bytes the builder would write are kept for the
    transaction that records its events (`flush`), which first asks `moved` whether
    anything the draft decided on reads otherwise now."""

    def __init__(self, view: Any, now: int, step_row: Any,
                 before_path: Any = None) -> None:
        self._view = view
        self._step_row = step_row
        #: Called with a path before the builder first reads its state (an undo's check
        #: of its epoch before it works on that path).
        self._before_path = before_path
        #: The time the builder decides at (its clock's now; the commit judges again).
        self.time_ns = now
        self._started = time.monotonic_ns()
        self.inline: dict[str, bytes] = {}
        self.steps: dict[str, tuple[int, str] | None] = {}
        self.journal: dict[str, bool] = {}
        self.workspaces: dict[str, WsRow | None] = {}
        self.paths: dict[tuple[str, str], Any] = {}
        self.in_flight: dict[tuple[Any, ...], list[tuple[str, int]]] = {}
        self.blobs: dict[str, bool] = {}

    # -- reads, each remembered --------------------------------------------------------

    def step(self, step_id: str) -> StepRow | None:
        row = self._step_row(step_id)
        self.steps.setdefault(step_id, _step_key(row))
        return row  # type: ignore[no-any-return]

    def journal_lookup(self, key: str) -> Any:
        row = self._view.journal_lookup(key)
        self.journal.setdefault(key, row is not None)
        return row

    def workspace(self, name: str) -> WsRow | None:
        row = self._view.workspace(name)
        self.workspaces.setdefault(name, row)
        return row  # type: ignore[no-any-return]

    def path_state(self, workspace: str, path: str) -> Any:
        if self._before_path is not None:
            self._before_path(path)
        state = self._view.path_state(workspace, path)
        self.paths.setdefault((workspace, path), state)
        return state

    def steps_in_flight(self, workspace: str, before_epoch: int | None = None, *,
                        limit: int | None = None, oldest_first: bool = False
                        ) -> list[tuple[str, int]]:
        got = self._view.steps_in_flight(workspace, before_epoch, limit=limit,
                                         oldest_first=oldest_first)
        self.in_flight.setdefault((workspace, before_epoch, limit, oldest_first), list(got))
        return got  # type: ignore[no-any-return]

    def blob_size(self, digest: str) -> tuple[int, bool] | None:
        found = self._view.blob_size(digest)
        self.blobs.setdefault(digest, found is not None)
        return found  # type: ignore[no-any-return]

    def events(self, query: EventQuery) -> Any:
        return self._view.events(query)  # immutable rows: nothing to check again

    # -- writes, kept for the transaction ----------------------------------------------

    def put_inline(self, blobs: dict[str, bytes], _stored_ns: int) -> None:
        self.inline.update(blobs)

    def flush(self, tx: Tx, now: int) -> None:
        if self.inline:
            tx.put_inline(self.inline, now)

    # -- the check at the commit -------------------------------------------------------

    def moved(self, tx: Tx) -> str | None:
        """What the draft read that `tx` reads otherwise (None: nothing): a path's state,
        the steps in flight, a blob the draft found stored (it stored the others
        itself). The step row, the journal and the workspace (its live epoch; its rev,
        for a plan-fenced apply) are the caller's to compare."""
        for (workspace, path), state in self.paths.items():
            if tx.path_state(workspace, path) != state:
                return f"{path} was written meanwhile"
        for (workspace, before, limit, oldest), got in self.in_flight.items():
            if list(tx.steps_in_flight(workspace, before, limit=limit,
                                       oldest_first=oldest)) != got:
                return f"the steps in flight in {workspace} changed"
        for digest, present in self.blobs.items():
            if present and tx.blob_size(digest) is None:
                return f"blob {digest[:12]} is gone"
        return None

    def now(self) -> int:
        """The clock's time now, as the draft's time and the time since (no clock read:
        on a store whose clock is the server's, that would be a round trip a landing)."""
        return self.time_ns + time.monotonic_ns() - self._started

    def rev_shift(self, name: str, now: WsRow) -> int:
        """How far workspace `name`'s rev moved since the draft read it (other paths'
        writes, committed meanwhile): the draft's revs move as far."""
        row = self.workspaces.get(name)
        return 0 if row is None else now.rev - row.rev


def _shifted(events: Sequence[Event], delta: int) -> list[Event]:
    """`events` with the revs a draft gave its `fenced` or `compensated` event moved by
    `delta` (the workspace's rev moved by that much before the commit: the fold gives
    each write the next revs of its workspace)."""
    if not delta:
        return list(events)
    out: list[Event] = []
    for e in events:
        if isinstance(e, Fenced):
            e = msgspec.structs.replace(
                e, rev=e.rev + delta,
                writes=tuple(msgspec.structs.replace(w, rev=w.rev + delta) for w in e.writes))
        elif isinstance(e, Compensated) and e.rev:
            e = msgspec.structs.replace(
                e, rev=e.rev + delta,
                restored=tuple(r if r.outcome == "conflict" else
                               msgspec.structs.replace(r, rev=r.rev + delta)
                               for r in e.restored))
        out.append(e)
    return out


@dataclass
class _AttemptEvents:
    planned: Planned | None = None
    fenced: list[tuple[int, Fenced]] = field(default_factory=list)
    end: tuple[int, Event] | None = None
    compensating: tuple[int, Compensating] | None = None


INT64_MAX: Final = 2**63 - 1


def _check_writes(p: StepPlan) -> None:
    """Every write of a plan, as the ledger would record it (fresh or retried)."""
    seen: set[str] = set()
    for w in p.writes:
        if not isinstance(w, Write):
            raise InvalidInput(f"step {p.step!r}: a write must be a Write, not {type(w).__name__}")
        check_relpath(w.path)
        if w.path in seen:
            raise InvalidInput(f"step {p.step!r} writes {w.path!r} twice; merge them")
        seen.add(w.path)
        if w.pre_hash is not None:
            check_digest(w.pre_hash, "pre_hash")
        if w.content is not None:
            check_content(w.content, f"content of {w.path!r}")
        if w.base_rev is not None and (type(w.base_rev) is not int
                                       or not 0 <= w.base_rev <= INT64_MAX):
            raise InvalidInput(f"base_rev of {w.path!r} must be an integer >= 0, not"
                               f" {w.base_rev!r}")


def _check_mode(w: Write) -> int | None:
    """The mode a write records (`Write.mode`): permission bits only, for a creation."""
    if w.mode is None:
        return None
    if type(w.mode) is not int or not 0 <= w.mode <= 0o777:
        raise InvalidInput(f"mode {w.mode!r} of {w.path!r} is not permission bits (0 to 0o777)")
    if w.content is None:
        raise InvalidInput(f"{w.path!r} is deleted: a mode is for the file a write creates")
    return w.mode


def _plan_differences(recorded: Planned | None, p: StepPlan, workspace: str,
                      fence: FenceMode, journal: bool) -> list[str]:
    """What tells plan `p` apart from the attempt's recorded plan (empty: the same plan).

    Compared: the workspace, each write's path, pre_hash, new content (its digest) and
    base_rev when the plan gives one (None means "the current rev", which moves once
    the attempt applies, so a retry without one matches), the artifacts, the run,
    `irreversible`, the fence mode and the journal."""
    if recorded is None:
        return ["no planned event is recorded for the attempt"]
    out: list[str] = []
    if recorded.workspace != workspace:
        out.append(f"workspace {workspace!r}, recorded {recorded.workspace!r}"
                   if recorded.workspace else
                   "the step was started without a workspace (an artifact-only step, e.g."
                   " by 'steptrail step store')")
    mine = {w.path: w for w in p.writes}
    theirs = {w.path: w for w in recorded.writes}
    for path in sorted(mine.keys() - theirs.keys()):
        out.append(f"writes {path}, not in the recorded plan")
    for path in sorted(theirs.keys() - mine.keys()):
        out.append(f"does not write {path}, the recorded plan does")
    for path in sorted(mine.keys() & theirs.keys()):
        w, r = mine[path], theirs[path]
        post = None if w.content is None else content_digest(w.content)[0]
        if w.pre_hash != r.pre_hash:
            out.append(f"{path}: pre_hash {str(w.pre_hash)[:12]}, recorded {str(r.pre_hash)[:12]}")
        if post != r.post_hash:
            out.append(f"{path}: new content {str(post)[:12]}, recorded {str(r.post_hash)[:12]}")
        if w.base_rev is not None and w.base_rev != r.base_rev:
            out.append(f"{path}: base_rev {w.base_rev}, recorded {r.base_rev}")
    if tuple(sorted(set(p.artifacts))) != recorded.artifacts:
        out.append(f"artifacts {sorted(set(p.artifacts))}, recorded {list(recorded.artifacts)}")
    if p.run != recorded.run:
        out.append(f"run {p.run!r}, recorded {recorded.run!r}")
    if p.irreversible != recorded.irreversible:
        out.append(f"irreversible {p.irreversible}, recorded {recorded.irreversible}")
    if (fence, journal) != (recorded.fence, recorded.journal):
        out.append(f"fence {fence!r} journal {journal}, recorded fence {recorded.fence!r}"
                   f" journal {recorded.journal}")
    return out


def _commit_events(tx: Tx, now: int, planned: Planned, fenced: Fenced,
                   inline: dict[str, bytes], cur: StepRow) -> list[Event]:
    """The artifacts, manifest and ack that commit a step with its apply: `inline`
    artifacts stored now (rows of this transaction), the others as stored before; the
    manifest names each written path's post-image (a deletion names none) and each
    declared artifact. A declared artifact stored nowhere: no commit (the apply alone).
    `cur` is the step's row as this transaction read it before the apply."""
    common = dict(step=planned.step, attempt=fenced.attempt, run=planned.run,
                  workspace=planned.workspace, epoch=fenced.epoch)
    stored: dict[str, ManifestEntry] = {}
    if planned.artifacts:
        query = EventQuery(step=planned.step, attempt=fenced.attempt,
                           kinds=frozenset({"blob-stored"}))
        for row in tx.events(query):
            e = msgspec.json.decode(row.payload, type=BlobStored)
            stored[e.path] = ManifestEntry(path=e.path, digest=e.digest, size=e.size)
    events: list[Event] = []
    rows: dict[str, bytes] = {}
    for path in sorted(inline):
        data = inline[path]
        digest = digest_of(data)
        rows[digest] = data
        events.append(BlobStored(**common, digest=digest, size=len(data), path=path,
                                 inline=True))
        stored[path] = ManifestEntry(path=path, digest=digest, size=len(data))
    if set(planned.artifacts) - set(stored) or set(inline) - set(planned.artifacts):
        return []  # not what the plan declared: the apply commits alone
    if rows:
        tx.put_inline(rows, now)
    entries = []
    for w in sorted(fenced.writes, key=lambda w: w.path):
        if w.post_hash is None:
            continue
        found = tx.blob_size(w.post_hash)
        if found is None:
            raise BlobNotFound(w.post_hash, f"the post-image of {w.path} is gone")
        entries.append(ManifestEntry(path=w.path, digest=w.post_hash, size=found[0]))
    writes = tuple(entries)
    artifacts = tuple(stored[p] for p in sorted(planned.artifacts))
    rev = cur.manifest_rev + 1
    return [*events,
            ManifestPublished(**common, manifest_rev=rev, expected_rev=-1,
                              digest=manifest_digest(planned.step, writes, artifacts),
                              writes=writes, artifacts=artifacts),
            Acked(**common, manifest_rev=rev)]


def recorded_before(result: object) -> bool:
    """Whether a compensation's answer is a redelivery of one recorded before."""
    return isinstance(result, Compensation) and result.deduped


def _digest(found: str | None) -> str | None:
    """A digest to record for what a path holds (None: absent, or not a regular file)."""
    return None if found == NOT_A_FILE else found


def _kept_path(path: str, taken: TakeBack | Landing) -> str | None:
    """The workspace-relative path of the file a take-back or a landing kept (beside
    `path`, in the directory where it is now)."""
    if taken.kept is None:
        return None
    d = taken.moved if taken.moved else path.rpartition("/")[0]
    return taken.kept if d in ("", ".") else f"{d}/{taken.kept}"


def receipt_of(event: Fenced, seq: int) -> Receipt:
    return Receipt(workspace=event.workspace, step=event.step, attempt=event.attempt,
                   epoch=event.epoch, rev=event.rev, writes=event.writes, seq=seq,
                   settled=event.settled)


def _check_ttl(ttl_s: float) -> int:
    if not isinstance(ttl_s, int | float) or not 0 < ttl_s <= TTL_MAX_S:
        raise InvalidInput(f"lease ttl {ttl_s!r}s must be > 0 and at most {TTL_MAX_S}s (7 days)")
    return int(ttl_s * 1_000_000_000)


class Workspaces:
    """The workspace protocol: registrations, leases, admission, the fenced apply,
    compensation and settling (see the module docstring), over the ledger's `Core`.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> ledger.workspaces.read_file("repo", "app.py").content
    b'v0\\n'
    >>> ledger.close()
    """

    def __init__(self, core: Core) -> None:
        #: What this works through (the log, the storage, the clock, the options, …).
        self.core = core
        self._log = core.log
        self._storage = core.storage
        self._options = core.options
        #: name -> (the head it was read at, registration events appended, registration)
        self._registrations: dict[str, tuple[Head, int, Registration]] = {}
        #: workspace -> [its lock, its users]: `_workspace_lock`
        self._ws_locks: dict[str, builtins.list[Any]] = {}
        self._locks_lock = threading.Lock()

    # -- workspaces ----------------------------------------------------------------------

    def add(self, name: str, root: str | os.PathLike[str], *,
                      allow_git: bool = False, rebind: bool = False) -> WsRow:
        """Register a workspace: a named, existing directory, recorded resolved with its
        device and inode (every later walk checks them).

        Refused (WorkspaceOverlap) when the directory is, contains or lies inside another
        workspace's root, or is the ledger's own directory or inside its blob root (the
        ledger's directory may lie inside it: the embedded layout). `allow_git`:
        steps may write ``.git`` internals. Adding the same name again with the same
        directory and options is a no-op; anything else is refused unless `rebind`,
        which re-registers the workspace (a `workspace-rebound` event): the way back for
        a workspace moved or restored by other means, and how a workspace registered
        before identities were recorded obtains one. Rebinding while a lease is live is
        allowed: every write is still fenced on the bytes on disk.

        Each registration also records where the ledger itself is (its directory's real
        path, device and inode; nothing for a ledger in a database): a ledger that
        travels with the workspace and is later found elsewhere — a copied or moved
        project — refuses its steps (`LedgerMoved`) until it is rebound, which records
        its new place (`ledger_moved`).
        """
        check_step_id(name)
        if not isinstance(root, str | os.PathLike) or not os.fspath(root):
            raise InvalidInput("give the workspace directory")
        if type(allow_git) is not bool or type(rebind) is not bool:
            raise InvalidInput("allow_git and rebind are booleans")
        real = os.path.realpath(os.fspath(root))
        try:
            st = os.stat(real)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise InvalidInput(f"workspace directory {root} does not exist; create it first"
                               if st is None else f"workspace directory {root} is not a"
                               " directory (a file, a device or a FIFO); give a directory")
        ident = identity_of(st)
        here = self.core.own.place()  # where the ledger is: recorded with the registration
        place = {} if here is None else dict(zip(("ledger_dir", "ledger_dev", "ledger_ino"),
                                                 here, strict=True))

        def build(tx: Tx, now: int) -> list[Event]:
            self.check_root(name, real, ident)  # under the lock: two adds cannot race
            reg = load_registration(tx, name)
            if reg is None:
                if rebind:
                    raise InvalidInput(f"workspace {name!r} was never added; add it without"
                                       " --rebind")
                return [WorkspaceAdded(workspace=name, root=real, dev=ident[0], ino=ident[1],
                                       allow_git=allow_git, **place)]
            same = (reg.root == real and reg.identity == ident and reg.allow_git == allow_git)
            # (adding it again never records the ledger's place: in a copy that would
            # bless the copy; only a rebind does)
            if (same and (not rebind or reg.ledger_place == here)) or (
                    not rebind and reg.root == real and reg.identity is None
                    and reg.allow_git == allow_git):
                raise _Answered(None)  # nothing changed (an old registration keeps no identity)
            if not rebind:
                if reg.root != real:
                    differs = f"directory {reg.root}"
                elif reg.allow_git != allow_git:
                    differs = f"allow_git={reg.allow_git}"
                else:
                    differs = "another directory at that path (device and inode differ)"
                fact = (f"workspace {name!r} is already added with {differs}; give this one"
                        " another name, or re-register it with")
                raise InvalidInput(
                    f"{fact} ledger.workspaces.add({name!r}, {real!r}, rebind=True"
                    f"{', allow_git=True' if allow_git else ''})"
                ).at_a_shell(f"{fact} 'steptrail workspace add {name} {real} --rebind"
                             f"{' --allow-git' if allow_git else ''}'")
            return [WorkspaceRebound(workspace=name, root=real, dev=ident[0], ino=ident[1],
                                     allow_git=allow_git, after=reg.seq, **place)]

        with contextlib.suppress(_Answered):
            self._log.append(build)
        return self.get(name)

    def registration(self, name: str) -> Registration:
        """Where workspace `name` lives and what it may write (its newest
        `workspace-added`/`-restored`/`-rebound` event); UnknownWorkspace if never added."""
        check_step_id(name)
        # Kept while nothing can have changed it: every event appended since it was read
        # is this log's own (the head now, one statement, against the head it was read
        # at: `EventLog.only_mine_since` — exact on every store) and none of those was a
        # registration event (counted before its commit). Read inside a transaction or
        # read already open, it is not kept (it may be uncommitted).
        seen = sum(self._log.appended[k] for k in REGISTRATION_KINDS)
        nested = self._storage.lock._is_owned()
        hit = self._registrations.get(name)
        if hit is not None and not nested and hit[1] == seen:
            if self._log.only_mine_since(hit[0], self._storage.view.head()):
                return hit[2]
        with self._storage.read() as view:
            head = view.head()
            reg = load_registration(view, name)
        if reg is None:
            raise UnknownWorkspace(name)
        if not nested:
            self._registrations[name] = (head, seen, reg)
        return reg

    def ledger_moved(self, name: str) -> LedgerMoved | None:
        """Why a step on workspace `name` is refused because the ledger is not where it
        was when the workspace was registered (a copied or moved project: `LedgerMoved`,
        its `command` resolves it), or None. Every step, read and walk of the workspace
        raises it (`directory`); `steptrail status` shows it. Never for a ledger in a
        database, nor for a registration that did not record the ledger's place."""
        return ledger_moved(name, self.registration(name), self.core.own)

    def check_root(self, name: str, real: str, ident: FileIdentity | None) -> None:
        """Refuse a root that is, contains or lies inside another workspace's root, or is
        the ledger's own directory or inside its blob root: by resolved path, and by
        device and inode of the root (None: it does not exist yet) and of its ancestors
        (a bind mount, a case-variant name)."""
        def ancestors(path: str) -> dict[FileIdentity, str]:
            out: dict[FileIdentity, str] = {}
            while True:
                with contextlib.suppress(OSError):
                    out.setdefault(identity_of(os.stat(path)), path)
                up = os.path.dirname(path)
                if up == path:
                    return out
                path = up

        def inside(a: str, b: str) -> bool:
            return a == b or a.startswith(b.rstrip("/") + "/")

        boundary = self.core.own.boundary()
        mine = ancestors(real)  # identity -> path, the root itself included when it exists
        if boundary.dir_paths:  # (a ledger in a database has no directory here)
            ledger_dir, blob_root = boundary.dir_paths
            if real == ledger_dir or (ident is not None
                                      and ident in boundary.dirs - boundary.stores):
                raise WorkspaceOverlap(real, "", ledger_dir, "is")
            if inside(real, blob_root) or any(i in boundary.stores for i in mine):
                raise WorkspaceOverlap(real, "", blob_root, "is or lies inside the blob store of")
        for other in self.list():
            if other.name == name:
                continue
            theirs = self.registration(other.name).identity
            if other.root == real or (ident is not None and theirs == ident):
                how = "is the directory of"
            elif inside(real, other.root) or (theirs is not None and theirs in mine):
                how = "lies inside"
            elif inside(other.root, real) or (ident is not None
                                              and ident in ancestors(other.root)):
                how = "contains"
            else:
                continue
            raise WorkspaceOverlap(real, other.name, other.root, how)

    def get(self, name: str) -> WsRow:
        """A workspace's row (revision, lease); UnknownWorkspace if it was never added."""
        check_step_id(name)
        if self.core.steps.current():
            # a writer's tables, as it left them: one statement
            row = self._storage.view.workspace(name)
        else:
            # the row and the lag check in one statement; a fold only when they lag
            current, row = self._storage.view.workspace_if_current(name, STEPS_VERSION)
            if not current:
                row = read_workspaces(self.core.log).rows.get(name)
        if row is None:
            raise UnknownWorkspace(name)
        return row

    def list(self) -> builtins.list[WsRow]:
        """Every workspace's row, by name (a bare lease has no directory: not listed)."""
        fold = read_workspaces(self.core.log)
        return sorted((r for r in fold.rows.values() if r is not None and r.root),
                      key=lambda r: r.name)

    def paths(self, name: str) -> dict[str, tuple[int, str | None]]:
        """Every path a step wrote: its rev and the hash of the content it should hold."""
        self.get(name)
        fold = read_workspaces(self.core.log)
        return {p: (s[0], s[1]) for (w, p), s in sorted(fold.paths.items())
                if w == name and s is not None}

    def kept(self, name: str) -> builtins.list[KeptFile]:
        """The files steptrail kept in workspace `name` under a visible name
        (``NAME.steptrail-kept-TAG``) instead of removing them, as its refusals and
        compensations recorded them (`Restored.kept`), each with whether it is still on
        disk: `status` shows those still there as needing attention."""
        row = self.get(name)
        out: list[KeptFile] = []
        for kind in ("rejected", "compensated"):
            for r in self.core.log.read(kind=kind):
                ev = r.event
                if getattr(ev, "workspace", None) != name:
                    continue
                entries = ev.undone if isinstance(ev, Rejected) else ev.restored  # type: ignore[union-attr]
                for x in entries:
                    if x.kept is None:
                        continue
                    try:
                        present = os.path.isfile(os.path.join(row.root, x.kept)) and not \
                            os.path.islink(os.path.join(row.root, x.kept))
                    except OSError:
                        present = False
                    out.append(KeptFile(workspace=name, path=x.path, kept=x.kept,
                                        step=ev.step, attempt=ev.attempt,  # type: ignore[union-attr]
                                        seq=r.seq, present=present))
        out.extend(self._kept_on_disk(row, {k.kept for k in out}))
        return sorted(out, key=lambda k: (k.seq == 0, k.seq, k.kept))

    def _kept_on_disk(self, row: WsRow, recorded: set[str]) -> builtins.list[KeptFile]:
        """Kept files no refusal or compensation recorded — kept after a commit, by the
        removal of what a write displaced (a writer appended to it after the landing),
        of an attempt's slots, or of a dead stager's temporaries (gc) — found by name
        (``.steptrail-kept-``) in the directories of the paths the ledger knows in the
        workspace; each named after the attempt whose tag it carries where the ledger
        knows it (``seq`` 0: found on disk, not recorded)."""
        if row.epoch == 0 or self.ledger_moved(row.name) is not None:
            return []
        dirs = {p.rpartition("/")[0] for (w, p), state
                in read_workspaces(self.core.log).paths.items() if w == row.name}
        dirs.update(k.rpartition("/")[0] for k in recorded)
        if not dirs:
            return []
        tags: dict[str, tuple[str, int]] | None = None
        out: list[KeptFile] = []
        try:
            wsdir = self._wsdir(row)
        except LedgerError:
            return []
        for d in sorted(dirs):
            try:
                with wsdir.open_dir(d) as fd:
                    names = [] if fd is None else [
                        n for n in os.listdir(fd) if _KEPT_NAME.fullmatch(n)
                        and (st := stat_at(fd, n)) is not None and stat.S_ISREG(st.st_mode)]
            except (LedgerError, OSError):
                continue
            for n in sorted(names):
                rel = f"{d}/{n}" if d else n
                if rel in recorded:
                    continue
                leaf, _, tail = n.partition(KEPT_MARK)
                if tags is None:
                    with self._storage.read() as view:
                        tags = {attempt_tag(s.step_id, a): (s.step_id, a)
                                for s in view.steps() if s.workspace == row.name
                                for a in range(1, s.attempt + 1)}
                step, attempt = tags.get(tail.split("-")[0], ("", 0))
                out.append(KeptFile(workspace=row.name, path=f"{d}/{leaf}" if d else leaf,
                                    kept=rel, step=step, attempt=attempt, seq=0,
                                    present=True))
        return out

    def directory(self, name: str) -> WorkspaceDir:
        """Workspace `name`'s directory, confined as every step's write is: the root
        reached without following symlinks and checked against its registration, the
        ledger's own files and (unless allowed) ``.git`` out of reach. For front ends
        that list or walk the workspace (the MCP tools): one walk, the library's."""
        return self._wsdir(self.get(name))

    def restore(self, workspace: str, to: str | os.PathLike[str], *,
                force: bool = False, replace: bool = False) -> RestoreReport:
        """Materialize the workspace's committed content under `to` (a new or empty
        directory; with `replace`, any directory: what held other bytes at a restored
        path is kept beside it) and record it (`ledger.workspace.restore.restore`)."""
        return restore(self, workspace, to, force=force, replace=replace)

    def confined(self, name: str) -> Confined:
        """Workspace `name`'s directory as a tool may list, walk, search and ``mkdir -p``
        it (`Confined`): every walk the protocol's own, under the same boundary — the
        ledger's files, ``.git`` unless the workspace allows it, no symlink followed."""
        row = self.get(name)
        return Confined(self._wsdir(row), self.core.own.boundary(),
                        allow_git=self.registration(name).allow_git)

    def _wsdir(self, row: WsRow, step: str = "", attempt: int = 0,
               epoch: int = 0) -> WorkspaceDir:
        """The workspace's directory, confined (its registered identity, the ledger's
        boundary, its `.git` opt-in); staging for `step`'s `attempt` under `epoch` (the
        stamp its temporaries carry, see `_remove_temporaries`). The one way in to a
        workspace's files: refused (`LedgerMoved`) while the ledger is not where it was."""
        reg = self.registration(row.name)
        moved = ledger_moved(row.name, reg, self.core.own)
        if moved is not None:
            raise moved
        return WorkspaceDir(row.name, row.root, self.core.storage.files.ops,
                            identity=reg.identity if reg.root == row.root else None,
                            boundary=self.core.own.boundary(), allow_git=reg.allow_git,
                            epoch=epoch, tag=attempt_tag(step, attempt))

    def _remove_temporaries(self, wsdir: WorkspaceDir, writes: Sequence[PlannedWrite],
                            current_epoch: int) -> None:
        """Remove the temporaries a killed stager left beside `writes`' targets: those of
        an older epoch than `wsdir`'s (its holder is dead or a zombie whose apply the
        fence refuses) and those of `wsdir`'s own epoch and attempt. Another attempt's of
        the live epoch may be a sibling's, staging now: kept; and so are the slots of
        every attempt in flight (`_slots_in_flight`), the evidence its settling rolls
        back from. Only the directories this attempt writes are looked at — where its
        earlier calls staged — so the cost follows the attempt, not the size of the
        repository."""
        epoch, tag = wsdir.epoch, wsdir.tag
        if not 0 < epoch <= current_epoch:
            return  # not an epoch of this workspace: nothing is known dead
        flying: list[frozenset[str]] = []

        def in_flight() -> frozenset[str]:  # asked only when a temporary is found
            if not flying:
                flying.append(self._in_flight_tags(wsdir.name))
            return flying[0]

        # dead: an older epoch's; this attempt's own; or an attempt's that is over (no
        # stager of an ended or committed attempt is alive: a kill after its commit)
        wsdir.remove_temporaries({w.path.rpartition("/")[0] for w in writes} | wsdir.also_dirs,
                                 lambda e, t: e < epoch or (e == epoch and t == tag)
                                 or (e <= current_epoch and t not in in_flight()),
                                 lambda: self._slots_in_flight(wsdir.name), self._held)

    def _held(self, digest: str) -> bool:
        """Whether the ledger holds these bytes (a temporary of this digest may go)."""
        return self.core.blob_size(digest) is not None

    def _in_flight_tags(self, workspace: str) -> frozenset[str]:
        """The temporaries' tags (`attempt_tag`) of the workspace's attempts in flight."""
        with self._storage.read() as view:
            return frozenset(attempt_tag(s, a) for s, a in view.steps_in_flight(workspace))

    def tidy(self, step: str) -> None:
        """Remove what the step's latest attempt left in its slots, once it is over (a
        kill after its commit, before the displaced files went): a re-run of a
        committed step calls it. Best effort; an attempt in flight is left alone."""
        row = self.core.steps.get(step)
        if row.state in IN_FLIGHT or not row.workspace:
            return
        ev = self._attempt_events(step, row.attempt)
        if ev.planned is None or not ev.planned.workspace:
            return
        ws = self.get(ev.planned.workspace)
        epochs = [(ev.planned.epoch, "xyt")]
        if ev.compensating is not None:
            epochs.append((ev.compensating[1].epoch, "ut"))
        for epoch, roles in epochs:
            wsdir = self._wsdir(ws, step, row.attempt, epoch)
            for w in ev.planned.writes:
                wsdir.discard_slots(w.path, roles, self._held)

    def _slots_in_flight(self, workspace: str,
                         steps: Sequence[tuple[str, int]] | None = None
                         ) -> frozenset[tuple[str, str]]:
        """(directory, name) of every slot (`WorkspaceDir.slot`) in which an attempt in
        flight in the workspace left what a crashed write displaced (`landed`), and every
        slot of an undo in flight. A slot holding only a staged copy is not kept."""
        if steps is None:
            with self._storage.read() as view:
                steps = view.steps_in_flight(workspace)
        row = self.get(workspace)
        out: set[tuple[str, str]] = set()
        for step, attempt in steps:
            ev = self._attempt_events(step, attempt)
            if ev.planned is None:
                continue
            epochs = [(ev.planned.epoch, "xy")]
            if ev.compensating is not None:
                epochs.append((ev.compensating[1].epoch, "u"))
            for epoch, roles in epochs:
                wsdir = self._wsdir(row, step, attempt, epoch)
                wsdir.planned = _paths_of(ev.planned)
                for w in ev.planned.writes:
                    d = w.path.rpartition("/")[0]
                    if roles == "u":
                        out.add((d, wsdir.slot(w.path, "u")))
                        continue
                    with contextlib.suppress(LedgerError, OSError):
                        found = wsdir.landed(w.path, w.pre_hash, w.post_hash,
                                             mode=w.mode)
                        if found.landed and found.slot is not None:
                            # and the staged copy beside it: a landing without the
                            # exchange call cut between its moves links it in next
                            out.update({(d, found.slot), (d, wsdir.slot(w.path, "x"))})
        return frozenset(out)

    def snapshot(self, workspace: str, path: str) -> tuple[int, str | None]:
        """What a planner reads before it plans a write: (the path's rev, the sha256 of
        its bytes on disk now, None when absent)."""
        row = self.get(workspace)
        check_relpath(path)
        with self._storage.read() as conn:
            state = conn.path_state(workspace, path)
        return (0 if state is None else state[0]), self._wsdir(row).hash(path)

    def read_file(self, workspace: str, path: str, *,
                  max_bytes: int | None = None) -> FileRead:
        """Read a workspace file as a planner must: its bytes, with the sha256 of those
        very bytes and the path's rev, taken together (`FileRead`).

        Plan writes from this (`read.write(new_content)`), not from a later `snapshot`:
        a person's edit between the planner's read and a snapshot would be hashed into
        the plan and applied over. The rev is read before the bytes, so a step applied
        in between makes the plan stale, never wrongly fresh. A file larger than
        `max_bytes` is refused (InvalidInput) rather than read whole.
        """

        row = self.get(workspace)
        check_relpath(path)
        if max_bytes is not None and max_bytes < 0:
            raise InvalidInput(f"max_bytes must be 0 or more, not {max_bytes}")
        state = self._storage.view.path_state(workspace, path)  # one statement
        rev = 0 if state is None else state[0]
        with self._wsdir(row).open(path) as fd:
            if fd is None:
                return FileRead(workspace, path, rev, None, None)
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise InvalidInput(
                    f"{workspace}:{path} holds {size} bytes, more than max_bytes={max_bytes};"
                    " read it with a larger limit, or plan it from a file (Write content"
                    " may be an open binary file)")
            content = b"".join(fd_chunks(fd))
        return FileRead(workspace, path, rev, digest_of(content), content)

    # -- leases --------------------------------------------------------------------------

    def lease(self, workspace: str) -> Lease:
        row = self.get(workspace)
        now = self.core.clock()
        return Lease(workspace=workspace, epoch=row.epoch, holder=row.holder,
                     expires_ns=row.expires_ns, live=row.live_epoch(now) is not None,
                     released=row.released)

    def acquire(
        self, workspace: str, holder: str, ttl_s: float = 60, *, force: bool = False,
        bare: bool = False, resume: bool = False,
    ) -> Lease:
        """Start a new epoch (previous + 1) on the workspace and settle the older ones.

        Refused with LeaseHeld while another lease is live, unless `force`, and with
        LedgerMoved while the ledger is not where it was registered. Every attempt
        of an older epoch still in flight is compensated before this returns (`settled`).
        The new epoch is live whatever settling found: a path it left for a human is in
        `conflicts`, a step it could not settle in `unsettled` (new work is refused with
        Unsettled until `settle` succeeds). `bare`: a name no workspace registered is
        not UnknownWorkspace but a lease with no directory, made by its first epoch
        (`lease-acquired` with `bare`): ownership of something that is not a directory,
        as a LangGraph thread's (ledger.langgraph). A registered workspace's lease is
        taken as usual. `resume`: an agent restarting after a crash takes back a live
        lease its own `holder` still holds (a new epoch, which settles what the dead run
        left unfinished) — another holder's live lease is still LeaseHeld: the
        restart-safe way to start (README's quickstart).
        """
        check_step_id(holder)
        ttl_ns = _check_ttl(ttl_s)
        if type(bare) is not bool:
            raise InvalidInput("bare is a boolean")
        moved = None if bare else self.ledger_moved(workspace)  # (UnknownWorkspace too)
        if moved is not None:
            raise moved  # its settling would put files back in the registered root

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                if not bare:
                    raise UnknownWorkspace(workspace)
                return [LeaseAcquired(workspace=workspace, epoch=1, holder=holder,
                                      expires_ns=now + ttl_ns, bare=True)]
            live = row.live_epoch(now)
            if live is not None and not force and not (resume and row.holder == holder):
                raise LeaseHeld(workspace, row.epoch, row.holder, row.expires_ns)
            return [LeaseAcquired(workspace=workspace, epoch=row.epoch + 1, holder=holder,
                                  expires_ns=now + ttl_ns, forced=live is not None)]

        recorded = self._log.append(build, scope=Scope(workspace))[0]
        event = recorded.event
        assert isinstance(event, LeaseAcquired)
        # The epoch is ours from here on: a failure to settle one step is reported with
        # it (apply refuses with Unsettled until `settle` succeeds), never lost.
        settled, failed = self._settle(workspace, event.epoch)
        return Lease(workspace=workspace, epoch=event.epoch, holder=holder,
                     expires_ns=event.expires_ns, live=True, released=False,
                     settled=tuple(c.step for c in settled), unsettled=tuple(failed),
                     conflicts=settle_conflicts(settled))

    def heartbeat(self, workspace: str, epoch: int, ttl_s: float = 60) -> Lease:
        """Extend the live lease; an expired one is never revived (StaleEpoch)."""
        ttl_ns = _check_ttl(ttl_s)

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                raise UnknownWorkspace(workspace)
            live = row.live_epoch(now)
            if live != epoch:
                raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)
            return [LeaseRenewed(workspace=workspace, epoch=epoch,
                                 expires_ns=max(row.expires_ns, now + ttl_ns))]

        self._log.append(build, scope=Scope(workspace))
        return self.lease(workspace)

    def release(self, workspace: str, epoch: int) -> Lease:
        """Give the lease up (idempotent for the same epoch)."""

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                raise UnknownWorkspace(workspace)
            if row.epoch != epoch:
                raise StaleEpoch(workspace, epoch, row.live_epoch(now), latest=row.epoch,
                                 holder=row.holder)
            return [LeaseReleased(workspace=workspace, epoch=epoch)]

        self._log.append(build, scope=Scope(workspace))
        return self.lease(workspace)

    def _live_epoch(self, tx: Tx, workspace: str, epoch: int, now: int) -> WsRow:
        row = tx.workspace(workspace)
        if row is None:
            raise UnknownWorkspace(workspace)
        live = row.live_epoch(now)
        if live != epoch:
            raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)
        return row

    def unsettled(self, workspace: str, epoch: int) -> builtins.list[str]:
        """Steps of the workspace whose latest attempt, of an epoch before `epoch`, is
        still in flight (planned, fenced, blob-stored)."""
        check_int(epoch, "epoch")
        with self._storage.read() as view:
            return [step for step, _attempt in view.steps_in_flight(workspace, epoch,
                                                                    oldest_first=True)]

    def settle(self, workspace: str, epoch: int) -> builtins.list[Compensation]:
        """Compensate every attempt of an older epoch still in flight, under `epoch`.

        Raises the first failure after trying every step (the others are settled)."""
        check_int(epoch, "epoch", 1)
        done, failed = self._settle(workspace, epoch)
        if failed:
            raise failed[next(iter(failed))]
        return done

    def _settle(
        self, workspace: str, epoch: int
    ) -> tuple[list[Compensation], dict[str, LedgerError]]:
        done: list[Compensation] = []
        failed: dict[str, LedgerError] = {}
        for step in self.unsettled(workspace, epoch):
            try:
                done.append(self.compensate(step, epoch=epoch, reason=f"settled by epoch {epoch}"))
            except StaleEpoch:
                raise  # a newer epoch took over meanwhile: it settles
            except LedgerError as exc:
                failed[step] = exc
        return done, failed

    def remove_abandoned_temporaries(self, now: int) -> int:
        """Collect, in every workspace, the temporaries no live stager can own: those of
        an epoch older than the live one (any epoch once the lease has lapsed), and those
        of attempts that are over (a kill after the commit, before the displaced files
        went; a takeover after it). gc calls it: it reaches an attempt nobody came back
        to. It looks in the directories of the attempts in flight and of every path the
        ledger knows in the workspace. Each file goes only once its bytes are shown held
        by the ledger or by the path beside it; anything else is kept under a visible
        name (`WorkspaceDir.remove_temporaries`). Returns how many files went."""
        removed = 0
        known: dict[str, set[str]] = {}
        for (w, p), state in read_workspaces(self.core.log).paths.items():
            if state is not None:
                known.setdefault(w, set()).add(p.rpartition("/")[0])
        for row in self.list():
            if row.epoch == 0 or self.ledger_moved(row.name) is not None:
                continue  # (a copied ledger's account does not describe that directory)
            with self._storage.read() as view:
                steps = view.steps_in_flight(row.name)
            dirs: set[str] = set(known.get(row.name, ()))
            for step, attempt in steps:
                planned = self._attempt_events(step, attempt).planned
                if planned is not None:
                    dirs.update(w.path.rpartition("/")[0] for w in planned.writes)
            if not dirs:
                continue
            flying = frozenset(attempt_tag(s, a) for s, a in steps)
            newest_dead = row.epoch - 1 if row.live_epoch(now) is not None else row.epoch
            try:
                removed += self._wsdir(row).remove_temporaries(
                    dirs, lambda e, t, newest_dead=newest_dead, top=row.epoch, flying=flying:
                    e <= newest_dead or (e <= top and t not in flying),
                    lambda row=row, steps=steps: self._slots_in_flight(row.name, steps),
                    self._held)
            except LedgerError:
                continue  # a workspace moved or gone: nothing of it to collect here
        return removed

    # -- reading an attempt --------------------------------------------------------------

    def _attempt_events(self, step: str, attempt: int) -> _AttemptEvents:
        out = _AttemptEvents()
        for recorded in self._log.read(step=step):
            e = recorded.event
            if getattr(e, "attempt", None) != attempt:
                continue
            if isinstance(e, Planned):
                out.planned = e
            elif isinstance(e, Fenced):
                out.fenced.append((recorded.seq, e))
            elif isinstance(e, Rejected | Compensated):
                out.end = (recorded.seq, e)
            elif isinstance(e, Compensating):
                out.compensating = (recorded.seq, e)
        return out

    def _end_result(self, step: str, attempt: int, ev: _AttemptEvents) -> ApplyResult:
        if ev.end is None:
            raise IllegalTransition(step, attempt, "fenced", "the attempt is not over")
        end = ev.end[1]
        if isinstance(end, Rejected):
            return ApplyResult(verdict=f"rejected:{end.reason}", step=step, attempt=attempt,
                               detail=end.detail)
        receipt = receipt_of(ev.fenced[-1][1], ev.fenced[-1][0]) if ev.fenced else None
        return ApplyResult(verdict="compensated", step=step, attempt=attempt, receipt=receipt,
                           detail=getattr(end, "reason", ""))

    # -- planning ------------------------------------------------------------------------

    def plan_step(
        self,
        step: str,
        *,
        workspace: str,
        epoch: int,
        writes: Sequence[Write] = (),
        artifacts: Sequence[str] = (),
        run: str = "",
        fence: FenceMode = "step",
        journal: bool = True,
        plan_rev: int | None = None,
        irreversible: bool = False,
    ) -> ApplyResult | None:
        """Plan one step that writes the workspace (a batch of one; see `admit`)."""
        out = self.admit(workspace, epoch, [StepPlan(step, writes, artifacts, run, irreversible)],
                         fence=fence, journal=journal, plan_rev=plan_rev)
        return out[0]

    def admit(
        self,
        workspace: str,
        epoch: int,
        plans: Sequence[StepPlan],
        *,
        fence: FenceMode = "step",
        journal: bool = True,
        plan_rev: int | None = None,
    ) -> builtins.list[ApplyResult | None]:
        """Admit a plan: a batch of steps submitted together, under the live `epoch`.

        Records each step's `planned` attempt (its writes, the workspace rev at dispatch,
        the fence mode) with its post-images pinned and stored, in one transaction. Steps
        of the batch that write the same path must chain — each one's pre_hash is the
        previous one's post-image — or every step is rejected with ``overlap`` (a
        per-step fence cannot order siblings). Returns, per step, None when admitted or
        the rejection. A step whose latest attempt is in flight or committed is left as
        it is when this is its recorded plan (a retried admission: idempotent); any
        other plan for it raises PlanConflict naming the difference, and nothing of the
        batch is written.
        """
        if fence not in FENCE_MODES:
            raise InvalidInput(f"fence {fence!r} is not one of {', '.join(FENCE_MODES)}")
        if type(epoch) is not int or not 1 <= epoch <= INT64_MAX:
            raise InvalidInput(f"epoch {epoch!r}: a step that writes the workspace runs under a"
                               " lease; acquire one and pass its epoch")
        if not plans:
            raise InvalidInput("a plan needs at least one step")
        ws = self.get(workspace)
        wsdir = self._wsdir(ws)
        names = [p.step for p in plans]
        if len(set(names)) != len(names):
            raise InvalidInput("a plan names a step twice; give every step its own id")
        if plan_rev is None:
            plan_rev = self._run_plan_rev(plans[0].run, workspace) if fence == "plan" else None
        if plan_rev is None:
            plan_rev = ws.rev
        events: list[Event] = []
        contents: dict[str, tuple[Content, int]] = {}  # post digest -> (content, size)
        sim: dict[str, int] = {}
        last_post: dict[str, str | None] = {}
        rev = ws.rev
        overlap: list[str] = []
        fresh: list[tuple[StepPlan, int]] = []
        again: dict[tuple[str, int, str], tuple[Content, int]] = {}
        with self._storage.read() as conn:
            for p in plans:
                check_step_id(p.step)
                for a in p.artifacts:
                    check_relpath(a, "artifact path")
                _check_writes(p)  # a retried plan is validated like a fresh one
                for w in p.writes:  # the boundary, now: nothing is recorded for a refusal
                    wsdir.check_write(w.path)
                    wsdir.check_fits(w.path)  # a name the disk cannot hold never applies
                row = conn.step(p.step)
                if row is not None and (row.live or row.state not in ENDED):
                    # in flight or committed: a retried admission if it is the recorded
                    # plan (PlanConflict otherwise). A crash between the planned commit
                    # and a large post-image's file lost that file: the retry puts back
                    # the bytes its recorded plan names.
                    recorded = self._attempt_events(p.step, row.attempt).planned
                    differences = _plan_differences(recorded, p, workspace, fence, journal)
                    if differences:
                        state = f"{row.state}, committed" if row.live else row.state
                        raise PlanConflict(p.step, row.attempt, state, differences)
                    if row.state == PLANNED:
                        for w in p.writes:
                            if w.content is not None:
                                d, size = content_digest(w.content)
                                again[(p.step, row.attempt, d)] = (w.content, size)
                    continue
                attempt = 1 if row is None else row.attempt + 1
                pws = []
                for w in p.writes:
                    post = None
                    if w.content is not None:
                        post, size = content_digest(w.content)
                        contents[post] = (w.content, size)
                    current = sim.get(w.path)
                    if current is None:
                        state = conn.path_state(workspace, w.path)
                        current = 0 if state is None else state[0]
                    base = current if w.base_rev is None else w.base_rev
                    if w.path in last_post and (
                        w.pre_hash != last_post[w.path] or base != sim[w.path]
                    ):
                        overlap.append(f"{p.step}:{w.path}")
                    rev += 1
                    sim[w.path] = rev
                    last_post[w.path] = post
                    pws.append(PlannedWrite(path=w.path, base_rev=base, pre_hash=w.pre_hash,
                                            post_hash=post, mode=_check_mode(w)))
                events.append(Planned(
                    step=p.step, attempt=attempt, run=p.run, workspace=workspace, epoch=epoch,
                    writes=tuple(pws), artifacts=tuple(sorted(set(p.artifacts))), rev=ws.rev,
                    fence=fence, journal=journal, plan_rev=plan_rev,
                    irreversible=p.irreversible,
                ))
                fresh.append((p, attempt))
        if again:
            self._restore_post_images(again)
        if not fresh:
            return [None] * len(plans)
        planned = [e for e in events if isinstance(e, Planned)]
        if overlap:
            detail = "writes to the same path do not chain: " + ", ".join(overlap[:5])
            batch: list[Event] = []
            for e in planned:
                batch += [e, Rejected(step=e.step, attempt=e.attempt, run=e.run,
                                      workspace=workspace, epoch=epoch, reason="overlap",
                                      detail=detail)]
            self._log.append(batch, guard=self.core.guard())
            verdicts = {e.step: ApplyResult(verdict="rejected:overlap", step=e.step,
                                            attempt=e.attempt, detail=detail,
                                            facts={"paths": overlap}) for e in planned}
            return [verdicts.get(p.step) for p in plans]
        pins: list[Event] = []
        for e in planned:
            for d in dict.fromkeys(w.post_hash for w in e.writes if w.post_hash is not None):
                pins.append(BlobPinned(step=e.step, attempt=e.attempt, run=e.run,
                                       workspace=workspace, epoch=epoch, digest=d,
                                       role="post-image"))
        small = {d: content_bytes(c, d) for d, (c, n) in contents.items()
                 if n <= self._options.inline_max_bytes}
        large = {d: c for d, (c, n) in contents.items() if n > self._options.inline_max_bytes}
        # (the inline bytes are stored at the transaction's time)
        self._log.append([*planned, *pins], guard=self.core.guard(), inline=small)
        for d, c in large.items():  # pinned (committed) before the file is written
            self.core.storage.files.put_content(c, d)
        return [None] * len(plans)

    def _restore_post_images(
        self, contents: dict[tuple[str, int, str], tuple[Content, int]]
    ) -> None:
        """Store again each post-image an in-flight attempt planned (and pinned) whose
        bytes are missing."""
        for (step, attempt, digest), (data, size) in contents.items():
            planned = self._attempt_events(step, attempt).planned
            if planned is None or digest not in {w.post_hash for w in planned.writes}:
                continue  # not what the recorded plan says: the recorded plan stands
            small = size <= self._options.inline_max_bytes
            if small and self.core.blob_size(digest) is not None:
                continue  # an inline row is durable with its transaction
            if small:
                now = self.core.clock()
                inline = content_bytes(data, digest)
                with self._storage.transaction() as tx:
                    tx.put_inline({digest: inline}, now)
            else:
                self.core.storage.files.put_content(data, digest)

    def _run_plan_rev(self, run: str, workspace: str) -> int | None:
        """The plan revision a run was first admitted at (fence "plan")."""
        if not run:
            return None
        query = EventQuery(kinds=frozenset({"planned"}), run=run, workspace=workspace, limit=1)
        with self._storage.read() as view:
            for row in view.events(query):
                event = msgspec.json.decode(row.payload)
                value = event.get("plan_rev")
                return None if value is None else int(value)
        return None

    def replan(self, step: str, *, epoch: int) -> int:
        """Re-stamp the step's ended attempt onto the current revisions, as a new attempt.

        Allowed when every write's pre_hash still holds on disk; the new attempt keeps the
        writes, post-images, fence mode and the run's plan rev, and gets the path revs of
        now as its bases. Returns the new attempt number. ReplanRefused otherwise.
        """

        row = self.core.steps.get(step)
        if row.live:
            raise ReplanRefused(step, "it is committed; compensate it first")
        if row.state not in ENDED:
            raise ReplanRefused(step, f"attempt {row.attempt} is still {row.state}")
        old = self._attempt_events(step, row.attempt).planned
        if old is None or not old.workspace:
            raise ReplanRefused(step, "it has no workspace writes to re-stamp")
        ws = self.get(old.workspace)
        wsdir = self._wsdir(ws)
        writes = []
        with self._storage.read() as conn:
            for w in old.writes:
                disk = wsdir.hash(w.path)  # a symlink or a non-file now: PathEscapes
                if disk != w.pre_hash:
                    raise ReplanRefused(step, f"{w.path} no longer holds the content it was"
                                        " planned against")
                state = conn.path_state(old.workspace, w.path)
                writes.append(PlannedWrite(path=w.path, base_rev=0 if state is None else state[0],
                                           pre_hash=w.pre_hash, post_hash=w.post_hash))
        for w in writes:
            found = None if w.post_hash is None else self.core.blob_size(w.post_hash)
            if w.post_hash is not None and found is None:
                raise BlobNotFound(w.post_hash, f"the post-image of {w.path} is gone; plan anew")
        planned = msgspec.structs.replace(
            old, attempt=row.attempt + 1, epoch=epoch, writes=tuple(writes), rev=ws.rev,
        )
        pins = [BlobPinned(step=step, attempt=planned.attempt, run=old.run, workspace=old.workspace,
                           epoch=epoch, digest=d, role="post-image")
                for d in dict.fromkeys(w.post_hash for w in writes if w.post_hash is not None)]
        # The pins first (a collector spares a pinned blob), then the bytes made durable
        # again: the ended attempt no longer pins them, so until this commit a collection
        # could take them between the look above and a put.
        self._log.append([planned, *pins], guard=self.core.guard())
        for w in writes:
            found = None if w.post_hash is None else self.core.blob_size(w.post_hash)
            if w.post_hash is not None and found is None:
                raise BlobNotFound(w.post_hash, f"the post-image of {w.path} was collected"
                                   " before the new attempt pinned it; plan anew")
            if found is not None and not found[1]:
                # a file post-image whose name may never have been made durable (a failed
                # directory fsync): put it again — the dedup path fsyncs file and directory
                # (and reads nothing from the source, streamed as it would be otherwise)
                self.core.storage.files.put_stream(self.core.blob_chunks(w.post_hash), w.post_hash)
        return planned.attempt

    # -- applying ------------------------------------------------------------------------

    def apply(self, step: str, attempt: int | None = None, *, epoch: int,
              commit: bool = False, inline_artifacts: dict[str, bytes] | None = None
              ) -> ApplyResult:
        """Fence and apply the attempt's writes under the live `epoch` (see the module).

        Returns the verdict; a rejection is recorded (the attempt ends) when the attempt
        was still planned. Raises StaleEpoch for a dead epoch and Unsettled when an older
        epoch's attempt is still in flight; writes nothing then.

        `commit`: the transaction that records the apply also publishes the attempt's
        manifest (the commit point) and acks it (`ApplyResult.committed`): a fenced step
        in two commits, the plan and this. `inline_artifacts` (path -> bytes, each at
        most `inline_max_bytes`) are stored in that same transaction; the plan's other
        declared artifacts must have been stored before (`store`), or nothing commits
        but the apply. The caller learns the result when this returns; a crash before is
        answered by the journal on a re-run.
        """

        row = self.core.steps.get(step)
        attempt = row.attempt if attempt is None else attempt
        ev = self._attempt_events(step, attempt)
        planned = ev.planned
        if planned is None:
            raise IllegalTransition(step, attempt, "fenced", "the attempt was never planned")
        if not planned.workspace or planned.epoch == 0:
            raise InvalidInput(f"step {step!r} writes no workspace; store its artifacts and"
                               " publish it instead")
        ws = self.get(planned.workspace)
        if planned.epoch > epoch:
            # an attempt a newer epoch planned is not this caller's to apply, nor to hear
            # about as if it were its own (a zombie retrying `apply` after a takeover
            # re-ran the step): StaleEpoch, before any journal answer
            live = ws.live_epoch(self.core.clock())
            raise StaleEpoch(planned.workspace, epoch, live, f"attempt {attempt} of step"
                             f" {step!r} was planned under epoch {planned.epoch}",
                             latest=ws.epoch, holder=ws.holder)
        wsdir = self._wsdir(ws, step, attempt, epoch)
        key = journal_key(Fenced(step=step, attempt=attempt, workspace=planned.workspace))
        fresh = row.attempt == attempt and row.state == PLANNED
        name = planned.workspace
        staged: dict[str, Staged] = {}
        landings: list[Landing] = []
        pre_bytes: dict[str, bytes] = {}
        recorded: list[RecordedEvent] = []
        built: list[bool] = []
        with self._workspace_lock(name):  # (this process's threads: in turn)
            try:
                # A dead epoch stages nothing (staging creates parent directories: no new
                # effect under it); the checks below refuse it (StaleEpoch).
                if (fresh or not planned.journal) and ws.live_epoch(self.core.clock()) == epoch \
                        and epoch == planned.epoch:
                    self._remove_temporaries(wsdir, planned.writes, ws.epoch)
                    pre_bytes = self._store_pre_images(planned, wsdir)
                    wsdir.planned = _paths_of(planned)
                    # a directory the plan edits or deletes in, gone from its name: no
                    # directory is made again for any write in it (the fence refuses)
                    wsdir.gone_dirs = frozenset(
                        d for d in {w.path.rpartition("/")[0] for w in planned.writes
                                    if w.pre_hash is not None} if not wsdir.has_dir(d))
                    for w in planned.writes:
                        if w.path.rpartition("/")[0] in wsdir.gone_dirs:
                            continue
                        if w.post_hash is None or (planned.journal and wsdir.landed(
                                w.path, w.pre_hash, w.post_hash, mode=w.mode).landed):
                            continue  # a crashed call's landed write: its slot is the evidence
                        # copied piece by piece, verified by the end of the copy, under the
                        # path's slot name, with its final mode before any name shows it
                        # the fence decides (below)
                        with contextlib.suppress(StagingLost, DirectoryMoved):
                            staged[w.path] = wsdir.stage(
                                w.path, self.core.blob_chunks(w.post_hash), mode=w.mode,
                                slot="x", make_dirs=w.pre_hash is None)
                holder: list[ApplyResult] = []
                # The store's write lock covers the commit only (docs/design.md
                # "Epochs and leases"): the checks and the file work run first, with no
                # lock held (a worker frozen there holds nothing a takeover needs); the
                # epoch is read again before each landing; then one transaction checks
                # that nothing the checks read has moved and records `fenced` (or
                # `rejected`).
                for _round in range(DRAFT_ROUNDS):
                    holder.clear()
                    draft = _Draft(self._storage.view, self.core.clock(), self.core.steps.find)
                    try:
                        events = self._fence(draft, draft.time_ns, planned, attempt, epoch,
                                             key, ws, wsdir, staged, holder, pre_bytes, landings)
                    except _Answered as answered:
                        return answered.result  # type: ignore[no-any-return]
                    except LedgerError as exc:
                        # a takeover under the file work: what this call landed goes back
                        # (each path only if it still holds what was put there)
                        if landings and (isinstance(exc, StaleEpoch)
                                         or self._epoch_live(name, epoch) is False):
                            self._take_back(wsdir, planned, landings)
                            if not isinstance(exc, StaleEpoch):
                                raise self._stale(name, epoch) from exc
                        raise

                    def build(tx: Tx, now: int, draft: _Draft = draft,
                              events: list[Event] = events) -> list[Event]:
                        built.clear()
                        out = self._recheck(tx, now, draft, events, planned, attempt, epoch,
                                            key)
                        if commit and isinstance(out[-1], Fenced):
                            cur = self.core.steps.in_tx(tx, planned.step)
                            assert cur is not None
                            out += _commit_events(tx, now, planned, out[-1],
                                                  inline_artifacts or {}, cur)
                        built.append(True)
                        return out

                    try:
                        recorded = self._log.append(build, guard=self.core.guard(),
                                                    scope=Scope(name))
                    except _Answered as answered:
                        return answered.result  # type: ignore[no-any-return]
                    except StaleEpoch:
                        self._take_back(wsdir, planned, landings)
                        raise
                    except _Moved:
                        # what the checks read moved under the file work (another step
                        # wrote a path, the attempt ended): take back, decide again
                        self._take_back(wsdir, planned, landings)
                        continue
                    break
                else:
                    raise StorageFailure(wsdir.root, f"step {step!r}: the workspace moved"
                                         f" under its apply {DRAFT_ROUNDS} times; apply again")
                committed = isinstance(recorded[-1].event, Acked)
                final = next(r for r in reversed(recorded)
                             if isinstance(r.event, Fenced | Rejected))
                event = final.event
                if isinstance(event, Rejected):
                    detail = event.detail
                    if event.undone:  # writes that had landed (now or before a crash), put back
                        detail += "; " + ", ".join(
                            f"{u.path}: {u.outcome}" + (f" (kept as {u.kept})" if u.kept else "")
                            for u in event.undone)
                    return ApplyResult(verdict=f"rejected:{event.reason}", step=step,
                                       attempt=attempt, detail=detail,
                                       facts=holder[-1].facts if holder else {})
                assert isinstance(event, Fenced)
                published = next((r for r in recorded if isinstance(r.event, ManifestPublished)),
                                 None) if committed else None
                manifest = None if published is None else Manifest.from_event(
                    published.event, published.seq, True)  # type: ignore[arg-type]
                return ApplyResult(verdict="applied", step=step, attempt=attempt,
                                   receipt=receipt_of(event, final.seq), committed=committed,
                                   manifest=manifest)
            except DatabaseUnavailable:
                if landings and not built:
                    # The store is out of reach before the commit (the server ended the
                    # session, or it is gone): a takeover may own the files now, and may
                    # have settled this attempt already. What this call exchanged goes
                    # back, each path only if it still holds what was put there. (Any
                    # other failure leaves them to the journal: a re-run finishes them,
                    # settling takes them back; a failure at COMMIT may have committed.)
                    self._take_back(wsdir, planned, landings)
                raise
            finally:
                done = any(isinstance(r.event, Fenced) for r in recorded)
                if done:  # recorded: what the writes displaced goes (the store holds it)
                    wsdir.release(landings)
                for path, s in staged.items():
                    if not any(x.path == path and x.ok for x in landings):
                        wsdir.discard(s)
                if not done:  # refused or failed: take back the directories staging made
                    wsdir.remove_created_dirs()

    def _recheck(self, tx: Tx, now: int, draft: _Draft, events: list[Event],
                 planned: Planned, attempt: int, epoch: int, key: str) -> list[Event]:
        """In the transaction that records an apply's draft: the checks again, on what
        may have moved while its files were worked on with no lock held — the journal,
        the live epoch (StaleEpoch), the attempt's state and, for `fenced`, every path
        rev and blob the fence read (`_Moved`). Returns the draft's events with their
        revs after the workspace's rev of now (writes to other paths committed
        meanwhile move them), its inline bytes written."""
        step, name = planned.step, planned.workspace
        if planned.journal and tx.journal_lookup(key) is not None:
            answer = self._journal_answer(tx, planned, attempt)
            if answer.verdict == "deduped":
                # another call of this attempt recorded its apply meanwhile (the same
                # writes: what landed is what it recorded): its answer
                raise _Answered(answer)
            raise _Moved(f"step {step!r} moved on")  # and ended: taken back, then answered
        ws = self._live_epoch(tx, name, epoch, now)
        if _step_key(self.core.steps.in_tx(tx, step)) != draft.steps.get(step):
            raise _Moved(f"step {step!r} moved on")
        if isinstance(events[-1], Fenced):
            seen = draft.workspaces.get(name)
            if planned.fence == "plan" and seen is not None and seen.rev != ws.rev:
                raise _Moved(f"workspace {name} moved from rev {seen.rev} to {ws.rev}")
            why = draft.moved(tx)
            if why is not None:
                raise _Moved(why)
        draft.flush(tx, now)
        return _shifted(events, draft.rev_shift(name, ws))

    def _journal_answer(self, tx: Tx, planned: Planned, attempt: int) -> ApplyResult:
        """The answer of an attempt whose apply the journal holds (a redelivery)."""
        step = planned.step
        cur = self.core.steps.in_tx(tx, step)
        hit = tx.journal_lookup(journal_key(Fenced(step=step, attempt=attempt,
                                                   workspace=planned.workspace)))
        assert cur is not None and hit is not None
        if cur.attempt == attempt and cur.state not in ENDED:
            fenced = msgspec.json.decode(hit.payload, type=Fenced)
            return ApplyResult(verdict="deduped", step=step, attempt=attempt,
                               receipt=receipt_of(fenced, hit[0]))
        return self._end_result(step, attempt, self._attempt_events(step, attempt))

    def _take_back(self, wsdir: WorkspaceDir, planned: Planned,
                   landings: list[Landing]) -> None:
        """Take back, newest first, what this call landed and did not record: each path
        only if it still holds what was put there (`WorkspaceDir.unland`; otherwise it is
        left as found — a settle took it back already, or a later write is there)."""
        posts = {w.path: w.post_hash for w in planned.writes}
        for landing in reversed(landings):
            with contextlib.suppress(LedgerError, OSError):
                wsdir.unland(landing, posts[landing.path])
        landings.clear()

    def _check_epoch(self, workspace: str, epoch: int, now: int | None = None) -> None:
        """Before each landing, with no store lock held: StaleEpoch unless `epoch` is the
        workspace's live one at `now` (None: the clock's now) in the latest commit (one
        read)."""
        row = self.get(workspace)
        live = row.live_epoch(self.core.clock() if now is None else now)
        if live != epoch:
            raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)

    def _epoch_live(self, workspace: str, epoch: int) -> bool | None:
        """Whether `epoch` is the workspace's live one now (None: the store cannot say)."""
        try:
            self._check_epoch(workspace, epoch)
        except StaleEpoch:
            return False
        except LedgerError:
            return None
        return True

    def _stale(self, workspace: str, epoch: int) -> StaleEpoch:
        row = self.get(workspace)
        return StaleEpoch(workspace, epoch, row.live_epoch(self.core.clock()),
                          latest=row.epoch, holder=row.holder)

    @contextlib.contextmanager
    def _workspace_lock(self, workspace: str) -> Iterator[None]:
        """The threads of this process apply and undo in one workspace in turn, from
        their checks to their commit — as they did when the store's write lock covered
        the file work (docs/design.md "Epochs and leases"): one step's checks never see
        another's landing that is not recorded yet. A lock of this process only: a
        thread is never frozen alone, and a takeover from another process needs none."""
        with self._locks_lock:
            entry = self._ws_locks.setdefault(workspace, [threading.RLock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._locks_lock:
                entry[1] -= 1
                if not entry[1]:
                    self._ws_locks.pop(workspace, None)

    def _store_pre_images(self, planned: Planned, wsdir: WorkspaceDir) -> dict[str, bytes]:
        """Read what each path holds now, if it is the planned pre-image, before the lock:
        small ones are returned (they commit as inline rows with the `fenced` event),
        large ones are streamed into the blob store now (pinned by that commit, which
        checks them present). Nothing is recorded: the exchange under the lock decides
        what was displaced; this only moves the reading out of the lock.

        A file that changed (or went) meanwhile is skipped: the exchange finds it so."""
        if planned.fence == "none":
            return {}
        small: dict[str, bytes] = {}
        posts = {w.post_hash for w in planned.writes}
        for w in planned.writes:
            if w.pre_hash is None or w.pre_hash in posts or w.pre_hash in small:
                continue  # absent, or pinned and stored as a post-image at admission
            with wsdir.open_if_file(w.path) as fd:  # not a file now: the fence refuses it
                if fd is None:
                    continue
                if os.fstat(fd).st_size <= self._options.inline_max_bytes:
                    data = b"".join(fd_chunks(fd))
                    if digest_of(data) == w.pre_hash:
                        small[w.pre_hash] = data
                    continue
                if self.core.blob_size(w.pre_hash) is None:
                    with contextlib.suppress(ContentChanged):
                        self.core.storage.files.put_stream(fd_chunks(fd), w.pre_hash)
        return small

    def _fence(
        self,
        tx: _Draft,
        now: int,
        planned: Planned,
        attempt: int,
        epoch: int,
        key: str,
        ws_row: WsRow,
        wsdir: WorkspaceDir,
        staged: dict[str, Staged],
        holder: list[ApplyResult],
        pre_bytes: dict[str, bytes],
        landings: list[Landing],
    ) -> list[Event]:
        """The checks and the exchanges, with no store lock held: `tx` is a `_Draft`,
        whose reads `_recheck` checks again in the transaction that records the events
        returned (`fenced` with its pins, or `rejected`).

        Each path is put in place by an atomic exchange (`WorkspaceDir.land`), after a
        read of the live epoch (a takeover stops the landings: StaleEpoch, and the caller
        takes back what landed), and what it displaced is checked after: the first path
        whose displaced bytes are not its pre-image rolls back every path before it and
        rejects the attempt. A write a crashed call of this attempt landed
        (`WorkspaceDir.landed`: its slot holds what it displaced) is checked the same way
        and recorded (`settled`), or rolled back with the rest. The displaced pre-images
        are stored (large ones now, small ones as rows of the recording transaction) and
        pinned there; their files stay on disk until it has committed (`release`)."""
        step, name = planned.step, planned.workspace
        cur = tx.step(step)
        assert cur is not None
        if planned.journal:
            hit = tx.journal_lookup(key)
            if hit is not None:
                ev = self._attempt_events(step, attempt)
                if cur.attempt == attempt and cur.state not in ENDED:
                    fenced = msgspec.json.decode(hit.payload, type=Fenced)
                    raise _Answered(ApplyResult(verdict="deduped", step=step, attempt=attempt,
                                                receipt=receipt_of(fenced, hit[0])))
                raise _Answered(self._end_result(step, attempt, ev))
        # Not a redelivery of an apply that happened: a new effect, so the epoch first
        # (a zombie hears StaleEpoch even when its attempt was settled meanwhile).
        ws = self._live_epoch(tx, name, epoch, now)
        if cur.attempt != attempt or cur.state in ENDED:
            raise _Answered(self._end_result(step, attempt, self._attempt_events(step, attempt)))
        older = [step for step, _attempt in tx.steps_in_flight(name, epoch, limit=6)]
        if older:  # settle first, then new work (an acquire that died mid-settle)
            raise Unsettled(name, older)
        if planned.epoch != epoch:
            if planned.epoch < epoch:
                raise Unsettled(name, [step])
            raise StaleEpoch(name, planned.epoch, epoch)
        recordable = cur.attempt == attempt and cur.state == PLANNED
        check = planned.fence != "none"
        if recordable and planned.journal:
            for w in planned.writes:  # a fallback landing a kill cut between its moves
                if w.pre_hash is not None and w.post_hash is not None:
                    wsdir.finish_aside(w.path, "x")
        wsdir.planned = _paths_of(planned)
        found = {w.path: wsdir.landed(w.path, w.pre_hash, w.post_hash, mode=w.mode)
                 for w in planned.writes} if recordable and planned.journal else {}

        order = {w.path: i for i, w in enumerate(planned.writes)}

        def reject(reason: str, detail: str, **facts: Any) -> list[Event]:
            verdict = ApplyResult(verdict=f"rejected:{reason}", step=step, attempt=attempt,
                                  detail=detail, facts=facts)
            if not recordable:  # journal off, attempt already applied: answer, record nothing
                raise _Answered(verdict)
            met = facts.pop("met", None)
            holder.append(verdict)
            # Whatever landed — in this call or a crashed one — goes back, newest first.
            undone = self._roll_back(tx, planned, wsdir, found, landings)
            if met is not None:  # the refused path itself: a save met there was kept
                undone = tuple(sorted((*undone, met), key=lambda r: order[r.path]))
            landings.clear()
            if "on_disk" in facts:  # what the fence found, kept with the refusal
                found_now = facts["on_disk"]
                detail = f"{detail} (on disk: {found_now or 'absent'})"
            detail = detail[:TEXT_MAX]  # a path can be as long as the detail may be
            return [Rejected(step=step, attempt=attempt, run=planned.run, workspace=name,
                             epoch=epoch, reason=reason, detail=detail,  # type: ignore[arg-type]
                             undone=undone)]

        if planned.fence == "plan":
            plan_rev = planned.plan_rev if planned.plan_rev is not None else planned.rev
            if ws.rev != plan_rev:
                return reject("stale_rev", f"the workspace is at rev {ws.rev}, the plan was"
                              f" admitted at rev {plan_rev}", workspace_rev=ws.rev,
                              plan_rev=plan_rev)
        if planned.fence == "step":
            for w in planned.writes:
                state = tx.path_state(name, w.path)
                path_rev = 0 if state is None else state[0]
                if path_rev != w.base_rev:
                    return reject("stale_rev", f"{w.path} is at rev {path_rev}, planned"
                                  f" against rev {w.base_rev}", path=w.path,
                                  path_rev=path_rev, base_rev=w.base_rev)
        if check:  # before any exchange: each path must hold what was read (a symlink,
            # a FIFO, a directory is refused outright, PathEscapes); the exchanges check again
            for w in planned.writes:
                f = found.get(w.path)
                if f is not None and f.landed:
                    continue
                try:
                    disk = wsdir.hash(w.path)
                except PathEscapes as exc:  # a symlink, a directory or a FIFO swapped in
                    return reject("pre_hash", f"{w.path} on disk is not the regular file it"
                                  f" was planned against ({exc.why})", path=w.path,
                                  on_disk=NOT_A_FILE, pre_hash=w.pre_hash,
                                  post_hash=w.post_hash)
                if disk != w.pre_hash:
                    return reject("pre_hash", f"{w.path} on disk does not hold the content it"
                                  " was planned against", path=w.path, on_disk=disk,
                                  pre_hash=w.pre_hash, post_hash=w.post_hash)
            # a crashed call's landed writes: did they displace the pre-image?
            for w in planned.writes:
                f = found.get(w.path)
                if f is not None and f.landed and (
                        (w.pre_hash is not None and f.displaced != w.pre_hash)
                        or (w.post_hash is not None and f.now != w.post_hash)):
                    return reject("pre_hash", f"{w.path} on disk does not hold the content it"
                                  " was planned against", path=w.path,
                                  on_disk=f.displaced if w.pre_hash is not None else f.now,
                                  pre_hash=w.pre_hash, post_hash=w.post_hash)
        for w in planned.writes:
            f = found.get(w.path)
            d = w.path.rpartition("/")[0]
            if d in wsdir.gone_dirs and w.path not in staged and not (f and f.landed):
                return reject("pre_hash", f"{w.path}: its directory {d} is not there any"
                              " more (renamed, moved or removed since the plan); nothing"
                              " was written and nothing of the step was left applied",
                              path=w.path, moved=None)
            gone = wsdir.staging_moved.get(w.path)
            if gone is not None and w.path not in staged:
                return reject("pre_hash", f"{w.path}: its directory {gone.directory} was"
                              " renamed or removed while the step ran; nothing was written"
                              " there and nothing of the step was left applied",
                              path=w.path, moved=None)
            if w.post_hash is not None and w.path not in staged and not (f and f.landed):
                # its staged file was removed before it was placed (the live epoch's
                # cleanup of a dead stager's files, a second apply of the attempt):
                # nothing of the step has been touched yet
                raise StorageFailure(os.path.join(wsdir.root, w.path),
                                     "its staged copy was removed before it was placed;"
                                     " apply again")
        settled = False
        applied = []
        rev = ws.rev
        for w in planned.writes:
            rev += 1
            f = found.get(w.path)
            if f is not None and f.landed:
                settled = True  # a crash after the exchange: record what is on disk
                landing = Landing(w.path, True, f.displaced, f.slot,
                                  pre_mode=wsdir.mode(w.path, f.slot) if w.pre_hash
                                  is not None and f.slot is not None else None,
                                  post_mode=wsdir.mode(w.path), post=w.post_hash,
                                  link=None if f.slot == wsdir.slot(w.path, "x")
                                  else wsdir.slot(w.path, "x"))
            else:
                self._check_epoch(name, epoch, tx.now())  # a takeover since: StaleEpoch
                landing = wsdir.land(w.path, staged.get(w.path), w.pre_hash, check=check)
            if landing.moved is not None:
                d = w.path.rpartition("/")[0]
                went = f" (it is now {landing.moved})" if landing.moved else ""
                return reject("pre_hash", f"{w.path}: its directory {d} was renamed or moved"
                              f" while the step ran{went}; nothing was written there and"
                              " nothing of the step was left applied", path=w.path,
                              moved=landing.moved)
            if not landing.ok:
                met = None if landing.kept is None else Restored(
                    path=w.path, rev=w.base_rev, digest=_digest(landing.found),
                    outcome="conflict", kept=_kept_path(w.path, landing))
                return reject("pre_hash", f"{w.path} on disk does not hold the content it"
                              " was planned against", path=w.path, on_disk=landing.found,
                              pre_hash=w.pre_hash, post_hash=w.post_hash, met=met)
            landings.append(landing)
            applied.append(AppliedWrite(path=w.path, rev=rev,
                                        pre_hash=w.pre_hash if check else landing.found,
                                        post_hash=w.post_hash, pre_mode=landing.pre_mode,
                                        post_mode=landing.post_mode))
        wsdir.sync_dirs(w.path for w in planned.writes)
        pins = self._keep_pre_images(tx, now, planned, applied, landings, pre_bytes, wsdir)
        return [*pins, Fenced(step=step, attempt=attempt, run=planned.run, workspace=name,
                              epoch=epoch, writes=tuple(applied), rev=rev, settled=settled,
                              journal=planned.journal)]

    def _keep_pre_images(
        self, tx: Tx, now: int, planned: Planned, applied: Sequence[AppliedWrite],
        landings: Sequence[Landing], pre_bytes: dict[str, bytes], wsdir: WorkspaceDir,
    ) -> list[Event]:
        """Store and pin, in the `fenced` transaction, the pre-image each write displaced
        (its bytes still on disk under the slot until that commit). A pre-image that is
        also a post-image of the attempt is pinned and stored since admission."""
        posts = {w.post_hash for w in planned.writes}
        inline: dict[str, bytes] = {}
        digests: list[str] = []
        for a, landing in zip(applied, landings):
            d = a.pre_hash
            if d is None or d in posts or d in digests:
                continue
            digests.append(d)
            if tx.blob_size(d) is not None:
                continue
            if d in pre_bytes:
                inline[d] = pre_bytes[d]
                continue
            with wsdir.open_slot(a.path, landing.displaced or "") as fd:
                if fd is None:
                    raise StorageFailure(os.path.join(wsdir.root, a.path),
                                         "the displaced pre-image went missing before it was"
                                         " stored; apply again")
                if os.fstat(fd).st_size <= self._options.inline_max_bytes:
                    data = b"".join(fd_chunks(fd))
                    if digest_of(data) != d:
                        raise StorageFailure(os.path.join(wsdir.root, a.path),
                                             "the displaced pre-image changed before it was"
                                             " stored; apply again")
                    inline[d] = data
                else:
                    self.core.storage.files.put_stream(fd_chunks(fd), d)
        if inline:
            tx.put_inline(inline, now)
        return [BlobPinned(step=planned.step, attempt=planned.attempt, run=planned.run,
                           workspace=planned.workspace, epoch=planned.epoch, digest=d,
                           role="pre-image") for d in digests]

    def _roll_back(
        self, tx: Tx, planned: Planned, wsdir: WorkspaceDir, found: dict[str, Found],
        landings: list[Landing],
    ) -> tuple[Restored, ...]:
        """Put back, newest first, the writes this call landed and those a crashed call of
        the attempt landed (`found`): each displaced file returns where it was, if the
        path still holds what the write put there; otherwise the path is a ``conflict``
        left as found, and what the write displaced is kept under a visible name
        (`Restored.kept`). Every path touched is listed, with what it holds now — as
        `Rejected.undone` records them."""
        posts = {w.path: w.post_hash for w in planned.writes}
        back: dict[str, tuple[TakeBack, str | None]] = {}
        for landing in reversed(landings):
            back[landing.path] = (wsdir.unland(landing, posts[landing.path]), landing.found)
        out: list[Restored] = []
        for w in reversed(planned.writes):
            f = found.get(w.path)
            if w.path not in back:
                if f is None:
                    continue
                state = tx.path_state(planned.workspace, w.path)
                if (0 if state is None else state[0]) != w.base_rev:
                    continue  # recorded as a later step's since: not this attempt's to undo
                if not f.landed and w.path.rpartition("/")[0] in wsdir.gone_dirs:
                    # a crashed call of this attempt, then the directory moved: its
                    # landings are taken back where the directory went (one search)
                    f = wsdir.landed(w.path, w.pre_hash, w.post_hash, search=True,
                                     mode=w.mode)
                if not f.landed:
                    if f.now == w.post_hash and w.post_hash != w.pre_hash and f.now is not None:
                        # its bytes are there with no sign this attempt put them (a person
                        # may have): left as found, and said so
                        out.append(Restored(path=w.path, rev=w.base_rev, digest=f.now,
                                            outcome="conflict"))
                    continue
                back[w.path] = (wsdir.roll_back(f, w.post_hash, post_mode=w.mode),
                                f.displaced)
            taken, displaced = back[w.path]
            kept = _kept_path(w.path, taken)
            if taken.ok:
                out.append(Restored(path=w.path, rev=w.base_rev, digest=_digest(displaced),
                                    outcome="restored" if displaced == w.pre_hash
                                    else "conflict", kept=kept))
            else:
                out.append(Restored(path=w.path, rev=w.base_rev, digest=_digest(taken.now),
                                    outcome="conflict", kept=kept))
        return tuple(reversed(out))

    # -- compensating --------------------------------------------------------------------

    def compensate(
        self,
        step: str,
        attempt: int | None = None,
        *,
        reason: str = "",
        epoch: int | None = None,
    ) -> Compensation:
        """End the attempt, undoing its workspace writes where that is safe.

        For each write: the path's rev still the attempt's and its bytes still the
        post-image → the pre-image goes back (``restored``), by an atomic exchange
        checked like a write's; the pre-image already there → ``already``; anything else
        → ``conflict`` and nothing is overwritten. A write a crashed apply landed without
        recording it goes back from what it displaced (its slot). A committed step's live
        manifest ends (allowed only within the compensation window). A step that writes
        the workspace needs its live `epoch`; pins are released. A redelivery returns the
        first compensation.

        Journaled: a `compensating` intent commits before the first file is touched, so
        an undo killed halfway leaves its step ``compensating`` (in flight): the next
        settle — the next epoch's acquire — or a retry finishes it.
        """

        row = self.core.steps.get(step)
        attempt = row.attempt if attempt is None else attempt
        ev = self._attempt_events(step, attempt)
        planned = ev.planned
        writing = planned is not None and bool(planned.workspace) and planned.epoch > 0
        if writing and epoch is None:
            raise InvalidInput(f"step {step!r} writes workspace {planned.workspace!r}:"  # type: ignore[union-attr]
                               " give the live epoch to compensate it")
        ws_row = self.get(planned.workspace) if writing else None  # type: ignore[union-attr]
        wsdir = None
        landings: list[Landing] = []
        if ws_row is not None and epoch is not None:
            assert planned is not None
            wsdir = self._wsdir(ws_row, step, attempt, epoch)
            if row.attempt == attempt and row.state not in ENDED:
                wsdir.check_root()  # a swapped root: refused before the intent is recorded
                ev = self._intend_compensation(planned, ev, epoch, reason)

        def build(tx: Tx, now: int) -> list[Event]:
            landings.clear()
            cur = tx.step(step)
            if cur is None:
                raise UnknownStep(step)
            if cur.attempt == attempt and cur.state == COMPENSATED or cur.attempt != attempt:
                raise _Answered(self._answer_compensation(step, attempt))
            if cur.state == REJECTED:
                raise IllegalTransition(step, attempt, "compensated", "the attempt was rejected:"
                                        " nothing was applied")
            if cur.state != COMPENSATING:  # (an undo begun in its window finishes)
                self._check_window(tx, cur, now)
            restored: list[Restored] = []
            rev = 0
            if writing:
                assert planned is not None and wsdir is not None and epoch is not None
                ws = self._live_epoch(tx, planned.workspace, epoch, now)
                restored, rev = self._undo(tx, now, planned, ev, ws, wsdir, landings)
            return [Compensated(step=step, attempt=attempt, run=cur.run, workspace=cur.workspace,
                                epoch=epoch if writing else cur.epoch, reason=reason,
                                restored=tuple(restored), rev=rev)]

        if wsdir is None:  # nothing on disk to undo: the checks and the record, one commit
            try:
                recorded = self._log.append(build, guard=self.core.guard(),
                                            scope=Scope(planned.workspace) if writing  # type: ignore[union-attr]
                                            else None)[0]
            except _Answered as answered:
                return answered.result  # type: ignore[no-any-return]
        else:
            assert planned is not None and epoch is not None
            with self._workspace_lock(planned.workspace):
                try:
                    recorded = self._undo_drafted(build, planned, epoch, landings)
                except _Answered as answered:
                    if recorded_before(answered.result):
                        # a redelivery: what a kill after that commit left (the slots of
                        # what the undo displaced) goes now, each once the ledger holds it
                        with contextlib.suppress(LedgerError, OSError):
                            self.tidy(step)
                    return answered.result  # type: ignore[no-any-return]
        event = recorded.event
        assert isinstance(event, Compensated)
        if wsdir is not None and ws_row is not None and planned is not None:
            wsdir.release(landings)  # what the undo displaced: the post-images, in the store
            self._remove_temporaries(wsdir, planned.writes, ws_row.epoch)
        return Compensation(step=step, attempt=attempt, seq=recorded.seq, restored=event.restored)

    def _undo_drafted(self, build: Any, planned: Planned, epoch: int,
                      landings: list[Landing]) -> RecordedEvent:
        """Run an undo's `build` — its checks and its file work (`_undo`) — with no store
        lock held (a `_Draft`; the epoch read again before each path), then record its
        `compensated` in one transaction that checks the draft's reads again: the step,
        the live epoch (StaleEpoch), every path rev and blob it read. What moved meanwhile
        (another step wrote a path) makes it decide again from the disk: an undo only
        ever goes forward — its intent (`compensating`) is durable, what it put back
        stays, and the next round finds it ``already`` there. `landings` ends up holding
        every round's, for `release` once recorded."""
        step, attempt, name = planned.step, planned.attempt, planned.workspace
        kept: list[Landing] = []
        try:
            for _round in range(DRAFT_ROUNDS):
                draft = _Draft(self._storage.view, self.core.clock(), self.core.steps.find,
                               before_path=lambda _path: self._check_epoch(
                                   name, epoch, draft.now()))
                try:
                    events = build(draft, draft.time_ns)
                finally:
                    kept += landings

                def record(tx: Tx, now: int, draft: _Draft = draft,
                           events: list[Event] = events) -> list[Event]:
                    cur = self.core.steps.in_tx(tx, step)
                    if _step_key(cur) != draft.steps.get(step):
                        raise _Moved(f"step {step!r} moved on")
                    ws = self._live_epoch(tx, name, epoch, now)
                    if cur is not None and cur.state != COMPENSATING:
                        self._check_window(tx, cur, now)
                    why = draft.moved(tx)
                    if why is not None:
                        raise _Moved(why)
                    draft.flush(tx, now)
                    return _shifted(events, draft.rev_shift(name, ws))

                try:
                    return self._log.append(record, guard=self.core.guard(),
                                            scope=Scope(name))[0]
                except _Moved:
                    continue
            raise StorageFailure(name, f"step {step!r} attempt {attempt}: the workspace moved"
                                 f" under its undo {DRAFT_ROUNDS} times; compensate again")
        finally:
            landings[:] = kept

    def _check_window(self, tx: Tx, cur: StepRow, now: int) -> None:
        """A committed step may be compensated only within the compensation window."""
        if not cur.live:
            return
        published = max((r.time_ns for r in tx.events(EventQuery(
            step=cur.step_id, kinds=frozenset({"manifest-published"})))), default=None)
        age_s = (now - (published or now)) / 1e9
        if age_s > self._options.compensation_window_s:
            raise CompensationWindowClosed(cur.step_id, age_s, self._options.compensation_window_s)

    def _intend_compensation(self, planned: Planned, ev: _AttemptEvents, epoch: int,
                             reason: str) -> _AttemptEvents:
        """Record the undo's intent (`compensating`) before any file is touched, unless a
        killed undo recorded it already; returns the attempt's events with it."""
        if ev.compensating is not None:
            return ev
        intent = Compensating(step=planned.step, attempt=planned.attempt, run=planned.run,
                              workspace=planned.workspace, epoch=epoch, reason=reason)

        def build(tx: Tx, now: int) -> list[Event]:
            cur = tx.step(planned.step)
            if cur is None or cur.attempt != planned.attempt or cur.state in ENDED \
                    or cur.state == COMPENSATING:
                raise _Answered(None)  # ended, or an undo began meanwhile
            self._check_window(tx, cur, now)
            self._live_epoch(tx, planned.workspace, epoch, now)
            return [intent]

        with contextlib.suppress(_Answered):
            self._log.append(build, guard=self.core.guard(), scope=Scope(planned.workspace))
        return self._attempt_events(planned.step, planned.attempt)

    def _answer_compensation(self, step: str, attempt: int) -> Compensation:
        ev = self._attempt_events(step, attempt)
        if ev.end is not None and isinstance(ev.end[1], Compensated):
            return Compensation(step=step, attempt=attempt, seq=ev.end[0],
                                restored=ev.end[1].restored, deduped=True)
        raise IllegalTransition(step, attempt, "compensated", "it is not the latest attempt")

    def _undo(
        self,
        tx: Tx,
        now: int,
        planned: Planned,
        ev: _AttemptEvents,
        ws: WsRow,
        wsdir: WorkspaceDir,
        landings: list[Landing],
    ) -> tuple[list[Restored], int]:
        """Put pre-images back where safe (under the lock). Returns (per path, new rev).

        A write the attempt recorded (`fenced`) is judged against that record and undone
        by an exchange checked like a write's (`WorkspaceDir.land`): the post-image must
        be what it displaces. A write it never recorded — a crashed apply — is undone
        only where its slot shows it landed (`WorkspaceDir.landed`), from the bytes it
        displaced, which are stored first (the compensation names them). An undo killed
        before (its intent's epoch) may have displaced a person's save: that goes back.
        """

        name = planned.workspace
        applied: dict[str, AppliedWrite] = {}
        for _, fenced in ev.fenced:
            for w in fenced.writes:
                applied[w.path] = w  # journal off: the latest application of a path
        crashed = self._wsdir(ws, planned.step, planned.attempt, planned.epoch)
        crashed.planned = _paths_of(planned)
        intent = ev.compensating[1].epoch if ev.compensating is not None else None
        undone_by = self._wsdir(ws, planned.step, planned.attempt, intent) \
            if intent is not None else None
        if undone_by is not None:
            undone_by.planned = crashed.planned
        out: list[Restored] = []
        inline: dict[str, bytes] = {}
        # What the undo puts back goes first, what it removes after: a file the step
        # created with bytes it took from another path (a move) is removed only once those
        # bytes are back at their old path — otherwise both are left as found.
        sources = {w.pre_hash: w.path for w in planned.writes
                   if w.post_hash is None and w.pre_hash is not None}
        # directories the step left a file of its own in (a move's emptied source
        # directory, removed after it, is not one: its undo makes it again)
        kept_dirs = {a.path.rpartition("/")[0] for a in applied.values()
                     if a.post_hash is not None}
        for w in sorted(reversed(planned.writes), key=lambda w: w.pre_hash is None):
            state = tx.path_state(name, w.path)
            path_rev = 0 if state is None else state[0]
            src = sources.get(w.post_hash) if w.pre_hash is None else None
            if undone_by is not None and w.pre_hash is not None:
                # an undo killed mid-landing without the exchange call (its file aside,
                # the pre-image not yet linked in): finished first
                with contextlib.suppress(LedgerError):
                    undone_by.finish_aside(w.path, "u")
            try:
                disk = wsdir.hash(w.path)
            except (WorkspaceMoved, WorkspaceOverlap):
                raise  # the root itself is not the workspace's: refuse, record nothing
            except (PathEscapes, InvalidInput):  # a symlink, a directory, a forbidden path
                out.append(Restored(path=w.path, rev=path_rev, digest=None, outcome="conflict"))
                continue
            if src is not None and any(r.path == src and r.outcome == "conflict" for r in out):
                # a move's destination whose source could not be put back: kept as is
                out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk),
                                    outcome="conflict"))
                continue
            a = applied.get(w.path)
            if a is None:  # never recorded: did a crashed apply land it?
                found = crashed.landed(w.path, w.pre_hash, w.post_hash, search=True,
                                       mode=w.mode)
                if not found.landed:
                    if disk == w.post_hash and w.post_hash != w.pre_hash \
                            and path_rev == w.base_rev:
                        # its bytes are there with no sign this attempt put them: a
                        # person may have; left for a human
                        out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk),
                                            outcome="conflict"))
                    continue
                if path_rev != w.base_rev:
                    out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk),
                                        outcome="conflict"))
                    continue
                if found.displaced is not None and found.displaced != NOT_A_FILE:
                    self._keep_displaced(tx, crashed, found, inline)
                # the pre-image, stored now, may stay in its slot for the collection
                # after the commit; anything else (a person's save the crashed call met)
                # that cannot go back is kept visible
                stored = found.displaced == w.pre_hash and found.displaced is not None
                taken = crashed.roll_back(found, w.post_hash, displaced_stored=stored,
                                          post_mode=w.mode)
                if taken.ok:
                    ok = found.displaced == w.pre_hash
                    out.append(Restored(path=w.path, rev=path_rev + 1,
                                        digest=_digest(found.displaced),
                                        outcome="restored" if ok else "conflict",
                                        mode=wsdir.mode(w.path),
                                        kept=_kept_path(w.path, taken)))
                else:
                    out.append(Restored(path=w.path, rev=path_rev, digest=_digest(taken.now),
                                        outcome="conflict", kept=_kept_path(w.path, taken)))
                continue
            pre, post, expected_rev = a.pre_hash, a.post_hash, a.rev
            if path_rev != expected_rev:
                out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk), outcome="conflict"))
                continue
            if disk is None and w.path.rpartition("/")[0] in kept_dirs \
                    and not wsdir.has_dir(w.path.rpartition("/")[0]):
                # the directory the step left holding its files is gone: a person renamed
                # or removed it since (`git mv src lib`). Neither "already undone" (a
                # create's file is not absent, it moved) nor a file put back into a
                # directory recreated behind them
                out.append(Restored(path=w.path, rev=path_rev, digest=None,
                                    outcome="conflict"))
                continue
            if disk == post and post != pre:
                try:  # the pre-image is copied piece by piece, checked before it goes in
                    staged = None if pre is None else wsdir.stage(
                        w.path, self.core.blob_chunks(pre), mode=a.pre_mode, slot="u")
                except (BlobNotFound, BlobCorrupt):
                    out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk),
                                        outcome="conflict"))
                    continue
                landing = wsdir.land(w.path, staged, post, role="u")
                if not landing.ok:
                    if staged is not None:
                        wsdir.discard(staged)
                    out.append(Restored(path=w.path, rev=path_rev, digest=_digest(landing.found),
                                        outcome="conflict"))
                    continue
                landings.append(landing)
                # the mode recorded with the pre-image goes back — unless a person
                # chmodded the step's file since (its bits are not the ones the step
                # gave it): a person's chmod is theirs, kept on the file put back, as a
                # take-back keeps it
                mode = None if staged is None else \
                    wsdir.keep_persons_mode(w.path, landing.displaced, a.post_mode,
                                            staged.identity)
                out.append(Restored(path=w.path, rev=path_rev + 1, digest=pre,
                                    outcome="restored", mode=mode))
            elif disk == pre:
                # put back by an undo that was killed before it recorded it: was a
                # person's save displaced by it (its slot holds neither image)?
                if undone_by is not None:
                    f = undone_by.landed(w.path, post, pre, role="u", search=True)
                    if f.landed and f.displaced not in (post, NOT_A_FILE):
                        if f.displaced is not None:
                            self._keep_displaced(tx, undone_by, f, inline)
                        taken = undone_by.roll_back(f, pre, post_mode=a.pre_mode)
                        if taken.ok:
                            out.append(Restored(path=w.path, rev=path_rev,
                                                digest=f.displaced, outcome="conflict",
                                                kept=_kept_path(w.path, taken)))
                            continue
                    elif f.landed and f.displaced == post:
                        # the killed undo displaced the step's file: a person's chmod
                        # of it is carried over, as the undo would have
                        undone_by.keep_persons_mode(w.path, f.slot, a.post_mode)
                wsdir.sync(w.path)  # durable, then recorded
                out.append(Restored(path=w.path, rev=path_rev + 1, digest=pre,
                                    outcome="already", mode=wsdir.mode(w.path)))
            else:
                out.append(Restored(path=w.path, rev=path_rev, digest=_digest(disk), outcome="conflict"))
        if inline:
            tx.put_inline(inline, now)
        # a directory moved after the kill, where the settle found the crashed writes:
        # the attempt's temporaries there are collected too
        wsdir.also_dirs |= crashed.moved_dirs()
        if undone_by is not None and any(not wsdir.has_dir(d) for d in _dirs_of(planned)):
            # an undo killed while a directory it staged into was renamed: its
            # temporaries went with the directory (one search of the workspace)
            wsdir.also_dirs |= undone_by.moved_dirs(search=True)
        rank = {w.path: i for i, w in enumerate(reversed(planned.writes))}
        out.sort(key=lambda r: rank[r.path])  # the record lists paths in undo order
        wsdir.sync_dirs(r.path for r in out if r.outcome != "conflict")
        # the fold assigns revs in event order: renumber the moved entries in order
        moved = [r for r in out if r.outcome != "conflict"]
        renumbered = {id(r): ws.rev + i for i, r in enumerate(moved, 1)}
        out = [msgspec.structs.replace(r, rev=renumbered[id(r)]) if id(r) in renumbered else r
               for r in out]
        return out, (ws.rev + len(moved)) if moved else 0

    def _keep_displaced(self, tx: Tx, wsdir: WorkspaceDir, found: Found,
                        inline: dict[str, bytes]) -> None:
        """Store what a crashed write displaced (its slot's bytes) before it goes back:
        the compensation record names it, and names only what the store holds."""
        d = found.displaced
        if d is None or d in inline or tx.blob_size(d) is not None or found.slot is None:
            return
        with wsdir.open_slot(found.path, found.slot) as fd:
            if fd is None:
                return
            if os.fstat(fd).st_size <= self._options.inline_max_bytes:
                data = b"".join(fd_chunks(fd))
                if digest_of(data) == d:
                    inline[d] = data
                return
            with contextlib.suppress(ContentChanged):
                self.core.storage.files.put_stream(fd_chunks(fd), d)


    # -- receipts ------------------------------------------------------------------------

    def check_receipt(self, receipt: Receipt | dict[str, Any] | bytes | str) -> Receipt:
        """Parse a receipt handed back by an executor and check it against the ledger.

        A receipt that is empty, malformed, or does not match the recorded apply is
        refused (InvalidInput / IllegalTransition): a 200 with an empty body moves nothing.
        """
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
        ev = self._attempt_events(receipt.step, receipt.attempt)
        match = [f for seq, f in ev.fenced if seq == receipt.seq]
        if not match or receipt_of(match[0], receipt.seq) != receipt:
            raise IllegalTransition(receipt.step, receipt.attempt, "manifest-published",
                                    "the receipt does not match the apply the ledger recorded")
        return receipt


#: A name `Mover.keep` gives: the leaf, the mark, the attempt's 8-hex tag and a counter. Not a name of text that is not UTF-8 (no path steptrail writes is) — a
#: person's ``notes.steptrail-kept-mine`` is not one either.
_KEPT_NAME: Final = re.compile(r"(?s)[^\udc80-\udcff]+" + re.escape(KEPT_MARK)
                               + r"[0-9a-f]{8}(?:-[0-9]+)?")


def _paths_of(planned: Planned) -> frozenset[str]:
    """The paths a plan writes."""
    return frozenset(w.path for w in planned.writes)


def _dirs_of(planned: Planned) -> frozenset[str]:
    """The directories (relative; "" the root) of a plan's paths."""
    return frozenset(w.path.rpartition("/")[0] for w in planned.writes)


__all__ = [
    "COMPENSATION_WINDOW_S_DEFAULT",
    "FENCE_MODES",
    "ApplyResult",
    "Compensation",
    "KeptFile",
    "Lease",
    "Receipt",
    "SettleConflict",
    "StepPlan",
    "Workspaces",
    "Write",
]

"""The values of a step's lifecycle: what a planner hands in (`Write`, `StepPlan`), what
it reads (`FileRead`), and what the ledger answers (`Lease`, `Receipt`, `ApplyResult`,
`Compensation`, `SettleConflict`, `KeptFile`). Plain data: no I/O, nothing of the
ledger's state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from ..blobs import Content
from ..events import AppliedWrite, Fenced, Manifest, Restored


#: The largest integer a revision or an epoch may be (a signed 64-bit column).
INT64_MAX: Final = 2**63 - 1


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
    # the observation steps an acquire with `observe` recorded (edits made outside the
    # steps while nobody held the lease), and how many changes they hold
    observed: tuple[str, ...] = ()
    observed_changes: int = 0
    # what that observation saw and left out ("path (why)", .gitignore'd files not
    # listed), and why it failed when it did: the lease is held all the same — the edits
    # are recorded by the next observation (`observe --epoch N`)
    not_captured: tuple[str, ...] = ()
    observe_error: str | None = None


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


def recorded_before(result: object) -> bool:
    """Whether a compensation's answer is a redelivery of one recorded before."""
    return isinstance(result, Compensation) and result.deduped


def receipt_of(event: Fenced, seq: int) -> Receipt:
    return Receipt(workspace=event.workspace, step=event.step, attempt=event.attempt,
                   epoch=event.epoch, rev=event.rev, writes=event.writes, seq=seq,
                   settled=event.settled)

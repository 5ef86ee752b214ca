"""Events: the facts a ledger records, as one msgspec tagged union.

Every transition of every step is one immutable event (docs/design.md "Events and the
attempt lifecycle"). This module owns their shapes, validation at the boundary,
deterministic encoding, journal-key derivation and the chain hash. It does no I/O
and imports neither the SQLite driver nor click.

Schema evolution: a new field gets a default; renaming or retyping a field needs a
new tag or an upcaster keyed by the row's `v`. Never silently reuse a tag.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, ClassVar, Final, Literal, NamedTuple, Union

import msgspec
from msgspec import Meta, Struct

from .errors import InvalidInput

#: Version of the event encoding written into every row's `v` column.
#: 2: `blob-stored` is journal-keyed by path and digest (two artifacts of one step may
#: hold the same bytes); rows of version 1 keep their version-1 keys.
EVENT_VERSION: Final = 2
#: The newest row version this steptrail reads. 3: the kinds of time travel (`observed`,
#: `held`, `hold-released`) are written as version 3, so a steptrail older than them
#: refuses such a row by its version ("upgrade steptrail"), never as a damaged payload;
#: every other kind is still written as version 2.
READ_VERSION: Final = 3
#: Kinds written with a row version above EVENT_VERSION (see READ_VERSION).
KIND_VERSIONS: Final = {"observed": 3, "held": 3, "hold-released": 3,
                         "history-released": 3}


def row_version(kind: str) -> int:
    """The version a new row of `kind` is written with."""
    return KIND_VERSIONS.get(kind, EVENT_VERSION)

STEP_ID_MAX: Final = 256
PATH_MAX: Final = 4096
ITEMS_MAX: Final = 10_000
TEXT_MAX: Final = 4096
NAME_MAX: Final = 255  # bytes in one path component (the file systems' NAME_MAX)
INT64_MAX: Final = 2**63 - 1  # SQLite's INTEGER
#: An event's encoded payload, bounded below SQLite's 64 MiB value limit (the row's
#: other columns and the limit's slack fit in the rest).
PAYLOAD_MAX: Final = 60 * 1024 * 1024

_NO_CONTROL = r"^[^\x00-\x1f\x7f\ud800-\udfff]*\Z"

# Constraints are enforced on decode; `validate()` round-trips an event through the
# decoder so that events built in Python are held to the same rules.
StepId = Annotated[str, Meta(min_length=1, max_length=STEP_ID_MAX, pattern=_NO_CONTROL)]
Name = Annotated[str, Meta(max_length=STEP_ID_MAX, pattern=_NO_CONTROL)]
Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]  # \Z: "$" would accept a trailing "\n"
Text = Annotated[str, Meta(max_length=TEXT_MAX)]
Attempt = Annotated[int, Meta(ge=1, le=INT64_MAX)]
NonNegative = Annotated[int, Meta(ge=0, le=INT64_MAX)]
FileId = Annotated[int, Meta(ge=0)]  # st_dev, st_ino: unsigned 64-bit (above int64)
RelPath = Annotated[str, Meta(min_length=1, max_length=PATH_MAX)]
Mode = Annotated[int, Meta(ge=0, le=0o7777)]  # a file's permission bits

DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")


def check_digest(digest: object, what: str = "digest") -> str:
    """Return `digest` if it is 64 lowercase hex characters, else raise InvalidInput."""
    if not isinstance(digest, str) or DIGEST_RE.fullmatch(digest) is None:
        raise InvalidInput(
            f"{what} {digest!r} is not a sha256 digest; expected 64 lowercase hex characters"
        )
    return digest


def check_step_id(step: object) -> str:
    """Return `step` if it is a usable step id, else raise InvalidInput."""
    if not isinstance(step, str) or not step:
        raise InvalidInput(f"step id {step!r} is empty; give every step a non-empty id")
    if len(step) > STEP_ID_MAX:
        raise InvalidInput(
            f"step id of {len(step)} characters is too long; the limit is {STEP_ID_MAX}"
        )
    if re.search(r"[\x00-\x1f\x7f]", step):
        raise InvalidInput(f"step id {step!r} contains a control character; remove it")
    check_utf8(step, "step id")
    return step


def check_int(value: object, what: str, lo: int = 0, hi: int = INT64_MAX) -> int:
    """Return `value` if it is an int (not a bool) in [lo, hi] (SQLite's 64-bit range by
    default), else raise InvalidInput."""
    if type(value) is not int or not lo <= value <= hi:
        raise InvalidInput(f"{what} {value!r} must be an integer from {lo} to {hi}")
    return value


def check_utf8(text: str, what: str) -> str:
    """Refuse a string that is not encodable as UTF-8 (a lone surrogate: an argument
    that was not valid UTF-8, decoded with surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{what} {text!r} is not valid UTF-8 (it holds a lone surrogate); use valid UTF-8 text"
        ) from None
    return text


_BAD_PATH_CHARS: Final = re.compile(r"[\x00-\x1f\x7f\\]")


def check_relpath(path: object, what: str = "path") -> str:
    """Return `path` if it is relative, normalized and stays inside its root.

    Refused: empty, absolute, backslashes, control characters (NUL included), and any
    empty, `.` or `..` component (`a//b`, `./a`, `a/../b`, a trailing slash).
    """
    if not isinstance(path, str) or not path:
        raise InvalidInput(f"{what} {path!r} is empty; give a relative path like 'src/app.py'")
    if len(path) > PATH_MAX:
        raise InvalidInput(f"{what} of {len(path)} characters is too long; the limit is {PATH_MAX}")
    if _BAD_PATH_CHARS.search(path) is not None:
        raise InvalidInput(
            f"{what} {path!r} contains a control character or backslash; use '/' separators"
        )
    if path[0] == "/":
        raise InvalidInput(f"{what} {path!r} is absolute; give it relative to its root (the workspace, or the step's artifact names)")
    parts = path.split("/")
    if "" in parts or "." in parts or ".." in parts:
        part = next(p for p in parts if p in ("", ".", ".."))
        raise InvalidInput(
            f"{what} {path!r} is not normalized or escapes its root (component {part!r});"
            " give a plain relative path like 'src/app.py'"
        )
    check_utf8(path, what)
    for part in parts:
        if len(part.encode("utf-8")) > NAME_MAX:
            raise InvalidInput(
                f"{what} {path[:60]!r}… has a component of {len(part.encode('utf-8'))} bytes;"
                f" the limit is {NAME_MAX} bytes per component"
            )
    return path


class _PathChecked(Struct, frozen=True, kw_only=True):
    path: RelPath

    def __post_init__(self) -> None:
        check_relpath(self.path)


class PlannedWrite(_PathChecked, frozen=True, kw_only=True):
    """One file a step plans to change: the state it was planned against and its result.

    >>> from ledger import PlannedWrite
    >>> PlannedWrite(path="app.py", base_rev=0).path
    'app.py'
    """

    base_rev: NonNegative
    pre_hash: Digest | None = None  # None: the file did not exist
    post_hash: Digest | None = None  # None: the write deletes the file
    # The permission bits a created file gets (None: the umask's; a move records its
    # source's), set on the staged file before any name shows it.
    mode: Mode | None = None


class AppliedWrite(_PathChecked, frozen=True, kw_only=True):
    """One file a step applied: its new per-path revision and hashes.

    >>> from ledger import AppliedWrite
    >>> AppliedWrite(path="app.py", rev=1).rev
    1
    """

    rev: NonNegative
    pre_hash: Digest | None = None
    post_hash: Digest | None = None
    # Permission bits before and after (None: the file was absent, or an event written
    # before modes were recorded). Compensation puts `pre_mode` back.
    pre_mode: Mode | None = None
    post_mode: Mode | None = None


class ManifestEntry(_PathChecked, frozen=True, kw_only=True):
    """A path the manifest names and the blob holding its bytes.

    >>> from ledger import ManifestEntry, digest_of
    >>> entry = ManifestEntry(path="out.txt", digest=digest_of(b"ok\\n"), size=3)
    >>> entry.path, entry.size
    ('out.txt', 3)
    """

    digest: Digest
    size: NonNegative


class Restored(_PathChecked, frozen=True, kw_only=True):
    """What a compensation did to one path.

    >>> from ledger import Restored
    >>> Restored(path="app.py", rev=2).path
    'app.py'
    """

    rev: NonNegative
    digest: Digest | None = None  # the pre-image put back; None: the file was removed
    outcome: Literal["restored", "already", "conflict"] = "restored"
    mode: Mode | None = None  # the permission bits the file has now (None: absent, unknown)
    # A file steptrail could not put back and did not remove — what the step displaced,
    # or a person's save met while taking it back — now under this visible path
    # (``NAME.steptrail-kept-TAG`` beside the path, or where its directory was moved);
    # None: nothing kept. Absent in ledgers written before it existed.
    kept: RelPath | None = None


class Event(Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base class for every fact a ledger can record.

    >>> from ledger import Event, Planned, LeaseReleased
    >>> issubclass(Planned, Event), issubclass(LeaseReleased, Event)
    (True, True)
    """

    #: Fields after the kind that make the journal key of this event distinct.
    key_extra: ClassVar[tuple[str, ...]] = ()


class StepEvent(Event, frozen=True, kw_only=True):
    """A transition of one attempt of one step.

    >>> from ledger import StepEvent, Planned, Acked
    >>> [issubclass(kind, StepEvent) for kind in (Planned, Acked)]
    [True, True]
    """

    step: StepId
    attempt: Attempt
    run: Name = ""
    workspace: Name = ""
    epoch: NonNegative = 0  # 0: the step takes no lease (artifact-only)


class Planned(StepEvent, frozen=True, kw_only=True, tag="planned"):
    """The attempt's contract, durable before any write: the intent record.

    >>> from ledger import Ledger, Planned
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.append(Planned(step="fetch", attempt=1, artifacts=("out.txt",)))
    ...     print(ledger.step("fetch").state)
    planned
    """

    writes: Annotated[tuple[PlannedWrite, ...], Meta(max_length=ITEMS_MAX)] = ()
    artifacts: Annotated[tuple[RelPath, ...], Meta(max_length=ITEMS_MAX)] = ()
    rev: NonNegative = 0  # the workspace rev at dispatch (drift = rev - bases)
    fence: Literal["step", "plan", "none"] = "step"
    journal: bool = True
    plan_rev: NonNegative | None = None  # the workspace rev the run's plan was admitted at
    irreversible: bool = False  # touches the world outside the workspace: a human decides

    def __post_init__(self) -> None:
        for artifact in self.artifacts:
            check_relpath(artifact, "artifact path")


class Fenced(StepEvent, frozen=True, kw_only=True, tag="fenced"):
    """The writes passed the fence and were applied; revisions advanced.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> read = ledger.workspaces.read_file("repo", "app.py")
    >>> from ledger import StepPlan
    >>> steps = [StepPlan("edit-1", [read.write(b"v1\\n")])]
    >>> _ = ledger.workspaces.admit("repo", lease.epoch, steps)
    >>> _ = ledger.workspaces.apply("edit-1", epoch=lease.epoch)
    >>> [e.kind for e in ledger.read(kind="fenced")]
    ['fenced']
    >>> ledger.close()
    """

    writes: Annotated[tuple[AppliedWrite, ...], Meta(max_length=ITEMS_MAX)] = ()
    rev: NonNegative = 0  # the workspace rev after the apply
    settled: bool = False  # some write was found already on disk (a crash replayed)
    journal: bool = True  # False only in the journal-off comparison mode (no dedupe)


class BlobPinned(StepEvent, frozen=True, kw_only=True, tag="blob-pinned"):
    """The attempt may write, deduplicate or publish this blob: GC must keep it.

    >>> from ledger import Ledger, BlobPinned
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("build", artifacts=["out.txt"])
    ...     _ = ledger.store("build", 1, "out.txt", b"ok\\n")
    ...     print([e.kind for e in ledger.read(kind="blob-pinned")])
    ['blob-pinned']
    """

    key_extra: ClassVar[tuple[str, ...]] = ("digest",)
    digest: Digest
    role: Literal["artifact", "pre-image", "post-image"] = "artifact"


class BlobStored(StepEvent, frozen=True, kw_only=True, tag="blob-stored"):
    """An artifact's bytes are durable (inline rows in this very transaction).

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("build", artifacts=["out.txt"])
    ...     stored = ledger.store("build", 1, "out.txt", b"ok\\n")
    >>> stored.path, stored.size, stored.inline
    ('out.txt', 3, True)
    """

    key_extra: ClassVar[tuple[str, ...]] = ("digest",)
    digest: Digest
    size: NonNegative
    path: RelPath | None = None
    inline: bool = False

    def __post_init__(self) -> None:
        if self.path is not None:
            check_relpath(self.path, "artifact path")


class ManifestPublished(StepEvent, frozen=True, kw_only=True, tag="manifest-published"):
    """The commit point: the step's manifest revision `manifest_rev` is live.

    >>> from ledger import Ledger, ManifestPublished
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch")
    ...     manifest = ledger.publish("fetch")
    ...     [event] = ledger.read(kind="manifest-published")
    >>> isinstance(event.event, ManifestPublished), event.event.manifest_rev
    (True, 0)
    """

    key_extra: ClassVar[tuple[str, ...]] = ("manifest_rev",)
    manifest_rev: NonNegative
    expected_rev: Annotated[int, Meta(ge=-1)] = -1
    digest: Digest  # sha256 of the manifest's canonical encoding
    supersedes: Digest | None = None  # the manifest digest this one replaced
    writes: Annotated[tuple[ManifestEntry, ...], Meta(max_length=ITEMS_MAX)] = ()
    artifacts: Annotated[tuple[ManifestEntry, ...], Meta(max_length=ITEMS_MAX)] = ()


class Acked(StepEvent, frozen=True, kw_only=True, tag="acked"):
    """The client learned the result: manifest revision `manifest_rev` of the step.

    >>> from ledger import Ledger, Acked
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch"); _ = ledger.publish("fetch")
    ...     recorded = ledger.ack("fetch")
    >>> isinstance(recorded.event, Acked), recorded.kind
    (True, 'acked')
    """

    key_extra: ClassVar[tuple[str, ...]] = ("manifest_rev",)
    manifest_rev: NonNegative = 0


class Compensated(StepEvent, frozen=True, kw_only=True, tag="compensated"):
    """The attempt ended; its writes were undone where that was safe.

    `release`: the step's manifest revisions published so far stop holding their blobs
    (an artifact-only step deleted on purpose: a pruned LangGraph checkpoint); GC may
    reclaim whatever no other manifest, compensation record or pin holds. False (every
    compensation before it existed): a manifest revision holds its blobs forever.

    >>> from ledger import Compensated
    >>> Compensated(step="edit-1", attempt=1).restored
    ()
    """

    reason: Text = ""
    restored: Annotated[tuple[Restored, ...], Meta(max_length=ITEMS_MAX)] = ()
    rev: NonNegative = 0
    release: bool = False


class Compensating(StepEvent, frozen=True, kw_only=True, tag="compensating"):
    """An undo's intent: committed before compensation touches the first file, under
    the live epoch that undoes. The step stays ``compensating`` (in flight) until its
    `compensated` ends it, so an undo killed halfway is found and finished by the next
    settle, or by a retry of the compensation.

    >>> from ledger import Compensating
    >>> Compensating(step="edit-1", attempt=1).step
    'edit-1'
    """

    reason: Text = ""


class NotCaptured(_PathChecked, frozen=True, kw_only=True):
    """A file an observation saw and did not record, and why (``ignored``: .gitignore'd;
    ``too-large``: over the size cap; ``not-a-file``: a symlink, a FIFO, a socket, a
    device; ``unreadable``: permission denied or gone while read; ``changing``: it
    changed under every try to store it — a log being written, say).

    >>> from ledger import NotCaptured
    >>> NotCaptured(path="build/out.o", why="ignored").why
    'ignored'
    """

    why: Literal["ignored", "too-large", "not-a-file", "unreadable", "changing"]


class Observed(StepEvent, frozen=True, kw_only=True, tag="observed"):
    """The attempt records changes made outside the steps, found on disk by `observe`:
    it follows the attempt's `planned` (whose writes are the changes: pre-image the
    content the ledger knew, post-image the content found) and precedes its `fenced`,
    manifest and ack, which record those changes as a step's writes are recorded — no
    byte on disk moves. `by` names who asked (``cli:USER@HOST``, ``mcp:CLIENT``,
    ``library``, ``lease``: the observation an acquire makes), so an agent's own shell
    edits are attributed to the agent that asked, not to a person; `label` is theirs.
    `baseline`: the workspace's first observation (every file it holds, as created).
    `not_captured`: up to 100 files left out, of `not_captured_total`.

    >>> from ledger import Observed
    >>> Observed(step="observed-w-1", attempt=1, by="library").baseline
    False
    """

    by: Name
    label: Text = ""
    baseline: bool = False
    not_captured: Annotated[tuple[NotCaptured, ...], Meta(max_length=100)] = ()
    not_captured_total: NonNegative = 0


class Rejected(StepEvent, frozen=True, kw_only=True, tag="rejected"):
    """The fence refused the attempt; nothing of it stays applied.

    `undone` lists the writes of the attempt whose renames had landed before a crash
    (the path still at its base rev, holding the post-image) and that the rejecting
    replay put back to their pre-image (``restored``), or did not (``conflict``: no
    evidence the attempt got to its renames, or no readable pre-image; left as found,
    for a human). Absent in ledgers written before it existed.

    >>> from ledger import Rejected
    >>> event = Rejected(step="edit-1", attempt=1, reason="pre_hash")
    >>> event.reason
    'pre_hash'
    """

    reason: Literal["stale_rev", "pre_hash", "stale_epoch", "overlap"]
    detail: Text = ""
    undone: tuple[Restored, ...] = ()


class WorkspaceAdded(Event, frozen=True, kw_only=True, tag="workspace-added"):
    """A workspace registered: its resolved root and that directory's identity.

    `dev`/`ino` (None in ledgers written before they were recorded: no identity check
    until the workspace is re-registered with `rebind`) are the root's device and inode;
    every walk into the workspace opens the root without following symlinks and refuses
    another directory. `allow_git`: steps may write ``.git`` internals (an opt-in).

    `ledger_dir`/`ledger_dev`/`ledger_ino`: where the ledger itself was — its
    directory's real path, device and inode (the directory: a copy carries the files
    inside it). None in a ledger in a database (it has no directory) and in ledgers
    written before they were recorded (not judged by its place until the workspace is
    re-registered with `rebind`). A ledger that travels with the workspace and no longer
    sits there refuses its steps (`LedgerMoved`: a copied or moved project).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> [e.event.workspace for e in ledger.read(kind="workspace-added")]
    ['repo']
    >>> ledger.close()
    """

    workspace: StepId
    root: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)]
    dev: FileId | None = None
    ino: FileId | None = None
    allow_git: bool = False
    ledger_dir: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)] | None = None
    ledger_dev: FileId | None = None
    ledger_ino: FileId | None = None


class WorkspaceRestored(Event, frozen=True, kw_only=True, tag="workspace-restored"):
    """A workspace's committed content materialized at a fresh `root`: steps write there
    from then on. `dev`/`ino`/`allow_git` and the ledger's place (`ledger_dir`, …) as in
    `WorkspaceAdded` (None: written before they were recorded).

    >>> from ledger import WorkspaceRestored
    >>> WorkspaceRestored(workspace="repo", root="/srv/repo-restored").workspace
    'repo'
    """

    key_extra: ClassVar[tuple[str, ...]] = ("rev", "root")
    workspace: StepId
    root: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)]
    rev: NonNegative = 0
    paths: NonNegative = 0
    dev: FileId | None = None
    ino: FileId | None = None
    allow_git: bool = False
    ledger_dir: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)] | None = None
    ledger_dev: FileId | None = None
    ledger_ino: FileId | None = None


class WorkspaceRebound(Event, frozen=True, kw_only=True, tag="workspace-rebound"):
    """An operator re-registered a workspace: its root (moved, restored by other means,
    or the same path with a new directory), that directory's identity and its options.
    `after` is the seq of the registration it replaces (`workspace-added`,
    `-restored` or `-rebound`), so two operators re-registering from the same state
    conflict instead of both winning, and a redelivery is answered by the journal. The
    ledger's place (`ledger_dir`, …) as in `WorkspaceAdded`, recorded anew: rebinding is
    how a copied or moved project's ledger is told where it lives now.

    >>> from ledger import WorkspaceRebound
    >>> WorkspaceRebound(workspace="repo", root="/srv/repo", dev=1, ino=2).root
    '/srv/repo'
    """

    key_extra: ClassVar[tuple[str, ...]] = ("after",)
    workspace: StepId
    root: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)]
    dev: FileId
    ino: FileId
    allow_git: bool = False
    after: NonNegative = 0
    ledger_dir: Annotated[str, Meta(min_length=1, max_length=PATH_MAX)] | None = None
    ledger_dev: FileId | None = None
    ledger_ino: FileId | None = None


class LeaseAcquired(Event, frozen=True, kw_only=True, tag="lease-acquired"):
    """A new epoch on `workspace`'s lease.

    `bare`: the first lease on a name no workspace registered, which it makes: a lease
    with no directory behind it (a LangGraph thread's claim, ledger.langgraph). Its
    later epochs are ordinary `lease-acquired` events; no step writes under it (there
    is nothing to write), and it is no workspace's: `workspaces()` does not list it.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> [e.event.holder for e in ledger.read(kind="lease-acquired")]
    ['agent-1']
    >>> ledger.close()
    """

    key_extra: ClassVar[tuple[str, ...]] = ("epoch",)
    workspace: StepId
    epoch: Attempt
    holder: Name
    expires_ns: int
    forced: bool = False
    bare: bool = False


class LeaseRenewed(Event, frozen=True, kw_only=True, tag="lease-renewed"):
    """A lease's holder extended it: `epoch` on `workspace` now expires at `expires_ns`.

    >>> from ledger import LeaseRenewed
    >>> LeaseRenewed(workspace="repo", epoch=1, expires_ns=0).workspace
    'repo'
    """

    key_extra: ClassVar[tuple[str, ...]] = ("epoch", "expires_ns")
    workspace: StepId
    epoch: Attempt
    expires_ns: int


class LeaseReleased(Event, frozen=True, kw_only=True, tag="lease-released"):
    """A lease ended: `epoch` on `workspace` was given up by its holder.

    >>> from ledger import LeaseReleased
    >>> LeaseReleased(workspace="repo", epoch=1).epoch
    1
    """

    key_extra: ClassVar[tuple[str, ...]] = ("epoch",)
    workspace: StepId
    epoch: Attempt


class BlobCollected(Event, frozen=True, kw_only=True, tag="blob-collected"):
    """GC deleted a blob nothing holds any more (`reason`), in collection `collection`.

    >>> from ledger import BlobCollected, digest_of
    >>> event = BlobCollected(digest=digest_of(b"old"), size=3)
    >>> event.size
    3
    """

    key_extra: ClassVar[tuple[str, ...]] = ("digest", "collection")
    digest: Digest
    size: NonNegative
    reason: Text = "orphan"
    inline: bool = False
    collection: Name = ""  # the GC run that collected it


class Held(Event, frozen=True, kw_only=True, tag="held"):
    """A run (or one step) held: kept out of `seal`, and its blobs out of `gc` even where
    a releasing compensation (a pruned checkpoint) would let them go, until released.
    `n`: the how-manieth hold of this target (a hold after a release is a new one).

    >>> from ledger import Held
    >>> Held(scope="run", target="nightly", reason="audit").scope
    'run'
    """

    key_extra: ClassVar[tuple[str, ...]] = ("scope", "target", "n")
    scope: Literal["run", "step"]
    target: StepId
    n: NonNegative = 0
    reason: Text = ""
    by: Name = ""


class HoldReleased(Event, frozen=True, kw_only=True, tag="hold-released"):
    """A hold (`Held` number `n` of this target) released: seal and gc treat the run or
    step as they would have.

    >>> from ledger import HoldReleased
    >>> HoldReleased(scope="step", target="edit-4").target
    'edit-4'
    """

    key_extra: ClassVar[tuple[str, ...]] = ("scope", "target", "n")
    scope: Literal["run", "step"]
    target: StepId
    n: NonNegative = 0
    by: Name = ""


class ReleasedVersion(_PathChecked, frozen=True, kw_only=True):
    """One version of a workspace file that a retention policy let go of: the record of
    `step` that names its path with `digest` (its manifest's write, or its compensation's
    restored pre-image) no longer holds the blob.

    >>> from ledger import ReleasedVersion, digest_of
    >>> ReleasedVersion(step="edit-1", path="app.py", digest=digest_of(b"v1")).step
    'edit-1'
    """

    step: StepId
    digest: Digest


class HistoryReleased(Event, frozen=True, kw_only=True, tag="history-released"):
    """A retention policy applied to workspace `workspace`'s history (docs/time-travel.md
    "Retention"): the `versions` listed stop holding their blobs, which `gc` may then
    collect where nothing else holds them (a kept version, an artifact, a pin, a hold).
    The events that recorded those versions stay, their chain intact; restore, rewind
    and fork name what they can no longer reach. `keep_s`/`keep_versions` are the policy
    applied (its age rule in seconds, its count rule; 0: that rule not set), `cutoff_ns`
    the age limit it worked out, `n` the how-manieth release of this workspace (a long
    list is split over several).

    >>> from ledger import HistoryReleased
    >>> HistoryReleased(workspace="repo", keep_versions=10).versions
    ()
    """

    key_extra: ClassVar[tuple[str, ...]] = ("workspace", "n")
    workspace: StepId
    n: NonNegative = 0
    keep_s: NonNegative = 0
    keep_versions: NonNegative = 0
    cutoff_ns: NonNegative = 0
    versions: Annotated[tuple[ReleasedVersion, ...], Meta(max_length=ITEMS_MAX)] = ()
    by: Name = ""


AbsPath = Annotated[str, Meta(min_length=1, max_length=PATH_MAX, pattern=r"^/")]
#: What the witness a `witness-anchored` event replaces said when it was replaced.
WitnessState = Literal["none", "ok", "missing", "blank", "damaged", "mismatch"]


class WitnessAnchored(Event, frozen=True, kw_only=True, tag="witness-anchored"):
    """From this event on, the ledger's witness is the file at `witness` (absolute).

    Recorded when a ledger is first witnessed and by every re-anchoring: openers that
    are not given a witness use the newest one recorded, so none can forget it.
    `head_seq`/`head_hash` name the head the new witness was started from (the event
    before this one); `previous` is the location it replaces ("" the first time) and
    `previous_state` what that witness said: ``none`` (not witnessed before), ``ok``
    (a healthy witness, moved), ``missing``, ``blank`` (empty or zero-filled),
    ``damaged`` (no valid slot, unreadable, or another ledger's) or ``mismatch`` (the
    ledger behind it or off its chain). A ``mismatch`` or findings of verify are
    anchored over only with `forced`, and the findings overridden are listed.

    >>> from ledger import WitnessAnchored
    >>> WitnessAnchored(witness="/backup/ledger.witness", head_seq=7, head_hash="ab" * 32).head_seq
    7
    """

    key_extra: ClassVar[tuple[str, ...]] = ("witness", "head_seq")
    witness: AbsPath
    head_seq: NonNegative
    head_hash: Digest
    previous: Annotated[str, Meta(max_length=PATH_MAX)] = ""
    previous_state: WitnessState = "none"
    forced: bool = False
    overridden: Annotated[tuple[Text, ...], Meta(max_length=ITEMS_MAX)] = ()


SettledState = Literal["acked", "compensated", "rejected"]


class SealGap(Struct, frozen=True, array_like=True):
    """One contiguous range of rows a seal removed: seqs `first_seq`..`last_seq`, the
    hash of the row before it (`prev_hash`: what the first removed row chained to), the
    hash of its last row (`last_hash`: what the next row left chains to) and `digest`,
    the sha256 over the removed rows' hashes in seq order (`gap_digest`)."""

    first_seq: Annotated[int, Meta(ge=1, le=INT64_MAX)]
    last_seq: Annotated[int, Meta(ge=1, le=INT64_MAX)]
    prev_hash: Digest
    last_hash: Digest
    digest: Digest


class SealedStep(Struct, frozen=True, array_like=True):
    """A sealed step's tombstone: its id, its latest attempt, how that attempt ended and
    its latest manifest revision (-1: none)."""

    step: StepId
    attempt: Attempt
    state: SettledState
    manifest_rev: Annotated[int, Meta(ge=-1, le=INT64_MAX)]


class SealedBlob(Struct, frozen=True, array_like=True):
    """A blob the sealed run named, copied into its archive."""

    digest: Digest
    size: NonNegative


class Sealed(Event, frozen=True, kw_only=True, tag="run-sealed"):
    """Run `sealed_run`'s events left the ledger for the archive `archive` (a file name in
    the ledger's archive directory, whose rows hash to `archive_digest`).

    `gaps` let `verify` of the ledger alone check the chain across every hole the
    removal left; `steps` are the tombstones the steps projection keeps (a later event
    for one of them is refused, `StepSealed`); `blobs` were copied into the archive, and
    no longer held by the ledger for this run (GC may collect those nothing else holds).
    The run is `sealed_run`, not `run`: a seal belongs to no run's events."""

    key_extra: ClassVar[tuple[str, ...]] = ("sealed_run", "archive_digest")
    sealed_run: StepId
    archive: Name
    archive_digest: Digest
    events: NonNegative
    size_bytes: NonNegative = 0
    gaps: Annotated[tuple[SealGap, ...], Meta(max_length=ITEMS_MAX * 10)] = ()
    steps: Annotated[tuple[SealedStep, ...], Meta(max_length=ITEMS_MAX * 10)] = ()
    blobs: Annotated[tuple[SealedBlob, ...], Meta(max_length=ITEMS_MAX * 10)] = ()


AnyEvent = Union[
    Planned,
    Observed,
    Fenced,
    BlobPinned,
    BlobStored,
    ManifestPublished,
    Acked,
    Compensating,
    Compensated,
    Rejected,
    WorkspaceAdded,
    WorkspaceRestored,
    WorkspaceRebound,
    LeaseAcquired,
    LeaseRenewed,
    LeaseReleased,
    BlobCollected,
    WitnessAnchored,
    Sealed,
    Held,
    HoldReleased,
    HistoryReleased,
]



class KindSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger does with one event kind: the one place a kind is declared
    (`KIND_SPECS`). Every kind list is derived from it, and tests/log/test_kinds.py fails
    when a kind has no declaration, no decoder, no fold its declaration names, or no
    documentation.

    `folds`: the projections that fold it (``steps``, ``workspaces``, ``refs``; none: it
    is recorded only). `guarded`: the blobs it names must be durable (checked at append,
    in its transaction). `names_blobs`: GC keeps the blobs it names, forever (a manifest;
    a compensation record's restored pre-images)."""

    type: type[Event]
    folds: frozenset[str] = frozenset()
    guarded: bool = False
    names_blobs: bool = False


def _spec(t: type[Event], *folds: str, guarded: bool = False, names_blobs: bool = False
          ) -> tuple[str, KindSpec]:
    return t.__struct_config__.tag, KindSpec(  # type: ignore[return-value]
        type=t, folds=frozenset(folds), guarded=guarded, names_blobs=names_blobs)


#: Every event kind, declared once (docs/design.md "Events and the attempt lifecycle").
KIND_SPECS: Final[dict[str, KindSpec]] = dict([
    _spec(Planned, "steps"),
    _spec(Observed, "steps"),
    _spec(Fenced, "steps", "workspaces"),
    _spec(BlobPinned, "steps", "refs"),
    _spec(BlobStored, "steps", guarded=True),
    _spec(ManifestPublished, "steps", "refs", guarded=True, names_blobs=True),
    _spec(Acked, "steps", "refs"),
    _spec(Compensating, "steps"),
    _spec(Compensated, "steps", "refs", "workspaces", names_blobs=True),
    _spec(Rejected, "steps", "refs"),
    _spec(WorkspaceAdded, "workspaces"),
    _spec(WorkspaceRestored, "workspaces"),
    _spec(WorkspaceRebound, "workspaces"),
    _spec(LeaseAcquired, "workspaces"),
    _spec(LeaseRenewed, "workspaces"),
    _spec(LeaseReleased, "workspaces"),
    _spec(BlobCollected),
    _spec(WitnessAnchored),
    _spec(Sealed, "steps", "refs"),
    _spec(Held),
    _spec(HoldReleased),
    _spec(HistoryReleased),
])
#: The projections a kind may name in `KindSpec.folds`.
PROJECTIONS: Final = ("steps", "workspaces", "refs")

EVENT_TYPES: Final[dict[str, type[Event]]] = {k: s.type for k, s in KIND_SPECS.items()}
KINDS: Final = tuple(EVENT_TYPES)
STEP_KINDS: Final = tuple(k for k, t in EVENT_TYPES.items() if issubclass(t, StepEvent))
#: The seal's kind: folded by the steps projection (its tombstones) though it is no step's.
SEAL_KIND: Final = "run-sealed"
#: Kinds whose blobs the append guard checks durable.
GUARDED_KINDS: Final = frozenset(k for k, s in KIND_SPECS.items() if s.guarded)
#: Kinds whose named blobs GC keeps.
BLOB_NAMING_KINDS: Final = frozenset(k for k, s in KIND_SPECS.items() if s.names_blobs)


def kinds_folded_by(projection: str) -> frozenset[str]:
    """The kinds projection `projection` folds (as `KIND_SPECS` declares them)."""
    if projection not in PROJECTIONS:
        raise ValueError(f"no projection {projection!r}; there are {', '.join(PROJECTIONS)}")
    return frozenset(k for k, s in KIND_SPECS.items() if projection in s.folds)

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(AnyEvent)
_key_encoder = msgspec.json.Encoder()
_chain_encoder = msgspec.msgpack.Encoder()


def kind_of(event: Event) -> str:
    """The event's tag, e.g. ``"planned"``."""
    return type(event).__struct_config__.tag  # type: ignore[return-value]


def encode(event: Event) -> bytes:
    """Deterministic JSON bytes of an event (its payload column)."""
    return _encoder.encode(event)


def decode(payload: bytes, v: int = EVENT_VERSION) -> AnyEvent:
    """Decode a payload column. Rows of a newer event version are refused."""
    if v > READ_VERSION:
        raise InvalidInput(
            f"event encoding version {v} is newer than this steptrail ({READ_VERSION});"
            " upgrade steptrail"
        )
    return _decoder.decode(payload)


def validate(event: Event) -> bytes:
    """Check an event against every field constraint; return its payload bytes.

    msgspec enforces `Meta` constraints on decode only, so the event is encoded and
    decoded once. Raises InvalidInput naming the field.
    """
    if not isinstance(event, Event) or type(event) not in EVENT_TYPES.values():
        raise InvalidInput(f"{event!r} is not a steptrail event; use one of {', '.join(KINDS)}")
    try:
        payload = _encoder.encode(event)
    except (UnicodeEncodeError, OverflowError, TypeError, ValueError) as exc:
        raise InvalidInput(f"{kind_of(event)} event cannot be encoded ({exc}); use valid"
                           " UTF-8 text and 64-bit integers") from None
    if len(payload) > PAYLOAD_MAX:
        raise InvalidInput(f"{kind_of(event)} event of {len(payload)} bytes is too large; the"
                           f" limit is {PAYLOAD_MAX} bytes: split it into smaller steps")
    try:
        decoded = _decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"{kind_of(event)} event: {exc}") from None
    mine, theirs = envelope(event), envelope(decoded)
    for name in Envelope.__struct_fields__:
        a, b = getattr(mine, name), getattr(theirs, name)
        if type(a) is not type(b) or a != b:
            raise InvalidInput(f"{kind_of(event)} event: field {name!r} is {a!r}, not a"
                               f" {type(b).__name__}")
    return payload


_EVENT_CLASSES: Final = frozenset(EVENT_TYPES.values())


class Built(NamedTuple):
    """An event the library built from fields it already checked (the trusted
    construction path, `encode_built`): every field is copied from an event that
    `validate` accepted in the same append, or computed by the library in a form its
    constraints admit (a digest it hashed, a length, a counter it read and advanced)."""

    event: Event


def encode_built(event: Event) -> bytes:
    """A `Built` event's payload: encoded and size-checked like `validate`'s, not
    decoded again to re-check constraints its fields were checked under already."""
    if type(event) not in _EVENT_CLASSES:
        raise InvalidInput(f"{event!r} is not a steptrail event; use one of {', '.join(KINDS)}")
    payload = _encoder.encode(event)
    if len(payload) > PAYLOAD_MAX:
        raise InvalidInput(f"{kind_of(event)} event of {len(payload)} bytes is too large; the"
                           f" limit is {PAYLOAD_MAX} bytes: split it into smaller steps")
    return payload


def journal_key(event: Event, v: int = EVENT_VERSION) -> str:
    """The idempotency key docs/design.md derives for an event (of encoding version `v`).

    A step transition is keyed ``(step, attempt, kind[, digest])`` — a `blob-stored` by
    ``(step, attempt, kind, path, digest)`` from version 2 on; workspace, lease and GC
    events by their subject. The key is a JSON array, so no separator can collide.

    >>> from ledger import Planned, journal_key
    >>> journal_key(Planned(step="fetch", attempt=1))
    '["fetch",1,"planned"]'
    """

    parts: list[Any]
    if isinstance(event, Fenced):
        # Applying is keyed (workspace, step, attempt): the (step_id, base_rev) key of the usual fencing recipe
        # made exact. With the journal off (a comparison mode) every apply is new.
        parts = ["apply", event.workspace, event.step, event.attempt]
        if not event.journal:
            parts.append(event.rev)
        return _key_encoder.encode(parts).decode()
    if isinstance(event, StepEvent):
        parts = [event.step, event.attempt, kind_of(event)]
    else:
        parts = [kind_of(event), getattr(event, "workspace", "")]
    extra = type(event).key_extra
    if isinstance(event, BlobStored) and v >= 2:
        extra = ("path", "digest")
    parts.extend(getattr(event, name) for name in extra)
    if isinstance(event, WorkspaceRestored) and event.ino is not None:
        # A restore into a directory recreated at the same path (a killed restore's output
        # deleted by hand, then retried) is a new restore onto a new directory, not a
        # redelivery of the first: its identity is part of the key. Restores recorded
        # before identities (None) keep their key.
        parts.extend((event.dev, event.ino))
    return _key_encoder.encode(parts).decode()


class Envelope(Struct, frozen=True, array_like=True):
    """The indexed columns of an event row, derived from the event."""

    workspace: str
    run: str
    step: str
    attempt: int
    epoch: int
    rev: int


def envelope(event: Event) -> Envelope:
    return Envelope(
        getattr(event, "workspace", ""),
        getattr(event, "run", ""),
        getattr(event, "step", ""),
        getattr(event, "attempt", 0),
        getattr(event, "epoch", 0),
        getattr(event, "rev", 0),
    )


#: A backup directory's completion marker, and the name of the database file a backup
#: holds (`ledger.backup`): format names, declared here with the others so that a store
#: can refuse to open a backup's database to write without importing the backup code.
BACKUP_MARKER: Final = "BACKUP.json"
BACKUP_DB_NAME: Final = re.compile(r"ledger-[0-9]+-[0-9a-f]{12}\.db", re.ASCII)
GENESIS_DOMAIN: Final = b"stepledger/chain/v1\x00"


def genesis_hash(ledger_id: str) -> bytes:
    """The `prev_hash` of seq 1: binds the chain to this ledger (no cross-ledger splice)."""
    return hashlib.sha256(GENESIS_DOMAIN + ledger_id.encode()).digest()


def chain_hash(
    prev_hash: bytes,
    seq: int,
    time_ns: int,
    env: Envelope,
    journal_key: str,
    kind: str,
    v: int,
    payload: bytes,
) -> bytes:
    """sha256 over the previous hash and every column of the row.

    Covers content, position (seq and the previous hash), workspace, run, step,
    attempt, epoch, rev, time, key, kind and version, so any edit, deletion,
    reordering or insertion breaks the chain at the first row it touches.
    """

    body = _chain_encoder.encode(
        (seq, time_ns, env.workspace, env.run, env.step, env.attempt, env.epoch, env.rev,
         journal_key, kind, v, payload)
    )
    return hashlib.sha256(prev_hash + body).digest()


class RecordedEvent(Struct, frozen=True, kw_only=True):
    """An event as the log holds it: the envelope columns plus the decoded event.

    `deduped` is not stored: it is True when an append found the journal key already
    recorded and returned this original instead of writing.

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch"); _ = ledger.publish("fetch"); _ = ledger.ack("fetch")
    ...     print([(e.seq, e.kind) for e in ledger.timeline("fetch")])
    [(1, 'planned'), (2, 'manifest-published'), (3, 'acked')]
    """

    seq: int
    time_ns: int
    journal_key: str
    kind: str
    hash: bytes
    prev_hash: bytes
    event: AnyEvent
    v: int = EVENT_VERSION
    deduped: bool = False

    @property
    def step(self) -> str:
        return getattr(self.event, "step", "")

    @property
    def attempt(self) -> int:
        return getattr(self.event, "attempt", 0)


class Manifest(Struct, frozen=True, kw_only=True):
    """A step's commit record, as published: what a reader of a committed step gets."""

    step: str
    manifest_rev: int
    attempt: int
    digest: str
    supersedes: str | None = None
    writes: tuple[ManifestEntry, ...] = ()
    artifacts: tuple[ManifestEntry, ...] = ()
    seq: int = 0
    live: bool = True

    @classmethod
    def from_event(cls, event: ManifestPublished, seq: int, live: bool) -> Manifest:
        return cls(
            step=event.step, manifest_rev=event.manifest_rev, attempt=event.attempt,
            digest=event.digest, supersedes=event.supersedes, writes=event.writes,
            artifacts=event.artifacts, seq=seq, live=live,
        )

    @property
    def size(self) -> int:
        return sum(e.size for e in self.writes) + sum(e.size for e in self.artifacts)


def manifest_digest(
    step: str, writes: tuple[ManifestEntry, ...], artifacts: tuple[ManifestEntry, ...]
) -> str:
    """sha256 of a manifest's canonical content (the step and every entry, sorted)."""
    body = _chain_encoder.encode((
        "stepledger/manifest/v1", step,
        sorted((e.path, e.digest, e.size) for e in writes),
        sorted((e.path, e.digest, e.size) for e in artifacts),
    ))
    return hashlib.sha256(body).hexdigest()


def to_builtins(event: Event) -> dict[str, Any]:
    """The event as plain JSON-ready data (its `kind` included)."""
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


__all__ = [
    "BACKUP_DB_NAME",
    "BACKUP_MARKER",
    "BLOB_NAMING_KINDS",
    "EVENT_TYPES",
    "GUARDED_KINDS",
    "KIND_SPECS",
    "KindSpec",
    "PROJECTIONS",
    "EVENT_VERSION",
    "KIND_VERSIONS",
    "READ_VERSION",
    "row_version",
    "KINDS",
    "STEP_KINDS",
    "kinds_folded_by",
    "Acked",
    "AnyEvent",
    "AppliedWrite",
    "BlobCollected",
    "BlobPinned",
    "BlobStored",
    "Compensated",
    "Envelope",
    "Event",
    "Fenced",
    "LeaseAcquired",
    "LeaseReleased",
    "LeaseRenewed",
    "Manifest",
    "ManifestEntry",
    "ManifestPublished",
    "Planned",
    "PlannedWrite",
    "RecordedEvent",
    "Held",
    "HoldReleased",
    "HistoryReleased",
    "ReleasedVersion",
    "NotCaptured",
    "Observed",
    "Rejected",
    "Restored",
    "StepEvent",
    "SEAL_KIND",
    "SealGap",
    "Sealed",
    "SealedBlob",
    "SealedStep",
    "WitnessAnchored",
    "WorkspaceAdded",
    "WorkspaceRebound",
    "WorkspaceRestored",
    "chain_hash",
    "check_digest",
    "check_relpath",
    "check_step_id",
    "decode",
    "encode",
    "envelope",
    "genesis_hash",
    "journal_key",
    "kind_of",
    "manifest_digest",
    "to_builtins",
    "validate",
]

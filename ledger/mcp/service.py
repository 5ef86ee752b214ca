"""The file tools behind `steptrail mcp`, on the ledger's public API only.

`FileTools` implements every tool as a plain synchronous method returning a `Result`
(text for the agent, a structured document, an error flag); `ledger.mcp.server` wires
them to the MCP SDK. Nothing here imports the SDK.

Reads go through `ledger.workspaces.read_file`: the bytes with their rev and the sha256 of exactly
those bytes. Each client has a `ClientView`: what it last read or wrote of each path.
A write is one steptrail step, run whole under a lease taken for that call only:

1. acquire the workspace's lease (short TTL; while another holder's lease is live, wait
   with backoff for a bounded time; a holder that is a dead process on this machine is
   taken over at once) — acquiring settles whatever an older epoch left in flight, so a
   server SIGKILLed mid-write is put right by the next write of anyone;
2. admit a `StepPlan` whose writes are fenced on what the client read (its view), or on
   the `expectedHash` the call carries; an existing file the client never read is
   refused before anything is planned ("read it first");
3. apply under the epoch (the ledger fences each path's rev and bytes on disk); a stale
   write ends `rejected` and comes back as a structured conflict — the current hash and
   a diff from what the client read to what is there — never as an overwrite;
4. publish (the commit point), ack, release the lease.

A call that carries a `requestId` is the step ``mcp:<workspace>:<requestId>``: a retry
(after a lost answer, a timeout, a server that died) is answered from the ledger — a
committed step's result, a refusal's conflict, "undone" — and an attempt that died
unpublished is re-stamped from its recorded plan (`ledger.workspaces.replan`), fenced on the same
read. The same requestId for a different change is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ledger import (
    Compensated,
    FencedOutcome,
    CompensationWindowClosed,
    IllegalTransition,
    Ledger,
    LedgerError,
    Planned,
    PlannedWrite,
    RecordedEvent,
    Rejected,
    StaleEpoch,
    StepRow,
    StepStatus,
    Write,
    run_fenced_step,
)

from .edits import EditRefused, apply_edits, unified_diff
from ..workspace import Confined, Entry, FsRefused, glob_match, is_ledger_dir_name
from ..errors import said_at_a_shell
from ..fmt import iso
from ..kinds import detail
from .leases import LeaseBusy, Leases, holder_name

log = logging.getLogger("steptrail.mcp")

IN_FLIGHT: Final = frozenset({"planned", "fenced", "blob-stored", "compensating"})
COMMITTED: Final = frozenset({"manifest-published", "acked"})
#: No ':' in a requestId: its step id, mcp:<workspace>:<requestId>, is split at the
#: last ':', so no two (workspace, requestId) pairs name one step.
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._/@+=-]{1,128}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


#: Whether a recorded plan is the change a retried call carries: its new content by path
#: (None for a deletion) when it is, None when it is another change.
_Matcher = Callable[[tuple[PlannedWrite, ...]], "dict[str, bytes | None] | None"]


class ToolFailure(Exception):
    """A tool call that failed; the message is one line for the agent."""


@dataclass
class Result:
    """What a tool answers: text blocks for the agent, a structured document, and
    whether the call failed (a conflict is a failure: nothing was written)."""

    texts: list[str]
    data: dict[str, Any]
    is_error: bool = False


@dataclass
class Limits:
    """The bounds every tool works within (all configurable on the command line)."""

    read_bytes: int = 4 * 1024 * 1024  # one file's bytes read_text_file returns
    write_bytes: int = 16 * 1024 * 1024  # one call's new content, all files together
    # One request as sent (a stdio line, an HTTP body), on both transports: room for
    # write_bytes of content even with every byte \u-escaped (6 bytes), and the rest
    # of the call: it bounds the memory a request takes, and never refuses a write
    # within write_bytes.
    request_bytes: int = 100 * 1024 * 1024
    list_entries: int = 2000  # list_directory
    tree_entries: int = 2000  # directory_tree
    tree_depth: int = 12
    search_results: int = 500
    scan_entries: int = 200_000  # entries one tree or search may look at
    walk_seconds: float = 10.0
    move_files: int = 1000  # files one move_file of a directory may move
    history_steps: int = 200
    audit_events: int = 500


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def short(digest: str | None) -> str:
    return "absent" if digest is None else digest[:12]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- what a client has seen ---------------------------------------------------------------


@dataclass
class Seen:
    """What a client last read or wrote of one path: the rev and hash it saw, and the
    bytes while they are small enough to keep (for a conflict's diff)."""

    rev: int
    hash: str | None
    content: bytes | None = None


class ClientView:
    """Per client: the paths it read or wrote (bounded, least recently used dropped
    first; kept bytes bounded too) and the steps it committed, newest last."""

    def __init__(self, max_paths: int = 20_000, max_bytes: int = 64 * 1024 * 1024,
                 keep_file_bytes: int = 1024 * 1024) -> None:
        self._seen: OrderedDict[tuple[str, str], Seen] = OrderedDict()
        self._bytes = 0
        self.max_paths, self.max_bytes, self.keep_file_bytes = max_paths, max_bytes, keep_file_bytes
        self.steps: deque[str] = deque(maxlen=1000)

    def get(self, workspace: str, path: str) -> Seen | None:
        got = self._seen.get((workspace, path))
        if got is not None:
            self._seen.move_to_end((workspace, path))
        return got

    def put(self, workspace: str, path: str, seen: Seen) -> None:
        if seen.content is not None and len(seen.content) > self.keep_file_bytes:
            seen = Seen(seen.rev, seen.hash, None)
        old = self._seen.pop((workspace, path), None)
        if old is not None and old.content is not None:
            self._bytes -= len(old.content)
        self._seen[(workspace, path)] = seen
        if seen.content is not None:
            self._bytes += len(seen.content)
        while len(self._seen) > self.max_paths or self._bytes > self.max_bytes:
            _, dropped = self._seen.popitem(last=False)
            if dropped.content is not None:
                self._bytes -= len(dropped.content)

    def __len__(self) -> int:
        return len(self._seen)


# -- workspaces and path arguments ----------------------------------------------------------


@dataclass
class Workspace:
    name: str
    root: str  # as registered (resolved)
    prefixes: tuple[str, ...]  # absolute spellings an agent may use for the root
    allow_git: bool
    fs: Confined


# -- the stages of a write ------------------------------------------------------------------

#: The stages of a write an embedding caller's hook hears of (``FileTools(on_stage=f)``,
#: ``serve(on_stage=f)``: ``f(STAGE)``; tests/test_mcp_processes.py stops the server for
#: good there and SIGKILLs it): after-admit (the plan durable), after-exchange (inside the
#: apply's transaction: the files exchanged, not yet recorded), after-commit (the apply,
#: manifest and ack committed).
STAGES: Final = ("after-admit", "after-exchange", "after-commit")


def exchange_hook(on_stage: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """The ledger's `on_op` hook (``Ledger.open(path, on_op=...)``) that tells `on_stage`
    of the ``after-exchange`` stage: the directory fsync after a write's files are
    exchanged, before the ledger records them. None without `on_stage`."""
    if on_stage is None:
        return None

    def on_op(name: str) -> None:
        if name == "ws-dirfsync":
            on_stage("after-exchange")

    return on_op


# -- the tools ------------------------------------------------------------------------------


@dataclass
class _Change:
    """One call's change: the fenced writes, what the client had seen of each path, the
    new bytes, and how to tell whether a recorded plan is this same change."""

    tool: str
    ws: Workspace
    writes: list[Write]
    seen: dict[str, Seen | None]
    posts: dict[str, bytes | None]
    diffs: dict[str, str] = field(default_factory=dict)


class FileTools:
    """Every tool of `steptrail mcp` over one open ledger (see the module)."""

    def __init__(self, ledger: Ledger, workspaces: Sequence[str], *,
                 lease_ttl_s: float = 20.0, lease_wait_s: float = 30.0,
                 lease_linger_s: float = 0.2,
                 limits: Limits | None = None, holder: str | None = None,
                 given_roots: dict[str, str] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        if not workspaces:
            raise ToolFailure("serve at least one workspace")
        self.ledger = ledger
        #: around every ledger call (reads too: they never wait for a lease)
        self.lock = threading.RLock()
        #: one change at a time per server: held across a write's lease wait and its step
        self.write_lock = threading.RLock()
        self.limits = limits or Limits()
        self.notices: deque[str] = deque(maxlen=50)
        #: hears each of `STAGES` a write reaches (after-exchange: through the ledger's
        #: `on_op`, see `exchange_hook`)
        self.on_stage = on_stage
        self.leases = Leases(ledger, self.lock, self.notices, holder=holder or holder_name(),
                             write_lock=self.write_lock,
                             ttl_s=lease_ttl_s, wait_s=lease_wait_s, linger_s=lease_linger_s)
        self.holder = self.leases.holder
        self.lease_ttl_s = lease_ttl_s
        self.workspaces: list[Workspace] = []
        for name in workspaces:
            reg = ledger.workspaces.registration(name)
            prefixes = {reg.root}
            given = (given_roots or {}).get(name)
            if given:
                prefixes.add(os.path.normpath(os.path.abspath(given)))
            self.workspaces.append(Workspace(
                name, reg.root, tuple(sorted(prefixes, key=len, reverse=True)), reg.allow_git,
                ledger.workspaces.confined(name)))
        self.default = self.workspaces[0]
        self.leases.workspaces = [w.name for w in self.workspaces]

    # -- plumbing -----------------------------------------------------------------------

    def _reached(self, stage: str) -> None:
        """Tell the `on_stage` hook, if any, that a write reached `stage`."""
        if self.on_stage is not None:
            self.on_stage(stage)

    def resolve(self, arg: object, *, directory: bool = False, what: str = "path"
                ) -> tuple[Workspace, str]:
        """(workspace, path relative to its root) for a path argument: relative to the
        first workspace, or absolute inside any workspace's root. `..` is refused, never
        normalized away; '.' components and a trailing '/' are dropped."""
        if not isinstance(arg, str):
            raise ToolFailure(f"{what} must be a string, not {type(arg).__name__}")
        if "\x00" in arg:
            raise ToolFailure(f"{what} {arg!r} contains a NUL byte")
        if arg.startswith("~"):
            raise ToolFailure(f"{what} {arg!r}: '~' is not expanded; give a path relative to the"
                              f" workspace ({self.default.root}) or an absolute one inside it")
        parts = arg.split("/")
        if ".." in parts:
            raise ToolFailure(f"{what} {arg!r} contains '..': paths may not climb out of a"
                              " directory; give a plain path inside the workspace")
        ws = self.default
        if arg.startswith("/"):
            norm = "/" + "/".join(p for p in parts if p not in ("", "."))
            for candidate in self.workspaces:
                for prefix in candidate.prefixes:
                    if norm == prefix or norm.startswith(prefix.rstrip("/") + "/"):
                        ws, rel = candidate, norm[len(prefix):].strip("/")
                        break
                else:
                    continue
                break
            else:
                allowed = ", ".join(w.root for w in self.workspaces)
                raise ToolFailure(f"{what} {arg!r} is outside every workspace served (allowed:"
                                  f" {allowed}); see list_allowed_directories")
        else:
            rel = "/".join(p for p in parts if p not in ("", "."))
        if any(is_ledger_dir_name(p) for p in rel.split("/")):
            # a ledger's directory (this server's is refused by identity further down;
            # another's — a nested project's, or one an earlier set of roots made — here)
            raise ToolFailure(f"{what} {arg!r} is or lies inside a .steptrail directory: a"
                              " ledger's files are not served; its history changes only"
                              " through steptrail")
        if not rel and not directory:
            raise ToolFailure(f"{what} {arg!r} is the workspace root, a directory; give a file"
                              " path")
        return ws, rel

    def show(self, ws: Workspace, rel: str) -> str:
        """A path as results name it: relative for the first workspace, else absolute
        (either can be passed back)."""
        if ws is self.default:
            return rel or "."
        return os.path.join(ws.root, rel) if rel else ws.root

    def _fail(self, exc: BaseException) -> ToolFailure:
        if isinstance(exc, ToolFailure):
            return exc
        if isinstance(exc, LedgerError | FsRefused | EditRefused | LeaseBusy):
            return ToolFailure(one_line(said_at_a_shell(exc)))
        if isinstance(exc, OSError):
            return ToolFailure(one_line(f"{exc.strerror or exc}"
                                        + (f": {exc.filename}" if exc.filename else "")))
        log.exception("unexpected failure in a tool")
        return ToolFailure(one_line(f"internal error ({type(exc).__name__}: {exc}); the server"
                                    " is still running and nothing half-done was kept"))

    def call(self, fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
        """Run one tool; every failure is a one-line error result, never a traceback."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the boundary: one line, whatever went wrong
            failure = self._fail(exc)
            return Result([str(failure)], {"status": "error", "error": str(failure)}, True)

    def _read(self, ws: Workspace, rel: str) -> Any:
        st = ws.fs.lstat(rel)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > self.limits.read_bytes:
            raise ToolFailure(f"{self.show(ws, rel)} holds {st.st_size} bytes, more than the"
                              f" {self.limits.read_bytes} one read returns; it is not read or"
                              " written through this server (get_file_info gives its hash)")
        return self.ledger.workspaces.read_file(ws.name, rel, max_bytes=self.limits.read_bytes)

    def _content_of(self, seen: Seen | None) -> bytes | None:
        """The bytes a client saw: kept in its view, else the ledger's blob of that hash
        (every post-image and stored pre-image is one); None when unknown or absent."""
        if seen is None or seen.hash is None:
            return None
        if seen.content is not None:
            return seen.content
        with contextlib.suppress(LedgerError):
            return self.ledger.read_blob(seen.hash)
        return None

    @staticmethod
    def _text(data: bytes, shown: str) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailure(f"{shown} is not UTF-8 text (byte {exc.start} is not valid"
                              " UTF-8): a binary file is not read as text") from None

    def close(self) -> None:
        """Release every lease this server still holds."""
        self.leases.close()

    # -- reads --------------------------------------------------------------------------

    def _seen_after_read(self, view: ClientView, ws: Workspace, rel: str, got: Any) -> None:
        view.put(ws.name, rel, Seen(got.rev, got.pre_hash, got.content))

    def read_text_file(self, view: ClientView, path: str, head: int | None = None,
                       tail: int | None = None) -> Result:
        ws, rel = self.resolve(path)
        shown = self.show(ws, rel)
        if head is not None and tail is not None:
            raise ToolFailure("give head or tail, not both")
        with self.lock:
            got = self._read(ws, rel)
        if got.content is None:
            raise ToolFailure(f"{shown} does not exist")
        text = self._text(got.content, shown)
        self._seen_after_read(view, ws, rel, got)
        shown_text, part = text, "whole"
        if head is not None or tail is not None:
            lines = text.splitlines(keepends=True)
            n = head if head is not None else tail
            assert n is not None
            if n < 0:
                raise ToolFailure("head and tail count lines: give 0 or more")
            shown_text = "".join(lines[:n] if head is not None else (lines[-n:] if n else []))
            part = f"{'first' if head is not None else 'last'} {n} lines of {len(lines)}"
        data = {"path": shown, "rev": got.rev, "hash": got.pre_hash, "size": len(got.content),
                "lines": part, "content": shown_text}
        return Result([shown_text, f"[steptrail] {shown}: rev {got.rev}, sha256 {got.pre_hash},"
                       f" {len(got.content)} bytes ({part}). Your next write or edit of it is"
                       " fenced on this read."], data)

    def read_multiple_files(self, view: ClientView, paths: Sequence[str]) -> Result:
        if not paths:
            raise ToolFailure("give at least one path")
        if len(paths) > 100:
            raise ToolFailure(f"{len(paths)} paths: read at most 100 per call")
        files: list[dict[str, Any]] = []
        blocks: list[str] = []
        budget = self.limits.read_bytes
        for p in paths:
            try:
                ws, rel = self.resolve(p)
                shown = self.show(ws, rel)
                with self.lock:
                    got = self._read(ws, rel)
                if got.content is None:
                    raise ToolFailure(f"{shown} does not exist")
                if len(got.content) > budget:
                    raise ToolFailure(f"{shown}: the files of this call exceed"
                                      f" {self.limits.read_bytes} bytes; read it on its own")
                text = self._text(got.content, shown)
                budget -= len(got.content)
                self._seen_after_read(view, ws, rel, got)
                files.append({"path": shown, "rev": got.rev, "hash": got.pre_hash,
                              "size": len(got.content), "content": text})
                blocks.append(f"{shown} (rev {got.rev}, sha256 {got.pre_hash}):\n{text}")
            except Exception as exc:  # one file's failure is its own line, not the call's
                failure = self._fail(exc)
                files.append({"path": p, "error": str(failure)})
                blocks.append(f"{p}: Error - {failure}")
        return Result(["\n---\n".join(blocks)], {"files": files})

    # -- planning a change ---------------------------------------------------------------

    def _fence(self, view: ClientView, ws: Workspace, rel: str, expected: str | None,
               *, what: str) -> tuple[Write | None, Seen | None]:
        """(a Write template — content filled in later — fenced on the expected hash or
        the client's view, or None when the file is absent and unseen; what the client
        saw). Refuses an existing file the client never read ("read it first")."""
        shown = self.show(ws, rel)
        seen = view.get(ws.name, rel)
        if expected is not None:
            expected = expected.removeprefix("sha256:").lower()
            if expected in ("", "absent", "none", "null"):
                return Write(rel, None, pre_hash=None, base_rev=None), seen
            if not _HEX64.fullmatch(expected):
                raise ToolFailure(f"expectedHash {expected!r} for {shown} is not a sha256 (64 hex"
                                  " digits, as read_text_file returns it)")
            base = seen.rev if seen is not None and seen.hash == expected else None
            return Write(rel, None, pre_hash=expected, base_rev=base), (
                seen if seen is not None and seen.hash == expected else Seen(-1, expected))
        if seen is not None:
            return Write(rel, None, pre_hash=seen.hash, base_rev=seen.rev), seen
        with self.lock:
            rev, on_disk = self.ledger.workspaces.snapshot(ws.name, rel)
        if on_disk is not None:
            raise _Unread(ws, rel, rev, on_disk, what)
        return Write(rel, None, pre_hash=None, base_rev=None), None

    def _check_request_id(self, request_id: str | None) -> None:
        if request_id is not None and not _REQUEST_ID.fullmatch(request_id):
            raise ToolFailure(f"requestId {request_id!r} must be 1 to 128 characters of"
                              " letters, digits and ._/@+=- (a UUID is ideal)")

    def _step_id(self, ws: Workspace, request_id: str | None) -> str:
        return f"mcp:{ws.name}:{request_id or uuid.uuid4().hex}"

    # -- committing a change ----------------------------------------------------------------

    def _commit(self, view: ClientView, build: Callable[[], _Change], ws: Workspace,
                request_id: str | None, who: str, matches: _Matcher) -> Result:
        """Plan, apply, publish and ack one change as one step (see the module); a retry
        with the same requestId is answered from the ledger."""
        self._check_request_id(request_id)
        with self.write_lock:
            try:
                return self._commit_once(view, build, ws, request_id, who, matches)
            except StaleEpoch:
                if not self.leases.reused:
                    raise
            # the lease this server kept between calls was taken over (forced): nothing
            # of this call was committed; take a lease anew and run it once more
            return self._commit_once(view, build, ws, request_id, who, matches)

    @contextlib.contextmanager
    def _step_lease(self, ws: Workspace) -> Iterator[int]:
        """The workspace's lease for one change, then the ledger lock: the wait for the
        lease holds only `write_lock`, so reads go on meanwhile. A lease just taken (not
        kept from the last write) has settled whatever a killed server left in flight, a
        half-done undo included (the library's acquire does)."""
        with self.leases.hold(ws.name) as epoch, self.lock:
            yield epoch

    def _build(self, view: ClientView, ws: Workspace, build: Callable[[], _Change]
               ) -> _Change | Result:
        """The call's change, built under the ledger lock from what the client has seen —
        or the conflict it gets instead: an existing file it never read ("read it first"),
        or a file changed since it read it (nothing is written either way)."""
        with self.lock:
            try:
                return build()
            except _Unread as unread:
                return self._unread_conflict(unread)
            except _Stale as stale:
                return self._conflict(view, _Change("edit", ws, [stale.write],
                                                    {stale.write.path: stale.seen}, {}),
                                      "", "rejected:pre_hash", {})

    def _commit_once(self, view: ClientView, build: Callable[[], _Change], ws: Workspace,
                     request_id: str | None, who: str, matches: _Matcher) -> Result:
        step = self._step_id(ws, request_id)
        with self.lock:
            known = request_id is not None and self.ledger.find_step(step) is not None
        if known:
            with self._step_lease(ws) as epoch:
                return self._replay(view, ws, step, epoch, matches, who)
        change = self._build(view, ws, build)
        if isinstance(change, Result):
            return change
        size = sum(len(c) for c in change.posts.values() if c is not None)
        if size > self.limits.write_bytes:
            raise ToolFailure(f"the new content is {size} bytes, more than the"
                              f" {self.limits.write_bytes} one call may write")
        with self._step_lease(ws) as epoch:
            if request_id is not None and self.ledger.find_step(step) is not None:
                return self._replay(view, ws, step, epoch, matches, who)  # raced a retry
            out = run_fenced_step(self.ledger, ws.name, step, change.writes, epoch=epoch,
                                  run=who, on_planned=lambda _: self._reached("after-admit"))
            return self._answer(view, ws, step, out, change, change.posts)

    def _answer(self, view: ClientView, ws: Workspace, step: str, out: FencedOutcome,
                change: _Change | None, posts: dict[str, bytes | None], *,
                replayed: bool = False) -> Result:
        """The tool's answer to a fenced step's outcome (the library's `run_fenced_step`)."""
        if out.status is StepStatus.STALE_EPOCH:
            assert out.error is not None
            raise out.error
        if not out.committed:
            if change is None:
                change = self._change_from_plan(ws, step)
            verdict = f"rejected:{out.reason.value}" if out.reason is not None else out.detail
            return self._conflict(view, change, step, verdict, {}, replayed=replayed)
        assert out.receipt is not None
        self._reached("after-commit")
        return self._applied(view, ws, step, out.receipt.writes, posts,
                             change.diffs if change is not None else {},
                             replayed=replayed or out.status is StepStatus.DEDUPED)

    def _applied(self, view: ClientView, ws: Workspace, step: str, writes: Sequence[Any],
                 posts: dict[str, bytes | None], diffs: dict[str, str], *,
                 replayed: bool = False) -> Result:
        files = []
        for w in writes:
            content = posts.get(w.path)
            view.put(ws.name, w.path, Seen(w.rev, w.post_hash,
                                           content if content is not None and w.post_hash else None))
            files.append({"path": self.show(ws, w.path), "rev": w.rev, "hash": w.post_hash,
                          "previous_hash": w.pre_hash,
                          "change": "created" if w.pre_hash is None else
                          "deleted" if w.post_hash is None else "modified"})
        if step not in view.steps:
            view.steps.append(step)
        lines = [f"{f['path']}: {f['change']} (rev {f['rev']}, sha256 {short(f['hash'])})"
                 for f in files]
        head = ("Already applied (this requestId was answered from the ledger; nothing was"
                " applied twice)" if replayed else "Applied")
        text = (f"{head}: step {step}, committed.\n" + "\n".join(lines)
                + f"\nUndo it with undo(step={step!r}).")
        for path, diff in diffs.items():
            if diff:
                text += f"\n\n```diff\n{diff}```"
        return Result([text], {"status": "applied", "step": step, "workspace": ws.name,
                               "replayed": replayed, "files": files})

    def _replay(self, view: ClientView, ws: Workspace, step: str, epoch: int,
                matches: _Matcher, who: str) -> Result:
        """Answer a retried requestId from what the ledger recorded for its step: a
        committed step's result, a refusal's conflict, an undo's outcome; a step that died
        in flight or was settled unpublished is run again through the library's fenced
        step — fenced on the same read as first recorded, its new content taken from the
        retried call itself (so a post-image lost in the crash is stored again)."""
        row = self.ledger.step(step)
        planned, ended = self._latest_attempt(step, row.attempt)
        posts = None
        if row.workspace == ws.name and planned is not None and planned.workspace == ws.name:
            posts = matches(planned.writes)
        if posts is None:
            raise ToolFailure(f"requestId of step {step} was already used for a different"
                              " change; give every change its own requestId (a UUID)")
        assert planned is not None
        if row.rejected:
            change = self._change_from_plan(ws, step, planned)
            reason = ended.reason if isinstance(ended, Rejected) else "pre_hash"
            return self._conflict(view, change, step, f"rejected:{reason}", {}, replayed=True)
        if row.compensated and not row.settled_unpublished:
            summary = self._undo_summary(ended)
            return Result([f"Step {step} of this requestId was applied and later {summary};"
                           " nothing was applied again. Make a new change with a new"
                           " requestId."], {"status": "undone" if summary == "undone" else
                                            "undo-conflict", "step": step,
                                            "workspace": ws.name, "replayed": True})
        settled = row.settled_unpublished  # died unpublished, settled: planned again
        writes = [Write(w.path, posts.get(w.path), pre_hash=w.pre_hash,
                        base_rev=None if settled else w.base_rev, mode=w.mode)
                  for w in planned.writes]
        out = run_fenced_step(self.ledger, ws.name, step, writes, epoch=epoch, run=who)
        return self._answer(view, ws, step, out, self._change_from_plan(ws, step, planned),
                            posts, replayed=True)

    def _latest_attempt(self, step: str, attempt: int) -> tuple[Planned | None, Any]:
        """The attempt's plan and its end (rejected or compensated; None: not ended)."""
        got = self.ledger.attempt(step, attempt)
        return got.planned, None if got.end is None else got.end[1]

    def _change_from_plan(self, ws: Workspace, step: str, planned: Planned | None = None
                          ) -> _Change:
        if planned is None:
            planned = self._latest_attempt(step, self.ledger.step(step).attempt)[0]
        assert planned is not None
        writes = [Write(w.path, None, pre_hash=w.pre_hash, base_rev=w.base_rev)
                  for w in planned.writes]
        seen = {w.path: Seen(w.base_rev, w.pre_hash) for w in planned.writes}
        return _Change("replay", ws, writes, dict(seen), {})

    # -- conflicts ----------------------------------------------------------------------------

    def _unread_conflict(self, unread: _Unread) -> Result:
        shown = self.show(unread.ws, unread.rel)
        text = (f"Conflict: nothing was written. {shown} exists and this session has not read"
                f" it, so {unread.what} would overwrite content you have not seen. Read it first"
                " (read_text_file), then write or edit it: the write is then fenced on that"
                " read.")
        return Result([text], {"status": "conflict", "reason": "unread", "files": [{
            "path": shown, "current_rev": unread.rev, "current_hash": unread.hash}]}, True)

    def _conflict(self, view: ClientView, change: _Change, step: str, verdict: str,
                  facts: dict[str, Any], *, replayed: bool = False) -> Result:
        """A refused change as the agent sees it: per path, what it read and what is
        there now, with a diff between them. Nothing was written."""
        ws = change.ws
        reason = verdict.removeprefix("rejected:")
        files = []
        blocks = []
        for w in change.writes:
            seen = change.seen.get(w.path)
            now: bytes | None = None
            try:
                with self.lock:
                    got = self.ledger.workspaces.read_file(ws.name, w.path, max_bytes=self.limits.read_bytes)
                now_hash, now_rev, now = got.pre_hash, got.rev, got.content
            except LedgerError:
                try:
                    with self.lock:
                        now_rev, now_hash = self.ledger.workspaces.snapshot(ws.name, w.path)
                except LedgerError:
                    now_rev, now_hash = -1, "unreadable"
            base_ok = w.base_rev is None or w.base_rev == now_rev
            if now_hash == w.pre_hash and base_ok:
                continue  # this path still holds what was read
            shown = self.show(ws, w.path)
            before = self._content_of(seen) if seen is not None else None
            if now_hash == "unreadable":
                what = (f"{shown} is now a symlink, a directory or another kind of file that is"
                        " not a regular file (steptrail never writes through one)")
            elif w.pre_hash is None:
                what = f"{shown} did not exist when you planned this, and now it does"
            elif now_hash is None:
                what = f"{shown} was deleted since you read it"
            elif now_hash == w.pre_hash:
                what = (f"{shown} holds the same bytes but was rewritten since you read it"
                        f" (rev {w.base_rev} -> {now_rev})")
            else:
                what = f"{shown} changed since you read it"
            diff = "" if now_hash in (w.pre_hash, "unreadable") else (
                unified_diff(before, now, w.path, before_label="what you read",
                             after_label="on disk now")
                if (before is not None or w.pre_hash is None) and (now is not None or now_hash is None)
                else "(no diff: the content you read is no longer known to the server)")
            files.append({"path": shown, "read_hash": w.pre_hash, "read_rev": w.base_rev,
                          "current_hash": now_hash, "current_rev": now_rev, "diff": diff,
                          "why": what})
            blocks.append(f"- {what}." if now_hash == "unreadable" else
                          f"- {what}: you read sha256 {short(w.pre_hash)}, it is now"
                          f" sha256 {short(now_hash)} (rev {now_rev})."
                          + (f"\n```diff\n{diff}```" if diff else ""))
        if not files:  # the fence saw something that is gone again: say what it saw
            p = facts.get("path") or (change.writes[0].path if change.writes else "")
            files.append({"path": self.show(ws, p) if p else "", "why": verdict})
            blocks.append(f"- {self.show(ws, p) if p else 'a path'} changed while the write was"
                          f" being applied ({verdict}).")
        refused = f"; step {step} was refused ({reason})" if step else ""
        text = ("Conflict: nothing was written" + (" (this requestId was refused when first"
                " made)" if replayed else "") + f"{refused}.\n"
                + "\n".join(blocks)
                + "\nRead the file again and redo your change (use a new requestId), or pass"
                " expectedHash with the current hash to replace it on purpose.")
        return Result([text], {"status": "conflict", "reason": reason, "step": step or None,
                               "workspace": ws.name, "replayed": replayed, "files": files}, True)

    # -- writes -------------------------------------------------------------------------------

    def _encode(self, content: str, shown: str) -> bytes:
        if not isinstance(content, str):
            raise ToolFailure(f"content for {shown} must be a string")
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolFailure(f"content for {shown} is not valid Unicode (a lone surrogate)"
                              ) from None

    def write_file(self, view: ClientView, path: str, content: str,
                   expected_hash: str | None = None, request_id: str | None = None,
                   who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "content": content,
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, tool="write_file")

    def delete_file(self, view: ClientView, path: str, expected_hash: str | None = None,
                    request_id: str | None = None, who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "delete": True,
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, tool="delete_file")

    def edit_file(self, view: ClientView, path: str, edits: Sequence[tuple[str, str]],
                  dry_run: bool = False, expected_hash: str | None = None,
                  request_id: str | None = None, who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "edits": list(edits),
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, dry_run=dry_run, tool="edit_file")

    def write_files(self, view: ClientView, files: Sequence[dict[str, Any]],
                    request_id: str | None = None, who: str = "mcp", dry_run: bool = False,
                    tool: str = "write_files") -> Result:
        """Write, edit or delete several files as one step: all land, or none."""
        if not files:
            raise ToolFailure("give at least one file")
        if len(files) > 1000:
            raise ToolFailure(f"{len(files)} files: one step writes at most 1000")
        resolved = []
        for f in files:
            ws, rel = self.resolve(f.get("path"))
            kinds = [k for k in ("content", "edits", "delete") if f.get(k) not in (None, False)]
            if len(kinds) != 1:
                raise ToolFailure(f"{self.show(ws, rel)}: give exactly one of content, edits or"
                                  " delete")
            if kinds[0] == "edits" and len(f["edits"]) > 1000:
                raise ToolFailure(f"{self.show(ws, rel)}: {len(f['edits'])} edits; one call"
                                  " makes at most 1000 (write the whole file instead)")
            resolved.append((ws, rel, kinds[0], f))
        ws = resolved[0][0]
        if any(r[0] is not ws for r in resolved):
            raise ToolFailure("one step writes one workspace: split the change by workspace")
        rels = [r[1] for r in resolved]
        if len(set(rels)) != len(rels):
            raise ToolFailure("a path is given twice; merge its changes into one entry")

        def post_of(rel: str, kind: str, f: dict[str, Any], before: bytes | None) -> bytes | None:
            shown = self.show(ws, rel)
            if kind == "delete":
                return None
            if kind == "content":
                return self._encode(f["content"], shown)
            if before is None:
                raise ToolFailure(f"{shown} does not exist: nothing to edit (write_file creates"
                                  " a file)")
            edits = [(e[0], e[1]) for e in f["edits"]]
            return apply_edits(self._text(before, shown), edits, shown).encode("utf-8")

        def build() -> _Change:
            writes, seen_by, posts, diffs = [], {}, {}, {}
            for ws_, rel, kind, f in resolved:
                template, seen = self._fence(view, ws_, rel, f.get("expectedHash"), what=tool)
                assert template is not None
                before = None
                if (kind == "edits" and template.pre_hash is not None and seen is not None
                        and seen.hash == template.pre_hash and seen.content is not None):
                    # the bytes the client read, kept: the edits are made to them, and
                    # the ledger's fence refuses them if the file no longer holds them
                    before = seen.content
                elif kind == "edits" and template.pre_hash is not None:
                    got = self._read(ws_, rel)
                    if got.pre_hash == template.pre_hash and (
                            template.base_rev is None or got.rev == template.base_rev):
                        before = got.content
                    else:
                        # stale already: the edits are made to what the client read and
                        # the ledger refuses them (recorded) — if those bytes are known
                        before = self._content_of(seen)
                        if before is None:
                            raise _Stale(Write(rel, None, pre_hash=template.pre_hash,
                                               base_rev=template.base_rev), seen)
                if kind == "delete" and template.pre_hash is None:
                    raise ToolFailure(f"{self.show(ws_, rel)} does not exist: nothing to delete")
                post = post_of(rel, kind, f, before)
                if post is not None and post == before and kind == "edits":
                    raise ToolFailure(f"the edits leave {self.show(ws_, rel)} unchanged")
                writes.append(Write(rel, post, pre_hash=template.pre_hash,
                                    base_rev=template.base_rev))
                seen_by[rel], posts[rel] = seen, post
                if kind == "edits":
                    diffs[rel] = unified_diff(before, post, rel)
            return _Change(tool, ws, writes, seen_by, posts, diffs)

        if dry_run:
            change = self._build(view, ws, build)
            if isinstance(change, Result):
                return change
            text = "\n".join(f"```diff\n{d}```" for d in change.diffs.values() if d) or "no change"
            return Result([f"Dry run: nothing was written.\n{text}"], {
                "status": "dry-run", "files": [{"path": self.show(ws, w.path),
                                                "diff": change.diffs.get(w.path, "")}
                                               for w in change.writes]})

        def matches(planned: tuple[PlannedWrite, ...]) -> dict[str, bytes | None] | None:
            recorded = {p.path: p for p in planned}
            if set(recorded) != set(rels):
                return None
            posts: dict[str, bytes | None] = {}
            for _ws, rel, kind, f in resolved:
                p = recorded[rel]
                if kind == "delete":
                    if p.post_hash is not None:
                        return None
                    posts[rel] = None
                elif kind == "content":
                    data = self._encode(f["content"], rel)
                    if p.post_hash != sha256(data):
                        return None
                    posts[rel] = data
                else:
                    before = None
                    if p.pre_hash is not None:
                        with contextlib.suppress(LedgerError):
                            before = self.ledger.read_blob(p.pre_hash)
                        if before is None:  # never stored (died before its apply):
                            with contextlib.suppress(LedgerError, ToolFailure, FsRefused):
                                got = self._read(ws, rel)  # the file, if it still holds it
                                if got.pre_hash == p.pre_hash:
                                    before = got.content
                    if before is None:
                        return None  # cannot be told apart from another change: refused
                    try:
                        post = post_of(rel, kind, f, before)
                    except (ToolFailure, EditRefused):
                        return None
                    if post is None or sha256(post) != p.post_hash:
                        return None
                    posts[rel] = post
            return posts

        return self._commit(view, build, ws, request_id, who, matches)

    @staticmethod
    def _empty_dir(ws: Any, rel: str) -> bool:
        """Whether the directory `rel` holds nothing at all (no entry, hidden or not)."""
        try:
            walk = ws.fs.list_dir(rel, max_entries=1)
        except (LedgerError, OSError, FsRefused):
            return False
        return not walk.entries and not walk.hidden and not walk.truncated

    def move_file(self, view: ClientView, source: str, destination: str,
                  request_id: str | None = None, who: str = "mcp",
                  expected_hash: str | None = None) -> Result:
        """One step: every file under `source` deleted and created at `destination`
        (fenced on its absence). Each moved file is fenced on what this client read of it,
        like delete_file: a file it never read is refused ("read it first"), one changed
        since it read it is a conflict; `expected_hash` fences a single file instead.
        Symlinks and special files are refused; a file's permission bits follow it, set
        before the moved file is visible under its new name."""
        sws, srel = self.resolve(source, what="source")
        dws, drel = self.resolve(destination, what="destination")
        if sws is not dws:
            raise ToolFailure("source and destination must be in the same workspace")
        ws = sws
        if drel == srel or drel.startswith(srel + "/"):
            raise ToolFailure(f"cannot move {self.show(ws, srel)} into itself")
        with self.lock:
            st = ws.fs.lstat(srel)
            if st is None:
                raise ToolFailure(f"{self.show(ws, srel)} does not exist")
            dst = ws.fs.lstat(drel)
            if dst is not None and not (stat.S_ISDIR(dst.st_mode) and stat.S_ISDIR(st.st_mode)
                                        and self._empty_dir(ws, drel)):
                # (an empty directory holds nothing to replace: a killed move's, settled,
                # leaves one — its retry goes on into it)
                raise ToolFailure(f"{self.show(ws, drel)} already exists; move_file never"
                                  " replaces anything")
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise ToolFailure(f"{self.show(ws, srel)} is a symlink or special file: only"
                                  " regular files and directories move")
            if stat.S_ISDIR(st.st_mode):
                walk = ws.fs.walk(srel, max_entries=self.limits.move_files * 4,
                                  max_depth=64, max_scan=self.limits.scan_entries,
                                  deadline_s=self.limits.walk_seconds)
                if walk.truncated:
                    raise ToolFailure(f"{self.show(ws, srel)} is too big to move as one step"
                                      f" ({walk.why})")
                if walk.hidden:
                    raise ToolFailure(f"{self.show(ws, srel)} holds {len(walk.hidden)} entries"
                                      " the tools leave alone (.git, steptrail's temporaries,"
                                      " the ledger's own, names that are not UTF-8): it is not"
                                      " moved, so nothing of it is left behind")
                odd = [e for e in walk.entries if e.kind not in ("file", "directory")]
                if odd:
                    raise ToolFailure(f"{self.show(ws, odd[0].path)} is a {odd[0].kind}: a"
                                      " directory holding one is not moved")
                files = [e.path for e in walk.entries if e.kind == "file"]
                dirs = [e.path for e in walk.entries if e.kind == "directory"]
                if len(files) > self.limits.move_files:
                    raise ToolFailure(f"{self.show(ws, srel)} holds {len(files)} files; one"
                                      f" move moves at most {self.limits.move_files}")
            else:
                files, dirs = [srel], []
        if not files:  # directories only: nothing of content moves, so no step
            with self.lock:
                for d in [drel, *(drel + d[len(srel):] for d in dirs)]:
                    ws.fs.mkdir(d)
                for d in sorted([*dirs, srel], key=len, reverse=True):
                    ws.fs.rmdir_empty(d)
            return Result([f"Moved the empty directory {self.show(ws, srel)} to"
                           f" {self.show(ws, drel)} (no files: not a step)."],
                          {"status": "moved", "moved": {"from": self.show(ws, srel),
                                                        "to": self.show(ws, drel)}})
        pairs = [(f, drel + f[len(srel):]) for f in files]
        if expected_hash is not None and len(pairs) != 1:
            raise ToolFailure("expectedHash fences one file: a directory moves file by file,"
                              " each fenced on what you read of it")

        def build() -> _Change:
            writes, seen, posts = [], {}, {}
            unread = []
            for src, dst in pairs:
                try:
                    template, read = self._fence(view, ws, src, expected_hash, what="move_file")
                except _Unread as exc:
                    unread.append(exc)
                    continue
                assert template is not None
                if template.pre_hash is None:
                    raise ToolFailure(f"{self.show(ws, src)} does not exist: nothing to move")
                got = self._read(ws, src)
                if got.content is None:
                    raise ToolFailure(f"{self.show(ws, src)} disappeared while moving")
                if got.pre_hash != template.pre_hash:
                    # changed since the client read it: the fence refuses it, recorded
                    content = self._content_of(read)
                    if content is None:
                        raise _Stale(Write(src, None, pre_hash=template.pre_hash,
                                           base_rev=template.base_rev), read)
                else:
                    content = got.content
                mode = None
                with contextlib.suppress(OSError, FsRefused):
                    s = ws.fs.lstat(src)
                    if s is not None:
                        mode = stat.S_IMODE(s.st_mode) & 0o777
                writes.append(Write(src, None, pre_hash=template.pre_hash,
                                    base_rev=template.base_rev))
                writes.append(Write(dst, content, pre_hash=None, base_rev=None, mode=mode))
                seen[src], posts[src] = read, None
                seen[dst], posts[dst] = None, content
            if unread:
                if len(unread) == 1:
                    raise unread[0]
                raise ToolFailure(f"{len(unread)} files under {self.show(ws, srel)} were never"
                                  " read in this session (" + ", ".join(
                                      self.show(ws, u.rel) for u in unread[:5])
                                  + (", ..." if len(unread) > 5 else "") + "): a move"
                                  " deletes them where they are, so read each first"
                                  " (read_multiple_files)")
            return _Change("move_file", ws, writes, seen, posts)

        def matches(planned: tuple[PlannedWrite, ...]) -> dict[str, bytes | None] | None:
            recorded = {p.path: p for p in planned}
            want = {p for pair in pairs for p in pair}
            if set(recorded) != want or not all(
                    recorded[s].post_hash is None and recorded[d].pre_hash is None
                    and recorded[d].post_hash == recorded[s].pre_hash for s, d in pairs):
                return None
            posts: dict[str, bytes | None] = {}
            for s, d in pairs:
                digest = recorded[d].post_hash
                assert digest is not None
                data = None
                with contextlib.suppress(LedgerError):
                    data = self.ledger.read_blob(digest)
                if data is None:
                    with contextlib.suppress(LedgerError, ToolFailure, FsRefused):
                        got = self._read(ws, s)
                        data = got.content if got.pre_hash == digest else None
                if data is None:
                    return None
                posts[s], posts[d] = None, data
            return posts

        with self.write_lock:
            result = self._commit(view, build, ws, request_id, who, matches)
            if result.is_error:
                return result
            with self.lock:
                for d in [drel + d[len(srel):] for d in dirs]:
                    with contextlib.suppress(OSError, FsRefused):
                        ws.fs.mkdir(d)  # empty directories come along
                # a directory's move leaves no empty source behind (it did when the
                # directory held files only); a file's move removes no directory
                for d in sorted([*dirs, srel] if files != [srel] else [], key=len,
                                reverse=True):
                    ws.fs.rmdir_empty(d)
            result.data["moved"] = {"from": self.show(ws, srel), "to": self.show(ws, drel)}
            result.texts[0] = (f"Moved {self.show(ws, srel)} to {self.show(ws, drel)}.\n"
                               + result.texts[0])
        return result

    # -- directories --------------------------------------------------------------------------

    def create_directory(self, view: ClientView, path: str) -> Result:
        ws, rel = self.resolve(path, directory=True)
        with self.lock:
            created = ws.fs.mkdir(rel)
        shown = self.show(ws, rel)
        text = (f"Created {shown}" + (f" ({len(created)} directories)" if len(created) > 1 else "")
                if created else f"{shown} already exists")
        return Result([text + ". (Directories are not steps: an empty directory holds no"
                       " content; the files you write in it are.)"],
                      {"path": shown, "created": [self.show(ws, c) for c in created]})

    def list_directory(self, view: ClientView, path: str, with_sizes: bool = False,
                       sort_by: str = "name") -> Result:
        ws, rel = self.resolve(path, directory=True)
        with self.lock:
            walk = ws.fs.list_dir(rel, max_entries=self.limits.list_entries)
        entries = walk.entries
        if sort_by == "size":
            entries = sorted(entries, key=lambda e: -e.size)
        tag = {"file": "[FILE]", "directory": "[DIR]", "symlink": "[LINK]", "other": "[OTHER]"}
        lines = [f"{tag[e.kind]} {e.name}" + (f"  {e.size}" if with_sizes and e.kind == "file" else "")
                 for e in entries]
        if walk.truncated:
            lines.append(f"... (truncated: {walk.why})")
        if with_sizes:
            total = sum(e.size for e in entries if e.kind == "file")
            lines.append(f"\n{sum(e.kind == 'file' for e in entries)} files,"
                         f" {sum(e.kind == 'directory' for e in entries)} directories, {total} bytes")
        return Result(["\n".join(lines) or "(empty)"], {
            "path": self.show(ws, rel), "truncated": walk.truncated,
            "entries": [{"name": e.name, "type": e.kind, **({"size": e.size} if e.kind == "file" else {})}
                        for e in entries]})

    def directory_tree(self, view: ClientView, path: str,
                       exclude_patterns: Sequence[str] = (), max_depth: int | None = None) -> Result:
        ws, rel = self.resolve(path, directory=True)
        depth = min(max_depth or self.limits.tree_depth, self.limits.tree_depth)
        if depth < 1:
            raise ToolFailure("maxDepth must be 1 or more")
        with self.lock:
            walk = ws.fs.walk(rel, max_entries=self.limits.tree_entries, max_depth=depth,
                              max_scan=self.limits.scan_entries,
                              deadline_s=self.limits.walk_seconds, exclude=list(exclude_patterns))
        root: list[dict[str, Any]] = []
        nodes: dict[str, list[dict[str, Any]]] = {rel: root}
        for e in walk.entries:
            parent = e.path.rpartition("/")[0] if "/" in e.path else ""
            siblings = nodes.get(parent)
            if siblings is None:
                continue
            node: dict[str, Any] = {"name": e.name, "type": e.kind}
            if e.kind == "directory":
                node["children"] = nodes[e.path] = []
            siblings.append(node)
        import json
        data: dict[str, Any] = {"path": self.show(ws, rel), "tree": root,
                                "truncated": walk.truncated}
        text = json.dumps(root, indent=2)
        if walk.truncated:
            data["why"] = walk.why
            text += f"\n(truncated: {walk.why}; list a subdirectory, or narrow excludePatterns)"
        return Result([text], data)

    def search_files(self, view: ClientView, path: str, pattern: str,
                     exclude_patterns: Sequence[str] = ()) -> Result:
        ws, rel = self.resolve(path, directory=True)
        if not isinstance(pattern, str) or not pattern:
            raise ToolFailure("give a pattern, e.g. '*.py' or 'src/**/test_*.py'")
        plain = not any(c in pattern for c in "*?[")
        with self.lock:
            walk = ws.fs.walk(rel, max_entries=self.limits.scan_entries,
                              max_depth=64, max_scan=self.limits.scan_entries,
                              deadline_s=self.limits.walk_seconds, exclude=list(exclude_patterns))
        hits: list[Entry] = []
        for e in walk.entries:
            inside = e.path[len(rel):].lstrip("/") if rel else e.path
            ok = (pattern.casefold() in e.name.casefold()) if plain else (
                glob_match(inside, pattern) or glob_match(e.path, pattern))
            if ok:
                hits.append(e)
                if len(hits) >= self.limits.search_results:
                    break
        truncated = walk.truncated or len(hits) >= self.limits.search_results
        lines = [self.show(ws, e.path) + ("/" if e.kind == "directory" else "") for e in hits]
        if truncated:
            lines.append(f"... (truncated: {walk.why or f'more than {self.limits.search_results} matches'})")
        return Result(["\n".join(lines) or "No matches found"], {
            "path": self.show(ws, rel), "pattern": pattern, "truncated": truncated,
            "matches": [{"path": self.show(ws, e.path), "type": e.kind} for e in hits]})

    def get_file_info(self, view: ClientView, path: str) -> Result:
        ws, rel = self.resolve(path, directory=True)
        shown = self.show(ws, rel)
        with self.lock:
            st = ws.fs.lstat(rel)
            if st is None:
                raise ToolFailure(f"{shown} does not exist")
            info: dict[str, Any] = {
                "path": shown, "type": ("file" if stat.S_ISREG(st.st_mode) else "directory"
                                        if stat.S_ISDIR(st.st_mode) else "symlink"
                                        if stat.S_ISLNK(st.st_mode) else "other"),
                "size": st.st_size, "modified": iso(st.st_mtime_ns),
                "accessed": iso(st.st_atime_ns), "changed": iso(st.st_ctime_ns),
                "permissions": oct(stat.S_IMODE(st.st_mode))[2:]}
            if stat.S_ISREG(st.st_mode) and rel:
                rev, digest = self.ledger.workspaces.snapshot(ws.name, rel)
                info.update(rev=rev, hash=digest)
        return Result(["\n".join(f"{k}: {v}" for k, v in info.items())], info)

    def list_allowed_directories(self, view: ClientView) -> Result:
        lines = [f"{w.root}" + (" (default: relative paths are inside it)" if w is self.default
                                else "") for w in self.workspaces]
        return Result(["Allowed directories (steptrail workspaces):\n" + "\n".join(lines)], {
            "directories": [{"path": w.root, "workspace": w.name, "default": w is self.default}
                            for w in self.workspaces]})

    # -- what the reference server does not have -------------------------------------------

    def _resolve_step(self, view: ClientView, step: str | None) -> str:
        if step is None:
            for s in reversed(view.steps):
                with self.lock:
                    row = self.ledger.find_step(s)
                if row is not None and row.live:
                    return s
            raise ToolFailure("this session has no committed change to undo; name a step (see"
                              " history)")
        if not isinstance(step, str) or not step:
            raise ToolFailure("step must be a step id (as writes and history return it)")
        with self.lock:
            if self.ledger.find_step(step) is not None:
                return step
            for ws in self.workspaces:
                candidate = self._step_id(ws, step)
                if _REQUEST_ID.fullmatch(step) and self.ledger.find_step(candidate) is not None:
                    return candidate
        raise ToolFailure(f"no step {step!r} in this ledger (give a step id from history, or"
                          " the requestId of the change)")

    def undo(self, view: ClientView, step: str | None = None, who: str = "mcp") -> Result:
        """Compensate one step back to its pre-images, fenced: a path that no longer holds
        what the step wrote (a person's or a later step's change) is left as found.

        Journaled by the library (`compensating` before the first file is touched), so an
        undo killed half-way — one file back, another not — is finished by the next
        server that takes the lease (its acquire settles it). The answer says what was
        put back: an undo that put nothing back is not reported as done."""
        step = self._resolve_step(view, step)
        with self.write_lock:
            with self.lock:
                row = self.ledger.step(step)
                ws = next((w for w in self.workspaces if w.name == row.workspace), None)
                if ws is None:
                    raise ToolFailure(f"step {step} is not a change of a workspace this server"
                                      " serves")
                if row.rejected:
                    raise ToolFailure(f"step {step} was refused when made: nothing of it was"
                                      " written, nothing to undo")
                if row.settled_unpublished:
                    raise ToolFailure(f"step {step} never committed (it was settled): nothing"
                                      " to undo")
            for retry in (False, True):
                try:
                    with self._step_lease(ws) as epoch:
                        comp = self.ledger.workspaces.compensate(step, epoch=epoch,
                                                      reason=one_line(f"undo by {who}")[:200])
                    break
                except StaleEpoch:
                    if retry or not self.leases.reused:  # a kept lease taken over: once more
                        raise
                except (CompensationWindowClosed, IllegalTransition) as exc:
                    extra = (" (write the old content back with write_file; history shows it)"
                             if isinstance(exc, CompensationWindowClosed) else "")
                    raise ToolFailure(one_line(said_at_a_shell(exc)) + extra) from None
        files = []
        for r in comp.restored:
            if r.outcome != "conflict":
                view.put(ws.name, r.path, Seen(r.rev, r.digest))
            files.append({"path": self.show(ws, r.path), "outcome": r.outcome, "rev": r.rev,
                          "hash": r.digest,
                          "kept": None if r.kept is None else self.show(ws, r.kept)})
        conflicts = [f for f in files if f["outcome"] == "conflict"]
        lines = [f"{f['path']}: " + {"restored": "put back" + (" (removed: the step created it)"
                                                              if f["hash"] is None else ""),
                                     "already": "already back",
                                     "conflict": "LEFT AS FOUND: it changed after the step,"
                                                 " or it is where the step moved a file whose"
                                                 " old place could not be given back (nothing"
                                                 " was overwritten or removed)"}[f["outcome"]]
                 + (f"; a file that could not go back is kept as {f['kept']}"
                    if f["kept"] else "")
                 for f in files]
        summary = _summary(comp.restored)
        head = {"undone": "Undone", "partly undone": "Partly undone",
                "not undone": "NOT undone"}[summary]
        if comp.deduped:
            head = f"{head} earlier"
        status = {"undone": "undone", "partly undone": "partly-undone",
                  "not undone": "not-undone"}[summary]
        return Result([f"{head}: step {step}.\n" + "\n".join(lines)], {
            "status": status, "step": step, "workspace": ws.name, "deduped": comp.deduped,
            "files": files, "conflicts": len(conflicts)}, bool(conflicts))

    def _undo_summary(self, ended: object) -> str:
        """How a compensation of a committed step came out, in words (`_summary`)."""
        return _summary(ended.restored if isinstance(ended, Compensated) else ())

    def _outcome(self, row: StepRow | None) -> str:
        if row is None:
            return "unknown"
        if row.live:
            return "committed"
        if row.rejected:
            return "refused"
        if row.compensated:
            if row.settled_unpublished:
                return "settled (never committed)"
            return self._undo_summary(self._latest_attempt(row.step_id, row.attempt)[1])
        return f"in flight ({row.state})"

    def history(self, view: ClientView, path: str | None = None, limit: int = 20) -> Result:
        """The steps that wrote a path (or any path of the served workspaces), newest
        first, with who made them, when, and what became of them."""
        if not 1 <= limit <= self.limits.history_steps:
            raise ToolFailure(f"limit must be 1 to {self.limits.history_steps}")
        target: tuple[Workspace, str] | None = None
        if path is not None:
            target = self.resolve(path)
        names = {w.name: w for w in self.workspaces}

        def touches(r: RecordedEvent) -> bool:
            e = r.event
            return isinstance(e, Planned) and e.workspace in names and (
                target is None or (e.workspace == target[0].name
                                   and any(w.path == target[1] for w in e.writes)))

        with self.lock:
            newest, complete = self._newest(touches, limit, kind="planned",
                                            key=lambda r: r.event.step)  # type: ignore[union-attr]
            steps = []
            for r in reversed(newest):
                e = r.event
                assert isinstance(e, Planned)
                step = e.step
                row = self.ledger.find_step(step)
                ws = names[e.workspace]
                steps.append({
                    "step": step, "who": e.run or "(not recorded)", "planned": iso(r.time_ns),
                    "updated": iso(row.updated_ns) if row is not None else None,
                    "outcome": self._outcome(row), "attempt": e.attempt,
                    "files": [{"path": self.show(ws, w.path),
                               "change": "created" if w.pre_hash is None else "deleted"
                               if w.post_hash is None else "modified",
                               "from": w.pre_hash, "to": w.post_hash} for w in e.writes]})
        lines = [f"{s['planned']}  {s['step']}  {s['outcome']}  by {s['who']}: "
                 + ", ".join(f"{f['path']} {f['change']}" for f in s["files"][:10])
                 + (" …" if len(s["files"]) > 10 else "") for s in steps]
        shown = self.show(*target) if target else "the workspaces"
        if not complete:
            lines.append(f"(older steps not searched: the scan stopped after"
                         f" {self.limits.walk_seconds:g}s)")
        return Result([f"History of {shown} (newest first):\n" + ("\n".join(lines) or "no steps")],
                      {"path": shown, "steps": steps, "complete": complete})

    def _newest(self, match: Callable[[RecordedEvent], bool], want: int, *,
                kind: str | None = None, key: Callable[[RecordedEvent], Any] | None = None
                ) -> tuple[list[RecordedEvent], bool]:
        """The newest `want` events that `match` (oldest first; with `key`, the newest
        one per key), scanning back from the head in growing windows, for at most
        `walk_seconds`: (the events, whether the scan reached the first event). Memory
        follows `want` and the window, never the log."""
        hi = self.ledger.head().seq
        window = 1024
        found: list[RecordedEvent] = []
        seen: set[Any] = set()
        deadline = time.monotonic() + self.limits.walk_seconds
        while hi > 0 and len(found) < want:
            lo = max(0, hi - window)
            chunk: list[RecordedEvent] = []
            events = self.ledger.read(lo, kind=kind)
            try:
                for r in events:
                    if r.seq > hi:
                        break
                    if match(r):
                        chunk.append(r)
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
            for r in reversed(chunk):
                k = key(r) if key is not None else r.seq
                if k not in seen and len(found) < want:
                    seen.add(k)
                    found.append(r)
            hi, window = lo, min(window * 4, 1 << 20)
            if hi > 0 and time.monotonic() > deadline:
                return list(reversed(found)), False
        return list(reversed(found)), True

    def status(self, view: ClientView) -> Result:
        """Leases, steps in flight, anything left unsettled, and this session's view."""
        now = time.time_ns()
        out = []
        with self.lock:
            rows = [r for state in sorted(IN_FLIGHT) for r in self.ledger.steps(state)]
            for ws in self.workspaces:
                lease = self.ledger.workspaces.lease(ws.name)
                flight = [r.step_id for r in rows if r.workspace == ws.name]
                # in flight under an epoch that is no longer live: the next write settles it
                unsettled = (self.ledger.workspaces.unsettled(ws.name, lease.epoch if lease.live else
                                                   lease.epoch + 1) if lease.epoch else [])
                unsettled += [f"undo of {r.step_id} (begun, not finished: the next lease"
                              " taken finishes it)" for r in rows
                              if r.workspace == ws.name and r.compensating
                              and r.step_id not in unsettled]
                out.append({
                    "workspace": ws.name, "root": ws.root, "rev": self.ledger.workspaces.get(ws.name).rev,
                    "lease": {"epoch": lease.epoch, "holder": lease.holder, "live": lease.live,
                              "expires": iso(lease.expires_ns) if lease.expires_ns else None},
                    "in_flight": flight, "unsettled": unsettled})
            from ..attention import attention

            # what needs a person, as status and the UI say it (ledger/attention.py)
            served = {ws.name for ws in self.workspaces}
            items = [dict(it.as_json(), fix=f"steptrail {it.fix}" if it.fix else None)
                     for it in attention(self.ledger, limit=200, workspaces=served)]
        data = {"ledger": self.ledger.path, "holder": self.holder, "time": iso(now),
                "lease_ttl_s": self.lease_ttl_s, "workspaces": out, "attention": items,
                "session": {"paths_seen": len(view), "steps": list(view.steps)[-20:]},
                "notices": list(self.notices)}
        lines = [f"ledger {self.ledger.path}; this server is {self.holder}"]
        for w in out:
            lease = w["lease"]
            lines.append(f"workspace {w['workspace']} ({w['root']}): rev {w['rev']}; lease"
                         f" epoch {lease['epoch']} " + (f"held by {lease['holder']} until"
                                                  f" {lease['expires']}" if lease["live"] else "free")
                         + (f"; in flight: {', '.join(w['in_flight'][:10])}" if w["in_flight"] else "")
                         + (f"; UNSETTLED: {', '.join(w['unsettled'][:10])}" if w["unsettled"] else ""))
        open_ = [i for i in items if not i["resolved"]]
        if open_ or len(items) > len(open_):
            lines.append(f"needs attention: {len(open_)} open, {len(items) - len(open_)}"
                         " resolved (a later attempt committed)")
        for i in open_[:10]:
            lines.append(f"  {i['kind']} {i['subject']}: {i['reason']}"
                         + (f" (a person resolves it: {i['fix']})" if i["fix"] else ""))
        lines.append(f"this session has seen {len(view)} paths and made {len(view.steps)} steps")
        lines.extend(f"notice: {n}" for n in self.notices)
        return Result(["\n".join(lines)], data)

    def audit(self, view: ClientView, limit: int = 50, verify: bool = False) -> Result:
        """The audit log of the served workspaces: their newest events (who did what,
        when: steps planned, applied, committed, refused, undone; leases taken over),
        and, with `verify`, the ledger's full check (hash chain, projections, fences)."""
        if not 1 <= limit <= self.limits.audit_events:
            raise ToolFailure(f"limit must be 1 to {self.limits.audit_events}")
        names = {w.name for w in self.workspaces}
        with self.lock:
            newest, complete = self._newest(
                lambda r: getattr(r.event, "workspace", None) in names, limit)
            report = self.ledger.verify() if verify else None
        events = [self._event_json(r) for r in newest]
        counts: dict[str, int] = {}
        for r in newest:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        data: dict[str, Any] = {"events": events, "counts": counts, "complete": complete}
        lines = [f"{e['time']}  #{e['seq']}  {e['kind']}  {e.get('step', '')}  {e.get('detail', '')}".rstrip()
                 for e in events]
        if report is not None:
            findings = [f"{f.check}: {f.message}" for f in report.findings][:20]
            data["verify"] = {"ok": report.ok, "findings": findings,
                              "warnings": [str(getattr(w, "message", w)) for w in report.warnings][:20]}
            lines.append("verify: " + ("ok (chain, projections, fences, blobs)" if report.ok else
                                       f"{len(report.findings)} findings: " + "; ".join(findings[:5])))
        return Result(["\n".join(lines) or "no events"], data)

    @staticmethod
    def _event_json(r: RecordedEvent) -> dict[str, Any]:
        e = r.event
        out: dict[str, Any] = {"seq": r.seq, "time": iso(r.time_ns), "kind": r.kind,
                               "workspace": getattr(e, "workspace", "")}
        if getattr(e, "step", ""):
            out["step"], out["attempt"] = e.step, e.attempt  # type: ignore[union-attr]
        if isinstance(e, Planned):
            out["who"] = e.run
            out["paths"] = [w.path for w in e.writes]
        out["detail"] = detail(e)
        return out


def _summary(restored: Sequence[Any]) -> str:
    """``undone`` (every path back), ``partly undone`` or ``not undone`` (every path
    left as found: nothing was put back)."""
    conflicts = sum(1 for r in restored if r.outcome == "conflict")
    if not conflicts:
        return "undone"
    return "not undone" if conflicts == len(restored) else "partly undone"


class _Stale(Exception):
    """An edit of a file that changed since the client read it, whose read bytes the
    server no longer has: refused before anything is planned."""

    def __init__(self, write: Write, seen: Seen | None) -> None:
        super().__init__(write.path)
        self.write, self.seen = write, seen


class _Unread(Exception):
    """An existing file the client never read: planning stops ("read it first")."""

    def __init__(self, ws: Workspace, rel: str, rev: int, digest: str, what: str) -> None:
        super().__init__(rel)
        self.ws, self.rel, self.rev, self.hash, self.what = ws, rel, rev, digest, what


__all__ = ["ClientView", "FileTools", "Limits", "Result", "Seen", "ToolFailure", "one_line"]

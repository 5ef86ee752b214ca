"""The values the MCP file tools share: what a call answers (`Result`, `ToolFailure`), the
bounds they work in (`Limits`), what a client has seen (`Seen`, `ClientView`), a served
`Workspace`, one call's change, and the stages a write reaches (`STAGES`)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ledger import PlannedWrite, Write

from ..workspace import Confined

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
#: ``serve(on_stage=f)``: ``f(STAGE)``; tests/mcp_server/test_mcp_processes.py stops the server for
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



__all__ = ["COMMITTED", "IN_FLIGHT", "STAGES", "ClientView", "Limits", "Result", "Seen", "ToolFailure", "Workspace", "exchange_hook", "one_line", "sha256", "short"]

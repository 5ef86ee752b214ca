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

`FileTools` is the facade: each tool a method, implemented by one of four objects over
one `ToolContext` (`ledger.mcp.context`: the ledger, its locks and leases, the limits,
the served workspaces) — `Listing` (reads, directories), `Changes` (the writes: one step
each, the commit, a retry's answer, a conflict), `Records` (undo, history, status,
audit). The values they share are `ledger.mcp.values`'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ledger import Ledger

from .changes import Changes
from .context import ToolContext
from .leases import TURN_S
from .listing import Listing
from .records import Records
from .values import (
    STAGES,
    ClientView,
    Limits,
    Result,
    Seen,
    ToolFailure,
    Workspace,
    exchange_hook,
    one_line,
)


class FileTools:
    """Every tool of `steptrail mcp` over one open ledger (see the module)."""

    def __init__(self, ledger: Ledger, workspaces: Sequence[str], *,
                 lease_ttl_s: float = 20.0, lease_wait_s: float = 30.0,
                 lease_linger_s: float = 0.2, lease_turn_s: float = TURN_S,
                 observe_on_lease: bool = False,
                 limits: Limits | None = None, holder: str | None = None,
                 given_roots: dict[str, str] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        self.ctx = ToolContext(ledger, workspaces, lease_ttl_s=lease_ttl_s,
                               lease_wait_s=lease_wait_s, lease_linger_s=lease_linger_s,
                               lease_turn_s=lease_turn_s, observe_on_lease=observe_on_lease,
                               limits=limits, holder=holder, given_roots=given_roots,
                               on_stage=on_stage)
        self._listing = Listing(self.ctx)
        self._changes = Changes(self.ctx)
        self._records = Records(self.ctx, self._changes)

    # -- what callers read of the shared context ------------------------------------------

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    @property
    def limits(self) -> Limits:
        return self.ctx.limits

    @property
    def workspaces(self) -> list[Workspace]:
        return self.ctx.workspaces

    @property
    def default(self) -> Workspace:
        return self.ctx.default

    @property
    def holder(self) -> str:
        return self.ctx.holder

    def resolve(self, arg: object, *, directory: bool = False, what: str = "path"
                ) -> tuple[Workspace, str]:
        """(workspace, path relative to its root) for a path argument (`ToolContext`)."""
        return self.ctx.resolve(arg, directory=directory, what=what)

    def show(self, ws: Workspace, rel: str) -> str:
        return self.ctx.show(ws, rel)

    def call(self, fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
        """Run one tool; every failure is a one-line error result, never a traceback."""
        return self.ctx.call(fn, *args, **kwargs)

    def close(self) -> None:
        """Release every lease this server still holds."""
        self.ctx.close()

    # -- the tools --------------------------------------------------------------------------

    def read_text_file(self, view: ClientView, path: str, head: int | None = None,
                       tail: int | None = None) -> Result:
        return self._listing.read_text_file(view, path, head, tail)

    def read_multiple_files(self, view: ClientView, paths: Sequence[str]) -> Result:
        return self._listing.read_multiple_files(view, paths)

    def write_file(self, view: ClientView, path: str, content: str,
                   expected_hash: str | None = None, request_id: str | None = None,
                   who: str = "mcp") -> Result:
        return self._changes.write_file(view, path, content, expected_hash, request_id, who)

    def delete_file(self, view: ClientView, path: str, expected_hash: str | None = None,
                    request_id: str | None = None, who: str = "mcp") -> Result:
        return self._changes.delete_file(view, path, expected_hash, request_id, who)

    def edit_file(self, view: ClientView, path: str, edits: Sequence[tuple[str, str]],
                  dry_run: bool = False, expected_hash: str | None = None,
                  request_id: str | None = None, who: str = "mcp") -> Result:
        return self._changes.edit_file(view, path, edits, dry_run, expected_hash, request_id, who)

    def write_files(self, view: ClientView, files: Sequence[dict[str, Any]],
                    request_id: str | None = None, who: str = "mcp", dry_run: bool = False,
                    tool: str = "write_files") -> Result:
        """Write, edit or delete several files as one step: all land, or none."""
        return self._changes.write_files(view, files, request_id, who, dry_run, tool)

    def move_file(self, view: ClientView, source: str, destination: str,
                  request_id: str | None = None, who: str = "mcp",
                  expected_hash: str | None = None) -> Result:
        """One step: every file under `source` deleted and created at `destination`
        (fenced on its absence). Each moved file is fenced on what this client read of it,
        like delete_file: a file it never read is refused ("read it first"), one changed
        since it read it is a conflict; `expected_hash` fences a single file instead.
        Symlinks and special files are refused; a file's permission bits follow it, set
        before the moved file is visible under its new name."""
        return self._changes.move_file(view, source, destination, request_id, who, expected_hash)

    def create_directory(self, view: ClientView, path: str) -> Result:
        return self._listing.create_directory(view, path)

    def list_directory(self, view: ClientView, path: str, with_sizes: bool = False,
                       sort_by: str = "name") -> Result:
        return self._listing.list_directory(view, path, with_sizes, sort_by)

    def directory_tree(self, view: ClientView, path: str,
                       exclude_patterns: Sequence[str] = (), max_depth: int | None = None) -> Result:
        return self._listing.directory_tree(view, path, exclude_patterns, max_depth)

    def search_files(self, view: ClientView, path: str, pattern: str,
                     exclude_patterns: Sequence[str] = ()) -> Result:
        return self._listing.search_files(view, path, pattern, exclude_patterns)

    def get_file_info(self, view: ClientView, path: str) -> Result:
        return self._listing.get_file_info(view, path)

    def list_allowed_directories(self, view: ClientView) -> Result:
        return self._listing.list_allowed_directories(view)

    def undo(self, view: ClientView, step: str | None = None, who: str = "mcp") -> Result:
        """Compensate one step back to its pre-images, fenced: a path that no longer holds
        what the step wrote (a person's or a later step's change) is left as found.

        Journaled by the library (`compensating` before the first file is touched), so an
        undo killed half-way — one file back, another not — is finished by the next
        server that takes the lease (its acquire settles it). The answer says what was
        put back: an undo that put nothing back is not reported as done."""
        return self._records.undo(view, step, who)

    def rewind(self, view: ClientView, to: str, paths: list[str] | None = None,
               preview: bool = True) -> Result:
        """Rewind the (first) workspace to a step or '#N', previewed by default."""
        return self._records.rewind(view, to, paths, preview)

    def fork(self, view: ClientView, at: str, to: str, name: str | None = None) -> Result:
        """Fork the (first) workspace as of a step or '#N' into a new directory."""
        return self._records.fork(view, at, to, name)

    def observe(self, view: ClientView, label: str = "", who: str = "mcp") -> Result:
        """Record the edits made to the served workspaces outside the steps, attributed to
        the client that asked (`ledger.workspaces.observe`)."""
        return self._records.observe(view, label, who)

    def history(self, view: ClientView, path: str | None = None, limit: int = 20) -> Result:
        """The steps that wrote a path (or any path of the served workspaces), newest
        first, with who made them, when, and what became of them."""
        return self._records.history(view, path, limit)

    def status(self, view: ClientView) -> Result:
        """Leases, steps in flight, anything left unsettled, and this session's view."""
        return self._records.status(view)

    def audit(self, view: ClientView, limit: int = 50, verify: bool = False) -> Result:
        """The audit log of the served workspaces: their newest events (who did what,
        when: steps planned, applied, committed, refused, undone; leases taken over),
        and, with `verify`, the ledger's full check (hash chain, projections, fences)."""
        return self._records.audit(view, limit, verify)


__all__ = ["STAGES", "ClientView", "FileTools", "Limits", "Result", "Seen", "ToolFailure",
           "exchange_hook", "one_line"]

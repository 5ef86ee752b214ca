"""`Workspaces` — what users reach as ``ledger.workspaces``: registrations, epoch leases,
the fenced step (admit, apply, compensate, settle), reads, restore. A facade: each
method hands the ledger's `Site` (its core, places and leases) to the part that does
the work — `ledger.workspace.places`, `ledger.workspace.leases`, and the step's
lifecycle in `ledger.step` (admit, apply, fence, undo, tidy).

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
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from .errors import InvalidInput, LedgerError, LedgerMoved, UnknownWorkspace, Unsettled
from .projections.workspaces import Registration, WsRow
from .step import admit, apply, tidy, undo
from .step import observe as observing
from .step import fork as forking
from .step import rewind as rewinding
from .step.attempt import check_receipt
from .step.site import Site
from .step.values import (
    ApplyResult,
    Compensation,
    FenceMode,
    FileRead,
    KeptFile,
    Lease,
    Receipt,
    StepPlan,
    Write,
    settle_conflicts,
)
from .workspace.confined import Confined
from .workspace.core import Core
from .workspace.boundary import FileIdentity
from .workspace.directory import WorkspaceDir
from .workspace.restore import RestoreReport
from .workspace.watch import Watcher


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
        #: What the lifecycle works through: the ledger's core, places and leases.
        self.site = Site.of(core)
        #: The ledger's core (the log, the storage, the clock, the options, …).
        self.core = core
        #: Where the workspaces live (registration, the confined walk, reads).
        self.places = self.site.places
        #: Their epoch leases.
        self.leases = self.site.leases

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
        return self.places.add(name, root, allow_git=allow_git, rebind=rebind)

    def registration(self, name: str) -> Registration:
        """Where workspace `name` lives and what it may write (its newest
        `workspace-added`/`-restored`/`-rebound` event); UnknownWorkspace if never added."""
        return self.places.registration(name)

    def ledger_moved(self, name: str) -> LedgerMoved | None:
        """Why a step on workspace `name` is refused because the ledger is not where it
        was when the workspace was registered (a copied or moved project: `LedgerMoved`,
        its `command` resolves it), or None. Every step, read and walk of the workspace
        raises it (`directory`); `steptrail status` shows it. Never for a ledger in a
        database, nor for a registration that did not record the ledger's place."""
        return self.places.ledger_moved(name)

    def check_root(self, name: str, real: str, ident: FileIdentity | None) -> None:
        """Refuse a root that is, contains or lies inside another workspace's root, or is
        the ledger's own directory or inside its blob root: by resolved path, and by
        device and inode of the root (None: it does not exist yet) and of its ancestors
        (a bind mount, a case-variant name)."""
        return self.places.check_root(name, real, ident)

    def get(self, name: str) -> WsRow:
        """A workspace's row (revision, lease); UnknownWorkspace if it was never added."""
        return self.places.get(name)

    def list(self) -> builtins.list[WsRow]:
        """Every workspace's row, by name (a bare lease has no directory: not listed)."""
        return self.places.list()

    def paths(self, name: str) -> dict[str, tuple[int, str | None]]:
        """Every path a step wrote: its rev and the hash of the content it should hold."""
        return self.places.paths(name)

    def kept(self, name: str) -> builtins.list[KeptFile]:
        """The files steptrail kept in workspace `name` under a visible name
        (``NAME.steptrail-kept-TAG``) instead of removing them, as its refusals and
        compensations recorded them (`Restored.kept`), each with whether it is still on
        disk: `status` shows those still there as needing attention."""
        return self.places.kept(name)

    def directory(self, name: str) -> WorkspaceDir:
        """Workspace `name`'s directory, confined as every step's write is: the root
        reached without following symlinks and checked against its registration, the
        ledger's own files and (unless allowed) ``.git`` out of reach. For front ends
        that list or walk the workspace (the MCP tools): one walk, the library's."""
        return self.places.directory(name)

    def restore(self, workspace: str, to: str | os.PathLike[str], *,
                force: bool = False, replace: bool = False) -> RestoreReport:
        """Materialize the workspace's committed content under `to` (a new or empty
        directory; with `replace`, any directory: what held other bytes at a restored
        path is kept beside it) and record it (`ledger.workspace.restore.restore`)."""
        return self.places.restore(workspace, to, force=force, replace=replace)

    def confined(self, name: str) -> Confined:
        """Workspace `name`'s directory as a tool may list, walk, search and ``mkdir -p``
        it (`Confined`): every walk the protocol's own, under the same boundary — the
        ledger's files, ``.git`` unless the workspace allows it, no symlink followed."""
        return self.places.confined(name)

    def snapshot(self, workspace: str, path: str) -> tuple[int, str | None]:
        """What a planner reads before it plans a write: (the path's rev, the sha256 of
        its bytes on disk now, None when absent)."""
        return self.places.snapshot(workspace, path)

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
        return self.places.read_file(workspace, path, max_bytes=max_bytes)

    def lease(self, workspace: str) -> Lease:
        return self.leases.lease(workspace)

    def acquire(
        self, workspace: str, holder: str, ttl_s: float = 60, *, force: bool = False,
        bare: bool = False, resume: bool = False, observe: bool = False,
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
        restart-safe way to start (README's quickstart). `observe`: once settled, record
        the edits made to the workspace outside the steps while nobody held it (`observe`,
        as asked by ``lease:HOLDER``; its steps in `observed`): the new holder starts from
        a history that has them; what it left out is in `not_captured`. A failure to
        observe does not fail the acquire, whose lease is held from its first commit: it
        is said in `observe_error` (the next observation records those edits).
        """
        event = self.leases.begin(workspace, holder, ttl_s, force=force, bare=bare,
                                  resume=resume)
        # The epoch is ours from here on: a failure to settle one step is reported with
        # it (apply refuses with Unsettled until `settle` succeeds), never lost.
        settled, failed = undo.settle_all(self.site, workspace, event.epoch)
        seen: observing.Observation | None = None
        observe_error = None
        if observe and not bare and not failed:
            try:
                seen = observing.observe(self.site, workspace, event.epoch,
                                         by=f"lease:{holder}"[:255])
            except LedgerError as exc:  # the lease is held all the same: said, not lost
                observe_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
        return Lease(workspace=workspace, epoch=event.epoch, holder=holder,
                     expires_ns=event.expires_ns, live=True, released=False,
                     settled=tuple(c.step for c in settled), unsettled=tuple(failed),
                     conflicts=settle_conflicts(settled),
                     observed=seen.steps if seen is not None else (),
                     observed_changes=len(seen.changes) if seen is not None else 0,
                     not_captured=tuple(f"{n.path} ({n.why})" for n in seen.not_captured
                                        if n.why != "ignored") if seen is not None else (),
                     observe_error=observe_error)

    def observe(
        self, workspace: str, *, epoch: int | None = None, holder: str | None = None,
        ttl_s: float = 60, label: str = "", by: str | None = None, dry_run: bool = False,
        include_ignored: bool = False, max_file_bytes: int = observing.MAX_FILE_BYTES,
        full: bool = False,
    ) -> observing.Observation:
        """Record the changes made to the workspace outside the steps (a person's editor,
        a shell, a formatter): every regular file that differs from what the ledger knows
        — created, changed, deleted, a changed mode — as an observation step (`planned`,
        `observed`, `fenced`, manifest, ack; no byte on disk moves). Nothing changed:
        nothing is written. The workspace's first observation is its baseline.

        Under the live `epoch` of the caller's lease (only between its own steps), or,
        without one, under a lease taken for it as `holder` and released after (an
        older epoch's step in flight is settled first; a live lease of another holder is
        LeaseHeld). `by` says who asks (default ``library:USER@HOST``): an agent that
        observes its own shell edits is named, not a person. Left out and listed in
        `not_captured`: .gitignore'd files (unless `include_ignored`; git decides),
        files over `max_file_bytes`, anything not a regular file. `dry_run`: compare
        and report, record nothing. `full`: hash every file (the stat cache beside the
        ledger is a hint; a file modified within 2 s of the last look is hashed anyway).
        """
        who = by if by is not None else observing.default_by()
        kw: dict[str, Any] = dict(by=who, label=label, dry_run=dry_run,
                                  include_ignored=include_ignored,
                                  max_file_bytes=max_file_bytes, full=full)
        if epoch is not None or dry_run:
            return observing.observe(self.site, workspace, epoch or 0, **kw)
        # a look first, with no lease: nothing changed, nothing is written (not even a
        # lease); then the observation under a lease of its own, which looks again
        quick = observing.observe(self.site, workspace, 0, **{**kw, "dry_run": True})
        if not quick.changes:
            return dataclasses.replace(quick, dry_run=False)
        lease = self.acquire(workspace, holder or observing.default_holder(), ttl_s)
        try:
            if lease.unsettled:
                raise Unsettled(workspace, list(lease.unsettled))
            return observing.observe(self.site, workspace, lease.epoch, **kw)
        finally:
            with contextlib.suppress(LedgerError):
                self.release(workspace, lease.epoch)

    def rewind(
        self, workspace: str, to: str | int, *, paths: Sequence[str] | None = None,
        preview: bool = False, epoch: int | None = None, holder: str | None = None,
        ttl_s: float = 60, diffs: bool = True,
    ) -> rewinding.Rewind:
        """Put the workspace back as it was as of `to` — a step id (just after its writes)
        or a seq — for every path, or only `paths` (a path, or a directory and what is
        under it). `preview`: say what would change, with diffs, and write nothing
        (`diffs=False`: without them, for a caller that diffs only what it shows — the
        UI's preview pages its changes; a diff costs like reading both versions).

        Otherwise one fenced step (run ``rewind``) planned against what the ledger holds
        now: a file whose bytes the ledger does not hold (an edit nobody observed: listed
        in `unobserved` by the preview) fails its fence and the step is refused whole,
        nothing overwritten — observe first. Recorded, undoable, shown like any step;
        what it replaced stays in the ledger. Paths whose state then is unknown (before
        the workspace's baseline) or whose bytes were collected are left as they are and
        listed in `unreachable`. Under the live `epoch`, or a lease taken for it as
        `holder` (LeaseHeld while another is live; the lease of a rewind, fork or
        observation of this machine whose process is gone — killed midway — is taken
        over, which settles what it left: run a killed rewind again). `.git` is never
        touched.
        """
        chosen = paths  # (checked and normalized by the rewind: a bare string is refused)
        if preview:
            return rewinding.plan_rewind(self.site, workspace, to, paths=chosen, diffs=diffs)
        if epoch is not None:
            return rewinding.rewind(self.site, workspace, to, epoch, paths=chosen)
        # (a rewind killed midway left its own lease live: taken over, and what it left
        # in flight settled, so that running it again is what finishes it)
        lease = rewinding.own_lease(self, workspace,
                                    holder or observing.default_holder("rewind"), ttl_s)
        try:
            if lease.unsettled:
                raise Unsettled(workspace, list(lease.unsettled))
            return rewinding.rewind(self.site, workspace, to, lease.epoch, paths=chosen)
        finally:
            with contextlib.suppress(LedgerError):
                self.release(workspace, lease.epoch)

    def fork(self, workspace: str, at: str | int, to: str | os.PathLike[str], *,
             name: str | None = None, by: str | None = None) -> forking.Fork:
        """The workspace as of `at` (a step: just after its writes; or a seq) written into
        the new or empty directory `to` and registered as a new workspace `name` (default:
        the directory's name) of this ledger, with the recorded permission bits. Its
        first observation is its baseline, labelled with its origin (its lineage: asked
        by ``fork:<workspace>@<seq>``); the blobs are the original's, nothing is copied in
        the ledger. Paths the ledger did not know then are left out and listed. A second
        agent works in the fork under its own lease while the first goes on.

        A fork killed midway is finished by running it again into the same directory
        under the same name: what it wrote is checked and kept, its temporaries removed,
        the rest written, registered and observed; once its baseline is recorded a
        re-run answers with the fork (ledger/step/fork.py)."""
        target = os.path.realpath(os.fspath(to))
        new = forking.check_new_name(name or os.path.basename(target.rstrip("/")))
        seq, step, content, modes, unreachable = forking.plan_fork(self.site, workspace, at)
        try:
            reg = self.registration(new)
        except UnknownWorkspace:
            done = None
        else:
            done = forking.registered_fork(self.site, new, reg, target, workspace, seq)
        holder = observing.default_holder("fork")
        if done is not None:  # complete: a lease its killed run left is given back
            row = self.lease(new)
            if row.live and rewinding.holder_gone(row.holder):
                with contextlib.suppress(LedgerError):
                    self.release(new, rewinding.own_lease(self, new, holder, 60).epoch)
            return forking.Fork(workspace=new, root=target, source=workspace, at_seq=seq,
                                at_step=step, files=len(content),
                                unreachable=tuple(unreachable), baseline=done,
                                pointer=self._point(target, new))
        temps = forking.resumable(self.site, target, content)
        if temps is None:
            raise InvalidInput(f"fork target {target} exists and holds what this fork does"
                               " not write; give a new or empty directory (nothing was"
                               " written)")
        self.places.check_root(new, target, None)
        files = forking.materialize(self.site, target, content, modes, temps)
        self.add(new, target)
        lease = rewinding.own_lease(self, new, holder, 60)
        try:
            if lease.unsettled:
                raise Unsettled(new, list(lease.unsettled))
            seen = observing.observe(self.site, new, lease.epoch,
                                     by=by or f"fork:{workspace}@{seq}"[:255],
                                     label=forking.lineage(workspace, seq, step))
        finally:
            with contextlib.suppress(LedgerError):
                self.release(new, lease.epoch)
        return forking.Fork(workspace=new, root=target, source=workspace, at_seq=seq,
                            at_step=step, files=files, unreachable=tuple(unreachable),
                            baseline=seen.steps, pointer=self._point(target, new))

    def _point(self, target: str, name: str) -> str | None:
        """Write (or find written) the fork's ``.steptrail/root`` naming this ledger, last:
        commands run in the directory find the ledger, as workspace `name`
        (ledger/find.py `Pointer`). None for a ledger in a database (its URL is not
        written into a directory), or when the directory refuses it."""
        from .find import LEDGER_DIR, POINTER_FILE, write_pointer

        own = self.site.core.own
        place = own.place()  # (its directory as opened: never the working directory's)
        if place is None:
            return None
        where = os.path.join(target, LEDGER_DIR, POINTER_FILE)
        if os.path.isfile(where):
            return where
        try:
            return write_pointer(target, os.path.join(place[0], os.path.basename(own.path)),
                                 name)
        except OSError:
            return None

    def watcher(self, workspace: str, *, interval: float = 2.0,
                include_ignored: bool = False) -> Watcher:
        """A `Watcher` of the workspace's tree (`observe --watch`): it says when the tree
        may have changed — `.git`, the ledger's own directory and (unless
        `include_ignored`) the directories git ignores left unwatched. Close it after."""
        root = self.registration(workspace).root
        ignored = None if include_ignored else observing.git_ignored(root)
        ignored_dirs = ignored[1] if ignored is not None else set()
        confined = self.confined(workspace)

        def skip(rel: str) -> bool:
            name = rel.rsplit("/", 1)[-1]
            return bool(rel) and (confined.hides(name, None) or name == ".steptrail"
                                  or rel in ignored_dirs)

        return Watcher(root, skip, interval=interval)

    def heartbeat(self, workspace: str, epoch: int, ttl_s: float = 60) -> Lease:
        """Extend the live lease; an expired one is never revived (StaleEpoch)."""
        return self.leases.heartbeat(workspace, epoch, ttl_s)

    def release(self, workspace: str, epoch: int) -> Lease:
        """Give the lease up (idempotent for the same epoch)."""
        return self.leases.release(workspace, epoch)

    def unsettled(self, workspace: str, epoch: int) -> builtins.list[str]:
        """Steps of the workspace whose latest attempt, of an epoch before `epoch`, is
        still in flight (planned, fenced, blob-stored)."""
        return self.leases.unsettled(workspace, epoch)

    def settle(self, workspace: str, epoch: int) -> builtins.list[Compensation]:
        """Compensate every attempt of an older epoch still in flight, under `epoch`.

        Raises the first failure after trying every step (the others are settled)."""
        return undo.settle(self.site, workspace, epoch)

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
        return admit.plan_step(self.site, step, workspace=workspace, epoch=epoch, writes=writes, artifacts=artifacts, run=run, fence=fence, journal=journal, plan_rev=plan_rev, irreversible=irreversible)

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
        return admit.admit(self.site, workspace, epoch, plans, fence=fence, journal=journal, plan_rev=plan_rev)

    def replan(self, step: str, *, epoch: int) -> int:
        """Re-stamp the step's ended attempt onto the current revisions, as a new attempt.

        Allowed when every write's pre_hash still holds on disk; the new attempt keeps the
        writes, post-images, fence mode and the run's plan rev, and gets the path revs of
        now as its bases. Returns the new attempt number. ReplanRefused otherwise.
        """
        return admit.replan(self.site, step, epoch=epoch)

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
        return apply.apply(self.site, step, attempt, epoch=epoch, commit=commit, inline_artifacts=inline_artifacts)

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
        return undo.compensate(self.site, step, attempt, reason=reason, epoch=epoch)

    def check_receipt(self, receipt: Receipt | dict[str, Any] | bytes | str) -> Receipt:
        """Parse a receipt handed back by an executor and check it against the ledger.

        A receipt that is empty, malformed, or does not match the recorded apply is
        refused (InvalidInput / IllegalTransition): a 200 with an empty body moves nothing.
        """
        return check_receipt(self.core.log, receipt)

    def tidy(self, step: str) -> None:
        """Remove what the step's latest attempt left in its slots, once it is over (a
        kill after its commit, before the displaced files went): a re-run of a
        committed step calls it. Best effort; an attempt in flight is left alone."""
        return tidy.tidy(self.site, step)

    def remove_abandoned_temporaries(self, now: int) -> int:
        """Collect, in every workspace, the temporaries no live stager can own: those of
        an epoch older than the live one (any epoch once the lease has lapsed), and those
        of attempts that are over (a kill after the commit, before the displaced files
        went; a takeover after it). gc calls it: it reaches an attempt nobody came back
        to. It looks in the directories of the attempts in flight and of every path the
        ledger knows in the workspace. Each file goes only once its bytes are shown held
        by the ledger or by the path beside it; anything else is kept under a visible
        name (`staging.remove_temporaries`). Returns how many files went."""
        return tidy.remove_abandoned_temporaries(self.site, now)


def check_settled(ledger: Any, workspace: str, epoch: int, *, but: str = "") -> None:
    """New work starts only after the older epochs are settled (docs/design.md "Epochs
    and leases"): Unsettled while a step of an epoch older than `epoch` is still in flight
    on `workspace` (an acquire that died before its settle), step `but` aside. The core
    checks only the applied step's own epoch; a harness (the CLI's ``step plan`` and
    ``step apply``) checks this before planning or applying.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import check_settled
    >>> check_settled(ledger, "repo", lease.epoch) is None     # nothing older in flight
    True
    >>> ledger.close()
    """

    pending = [s for s in ledger.workspaces.unsettled(workspace, epoch) if s != but]
    if pending:
        raise Unsettled(workspace, pending)


__all__ = ["Workspaces", "check_settled"]

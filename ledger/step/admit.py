"""Admission: a plan recorded before anything is applied (docs/design.md "The commit
protocol", step 1). `admit` records each step's `planned` attempt — its writes with
path, base_rev, pre_hash and post-image digest, the workspace rev at dispatch, the
fence mode — with its post-images pinned and stored, in one transaction; `replan`
re-stamps an ended attempt onto the revisions of now."""

from __future__ import annotations

import builtins  # (annotations: `Workspaces.list` shadows the builtin in the class)
from collections.abc import Callable, Sequence

import msgspec

from ..blobs import Content, check_content, content_bytes, content_digest
from ..errors import BlobNotFound, InvalidInput, PlanConflict, ReplanRefused
from ..events import (
    BlobPinned,
    Compensated,
    Event,
    Fenced,
    Planned,
    PlannedWrite,
    Rejected,
    check_digest,
    check_relpath,
    check_step_id,
)
from ..projections.steps import ENDED, PLANNED
from ..store import EventQuery
from ..workspace import staging
from .attempt import read_attempt
from .observe import RUN as OBSERVED_RUN, observation_attempts
from .site import Site
from .values import FENCE_MODES, INT64_MAX, ApplyResult, FenceMode, StepPlan, Write


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


def carried_over(site: Site, workspace: str, path: str, base_rev: int,
                 now: tuple[int, str | None, int] | None, pre_hash: str | None) -> bool:
    """Whether a write planned on revision `base_rev` of `path` is recorded on the path's
    revision of `now` instead: every revision of the path since `base_rev` was made by an
    observation — edits made outside the steps, recorded as they were found (an acquire
    or an MCP server that observes at each lease, docs/time-travel.md "At each lease") —
    and the ledger's content of the path now is what the write was planned on
    (`pre_hash`). Its writer read those bytes and they are what is there: refusing it as
    stale would refuse a correct write because a person's edits were recorded. A step's
    write or an undo in between, or other bytes, is never carried over; the fence still
    checks the disk."""
    now_rev = 0 if now is None else now[0]
    if not 0 <= base_rev < now_rev or now is None or now[1] != pre_hash:
        return False
    observations = observation_attempts(site.core.log, workspace)
    since = 0 if base_rev == 0 else None  # the seq from which on the path left base_rev
    until = None  # the seq of the write that brought it to now_rev
    touched: list[tuple[int, bool]] = []  # (seq, by an observation's write)
    records = sorted((*site.core.log.read(kind="fenced", workspace=workspace),
                      *site.core.log.read(kind="compensated", workspace=workspace)),
                     key=lambda r: r.seq)  # (two kinds of the workspace's, not all of it)
    for r in records:
        event = r.event
        if isinstance(event, Fenced):
            for w in event.writes:
                if w.path == path:
                    if w.rev == base_rev:
                        since, until, touched = r.seq, None, []
                    else:
                        touched.append((r.seq, event.run == OBSERVED_RUN
                                        and (r.step, event.attempt) in observations))
                        if w.rev == now_rev:
                            until = r.seq
        elif isinstance(event, Compensated):
            if any(x.path == path for x in event.restored):
                touched.append((r.seq, False))
    if since is None or until is None:
        return False
    return all(observed for seq, observed in touched if seq <= until)


def _plan_differences(recorded: Planned | None, p: StepPlan, workspace: str,
                      fence: FenceMode, journal: bool,
                      carried: Callable[[str, int, int], bool] | None = None) -> list[str]:
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
        if w.base_rev is not None and w.base_rev != r.base_rev and not (
                carried is not None and w.base_rev < r.base_rev
                and carried(path, w.base_rev, r.base_rev)):
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


def plan_step(
    site: Site,
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
    out = admit(site, workspace, epoch, [StepPlan(step, writes, artifacts, run, irreversible)],
                     fence=fence, journal=journal, plan_rev=plan_rev)
    return out[0]


def admit(
    site: Site,
    workspace: str,
    epoch: int,
    plans: Sequence[StepPlan],
    *,
    fence: FenceMode = "step",
    journal: bool = True,
    plan_rev: int | None = None,
) -> builtins.list[ApplyResult | None]:
    """Admit a plan: a batch of steps submitted together, under the live `epoch`.
    (`Workspaces.admit` says what it promises.)"""
    if fence not in FENCE_MODES:
        raise InvalidInput(f"fence {fence!r} is not one of {', '.join(FENCE_MODES)}")
    if type(epoch) is not int or not 1 <= epoch <= INT64_MAX:
        raise InvalidInput(f"epoch {epoch!r}: a step that writes the workspace runs under a"
                           " lease; acquire one and pass its epoch")
    if not plans:
        raise InvalidInput("a plan needs at least one step")
    ws = site.places.get(workspace)
    wsdir = site.places.wsdir(ws)
    names = [p.step for p in plans]
    if len(set(names)) != len(names):
        raise InvalidInput("a plan names a step twice; give every step its own id")
    if plan_rev is None:
        plan_rev = _run_plan_rev(site, plans[0].run, workspace) if fence == "plan" else None
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
    with site.core.storage.read() as conn:
        for p in plans:
            check_step_id(p.step)
            for a in p.artifacts:
                check_relpath(a, "artifact path")
            _check_writes(p)  # a retried plan is validated like a fresh one
            for w in p.writes:  # the boundary, now: nothing is recorded for a refusal
                wsdir.check_write(w.path)
                staging.check_fits(wsdir, w.path)  # a name the disk cannot hold never applies
            row = conn.step(p.step)
            if row is not None and (row.live or row.state not in ENDED):
                # in flight or committed: a retried admission if it is the recorded
                # plan (PlanConflict otherwise). A crash between the planned commit
                # and a large post-image's file lost that file: the retry puts back
                # the bytes its recorded plan names.
                recorded = read_attempt(site.core.log, p.step, row.attempt).planned

                def carried(path: str, base: int, to: int) -> bool:
                    # (a retry of a write carried over observations when first admitted)
                    mine = next(w for w in p.writes if w.path == path)
                    return carried_over(site, workspace, path, base, (to, mine.pre_hash, 0),
                                        mine.pre_hash)

                differences = _plan_differences(recorded, p, workspace, fence, journal,
                                                carried)
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
                state = None
                if current is None:
                    state = conn.path_state(workspace, w.path)
                    current = 0 if state is None else state[0]
                base = current if w.base_rev is None else w.base_rev
                if w.path not in sim and base != current and fence == "step" \
                        and carried_over(site, workspace, w.path, base, state, w.pre_hash):
                    base = current  # only observations moved it since it was read
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
        _restore_post_images(site, again)
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
        site.core.log.append(batch, guard=site.core.guard())
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
             if n <= site.core.options.inline_max_bytes}
    large = {d: c for d, (c, n) in contents.items() if n > site.core.options.inline_max_bytes}
    # (the inline bytes are stored at the transaction's time)
    site.core.log.append([*planned, *pins], guard=site.core.guard(), inline=small)
    for d, c in large.items():  # pinned (committed) before the file is written
        site.core.storage.files.put_content(c, d)
    return [None] * len(plans)


def _restore_post_images(
    site: Site, contents: dict[tuple[str, int, str], tuple[Content, int]]
) -> None:
    """Store again each post-image an in-flight attempt planned (and pinned) whose
    bytes are missing."""
    for (step, attempt, digest), (data, size) in contents.items():
        planned = read_attempt(site.core.log, step, attempt).planned
        if planned is None or digest not in {w.post_hash for w in planned.writes}:
            continue  # not what the recorded plan says: the recorded plan stands
        small = size <= site.core.options.inline_max_bytes
        if small and site.core.blob_size(digest) is not None:
            continue  # an inline row is durable with its transaction
        if small:
            now = site.core.clock()
            inline = content_bytes(data, digest)
            with site.core.storage.transaction() as tx:
                tx.put_inline({digest: inline}, now)
        else:
            site.core.storage.files.put_content(data, digest)


def _run_plan_rev(site: Site, run: str, workspace: str) -> int | None:
    """The plan revision a run was first admitted at (fence "plan")."""
    if not run:
        return None
    query = EventQuery(kinds=frozenset({"planned"}), run=run, workspace=workspace, limit=1)
    with site.core.storage.read() as view:
        for row in view.events(query):
            event = msgspec.json.decode(row.payload)
            value = event.get("plan_rev")
            return None if value is None else int(value)
    return None


def replan(site: Site, step: str, *, epoch: int) -> int:
    """Re-stamp the step's ended attempt onto the current revisions, as a new attempt.
    (`Workspaces.replan` says what it promises.)"""

    row = site.core.steps.get(step)
    if row.live:
        raise ReplanRefused(step, "it is committed; compensate it first")
    if row.state not in ENDED:
        raise ReplanRefused(step, f"attempt {row.attempt} is still {row.state}")
    old = read_attempt(site.core.log, step, row.attempt).planned
    if old is None or not old.workspace:
        raise ReplanRefused(step, "it has no workspace writes to re-stamp")
    ws = site.places.get(old.workspace)
    wsdir = site.places.wsdir(ws)
    writes = []
    with site.core.storage.read() as conn:
        for w in old.writes:
            disk = wsdir.hash(w.path)  # a symlink or a non-file now: PathEscapes
            if disk != w.pre_hash:
                raise ReplanRefused(step, f"{w.path} no longer holds the content it was"
                                    " planned against")
            state = conn.path_state(old.workspace, w.path)
            writes.append(PlannedWrite(path=w.path, base_rev=0 if state is None else state[0],
                                       pre_hash=w.pre_hash, post_hash=w.post_hash))
    for w in writes:
        found = None if w.post_hash is None else site.core.blob_size(w.post_hash)
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
    site.core.log.append([planned, *pins], guard=site.core.guard())
    for w in writes:
        found = None if w.post_hash is None else site.core.blob_size(w.post_hash)
        if w.post_hash is not None and found is None:
            raise BlobNotFound(w.post_hash, f"the post-image of {w.path} was collected"
                               " before the new attempt pinned it; plan anew")
        if found is not None and not found[1]:
            # a file post-image whose name may never have been made durable (a failed
            # directory fsync): put it again — the dedup path fsyncs file and directory
            # (and reads nothing from the source, streamed as it would be otherwise)
            site.core.storage.files.put_stream(site.core.blob_chunks(w.post_hash), w.post_hash)
    return planned.attempt

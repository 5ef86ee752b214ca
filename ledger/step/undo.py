"""Compensation and settling (docs/design.md "The commit protocol", step 3): an
attempt ended by undoing its workspace writes where that is safe — fenced like a write:
a pre-image goes back only where the path's rev is still the attempt's and its bytes
still hash to the attempt's post-image; anything else is a ``conflict`` left as found.
`settle` compensates, under a new epoch, every attempt an older one left in flight."""

from __future__ import annotations

import builtins  # (annotations: `Workspaces.list` shadows the builtin in the class)
import contextlib
import os
from typing import Any

import msgspec

from ..blobs import digest_of, fd_chunks
from ..errors import (
    BlobCorrupt,
    BlobNotFound,
    ContentChanged,
    CompensationWindowClosed,
    IllegalTransition,
    InvalidInput,
    LedgerError,
    PathEscapes,
    StaleEpoch,
    StorageFailure,
    UnknownStep,
    WorkspaceMoved,
    WorkspaceOverlap,
)
from ..events import (
    AppliedWrite,
    Compensated,
    Compensating,
    Event,
    Planned,
    PlannedWrite,
    RecordedEvent,
    Restored,
    check_int,
)
from ..projections.steps import COMPENSATED, COMPENSATING, ENDED, REJECTED, StepRow
from ..projections.workspaces import WsRow
from ..store import EventQuery, Scope, Tx
from ..workspace import leftovers, placing, staging
from ..workspace.directory import DirectoryMoved, WorkspaceDir
from ..workspace.leftovers import Found
from ..workspace.moves import NOT_A_FILE
from ..workspace.placing import Landing
from ..workspace.staging import StagingLost
from .attempt import Attempt, read_attempt
from .draft import DRAFT_ROUNDS, Answered, Draft, Moved, shifted, step_key
from .fence import digest_or_none, dirs_of, kept_path, paths_of
from .site import Site
from .tidy import remove_temporaries, tidy
from .values import Compensation, recorded_before


def settle(site: Site, workspace: str, epoch: int) -> builtins.list[Compensation]:
    """Compensate every attempt of an older epoch still in flight, under `epoch`.
    (`Workspaces.settle` says what it promises.)"""
    check_int(epoch, "epoch", 1)
    done, failed = settle_all(site, workspace, epoch)
    if failed:
        raise failed[next(iter(failed))]
    return done


def settle_all(
    site: Site, workspace: str, epoch: int
) -> tuple[list[Compensation], dict[str, LedgerError]]:
    done: list[Compensation] = []
    failed: dict[str, LedgerError] = {}
    for step in site.leases.unsettled(workspace, epoch):
        try:
            done.append(compensate(site, step, epoch=epoch, reason=f"settled by epoch {epoch}"))
        except StaleEpoch:
            raise  # a newer epoch took over meanwhile: it settles
        except LedgerError as exc:
            failed[step] = exc
    return done, failed


def compensate(
    site: Site,
    step: str,
    attempt: int | None = None,
    *,
    reason: str = "",
    epoch: int | None = None,
) -> Compensation:
    """End the attempt, undoing its workspace writes where that is safe.
    (`Workspaces.compensate` says what it promises.)"""

    row = site.core.steps.get(step)
    attempt = row.attempt if attempt is None else attempt
    ev = read_attempt(site.core.log, step, attempt)
    planned = ev.planned
    writing = planned is not None and bool(planned.workspace) and planned.epoch > 0
    if writing and epoch is None:
        raise InvalidInput(f"step {step!r} writes workspace {planned.workspace!r}:"  # type: ignore[union-attr]
                           " give the live epoch to compensate it")
    ws_row = site.places.get(planned.workspace) if writing else None  # type: ignore[union-attr]
    wsdir = None
    landings: list[Landing] = []
    if ws_row is not None and epoch is not None:
        assert planned is not None
        wsdir = site.places.wsdir(ws_row, step, attempt, epoch)
        if row.attempt == attempt and row.state not in ENDED:
            wsdir.check_root()  # a swapped root: refused before the intent is recorded
            ev = _intend_compensation(site, planned, ev, epoch, reason)

    def build(tx: Tx, now: int) -> list[Event]:
        landings.clear()
        cur = tx.step(step)
        if cur is None:
            raise UnknownStep(step)
        if cur.attempt == attempt and cur.state == COMPENSATED or cur.attempt != attempt:
            raise Answered(answer_compensation(site, step, attempt))
        if cur.state == REJECTED:
            raise IllegalTransition(step, attempt, "compensated", "the attempt was rejected:"
                                    " nothing was applied")
        if cur.state != COMPENSATING:  # (an undo begun in its window finishes)
            _check_window(site, tx, cur, now)
        restored: list[Restored] = []
        rev = 0
        if writing:
            assert planned is not None and wsdir is not None and epoch is not None
            ws = site.leases.live_epoch(tx, planned.workspace, epoch, now)
            restored, rev = _undo(site, tx, now, planned, ev, ws, wsdir, landings)
        return [Compensated(step=step, attempt=attempt, run=cur.run, workspace=cur.workspace,
                            epoch=epoch if writing else cur.epoch, reason=reason,
                            restored=tuple(restored), rev=rev)]

    if wsdir is None:  # nothing on disk to undo: the checks and the record, one commit
        try:
            recorded = site.core.log.append(build, guard=site.core.guard(),
                                        scope=Scope(planned.workspace) if writing  # type: ignore[union-attr]
                                        else None)[0]
        except Answered as answered:
            return answered.result  # type: ignore[no-any-return]
    else:
        assert planned is not None and epoch is not None
        with site.leases.workspace_lock(planned.workspace):
            try:
                recorded = _undo_drafted(site, build, planned, epoch, landings)
            except Answered as answered:
                if recorded_before(answered.result):
                    # a redelivery: what a kill after that commit left (the slots of
                    # what the undo displaced) goes now, each once the ledger holds it
                    with contextlib.suppress(LedgerError, OSError):
                        tidy(site, step)
                return answered.result  # type: ignore[no-any-return]
    event = recorded.event
    assert isinstance(event, Compensated)
    if wsdir is not None and ws_row is not None and planned is not None:
        placing.release(wsdir, landings)  # what the undo displaced: the post-images, in the store
        remove_temporaries(site, wsdir, planned.writes, ws_row.epoch,
                           {r.path: r.digest for r in event.restored
                            if r.outcome != "conflict" and r.digest is not None})
    return Compensation(step=step, attempt=attempt, seq=recorded.seq, restored=event.restored)


def _undo_drafted(site: Site, build: Any, planned: Planned, epoch: int,
                  landings: list[Landing]) -> RecordedEvent:
    """Run an undo's `build` — its checks and its file work (`_undo`) — with no store
    lock held (a `Draft`; the epoch read again before each path), then record its
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
            draft = Draft(site.core.storage.view, site.core.clock(), site.core.steps.find,
                           before_path=lambda _path: site.leases.check_epoch(
                               name, epoch, draft.now()))
            try:
                events = build(draft, draft.time_ns)
            except (LedgerError, StagingLost) as exc:
                if isinstance(exc, StaleEpoch):
                    raise
                # a worker taken over meanwhile: the newer epoch's cleanup removed what
                # it staged, or its settle undid a path under it. That worker has lost
                # its lease — said so (StaleEpoch), not as a disk failure
                site.leases.check_epoch(name, epoch)
                if isinstance(exc, StagingLost):
                    continue  # removed by something else: decided again from the disk
                raise
            finally:
                kept += landings

            def record(tx: Tx, now: int, draft: Draft = draft,
                       events: list[Event] = events) -> list[Event]:
                cur = site.core.steps.in_tx(tx, step)
                if step_key(cur) != draft.steps.get(step):
                    raise Moved(f"step {step!r} moved on")
                ws = site.leases.live_epoch(tx, name, epoch, now)
                if cur is not None and cur.state != COMPENSATING:
                    _check_window(site, tx, cur, now)
                why = draft.moved(tx)
                if why is not None:
                    raise Moved(why)
                draft.flush(tx, now)
                return shifted(events, draft.rev_shift(name, ws))

            try:
                return site.core.log.append(record, guard=site.core.guard(),
                                        scope=Scope(name))[0]
            except Moved:
                continue
        raise StorageFailure(name, f"step {step!r} attempt {attempt}: the workspace moved"
                             f" under its undo {DRAFT_ROUNDS} times; compensate again")
    finally:
        landings[:] = kept


def _check_window(site: Site, tx: Tx, cur: StepRow, now: int) -> None:
    """A committed step may be compensated only within the compensation window."""
    if not cur.live:
        return
    published = max((r.time_ns for r in tx.events(EventQuery(
        step=cur.step_id, kinds=frozenset({"manifest-published"})))), default=None)
    age_s = (now - (published or now)) / 1e9
    if age_s > site.core.options.compensation_window_s:
        raise CompensationWindowClosed(cur.step_id, age_s, site.core.options.compensation_window_s)


def _intend_compensation(site: Site, planned: Planned, ev: Attempt, epoch: int,
                         reason: str) -> Attempt:
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
            raise Answered(None)  # ended, or an undo began meanwhile
        _check_window(site, tx, cur, now)
        site.leases.live_epoch(tx, planned.workspace, epoch, now)
        return [intent]

    with contextlib.suppress(Answered):
        site.core.log.append(build, guard=site.core.guard(), scope=Scope(planned.workspace))
    return read_attempt(site.core.log, planned.step, planned.attempt)


def answer_compensation(site: Site, step: str, attempt: int) -> Compensation:
    ev = read_attempt(site.core.log, step, attempt)
    if ev.end is not None and isinstance(ev.end[1], Compensated):
        return Compensation(step=step, attempt=attempt, seq=ev.end[0],
                            restored=ev.end[1].restored, deduped=True)
    raise IllegalTransition(step, attempt, "compensated", "it is not the latest attempt")


def _undo(
    site: Site,
    tx: Tx,
    now: int,
    planned: Planned,
    ev: Attempt,
    ws: WsRow,
    wsdir: WorkspaceDir,
    landings: list[Landing],
) -> tuple[list[Restored], int]:
    """Put pre-images back where safe (under the lock). Returns (per path, new rev).

    A write the attempt recorded (`fenced`) is judged against that record and undone
    by an exchange checked like a write's (`placing.land`): the post-image must
    be what it displaces. A write it never recorded — a crashed apply — is undone
    only where its slot shows it landed (`leftovers.landed`), from the bytes it
    displaced, which are stored first (the compensation names them). An undo killed
    before (its intent's epoch) may have displaced a person's save: that goes back.
    """

    name = planned.workspace
    applied: dict[str, AppliedWrite] = {}
    for _, fenced in ev.fenced:
        for w in fenced.writes:
            applied[w.path] = w  # journal off: the latest application of a path
    crashed = site.places.wsdir(ws, planned.step, planned.attempt, planned.epoch)
    crashed.planned = paths_of(planned)
    intent = ev.compensating[1].epoch if ev.compensating is not None else None
    undone_by = site.places.wsdir(ws, planned.step, planned.attempt, intent) \
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
            _finish_cut_undo(undone_by, w.path, applied.get(w.path, w))
        deleted = applied.get(w.path)
        if deleted is not None and deleted.post_hash is None and deleted.pre_hash is not None \
                and path_rev == deleted.rev and wsdir.has_dir(w.path) \
                and any(str(row[1]).startswith(w.path + "/") for row in tx.path_rows()
                        if row[0] == name):
            # the step deleted a file, and directories the ledger knew files in stand
            # at its name, holding nothing now (a rewind put `a/b` back where the file
            # `a` was, and its undo emptied them): they go — rmdir, only while empty —
            # and the file comes back. Holding anything, or a person's own (the ledger
            # never knew a file in them), they stay whole and the path is a conflict.
            wsdir.remove_empty_dirs(w.path)
        try:
            disk = wsdir.hash(w.path)
        except (WorkspaceMoved, WorkspaceOverlap):
            raise  # the root itself is not the workspace's: refuse, record nothing
        except (PathEscapes, InvalidInput):  # a symlink, a directory, a forbidden path
            out.append(Restored(path=w.path, rev=path_rev, digest=None, outcome="conflict"))
            continue
        if src is not None and any(r.path == src and r.outcome == "conflict" for r in out):
            # a move's destination whose source could not be put back: kept as is
            out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk),
                                outcome="conflict"))
            continue
        a = applied.get(w.path)
        if a is None:  # never recorded: did a crashed apply land it?
            found = leftovers.landed(crashed, w.path, w.pre_hash, w.post_hash, search=True,
                                     mode=w.mode)
            if not found.landed:
                if disk == w.post_hash and w.post_hash != w.pre_hash \
                        and path_rev == w.base_rev:
                    # its bytes are there with no sign this attempt put them: a
                    # person may have; left for a human
                    out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk),
                                        outcome="conflict"))
                continue
            if path_rev != w.base_rev:
                out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk),
                                    outcome="conflict"))
                continue
            if found.displaced is not None and found.displaced != NOT_A_FILE:
                _keep_displaced(site, tx, crashed, found, inline)
            # the pre-image, stored now, may stay in its slot for the collection
            # after the commit; anything else (a person's save the crashed call met)
            # that cannot go back is kept visible
            stored = found.displaced == w.pre_hash and found.displaced is not None
            taken = placing.roll_back(crashed, found, w.post_hash, displaced_stored=stored,
                                      post_mode=w.mode)
            if taken.ok:
                ok = found.displaced == w.pre_hash
                out.append(Restored(path=w.path, rev=path_rev + 1,
                                    digest=digest_or_none(found.displaced),
                                    outcome="restored" if ok else "conflict",
                                    mode=wsdir.mode(w.path),
                                    kept=kept_path(w.path, taken)))
            else:
                out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(taken.now),
                                    outcome="conflict", kept=kept_path(w.path, taken)))
            continue
        pre, post, expected_rev = a.pre_hash, a.post_hash, a.rev
        if path_rev != expected_rev:
            out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk), outcome="conflict"))
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
                staged = None if pre is None else staging.stage(
                    wsdir, w.path, site.core.blob_chunks(pre), mode=a.pre_mode, slot="u")
            except (BlobNotFound, BlobCorrupt, DirectoryMoved):
                # (DirectoryMoved: the directory the undo made again for a delete's
                # pre-image removed or renamed under it, by a person: left as found)
                out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk),
                                    outcome="conflict"))
                continue
            landing = placing.land(wsdir, w.path, staged, post, role="u")
            if not landing.ok:
                if staged is not None:
                    staging.discard(wsdir, staged)
                if landing.found is None and landing.moved is None and landing.kept is None \
                        and undone_by is not None and pre is not None \
                        and _finish_cut_undo(undone_by, w.path, a):
                    # the name empty: the other undoer (a worker whose epoch this one
                    # took over, still running) moved the step's file aside between
                    # this one's look and its landing — its landing, finished (or its
                    # refusal, given back) as one a kill cut there, is judged as found
                    try:
                        disk = wsdir.hash(w.path)
                    except (PathEscapes, InvalidInput):
                        disk = NOT_A_FILE
                    out.append(_found_undone(site, tx, wsdir, undone_by, w.path, a,
                                             path_rev, inline) if disk == pre else
                               Restored(path=w.path, rev=path_rev,
                                        digest=digest_or_none(disk), outcome="conflict"))
                    continue
                if landing.kept is not None:
                    # a save made during the landing's refusal, kept beside the path
                    # under a visible name: the record names it
                    out.append(Restored(path=w.path, rev=path_rev,
                                        digest=digest_or_none(landing.found),
                                        outcome="conflict", kept=kept_path(w.path, landing)))
                    continue
                parent = w.path.rpartition("/")[0]
                if landing.found == pre and pre != post and landing.moved is None \
                        and (pre is not None or wsdir.has_dir(parent)):
                    # another undoer of this attempt (a worker whose epoch this one
                    # took over, still running) put the pre-image back between this
                    # one's look and its landing: the path is undone — judged as one
                    # found undone (a person's save its landing displaced goes back)
                    out.append(_found_undone(site, tx, wsdir, undone_by, w.path, a,
                                             path_rev, inline))
                    continue
                out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(landing.found),
                                    outcome="conflict"))
                continue
            landings.append(landing)
            # the mode recorded with the pre-image goes back — unless a person
            # chmodded the step's file since (its bits are not the ones the step
            # gave it): a person's chmod is theirs, kept on the file put back, as a
            # take-back keeps it
            mode = None if staged is None else \
                placing.keep_persons_mode(wsdir, w.path, landing.displaced, a.post_mode,
                                        staged.identity)
            out.append(Restored(path=w.path, rev=path_rev + 1, digest=pre,
                                outcome="restored", mode=mode))
        elif disk == pre:
            out.append(_found_undone(site, tx, wsdir, undone_by, w.path, a, path_rev,
                                     inline))
        else:
            out.append(Restored(path=w.path, rev=path_rev, digest=digest_or_none(disk), outcome="conflict"))
    if inline:
        tx.put_inline(inline, now)
    # a directory moved after the kill, where the settle found the crashed writes:
    # the attempt's temporaries there are collected too
    wsdir.also_dirs |= leftovers.moved_dirs(crashed)
    if undone_by is not None and any(not wsdir.has_dir(d) for d in dirs_of(planned)):
        # an undo killed while a directory it staged into was renamed: its
        # temporaries went with the directory (one search of the workspace)
        wsdir.also_dirs |= leftovers.moved_dirs(undone_by, search=True)
    rank = {w.path: i for i, w in enumerate(reversed(planned.writes))}
    out.sort(key=lambda r: rank[r.path])  # the record lists paths in undo order
    placing.sync_dirs(wsdir, [r.path for r in out if r.outcome != "conflict"])
    # the fold assigns revs in event order: renumber the moved entries in order
    moved = [r for r in out if r.outcome != "conflict"]
    renumbered = {id(r): ws.rev + i for i, r in enumerate(moved, 1)}
    out = [msgspec.structs.replace(r, rev=renumbered[id(r)]) if id(r) in renumbered else r
           for r in out]
    return out, (ws.rev + len(moved)) if moved else 0


def _finish_cut_undo(undone_by: WorkspaceDir, path: str,
                     done: AppliedWrite | PlannedWrite) -> bool:
    """An undo of `path` by another epoch's undoer (`undone_by`: killed, or a stale
    worker still running) cut mid-landing without the exchange call — its file aside,
    the pre-image not yet linked in: finished — or, when it was refusing (a person's
    save moved aside), given back. `done`: what it undoes (the applied write's images,
    which a fence "none" may have made other than the plan's). True when either was
    done."""
    with contextlib.suppress(LedgerError):
        return placing.finish_aside(undone_by, path, "u", done.post_hash) \
            or placing.put_aside_back(undone_by, path, "u", done.post_hash, done.pre_hash)
    return False


def _found_undone(site: Site, tx: Tx, wsdir: WorkspaceDir, undone_by: WorkspaceDir | None,
                  path: str, a: AppliedWrite, path_rev: int,
                  inline: dict[str, bytes]) -> Restored:
    """A path whose disk holds the attempt's pre-image: put back by an undo that did
    not record it — one killed before its commit, or one still running under an epoch
    this undo took over. Was a person's save displaced by it (its slot holds neither
    image)? That goes back, and the path is a ``conflict`` naming it; otherwise the
    path is ``already`` undone."""
    pre, post = a.pre_hash, a.post_hash
    if undone_by is not None:
        f = leftovers.landed(undone_by, path, post, pre, role="u", search=True)
        if f.landed and f.displaced not in (post, NOT_A_FILE):
            if f.displaced is not None:
                _keep_displaced(site, tx, undone_by, f, inline)
            taken = placing.roll_back(undone_by, f, pre, post_mode=a.pre_mode)
            if taken.ok:
                return Restored(path=path, rev=path_rev, digest=f.displaced,
                                outcome="conflict", kept=kept_path(path, taken))
        elif f.landed and f.displaced == post:
            # the other undo displaced the step's file: a person's chmod of it is
            # carried over, as the undo would have
            placing.keep_persons_mode(undone_by, path, f.slot, a.post_mode)
    wsdir.sync(path)  # durable, then recorded
    return Restored(path=path, rev=path_rev + 1, digest=pre, outcome="already",
                    mode=wsdir.mode(path))


def _keep_displaced(site: Site, tx: Tx, wsdir: WorkspaceDir, found: Found,
                    inline: dict[str, bytes]) -> None:
    """Store what a crashed write displaced (its slot's bytes) before it goes back:
    the compensation record names it, and names only what the store holds."""
    d = found.displaced
    if d is None or d in inline or tx.blob_size(d) is not None or found.slot is None:
        return
    with leftovers.open_slot(wsdir, found.path, found.slot) as fd:
        if fd is None:
            return
        if os.fstat(fd).st_size <= site.core.options.inline_max_bytes:
            data = b"".join(fd_chunks(fd))
            if digest_of(data) == d:
                inline[d] = data
            return
        with contextlib.suppress(ContentChanged):
            site.core.storage.files.put_stream(fd_chunks(fd), d)

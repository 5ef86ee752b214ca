"""The fence and the exchanges of an apply, with no store lock held (`fence`): the
journal, the live epoch, the revs and the bytes on disk checked; each path put in place
by an atomic exchange after a read of the live epoch, what it displaced checked after;
a refusal rolls back every path before it (`roll_back`, each displaced file back where
it was if the path still holds what the write put there) and records why."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from ..blobs import digest_of, fd_chunks
from ..errors import PathEscapes, StaleEpoch, StorageFailure, Unsettled
from ..events import AppliedWrite, TEXT_MAX, BlobPinned, Event, Fenced, Planned, Rejected, Restored
from ..projections.steps import ENDED, PLANNED
from ..projections.workspaces import WsRow
from ..store import Tx
from ..workspace import leftovers, placing
from ..workspace.directory import WorkspaceDir
from ..workspace.leftovers import Found
from ..workspace.moves import ANY_FILE, NOT_A_FILE
from ..workspace.placing import Landing, TakeBack
from ..workspace.staging import Staged
from .attempt import end_result, read_attempt
from .draft import Answered, Draft
from .site import Site
from .values import ApplyResult, receipt_of


def fence(
    site: Site,
    tx: Draft,
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
    """The checks and the exchanges, with no store lock held: `tx` is a `Draft`,
    whose reads `_recheck` checks again in the transaction that records the events
    returned (`fenced` with its pins, or `rejected`).

    Each path is put in place by an atomic exchange (`placing.land`), after a
    read of the live epoch (a takeover stops the landings: StaleEpoch, and the caller
    takes back what landed), and what it displaced is checked after: the first path
    whose displaced bytes are not its pre-image rolls back every path before it and
    rejects the attempt. A write a crashed call of this attempt landed
    (`leftovers.landed`: its slot holds what it displaced) is checked the same way
    and recorded (`settled`), or rolled back with the rest. The displaced pre-images
    are stored (large ones now, small ones as rows of the recording transaction) and
    pinned there; their files stay on disk until it has committed (`release`)."""
    step, name = planned.step, planned.workspace
    cur = tx.step(step)
    assert cur is not None
    if planned.journal:
        hit = tx.journal_lookup(key)
        if hit is not None:
            ev = read_attempt(site.core.log, step, attempt)
            if cur.attempt == attempt and cur.state not in ENDED:
                fenced = msgspec.json.decode(hit.payload, type=Fenced)
                raise Answered(ApplyResult(verdict="deduped", step=step, attempt=attempt,
                                            receipt=receipt_of(fenced, hit[0])))
            raise Answered(end_result(step, attempt, ev))
    # Not a redelivery of an apply that happened: a new effect, so the epoch first
    # (a zombie hears StaleEpoch even when its attempt was settled meanwhile).
    ws = site.leases.live_epoch(tx, name, epoch, now)
    if cur.attempt != attempt or cur.state in ENDED:
        raise Answered(end_result(step, attempt, read_attempt(site.core.log, step, attempt)))
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
                placing.finish_aside(wsdir, w.path, "x", w.pre_hash if check else ANY_FILE)
    wsdir.planned = paths_of(planned)
    found = {w.path: leftovers.landed(wsdir, w.path, w.pre_hash, w.post_hash, mode=w.mode)
             for w in planned.writes} if recordable and planned.journal else {}

    order = {w.path: i for i, w in enumerate(planned.writes)}

    def reject(reason: str, detail: str, **facts: Any) -> list[Event]:
        verdict = ApplyResult(verdict=f"rejected:{reason}", step=step, attempt=attempt,
                              detail=detail, facts=facts)
        if not recordable:  # journal off, attempt already applied: answer, record nothing
            raise Answered(verdict)
        met = facts.pop("met", None)
        holder.append(verdict)
        # Whatever landed — in this call or a crashed one — goes back, newest first.
        undone = roll_back(tx, planned, wsdir, found, landings)
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
            site.leases.check_epoch(name, epoch, tx.now())  # a takeover since: StaleEpoch
            landing = placing.land(wsdir, w.path, staged.get(w.path), w.pre_hash, check=check)
        if landing.moved is not None:
            d = w.path.rpartition("/")[0]
            went = f" (it is now {landing.moved})" if landing.moved else ""
            return reject("pre_hash", f"{w.path}: its directory {d} was renamed or moved"
                          f" while the step ran{went}; nothing was written there and"
                          " nothing of the step was left applied", path=w.path,
                          moved=landing.moved)
        if not landing.ok:
            met = None if landing.kept is None else Restored(
                path=w.path, rev=w.base_rev, digest=digest_or_none(landing.found),
                outcome="conflict", kept=kept_path(w.path, landing))
            return reject("pre_hash", f"{w.path} on disk does not hold the content it"
                          " was planned against", path=w.path, on_disk=landing.found,
                          pre_hash=w.pre_hash, post_hash=w.post_hash, met=met)
        landings.append(landing)
        applied.append(AppliedWrite(path=w.path, rev=rev,
                                    pre_hash=w.pre_hash if check else landing.found,
                                    post_hash=w.post_hash, pre_mode=landing.pre_mode,
                                    post_mode=landing.post_mode))
    placing.sync_dirs(wsdir, [w.path for w in planned.writes])
    pins = keep_pre_images(site, tx, now, planned, applied, landings, pre_bytes, wsdir)
    return [*pins, Fenced(step=step, attempt=attempt, run=planned.run, workspace=name,
                          epoch=epoch, writes=tuple(applied), rev=rev, settled=settled,
                          journal=planned.journal)]


def keep_pre_images(
    site: Site, tx: Tx, now: int, planned: Planned, applied: Sequence[AppliedWrite],
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
        with leftovers.open_slot(wsdir, a.path, landing.displaced or "") as fd:
            if fd is None:
                raise StorageFailure(os.path.join(wsdir.root, a.path),
                                     "the displaced pre-image went missing before it was"
                                     " stored; apply again")
            if os.fstat(fd).st_size <= site.core.options.inline_max_bytes:
                data = b"".join(fd_chunks(fd))
                if digest_of(data) != d:
                    raise StorageFailure(os.path.join(wsdir.root, a.path),
                                         "the displaced pre-image changed before it was"
                                         " stored; apply again")
                inline[d] = data
            else:
                site.core.storage.files.put_stream(fd_chunks(fd), d)
    if inline:
        tx.put_inline(inline, now)
    return [BlobPinned(step=planned.step, attempt=planned.attempt, run=planned.run,
                       workspace=planned.workspace, epoch=planned.epoch, digest=d,
                       role="pre-image") for d in digests]


def roll_back(
    tx: Tx, planned: Planned, wsdir: WorkspaceDir, found: dict[str, Found],
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
        back[landing.path] = (placing.unland(wsdir, landing, posts[landing.path]), landing.found)
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
                f = leftovers.landed(wsdir, w.path, w.pre_hash, w.post_hash, search=True,
                                     mode=w.mode)
            if not f.landed:
                if f.now == w.post_hash and w.post_hash != w.pre_hash and f.now is not None:
                    # its bytes are there with no sign this attempt put them (a person
                    # may have): left as found, and said so
                    out.append(Restored(path=w.path, rev=w.base_rev, digest=f.now,
                                        outcome="conflict"))
                continue
            back[w.path] = (placing.roll_back(wsdir, f, w.post_hash, post_mode=w.mode),
                            f.displaced)
        taken, displaced = back[w.path]
        kept = kept_path(w.path, taken)
        if taken.ok:
            out.append(Restored(path=w.path, rev=w.base_rev, digest=digest_or_none(displaced),
                                outcome="restored" if displaced == w.pre_hash
                                else "conflict", kept=kept))
        else:
            out.append(Restored(path=w.path, rev=w.base_rev, digest=digest_or_none(taken.now),
                                outcome="conflict", kept=kept))
    return tuple(reversed(out))


def digest_or_none(found: str | None) -> str | None:
    """A digest to record for what a path holds (None: absent, or not a regular file)."""
    return None if found == NOT_A_FILE else found


def kept_path(path: str, taken: TakeBack | Landing) -> str | None:
    """The workspace-relative path of the file a take-back or a landing kept (beside
    `path`, in the directory where it is now)."""
    if taken.kept is None:
        return None
    d = taken.moved if taken.moved else path.rpartition("/")[0]
    return taken.kept if d in ("", ".") else f"{d}/{taken.kept}"


def paths_of(planned: Planned) -> frozenset[str]:
    """The paths a plan writes."""
    return frozenset(w.path for w in planned.writes)


def dirs_of(planned: Planned) -> frozenset[str]:
    """The directories (relative; "" the root) of a plan's paths."""
    return frozenset(w.path.rpartition("/")[0] for w in planned.writes)

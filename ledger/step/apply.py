"""The fenced apply (docs/design.md "The commit protocol", step 2): with no store lock
held, the pre-images on disk are stored and the post-images staged; then the checks
and the exchanges (`ledger.step.fence`); then one transaction checks again what may
have moved (the journal, the live epoch, the attempt, the revs) and records `fenced` —
with `commit=True`, the manifest and the ack too (`commit_events`). A takeover during
the file work is seen at the next landing or at the commit: what landed is taken back,
and the caller hears StaleEpoch.

A crash between a rename and the `fenced` commit is settled when the attempt is
applied again under the same epoch (the post-image on disk with the path rev still at
base is recorded, `settled=True`), or by the next epoch's settling (which compensates
it)."""

from __future__ import annotations

import contextlib
import os

import msgspec

from ..blobs import digest_of, fd_chunks
from ..errors import (
    BlobNotFound,
    ContentChanged,
    DatabaseUnavailable,
    IllegalTransition,
    InvalidInput,
    LedgerError,
    StaleEpoch,
    StorageFailure,
)
from ..events import (
    Acked,
    BlobStored,
    Event,
    Fenced,
    Manifest,
    ManifestEntry,
    ManifestPublished,
    Planned,
    RecordedEvent,
    Rejected,
    journal_key,
    manifest_digest,
)
from ..projections.steps import ENDED, PLANNED, StepRow
from ..store import EventQuery, Scope, Tx
from ..workspace import leftovers, placing, staging
from ..workspace.directory import DirectoryMoved, WorkspaceDir
from ..workspace.placing import Landing
from ..workspace.staging import Staged, StagingLost
from .attempt import end_result, read_attempt
from .draft import DRAFT_ROUNDS, Answered, Draft, Moved, shifted, step_key
from .fence import fence, paths_of
from .site import Site
from .tidy import remove_temporaries
from .values import ApplyResult, receipt_of


def apply(site: Site, step: str, attempt: int | None = None, *, epoch: int,
          commit: bool = False, inline_artifacts: dict[str, bytes] | None = None
          ) -> ApplyResult:
    """Fence and apply the attempt's writes under the live `epoch` (see the module).
    (`Workspaces.apply` says what it promises.)"""

    row = site.core.steps.get(step)
    attempt = row.attempt if attempt is None else attempt
    ev = read_attempt(site.core.log, step, attempt)
    planned = ev.planned
    if planned is None:
        raise IllegalTransition(step, attempt, "fenced", "the attempt was never planned")
    if not planned.workspace or planned.epoch == 0:
        raise InvalidInput(f"step {step!r} writes no workspace; store its artifacts and"
                           " publish it instead")
    ws = site.places.get(planned.workspace)
    if planned.epoch > epoch:
        # an attempt a newer epoch planned is not this caller's to apply, nor to hear
        # about as if it were its own (a zombie retrying `apply` after a takeover
        # re-ran the step): StaleEpoch, before any journal answer
        live = ws.live_epoch(site.core.clock())
        raise StaleEpoch(planned.workspace, epoch, live, f"attempt {attempt} of step"
                         f" {step!r} was planned under epoch {planned.epoch}",
                         latest=ws.epoch, holder=ws.holder)
    wsdir = site.places.wsdir(ws, step, attempt, epoch)
    key = journal_key(Fenced(step=step, attempt=attempt, workspace=planned.workspace))
    fresh = row.attempt == attempt and row.state == PLANNED
    name = planned.workspace
    staged: dict[str, Staged] = {}
    landings: list[Landing] = []
    pre_bytes: dict[str, bytes] = {}
    recorded: list[RecordedEvent] = []
    built: list[bool] = []
    with site.leases.workspace_lock(name):  # (this process's threads: in turn)
        try:
            # A dead epoch stages nothing (staging creates parent directories: no new
            # effect under it); the checks below refuse it (StaleEpoch).
            if (fresh or not planned.journal) and ws.live_epoch(site.core.clock()) == epoch \
                    and epoch == planned.epoch:
                remove_temporaries(site, wsdir, planned.writes, ws.epoch)
                pre_bytes = store_pre_images(site, planned, wsdir)
                wsdir.planned = paths_of(planned)
                # a directory the plan edits or deletes in, gone from its name: no
                # directory is made again for any write in it (the fence refuses)
                wsdir.gone_dirs = frozenset(
                    d for d in {w.path.rpartition("/")[0] for w in planned.writes
                                if w.pre_hash is not None} if not wsdir.has_dir(d))
                for w in planned.writes:
                    if w.path.rpartition("/")[0] in wsdir.gone_dirs:
                        continue
                    if w.post_hash is None or (planned.journal and leftovers.landed(
                            wsdir, w.path, w.pre_hash, w.post_hash, mode=w.mode).landed):
                        continue  # a crashed call's landed write: its slot is the evidence
                    # copied piece by piece, verified by the end of the copy, under the
                    # path's slot name, with its final mode before any name shows it
                    # the fence decides (below)
                    with contextlib.suppress(StagingLost, DirectoryMoved):
                        staged[w.path] = staging.stage(
                            wsdir, w.path, site.core.blob_chunks(w.post_hash), mode=w.mode,
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
                draft = Draft(site.core.storage.view, site.core.clock(), site.core.steps.find)
                try:
                    events = fence(site, draft, draft.time_ns, planned, attempt, epoch,
                                         key, ws, wsdir, staged, holder, pre_bytes, landings)
                except Answered as answered:
                    return answered.result  # type: ignore[no-any-return]
                except LedgerError as exc:
                    # a takeover under the file work: what this call landed goes back
                    # (each path only if it still holds what was put there)
                    if landings and (isinstance(exc, StaleEpoch)
                                     or site.leases.epoch_live(name, epoch) is False):
                        take_back(wsdir, planned, landings)
                        if not isinstance(exc, StaleEpoch):
                            raise site.leases.stale(name, epoch) from exc
                    raise

                def build(tx: Tx, now: int, draft: Draft = draft,
                          events: list[Event] = events) -> list[Event]:
                    built.clear()
                    out = recheck(site, tx, now, draft, events, planned, attempt, epoch,
                                        key)
                    if commit and isinstance(out[-1], Fenced):
                        cur = site.core.steps.in_tx(tx, planned.step)
                        assert cur is not None
                        out += commit_events(tx, now, planned, out[-1],
                                              inline_artifacts or {}, cur)
                    built.append(True)
                    return out

                try:
                    recorded = site.core.log.append(build, guard=site.core.guard(),
                                                scope=Scope(name))
                except Answered as answered:
                    return answered.result  # type: ignore[no-any-return]
                except StaleEpoch:
                    take_back(wsdir, planned, landings)
                    raise
                except Moved:
                    # what the checks read moved under the file work (another step
                    # wrote a path, the attempt ended): take back, decide again
                    take_back(wsdir, planned, landings)
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
                take_back(wsdir, planned, landings)
            raise
        finally:
            done = any(isinstance(r.event, Fenced) for r in recorded)
            if done:  # recorded: what the writes displaced goes (the store holds it)
                placing.release(wsdir, landings)
            for path, s in staged.items():
                if not any(x.path == path and x.ok for x in landings):
                    staging.discard(wsdir, s)
            if not done:  # refused or failed: take back the directories staging made
                staging.remove_created_dirs(wsdir)


def recheck(site: Site, tx: Tx, now: int, draft: Draft, events: list[Event],
             planned: Planned, attempt: int, epoch: int, key: str) -> list[Event]:
    """In the transaction that records an apply's draft: the checks again, on what
    may have moved while its files were worked on with no lock held — the journal,
    the live epoch (StaleEpoch), the attempt's state and, for `fenced`, every path
    rev and blob the fence read (`Moved`). Returns the draft's events with their
    revs after the workspace's rev of now (writes to other paths committed
    meanwhile move them), its inline bytes written."""
    step, name = planned.step, planned.workspace
    if planned.journal and tx.journal_lookup(key) is not None:
        answer = journal_answer(site, tx, planned, attempt)
        if answer.verdict == "deduped":
            # another call of this attempt recorded its apply meanwhile (the same
            # writes: what landed is what it recorded): its answer
            raise Answered(answer)
        raise Moved(f"step {step!r} moved on")  # and ended: taken back, then answered
    ws = site.leases.live_epoch(tx, name, epoch, now)
    if step_key(site.core.steps.in_tx(tx, step)) != draft.steps.get(step):
        raise Moved(f"step {step!r} moved on")
    if isinstance(events[-1], Fenced):
        seen = draft.workspaces.get(name)
        if planned.fence == "plan" and seen is not None and seen.rev != ws.rev:
            raise Moved(f"workspace {name} moved from rev {seen.rev} to {ws.rev}")
        why = draft.moved(tx)
        if why is not None:
            raise Moved(why)
    draft.flush(tx, now)
    return shifted(events, draft.rev_shift(name, ws))


def journal_answer(site: Site, tx: Tx, planned: Planned, attempt: int) -> ApplyResult:
    """The answer of an attempt whose apply the journal holds (a redelivery)."""
    step = planned.step
    cur = site.core.steps.in_tx(tx, step)
    hit = tx.journal_lookup(journal_key(Fenced(step=step, attempt=attempt,
                                               workspace=planned.workspace)))
    assert cur is not None and hit is not None
    if cur.attempt == attempt and cur.state not in ENDED:
        fenced = msgspec.json.decode(hit.payload, type=Fenced)
        return ApplyResult(verdict="deduped", step=step, attempt=attempt,
                           receipt=receipt_of(fenced, hit[0]))
    return end_result(step, attempt, read_attempt(site.core.log, step, attempt))


def take_back(wsdir: WorkspaceDir, planned: Planned,
               landings: list[Landing]) -> None:
    """Take back, newest first, what this call landed and did not record: each path
    only if it still holds what was put there (`placing.unland`; otherwise it is
    left as found — a settle took it back already, or a later write is there)."""
    posts = {w.path: w.post_hash for w in planned.writes}
    for landing in reversed(landings):
        with contextlib.suppress(LedgerError, OSError):
            placing.unland(wsdir, landing, posts[landing.path])
    landings.clear()


def store_pre_images(site: Site, planned: Planned, wsdir: WorkspaceDir) -> dict[str, bytes]:
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
            if os.fstat(fd).st_size <= site.core.options.inline_max_bytes:
                data = b"".join(fd_chunks(fd))
                if digest_of(data) == w.pre_hash:
                    small[w.pre_hash] = data
                continue
            if site.core.blob_size(w.pre_hash) is None:
                with contextlib.suppress(ContentChanged):
                    site.core.storage.files.put_stream(fd_chunks(fd), w.pre_hash)
    return small


def commit_events(tx: Tx, now: int, planned: Planned, fenced: Fenced,
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
    # The post-images' sizes are read before the inline rows are written: a store that
    # takes a shared lock at its first write (PostgreSQL's chain lock) holds it for
    # fewer round trips.
    entries = []
    for w in sorted(fenced.writes, key=lambda w: w.path):
        if w.post_hash is None:
            continue
        found = (len(rows[w.post_hash]), True) if w.post_hash in rows else \
            tx.blob_size(w.post_hash)
        if found is None:
            raise BlobNotFound(w.post_hash, f"the post-image of {w.path} is gone")
        entries.append(ManifestEntry(path=w.path, digest=w.post_hash, size=found[0]))
    if rows:
        tx.put_inline(rows, now)
    writes = tuple(entries)
    artifacts = tuple(stored[p] for p in sorted(planned.artifacts))
    rev = cur.manifest_rev + 1
    return [*events,
            ManifestPublished(**common, manifest_rev=rev, expected_rev=-1,
                              digest=manifest_digest(planned.step, writes, artifacts),
                              writes=writes, artifacts=artifacts),
            Acked(**common, manifest_rev=rev)]

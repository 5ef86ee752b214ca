"""The artifact protocol, in the order that makes it durable:

    local write -> pin -> durable blobs -> blob-stored -> manifest (commit point) -> ack

`plan` starts an attempt (or returns the one in flight), `pin` holds a blob before it
is written, `store` makes an artifact's bytes durable and records it, `publish` is the
commit point (a compare-and-swap on the manifest revision), `ack` records that the
caller learned it. `step_in_one_commit` and `store_and_publish` are the runner's fast
paths: the same events, in one transaction. Functions over the ledger's `Site`;
``Ledger.plan``/``pin``/``store``/``publish``/``ack``/``manifest`` are their facade.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..blobs import Content, check_content, content_bytes, content_digest
from ..errors import (
    BlobNotFound,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    ManifestConflict,
    StaleEpoch,
)
from ..events import (
    Acked,
    BlobPinned,
    BlobStored,
    Built,
    Event,
    Manifest,
    ManifestEntry,
    ManifestPublished,
    Planned,
    RecordedEvent,
    check_relpath,
    decode,
    journal_key,
    manifest_digest,
)
from ..projections.steps import ENDED, StepRow
from ..store import Tx
from .attempt import check_receipt, read_attempt
from .site import Site
from .values import Receipt


def artifact_bytes(path: str, data: object) -> bytes:
    """An artifact's bytes, its path checked (InvalidInput naming the problem)."""
    check_relpath(path, "artifact path")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidInput(f"the bytes of artifact {path!r} must be bytes, not"
                           f" {type(data).__name__}")
    return bytes(data)


class _NotFresh(Exception):
    """A builder found the step not fresh (`step_in_one_commit`): nothing is written; the
    row it found goes back to the caller."""

    def __init__(self, row: StepRow) -> None:
        super().__init__(row.step_id)
        self.row = row


def plan(
    site: Site,
    step: str,
    *,
    run: str = "",
    artifacts: Sequence[str] = (),
    workspace: str = "",
    epoch: int = 0,
    pins: Sequence[str] = (),
) -> StepRow:
    """Start the step's next attempt, or return the one in flight. (`Ledger.plan` says what
    it promises.)"""

    row = site.core.steps.find(step)
    if row is not None and (row.live or row.state not in ENDED):
        return row
    attempt = 1 if row is None else row.attempt + 1
    event = Planned(step=step, attempt=attempt, run=run, workspace=workspace,
                    epoch=epoch, artifacts=tuple(sorted(set(artifacts))))
    events: list[Event] = [event]
    events += [BlobPinned(step=step, attempt=attempt, run=run, workspace=workspace,
                          epoch=epoch, digest=d, role="artifact") for d in dict.fromkeys(pins)]
    try:
        site.core.log.append(events, guard=site.core.guard())
    except IllegalTransition:
        pass  # a concurrent planner won: its attempt is the one in flight
    return site.core.steps.get(step)


def _attempt(site: Site, step: str, attempt: int | None) -> tuple[StepRow, int]:
    row = site.core.steps.get(step)
    attempt = row.attempt if attempt is None else attempt
    return row, attempt


def pin(site: Site, step: str, attempt: int, digest: str, role: str = "artifact") -> RecordedEvent:
    """Record, in its own committed transaction, that the attempt will use this blob.
    (`Ledger.pin` says what it promises.)"""
    event = _pin_event(site.core.steps.get(step), attempt, digest, role)
    return site.core.log.append([event], guard=site.core.guard())[0]


def _pin_event(row: StepRow, attempt: int, digest: str, role: str = "artifact") -> BlobPinned:
    return BlobPinned(step=row.step_id, attempt=attempt, run=row.run,
                      workspace=row.workspace, epoch=row.epoch, digest=digest,
                      role=role)  # type: ignore[arg-type]


def store(site: Site, step: str, attempt: int, path: str, data: Content) -> BlobStored:
    """Store one artifact of an attempt: pin, durable bytes, then `blob-stored`.
    (`Ledger.store` says what it promises.)"""
    check_relpath(path, "artifact path")
    if not isinstance(data, bytes):
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        else:
            check_content(data, f"the bytes of artifact {path!r}")
    row = site.core.steps.get(step)
    digest, size = content_digest(data)
    inline = size <= site.core.options.inline_max_bytes
    event = BlobStored(step=step, attempt=attempt, run=row.run, workspace=row.workspace,
                       epoch=row.epoch, digest=digest, size=size, path=path,
                       inline=inline)
    pin = _pin_event(row, attempt, digest)
    if inline:
        small = content_bytes(data, digest)
        # The pin, the bytes and `blob-stored` commit together: the blob is never
        # visible unpinned, so one transaction does what two would.
        site.core.log.append([pin, event], guard=site.core.guard(), inline={digest: small})
    else:
        site.core.storage.files.check_writable(digest)  # a store that refuses the put: pin nothing
        site.core.log.append([pin], guard=site.core.guard())[0]  # committed before the file is written or deduplicated
        site.core.storage.files.put_content(data, digest)
        site.core.log.append([event], guard=site.core.guard())[0]
    return event


def store_and_publish(
    site: Site, row: StepRow, attempt: int, outputs: Mapping[str, tuple[str, bytes]]
) -> Manifest | None:
    """Store every artifact of a fresh artifact-only attempt and publish its manifest,
    in ONE transaction (the step runner's fast path; `store` + `publish` do the same
    in 1 + 2k commits). `outputs` maps path -> (digest, bytes), pinned with the plan
    (`plan(pins=...)`; a blob GC took meanwhile fails the guard: BlobNotFound, and
    the runner goes step by step, pinning). Files are made durable first; the inline
    bytes, every `blob-stored` and `manifest-published` then commit together, the
    blobs re-checked by the guard inside the transaction. None, having done nothing,
    when the attempt's plan declared other artifacts (another runner planned it):
    the caller goes step by step, where `publish` says what is missing."""
    step = row.step_id
    with site.core.storage.read() as view:
        hit = view.journal_lookup(journal_key(Planned(step=step, attempt=attempt)))
    planned = None if hit is None else decode(hit.payload, hit.v)
    if not isinstance(planned, Planned) or planned.workspace or planned.artifacts != tuple(
            sorted(outputs)):
        return None
    small: dict[str, bytes] = {}
    for path in sorted(outputs):
        digest, data = outputs[path]
        if len(data) <= site.core.options.inline_max_bytes:
            small[digest] = data
        else:
            site.core.storage.files.check_writable(digest)
            site.core.storage.files.put(data, digest, verified=True)
    common = {"step": step, "attempt": attempt, "run": row.run, "workspace": row.workspace,
              "epoch": row.epoch}
    stored: list[Event] = [
        BlobStored(**common, digest=digest, size=len(data), path=path,  # type: ignore[arg-type]
                   inline=len(data) <= site.core.options.inline_max_bytes)
        for path, (digest, data) in sorted(outputs.items())
    ]
    artifacts = tuple(ManifestEntry(path=path, digest=digest, size=len(data))
                      for path, (digest, data) in sorted(outputs.items()))
    event = ManifestPublished(
        **common, manifest_rev=row.manifest_rev + 1, expected_rev=-1,  # type: ignore[arg-type]
        digest=manifest_digest(step, (), artifacts), artifacts=artifacts,
    )
    # The runner's caller learns the manifest when run_step returns, whichever commit
    # records the ack: recording it with the manifest saves a commit and changes no
    # answer (a crash before the return is answered from the journal on a re-run).
    ack = Acked(**common, manifest_rev=event.manifest_rev)  # type: ignore[arg-type]
    try:
        recorded = site.core.log.append(
            [*stored, event, ack], guard=site.core.guard(), inline=small)
    except IllegalTransition:
        # a concurrent runner of the same attempt published first: its manifest won
        if site.core.steps.get(step).live:
            manifest = manifest_of(site, step)
            assert manifest is not None
            return manifest
        raise
    return Manifest.from_event(event, recorded[-2].seq, True)


def step_in_one_commit(
    site: Site, step: str, run: str, outputs: Mapping[str, tuple[str, bytes]],
) -> tuple[int, Manifest] | StepRow | None:
    """A fresh artifact-only attempt whose artifacts all fit inline, in ONE
    transaction: `planned`, the inline bytes with every `blob-stored`,
    `manifest-published` and `acked` (the runner's fastest path).

    Nothing is written outside the transaction, so the plan is durable before any
    write the attempt makes exactly as in the three-commit order: all of it commits,
    or none of it does. Whether the step is fresh (no attempt yet, or its latest one
    ended unpublished) is decided inside the transaction, from the row read there.
    Returns (attempt, manifest); the step's row, having written nothing, when it is
    not fresh (committed, or an attempt in flight: the caller continues that); None,
    having written nothing, when the journal answered with another runner's identical
    attempt (its manifest is the one that stands)."""
    assert all(len(data) <= site.core.options.inline_max_bytes for _, data in outputs.values())
    paths = tuple(sorted(outputs))
    artifacts = tuple(ManifestEntry(path=path, digest=outputs[path][0],
                                    size=len(outputs[path][1])) for path in paths)
    digest = manifest_digest(step, (), artifacts)
    decided: list[tuple[int, ManifestPublished]] = []

    def build(tx: Tx, _now: int) -> list[Event]:
        prev = site.core.steps.in_tx(tx, step)
        if prev is not None and (prev.live or prev.state not in ENDED):
            raise _NotFresh(prev)
        attempt = 1 if prev is None else prev.attempt + 1
        manifest_rev = 0 if prev is None else prev.manifest_rev + 1
        common = {"step": step, "attempt": attempt, "run": run, "workspace": "", "epoch": 0}
        published = ManifestPublished(
            **common, manifest_rev=manifest_rev, expected_rev=-1,  # type: ignore[arg-type]
            digest=digest, artifacts=artifacts)
        decided[:] = [(attempt, published)]
        # No `blob-pinned`: a pin holds a blob between commits (written before it is
        # stored, stored before it is published); here it is stored and published in
        # the same transaction that makes it exist, so no moment needs holding.
        # The plan is validated; the rest are built from its fields (step, run,
        # attempt, the paths it declares) and from values computed here (digests
        # hashed, lengths, the manifest revision read and advanced): not decoded again.
        return [
            Planned(**common, artifacts=paths),  # type: ignore[arg-type]
            *(Built(BlobStored(**common, digest=d, size=len(data), path=path,  # type: ignore[arg-type]
                               inline=True)) for path, (d, data) in sorted(outputs.items())),
            Built(published),
            Built(Acked(**common, manifest_rev=manifest_rev)),  # type: ignore[arg-type]
        ]

    small = {d: data for d, data in outputs.values()}
    try:
        recorded = site.core.log.append(build, guard=site.core.guard(), inline=small)
    except _NotFresh as not_fresh:
        return not_fresh.row
    except (IllegalTransition, IdempotencyConflict):
        return None  # a concurrent runner planned this attempt first: nothing written
    if recorded[-2].deduped:
        # Another runner recorded this very attempt with identical content first: the
        # journal answered, and its manifest is the one that stands.
        return None
    attempt, published = decided[0]
    return attempt, Manifest.from_event(published, recorded[-2].seq, True)


def manifest_of(site: Site, step: str, manifest_rev: int | None = None) -> Manifest | None:
    """The step's live manifest (or revision `manifest_rev`, live or not); None if none."""
    row = site.core.steps.find(step)
    if row is None or row.manifest_rev < 0:
        return None
    want = row.manifest_rev if manifest_rev is None else manifest_rev
    if manifest_rev is None and not row.live:
        return None
    for recorded in site.core.log.read(step=step, kind="manifest-published"):
        event = recorded.event
        assert isinstance(event, ManifestPublished)
        if event.manifest_rev == want:
            live = row.live and want == row.manifest_rev
            return Manifest.from_event(event, recorded.seq, live)
    return None


def publish(
    site: Site,
    step: str,
    attempt: int | None = None,
    *,
    expected_rev: int = -1,
    receipt: Receipt | dict[str, Any] | bytes | str | None = None,
) -> Manifest:
    """Publish the attempt's manifest: the commit point, a compare-and-swap.
    (`Ledger.publish` says what it promises.)"""
    if receipt is not None:
        checked = check_receipt(site.core.log, receipt)
        if checked.step != step or (attempt is not None and checked.attempt != attempt):
            raise InvalidInput(f"the receipt is for step {checked.step!r} attempt"
                               f" {checked.attempt}, not {step!r}")
        attempt = checked.attempt
        if checked.epoch > 0:
            live = site.places.get(checked.workspace).live_epoch(site.core.clock())
            if live != checked.epoch:  # a late 200 from a reclaimed sandbox
                raise StaleEpoch(checked.workspace, checked.epoch, live,
                                 "a receipt of a dead epoch commits nothing")
    if expected_rev < -1:
        raise InvalidInput(f"expected_rev {expected_rev} must be -1 (create) or a revision >= 0")
    row, attempt = _attempt(site, step, attempt)
    if attempt != row.attempt:
        raise IllegalTransition(step, attempt, "manifest-published",
                                f"the latest attempt is {row.attempt} ({row.state})")
    if expected_rev == -1 and row.live:
        manifest = manifest_of(site, step)
        assert manifest is not None
        return manifest
    if expected_rev != -1 and (not row.live or row.manifest_rev != expected_rev):
        raise ManifestConflict(step, expected_rev, row.manifest_rev if row.live else None)
    ev = read_attempt(site.core.log, step, attempt)
    planned, artifacts, applied = ev.planned, ev.artifacts, ev.applied
    declared = () if planned is None else planned.artifacts
    missing = sorted(set(declared) - {e.path for e in artifacts})
    if missing:
        raise IllegalTransition(step, attempt, "manifest-published",
                                f"declared artifacts were never stored: {', '.join(missing)}")
    writes: tuple[ManifestEntry, ...] = ()
    if planned is not None and planned.workspace and planned.epoch > 0:
        # A writing step's publish is an effect under its epoch: a dead one hears
        # StaleEpoch first, whatever else is wrong (the guard re-checks in the txn).
        live = site.places.get(planned.workspace).live_epoch(site.core.clock())
        if live != planned.epoch:
            raise StaleEpoch(planned.workspace, planned.epoch, live)
    if planned is not None and planned.writes:
        if applied is None:
            raise IllegalTransition(step, attempt, "manifest-published",
                                    "its workspace writes were never applied; apply first")
        entries = []
        for path in sorted(applied):
            w = applied[path]
            if w.post_hash is None:
                continue  # a deletion names no blob
            found = site.core.blob_size(w.post_hash)
            if found is None:
                raise BlobNotFound(w.post_hash, f"the post-image of {path} is gone")
            entries.append(ManifestEntry(path=path, digest=w.post_hash, size=found[0]))
        writes = tuple(entries)
    event = ManifestPublished(
        step=step, attempt=attempt, run=row.run, workspace=row.workspace,
        epoch=planned.epoch if planned is not None else row.epoch,
        manifest_rev=row.manifest_rev + 1, expected_rev=expected_rev,
        digest=manifest_digest(step, writes, artifacts),
        supersedes=row.manifest_digest if expected_rev != -1 else None,
        writes=writes, artifacts=artifacts,
    )
    try:
        recorded = site.core.log.append([event], guard=site.core.guard())[0]
    except IllegalTransition:
        # A concurrent publisher landed first: the first to land wins for a create;
        # a supersede against a revision that moved is a conflict.
        now = site.core.steps.get(step)
        if expected_rev == -1 and now.live:
            manifest = manifest_of(site, step)
            assert manifest is not None
            return manifest
        if expected_rev != -1:
            raise ManifestConflict(step, expected_rev, now.manifest_rev if now.live else None) from None
        raise
    return Manifest.from_event(event, recorded.seq, True)


def ack(site: Site, step: str, attempt: int | None = None, *, epoch: int | None = None) -> RecordedEvent:
    """Record that the client learned the step's live manifest (idempotent). (`Ledger.ack`
    says what it promises.)"""
    row, attempt = _attempt(site, step, attempt)
    if epoch is not None and row.workspace and row.epoch:
        # an ack under an epoch: that epoch must be live and no older than the
        # attempt's, even when the answer would be an earlier ack (a zombie must not
        # hear a newer epoch's ack as its own)
        ws = site.places.get(row.workspace)
        live = ws.live_epoch(site.core.clock())
        if live != epoch or epoch < row.epoch:
            raise StaleEpoch(row.workspace, epoch, live, f"attempt {attempt} of step"
                             f" {step!r} was planned under epoch {row.epoch}"
                             if epoch < row.epoch else "", latest=ws.epoch,
                             holder=ws.holder)
    if row.acked and row.attempt == attempt:
        acked = read_attempt(site.core.log, step, attempt, kind="acked").acked
        assert acked is not None
        (first,) = site.core.log.read(acked[0] - 1, limit=1)
        return msgspec.structs.replace(first, deduped=True)
    event = Acked(step=step, attempt=attempt, run=row.run, workspace=row.workspace,
                  epoch=row.epoch if epoch is None else epoch,
                  manifest_rev=max(row.manifest_rev, 0))
    return site.core.log.append([event], guard=site.core.guard())[0]


__all__ = ["ack", "artifact_bytes", "manifest_of", "pin", "plan", "publish", "store",
           "store_and_publish", "step_in_one_commit"]

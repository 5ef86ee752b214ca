"""The step runner: the artifact protocol in the order that makes it durable.

    local write -> pin -> durable blobs -> blob-stored -> manifest (commit point) -> ack

A fresh attempt whose artifacts all fit inline is ONE commit: `planned`, the inline
bytes with every `blob-stored` (no pins: nothing exists before that commit to hold), `manifest-published` and `acked` (nothing is
written outside the ledger, so the plan is durable before any write either way). With
a file blob among them it is two: `planned` with every artifact's pin (before any byte
is written), then — the files made durable first — the inline bytes, every
`blob-stored`, `manifest-published` and `acked` in one transaction. The ack goes with
the manifest: the caller learns the result when `run_step` returns, and a crash before
that is answered from the journal on a re-run.

`run_step` is safe to call again with the same step id after a crash at any point:
a committed step returns its live manifest and runs nothing; an attempt in flight
is continued from what the ledger recorded, transition by transition — journal
keys make each one idempotent (a pin, a store, a publish, an ack already recorded
is returned, not repeated).

Replay policy (a step that died between its blob upload and its manifest, replayed
with byte-different output): replay under the same step id and let the ledger decide. The first manifest to land wins; a replay of a
committed step is answered from the ledger. An attempt that died before publishing
is either continued by the same runner (as here) or ended by whoever knows it is
dead (`Ledger.compensate`, or a new epoch's settling for workspace-writing steps),
and the next run is a new attempt whose publish creates the manifest; the dead
attempt's blobs become orphans for GC once unpinned. Replacing a live manifest on
purpose is a supersede (`publish(expected_rev=live)`), recording both digests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .blobs import digest_of
from .errors import BlobNotFound
from .events import Manifest, ManifestEntry, ManifestPublished, manifest_digest
from .ledger import Ledger, artifact_bytes
from .projections.steps import ENDED

Outputs = Mapping[str, bytes] | Callable[[], Mapping[str, bytes]]


@dataclass(frozen=True)
class StepResult:
    """What `run_step` did: `ran` is False when the step was already committed."""

    step: str
    attempt: int
    manifest: Manifest
    ran: bool


def run_step(ledger: Ledger, step: str, outputs: Outputs, *, run: str = "") -> StepResult:
    """Run (or finish) one artifact-only step and return its committed manifest.

    `outputs` maps artifact paths to bytes, or is a callable producing them — called
    only when the step is not committed yet (a committed step runs nothing).
    """
    row = ledger.find_step(step)
    if row is not None and row.live:
        manifest = ledger.manifest(step)
        assert manifest is not None
        if row.state != "acked":  # died between publish and ack: the ack releases its pins
            ledger.ack(step, row.attempt)
        return StepResult(step, row.attempt, manifest, ran=False)
    produced = dict(outputs() if callable(outputs) else outputs)
    produced = {path: artifact_bytes(path, data) for path, data in produced.items()}
    digested = {path: (digest_of(data), data) for path, data in produced.items()}
    fresh = row is None or row.state in ENDED
    if fresh and all(len(data) <= ledger.inline_max_bytes for _, data in digested.values()):
        # Every artifact fits inline: nothing is written outside the ledger, so the whole
        # attempt — plan, pins, bytes, stores, manifest, ack — is one commit.
        done = ledger._step_in_one_commit(step, row, run, digested)
        if done is not None:
            return StepResult(step, done[0], done[1], ran=True)
        row = ledger.find_step(step)  # another runner planned it meanwhile: continue that
        fresh = False
    row = ledger.plan(step, run=run, artifacts=tuple(produced),
                       pins=[d for d, _ in digested.values()] if fresh else ())
    if row.live:  # a concurrent runner committed it meanwhile
        manifest = ledger.manifest(step)
        assert manifest is not None
        if row.state != "acked":
            ledger.ack(step, row.attempt)
        return StepResult(step, row.attempt, manifest, ran=False)
    attempt = row.attempt
    if fresh and row.state == "planned":
        # This call planned the attempt (its pins committed with it) and a file blob is
        # among its artifacts: the files are made durable, then every blob-stored, the
        # manifest and the ack go in one transaction — 2 commits a step.
        try:
            fast = ledger._store_and_publish(row, attempt, digested)
        except BlobNotFound:
            fast = None  # a blob vanished before the commit: the step-by-step path below
        if fast is not None:
            return StepResult(step, attempt, fast, ran=True)
    # Continuing an attempt found in flight (a replay): transition by transition.
    for path in sorted(produced):
        ledger.store(step, attempt, path, produced[path])
    try:
        manifest = ledger.publish(step, attempt)
    except BlobNotFound:
        # A blob vanished between its store and the publish (a collector, a human):
        # the publish refused cleanly; store the bytes again and publish once more.
        for path in sorted(produced):
            ledger.store(step, attempt, path, produced[path])
        manifest = ledger.publish(step, attempt)
    ledger.ack(step, attempt)
    return StepResult(step, attempt, manifest, ran=True)


def run_step_wrong_order(ledger: Ledger, step: str, outputs: Mapping[str, bytes]) -> None:
    """THE BROKEN PROTOCOL, for the chaos harness's negative control only.

    Publishes the manifest before any blob is stored, through the ledger's private
    unchecked path; the durability checker must catch the dangling manifest.
    """
    row = ledger.plan(step, artifacts=tuple(outputs))
    if row.live:
        return
    entries = tuple(
        ManifestEntry(path=p, digest=digest_of(outputs[p]), size=len(outputs[p]))
        for p in sorted(outputs)
    )
    if row.manifest_rev < 0:
        ledger._append_unchecked(ManifestPublished(
            step=step, attempt=row.attempt, manifest_rev=0,
            digest=manifest_digest(step, (), entries), artifacts=entries,
        ))
    for path in sorted(outputs):  # too late
        ledger.store(step, row.attempt, path, outputs[path])
    ledger.ack(step, row.attempt)


__all__ = ["StepResult", "run_step", "run_step_wrong_order"]

"""The broken protocols the harnesses use as negative controls (never the runtime's).

- `append_unchecked`: an append without the ledger's blob guard (docs/internals.md
  "Content before pointer"), as a buggy writer would make it, and without the epoch
  check a zombie's late event would meet: what the checkers must catch.
- `run_step_wrong_order`: a step that publishes its manifest before any blob is stored
  (``steptrail chaos --wrong-order``, the model-based machine's control); the
  durability checker must catch the dangling manifest.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..blobs import digest_of
from ..events import (
    Event,
    ManifestEntry,
    ManifestPublished,
    RecordedEvent,
    manifest_digest,
)
from ..ledger import Ledger


def append_unchecked(ledger: Ledger, event: Event) -> RecordedEvent:
    """Append `event` to the ledger's log as it is: no blob guard, no protocol check."""
    return ledger._log.append([event])[0]


def run_step_wrong_order(ledger: Ledger, step: str, outputs: Mapping[str, bytes]) -> None:
    """THE BROKEN PROTOCOL, for the negative controls only.

    Publishes the manifest before any blob is stored, through `append_unchecked`; the
    durability checker must catch the dangling manifest.
    """
    row = ledger.plan(step, artifacts=tuple(outputs))
    if row.live:
        return
    entries = tuple(
        ManifestEntry(path=p, digest=digest_of(outputs[p]), size=len(outputs[p]))
        for p in sorted(outputs)
    )
    if row.manifest_rev < 0:
        append_unchecked(ledger, ManifestPublished(
            step=step, attempt=row.attempt, manifest_rev=0,
            digest=manifest_digest(step, (), entries), artifacts=entries,
        ))
    for path in sorted(outputs):  # too late
        ledger.store(step, row.attempt, path, outputs[path])
    ledger.ack(step, row.attempt)


__all__ = ["append_unchecked", "run_step_wrong_order"]

"""Blob references: pins and manifest revisions, the facts GC and audit stand on.

- `pins`: (step, attempt, digest) an attempt may still publish or compensate with.
  Taken by `blob-pinned`; an attempt's artifact and post-image pins are released
  when it is acked, all its pins when it ends (`compensated`, `rejected`).
  Pre-images stay pinned after the ack: the compensation window decides (GC).
- `manifests` / `manifest_entries`: every manifest revision ever published and the
  blobs it names. Never deleted: a blob named by any revision is referenced.

One fold, `RefsFold` (in memory: rebuild and verify), and its per-transaction variant
`RefsBatch` (the inline writer and catch-up), which also deletes released pins that
earlier transactions wrote. `verify` compares the tables with a fresh fold, so the
two cannot drift unseen.
"""

from __future__ import annotations

from typing import Final

from ..events import ManifestPublished, kinds_folded_by
from ..store import (Checkpoint, EntryRow, ProjectionChanges, ProjectionSink, RebuildSink,
                     make_entry_row)
from .lite import SlimPublished

VERSION: Final = 1
NAME: Final = "refs"
KINDS: Final = kinds_folded_by("refs")
#: The kinds that release an attempt's pins.
_ENDS: Final = frozenset({"acked", "compensated", "rejected"})
#: Pins an ack releases; pre-images stay until the compensation window passes.
RELEASED_ON_ACK: Final = ("artifact", "post-image")

PinKey = tuple[str, int, str]
ManifestRow = tuple[str, int, int, str, str | None, int]


def manifest_rows(event: ManifestPublished | SlimPublished, seq: int) -> tuple[ManifestRow, list[EntryRow]]:
    manifest = (event.step, event.manifest_rev, event.attempt, event.digest, event.supersedes, seq)
    entries = [
        make_entry_row((event.step, event.manifest_rev, "write", e.path, e.digest, e.size))
        for e in event.writes
    ] + [
        make_entry_row((event.step, event.manifest_rev, "artifact", e.path, e.digest, e.size))
        for e in event.artifacts
    ]
    return manifest, entries


class RefsFold:
    """The same fold in memory: pins live only while held, so memory follows live pins."""

    DRAIN_AT: Final = 5_000

    def __init__(self, drain_to: ProjectionSink | None = None) -> None:
        self.pins: dict[PinKey, tuple[str, int]] = {}
        self._by_attempt: dict[tuple[str, int], set[str]] = {}
        self.manifests: list[ManifestRow] = []
        self.entries: list[EntryRow] = []
        # With a sink, manifests and entries are written out as they accumulate (rebuild
        # into the ledger's tables, verify into its scratch copy: memory bounded by live
        # pins); without, they stay in memory.
        self._drain_to = drain_to

    def fold(self, event: object, seq: int) -> None:
        # by kind, not class: rebuild folds slim events (projections.lite)
        kind = event.__struct_config__.tag  # type: ignore[attr-defined]
        if kind == "blob-pinned":
            key = (event.step, event.attempt, event.digest)
            if key not in self.pins:
                self.pins[key] = (event.role, seq)
                self._by_attempt.setdefault((event.step, event.attempt), set()).add(event.digest)
        elif kind in _ENDS:
            attempt = (event.step, event.attempt)  # type: ignore[attr-defined]
            digests = self._by_attempt.get(attempt)
            if not digests:
                return
            for digest in list(digests):
                role = self.pins[(*attempt, digest)][0]
                if kind == "acked" and role not in RELEASED_ON_ACK:
                    continue
                del self.pins[(*attempt, digest)]
                digests.discard(digest)
            if not digests:
                del self._by_attempt[attempt]
        elif kind == "run-sealed":
            # The sealed steps' manifests and pins leave with their archived events.
            self.drop({s.step for s in event.steps})  # type: ignore[attr-defined]
        elif kind == "manifest-published":
            manifest, entries = manifest_rows(event, seq)  # type: ignore[arg-type]
            self.manifests.append(manifest)
            self.entries.extend(entries)
            if self._drain_to is not None and len(self.entries) >= self.DRAIN_AT:
                self.drain(self._drain_to)

    def drop(self, steps: set[str]) -> None:
        """Forget every pin, manifest and entry of `steps` (a seal archived them)."""
        for key in [k for k in self.pins if k[0] in steps]:
            del self.pins[key]
        for key in [k for k in self._by_attempt if k[0] in steps]:
            del self._by_attempt[key]
        self.manifests = [m for m in self.manifests if m[0] not in steps]
        self.entries = [e for e in self.entries if e.step not in steps]

    def drain(self, sink: ProjectionSink) -> None:
        """Write the manifests and entries folded since the last drain into `sink`, and
        forget them (pins are written by `write` only)."""
        sink.put_manifests(self.manifests, self.entries)
        self.manifests, self.entries = [], []

    def pin_rows(self) -> list[tuple[str, int, str, str, int]]:
        return sorted((s, a, d, role, seq) for (s, a, d), (role, seq) in self.pins.items())

    def write(self, sink: RebuildSink) -> None:
        """Write what this fold holds into a rebuild's (emptied) ref tables."""
        sink.put_pins(self.pin_rows())
        self.drain(sink)


class RefsBatch(RefsFold):
    """One append transaction's ref changes, netted in memory and written at its end.

    Pins taken and released within the batch cancel out; releases also delete the
    rows earlier transactions wrote. Deletes run before inserts, which is right because
    every insert still pending was taken after the last release of its attempt.
    """

    def __init__(self) -> None:
        super().__init__()
        self.releases: list[tuple[str, int, bool]] = []  # (step, attempt, ack only)
        self.dropped: list[str] = []  # steps a seal archived: their rows leave the tables
        # Attempts planned in this batch: no earlier transaction can have pinned for them
        # (a pin is taken only for an attempt already planned), so their releases
        # delete nothing from the tables and are not sent.
        self.begun: set[tuple[str, int]] = set()

    def began(self, step: str, attempt: int) -> None:
        """Attempt `attempt` of `step` was planned in this batch."""
        self.begun.add((step, attempt))

    def fold(self, event: object, seq: int) -> None:
        super().fold(event, seq)
        kind = event.__struct_config__.tag  # type: ignore[attr-defined]
        if kind == "run-sealed":
            self.dropped.extend(s.step for s in event.steps)  # type: ignore[attr-defined]
        elif kind in _ENDS and (event.step, event.attempt) not in self.begun:  # type: ignore[attr-defined]
            self.releases.append((event.step, event.attempt, kind == "acked"))  # type: ignore[attr-defined]

    def changes(self, steps: list[tuple[object, ...]],
                workspaces: tuple[list[tuple[object, ...]], list[tuple[object, ...]]],
                uncondemn: set[str], checkpoint: Checkpoint) -> ProjectionChanges:
        """This transaction's ref changes — the releases, the pins taken (net), the
        manifests and their entries — with the other projections' (every field given:
        one allocation, no default made per transaction)."""
        return ProjectionChanges(
            steps=steps, releases=self.releases, released_on_ack=RELEASED_ON_ACK,
            pins=self.pin_rows() if self.pins else [],  # type: ignore[arg-type]
            manifests=self.manifests, entries=self.entries,  # type: ignore[arg-type]
            workspaces=workspaces[0], paths=workspaces[1], uncondemn=uncondemn,
            checkpoint=checkpoint, dropped_steps=self.dropped)


def fold_tables(fold: RefsFold) -> tuple[list[object], list[object], list[object]]:
    return (
        list(fold.pin_rows()),
        sorted(fold.manifests, key=lambda r: (r[0], r[1])),
        sorted(fold.entries, key=lambda r: (r.step, r.manifest_rev, r.role, r.path)),
    )


__all__ = [
    "KINDS", "NAME", "VERSION", "RefsBatch", "RefsFold", "fold_tables",
]

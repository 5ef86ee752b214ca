"""The byte audit: does what is stored match the committed steps?

Every stored byte lands in exactly one bucket, first match wins (docs/design.md "Read side"):
referenced by a manifest (any revision) or a compensation record, pinned (in flight,
or a pre-image inside its compensation window), orphan inside the grace window, orphan
outside it (what GC reclaims now), temporary file. So

    stored = referenced + pinned + orphan_young + orphan_old + temporary

holds exactly, inline rows and files alike. Violations (exit 1): a manifest or a
compensation naming a missing blob (dangling: I1/I9), and with `deep` a blob whose
bytes do not hash to its name (corrupt). Audit only reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..errors import BlobCorrupt
from ..events import BlobCollected, Sealed, decode
from ..store import EventQuery
from ..projections.steps import IN_FLIGHT
from .grace import DEFAULT_GRACE_S, check_grace, young
from .holders import GcRefused, live_pins, read_references

if TYPE_CHECKING:
    from ..ledger import Ledger

Progress = Callable[[int, int], None]


class Bucket(msgspec.Struct, kw_only=True):
    count: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size


class AuditReport(msgspec.Struct, kw_only=True):
    ok: bool = True
    now_ns: int = 0
    grace_s: float = DEFAULT_GRACE_S
    deep: bool = False
    committed_steps: int = 0
    committed_bytes: int = 0  # bytes named by live manifests, counted per entry
    committed_bytes_distinct: int = 0  # the same, each distinct blob once
    pending_steps: int = 0
    pending_bytes: int = 0  # bytes stored by attempts still in flight
    stored_bytes: int = 0  # every blob (inline rows + files) and temporary file
    stored_blobs: int = 0
    inline: Bucket = msgspec.field(default_factory=Bucket)
    files: Bucket = msgspec.field(default_factory=Bucket)
    referenced: Bucket = msgspec.field(default_factory=Bucket)
    pinned: Bucket = msgspec.field(default_factory=Bucket)
    orphan_young: Bucket = msgspec.field(default_factory=Bucket)  # GC reclaims later
    orphan_old: Bucket = msgspec.field(default_factory=Bucket)  # GC reclaims now
    temporary: Bucket = msgspec.field(default_factory=Bucket)
    collected: Bucket = msgspec.field(default_factory=Bucket)  # from blob-collected events
    # blobs sealed runs' archives hold (from run-sealed events), and of the orphans still
    # stored here those an archive holds (docs/design.md "Sealed runs"): not extra buckets
    archived: Bucket = msgspec.field(default_factory=Bucket)
    orphan_archived: Bucket = msgspec.field(default_factory=Bucket)
    collected_unrecorded: int = 0  # condemned and gone, not yet recorded (an interrupted GC)
    condemned: int = 0
    reconciled: bool = True
    dangling: list[dict[str, object]] = msgspec.field(default_factory=list)
    corrupt: list[dict[str, object]] = msgspec.field(default_factory=list)
    problems: list[str] = msgspec.field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def violations(self) -> int:
        return len(self.dangling) + len(self.corrupt) + len(self.problems)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        out["violations"] = self.violations
        return out


def audit(
    ledger: Ledger,
    *,
    deep: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    now_ns: int | None = None,
    progress: Progress | None = None,
) -> AuditReport:
    """Put every stored byte in its bucket and name every violation. Reads only."""
    started = time.monotonic()
    now = now_ns if now_ns is not None else ledger.clock()
    check_grace(grace_s, force=True)  # any window, but a finite one
    report = AuditReport(now_ns=now, grace_s=grace_s, deep=deep)
    grace_ns = int(grace_s * 1e9)
    window_ns = int(ledger.compensation_window_s * 1e9)
    with ledger.storage.read() as conn:
        try:
            holders = read_references(conn)
        except GcRefused as exc:
            report.problems.append(exc.why)
            holders = None
        pins = live_pins(conn, now, window_ns)
        inline = {b.digest: (int(b.size), int(b.mtime_ns)) for b in conn.inline_blobs()}
        report.committed_steps = conn.live_step_count()
        live_entries = conn.live_entries()
        report.committed_bytes = sum(int(n) for _d, n in live_entries)
        report.committed_bytes_distinct = sum(dict(live_entries).values())
        report.pending_steps, report.pending_bytes = conn.step_totals(IN_FLIGHT)
        archived: set[str] = set()
        for row in conn.events(EventQuery(kinds=frozenset({"blob-collected", "run-sealed"}))):
            event = decode(row.payload, row.v)
            if isinstance(event, Sealed):
                for b in event.blobs:
                    report.archived.add(b.size)
                    archived.add(b.digest)
                continue
            assert isinstance(event, BlobCollected)
            report.collected.add(event.size)
        condemned = set(conn.condemned())
        report.condemned = len(condemned)
        if holders is None:  # the events could not be read: count from the tables
            referenced = conn.manifest_digests()
        else:
            referenced = holders.referenced
    try:
        files = ledger.blobs.files()
    except BlobCorrupt as exc:
        report.problems.append(f"the blob store holds something that is not a blob: {exc}")
        files = {}
    try:
        temps = list(ledger.blobs.temp_files())
    except BlobCorrupt as exc:
        report.problems.append(f"the blob store's tmp/ is not a plain directory: {exc}")
        temps = []

    blobs: list[tuple[str, int, int, bool]] = [(d, n, t, True) for d, (n, t) in inline.items()]
    blobs += [(d, n, t, False) for d, (n, t) in files.items() if d not in inline]
    # A file copy of a blob that also has an inline row (writers with different inline
    # thresholds): stored bytes nothing reads, an orphan by its age (GC takes it).
    copies = [(d, n, t) for d, (n, t) in files.items() if d in inline]
    for digest, size, age_ns in copies:
        report.stored_blobs += 1
        report.stored_bytes += size
        report.files.add(size)
        (report.orphan_young if young(age_ns, now, grace_ns) else report.orphan_old).add(size)
    # one pass, counting into locals (this loop runs once per stored blob)
    where = [[0, 0], [0, 0]]  # files, inline: [count, bytes]
    buckets_of = [[0, 0], [0, 0], [0, 0], [0, 0]]  # referenced, pinned, young, old
    young_after = now - grace_ns
    for digest, size, age_ns, is_inline in blobs:
        w = where[is_inline]
        w[0] += 1
        w[1] += size
        b = buckets_of[0 if digest in referenced else 1 if digest in pins
                       else 2 if age_ns > young_after else 3]
        b[0] += 1
        b[1] += size
        if archived and b is not buckets_of[0] and b is not buckets_of[1] and digest in archived:
            report.orphan_archived.add(size)
    for bucket, (count, size) in zip(
            (report.files, report.inline, report.referenced, report.pinned,
             report.orphan_young, report.orphan_old), (*where, *buckets_of)):
        bucket.count += count
        bucket.bytes += size
    report.stored_blobs += where[0][0] + where[1][0]
    report.stored_bytes += where[0][1] + where[1][1]
    for t in temps:
        report.stored_bytes += t.size
        report.temporary.add(t.size)
    buckets = (report.referenced.bytes + report.pinned.bytes + report.orphan_young.bytes
               + report.orphan_old.bytes + report.temporary.bytes)
    report.reconciled = buckets == report.stored_bytes

    present = inline.keys() | files.keys()
    dangling = sorted(referenced - present)
    if dangling:
        with ledger.storage.read() as conn:
            for digest in dangling:  # who names it: looked up only for what is missing
                names = [f"{step} r{rev} {path}" for step, rev, path
                         in conn.entries_naming(digest, 5)] or ["a compensation record"]
                report.dangling.append({"digest": digest, "named_by": names})
    report.collected_unrecorded = len((condemned - present) - referenced)
    if deep:
        total = len(blobs)
        for i, (digest, size, _age, _inline) in enumerate(blobs, 1):
            problem = ledger.blob_problem(digest, size)
            if problem is not None and problem != "missing":
                report.corrupt.append({"digest": digest, "size": size, "problem": problem})
            if progress is not None and i % 100 == 0:
                progress(i, total)
        if progress is not None:
            progress(total, total)
    report.ok = report.violations == 0 and report.reconciled
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report


__all__ = ["AuditReport", "Bucket", "audit"]

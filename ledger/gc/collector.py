"""The orphan-blob collector: condemn, then re-check, unlink and record — under the lock.

An orphan is a blob (inline row or file) that no manifest revision and no compensation
record references, that no live pin holds, and that is older than the grace window
(a file's mtime, an inline row's `stored_ns`, both freshened by a dedup hit). The two
races every collector of this kind has lost are closed by the ledger, not the window:

1. an in-flight writer: it commits `blob-pinned` before it writes a byte, so the
   blob is pinned before it exists;
2. a writer deduplicating onto an old orphan: it commits the pin before it looks for
   the blob, and the collector's re-check, unlink and `blob-collected` happen in one
   ``BEGIN IMMEDIATE`` — the writer's pin is either before it (the blob is kept) or
   after it (the writer finds no blob and writes it anew).

Phase 1 condemns the candidates in one transaction (a resumable record in the
`condemned` table; a pin or a publish naming a blob un-condemns it). Phase 2 works
through them in batches, each one transaction: re-check (still condemned, still
unreferenced, still unpinned, still old), unlink or delete the row, record
`blob-collected`. A crash between an unlink and its commit leaves an unreferenced
condemned blob missing: the next run records it as collected. GC fails closed: any
doubt about what references a blob deletes nothing (`GcRefused`). Nothing here caches
"blob exists": every decision is re-read inside the transaction that acts on it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..blobs import digest_of
from ..errors import BlobCorrupt, CollectorBusy, EnvironmentFailure, InvalidInput, LedgerError
from ..events import BlobCollected, Event, check_digest
from ..store import Held, Tx
from .grace import DEFAULT_GRACE_S, MIN_GRACE_S, check_grace, young
from .holders import (
    COPY_REASON,
    GcRefused,
    Holders,
    compensation_refs_since,
    holds_placed_since,
    live_pins,
    pinned_now,
    read_references,
)

if TYPE_CHECKING:
    from ..ledger import Ledger
    from ..retention import Policy

#: Blobs condemned, re-checked and collected per transaction.
BATCH: Final = 500
Progress = Callable[[int, int], None]


class GcReport(msgspec.Struct, kw_only=True):
    """What a collection (or a dry run) found and did."""

    collection: str
    dry_run: bool
    grace_s: float
    scanned: int = 0  # blobs looked at (inline rows + files)
    scanned_bytes: int = 0
    referenced: int = 0
    referenced_bytes: int = 0
    kept_live: int = 0  # pinned by an attempt in flight (or a pre-image in its window)
    kept_live_bytes: int = 0
    kept_young: int = 0  # orphans inside the grace window
    kept_young_bytes: int = 0
    orphans: int = 0  # orphans outside the window: what this run set out to collect
    orphan_bytes: int = 0
    collected: int = 0
    reclaimed_bytes: int = 0
    recovered: int = 0  # condemned blobs found already gone (an interrupted run) and recorded
    spared: int = 0  # condemned, then found referenced, pinned or freshened: kept
    temp_removed: int = 0
    temp_removed_bytes: int = 0
    temp_kept: int = 0
    ws_temp_removed: int = 0  # temporaries killed applies left in workspaces, removed
    remaining: int = 0  # still condemned when the run stopped (a bound was hit)
    stopped: str = ""  # "", "max-runtime" or "max-delete"
    elapsed_s: float = 0.0
    #: The retention policy applied first (`ledger.retention`), None: none was.
    retention: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, object]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``24h``, ``7d`` (InvalidInput otherwise)."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        s = text.strip().lower()
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
        for unit in ("ms", "s", "m", "h", "d"):
            if s.endswith(unit) and s[: -len(unit)].replace(".", "", 1).isdigit():
                value = float(s[: -len(unit)]) * units[unit]
                break
        else:
            if not s.replace(".", "", 1).isdigit():
                raise InvalidInput(f"duration {text!r}: give seconds or a number with s, m, h or d"
                                   " (e.g. 24h)")
            value = float(s)
    if value < 0:
        raise InvalidInput(f"duration {text!r} is negative")
    return value


@contextlib.contextmanager
def collector_lock(ledger: Ledger, *, wait: bool = False) -> Iterator[None]:
    """Hold the ledger's GC lock (the store's `exclusive("gc")`) for the block;
    CollectorBusy when another collector holds it and not `wait`."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(ledger.storage.exclusive("gc", wait=wait))
        except Held as held:
            raise CollectorBusy(held.where) from None
        yield


class _Nothing(Exception):
    """Raised inside a batch transaction that found nothing to record (rolls it back)."""


def collect(
    ledger: Ledger,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    force: bool = False,
    dry_run: bool = False,
    max_runtime_s: float | None = None,
    max_delete: int | None = None,
    now_ns: int | None = None,
    progress: Progress | None = None,
    wait: bool = False,
    retention: Policy | None = None,
) -> GcReport:
    """Collect orphan blobs (see the module docstring); return what was found and done.
    `retention`: a policy (`ledger.retention`) applied first, under the collector's lock,
    so that the versions it releases are collected by this same run (with `dry_run`:
    worked out, reported and counted as if released; nothing written)."""
    check_grace(grace_s, force=force)
    if max_delete is not None and max_delete < 0:
        raise InvalidInput("--max-delete must be >= 0")
    if ledger.readonly and not dry_run:
        raise InvalidInput("open the ledger read-write to collect (or use --dry-run)")
    started = time.monotonic()
    deadline = None if max_runtime_s is None else started + max_runtime_s
    report = GcReport(collection=secrets.token_hex(8), dry_run=dry_run, grace_s=grace_s)
    with collector_lock(ledger, wait=wait) if not ledger.readonly else contextlib.nullcontext():
        assumed: set[tuple[str, str, str]] = set()
        if retention is not None:
            from .. import retention as retaining
            kept = (retaining.plan(ledger, retention, now_ns=now_ns) if dry_run
                    else retaining.apply(ledger, retention, now_ns=now_ns,
                                         by=f"gc:{report.collection}"))
            report.retention = kept.as_dict()
            if dry_run:
                assumed = kept.released_keys
        _run(ledger, report, grace_s, now_ns, dry_run, deadline, max_delete, progress,
             assumed)
        if not dry_run:
            _record_run(ledger, report, now_ns)
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report


#: The meta fact that says when gc last ran here, whatever it collected (a run that
#: collects nothing writes no event: `status` reads this to say the schedule runs).
LAST_RUN_META: Final = "gc_last_run"


def _record_run(ledger: Ledger, report: GcReport, now_ns: int | None) -> None:
    """Best effort: a role that may collect but not write meta (PostgreSQL grants) still
    collected; only `status`'s "last ran" is missing."""
    fact = msgspec.json.encode({
        "time_ns": now_ns if now_ns is not None else ledger.clock(),
        "collection": report.collection, "collected": report.collected,
        "bytes": report.reclaimed_bytes}).decode()
    with contextlib.suppress(LedgerError):
        with ledger.storage.transaction() as tx:
            tx.set_meta(LAST_RUN_META, fact)


def last_run(ledger: Ledger) -> dict[str, object] | None:
    """When gc last ran on this ledger (`time_ns`, `collection`, `collected`, `bytes`), or
    None: never, or before runs were recorded."""
    try:
        raw = ledger.storage.view.meta(LAST_RUN_META)
    except LedgerError:
        return None
    if not raw:
        return None
    try:
        got = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return got if isinstance(got, dict) and isinstance(got.get("time_ns"), int) else None


def _run(ledger: Ledger, report: GcReport, grace_s: float, now_ns: int | None, dry_run: bool,
         deadline: float | None, max_delete: int | None, progress: Progress | None,
         assumed: set[tuple[str, str, str]] | None = None) -> None:
    now = now_ns if now_ns is not None else ledger.clock()
    grace_ns = int(grace_s * 1e9)
    window_ns = int(ledger.compensation_window_s * 1e9)
    store = ledger.storage
    with store.read() as conn:
        holders = read_references(conn, assume_released=assumed or frozenset())
        pins = live_pins(conn, now, window_ns)
        inline = {b.digest: (int(b.size), int(b.mtime_ns)) for b in conn.inline_blobs()}
        condemned = conn.condemned()
    try:
        files = ledger.blobs.files()
        temps = list(ledger.blobs.temp_files())
    except BlobCorrupt as exc:
        raise GcRefused(f"the blob store holds something that is not a blob file: {exc}") from None
    present = inline.keys() | files.keys()
    missing = sorted(holders.referenced - present)
    if missing:
        raise GcRefused(f"{len(missing)} referenced {'blob is' if len(missing) == 1 else 'blobs are'} missing, e.g. {missing[0][:12]}…;"
                        " a referenced blob is never collected, so something else removed it")

    candidates: dict[str, tuple[int, bool]] = {}
    for digest, (size, age_ns, is_inline) in _blobs(inline, files):
        report.scanned += 1
        report.scanned_bytes += size
        if digest in holders.referenced:
            report.referenced += 1
            report.referenced_bytes += size
        elif digest in pins:
            report.kept_live += 1
            report.kept_live_bytes += size
        elif young(age_ns, now, grace_ns):
            report.kept_young += 1
            report.kept_young_bytes += size
        else:
            report.orphans += 1
            report.orphan_bytes += size
            candidates[digest] = (size, is_inline)
    # Condemned by an earlier run that stopped or died: re-checked like the rest.
    for digest, value in condemned.items():
        candidates.setdefault(digest, value)
    # A file copy of a blob that also has an inline row (writers with different inline
    # thresholds): reads use the row, so an old copy is collectable whatever holds the
    # digest — as long as the row is intact (re-checked under the lock).
    dupes = sorted(d for d in files.keys() & inline.keys()
                   if d not in candidates and not young(files[d][1], now, grace_ns))
    for d in dupes:
        report.orphans += 1
        report.orphan_bytes += files[d][0]
    if dry_run:
        report.remaining = len(candidates) + len(dupes)
        for t in temps:
            if _temp_removable(t.name, t.mtime_ns, now, grace_ns, pins):
                report.temp_removed += 1
                report.temp_removed_bytes += t.size
            else:
                report.temp_kept += 1
        return

    # Phase 1: condemn, in one transaction.
    if candidates:
        with store.transaction() as tx:
            tx.condemn([(d, n, i) for d, (n, i) in candidates.items()], now, report.collection)
    if dupes:
        _collect_copies(ledger, report, dupes, grace_ns, now_ns)
    # Phase 2: re-check, unlink, record — batch by batch, each under BEGIN IMMEDIATE.
    todo = sorted(candidates)
    total = len(todo)
    done = 0
    while todo:
        if deadline is not None and time.monotonic() > deadline:
            report.stopped = "max-runtime"
            break
        budget = None if max_delete is None else max_delete - report.collected - report.recovered
        if budget is not None and budget <= 0:
            report.stopped = "max-delete"
            break
        size = BATCH if budget is None else min(BATCH, budget)
        batch, todo = todo[:size], todo[size:]
        _collect_batch(ledger, report, batch, holders.referenced, holders.head_seq, grace_ns,
                       window_ns, now_ns, holders)
        done += len(batch)
        if progress is not None:
            progress(done, total)
    report.remaining = store.view.condemned_count()
    # Stray temporary files: the leftovers of puts that died. A put in progress pinned
    # its digest (the temp file is named after it) first, so it is never taken.
    if not report.stopped:
        pins_now = _pins_snapshot(ledger, now, window_ns)
        for t in temps:
            removed = False
            if _temp_removable(t.name, t.mtime_ns, now, grace_ns, pins_now):
                # one odd entry (a directory, a name a human made) never loses the run
                with contextlib.suppress(OSError, InvalidInput, EnvironmentFailure):
                    removed = ledger.blobs.delete_temp(t.name)
            if removed:
                report.temp_removed += 1
                report.temp_removed_bytes += t.size
            else:
                report.temp_kept += 1
        # The same in the workspaces: what killed applies staged beside their targets.
        report.ws_temp_removed = ledger.workspaces.remove_abandoned_temporaries(now)


def _pins_snapshot(ledger: Ledger, now: int, window_ns: int) -> dict[str, str]:
    with ledger.storage.read() as view:
        return live_pins(view, now, window_ns)


_TEMP_NAME: Final = re.compile(r"([0-9a-f]{64})\.[0-9a-f]+\.tmp")


def _temp_removable(name: str, mtime_ns: int, now: int, grace_ns: int,
                    pins: dict[str, str]) -> bool:
    """A put's leftover (``<digest>.<hex>.tmp``), old enough, its digest unpinned.
    Anything else in tmp/ is not ours to delete: it is kept (and counted)."""
    m = _TEMP_NAME.fullmatch(name)
    return m is not None and not young(mtime_ns, now, grace_ns) and m.group(1) not in pins


def _blobs(inline: dict[str, tuple[int, int]],
           files: dict[str, tuple[int, int]]) -> Iterator[tuple[str, tuple[int, int, bool]]]:
    for d, (n, t) in inline.items():
        yield d, (n, t, True)
    for d, (n, t) in files.items():
        if d not in inline:  # both: the inline row is the one reads use; the file is extra
            yield d, (n, t, False)


def _collect_copies(ledger: Ledger, report: GcReport, dupes: list[str], grace_ns: int,
                    now_ns: int | None) -> None:
    """Remove old file copies of blobs whose inline row is intact (one transaction)."""
    done = {"n": 0, "bytes": 0}

    def build(tx: Tx, txn_now: int) -> list[Event]:
        now = txn_now if now_ns is None else now_ns
        done.update(n=0, bytes=0)
        events: list[Event] = []
        for digest in dupes:
            row = tx.inline_blob(digest)
            if row is None or digest_of(bytes(row[1])) != digest:
                continue  # the row went or is damaged: the file may be the good copy
            found = ledger.blobs.stat(digest)
            if found is None or young(found.mtime_ns, now, grace_ns):
                continue
            ledger.blobs.delete(digest)
            done["n"] += 1
            done["bytes"] += found.size
            events.append(BlobCollected(digest=digest, size=found.size, inline=False,
                                        reason=COPY_REASON,
                                        collection=report.collection))
        if not events:
            raise _Nothing
        return events

    try:
        ledger.log.append(build)
    except _Nothing:
        return
    report.collected += done["n"]
    report.reclaimed_bytes += done["bytes"]


def _named_now(tx: Tx, digest: str, holders: Holders | None) -> bool:
    """Whether a manifest entry the tables hold names `digest` and still holds it (not
    let go of by a releasing compensation — a pruned checkpoint's revisions do not — nor
    by a retention policy's `history-released`)."""
    if not tx.names_digest(digest):
        return False
    if holders is None or not (holders.released or holders.history):
        return True
    return any(holders.entry_holds(step, rev, path, digest)
               for step, rev, path in tx.entries_naming(digest, 1_000_000))


def _collect_batch(ledger: Ledger, report: GcReport, batch: list[str], referenced: set[str],
                   head_seq: int, grace_ns: int, window_ns: int, now_ns: int | None,
                   holders: Holders | None = None) -> None:
    counts = {"collected": 0, "reclaimed": 0, "recovered": 0, "spared": 0}
    spared: list[str] = []

    def build(tx: Tx, txn_now: int) -> list[Event]:
        now = txn_now if now_ns is None else now_ns  # an injected time holds for the run
        counts.update(collected=0, reclaimed=0, recovered=0, spared=0)
        spared.clear()
        late_refs = compensation_refs_since(tx, head_seq)
        # A hold placed since the references were read may keep what they found released
        # (a retention policy's versions, a pruned checkpoint's): every digest a record
        # names is then kept by this run, as if nothing had been released.
        late_hold = holders is not None and holds_placed_since(tx, head_seq)
        events: list[Event] = []
        for digest in batch:
            row = tx.condemned_entry(digest)
            if row is None:
                counts["spared"] += 1  # un-condemned since (a pin or a publish named it)
                continue
            size, was_inline = row

            def spare() -> None:
                tx.uncondemn((digest,))  # noqa: B023
                counts["spared"] += 1
                spared.append(digest)  # noqa: B023

            if (digest in referenced or digest in late_refs
                    or _named_now(tx, digest, None if late_hold else holders)
                    or (late_hold and holders is not None
                        and digest in holders.compensation_refs)
                    or pinned_now(tx, digest, now, window_ns)):
                spare()
                continue
            reason = "orphan"
            inline_row = tx.inline_stat(digest)
            if inline_row is not None:
                if young(inline_row.mtime_ns, now, grace_ns):
                    spare()  # freshened by a dedup hit since it was condemned
                    continue
                tx.delete_inline(digest)
                size, was_inline = inline_row.size, True
                with contextlib.suppress(OSError, BlobCorrupt):
                    ledger.blobs.delete(digest)  # a stray file copy, if one exists
            else:
                found = ledger.blobs.stat(digest)
                if found is None:
                    reason = "missing after an interrupted collection"
                    ledger.blobs.sync_absent(digest)  # its unlink, made durable
                    counts["recovered"] += 1
                else:
                    if young(found.mtime_ns, now, grace_ns):
                        spare()
                        continue
                    ledger.blobs.delete(digest)  # unlink + directory fsync
                    size, was_inline = found.size, False
            tx.uncondemn((digest,))
            if reason == "orphan":
                counts["collected"] += 1
                counts["reclaimed"] += size
            events.append(BlobCollected(digest=check_digest(digest), size=size, reason=reason,
                                        inline=was_inline, collection=report.collection))
        if not events:
            raise _Nothing
        return events

    try:
        ledger.log.append(build)
    except _Nothing:
        # Nothing to record: only condemnations to lift (always safe to lift).
        if spared:
            with ledger.storage.transaction() as tx:
                tx.uncondemn(spared)
        report.spared += counts["spared"]
        return
    report.collected += counts["collected"]
    report.reclaimed_bytes += counts["reclaimed"]
    report.recovered += counts["recovered"]
    report.spared += counts["spared"]


__all__ = ["DEFAULT_GRACE_S", "LAST_RUN_META", "MIN_GRACE_S", "CollectorBusy", "GcReport",
           "collect", "collector_lock", "last_run", "parse_duration"]

"""Verification: the hash chain, seq density, row integrity and projections.

`verify` reads everything and writes nothing. It returns every finding, not just
the first, so an operator sees the whole damage at once.

A hash chain sees any edit, deletion, reordering or insertion, but not its own tail
cut off or the whole file rolled back to an older genuine copy: for that the caller
passes the head recorded elsewhere (`expect_head`, as printed by `steptrail head`),
and verify proves the ledger still holds exactly that event at that seq.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, Final

import msgspec

from .errors import CorruptLedger, InvalidInput
from .events import EVENT_TYPES, Planned, chain_hash, decode, envelope, journal_key
from .invariants import Checker
from .log import EventLog, Head
from .projections import (
    Checkpoint,
    StepRow,
    checkpoint,
    fold_into,
    fold_rows,
    read_workspaces,
)
from .projections.refs import RefsFold
from .projections.steps import NAME as STEPS_NAME
from .projections.steps import VERSION as STEPS_VERSION
from .projections.workspaces import WorkspacesFold
from .store import FOLLOWS, ROW_ERRORS, Forensics, ReadView, RowsUnreadable, Scratch, Store

Progress = Callable[[int, int], None]

#: The legal range of ``meta.compensation_window_s``, in seconds. 0 would release every
#: pre-image the moment its step is acked (nothing could be compensated), and a window
#: past ten years keeps them forever (and overflows the nanosecond arithmetic of GC);
#: neither is a choice steptrail offers, so such a stored value was put there by hand.
COMPENSATION_WINDOW_S_MIN: Final = 1.0
COMPENSATION_WINDOW_S_MAX: Final = 10 * 365 * 86400.0
_HEX: Final = frozenset("0123456789abcdef")


def window_problem(value: str | float) -> str | None:
    """What is wrong with a compensation window (a stored meta text or an option), or None."""
    try:
        window = float(value)
    except (TypeError, ValueError):
        return f"is {str(value)[:40]!r}, not a number of seconds"
    if not COMPENSATION_WINDOW_S_MIN <= window <= COMPENSATION_WINDOW_S_MAX:  # NaN fails too
        return (f"is {str(value)[:40]}, outside {COMPENSATION_WINDOW_S_MIN:g}s to"
                f" {COMPENSATION_WINDOW_S_MAX:g}s (ten years)")
    return None


class Finding(msgspec.Struct, frozen=True):
    """One thing verify found wrong. `seq` is 0 when it concerns no single event.

    >>> from ledger import Finding
    >>> Finding(check="chain", seq=7, message="hash does not follow").seq
    7
    """

    # "integrity", "chain", "seq", "row", "head", "projection", "schema", "meta", "blob", "gc"
    check: str
    seq: int
    message: str


class VerifyReport(msgspec.Struct, kw_only=True):
    """What `Ledger.verify` found: `ok` when the chain, the projections and the fences all
    hold; otherwise the `findings`.

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch")
    ...     report = ledger.verify()
    >>> report.ok, report.events, report.findings
    (True, 1, [])
    """

    ok: bool
    events: int
    head_seq: int
    head_hash: str
    steps: int
    projection_lag: int
    findings: list[Finding]
    #: not damage, but worth an operator's eye (they do not make `ok` false)
    warnings: list[Finding] = msgspec.field(default_factory=list)


class WeakenedPlans:
    """Warnings for attempts planned with the protection off: a fence mode other than
    ``step`` (``plan`` compares only the workspace rev; ``none`` overwrites a human's
    edit) or the apply journal off (a redelivery applies twice). Only an operator can
    choose that (the command line's flags, the library's parameters); the `planned`
    event records it and verify reports it, so it is never silent. At most `SHOWN`
    are listed, then one line counts the rest."""

    SHOWN: Final = 50

    def __init__(self) -> None:
        self.warnings: list[Finding] = []
        self.count = 0

    def feed(self, seq: int, event: object) -> None:
        if not isinstance(event, Planned) or (event.fence == "step" and event.journal):
            return
        self.count += 1
        if self.count > self.SHOWN:
            return
        off, risks = [], []
        if event.fence != "step":
            off.append(f"fence {event.fence!r}")
            risks.append("its writes were not checked against a human's edit" if event.fence
                         == "none" else "its writes were checked only against the workspace rev")
        if not event.journal:
            off.append("the apply journal off")
            risks.append("a redelivered apply applies again")
        self.warnings.append(Finding(
            "weakened-fence", seq, f"step {event.step!r} attempt {event.attempt} was planned"
            f" with {' and '.join(off)} (an operator's choice): {'; '.join(risks)}"))

    def report(self) -> list[Finding]:
        more = self.count - len(self.warnings)
        return self.warnings + ([Finding("weakened-fence", 0, f"{more} more {'attempt was' if more == 1 else 'attempts were'}"
                                         " planned with the fence or the journal off")]
                                if more else [])


def _seq_finding(expected_seq: int, seq: int) -> Finding:
    return Finding("seq", seq, f"expected event #{expected_seq} next, found #{seq}:"
                   f" {seq - expected_seq} {'event' if seq - expected_seq == 1 else 'events'}"
                   " missing or reordered")


class SealGaps:
    """The chain across the holes seals left (docs/design.md "Sealed runs"), checked from
    the ledger alone. Each `run-sealed` event (itself in the chain) lists the ranges it
    removed, with the hash the first removed row chained to, the hash of the last one and
    a digest over all of them. Every hole the walk finds must be tiled exactly by such
    ranges, linked end to end: the row before it has the first range's `prev_hash`, each
    range's `last_hash` is the next one's `prev_hash`, and the row after it chains to the
    last range's `last_hash`. A hole nothing explains is reported as the seq and chain
    findings it always was; a range that tiles no hole (its rows are still there) too."""

    def __init__(self) -> None:
        self.gaps: dict[int, tuple[int, bytes, bytes, int]] = {}  # first -> (last, prev, last hash, seal)
        self.runs: dict[int, str] = {}  # first -> the sealed run
        self.findings: list[Finding] = []

    def feed(self, seq: int, event: Any) -> None:
        for gap in event.gaps:
            if not gap.first_seq <= gap.last_seq < seq:
                self.findings.append(Finding("chain", seq, f"VIOLATION: seal #{seq} names"
                                             f" events #{gap.first_seq}..#{gap.last_seq},"
                                             " which do not all precede it"))
                continue
            if gap.first_seq in self.gaps:
                self.findings.append(Finding("chain", seq, f"VIOLATION: seal #{seq} names"
                                             f" events from #{gap.first_seq}, which an"
                                             " earlier seal already removed"))
                continue
            self.gaps[gap.first_seq] = (gap.last_seq, bytes.fromhex(gap.prev_hash),
                                        bytes.fromhex(gap.last_hash), seq)
            self.runs[gap.first_seq] = event.sealed_run

    def check_ranges(self, rows: Any) -> list[Finding]:
        """Each row of `sealed_ranges` (first, last, run, seal) must be a range its seal
        event records, of that seal's run: the append-only rule lets a DELETE through
        inside such a row, so a row no seal records is a forgery (or damage)."""
        out = []
        for first, last, run, seal in rows:
            gap = self.gaps.get(first)
            if gap is None or (gap[0], gap[3], self.runs[first]) != (last, seal, run):
                out.append(Finding("seal", seal, f"VIOLATION: sealed_ranges names events"
                                   f" #{first}..#{last} of run {run!r} under seal #{seal},"
                                   " which that seal does not record: a forged or damaged"
                                   " row (it would let those events be deleted)"))
        return out

    def resolve(self, jumps: list[tuple[int, bytes, int, bytes]]) -> list[Finding]:
        out = list(self.findings)
        used: set[int] = set()
        for first, before, after_seq, after_prev in jumps:
            at, link, tiled = first, before, []
            while at < after_seq and at in self.gaps:
                last, prev_hash, last_hash, _seal = self.gaps[at]
                if prev_hash != link:
                    break
                tiled.append(at)
                at, link = last + 1, last_hash
            if at == after_seq and link == after_prev:
                used.update(tiled)
                continue
            out.append(_seq_finding(first, after_seq))
            if after_prev != before:
                out.append(Finding("chain", after_seq, f"event #{after_seq} does not link to"
                                   " the event before it (deleted, inserted or reordered"
                                   " history)"))
        for first in sorted(self.gaps.keys() - used):
            last, _p, _l, seal = self.gaps[first]
            out.append(Finding("chain", seal, f"VIOLATION: seal #{seal} says events"
                               f" #{first}..#{last} were removed, but the ledger's rows do"
                               " not show that hole (rows kept, or a forged seal)"))
        return out


def verify(
    store: Store,
    log: EventLog,
    *,
    expect_head: Head | None = None,
    progress: Progress | None = None,
    blob_check: Callable[[str, int], str | None] | None = None,
) -> VerifyReport:
    """Every finding about the ledger; `blob_check(digest, size)` returns a problem
    (missing, corrupt) or None, and is asked about every blob a live manifest names."""
    findings: list[Finding] = list(_schema(store))
    with store.read() as view:
        findings.extend(Finding("integrity", 0, m)
                        for m in view.integrity_problems()[:20])

        total = log.count()
        prev = log.genesis
        expected_seq = 1
        matched_expected = expect_head is None or expect_head.seq == 0
        done = 0
        checker = Checker()
        weakened = WeakenedPlans()
        seals = SealGaps()
        jumps: list[tuple[int, bytes, int, bytes]] = []
        # What a retention policy let go of: (step, path, digest) -> the seq of its latest
        # release, which lets go of the manifests published before it (by (step, rev)).
        released: dict[tuple[str, str, str], int] = {}
        published: dict[tuple[str, int], int] = {}
        rows = view.checked_rows()
        while True:
            try:
                got = next(rows, None)
            except RowsUnreadable as exc:  # the store cannot read the rest of the table
                findings.append(Finding("row", 0, f"the events table cannot be read past"
                                        f" event #{expected_seq - 1}: {exc}"))
                break
            if got is None:
                break
            row, problem = got
            done += 1
            if progress is not None and done % 10_000 == 0:
                progress(done, total)
            if problem is not None:
                seq = row.seq
                findings.append(Finding("row", seq if isinstance(seq, int) else 0,
                                        f"event #{seq} is damaged: {problem}"))
                if isinstance(seq, int):
                    expected_seq = seq + 1
                if isinstance(row.hash, bytes):
                    prev = row.hash
                continue
            (seq, time_ns, ws, run, step, attempt, epoch, rev, key, kind, v, payload,
             prev_hash, digest) = row
            if seq != expected_seq and seq > expected_seq:
                # A hole: a seal's removal (its gaps, checked at the end) or damage.
                jumps.append((expected_seq, prev, seq, bytes(prev_hash)))
            elif seq != expected_seq:
                findings.append(_seq_finding(expected_seq, seq))
            if seq == expected_seq and bytes(prev_hash) != prev:
                findings.append(Finding(
                    "chain", seq, f"event #{seq} does not link to the event before it"
                    " (deleted, inserted or reordered history)",
                ))
            expected_seq = seq + 1
            try:
                event = decode(payload, v)
            except (msgspec.DecodeError, InvalidInput, ValueError, TypeError) as exc:
                findings.append(Finding("row", seq, f"event #{seq} cannot be decoded: {exc}"))
                prev = bytes(digest)
                continue
            if kind == "run-sealed":
                seals.feed(seq, event)  # type: ignore[arg-type]
            elif kind == "history-released":
                released.update(((x.step, x.path, x.digest), seq)
                                for x in event.versions)  # type: ignore[attr-defined]
            elif kind == "manifest-published":
                published[(step, event.manifest_rev)] = seq  # type: ignore[attr-defined]
            checker.feed(seq, time_ns, event)
            weakened.feed(seq, event)
            env = envelope(event)
            recomputed = chain_hash(bytes(prev_hash), seq, time_ns, env, key, kind, v, payload)
            if recomputed != bytes(digest):
                findings.append(Finding(
                    "chain", seq, f"event #{seq} does not match its hash (its content,"
                    " metadata or position was edited)",
                ))
            if (ws, run, step, attempt, epoch, rev) != (
                env.workspace, env.run, env.step, env.attempt, env.epoch, env.rev
            ) or EVENT_TYPES.get(kind) is not type(event):
                findings.append(Finding(
                    "row", seq, f"event #{seq}'s columns disagree with its payload",
                ))
            if key != journal_key(event, v):
                findings.append(Finding(
                    "row", seq, f"event #{seq}'s journal key {key} is not the one its event derives",
                ))
            prev = bytes(digest)
            if expect_head is not None and seq == expect_head.seq:
                matched_expected = bytes(digest) == expect_head.hash
                if not matched_expected:
                    findings.append(Finding(
                        "head", seq, f"event #{seq} has hash {bytes(digest).hex()[:16]}…, not the"
                        f" expected head {expect_head.hash.hex()[:16]}… (history was rewritten"
                        " or rolled back)",
                    ))
        if progress is not None:
            progress(done, total)
        findings.extend(seals.resolve(jumps))
        findings.extend(seals.check_ranges(view.table_rows("sealed_ranges")))
        findings.extend(Finding(b.invariant, b.seq, f"VIOLATION: {b.message}")
                        for b in checker.breaches)
        head = log.head()
        if expect_head is not None and expect_head.seq > head.seq:
            findings.append(Finding(
                "head", 0, f"the ledger ends at event #{head.seq} but head #{expect_head.seq}"
                " was recorded: its tail was cut off or the file was rolled back",
            ))
            matched_expected = False

        findings.extend(_meta_facts(view))
        findings.extend(_checkpoint_facts(view, head.seq))
        findings.extend(_blob_row_facts(view))
        cp = checkpoint(view)
        lag = max(0, head.seq - cp.last_seq)
        n_steps = 0
        try:
            with view.scratch() as fresh:
                refs, ws, _ = fold_into(log, fresh)
                n_steps = fresh.step_count()
                findings.extend(_compare_tables(view, fresh, refs, ws, log, cp, head.seq))
                findings.extend(_condemned_facts(store, fresh, refs))
                if blob_check is not None:
                    findings.extend(_durability(fresh, blob_check, released, published))
        except CorruptLedger as exc:  # an undecodable row or a broken lifecycle: report it
            n_steps = 0
            findings.append(Finding(
                "projection", 0, f"the steps cannot be folded from the events: {exc.why}"
            ))
        except ROW_ERRORS as exc:  # a damaged projection row (NULL or wrong-typed cells)
            findings.append(Finding(
                "projection", 0, f"the projection tables cannot be read: {type(exc).__name__}: {exc}"
            ))
        except RowsUnreadable as exc:  # the store cannot read them (a damaged page)
            findings.append(Finding("projection", 0, f"the projection tables cannot be read: {exc}"))
    return VerifyReport(
        ok=not findings,
        events=total,
        head_seq=head.seq,
        head_hash=head.hash.hex(),
        steps=n_steps,
        projection_lag=lag,
        findings=findings,
        warnings=weakened.report(),
    )


def _compare_tables(view: ReadView, fresh: Scratch, refs: RefsFold, ws: WorkspacesFold,
                    log: EventLog, cp: Checkpoint, head_seq: int) -> list[Finding]:
    """The projection tables against the rebuild, compared by the store (spilled there,
    not held here). Tables an older version wrote (another projection version) or that
    lag the log are read as `read_steps` & co. read them: folded (the comparison then
    holds by construction) or, for steps, overlaid with the lagging tail."""
    if cp.version != STEPS_VERSION:
        return []
    out: list[Finding] = []
    if cp.last_seq < head_seq:
        overlay: dict[str, StepRow] = {}
        fold_rows(log, cp.last_seq, overlay, view.step, None, None, 0)
        fresh.overlay_steps([r.as_tuple() for r in overlay.values()])
    else:
        out += _compare_refs(view, fresh, refs)
        out += _compare_workspaces(ws, read_workspaces(log))
    out += [_step_finding(step_id, a, b) for step_id, a, b in fresh.step_differences()]
    return out


def exposure_warnings(path: str, blob_root: str) -> list[Finding]:
    """Warnings (not damage) for a ledger other local users can read: the database file
    or its blob store root open to group or others. A ledger holds every version of every
    file its steps wrote; the next read-write open takes that access away."""
    out = []
    for what, p in (("the ledger file", path), ("the blob store", blob_root)):
        try:
            mode = stat.S_IMODE(os.lstat(p).st_mode)
        except OSError:
            continue
        if mode & 0o077:
            out.append(Finding("exposure", 0, f"{what} {p} is mode {mode:04o}: other local users"
                               " can read every version of every file a step wrote; the next"
                               " read-write open makes it private (or: chmod go-rwx)"))
    return out


def _schema(store: Store) -> list[Finding]:
    """A forensic open of a ledger whose schema differs outside its tables: each change.
    Without its append-only triggers the events could be rewritten in place by anyone
    who can write the file (the chain check below still sees what was)."""
    info = store.info
    return [Finding("schema", 0, f"VIOLATION: the schema differs from a steptrail"
                    f" v{info.version} ledger: {change}") for change in info.schema_changes]


def _meta_facts(view: Forensics) -> list[Finding]:
    """The facts `meta` holds that openers act on: the ledger id (the chain's genesis),
    its creation time, the compensation window (GC and `compensate` act on it)."""
    out = []
    meta: dict[Any, Any] = view.meta_all()
    ledger_id = meta.get("ledger_id")
    if not (isinstance(ledger_id, str) and len(ledger_id) == 32 and set(ledger_id) <= _HEX):
        out.append(Finding("meta", 0, f"VIOLATION: meta ledger_id is {str(ledger_id)[:40]!r},"
                           " not the 32 hex digits init writes"))
    created = meta.get("created_ns")
    if not (isinstance(created, str) and created.isascii() and created.isdigit()):
        out.append(Finding("meta", 0, f"VIOLATION: meta created_ns is {str(created)[:40]!r},"
                           " not a time in nanoseconds"))
    window = meta.get("compensation_window_s")
    if window is not None and window_problem(window) is not None:
        out.append(Finding("meta", 0, f"VIOLATION: meta compensation_window_s"
                           f" {window_problem(window)}: GC would release pre-images, and"
                           " compensate would refuse or allow, on an edited window"))
    return out


def _checkpoint_facts(view: Forensics, head_seq: int) -> list[Finding]:
    """The projection checkpoint: one row, following the log (`FOLLOWS`) or at or behind
    the head (a checkpoint ahead of the log would make catch-up skip the events in
    between), with a version number."""
    out = []
    for name, last_seq, version in view.checkpoint_rows():
        if name != STEPS_NAME:
            out.append(Finding("projection", 0, f"VIOLATION: projection_checkpoint holds a row"
                               f" {str(name)[:40]!r} no steptrail projection writes"))
        elif not isinstance(last_seq, int) or not (last_seq == FOLLOWS
                                                   or 0 <= last_seq <= head_seq):
            out.append(Finding("projection", 0, f"VIOLATION: projection_checkpoint says the"
                               f" projections folded event #{last_seq}, but the log ends at"
                               f" #{head_seq}: catching up would skip events"))
        elif not isinstance(version, int) or version < 0:
            # (another version, older or newer, is a legal lag: the tables are refolded)
            out.append(Finding("projection", 0, f"VIOLATION: projection_checkpoint version"
                               f" {version!r} is not a projection version"))
    return out


def _blob_row_facts(view: Forensics) -> list[Finding]:
    """Inline blob rows: a well-formed name and a size column that is the data's length
    (audit and GC account by the column)."""
    out = []
    for digest, size, length in view.inline_row_problems(20):
        out.append(Finding("blob", 0, f"VIOLATION: inline blob row {str(digest)[:16]}… says"
                           f" {size} bytes and holds {length}, or is not named by a digest"))
    return out


def _condemned_facts(store: Store, fresh: Scratch, refs: RefsFold) -> list[Finding]:
    """GC's condemned rows (its resumable state, not derived from events). A collector
    writes well-formed rows (a digest, the stored blob's size and place, its 16-hex run
    id) for stored orphans; a publish or a pin naming a condemned blob deletes its row in
    the same transaction. A row naming a blob a manifest or a live artifact/post-image
    pin holds exists only while a collector runs (between its condemn and its re-check),
    so it is reported when none runs; `gc` re-checks such a row and spares the blob.
    Read by the store against the rebuild's manifests: memory does not follow the log."""
    held = {d for (_s, _a, d), (role, _seq) in refs.pins.items() if role != "pre-image"}
    running: bool | None = None
    out = []
    for c in fresh.condemned_checks():
        digest, size, is_inline, condemned_ns, collection = (
            c.digest, c.size, c.inline, c.condemned_ns, c.collection)
        why = None
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
            why = "is not named by a digest"
        elif not (isinstance(collection, str) and len(collection) == 16 and set(collection) <= _HEX):
            why = "names no collection a collector starts"
        elif (is_inline not in (0, 1) or not isinstance(size, int) or size < 0
              or not isinstance(condemned_ns, int) or condemned_ns < 0):
            why = f"has size {size!r}, inline {is_inline!r}, time {condemned_ns!r}"
        elif c.stored_inline is not None and (not is_inline or c.stored_inline != size):
            why = (f"says {size} bytes {'inline' if is_inline else 'in a file'}, but the stored"
                   f" blob is {c.stored_inline} bytes inline")
        elif c.referenced or digest in held:
            if running is None:
                running = store.held_elsewhere("gc")  # a collector is running now
            if not running:
                why = (f"names a blob a {'manifest references' if c.referenced else 'live pin holds'},"
                       " and no gc is running (planted, or left by a gc killed between"
                       " condemning and re-checking: 'steptrail gc' re-checks and spares it)")
        if why is not None:
            out.append(Finding("gc", 0, f"VIOLATION: condemned row {str(digest)[:16]}…"
                               f" (collection {str(collection)[:20]!r}) {why}"))
            if len(out) >= 20:
                break
    return out


def _durability(fresh: Scratch, blob_check: Callable[[str, int], str | None],
                released: dict[tuple[str, str, str], int] | None = None,
                published: dict[tuple[str, int], int] | None = None) -> list[Finding]:
    """I1: a visible manifest implies every blob it names is retrievable and intact — but
    a version of a workspace file a retention policy released (`history-released`, after
    the manifest that names it was published) may be gone: that is what the policy asked
    for, recorded in the chain (a corrupt one is still reported; an artifact is never a
    version)."""
    out = []
    for step, rev, role, path, digest, size in fresh.live_entries():
        problem = blob_check(digest, size)
        if problem == "missing" and released and role == "write" \
                and released.get((step, path, digest), -1) \
                > (published or {}).get((step, rev), 1 << 62):
            continue
        if problem is not None:
            out.append(Finding(
                "durability", 0, f"VIOLATION: step {step!r} manifest r{rev} names {path} ->"
                f" blob {digest[:12]}…, which is {problem}",
            ))
    return out


def _compare_refs(view: ReadView, fresh: Scratch, refs: RefsFold) -> list[Finding]:
    """Pins (live ones: few) compared in memory; manifests and their entries by the store."""
    out = []
    pins = sorted(view.pin_rows())
    a = refs.pin_rows()
    diffs = [("pins", [r for r in pins if r not in a][:3], [r for r in a if r not in pins][:3])]
    diffs += fresh.ref_differences()
    for name, extra, missing in diffs:
        if extra or missing:
            out.append(Finding(
                "projection", 0, f"the {name} table differs from a rebuild:"
                f" unexpected {extra}, missing {missing}",
            ))
    return out


def _compare_workspaces(fresh: WorkspacesFold, current: WorkspacesFold) -> list[Finding]:
    out = []
    for name, a, b in zip(("workspaces", "workspace paths"), fresh.table_rows(),
                          current.table_rows(), strict=True):
        if a != b:
            extra = [r for r in b if r not in a][:3]
            missing = [r for r in a if r not in b][:3]
            out.append(Finding(
                "projection", 0, f"the {name} table differs from a rebuild:"
                f" unexpected {extra}, missing {missing}",
            ))
    return out


def _step_finding(step_id: str, a: StepRow | None, b: StepRow | None) -> Finding:
    """How step `step_id`'s row (`b`) differs from the rebuild's (`a`)."""
    if a is None or b is None:
        what = "is missing from the projection" if b is None else "has no events"
    else:
        diffs = [
            f"{c}={getattr(b, c)!r} (rebuild: {getattr(a, c)!r})"
            for c in StepRow.COLUMNS if getattr(a, c) != getattr(b, c)
        ]
        what = "differs from a rebuild: " + ", ".join(diffs)
    return Finding("projection", 0, f"step {step_id!r} {what}")


__all__ = ["COMPENSATION_WINDOW_S_MAX", "COMPENSATION_WINDOW_S_MIN", "Finding", "VerifyReport",
           "WeakenedPlans", "exposure_warnings", "verify", "window_problem"]

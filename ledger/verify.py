"""Verification: the hash chain, seq density, row integrity and projections.

`verify` reads everything and writes nothing. It returns every finding, not just
the first, so an operator sees the whole damage at once.

A hash chain sees any edit, deletion, reordering or insertion, but not its own tail
cut off or the whole file rolled back to an older genuine copy: for that the caller
passes the head recorded elsewhere (`expect_head`, as printed by `stepledger head`),
and verify proves the ledger still holds exactly that event at that seq.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import apsw
import msgspec

from .db import ROW_ERRORS, Database
from .errors import CorruptLedger, InvalidInput
from .events import EVENT_TYPES, Planned, chain_hash, decode, envelope, journal_key
from .log import READ_BATCH, ROW_COLUMNS, ROW_NAMES, ROW_TYPES, EventLog, Head, row_problem
from .projections import (
    StepRow,
    checkpoint,
    fold_all,
    read_refs,
    read_steps,
    read_workspaces,
)
from .invariants import Checker
from .projections.workspaces import WorkspacesFold
from .projections.refs import RefsFold, fold_tables

Progress = Callable[[int, int], None]


class Finding(msgspec.Struct, frozen=True):
    """One thing verify found wrong. `seq` is 0 when it concerns no single event."""

    check: str  # "integrity", "chain", "seq", "row", "head", "projection"
    seq: int
    message: str


class VerifyReport(msgspec.Struct, kw_only=True):
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
        return self.warnings + ([Finding("weakened-fence", 0, f"{more} more attempt(s) were"
                                         " planned with the fence or the journal off")]
                                if more else [])


def verify(
    db: Database,
    log: EventLog,
    *,
    expect_head: Head | None = None,
    progress: Progress | None = None,
    blob_check: Callable[[str, int], str | None] | None = None,
) -> VerifyReport:
    """Every finding about the ledger; `blob_check(digest, size)` returns a problem
    (missing, corrupt) or None, and is asked about every blob a live manifest names."""
    findings: list[Finding] = []
    with db.snapshot() as conn:
        try:
            quick = [r[0] for r in conn.execute("PRAGMA quick_check")]
        except apsw.Error as exc:
            quick = [str(exc)]
        if quick != ["ok"]:
            findings.extend(Finding("integrity", 0, f"SQLite quick_check: {m}") for m in quick[:20])

        total = log.count()
        prev = log.genesis
        expected_seq = 1
        matched_expected = expect_head is None or expect_head.seq == 0
        done = 0
        checker = Checker()
        weakened = WeakenedPlans()
        rows = _checked_rows(conn)
        while True:
            try:
                got = next(rows, None)
            except apsw.Error as exc:  # SQLite cannot read the rest of the table
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
                seq = row[0]
                findings.append(Finding("row", seq if isinstance(seq, int) else 0,
                                        f"event #{seq} is damaged: {problem}"))
                if isinstance(seq, int):
                    expected_seq = seq + 1
                if isinstance(row[13], bytes):
                    prev = row[13]
                continue
            (seq, time_ns, ws, run, step, attempt, epoch, rev, key, kind, v, payload,
             prev_hash, digest) = row
            if seq != expected_seq:
                findings.append(Finding(
                    "seq", seq, f"expected event #{expected_seq} next, found #{seq}:"
                    f" {seq - expected_seq} event(s) missing or reordered",
                ))
            expected_seq = seq + 1
            if bytes(prev_hash) != prev:
                findings.append(Finding(
                    "chain", seq, f"event #{seq} does not link to the event before it"
                    " (deleted, inserted or reordered history)",
                ))
            try:
                event = decode(payload, v)
            except (msgspec.DecodeError, InvalidInput, ValueError, TypeError) as exc:
                findings.append(Finding("row", seq, f"event #{seq} cannot be decoded: {exc}"))
                prev = bytes(digest)
                continue
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
        findings.extend(Finding(b.invariant, b.seq, f"VIOLATION: {b.message}")
                        for b in checker.breaches)
        head = log.head()
        if expect_head is not None and expect_head.seq > head.seq:
            findings.append(Finding(
                "head", 0, f"the ledger ends at event #{head.seq} but head #{expect_head.seq}"
                " was recorded: its tail was cut off or the file was rolled back",
            ))
            matched_expected = False

        cp = checkpoint(conn)
        lag = max(0, head.seq - cp.last_seq)
        try:
            fresh_refs = RefsFold()
            fresh_ws = WorkspacesFold()
            fresh = fold_all(log, refs=fresh_refs, ws=fresh_ws)
            current = {r.step_id: r for r in read_steps(db, log)}
            findings.extend(_compare_refs(fresh_refs, read_refs(db, log)))
            findings.extend(_compare_workspaces(fresh_ws, read_workspaces(db, log)))
            if blob_check is not None:
                findings.extend(_durability(fresh, fresh_refs, blob_check))
        except CorruptLedger as exc:  # an undecodable row or a broken lifecycle: report it
            fresh = {}
            findings.append(Finding(
                "projection", 0, f"the steps cannot be folded from the events: {exc.why}"
            ))
        except ROW_ERRORS as exc:  # a damaged projection row (NULL or wrong-typed cells)
            fresh = {}
            findings.append(Finding(
                "projection", 0, f"the projection tables cannot be read: {type(exc).__name__}: {exc}"
            ))
        else:
            findings.extend(_compare(fresh, current))
    return VerifyReport(
        ok=not findings,
        events=total,
        head_seq=head.seq,
        head_hash=head.hash.hex(),
        steps=len(fresh),
        projection_lag=lag,
        findings=findings,
        warnings=weakened.report(),
    )


_TEXT_COLUMNS: Final = frozenset({"workspace", "run", "step", "journal_key", "kind"})
_SQL: Final = f"SELECT {ROW_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
#: The same with TEXT cells read as bytes: apsw decodes TEXT strictly, so one invalid
#: UTF-8 cell fails its whole batch; that batch is read again this way, row by row.
_RAW_SQL: Final = "SELECT {} FROM events WHERE seq > ? ORDER BY seq LIMIT ?".format(", ".join(
    f"CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END" if c in _TEXT_COLUMNS
    else c for c in ROW_NAMES))


def _checked_rows(conn: apsw.Connection) -> Iterator[tuple[tuple[Any, ...], str | None]]:
    """Every events row in seq order with what is wrong with its cells (None: nothing)."""
    last = 0
    while True:
        try:
            got = [(r, None if tuple(map(type, r)) == ROW_TYPES else row_problem(r))
                   for r in conn.execute(_SQL, (last, READ_BATCH)).fetchall()]
        except UnicodeDecodeError:
            got = [_decode_row(r) for r in conn.execute(_RAW_SQL, (last, READ_BATCH)).fetchall()]
        yield from got
        if len(got) < READ_BATCH:
            return
        last = got[-1][0][0]


def _decode_row(row: tuple[Any, ...]) -> tuple[tuple[Any, ...], str | None]:
    """The row with its TEXT cells decoded, and what is wrong with it (None: nothing)."""
    out = list(row)
    for i, name in enumerate(ROW_NAMES):
        if name in _TEXT_COLUMNS and isinstance(out[i], bytes):
            try:
                out[i] = out[i].decode("utf-8")
            except UnicodeDecodeError:
                return tuple(out), f"its {name} is not valid UTF-8"
    return tuple(out), row_problem(tuple(out))


def _durability(
    steps: dict[str, StepRow], refs: RefsFold, blob_check: Callable[[str, int], str | None]
) -> list[Finding]:
    """I1: a visible manifest implies every blob it names is retrievable and intact."""
    live = {(s.step_id, s.manifest_rev) for s in steps.values() if s.live}
    out = []
    for step, rev, _role, path, digest, size in sorted(refs.entries):
        if (step, rev) not in live:
            continue
        problem = blob_check(digest, size)
        if problem is not None:
            out.append(Finding(
                "durability", 0, f"VIOLATION: step {step!r} manifest r{rev} names {path} ->"
                f" blob {digest[:12]}…, which is {problem}",
            ))
    return out


def _compare_refs(fresh: RefsFold, current: RefsFold) -> list[Finding]:
    out = []
    names = ("pins", "manifests", "manifest entries")
    for name, a, b in zip(names, fold_tables(fresh), fold_tables(current), strict=True):
        if a != b:
            extra = [r for r in b if r not in a][:3]
            missing = [r for r in a if r not in b][:3]
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


def _compare(fresh: dict[str, StepRow], current: dict[str, StepRow]) -> list[Finding]:
    out = []
    for step_id in sorted(fresh.keys() | current.keys()):
        a, b = fresh.get(step_id), current.get(step_id)
        if a != b:
            if a is None or b is None:
                what = "is missing from the projection" if b is None else "has no events"
            else:
                diffs = [
                    f"{c}={getattr(b, c)!r} (rebuild: {getattr(a, c)!r})"
                    for c in StepRow.COLUMNS if getattr(a, c) != getattr(b, c)
                ]
                what = "differs from a rebuild: " + ", ".join(diffs)
            out.append(Finding("projection", 0, f"step {step_id!r} {what}"))
    return out


__all__ = ["Finding", "VerifyReport", "WeakenedPlans", "verify"]

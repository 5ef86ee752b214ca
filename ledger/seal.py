"""Sealed runs: a settled run's events move into a verifiable archive file, and the
ledger keeps one `run-sealed` event in their place (docs/design.md "Sealed runs").

- `sealable(ledger)` says which runs could be sealed and what that would remove.
- `seal_run(ledger, run)` writes the archive durably, checks it, then in one
  transaction appends the seal event (its gaps, tombstones and archived blobs) and
  deletes the run's rows — the only DELETE the events table's trigger allows.
- `verify_archive(path, ledger=)` re-checks an archive on its own (every row's hash,
  each gap's digest, every blob) and against the seal that names it; a foreign or
  damaged file is refused with `ArchiveInvalid`.
- `read_archive(path)` reads an archived run in place; `sealed_runs(ledger)` lists the
  seals; `verify_sealed(ledger)` verifies the ledger and every archive together.
- `archive_dir_of(ledger)` is where its archives are: beside a SQLite file, or the
  directory a ledger in a database recorded at its first seal (`ARCHIVE_DIR_META`);
  `carry_archives` copies a ledger's archives into a copy's directory, each verified.

Nothing a live or unsettled run needs is archived: every step of the run must be
settled (acked, compensated, rejected), hold no pin, take no lease and write no
workspace (a workspace's revisions are folded from its steps' events), and no step of
it may be state a reader of the live ledger reads back (`READ_BACK_PREFIXES`: a
LangGraph thread's checkpoints, until the thread is deleted).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import msgspec

from .errors import (
    ArchiveInvalid,
    ArchiveMissing,
    CorruptLedger,
    InvalidInput,
    NotSealable,
    ReadOnlyLedger,
)
from .events import (
    Event,
    RecordedEvent,
    SealedBlob,
    SealedStep,
    SealGap,
    Sealed,
    chain_hash,
    check_step_id,
    decode,
    envelope,
)
from .ledger import Ledger
from .projections.steps import SEALED, SETTLED
from .store import ARCHIVE_DIR_META, EventQuery, EventReader, EventRow, Forensics, ReadView, Tx
from .store.base import check_row, row_to_recorded
from .store.archives import ArchiveFile, remove_stray_temporaries, write_archive
from .verify import Finding, VerifyReport

ARCHIVE_SUFFIX: Final = ".slarchive"
ARCHIVE_FORMAT: Final = "stepledger-archive/1"
_DOMAIN: Final = b"stepledger/seal/v1\x00"
#: The header keys every archive has.
_HEADER_KEYS: Final = frozenset({"format", "ledger_id", "run", "events", "first_seq",
                                 "archive_digest", "gaps", "blobs", "size_bytes"})
#: Kinds a sealable run may not hold: its steps' revisions of a workspace.
_WORKSPACE_KINDS: Final = frozenset({"fenced"})
#: Step ids under which a front end keeps state that it reads back from the live
#: ledger's events for as long as the step is live: ledger.langgraph's checkpoints and
#: pending writes, a thread's state (its run: the thread). A run holding such a live step
#: is not sealable — the seal would take the thread's state from under its readers (a
#: fresh saver would find the thread empty) —, so a thread's run is sealable only once
#: the thread was deleted (every such step ended). A live thread shrinks by prune + gc.
READ_BACK_PREFIXES: Final = ("langgraph/",)


def gap_digest(hashes: Sequence[bytes]) -> str:
    """sha256 over a gap's removed rows' hashes, in seq order."""
    return hashlib.sha256(_DOMAIN + b"gap\x00" + b"".join(hashes)).hexdigest()


def archive_digest(ledger_id: str, run: str, hashes: Sequence[bytes]) -> str:
    """sha256 naming an archive's rows: the ledger, the run and every row's hash."""
    return hashlib.sha256(_DOMAIN + ledger_id.encode() + b"\x00" + run.encode("utf-8")
                          + b"\x00" + b"".join(hashes)).hexdigest()


def default_archive_dir(ledger: Ledger) -> str:
    """``archive/`` beside the ledger file (inside ``.steptrail/``); a SQLite ledger's."""
    return os.path.join(os.path.dirname(os.path.abspath(ledger.path)), "archive")


def archive_dir_at(location: str, view: Forensics) -> str | None:
    """Where the ledger at `location` (read through `view`) keeps its archives:
    ``archive/`` beside a SQLite file; for a ledger in a database, the directory its
    first seal recorded (None: it was never sealed). Never a place under the current
    directory for a URL."""
    from .store import locate

    if locate(location).archives_beside:
        return os.path.join(os.path.dirname(os.path.abspath(location)), "archive")
    return view.meta(ARCHIVE_DIR_META)


def archive_dir_of(ledger: Ledger) -> str | None:
    """`archive_dir_at` of an open ledger."""
    if ledger.blobs.root is not None:
        return default_archive_dir(ledger)
    return ledger.storage.view.meta(ARCHIVE_DIR_META)


def _directory(ledger: Ledger, archive_dir: str | None) -> str | None:
    """The archive directory a command reads: `archive_dir` when given (absolute, for a
    ledger in a database: a relative one would be another place in every current
    directory), else the ledger's own (`archive_dir_of`)."""
    if archive_dir is None:
        return archive_dir_of(ledger)
    if ledger.blobs.root is None and not os.path.isabs(archive_dir):
        raise InvalidInput(f"archive directory {archive_dir[:200]} is relative; a ledger in a"
                           " database keeps its archives in one absolute directory: give it"
                           " as /absolute/path (or leave --archive-dir out: the recorded one)")
    return archive_dir


def _seal_directory(ledger: Ledger, run: str, archive_dir: str | None) -> tuple[str, bool]:
    """Where `seal_run` writes the archive, and whether the seal records it (the first
    seal of a ledger in a database). A SQLite ledger's default is beside its file."""
    if ledger.blobs.root is not None:
        return archive_dir or default_archive_dir(ledger), False
    recorded = archive_dir_of(ledger)
    if archive_dir is None:
        if recorded is None:
            raise NotSealable(run, "a ledger in PostgreSQL keeps its seals' archives in a"
                              " directory it records at its first seal, and none is recorded"
                              " yet: give one (--archive-dir /absolute/path,"
                              " seal_run(archive_dir=...)); its rows stay")
        return recorded, False
    directory = os.path.normpath(_directory(ledger, archive_dir) or archive_dir)
    if recorded is not None and directory != recorded:
        raise InvalidInput(f"this ledger keeps its archives in {recorded[:200]} (recorded by its"
                           f" first seal), not {directory[:200]}: leave --archive-dir out, or"
                           " give that one (nothing was written)")
    return directory, recorded is None


def archive_name(ledger_id: str, run: str, first_seq: int) -> str:
    """The archive's file name: the ledger, the run, the first archived seq. A seal
    removes the rows from `first_seq`, so no later seal of the run can reuse the name."""
    run_tag = hashlib.sha256(run.encode("utf-8")).hexdigest()[:16]
    return f"{ledger_id[:12]}-{run_tag}-{first_seq}{ARCHIVE_SUFFIX}"


def gaps_of(rows: Sequence[EventRow]) -> list[SealGap]:
    """The contiguous seq ranges of `rows` (in seq order) as the seal records them."""
    out: list[SealGap] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i].seq != rows[i - 1].seq + 1:
            part = rows[start:i]
            out.append(SealGap(part[0].seq, part[-1].seq, bytes(part[0].prev_hash).hex(),
                               bytes(part[-1].hash).hex(), gap_digest([bytes(r.hash) for r in part])))
            start = i
    return out


# -- what may be sealed ----------------------------------------------------------------


class RunCandidate(msgspec.Struct, kw_only=True):
    """One run as `sealable` sees it: its steps, events and their bytes, and why it may
    not be sealed now (None: it may)."""

    run: str
    steps: int
    events: int
    size_bytes: int
    sealable: bool
    why: str | None = None
    #: the kind of `why`: "unsettled" (a step not yet acked, compensated or rejected),
    #: "live-thread" (a LangGraph thread's live state), "workspace" (it wrote a
    #: workspace: never sealed), "pinned" (a compensation window open), "sealed"
    cause: str | None = None


class SealableReport(msgspec.Struct, kw_only=True):
    """Which runs could be sealed and what sealing them would remove (events, and their
    payload bytes: the rows' main part; the file shrinks after `vacuum`)."""

    runs: list[RunCandidate]
    sealable_runs: int
    events: int
    size_bytes: int
    ledger_events: int


def sealable(ledger: Ledger) -> SealableReport:
    """Every run with steps in the ledger, and whether it could be sealed now (judged
    from the step rows and the pins; `seal_run` re-checks every event). Read-only."""
    per_run: dict[str, list[Any]] = {}
    with ledger.storage.read() as view:
        pinned = {r[0] for r in view.pin_rows()}
        for step in view.steps():
            if step.run:
                per_run.setdefault(step.run, []).append(step)
        counts: dict[str, list[int]] = {run: [0, 0] for run in per_run}
        for row in view.events():
            c = counts.get(row.run)
            if c is not None:
                c[0] += 1
                c[1] += len(row.payload)
        total = view.count()
    runs = []
    for run, steps in sorted(per_run.items()):
        problem = _step_problem(steps, pinned)
        n, size = counts[run]
        if problem is None and n == 0:
            problem = ("sealed", "it is sealed already")
        cause, why = problem or (None, None)
        runs.append(RunCandidate(run=run, steps=len(steps), events=n, size_bytes=size,
                                 sealable=why is None, why=why, cause=cause))
    ok = [r for r in runs if r.sealable]
    return SealableReport(runs=runs, sealable_runs=len(ok), events=sum(r.events for r in ok),
                          size_bytes=sum(r.size_bytes for r in ok), ledger_events=total)


def _step_problem(steps: Sequence[Any], pinned: set[str]) -> tuple[str, str] | None:
    """Why these steps' run may not be sealed now, as (cause, words); None: it may."""
    live = [s for s in steps if s.state not in SETTLED and s.state != SEALED]
    if live:
        return "unsettled", (f"step {live[0].step_id!r} is {live[0].state} (every step must be"
                             " acked, compensated or rejected)")
    read_back = [s for s in steps if s.live and s.step_id.startswith(READ_BACK_PREFIXES)]
    if read_back:
        return "live-thread", (
            f"step {read_back[0].step_id!r} is a LangGraph thread's live state, read back"
            " from the ledger (a checkpoint or pending write): a thread's run is sealed"
            " only once the thread is deleted (saver.delete_thread); shrink a live thread"
            " with saver.prune and gc")
    for s in steps:
        if s.epoch > 0 or s.rev > 0:
            return "workspace", (
                f"step {s.step_id!r} ran under a lease of workspace {s.workspace!r}"
                " (runs that write a workspace are not sealed: its revisions and"
                " restore are folded from their events)")
        if s.step_id in pinned:
            return "pinned", (f"step {s.step_id!r} still holds a pin (its compensation window"
                              " is open)")
    if steps and all(s.state == SEALED for s in steps):
        return "sealed", "it is sealed already"
    return None


class _Plan(msgspec.Struct, kw_only=True):
    run: str
    rows: list[Any]
    gaps: list[SealGap]
    steps: list[SealedStep]
    blobs: list[SealedBlob]
    digest: str
    size_bytes: int
    name: str


def _plan(ledger: Ledger, view: ReadView, run: str) -> _Plan:
    """Everything the seal of `run` will record, read in one snapshot; NotSealable when
    something live or unsettled needs the run."""
    rows = list(view.events(EventQuery(run=run)))
    held = {(h.scope, h.target): h for h in ledger.holds()}
    steps_of_run = {r.step for r in rows if r.step}
    hold = held.get(("run", run)) or next(
        (held[("step", s)] for s in sorted(steps_of_run) if ("step", s) in held), None)
    if hold is not None:
        what = f"run {run!r}" if hold.scope == "run" else f"its step {hold.target!r}"
        raise NotSealable(run, f"{what} is held ({hold.reason or 'no reason given'}):"
                          f" release it first with ledger.release_hold({hold.target!r},"
                          f" scope={hold.scope!r})").at_a_shell(
            f"run {run!r} cannot be sealed: {what} is held"
            f" ({hold.reason or 'no reason given'}); release it with 'steptrail hold"
            f" --release {'--step ' if hold.scope == 'step' else ''}{hold.target}'; nothing"
            " was archived")
    if not rows:
        raise NotSealable(run, "the ledger holds no events of it (never run, or sealed"
                          " already: seal_events(ledger) lists the seals)").at_a_shell(
            f"run {run!r} cannot be sealed: the ledger holds no events of it (never run, or"
            " sealed already: 'steptrail seal list'); nothing was archived")
    by_step: dict[str, int] = {}
    digests: dict[str, int] = {}
    for row in rows:
        try:
            check_row(row)
            event = decode(row.payload, row.v)
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError, InvalidInput) as exc:
            raise CorruptLedger(ledger.path, f"event #{row.seq} cannot be read: {exc}") from None
        kind = row.kind
        if not row.step:
            raise NotSealable(run, f"event #{row.seq} ({kind}) belongs to no step")
        if row.epoch > 0 or kind in _WORKSPACE_KINDS or getattr(event, "writes", ()) and kind == "planned":
            raise NotSealable(run, f"step {row.step!r} writes a workspace (event #{row.seq}, {kind});"
                              " runs that write a workspace are not sealed: its revisions and"
                              " restore are folded from their events")
        if kind == "compensated" and (event.restored or event.rev):  # type: ignore[union-attr]
            raise NotSealable(run, f"step {row.step!r} restored workspace paths (event #{row.seq})")
        by_step[row.step] = by_step.get(row.step, 0) + 1
        if kind == "manifest-published":
            for e in (*event.writes, *event.artifacts):  # type: ignore[union-attr]
                digests[e.digest] = e.size
        elif kind == "blob-stored":
            digests.setdefault(event.digest, event.size)  # type: ignore[union-attr]
    pinned = {r[0] for r in view.pin_rows()}
    tombstones = []
    step_rows = []
    for step_id in sorted(by_step):
        step = view.step(step_id)
        if step is None:
            raise CorruptLedger(ledger.path, f"step {step_id!r} has events but no row")
        step_rows.append(step)
        others = sum(1 for _ in view.events(EventQuery(step=step_id)))
        if others != by_step[step_id]:
            raise NotSealable(run, f"step {step_id!r} has events of another run too")
        tombstones.append(SealedStep(step_id, step.attempt, step.state, step.manifest_rev))
    problem = _step_problem(step_rows, pinned)
    if problem is not None:
        raise NotSealable(run, problem[1])
    blobs = []
    for digest, size in sorted(digests.items()):
        found = ledger.storage.blobs.stat(digest)
        if found is None:
            continue  # collected before (an unpublished artifact): nothing to keep
        blobs.append(SealedBlob(digest, found.size))
    ledger_id = ledger.ledger_id
    return _Plan(run=run, rows=rows, gaps=gaps_of(rows), steps=tombstones, blobs=blobs,
                 digest=archive_digest(ledger_id, run, [bytes(r.hash) for r in rows]),
                 size_bytes=sum(len(r.payload) for r in rows),
                 name=archive_name(ledger_id, run, rows[0].seq))


# -- sealing ---------------------------------------------------------------------------


class SealReport(msgspec.Struct, kw_only=True):
    """What `seal_run` did: the seal event's seq, the archive, what left the ledger.
    `adopted`: an archive a crashed seal had written was found intact and used."""

    run: str
    seal_seq: int
    archive: str
    events: int
    gaps: int
    steps: int
    blobs: int
    blob_bytes: int
    size_bytes: int
    adopted: bool = False
    #: inline blobs the seal removed from the ledger (the archive holds them)
    inline_removed: int = 0


def _header(ledger: Ledger, plan: _Plan) -> dict[str, str]:
    return {
        "format": ARCHIVE_FORMAT, "ledger_id": ledger.ledger_id, "run": plan.run,
        "events": str(len(plan.rows)), "first_seq": str(plan.rows[0][0]),
        "archive_digest": plan.digest, "blobs": str(len(plan.blobs)),
        "size_bytes": str(plan.size_bytes),
        "gaps": json.dumps(msgspec.to_builtins(plan.gaps)),
    }


def seal_run(ledger: Ledger, run: str, archive_dir: str | None = None, *,
             on_op: Callable[[str], None] | None = None) -> SealReport:
    """Seal `run`: archive its events and blobs, then remove them from the ledger.

    The archive is written first (durably) and verified; then one transaction appends
    the `run-sealed` event and deletes the run's rows. A crash before that COMMIT
    leaves the run whole in the ledger and at most an archive no seal names, which the
    next `seal_run` of the run adopts (when intact and of the same rows) or replaces.
    Raises NotSealable (nothing written) when something live or unsettled needs it.
    """
    check_step_id(run)
    if ledger.readonly:
        raise ReadOnlyLedger(ledger.path)
    directory, record = _seal_directory(ledger, run, archive_dir)
    with ledger.storage.read() as view:
        plan = _plan(ledger, view, run)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except (OSError, RecursionError, ValueError) as exc:
        raise InvalidInput(f"archive directory {directory[:200]} cannot be created ({type(exc).__name__});"
                           " give a directory that exists or can be made") from None
    remove_stray_temporaries(directory)
    path = os.path.join(directory, plan.name)
    adopted = False
    if os.path.exists(path):
        try:
            found = verify_archive(path)
            adopted = (found.archive_digest == plan.digest
                       and found.blob_set == sorted((b.digest, b.size) for b in plan.blobs))
        except ArchiveInvalid:
            adopted = False
    if not adopted:
        blob_bytes = ((b.digest, ledger.storage.blobs.read(b.digest, size=b.size))
                      for b in plan.blobs)
        write_archive(path, _header(ledger, plan), plan.rows, blob_bytes, on_op=on_op)
        checked = verify_archive(path)
        if checked.archive_digest != plan.digest:
            raise ArchiveInvalid(path, "it does not hold the rows just written")
    event = Sealed(sealed_run=run, archive=plan.name, archive_digest=plan.digest,
                   events=len(plan.rows), size_bytes=plan.size_bytes, gaps=tuple(plan.gaps),
                   steps=tuple(plan.steps), blobs=tuple(plan.blobs))
    seqs = [r.seq for r in plan.rows]

    def build(tx: Tx, _time_ns: int) -> Sequence[Event]:
        # Under the write lock: the run must be exactly what was archived.
        now = [r.seq for r in tx.events(EventQuery(run=run))]
        if now != seqs:
            raise NotSealable(run, "its events changed while it was being archived; seal"
                              " it again")
        for s in plan.steps:
            row = tx.step(s.step)
            if row is None or row.state != s.state or row.attempt != s.attempt:
                raise NotSealable(run, f"step {s.step!r} changed while it was being archived")
        return [event]

    def delete(tx: Tx, recorded: list[RecordedEvent]) -> None:
        if record:  # a ledger in a database: its first seal names the directory
            now = tx.meta(ARCHIVE_DIR_META)
            if now is None:
                tx.set_meta(ARCHIVE_DIR_META, directory)
            elif now != directory:
                raise NotSealable(run, f"another seal recorded {now[:200]} as this ledger's"
                                  " archive directory meanwhile; seal it again (without"
                                  " --archive-dir)")
        seal = recorded[0]
        if seal.deduped:
            raise CorruptLedger(ledger.path, f"run {run!r} was sealed by event #{seal.seq}"
                                " but its rows are still there")
        removed = tx.seal_rows(run, [(g.first_seq, g.last_seq) for g in plan.gaps], seal.seq)
        if removed != len(seqs):
            raise CorruptLedger(ledger.path, f"sealing run {run!r} removed {removed} rows,"
                                f" not the {len(seqs)} archived")
        # The inline bytes the archive now holds and nothing left in the ledger names
        # (no manifest, no pin: read in this transaction, under the write lock) leave
        # with the rows: no blob-collected event each. Blob files are GC's.
        for b in plan.blobs:
            if (tx.inline_stat(b.digest) is not None and not tx.names_digest(b.digest)
                    and not tx.pin_holds(b.digest)):
                tx.delete_inline(b.digest)
                dropped.append(b.digest)

    dropped: list[str] = []

    try:
        recorded = ledger.log.append(build, after=delete)
    except NotSealable:
        if not adopted:  # written for rows that were not sealed: no seal will ever name it
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    return SealReport(run=run, seal_seq=recorded[0].seq, archive=path, events=len(seqs),
                      gaps=len(plan.gaps), steps=len(plan.steps), blobs=len(plan.blobs),
                      blob_bytes=sum(b.size for b in plan.blobs),
                      size_bytes=plan.size_bytes, adopted=adopted, inline_removed=len(dropped))


# -- archives --------------------------------------------------------------------------


class ArchiveReport(msgspec.Struct, kw_only=True):
    """An archive checked: `ok` when it is intact and (given a ledger) a seal of that
    ledger names it with the same gaps; `findings` say what is not."""

    path: str
    ok: bool
    ledger_id: str
    run: str
    events: int
    blobs: int
    archive_digest: str
    seal_seq: int = 0
    findings: list[Finding] = msgspec.field(default_factory=list)
    #: every (digest, size) the archive holds, sorted: what a seal's `blobs` must equal
    blob_set: list[tuple[str, int]] = msgspec.field(default_factory=list)


def seal_events(ledger: Ledger) -> dict[str, tuple[int, Sealed]]:
    """Every seal the ledger holds: its archive digest -> (its seq, the seal)."""
    return seals_in(ledger.storage.view)


def seals_in(view: EventReader) -> dict[str, tuple[int, Sealed]]:
    """Every seal `view` holds: its archive digest -> (its seq, the seal)."""
    out: dict[str, tuple[int, Sealed]] = {}
    for row in view.events(EventQuery(kinds=frozenset({"run-sealed"}))):
        event = decode(row.payload, row.v)
        assert isinstance(event, Sealed)
        out[event.archive_digest] = (row.seq, event)
    return out


def verify_archive(path: str, ledger: Ledger | None = None, *,
                   seals: dict[str, tuple[int, Sealed]] | None = None) -> ArchiveReport:
    """Check the archive at `path` row by row: its format and header, every row's chain
    hash and its link to the row before it within each gap, each gap's digest and the
    archive's, every blob's bytes. Any of that wrong: ArchiveInvalid (the file is
    damaged or not an archive). With `ledger`: it must be that ledger's, and a seal in it
    must name it with the same gaps, events and blobs (else a finding: a stray archive
    of a seal that never committed, or one that does not match its seal)."""
    with ArchiveFile(path) as archive:
        header = archive.header
        missing = _HEADER_KEYS - header.keys()
        if missing or header.get("format") != ARCHIVE_FORMAT:
            raise ArchiveInvalid(path, f"its header lacks {', '.join(sorted(missing))}"
                                 if missing else f"its format is {header.get('format')!r}")
        problems = archive.integrity_problems()
        if problems:
            raise ArchiveInvalid(path, f"SQLite quick_check: {problems[0]}")
        run = header["run"]
        try:
            gaps = msgspec.convert(json.loads(header["gaps"]), tuple[SealGap, ...])
            n_events, n_blobs = int(header["events"]), int(header["blobs"])
        except (ValueError, TypeError, msgspec.ValidationError) as exc:
            raise ArchiveInvalid(path, f"its header cannot be read: {exc}") from None
        hashes: list[bytes] = []
        rows: list[Any] = []
        prev_row: Any = None
        for row in archive.rows():
            try:
                check_row(row)
                event = decode(row.payload, row.v)
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError,
                    InvalidInput) as exc:
                raise ArchiveInvalid(path, f"archived event #{row.seq} cannot be read: {exc}") from None
            (seq, time_ns, ws, row_run, step, attempt, epoch, rev, key, kind, v, payload,
             prev_hash, digest) = row
            env = envelope(event)
            if (ws, row_run, step, attempt, epoch, rev) != (
                    env.workspace, env.run, env.step, env.attempt, env.epoch, env.rev):
                raise ArchiveInvalid(path, f"archived event #{seq}'s columns disagree with its payload")
            if row_run != run:
                raise ArchiveInvalid(path, f"archived event #{seq} is of run {row_run!r}, not {run!r}")
            if chain_hash(bytes(prev_hash), seq, time_ns, env, key, kind, v, payload) != bytes(digest):
                raise ArchiveInvalid(path, f"archived event #{seq} does not match its hash")
            if prev_row is not None and seq == prev_row.seq + 1 and bytes(prev_hash) != bytes(prev_row.hash):
                raise ArchiveInvalid(path, f"archived event #{seq} does not link to #{seq - 1}")
            hashes.append(bytes(digest))
            rows.append((seq, prev_hash, digest))
            prev_row = row
        if len(rows) != n_events:
            raise ArchiveInvalid(path, f"it holds {len(rows)} events, its header says {n_events}")
        if not rows:
            raise ArchiveInvalid(path, "it holds no events")
        found_gaps = gaps_of([EventRow(s, 0, "", "", "", 0, 0, 0, "", "", 0, b"", p, d)
                               for s, p, d in rows])
        if tuple(found_gaps) != gaps:
            raise ArchiveInvalid(path, "its rows do not form the gaps its header records")
        digest_now = archive_digest(header["ledger_id"], run, hashes)
        if digest_now != header["archive_digest"]:
            raise ArchiveInvalid(path, "its rows do not hash to the digest its header records")
        blob_count = 0
        held: list[tuple[str, int]] = []
        for digest, size, data in archive.blobs():
            blob_count += 1
            held.append((str(digest), int(size) if isinstance(size, int) else -1))
            if (not isinstance(data, bytes) or size != len(data)
                    or hashlib.sha256(data).hexdigest() != digest):
                raise ArchiveInvalid(path, f"archived blob {str(digest)[:12]}… does not hash to its name")
        if blob_count != n_blobs:
            raise ArchiveInvalid(path, f"it holds {blob_count} blobs, its header says {n_blobs}")
    report = ArchiveReport(path=path, ok=True, ledger_id=header["ledger_id"], run=run,
                           events=n_events, blobs=n_blobs, archive_digest=digest_now,
                           blob_set=sorted(held))
    if ledger is not None:
        if header["ledger_id"] != ledger.ledger_id:
            raise ArchiveInvalid(path, f"it belongs to ledger {header['ledger_id'][:12]}…, not"
                                 f" {ledger.ledger_id[:12]}…")
        if seals is None:
            seals = seal_events(ledger)
        named = seals.get(digest_now)
        if named is None:
            report.ok = False
            report.findings.append(Finding("seal", 0, f"no seal in the ledger names {path}"
                                           " (a seal interrupted before its commit: seal the"
                                           " run again to adopt it, or delete the file)"))
        else:
            seq, seal = named
            report.seal_seq = seq
            if (seal.gaps != gaps or seal.events != n_events or seal.sealed_run != run
                    or sorted((b.digest, b.size) for b in seal.blobs) != report.blob_set):
                report.ok = False
                report.findings.append(Finding("seal", seq, f"VIOLATION: seal #{seq} and"
                                               f" {path} disagree on the run's rows or blobs"))
            elif os.path.basename(path) != seal.archive:
                report.ok = False
                report.findings.append(Finding("seal", seq, f"VIOLATION: {path} is the archive"
                                               f" seal #{seq} names {seal.archive}: a file"
                                               " moved or copied under another name"))
    return report


def read_archive(path: str) -> Iterator[RecordedEvent]:
    """The archived events, in seq order, read in place (the file is not changed). The
    whole archive is verified first (`verify_archive`): a damaged one is ArchiveInvalid
    before any event is yielded."""
    verify_archive(path)
    with ArchiveFile(path) as archive:
        for row in archive.rows():
            try:
                yield row_to_recorded(check_row(row))
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError,
                    InvalidInput) as exc:
                raise ArchiveInvalid(path, f"archived event #{row.seq} cannot be read: {exc}") from None


def read_archived_blob(path: str, digest: str) -> bytes | None:
    """An archived blob's bytes (hash-checked), or None when the archive lacks it."""
    with ArchiveFile(path) as archive:
        data = archive.blob(digest)
    if data is not None and hashlib.sha256(data).hexdigest() != digest:
        raise ArchiveInvalid(path, f"archived blob {digest[:12]}… does not hash to its name")
    return data


class SealInfo(msgspec.Struct, kw_only=True):
    """One seal recorded in the ledger, and whether its archive is where it belongs."""

    run: str
    seal_seq: int
    archive: str
    events: int
    steps: int
    blobs: int
    size_bytes: int
    present: bool


def sealed_runs(ledger: Ledger, archive_dir: str | None = None) -> list[SealInfo]:
    """Every seal in the ledger, oldest first, and whether its archive is in the
    ledger's archive directory (`archive_dir`: another, absolute). Read-only."""
    directory = _directory(ledger, archive_dir)
    out = []
    for seq, seal in sorted(seal_events(ledger).values(), key=lambda p: p[0]):
        out.append(SealInfo(run=seal.sealed_run, seal_seq=seq, archive=seal.archive,
                            events=seal.events, steps=len(seal.steps), blobs=len(seal.blobs),
                            size_bytes=seal.size_bytes,
                            present=directory is not None
                            and os.path.isfile(os.path.join(directory, seal.archive))))
    return out


class SealedVerifyReport(msgspec.Struct, kw_only=True):
    """`verify` of the ledger plus every archive its seals name."""

    ok: bool
    ledger: VerifyReport
    archives: list[ArchiveReport]
    findings: list[Finding]


def verify_sealed(ledger: Ledger, archive_dir: str | None = None) -> SealedVerifyReport:
    """Verify the ledger (the chain across every seal's gaps, from the ledger alone), then
    each archive its seals name, row by row, against its seal. A missing or damaged
    archive, or one in the directory no seal names, is a finding. The directory is the
    ledger's (`archive_dir_of`), or `archive_dir`; never one under the current directory
    for a ledger in a database."""
    directory = _directory(ledger, archive_dir)
    report = ledger.verify()
    seals = seal_events(ledger)
    archives, findings = [], []
    seen: set[str] = set()
    for seq, seal in sorted(seals.values(), key=lambda p: p[0]):
        if directory is None:
            findings.append(Finding("seal", seq, f"the archive of seal #{seq} (run"
                                    f" {seal.sealed_run!r}), {seal.archive}, is in no known"
                                    " directory: this ledger records none (meta"
                                    f" {ARCHIVE_DIR_META}); give --archive-dir /absolute/path"))
            continue
        path = os.path.join(directory, seal.archive)
        seen.add(seal.archive)
        if not os.path.isfile(path):
            findings.append(Finding("seal", seq, f"the archive of seal #{seq} (run"
                                    f" {seal.sealed_run!r}) is missing: {path}"))
            continue
        try:
            got = verify_archive(path, ledger, seals=seals)
        except ArchiveInvalid as exc:
            findings.append(Finding("seal", seq, f"the archive of seal #{seq}: {exc}"))
            continue
        archives.append(got)
        findings.extend(got.findings)
        if got.seal_seq != seq:
            findings.append(Finding("seal", seq, f"VIOLATION: {path}, where seal #{seq} (run"
                                    f" {seal.sealed_run!r}) keeps its archive, holds"
                                    f" {'the archive of seal #' + str(got.seal_seq) if got.seal_seq else 'an archive no seal names'}"
                                    " (replaced by hand): the run's archived history is not there"))
    if directory is not None and os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(ARCHIVE_SUFFIX) and name not in seen:
                findings.append(Finding("seal", 0, f"{os.path.join(directory, name)} is named"
                                        " by no seal (an interrupted seal's: seal the run"
                                        " again to adopt it, or delete it)"))
    return SealedVerifyReport(ok=report.ok and not findings, ledger=report, archives=archives,
                              findings=findings)


def missing_archives(seals: dict[str, tuple[int, Sealed]], directory: str | None) -> list[str]:
    """The archives `seals` name that `directory` does not hold (all of them: None)."""
    names = sorted({seal.archive for _seq, seal in seals.values()})
    if directory is None:
        return names
    return [n for n in names if not os.path.isfile(os.path.join(directory, n))]


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def carry_archives(seals: dict[str, tuple[int, Sealed]], source_dir: str | None,
                   dest_dir: str, *, shown: str, check_only: bool = False) -> int:
    """Copy the archive of every seal in `seals` from `source_dir` into `dest_dir` (a
    copy's archive directory); return how many were copied. Each is hashed on the way
    (sha256, equal to the source file's), fsynced, verified as an intact archive of that
    very seal (its digest) and linked into place (never over a file); one already there
    with the same sha256 is kept. Checked before anything is copied: an archive the
    source directory lacks is `ArchiveMissing`; the same directory on both sides, or
    another file under an archive's name in `dest_dir`, is `InvalidInput`
    (`check_only`: only these checks)."""
    if not seals:
        return 0
    missing = missing_archives(seals, source_dir)
    if missing:
        raise ArchiveMissing(shown, source_dir, missing)
    assert source_dir is not None
    if os.path.realpath(source_dir) == os.path.realpath(dest_dir):
        raise InvalidInput(f"the copy's archive directory {dest_dir[:200]} is the source's: the"
                           " two ledgers would write over each other's archives; give the copy"
                           " a directory of its own (nothing was written)")
    ordered = sorted(seals.values(), key=lambda p: p[0])
    todo = []
    for seq, seal in ordered:
        src = os.path.join(source_dir, seal.archive)
        dst = os.path.join(dest_dir, seal.archive)
        if os.path.lexists(dst):
            if (os.path.isfile(dst) and not os.path.islink(dst)
                    and _sha256_file(dst) == _sha256_file(src)):
                continue
            raise InvalidInput(f"{dst[:300]} exists and is not the archive of seal #{seq}; give"
                               " the copy an archive directory that holds no other ledger's"
                               " archives (nothing was written)")
        todo.append((seq, seal, src, dst))
    if check_only or not todo:
        return 0
    try:
        os.makedirs(dest_dir, mode=0o700, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"archive directory {dest_dir[:200]} cannot be created"
                           f" ({type(exc).__name__}); give a directory that exists or can be"
                           " made") from None
    for seq, seal, src, dst in todo:
        sha = _sha256_file(src)  # the copy, hashed on the way, must be these bytes
        tmp = os.path.join(dest_dir, f".{seal.archive}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            h = hashlib.sha256()
            with open(src, "rb") as fin, open(tmp, "xb") as fout:
                os.fchmod(fout.fileno(), 0o600)
                while chunk := fin.read(1 << 20):
                    h.update(chunk)
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            if h.hexdigest() != sha:
                raise ArchiveInvalid(src, "it changed while it was copied")
            if verify_archive(tmp).archive_digest != seal.archive_digest:
                raise ArchiveInvalid(src, f"it is not the archive seal #{seq} names")
            os.link(tmp, dst)  # never over a file that appeared meanwhile
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    fd = os.open(dest_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(todo)


def vacuum(ledger: Ledger) -> tuple[int, int]:
    """Give the pages sealing freed back to the file system (SQLite VACUUM, then a WAL
    checkpoint); return the file's size before and after, in bytes."""
    if ledger.readonly:
        raise ReadOnlyLedger(ledger.path)
    if ledger.blobs.root is None:
        raise InvalidInput("seal vacuum rewrites a SQLite file; a ledger in PostgreSQL has"
                           " none (the server's VACUUM is its operator's)")
    before = file_bytes(ledger.path)
    ledger.storage.vacuum()
    return before, file_bytes(ledger.path)


def file_bytes(path: str) -> int:
    """The ledger file's size with its WAL (what the disk holds for it)."""
    total = 0
    for p in (path, path + "-wal"):
        try:
            total += os.path.getsize(p)
        except FileNotFoundError:
            pass
    return total


__all__ = [
    "seal_events",
    "ARCHIVE_SUFFIX",
    "ArchiveReport",
    "RunCandidate",
    "SealInfo",
    "SealReport",
    "SealableReport",
    "SealedVerifyReport",
    "archive_digest",
    "archive_dir_at",
    "archive_dir_of",
    "archive_name",
    "carry_archives",
    "default_archive_dir",
    "file_bytes",
    "gap_digest",
    "gaps_of",
    "missing_archives",
    "read_archive",
    "read_archived_blob",
    "seal_run",
    "sealable",
    "sealed_runs",
    "seals_in",
    "vacuum",
    "verify_archive",
    "verify_sealed",
]

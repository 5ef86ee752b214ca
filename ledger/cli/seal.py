"""`steptrail seal`: sealed runs (docs/design.md "Sealed runs"): plan, run, list,
verify, show, vacuum."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from ._common import F, LedgerSubgroup, _emit_json, _examples, _open, json_option
from ledger.kinds import detail

from ._format import _iso, _n, _size, event_json


def archive_dir_option(f: F) -> F:
    return click.option("--archive-dir", "archive_dir", metavar="DIR",
                        type=click.Path(file_okay=False),
                        help="Where the archives are (default: archive/ beside a ledger file;"
                             " for a ledger in a database, the absolute directory its first"
                             " seal recorded, which that seal needs).")(f)


@click.group("seal", cls=LedgerSubgroup)
def seal_group() -> None:
    """Seal settled runs: move their events into archive files and shrink the ledger.

    A sealed run's events leave the ledger for a verifiable archive; the ledger keeps one
    run-sealed event that lets verify check the chain across the gap. Only runs whose
    steps are all settled (acked, compensated, rejected), hold no pin and write no
    workspace can be sealed.

    \b
        steptrail seal plan
        steptrail seal run build-42 --vacuum
        steptrail seal verify
    """


@seal_group.command("plan", epilog=_examples("steptrail seal plan",
                                             "steptrail seal plan --json | jq .events"))
@json_option
@click.pass_context
def seal_plan(ctx: click.Context, as_json: bool) -> None:
    """Which runs could be sealed now, and how many events and bytes that removes. Read-only."""
    from ledger.seal import sealable

    with _open(ctx, readonly=True) as ledger:
        report = sealable(ledger)
    if as_json:
        _emit_json(msgspec.to_builtins(report))
        return
    for r in report.runs:
        click.echo(f"{r.run}  {_n(r.steps, 'step')}  {_n(r.events, 'event')}  {_size(r.size_bytes)}"
                   f"  {'sealable' if r.sealable else 'no: ' + (r.why or '')}")
    click.echo(f"{_n(report.sealable_runs, 'run')} sealable: {_n(report.events, 'event')}"
               f" of {report.ledger_events}, {_size(report.size_bytes)} of payload")


@seal_group.command("run", epilog=_examples(
    "steptrail seal run build-42",
    "steptrail seal run build-41 build-42 --vacuum --json",
))
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@archive_dir_option
@click.option("--vacuum", is_flag=True, help="Then give the freed pages back (VACUUM): the file shrinks.")
@json_option
@click.pass_context
def seal_run_command(ctx: click.Context, runs: tuple[str, ...], archive_dir: str | None,
                     vacuum: bool, as_json: bool) -> None:
    """Seal each RUN: write its archive (durably, verified), then record the seal and
    remove its events in one transaction. A run that cannot be sealed is refused
    (NotSealable) before anything of it is written; runs sealed before it stay sealed."""
    from ledger.events import check_step_id
    from ledger.seal import seal_run
    from ledger.seal import vacuum as vacuum_ledger

    for run in runs:
        check_step_id(run)  # bad input writes nothing
    done = []
    with _open(ctx, readonly=False) as ledger:
        for run in runs:
            done.append(seal_run(ledger, run, archive_dir))
            if not as_json:
                r = done[-1]
                click.echo(f"sealed {r.run}: {_n(r.events, 'event')} in {_n(r.gaps, 'gap')},"
                           f" {_n(r.steps, 'step')}, {_n(r.blobs, 'blob')} -> {r.archive}"
                           f" (seal #{r.seal_seq}{', adopted' if r.adopted else ''})")
        sizes = vacuum_ledger(ledger) if vacuum else None
    if as_json:
        out: dict[str, Any] = {"sealed": [msgspec.to_builtins(r) for r in done]}
        if sizes is not None:
            out["vacuum"] = {"before_bytes": sizes[0], "after_bytes": sizes[1]}
        _emit_json(out)
    elif sizes is not None:
        click.echo(f"vacuum: {_size(sizes[0])} -> {_size(sizes[1])}")


@seal_group.command("list", epilog=_examples("steptrail seal list", "steptrail seal list --json"))
@archive_dir_option
@json_option
@click.pass_context
def seal_list(ctx: click.Context, archive_dir: str | None, as_json: bool) -> None:
    """Every sealed run: its seal event, its archive (and whether it is there). Read-only."""
    from ledger.seal import sealed_runs

    with _open(ctx, readonly=True) as ledger:
        seals = sealed_runs(ledger, archive_dir)
    if as_json:
        _emit_json([msgspec.to_builtins(s) for s in seals])
        return
    for s in seals:
        click.echo(f"#{s.seal_seq}  {s.run}  {_n(s.events, 'event')}  {_n(s.steps, 'step')}"
                   f"  {s.archive}{'' if s.present else '  MISSING'}")


@seal_group.command("verify", epilog=_examples(
    "steptrail seal verify                          # the ledger and every archive",
    "steptrail seal verify archive/0a1b-…-17.slarchive --json",
))
@click.argument("archives", nargs=-1, metavar="[ARCHIVE]...")
@archive_dir_option
@json_option
@click.pass_context
def seal_verify(ctx: click.Context, archives: tuple[str, ...], archive_dir: str | None,
                as_json: bool) -> None:
    """Verify the ledger and every archive its seals name (no ARCHIVE), or each ARCHIVE
    against the ledger. Exit 1 on any finding; a file that is not an intact archive is
    ArchiveInvalid (exit 2). Read-only."""
    from ledger.seal import verify_archive, verify_sealed

    with _open(ctx, readonly=True) as ledger:
        if archives:
            reports = [verify_archive(a, ledger) for a in archives]
            ok = all(r.ok for r in reports)
            doc: dict[str, Any] = {"ok": ok, "archives": [msgspec.to_builtins(r) for r in reports]}
            findings = [f for r in reports for f in r.findings]
        else:
            full = verify_sealed(ledger, archive_dir)
            ok = full.ok
            findings = full.ledger.findings + full.findings
            doc = {"ok": ok, "ledger": {"ok": full.ledger.ok, "events": full.ledger.events,
                                        "head_seq": full.ledger.head_seq,
                                        "findings": msgspec.to_builtins(full.ledger.findings)},
                   "archives": [msgspec.to_builtins(r) for r in full.archives],
                   "findings": msgspec.to_builtins(full.findings)}
    if as_json:
        _emit_json(doc)
    else:
        for f in findings:
            click.echo(f"{f.check}: {f.message}")
        n = len(doc["archives"])
        click.echo(f"{'ok' if ok else 'NOT OK'}: {_n(n, 'archive')} checked")
    if not ok:
        ctx.exit(1)


@seal_group.command("show", epilog=_examples("steptrail seal show archive/0a1b-…-17.slarchive",
                                             "steptrail seal show ARCHIVE --json"))
@click.argument("archive", metavar="ARCHIVE")
@json_option
@click.pass_context
def seal_show(ctx: click.Context, archive: str, as_json: bool) -> None:
    """Read an archived run's events in place (the archive is checked first, never
    changed). Needs no ledger."""
    from ledger.seal import read_archive

    recorded = list(read_archive(archive))  # verified whole before the first event
    if as_json:
        _emit_json([event_json(r) for r in recorded])
        return
    for r in recorded:
        ev = r.event
        attempt = getattr(ev, "attempt", 0)
        click.echo(f"{r.seq:>8}  {_iso(r.time_ns)}  {r.kind:<18}  {getattr(ev, 'step', '')}"
                   + (f" #{attempt}" if attempt else "") + f"  {detail(r.event)}")


@seal_group.command("vacuum", epilog=_examples("steptrail seal vacuum"))
@json_option
@click.pass_context
def seal_vacuum(ctx: click.Context, as_json: bool) -> None:
    """Give the pages sealed runs freed back to the file system (SQLite VACUUM): the
    ledger file shrinks. Takes the write lock for as long as it rewrites the file."""
    from ledger.seal import vacuum as vacuum_ledger

    with _open(ctx, readonly=False) as ledger:
        before, after = vacuum_ledger(ledger)
    if as_json:
        _emit_json({"before_bytes": before, "after_bytes": after})
    else:
        click.echo(f"vacuum: {_size(before)} -> {_size(after)}")

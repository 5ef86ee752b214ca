"""The ledger itself: init, events, steps, show, rebuild, verify, head, blobs."""

from __future__ import annotations

import os
import sys

import click
import msgspec

from ledger.errors import EXIT_NO
from ledger.events import KINDS

from ._common import LedgerCommand, _emit_json, _open, _progress, json_option
from ledger.kinds import detail

from ._format import _iso, _n, _Spool, event_json, step_json
from ._options import IN_FLIGHT, INT64_MAX, STATES


@click.command("init", cls=LedgerCommand)
@click.option("--parents", is_flag=True, help="Create every missing directory on the"
              " ledger's path (like mkdir -p). Without it only the ledger's own directory"
              " is created, and a missing directory above it is refused (exit 2).")
@click.option("--nested", is_flag=True, help="Create ./.steptrail/ledger.db even though a"
              " directory above already has a ledger (commands here then use this one).")
@json_option
@click.pass_context
def init(ctx: click.Context, parents: bool, nested: bool, as_json: bool) -> None:
    """Create a ledger (and its own directory); a no-op if one is already there.

    Without --ledger: ./.steptrail/ledger.db, which git ignores (the directory gets a
    .gitignore holding '*'). Inside a project that already has a ledger in a
    directory above, init refuses (commands here already use that one) unless
    --nested. A file that exists and is not a ledger is refused and left untouched.
    Only the directory the ledger file is in is created (ws/.steptrail below): a
    missing directory above it is refused, nothing written, unless --parents.

    \b
        steptrail init
        steptrail --ledger ws/.steptrail/ledger.db init
        steptrail --ledger /srv/ledgers/app/ledger.db init --parents
    """
    from ledger import Ledger, locate
    from ledger.errors import InvalidInput
    from ledger.find import LEDGER_DIR, LEDGER_FILE, working_directory

    path = ctx.obj.get("ledger_path")
    if ctx.obj.get("ledger_default"):
        here = os.path.join(working_directory(), LEDGER_DIR, LEDGER_FILE)  # (gone: refused)
        foreign = ctx.obj.get("ledger_foreign")
        if foreign is not None and not nested:
            raise foreign  # another user's ledger above: --nested makes this one's own
        above = ctx.obj.get("ledger_found")
        if above is not None and above != here and not nested:
            raise InvalidInput(
                f"a ledger already exists above this directory: {above} (commands here"
                " use it); to make a separate ledger here, run 'steptrail init --nested'")
        path = here
    with Ledger.init(path, witness=ctx.obj.get("witness"), parents=parents) as ledger:
        info = {"path": os.path.abspath(path) if locate(path).local_file else ledger.path,
                "created": ledger.created, "ledger_id": ledger.ledger_id}
    if as_json:
        _emit_json(info)
    elif info["created"]:
        click.echo(f"created ledger {info['path']}")
    else:
        click.echo(f"ledger {info['path']} already exists; nothing changed")


@click.command("events", cls=LedgerCommand)
@click.option("--step", "step", metavar="STEP", help="Only this step's events.")
@click.option("--kind", type=click.Choice(KINDS), help="Only events of this kind.")
@click.option("--after", "after_seq", type=click.IntRange(min=0, max=INT64_MAX), default=0, help="Only events after this seq.")
@click.option("--limit", type=click.IntRange(min=1, max=INT64_MAX), help="At most this many events.")
@json_option
@click.pass_context
def events(
    ctx: click.Context, step: str | None, kind: str | None, after_seq: int, limit: int | None,
    as_json: bool,
) -> None:
    """List events in seq order. Read-only.

    \b
        steptrail events --step fetch
        steptrail events --kind manifest-published --json
    """
    # Everything is read before anything is printed: a damaged row fails the command
    # with one error line, not after a partial document.
    with _open(ctx, readonly=True) as ledger, _Spool() as out:
        it = ledger.read(after_seq, step=step, kind=kind, limit=limit)
        if as_json:
            out.write("[")
            for i, r in enumerate(it):
                out.write(("," if i else "") + msgspec.json.encode(event_json(r)).decode())
            out.write("]\n")
        else:
            for r in it:
                ev = r.event
                who = f"{getattr(ev, 'step', '') or getattr(ev, 'workspace', '')}"
                attempt = getattr(ev, "attempt", 0)
                out.write(
                    f"{r.seq:>8}  {_iso(r.time_ns)}  {r.kind:<18}  {who}"
                    + (f" #{attempt}" if attempt else "") + f"  {detail(r.event)}\n"
                )
        out.done()


@click.command("steps", cls=LedgerCommand)
@click.option("--state", "states", type=click.Choice(STATES), multiple=True,
              help="Only steps in this state (repeat it for several).")
@click.option("--in-flight", is_flag=True,
              help="Only steps in flight: planned, fenced or blob-stored (finish or replay them).")
@json_option
@click.pass_context
def steps(ctx: click.Context, states: tuple[str, ...], in_flight: bool, as_json: bool) -> None:
    """List steps and their current state (their latest attempt's). Read-only.

    A step is committed when it has a live manifest. The columns:

    \b
      STEP      the step's id
      STATE     its latest attempt's state (planned, fenced, blob-stored,
                manifest-published, acked; compensating, compensated, rejected; sealed)
      ATTEMPT   its latest attempt's number (1, then 2 after a retry)
      EPOCH     the lease epoch it ran under (0: not under a workspace lease)
      MANIFEST  its newest manifest revision: r0, r1 ...; "-" after it: not live (its
                step compensated); "-" alone: no manifest yet (not committed)
      BYTES     the bytes its live manifest names (what is committed)
      LAST      the seq of its newest event ('steptrail show STEP': its timeline)

    \b
        steptrail steps --in-flight             # after a crash: replay or settle these
        steptrail steps --state blob-stored --state fenced
        steptrail steps --json | jq '.[] | select(.committed)'
    """
    wanted = set(states) | (set(IN_FLIGHT) if in_flight else set())
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.steps(next(iter(wanted)) if len(wanted) == 1 else None)
    rows = [r for r in rows if not wanted or r.state in wanted]
    if as_json:
        _emit_json([step_json(r) for r in rows])
        return
    if not rows:
        shown = " or ".join(sorted(wanted))
        click.echo("no steps" + (f" in state {shown}" if wanted else ""), err=True)
        return
    # The step column is as wide as the longest id shown (ids run to 256 characters), so
    # the columns stay aligned whatever the ids.
    w = max(4, *(len(r.step_id) for r in rows))
    click.echo(f"{'STEP':<{w}}  {'STATE':<18} {'ATTEMPT':>7} {'EPOCH':>5} {'MANIFEST':>8}"
               f" {'BYTES':>10} {'LAST':>8}")
    for r in rows:
        manifest = f"r{r.manifest_rev}" + ("" if r.live else "-") if r.manifest_rev >= 0 else "-"
        click.echo(
            f"{r.step_id:<{w}}  {r.state:<18} {r.attempt:>7} {r.epoch:>5} {manifest:>8}"
            f" {r.committed_bytes:>10} {r.last_seq:>8}"
        )


@click.command("show", cls=LedgerCommand)
@click.argument("step")
@json_option
@click.pass_context
def show(ctx: click.Context, step: str, as_json: bool) -> None:
    """Show one step: its state and its timeline. Read-only.

    \b
        steptrail show fetch
    """
    with _open(ctx, readonly=True) as ledger:
        row = ledger.step(step)
        timeline = ledger.timeline(step)
    if as_json:
        _emit_json({"step": step_json(row), "events": [event_json(r) for r in timeline]})
        return
    committed = "committed" if row.live else "not committed"
    click.echo(f"step {row.step_id}: {row.state}, attempt {row.attempt}, {committed}")
    if row.run:
        click.echo(f"  run {row.run}" + (f", workspace {row.workspace}" if row.workspace else ""))
    if row.manifest_rev >= 0:
        live = f"live, {row.manifest_digest}" if row.live else "not live"
        click.echo(f"  manifest revision {row.manifest_rev} ({live}),"
                   f" {_n(row.committed_bytes, 'byte')}")
    for r in timeline:
        click.echo(f"  {r.seq:>8}  {_iso(r.time_ns)}  #{r.attempt} {r.kind:<18} {detail(r.event)}")


@click.command("rebuild", cls=LedgerCommand)
@json_option
@click.pass_context
def rebuild(ctx: click.Context, as_json: bool) -> None:
    """Recompute every projection from the events and swap them in atomically.

    Safe at any time: readers see the old tables or the new ones, never a mix. Run it
    when verify reports a projection that disagrees with the events, or after restoring
    a copy of the file; it takes the write lock while it swaps.

    \b
        steptrail rebuild
        steptrail rebuild --json && steptrail verify
    """
    update, finish = _progress("rebuilding")
    with _open(ctx, readonly=False) as ledger:
        try:
            n_steps = ledger.rebuild(progress=update)
        finally:
            finish()
        n_events = ledger.count()
    if as_json:
        _emit_json({"steps": n_steps, "events": n_events})
    else:
        click.echo(f"rebuilt {_n(n_steps, 'step')} from {_n(n_events, 'event')}")


@click.command("verify", cls=LedgerCommand)
@click.option(
    "--expect-head",
    metavar="SEQ:HASH",
    help="A head printed earlier by 'steptrail head': prove nothing up to it was lost.",
)
@json_option
@click.pass_context
def verify(ctx: click.Context, expect_head: str | None, as_json: bool) -> None:
    """Verify the ledger: SQLite integrity, the hash chain, dense seqs, projections.

    Reads everything and writes nothing. Exit 1 when anything is wrong, listing every
    finding. A hash chain cannot see its own tail cut off or the file rolled back to
    an older copy: keep a witness (--witness, updated after every commit) or record
    'steptrail head' elsewhere and pass it as --expect-head. With a witness, verify
    reports (rather than refuses) a ledger its witness does not match.

    \b
        steptrail verify
        steptrail --witness /other/volume/ledger.witness verify
        steptrail verify --expect-head "$(cat /other/volume/ledger.head)"
    """
    update, finish = _progress("verifying")
    with _open(ctx, readonly=True, witness_check=False, forensic=True) as ledger:
        try:
            report = ledger.verify(expect_head=expect_head, progress=update)
        finally:
            finish()
    if as_json:
        _emit_json(report)
    else:
        for f in report.findings:
            click.echo(f"VIOLATION [{f.check}] {f.message}")
        for f in report.warnings:
            click.echo(f"WARNING [{f.check}] {f.message}")
        lag = (f", projections lag {_n(report.projection_lag, 'event')}"
               if report.projection_lag else "")
        verdict = "ok" if report.ok else _n(len(report.findings), "finding")
        if report.warnings:
            verdict += f", {_n(len(report.warnings), 'warning')}"
        click.echo(
            f"verify: {verdict} — {_n(report.events, 'event')}, {_n(report.steps, 'step')},"
            f" head {report.head_seq}:{report.head_hash[:16]}…{lag}"
        )
    if not report.ok:
        sys.exit(EXIT_NO)


@click.command("head", cls=LedgerCommand)
@json_option
@click.pass_context
def head(ctx: click.Context, as_json: bool) -> None:
    """Print the chain head as SEQ:HASH. Read-only.

    Store it outside the ledger (another volume, your orchestrator) and later run
    'steptrail verify --expect-head SEQ:HASH' to prove no history was cut off.

    \b
        steptrail head > /other/volume/ledger.head
        steptrail verify --expect-head "$(cat /other/volume/ledger.head)"
        steptrail head --json | jq .seq
    """
    with _open(ctx, readonly=True) as ledger:
        h = ledger.head()
    if as_json:
        _emit_json({"seq": h.seq, "hash": h.hash.hex()})
    else:
        click.echo(str(h))


@click.command("blobs", cls=LedgerCommand)
@json_option
@click.pass_context
def blobs(ctx: click.Context, as_json: bool) -> None:
    """List stored blobs — inline rows and files — and who holds them. Read-only.

    `referenced`: named by some manifest revision; `pinned`: an attempt may still use
    it; neither: an orphan that GC may collect once it is older than the grace window.
    WHERE is `inline` (a row in the ledger), `file` (the blob directory) or `temp` (a
    leftover temporary file of an interrupted store).

    \b
        steptrail blobs
        steptrail blobs --json | jq '[.[] | select(.referenced | not)] | length'
        steptrail gc --dry-run                  # what of these gc would collect
    """
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.blob_list()
    if as_json:
        _emit_json(rows)
        return
    click.echo(f"{'DIGEST':<64}  {'SIZE':>10}  {'WHERE':<6}  STATUS")
    for r in rows:
        status = "referenced" if r["referenced"] else "pinned" if r["pinned"] else "orphan"
        click.echo(f"{r['digest'] or r['name']:<64}  {r['size']:>10}  {r['where']:<6}  {status}")
    temps = [r for r in rows if r["where"] == "temp"]
    if temps:
        click.echo(f"{_n(len(temps), 'leftover temporary file')}", err=True)

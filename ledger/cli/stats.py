"""`steptrail stats` (what the ledger holds, how it grew) and `steptrail metrics`."""

from __future__ import annotations

from typing import Any

import click

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option
from ledger.fmt import shown as shown_text

from ._format import _iso, _n


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 120:
        return f"{x:.1f}s"
    if x < 7200:
        return f"{x / 60:.1f}m"
    if x < 2 * 86400:
        return f"{x / 3600:.1f}h"
    return f"{x / 86400:.1f}d"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


@click.command("metrics", cls=LedgerCommand, epilog=_examples("steptrail metrics", "steptrail metrics --json | jq .checkpoint_age_s.max"))
@json_option
@click.pass_context
def metrics(ctx: click.Context, as_json: bool) -> None:
    """Operational metrics over the whole ledger. Read-only.

    Checkpoint age per workspace, lease-expiration rate, ambiguous (crash-window)
    reconciliations, compensation success rate, time to resume after a new epoch, and
    the plan drift the executor recorded. docs/cli-json.md defines each number.
    """
    from ledger.metrics import compute

    with _open(ctx, readonly=True) as ledger:
        m = compute(ledger)
    if as_json:
        _emit_json(m)
        return
    cp, le, am = m.checkpoint_age_s, m.lease_expiration_rate, m.ambiguous_reconciliations
    cs, tr, dr = m.compensation_success_rate, m.time_to_resume_s, m.drift
    ws = ", ".join(f"{w.workspace} {_secs(w.age_s) if w.age_s is not None else 'never'}"
                   for w in cp.workspaces) or "no workspaces"
    rows = [
        ("checkpoint age (max)", _secs(cp.max), ws),
        ("lease expiration rate", _rate(le.rate),
         (f"{le.expired} expired of {le.ended} ended ({le.released} released,"
          f" {le.preempted} preempted); {le.live} live")),
        ("ambiguous reconciliations", str(am.count),
         (f"{_n(am.settled_applies, 'apply', 'applies')} found"
          f" {'its write' if am.settled_applies == 1 else 'their writes'} on disk,"
          f" {_n(am.already_restores, 'compensation')} found the pre-image back")),
        ("compensation success rate", _rate(cs.rate),
         (f"{cs.succeeded} clean of {cs.with_restores} with writes ({cs.conflicted}"
          f" conflicted); {_n(cs.compensations, 'compensation')} in all")),
        ("time to resume (median)", _secs(tr.median),
         f"max {_secs(tr.max)} over {_n(tr.resumes, 'new epoch')}; {tr.unresumed} applied"
         " nothing yet"),
        ("plan drift (mean)", "-" if dr.mean is None else f"{dr.mean:.2f}",
         (f"max {'-' if dr.max is None else dr.max} over {_n(dr.writes, 'planned write')};"
          f" {dr.drifted} drifted")),
        ("weakened attempts", str(m.weakened.attempts),
         (f"fence plan {m.weakened.fence_plan}, fence none {m.weakened.fence_none},"
          f" journal off {m.weakened.journal_off} (an operator's choice)")),
    ]
    click.echo(f"{'METRIC':<27} {'VALUE':>8}  DETAIL")
    for label, value, detail in rows:
        click.echo(f"{label:<27} {value:>8}  {detail}")
    click.echo(f"over {_n(m.events, 'event')}")  # part of the result: stdout


@click.command("stats", cls=LedgerCommand, epilog=_examples(
    "steptrail stats",
    "steptrail stats --by week --top 5",
    "steptrail stats --json | jq '.sealable'",
))
@click.option("--by", "by", type=click.Choice(["hour", "day", "week"]), default="day",
              show_default=True, help="The growth table's bucket.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many runs to list, largest first (0: every run).")
@json_option
@click.pass_context
def stats_cmd(ctx: click.Context, by: str, top: int, as_json: bool) -> None:
    """What the ledger holds and how it grew. Read-only.

    Events by kind, steps by state, runs (their steps, states, events and bytes, the
    largest first), blobs (inline rows and files, bucketed as `audit` does), events and
    bytes per hour, day or week, and what sealing would take out of the ledger file:
    the runs whose every step is settled (acked, compensated or rejected), and, for the
    rest, why not (a step in flight, a live LangGraph thread, a workspace's revisions, an
    open compensation window). An event's bytes are its payload, journal key and hashes.

    The runs table's SETTLED column says whether `steptrail seal run RUN` would take
    that run now; `--json` gives each run's `why_not`.
    """
    from ledger.stats import stats

    with _open(ctx, readonly=True) as ledger:
        report = stats(ledger, by=by, top=top)
    if as_json:
        _emit_json(report.as_dict())
        return
    r = report
    click.echo(f"stats: {r.path}: {_short(r.file_bytes)} on disk, head #{r.head_seq}")
    click.echo(f"  {_n(r.events.count, 'event')} ({_short(r.events.bytes)}),"
               f" {_n(r.steps, 'step')}, {_n(r.runs_total, 'run')}")
    if r.by_state:
        click.echo("  steps by state: " + ", ".join(
            f"{k} {v} ({_state_bytes(r, k)})" for k, v in r.by_state.items()))
    if r.by_kind:
        click.echo("  events by kind: " + ", ".join(
            f"{k} {c.count} ({_short(c.bytes)})" for k, c in r.by_kind.items()))
    b = r.blobs
    click.echo(f"  blobs: {b['inline'].count} inline ({_short(b['inline'].bytes)}),"
               f" {_n(b['files'].count, 'file')} ({_short(b['files'].bytes)});"
               f" referenced {_short(b['referenced'].bytes)}, pinned {_short(b['pinned'].bytes)},"
               f" orphan {_short(b['orphan_young'].bytes + b['orphan_old'].bytes)},"
               f" temporary {_short(b['temporary'].bytes)}")
    share = f", {r.sealable.bytes * 100 // r.events.bytes}% of the events' bytes" if r.events.bytes else ""
    click.echo(f"  sealable: {r.sealable_runs} of {_n(r.runs_total, 'run')},"
               f" {_n(r.sealable.count, 'event')} ({_short(r.sealable.bytes)}{share})"
               + ("; seal them: steptrail seal run RUN" if r.sealable_runs else ""))
    if r.not_sealable:
        click.echo("  not sealable: " + "; ".join(
            _WHY_NOT["no-run"] if cause == "no-run" else f"{_n(n, 'run')} {_WHY_NOT.get(cause, cause)}"
            for cause, n in r.not_sealable.items()))
    if r.holds:
        click.echo(f"  holds ({len(r.holds)}, kept out of seal and gc until released): "
                   + "; ".join(f"{h.scope} {shown_text(h.target)}"
                               + (f" ({shown_text(h.reason)})" if h.reason else "")
                               for h in r.holds[:10])
                   + ("; …" if len(r.holds) > 10 else ""))
    if r.history_released:
        click.echo(f"  retention: {_n(r.history_released, 'file version')} released by a"
                   " retention policy (their events kept)")
    if r.runs:
        shown = f"the {len(r.runs)} largest" if len(r.runs) < r.runs_total else "every run"
        click.echo(f"  runs ({shown}):")
        click.echo(f"    {'RUN':<28} {'STEPS':>6} {'EVENTS':>8} {'BYTES':>10}  {'SETTLED':<7}  STATES")
        for run in r.runs:
            states = ", ".join(f"{k} {v}" for k, v in sorted(run.states.items()))
            # (a sealed run is settled — and past sealing: its events are in its archive)
            settled = "sealed" if run.states and set(run.states) == {"sealed"} else \
                "yes" if run.settled else "no"
            held = " (held)" if run.held else ""
            click.echo(f"    {(run.run or '(no run)')[:28]:<28} {run.steps:>6} {run.events:>8}"
                       f" {_short(run.event_bytes):>10}  {settled:<7}  {states}{held}")
    if r.growth:
        click.echo(f"  growth by {r.bucket}:")
        for g in r.growth:
            click.echo(f"    {_iso(g.start_ns)[:16 if r.bucket == 'hour' else 10]:<17}"
                       f" {g.events:>8} events {_short(g.bytes):>10}")


#: `stats`' not-sealable causes (ledger.seal.RunCandidate.cause), in words.
_WHY_NOT = {
    "unsettled": "with a step not yet acked, compensated or rejected (finish or settle it:"
                 " steptrail steps --in-flight)",
    "live-thread": "holding a LangGraph thread's live state (sealed once the thread is deleted)",
    "workspace": "that wrote a workspace (never sealed: its revisions are folded from them)",
    "pinned": "with a compensation window open (a pin held)",
    "sealed": "sealed already",
    "no-run": "the events of no run (leases, workspaces, steps recorded without a run: a seal"
              " archives whole runs)",
}


def _short(n: int) -> str:
    """Bytes, in a binary unit once past a KiB."""
    value, unit = float(n), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _state_bytes(r: Any, state: str) -> str:
    """What a state's steps hold: the bytes their manifests reference when committed
    (inline artifacts too), else what their attempts stored so far."""
    committed = r.committed_bytes_by_state.get(state, 0)
    if committed:
        return f"{_short(committed)} committed"
    return f"{_short(r.bytes_by_state.get(state, 0))} stored"

"""`steptrail hold`: keep a run (or a step) out of seal and its blobs out of gc."""

from __future__ import annotations

import getpass

import click

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option
from ._format import _iso


@click.command("hold", cls=LedgerCommand, epilog=_examples(
    "steptrail hold nightly --reason 'kept for the audit'   # a run",
    "steptrail hold --step edit-4                           # one step",
    "steptrail hold --release nightly",
    "steptrail hold --list --json",
))
@click.argument("target", required=False, metavar="RUN|STEP")
@click.option("--step", "is_step", is_flag=True, help="TARGET is a step, not a run.")
@click.option("--reason", default="", metavar="TEXT", help="Why (recorded).")
@click.option("--release", is_flag=True, help="Release the hold on TARGET.")
@click.option("--list", "listing", is_flag=True, help="List the holds in force.")
@json_option
@click.pass_context
def hold(ctx: click.Context, target: str | None, is_step: bool, reason: str, release: bool,
         listing: bool, as_json: bool) -> None:
    """Hold a run (or a step): 'steptrail seal' refuses it, and gc keeps its blobs even
    where a pruning compensation would let them go, until it is released.

    A hold is an event (who placed it, why), so it is in the log, a copy and a backup.
    Holding what is held is a no-op; releasing what is not held says so (exit 1).
    """
    if listing or target is None:
        if target is not None or release:
            raise click.UsageError("--list takes no TARGET and no --release", ctx=ctx)
        with _open(ctx, readonly=True) as ledger:
            holds = ledger.holds()
            times = {h.seq: e.time_ns for h in holds
                     for e in ledger.read(after_seq=h.seq - 1, limit=1)}
        if as_json:
            _emit_json([{"scope": h.scope, "target": h.target, "reason": h.reason,
                         "by": h.by, "seq": h.seq, "since": _iso(times[h.seq])}
                        for h in holds])
            return
        for h in holds:
            click.echo(f"{h.scope} {h.target}: held since {_iso(times[h.seq])}"
                       + (f" by {h.by}" if h.by else "") + (f" ({h.reason})" if h.reason
                                                           else ""))
        if not holds:
            click.echo("no holds")
        return
    scope = "step" if is_step else "run"
    try:
        who = f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        who = "cli"
    with _open(ctx, readonly=False) as ledger:
        if release:
            done = ledger.release_hold(target, scope=scope, by=who)
            if not done:
                from ledger.errors import ProtocolRefused

                raise ProtocolRefused(f"{scope} {target!r} is not held ('steptrail hold"
                                      " --list' lists the holds)")
            if as_json:
                _emit_json({"scope": scope, "target": target, "released": True})
            else:
                click.echo(f"released the hold on {scope} {target}")
            return
        if scope == "run" and not any(r.run == target for r in ledger.steps()):
            from ledger.errors import InvalidInput

            raise InvalidInput(f"no step of run {target!r} in this ledger ('steptrail steps'"
                               " lists the runs; --step holds one step)")
        if scope == "step":
            ledger.step(target)  # UnknownStep first
        got = ledger.hold(target, scope=scope, reason=reason, by=who)
    if as_json:
        _emit_json({"scope": got.scope, "target": got.target, "reason": got.reason,
                    "by": got.by, "seq": got.seq})
    else:
        click.echo(f"held {got.scope} {got.target} (event #{got.seq}): seal refuses it and"
                   " gc keeps its blobs until 'steptrail hold --release"
                   f"{' --step' if scope == 'step' else ''} {target}'")

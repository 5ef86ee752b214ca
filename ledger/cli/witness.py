"""`steptrail witness`: where the ledger's witness is; anchor a new one."""

from __future__ import annotations

from typing import Any

import click

from ledger.events import RecordedEvent, WitnessAnchored

from ._common import (
    LedgerSubgroup,
    _emit_json,
    _examples,
    _open,
    _progress,
    json_option,
)
from ._format import _n


@click.group("witness", cls=LedgerSubgroup)
def witness_group() -> None:
    """Where the ledger's witness is; move or replace it (re-anchor).

    A witnessed ledger records its witness's location, and every command uses it. A
    missing, blank or damaged witness fails closed; 'witness anchor' verifies the
    ledger and starts a new one, recorded as a witness-anchored event.

    \b
        steptrail witness show
        steptrail witness anchor --witness /other/volume/ledger.witness
    """


def anchor_json(recorded: RecordedEvent) -> dict[str, Any]:
    ev = recorded.event
    assert isinstance(ev, WitnessAnchored)
    return {"seq": recorded.seq, "witness": ev.witness, "previous": ev.previous,
            "previous_state": ev.previous_state, "head_seq": ev.head_seq,
            "head_hash": ev.head_hash, "forced": ev.forced, "overridden": list(ev.overridden)}


@witness_group.command("anchor", epilog=_examples(
    "steptrail witness anchor                      # replace a lost witness where it was",
    "steptrail witness anchor --witness /mnt/b/ledger.witness --json   # move it",
    "steptrail witness anchor --force              # anchor over findings (recorded)",
))
@click.option("--witness", "target", metavar="PATH", type=click.Path(dir_okay=False),
              help="The new witness file, absolute (default: the global --witness, else the"
              " recorded location).")
@click.option("--force", is_flag=True, help="Anchor even if verify has findings or the old"
              " witness says the ledger was cut off or rolled back; the findings are recorded.")
@json_option
@click.pass_context
def witness_anchor(ctx: click.Context, target: str | None, force: bool, as_json: bool) -> None:
    """Verify the whole ledger, then start a new witness and record it.

    The operator's way back when the witness is lost, damaged or moves: nothing else
    replaces a witness. Refused (exit 1, nothing written) when verify has findings or
    the old witness says the ledger lost history, unless --force. Exit 0 anchored,
    1 refused, 2 bad input (a relative path, a file that is not a witness), 3 storage.
    """
    from ledger import Ledger

    update, finish = _progress("verifying")
    try:
        recorded = Ledger.anchor_witness(ctx.obj["ledger_path"], target or ctx.obj.get("witness"),
                                         force=force, progress=update)
    finally:
        finish()
    out = anchor_json(recorded)
    if as_json:
        _emit_json(out)
        return
    was = (f"replacing {out['previous']} ({out['previous_state']})" if out["previous"]
           else "the ledger's first witness")
    click.echo(f"anchored witness {out['witness']} at head #{out['head_seq']}, {was};"
               f" recorded as event #{out['seq']}")
    if out["forced"]:
        click.echo(f"forced over {_n(len(out['overridden']), 'finding')}, recorded in the event")


@witness_group.command("show", epilog=_examples("steptrail witness show",
                                                "steptrail witness show --json | jq .state"))
@json_option
@click.pass_context
def witness_show(ctx: click.Context, as_json: bool) -> None:
    """Where the witness is and what it says about the ledger. Read-only; always exit 0
    (a state other than ok or none is what opening refuses; 'verify' exits 1 on it)."""
    with _open(ctx, readonly=True, witness_check=False) as ledger:
        status = ledger.witness_status()
    if as_json:
        _emit_json(status)
        return
    if status.witness is None:
        click.echo("not witnessed" if status.state == "none" else f"witness: {status.problem}")
        return
    where = f" (recorded at event #{status.anchored_seq})" if status.anchored_seq else ""
    click.echo(f"witness {status.witness}{where}: {status.state}")
    if status.witnessed_seq is not None:
        click.echo(f"holds head #{status.witnessed_seq}; the ledger is at #{status.head_seq}"
                   f" ({_n(status.lag or 0, 'commit')} ahead)")
    if status.problem:
        click.echo(status.problem)

"""`steptrail fork`: a workspace as of an earlier step, in a new directory, as a new
workspace of the same ledger."""

from __future__ import annotations

import shlex

import click

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option
from ._options import _workspace, workspace_option
from .rewind import _target

@click.command("fork", cls=LedgerCommand, epilog=_examples(
    "steptrail --workspace w fork --at edit-7 --to ../w-try2           # as of that step",
    "steptrail --workspace w fork --at '#120' --to /tmp/w-120 --as w-120 --json",
))
@workspace_option
@click.option("--at", "at", required=True, metavar="STEP|SEQ",
              help="A step id (as it was just after that step's writes) or a seq (#N).")
@click.option("--to", "to", required=True, metavar="DIR",
              help="A new or empty directory to write the fork into (or the one a killed"
                   " run of this same fork left: run it again to finish it).")
@click.option("--as", "name", metavar="NAME",
              help="The fork's workspace name (default: the directory's name).")
@json_option
@click.pass_context
def fork(ctx: click.Context, ws_name: str | None, at: str, to: str, name: str | None,
         as_json: bool) -> None:
    """Fork the workspace as of an earlier step into a new directory.

    The files the ledger knew as of --at are written into DIR (with their recorded
    permission bits) and DIR becomes a new workspace of the same ledger: its first
    observation, labelled with where it came from, is its baseline and its lineage; the
    bytes are shared with the original (nothing is copied in the ledger). Another agent
    can work there under its own lease while the first goes on. Paths the ledger did not
    know then are left out and listed. Commands run inside DIR find this ledger and the
    fork's workspace by themselves (DIR/.steptrail/root; a copy of DIR is refused); a
    ledger in PostgreSQL is named there (--ledger or STEPTRAIL_LEDGER, as printed). A
    fork killed midway is finished by the
    same command (same --to, same --as): it checks what is there is this fork's, goes on,
    and answers with the fork once it is complete.
    """
    source = _workspace(ctx, ws_name)
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.fork(source, _target(ledger, at), to, name=name)
        location = ledger.path
    if as_json:
        _emit_json({"workspace": got.workspace, "root": got.root, "source": got.source,
                    "at_seq": got.at_seq, "at_step": got.at_step, "files": got.files,
                    "baseline": list(got.baseline),
                    "unreachable": [{"path": p, "why": why} for p, why in got.unreachable],
                    "ledger": str(location), "pointer": got.pointer})
        return
    for path, why in got.unreachable:
        click.echo(f"left out: {path} ({why})")
    where = f"step {got.at_step} (#{got.at_seq})" if got.at_step else f"#{got.at_seq}"
    click.echo(f"forked workspace {got.source} as of {where} into {got.root} as workspace"
               f" {got.workspace}: {got.files} file(s), baseline {', '.join(got.baseline)}")
    if got.pointer is not None:
        click.echo(f"work there with: cd {shlex.quote(got.root)} (steptrail finds this ledger"
                   f" and workspace {got.workspace} from there)")
    else:
        click.echo(f"work there with: export STEPTRAIL_LEDGER={shlex.quote(str(location))}"
                   f" STEPTRAIL_WORKSPACE={shlex.quote(got.workspace)}")

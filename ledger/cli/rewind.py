"""`steptrail rewind`: a workspace put back as it was at an earlier step, as a fenced step."""

from __future__ import annotations

import re
from typing import Any

import click

from ._common import LedgerCommand, Refusal, _emit_json, _examples, _open, json_option
from ._options import _workspace, epoch_option, workspace_option


_DIGITS = re.compile(r"[0-9]{1,18}")


def _target(ledger: Any, to: str) -> str | int:
    """A step id, or a seq: ``#N``/``seq:N``, or bare ASCII digits no step is named (the
    --to of rewind, the --at of fork)."""
    for prefix in ("#", "seq:"):
        if to.startswith(prefix) and _DIGITS.fullmatch(to[len(prefix):]):
            return int(to[len(prefix):])
    if _DIGITS.fullmatch(to) and ledger.find_step(to) is None:
        return int(to)
    return to


def rewind_json(r: Any) -> dict[str, Any]:
    return {
        "workspace": r.workspace, "to_seq": r.to_seq, "to_step": r.to_step,
        "preview": r.preview, "step": r.step, "verdict": r.verdict or None,
        "detail": r.detail or None,
        "changes": [{"path": c.path, "kind": c.kind, "now": c.now, "then": c.then,
                     "diff": c.diff or None} for c in r.changes],
        "unreachable": [{"path": p, "why": why} for p, why in r.unreachable],
        "unobserved": list(r.unobserved),
        "clears": list(r.clears), "cleared": r.cleared,
    }


_MARK = {"restore": "M", "create": "A", "delete": "D", "mode": "m"}  # m: the mode only


@click.command("rewind", cls=LedgerCommand, epilog=_examples(
    "steptrail --workspace w rewind --to edit-4 --preview   # what would change, with diffs",
    "steptrail --workspace w rewind --to edit-4             # do it: one fenced step",
    "steptrail --workspace w rewind --to '#120' --path src/  # as of seq 120, src/ only",
))
@workspace_option
@click.option("--to", "to", required=True, metavar="STEP|SEQ",
              help="A step id (as it was just after that step's writes) or a seq (#N, or"
                   " digits no step is named).")
@click.option("--path", "paths", multiple=True, metavar="PATH",
              help="Only this path, or this directory and what is under it (repeatable).")
@click.option("--preview", is_flag=True, help="Show what would change, with diffs; write"
              " nothing.")
@epoch_option("Rewind under this live epoch of a lease you hold; without it, rewind takes a"
              " lease of its own and releases it after.")
@json_option
@click.pass_context
def rewind(ctx: click.Context, ws_name: str | None, to: str, paths: tuple[str, ...],
           preview: bool, epoch: int | None, as_json: bool) -> None:
    """Put the workspace back as it was at an earlier step.

    Every path (or each --path) gets the content the ledger knew it held as of --to: a
    file created since is removed, one deleted since comes back. It is one fenced step,
    planned against what the ledger holds now, so it is recorded, shown and undoable like
    any step, and what it replaced stays in the ledger. A file whose bytes the ledger does
    not hold — an edit nobody observed — refuses the whole step and nothing is
    overwritten: run 'steptrail observe' first (--preview lists them). Paths the ledger
    did not know then (before the workspace's baseline) are left as they are and listed.
    Where a file and a directory traded places at one name (a then, a/b now, or back),
    what stands in the way is removed first by a step of its own, then the rest: two
    steps, both undoable (the second first).
    .git is never touched. A rewind killed midway is taken back by the next lease, or
    finished by running it again (the lease it left is taken over). Exit 1 when the step
    was refused.
    """
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=preview) as ledger:
        got = ledger.workspaces.rewind(name, _target(ledger, to),
                                       paths=list(paths) or None, preview=preview,
                                       epoch=epoch)
    document = rewind_json(got)
    if not as_json:
        where = f"{got.to_step} (#{got.to_seq})" if got.to_step else f"#{got.to_seq}"
        for c in got.changes:
            click.echo(f"{_MARK[c.kind]} {c.path}")
            if preview and c.diff:
                click.echo(c.diff.rstrip("\n"))
        for path, why in got.unreachable:
            click.echo(f"left as it is: {path} ({why})")
        if got.clears and (preview or not got.applied):
            click.echo(f"removed first, by a step of its own (a file and a directory traded"
                       f" places): {', '.join(got.clears[:20])}"
                       + (f" … {len(got.clears) - 20} more" if len(got.clears) > 20 else ""))
        for path in got.unobserved:
            click.echo(f"not observed: {path} holds bytes the ledger does not; the rewind"
                       " would be refused: run 'steptrail observe' first")
        if not got.changes:
            click.echo(f"workspace {name} already holds what it held as of {where}")
        elif preview:
            click.echo(f"{len(got.changes)} path(s) would change to their content as of"
                       f" {where} (--preview: nothing written)")
        elif got.applied and got.cleared:
            click.echo(f"rewound {len(got.changes)} path(s) to {where} as steps {got.cleared}"
                       f" (what stood where a file and a directory traded places) and"
                       f" {got.step} (undo them under a lease, the second first: steptrail"
                       f" step compensate {got.step} --reason WHY --epoch N, then"
                       f" {got.cleared})")
        elif got.applied:
            click.echo(f"rewound {len(got.changes)} path(s) to {where} as step {got.step}"
                       f" (undo it under a lease: steptrail step compensate {got.step}"
                       " --reason WHY --epoch N)")
    if not preview and got.changes and not got.applied:
        from ledger.errors import StepRejected

        raise Refusal(StepRejected(got.step or "", 1, got.verdict.removeprefix("rejected:"),
                                   got.detail or ""),
                      document if as_json else None,
                      "nothing was overwritten; run 'steptrail observe' to record the"
                      " edit, then rewind again")
    if as_json:
        _emit_json(document)

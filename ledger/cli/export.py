"""`steptrail export`: the event log or the step projection as JSON lines or CSV."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from ledger.errors import LedgerError

from ._common import LedgerSubgroup, _emit_json, _examples, _open, json_option
from ._format import _Spool, step_json


@click.group("export", cls=LedgerSubgroup, invoke_without_command=True)
@click.option("--what", type=click.Choice(["events", "steps"]), default="events", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.pass_context
def export(ctx: click.Context, what: str, fmt: str) -> None:
    """Stream the event log or the step projection to stdout, read-only; or write a run
    as git history ('steptrail export git --help').

    Reads through sqlite-utils; you can also point sqlite-utils or Datasette at the
    file yourself (open it read-only: 'sqlite-utils rows --help').

    \b
        steptrail export --what events > events.jsonl
        steptrail export --what steps --format csv > steps.csv
        steptrail export git --run r1            # one commit per step, on refs/steptrail/r1
    """
    if ctx.invoked_subcommand is not None:
        return
    from ledger.export import check_exportable, export_rows, unexportable

    path = ctx.obj["ledger_path"]
    check_exportable(path)
    # validates the file before anything reads it; the output is spooled, so a damaged
    # row fails the command before anything is printed
    with _open(ctx, readonly=True) as ledger, _Spool() as out:
        try:
            if what == "steps" and ledger.projection_lag() > 0:
                _write_rows((step_json(r) for r in ledger.steps()), fmt, out)
            else:
                with export_rows(path, what) as rows:
                    _write_rows(rows, fmt, out)
        except LedgerError:
            raise
        except (ValueError, TypeError, KeyError) as exc:  # a row that cannot be written
            raise unexportable(path, exc) from None
        out.done()


def _write_rows(rows: Iterator[dict[str, Any]], fmt: str, out: Any) -> None:
    import csv
    import json

    writer = None
    for row in rows:
        if fmt == "jsonl":
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            continue
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(row))
            writer.writeheader()
        writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(value: Any) -> Any:
    """A CSV cell: a boolean as true/false (as in JSON, not Python's True), an object or
    a list as its JSON text, None as an empty cell."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return value


@export.command("git", epilog=_examples(
    "steptrail export git --run r1                        # refs/steptrail/r1, from HEAD",
    "git log -p refs/steptrail/r1                         # review it where you review code",
    "steptrail export git --run r1 --base main --ref refs/steptrail/review-r1",
    "git push origin refs/steptrail/r1:refs/heads/agent-r1  # a branch for a pull request",
))
@click.option("--run", "run", required=True, metavar="RUN", help="The run to export.")
@click.option("--ref", metavar="REF", help="The ref to write (default refs/steptrail/RUN);"
              " never a branch (refs/heads/...) or HEAD.")
@click.option("--base", metavar="REV", help="The commit the run started from: the first"
              " commit's parent, whose tree the run's changes apply to (default: what an"
              " earlier export of the run started from, else HEAD).")
@click.option("--repo", metavar="DIR", help="The git repository to write into (default:"
              " the one the workspace's directory is in).")
@click.option("--author", metavar="'NAME <EMAIL>'",
              help="Author and committer of the commits (default: steptrail"
                   " <steptrail@localhost>).")
@json_option
@click.pass_context
def export_git_cmd(ctx: click.Context, run: str, ref: str | None, base: str | None,
                   repo: str | None, author: str | None, as_json: bool) -> None:
    """Write a run as git history, one commit per step, for review in git.

    Each step of the run that wrote the workspace and was acknowledged is a commit (its
    message names the step, attempt, epoch, lease holder and artifacts; dated from the
    ledger), each observation made meanwhile is a commit attributed to who asked, and a
    compensation is a revert commit. Every tree is the base's tree with the run's
    changes. Written with git fast-import onto REF only: HEAD, the index, the working
    tree and every branch are left as they are. Idempotent: a re-export writes the same
    commits; after more steps, it adds theirs.
    """
    from ledger.export_git import export_git

    with _open(ctx, readonly=True) as ledger:
        got = export_git(ledger, run, repo=repo, ref=ref, base=base, author=author)
    if as_json:
        _emit_json({"ref": got.ref, "head": got.head, "base": got.base,
                    "commits": got.commits,
                    "skipped": [{"step": s, "why": why} for s, why in got.skipped]})
        return
    for step, why in got.skipped:
        click.echo(f"skipped {step}: {why}")
    click.echo(f"{got.ref} at {got.head[:12]}: {got.commits} commit(s) of run {run}"
               f" on {got.base[:12] if got.base else 'no base (a root commit)'}"
               f" — git log -p {got.ref}")

"""`steptrail export`: the event log or the step projection as JSON lines or CSV."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from ledger.errors import LedgerError

from ._common import LedgerCommand, _open
from ._format import _Spool, step_json


@click.command("export", cls=LedgerCommand)
@click.option("--what", type=click.Choice(["events", "steps"]), default="events", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.pass_context
def export(ctx: click.Context, what: str, fmt: str) -> None:
    """Stream the event log or the step projection to stdout, read-only.

    Reads through sqlite-utils; you can also point sqlite-utils or Datasette at the
    file yourself (open it read-only: 'sqlite-utils rows --help').

    \b
        steptrail export --what events > events.jsonl
        steptrail export --what steps --format csv > steps.csv
    """
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

"""`steptrail demo`: the end-to-end demonstration."""

from __future__ import annotations

import functools
import sys

import click

from ledger.errors import EXIT_NO, InvalidInput

from ._common import LedgerCommand, _emit_json, json_option


@click.command("demo", cls=LedgerCommand)
@click.option("--keep", metavar="DIR", type=click.Path(file_okay=False), help="Keep the demo's files in DIR.")
@click.option("--ledger", "demo_ledger", metavar="URL", help="Keep the demo's ledger in this"
              " empty PostgreSQL database (the cross-machine scenario); default: a SQLite file.")
@json_option
def demo(keep: str | None, demo_ledger: str | None, as_json: bool) -> None:
    """Run the end-to-end demonstration on an embedded ledger (the main job).

    Creates a fresh ledger in a temporary directory (or DIR), drives scripted steps
    through it with the failures steptrail exists for, and checks every invariant.
    Exit 0 only if every check held.

    With --ledger postgresql://... the ledger lives in that (empty) database and the
    workers share nothing but its URL: the worker SIGKILLed mid-step loses its
    directory, and a worker elsewhere restores the workspace from the database onto a
    fresh directory, takes a new epoch and finishes; the dead worker's late receipt is
    refused.

    \b
        steptrail demo
        steptrail demo --ledger postgresql://me@db.internal/demo
    """
    from ledger import locate
    from ledger.demo import run_demo

    if demo_ledger is not None and not locate(demo_ledger).shared:
        raise InvalidInput(f"demo --ledger takes a postgresql:// URL, not {demo_ledger!r}"
                           " (without it the demo makes its own SQLite ledger)")
    try:
        report = run_demo(keep, echo=None if as_json else functools.partial(click.echo, err=False),
                          ledger=demo_ledger)
    except FileExistsError as exc:
        raise InvalidInput(str(exc)) from None
    if as_json:
        _emit_json(report)
    if not report["ok"]:
        sys.exit(EXIT_NO)

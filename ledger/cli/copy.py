"""`steptrail copy`: a ledger copied whole between stores (a file, a database)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ledger.errors import EXIT_NO

from ._common import LedgerCommand, _emit_json, _examples, _progress, json_option
from ._format import _n, _size


@click.command("copy", cls=LedgerCommand, epilog=_examples(
    "steptrail copy .steptrail/ledger.db postgresql://me@db.internal/ledger",
    "steptrail copy postgresql://me@db.internal/ledger ./ledger-copy.db --json",
))
@click.argument("source", metavar="SRC")
@click.argument("dest", metavar="DST")
@click.option("--no-verify", is_flag=True, help="Skip verifying both ends afterwards.")
@click.option("--archive-dir", "archive_dir", metavar="DIR",
              help="Where a database DST keeps sealed runs' archives (absolute; recorded in"
                   " it). A file DST keeps them in archive/ beside it.")
@json_option
@click.pass_context
def copy_cmd(ctx: click.Context, source: str, dest: str, no_verify: bool,
             archive_dir: str | None, as_json: bool) -> None:
    """Copy the ledger SRC to the new ledger DST, between stores (a file or a
    postgresql:// URL each): every event, hash, projection row and blob, unchanged.

    This is how a ledger that started embedded moves to a server, and back. The
    source is read in one snapshot (writers may go on; what they commit after it is
    not in the copy, and gc waits); the copy's tables commit in one transaction, after
    every blob they name is stored. DST must be new: a file that does not exist, or a
    database with no ledger (or an empty one). Then both ends are verified and their
    heads compared. Sealed runs' archives come along, each verified: into archive/ beside
    a file DST, into --archive-dir for a database DST.

    \b
    Exit codes: 0 copied and both ends verify with the same head; 1 a verify found a
    problem or the heads differ; 2 DST is not new, or SRC is not a ledger; 3 storage.
    """
    from ledger import Ledger
    from ledger.copying import copy_ledger

    update, finish = _progress("copying")
    try:
        report = copy_ledger(source, dest, archive_dir=archive_dir,
                             progress=None if update is None else lambda _w, n: update(n))
    finally:
        finish()
    out: dict[str, Any] = {**report.as_json(), "verified": not no_verify}
    ok = True
    if not no_verify:
        heads = []
        for where, key in ((source, "source_verify"), (dest, "dest_verify")):
            with Ledger.open(where, readonly=True, witness=ctx.obj.get("witness")) as led:
                v = led.verify()
            heads.append(f"{v.head_seq}:{v.head_hash}")
            out[key] = {"ok": v.ok, "findings": len(v.findings), "head": heads[-1]}
            ok = ok and v.ok
        out["same_head"] = heads[1] == report.head
        ok = ok and out["same_head"]
    out["ok"] = ok
    if as_json:
        _emit_json(out)
    else:
        click.echo(f"copied {report.source} -> {report.dest}: {_n(report.events, 'event')},"
                   f" {_n(report.rows, 'row')}, {_n(report.blobs, 'blob')}"
                   f" ({_size(report.blob_bytes)}) outside the inline rows; head {report.head}")
        if not no_verify:
            for key, what in (("source_verify", "source"), ("dest_verify", "copy")):
                v = out[key]
                click.echo(f"  verify {what}: {'ok' if v['ok'] else 'FAILED'}"
                           f" ({_n(v['findings'], 'finding')}), head {v['head']}")
            if not out["same_head"]:
                click.echo("  the copy's head differs from the source's snapshot head", err=True)
    if not ok:
        sys.exit(EXIT_NO)

"""`steptrail observe`: record the changes made to a workspace outside the steps."""

from __future__ import annotations

import getpass
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from ledger.fmt import count as _count

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option
from ._options import DURATION, SIZE, _workspace, epoch_option, workspace_option


def _by() -> str:
    """Who asks at the command line: the user and host, and whether a terminal is
    attached (a person typing) or not (a script or an agent's shell)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    where = "a terminal" if sys.stdin.isatty() and sys.stdout.isatty() else "no terminal"
    return f"cli:{user}@{socket.gethostname()} ({where})"[:255]


def _escaped(name: str) -> str:
    """A file name no event can carry, as text (control characters and bytes that are
    not UTF-8 written out as escapes)."""
    raw = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return raw.encode("unicode_escape").decode("ascii")


def observation_json(o: Any) -> dict[str, Any]:
    return {
        "workspace": o.workspace, "recorded": o.recorded, "dry_run": o.dry_run,
        "baseline": o.baseline, "steps": list(o.steps), "epoch": o.epoch, "by": o.by,
        "label": o.label,
        "changes": [{"path": c.path, "kind": c.kind, "rev": c.base_rev,
                     "pre_hash": c.pre_hash, "post_hash": c.post_hash, "size": c.size,
                     "mode": None if c.mode is None else oct(c.mode),
                     "pre_mode": None if c.pre_mode is None else oct(c.pre_mode)}
                    for c in o.changes],
        "not_captured": [{"path": n.path, "why": n.why} for n in o.not_captured],
        "bad_names": [_escaped(n) for n in o.bad_names],
        "ignore_rules": o.ignore_rules,
        "files": o.files, "hashed": o.hashed, "bytes_hashed": o.bytes_hashed,
        "seconds": round(o.seconds, 6),
    }


_MARK = {"created": "A", "changed": "M", "deleted": "D", "mode": "m"}


@click.command("observe", cls=LedgerCommand, epilog=_examples(
    "steptrail --workspace w observe                  # record what changed outside the steps",
    "steptrail --workspace w observe --dry-run        # only show it",
    "steptrail --workspace w observe --label 'my edits before lunch' --json",
    "steptrail --workspace w observe --epoch 3        # under the lease you hold",
    "steptrail --workspace w observe --watch          # a live session: each burst of saves",
))
@workspace_option
@epoch_option("Observe under this live epoch of a lease you hold (between your own steps);"
              " without it, observe takes a lease of its own and releases it after.")
@click.option("--label", default="", metavar="TEXT", help="Your words, recorded with it.")
@click.option("--dry-run", is_flag=True, help="Compare and show; record nothing.")
@click.option("--full", is_flag=True, help="Hash every file (the stat cache is a hint).")
@click.option("--include-ignored", is_flag=True,
              help="Capture .gitignore'd files too (by default they are left out and listed).")
@click.option("--max-file-size", type=SIZE, default="64MiB", show_default=True,
              metavar="SIZE", help="Files larger than this are left out and listed.")
@click.option("--by", "by", metavar="WHO",
              help="Who asks (default: cli:USER@HOST, with whether a terminal is attached)."
                   " A harness names its agent here: an agent's own shell edits are then"
                   " attributed to it, not to a person.")
@click.option("--watch", is_flag=True,
              help="Keep observing: each time the tree changes (inotify; elsewhere every"
                   " --interval), once it has been quiet for a moment. Ctrl-C ends it; what"
                   " was recorded stays. Prints the first look and each look that recorded"
                   " something; with --json, one document a line.")
@click.option("--interval", type=DURATION, default="2s", show_default=True,
              help="With --watch: how long the tree must stay quiet before a look, and how"
                   " often to look where inotify is not available.")
@json_option
@click.pass_context
def observe(ctx: click.Context, ws_name: str | None, epoch: int | None, label: str,
            dry_run: bool, full: bool, include_ignored: bool, max_file_size: int,
            by: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """Record the changes made to the workspace outside the steps.

    Every regular file that differs from what the ledger knows — created (A), changed
    (M), deleted (D), its mode changed (m) — is recorded as an observation: a step of
    its own whose writes are those changes, attributed to who asked (--by). No file is
    touched. Nothing changed: nothing is written. The first observation of a workspace
    is its baseline (every file, as created). Restore, history and undo then cover
    these edits like a step's.

    Left out, and listed: .gitignore'd files (git decides; --include-ignored captures
    them), files over --max-file-size, symlinks and other non-files. Fast when little
    changed: only files whose size, times, inode or mode moved are read.
    """
    name = _workspace(ctx, ws_name)
    who = by or _by()
    with _open(ctx, readonly=dry_run) as ledger:
        def look() -> Any:
            return ledger.workspaces.observe(
                name, epoch=epoch, label=label, by=who, dry_run=dry_run,
                include_ignored=include_ignored, max_file_bytes=max_file_size, full=full)

        if not watch:
            got = look()
        else:
            _watch(ledger, name, look, interval, include_ignored, as_json)
            return
    _report(got, name, dry_run, include_ignored, as_json)


def _watch(ledger: Any, name: str, look: Callable[[], Any], interval: float,
           include_ignored: bool, as_json: bool) -> None:
    """`observe --watch`: look, then wait for the tree to change and stay quiet for
    `interval`, and look again, until interrupted (see `ledger.workspace.watch`)."""
    from ledger import LeaseHeld

    root = ledger.workspaces.registration(name).root
    watcher = ledger.workspaces.watcher(name, interval=interval,
                                        include_ignored=include_ignored)
    if watcher.why_polling:
        click.echo(f"note: {watcher.why_polling}", err=True)
    if not as_json:
        click.echo(f"watching workspace {name} ({root}); Ctrl-C to stop", err=True)
    said, first = "", True
    try:
        while True:
            try:
                got = look()
            except LeaseHeld as held:
                if str(held) != said:  # once per holder, not every interval
                    said = str(held)
                    click.echo(f"note: {held}; looking again every {interval:g}s until it"
                               " is released", err=True)
                time.sleep(interval)
                continue
            said = ""
            if got.changes or first:
                _report(got, name, False, include_ignored, as_json, quiet_notes=True)
            first = False
            # a change, then quiet for `interval`: one look for a burst of saves
            while not watcher.wait(3600.0):
                pass
            while watcher.wait(interval):
                pass
    finally:
        watcher.close()


def _report(got: Any, name: str, dry_run: bool, include_ignored: bool, as_json: bool,
            quiet_notes: bool = False) -> None:
    if as_json:
        _emit_json(observation_json(got))
        return
    for c in got.changes:
        extra = (f" ({oct(c.pre_mode) if c.pre_mode is not None else '?'} -> {oct(c.mode)})"
                 if c.kind == "mode" and c.mode is not None else "")
        click.echo(f"{_MARK[c.kind]} {c.path}{extra}")
    if got.bad_names:
        shown = ", ".join(_escaped(n) for n in got.bad_names[:10])
        click.echo(f"not captured, a name no event can carry (rename it): {shown}"
                   + (f" and {len(got.bad_names) - 10} more" if len(got.bad_names) > 10
                      else ""))
    left = got.not_captured
    if left:
        shown = ", ".join(f"{n.path} ({n.why})" for n in left[:10])
        more = f" and {len(left) - 10} more" if len(left) > 10 else ""
        click.echo(f"not captured: {shown}{more}")
    cost = (f"{_count(got.files, 'file')} looked at, {got.hashed} read"
            f" ({got.bytes_hashed:,} bytes) in {got.seconds:.2f}s")
    if not got.changes:
        click.echo(f"nothing changed outside the steps in workspace {name} ({cost})")
    elif dry_run:
        click.echo(f"{_count(len(got.changes), 'change')} not recorded (--dry-run; {cost})")
    else:
        what = "baseline" if got.baseline else "observation"
        click.echo(f"recorded {_count(len(got.changes), 'change')} as {what}"
                   f" {', '.join(got.steps)} by {got.by} ({cost})")
    if not got.ignore_rules and not include_ignored and not quiet_notes:
        click.echo("note: no git work tree here, so no .gitignore rules were applied"
                   " (every file was looked at)", err=True)

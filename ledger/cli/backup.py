"""`steptrail backup` (take, verify, restore a backup of the whole ledger) and
`steptrail restore` (a workspace's committed content onto a directory)."""

from __future__ import annotations

import os
import shlex
from typing import Any

import click
import msgspec

from ._common import (
    LedgerCommand,
    LedgerSubgroup,
    _emit_json,
    _examples,
    _open,
    _progress,
    json_option,
)
from ._format import _iso, _n, _size
from ._options import _workspace, workspace_option


@click.command("restore", cls=LedgerCommand, epilog=_examples(
    "steptrail restore --workspace repo --to /mnt/fresh/repo",
    "steptrail --workspace repo restore --to ./repo-restored --json",
    "steptrail restore --workspace repo --to ./new --force && \\",
    "  steptrail --workspace repo lease acquire --holder agent-2 --force",
    "steptrail restore --workspace repo --to ./repo --replace   # over files already there",
))
@workspace_option
@click.option("--to", "target", required=True, metavar="DIR",
              type=click.Path(file_okay=True, dir_okay=True),
              help="Where to write the files: a new or empty directory.")
@click.option("--force", is_flag=True,
              help="Restore even while a lease is live; take a new epoch right after.")
@click.option("--replace", is_flag=True,
              help="DIR may hold other files: each committed path is written, and a file"
                   " holding other bytes there is kept beside it (NAME.steptrail-kept-TAG),"
                   " never removed; files the ledger does not know are left alone.")
@json_option
@click.pass_context
def restore_cmd(ctx: click.Context, ws_name: str | None, target: str, force: bool,
                replace: bool, as_json: bool) -> None:
    """Write a workspace's committed content to DIR, and make DIR its root.

    Each path steptrail knows goes back to its committed content: the post-image of
    its newest committed write (by revision, whenever its step published), or the
    pre-image a compensation put back; every blob is checked before the first file is
    written. Only files the ledger holds come back: files steptrail never wrote are
    not in it and are not restored. A workspace-restored event records DIR as the
    workspace's new root: steps write there from now on.

    DIR must be new or empty — or hold nothing but this ledger's own directory (a
    backup restored into fresh/.steptrail, then 'restore --to fresh'), or a killed
    restore's output (then it goes on).

    \b
    Exit codes: 0 restored; 1 a live lease blocks it (its holder may still write to
    the old directory: --force, then take a new epoch) or a blob is missing;
    2 DIR is not a new or empty directory (nor one holding only the ledger), or the
    workspace is unknown.
    """
    from ledger.errors import LeaseHeld

    name = _workspace(ctx, ws_name)
    # (a target that is not new or empty is refused by the library, before anything is
    # written — unless it holds nothing but a killed restore's output: then resumed)
    with _open(ctx, readonly=False) as ledger:
        before = ledger.workspaces.get(name)
        live = before.live_epoch(ledger.clock()) is not None
        try:
            report = ledger.workspaces.restore(name, target, force=force, replace=replace)
        except LeaseHeld as exc:
            raise LeaseHeld(
                exc.workspace, exc.epoch, exc.holder, exc.expires_ns,
                f"its holder may still write to {before.root}: wait for the lease to end (or"
                " release it), or pass --force and then take a new epoch ('steptrail"
                f" --workspace {name} lease acquire --holder NAME --force') so its unfinished"
                " attempts are settled against the restored files",
            ) from None
    if as_json:
        _emit_json(msgspec.to_builtins(report) | {"lease_was_live": live})
    else:
        absent = f", {_n(report.absent, 'path')} absent (deleted)" if report.absent else ""
        again = " (already recorded)" if report.deduped else ""
        click.echo(f"restored workspace {report.workspace} to {report.root}:"
                   f" {_n(report.paths, 'path')}, {_size(report.bytes)}{absent}; rev {report.rev},"
                   f" event #{report.seq}{again}")
        click.echo("only files the ledger holds came back (what steps wrote); files"
                   " steptrail never wrote are not in it")
        for kept in report.kept:
            click.echo(f"kept: {kept} (what was at its path before: yours to look at)")
    if live:
        click.echo(f"steptrail: the lease of epoch {before.epoch} ({before.holder}) was live:"
                   f" take a new epoch now ('steptrail --workspace {name} lease acquire"
                   " --holder NAME --force') so its unfinished attempts are settled against"
                   " the restored files", err=True)


class _BackupGroup(LedgerSubgroup):
    """`steptrail backup DEST` takes a backup (the `take` command) when DEST is written
    as a path (it holds a "/": `/mnt/b`, `./b`); `backup verify` and `backup restore` are
    its other commands, and any other word is an unknown command, as in every group."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and os.sep in args[0]:
            args = ["take", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and name not in self.commands and not name.startswith("-"):
            raise click.UsageError(
                f"No such command {name!r}; to back up into a directory named {name},"
                f" write it as a path: 'steptrail backup ./{name}' (or 'backup take {name}')",
                ctx)
        return super().resolve_command(ctx, args)


@click.group("backup", cls=_BackupGroup, epilog=_examples(
    "steptrail backup /mnt/backup/ledger          # take one (again: only what changed)",
    "steptrail backup verify /mnt/backup/ledger   # check one, read-only",
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail",
    "steptrail --ledger ./new/.steptrail/ledger.db restore --workspace w --to ./w",
))
def backup_group() -> None:
    """Back up the whole ledger while writers run; restore it on a fresh machine.

    'backup DEST' (short for 'backup take DEST'; DEST written as a path: /mnt/b, ./b)
    writes a consistent copy of the ledger
    — events, projections, inline and file blobs — into the directory DEST, verifies it
    and only then writes its completion marker (BACKUP.json). Run it again into the same
    DEST: only what changed is copied. 'backup verify DEST' checks a backup;
    'backup restore DEST LEDGER_DIR' makes a ledger of it (docs/operations.md "Backups").
    """


@backup_group.command("take", epilog=_examples(
    "steptrail backup /mnt/backup/ledger",
    "steptrail backup take /mnt/backup/ledger --json",
    "steptrail backup /mnt/backup/ledger --deep   # re-hash the blobs already there",
))
@click.argument("dest", metavar="DEST", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--deep", is_flag=True, help="Re-hash every blob already in DEST before"
              " trusting it (default: its size; blobs copied now are always hashed).")
@json_option
@click.pass_context
def backup_take(ctx: click.Context, dest: str, deep: bool, as_json: bool) -> None:
    """Write a consistent, verified backup of the ledger into the directory DEST.

    Online: the database snapshot is one read transaction, writers go on; gc waits
    (its lock) until the backup is done. Incremental: blobs already in DEST are not
    copied again, and a DEST that already holds the ledger's head is only checked.
    DEST holds the snapshot, the blob files it needs and BACKUP.json, written last:
    without it a directory is never taken for a backup.

    \b
    Exit codes: 0 backed up (or already up to date); 1 a blob the ledger needs is
    missing; 2 DEST is refused (inside the ledger's directory, a file, another
    ledger's backup, other files) or the copy failed its check (no marker written);
    3 storage failed.
    """
    from ledger.backup import backup

    update, finish = _progress("copying blobs")
    try:
        report = backup(ctx.obj["ledger_path"], dest, deep=deep, progress=update,
                        witness=ctx.obj.get("witness"))
    finally:
        finish()
    if as_json:
        _emit_json(report)
        return
    if report.unchanged:
        click.echo(f"backup {report.dest} is up to date: head #{report.head_seq},"
                   f" {_n(report.blobs, 'blob file')} present; nothing copied")
        return
    click.echo(f"backed up head #{report.head_seq} to {report.dest}: {report.db}"
               f" ({_size(report.db_bytes)}), {_n(report.blobs, 'blob file')}"
               f" ({_n(report.blobs_copied, 'copied', 'copied')}, {_size(report.bytes_copied)};"
               f" {report.blobs_skipped} already there); verified ({report.elapsed_s:.2f}s)")
    if report.archives:
        click.echo(f"  {_n(report.archives, 'sealed-run archive')} ({report.archives_copied}"
                   " copied now)")


@backup_group.command("verify", epilog=_examples(
    "steptrail backup verify /mnt/backup/ledger",
    "steptrail backup verify /mnt/backup/ledger --shallow --json",
))
@click.argument("dest", metavar="DEST", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--shallow", is_flag=True, help="Check blob files by size, not by re-hashing.")
@json_option
@click.pass_context
def backup_verify(ctx: click.Context, dest: str, shallow: bool, as_json: bool) -> None:
    """Check a backup whole, read-only: its marker, its database's digest, verify at
    the marker's head, every blob it needs re-hashed (--shallow: sizes).

    \b
    Exit codes: 0 complete and sound; 2 incomplete (BackupIncomplete: take it again)
    or damaged, edited or not a backup (BackupInvalid).
    """
    from ledger.backup import check_backup

    found = check_backup(dest, deep=not shallow)
    if as_json:
        _emit_json(found)
        return
    click.echo(f"backup {found.path}: ok — ledger {found.ledger_id} at head #{found.head_seq},"
               f" {_n(found.blobs, 'blob file')} ({_size(found.blob_bytes)}), taken"
               f" {_iso(found.created_ns)}")


@backup_group.command("restore", epilog=_examples(
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail",
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail \\",
    "  --witness /other/volume/new.witness      # the backup was witnessed",
))
@click.argument("backup_dir", metavar="BACKUP_DIR",
                type=click.Path(file_okay=True, dir_okay=True))
@click.argument("ledger_dir", metavar="LEDGER_DIR",
                type=click.Path(file_okay=True, dir_okay=True))
@click.option("--witness", "new_witness", metavar="PATH", type=click.Path(dir_okay=False),
              help="A new witness for the restored ledger, absolute (required when the"
              " backup was witnessed; default: the global --witness).")
@json_option
@click.pass_context
def backup_restore(ctx: click.Context, backup_dir: str, ledger_dir: str,
                   new_witness: str | None, as_json: bool) -> None:
    """Make a ledger of a backup: LEDGER_DIR (new or empty) receives its database and
    blob files, checked whole first, verified after.

    A restored ledger is behind its old witness by construction: a witnessed backup
    needs --witness PATH, a new file, anchored at the backup's head (the
    witness-anchored event records what it replaced). Then restore each workspace:
    'steptrail --ledger LEDGER_DIR/ledger.db restore --workspace NAME --to DIR'.

    \b
    Exit codes: 0 restored; 2 the backup is incomplete or damaged, LEDGER_DIR is not
    new or empty, or --witness is missing or not a new absolute path.
    """
    from ledger.backup import restore_backup

    update, finish = _progress("copying blobs")
    try:
        got = restore_backup(backup_dir, ledger_dir, witness=new_witness or ctx.obj.get("witness"),
                             progress=update)
    finally:
        finish()
    if as_json:
        _emit_json(got)
        return
    witness = (f"; new witness {got.witness} anchored at event #{got.anchored_seq}"
               if got.witness else "")
    click.echo(f"restored ledger {got.path}: head #{got.head_seq},"
               f" {_n(got.blobs, 'blob file')} ({_size(got.blob_bytes)}); verified{witness}")
    for name in got.workspaces:
        # As printed, it runs: a lease live in the backup is live here too, and restore
        # refuses a live lease without --force (issue 26, item 17).
        force = " --force" if name in got.live_leases else ""
        click.echo(f"next: steptrail --ledger {shlex.quote(got.path)} restore --workspace"
                   f" {shlex.quote(name)} --to DIR{force}")

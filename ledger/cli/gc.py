"""`steptrail gc` (collect orphan blobs) and `steptrail audit` (account for every byte)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from ledger.errors import EXIT_NO

from ._common import LedgerCommand, _emit_json, _examples, _open, _progress, json_option
from ._format import _dur, _n, _size
from ._options import DURATION, INT64_MAX, Duration


def _row(label: str, count: int | str, nbytes: int | str, note: str = "") -> str:
    return (f"  {label:<24} {count!s:>9} {nbytes!s:>14}" + (f"  {note}" if note else "")).rstrip()


GRACE_HELP = "Orphans younger than this are kept (a file's mtime, an inline row's insert time)."


@click.command("gc", cls=LedgerCommand, epilog=_examples(
    "steptrail gc --dry-run                      # what would go; changes nothing",
    "steptrail gc                                # orphans older than 24h",
    "steptrail gc --max-runtime 10m --max-delete 10000 --json",
    "steptrail gc --grace 10m --force            # a short window: you mean it",
    "steptrail gc --dry-run --retention keep.toml  # what a retention policy would release",
))
@click.option("--grace", type=Duration(allow_zero=True), default="24h", show_default=True,
              help=GRACE_HELP + " Under 1h only with --force.")
@click.option("--force", is_flag=True, help="Allow a grace window shorter than 1h.")
@click.option("--dry-run", is_flag=True,
              help="Report what would be collected; open the ledger read-only, change nothing.")
@click.option("--max-runtime", type=DURATION, metavar="DURATION",
              help="Stop deleting after this long (e.g. 10m); the next run resumes.")
@click.option("--max-delete", type=click.IntRange(min=0, max=INT64_MAX), metavar="N",
              help="Delete at most N blobs this run; the next run resumes.")
@click.option("--wait", is_flag=True,
              help="Wait for another running collector to finish instead of exiting 3.")
@click.option("--retention", "retention_file", metavar="FILE",
              type=click.Path(dir_okay=False),
              help="Apply this retention policy first (default: .steptrail/retention.toml"
                   " beside a SQLite ledger, when it exists).")
@click.option("--no-retention", is_flag=True,
              help="Apply no retention policy, even the default file.")
@json_option
@click.pass_context
def gc_cmd(ctx: click.Context, grace: float, force: bool, dry_run: bool,
           max_runtime: float | None, max_delete: int | None, wait: bool,
           retention_file: str | None, no_retention: bool, as_json: bool) -> None:
    """Collect orphan blobs: stored, named by no manifest, pinned by no attempt, old.

    Fails closed: on any doubt about what references a blob (a referenced blob
    missing, events and tables disagreeing, something in the blob store that is not
    a blob) it deletes nothing and exits 1 naming the cause. Two phases: condemn the
    candidates, then per batch re-check, unlink and record blob-collected in one
    transaction, so a writer that pins a blob meanwhile keeps it. A progress bar is
    drawn on a terminal (stderr).

    \b
    Exit codes: 0 done (also when a --max-* bound stopped it: run it again);
    1 refused, nothing deleted (a human must look); 2 bad input (a grace window
    under 1h without --force); 3 another gc holds the lock, or storage failed
    (retry later).

    \b
    Retention (docs/time-travel.md "Retention"): with a policy file, gc first
    releases the old versions of workspace files the policy does not keep
    (recorded as history-released events; the events of the steps stay), then
    collects their bytes with the orphans. The policy, in TOML:
      [history]
      keep_days = 30       # every version newer than 30 days
      keep_versions = 10   # and the last 10 of each path
    The current file, held runs and steps, and unsettled steps are always kept.
    """
    from ledger import retention
    from ledger.gc import check_grace, collect

    check_grace(grace, force=force)  # before the ledger is opened: a refusal reads nothing
    if retention_file is not None and no_retention:
        raise click.UsageError("give --retention FILE or --no-retention, not both")
    policy = retention.load_policy(retention_file) if retention_file is not None else None
    update, finish = _progress("collecting")
    with _open(ctx, readonly=dry_run) as ledger:
        if policy is None and not no_retention:
            default = retention.policy_path(ledger)
            if default is not None and os.path.exists(default):
                policy = retention.load_policy(default)
        try:
            report = collect(ledger, grace_s=grace, force=force, dry_run=dry_run,
                             max_runtime_s=max_runtime, max_delete=max_delete, progress=update,
                             wait=wait, retention=policy)
        finally:
            finish()
    if as_json:
        _emit_json(report.as_dict())
    else:
        _echo_gc(report)
    if report.stopped:
        bound = "--max-runtime" if report.stopped == "max-runtime" else "--max-delete"
        click.echo(f"steptrail: gc stopped at {bound}; {_n(report.remaining, 'condemned blob')}"
                   " remain for the next run", err=True)


def _echo_gc(r: Any) -> None:
    grace = _dur(r.grace_s)
    head = "dry run, nothing changed" if r.dry_run else f"collection {r.collection}"
    click.echo(f"gc: {head} (grace {grace})")
    if r.retention is not None:
        p = r.retention["policy"]
        rules = [f"versions newer than {p['keep_days']:g} day(s)"] if p["keep_days"] else []
        rules += [f"the last {p['keep_versions']} of each path"] if p["keep_versions"] else []
        kept = sum(w["kept"] for w in r.retention["workspaces"])
        verb = "would release" if r.dry_run else "released"
        click.echo(f"retention: {p['source']} keeps {' and '.join(rules)}; {verb}"
                   f" {_n(r.retention['released'], 'version')}, kept {kept}; that frees"
                   f" {_n(r.retention['releasable_blobs'], 'blob')},"
                   f" {_size(r.retention['releasable_bytes'])}")
    click.echo(_row("", "BLOBS", "BYTES"))
    click.echo(_row("scanned", r.scanned, r.scanned_bytes))
    click.echo(_row("referenced", r.referenced, r.referenced_bytes,
                    "named by a manifest or a compensation"))
    click.echo(_row("kept: live", r.kept_live, r.kept_live_bytes,
                    "pinned: in flight, or a pre-image still compensable"))
    click.echo(_row("kept: young", r.kept_young, r.kept_young_bytes,
                    f"orphans younger than {grace}"))
    click.echo(_row("orphans found", r.orphans, r.orphan_bytes, f"orphans older than {grace}"))
    if r.dry_run:
        earlier = r.remaining - r.orphans
        click.echo(_row("would collect", r.remaining, r.orphan_bytes,
                        f"incl. {earlier} condemned by an earlier run" if earlier > 0 else ""))
        click.echo(_row("temp files to remove", r.temp_removed, r.temp_removed_bytes,
                        f"{r.temp_kept} kept (young or pinned)"))
        click.echo(f"gc: would collect {_n(r.remaining, 'blob')}, {_size(r.orphan_bytes)};"
                   " nothing changed")
        return
    click.echo(_row("collected", r.collected, r.reclaimed_bytes))
    click.echo(_row("temp files removed", r.temp_removed, r.temp_removed_bytes,
                    f"{r.temp_kept} kept (young or pinned)"))
    if r.ws_temp_removed:
        click.echo(_row("workspace temp files", r.ws_temp_removed, "-",
                        "removed: left by killed applies"))
    click.echo(_row("recovered", r.recovered, "-",
                    "condemned earlier, found gone: recorded as collected"))
    click.echo(_row("spared", r.spared, "-", "condemned, then referenced, pinned or fresh: kept"))
    click.echo(_row("remaining", r.remaining, "-", "still condemned (the next run resumes)"))
    stopped = f"; stopped at --{r.stopped}" if r.stopped else ""
    click.echo(f"gc: collected {_n(r.collected, 'blob')}, reclaimed {_size(r.reclaimed_bytes)}"
               f" in {r.elapsed_s:.2f}s{stopped}")


@click.command("audit", cls=LedgerCommand, epilog=_examples(
    "steptrail audit",
    "steptrail audit --deep                      # re-hash every blob",
    "steptrail audit --json | jq '.orphan_old.bytes'",
))
@click.option("--deep", is_flag=True, help="Re-hash every blob (reads every byte): finds corrupt blobs.")
@click.option("--grace", type=Duration(allow_zero=True), default="24h", show_default=True,
              help="Where orphans split into young (kept) and old (gc reclaims them now).")
@json_option
@click.pass_context
def audit_cmd(ctx: click.Context, deep: bool, grace: float, as_json: bool) -> None:
    """Account for every stored byte against the committed steps. Read-only.

    Every blob (inline row or file) and temporary file lands in one bucket, first
    match wins: referenced by a manifest or compensation, pinned, orphan inside the
    grace window, orphan outside it, temporary. The reconciliation line checks
    stored = referenced + pinned + orphan(young) + orphan(old) + temporary.
    Exit 1 on any violation: a manifest or compensation naming a missing blob
    (dangling), a blob whose bytes do not hash to its name (corrupt, with --deep),
    a ledger the references cannot be read from, or sums that do not reconcile.
    """
    from ledger.gc import audit

    update, finish = _progress("hashing")
    with _open(ctx, readonly=True) as ledger:
        try:
            report = audit(ledger, deep=deep, grace_s=grace, progress=update if deep else None)
        finally:
            finish()
    if as_json:
        _emit_json(report.as_dict())
    else:
        _echo_audit(report)
    if not report.ok:
        sys.exit(EXIT_NO)


def _echo_audit(r: Any) -> None:
    grace = _dur(r.grace_s)
    click.echo(f"audit{' --deep' if r.deep else ''} (grace {grace})")
    click.echo(_row("committed steps", r.committed_steps, ""))
    click.echo(_row("committed bytes", "", r.committed_bytes,
                    f"named by live manifests; {r.committed_bytes_distinct} distinct"))
    click.echo(_row("pending", r.pending_steps, r.pending_bytes,
                    "steps in flight and the bytes they stored"))
    click.echo(_row("", "BLOBS", "BYTES"))
    click.echo(_row("stored", r.stored_blobs + r.temporary.count, r.stored_bytes,
                    f"{r.inline.count} inline, {_n(r.files.count, 'file')},"
                    f" {r.temporary.count} temporary"))
    click.echo(_row("referenced", r.referenced.count, r.referenced.bytes,
                    "named by a manifest (any revision) or a compensation"))
    click.echo(_row("pinned", r.pinned.count, r.pinned.bytes,
                    "in flight, or a pre-image still compensable"))
    click.echo(_row("orphan, young", r.orphan_young.count, r.orphan_young.bytes,
                    f"younger than {grace}: gc keeps them"))
    click.echo(_row("orphan, old", r.orphan_old.count, r.orphan_old.bytes,
                    f"older than {grace}: gc reclaims them"))
    click.echo(_row("temporary", r.temporary.count, r.temporary.bytes,
                    "leftovers of interrupted writes"))
    unrecorded = (f"; {r.collected_unrecorded} gone but not yet recorded (an interrupted gc)"
                  if r.collected_unrecorded else "")
    click.echo(_row("collected so far", r.collected.count, r.collected.bytes,
                    f"blob-collected events{unrecorded}"))
    if r.condemned:
        click.echo(_row("condemned", r.condemned, "-", "awaiting the next gc's re-check"))
    buckets = (r.referenced.bytes, r.pinned.bytes, r.orphan_young.bytes, r.orphan_old.bytes,
               r.temporary.bytes)
    verdict = "holds" if r.reconciled else f"DOES NOT HOLD (buckets sum to {sum(buckets)})"
    click.echo("stored = referenced + pinned + orphan(young) + orphan(old) + temporary: "
               f"{r.stored_bytes} = {' + '.join(str(b) for b in buckets)} — {verdict}")
    for d in r.dangling:
        click.echo(f"VIOLATION [dangling] blob {d['digest']} is missing; named by"
                   f" {', '.join(d['named_by'])}")
    for c in r.corrupt:
        click.echo(f"VIOLATION [corrupt] blob {c['digest']} ({c['size']} bytes): {c['problem']}")
    for p in r.problems:
        click.echo(f"VIOLATION [ledger] {p}")
    if not r.reconciled:
        click.echo("VIOLATION [reconcile] the buckets do not add up to the bytes stored")
    n = r.violations + (0 if r.reconciled else 1)
    click.echo(f"audit: {'ok' if r.ok else _n(n, 'violation')} ({r.elapsed_s:.2f}s)")

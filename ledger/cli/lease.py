"""`steptrail lease`: a workspace's epoch lease (acquire, heartbeat, release, show,
settle)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
import msgspec

from ledger.errors import CompensationConflict, Unsettled

from ._common import LedgerSubgroup, Refusal, _emit_json, _examples, _open, json_option
from ._format import _echo_compensation, _iso, _lease_state, _shown, compensation_json
from ._options import (
    CLI_LEASE_TTL,
    DURATION,
    _need_epoch,
    _workspace,
    epoch_option,
    workspace_option,
)

if TYPE_CHECKING:
    from ledger import Lease


def lease_json(lease: Lease, now_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(lease)
    out["expires"] = _iso(lease.expires_ns) if lease.epoch else None
    out["remaining_s"] = max(0.0, (lease.expires_ns - now_ns) / 1e9) if lease.live else 0.0
    return out


def _lease_line(lease: Lease) -> str:
    if lease.epoch == 0:
        return f"workspace {lease.workspace}: never leased"
    return (f"workspace {lease.workspace}: epoch {lease.epoch} held by {lease.holder},"
            f" {_lease_state(lease.live, lease.released, lease.expires_ns)}")


@click.group("lease", cls=LedgerSubgroup)
def lease() -> None:
    """Acquire, keep alive, release and inspect a workspace's epoch lease.

    A lease is the live epoch of a workspace: every effect of a step that writes the
    workspace carries its epoch and is refused unless it is the live one. Acquiring a
    new epoch first settles (compensates) the older epochs' unfinished attempts.

    \b
        EPOCH=$(steptrail --workspace w lease acquire --holder agent-1 --ttl 10m --json | jq .epoch)
        steptrail --workspace w lease heartbeat --epoch "$EPOCH" --ttl 10m
        steptrail --workspace w lease release --epoch "$EPOCH"
    """


@lease.command("acquire", epilog=_examples(
    "steptrail --workspace w lease acquire --holder agent-1 --ttl 10m",
    "steptrail lease acquire --workspace w --holder agent-2 --force --json",
))
@workspace_option
@click.option("--holder", required=True, metavar="NAME", help="Who holds the lease (shown to others).")
@click.option("--ttl", type=DURATION, default=CLI_LEASE_TTL, show_default=True,
              help="How long the lease lives without a heartbeat: 60s, 10m, 24h (at most 7d)."
                   f" The default, {CLI_LEASE_TTL}, leaves a person typing commands time; the"
                   " library's ledger.workspaces.acquire defaults to 60s (a harness heartbeats).")
@click.option("--force", is_flag=True, help="Take over even while another lease is live (its epoch dies now).")
@click.option("--resume", is_flag=True, help="Take back a live lease this --holder still holds"
              " (this agent's earlier run, which died): a new epoch that settles what it left"
              " unfinished. Another holder's live lease is still refused.")
@click.option("--observe/--no-observe", default=True, show_default=True,
              help="Once settled, record the edits made outside the steps while nobody held"
              " the workspace (steptrail observe, asked by lease:HOLDER): the new holder"
              " starts from a history that has them. Costs a stat walk of the tree (about"
              " 0.1 s for 10,000 files when nothing changed); the first one reads and stores"
              " every file (the baseline). A write planned on a read made before is carried"
              " over what only observations recorded.")
@json_option
@click.pass_context
def lease_acquire(ctx: click.Context, ws_name: str | None, holder: str, ttl: float, force: bool,
                  resume: bool, observe: bool, as_json: bool) -> None:
    """Start a new epoch on the workspace and print it; settle older epochs first.

    Refused (exit 1) while another lease is live, unless --force (or --resume, when
    that lease is this --holder's: a restart after a crash). Every attempt of an
    older epoch still in flight is compensated before this returns (listed as settled).
    Exit 1 as `lease settle` when settling left a path for a human (a conflict) or could
    not settle a step: the lease is acquired all the same, its epoch printed.
    """
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.acquire(name, holder, ttl, force=force, resume=resume,
                                        observe=observe)
        now = ledger.clock()
    document = lease_json(got, now)
    if not as_json:
        click.echo(f"epoch {got.epoch}: workspace {name} leased by {holder} until"
                   f" {_iso(got.expires_ns)}")
        if got.settled:
            click.echo(f"settled (compensated) older epochs' steps: {', '.join(got.settled)}")
        if got.observed:
            click.echo(f"observed {got.observed_changes} edit(s) made outside the steps:"
                       f" {', '.join(got.observed)}")
        elif observe and got.observe_error is None:
            click.echo("observed: nothing changed outside the steps")
        for left in got.not_captured[:20]:
            click.echo(f"not captured: {_shown(left)}")
        if len(got.not_captured) > 20:
            click.echo(f"not captured: … and {len(got.not_captured) - 20} more")
    if got.observe_error is not None:
        click.echo(f"steptrail: the lease is held (epoch {got.epoch}), but observing the"
                   f" workspace failed ({_shown(got.observe_error)}); the edits made"
                   " meanwhile are recorded by the next look: steptrail observe --epoch"
                   f" {got.epoch}", err=True)
    # the lease is acquired all the same: the error says so, and --json prints its document
    held = f"the lease is held (epoch {got.epoch})"
    if got.unsettled:
        raise Refusal(Unsettled(name, list(got.unsettled)), document if as_json else None,
                      f"{held}; settle them with 'steptrail lease settle --epoch {got.epoch}'"
                      " before new work")
    if got.conflicts:
        raise Refusal(CompensationConflict([f"{c.step}:{c.path}" for c in got.conflicts]),
                      document if as_json else None, f"{held}")
    if as_json:
        _emit_json(document)


@lease.command("heartbeat", epilog=_examples(
    "steptrail --workspace w lease heartbeat --epoch 3 --ttl 10m"))
@workspace_option
@epoch_option("The live epoch to extend.")
@click.option("--ttl", type=DURATION, default=CLI_LEASE_TTL, show_default=True,
              help="Extend the lease to now + TTL (never shortens it). The default is"
                   f" {CLI_LEASE_TTL}, as for 'lease acquire' (the library's: 60s).")
@json_option
@click.pass_context
def lease_heartbeat(ctx: click.Context, ws_name: str | None, epoch: int | None, ttl: float,
                    as_json: bool) -> None:
    """Extend the live lease; an expired one is never revived (exit 1: acquire anew)."""
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "a heartbeat")
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.heartbeat(name, epoch, ttl)
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now))
    else:
        click.echo(_lease_line(got))


@lease.command("release", epilog=_examples("steptrail --workspace w lease release --epoch 3"))
@workspace_option
@epoch_option("The epoch to give up.")
@json_option
@click.pass_context
def lease_release(ctx: click.Context, ws_name: str | None, epoch: int | None, as_json: bool) -> None:
    """Give the lease up so the next acquire needs no --force (idempotent)."""
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "a release")
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.release(name, epoch)
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now))
    else:
        click.echo(_lease_line(got))


@lease.command("show", epilog=_examples("steptrail --workspace w lease show",
                                        "steptrail lease show --workspace w --json"))
@workspace_option
@json_option
@click.pass_context
def lease_show(ctx: click.Context, ws_name: str | None, as_json: bool) -> None:
    """Show the workspace's lease: epoch, holder, expiry, live or not. Read-only."""
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        got = ledger.workspaces.lease(name)
        unsettled = ledger.workspaces.unsettled(name, got.epoch) if got.epoch else []
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now) | {"unsettled": unsettled})
        return
    click.echo(_lease_line(got))
    if unsettled:
        click.echo(f"unsettled (older epochs, in flight): {', '.join(unsettled)};"
                   f" run 'steptrail lease settle --epoch {got.epoch}'")


@lease.command("settle", epilog=_examples("steptrail --workspace w lease settle --epoch 4 --json"))
@workspace_option
@epoch_option("The live epoch that settles the older ones.")
@json_option
@click.pass_context
def lease_settle(ctx: click.Context, ws_name: str | None, epoch: int | None, as_json: bool) -> None:
    """Compensate every attempt of an older epoch still in flight, under the live epoch.

    `lease acquire` does this itself; run it when an apply answers Unsettled. Exit 1
    when a path conflicts (it was changed since: nothing was overwritten, a human decides).
    """
    from ledger import settle_conflicts

    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "settling")
    with _open(ctx, readonly=False) as ledger:
        done = ledger.workspaces.settle(name, epoch)
    conflicts = [f"{c.step}:{r.path}" for c in done for r in c.conflicts]
    document = {"workspace": name, "epoch": epoch,
                "settled": [compensation_json(c) for c in done],
                "conflicts": msgspec.to_builtins(settle_conflicts(done))}
    if not as_json:
        if not done:
            click.echo(f"workspace {name}: nothing to settle")
        for c in done:
            _echo_compensation(c)
    if conflicts:
        raise Refusal(CompensationConflict(conflicts), document if as_json else None)
    if as_json:
        _emit_json(document)

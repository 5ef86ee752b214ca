"""`steptrail workspace`: register and inspect workspaces (add, list, show, read,
snapshot)."""

from __future__ import annotations

import base64
import sys
from typing import TYPE_CHECKING, Any

import click

from ._common import LedgerSubgroup, _emit_json, _examples, _open, json_option
from ._format import _iso, _lease_state
from ._options import _workspace, workspace_option

if TYPE_CHECKING:
    from ledger import FileRead, WsRow


def workspace_json(row: WsRow, now_ns: int) -> dict[str, Any]:
    return {
        "name": row.name, "root": row.root, "rev": row.rev, "epoch": row.epoch,
        "holder": row.holder, "expires_ns": row.expires_ns,
        "expires": _iso(row.expires_ns) if row.epoch else None,
        "released": row.released, "live": row.live_epoch(now_ns) is not None,
        "acquired_ns": row.acquired_ns, "last_seq": row.last_seq,
    }


@click.group("workspace", cls=LedgerSubgroup)
def workspace() -> None:
    """Register and inspect workspaces: named directories that steps write to.

    \b
        steptrail workspace add w ./repo
        steptrail workspace show w --json
        steptrail --workspace w workspace read app.py   # the bytes; rev + pre_hash to plan with
    """


@workspace.command("add", epilog=_examples(
    "steptrail workspace add agent-1 ./checkout",
    "steptrail workspace add agent-1 ./checkout --json   # again: a no-op",
    "steptrail workspace add agent-1 ./moved-checkout --rebind   # it moved: re-register",
    "steptrail workspace add repo . --rebind   # in a copied project: write the copy",
    "steptrail workspace add dotfiles ~/dots --allow-git   # steps may write .git/",
))
@click.argument("name")
@click.argument("directory", metavar="DIR")
@click.option("--rebind", is_flag=True,
              help="Re-register an added workspace: at DIR (moved, or restored by other"
                   " means), with DIR's device and inode, these options and where the"
                   " ledger is now (a copied or moved project's ledger).")
@click.option("--allow-git", is_flag=True,
              help="Let steps write .git internals (hooks, config); refused by default.")
@json_option
@click.pass_context
def workspace_add(ctx: click.Context, name: str, directory: str, rebind: bool, allow_git: bool,
                  as_json: bool) -> None:
    """Register the existing directory DIR as workspace NAME (a no-op if it is already).

    DIR is recorded resolved, with its device and inode: a step's writes are refused
    when the directory there is no longer that one (swapped for a symlink, moved,
    replaced). So is where the ledger itself is: when the ledger travels with DIR (its
    .steptrail inside DIR) and is later found elsewhere — the project copied or moved
    with it — steps are refused (LedgerMoved) until --rebind records its new place. DIR may not overlap another workspace's directory, nor be the ledger's
    own directory; the ledger's directory may sit inside DIR (like .git in a repository:
    steps never write it).
    """
    with _open(ctx, readonly=False) as ledger:
        existing = next((r for r in ledger.workspaces.list() if r.name == name), None)
        before = ledger.workspaces.registration(name) if existing is not None else None
        row = ledger.workspaces.add(name, directory, allow_git=allow_git, rebind=rebind)
        after = ledger.workspaces.registration(name)
        now = ledger.clock()
    rebound = before is not None and after.seq != before.seq
    if as_json:
        _emit_json(workspace_json(row, now) | {"added": existing is None, "rebound": rebound,
                                               "allow_git": after.allow_git,
                                               "identity": after.identity is not None,
                                               "ledger_dir": after.ledger_dir})
    elif existing is None:
        click.echo(f"added workspace {row.name} at {row.root}")
    elif rebound:
        click.echo(f"re-registered workspace {row.name} at {row.root}")
    else:
        click.echo(f"workspace {row.name} at {row.root} already added; nothing changed")


@workspace.command("list", epilog=_examples("steptrail workspace list",
                                            "steptrail workspace list --json | jq '.[].name'"))
@json_option
@click.pass_context
def workspace_list(ctx: click.Context, as_json: bool) -> None:
    """List workspaces with their revision and lease. Read-only."""
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.workspaces.list()
        now = ledger.clock()
    if as_json:
        _emit_json([workspace_json(r, now) for r in rows])
        return
    if not rows:
        click.echo("no workspaces; add one with 'steptrail workspace add NAME DIR'", err=True)
        return
    click.echo(f"{'NAME':<24} {'REV':>6} {'EPOCH':>5} {'LEASE':<8} {'HOLDER':<20} ROOT")
    for r in rows:
        state = ("live" if r.live_epoch(now) is not None else "released" if r.released
                 else "expired" if r.epoch else "-")
        click.echo(f"{r.name:<24} {r.rev:>6} {r.epoch:>5} {state:<8} {r.holder or '-':<20} {r.root}")


@workspace.command("show", epilog=_examples("steptrail workspace show w",
                                            "steptrail --workspace w workspace show --json"))
@click.argument("name", required=False)
@json_option
@click.pass_context
def workspace_show(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """Show a workspace: revision, lease, and every path a step wrote. Read-only.

    NAME defaults to the global --workspace. Each path shows its rev (of its last
    applied write) and the sha256 of the content it should hold (null: absent).
    """
    name = _workspace(ctx, name)
    with _open(ctx, readonly=True) as ledger:
        row = ledger.workspaces.get(name)
        paths = ledger.workspaces.paths(name)
        unsettled = ledger.workspaces.unsettled(name, row.epoch) if row.epoch else []
        now = ledger.clock()
    data = workspace_json(row, now) | {
        "paths": [{"path": p, "rev": rev, "hash": h} for p, (rev, h) in paths.items()],
        "unsettled": unsettled,
    }
    if as_json:
        _emit_json(data)
        return
    click.echo(f"workspace {row.name} at {row.root}: rev {row.rev}")
    if row.epoch:
        click.echo(f"  lease: epoch {row.epoch} held by {row.holder},"
                   f" {_lease_state(data['live'], row.released, row.expires_ns)}")
    else:
        click.echo("  lease: never leased")
    if unsettled:
        click.echo(f"  unsettled (older epochs, in flight): {', '.join(unsettled)}")
    for p in data["paths"]:
        click.echo(f"  {p['rev']:>6}  {(p['hash'] or 'absent')[:16]:<16}  {p['path']}")


@workspace.command("read", epilog=_examples(
    "steptrail --workspace w workspace read app.py > app.py.seen   # rev, pre_hash: stderr",
    "steptrail workspace read app.py --workspace w --json | jq -r .pre_hash",
))
@click.argument("path", metavar="PATH")
@workspace_option
@json_option
@click.pass_context
def workspace_read(ctx: click.Context, path: str, ws_name: str | None, as_json: bool) -> None:
    """Read PATH as a planner must: its bytes, with their sha256 and the path's rev. Read-only.

    This is where a plan's pre_hash comes from: the hash of exactly the bytes the planner
    read, taken as it read them, and base_rev the rev read with them. A write planned
    from them is refused if anything (another step, a person's edit) changed the path
    after this read. The bytes go to stdout unchanged, and one line to stderr:
    '# rev N pre_hash HASH' ('pre_hash absent': no such file; plan it with
    "pre_hash": null). --json prints them in one object (content as text when it is
    UTF-8, else content_base64). Files up to 1 GiB.
    """
    from ledger.plans import INPUT_FILE_MAX

    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        got = ledger.workspaces.read_file(name, path, max_bytes=INPUT_FILE_MAX)
    if as_json:
        _emit_json(file_read_json(got))
        return
    if got.content is not None:
        sys.stdout.flush()
        sys.stdout.buffer.write(got.content)
        sys.stdout.buffer.flush()
    click.echo(f"# rev {got.rev} pre_hash {got.pre_hash or 'absent'}", err=True)


def file_read_json(got: FileRead) -> dict[str, Any]:
    """The `workspace read --json` document (docs/cli-json.md)."""
    out: dict[str, Any] = {"workspace": got.workspace, "path": got.path, "rev": got.rev,
                           "pre_hash": got.pre_hash, "exists": got.content is not None,
                           "size_bytes": None, "content": None}
    if got.content is not None:
        out["size_bytes"] = len(got.content)
        try:
            out["content"] = got.content.decode("utf-8")
        except UnicodeDecodeError:
            out["content_base64"] = base64.b64encode(got.content).decode("ascii")
    return out


@workspace.command("snapshot", epilog=_examples(
    "steptrail --workspace w workspace snapshot app.py src/util.py --json",
))
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@workspace_option
@json_option
@click.pass_context
def workspace_snapshot(ctx: click.Context, paths: tuple[str, ...], ws_name: str | None,
                       as_json: bool) -> None:
    """Each PATH's rev and the sha256 of what is on disk NOW. Read-only.

    Not a planner's pre_hash: it hashes the disk at this moment, not the bytes the
    planner read, so a person's edit made between the planner's read and this snapshot
    would be hashed in and applied over without a refusal. When planning, take rev and
    pre_hash from 'steptrail workspace read' (the bytes and their hash together). A
    snapshot answers "what is there now" (null: the file is absent).
    """
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        snaps = [(p, *ledger.workspaces.snapshot(name, p)) for p in paths]
    if as_json:
        _emit_json({"workspace": name, "paths": [
            {"path": p, "base_rev": rev, "pre_hash": h} for p, rev, h in snaps]})
        return
    for p, rev, h in snaps:
        click.echo(f"{rev:>6}  {h or 'absent':<64}  {p}")

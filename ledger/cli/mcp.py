"""`steptrail mcp`: the MCP server (the [mcp] extra)."""

from __future__ import annotations


import click

from ledger.errors import EXIT_USAGE

from ._common import LedgerCommand, _examples, _fail
from ._format import _shown
from ._options import Duration

#: The modules whose absence means the [mcp] extra is not installed.
_MCP_SDK_MODULES = ("mcp", "mcp_types", "pydantic", "anyio", "starlette", "uvicorn")


@click.command("mcp", cls=LedgerCommand, epilog=_examples(
    "steptrail mcp --workspace .                    # stdio: what an MCP client spawns",
    "steptrail mcp --workspace ~/src/app --workspace ~/src/lib",
    "steptrail --ledger /srv/ledger.db mcp --workspace app   # a registered NAME",
    "steptrail mcp --workspace . --http --port 8765  # streamable HTTP on 127.0.0.1",
    "steptrail mcp                                  # the client's roots are the workspaces",
))
@click.option("--workspace", "workspaces", multiple=True, metavar="DIR|NAME",
              help="A directory to serve (registered as a workspace under its base name if it"
              " is not one yet), or the NAME of a registered workspace; repeat it for several."
              " Relative paths in tool calls are inside the first. Default: the global"
              " --workspace; without either, the directories the client announces as its"
              " roots (stdio only).")
@click.option("--http", is_flag=True,
              help="Serve streamable HTTP (at /mcp) instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="The address --http binds: loopback only, unless --allow-remote.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True,
              help="The port --http binds.")
@click.option("--allow-remote", is_flag=True,
              help="Let --http bind a non-loopback address. The server has no authentication:"
              " only with something else guarding the port.")
@click.option("--lease-ttl", type=Duration(), default="20s", show_default=True,
              help="How long one write's lease lives without a heartbeat (at most 7d): how"
              " soon another server takes over from one that died on another machine.")
@click.option("--lease-wait", type=Duration(), default="30s", show_default=True,
              help="How long a write waits for another server's lease before it gives up.")
@click.option("--lease-linger", type=Duration(allow_zero=True), default="200ms",
              show_default=True,
              help="How long the server keeps the lease after a write for its next one,"
              " unless another server waits for it (0: release after every write).")
@click.option("--lease-turn", type=Duration(allow_zero=True), default="50ms",
              show_default=True,
              help="While another server waits for the workspace, how long this one keeps"
              " the lease for its own client's next calls (from when it took it, at most"
              " --lease-linger): fewer lease commits when agents share a workspace; each"
              " waits at most about a turn per server ahead of it. 0: hand the lease over"
              " after every call.")
@click.option("--observe/--no-observe", "observe_on_lease", default=True, show_default=True,
              help="Each time the server takes the workspace's lease anew, first record the"
              " edits made outside its writes meanwhile (a person's editor, a shell:"
              " steptrail observe), so history, rewind and undo have them. Costs a stat walk"
              " of the tree per lease taken (about 0.1 s for 10,000 files when nothing"
              " changed); the first reads and stores every file (the baseline). A client's"
              " write planned on a read made before is carried over what only observations"
              " recorded.")
@click.pass_context
def mcp(ctx: click.Context, workspaces: tuple[str, ...], http: bool, host: str, port: int,
        allow_remote: bool, lease_ttl: float, lease_wait: float, lease_linger: float,
        lease_turn: float, observe_on_lease: bool) -> None:
    """Serve workspace files to an MCP client: fenced, journaled, undoable writes.

    An MCP server (the official SDK) with the reference filesystem server's tools
    (read_text_file, write_file, edit_file, move_file, ...) and history, undo, status
    and audit. Every write is a steptrail step fenced on what the client read; a
    stale write is a conflict with a diff, never an overwrite. Without --ledger the
    ledger is the first directory's .steptrail/ledger.db, created if absent. Without
    --workspace, the directories the client announces as its roots (MCP roots) are
    served, as if each were given as --workspace, in the client's order. Needs the
    extra (the error names the install command for this installation). See docs/mcp.md.
    """
    try:
        from ledger.mcp import serve
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _MCP_SDK_MODULES:
            raise
        from ledger.extras import install_hint

        _fail(ctx, f"the MCP SDK is not installed (no module {exc.name!r}); install the"
              f" extra: {install_hint('mcp')}", EXIT_USAGE, "MissingExtra",
              {"extra": "mcp", "module": exc.name})
    specs = list(workspaces) or ([ctx.obj["workspace"]] if ctx.obj.get("workspace") else [])
    if not specs and http:
        raise click.UsageError("--http needs the workspace to serve: --workspace DIR (the"
                               " client's roots are served over stdio only)", ctx=ctx)
    for name, value in (("--lease-ttl", lease_ttl), ("--lease-wait", lease_wait),
                        ("--lease-linger", lease_linger), ("--lease-turn", lease_turn)):
        if value > 7 * 24 * 3600:
            raise click.UsageError(f"{name} must be at most 7d", ctx=ctx)
    if lease_linger >= lease_ttl / 2:
        raise click.UsageError("--lease-linger must be less than half of --lease-ttl", ctx=ctx)
    root = ctx.find_root()
    given = root.get_parameter_source("ledger_path") not in (
        None, click.core.ParameterSource.DEFAULT)
    serve(specs, ledger_path=ctx.obj["ledger_path"] if given else None,
          witness=ctx.obj.get("witness"), http=http, host=host, port=port,
          allow_remote=allow_remote, lease_ttl_s=lease_ttl, lease_wait_s=lease_wait,
          lease_linger_s=lease_linger, lease_turn_s=lease_turn,
          observe_on_lease=observe_on_lease, echo=lambda line: click.echo(_shown(line), err=True),
          on_stage=ctx.obj.get("on_stage"))

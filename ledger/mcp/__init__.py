"""`steptrail mcp`: fenced, journaled, undoable file tools for any MCP client.

An optional integration (the ``mcp`` extra: the official MCP SDK 2.x);
the core never imports it. `ledger.mcp.service` holds the tools on the ledger's public
API (no SDK), `ledger.mcp.server` the MCP server around them, `ledger.workspace.confined` the
confined directory walks, `ledger.mcp.edits` the text edits and diffs. See docs/mcp.md.

`serve`, the server's entry point (what `steptrail mcp` runs), is imported from
`ledger.mcp.server` on first use: without the extra, importing it raises
`ModuleNotFoundError` naming the missing module and the command that installs the extra
for this installation (`ledger.extras.install_hint`).
"""

from typing import TYPE_CHECKING

from .service import ClientView, FileTools, Limits, Result, ToolFailure

if TYPE_CHECKING:
    from .server import serve


def __getattr__(name: str) -> object:
    if name == "serve":
        try:
            from .server import serve
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "mcp":
                raise
            from ..extras import missing_extra

            raise ModuleNotFoundError(missing_extra("mcp", exc.name), name=exc.name) from None
        return serve
    raise AttributeError(f"module 'ledger.mcp' has no attribute {name!r}")


__all__ = ["ClientView", "FileTools", "Limits", "Result", "ToolFailure", "serve"]

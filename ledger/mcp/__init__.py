"""`steptrail mcp`: fenced, journaled, undoable file tools for any MCP client.

An optional integration (``pip install 'steptrail[mcp]'``, the official MCP SDK 2.x);
the core never imports it. `ledger.mcp.service` holds the tools on the ledger's public
API (no SDK), `ledger.mcp.server` the MCP server around them, `ledger.workspace.confined` the
confined directory walks, `ledger.mcp.edits` the text edits and diffs. See docs/mcp.md.

`serve`, the server's entry point (what `steptrail mcp` runs), is imported from
`ledger.mcp.server` on first use: without the extra, importing it raises the SDK's
ImportError (`ModuleNotFoundError` naming the missing module).
"""

from typing import TYPE_CHECKING

from .service import ClientView, FileTools, Limits, Result, ToolFailure

if TYPE_CHECKING:
    from .server import serve


def __getattr__(name: str) -> object:
    if name == "serve":
        from .server import serve

        return serve
    raise AttributeError(f"module 'ledger.mcp' has no attribute {name!r}")


__all__ = ["ClientView", "FileTools", "Limits", "Result", "ToolFailure", "serve"]

"""`steptrail mcp`: fenced, journaled, undoable file tools for any MCP client.

An optional integration (``pip install 'steptrail[mcp]'``, the official MCP SDK 2.x);
the core never imports it. `ledger.mcp.service` holds the tools on the ledger's public
API (no SDK), `ledger.mcp.server` the MCP server around them, `ledger.workspace.confined` the
confined directory walks, `ledger.mcp.edits` the text edits and diffs. See docs/mcp.md.
"""

from .service import ClientView, FileTools, Limits, Result, ToolFailure

__all__ = ["ClientView", "FileTools", "Limits", "Result", "ToolFailure"]

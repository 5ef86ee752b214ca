"""How to install an optional extra from where steptrail itself was installed.

The package is not on an index yet: ``pip install 'steptrail[mcp]'`` fails for a user
who installed from a clone or a wheel. A missing extra's message names the command that
works for this installation, read from the installer's record (PEP 610's
``direct_url.json``): a clone (editable or not) -> ``pip install -e '/path/clone[mcp]'``;
a wheel or sdist file -> ``pip install 'steptrail[mcp] @ file:///path/steptrail.whl'``;
an index -> ``pip install 'steptrail[mcp]'``.

>>> install_hint("mcp").startswith("pip install")
True
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import urllib.parse

#: The extras and the modules whose absence each one explains.
EXTRAS = {
    "mcp": ("mcp",),
    "ui": ("jinja2", "starlette", "uvicorn"),
    "postgres": ("psycopg", "psycopg_binary"),
    "langgraph": ("langgraph", "langchain_core"),
}


def install_hint(extra: str) -> str:
    """The pip command that installs `extra` into the environment steptrail runs in."""
    try:
        raw = importlib.metadata.distribution("steptrail").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        raw = None
    if raw:
        try:
            info = json.loads(raw)
        except ValueError:
            info = {}
        url = str(info.get("url", ""))
        if url.startswith("file://"):
            path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
            if os.path.isdir(path):
                editable = bool(info.get("dir_info", {}).get("editable"))
                return f"pip install {'-e ' if editable else ''}'{path}[{extra}]'"
            return f"pip install 'steptrail[{extra}] @ {url}'"
    return f"pip install 'steptrail[{extra}]'"


def missing_extra(extra: str, module: str | None = None) -> str:
    """One line: what is missing and the command that installs it."""
    what = f" (no module {module!r})" if module else ""
    return f"this needs the {extra!r} extra{what}; install it: {install_hint(extra)}"


__all__ = ["EXTRAS", "install_hint", "missing_extra"]

"""`steptrail ui`: a read-only web view of one ledger, on loopback, behind a token.

    from ledger.ui import serve
    serve(".steptrail/ledger.db", port=8766, open_browser=False)

Pages (server-rendered HTML, Jinja with autoescape, one small static script that
follows the head): the ledger at a glance; a run's or a workspace's timeline of
steps; a step's events with each write's diff, refusals and artifacts (downloads are
attachments, never rendered); a path's history and a workspace as of any step; the
stats as inline SVG charts. The security model — loopback only, a token, read-only, a
strict Content-Security-Policy — is docs/ui.md's. Needs the extra:
``pip install 'steptrail[ui]'``.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import sys
import threading
import webbrowser
from collections.abc import Callable
from typing import Any, Final

from ledger.errors import EnvironmentFailure, InvalidInput

#: The only address the UI binds.
LOOPBACK: Final = "127.0.0.1"
#: The port `steptrail ui` serves on unless told (0: any free one).
DEFAULT_PORT: Final = 8766


def new_token() -> str:
    """A fresh random token for the URL (like Jupyter's)."""
    return secrets.token_urlsafe(32)


def check_host(host: str) -> str:
    """`host` if it is the loopback address the UI binds; InvalidInput otherwise."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host != LOOPBACK or ip is None:
        raise InvalidInput(f"the UI binds {LOOPBACK} only, not {host!r}: it serves a ledger's"
                           " contents; reach it from elsewhere through an SSH tunnel"
                           f" (ssh -L PORT:{LOOPBACK}:PORT host)")
    return host


def bind(port: int, host: str = LOOPBACK) -> socket.socket:
    """A listening socket on loopback `port` (0: a free one); EnvironmentFailure if
    the port is taken."""
    check_host(host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EnvironmentFailure(f"cannot listen on {host}:{port}: {exc.strerror or exc};"
                                 " pick another with --port (0: any free port)") from None
    sock.listen(128)
    return sock


def create_app(location: str, *, token: str, port: int, verify: bool = True,
               shown: str | None = None) -> Any:
    """The ASGI application (see `ledger.ui.app.create_app`)."""
    from .app import create_app as make

    return make(location, token=token, port=port, verify=verify, shown=shown)


def serve(location: str, *, port: int = DEFAULT_PORT, host: str = LOOPBACK,
          open_browser: bool = True, token: str | None = None,
          echo: Callable[[str], None] = print, on_ready: Callable[[str], None] | None = None,
          ) -> None:
    """Serve the ledger at `location` read-only on ``http://127.0.0.1:PORT`` until
    interrupted; `echo` gets the URL to open (it carries the token)."""
    import uvicorn

    from ledger import shown_location

    check_host(host)
    token = token or new_token()
    sock = bind(port, host)
    port = sock.getsockname()[1]
    app = create_app(location, token=token, port=port, shown=shown_location(location))
    url = f"http://{host}:{port}/?token={token}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            server_header=False, date_header=False)
    server = uvicorn.Server(config)
    echo(f"steptrail ui: serving {shown_location(location)} read-only at")
    echo(f"    {url}")
    echo("(loopback only; the token is the key: do not share the URL. Ctrl-C stops it.)")
    if on_ready is not None:
        on_ready(url)
    if open_browser:
        threading.Timer(0.5, lambda: webbrowser.open(url)).start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        sys.stdout.flush()


__all__ = ["DEFAULT_PORT", "LOOPBACK", "bind", "check_host", "create_app", "new_token", "serve"]

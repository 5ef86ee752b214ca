"""`steptrail ui`: a read-only web view of one ledger, on loopback, behind a token.

    from ledger.ui import serve
    serve(".steptrail/ledger.db", port=8766, open_browser=False)

Pages (server-rendered HTML, Jinja with autoescape, one small static script that
follows the head): the ledger at a glance; a run's or a workspace's timeline of
steps; a workspace through time — its steps and observations, what a rewind to any of
them would change (a preview: the UI never rewinds), a fork's lineage; a step's events
with each write's diff, refusals and artifacts (downloads are attachments, never
rendered); the holds in force; a path's history and a workspace as of any step; the
stats as inline SVG charts. The security model — loopback only, a token, read-only, a
strict Content-Security-Policy — is docs/ui.md's. Needs the ``ui`` extra (`steptrail
ui` names the install command for this installation: `ledger.extras.install_hint`).
"""

from __future__ import annotations

import html
import ipaddress
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import webbrowser
from collections.abc import Callable
from pathlib import Path
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
    # a port whose last server just stopped (its connections in TIME_WAIT) is free to
    # serve again at once; one another process listens on is still refused
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EnvironmentFailure(f"cannot listen on {host}:{port}: {exc.strerror or exc};"
                                 " pick another with --port (0: any free port)") from None
    sock.listen(128)
    return sock


def create_app(location: str, *, token: str, port: int, verify: bool = True,
               shown: str | None = None, prefix: str | None = None,
               immutable: bool = False) -> Any:
    """The ASGI application (see `ledger.ui.app.create_app`)."""
    from .app import create_app as make

    return make(location, token=token, port=port, verify=verify, shown=shown, prefix=prefix,
                immutable=immutable)


#: The local page the browser is opened on: it sends the browser on to the URL (a
#: meta refresh, and a link should that not happen). A file, not our server's page:
#: the server's CSP does not apply to it, and none is needed (no script).
_LAUNCHER: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0;url={url}">
<title>steptrail ui</title>
</head>
<body>
<p>Opening steptrail ui&hellip; if nothing happens, <a href="{url}">follow this link</a>.</p>
</body>
</html>
"""


def write_launcher(url: str) -> tuple[str, str]:
    """A page that opens `url` (it carries the token), for the browser to be launched
    on instead of the URL itself — a command line is visible to every local user (ps,
    /proc/PID/cmdline); a file in a private directory is not. Like Jupyter's. Returns
    (the directory, mode 0700 — remove it when done; the page's ``file://`` URL)."""
    folder = tempfile.mkdtemp(prefix="steptrail-ui-")  # 0700, ours
    try:
        path = os.path.join(folder, "open.html")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_LAUNCHER.format(url=html.escape(url, quote=True)))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, Path(path).as_uri()


def serve(location: str, *, port: int = DEFAULT_PORT, host: str = LOOPBACK,
          open_browser: bool = True, token: str | None = None,
          echo: Callable[[str], None] = print, on_ready: Callable[[str], None] | None = None,
          immutable: bool = False) -> None:
    """Serve the ledger at `location` read-only on ``http://127.0.0.1:PORT`` until
    interrupted; `echo` gets the URL to open (it carries the token). With
    `open_browser`, the browser is launched on a private local page that forwards to
    the URL (`write_launcher`: never the token on a command line), removed on exit."""
    import uvicorn

    from ledger import shown_location

    check_host(host)
    token = token or new_token()
    sock = bind(port, host)
    port = sock.getsockname()[1]
    app = create_app(location, token=token, port=port, shown=shown_location(location),
                     immutable=immutable)
    url = f"http://{host}:{port}/?token={token}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            server_header=False, date_header=False)
    server = uvicorn.Server(config)
    echo(f"steptrail ui: serving {shown_location(location)} read-only at")
    echo(f"    {url}")
    echo("(loopback only; the token is the key: do not share the URL. Ctrl-C stops it.)")
    if on_ready is not None:
        on_ready(url)
    launcher: str | None = None
    timer: threading.Timer | None = None
    try:
        if open_browser:
            launcher, page = write_launcher(url)
            timer = threading.Timer(0.5, lambda: webbrowser.open(page))
            timer.daemon = True
            timer.start()
        server.run(sockets=[sock])
    finally:
        if timer is not None:
            timer.cancel()
        if launcher is not None:
            shutil.rmtree(launcher, ignore_errors=True)
        sock.close()
        sys.stdout.flush()


__all__ = ["DEFAULT_PORT", "LOOPBACK", "bind", "check_host", "create_app", "new_token", "serve",
           "write_launcher"]

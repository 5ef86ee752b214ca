"""`steptrail ui`: a read-only web view of the ledger (the [ui] extra)."""

from __future__ import annotations

import functools

import click

from ledger.errors import EXIT_USAGE

from ._common import LedgerCommand, _examples, _fail

#: The modules whose absence means the [ui] extra is not installed.
_UI_MODULES = ("starlette", "uvicorn", "jinja2", "markupsafe", "anyio")


@click.command("ui", cls=LedgerCommand, epilog=_examples(
    "steptrail ui                                   # opens the browser on the URL it prints",
    "steptrail ui --port 9000 --no-browser          # print the URL only (e.g. over ssh -L)",
    "steptrail --ledger postgresql://me@db/ledger ui",
    "steptrail ui --port 0                          # any free port",
))
@click.option("--port", type=click.IntRange(0, 65535), default=8766, show_default=True,
              help="The port to serve on, on 127.0.0.1 (0: any free port).")
@click.option("--no-browser", is_flag=True, help="Do not open a browser; print the URL only.")
@click.option("--immutable", is_flag=True,
              help="For a ledger nobody writes (a forensic copy): read it with SQLite's"
                   " immutable flag, so not one byte of its directory changes (no -wal or"
                   " -shm is created). Refused while a -wal holds commits; pages fail if a"
                   " writer appears. Without it, reading creates SQLite's -wal and -shm"
                   " beside the file (never changing the ledger itself).")
@click.pass_context
def ui(ctx: click.Context, port: int, no_browser: bool, immutable: bool) -> None:
    """Browse the ledger in a web browser, read-only, while agents write it.

    Serves the ledger (a file or a postgresql:// URL) on 127.0.0.1 only, behind a
    random token carried by the URL it prints: the ledger at a glance (workspaces,
    leases and epochs, steps by state, steps in flight, verify, audit and GC), a run's
    or a workspace's timeline, each step's events with its writes' diffs, refusals
    and artifacts, a path's history and a workspace as of any step, and the stats as
    charts. Open pages follow new events by themselves. It opens the ledger
    read-only: it never writes it, never takes its write lock, never blocks a
    writer. Verify runs once in the background; a ledger that fails it still opens,
    with a banner naming the findings. Ctrl-C stops it. Needs the extra:
    the ui extra (the error names the install command for this installation). See
    docs/ui.md.
    """
    try:
        from ledger.ui import serve
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _UI_MODULES:
            raise
        from ledger.extras import install_hint

        _fail(ctx, f"the UI's packages are not installed (no module {exc.name!r}); install"
              f" the extra: {install_hint('ui')}", EXIT_USAGE, "MissingExtra",
              {"extra": "ui", "module": exc.name})
    serve(ctx.obj["ledger_path"], port=port, open_browser=not no_browser,
          echo=functools.partial(click.echo, err=False), immutable=immutable)

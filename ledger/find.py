"""Finding the default ledger as git finds ``.git``: from the working directory upward.

A command run anywhere inside a project uses the project's ledger, the nearest
``DIR/.steptrail/ledger.db`` at or above the directory it runs in — the way `git`
finds the repository from a subdirectory. Without this, a command in ``proj/src``
reported "no ledger" and its advice (``init``) made a second ledger nested in the
project.

The search stops, as git's does:

- at a file-system boundary (a mount point: the parent is on another device), unless
  ``STEPTRAIL_DISCOVERY_ACROSS_FILESYSTEM=1``;
- before any directory listed in ``STEPTRAIL_CEILING_DIRECTORIES`` (absolute paths
  separated by ``:``): neither it nor anything above it is looked in — for a home
  directory on a slow network mount, or to keep a shared parent's ledger out of reach.

A ledger found this way is used only when it is this user's: its ``.steptrail``
directory and its file owned by the effective user (or, under ``sudo``, by the user who
ran it). Another user's is refused (`ForeignLedger`), never used: one planted in ``/tmp``
or a shared directory would otherwise take every command run below it, as a ``.git``
planted there took git's before git refused them.

An explicit ``--ledger``, ``STEPTRAIL_LEDGER`` or a path given to `Ledger.open` is used
as given: no search, no ownership check.

>>> import os
>>> from pathlib import Path
>>> from ledger import Ledger
>>> Ledger.init(".steptrail/ledger.db").close()
>>> Path("src/deeper").mkdir(parents=True)
>>> os.chdir("src/deeper")
>>> found = find_ledger()
>>> os.path.relpath(found, "../..")
'.steptrail/ledger.db'
>>> os.chdir("../..")
"""

from __future__ import annotations

import os
from typing import Final

#: The default layout: the ledger in a project's own ``.steptrail`` directory.
LEDGER_DIR: Final = ".steptrail"
LEDGER_FILE: Final = "ledger.db"
#: Absolute directories the upward search never enters (``:``-separated), as git's
#: ``GIT_CEILING_DIRECTORIES``.
ENV_CEILINGS: Final = "STEPTRAIL_CEILING_DIRECTORIES"
#: ``1``: the search crosses file-system boundaries (mount points) too.
ENV_ACROSS: Final = "STEPTRAIL_DISCOVERY_ACROSS_FILESYSTEM"


def ceilings(environ: os._Environ[str] | dict[str, str] | None = None) -> frozenset[str]:
    """The ceiling directories from the environment (absolute, normalized; relative
    entries are ignored, as git ignores them)."""
    env = os.environ if environ is None else environ
    out = set()
    for part in env.get(ENV_CEILINGS, "").split(":"):
        if part and os.path.isabs(part):
            out.add(os.path.normpath(part))
            real = os.path.realpath(part)
            out.add(real)
    return frozenset(out)


def find_ledger(start: str | os.PathLike[str] | None = None, *,
                environ: dict[str, str] | None = None) -> str | None:
    """The absolute path of the nearest ``DIR/.steptrail/ledger.db`` at or above `start`
    (default: the working directory), or None when there is none before the root, a
    file-system boundary or a ceiling directory (see the module). `ForeignLedger` when
    the nearest one is another user's; InvalidInput when the working directory (no
    `start`) was removed.""" 
    env = os.environ if environ is None else environ
    across = env.get(ENV_ACROSS, "") not in ("", "0")
    stop = ceilings(env)
    here = os.path.abspath(os.fspath(start)) if start is not None else working_directory()
    try:
        dev = os.stat(here).st_dev
    except OSError:
        return None
    while True:
        if here in stop or os.path.realpath(here) in stop:
            return None
        candidate = os.path.join(here, LEDGER_DIR, LEDGER_FILE)
        if os.path.isfile(candidate):
            _check_yours(candidate, env)
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        try:
            parent_dev = os.stat(parent).st_dev
        except OSError:
            return None
        if parent_dev != dev and not across:
            return None
        here = parent


def working_directory() -> str:
    """The working directory; InvalidInput when it was removed (deleted, or moved away
    under this process): no ledger can be found from it nor made in it, and a retry
    does not help — run from a directory that exists."""
    try:
        return os.getcwd()
    except OSError as exc:
        from .errors import InvalidInput

        fact = (f"the working directory is gone ({exc.strerror}: it was removed or moved"
                " away while this process ran in it); no ledger can be found from it or made"
                " in it.")
        err = InvalidInput(f"{fact} os.chdir() to a directory that exists, or open the"
                           " ledger by its absolute path: Ledger.open('/abs/.steptrail/"
                           "ledger.db')")
        err.cli_message = (f"{fact} cd to a directory that exists, or name the ledger:"
                           " --ledger /abs/.steptrail/ledger.db")
        raise err from None


def yours(environ: os._Environ[str] | dict[str, str] | None = None) -> frozenset[int]:
    """The owners a found ledger may have: this process's effective user; under
    ``sudo``, also the user who ran it (``SUDO_UID``), as git allows."""
    env = os.environ if environ is None else environ
    out = {os.geteuid()}
    sudo = env.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit():
        out.add(int(sudo))
    return frozenset(out)


def _check_yours(candidate: str, env: os._Environ[str] | dict[str, str]) -> None:
    """Refuse (`ForeignLedger`) a found ledger whose directory or file (the entries
    themselves, a symlink not followed) belongs to another user."""
    from .errors import ForeignLedger

    allowed = yours(env)
    for entry in (os.path.dirname(candidate), candidate):
        try:
            uid = os.lstat(entry).st_uid
        except OSError:
            return  # (gone since: the open that follows says what is there)
        if uid not in allowed:
            try:
                import pwd

                owner = pwd.getpwuid(uid).pw_name
            except (KeyError, ImportError):
                owner = f"user {uid}"
            raise ForeignLedger(candidate, entry, uid, owner)


_GITIGNORE: Final = b"# Made by steptrail: its ledger's directory is not for git.\n*\n"


def ignore_in_git(directory: str) -> bool:
    """Give a ledger's own directory (one named ``.steptrail``) a ``.gitignore`` holding
    ``*`` — as Python's venv does — so that `git status` does not offer the ledger, its
    blobs and side files for a commit. Made only where a ledger is created (init, a
    copy, a restore), never over an existing file; any other directory (a ledger at
    ``./ledger.db`` lives beside other files) is left alone. Best effort: True when
    written."""
    if os.path.basename(os.path.normpath(directory)) != LEDGER_DIR:
        return False
    try:
        fd = os.open(os.path.join(directory, ".gitignore"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)  # (private, as everything in a ledger's directory)
    except OSError:
        return False
    try:
        os.write(fd, _GITIGNORE)
    finally:
        os.close(fd)
    return True


__all__ = ["ENV_ACROSS", "ENV_CEILINGS", "LEDGER_DIR", "LEDGER_FILE", "ceilings",
           "find_ledger", "ignore_in_git", "working_directory", "yours"]

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
import stat
from typing import Final, NamedTuple

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
    (default: the working directory) — or of the ledger a fork's directory names there
    (``.steptrail/root``: `find_pointer`) — or None when there is none before the root,
    a file-system boundary or a ceiling directory (see the module). `ForeignLedger` when
    the nearest one is another user's; InvalidInput when the working directory (no
    `start`) was removed, or for a pointer `read_pointer` refuses (a copy's)."""
    found = find_place(start, environ=environ)
    return None if found is None else found[0]


def find_pointer(start: str | os.PathLike[str] | None = None, *,
                 environ: dict[str, str] | None = None) -> Pointer | None:
    """The `Pointer` of the fork's directory the search found (None: it found a ledger
    file, or nothing); raises as `find_ledger`."""
    found = find_place(start, environ=environ)
    return None if found is None else found[1]


def find_place(start: str | os.PathLike[str] | None = None, *,
               environ: dict[str, str] | None = None) -> tuple[str, Pointer | None] | None:
    """(the ledger's path, the pointer that named it or None) of the nearest ledger, or
    of the nearest fork's directory naming one; None: none (see `find_ledger`)."""
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
            return candidate, None
        if os.path.lexists(os.path.join(here, LEDGER_DIR, POINTER_FILE)):
            pointer = read_pointer(here, env)
            return pointer.ledger, pointer
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


#: In a fork's directory (`Workspaces.fork`), in place of a ledger: which ledger it is a
#: root of, and as which workspace (`Pointer`).
POINTER_FILE: Final = "root"
POINTER_FORMAT: Final = "steptrail-root/1"
_POINTER_MAX: Final = 8192


class Pointer(NamedTuple):
    """A directory that is a root of a ledger kept elsewhere — a fork's: `ledger` (its
    absolute path) holds it as workspace `workspace`."""

    directory: str
    ledger: str
    workspace: str


def write_pointer(directory: str, ledger: str, workspace: str) -> str:
    """Record in `directory` (a fork's, just made) that it is workspace `workspace` of the
    ledger at `ledger`: ``DIR/.steptrail/root``, written whole (a temporary, fsynced,
    renamed, the directory fsynced), with the directory's identity, so that a copy of
    the directory is told apart from it. Its path."""
    import json

    meta = os.path.join(directory, LEDGER_DIR)
    os.makedirs(meta, mode=0o700, exist_ok=True)
    ignore_in_git(meta)
    st = os.stat(directory)
    doc = json.dumps({"format": POINTER_FORMAT, "ledger": os.path.abspath(ledger),
                      "workspace": workspace, "dev": st.st_dev, "ino": st.st_ino},
                     sort_keys=True).encode() + b"\n"
    final = os.path.join(meta, POINTER_FILE)
    tmp = f"{final}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, doc)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    dfd = os.open(meta, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return final


def read_pointer(directory: str, environ: os._Environ[str] | dict[str, str] | None = None
                 ) -> Pointer:
    """The `Pointer` in `directory`'s ``.steptrail/root``; InvalidInput (one line, the fix
    named) for one that is not yours, not a pointer, a copy's (the directory is not the
    one it was written in) or naming a ledger that is not there; `ForeignLedger` for a
    ledger another user owns."""
    import json

    from .errors import InvalidInput

    env = os.environ if environ is None else environ
    where = os.path.join(directory, LEDGER_DIR, POINTER_FILE)
    _check_yours(where, env)
    fix = f"remove {where} or name the ledger (--ledger, STEPTRAIL_LEDGER)"
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"{where} cannot be read ({exc.strerror}); {fix}") from None
    try:
        st = os.fstat(fd)
        raw = os.read(fd, _POINTER_MAX + 1) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw.decode()) if 0 < len(raw) <= _POINTER_MAX else None
    except (UnicodeDecodeError, ValueError):
        doc = None
    ok = isinstance(doc, dict) and doc.get("format") == POINTER_FORMAT and all(
        isinstance(doc.get(k), t) for k, t in (("ledger", str), ("workspace", str),
                                              ("dev", int), ("ino", int)))
    if not ok or not os.path.isabs(doc["ledger"]):  # type: ignore[index]
        raise InvalidInput(f"{where} is not a steptrail root pointer (a fork's directory"
                           f" names its ledger there); {fix}")
    assert isinstance(doc, dict)
    here = os.stat(directory)
    if (here.st_dev, here.st_ino) != (doc["dev"], doc["ino"]):
        raise InvalidInput(
            f"{directory} is a copy of a fork's directory: its .steptrail/root names"
            f" workspace {doc['workspace']!r} of {doc['ledger']}, whose directory is another"
            " one, and a step run here must not write there; register this copy as a"
            f" workspace of its own (steptrail --ledger {doc['ledger']} workspace add NAME"
            f" {directory}) and remove {where}")
    if not os.path.isfile(doc["ledger"]):
        raise InvalidInput(f"{where} names the ledger {doc['ledger']}, which is not there"
                           f" (moved or removed); {fix}")
    _check_yours(doc["ledger"], env)
    return Pointer(directory, doc["ledger"], doc["workspace"])


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


__all__ = ["ENV_ACROSS", "ENV_CEILINGS", "LEDGER_DIR", "LEDGER_FILE", "POINTER_FILE",
           "Pointer", "ceilings", "find_ledger", "find_place", "find_pointer", "ignore_in_git",
           "read_pointer", "working_directory", "write_pointer", "yours"]

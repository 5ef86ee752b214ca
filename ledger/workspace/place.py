"""Where the ledger lives, judged against where it was when a workspace was registered.

A project copied with its ledger inside (``cp -a proj proj2``, a restored CI cache, a
container snapshot, a second checkout made by copying) carries a ledger whose workspace
is registered at the *original* directory, which still has the device and inode recorded
for it: without this check a step run in the copy writes the original's files. So every
registration records the ledger's own place — its directory's real path, device and
inode (`OwnFiles.place`) — and `ledger_moved` compares it with where the ledger is now.

The rule (docs/guarantees.md "The workspace boundary"). A registration is judged only
when it recorded the ledger's place (a ledger in a database has none; a registration
written before it was recorded has none until the workspace is rebound: recording it
lazily on an open would bless a copy) and the ledger *travels with* the workspace — by
the recorded paths, one of:

- the ledger's directory lies inside the root (the default ``ROOT/.steptrail``);
- the ledger's directory is a ``.steptrail`` directory and the root lies inside its
  parent (``PROJECT/.steptrail`` with a workspace on ``PROJECT/src``, or beside it:
  ``/srv/agent/.steptrail`` next to ``/srv/agent/repo``).

Not judged: a ledger file directly in a directory that holds the root (``DIR/ledger.db``
beside ``DIR/repo``, the layout of throwaway examples and of the crash harnesses, which
reopen a ledger's files copied elsewhere as the same ledger after a power loss) — its
directory is nobody's project; keep a project's ledger in ``.steptrail/``.

Such a ledger that is not at its recorded place (path, device and inode) refuses — unless
the root is where the ledger's move puts it (the ledger's directory renamed inside the
project) or the recorded path still reaches this very directory (a bind mount, another
path to it). The refusal (`LedgerMoved`) names the case: ``copied`` (the registered root
is still there: the original's), ``moved`` (it is gone; the new place holds the project)
or ``ledger-only`` (the new place holds none of the workspace's files), each with the
command that resolves it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

from ..errors import LedgerMoved
from ..projections.workspaces import Registration
from .core import OwnFiles
from .boundary import LEDGER_DIR_NAME

#: The cases of `LedgerMoved`.
CASES: Final = ("copied", "moved", "ledger-only")


def _inside(a: str, b: str) -> bool:
    """`a` is `b` or lies under it (both real, absolute paths)."""
    return a == b or a.startswith(b.rstrip("/") + "/")


def travels_with(root: str, ledger_dir: str) -> bool:
    """Whether a ledger whose directory is `ledger_dir` is carried along when the
    directory holding a workspace at `root` is copied or moved (the rule above)."""
    return _inside(ledger_dir, root) or (os.path.basename(ledger_dir) == LEDGER_DIR_NAME
                                         and _inside(root, os.path.dirname(ledger_dir)))


def _holds_project(new_root: str, ledger_dir: str) -> bool:
    """`new_root` is a directory holding something besides the way to the ledger's own
    directory (the project's files came along)."""
    try:
        names = os.listdir(new_root)
    except OSError:
        return False
    toward = None
    if ledger_dir != new_root and _inside(ledger_dir, new_root):
        toward = os.path.relpath(ledger_dir, new_root).split("/")[0]
    return any(name != toward for name in names)


def _identity(path: str) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    return None


def ledger_moved(workspace: str, reg: Registration, own: OwnFiles) -> LedgerMoved | None:
    """The refusal a step on `workspace` (registered as `reg`) meets because the ledger
    (`own`) no longer sits where it was; None when it may go on. Costs a comparison
    when the ledger is where it was recorded (every step asks)."""
    recorded = reg.ledger_place
    now = own.place() if recorded is not None else None
    if recorded is None or now is None or now == recorded:
        return None
    root, was = reg.root, recorded[0]
    if not travels_with(root, was):
        return None
    new_root = os.path.normpath(os.path.join(now[0], os.path.relpath(root, was)))
    if new_root == root:
        return None  # renamed inside the project, or the same place: the root is its own
    if now[1:] == recorded[1:] and _identity(was) == recorded[1:]:
        return None  # the recorded path reaches this very directory (a bind mount)
    root_exists = os.path.lexists(root)
    if _holds_project(new_root, now[0]):
        case = "copied" if root_exists else "moved"
    else:
        case = "ledger-only"
    restore_to = None if case != "ledger-only" or os.path.lexists(new_root) else new_root
    ledger_file = os.path.join(now[0], os.path.basename(own.path))
    return LedgerMoved(workspace, root, was, now[0], case, new_root, ledger_file, root_exists,
                       restore_to, own.witness)


__all__ = ["CASES", "ledger_moved", "travels_with"]

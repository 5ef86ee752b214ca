"""What a crashed call of an attempt left of its writes on disk, read from the names alone.

A fenced write's slots (names.py) have fixed names per (path, epoch, attempt, role): the
next call of the same attempt — a retry, a settle after a kill, an undo — finds them
again and tells whether the write landed and what it displaced (`landed`). When a person
renamed or moved a directory after the kill (``git mv src lib``), the slots are searched
for in the whole workspace and the directory they are in is matched to the planned one
(`moved_dirs`): the take-back then happens inside it; a match that cannot be told apart
is not guessed.

Functions over one attempt's `WorkspaceDir` (directory.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from .boundary import FileIdentity, identity_of, is_git_name, is_ledger_dir_name
from .directory import READ_FLAGS, WorkspaceDir, mode_of
from .moves import NOT_A_FILE, look, stat_at
from .names import SLOT_ROLES, TMP_MARK, temp_stamp
from ..errors import LedgerError


@dataclass(frozen=True)
class Found:
    """What a crashed call left of one write (`WorkspaceDir.landed`): whether it
    `landed`; `now`, the digest the path holds; `slot`, the name holding what it
    displaced (a create: its link); `displaced`, that content's digest."""

    path: str
    landed: bool
    now: str | None
    slot: str | None
    displaced: str | None


def landed(wsdir: WorkspaceDir, path: str, pre: str | None, post: str | None, role: str = "x", *,
           search: bool = False, mode: int | None = None) -> Found:
    """What a crashed call of this attempt left of its write to `path` (planned from
    `pre` to `post`): whether the write landed, and what it displaced.

    Read from the names alone: a modify landed when its slot (another inode than the
    path's) holds anything but `post` — a slot is only ever the whole staged
    post-image or, after the exchange, the displaced bytes; a create when the path
    and its slot are one inode (the link); a delete when its slot exists and the path
    does not hold that same inode. `Found.now` says what the path holds now (a
    person may have changed it since). Anything else did not land. `search`: a
    settle's — look for the directory where a person moved it (`_found_parent`).
    `mode`: the bits the write sets, when the plan gives them (a mode change)."""
    # the slots that are evidence of this write (a create's link is in its role's
    # slot only; what an edit or a delete displaced may be in ``y`` too): a search
    # looks for these alone (a move's source and destination share a leaf)
    evidence = {wsdir.slot(path, role)} | ({wsdir.slot(path, "y")} if pre is not None
                                           else set())
    opened = _found_parent(wsdir, path, search, evidence)
    if opened is None:
        return Found(path, False, None, None, None)
    dir_fd, leaf = opened
    try:
        here = stat_at(dir_fd, leaf)
        now = look(dir_fd, leaf).digest
        aside = wsdir.slot(path, "y")
        if here is None and pre is not None and post is not None \
                and stat_at(dir_fd, aside) is not None \
                and stat_at(dir_fd, wsdir.slot(path, role)) is not None:
            # the fallback cut between its move aside and its link: the name is
            # absent, the file it held aside (even when its bytes are the post-image's:
            # a mode change)
            return Found(path, True, None, aside, look(dir_fd, aside).digest)
        for name in (wsdir.slot(path, role), aside):
            there = stat_at(dir_fd, name)
            if there is not None and not stat.S_ISREG(there.st_mode) \
                    and pre is not None and (now == post or here is None):
                # what a person had put at the name — a directory, a symlink —
                # exchanged (or moved aside) into the slot, and a kill before the
                # check could swap it back: it landed, displacing that
                return Found(path, True, now, name, NOT_A_FILE)
            if there is None or not stat.S_ISREG(there.st_mode):
                continue
            same = here is not None and identity_of(here) == identity_of(there)
            if post is None:
                if not same:
                    return Found(path, True, now, name, look(dir_fd, name).digest)
            elif pre is None:
                if same:
                    return Found(path, True, now, name, None)
            elif not same:
                # the slot held the whole staged post-image until the exchange: any
                # other content there is what the exchange displaced (the path may
                # have changed again since: `now` says what it holds)
                displaced = look(dir_fd, name).digest
                if displaced != post or (pre == post and mode is not None
                                         and mode_of(name, dir_fd) != mode):
                    # (a mode change, `mode` the bits it sets: the same bytes in
                    # the slot, with other bits, are the file it displaced)
                    return Found(path, True, now, name, displaced)
        return Found(path, False, now, None, None)
    finally:
        os.close(dir_fd)


def _found_parent(wsdir: WorkspaceDir, path: str, search: bool, names: set[str]
                  ) -> tuple[int, str] | None:
    """`path`'s directory for reading what a crashed call left there: the one held
    already; else the one at its name (held from then on when it holds `path`'s
    slots `names`); else, with `search` (a settle after a kill, never a first apply)
    and only when no directory has that name any more — a directory a person renamed
    or moved after the kill (``git mv src lib``), which a new process cannot follow
    by a held descriptor — where `_moved_dirs_found` says it went, held from then on,
    so the take-back happens inside it and says where it went (`TakeBack.moved`)."""
    d, _, leaf = path.rpartition("/")
    if d in wsdir.held_dirs:
        return wsdir.held_parent(path, check=False)
    opened = wsdir.open_parent(path, create=False)
    if opened is not None and any(stat_at(opened[0], n) is not None for n in names):
        # held from here: the take-back goes where its evidence is, even if the
        # directory is renamed in between
        wsdir.held_dirs[d] = (os.dup(opened[0]), identity_of(os.fstat(opened[0])))
    if opened is not None or not search:
        return opened
    rel = _moved_dirs_found(wsdir).get(d)
    if rel is None:
        return None
    try:
        fd = wsdir.open_dir_fd(rel)
    except (LedgerError, OSError):
        return None
    if fd is None:
        return None
    wsdir.held_dirs[d] = (os.dup(fd), identity_of(os.fstat(fd)))
    return fd, leaf


def _moved_dirs_found(wsdir: WorkspaceDir) -> dict[str, str | None]:
    """Each planned directory gone from its name -> where it is now (None: not
    found, or not told apart). One walk (`_attempt_dirs`) gives the directories
    holding this attempt's names; a directory's score for a planned one is how many
    of the slot names of its planned paths it holds (a slot's name comes from the
    leaf alone: a move's source and destination share one, so a single name does
    not tell). Pairs are taken best score first, each directory and each planned
    one at most once; a tie between two unmatched pairs sharing either is not
    guessed (a ``cp -a`` of the moved directory: its slots are given visible names
    in both copies, `_keep_slots`). A directory that is a planned one at its own
    name is never a candidate."""
    if wsdir.moved_to is not None:
        return wsdir.moved_to
    planned_dirs = {p.rpartition("/")[0] for p in wsdir.planned}
    gone = sorted(x for x in planned_dirs if not wsdir.has_dir(x))
    out: dict[str, str | None] = {x: None for x in gone}
    wsdir.moved_to = out
    if not gone:
        return out
    at_names = set()
    for x in planned_dirs - set(gone):
        with contextlib.suppress(LedgerError, OSError):
            fd = wsdir.open_dir_fd(x)
            if fd is not None:
                at_names.add(identity_of(os.fstat(fd)))
                os.close(fd)
    wanted = {x: {wsdir.slot(p, r) for p in wsdir.planned if p.rpartition("/")[0] == x
                  for r in SLOT_ROLES} for x in gone}
    pairs = sorted(((len(inside & wanted[x]), rel, x)
                    for rel, (ident, inside) in _attempt_dirs(wsdir).items()
                    if ident not in at_names for x in gone if inside & wanted[x]),
                   reverse=True)
    used: set[str] = set()
    for score, rel, x in pairs:
        if rel in used or out[x] is not None or x in used:
            continue
        rivals = [r for r in pairs if r[0] == score and (r[1], r[2]) != (rel, x)
                  and (r[1] == rel or r[2] == x)
                  and r[1] not in used and out[r[2]] is None and r[2] not in used]
        if rivals:
            used.add(x)  # not told apart: nothing guessed; the originals made visible
            for _, r, y in [(score, rel, x), *rivals]:
                names = sorted(_attempt_dirs(wsdir)[r][1] & wanted[y])
                for leaf in {n[1:].split(TMP_MARK, 1)[0] for n in names}:
                    _keep_slots(wsdir, r, [n for n in names
                                           if n[1:].split(TMP_MARK, 1)[0] == leaf], leaf)
            continue
        out[x] = rel
        used.add(rel)
    return out


def _keep_slots(wsdir: WorkspaceDir, rel: str, names: list[str], leaf: str) -> None:
    """Give the slot files `names` in directory `rel` visible names beside `leaf`
    (`Mover.keep`): nothing is removed."""
    with contextlib.suppress(LedgerError, OSError):
        fd = wsdir.open_dir_fd(rel)
        if fd is None:
            return
        try:
            for n in names:
                st = stat_at(fd, n)
                if st is not None and stat.S_ISREG(st.st_mode):
                    kept = wsdir.mover().keep(fd, n, leaf)
                    wsdir.kept.append((f"{rel}/{leaf}" if rel else leaf, kept))
        finally:
            os.close(fd)


def moved_dirs(wsdir: WorkspaceDir, *, search: bool = False) -> set[str]:
    """Where the directories this object holds are now (relative), for those no
    longer at the name they were reached by (a settle found them there:
    `_found_parent`), and every directory a search for them saw this attempt's names
    in (`search`: search now): a settle collects its temporaries there too."""
    if search:
        _attempt_dirs(wsdir)
    out = set(wsdir.walked or ())  # and any directory a search saw its names in
    for d, (fd, _) in wsdir.held_dirs.items():
        now = wsdir.where_now(fd)
        if now is not None and now != (d or "."):
            out.add(now)
    return out


def _attempt_dirs(wsdir: WorkspaceDir) -> dict[str, tuple[FileIdentity, frozenset[str]]]:
    """Every directory of the workspace holding a name of this attempt under this
    epoch (relative path -> (identity, those names)): one walk, not following
    symlinks, skipping the ledger's directories and ``.git``; made once per object
    (the settling of one crashed attempt), only when a path's slots are not beside
    it by name."""
    if wsdir.walked is not None:
        return wsdir.walked
    out: dict[str, tuple[FileIdentity, frozenset[str]]] = {}
    with contextlib.suppress(OSError):
        root = wsdir.open_root()
        try:
            for top, dirs, files, fd in os.fwalk(".", dir_fd=root):
                dirs[:] = [x for x in dirs
                           if not is_ledger_dir_name(x) and not is_git_name(x)]
                mine = frozenset(n for n in files
                                 if temp_stamp(n) == (wsdir.epoch, wsdir.tag))
                if mine:
                    rel = os.path.normpath(top)
                    out["" if rel == "." else rel] = (identity_of(os.fstat(fd)), mine)
        finally:
            os.close(root)
    wsdir.walked = out
    return out


@contextlib.contextmanager
def open_slot(wsdir: WorkspaceDir, path: str, name: str) -> Iterator[int | None]:
    """A read-only descriptor of slot `name` beside `path` (None: absent, or not a
    regular file): a crashed write's displaced pre-image, on its way into the store.
    Read from the directory held since the landing (wherever it went)."""
    try:
        opened = wsdir.held_parent(path, check=False)
    except (LedgerError, OSError):
        opened = None
    if opened is None:
        yield None
        return
    dir_fd, _ = opened
    try:
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
        except OSError:
            fd = None
    finally:
        os.close(dir_fd)
    if fd is None:
        yield None
        return
    try:
        yield fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


__all__ = ["Found", "landed", "moved_dirs", "open_slot"]

"""Putting a step's write in place, verifying what it displaced, and taking it back.

`land` puts one staged write at its name atomically and checks, after they left the
namespace, that the bytes it displaced are the planned pre-image: otherwise the move is
undone on the spot and a person's save is never overwritten (moves.py is the primitive
every move here is made of). What a write displaced stays under its slot name until the
ledger recorded the write (`release` removes it then, verified), so a crash at any point
leaves each path's before and after on disk for the next call to find (leftovers.py).
`unland` takes back a write this call landed when a later path of the step conflicted;
`roll_back` a crashed call's; both put the displaced bytes back only while the path
still holds the step's own, and otherwise keep everything under a visible name.

Functions over one attempt's `WorkspaceDir` (directory.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from . import exchange
from .boundary import FileIdentity, identity_of, same_file
from .directory import MODE_BITS, DirectoryMoved, WorkspaceDir, chmod_at, mode_of
from .leftovers import Found
from .moves import ANY_FILE, NOT_A_FILE, Seen, UnsafeFallbackRefused, look, stat_at
from .staging import Staged
from ..errors import LedgerError, PathEscapes, StorageFailure, UnsafeRename


@dataclass
class Landing:
    """One write put in place by `WorkspaceDir.land`: `ok`, or refused with what was
    `found` (the digest displaced or in the way; None: absent); `displaced`, the name
    in the path's directory now holding what the write displaced (for a create, a
    second link to the new file), removed by `release` once the ledger recorded it;
    `seen`, that file as it was checked; `kept`, a refused landing's race: a file it
    could not put back, under this visible name beside the path; `moved`, the path's
    directory was moved away before the landing (where it is now; "" unknown)."""

    path: str
    ok: bool
    found: str | None
    displaced: str | None
    pre_mode: int | None = None
    post_mode: int | None = None
    seen: Seen | None = None
    post: str | None = None
    kept: str | None = None
    moved: str | None = None
    link: str | None = None  # the fallback's staged name: a second link of the new file


@dataclass(frozen=True)
class TakeBack:
    """How taking one landed write back ended: `ok` (the path holds what it held before
    the write: `now`), or not (left as found, holding `now`). `kept`: a file put under
    this visible name beside the path (what the write displaced, when it could not go
    back; or a person's save met on the way); `moved`: the path's directory is now at
    this place (a person moved it while the step ran); `error`: why nothing was done."""

    path: str
    ok: bool
    now: str | None
    kept: str | None = None
    moved: str | None = None
    error: str | None = None


def _trash(wsdir: WorkspaceDir, path: str, dir_fd: int, post: str) -> str:
    """The take-back's slot (``t``) beside `path`, cleared first: what a crashed
    take-back left there goes only once it is shown to be the step's own bytes or
    held by the ledger — here, the displaced file it was about to put back is kept
    visible otherwise (`Mover.drop`)."""
    trash = wsdir.slot(path, "t")
    leaf = path.rpartition("/")[2]
    kept = wsdir.mover().drop(dir_fd, trash, keep_for=leaf, expect=frozenset({post}))
    if kept is not None:
        wsdir.kept.append((path, kept))
    return trash


def land(wsdir: WorkspaceDir, path: str, staged: Staged | None, expect: str | None, *,
         check: bool = True, role: str = "x") -> Landing:
    """Put one write in place atomically and verify what it displaced (`moves`).

    `staged` None deletes: the file is moved aside (to its `slot`) without replacing
    anything, then hashed. Otherwise `expect` None creates: the staged file is
    hard-linked to the target, which fails if anything holds the name. Otherwise the
    staged file and the target are exchanged (one system call) and the displaced
    bytes, now under the staged name, are hashed. Unless they are `expect` (the
    planned pre-image; anything when not `check`) the move is undone on the spot and
    the Landing says ``ok=False`` with what was found: a person's save made at any
    moment before is never overwritten, and one made between the move and its undo
    is kept under a visible name (`Landing.kept`).

    Where the system has no exchange call the target is moved aside, hashed there,
    and the staged file linked in: the name is absent between the two, and a file a
    person makes in that moment wins (the write is refused).

    The directory is the one held since staging (`_held_parent`): if it was renamed
    or moved since, nothing is written and the Landing says where it went (`moved`).
    The displaced bytes stay under the slot name (`Landing.displaced`) until `release`
    — after the ledger recorded the write — so a crash at any point leaves each
    path's before and after on disk, for `landed` to find. Directories are not
    fsynced here (`sync_dirs`, once per directory, before the commit).
    """
    try:
        opened = wsdir.held_parent(path, create=staged is not None)
    except DirectoryMoved as moved:
        return Landing(path, False, None, None, moved=moved.now or "")
    if opened is None:  # a delete whose directory is gone: nothing there to delete
        return Landing(path, False, None, None)
    dir_fd, leaf = opened
    try:
        if staged is None:
            return _land_delete(wsdir, dir_fd, leaf, path, expect, check, role)
        if expect is None and check:
            return _land_create(wsdir, dir_fd, leaf, path, staged)
        return _land_exchange(wsdir, dir_fd, leaf, path, staged, expect, check)
    except UnsafeFallbackRefused:
        raise UnsafeRename(os.path.join(wsdir.root, path)) from None
    except OSError as exc:
        raise StorageFailure(os.path.join(wsdir.root, path),
                             os.strerror(exc.errno or 0)) from None
    finally:
        os.close(dir_fd)


def _land_create(wsdir: WorkspaceDir, dir_fd: int, leaf: str, path: str, staged: Staged) -> Landing:
    mover = wsdir.mover()
    if not mover.link(dir_fd, staged.tmp_name, leaf):
        return Landing(path, False, look(dir_fd, leaf).digest, None)
    linked = stat_at(dir_fd, staged.tmp_name) is not None
    return Landing(path, True, None, staged.tmp_name if linked else None,
                   post_mode=staged.mode, post=staged.digest)


def _land_delete(wsdir: WorkspaceDir, dir_fd: int, leaf: str, path: str, expect: str | None,
                 check: bool, role: str) -> Landing:
    aside = wsdir.slot(path, role)
    mover = wsdir.mover()
    # a slot left by a crashed call of this attempt was judged by the caller
    mover.drop(dir_fd, aside, expect=frozenset({expect} - {None}), keep_for=leaf)
    move = mover.aside(dir_fd, leaf, aside, expect if check else ANY_FILE)
    if move.verdict == "absent":
        return Landing(path, False, None, None)
    if not move.ok:
        return Landing(path, False, move.found, None, kept=move.kept)
    return Landing(path, True, move.seen.digest, aside, pre_mode=mode_of(aside, dir_fd),
                   seen=move.seen)


def _land_exchange(wsdir: WorkspaceDir, dir_fd: int, leaf: str, path: str, staged: Staged,
                   expect: str | None, check: bool) -> Landing:
    st = stat_at(dir_fd, leaf)
    if st is not None and staged.follows_target and stat.S_ISREG(st.st_mode) \
            and stat.S_IMODE(st.st_mode) & MODE_BITS != staged.mode:
        chmod_at(dir_fd, staged.tmp_name, stat.S_IMODE(st.st_mode) & MODE_BITS)
        staged.mode = staged.pre_mode = stat.S_IMODE(st.st_mode) & MODE_BITS
    if st is None:
        if check:
            return Landing(path, False, None, None)
        return _land_create(wsdir, dir_fd, leaf, path, staged)  # fence "none": created
    want = expect if check else ANY_FILE
    mover = wsdir.mover()
    ours = stat_at(dir_fd, staged.tmp_name)
    if mover.can_exchange():
        try:
            move = mover.exchange(dir_fd, leaf, staged.tmp_name, want, staged.digest)
        except FileNotFoundError:
            return Landing(path, False, None, None)
        except exchange.Unsupported:
            pass
        else:
            if not move.ok:
                return Landing(path, False, move.found, None, kept=move.kept)
            _follow_chmod(wsdir, dir_fd, leaf, staged.tmp_name, staged, ours)
            return Landing(path, True, move.seen.digest, staged.tmp_name,
                           pre_mode=mode_of(staged.tmp_name, dir_fd),
                           post_mode=staged.mode, seen=move.seen, post=staged.digest)
    # No exchange here: the target moved aside and checked, then the staged file
    # linked in (the name is absent in between: a file made then wins).
    aside = wsdir.slot(path, "y")
    mover.drop(dir_fd, aside, expect=frozenset({expect} - {None}), keep_for=leaf)
    move = mover.aside(dir_fd, leaf, aside, want)
    if move.verdict == "absent":
        return Landing(path, False, None, None)
    if not move.ok:
        return Landing(path, False, move.found, None, kept=move.kept)
    try:
        linked = mover.link(dir_fd, staged.tmp_name, leaf)
    except FileNotFoundError:
        linked = False  # the staged name gone: finished by another call, or lost
    if not linked and ours is not None and same_file(stat_at(dir_fd, leaf), ours) \
            and look(dir_fd, leaf).digest == staged.digest:
        # another call finished this landing in the moment between the two
        # (`finish_aside`: a settle under a newer epoch, meeting it half done,
        # linked the staged file in): landed, the name holding the staged file
        return Landing(path, True, move.seen.digest, aside,
                       pre_mode=mode_of(aside, dir_fd), post_mode=staged.mode,
                       seen=move.seen, post=staged.digest)
    if not linked:
        # refused: what was moved aside goes back to the name, never over anything —
        # the name still empty when the staged file was removed under this landing
        # (a newer epoch's cleanup of a stale worker's temporaries); a file made in
        # the moment the name was absent stays, and what was moved aside is kept
        # beside it, visible. (Gone already: put back by another call.)
        kept = None
        if stat_at(dir_fd, aside) is not None and not mover.put(dir_fd, aside, leaf):
            kept = mover.keep(dir_fd, aside, leaf)
        return Landing(path, False, look(dir_fd, leaf).digest, None, kept=kept)
    _follow_chmod(wsdir, dir_fd, leaf, aside, staged, ours)
    # the staged name stays a second link of the file now at the name until the
    # ledger recorded the write (`release`)
    return Landing(path, True, move.seen.digest, aside,
                   pre_mode=mode_of(aside, dir_fd), post_mode=staged.mode,
                   seen=move.seen, post=staged.digest, link=staged.tmp_name)


def _follow_chmod(wsdir: WorkspaceDir, dir_fd: int, leaf: str, gone: str, staged: Staged,
                  ours: os.stat_result | None) -> None:
    """An edit keeps its file's bits: a chmod made between the check before the
    landing and the move (the file now hidden as `gone` has bits other than the
    staged file's) is carried to the step's file at the name — that inode only."""
    if not staged.follows_target or ours is None:
        return
    theirs = mode_of(gone, dir_fd)
    if theirs is None or theirs == staged.mode:
        return
    with contextlib.suppress(OSError):
        chmod_at(dir_fd, leaf, theirs, only=identity_of(ours))
        staged.mode = staged.pre_mode = theirs


def unland(wsdir: WorkspaceDir, landing: Landing, post: str | None) -> TakeBack:
    """Take back a write this call landed (a later path of the step conflicted):
    the displaced file goes back only if the path still holds what was put there
    (`post`), each move verified (`moves`). Otherwise the path is left as found —
    a save made after the write landed is kept — and what the write displaced is
    kept under a visible name (`TakeBack.kept`), never removed."""
    if landing.displaced is None:
        if landing.ok and landing.post is not None and post is not None:
            return _take_back_unlinked_create(wsdir, landing.path, post)
        return TakeBack(landing.path, True, None)
    return _take_back(wsdir, landing.path, landing.displaced, post, landing.found,
                      landed=True, post_mode=landing.post_mode)


def _take_back_unlinked_create(wsdir: WorkspaceDir, path: str, post: str) -> TakeBack:
    """Take back a create made by renaming (a file system without hard links: no
    second name was left): the file goes aside, checked, then away."""
    opened = wsdir.held_parent(path, check=False)
    if opened is None:
        return TakeBack(path, False, None, error="its directory is gone")
    dir_fd, leaf = opened
    mover = wsdir.mover()
    try:
        trash = _trash(wsdir, path, dir_fd, post)
        move = mover.aside(dir_fd, leaf, trash, post)
        if move.verdict == "absent":
            return TakeBack(path, True, None)
        if not move.ok:
            return TakeBack(path, False, move.found, kept=move.kept)
        return TakeBack(path, True, None, kept=mover.drop(dir_fd, trash, move.seen,
                                                          keep_for=leaf))
    except OSError as exc:
        return TakeBack(path, False, None, error=os.strerror(exc.errno or 0))
    finally:
        os.close(dir_fd)


def roll_back(wsdir: WorkspaceDir, found: Found, post: str | None, *,
              displaced_stored: bool = False, post_mode: int | None = None) -> TakeBack:
    """Undo a crashed call's landed write (`landed`): the displaced bytes go back
    where they were, only if the path still holds what the write put there. Otherwise
    nothing of the path is touched (a conflict for a human) and what the write
    displaced is kept under a visible name — or, when the caller stores it in the
    transaction that records this (`displaced_stored`), left in its slot, collected
    (verified) once that has committed. `post_mode`: the bits the write gave its
    file (None: those of the file it replaced); a person's chmod of the step's file
    since is carried over to the file put back, never undone."""
    if found.slot is None:
        return TakeBack(found.path, True, None)
    return _take_back(wsdir, found.path, found.slot, post, found.displaced, landed=False,
                      stored=displaced_stored, post_mode=post_mode)


def _take_back(wsdir: WorkspaceDir, path: str, displaced: str, post: str | None, pre: str | None, *,
               landed: bool, stored: bool = False, post_mode: int | None = None
               ) -> TakeBack:
    try:
        opened = wsdir.held_parent(path, check=False)
    except (LedgerError, OSError) as exc:
        return TakeBack(path, False, None, error=str(exc))
    if opened is None:
        return TakeBack(path, False, None, error="its directory is gone")
    dir_fd, leaf = opened
    where = None
    d = path.rpartition("/")[0]
    if d in wsdir.held_dirs:
        now = wsdir.where_now(dir_fd)
        if now is not None and now != (d or "."):
            where = now
    try:
        back = _unland(wsdir, dir_fd, leaf, path, displaced, post, pre, landed, stored,
                       post_mode)
    except UnsafeFallbackRefused as exc:
        back = TakeBack(path, False, None, error=exc.strerror or "")
    except OSError as exc:
        back = TakeBack(path, False, None, error=os.strerror(exc.errno or 0))
    finally:
        os.close(dir_fd)
    return back if where is None else dataclasses.replace(back, moved=where)


def _unland(wsdir: WorkspaceDir, dir_fd: int, leaf: str, path: str, displaced: str, post: str | None,
            pre: str | None, landed: bool, stored: bool = False,
            post_mode: int | None = None) -> TakeBack:
    mover = wsdir.mover()

    def keep_displaced() -> str | None:
        """What the write displaced, when it cannot go back: visible — or, stored by
        the caller's transaction, left in its slot for the collection after it."""
        return None if stored else mover.keep(dir_fd, displaced, leaf)

    here = stat_at(dir_fd, leaf)
    there = stat_at(dir_fd, displaced)
    if there is None:
        return TakeBack(path, False, look(dir_fd, leaf).digest,
                        error="what the write displaced is gone")
    if post_mode is None and pre is not None and stat.S_ISREG(there.st_mode):
        # a crashed call's write with no mode of its own: its staged file took the
        # bits of the file it replaced — the ones the displaced file still has
        post_mode = stat.S_IMODE(there.st_mode) & MODE_BITS
    if post is None:  # a delete: its file goes back from aside, over nothing
        if mover.put(dir_fd, displaced, leaf):
            return TakeBack(path, True, pre)
        now = look(dir_fd, leaf).digest
        return TakeBack(path, False, now, kept=keep_displaced())
    if here is not None and identity_of(here) == identity_of(there):  # a create's link
        trash = _trash(wsdir, path, dir_fd, post)
        move = mover.aside(dir_fd, leaf, trash, post)
        if move.ok:
            mover.drop(dir_fd, displaced, twin=trash, expect=frozenset({post}),
                       keep_for=leaf)
            kept = mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
            return TakeBack(path, True, None, kept=kept)
        if move.verdict == "absent":  # deleted since: as it was before the step
            mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
            return TakeBack(path, True, None)
        # not the step's file any more: left as found; the step's own copy goes
        kept = mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
        return TakeBack(path, False, move.found, kept=move.kept or kept)
    if pre is None:  # a create whose link is gone: nothing of the step at the path
        mover.drop(dir_fd, displaced, expect=frozenset({post}), keep_for=leaf)
        return TakeBack(path, False, look(dir_fd, leaf).digest)
    if here is None:
        staged = wsdir.slot(path, "x")
        if not landed and displaced != staged and look(dir_fd, staged).digest == post:
            # the fallback stopped between moving the file aside and linking the
            # new one in: the name was never given the step's bytes
            if mover.put(dir_fd, displaced, leaf):
                mover.drop(dir_fd, staged, expect=frozenset({post}), keep_for=leaf)
                return TakeBack(path, True, pre)
        # deleted since the write landed: stays deleted; the displaced file is kept
        return TakeBack(path, False, None, kept=keep_displaced())
    if mover.can_exchange():
        try:
            move = mover.exchange(dir_fd, leaf, displaced, post, pre or "")
        except exchange.Unsupported:
            pass
        else:
            if move.ok:  # the step's bytes are in the slot now, checked
                _keep_persons_mode(wsdir, dir_fd, leaf, displaced, post_mode,
                                   identity_of(there))
                kept = mover.drop(dir_fd, displaced, move.seen, keep_for=leaf)
                return TakeBack(path, True, pre, kept=kept)
            kept = move.kept or keep_displaced()
            return TakeBack(path, False, look(dir_fd, leaf).digest, kept=kept)
    trash = _trash(wsdir, path, dir_fd, post)
    move = mover.aside(dir_fd, leaf, trash, post)
    if not move.ok:
        kept = move.kept if move.kept else keep_displaced()
        return TakeBack(path, False, look(dir_fd, leaf).digest, kept=kept)
    if not mover.put(dir_fd, displaced, leaf):
        # a file made while the name was absent: it stays, the pre-image beside it
        now = look(dir_fd, leaf).digest
        kept = keep_displaced()
        mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
        return TakeBack(path, False, now, kept=kept)
    _keep_persons_mode(wsdir, dir_fd, leaf, trash, post_mode, identity_of(there))
    kept = mover.drop(dir_fd, trash, move.seen, keep_for=leaf)
    return TakeBack(path, True, pre, kept=kept)


@contextlib.contextmanager
def _cut_landing(wsdir: WorkspaceDir, path: str, role: str
                 ) -> Iterator[tuple[int, str, str, str, str] | None]:
    """A landing without the exchange call as a kill between its two moves left it:
    the name empty, a regular file in the ``y`` slot beside it — (directory descriptor,
    leaf, the staged file's slot (`role`), the ``y`` slot, the digest the ``y`` slot
    holds); None for anything else."""
    opened = wsdir.open_parent(path, create=False)
    if opened is None:
        yield None
        return
    dir_fd, leaf = opened
    try:
        staged, aside = wsdir.slot(path, role), wsdir.slot(path, "y")
        seen = None
        if stat_at(dir_fd, leaf) is None and stat_at(dir_fd, aside) is not None:
            seen = look(dir_fd, aside).digest
        yield None if seen in (None, NOT_A_FILE) else (dir_fd, leaf, staged, aside, seen)
    finally:
        os.close(dir_fd)


def finish_aside(wsdir: WorkspaceDir, path: str, role: str, expect: object) -> bool:
    """Finish a landing the fallback (no exchange call) began and a kill stopped
    between moving the file aside (to the ``y`` slot) and linking the staged one (the
    `role` slot) in: the name is absent then, and gets the staged file, never over
    anything — and only when the file aside is the one that landing expected to
    displace (`expect`: a digest; `moves.ANY_FILE` for a landing that checks nothing,
    fence "none": any regular file). A landing moves aside anything, then checks it: a
    ``y`` slot holding other bytes is a refusal in progress (a person's save, moved
    aside, on its way back to its name — by the landing itself if it is still running,
    or by `put_aside_back` / the roll-back after its crash), never a landing to finish.
    True when it was done."""
    try:
        with _cut_landing(wsdir, path, role) as cut:
            if cut is None:
                return False
            dir_fd, leaf, staged, _aside, seen = cut
            if expect is not ANY_FILE and seen != expect:
                return False
            st = stat_at(dir_fd, staged)
            if st is None or not stat.S_ISREG(st.st_mode):
                return False
            mover = wsdir.mover()
            if not mover.link(dir_fd, staged, leaf):
                return False
            mover.drop(dir_fd, staged, twin=leaf)
            return True
    except OSError:
        return False


def put_aside_back(wsdir: WorkspaceDir, path: str, role: str, expect: str | None,
                   staged_digest: str | None) -> bool:
    """The other half of `finish_aside`: a refusal a kill cut between moving a file
    aside (to the ``y`` slot: not `expect`, the file that landing meant to displace) and
    putting it back — the name empty, the staged file (the `role` slot, of
    `staged_digest`) beside it. The file aside goes back to its name, never over
    anything, and the staged file goes (verified). True when that was done; a stale
    worker still running its own put-back then finds the name taken, and its save is
    where it belongs."""
    try:
        with _cut_landing(wsdir, path, role) as cut:
            if cut is None:
                return False
            dir_fd, leaf, staged, aside, seen = cut
            if seen == expect or look(dir_fd, staged).digest != staged_digest:
                return False
            mover = wsdir.mover()
            if not mover.put(dir_fd, aside, leaf):
                return False
            kept = mover.drop(dir_fd, staged, expect=frozenset({staged_digest} - {None}),
                              keep_for=leaf)
            if kept is not None:
                wsdir.kept.append((path, kept))
            return True
    except OSError:
        return False


def _keep_persons_mode(wsdir: WorkspaceDir, dir_fd: int, leaf: str, gone: str,
                       step_mode: int | None, only: FileIdentity | None = None) -> None:
    """A take-back or an undo replaced the step's file (now `gone`, hidden) with what
    was there before: if a person had chmodded the step's file since (its mode is
    not the one the step gave it, `step_mode`), the file at the name takes that mode
    — a person's chmod is kept, never undone."""
    if step_mode is None:
        return
    theirs = mode_of(gone, dir_fd)
    here = mode_of(leaf, dir_fd)  # None: not a regular file (a person's directory)
    if theirs is not None and theirs != step_mode and here is not None and here != theirs:
        with contextlib.suppress(OSError):  # (`only`: the file put back, no later save)
            chmod_at(dir_fd, leaf, theirs, only=only)


def keep_persons_mode(wsdir: WorkspaceDir, path: str, gone: str | None, step_mode: int | None,
                      only: FileIdentity | None = None) -> int | None:
    """After an undo's landing (slot `gone` beside `path` holds the step's file it
    displaced): keep a person's chmod of it on the file put back
    (`_keep_persons_mode`); returns the file's mode now."""
    if gone is None:
        return None
    opened = wsdir.held_parent(path, check=False)
    if opened is None:
        return None
    dir_fd, leaf = opened
    try:
        _keep_persons_mode(wsdir, dir_fd, leaf, gone, step_mode, only)
        return mode_of(leaf, dir_fd)
    finally:
        os.close(dir_fd)


def release(wsdir: WorkspaceDir, landings: Iterable[Landing]) -> list[tuple[str, str]]:
    """After the ledger recorded the writes: remove what they displaced (bytes the
    blob store holds now), each only if it is still the file checked at the landing
    (same inode, size and times) — or, for a create, the second link of the file at
    the path, or the step's own bytes. A displaced file written since (a process that
    held it open, such as a logger with O_APPEND) is kept under a visible name:
    returns those (path, kept name). Not fsynced, and best effort: what a crash or a
    failure leaves is a temporary the next apply, settle or gc of the workspace
    collects (verified the same way)."""
    out: list[tuple[str, str]] = []
    for landing in landings:
        if landing.displaced is None:
            continue
        try:
            opened = wsdir.held_parent(landing.path, check=False)
        except (LedgerError, OSError):
            continue
        if opened is None:
            continue
        dir_fd, leaf = opened
        try:
            # the file checked at the landing; a create's link (the path's twin); or
            # the displaced or the step's bytes (a crashed call's landing, found)
            kept = wsdir.mover().drop(
                dir_fd, landing.displaced, landing.seen, keep_for=leaf,
                twin=leaf if landing.found is None else None,
                expect=frozenset({landing.found, landing.post} - {None, NOT_A_FILE}))
            if kept is not None:
                out.append((landing.path, kept))
            if landing.link is not None:
                kept = wsdir.mover().drop(dir_fd, landing.link, twin=leaf, keep_for=leaf,
                                          expect=frozenset({landing.post} - {None}))
                if kept is not None:
                    out.append((landing.path, kept))
        except OSError:
            pass
        finally:
            os.close(dir_fd)
    wsdir.kept.extend(out)
    return out


def discard_slots(wsdir: WorkspaceDir, path: str, roles: str = "xy",
                  held: Callable[[str], bool] | None = None) -> None:
    """Remove this attempt's leftovers in `path`'s slots (an attempt that is over),
    each only once its bytes are shown to be held by the ledger (`held`) or by the
    path itself; anything else is kept under a visible name."""
    with contextlib.suppress(LedgerError, OSError):
        opened = wsdir.open_parent(path, create=False)
        if opened is None:
            return
        dir_fd, leaf = opened
        try:
            beside = look(dir_fd, leaf).digest
            for role in roles:
                kept = wsdir.mover().drop(
                    dir_fd, wsdir.slot(path, role), keep_for=leaf,
                    held=lambda d: d == beside or (held is not None and held(d)))
                if kept is not None:
                    wsdir.kept.append((path, kept))
        finally:
            os.close(dir_fd)


def sync_dirs(wsdir: WorkspaceDir, paths: Iterable[str]) -> None:
    """fsync the directory of each path once (the one held since the landing): a
    step's renames made durable before the ledger records them."""
    seen: set[str] = set()
    for p in sorted(paths):
        d = p.rpartition("/")[0]
        if d in seen:
            continue
        seen.add(d)
        try:
            opened = wsdir.held_parent(p, check=False)
        except PathEscapes:
            continue
        if opened is None:
            continue
        dir_fd = opened[0]
        try:
            wsdir.ops.tick("ws-dirfsync")
            os.fsync(dir_fd)
        except OSError as exc:
            raise StorageFailure(os.path.join(wsdir.root, d), os.strerror(exc.errno or 0)
                                 ) from None
        finally:
            os.close(dir_fd)


__all__ = ["Landing", "TakeBack", "discard_slots", "finish_aside", "keep_persons_mode", "land",
           "put_aside_back", "release", "roll_back", "sync_dirs", "unland"]

"""The one verified primitive every byte move in a workspace goes through.

A person may save, delete, rename or chmod any file of a workspace at any moment of a
step, and a crash may stop the step between any two system calls. Whatever changes what
a name of the workspace holds — a landing, a take-back after a refusal, an undo, the
settling of a crashed apply, the removal of a temporary — is therefore made of these
moves, and only of them:

- `exchange`: swap a name and a hidden slot in one system call, then read what left
  the namespace (now under the slot) and check it is exactly what this move meant to
  displace. If not, swap back and check that what came back is the move's own file; if
  even that is not so (a second save landed between the two swaps), the file the slot
  holds now is kept under a visible name (`keep`).
- `aside`: rename a name to a hidden slot (never over anything), then check the same;
  a file that is not the one meant goes back under its name, or — if a person made a
  new file there meanwhile — is kept under a visible name.
- `put`: give a hidden file a name, never over anything (a no-replace rename, or a
  hard link then the hidden name's removal); False when the name is taken.
- `drop`: remove a hidden file only once its bytes are shown to be what the caller
  meant to remove — the file it checked after the move (same inode, size and times), or
  bytes of the expected digest, or bytes the ledger holds (`held`). Anything else is
  kept under a visible name and reported: nothing is ever unlinked unverified.
- `rmdir`: remove a directory the step made, only while it is empty.

Checks always read the file after it left the namespace: no name a person can write
is judged and then changed. The one file a person can still reach is one they hold
open (an editor that writes in place through a descriptor, a logger with O_APPEND);
what it writes after a move goes to the inode it holds, which `drop` finds changed and
keeps (docs/guarantees.md).

Without an exchange call (another system, a file system that refuses the flag,
``STEPTRAIL_RENAME_EXCHANGE=off``) a landing is `aside` then `put`: the name is absent
for the moment between the two, and a file a person makes in that moment wins (the
move is refused; nothing is lost). Where neither a no-replace rename nor hard links
exist, `put` checks the name absent and then renames: a file made between the two
calls is replaced — a window `unsafe_fallback` must opt in to (docs/guarantees.md).

Every system call is preceded by a tick on the `FileOps` seam — ``ws-rename`` before
each call that changes what a visible name holds (an exchange, a rename to or from a
visible name, a link that gives one), ``ws-hide`` before a rename between steptrail's
own hidden names, ``ws-unlink``, ``ws-rmdir`` — so the crash harness and the person
injector (`ledger.testing.person`) can act at each one.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from . import exchange as _xchg
from ..blobs import FileOps, fd_chunks, hash_chunks

_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What `look` reports for a name holding something other than a regular file.
NOT_A_FILE: Final = "not a regular file"
#: What marks a file steptrail kept because it could not put it back: a person sees it,
#: and nothing of steptrail ever removes it (it is not a temporary's shape).
KEPT_MARK: Final = ".steptrail-kept-"
#: What a file system without hard links answers `link` with.
_NO_LINKS: Final = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK,
                              getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


#: st_dev -> whether that file system has hard links (probed once per process).
_LINKS_BY_DEVICE: dict[int, bool] = {}


class UnsafeFallbackRefused(OSError):
    """This file system has neither a no-replace rename nor hard links; a move could
    replace a file a person makes at the same moment, and the workspace did not opt in."""


#: Whether moves may fall back to check-then-rename where nothing safer exists (set by
#: `STEPTRAIL_UNSAFE_RENAME=1`; docs/guarantees.md names the window).
unsafe_fallback: bool = os.environ.get("STEPTRAIL_UNSAFE_RENAME", "") not in ("", "0")


@dataclass(frozen=True)
class Seen:
    """What a check read of a file: its digest (None: absent; `NOT_A_FILE`) and the
    inode, size and times it had when the read ended — a later `drop` that finds all
    of them unchanged knows nobody wrote it since."""

    digest: str | None
    ino: int = 0
    dev: int = 0
    size: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0

    def same(self, st: os.stat_result) -> bool:
        return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
            self.ino, self.dev, self.size, self.mtime_ns, self.ctime_ns)


ABSENT: Final = Seen(None)


def look(dir_fd: int, name: str) -> Seen:
    """Read `name` through one descriptor: its digest, and its stat after the read."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES):
            return Seen(NOT_A_FILE)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Seen(NOT_A_FILE, st.st_ino, st.st_dev)
        digest = hash_chunks(fd_chunks(fd))[0]
        st = os.fstat(fd)
        return Seen(digest, st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    finally:
        os.close(fd)


def stat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


Verdict = Literal["ok", "refused", "absent"]


@dataclass(frozen=True)
class Move:
    """How one verified move ended.

    ``ok``: done; `seen` is what left the namespace (checked: what was meant).
    ``refused``: what was there was not what was meant; the name holds `found` again
    (or, in a race, a person's newer file) and nothing was lost. ``absent``: the name
    did not exist. `kept`: a file the move could not put back anywhere safe, now under
    this visible name in the same directory (reported: never removed by steptrail)."""

    verdict: Verdict
    seen: Seen = ABSENT
    found: str | None = None
    kept: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


class Mover:
    """The moves of one directory's worth of work: the seam (`ops`) and the tag kept
    files carry (`keep_tag`, the step's attempt)."""

    def __init__(self, ops: FileOps, keep_tag: str) -> None:
        self.ops = ops
        self.keep_tag = keep_tag

    # -- the system calls, each after its tick ----------------------------------------

    def _exchange(self, dir_fd: int, a: str, b: str) -> None:
        self.ops.tick("ws-rename")
        _xchg.exchange(dir_fd, a, b)

    def _rename(self, dir_fd: int, src: str, dst: str) -> None:
        """Rename to a name only steptrail uses (a fresh or a slot name): nothing of a
        person's can be at `dst`."""
        self.ops.tick("ws-rename")
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def _unlink(self, dir_fd: int, name: str) -> None:
        self.ops.tick("ws-unlink")
        os.unlink(name, dir_fd=dir_fd)

    def can_exchange(self) -> bool:
        return _xchg.supported()

    # -- the moves ---------------------------------------------------------------------

    def exchange(self, dir_fd: int, name: str, slot: str, expect: str | None | object,
                 incoming: str) -> Move:
        """Swap `slot` (holding bytes of digest `incoming`, ours) into `name`, then check
        what left: `expect` (a digest; `ANY` accepts whatever regular file was there).
        Refused: swapped back, and the slot checked to hold `incoming` again; if it holds
        anything else (a second save landed on `name` between the swaps) that file is
        kept visible. Raises `exchange.Unsupported` (nothing moved) where the call is
        missing; FileNotFoundError (nothing moved) when `name` is absent."""
        ours = stat_at(dir_fd, slot)
        self._exchange(dir_fd, slot, name)
        seen = look(dir_fd, slot)
        if expect is ANY_FILE and seen.digest not in (None, NOT_A_FILE) or seen.digest == expect:
            return Move("ok", seen)
        self._exchange(dir_fd, slot, name)
        back = look(dir_fd, slot)
        if back.digest == incoming:
            _carry_chmod(dir_fd, slot, name, ours)
            return Move("refused", found=seen.digest)
        # the name was saved again between the swaps: that save is in the slot now
        return Move("refused", found=seen.digest, kept=self.keep(dir_fd, slot, name))

    def hide(self, dir_fd: int, src: str, slot: str) -> None:
        """Rename the file `src` (a fresh temporary of ours) to the hidden `slot`, never
        over anything (FileExistsError)."""
        self.ops.tick("ws-hide")
        self._to_hidden(dir_fd, src, slot)

    def check_safe(self, dir_fd: int, own: str) -> None:
        """Refuse (UnsafeFallbackRefused), before anything is moved, a directory where a
        name could only be given by check-then-rename: no exchange call (so no no-replace
        rename either) and no hard links — tried on `own`, a fresh temporary of ours —
        unless the user accepted that window (`unsafe_fallback`)."""
        if _xchg.supported() or unsafe_fallback:
            return
        dev = os.fstat(dir_fd).st_dev
        if dev not in _LINKS_BY_DEVICE:
            probe = own + ".l"  # a second name of our own fresh file: nothing to move
            _LINKS_BY_DEVICE[dev] = _hard_link(dir_fd, own, probe)
            if _LINKS_BY_DEVICE[dev]:
                os.unlink(probe, dir_fd=dir_fd)
        if not _LINKS_BY_DEVICE[dev]:
            raise UnsafeFallbackRefused(errno.ENOTSUP, "no no-replace rename and no hard links")

    def drop_own(self, dir_fd: int, name: str, identity: tuple[int, int]) -> None:
        """Remove a temporary this process created (O_EXCL under a fresh random name) and
        is abandoning part-written, only while `name` is still that inode."""
        st = stat_at(dir_fd, name)
        if st is not None and (st.st_dev, st.st_ino) == identity:
            self._unlink(dir_fd, name)

    def aside(self, dir_fd: int, name: str, slot: str, expect: str | None | object) -> Move:
        """Move `name` to the hidden `slot` (which must not exist: the caller cleared it),
        then check it is `expect`; if not, it goes back under `name` — or, if a new file
        took the name meanwhile, is kept visible."""
        self.ops.tick("ws-rename")
        try:
            self._to_hidden(dir_fd, name, slot)
        except FileNotFoundError:
            return Move("absent")
        seen = look(dir_fd, slot)
        if expect is ANY_FILE and seen.digest not in (None, NOT_A_FILE) or seen.digest == expect:
            return Move("ok", seen)
        if self.put(dir_fd, slot, name):
            return Move("refused", found=seen.digest)
        return Move("refused", found=seen.digest, kept=self.keep(dir_fd, slot, name))

    def put(self, dir_fd: int, src: str, name: str) -> bool:
        """Give the hidden file `src` the name `name`, never over anything: True, `src`
        gone; False, `name` is taken (nothing moved)."""
        self.ops.tick("ws-rename")
        try:
            self._noreplace(dir_fd, src, name)
        except FileExistsError:
            return False
        return True

    def link(self, dir_fd: int, src: str, name: str) -> bool:
        """Make `name` a second name of the hidden file `src` (a create: the slot keeps
        its name as the crash evidence `landed` reads). False: `name` is taken. Where
        there are no hard links, `src` is renamed to `name` (no-replace)."""
        self.ops.tick("ws-rename")
        try:
            if _hard_link(dir_fd, src, name):
                return True
            self._noreplace(dir_fd, src, name)
        except FileExistsError:
            return False
        return True

    def _to_hidden(self, dir_fd: int, name: str, slot: str) -> None:
        """Rename the visible `name` to the hidden `slot`: one atomic rename, whatever
        `name` holds at that instant goes (and is checked after). Never over an existing
        slot (FileExistsError): a slot only ever holds steptrail's own files, but those
        are evidence a caller judges first."""
        if _xchg.supported():
            try:
                _xchg.rename_noreplace(dir_fd, name, slot)
                return
            except _xchg.Unsupported:
                pass
        if stat_at(dir_fd, slot) is not None:  # only steptrail writes slot names
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), slot)
        os.rename(name, slot, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def _noreplace(self, dir_fd: int, src: str, dst: str) -> None:
        """Rename the hidden file `src` to `dst` only if `dst` does not exist
        (FileExistsError). Without a no-replace rename: `dst` hard-linked to `src` (link
        refuses an existing name), then `src`, a second name, removed."""
        if _xchg.supported():
            try:
                _xchg.rename_noreplace(dir_fd, src, dst)
                return
            except _xchg.Unsupported:
                pass
        st = stat_at(dir_fd, src)
        if st is not None and stat.S_ISDIR(st.st_mode):
            # a directory a person put where a file was, moved aside and going back: a
            # rename of a directory never replaces a file (ENOTDIR) nor a directory
            # holding anything (ENOTEMPTY)
            if stat_at(dir_fd, dst) is not None:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
            os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        if _hard_link(dir_fd, src, dst):  # link refuses an existing name
            self._unlink_second_name(dir_fd, src, dst)
            return
        if not unsafe_fallback:
            raise UnsafeFallbackRefused(
                errno.ENOTSUP, "this file system has neither renameat2's RENAME_NOREPLACE nor"
                " hard links, so a move could replace a file a person saves at that moment;"
                " set STEPTRAIL_UNSAFE_RENAME=1 to accept that window (docs/guarantees.md)")
        if stat_at(dir_fd, dst) is not None:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def _unlink_second_name(self, dir_fd: int, name: str, other: str) -> None:
        """Remove `name`, a second link of `other`'s inode: nothing is lost while
        `other` still names it; if it does not (a person replaced `other`), `name`
        stays for `drop` to judge."""
        a, b = stat_at(dir_fd, name), stat_at(dir_fd, other)
        if a is not None and b is not None and (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev):
            self._unlink(dir_fd, name)

    def drop(self, dir_fd: int, name: str, seen: Seen | None = None, *,
             expect: frozenset[str] = frozenset(),
             held: Callable[[str], bool] | None = None, twin: str | None = None,
             keep_for: str | None = None) -> str | None:
        """Remove the hidden file `name` once its bytes are shown to be what the caller
        meant to remove: unchanged since `seen` (same inode, size and times), a second
        link of `twin` (the same inode as that name: nothing is lost), of a digest in
        `expect`, or held by the ledger (`held(digest)`). Anything else is kept under a
        visible name (beside `keep_for`, the leaf it belongs to; default `name`'s own
        prefix) and that name returned. Absent, or not a regular file: left, None."""
        st = stat_at(dir_fd, name)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        ok = seen is not None and seen.digest not in (None, NOT_A_FILE) and seen.same(st)
        if not ok and twin is not None:
            other = stat_at(dir_fd, twin)
            ok = other is not None and (other.st_ino, other.st_dev) == (st.st_ino, st.st_dev)
        if not ok and seen is not None and seen.digest not in (None, NOT_A_FILE):
            expect = expect | {seen.digest}  # touched since (a link count, a time): re-read
        if not ok and (expect or held is not None):
            now = look(dir_fd, name)
            ok = now.digest in expect or (
                held is not None and now.digest not in (None, NOT_A_FILE) and held(now.digest))
        if ok:
            try:
                self._unlink(dir_fd, name)
            except FileNotFoundError:
                pass
            return None
        return self.keep(dir_fd, name, keep_for)

    def keep(self, dir_fd: int, hidden: str, leaf: str | None = None) -> str:
        """Give a hidden file a visible name, ``LEAF.steptrail-kept-TAG`` (``-2``, ``-3``…
        when taken), never over anything; returns it."""
        base = leaf if leaf is not None else hidden.lstrip(".").split(".steptrail-")[0] or "file"
        budget = 255 - len(KEPT_MARK) - len(self.keep_tag) - 4
        base = base.encode()[:max(budget, 1)].decode("utf-8", "ignore")
        for n in range(1, 1000):
            candidate = f"{base}{KEPT_MARK}{self.keep_tag}" + ("" if n == 1 else f"-{n}")
            self.ops.tick("ws-rename")
            try:
                self._noreplace(dir_fd, hidden, candidate)
            except FileExistsError:
                continue
            return candidate
        raise FileExistsError(errno.EEXIST, "no free name to keep a file under", hidden)

    def rmdir(self, dir_fd: int, name: str) -> bool:
        """Remove the directory `name` if it is empty (a directory holds no bytes: only an
        empty one goes). False: not empty, or gone."""
        self.ops.tick("ws-rmdir")
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            return False
        return True


class _Any:
    def __repr__(self) -> str:
        return "ANY_FILE"


#: An `expect` that accepts whatever regular file was displaced (a write fenced "none").
ANY_FILE: Final = _Any()


def _carry_chmod(dir_fd: int, slot: str, name: str, ours: os.stat_result | None) -> None:
    """Our file (`ours` when it went in) was at `name` for a moment and is back in `slot`:
    a chmod made of `name` meanwhile went to our file — it is the person's, and goes to
    the file at `name` again (a regular file, never through a symlink)."""
    now = stat_at(dir_fd, slot)
    if ours is None or now is None or (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino):
        return
    bits = stat.S_IMODE(now.st_mode)
    if bits == stat.S_IMODE(ours.st_mode):
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, bits)
    except OSError:
        pass
    finally:
        os.close(fd)


def _hard_link(dir_fd: int, src: str, dst: str) -> bool:
    """Hard-link `src` as `dst` (FileExistsError if `dst` exists): True; False where the
    file system has no hard links (FAT, some network and FUSE file systems)."""
    try:
        os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NO_LINKS:
            return False
        raise
    return True


def is_kept_name(name: str) -> bool:
    """True for a name `Mover.keep` gives."""
    return KEPT_MARK in name


__all__ = ["ABSENT", "ANY_FILE", "KEPT_MARK", "NOT_A_FILE", "Move", "Mover", "Seen",
           "UnsafeFallbackRefused", "is_kept_name", "look", "stat_at"]

"""Waiting for a workspace to change: `Watcher`, for `steptrail observe --watch`.

On Linux the kernel says when (inotify, through the C library: no dependency): every
directory of the tree is watched for a file written and closed, created, deleted, moved
in or out, or its attributes changed; a directory created later is watched when it
appears. Elsewhere, or when the kernel's watch limit is reached
(``fs.inotify.max_user_watches``), the tree is looked at every `interval` seconds
instead — said once in `why_polling`.

A watcher only says *that* something may have changed: `observe` decides what did (its
stat walk, its cache, its checks). So an event missed or merged costs nothing but a
later look, and an event of steptrail's own (a step's write) is only a look that finds
nothing to record. `.git`, the ledger's own directory and the directories git ignores
are not watched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import time
from collections.abc import Callable, Iterable
from typing import Final

_IN_MODIFY: Final = 0x00000002
_IN_ATTRIB: Final = 0x00000004
_IN_CLOSE_WRITE: Final = 0x00000008
_IN_MOVED_FROM: Final = 0x00000040
_IN_MOVED_TO: Final = 0x00000080
_IN_CREATE: Final = 0x00000100
_IN_DELETE: Final = 0x00000200
_IN_DELETE_SELF: Final = 0x00000400
_IN_MOVE_SELF: Final = 0x00000800
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_ISDIR: Final = 0x40000000
_IN_ONLYDIR: Final = 0x01000000
_IN_DONT_FOLLOW: Final = 0x02000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
_MASK: Final = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
                | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
                | _IN_DONT_FOLLOW)
_EVENT: Final = struct.Struct("iIII")


class Watcher:
    """Says when the tree under `root` may have changed (see the module). `skip(path)`:
    whether a directory (relative to `root`, '' the root) is left unwatched.

    >>> from pathlib import Path
    >>> from ledger import Watcher
    >>> Path("tree").mkdir()
    >>> w = Watcher("tree", lambda rel: False, interval=0.1)
    >>> _ = Path("tree/a.txt").write_text("x")
    >>> w.wait(5.0)
    True
    >>> w.close()
    """

    def __init__(self, root: str, skip: Callable[[str], bool], *, interval: float = 2.0
                 ) -> None:
        self.root, self.skip, self.interval = root, skip, interval
        self.fd: int | None = None
        self.why_polling = ""
        self._wds: dict[int, str] = {}
        self._libc: ctypes.CDLL | None = None
        try:
            name = ctypes.util.find_library("c")
            self._libc = ctypes.CDLL(name, use_errno=True)
            init = self._libc.inotify_init1
        except (OSError, AttributeError, TypeError):
            self.why_polling = "no inotify here: the tree is looked at every interval"
            return
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            self.why_polling = f"inotify unavailable ({os.strerror(ctypes.get_errno())})"
            return
        self.fd = fd
        self._add_tree("")

    def _add(self, rel: str) -> bool:
        assert self._libc is not None and self.fd is not None
        path = os.path.join(self.root, rel) if rel else self.root
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC:  # the kernel's watch limit: fall back to looking
                self.why_polling = ("the kernel's inotify watch limit is reached"
                                    " (fs.inotify.max_user_watches): the tree is looked at"
                                    " every interval")
                self.close()
            return False
        self._wds[wd] = rel
        return True

    def _add_tree(self, rel: str) -> None:
        stack = [rel]
        while stack and self.fd is not None:
            here = stack.pop()
            if self.skip(here) or not self._add(here):
                continue
            try:
                with os.scandir(os.path.join(self.root, here) if here else self.root) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(f"{here}/{e.name}" if here else e.name)
            except OSError:
                continue

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when something may have changed (always
        True once per `interval` when polling)."""
        if self.fd is None:
            time.sleep(min(timeout, self.interval))
            return True
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        changed = moved = False
        for mask, rel in self._drain():
            changed = True
            if mask & _IN_Q_OVERFLOW:
                moved = True  # events were lost: watch the tree anew
            elif mask & _IN_ISDIR and mask & (_IN_MOVED_FROM | _IN_MOVED_TO):
                moved = True  # a renamed directory: its watches' paths are stale
            elif mask & _IN_ISDIR and mask & _IN_CREATE:
                self._add_tree(rel)
        if moved:
            self._rewatch()
        return changed

    def _rewatch(self) -> None:
        """Every watch dropped and the tree watched again from its root (after a
        directory was renamed, or the kernel's queue overflowed)."""
        assert self._libc is not None
        self.close()
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            self.why_polling = f"inotify unavailable ({os.strerror(ctypes.get_errno())})"
            return
        self.fd, self._wds = fd, {}
        self._add_tree("")

    def _drain(self) -> Iterable[tuple[int, str]]:
        assert self.fd is not None
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                return
            off = 0
            while off + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, off)
                raw = data[off + _EVENT.size:off + _EVENT.size + length].rstrip(b"\0")
                off += _EVENT.size + length
                base = self._wds.get(wd, "")
                name = os.fsdecode(raw)
                yield mask, (f"{base}/{name}" if base else name) if name else base

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


__all__ = ["Watcher"]

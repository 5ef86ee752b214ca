"""Atomic exchange and no-replace renames: the system calls a fenced write stands on.

A fenced write must land only where the file still holds what the planner read. Checking
the file and then renaming over it leaves a window in which a person's save is
overwritten unseen. The kernel closes it: ``renameat2(RENAME_EXCHANGE)`` swaps two names
in one step, so the bytes displaced by a write are kept (under the staged file's name)
and can be hashed *after* the swap; if they are not the planned pre-image the swap is
undone and nothing of the person's is lost. ``RENAME_NOREPLACE`` creates a name only if
nothing holds it. macOS has the same pair as ``renameatx_np(RENAME_SWAP / RENAME_EXCL)``.

Where neither call exists (another OS, an old C library, a file system that refuses the
flags, or ``STEPTRAIL_RENAME_EXCHANGE=off`` for tests) `supported()` says so, and callers
fall back to check-then-rename (docs/guarantees.md gives the window that leaves).

Nothing here knows about ledgers: descriptors and names in, `OSError` out.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Final

#: Linux's flags (uapi/linux/fs.h) and macOS's (sys/stdio.h).
_LINUX_NOREPLACE: Final = 1
_LINUX_EXCHANGE: Final = 2
_MAC_SWAP: Final = 0x2
_MAC_EXCL: Final = 0x4
#: The errnos that mean "this system or file system has no such call": fall back.
UNSUPPORTED_ERRNOS: Final = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                       getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


def _load() -> tuple[object | None, int, int]:
    if os.environ.get("STEPTRAIL_RENAME_EXCHANGE", "").lower() in ("off", "0", "no"):
        return None, 0, 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None, 0, 0
    if sys.platform == "darwin":
        fn = getattr(libc, "renameatx_np", None)
        flags = (_MAC_SWAP, _MAC_EXCL)
    else:
        fn = getattr(libc, "renameat2", None)
        flags = (_LINUX_EXCHANGE, _LINUX_NOREPLACE)
    if fn is None:
        return None, 0, 0
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn, flags[0], flags[1]


_CALL, _EXCHANGE, _NOREPLACE = _load()


class Unsupported(OSError):
    """The system call or its flag is missing here (or refused by this file system)."""


def supported() -> bool:
    """Whether this process found an exchange call at all (a file system may still refuse
    it: `exchange`/`rename_noreplace` raise `Unsupported` then)."""
    return _CALL is not None


def _call(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    if _CALL is None:
        raise Unsupported(errno.ENOSYS, "no renameat2/renameatx_np here")
    rc = _CALL(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags)  # type: ignore[operator]
    if rc != 0:
        err = ctypes.get_errno()
        if err in UNSUPPORTED_ERRNOS:
            raise Unsupported(err, os.strerror(err))
        raise OSError(err, os.strerror(err), dst)


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap names `a` and `b` of directory `dir_fd` atomically (both must exist:
    FileNotFoundError otherwise)."""
    _call(dir_fd, a, dir_fd, b, _EXCHANGE)


def rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Rename `src` to `dst` in directory `dir_fd` only if `dst` does not exist
    (FileExistsError otherwise), atomically."""
    _call(dir_fd, src, dir_fd, dst, _NOREPLACE)


__all__ = ["Unsupported", "exchange", "rename_noreplace", "supported"]

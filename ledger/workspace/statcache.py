"""The stat cache of `observe` (ledger/step/observe.py): each file's size, times, inode and
mode at the last look, with the digest of its bytes then — a hint that lets an unchanged
file go unread. Kept beside a ledger file (``<ledger dir>/observe-cache/``) or, for a ledger
in a database, in the user's cache directory; one file per workspace, replaced whole
(a temporary file renamed over it). A cache that is missing, unreadable or written for
another directory is no hint at all: every file is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

import msgspec


def cache_path(ledger_dir: str | None, ledger_id: str, name: str) -> str:
    """Where workspace `name`'s stat cache lives: beside a ledger file (`ledger_dir`),
    else in the user's cache directory; `ledger_id` tells two ledgers apart."""
    key = hashlib.sha256(f"{ledger_id}\0{name}".encode()).hexdigest()[:24]
    if ledger_dir is not None:
        base = os.path.join(ledger_dir, "observe-cache")
    else:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        base = os.path.join(home, "steptrail", "observe")
    return os.path.join(base, f"{key}.cache")


class Cached(msgspec.Struct, array_like=True):
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    mode: int
    digest: str
    #: whether the stat may stand for the digest next time (False: the file was modified
    #: within RACY_NS of the look; only its mode is a hint then)
    trusted: bool
    #: the path's ledger revision at that look: its mode then is the recorded one while
    #: the revision stays (-1: unknown)
    rev: int


class CacheFile(msgspec.Struct):
    root: str
    dev: int
    ino: int
    looked_ns: int
    files: dict[str, Cached]


# -- the stat cache -------------------------------------------------------------------------


def load_cache(path: str, root: str, ident: tuple[int, int]) -> dict[str, Cached]:
    """The cache of the last look, or nothing: a file that does not parse, or that was
    written for another directory (a moved or swapped root), is no hint."""
    try:
        with open(path, "rb") as f:
            got = msgspec.msgpack.decode(f.read(), type=CacheFile)
    except (OSError, msgspec.DecodeError):
        return {}
    if (got.root, got.dev, got.ino) != (root, *ident):
        return {}
    return got.files


def save_cache(path: str, root: str, ident: tuple[int, int], looked_ns: int,
               files: dict[str, tuple[int, int, int, int, int, str, bool, int]]) -> None:
    """Write the cache (a temporary file renamed over it); best effort: a cache that
    cannot be written only makes the next look hash again."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        data = msgspec.msgpack.encode(CacheFile(
            root=root, dev=ident[0], ino=ident[1], looked_ns=looked_ns,
            files={p: Cached(*v) for p, v in files.items()}))
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".observe-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)



__all__ = ["Cached", "CacheFile", "cache_path", "load_cache", "save_cache"]

"""What no step may touch inside a workspace, and how a file is told apart from another.

A `Boundary` names the ledger's own directories and files (checked by device and inode
for every directory a walk passes through, the root included, and for the leaf) and
their resolved paths (refused by name as well, so one not created yet is covered).
``.git`` (unless a workspace opted in) and any ledger's ``.steptrail`` directory are
refused by name, under every spelling a file system reads as the same name.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Final

#: Code points HFS+ ignores in names (git's is_hfs_dotgit): ".gi\u200ct" is ".git" there.
_HFS_IGNORED: Final = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F),
                                     *range(0x206A, 0x2070), 0xFEFF])
FileIdentity = tuple[int, int]  # (st_dev, st_ino)


def same_file(st: os.stat_result | None, other: os.stat_result) -> bool:
    return st is not None and identity_of(st) == identity_of(other)


def identity_of(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino)


#: The directory a ledger lives in by default (`.steptrail/ledger.db`).
LEDGER_DIR_NAME: Final = ".steptrail"


def is_ledger_dir_name(name: str) -> bool:
    """True for a path component that names a ledger's default directory (any case, the
    same normalisation as `is_git_name`)."""
    return name.translate(_HFS_IGNORED).rstrip(". ").casefold() == LEDGER_DIR_NAME


def is_git_name(name: str) -> bool:
    """True for a path component git would read as ``.git``: any case, HFS+-ignored code
    points removed, NTFS trailing dots and spaces stripped."""
    return name.translate(_HFS_IGNORED).rstrip(". ").casefold() == ".git"


@dataclass(frozen=True)
class Boundary:
    """What no step may touch inside any workspace: the ledger's own files.

    `dirs`: identities of directories no walk enters and no root is — the ledger's
    directory (the ledger file, its ``-wal``/``-shm``/``-lockq``, the GC lock) and the
    blob root; `stores`: identities of directories no root lies inside (the blob root);
    `leaves`: identities of files never opened (the ledger file, the witness);
    `dir_paths`/`leaf_paths`: their resolved paths, so that one not created yet (a
    witness made on first use) is refused by name as well. A root below the ledger's
    directory but outside the blob root reaches none of them (the ledger's files are
    direct entries of its directory) and is allowed: `ledger.db` beside `ws/`.
    """

    dirs: frozenset[FileIdentity] = frozenset()
    stores: frozenset[FileIdentity] = frozenset()
    leaves: frozenset[FileIdentity] = frozenset()
    dir_paths: tuple[str, ...] = ()
    leaf_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, ledger_dir: str | None, blob_root: str | None, files: list[str]) -> Boundary:
        """The boundary of a ledger (missing paths count by name only; a ledger in a
        database has no directory or blob root here: None)."""
        if ledger_dir is None or blob_root is None:
            return cls(frozenset(), frozenset(), frozenset(
                identity_of(os.stat(p)) for p in files if os.path.exists(p)),
                (), tuple(os.path.realpath(p) for p in files))
        def ids(paths: list[str]) -> frozenset[FileIdentity]:
            out = set()
            for p in paths:
                with contextlib.suppress(OSError):
                    out.add(identity_of(os.stat(p)))
            return frozenset(out)

        return cls(ids([ledger_dir, blob_root]), ids([blob_root]), ids(files),
                   (os.path.realpath(ledger_dir), os.path.realpath(blob_root)),
                   tuple(os.path.realpath(p) for p in files))

    def names(self, root: str, path: str) -> str | None:
        """The boundary path inside `root` that `root/path` equals or lies under, if any
        (case-insensitively: a case-insensitive file system reaches it under any case)."""
        inside = root.rstrip("/").casefold() + "/"
        target = (inside + path).casefold()
        for p in self.dir_paths + self.leaf_paths:
            q = p.casefold()
            if q.startswith(inside) and (target == q or target.startswith(q + "/")):
                return p
        return None


LEDGER_FIX: Final = ("steps never write the ledger's own files; keep the ledger outside the"
                     " paths steps write (its default place, .steptrail/ at the workspace"
                     " root, is such a place)")


__all__ = ["LEDGER_DIR_NAME", "LEDGER_FIX", "Boundary", "FileIdentity", "identity_of", "is_git_name",
           "is_ledger_dir_name", "same_file"]

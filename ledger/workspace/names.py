"""The names steptrail gives its own files inside a workspace.

A write is staged under a temporary name beside its target; a fenced write's journal on
disk is a *slot*, a name fixed per (path, epoch, attempt, role) so that a crashed call's
leftovers are found again by the next one. Both have the shape
``.<name prefix>.steptrail-<epoch hex>-<attempt tag>-<8 hex>.tmp`` (`temp_name`): the
stamp tells whose it is (`temp_stamp`), so a dead stager's leftovers are recognised and
collected — never a live stager's, never a user's file (`staging.remove_temporaries`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from typing import Final

TMP_MARK: Final = ".steptrail-"
#: Bytes of the target's name a temporary's name repeats (for a person reading a
#: listing); the rest of the name is the mark, the stamp and the random part.
TMP_PREFIX_BYTES_MAX: Final = 80
#: A staged temporary: ``.<name prefix>.steptrail-<epoch hex>-<attempt tag>-<random>.tmp``.
#: ``.<name prefix>.steptrail-<12 hex>.tmp`` is what steptrail before modes and stamps
#: left (epoch 0: dead under any live epoch).
_TMP_NAME: Final = re.compile(
    r"\..*\.steptrail-(?:([0-9a-f]{1,16})-([0-9a-f]{8})-[0-9a-f]{8}|[0-9a-f]{12})\.tmp",
    re.DOTALL)


def attempt_tag(step: str, attempt: int) -> str:
    """The 8 hex digits that name an attempt in its temporaries' names."""
    return hashlib.sha256(f"{step}\0{attempt}".encode()).hexdigest()[:8]


def temp_name(leaf: str, epoch: int, tag: str, name_max: int = 255,
              slot: str | None = None) -> str:
    """A temporary's name beside `leaf`, at most `name_max` bytes: the leaf is cut (at a
    character boundary) to what the budget leaves after the stamp. Fresh (random) unless
    `slot` is given: then the same (leaf, epoch, attempt, slot) always gives the same name
    — a fenced write's journal on disk (`WorkspaceDir.slot`)."""
    tail = secrets.token_hex(4) if slot is None else \
        hashlib.sha256(f"{slot}\0{leaf}".encode()).hexdigest()[:8]
    suffix = f"{TMP_MARK}{epoch:x}-{tag}-{tail}.tmp"
    budget = min(TMP_PREFIX_BYTES_MAX, name_max - 1 - len(suffix))
    prefix = leaf.encode()[:max(budget, 0)].decode("utf-8", "ignore")
    return f".{prefix}{suffix}"


#: The roles of slot names (`WorkspaceDir.slot`): a fixed name per (path, epoch, attempt,
#: role). ``t`` is a take-back's: where it moves the step's own file aside to check it.
SLOT_ROLES: Final = "xyut"


def _role(name: str) -> str | None:
    """A stamped temporary's role: a slot's (`SLOT_ROLES`), "" for a scratch copy (a fresh
    random tail); None for any other name, or one whose leaf was cut too short to tell."""
    m = _TMP_NAME.fullmatch(name)
    if m is None or m.group(1) is None:
        return None
    leaf = name[1:].split(TMP_MARK, 1)[0]
    if len(leaf.encode()) >= TMP_PREFIX_BYTES_MAX - 4:
        return None
    tail = name[-12:-4]
    return next((r for r in SLOT_ROLES
                 if tail == hashlib.sha256(f"{r}\0{leaf}".encode()).hexdigest()[:8]), "")


def is_scratch(name: str) -> bool:
    """True for a temporary `temp_name` made with a fresh random tail (a stager's own
    scratch copy: only ever written by its stager, from bytes the ledger holds), False
    for a slot (`WorkspaceDir.slot`: it may hold what a move displaced) — or a name too
    long to tell (its leaf cut short): judged as a slot, by its content."""
    return _role(name) == ""


def slot_role(name: str) -> str | None:
    """The role (`SLOT_ROLES`) of a slot's name (`WorkspaceDir.slot`); None for any
    other name — a scratch temporary, or a name too long to tell (its leaf cut short)."""
    return _role(name) or None


def temp_stamp(name: str) -> tuple[int, str] | None:
    """(epoch, attempt tag) of a name `temp_name` made; None for any other name."""
    m = _TMP_NAME.fullmatch(name)
    if m is None:
        return None
    return (0, "") if m.group(1) is None else (int(m.group(1), 16), m.group(2))



def leaf_of_temp(name: str) -> str:
    """The target's name a temporary's name repeats (cut, possibly: then not a name)."""
    return name[1:].split(TMP_MARK, 1)[0]


def name_max(where: int | str) -> int:
    """NAME_MAX of the file system holding a directory (a descriptor or a path); 255
    when the system does not say."""
    try:
        limit = os.fpathconf(where, "PC_NAME_MAX") if isinstance(where, int) else \
            os.pathconf(where, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
    return limit if limit > 0 else 255



__all__ = ["SLOT_ROLES", "TMP_MARK", "attempt_tag", "is_scratch", "leaf_of_temp", "name_max",
           "slot_role", "temp_name", "temp_stamp"]

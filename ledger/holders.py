"""Who holds a lease that steptrail took for itself, named precisely enough to tell later
that the process is gone (docs/time-travel.md "Rewind", docs/mcp.md "Leases").

steptrail takes leases in its own name in two places: a one-call lease of an observation,
a rewind or a fork, and the lease an MCP server keeps for its agent. A holder of either
killed midway leaves the lease live until its TTL; the next call takes it over instead
of waiting, but only when it can prove the holder is gone:

``steptrail-WHAT@HOST+MACHINE:PID:START``

- ``HOST`` the host name (for people reading `status`);
- ``MACHINE`` a short digest of this kernel's boot id and this process's pid namespace:
  two containers that share a host name and a ledger (a bind-mounted `.steptrail/`)
  see different processes under one pid — a pid absent here may be a live process
  there — so a holder is judged only where ``MACHINE`` is this process's own;
- ``PID`` and ``START`` (its start time in clock ticks since boot) tell a reused pid.

`is_gone` says True only for such a name, of one of the asked kinds, of this machine,
whose process no longer exists, is a zombie, or is another process now. Any other
holder — an agent's, another machine's, an older steptrail's name without ``MACHINE`` —
is alive as far as steptrail knows: its lease is waited out, never taken.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
from collections.abc import Iterable
from typing import Final

#: The one-call leases steptrail takes (`holder`): an observation, a rewind, a fork.
ONE_CALL: Final = ("observe", "rewind", "fork")

_NAME = re.compile(r"steptrail-(?P<what>[a-z]{1,16})@(?P<host>[A-Za-z0-9.-]{1,64})"
                   r"\+(?P<machine>[0-9a-f]{12}):(?P<pid>[1-9][0-9]{0,9}):(?P<start>[0-9]{1,20})")


def host() -> str:
    """This machine's host name as a holder carries it ([A-Za-z0-9.-], at most 64)."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "host"


@functools.cache
def machine() -> str:
    """12 hex digits naming where a pid means one process: this boot of the kernel and
    this process's pid namespace. Without /proc (not Linux) only the host name is known:
    the digest of that, and pids are then judged with kill(0)."""
    parts = [host()]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            parts.append(f.read().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("no-proc")
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


@functools.cache
def _own_proc() -> bool:
    """Whether /proc describes this process's pid namespace: a sandbox that made a new
    one without mounting its own /proc (``unshare --pid --fork``) still shows the
    parent's pids there — a live holder's pid would look gone, and a start time read
    there would be another process's. Without it no holder is ever judged gone."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return not os.path.isdir("/proc")  # no /proc at all: kill(0) is asked instead


def start_time(pid: int) -> str | None:
    """Process `pid`'s start time (clock ticks since boot, Linux's /proc/PID/stat field
    22); None where it cannot be read."""
    state = _stat(pid)
    return state[19] if state is not None and len(state) > 19 else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None: no such process (or
    no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def holder(what: str) -> str:
    """The holder of a lease steptrail takes for `what` in this process."""
    pid = os.getpid()
    return f"steptrail-{what}@{host()}+{machine()}:{pid}:{start_time(pid) or 0}"


def is_gone(name: str, kinds: Iterable[str] = ONE_CALL) -> bool:
    """Whether `name` is a holder of one of `kinds` (`holder`) whose process, on this
    machine, is gone, a zombie, or another process now (see the module's docstring)."""
    m = _NAME.fullmatch(name)
    if m is None or m["what"] not in tuple(kinds) or m["machine"] != machine() \
            or m["host"] != host() or not _own_proc():
        return False
    pid, start = int(m["pid"]), m["start"]
    if pid == os.getpid():  # this very process, or one this pid named before it
        return start != "0" and start != (start_time(pid) or "0")
    if not os.path.isdir("/proc/self"):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    if not os.path.exists(f"/proc/{pid}"):
        return True
    state = _stat(pid)
    if state is None:  # it went between the two looks, or it cannot be read
        return not os.path.exists(f"/proc/{pid}")
    if state[:1] in (["Z"], ["X"]):
        return True
    return start != "0" and len(state) > 19 and state[19] != start


__all__ = ["ONE_CALL", "holder", "host", "is_gone", "machine", "start_time"]

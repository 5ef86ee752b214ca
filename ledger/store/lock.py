"""The store's lock: re-entrant, and it knows whether the calling thread holds it
(`owned`) — what `EventLog.append` asks to tell a nested append (this thread inside its
own transaction, read, or any section it locked) from one to group with others'. An
`RLock` whose owner is kept beside it: no private API of the interpreter's lock.
"""

from __future__ import annotations

import threading
from typing import Any

_ident = threading.get_ident


class StoreLock:
    """A re-entrant lock that knows its owner (see the module). `reads` counts this
    owner's read transactions open, `writes` its write transactions: an append inside
    a read alone is refused by the log, not attempted."""

    __slots__ = ("_lock", "_owner", "_depth", "reads", "writes", "reads_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: The same lock without the owner kept: for a locked view's reads (`locked_view`),
        #: which never append, so nothing asks `owned` inside them — the cheap way in for
        #: the many small reads of a step (a C-level `with`, no Python call).
        self.reads_lock = self._lock
        self._owner = 0
        self._depth = 0
        self.reads = 0
        self.writes = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = _ident()
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = 0
        self._lock.release()

    # (`with` is the hot path — a locked view takes the lock for each read — so these do
    # the work of `acquire` and `release` themselves: one call each, not two)
    def __enter__(self) -> bool:
        self._lock.acquire()
        self._owner = _ident()
        self._depth += 1
        return True

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = 0
        self._lock.release()

    def owned(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == _ident()

    def reading_only(self) -> bool:
        """Whether the calling thread is inside a read transaction of the store and no
        write transaction (an append there could not commit)."""
        return self._owner == _ident() and self.reads > 0 and self.writes == 0


__all__ = ["StoreLock"]

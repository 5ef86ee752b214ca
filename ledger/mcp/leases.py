"""The workspace leases of `steptrail mcp`: one per write, never one per server.

Every MCP client spawns its own server, so several processes write one ledger; a
server that held a workspace's lease for its life would lock the others out. Here a
write takes the lease for itself (`Leases.hold`):

1. this machine's slot for the workspace (`_Slot`: a lock file beside the ledger) —
   servers queue there, one non-blocking ``flock`` try at a time, instead of polling
   the ledger's write lock with `acquire`s that would slow the holder's commits;
2. ``ledger.workspaces.acquire`` with a short TTL: a new epoch, which settles whatever an older
   epoch left in flight (a SIGKILLed server's applied, unpublished write is put back).
   A live holder of another kind (a person's ``steptrail lease acquire``, a server on
   another machine) is waited for with backoff, for a bounded time; a holder that is a
   steptrail mcp process of this machine that is gone is taken over at once
   (`holder_is_dead`: its pid is dead, a zombie, or another process's now).

The slot is only a queue, never the arbiter: its files are opened without following a
symlink and only if they are regular files, waiting never blocks, and a slot that stays
taken for a second (a stopped or stuck process may hold the file) is passed over — the
lease itself decides then, as it would without the queue.

After the write the lease is kept for this server's next write for at most `linger_s`
(and never past half its TTL): a lone agent's consecutive writes skip an acquire and a
release each. While another server waits for the slot, the lease is still kept for the
rest of this server's *turn* — `turn_s` (`TURN_S`, 50 ms, at most `linger_s`) from when
it took the lease — as long as its client keeps calling: several agents on one workspace then write
a few calls per acquire instead of paying an acquire and a release (two commits) for
every call, and each waits at most a turn (plus the call under way) per server ahead of
it. A timer looks every 20 ms and lets the lease go once the turn is over and someone
waits, once the client has made no call for a timer period while someone waits, or once
the server has been idle for `linger_s`; a server keeps at most one workspace's lease, so
two servers never each keep one while waiting for the other's. ``linger_s`` 0 releases
after every write (no turn).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from ledger import LeaseHeld, Ledger, LedgerError, StaleEpoch, holders
from ledger.fmt import iso

log = logging.getLogger("steptrail.mcp")

#: How long a server keeps a workspace's lease for its own client's next calls while
#: another server waits for it (capped by the linger): fewer acquires and releases when
#: several agents share a workspace, at most this long a wait per server ahead.
TURN_S = 0.05

#: How often the idle timer looks (and so how long a waiting server may wait for a holder
#: whose client stopped calling).
TICK_S = 0.02


class LeaseBusy(Exception):
    """The lease stayed taken for the whole wait; the message is one line."""


def _iso_now() -> str:
    return iso(time.time_ns())


# -- the holder's name ----------------------------------------------------------------------


def holder_name() -> str:
    """``steptrail-mcp@HOST+MACHINE:PID:START`` (ledger/holders.py): who holds a lease,
    precisely enough to tell later whether that process is still alive."""
    return holders.holder("mcp")


def holder_is_dead(holder: str) -> bool:
    """Whether `holder` names a steptrail mcp process of this machine (this kernel boot
    and pid namespace) that is gone, a zombie, or whose pid is another process's now.
    Unknown holders are alive."""
    return holders.is_gone(holder, ("mcp",))


# -- this machine's queue -------------------------------------------------------------------


def open_lock_file(path: str) -> int | None:
    """A descriptor of the lock file at `path` (created 0600 if absent), or None when it
    cannot serve as one: never through a symlink (O_NOFOLLOW: a link planted beside the
    ledger is not followed to create a file elsewhere), never blocking (a FIFO put there),
    and only a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return fd


class _Slot:
    """This machine's queue for one workspace's lease among steptrail mcp servers: two
    lock files beside the ledger (``<ledger>-mcp-<id>.lock`` and ``.wait``, 0600). A
    server takes the ``.lock`` exclusively (flock) before it acquires the lease and lets
    it go after the release; while it waits for it, it holds ``.wait`` shared, which
    tells the holder to release rather than keep the lease for its next write. A
    SIGKILLed holder's locks go with it. Where the files cannot be made (a read-only
    directory) there is no queue: servers then wait on the lease itself."""

    def __init__(self, ledger_path: str, workspace: str) -> None:
        from .. import locate

        base = f"{ledger_path}-mcp-{hashlib.sha256(workspace.encode()).hexdigest()[:12]}"
        self.fds: list[int] | None = []
        self.held = False
        if locate(ledger_path).shared:  # servers on many machines: they wait on the lease itself
            self.fds = None
            return
        for suffix in (".lock", ".wait"):
            fd = open_lock_file(base + suffix)
            if fd is None:
                for other in self.fds:
                    os.close(other)
                self.fds = None
                break
            self.fds.append(fd)
        self.held = False

    def acquire(self, deadline: float) -> bool:
        """Take the slot, waiting until `deadline` (monotonic); False if it stayed taken."""
        if self.fds is None or self.held:
            return True
        lock, wait = self.fds
        announced = False
        delay = 0.0002
        try:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.held = True
                    return True
                except BlockingIOError:
                    pass
                if not announced:
                    try:  # never blocks: whoever holds it exclusively must not stall us
                        fcntl.flock(wait, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        announced = True
                    except BlockingIOError:
                        pass
                if time.monotonic() >= deadline:
                    return False
                time.sleep(delay)  # a non-blocking try is one syscall: poll finely
                delay = min(delay * 2, 0.0005)
        finally:
            if announced:
                fcntl.flock(wait, fcntl.LOCK_UN)

    def waiters(self) -> bool:
        """Whether another server waits for the slot."""
        if self.fds is None:
            return False
        try:
            fcntl.flock(self.fds[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self.fds[1], fcntl.LOCK_UN)
        return False

    def release(self) -> None:
        if self.fds is not None and self.held:
            fcntl.flock(self.fds[0], fcntl.LOCK_UN)
        self.held = False

    def close(self) -> None:
        self.release()
        for fd in self.fds or ():
            os.close(fd)
        self.fds = None


# -- the leases of one server ---------------------------------------------------------------


class Leases:
    """The leases one server takes, keeps briefly and releases (see the module). Every
    method runs under `lock`, the server's lock around its ledger calls."""

    def __init__(self, ledger: Ledger, lock: threading.RLock, notices: deque[str], *,
                 holder: str, ttl_s: float, wait_s: float, linger_s: float,
                 turn_s: float = TURN_S, observe: bool = False, write_lock: threading.RLock | None = None) -> None:
        self.ledger, self.lock, self.notices = ledger, lock, notices
        #: held by the server across each write: the idle timer never lets a lease go
        #: while a write uses it
        self.write_lock = write_lock or threading.RLock()
        self.holder, self.ttl_s, self.wait_s, self.linger_s = holder, ttl_s, wait_s, linger_s
        self.turn_s = turn_s
        #: record the edits made outside the steps at each fresh lease (`acquire(observe=)`)
        self.observe = observe
        self.workspaces: list[str] = []
        #: workspace -> (epoch, keep until, turn over at), monotonic times
        self._held: dict[str, tuple[int, float, float]] = {}
        self._slots: dict[str, _Slot] = {}
        #: workspace -> when this server last let its lease go for a waiting server
        self._yielded: dict[str, float] = {}
        self._timer: threading.Timer | None = None
        self._tmu = threading.Lock()  # guards _timer
        self._last_write = 0.0
        self._closed = False
        #: whether the last `hold` used a lease kept from an earlier write (a StaleEpoch
        #: then means it was taken over meanwhile, and the call may run once more)
        self.reused = False

    def _slot(self, ws: str) -> _Slot:
        slot = self._slots.get(ws)
        if slot is None:
            slot = self._slots[ws] = _Slot(self.ledger.path, ws)
        return slot

    @contextlib.contextmanager
    def hold(self, ws: str) -> Iterator[int]:
        """The workspace's live epoch for one call (the caller holds `write_lock`): the
        lease kept from this server's last write if nobody waits for it, else a new one —
        after letting go of every lease kept for another workspace, so that two servers
        each keeping one never wait for each other's."""
        held = self._held.get(ws)
        slot = self._slot(ws)
        if held is not None and time.monotonic() >= held[1]:
            self._let_go(ws)
            held = None
        elif held is not None and self._yield_turn(ws, held):
            self._let_go(ws, to_waiter=True)
            held = None
        for other in [w for w in self._held if w != ws]:
            self._let_go(other)
        self.reused = held is not None
        if held is None:
            held = self._held[ws] = self._take(ws, slot)
        try:
            yield held[0]
        except StaleEpoch:
            self._held.pop(ws, None)  # taken over: not ours to release any more
            slot.release()
            raise
        finally:
            if ws in self._held:
                if self.linger_s <= 0 or self._yield_turn(ws, self._held[ws]):
                    self._let_go(ws, to_waiter=True)
                else:
                    self._last_write = time.monotonic()
                    self._schedule(only_if_none=True)

    def _yield_turn(self, ws: str, held: tuple[int, float, float]) -> bool:
        """Whether another server waits for `ws` and this server's turn is over."""
        return time.monotonic() >= held[2] and self._slot(ws).waiters()

    def _take(self, ws: str, slot: _Slot) -> tuple[int, float, float]:
        """Take the slot, then the lease. The slot is only a queue: if it stays taken
        for a second (or half the wait) — a stuck or stopped process may hold the file —
        the lease itself decides, as it would without the queue."""
        gave = self._yielded.pop(ws, None)
        if gave is not None and time.monotonic() - gave < TURN_S:
            # this server just handed the lease to a waiting one: let it take the slot
            # first (flock is no queue), for at most two ticks
            until = time.monotonic() + 2 * TICK_S
            while slot.waiters() and time.monotonic() < until:
                time.sleep(0.0005)
        start = time.monotonic()
        deadline = start + self.wait_s
        slot.acquire(min(deadline, start + min(1.0, self.wait_s / 2)))
        delay = 0.002
        try:
            while True:
                try:
                    with self.lock:
                        lease = self.ledger.workspaces.acquire(ws, holder=self.holder,
                                                               ttl_s=self.ttl_s,
                                                               observe=self.observe)
                    break
                except LeaseHeld as held:
                    if holder_is_dead(held.holder):
                        with self.lock:
                            lease = self.ledger.workspaces.acquire(ws, holder=self.holder,
                                                        ttl_s=self.ttl_s, force=True,
                                                        observe=self.observe)
                        self.notices.append(f"{_iso_now()}: took over workspace {ws!r} from"
                                            f" {held.holder} (that process is gone)")
                        break
                    if time.monotonic() >= deadline:
                        raise LeaseBusy(f"workspace {ws!r} stayed leased by {held.holder} for"
                                        f" {self.wait_s:g}s; nothing was written; retry the"
                                        " call (with the same requestId)") from None
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 0.1)
        except BaseException:
            slot.release()
            raise
        for c in lease.conflicts:
            self.notices.append(f"{_iso_now()}: settling step {c.step} left {c.path} as found"
                                " (it no longer held what that step wrote): a person decides")
        if lease.observed:
            self.notices.append(f"{_iso_now()}: observed {lease.observed_changes} edit(s) made"
                                f" outside the steps in workspace {ws!r}:"
                                f" {', '.join(lease.observed)}")
        if lease.observe_error is not None:
            self.notices.append(f"{_iso_now()}: observing workspace {ws!r} at its lease failed"
                                f" ({lease.observe_error}); the edits made outside the steps"
                                " meanwhile are recorded by the next look")
        if lease.unsettled:
            self.notices.append(f"{_iso_now()}: settling failed for"
                                f" {', '.join(lease.unsettled)}; writes are refused until"
                                " 'steptrail lease settle' succeeds")
        # kept no longer than half its TTL, so a kept lease never lapses mid-call
        now = time.monotonic()
        return lease.epoch, now + self.ttl_s / 2, now + min(self.turn_s, self.linger_s)

    def _let_go(self, ws: str, *, to_waiter: bool = False) -> None:
        if to_waiter:
            self._yielded[ws] = time.monotonic()
        held = self._held.pop(ws, None)
        if held is not None:
            with self.lock, contextlib.suppress(LedgerError):
                self.ledger.workspaces.release(ws, held[0])
        self._slot(ws).release()

    def _schedule(self, *, only_if_none: bool = False) -> None:
        # look every 20 ms: a server that starts waiting gets the lease within that
        with self._tmu:
            if only_if_none and self._timer is not None:
                return
            self._timer = threading.Timer(min(self.linger_s, TICK_S), self._idle)
            self._timer.daemon = True
            self._timer.start()

    def _idle(self) -> None:
        try:
            if not self.write_lock.acquire(blocking=False):  # a write uses the lease
                if self._held and not self._closed:
                    self._schedule()
                else:
                    with self._tmu:
                        self._timer = None
                return
            try:
                with self._tmu:
                    self._timer = None
                if not self._held or self._closed:
                    return
                now = time.monotonic()
                quiet = now - self._last_write
                for ws, held in list(self._held.items()):
                    # idle for the linger; or someone waits, and the turn is over or the
                    # client made no call since the last look
                    if quiet >= self.linger_s or (
                            self._slot(ws).waiters()
                            and (now >= held[2] or quiet >= min(self.linger_s, TICK_S))):
                        self._let_go(ws, to_waiter=quiet < self.linger_s)
                if self._held:
                    self._schedule()
            finally:
                self.write_lock.release()
        except Exception:  # a timer thread never raises: the next call or close cleans up
            log.exception("releasing an idle lease")

    def live(self) -> dict[str, Any]:
        """The leases kept now (workspace -> epoch)."""
        return {ws: held[0] for ws, held in self._held.items()}

    def close(self) -> None:
        """Release every lease kept, close the slots; later calls take leases anew."""
        with self.write_lock:
            self._closed = True
            with self._tmu:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            for ws in list(self._held):
                with contextlib.suppress(Exception):
                    self._let_go(ws)
            for slot in self._slots.values():
                slot.close()
            self._slots.clear()


__all__ = ["LeaseBusy", "Leases", "holder_is_dead", "holder_name"]

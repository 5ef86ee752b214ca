"""Deterministic interleavings of several workers at the ledger's file operations.

Each worker is a callable run in its own thread with its own `Ledger` (its own
connection, leases and locks: what a second process has); its `on_op` hook is
`Lockstep.hook(name)`, and it pauses right before a ``ws-`` operation (a file operation
of the workspace) whenever the schedule says another worker's turn has come. A schedule
is a list of turns ``(worker, n)``: that worker runs on until it has passed `n` more
points (it stops just before the next) or returns; ``n=None`` runs it to its end. The
points between two workers' turns are exactly the interleavings two processes can meet,
enumerated (`schedules`) instead of hoped for from timing.

Only ``ws-`` points pause: those run with no store lock held, so a paused worker never
holds a lock the running one waits for. A worker that still waits (a lock this did not
foresee) is reported as `Stuck` after `timeout_s`, with the schedule, never a hang.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Turn = tuple[str, "int | None"]


class Stuck(AssertionError):
    """A turn did not end within the timeout: a worker waits for a paused one."""


class Lockstep:
    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._turn: str | None = None
        self._left: int | None = 0
        self._paused: set[str] = set()
        self._done: set[str] = set()
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self.points: dict[str, list[str]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._work: dict[str, Callable[[], Any]] = {}
        self._me = threading.local()

    def worker(self, name: str, work: Callable[[], Any]) -> None:
        """Register a worker (started at its first turn)."""
        self._work[name] = work
        self.points[name] = []

    def hook(self, op: str) -> None:
        """The `on_op` of every worker's ledger: counts and pauses at ``ws-`` points."""
        name = getattr(self._me, "name", None)
        if name is None or not op.startswith("ws-"):
            return
        with self._cond:
            while self._turn != name or self._left == 0:
                self._paused.add(name)
                self._cond.notify_all()
                if not self._cond.wait(self.timeout_s * 4):
                    raise Stuck(f"{name} waited for its turn at {op!r} for ever")
            self._paused.discard(name)
            if self._left is not None:
                self._left -= 1
            self.points[name].append(op)

    def _run(self, name: str) -> None:
        self._me.name = name
        try:
            self.results[name] = self._work[name]()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.errors[name] = exc
        finally:
            with self._cond:
                self._done.add(name)
                self._cond.notify_all()

    def run(self, schedule: Sequence[Turn]) -> None:
        """Play the schedule; every worker named ends by its last turn ``(name, None)``."""
        for name, n in schedule:
            with self._cond:
                if name in self._done:
                    continue
                self._turn, self._left = name, n
                self._paused.discard(name)
                self._cond.notify_all()
            if name not in self._threads:
                t = threading.Thread(target=self._run, args=(name,), daemon=True,
                                     name=f"lockstep-{name}")
                self._threads[name] = t
                t.start()
            with self._cond:
                ended = self._cond.wait_for(
                    lambda: name in self._done or (name in self._paused and self._left == 0),
                    self.timeout_s)
                if not ended:
                    raise Stuck(f"turn {name!r} ({n} points) did not end in"
                                f" {self.timeout_s}s; schedule {list(schedule)}; points"
                                f" {self.points}")
        with self._cond:
            self._turn = None
        for name, t in self._threads.items():
            t.join(self.timeout_s)
            if t.is_alive():
                raise Stuck(f"{name} did not end after the schedule {list(schedule)}")


def schedules(first: str, second: str, n_first: int, n_second: int
              ) -> Iterator[list[Turn]]:
    """Every way `second` can start after `first` passed k points and pause after j of
    its own while `first` finishes: (first k) (second j) (first to its end) (second to
    its end), for k in 0..n_first and j in 0..n_second — plus `second` alone between
    any two of `first`'s points (j = None)."""
    for k, j in itertools.product(range(n_first + 1), [*range(n_second + 1), None]):
        yield [(first, k), (second, j), (first, None), (second, None)]


__all__ = ["Lockstep", "Stuck", "schedules"]

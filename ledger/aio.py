"""The ledger for asyncio: coroutines over a `Ledger`, its blocking work off the loop.

    async with await AsyncLedger.init("ws/.steptrail/ledger.db") as ledger:
        result = await run_step(ledger, "fetch", {"out.json": b"{}"})

Each method runs the `Ledger` method of the same name in a thread pool of the
`AsyncLedger`'s own (`max_workers`, 32 by default: asyncio's default pool has only
`min(32, cpus + 4)` threads, which would cap how many appends can wait together), so
the event loop never blocks on SQLite or an fsync. Appends from concurrent tasks reach
the ledger from several threads at once and share transactions and fsyncs (group commit,
docs/design.md "Group commit"); each task still gets its own result or its own error.

Cancelling a task does not stop the thread doing its call: the append commits or not
like a process that died there, and a retry with the same journal keys is answered by
the journal (what it recorded, `deduped`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from .blobs import Content
from .events import BlobStored, Event, Manifest, RecordedEvent
from .ledger import DEFAULT_PATH, Ledger
from .log import Head
from .projections import StepRow
from .runner import StepResult
from .runner import run_step as _run_step
from .verify import VerifyReport

T = TypeVar("T")
#: What `run_step` takes as a step's outputs: bytes per path, or a callable (plain or
#: async) producing them, called only when the step is not committed yet.
AsyncOutputs = (Mapping[str, bytes] | Callable[[], Mapping[str, bytes]]
                | Callable[[], Awaitable[Mapping[str, bytes]]])

MAX_WORKERS_DEFAULT = 32


class AsyncLedger:
    """A `Ledger` for asyncio (see the module docstring). `ledger` is the one it wraps;
    closing the `AsyncLedger` closes it when the `AsyncLedger` opened it.

    >>> import asyncio
    >>> from ledger import AsyncLedger
    >>> async def main():
    ...     ledger = await AsyncLedger.init("ledger.db")
    ...     try:
    ...         await ledger.plan("fetch")
    ...         return (await ledger.step("fetch")).state
    ...     finally:
    ...         await ledger.aclose()
    >>> asyncio.run(main())
    'planned'
    """

    def __init__(self, ledger: Ledger, *, max_workers: int = MAX_WORKERS_DEFAULT,
                 _owned: bool = False) -> None:
        self.ledger = ledger
        self._pool = ThreadPoolExecutor(max_workers=max_workers,
                                        thread_name_prefix="steptrail-aio")
        self._owned = _owned

    @classmethod
    async def open(cls, path: str | os.PathLike[str] = DEFAULT_PATH, *,
                   max_workers: int = MAX_WORKERS_DEFAULT, **options: Any) -> AsyncLedger:
        """`Ledger.open` off the loop (same arguments)."""
        ledger = await asyncio.to_thread(functools.partial(Ledger.open, path, **options))
        return cls(ledger, max_workers=max_workers, _owned=True)

    @classmethod
    async def init(cls, path: str | os.PathLike[str] = DEFAULT_PATH, *,
                   max_workers: int = MAX_WORKERS_DEFAULT, **options: Any) -> AsyncLedger:
        """`Ledger.init` off the loop (same arguments)."""
        ledger = await asyncio.to_thread(functools.partial(Ledger.init, path, **options))
        return cls(ledger, max_workers=max_workers, _owned=True)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` in this ledger's thread pool (any blocking work on
        the ledger that has no coroutine here)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- writing ---------------------------------------------------------------------

    async def append(self, event: Event) -> RecordedEvent:
        return await self.call(self.ledger.append, event)

    async def append_batch(self, events: Sequence[Event]) -> list[RecordedEvent]:
        return await self.call(self.ledger.append_batch, list(events))

    async def plan(self, step: str, **kwargs: Any) -> StepRow:
        return await self.call(self.ledger.plan, step, **kwargs)

    async def store(self, step: str, attempt: int, path: str, data: Content) -> BlobStored:
        return await self.call(self.ledger.store, step, attempt, path, data)

    async def publish(self, step: str, attempt: int | None = None, **kwargs: Any) -> Manifest:
        return await self.call(self.ledger.publish, step, attempt, **kwargs)

    async def ack(self, step: str, attempt: int | None = None, **kwargs: Any) -> RecordedEvent:
        return await self.call(self.ledger.ack, step, attempt, **kwargs)

    async def run_step(self, step: str, outputs: AsyncOutputs, *, run: str = "") -> StepResult:
        """`ledger.aio.run_step` on this ledger."""
        return await run_step(self, step, outputs, run=run)

    # -- reading ---------------------------------------------------------------------

    async def head(self) -> Head:
        return await self.call(self.ledger.head)

    async def read(self, after_seq: int = 0, *, step: str | None = None,
                   kind: str | None = None, limit: int | None = None) -> list[RecordedEvent]:
        """The events `Ledger.read` yields, as a list (bound it with `limit`)."""
        return await self.call(lambda: list(self.ledger.read(after_seq, step=step, kind=kind,
                                                             limit=limit)))

    async def steps(self, state: str | None = None) -> list[StepRow]:
        return await self.call(self.ledger.steps, state)

    async def step(self, step_id: str) -> StepRow:
        return await self.call(self.ledger.step, step_id)

    async def find_step(self, step_id: str) -> StepRow | None:
        return await self.call(self.ledger.find_step, step_id)

    async def manifest(self, step: str, manifest_rev: int | None = None) -> Manifest | None:
        return await self.call(self.ledger.manifest, step, manifest_rev)

    async def read_blob(self, digest: str, *, size: int | None = None) -> bytes:
        return await self.call(self.ledger.read_blob, digest, size=size)

    async def verify(self, **kwargs: Any) -> VerifyReport:
        return await self.call(self.ledger.verify, **kwargs)

    # -- closing ---------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for the calls in flight, then close (the ledger too, if opened here)."""
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        if self._owned:
            await asyncio.to_thread(self.ledger.close)

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


async def run_step(ledger: AsyncLedger, step: str, outputs: AsyncOutputs, *,
                   run: str = "") -> StepResult:
    """`ledger.runner.run_step` as a coroutine: the step's commits run in the ledger's
    pool (sharing fsyncs with the other tasks' steps). `outputs` may be an async callable:
    it is awaited on the loop, and only when the step is not committed yet."""
    if callable(outputs):
        row = await ledger.find_step(step)
        if row is not None and row.live:  # committed: nothing runs (the runner acks it)
            return await ledger.call(_run_step, ledger.ledger, step, {}, run=run)
        produced = outputs()
        if inspect.isawaitable(produced):
            produced = await produced
        outputs = produced
    return await ledger.call(_run_step, ledger.ledger, step, dict(outputs), run=run)


__all__ = ["AsyncLedger", "AsyncOutputs", "run_step"]

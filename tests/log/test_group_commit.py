"""Group commit: appends from several threads share one transaction and one fsync, each
caller with its own result, its own journal answer and its own error.

A group is formed deterministically: the test marks the log as if a leader were
committing, the callers queue one after another, and clearing the mark lets the first
caller to wake lead and take them all, in the order they queued.
Nothing here measures time; the waits are for a state, bounded only against a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import digest_of
from ledger import (
    Acked,
    BlobPinned,
    BlobStored,
    IdempotencyConflict,
    IllegalTransition,
    Ledger,
    Planned,
    RecordedEvent,
)
from ledger.errors import BlobNotFound, StorageFailure
from ledger.runner import run_step

HANG_S = 60  # a bound against a hang, never an assertion about speed


class SafeClock:
    """Strictly increasing nanoseconds, safe to call from many threads."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            self.now += 1_000
            return self.now


@pytest.fixture
def led(tmp_path: Path) -> Any:
    commits: list[str] = []
    ledger = Ledger.init(tmp_path / "ledger.db", clock=SafeClock(), on_op=commits.append)
    ledger.commits = commits  # type: ignore[attr-defined]
    try:
        yield ledger
    finally:
        ledger.close()


def _wait_for(what: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(HANG_S * 1000):
        if what():
            return
        done.wait(0.001)
    raise AssertionError("the callers never queued (a hang)")


def group(ledger: Ledger, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` in threads as ONE group transaction, in this order; each outcome is
    its result or the exception it raised."""
    outcomes: list[Any] = [None] * len(calls)

    def worker(i: int) -> None:
        try:
            outcomes[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcomes[i] = exc

    threads = []
    log = ledger.log
    with log._cond:
        log._leading = True  # as if a leader were committing: every caller queues
    try:
        for i in range(len(calls)):
            t = threading.Thread(target=worker, args=(i,))
            t.start()
            threads.append(t)
            _wait_for(lambda n=i + 1: len(log._queue) == n)
    finally:
        with log._cond:
            log._leading = False  # the first caller to wake leads, and takes them all
            log._cond.notify_all()
    for t in threads:
        t.join(HANG_S)
        assert not t.is_alive()
    return outcomes


def planned(step: str, **kw: Any) -> Planned:
    return Planned(step=step, attempt=1, **kw)


def test_one_group_one_commit_each_caller_its_result(led: Any) -> None:
    before = len(led.commits)
    out = group(led, [lambda i=i: led.append(planned(f"s{i}")) for i in range(8)])
    assert len(led.commits) - before == 1  # one transaction, one COMMIT
    assert all(isinstance(r, RecordedEvent) and not r.deduped for r in out)
    assert [r.event.step for r in out] == [f"s{i}" for i in range(8)]
    seqs = [r.seq for r in out]
    assert seqs == list(range(seqs[0], seqs[0] + 8))  # chained in queue order
    assert len({r.time_ns for r in out}) == 1  # one commit, one time
    assert led.head().seq == seqs[-1]
    assert {s.step_id for s in led.steps()} == {f"s{i}" for i in range(8)}
    assert led.verify().ok


def test_illegal_transition_fails_only_its_caller(led: Any) -> None:
    calls = [lambda i=i: led.append(planned(f"ok{i}")) for i in range(6)]
    calls.insert(3, lambda: led.append(Acked(step="never-planned", attempt=1)))
    out = group(led, calls)
    assert isinstance(out[3], IllegalTransition)
    good = [o for i, o in enumerate(out) if i != 3]
    assert all(isinstance(r, RecordedEvent) for r in good)
    assert led.find_step("never-planned") is None
    assert {s.step_id for s in led.steps()} == {f"ok{i}" for i in range(6)}
    report = led.verify()
    assert report.ok, report.findings


def test_journal_conflict_and_redelivery_in_one_group(led: Any) -> None:
    first = led.append(planned("a", artifacts=("x",)))
    out = group(led, [
        lambda: led.append(planned("b")),
        lambda: led.append(planned("a", artifacts=("x",))),  # a redelivery
        lambda: led.append(planned("a", artifacts=("y",))),  # same key, other event
        lambda: led.append(planned("c")),
    ])
    assert isinstance(out[0], RecordedEvent) and not out[0].deduped
    assert out[1].deduped and out[1].seq == first.seq
    assert isinstance(out[2], IdempotencyConflict)
    assert isinstance(out[3], RecordedEvent) and out[3].seq == out[0].seq + 1
    assert led.count() == 3
    assert led.verify().ok


def test_builder_raising_and_guard_refusal_fail_only_their_callers(led: Any) -> None:
    led.append(planned("p"))

    def broken(_tx: Any, _time_ns: int) -> list[Any]:
        raise ValueError("the builder's own failure")

    missing = digest_of(b"never stored")
    out = group(led, [
        lambda: led.append(planned("q")),
        lambda: led.log.append(broken),
        lambda: led.append(BlobStored(step="p", attempt=1, digest=missing, size=12,
                                      path="out.txt", inline=False)),
        lambda: led.append(BlobPinned(step="p", attempt=1, digest=missing)),
    ])
    assert isinstance(out[0], RecordedEvent)
    assert isinstance(out[1], ValueError) and "builder's own" in str(out[1])
    assert isinstance(out[2], BlobNotFound)
    assert isinstance(out[3], RecordedEvent) and out[3].seq == out[0].seq + 1
    assert led.step("p").state == "planned"
    assert led.verify().ok


def test_rolled_back_caller_leaves_no_inline_bytes(led: Any) -> None:
    led.append(planned("kept"))
    good, bad = b"kept bytes", b"bytes of a refused append"
    dg, db = digest_of(good), digest_of(bad)

    def store(step: str, data: bytes, digest: str) -> Callable[[], Any]:
        events = [BlobPinned(step=step, attempt=1, digest=digest),
                  BlobStored(step=step, attempt=1, digest=digest, size=len(data),
                             path="a.txt", inline=True)]
        return lambda: led.log.append(events, inline={digest: data}, inline_ns=1,
                                      guard=led._guard())

    out = group(led, [store("kept", good, dg), store("not-planned", bad, db)])
    assert isinstance(out[0], list)
    assert isinstance(out[1], IllegalTransition)
    assert led.storage.view.inline_blob(dg) is not None
    assert led.storage.view.inline_blob(db) is None
    assert led.verify().ok


def test_callers_on_one_step_see_each_others_parts(led: Any) -> None:
    """The projector folds each part on the rows the earlier parts wrote (not on rows it
    cached before the transaction), and a refused part in between changes nothing."""
    led.append(planned("s"))
    d1, d2 = digest_of(b"1"), digest_of(b"2")
    out = group(led, [
        lambda: led.append(BlobPinned(step="s", attempt=1, digest=d1)),
        lambda: led.append(Planned(step="s", attempt=2)),  # illegal: attempt 1 in flight
        lambda: led.append(BlobPinned(step="s", attempt=1, digest=d2)),
        lambda: led.append(Acked(step="s", attempt=1)),  # illegal: nothing published
    ])
    assert isinstance(out[0], RecordedEvent) and isinstance(out[2], RecordedEvent)
    assert isinstance(out[1], IllegalTransition) and isinstance(out[3], IllegalTransition)
    row = led.step("s")
    assert (row.attempt, row.state) == (1, "planned")
    report = led.verify()  # projections == a rebuild from the log
    assert report.ok, report.findings
    # the cache after the group describes what committed
    assert led.find_step("s") == led.storage.view.step("s")


def test_commit_failure_fails_every_caller_and_retries_are_answered(tmp_path: Path) -> None:
    """A COMMIT that raised may have been durable: here it was (the hook commits, then
    raises). Every caller of the group hears the error; each one's retry with the same
    journal keys is answered by the journal, and the chain goes on from the real head."""
    fail = {"on": False}
    holder: dict[str, Ledger] = {}

    def on_op(op: str) -> None:
        if op == "commit" and fail["on"]:
            fail["on"] = False
            holder["led"].storage.db.conn.execute("COMMIT")  # durable...
            raise StorageFailure(holder["led"].path, "injected: the COMMIT reported an error")

    led = holder["led"] = Ledger.init(tmp_path / "ledger.db", clock=SafeClock(), on_op=on_op)
    try:
        led.append(planned("before"))
        events = [planned(f"g{i}") for i in range(5)]
        fail["on"] = True
        out = group(led, [lambda e=e: led.append(e) for e in events])
        assert all(isinstance(o, StorageFailure) for o in out)
        assert len({id(o) for o in out}) == len(out)  # each caller its own exception
        retried = [led.append(e) for e in events]
        assert all(r.deduped for r in retried)
        assert [r.seq for r in retried] == [2, 3, 4, 5, 6]
        after = led.append(planned("after"))
        assert after.seq == 7 and not after.deduped
        assert led.verify().ok
    finally:
        led.close()


def test_commit_failure_before_durable_writes_nothing(tmp_path: Path) -> None:
    fail = {"on": False}

    def on_op(op: str) -> None:
        if op == "commit" and fail["on"]:
            fail["on"] = False
            raise StorageFailure("ledger", "injected: disk I/O error at COMMIT")

    led = Ledger.init(tmp_path / "ledger.db", clock=SafeClock(), on_op=on_op)
    try:
        events = [planned(f"g{i}") for i in range(4)]
        fail["on"] = True
        out = group(led, [lambda e=e: led.append(e) for e in events])
        assert all(isinstance(o, StorageFailure) for o in out)
        assert led.count() == 0 and led.steps() == []
        retried = [led.append(e) for e in events]
        assert [r.deduped for r in retried] == [False] * 4
        assert led.verify().ok
    finally:
        led.close()


def test_group_commit_off_each_append_its_own_commit(led: Any) -> None:
    led.log.group_commit = False
    before = len(led.commits)
    threads = [threading.Thread(target=led.append, args=(planned(f"s{i}"),)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert len(led.commits) - before == 6
    assert led.verify().ok


def test_many_threads_many_steps(led: Any) -> None:
    """16 threads, each running its own artifact steps through the runner at once: every
    result is its own step's, the ledger verifies, and fewer commits than appends ran
    whenever groups formed (not asserted: that depends on timing)."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def runner(t: int) -> None:
        try:
            for n in range(6):
                step = f"t{t}-{n}"
                data = f"{step} output".encode() * 50
                results[step] = (run_step(led, step, {"out.txt": data}), data)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S * 5)
    assert not errors, errors
    assert len(results) == 96
    for step, (res, data) in results.items():
        assert res.step == step and res.ran
        (entry,) = res.manifest.artifacts
        assert led.read_blob(entry.digest, size=entry.size) == data
        assert led.step(step).state == "acked"
        assert led.classify(step) == "committed"
    report = led.verify()
    assert report.ok, report.findings


CRASH_CHILD = textwrap.dedent("""
    import sys, threading
    from ledger import Ledger
    from ledger.runner import run_step
    led = Ledger.init(sys.argv[1])
    out = threading.Lock()
    def runner(t):
        n = 0
        while True:
            step = f"t{t}-{n}"
            run_step(led, step, {"out.txt": step.encode() * 100})
            with out:
                sys.stdout.write(step + "\\n")
                sys.stdout.flush()
            n += 1
    for t in range(8):
        threading.Thread(target=runner, args=(t,), daemon=True).start()
    threading.Event().wait()
""")


def test_sigkill_during_group_commits(tmp_path: Path) -> None:
    """A real process, 8 threads committing steps in groups, SIGKILLed mid-stream: after
    reopening, every step a caller got a result for is committed, the chain and the
    projections verify, and every other step is absent or in flight (nothing half-done)."""
    path = tmp_path / "ledger.db"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    done: list[str] = []
    try:
        assert child.stdout is not None
        while len(done) < 60:
            line = child.stdout.readline()
            if not line:
                break
            done.append(line.strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(HANG_S)
        if child.stdout is not None:
            child.stdout.close()
    assert len(done) >= 60, "the child stopped early"
    with Ledger.open(path) as led:
        report = led.verify()
        assert report.ok, report.findings
        for step in done:
            assert led.classify(step) == "committed", step
            assert led.step(step).state == "acked"
        for row in led.steps():
            assert row.state in ("planned", "blob-stored", "manifest-published", "acked"), row
        # whatever was in flight finishes on a rerun
        for row in led.steps():
            if row.state != "acked":
                run_step(led, row.step_id, {"out.txt": row.step_id.encode() * 100})
        assert all(r.state == "acked" for r in led.steps())
        assert led.verify().ok


def test_asyncio_tasks_share_commits_and_get_their_own_results(led: Any) -> None:
    """16 asyncio tasks on one AsyncLedger: real coroutines, each task its own steps and
    results (an async `outputs` is awaited, and not called for a committed step)."""
    import asyncio

    from ledger.aio import AsyncLedger
    from ledger.aio import run_step as arun_step

    called: list[str] = []

    async def main() -> dict[str, Any]:
        aled = AsyncLedger(led, max_workers=16)
        out: dict[str, Any] = {}

        async def task(t: int) -> None:
            for n in range(4):
                step = f"a{t}-{n}"

                async def produce(step: str = step) -> dict[str, bytes]:
                    called.append(step)
                    return {"out.txt": step.encode() * 20}

                out[step] = await arun_step(aled, step, produce)

        await asyncio.gather(*(task(t) for t in range(16)))
        again = await aled.run_step("a0-0", lambda: {"out.txt": b"never called"})
        assert not again.ran and again.manifest == out["a0-0"].manifest
        assert (await aled.head()).seq == led.head().seq
        events = await aled.read(step="a3-1")
        assert [e.kind for e in events][-1] == "acked"
        assert len(await aled.steps()) == 64
        assert (await aled.verify()).ok
        await aled.aclose()
        return out

    results = asyncio.run(main())
    assert sorted(called) == sorted(results) and len(results) == 64
    for step, res in results.items():
        (entry,) = res.manifest.artifacts
        assert led.read_blob(entry.digest) == step.encode() * 20
        assert led.step(step).state == "acked"


def test_async_errors_are_each_tasks_own(led: Any) -> None:
    import asyncio

    from ledger.aio import AsyncLedger

    async def main() -> list[Any]:
        async with AsyncLedger(led) as aled:
            return await asyncio.gather(
                aled.append(planned("x")), aled.append(Acked(step="nope", attempt=1)),
                aled.append(planned("y")), return_exceptions=True)

    out = asyncio.run(main())
    assert isinstance(out[0], RecordedEvent) and isinstance(out[2], RecordedEvent)
    assert isinstance(out[1], IllegalTransition)
    assert {s.step_id for s in led.steps()} == {"x", "y"}


def test_power_loss_at_every_operation_of_a_group_commit(tmp_path: Path) -> None:
    """Power lost at each SQLite operation of one group commit (6 callers), each loss
    model: what reaches the platter holds the whole group or none of it, and verifies.
    A caller that got a result had its COMMIT durable."""
    import os
    import shutil

    from ledger.testing import faults as F

    base = str(tmp_path / "base")
    os.makedirs(base)
    with Ledger.init(os.path.join(base, "ledger.db")) as led0:
        led0.append(planned("before"))
    outcomes: list[Any] = []

    def work(env: Any) -> None:
        led = env.open()
        outcomes[:] = group(led, [lambda i=i: led.append(planned(f"g{i}")) for i in range(6)])

    probe = F.PowerLossDisk()
    shutil.copytree(base, str(tmp_path / "probe"))
    F.run_with_disk(probe, str(tmp_path / "probe"), work)
    assert all(isinstance(o, RecordedEvent) for o in outcomes)
    seen = set()
    for k in range(1, probe.ops + 1):
        for model in F.MODELS:
            run = str(tmp_path / f"k{k}-{model}")
            shutil.copytree(base, run)
            disk = F.PowerLossDisk(crash_at=k, model=model, seed=k)
            F.run_with_disk(disk, run, work)
            disk.freeze()
            disk.materialize(run, run + "-img")
            got = [isinstance(o, RecordedEvent) for o in outcomes]
            with Ledger.open(os.path.join(run + "-img", "ledger.db")) as led:
                report = led.verify()
                assert report.ok, (k, model, report.findings)
                steps = {s.step_id for s in led.steps()} - {"before"}
                assert steps in (set(), {f"g{i}" for i in range(6)}), (k, model, steps)
                if any(got):  # a result means its COMMIT was durable
                    assert all(got) and len(steps) == 6, (k, model)
                seen.add(len(steps))
            shutil.rmtree(run)
            shutil.rmtree(run + "-img")
    assert seen == {0, 6}  # the sweep lost the group at some points and kept it at others

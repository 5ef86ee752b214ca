"""`run_fenced_step`: the fenced step in one library call, replay-aware, with a typed
outcome (applied / deduped / conflict / stale epoch / rejected), in two commits."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import pytest
from conftest import FakeClock, LedgerAt, sqlite_at

from ledger import (
    FencedOutcome,
    Ledger,
    RejectReason,
    StepReader,
    StepStatus,
    Write,
    run_fenced_step,
)

#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class World:
    """The ledger at `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: Path, on_op: object = None, *, at: LedgerAt = sqlite_at) -> None:
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_bytes(b"print('v0')\n")
        (self.dir / "lib.py").write_bytes(b"x = 0\n")
        self.clock = FakeClock()
        self.path = at(tmp / "ledger.db")
        self.ledger = Ledger.init(self.path, clock=self.clock)
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def run(self, step: str = "s1", new: bytes = b"print('v1')\n",
            ledger: Ledger | None = None, epoch: int | None = None) -> FencedOutcome:
        def plan(read: StepReader) -> list[Write]:
            return [read.read("app.py").write(new), read.read("lib.py").write(b"x = 1\n")]

        return run_fenced_step(ledger or self.ledger, "w", step, plan,
                               epoch=epoch or self.epoch)


def test_a_first_run_applies_and_commits_in_two_commits(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    head = w.ledger.head().seq
    out = w.run()
    assert out.status is StepStatus.APPLIED and out.ran and out.committed
    assert (w.dir / "app.py").read_bytes() == b"print('v1')\n"
    assert out.manifest is not None and {e.path for e in out.manifest.writes} == {"app.py",
                                                                                 "lib.py"}
    assert out.receipt is not None and out.receipt.step == "s1"
    assert w.ledger.step("s1").state == "acked"
    kinds = [r.event.__struct_config__.tag for r in w.ledger.read(after_seq=head)]
    # the plan with its post-image pins; then apply, pre-image pins, manifest and ack
    assert kinds[0] == "planned" and kinds[-3:] == ["fenced", "manifest-published", "acked"]
    assert w.ledger.verify().ok


@pytest.mark.sqlite_only
def test_two_commits_a_step(
        tmp_path: Path, ledger_at: LedgerAt, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted by SQLite's WAL hook, which runs once after each commit."""
    from ledger.store.sqlite.database import Database

    w = World(tmp_path, at=ledger_at)
    w.ledger.close()
    commits: list[int] = []
    hook = Database._wal_hook

    def counting(self: Database, *args: object) -> int:
        commits.append(1)
        return hook(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Database, "_wal_hook", counting)
    led = Ledger.open(w.path, clock=w.clock)
    commits.clear()
    out = w.run(ledger=led)
    assert out.status is StepStatus.APPLIED
    assert len(commits) == 2, commits


def test_a_rerun_of_a_committed_step_runs_nothing(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    first = w.run()
    called = []

    def plan(read: StepReader) -> list[Write]:
        called.append(1)
        return []

    again = run_fenced_step(w.ledger, "w", "s1", plan, epoch=w.epoch)
    assert again.status is StepStatus.DEDUPED and not again.ran and called == []
    assert again.manifest == first.manifest and again.receipt == first.receipt


def test_a_published_unacked_step_is_acked_on_rerun(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    plan = [w.ledger.workspaces.read_file("w", "app.py").write(b"v2\n")]
    w.ledger.workspaces.admit("w", w.epoch, [__import__("ledger").StepPlan("s1", plan)])
    w.ledger.workspaces.apply("s1", epoch=w.epoch)
    w.ledger.publish("s1")
    out = run_fenced_step(w.ledger, "w", "s1", plan, epoch=w.epoch)
    assert out.status is StepStatus.DEDUPED and w.ledger.step("s1").state == "acked"


def test_a_persons_edit_after_the_read_is_a_conflict_with_a_diff(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)

    def plan(read: StepReader) -> list[Write]:
        got = read.read("app.py")
        (w.dir / "app.py").write_bytes(b"print('human')\n")  # while the agent thinks
        return [got.write(b"print('agent')\n")]

    out = run_fenced_step(w.ledger, "w", "s1", plan, epoch=w.epoch)
    assert out.status is StepStatus.CONFLICT and out.reason is RejectReason.PRE_HASH
    assert not out.committed and out.ran
    [c] = out.conflicts
    assert c.path == "app.py" and c.read_hash == h(b"print('v0')\n")
    assert c.on_disk_hash == h(b"print('human')\n")
    assert "-print('v0')" in c.diff and "+print('human')" in c.diff
    assert (w.dir / "app.py").read_bytes() == b"print('human')\n"
    # the recorded refusal keeps what the fence found on disk (a reviewer reads it later)
    [refusal] = [r.event for r in w.ledger.read(step="s1", kind="rejected")]
    human = h(b"print('human')\n")
    assert refusal.detail.endswith(f"(on disk: {human})"), refusal.detail
    # run again: planned afresh from what is there now
    again = run_fenced_step(w.ledger, "w", "s1",
                            lambda read: [read.read("app.py").write(b"print('agent')\n")],
                            epoch=w.epoch)
    assert again.status is StepStatus.APPLIED and again.attempt == 2


def test_a_taken_over_lease_is_a_stale_epoch_outcome(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.ledger.workspaces.acquire("w", "other", ttl_s=60, force=True)
    out = w.run()
    assert out.status is StepStatus.STALE_EPOCH and not out.committed
    assert (w.dir / "app.py").read_bytes() == b"print('v0')\n"


def test_an_attempt_settled_by_a_new_epoch_is_planned_again(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    plan = [w.ledger.workspaces.read_file("w", "app.py").write(b"v2\n")]
    w.ledger.workspaces.admit("w", w.epoch, [__import__("ledger").StepPlan("s1", plan)])
    epoch = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=60, force=True).epoch
    out = w.run(epoch=epoch)
    assert out.status is StepStatus.APPLIED and out.attempt == 2 and out.ran


@pytest.mark.sqlite_only
def test_a_step_killed_between_its_exchanges_is_finished_by_a_rerun(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        n = [0]

        def on_op(name: str) -> None:
            if name == "ws-rename":
                n[0] += 1
                if n[0] == 2:
                    os.kill(os.getpid(), signal.SIGKILL)

        w.run(ledger=Ledger.open(w.path, clock=w.clock, on_op=on_op))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    w.ledger = Ledger.open(w.path, clock=w.clock)
    out = w.run()
    assert out.status is StepStatus.APPLIED and out.attempt == 1 and out.receipt is not None
    assert out.receipt.settled
    assert (w.dir / "app.py").read_bytes() == b"print('v1')\n"
    assert (w.dir / "lib.py").read_bytes() == b"x = 1\n"
    assert w.ledger.verify().ok


def test_a_step_of_another_workspace_is_refused(tmp_path: Path, ledger_at: LedgerAt) -> None:
    from ledger import InvalidInput
    w = World(tmp_path, at=ledger_at)
    (tmp_path / "ws2").mkdir()
    w.ledger.workspaces.add("w2", str(tmp_path / "ws2"))
    w.run()
    with pytest.raises(InvalidInput):
        run_fenced_step(w.ledger, "w2", "s1", [], epoch=w.epoch)


def test_artifacts_commit_with_the_step(tmp_path: Path, ledger_at: LedgerAt) -> None:
    w = World(tmp_path, at=ledger_at)
    big = b"log line\n" * 20_000  # a file blob
    out = run_fenced_step(w.ledger, "w", "s1",
                          lambda read: [read.read("app.py").write(b"v1\n")], epoch=w.epoch,
                          artifacts={"report.txt": b"ok\n", "logs/build.log": big})
    assert out.status is StepStatus.APPLIED and out.manifest is not None
    assert {a.path for a in out.manifest.artifacts} == {"report.txt", "logs/build.log"}
    by_path = {a.path: a.digest for a in out.manifest.artifacts}
    assert w.ledger.read_blob(by_path["logs/build.log"]) == big
    assert w.ledger.read_blob(by_path["report.txt"]) == b"ok\n"
    again = run_fenced_step(w.ledger, "w", "s1", [], epoch=w.epoch,
                            artifacts={"report.txt": b"ok\n", "logs/build.log": big})
    assert again.status is StepStatus.DEDUPED and again.manifest == out.manifest
    assert w.ledger.verify().ok


@pytest.mark.sqlite_only
def test_small_artifacts_keep_two_commits(
        tmp_path: Path, ledger_at: LedgerAt, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.store.sqlite.database import Database

    w = World(tmp_path, at=ledger_at)
    commits: list[int] = []
    hook = Database._wal_hook

    def counting(self: Database, *args: object) -> int:
        commits.append(1)
        return hook(self, *args)  # type: ignore[arg-type]

    w.ledger.close()
    monkeypatch.setattr(Database, "_wal_hook", counting)
    led = Ledger.open(w.path, clock=w.clock)
    commits.clear()
    out = run_fenced_step(led, "w", "s1", lambda read: [read.read("app.py").write(b"v1\n")],
                          epoch=w.epoch, artifacts={"report.txt": b"ok\n"})
    assert out.status is StepStatus.APPLIED and len(commits) == 2

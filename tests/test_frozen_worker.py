"""A worker frozen during its file work cannot block a takeover (issue 36, item 6).

Real processes, on both stores: a worker (a child process) lands its step's files and
SIGSTOPs itself at an exact file operation (its N-th ``ws-rename`` tick: the exchange
of a path, or a take-back). The store's write lock covers commits only
(docs/design.md "Epochs and leases"), so a `steptrail lease acquire --force` in another
process takes the workspace over at once — on SQLite a lock held by a stopped process
could never be broken: before this, the acquire waited its 30 s busy timeout and exited
3, every round, and the worker applied its step once continued. Continued, the worker
hears StaleEpoch, commits nothing and takes back what it landed (verified: only what
still holds its bytes); no byte of the files is lost; the new epoch's settle reports
what it did.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from conftest import LedgerAt, digest_of

from ledger import Ledger, StepPlan, StepStatus, Write, run_fenced_step
from ledger.events import LeaseAcquired

BOTH_STORES = True
h = digest_of

#: The takeover's bound (issue 36: "the forced takeover within 10 s"); it takes well
#: under a third of it (a process start and a few commits), so this is no benchmark.
TAKEOVER_BOUND_S = 10.0

A0, B0, C0 = b"a0\n", b"b0\n", b"c0 " * 700_000  # c: a 2 MiB file (streamed, not inline)
A1, B1, C1 = b"A's a\n", b"A's b\n", b"A's c " * 300_000

WORKER = r"""
import json, os, signal, sys
from ledger import Ledger
location, epoch = sys.argv[1], int(sys.argv[2])
stops = {int(n) for n in sys.argv[3].split(",")}
renames, after = 0, []
def on_op(name):
    global renames
    if renames:
        after.append(name)
    if name == "ws-rename":
        renames += 1
        if renames in stops:
            print("STOPPED", renames, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
led = Ledger.open(location, on_op=on_op)
try:
    out = led.workspaces.apply("a1", epoch=epoch)
    print(json.dumps({"verdict": out.verdict, "after": after}), flush=True)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "after": after}),
          flush=True)
"""


class World:
    """A workspace of three files (a.txt, b.txt, a 2 MiB c.bin) leased to worker A, whose
    step a1 writes all three (planned, not applied)."""

    def __init__(self, tmp: pathlib.Path, at: LedgerAt) -> None:
        self.dir = tmp / "ws"
        self.dir.mkdir()
        for name, data in (("a.txt", A0), ("b.txt", B0), ("c.bin", C0)):
            (self.dir / name).write_bytes(data)
        self.location = os.fspath(at(tmp / "ledger.db"))
        with Ledger.init(self.location) as led:
            led.workspaces.add("w", str(self.dir))
            self.epoch = led.workspaces.acquire("w", "A", ttl_s=3600).epoch
            assert led.workspaces.admit("w", self.epoch, [StepPlan("a1", [
                Write("a.txt", A1, h(A0)), Write("b.txt", B1, h(B0)),
                Write("c.bin", C1, h(C0))])]) == [None]

    def worker(self, stops: list[int]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", WORKER, self.location, str(self.epoch),
             ",".join(map(str, stops))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cli(self, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        """`steptrail --ledger LOCATION --workspace w ARGS` in a process of its own, and
        how long it took."""
        exe = pathlib.Path(sys.executable).parent / "steptrail"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
        t0 = time.monotonic()
        done = subprocess.run([str(exe), "--ledger", self.location, "--workspace", "w", *args],
                              capture_output=True, text=True, env=env, timeout=120,
                              check=False)
        return done, time.monotonic() - t0

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.dir.iterdir()) if p.is_file()}

    def hidden(self) -> list[str]:
        return sorted(p for p in os.listdir(self.dir) if p.startswith("."))


def _stopped(child: subprocess.Popen[str], at: int) -> None:
    """Wait until the worker says it stops at its `at`-th rename, and has stopped (a
    SIGCONT sent before its SIGSTOP arrived would be lost)."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.split() != ["STOPPED", str(at)]:
        child.kill()
        raise AssertionError((line, child.communicate()))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError("the worker did not stop")


def _answer(child: subprocess.Popen[str]) -> dict[str, Any]:
    os.kill(child.pid, signal.SIGCONT)
    rest, err = child.communicate(timeout=120)
    assert "Traceback" not in err, err
    return json.loads(rest.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _cleanup(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.communicate()


def test_a_takeover_does_not_wait_for_a_worker_frozen_in_its_file_work(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """The worker stops before its second exchange (a.txt landed). A forced acquire by
    another process succeeds within the bound and settles a1 (a.txt restored); the
    worker, continued, hears StaleEpoch, commits nothing, and every file holds its
    bytes from before the step."""
    w = World(tmp_path, ledger_at)
    child = w.worker([2])
    try:
        _stopped(child, 2)
        assert w.files()["a.txt"] == A1  # its first exchange landed
        done, took = w.cli("lease", "acquire", "--holder", "B", "--ttl", "1h", "--force",
                           "--json")
        assert done.returncode == 0, (done, took)
        assert took < TAKEOVER_BOUND_S, took
        lease = json.loads(done.stdout)
        assert lease["epoch"] == w.epoch + 1
        assert lease["settled"] == ["a1"] and lease["conflicts"] == []
        assert w.files() == {"a.txt": A0, "b.txt": B0, "c.bin": C0}
        answer = _answer(child)
    finally:
        _cleanup(child)
    assert answer.get("error") == "StaleEpoch", answer
    # nothing of A's is on disk or committed; no temporary is left; the ledger says so
    assert w.files() == {"a.txt": A0, "b.txt": B0, "c.bin": C0}
    assert w.hidden() == []
    with Ledger.open(w.location) as led:
        assert led.step("a1").state == "compensated"
        assert not list(led.read(step="a1", kind="fenced"))
        comp = next(iter(led.read(step="a1", kind="compensated"))).event
        assert [(r.path, r.outcome) for r in comp.restored] == [("a.txt", "restored")]
        # the new epoch works on: a step on the paths A had planned
        out = run_fenced_step(led, "w", "b1", lambda r: [r.read("b.txt").write(b"B's b\n")],
                              epoch=lease["epoch"])
        assert out.status is StepStatus.APPLIED, out
        assert led.verify().ok


@pytest.mark.parametrize("taken_back_by", ["worker", "settle"])
def test_an_exchange_landed_after_a_takeover_is_taken_back(
        tmp_path: pathlib.Path, ledger_at: LedgerAt, taken_back_by: str) -> None:
    """The one window left: the worker is frozen between its epoch check and its second
    exchange, and a takeover happens whose settle has not run yet (its process was
    killed after the lease commit). Continued, the worker lands b.txt under a dead
    epoch — one exchange — finds the epoch dead before its next landing and takes both
    of its exchanges back (it stops again at the first take-back, so the test sees the
    late landing). `worker`: it finishes the take-back itself, and the new epoch's
    settle finds nothing left to restore. `settle`: the new epoch settles while the
    worker is stopped: it sees both paths changed, restores them and says so; the
    worker then finds nothing of its own to take back. Either way StaleEpoch, nothing
    committed, every byte where it was."""
    w = World(tmp_path, ledger_at)
    child = w.worker([2, 3])
    try:
        _stopped(child, 2)
        with Ledger.open(w.location) as led:  # an acquire killed before its settle
            led.append(LeaseAcquired(workspace="w", epoch=w.epoch + 1, holder="B",
                                     expires_ns=led.clock() + 3600 * 10**9, forced=True))
        os.kill(child.pid, signal.SIGCONT)
        _stopped(child, 3)  # b.txt landed after the takeover; its take-back is next
        assert w.files()["b.txt"] == B1 and w.files()["a.txt"] == A1
        if taken_back_by == "settle":
            done, _took = w.cli("lease", "settle", "--epoch", str(w.epoch + 1), "--json")
            assert done.returncode == 0, done
            settled = json.loads(done.stdout)
            assert settled["conflicts"] == []
            assert sorted((r["path"], r["outcome"]) for r in
                          settled["settled"][0]["restored"]) == [
                ("a.txt", "restored"), ("b.txt", "restored")]
            assert w.files() == {"a.txt": A0, "b.txt": B0, "c.bin": C0}
        answer = _answer(child)
    finally:
        _cleanup(child)
    assert answer.get("error") == "StaleEpoch", answer
    assert w.files() == {"a.txt": A0, "b.txt": B0, "c.bin": C0}
    if taken_back_by == "worker":
        done, _took = w.cli("lease", "settle", "--epoch", str(w.epoch + 1), "--json")
        assert done.returncode == 0, done
        settled = json.loads(done.stdout)
        assert [s["step"] for s in settled["settled"]] == ["a1"]
        assert settled["settled"][0]["restored"] == [] and settled["conflicts"] == []
    assert w.files() == {"a.txt": A0, "b.txt": B0, "c.bin": C0}
    with Ledger.open(w.location) as led:
        assert led.step("a1").state == "compensated"
        assert not list(led.read(step="a1", kind="fenced"))
        # the ledger's account matches the disk, and the workspace is usable at once
        for path, (_rev, digest) in led.workspaces.paths("w").items():
            assert digest == h((w.dir / path).read_bytes()), path
        out = run_fenced_step(led, "w", "b1", lambda r: [r.read("b.txt").write(b"B's b\n")],
                              epoch=w.epoch + 1)
        assert out.status is StepStatus.APPLIED, out
        assert led.verify().ok
    assert w.hidden() == []

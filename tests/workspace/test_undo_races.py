"""Two processes undoing one attempt (the race tools/stress_processes.py met ~2 runs in
60 under load): a worker compensates its step under epoch 1 while another takes the
workspace over (epoch 2) and settles the same attempt. Both undo the same paths from
their own slots; whichever puts a pre-image back first, the other must find it
``already`` there — never record a ``conflict`` (the ledger would then keep the
post-image for a path whose disk holds the pre-image, and the next step's fence refuses
a file nobody touched).

Every interleaving at the workspace's file operations (`ledger.testing.interleave`:
the first worker's k points, the second's j, then each to its end), in both exchange
modes (every third of them in `make test`, all with STEPTRAIL_PERSON_FULL=1), judged
by `undo_check`; `test_the_checker_catches_each_broken_ending` shows the
checker failing on each ending it must refuse.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
from conftest import FakeClock

from ledger import Ledger
from ledger.errors import StaleEpoch
from ledger.step.values import StepPlan, Write
from ledger.testing.faults import full_mode
from ledger.testing.interleave import Lockstep, schedules
from ledger.workspace import exchange as exchange_mod
from ledger.workspace.names import temp_stamp

#: The whole table with the fault sweeps or the person injector's (what .ci/run sets);
#: `make test` plays every third interleaving (each class found here spans several).
FULL = full_mode() or os.environ.get("STEPTRAIL_PERSON_FULL", "") not in ("", "0")

PRE = {"a.txt": b"a-pre\n", "d/b.txt": b"b-pre\n" * 50, "c.txt": b"c-pre\n"}
POST = {"a.txt": b"a-post\n", "d/b.txt": b"b-post\n" * 70, "c.txt": None}


def h(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(exchange_mod, "_CALL", None)
    return str(request.param)


class SharedClock(FakeClock):
    """One clock for both workers' ledgers (two threads read it)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return super().__call__()


def world(tmp: Path) -> tuple[Path, Path, SharedClock]:
    """A workspace whose step `s` (epoch 1) applied and was never committed."""
    root = tmp / "ws"
    for name, data in PRE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    clock = SharedClock()
    path = tmp / "ledger.db"
    with Ledger.init(path, clock=clock) as led:
        led.workspaces.add("w", str(root))
        epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
        assert epoch == 1
        writes = [Write(path=p, content=c, pre_hash=h(PRE[p])) for p, c in POST.items()]
        led.workspaces.admit("w", epoch, [StepPlan(step="s", writes=writes)])
        led.workspaces.apply("s", epoch=epoch)
    return root, path, clock


def visible(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and temp_stamp(p.name) is None}


def undo_check(root: Path, led: Ledger) -> list[str]:
    """What a finished undo of `s` must leave: the step compensated, every path back to
    its pre-image on disk, the ledger's path digests equal to the disk's, and no
    ``conflict`` in a record nobody but the two undoers acted in."""
    problems: list[str] = []
    row = led.step("s")
    if row.state != "compensated":
        problems.append(f"step s is {row.state}, not compensated")
    disk = visible(root)
    if disk != PRE:
        problems.append(f"disk {sorted(disk)} differs from the pre-images")
    paths = led.workspaces.paths("w")
    for name in PRE:
        said = paths.get(name, (0, None))[1]
        on_disk = h(disk.get(name))
        if said != on_disk:
            problems.append(f"{name}: the ledger says {str(said)[:8]}, the disk holds"
                            f" {str(on_disk)[:8]}")
    attempt = led.attempt("s")
    if attempt.end is not None:
        for r in getattr(attempt.end[1], "restored", ()):
            if r.outcome == "conflict":
                problems.append(f"{r.path}: recorded a conflict (digest {str(r.digest)[:8]})")
    return problems


def count_points(tmp: Path) -> tuple[int, int]:
    """How many `ws-` points each worker passes alone (the other never runs)."""
    out = []
    for who in ("first", "second"):
        root, path, clock = world(tmp / who)
        lock = Lockstep()
        led = Ledger.open(path, clock=clock, on_op=lock.hook)
        if who == "first":
            lock.worker(who, lambda: led.workspaces.compensate("s", epoch=1))
        else:
            lock.worker(who, lambda: led.workspaces.acquire("w", "second", ttl_s=3600,
                                                            force=True))
        lock.run([(who, None)])
        assert not lock.errors, lock.errors
        led.close()
        out.append(len(lock.points[who]))
    return out[0], out[1]


def play(tmp: Path, schedule: list) -> list[str]:
    root, path, clock = world(tmp)
    lock = Lockstep()
    first = Ledger.open(path, clock=clock, on_op=lock.hook)
    second = Ledger.open(path, clock=clock, on_op=lock.hook)
    try:
        lock.worker("first", lambda: first.workspaces.compensate("s", epoch=1))
        lock.worker("second", lambda: second.workspaces.acquire(
            "w", "second", ttl_s=3600, force=True))
        lock.run(schedule)
        problems = []
        err = lock.errors.get("first")
        if err is not None and not isinstance(err, StaleEpoch):
            problems.append(f"the first undoer raised {err!r}")
        if "second" in lock.errors:
            problems.append(f"the takeover raised {lock.errors['second']!r}")
        else:
            lease = lock.results["second"]
            if lease.unsettled or lease.conflicts:
                problems.append(f"the takeover left unsettled {lease.unsettled},"
                                f" conflicts {lease.conflicts}")
        problems += undo_check(root, second)
        return problems
    finally:
        first.close()
        second.close()


def test_two_undoers_of_one_attempt_agree_with_the_disk(tmp_path: Path, mode: str) -> None:
    n_first, n_second = count_points(tmp_path / "count")
    assert n_first >= 6 and n_second >= 6, (n_first, n_second)
    failures: list[str] = []
    for i, schedule in enumerate(schedules("first", "second", n_first, n_second)):
        if not FULL and i % 3:
            continue
        problems = play(tmp_path / f"r{i}", schedule)
        if problems:
            failures.append(f"{schedule[:2]}: " + "; ".join(problems))
    assert not failures, f"{len(failures)} interleavings failed:\n" + "\n".join(failures[:20])


def test_the_checker_catches_each_broken_ending(tmp_path: Path) -> None:
    """Each rule of `undo_check` fails on an ending that breaks it: an undo that never
    ran, a conflict recorded (a person's edit before the settle), a disk that no longer
    holds what the ledger says (the split the race left)."""
    root, path, clock = world(tmp_path / "a")
    with Ledger.open(path, clock=clock) as led:
        assert any("not compensated" in p for p in undo_check(root, led))
        (root / "a.txt").write_bytes(b"a person's save\n")
        led.workspaces.acquire("w", "second", ttl_s=3600, force=True)
        problems = undo_check(root, led)
        assert any("a.txt: recorded a conflict" in p for p in problems), problems
    root, path, clock = world(tmp_path / "b")
    with Ledger.open(path, clock=clock) as led:
        led.workspaces.acquire("w", "second", ttl_s=3600, force=True)
        assert undo_check(root, led) == []
        (root / "c.txt").unlink()  # the ledger says the pre-image: the disk does not
        problems = undo_check(root, led)
    assert any("c.txt: the ledger says" in p for p in problems), problems

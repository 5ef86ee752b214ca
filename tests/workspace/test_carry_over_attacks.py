"""Attacks on carrying a write over observation-only revisions (ledger/step/admit.py
`carried_over`; docs/design.md "Fence modes", docs/time-travel.md "At each lease"), and on
the observation each CLI and MCP lease now makes by default.

The first rule: a write never lands over bytes its writer did not read. A carried write is
still fenced on the disk, so each attack below checks the bytes on disk and in the ledger,
not only the verdict. Found and fixed here:

- an observation was known by its step id alone, so a step that took an ended
  observation's id (attempt 2: `admit` or `steptrail step replan`), or an agent's step
  with an `observed` event appended by hand, counted as an observation: a step's write in
  between (an A-B-A through steps) was carried over. An observation is now the attempt
  (step and attempt) its `observed` event names, of run `observed`.
- an observation at each lease gave up after four looks when two large files kept
  changing (one `changing` strike a look, two needed each): the acquire failed, its lease
  taken and not printed, on every try. A file's strikes no longer use up the looks (up
  to 32 such files: ledger/step/observe.py CHANGING_FILES_MAX).

Found open, then fixed: an observation failing at an acquire failed the acquire after
its lease was taken (the CLI named no epoch; an MCP server lost track of its own lease and
waited for it); the acquire's report dropped what the observation left out (a file over
the size cap). Now the lease is returned with `observe_error` (said on stderr and in the
server's notices) and `not_captured`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger import Ledger, run_fenced_step
from ledger.blobs import digest_of
from ledger.cli import cli
from ledger.errors import (
    EnvironmentFailure,
    PlanConflict,
    ProtocolRefused,
    ReplanRefused,
    StaleEpoch,
)
from ledger.events import Observed
from ledger.mcp.leases import LeaseBusy, Leases
from ledger.step import observe as observe_mod
from ledger.step.values import StepPlan, Write

A = b"A\n"


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class World:
    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "w"
        self.root.mkdir()
        (self.root / "app.py").write_bytes(A)
        (self.root / "notes.txt").write_bytes(b"n\n")
        self.path = str(tmp / "ledger.db")
        self.led = Ledger.init(self.path)
        self.led.workspaces.add("w", str(self.root))

    def disk(self, path: str = "app.py") -> bytes | None:
        p = self.root / path
        return p.read_bytes() if p.exists() else None

    def edit(self, data: bytes | None, path: str = "app.py") -> None:
        p = self.root / path
        if data is None:
            p.unlink()
        else:
            p.write_bytes(data)

    def observe(self, epoch: int | None = None, **kw: Any) -> tuple[str, ...]:
        kw.setdefault("full", True)  # (never the stat cache's racy window)
        return self.led.workspaces.observe("w", by="test", epoch=epoch, **kw).steps

    def apply(self, epoch: int, step: str, *writes: Any) -> str:
        [verdict] = self.led.workspaces.admit("w", epoch, [StepPlan(step, list(writes))])
        if verdict is not None:
            return verdict.verdict
        return self.led.workspaces.apply(step, epoch=epoch, commit=True).verdict

    def read(self, path: str = "app.py") -> Any:
        return self.led.workspaces.read_file("w", path)

    def acquire(self, **kw: Any) -> int:
        return self.led.workspaces.acquire("w", "agent", ttl_s=600, **kw).epoch


@pytest.fixture
def world(tmp_path: Path):  # type: ignore[no-untyped-def]
    w = World(tmp_path)
    yield w
    w.led.close()


def planned_base(led: Ledger, step: str) -> int:
    [planned] = [e.event for e in led.read(step=step, kind="planned")][-1:]
    return planned.writes[0].base_rev


# -- who counts as an observation ------------------------------------------------------------


def test_a_step_that_takes_an_ended_observations_id_is_no_observation(world: World) -> None:
    """An undone observation's step id is free for a new attempt: a step's write under it
    is a step's write, and an A-B-A through it is not carried over."""
    world.observe()  # the baseline
    world.edit(b"person\n")
    [obs] = world.observe()
    epoch = world.acquire()
    world.led.workspaces.compensate(obs, epoch=epoch)  # A back on disk; the step ended
    assert world.disk() == A
    assert world.apply(epoch, "z1", world.read().write(b"Z\n")) == "applied"
    read = world.read()  # X reads Z
    # Y: its own step under the ended observation's id (attempt 2)
    assert world.apply(epoch, obs, world.read().write(b"Y's work\n")) == "applied"
    world.edit(b"Z\n")  # a person puts Z back: recorded
    assert world.observe(epoch)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:stale_rev"
    assert world.disk() == b"Z\n"


def test_a_replanned_observation_is_no_observation(world: World) -> None:
    """`steptrail step replan` of an undone observation writes its bytes again, as a step:
    a write planned before it is not carried over it."""
    world.observe()
    world.edit(b"person\n")
    [obs] = world.observe()
    epoch = world.acquire()
    world.led.workspaces.compensate(obs, epoch=epoch)
    world.edit(b"Z\n")
    assert world.observe(epoch)  # (a fenced revision to read on)
    world.edit(A)
    assert world.observe(epoch)
    read = world.read()  # A
    attempt = world.led.workspaces.replan(obs, epoch=epoch)
    assert attempt == 2
    assert world.led.workspaces.apply(obs, epoch=epoch, commit=True).verdict == "applied"
    assert world.disk() == b"person\n"  # a step wrote it
    world.edit(A)
    assert world.observe(epoch)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:stale_rev"
    assert world.disk() == A


def test_an_observed_event_appended_by_hand_makes_no_observation(world: World) -> None:
    """An agent's step annotated `observed` through `ledger.append` (a harness labelling
    its agent's work) is still a step's write."""
    world.observe()
    read = world.read()
    epoch = world.acquire()
    y = world.read().write(b"Y's work\n")
    assert world.led.workspaces.admit("w", epoch, [StepPlan("y1", [y], run="agent")]) == [None]
    world.led.append(Observed(step="y1", attempt=1, run="agent", workspace="w", epoch=epoch,
                              by="forger"))
    assert world.led.workspaces.apply("y1", epoch=epoch, commit=True).verdict == "applied"
    world.edit(A)
    assert world.observe(epoch)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:stale_rev"
    assert world.disk() == A


def test_a_step_named_like_an_observation_is_none(world: World) -> None:
    world.observe()
    read = world.read()
    epoch = world.acquire()
    fake = "observed-w-r1-deadbeef"
    assert world.apply(epoch, fake, world.read().write(b"Y's work\n")) == "applied"
    world.edit(A)
    assert world.observe(epoch)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:stale_rev"
    assert world.disk() == A


def test_a_whole_observation_forged_by_hand_still_lands_only_over_what_was_read(
        world: World) -> None:
    """Left as it is: steps of run `observed` with their own `observed` events, appended by
    hand, are indistinguishable from observations (the raw `append` API can record any
    history). Carried over them, the write is still fenced on the disk: a person's save
    nobody observed is kept."""
    world.observe()
    read = world.read()
    epoch = world.acquire()
    for step, data in (("observed-w-forged-1", b"W\n"), ("observed-w-forged-2", A)):
        w = world.read().write(data)
        assert world.led.workspaces.admit("w", epoch, [StepPlan(step, [w], run="observed")]) \
            == [None]
        world.led.append(Observed(step=step, attempt=1, run="observed", workspace="w",
                                  epoch=epoch, by="forger"))
        assert world.led.workspaces.apply(step, epoch=epoch, commit=True).verdict == "applied"
    world.edit(b"unobserved save\n")
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:pre_hash"
    assert world.disk() == b"unobserved save\n"


# -- the disk still decides -------------------------------------------------------------------


def test_an_edit_nobody_observed_is_refused_by_the_fence(world: World) -> None:
    """The ledger holds what was read (carried over), the disk a person's unobserved save:
    refused on the bytes, the save kept."""
    read = world.read()
    epoch = world.acquire(observe=True)  # the baseline: A
    world.edit(b"unobserved save\n")
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:pre_hash"
    assert world.disk() == b"unobserved save\n"


def test_an_edit_after_the_admission_is_refused_and_the_observation_waits(world: World) -> None:
    """Carried over at admission; a person saves; an observation under the same epoch is
    refused while the step is in flight on the path; the apply is refused on the bytes."""
    read = world.read()
    epoch = world.acquire(observe=True)
    [v] = world.led.workspaces.admit("w", epoch, [StepPlan("x1", [read.write(b"B\n")])])
    assert v is None and planned_base(world.led, "x1") > 0  # carried over
    world.edit(b"saved meanwhile\n")
    with pytest.raises(ProtocolRefused):
        world.observe(epoch)
    assert world.led.workspaces.apply("x1", epoch=epoch).verdict == "rejected:pre_hash"
    assert world.disk() == b"saved meanwhile\n"
    assert world.observe(epoch)  # now it is recorded
    assert world.led.verify().ok


def test_a_carried_write_racing_a_takeover_that_observes(world: World) -> None:
    """Writer X admitted (carried over); another holder takes the lease over and observes a
    person's save: X's attempt is settled, its apply is StaleEpoch, the save kept."""

    read = world.read()
    epoch = world.acquire(observe=True)
    [v] = world.led.workspaces.admit("w", epoch, [StepPlan("x1", [read.write(b"B\n")])])
    assert v is None and planned_base(world.led, "x1") > read.rev
    world.edit(b"saved\n")
    other = world.led.workspaces.acquire("w", "other", ttl_s=600, force=True, observe=True)
    assert other.settled == ("x1",) and other.observed
    with pytest.raises(StaleEpoch):
        world.led.workspaces.apply("x1", epoch=epoch)
    assert world.disk() == b"saved\n"


def test_a_file_left_out_by_the_size_cap_is_not_carried_and_is_refused(world: World) -> None:
    big = b"x" * 4096
    world.edit(big, "big.bin")
    world.observe()
    read = world.read("big.bin")
    world.edit(b"y" * 4096, "big.bin")  # a person's edit the next look leaves out
    epoch = world.acquire()
    seen = world.led.workspaces.observe("w", by="test", epoch=epoch, full=True,
                                        max_file_bytes=1024)
    assert [n.why for n in seen.not_captured] == ["too-large"] and not seen.steps
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:pre_hash"
    assert world.disk("big.bin") == b"y" * 4096


def test_a_gitignored_edit_is_not_carried_and_is_refused(world: World) -> None:
    """A file the ledger holds is compared even when git ignores it now; one it never
    held is left out: either way the write is fenced on the disk."""

    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q", str(world.root)], check=True)
    world.edit(b"log.txt\n", ".gitignore")
    world.edit(b"L\n", "log.txt")
    world.observe()  # log.txt left out (ignored)
    read = world.read("log.txt")  # rev 0: the ledger never recorded it
    assert read.rev == 0
    world.edit(b"a person's log line\n", "log.txt")
    epoch = world.acquire(observe=True)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:pre_hash"
    assert world.disk("log.txt") == b"a person's log line\n"


def test_deleted_and_recreated_with_the_read_bytes_is_carried_and_undone_right(
        world: World) -> None:
    """app.py deleted, then made again with the bytes read (each recorded): carried over;
    the carried write lands over A (what was read), its undo puts A back and the deleted
    and re-created history stays."""
    world.observe()
    read = world.read()
    world.edit(None)
    assert world.observe()
    world.edit(A)
    assert world.observe()
    epoch = world.acquire()
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "applied"
    assert planned_base(world.led, "x1") == world.led.workspaces.snapshot("w", "app.py")[0] - 1
    undone = world.led.workspaces.compensate("x1", epoch=epoch)
    assert world.disk() == A, undone
    assert world.led.verify().ok


def test_a_mode_change_observed_is_carried_and_the_undo_keeps_the_mode(world: World) -> None:
    world.observe()
    read = world.read()
    os.chmod(world.root / "app.py", 0o750)
    [obs] = world.observe()
    epoch = world.acquire()
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "applied"
    assert world.disk() == b"B\n"
    world.led.workspaces.compensate("x1", epoch=epoch)
    assert world.disk() == A
    assert os.stat(world.root / "app.py").st_mode & 0o777 == 0o750


def test_a_create_carried_over_a_created_then_deleted_file(world: World) -> None:
    """A create planned on an absent path: a person made the file and removed it (each
    recorded); the create lands on nothing, the person's bytes stay in the ledger."""
    world.observe()
    read = world.read("new.py")
    assert read.pre_hash is None
    world.edit(b"person's file\n", "new.py")
    [made] = world.observe()
    world.edit(None, "new.py")
    assert world.observe()
    epoch = world.acquire()
    assert world.apply(epoch, "x1", read.write(b"mine\n")) == "applied"
    assert world.disk("new.py") == b"mine\n"
    [fenced] = [e.event for e in world.led.read(step=made, kind="fenced")]
    assert world.led.read_blob(fenced.writes[0].post_hash) == b"person's file\n"


def test_a_create_is_refused_where_a_person_made_the_file(world: World) -> None:
    world.observe()
    read = world.read("new.py")
    world.edit(b"person's file\n", "new.py")
    epoch = world.acquire(observe=True)
    assert world.apply(epoch, "x1", read.write(b"mine\n")) == "rejected:stale_rev"
    assert world.disk("new.py") == b"person's file\n"


# -- plans: batches, fence "plan", retries, replan --------------------------------------------


def test_a_batch_that_writes_a_path_twice_carries_only_the_first(world: World) -> None:
    """Two steps of one batch: the first carried over, the second chained on it."""
    read = world.read()
    epoch = world.acquire(observe=True)
    first = read.write(b"B\n")

    second = Write("app.py", b"C\n", pre_hash=digest_of(b"B\n"))
    out = world.led.workspaces.admit("w", epoch, [StepPlan("x1", [first]),
                                                  StepPlan("x2", [second])])
    assert out == [None, None]
    assert world.led.workspaces.apply("x1", epoch=epoch, commit=True).verdict == "applied"
    assert world.led.workspaces.apply("x2", epoch=epoch, commit=True).verdict == "applied"
    assert world.disk() == b"C\n"
    # the second write giving the stale read's revision too: it does not chain
    read = world.read()
    world.edit(b"P\n")
    world.observe(epoch)
    world.edit(b"C\n")
    world.observe(epoch)
    again = Write("app.py", b"E\n", pre_hash=digest_of(b"D\n"), base_rev=read.rev)
    out = world.led.workspaces.admit("w", epoch, [StepPlan("y1", [read.write(b"D\n")]),
                                                  StepPlan("y2", [again])])
    assert [v.verdict for v in out] == ["rejected:overlap"] * 2
    assert world.disk() == b"C\n"


def test_fence_plan_is_never_carried_over(world: World) -> None:
    read = world.read()
    epoch = world.acquire(observe=True)
    [v] = world.led.workspaces.admit("w", epoch, [StepPlan("x1", [read.write(b"B\n")])],
                                     fence="plan")
    assert v is None and planned_base(world.led, "x1") == read.rev  # as given
    assert world.led.workspaces.apply("x1", epoch=epoch).verdict == "applied"
    assert world.led.verify().ok


def test_a_retried_admission_after_more_observations_is_the_same_plan(world: World) -> None:
    read = world.read()
    epoch = world.acquire(observe=True)
    write = read.write(b"B\n")
    assert world.led.workspaces.admit("w", epoch, [StepPlan("x1", [write])]) == [None]
    carried = planned_base(world.led, "x1")
    # retried before the apply, and after: the recorded plan stands
    assert world.led.workspaces.admit("w", epoch, [StepPlan("x1", [write])]) == [None]
    assert world.led.workspaces.apply("x1", epoch=epoch, commit=True).verdict == "applied"
    assert world.led.workspaces.admit("w", epoch, [StepPlan("x1", [write])]) == [None]
    assert planned_base(world.led, "x1") == carried
    assert [e.event.attempt for e in world.led.read(step="x1", kind="planned")] == [1]
    # the same step id with another read's bytes is another plan

    other = world.read().write(b"B\n")
    assert other.pre_hash != write.pre_hash
    with pytest.raises(PlanConflict):
        world.led.workspaces.admit("w", epoch, [StepPlan("x1", [other])])
    assert world.disk() == b"B\n"


def test_a_retry_naming_a_revision_a_step_wrote_is_not_the_same_plan(world: World) -> None:
    """The retry's carry is judged like the first: a recorded plan on a revision a step
    made after the retried read is another plan, even with the same bytes."""
    world.observe()
    read = world.read()
    epoch = world.acquire()
    assert world.apply(epoch, "y1", world.read().write(b"Y\n")) == "applied"
    assert world.apply(epoch, "y2", world.read().write(A)) == "applied"
    fresh = world.read()
    assert world.led.workspaces.admit("w", epoch, [StepPlan("x1", [fresh.write(b"B\n")])]) \
        == [None]

    with pytest.raises(PlanConflict):
        world.led.workspaces.admit("w", epoch, [StepPlan("x1", [read.write(b"B\n")])])


def test_replan_still_checks_the_disk(world: World) -> None:
    """A stale write refused, then re-stamped by an operator: the disk still decides."""
    world.observe()
    read = world.read()
    epoch = world.acquire()
    assert world.apply(epoch, "y1", world.read().write(b"Y\n")) == "applied"
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:stale_rev"

    with pytest.raises(ReplanRefused):
        world.led.workspaces.replan("x1", epoch=epoch)
    assert world.disk() == b"Y\n"


# -- crashes and undo of a carried write -------------------------------------------------------


def kill_at(path: str, call: Callable[[Ledger], Any], op: str, nth: int = 1) -> None:
    """Run `call` in a forked child that SIGKILLs itself just before its `nth` operation
    named `op`; the child must really die there."""
    pid = os.fork()
    if pid == 0:
        try:
            seen = [0]

            def on_op(name: str) -> None:
                if name == op:
                    seen[0] += 1
                    if seen[0] == nth:
                        os.kill(os.getpid(), signal.SIGKILL)

            with Ledger.open(path, on_op=on_op) as led:
                call(led)
            os._exit(0)
        except BaseException:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def _carried_world(world: World) -> tuple[Any, int]:
    """A read of A, then a person's edit and its undo by hand, each recorded."""
    world.observe()
    read = world.read()
    world.edit(b"person\n")
    world.observe()
    world.edit(A)
    world.observe()
    return read, world.acquire()


def test_a_carried_write_killed_after_landing_is_taken_back_at_the_next_lease(
        world: World) -> None:
    read, epoch = _carried_world(world)
    write = read.write(b"B\n")
    world.led.close()

    def go(led: Ledger) -> None:
        [v] = led.workspaces.admit("w", epoch, [StepPlan("x1", [write])])
        assert v is None
        led.workspaces.apply("x1", epoch=epoch, commit=True)

    kill_at(world.path, go, "commit", 2)  # the plan committed; the apply's commit not
    assert world.disk() == b"B\n"  # landed, not recorded
    world.led = Ledger.open(world.path)
    lease = world.led.workspaces.acquire("w", "next", ttl_s=600, force=True, observe=True)
    assert lease.settled == ("x1",) and not lease.conflicts
    assert world.disk() == A
    assert not lease.observed  # the landed bytes were never taken for a person's edit
    assert world.led.verify().ok


def test_a_carried_write_killed_after_landing_is_finished_by_its_retry(world: World) -> None:

    read, epoch = _carried_world(world)
    write = read.write(b"B\n")
    world.led.close()
    kill_at(world.path, lambda led: run_fenced_step(led, "w", "x1", [write], epoch=epoch),
            "commit", 2)
    world.led = Ledger.open(world.path)
    out = run_fenced_step(world.led, "w", "x1", [write], epoch=epoch)  # the same planner
    assert out.status.name == "APPLIED", out
    assert world.disk() == b"B\n"
    world.led.workspaces.compensate("x1", epoch=epoch)
    assert world.disk() == A
    assert world.led.verify().ok


def test_a_carried_write_whose_large_post_image_was_lost_is_planned_again(
        world: World) -> None:
    """A kill between the plan's commit and its large post-image's file: the runner's
    re-run plans again from the planner's read (the old revision), which is the recorded
    plan (carried over), stores the bytes again and applies — nothing left behind."""

    read, epoch = _carried_world(world)
    big = b"B" * (world.led.inline_max_bytes + 1000)
    write = read.write(big)
    world.led.close()
    kill_at(world.path, lambda led: run_fenced_step(led, "w", "x1", [write], epoch=epoch),
            "rename", 1)
    world.led = Ledger.open(world.path)
    assert world.disk() == A
    out = run_fenced_step(world.led, "w", "x1", [write], epoch=epoch)
    assert out.status.name == "APPLIED", out
    assert [e.event.attempt for e in world.led.read(step="x1", kind="planned")] == [1]
    assert world.disk() == big
    world.led.workspaces.compensate("x1", epoch=epoch)
    assert world.disk() == A
    assert world.led.verify().ok


def test_the_undo_of_an_observation_after_a_carried_write_conflicts(world: World) -> None:
    """The observation a write was carried over is undone after the write: the path is
    the write's now, so the undo leaves it as found."""
    world.observe()
    read = world.read()
    world.edit(b"person\n")
    world.observe()
    world.edit(A)
    [back] = world.observe()
    epoch = world.acquire()
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "applied"
    got = world.led.workspaces.compensate(back, epoch=epoch)
    assert [r.outcome for r in got.restored] == ["conflict"]
    assert world.disk() == b"B\n"


def test_the_undo_of_a_carried_write_under_a_later_edit_conflicts(world: World) -> None:
    """A person edits over the carried write (recorded, or not): its undo puts nothing
    back over that edit."""
    read, epoch = _carried_world(world)
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "applied"
    world.edit(b"person on top\n")
    got = world.led.workspaces.compensate("x1", epoch=epoch)
    assert [r.outcome for r in got.restored] == ["conflict"]
    assert world.disk() == b"person on top\n"
    assert world.observe(epoch)
    assert world.disk() == b"person on top\n"


def test_a_killed_observation_in_between_is_no_observation_of_the_path(world: World) -> None:
    """An observation killed after its plan committed records nothing: the revision did
    not move; a later settle ends it; its id taken by a step is still a step."""
    world.observe()
    read = world.read()
    world.edit(b"person\n")
    world.led.close()
    kill_at(world.path, lambda led: led.workspaces.observe("w", by="test", full=True),
            "commit", 3)  # (the observe's own lease, its plan; then killed)
    world.led = Ledger.open(world.path)
    epoch = world.led.workspaces.acquire("w", "next", ttl_s=600, force=True).epoch
    assert world.apply(epoch, "x1", read.write(b"B\n")) == "rejected:pre_hash"
    assert world.disk() == b"person\n"


# -- the observation at each lease ----------------------------------------------------------


def test_cli_acquire_observes_by_default_and_no_observe_skips(world: World) -> None:
    world.led.close()
    runner = CliRunner()
    got = runner.invoke(cli, ["--ledger", world.path, "--workspace", "w", "lease", "acquire",
                              "--holder", "a", "--json"])
    assert got.exit_code == 0, got.output

    doc = json.loads(got.output)
    assert doc["observed"]
    epoch = doc["epoch"]
    runner.invoke(cli, ["--ledger", world.path, "--workspace", "w", "lease", "release",
                        "--epoch", str(epoch)])
    world.edit(b"edited\n")
    got = runner.invoke(cli, ["--ledger", world.path, "--workspace", "w", "lease", "acquire",
                              "--holder", "a", "--no-observe", "--json"])
    assert got.exit_code == 0, got.output
    assert not json.loads(got.output)["observed"]
    world.led = Ledger.open(world.path)


def test_two_large_files_that_keep_changing_do_not_fail_the_acquire(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two logs above the inline size a server keeps writing: each is left out as
    `changing` after two tries; the lease's observation records the rest."""
    inline = world.led.inline_max_bytes
    for name in ("a.log", "b.log"):
        world.edit(b"0" * (inline + 10), name)
    real = observe_mod._store_large
    n = [0]

    def store_large(site: Any, name: str, batch: Any, inline_: Any) -> None:
        for ch in batch:  # each log grows between the look and the store
            if ch.path.endswith(".log"):
                n[0] += 1
                (world.root / ch.path).write_bytes(b"%d" % n[0] * (inline + 10))
        real(site, name, batch, inline_)

    monkeypatch.setattr(observe_mod, "_store_large", store_large)
    lease = world.led.workspaces.acquire("w", "agent", ttl_s=600, observe=True)
    assert lease.observed  # app.py, notes.txt
    [obs] = [e.event for e in world.led.read(kind="observed")][-1:]
    assert sorted((n.path, n.why) for n in obs.not_captured) == [
        ("a.log", "changing"), ("b.log", "changing")]


def test_a_failed_observation_at_cli_acquire_names_the_lease_it_took(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.led.close()

    def fail(*a: Any, **k: Any) -> Any:

        raise EnvironmentFailure("the tree kept changing")

    monkeypatch.setattr(observe_mod, "observe", fail)
    got = CliRunner().invoke(cli, ["--ledger", world.path, "--workspace", "w", "lease",
                                   "acquire", "--holder", "a"])
    # the lease is held (a failed look does not take it away): said, with what to run
    assert got.exit_code == 0, got.output
    world.led = Ledger.open(world.path)
    assert world.led.workspaces.lease("w").epoch == 1
    assert "epoch 1" in got.output and "observing the workspace failed" in got.output
    assert "steptrail observe --epoch 1" in got.output, got.output
    doc = json.loads(CliRunner().invoke(cli, [
        "--ledger", world.path, "--workspace", "w", "lease", "acquire", "--holder", "a",
        "--resume", "--json"]).stdout)
    assert doc["observe_error"].startswith("EnvironmentFailure") and doc["epoch"] == 2


def test_an_mcp_lease_whose_observation_failed_is_not_left_held(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    real = observe_mod.observe
    calls = [0]

    def once(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise EnvironmentFailure("the tree kept changing")
        return real(*a, **k)

    monkeypatch.setattr(observe_mod, "observe", once)
    notices: deque[str] = deque()
    leases = Leases(world.led, threading.RLock(), notices, holder=f"mcp-test:{os.getpid()}",
                    ttl_s=30, wait_s=0.5, linger_s=0, observe=True)
    with leases.hold("w") as epoch:  # the look failed; the lease is the server's, said
        assert epoch >= 1
    assert any("observing workspace 'w' at its lease failed" in n for n in notices), notices
    try:
        with leases.hold("w") as epoch:  # the next call: the lease is not its own any more
            assert epoch >= 1
    except LeaseBusy as busy:
        pytest.fail(f"the next call waits for the lease the failed one took: {busy}")


def test_a_size_capped_file_is_said_at_cli_acquire(world: World) -> None:
    """A person's edit to a file over --max-file-size is never recorded: the acquire's
    report says "nothing changed" unless it names what it left out."""
    with open(world.root / "big.bin", "wb") as f:
        f.truncate(observe_mod.MAX_FILE_BYTES + 1)  # (sparse: nothing is written)
    world.led.close()
    runner = CliRunner()
    base = ["--ledger", world.path, "--workspace", "w", "lease"]
    got = runner.invoke(cli, [*base, "acquire", "--holder", "a", "--json"])
    assert got.exit_code == 0, got.output

    epoch = json.loads(got.output)["epoch"]
    runner.invoke(cli, [*base, "release", "--epoch", str(epoch)])
    with open(world.root / "big.bin", "r+b") as f:
        f.write(b"a person's edit")
    got = runner.invoke(cli, [*base, "acquire", "--holder", "a"])
    assert got.exit_code == 0, got.output
    world.led = Ledger.open(world.path)
    assert "big.bin" in got.output, got.output

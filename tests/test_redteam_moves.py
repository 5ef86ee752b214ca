"""Red-team of the verified moves (issue 36): a person with an editor or a shell racing
a step, a kill at an exact operation, a second process. Each test fails when its attack
succeeds (a save lost, a step half-applied, an unverified delete, a false alarm, an
exception instead of an outcome, a hidden temporary nobody collects)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from test_takeback_races import World, h, save_by_rename

from ledger import Ledger, StepStatus, run_fenced_step
from ledger.workspace import exchange as exchange_mod
from ledger.workspace.directory import temp_stamp
from ledger.workspace.protocol import StepPlan, Write


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(exchange_mod, "_CALL", None)
    return str(request.param)


def everything(root: Path) -> dict[str, str]:
    """Every entry below root (hidden ones too), by kind."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
    return out


def killed_at(w: World, run: Callable[[Ledger], object],
              acts: dict[int, Callable[[], None]], kill_at: int) -> bool:
    """Run `run` in a forked child, a person acting before the given `ws-*` points,
    SIGKILLed right before its `kill_at`-th point; reopen here. True: it died."""
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        n = [0]

        def on_op(name: str) -> None:
            if name.startswith("ws-"):
                n[0] += 1
                if n[0] in acts:
                    acts[n[0]]()
                if n[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

        try:
            run(Ledger.open(w.path, clock=w.clock, on_op=on_op))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    w.ledger = Ledger.open(w.path, clock=w.clock)
    return os.WIFSIGNALED(status)


def ops_of(w: World, run: Callable[[Ledger], object]) -> list[str]:
    seen = w.reopen({})
    run(w.ledger)
    return seen


# -- (e) an exception instead of a conflict outcome -----------------------------------

@pytest.mark.parametrize("swap", ["symlink", "file"])
def test_a_parent_directory_swapped_between_read_and_apply_is_a_conflict(
        tmp_path: Path, mode: str, swap: str) -> None:
    """The leaf swapped for another kind is a conflict (defect 5); its *parent*
    directory swapped for a symlink (or a file) between the read and the apply must be
    one too, not PathEscapes out of run_fenced_step."""
    w = World(tmp_path, {"d/a.txt": b"a0\n", "other/a.txt": b"o\n"})

    def plan(read):  # type: ignore[no-untyped-def]
        r = read.read("d/a.txt")
        os.rename(w.dir / "d", w.dir / "d.moved")
        if swap == "symlink":
            os.symlink("other", w.dir / "d")
        else:
            (w.dir / "d").write_bytes(b"a person's file named d\n")
        return [r.write(b"a1\n")]

    out = run_fenced_step(w.ledger, "w", "s", plan, epoch=w.epoch)
    assert out.status is StepStatus.CONFLICT, out
    assert (w.dir / "other/a.txt").read_bytes() == b"o\n"
    assert (w.dir / "d.moved/a.txt").read_bytes() == b"a0\n"
    w.ledger.close()


def shown(root: Path) -> dict[str, bytes]:
    """Every regular file a person sees: no component of its path is a name of
    steptrail's temporaries (a file inside a hidden slot directory is not seen)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not p.is_symlink() \
                and all(temp_stamp(part) is None for part in rel.parts) \
                and not p.name.endswith(".swp~"):
            out[str(rel)] = p.read_bytes()
    return out


def hidden_entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if temp_stamp(p.name) is not None)


# -- (a)/(f) a person's directory exchanged into a slot, then a kill ---------------------

@pytest.mark.parametrize("recover", ["takeover", "retry"])
def test_a_directory_swapped_in_and_exchanged_aside_by_a_killed_step_is_not_hidden(
        tmp_path: Path, mode: str, recover: str) -> None:
    """A person replaces a.txt by a directory of their files right before the step's
    exchange (or its move aside, without the exchange call); the step is killed before
    it swaps back. Whatever recovers (a takeover's settle, or the retry of the apply
    with the same epoch) must leave the person's directory at a visible path — not
    under the slot name, where nothing ever looks (`landed` and `remove_temporaries`
    skip anything not a regular file) — and a.txt must not be left holding the step's
    bytes while the step is recorded refused."""
    a0, a1 = b"a0\n", b"a1 by the step\n"
    files = {"a.txt": a0}
    plan = [StepPlan("s", [Write("a.txt", a1, h(a0), 0)])]

    count = World(tmp_path / "count", files)
    count.ledger.workspaces.admit("w", count.epoch, plan)
    seen = ops_of(count, lambda led: led.workspaces.apply("s", epoch=count.epoch))
    count.ledger.close()
    first = seen.index("ws-rename") + 1  # the exchange (or the move aside)

    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    notes = b"a person's notes, in a directory that took a.txt's name\n"

    def swap_in() -> None:
        os.unlink(w.dir / "a.txt")
        os.mkdir(w.dir / "a.txt")
        (w.dir / "a.txt" / "notes").write_bytes(notes)

    died = killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch),
                     {first: swap_in}, first + 1)
    assert died
    if recover == "takeover":
        w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    else:
        w.ledger.workspaces.apply("s", epoch=w.epoch)
    got = shown(w.dir)
    assert notes in got.values(), (everything(w.dir), got)
    step = w.ledger.step("s")
    if step.state != "acked" and step.state != "fenced":
        assert got.get("a.txt") != a1, (step.state, got)
    w.ledger.close()

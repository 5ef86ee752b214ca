"""The fenced write as an exchange: rotations, swaps and moves killed at any rename
settle forward or back; a person's save made during a step's renames is never lost;
modes before visibility; an undo killed halfway is finished (issue: the fenced step).

Each crash is a real SIGKILL of a forked process at an exact file operation; each
person is a real write (by rename, as editors save, or in place) made from inside the
apply, between two of its renames.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FakeClock

from ledger import Ledger, UnsafeRename
from ledger.workspace import exchange as exchange_mod
from ledger.workspace import moves as moves_mod
from ledger.step.values import StepPlan, Write
from ledger.gc.collector import collect

N = 12


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the exchange call and without it (the fallback path)."""
    if request.param == "fallback":
        monkeypatch.setattr(exchange_mod, "_CALL", None)
    else:
        assert exchange_mod.supported(), "this machine has renameat2: the tests expect it"
    return str(request.param)


class Ws:
    def __init__(self, tmp: Path, files: dict[str, bytes]) -> None:
        self.dir = tmp / "ws"
        self.dir.mkdir(parents=True)
        for name, data in files.items():
            (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.dir / name).write_bytes(data)
        self.clock = FakeClock()
        self.path = tmp / "ledger.db"
        self.ledger = Ledger.init(self.path, clock=self.clock)
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.dir)): p.read_bytes()
                for p in sorted(self.dir.rglob("*")) if p.is_file()
                and ".steptrail" not in p.relative_to(self.dir).parts[0]}

    def leftovers(self) -> list[str]:
        return [str(p) for p in self.dir.rglob("*") if ".steptrail-" in p.name]

    def killed_during(self, run: Callable[[Ledger], object], at: int,
                      op: str = "ws-rename") -> None:
        """Run `run` in a forked child over the ledger and SIGKILL it right before its
        `at`-th `op`; reopen the ledger here."""
        self.ledger.close()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            seen = [0]

            def on_op(name: str) -> None:
                if name == op:
                    seen[0] += 1
                    if seen[0] == at:
                        os.kill(os.getpid(), signal.SIGKILL)

            run(Ledger.open(self.path, clock=self.clock, on_op=on_op))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        self.ledger = Ledger.open(self.path, clock=self.clock)


def rotation(n: int = N) -> tuple[dict[str, bytes], StepPlan]:
    """f_i := f_(i+1), f_(n-1) := f_0: every pre-image is another path's post-image."""
    files = {f"f{i:02}": f"content {i}\n".encode() for i in range(n)}
    names = sorted(files)
    writes = [Write(names[i], files[names[(i + 1) % n]], h(files[names[i]]))
              for i in range(n)]
    return files, StepPlan("rotate", writes)


def move(n: int = 8) -> tuple[dict[str, bytes], StepPlan]:
    """A directory move: every file deleted under src/ and created under dst/."""
    files = {f"src/m{i}.txt": f"moved {i}\n".encode() for i in range(n)}
    writes: list[Write] = []
    for name, data in files.items():
        writes.append(Write(name, None, h(data)))
        writes.append(Write("dst/" + name[4:], data, None))
    return files, StepPlan("move", writes)


def swap() -> tuple[dict[str, bytes], StepPlan]:
    files = {"a": b"A\n", "b": b"B\n"}
    return files, StepPlan("swap", [Write("a", b"B\n", h(b"A\n")),
                                    Write("b", b"A\n", h(b"B\n"))])


SHAPES = {"rotation": rotation, "move": move, "swap": swap}


def renames_of(plan: StepPlan) -> int:
    return len(plan.writes)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_permutation_killed_at_every_rename_is_settled_back_by_the_next_epoch(
        tmp_path: Path, mode: str, shape: str) -> None:
    files, plan = SHAPES[shape]()
    for at in range(1, renames_of(plan) + 1):
        ws = Ws(tmp_path / f"{shape}-{at}", files)
        ws.ledger.workspaces.admit("w", ws.epoch, [plan])
        ws.killed_during(lambda led: led.workspaces.apply(plan.step, epoch=ws.epoch), at)
        assert ws.ledger.step(plan.step).state == "planned"
        lease = ws.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
        assert lease.settled == (plan.step,), at
        assert ws.files() == files, f"{shape} killed before rename {at}: not rolled back"
        assert ws.leftovers() == [], at
        comp = ws.ledger.timeline(plan.step)[-1].event
        assert all(r.outcome != "conflict" for r in comp.restored), comp.restored
        assert ws.ledger.verify().ok
        # a collection takes nothing a path needs, and the step planned again applies
        collect(ws.ledger, grace_s=0, force=True, now_ns=ws.clock() + 10**13)
        assert ws.files() == files and ws.ledger.verify().ok
        assert ws.ledger.workspaces.admit("w", lease.epoch, [plan]) == [None]
        assert ws.ledger.step(plan.step).attempt == 2
        again = ws.ledger.workspaces.apply(plan.step, epoch=lease.epoch)
        assert again.verdict == "applied", (at, again, comp.restored)
        expected = {w.path: w.content for w in plan.writes if w.content is not None}
        assert ws.files() == expected
        ws.ledger.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_permutation_killed_at_every_rename_rolls_forward_on_replay(
        tmp_path: Path, mode: str, shape: str) -> None:
    files, plan = SHAPES[shape]()
    expected = {w.path: w.content for w in plan.writes if w.content is not None}
    for at in range(1, renames_of(plan) + 1):
        ws = Ws(tmp_path / f"{shape}-{at}", files)
        ws.ledger.workspaces.admit("w", ws.epoch, [plan])
        ws.killed_during(lambda led: led.workspaces.apply(plan.step, epoch=ws.epoch), at)
        result = ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
        assert result.verdict == "applied", (at, result)
        assert ws.files() == expected, at
        assert ws.leftovers() == [], at
        ws.ledger.publish(plan.step, receipt=result.receipt)
        ws.ledger.ack(plan.step, epoch=ws.epoch)
        collect(ws.ledger, grace_s=0, force=True, now_ns=ws.clock() + 10**13)
        comp = ws.ledger.workspaces.compensate(plan.step, epoch=ws.epoch)  # every pre-image was kept
        assert [r.outcome for r in comp.restored] == ["restored"] * len(plan.writes), at
        assert ws.files() == files
        assert ws.ledger.verify().ok
        ws.ledger.close()


def _save_by_rename(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".editor-swp")
    tmp.write_bytes(data)
    os.rename(tmp, path)


def _save_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


@pytest.mark.parametrize("save", [_save_by_rename, _save_in_place], ids=["by-rename", "in-place"])
def test_a_save_during_the_renames_is_kept_and_the_step_rolled_back(
        tmp_path: Path, mode: str, save: Callable[[Path, bytes], None]) -> None:
    """A person saves the last file of a 12-file rotation after the first rename landed:
    the step is rejected, their bytes stay, the eleven paths before are rolled back."""
    files, plan = rotation()
    ws = Ws(tmp_path, files)
    ws.ledger.workspaces.admit("w", ws.epoch, [plan])
    last = sorted(files)[-1]
    renames = [0]

    def person(name: str) -> None:
        if name == "ws-rename":
            renames[0] += 1
            if renames[0] == 2:
                save(ws.dir / last, b"the person's work\n")

    ws.ledger.close()
    ws.ledger = Ledger.open(ws.path, clock=ws.clock, on_op=person)
    result = ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
    assert result.verdict == "rejected:pre_hash"
    assert result.facts["path"] == last and result.facts["on_disk"] == h(b"the person's work\n")
    assert ws.files() == {**files, last: b"the person's work\n"}
    assert ws.leftovers() == []
    assert ws.ledger.verify().ok


def test_a_save_right_before_the_move_is_kept_with_and_without_the_exchange_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the exchange call a save made right before a path's move is displaced,
    checked and put back; without it the file is moved aside, checked there and put
    back the same way (the fallback's old window — check, then rename over the name —
    is closed: the name is only ever given a file with a no-replace link)."""
    kept = {}
    for label in ("exchange", "fallback"):
        if label == "fallback":
            monkeypatch.setattr(exchange_mod, "_CALL", None)
        files = {"a.txt": b"a0\n"}
        ws = Ws(tmp_path / label, files)
        ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("s", [Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])

        def person(name: str, ws: Ws = ws) -> None:
            if name == "ws-rename":  # after the fallback's check, before any rename
                _save_by_rename(ws.dir / "a.txt", b"saved\n")

        ws.ledger.close()
        ws.ledger = Ledger.open(ws.path, clock=ws.clock, on_op=person)
        verdict = ws.ledger.workspaces.apply("s", epoch=ws.epoch).verdict
        kept[label] = (verdict, (ws.dir / "a.txt").read_bytes())
        ws.ledger.close()
    assert kept["exchange"] == ("rejected:pre_hash", b"saved\n")
    assert kept["fallback"] == ("rejected:pre_hash", b"saved\n")


def test_a_moved_private_file_is_private_before_any_name_shows_it(
        tmp_path: Path, mode: str) -> None:
    ws = Ws(tmp_path, {"src/.env": b"SECRET=1\n"})
    os.chmod(ws.dir / "src/.env", 0o600)
    ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("mv", [
        Write("src/.env", None, h(b"SECRET=1\n"), 0),
        Write("dst/.env", b"SECRET=1\n", None, 0, mode=0o600)])])
    seen: list[int] = []

    def watch(name: str) -> None:
        if name == "ws-rename" and (ws.dir / "dst").exists():
            for p in (ws.dir / "dst").iterdir():
                seen.append(stat.S_IMODE(p.lstat().st_mode))

    ws.ledger.close()
    ws.ledger = Ledger.open(ws.path, clock=ws.clock, on_op=watch)
    assert ws.ledger.workspaces.apply("mv", epoch=ws.epoch).verdict == "applied"
    assert seen and all(m == 0o600 for m in seen), [oct(m) for m in seen]
    assert stat.S_IMODE((ws.dir / "dst/.env").stat().st_mode) == 0o600


def test_a_moved_private_file_stays_private_after_a_kill_after_the_commit(
        tmp_path: Path, mode: str) -> None:
    ws = Ws(tmp_path, {"src/.env": b"SECRET=1\n"})
    os.chmod(ws.dir / "src/.env", 0o600)
    ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("mv", [
        Write("src/.env", None, h(b"SECRET=1\n"), 0),
        Write("dst/.env", b"SECRET=1\n", None, 0, mode=0o600)])])
    ws.killed_during(lambda led: led.workspaces.apply("mv", epoch=ws.epoch), 1, op="ws-unlink")
    assert ws.ledger.step("mv").state == "fenced"
    assert stat.S_IMODE((ws.dir / "dst/.env").stat().st_mode) == 0o600


def test_a_mode_is_for_a_created_file_only(tmp_path: Path) -> None:
    from ledger.errors import InvalidInput
    ws = Ws(tmp_path, {"a": b"a"})
    for bad in (Write("b", None, h(b"a"), mode=0o600), Write("b", b"x", None, mode=0o10000),
                Write("b", b"x", None, mode="600")):  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("s", [bad])])
    assert ws.ledger.find_step("s") is None


def test_an_undo_killed_halfway_is_finished_by_the_next_epoch(
        tmp_path: Path, mode: str) -> None:
    files, plan = rotation(6)
    expected = {w.path: w.content for w in plan.writes if w.content is not None}
    for at in (1, 3, 6):
        ws = Ws(tmp_path / str(at), files)
        ws.ledger.workspaces.admit("w", ws.epoch, [plan])
        ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
        ws.ledger.publish(plan.step)
        ws.ledger.ack(plan.step, epoch=ws.epoch)
        ws.killed_during(lambda led: led.workspaces.compensate(plan.step, epoch=ws.epoch), at)
        row = ws.ledger.step(plan.step)
        assert row.state == "compensating", (at, row.state)
        assert ws.files() != expected or at == 1
        assert ws.ledger.workspaces.unsettled("w", ws.epoch + 1) == [plan.step]
        lease = ws.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
        assert lease.settled == (plan.step,)
        assert ws.files() == files, at
        assert ws.leftovers() == []
        assert ws.ledger.step(plan.step).state == "compensated"
        assert ws.ledger.verify().ok
        ws.ledger.close()


def test_a_retried_undo_finishes_what_a_killed_one_began(tmp_path: Path, mode: str) -> None:
    files, plan = rotation(4)
    ws = Ws(tmp_path, files)
    ws.ledger.workspaces.admit("w", ws.epoch, [plan])
    ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
    ws.ledger.publish(plan.step)
    ws.ledger.ack(plan.step, epoch=ws.epoch)
    # killed before its third rename: the third path's exchange — without the exchange
    # call (two renames a path: aside, then link) the second path's move aside
    ws.killed_during(lambda led: led.workspaces.compensate(plan.step, epoch=ws.epoch), 3)
    comp = ws.ledger.workspaces.compensate(plan.step, epoch=ws.epoch)
    assert sorted(r.outcome for r in comp.restored) == (
        ["already", "already", "restored", "restored"] if mode == "exchange"
        else ["already", "restored", "restored", "restored"])
    ws.ledger.close()
    ws.ledger = Ledger.open(ws.path, clock=ws.clock)
    # and killed between the move aside and the link: the name is absent; the retry
    # finishes the link
    ws2 = Ws(tmp_path / "between", files)
    ws2.ledger.workspaces.admit("w", ws2.epoch, [plan])
    ws2.ledger.workspaces.apply(plan.step, epoch=ws2.epoch)
    ws2.ledger.publish(plan.step)
    ws2.ledger.ack(plan.step, epoch=ws2.epoch)
    ws2.killed_during(lambda led: led.workspaces.compensate(plan.step, epoch=ws2.epoch), 4)
    comp = ws2.ledger.workspaces.compensate(plan.step, epoch=ws2.epoch)
    assert {r.outcome for r in comp.restored} <= {"already", "restored"}
    assert ws2.files() == files and ws2.leftovers() == []
    assert ws2.ledger.verify().ok
    assert ws.files() == files and ws.leftovers() == []
    assert ws.ledger.verify().ok


def test_a_directory_swapped_for_a_symlink_mid_step_writes_nothing_outside(
        tmp_path: Path, mode: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b").write_bytes(b"outside\n")
    ws = Ws(tmp_path, {"sub/a": b"a0\n", "sub/b": b"b0\n"})
    ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("s", [Write("sub/a", b"a1\n", h(b"a0\n"), 0),
                                                   Write("sub/b", b"b1\n", h(b"b0\n"), 0)])])
    done = [False]

    def attacker(name: str) -> None:
        if name == "ws-rename" and not done[0]:
            done[0] = True
            os.rename(ws.dir / "sub", ws.dir / "sub-moved")
            os.symlink(outside, ws.dir / "sub")

    ws.ledger.close()
    ws.ledger = Ledger.open(ws.path, clock=ws.clock, on_op=attacker)
    try:
        ws.ledger.workspaces.apply("s", epoch=ws.epoch)
    except Exception as exc:  # a typed refusal is fine; a write outside is not
        from ledger.errors import LedgerError
        assert isinstance(exc, LedgerError), exc
    assert (outside / "b").read_bytes() == b"outside\n"
    assert sorted(p.name for p in outside.iterdir()) == ["b"]


def test_without_exchange_or_hard_links_steps_apply_only_once_the_window_is_accepted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system with neither (FAT, some FUSE mounts): creates, edits, deletes and
    moves apply; a stale write is refused with the person's bytes kept; nothing is left
    behind. (What such a file system cannot give: a create's evidence after a kill.)"""
    import errno as errno_mod

    monkeypatch.setattr(exchange_mod, "_CALL", None)

    def no_link(*_a: object, **_k: object) -> None:
        raise OSError(errno_mod.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(moves_mod, "_LINKS_BY_DEVICE", {})  # probed anew
    files, plan = move(3)
    ws = Ws(tmp_path, {**files, "a.txt": b"a0\n"})
    ws.ledger.workspaces.admit("w", ws.epoch, [plan])
    # refused until the user accepts the check-then-rename window; nothing moved
    with pytest.raises(UnsafeRename, match="STEPTRAIL_UNSAFE_RENAME=1"):
        ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
    assert ws.files() == {**files, "a.txt": b"a0\n"} and ws.leftovers() == []
    monkeypatch.setattr(moves_mod, "unsafe_fallback", True)
    assert ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch).verdict == "applied"
    assert ws.files() == {"a.txt": b"a0\n", **{"dst/" + k[4:]: v for k, v in files.items()}}
    ws.ledger.workspaces.admit("w", ws.epoch, [StepPlan("e", [Write("a.txt", b"a1\n", h(b"a0\n"))])])
    (ws.dir / "a.txt").write_bytes(b"person\n")
    assert ws.ledger.workspaces.apply("e", epoch=ws.epoch).verdict == "rejected:pre_hash"
    assert (ws.dir / "a.txt").read_bytes() == b"person\n"
    ws.ledger.publish(plan.step)
    ws.ledger.ack(plan.step, epoch=ws.epoch)
    comp = ws.ledger.workspaces.compensate(plan.step, epoch=ws.epoch)
    assert {r.outcome for r in comp.restored} == {"restored"}
    assert ws.files() == {**files, "a.txt": b"person\n"} and ws.leftovers() == []
    assert ws.ledger.verify().ok


def test_what_a_kill_after_the_commit_left_is_removed_by_the_next_apply(
        tmp_path: Path, mode: str) -> None:
    """Killed after the step's commit, before the displaced files went: they are
    steptrail's temporaries (the old bytes, stored); the next step writing in that
    directory removes them — under the same epoch too, the attempt being over."""
    from ledger import run_fenced_step

    files, plan = rotation(4)
    ws = Ws(tmp_path, files)

    def step(led: Ledger) -> object:
        return run_fenced_step(led, "w", "rotate", list(plan.writes), epoch=ws.epoch)

    ws.killed_during(step, 1, op="ws-unlink")
    assert ws.ledger.step("rotate").state == "acked"
    assert ws.leftovers()
    out = run_fenced_step(ws.ledger, "w", "next", [Write("new.txt", b"n\n", None)],
                          epoch=ws.epoch)
    assert out.committed and ws.leftovers() == []
    assert ws.ledger.verify().ok


def test_a_staged_copy_removed_before_it_was_placed_touches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the many-process stress run: a zombie's staging races the new epoch's
    cleanup of dead stagers' files. The write then has no staged copy: a zombie hears
    StaleEpoch; under a live epoch it is a typed StorageFailure; no file is touched and
    nothing is deleted for want of a staged copy."""
    from ledger.errors import StaleEpoch, StorageFailure
    from ledger.workspace import staging
    from ledger.workspace.directory import WorkspaceDir
    from ledger.workspace.staging import StagingLost

    files, plan = swap()
    ws = Ws(tmp_path, files)
    ws.ledger.workspaces.admit("w", ws.epoch, [plan])
    real = staging.stage

    def lost(self: WorkspaceDir, path: str, *a: object, **k: object) -> object:
        if path == "b":
            raise StagingLost(path)
        return real(self, path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(staging, "stage", lost)
    with pytest.raises(StorageFailure):
        ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
    assert ws.files() == files and ws.ledger.step(plan.step).state == "planned"
    ws.ledger.workspaces.acquire("w", "other", ttl_s=60, force=True)
    with pytest.raises(StaleEpoch):
        ws.ledger.workspaces.apply(plan.step, epoch=ws.epoch)
    assert ws.files() == files and ws.leftovers() == []

"""A person's save is never lost on the paths that take bytes back (issue 36, defects 1-5).

Each test acts as a person at every workspace file operation of a step (the `ws-*`
points of the `on_op` seam), in both modes (with the exchange call and without), and
checks that every byte the person wrote last is on disk at a visible path at the end,
that nothing the step displaced sits only in a hidden temporary, and that the outcome
names what happened. Each of these lost a save, or left a step half-applied, before the
verified primitive (`ledger/workspace/moves.py`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FakeClock

from ledger import Ledger, StepStatus, run_fenced_step
from ledger.workspace import exchange as exchange_mod
from ledger.workspace.names import temp_stamp
from ledger.step.values import StepPlan, Write

BIG = 300_000


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(exchange_mod, "_CALL", None)
    return str(request.param)


def save_by_rename(path: Path, data: bytes) -> None:
    """What an editor does: write a temporary beside the file, rename it over."""
    tmp = path.with_name(path.name + ".swp~")
    tmp.write_bytes(data)
    os.rename(tmp, path)


class World:
    """A workspace, its ledger and a lease; `run` applies a step with a person acting
    at chosen `ws-*` points."""

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

    def reopen(self, actions: dict[int, Callable[[], None]]) -> list[str]:
        """Reopen the ledger with a person acting right before the i-th `ws-*` point."""
        seen: list[str] = []

        def on_op(name: str) -> None:
            if name.startswith("ws-"):
                seen.append(name)
                act = actions.get(len(seen))
                if act is not None:
                    act()

        self.ledger.close()
        self.ledger = Ledger.open(self.path, clock=self.clock, on_op=on_op)
        return seen

    def visible(self) -> dict[str, bytes]:
        """Every regular file a person sees (not steptrail's temporaries, not the
        ledger)."""
        out = {}
        for p in sorted(self.dir.rglob("*")):
            rel = p.relative_to(self.dir)
            if p.is_file() and not p.is_symlink() and temp_stamp(p.name) is None \
                    and not p.name.endswith(".swp~"):
                out[str(rel)] = p.read_bytes()
        return out

    def hidden(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.dir)): p.read_bytes() for p in self.dir.rglob("*")
                if p.is_file() and temp_stamp(p.name) is not None}


def points(tmp: Path, files: dict[str, bytes], run: Callable[[World], object]) -> int:
    """How many `ws-*` points `run` passes with nobody acting."""
    w = World(tmp / "count", files)
    seen = w.reopen({})
    run(w)
    w.ledger.close()
    return len(seen)


def test_a_save_during_the_take_back_after_a_refusal_is_kept(tmp_path: Path, mode: str) -> None:
    """Defect 1: a step writes a large file and a small one; the small one is edited
    by a person while the step lands (its fence fails), so the landed large one is
    taken back — and a person's save of the large one lands during that take-back.
    For every pair of points: both of the person's saves are on disk, visible."""
    big0, small0 = b"B" * BIG, b"small 0\n"
    files = {"big.bin": big0, "small.txt": small0}

    def admit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
            Write("big.bin", b"N" * BIG, h(big0), 0), Write("small.txt", b"small 1\n",
                                                           h(small0), 0)])])

    def run(w: World) -> object:
        return w.ledger.workspaces.apply("s", epoch=w.epoch)

    def counted(w: World) -> object:
        admit(w)
        w.reopen({})
        return run(w)

    n = points(tmp_path, files, lambda w: (admit(w), run(w)))
    assert n >= 6
    losses = []
    for i in range(1, n + 1):
        for j in range(i, n + 2):
            w = World(tmp_path / f"{i}-{j}", files)
            admit(w)
            edit = b"person edit of small\n"
            save = b"P" * (BIG - 7) + b"person\n"
            saved: list[bool] = []

            def do_save(w: World = w, save: bytes = save, saved: list[bool] = saved) -> None:
                save_by_rename(w.dir / "big.bin", save)
                saved.append(True)

            w.reopen({i: lambda w=w, edit=edit: (w.dir / "small.txt").write_bytes(edit),
                      j: do_save} if i != j else {i: lambda w=w, edit=edit: (
                          (w.dir / "small.txt").write_bytes(edit), do_save())})
            result = run(w)
            seen = w.visible()
            values = set(seen.values())
            if save not in values and saved:
                losses.append((i, j, result.verdict, "the save of big.bin is nowhere visible"))
            if edit not in values:
                losses.append((i, j, result.verdict, "the edit of small.txt is nowhere visible"))
            if result.verdict.startswith("rejected") and save in w.hidden().values() \
                    and save not in values:
                losses.append((i, j, result.verdict, "the save sits in a hidden temporary"))
            w.ledger.close()
    assert losses == []


def test_a_second_quick_save_is_kept(tmp_path: Path, mode: str) -> None:
    """Defect 2: save, then an immediate second save (format-on-save) of one file during
    a step: at every pair of consecutive points, the second save is on disk, visible."""
    a0 = b"a0\n" * 1000
    files = {"a.txt": a0, "b.txt": b"b0\n"}

    def admit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
            Write("a.txt", b"a1\n", h(a0), 0), Write("b.txt", b"b1\n", h(b"b0\n"), 0)])])

    n = points(tmp_path, files,
               lambda w: (admit(w), w.ledger.workspaces.apply("s", epoch=w.epoch)))
    losses = []
    for i in range(1, n + 1):
        w = World(tmp_path / str(i), files)
        admit(w)
        first, second = b"first save\n", b"second save\n"
        saved: list[bool] = []
        w.reopen({i: lambda w=w: save_by_rename(w.dir / "a.txt", first),
                  i + 1: lambda w=w, saved=saved: (save_by_rename(w.dir / "a.txt", second),
                                                   saved.append(True))})
        result = w.ledger.workspaces.apply("s", epoch=w.epoch)
        if saved and second not in w.visible().values():
            losses.append((i, result.verdict, sorted(w.visible()), sorted(w.hidden())))
        w.ledger.close()
    assert losses == []


def test_a_directory_renamed_mid_step_is_never_recreated_and_nothing_is_half_applied(
        tmp_path: Path, mode: str) -> None:
    """Defect 3: `git mv src lib` at any point of a step writing src/a.bin and src/b.txt:
    the step either lands whole before the move (both new files under lib/) or is
    refused with every original back under lib/; src/ is never recreated; nothing of
    the originals is left only in a hidden temporary; the outcome names the move."""
    a0, b0 = b"A" * BIG, b"b0\n"
    a1, b1 = b"N" * BIG, b"b1\n"
    files = {"src/a.bin": a0, "src/b.txt": b0, "keep.txt": b"k\n"}

    def admit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
            Write("src/a.bin", a1, h(a0), 0), Write("src/b.txt", b1, h(b0), 0)])])

    n = points(tmp_path, files,
               lambda w: (admit(w), w.ledger.workspaces.apply("s", epoch=w.epoch)))
    bad = []
    for i in range(1, n + 1):
        w = World(tmp_path / str(i), files)
        admit(w)
        w.reopen({i: lambda w=w: os.rename(w.dir / "src", w.dir / "lib")})
        result = w.ledger.workspaces.apply("s", epoch=w.epoch)
        seen = w.visible()
        if (w.dir / "src").exists():
            bad.append((i, result.verdict, "src/ was recreated"))
        got = (seen.get("lib/a.bin"), seen.get("lib/b.txt"))
        if result.verdict == "applied":
            ok = got == (a1, b1)
        else:
            # moved before the step's checks: the path is absent; after: the landing
            # finds its directory moved, and says where it went
            ok = got == (a0, b0) and ("renamed or moved" in result.detail
                                      and "now lib" in result.detail
                                      or "(on disk: absent)" in result.detail)
        if not ok:
            bad.append((i, result.verdict, result.detail[:120],
                        tuple(None if g is None else g[:4] for g in got)))
        w.ledger.close()
    assert bad == []


def test_undo_of_a_move_whose_old_name_a_person_reused_touches_neither(
        tmp_path: Path, mode: str) -> None:
    """Defect 4: a committed move src/m.txt -> dst/m.txt; a person makes a new src/m.txt;
    the undo cannot put the moved file back, so it removes nothing: the destination
    stays, the person's new file stays, both are reported."""
    m = b"moved content\n"
    w = World(tmp_path, {"src/m.txt": m})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("mv", [
        Write("src/m.txt", None, h(m), 0), Write("dst/m.txt", m, None, 0)])])
    assert w.ledger.workspaces.apply("mv", epoch=w.epoch).verdict == "applied"
    w.ledger.publish("mv")
    w.ledger.ack("mv", epoch=w.epoch)
    (w.dir / "src/m.txt").write_bytes(b"the person's new file\n")
    comp = w.ledger.workspaces.compensate("mv", epoch=w.epoch)
    assert {r.path: r.outcome for r in comp.restored} == {"src/m.txt": "conflict",
                                                          "dst/m.txt": "conflict"}
    assert w.visible() == {"src/m.txt": b"the person's new file\n", "dst/m.txt": m}
    assert w.ledger.verify().ok


def test_undo_of_a_move_puts_the_source_back_before_removing_the_destination(
        tmp_path: Path, mode: str) -> None:
    """The undo of a move with nothing in the way: both paths back, and at no point of
    it is the moved content at no visible path (checked at every point)."""
    m = b"moved content\n"
    files = {"src/m.txt": m}

    def setup(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("mv", [
            Write("src/m.txt", None, h(m), 0), Write("dst/m.txt", m, None, 0)])])
        w.ledger.workspaces.apply("mv", epoch=w.epoch)
        w.ledger.publish("mv")
        w.ledger.ack("mv", epoch=w.epoch)

    def undo(w: World) -> object:
        return w.ledger.workspaces.compensate("mv", epoch=w.epoch)

    n = points(tmp_path, files, lambda w: (setup(w), w.reopen({}), undo(w)))
    missing = []
    for i in range(1, n + 1):
        w = World(tmp_path / str(i), files)
        setup(w)
        w.reopen({i: lambda w=w, i=i: missing.append(i) if m not in w.visible().values()
                  else None})
        comp = undo(w)
        assert {r.outcome for r in comp.restored} == {"restored"}
        assert w.visible() == files
        w.ledger.close()
    assert missing == []


@pytest.mark.parametrize("swap", ["symlink", "directory", "fifo"])
def test_a_target_swapped_for_another_kind_is_a_conflict_outcome(
        tmp_path: Path, mode: str, swap: str) -> None:
    """Defect 5: a symlink, a directory or a FIFO put in the target's place between the
    read and the apply is a conflict outcome (nothing written), not an exception."""
    w = World(tmp_path, {"a.txt": b"a0\n", "other.txt": b"o\n"})

    def plan(read):  # type: ignore[no-untyped-def]
        r = read.read("a.txt")
        os.unlink(w.dir / "a.txt")
        if swap == "symlink":
            os.symlink("other.txt", w.dir / "a.txt")
        elif swap == "directory":
            os.mkdir(w.dir / "a.txt")
        else:
            os.mkfifo(w.dir / "a.txt")
        return [r.write(b"a1\n")]

    out = run_fenced_step(w.ledger, "w", "s", plan, epoch=w.epoch)
    assert out.status is StepStatus.CONFLICT, out
    assert "not the regular file" in out.detail
    assert (w.dir / "other.txt").read_bytes() == b"o\n"
    kind = os.lstat(w.dir / "a.txt").st_mode
    assert {"symlink": os.path.islink, "directory": os.path.isdir,
            "fifo": lambda p: not os.path.isfile(p)}[swap](w.dir / "a.txt"), kind
    w.ledger.close()


def test_what_a_kill_after_the_commit_left_is_collected_by_gc_after_a_takeover(
        tmp_path: Path, mode: str) -> None:
    """Defect 9: killed after the step's commit, before the displaced files went, then
    taken over by another worker: the next `gc` collects those temporaries (the old
    bytes, which the ledger holds since the commit) — checked, not by name — and keeps
    nothing visible, since nobody raced the step."""
    import signal

    from ledger.gc.collector import collect

    files = {f"d/f{i}.txt": f"content {i}\n".encode() for i in range(3)}
    w = World(tmp_path, files)
    writes = [Write(f"d/f{i}.txt", f"new {i}\n".encode(), h(files[f"d/f{i}.txt"]), 0)
              for i in range(3)]
    w.ledger.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, killed at its first release
        def on_op(name: str) -> None:
            if name == "ws-unlink":
                os.kill(os.getpid(), signal.SIGKILL)

        led = Ledger.open(w.path, clock=w.clock, on_op=on_op)
        run_fenced_step(led, "w", "s", writes, epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    w.ledger = Ledger.open(w.path, clock=w.clock)
    assert w.ledger.step("s").state == "acked"
    assert len(w.hidden()) >= 3  # (without the exchange call, the links of the new files too)
    w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    w.clock.advance(7200)
    report = collect(w.ledger, grace_s=0, force=True, now_ns=w.clock() + 10**13)
    assert w.hidden() == {}, report
    assert w.visible() == {f"d/f{i}.txt": f"new {i}\n".encode() for i in range(3)}
    assert w.ledger.verify().ok
    w.ledger.close()


def test_a_save_met_between_the_swaps_is_kept_recorded_and_shown_by_status(
        tmp_path: Path) -> None:
    """A person saves right before the landing's exchange (the landing is refused) and
    again right before its swap back: the second save is in the step's slot then. It is
    kept under a visible name, named in the refusal (`undone[].kept`), the ledger and
    `status`; nothing is kept in a run where nobody raced."""
    from conftest import run_cli

    a0 = b"a0\n"
    files = {"a.txt": a0}

    def admit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [Write("a.txt", b"a1\n", h(a0), 0)])])

    count = World(tmp_path / "count", files)
    admit(count)
    seen = count.reopen({})
    count.ledger.workspaces.apply("s", epoch=count.epoch)
    assert count.ledger.workspaces.kept("w") == [] and count.hidden() == {}
    count.ledger.close()
    i = seen.index("ws-rename") + 1  # the exchange's point

    w = World(tmp_path / "race", files)
    admit(w)
    w.reopen({i: lambda: save_by_rename(w.dir / "a.txt", b"first\n"),
              i + 1: lambda: save_by_rename(w.dir / "a.txt", b"second\n")})
    result = w.ledger.workspaces.apply("s", epoch=w.epoch)
    assert result.verdict == "rejected:pre_hash"
    seen_files = w.visible()
    assert seen_files["a.txt"] == b"first\n"
    kept = [k for k in seen_files if ".steptrail-kept-" in k]
    assert len(kept) == 1 and seen_files[kept[0]] == b"second\n"
    [k] = w.ledger.workspaces.kept("w")
    assert (k.path, k.kept, k.step, k.present) == ("a.txt", kept[0], "s", True)
    assert f"a.txt: conflict (kept as {kept[0]})" in result.detail
    w.ledger.close()
    out = run_cli(["--ledger", str(w.path), "status", "--json"])
    assert out.code == 0, out
    [ws] = out.json["workspaces"]
    assert [x["kept"] for x in ws["kept"]] == [kept[0]]
    text = run_cli(["--ledger", str(w.path), "status"]).out
    assert f"KEPT    {kept[0]}" in text and "rm " in text
    (w.dir / kept[0]).unlink()  # the person kept what they needed
    assert run_cli(["--ledger", str(w.path), "status", "--json"]).json["workspaces"][0][
        "kept"] == []


def _killed(w: World, run: Callable[[Ledger], object], acts: dict[int, Callable[[], None]],
            kill_at: int) -> bool:
    """Run `run` in a forked child over the ledger, a person acting at `acts`' points,
    SIGKILLed right before its `kill_at`-th `ws-*` point; reopen here. True: it died."""
    import signal

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


def test_a_take_back_killed_at_every_point_is_settled_back_by_the_next_epoch(
        tmp_path: Path, mode: str) -> None:
    """The SIGKILL sweep with take-backs in its workload: a 4-file rotation whose last
    file a person edits right before its exchange (so the three landed files are taken
    back), killed at every point of that take-back; the next epoch's settling leaves
    every file as it was before the step (the edit kept), no temporary behind, and
    nothing kept (nobody raced the take-back itself)."""
    files = {f"f{i}": f"content {i}\n".encode() for i in range(4)}
    names = sorted(files)
    writes = [Write(names[i], files[names[(i + 1) % 4]], h(files[names[i]]), 0)
              for i in range(4)]

    def admit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("rot", writes)])

    count = World(tmp_path / "count", files)
    admit(count)
    seen = count.reopen({})
    count.ledger.workspaces.apply("rot", epoch=count.epoch)
    count.ledger.close()
    renames = [i for i, name in enumerate(seen, 1) if name == "ws-rename"]
    # the 4th path's landing: its first rename (the exchange, or the move aside)
    last = renames[3] if mode == "exchange" else renames[6]
    edit = b"person edit\n"
    n_total = 0
    bad = []
    for kill_at in range(last + 1, last + 40):
        w = World(tmp_path / str(kill_at), files)
        admit(w)
        died = _killed(w, lambda led: led.workspaces.apply("rot", epoch=w.epoch),
                       {last: lambda w=w: (w.dir / "f03").write_bytes(edit)}, kill_at)
        if not died:
            w.ledger.close()
            break
        n_total += 1
        lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
        expected = {**files, "f03": edit}
        if w.visible() != expected or w.hidden():
            bad.append((kill_at, lease.settled, sorted(w.visible()), sorted(w.hidden())))
        w.ledger.close()
    assert n_total >= 5 and bad == []


def test_an_undo_killed_at_every_point_is_finished_by_the_retry(
        tmp_path: Path, mode: str) -> None:
    """The SIGKILL sweep with undos: a committed rotation and a directory move undone,
    killed at every point of the undo; the retried undo puts every file back, nothing
    left behind or kept."""
    files = {f"f{i}": f"content {i}\n".encode() for i in range(3)}
    files["src/m.txt"] = b"moved\n"
    names = [f"f{i}" for i in range(3)]
    writes = [Write(names[i], files[names[(i + 1) % 3]], h(files[names[i]]), 0)
              for i in range(3)]
    writes += [Write("src/m.txt", None, h(b"moved\n"), 0), Write("dst/m.txt", b"moved\n", None, 0)]

    def commit(w: World) -> None:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", writes)])
        assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
        w.ledger.publish("s")
        w.ledger.ack("s", epoch=w.epoch)

    bad = []
    n_total = 0
    for kill_at in range(1, 60):
        w = World(tmp_path / str(kill_at), files)
        commit(w)
        died = _killed(w, lambda led: led.workspaces.compensate("s", epoch=w.epoch), {},
                       kill_at)
        if not died:
            w.ledger.close()
            break
        n_total += 1
        comp = w.ledger.workspaces.compensate("s", epoch=w.epoch)
        if w.visible() != files or w.hidden() or any(r.outcome == "conflict"
                                                     for r in comp.restored):
            bad.append((kill_at, [(r.path, r.outcome) for r in comp.restored],
                        sorted(w.visible()), sorted(w.hidden())))
        w.ledger.close()
    assert n_total >= 10 and bad == []


def test_replan_of_a_step_whose_target_became_a_symlink_is_a_typed_refusal(
        tmp_path: Path) -> None:
    """A refused step's replan when the target is a symlink now: PathEscapes (typed, the
    ledger unchanged), not an error of the code."""
    from ledger import PathEscapes

    w = World(tmp_path, {"a.txt": b"a0\n", "other.txt": b"o\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])
    (w.dir / "a.txt").write_bytes(b"person\n")
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "rejected:pre_hash"
    os.unlink(w.dir / "a.txt")
    os.symlink("other.txt", w.dir / "a.txt")
    head = w.ledger.head().seq
    with pytest.raises(PathEscapes):
        w.ledger.workspaces.replan("s", epoch=w.epoch)
    assert w.ledger.head().seq == head
    w.ledger.close()

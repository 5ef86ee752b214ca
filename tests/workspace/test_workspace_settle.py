"""Red-team of 0802c7c: the settle's search for a directory moved after a kill
(`leftovers._found_parent` / `_attempt_dirs`), the carrying of a person's chmod,
the undo's refusal to recreate a renamed directory, and `Workspaces.kept()` finding
kept files on disk. Each test fails when its attack succeeds (a person's bytes lost or
hidden, a wrong directory touched, a chmod of a file it should not touch, an exception
instead of an outcome, a walk of the whole workspace where none is needed)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from test_workspace_moves import everything, hidden_entries, killed_at, shown
from test_takeback_races import World, h, save_by_rename

from ledger import Ledger
from ledger.workspace import exchange as exchange_mod
from ledger.workspace.names import SLOT_ROLES, attempt_tag, temp_name
from ledger.step.values import StepPlan, Write


@pytest.fixture(params=["exchange", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(exchange_mod, "_CALL", None)
    return str(request.param)


def point_where(tmp: Path, files: dict[str, bytes], plan: list[StepPlan],
                pred: Callable[[Path], bool]) -> int:
    """The first `ws-*` point of an undisturbed apply at which `pred(workspace)` holds
    (a kill "at" it leaves the disk in that state)."""
    w = World(tmp / "count", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    hits: list[int] = []
    n = [0]

    def on_op(name: str) -> None:
        if name.startswith("ws-"):
            n[0] += 1
            if not hits and pred(w.dir):
                hits.append(n[0])

    w.ledger.close()
    w.ledger = Ledger.open(w.path, clock=w.clock, on_op=on_op)
    w.ledger.workspaces.apply("s", epoch=w.epoch)
    w.ledger.close()
    assert hits, "the state never occurred"
    return hits[0]


def read(p: Path) -> bytes | None:
    try:
        return p.read_bytes()
    except OSError:
        return None


def visible_or_kept(w: World, data: bytes) -> bool:
    got = shown(w.dir)
    return data in got.values()


# -- 1. cost: the walk is "only after a kill" ------------------------------------------

def test_a_clean_apply_does_not_walk_the_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/guarantees.md: the workspace is walked "only after a kill, only when a
    path's slots are not beside it". A first apply with nobody racing and no kill
    must not walk the whole workspace (a repository with node_modules: 100k entries,
    on every apply)."""
    w = World(tmp_path, {"a.txt": b"a0\n", "big/x/y/z.txt": b"z\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
        Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])
    walks: list[str] = []
    real = os.fwalk

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        walks.append(repr(a))
        return real(*a, **k)

    monkeypatch.setattr(os, "fwalk", counting)
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
    assert walks == [], f"{len(walks)} walk(s) of the whole workspace on a clean apply"
    w.ledger.close()


# -- 2. an agent that knows the naming scheme plants a slot name elsewhere ---------------

def _lure_name(leaf: str, epoch: int, step: str, attempt: int = 1, role: str = "x") -> str:
    return temp_name(leaf, epoch, attempt_tag(step, attempt), slot=role)


def test_a_step_cannot_write_a_file_named_like_a_slot(tmp_path: Path) -> None:
    """An agent that knows the naming scheme plans a file named like the next step's
    slot for a.txt in other/ (the epoch is its lease's, the tag sha256(step, attempt)):
    refused at admit (`check_write`: a temporary's shape)."""
    from ledger.errors import PathForbidden
    w = World(tmp_path, {"a.txt": b"a0\n"})
    name = _lure_name("a.txt", w.epoch, "s")
    with pytest.raises(PathForbidden):
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("plant", [
            Write(f"other/{name}", b"lure\n", None, 0)])])
    w.ledger.close()


@pytest.mark.parametrize("theirs", ["same-as-post", "different"])
def test_a_slot_name_planted_elsewhere_does_not_steer_a_clean_apply(
        tmp_path: Path, mode: str, theirs: str) -> None:
    """No kill, no rename. Another process (an agent's shell, a tool that knows the
    naming scheme) makes a file named like the next step's x slot for a.txt
    (`.a.txt.steptrail-<epoch>-<tag>-<x>.tmp`: the epoch is the lease's, the tag
    sha256(step, attempt)) in other/, beside a person's other/a.txt. The step edits
    a.txt (at the root) only. A clean first apply walks the workspace (its slots are not
    beside a.txt yet) and takes other/ for a.txt's directory. other/ is in no plan:
    nothing there may change, and the step must apply to a.txt."""
    a0, post = b"a0\n", b"the step's new a.txt\n"
    person = post if theirs == "same-as-post" else b"a person's other/a.txt\n"
    lure = b"what the lurer wants in other/a.txt\n"
    w = World(tmp_path, {"a.txt": a0, "other/a.txt": person})
    name = _lure_name("a.txt", w.epoch, "s")
    (w.dir / "other" / name).write_bytes(lure)
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [Write("a.txt", post, h(a0), 0)])])
    result = w.ledger.workspaces.apply("s", epoch=w.epoch)
    assert read(w.dir / "other/a.txt") == person, (
        "a person's file in a directory no plan names was replaced", result.verdict,
        result.detail, everything(w.dir))
    assert result.verdict == "applied", (result.verdict, result.detail, everything(w.dir))
    assert read(w.dir / "a.txt") == post
    w.ledger.close()


def test_a_slot_name_planted_by_a_person_after_a_kill_does_not_steer_the_settle(
        tmp_path: Path, mode: str) -> None:
    """A step edits src/a.txt and src/b.txt and is killed after src/a.txt landed; the
    person runs `git mv src lib`. Another process (knowing the scheme) puts an empty
    file named like b.txt's x slot into other/, beside a person's other/b.txt. The
    settle must not act in other/ (two candidates at most: refuse to guess), and the
    person's other/b.txt keeps its bytes; a.txt's original is visible."""
    a0, b0 = b"a0\n", b"b0\n"
    files = {"src/a.txt": a0, "src/b.txt": b0, "other/b.txt": b"person's other b\n"}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("src/b.txt", b"b1\n", h(b0), 0)])]
    at = point_where(tmp_path, files, plan,
                     lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "lib")
    for role in "xy":
        (w.dir / "other" / _lure_name("b.txt", w.epoch, "s", role=role)).write_bytes(b"")
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    assert read(w.dir / "other/b.txt") == b"person's other b\n", everything(w.dir)
    assert visible_or_kept(w, a0), (everything(w.dir), lease)
    w.ledger.close()


# -- 3. same leaf in two planned directories, one renamed after a kill -------------------

@pytest.mark.parametrize("recover", ["takeover", "retry"])
def test_a_renamed_directory_is_not_taken_for_another_planned_directorys_path(
        tmp_path: Path, mode: str, recover: str) -> None:
    """The step edits src/m.txt and deletes dst/m.txt (the same leaf in two planned
    directories); it is killed after src/m.txt landed, before the delete. A person runs
    `git mv src lib`. dst/m.txt has no slot beside it (a delete stages nothing), so the
    search runs for it too — and finds lib/, which holds m.txt's slots (src/m.txt's). The
    settle must put src/m.txt's original back in lib/m.txt and leave dst/m.txt alone."""
    m0, d0, m1 = b"m0 original\n", b"d0 in dst\n", b"m1 by the step\n"
    files = {"src/m.txt": m0, "dst/m.txt": d0}
    plan = [StepPlan("s", [Write("src/m.txt", m1, h(m0), 0),
                           Write("dst/m.txt", None, h(d0), 0)])]
    at = point_where(tmp_path, files, plan,
                     lambda d: read(d / "src/m.txt") == m1 and read(d / "dst/m.txt") == d0)
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    assert read(w.dir / "dst/m.txt") == d0
    os.rename(w.dir / "src", w.dir / "lib")
    if recover == "takeover":
        out: object = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    else:
        out = w.ledger.workspaces.apply("s", epoch=w.epoch)
    got = shown(w.dir)
    assert got.get("dst/m.txt") == d0, (got, out)
    assert got.get("lib/m.txt") == m0, (
        "the original is not back in the moved directory", got, hidden_entries(w.dir),
        out)
    w.ledger.close()


# -- 4. a copy of the moved directory: two candidates ------------------------------------

@pytest.mark.parametrize("recover", ["takeover", "retry"])
def test_a_copy_of_the_moved_directory_leaves_the_original_visible(
        tmp_path: Path, mode: str, recover: str) -> None:
    """Killed after src/a.txt landed; the person runs `git mv src lib` and
    `cp -a lib lib.bak`: two directories hold the slots, the settle guesses neither.
    Whatever it does, a.txt's original must be on disk at a visible path (not only in
    the ledger, not in a hidden slot, not collected), and lib/a.txt must not hold the
    step's bytes with the step recorded refused and nothing reported."""
    a0, b0 = b"a0 original\n", b"b0\n"
    files = {"src/a.txt": a0, "src/b.txt": b0}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("src/b.txt", b"b1\n", h(b0), 0)])]
    at = point_where(tmp_path, files, plan, lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "lib")
    shutil.copytree(w.dir / "lib", w.dir / "lib.bak", symlinks=True)
    if recover == "takeover":
        out: object = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    else:
        out = w.ledger.workspaces.apply("s", epoch=w.epoch)
    got = shown(w.dir)
    assert a0 in got.values(), ("the original is only hidden or only in the ledger",
                                got, hidden_entries(w.dir), out)
    w.ledger.close()


# -- 5. two planned directories swapped after a kill -------------------------------------

@pytest.mark.parametrize("recover", ["takeover", "retry"])
def test_two_planned_directories_swapped_after_a_kill(
        tmp_path: Path, mode: str, recover: str) -> None:
    """The step edits src/a.txt and dst/b.txt, killed after src/a.txt landed; the person
    swaps the directories (mv src tmp; mv dst src; mv tmp dst). The directory now named
    dst holds src/a.txt's slots, but it is a planned directory at its own name, so it is
    excluded. a.txt's original must end visible (in dst/a.txt or kept), and no file
    the person has must hold the step's bytes with nothing reported."""
    a0, b0 = b"a0 original\n", b"b0 original\n"
    files = {"src/a.txt": a0, "dst/b.txt": b0}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("dst/b.txt", b"b1\n", h(b0), 0)])]
    at = point_where(tmp_path, files, plan, lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "tmp")
    os.rename(w.dir / "dst", w.dir / "src")
    os.rename(w.dir / "tmp", w.dir / "dst")
    if recover == "takeover":
        out: object = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    else:
        out = w.ledger.workspaces.apply("s", epoch=w.epoch)
    got = shown(w.dir)
    assert a0 in got.values() and b0 in got.values(), (got, hidden_entries(w.dir), out)
    w.ledger.close()


# -- 6. renamed into (onto) another planned directory ------------------------------------

def test_a_directory_renamed_inside_another_planned_directory(
        tmp_path: Path, mode: str) -> None:
    """The step edits src/a.txt and src/b.txt and creates lib/new.txt; killed after
    src/a.txt landed; the person runs `mv src lib/src` (into the other planned
    directory). The search finds lib/src (not a planned directory): the original goes
    back in lib/src/a.txt."""
    a0, b0 = b"a0 original\n", b"b0\n"
    files = {"src/a.txt": a0, "src/b.txt": b0, "lib/keep.txt": b"k\n"}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("src/b.txt", b"b1\n", h(b0), 0),
                           Write("lib/new.txt", b"new\n", None, 0)])]
    at = point_where(tmp_path, files, plan, lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "lib/src")
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    got = shown(w.dir)
    assert got.get("lib/src/a.txt") == a0, (got, hidden_entries(w.dir), lease)
    assert got.get("lib/src/b.txt") == b0
    w.ledger.close()


def test_a_directory_renamed_onto_the_name_of_a_planned_directory_it_emptied(
        tmp_path: Path, mode: str) -> None:
    """The step edits src/a.txt and creates gen/out.txt (gen/ made by the staging);
    killed after src/a.txt landed. The person removes gen/ (it holds only a hidden
    file) and runs `mv src gen`. The directory holding src/a.txt's slots is now at a
    planned directory's name, so the search excludes it. a.txt's original must end
    visible, not collected from its slot as a dead temporary of gen/."""
    a0 = b"a0 original\n"
    files = {"src/a.txt": a0}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("gen/out.txt", b"generated\n", None, 0)])]
    at = point_where(tmp_path, files, plan, lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    shutil.rmtree(w.dir / "gen")
    os.rename(w.dir / "src", w.dir / "gen")
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    got = shown(w.dir)
    assert a0 in got.values(), ("the original is hidden or collected", got,
                                hidden_entries(w.dir), lease)
    w.ledger.close()


# -- 7. a symlink loop and a deep tree under the workspace --------------------------------

def test_the_search_survives_symlink_loops_and_unreadable_directories(
        tmp_path: Path, mode: str) -> None:
    """After a kill and `git mv src lib`, the workspace holds symlink loops (to `.`,
    to each other, to `/`), a FIFO named like a slot, and an unreadable directory; the
    settle finishes (no exception, no hang) and puts the original back in lib/."""
    a0, b0 = b"a0 original\n", b"b0\n"
    files = {"src/a.txt": a0, "src/b.txt": b0, "deep/" + "/".join("d" * 40) + "/f": b"f\n"}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("src/b.txt", b"b1\n", h(b0), 0)])]
    at = point_where(tmp_path, files, plan, lambda d: read(d / "src/a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "lib")
    os.symlink(".", w.dir / "loop")
    os.symlink("l2", w.dir / "l1")
    os.symlink("l1", w.dir / "l2")
    os.symlink("/", w.dir / "root")
    (w.dir / "locked").mkdir()
    os.mkfifo(w.dir / "locked" / _lure_name("b.txt", w.epoch, "s"))
    os.chmod(w.dir / "locked", 0)
    try:
        lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    finally:
        os.chmod(w.dir / "locked", 0o755)
    got = shown(w.dir)
    assert got.get("lib/a.txt") == a0, (got, hidden_entries(w.dir), lease)
    w.ledger.close()


# -- 8. chmod carried onto a person's *different* file ----------------------------------

def test_a_save_right_after_an_undos_landing_keeps_its_own_mode(
        tmp_path: Path, mode: str) -> None:
    """A committed step edits a.txt (0644); the person chmods the step's file to 0640,
    then an undo runs. At each point of the undo, the person rename-saves a new a.txt
    with mode 0600 (a private file). If a.txt ends holding that save, it must keep 0600:
    `keep_persons_mode` (protocol: after the undo's landing) chmods whatever is at the
    name with the mode of the step's file, unless it checks it is the file the undo put
    there (`chmod_at` is called without `only`)."""
    a0, a1, save = b"a0\n", b"a1 by the step\n", b"a private save\n"
    files = {"a.txt": a0}

    def setup(w: World) -> None:
        os.chmod(w.dir / "a.txt", 0o644)
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
            Write("a.txt", a1, h(a0), 0)])])
        assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
        w.ledger.publish("s")
        w.ledger.ack("s", epoch=w.epoch)
        os.chmod(w.dir / "a.txt", 0o640)

    count = World(tmp_path / "count", files)
    setup(count)
    seen = count.reopen({})
    count.ledger.workspaces.compensate("s", epoch=count.epoch)
    count.ledger.close()
    bad = []
    ended: list[int] = []
    for i in range(1, len(seen) + 2):
        w = World(tmp_path / str(i), files)
        setup(w)

        def act(w: World = w) -> None:
            tmp = w.dir / "a.txt.swp~"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, save)
            os.close(fd)
            os.chmod(tmp, 0o600)
            os.rename(tmp, w.dir / "a.txt")

        w.reopen({i: act})
        comp = w.ledger.workspaces.compensate("s", epoch=w.epoch)
        if read(w.dir / "a.txt") == save:
            ended.append(i)
            m = stat.S_IMODE(os.stat(w.dir / "a.txt").st_mode)
            if m != 0o600:
                bad.append((i, seen[i - 1] if i <= len(seen) else "end", oct(m),
                            [(r.path, r.outcome) for r in comp.restored]))
        w.ledger.close()
    assert ended, "the save never ended at a.txt: the test proves nothing"
    assert bad == [], bad


def test_a_save_right_after_a_take_backs_exchange_keeps_its_own_mode(
        tmp_path: Path, mode: str) -> None:
    """A step edits a.txt then b.txt; the person chmods a.txt (the step's file, just
    landed) to 0640 and edits b.txt, so the step is refused and a.txt taken back. At
    every later point the person rename-saves a private (0600) a.txt: if a.txt ends
    holding it, it keeps 0600 (the take-back's `_keep_persons_mode` chmods the name
    without checking which file is there)."""
    a0, b0, save = b"a0\n", b"b0\n", b"a private save\n"
    files = {"a.txt": a0, "b.txt": b0}
    plan = [StepPlan("s", [Write("a.txt", b"a1\n", h(a0), 0),
                           Write("b.txt", b"b1\n", h(b0), 0)])]
    first = point_where(tmp_path, files, plan, lambda d: read(d / "a.txt") == b"a1\n")
    count = World(tmp_path / "count2", files)
    count.ledger.workspaces.admit("w", count.epoch, plan)
    seen = count.reopen({first: lambda: ((count.dir / "b.txt").write_bytes(b"edit\n"),
                                         os.chmod(count.dir / "a.txt", 0o640))})
    count.ledger.workspaces.apply("s", epoch=count.epoch)
    count.ledger.close()
    bad = []
    ended: list[int] = []
    for i in range(first + 1, len(seen) + 2):
        w = World(tmp_path / str(i), files)
        os.chmod(w.dir / "a.txt", 0o644)
        w.ledger.workspaces.admit("w", w.epoch, plan)

        def edit(w: World = w) -> None:
            (w.dir / "b.txt").write_bytes(b"edit\n")
            os.chmod(w.dir / "a.txt", 0o640)

        def act(w: World = w) -> None:
            tmp = w.dir / "a.txt.swp~"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, save)
            os.close(fd)
            os.rename(tmp, w.dir / "a.txt")

        w.reopen({first: edit, i: act})
        result = w.ledger.workspaces.apply("s", epoch=w.epoch)
        if read(w.dir / "a.txt") == save:
            ended.append(i)
            m = stat.S_IMODE(os.stat(w.dir / "a.txt").st_mode)
            if m != 0o600:
                bad.append((i, seen[i - 1] if i <= len(seen) else "end", oct(m),
                            result.verdict))
        w.ledger.close()
    assert ended, "the save never ended at a.txt: the test proves nothing"
    assert bad == [], bad


def test_a_take_back_never_chmods_through_a_hard_link_the_person_swapped_in(
        tmp_path: Path, mode: str) -> None:
    """A person replaces the step's landed a.txt (chmodded) by a hard link to a file
    outside the workspace, edits b.txt; the step is refused: the file outside keeps its
    mode and bytes."""
    a0, b0 = b"a0\n", b"b0\n"
    outside = tmp_path / "outside-secret"
    outside.write_bytes(b"outside\n")
    os.chmod(outside, 0o600)
    files = {"a.txt": a0, "b.txt": b0}
    plan = [StepPlan("s", [Write("a.txt", b"a1\n", h(a0), 0),
                           Write("b.txt", b"b1\n", h(b0), 0)])]
    first = point_where(tmp_path, files, plan, lambda d: read(d / "a.txt") == b"a1\n")
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)

    def act() -> None:
        os.chmod(w.dir / "a.txt", 0o604)
        (w.dir / "b.txt").write_bytes(b"edit\n")
        os.unlink(w.dir / "a.txt")
        os.link(outside, w.dir / "a.txt")

    w.reopen({first: act})
    w.ledger.workspaces.apply("s", epoch=w.epoch)
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o600
    assert outside.read_bytes() == b"outside\n"
    assert a0 in shown(w.dir).values()
    w.ledger.close()


# -- 9. kept(): symlinks, outside, odd names ---------------------------------------------

def test_kept_on_disk_never_lists_a_symlink_or_a_directory_outside(tmp_path: Path) -> None:
    """kept() lists `NAME.steptrail-kept-TAG` regular files in directories of known
    paths. A symlink with such a name (to a file outside), a directory of a known path
    swapped for a symlink to a directory outside holding kept-named files, a FIFO and a
    directory with such names: none listed, no exception, no hang."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.steptrail-kept-deadbeef").write_bytes(b"secret\n")
    w = World(tmp_path / "w", {"a.txt": b"a0\n", "sub/b.txt": b"b0\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
        Write("a.txt", b"a1\n", h(b"a0\n"), 0), Write("sub/b.txt", b"b1\n", h(b"b0\n"), 0)])])
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
    os.symlink(outside / "x.steptrail-kept-deadbeef", w.dir / "a.txt.steptrail-kept-aa")
    os.mkfifo(w.dir / "f.steptrail-kept-bb")
    os.mkdir(w.dir / "d.steptrail-kept-cc")
    shutil.rmtree(w.dir / "sub")
    os.symlink(outside, w.dir / "sub")
    kept = w.ledger.workspaces.kept("w")
    assert kept == [], kept
    w.ledger.close()


def test_kept_on_disk_with_odd_names_does_not_raise(tmp_path: Path) -> None:
    """Names a person's tools make: not UTF-8, a newline, a name that only contains the
    mark ("notes.steptrail-kept-by-hand"). kept() returns (no exception), lists none of
    them (none is a name steptrail gives: its tag is 8 hex digits, its text UTF-8), and
    what it returns encodes (status, MCP and the UI send it as JSON)."""
    w = World(tmp_path, {"a.txt": b"a0\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
        Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
    root = os.fsencode(w.dir)
    for raw in (b"a.txt.steptrail-kept-\xff\xfe", b"a.txt.steptrail-kept-x\ny",
                b".steptrail-kept-", b"a.txt.steptrail-kept-" + b"-" * 200):
        with open(os.path.join(root, raw), "wb") as f:
            f.write(b"x")
    kept = w.ledger.workspaces.kept("w")
    assert kept == []
    msgspec.json.encode(kept)
    w.ledger.close()


def test_status_json_with_a_kept_name_that_is_not_utf8(tmp_path: Path) -> None:
    """`status --json` lists kept files found on disk now: one whose name is not UTF-8
    (a person's tool, a copied archive) must not crash status (the command an operator
    runs to see what needs attention)."""
    from conftest import run_cli
    w = World(tmp_path, {"a.txt": b"a0\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
        Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
    w.ledger.close()
    with open(os.path.join(os.fsencode(w.dir), b"a.txt.steptrail-kept-\xff"), "wb") as f:
        f.write(b"x")
    r = run_cli(["--ledger", str(w.path), "status", "--json"])
    assert r.code == 0, r
    r = run_cli(["--ledger", str(w.path), "status"])
    assert r.code == 0, r


def test_kept_on_disk_does_not_claim_a_persons_own_file(tmp_path: Path) -> None:
    """A person's file that merely contains the mark (`notes.steptrail-kept-by-hand`,
    `a.txt.steptrail-kept-old`, made by hand) is not a file steptrail kept: it carries
    no tag of any attempt. kept() should not report it as steptrail's (status shows
    those as needing attention)."""
    w = World(tmp_path, {"a.txt": b"a0\n"})
    w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s", [
        Write("a.txt", b"a1\n", h(b"a0\n"), 0)])])
    assert w.ledger.workspaces.apply("s", epoch=w.epoch).verdict == "applied"
    (w.dir / "a.txt.steptrail-kept-old").write_bytes(b"mine\n")
    kept = w.ledger.workspaces.kept("w")
    assert kept == [], kept
    w.ledger.close()


# -- both directories of a move renamed after a kill (found by the person injector's
# random sweep: the move's source and destination share a slot name) --------------------

def test_both_directories_of_a_move_renamed_after_a_kill_are_told_apart(
        tmp_path: Path, mode: str) -> None:
    """A step edits src/a.txt and moves src/m.txt to dst/m.txt (dst/ is new); it is
    killed once every path has landed; a person then renames src/ to lib/ and dst/ to
    out/; a takeover settles. Each directory is matched by all its slot names, not by
    the one name the move's two ends share: lib/ holds a.txt and m.txt as before the
    step, out/ no m.txt, and nothing is hidden."""
    a0, m0 = b"a0\n", b"moved content\n"
    files = {"src/a.txt": a0, "src/m.txt": m0}
    plan = [StepPlan("s", [Write("src/a.txt", b"a1\n", h(a0), 0),
                           Write("src/m.txt", None, h(m0), 0),
                           Write("dst/m.txt", m0, None, 0)])]
    at = point_where(tmp_path, files, plan,
                     lambda d: read(d / "dst/m.txt") == m0 and read(d / "src/a.txt") == b"a1\n"
                     and not (d / "src/m.txt").exists())
    w = World(tmp_path / "race", files)
    w.ledger.workspaces.admit("w", w.epoch, plan)
    assert killed_at(w, lambda led: led.workspaces.apply("s", epoch=w.epoch), {}, at)
    os.rename(w.dir / "src", w.dir / "lib")
    os.rename(w.dir / "dst", w.dir / "out")
    w.ledger.workspaces.acquire("w", "agent-2", ttl_s=3600, force=True)
    got = shown(w.dir)
    assert got == {"lib/a.txt": a0, "lib/m.txt": m0}, (got, hidden_entries(w.dir))
    assert hidden_entries(w.dir) == []
    w.ledger.close()

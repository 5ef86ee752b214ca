"""Red team on the two-step rewind of a file and a directory that traded places at one
name (ledger/step/rewind.py `Rewind.clears`, `_remove_emptied`, `_holds_only`), the undo
that removes empty directories first (ledger/step/undo.py), and the one-call holder
names (ledger/holders.py).

Each attack injects a person's action at one operation of the rewind (`Ledger.open(...,
on_op=...)`: called before each workspace operation and each commit), every operation in
turn (enumerated, not sampled), and checks the core promise: every byte the person
wrote is still in the workspace (at its path, or anywhere under a visible name), the
ledger verifies, nothing is left in flight, and what the ledger holds differs from the
disk only where the person acted.

Three attacks found bugs, fixed with them: a holder in a pid namespace without its own
/proc judged gone (`holders._own_proc`); a person's own empty directories removed where
a deleted file came back (only directories the ledger knew files in go now); a person's
file named like a temporary removed there (only the tags of the rewind's own first
steps are taken for its temporaries). The rest are attacks the code withstands.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import LeaseHeld, Ledger, LedgerError, holders
from ledger.step.rewind import holder_gone
from test_rewind_attacks import World, kill_at_op, traded, tree

DIRECTIONS = ["file-then-dir", "dir-then-file"]
PERSON = b"a person's precious bytes\n"


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


# --- the harness -----------------------------------------------------------------------


def all_files(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (the ledger's own directory too: nothing hides)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


class Person:
    """What a person did during the operation: the bytes they saved (path -> the last
    bytes saved there) and the paths they touched."""

    def __init__(self, root: Path, outside: Path) -> None:
        self.root = root
        self.outside = outside
        self.saved: dict[str, bytes] = {}
        self.touched: set[str] = set()
        self.did = False

    def save(self, rel: str, data: bytes = PERSON) -> None:
        p = self.root / rel
        p.write_bytes(data)
        self.saved[rel] = data
        self.touched.add(rel)
        self.did = True

    def lost(self) -> list[str]:
        """The person's saves whose bytes are nowhere in the workspace (nor outside it,
        where the person put them there)."""
        everything = list(all_files(self.root).values()) + list(all_files(self.outside).values())
        out = []
        for rel, data in self.saved.items():
            p = self.root / rel
            here = p.is_file() and not p.is_symlink() and p.read_bytes() == data
            if not here and data not in everything:
                out.append(rel)
        return out


def kind(p: Path) -> str:
    if p.is_symlink():
        return "link"
    if p.is_dir():
        return "dir"
    if p.is_file():
        return "file"
    return "absent"


def _new_in_a(p: Person) -> None:
    a = p.root / "a"
    if kind(a) == "absent":
        a.mkdir()
    if kind(a) == "dir":
        p.save("a/person.txt")


def _save_a(p: Person) -> None:
    if kind(p.root / "a") in ("absent", "file"):
        p.save("a")


def _save_ab(p: Person) -> None:
    a = p.root / "a"
    if kind(a) == "absent":
        a.mkdir()
    if kind(a) == "dir" and kind(a / "b") in ("absent", "file"):
        p.save("a/b")


def _mv_a(p: Person) -> None:
    if kind(p.root / "a") == "dir":
        os.rename(p.root / "a", p.root / "a.moved")
        p.touched |= {"a", "a.moved"}
        p.did = True


def _symlink_a(p: Person) -> None:
    """`a` (absent, or an empty directory) becomes a symlink to a directory outside the
    workspace holding the person's file: nothing may be written or removed through it."""
    a = p.root / "a"
    if kind(a) == "dir" and not any(a.iterdir()):
        a.rmdir()
    if kind(a) == "absent":
        (p.outside / "mine.txt").write_bytes(PERSON)
        (p.outside / "b").mkdir(exist_ok=True)
        os.symlink(p.outside, a)
        p.saved["<outside>/mine.txt"] = PERSON
        p.touched.add("a")
        p.did = True


def _symlink_in_a(p: Person) -> None:
    a = p.root / "a"
    if kind(a) == "dir":
        (p.outside / "mine.txt").write_bytes(PERSON)
        (p.outside / "sub").mkdir(exist_ok=True)
        os.symlink(p.outside, a / "c")
        p.saved["<outside>/mine.txt"] = PERSON
        p.touched.add("a/c")
        p.did = True


def _hardlink(p: Person) -> None:
    """A hard link to the ledger's `a/b` (or `a`), then the person writes through it in
    place: both names hold the person's bytes."""
    for rel in ("a/b", "a"):
        src = p.root / rel
        if kind(src) == "file":
            os.link(src, p.root / "hl.txt")
            with open(p.root / "hl.txt", "r+b") as f:
                f.truncate(0)
                f.write(PERSON)
            p.saved["hl.txt"] = PERSON
            p.touched |= {"hl.txt", rel}
            p.did = True
            return


def _edit_app(p: Person) -> None:
    p.save("app.py")


def _empty_dir_in_a(p: Person) -> None:
    if kind(p.root / "a") == "dir":
        (p.root / "a" / "keep").mkdir()
        p.touched.add("a/keep")
        p.did = True


ACTIONS: dict[str, Callable[[Person], None]] = {
    "new-file-in-a": _new_in_a, "save-a": _save_a, "save-a/b": _save_ab, "mv-a": _mv_a,
    "symlink-a": _symlink_a, "symlink-in-a": _symlink_in_a, "hardlink": _hardlink,
    "edit-app": _edit_app, "empty-dir-in-a": _empty_dir_in_a,
}


class Template:
    """A world built once and restored (its directory copied back) before each run:
    the same workspace path, the same ledger, the same history."""

    def __init__(self, tmp: Path, build: Callable[[World], None]) -> None:
        self.tmp = tmp
        self.world = World(tmp / "w")
        build(self.world)
        self.model = self.world.model
        self.world.led.close()
        self.saved = tmp / "template"
        shutil.copytree(tmp / "w", self.saved, symlinks=True)
        self.root = self.world.root
        self.location = str(self.world.location)
        self.outside = tmp / "outside"

    def restore(self) -> None:
        """Back to the template: the workspace's directory itself stays (its identity
        is the registration's), what is in it and the ledger's files are copied back."""
        for child in self.saved.iterdir():
            live = self.tmp / "w" / child.name
            if child.name == "repo":
                for inner in list(live.iterdir()):
                    if inner.is_dir() and not inner.is_symlink():
                        shutil.rmtree(inner)
                    else:
                        inner.unlink()
                shutil.copytree(child, live, symlinks=True, dirs_exist_ok=True)
                continue
            if live.is_dir() and not live.is_symlink():
                shutil.rmtree(live)
            elif live.exists():
                live.unlink()
            if child.is_dir():
                shutil.copytree(child, live, symlinks=True)
            else:
                shutil.copy2(child, live)
        shutil.rmtree(self.outside, ignore_errors=True)
        self.outside.mkdir()

    def count_ops(self, run: Callable[[Ledger], Any]) -> list[str]:
        self.restore()
        ops: list[str] = []
        with Ledger.open(self.location, on_op=ops.append) as led:
            run(led)
        return ops


def rewind_to_s1(led: Ledger) -> Any:
    return led.workspaces.rewind("w", "s1")


def in_flight(led: Ledger) -> dict[str, str]:
    return {s.step_id: s.state for s in led.steps() if s.state in ("planned", "fenced")}


def attack_every_op(t: Template, action: Callable[[Person], None],
                    run: Callable[[Ledger], Any] = rewind_to_s1) -> list[str]:
    """`action` at each operation of `run` in turn; the failures found (empty: none)."""
    ops = t.count_ops(run)
    failures: list[str] = []
    for k in range(1, len(ops) + 1):
        t.restore()
        person = Person(t.root, t.outside)
        seen = [0]

        def on_op(name: str, seen: list[int] = seen, k: int = k,
                  person: Person = person) -> None:
            seen[0] += 1
            if seen[0] == k:
                action(person)

        error = None
        with Ledger.open(t.location, on_op=on_op) as led:
            try:
                got = run(led)
            except Exception as exc:  # a refusal raised is fine; a loss is not
                got, error = None, exc
            where = f"k={k} ({ops[k - 1]}) did={person.did} got={getattr(got, 'verdict', error)!r}"
            lost = person.lost()
            if lost:
                failures.append(f"{where}: the person's bytes lost at {lost}")
            if not led.verify().ok:
                failures.append(f"{where}: verify fails")
            if in_flight(led):
                failures.append(f"{where}: left in flight {in_flight(led)}")
            seen[0] = -10**9  # no more actions from here on
            drift = {c.path for c in led.workspaces.observe("w", dry_run=True).changes}
            unexplained = {d for d in drift if not any(
                d == q or d.startswith(q + "/") or q.startswith(d + "/") for q in person.touched)
                and ".steptrail-kept-" not in d}
            if unexplained:
                failures.append(f"{where}: the ledger disagrees with the disk at {unexplained}")
            if not person.did and got is not None and not got.applied:
                failures.append(f"{where}: no person acted, yet {got.verdict} {got.detail}")
    return failures


@pytest.fixture
def templates(tmp_path: Path) -> Callable[[str, Callable[[World], None]], Template]:
    made: list[Template] = []

    def make(name: str, build: Callable[[World], None]) -> Template:
        t = Template(tmp_path / name, build)
        made.append(t)
        return t

    return make


# --- a person's action at every operation of the two-step rewind ----------------------


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_persons_action_at_every_operation_of_a_two_step_rewind(
        templates: Callable[..., Template], direction: str, action: str) -> None:
    t = templates("t", lambda w: traded(w, direction))
    assert attack_every_op(t, ACTIONS[action]) == []


def _replace_a_with_dir(p: Person) -> None:
    """The person removes the file `a` and makes a directory there holding their file."""
    a = p.root / "a"
    if kind(a) == "file":
        a.unlink()
        a.mkdir()
        p.save("a/person.txt")
        p.touched.add("a")


def test_a_file_a_person_turned_into_a_directory_at_every_operation(
        templates: Callable[..., Template]) -> None:
    t = templates("t", lambda w: traded(w, "dir-then-file"))
    assert attack_every_op(t, _replace_a_with_dir) == []


def test_what_is_planted_outside_is_never_written_through(
        templates: Callable[..., Template]) -> None:
    """`a` made a symlink to a directory outside at each operation: outside holds just
    what the person put there afterwards (no file written, none removed through it)."""
    for direction in DIRECTIONS:
        t = templates(direction, lambda w, d=direction: traded(w, d))
        for k in range(1, len(t.count_ops(rewind_to_s1)) + 1):
            t.restore()
            person = Person(t.root, t.outside)
            seen = [0]

            def on_op(name: str, seen: list[int] = seen, k: int = k,
                      person: Person = person) -> None:
                seen[0] += 1
                if seen[0] == k:
                    _symlink_a(person)
                    _symlink_in_a(person)

            with Ledger.open(t.location, on_op=on_op) as led, \
                    contextlib.suppress(LedgerError):
                led.workspaces.rewind("w", "s1")
            if person.did:
                assert all_files(t.outside) == {"mine.txt": PERSON}, (direction, k)
                assert {p.name for p in t.outside.iterdir()} <= {"mine.txt", "b", "sub"}


@pytest.mark.parametrize("obstacle", ["file", "symlink", "fifo", "edited"])
def test_what_the_ledger_does_not_know_in_the_way_refuses_before_anything_is_written(
        world: World, obstacle: str) -> None:
    traded(world, "file-then-dir")
    sub = world.root / "a" / "deep" / "er"
    sub.mkdir(parents=True)
    if obstacle == "file":
        (sub / "p.txt").write_bytes(PERSON)
    elif obstacle == "symlink":
        os.symlink("/etc/hostname", sub / "l")
    elif obstacle == "fifo":
        os.mkfifo(sub / "f")
    else:
        (world.root / "a" / "b").write_bytes(PERSON)
    before = tree(world.root)
    steps = {s.step_id for s in world.led.steps()}
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    got = world.led.workspaces.rewind("w", "s1")
    assert "a" in preview.unobserved and not got.applied and got.cleared is None
    assert {s.step_id for s in world.led.steps()} == steps  # not even a step planned
    assert tree(world.root) == before and sub.is_dir()
    assert world.led.verify().ok


def test_a_persons_file_observed_later_under_the_directory_keeps_it(world: World) -> None:
    """a/p.txt, a person's, observed after s3: its state as of s1 is unknown, so `a`
    cannot go back (left as it is and said); the rest is rewound, a/p.txt untouched."""
    traded(world, "file-then-dir")
    (world.root / "a" / "p.txt").write_bytes(PERSON)
    world.led.workspaces.observe("w")
    got = world.led.workspaces.rewind("w", "s1")
    assert got.applied, got.detail
    assert "a" in dict(got.unreachable) and not got.clears
    assert (world.root / "a" / "p.txt").read_bytes() == PERSON
    assert (world.root / "app.py").read_bytes() == b"one\n"
    assert world.agrees_with_disk() and world.clean()


# --- --paths choosing part of a traded pair --------------------------------------------


def undo_all(led: Ledger, steps: list[str]) -> None:
    lease = led.workspaces.acquire("w", holder="person", ttl_s=600)
    try:
        for s in steps:
            led.workspaces.compensate(s, epoch=lease.epoch, reason="undo")
    finally:
        led.workspaces.release("w", lease.epoch)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("paths", [["a"], ["a/b"], ["app.py"], ["a/b", "app.py"], ["a/"]])
def test_paths_choosing_part_of_a_traded_pair(world: World, direction: str,
                                              paths: list[str]) -> None:
    traded(world, direction)
    before = tree(world.root)
    preview = world.led.workspaces.rewind("w", "s1", paths=paths, preview=True)
    got = world.led.workspaces.rewind("w", "s1", paths=paths)
    assert got.verdict in ("applied", "nothing"), (got.verdict, got.detail)
    assert got.clears == preview.clears
    after = tree(world.root)
    for path, data in world.model["s1"].items():
        chosen = any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/")
                     for p in paths)
        if chosen and path not in dict(preview.unreachable):
            assert after.get(path) == data, (path, after)
        elif not chosen:
            assert after.get(path) == before.get(path), (path, after)
    assert world.agrees_with_disk() and world.clean()
    states = {s.step_id: s.state for s in world.led.steps()}
    assert "planned" not in states.values() and "fenced" not in states.values(), states
    undo_all(world.led, [s for s in (got.step, got.cleared) if s and got.applied])
    assert tree(world.root) == before
    assert world.agrees_with_disk() and world.clean()


# --- nested traded places, and both directions in one rewind ---------------------------


def _rmdirs(root: Path, rel: str) -> None:
    """Remove the empty directories at `rel` and below (what a deleted file leaves)."""
    p = root / rel
    if p.is_dir():
        for d in sorted((q for q in p.rglob("*") if q.is_dir()), key=lambda q: -len(q.parts)):
            d.rmdir()
        p.rmdir()


def nested(world: World) -> None:
    """s1: `a` a file, `p/q` a file; s2: `a/b` a file, `p` a file; s3: `a/b/c/d` a file
    (a/b a directory now); each a file and a directory trading places at one name."""
    world.step("s0", lambda r: [r.read("a").write(b"a1\n"), r.read("p/q").write(b"q1\n")])
    world.step("d1", lambda r: [r.read("a").write(None), r.read("p/q").write(None)])
    _rmdirs(world.root, "p")
    world.step("s2", lambda r: [r.read("a/b").write(b"ab2\n"), r.read("p").write(b"p2\n")])
    world.step("d2", lambda r: [r.read("a/b").write(None)])
    world.step("s3", lambda r: [r.read("a/b/c/d").write(b"abcd3\n"),
                                r.read("a/e/f").write(b"aef3\n")])
    world.model["s1"] = world.model["s0"]


@pytest.mark.parametrize("order", ["second-first", "first-first"])
def test_nested_traded_places_both_ways_and_back(world: World, order: str) -> None:
    nested(world)
    ws = world.led.workspaces
    undo: list[list[str]] = []
    for to in ("s2", "s0", "s3", "s2", "s0"):
        preview = ws.rewind("w", to, preview=True)
        assert not preview.unobserved and not preview.unreachable, preview
        got = ws.rewind("w", to)
        assert got.applied, (to, got.detail)
        assert tree(world.root) == world.model[to], (to, tree(world.root))
        assert world.agrees_with_disk() and world.clean(), to
        undo.append([s for s in (got.step, got.cleared) if s])
    # undo the last rewind (to s0): back to s2's tree
    steps = undo[-1] if order == "second-first" else undo[-1][::-1]
    undo_all(world.led, steps)
    assert world.led.verify().ok
    if order == "second-first":
        assert tree(world.root) == world.model["s2"]
        assert world.agrees_with_disk() and world.clean()


def test_a_person_at_every_operation_of_a_nested_rewind(
        templates: Callable[..., Template]) -> None:
    """From s3's tree (a/b/c/d, a/e/f, p) back to s0's (a, p/q): the person writes into
    the deepest directory standing, or renames `a/b`, at each operation."""
    t = templates("t", nested)

    def deepest(p: Person) -> None:
        dirs = [d for d in (p.root / "a").rglob("*") if d.is_dir() and not d.is_symlink()] \
            if kind(p.root / "a") == "dir" else []
        if dirs:
            d = max(dirs, key=lambda q: (len(q.parts), str(q)))
            p.save(d.relative_to(p.root).as_posix() + "/person.txt")

    def mv_ab(p: Person) -> None:
        if kind(p.root / "a" / "b") == "dir":
            os.rename(p.root / "a" / "b", p.root / "moved")
            p.touched |= {"a/b", "moved"}
            p.did = True

    def to_s0(led: Ledger) -> Any:
        return led.workspaces.rewind("w", "s0")

    for action in (deepest, mv_ab, _save_a, _symlink_in_a):
        assert attack_every_op(t, action, to_s0) == [], action.__name__


# --- many files under the directory ----------------------------------------------------


def many(world: World) -> None:
    world.step("s1", lambda r: [r.read("a").write(b"file a\n")])
    world.step("s2", lambda r: [r.read("a").write(None)])
    world.step("s3", lambda r: [r.read(f"a/d{i}/e{i % 3}/f{j}").write(f"{i} {j}\n".encode())
                                for i in range(12) for j in range(25)])


def test_many_files_under_the_directory_and_a_person_before_each_rmdir(
        templates: Callable[..., Template]) -> None:
    """300 files in 36 directories under `a`, where the file `a` goes back: before each
    rmdir in turn, a person saves a file in the deepest directory standing."""
    t = templates("t", many)
    ops = t.count_ops(rewind_to_s1)
    with Ledger.open(t.location) as led:
        assert tree(t.root) == t.model["s1"]
        assert led.verify().ok
    rmdirs = [k for k, op in enumerate(ops, 1) if op == "ws-rmdir"]
    assert len(rmdirs) == 12 * 2 + 1, ops  # a/dI/eJ, a/dI, a
    for k in rmdirs[::6] + rmdirs[-2:]:
        t.restore()
        person = Person(t.root, t.outside)
        seen = [0]

        def on_op(name: str, seen: list[int] = seen, k: int = k, person: Person = person) -> None:
            seen[0] += 1
            if seen[0] == k:
                dirs = [d for d in (person.root / "a").rglob("*") if d.is_dir()] + \
                    [person.root / "a"]
                d = max(dirs, key=lambda q: (len(q.parts), str(q)))
                person.save(d.relative_to(person.root).as_posix() + "/person.txt")

        with Ledger.open(t.location, on_op=on_op) as led:
            got = led.workspaces.rewind("w", "s1")
            assert not got.applied, k
            assert person.lost() == [], k
            assert led.verify().ok
            assert not in_flight(led)
            drift = {c.path for c in led.workspaces.observe("w", dry_run=True).changes}
            assert drift == set(person.saved), (k, drift)
        # the ledger's files are all back where they were (the first step undone)
        assert tree(t.root, temporaries=False) == {**t.model["s3"], **person.saved}, k


# --- the two steps undone, in either order, with a person at each operation -----------


def _traded_and_rewound(direction: str, ids: dict[str, str]) -> Callable[[World], None]:
    def build(w: World) -> None:
        traded(w, direction)
        got = w.led.workspaces.rewind("w", "s1")
        assert got.applied and got.cleared
        ids["step"], ids["cleared"] = got.step, got.cleared
    return build


@pytest.mark.parametrize("order", ["second-first", "first-first"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_undoing_the_two_steps_with_a_person_at_every_operation(
        templates: Callable[..., Template], direction: str, order: str) -> None:
    ids: dict[str, str] = {}
    t = templates("t", _traded_and_rewound(direction, ids))
    steps = [ids["step"], ids["cleared"]]
    if order == "first-first":
        steps.reverse()

    def run(led: Ledger) -> Any:
        undo_all(led, steps)
        return None

    t.restore()
    with Ledger.open(t.location) as led:
        run(led)
        assert led.verify().ok and not in_flight(led)
        if order == "second-first":
            assert tree(t.root) == t.model["s3"]
    for action in (_new_in_a, _save_a, _save_ab, _symlink_a, _edit_app):
        assert attack_every_op(t, action, run) == [], action.__name__


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_rewind_killed_at_every_operation_then_undone_instead_of_rerun(
        templates: Callable[..., Template], direction: str) -> None:
    """SIGKILL before each operation of the two-step rewind in turn; then, instead of
    running it again, the person takes back whatever of it committed (the second step
    first): the tree is s3's again, the ledger agrees with the disk."""
    t = templates("t", lambda w: traded(w, direction))
    n = len(t.count_ops(rewind_to_s1))
    for k in range(1, n + 1):
        t.restore()
        kill_at_op(t.location, k, lambda led: led.workspaces.rewind("w", "s1"))
        with Ledger.open(t.location) as led:
            lease = led.workspaces.acquire("w", holder="person", ttl_s=600, force=True)
            done = sorted((s for s in led.steps() if s.step_id.startswith("rewind-")
                           and s.state not in ("compensated", "rejected")),
                          key=lambda s: not s.step_id.endswith("-clear"), reverse=True)
            for s in done:
                c = led.workspaces.compensate(s.step_id, epoch=lease.epoch, reason="undo")
                assert not [x for x in c.restored if x.outcome == "conflict"], (k, c)
            led.workspaces.release("w", lease.epoch)
            assert tree(t.root, temporaries=False) == t.model["s3"], (k, [(s.step_id, s.state) for s in done], {s.step_id: s.state for s in led.steps()})
            assert led.verify().ok and not in_flight(led), k
            assert not led.workspaces.observe("w", dry_run=True).changes, k


# --- the undo that removes empty directories first -------------------------------------


def test_an_undo_through_empty_directories_with_a_person_at_every_operation(
        templates: Callable[..., Template]) -> None:
    def build(w: World) -> None:
        w.step("s1", lambda r: [r.read("a").write(b"file a\n")])
        w.step("s2", lambda r: [r.read("a").write(None)])
        (w.root / "a" / "sub" / "deeper").mkdir(parents=True)
        (w.root / "a" / "other").mkdir()

    t = templates("t", build)

    def run(led: Ledger) -> Any:
        undo_all(led, ["s2"])
        return None

    def in_deeper(p: Person) -> None:
        if kind(p.root / "a" / "sub" / "deeper") == "dir":
            p.save("a/sub/deeper/person.txt")

    def link_sub(p: Person) -> None:
        sub = p.root / "a" / "sub"
        if kind(sub) == "dir":
            shutil.rmtree(sub)
            (p.outside / "empty").mkdir()
            (p.outside / "mine.txt").write_bytes(PERSON)
            os.symlink(p.outside, sub)
            p.saved["<outside>/mine.txt"] = PERSON
            p.touched.add("a/sub")
            p.did = True

    for action in (in_deeper, link_sub, _new_in_a, _save_a, _mv_a):
        assert attack_every_op(t, action, run) == [], action.__name__


# --- a second process rewinding at once ------------------------------------------------


WORKER = r"""
import sys
from ledger import LeaseHeld, Ledger
for line in sys.stdin:
    try:
        with Ledger.open(sys.argv[1]) as led:
            try:
                got = led.workspaces.rewind("w", "s1")
                print("nothing" if got.verdict == "nothing" else "wrote:" + got.verdict,
                      flush=True)
            except LeaseHeld:
                print("held", flush=True)
    except Exception as exc:
        print("error:" + repr(exc).replace("\n", " "), flush=True)
"""


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_second_rewind_at_every_operation_is_told_the_lease_is_held(
        templates: Callable[..., Template], direction: str) -> None:
    """Another process runs the same rewind at each operation of the first, in turn (a
    worker told to go there, not waited for): LeaseHeld (the first's holder is alive),
    or, once the first is done, nothing to do; never a second set of writes."""
    t = templates("t", lambda w: traded(w, direction))
    n = len(t.count_ops(rewind_to_s1))
    worker = subprocess.Popen([sys.executable, "-c", WORKER, t.location], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        for k in range(1, n + 1):
            t.restore()
            seen = [0]

            def on_op(name: str, seen: list[int] = seen, k: int = k) -> None:
                seen[0] += 1
                if seen[0] == k:
                    worker.stdin.write("go\n")  # type: ignore[union-attr]
                    worker.stdin.flush()  # type: ignore[union-attr]
                    # the first paused here while the other runs (unless it waits on the
                    # ledger's lock the first holds: then it goes on after a while)
                    if select.select([worker.stdout], [], [], 0.5)[0]:
                        answers.append(worker.stdout.readline().strip())  # type: ignore

            answers: list[str] = []
            with Ledger.open(t.location, on_op=on_op) as led:
                got = led.workspaces.rewind("w", "s1")
                said = answers[0] if answers else worker.stdout.readline().strip()
                assert got.applied, (k, got.detail, said)
                assert said in ("held", "nothing"), (k, said)
                assert tree(t.root) == t.model["s1"], k
                assert led.verify().ok and not in_flight(led)
                assert not led.workspaces.observe("w", dry_run=True).changes
                assert {s.step_id for s in led.steps() if s.step_id.startswith("rewind-")} \
                    == {got.step, got.cleared}
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
        worker.stdout.close()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_second_rewind_in_this_very_process_is_told_the_lease_is_held(
        templates: Callable[..., Template], direction: str) -> None:
    """Another handle of the ledger in the same process (same pid, same start: the same
    holder name) rewinds at each workspace operation of the first: LeaseHeld — a holder
    name shared by two calls of one process is never taken for a gone one, nor for a
    lease it may resume."""
    t = templates("t", lambda w: traded(w, direction))
    ops = t.count_ops(rewind_to_s1)
    for k in [k for k, op in enumerate(ops, 1) if op.startswith("ws-")]:
        t.restore()
        seen = [0]
        said: list[str] = []

        def on_op(name: str, seen: list[int] = seen, k: int = k,
                  said: list[str] = said) -> None:
            seen[0] += 1
            if seen[0] == k:
                with Ledger.open(t.location) as other:
                    try:
                        said.append(other.workspaces.rewind("w", "s1").verdict)
                    except LeaseHeld:
                        said.append("held")

        with Ledger.open(t.location, on_op=on_op) as led:
            got = led.workspaces.rewind("w", "s1")
            assert got.applied and said == ["held"], (k, ops[k - 1], said, got.detail)
            assert tree(t.root) == t.model["s1"], k
            assert led.verify().ok and not in_flight(led)


# --- a person's empty directories where a file goes back -------------------------------


def test_a_persons_empty_directories_where_a_deleted_file_comes_back_are_kept(
        world: World) -> None:
    world.step("s1", lambda r: [r.read("gone.txt").write(b"orig\n")])
    world.step("s2", lambda r: [r.read("gone.txt").write(None)])
    (world.root / "gone.txt" / "build" / "out").mkdir(parents=True)  # a person's
    preview = world.led.workspaces.rewind("w", "s1", preview=True)
    got = world.led.workspaces.rewind("w", "s1")
    assert world.led.verify().ok
    removed = not (world.root / "gone.txt" / "build" / "out").is_dir()
    said = "gone.txt" in preview.unobserved or any(p == "gone.txt" for p, _ in preview.unreachable)
    assert not removed or said, (got.verdict, preview)


# --- files named like steptrail's temporaries ------------------------------------------


@pytest.mark.parametrize("tail", [
    "12345678",
    "slot"])
def test_a_persons_file_named_like_a_temporary_in_the_directory_that_goes(
        world: World, tail: str) -> None:
    """A person's file in `a/` whose name has the shape of a temporary of an ended
    attempt: `_holds_only` skips it as a temporary, and `_remove_emptied` collects it."""
    from ledger.workspace import names
    traded(world, "file-then-dir")
    slot = names.temp_name("b", 1, "deadbeef", slot="x")
    name = slot if tail == "slot" else slot[:-12] + tail + ".tmp"
    assert names.temp_stamp(name) == (1, "deadbeef")
    (world.root / "a" / name).write_bytes(PERSON)
    world.led.workspaces.rewind("w", "s1")
    assert PERSON in tree(world.root).values(), tree(world.root)
    assert world.led.verify().ok


# --- holder names ----------------------------------------------------------------------


def _unshare_no_proc() -> list[str] | None:
    """A new pid namespace that keeps this /proc (unshare --pid --fork, no
    --mount-proc), or None where not allowed."""
    command = ["unshare", "--pid", "--fork"]
    if shutil.which("unshare") is None:
        return None
    try:
        done = subprocess.run([*command, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return command if done.returncode == 0 else None


NS_SCRIPT = r"""
import os, sys, time, signal
from ledger import Ledger, LeaseHeld
from ledger.step.observe import default_holder
loc = sys.argv[1]
for _ in range(2000):  # a child whose pid (in this namespace) names nothing in /proc
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if os.path.exists(f"/proc/{os.getpid()}"):
            os._exit(0)
        led = Ledger.open(loc)
        lease = led.workspaces.acquire("w", default_holder("rewind"), 600)
        os.write(w, lease.holder.encode())
        os.close(w)
        time.sleep(60)
        os._exit(0)
    os.close(w)
    data = os.read(r, 1000)
    os.close(r)
    if data:
        break
    os.waitpid(pid, 0)
else:
    print("no such pid")
    sys.exit(0)
try:
    with Ledger.open(loc) as led:
        try:
            got = led.workspaces.rewind("w", "s1")
            print("took over", got.verdict, os.waitpid(pid, os.WNOHANG) == (0, 0))
        except LeaseHeld:
            print("held")
finally:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(_unshare_no_proc() is None, reason="no new pid namespace here")
def test_a_live_holder_in_a_pid_namespace_without_its_own_proc_is_waited_for(
        world: World) -> None:
    world.step("s1", lambda r: [r.read("app.py").write(b"one\n")])
    world.step("s2", lambda r: [r.read("app.py").write(b"two\n")])
    world.led.close()
    try:
        done = subprocess.run([*(_unshare_no_proc() or []), sys.executable, "-c", NS_SCRIPT,
                               str(world.location)], capture_output=True, text=True,
                              timeout=120)
    finally:
        world.led = Ledger.open(str(world.location))
    out = done.stdout.strip()
    if out == "no such pid":
        pytest.skip("every pid of the new namespace names a process in this /proc")
    assert out == "held", (out, done.stderr[-2000:])
    assert (world.root / "app.py").read_bytes() == b"two\n"


def test_spoofed_holder_names_are_not_taken_for_gone(world: World) -> None:
    """Names that look like a gone one-call holder but are not this machine's exactly:
    never taken over."""
    world.step("s1", lambda r: [r.read("app.py").write(b"one\n")])
    world.step("s2", lambda r: [r.read("app.py").write(b"two\n")])
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    base = f"steptrail-rewind@{holders.host()}+{holders.machine()}:{pid}:0"
    assert holder_gone(base)
    for spoof in (base.upper(), base.replace("rewind", "mcp"), base + " ",
                  base.replace(f":{pid}:", f":0{pid}:"), " " + base,
                  base.replace(holders.host(), holders.host() + "."),
                  base.replace("+", "+" + "0" * 12 + ":1:1 +"),
                  f"steptrail-rewind@{holders.host()}+{holders.machine()}:{os.getpid()}:0"):
        assert not holder_gone(spoof), spoof
        lease = world.led.workspaces.acquire("w", holder=spoof[:255], ttl_s=600)
        with pytest.raises(LeaseHeld):
            world.led.workspaces.rewind("w", "s1")
        world.led.workspaces.release("w", lease.epoch)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "world")
    try:
        yield w
    finally:
        w.led.close()

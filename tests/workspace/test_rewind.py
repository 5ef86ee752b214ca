"""`rewind`: a workspace put back as it was at an earlier step, as one fenced step
(ledger/step/rewind.py, docs/time-travel.md "Rewind").

Against a reference model (the tree recorded after each step), every rewind target leaves
exactly that tree; a preview writes nothing; an edit nobody observed refuses the whole
step and keeps the person's bytes; a rewind is undone like any step; paths the ledger did
not know then are left alone and said; .git is never touched.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import LedgerAt

from ledger import Ledger, run_fenced_step
from ledger.gc.audit import audit

BOTH_STORES = True


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] in (".steptrail", ".git") or not p.is_file():
            continue
        out[rel] = p.read_bytes()
    return out


class World:
    """An agent's steps and a person's edits, with the tree after each (the model)."""

    def __init__(self, tmp: Path, at: LedgerAt) -> None:
        self.root = tmp / "repo"
        self.root.mkdir()
        (self.root / "app.py").write_text("v0\n")
        (self.root / "README.md").write_text("hello\n")
        self.led = Ledger.init(at(tmp / "ledger.db"))
        self.led.workspaces.add("w", str(self.root))
        self.led.workspaces.observe("w")
        self.model: dict[str, dict[str, bytes]] = {}
        lease = self.led.workspaces.acquire("w", holder="agent", ttl_s=600)
        for i in range(1, 7):
            def plan(read: Any, i: int = i) -> Any:
                writes = [read.read("app.py").write(f"v{i}\n".encode())]
                if i == 2:
                    writes.append(read.read("lib/util.py").write(b"def f(): pass\n"))
                if i == 4:
                    writes.append(read.read("lib/util.py").write(None))  # deleted
                if i == 5:
                    writes.append(read.read("docs/guide.md").write(b"# guide\n"))
                return writes
            run_fenced_step(self.led, "w", f"s{i}", plan, epoch=lease.epoch).raise_for_status()
            self.model[f"s{i}"] = tree(self.root)
            if i == 3:  # a person between steps, observed
                self.led.workspaces.release("w", lease.epoch)
                (self.root / "README.md").write_text("hello, world\n")
                self.led.workspaces.observe("w", by="person")
                lease = self.led.workspaces.acquire("w", holder="agent", ttl_s=600)
                self.model["person"] = tree(self.root)
        self.led.workspaces.release("w", lease.epoch)


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> Any:
    w = World(tmp_path, ledger_at)
    try:
        yield w
    finally:
        w.led.close()


@pytest.mark.parametrize("target", ["s1", "s2", "s3", "s4", "s5"])
def test_rewinding_to_each_step_leaves_the_tree_of_then(world: World, target: str) -> None:
    preview = world.led.workspaces.rewind("w", target, preview=True)
    before = world.led.head()
    assert world.led.head() == before and preview.preview and preview.changes
    got = world.led.workspaces.rewind("w", target)
    assert got.applied, got
    assert tree(world.root) == world.model[target]
    row = world.led.step(got.step)
    assert row.state == "acked" and row.run == "rewind"
    assert world.led.verify().ok and audit(world.led, deep=True).ok
    # undone like any step: the present comes back
    lease = world.led.workspaces.acquire("w", holder="person", ttl_s=600)
    world.led.workspaces.compensate(got.step, epoch=lease.epoch, reason="undo the rewind")
    assert tree(world.root) == world.model["s6"]


def test_a_preview_writes_nothing_and_shows_the_diffs(world: World) -> None:
    head = world.led.head()
    p = world.led.workspaces.rewind("w", "s2", preview=True)
    assert world.led.head() == head
    kinds = {c.path: c.kind for c in p.changes}
    assert kinds == {"app.py": "restore", "lib/util.py": "create", "docs/guide.md": "delete",
                     "README.md": "restore"}
    diff = next(c.diff for c in p.changes if c.path == "app.py")
    assert "-v6" in diff and "+v2" in diff
    assert tree(world.root) == world.model["s6"]


def test_an_edit_nobody_observed_refuses_the_rewind_and_is_kept(world: World) -> None:
    (world.root / "app.py").write_text("a person's unobserved edit\n")
    p = world.led.workspaces.rewind("w", "s2", preview=True)
    assert "app.py" in p.unobserved
    got = world.led.workspaces.rewind("w", "s2")
    assert not got.applied and got.verdict.startswith("rejected:")
    assert (world.root / "app.py").read_text() == "a person's unobserved edit\n"
    assert (world.root / "docs" / "guide.md").exists()  # nothing of the step stayed
    world.led.workspaces.observe("w")  # recorded: now the rewind may replace it
    again = world.led.workspaces.rewind("w", "s2")
    assert again.applied and (world.root / "app.py").read_text() == "v2\n"
    observed_bytes = [c for c in again.changes if c.path == "app.py"][0].now
    assert observed_bytes == h(b"a person's unobserved edit\n")  # restorable: in the ledger
    assert b"".join(world.led.blob_chunks(observed_bytes)) == b"a person's unobserved edit\n"


def test_only_the_paths_asked_for(world: World) -> None:
    got = world.led.workspaces.rewind("w", "s2", paths=["lib"])
    assert got.applied and [c.path for c in got.changes] == ["lib/util.py"]
    assert (world.root / "lib" / "util.py").read_text() == "def f(): pass\n"
    assert (world.root / "app.py").read_text() == "v6\n"


def test_a_seq_before_the_baseline_leaves_unknown_paths_alone(world: World) -> None:
    p = world.led.workspaces.rewind("w", 1, preview=True)  # workspace-added: no baseline yet
    assert {path for path, _why in p.unreachable} == {"app.py", "README.md"}
    assert "docs/guide.md" in {c.path for c in p.changes}  # created by a step since: goes


@pytest.mark.sqlite_only
def test_git_is_never_touched(world: World) -> None:
    subprocess.run(["git", "init", "-q", str(world.root)], check=True)
    subprocess.run(["git", "-C", str(world.root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(world.root), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "x"], check=True)
    git = world.root / ".git"

    def state() -> dict[str, bytes]:
        return {p.relative_to(git).as_posix(): p.read_bytes()
                for p in sorted(git.rglob("*")) if p.is_file()}

    before = state()
    world.led.workspaces.observe("w")  # .gitignore-free tree: nothing new but .git
    got = world.led.workspaces.rewind("w", "s2")
    assert got.applied
    assert state() == before


def test_the_command_line(world: World) -> None:
    from click.testing import CliRunner

    from ledger.cli import cli

    location = world.led.path
    world.led.close()
    runner = CliRunner()
    base = ["--ledger", str(location), "--workspace", "w", "rewind"]
    r = runner.invoke(cli, [*base, "--to", "s2", "--preview"])
    assert r.exit_code == 0 and "would change" in r.output and "+v2" in r.output, r.output
    (world.root / "app.py").write_text("unobserved\n")
    r = runner.invoke(cli, [*base, "--to", "s2"])
    assert r.exit_code == 1 and "steptrail observe" in r.output, r.output
    assert (world.root / "app.py").read_text() == "unobserved\n"
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "observe"])
    assert r.exit_code == 0
    r = runner.invoke(cli, [*base, "--to", "s2", "--json"])
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads(r.output)
    assert doc["verdict"] == "applied" and doc["to_step"] == "s2"
    r = runner.invoke(cli, [*base, "--to", "nosuch"])
    assert r.exit_code == 2 and "UnknownStep" in r.output
    world.led = Ledger.open(location)
    assert world.led.verify().ok



@pytest.mark.parametrize("direction", ["file-then-dir", "dir-then-file"])
def test_a_file_and_a_directory_that_traded_places_on_either_store(
        tmp_path: Path, ledger_at: LedgerAt, direction: str) -> None:
    """Two steps (what stands in the way first), on SQLite and PostgreSQL alike; undone
    in turn, the present comes back."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text("v0\n")
    first, then = ("a", "a/b") if direction == "file-then-dir" else ("a/b", "a")
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as led:
        led.workspaces.add("w", str(root))
        led.workspaces.observe("w")
        lease = led.workspaces.acquire("w", holder="agent", ttl_s=600)
        for step, path, data in (("s1", first, b"x\n"), ("s2", first, None), ("s3", then, b"y\n")):
            if step == "s3" and (root / "a").is_dir():
                (root / "a").rmdir()
            run_fenced_step(led, "w", step, lambda r, p=path, d=data: [r.read(p).write(d)],
                            epoch=lease.epoch).raise_for_status()
        led.workspaces.release("w", lease.epoch)
        got = led.workspaces.rewind("w", "s1")
        assert got.applied and got.cleared, got
        assert tree(root) == {"app.py": b"v0\n", first: b"x\n"}
        assert led.verify().ok and audit(led, deep=True).ok
        lease = led.workspaces.acquire("w", holder="person", ttl_s=600)
        for step in (got.step, got.cleared):
            led.workspaces.compensate(step, epoch=lease.epoch, reason="undo the rewind")
        assert tree(root) == {"app.py": b"v0\n", then: b"y\n"}

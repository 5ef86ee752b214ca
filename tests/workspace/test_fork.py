"""`fork`: a workspace as of an earlier step, written into a new directory and registered
as a new workspace of the same ledger (ledger/step/fork.py, docs/time-travel.md "Fork").

The fork's tree is the model's tree after that step, with the recorded modes; its
baseline observation names its origin; the original goes on untouched and both take
steps of their own; bad targets and names are refused with nothing written.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import LedgerAt

from ledger import InvalidInput, Ledger, WorkspaceOverlap, run_fenced_step
from ledger.cli import cli
from ledger.events import Observed
from ledger.gc.audit import audit

BOTH_STORES = True


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != ".steptrail"}


class World:
    def __init__(self, tmp: Path, at: LedgerAt) -> None:
        self.tmp = tmp
        self.root = tmp / "repo"
        self.root.mkdir()
        (self.root / "app.py").write_text("v0\n")
        self.location = at(tmp / "ledger.db")
        self.led = Ledger.init(self.location)
        self.led.workspaces.add("w", str(self.root))
        self.led.workspaces.observe("w")
        self.model: dict[str, dict[str, bytes]] = {}
        lease = self.led.workspaces.acquire("w", holder="agent", ttl_s=600)
        for i in range(1, 5):
            def plan(read: Any, i: int = i) -> Any:
                writes = [read.read("app.py").write(f"v{i}\n".encode())]
                if i == 2:
                    writes.append(read.read("bin/run.sh").write(b"#!/bin/sh\necho hi\n"))
                if i == 3:
                    writes.append(read.read("bin/run.sh").write(None))
                return writes
            run_fenced_step(self.led, "w", f"s{i}", plan, epoch=lease.epoch).raise_for_status()
            if i == 2:
                os.chmod(self.root / "bin" / "run.sh", 0o755)
                self.led.workspaces.observe("w", epoch=lease.epoch)
            self.model[f"s{i}"] = tree(self.root)
        self.led.workspaces.release("w", lease.epoch)


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> Any:
    w = World(tmp_path, ledger_at)
    try:
        yield w
    finally:
        w.led.close()


def test_a_fork_holds_the_tree_of_then_and_both_go_on(world: World) -> None:
    target = world.tmp / "try2"
    got = world.led.workspaces.fork("w", "s2", target)
    assert got.workspace == "try2" and got.at_step == "s2" and got.files == 2
    assert tree(target) == world.model["s2"]
    assert stat.S_IMODE((target / "bin" / "run.sh").stat().st_mode) == 0o644  # as of s2
    [obs] = [e.event for e in world.led.read(step=got.baseline[0], kind="observed")]
    assert isinstance(obs, Observed) and obs.by == f"fork:w@{got.at_seq}" and obs.baseline
    assert "forked from workspace 'w'" in obs.label
    assert tree(world.root) == world.model["s4"]  # the original: untouched
    # a second agent in the fork, the first in the original
    for ws in ("try2", "w"):
        lease = world.led.workspaces.acquire(ws, holder=f"agent-{ws}", ttl_s=600)
        run_fenced_step(world.led, ws, f"{ws}-next",
                        lambda read, ws=ws: [read.read("app.py").write(f"{ws}\n".encode())],
                        epoch=lease.epoch).raise_for_status()
    assert (target / "app.py").read_text() == "try2\n"
    assert (world.root / "app.py").read_text() == "w\n"
    assert world.led.verify().ok and audit(world.led, deep=True).ok


def test_a_fork_keeps_the_recorded_modes(world: World) -> None:
    got = world.led.workspaces.fork("w", "s2", world.tmp / "m")
    assert got.files == 2
    # s2's write made run.sh 0644; the observation right after recorded 0755, at a later
    # seq than s2's writes: as of the observation, the file is executable
    [obs_step] = [e.step for e in world.led.read(kind="observed")][1:2]
    acked = [e.seq for e in world.led.read(step=obs_step, kind="acked")][0]
    later = world.led.workspaces.fork("w", acked, world.tmp / "m2")
    mode = stat.S_IMODE((world.tmp / "m2" / "bin" / "run.sh").stat().st_mode)
    assert later.files == 2 and mode == 0o755


def test_bad_targets_and_names_are_refused_with_nothing_written(world: World) -> None:
    busy = world.tmp / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("a person's\n")
    head = world.led.head()
    with pytest.raises(InvalidInput):
        world.led.workspaces.fork("w", "s2", busy)
    assert tree(busy) == {"mine.txt": b"a person's\n"}
    with pytest.raises(InvalidInput):
        world.led.workspaces.fork("w", "s2", world.tmp / "x", name="w")  # a name in use
    with pytest.raises(WorkspaceOverlap):
        world.led.workspaces.fork("w", "s2", world.root / "inside")
    assert not (world.root / "inside").exists()
    assert world.led.head() == head


def test_the_command_line(world: World) -> None:
    world.led.close()
    runner = CliRunner()
    r = runner.invoke(cli, ["--ledger", str(world.location), "--workspace", "w", "fork",
                            "--at", "s3", "--to", str(world.tmp / "f3"), "--as", "f3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["workspace"] == "f3" and doc["at_step"] == "s3" and doc["files"] == 1
    assert tree(world.tmp / "f3") == world.model["s3"]
    r = runner.invoke(cli, ["--ledger", str(world.location), "--workspace", "w", "fork",
                            "--at", "s3", "--to", str(world.tmp / "f3"), "--as", "again"])
    assert r.exit_code == 2 and "WorkspaceOverlap" in r.output  # f3's own directory
    r = runner.invoke(cli, ["--ledger", str(world.location), "--workspace", "w", "fork",
                            "--at", "s2", "--to", str(world.tmp / "f2")])
    said = ("STEPTRAIL_WORKSPACE=f2" if "://" in str(world.location)  # (a database: named)
            else "steptrail finds this ledger and workspace f2 from there")
    assert r.exit_code == 0 and said in r.output, r.output
    world.led = Ledger.open(world.location)

"""A fork's directory finds its ledger by itself (ledger/find.py `Pointer`,
docs/time-travel.md "Fork"): the fork writes ``DIR/.steptrail/root`` naming the ledger and
its workspace, with the directory's identity; a command run anywhere inside the directory
uses that ledger and that workspace. A copy of the directory (the class of bug where a
copied project wrote into the original) is refused, and so is a pointer that is not one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger import InvalidInput, Ledger, run_fenced_step
from ledger.cli import cli
from ledger.find import LEDGER_DIR, POINTER_FILE, find_ledger, find_pointer


@pytest.fixture
def forked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for var in ("STEPTRAIL_LEDGER", "STEPTRAIL_WORKSPACE", "STEPTRAIL_EPOCH"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text("v0\n")
    db = tmp_path / "repo" / ".steptrail" / "ledger.db"
    with Ledger.init(str(db)) as led:
        led.workspaces.add("w", str(root))
        lease = led.workspaces.acquire("w", holder="agent", ttl_s=600, observe=True)
        for i in (1, 2):
            run_fenced_step(led, "w", f"s{i}", lambda read, i=i: [
                read.read("app.py").write(f"v{i}\n".encode())], epoch=lease.epoch)
        fork = led.workspaces.fork("w", "s1", tmp_path / "try2")
    return {"db": db, "root": root, "fork": fork, "dir": tmp_path / "try2", "tmp": tmp_path}


def test_commands_in_the_forks_directory_use_its_ledger_and_workspace(
        forked: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    d: Path = forked["dir"]
    assert forked["fork"].pointer == str(d / LEDGER_DIR / POINTER_FILE)
    (d / "sub").mkdir()
    monkeypatch.chdir(d / "sub")
    assert find_ledger() == str(forked["db"])
    assert find_pointer().workspace == "try2"  # type: ignore[union-attr]
    (d / "app.py").write_text("a person's edit in the fork\n")
    r = CliRunner().invoke(cli, ["observe", "--json"])  # no --ledger, no --workspace
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["workspace"] == "try2"
    with Ledger.open(str(forked["db"])) as led:  # the original ledger recorded it
        assert [p for (w, p) in [(r.event.workspace, None) for r in led.read(kind="observed")]
                if w == "try2"]
        assert (forked["root"] / "app.py").read_text() == "v2\n"  # the original untouched
    # the library's Ledger.open() with no path finds it the same way
    with Ledger.open() as led:
        assert os.path.samefile(led.path, forked["db"])
    # the pointer is not part of the fork's files: not observed, not committed to git
    assert (d / LEDGER_DIR / ".gitignore").read_text().endswith("*\n")


def test_a_copy_of_the_forks_directory_is_refused_and_writes_nothing(
        forked: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    d: Path = forked["dir"]
    copy = forked["tmp"] / "copy"
    shutil.copytree(d, copy)
    (copy / "app.py").write_text("edited in the copy\n")
    with Ledger.open(str(forked["db"])) as led:
        count = led.count()
    monkeypatch.chdir(copy)
    with pytest.raises(InvalidInput, match="is a copy of a fork's directory"):
        find_ledger()
    r = CliRunner().invoke(cli, ["observe"])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "copy" in r.output
    assert "workspace add" in r.output  # the fix, named
    with Ledger.open(str(forked["db"])) as led:
        assert led.count() == count
    assert (d / "app.py").read_text() == "v1\n"


@pytest.mark.parametrize("content", [b"", b"not json", b'{"format": "other"}',
                                     b'{"format": "steptrail-root/1", "ledger": "rel.db",'
                                     b' "workspace": "w", "dev": 1, "ino": 2}',
                                     b"\xff\xfe" * 10, b"x" * 10_000])
def test_a_pointer_that_is_not_one_is_refused_in_one_line(
        forked: dict[str, Any], monkeypatch: pytest.MonkeyPatch, content: bytes) -> None:
    d: Path = forked["dir"]
    (d / LEDGER_DIR / POINTER_FILE).write_bytes(content)
    monkeypatch.chdir(d)
    r = CliRunner().invoke(cli, ["status"])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_a_pointer_to_a_ledger_that_is_gone_says_so(
        forked: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    os.rename(forked["db"], str(forked["db"]) + ".away")
    monkeypatch.chdir(forked["dir"])
    with pytest.raises(InvalidInput, match="not there"):
        find_ledger()


def test_a_symlinked_pointer_is_not_followed(
        forked: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    d: Path = forked["dir"]
    real = d / LEDGER_DIR / POINTER_FILE
    elsewhere = forked["tmp"] / "planted"
    real.rename(elsewhere)
    real.symlink_to(elsewhere)
    monkeypatch.chdir(d)
    with pytest.raises(InvalidInput):
        find_ledger()

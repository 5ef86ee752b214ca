"""`steptrail export git`: a run as git history (ledger/export_git.py), tested with the real
git: one commit per acknowledged step and per observation made meanwhile, a revert per
compensation; every tree the base's with the run's changes (checked against the tree
recorded after each step); dates from the ledger, so a re-export is byte-identical and a
later one only appends; HEAD, the index, the working tree and every branch untouched.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger import InvalidInput, Ledger, run_fenced_step
from ledger.cli import cli
from ledger.export_git import export_git

pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True)
                                .returncode != 0, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)
    return done.stdout


def files_at(repo: Path, rev: str) -> dict[str, str]:
    out = {}
    for name in git(repo, "ls-tree", "-r", "--name-only", rev).splitlines():
        out[name] = git(repo, "show", f"{rev}:{name}")
    return out


def worktree(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): p.read_text() for p in sorted(repo.rglob("*"))
            if p.is_file() and p.relative_to(repo).parts[0] not in (".git", ".steptrail")}


def git_state(repo: Path) -> tuple[str, str, str, bytes]:
    return (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"),
            git(repo, "for-each-ref", "refs/heads"), (repo / ".git" / "index").read_bytes())


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("v0\n")
    (repo / "README.md").write_text("hello\n")
    (repo / ".gitignore").write_text(".steptrail/\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    led = Ledger.init(repo / ".steptrail" / "ledger.db")
    led.workspaces.add("w", str(repo))
    led.workspaces.observe("w", by="setup")  # the baseline, before the run: not exported
    yield repo, led
    led.close()


def run_steps(led: Ledger, repo: Path, model: list[dict[str, str]]) -> int:
    lease = led.workspaces.acquire("w", holder="agent-1", ttl_s=600)
    for i in range(1, 4):
        def plan(read: Any, i: int = i) -> Any:
            writes = [read.read("app.py").write(f"v{i}\n".encode())]
            if i == 2:
                writes.append(read.read("lib/new.py").write(b"x = 1\n"))
            return writes
        run_fenced_step(led, "w", f"s{i}", plan, epoch=lease.epoch, run="r1").raise_for_status()
        model.append(worktree(repo))
        if i == 1:  # a person between the agent's steps, observed
            (repo / "README.md").write_text("hello, world\n")
            led.workspaces.observe("w", epoch=lease.epoch, by="cli:alice")
            model.append(worktree(repo))
    return lease.epoch


def test_a_run_exports_as_commits_whose_trees_are_the_model(project: Any) -> None:
    repo, led = project
    base = git(repo, "rev-parse", "HEAD").strip()
    model: list[dict[str, str]] = []
    epoch = run_steps(led, repo, model)
    led.workspaces.compensate("s3", epoch=epoch, reason="not right")
    model.append(worktree(repo))
    before = git_state(repo)  # the agent's work in the tree, uncommitted
    got = export_git(led, "r1", author="Agent <agent@example.com>")
    assert got.commits == 5 and got.ref == "refs/steptrail/r1"
    assert got.base == base
    log = git(repo, "log", "--format=%s", got.ref).splitlines()
    assert log == ['Revert "s3: app.py"', "s3: app.py", "s2: app.py, lib/new.py",
                   "observed: README.md", "s1: app.py", "base"]
    for k, want in enumerate(reversed(model)):  # ref~0 is the revert
        assert files_at(repo, f"{got.ref}~{k}") == {**want, ".gitignore": ".steptrail/\n"}
    body = git(repo, "log", "-1", "--format=%B", f"{got.ref}~3")
    assert "asked by cli:alice" in body and "Holder: agent-1" in body
    assert git(repo, "log", "-1", "--format=%an <%ae>", got.ref).strip() == \
        "Agent <agent@example.com>"
    assert "+v2" in git(repo, "log", "-p", got.ref)
    assert git_state(repo) == before  # HEAD, status, branches, the index: as they were


def test_a_reexport_is_byte_identical_and_a_later_one_only_appends(project: Any) -> None:
    repo, led = project
    model: list[dict[str, str]] = []
    epoch = run_steps(led, repo, model)
    first = export_git(led, "r1")
    again = export_git(led, "r1")
    assert again.head == first.head and again.commits == first.commits
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--allow-empty", "-qm",
        "HEAD moves on")  # the next export still starts from the first one's base
    run_fenced_step(led, "w", "s4", lambda read: [read.read("app.py").write(b"v4\n")],
                    epoch=epoch, run="r1").raise_for_status()
    later = export_git(led, "r1")
    assert later.commits == first.commits + 1
    assert git(repo, "rev-parse", f"{later.ref}~1").strip() == first.head  # appended


def test_refs_that_are_branches_or_head_are_refused(project: Any) -> None:
    repo, led = project
    run_steps(led, repo, [])
    for bad in ("refs/heads/main", "HEAD", "main", "refs/heads/new"):
        with pytest.raises(InvalidInput):
            export_git(led, "r1", ref=bad)
    assert git(repo, "for-each-ref", "refs/heads").count("\n") == 1


def test_a_workspace_in_a_subdirectory_exports_under_its_path(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = tmp_path / "mono"
    (repo / "svc").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "top.txt").write_text("top\n")
    (repo / "svc" / "main.py").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    with Ledger.init(tmp_path / "ledger.db") as led:
        led.workspaces.add("svc", str(repo / "svc"))
        lease = led.workspaces.acquire("svc", holder="a", ttl_s=600)
        run_fenced_step(led, "svc", "e1", lambda read: [read.read("main.py").write(b"b\n")],
                        epoch=lease.epoch, run="r").raise_for_status()
        got = export_git(led, "r")
    assert files_at(repo, got.ref) == {"top.txt": "top\n", "svc/main.py": "b\n"}


def test_the_command_line(project: Any) -> None:
    repo, led = project
    run_steps(led, repo, [])
    location = str(led.path)
    led.close()
    runner = CliRunner()
    r = runner.invoke(cli, ["--ledger", location, "export", "git", "--run", "r1", "--json"])
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads(r.output)
    assert doc["ref"] == "refs/steptrail/r1" and doc["commits"] == 4
    r = runner.invoke(cli, ["--ledger", location, "export", "git", "--run", "nosuch"])
    assert r.exit_code == 2 and "no step of run" in r.output
    r = runner.invoke(cli, ["--ledger", location, "export", "git", "--run", "r1",
                            "--ref", "refs/heads/main"])
    assert r.exit_code == 2 and "never writes a branch" in r.output
    r = runner.invoke(cli, ["--ledger", location, "export", "--what", "steps"])
    assert r.exit_code == 0 and '"step_id"' in r.output  # the old export: as it was

"""Time travel as a user lives it (docs/time-travel.md), through the command line, in a real
git repository: an agent makes 10 steps; between them a person edits two files with
`sed -i` and deletes one with `rm`, and `observe` records it; then the workspace is
rewound to step 4 (a preview first), forked at step 7 into another directory, and the run
exported to git. Every file at every point equals a reference model (the tree recorded
after each step and each observation); the person's edits are in the history and
restorable; `.git`'s HEAD, index and branches are unchanged; `verify` and `audit` are
clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STEPTRAIL = str(Path(sys.executable).with_name("steptrail"))

pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True)
                                .returncode != 0, reason="git is not installed")


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".steptrail")}


def run(cwd: Path, *args: str, env: dict[str, str], ok: bool = True,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True,
                          input=stdin, timeout=120, check=False)
    if ok:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def git_state(repo: Path, env: dict[str, str]) -> tuple[str, ...]:
    return (run(repo, "git", "rev-parse", "HEAD", env=env).stdout,
            run(repo, "git", "for-each-ref", "refs/heads", env=env).stdout,
            (repo / ".git" / "index").read_bytes().hex())


def test_steps_a_persons_edits_rewind_fork_and_git(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    repo = tmp_path / "proj"
    repo.mkdir()
    run(repo, "git", "init", "-q", "-b", "main", env=env)
    for name, text in {"app.py": "print('v0')\n", "notes.md": "# notes\n",
                       "config.ini": "[a]\nx = 1\n", "old.txt": "old\n",
                       ".gitignore": ".steptrail/\n"}.items():
        (repo / name).write_text(text)
    run(repo, "git", "add", "-A", env=env)
    run(repo, "git", "-c", "user.name=p", "-c", "user.email=p@p", "commit", "-qm", "start",
        env=env)
    st = lambda *a, ok=True, stdin=None: run(repo, STEPTRAIL, *a, env=env, ok=ok,  # noqa: E731
                                              stdin=stdin)
    st("init")
    st("workspace", "add", "proj", ".")
    env["STEPTRAIL_WORKSPACE"] = "proj"
    st("observe", "--label", "before the agent")  # the baseline
    git_before = git_state(repo, env)
    lease = json.loads(st("lease", "acquire", "--holder", "agent-1", "--ttl", "30m",
                          "--json").stdout)
    env["STEPTRAIL_EPOCH"] = str(lease["epoch"])
    model: dict[str, dict[str, bytes]] = {}
    for i in range(1, 11):
        read = json.loads(st("workspace", "read", "app.py", "--json").stdout)
        writes = [{"path": "app.py", "base_rev": read["rev"], "pre_hash": read["pre_hash"],
                   "content": f"print('v{i}')\n"}]
        if i == 3:
            writes.append({"path": f"mod{i}.py", "pre_hash": None, "content": f"# {i}\n"})
        plan = {"step": f"s{i}", "run": "r1", "writes": writes}
        st("step", "run", "-", stdin=json.dumps(plan))
        model[f"s{i}"] = tree(repo)
        if i in (2, 5):  # a person between the agent's steps
            subprocess.run(["sed", "-i", f"s/x = .*/x = {i}/", str(repo / "config.ini")],
                           check=True)
            subprocess.run(["sed", "-i", f"$a line {i}", str(repo / "notes.md")], check=True)
            if i == 5:
                subprocess.run(["rm", str(repo / "old.txt")], check=True)
            got = json.loads(st("observe", "--json").stdout)
            assert got["recorded"] and {c["path"] for c in got["changes"]} == (
                {"config.ini", "notes.md"} | ({"old.txt"} if i == 5 else set()))
            model[f"s{i}"] = tree(repo)  # as of the step's end: the observation is after
            model[f"obs{i}"] = tree(repo)
    assert tree(repo) == model["s10"]
    st("lease", "release")
    del env["STEPTRAIL_EPOCH"]

    # the person's edits are in the history, and restorable
    steps = json.loads(st("steps", "--json").stdout)
    observed = [s["step_id"] for s in steps if s["step_id"].startswith("observed-")]
    assert len(observed) == 3  # the baseline and the two edits

    # rewind to s4, previewing first: nothing written by the preview
    head = st("head").stdout
    preview = json.loads(st("rewind", "--to", "s4", "--preview", "--json").stdout)
    assert st("head").stdout == head and tree(repo) == model["s10"]
    assert {c["path"] for c in preview["changes"]} == {"app.py", "config.ini", "notes.md",
                                                        "old.txt"}
    done = json.loads(st("rewind", "--to", "s4", "--json").stdout)
    assert done["verdict"] == "applied"
    want = dict(model["s4"])  # s4 came after the person's first edit (observed at s2)
    assert tree(repo) == want

    # fork at s7 into another directory: its tree is the model's after s7
    fork = json.loads(st("fork", "--at", "s7", "--to", str(tmp_path / "proj-s7"),
                         "--json").stdout)
    assert tree(tmp_path / "proj-s7") == model["s7"]
    assert fork["workspace"] == "proj-s7"

    # the run as git history: HEAD, the index and the branches unchanged
    exported = json.loads(st("export", "git", "--run", "r1", "--json").stdout)
    assert exported["commits"] == 10 + 2  # ten steps, two observations while it ran
    assert git_state(repo, env) == git_before
    log = run(repo, "git", "log", "--format=%s", exported["ref"], env=env).stdout.splitlines()
    assert log[0].startswith("s10:") and log[-1] == "start"
    tip = run(repo, "git", "show", f"{exported['ref']}:config.ini", env=env).stdout
    assert tip == model["s10"]["config.ini"].decode()

    # the person's bytes stay restorable after the rewind replaced them
    rewound_step = done["step"]
    lease = json.loads(st("lease", "acquire", "--holder", "person", "--json").stdout)
    st("step", "compensate", rewound_step, "--reason", "back to the present",
       "--epoch", str(lease["epoch"]))
    st("lease", "release", "--epoch", str(lease["epoch"]))
    assert tree(repo) == model["s10"]

    assert json.loads(st("verify", "--json").stdout)["ok"] is True
    assert json.loads(st("audit", "--json").stdout)["ok"] is True

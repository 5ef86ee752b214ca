"""A newcomer's second hour (issue 37): what a new user meets after the quickstart —
each item's test fails before its fix (the newcomer's exact commands where there are
commands)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from ledger import Ledger, LedgerError
from ledger.backup import backup, restore_backup
from ledger.find import ENV_ACROSS, ENV_CEILINGS, find_ledger

GIT = shutil.which("git")


def git_status(repo: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                          cwd=repo, capture_output=True, text=True, check=True).stdout


# -- item 3: the ledger is ignored by git ------------------------------------------------

@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_init_in_a_git_repository_leaves_git_status_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`steptrail init` in a repository: `git status` must not offer `.steptrail/` (it
    showed `?? .steptrail/`)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    assert run_cli(["init"]).code == 0
    assert (tmp_path / ".steptrail" / "ledger.db").is_file()
    assert git_status(tmp_path) == ""
    assert (tmp_path / ".steptrail" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_ledger_init_writes_the_gitignore_only_in_its_own_directory(tmp_path: Path) -> None:
    """`Ledger.init` of the default layout (what the MCP server's first ledger and `copy`
    use too) writes ``.steptrail/.gitignore``; a ledger at ``./ledger.db`` lives beside a
    person's files: nothing is written there; an existing .gitignore is never replaced."""
    Ledger.init(str(tmp_path / "a" / ".steptrail" / "ledger.db"), parents=True).close()
    assert (tmp_path / "a" / ".steptrail" / ".gitignore").read_text().endswith("*\n")
    (tmp_path / "b").mkdir()
    Ledger.init(str(tmp_path / "b" / "ledger.db")).close()
    assert not (tmp_path / "b" / ".gitignore").exists()
    mine = tmp_path / "c" / ".steptrail"
    mine.mkdir(parents=True)
    (mine / ".gitignore").write_text("ledger.db\n")
    Ledger.init(str(mine / "ledger.db")).close()
    assert (mine / ".gitignore").read_text() == "ledger.db\n"


def test_a_copy_and_a_restore_into_the_default_layout_are_ignored_by_git(
        tmp_path: Path) -> None:
    src = tmp_path / "src" / ".steptrail" / "ledger.db"
    Ledger.init(str(src), parents=True).close()
    (tmp_path / "c" / ".steptrail").mkdir(parents=True)
    r = run_cli(["copy", str(src), str(tmp_path / "c" / ".steptrail" / "ledger.db")])
    assert r.code == 0, r
    assert (tmp_path / "c" / ".steptrail" / ".gitignore").read_text().endswith("*\n")
    backup(str(src), tmp_path / "bk")
    restore_backup(tmp_path / "bk", tmp_path / "fresh" / ".steptrail")
    assert (tmp_path / "fresh" / ".steptrail" / ".gitignore").read_text().endswith("*\n")


# -- item 2: the ledger found upward, as git finds .git ---------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """proj/ with a ledger, and the newcomer in proj/sub/deeper."""
    proj = tmp_path / "proj"
    (proj / "sub" / "deeper").mkdir(parents=True)
    monkeypatch.chdir(proj)
    assert run_cli(["init"]).code == 0
    monkeypatch.chdir(proj / "sub" / "deeper")
    monkeypatch.delenv("STEPTRAIL_LEDGER", raising=False)
    monkeypatch.delenv(ENV_CEILINGS, raising=False)
    return proj


def test_a_command_in_a_subdirectory_uses_the_projects_ledger(project: Path) -> None:
    """From proj/sub/deeper every command said "no ledger at .steptrail/ledger.db" and
    advised an init that nested a second ledger in the project."""
    r = run_cli(["status", "--json"])
    assert r.code == 0, r
    assert str(project / ".steptrail" / "ledger.db") in r.out
    with Ledger.open() as led:
        assert led.path == str(project / ".steptrail" / "ledger.db")
    assert not (project / "sub" / "deeper" / ".steptrail").exists()


def test_init_below_a_ledger_refuses_unless_nested(project: Path) -> None:
    here = project / "sub" / "deeper"
    r = run_cli(["init"])
    assert r.code == 2 and "already exists above" in r.err and "--nested" in r.err, r
    assert not (here / ".steptrail").exists()
    assert run_cli(["init", "--nested"]).code == 0
    assert (here / ".steptrail" / "ledger.db").is_file()
    r = run_cli(["status", "--json"])  # the nearest one from now on
    assert str(here / ".steptrail" / "ledger.db") in r.out


def test_the_search_stops_at_a_ceiling_directory(project: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CEILINGS, str(project))
    assert find_ledger() is None
    r = run_cli(["status"])
    assert r.code == 2 and "no ledger" in r.err, r
    monkeypatch.setenv(ENV_CEILINGS, str(project / "sub" / "deeper"))
    assert find_ledger() is None  # (the ceiling itself is not looked in either)
    monkeypatch.setenv(ENV_CEILINGS, "relative/ignored:" + str(project.parent / "elsewhere"))
    assert find_ledger() == str(project / ".steptrail" / "ledger.db")


def _planted(project: Path, uid: int) -> None:
    """Hand the project's ledger (its directory and everything in it) to user `uid`."""
    for path in [project / ".steptrail", *(project / ".steptrail").rglob("*")]:
        os.lchown(path, uid, -1)


@pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                    reason="needs root to give a file to another user (CI runs as root)")
def test_another_users_ledger_found_upward_is_refused(project: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: another user plants /tmp/.steptrail (or one in a shared directory)
    registering a workspace; a person working below it ran every command against it —
    its workspaces, restores and settles with the person's permissions. A found ledger
    is used only when it is the user's own; named explicitly it is used as given."""
    from ledger.errors import ForeignLedger

    (project / "victim").mkdir()
    (project / "victim" / "notes.txt").write_text("mine\n")
    with Ledger.open(str(project / ".steptrail" / "ledger.db")) as led:
        led.workspaces.add("w", str(project / "victim"))
    _planted(project, 65534)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (project / ".steptrail").rglob("*"))
    r = run_cli(["status"])
    assert r.code == 2 and "ForeignLedger" in r.err and "--ledger" in r.err, r
    assert len(r.err.strip().splitlines()) == 1
    r = run_cli(["--workspace", "w", "restore", "--to", str(project / "victim"), "--replace"])
    assert r.code == 2 and "ForeignLedger" in r.err, r
    assert (project / "victim" / "notes.txt").read_text() == "mine\n"
    with pytest.raises(ForeignLedger) as caught:
        Ledger.open()
    assert "Ledger.open(" in str(caught.value) and "'steptrail" not in str(caught.value)
    assert sorted((p.name, p.stat().st_mtime_ns)
                  for p in (project / ".steptrail").rglob("*")) == before  # nothing read
    assert run_cli(["completion", "bash"]).code == 0  # a command without a ledger runs
    r = run_cli(["init"])
    assert r.code == 2 and "init --nested" in r.err, r
    named = str(project / ".steptrail" / "ledger.db")
    assert run_cli(["--ledger", named, "status"]).code == 0  # named: used as given
    assert run_cli(["init", "--nested"]).code == 0  # its own, here
    assert run_cli(["status"]).code == 0


def test_the_search_stops_at_a_file_system_boundary(project: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount point between the directory and the project's ledger (a device change):
    not crossed, unless STEPTRAIL_DISCOVERY_ACROSS_FILESYSTEM=1."""
    import ledger.find as find_mod

    real_stat = os.stat
    sub = str(project / "sub")

    def stat(p: Any, *a: Any, **k: Any) -> Any:
        st = real_stat(p, *a, **k)
        if str(p) != sub and not str(p).startswith(sub + os.sep):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *st[3:10]))
        return st

    monkeypatch.setattr(find_mod.os, "stat", stat)
    assert find_ledger() is None
    monkeypatch.setenv(ENV_ACROSS, "1")
    assert find_ledger() == str(project / ".steptrail" / "ledger.db")


def test_the_mcp_server_finds_the_ledger_from_its_workspace_not_its_cwd(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.mcp.server import open_workspaces

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    led, names, _ = open_workspaces([str(project / "sub")], None, create=True)
    try:
        assert led.path == str(project / ".steptrail" / "ledger.db") and names == ["sub"]
    finally:
        led.close()
    assert not (elsewhere / ".steptrail").exists()
    assert not (project / "sub" / ".steptrail").exists()


# -- item 4: restore in place, into the default layout ----------------------------------

def test_restore_into_the_directory_holding_the_restored_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI quickstart's last line restores a backup into ../fresh/.steptrail; the
    natural next command, `restore --workspace repo --to .` inside ../fresh, was refused
    ("exists and is not an empty directory")."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("v0\n")
    monkeypatch.chdir(repo)
    monkeypatch.delenv("STEPTRAIL_LEDGER", raising=False)
    assert run_cli(["init"]).code == 0
    assert run_cli(["workspace", "add", "repo", "."]).code == 0
    with Ledger.open() as led:
        lease = led.workspaces.acquire("repo", holder="a", ttl_s=60)
        from ledger import StepPlan
        read = led.workspaces.read_file("repo", "app.py")
        led.workspaces.admit("repo", lease.epoch, [StepPlan("s1", [read.write(b"v1\n")])])
        assert led.workspaces.apply("s1", epoch=lease.epoch).verdict == "applied"
        led.publish("s1")
        led.ack("s1", epoch=lease.epoch)
        led.workspaces.release("repo", lease.epoch)
    assert run_cli(["backup", "../backup"]).code == 0
    assert run_cli(["backup", "restore", "../backup", "../fresh/.steptrail"]).code == 0
    monkeypatch.chdir(tmp_path / "fresh")
    r = run_cli(["restore", "--workspace", "repo", "--to", "."])
    assert r.code == 0, r
    assert "only files the ledger holds" in r.out
    assert (tmp_path / "fresh" / "app.py").read_text() == "v1\n"
    # anything else there is still refused, nothing written
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine\n")
    r = run_cli(["restore", "--workspace", "repo", "--to", str(tmp_path / "other")])
    assert r.code == 2 and "not an empty directory" in r.err
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


# -- item 5: database URLs ---------------------------------------------------------------

@pytest.mark.parametrize("argv", [["status"], ["init", "--parents"], ["verify"]])
def test_a_mistyped_database_url_is_refused_its_password_never_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """`postgresq://bob:S3cretPass@localhost/ledger` printed the password and was taken
    for a file path; `init --parents` made the directory ./postgresq:/bob:S3cretPass@..."""
    monkeypatch.chdir(tmp_path)
    r = run_cli(["--ledger", "postgresq://bob:S3cretPass@localhost/ledger", *argv])
    assert r.code == 2, r
    assert "S3cretPass" not in r.out + r.err
    assert "did you mean postgresql://" in r.err and r.err.count("\n") == 1, r.err
    assert list(tmp_path.iterdir()) == []


def test_init_on_a_database_that_does_not_exist_says_createdb(pg_url: str) -> None:
    """It said "run init" — which cannot make a database."""
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_db_37"
    shown = missing.replace("postgresql://", "postgresql://")
    r = run_cli(["--ledger", missing, "init"])
    assert r.code == 2, r
    assert "createdb no_such_db_37" in r.err and "CREATE DATABASE" in r.err, r.err
    assert shown.split("@")[-1] in r.err


# -- item 6: errors that say the right thing ---------------------------------------------

def test_a_workspace_that_is_not_writable_is_access_denied_not_a_retry(
        tmp_path: Path) -> None:
    """It said `StorageFailure … free space or fix the disk` (exit 3, "retry"): it is
    permissions — AccessDenied naming the directory, exit 2, `retryable: false`. Real
    EACCES (root's override dropped by setpriv, as CI runs as root)."""
    import json
    import os as _os
    import sys

    prefix: list[str] = []
    if _os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "a.txt").write_text("v0\n")
    led = str(tmp_path / "l" / "ledger.db")
    with Ledger.init(led) as ledger:
        ledger.workspaces.add("w", str(ws))
        epoch = ledger.workspaces.acquire("w", holder="a", ttl_s=600).epoch
        read = ledger.workspaces.read_file("w", "sub/a.txt")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"step": "s1", "writes": [{
        "path": "sub/a.txt", "base_rev": read.rev, "pre_hash": read.pre_hash,
        "content": "v1\n"}]}))
    (ws / "sub").chmod(0o555)
    try:
        r = subprocess.run([*prefix, sys.executable, "-m", "ledger", "--ledger", led,
                            "--workspace", "w", "step", "run", str(plan), "--epoch",
                            str(epoch), "--json"], capture_output=True, text=True,
                           cwd=tmp_path)
    finally:
        (ws / "sub").chmod(0o755)
    assert r.returncode == 2, r
    assert "AccessDenied" in r.stderr and str(ws / "sub") in r.stderr, r.stderr
    assert "free space" not in r.stderr
    err = json.loads(r.stdout.strip().splitlines()[-1])["error"]
    assert err["type"] == "AccessDenied" and err["retryable"] is False
    assert (ws / "sub" / "a.txt").read_text() == "v0\n"


# -- item 7: restart-safe agents by default ----------------------------------------------

def test_a_restarted_agent_takes_its_own_lease_back_and_a_conflict_raises(
        tmp_path: Path) -> None:
    """After a crash the README's agent died with LeaseHeld for the TTL; and a conflict,
    a return value, was easy to skip. `resume=True` takes the same holder's live lease
    back (settling the dead run), never another's; `raise_for_status()` raises."""
    from ledger import LeaseHeld, StepRejected, run_fenced_step

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "app.py").write_text("v0\n")
    with Ledger.init(str(tmp_path / "repo" / ".steptrail" / "ledger.db")) as ledger:
        ledger.workspaces.add("repo", str(tmp_path / "repo"))
        first = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600, resume=True)
        # ... the process dies here; the next run of the same agent:
        again = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600, resume=True)
        assert again.epoch == first.epoch + 1
        with pytest.raises(LeaseHeld):
            ledger.workspaces.acquire("repo", holder="agent-2", ttl_s=600, resume=True)

        def edit(read):  # type: ignore[no-untyped-def]
            got = read.read("app.py")
            (tmp_path / "repo" / "app.py").write_text("a person's edit\n")
            return [got.write(b"v1\n")]

        out = run_fenced_step(ledger, "repo", "e1", edit, epoch=again.epoch)
        with pytest.raises(StepRejected) as caught:
            out.raise_for_status()
        assert caught.value.facts["paths"] == ["app.py"]
        ok = run_fenced_step(ledger, "repo", "e2",
                             lambda read: [read.read("app.py").write(b"v2\n")],
                             epoch=again.epoch)
        assert ok.raise_for_status() is ok
        late = run_fenced_step(ledger, "repo", "e3",
                               lambda read: [read.read("app.py").write(b"v3\n")],
                               epoch=first.epoch)
        with pytest.raises(Exception) as stale:
            late.raise_for_status()
        assert type(stale.value).__name__ == "StaleEpoch"


# -- item 9: installing from a clone -------------------------------------------------------

def test_a_missing_extra_names_the_install_command_for_this_installation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install 'steptrail[mcp]'` fails (the package is not on an index): the hint
    follows the installer's record — a clone, editable or not; a wheel file; an index."""
    import importlib.metadata
    import json

    from ledger import extras

    class Dist:
        def __init__(self, record: dict[str, Any] | None) -> None:
            self.record = record

        def read_text(self, name: str) -> str | None:
            return None if self.record is None else json.dumps(self.record)

    clone = tmp_path / "steptrail"
    clone.mkdir()
    cases = [
        ({"url": clone.as_uri(), "dir_info": {"editable": True}},
         f"pip install -e '{clone}[mcp]'"),
        ({"url": clone.as_uri(), "dir_info": {}}, f"pip install '{clone}[mcp]'"),
        ({"url": "file:///w/dist/steptrail-0.1.0-py3-none-any.whl", "archive_info": {}},
         "pip install 'steptrail[mcp] @ file:///w/dist/steptrail-0.1.0-py3-none-any.whl'"),
        (None, "pip install 'steptrail[mcp]'"),
    ]
    for record, want in cases:
        monkeypatch.setattr(importlib.metadata, "distribution", lambda _n, r=record: Dist(r))
        assert extras.install_hint("mcp") == want


def test_importing_an_integration_without_its_extra_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`from ledger.langgraph import LedgerSaver` without the extra was a raw
    `ModuleNotFoundError: langchain_core`."""
    import sys

    for name in [m for m in sys.modules if m.startswith(("ledger.langgraph", "langgraph",
                                                          "langchain_core"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "langchain_core", None)  # "not installed"
    with pytest.raises(ModuleNotFoundError) as caught:
        import ledger.langgraph  # noqa: F401
    assert "'langgraph' extra" in str(caught.value) and "pip install" in str(caught.value)


@pytest.mark.parametrize("command", ["status", "verify", "steps"])
def test_a_read_only_command_on_an_unreachable_database_gives_no_journal_key_advice(
        command: str) -> None:
    """`status` on an unreachable database said "retry with the same journal key": the
    write path's advice, for a command that writes nothing."""
    r = run_cli(["--ledger", "postgresql://nobody@127.0.0.1:1/none", command])
    if "PostgreSQL extra" in r.err:
        pytest.skip("the postgres extra is not installed")
    assert r.code == 3 and "DatabaseUnavailable" in r.err, r
    assert "journal key" not in r.err and "nothing was written" in r.err


def test_a_refused_step_apply_shows_a_diff_once(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`step apply`'s rejection showed hashes only, printed twice (stdout and stderr):
    now stderr has the one error line, stdout the diff (what the step read -> disk)."""
    import json

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("line1\nline2\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(["init"]).code == 0
    assert run_cli(["workspace", "add", "w", "ws"]).code == 0
    assert run_cli(["--workspace", "w", "lease", "acquire", "--holder", "a"]).code == 0

    def plan(step: str, content: str) -> None:
        read = json.loads(run_cli(["--workspace", "w", "workspace", "read", "a.txt",
                                   "--json"]).out)
        (tmp_path / "p.json").write_text(json.dumps({"step": step, "writes": [{
            "path": "a.txt", "base_rev": read["rev"], "pre_hash": read["pre_hash"],
            "content": content}]}))

    plan("s1", "line1\nline2 by step 1\n")
    assert run_cli(["--workspace", "w", "step", "run", "p.json", "--epoch", "1"]).code == 0
    plan("s2", "line1\nline2 by step 2\n")
    assert run_cli(["--workspace", "w", "step", "plan", "p.json", "--epoch", "1"]).code == 0
    (ws / "a.txt").write_text("line1 by a person\nline2 by step 1\n")
    r = run_cli(["--workspace", "w", "step", "apply", "s2", "--epoch", "1"])
    assert r.code == 1 and r.err.count("\n") == 1 and "StepRejected" in r.err, r
    assert "+line1 by a person" in r.out and "-line1" in r.out, r.out
    assert "rejected:pre_hash" not in r.out


def test_steptrail_mcp_with_a_mistyped_workspace_answers_the_client(tmp_path: Path) -> None:
    """`steptrail mcp --workspace ./repoo` exited before the handshake: the client saw
    "Connection closed". It stays up and answers every tool with the one-line error."""
    pytest.importorskip("mcp")
    import anyio
    from mcp_agents import over_stdio, server_env, text

    async def session() -> tuple[str, bool]:
        async with over_stdio("--workspace", str(tmp_path / "repoo"),
                              env=server_env(), cwd=str(tmp_path)) as agent:
            r = await agent.call("list_allowed_directories")
            return text(r), bool(r.is_error)

    said, is_error = anyio.run(session)
    assert is_error and "repoo" in said and "not a directory" in said, said
    assert said.count("\n") == 0
    assert not (tmp_path / ".steptrail").exists()


def test_stats_shows_the_bytes_committed_steps_hold(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`stats` said "acked 20 (0 B stored)" while 2.3 KiB was referenced (inline
    artifacts of steps committed in one commit)."""
    from ledger import run_step

    monkeypatch.chdir(tmp_path)
    with Ledger.init(".steptrail/ledger.db") as led:
        for i in range(20):
            run_step(led, f"b{i}", {"r.txt": b"x" * 120})
    r = run_cli(["stats"])
    assert r.code == 0 and "acked 20 (2.3 KiB committed)" in r.out, r.out
    import json
    doc = json.loads(run_cli(["stats", "--json"]).out)
    assert doc["committed_bytes_by_state"] == {"acked": 2400}


def test_a_sealed_run_is_not_shown_unsettled(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`seal run nightly`, then `stats` showed the run "SETTLED no"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.log").write_text("12 passed\n")
    assert run_cli(["init"]).code == 0
    for argv in (["step", "store", "tests-1", "p.log", "--as", "logs/p.log", "--run",
                  "nightly"], ["step", "publish", "tests-1"], ["step", "ack", "tests-1"],
                 ["seal", "run", "nightly"]):
        assert run_cli(argv).code == 0, argv
    line = next(ln for ln in run_cli(["stats"]).out.splitlines()
                if ln.strip().startswith("nightly"))
    assert " sealed " in line and " no " not in line, line


def test_an_mcp_move_into_the_empty_directory_a_killed_move_left_goes_on(
        tmp_path: Path) -> None:
    """A move_file retried after its killed attempt was settled failed on the empty
    destination directory the attempt left ("moved already exists"): an empty directory
    holds nothing to replace. A non-empty one is still refused."""
    pytest.importorskip("mcp")
    import anyio
    from mcp_agents import inprocess, text

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.txt").write_text("a\n")
    (repo / "moved").mkdir()  # what the killed attempt left, settled

    async def session() -> tuple[str, bool, str, bool]:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path=str(repo / "src" / "a.txt"))
            r = await agent.call("move_file", source=str(repo / "src"),
                                 destination=str(repo / "moved"))
            (repo / "other").mkdir()
            (repo / "other" / "x").write_text("x\n")
            (repo / "b").mkdir()
            (repo / "b" / "y").write_text("y\n")
            await agent.ok("read_text_file", path=str(repo / "b" / "y"))
            r2 = await agent.call("move_file", source=str(repo / "b"),
                                  destination=str(repo / "other"))
            return text(r), bool(r.is_error), text(r2), bool(r2.is_error)

    said, err, said2, err2 = anyio.run(session)
    assert not err, said
    assert (repo / "moved" / "a.txt").read_text() == "a\n" and not (repo / "src").exists()
    assert err2 and "already exists" in said2
    assert (repo / "other" / "x").read_text() == "x\n" and (repo / "b" / "y").exists()


def test_restore_over_existing_files_keeps_what_it_displaces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restoring over other files is its own act (--replace, not --force, which means
    "while a lease is live"): through the verified moves, keeping what it displaces;
    files the ledger does not know stay."""
    from ledger import StepPlan

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("v0\n")
    with Ledger.init(str(repo / ".steptrail" / "ledger.db")) as led:
        led.workspaces.add("repo", str(repo))
        lease = led.workspaces.acquire("repo", holder="a", ttl_s=60)
        read = led.workspaces.read_file("repo", "app.py")
        led.workspaces.admit("repo", lease.epoch, [StepPlan("s1", [read.write(b"v1\n")])])
        assert led.workspaces.apply("s1", epoch=lease.epoch).verdict == "applied"
        led.publish("s1")
        led.ack("s1", epoch=lease.epoch)
        led.workspaces.release("repo", lease.epoch)
    other = tmp_path / "other"
    other.mkdir()
    (other / "app.py").write_text("a person's version\n")
    (other / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(repo)
    r = run_cli(["restore", "--workspace", "repo", "--to", str(other)])
    assert r.code == 2 and (other / "app.py").read_text() == "a person's version\n"
    r = run_cli(["restore", "--workspace", "repo", "--to", str(other), "--replace"])
    assert r.code == 0, r
    assert (other / "app.py").read_text() == "v1\n"
    kept = [p for p in other.iterdir() if ".steptrail-kept-" in p.name]
    assert len(kept) == 1 and kept[0].read_text() == "a person's version\n"
    assert kept[0].name in r.out and (other / "notes.txt").read_text() == "mine\n"


def test_status_says_when_gc_last_ran_even_when_it_collected_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After scheduled runs that found nothing to collect, status said "gc never collected
    here": now it says when gc last ran."""
    import json

    monkeypatch.chdir(tmp_path)
    assert run_cli(["init"]).code == 0
    assert "no run recorded here" in run_cli(["status"]).out
    assert run_cli(["gc", "--json"]).code == 0
    r = run_cli(["status"])
    assert "gc       last ran " in r.out and "nothing to collect so far" in r.out, r.out
    ran = json.loads(run_cli(["status", "--json"]).out)["gc"]["last_run"]
    assert ran["collected"] == 0 and ran["time_ns"] > 0
    assert run_cli(["gc", "--dry-run", "--json"]).code == 0  # a dry run records nothing
    assert json.loads(run_cli(["status", "--json"]).out)["gc"]["last_run"] == ran
    assert run_cli(["verify"]).code == 0


def test_each_surface_names_its_own_fix(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A library error named CLI commands ('create one with steptrail … init') and a CLI
    error named Python (force=True): each surface names its own fix."""
    from ledger import LeaseHeld, LedgerNotFound

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerNotFound) as caught:
        Ledger.open("nope/ledger.db")
    assert "Ledger.init(" in str(caught.value) and "steptrail" not in str(caught.value)
    r = run_cli(["--ledger", "nope/ledger.db", "status"])
    assert "steptrail --ledger nope/ledger.db init" in r.err and "Ledger.init" not in r.err
    (tmp_path / "ws").mkdir()
    with Ledger.init(str(tmp_path / "l" / "ledger.db")) as led:
        led.workspaces.add("w", str(tmp_path / "ws"))
        led.workspaces.acquire("w", holder="a", ttl_s=600)
        with pytest.raises(LeaseHeld) as held:
            led.workspaces.acquire("w", holder="b", ttl_s=600)
    assert "force=True" in str(held.value) and "steptrail" not in str(held.value)
    r = run_cli(["--ledger", str(tmp_path / "l" / "ledger.db"), "--workspace", "w",
                 "lease", "acquire", "--holder", "b"])
    assert r.code == 1 and "--force" in r.err and "force=True" not in r.err, r
    import json
    r = run_cli(["--ledger", str(tmp_path / "l" / "ledger.db"), "--workspace", "w",
                 "lease", "acquire", "--holder", "b", "--json"])
    assert "cli_message" not in json.loads(r.out)["error"]


# Every typed error, built once: its text names no command, its command-line words name
# no Python call. A new error class fails `test_every_error_class_is_checked` until added.
_PYTHONIC = re.compile(r"=True\b|\bledger\.[a-z_]+\(|\bLedger\.[a-z_]+\(|\bexpected_rev=|"
                       r"\bwitness=|\bfrom ledger\.")
_COMMANDS = re.compile(r"'steptrail [a-z]|--(?:force|resume|wait|rebind|expected-rev|witness)\b")


def _error_samples() -> dict[str, LedgerError]:
    """One instance of each error class, from the `err = Cls(...)` line of its doctest,
    or built here where the doctest raises it through a ledger."""
    from ledger import errors as E

    out: dict[str, LedgerError] = {}
    for name in E.__all__:
        cls = getattr(E, name)
        if not (isinstance(cls, type) and issubclass(cls, LedgerError)):
            continue
        found = re.search(r">>> err = " + name + r"\((.*?)\)\n", cls.__doc__ or "", re.S)
        if found and cls.__init__ is not LedgerError.__init__:
            out[name] = eval(f"E.{name}({found[1].replace('...', '')})", {"E": E})
    by_hand: dict[str, LedgerError] = {
        "LedgerNotFound": E.LedgerNotFound("x/ledger.db"),
        "UnknownStep": E.UnknownStep("s1"),
        "NotALedger": E.NotALedger("notes.txt", "not a database"),
        "PathEscapes": E.PathEscapes("repo", "../x", "it leaves the workspace"),
        "ManifestConflict": E.ManifestConflict("fetch", 5, 1),
        "ReadOnlyLedger": E.ReadOnlyLedger("l.db"),
        "UnknownWorkspace": E.UnknownWorkspace("repo"),
        "LeaseHeld": E.LeaseHeld("repo", 1, "agent-1", 0),
        "StaleEpoch": E.StaleEpoch("repo", 9, 5),
        "StaleEpoch (expired)": E.StaleEpoch("repo", 3, None, latest=3),
        "StaleEpoch (no lease)": E.StaleEpoch("repo", 3, None),
        "WitnessMissing (no location)": E.WitnessMissing("l.db", None, "old"),
        "LedgerMoved (moved)": E.LedgerMoved("repo", "/srv/repo", "/srv/repo/.steptrail",
                                             "/tmp/r2/.steptrail", "moved", "/tmp/r2",
                                             "/tmp/r2/.steptrail/ledger.db", False),
        "LedgerMoved (ledger only)": E.LedgerMoved(
            "repo", "/srv/repo", "/srv/repo/.steptrail", "/tmp/r2/.steptrail", "ledger-only",
            "/tmp/r2", "/tmp/r2/.steptrail/ledger.db", True, witness="/w"),
        "GcRefused (rebuild)": E.GcRefused("tables disagree", ("ledger.rebuild()",
                                                               "run 'steptrail rebuild'")),
    }
    for name, exc in by_hand.items():
        out.setdefault(name, exc)
    return out


def test_every_error_names_its_own_surfaces_fix() -> None:
    """Across every typed error: the library's text (`str`) names no command and the
    command line's (`said_at_a_shell`, also the MCP server's) names no Python call."""
    from ledger.errors import said_at_a_shell

    wrong = []
    samples = _error_samples()
    assert len(samples) > 50
    for name, exc in samples.items():
        if _COMMANDS.search(str(exc)):
            wrong.append(f"{name} (library): {exc}")
        if _PYTHONIC.search(said_at_a_shell(exc)):
            wrong.append(f"{name} (command line): {said_at_a_shell(exc)}")
    assert not wrong, "\n".join(wrong)


def test_every_error_class_is_checked() -> None:
    from ledger import errors as E

    classes = {n for n in E.__all__ if isinstance(getattr(E, n), type)
               and issubclass(getattr(E, n), LedgerError)}
    sampled = {n.split(" ")[0] for n in _error_samples()}
    # classes without their own words (they take the message, or are abstract bases)
    bases = {"LedgerError", "InvalidInput", "ProtocolRefused", "EnvironmentFailure",
             "StorageFailure", "Violation"}
    assert classes - sampled - bases == set()


def test_the_surface_check_catches_a_mixed_message() -> None:
    """The checker is not vacuous: the old words (a CLI command in the library's text,
    Python in the command line's) are caught."""
    from ledger import errors as E
    from ledger.errors import said_at_a_shell

    old = E.CorruptLedger("l.db", "x")
    Exception.__init__(old, "ledger l.db is damaged: x; run 'steptrail verify' for every finding")
    assert _COMMANDS.search(str(old))
    held = E.LeaseHeld("repo", 1, "a", 0)
    held.cli_message = None
    assert _PYTHONIC.search(said_at_a_shell(held))


def test_raise_sites_outside_errors_py_word_each_surface(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors raised with their words at the raise site: a workspace added twice, a
    path in .git, a head that is not one, a run that cannot be sealed — the library
    names Python, the command line its commands."""
    from ledger import InvalidInput, PathForbidden
    from ledger.store import Head

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws2").mkdir()
    assert run_cli(["init"]).code == 0
    assert run_cli(["workspace", "add", "w", "ws"]).code == 0
    with Ledger.open() as led:
        with pytest.raises(InvalidInput) as twice:
            led.workspaces.add("w", "ws2")
        # (the directory's own path is left out: it may hold any word, "steptrail" too)
        said = str(twice.value).replace(str(tmp_path), "DIR")
        assert "rebind=True" in said and "steptrail" not in said
        with pytest.raises(PathForbidden) as git:
            led.workspaces.directory("w").check_path(".git/config")
        assert "allow_git=True" in str(git.value) and "'steptrail" not in str(git.value)
    r = run_cli(["workspace", "add", "w", "ws2"])
    assert r.code == 2 and "--rebind" in r.err and "rebind=True" not in r.err, r
    with pytest.raises(InvalidInput) as head:
        Head.parse("nope")
    assert "ledger.head()" in str(head.value) and "steptrail" not in str(head.value)
    r = run_cli(["verify", "--expect-head", "nope"])
    assert r.code == 2 and "'steptrail head'" in r.err and "ledger.head" not in r.err, r
    r = run_cli(["seal", "run", "never-ran"])
    assert r.code == 1 and "'steptrail seal list'" in r.err and "seal_events" not in r.err, r

"""A ledger knows where it lives (issue 36, item 7).

A project copied with its embedded ledger (`cp -a proj proj2`, a restored CI cache, a
container snapshot, a second checkout made by copying) carries a ledger whose workspace
is registered at the *original* project's directory — which still matches its recorded
device and inode. Before this, a step run in the copy wrote the original's files. Every
registration now records where the ledger itself was (its directory's real path, device
and inode), and a step — any effect on the workspace, and the reads a plan is made from —
is refused (`LedgerMoved`, exit 2, nothing read or written) while a ledger that travels
with its workspace no longer sits where it was. One line tells the cases apart (copied:
rebind to the copy; moved: rebind to where it went; the ledger alone: restore), and the
command line, the library, `status` and the MCP server say the same.

Each attack is real: `cp -a` and `mv` of a project made by the command line, a fenced step
run in the copy through `steptrail step run`, `run_fenced_step` and the MCP tools; the
original project's bytes — its files and its ledger — are compared whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger.errors import said_at_a_shell
from mcp import Client
from mcp.types import ListRootsResult, Root

from conftest import CliOut, run_cli
from mcp_agents import inprocess, make_server, text

import ledger as ledger_pkg
from ledger import Ledger, LedgerError, run_fenced_step
from ledger.events import WorkspaceAdded, decode
from ledger.mcp.server import ClientRoots, SteptrailServer

V0, V1, V2 = b"print('v0')\n", b"print('v1')\n", b"print('v2')\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (its ledger's files too) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def cli(where: Path, *args: str) -> CliOut:
    """`steptrail ARGS` run from `where` (the default ledger: ./.steptrail/ledger.db)."""
    old = os.getcwd()
    os.chdir(where)
    try:
        return run_cli(list(args))
    finally:
        os.chdir(old)


def step_plan(plans: Path, step: str, pre: bytes, base_rev: int, new: bytes) -> Path:
    doc = {"step": step, "writes": [{"path": "app.py", "base_rev": base_rev,
                                     "pre_hash": sha(pre), "content": new.decode()}]}
    path = plans / f"{step}.json"
    path.write_text(json.dumps(doc))
    return path


def run_step(where: Path, plan: Path, *extra: str) -> CliOut:
    return cli(where, "--workspace", "proj", "step", "run", str(plan), "--epoch", "1", "--json",
               *extra)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp/proj: an embedded ledger (`steptrail init` in it), workspace `proj` on it, a
    lease (epoch 1, 30 minutes) and one committed step (app.py v0 -> v1)."""
    proj = tmp_path / "proj"
    (proj / "lib").mkdir(parents=True)
    (proj / "app.py").write_bytes(V0)
    (proj / "lib" / "util.py").write_bytes(b"X = 1\n")
    (tmp_path / "plans").mkdir()
    assert cli(proj, "init").code == 0
    assert cli(proj, "workspace", "add", "proj", ".").code == 0
    assert cli(proj, "--workspace", "proj", "lease", "acquire", "--holder", "agent-1",
               "--ttl", "30m", "--no-observe").code == 0  # (the plans below count revisions)
    done = run_step(proj, step_plan(tmp_path / "plans", "s1", V0, 0, V1))
    assert done.code == 0, done
    assert (proj / "app.py").read_bytes() == V1
    return proj


def copy_of(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def refused(out: CliOut) -> dict[str, Any]:
    """The LedgerMoved refusal of a command: exit 2, one line naming its type."""
    assert out.code == 2, out
    assert out.err.startswith("steptrail: error: LedgerMoved: "), out
    assert out.err.count("\n") == 1 and "Traceback" not in out.err
    error = out.json["error"]
    assert error["type"] == "LedgerMoved"
    assert out.err == f"steptrail: error: LedgerMoved: {error['message']}\n"
    return error


def run_command(where: Path, command: str) -> CliOut:
    """The command an error or `status` names, as an operator would paste it."""
    argv = shlex.split(command)
    assert argv[0] == "steptrail"
    return cli(where, *argv[1:])


# --- the copy: cp -a, then a step in the copy -------------------------------------------


def test_a_step_in_a_copied_project_never_writes_the_original(project: Path,
                                                                tmp_path: Path) -> None:
    copy = copy_of(project, tmp_path / "proj2")
    original = tree(project)
    copied = tree(copy)
    out = run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2))
    error = refused(out)
    assert tree(project) == original  # the original's files and ledger, byte for byte
    assert (copy / "app.py").read_bytes() == V1
    assert error["case"] == "copied" and error["workspace"] == "proj"
    assert error["root"] == str(project) and error["new_root"] == str(copy)
    assert error["recorded_dir"] == str(project / ".steptrail")
    assert error["ledger_dir"] == str(copy / ".steptrail")
    ledger_file = copy / ".steptrail" / "ledger.db"
    assert error["command"] == (f"steptrail --ledger {ledger_file} workspace add proj {copy}"
                                " --rebind")
    assert "--rebind" in out.err and str(project) in out.err and "copy" in out.err
    # nothing was recorded in the copy's ledger either: its events are as copied
    assert {k: v for k, v in tree(copy).items() if "steptrail" not in k} == \
        {k: v for k, v in copied.items() if "steptrail" not in k}
    with Ledger.open(ledger_file, readonly=True) as led:
        assert [r.event.step for r in led.read(kind="planned")] == ["s1"]

    # the operator's answer: this copy writes its own files from now on
    rebound = run_command(copy, error["command"])
    assert rebound.code == 0, rebound
    assert "re-registered workspace proj at" in rebound.out
    done = run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2))
    assert done.code == 0, done
    assert (copy / "app.py").read_bytes() == V2
    assert tree(project) == original
    # and the original, untouched by all of it, still works on its own files
    again = run_step(project, step_plan(tmp_path / "plans", "s3", V1, 1, V0))
    assert again.code == 0, again
    assert (project / "app.py").read_bytes() == V0 and (copy / "app.py").read_bytes() == V2


def test_the_library_refuses_the_copy_with_the_same_line(project: Path, tmp_path: Path) -> None:
    copy = copy_of(project, tmp_path / "proj2")
    original = tree(project)
    cli_error = refused(run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2)))

    def plan(read: Any) -> list[Any]:
        return [read.read("app.py").write(V2)]

    with Ledger.open(copy / ".steptrail" / "ledger.db") as led:
        count = led.count()
        with pytest.raises(LedgerError) as caught:
            run_fenced_step(led, "proj", "s2", plan, epoch=1)
        err = caught.value
        assert type(err).__name__ == "LedgerMoved" and err.exit_code == 2
        assert err.cli_message == cli_error["message"]  # the command line's words
        assert "workspaces.add('proj'" in str(err) and "rebind=True" in str(err)  # Python's
        assert str(err).split("), call ")[0] == cli_error["message"].split("), run ")[0]
        assert isinstance(err, ledger_pkg.InvalidInput)
        # every way in is the same refusal: a read to plan from, the walk a tool makes,
        # a plan, an apply, an undo; none records anything
        with pytest.raises(type(err), match="rebind=True"):
            led.workspaces.read_file("proj", "app.py")
        with pytest.raises(type(err)):
            led.workspaces.directory("proj")
        with pytest.raises(type(err)):
            led.workspaces.compensate("s1", epoch=1, reason="undo in the copy")
        with pytest.raises(type(err)):  # a new epoch would settle the old one's steps there
            led.workspaces.acquire("proj", "agent-2", 600, force=True)
        assert str(led.workspaces.ledger_moved("proj")) == str(err)
        assert led.count() == count
        assert tree(project) == original

        led.workspaces.add("proj", copy, rebind=True)  # the fix, from the library
        assert led.workspaces.ledger_moved("proj") is None
        out = run_fenced_step(led, "proj", "s2", plan, epoch=1)
        assert out.status.value == "applied"
        assert (copy / "app.py").read_bytes() == V2
        reg = led.workspaces.registration("proj")
        assert reg.ledger_dir == str(copy / ".steptrail") and reg.root == str(copy)
    assert tree(project) == original


# --- moved, and the ledger alone --------------------------------------------------------


def test_a_moved_project_says_moved_and_rebinds_where_it_went(project: Path,
                                                              tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "proj"
    moved.parent.mkdir()
    os.rename(project, moved)
    before = tree(moved)
    out = run_step(moved, step_plan(tmp_path / "plans", "s2", V1, 1, V2))
    error = refused(out)
    assert tree(moved) == before
    assert error["case"] == "moved" and error["new_root"] == str(moved)
    assert "moved" in error["message"] and f"{project} is gone" in error["message"]
    assert error["command"].endswith(f"workspace add proj {moved} --rebind")
    assert run_command(moved, error["command"]).code == 0
    assert run_step(moved, step_plan(tmp_path / "plans", "s2", V1, 1, V2)).code == 0
    assert (moved / "app.py").read_bytes() == V2


def test_the_ledger_alone_copied_elsewhere_says_restore(project: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    subprocess.run(["cp", "-a", str(project / ".steptrail"), str(bare / ".steptrail")],
                   check=True)
    original = tree(project)
    out = run_step(bare, step_plan(tmp_path / "plans", "s2", V1, 1, V2))
    error = refused(out)
    assert tree(project) == original and not (bare / "app.py").exists()
    assert error["case"] == "ledger-only" and error["new_root"] == str(bare)
    assert "restore --workspace proj --to" in error["command"]
    assert "restore" in error["message"] and f"{project} is still there" in error["message"]
    # restore is the way out: it writes a new directory and records the ledger's place
    target = tmp_path / "restored"
    restored = cli(bare, "restore", "--workspace", "proj", "--to", str(target), "--force")
    assert restored.code == 0, restored
    assert (target / "app.py").read_bytes() == V1
    with Ledger.open(bare / ".steptrail" / "ledger.db") as led:
        assert led.workspaces.ledger_moved("proj") is None
        assert led.workspaces.registration("proj").ledger_dir == str(bare / ".steptrail")
    assert tree(project) == original


# --- status -------------------------------------------------------------------------------


def test_status_in_the_copy_shows_it_needs_attention(project: Path, tmp_path: Path) -> None:
    copy = copy_of(project, tmp_path / "proj2")
    error = refused(run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2)))
    doc = cli(copy, "status", "--json")
    assert doc.code == 0, doc
    [ws] = doc.json["workspaces"]
    assert ws["attention"] == [{"type": "LedgerMoved", "case": "copied",
                                "message": error["message"], "next": error["command"]}]
    assert ws["next"][0] == error["command"] and doc.json["next"][0] == error["command"]
    shown = cli(copy, "status")
    assert shown.code == 0
    assert f"  ATTENTION LedgerMoved: {error['message']}" in shown.out.splitlines()
    assert f"  next: {error['command']}" in shown.out.splitlines()
    # the original needs nothing
    assert cli(project, "status", "--json").json["workspaces"][0]["attention"] == []
    assert run_command(copy, error["command"]).code == 0
    assert cli(copy, "status", "--json").json["workspaces"][0]["attention"] == []


# --- MCP ----------------------------------------------------------------------------------


def test_the_mcp_server_in_the_copy_refuses_with_the_same_line(project: Path,
                                                                tmp_path: Path) -> None:
    copy = copy_of(project, tmp_path / "proj2")
    original = tree(project)
    error = refused(run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2)))
    ledger_file = str(copy / ".steptrail" / "ledger.db")
    # `steptrail mcp --workspace .` in the copy, and by the workspace's name
    with pytest.raises(LedgerError) as by_dir:
        make_server([str(copy)])
    assert type(by_dir.value).__name__ == "LedgerMoved"
    assert said_at_a_shell(by_dir.value) == error["message"]  # (its operator's words)
    with pytest.raises(LedgerError) as by_name:
        make_server(["proj"], ledger_file)
    assert said_at_a_shell(by_name.value) == error["message"]
    cmd = run_cli(["--ledger", ledger_file, "mcp", "--workspace", "proj"])
    assert cmd.code == 2 and cmd.err == f"steptrail: error: LedgerMoved: {error['message']}\n"

    # a client whose root is the copy (no --workspace): each tool call says it
    async def roots(_ctx: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=copy.as_uri())])

    async def go() -> None:
        server = SteptrailServer(None, roots=ClientRoots())
        try:
            async with Client(server, list_roots_callback=roots) as client:
                r = await client.call_tool("write_file", {"path": "app.py", "content": "x\n"})
                assert r.is_error and error["message"] in text(r)
                r = await client.call_tool("read_text_file", {"path": "app.py"})
                assert r.is_error and error["message"] in text(r)
        finally:
            server.close()

    anyio.run(go)
    assert tree(project) == original and (copy / "app.py").read_bytes() == V1
    with Ledger.open(ledger_file, readonly=True) as led:  # nothing was registered
        assert [w.name for w in led.workspaces.list()] == ["proj"]

    assert run_command(copy, error["command"]).code == 0
    assert cli(copy, "--workspace", "proj", "lease", "release", "--epoch", "1").code == 0

    async def after() -> None:
        async with inprocess([str(copy)]) as agent:
            read = await agent.ok("read_text_file", path="app.py")
            assert read["content"] == V1.decode()
            wrote = await agent.ok("write_file", path="app.py", content=V2.decode())
            assert wrote["workspace"] == "proj"

    anyio.run(after)
    assert (copy / "app.py").read_bytes() == V2 and tree(project) == original


# --- no false alarms, and no blessing -----------------------------------------------------


def test_the_same_project_by_another_path_or_a_renamed_ledger_directory_is_fine(
        project: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(project)
    assert run_step(link, step_plan(tmp_path / "plans", "s2", V1, 1, V2)).code == 0
    assert (project / "app.py").read_bytes() == V2
    # the ledger's directory renamed inside the project: the root is where it was
    os.rename(project / ".steptrail", project / ".ledger")
    out = cli(project, "--ledger", ".ledger/ledger.db", "--workspace", "proj", "step", "run",
              str(step_plan(tmp_path / "plans", "s3", V2, 2, V0)), "--epoch", "1")
    assert out.code == 0, out
    assert (project / "app.py").read_bytes() == V0


def test_a_ledger_outside_a_copied_project_keeps_writing_its_workspace(tmp_path: Path) -> None:
    """A ledger that does not travel with its workspace (not inside it, not beside it)
    is not judged by where it is: copying the project changes nothing for it."""
    work = tmp_path / "work" / "proj"
    work.mkdir(parents=True)
    (work / "app.py").write_bytes(V0)
    db = tmp_path / "ledgers" / "main" / "ledger.db"
    with Ledger.init(db, parents=True) as led:
        led.workspaces.add("proj", work)
        led.workspaces.acquire("proj", "agent-1", 600)
    copy_of(work, tmp_path / "work" / "proj2")
    moved = tmp_path / "ledgers" / "other"
    os.rename(db.parent, moved)  # the ledger moved, the workspace did not
    with Ledger.open(moved / "ledger.db") as led:
        assert led.workspaces.ledger_moved("proj") is None
        out = run_fenced_step(led, "proj", "s1", lambda r: [r.read("app.py").write(V1)],
                              epoch=1)
        assert out.status.value == "applied"
    assert (work / "app.py").read_bytes() == V1


def test_a_steptrail_directory_beside_the_workspace_travels_with_it(tmp_path: Path) -> None:
    """`PROJECT/.steptrail` with a workspace on `PROJECT/src` (and `/srv/agent/.steptrail`
    beside `/srv/agent/repo`): a copy of the directory holding both carries both, and is
    refused. A bare `DIR/ledger.db` beside `DIR/repo` is not judged (documented)."""
    for layout in ("sibling", "bare-file"):
        top = tmp_path / layout / "proj"
        ws = top / "src" if layout == "sibling" else top / "repo"
        db = top / ".steptrail" / "ledger.db" if layout == "sibling" else top / "ledger.db"
        ws.mkdir(parents=True)
        (ws / "app.py").write_bytes(V0)
        with Ledger.init(db) as led:
            led.workspaces.add("w", ws)
            led.workspaces.acquire("w", "agent-1", 600)
        copy = copy_of(top, tmp_path / layout / "proj2")
        with Ledger.open(copy / db.relative_to(top)) as led:
            moved = led.workspaces.ledger_moved("w")
            if layout == "bare-file":
                assert moved is None
                continue
            with pytest.raises(LedgerError) as caught:
                run_fenced_step(led, "w", "s1", lambda r: [r.read("app.py").write(V1)],
                                epoch=1)
            assert type(caught.value).__name__ == "LedgerMoved"
            assert moved is not None and moved.new_root == str(copy / "src")
            assert moved.case == "copied"
        assert (ws / "app.py").read_bytes() == V0


def test_an_old_registration_is_not_checked_until_rebound_and_never_blessed(
        project: Path, tmp_path: Path) -> None:
    """A registration written before the ledger's place was recorded is not judged (there
    is nothing to judge it by); opening a copy never records one lazily — that would bless
    the copy —, and neither does adding the same directory again. `--rebind` records it."""
    with Ledger.open(project / ".steptrail" / "ledger.db") as led:
        reg = led.workspaces.registration("proj")
        led.append(WorkspaceAdded(workspace="old", root=str(tmp_path / "plans"),
                                  dev=reg.dev, ino=reg.ino))  # as an older steptrail did
        led.workspaces.add("old", tmp_path / "plans", rebind=True)  # a new identity: ok
    copy = copy_of(project, tmp_path / "proj2")
    with Ledger.open(copy / ".steptrail" / "ledger.db") as led:
        count = led.count()
        assert led.workspaces.add("proj", project).root == str(project)  # a no-op ...
        assert led.count() == count
        assert led.workspaces.ledger_moved("proj") is not None  # ... that blessed nothing
    decoded = decode(
        b'{"kind":"workspace-added","workspace":"w","root":"/srv/w","dev":1,"ino":2}', 2)
    assert isinstance(decoded, WorkspaceAdded) and decoded.ledger_dir is None


def test_gc_in_the_copy_leaves_the_originals_directory_alone(project: Path,
                                                             tmp_path: Path) -> None:
    """gc removes the temporaries killed applies left beside the files of steps in
    flight; in a copy those are judged by the copy's ledger, and the directory is the
    original's: it is left alone (the ledger's own collection runs as usual)."""
    assert cli(project, "--workspace", "proj", "lease", "acquire", "--holder", "agent-2",
               "--ttl", "30m", "--force").code == 0  # epoch 2: epoch 1 is dead
    plan = step_plan(tmp_path / "plans", "s9", V1, 1, V2)
    assert cli(project, "--workspace", "proj", "step", "plan", str(plan), "--epoch",
               "2").code == 0  # s9 in flight, its directory the root
    copy = copy_of(project, tmp_path / "proj2")
    stray = project / ".app.py.steptrail-1-00000000-00000000.tmp"
    stray.write_bytes(b"a temporary in the original's directory\n")
    original = tree(project)
    out = cli(copy, "gc", "--grace", "0s", "--force", "--json")
    assert out.code == 0, out
    assert tree(project) == original
    assert cli(project, "gc", "--grace", "0s", "--force").code == 0  # the original's own gc takes it
    assert not stray.exists()


def test_rebind_records_the_ledgers_new_place_and_is_then_a_no_op(project: Path,
                                                                  tmp_path: Path) -> None:
    copy = copy_of(project, tmp_path / "proj2")
    ledger_file = str(copy / ".steptrail" / "ledger.db")
    first = cli(copy, "--ledger", ledger_file, "workspace", "add", "proj", str(copy),
                "--rebind", "--json")
    assert first.code == 0 and first.json["rebound"] is True
    assert first.json["ledger_dir"] == str(copy / ".steptrail")
    again = cli(copy, "--ledger", ledger_file, "workspace", "add", "proj", str(copy),
                "--rebind", "--json")
    assert again.code == 0 and again.json["rebound"] is False
    with Ledger.open(ledger_file, readonly=True) as led:
        [*_, last] = led.read(kind="workspace-rebound")
        ev: Any = last.event
        st = os.stat(copy / ".steptrail")
        assert (ev.ledger_dir, ev.ledger_dev, ev.ledger_ino) == (
            str(copy / ".steptrail"), st.st_dev, st.st_ino)


def test_shutil_copytree_is_a_copy_too(project: Path, tmp_path: Path) -> None:
    """Not only `cp -a`: any copy (here Python's, as a CI cache restore would) is a new
    directory with a new inode at another path."""
    copy = Path(shutil.copytree(project, tmp_path / "cache" / "proj", symlinks=True))
    original = tree(project)
    error = refused(run_step(copy, step_plan(tmp_path / "plans", "s2", V1, 1, V2)))
    assert error["case"] == "copied" and tree(project) == original


def test_a_witnessed_copy_is_told_to_take_its_own_witness_first(tmp_path: Path) -> None:
    """A copy names the original's witness: its first commit would reach it and the
    original would fail its witness check. The line says to anchor a new one first;
    done in that order, both ledgers open and verify."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "app.py").write_bytes(V0)
    witness = tmp_path / "w1"
    assert cli(proj, "--witness", str(witness), "init").code == 0
    assert cli(proj, "workspace", "add", "proj", ".").code == 0
    copy = copy_of(proj, tmp_path / "proj2")
    out = cli(copy, "--workspace", "proj", "workspace", "read", "app.py", "--json")
    error = refused(out)
    assert f"witness anchor --witness /ANOTHER/PATH'; it shares {witness}" in error["message"]
    assert cli(copy, "witness", "anchor", "--witness", str(tmp_path / "w2")).code == 0
    assert run_command(copy, error["command"]).code == 0
    for where in (proj, copy):
        checked = cli(where, "verify")
        assert checked.code == 0, checked


def test_an_immutable_open_of_a_database_is_refused_by_name() -> None:
    """`immutable` reads a SQLite file; for a database it is refused before anything is
    opened, naming the location (it raised TypeError: `Location.shown` is a property
    that was called)."""
    from ledger import InvalidInput, Ledger

    with pytest.raises(InvalidInput, match=r"postgresql://agent@db.invalid/x is a database"):
        Ledger.open("postgresql://agent@db.invalid/x", readonly=True, immutable=True)

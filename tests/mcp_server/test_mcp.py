"""`steptrail mcp` in-process, driven by the official MCP SDK's client.

A scripted agent session (read, edit, a person's edit, the conflict, a retry with the
same requestId, undo, history); the reference server's other tools; "read it first";
multi-file steps that land whole or not at all; moves; two servers on one workspace;
every path argument of every tool fed escapes; malformed arguments; and the schemas
`list_tools` shows. The processes (stdio, a SIGKILLed server, HTTP) are in
tests/mcp_server/test_mcp_processes.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_agents import ROOT, inprocess, repo, text

from ledger import Ledger
from ledger.mcp.leases import holder_is_dead, holder_name
from ledger.mcp.service import Limits

REFERENCE_TOOLS = {"read_text_file", "read_multiple_files", "write_file", "edit_file",
                   "create_directory", "list_directory", "list_directory_with_sizes",
                   "directory_tree", "move_file", "search_files", "get_file_info",
                   "list_allowed_directories"}
OURS = {"write_files", "delete_file", "history", "undo", "status", "audit"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


def verify_ok(repo: Path) -> None:
    with Ledger.open(repo / ".steptrail" / "ledger.db", readonly=True) as led:
        report = led.verify()
    assert report.ok, report.findings


def test_list_tools_schemas_describe_every_tool_and_argument(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            tools = (await agent.client.list_tools()).tools
            names = {t.name for t in tools}
            assert REFERENCE_TOOLS | OURS <= names, REFERENCE_TOOLS | OURS - names
            for t in tools:
                assert t.description and len(t.description) > 40, t.name
                props = t.input_schema.get("properties", {})
                for arg, schema in props.items():
                    described = schema.get("description") or any(
                        s.get("description") for s in schema.get("anyOf", []))
                    assert described, (t.name, arg, schema)
                assert t.annotations is not None
                assert t.annotations.read_only_hint == (
                    t.name in REFERENCE_TOOLS - {"write_file", "edit_file", "create_directory",
                                                 "move_file"} | {"history", "status", "audit"})
            write = next(t for t in tools if t.name == "write_file")
            assert set(write.input_schema["required"]) == {"path", "content"}
            assert {"expectedHash", "requestId"} <= set(write.input_schema["properties"])
            edit = next(t for t in tools if t.name == "edit_file")
            assert "dryRun" in edit.input_schema["properties"]
    run(go)


def test_a_scripted_agent_session(repo: Path) -> None:
    """Read, edit, a person's edit under the agent, the conflict (nothing written, the
    person's edit kept, a diff against what the agent read), the retry answered from the
    ledger, a fresh read and edit, undo, history."""
    app = repo / "src" / "app.py"

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            read = await agent.ok("read_text_file", path="src/app.py")
            assert read["content"] == app.read_text() and read["hash"] == sha(app.read_bytes())
            edit = await agent.ok("edit_file", path="src/app.py", requestId="edit-1",
                                  edits=[{"oldText": 'print("v0")', "newText": 'print("v1")'}])
            assert edit["status"] == "applied" and not edit["replayed"]
            assert app.read_text() == 'def main():\n    print("v1")\n'
            step1 = edit["step"]

            app.write_text('def main():\n    print("person")\n')  # a person, meanwhile
            conflict = await agent.fails("edit_file", path="src/app.py", requestId="edit-2",
                                         edits=[{"oldText": 'print("v1")',
                                                 "newText": 'print("v2")'}])
            assert app.read_text() == 'def main():\n    print("person")\n'  # kept
            doc = conflict.structured_content
            assert doc["status"] == "conflict" and doc["reason"] == "pre_hash"
            [f] = doc["files"]
            assert f["current_hash"] == sha(app.read_bytes())
            assert '-    print("v1")' in f["diff"] and '+    print("person")' in f["diff"]
            assert "nothing was written" in text(conflict)

            again = await agent.fails("edit_file", path="src/app.py", requestId="edit-2",
                                      edits=[{"oldText": 'print("v1")',
                                              "newText": 'print("v2")'}])
            assert again.structured_content["replayed"] is True  # the same answer, again
            retry = await agent.ok("edit_file", path="src/app.py", requestId="edit-1",
                                   edits=[{"oldText": 'print("v0")', "newText": 'print("v1")'}])
            assert retry["replayed"] and retry["step"] == step1  # answered, not re-applied
            assert app.read_text() == 'def main():\n    print("person")\n'

            await agent.ok("read_text_file", path="src/app.py")
            fixed = await agent.ok("edit_file", path="src/app.py", requestId="edit-3",
                                   edits=[{"oldText": "person", "newText": "v3"}])
            assert app.read_text() == 'def main():\n    print("v3")\n'
            undone = await agent.ok("undo")  # this session's last change
            assert undone["step"] == fixed["step"]
            assert [x["outcome"] for x in undone["files"]] == ["restored"]
            assert app.read_text() == 'def main():\n    print("person")\n'

            hist = await agent.ok("history", path="src/app.py")
            outcomes = {s["step"]: s["outcome"] for s in hist["steps"]}
            assert outcomes[step1] == "committed"
            assert outcomes["mcp:repo:edit-2"] == "refused"
            assert outcomes[fixed["step"]] == "undone"
            assert all(s["who"].startswith("mcp:") for s in hist["steps"])
            await anyio.sleep(0.5)  # past the linger: no lease kept
            status = await agent.ok("status")
            assert status["workspaces"][0]["lease"]["live"] is False
            audit = await agent.ok("audit", limit=500, verify=True)
            assert audit["verify"]["ok"] is True
            assert audit["counts"]["rejected"] == 1
        verify_ok(repo)

    run(go)


def test_an_existing_file_never_read_is_read_first_not_overwritten(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            r = await agent.fails("write_file", path="README.txt", content="mine\n")
            assert r.structured_content["reason"] == "unread"
            assert "Read it first" in text(r)
            r = await agent.fails("edit_file", path="README.txt",
                                  edits=[{"oldText": "hello", "newText": "bye"}])
            assert r.structured_content["reason"] == "unread"
            r = await agent.fails("delete_file", path="README.txt")
            assert (repo / "README.txt").read_text() == "hello\n"
            # a new file needs no read; a file that appears meanwhile is a conflict
            await agent.ok("write_file", path="docs/new.md", content="# new\n")
            assert (repo / "docs" / "new.md").read_text() == "# new\n"
            # an explicit expectedHash replaces on purpose, and is fenced too
            stale = await agent.fails("write_file", path="README.txt", content="x",
                                      expectedHash=sha(b"not it"))
            assert stale.structured_content["reason"] == "pre_hash"
            await agent.ok("write_file", path="README.txt", content="mine\n",
                           expectedHash=sha(b"hello\n"))
            assert (repo / "README.txt").read_text() == "mine\n"
            bad = await agent.fails("write_file", path="README.txt", content="x",
                                    expectedHash="abc")
            assert "sha256" in text(bad)
        verify_ok(repo)

    run(go)


def test_a_write_after_its_own_write_needs_no_new_read(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            for i in range(3):
                await agent.ok("write_file", path="notes.txt", content=f"v{i}\n")
            assert (repo / "notes.txt").read_text() == "v2\n"
            await agent.ok("edit_file", path="notes.txt", edits=[{"oldText": "v2",
                                                                   "newText": "v3"}])
            dry = await agent.ok("edit_file", path="notes.txt", dryRun=True,
                                 edits=[{"oldText": "v3", "newText": "v4"}])
            assert dry["status"] == "dry-run" and "+v4" in dry["files"][0]["diff"]
            assert (repo / "notes.txt").read_text() == "v3\n"
    run(go)


def test_the_same_request_id_for_another_change_is_refused(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("write_file", path="a.txt", content="one", requestId="r-1")
            r = await agent.fails("write_file", path="a.txt", content="two", requestId="r-1")
            assert "already used for a different change" in text(r)
            r = await agent.fails("write_file", path="b.txt", content="one", requestId="r-1")
            assert (repo / "a.txt").read_text() == "one" and not (repo / "b.txt").exists()
            r = await agent.fails("write_file", path="c.txt", content="x", requestId="bad id!")
            assert "requestId" in text(r)
    run(go)


def test_a_multi_file_change_lands_whole_or_not_at_all(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_multiple_files", paths=["src/app.py", "README.txt"])
            (repo / "README.txt").write_text("a person was here\n")
            r = await agent.fails("write_files", files=[
                {"path": "src/app.py", "edits": [{"oldText": "v0", "newText": "v1"}]},
                {"path": "README.txt", "content": "agent\n"},
                {"path": "NEW.txt", "content": "new\n"}])
            assert [f["path"] for f in r.structured_content["files"]] == ["README.txt"]
            assert "v0" in (repo / "src" / "app.py").read_text()
            assert not (repo / "NEW.txt").exists()
            assert (repo / "README.txt").read_text() == "a person was here\n"
            await agent.ok("read_text_file", path="README.txt")
            done = await agent.ok("write_files", requestId="multi", files=[
                {"path": "src/app.py", "edits": [{"oldText": "v0", "newText": "v1"}]},
                {"path": "README.txt", "delete": True},
                {"path": "NEW.txt", "content": "new\n"}])
            assert {f["change"] for f in done["files"]} == {"modified", "deleted", "created"}
            assert not (repo / "README.txt").exists() and (repo / "NEW.txt").exists()
            await agent.ok("undo", step="multi")  # by requestId: all three back
            assert (repo / "README.txt").read_text() == "a person was here\n"
            assert not (repo / "NEW.txt").exists() and "v0" in (repo / "src/app.py").read_text()
        verify_ok(repo)

    run(go)


def test_a_move_after_a_persons_edit_is_a_conflict(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            (repo / "src/app.py").write_text("the person's edit\n")
            r = await agent.fails("move_file", source="src/app.py", destination="lib/app.py")
            assert text(r).startswith("Conflict")
            assert (repo / "src/app.py").read_text() == "the person's edit\n"
            assert not (repo / "lib/app.py").exists()
        verify_ok(repo)

    run(go)


def test_move_file_is_one_fenced_undoable_step(repo: Path) -> None:
    (repo / "src" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "src" / "run.sh").chmod(0o755)
    (repo / "src" / "empty").mkdir()

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            # fenced like delete_file: a file this session never read does not move
            r = await agent.fails("move_file", source="src/app.py", destination="lib/app.py")
            assert "Read it first" in text(r) and (repo / "src/app.py").exists()
            await agent.ok("read_text_file", path="src/app.py")
            moved = await agent.ok("move_file", source="src/app.py", destination="lib/app.py")
            assert not (repo / "src/app.py").exists() and "v0" in (repo / "lib/app.py").read_text()
            await agent.ok("undo", step=moved["step"])
            assert "v0" in (repo / "src/app.py").read_text() and not (repo / "lib/app.py").exists()
            r = await agent.fails("move_file", source="src/app.py", destination="README.txt")
            assert "already exists" in text(r)
            r = await agent.fails("move_file", source="src", destination="pkg")
            assert "never read" in text(r) or "Read it first" in text(r)
            await agent.ok("read_multiple_files", paths=["src/app.py", "src/run.sh"])
            tree = await agent.ok("move_file", source="src", destination="pkg")
            assert not (repo / "src").exists()
            assert (repo / "pkg" / "app.py").exists() and (repo / "pkg" / "empty").is_dir()
            assert (repo / "pkg" / "run.sh").stat().st_mode & 0o111  # its bits came along
            await agent.ok("undo", step=tree["step"])
            assert (repo / "src" / "app.py").exists() and not (repo / "pkg" / "app.py").exists()
            r = await agent.fails("move_file", source="src", destination="src/inner")
            assert "into itself" in text(r)
            await agent.ok("create_directory", path="a/b/c")
            assert (repo / "a" / "b" / "c").is_dir()
            await agent.ok("create_directory", path="a/b/c")  # exists: fine
        verify_ok(repo)

    run(go)


def test_undo_of_a_move_whose_old_name_a_person_reused_removes_nothing(repo: Path) -> None:
    """Issue 36, defect 4: the undo of a move whose source name a person reused since
    would delete the destination and leave the moved content at no visible path; it is
    all-or-nothing: neither path is touched, and the answer says so."""
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            moved = await agent.ok("move_file", source="src/app.py", destination="lib/app.py")
            (repo / "src" / "app.py").write_text("the person's new app.py\n")
            r = await agent.call("undo", step=moved["step"])
            assert "NOT undone" in text(r), text(r)
            assert (repo / "src/app.py").read_text() == "the person's new app.py\n"
            assert "v0" in (repo / "lib/app.py").read_text()  # the moved content stays
        verify_ok(repo)

    run(go)


def test_listings_hide_the_ledger_and_git_and_never_follow_symlinks(
        repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[core]\n")
    (repo / "link").symlink_to(outside)
    (repo / "secret-link.txt").symlink_to(outside / "secret.txt")

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("write_file", path="x.txt", content="x")  # the ledger exists now
            listing = await agent.ok("list_directory", path=".")
            names = {e["name"]: e["type"] for e in listing["entries"]}
            assert ".steptrail" not in names and ".git" not in names
            assert names["link"] == "symlink" and names["secret-link.txt"] == "symlink"
            tree = await agent.call("directory_tree", path=".")
            assert "secret.txt" not in text(tree) and "ledger.db" not in text(tree)
            found = await agent.ok("search_files", path=".", pattern="*secret*")
            assert [m["path"] for m in found["matches"]] == ["secret-link.txt"]
            found = await agent.ok("search_files", path=".", pattern="**/*.db")
            assert found["matches"] == []
            sized = await agent.ok("list_directory_with_sizes", path="src", sortBy="size")
            assert sized["entries"][0]["name"] == "app.py"
            info = await agent.ok("get_file_info", path="src/app.py")
            assert info["hash"] == sha((repo / "src" / "app.py").read_bytes())
            allowed = await agent.ok("list_allowed_directories")
            assert allowed["directories"][0]["path"] == str(repo.resolve())
    run(go)


def test_a_huge_tree_is_cut_short_not_walked_whole(repo: Path) -> None:
    big = repo / "big"
    for d in range(30):
        (big / f"d{d:02}").mkdir(parents=True)
        for f in range(40):
            (big / f"d{d:02}" / f"f{f:02}.txt").write_bytes(b"")
    deep = repo / "deep"
    deep.mkdir()
    p = deep
    for i in range(30):
        p = p / f"l{i}"
    p.mkdir(parents=True)
    limits = Limits(tree_entries=100, scan_entries=500, search_results=20, list_entries=10)

    async def go() -> None:
        async with inprocess([str(repo)], limits=limits) as agent:
            tree = await agent.ok("directory_tree", path="big")
            assert tree["truncated"] is True and "truncated" in text(await agent.call(
                "directory_tree", path="big"))
            found = await agent.ok("search_files", path=".", pattern="*.txt")
            assert found["truncated"] is True and len(found["matches"]) <= 20
            listing = await agent.ok("list_directory", path="big")
            assert listing["truncated"] is True and len(listing["entries"]) == 10
            shallow = await agent.ok("directory_tree", path="deep", maxDepth=3)
            assert shallow["truncated"] is True
    run(go)


def test_agent_written_patterns_and_sizes_stay_bounded(repo: Path) -> None:
    """A pattern built to backtrack, an oversized file, too many edits: each answers at
    once with a result or one line."""
    (repo / ("a" * 200)).mkdir()
    (repo / ("a" * 200) / ("a" * 240 + ".txt")).write_text("x")
    (repo / "huge.txt").write_bytes(b"x" * 5000)
    evil = "*a" * 30 + "b/" + "**/" * 40 + "*a" * 30 + "b"

    async def go() -> None:
        async with inprocess([str(repo)], limits=Limits(read_bytes=4096)) as agent:
            started = time.monotonic()
            found = await agent.ok("search_files", path=".", pattern=evil,
                                   excludePatterns=["*a" * 30 + "b"])
            tree = await agent.ok("directory_tree", path=".", excludePatterns=[evil])
            assert time.monotonic() - started < 5
            assert found["matches"] == [] and tree["truncated"] is False
            r = await agent.fails("read_text_file", path="huge.txt")
            assert "5000 bytes" in text(r) and "\n" not in text(r)
            await agent.ok("read_text_file", path="README.txt")
            r = await agent.fails("edit_file", path="README.txt",
                                  edits=[{"oldText": "h", "newText": "H"}] * 1001)
            assert "at most 1000" in text(r)
    run(go)


def test_two_servers_on_one_workspace(repo: Path) -> None:
    """Two clients, each with its own server (its own ledger connection and view), as
    two spawned processes would be: non-overlapping edits both land; overlapping ones
    give the later a conflict; neither holds a lease between calls."""
    async def go() -> None:
        async with inprocess([str(repo)]) as a, inprocess([str(repo)]) as b:
            await a.ok("read_text_file", path="src/app.py")
            await b.ok("read_text_file", path="src/app.py")
            await b.ok("read_text_file", path="README.txt")
            await a.ok("write_file", path="a.txt", content="from a\n")
            await b.ok("edit_file", path="README.txt", edits=[{"oldText": "hello",
                                                                "newText": "hello b"}])
            first = await a.ok("edit_file", path="src/app.py",
                               edits=[{"oldText": "v0", "newText": "A"}])
            later = await b.fails("edit_file", path="src/app.py",
                                  edits=[{"oldText": "v0", "newText": "B"}])
            assert first["status"] == "applied"
            assert later.structured_content["reason"] in ("pre_hash", "stale_rev")
            assert '+    print("A")' in later.structured_content["files"][0]["diff"]
            assert 'print("A")' in (repo / "src" / "app.py").read_text()
            assert (repo / "README.txt").read_text() == "hello b\n"
            assert (repo / "a.txt").read_text() == "from a\n"
            # b re-reads and goes on; a's lease is long gone
            await b.ok("read_text_file", path="src/app.py")
            await b.ok("edit_file", path="src/app.py", edits=[{"oldText": "A", "newText": "B"}])
            await anyio.sleep(0.5)
            status = await a.ok("status")
            assert status["workspaces"][0]["lease"]["live"] is False
        verify_ok(repo)

    run(go)


#: Every path argument of every tool: (tool, the argument's name, the other arguments).
PATH_ARGUMENTS: list[tuple[str, str, dict[str, Any]]] = [
    ("read_text_file", "path", {}),
    ("read_multiple_files", "paths", {}),
    ("write_file", "path", {"content": "pwned\n"}),
    ("edit_file", "path", {"edits": [{"oldText": "TOP", "newText": "pwned"}]}),
    ("write_files", "files", {}),
    ("delete_file", "path", {}),
    ("create_directory", "path", {}),
    ("list_directory", "path", {}),
    ("list_directory_with_sizes", "path", {}),
    ("directory_tree", "path", {}),
    ("move_file", "source", {"destination": "stolen.txt"}),
    ("move_file", "destination", {"source": "README.txt"}),
    ("search_files", "path", {"pattern": "*"}),
    ("get_file_info", "path", {}),
    ("history", "path", {}),
]


def escapes(repo: Path, outside: Path) -> list[str]:
    return [
        "../outside/secret.txt", "src/../../outside/secret.txt", "..",
        str(outside / "secret.txt"), str(outside), "/etc/passwd", "/",
        f"{repo}/../outside/secret.txt",
        "link/secret.txt", "link", "secret-link.txt",  # symlinks out
        ".steptrail/ledger.db", ".steptrail", ".steptrail/blobs", ".STEPTRAIL/ledger.db",
        ".git/config", ".git", ".GIT/hooks/pre-commit", "src/.git/config",
        "~/.ssh/id_rsa", "src/app.py\x00.txt", "src\\..\\..\\outside",
    ]


def test_path_escapes_through_every_tool_argument(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[core]\n")
    (repo / "link").symlink_to(outside)
    (repo / "secret-link.txt").symlink_to(outside / "secret.txt")

    def snapshot() -> dict[str, bytes]:
        out = {}
        for base in (outside, repo):
            for p in sorted(base.rglob("*")):
                if ".steptrail" in p.parts or p.is_symlink() or not p.is_file():
                    continue
                out[str(p)] = p.read_bytes()
        return out

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            before = snapshot()
            dirs_before = sorted(str(p) for p in tmp_path.rglob("*") if p.is_dir()
                                 and ".steptrail" not in p.parts)
            tried = 0
            for tool, arg, others in PATH_ARGUMENTS:
                for bad in escapes(repo, outside):
                    args = dict(others)
                    if arg == "paths":
                        args[arg] = [bad]
                    elif arg == "files":
                        args[arg] = [{"path": bad, "content": "pwned\n"}]
                    else:
                        args[arg] = bad
                    r = await agent.call(tool, **args)
                    out = text(r)
                    tried += 1
                    assert "TOP SECRET" not in out and "Traceback" not in out, (tool, bad, out)
                    if tool == "read_multiple_files":  # per-file errors, not the call's
                        [f] = r.structured_content["files"]
                        assert "error" in f and "\n" not in f["error"], (bad, f)
                        continue
                    if not r.is_error and tool == "history":  # reads the ledger only
                        assert r.structured_content["steps"] == [], (bad, out)
                        continue
                    if not r.is_error and tool == "get_file_info":  # the link itself
                        assert r.structured_content["type"] == "symlink", (bad, out)
                        assert "hash" not in r.structured_content
                        continue
                    assert r.is_error, (tool, arg, bad, out)
                    assert "\n" not in out, (tool, bad, out)
            assert tried > 300
            assert snapshot() == before
            assert sorted(str(p) for p in tmp_path.rglob("*") if p.is_dir()
                          and ".steptrail" not in p.parts) == dirs_before
        verify_ok(repo)

    run(go)


def test_malformed_arguments_are_one_line_errors(repo: Path) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("write_file", {"path": "a.txt"}, "content"),
        ("write_file", {"content": "x"}, "path"),
        ("write_file", {"path": 5, "content": "x"}, "path"),
        ("write_file", {"path": "a.txt", "content": ["x"]}, "content"),
        ("write_file", {"path": "a.txt", "content": "x", "expected_hash": "y"}, "expected_hash"),
        ("edit_file", {"path": "README.txt", "edits": "replace hello"}, "edits"),
        ("edit_file", {"path": "README.txt", "edits": [{"old": "a", "new": "b"}]}, "edits"),
        ("edit_file", {"path": "README.txt", "edits": [{"oldText": "", "newText": "b"}]}, "oldText"),
        ("read_text_file", {"path": "README.txt", "head": -1}, "head"),
        ("read_text_file", {"path": "README.txt", "head": "ten"}, "head"),
        ("read_text_file", {"path": "README.txt", "head": 1, "tail": 1}, "head or tail"),
        ("read_text_file", {"path": ""}, "root"),
        ("read_text_file", {"path": "src"}, ""),
        ("read_text_file", {"path": "no-such-file"}, "does not exist"),
        ("read_multiple_files", {"paths": []}, "at least one"),
        ("write_files", {"files": []}, "at least one"),
        ("write_files", {"files": [{"path": "a", "content": "x", "delete": True}]}, "exactly one"),
        ("write_files", {"files": [{"path": "a", "content": "x"}, {"path": "a", "content": "y"}]},
         "twice"),
        ("directory_tree", {"path": ".", "maxDepth": 0}, "maxDepth"),
        ("list_directory_with_sizes", {"path": ".", "sortBy": "colour"}, "sortBy"),
        ("search_files", {"path": ".", "pattern": ""}, "pattern"),
        ("history", {"limit": 0}, "limit"),
        ("undo", {"step": "no-such-step"}, "no step"),
        ("undo", {}, "no committed change"),
        ("no_such_tool", {}, "no_such_tool"),
        ("move_file", {"source": "no-such", "destination": "x"}, "does not exist"),
        ("delete_file", {"path": "no-such"}, "does not exist"),
    ]

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            for tool, args, mentions in cases:
                r = await agent.call(tool, **args)
                out = text(r)
                assert r.is_error, (tool, args, out)
                assert "\n" not in out and "Traceback" not in out, (tool, args, out)
                assert mentions in out, (tool, args, out)
            assert (repo / "README.txt").read_text() == "hello\n"
    run(go)


def test_a_binary_file_is_not_read_as_text(repo: Path) -> None:
    (repo / "blob.bin").write_bytes(b"\x00\xff\xfe")

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            r = await agent.fails("read_text_file", path="blob.bin")
            assert "not UTF-8" in text(r)
    run(go)


def test_absolute_paths_inside_a_workspace_and_a_second_workspace(
        repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "o.txt").write_text("other\n")

    async def go() -> None:
        async with inprocess([str(repo), str(other)]) as agent:
            r = await agent.ok("read_text_file", path=str(repo / "src" / "app.py"))
            assert r["path"] == "src/app.py"
            r = await agent.ok("read_text_file", path=str(other / "o.txt"))
            assert r["path"] == str(other.resolve() / "o.txt")
            await agent.ok("write_file", path=str(other / "o.txt"), content="changed\n")
            assert (other / "o.txt").read_text() == "changed\n"
            bad = await agent.fails("write_files", files=[
                {"path": "x.txt", "content": "x"}, {"path": str(other / "y.txt"), "content": "y"}])
            assert "one workspace" in text(bad)
            allowed = await agent.ok("list_allowed_directories")
            assert [d["workspace"] for d in allowed["directories"]] == ["repo", "other"]
    run(go)


def test_undo_never_clobbers_a_later_edit(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            w = await agent.ok("write_file", path="README.txt", content="agent\n")
            (repo / "README.txt").write_text("person after the agent\n")
            r = await agent.fails("undo", step=w["step"])
            assert r.structured_content["files"][0]["outcome"] == "conflict"
            # nothing was put back: not reported as undone, now or when asked again
            assert r.structured_content["status"] == "not-undone"
            assert text(r).startswith("NOT undone")
            assert (repo / "README.txt").read_text() == "person after the agent\n"
            again = await agent.call("undo", step=w["step"])
            assert again.is_error and text(again).startswith("NOT undone earlier")
            hist = await agent.call("history", path="README.txt")
            assert hist.structured_content["steps"][0]["outcome"] == "not undone"
        verify_ok(repo)
    run(go)


def test_holder_names_tell_a_dead_local_process() -> None:
    me = holder_name()
    assert not holder_is_dead(me)
    assert not holder_is_dead("agent-1")  # not ours: never judged dead
    assert not holder_is_dead(me.replace("@", "@elsewhere-"))
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host = me.split("@", 1)[1].split(":", 1)[0]
    assert holder_is_dead(f"steptrail-mcp@{host}:{proc.pid}:1")


def test_the_core_never_imports_the_integration() -> None:
    """The runtime core works without the extra: importing the library, the CLI and
    running a command load neither ledger.mcp nor the SDK."""
    code = ("import sys, ledger, ledger.cli, ledger.runner, ledger.gc\n"
            "from click.testing import CliRunner\n"
            "CliRunner().invoke(ledger.cli.cli, ['--help'])\n"
            "bad = sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'ledger.mcp')))\n"
            "print(json.dumps(bad))\n")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True,
                         text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == []


def test_without_the_sdk_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['mcp'] = None\n"
            "from ledger.cli import main\n"
            f"sys.argv = ['steptrail', 'mcp', '--workspace', {str(tmp_path)!r}]\n"
            "main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={k: v for k, v in os.environ.items()
                                        if not k.startswith("STEPTRAIL_")})
    assert out.returncode == 2, out
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "steptrail: error: MissingExtra: "), out.stderr
    assert "pip install" in out.stderr and "[mcp]'" in out.stderr  # (as installed: issue 37)
    assert not (tmp_path / ".steptrail").exists()  # nothing written


def test_the_envelope_is_found_in_a_request_too_broken_or_long_to_parse() -> None:
    """What `steptrail mcp` recovers of a request it cannot parse (the id to answer, and
    whether it is a tool call): read token by token, never recursing, from a prefix."""
    from ledger.mcp.server import _MISSING, _envelope, _too_large

    head = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write_file",'
    assert _envelope(head + b'"arguments":{"x":' + b"[" * 200_000) == (7, "tools/call",
                                                                       "write_file")
    # strings holding quotes, braces and keys' names; the id after the params
    assert _envelope(b'{"params":{"arguments":{"id":"\\"}{[,:","name":1},"name":"w"},'
                     b'"method":"tools/call","jsonrpc":"2.0","id":"r-1"}') == (
        "r-1", "tools/call", "w")
    assert _envelope(b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}') == (
        _MISSING, "ping", _MISSING)  # an id no parser reads: the null id
    assert _envelope(b'[{"id":1,"method":"ping"}]') == (_MISSING, _MISSING, _MISSING)
    assert _envelope(b"hello") == (_MISSING, _MISSING, _MISSING)

    call, rid, why = _too_large(head + b'"arguments":{"content":"xxx', 100, {})
    assert rid == 7 and call is not None and why in call.decode()
    call, rid, why = _too_large(b'{"jsonrpc":"2.0","id":8,"method":"tools/list","params":'
                                b'{"cursor":"xxxx', 100, {})
    assert (call, rid) == (None, 8) and why.startswith("Invalid Request: the request is")
    call, rid, _why = _too_large(b'{"jsonrpc":"2.0","params":{"x":"' + b"x" * 90, 100, {})
    assert (call, rid) == (None, None)


def test_observe_records_a_persons_edits_as_this_clients_request_and_undo_takes_them_back(
        repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            first = await agent.ok("observe", label="start")
            [ws] = first["workspaces"]
            assert ws["baseline"] and {c["path"] for c in ws["changes"]} == {
                "src/app.py", "README.txt"}
            quiet = await agent.ok("observe")
            assert quiet["workspaces"][0]["recorded"] is False  # nothing changed

            (repo / "README.txt").write_text("a person's words\n")  # by hand, not a tool call
            (repo / "extra.txt").write_text("new\n")
            got = await agent.call("observe", label="between calls")
            assert not got.is_error, text(got)
            assert "M README.txt" in text(got) and "A extra.txt" in text(got)
            [ws] = got.structured_content["workspaces"]
            [step] = ws["steps"]
            hist = await agent.ok("history", path="README.txt")
            mine = [s for s in hist["steps"] if s["step"] == step]
            assert mine and mine[0]["outcome"] == "committed"
            undone = await agent.ok("undo", step=step)
            assert sorted(f["outcome"] for f in undone["files"]) == ["restored", "restored"]
            assert (repo / "README.txt").read_text() == "hello\n"
            assert not (repo / "extra.txt").exists()
        with Ledger.open(repo / ".steptrail" / "ledger.db") as led:
            [obs] = [e.event for e in led.read(step=step, kind="observed")]
            assert obs.by.startswith("mcp:") and obs.label == "between calls"
        verify_ok(repo)

    run(go)


def test_a_server_that_observes_at_each_lease_records_a_persons_edit_before_its_write(
        repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)], observe_on_lease=True, lease_linger_s=0.0) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            await agent.ok("write_file", path="new.txt", content="agent\n")
            (repo / "README.txt").write_text("a person's edit\n")  # between two calls
            await agent.ok("write_file", path="new2.txt", content="agent\n")
            hist = await agent.ok("history", path="README.txt")
            assert any(s["step"].startswith("observed-") for s in hist["steps"])
            status = await agent.ok("status")
            assert any("outside the steps" in n for n in status.get("notices", []))
        with Ledger.open(repo / ".steptrail" / "ledger.db") as led:
            observed = [e.event for e in led.read(kind="observed")]
            assert [o.by for o in observed] == [
                observed[0].by, observed[0].by] and observed[0].by.startswith("lease:")
            assert led.workspaces.paths("repo")["README.txt"][1] == sha(b"a person's edit\n")
        verify_ok(repo)

    run(go)


def test_rewind_previews_then_rewinds_and_fork_copies_a_step_out(repo: Path,
                                                                 tmp_path: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("observe")  # the baseline
            await agent.ok("read_text_file", path="README.txt")
            first = await agent.ok("write_file", path="README.txt", content="one\n")
            await agent.ok("read_text_file", path="README.txt")
            await agent.ok("write_file", path="README.txt", content="two\n")
            preview = await agent.ok("rewind", to=first["step"])
            assert preview["preview"] and preview["changes"][0]["kind"] == "restore"
            assert "+one" in preview["changes"][0]["diff"]
            assert (repo / "README.txt").read_text() == "two\n"  # nothing written
            (repo / "README.txt").write_text("a person's\n")  # unobserved
            refused = await agent.call("rewind", to=first["step"], preview=False)
            assert refused.is_error and "observe" in text(refused)
            assert (repo / "README.txt").read_text() == "a person's\n"
            await agent.ok("observe")
            done = await agent.ok("rewind", to=first["step"], preview=False)
            assert done["verdict"] == "applied"
            assert (repo / "README.txt").read_text() == "one\n"
            fork = await agent.ok("fork", at=first["step"], to=str(tmp_path / "fork"))
            assert (tmp_path / "fork" / "README.txt").read_text() == "one\n"
            assert fork["workspace"] == "fork"
            bad = await agent.call("fork", at=first["step"], to="relative/dir")
            assert bad.is_error and "absolute path" in text(bad)
        verify_ok(repo)

    run(go)


def test_rewind_where_a_file_and_a_directory_traded_places_is_two_steps(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("observe")
            first = await agent.ok("write_file", path="cfg", content="a file\n")
            await agent.ok("move_file", source="cfg", destination="cfg.old")
            await agent.ok("write_file", path="cfg/local.toml", content="in a dir\n")
            preview = await agent.ok("rewind", to=first["step"])
            assert preview["clears"] == ["cfg/local.toml"] and not preview["unreachable"]
            done = await agent.ok("rewind", to=first["step"], preview=False)
            assert done["verdict"] == "applied" and done["cleared"]
            assert (repo / "cfg").read_text() == "a file\n"
            assert not (repo / "cfg.old").exists()
        verify_ok(repo)

    run(go)

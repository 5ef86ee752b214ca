"""A red-team pass over `steptrail mcp` (issue 15): attacks from a hostile agent, a
person with a shell, a second server, a SIGKILL, a malformed client and the network.

Every test asserts the SAFE behaviour. A hole found is marked
``xfail(strict=True, reason=...)``: the test fails while the hole is there and turns
the suite red (XPASS) once it is fixed, so the mark is dropped with the fix. The tests
without the mark are attacks the server refuses today; they stay as regressions.

Driven like tests/mcp_server/test_mcp.py (in-process, `mcp_agents.inprocess`) and
tests/mcp_server/test_mcp_processes.py (the installed command over stdio, `over_stdio`; HTTP).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mcp_agents import (
    Agent,
    inprocess,
    killed_write,
    over_stdio,
    repo,
    server_env,
    steptrail_command,
    text,
)

from ledger import Ledger


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


def ledger_of(repo: Path) -> Path:
    return repo / ".steptrail" / "ledger.db"


def slot_files(ledger_path: Path, workspace: str) -> tuple[str, str]:
    """The lock and wait files `steptrail mcp` queues on beside the ledger."""
    base = f"{ledger_path}-mcp-{hashlib.sha256(workspace.encode()).hexdigest()[:12]}"
    return base + ".lock", base + ".wait"


def verify_ok(ledger_path: Path) -> None:
    with Ledger.open(ledger_path, readonly=True) as led:
        report = led.verify()
    assert report.ok, report.findings


def tree(base: Path) -> dict[str, bytes | str]:
    """Everything below `base` (the ledger's directory left out): file bytes, symlink
    targets, directories, so a test can tell that nothing changed."""
    out: dict[str, bytes | str] = {}
    for p in sorted(base.rglob("*")):
        rel = str(p.relative_to(base))
        if ".steptrail" in p.parts:
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


def one_line_error(r: Any) -> str:
    out = text(r)
    assert r.is_error, out
    assert "\n" not in out and "Traceback" not in out, out
    return out


#: A server process, run as `python -c KILLER`, that SIGKILLs itself at its Nth exchange
#: of a staged file with its target (`placing.land`, a write's or an undo's):
#: between two files of one multi-file change, a real kill, not an exception.
KILLER = """
import importlib, os, sys
module, _, attr = os.environ.get("KILL_TARGET", "ledger.workspace.placing:land").partition(":")
*owners, name = attr.split(".")
owner = importlib.import_module(module)
for o in owners:
    owner = getattr(owner, o)
orig = getattr(owner, name)
count = [0]
def patched(*args, **kwargs):
    count[0] += 1
    if count[0] == int(os.environ["KILL_AT_INSTALL"]):
        os.kill(os.getpid(), 9)
    return orig(*args, **kwargs)
setattr(owner, name, patched)
from ledger.cli import main
sys.argv = ["steptrail", "mcp", "--workspace", os.environ["KILL_WS"]]
main()
"""


@contextlib.asynccontextmanager
async def killer_agent(repo: Path, kill_at_install: int,
                       target: str = "ledger.workspace.placing:land") -> Any:
    params = StdioServerParameters(command=sys.executable, args=["-X", "utf8", "-c", KILLER],
                                   env=server_env(KILL_AT_INSTALL=str(kill_at_install),
                                                  KILL_WS=str(repo), KILL_TARGET=target))
    async with Client(params, read_timeout_seconds=20) as client:
        yield Agent(client)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(repo: Path, host: str, port: int) -> Any:
    proc = subprocess.Popen([steptrail_command(), "mcp", "--workspace", str(repo), "--http",
                             "--host", host, "--port", str(port)], env=server_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
                break
            assert proc.poll() is None, "the HTTP server exited"
            assert time.monotonic() < deadline, "the HTTP server did not come up"
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def http_initialize(host: str, port: int, host_header: str, origin: str | None) -> int:
    """POST an MCP initialize with the given Host and Origin headers; the status."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "rebinding-page", "version": "1"}}})
    headers = {"Host": host_header, "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    if origin is not None:
        headers["Origin"] = origin
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/mcp", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# =====================================================================================
# (a) a hostile agent: path escapes, symlinks, the ledger's own files, bounds
# =====================================================================================


def test_symlinks_planted_between_the_read_and_the_write_are_never_followed(
        repo: Path, tmp_path: Path) -> None:
    """The agent reads; a person (or a process the agent ran) swaps a directory on the
    way, or the file itself, for a symlink out of the workspace holding the very bytes
    the agent read (so no fence on content can tell). Every write tool refuses; nothing
    outside changes; the symlinks are left as they are."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.py").write_bytes((repo / "src" / "app.py").read_bytes())
    (outside / "README.txt").write_bytes((repo / "README.txt").read_bytes())
    before = tree(outside)

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            await agent.ok("read_text_file", path="README.txt")
            os.rename(repo / "src", repo / "src.real")
            (repo / "src").symlink_to(outside)  # a directory on the way
            os.rename(repo / "README.txt", repo / "README.real")
            (repo / "README.txt").symlink_to(outside / "README.txt")  # the file itself
            (repo / "newdir").symlink_to(outside)  # a new file's parent
            attempts = [
                ("write_file", {"path": "src/app.py", "content": "pwned\n"}),
                ("edit_file", {"path": "src/app.py",
                               "edits": [{"oldText": "v0", "newText": "pwned"}]}),
                ("delete_file", {"path": "src/app.py"}),
                ("write_files", {"files": [{"path": "src/app.py", "content": "pwned\n"}]}),
                ("write_file", {"path": "README.txt", "content": "pwned\n"}),
                ("edit_file", {"path": "README.txt",
                               "edits": [{"oldText": "hello", "newText": "pwned"}]}),
                ("delete_file", {"path": "README.txt"}),
                ("write_file", {"path": "README.txt", "content": "pwned\n",
                                "expectedHash": sha(b"hello\n")}),
                ("write_file", {"path": "newdir/planted.txt", "content": "pwned\n"}),
                ("move_file", {"source": "src.real/app.py", "destination": "newdir/app2.py"}),
                ("move_file", {"source": "README.txt", "destination": "moved.txt"}),
                ("create_directory", {"path": "newdir/sub"}),
                ("create_directory", {"path": "src/sub/deeper"}),
            ]
            for tool, args in attempts:
                r = await agent.call(tool, **args)
                if text(r).startswith("Conflict: nothing was written"):
                    # a file swapped for a symlink after the read: a conflict (issue 36)
                    assert r.is_error and "never writes through one" in text(r), text(r)
                    assert "Traceback" not in text(r)
                else:
                    one_line_error(r)
            assert tree(outside) == before
            assert os.readlink(repo / "src") == str(outside)
            assert os.readlink(repo / "README.txt") == str(outside / "README.txt")
        verify_ok(ledger_of(repo))

    run(go)


def test_undo_never_follows_a_symlink_put_where_the_step_wrote(repo: Path,
                                                               tmp_path: Path) -> None:
    """A step creates a file; the file is then replaced by a symlink to a file outside.
    Undoing the creation must not remove or rewrite what the symlink points at."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            made = await agent.ok("write_file", path="made.txt", content="TOP SECRET\n")
            os.unlink(repo / "made.txt")
            (repo / "made.txt").symlink_to(outside / "secret.txt")
            r = await agent.call("undo", step=made["step"])
            assert r.is_error  # left as found, reported
            assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
            assert (repo / "made.txt").is_symlink()

    run(go)


def test_move_file_never_lands_on_anything_or_anywhere_forbidden(repo: Path,
                                                                 tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "dest.txt").write_text("keep me\n")
    (repo / "destdir").mkdir()
    (repo / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    (repo / "outlink").symlink_to(outside)
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text("m = 1\n")
    before, outside_before = tree(repo), tree(outside)

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            for dest in ["dest.txt", "destdir", "dangling", "outlink", "outlink/README.txt",
                         "dangling/x", ".git/hooks/pre-commit", ".git", ".GIT/config",
                         ".steptrail/ledger.db", ".steptrail/README.txt", ".steptrail",
                         str(outside / "README.txt"), "../README.txt", "src/app.py",
                         "/etc/README.txt", "."]:
                r = await agent.call("move_file", source="README.txt", destination=dest)
                one_line_error(r)
            for src, dest in [("pkg", "pkg/inner"), (".steptrail", "ledger-copy"),
                              (".steptrail/ledger.db", "ledger.db"), ("outlink", "o2"),
                              ("dangling", "d2"), (".", "root2"), ("pkg", ".git/pkg")]:
                r = await agent.call("move_file", source=src, destination=dest)
                one_line_error(r)
            assert tree(repo) == before
            assert tree(outside) == outside_before
            assert not (tmp_path / "nowhere").exists()
        verify_ok(ledger_of(repo))

    run(go)


def test_a_ledger_in_a_directory_of_any_name_is_out_of_reach(repo: Path) -> None:
    """The ledger kept at repo/state/ (not the default .steptrail/): refused by its
    identity, not only by its usual name, and never listed."""
    ledger_path = repo / "state" / "l.db"

    async def go() -> None:
        async with inprocess([str(repo)], str(ledger_path)) as agent:
            listing = await agent.ok("list_directory", path=".")
            assert "state" not in {e["name"] for e in listing["entries"]}
            found = await agent.ok("search_files", path=".", pattern="l.db")
            assert found["matches"] == []
            tree_ = await agent.ok("directory_tree", path=".")
            assert "state" not in {n["name"] for n in tree_["tree"]}
            await agent.ok("read_text_file", path="README.txt")
            for tool, args in [
                ("read_text_file", {"path": "state/l.db"}),
                ("write_file", {"path": "state/planted.txt", "content": "x"}),
                ("write_file", {"path": "state/l.db", "content": "x"}),
                ("delete_file", {"path": "state/l.db"}),
                ("create_directory", {"path": "state/blobs/x"}),
                ("list_directory", {"path": "state"}),
                ("directory_tree", {"path": "state"}),
                ("get_file_info", {"path": "state/l.db"}),
                ("move_file", {"source": "README.txt", "destination": "state/README.txt"}),
                ("move_file", {"source": "state", "destination": "stolen"}),
            ]:
                one_line_error(await agent.call(tool, **args))
            assert (repo / "state" / "l.db").is_file()
            assert not (repo / "stolen").exists()
        verify_ok(ledger_path)

    run(go)


def test_a_swapped_workspace_root_is_refused(repo: Path, tmp_path: Path) -> None:
    """The workspace directory moved away and a symlink to elsewhere put in its place."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "README.txt").write_text("hello\n")

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            os.rename(repo, tmp_path / "repo.moved")
            repo.symlink_to(elsewhere)
            for tool, args in [("read_text_file", {"path": "README.txt"}),
                               ("write_file", {"path": "README.txt", "content": "x"}),
                               ("write_file", {"path": "new.txt", "content": "x"}),
                               ("list_directory", {"path": "."}),
                               ("create_directory", {"path": "d"})]:
                one_line_error(await agent.call(tool, **args))
            assert tree(elsewhere) == {"README.txt": b"hello\n"}

    run(go)


def test_glob_patterns_built_to_backtrack_answer_at_once(repo: Path) -> None:
    """Star-heavy patterns against long names and deep paths (search_files' pattern and
    every excludePatterns): answered in a moment, not after exponential backtracking."""
    (repo / ("a" * 200)).write_text("x")
    deep = repo.joinpath(*(["d"] * 40))
    deep.mkdir(parents=True)
    (deep / ("a" * 100)).write_text("x")
    nasty = ["*a*a*a*a*a*a*a*a*a*a*a*a*b", "**a**a**a**a**a**a**a**a**b",
             "**/*a*a*a*a*a*a*a*a*a*a*a*b", "/".join(["**"] * 30) + "/x",
             "**/d/**/d/**/d/**/d/**/d/**/d/**/d/**/zz", "[z-a]/x", "x/[[:alpha:]"]

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            for pattern in nasty:
                started = time.monotonic()
                for r in [await agent.call("search_files", path=".", pattern=pattern),
                          await agent.call("directory_tree", path=".",
                                           excludePatterns=[pattern])]:
                    assert "Traceback" not in text(r)
                    if r.is_error:
                        one_line_error(r)
                assert time.monotonic() - started < 3, pattern

    run(go)


def test_huge_content_and_huge_files_are_refused_before_anything_is_written(
        repo: Path) -> None:
    (repo / "big.bin").write_bytes(b"x" * (5 * 1024 * 1024))

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            before = tree(repo)
            r = await agent.call("write_file", path="huge.txt", content="x" * (17 * 1024 * 1024))
            assert "more than" in one_line_error(r)
            r = await agent.call("write_files", files=[
                {"path": f"h{i}.txt", "content": "y" * (6 * 1024 * 1024)} for i in range(3)])
            one_line_error(r)
            one_line_error(await agent.call("read_text_file", path="big.bin"))
            r = await agent.call("read_multiple_files", paths=["big.bin", "README.txt"])
            files = r.structured_content["files"]
            assert "error" in files[0] and files[1]["content"] == "hello\n"
            assert tree(repo) == before

    run(go)


def test_create_directory_is_bounded_like_every_other_path(repo: Path) -> None:
    deep = ("d" * 10 + "/") * 380  # 4180 characters: longer than any write may name

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            w = await agent.call("write_file", path=deep + "f.txt", content="x")
            assert w.is_error and "too long" in text(w)
            r = await agent.call("create_directory", path=deep)
            assert r.is_error and "\n" not in text(r)
            assert not (repo / ("d" * 10)).exists()

    try:
        run(go)
    finally:  # whatever was made: rm copes with any depth
        subprocess.run(["rm", "-rf", str(repo / ("d" * 10))], check=False)


def test_create_directory_refuses_a_name_that_is_not_utf8(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            r = await agent.call("create_directory", path="nd\udcff")
            assert r.is_error and "\n" not in text(r)
            assert os.listdir(os.fsencode(repo)).count(b"nd\xff") == 0

    run(go)


def test_a_name_shaped_like_a_steptrail_temporary_is_refused_or_kept(repo: Path) -> None:
    """Was a hole: such a file was committed, hidden from every listing, and deleted by
    the next epoch's temporary sweep (a committed change silently lost). The library now
    refuses the name at admit (PathForbidden)."""
    name = ".notes.steptrail-1-abcdef12-abcdef12.tmp"

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            r = await agent.call("write_file", path=name, content="agent's notes\n")
            if r.is_error:
                assert "temporary files" in text(r), text(r)
                assert not (repo / name).exists()
                return  # refused: safe
            await agent.ok("write_file", path="a.txt", content="a\n")
            await anyio.sleep(0.5)  # past the linger: the next write takes a new epoch
            await agent.ok("write_file", path="b.txt", content="b\n")
            assert (repo / name).read_text() == "agent's notes\n"

    run(go)


def test_a_whitespace_tolerant_edit_is_not_quadratic(repo: Path) -> None:
    (repo / "big.txt").write_text("a\n" * 20_000)

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="big.txt")
            started = time.monotonic()
            r = await agent.call("edit_file", path="big.txt", dryRun=True,
                                 edits=[{"oldText": " a\n" * 10_000 + "b", "newText": "x"}])
            assert r.is_error and "not found" in text(r)
            assert time.monotonic() - started < 0.5

    run(go)


def test_moving_a_directory_never_leaves_part_of_it_behind(repo: Path) -> None:
    (repo / "pkg" / ".git").mkdir(parents=True)
    (repo / "pkg" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / "pkg" / "mod.py").write_text("x = 1\n")

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            r = await agent.call("move_file", source="pkg", destination="pkg2")
            if r.is_error:
                assert (repo / "pkg" / "mod.py").exists()  # refused whole: safe
                return
            assert not (repo / "pkg").exists(), "reported moved, but pkg/ is still there"

    run(go)


# =====================================================================================
# (a)+(e) names and requests that cannot be encoded
# =====================================================================================


def test_a_file_name_that_is_not_utf8_does_not_kill_the_server(repo: Path) -> None:
    with open(os.fsencode(repo) + b"/caf\xe9.txt", "wb") as f:
        f.write(b"latin-1 name\n")

    async def go() -> None:
        async with over_stdio("--workspace", str(repo)) as agent:
            for tool, args in [("list_directory", {"path": "."}),
                               ("directory_tree", {"path": "."}),
                               ("search_files", {"path": ".", "pattern": "caf"})]:
                with anyio.fail_after(4):
                    r = await agent.call(tool, **args)
                assert "Traceback" not in text(r)
            with anyio.fail_after(4):
                await agent.ok("status")  # still serving

    run(go)


def _raw_stdio(repo: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([steptrail_command(), "mcp", "--workspace", str(repo)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=server_env())
    return proc


def _send(proc: subprocess.Popen[bytes], msg: dict[str, Any] | str) -> None:
    assert proc.stdin is not None
    line = msg if isinstance(msg, str) else json.dumps(msg)
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[bytes], want_id: Any, timeout: float) -> dict[str, Any] | None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            return None
        msg = json.loads(line)
        if msg.get("id") == want_id:
            return msg
    return None


def _initialize(proc: subprocess.Popen[bytes]) -> None:
    _send(proc, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    assert _answer(proc, 0, 30) is not None
    _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})


def _close(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(Exception):
        assert proc.stdin is not None
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_malformed_client_gets_answers_never_a_write(repo: Path) -> None:
    """Raw JSON-RPC over stdio: arguments of the wrong shape, a smuggled `ctx`, repeated
    keys, non-string ids... each request with an id gets an answer (an error result or
    a JSON-RPC error), none writes, and the server keeps serving."""
    proc = _raw_stdio(repo)
    try:
        _initialize(proc)
        before = tree(repo)
        calls: list[tuple[int, str, Any]] = [
            (1, "read_text_file", [1]),
            (2, "read_text_file", None),
            (3, "write_file", {"path": "w.txt", "content": "x", "ctx": {"x": 1}}),
            (4, "write_file", {"path": "w.txt", "content": "x", "requestId": 7}),
            (5, "write_file", {"path": "w.txt", "content": "x", "dryRun": True}),
            (6, "write_file", {"path": {"$ne": 1}, "content": "x"}),
            (7, "write_files", {"files": [{"path": "w.txt", "content": "x", "mode": 511}]}),
            (8, "edit_file", {"path": "README.txt",
                              "edits": [{"oldText": "hello", "newText": None}]}),
            (9, "write_file", {"path": "w.txt", "content": "x", "requestId": "../../x y"}),
            (10, "write_file", {"path": "w.txt", "content": "x", "expectedHash": "zz"}),
            (11, "undo", {"step": ["a"]}),
            (12, "no_such_tool", {}),
        ]
        for n, tool, args in calls:
            params: dict[str, Any] = {"name": tool}
            if args is not None:
                params["arguments"] = args
            _send(proc, {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params})
            msg = _answer(proc, n, 10)
            assert msg is not None, (tool, args)
            if "error" in msg:
                assert "\n" not in msg["error"].get("message", "")
                continue
            res = msg["result"]
            assert res["isError"], (tool, args, res)
            [block] = res["content"]
            assert "\n" not in block["text"] and "Traceback" not in block["text"]
        _send(proc, '{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":'
                    '"read_text_file","arguments":{"path":"README.txt","path":"src/app.py"}}}')
        msg = _answer(proc, 14, 10)
        assert msg is not None
        _send(proc, {"jsonrpc": "2.0", "id": 15, "method": "tools/call",
                     "params": {"name": "status", "arguments": {}}})
        assert _answer(proc, 15, 10) is not None
        assert tree(repo) == before
    finally:
        _close(proc)


def test_a_request_the_sdk_cannot_decode_still_gets_an_answer(repo: Path) -> None:
    proc = _raw_stdio(repo)
    try:
        _initialize(proc)
        _send(proc, '{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":'
                    '"write_file","arguments":{"path":"w.txt","content":"a\\ud800b"}}}')
        assert _answer(proc, 21, 3) is not None
        assert not (repo / "w.txt").exists()
    finally:
        _close(proc)


# =====================================================================================
# (b) a person with a shell between the agent's read and write; undo
# =====================================================================================


def test_a_persons_edit_between_read_and_write_is_a_conflict_for_every_write_tool(
        repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            attempts = [
                ("write_file", {"path": "README.txt", "content": "agent\n"}),
                ("edit_file", {"path": "README.txt",
                               "edits": [{"oldText": "hello", "newText": "agent"}]}),
                ("delete_file", {"path": "README.txt"}),
                ("write_files", {"files": [{"path": "README.txt", "content": "agent\n"},
                                           {"path": "fresh.txt", "content": "new\n"}]}),
                ("write_file", {"path": "README.txt", "content": "agent\n",
                                "expectedHash": sha(b"hello\n")}),
            ]
            for n, (tool, args) in enumerate(attempts):
                (repo / "README.txt").write_text("hello\n")
                await agent.ok("read_text_file", path="README.txt")
                (repo / "README.txt").write_text(f"the person's edit {n}\n")
                r = await agent.call(tool, requestId=f"stale-{n}", **args)
                assert r.is_error and r.structured_content["status"] == "conflict", (tool,
                                                                                     text(r))
                assert (repo / "README.txt").read_text() == f"the person's edit {n}\n"
                assert not (repo / "fresh.txt").exists()  # a multi-file change: none of it
            # a file the person created after the agent saw it absent
            r = await agent.call("read_text_file", path="late.txt")
            assert r.is_error
            (repo / "late.txt").write_text("the person's file\n")
            r = await agent.call("write_file", path="late.txt", content="agent\n",
                                 expectedHash="absent")
            assert r.is_error and (repo / "late.txt").read_text() == "the person's file\n"
        verify_ok(ledger_of(repo))

    run(go)


def test_undo_never_clobbers_what_a_person_did_after_the_step(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("read_text_file", path="README.txt")
            deleted = await agent.ok("delete_file", path="README.txt")
            (repo / "README.txt").write_text("the person re-created it\n")
            r = await agent.call("undo", step=deleted["step"])
            assert r.is_error and r.structured_content["conflicts"] == 1
            assert (repo / "README.txt").read_text() == "the person re-created it\n"

            created = await agent.ok("write_file", path="made.txt", content="agent\n")
            (repo / "made.txt").write_text("the person's edit\n")
            r = await agent.call("undo", step=created["step"])
            assert r.is_error
            assert (repo / "made.txt").read_text() == "the person's edit\n"

            await agent.ok("read_text_file", path="src/app.py")
            moved = await agent.ok("move_file", source="src/app.py", destination="lib/app.py")
            (repo / "lib" / "app.py").write_text("the person's edit of the moved file\n")
            await agent.call("undo", step=moved["step"])
            assert (repo / "lib" / "app.py").read_text() == "the person's edit of the moved file\n"
        verify_ok(ledger_of(repo))

    run(go)


# =====================================================================================
# (c) a second server on the same workspace; the lock files beside the ledger
# =====================================================================================


def test_a_second_client_reusing_a_request_id_cannot_pass_another_change_for_it(
        repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as a, inprocess([str(repo)]) as b:
            await a.ok("read_text_file", path="README.txt")
            first = await a.ok("write_file", path="README.txt", content="from a\n",
                               requestId="shared-id")
            await b.ok("read_text_file", path="README.txt")
            r = await b.call("write_file", path="README.txt", content="from b\n",
                             requestId="shared-id")
            assert r.is_error and "different change" in text(r)
            same = await b.ok("write_file", path="README.txt", content="from a\n",
                              requestId="shared-id")
            assert same["replayed"] and same["step"] == first["step"]
            assert (repo / "README.txt").read_text() == "from a\n"

    run(go)


def test_a_request_id_never_names_a_step_of_another_workspace(tmp_path: Path) -> None:
    app, other = tmp_path / "app", tmp_path / "other"
    app.mkdir()
    other.mkdir()
    ledger_path = tmp_path / "ledger.db"
    with Ledger.init(ledger_path) as led:
        led.workspaces.add("app", str(app))
        led.workspaces.add("app:x", str(other))

    async def go() -> None:
        async with inprocess(["app", "app:x"], str(ledger_path)) as agent:
            await agent.ok("write_file", path=str(other / "notes.txt"), content="same\n",
                           requestId="r1")
            r = await agent.call("write_file", path="notes.txt", content="same\n",
                                 requestId="x:r1")
            if not r.is_error:
                assert (app / "notes.txt").read_text() == "same\n", text(r)

    run(go)


def test_a_lock_file_held_by_a_stuck_process_does_not_lock_writers_out(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)], lease_wait_s=1.0) as agent:
            await agent.ok("write_file", path="first.txt", content="1\n")
            await anyio.sleep(0.5)  # past the linger: no lease held by anyone
            lock, _ = slot_files(ledger_of(repo), "repo")
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # the stuck process
                status = await agent.ok("status")
                assert status["workspaces"][0]["lease"]["live"] is False
                r = await agent.call("write_file", path="second.txt", content="2\n")
                assert not r.is_error, text(r)
            finally:
                os.close(fd)

    run(go)


def test_a_held_wait_file_never_hangs_a_write_past_its_lease_wait(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)], lease_wait_s=0.5) as agent:
            await agent.ok("write_file", path="first.txt", content="1\n")
            await anyio.sleep(0.5)
            lock, wait = slot_files(ledger_of(repo), "repo")
            fl, fw = os.open(lock, os.O_RDWR), os.open(wait, os.O_RDWR)
            fcntl.flock(fl, fcntl.LOCK_EX)
            fcntl.flock(fw, fcntl.LOCK_EX)
            unstick = threading.Timer(2.5, lambda: (os.close(fw), os.close(fl)))
            unstick.start()
            try:
                started = time.monotonic()
                await agent.call("write_file", path="second.txt", content="2\n")
                assert time.monotonic() - started < 1.5
            finally:
                unstick.join()

    run(go)


def test_a_lock_file_replaced_by_a_fifo_or_a_directory_does_not_hang_or_fail(
        repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("status")
        lock, wait = slot_files(ledger_of(repo), "repo")
        for p in (lock, wait):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        os.mkfifo(wait)
        os.mkdir(lock)  # cannot be opened for writing: no queue, the lease itself
        async with inprocess([str(repo)]) as agent:
            with anyio.fail_after(10):
                await agent.ok("write_file", path="a.txt", content="a\n")
        os.rmdir(lock)
        os.mkfifo(lock)
        async with inprocess([str(repo)]) as agent:
            with anyio.fail_after(10):
                await agent.ok("write_file", path="b.txt", content="b\n")
        assert stat.S_ISFIFO(os.lstat(lock).st_mode)
        verify_ok(ledger_of(repo))

    run(go)


def test_the_lock_file_is_never_followed_through_a_symlink(repo: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:
            await agent.ok("status")
        lock, _ = slot_files(ledger_of(repo), "repo")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.symlink(target, lock)
        async with inprocess([str(repo)]) as agent:
            await agent.call("write_file", path="a.txt", content="a\n")
        assert not target.exists()

    run(go)


def test_reads_never_wait_for_the_lease(repo: Path) -> None:
    async def go() -> None:
        async with inprocess([str(repo)], lease_wait_s=2.0) as agent:
            await agent.ok("read_text_file", path="README.txt")
            with Ledger.open(ledger_of(repo)) as person:
                lease = person.workspaces.acquire("repo", holder="a-person", ttl_s=60)
                waited: list[float] = []

                async def writer() -> None:
                    await agent.call("write_file", path="x.txt", content="x\n")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(writer)
                    await anyio.sleep(0.3)
                    started = time.monotonic()
                    await agent.ok("read_text_file", path="README.txt")
                    waited.append(time.monotonic() - started)
                person.workspaces.release("repo", lease.epoch)
            assert waited[0] < 0.5, f"the read waited {waited[0]:.1f}s for the lease"

    run(go)


def test_two_servers_of_two_workspaces_never_deadlock(tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "A", tmp_path / "B"
    a_dir.mkdir()
    b_dir.mkdir()
    ledger_path = str(tmp_path / "ledger.db")

    async def go() -> None:
        kw: dict[str, Any] = {"lease_wait_s": 1.5, "lease_linger_s": 1.0}
        async with inprocess([str(a_dir), str(b_dir)], ledger_path,
                             holder="steptrail-mcp@elsewhere:1:1", **kw) as s1, \
                inprocess([str(a_dir), str(b_dir)], ledger_path,
                          holder="steptrail-mcp@elsewhere:2:2", **kw) as s2:
            await s1.ok("write_file", path=f"{a_dir}/a1.txt", content="1\n")  # keeps A
            await s2.ok("write_file", path=f"{b_dir}/b1.txt", content="1\n")  # keeps B
            results: list[Any] = []

            async def write(agent: Agent, path: str) -> None:
                results.append(await agent.call("write_file", path=path, content="2\n"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(write, s1, f"{b_dir}/b2.txt")
                tg.start_soon(write, s2, f"{a_dir}/a2.txt")
            assert [text(r) for r in results if r.is_error] == []

    run(go)


def _turns(repo: Path, turn_s: float | None) -> tuple[int, int, list[float]]:
    """Two real server processes writing as fast as their agents can on one workspace:
    (the calls, the lease acquires they made, each call's latency)."""
    turn = () if turn_s is None else ("--lease-turn", f"{turn_s}s")
    calls = 12
    latencies: list[float] = []
    epochs: list[int] = []

    async def go() -> None:
        async with over_stdio("--workspace", str(repo), *turn) as a, \
                over_stdio("--workspace", str(repo), *turn) as b:
            await a.ok("write_file", path="a/warm.txt", content="w\n")
            await b.ok("write_file", path="b/warm.txt", content="w\n")
            with Ledger.open(ledger_of(repo)) as led:
                epochs.append(led.workspaces.lease("repo").epoch)

            async def agent(x: Agent, tag: str) -> None:
                for i in range(calls):
                    started = time.monotonic()
                    await x.ok("write_file", path=f"{tag}/{i}.txt", content=f"{i}\n")
                    latencies.append(time.monotonic() - started)

            async with anyio.create_task_group() as tg:
                tg.start_soon(agent, a, "a")
                tg.start_soon(agent, b, "b")
            with Ledger.open(ledger_of(repo)) as led:
                epochs.append(led.workspaces.lease("repo").epoch)

    run(go)
    verify_ok(ledger_of(repo))
    return 2 * calls, epochs[1] - epochs[0], latencies


def test_servers_sharing_a_workspace_take_turns_of_several_calls(repo: Path) -> None:
    """Two agents on one workspace: a server keeps the lease for a turn of several of its
    client's calls while the other waits (fewer acquires than calls: each acquire and
    release is a commit), and no call waits much more than a turn. With no turn (the
    variant that hands the lease over after every call), a call or two per acquire."""
    from ledger.mcp.leases import TURN_S

    calls, acquires, latencies = _turns(repo, None)
    assert acquires <= calls // 2, (acquires, calls)
    typical = sorted(latencies)[len(latencies) // 2]
    assert max(latencies) < 3 * (TURN_S + 2 * typical), (max(latencies), typical)


def test_the_turn_checker_catches_a_lease_handed_over_after_every_call(repo: Path) -> None:
    calls, acquires, _ = _turns(repo, 0.0)
    assert acquires > calls // 2, (acquires, calls)


def test_a_busy_server_does_not_starve_another(repo: Path) -> None:
    """One agent writes as fast as it can; another's writes still land promptly."""
    async def go() -> None:
        async with over_stdio("--workspace", str(repo)) as greedy, \
                over_stdio("--workspace", str(repo), "--lease-wait", "5s") as polite:
            stop = time.monotonic() + 1.2
            latencies: list[float] = []

            async def hog() -> None:
                i = 0
                while time.monotonic() < stop:
                    await greedy.ok("write_file", path=f"g/{i}.txt", content="g\n")
                    i += 1

            async def other() -> None:
                await anyio.sleep(0.2)
                for j in range(3):
                    started = time.monotonic()
                    await polite.ok("write_file", path=f"p/{j}.txt", content="p\n")
                    latencies.append(time.monotonic() - started)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hog)
                tg.start_soon(other)
            assert max(latencies) < 2.0, latencies

    run(go)


# =====================================================================================
# (d) SIGKILL at bad moments
# =====================================================================================


def test_a_sigkill_between_two_files_of_one_change_leaves_nothing_half_applied(
        repo: Path) -> None:
    """A real SIGKILL after the first file of a three-file step is renamed into place:
    the next server puts it back, and the retry applies the whole change once."""
    (repo / "a.txt").write_text("a0\n")
    (repo / "b.txt").write_text("b0\n")
    change = [{"path": "a.txt", "content": "A1\n"}, {"path": "b.txt", "content": "B1\n"},
              {"path": "README.txt", "delete": True}]

    def files() -> list[str | None]:
        return [(repo / p).read_text() if (repo / p).exists() else None
                for p in ("a.txt", "b.txt", "README.txt")]

    async def killed() -> None:
        with contextlib.suppress(Exception, BaseExceptionGroup):
            async with killer_agent(repo, kill_at_install=2) as agent:
                await agent.ok("read_multiple_files", paths=["a.txt", "b.txt", "README.txt"])
                with anyio.fail_after(20):
                    await agent.call("write_files", requestId="multi-1", files=change)

    async def go() -> None:
        assert files() == ["A1\n", "b0\n", "hello\n"]  # killed half-way
        async with inprocess([str(repo)]) as agent:
            await agent.ok("write_file", path="other.txt", content="x\n")  # settles
            assert files() == ["a0\n", "b0\n", "hello\n"]
            retry = await agent.ok("write_files", requestId="multi-1", files=change)
            assert retry["replayed"]
            assert files() == ["A1\n", "B1\n", None]
        verify_ok(ledger_of(repo))

    run(killed)
    run(go)


def test_a_sigkill_in_the_middle_of_an_undo_leaves_nothing_half_undone(repo: Path) -> None:
    (repo / "a.txt").write_text("a0\n")
    (repo / "b.txt").write_text("b0\n")

    def files() -> list[str]:
        return [(repo / p).read_text() for p in ("a.txt", "b.txt")]

    async def killed() -> None:
        with contextlib.suppress(Exception, BaseExceptionGroup):
            async with killer_agent(repo, kill_at_install=4) as agent:  # 2 writes, 2 undos
                await agent.ok("read_multiple_files", paths=["a.txt", "b.txt"])
                w = await agent.ok("write_files", requestId="m2", files=[
                    {"path": "a.txt", "content": "A1\n"}, {"path": "b.txt", "content": "B1\n"}])
                with anyio.fail_after(20):
                    await agent.call("undo", step=w["step"])

    async def go() -> None:
        # killed between b.txt's undo and a.txt's: the undo was journaled
        # (`compensating`), so the next server's new epoch finishes it
        assert files() == ["A1\n", "b0\n"]
        async with inprocess([str(repo)]) as agent:
            await agent.ok("write_file", path="other.txt", content="x\n")  # a new epoch
            assert files() == ["a0\n", "b0\n"]
            status = await agent.ok("status")
            ws = status["workspaces"][0]
            assert not ws["in_flight"] and not ws["unsettled"]
        with Ledger.open(ledger_of(repo), readonly=True) as led:
            assert led.step("mcp:repo:m2").state == "compensated"
        verify_ok(ledger_of(repo))

    run(killed)
    run(go)


def test_a_retry_after_a_kill_before_a_large_post_image_was_stored_applies(
        repo: Path) -> None:
    """A write of more than 64 KiB: its plan commits, then the server is SIGKILLed before
    the post-image's file is written. The retry with the same requestId (from a new
    server) applies it: the content comes with the retried call and is stored again."""
    big = "x" * 200_000 + "\n"

    async def killed() -> None:
        with contextlib.suppress(Exception, BaseExceptionGroup):
            async with killer_agent(repo, kill_at_install=1,
                                    target="ledger.blobs:BlobStore.put_content") as agent:
                with anyio.fail_after(20):
                    await agent.call("write_file", path="big.txt", content=big,
                                     requestId="big-1")

    async def go() -> None:
        assert not (repo / "big.txt").exists()
        async with inprocess([str(repo)]) as agent:
            retry = await agent.ok("write_file", path="big.txt", content=big, requestId="big-1")
            assert retry["replayed"] and retry["status"] == "applied"
            assert (repo / "big.txt").read_text() == big
            again = await agent.ok("write_file", path="big.txt", content=big, requestId="big-1")
            assert again["replayed"]
        verify_ok(ledger_of(repo))

    run(killed)
    run(go)


def test_a_retry_with_the_same_request_id_but_other_edits_is_not_the_first(
        repo: Path, tmp_path: Path) -> None:
    first = {"path": "README.txt", "requestId": "rid-1",
             "edits": [{"oldText": "hello", "newText": "FIRST"}]}
    run(killed_write, repo, tmp_path, "after-admit", "edit_file", first)
    assert (repo / "README.txt").read_text() == "hello\n"

    async def go() -> None:
        async with inprocess([str(repo)]) as agent:  # the retry, from any client
            await agent.ok("read_text_file", path="README.txt")
            r = await agent.call("edit_file", path="README.txt", requestId="rid-1",
                                 edits=[{"oldText": "hello", "newText": "SECOND"}])
            if not r.is_error:
                assert "SECOND" in (repo / "README.txt").read_text(), (
                    "answered as applied, but the file holds: "
                    + (repo / "README.txt").read_text())

    run(go)


# =====================================================================================
# (f) HTTP: loopback only, DNS rebinding
# =====================================================================================


def test_http_on_loopback_refuses_a_rebound_host_and_a_foreign_origin(repo: Path) -> None:
    port = free_port()
    with http_server(repo, "127.0.0.1", port):
        assert http_initialize("127.0.0.1", port, f"evil.example:{port}",
                               f"http://evil.example:{port}") == 421
        assert http_initialize("127.0.0.1", port, f"127.0.0.1:{port}", "http://evil.example") == 403
        assert http_initialize("127.0.0.1", port, f"127.0.0.1:{port}", None) == 200
    for host in ("::", "127.1"):
        out = subprocess.run([steptrail_command(), "mcp", "--workspace", str(repo), "--http",
                              "--host", host], capture_output=True, text=True,
                             env=server_env(), timeout=60)
        assert out.returncode == 2 and "no authentication" in out.stderr, (host, out.stderr)


def test_http_on_any_loopback_address_keeps_dns_rebinding_protection(repo: Path) -> None:
    port = free_port()
    with http_server(repo, "127.0.0.2", port):
        assert http_initialize("127.0.0.2", port, f"evil.example:{port}",
                               f"http://evil.example:{port}") in (403, 421)

"""`steptrail mcp` as real processes: the installed command over stdio, driven by the
official SDK's client; two clients (two server processes) on one workspace at once; a
server SIGKILLed in the middle of a write, and the next server settling it; streamable
HTTP on loopback.

The SIGKILL lands where a test asks: ``STEPTRAIL_MCP_TEST_PAUSE=STAGE:MARKER`` makes
the server stop for good at STAGE of its next write (after-admit: its plan durable;
after-commit: its apply, manifest and ack committed in one transaction) once it has
written MARKER, and the test kills it there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mcp_agents import killed_write, over_stdio, server_env, steptrail_command, text

from ledger import Ledger


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text('print("v0")\n')
    (root / "notes.txt").write_text("notes\n")
    return root


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([steptrail_command(), *args], capture_output=True, text=True,
                          env=server_env(), timeout=120)


def verify_clean(repo: Path) -> None:
    out = cli("--ledger", str(repo / ".steptrail" / "ledger.db"), "verify")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_scripted_session_over_stdio(repo: Path) -> None:
    async def go() -> None:
        async with over_stdio("--workspace", str(repo)) as agent:
            tools = {t.name for t in (await agent.client.list_tools()).tools}
            assert {"read_text_file", "edit_file", "undo", "history"} <= tools
            read = await agent.ok("read_text_file", path="app.py")
            assert read["hash"] == sha(b'print("v0")\n')
            await agent.ok("edit_file", path="app.py", requestId="e1",
                           edits=[{"oldText": "v0", "newText": "v1"}])
            assert (repo / "app.py").read_text() == 'print("v1")\n'
            (repo / "app.py").write_text('print("person")\n')
            conflict = await agent.fails("write_file", path="app.py", content="agent\n",
                                         requestId="w1")
            assert conflict.structured_content["reason"] == "pre_hash"
            assert "+print(\"person\")" in text(conflict)
            assert (repo / "app.py").read_text() == 'print("person")\n'
            retry = await agent.ok("edit_file", path="app.py", requestId="e1",
                                   edits=[{"oldText": "v0", "newText": "v1"}])
            assert retry["replayed"]
            await agent.ok("read_text_file", path="app.py")
            w = await agent.ok("write_file", path="app.py", content="agent\n", requestId="w2")
            await agent.ok("undo", step=w["step"])
            assert (repo / "app.py").read_text() == 'print("person")\n'
            hist = await agent.ok("history", path="app.py")
            assert [s["outcome"] for s in hist["steps"]] == ["undone", "refused", "committed"]
            bad = await agent.fails("read_text_file", path="../../etc/passwd")
            assert "\n" not in text(bad)
        verify_clean(repo)

    run(go)


def test_the_readme_client_configuration_serves_the_project(repo: Path) -> None:
    """The `.mcp.json` the README shows, started the way a client starts it (its command
    and arguments, in the project's directory), serves that project."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"cat > \.mcp\.json <<'EOF'\n(.*?)\nEOF\n", readme, re.S)
    assert block, "the README lost its client configuration"
    entry = json.loads(block[1])["mcpServers"]["steptrail"]
    assert entry["command"] == "steptrail"
    params = StdioServerParameters(command=steptrail_command(), args=entry["args"],
                                   env=server_env(), cwd=str(repo))

    async def go() -> None:
        async with Client(params, read_timeout_seconds=60) as client:
            r = await client.call_tool("list_allowed_directories", {})
            assert r.structured_content["directories"][0]["path"] == str(repo.resolve())
            r = await client.call_tool("write_file", {"path": "from-client.txt",
                                                      "content": "hi\n"})
            assert not r.is_error, text(r)
        assert (repo / "from-client.txt").read_text() == "hi\n"
        assert (repo / ".steptrail" / "ledger.db").exists()

    run(go)


def test_two_clients_two_processes_one_workspace(repo: Path) -> None:
    """Two clients, each spawning its server, writing at the same time: every
    non-overlapping write lands; of two writes planned on the same read, exactly one
    lands and the other is a conflict; nobody is locked out."""
    async def go() -> None:
        async with over_stdio("--workspace", str(repo)) as a, \
                over_stdio("--workspace", str(repo)) as b:
            await a.ok("read_text_file", path="app.py")
            await b.ok("read_text_file", path="app.py")
            writes: list[Any] = []
            edits: list[Any] = []

            async def writer(agent: Any, who: str) -> None:
                for i in range(15):
                    writes.append(await agent.call(
                        "write_file", path=f"{who}/{i}.txt", content=f"{who} {i}\n"))

            async def racer(agent: Any, who: str) -> None:
                edits.append(await agent.call("edit_file", path="app.py", edits=[
                    {"oldText": "v0", "newText": who}]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(writer, a, "a")
                tg.start_soon(writer, b, "b")
                tg.start_soon(racer, a, "a")
                tg.start_soon(racer, b, "b")
            assert [text(r) for r in writes if r.is_error] == []
            for who in ("a", "b"):
                for i in range(15):
                    assert (repo / who / f"{i}.txt").read_text() == f"{who} {i}\n"
            assert sorted(r.is_error for r in edits) == [False, True]
            loser = next(r for r in edits if r.is_error)
            assert loser.structured_content["reason"] in ("pre_hash", "stale_rev")
            assert (repo / "app.py").read_text() in ('print("a")\n', 'print("b")\n')
        verify_clean(repo)

    run(go)


def test_servers_started_at_once_on_a_fresh_workspace(repo: Path) -> None:
    """Four clients spawn their servers at the same moment on a directory without a
    ledger: one creates it, all register the same workspace, every write lands."""
    async def go() -> None:
        async def client(n: int) -> None:
            async with over_stdio("--workspace", str(repo)) as agent:
                await agent.ok("write_file", path=f"c{n}.txt", content=f"{n}\n")

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(client, n)
        assert sorted(p.name for p in repo.glob("c*.txt")) == [f"c{n}.txt" for n in range(4)]
        with Ledger.open(repo / ".steptrail" / "ledger.db", readonly=True) as led:
            assert [w.name for w in led.workspaces()] == ["repo"]
        verify_clean(repo)

    run(go)


@pytest.mark.parametrize("stage", ["after-admit", "after-commit"])
def test_a_sigkilled_server_is_settled_by_the_next(repo: Path, tmp_path: Path,
                                                   stage: str) -> None:
    """SIGKILL a server mid-write; a new server (a new client, an empty view) takes the
    dead server's lease over at once (its holder is a dead local process: no wait for
    the 10-minute TTL), settles what it left — nothing half-applied — and the client's
    retry with the same requestId is answered from the ledger: applied exactly once."""
    args = {"path": "app.py", "edits": [{"oldText": "v0", "newText": "v1"}],
            "requestId": "killed-1"}
    run(killed_write, repo, tmp_path, stage, "edit_file", args)
    after_kill = (repo / "app.py").read_text()
    assert after_kill == ('print("v1")\n' if stage != "after-admit" else 'print("v0")\n')
    with Ledger.open(repo / ".steptrail" / "ledger.db", readonly=True) as led:
        state = led.step("mcp:repo:killed-1").state
        assert led.lease("repo").live  # the dead server's lease
    assert state == {"after-admit": "planned", "after-commit": "acked"}[stage]

    async def go() -> None:
        async with over_stdio("--workspace", str(repo), "--lease-ttl", "10m") as agent:
            started = time.monotonic()
            other = await agent.ok("write_file", path="other.txt", content="x\n")
            assert time.monotonic() - started < 20, "the dead holder's lease was waited out"
            assert other["status"] == "applied"
            if stage != "after-commit":  # settled: back to what the agent had read
                assert (repo / "app.py").read_text() == 'print("v0")\n'
            status = await agent.ok("status")
            assert status["workspaces"][0]["in_flight"] == []
            assert any("took over" in n for n in status["notices"])
            retry = await agent.ok("edit_file", **args)
            assert retry["replayed"] and retry["status"] == "applied"
            assert (repo / "app.py").read_text() == 'print("v1")\n'
            again = await agent.ok("edit_file", **args)
            assert again["replayed"]
            assert (repo / "app.py").read_text() == 'print("v1")\n'
        with Ledger.open(repo / ".steptrail" / "ledger.db", readonly=True) as led:
            row = led.step("mcp:repo:killed-1")
            assert row.state == "acked" and row.live
            assert row.attempt == (1 if stage == "after-commit" else 2)
        verify_clean(repo)

    run(go)


def test_a_persons_edit_after_the_kill_is_never_settled_away(repo: Path,
                                                             tmp_path: Path) -> None:
    """The server dies inside its apply (the file exchanged, not yet recorded); a person
    edits the file before any server comes
    back. Settling leaves the person's bytes as found (a notice says so), and the retry
    is a conflict, not a second try over the edit."""
    args = {"path": "app.py", "content": "agent\n", "requestId": "killed-2"}
    run(killed_write, repo, tmp_path, "after-exchange", "write_file", args)
    assert (repo / "app.py").read_text() == "agent\n"
    (repo / "app.py").write_text("the person's fix\n")

    async def go() -> None:
        async with over_stdio("--workspace", str(repo)) as agent:
            await agent.ok("write_file", path="other.txt", content="x\n")  # settles
            assert (repo / "app.py").read_text() == "the person's fix\n"
            status = await agent.ok("status")
            assert any("app.py as found" in n for n in status["notices"]), status["notices"]
            retry = await agent.fails("write_file", **args)
            assert retry.structured_content["status"] == "conflict"
            assert (repo / "app.py").read_text() == "the person's fix\n"
        verify_clean(repo)

    run(go)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_streamable_http_on_loopback(repo: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen([steptrail_command(), "mcp", "--workspace", str(repo), "--http",
                             "--port", str(port)], env=server_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the HTTP server did not come up"
            time.sleep(0.05)

        async def go() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                r = await client.call_tool("read_text_file", {"path": "notes.txt"})
                assert not r.is_error and r.structured_content["content"] == "notes\n"
                r = await client.call_tool("write_file", {"path": "notes.txt",
                                                          "content": "over http\n"})
                assert not r.is_error, text(r)
            assert (repo / "notes.txt").read_text() == "over http\n"

        run(go)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    verify_clean(repo)


def test_http_refuses_a_non_loopback_bind(repo: Path) -> None:
    out = cli("mcp", "--workspace", str(repo), "--http", "--host", "0.0.0.0")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "no authentication" in out.stderr
    assert "--allow-remote" in out.stderr
    assert not (repo / ".steptrail").exists()

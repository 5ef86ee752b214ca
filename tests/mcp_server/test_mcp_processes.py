"""`steptrail mcp` as real processes: the installed command over stdio, driven by the
official SDK's client; two clients (two server processes) on one workspace at once; a
server SIGKILLed in the middle of a write, and the next server settling it; streamable
HTTP on loopback.

The SIGKILL lands where a test asks: the server runs with a stage hook
(``ledger.cli.main(args, obj={"on_stage": ...})``, `mcp_agents.killed_write`) that
stops it for good at STAGE of its next write (after-admit: its plan durable;
after-exchange: its files exchanged, not yet recorded; after-commit: its apply,
manifest and ack committed in one transaction) once it has written MARKER, and the test
kills it there.
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
            # (the server observes at its first lease: the workspace's baseline, oldest)
            assert [(s["outcome"], s["step"].startswith("observed-repo-"))
                    for s in hist["steps"]] == [("undone", False), ("refused", False),
                                                ("committed", False), ("committed", True)]
            bad = await agent.fails("read_text_file", path="../../etc/passwd")
            assert "\n" not in text(bad)
        verify_clean(repo)

    run(go)


def test_the_readme_client_configuration_serves_the_project(repo: Path) -> None:
    """The `.mcp.json` the README shows, started the way a client starts it (its command
    and arguments, in the project's directory), serves that project."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"cat > \.mcp\.json <<'?EOF'?\n(.*?)\nEOF\n", readme, re.S)
    assert block, "the README lost its client configuration"
    # an unquoted heredoc: the shell expands $(command -v steptrail) and $PWD (the project)
    shown = block[1].replace("$(command -v steptrail)", steptrail_command())
    shown = shown.replace("$PWD", str(repo))
    entry = json.loads(shown)["mcpServers"]["steptrail"]
    assert entry["command"] in ("steptrail", steptrail_command())
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
            assert [w.name for w in led.workspaces.list()] == ["repo"]
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
        assert led.workspaces.lease("repo").live  # the dead server's lease
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
    async def go(url: str) -> None:
        async with Client(url) as client:
            r = await client.call_tool("read_text_file", {"path": "notes.txt"})
            assert not r.is_error and r.structured_content["content"] == "notes\n"
            r = await client.call_tool("write_file", {"path": "notes.txt",
                                                      "content": "over http\n"})
            assert not r.is_error, text(r)
        assert (repo / "notes.txt").read_text() == "over http\n"

    with _http_server(repo) as url:
        run(go, url)
    verify_clean(repo)


def test_http_refuses_a_non_loopback_bind(repo: Path) -> None:
    out = cli("mcp", "--workspace", str(repo), "--http", "--host", "0.0.0.0")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "no authentication" in out.stderr
    assert "--allow-remote" in out.stderr
    assert not (repo / ".steptrail").exists()


# -- every request answered; one bound on both transports (issue 26, item 13) ----------


def _raw_session(repo: Path) -> subprocess.Popen[bytes]:
    """A server over stdio, initialized by a client that writes raw lines."""
    proc = subprocess.Popen([steptrail_command(), "mcp", "--workspace", str(repo)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=server_env())
    _send_line(proc, json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}))
    assert _next_answer(proc, 60) is not None
    _send_line(proc, '{"jsonrpc":"2.0","method":"notifications/initialized"}')
    return proc


def _send_line(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode("utf-8", "surrogatepass") + b"\n")
    proc.stdin.flush()


def _next_answer(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any] | None:
    """The server's next line, decoded; None if none comes within `timeout_s`."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else b""
    return json.loads(line) if line else None


def test_every_request_over_stdio_gets_a_json_rpc_answer(repo: Path) -> None:
    """Lines the SDK's stdio reader dropped without a word — the client waited forever —
    are answered: a parse error (-32700) or an invalid request (-32600), one line, with
    the request's id when it can be recovered, else the null id. Nothing is written and
    the server serves on."""
    call = ('{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"write_file",'
            '"arguments":{"path":"w.txt","content":%s}}}')
    cases: list[tuple[str, str, Any, int]] = [
        ("an integer past 4,300 digits", call % ("1", "9" * 5000), 1, -32700),
        ("nesting too deep for any parser", call % ("2", "[" * 100_000 + "]" * 100_000), 2,
         -32700),
        ("nesting too deep for the SDK's", call % ('"s3"', "[" * 300 + "]" * 300), "s3", -32600),
        ("a lone surrogate", call % ("4", '"a\\ud800b"'), 4, -32600),
        ("a line cut short", (call % ("5", '"x"'))[:-3], 5, -32700),
        ("no jsonrpc member", call.replace('"jsonrpc":"2.0",', "") % ("6", '"x"'), 6, -32600),
        ("a boolean id", call % ("true", '"x"'), None, -32600),
        ("a null id", call % ("null", '"x"'), None, -32600),
        ("a fractional id", call % ("7.5", '"x"'), None, -32600),
        ("an id past 4,300 digits", call % ("8" * 5000, '"x"'), None, -32700),
        ("a batch", "[" + call % ("9", '"x"') + "]", None, -32600),
        ("not JSON", "hello", None, -32700),
    ]
    proc = _raw_session(repo)
    try:
        for why, line, want_id, code in cases:
            _send_line(proc, line)
            got = _next_answer(proc, 10)
            assert got is not None, f"{why}: no answer"
            assert got.get("id", "absent") == want_id and got["error"]["code"] == code, (why, got)
            assert "\n" not in got["error"]["message"], (why, got)
        # A line past the request bound (100 MiB) is read and dropped, holding no more
        # than the bound: a tool call gets a one-line tool error.
        _send_line(proc, call % ("11", '"' + "x" * (100 * 1024 * 1024) + '"'))
        got = _next_answer(proc, 60)
        assert got is not None and got["id"] == 11 and got["result"]["isError"], got
        assert got["result"]["content"][0]["text"] == (
            "write_file: the request is more than 104857600 bytes (100 MiB), the most one"
            " request may carry; nothing was done")
        # A carriage return between tokens is whitespace: the SDK split the line on it.
        _send_line(proc, '{"jsonrpc":"2.0",\r"id":10,"method":"tools/call","params":'
                         '{"name":"status","arguments":{}}}')
        got = _next_answer(proc, 10)
        assert got is not None and got["id"] == 10 and not got["result"]["isError"]
        assert not (repo / "w.txt").exists()
    finally:
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    verify_clean(repo)


@contextlib.contextmanager
def _http_server(repo: Path) -> Any:
    """`steptrail mcp --http` on a free loopback port; yields its URL."""
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
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_one_request_bound_on_both_transports(repo: Path, transport: str) -> None:
    """A 5 MiB write lands over HTTP as over stdio (the SDK's 4 MiB body limit answered
    HTTP 413); past the content bound (16 MiB) and past the request bound (100 MiB as
    sent: 17.5 MiB of control characters, each escaped in 6 bytes) each transport gives
    the same one-line tool error, and nothing is written."""
    mib = 1024 * 1024

    async def session(agent: Any) -> None:
        done = await agent.ok("write_file", path="five.txt", content="5" * (5 * mib))
        assert done["status"] == "applied"
        over_content = await agent.fails("write_file", path="big.txt", content="x" * (17 * mib))
        assert text(over_content).count("\n") == 0 and "more than the 16777216" in text(
            over_content)
        over_request = await agent.fails("write_file", path="big.txt",
                                         content="\x01" * (17 * mib + mib // 2))
        assert text(over_request) == ("write_file: the request is more than 104857600 bytes"
                                      " (100 MiB), the most one request may carry; nothing"
                                      " was done")
        status = await agent.ok("status")  # the server serves on
        assert status

    async def go(url: str | None) -> None:
        if url is None:
            async with over_stdio("--workspace", str(repo)) as agent:
                await session(agent)
        else:
            async with Client(url) as client:
                from mcp_agents import Agent

                await session(Agent(client))

    if transport == "stdio":
        run(go, None)
    else:
        with _http_server(repo) as url:
            run(go, url)
    assert (repo / "five.txt").stat().st_size == 5 * mib
    assert not (repo / "big.txt").exists()
    verify_clean(repo)

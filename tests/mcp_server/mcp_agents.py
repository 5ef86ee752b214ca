"""Helpers for the `steptrail mcp` tests: servers in-process and over stdio, driven
with the official MCP SDK's client (`mcp.Client`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from ledger.mcp.server import SteptrailServer, open_workspaces
from ledger.mcp.service import FileTools, Limits

ROOT = Path(__file__).resolve().parents[2]


def steptrail_command() -> str:
    """The installed `steptrail` console script of this interpreter's environment."""
    beside = Path(sys.executable).with_name("steptrail")
    found = str(beside) if beside.exists() else shutil.which("steptrail")
    assert found, "the steptrail command is not installed (pip install -e '.[test]')"
    return found


def server_env(**extra: str) -> dict[str, str]:
    """The environment a spawned server gets: ours, minus the user's steptrail defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env.update(extra)
    return env


def text(result: CallToolResult) -> str:
    return "\n".join(getattr(b, "text", "") for b in result.content)


class Agent:
    """One MCP client session, with helpers that call a tool and return its result."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, tool: str, **args: Any) -> CallToolResult:
        return await self.client.call_tool(tool, args)

    async def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        r = await self.call(tool, **args)
        assert not r.is_error, (tool, args, text(r))
        assert isinstance(r.structured_content, dict)
        return r.structured_content

    async def fails(self, tool: str, **args: Any) -> CallToolResult:
        r = await self.call(tool, **args)
        assert r.is_error, (tool, args, text(r))
        return r


def make_server(workspaces: list[str], ledger_path: str | None = None,
                limits: Limits | None = None, **kw: Any) -> SteptrailServer:
    ledger, names, given = open_workspaces(workspaces, ledger_path)
    tools = FileTools(ledger, names, given_roots=given, limits=limits, **kw)
    return SteptrailServer(tools)


@contextlib.asynccontextmanager
async def inprocess(workspaces: list[str], ledger_path: str | None = None,
                    **kw: Any) -> AsyncIterator[Agent]:
    """An agent talking to a server of its own in this process (as its own process
    would: its own ledger connection, its own view)."""
    server = make_server(workspaces, ledger_path, **kw)
    try:
        async with Client(server) as client:
            yield Agent(client)
    finally:
        server.tools.close()
        server.tools.ledger.close()


@contextlib.asynccontextmanager
async def over_stdio(*args: str, env: dict[str, str] | None = None,
                     cwd: str | None = None) -> AsyncIterator[Agent]:
    """An agent that spawned `steptrail mcp ARGS` and talks to it over stdio."""
    params = StdioServerParameters(command=steptrail_command(), args=["mcp", *args],
                                   env=env or server_env(), cwd=cwd)
    async with Client(params, read_timeout_seconds=60) as client:
        yield Agent(client)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text('def main():\n    print("v0")\n')
    (root / "README.txt").write_text("hello\n")
    return root


#: `steptrail ARGS...` in a process that stops for good when a write reaches STAGE,
#: once it has written its pid into MARKER (the hook `main` hands `steptrail mcp`):
#: `python -c PAUSED_AT STAGE MARKER ARGS...`.
PAUSED_AT = """
import os, sys, time
import ledger.cli

def pause_at(stage):
    if stage == sys.argv[1]:
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(3600)

ledger.cli.main(sys.argv[3:], obj={"on_stage": pause_at})
"""


async def killed_write(repo: Path, tmp_path: Path, stage: str, tool: str,
                       args: dict[str, Any]) -> None:
    """Start a server that pauses at `stage` (its stage hook) of a write of
    `args["path"]`, which the agent reads first, make the write, and SIGKILL the server
    there."""
    marker = tmp_path / f"paused-{stage}"
    params = StdioServerParameters(
        command=sys.executable, args=["-c", PAUSED_AT, stage, str(marker), "mcp", "--workspace",
                                      str(repo), "--lease-ttl", "10m"], env=server_env())
    with contextlib.suppress(Exception, BaseExceptionGroup):
        async with Client(params, read_timeout_seconds=60) as client:
            agent = Agent(client)
            await agent.ok("read_text_file", path=args["path"])

            async def call() -> None:
                with contextlib.suppress(Exception):
                    await agent.call(tool, **args)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(60):
                    while not marker.exists() or not marker.read_text():
                        await anyio.sleep(0.02)
                os.kill(int(marker.read_text()), signal.SIGKILL)
                tg.cancel_scope.cancel()

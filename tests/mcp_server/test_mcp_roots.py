"""`steptrail mcp` without --workspace: the client's roots are the workspaces.

Driven by the official SDK's client with a `list_roots_callback`, on both protocol eras
(2026-07-28, where every tool call carries the question, and the handshake era, where
the server asks `roots/list` and follows `notifications/roots/list_changed`): roots
that change, no roots, a root that is not file://, a relative or missing path (a typed
error, nothing created), and the notice on stderr — never stdout — when a new ledger
is made in a directory that is not a project.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import ListRootsResult, Root

from mcp_agents import Agent, server_env, steptrail_command, text

from ledger.mcp.server import ClientRoots, SteptrailServer, open_workspaces

MODES = ["auto", "legacy"]  # auto: 2026-07-28 against this server; legacy: 2025-11-25


def run(fn: Any, *args: Any) -> Any:
    with warnings.catch_warnings():  # the SDK marks roots deprecated as of 2026-07-28
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)  # serializing a root it would refuse
        return anyio.run(fn, *args)


class Roots:
    """What the client announces; `asked` counts the roots/list questions answered."""

    def __init__(self, *uris: str) -> None:
        self.uris = list(uris)
        self.asked = 0

    async def __call__(self, _ctx: Any) -> ListRootsResult:
        self.asked += 1
        return ListRootsResult(roots=[root(u) for u in self.uris])


def root(uri: str) -> Root:
    try:
        return Root(uri=uri)
    except ValueError:  # a client may announce what the SDK's model would refuse
        return Root.model_construct(uri=uri, name=None, meta=None)


def project(path: Path, *, git: bool = True) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "src" / "app.py").write_text(f"# {path.name}\n")
    if git:
        (path / ".git").mkdir()
    return path


@contextlib.asynccontextmanager
async def roots_server(roots: Roots | None, mode: str = "auto", ledger_path: str | None = None,
                       notes: list[str] | None = None) -> AsyncIterator[Agent]:
    server = SteptrailServer(None, roots=ClientRoots(
        ledger_path=ledger_path, echo=(notes.append if notes is not None else None)))
    try:
        async with Client(server, mode=mode, list_roots_callback=roots) as client:
            yield Agent(client)
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_the_roots_are_the_workspaces_and_follow_a_change(tmp_path: Path, mode: str) -> None:
    a, b = project(tmp_path / "alpha"), project(tmp_path / "beta")
    roots = Roots(a.as_uri())

    async def go() -> None:
        async with roots_server(roots, mode) as agent:
            dirs = await agent.ok("list_allowed_directories")
            assert [d["path"] for d in dirs["directories"]] == [str(a)]
            read = await agent.ok("read_text_file", path="src/app.py")
            assert read["content"] == "# alpha\n"
            wrote = await agent.ok("write_file", path="src/app.py", content="# alpha 2\n")
            assert (a / "src" / "app.py").read_text() == "# alpha 2\n"
            assert wrote["workspace"] == "alpha"
            assert (a / ".steptrail" / "ledger.db").exists()  # the root's own ledger

            roots.uris = [b.as_uri(), a.as_uri()]
            if mode == "legacy":  # the answer is kept until the client says it changed
                kept = await agent.ok("list_allowed_directories")
                assert [d["path"] for d in kept["directories"]] == [str(a)]
                await agent.client.send_roots_list_changed()
                await anyio.sleep(0.1)
            dirs = await agent.ok("list_allowed_directories")
            assert [d["path"] for d in dirs["directories"]] == [str(b), str(a)]
            assert (await agent.ok("read_text_file", path="src/app.py"))["content"] == "# beta\n"
            # the ledger is the first root's, as with --workspace B --workspace A
            assert (b / ".steptrail" / "ledger.db").exists()
            again = await agent.ok("read_text_file", path=str(a / "src" / "app.py"))
            assert again["content"] == "# alpha 2\n"
            await agent.ok("write_file", path=str(a / "src" / "app.py"), content="# alpha 3\n")
            history = await agent.ok("history", path=str(a / "src" / "app.py"))
            assert len(history["steps"]) == 1  # beta's ledger saw alpha's third write only
        assert roots.asked >= 2

    run(go)


@pytest.mark.parametrize("mode", MODES)
def test_no_roots_is_an_error_naming_the_fix(tmp_path: Path, mode: str) -> None:
    async def go() -> None:
        for roots in (None, Roots()):  # no roots capability; the capability, no roots
            async with roots_server(roots, mode) as agent:
                for tool, args in (("list_allowed_directories", {}),
                                   ("read_text_file", {"path": "a.txt"})):
                    r = await agent.fails(tool, **args)
                    assert r.structured_content["kind"] == "NoRoots"
                    assert "--workspace" in text(r) and "root" in text(r)
                    assert "\n" not in text(r)

    run(go)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("uri", ["https://example.com/repo", "file://relative/dir",
                                 "file:///{missing}", "file:///{file}"])
def test_a_root_that_is_not_a_local_directory_is_a_typed_error(
        tmp_path: Path, mode: str, uri: str) -> None:
    good = project(tmp_path / "good")
    (tmp_path / "plain.txt").write_text("x\n")
    uri = uri.format(missing=str(tmp_path / "no" / "such")[1:],
                     file=str(tmp_path / "plain.txt")[1:])

    async def go() -> None:
        async with roots_server(Roots(good.as_uri(), uri), mode) as agent:
            if mode == "auto" and not uri.startswith("file:"):
                # 2026-07-28: the SDK validates the client's answer with the tools/call
                # retry that carries it, and refuses the request itself (-32602)
                with pytest.raises(MCPError, match="Invalid request parameters"):
                    await agent.call("write_file", path="new.txt", content="x")
                return
            r = await agent.fails("write_file", path="new.txt", content="x")
            doc = r.structured_content
            assert doc["kind"] == "InvalidRoot", doc
            assert doc.get("root", uri) == uri
            assert "nothing was created" in text(r) and "\n" not in text(r)

    run(go)
    assert not (good / ".steptrail").exists() and not (good / "new.txt").exists()
    assert not (tmp_path / "no").exists()


def test_a_new_ledger_outside_a_project_is_said_on_stderr(tmp_path: Path) -> None:
    """In-process: the notice for a root and for --workspace, with the absolute path;
    none for a project (.git) or a ledger that exists."""
    loose, repo = project(tmp_path / "loose", git=False), project(tmp_path / "repo")
    notes: list[str] = []

    async def go() -> None:
        async with roots_server(Roots(loose.as_uri()), notes=notes) as agent:
            await agent.ok("list_allowed_directories")
        async with roots_server(Roots(repo.as_uri()), notes=notes) as agent:
            await agent.ok("list_allowed_directories")

    run(go)
    said = [n for n in notes if "not a project" in n]
    assert len(said) == 1 and str(loose) in said[0], notes
    ledger, _, _ = open_workspaces([str(loose)], None, echo=notes.append)  # exists now
    ledger.close()
    other = project(tmp_path / "other", git=False)
    ledger, _, _ = open_workspaces([str(other)], None, echo=notes.append)
    ledger.close()
    said = [n for n in notes if "not a project" in n]
    assert len(said) == 2 and str(other) in said[1], notes


def test_over_stdio_the_notice_is_on_stderr_and_stdout_stays_the_protocol(
        tmp_path: Path) -> None:
    loose = project(tmp_path / "loose", git=False)
    errlog = tmp_path / "stderr.txt"

    async def go() -> None:
        params = StdioServerParameters(command=steptrail_command(), args=["mcp"],
                                       env=server_env(), cwd=str(tmp_path))
        with errlog.open("w") as err:
            async with Client(stdio_client(params, errlog=err), mode="legacy",
                              list_roots_callback=Roots(loose.as_uri()),
                              read_timeout_seconds=60) as client:
                agent = Agent(client)
                read = await agent.ok("read_text_file", path="src/app.py")
                await agent.ok("write_file", path="src/app.py", content="# v2\n",
                               expectedHash=read["hash"])

    run(go)
    stderr = errlog.read_text()
    assert f"{loose} is not a project" in stderr, stderr
    assert str(loose / ".steptrail" / "ledger.db") in stderr
    assert (loose / "src" / "app.py").read_text() == "# v2\n"


def test_http_without_a_workspace_is_refused(tmp_path: Path) -> None:
    r = subprocess.run([steptrail_command(), "mcp", "--http"], env=server_env(),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--workspace" in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_root_and_ledger_given_registers_the_root_there(tmp_path: Path) -> None:
    a = project(tmp_path / "alpha")
    led = tmp_path / "store" / "ledger.db"

    async def go() -> None:
        async with roots_server(Roots(a.as_uri()), ledger_path=str(led)) as agent:
            st = await agent.ok("status")
            assert st["ledger"] == str(led) and st["workspaces"][0]["root"] == str(a)

    run(go)
    assert not (a / ".steptrail").exists()
    assert json.loads(json.dumps(os.listdir(led.parent)))  # the ledger is where it was named

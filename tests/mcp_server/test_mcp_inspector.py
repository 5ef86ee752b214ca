"""`steptrail mcp` driven by a client nobody here wrote: the MCP Inspector's CLI.

The inspector (npm ``@modelcontextprotocol/inspector``, pinned in
tools/ci/install_node_tools.sh, installed into .ci/node/) spawns the server over stdio for
each call: tools/list, a read, a write fenced with ``expectedHash`` (each call is a new
server, so the hash a read returned is the fence), the same write again — stale, refused
with a conflict and nothing written — history, undo, and a server started without
--workspace that serves the root the inspector announces. Skipped where node or the
inspector is missing, unless STEPTRAIL_REQUIRE_NODE=1 (CI), which fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcp_agents import ROOT, server_env, steptrail_command

INSPECTOR_VERSION = "2.12.0"  # as tools/ci/install_node_tools.sh pins it
PREFIX = ROOT / ".ci" / "node"
BIN = PREFIX / "node_modules" / ".bin"
INSPECTOR = BIN / "mcp-inspector"
HINT = "run tools/ci/install_node_tools.sh"


def _node_env(home: Path) -> dict[str, str]:
    env = server_env(HOME=str(home), MCP_INSPECTOR_SECRET_STORE="memory", NO_COLOR="1")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # a project-local node first
    return env


def _missing() -> str | None:
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("node", path=path) is None:
        return f"node is not installed ({HINT})"
    if not INSPECTOR.exists():
        return f"the MCP Inspector is not in {PREFIX} ({HINT})"
    return None


@pytest.fixture(scope="module")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment to run the inspector in; skips (or fails, under
    STEPTRAIL_REQUIRE_NODE=1) where it cannot run."""
    why = _missing()
    if why is not None:
        if os.environ.get("STEPTRAIL_REQUIRE_NODE") == "1":
            pytest.fail(f"STEPTRAIL_REQUIRE_NODE=1 but {why}")
        pytest.skip(why)
    env = _node_env(tmp_path_factory.mktemp("inspector-home"))
    got = subprocess.run([str(INSPECTOR), "--cli", "--version"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert got.stdout.strip() == INSPECTOR_VERSION, (got.stdout, got.stderr, HINT)
    return env


def inspect(env: dict[str, str], *args: str, target: list[str] | None = None,
            ok: bool = True) -> dict[str, Any]:
    """One inspector call (it spawns `steptrail mcp` and ends it): its JSON result."""
    cmd = [str(INSPECTOR), "--cli", "--format", "json", *(target or []), *args]
    got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert got.stdout.strip(), (cmd, got.returncode, got.stderr)
    doc = json.loads(got.stdout)
    assert "result" in doc, (cmd, doc, got.stderr)
    result = doc["result"]
    if "isError" in result:  # a tool call: the exit code says whether it failed
        assert result["isError"] is (not ok), (cmd, result)
        assert (got.returncode == 0) is ok, (cmd, got.returncode, got.stderr)
    else:
        assert got.returncode == 0, (cmd, got.returncode, got.stderr)
    return result


def call(env: dict[str, str], target: list[str], tool: str, ok: bool = True,
         **args: Any) -> dict[str, Any]:
    result = inspect(env, "--method", "tools/call", "--tool-name", tool,
                     "--tool-args-json", json.dumps(args), target=target, ok=ok)
    return result["structuredContent"]


def test_the_inspector_drives_a_fenced_session(inspector: dict[str, str], tmp_path: Path
                                               ) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    app = repo / "app.py"
    app.write_text("print('v0')\n")
    target = [steptrail_command(), "mcp", "--workspace", str(repo)]

    tools = {t["name"] for t in inspect(inspector, "--method", "tools/list",
                                        target=target)["tools"]}
    assert {"read_text_file", "write_file", "edit_file", "history", "undo", "status"} <= tools

    read = call(inspector, target, "read_text_file", path="app.py")
    assert read["content"] == "print('v0')\n"
    wrote = call(inspector, target, "write_file", path="app.py", content="print('v1')\n",
                 expectedHash=read["hash"], requestId="inspector-1")
    assert wrote["status"] == "applied" and app.read_text() == "print('v1')\n"

    stale = call(inspector, target, "write_file", ok=False, path="app.py",
                 content="print('v2')\n", expectedHash=read["hash"])
    assert stale["status"] == "conflict" and stale["reason"] == "pre_hash"
    assert app.read_text() == "print('v1')\n"  # nothing written

    history = call(inspector, target, "history", path="app.py")
    outcomes = {s["step"]: s["outcome"] for s in history["steps"]}
    assert outcomes[wrote["step"]] == "committed"
    # (the server observed at its first lease: the workspace's baseline, committed)
    [baseline] = [s for s in outcomes if s.startswith("observed-")]
    assert outcomes.pop(baseline) == "committed"
    assert sorted(outcomes.values()) == ["committed", "refused"]

    undone = call(inspector, target, "undo", step=wrote["step"])
    assert undone["status"] == "undone" and app.read_text() == "print('v0')\n"


def test_the_inspector_announces_the_root_a_server_without_workspace_serves(
        inspector: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "notes.txt").write_text("hello\n")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"steptrail": {
        "command": steptrail_command(), "args": ["mcp"],
        "roots": [{"uri": project.as_uri(), "name": "project"}]}}}))
    target = ["--config", str(config), "--server", "steptrail"]

    read = call(inspector, target, "read_text_file", path="notes.txt")
    assert read["content"] == "hello\n"
    assert (project / ".steptrail" / "ledger.db").exists()
    none = call(inspector, [steptrail_command(), "mcp"], "list_allowed_directories",
                ok=False)  # the inspector announces the roots capability, and no roots
    assert none["kind"] == "NoRoots"

"""Red team: `steptrail mcp` without --workspace (the client's roots) and `steptrail status`.

Each attack that succeeds is an ``xfail(strict=True)`` test asserting what should hold
(it fails today; it passes once fixed, and strict turns that into a failure to be
un-marked). Each attack that held is a plain passing test.

Roots: a hostile or buggy client announces what it likes; a local attacker controls
names and symlinks on the way. Status: every name the library admits (step ids,
workspace names and roots, holders) is printed to a terminal, and its "next" commands
are meant to be copied into a shell.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import LedgerAt, run_cli, snapshot_dir
from mcp_agents import server_env, steptrail_command, text
from test_cli_status import World
from test_mcp_roots import Roots, project, roots_server, run

from ledger import Ledger, StepPlan

MODES = ["auto", "legacy"]


# -- helpers ------------------------------------------------------------------------------


def ledger_bytes(path: Path) -> bytes:
    return path.read_bytes()


def raw_controls(out: str) -> list[str]:
    """The characters of `out` a terminal acts on rather than shows: C0/C1 controls
    (newline aside) and format characters (bidi overrides, isolates, zero-width)."""
    return [repr(c) for c in out if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


# =========================================================================================
# 1. MCP roots
# =========================================================================================


@pytest.mark.parametrize("mode", MODES)
def test_another_roots_ledger_cannot_be_overwritten_after_the_roots_reorder(
        tmp_path: Path, mode: str) -> None:
    a, b = project(tmp_path / "alpha"), project(tmp_path / "beta")
    roots = Roots(a.as_uri())
    led = a / ".steptrail" / "ledger.db"
    outcome: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(roots, mode) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            await agent.ok("write_file", path="src/app.py", content="# alpha 2\n")
            before = ledger_bytes(led)
            outcome["before"] = before
            roots.uris = [b.as_uri(), a.as_uri()]
            if mode == "legacy":
                await agent.client.send_roots_list_changed()
                await anyio.sleep(0.1)
            info = await agent.call("get_file_info", path=str(led))
            outcome["info_error"] = info.is_error
            if not info.is_error:
                wrote = await agent.call("write_file", path=str(led), content="gone",
                                         expectedHash=info.structured_content["hash"])
                outcome["write_error"] = wrote.is_error

    run(go)
    assert outcome.get("info_error", True) or outcome.get("write_error", True), outcome
    assert led.read_bytes()[:16] == b"SQLite format 3\x00"  # A's history is intact


@pytest.mark.parametrize("mode", MODES)
def test_a_root_that_is_a_ledgers_directory_is_refused(tmp_path: Path, mode: str) -> None:
    a = project(tmp_path / "alpha")
    roots = Roots(a.as_uri())
    led = a / ".steptrail" / "ledger.db"
    seen: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(roots, mode) as agent:
            await agent.ok("list_allowed_directories")  # A's ledger exists now
        roots.uris = [(a / ".steptrail").as_uri()]
        async with roots_server(roots, mode) as agent:
            info = await agent.call("get_file_info", path="ledger.db")
            seen["info"] = (info.is_error, info.structured_content)
            if not info.is_error:
                gone = await agent.call("delete_file", path="ledger.db",
                                        expectedHash=info.structured_content["hash"])
                seen["delete"] = gone.is_error
            r = await agent.call("list_allowed_directories")
            seen["kind"] = (r.structured_content or {}).get("kind")

    run(go)
    assert led.exists(), seen
    assert seen["kind"] == "InvalidRoot", seen
    assert not (a / ".steptrail" / ".steptrail").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_git_directory_root_is_refused(tmp_path: Path, mode: str) -> None:
    a = project(tmp_path / "alpha")
    (a / ".git" / "config").write_text("[core]\n\tbare = false\n")
    got: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(Roots((a / ".git").as_uri()), mode) as agent:
            r = await agent.call("read_text_file", path="config")
            got["read"] = r.is_error
            if not r.is_error:
                w = await agent.call("write_file", path="config",
                                     content="[core]\n\tfsmonitor = touch /tmp/pwned-by-rt\n")
                got["write"] = w.is_error
            got["kind"] = (r.structured_content or {}).get("kind")

    run(go)
    assert "fsmonitor" not in (a / ".git" / "config").read_text(), got
    assert got["kind"] == "InvalidRoot", got
    assert not (a / ".git" / ".steptrail").exists()


@pytest.mark.parametrize("mode", MODES)
def test_the_file_system_root_is_refused(tmp_path: Path, mode: str) -> None:
    led = tmp_path / "store" / "ledger.db"
    got: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(Roots("file:///"), mode, ledger_path=str(led)) as agent:
            r = await agent.call("get_file_info", path="/etc/hostname")
            got["error"], got["doc"] = r.is_error, r.structured_content

    run(go)
    assert got["error"] and got["doc"].get("kind") == "InvalidRoot", got


@pytest.mark.parametrize("mode", MODES)
def test_a_root_that_is_not_utf8_is_a_typed_error_and_creates_nothing(
        tmp_path: Path, mode: str) -> None:
    bad = os.fsencode(str(tmp_path)) + b"/bad\xff"
    os.mkdir(bad)
    got: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(Roots(f"file://{tmp_path}/bad%FF"), mode) as agent:
            r = await agent.call("list_allowed_directories")
            got["error"], got["text"], got["doc"] = r.is_error, text(r), r.structured_content

    run(go)
    assert got["error"] and (got["doc"] or {}).get("kind") == "InvalidRoot", got
    assert os.listdir(bad) == []


def test_thousands_of_roots_are_refused_or_answered_promptly(tmp_path: Path) -> None:
    dirs = []
    for i in range(800):
        d = tmp_path / f"d{i:04d}"
        d.mkdir()
        dirs.append(d)
    got: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(Roots(*(d.as_uri() for d in dirs)), "legacy") as agent:
            started = time.monotonic()
            r = await agent.call("list_allowed_directories")
            got["s"], got["error"] = time.monotonic() - started, r.is_error

    run(go)
    assert got["s"] < 5, got


@pytest.mark.parametrize("mode", MODES)
def test_a_root_holding_the_open_ledger_keeps_the_ledger_out_of_reach(
        tmp_path: Path, mode: str) -> None:
    """Held: with --ledger inside the announced root (and as a second root, the ledger's
    own directory), the open ledger's files are refused to every tool and the ledger's
    directory is refused as a root."""
    top = project(tmp_path / "top")
    store = top / "store"
    store.mkdir()
    led = store / "ledger.db"
    got: dict[str, Any] = {}

    async def go() -> None:
        async with roots_server(Roots(top.as_uri()), mode, ledger_path=str(led)) as agent:
            for tool, args in (("get_file_info", {"path": "store/ledger.db"}),
                               ("write_file", {"path": "store/ledger.db", "content": "x",
                                               "expectedHash": "absent"}),
                               ("delete_file", {"path": "store/ledger.db"}),
                               ("list_directory", {"path": "store"})):
                r = await agent.call(tool, **args)
                assert r.is_error and "ledger" in text(r), (tool, text(r))
        async with roots_server(Roots(store.as_uri()), mode, ledger_path=str(led)) as agent:
            r = await agent.call("list_allowed_directories")
            got["second"] = (r.is_error, text(r))

    run(go)
    assert led.read_bytes()[:16] == b"SQLite format 3\x00"
    assert got["second"][0], got


@pytest.mark.parametrize("mode", MODES)
def test_a_narrowed_set_of_roots_confines_the_next_call(tmp_path: Path, mode: str) -> None:
    """Held: after [A, B] -> [B] (same --ledger), an absolute path into A is refused for
    read and write, and nothing lands in A."""
    a, b = project(tmp_path / "alpha"), project(tmp_path / "beta")
    led = tmp_path / "store" / "ledger.db"
    roots = Roots(a.as_uri(), b.as_uri())

    async def go() -> None:
        async with roots_server(roots, mode, ledger_path=str(led)) as agent:
            await agent.ok("read_text_file", path=str(a / "src" / "app.py"))
            roots.uris = [b.as_uri()]
            if mode == "legacy":
                await agent.client.send_roots_list_changed()
                await anyio.sleep(0.1)
            for tool, args in (("read_text_file", {"path": str(a / "src" / "app.py")}),
                               ("write_file", {"path": str(a / "src" / "app.py"),
                                               "content": "escaped\n"}),
                               ("write_file", {"path": str(a / "new.txt"), "content": "x"}),
                               ("list_directory", {"path": str(a)})):
                r = await agent.fails(tool, **args)
                assert "outside every workspace" in text(r), text(r)
            dirs = await agent.ok("list_allowed_directories")
            assert [d["path"] for d in dirs["directories"]] == [str(b)]

    run(go)
    assert (a / "src" / "app.py").read_text() == "# alpha\n" and not (a / "new.txt").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_symlink_root_swapped_after_it_was_served_keeps_the_first_target(
        tmp_path: Path, mode: str) -> None:
    """Held: the root is registered by identity at the first call; a symlink swapped
    to another directory afterwards (before or after list_changed) reaches nothing
    of the new target."""
    x, y = project(tmp_path / "x"), project(tmp_path / "y")
    (y / "secret.txt").write_text("SECRET\n")
    link = tmp_path / "link"
    link.symlink_to(x)
    roots = Roots(link.as_uri())

    async def go() -> None:
        async with roots_server(roots, mode) as agent:
            await agent.ok("list_allowed_directories")
            link.unlink()
            link.symlink_to(y)
            for _ in range(2):
                for p in ("secret.txt", str(link / "secret.txt")):
                    r = await agent.call("read_text_file", path=p)
                    assert r.is_error and "SECRET" not in text(r), text(r)
                w = await agent.call("write_file", path="dropped.txt", content="x")
                if mode == "legacy":
                    await agent.client.send_roots_list_changed()
                    await anyio.sleep(0.1)
            del w

    run(go)
    assert not (y / "dropped.txt").exists() and not (y / ".steptrail").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_root_removed_and_recreated_is_refused_not_written(tmp_path: Path, mode: str) -> None:
    a = project(tmp_path / "alpha")

    async def go() -> None:
        async with roots_server(Roots(a.as_uri()), mode) as agent:
            await agent.ok("read_text_file", path="src/app.py")
            shutil.rmtree(a)
            project(a)
            for tool, args in (("read_text_file", {"path": "src/app.py"}),
                               ("write_file", {"path": "new.txt", "content": "x"})):
                r = await agent.fails(tool, **args)
                assert "not the directory it was registered as" in text(r), text(r)
                assert "\n" not in text(r).strip()

    run(go)
    assert not (a / "new.txt").exists()


@pytest.mark.parametrize("mode", MODES)
def test_encoded_tricks_in_a_root(tmp_path: Path, mode: str) -> None:
    """Held: %00 is refused with nothing created; file://localhost/ and file:////path
    name the same directory; a dot segment through a symlink is resolved lexically
    (never to the parent of the symlink's target)."""
    a = project(tmp_path / "alpha")
    elsewhere = project(tmp_path / "far" / "deep")
    (a / "lnk").symlink_to(elsewhere)

    async def served(uri: str) -> list[str]:
        async with roots_server(Roots(uri), mode) as agent:
            dirs = await agent.ok("list_allowed_directories")
            return [d["path"] for d in dirs["directories"]]

    async def go() -> None:
        assert await served(f"file://localhost{a}") == [str(a)]
        assert await served(f"file:///{a}") == [str(a)]
        async with roots_server(Roots(f"file://{a}%00/x"), mode) as agent:
            r = await agent.fails("write_file", path="n.txt", content="x")
            assert r.structured_content["kind"] == "InvalidRoot"
            assert "nothing was created" in text(r)
        # a dot segment after a symlink: the URL parser drops it lexically
        assert await served(f"file://{a}/lnk/%2e%2e") in ([str(a)], [])

    run(go)
    assert not (tmp_path / "far" / ".steptrail").exists()
    assert not (elsewhere / ".steptrail").exists()


class RawStdio:
    """`steptrail mcp` (no --workspace) spoken to line by line over its pipes, on the
    handshake-era protocol: every stdout line kept for inspection."""

    def __init__(self, cwd: Path, errlog: Path) -> None:
        self.err = errlog.open("wb")
        self.proc = subprocess.Popen([steptrail_command(), "mcp"], cwd=cwd, env=server_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err)
        self.lines: list[bytes] = []
        self._next = 0
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 60) -> dict[str, Any]:
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self.lines) > self._next, timeout)
            assert ok, "the server did not answer (a hang)"
            line = self.lines[self._next]
            self._next += 1
        return json.loads(line)

    def call(self, rid: int, tool: str, args: dict[str, Any], roots: list[str]) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                   "params": {"name": tool, "arguments": args}})
        while True:
            msg = self.recv()
            if msg.get("method") == "roots/list":
                self.send({"jsonrpc": "2.0", "id": msg["id"],
                           "result": {"roots": [{"uri": u} for u in roots]}})
            elif msg.get("id") == rid:
                return msg

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.err.close()
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def test_hostile_roots_over_stdio_keep_stdout_the_protocol_and_never_hang(
        tmp_path: Path) -> None:
    """Held: roots with a host, a NUL, a missing path, a file, a non-file scheme, a
    relative path and a malformed answer each get a one-line error for the call; every
    stdout line is a JSON-RPC message; no traceback on stderr; nothing is created."""
    good = project(tmp_path / "good")
    (tmp_path / "plain.txt").write_text("x\n")
    srv = RawStdio(tmp_path, tmp_path / "stderr.txt")
    try:
        srv.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}},
            "clientInfo": {"name": "rt", "version": "1"}}})
        assert srv.recv()["id"] == 0
        srv.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        hostile = [["file://evil.example/etc"], [f"file://{good}%00x"],
                   [f"file://{tmp_path}/missing"], [f"file://{tmp_path}/plain.txt"],
                   ["http://x/y"], ["file:relative/dir"]]
        rid = 1
        for roots in hostile:
            got = srv.call(rid, "write_file", {"path": "pwn.txt", "content": "x"}, roots)
            result = got.get("result") or {}
            assert result.get("isError") or "error" in got, got
            rid += 1
            srv.send({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
        # a malformed answer: roots is not a list
        srv.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                  "params": {"name": "status", "arguments": {}}})
        while True:
            msg = srv.recv()
            if msg.get("method") == "roots/list":
                srv.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"roots": "nope"}})
            elif msg.get("id") == rid:
                assert msg["result"]["isError"], msg
                break
    finally:
        srv.close()
    for line in srv.lines:
        json.loads(line)  # stdout is the protocol only
    err = (tmp_path / "stderr.txt").read_text(errors="replace")
    assert "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["good", "plain.txt", "stderr.txt"]
    assert not (good / ".steptrail").exists() and not (good / "pwn.txt").exists()


def test_a_root_name_with_escape_sequences_is_escaped_on_stderr(tmp_path: Path) -> None:
    good = project(tmp_path / "good")
    evil = tmp_path / "esc\x1b]0;PWNED\x07"
    evil.mkdir()
    srv = RawStdio(tmp_path, tmp_path / "stderr.txt")
    try:
        srv.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
            "clientInfo": {"name": "rt", "version": "1"}}})
        srv.recv()
        srv.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        uri = good.as_uri()
        evil_uri = "file://" + urllib.parse.quote(str(evil))
        got = srv.call(1, "list_allowed_directories", {}, [uri, evil_uri])
        assert not got["result"]["isError"], got
    finally:
        srv.close()
    err = (tmp_path / "stderr.txt").read_text()
    assert "PWNED" in err  # the notice names it ...
    assert "\x1b" not in err and "\x07" not in err, repr(err)  # ... escaped


# =========================================================================================
# 2. steptrail status
# =========================================================================================


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> World:
    return World(tmp_path, ledger_at)


def test_a_workspace_root_with_escape_sequences_is_escaped(tmp_path: Path) -> None:
    location = str(tmp_path / "ledger.db")
    evil = tmp_path / "repo\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;PWNED\x07"
    evil.mkdir()
    assert run_cli(["--ledger", location, "init"]).code == 0
    assert run_cli(["--ledger", location, "workspace", "add", "evil", str(evil)]).code == 0
    r = run_cli(["--ledger", location, "status"])
    assert r.code == 0 and "PWNED" in r.out
    assert raw_controls(r.out) == [], raw_controls(r.out)


def test_bidi_and_c1_characters_in_step_ids_and_holders_are_escaped(world: World) -> None:
    epoch = world.acquire(holder="agent\u202e  gnitirw si ti ,ecrof-- ON")
    world.fenced("edit\u009b2J\u2066-1", epoch, b"v1\n")
    r = world.status()
    assert "edit" in r.out
    assert raw_controls(r.out) == [], raw_controls(r.out)


def test_a_step_id_starting_with_a_dash_gets_a_working_next_command(world: World) -> None:
    epoch = world.acquire()
    world.fenced("-edit-1", epoch, b"v1\n")
    doc = world.doc()
    (step,) = doc["workspaces"][0]["steps"]
    assert step["state"] == "fenced"
    done = world.run_printed(step["next"])
    assert [d.code for d in done] == [0], done
    (after,) = world.doc()["workspaces"][0]["steps"]
    assert after["state"] == "manifest-published"


HOSTILE = ["$(touch PWN1)", "`touch PWN2`", "x;touch PWN3", "q'uo\"te", "a b",
           "$USER", "x\\ny", "!!", "*", "~root", "-"]


def test_printed_commands_are_safe_to_paste_into_a_shell(tmp_path: Path) -> None:
    """Held: step ids, workspace names and holders full of shell syntax come out of
    status's NEXT commands as exactly one word each when bash runs the line (with
    `steptrail` a function that records its argv): nothing runs, nothing expands but
    the intended "$USER"."""
    location = str(tmp_path / "ledger.db")
    assert run_cli(["--ledger", location, "init"]).code == 0
    name = "ws;$(touch PWN0)`x`"
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "app.py").write_text("v0\n")
    assert run_cli(["--ledger", location, "workspace", "add", name, str(tmp_path / "w")]).code == 0
    with Ledger.open(location) as led:
        lease = led.workspaces.acquire(name, holder="$(touch PWNH)", ttl_s=600)
        read = led.workspaces.read_file(name, "app.py")
        # one in-flight step of the workspace; the others artifact-only (planned)
        led.workspaces.admit(name, lease.epoch, [StepPlan(HOSTILE[0], [read.write(b"v1\n")])])
        for step in HOSTILE[1:]:
            led.plan(step, artifacts=["a.txt"])
    doc = run_cli(["--ledger", location, "status", "--json"]).json
    commands = list(doc["next"]) + [w["takeover"] for w in doc["workspaces"] if w["takeover"]]
    assert len(commands) >= len(HOSTILE)
    work = tmp_path / "sh"
    work.mkdir()
    for cmd in commands:
        script = ('steptrail() { for a in "$@"; do printf "%s\\0" "$a"; done; }; '
                  f"{cmd.replace(' && ', ' ; ')}")
        out = subprocess.run(check=False, args=["bash", "--norc", "--noprofile", "-c", script], cwd=work,
                             capture_output=True, env={"USER": "me", "PATH": os.environ["PATH"]},
                             timeout=30)
        assert out.returncode == 0, out
        argv = out.stdout.split(b"\0")[:-1]
        expect = [a.encode() for part in cmd.split(" && ")
                  for a in shlex.split(part.replace('"$USER"', "me"))[1:]]
        assert argv == expect, (cmd, argv)
    assert os.listdir(work) == [] and not any(p.name.startswith("PWN") for p in tmp_path.iterdir())


@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_no_form_of_a_postgres_password_is_printed(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Held: a password in the URL's user info (percent-encoded), in its query string, and
    in a keyword/value string never reaches status's output (text, JSON, the commands)."""
    w = World(tmp_path, ledger_at)
    w.acquire()
    w.fenced("edit-1", 1, b"v1\n")
    url = urllib.parse.urlsplit(w.location)
    q = urllib.parse.parse_qs(url.query)
    marker = "pw4RT%2Fmark%40er"
    forms = [
        w.location.replace("steptrail@", f"steptrail:{marker}@", 1),
        w.location + ("&" if url.query else "?") + "password=pw4RTq",
        w.location + ("&" if url.query else "?") + "PassWord=pw4RTQ&sslpassword=pw4RTs",
        " ".join([f"host={url.hostname}", f"port={url.port}", f"user={url.username}",
                  f"dbname={url.path.lstrip('/')}", "password='pw4RT k'",
                  *(f"{k}={v[0]}" for k, v in q.items())]),
    ]
    for loc in forms:
        for extra in ([], ["--json"]):
            r = run_cli(["--ledger", loc, "status", *extra])
            assert r.code == 0 or "PassWord" in loc, (loc, r)  # libpq keys are lower case
            assert "pw4RT" not in r.out + r.err and "mark" not in r.out + r.err, (loc, r.out)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def other_users_steptrail(scratch: Path) -> list[str]:
    """A `steptrail` command another user can run: this checkout's `ledger` package and
    the core dependencies copied into `scratch` (world-readable), run by this
    interpreter. The checkout and its venv may sit in a directory only its owner can
    enter (a 0700 home, `mktemp -d`): a test must not depend on where it was cloned
    (issue 37). The interpreter itself must be reachable (a system or shared one)."""
    import importlib.util
    import ledger

    prog = scratch / "prog"
    prog.mkdir()
    sources = [Path(ledger.__file__).parent]
    for name in ("apsw", "msgspec", "click", "sqlite_utils", "sqlite_fts4", "tabulate",
                 "dateutil", "click_default_group", "pluggy", "six"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)  # a package's directory; a module's file
        sources.append(origin.parent if spec.submodule_search_locations else origin)
    for src in sources:
        if src.is_dir():
            shutil.copytree(src, prog / src.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, prog / src.name)
    for p in [prog, *prog.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    python = os.path.realpath(sys.executable)
    probe = subprocess.run([*AS_NOBODY, python, "-c", "pass"], capture_output=True,
                           timeout=60, check=False)
    if probe.returncode != 0:
        pytest.skip(f"the interpreter {python} is not reachable by another user")
    return [python, "-c", f"import sys; sys.path.insert(0, {str(prog)!r});"
            " from ledger.cli import main; sys.exit(main())"]


@pytest.fixture
def scratch() -> Any:
    """A directory another user can reach (pytest's tmp_path is 0700 up the tree)."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="rt-status-ro-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        for p in d.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o700)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run status as another user")
def test_status_on_a_read_only_directory_and_a_0400_ledger_changes_nothing(
        scratch: Path) -> None:
    """Held: a ledger with a step in flight and its commits still in the -wal (a writer
    killed), its directory 0500 and every file 0400, owned by the user who runs status:
    status answers, and no byte, mode or mtime changes."""
    steptrail = other_users_steptrail(scratch)
    d = scratch / "l"
    location = str(d / "ledger.db")
    (scratch / "w").mkdir()
    (scratch / "w" / "app.py").write_text("v0\n")
    assert run_cli(["--ledger", location, "init", "--parents"]).code == 0
    assert run_cli(["--ledger", location, "workspace", "add", "w", str(scratch / "w")]).code == 0
    assert run_cli(["--ledger", location, "--workspace", "w", "lease", "acquire",
                    "--holder", "a1", "--ttl", "10m", "--no-observe"]).code == 0
    killed = subprocess.run(check=False, args=[sys.executable, "-c", DIES, location], capture_output=True,
                            timeout=60)
    assert killed.returncode == -9, killed.stderr
    assert os.path.getsize(location + "-wal") > 0
    for p in [scratch, scratch / "w", d, *d.iterdir()]:
        os.chown(p, 65534, 65534)
    for p in d.iterdir():
        p.chmod(0o400)
    d.chmod(0o500)
    scratch.chmod(0o755)

    def state() -> dict[str, Any]:
        return {p.name: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
                for p in sorted(d.iterdir())}

    before = state()
    try:
        for extra in ([], ["--json"]):
            r = subprocess.run(check=False, args=[*AS_NOBODY, *steptrail, "--ledger", location,
                                "status", *extra], capture_output=True, text=True,
                               timeout=60, env={"PATH": "/usr/bin:/bin"})
            assert r.returncode == 0, r.stderr
            assert "edit-1" in r.stdout and "Traceback" not in r.stderr
        assert state() == before
    finally:
        d.chmod(0o700)


DIES = """
import os, signal, sys
from ledger import Ledger, StepPlan
ledger = Ledger.open(sys.argv[1])
read = ledger.workspaces.read_file("w", "app.py")
ledger.workspaces.admit("w", 1, [StepPlan("edit-1", [read.write(b"v1\\n")])])
assert ledger.workspaces.apply("edit-1", epoch=1).verdict == "applied"
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run status as another user")
def test_a_read_only_ledger_without_its_shm_is_not_called_not_a_ledger(scratch: Path) -> None:
    steptrail = other_users_steptrail(scratch)
    d = scratch / "l"
    location = str(d / "ledger.db")
    (scratch / "w").mkdir()
    (scratch / "w" / "app.py").write_text("v0\n")
    assert run_cli(["--ledger", location, "init", "--parents"]).code == 0
    assert run_cli(["--ledger", location, "workspace", "add", "w", str(scratch / "w")]).code == 0
    assert run_cli(["--ledger", location, "--workspace", "w", "lease", "acquire",
                    "--holder", "a1", "--ttl", "10m"]).code == 0
    subprocess.run(check=False, args=[sys.executable, "-c", DIES, location], capture_output=True, timeout=60)
    os.remove(location + "-shm")
    for p in [scratch, scratch / "w", d, *d.iterdir()]:
        os.chown(p, 65534, 65534)
    for p in d.iterdir():
        p.chmod(0o400)
    d.chmod(0o500)
    scratch.chmod(0o755)
    try:
        r = subprocess.run(check=False, args=[*AS_NOBODY, *steptrail, "--ledger", location, "status"],
                           capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin"})
        assert "not a steptrail ledger" not in r.stderr, r.stderr
        assert r.returncode == 2 and "AccessDenied" in r.stderr and "-shm" in r.stderr, r.stderr
    finally:
        d.chmod(0o700)


def test_status_json_and_text_do_not_touch_the_directory(world: World) -> None:
    """Held: status (text and --json) on an idle ledger adds and changes no file."""
    before = snapshot_dir(world.tmp)
    world.status()
    world.doc()
    after = snapshot_dir(world.tmp)
    assert {k: v for k, v in after.items() if not k.endswith(("-shm", "-wal"))} == \
        {k: v for k, v in before.items() if not k.endswith(("-shm", "-wal"))}

"""examples/ runs as printed: each example is run the way a reader runs it — a process of
this environment's python or steptrail, in a temporary directory — and checked by its
output and by the state it leaves (the files, `steptrail verify`, `steptrail audit`).

- agent_loop.py: SIGKILLed at a known point (its `--pause-at` marker) and at whatever
  point a kill after a few lines of output lands; the re-run loses and repeats no edit.
- two_workers_postgres.py: on a throwaway PostgreSQL server (skipped with the install
  hint without the binaries; a failure under STEPTRAIL_REQUIRE_PG=1).
- langgraph_graph.py: the takeover refuses the stale worker; prune + gc reclaim.
- outside_edits.py: a person's `sed -i` and `rm` between an agent's steps are observed,
  in the history, undone and restored.
- mcp/: each client configuration, its placeholder paths rewritten, starts a server a
  client lists tools of and reads a file through.
- schedule/: the exact command lines of the cron file and the systemd service run
  against a ledger; `systemd-analyze verify` accepts the units (when it is installed).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from docblocks import needs_extra

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable  # the venv's python: the tests run in it
STEPTRAIL = str(Path(sys.executable).with_name("steptrail"))
TIMEOUT = 120


def clean_env() -> dict[str, str]:
    """Our environment without the user's steptrail defaults (a reader's shell)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}


def run(*argv: str, cwd: Path | None = None, timeout: float = TIMEOUT
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)


def steptrail(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run(STEPTRAIL, *args, cwd=cwd)


def assert_clean(ledger: str, cwd: Path | None = None) -> None:
    """`steptrail verify` and `steptrail audit` of the ledger both exit 0."""
    for command in (["verify", "--json"], ["audit", "--json"]):
        out = steptrail("--ledger", ledger, *command, cwd=cwd)
        assert out.returncode == 0, (command, out.stdout, out.stderr)
        assert json.loads(out.stdout)["ok"] is True, out.stdout


class Lines:
    """A process's stdout, line by line, with a timeout (a reader thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._q.put(line.rstrip("\n"))
            self._q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def next(self, timeout: float = 60) -> str | None:
        line = self._q.get(timeout=timeout)
        if line is not None:
            self.seen.append(line)
        return line

    def until(self, pattern: str, timeout: float = 60) -> str:
        while (line := self.next(timeout)) is not None:
            if re.search(pattern, line):
                return line
        raise AssertionError(f"the process ended before printing {pattern!r}: {self.seen}")


# -- agent_loop.py ---------------------------------------------------------------------

AGENT_LOOP = str(EXAMPLES / "agent_loop.py")


def changelog(edits: int) -> str:
    return "# Changelog\n" + "".join(f"- edit {i}: bumped to 0.{i}\n" for i in range(1, edits + 1))


def check_agent_loop_final(project: Path, edits: int) -> None:
    assert (project / "CHANGELOG.md").read_text() == changelog(edits)  # no loss, no repeat
    assert (project / "VERSION").read_text() == f"0.{edits}\n"
    db = str(project / ".steptrail" / "ledger.db")
    steps = json.loads(steptrail("--ledger", db, "steps", "--json").stdout)
    assert {s["step_id"]: s["state"] for s in steps} == {
        f"edit-{i}": "acked" for i in range(1, edits + 1)}
    assert_clean(db)


@pytest.mark.parametrize("pause_at", [1, 3, 5])
def test_agent_loop_killed_after_a_plan_resumes_exactly(tmp_path: Path, pause_at: int) -> None:
    """SIGKILLed once edit K's plan is durable: the re-run takes epoch 2 (settling edit
    K), answers edits before K from the ledger, runs K again (attempt 2) and the rest."""
    project, edits = tmp_path / "project", 5
    with subprocess.Popen([PYTHON, AGENT_LOOP, str(project), "--edits", str(edits),
                           "--pause-at", str(pause_at)], cwd=tmp_path, env=clean_env(),
                          stdout=subprocess.PIPE, text=True) as proc:
        lines = Lines(proc)
        lines.until(rf"^paused in edit-{pause_at} pid={proc.pid}$")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert lines.seen[:pause_at] == ["epoch 1"] + [
        f"edit-{i} applied (attempt 1)" for i in range(1, pause_at)]
    assert (project / "CHANGELOG.md").read_text() == changelog(pause_at - 1)  # killed before K wrote

    again = run(PYTHON, AGENT_LOOP, str(project), "--edits", str(edits), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"epoch 2 (settled: edit-{pause_at})",
        *(f"edit-{i} deduped (attempt 1)" for i in range(1, pause_at)),
        f"edit-{pause_at} applied (attempt 2)",
        *(f"edit-{i} applied (attempt 1)" for i in range(pause_at + 1, edits + 1)),
        "done; verify ok"]
    check_agent_loop_final(project, edits)


@pytest.mark.parametrize("after_lines", [2, 6, 11])
def test_agent_loop_killed_anywhere_resumes_exactly(tmp_path: Path, after_lines: int) -> None:
    """SIGKILLed wherever it is once it printed N lines (in the middle of some edit, or
    between two): the re-run ends with every edit exactly once."""
    project, edits = tmp_path / "project", 20
    with subprocess.Popen([PYTHON, AGENT_LOOP, str(project), "--edits", str(edits)],
                          cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                          text=True) as proc:
        lines = Lines(proc)
        for _ in range(after_lines):
            assert lines.next() is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    again = run(PYTHON, AGENT_LOOP, str(project), "--edits", str(edits), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    out = again.stdout.splitlines()
    assert out[0].startswith("epoch 2") and out[-1] == "done; verify ok", out
    for i in range(1, edits + 1):  # each edit once, committed before or now
        [line] = [x for x in out if x.startswith(f"edit-{i} ")]
        assert re.fullmatch(rf"edit-{i} (deduped|applied) \(attempt [12]\)", line), line
    check_agent_loop_final(project, edits)


# -- two_workers_postgres.py --------------------------------------------------------------


@needs_extra("postgres")
def test_two_workers_postgres_takeover(tmp_path: Path, pg_url: str) -> None:
    """A applies step-3 and is SIGSTOPped; B waits out A's lease, takes epoch 2 (settling
    step-3: the file put back), finishes the job; A's late receipt is StaleEpoch."""
    workdir = tmp_path / "shared"
    out = run(PYTHON, str(EXAMPLES / "two_workers_postgres.py"), pg_url, "--workdir",
              str(workdir), cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    expected_in_order = [
        "A: epoch 1", "A: step-1 applied", "A: step-2 applied",
        "A: step-3 applied at rev 3, not published yet",
        "notes.txt now ends with: 'step-3 by worker-a'",  # A's write was on disk
        "B: waiting: workspace 'shared' is leased by 'worker-a' (epoch 1)",
        "B: epoch 2, settled step-3",
        "B: step-1 deduped (attempt 1)", "B: step-2 deduped (attempt 1)",
        "B: step-3 applied (attempt 2)", "B: step-4 applied (attempt 1)",
        "-- worker A continued",
        "A: late receipt refused: StaleEpoch: workspace 'shared': epoch 1 is not live",
        "verify ok"]
    at = 0
    for want in expected_in_order:
        at = next((i for i in range(at, len(lines)) if want in lines[i]), None)
        assert at is not None, (want, lines)
    assert (workdir / "notes.txt").read_text() == (
        "step-1 by worker-a\nstep-2 by worker-a\nstep-3 by worker-b\nstep-4 by worker-b\n")

    steps = json.loads(steptrail("--ledger", pg_url, "steps", "--json").stdout)
    assert {s["step_id"]: (s["state"], s["attempt"], s["epoch"]) for s in steps} == {
        "step-1": ("acked", 1, 1), "step-2": ("acked", 1, 1),
        "step-3": ("acked", 2, 2), "step-4": ("acked", 1, 2)}
    assert_clean(pg_url)


@needs_extra("postgres")
def test_two_workers_postgres_leaves_no_temporary_directory(tmp_path: Path, pg_url: str
                                                           ) -> None:
    """Without --workdir it made /tmp/steptrail-shared-* and left it behind (issue 37)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run([PYTHON, str(EXAMPLES / "two_workers_postgres.py"), pg_url],
                         cwd=tmp_path, env={**clean_env(), "TMPDIR": str(tmp)},
                         capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "removed at the end" in out.stdout
    assert list(tmp.iterdir()) == []


def test_two_workers_postgres_takes_the_url_from_the_environment(tmp_path: Path) -> None:
    """Without a URL it names what to give, exit 2 (argparse), and starts nothing."""
    out = run(PYTHON, str(EXAMPLES / "two_workers_postgres.py"), cwd=tmp_path)
    assert out.returncode == 2 and "STEPTRAIL_LEDGER" in out.stderr, out


# -- langgraph_graph.py -------------------------------------------------------------------


@needs_extra("langgraph")
def test_langgraph_graph_ownership_and_prune(tmp_path: Path) -> None:
    out = run(PYTHON, str(EXAMPLES / "langgraph_graph.py"), cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[:3] == ["A claims, epoch 1", "after A: runs = 2", "B takes over, epoch 2"]
    assert lines[3].startswith("A's late run refused: StaleEpoch:") and "ticket-42" in lines[3]
    assert lines[4] == "after B: runs = 3 paragraphs = 3"  # A's late run left nothing
    before, after = map(int, re.fullmatch(
        r"checkpoints: (\d+) before prune, (\d+) after", lines[5]).groups())
    assert before > after == 1
    collected = re.fullmatch(r"gc reclaimed (\d+) blobs, (\d+) bytes", lines[6])
    assert collected and int(collected[1]) > 0 and int(collected[2]) > 0, lines[6]
    assert lines[7:] == ["the thread resumes from: 3 runs", "audit ok | verify ok"]
    assert_clean(".steptrail/ledger.db", cwd=tmp_path)


def test_outside_edits_are_in_the_history_undoable_and_restorable(tmp_path: Path) -> None:
    project = tmp_path / "project"
    out = run(PYTHON, str(EXAMPLES / "outside_edits.py"), str(project), cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[:3] == ["baseline: 3 files", "observed: changed README.md, deleted notes.txt",
                         "history:"]
    history = [line.split() for line in lines[3:8]]
    assert [(h[0].startswith("observed-"), h[1]) for h in history] == [
        (True, "observed"), (False, "-"), (True, "observed"), (False, "-"), (False, "-")]
    assert history[2][2:] == ["README.md,", "notes.txt"]  # the person's edits, by path
    assert lines[8:] == ["undone: notes.txt restored, README.md restored", "hello", "todo",
                         "restored equal: True"]
    assert (project / "app.py").read_text() == 'print("v3")\n'  # the agent's last step kept
    assert_clean(str(project / ".steptrail" / "ledger.db"))


# -- mcp/ ------------------------------------------------------------------------------------

PLACEHOLDER_BIN = "/home/you/project/.venv/bin/steptrail"
PLACEHOLDER_PROJECT = "/home/you/project"


@needs_extra("mcp")
@pytest.mark.parametrize("config, key", [(".mcp.json", "mcpServers"),
                                         ("vscode-mcp.json", "servers")])
def test_mcp_client_configuration_starts_a_server(tmp_path: Path, config: str, key: str) -> None:
    """The configuration, its placeholders rewritten to a project here, started as a
    client starts it (its command and args, from another directory: absolute paths
    are what make that work), serves the project: tools listed, a file read, a write
    journaled in the project's ledger."""
    import anyio
    from mcp import Client, StdioServerParameters

    text = (EXAMPLES / "mcp" / config).read_text()
    entry = json.loads(text)[key]["steptrail"]
    assert entry["command"] == PLACEHOLDER_BIN and PLACEHOLDER_PROJECT in entry["args"]
    if key == "servers":
        assert entry["type"] == "stdio"
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("hello from the project\n")
    rewritten = json.loads(text.replace(PLACEHOLDER_BIN, STEPTRAIL)
                           .replace(PLACEHOLDER_PROJECT, str(project)))[key]["steptrail"]
    elsewhere = tmp_path / "client-cwd"
    elsewhere.mkdir()
    params = StdioServerParameters(command=rewritten["command"], args=rewritten["args"],
                                   env=clean_env(), cwd=str(elsewhere))

    async def session() -> None:
        async with Client(params, read_timeout_seconds=60) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert {"read_text_file", "write_file", "edit_file", "history", "undo",
                    "status", "audit"} <= tools, tools
            read = await client.call_tool("read_text_file", {"path": "README.md"})
            assert not read.is_error
            assert "hello from the project" in "".join(
                getattr(b, "text", "") for b in read.content)
            wrote = await client.call_tool("write_file", {"path": "notes.txt",
                                                          "content": "via mcp\n"})
            assert not wrote.is_error, wrote

    anyio.run(session)
    assert (project / "notes.txt").read_text() == "via mcp\n"
    assert not (elsewhere / ".steptrail").exists()
    assert_clean(str(project / ".steptrail" / "ledger.db"))


# -- schedule/ ---------------------------------------------------------------------------------

SCHEDULE = EXAMPLES / "schedule"
PLACEHOLDER_VENV_BIN = "/opt/agent/.venv/bin/steptrail"
PLACEHOLDER_SRV = "/srv/agent"


@pytest.fixture
def srv(tmp_path: Path) -> Path:
    """A stand-in for /srv/agent: a ledger at .steptrail/ledger.db with a committed
    artifact step and an orphan-to-be, made with the command line."""
    root = tmp_path / "srv-agent"
    root.mkdir()
    db = str(root / ".steptrail" / "ledger.db")
    (tmp_path / "report.txt").write_text("12 passed\n")
    for args in (["init"], ["step", "store", "tests-1", str(tmp_path / "report.txt"), "--as",
                            "report.txt"], ["step", "publish", "tests-1"],
                 ["step", "ack", "tests-1"]):
        out = steptrail("--ledger", db, *args, cwd=tmp_path)
        assert out.returncode == 0, (args, out.stderr)
    return root


def rewrite(text: str, srv: Path) -> str:
    assert PLACEHOLDER_SRV in text  # each command names the ledger (or the log) there
    return text.replace(PLACEHOLDER_VENV_BIN, STEPTRAIL).replace(PLACEHOLDER_SRV, str(srv))


def log_documents(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def check_logged(docs: list[dict]) -> None:
    """One audit document (ok) and one gc document, in the order the schedule runs them."""
    assert [("audit" if "stored_blobs" in d else "gc") for d in docs] == ["audit", "gc"], docs
    assert docs[0]["ok"] is True and docs[0]["committed_steps"] == 1
    assert docs[1]["grace_s"] == 86400.0 and docs[1]["dry_run"] is False


def test_cron_lines_run_as_written(tmp_path: Path, srv: Path) -> None:
    """Each job line: five valid time fields, a user, and a command that — the paths
    rewritten, run by /bin/sh as cron runs it — exits 0 and appends its --json document
    to the log."""
    jobs = []
    for line in (SCHEDULE / "steptrail-maintenance.cron").read_text().splitlines():
        if not line.strip() or line.startswith("#") or re.match(r"^[A-Z]+=", line):
            continue
        *when, user, command = line.split(None, 6)
        assert len(when) == 5 and user == "agent", line
        jobs.append((" ".join(when), command))
    assert len(jobs) == 2
    try:
        from croniter import croniter as cron
    except ImportError:  # not a dependency: the fields are still checked by shape
        cron = None
    for when, command in jobs:
        if cron is not None:
            assert cron.is_valid(when), when
        else:
            assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", when), when
        out = subprocess.run(["/bin/sh", "-c", rewrite(command, srv)], cwd=tmp_path,
                             env=clean_env(), capture_output=True, text=True,
                             timeout=TIMEOUT, check=False)
        assert out.returncode == 0 and not out.stdout and not out.stderr, out
    check_logged(log_documents(srv / ".steptrail" / "maintenance.log"))


def unit_lines(name: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in (SCHEDULE / name).read_text().splitlines()
            if line.startswith(f"{key}=")]


def test_systemd_service_commands_run_as_written(tmp_path: Path, srv: Path) -> None:
    """The service's ExecStart= lines, in order, with StandardOutput= as systemd opens
    it (append): each exits 0 and leaves its --json document in the log."""
    [log] = unit_lines("steptrail-maintenance.service", "StandardOutput")
    assert log.startswith("append:")
    log_path = Path(rewrite(log.removeprefix("append:"), srv))
    starts = unit_lines("steptrail-maintenance.service", "ExecStart")
    assert len(starts) == 2 and all(s.startswith(PLACEHOLDER_VENV_BIN) for s in starts)
    for start in starts:
        with log_path.open("a") as out:
            done = subprocess.run(shlex.split(rewrite(start, srv)), cwd="/", env=clean_env(),
                                  stdout=out, stderr=subprocess.PIPE, text=True,
                                  timeout=TIMEOUT, check=False)
        assert done.returncode == 0 and not done.stderr, done
    check_logged(log_documents(log_path))
    [paths] = unit_lines("steptrail-maintenance.service", "ReadWritePaths")
    assert Path(rewrite(paths.split()[0], srv)) == log_path.parent  # it may write the log


def test_systemd_units_verify(tmp_path: Path, srv: Path) -> None:
    """`systemd-analyze verify` on both units (the binary path rewritten to one that
    exists: verify checks it) reports nothing."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the units are not verified here")
    units = tmp_path / "units"
    units.mkdir()
    for name in ("steptrail-maintenance.service", "steptrail-maintenance.timer"):
        text = (SCHEDULE / name).read_text()
        if name.endswith(".service"):
            text = rewrite(text, srv)
        (units / name).write_text(text)
    out = run("systemd-analyze", "verify", str(units / "steptrail-maintenance.timer"),
              str(units / "steptrail-maintenance.service"), cwd=units)
    assert out.returncode == 0 and not out.stderr.strip(), out
    [calendar] = unit_lines("steptrail-maintenance.timer", "OnCalendar")
    assert run("systemd-analyze", "calendar", calendar).returncode == 0


# -- README --------------------------------------------------------------------------------------


def test_the_examples_readme_names_every_example() -> None:
    text = (EXAMPLES / "README.md").read_text()
    for path in sorted(EXAMPLES.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.name != "README.md":
            assert path.name in text, f"examples/README.md does not mention {path.name}"

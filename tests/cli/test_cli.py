"""The `steptrail` command: exit codes, --json shapes, one-line errors, read-only commands;
plans through `step plan` (content_file confined to the plan's directory, the fence and the
journal the operator's alone, a different plan for a step refused, not dropped), every
refusal typed (on stderr and as one JSON error object), a UTF-8 step name under the C
locale."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner
from conftest import CliOut, digest_of, lock_files_aside, run_cli

from ledger import Ledger
from ledger.cli import cli
from ledger.runner import run_step

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*args: str, ledger: pathlib.Path | None = None) -> tuple[int, str, str]:
    runner = CliRunner()
    argv = (["--ledger", str(ledger)] if ledger is not None else []) + list(args)
    result = runner.invoke(cli, argv, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def filled(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "ledger.db"
    with Ledger.init(path) as ledger:
        for i in range(3):
            run_step(ledger, f"s{i}", {f"o{i}.txt": b"x" * (i + 1)})
        row = ledger.plan("open", artifacts=["o.txt"])
        ledger.store("open", row.attempt, "o.txt", b"y")
    return path


def test_init_creates_then_is_a_noop(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "sub" / "ledger.db"
    code, out, _ = run("init", "--json", ledger=path)
    assert code == 0 and json.loads(out)["created"] is True
    code, out, _ = run("init", "--json", ledger=path)
    assert code == 0 and json.loads(out)["created"] is False


def test_steps_json_shape(filled: pathlib.Path) -> None:
    code, out, _ = run("steps", "--json", ledger=filled)
    assert code == 0
    rows = json.loads(out)
    assert [r["step_id"] for r in rows] == ["s0", "s1", "s2", "open"]
    for key in ("step_id", "state", "attempt", "epoch", "last_seq", "committed"):
        assert key in rows[0]
    assert rows[0]["state"] == "acked" and rows[0]["committed"] is True
    assert rows[3]["state"] == "blob-stored" and rows[3]["committed"] is False
    code, out, _ = run("steps", "--state", "blob-stored", "--json", ledger=filled)
    assert [r["step_id"] for r in json.loads(out)] == ["open"]


def test_events_filters_and_json(filled: pathlib.Path) -> None:
    code, out, _ = run("events", "--step", "s1", "--json", ledger=filled)
    assert code == 0
    events = json.loads(out)
    assert [e["kind"] for e in events] == ["planned", "blob-stored", "manifest-published", "acked"]
    assert events[0]["journal_key"] == '["s1",1,"planned"]'
    assert all(len(e["hash"]) == 64 for e in events)
    code, out, _ = run("events", "--kind", "acked", "--after", "5", "--limit", "1", "--json", ledger=filled)
    assert [e["step"] for e in json.loads(out)] == ["s1"]
    code, out, _ = run("events", "--json", "--step", "missing", ledger=filled)
    assert code == 0 and json.loads(out) == []


def test_show_timeline(filled: pathlib.Path) -> None:
    code, out, _ = run("show", "s2", ledger=filled)
    assert code == 0 and "step s2: acked, attempt 1, committed" in out
    code, out, _ = run("show", "s2", "--json", ledger=filled)
    data = json.loads(out)
    assert data["step"]["state"] == "acked" and len(data["events"]) == 4
    code, _, err = run("show", "nope", ledger=filled)
    assert code == 2 and err.count("\n") == 1 and "steptrail steps" in err


def test_verify_and_expect_head(filled: pathlib.Path) -> None:
    code, out, _ = run("head", "--json", ledger=filled)
    head = json.loads(out)
    code, out, _ = run("verify", "--expect-head", f"{head['seq']}:{head['hash']}", ledger=filled)
    assert code == 0 and "verify: ok" in out
    code, out, _ = run("verify", "--json", "--expect-head", f"{head['seq'] + 5}:{head['hash']}", ledger=filled)
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["findings"][0]["check"] == "head"
    code, _, err = run("verify", "--expect-head", "12:zz", ledger=filled)
    assert code == 2 and "SEQ:HASH" in err


def test_read_only_commands_write_nothing(filled: pathlib.Path) -> None:
    before = snapshot(filled.parent)
    assert not (filled.parent / "ledger.db-wal").exists()
    for argv in (["steps"], ["events"], ["show", "s0"], ["verify"], ["head"],
                 ["export"], ["export", "--what", "steps", "--format", "csv"]):
        code, _, _ = run(*argv, ledger=filled)
        assert code == 0, argv
    assert lock_files_aside(snapshot(filled.parent)) == before


def test_export_jsonl_and_csv(filled: pathlib.Path) -> None:
    code, out, _ = run("export", ledger=filled)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 15 and lines[0]["payload"]["kind"] == "planned"
    code, out, _ = run("export", "--what", "steps", "--format", "csv", ledger=filled)
    assert out.splitlines()[0].startswith("step_id,run,workspace,state")
    assert len(out.splitlines()) == 5


def test_rebuild(filled: pathlib.Path) -> None:
    code, out, _ = run("rebuild", "--json", ledger=filled)
    assert code == 0 and json.loads(out) == {"steps": 4, "events": 15}


@pytest.mark.parametrize(
    "content, why",
    [(b"hello, not a database\n" * 10, "not a SQLite database"), (b"short", "too short"), (b"", "empty")],
)
def test_not_a_ledger_is_exit_2_and_untouched(tmp_path: pathlib.Path, content: bytes, why: str) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    before = snapshot(tmp_path)
    for argv in (["steps"], ["verify"], ["rebuild"], ["init"]):
        code, out, err = run(*argv, ledger=path)
        if argv == ["init"] and not content:
            continue  # an empty file is what a crash inside init leaves: init may use it
        assert code == 2, (argv, err)
        assert why in err and "Traceback" not in err and err.count("\n") == 1
        assert snapshot(tmp_path) == before


def test_missing_ledger_names_the_fix(tmp_path: pathlib.Path) -> None:
    code, _, err = run("steps", ledger=tmp_path / "nope.db")
    assert code == 2 and "init" in err


def test_ledger_from_environment(filled: pathlib.Path) -> None:
    result = CliRunner().invoke(cli, ["head"], env={"STEPTRAIL_LEDGER": str(filled)})
    assert result.exit_code == 0 and re.fullmatch(r"\d+:[0-9a-f]{64}\n", result.stdout)


def test_lock_timeout_is_exit_3(filled: pathlib.Path) -> None:
    import apsw

    holder = apsw.Connection(str(filled))
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Ledger.open(filled, busy_timeout_ms=50) as ledger:
            from ledger import LedgerBusy, Planned

            with pytest.raises(LedgerBusy) as info:
                ledger.append(Planned(step="late", attempt=1))
            assert info.value.exit_code == 3
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_demo_passes() -> None:
    code, out, _ = run("demo", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and all(report["checks"].values())


def _all_commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand, by its full name ("lease acquire")."""
    out: list[tuple[str, click.Command]] = []

    def walk(prefix: str, group: click.Group) -> None:
        ctx = click.Context(group)  # chaos, fuzz: entry points, found by get_command
        for name, command in ((n, group.get_command(ctx, n)) for n in group.list_commands(ctx)):
            full = f"{prefix} {name}".strip()
            out.append((full, command))
            if isinstance(command, click.Group):
                walk(full, command)

    walk("", cli)
    return out


def test_every_command_has_help_and_docs() -> None:
    """Every command and subcommand has --help, is named in the README or a doc under
    docs/ (`steptrail NAME` or `NAME` in backquotes), and, if it takes --json, has its
    section in docs/cli-json.md."""
    json_docs = (ROOT / "docs" / "cli-json.md").read_text()
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    commands = _all_commands()
    assert {"lease acquire", "step plan", "workspace add", "witness anchor"} <= {n for n, _ in commands}
    for name, command in commands:
        assert command.help, name
        code, out, _ = run(*name.split(), "--help")
        assert code == 0 and "Usage:" in out, name
        named = re.search(rf"steptrail (--\S+ \S+ )*{re.escape(name)}\b|`{re.escape(name)}[` ]", docs)
        assert named, f"neither README.md nor docs/*.md names the command {name!r}"
        if any(p.name == "as_json" for p in command.params):
            assert f"## `{name}" in json_docs, f"docs/cli-json.md lacks a section for {name}"


def test_no_traceback_on_usage_error() -> None:
    code, _, err = run("steps", "--state", "bogus")
    assert code == 2 and "Traceback" not in err


def test_python_dash_m_entry_point(filled: pathlib.Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "ledger", "--ledger", str(filled), "head"],
        capture_output=True, text=True, check=True, cwd=ROOT, env={**os.environ},
    )
    assert re.fullmatch(r"\d+:[0-9a-f]{64}\n", out.stdout)


# --- a workspace driven by the command (issue 11, the outside review) ---------------------


h = digest_of


class World:
    """A ledger, a workspace `w` holding app.py = "v0", and the CLI in-process."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.ledger = tmp / "ledger.db"
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0")
        assert self("init").code == 0
        assert self("workspace", "add", "w", str(self.dir)).code == 0

    def __call__(self, *args: str, input: str | bytes | None = None) -> CliOut:
        return run_cli(["--ledger", str(self.ledger), *args], input=input)

    def acquire(self, holder: str = "agent-1", *extra: str) -> int:
        r = self("--workspace", "w", "lease", "acquire", "--holder", holder, "--ttl", "10m",
                 "--json", *extra)
        assert r.code == 0, r
        return int(r.json["epoch"])

    def plan(self, doc: dict[str, Any], epoch: int, *extra: str,
             file: pathlib.Path | None = None) -> CliOut:
        if file is None:
            return self("--workspace", "w", "step", "plan", "--epoch", str(epoch), "-", "--json",
                        *extra, input=json.dumps(doc))
        file.write_text(json.dumps(doc))
        return self("--workspace", "w", "step", "plan", "--epoch", str(epoch), str(file),
                    "--json", *extra)

    def count(self) -> int:
        with Ledger.open(self.ledger, readonly=True) as led:
            return led.count()

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.dir)): p.read_bytes()
                for p in sorted(self.dir.rglob("*")) if p.is_file()}


@pytest.fixture
def world(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.chdir(tmp_path)
    return World(tmp_path)


def error_of(r: CliOut, code: int, type_name: str) -> dict[str, Any]:
    """The typed error of a refused command: exit `code`, one stderr line naming
    `type_name`, and (the command ran with --json) one error object on stdout."""
    assert r.code == code, r
    assert r.err.startswith(f"steptrail: error: {type_name}: "), r.err
    assert r.err.count("\n") == 1, r.err
    doc = r.json
    assert doc["ok"] is False and doc["error"]["type"] == type_name, doc
    assert doc["error"]["exit_code"] == code and doc["error"]["message"] in r.err
    return doc["error"]  # type: ignore[no-any-return]


# --- content_file is confined to the plan file's directory (item 3) -----------------------


@pytest.fixture
def secret(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file outside the plan's directory that an agent's plan must not read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "secret.txt"
    path.write_text("TOKEN=hunter2\n")
    return path


def _escapes(world: World, secret: pathlib.Path) -> dict[str, str]:
    """content_file values reaching `secret` from the plan directory `plans/`."""
    plans = world.tmp / "plans"
    (plans / "sub").mkdir(parents=True)
    os.symlink(secret, plans / "link.txt")  # a symlink to a file outside
    os.symlink(secret.parent, plans / "linkdir")  # a symlinked directory component
    os.symlink(secret, plans / "sub" / "deep.txt")
    return {
        "absolute": str(secret),
        "dotdot": "../outside/secret.txt",
        "dotdot-inner": "sub/../../outside/secret.txt",
        "symlink-file": "link.txt",
        "symlink-dir": "linkdir/secret.txt",
        "symlink-deep": "sub/deep.txt",
    }


def test_content_file_cannot_leave_the_plan_directory(world: World, secret: pathlib.Path) -> None:
    epoch = world.acquire()
    before, files = world.count(), world.files()
    for name, path in _escapes(world, secret).items():
        doc = {"step": f"s-{name}", "writes": [
            {"path": "stolen.txt", "pre_hash": None, "content_file": path}]}
        r = world.plan(doc, epoch, file=world.tmp / "plans" / "plan.json")
        err = error_of(r, 2, "ContentFileEscapes")
        assert err["path"] == path, (name, err)
        assert "hunter2" not in r.out + r.err
        assert world.count() == before, name  # nothing written
    assert world.files() == files
    # a file inside the plan's directory (in a subdirectory too) is read
    (world.tmp / "plans" / "sub" / "ok.txt").write_text("fine")
    r = world.plan({"step": "s-ok", "writes": [
        {"path": "ok.txt", "pre_hash": None, "content_file": "sub/ok.txt"}]}, epoch,
        file=world.tmp / "plans" / "plan.json")
    assert r.code == 0 and r.json["steps"][0]["verdict"] == "admitted", r


def test_content_file_of_a_plan_on_stdin_is_confined_to_the_current_directory(
        world: World, secret: pathlib.Path) -> None:
    epoch = world.acquire()
    cwd = world.tmp / "cwd"
    cwd.mkdir()
    os.symlink(secret, cwd / "link.txt")
    (cwd / "mine.txt").write_text("mine")
    os.chdir(cwd)
    before = world.count()
    for path in (str(secret), "../outside/secret.txt", "link.txt"):
        r = world.plan({"step": "s1", "writes": [
            {"path": "x.txt", "pre_hash": None, "content_file": path}]}, epoch)
        error_of(r, 2, "ContentFileEscapes")
        assert world.count() == before
    r = world.plan({"step": "s1", "writes": [
        {"path": "x.txt", "pre_hash": None, "content_file": "mine.txt"}]}, epoch)
    assert r.code == 0, r


def test_content_file_swapped_for_a_symlink_is_refused_not_followed(
        world: World, secret: pathlib.Path) -> None:
    """A real swap: the directory the plan names is replaced by a symlink to the
    secret's directory after the plan was written (the file name stays the same)."""
    epoch = world.acquire()
    plans = world.tmp / "plans"
    (plans / "data").mkdir(parents=True)
    (plans / "data" / "secret.txt").write_text("harmless")
    doc = {"step": "s1", "writes": [
        {"path": "x.txt", "pre_hash": None, "content_file": "data/secret.txt"}]}
    (plans / "data").rename(plans / "data.real")
    os.symlink(secret.parent, plans / "data")
    before = world.count()
    error_of(world.plan(doc, epoch, file=plans / "plan.json"), 2, "ContentFileEscapes")
    assert world.count() == before and not (world.dir / "x.txt").exists()


# --- only the operator turns the fence or the journal off (item 5) ------------------------


@pytest.mark.parametrize("key,value,flag", [
    ("fence", "none", "--fence none"), ("fence", "plan", "--fence plan"),
    ("journal", False, "--no-journal")])
def test_a_plan_cannot_switch_off_the_fence_or_the_journal(
        world: World, key: str, value: Any, flag: str) -> None:
    epoch = world.acquire()
    before = world.count()
    for doc in ({"step": "s1", key: value, "writes": [
                    {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]},
                {"steps": [{"step": "s1", "writes": [
                    {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}], key: value}):
        err = error_of(world.plan(doc, epoch), 2, "OperatorOnly")
        assert err["key"] == key and err["flag"] == flag and flag in err["message"]
    assert world.count() == before
    # the protective defaults, spelled out, are still accepted
    ok = world.plan({"step": "s1", "fence": "step", "journal": True, "writes": [
        {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}, epoch)
    assert ok.code == 0, ok


def test_the_operator_turns_them_off_and_verify_and_metrics_report_it(world: World) -> None:
    epoch = world.acquire()
    assert world("verify", "--json").json["warnings"] == []
    r = world.plan({"step": "s1", "writes": [
        {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}, epoch,
        "--fence", "none", "--no-journal")
    assert r.code == 0, r
    ev = world("events", "--kind", "planned", "--json").json[-1]["event"]
    assert (ev["fence"], ev["journal"]) == ("none", False)  # recorded
    (world.dir / "app.py").write_text("a human's edit")
    applied = world("step", "apply", "s1", "--epoch", str(epoch), "--json")
    assert applied.code == 0  # the operator's choice: the edit is overwritten
    v = world("verify", "--json")
    assert v.code == 0 and v.json["ok"] is True and v.json["findings"] == []
    [warning] = v.json["warnings"]
    assert warning["check"] == "weakened-fence" and "'s1'" in warning["message"]
    text = world("verify")
    assert text.code == 0 and "WARNING [weakened-fence]" in text.out and "1 warning" in text.out
    m = world("metrics", "--json").json["weakened"]
    assert m == {"attempts": 1, "fence_plan": 0, "fence_none": 1, "journal_off": 1}
    assert "weakened attempts" in world("metrics").out


# --- a different plan for a step in flight or committed is refused (item 19) --------------


def test_a_plan_for_a_step_store_created_is_refused_not_dropped(world: World) -> None:
    (world.tmp / "report.xml").write_text("<ok/>")
    assert world("step", "store", "s1", "report.xml").code == 0
    epoch = world.acquire()
    before = world.count()
    r = world.plan({"step": "s1", "writes": [
        {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}, epoch)
    err = error_of(r, 1, "PlanConflict")
    assert err["step"] == "s1" and any("artifact-only" in d for d in err["differences"]), err
    assert world.count() == before and world.files() == {"app.py": b"v0"}


def test_a_retried_plan_is_unchanged_a_different_one_is_refused(world: World) -> None:
    epoch = world.acquire()
    doc = {"run": "r", "steps": [
        {"step": "s1", "artifacts": ["out/a"], "writes": [
            {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}]}
    assert world.plan(doc, epoch).code == 0
    again = world.plan(doc, epoch)
    assert again.code == 0 and again.json["steps"][0]["verdict"] == "unchanged"
    before = world.count()
    variants = {
        "content": ("app.py: new content", {"content": "v1-other"}),
        "pre_hash": ("app.py: pre_hash", {"pre_hash": h("v9")}),
        "base_rev": ("app.py: base_rev", {"base_rev": 7}),
        "path": ("writes other.py", {"path": "other.py"}),
    }
    for name, (expected, change) in variants.items():
        changed = json.loads(json.dumps(doc))
        changed["steps"][0]["writes"][0].update(change)
        err = error_of(world.plan(changed, epoch), 1, "PlanConflict")
        assert any(expected in d for d in err["differences"]), (name, err)
    changed = json.loads(json.dumps(doc))
    changed["steps"][0]["artifacts"] = ["out/b"]
    err = error_of(world.plan(changed, epoch), 1, "PlanConflict")
    assert any("artifacts" in d for d in err["differences"])
    fence = error_of(world.plan(doc, epoch, "--fence", "plan"), 1, "PlanConflict")
    assert any("fence" in d for d in fence["differences"])
    assert world.count() == before
    # applied and committed, the same plan (base_rev left to the ledger) is still a retry
    assert world("step", "apply", "s1", "--epoch", str(epoch)).code == 0
    n = world.count()
    after = world.plan(doc, epoch)
    assert after.code == 0 and after.json["steps"][0]["verdict"] == "unchanged", after
    assert world.count() == n  # nothing new from the retry
    error_of(world.plan({"step": "s1", "writes": [
        {"path": "app.py", "pre_hash": h("v1"), "content": "v2"}]}, epoch), 1, "PlanConflict")
    assert world.count() == n and world.files() == {"app.py": b"v1"}


# --- every refusal has a type, on stderr and as one JSON error object (item 20) -----------


def test_refusals_name_their_type_and_carry_their_facts(world: World) -> None:
    epoch = world.acquire()
    held = error_of(world("--workspace", "w", "lease", "acquire", "--holder", "b", "--json"),
                    1, "LeaseHeld")
    assert held["holder"] == "agent-1" and held["epoch"] == epoch and held["workspace"] == "w"

    assert world.plan({"step": "s1", "writes": [
        {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}, epoch).code == 0
    (world.dir / "app.py").write_text("a human's edit")
    r = world("step", "apply", "s1", "--epoch", str(epoch), "--json")
    err = error_of(r, 1, "StepRejected")
    assert r.json["verdict"] == "rejected:pre_hash" and r.json["step"] == "s1"  # the document
    assert err["reason"] == "pre_hash" and err["path"] == "app.py"
    assert err["on_disk"] == h("a human's edit") and err["pre_hash"] == h("v0")
    text = world("step", "apply", "s1", "--epoch", str(epoch))  # the text form says it too
    assert text.code == 1 and text.err.startswith("steptrail: error: StepRejected: ")

    replan = error_of(world("step", "replan", "s1", "--epoch", str(epoch), "--json"), 1,
                      "ReplanRefused")
    assert replan["step"] == "s1"

    new = world.acquire("agent-2", "--force")
    stale = error_of(world("--workspace", "w", "lease", "heartbeat", "--epoch", str(epoch),
                           "--json"), 1, "StaleEpoch")
    assert stale["epoch"] == epoch and stale["live"] == new


    # exit 2 and 3 carry an error object under --json too, and nothing else
    unknown = error_of(world("show", "nope", "--json"), 2, "UnknownStep")
    assert unknown["step"] == "nope"
    usage = error_of(world("step", "apply", "s1", "--epoch", "x", "--json"), 2, "UsageError")
    assert "--epoch" in usage["message"]


def test_unsettled_is_typed(world: World) -> None:
    first = world.acquire()
    assert world.plan({"step": "s1", "writes": [
        {"path": "a.txt", "pre_hash": None, "content": "a"}]}, first).code == 0
    with Ledger.open(world.ledger) as led:  # a forced takeover that died before settling
        led._log.append([led_acquired(led, first + 1)])
    err = error_of(world("step", "apply", "s1", "--epoch", str(first + 1), "--json"), 1,
                   "Unsettled")
    assert err["steps"] == ["s1"] and err["workspace"] == "w"


def led_acquired(led: Ledger, epoch: int) -> Any:
    from ledger.events import LeaseAcquired

    return LeaseAcquired(workspace="w", epoch=epoch, holder="b", forced=True,
                         expires_ns=led.clock() + 600 * 10**9)


def test_a_usage_error_under_json_is_an_error_object(world: World) -> None:
    for argv in (("step", "apply", "s1", "--nope", "--json"),  # the parse stops before --json
                 ("step", "apply", "s1", "--epoch", "x", "--json"),
                 ("--workspace", "w", "lease", "acquire", "--json")):  # --holder missing
        error_of(world(*argv), 2, "UsageError")
    plain = world("step", "apply", "s1", "--nope")  # without --json: the same one line
    assert plain.code == 2 and plain.out == "", plain
    assert plain.err == ("steptrail: error: UsageError: No such option '--nope';"
                         " see 'steptrail step apply --help'\n"), plain.err


def test_restore_blocked_by_a_lease_is_lease_held(world: World) -> None:
    world.acquire()
    err = error_of(world("restore", "--workspace", "w", "--to", str(world.tmp / "fresh"),
                         "--json"), 1, "LeaseHeld")
    assert err["holder"] == "agent-1" and "--force" in err["message"]


# --- a UTF-8 step name under the C locale (item 17) ---------------------------------------


@pytest.mark.parametrize("utf8", [None, "0"], ids=["PYTHONUTF8-unset", "PYTHONUTF8=0"])
def test_a_utf8_step_name_works_under_the_c_locale(tmp_path: pathlib.Path,
                                                   utf8: str | None) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LC_", "PYTHON")) and k != "LANG"}
    env.update(LC_ALL="C", PYTHONPATH=str(ROOT))
    if utf8 is not None:
        env["PYTHONUTF8"] = utf8
    (tmp_path / "ws").mkdir()
    (tmp_path / "плана").mkdir()
    plan = tmp_path / "плана" / "план.json"
    plan.write_text(json.dumps({"step": "шаг-1", "writes": [
        {"path": "файл.txt", "pre_hash": None, "content": "да"}]}), encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "ledger", "--ledger",
                               str(tmp_path / "l.db"), *args], env=env, cwd=tmp_path,
                              capture_output=True, timeout=60)

    assert run("init").returncode == 0
    assert run("workspace", "add", "w", str(tmp_path / "ws")).returncode == 0
    got = run("--workspace", "w", "lease", "acquire", "--holder", "агент", "--json")
    assert got.returncode == 0, got.stderr
    epoch = str(json.loads(got.stdout)["epoch"])
    got = run("--workspace", "w", "step", "plan", "--epoch", epoch, str(plan), "--json")
    assert got.returncode == 0, got.stderr.decode("utf-8", "replace")
    got = run("step", "apply", "шаг-1", "--epoch", epoch, "--json")
    assert got.returncode == 0, got.stderr.decode("utf-8", "replace")
    assert json.loads(got.stdout)["step"] == "шаг-1"
    assert (tmp_path / "ws" / "файл.txt").read_text(encoding="utf-8") == "да"
    shown = run("show", "шаг-1")
    assert shown.returncode == 0 and "шаг-1".encode() in shown.stdout, shown.stderr

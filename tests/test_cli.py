"""The `steptrail` command: exit codes, --json shapes, one-line errors, read-only commands."""

from __future__ import annotations

import json
import os
import pathlib
import re

import click
import pytest
from click.testing import CliRunner
from conftest import lock_files_aside

from ledger import Ledger
from ledger.cli import cli
from ledger.runner import run_step

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
        for name, command in sorted(group.commands.items()):
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

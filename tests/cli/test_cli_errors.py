"""Every usage error of every command is one line: the walk.

Every click command and group of `ledger.cli.cli` is found by introspection (a command
added later is walked too) and fed the bad arguments its parameters admit: an unknown
option, a flag given a value, an option without its value, each required argument or
option left out, an extra argument, and a bad value for every typed parameter (an int
that is not one or out of its range, a choice that is not one, a duration that is not
one, a file that does not exist, a file where a directory goes and the other way
round). Each must exit 2 with exactly one stderr line
``steptrail: error: UsageError: ...; see 'steptrail COMMAND --help'`` (click's
multi-line usage block is a regression), no traceback, nothing on stdout — under
``--json`` one error object — and no file of the ledger's directory changed.

The walk runs in-process through `cli.main`, the same function the console script
calls; a sample (the cases named by issue 12 and one per command) runs through the
real entry point, ``python -m ledger``, as subprocesses. Ctrl-C is here too: exit 130,
one line, nothing half done.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from conftest import CLEAN_ENV

from ledger import Ledger
from ledger.cli import Duration, cli

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: A value for a required parameter that is not the one under test (by name).
REQUIRED_VALUES = {"holder": "agent-1", "reason": "why", "target": "fresh-dir"}


@dataclass(frozen=True)
class Case:
    path: tuple[str, ...]  # the command's path below `steptrail`
    argv: tuple[str, ...]  # what follows the command's path
    what: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"steptrail {' '.join((*self.path, *self.argv))} [{self.what}]"


def commands(group: click.Group = cli, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and group below `group`, with its path, depth first."""
    yield path, group
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def _dummy(param: click.Parameter) -> str:
    """A value for a required parameter that click accepts."""
    if isinstance(param.type, click.Path) and param.type.exists:
        return "exists.txt"
    return REQUIRED_VALUES.get(param.name or "", "s1")


def _option_name(option: click.Option) -> str:
    return max(option.opts, key=len)


def bad_values(param: click.Parameter) -> list[tuple[str, str]]:
    """(value, what) pairs click must refuse for `param`."""
    t = param.type
    out: list[tuple[str, str]] = []
    if isinstance(t, click.IntRange):
        out.append(("x", "not an int"))
        if t.min is not None:
            out.append((str(t.min - 1), "below its range"))
        if t.max is not None:
            out.append((str(t.max + 1), "above its range"))
    elif isinstance(t, click.types.IntParamType | click.types.FloatParamType):
        out.append(("x", "not a number"))
    elif isinstance(t, click.Choice):
        out.append(("bogus-choice", "not a choice"))
    elif isinstance(t, Duration):
        out.extend([("soon", "not a duration"), ("10y", "an unknown unit"),
                     ("999999d", "too long")])
        if not t.allow_zero:
            out.append(("0s", "zero"))
    elif isinstance(t, click.Path):
        if t.exists:
            out.append(("no-such-dir/no-such-file", "a missing file"))
        if not t.file_okay:
            out.append(("exists.txt", "a file where a directory goes"))
        if not t.dir_okay:
            out.append(("a-dir", "a directory where a file goes"))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for path, command in commands():
        params = [p for p in command.params if p.name != "version"]
        arguments = [p for p in params if isinstance(p, click.Argument)]
        options = [p for p in params if isinstance(p, click.Option)]
        required_args = tuple(_dummy(a) for a in arguments if a.required)
        required_opts = [o for o in options if o.required]

        def valid(but: click.Parameter | None = None) -> tuple[str, ...]:
            """The required arguments and options, except `but`."""
            opts: list[str] = []
            for o in required_opts:
                if o is not but:
                    opts += [_option_name(o), _dummy(o)]
            return (*required_args, *opts)

        out.append(Case(path, (*valid(), "--no-such-option"), "an unknown option"))
        if isinstance(command, click.Group):
            out.append(Case(path, ("no-such-command",), "an unknown command"))
            if path and not command.invoke_without_command:  # (the root's own: a bare
                # 'steptrail'; 'export' runs with no command: its own export)
                out.append(Case(path, (), "no command"))
            continue
        if not any(a.nargs == -1 for a in arguments):
            optional = tuple(_dummy(a) for a in arguments if not a.required)
            out.append(Case(path, (*valid(), *optional, "extra-argument"), "an extra argument"))
        if arguments and arguments[0].required:
            out.append(Case(path, (), "the required arguments left out"))
        for o in required_opts:
            out.append(Case(path, valid(but=o), f"{_option_name(o)} left out"))
        for o in options:
            name = _option_name(o)
            if o.is_flag:
                if name != "--help":
                    out.append(Case(path, (*valid(), f"{name}=1"), f"the flag {name} given a value"))
                continue
            if o.name in ("help",):
                continue
            others = valid(but=o) if o.required else valid()
            out.append(Case(path, (*others, name), f"{name} without its value"))
            for value, what in bad_values(o):
                out.append(Case(path, (*others, name, value), f"{name}: {what}"))
        for i, a in enumerate(arguments):
            for value, what in bad_values(a):
                args = list(required_args)
                if i < len(args):
                    args[i] = value
                else:
                    args.append(value)
                opts = [x for o in required_opts for x in (_option_name(o), _dummy(o))]
                out.append(Case(path, (*args, *opts), f"{a.human_readable_name}: {what}"))
    # the root's own options, and an option's value from the environment
    out.append(Case((), ("--ledger",), "--ledger without its value"))
    out.append(Case((), ("--witness", "a-dir", "steps"), "--witness: a directory"))
    out.append(Case(("step", "apply"), ("s1",), "STEPTRAIL_EPOCH not an int",
                    (("STEPTRAIL_EPOCH", "x"),)))
    return out


#: The cases issue 12 names, run by the real entry point.
ISSUE_CASES = [
    Case(("step", "apply"), ("s1", "--epoch", "0"), "issue 12"),
    Case(("lease", "acquire"), ("--holder", "a", "--ttl", "10y"), "issue 12"),
    Case(("steps",), ("--state", "bogus"), "issue 12"),
    Case(("step", "plan"), ("--epoch", "1", "no-such-plan.json"), "issue 12"),
    Case(("step", "compensate"), ("s1",), "issue 12"),
    Case(("gc",), ("--max-runtime", "soon"), "issue 12"),
    Case((), ("--ledger",), "issue 12"),
    Case((), ("no-such-command",), "issue 12"),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A directory holding a ledger with a workspace `w` and a step, a file and a dir."""
    tmp = tmp_path_factory.mktemp("usage")
    (tmp / "ws").mkdir()
    (tmp / "a-dir").mkdir()
    (tmp / "exists.txt").write_text("x")
    with Ledger.init(tmp / "state" / "ledger.db") as led:
        led.workspaces.add("w", str(tmp / "ws"))
        led.plan("s1", artifacts=("a.txt",))
    return tmp


def snapshot(place: pathlib.Path) -> dict[str, tuple[bytes, int, int]]:
    state = place / "state"
    return {str(p.relative_to(state)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
            for p in sorted(state.rglob("*")) if p.is_file()}


def _argv(place: pathlib.Path, case: Case, as_json: bool) -> list[str]:
    # --json right after the command's path: the parse reaches it whatever breaks after
    return ["--ledger", str(place / "state" / "ledger.db"), *case.path,
            *(["--json"] if as_json else []), *case.argv]


def _takes_json(case: Case) -> bool:
    command: click.Command = cli
    for name in case.path:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), name)  # chaos: an entry point
    return any(p.name == "as_json" for p in command.params)


def check(case: Case, code: int, out: str, err: str, as_json: bool) -> None:
    """The rule for a usage error's output."""
    label = case.label + (" --json" if as_json else "")
    assert "Traceback" not in out + err, (label, out, err)
    assert "Usage:" not in err, (label, err)  # click's usage block: a regression
    assert code == 2, (label, code, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), (label, err)
    assert err.startswith("steptrail: error: UsageError: "), (label, err)
    where = " ".join(("steptrail", *case.path))  # the command whose parse failed
    assert err.endswith(f"; see '{where} --help'\n"), (label, err)
    if not as_json:
        assert out == "", (label, out)
        return
    doc = json.loads(out)
    assert out.count("\n") == 1 and doc["ok"] is False, (label, out)
    assert doc["error"] == {"type": "UsageError", "exit_code": 2, "retryable": False,
                            "message": err.removeprefix("steptrail: error: UsageError: ")
                            .rstrip("\n")}, (label, doc)


CASES = cases()


def test_the_walk_covers_every_command_and_every_kind_of_bad_argument() -> None:
    walked = {c.path for c in CASES}
    every = {path for path, _ in commands()}
    assert walked == every
    assert len(every) > 30  # the walk found the subcommands
    kinds = {c.what.split(": ")[-1] for c in CASES}
    for kind in ("an unknown option", "not an int", "below its range", "not a choice",
                 "not a duration", "a missing file", "a file where a directory goes",
                 "a directory where a file goes", "the required arguments left out",
                 "--holder left out", "--reason left out", "an extra argument",
                 "an unknown command", "no command"):
        assert kind in kinds, kind


def test_every_usage_error_is_one_line_and_changes_nothing(
        place: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(place)
    before = snapshot(place)
    runner = CliRunner()
    for case in CASES:
        for as_json in (False, True) if _takes_json(case) else (False,):
            r = runner.invoke(cli, _argv(place, case, as_json),
                              env={**CLEAN_ENV, **dict(case.env)})
            assert r.exception is None or isinstance(r.exception, SystemExit), (
                case.label, r.exception)
            check(case, r.exit_code, r.stdout, r.stderr, as_json)
        assert snapshot(place) == before, case.label  # not even SQLite's lock files


def test_help_and_version_still_exit_0() -> None:
    runner = CliRunner()
    for path, _command in commands():
        r = runner.invoke(cli, [*path, "--help"], env=CLEAN_ENV)
        assert r.exit_code == 0 and r.stdout.startswith(f"Usage: {' '.join(('steptrail', *path))}"), (
            path, r.stdout[:200])
        assert r.stderr == ""
    r = runner.invoke(cli, ["--version"], env=CLEAN_ENV)
    assert r.exit_code == 0 and r.stdout.startswith("steptrail, version ")


def _sample() -> list[Case]:
    """The issue's cases, then one case per command (its first)."""
    seen: set[tuple[str, ...]] = set()
    out = list(ISSUE_CASES)
    for case in CASES:
        if case.path not in seen:
            seen.add(case.path)
            out.append(case)
    return out


def _env(extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_the_real_entry_point_prints_one_line(place: pathlib.Path) -> None:
    before = snapshot(place)
    sample = _sample()

    def run(case_json: tuple[Case, bool]) -> tuple[Case, bool, subprocess.CompletedProcess[str]]:
        case, as_json = case_json
        return case, as_json, subprocess.run(
            [sys.executable, "-m", "ledger", *_argv(place, case, as_json)], cwd=place,
            env=_env(case.env), capture_output=True, text=True, timeout=60)

    jobs = [(c, False) for c in sample] + [(c, True) for c in ISSUE_CASES if _takes_json(c)]
    with ThreadPoolExecutor(8) as pool:
        for case, as_json, r in pool.map(run, jobs):
            check(case, r.returncode, r.stdout, r.stderr, as_json)
    assert snapshot(place) == before


def test_the_issues_cases_say_what_is_wrong(place: pathlib.Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(place)
    expected = ["'--epoch'", "'10y' is not a duration", "'bogus' is not one of",
                "'no-such-plan.json' does not exist", "Missing option '--reason'",
                "'soon' is not a duration", "Option '--ledger' requires an argument",
                "No such command 'no-such-command'"]
    for case, words in zip(ISSUE_CASES, expected, strict=True):
        r = CliRunner().invoke(cli, _argv(place, case, False), env=CLEAN_ENV)
        check(case, r.exit_code, r.stdout, r.stderr, False)
        assert words in r.stderr, (case.label, r.stderr)


# --- Ctrl-C ----------------------------------------------------------------------------


def _interrupted_ok(r_code: int, err: str) -> None:
    assert r_code == 130, (r_code, err)
    assert err.count("\n") == 1, err
    assert err.startswith("steptrail: error: Interrupted: "), err
    assert "Traceback" not in err and "Aborted" not in err


def test_ctrl_c_during_a_long_command_exits_130_with_one_line(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "ledger.db"
    with Ledger.init(db) as led:
        led.plan("s1", artifacts=("a.txt",))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger", "--ledger", str(db), "fuzz", "--seeds", "100000",
         "--dir", str(scratch)], env=_env(), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(scratch.iterdir()) and time.monotonic() < deadline:  # it is running
            time.sleep(0.05)
        time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _interrupted_ok(proc.returncode, err)
    assert out == ""
    r = subprocess.run([sys.executable, "-m", "ledger", "--ledger", str(db), "verify"],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r


#: A `steptrail` whose Ctrl-C lands inside a write transaction of the ledger: the real
#: signal, sent to itself while the heartbeat's transaction is open (BEGIN IMMEDIATE).
_INTERRUPT_IN_TXN = textwrap.dedent("""
    import os, signal, sys
    from ledger.store.sqlite import SqliteTx
    real = SqliteTx.workspace
    def workspace(tx, name):
        row = real(tx, name)
        assert tx._db.conn.in_transaction  # the heartbeat's BEGIN IMMEDIATE is open
        os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt at the next bytecode
        return row
    SqliteTx.workspace = workspace
    from ledger.cli import main
    sys.argv[0] = "steptrail"
    main()
""")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_inside_a_transaction_leaves_what_a_crash_leaves(tmp_path: pathlib.Path,
                                                                as_json: bool) -> None:
    db = tmp_path / "ledger.db"
    (tmp_path / "ws").mkdir()
    with Ledger.init(db) as led:
        led.workspaces.add("w", str(tmp_path / "ws"))
        epoch = led.workspaces.acquire("w", "agent-1", 600).epoch
        expires, count = led.workspaces.lease("w").expires_ns, led.count()
    r = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_IN_TXN, "--ledger", str(db), "--workspace", "w",
         "lease", "heartbeat", "--epoch", str(epoch), "--ttl", "7d",
         *(["--json"] if as_json else [])],
        env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    _interrupted_ok(r.returncode, r.stderr)
    if as_json:
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["error"]["type"] == "Interrupted"
        assert doc["error"]["exit_code"] == 130
    else:
        assert r.stdout == ""
    with Ledger.open(db) as led:  # rolled back: not renewed, nothing recorded, not locked
        assert led.count() == count and led.workspaces.lease("w").expires_ns == expires
        assert led.verify().ok
        led.workspaces.heartbeat("w", epoch, 60)  # the ledger is writable at once
        assert led.count() == count + 1


def test_click_abort_is_an_interrupt_too(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: pathlib.Path) -> None:
    def abort(*_args: object, **_kwargs: object) -> None:
        raise click.Abort()

    monkeypatch.setattr(Ledger, "open", abort)  # the class the CLI imports when it opens one
    r = CliRunner().invoke(cli, ["--ledger", str(tmp_path / "l.db"), "steps"], env=CLEAN_ENV)
    _interrupted_ok(r.exit_code, r.stderr)
    assert r.stdout == ""

"""Issue 12's command line, as a newcomer meets it: messages that say what happened,
`step store --as`, `workspace read`, and the text output's nits (plurals, times, CSV
booleans, a lease TTL a person can type commands in)."""

from __future__ import annotations

import base64
import csv
import io
import json
import pathlib
import re
from typing import Any

import pytest

from conftest import CliOut, digest_of, lock_files_aside, run_cli

from ledger import Ledger
from ledger.errors import LeaseHeld, StaleEpoch

h = digest_of
ISO_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


class World:
    """A ledger, a workspace `w` holding app.py = "v0", the CLI in-process."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.ledger = tmp / "state" / "ledger.db"
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0")
        assert self("init").code == 0
        assert self("workspace", "add", "w", str(self.dir)).code == 0

    def __call__(self, *args: str, input: str | bytes | None = None) -> CliOut:
        return run_cli(["--ledger", str(self.ledger), *args], input=input)

    def acquire(self, holder: str = "agent-1", *extra: str) -> int:
        r = self("--workspace", "w", "lease", "acquire", "--holder", holder, "--no-observe",
                 "--json", *extra)
        assert r.code == 0, r
        return int(r.json["epoch"])

    def plan(self, doc: dict[str, Any], epoch: int) -> CliOut:
        return self("--workspace", "w", "step", "plan", "--epoch", str(epoch), "-", "--json",
                    input=json.dumps(doc))

    def count(self) -> int:
        with Ledger.open(self.ledger, readonly=True) as led:
            return led.count()

    def state(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.ledger.parent)): p.read_bytes()
                for p in sorted(self.ledger.parent.rglob("*")) if p.is_file()}


@pytest.fixture
def world(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.chdir(tmp_path)
    return World(tmp_path)


def one_error(r: CliOut, code: int, type_name: str) -> str:
    assert r.code == code, r
    assert r.err.count("\n") == 1 and r.err.startswith(f"steptrail: error: {type_name}: "), r
    return r.err


# --- misleading messages ----------------------------------------------------------------


def test_a_regular_file_as_workspace_directory_is_not_a_directory(world: World) -> None:
    (world.tmp / "run.sh").write_text("#!/bin/sh\n")
    count = world.count()
    err = one_error(world("workspace", "add", "w3", "./run.sh"), 2, "InvalidInput")
    assert "is not a directory" in err and "does not exist" not in err
    err = one_error(world("workspace", "add", "w4", "./nowhere"), 2, "InvalidInput")
    assert "does not exist" in err  # (and what is missing still says so)
    assert world.count() == count


def test_an_epoch_above_the_live_one_was_never_issued(world: World) -> None:
    world.acquire()
    live = world.acquire("agent-2", "--force")
    assert live == 2
    count = world.count()
    doc = {"step": "s1", "writes": [{"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}
    for r in (world.plan(doc, 7),
              world("--workspace", "w", "lease", "heartbeat", "--epoch", "7"),
              world("--workspace", "w", "lease", "release", "--epoch", "7")):
        err = one_error(r, 1, "StaleEpoch")
        assert "epoch 7 was never issued (the live epoch is 2)" in err, err
        assert "'steptrail lease acquire'" in err and "superseded" not in err
    assert world.count() == count


def test_a_zombie_hears_it_was_taken_over_by_whom(world: World) -> None:
    zombie = world.acquire("agent-1")
    world.acquire("agent-2", "--force")
    r = world("--workspace", "w", "lease", "heartbeat", "--epoch", str(zombie), "--json")
    err = one_error(r, 1, "StaleEpoch")
    assert (f"epoch {zombie} is not live: the lease was taken over by epoch 2, holder"
            " 'agent-2'") in err
    assert "this worker must stop" in err and "never revived" not in err
    assert r.json["error"]["live"] == 2 and r.json["error"]["epoch"] == zombie  # facts as ever


def test_an_expired_lease_is_never_revived_and_says_so(tmp_path: pathlib.Path) -> None:
    (tmp_path / "ws").mkdir()
    now = [10**18]
    with Ledger.init(tmp_path / "l.db", clock=lambda: now[0]) as led:
        led.workspaces.add("w", str(tmp_path / "ws"))
        epoch = led.workspaces.acquire("w", "agent-1", 60).epoch
        now[0] += 61 * 10**9
        with pytest.raises(StaleEpoch, match="expired or was released, and an ended lease is"
                           " never revived") as caught:
            led.workspaces.heartbeat("w", epoch, 60)
        assert "taken over" not in str(caught.value)


def test_lease_held_prints_its_time_like_everything_else(world: World) -> None:
    world.acquire()
    err = one_error(world("--workspace", "w", "lease", "acquire", "--holder", "b"), 1,
                    "LeaseHeld")
    assert "+00:00" not in err and ISO_Z.search(err), err
    shown = world("--workspace", "w", "lease", "show", "--json").json
    assert f"until {shown['expires']};" in err  # the very form `lease show` prints
    assert str(LeaseHeld("w", 1, "a", 0)).count("1970-01-01T00:00:00.000Z") == 1


# --- step store --as ----------------------------------------------------------------------


def test_store_refuses_an_absolute_file_without_as_and_names_the_fix(world: World) -> None:
    outside = world.tmp / "elsewhere" / "report.xml"
    outside.parent.mkdir()
    outside.write_text("<ok/>")
    before = world.state()
    for file in (str(outside), f"../{world.tmp.name}/elsewhere/report.xml"):
        err = one_error(world("step", "store", "build-7", file), 2, "InvalidInput")
        assert "--as NAME" in err and "relative to the workspace" not in err, err
    assert world.state() == before


def test_store_as_names_a_file_from_anywhere(world: World) -> None:
    outside = world.tmp / "elsewhere"
    outside.mkdir()
    (outside / "report.xml").write_text("<ok/>")
    (world.tmp / "log.txt").write_text("log")
    r = world("step", "store", "build-7", str(outside / "report.xml"), "log.txt",
              "--as", "out/report.xml", "--as", "logs/test.log", "--json")
    assert r.code == 0, r
    assert [(s["path"], s["file"], s["digest"]) for s in r.json["stored"]] == [
        ("out/report.xml", str(outside / "report.xml"), h("<ok/>")),
        ("logs/test.log", "log.txt", h("log"))]
    assert world("step", "publish", "build-7").code == 0
    with Ledger.open(world.ledger, readonly=True) as led:
        manifest = led.manifest("build-7")
        assert manifest is not None
        assert {e.path for e in manifest.artifacts} == {"out/report.xml", "logs/test.log"}
    text = world("step", "store", "build-8", str(outside / "report.xml"), "--as", "r.xml")
    assert text.code == 0 and text.out.rstrip().endswith(f"r.xml  (from {outside}/report.xml)")


@pytest.mark.parametrize("names, type_name, words", [
    (["a.txt"], "UsageError", "give one --as NAME per FILE, in order: 2 FILEs, 1 --as"),
    (["a", "b", "c"], "UsageError", "2 FILEs, 3 --as"),
    (["/abs/a", "b"], "InvalidInput", "is absolute; an artifact's name is a relative path"),
    (["../a", "b"], "InvalidInput", "escapes its root"),
    (["a//b", "b"], "InvalidInput", "not normalized"),
    (["same", "same"], "InvalidInput", "artifact 'same' given twice"),
])
def test_store_as_names_are_checked_like_any_artifact_path(
        world: World, names: list[str], type_name: str, words: str) -> None:
    (world.tmp / "a.txt").write_text("a")
    (world.tmp / "b.txt").write_text("b")
    before = world.state()
    argv = ["step", "store", "s1", "a.txt", "b.txt"]
    for n in names:
        argv += ["--as", n]
    for extra in ((), ("--json",)):
        r = world(*argv, *extra)
        err = one_error(r, 2, type_name)
        assert words in err, err
        if type_name == "UsageError":
            assert err.endswith("; see 'steptrail step store --help'\n")
    assert world.state() == before


# --- nits ---------------------------------------------------------------------------------


ONE_PLURAL = re.compile(r"(?<![\d.])1 (steps|events|compensations|blobs|paths|findings|warnings"
                        r"|violations|files|bytes|seeds|artifacts|commits|operations|applies"
                        r"|new epochs|planned writes|crash points)\b")


def test_text_output_says_1_step_not_1_steps(world: World) -> None:
    (world.tmp / "a.txt").write_text("a")
    assert world("step", "store", "a1", "a.txt").code == 0
    assert world("step", "compensate", "a1", "--reason", "bad").code == 0
    outputs = {argv: world(*argv.split()) for argv in
               ("rebuild", "verify", "metrics", "steps", "show a1", "events", "audit",
                "gc --dry-run", "blobs", "workspace show w")}
    for argv, r in outputs.items():
        assert r.code == 0, (argv, r)
        text = r.out + r.err
        assert not ONE_PLURAL.search(text), (argv, ONE_PLURAL.search(text), text)
        assert "(s)" not in text, (argv, text)
    assert outputs["rebuild"].out.startswith("rebuilt 1 step from ")
    assert " 1 step," in outputs["verify"].out
    assert "1 compensation in all" in outputs["metrics"].out
    assert "0 applies found their writes on disk, 0 compensations" in outputs["metrics"].out


def test_events_text_prints_times_not_nanoseconds(world: World) -> None:
    world.acquire()
    r = world("events", "--kind", "lease-acquired")
    assert r.code == 0 and "expires_ns=" not in r.out, r.out
    expires = world("--workspace", "w", "lease", "show", "--json").json["expires"]
    assert f"expires {expires}" in r.out and ISO_Z.fullmatch(expires)


def test_csv_export_prints_booleans_as_true_and_false(world: World) -> None:
    (world.tmp / "a.txt").write_text("a")
    for step in ("kept", "open"):
        assert world("step", "store", step, "a.txt").code == 0
    assert world("step", "publish", "kept").code == 0
    r = world("export", "--what", "steps", "--format", "csv")
    assert r.code == 0 and "True" not in r.out and "False" not in r.out
    rows = {row["step_id"]: row for row in csv.DictReader(io.StringIO(r.out))}
    assert rows["kept"]["live"] == "true" and rows["open"]["live"] == "false"
    jsonl = [json.loads(line) for line in
             world("export", "--what", "steps").out.splitlines()]
    assert {row["step_id"]: row["live"] for row in jsonl} == {"kept": True, "open": False}


def test_the_cli_lease_lasts_10_minutes_by_default(world: World) -> None:
    lease = world("--workspace", "w", "lease", "acquire", "--holder", "me", "--json").json
    assert 590 < lease["remaining_s"] <= 600
    hb = world("--workspace", "w", "lease", "heartbeat", "--epoch", "1", "--json").json
    assert 590 < hb["remaining_s"] <= 600
    shown = world("lease", "acquire", "--help").out
    assert "default: 10m" in shown and "60s" in shown  # and the library's default, named


# --- workspace read: the planner's read ---------------------------------------------------


def read_raw(world: World, *args: str) -> Any:
    from click.testing import CliRunner

    from conftest import CLEAN_ENV
    from ledger.cli import cli

    return CliRunner().invoke(cli, ["--ledger", str(world.ledger), *args], env=CLEAN_ENV)


def test_workspace_read_prints_the_bytes_unchanged_and_the_facts_on_stderr(world: World) -> None:
    data = b"line 1\r\nno newline at the end \xff\x00"
    (world.dir / "bin.dat").write_bytes(data)
    before = world.state()
    r = read_raw(world, "--workspace", "w", "workspace", "read", "bin.dat")
    assert r.exit_code == 0 and r.stdout_bytes == data
    assert r.stderr == f"# rev 0 pre_hash {h(data)}\n"
    js = world("workspace", "read", "bin.dat", "--workspace", "w", "--json")
    assert js.code == 0 and js.json == {
        "workspace": "w", "path": "bin.dat", "rev": 0, "pre_hash": h(data), "exists": True,
        "size_bytes": len(data), "content": None,
        "content_base64": base64.b64encode(data).decode()}
    text = world("--workspace", "w", "workspace", "read", "app.py", "--json").json
    assert text["content"] == "v0" and "content_base64" not in text and text["size_bytes"] == 2
    absent = read_raw(world, "--workspace", "w", "workspace", "read", "new/file.txt")
    assert absent.exit_code == 0 and absent.stdout_bytes == b""
    assert absent.stderr == "# rev 0 pre_hash absent\n"
    assert world("--workspace", "w", "workspace", "read", "new/file.txt", "--json").json == {
        "workspace": "w", "path": "new/file.txt", "rev": 0, "pre_hash": None, "exists": False,
        "size_bytes": None, "content": None}
    assert lock_files_aside(world.state()) == lock_files_aside(before)  # read-only
    err = one_error(world("--workspace", "w", "workspace", "read", "../x"), 2, "InvalidInput")
    assert "escapes its root" in err
    one_error(world("workspace", "read", "app.py"), 2, "InvalidInput")  # which workspace?


def test_a_plan_from_workspace_read_is_fenced_on_what_was_read(world: World) -> None:
    epoch = world.acquire()
    assert world.plan({"step": "s1", "writes": [
        {"path": "app.py", "pre_hash": h("v0"), "content": "v1"}]}, epoch).code == 0
    assert world("step", "apply", "s1", "--epoch", str(epoch)).code == 0
    seen = world("--workspace", "w", "workspace", "read", "app.py", "--json").json
    assert (seen["rev"], seen["content"], seen["pre_hash"]) == (1, "v1", h("v1"))

    # the planner read v1; a person edits the file before the plan is made: the plan
    # built from the read is refused, where a snapshot taken now would hide the edit
    (world.dir / "app.py").write_text("a person's edit")
    snap = world("--workspace", "w", "workspace", "snapshot", "app.py", "--json").json
    assert snap["paths"][0]["pre_hash"] == h("a person's edit")  # not what the planner saw
    write = {"path": "app.py", "base_rev": seen["rev"], "pre_hash": seen["pre_hash"],
             "content": seen["content"] + " and the agent's change"}
    assert world.plan({"step": "s2", "writes": [write]}, epoch).code == 0
    r = world("step", "apply", "s2", "--epoch", str(epoch), "--json")
    err = one_error(r, 1, "StepRejected")
    assert r.json["verdict"] == "rejected:pre_hash", err
    assert (world.dir / "app.py").read_text() == "a person's edit"  # not applied over

    # read again, plan again: applied
    again = world("--workspace", "w", "workspace", "read", "app.py", "--json").json
    write = {"path": "app.py", "base_rev": again["rev"], "pre_hash": again["pre_hash"],
             "content": again["content"] + ", kept"}
    assert world.plan({"step": "s3", "writes": [write]}, epoch).code == 0
    assert world("step", "apply", "s3", "--epoch", str(epoch)).code == 0
    assert (world.dir / "app.py").read_text() == "a person's edit, kept"


def test_snapshot_help_sends_planners_to_workspace_read(world: World) -> None:
    shown = world("workspace", "snapshot", "--help").out
    assert "NOW" in shown and "steptrail workspace read" in shown
    assert "workspace read" in world("workspace", "--help").out


def test_steps_lists_several_states_and_the_in_flight_ones(world: World) -> None:
    epoch = world.acquire()
    read = world("--workspace", "w", "workspace", "read", "app.py", "--json").json
    for step in ("a", "b"):
        write = {"path": f"{step}.txt", "pre_hash": None, "content": step}
        assert world.plan({"step": step, "writes": [write]}, epoch).code == 0
    assert world("step", "apply", "a", "--epoch", str(epoch)).code == 0
    write = {"path": "app.py", "pre_hash": read["pre_hash"], "content": "v1"}
    assert world.plan({"step": "c", "writes": [write]}, epoch).code == 0
    for step in ("c",):
        assert world("step", "apply", step, "--epoch", str(epoch)).code == 0
        assert world("step", "publish", step).code == 0
        assert world("step", "ack", step, "--epoch", str(epoch)).code == 0
    names = lambda r: sorted(row["step_id"] for row in r.json)  # noqa: E731
    assert names(world("steps", "--in-flight", "--json")) == ["a", "b"]
    assert names(world("steps", "--state", "planned", "--state", "acked", "--json")) == ["b", "c"]
    assert names(world("steps", "--state", "fenced", "--json")) == ["a"]
    r = world("steps", "--state", "compensated")
    assert r.code == 0 and r.err.strip() == "no steps in state compensated"


def test_show_says_a_settled_conflict_is_a_conflict_not_restored(world: World) -> None:
    epoch = world.acquire()
    read = world("--workspace", "w", "workspace", "read", "app.py", "--json").json
    write = {"path": "app.py", "pre_hash": read["pre_hash"], "content": "v1"}
    assert world.plan({"step": "s1", "writes": [write]}, epoch).code == 0
    assert world("step", "apply", "s1", "--epoch", str(epoch)).code == 0
    (world.dir / "app.py").write_text("a person's edit")  # then the worker dies
    r = world("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force")
    assert r.code == 1, r  # settling left a conflict for a human
    shown = world("show", "s1").out
    line = next(x for x in shown.splitlines()[1:] if "compensated" in x)
    assert "app.py conflict" in line and "app.py restored" not in line, line


# --- issue 26: newcomer papercuts that were bugs -----------------------------------------


def test_init_creates_the_ledgers_own_directory_and_nothing_above_it(
        tmp_path: pathlib.Path) -> None:
    """`--ledger /nonexistent/dir/l.db init` made /nonexistent/dir (as root: at the file
    system's root). Only the ledger's own directory is created; --parents makes them all."""
    import subprocess
    import sys

    missing = tmp_path / "nonexistent" / "dir" / "l.db"
    err = one_error(run_cli(["--ledger", str(missing), "init"]), 2, "InvalidInput")
    assert f"{tmp_path / 'nonexistent'} does not exist" in err and "--parents" in err
    assert run_cli(["--ledger", str(missing), "init", "--json"]).code == 2
    assert not (tmp_path / "nonexistent").exists()  # nothing written
    (tmp_path / "ws").mkdir()
    own = tmp_path / "ws" / ".steptrail" / "ledger.db"  # the default layout: one level
    assert run_cli(["--ledger", str(own), "init"]).code == 0 and own.is_file()
    got = run_cli(["--ledger", str(missing), "init", "--parents"])
    assert got.code == 0 and got.out == f"created ledger {missing}\n" and missing.is_file()
    # `steptrail mcp` creates its ledger the same way
    elsewhere = tmp_path / "typo" / "d" / "l.db"
    out = subprocess.run([sys.executable, "-m", "ledger", "--ledger", str(elsewhere), "mcp",
                          "--workspace", str(tmp_path / "ws")], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and not (tmp_path / "typo").exists(), out.stderr


def test_lease_show_says_expired_at_or_expires_never_both(world: World) -> None:
    """`lease show` printed "expired, expires T" for a lease long over."""
    with Ledger.open(world.ledger, clock=lambda: 1_000_000_000_000_000_000) as led:
        led.workspaces.acquire("w", "agent-0", ttl_s=60)  # in 2001: long expired by now
    line = world("--workspace", "w", "lease", "show").out.splitlines()[0]
    assert line == "workspace w: epoch 1 held by agent-0, expired at 2001-09-09T01:47:40.000Z"
    assert world("workspace", "show", "w").out.splitlines()[1] == (
        "  lease: epoch 1 held by agent-0, expired at 2001-09-09T01:47:40.000Z")
    epoch = world.acquire("agent-1")
    line = world("--workspace", "w", "lease", "show").out.splitlines()[0]
    assert re.fullmatch(rf"workspace w: epoch 2 held by agent-1, live, expires {ISO_Z.pattern}",
                        line), line
    released = world("--workspace", "w", "lease", "release", "--epoch", str(epoch)).out
    assert released == "workspace w: epoch 2 held by agent-1, released\n"


def test_metrics_prints_its_whole_result_on_stdout(world: World) -> None:
    """`metrics` wrote its last line, `over N events`, to stderr."""
    got = world("metrics")
    assert got.code == 0 and got.err == ""
    assert world.count() == 1 and got.out.splitlines()[-1] == "over 1 event"


def test_backup_restores_next_line_runs_as_printed_while_a_lease_is_live(
        world: World, tmp_path: pathlib.Path) -> None:
    """The `next:` hint of `backup restore` omitted --force, which `restore` needs while
    the lease the backup holds is live: as printed, it failed."""
    import shlex

    world.acquire()  # live for 10 minutes, in the backup too
    assert world("backup", str(tmp_path / "backup")).code == 0
    got = run_cli(["backup", "restore", str(tmp_path / "backup"), str(tmp_path / "new dir")])
    assert got.code == 0, got
    [hint] = [x for x in got.out.splitlines() if x.startswith("next: ")]
    argv = shlex.split(hint.removeprefix("next: "))
    assert argv[0] == "steptrail" and argv[-1] == "--force", hint
    argv[argv.index("DIR")] = str(tmp_path / "restored")
    again = run_cli(argv[1:])
    assert again.code == 0, again
    assert "restored workspace w to" in again.out
    doc = run_cli(["backup", "restore", str(tmp_path / "backup"), str(tmp_path / "n2"),
                   "--json"]).json
    assert doc["live_leases"] == ["w"] and doc["workspaces"] == ["w"]

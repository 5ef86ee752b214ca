"""The workspace protocol driven through the `steptrail` command, as a harness in any
language would drive it by subprocess: workspaces, leases, plans, applies, receipts,
compensation, metrics — exit codes, --json shapes, one-line errors, no tracebacks."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import click
import pytest

from conftest import CliOut, LedgerAt, digest_of, lock_files_aside, run_cli, sqlite_at

from ledger import Ledger
from ledger.cli import cli
from ledger.errors import StorageFailure, Unsettled
from ledger.events import LeaseAcquired
from ledger.step.values import StepPlan, Write
from ledger.workspace import placing
from ledger.workspace.directory import WorkspaceDir

ROOT = pathlib.Path(__file__).resolve().parents[2]
h = digest_of
Out = CliOut


class Cli:
    """`steptrail --ledger LOCATION ...` in-process; every call is checked for tracebacks."""

    def __init__(self, ledger: pathlib.Path | str) -> None:
        self.ledger = ledger

    def __call__(self, *args: str, input: str | bytes | None = None,
                 env: dict[str, str] | None = None) -> Out:
        return run_cli(["--ledger", str(self.ledger), *args], input=input, env=env)

    def count(self) -> int:
        with Ledger.open(self.ledger, readonly=True) as ledger:
            return ledger.count()


class World:
    """The ledger at `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: pathlib.Path, *, at: LedgerAt = sqlite_at) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0")
        self.cli = Cli(at(tmp / "ledger.db"))
        assert self.cli("init").code == 0
        assert self.cli("workspace", "add", "w", str(self.dir)).code == 0

    def acquire(self, holder: str = "agent-1", *extra: str) -> int:
        r = self.cli("--workspace", "w", "lease", "acquire", "--holder", holder, "--ttl", "10m",
                     "--no-observe", "--json", *extra)  # (the revisions below are the steps')
        assert r.code == 0, r
        return int(r.json["epoch"])

    def plan(self, doc: dict[str, Any], epoch: int, *extra: str) -> Out:
        return self.cli("--workspace", "w", "step", "plan", "--epoch", str(epoch), "-", "--json",
                        *extra, input=json.dumps(doc))

    def disk(self, path: str = "app.py") -> str:
        return (self.dir / path).read_text()


def write(path: str, new: str, pre: str | None, base: int | None = None) -> dict[str, Any]:
    w: dict[str, Any] = {"path": path, "pre_hash": None if pre is None else h(pre), "content": new}
    if base is not None:
        w["base_rev"] = base
    return w


@pytest.fixture
def world(tmp_path: pathlib.Path, ledger_at: LedgerAt, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.chdir(tmp_path)  # `step store` names artifacts by their relative paths
    return World(tmp_path, at=ledger_at)


# --- the whole protocol -------------------------------------------------------------------


def test_the_whole_protocol_by_subprocess(world: World) -> None:
    cli = world.cli
    again = cli("workspace", "add", "w", str(world.dir), "--json")
    assert again.code == 0 and again.json["added"] is False and again.json["name"] == "w"
    epoch = world.acquire()
    assert epoch == 1

    snap = cli("--workspace", "w", "workspace", "snapshot", "app.py", "--json")
    assert snap.json["paths"] == [{"path": "app.py", "base_rev": 0, "pre_hash": h("v0")}]

    plan = {"run": "r1", "steps": [
        {"step": "s1", "writes": [{**snap.json["paths"][0], "content": "v1"}],
         "artifacts": ["out/log.txt"]},
        {"step": "s2", "writes": [write("app.py", "v2", "v1")]},   # chains on s1
    ]}
    r = world.plan(plan, epoch)
    assert r.code == 0, r
    assert r.json == {"workspace": "w", "epoch": 1, "ok": True, "steps": [
        {"step": "s1", "attempt": 1, "verdict": "admitted", "detail": ""},
        {"step": "s2", "attempt": 1, "verdict": "admitted", "detail": ""}]}
    again = world.plan(plan, epoch)  # a retried admission records nothing
    assert again.code == 0 and [s["verdict"] for s in again.json["steps"]] == ["unchanged"] * 2

    applied = cli("step", "apply", "s1", "--epoch", "1", "--json")
    assert applied.code == 0, applied
    doc = applied.json
    assert set(doc) == {"verdict", "step", "attempt", "receipt", "detail"}
    assert (doc["verdict"], doc["step"], doc["attempt"]) == ("applied", "s1", 1)
    receipt = doc["receipt"]
    assert receipt["workspace"] == "w" and receipt["epoch"] == 1 and receipt["rev"] == 1
    mode = (world.dir / "app.py").stat().st_mode & 0o777
    assert receipt["writes"] == [{"path": "app.py", "rev": 1, "pre_hash": h("v0"),
                                  "post_hash": h("v1"), "pre_mode": mode, "post_mode": mode}]
    assert world.disk() == "v1"

    (world.tmp / "out").mkdir()
    (world.tmp / "out" / "log.txt").write_text("log")
    assert cli("step", "store", "s1", "out/log.txt").code == 0
    published = cli("step", "publish", "s1", "--receipt", "-", "--epoch", "1", "--json",
                    input=json.dumps(receipt))
    assert published.code == 0, published
    m = published.json
    assert m["writes"] == [{"path": "app.py", "digest": h("v1"), "size": 2}]
    assert [a["path"] for a in m["artifacts"]] == ["out/log.txt"] and m["live"] is True
    acked = cli("step", "ack", "s1", "--epoch", "1", "--json")
    assert acked.code == 0 and acked.json["deduped"] is False

    # the ack was lost, the client retries the apply: the journal answers
    dup = cli("step", "apply", "s1", "--epoch", "1", "--json")
    assert dup.code == 0 and dup.json["verdict"] == "deduped" and dup.json["receipt"] == receipt
    assert world.disk() == "v1"

    # a stale plan: planned against rev 0 / "v0", app.py moved on
    stale = world.plan({"step": "s3", "writes": [write("app.py", "v0-tail", "v0", base=0)]}, epoch)
    assert stale.code == 0
    count = cli.count()
    r = cli("step", "apply", "s3", "--epoch", "1", "--json")
    assert r.code == 1 and r.json["verdict"] == "rejected:stale_rev" and r.json["receipt"] is None
    assert "app.py is at rev 1" in r.json["detail"]
    assert world.disk() == "v1" and cli.count() == count + 1  # only the rejection

    # s2 chained on s1: applies, publishes without a receipt, then is compensated
    assert cli("step", "apply", "s2", "--epoch", "1").code == 0
    assert world.disk() == "v2"
    assert cli("step", "publish", "s2").code == 0
    comp = cli("step", "compensate", "s2", "--reason", "tests failed", "--epoch", "1", "--json")
    assert comp.code == 0, comp
    assert comp.json["conflicts"] == [] and comp.json["deduped"] is False
    assert [(x["path"], x["outcome"], x["digest"]) for x in comp.json["restored"]] == [
        ("app.py", "restored", h("v1"))]
    assert world.disk() == "v1"
    again = cli("step", "compensate", "s2", "--reason", "tests failed", "--epoch", "1", "--json")
    assert again.code == 0 and again.json["deduped"] is True and again.json["seq"] == comp.json["seq"]

    shown = cli("workspace", "show", "w", "--json").json
    assert shown["rev"] == 3 and shown["live"] is True and shown["epoch"] == 1
    assert shown["paths"] == [{"path": "app.py", "rev": 3, "hash": h("v1")}]

    metrics = cli("metrics", "--json")
    assert metrics.code == 0
    mj = metrics.json
    assert mj["events"] == cli.count()
    assert mj["compensation_success_rate"] == {"rate": 1.0, "compensations": 1,
                                               "with_restores": 1, "succeeded": 1,
                                               "conflicted": 0}
    assert mj["lease_expiration_rate"]["leases"] == 1 and mj["lease_expiration_rate"]["live"] == 1
    assert mj["ambiguous_reconciliations"]["count"] == 0
    assert mj["drift"]["writes"] == 3 and mj["drift"]["max"] == 1  # s3 was planned at rev 1
    assert mj["checkpoint_age_s"]["workspaces"][0]["step"] == "s2"
    human = cli("metrics")
    assert human.code == 0 and "lease expiration rate" in human.out
    assert cli("verify").code == 0


def test_a_single_step_plan_with_b64_file_and_delete_contents(world: World) -> None:
    (world.dir / "old.txt").write_text("old")
    (world.tmp / "plans").mkdir()
    (world.tmp / "plans" / "big.bin").write_bytes(b"\x00\x01binary")
    doc = {"step": "s1", "run": "r9", "writes": [
        {"path": "logo.bin", "pre_hash": None, "content_b64": base64.b64encode(b"\xff\xfe").decode()},
        {"path": "data/big.bin", "pre_hash": None, "content_file": "big.bin"},
        {"path": "old.txt", "pre_hash": h("old"), "base_rev": 0, "delete": True},
    ]}
    plan_file = world.tmp / "plans" / "plan.json"
    plan_file.write_text(json.dumps(doc))  # content_file is relative to the plan's directory
    epoch = world.acquire()
    r = world.cli("--workspace", "w", "step", "plan", "--epoch", str(epoch), str(plan_file))
    assert r.code == 0 and r.out.split() == ["admitted", "s1", "attempt", "1"]
    r = world.cli("step", "apply", "s1", "--epoch", str(epoch))
    assert r.code == 0 and "applied" in r.out and "receipt: {" in r.out
    assert (world.dir / "logo.bin").read_bytes() == b"\xff\xfe"
    assert (world.dir / "data" / "big.bin").read_bytes() == b"\x00\x01binary"
    assert not (world.dir / "old.txt").exists()


def test_environment_supplies_workspace_and_epoch(world: World) -> None:
    epoch = world.acquire()
    env = {"STEPTRAIL_WORKSPACE": "w", "STEPTRAIL_EPOCH": str(epoch)}
    doc = {"step": "s1", "writes": [write("app.py", "v1", "v0")]}
    assert world.cli("step", "plan", "-", input=json.dumps(doc), env=env).code == 0
    assert world.cli("step", "apply", "s1", env=env).code == 0
    assert world.cli("step", "publish", "s1", env=env).code == 0
    assert world.cli("step", "ack", "s1", env=env).code == 0
    shown = world.cli("lease", "show", "--json", env=env)
    assert shown.json["epoch"] == epoch and shown.json["live"] is True


def test_missing_workspace_or_epoch_is_exit_2_with_the_fix(world: World) -> None:
    r = world.cli("lease", "show")
    assert r.code == 2 and "--workspace NAME" in r.err and "STEPTRAIL_WORKSPACE" in r.err
    r = world.cli("--workspace", "w", "step", "plan", "-", input="{}")
    assert r.code == 2 and "--epoch N" in r.err and "STEPTRAIL_EPOCH" in r.err
    r = world.cli("step", "apply", "s1")
    assert r.code == 2 and "--epoch" in r.err
    r = world.cli("--workspace", "nope", "lease", "show")
    assert r.code == 2 and "workspace add nope" in r.err


# --- leases -------------------------------------------------------------------------------


def test_lease_commands_and_durations(world: World) -> None:
    cli = world.cli
    r = cli("--workspace", "w", "lease", "acquire", "--holder", "a1", "--ttl", "10m", "--json")
    lease = r.json
    assert set(lease) >= {"workspace", "epoch", "holder", "expires_ns", "expires", "live",
                          "released", "settled", "remaining_s"}
    assert (lease["epoch"], lease["holder"], lease["live"], lease["settled"]) == (1, "a1", True, [])
    assert 590 < lease["remaining_s"] <= 600 and lease["expires"].endswith("Z")
    hb = cli("lease", "heartbeat", "--workspace", "w", "--epoch", "1", "--ttl", "24h", "--json")
    assert hb.code == 0 and 86_000 < hb.json["remaining_s"] <= 86_400
    shown = cli("lease", "show", "--workspace", "w", "--json").json
    assert shown["epoch"] == 1 and shown["unsettled"] == []
    assert "epoch 1 held by a1, live" in cli("--workspace", "w", "lease", "show").out
    rel = cli("--workspace", "w", "lease", "release", "--epoch", "1", "--json")
    assert rel.code == 0 and rel.json["released"] is True and rel.json["live"] is False
    again = cli("--workspace", "w", "lease", "release", "--epoch", "1")
    assert again.code == 0  # idempotent
    r = cli("--workspace", "w", "lease", "acquire", "--holder", "a2")  # no --force needed
    assert r.code == 0 and r.out.startswith("epoch 2:")
    for bad in ("0s", "ten", "-5s", "1w"):
        r = cli("--workspace", "w", "lease", "acquire", "--holder", "a3", "--ttl", bad)
        assert r.code == 2 and "Traceback" not in r.err, bad
    r = cli("--workspace", "w", "lease", "heartbeat", "--epoch", "2", "--ttl", "8d")
    assert r.code == 2 and "7 days" in r.err
    listing = cli("workspace", "list", "--json").json
    assert [(x["name"], x["epoch"], x["holder"], x["live"]) for x in listing] == [("w", 2, "a2", True)]


def test_lease_contention_and_a_zombie_epoch(world: World) -> None:
    cli = world.cli
    zombie = world.acquire("agent-1")
    r = world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, zombie)
    assert r.code == 0
    r = cli("--workspace", "w", "lease", "acquire", "--holder", "agent-2")
    assert r.code == 1 and "leased by 'agent-1'" in r.err and "--force" in r.err
    taken = cli("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force", "--json")
    assert taken.code == 0 and taken.json["epoch"] == 2 and taken.json["settled"] == ["s1"]

    count = cli.count()
    for argv in (["step", "apply", "s1", "--epoch", "1"],
                 ["--workspace", "w", "step", "plan", "--epoch", "1", "-"],
                 ["--workspace", "w", "lease", "heartbeat", "--epoch", "1"],
                 ["step", "replan", "s1", "--epoch", "1"]):
        r = cli(*argv, input=json.dumps({"step": "s9", "writes": [write("app.py", "x", "v0")]}))
        assert r.code == 1, (argv, r)
        assert "epoch 1 is not live: the lease was taken over by epoch 2" in r.err, (argv, r.err)
        assert "this worker must stop" in r.err, (argv, r.err)
    assert cli.count() == count and world.disk() == "v0"

    # the live epoch goes on: the settled step is re-stamped and applied
    r = cli("step", "replan", "s1", "--epoch", "2", "--json")
    assert r.code == 0 and r.json == {"step": "s1", "attempt": 2, "workspace": "w", "epoch": 2}
    applied = cli("step", "apply", "s1", "--epoch", "2", "--json")
    assert applied.code == 0 and applied.json["attempt"] == 2

    # a third worker takes over before s1 publishes: the late receipt moves nothing
    cli("--workspace", "w", "lease", "acquire", "--holder", "agent-3", "--force")
    assert world.disk() == "v0"
    count = cli.count()
    r = cli("step", "publish", "s1", "--receipt", "-", input=applied.out)
    assert r.code == 1 and "epoch 2 is not live" in r.err
    r = cli("step", "publish", "s1", "--epoch", "2")
    assert r.code == 1 and "epoch 2 is not live" in r.err
    assert cli.count() == count


def test_lease_settle_and_unsettled(world: World) -> None:
    cli = world.cli
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    assert cli("step", "apply", "s1", "--epoch", "1").code == 0
    r = cli("--workspace", "w", "lease", "settle", "--epoch", "1", "--json")
    assert r.code == 0 and r.json == {"workspace": "w", "epoch": 1, "settled": [],
                                      "conflicts": []}
    r = cli("--workspace", "w", "lease", "settle", "--epoch", "2")
    assert r.code == 1 and "epoch 2 was never issued (the live epoch is 1)" in r.err


# --- bad input ----------------------------------------------------------------------------


BAD_PLANS = [
    ("", "the plan is empty"),
    ("{not json", "the plan is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"steps": []}', "$.steps"),
    ('{"step": "s1", "writes": [{"path": "app.py", "content": "x"}]}', "pre_hash"),
    ('{"step": "s1", "writes": [{"path": "app.py", "pre_hash": "abc", "content": "x"}]}',
     "$.writes[0].pre_hash"),
    ('{"step": "s1", "writes": [{"path": "app.py", "pre_hash": null}]}', "exactly one of"),
    ('{"step": "s1", "writes": [{"path": "a", "pre_hash": null, "content": "x", "delete": true}]}',
     "exactly one of"),
    ('{"step": "s1", "writes": [{"path": "a", "pre_hash": null, "content_b64": "@@"}]}',
     "content_b64 is not valid base64"),
    ('{"step": "s1", "writes": [{"path": "a", "pre_hash": null, "content_file": "nope"}]}',
     "content_file"),
    ('{"step": "s1", "writes": [{"path": "../x", "pre_hash": null, "content": "x"}]}',
     "escapes its root"),
    ('{"step": "s1", "surprise": 1}', "unknown field `surprise`"),
    (('{"steps": [{"step": "s1", "writes": [{"path": "a", "pre_hash": null, "base_rev": -1,'
      ' "content": "x"}]}]}'), "$.steps[0].writes[0].base_rev"),
    ('{"steps": [{"step": "s1"}], "fence": "sometimes"}', "$.fence"),
    ('{"steps": [{"step": "s1"}, {"step": "s1"}]}', "names a step twice"),
    ('{"steps": [{"step": ""}]}', "step id '' is empty"),
]


@pytest.mark.parametrize("body, message", BAD_PLANS)
def test_a_bad_plan_is_exit_2_and_writes_nothing(world: World, body: str, message: str) -> None:
    world.acquire()
    count = world.cli.count()
    r = world.cli("--workspace", "w", "step", "plan", "--epoch", "1", "-", input=body)
    assert r.code == 2, r
    assert r.err.startswith("steptrail: error:") and message in r.err, r.err
    assert world.cli.count() == count
    assert sorted(os.listdir(world.dir)) == ["app.py"]


def test_a_plan_whose_siblings_do_not_chain_is_rejected(world: World) -> None:
    world.acquire()
    r = world.plan({"steps": [{"step": "s1", "writes": [write("app.py", "v1", "v0")]},
                              {"step": "s2", "writes": [write("app.py", "v2", "v0")]}]}, 1)
    assert r.code == 1 and r.json["ok"] is False
    assert [s["verdict"] for s in r.json["steps"]] == ["rejected:overlap"] * 2
    assert "s2:app.py" in r.json["steps"][0]["detail"]
    r = world.cli("step", "apply", "s1", "--epoch", "1", "--json")
    assert r.code == 1 and r.json["verdict"] == "rejected:overlap"


def test_receipts_that_move_nothing(world: World) -> None:
    cli = world.cli
    world.acquire()
    world.plan({"steps": [{"step": "s1", "writes": [write("app.py", "v1", "v0")]},
                          {"step": "s2", "writes": [write("b.txt", "b", None)]}]}, 1)
    receipt = cli("step", "apply", "s1", "--epoch", "1", "--json").json["receipt"]
    cli("step", "apply", "s2", "--epoch", "1")
    count = cli.count()
    cases = [
        ("", 2, "a 200 with an empty body moves nothing"),
        ("   \n", 2, "a 200 with an empty body moves nothing"),
        ("not json", 2, "the receipt is not JSON"),
        ("[]", 2, "must be a JSON object"),
        ("{}", 2, "not a steptrail receipt"),
        (json.dumps({"verdict": "rejected:pre_hash", "receipt": None}), 2, "holds no receipt"),
        (json.dumps({**receipt, "rev": 7}), 1, "does not match the apply"),
        (json.dumps({**receipt, "seq": receipt["seq"] + 1}), 1, "does not match the apply"),
    ]
    for body, code, message in cases:
        r = cli("step", "publish", "s1", "--receipt", "-", input=body)
        assert (r.code, message in r.err) == (code, True), (body, r)
    r = cli("step", "publish", "s2", "--receipt", "-", input=json.dumps(receipt))
    assert r.code == 2 and "is for step 's1'" in r.err
    assert cli.count() == count
    # the whole `step apply --json` document is accepted as the receipt
    r = cli("step", "publish", "s1", "--receipt", "-",
            input=json.dumps({"verdict": "applied", "step": "s1", "attempt": 1,
                              "receipt": receipt, "detail": ""}))
    assert r.code == 0 and "manifest r0" in r.out


def test_compensation_conflict_is_exit_1_and_overwrites_nothing(world: World) -> None:
    cli = world.cli
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    cli("step", "apply", "s1", "--epoch", "1")
    (world.dir / "app.py").write_text("human")
    r = cli("step", "compensate", "s1", "--reason", "tests failed", "--epoch", "1", "--json")
    assert r.code == 1 and r.json["conflicts"] == ["app.py"]
    assert r.json["restored"][0]["outcome"] == "conflict"
    assert r.json["restored"][0]["digest"] == h("human")
    assert "app.py" in r.err and world.disk() == "human"
    r = cli("step", "compensate", "s1", "--reason", "x", "--epoch", "1")
    assert r.code == 1 and "already recorded" in r.out  # a redelivery: the first answer
    r = cli("metrics", "--json")
    assert r.json["compensation_success_rate"]["rate"] == 0.0


def test_compensating_a_writing_step_needs_its_epoch(world: World) -> None:
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    r = world.cli("step", "compensate", "s1", "--reason", "x")
    assert r.code == 2 and "live epoch" in r.err


def test_artifact_only_steps_keep_working(world: World) -> None:
    cli = world.cli
    (world.tmp / "report.xml").write_text("<ok/>")
    assert cli("step", "store", "build-7", "report.xml").code == 0
    assert cli("step", "publish", "build-7", "--epoch", "5").code == 0  # no lease: ignored
    assert cli("step", "ack", "build-7", "--json").json["deduped"] is False
    r = cli("step", "compensate", "build-7", "--reason", "bad report", "--json")
    assert r.code == 0 and r.json["restored"] == [] and r.json["conflicts"] == []
    r = cli("step", "apply", "build-7", "--epoch", "1")
    assert r.code == 2 and "writes no workspace" in r.err


def test_workspace_add_refuses_a_second_directory_for_a_name(world: World) -> None:
    other = world.tmp / "other"
    other.mkdir()
    count = world.cli.count()
    r = world.cli("workspace", "add", "w", str(other))
    assert r.code == 2 and "already added" in r.err
    r = world.cli("workspace", "add", "x", str(world.tmp / "missing"))
    assert r.code == 2 and "does not exist" in r.err
    assert world.cli.count() == count


def test_workspace_and_lease_reads_write_nothing(world: World) -> None:
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    world.cli("step", "apply", "s1", "--epoch", "1")
    db = world.cli.ledger
    with Ledger.open(db):
        pass  # checkpoint and close: no -wal left
    before = {p.name: p.read_bytes() for p in world.tmp.iterdir() if p.is_file()}
    for argv in (["workspace", "list"], ["workspace", "show", "w"],
                 ["--workspace", "w", "workspace", "snapshot", "app.py"],
                 ["--workspace", "w", "lease", "show"], ["metrics"], ["metrics", "--json"]):
        assert world.cli(*argv).code == 0, argv
    after = {p.name: p.read_bytes() for p in world.tmp.iterdir() if p.is_file()}
    assert lock_files_aside(after) == before  # SQLite's lock files of a read aside


# --- documentation ------------------------------------------------------------------------


def _commands() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name in cli.list_commands(click.Context(cli)):  # chaos, fuzz: entry points
        command = cli.get_command(click.Context(cli), name)
        out.append((name, command))
        if isinstance(command, click.Group):
            out.extend((f"{name} {sub}", c) for sub, c in command.commands.items())
    return out


def _has_example(name: str) -> bool:
    out = Cli(pathlib.Path("unused.db"))(*name.split(), "--help").out
    return any(line.startswith("  ") and line.strip().startswith("steptrail ")
               for line in out.splitlines())


def test_the_example_checker_catches_a_help_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.cli import inspect as ledger_commands

    assert _has_example("head")
    monkeypatch.setattr(ledger_commands.head, "help", "Print the chain head as SEQ:HASH.")
    assert not _has_example("head")


def test_every_command_and_subcommand_teaches_and_is_documented() -> None:
    docs = (ROOT / "docs" / "cli-json.md").read_text()
    for name, command in _commands():
        assert command.help, name
        r = Cli(pathlib.Path("unused.db"))(*name.split(), "--help")
        assert r.code == 0 and "Usage:" in r.out, name
        if any(p.name == "as_json" for p in command.params):
            assert f"## `{name}" in docs, f"docs/cli-json.md lacks {name}"
    # every command's --help teaches by example: an indented `steptrail ...` line
    missing = [name for name, _ in _commands() if not _has_example(name)]
    assert missing == [], f"--help without an example: {missing}"
    assert "## The plan format" in docs and "The receipt" in docs


# --- the real console script ----------------------------------------------------------------


def test_the_console_script_round_trip(tmp_path: pathlib.Path) -> None:
    exe = pathlib.Path(sys.executable).parent / "steptrail"
    assert exe.exists(), exe
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env |= {"STEPTRAIL_LEDGER": str(tmp_path / "ledger.db"), "STEPTRAIL_WORKSPACE": "w"}

    def run(*args: str, stdin: str = "", code: int = 0) -> str:
        p = subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=60, check=False)
        assert "Traceback" not in p.stderr
        assert p.returncode == code, (args, p.stdout, p.stderr)
        return p.stdout

    run("init")
    run("workspace", "add", "w", str(ws))
    env["STEPTRAIL_EPOCH"] = str(json.loads(run("lease", "acquire", "--holder", "h",
                                                  "--ttl", "1h", "--json"))["epoch"])
    snap = json.loads(run("workspace", "snapshot", "app.py", "--json"))["paths"][0]
    plan = {"step": "s1", "writes": [{**snap, "content": "v1"}]}
    run("step", "plan", "-", stdin=json.dumps(plan))
    applied = run("step", "apply", "s1", "--json")
    assert json.loads(applied)["verdict"] == "applied"
    manifest = json.loads(run("step", "publish", "s1", "--receipt", "-", "--json", stdin=applied))
    assert manifest["writes"][0]["digest"] == h("v1")
    assert json.loads(run("step", "ack", "s1", "--json"))["deduped"] is False
    assert (ws / "app.py").read_text() == "v1"
    run("step", "publish", "s1", "--receipt", "-", stdin="", code=2)  # an empty body
    env["STEPTRAIL_EPOCH"] = "99"
    run("step", "apply", "s1", "--json")  # a redelivery: the journal answers, even so
    run("--workspace", "w", "lease", "heartbeat", code=1)


# --- an acquire that died before its settle ---------------------------------------------


def _acquire_without_settling(world: World, epoch: int) -> None:
    """What a process killed inside `lease acquire` leaves: the new epoch committed, the
    older epochs' in-flight attempts not compensated yet."""
    with Ledger.open(world.cli.ledger) as ledger:
        now = ledger.clock()
        ledger.append(LeaseAcquired(workspace="w", epoch=epoch, holder="agent-2",
                                    expires_ns=now + 3600 * 10**9, forced=True))
        assert ledger.workspaces.unsettled("w", epoch) == ["s1"]


def test_new_work_waits_for_the_older_epoch_to_be_settled(world: World) -> None:
    cli = world.cli
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    assert cli("step", "apply", "s1", "--epoch", "1").code == 0
    _acquire_without_settling(world, 2)
    shown = cli("--workspace", "w", "lease", "show", "--json").json
    assert shown["epoch"] == 2 and shown["unsettled"] == ["s1"]
    count = cli.count()
    r = world.plan({"step": "s2", "writes": [write("app.py", "v2", "v1")]}, 2)
    assert r.code == 1 and "older epoch still in flight (s1)" in r.err and "lease settle" in r.err
    assert cli.count() == count
    r = cli("--workspace", "w", "lease", "settle", "--epoch", "2", "--json")
    assert r.code == 0 and [c["step"] for c in r.json["settled"]] == ["s1"]
    assert r.json["settled"][0]["restored"][0]["outcome"] == "restored"
    assert world.disk() == "v0"
    r = world.plan({"step": "s2", "writes": [write("app.py", "v2", "v0")]}, 2)
    assert r.code == 0 and cli("step", "apply", "s2", "--epoch", "2").code == 0


# --- regressions: core bugs found while building the CLI (fixed in ledger/step/) ----


def test_new_work_waits_for_an_unsettled_older_epoch(world: World) -> None:
    world.acquire()
    world.plan({"step": "s1", "writes": [write("app.py", "v1", "v0")]}, 1)
    assert world.cli("step", "apply", "s1", "--epoch", "1").code == 0
    _acquire_without_settling(world, 2)
    with Ledger.open(world.cli.ledger) as ledger:  # the library, without the CLI's check
        ledger.workspaces.plan_step("s2", workspace="w", epoch=2,
                         writes=[Write("app.py", b"v2", h("v1"), None)])
        with pytest.raises(Unsettled):
            ledger.workspaces.apply("s2", epoch=2)


class _Crash(Exception):
    pass


@pytest.mark.sqlite_only
def test_a_crash_before_a_large_post_image_is_written_is_replayed(
        world: World) -> None:
    epoch = world.acquire()
    big = b"x" * 200_000  # larger than inline_max_bytes: written as a blob file after the commit

    def on_op(name: str) -> None:
        if name == "write":
            raise _Crash

    plan = [StepPlan("big", [Write("app.py", big, h("v0"), None)])]
    crashing = Ledger.open(world.cli.ledger, on_op=on_op)
    try:
        with pytest.raises(_Crash):
            crashing.workspaces.admit("w", epoch, plan)  # planned + pins committed, the file never written
    finally:
        crashing.close()
    with Ledger.open(world.cli.ledger) as ledger:
        assert ledger.step("big").state == "planned"
        ledger.workspaces.admit("w", epoch, plan)  # the replay, with the very same bytes
        assert ledger.workspaces.apply("big", epoch=epoch).verdict == "applied"  


def test_acquire_settles_a_symlinked_path_as_a_conflict(
        world: World) -> None:
    (world.dir / "sub").mkdir()
    (world.dir / "sub" / "x.txt").write_text("v0")
    outside = world.tmp / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("v1")
    world.acquire()
    world.plan({"step": "s1", "writes": [write("sub/x.txt", "v1", "v0")]}, 1)
    assert world.cli("step", "apply", "s1", "--epoch", "1").code == 0
    for p in (world.dir / "sub").iterdir():
        p.unlink()
    (world.dir / "sub").rmdir()
    (world.dir / "sub").symlink_to(outside)  # the sandbox swapped a directory for a link
    r = world.cli("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force",
                  "--json")
    assert world.cli("--workspace", "w", "lease", "show", "--json").json["epoch"] == 2
    assert (outside / "x.txt").read_text() == "v1"  # nothing outside was touched
    # expected: the acquire answers with its epoch and s1 settled as a conflict (exit 1,
    # as `lease settle`: a human decides; the lease is held all the same)
    assert r.code == 1, r.err
    assert r.json["epoch"] == 2 and r.json["settled"] == ["s1"] and r.json["live"]
    assert [(c["step"], c["path"], c["digest"]) for c in r.json["conflicts"]] == [
        ("s1", "sub/x.txt", None)]


def test_fuzz_command_exit_codes_and_json() -> None:
    from click.testing import CliRunner

    from ledger.cli import cli as root

    runner = CliRunner()
    ok = runner.invoke(root, ["fuzz", "--seeds", "10", "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["seeds"] == 10 and data["violations"] == 0 and "counterexample" not in data
    bad = runner.invoke(root, ["fuzz", "--seeds", "10", "--fence", "none"])
    assert bad.exit_code == 1 and "minimal event order" in bad.output
    assert "Traceback" not in bad.output


#: The tests that take `ledger_at` (through `world`, `SettleWorld`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True


def test_a_dead_epochs_ack_apply_and_publish_are_stale_not_deduped(
        tmp_path: Any, ledger_at: LedgerAt) -> None:
    """A zombie after a takeover: worker A (epoch 1) applied s1 and stopped; B took the
    workspace over (epoch 2: A's attempt settled), re-ran s1 and committed it. A's
    `step ack|apply|publish s1 --epoch 1` must not answer success with B's attempt and
    receipt: StaleEpoch (exit 1, one line); the library says the same; B's own redelivery
    under epoch 2 is deduped."""
    from ledger import StaleEpoch, StepStatus, run_fenced_step

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0\n")
    db = str(ledger_at(tmp_path / "l.db"))
    with Ledger.init(db) as led:
        led.workspaces.add("w", str(ws))
        a = led.workspaces.acquire("w", "A", ttl_s=3600).epoch
        led.workspaces.admit("w", a, [StepPlan("s1", [Write("app.py", b"A\n", digest_of(b"v0\n"))])])
        assert led.workspaces.apply("s1", epoch=a).verdict == "applied"
        b = led.workspaces.acquire("w", "B", ttl_s=3600, force=True).epoch
        out = run_fenced_step(led, "w", "s1", lambda r: [r.read("app.py").write(b"B\n")],
                              epoch=b)
        assert out.status is StepStatus.APPLIED and out.attempt == 2, out
        for call in (lambda: led.ack("s1", epoch=a), lambda: led.workspaces.apply("s1", epoch=a)):
            with pytest.raises(StaleEpoch):
                call()
        head = led.head().seq
    for argv in (["step", "ack", "s1", "--epoch", str(a)],
                 ["step", "apply", "s1", "--epoch", str(a)],
                 ["step", "publish", "s1", "--epoch", str(a)],
                 ["step", "ack", "s1", "--attempt", "2", "--epoch", str(a), "--json"]):
        got = run_cli(["--ledger", db, *argv])
        assert got.code == 1 and "StaleEpoch" in got.err and "epoch 1 is not live" in got.err, \
            (argv, got)
    got = run_cli(["--ledger", db, "step", "ack", "s1", "--epoch", str(b), "--json"])
    assert got.code == 0 and got.json["deduped"], got
    with Ledger.open(db) as led:
        assert led.head().seq == head
        assert (ws / "app.py").read_bytes() == b"B\n"


# --- settling a dead attempt that created a file; what `lease acquire` reports ------------
#
# An attempt's apply pins the pre-images it finds before its first rename. That pin is
# evidence, for the whole attempt, that a call got as far as its renames: a file the attempt
# created (no pre-image of its own to pin) holding exactly its post-image, at its base rev,
# is taken back by the next epoch's settling like a modified file is restored. Without the
# evidence (an attempt that never reached its apply, or a pin that only its planning made)
# matching bytes may be a person's: a conflict, left as found, which `lease acquire` reports
# like `lease settle` does (exit 1, the lease held all the same). (Issue 11, item 18.)

MODIFIED = 40  # the review used 300; 40 shows the same and keeps the test fast


class SettleWorld:
    """A ledger (the CLI's, in-process) and a workspace of MODIFIED files, leased. The
    ledger is at `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: pathlib.Path, *, at: LedgerAt = sqlite_at) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        for i in range(MODIFIED):
            (self.dir / f"f{i:03}.py").write_text(f"v0 {i}")
        (self.dir / "app.py").write_text("v0")
        self.path = at(tmp / "ledger.db")
        assert self.cli("init").code == 0
        assert self.cli("workspace", "add", "w", str(self.dir)).code == 0
        self.epoch = self.acquire("agent-1").json["epoch"]

    def cli(self, *args: str) -> CliOut:
        return run_cli(["--ledger", str(self.path), *args])

    def acquire(self, holder: str, *extra: str) -> CliOut:
        return self.cli("--workspace", "w", "lease", "acquire", "--holder", holder, "--ttl",
                        "10m", "--json", *extra)

    def open(self, **kwargs: Any) -> Ledger:
        return Ledger.open(self.path, **kwargs)

    def admit(self, *writes: Write) -> None:
        with self.open() as led:
            assert led.workspaces.admit("w", self.epoch, [StepPlan("s1", writes, run="r")]) == [None]

    def read(self, path: str) -> str | None:
        p = self.dir / path
        return p.read_text() if p.exists() else None


def _modify_all() -> list[Write]:
    return [Write(f"f{i:03}.py", f"v1 {i}".encode(), h(f"v0 {i}")) for i in range(MODIFIED)]


def _kill_right_after(w: SettleWorld, path: str, index: int) -> None:
    """Apply s1 in a forked child, SIGKILLed at the first disk operation after the rename
    that makes `path` (its `index`-th write) appear: before the `fenced` commit."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        renames = 0

        def on_op(name: str) -> None:
            nonlocal renames
            if renames > index:  # the rename of `path` has happened
                os.kill(os.getpid(), signal.SIGKILL)
            renames += name == "ws-rename"

        Ledger.open(w.path, on_op=on_op).workspaces.apply("s1", epoch=w.epoch)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert w.read(path) == "created"
    with w.open(readonly=True) as led:
        assert led.step("s1").state == "planned"  # nothing of the apply is recorded


# --- the review's scenario, with a real SIGKILL -------------------------------------------


@pytest.mark.parametrize("created", ["last", "first"])
def test_a_killed_step_that_created_a_file_is_settled_whole(
        tmp_path: pathlib.Path, ledger_at: LedgerAt, created: str) -> None:
    """A step modifies MODIFIED files and creates new.txt; the worker is SIGKILLed right
    after new.txt appears. The next epoch (`lease acquire --force`) puts every write
    back — new.txt removed like the modified files are restored — marks nothing a
    conflict, exits 0; `metrics` counts one compensation that succeeded.

    `last`: every rename landed (the review's case). `first`: only new.txt landed; the
    evidence is the pre-images of the modified files, pinned before any rename."""
    w = SettleWorld(tmp_path, at=ledger_at)
    new = Write("new.txt", b"created", None)
    writes = [*_modify_all(), new] if created == "last" else [new, *_modify_all()]
    w.admit(*writes)
    _kill_right_after(w, "new.txt", writes.index(new))
    landed = {x.path for x in writes[:writes.index(new) + 1]}
    assert all(w.read(x.path) == x.content.decode() for x in writes if x.path in landed)  # type: ignore[union-attr]

    r = w.acquire("agent-2", "--force")
    # every write put back: the pre-images, and new.txt absent again
    assert w.read("new.txt") is None
    assert all(w.read(f"f{i:03}.py") == f"v0 {i}" for i in range(MODIFIED))
    assert r.code == 0, r
    assert r.json["epoch"] == w.epoch + 1 and r.json["live"] is True
    assert r.json["settled"] == ["s1"] and r.json["conflicts"] == [] and r.json["unsettled"] == []
    assert "conflict" not in r.err
    with w.open(readonly=True) as led:
        comp = next(iter(led.read(step="s1", kind="compensated"))).event
        assert sorted((x.path, x.outcome) for x in comp.restored) == sorted(
            (p, "restored") for p in landed)
        assert led.step("s1").state == "compensated"
        # what the ledger says each path holds is what is on disk
        for path, (_, digest) in led.workspaces.paths("w").items():
            assert digest == (None if w.read(path) is None else h(w.read(path))), path
        assert led.verify().ok

    m = w.cli("metrics", "--json")
    assert m.code == 0
    assert m.json["compensation_success_rate"] == {
        "rate": 1.0, "compensations": 1, "with_restores": 1, "succeeded": 1, "conflicted": 0}


# --- without evidence: fail-safe -------------------------------------------------------------


def test_without_evidence_a_created_file_stays_a_conflict_and_acquire_says_so(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """The attempt never reached its apply (no pre-image pinned): a person created
    new.txt with exactly the bytes it planned. Those bytes are left as found, recorded
    as a conflict; `lease acquire` says so like `lease settle` (exit 1, the conflicts on
    stderr and in --json), and the new epoch is live all the same."""
    w = SettleWorld(tmp_path, at=ledger_at)
    w.admit(Write("app.py", b"v1", h("v0")), Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")  # by hand, the same bytes

    r = w.acquire("agent-2", "--force")
    assert r.code == 1, r
    assert w.read("new.txt") == "created" and w.read("app.py") == "v0"
    assert r.json["epoch"] == w.epoch + 1 and r.json["live"] is True
    assert r.json["settled"] == ["s1"]
    assert r.json["conflicts"] == [{"step": "s1", "attempt": 1, "path": "new.txt", "rev": 0,
                                    "digest": h("created")}]
    assert "s1:new.txt" in r.err and "1 path conflict" in r.err
    assert f"the lease is held (epoch {w.epoch + 1})" in r.err
    assert r.err.count("\n") == 1  # one line
    shown = w.cli("--workspace", "w", "lease", "show", "--json").json
    assert shown["epoch"] == w.epoch + 1 and shown["live"] is True and shown["unsettled"] == []
    m = w.cli("metrics", "--json").json["compensation_success_rate"]
    assert (m["rate"], m["conflicted"]) == (0.0, 1)


def test_acquire_text_output_lists_the_conflicts(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    w = SettleWorld(tmp_path, at=ledger_at)
    w.admit(Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")
    r = w.cli("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force")
    assert r.code == 1, r
    assert r.out.startswith(f"epoch {w.epoch + 1}: workspace w leased by agent-2")
    assert "settled (compensated) older epochs' steps: s1" in r.out
    assert "s1:new.txt" in r.err and "the lease is held" in r.err


def test_a_plan_time_pin_is_no_evidence_for_settling(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """b.txt's pre-image is a.txt's post-image, so the planning itself pinned that digest
    (as a post-image). That pin existed before any apply: no evidence. The attempt never
    reached its apply and a person wrote exactly b.txt's planned bytes: left as found."""
    w = SettleWorld(tmp_path, at=ledger_at)
    (w.dir / "a.txt").write_text("X")
    (w.dir / "b.txt").write_text("Y")
    w.admit(Write("a.txt", b"Y", h("X")), Write("b.txt", b"Z", h("Y")))
    (w.dir / "b.txt").write_text("Z")  # by hand
    r = w.acquire("agent-2", "--force")
    assert w.read("b.txt") == "Z" and w.read("a.txt") == "X"
    assert r.code == 1 and [c["path"] for c in r.json["conflicts"]] == ["b.txt"]


def test_a_plan_time_pin_is_no_evidence_for_a_rejection(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """The same on the rejection path (a same-epoch replay rejected, `_undo_landed`)."""
    w = SettleWorld(tmp_path, at=ledger_at)
    (w.dir / "a.txt").write_text("X")
    (w.dir / "b.txt").write_text("Y")
    w.admit(Write("a.txt", b"Y", h("X"), 5),  # a stale base rev: the fence rejects
            Write("b.txt", b"Z", h("Y")))
    (w.dir / "b.txt").write_text("Z")  # by hand
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "rejected:stale_rev"
        rejected = next(iter(led.read(step="s1", kind="rejected"))).event
        assert [(u.path, u.outcome) for u in rejected.undone] == [("b.txt", "conflict")]
        assert led.verify().ok
    assert w.read("b.txt") == "Z" and w.read("a.txt") == "X"


def test_a_move_that_never_ran_leaves_a_hand_copy_alone(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """A move (a.txt deleted, b.txt created with its bytes) is planned; its post-image is
    a.txt's pre-image, pinned by the planning. The worker dies before applying and a
    person copies a.txt to b.txt by hand: nothing pinned a pre-image, so the copy —
    identical to the planned post-image — is a conflict, not removed."""
    w = SettleWorld(tmp_path, at=ledger_at)
    (w.dir / "a.txt").write_text("X")
    w.admit(Write("a.txt", None, h("X")), Write("b.txt", b"X", None))
    (w.dir / "b.txt").write_text("X")  # cp a.txt b.txt
    r = w.acquire("agent-2", "--force")
    assert w.read("b.txt") == "X" and w.read("a.txt") == "X"
    assert r.code == 1 and [c["path"] for c in r.json["conflicts"]] == ["b.txt"]


# --- reporting -----------------------------------------------------------------------------


def test_already_and_restored_both_count_as_a_successful_compensation(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """An applied attempt of an old epoch: one file was put back by hand (``already``),
    the other still holds the post-image (``restored``). The settling succeeded: exit 0,
    rate 1.0, and the ``already`` is an ambiguous reconciliation."""
    w = SettleWorld(tmp_path, at=ledger_at)
    w.admit(Write("f000.py", b"v1 0", h("v0 0")), Write("f001.py", b"v1 1", h("v0 1")))
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"
    (w.dir / "f000.py").write_text("v0 0")  # put back by hand
    r = w.acquire("agent-2", "--force")
    assert r.code == 0 and r.json["conflicts"] == [], r
    with w.open(readonly=True) as led:
        comp = next(iter(led.read(step="s1", kind="compensated"))).event
    assert sorted((x.path, x.outcome) for x in comp.restored) == [
        ("f000.py", "already"), ("f001.py", "restored")]
    m = w.cli("metrics", "--json").json
    assert m["compensation_success_rate"] == {
        "rate": 1.0, "compensations": 1, "with_restores": 1, "succeeded": 1, "conflicted": 0}
    assert m["ambiguous_reconciliations"]["already_restores"] == 1


def test_acquire_that_could_not_settle_a_step_says_so(
        tmp_path: pathlib.Path, ledger_at: LedgerAt, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settling fails for a step (the disk refuses the restore): the lease is acquired,
    the step is listed as unsettled (stderr, --json) and the exit is 1."""
    w = SettleWorld(tmp_path, at=ledger_at)
    w.admit(Write("app.py", b"v1", h("v0")))
    with w.open() as led:
        assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"

    def refuse(self: WorkspaceDir, path: str, *_: object, **__: object) -> None:
        raise StorageFailure(os.path.join(self.root, path), "Input/output error")

    monkeypatch.setattr(placing, "land", refuse)
    r = w.acquire("agent-2", "--force")
    assert r.code == 1, r
    assert r.json["epoch"] == w.epoch + 1 and r.json["unsettled"] == ["s1"]
    assert r.json["settled"] == [] and r.json["conflicts"] == []
    assert "Unsettled:" in r.err and "(s1)" in r.err and "lease settle --epoch" in r.err
    assert r.json["error"]["type"] == "Unsettled" and r.err.count("\n") == 1
    monkeypatch.undo()
    s = w.cli("--workspace", "w", "lease", "settle", "--epoch", str(w.epoch + 1), "--json")
    assert s.code == 0 and s.json["conflicts"] == [] and w.read("app.py") == "v0"


def test_lease_settle_json_lists_the_conflicts_as_acquire_does(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    w = SettleWorld(tmp_path, at=ledger_at)
    w.admit(Write("new.txt", b"created", None))
    (w.dir / "new.txt").write_text("created")
    with w.open() as led:  # a new epoch whose acquire died before settling
        now = led.clock()
        led.append(LeaseAcquired(workspace="w", epoch=w.epoch + 1, holder="agent-2",
                                 expires_ns=now + 600 * 10**9, forced=True))
    r = w.cli("--workspace", "w", "lease", "settle", "--epoch", str(w.epoch + 1), "--json")
    assert r.code == 1
    assert r.json["conflicts"] == [{"step": "s1", "attempt": 1, "path": "new.txt", "rev": 0,
                                    "digest": h("created")}]
    assert r.json["settled"][0]["conflicts"] == ["new.txt"]

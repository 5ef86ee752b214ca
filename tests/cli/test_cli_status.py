"""`steptrail status`: the ledger on one screen with what to run next (release issue).

Each scenario runs the commands status prints, exactly as printed, and checks the step
they name moved on and left the screen: a command status gets wrong fails here. Status
only reads: the ledger's files stay as they were, and it answers while a writer holds
the write lock. On SQLite and PostgreSQL (BOTH_STORES)."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    CliOut,
    LedgerAt,
    lock_files_aside,
    raw_connection,
    run_cli,
    snapshot_dir,
)

from ledger import Ledger, StepPlan
from ledger.gc import collect

BOTH_STORES = True


class World:
    """A ledger (real clock: the command line's) with workspace `w` holding app.py."""

    def __init__(self, tmp: Path, ledger_at: LedgerAt) -> None:
        self.tmp = tmp
        self.location = os.fspath(ledger_at(tmp / "ledger.db"))
        self.dir = tmp / "w"
        self.dir.mkdir()
        (self.dir / "app.py").write_text("v0\n")
        assert self("init").code == 0
        assert self("workspace", "add", "w", str(self.dir)).code == 0

    def __call__(self, *args: str) -> CliOut:
        return run_cli(["--ledger", self.location, *args])

    def status(self, *args: str) -> CliOut:
        r = self("status", *args)
        assert r.code == 0, r
        return r

    def doc(self, *args: str) -> dict[str, Any]:
        r = self.status(*args, "--json")
        assert r.out.count("\n") == 1  # one JSON document, nothing else on stdout
        return r.json  # type: ignore[no-any-return]

    def acquire(self, holder: str = "agent-1", ttl: str = "10m", *extra: str) -> int:
        r = self("--workspace", "w", "lease", "acquire", "--holder", holder, "--ttl", ttl,
                 "--no-observe", "--json", *extra)
        assert r.code == 0, r
        return int(r.json["epoch"])

    def run_printed(self, command: str, holder: str = "agent-2") -> list[CliOut]:
        """A command status printed, as printed (`"$USER"` is the shell's: `holder`)."""
        out = []
        for part in command.split(" && "):
            argv = shlex.split(part.replace('"$USER"', holder))
            assert argv[0] == "steptrail", command
            out.append(run_cli(argv[1:]))
        return out

    def fenced(self, step: str, epoch: int, content: bytes) -> None:
        """`step` planned and applied under `epoch`, not published: a worker died there."""
        with Ledger.open(self.location) as led:
            read = led.workspaces.read_file("w", "app.py")
            led.workspaces.admit("w", epoch, [StepPlan(step, [read.write(content)])])
            assert led.workspaces.apply(step, epoch=epoch).verdict == "applied"


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> World:
    return World(tmp_path, ledger_at)


def rows(out: str) -> dict[str, str]:
    """Step -> its table row, from status's text."""
    return {m[1]: m[0] for m in re.finditer(r"^  (\S+) +(?:in-flight|unsettled|unacked) .*$",
                                            out, re.MULTILINE)}


def test_an_idle_ledger_says_so_with_its_head_and_lease(world: World) -> None:
    r = world.status()
    doc = world.doc()
    head = world("head").out.strip()
    assert doc["head"] == {"seq": int(head.split(":")[0]), "hash": head.split(":")[1]}
    assert re.search(rf"^head +{head}$", r.out, re.MULTILINE)
    assert doc["ledger"] == (world.location if "://" in world.location
                             else os.path.abspath(world.location))
    assert f"workspace w at {world.dir.resolve()}: rev 0" in r.out
    assert "lease   never leased" in r.out and "nothing in flight" in r.out
    (w,) = doc["workspaces"]
    assert w["lease"]["state"] == "never" and w["steps"] == [] and doc["next"] == []
    assert doc["gc"] == {"recorded": False, "last": None, "blobs": 0, "bytes": 0,
                         "last_run": None}
    assert "no run recorded here" in r.out
    assert doc["audit"]["recorded"] is False and "audit    not recorded" in r.out
    assert doc["witness"]["configured"] is False and doc["witness"]["matches"] is None


def test_steps_in_flight_each_with_the_command_that_moves_it_on(world: World) -> None:
    epoch = world.acquire()
    world.fenced("edit-1", epoch, b"v1\n")
    with Ledger.open(world.location) as led:  # an artifact step storing its blobs
        led.plan("build-7", artifacts=["report.txt"])
        led.store("build-7", 1, "report.txt", b"ok\n")
    doc = world.doc()
    (w,) = doc["workspaces"]
    assert w["lease"] | {"expires_ns": 0, "expires": "", "remaining_s": 0} == {
        "state": "live", "epoch": 1, "holder": "agent-1", "expires_ns": 0, "expires": "",
        "live": True, "expired": False, "released": False, "remaining_s": 0}
    assert 590 < w["lease"]["remaining_s"] <= 600
    (edit,) = w["steps"]
    base = f"steptrail --ledger {shlex.quote(doc['ledger'])}"
    assert edit | {"last_seq": 0} == {
        "step": "edit-1", "what": "in-flight", "state": "fenced", "attempt": 1, "epoch": 1,
        "run": "", "workspace": "w", "last_seq": 0,
        "next": f"{base} step publish edit-1 --epoch 1"}
    assert w["takeover"] == (f'{base} --workspace w lease acquire --holder "$USER" --ttl 10m'
                             " --force")
    (build,) = doc["other_steps"]
    assert (build["step"], build["state"], build["next"]) == (
        "build-7", "blob-stored", f"{base} step publish build-7")
    assert doc["next"] == [edit["next"], build["next"]]
    text = world.status().out
    assert "epoch 1 held by agent-1, live, expires in 10m" in text
    assert rows(text)["edit-1"].endswith(edit["next"])
    assert rows(text)["build-7"].endswith(build["next"])
    # one next, and the other branch said as such (issue 37: two NEXT lines read as
    # contradictory — publish it, and take over, which undoes it)
    assert "the NEXT above is agent-1's while it is alive; if agent-1 is gone, take over" \
        " instead: its unfinished edit-1" in text and "will be undone, not finished" in text

    # What status says to run moves each step on: published, then acked, then gone.
    for command in doc["next"]:
        assert [r.code for r in world.run_printed(command)] == [0]
    doc = world.doc()
    (edit,) = doc["workspaces"][0]["steps"]
    assert (edit["what"], edit["state"], edit["next"]) == (
        "unacked", "manifest-published", f"{base} step ack edit-1 --epoch 1")
    assert [s["next"] for s in doc["other_steps"]] == [f"{base} step ack build-7"]
    for command in doc["next"]:
        assert [r.code for r in world.run_printed(command)] == [0]
    doc = world.doc()
    assert doc["workspaces"][0]["steps"] == [] and doc["other_steps"] == [] and doc["next"] == []
    assert world("steps", "--state", "acked", "--json").json.__len__() == 2
    assert "nothing in flight" in world.status().out


def test_an_unsettled_attempt_shows_with_settle_and_is_gone_once_settled(world: World) -> None:
    world.acquire()
    world.fenced("edit-1", 1, b"v1\n")
    # The workspace's directory is swapped while the takeover settles: it cannot, and
    # edit-1 stays in flight under the dead epoch 1 (the lease is held all the same).
    away = world.tmp / "w-away"
    world.dir.rename(away)
    world.dir.mkdir()
    taken = world("--workspace", "w", "lease", "acquire", "--holder", "agent-2", "--force")
    assert taken.code == 1 and "Unsettled" in taken.err, taken
    doc = world.doc()
    (w,) = doc["workspaces"]
    (edit,) = w["steps"]
    settle = f"steptrail --ledger {shlex.quote(doc['ledger'])} --workspace w lease settle --epoch 2"
    assert (edit["step"], edit["what"], edit["state"], edit["epoch"]) == (
        "edit-1", "unsettled", "fenced", 1)
    assert edit["next"] == settle and w["next"] == [settle] and doc["next"] == [settle]
    text = world.status().out
    assert re.search(r"^  edit-1 +unsettled +fenced +1 +1  " + re.escape(settle) + "$", text, re.MULTILINE)
    assert "epoch 2 held by agent-2, live" in text

    world.dir.rmdir()
    away.rename(world.dir)  # the directory is back: settling can put v0 back
    (done,) = world.run_printed(settle)
    assert done.code == 0, done
    assert (world.dir / "app.py").read_text() == "v0\n"
    doc = world.doc()
    assert doc["workspaces"][0]["steps"] == [] and doc["next"] == []
    out = world.status().out
    # nothing waits for a command any more; the undone attempt stays listed for a
    # person (its work is gone: re-plan it or leave it) in the attention section
    head, _, rest = out.partition("refusals, undos and settlements")
    assert "edit-1" not in head and "SETTLED      edit-1" in rest, out


def test_an_expired_lease_says_so_and_a_new_epoch_settles_its_steps(world: World) -> None:
    world.acquire(ttl="1s")
    world.fenced("edit-1", 1, b"v1\n")
    time.sleep(1.2)
    doc = world.doc()
    (w,) = doc["workspaces"]
    assert w["lease"]["state"] == "expired" and w["lease"]["expired"] and not w["lease"]["live"]
    acquire = (f"steptrail --ledger {shlex.quote(doc['ledger'])} --workspace w lease acquire"
               ' --holder "$USER" --ttl 10m')
    assert [s["next"] for s in w["steps"]] == [acquire] and w["next"] == [acquire]
    assert w["takeover"] is None
    assert re.search(r"epoch 1 held by agent-1, expired \d+s ago", world.status().out)
    (done,) = world.run_printed(acquire)
    assert done.code == 0 and "settled" in done.out, done
    assert (world.dir / "app.py").read_text() == "v0\n"
    doc = world.doc()
    assert doc["workspaces"][0]["steps"] == []
    assert doc["workspaces"][0]["lease"]["holder"] == "agent-2"


def test_a_step_committed_but_not_acked_when_its_lease_lapsed(world: World) -> None:
    world.acquire(ttl="1s")
    world.fenced("edit-1", 1, b"v1\n")
    with Ledger.open(world.location) as led:
        led.publish("edit-1")  # committed; the worker died before its ack
    time.sleep(1.2)
    (edit,) = world.doc()["workspaces"][0]["steps"]
    base = f"steptrail --ledger {shlex.quote(world.doc()['ledger'])}"
    assert (edit["what"], edit["state"]) == ("unacked", "manifest-published")
    assert edit["next"] == (f'{base} --workspace w lease acquire --holder "$USER" --ttl 10m'
                            f" && {base} step ack edit-1 --epoch 2")
    assert [r.code for r in world.run_printed(edit["next"])] == [0, 0]
    assert world.doc()["workspaces"][0]["steps"] == []
    assert (world.dir / "app.py").read_text() == "v1\n"  # committed: settling kept it


def test_the_last_collection_is_what_gc_recorded(world: World) -> None:
    with Ledger.open(world.location) as led:
        led.plan("build-2", artifacts=["log.txt"])
        led.store("build-2", 1, "log.txt", b"half a log")
        led.workspaces.compensate("build-2", reason="runner died")
    assert world.doc()["gc"]["recorded"] is False
    with Ledger.open(world.location) as led:
        assert collect(led, grace_s=0, force=True).collected == 1
    gc = world.doc()["gc"]
    assert gc["recorded"] and (gc["blobs"], gc["bytes"]) == (1, 10)
    assert (gc["last"]["blobs"], gc["last"]["bytes"]) == (1, 10)
    assert re.search(r"^gc +last collection \d+s ago \(.+\): 1 blob, 10 bytes collected$", world.status().out,
                     re.MULTILINE)


def test_the_witness_and_whether_it_holds_the_head(tmp_path: Path, ledger_at: LedgerAt) -> None:
    witness = tmp_path / "other-volume" / "ledger.witness"
    witness.parent.mkdir()
    location = os.fspath(ledger_at(tmp_path / "ledger.db"))
    assert run_cli(["--ledger", location, "--witness", str(witness), "init"]).code == 0
    r = run_cli(["--ledger", location, "status", "--json"])
    w = r.json["witness"]
    assert (w["configured"], w["path"], w["state"], w["matches"], w["at_head"]) == (
        True, str(witness), "ok", True, True)
    assert w["witnessed_seq"] == w["head_seq"] == r.json["head"]["seq"]
    text = run_cli(["--ledger", location, "status"]).out
    assert re.search(rf"^witness +{re.escape(str(witness))}: holds #\d+, the head is #\d+;"
                     " matches$", text, re.MULTILINE)


def test_workspace_shows_only_that_one(world: World) -> None:
    other = world.tmp / "other"
    other.mkdir()
    assert world("workspace", "add", "other", str(other)).code == 0
    assert [w["name"] for w in world.doc()["workspaces"]] == ["other", "w"]  # by name
    doc = world.doc("--workspace", "w")
    assert [w["name"] for w in doc["workspaces"]] == ["w"] and doc["workspaces_not_shown"] == 1
    assert [w["name"] for w in world.doc("--workspace", "other")["workspaces"]] == ["other"]
    r = run_cli(["--ledger", world.location, "--workspace", "other", "status"])  # the global one
    assert "workspace other at" in r.out and "workspace w at" not in r.out
    assert "1 other workspace not shown" in r.out
    bad = world("status", "--workspace", "nope")
    assert bad.code == 2 and "UnknownWorkspace" in bad.err


def test_a_missing_ledger_is_one_line_naming_init(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ledger.db"
    for extra in ([], ["--json"]):
        r = run_cli(["--ledger", str(missing), "status", *extra])
        assert r.code == 2 and r.err.startswith("steptrail: error: LedgerNotFound: "), r
        assert "init" in r.err
    assert not (tmp_path / "nowhere").exists()  # nothing created


#: A worker of epoch 1 applies edit-1 and is SIGKILLed: its commits are in the -wal, not
#: yet checkpointed into the file (a read-write open closing last would checkpoint them).
WORKER_DIES = """
import os, signal, sys
from ledger import Ledger, StepPlan
ledger = Ledger.open(sys.argv[1])
read = ledger.workspaces.read_file("w", "app.py")
ledger.workspaces.admit("w", 1, [StepPlan("edit-1", [read.write(b"v1\\n")])])
assert ledger.workspaces.apply("edit-1", epoch=1).verdict == "applied"
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.sqlite_only
def test_status_only_reads_even_while_a_writer_holds_the_lock(world: World) -> None:
    import signal
    import subprocess
    import sys

    world.acquire()
    done = subprocess.run([sys.executable, "-c", WORKER_DIES, world.location],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert os.path.getsize(world.location + "-wal") > 0  # the crash's commits, unmerged
    before = lock_files_aside(snapshot_dir(world.tmp))
    mtime = os.stat(world.location).st_mtime_ns
    doc = world.doc()
    text = world.status().out
    assert [s["step"] for s in doc["workspaces"][0]["steps"]] == ["edit-1"] and "edit-1" in text
    assert lock_files_aside(snapshot_dir(world.tmp)) == before  # no byte, no file added
    assert os.stat(world.location).st_mtime_ns == mtime

    holder = raw_connection(world.location)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held (a writer mid-transaction)
    try:
        started = time.monotonic()
        during = world.doc()
        assert (during["head"], during["workspaces"][0]["steps"]) == (
            doc["head"], doc["workspaces"][0]["steps"])
        assert time.monotonic() - started < 10  # never waited for the lock
        assert lock_files_aside(snapshot_dir(world.tmp)) == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_password_in_the_location_is_never_printed(world: World, store_kind: str) -> None:
    if store_kind != "postgres":
        pytest.skip("a SQLite ledger has no password")
    # The test server trusts its role: a password in the URL is accepted and unused.
    url = world.location.replace("steptrail@", "steptrail:pw4status7marker@", 1)
    assert url != world.location
    world.acquire()
    world.fenced("edit-1", 1, b"v1\n")
    for extra in ([], ["--json"]):
        r = run_cli(["--ledger", url, "status", *extra])
        assert r.code == 0, r
        assert "pw4status7marker" not in r.out + r.err and "***" in r.out

"""`steptrail gc`, `audit` and `restore`: exit codes, --json shapes, one-line errors.

The command runs on the wall clock, so the ledgers here are written through the library
on a FakeClock that sits in 2023: every inline row is then years old, and a blob file is
aged with os.utime. Restores need a lease that is live by the wall clock, so that world
is built on the real clock.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest
from conftest import CliOut, FakeClock, digest_of, lock_files_aside, run_cli

from ledger import Ledger
from ledger.step.values import StepPlan, Write
from ledger.gc.collector import collector_lock
from ledger.runner import run_step

ROOT = pathlib.Path(__file__).resolve().parents[2]
DAY_S = 86400
h = digest_of
Out = CliOut


def run(ledger: pathlib.Path | None, *args: str) -> Out:
    """`steptrail [--ledger PATH] ARGS` in-process (checked by `conftest.run_cli`)."""
    return run_cli((["--ledger", str(ledger)] if ledger is not None else []) + list(args))


def tree(directory: pathlib.Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `directory`: its bytes and mtime (what 'changes nothing' means)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(directory))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def age(path: pathlib.Path, days: float) -> None:
    t = time.time() - days * DAY_S
    os.utime(path, (t, t))


# --- a ledger with every kind of blob --------------------------------------------------

BIG = b"B" * 70_000  # a referenced file blob (> 64 KiB)
SMALL = b"hello"  # a referenced inline blob
ORPHAN_INLINE = b"orphan small"  # 12 bytes, inline, stored in 2023: old
ORPHAN_FILE = b"O" * 80_000  # a file, aged 3 days: old
YOUNG_FILE = b"Y" * 90_000  # a file written now: young
IN_FLIGHT = b"in flight"  # 9 bytes, pinned by an attempt still in flight


@dataclass
class Store:
    path: pathlib.Path
    dir: pathlib.Path

    def blob_file(self, data: bytes) -> pathlib.Path:
        d = h(data)
        return self.dir / "blobs" / d[:2] / d

    def inline_digests(self) -> set[str]:
        with Ledger.open(self.path, readonly=True) as ledger:
            return {r["digest"] for r in ledger.blob_list() if r["where"] == "inline"}

    def collected(self) -> list[str]:
        with Ledger.open(self.path, readonly=True) as ledger:
            return sorted(r.event.digest for r in ledger.read(kind="blob-collected"))


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Store:
    path = tmp_path / "ledger.db"
    with Ledger.init(path, clock=FakeClock()) as ledger:
        run_step(ledger, "s0", {"a.txt": SMALL, "big.bin": BIG})
        row = ledger.plan("orph", artifacts=["o.txt", "ob.bin", "oy.bin"])
        for name, data in (("o.txt", ORPHAN_INLINE), ("ob.bin", ORPHAN_FILE),
                           ("oy.bin", YOUNG_FILE)):
            ledger.store("orph", row.attempt, name, data)
        ledger.workspaces.compensate("orph", reason="tests failed")  # its blobs are orphans now
        row = ledger.plan("fly", artifacts=["f.txt"])
        ledger.store("fly", row.attempt, "f.txt", IN_FLIGHT)
    s = Store(path, tmp_path)
    age(s.blob_file(ORPHAN_FILE), 3)
    assert s.blob_file(YOUNG_FILE).exists() and s.blob_file(BIG).exists()
    assert not (tmp_path / "ledger.db-wal").exists()
    return s


STORED = len(BIG + SMALL + ORPHAN_INLINE + ORPHAN_FILE + YOUNG_FILE + IN_FLIGHT)


# --- gc ---------------------------------------------------------------------------------


def test_gc_dry_run_changes_nothing(store: Store) -> None:
    before = tree(store.dir)
    r = run(store.path, "gc", "--dry-run", "--json")
    assert r.code == 0, r
    doc = r.json
    assert doc["dry_run"] is True
    assert (doc["scanned"], doc["scanned_bytes"]) == (6, STORED)
    assert (doc["referenced"], doc["referenced_bytes"]) == (2, len(BIG) + len(SMALL))
    assert (doc["kept_live"], doc["kept_live_bytes"]) == (1, len(IN_FLIGHT))
    assert (doc["kept_young"], doc["kept_young_bytes"]) == (1, len(YOUNG_FILE))
    assert (doc["orphans"], doc["orphan_bytes"]) == (2, len(ORPHAN_INLINE + ORPHAN_FILE))
    assert doc["scanned"] == doc["referenced"] + doc["kept_live"] + doc["kept_young"] + doc["orphans"]
    assert (doc["collected"], doc["reclaimed_bytes"], doc["remaining"]) == (0, 0, 2)
    human = run(store.path, "gc", "--dry-run")
    assert human.code == 0 and "nothing changed" in human.out and "would collect" in human.out
    # read-only: no lock file of ours, no condemned row, not a byte or an mtime moved
    # (SQLite's own, an empty -wal and a -shm, aside)
    assert lock_files_aside(tree(store.dir)) == before
    assert store.collected() == []


def test_gc_collects_aged_orphans_only(store: Store) -> None:
    r = run(store.path, "gc", "--json")
    assert r.code == 0, r
    doc = r.json
    assert doc["dry_run"] is False and doc["stopped"] == ""
    assert (doc["collected"], doc["reclaimed_bytes"]) == (2, len(ORPHAN_INLINE + ORPHAN_FILE))
    assert (doc["kept_young"], doc["kept_live"], doc["remaining"]) == (1, 1, 0)
    assert store.collected() == sorted([h(ORPHAN_INLINE), h(ORPHAN_FILE)])
    assert not store.blob_file(ORPHAN_FILE).exists()
    assert h(ORPHAN_INLINE) not in store.inline_digests()
    assert store.blob_file(YOUNG_FILE).exists() and store.blob_file(BIG).exists()
    assert h(IN_FLIGHT) in store.inline_digests() and h(SMALL) in store.inline_digests()
    assert run(store.path, "verify").code == 0
    # the next run finds nothing left to do; the human summary names every number
    again = run(store.path, "gc")
    assert again.code == 0
    for label in ("scanned", "referenced", "kept: live", "kept: young", "orphans found",
                  "collected", "temp files removed", "recovered", "spared", "remaining"):
        assert label in again.out, label
    assert "collected 0 blobs, reclaimed 0 B" in again.out


def test_a_grace_window_under_an_hour_needs_force(store: Store) -> None:
    before = tree(store.dir)
    r = run(store.path, "gc", "--grace", "10m")
    assert r.code == 2 and "--force" in r.err and "10m" in r.err and "1h" in r.err
    assert tree(store.dir) == before  # refused before the ledger was opened
    r = run(store.path, "gc", "--grace", "10m", "--force", "--json")
    assert r.code == 0 and r.json["grace_s"] == 600
    assert r.json["kept_young"] == 1  # written seconds ago: still inside 10m
    r = run(store.path, "gc", "--grace", "0", "--force", "--json")
    assert r.code == 0 and r.json["collected"] == 1 and r.json["kept_young"] == 0
    assert not store.blob_file(YOUNG_FILE).exists()


@pytest.mark.parametrize("args", [
    ("--grace", "soon"), ("--grace", "-1h"), ("--max-delete", "-1"), ("--max-runtime", "0"),
    ("--max-runtime", "ten"),
])
def test_bad_gc_options_are_exit_2(store: Store, args: tuple[str, ...]) -> None:
    before = tree(store.dir)
    r = run(store.path, "gc", *args)
    assert r.code == 2, r
    assert tree(store.dir) == before


def test_another_collector_is_exit_3_and_a_dry_run_still_works(store: Store) -> None:
    with Ledger.open(store.path, readonly=True) as ledger, collector_lock(ledger):
        r = run(store.path, "gc", "--json")
        assert r.code == 3 and "another steptrail gc holds" in r.err and "--wait" in r.err
        assert store.collected() == [] and store.blob_file(ORPHAN_FILE).exists()
        dry = run(store.path, "gc", "--dry-run", "--json")
        assert dry.code == 0 and dry.json["orphans"] == 2
    assert run(store.path, "gc", "--json").json["collected"] == 2


def test_wait_waits_for_the_other_collector(store: Store) -> None:
    held, release = threading.Event(), threading.Event()

    def other() -> None:
        with Ledger.open(store.path, readonly=True) as ledger, collector_lock(ledger):
            held.set()
            release.wait(10)
            time.sleep(0.2)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert held.wait(10)
        release.set()
        started = time.monotonic()
        r = run(store.path, "gc", "--wait", "--json")
    finally:
        release.set()
        t.join()
    assert r.code == 0 and r.json["collected"] == 2
    assert time.monotonic() - started >= 0.1


def test_max_delete_stops_and_the_next_run_resumes(store: Store) -> None:
    r = run(store.path, "gc", "--max-delete", "1", "--json")
    assert r.code == 0, r
    assert (r.json["collected"], r.json["stopped"], r.json["remaining"]) == (1, "max-delete", 1)
    assert "stopped at --max-delete" in r.err and "1 condemned" in r.err
    audit = run(store.path, "audit", "--json").json
    assert audit["condemned"] == 1 and audit["ok"] is True
    r = run(store.path, "gc", "--json", "--max-runtime", "10m")
    assert (r.json["collected"], r.json["stopped"], r.json["remaining"]) == (1, "", 0)
    assert len(store.collected()) == 2


def test_gc_refuses_when_a_referenced_blob_was_removed_by_hand(store: Store) -> None:
    store.blob_file(BIG).unlink()
    for args in (("gc",), ("gc", "--json"), ("gc", "--dry-run")):
        r = run(store.path, *args)
        assert r.code == 1, r
        assert "refused" in r.err and h(BIG)[:12] in r.err
        if "--json" in args:  # one typed error object, as on stderr
            assert r.json["ok"] is False and r.json["error"]["exit_code"] == 1
            assert r.err.startswith(f"steptrail: error: {r.json['error']['type']}: ")
        else:
            assert r.out == ""
        assert "steptrail audit" in r.err
    # failed closed: nothing was deleted, nothing recorded
    assert store.collected() == []
    assert h(ORPHAN_INLINE) in store.inline_digests() and store.blob_file(ORPHAN_FILE).exists()
    audit = run(store.path, "audit", "--json")
    assert audit.code == 1
    assert audit.json["dangling"] == [{"digest": h(BIG), "named_by": ["s0 r0 big.bin"]}]
    human = run(store.path, "audit")
    assert human.code == 1 and f"VIOLATION [dangling] blob {h(BIG)}" in human.out
    assert "s0 r0 big.bin" in human.out and "audit: 1 violation" in human.out


def test_gc_on_something_that_is_not_a_ledger_is_exit_2_and_untouched(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"hello, not a database\n" * 10)
    before = tree(tmp_path)
    for args in (("gc",), ("gc", "--dry-run"), ("audit",),
                 ("restore", "--workspace", "w", "--to", str(tmp_path / "out"))):
        r = run(path, *args)
        assert r.code == 2 and "not a steptrail ledger" in r.err, (args, r)
    assert tree(tmp_path) == before


# --- audit ------------------------------------------------------------------------------


def test_audit_json_reconciles_every_byte(store: Store) -> None:
    before = tree(store.dir)
    r = run(store.path, "audit", "--json")
    assert r.code == 0, r
    a = r.json
    assert a["ok"] is True and a["violations"] == 0 and a["reconciled"] is True
    assert (a["committed_steps"], a["committed_bytes"], a["committed_bytes_distinct"]) == (
        1, len(BIG + SMALL), len(BIG + SMALL))
    assert (a["pending_steps"], a["pending_bytes"]) == (1, len(IN_FLIGHT))
    assert (a["stored_blobs"], a["stored_bytes"]) == (6, STORED)
    assert a["referenced"] == {"count": 2, "bytes": len(BIG + SMALL)}
    assert a["pinned"] == {"count": 1, "bytes": len(IN_FLIGHT)}
    assert a["orphan_young"] == {"count": 1, "bytes": len(YOUNG_FILE)}
    assert a["orphan_old"] == {"count": 2, "bytes": len(ORPHAN_INLINE + ORPHAN_FILE)}
    assert a["temporary"] == {"count": 0, "bytes": 0}
    buckets = ("referenced", "pinned", "orphan_young", "orphan_old", "temporary")
    assert a["stored_bytes"] == sum(a[b]["bytes"] for b in buckets)
    assert a["inline"]["bytes"] + a["files"]["bytes"] == a["stored_bytes"]
    human = run(store.path, "audit")
    assert human.code == 0
    line = next(x for x in human.out.splitlines() if x.startswith("stored = "))
    assert line == (
        "stored = referenced + pinned + orphan(young) + orphan(old) + temporary: "
        f"{STORED} = {len(BIG + SMALL)} + {len(IN_FLIGHT)} + {len(YOUNG_FILE)}"
        f" + {len(ORPHAN_INLINE + ORPHAN_FILE)} + 0 — holds")
    for label in ("committed steps", "committed bytes", "pending", "collected so far"):
        assert label in human.out
    assert lock_files_aside(tree(store.dir)) == before  # audit only reads (SQLite's lock files aside)
    # after a gc the collected bytes are accounted for, and it still reconciles
    assert run(store.path, "gc").code == 0
    a = run(store.path, "audit", "--json").json
    assert a["ok"] is True and a["collected"] == {"count": 2, "bytes": len(ORPHAN_INLINE + ORPHAN_FILE)}
    assert a["orphan_old"]["count"] == 0 and a["stored_bytes"] == STORED - a["collected"]["bytes"]


def test_audit_grace_moves_the_young_old_split(store: Store) -> None:
    a = run(store.path, "audit", "--grace", "0", "--json").json
    assert a["grace_s"] == 0 and a["orphan_young"]["count"] == 0 and a["orphan_old"]["count"] == 3
    a = run(store.path, "audit", "--grace", "7d", "--json").json
    assert a["orphan_young"]["count"] == 2 and a["orphan_old"]["count"] == 1  # the 2023 row


def test_audit_deep_finds_a_corrupt_blob(store: Store) -> None:
    f = store.blob_file(BIG)
    f.chmod(0o644)
    f.write_bytes(b"X" * len(BIG))  # same size: only re-hashing sees it
    assert run(store.path, "audit").code == 0
    r = run(store.path, "audit", "--deep", "--json")
    assert r.code == 1 and r.json["ok"] is False and r.json["deep"] is True
    assert [c["digest"] for c in r.json["corrupt"]] == [h(BIG)]
    assert r.json["corrupt"][0]["problem"].startswith("corrupt")
    human = run(store.path, "audit", "--deep")
    assert human.code == 1 and f"VIOLATION [corrupt] blob {h(BIG)}" in human.out


# --- restore ----------------------------------------------------------------------------


@dataclass
class RestoreWorld:
    tmp: pathlib.Path
    path: pathlib.Path
    epoch: int


@pytest.fixture
def world(tmp_path: pathlib.Path) -> RestoreWorld:
    """Workspace w, lease live by the wall clock: s1 committed (app.py v1, sub/new.bin a
    file blob), s2 applied over it but never published (app.py v2 on disk)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v0")
    path = tmp_path / "ledger.db"
    with Ledger.init(path) as ledger:
        ledger.workspaces.add("w", str(ws))
        epoch = ledger.workspaces.acquire("w", "agent-1", ttl_s=3600).epoch
        ledger.workspaces.admit("w", epoch, [StepPlan("s1", (Write("app.py", b"v1", h("v0")),
                                                   Write("sub/new.bin", BIG, None)), run="r")])
        assert ledger.workspaces.apply("s1", epoch=epoch).verdict == "applied"
        ledger.publish("s1")
        ledger.ack("s1")
        ledger.workspaces.admit("w", epoch, [StepPlan("s2", (Write("app.py", b"v2", h("v1")),), run="r")])
        assert ledger.workspaces.apply("s2", epoch=epoch).verdict == "applied"
    assert (ws / "app.py").read_text() == "v2"
    return RestoreWorld(tmp_path, path, epoch)


def test_restore_round_trip_and_its_exits(world: RestoreWorld) -> None:
    target = world.tmp / "fresh"
    r = run(world.path, "restore", "--workspace", "w", "--to", str(target))
    assert r.code == 1 and r.out == "" and not target.exists()
    assert "leased by 'agent-1'" in r.err and "--force" in r.err and "lease acquire" in r.err
    # the global --workspace works too
    r = run(world.path, "--workspace", "w", "restore", "--to", str(target), "--force", "--json")
    assert r.code == 0, r
    doc = r.json
    assert doc == {"workspace": "w", "root": str(target.resolve()), "paths": 2, "absent": 0,
                   "bytes": 2 + len(BIG), "rev": doc["rev"], "seq": doc["seq"],
                   "deduped": False, "kept": [], "lease_was_live": True}
    assert "take a new epoch" in r.err
    assert (target / "app.py").read_bytes() == b"v1"  # committed, not the unpublished v2
    assert (target / "sub" / "new.bin").read_bytes() == BIG
    # the workspace lives there now; a new epoch settles s2 against the restored files
    shown = run(world.path, "workspace", "show", "w", "--json").json
    assert shown["root"] == str(target.resolve())
    acq = run(world.path, "--workspace", "w", "lease", "acquire", "--holder", "agent-2",
              "--force", "--json")
    assert acq.code == 0 and acq.json["settled"] == ["s2"]
    assert (target / "app.py").read_bytes() == b"v1"
    assert run(world.path, "verify").code == 0 and run(world.path, "audit").code == 0
    # the same restore again: its target holds nothing but its own output, so it is a
    # resumption (a killed restore finishes so), not a refusal
    r = run(world.path, "restore", "--workspace", "w", "--to", str(target), "--force")
    assert r.code == 0, r
    # a target holding anything else, a file, no workspace, an unknown one: exit 2,
    # nothing written
    (target / "stray.txt").write_text("not a restore's")
    r = run(world.path, "restore", "--workspace", "w", "--to", str(target), "--force")
    assert r.code == 2 and "not an empty directory" in r.err
    (target / "stray.txt").unlink()
    (world.tmp / "a-file").write_text("x")
    r = run(world.path, "restore", "--workspace", "w", "--to", str(world.tmp / "a-file"))
    assert r.code == 2 and "not an empty directory" in r.err
    r = run(world.path, "restore", "--to", str(world.tmp / "x"))
    assert r.code == 2 and "--workspace" in r.err
    r = run(world.path, "restore", "--workspace", "nope", "--to", str(world.tmp / "x"))
    assert r.code == 2 and "workspace 'nope'" in r.err and not (world.tmp / "x").exists()
    # with the lease released no --force is needed; an empty existing directory is fine
    assert run(world.path, "--workspace", "w", "lease", "release", "--epoch",
               str(acq.json["epoch"])).code == 0
    again = world.tmp / "again"
    again.mkdir()
    r = run(world.path, "restore", "--workspace", "w", "--to", str(again))
    assert r.code == 0, r
    assert f"restored workspace w to {again.resolve()}: 2 paths" in r.out
    assert (again / "app.py").read_bytes() == b"v1" and r.err == ""


def test_restore_with_a_missing_blob_is_exit_1_and_writes_nothing(world: RestoreWorld) -> None:
    d = h(BIG)
    (world.tmp / "blobs" / d[:2] / d).unlink()
    target = world.tmp / "fresh"
    r = run(world.path, "restore", "--workspace", "w", "--to", str(target), "--force")
    assert r.code == 1 and d[:12] in r.err and "missing" in r.err
    assert not target.exists()


# --- help and docs ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gc", "audit", "restore"])
def test_new_commands_teach_and_are_documented(name: str) -> None:
    r = run(None, name, "--help")
    assert r.code == 0 and "Usage:" in r.out and "Examples:" in r.out
    assert f"steptrail {name}" in r.out.split("Examples:")[1]
    assert "Exit" in r.out  # the exit codes are explained
    docs = (ROOT / "docs" / "cli-json.md").read_text()
    assert f"## `{name} --json`" in docs


SCHEDULE = ROOT / "examples" / "schedule"


def test_the_scheduling_files_run_gc_with_json_and_explain_the_exit_codes() -> None:
    service = (SCHEDULE / "steptrail-maintenance.service").read_text()
    timer = (SCHEDULE / "steptrail-maintenance.timer").read_text()
    cron = (SCHEDULE / "steptrail-maintenance.cron").read_text()
    command = ("/opt/agent/.venv/bin/steptrail --ledger /srv/agent/.steptrail/ledger.db gc"
               " --grace 24h --max-runtime 10m --json")
    assert command in service and command in cron
    for key in ("Type=oneshot", "Nice=", "IOSchedulingClass=idle", "ProtectSystem=strict",
                "ReadWritePaths=/srv/agent/.steptrail", "PrivateTmp=true", "NoNewPrivileges=true"):
        assert key in service, key
    for key in ("OnCalendar=", "RandomizedDelaySec=", "Persistent=true"):
        assert key in timer, key
    for text in (service, timer, cron):
        assert "3" in text and "retr" in text and "human" in text
    # the flags the files use exist
    r = run(None, "gc", "--help")
    for flag in ("--grace", "--max-runtime", "--json"):
        assert flag in r.out


# --- the shipped GC units on a witnessed ledger (issue 11, item 9) ---------------------

#: Where the units keep the witness (their comments say so), and the ledger they name.
UNIT_WITNESS_DIR = "/var/lib/steptrail-witness"
UNIT_LEDGER_DIR = "/srv/agent/.steptrail"


def unit_settings(text: str) -> dict[str, list[str]]:
    """A systemd unit's settings (every value of a repeated key), comments skipped."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def witnessed_ledger_with_an_orphan(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The units' ledger and witness, relocated under `root`; an orphan blob from 2023
    (past gc's 24 h grace) so that gc commits — and has to write the witness."""
    path = root / UNIT_LEDGER_DIR.lstrip("/") / "ledger.db"
    witness = root / UNIT_WITNESS_DIR.lstrip("/") / "agent.witness"
    witness.parent.mkdir(parents=True)
    with Ledger.init(path, clock=FakeClock(), witness=witness) as led:
        row = led.plan("orph", artifacts=["o.txt"])
        led.store("orph", row.attempt, "o.txt", b"an orphan")
        led.workspaces.compensate("orph", reason="tests failed")
    return path, witness


def relocate(text: str, root: pathlib.Path) -> str:
    # (the virtualenv's steptrail, named by its absolute path: this one's, on PATH)
    text = text.replace("/opt/agent/.venv/bin/steptrail", "steptrail")
    for prefix in ("/srv/agent", UNIT_WITNESS_DIR):
        text = text.replace(prefix, str(root) + prefix)
    return text


def check_gc_ran_witnessed(path: pathlib.Path, witness: pathlib.Path, summary: str) -> None:
    assert json.loads(summary.strip().splitlines()[-1])["collected"] == 1, summary
    with Ledger.open(path, readonly=True, witness=witness) as led:
        assert led.witness_lag == 0 and led.verify().ok
        assert [r.kind for r in led.read()][-1] == "blob-collected"


def _env(tmp: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    shim = tmp / "bin"
    shim.mkdir(exist_ok=True)
    exe = shim / "steptrail"  # the units call 'steptrail'; this one runs the tree's
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ledger \"$@\"\n")
    exe.chmod(0o755)
    env["PATH"] = f"{shim}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_systemd_unit_may_write_the_witness_and_its_command_runs_witnessed(
        tmp_path: pathlib.Path) -> None:
    service = unit_settings((SCHEDULE / "steptrail-maintenance.service").read_text())
    writable = [p.lstrip("-") for v in service["ReadWritePaths"] for p in v.split()]
    mounts = [p for v in service["RequiresMountsFor"] for p in v.split()]
    assert UNIT_LEDGER_DIR in writable and UNIT_WITNESS_DIR in writable
    assert UNIT_WITNESS_DIR in mounts
    assert service["ProtectSystem"] == ["strict"]  # so ReadWritePaths is all it may write
    audit_start, gc_start = service["ExecStart"]
    path, witness = witnessed_ledger_with_an_orphan(tmp_path)
    for start in (audit_start, gc_start):
        argv = shlex.split(start)
        assert argv[0] == "/opt/agent/.venv/bin/steptrail"  # absolute: systemd's PATH
        done = subprocess.run(shlex.split(relocate(start, tmp_path)), env=_env(tmp_path),
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done
    check_gc_ran_witnessed(path, witness, done.stdout)


def test_the_cron_line_runs_gc_witnessed(tmp_path: pathlib.Path) -> None:
    text = (SCHEDULE / "steptrail-maintenance.cron").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("#", "SHELL",
                                                                                "PATH"))]
    assert len(lines) == 2  # the audit, then the gc
    path, witness = witnessed_ledger_with_an_orphan(tmp_path)
    for line in lines:
        fields = line.split()
        user, command = fields[5], " ".join(fields[6:])
        assert user == "agent"
        assert " /opt/agent/.venv/bin/steptrail " in f" {command} "  # absolute: cron's PATH
        done = subprocess.run(["/bin/sh", "-c", relocate(command, tmp_path)],
                              env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done
    log = (path.parent / "maintenance.log").read_text()
    check_gc_ran_witnessed(path, witness, log)


# --- regressions: found while writing these (fixed in ledger/gc/collector.py) -----------


def test_gc_keeps_a_stray_file_in_blob_tmp_it_did_not_write(store: Store) -> None:
    tmp = store.dir / "blobs" / "tmp"
    tmp.mkdir(exist_ok=True)
    stray = tmp / "notes.txt"
    stray.write_text("someone's notes")
    age(stray, 3)
    r = run(store.path, "gc", "--json")
    assert r.code == 0, r
    assert r.json["collected"] == 2
    assert stray.exists()  # not ours to delete: not a name a put ever writes


def test_the_gc_command_states_the_library_grace_rule() -> None:
    """One grace rule (`ledger.gc.grace`): the command's default and its --force bound
    are the library's, and it refuses a short window with the library's check."""
    from ledger.cli.gc import gc_cmd
    from ledger.gc import DEFAULT_GRACE_S, MIN_GRACE_S
    from ledger.fmt import duration

    grace = next(p for p in gc_cmd.params if p.name == "grace")
    assert grace.default == duration(DEFAULT_GRACE_S)
    assert f"Under {duration(MIN_GRACE_S)} only with --force" in (grace.help or "")
    force = next(p for p in gc_cmd.params if p.name == "force")
    assert duration(MIN_GRACE_S) in (force.help or "")

"""GC against writers, with real processes (gc-anchors.md section 9, cases 1, 2, 3 and 7).

1. In-flight writer vs GC (delta-rs #3645, Iceberg #4194, Gitaly MR 4416): a writer
   process pins and stores, then is held before publishing (blocked on a pipe, or
   SIGSTOPped in the middle of a put) for longer than the window; GC runs with the
   default window and with the window forced to 0; the writer then publishes. A negative
   control shows the hold is a real race: a collector that ignores pins loses the blobs.
2. Dedup resurrection (git t6501, 33d4221; Iceberg #8255): an old orphan, a new step with
   the same bytes, GC run between the step's "already exists" check and its publish —
   also with the blob condemned beforehand.
3. Interrupted GC (borg #9748): the collector process is SIGKILLed after an unlink; the
   next identical step still writes its blob; audit counts the unrecorded deletion; a
   rerun converges.
4. Concurrency (restic #2452 and friends): writer processes publishing and abandoning
   steps over a few shared contents while two collector processes loop with the window
   forced to 0. ``STEPTRAIL_GC_STRESS=1`` runs more seeds for longer.

After each: every blob of every manifest revision reads back with its sha256, audit has
no dangling blob and reconciles against an independent byte count (`check_store`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gc_workers import (
    INLINE_MAX,
    WallClock,
    abandon,
    age_everything,
    check_history,
    check_store,
    sha,
)

import ledger.gc.collector as collector_mod
from ledger import Ledger
from ledger.events import BlobCollected
from ledger.gc import audit, collect
from ledger.runner import run_step

DAY = 86400
WORKERS = Path(__file__).with_name("gc_workers.py")
STRESS = os.environ.get("STEPTRAIL_GC_STRESS") == "1"

HELD = {"l": "a large artifact the held writer stores as a file " * 8,
        "s": "held, inline"}
assert len(HELD["s"]) <= INLINE_MAX < len(HELD["l"])


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start ``gc_workers.py`` with arguments; every child still alive at teardown (a test
    failed while it was held or stopped) is killed and reaped."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(WORKERS), *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=WORKERS.parent.parent,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()  # SIGKILL ends a stopped process too
        proc.communicate()


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{err}"
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Until the child has SIGSTOPped itself (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited early: {proc.communicate()[1]}"
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("the worker never reached its stop point")


@pytest.fixture
def led(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger.init(tmp_path / "ledger.db", clock=WallClock(), inline_max_bytes=INLINE_MAX)
    try:
        yield ledger
    finally:
        ledger.close()


def collected_digests(ledger: Ledger) -> dict[str, str]:
    out = {}
    for recorded in ledger.read(kind="blob-collected"):
        assert isinstance(recorded.event, BlobCollected)
        out[recorded.event.digest] = recorded.event.reason
    return out


def assert_published(ledger: Ledger, step: str, result: dict[str, Any]) -> None:
    assert ledger.classify(step) == "committed"
    got = {path: (digest, size) for path, digest, size in result["artifacts"]}
    for path, text in HELD.items():
        data = text.encode()
        assert got[path] == (sha(data), len(data))
        assert ledger.read_blob(sha(data), size=len(data), verify=True) == data


# --- 1. in-flight writer vs GC ------------------------------------------------------------


def test_a_writer_held_before_publish_survives_gc(spawn: Spawn, led: Ledger) -> None:
    control = abandon(led, "control", {"l": HELD["l"].upper().encode(), "s": b"control"})
    writer = spawn("hold", led.path, "held", json.dumps(HELD))
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == "stored"
    # the writer stalls for three days: its blobs are far older than any window
    age_everything(led, 3 * DAY)
    default = collect(led)
    forced = collect(led, grace_s=0, force=True)
    assert set(collected_digests(led)) == set(control)  # the collector did run
    assert default.kept_live == 2 and forced.kept_live == 2 and forced.collected == 0
    writer.stdin.write("go\n")
    writer.stdin.flush()
    assert_published(led, "held", finish(writer))
    check_store(led)
    assert collect(led, grace_s=0, force=True).collected == 0
    check_store(led, grace_s=0)


@pytest.mark.parametrize(("stop_at", "existing"), [
    ("dirfsync", False),  # opening the fan-out directory, before the temp file
    ("write", False),  # the temp file exists, empty
    ("fsync", False),  # written, not yet durable
    ("rename", False),  # durable temp file, not yet in place
    ("fsync", True),  # dedup hit on an old orphan: freshened, not yet fsynced
])
def test_a_writer_stopped_inside_a_put_survives_gc(spawn: Spawn, led: Ledger, stop_at: str,
                                                   existing: bool) -> None:
    if existing:  # an orphan with the held writer's bytes, old
        abandon(led, "old", {"l": HELD["l"].encode()})
        assert collect(led, grace_s=0, force=True, max_delete=0).remaining == 1  # condemned
    writer = spawn("hold", led.path, "held", json.dumps(HELD), "--stop-at", stop_at)
    wait_stopped(writer)
    try:
        age_everything(led, 3 * DAY)  # the stop outlasts every window
        temps = {t.name for t in led.blobs.temp_files()}
        for kwargs in ({}, {"grace_s": 0, "force": True}):
            report = collect(led, **kwargs)  # type: ignore[arg-type]
            assert report.collected == 0 and report.temp_removed == 0, report
        assert {t.name for t in led.blobs.temp_files()} == temps  # its temp file stays
        if stop_at in ("write", "fsync", "rename") and not existing:
            assert len(temps) == 1
        check_store(led)
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    assert_published(led, "held", finish(writer))
    assert not list(led.blobs.temp_files())
    check_store(led, grace_s=0)


def test_without_pins_the_held_writer_loses_its_blobs(spawn: Spawn, led: Ledger,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the hold above is a real race. A collector that trusts the window
    alone (pins ignored) deletes a stalled writer's blobs — the delta-rs #3645 shape —
    and the publish guard is all that stops a dangling manifest."""
    monkeypatch.setattr(collector_mod, "live_pins", lambda conn, now, window: {})
    monkeypatch.setattr(collector_mod, "pinned_now", lambda conn, d, now, window: False)
    writer = spawn("hold", led.path, "held", json.dumps(HELD))
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == "stored"
    age_everything(led, 3 * DAY)
    assert collect(led).collected == 2
    writer.stdin.write("go\n")
    writer.stdin.flush()
    _out, err = writer.communicate(timeout=60)
    assert writer.returncode != 0 and "BlobNotFound" in err
    assert led.classify("held") == "no-commit"
    assert not audit(led).dangling
    with pytest.raises(AssertionError, match="pinned from"):
        check_history(led)  # the history check sees what the final state no longer shows


# --- 2. dedup resurrection ----------------------------------------------------------------


@pytest.mark.parametrize("condemned_first", [False, True], ids=["orphan", "condemned"])
def test_dedup_onto_an_old_orphan_with_gc_before_publish(tmp_path: Path,
                                                         condemned_first: bool) -> None:
    """git t6501: reuse an abandoned blob, run gc mid-way, finish the commit, fsck."""
    path = tmp_path / "ledger.db"
    data = {"l": HELD["l"].encode(), "s": HELD["s"].encode()}
    reports: list[Any] = []
    armed = [False]
    gc_side: list[Ledger] = []

    def on_op(name: str) -> None:
        # the writer's dedup path: the existing file was found, re-hashed and freshened;
        # its fsync comes next, then blob-stored and the publish
        if armed[0] and name == "fsync":
            armed[0] = False
            reports.append(collect(gc_side[0]))
            reports.append(collect(gc_side[0], grace_s=0, force=True))

    writer = Ledger.init(path, clock=WallClock(), inline_max_bytes=INLINE_MAX, on_op=on_op)
    gc_side.append(Ledger.open(path, clock=WallClock(), inline_max_bytes=INLINE_MAX))
    gc = gc_side[0]
    try:
        abandon(writer, "old", data)
        age_everything(writer, 3 * DAY)
        file_path = Path(writer.blobs.root, sha(data["l"])[:2], sha(data["l"]))
        inode = file_path.stat().st_ino
        with gc._store.db.read_transaction() as conn:
            (old_ns,) = conn.execute("SELECT stored_ns FROM blob_data WHERE digest = ?",
                                     (sha(data["s"]),)).fetchone()
        if condemned_first:
            assert collect(gc, max_delete=0).remaining == 2
            assert audit(gc).condemned == 2

        row = writer.plan("new", artifacts=tuple(data))
        # the inline artifact first: its dedup (pin, freshen, blob-stored) is one commit
        writer.store("new", row.attempt, "s", data["s"])
        with gc._store.db.read_transaction() as conn:
            (new_ns,) = conn.execute("SELECT stored_ns FROM blob_data WHERE digest = ?",
                                     (sha(data["s"]),)).fetchone()
        assert new_ns > old_ns  # the inline dedup freshened the row
        age_everything(writer, 3 * DAY)  # ... and the writer stalls
        armed[0] = True
        writer.store("new", row.attempt, "l", data["l"])
        assert not armed[0] and len(reports) == 2  # GC ran inside the dedup put
        assert file_path.stat().st_ino == inode  # the "already exists" path was taken
        with gc._store.db.read_transaction() as conn:
            assert conn.execute("SELECT count(*) FROM condemned").fetchone()[0] == 0
        age_everything(writer, 3 * DAY)  # and the writer stalls again before publishing
        reports.append(collect(gc))
        reports.append(collect(gc, grace_s=0, force=True))
        assert all(r.collected == 0 for r in reports), reports
        manifest = writer.publish("new", row.attempt)
        writer.ack("new", row.attempt)
        for entry in manifest.artifacts:
            assert writer.read_blob(entry.digest, size=entry.size, verify=True) == data[entry.path]
        report = check_store(gc, grace_s=0)
        assert report.referenced.count == 2 and not collected_digests(gc)
        assert collect(gc, grace_s=0, force=True).collected == 0
        check_store(gc, grace_s=0)
    finally:
        gc.close()
        writer.close()


def test_dedup_in_a_writer_process_stopped_after_the_existence_check(spawn: Spawn,
                                                                    led: Ledger) -> None:
    """The same race across processes: the writer is SIGSTOPped at the fsync of its dedup
    path, a condemned old orphan of its bytes already freshened, and GC runs twice."""
    abandon(led, "old", {"l": HELD["l"].encode(), "s": HELD["s"].encode()})
    age_everything(led, 3 * DAY)
    assert collect(led, max_delete=0).remaining == 2
    writer = spawn("hold", led.path, "held", json.dumps(HELD), "--stop-at", "fsync")
    wait_stopped(writer)
    try:
        age_everything(led, 3 * DAY)
        default = collect(led)
        forced = collect(led, grace_s=0, force=True)
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    # the inline orphan was not pinned yet when the process stopped (its file comes first):
    # the first run took it, and the writer then stored it anew; the file, pinned, stayed
    assert (default.collected, forced.collected, forced.kept_live) == (1, 0, 1)
    assert collected_digests(led) == {sha(HELD["s"].encode()): "orphan"}
    assert_published(led, "held", finish(writer))
    check_store(led, grace_s=0)


# --- 3. interrupted GC --------------------------------------------------------------------


def test_a_collector_killed_after_an_unlink(spawn: Spawn, led: Ledger) -> None:
    contents = {sha(c): c for c in (f"orphan {i} ".encode() * 30 for i in range(4))}
    for i, c in enumerate(contents.values()):
        abandon(led, f"o{i}", {"l": c})
    age_everything(led, 3 * DAY)
    order = sorted(contents)  # the collector works in digest order

    killer = spawn("kill-gc", led.path, 3, DAY)  # SIGKILL at its 3rd unlink: 2 are done
    killer.communicate(timeout=60)
    assert killer.returncode == -signal.SIGKILL
    gone = [d for d in order if led.blobs.stat(d) is None]
    assert gone == order[:2]
    assert not collected_digests(led)  # the batch never committed
    report = audit(led)
    assert report.collected_unrecorded == 2 and report.condemned == 4
    assert report.ok and not report.dangling

    # the next step with identical bytes: nothing cached says "exists"; it writes the blob
    first = contents[order[0]]
    manifest = run_step(led, "again", {"l": first}).manifest
    assert led.blobs.stat(order[0]) is not None
    assert led.read_blob(order[0], size=len(first), verify=True) == first
    assert manifest.artifacts[0].digest == order[0] and led.classify("again") == "committed"
    report = audit(led)
    assert report.collected_unrecorded == 1 and report.ok and not report.dangling
    check_store(led)

    rerun = collect(led)
    assert (rerun.recovered, rerun.collected, rerun.remaining) == (1, 2, 0)
    assert collected_digests(led) == {
        order[1]: "missing after an interrupted collection",
        order[2]: "orphan", order[3]: "orphan"}
    report = check_store(led)
    assert report.collected_unrecorded == 0 and report.condemned == 0
    assert report.collected.count == 3
    assert collect(led).remaining == 0
    assert led.verify().ok


# --- 4. writers and collectors at once -------------------------------------------------------


SEEDS = range(1, 9) if STRESS else range(1, 3)
SECONDS = 10.0 if STRESS else 3.0


@pytest.mark.parametrize("seed", SEEDS)
def test_writers_and_collectors_at_once(spawn: Spawn, tmp_path: Path, seed: int) -> None:
    path = tmp_path / "ledger.db"
    Ledger.init(path, inline_max_bytes=INLINE_MAX).close()
    procs = [spawn("writer", path, seed, SECONDS, f"w{i}") for i in range(3)]
    procs += [spawn("collector", path, f"{seed}-{i}", SECONDS) for i in range(2)]
    results = [finish(p, timeout=SECONDS + 120) for p in procs]
    writers, collectors = results[:3], results[3:]
    print(f"seed {seed}: writers {writers}, collectors {collectors}")
    assert sum(w["published"] for w in writers) > 0
    assert sum(c["runs"] for c in collectors) > 0
    assert sum(c["collected"] + c["recovered"] for c in collectors) > 0  # GC did delete

    with Ledger.open(path, inline_max_bytes=INLINE_MAX) as ledger:
        assert ledger.verify().ok
        for row in ledger.steps():
            if row.live:
                assert ledger.classify(row.step_id) == "committed", row.step_id
        check_store(ledger, grace_s=0)  # I8: every manifest revision's blobs read back
        final = collect(ledger, grace_s=0, force=True)
        assert final.remaining == 0
        report = check_store(ledger, grace_s=0)
        assert report.orphan_old.count == report.orphan_young.count == 0
        assert report.collected_unrecorded == 0


# --- regressions: bugs these tests found, fixed in ledger/ ----------------------------------------------------------------------------


def _rename_during_listing(monkeypatch: pytest.MonkeyPatch, victim: str,
                           act: Any) -> list[int]:
    """os.listdir that, right after a listing that includes `victim`, calls `act()`: what
    a concurrent process does between a scan's listdir and its stat of each name."""
    real = os.listdir
    hits: list[int] = []

    def listdir(path: Any = ".") -> list[str]:
        names = real(path)
        if victim in names:
            hits.append(1)
            act()
        return names

    real_scandir = os.scandir

    class _Listing:
        """os.scandir, materialized: the names are read, then `act()` runs, then the
        caller stats each entry (as a scan does)."""

        def __init__(self, path: Any) -> None:
            with real_scandir(path) as it:
                self.entries = list(it)
            if victim in {e.name for e in self.entries}:
                hits.append(1)
                act()

        def __enter__(self) -> list[Any]:
            return self.entries

        def __exit__(self, *exc: object) -> None:
            return None

        def __iter__(self) -> Any:
            return iter(self.entries)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", _Listing)
    return hits


def test_regression_a_put_renaming_its_temp_file_during_gc(led: Ledger,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in test_writers_and_collectors_at_once (counted there as listing_races)."""
    run_step(led, "s", {"l": HELD["l"].encode()})  # tmp/ exists
    data = b"being written by a writer " * 10
    digest = sha(data)
    row = led.plan("writing", artifacts=("x",))
    led.pin("writing", row.attempt, digest)  # a writer, pinned, in the middle of its put
    tmp = Path(led.blobs.root, "tmp", f"{digest}.0123456789ab.tmp")
    final = Path(led.blobs.root, digest[:2], digest)

    def arm() -> None:
        tmp.write_bytes(data)

    def put_renames() -> None:
        final.parent.mkdir(exist_ok=True)
        os.rename(tmp, final)

    hits = _rename_during_listing(monkeypatch, tmp.name, put_renames)
    arm()
    report = collect(led, grace_s=0, force=True)  # FileNotFoundError today
    assert hits and report.collected == 0
    arm()
    assert audit(led).ok
    led.store("writing", row.attempt, "x", data)
    assert led.publish("writing").artifacts[0].digest == digest


def test_regression_audit_while_a_collector_unlinks(led: Ledger,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    orphan = abandon(led, "o", {"l": HELD["l"].encode()})[0]
    hits = _rename_during_listing(
        monkeypatch, orphan, lambda: os.unlink(Path(led.blobs.root, orphan[:2], orphan)))
    report = audit(led)  # FileNotFoundError today
    assert hits and report.ok and report.stored_blobs == 0

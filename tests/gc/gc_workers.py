"""Child processes for tests/gc/test_gc_races.py: writers and collectors on one ledger file.

Run as a script (``python tests/gc/gc_workers.py COMMAND ARGS...``), never imported by
pytest as a test module. Every command opens its own `Ledger` on the wall clock (the
clock every process shares, like file mtimes) and prints one JSON line last on stdout.
An unexpected exception exits non-zero with its traceback on stderr: the parent shows it.

Commands:

- ``hold PATH STEP SPEC [--stop-at OP]``: plan STEP with the artifacts in SPEC (a JSON
  object path -> text), pin and store them, print ``stored``, then wait for a line on
  stdin before publishing and acking. With ``--stop-at OP`` the process SIGSTOPs itself
  at its first OP (``rename``, ``fsync``, ...) during the stores, and does not wait on
  stdin afterwards (SIGCONT lets it go on).
- ``kill-gc PATH N GRACE_S``: run `collect` and SIGKILL itself at its N-th ``unlink``.
- ``writer PATH SEED SECONDS PREFIX``: publish and abandon steps whose artifacts come
  from a small pool of contents (so they deduplicate), until SECONDS have passed.
- ``collector PATH SEED SECONDS``: loop `collect` with the window forced to 0,
  retrying on `CollectorBusy`, until SECONDS have passed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

import apsw

HERE = os.path.dirname(os.path.abspath(__file__))
# run as a script (tests/gc/gc_workers.py): the repository's `ledger`
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ledger import Ledger
from ledger.errors import LedgerBusy
from ledger.events import (
    Acked,
    BlobCollected,
    BlobPinned,
    BlobStored,
    Compensated,
    ManifestPublished,
    Rejected,
)
from ledger.gc import AuditReport, CollectorBusy, audit, collect
from ledger.projections.steps import IN_FLIGHT
from ledger.runner import run_step

#: Every process of a race test uses the same threshold: above it a blob is a file.
INLINE_MAX = 64


def pool_content(k: int, generation: int = 0) -> bytes:
    """Content number `k` of the shared pool: even ones inline, odd ones files."""
    if k % 2 == 0:
        return f"small {generation} {k}".encode()
    return (f"large {generation} {k} ".encode() * 40)[: 200 + 37 * k]


#: The pool turns over every GENERATION_S seconds (wall clock, which every process
#: shares): inside a generation the writers deduplicate onto each other's blobs — live
#: ones, and orphans the collectors are deleting at that moment; a whole generation's
#: contents would otherwise all end up referenced, and nothing would be left to race on.
GENERATION_S = 0.25


# -- helpers the tests share ------------------------------------------------------------


class WallClock:
    """The wall clock (file mtimes follow it) plus an offset `advance` moves forward."""

    def __init__(self) -> None:
        self.offset_ns = 0
        self.last = 0

    def __call__(self) -> int:
        self.last = max(time.time_ns() + self.offset_ns, self.last + 1)
        return self.last

    def advance(self, seconds: float) -> None:
        self.offset_ns += int(seconds * 1e9)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ro_sql(ledger_path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A query on a separate, read-only sqlite3 connection (not the ledger's apsw one)."""
    conn = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def walk_bytes(root: str) -> tuple[int, int]:
    """(bytes, files) of every file under `root`, tmp/ included, by lstat."""
    total = files = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_size
            files += 1
    return total, files


def independent_bytes(ledger: Ledger) -> int:
    """What is stored, counted without the ledger: blob files + temp files by os.walk,
    inline rows by SQL on a second connection."""
    on_disk, _ = walk_bytes(ledger.blobs.root)
    (rows,) = ro_sql(ledger.path, "SELECT coalesce(sum(size), 0), coalesce(sum(length(data)), 0)"
                     " FROM blob_data")
    assert rows[0] == rows[1], "an inline row's size column disagrees with its bytes"
    return on_disk + int(rows[0])


def age(ledger: Ledger, digest: str, seconds: float) -> None:
    """Make a blob `seconds` older: a file's mtime, an inline row's stored_ns."""
    found = ledger.blobs.stat(digest)
    if found is not None:
        path = os.path.join(ledger.blobs.root, digest[:2], digest)
        t = found.mtime_ns - int(seconds * 1e9)
        os.utime(path, ns=(t, t), follow_symlinks=False)
    conn = apsw.Connection(ledger.path)
    try:
        conn.execute("UPDATE blob_data SET stored_ns = stored_ns - ? WHERE digest = ?",
                     (int(seconds * 1e9), digest))
    finally:
        conn.close()


def age_everything(ledger: Ledger, seconds: float) -> None:
    """Every blob file, temp file and inline row `seconds` older."""
    for dirpath, _dirs, names in os.walk(ledger.blobs.root):
        for name in names:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            t = st.st_mtime_ns - int(seconds * 1e9)
            os.utime(p, ns=(t, t), follow_symlinks=False)
    conn = apsw.Connection(ledger.path)
    try:
        conn.execute("UPDATE blob_data SET stored_ns = stored_ns - ?", (int(seconds * 1e9),))
    finally:
        conn.close()


def abandon(ledger: Ledger, step: str, outputs: dict[str, bytes]) -> list[str]:
    """Plan and store an attempt, then compensate it: its blobs become unpinned orphans."""
    row = ledger.plan(step, artifacts=tuple(outputs))
    for p in sorted(outputs):
        ledger.store(step, row.attempt, p, outputs[p])
    ledger.workspaces.compensate(step, row.attempt, reason="abandoned")
    return [sha(outputs[p]) for p in sorted(outputs)]


def in_flight(ledger: Ledger, step: str, outputs: dict[str, bytes]) -> list[str]:
    """Plan and store an attempt, and leave it there: pinned, unpublished."""
    row = ledger.plan(step, artifacts=tuple(outputs))
    for p in sorted(outputs):
        ledger.store(step, row.attempt, p, outputs[p])
    return [sha(outputs[p]) for p in sorted(outputs)]


def present(ledger: Ledger, digest: str) -> bool:
    with ledger._store.db.read_transaction() as conn:
        if conn.execute("SELECT 1 FROM blob_data WHERE digest = ?", (digest,)).fetchone():
            return True
    return ledger.blobs.stat(digest) is not None


def check_history(ledger: Ledger) -> None:
    """I8 over time, from the event log: no `blob-collected` names a digest after a
    manifest or a compensation referenced it, nor while an attempt's artifact or
    post-image pin held it. (Checking only the final state would miss a live blob that
    was collected and then stored again by a later step with the same bytes.)"""
    referenced: dict[str, int] = {}  # digest -> first seq that referenced it
    pins: dict[tuple[str, int], dict[str, tuple[int, str]]] = {}  # attempt -> digest -> (seq, role)
    held: dict[str, list[tuple[int, int]]] = {}  # digest -> [(from seq, to seq)]
    collected: list[tuple[int, str]] = []
    for recorded in ledger.read():
        seq, event = recorded.seq, recorded.event
        if isinstance(event, ManifestPublished):
            for e in (*event.writes, *event.artifacts):
                referenced.setdefault(e.digest, seq)
        elif isinstance(event, Compensated):
            for r in event.restored:
                if r.outcome != "conflict" and r.digest is not None:
                    referenced.setdefault(r.digest, seq)
        if isinstance(event, BlobPinned):
            pins.setdefault((event.step, event.attempt), {}).setdefault(
                event.digest, (seq, event.role))
        elif isinstance(event, Acked | Compensated | Rejected):
            attempt = pins.get((event.step, event.attempt), {})
            for digest, (since, role) in list(attempt.items()):
                if isinstance(event, Acked) and role == "pre-image":
                    continue  # the compensation window decides; not checked here
                held.setdefault(digest, []).append((since, seq))
                del attempt[digest]
        elif isinstance(event, BlobCollected):
            collected.append((seq, event.digest))
    for attempt in pins.values():
        for digest, (since, role) in attempt.items():
            if role != "pre-image":
                held.setdefault(digest, []).append((since, 1 << 62))
    for seq, digest in collected:
        assert not (digest in referenced and referenced[digest] < seq), (
            f"blob-collected #{seq} {digest}: referenced since #{referenced[digest]}")
        for since, until in held.get(digest, []):
            assert not since < seq < until, (
                f"blob-collected #{seq} {digest}: pinned from #{since} to #{until}")


def check_store(ledger: Ledger, *, grace_s: float = 86400) -> AuditReport:
    """The invariants after any operation, each checked without trusting audit alone.

    - I8 over time (`check_history`);
    - I8/I1: every blob any manifest revision names, and every pre-image a compensation
      put back, reads back with its size and sha256; every blob an attempt in flight
      recorded as stored is there;
    - audit: no dangling, nothing corrupt, no problem, reconciled; its stored bytes equal
      an independent count (os.walk + SQL on a second connection), and so does the sum
      of its buckets; its referenced bucket equals the referenced blobs counted here.
    """
    entries = ro_sql(ledger.path, "SELECT DISTINCT digest, size FROM manifest_entries")
    refs = {d: int(n) for d, n in entries}
    for recorded in ledger.read(kind="compensated"):
        event = recorded.event
        assert isinstance(event, Compensated)
        for r in event.restored:
            if r.outcome != "conflict" and r.digest is not None:
                refs.setdefault(r.digest, -1)
    for digest, size in refs.items():
        data = ledger.read_blob(digest, size=None if size < 0 else size, verify=True)
        refs[digest] = len(data)
    for row in ledger.steps():
        if row.state not in IN_FLIGHT:
            continue
        for recorded in ledger.read(step=row.step_id, kind="blob-stored"):
            event = recorded.event
            assert isinstance(event, BlobStored)
            if event.attempt == row.attempt:
                problem = ledger.blob_problem(event.digest, event.size)
                assert problem is None, f"in-flight {row.step_id} blob {event.digest}: {problem}"
    check_history(ledger)
    report = audit(ledger, grace_s=grace_s)
    assert not report.dangling, report.dangling
    assert not report.corrupt and not report.problems, (report.corrupt, report.problems)
    assert report.reconciled and report.ok, report
    truth = independent_bytes(ledger)
    buckets = (report.referenced.bytes + report.pinned.bytes + report.orphan_young.bytes
               + report.orphan_old.bytes + report.temporary.bytes)
    assert report.stored_bytes == truth, (report.stored_bytes, truth)
    assert buckets == truth, (buckets, truth)
    assert report.referenced.bytes == sum(refs.values()), (report.referenced, refs)
    assert report.referenced.count == len(refs)
    return report


def open_ledger(path: str, on_op: Callable[[str], None] | None = None) -> Ledger:
    return Ledger.open(path, inline_max_bytes=INLINE_MAX, on_op=on_op)


def say(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


def retry(fn: Callable[[], Any], tries: int = 50) -> Any:
    """Call `fn` again while the ledger is busy (5 processes, one write lock)."""
    for i in range(tries):
        try:
            return fn()
        except LedgerBusy:
            if i == tries - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def cmd_hold(path: str, step: str, spec: str, *rest: str) -> None:
    stop_at = rest[1] if rest[:1] == ("--stop-at",) else None
    armed = [stop_at is not None]

    def on_op(name: str) -> None:
        if armed[0] and name == stop_at:
            armed[0] = False
            os.kill(os.getpid(), signal.SIGSTOP)

    ledger = open_ledger(path, on_op)
    outputs = {p: t.encode() for p, t in json.loads(spec).items()}
    row = ledger.plan(step, artifacts=tuple(outputs))
    for p in sorted(outputs):
        ledger.store(step, row.attempt, p, outputs[p])
    armed[0] = False
    if stop_at is None:
        print("stored", flush=True)
        sys.stdin.readline()
    manifest = ledger.publish(step, row.attempt)
    ledger.ack(step, row.attempt)
    say({"step": step, "artifacts": [[e.path, e.digest, e.size] for e in manifest.artifacts]})


def cmd_kill_gc(path: str, n: str, grace_s: str) -> None:
    count = [0]

    def on_op(name: str) -> None:
        if name == "unlink":
            count[0] += 1
            if count[0] == int(n):
                os.kill(os.getpid(), signal.SIGKILL)

    ledger = open_ledger(path, on_op)
    report = collect(ledger, grace_s=float(grace_s), force=True)
    say({"collected": report.collected, "unlinks": count[0]})  # only if N was never reached


def publish_slowly(ledger: Ledger, step: str, outputs: dict[str, bytes],
                   rng: random.Random) -> None:
    """Store, maybe sleep a little while pinned, then publish and ack (run_step)."""
    row = ledger.plan(step, artifacts=tuple(outputs))
    if not row.live:
        for p in sorted(outputs):
            ledger.store(step, row.attempt, p, outputs[p])
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.01))
    run_step(ledger, step, outputs)


def cmd_writer(path: str, seed: str, seconds: str, prefix: str) -> None:
    rng = random.Random(f"writer {seed} {prefix}")
    ledger = open_ledger(path)
    deadline = time.monotonic() + float(seconds)
    published = abandoned = in_flight_n = 0
    i = 0
    while time.monotonic() < deadline:
        i += 1
        step = f"{prefix}-{i}"
        # distinct contents within a step (equal ones collide on blob-stored's journal key)
        generation = int(time.time() / GENERATION_S)
        outputs = {f"a{j}": pool_content(k, generation)
                   for j, k in enumerate(rng.sample(range(12), rng.randint(1, 3)))}
        roll = rng.random()
        if roll < 0.3:  # publish, maybe dawdling while pinned
            retry(functools.partial(publish_slowly, ledger, step, outputs, rng))
            published += 1
        elif roll < 0.95:  # abandon: the attempt ends unpublished, its blobs are orphans
            retry(functools.partial(abandon, ledger, step, outputs))
            abandoned += 1
        else:  # left in flight (pinned) for the parent's checks
            retry(functools.partial(in_flight, ledger, step, outputs))
            in_flight_n += 1
    say({"published": published, "abandoned": abandoned, "in_flight": in_flight_n})


def cmd_collector(path: str, seed: str, seconds: str) -> None:
    rng = random.Random(f"collector {seed}")
    ledger = open_ledger(path)
    deadline = time.monotonic() + float(seconds)
    runs = busy = collected = recovered = spared = listing_races = 0
    while time.monotonic() < deadline:
        try:
            report = collect(ledger, grace_s=0, force=True,
                             max_delete=rng.choice([None, None, 1, 3]),
                             wait=rng.random() < 0.2)
        except CollectorBusy:
            busy += 1
            time.sleep(rng.uniform(0, 0.005))
            continue
        except LedgerBusy:
            busy += 1
            continue
        except FileNotFoundError:
            # a writer's put renamed its temp file between the collector's listing of
            # tmp/ and its stat of it: test_regression_a_put_renaming_its_temp_file_during_gc (test_gc_races).
            # Nothing was deleted yet (the listing precedes phase 1); count it, go on.
            listing_races += 1
            continue
        runs += 1
        collected += report.collected
        recovered += report.recovered
        spared += report.spared
    say({"runs": runs, "busy": busy, "collected": collected, "recovered": recovered,
         "spared": spared, "listing_races": listing_races})


COMMANDS = {"hold": cmd_hold, "kill-gc": cmd_kill_gc, "writer": cmd_writer,
            "collector": cmd_collector}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])

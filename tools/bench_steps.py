#!/usr/bin/env python3
"""Benchmark a full steptrail step against its raw I/O floor, measured in the same run.

Run from the repository root::

    .venv/bin/python tools/bench_steps.py            # full run (about 2-3 minutes)
    .venv/bin/python tools/bench_steps.py --quick    # fewer steps and repetitions
    .venv/bin/python tools/bench_steps.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_steps.py --dir DIR  # scratch directory under DIR

What a step is
--------------
``ledger.runner.run_step(ledger, step_id, outputs)``: plan -> per artifact (pin ->
durable bytes -> blob-stored) -> publish the manifest -> ack, in four cases: 1 and 4
artifacts of 4 KiB (inline: up to ``inline_max_bytes``, 64 KiB by default, the bytes
live in the ledger file) and of 256 KiB (files in the content-addressed blob store).
Every artifact's content is distinct (a per-blob counter prefix on random bytes), so
no store is skipped by deduplication.

The durable operations a step needs, and why
---------------------------------------------
Each ledger commit is ``BEGIN IMMEDIATE ... COMMIT`` on a WAL database with
``synchronous=FULL``: the COMMIT appends the transaction's dirty pages to the WAL and
fsyncs it once (plus, whenever the WAL passes 1000 pages, SQLite's auto-checkpoint).

* all artifacts inline: ONE commit holding ``planned`` (no ``blob-pinned``), the
  inline bytes in ``blob_data``, every ``blob-stored``, ``manifest-published`` and
  ``acked``. Nothing is written outside the ledger file, so the plan is durable before
  any write the step makes (they are the same commit), and a crash leaves all of it or
  none.
* with a file artifact, two commits: ``planned`` with every artifact's
  ``blob-pinned`` (1 commit) — the plan must be durable before any write, so that a
  crash at any later point is seen and the step is continued or compensated, never
  lost; the pins are taken before the bytes are written or deduplicated, so a
  concurrent GC can never collect a blob the step will name (``run_step`` knows every
  artifact's digest when it plans);
* per file artifact, one durable file create: write a temporary file
  (``O_CREAT|O_EXCL``), fsync it, rename it into its fan-out directory
  ``<blobs>/<first two hex>/<sha256>``, fsync that directory. Only then may an event
  name the blob;
* then every ``blob-stored``, the ``manifest-published`` and the ``acked`` (1 commit):
  the inline bytes go into ``blob_data`` in this transaction, which records that every
  blob is durable and publishes the manifest — the commit point: the step's outputs
  become visible atomically, and only after every blob it names is durable (the guard
  re-checks each one inside the transaction). The ack (pins released) goes with it:
  the runner's caller learns the manifest when ``run_step`` returns either way.

So a fresh step is 1 commit inline and 2 with file blobs, plus k durable file creates
in the file cases. (A replay that continues an attempt found in flight goes transition by
transition instead: ``store`` per artifact, ``publish``, ``ack``.) The script counts
these instead of trusting this text: ours through the ledger's
``on_op`` hook (``Ledger.init(path, on_op=...)``; "commit", "write", "fsync",
"rename", "dirfsync", "mkdir"), the raw sides through SQLite's commit hook and their
own file calls, and prints the counts per case. The 256 fan-out directories and
``tmp/`` exist before timing starts on every side (ours: 256 untimed puts whose
digests cover every prefix), so the counts and times are the steady state.

The numbers
-----------
* ``ours``: steps/s of ``run_step`` on a ledger made by ``Ledger.init`` with default
  options (every validation, projection update, journal-key check and blob re-check
  the library does counts as ours).
* ``floor``: steps/s of raw apsw plus raw file I/O doing exactly ours' commits and
  durable file creates, in the same order: a fresh database with the same pragmas
  (WAL, ``synchronous=FULL``, default page size and auto-checkpoint, the ledger's
  busy timeout), the real ``events`` table and ``events_step`` index (DDL taken from
  ``ledger.store.sqlite.schema.MIGRATIONS[1]``, without the ledger's triggers and projection tables)
  and the real ``blob_data`` table. Each transaction is ``BEGIN IMMEDIATE; INSERT
  ...; COMMIT`` of the same event rows ours commits together, whose journal key,
  payload and hash columns have the lengths ours wrote for the same events (read back
  from a ledger in the same run); the inline bytes go into ``blob_data`` inside the
  blob-stored transaction. A file blob is hashed once (sha256 names it) and created
  durably as above, between the plan's commit and the blob-stored commit. Everything
  except the blob hash is precomputed outside the timed region.
* ``ours/floor``: the headline. Target >= 0.8x in every case: the Python around the
  I/O may cost at most a fifth of a step. PASS/FAIL is printed beside each ratio.
* ``one-commit``: the minimum a step could cost: the file blobs made durable first
  (same creates), then ONE transaction holding every row (all events, inline bytes).
  ``ours/one`` and ``floor/one`` show what the protocol's extra commits cost;
  ``per extra commit`` is (1/floor - 1/one) / (floor commits - 1), the measured price
  of one more durable commit in this run. Fewer commits per step is the real win.
* Diagnostics (not timed, from the counting pass): WAL frames written per step on
  each side (ours also writes its projection tables: steps, pins, manifests,
  checkpoint), and ``beyond floor`` = 1/ours - 1/floor, ours' extra time per step.

Method: per case, ours, floor and one-commit run in blocks of the same number of
steps, interleaved (each repetition runs one block of each, and which side goes first
rotates through all six orders) so drift on the machine hits all three. Every figure
is the median over repetitions; a ratio is the median of the per-repetition ratios,
with its min-max spread. The box this is meant for is a shared, noisy 2-core VM:
read the ratios, not the absolute rates. Scratch files live in a temporary directory
on the file system of the repository (or under --dir), never on a RAM file system
(fsync cost is the point; the script warns if it finds tmpfs), and are removed at
the end. Progress goes to stderr; the exit status is 0 whatever the figures say.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: fsinfo
from fsinfo import fs_info  # noqa: E402
import ledger
from ledger import Ledger
from ledger.store.sqlite.database import BUSY_TIMEOUT_MS, MIGRATIONS
from ledger.runner import run_step

KiB = 1024
TARGET = 0.8
SIDES = ("ours", "floor", "one")
SIDE_LABEL = {"ours": "ours", "floor": "floor", "one": "one-commit"}
TIME_NS = 1_767_225_600_000_000_000  # a fixed time for the raw rows
EVENT_INSERT = (
    "INSERT INTO events(seq, time_ns, workspace, run, step, attempt, epoch, rev,"
    " journal_key, kind, v, payload, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
BLOB_INSERT = "INSERT INTO blob_data(digest, size, data, stored_ns) VALUES (?,?,?,?)"
COUNT_STEPS = 4  # steps of the untimed counting pass per case and side
WARM_STEPS = 5  # untimed steps on the timed databases before the first block


@dataclass(frozen=True)
class Case:
    name: str
    artifacts: int
    size: int

    @property
    def inline(self) -> bool:
        return self.size <= Ledger.INLINE_MAX_DEFAULT

    @property
    def label(self) -> str:
        where = "inline" if self.inline else "file"
        return f"{self.artifacts} x {self.size // KiB} KiB {where}"


CASES = (
    Case("inline1", 1, 4 * KiB),
    Case("inline4", 4, 4 * KiB),
    Case("file1", 1, 256 * KiB),
    Case("file4", 4, 256 * KiB),
)


@dataclass(frozen=True)
class Sizes:
    reps: int
    block: dict[str, int]  # case name -> steps per block (per side and repetition)


FULL = Sizes(reps=12, block={"inline1": 400, "inline4": 200, "file1": 200, "file4": 70})
QUICK = Sizes(reps=6, block={"inline1": 60, "inline4": 30, "file1": 30, "file4": 12})


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- content -------------------------------------------------------------------------


class Content:
    """Distinct artifact bytes: an 8-byte counter prefix on a fixed random body."""

    def __init__(self, size: int) -> None:
        self.body = os.urandom(size)
        self.next = 0

    def take(self) -> bytes:
        self.next += 1
        return self.next.to_bytes(8, "big") + self.body[8:]


def step_id(case: Case, n: int) -> str:
    return f"bench/{case.name}/step-{n:07d}"


def artifact_path(j: int) -> str:
    return f"out/artifact-{j}.bin"


# -- ours ----------------------------------------------------------------------------


def prefix_blobs() -> list[bytes]:
    """Small blobs whose sha256 digests start with every one of the 256 prefixes."""
    found: dict[str, bytes] = {}
    i = 0
    while len(found) < 256:
        data = b"bench-steps fan-out warm-up %d" % i
        found.setdefault(hashlib.sha256(data).hexdigest()[:2], data)
        i += 1
    return [found[k] for k in sorted(found)]


def open_ours(path: str, on_op: Callable[[str], None] | None = None) -> Ledger:
    led = Ledger.init(path, on_op=on_op) if on_op else Ledger.init(path)
    # Untimed: every fan-out directory and tmp/ exists and this BlobStore instance has
    # made their entries durable once (it fsyncs a directory's parent on first use).
    for data in prefix_blobs():
        led.blobs.put(data)
    led.blobs.put(os.urandom(64))  # creates tmp/
    return led


def ledger_conn(led: Ledger) -> apsw.Connection:
    """The ledger's apsw connection: for the untimed WAL-frame diagnostic only."""
    return led._store.db.conn  # noqa: SLF001 - private, diagnostics only


# -- raw floor -------------------------------------------------------------------------


def raw_ddl() -> list[str]:
    """CREATE statements of the real events table, its events_step index and blob_data."""
    mem = apsw.Connection(":memory:")
    try:
        for v in sorted(MIGRATIONS):
            mem.execute(MIGRATIONS[v])
        rows = mem.execute(
            "SELECT type, name, sql FROM sqlite_schema WHERE sql IS NOT NULL AND"
            " ((type = 'table' AND name IN ('events', 'blob_data'))"
            " OR (type = 'index' AND name = 'events_step')) ORDER BY type DESC, name"
        ).fetchall()
    finally:
        mem.close()
    names = {(t, n) for t, n, _ in rows}
    want = {("table", "events"), ("table", "blob_data"), ("index", "events_step")}
    assert names == want, names
    return [sql for _, _, sql in rows]


def raw_open(path: str) -> apsw.Connection:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise SystemExit(f"{path}: SQLite answered journal_mode={mode!r}, not wal")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("BEGIN IMMEDIATE")
    for sql in raw_ddl():
        conn.execute(sql)
    conn.execute("COMMIT")
    return conn


def pragmas(conn: apsw.Connection) -> dict[str, Any]:
    def one(name: str) -> Any:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]

    return {
        "journal_mode": one("journal_mode"),
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(one("synchronous")),
        "page_size": one("page_size"),
        "wal_autocheckpoint": one("wal_autocheckpoint"),
        "busy_timeout_ms": one("busy_timeout"),
    }


class RawBlobs:
    """Raw durable file creates: tmp file (O_CREAT|O_EXCL), fsync, rename into
    ``<root>/<xx>/<digest>``, fsync the fan-out directory. Directory descriptors are
    opened once (the floor does the least work a durable create can)."""

    def __init__(self, root: str) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        os.mkdir(root)
        self.root_fd = os.open(root, flags)
        for name in ["tmp"] + [f"{i:02x}" for i in range(256)]:
            os.mkdir(name, 0o755, dir_fd=self.root_fd)
        os.fsync(self.root_fd)
        parent_fd = os.open(os.path.dirname(os.path.abspath(root)), flags)
        try:
            os.fsync(parent_fd)
        finally:
            os.close(parent_fd)
        self.tmp_fd = os.open("tmp", flags, dir_fd=self.root_fd)
        self.fan_fds = {f"{i:02x}": os.open(f"{i:02x}", flags, dir_fd=self.root_fd)
                        for i in range(256)}

    def create(self, data: bytes, digest: str) -> None:
        name = digest + ".tmp"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444,
                     dir_fd=self.tmp_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        fan_fd = self.fan_fds[digest[:2]]
        os.rename(name, digest, src_dir_fd=self.tmp_fd, dst_dir_fd=fan_fd)
        os.fsync(fan_fd)

    def close(self) -> None:
        for fd in (self.tmp_fd, *self.fan_fds.values(), self.root_fd):
            os.close(fd)


class CountingRawBlobs(RawBlobs):
    """RawBlobs that counts its durable operations under ours' on_op names (untimed)."""

    def __init__(self, root: str, ops: Counter[str]) -> None:
        super().__init__(root)
        self.ops = ops

    def create(self, data: bytes, digest: str) -> None:
        super().create(data, digest)
        self.ops["write"] += 1
        self.ops["fsync"] += 1
        self.ops["rename"] += 1
        self.ops["dirfsync"] += 1


@dataclass(frozen=True)
class Template:
    """Per event of one step, in order: kind, journal key with the step id replaced by
    ``{step}``, payload length: read back from what ours wrote."""

    events: tuple[tuple[str, str, int], ...]


def read_template(db_path: str, step: str) -> Template:
    conn = apsw.Connection(db_path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT kind, journal_key, length(payload) FROM events WHERE step = ? ORDER BY seq",
            (step,),
        ).fetchall()
    finally:
        conn.close()
    quoted = json.dumps(step)
    events = []
    for kind, key, n in rows:
        assert quoted in key, (key, step)
        events.append((kind, key.replace(quoted, "{step}"), n))
    return Template(tuple(events))


class RawRows:
    """The rows a raw side inserts for one step, precomputed outside the timed region."""

    def __init__(self, case: Case, template: Template) -> None:
        kinds = [k for k, _, _ in template.events]
        # an inline step records no pins: its bytes are stored and published in the
        # transaction that makes them exist, so no moment between commits needs holding
        pins = 0 if case.inline else case.artifacts
        want = (["planned"] + ["blob-pinned"] * pins
                + ["blob-stored"] * case.artifacts + ["manifest-published", "acked"])
        assert kinds == want, f"ours wrote {kinds} for one step, expected {want}"
        self.template = template
        self.payloads = [os.urandom(n) for _, _, n in template.events]
        self.prev = os.urandom(32)
        self.hash = os.urandom(32)
        self.seq = 0

    def step(self, step: str) -> list[tuple[Any, ...]]:
        rows = []
        quoted = json.dumps(step)
        for (kind, key, _), payload in zip(self.template.events, self.payloads):
            self.seq += 1
            rows.append((self.seq, TIME_NS, "", "", step, 1, 0, 0, key.replace("{step}", quoted),
                         kind, 1, payload, self.prev, self.hash))
        return rows


# A prepared step: its event rows (planned, a pin per artifact, a blob-stored per
# artifact, published, acked) and its artifacts' bytes.
Prepared = tuple[list[tuple[Any, ...]], list[bytes]]


def floor_step_inline(conn: apsw.Connection, blobs: RawBlobs, step: Prepared) -> None:
    """Ours' one commit when every artifact is inline: every event row and inline blob."""
    one_step_inline(conn, blobs, step)


def floor_step_file(conn: apsw.Connection, blobs: RawBlobs, step: Prepared) -> None:
    """Ours' two commits: the plan with every pin; (the file blobs made durable first)
    every blob-stored, the manifest and the ack."""
    rows, datas = step
    k = len(datas)
    ex = conn.execute
    ex("BEGIN IMMEDIATE")
    conn.executemany(EVENT_INSERT, rows[:1 + k])  # planned + a pin per artifact
    ex("COMMIT")
    for data in datas:
        blobs.create(data, hashlib.sha256(data).hexdigest())
    ex("BEGIN IMMEDIATE")
    conn.executemany(EVENT_INSERT, rows[1 + k:])  # blob-stored x k + published + acked
    ex("COMMIT")


def one_step_inline(conn: apsw.Connection, blobs: RawBlobs, step: Prepared) -> None:
    """One transaction: every event row and every inline blob."""
    rows, datas = step
    ex = conn.execute
    ex("BEGIN IMMEDIATE")
    for data in datas:
        ex(BLOB_INSERT, (hashlib.sha256(data).hexdigest(), len(data), data, TIME_NS))
    conn.executemany(EVENT_INSERT, rows)
    ex("COMMIT")


def one_step_file(conn: apsw.Connection, blobs: RawBlobs, step: Prepared) -> None:
    """Every file blob durable first, then one transaction with every event row."""
    rows, datas = step
    for data in datas:
        blobs.create(data, hashlib.sha256(data).hexdigest())
    ex = conn.execute
    ex("BEGIN IMMEDIATE")
    conn.executemany(EVENT_INSERT, rows)
    ex("COMMIT")


# -- one case --------------------------------------------------------------------------


class Side:
    """One side of a case: prepare a block of steps (untimed), run it (timed)."""

    def __init__(self, name: str, case: Case, content: Content) -> None:
        self.name, self.case, self.content = name, case, content
        self.n = 0

    def next_ids(self, k: int) -> list[str]:
        ids = [step_id(self.case, self.n + i) for i in range(k)]
        self.n += k
        return ids

    def prepare(self, k: int) -> Any:
        raise NotImplementedError

    def run(self, block: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class OursSide(Side):
    def __init__(self, case: Case, content: Content, led: Ledger) -> None:
        super().__init__("ours", case, content)
        self.led = led

    def prepare(self, k: int) -> list[tuple[str, dict[str, bytes]]]:
        return [(sid, {artifact_path(j): self.content.take() for j in range(self.case.artifacts)})
                for sid in self.next_ids(k)]

    def run(self, block: list[tuple[str, dict[str, bytes]]]) -> None:
        led = self.led
        for sid, outputs in block:
            run_step(led, sid, outputs)

    def close(self) -> None:
        self.led.close()


class RawSide(Side):
    def __init__(self, name: str, case: Case, content: Content, conn: apsw.Connection,
                 blobs: RawBlobs, rows: RawRows) -> None:
        super().__init__(name, case, content)
        self.conn, self.blobs, self.rows = conn, blobs, rows
        if name == "floor":
            self.fn = floor_step_inline if case.inline else floor_step_file
        else:
            self.fn = one_step_inline if case.inline else one_step_file

    def prepare(self, k: int) -> list[Prepared]:
        return [(self.rows.step(sid), [self.content.take() for _ in range(self.case.artifacts)])
                for sid in self.next_ids(k)]

    def run(self, block: list[Prepared]) -> None:
        conn, blobs, fn = self.conn, self.blobs, self.fn
        for step in block:
            fn(conn, blobs, step)

    def close(self) -> None:
        self.conn.close()
        self.blobs.close()


def wal_frames_hook(counter: Counter[str]) -> Callable[[apsw.Connection, str, int], int]:
    """A WAL hook summing frames per commit (it replaces auto-checkpoint: untimed use)."""
    last = [0]

    def hook(_conn: apsw.Connection, _name: str, pages: int) -> int:
        counter["wal_frames"] += pages - last[0] if pages >= last[0] else pages
        last[0] = pages
        return apsw.SQLITE_OK

    return hook


def count_pass(case: Case, cdir: str) -> dict[str, Any]:
    """Untimed: count every side's durable operations and WAL frames per step, and read
    back the row template (key and payload lengths) ours writes for one step."""
    os.makedirs(cdir)
    out: dict[str, Any] = {}
    # ours, through the on_op hook
    ops: Counter[str] = Counter()
    counting = [False]

    def on_op(name: str) -> None:
        if counting[0]:
            ops[name] += 1

    db_path = os.path.join(cdir, "ours", ".steptrail", "ledger.db")
    led = open_ours(db_path, on_op)
    content = Content(case.size)
    outputs = {artifact_path(j): content.take() for j in range(case.artifacts)}
    run_step(led, step_id(case, 0), outputs)  # warm
    conn = ledger_conn(led)
    conn.set_wal_hook(wal_frames_hook(ops))
    counting[0] = True
    for n in range(1, COUNT_STEPS + 1):
        run_step(led, step_id(case, n),
                 {artifact_path(j): content.take() for j in range(case.artifacts)})
    counting[0] = False
    conn.set_wal_hook(None)
    led.close()
    out["ours"] = {k: v / COUNT_STEPS for k, v in sorted(ops.items())}
    template = read_template(db_path, step_id(case, COUNT_STEPS))
    out["template"] = template
    # floor and one-commit: SQLite's commit hook and the counting file calls
    for name in ("floor", "one"):
        ops = Counter()
        conn = raw_open(os.path.join(cdir, f"{name}.db"))
        blobs = CountingRawBlobs(os.path.join(cdir, f"{name}-blobs"), ops)
        side = RawSide(name, case, Content(case.size), conn, blobs, RawRows(case, template))
        side.run(side.prepare(1))  # warm
        ops.clear()

        def commit_hook() -> bool:
            ops["commit"] += 1
            return False  # False: let the commit proceed

        conn.set_commit_hook(commit_hook)
        conn.set_wal_hook(wal_frames_hook(ops))
        side.run(side.prepare(COUNT_STEPS))
        conn.set_commit_hook(None)
        conn.set_wal_hook(None)
        side.close()
        out[name] = {k: v / COUNT_STEPS for k, v in sorted(ops.items())}
    return out


ORDERS = list(itertools.permutations(SIDES))


def bench_case(case: Case, sizes: Sizes, scratch: str) -> dict[str, Any]:
    cdir = os.path.join(scratch, case.name)
    counts = count_pass(case, os.path.join(cdir, "count"))
    template: Template = counts.pop("template")
    content = Content(case.size)
    led = open_ours(os.path.join(cdir, "ours", ".steptrail", "ledger.db"))
    sides: dict[str, Side] = {"ours": OursSide(case, content, led)}
    for name in ("floor", "one"):
        sides[name] = RawSide(name, case, content, raw_open(os.path.join(cdir, f"{name}.db")),
                              RawBlobs(os.path.join(cdir, f"{name}-blobs")),
                              RawRows(case, template))
    prag = {"ours": pragmas(ledger_conn(led)), "floor": pragmas(sides["floor"].conn)}  # type: ignore[attr-defined]
    block = sizes.block[case.name]
    reps: list[dict[str, float]] = []
    try:
        for side in sides.values():
            side.run(side.prepare(WARM_STEPS))
        for r in range(sizes.reps):
            rates: dict[str, float] = {}
            for name in ORDERS[r % len(ORDERS)]:
                side = sides[name]
                work = side.prepare(block)
                gc.collect()
                t0 = time.perf_counter()
                side.run(work)
                rates[name] = block / (time.perf_counter() - t0)
                del work
            reps.append(rates)
            log(f"  {case.label} rep {r + 1}/{sizes.reps}: "
                + "  ".join(f"{SIDE_LABEL[s]} {rates[s]:,.0f}/s" for s in SIDES))
    finally:
        for side in sides.values():
            side.close()
        shutil.rmtree(cdir, ignore_errors=True)
    return summarize(case, counts, reps, prag)


def spread(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(case: Case, counts: dict[str, Any], reps: list[dict[str, float]],
              prag: dict[str, Any]) -> dict[str, Any]:
    med = {s: statistics.median(r[s] for r in reps) for s in SIDES}
    ratio = {
        "ours/floor": spread([r["ours"] / r["floor"] for r in reps]),
        "ours/one": spread([r["ours"] / r["one"] for r in reps]),
        "floor/one": spread([r["floor"] / r["one"] for r in reps]),
    }
    floor_commits = counts["floor"].get("commit", 0)
    extra = floor_commits - counts["one"].get("commit", 0)
    per_commit_ms = statistics.median(
        (1 / r["floor"] - 1 / r["one"]) / extra * 1e3 for r in reps
    ) if extra > 0 else None
    beyond_ms = statistics.median((1 / r["ours"] - 1 / r["floor"]) * 1e3 for r in reps)
    ok = ratio["ours/floor"]["median"] >= TARGET
    same_ops = all(counts["ours"].get(k, 0) == counts["floor"].get(k, 0)
                   for k in ("commit", "write", "fsync", "rename", "dirfsync"))
    return {
        "case": case.name, "label": case.label, "artifacts": case.artifacts,
        "size": case.size, "inline": case.inline,
        "ops_per_step": counts, "ops_match": same_ops,
        "steps_per_s": med, "ratios": ratio, "target": TARGET, "pass": ok,
        "extra_commit_ms": per_commit_ms, "beyond_floor_ms": beyond_ms,
        "pragmas": prag, "reps": reps,
    }


# -- report ----------------------------------------------------------------------------


def code_digest() -> str:
    """sha256 over the ledger package's sources: which code these figures are for."""
    root = os.path.dirname(os.path.abspath(ledger.__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                h.update(os.path.relpath(full, root).encode() + b"\0")
                with open(full, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def describe_ops(ops: dict[str, float]) -> str:
    commits = ops.get("commit", 0)
    creates = ops.get("rename", 0)
    text = f"{commits:g} commit{'s' if commits != 1 else ''}, {creates:g} file create{'s' if creates != 1 else ''}"
    if creates:
        text += (f" ({ops.get('write', 0):g} write, {ops.get('fsync', 0):g} fsync,"
                 f" {ops.get('rename', 0):g} rename, {ops.get('dirfsync', 0):g} dir fsync)")
    other = {k: v for k, v in ops.items()
             if k not in ("commit", "write", "fsync", "rename", "dirfsync", "wal_frames") and v}
    if other:
        text += " + " + ", ".join(f"{v:g} {k}" for k, v in sorted(other.items()))
    return text


def print_report(res: dict[str, Any]) -> None:
    m = res["meta"]
    p = print
    p("steptrail step benchmark: run_step (plan -> blobs -> publish -> ack) vs its raw floor,"
      " same run")
    p(f"  python {m['python']}  SQLite {m['sqlite']}  apsw {m['apsw']}  cpus {m['cpus']}"
      f"  mode {'quick' if m['quick'] else 'full'}  reps {m['reps']}  ({m['seconds']:.0f} s)")
    p(f"  ledger code: {m['ledger_file']} (sources sha256 {m['ledger_digest']})")
    fs = m["scratch_fs"]
    p(f"  scratch: {fs['path']} ({fs['fstype']} on {fs['mount']}"
      f"{', same file system as the repo' if fs['same_fs'] else ', NOT the repo file system'})")
    first = res["cases"][0]
    p(f"  pragmas  ours: {first['pragmas']['ours']}")
    p(f"          floor: {first['pragmas']['floor']}")
    if m.get("ledger_changed"):
        p("  WARNING: the ledger sources changed during the run: rerun")
    p("  a shared, noisy 2-core box: compare the ratios (same run, interleaved), not the rates")
    p("")
    p("Durable operations per step (counted: ours via on_op, raw via commit hook and its own"
      " file calls)")
    p("  commits: all inline: one (planned, pins, inline bytes, blob-stored, manifest, ack)."
      " With a file:")
    p("  planned + every artifact's blob-pinned (durable before any write, GC-safe); every"
      " blob-stored + manifest-published + acked.")
    p("  file create: tmp write + fsync + rename into blobs/xx/ + dir fsync, between the"
      " plan's commit and the publish.")
    for c in res["cases"]:
        o = c["ops_per_step"]
        p(f"  {c['label']:<18} ours:       {describe_ops(o['ours'])}")
        p(f"  {'':<18} floor:      {describe_ops(o['floor'])}"
          f"{'' if c['ops_match'] else '   <-- DIFFERS from ours'}")
        p(f"  {'':<18} one-commit: {describe_ops(o['one'])}")
    p("")
    p(f"Steps/s, median of {m['reps']} interleaved repetitions; ratio = median of per-rep"
      f" ratios [min-max]; target ours >= {TARGET}x floor")
    hdr = (f"  {'case':<18} {'ours':>8} {'floor':>8}  {'ours/floor':<18} {'':4}"
           f" {'one-commit':>10}  {'ours/one':>8} {'floor/one':>9}")
    p(hdr)
    for c in res["cases"]:
        r, q = c["steps_per_s"], c["ratios"]
        of = q["ours/floor"]
        p(f"  {c['label']:<18} {r['ours']:>8,.0f} {r['floor']:>8,.0f}"
          f"  {of['median']:.2f}x [{of['min']:.2f}-{of['max']:.2f}]  {'PASS' if c['pass'] else 'FAIL'}"
          f" {r['one']:>10,.0f}  {q['ours/one']['median']:>7.2f}x {q['floor/one']['median']:>8.2f}x")
    p("")
    p("Per step (medians over repetitions): time ours spends beyond the floor; price of one"
      " extra commit (floor vs one-commit);")
    p("WAL frames written (counting pass, untimed)")
    for c in res["cases"]:
        o = c["ops_per_step"]
        extra = c["extra_commit_ms"]
        p(f"  {c['label']:<18} beyond floor {c['beyond_floor_ms']:6.2f} ms"
          f"   per extra commit {'-' if extra is None else f'{extra:.2f} ms'}"
          f" (x{o['floor'].get('commit', 0) - o['one'].get('commit', 0):g} extra)"
          f"   WAL frames ours {o['ours'].get('wal_frames', 0):g}"
          f" / floor {o['floor'].get('wal_frames', 0):g} / one {o['one'].get('wal_frames', 0):g}")
    p("")
    failed = [c["label"] for c in res["cases"] if not c["pass"]]
    p("RESULT: " + ("PASS (every case >= 0.8x its floor)" if not failed
                    else f"FAIL ({', '.join(failed)} below {TARGET}x the floor)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--dir", metavar="DIR",
                    help="parent of the scratch directory (default: the repository root;"
                    " never a RAM file system, fsync cost is the point)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = os.path.abspath(args.dir or repo)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".bench_steps-", dir=parent)
    fs = fs_info(scratch, beside=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if fs["fstype"] in ("tmpfs", "ramfs"):
        log(f"warning: {scratch} is on {fs['fstype']}: fsync costs nothing there,"
            " so these are not durable-write figures")
    t0 = time.perf_counter()
    res: dict[str, Any] = {"meta": {
        "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(), "cpus": os.cpu_count(), "quick": args.quick,
        "reps": sizes.reps, "block_steps": sizes.block,
        "ledger_file": os.path.dirname(ledger.__file__), "ledger_digest": code_digest(),
        "scratch_fs": fs, "target": TARGET,
    }, "cases": []}
    try:
        log(f"scratch directory {scratch}")
        for case in CASES:
            log(f"{case.label}: {sizes.reps} reps x {sizes.block[case.name]} steps per side")
            res["cases"].append(bench_case(case, sizes, scratch))
    finally:
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    res["meta"]["seconds"] = time.perf_counter() - t0
    if code_digest() != res["meta"]["ledger_digest"]:
        res["meta"]["ledger_changed"] = True
        log("warning: the ledger sources changed during the run; the figures may mix"
            " two versions of the code: rerun")
    res["failed"] = [c["case"] for c in res["cases"] if not c["pass"]]
    res["pass"] = not res["failed"]
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

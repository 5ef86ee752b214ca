#!/usr/bin/env python3
"""Fenced steps/s of N writer processes on SQLite and on PostgreSQL, each beside a raw loop
of the same commits on the bare driver, and LangGraph's PostgresSaver on the same server.

    .venv/bin/python tools/bench_stores.py                  # 1, 4, 16 writers; 3 rounds of 3 s
    .venv/bin/python tools/bench_stores.py --quick          # 1 round of 0.8 s (< 60 s)
    .venv/bin/python tools/bench_stores.py --json
    .venv/bin/python tools/bench_stores.py --stores postgres --writers 1,16
    .venv/bin/python tools/bench_stores.py --url postgresql://u@host/db   # an existing server
    .venv/bin/python tools/bench_stores.py --profile        # where one writer's step goes

What runs
---------
Every writer is a separate interpreter (this file run with ``--child``), each on its own
workspace (its own directory and workspace name) under its own lease, running
`bench_contention.fenced_step` — the workspace protocol's full path, the step
`tools/bench_contention.py` and `tools/stress_processes.py` run: snapshot the path's rev
and on-disk hash, admit one small write planned against them, apply it (pre-image
pinned, post-image staged and fsynced, fence checked, renamed, directory fsynced,
`fenced` recorded), an inline artifact every ``--artifact-every`` steps, publish, ack.
On SQLite the N writers share one ledger file (the library's defaults: WAL,
``synchronous=FULL``); on PostgreSQL one database (the server's defaults:
``synchronous_commit=on``, ``fsync=on``; read back and printed), each case in a fresh
schema of it. Everybody opens first; at one "go" every writer starts, and what ends
inside the measured window (``--warmup`` s after the go, ``--seconds`` long) is counted
(a step of 16 writers can take longer than a short window: counting only what also
started inside it would count none).

Beside each store and writer count, the **raw loop**: the same number of processes, each
one connection of the bare driver committing small transactions in a loop — raw
psycopg (``BEGIN; INSERT; COMMIT`` of one row with a ``bytea`` payload into a scratch
table, synchronous commit on) and raw apsw (``BEGIN IMMEDIATE; INSERT; COMMIT`` on one
shared file, WAL, ``synchronous=FULL``, SQLite's busy handler). The payload is the size
of the event bytes a fenced step commits per commit (measured, printed). A fenced step
is several commits (counted in every writer through the store's ``on_op`` hook, called
with "commit" before each COMMIT), so the comparison is per commit: **ratio to raw** =
steptrail commits/s / raw commits/s, in the same round. The fenced step also writes
and fsyncs its workspace file and directory, which the raw loop does not: that is part
of what the ratio charges steptrail for.

**The peer**: LangGraph's ``PostgresSaver.put`` (langgraph-checkpoint-postgres, the
``[bench]`` extra) on the same server, N processes, each its own connection
(``from_conn_string``) and its own thread_id, a checkpoint carrying one bytes channel
value of the same payload. puts/s; the transactions a put makes are counted once on
the server, untimed (transaction ids assigned around 50 puts).

Each round runs every case on fresh files / a fresh schema, the cells in an order that
reverses from round to round; figures are medians over rounds, ratios medians of
per-round ratios. Beside them: p50/p99 of a step; busy CPUs in the window — this
benchmark's own processes (the writers and, for the throwaway server, every server
process, from /proc) and the whole machine's (both cores = 2.0; anyone else's work
included); CPU ms a step (the writers', + the server's); and the write lock's time a
step, held and waited for, read from the store's internals in each writer (on SQLite
its connection's write statistics; on PostgreSQL the chain lock, the advisory lock every
appending transaction takes, timed from taking it to COMMIT, and every advisory lock's
wait). Under the table, a line per row: a fenced step's wall time a writer, its client
and server CPU, the statements it sends (counted once, untimed, through the driver: on
PostgreSQL each call is one round trip), its commits and the lock's hold time.
tools/bench_pg_ceiling.py splits one writer's step further (a raw replay of its
statements, the same work in 4 round trips, the bare loop, PostgresSaver.put).

Targets (printed with PASS/FAIL; the exit status is 0 whatever they say):
* PostgreSQL, 16 writers: at least 5x its own single-writer steps/s;
* a single writer: at least 0.7x its raw loop (commits/s), per store.
When one is missed the lines after it show what bounds it here: for the first, the raw
psycopg loop's own scaling at 16 processes, the scaling the CPUs allow if a step cost
what it costs one writer, and the scaling the chain lock allows if it were held as long
as with one writer (1000 / held ms a step / steps/s); for the second, a commit's time
and CPU in a step against the raw loop's.

`--profile` runs one writer in-process per store under cProfile (wall clock) instead and
prints the top 15 cumulative entries, the step's calls' share and, on PostgreSQL, the
round trips a step makes.

Ratios, not absolute numbers: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from fsinfo import mount_of  # noqa: E402

# The library and bench_contention (which imports it) are imported where a fenced step or
# the set-up needs them: the raw and peer writers start without them (16 interpreters
# share 2 cores while they start).
FILE = "f.txt"  # bench_contention.FILE (checked against it where the library is loaded)

LEDGER = "ledger.db"
RAW_DB = "raw.db"
STORES = ("sqlite", "postgres")
TARGET_SCALING = 5.0   # PostgreSQL, 16 writers vs 1
TARGET_SCALING_AT = 16
TARGET_RAW = 0.7       # a single writer vs its raw loop, commits/s
PEER_DIST = "langgraph-checkpoint-postgres"
PEER = "PostgresSaver"

QUICK = {"rounds": 1, "seconds": 0.8, "warmup": 0.2}
FULL = {"rounds": 3, "seconds": 3.0, "warmup": 0.5}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- PostgreSQL helpers -------------------------------------------------------------------


def with_schema(url: str, schema: str) -> str:
    """`url` with ``options=-csearch_path=<schema>`` added (after any options it has): the
    store, the raw loop and PostgresSaver all put their tables in the first search_path
    schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    opts = [v for k, v in query if k == "options"]
    query = [(k, v) for k, v in query if k != "options"]
    query.append(("options", " ".join([*opts, f"-csearch_path={schema}"])))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def pg_connect(url: str) -> Any:
    import psycopg
    return psycopg.connect(url, autocommit=True, connect_timeout=10,
                           application_name="bench_stores")


def pg_settings(url: str) -> dict[str, Any]:
    names = ("server_version", "synchronous_commit", "fsync", "wal_sync_method",
             "full_page_writes", "commit_delay", "wal_level", "shared_buffers",
             "max_connections")
    with pg_connect(url) as c:
        return {n: c.execute(f"SHOW {n}").fetchone()[0] for n in names}


def pg_next_xid(url: str) -> int:
    """The next transaction id the cluster will assign (a read-only query assigns none): the
    difference of two readings is the writing transactions committed or aborted between
    them, on the whole cluster."""
    with pg_connect(url) as c:
        return int(c.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
                             ).fetchone()[0])


# -- a writer process ---------------------------------------------------------------------


def _measure(index: int, warmup: float, op: Callable[[int], int],
             meter: Callable[[], tuple[float, float]] | None = None) -> None:
    """Say ready, wait for the go, then call `op(k)` (which returns the commits it made)
    until the window ends, and report on stdout what ended inside the window: its
    latencies and commits. Every operation that ends inside ``[start, end]`` counts,
    whenever it started (a step of 16 writers can outlast a short window; the warm-up
    before it means the writers are already running at their pace)."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    start, end = (float(x) for x in sys.stdin.readline().split())
    while time.monotonic() < start - warmup:
        time.sleep(0.0005)
    lat: list[float] = []
    commits = k = 0
    waited = held = 0.0
    m0 = m1 = (0.0, 0.0)
    while True:
        t0 = time.monotonic()
        if t0 >= end:
            break
        if meter is not None:
            m0 = meter()
        made = op(k)
        t1 = time.monotonic()
        if meter is not None:
            m1 = meter()
        if start <= t1 <= end:
            lat.append(t1 - t0)
            commits += made
            waited += m1[0] - m0[0]
            held += m1[1] - m0[1]
        k += 1
    json.dump({"index": index, "latencies": lat, "commits": commits, "ops_run": k,
               "lock": [waited, held] if meter is not None else None}, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


def lock_meter(led: Any) -> Callable[[], tuple[float, float]] | None:
    """A reading of (seconds waited for locks, seconds the serializing lock held) by this
    writer so far, from the store's internals (None where this build's differ). On SQLite
    its connection's `WriteStats`: BEGIN IMMEDIATE waited for, BEGIN to COMMIT returned (the
    write lock). On PostgreSQL, timed around the store connection's ``execute``: every
    ``pg_advisory_xact_lock*`` statement waited for (the ledger's, the workspace's and the
    chain lock), and the chain lock — the one every transaction that appends takes, so the
    one that serializes the writers of different workspaces — held from taking it until
    COMMIT or ROLLBACK returned. (A lock statement sent with held writes and a read is
    timed whole: its wait includes that round trip's work.)"""
    store = led.storage
    stats = getattr(getattr(store, "db", None), "stats", None)
    if stats is not None and hasattr(stats, "held_s"):
        return lambda: (stats.wait_s, stats.held_s)
    connect = getattr(store, "_connect", None)
    if connect is None:
        return None
    try:
        conn = connect()
        execute = conn.execute
    except Exception:  # noqa: BLE001 - an internal shape this tool does not rely on
        return None
    chain_key = getattr(store, "_chain_key", None)
    acc = [0.0, 0.0, 0.0]  # waited, held, when the chain lock was taken (0: not held)

    def is_chain(query: str, params: Any) -> bool:
        # the store sends its keys as literals ("pg_advisory_xact_lock(class, key)", after a
        # BEGIN and SET LOCALs in the same string) or, in older builds, as parameters
        if chain_key is None:
            return "pg_advisory_xact_lock(" in query
        return (re.search(rf"pg_advisory_xact_lock\(\s*-?\d+,\s*{chain_key}\)", query)
                is not None or (params is not None and "pg_advisory_xact_lock(" in query
                                and chain_key in tuple(params)))

    def timed(query: Any, params: Any = None, *a: Any, **kw: Any) -> Any:
        if isinstance(query, str) and "pg_advisory_xact_lock" in query:
            t0 = time.perf_counter()
            out = execute(query, params, *a, **kw)
            t1 = time.perf_counter()
            acc[0] += t1 - t0
            if not acc[2] and is_chain(query, params):
                acc[2] = t1
            return out
        # a COMMIT alone, or ending the message of the writes the transaction held
        if acc[2] and isinstance(query, str) and (query in ("COMMIT", "ROLLBACK")
                                                  or query.endswith(";\nCOMMIT")):
            try:
                return execute(query, params, *a, **kw)
            finally:
                acc[1] += time.perf_counter() - acc[2]
                acc[2] = 0.0
        return execute(query, params, *a, **kw)

    conn.execute = timed
    return lambda: (acc[0], acc[1])


def _library() -> tuple[Any, Any, Any, Any]:
    """(Ledger, fenced_step, content, artifact): the library and bench_contention's step."""
    import bench_contention as bc
    from ledger import Ledger

    assert bc.FILE == FILE
    return Ledger, bc.fenced_step, bc.content, bc.artifact


def child_fenced(args: argparse.Namespace) -> None:
    Ledger, fenced_step, content, artifact = _library()
    i, ws = args.index, f"w{args.index}"
    counter = [0]

    def on_op(name: str) -> None:
        if name == "commit":
            counter[0] += 1

    where = args.url if args.store == "postgres" else os.path.join(args.root, LEDGER)
    with Ledger.open(where, on_op=on_op) as led:
        epoch = led.workspaces.acquire(ws, f"writer-{i}", ttl_s=3600).epoch

        def step(k: int) -> int:
            before = counter[0]
            art = args.artifact_every > 0 and k % args.artifact_every == 0
            fenced_step(led, ws, epoch, f"p{i}-s{k:06d}", content(i, k),
                        artifact(i, k) if art else None, run=f"run-{i}")
            return counter[0] - before

        _measure(i, args.warmup, step, lock_meter(led))


def child_raw(args: argparse.Namespace) -> None:
    i = args.index
    payload = secrets.token_bytes(args.payload)
    if args.store == "postgres":
        conn = pg_connect(args.url)
        sql = "INSERT INTO t(key, value) VALUES (%s, %s)"

        def commit(k: int) -> int:
            with conn.transaction():
                conn.execute(sql, (f"{i}/{k}", payload))
            return 1
    else:
        import apsw
        conn = apsw.Connection(os.path.join(args.root, RAW_DB))
        conn.setbusytimeout(30_000)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        sql = "INSERT INTO t(key, value) VALUES (?, ?)"

        def commit(k: int) -> int:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, (f"{i}/{k}", payload))
            conn.execute("COMMIT")
            return 1
    commit(-1)  # warm: the first statement's costs
    _measure(i, args.warmup, commit)
    conn.close()


def child_peer(args: argparse.Namespace) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver

    i = args.index
    value = secrets.token_bytes(args.payload)
    config = {"configurable": {"thread_id": f"w{i}", "checkpoint_ns": ""}}
    with PostgresSaver.from_conn_string(args.url) as saver:
        def put(k: int) -> int:
            cp = empty_checkpoint()
            cp["id"] = str(uuid.uuid4())
            cp["channel_values"] = {"result": value}
            cp["channel_versions"] = {"result": k + 2}
            saver.put(config, cp, {"step": k}, {"result": k + 2})  # type: ignore[arg-type]
            return 1

        put(-1)  # warm: the first call's costs (prepared statements, imports)
        _measure(i, args.warmup, put)


def child(args: argparse.Namespace) -> None:
    {"fenced": child_fenced, "raw": child_raw, "peer": child_peer}[args.role](args)


# -- the parent ---------------------------------------------------------------------------


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def _proc_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each of the processes `pids` has used so far
    (/proc/PID/stat; a process gone or unreadable is left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                data = f.read()
            fields = data[data.rindex(")") + 2:].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return out


def _cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU seconds used between two `_proc_cpu` readings by the processes in both (one
    that ended between them, e.g. the backend of a closed set-up session, is left out)."""
    return sum(after[p] - before[p] for p in before.keys() & after.keys())


def _server_pids(postmaster: int | None) -> list[int]:
    """The postmaster and its children (backends, WAL writer, checkpointer...)."""
    if postmaster is None:
        return []
    pids = [postmaster]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
            if int(data[data.rindex(")") + 2:].split()[1]) == postmaster:
                pids.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Bench:
    def __init__(self, args: argparse.Namespace, sizes: dict[str, float]) -> None:
        self.args = args
        self.rounds = int(sizes["rounds"])
        self.seconds = float(sizes["seconds"])
        self.warmup = float(sizes["warmup"])
        self.scratch = tempfile.mkdtemp(prefix="bench-stores-", dir=args.dir)
        self.url: str | None = None  # the PostgreSQL database every case's schema lives in
        self.postmaster: int | None = None  # the throwaway server's (its CPU is counted)
        self.notes: list[str] = []
        self.loads: list[float] = []
        self.payload: dict[str, int] = {}
        self.commits_per_step: dict[str, list[int]] = {}
        self.statements_per_step: dict[str, float] = {}
        self.event_bytes_per_commit: dict[str, float] = {}
        self._cases = 0

    # -- a fresh place per case

    @contextlib.contextmanager
    def place(self, store: str) -> Iterator[tuple[str, str | None]]:
        """(a fresh directory, a fresh schema's URL or None) for one case; removed after."""
        self._cases += 1
        root = tempfile.mkdtemp(prefix=f"{store}-", dir=self.scratch)
        url = None
        schema = f"bench_{os.getpid()}_{self._cases}"
        try:
            if store == "postgres":
                assert self.url is not None
                with pg_connect(self.url) as c:
                    c.execute(f"CREATE SCHEMA {schema}")
                url = with_schema(self.url, schema)
            yield root, url
        finally:
            if store == "postgres" and self.url is not None:
                with pg_connect(self.url) as c:
                    c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            shutil.rmtree(root, ignore_errors=True)

    def _ledger_with_workspaces(self, root: str, url: str | None, n: int) -> str:
        Ledger = _library()[0]
        where = url if url is not None else os.path.join(root, LEDGER)
        with Ledger.init(where) as led:
            for i in range(n):
                d = os.path.join(root, "ws", f"w{i}")
                os.makedirs(d)
                with open(os.path.join(d, FILE), "wb") as f:
                    f.write(b"initial\n")
                led.workspaces.add(f"w{i}", d)
        return where

    # -- what a step commits (once per store, untimed)

    def count(self, store: str) -> None:
        """Commits per step over `artifact_every` steps (the on_op hook) and the event bytes
        they commit: the raw loop's payload is the event bytes per commit."""
        Ledger, fenced_step, content, artifact = _library()
        every = max(1, self.args.artifact_every)
        with self.place(store) as (root, url):
            where = self._ledger_with_workspaces(root, url, 1)
            ops: list[str] = []
            seen: list[str] = []
            from count_statements import pg_trace, sqlite_trace
            tracer = pg_trace if store == "postgres" else sqlite_trace
            with Ledger.open(where, on_op=ops.append) as led:
                epoch = led.workspaces.acquire("w0", "count", ttl_s=3600).epoch
                with led.storage.read() as view:
                    seq0 = view.head().seq
                counts = []
                for k in range(every):
                    ops.clear()
                    art = self.args.artifact_every > 0 and k % self.args.artifact_every == 0
                    with tracer(led, seen):
                        fenced_step(led, "w0", epoch, f"c{k}", content(0, k),
                                    artifact(0, k) if art else None, run="run-0")
                    counts.append(ops.count("commit"))
                with led.storage.read() as view:
                    size = sum(len(r[11]) + len(r[12]) + len(r[13])
                               for r in view.events() if r[0] > seq0)
        self.commits_per_step[store] = counts
        # driver calls (PostgreSQL: each one round trip) / statements (SQLite), a step
        self.statements_per_step[store] = len(seen) / every
        self.event_bytes_per_commit[store] = size / sum(counts)
        self.payload[store] = max(64, round(size / sum(counts)))

    def count_puts(self, puts: int = 50) -> float:
        """The writing transactions one `PostgresSaver.put` makes, counted on the server
        (transaction ids assigned around `puts` puts of one saver, in a fresh schema;
        untimed)."""
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver

        value = secrets.token_bytes(self.payload.get("postgres", 300))
        config = {"configurable": {"thread_id": "count", "checkpoint_ns": ""}}
        with self.place("postgres") as (_root, url):
            assert url is not None
            with PostgresSaver.from_conn_string(url) as saver:
                saver.setup()
            before = pg_next_xid(url)
            with PostgresSaver.from_conn_string(url) as saver:
                for k in range(puts):
                    cp = empty_checkpoint()
                    cp["id"] = str(uuid.uuid4())
                    cp["channel_values"] = {"result": value}
                    cp["channel_versions"] = {"result": k + 1}
                    saver.put(config, cp, {"step": k}, {"result": k + 1})  # type: ignore[arg-type]
            return (pg_next_xid(url) - before) / puts

    # -- one case

    def case(self, store: str, role: str, n: int) -> dict[str, Any]:
        self.loads.append(os.getloadavg()[0])
        with self.place(store) as (root, url):
            if role == "fenced":
                self._ledger_with_workspaces(root, url, n)
            elif role == "raw" and store == "postgres":
                with pg_connect(url) as c:
                    c.execute("CREATE TABLE t(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                              " key text NOT NULL UNIQUE, value bytea NOT NULL)")
            elif role == "raw":
                import apsw
                c = apsw.Connection(os.path.join(root, RAW_DB))
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
                          " value BLOB NOT NULL)")
                c.close()
            else:  # the peer
                from langgraph.checkpoint.postgres import PostgresSaver
                with PostgresSaver.from_conn_string(url) as saver:
                    saver.setup()
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--role", role,
                   "--store", store, "--root", root, "--warmup", str(self.warmup),
                   "--artifact-every", str(self.args.artifact_every),
                   "--payload", str(self.payload.get(store, 300))]
            if url is not None:
                cmd += ["--url", url]
            results, busy, own_s, server_s = self._run_writers(
                cmd, n, self.postmaster if store == "postgres" else None)
        lat = [x for r in results for x in r["latencies"]]
        ops = len(lat)
        commits = sum(r["commits"] for r in results)
        cpu_s = own_s - server_s  # the writers' (from /proc, over the window)
        out = {
            "store": store, "role": role, "writers": n, "ops": ops,
            "ops_per_s": ops / self.seconds, "commits_per_s": commits / self.seconds,
            "commits_per_op": commits / ops if ops else 0.0,
            "p50_ms": _pct(lat, 0.5) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
            "cpus_busy": busy, "own_cpus": own_s / self.seconds,
            "client_cpu_ms_per_op": cpu_s / ops * 1e3 if ops else 0.0,
            # None: no server (SQLite) or not ours to measure (--url)
            "server_cpu_ms_per_op": (server_s / ops * 1e3 if ops else 0.0)
            if store == "postgres" and self.postmaster is not None else None,
            "own_cpu_ms_per_op": own_s / ops * 1e3 if ops else 0.0,
            "per_writer_ops": [len(r["latencies"]) for r in results],
        }
        locks = [r["lock"] for r in results if r.get("lock") is not None]
        if locks and ops:
            out["lock_wait_ms_per_op"] = sum(x[0] for x in locks) / ops * 1e3
            out["lock_held_ms_per_op"] = sum(x[1] for x in locks) / ops * 1e3
        return out

    def _run_writers(self, cmd: list[str], n: int, postmaster: int | None
                     ) -> tuple[list[dict[str, Any]], float, float, float]:
        """Run `n` writers through one window: (their reports, the machine's busy CPUs, the
        CPU seconds the writers and the server's processes used in the window, the
        server's part of it)."""
        procs = [subprocess.Popen([*cmd, "--index", str(i)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for i in range(n)]
        try:
            for p in procs:
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a writer failed to start (rc {p.wait()}): {cmd}")
            start = time.monotonic() + 0.2 + self.warmup
            end = start + self.seconds
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{start} {end}\n")
                p.stdin.flush()
            while time.monotonic() < start:
                time.sleep(0.001)
            writers, server = [p.pid for p in procs], _server_pids(postmaster)
            cpu0, w0, s0 = _cpu_busy(), _proc_cpu(writers), _proc_cpu(server)
            while time.monotonic() < end:
                time.sleep(0.005)
            cpu1, w1, s1 = _cpu_busy(), _proc_cpu(writers), _proc_cpu(server)
            results = []
            for p in procs:
                out, _ = p.communicate(timeout=600)
                if p.returncode:
                    raise RuntimeError(f"a writer failed (rc {p.returncode}): {cmd}")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        busy, total = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        cpus = (busy / total * (os.cpu_count() or 1)) if total else 0.0
        server_s = _cpu_used(s0, s1)
        return results, cpus, _cpu_used(w0, w1) + server_s, server_s

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def start_server(base: str | None, notes: list[str]) -> Any:
    """A throwaway pgserver under `base` (the scratch parent) or, where the server's user
    cannot reach it (as root the server runs as 'postgres'), under the temporary
    directory, with a note."""
    from ledger.testing.pgserver import PgServer, PgServerError

    try:
        return PgServer.start(base)
    except PgServerError as exc:
        if base is None or "not searchable" not in exc.message:
            raise
        notes.append(f"the PostgreSQL server runs under {tempfile.gettempdir()}, not --dir:"
                     f" {exc.message}")
        return PgServer.start(None)


def _postmaster(server: Any) -> int | None:
    try:
        return int((server.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def median(xs: list[float | None]) -> float | None:
    """The median of the measured values (None: not measured)."""
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def rnd(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(QUICK if args.quick else FULL)
    for k in ("rounds", "seconds", "warmup"):
        if getattr(args, k) is not None:
            sizes[k] = getattr(args, k)
    bench = Bench(args, sizes)
    server = None
    versions: dict[str, str] = {"python": platform.python_version()}
    skipped: dict[str, str] = {}
    pg: dict[str, Any] | None = None
    load_before = os.getloadavg()
    try:
        if "postgres" in args.stores:
            if args.url:
                bench.url = args.url
                bench.notes.append("--url: the server's CPU is not measured (cpu ms/step is"
                                   " the writers' alone)")
            else:
                server = start_server(args.dir, bench.notes)
                bench.url = server.create_database("bench")
                bench.postmaster = _postmaster(server)
            from ledger.store.postgres import shown_location
            pg = {"url": shown_location(bench.url), "own_server": server is not None,
                  "settings": pg_settings(bench.url)}
            versions["postgresql"] = pg["settings"]["server_version"]
            versions["psycopg"] = _version("psycopg")
            try:
                import langgraph.checkpoint.postgres  # noqa: F401
                versions[PEER_DIST] = _version(PEER_DIST)
                versions["langgraph-checkpoint"] = _version("langgraph-checkpoint")
            except ImportError as exc:
                skipped[PEER] = (f"{PEER_DIST} is not installed ({exc}): pip install -e"
                                 " '.[bench]'")
                log(f"skipping {PEER}: {skipped[PEER]}")
        if "sqlite" in args.stores:
            import apsw
            versions["sqlite"] = apsw.sqlite_lib_version()
            versions["apsw"] = apsw.apswversion()
        for store in args.stores:
            bench.count(store)
        commits_per_put = bench.count_puts() if "postgres" in args.stores \
            and PEER not in skipped else None
        cells = [(s, n) for s in args.stores for n in args.writers]
        runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for r in range(bench.rounds):
            order = cells if r % 2 == 0 else list(reversed(cells))
            for store, n in order:
                roles = ["fenced", "raw"] + (["peer"] if store == "postgres"
                                             and PEER not in skipped else [])
                if r % 2:
                    roles.reverse()
                for role in roles:
                    t0 = time.monotonic()
                    c = bench.case(store, role, n)
                    runs.setdefault((store, role, n), []).append(c)
                    log(f"  round {r + 1}/{bench.rounds} {store} {role} x{n}:"
                        f" {c['ops_per_s']:.1f} ops/s, {c['commits_per_s']:.1f} commits/s"
                        f" ({time.monotonic() - t0:.1f} s, load {os.getloadavg()[0]:.2f})")
    finally:
        bench.close()
        if server is not None:
            server.close()
    rows = summarize(runs, args.stores, args.writers, PEER not in skipped)
    fs_path = args.dir or tempfile.gettempdir()
    return {
        "tool": "bench_stores", "mode": "quick" if args.quick else "full",
        "rounds": bench.rounds, "seconds": bench.seconds, "warmup": bench.warmup,
        "stores": args.stores, "writers": args.writers, "artifact_every": args.artifact_every,
        "commits_per_step": bench.commits_per_step,
        "statements_per_step": {k: round(v, 1) for k, v in bench.statements_per_step.items()},
        "event_bytes_per_commit": {k: round(v, 1) for k, v in bench.event_bytes_per_commit.items()},
        "raw_payload_bytes": bench.payload,
        "fs": {"path": os.path.realpath(fs_path), "type": mount_of(fs_path)[1]},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()],
                    "load1_during": [round(min(bench.loads), 2), round(max(bench.loads), 2)]
                    if bench.loads else None},
        "postgres": pg, "versions": versions, "skipped": skipped, "notes": bench.notes,
        "rows": rows["rows"], "peer": rows["peer"],
        "peer_commits_per_put": rnd(commits_per_put, 2),
        "targets": targets(rows["rows"], args.stores),
    }


def summarize(runs: dict[tuple[str, str, int], list[dict[str, Any]]], stores: list[str],
              writers: list[int], with_peer: bool) -> dict[str, list[dict[str, Any]]]:
    def per_round(store: str, role: str, n: int, key: str) -> list[float]:
        return [c[key] for c in runs.get((store, role, n), [])]

    def ratios(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=False) if y]

    rows, peer = [], []
    for store in stores:
        for n in writers:
            f = runs[(store, "fenced", n)]
            raw = runs[(store, "raw", n)]
            steps = per_round(store, "fenced", n, "ops_per_s")
            commits = per_round(store, "fenced", n, "commits_per_s")
            raw_c = per_round(store, "raw", n, "commits_per_s")
            rows.append({
                "store": store, "writers": n,
                "steps_per_s": rnd(median(steps), 1),
                "commits_per_step": rnd(median([c["commits_per_op"] for c in f]), 2),
                "commits_per_s": rnd(median(commits), 1),
                "raw_commits_per_s": rnd(median(raw_c), 1),
                "ratio_to_raw": rnd(median(ratios(commits, raw_c))),
                "round_ratios_to_raw": [rnd(x) for x in ratios(commits, raw_c)],
                "scaling": rnd(median(ratios(steps, per_round(store, "fenced", 1, "ops_per_s")))),
                "raw_scaling": rnd(median(ratios(raw_c, per_round(store, "raw", 1,
                                                                  "commits_per_s")))),
                "p50_ms": rnd(median([c["p50_ms"] for c in f]), 2),
                "p99_ms": rnd(median([c["p99_ms"] for c in f]), 2),
                # a writer's mean time a step: writers / steps/s
                "wall_ms_per_step": rnd(n * 1e3 / median(steps), 2) if median(steps) else None,
                "cpus_busy": rnd(median([c["cpus_busy"] for c in f]), 2),
                "own_cpus": rnd(median([c["own_cpus"] for c in f]), 2),
                "client_cpu_ms_per_step": rnd(median([c["client_cpu_ms_per_op"] for c in f])),
                "server_cpu_ms_per_step": rnd(median([c["server_cpu_ms_per_op"] for c in f])),
                "own_cpu_ms_per_step": rnd(median([c["own_cpu_ms_per_op"] for c in f])),
                "lock_wait_ms_per_step": rnd(median([c["lock_wait_ms_per_op"] for c in f
                                                     if "lock_wait_ms_per_op" in c])),
                "lock_held_ms_per_step": rnd(median([c["lock_held_ms_per_op"] for c in f
                                                     if "lock_held_ms_per_op" in c])),
                "raw_p50_ms": rnd(median([c["p50_ms"] for c in raw])),
                "raw_cpus_busy": rnd(median([c["cpus_busy"] for c in raw]), 2),
                "raw_own_cpus": rnd(median([c["own_cpus"] for c in raw]), 2),
                "raw_client_cpu_ms_per_commit": rnd(median([c["client_cpu_ms_per_op"]
                                                            for c in raw])),
                "raw_server_cpu_ms_per_commit": rnd(median([c["server_cpu_ms_per_op"]
                                                            for c in raw])),
                "per_writer_steps": sorted(f, key=lambda c: c["ops_per_s"])[len(f) // 2]
                ["per_writer_ops"],
            })
            if store == "postgres" and with_peer:
                pr = runs[(store, "peer", n)]
                puts = per_round(store, "peer", n, "ops_per_s")
                peer.append({
                    "writers": n, "puts_per_s": rnd(median(puts), 1),
                    "scaling": rnd(median(ratios(puts, per_round(store, "peer", 1,
                                                                 "ops_per_s")))),
                    "puts_to_raw_commits": rnd(median(ratios(puts, raw_c))),
                    "steps_to_puts": rnd(median(ratios(steps, puts))),
                    "p50_ms": rnd(median([c["p50_ms"] for c in pr]), 2),
                    "cpus_busy": rnd(median([c["cpus_busy"] for c in pr]), 2),
                    "own_cpus": rnd(median([c["own_cpus"] for c in pr]), 2),
                    "client_cpu_ms_per_put": rnd(median([c["client_cpu_ms_per_op"]
                                                         for c in pr])),
                    "server_cpu_ms_per_put": rnd(median([c["server_cpu_ms_per_op"]
                                                         for c in pr])),
                })
    return {"rows": rows, "peer": peer}


def targets(rows: list[dict[str, Any]], stores: list[str]) -> list[dict[str, Any]]:
    by = {(r["store"], r["writers"]): r for r in rows}
    out: list[dict[str, Any]] = []
    if "postgres" in stores:
        t: dict[str, Any] = {"target": f"PostgreSQL, {TARGET_SCALING_AT} writers: >="
                             f" {TARGET_SCALING:g}x its own single-writer steps/s",
                             "goal": TARGET_SCALING, "value": None, "pass": None, "ceiling": None}
        r16, r1 = by.get(("postgres", TARGET_SCALING_AT)), by.get(("postgres", 1))
        if r16 and r1 and r16["scaling"] is not None:
            t["value"] = r16["scaling"]
            t["pass"] = r16["scaling"] >= TARGET_SCALING
            cpus = os.cpu_count() or 1
            t["ceiling"] = {
                "raw_scaling": r16["raw_scaling"],
                "cpus_busy_1": r1["cpus_busy"], "cpus_busy_n": r16["cpus_busy"],
                "own_cpus_1": r1["own_cpus"], "own_cpus_n": r16["own_cpus"],
                # every CPU on this benchmark's processes (writers and server), each step
                # costing what it costs one writer: the most N writers can reach
                "cpu_bound_scaling": rnd(cpus / r1["own_cpus"]) if r1["own_cpus"] else None,
                "cpu_ms_per_step_1": r1["own_cpu_ms_per_step"],
                "cpu_ms_per_step_n": r16["own_cpu_ms_per_step"],
                # the chain lock serializes every write transaction: held h ms a step, no
                # number of writers passes 1000/h steps/s
                "lock_held_ms_per_step_1": r1["lock_held_ms_per_step"],
                "lock_held_ms_per_step_n": r16["lock_held_ms_per_step"],
                "lock_wait_ms_per_step_n": r16["lock_wait_ms_per_step"],
                "lock_bound_scaling": rnd(1e3 / r1["lock_held_ms_per_step"] / r1["steps_per_s"])
                if r1["lock_held_ms_per_step"] and r1["steps_per_s"] else None,
            }
        else:
            t["note"] = f"not measured (--writers needs 1 and {TARGET_SCALING_AT})"
        out.append(t)
    for store in stores:
        t = {"target": f"{store}, 1 writer: >= {TARGET_RAW:g}x its raw loop (commits/s)",
             "goal": TARGET_RAW, "value": None, "pass": None, "ceiling": None}
        r1 = by.get((store, 1))
        if r1 and r1["ratio_to_raw"] is not None:
            t["value"] = r1["ratio_to_raw"]
            t["pass"] = r1["ratio_to_raw"] >= TARGET_RAW
            per_commit = 1e3 / r1["commits_per_s"] if r1["commits_per_s"] else None
            raw_commit = 1e3 / r1["raw_commits_per_s"] if r1["raw_commits_per_s"] else None
            t["ceiling"] = {
                "ms_per_commit": rnd(per_commit), "raw_ms_per_commit": rnd(raw_commit),
                "client_cpu_ms_per_commit": rnd(r1["client_cpu_ms_per_step"]
                                                / r1["commits_per_step"])
                if r1["commits_per_step"] else None,
                "raw_client_cpu_ms_per_commit": r1["raw_client_cpu_ms_per_commit"],
                "server_cpu_ms_per_commit": rnd(r1["server_cpu_ms_per_step"]
                                                / r1["commits_per_step"])
                if r1["commits_per_step"] and r1["server_cpu_ms_per_step"] is not None else None,
                "raw_server_cpu_ms_per_commit": r1["raw_server_cpu_ms_per_commit"],
            }
        else:
            t["note"] = "not measured"
        out.append(t)
    return out


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(res: dict[str, Any]) -> None:
    p = print
    m = res["machine"]
    p(f"bench_stores ({res['mode']}): {res['rounds']} rounds of {res['seconds']:g} s"
      f" (+{res['warmup']:g} s warm-up), scratch on {res['fs']['path']} ({res['fs']['type']}),"
      f" {m['cpus']} CPUs; load before {m['load_before']}, after {m['load_after']},"
      f" 1-min load at the cases {m['load1_during']}")
    p("versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    if res["postgres"]:
        s = res["postgres"]["settings"]
        p(f"postgresql: {res['postgres']['url']}"
          f" ({'a throwaway pgserver' if res['postgres']['own_server'] else '--url'}): "
          + ", ".join(f"{k}={v}" for k, v in s.items() if k != "server_version"))
    p(f"commits per fenced step (on_op, {res['artifact_every']} consecutive steps): "
      + "; ".join(f"{k} {v}" for k, v in res["commits_per_step"].items())
      + "; raw payload (event bytes per commit): "
      + ", ".join(f"{k} {v} B" for k, v in res["raw_payload_bytes"].items()))
    for name, why in res["skipped"].items():
        p(f"SKIPPED {name}: {why}")
    for note in res["notes"]:
        p(f"note: {note}")
    p("")
    head = (f"{'store':<9}{'writers':>7}{'steps/s':>9}{'commits/s':>11}{'raw commits/s':>15}"
            f"{'to raw':>8}{'scaling':>9}{'raw scal.':>10}{'p50/p99 ms':>13}"
            f"{'cpus own/all':>14}{'cpu ms/step':>13}{'lock held/wait':>16}"
            f"{PEER + ' puts/s':>21}")
    p(head)
    p("-" * len(head))
    peer = {r["writers"]: r for r in res["peer"]}
    for r in res["rows"]:
        pr = peer.get(r["writers"]) if r["store"] == "postgres" else None
        puts = (f"{fmt(pr['puts_per_s'], ',.0f')} ({fmt(pr['scaling'], '.2f')}x)" if pr
                else "-")
        cpu = fmt(r["client_cpu_ms_per_step"], ".1f")
        if r["store"] == "postgres" and res["postgres"] and res["postgres"]["own_server"]:
            cpu += "+" + fmt(r["server_cpu_ms_per_step"], ".1f")
        p(f"{r['store']:<9}{r['writers']:>7}{fmt(r['steps_per_s'], ',.1f'):>9}"
          f"{fmt(r['commits_per_s'], ',.0f'):>11}{fmt(r['raw_commits_per_s'], ',.0f'):>15}"
          f"{fmt(r['ratio_to_raw'], '.2f') + 'x':>8}{fmt(r['scaling'], '.2f') + 'x':>9}"
          f"{fmt(r['raw_scaling'], '.2f') + 'x':>10}"
          f"{fmt(r['p50_ms'], '.1f') + '/' + fmt(r['p99_ms'], '.0f'):>13}"
          f"{fmt(r['own_cpus'], '.2f') + '/' + fmt(r['cpus_busy'], '.2f'):>14}{cpu:>13}"
          f"{fmt(r['lock_held_ms_per_step'], '.1f') + '/' + fmt(r['lock_wait_ms_per_step'], '.1f'):>16}"
          f"{puts:>21}")
    p("")
    p("to raw = steptrail commits/s / raw commits/s, same round; scaling = steps/s (raw:"
      " commits/s) vs 1 writer; cpus own/all = busy CPUs in the window: the writers' and the"
      " server's / the whole machine's (others' work included); cpu ms/step = the writers'"
      " (+ the server's); lock held/wait = ms a step the write lock (PostgreSQL: the chain"
      " lock) was held / locks were waited for, all writers' together")
    spp = res.get("statements_per_step", {})
    for r in res["rows"]:
        srv_cpu = (f", server CPU {fmt(r['server_cpu_ms_per_step'], '.2f')} ms"
                   if r["server_cpu_ms_per_step"] is not None else "")
        what = "statements (round trips)" if r["store"] == "postgres" else "statements"
        p(f"per fenced step, {r['store']} x{r['writers']}: wall {fmt(r['wall_ms_per_step'], '.1f')}"
          f" ms a writer, client CPU {fmt(r['client_cpu_ms_per_step'], '.2f')} ms{srv_cpu},"
          f" {fmt(spp.get(r['store']), 'g')} {what},"
          f" {fmt(r['commits_per_step'], 'g')} commits, write lock held"
          f" {fmt(r['lock_held_ms_per_step'], '.2f')} ms")
    for r in res["rows"]:
        if r["writers"] == 1:
            srv = (f" + server {fmt(r['raw_server_cpu_ms_per_commit'], '.3f')}"
                   if r["store"] == "postgres" and res["postgres"]
                   and res["postgres"]["own_server"] else "")
            p(f"raw {r['store']}, 1 process: p50 {fmt(r['raw_p50_ms'], '.3f')} ms a commit, CPU"
              f" {fmt(r['raw_client_cpu_ms_per_commit'], '.3f')} ms{srv} a commit")
    if res["peer"]:
        p(f"{PEER}.put, the same payload as a bytes channel value;"
          f" {fmt(res['peer_commits_per_put'], '.2f')} transactions a put (xids assigned):")
        for r in res["peer"]:
            p(f"  {r['writers']:>2} writers: {fmt(r['puts_per_s'], ',.0f')} puts/s"
              f" ({fmt(r['scaling'], '.2f')}x 1 writer, {fmt(r['puts_to_raw_commits'], '.2f')}x"
              f" raw commits/s), p50 {fmt(r['p50_ms'], '.2f')} ms, CPU"
              f" {fmt(r['client_cpu_ms_per_put'], '.2f')}"
              + (f"+{fmt(r['server_cpu_ms_per_put'], '.2f')}"
                 if r["server_cpu_ms_per_put"] is not None else "")
              + f" ms/put; steptrail steps/s / puts/s {fmt(r['steps_to_puts'], '.3f')}")
    p("")
    for t in res["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        val = f"{t['value']:.2f}x" if t["value"] is not None else t.get("note", "")
        p(f"{verdict:<5} {t['target']}: {val}")
        c = t["ceiling"]
        if t["pass"] is False and c:
            if "raw_scaling" in c:
                p(f"      ceiling: the raw psycopg loop scales {fmt(c['raw_scaling'], '.2f')}x"
                  f" at {TARGET_SCALING_AT} processes vs 1. This benchmark's processes kept"
                  f" {fmt(c['own_cpus_1'], '.2f')} CPUs busy with 1 writer and"
                  f" {fmt(c['own_cpus_n'], '.2f')} with {TARGET_SCALING_AT} (the machine:"
                  f" {fmt(c['cpus_busy_1'], '.2f')} and {fmt(c['cpus_busy_n'], '.2f')});"
                  f" a step cost {fmt(c['cpu_ms_per_step_1'], '.1f')} CPU ms with 1 writer,"
                  f" {fmt(c['cpu_ms_per_step_n'], '.1f')} with {TARGET_SCALING_AT}: at one"
                  f" writer's cost a step, all {res['machine']['cpus']} CPUs allow at most"
                  f" {fmt(c['cpu_bound_scaling'], '.2f')}x.")
                if c.get("lock_bound_scaling") is not None:
                    p(f"      The chain lock (every appending transaction holds it to COMMIT)"
                      f" was held {fmt(c['lock_held_ms_per_step_1'], '.2f')} ms a step with 1"
                      f" writer, {fmt(c['lock_held_ms_per_step_n'], '.2f')} with"
                      f" {TARGET_SCALING_AT} (who waited {fmt(c['lock_wait_ms_per_step_n'], '.1f')}"
                      f" ms a step for it): at one writer's hold time, at most"
                      f" {fmt(c['lock_bound_scaling'], '.2f')}x")
            else:
                srv = (f", the server's {fmt(c['server_cpu_ms_per_commit'], '.3f')} against"
                       f" {fmt(c['raw_server_cpu_ms_per_commit'], '.3f')}"
                       if c.get("server_cpu_ms_per_commit") else "")
                p(f"      ceiling: a commit takes {fmt(c['ms_per_commit'], '.2f')} ms in a fenced"
                  f" step against {fmt(c['raw_ms_per_commit'], '.2f')} ms raw; the writer's"
                  f" CPU {fmt(c['client_cpu_ms_per_commit'], '.3f')} ms a commit against raw's"
                  f" {fmt(c['raw_client_cpu_ms_per_commit'], '.3f')}{srv}")


def profile(args: argparse.Namespace) -> None:
    """One writer in this process per store: `--profile-steps` fenced steps timed bare
    (steps/s, and the write lock's hold time through `lock_meter`), then as many under
    cProfile (wall clock, no meter), whose top 15 cumulative entries are printed with the
    step's calls' share of it and, on PostgreSQL, the statements sent."""
    import cProfile
    import io
    import pstats

    Ledger, fenced_step, content, artifact = _library()
    bench = Bench(args, QUICK)
    server = None
    n = args.profile_steps
    try:
        if "postgres" in args.stores:
            if args.url:
                bench.url = args.url
            else:
                server = start_server(args.dir, bench.notes)
                bench.url = server.create_database("bench")
        for store in args.stores:
            with bench.place(store) as (root, url):
                where = bench._ledger_with_workspaces(root, url, 1)
                ops: list[str] = []
                with Ledger.open(where, on_op=ops.append) as led:
                    epoch = led.workspaces.acquire("w0", "profile", ttl_s=3600).epoch

                    def steps(prefix: str, count: int) -> float:
                        t0 = time.perf_counter()
                        for k in range(count):
                            art = args.artifact_every > 0 and k % args.artifact_every == 0
                            fenced_step(led, "w0", epoch, f"{prefix}{k}", content(0, k),
                                        artifact(0, k) if art else None, run="run-0")
                        return time.perf_counter() - t0

                    steps("warm", 10)
                    ops.clear()
                    meter = lock_meter(led)
                    m0 = meter() if meter else (0.0, 0.0)
                    bare = steps("b", n)
                    held = (meter()[1] - m0[1]) if meter else None
                    commits = ops.count("commit") / n
                    if meter is not None and store == "postgres":  # take the timing wrapper off
                        with contextlib.suppress(Exception):
                            del led.storage._connect().execute
                    prof = cProfile.Profile(time.perf_counter)
                    prof.enable()
                    profiled = steps("p", n)
                    prof.disable()
                buf = io.StringIO()
                st = pstats.Stats(prof, stream=buf)
                st.sort_stats("cumulative").print_stats(15)
                print(f"== {store}: {n} fenced steps, one writer in-process: {n / bare:.1f} steps/s"
                      f" ({n / profiled:.1f} under cProfile), {commits:.2f} commits/step,"
                      + (f" the write lock held {held / n * 1e3:.2f} ms a step ({held / bare:.0%}"
                         f" of the wall time)," if held is not None else "")
                      + f" load {os.getloadavg()[0]:.2f}")
                calls: dict[str, float] = {}
                statements = 0
                for (filename, _line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
                    name = filename.replace(os.sep, "/")
                    if name.endswith("ledger/ledger.py") and func in (
                            "snapshot", "admit", "apply", "store", "publish", "ack"):
                        calls[func] = calls.get(func, 0.0) + ct
                    elif "/psycopg/" in name and name.endswith("/cursor.py") and func in (
                            "execute", "executemany"):
                        statements += nc
                print("   per step, ms (wall, under cProfile): " + ", ".join(
                    f"{f} {calls[f] / n * 1e3:.2f}" for f in
                    ("snapshot", "admit", "apply", "store", "publish", "ack") if f in calls)
                    + (f"; {statements / n:.1f} psycopg execute + executemany calls a step"
                       f" ({statements / n / commits:.1f} a commit)" if statements else ""))
                print("\n".join(line for line in buf.getvalue().splitlines() if line.strip()))
                print()
    finally:
        bench.close()
        if server is not None:
            server.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round of 0.8 s per case (< 60 s)")
    ap.add_argument("--json", action="store_true", help="results as JSON on stdout")
    ap.add_argument("--stores", default="sqlite,postgres", help="default sqlite,postgres")
    ap.add_argument("--writers", default="1,4,16", help="writer processes (default 1,4,16;"
                    " 1 is always measured: the baseline)")
    ap.add_argument("--url", default=None, help="a postgresql:// database to run in (a fresh"
                    " schema per case, dropped after) instead of a throwaway server")
    ap.add_argument("--dir", default=None, help="scratch parent, the throwaway server's too"
                    " (default: the temporary directory)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="measured window per case (default 3; --quick: 0.8)")
    ap.add_argument("--warmup", type=float, default=None, help="default 0.5 (--quick: 0.2)")
    ap.add_argument("--artifact-every", type=int, default=5,
                    help="an inline artifact every N steps (as bench_contention; 0: never)")
    ap.add_argument("--profile", action="store_true", help="instead: one writer in-process"
                    " under cProfile per store, the top 15 cumulative entries")
    ap.add_argument("--profile-steps", type=int, default=300)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--role", default="fenced", help=argparse.SUPPRESS)
    ap.add_argument("--store", default="sqlite", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--payload", type=int, default=300, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    bad = [s for s in args.stores if s not in STORES]
    if bad or not args.stores:
        ap.error(f"--stores: {', '.join(bad) or 'none'} (choose from {', '.join(STORES)})")
    args.writers = sorted({int(w) for w in args.writers.split(",")} | {1})
    if "postgres" in args.stores and not args.url:
        from ledger.testing.pgserver import INSTALL_HINT, find_bindir
        if find_bindir() is None:
            print(f"bench_stores: {INSTALL_HINT}; or pass --url, or --stores sqlite",
                  file=sys.stderr)
            return 2
    if args.profile:
        profile(args)
        return 0
    res = run(args)
    if args.json:
        json.dump(res, sys.stdout, indent=2, default=str)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

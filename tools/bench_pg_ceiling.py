#!/usr/bin/env python3
"""Where a fenced step's time goes on PostgreSQL: the ledger's step beside a raw psycopg
replay of the very statements it sends, the same work in 4 round trips, the bare driver
loop and LangGraph's PostgresSaver.put, each per step: wall, client CPU, server CPU,
statements and round trips.

    .venv/bin/python tools/bench_pg_ceiling.py                 # a throwaway server (< 60 s)
    .venv/bin/python tools/bench_pg_ceiling.py --steps 400 --json
    .venv/bin/python tools/bench_pg_ceiling.py --url postgresql://u@host/postgres  # no server CPU

What runs (one writer, in this process, one case at a time, each on its own database
cloned from one template, so every case starts from the same rows)
----------------------------------------------------------------------------------------
* **ledger run_fenced_step**: `ledger.run_fenced_step`, one write and a 4 KiB inline
  artifact (tools/count_statements.py's step: its 59 statements).
* **ledger bench step**: `bench_contention.fenced_step`, the step tools/bench_stores.py
  times (snapshot, admit, apply, publish, ack; an inline artifact every 5th step).
* **ledger run_step**: `ledger.runner.run_step` with one `--payload`-byte artifact.
* **replay, same statements**: the statements (text and parameters, as sent) the
  run_fenced_step case sent, recorded through psycopg's `Cursor.execute` on a clone of
  the same template and replayed on a fresh clone by bare psycopg: one call each (one
  round trip each), every result fetched. The ledger's Python is gone; the statements,
  the transactions, the rows and the round trips are the same.
* **replay, 4 round trips**: the same rows written, one statement per kind of work:
  the snapshot's reads as one SELECT; per write transaction BEGIN, one SELECT taking its
  locks (the SET LOCALs as set_config), one SELECT of every read it made, one statement
  of every write it made (data-modifying CTEs, the recorded parameters: same rows, same
  sizes) and COMMIT; sent in pipeline mode with a sync where a real client needs an
  answer before going on: [snapshot] [BEGIN, locks, reads] [writes, COMMIT, BEGIN, locks,
  reads] [writes, COMMIT] — the shape a 12-statement, 4-round-trip fenced step takes.
  SAVEPOINTs and the builder's `SELECT 1` liveness pulses are dropped.
* **bare loop**: bench_stores' raw psycopg loop: ``BEGIN; INSERT one row of event-sized
  bytes; COMMIT``, per commit and times the run_fenced_step's write commits per step.
* **PostgresSaver.put**: a checkpoint carrying one `--payload`-byte channel value.
* **sqlite run_fenced_step / bench step**: the same steps on SQLite (client CPU only).

Measured per case, over `--steps` operations after `--warm` untimed ones: wall time
(perf_counter), client CPU (this process, `time.process_time`), server CPU (utime +
stime from /proc/PID/stat: the case's own backends, found by their database in the
process title, and every server process — backends, WAL writer, checkpointer — for a
throwaway server), statements (driver calls; a multi-statement string is one) and round
trips (each call outside pipeline mode; each sync inside it), and for the ledger on
PostgreSQL the chain lock's hold time (bench_stores' `lock_meter`).

Single writer, this machine; the figures are per step, not a throughput claim under
concurrency (docs/scaling.md "What 16 cores would give" builds that from them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import bench_stores as bs

ART_EVERY = 5
TEMPLATE = "ceil_template"


# -- recording what the driver is asked to send -------------------------------------------


class Recorder:
    """Every `Cursor.execute` (and each statement of an `executemany`) while `on`, as
    (connection index, query text, parameters), appended to `calls`."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, Any]] = []
        self.conns: dict[int, int] = {}
        self.on = False

    @contextlib.contextmanager
    def patched(self) -> Iterator[Recorder]:
        import psycopg

        real_execute, real_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
        rec = self

        def text(cur: Any, query: Any) -> str:
            return query if isinstance(query, str) else query.as_string(cur)

        def note(cur: Any, query: Any, params: Any) -> None:
            if rec.on:
                idx = rec.conns.setdefault(id(cur.connection), len(rec.conns))
                if isinstance(params, list):
                    params = tuple(params)
                rec.calls.append((idx, text(cur, query), params))

        def execute(self: Any, query: Any, params: Any = None, *a: Any, **k: Any) -> Any:
            note(self, query, params)
            return real_execute(self, query, params, *a, **k)

        def executemany(self: Any, query: Any, params_seq: Any, *a: Any, **k: Any) -> Any:
            params_seq = list(params_seq)
            for params in params_seq:
                note(self, query, params)
            return real_many(self, query, params_seq, *a, **k)

        psycopg.Cursor.execute, psycopg.Cursor.executemany = execute, executemany  # type: ignore[method-assign]
        try:
            yield self
        finally:
            psycopg.Cursor.execute, psycopg.Cursor.executemany = real_execute, real_many  # type: ignore[method-assign]

    def take(self) -> list[tuple[int, str, Any]]:
        out, self.calls = self.calls, []
        return out


# -- the compact form: the same rows in one statement per kind of work, 4 round trips -------


_SET = re.compile(r"SET\s+(LOCAL\s+)?(\w+)\s*=\s*(\S+)$", re.IGNORECASE)


def _units(sql: str, params: Any) -> list[tuple[str, Any]]:
    """One call's statements: a multi-statement string (never with parameters) split."""
    if params:
        return [(sql.strip().rstrip(";"), params)]
    return [(s.strip(), None) for s in sql.split(";") if s.strip()]


def _commits(query: Any) -> bool:
    """Whether a call ends in a COMMIT: alone, or after the writes a transaction held
    (`PgStore._defer`: one message)."""
    return isinstance(query, str) and (query == "COMMIT" or query.endswith(";\nCOMMIT"))


def _kind(sql: str) -> str:
    head = sql.lstrip().split(None, 1)[0].upper()
    if head == "BEGIN":
        return "begin"
    if head in ("COMMIT", "ROLLBACK"):
        return "commit"
    if head in ("SAVEPOINT", "RELEASE"):
        return "drop"
    if head == "SET":
        return "set"
    if head in ("INSERT", "UPDATE", "DELETE"):
        return "write"
    if head == "SELECT" and "advisory" in sql:
        return "lock"
    if sql.strip() == "SELECT 1":  # a builder's liveness pulse
        return "drop"
    return "read"


def _params(ps: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for p in ps:
        if p is None:
            continue
        if isinstance(p, dict):
            raise TypeError("named parameters: not merged by this tool")
        out.extend(p)
    return tuple(out)


def _merged_reads(reads: list[tuple[str, Any]]) -> tuple[str, tuple[Any, ...]] | None:
    if not reads:
        return None
    cols = ", ".join(f"(SELECT array_agg(r{i}) FROM ({q}) r{i})" for i, (q, _) in enumerate(reads))
    return f"SELECT {cols}", _params([p for _, p in reads])


def _merged_writes(writes: list[tuple[str, Any]]) -> tuple[str, tuple[Any, ...]] | None:
    if not writes:
        return None
    ctes = ", ".join(f"w{i} AS ({q})" for i, (q, _) in enumerate(writes))
    return f"WITH {ctes} SELECT 1", _params([p for _, p in writes])


def _lock_statement(sets: list[str], locks: list[tuple[str, Any]]) -> tuple[str, tuple[Any, ...]]:
    exprs = []
    for s in sets:
        m = _SET.match(s)
        if m is None:
            raise ValueError(f"not a SET: {s}")
        exprs.append(f"set_config('{m.group(2)}', '{m.group(3).strip(chr(39))}', {'true' if m.group(1) else 'false'})")
    for q, _ in locks:
        exprs.append(re.sub(r"^\s*SELECT\s+", "", q, flags=re.IGNORECASE))
    return "SELECT " + ", ".join(exprs), _params([p for _, p in locks])


def compact(calls: list[tuple[int, str, Any]]) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """One step's calls as round trips (each a list of statements sent before one sync):
    [snapshot reads] then, per write transaction, [BEGIN, locks, reads] and its writes and
    COMMIT opening the next round trip. Read-only transactions' reads join the next
    round trip's reads."""
    units = [(kind, q, p) for _c, sql, params in calls for q, p in _units(sql, params)
             for kind in [_kind(q)]]
    # split into transactions: ("auto", [units]) outside BEGIN..COMMIT, ("tx", [units]) inside
    txs: list[list[tuple[str, str, Any]]] = []
    cur: list[tuple[str, str, Any]] | None = None
    for u in units:
        if u[0] == "begin":
            cur = [u]
            continue
        if cur is None:
            txs.append([u])  # an autocommit statement
            continue
        cur.append(u)
        if u[0] == "commit":
            txs.append(cur)
            cur = None
    if cur is not None:
        raise ValueError("a transaction left open at the end of a step")
    rts: list[list[tuple[str, tuple[Any, ...]]]] = []
    tail: list[tuple[str, tuple[Any, ...]]] = []  # the last write transaction's writes+COMMIT
    reads: list[tuple[str, Any]] = []
    for tx in txs:
        writes = [(q, p) for k, q, p in tx if k == "write"]
        reads += [(q, p) for k, q, p in tx if k == "read"]
        if not writes:
            continue
        head: list[tuple[str, tuple[Any, ...]]] = []
        if not rts and not tail and reads:
            # the snapshot: its own round trip before the first write transaction
            rts.append([_merged_reads(reads)])  # type: ignore[list-item]
            reads = [(q, p) for k, q, p in tx if k == "read"]
        head.append(("BEGIN ISOLATION LEVEL READ COMMITTED", ()))
        head.append(_lock_statement([q for k, q, _ in tx if k == "set"],
                                    [(q, p) for k, q, p in tx if k == "lock"]))
        r = _merged_reads(reads)
        if r is not None:
            head.append(r)
        reads = []
        rts.append(tail + head)
        tail = [_merged_writes(writes), ("COMMIT", ())]  # type: ignore[list-item]
    if reads:
        r = _merged_reads(reads)
        tail.append(r)  # type: ignore[arg-type]
    if tail:
        rts.append(tail)
    return rts


# -- measuring ---------------------------------------------------------------------------


@contextlib.contextmanager
def fsyncs(acc: list[float]) -> Iterator[None]:
    """Count and time this process's `os.fsync`/`os.fdatasync` calls (the workspace's
    file and directory fsyncs; SQLite's own happen inside its C code, unseen) into
    ``acc = [count, seconds]``."""
    real = os.fsync, os.fdatasync

    def wrap(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        def timed(fd: Any) -> None:
            t0 = time.perf_counter()
            try:
                fn(fd)
            finally:
                acc[0] += 1
                acc[1] += time.perf_counter() - t0
        return timed

    os.fsync, os.fdatasync = wrap(real[0]), wrap(real[1])
    try:
        yield
    finally:
        os.fsync, os.fdatasync = real


class Meter:
    """Wall, client CPU and server CPU (the case's backends: processes whose title names
    its database; and every server process) between `start` and `stop`."""

    def __init__(self, postmaster: int | None) -> None:
        self.postmaster = postmaster

    def _backends(self, dbname: str) -> set[int]:
        out = set()
        for pid in bs._server_pids(self.postmaster):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f" {dbname} " in title:
                out.add(pid)
        return out

    @contextlib.contextmanager
    def measure(self, dbname: str | None, out: dict[str, float]) -> Iterator[None]:
        pids0 = set(bs._server_pids(self.postmaster))
        back0 = self._backends(dbname) if dbname else set()
        s0 = bs._proc_cpu(sorted(pids0))
        c0, w0 = time.process_time(), time.perf_counter()
        yield
        w1, c1 = time.perf_counter(), time.process_time()
        pids1 = set(bs._server_pids(self.postmaster))
        back1 = self._backends(dbname) if dbname else set()
        s1 = bs._proc_cpu(sorted(pids0 | pids1))
        out["wall_s"] = w1 - w0
        out["client_cpu_s"] = c1 - c0
        if self.postmaster is not None:
            # a process that started in the window counts from 0
            out["server_cpu_s"] = sum(s1[p] - s0.get(p, 0.0) for p in s1)
            out["backend_cpu_s"] = sum(s1[p] - s0.get(p, 0.0) for p in s1 if p in back0 | back1)


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric field's median over rounds (the rest from the first round), and the
    wall times of every round."""
    out = dict(rounds[0])
    for k, v in rounds[0].items():
        if isinstance(v, float | int) and not isinstance(v, bool):
            vals = [r[k] for r in rounds if r.get(k) is not None]
            out[k] = round(statistics.median(vals), 3) if vals else None
    out["round_wall_ms"] = [r["wall_ms"] for r in rounds]
    return out


def per_op(m: dict[str, float], n: int, statements: float | None, round_trips: float | None,
           **extra: Any) -> dict[str, Any]:
    def ms(key: str) -> float | None:
        return round(m[key] / n * 1e3, 3) if key in m else None

    return {"ops": n, "wall_ms": ms("wall_s"), "client_cpu_ms": ms("client_cpu_s"),
            "server_cpu_ms": ms("server_cpu_s"), "backend_cpu_ms": ms("backend_cpu_s"),
            "statements": None if statements is None else round(statements, 1),
            "round_trips": None if round_trips is None else round(round_trips, 1),
            "per_s": round(n / m["wall_s"], 1) if m.get("wall_s") else None, **extra}


# -- the cases ---------------------------------------------------------------------------


def fenced(kind: str) -> Callable[[Any, str, int, int], None]:
    """One step of `kind` ("run_fenced_step" or "bench") on workspace w0 under `epoch`."""
    import bench_contention as bc

    from ledger import run_fenced_step

    if kind == "bench":
        def step(led: Any, ws: str, epoch: int, k: int) -> None:
            art = k % ART_EVERY == 0
            bc.fenced_step(led, ws, epoch, f"b{k:06d}", bc.content(0, k),
                           bc.artifact(0, k) if art else None, run="run-0")
        return step

    def step(led: Any, ws: str, epoch: int, k: int) -> None:
        out = run_fenced_step(
            led, ws, f"f{k:06d}", lambda read: [read.read(bs.FILE).write(b"v%d\n" % k)],
            epoch=epoch, artifacts={"out/log.txt": b"log %d\n" % k + b"x" * 4000})
        assert out.status == "applied", out
    return step


class Ceiling:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch = tempfile.mkdtemp(prefix="bench-pg-ceiling-", dir=args.dir)
        self.server: Any = None
        self.admin_url: str | None = None
        self.meter = Meter(None)
        self.notes: list[str] = []
        self.payload = secrets.token_bytes(args.payload)
        self._dbs: list[str] = []

    # -- databases

    def url(self, db: str) -> str:
        if self.server is not None:
            return self.server.url(db)
        assert self.admin_url is not None
        parts = bs.urlsplit(self.admin_url)
        return bs.urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, ""))

    def create(self, db: str, template: str | None = None) -> str:
        with bs.pg_connect(self.url("postgres")) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {db} TEMPLATE {template or 'template0'}")
        self._dbs.append(db)
        return self.url(db)

    def drop(self, db: str) -> None:
        with bs.pg_connect(self.url("postgres")) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        self._dbs.remove(db)

    def drop_all(self) -> None:
        with contextlib.suppress(Exception), bs.pg_connect(self.url("postgres")) as c:
            for db in reversed(self._dbs):
                c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    # -- the template: a ledger with workspace w0 under a lease, warmed

    def make_template(self) -> tuple[int, str, bytes]:
        from ledger import Ledger
        from ledger.runner import run_step

        url = self.create(TEMPLATE)
        d = os.path.join(self.scratch, "ws")
        os.makedirs(d)
        with open(os.path.join(d, bs.FILE), "wb") as f:
            f.write(b"initial\n")
        with Ledger.init(url) as led:
            led.workspaces.add("w0", d)
            epoch = led.workspaces.acquire("w0", "ceiling", ttl_s=36000).epoch
            for kind in ("run_fenced_step", "bench"):
                for k in range(5):
                    fenced(kind)(led, "w0", epoch, 900000 + k)
            for k in range(5):
                run_step(led, f"warm-r{k}", {"result.bin": self.payload})
        with open(os.path.join(d, bs.FILE), "rb") as f:
            return epoch, d, f.read()

    # -- one ledger pass on a clone: recorded or timed

    def ledger_pass(self, db: str, epoch: int, ws_dir: str, file_bytes: bytes,
                    recorder: Recorder | None) -> dict[str, Any]:
        """On a fresh clone: `--warm` then `--steps` run_fenced_steps, as many bench steps,
        as many run_steps. Recorded (every call, per op) when `recorder`, else timed."""
        from ledger import Ledger
        from ledger.runner import run_step

        with open(os.path.join(ws_dir, bs.FILE), "wb") as f:  # as the template left it
            f.write(file_bytes)
        url = self.create(db, TEMPLATE)
        a = self.args
        out: dict[str, Any] = {}
        if recorder is not None:
            recorder.on = True
        with Ledger.open(url) as led:
            if recorder is not None:
                out["open"] = recorder.take()
            meter = bs.lock_meter(led) if recorder is None else None
            commit_s = [0.0]
            if recorder is None:  # time every COMMIT the store's connection sends
                conn = led.storage._connect()
                inner = conn.execute

                def timed_commit(query: Any, *args: Any, **kw: Any) -> Any:
                    # a COMMIT alone, or ending the message of the writes it held
                    if not _commits(query):
                        return inner(query, *args, **kw)
                    t0 = time.perf_counter()
                    try:
                        return inner(query, *args, **kw)
                    finally:
                        commit_s[0] += time.perf_counter() - t0
                conn.execute = timed_commit
            for kind in ("run_fenced_step", "bench", "run_step"):
                def op(k: int, kind: str = kind) -> None:
                    if kind == "run_step":
                        run_step(led, f"r{k:06d}", {"result.bin": self.payload})
                    else:
                        fenced(kind)(led, "w0", epoch, k)
                for k in range(a.warm):
                    op(k)
                if recorder is not None:
                    out[f"{kind}:warm"] = recorder.take()
                    ops = []
                    for k in range(a.warm, a.warm + a.steps):
                        op(k)
                        ops.append(recorder.take())
                    out[kind] = ops
                    continue
                m: dict[str, float] = {}
                h0 = meter()[1] if meter else 0.0
                fs = [0.0, 0.0]
                c0 = commit_s[0]
                with self.meter.measure(db, m), fsyncs(fs):
                    for k in range(a.warm, a.warm + a.steps):
                        op(k)
                held = (meter()[1] - h0) / a.steps * 1e3 if meter else None
                out[kind] = (m, held, fs, commit_s[0] - c0)
        if recorder is not None:
            recorder.on = False
        return out

    # -- replays

    def replay(self, db: str, rec: dict[str, Any], mode: str) -> dict[str, Any]:
        """Replay the recorded run_fenced_step pass on a fresh clone: the open and the
        recorded warm-up untimed, then the steps, timed: `mode` "same" (each call as
        recorded) or "compact" (`compact`, pipeline mode)."""
        import psycopg

        url = self.create(db, TEMPLATE)
        conns: dict[int, Any] = {}

        def conn(i: int) -> Any:
            if i not in conns:
                conns[i] = psycopg.connect(url, autocommit=True)
            return conns[i]

        commit_s = [0.0]

        def same(calls: list[tuple[int, str, Any]]) -> None:
            for i, sql, params in calls:
                t0 = time.perf_counter()
                cur = conn(i).execute(sql, params)
                if _commits(sql):
                    commit_s[0] += time.perf_counter() - t0
                while True:
                    if cur.pgresult is not None and cur.pgresult.status == 2:  # TUPLES_OK
                        cur.fetchall()
                    if not cur.nextset():
                        break

        plans = None
        if mode == "compact":
            plans = [compact(calls) for calls in rec["run_fenced_step"]]
            used = {c for calls in rec["run_fenced_step"] for c, _, _ in calls}
            if len(used) != 1:
                raise RuntimeError("the steps used more than one connection: not compacted")
            step_conn = used.pop()

        def pipelined(rts: list[list[tuple[str, tuple[Any, ...]]]]) -> None:
            c = conn(step_conn)
            with c.pipeline() as p:
                for rt in rts:
                    curs = [c.execute(q, p_ or None) for q, p_ in rt]
                    p.sync()
                    for cur in curs:
                        if cur.pgresult is not None and cur.pgresult.status == 2:
                            cur.fetchall()

        try:
            same(rec["open"])
            same(rec["run_fenced_step:warm"])
            m: dict[str, float] = {}
            steps = rec["run_fenced_step"]
            commit_s[0] = 0.0
            with self.meter.measure(db, m):
                if plans is None:
                    for calls in steps:
                        same(calls)
                else:
                    for rts in plans:
                        pipelined(rts)
        finally:
            for c in conns.values():
                c.close()
        if plans is None:
            return per_op(m, len(steps), sum(map(len, steps)) / len(steps),
                          sum(map(len, steps)) / len(steps),
                          commit_ms=round(commit_s[0] / len(steps) * 1e3, 3))
        return per_op(m, len(steps), sum(len(rt) for p in plans for rt in p) / len(plans),
                      sum(map(len, plans)) / len(plans))

    def bare(self, db: str, commits_per_step: float, size: int) -> dict[str, Any]:
        """bench_stores' raw loop: BEGIN; INSERT one `size`-byte row; COMMIT."""
        url = self.create(db)
        conn = bs.pg_connect(url)
        try:
            conn.execute("CREATE TABLE t(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                         " key text NOT NULL UNIQUE, value bytea NOT NULL)")
            payload = secrets.token_bytes(size)
            sql = "INSERT INTO t(key, value) VALUES (%s, %s)"

            def commit(k: int) -> None:
                with conn.transaction():
                    conn.execute(sql, (str(k), payload))
            for k in range(self.args.warm):
                commit(-1 - k)
            n = max(1, round(self.args.steps * commits_per_step))
            m: dict[str, float] = {}
            with self.meter.measure(db, m):
                for k in range(n):
                    commit(k)
        finally:
            conn.close()
        one = per_op(m, n, 3, 3)  # BEGIN, INSERT, COMMIT: conn.transaction() sends each
        step = {k: (round(v * commits_per_step, 3) if isinstance(v, float) and k != "per_s"
                    else v) for k, v in one.items()}
        step.update(ops=self.args.steps, statements=round(3 * commits_per_step, 1),
                    round_trips=round(3 * commits_per_step, 1),
                    per_s=round(one["per_s"] / commits_per_step, 1))
        return {"per_commit": one, "per_step": step, "commits_per_step": commits_per_step,
                "row_bytes": size}

    def put(self, db: str) -> dict[str, Any]:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver

        url = self.create(db)
        config = {"configurable": {"thread_id": "w0", "checkpoint_ns": ""}}
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
        rec = Recorder()
        with PostgresSaver.from_conn_string(url) as saver:
            def put(k: int) -> None:
                cp = empty_checkpoint()
                cp["id"] = str(uuid.uuid4())
                cp["channel_values"] = {"result": self.payload}
                cp["channel_versions"] = {"result": k + 2}
                saver.put(config, cp, {"step": k}, {"result": k + 2})  # type: ignore[arg-type]
            for k in range(self.args.warm):
                put(k)
            with rec.patched():
                rec.on = True
                for k in range(10):
                    put(self.args.warm + k)
                rec.on = False
            statements = len(rec.calls) / 10
            m: dict[str, float] = {}
            with self.meter.measure(db, m):
                for k in range(self.args.steps):
                    put(self.args.warm + 10 + k)
        # a put runs in conn.transaction() (psycopg's own BEGIN/COMMIT, not executes)
        return per_op(m, self.args.steps, statements, statements + 2,
                      note="statements: executes; round trips: + the BEGIN and COMMIT"
                      " psycopg's transaction() sends")

    def sqlite(self, r: int) -> dict[str, Any]:
        from ledger import Ledger
        from ledger.runner import run_step

        root = os.path.join(self.scratch, f"sqlite-{r}")
        d = os.path.join(root, "ws")
        os.makedirs(d)
        with open(os.path.join(d, bs.FILE), "wb") as f:
            f.write(b"initial\n")
        out: dict[str, Any] = {}
        seen: list[str] = []
        with Ledger.init(os.path.join(root, "ledger.db")) as led:
            led.workspaces.add("w0", d)
            epoch = led.workspaces.acquire("w0", "ceiling", ttl_s=36000).epoch
            conn = led.storage.db.conn  # type: ignore[attr-defined]
            for kind in ("run_fenced_step", "bench", "run_step"):
                def op(k: int, kind: str = kind) -> None:
                    if kind == "run_step":
                        run_step(led, f"r{k:06d}", {"result.bin": self.payload})
                    else:
                        fenced(kind)(led, "w0", epoch, k)
                for k in range(self.args.warm):
                    op(k)
                seen.clear()
                conn.exec_trace = lambda _c, sql, _b: seen.append(sql) or True
                op(self.args.warm)
                conn.exec_trace = None
                statements = len(seen)
                m: dict[str, float] = {}
                fs = [0.0, 0.0]
                with self.meter.measure(None, m), fsyncs(fs):
                    for k in range(self.args.warm + 1, self.args.warm + 1 + self.args.steps):
                        op(k)
                out[kind] = per_op(m, self.args.steps, statements, None,
                                   client_fsyncs=round(fs[0] / self.args.steps, 2),
                                   client_fsync_ms=round(fs[1] / self.args.steps * 1e3, 3))
        shutil.rmtree(root, ignore_errors=True)
        return out

    # -- all of it

    def run(self) -> dict[str, Any]:
        a = self.args
        if a.url:
            self.admin_url = a.url
            self.notes.append("--url: the server's CPU is not measured")
        else:
            self.server = bs.start_server(a.dir, self.notes)
            self.meter = Meter(bs._postmaster(self.server))
        res: dict[str, Any] = {"tool": "bench_pg_ceiling", "steps": a.steps, "warm": a.warm,
                               "rounds": a.rounds,
                               "payload_bytes": a.payload, "cpus": os.cpu_count(),
                               "load_before": [round(x, 2) for x in os.getloadavg()],
                               "settings": bs.pg_settings(self.url("postgres")),
                               "notes": self.notes}
        t0 = time.monotonic()
        epoch, ws_dir, file_bytes = self.make_template()
        bs.log(f"template ready ({time.monotonic() - t0:.1f} s)")
        rec = Recorder()
        with rec.patched():
            recorded = self.ledger_pass("ceil_rec", epoch, ws_dir, file_bytes, rec)
        self.drop("ceil_rec")
        bs.log("recorded")

        def counted(kind: str) -> tuple[float, float]:
            ops = recorded[kind]
            return sum(map(len, ops)) / len(ops), sum(
                1 for calls in ops for _c, s, _p in calls
                for q, _ in _units(s, _p) if _kind(q) == "commit") / len(ops)

        write_commits = sum(
            1 for calls in recorded["run_fenced_step"]
            for tx in [compact(calls)] for rt in tx for q, _ in rt if q == "COMMIT"
        ) / len(recorded["run_fenced_step"])

        def ledger(r: int) -> dict[str, Any]:
            timed = self.ledger_pass(f"ceil_ledger_{r}", epoch, ws_dir, file_bytes, None)
            self.drop(f"ceil_ledger_{r}")
            out = {}
            for kind, name in (("run_fenced_step", "ledger run_fenced_step"),
                               ("bench", "ledger bench step"), ("run_step", "ledger run_step")):
                m, held, fs, commit_s = timed[kind]
                stmts, commits = counted(kind)
                out[name] = per_op(
                    m, a.steps, stmts, stmts, commits=round(commits, 2),
                    commit_ms=round(commit_s / a.steps * 1e3, 3),
                    chain_lock_held_ms=None if held is None else round(held, 3),
                    client_fsyncs=round(fs[0] / a.steps, 2),
                    client_fsync_ms=round(fs[1] / a.steps * 1e3, 3))
            return out

        def replay(r: int) -> dict[str, Any]:
            out = {"replay, same statements": self.replay(f"ceil_replay_{r}", recorded, "same")}
            self.drop(f"ceil_replay_{r}")
            return out

        def compacted(r: int) -> dict[str, Any]:
            out = {"replay, 4 round trips": self.replay(f"ceil_compact_{r}", recorded,
                                                        "compact")}
            self.drop(f"ceil_compact_{r}")
            return out

        def bare(r: int) -> dict[str, Any]:
            b = self.bare(f"ceil_bare_{r}", write_commits, a.row_bytes)
            self.drop(f"ceil_bare_{r}")
            return {"bare loop, a commit": b["per_commit"],
                    f"bare loop x {write_commits:g} commits": b["per_step"]}

        def put(r: int) -> dict[str, Any]:
            out = {"PostgresSaver.put": self.put(f"ceil_put_{r}")}
            self.drop(f"ceil_put_{r}")
            return out

        def sqlite(r: int) -> dict[str, Any]:
            sq = self.sqlite(r)
            return {"sqlite run_fenced_step": sq["run_fenced_step"],
                    "sqlite bench step": sq["bench"], "sqlite run_step": sq["run_step"]}

        try:
            import langgraph.checkpoint.postgres  # noqa: F401
            have_put = True
        except ImportError as exc:
            self.notes.append(f"PostgresSaver skipped: {exc}")
            have_put = False
        order = [ledger, replay, compacted, bare] + ([put] if have_put else []) + [sqlite]
        runs: list[dict[str, Any]] = []
        for r in range(a.rounds):
            got: dict[str, Any] = {}
            for fn in (order if r % 2 == 0 else list(reversed(order))):
                got.update(fn(r))
                bs.log(f"  round {r + 1}/{a.rounds} {fn.__name__} (load"
                       f" {os.getloadavg()[0]:.2f})")
            runs.append(got)
        names = list(dict.fromkeys(["ledger run_fenced_step", "ledger bench step",
                                    "ledger run_step", *runs[0]]))
        cases = {n: medians([g[n] for g in runs]) for n in names}
        res["cases"] = cases
        res["write_commits_per_fenced_step"] = write_commits
        res["goals"] = goals(cases)
        res["model"] = model(cases)
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
        return res

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        else:
            self.drop_all()
        shutil.rmtree(self.scratch, ignore_errors=True)


def goals(c: dict[str, Any]) -> list[dict[str, Any]]:
    f, r = c["ledger run_fenced_step"], c["ledger run_step"]
    out = [{"goal": "a fenced step in <= 12 statements and <= 4 round trips",
            "value": f"{f['statements']:g} statements, {f['round_trips']:g} round trips",
            "pass": f["statements"] <= 12 and f["round_trips"] <= 4}]
    p = c.get("PostgresSaver.put")
    if p:
        v = p["wall_ms"] / r["wall_ms"]
        out.append({"goal": "run_step on PostgreSQL >= 1.0x PostgresSaver.put",
                    "value": f"{v:.2f}x", "pass": v >= 1.0})
    for kind in ("run_fenced_step", "bench step"):
        s = c[f"sqlite {kind}"]
        v = c[f"ledger {kind}"]["per_s"] / s["per_s"]
        out.append({"goal": f"{kind}: steps/s on PostgreSQL >= 0.5x SQLite's",
                    "value": f"{v:.2f}x", "pass": v >= 0.5})
    return out


MODEL_CORES = 16
MODEL_WRITERS = (1, 4, 16)


def model(c: dict[str, Any], cores: int = MODEL_CORES) -> list[dict[str, Any]]:
    """Steps/s of N writers (each on its own workspace) from one writer's measured costs a
    step — wall w, client CPU c, server CPU s, chain lock hold h (ms):

        separate clients:  min(N * 1000/w, cores * 1000/s, 1000/h)
        one shared box:    min(N * 1000/w, cores * 1000/(c + s), 1000/h)

    N * 1000/w: a writer is sequential, so never faster than its own step (one writer a
    core); cores/s: the server's cores; cores/(c+s): the box's cores for both; 1000/h:
    the chain lock serializes every appending transaction (held to COMMIT, the WAL
    flush included). Costs stay at one writer's (no convoy on the lock, group commit
    keeps the flush inside h), N <= cores. Which term is smallest is the bound."""
    out = []
    for name in ("ledger run_fenced_step", "ledger bench step", "ledger run_step"):
        r = c.get(name)
        if not r or not r.get("server_cpu_ms") or not r.get("chain_lock_held_ms"):
            continue
        w, cc, sv, h = (r["wall_ms"], r["client_cpu_ms"], r["server_cpu_ms"],
                        r["chain_lock_held_ms"])
        for n in MODEL_WRITERS:
            for where, cpu in (("separate clients", sv), ("one shared box", cc + sv)):
                bounds = {"writers": n * 1e3 / w, "cpu": cores * 1e3 / cpu, "chain": 1e3 / h}
                bound = min(bounds, key=bounds.get)  # type: ignore[arg-type]
                out.append({"case": name, "writers": n, "where": where,
                            "steps_per_s": round(bounds[bound], 1), "bound": bound,
                            "bounds": {k: round(v, 1) for k, v in bounds.items()}})
    return out


def fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(res: dict[str, Any]) -> None:
    s = res["settings"]
    print(f"bench_pg_ceiling: {res['rounds']} rounds (medians) of {res['steps']} ops a case"
          f" after {res['warm']} warm-up, one"
          f" writer, {res['cpus']} CPUs, load {res['load_before']} -> {res['load_after']};"
          f" PostgreSQL {s['server_version'].split()[0]}, synchronous_commit="
          f"{s['synchronous_commit']}, fsync={s['fsync']}, unix socket")
    for n in res["notes"]:
        print(f"note: {n}")
    head = (f"{'per op':<34}{'wall ms':>9}{'client cpu':>11}{'server cpu':>11}"
            f"{'(backend)':>10}{'stmts':>7}{'RTs':>6}{'ops/s':>9}{'chain held':>11}"
            f"{'fsyncs (ms)':>13}{'COMMITs ms':>11}")
    print(head)
    print("-" * len(head))
    for name, r in res["cases"].items():
        print(f"{name:<34}{fmt(r['wall_ms']):>9}{fmt(r['client_cpu_ms']):>11}"
              f"{fmt(r['server_cpu_ms']):>11}{fmt(r['backend_cpu_ms']):>10}"
              f"{fmt(r['statements'], 'g'):>7}{fmt(r['round_trips'], 'g'):>6}"
              f"{fmt(r['per_s'], ',.1f'):>9}{fmt(r.get('chain_lock_held_ms')):>11}"
              + (f"{r['client_fsyncs']:>6g} ({r['client_fsync_ms']:.2f})"
                 if "client_fsyncs" in r else f"{'-':>13}")
              + f"{fmt(r.get('commit_ms')):>11}")
    print("\nms per op; client cpu = this process; server cpu = every server process"
          " (backend: the case's own connections); stmts = driver calls; RTs = round trips"
          " (a call, or a pipeline sync); chain held = the chain lock, taken to COMMIT;"
          " fsyncs = the writer's own os.fsync calls a step and their time (the workspace's"
          " file and directory; not SQLite's, inside its C code); COMMITs ms = the time a"
          " step's COMMIT statements took to return (the server's WAL flush, and the"
          " writes the transaction held for its COMMIT's message)")
    if res.get("model"):
        print(f"\nmodel, {MODEL_CORES} cores (see model()): steps/s = min(N*1000/wall,"
              f" cores*1000/server cpu [shared: /(client+server cpu)], 1000/chain held)")
        for m in res["model"]:
            b = m["bounds"]
            print(f"  {m['case']:<24} N={m['writers']:<3} {m['where']:<17}"
                  f" {m['steps_per_s']:>8,.1f}/s  bound: {m['bound']:<8}"
                  f" (writers {b['writers']:,.0f}, cpu {b['cpu']:,.0f}, chain {b['chain']:,.0f})")
    for g in res["goals"]:
        print(f"{'PASS' if g['pass'] else 'FAIL':<5} {g['goal']}: {g['value']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150, help="timed ops a case (default 150)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the cases' order reversed"
                    " every other round; figures are medians (default 3)")
    ap.add_argument("--warm", type=int, default=10, help="untimed ops first (default 10)")
    ap.add_argument("--payload", type=int, default=4096,
                    help="run_step's artifact and the put's channel value, bytes")
    ap.add_argument("--row-bytes", type=int, default=489, help="the bare loop's row"
                    " (bench_stores' measured event bytes a commit)")
    ap.add_argument("--url", help="an existing server's postgresql:// URL (a database the"
                    " role may CREATE DATABASE from); the server's CPU is then not measured")
    ap.add_argument("--dir", default=None, help="scratch parent")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.url:
        from ledger.testing.pgserver import INSTALL_HINT, find_bindir
        if find_bindir() is None:
            print(f"bench_pg_ceiling: {INSTALL_HINT}; or pass --url", file=sys.stderr)
            return 2
    c = Ceiling(args)
    try:
        res = c.run()
    finally:
        c.close()
    if args.json:
        json.dump(res, sys.stdout, indent=2, default=str)
        print()
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

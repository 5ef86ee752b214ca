#!/usr/bin/env python3
"""Many processes on one ledger: writers, readers and two lease contenders at once.

    .venv/bin/python tools/stress_processes.py                      # 8 writers x 1,000 steps
    .venv/bin/python tools/stress_processes.py --procs 4 --steps 50 --readers 1
    .venv/bin/python tools/stress_processes.py --shm --json         # scratch on /dev/shm

Every participant is a separate interpreter (``subprocess``, this file run with
``--child ROLE``) that opens its own `Ledger` (its own apsw connection, the library's
default busy timeout, ``synchronous=FULL``). Nobody starts before everyone has opened
the ledger; then, at one "go":

- **writers** (``--procs``): writer *i* owns workspace ``w<i>`` (its own directory and
  its own lease, heartbeated) and runs ``--steps`` full workspace steps on it — admit one
  small write of ``f.txt`` planned against the path's rev and on-disk hash, apply,
  store an inline artifact every ``--artifact-every`` steps, publish, ack — and records
  every step id whose ack returned. A ``LedgerBusy`` (or a raw apsw ``BusyError``) is a
  *leak*: it is counted and the same call is retried (every call is idempotent).
- **readers** (``--readers``): loop ``Ledger.open(path, readonly=True)``, ``steps()`` and
  ``ledger.gc.audit`` until the writers are done; they count reads and errors and check
  that the number of acked steps they see never goes down and that every audit is ok.
- **two contenders** (``--contenders``) fight over one extra workspace, ``contended``:
  each acquires (forcing it half the time when the other holds it, with a short or a
  long ttl), then runs steps under its epoch; whoever hears ``StaleEpoch`` lost, and
  then tries every mutation again with its dead epoch (heartbeat, admit, apply, store,
  publish, ack, compensate): each must be refused — with ``StaleEpoch`` — or be
  answered from the journal (a redelivery reports the past). Any that makes a new
  effect is a zombie effect.

Afterwards, from the file alone: every acked step is committed (nothing lost), no step
has more or fewer events than one run of the protocol makes and no journal key occurs
twice (nothing duplicated), ``verify()`` is ok (integrity, hash chain, dense seq,
projections equal a rebuild, I3/I4/I5), ``ledger.invariants.check`` finds no breach
(I5: no effect under a dead epoch), ``rebuild()`` changes no step and no workspace,
``audit`` is ok, every workspace file holds what the ledger says, and the number of
busy leaks is 0. Exit status 0 when every check holds, 1 otherwise.

Scratch: ``--dir DIR`` (default: the system temp dir, /tmp — on this machine the real
ext4 disk), or ``--shm`` for /dev/shm (tmpfs: fsync is nearly free there). The
scratch directory is removed unless ``--keep`` or a check failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import apsw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: fsinfo
from fsinfo import mount_of  # noqa: E402
from ledger import Ledger, StepPlan, Write
from ledger.store.sqlite.database import BUSY_TIMEOUT_MS
from ledger.errors import (
    LeaseHeld,
    LedgerBusy,
    LedgerError,
    ProtocolRefused,
    StaleEpoch,
    Unsettled,
)

T = TypeVar("T")

LEDGER = "ledger.db"
FILE = "f.txt"  # the one file every writer step rewrites
CONTENDED = "contended"
CONTENDED_FILE = "c.txt"
CONTENDERS = ("cA", "cB")
RETRIES = 50  # a leaked LedgerBusy is retried this many times before the writer gives up
HEARTBEAT_EVERY = 100
READY_TIMEOUT_S = 120.0
TIMED_OUT = -1000  # the exit code recorded for a child killed at the deadline


# -- what every process agrees on ---------------------------------------------------------


def writer_ws(i: int) -> str:
    return f"w{i}"


def writer_step(i: int, k: int) -> str:
    return f"p{i}-s{k:05d}"


def writer_content(i: int, k: int) -> bytes:
    return (f"writer {i} step {k}\n" * 8).encode()


def artifact_content(i: int, k: int) -> bytes:
    return f"log of writer {i} step {k}: ok\n".encode() * 4


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- the child processes ------------------------------------------------------------------


class Child:
    """What every child shares: the scratch layout, the start barrier, the result file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.root = args.root
        self.path = os.path.join(args.root, LEDGER)
        self.index = args.index
        self.role = args.child
        self.stop_file = os.path.join(args.root, "stop")
        self.result_file = os.path.join(args.root, "results", f"{self.role}-{self.index}.json")
        self.options: dict[str, Any] = {}
        if args.busy_timeout_ms is not None:
            self.options["busy_timeout_ms"] = args.busy_timeout_ms

    def barrier(self) -> None:
        """Say "ready" and wait for the parent's "go" (everybody is open by then)."""
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        line = sys.stdin.readline()
        if line.strip() != "go":
            raise SystemExit(f"{self.role}-{self.index}: no go from the parent ({line!r})")

    def stopped(self) -> bool:
        return os.path.exists(self.stop_file)

    def save(self, result: dict[str, Any]) -> None:
        tmp = self.result_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.result_file)


class Leaks:
    """Busy errors that reached the caller, by operation."""

    def __init__(self) -> None:
        self.ledger_busy: Counter[str] = Counter()
        self.raw_busy: Counter[str] = Counter()
        self.samples: list[str] = []

    def note(self, op: str, exc: BaseException) -> None:
        (self.ledger_busy if isinstance(exc, LedgerBusy) else self.raw_busy)[op] += 1
        if len(self.samples) < 5:
            self.samples.append(f"{op}: {type(exc).__name__}: {exc}")

    def total(self) -> int:
        return sum(self.ledger_busy.values()) + sum(self.raw_busy.values())

    def as_dict(self) -> dict[str, Any]:
        return {"ledger_busy": dict(self.ledger_busy), "raw_busy": dict(self.raw_busy),
                "total": self.total(), "samples": self.samples}


BUSY = (LedgerBusy, apsw.BusyError, apsw.LockedError)


def retrying(leaks: Leaks, lat: dict[str, list[float]], op: str, fn: Callable[[], T]) -> T:
    """Call `fn`; on a busy leak count it and call again (the protocol is idempotent)."""
    for _ in range(RETRIES):
        t0 = time.perf_counter()
        try:
            out = fn()
        except BUSY as exc:
            leaks.note(op, exc)
            continue
        lat.setdefault(op, []).append(time.perf_counter() - t0)
        return out
    raise RuntimeError(f"{op}: still busy after {RETRIES} tries")


def run_writer(c: Child, steps: int, artifact_every: int) -> None:
    ws = writer_ws(c.index)
    acked: list[str] = []
    leaks = Leaks()
    lat: dict[str, list[float]] = {}
    step_lat: list[float] = []
    verdicts: Counter[str] = Counter()
    result: dict[str, Any] = {"role": "writer", "index": c.index, "workspace": ws,
                              "acked": acked, "error": None}
    t_start = t_end = time.perf_counter()
    led = retrying(leaks, lat, "open", lambda: Ledger.open(c.path, **c.options))
    try:
        c.barrier()
        t_start = time.perf_counter()
        epoch = retrying(leaks, lat, "acquire",
                         lambda: led.workspaces.acquire(ws, f"writer-{c.index}", ttl_s=3600)).epoch
        result["epoch"] = epoch
        for k in range(steps):
            t0 = time.perf_counter()
            step = writer_step(c.index, k)
            if k and k % HEARTBEAT_EVERY == 0:
                retrying(leaks, lat, "heartbeat", lambda: led.workspaces.heartbeat(ws, epoch, ttl_s=3600))
            rev, pre = retrying(leaks, lat, "snapshot", lambda: led.workspaces.snapshot(ws, FILE))
            with_artifact = artifact_every > 0 and k % artifact_every == 0
            plan = StepPlan(step, [Write(FILE, writer_content(c.index, k), pre, rev)],
                            artifacts=("out/log.txt",) if with_artifact else (),
                            run=f"run-{c.index}")
            out = retrying(leaks, lat, "admit", lambda plan=plan: led.workspaces.admit(ws, epoch, [plan]))
            if out != [None]:
                raise AssertionError(f"{step}: admit answered {out}")
            applied = retrying(leaks, lat, "apply", lambda step=step: led.workspaces.apply(step, epoch=epoch))
            verdicts[applied.verdict] += 1
            if applied.verdict not in ("applied", "deduped"):
                raise AssertionError(f"{step}: apply answered {applied.verdict} {applied.detail}")
            if with_artifact:
                data = artifact_content(c.index, k)
                retrying(leaks, lat, "store", lambda step=step, a=applied.attempt, data=data:
                         led.store(step, a, "out/log.txt", data))
            retrying(leaks, lat, "publish", lambda step=step: led.publish(step))
            retrying(leaks, lat, "ack", lambda step=step: led.ack(step, epoch=epoch))
            acked.append(step)  # the client learned it: it must be committed from here on
            step_lat.append(time.perf_counter() - t0)
        t_end = time.perf_counter()
    except BaseException as exc:
        t_end = time.perf_counter()
        result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        raise
    finally:
        result.update(
            elapsed_s=t_end - t_start, leaks=leaks.as_dict(), verdicts=dict(verdicts),
            step_latency_s={"p50": _pct(step_lat, 0.5), "p99": _pct(step_lat, 0.99),
                            "max": max(step_lat, default=0.0)},
            step_latencies_ms=[round(x * 1e3, 2) for x in step_lat],
            op_latency_max_s={op: max(v) for op, v in lat.items()},
        )
        c.save(result)
        led.close()


def run_reader(c: Child, pause_s: float) -> None:
    """Loop read-only opens, `steps()` and `audit` until the stop file appears."""
    from ledger.gc import audit

    leaks = Leaks()
    errors: Counter[str] = Counter()
    samples: list[str] = []
    steps_reads = audit_reads = audit_not_ok = went_back = 0
    max_acked = max_events = 0
    read_lat: list[float] = []
    c.barrier()
    t_start = time.perf_counter()
    while True:
        last = c.stopped()  # one more full read after the stop: the final state too
        t0 = time.perf_counter()
        try:
            with Ledger.open(c.path, readonly=True, **c.options) as led:
                rows = led.steps()
                steps_reads += 1
                acked = sum(1 for r in rows if r.state == "acked")
                events = led.count()
                if acked < max_acked or events < max_events:
                    went_back += 1
                    if len(samples) < 5:
                        samples.append(f"went back: acked {max_acked}->{acked},"
                                       f" events {max_events}->{events}")
                max_acked, max_events = max(max_acked, acked), max(max_events, events)
                report = audit(led)
                audit_reads += 1
                if not report.ok:
                    audit_not_ok += 1
                    if len(samples) < 5:
                        samples.append(f"audit not ok: {report.as_dict()}")
        except BUSY as exc:
            leaks.note("read", exc)
        except Exception as exc:  # noqa: BLE001 -- every other failure of a reader is a finding
            errors[type(exc).__name__] += 1
            if len(samples) < 5:
                samples.append(f"{type(exc).__name__}: {exc}")
        read_lat.append(time.perf_counter() - t0)
        if last:
            break
        if pause_s:
            time.sleep(pause_s)
    c.save({
        "role": "reader", "index": c.index, "elapsed_s": time.perf_counter() - t_start,
        "steps_reads": steps_reads, "audit_reads": audit_reads, "audit_not_ok": audit_not_ok,
        "went_back": went_back, "errors": dict(errors), "samples": samples,
        "leaks": leaks.as_dict(), "max_acked_seen": max_acked, "max_events_seen": max_events,
        "read_latency_s": {"p50": _pct(read_lat, 0.5), "max": max(read_lat, default=0.0)},
    })


class Contender:
    """One of two processes fighting over the `contended` workspace's lease."""

    def __init__(self, c: Child, seed: int) -> None:
        self.c = c
        self.me = CONTENDERS[c.index % 2]
        self.rng = random.Random(seed * 1_000 + c.index)
        self.leaks = Leaks()
        self.lat: dict[str, list[float]] = {}
        self.led = retrying(self.leaks, self.lat, "open", lambda: Ledger.open(c.path, **c.options))
        self.counts: Counter[str] = Counter()  # op:outcome
        self.probes: Counter[str] = Counter()  # zombie op:outcome
        self.zombie_effects: list[str] = []
        self.other_refusals: list[str] = []
        self.unexpected: list[str] = []
        self.epochs: list[int] = []
        self.k = 0

    def call(self, op: str, fn: Callable[[], T]) -> T:
        try:
            out = retrying(self.leaks, self.lat, op, fn)
        except StaleEpoch:
            self.counts[f"{op}:StaleEpoch"] += 1
            raise
        except LedgerError as exc:
            self.counts[f"{op}:{type(exc).__name__}"] += 1
            raise
        self.counts[f"{op}:ok"] += 1
        return out

    def acquire(self) -> int | None:
        force = False
        ttl = self.rng.choice((0.25, 30.0))
        try:
            lease = self.call("acquire", lambda: self.led.workspaces.acquire(CONTENDED, self.me, ttl_s=ttl))
        except LeaseHeld:
            if self.rng.random() >= 0.5:
                time.sleep(self.rng.uniform(0, 0.01))
                return None
            force = True
            try:
                lease = self.call("force-acquire", lambda: self.led.workspaces.acquire(
                    CONTENDED, self.me, ttl_s=ttl, force=True))
            except StaleEpoch:  # acquired, and taken over before its settling finished
                return None
        except StaleEpoch:
            return None
        self.epochs.append(lease.epoch)
        self.counts["takeover" if force else "acquired"] += 1
        if lease.unsettled:
            self.counts["acquire:unsettled"] += 1
        return lease.epoch

    def step(self, epoch: int) -> None:
        """One full step under `epoch`; a StaleEpoch sends the zombie probes after it."""
        step = f"{self.me}-s{self.k:05d}"
        self.k += 1
        state = "none"
        try:
            rev, pre = self.call("snapshot", lambda: self.led.workspaces.snapshot(CONTENDED, CONTENDED_FILE))
            content = f"{step} under epoch {epoch}\n".encode()
            plan = StepPlan(step, [Write(CONTENDED_FILE, content, pre, rev)], artifacts=(),
                            run=self.me)
            self.call("admit", lambda: self.led.workspaces.admit(CONTENDED, epoch, [plan]))
            state = "planned"
            result = self.call("apply", lambda: self.led.workspaces.apply(step, epoch=epoch))
            self.counts[f"verdict:{result.verdict}"] += 1
            if result.verdict not in ("applied", "deduped"):
                return
            state = "applied"
            if self.rng.random() < 0.3:
                self.call("store", lambda: self.led.store(step, result.attempt, "out/c.log",
                                                          f"{step}\n".encode()))
            self.call("publish", lambda: self.led.publish(step))
            state = "published"
            self.call("ack", lambda: self.led.ack(step, epoch=epoch))
            state = "acked"
            if self.rng.random() < 0.2:
                self.call("heartbeat", lambda: self.led.workspaces.heartbeat(CONTENDED, epoch, ttl_s=30))
        except StaleEpoch:
            self.probe(epoch, step, state)
            raise
        except Unsettled:
            self.call("settle", lambda: self.led.workspaces.settle(CONTENDED, epoch))

    def probe(self, dead: int, step: str, state: str) -> None:
        """The loser tries every mutation again with its dead epoch."""
        led = self.led

        def attempt(op: str, fn: Callable[[], Any], answered: Callable[[Any], bool]) -> None:
            try:
                out = retrying(self.leaks, self.lat, f"zombie-{op}", fn)
            except StaleEpoch:
                self.probes[f"{op}:StaleEpoch"] += 1
                return
            except ProtocolRefused as exc:  # refused, but not in the words the design promises
                self.probes[f"{op}:{type(exc).__name__}"] += 1
                if len(self.other_refusals) < 20:
                    self.other_refusals.append(f"{op} of {step} ({state}) under dead epoch"
                                               f" {dead}: {type(exc).__name__}: {exc}")
                return
            if answered(out):
                self.probes[f"{op}:answered"] += 1
                return
            self.probes[f"{op}:EFFECT"] += 1
            self.zombie_effects.append(f"{op} of {step} ({state}) under dead epoch {dead}"
                                       f" returned {out!r}")

        def never(_out: Any) -> bool:
            return False

        attempt("heartbeat", lambda: led.workspaces.heartbeat(CONTENDED, dead, ttl_s=30), never)
        zombie = f"{self.me}-z{self.k:05d}"
        self.k += 1
        try:
            rev, pre = led.workspaces.snapshot(CONTENDED, CONTENDED_FILE)
        except BUSY:
            rev, pre = 0, None
        attempt("admit", lambda: led.workspaces.admit(CONTENDED, dead, [StepPlan(
            zombie, [Write(CONTENDED_FILE, b"zombie\n", pre, rev)], run=self.me)]), never)
        if state == "none":
            return
        attempt("apply", lambda: led.workspaces.apply(step, epoch=dead),
                lambda r: r.verdict != "applied")  # deduped / compensated / rejected: the past
        attempt("store", lambda: led.store(step, 1, "out/zombie.log", b"zombie\n"), never)
        if state in ("planned", "applied"):
            attempt("publish", lambda: led.publish(step), never)
        attempt("ack", lambda: led.ack(step, epoch=dead), lambda r: r.deduped)
        attempt("compensate", lambda: led.workspaces.compensate(step, epoch=dead, reason="zombie"),
                lambda r: r.deduped)

    def run(self) -> None:
        self.c.barrier()
        t_start = time.perf_counter()
        epoch: int | None = None
        try:
            while not self.c.stopped():
                if epoch is None:
                    epoch = self.acquire()
                    continue
                try:
                    self.step(epoch)
                except StaleEpoch:
                    self.counts["lost"] += 1
                    epoch = None
                    continue
                if self.rng.random() < 0.1:
                    try:
                        self.call("release", lambda e=epoch: self.led.workspaces.release(CONTENDED, e))
                    except StaleEpoch:
                        pass
                    epoch = None
                time.sleep(self.rng.uniform(0, 0.003))
        except BaseException as exc:
            self.unexpected.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            raise
        finally:
            self.c.save({
                "role": "contender", "index": self.c.index, "holder": self.me,
                "elapsed_s": time.perf_counter() - t_start, "counts": dict(self.counts),
                "probes": dict(self.probes), "zombie_effects": self.zombie_effects,
                "other_refusals": self.other_refusals, "unexpected": self.unexpected,
                "epochs": len(self.epochs), "leaks": self.leaks.as_dict(),
                "op_latency_max_s": {op: max(v) for op, v in self.lat.items()},
            })
            self.led.close()


def child_main(args: argparse.Namespace) -> None:
    c = Child(args)
    if args.child == "writer":
        run_writer(c, args.steps, args.artifact_every)
    elif args.child == "reader":
        run_reader(c, args.reader_pause)
    elif args.child == "contender":
        Contender(c, args.seed).run()
    else:
        raise SystemExit(f"unknown child role {args.child!r}")


# -- the parent -------------------------------------------------------------------------


def setup(root: str, procs: int) -> None:
    os.makedirs(os.path.join(root, "results"))
    with Ledger.init(os.path.join(root, LEDGER)) as led:
        for i in range(procs):
            d = os.path.join(root, "ws", writer_ws(i))
            os.makedirs(d)
            with open(os.path.join(d, FILE), "wb") as f:
                f.write(b"initial\n")
            led.workspaces.add(writer_ws(i), d)
        d = os.path.join(root, "ws", CONTENDED)
        os.makedirs(d)
        with open(os.path.join(d, CONTENDED_FILE), "wb") as f:
            f.write(b"initial\n")
        led.workspaces.add(CONTENDED, d)


def _spawn(root: str, role: str, index: int, extra: list[str]) -> subprocess.Popen[bytes]:
    err = open(os.path.join(root, "results", f"{role}-{index}.err"), "wb")  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", role, "--index", str(index),
             "--root", root, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
        )
    finally:
        err.close()


def _stderr_of(root: str, role: str, index: int) -> str:
    try:
        with open(os.path.join(root, "results", f"{role}-{index}.err"), errors="replace") as f:
            return f.read()[-3000:]
    except OSError:
        return ""


def _wait_ready(root: str, children: list[tuple[str, int, subprocess.Popen[bytes]]]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = {p.stdout.fileno(): (role, i, p) for role, i, p in children}  # type: ignore[union-attr]
    buffers: dict[int, bytes] = {fd: b"" for fd in pending}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"children not ready after {READY_TIMEOUT_S}s:"
                               f" {[(r, i) for r, i, _ in pending.values()]}")
        ready, _, _ = select.select(list(pending), [], [], min(left, 1.0))
        for fd in ready:
            chunk = os.read(fd, 64)
            role, i, p = pending[fd]
            if not chunk:
                raise RuntimeError(f"{role}-{i} exited before it was ready (rc {p.wait()}):"
                                   f" {_stderr_of(root, role, i)}")
            buffers[fd] += chunk
            if b"ready\n" in buffers[fd]:
                del pending[fd]


def _wait(p: subprocess.Popen[bytes], deadline: float) -> int:
    """The exit code, or TIMED_OUT after killing a child that hangs past `deadline`."""
    try:
        return p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return TIMED_OUT


def _load(root: str, role: str, index: int) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, "results", f"{role}-{index}.json")) as f:
            return json.load(f)  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def run(
    procs: int = 8,
    steps: int = 1000,
    readers: int = 2,
    contenders: int = 2,
    *,
    scratch: str | None = None,
    shm: bool = False,
    keep: bool = False,
    artifact_every: int = 5,
    reader_pause: float = 0.0,
    busy_timeout_ms: int | None = None,
    seed: int = 1,
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the whole stress once and return the report (``report["ok"]``, failures...).

    Writers still running `timeout_s` after the go (default: 600 s + 0.2 s per step) are
    killed and reported."""
    if timeout_s is None:
        timeout_s = 600.0 + 0.2 * procs * steps
    say = progress or (lambda _msg: None)
    parent = "/dev/shm" if shm else scratch
    if parent:
        os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="steptrail-stress-", dir=parent)
    path = os.path.join(root, LEDGER)
    setup(root, procs)
    common = ["--seed", str(seed)]
    if busy_timeout_ms is not None:
        common += ["--busy-timeout-ms", str(busy_timeout_ms)]
    children: list[tuple[str, int, subprocess.Popen[bytes]]] = []
    say(f"scratch {root} ({mount_of(root)[1]}); spawning {procs} writers, {readers} readers,"
        f" {contenders} contenders")
    try:
        for i in range(procs):
            children.append(("writer", i, _spawn(root, "writer", i, [
                *common, "--steps", str(steps), "--artifact-every", str(artifact_every)])))
        for i in range(readers):
            children.append(("reader", i, _spawn(root, "reader", i, [
                *common, "--reader-pause", str(reader_pause)])))
        for i in range(contenders):
            children.append(("contender", i, _spawn(root, "contender", i, common)))
        try:
            _wait_ready(root, children)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n" + "\n".join(
                f"{r}-{i}: {_stderr_of(root, r, i)}" for r, i, _ in children)) from None
        with Ledger.open(path, readonly=True) as led:
            setup_seq = led.head().seq
        t0 = time.perf_counter()
        for _, _, p in children:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.close()
        say("go")
        rcs: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout_s
        for role, i, p in children:
            if role == "writer":
                rcs[(role, i)] = _wait(p, deadline)
        writers_s = time.perf_counter() - t0
        say(f"writers done in {writers_s:.1f}s")
        with open(os.path.join(root, "stop"), "w"):
            pass
        deadline = time.monotonic() + 300
        for role, i, p in children:
            if role != "writer":
                rcs[(role, i)] = _wait(p, deadline)
    finally:
        for _, _, p in children:
            if p.poll() is None:
                p.kill()
                p.wait()
            for stream in (p.stdin, p.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
    results = {(r, i): _load(root, r, i) for r, i, _ in children}
    report = check(root, procs, steps, artifact_every, results, rcs, after_seq=setup_seq)
    writer_results = [results[("writer", i)] or {} for i in range(procs)]
    reader_results = [results[("reader", i)] or {} for i in range(readers)]
    contender_results = [results[("contender", i)] or {} for i in range(contenders)]
    total_steps = sum(len(w.get("acked", ())) for w in writer_results)
    writer_events = report["counts"]["writer_events"]
    all_events = report["counts"]["events"] - setup_seq
    reads = sum(r.get("steps_reads", 0) for r in reader_results)
    audits = sum(r.get("audit_reads", 0) for r in reader_results)
    report["config"] = {
        "procs": procs, "steps": steps, "readers": readers, "contenders": contenders,
        "artifact_every": artifact_every, "synchronous": "FULL",
        "busy_timeout_ms": (busy_timeout_ms if busy_timeout_ms is not None
                            else f"default ({BUSY_TIMEOUT_MS})"),
        "scratch": root, "fs": mount_of(root)[1], "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "sqlite": apsw.sqlite_lib_version(),
    }
    step_ms = [x for w in writer_results for x in w.get("step_latencies_ms", ())]
    report["throughput"] = {
        "writers_elapsed_s": round(writers_s, 2),
        "steps": total_steps,
        "steps_per_s": round(total_steps / writers_s, 1),
        "step_p50_ms": round(_pct(step_ms, 0.5), 1),
        "step_p99_ms": round(_pct(step_ms, 0.99), 1),
        "writer_events": writer_events,
        "writer_events_per_s": round(writer_events / writers_s, 1),
        "all_events": all_events,
        "all_events_per_s": round(all_events / writers_s, 1),
        "contender_steps_acked": report["counts"]["contender_acked"],
        "reads_steps": reads, "reads_audit": audits,
        "reads_per_s": round((reads + audits) / writers_s, 1),
        "per_writer": [
            {"workspace": w.get("workspace"), "elapsed_s": round(w.get("elapsed_s", 0.0), 2),
             "steps_per_s": round(len(w.get("acked", ())) / max(w.get("elapsed_s", 0.0), 1e-9), 1),
             "events_per_s": round(report["counts"]["events_by_ws"].get(w.get("workspace"), 0)
                                   / max(w.get("elapsed_s", 0.0), 1e-9), 1),
             "step_p50_ms": round(w.get("step_latency_s", {}).get("p50", 0) * 1e3, 1),
             "step_p99_ms": round(w.get("step_latency_s", {}).get("p99", 0) * 1e3, 1),
             "step_max_ms": round(w.get("step_latency_s", {}).get("max", 0) * 1e3, 1),
             "op_max_ms": {k: round(v * 1e3, 1) for k, v in w.get("op_latency_max_s", {}).items()}}
            for w in writer_results
        ],
        "per_reader": [
            {"reads": r.get("steps_reads", 0) + r.get("audit_reads", 0),
             "reads_per_s": round((r.get("steps_reads", 0) + r.get("audit_reads", 0))
                                  / max(r.get("elapsed_s", 0.0), 1e-9), 1),
             "read_p50_ms": round(r.get("read_latency_s", {}).get("p50", 0) * 1e3, 1),
             "read_max_ms": round(r.get("read_latency_s", {}).get("max", 0) * 1e3, 1)}
            for r in reader_results
        ],
    }
    report["contenders"] = [
        {k: c.get(k) for k in ("holder", "counts", "probes", "epochs", "zombie_effects",
                               "other_refusals")}
        for c in contender_results
    ]
    report["readers"] = [
        {k: r.get(k) for k in ("steps_reads", "audit_reads", "audit_not_ok", "went_back",
                               "errors", "samples", "max_acked_seen")}
        for r in reader_results
    ]
    if report["ok"] and not keep:
        shutil.rmtree(root, ignore_errors=True)
        report["config"]["kept"] = False
    else:
        report["config"]["kept"] = True
    return report


def check(
    root: str,
    procs: int,
    steps: int,
    artifact_every: int,
    results: dict[tuple[str, int], dict[str, Any] | None],
    rcs: dict[tuple[str, int], int],
    *,
    after_seq: int = 0,
) -> dict[str, Any]:
    """Every check of the issue, against the file alone and the children's results."""
    from ledger.gc import audit
    from ledger.invariants import check as invariants_check

    failures: list[str] = []
    leaks: dict[str, int] = {}
    leak_detail: dict[str, Any] = {}
    for (role, i), rc in sorted(rcs.items()):
        if rc == TIMED_OUT:
            failures.append(f"{role}-{i} hung and was killed: {_stderr_of(root, role, i)}")
        elif rc != 0:
            failures.append(f"{role}-{i} exited with {rc}: {_stderr_of(root, role, i)}")
    for (role, i), res in sorted(results.items()):
        if res is None:
            failures.append(f"{role}-{i} left no result")
            continue
        leaks[f"{role}-{i}"] = res.get("leaks", {}).get("total", 0)
        if leaks[f"{role}-{i}"]:
            leak_detail[f"{role}-{i}"] = res["leaks"]
        if res.get("error"):
            failures.append(f"{role}-{i}: {res['error']}")
    busy_leaks = sum(leaks.values())
    if busy_leaks:
        failures.append(f"{busy_leaks} busy error(s) leaked to callers: {json.dumps(leak_detail)}")

    path = os.path.join(root, LEDGER)
    counts: dict[str, Any] = {}
    with Ledger.open(path) as led:
        conn = led._store.db.conn
        counts["events"] = led.count()
        # -- nothing lost: every acked step is committed; nothing extra ---------------
        rows = {r.step_id: r for r in led.steps()}
        lost: list[str] = []
        for i in range(procs):
            res = results.get(("writer", i)) or {}
            acked = res.get("acked", [])
            if len(acked) != len(set(acked)):
                failures.append(f"writer-{i} acked a step twice")
            if len(acked) != steps:
                failures.append(f"writer-{i} acked {len(acked)} of {steps} steps")
            for s in acked:
                row = rows.get(s)
                if row is None or row.state != "acked" or not row.live:
                    lost.append(s)
            present = {s for s, r in rows.items() if r.workspace == writer_ws(i)}
            extra = present - {writer_step(i, k) for k in range(steps)}
            if extra:
                failures.append(f"writer-{i}: steps never attempted are present: {sorted(extra)[:5]}")
        if lost:
            failures.append(f"{len(lost)} acked step(s) not committed (lost): {lost[:10]}")
        counts["lost"] = len(lost)
        # -- nothing duplicated --------------------------------------------------------
        dup_keys = conn.execute("SELECT journal_key, count(*) FROM events GROUP BY journal_key"
                                " HAVING count(*) > 1 LIMIT 10").fetchall()
        if dup_keys:
            failures.append(f"journal keys recorded twice: {dup_keys}")
        counts["duplicate_journal_keys"] = len(dup_keys)
        bad_shape: list[str] = []
        per_step: dict[str, Counter[str]] = {}
        for step, kind, n in conn.execute(
            "SELECT step, kind, count(*) FROM events WHERE workspace LIKE 'w%'"
            " GROUP BY step, kind"
        ):
            per_step.setdefault(step, Counter())[kind] = n
        for i in range(procs):
            for k in range(steps):
                s = writer_step(i, k)
                got = per_step.get(s, Counter())
                want = {"planned": 1, "fenced": 1, "manifest-published": 1, "acked": 1,
                        "blob-stored": 1 if artifact_every > 0 and k % artifact_every == 0 else 0}
                if any(got.get(kind, 0) != n for kind, n in want.items()) or set(got) - {
                        *want, "blob-pinned"} or not 1 <= got.get("blob-pinned", 0) <= 3:
                    bad_shape.append(f"{s}: {dict(got)}")
        if bad_shape:
            failures.append(f"{len(bad_shape)} writer step(s) with missing or duplicated events:"
                            f" {bad_shape[:5]}")
        counts["bad_shape"] = len(bad_shape)
        counts["events_by_ws"] = dict(conn.execute(  # events of the run (not of the setup)
            "SELECT workspace, count(*) FROM events WHERE workspace != '' AND seq > ?"
            " GROUP BY workspace", (after_seq,)).fetchall())
        counts["writer_events"] = sum(n for w, n in counts["events_by_ws"].items()
                                      if w != CONTENDED)
        counts["contender_acked"] = sum(1 for r in rows.values()
                                        if r.workspace == CONTENDED and r.state == "acked")
        # -- the chain verifies; projections equal a rebuild; invariants -------------
        report = led.verify()
        if not report.ok:
            failures.append(f"verify: {[(f.check, f.seq, f.message) for f in report.findings[:10]]}")
        breaches = invariants_check(led.read())
        if breaches:
            failures.append(f"invariant breaches (I5 = effect under a dead epoch): "
                            f"{[(b.invariant, b.seq, b.message) for b in breaches[:10]]}")
        counts["breaches"] = len(breaches)
        counts["I5_breaches"] = sum(1 for b in breaches if b.invariant == "I5")
        before = led.steps()
        ws_before = led.workspaces.list()
        led.rebuild()
        after = led.steps()
        if before != after:
            diff = [(a, b) for a, b in zip(before, after, strict=False) if a != b][:3]
            failures.append(f"rebuild changed the steps ({len(before)} -> {len(after)}): {diff}")
        if led.workspaces.list() != ws_before:
            failures.append("rebuild changed the workspaces")
        if not led.verify().ok:
            failures.append("verify after rebuild is not ok")
        a = audit(led)
        if not a.ok:
            failures.append(f"audit: {a.as_dict()}")
        # -- every workspace file holds what the ledger says --------------------------
        for i in range(procs):
            ws = led.workspaces.get(writer_ws(i))
            if ws.rev != steps:
                failures.append(f"{writer_ws(i)} is at rev {ws.rev}, not {steps}")
            with open(os.path.join(ws.root, FILE), "rb") as f:
                data = f.read()
            if steps and data != writer_content(i, steps - 1):
                failures.append(f"{writer_ws(i)}/{FILE} does not hold the last step's content")
        for name in [writer_ws(i) for i in range(procs)] + [CONTENDED]:
            ws = led.workspaces.get(name)
            for p, (_rev, digest) in led.workspaces.paths(name).items():
                full = os.path.join(ws.root, p)
                disk = None
                if os.path.exists(full):
                    with open(full, "rb") as f:
                        disk = sha(f.read())
                if disk != digest:
                    failures.append(f"{name}/{p} on disk is {disk}, the ledger says {digest}")
    # -- readers and contenders ---------------------------------------------------------
    for (role, i), res in sorted(results.items()):
        if res is None:
            continue
        if role == "reader":
            if res.get("errors"):
                failures.append(f"reader-{i} errors: {res['errors']} {res.get('samples')}")
            if res.get("went_back"):
                failures.append(f"reader-{i} saw the ledger go back: {res.get('samples')}")
            if res.get("audit_not_ok"):
                failures.append(f"reader-{i}: {res['audit_not_ok']} audits not ok")
            if not res.get("steps_reads"):
                failures.append(f"reader-{i} never read")
        if role == "contender":
            if res.get("zombie_effects"):
                failures.append(f"contender-{i}: mutations under a dead epoch took effect:"
                                f" {res['zombie_effects'][:5]}")
            if res.get("unexpected"):
                failures.append(f"contender-{i}: {res['unexpected'][:2]}")
    counts["busy_leaks"] = busy_leaks
    counts["leaks_by_process"] = {k: n for k, n in leaks.items() if n}
    return {"ok": not failures, "failures": failures, "counts": counts}


def summary(report: dict[str, Any]) -> str:
    cfg, tp, counts = report["config"], report["throughput"], report["counts"]
    lines = [
        (f"stress: {cfg['procs']} writers x {cfg['steps']} steps, {cfg['readers']} readers,"
         f" {cfg['contenders']} contenders; synchronous=FULL, busy timeout {cfg['busy_timeout_ms']}"),
        (f"  scratch {cfg['scratch']} ({cfg['fs']}), {cfg['cpus']} CPUs, Python {cfg['python']},"
         f" SQLite {cfg['sqlite']}"),
        f"  elapsed {tp['writers_elapsed_s']} s (go -> last writer done)",
        (f"  writers: {tp['steps']} steps, {tp['steps_per_s']} steps/s (step p50"
         f" {tp['step_p50_ms']} ms, p99 {tp['step_p99_ms']} ms);"
         f" {tp['writer_events']} events, {tp['writer_events_per_s']} events/s"),
        f"  all events (writers + contenders): {tp['all_events']}, {tp['all_events_per_s']} events/s",
        (f"  readers: {tp['reads_steps']} steps() + {tp['reads_audit']} audits,"
         f" {tp['reads_per_s']} reads/s"),
    ]
    for w in tp["per_writer"]:
        lines.append(
            f"    {w['workspace']}: {w['elapsed_s']} s, {w['steps_per_s']} steps/s,"
            f" {w['events_per_s']} events/s, step p50 {w['step_p50_ms']} ms p99"
            f" {w['step_p99_ms']} ms max {w['step_max_ms']} ms;"
            f" slowest op {max(w['op_max_ms'].items(), key=lambda kv: kv[1], default=('-', 0))}")
    for r in tp["per_reader"]:
        lines.append(f"    reader: {r['reads']} reads, {r['reads_per_s']} reads/s,"
                     f" p50 {r['read_p50_ms']} ms, max {r['read_max_ms']} ms")
    for c in report["contenders"]:
        counts_c = c.get("counts") or {}
        lines.append(
            f"  contender {c.get('holder')}: {c.get('epochs')} epochs"
            f" ({counts_c.get('acquired', 0)} acquired, {counts_c.get('takeover', 0)} forced),"
            f" lost {counts_c.get('lost', 0)} times, LeaseHeld"
            f" {counts_c.get('acquire:LeaseHeld', 0)}, acked {counts_c.get('ack:ok', 0)};"
            f" zombie probes {c.get('probes')}")
        for r in (c.get("other_refusals") or [])[:3]:
            lines.append(f"    refused without StaleEpoch: {r}")
    lines.append(
        f"  checks: lost {counts['lost']}, duplicate journal keys"
        f" {counts['duplicate_journal_keys']}, malformed steps {counts['bad_shape']},"
        f" invariant breaches {counts['breaches']} (I5 {counts['I5_breaches']}), busy leaks"
        f" {counts['busy_leaks']}")
    lines.append("  OK" if report["ok"] else "  FAILED:\n    " + "\n    ".join(report["failures"]))
    if cfg.get("kept"):
        lines.append(f"  scratch kept: {cfg['scratch']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=8, help="writer processes (default 8)")
    ap.add_argument("--steps", type=int, default=1000, help="steps per writer (default 1000)")
    ap.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    ap.add_argument("--contenders", type=int, default=2, choices=(0, 2),
                    help="lease contender processes: 2 or 0 (default 2)")
    ap.add_argument("--dir", default=None, help="scratch parent directory (default: the temp dir)")
    ap.add_argument("--shm", action="store_true", help="scratch on /dev/shm (tmpfs)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--artifact-every", type=int, default=5,
                    help="store an inline artifact every N steps (0: never; default 5)")
    ap.add_argument("--reader-pause", type=float, default=0.0,
                    help="seconds a reader sleeps between reads (default 0)")
    ap.add_argument("--busy-timeout-ms", type=int, default=None,
                    help=f"override the library's busy timeout (default: the library's,"
                         f" {BUSY_TIMEOUT_MS} ms)")
    ap.add_argument("--seed", type=int, default=1)
    # internal: run as a child
    ap.add_argument("--child", choices=("writer", "reader", "contender"), help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    report = run(args.procs, args.steps, args.readers, args.contenders, scratch=args.dir,
                 shm=args.shm, keep=args.keep, artifact_every=args.artifact_every,
                 reader_pause=args.reader_pause, busy_timeout_ms=args.busy_timeout_ms,
                 seed=args.seed, progress=None if args.json else
                 (lambda m: print(m, file=sys.stderr, flush=True)))
    print(json.dumps(report, indent=2) if args.json else summary(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

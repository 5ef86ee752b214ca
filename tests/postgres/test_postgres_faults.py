"""Real faults under the PostgreSQL store, on the session's throwaway server.

* The server killed (``pg_ctl stop -m immediate``) under three writer processes, then
  restarted: every append a worker saw return is in the ledger, none twice, the chain
  verifies, seq is dense, and the same appends again are all `deduped`.
* The connection killed at COMMIT (the store's ``on_op("commit")`` hook terminates its
  own backend): a typed `DatabaseUnavailable`, and a retry with the same journal key
  records the event once. And the other side of an unknown outcome: a proxy forwards the
  COMMIT and cuts the client before the answer, so the server committed and the client
  never heard it; the retry answers `deduped`.
* A worker partitioned from the database (its connection goes through the proxy, which
  then refuses it) whose lease expires by the database's clock: a second worker takes a
  new epoch and settles the first one's attempt; when the first comes back, its late
  append, publish of its receipt, ack, admit, apply and heartbeat are refused with
  `StaleEpoch` (or the protocol's typed refusal) and commit nothing.
* A writer stalled between its inserts and its COMMIT: on SQLite another writer gets
  `LedgerBusy` after its busy timeout; on PostgreSQL it waits as long as the stall lasts
  (the busy timeout is the lock timeout on PostgreSQL too).

The checkers have teeth: with the guarantee removed (a store that reports a COMMIT it
lost as done; a ledger without its epoch guard) the same checks report the breach.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import commit_events, commit_step

from ledger import Ledger, Planned
from ledger.errors import (
    DatabaseUnavailable,
    LeaseHeld,
    LedgerError,
    ProtocolRefused,
)
from ledger.step.values import StepPlan, Write
from ledger.store.postgres import PgStore

psycopg = pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # tests/: conftest


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


# --- a TCP proxy in front of the server -----------------------------------------------------

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104
_READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery: the server finished answering


class _Pair:
    """One client connection and its upstream connection to the server."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.statements: dict[bytes, bytes] = {}  # prepared statement name -> its text
        self.swallow = False  # the answer to the COMMIT being cut is dropped

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class PgProxy:
    """A relay on 127.0.0.1 in front of the server's port that reads the client's side
    of the wire protocol, so it can cut a connection right after forwarding its COMMIT
    (`cut_next_commit`: the server commits, the client never hears it), or cut every
    connection and refuse new ones (`partition`, until `heal`).

    psycopg sends a COMMIT as a simple query (``Q``) at first, then, once it has run it
    often enough, as a prepared statement (``P`` once, then ``B``/``E``/``S``): both are
    recognized — and a simple query that ends in a COMMIT after other statements (a
    write transaction's held writes go with its COMMIT, `PgStore._defer`)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._up = True
        self._closed = False
        self._cut_armed = False
        #: set once the server has answered a COMMIT whose client was cut
        self.commit_answered = threading.Event()
        #: how each cut COMMIT was sent ("Q": a simple query, "B": a prepared statement)
        self.cuts: list[str] = []
        self.refused = 0  # connections refused while partitioned
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, url: str) -> str:
        """`url` (a tcp URL of the server) through the proxy; no TLS to read through."""
        proxied = url.replace(f":{self.target}/", f":{self.port}/", 1)
        assert proxied != url, url
        return proxied + ("&" if "?" in proxied else "?") + "sslmode=disable&gssencmode=disable"

    # -- the faults

    def cut_next_commit(self) -> None:
        self.commit_answered.clear()
        with self._lock:
            self._cut_armed = True

    def partition(self) -> None:
        """Cut every connection and refuse new ones (each is closed at once)."""
        with self._lock:
            self._up = False
            pairs, self._pairs = self._pairs, []
        for p in pairs:
            p.close()

    def heal(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self._closed = True
        self.partition()
        self._thread.join(5)
        self._listener.close()

    def __enter__(self) -> PgProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- relaying

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                up = self._up
            if not up:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._client_to_server, args=(pair,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(pair,), daemon=True).start()

    def _commit_starts(self, pair: _Pair, msg: bytes) -> str | None:
        """Whether `msg` (a typed client message) runs a COMMIT: how ("Q", "B"), or None."""
        kind, body = msg[:1], msg[5:]
        text = body.rstrip(b"\x00").strip().upper()
        if kind == b"Q" and (text == b"COMMIT" or text.endswith(b";\nCOMMIT")):
            return "Q"  # alone, or after the writes the transaction held (one message)
        if kind == b"P":
            name, rest = body.split(b"\x00", 1)
            pair.statements[name] = rest.split(b"\x00", 1)[0].strip().upper()
        elif kind == b"B":
            _portal, statement, _ = body.split(b"\x00", 2)
            if pair.statements.get(statement) == b"COMMIT":
                return "B"
        return None

    def _client_to_server(self, pair: _Pair) -> None:
        buf, startup, cutting = b"", True, False
        while True:
            try:
                data = pair.client.recv(65536)
            except OSError:
                data = b""
            if not data:
                if not pair.swallow:
                    pair.close()
                return
            buf += data
            out = []  # the complete messages received, forwarded together
            cut = False
            while not cut:
                if startup:  # untyped: SSLRequest/GSSENCRequest, then the startup message
                    if len(buf) < 8 or len(buf) < int.from_bytes(buf[:4], "big"):
                        break
                    n = int.from_bytes(buf[:4], "big")
                    msg, buf = buf[:n], buf[n:]
                    if int.from_bytes(msg[4:8], "big") not in (_SSL_REQUEST, _GSS_REQUEST):
                        startup = False
                else:
                    if len(buf) < 5 or len(buf) < 1 + int.from_bytes(buf[1:5], "big"):
                        break
                    n = 1 + int.from_bytes(buf[1:5], "big")
                    msg, buf = buf[:n], buf[n:]
                    how = self._commit_starts(pair, msg)
                    if how is not None:
                        with self._lock:
                            armed, self._cut_armed = self._cut_armed, False
                        if armed:
                            # from here the server's answers are dropped: the client
                            # never learns whether the COMMIT it sent committed
                            pair.swallow = cutting = True
                            self.cuts.append(how)
                out.append(msg)
                cut = cutting and msg[:1] in (b"Q", b"S")  # the COMMIT is complete
            try:
                pair.upstream.sendall(b"".join(out))
            except OSError:
                pair.close()
                return
            if cut:  # the COMMIT is on its way: the client hears nothing more
                with contextlib.suppress(OSError):
                    pair.client.shutdown(socket.SHUT_RDWR)
                pair.client.close()
                return

    def _server_to_client(self, pair: _Pair) -> None:
        tail = b""
        while True:
            try:
                data = pair.upstream.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if pair.swallow:
                tail = (tail + data)[-64:]
                if _READY in tail:  # the server answered the COMMIT: it is durable
                    self.commit_answered.set()
                    break
                continue
            try:
                pair.client.sendall(data)
            except OSError:
                break
        pair.close()


@pytest.fixture
def proxy(pg_server: Any) -> Iterator[PgProxy]:
    with PgProxy(pg_server.port) as p:
        yield p


# --- what every scenario checks ---------------------------------------------------------------


def ack_problems(url: str, acked: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the ledger at `url` given the appends its writers saw return
    (`acked`: journal key, seq, hash hex of each): an acknowledged event missing or
    different, a journal key twice, a hole in seq, a verify finding."""
    problems: list[str] = []
    with Ledger.open(url, readonly=True) as led:
        events = list(led.read())
        report = led.verify()
    by_key: dict[str, Any] = {}
    for key, n in collections.Counter(r.journal_key for r in events).items():
        if n > 1:
            problems.append(f"journal key {key} is recorded {n} times")
    for r in events:
        by_key[r.journal_key] = r
    for a in acked:
        r = by_key.get(a["key"])
        if r is None:
            problems.append(f"acknowledged {a['key']} (seq {a['seq']}) is not in the ledger")
        elif (r.seq, r.hash.hex()) != (a["seq"], a["hash"]):
            problems.append(f"acknowledged {a['key']} as #{a['seq']}, the ledger has #{r.seq}")
    seqs = [r.seq for r in events]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seq is not dense: {seqs[:5]}...{seqs[-5:]}")
    if not report.ok:
        problems.extend(f"verify: [{f.check}] #{f.seq} {f.message}" for f in report.findings)
    return problems


def acked_record(r: Any) -> dict[str, Any]:
    return {"key": r.journal_key, "seq": r.seq, "hash": r.hash.hex(), "deduped": r.deduped}


def rows_with_key(url: str, key: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [s for (s,) in conn.execute("SELECT seq FROM events WHERE journal_key = %s",
                                           (key,)).fetchall()]


# === 1. the server killed under three writer processes =========================================

WORKERS = 3
STEPS = 40  # per worker: 4 appends and a blob each

_WORKER = r"""
import collections, json, os, sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from conftest import commit_events
from ledger import Ledger
from ledger.errors import DatabaseUnavailable, LedgerError

url, wid, steps, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
reopen = wid != 0  # worker 0 keeps its Ledger (the store reconnects), the others reopen
deadline = time.monotonic() + 90
errors, unexpected, retried_deduped = collections.Counter(), [], 0
led = None
out = open(side, "a", buffering=1)


def attempt(fn):
    global led
    tries = 0
    while True:
        try:
            if led is None:
                led = Ledger.open(url)
            return fn(led), tries
        except LedgerError as exc:
            errors[type(exc).__name__] += 1
            if not isinstance(exc, DatabaseUnavailable):
                unexpected.append(f"{{type(exc).__name__}}: {{exc}}")
            if reopen and led is not None:
                led.close()
                led = None
            if time.monotonic() > deadline:
                raise SystemExit(f"worker {{wid}}: not done in time: {{dict(errors)}}")
            tries += 1
            time.sleep(0.05)


for i in range(steps):
    step = f"w{{wid}}-s{{i:03d}}"
    content = f"artifact of {{step}}".encode()
    attempt(lambda led: led.blobs.put(content))
    for event in commit_events(step):
        r, tries = attempt(lambda led: led.append(event))
        if tries and r.deduped:
            retried_deduped += 1  # committed, but the answer was lost to the kill
        out.write(json.dumps({{"key": r.journal_key, "seq": r.seq, "hash": r.hash.hex(),
                               "deduped": r.deduped}}) + "\n")
if led is not None:
    led.close()
with open(side + ".done", "w") as f:
    json.dump({{"errors": dict(errors), "unexpected": unexpected,
               "retried_deduped": retried_deduped}}, f)
"""


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_the_server_killed_under_three_writer_processes(pg_server: Any, pg_url: str,
                                                        tmp_path: Path) -> None:
    Ledger.init(pg_url).close()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=str(ROOT), tests=str(TESTS)))
    sides = [tmp_path / f"acked-{w}.jsonl" for w in range(WORKERS)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler", str(script), pg_url,
                               str(w), str(STEPS), str(sides[w])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WORKERS)]
    total = WORKERS * STEPS * 4
    kills = []
    try:
        for fraction in (0.25, 0.6):  # kill twice: early, and again once they are back
            # (or once one worker is three quarters through: under load one can run far ahead
            # of the others and finish before the sum reaches the fraction)
            while (sum(map(_lines, sides)) < fraction * total
                   and max(map(_lines, sides)) < 0.75 * total / WORKERS):
                assert all(p.poll() is None for p in procs), [
                    (p.returncode, *p.communicate()) for p in procs]
                assert time.monotonic() - start < 60, "the workers made no progress"
                time.sleep(0.01)
            kills.append(sum(map(_lines, sides)))
            pg_server.kill()
            time.sleep(0.5)  # the workers fail, retry, fail
            pg_server.restart()
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if not pg_server.running:
            pg_server.restart()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    acked = [json.loads(line) for side in sides for line in side.read_text().splitlines()]
    done = [json.loads(Path(f"{side}.done").read_text()) for side in sides]
    errors = sum((collections.Counter(d["errors"]) for d in done), collections.Counter())
    assert [u for d in done for u in d["unexpected"]] == []  # every failure was typed so
    # the first kill came before any worker could finish (a quarter of all the appends,
    # a third of one's): each one's next use of its connection failed, typed
    assert all(d["errors"].get("DatabaseUnavailable", 0) >= 1 for d in done), done
    print(f"\nkilled at {kills} of {total} acks; {dict(errors)}; retries answered deduped:"
          f" {sum(d['retried_deduped'] for d in done)}; {time.monotonic() - start:.1f}s")

    assert len(acked) == total
    assert ack_problems(pg_url, acked) == []
    with Ledger.open(pg_url) as led:
        assert led.count() == total
        assert {r.state for r in led.steps()} == {"acked"} and len(led.steps()) == WORKERS * STEPS
        # the same appends again, with the same journal keys: all answered, none written
        again = [led.append(e) for w in range(WORKERS) for i in range(STEPS)
                 for e in commit_events(f"w{w}-s{i:03d}")]
        assert all(r.deduped for r in again)
        assert {r.journal_key: r.seq for r in again} == {a["key"]: a["seq"] for a in acked}
        assert led.count() == total


# === 2. the connection killed around COMMIT ===================================================


def _terminate_own_backend(store: PgStore, pg_server: Any, how: str) -> Callable[[str], None]:
    """An `on_op` hook that, at the first "commit", ends the store's own session."""
    fired: list[int] = []

    def hook(op: str) -> None:
        if op != "commit" or fired:
            return
        pid = store._conn.info.backend_pid
        fired.append(pid)
        if how == "pid":
            with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
                assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]
        else:
            assert pg_server.terminate_backends(dbname(store.url), application_name="steptrail") == 1
    return hook


OPS: dict[str, Callable[[Ledger, str], list[Any]]] = {
    "append": lambda led, step: [led.append(Planned(step=step, attempt=1))],
    "append_batch": lambda led, step: led.append_batch(commit_events(step, ledger=led)),
}


@pytest.mark.parametrize("how", ["pid", "terminate_backends"])
@pytest.mark.parametrize("op", list(OPS))
def test_a_connection_killed_at_commit_is_typed_and_the_retry_records_it_once(
        pg_server: Any, pg_url: str, op: str, how: str) -> None:
    led = Ledger.init(pg_url)
    try:
        commit_step(led, "before")
        count = led.count()
        store = led._store
        store.on_op = _terminate_own_backend(store, pg_server, how)
        with pytest.raises(LedgerError) as info:
            OPS[op](led, "s")
        exc = info.value
        assert type(exc) is DatabaseUnavailable, exc
        assert "COMMIT" in str(exc) and "\n" not in str(exc)
        assert exc.__cause__ is None and exc.__suppress_context__  # no driver traceback
        store.on_op = None
        assert led.count() == count  # killed before COMMIT: nothing committed
        # the same call again, on the same Ledger (its store reconnects outside a
        # transaction): written once, its answer consistent with what is stored
        again = OPS[op](led, "s")
        for r in again:
            assert rows_with_key(pg_url, r.journal_key) == [r.seq]
            assert not r.deduped  # (the kill came before COMMIT: this is the first write)
        assert led.count() == count + len(again)
    finally:
        led.close()
    with Ledger.open(pg_url) as fresh:  # and on a reopened one: answered by the journal
        third = OPS[op](fresh, "s")
        assert [r.deduped for r in third] == [True] * len(again)
        assert [r.seq for r in third] == [r.seq for r in again]
    assert ack_problems(pg_url, [acked_record(r) for r in again]) == []


@pytest.mark.parametrize("form", ["Q", "B"])
def test_a_commit_whose_answer_was_lost_is_deduped_on_retry(
        pg_server: Any, pg_url: str, proxy: PgProxy, form: str) -> None:
    """The server commits, the client never hears it: the retry says `deduped`."""
    led = Ledger.init(proxy.url(pg_url))
    try:
        commit_step(led, "warm")
        if form == "Q":
            led._store._conn.close()  # a fresh session: its first COMMIT is a simple query
        else:
            for i in range(8):  # psycopg prepares a statement it ran 5 times
                led.append(Planned(step=f"warm-{i}", attempt=1))
        count = led.count()
        proxy.cut_next_commit()
        with pytest.raises(LedgerError) as info:
            led.append(Planned(step="s", attempt=1))
        assert type(info.value) is DatabaseUnavailable and "COMMIT" in str(info.value)
        # A write's COMMIT carries the writes the transaction held (PgStore._defer): a
        # simple query every time, never a statement psycopg prepared ("B").
        assert proxy.cuts == ["Q"]
        assert proxy.commit_answered.wait(10)  # the server answered: it committed
        [seq] = rows_with_key(pg_url, '["s",1,"planned"]')
        assert seq == count + 1
        again = led.append(Planned(step="s", attempt=1))  # the same Ledger reconnects
        assert again.deduped and again.seq == seq
        assert rows_with_key(pg_url, again.journal_key) == [seq]
        assert led.count() == count + 1
        led.append(Planned(step="after", attempt=1))  # and goes on from the right head
    finally:
        led.close()
    assert ack_problems(pg_url, [acked_record(again)]) == []


def test_the_checker_catches_a_commit_reported_done_that_was_lost(
        pg_server: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarantee removed: a store that swallows the lost COMMIT (as a driver without
    typed errors might) answers the append as recorded; the kill test's checker reports
    the acknowledged event missing."""
    real_end = PgStore._end

    def lying_end(self: PgStore, *, commit: bool) -> None:
        try:
            real_end(self, commit=commit)
        except DatabaseUnavailable:
            pass  # the broken variant: a COMMIT that failed is reported as done

    monkeypatch.setattr(PgStore, "_end", lying_end)
    with Ledger.init(pg_url) as led:
        commit_step(led, "before")
        led._store.on_op = _terminate_own_backend(led._store, pg_server, "pid")
        lost = led.append(Planned(step="s", attempt=1))  # no error: "acknowledged"
    problems = ack_problems(pg_url, [acked_record(lost)])
    assert problems == [f"acknowledged {lost.journal_key} (seq {lost.seq}) is not in the ledger"]


# === 3. a partitioned worker whose lease expires by the database's clock =======================

TTL_S = 1.0


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def partitioned_worker(pg_url: str, proxy: PgProxy, tmp_path: Path, *,
                       break_guard: Callable[[Ledger], None] | None = None) -> dict[str, str]:
    """Worker A (through the proxy) holds the lease, applies s1, is cut off; its lease
    expires by the database's clock; worker B takes the next epoch (settling s1); A comes
    back and tries its late effects. Returns how each was answered ("refused: TYPE" or
    "accepted"), after checking that nothing refused was committed."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0")
    Ledger.init(pg_url).close()
    a = Ledger.open(proxy.url(pg_url))  # no clock given: the database's
    b = Ledger.open(pg_url)
    try:
        a.workspaces.add("w", str(ws))
        lease = a.workspaces.acquire("w", "worker-a", ttl_s=TTL_S)
        old = lease.epoch
        a.workspaces.admit("w", old, [StepPlan("s1", [Write("app.py", b"v1", h(b"v0"), 0)], run="r")])
        applied = a.workspaces.apply("s1", epoch=old)
        assert applied.verdict == "applied" and (ws / "app.py").read_bytes() == b"v1"
        a.workspaces.admit("w", old, [StepPlan("s2", [Write("new.txt", b"n", None, None)], run="r")])

        proxy.partition()
        with pytest.raises(DatabaseUnavailable):  # A cannot renew: its lease runs out
            a.workspaces.heartbeat("w", old, ttl_s=60)
        with pytest.raises(DatabaseUnavailable):  # nor reconnect
            a.workspaces.lease("w")
        with pytest.raises(LeaseHeld):  # still live by the database's clock
            b.workspaces.acquire("w", "worker-b", ttl_s=60)
        while b._store.now_ns() <= lease.expires_ns:
            time.sleep(0.05)
        new = b.workspaces.acquire("w", "worker-b", ttl_s=60)
        assert new.epoch == old + 1
        assert set(new.settled) == {"s1", "s2"}
        assert (ws / "app.py").read_bytes() == b"v0"  # the settle undid A's write
        head, count = b.head(), b.count()

        proxy.heal()
        if break_guard is not None:
            break_guard(a)
        late: dict[str, Callable[[], Any]] = {
            "append": lambda: a.append(Planned(step="late", attempt=1, run="r", workspace="w",
                                               epoch=old)),
            "publish-receipt": lambda: a.publish("s1", receipt=applied.receipt),
            "ack": lambda: a.ack("s1", epoch=old),
            "admit": lambda: a.workspaces.admit("w", old, [StepPlan("s9", [Write("x.txt", b"x", None,
                                                                      None)], run="r")]),
            "apply": lambda: a.workspaces.apply("s2", epoch=old),
            "heartbeat": lambda: a.workspaces.heartbeat("w", old, ttl_s=60),
            "release": lambda: a.workspaces.release("w", old),
        }
        outcome: dict[str, str] = {}
        for name, call in late.items():
            before = b.count()
            try:
                call()
            except ProtocolRefused as exc:
                outcome[name] = f"refused: {type(exc).__name__}"
                assert b.count() == before, name  # a refusal commits nothing
            else:
                outcome[name] = "accepted"
        if all(o.startswith("refused") for o in outcome.values()):
            assert b.head() == head and b.count() == count
            assert (ws / "app.py").read_bytes() == b"v0" and not (ws / "x.txt").exists()
            assert not (ws / "new.txt").exists()
            assert b.workspaces.lease("w").epoch == new.epoch and b.workspaces.lease("w").live
            assert b.verify().ok
        return outcome
    finally:
        a.close()
        b.close()


def test_a_partitioned_worker_whose_lease_expired_is_refused_when_it_comes_back(
        pg_url: str, proxy: PgProxy, tmp_path: Path) -> None:
    outcome = partitioned_worker(pg_url, proxy, tmp_path)
    assert outcome == dict.fromkeys(
        ["append", "publish-receipt", "ack", "admit", "apply", "heartbeat", "release"],
        "refused: StaleEpoch"), outcome
    assert proxy.refused >= 1  # A really was cut off


def test_the_lease_check_catches_a_late_write_without_the_epoch_guard(
        pg_url: str, proxy: PgProxy, tmp_path: Path) -> None:
    """The guarantee removed (the append guard that checks the epoch is live at the
    transaction's time): A's late append under its dead epoch is accepted, and the
    scenario's check reports it."""

    def without_guard(led: Ledger) -> None:
        led._guard = lambda: (lambda tx, event: None)  # type: ignore[method-assign]

    outcome = partitioned_worker(pg_url, proxy, tmp_path, break_guard=without_guard)
    assert outcome["append"] == "accepted"


# === 4. a writer stalled inside its transaction =================================================


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_writer_stalled_inside_its_transaction_holds_others_up_only_for_the_busy_timeout(
        ledger_location: str, store_kind: str) -> None:
    """A writer stops between its inserts and its COMMIT (a pause, a SIGSTOP, the network
    gone after BEGIN): another writer gives up after its busy timeout (`LedgerBusy`), as
    on SQLite, instead of waiting as long as the stall lasts."""
    from ledger.errors import LedgerBusy

    Ledger.init(ledger_location).close()
    stalled, release = threading.Event(), threading.Event()

    def stall(op: str) -> None:
        if op == "commit" and not stalled.is_set():
            stalled.set()
            release.wait(60)

    a = Ledger.open(ledger_location, on_op=stall)
    b = Ledger.open(ledger_location, busy_timeout_ms=1000)
    answer: dict[str, Any] = {}

    def b_appends() -> None:
        start = time.monotonic()
        try:
            answer["recorded"] = b.append(Planned(step="b", attempt=1))
        except LedgerError as exc:
            answer["error"] = exc
        answer["waited_s"] = time.monotonic() - start

    ta = threading.Thread(target=lambda: a.append(Planned(step="a", attempt=1)), daemon=True)
    tb = threading.Thread(target=b_appends, daemon=True)
    try:
        ta.start()
        assert stalled.wait(10)
        tb.start()
        tb.join(6)
        done = dict(answer)
    finally:
        release.set()  # the stall ends: A commits, B (if still waiting) goes on
        ta.join(10)
        tb.join(10)
        a.close()
        b.close()
    assert done, "the second writer was still waiting after 6 s"
    assert isinstance(done.get("error"), LedgerBusy), done


# === the connection cut at every statement of opening ==========================================


def test_a_connection_cut_at_any_statement_of_opening_is_typed(pg_server: Any, pg_url: str,
                                                              monkeypatch: Any) -> None:
    """Found by CI: a server killed while a worker opened the ledger reached the worker as
    psycopg's own OperationalError (the schema check ran outside the error translation), so
    a retry loop catching the ledger's errors died. Every statement `Ledger.open` sends is
    cut in turn — the real session ended by the server (pg_terminate_backend) just before it
    runs — and each cut must come out as `DatabaseUnavailable`, one line, no driver traceback;
    the next open works and sees the same ledger."""
    with Ledger.init(pg_url) as led:
        commit_step(led, "before")
        count = led.count()
    real = psycopg.Connection.execute
    state = {"n": 0, "cut_at": -1, "busy": False}

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not state["busy"]:
            if state["n"] == state["cut_at"]:
                state["busy"] = True
                try:
                    pid = self.info.backend_pid
                    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as side:
                        assert real(side, "SELECT pg_terminate_backend(%s, 5000)",
                                    (pid,)).fetchone()[0]
                finally:
                    state["busy"] = False
            state["n"] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    Ledger.open(pg_url).close()
    statements = state["n"]
    assert statements >= 3, statements  # (the marker, the schema check, the meta read)
    for cut in range(statements):
        state.update(n=0, cut_at=cut)
        with pytest.raises(LedgerError) as info:
            Ledger.open(pg_url).close()
        exc = info.value
        assert type(exc) is DatabaseUnavailable, (cut, exc)
        assert "\n" not in str(exc) and exc.__cause__ is None, (cut, exc)
    state.update(n=0, cut_at=-1)
    with Ledger.open(pg_url) as again:
        assert again.count() == count

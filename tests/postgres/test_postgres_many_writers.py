"""Red-team attacks on the PostgreSQL store's many-writers design (docs/design.md "Many
writers"): a workspace's transaction holds the ledger lock shared and its workspace's
lock, and takes the chain lock only when it first reads the head or writes a shared row.

Attacks that break something fail here until fixed (each docstring says how); the
others guard a property that held under attack:

* an event for a step of w1 that names w2 commits in w2's scope while w1's builder
  stands between its fence and its append (the step fold never compares workspaces);
* lock keys are crc32 of text holding a workspace's name: a name chosen to collide with
  the ledger lock deadlocks its own writers (DeadlockDetected, surfacing as
  DatabaseUnavailable), one colliding with the gc lock waits out every collection;
* a session the server ends under a builder (terminated, or its idle-in-transaction
  timeout) frees the workspace's lock while the builder goes on renaming and deleting;
* `restore` registers a root in one workspace's scope after checking it outside any
  lock; `replan` deduplicates a post-image before it pins it (both stores);
* one stalled builder plus a queued whole-ledger transaction stops every workspace;
* guards: a killed session's retry answers, copy under writers is one snapshot (into
  another schema too, passwords never shown), two workspaces and gc at grace 0 keep
  the ledger whole, one large blob put by two sessions at once is stored once.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from ledger.errors import IllegalTransition, LedgerError
from ledger.events import Rejected
from ledger.step.values import StepPlan, Write

psycopg = pytest.importorskip("psycopg")


def h(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _world(url: str, tmp: Path, names: tuple[str, ...] = ("w1", "w2")
           ) -> tuple[Ledger, dict[str, int]]:
    led = Ledger.init(url)
    epochs = {}
    for name in names:
        d = tmp / f"dir-{len(epochs)}"
        d.mkdir()
        (d / "app.py").write_text("v0")
        led.workspaces.add(name, str(d))
        epochs[name] = led.workspaces.acquire(name, "agent", ttl_s=3600).epoch
    return led, epochs


# -- attack 2: one step id, two workspaces ---------------------------------------------------


def test_an_event_for_a_step_of_w1_naming_w2_does_not_slip_between_w1s_fence_and_its_append(
        pg_url: str, tmp_path: Path) -> None:
    """s1 is planned in w1. While w1's apply of s1 has renamed the post-image into place
    (its builder, holding w1's lock, not the chain), a writer appends `rejected` for s1
    attempt 1 naming w2: a transaction of w2, which w1's lock does not exclude. The step
    fold never compares the event's workspace with the attempt's, so it commits; w1's
    append then meets `rejected` and fails: the file on disk changed, nothing records
    it, and the attempt reads as rejected (nothing applied)."""
    led, epochs = _world(pg_url, tmp_path)
    wsdir = tmp_path / "dir-0"
    assert led.workspaces.admit("w1", epochs["w1"], [StepPlan("s1", [Write("app.py", b"v1", h("v0"))])]) \
        == [None]
    renamed, go = threading.Event(), threading.Event()
    seen: list[str] = []

    def on_op(name: str) -> None:
        seen.append(name)
        if name == "ws-dirfsync" and "ws-rename" in seen and not renamed.is_set():
            renamed.set()
            go.wait(20)

    applier = Ledger.open(pg_url, on_op=on_op)
    other = Ledger.open(pg_url)
    out: dict[str, Any] = {}

    def apply() -> None:
        try:
            out["apply"] = applier.workspaces.apply("s1", epoch=epochs["w1"]).verdict
        except LedgerError as exc:
            out["apply"] = exc

    t = threading.Thread(target=apply)
    t.start()
    try:
        assert renamed.wait(20)
        assert (wsdir / "app.py").read_text() == "v1"  # renamed, not yet recorded
        forged = Rejected(step="s1", attempt=1, workspace="w2", epoch=epochs["w2"],
                          reason="stale_rev", detail="from another workspace")
        try:
            other.append(forged)
            out["forged"] = "committed"
        except IllegalTransition:
            out["forged"] = "refused"
    finally:
        go.set()
        t.join(30)
    try:
        state = led.step("s1").state
        # What must hold: an event of attempt 1 of s1 names s1's workspace, or is refused;
        # and w1's apply records what it renamed.
        assert out == {"forged": "refused", "apply": "applied"}, \
            (out, state, "app.py on disk:", (wsdir / "app.py").read_text())
    finally:
        applier.close()
        other.close()
        led.close()


# -- lock keys: 32-bit crc32 of names a caller chooses ----------------------------------------


def _forge_crc(prefix: bytes, target: int, width: int = 48) -> bytes:
    """A suffix of 'a'/'b' letters that makes crc32(prefix + suffix) == target (crc32 is
    affine over GF(2): solve for which letters to flip)."""
    base = b"a" * width
    c0 = zlib.crc32(prefix + base)
    columns = []
    for i in range(width):
        flipped = base[:i] + b"b" + base[i + 1:]
        columns.append(zlib.crc32(prefix + flipped) ^ c0)
    want = c0 ^ target
    # Gaussian elimination over GF(2): rows are (vector, set of positions)
    basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (vector, mask of positions)
    for i, col in enumerate(columns):
        vec, mask = col, 1 << i
        for bit in sorted(basis, reverse=True):
            if vec >> bit & 1:
                vec ^= basis[bit][0]
                mask ^= basis[bit][1]
        if vec:
            basis[vec.bit_length() - 1] = (vec, mask)
    vec, mask = want, 0
    for bit in sorted(basis, reverse=True):
        if vec >> bit & 1:
            vec ^= basis[bit][0]
            mask ^= basis[bit][1]
    assert vec == 0, "no solution; widen"
    suffix = bytes(b"b"[0] if mask >> i & 1 else b"a"[0] for i in range(width))
    assert zlib.crc32(prefix + suffix) == target
    return suffix


def _colliding_workspace(schema: str, lock: str) -> str:
    """A workspace name whose lock key is the key of the ledger's lock `lock`."""
    target = zlib.crc32(f"{lock}:{schema}".encode())
    prefix = f"workspace:{schema}:ws-".encode()
    return "ws-" + _forge_crc(prefix, target).decode()


def test_a_workspace_named_to_collide_with_the_ledger_lock_does_not_deadlock_its_writers(
        pg_url: str, tmp_path: Path) -> None:
    """Lock keys are crc32 of text that holds the workspace's name: a name can be chosen
    whose key is the ledger lock's. A transaction of that workspace then takes the ledger
    lock shared and, as "its workspace's lock", exclusive; two of them at once each hold
    the shared lock the other's exclusive waits for: PostgreSQL's deadlock detector
    kills one, surfacing as DatabaseUnavailable ("the connection was lost"). (Three
    writers that start together meet it at once; two in a loop within a few seconds.)"""
    from ledger.store.postgres import _lock_key
    name = _colliding_workspace("public", "ledger")
    assert _lock_key(f"workspace:public:{name}") == _lock_key("ledger:public")
    led, epochs = _world(pg_url, tmp_path, (name,))
    errors: list[BaseException] = []
    stop = time.monotonic() + 10

    def beat() -> None:
        mine = Ledger.open(pg_url)
        try:
            while time.monotonic() < stop and not errors:
                mine.workspaces.heartbeat(name, epochs[name], ttl_s=3600)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            mine.close()

    threads = [threading.Thread(target=beat) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    led.close()
    problems = [f"{type(e).__name__}: {e}" for e in errors]
    assert problems == []


def test_a_workspace_named_to_collide_with_the_gc_lock_is_not_blocked_by_a_collector(
        pg_url: str, tmp_path: Path) -> None:
    """The same with the collector's lock (a session lock `gc` holds for its whole run,
    docs/design.md "GC"): every transaction of that workspace waits for the run to end
    (holding the ledger lock shared, so the collector's own transactions wait for it in
    turn, a cycle PostgreSQL cannot see: one side's lock timeout breaks it)."""
    from ledger.errors import LedgerBusy
    from ledger.gc.collector import collector_lock
    from ledger.store.postgres import _lock_key
    name = _colliding_workspace("public", "gc")
    assert _lock_key(f"workspace:public:{name}") == _lock_key("gc:public")
    led, epochs = _world(pg_url, tmp_path, (name,))
    writer = Ledger.open(pg_url, busy_timeout_ms=1500)
    try:
        with collector_lock(led):  # what `steptrail gc` holds while it runs
            try:
                writer.workspaces.heartbeat(name, epochs[name], ttl_s=3600)
                outcome = "committed"
            except LedgerBusy as exc:
                outcome = f"LedgerBusy: {exc}"
        assert outcome == "committed"
    finally:
        writer.close()
        led.close()


# -- a registration of one workspace's scope: restore ------------------------------------------


def test_a_restore_and_an_add_at_once_do_not_register_overlapping_roots(
        pg_url: str, tmp_path: Path) -> None:
    """`restore` records `workspace-restored` (the workspace's new root: a registration) in
    a transaction of that workspace, having checked the root against the others before
    it; `add_workspace` checks under the whole ledger's lock. An add of a directory inside
    the restore's target, between the restore's check and its event, sees no root there
    yet and commits; then the restore commits: w1's root contains w3's."""
    from ledger.errors import WorkspaceOverlap
    led, epochs = _world(pg_url, tmp_path, ("w1",))
    assert led.workspaces.admit("w1", epochs["w1"], [StepPlan("s1", [Write("sub/x.py", b"x1", None)])]) \
        == [None]
    assert led.workspaces.apply("s1", epoch=epochs["w1"]).verdict == "applied"
    led.publish("s1")
    led.ack("s1")
    led.workspaces.release("w1", epochs["w1"])
    target = tmp_path / "restored"
    writing, go = threading.Event(), threading.Event()

    def on_op(name: str) -> None:
        if name == "ws-rename" and not writing.is_set():
            writing.set()  # the restore is writing its files: its checks are behind it
            go.wait(20)

    restorer = Ledger.open(pg_url, on_op=on_op)
    out: dict[str, Any] = {}

    def restore() -> None:
        try:
            out["restore"] = restorer.workspaces.restore("w1", str(target)).seq
        except LedgerError as exc:
            out["restore"] = exc

    t = threading.Thread(target=restore)
    t.start()
    try:
        assert writing.wait(20)
        assert (target / "sub").is_dir()
        try:
            led.workspaces.add("w3", str(target / "sub"))
            out["add"] = "added"
        except WorkspaceOverlap as exc:
            out["add"] = exc
    finally:
        go.set()
        t.join(30)
    try:
        roots = {r.name: r.root for r in led.workspaces.list()}
        inside = [(a, b) for a in roots for b in roots if a != b
                  and roots[b].startswith(roots[a].rstrip("/") + "/")]
        assert inside == [], (roots, out)
    finally:
        restorer.close()
        led.close()


# -- attack 4: a session killed while it holds the workspace's lock, not the chain ------------


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]


def test_a_fence_whose_session_was_killed_does_not_delete_after_the_next_epoch_settled(
        pg_url: str, tmp_path: Path) -> None:
    """A worker's apply has checked its fence (epoch live, revs, bytes), exchanged its
    first write and read its epoch before the second (a delete); its session ends
    (killed by an operator, by a failover). The file work holds no lock in any case
    (docs/design.md "Epochs and leases"). A rescuer takes a new epoch and settles the
    attempt: the first write is put back, the second had not happened. Then the worker
    goes on: a rename would find its staged file gone (settling removed the older
    epoch's), but a delete needs none — the one exchange a frozen worker may land after
    a takeover: old.py is moved aside after the new epoch settled. The worker must then
    find its epoch dead (at its commit) and put old.py back itself: the ledger, which
    says the attempt is compensated, says old.py is there. (Before the write lock
    covered commits only, the worker heard DatabaseUnavailable at its next round trip
    inside the transaction, and put it back then.)"""
    from ledger.errors import DatabaseUnavailable, StaleEpoch
    led, epochs = _world(pg_url, tmp_path, ("w1",))
    wsdir = tmp_path / "dir-0"
    (wsdir / "old.py").write_text("old")
    plan = StepPlan("s1", [Write("app.py", b"v1", h("v0")), Write("old.py", None, h("old"))])
    assert led.workspaces.admit("w1", epochs["w1"], [plan]) == [None]
    paused, go = threading.Event(), threading.Event()
    seen: list[str] = []
    pid: list[int] = []
    holder: list[Ledger] = []

    def on_op(name: str) -> None:
        seen.append(name)
        if name == "ws-rename" and seen.count("ws-rename") == 2 and not paused.is_set():
            pid.append(holder[0].storage._conn.info.backend_pid)  # type: ignore[attr-defined]
            paused.set()  # fenced, first write exchanged, about to move old.py aside
            go.wait(20)

    worker = Ledger.open(pg_url, on_op=on_op)
    holder.append(worker)
    out: dict[str, Any] = {}

    def apply() -> None:
        try:
            out["apply"] = worker.workspaces.apply("s1", epoch=epochs["w1"]).verdict
        except LedgerError as exc:
            out["apply"] = exc

    t = threading.Thread(target=apply)
    t.start()
    rescuer = Ledger.open(pg_url)
    try:
        assert paused.wait(20)
        _terminate(pg_url, pid[0])
        lease = rescuer.workspaces.acquire("w1", "rescuer", ttl_s=3600, force=True)
        assert lease.settled == ("s1",)
        assert (wsdir / "app.py").read_text() == "v0"  # put back by the settling
        assert (wsdir / "old.py").read_text() == "old"
    finally:
        go.set()
        t.join(30)
    try:
        assert isinstance(out["apply"], StaleEpoch | DatabaseUnavailable), out
        assert rescuer.step("s1").state == "compensated"
        # the ledger says s1 is undone and old.py untouched: the disk must agree
        assert (wsdir / "old.py").exists(), "the killed worker deleted old.py after epoch" \
            f" {lease.epoch} settled s1"
    finally:
        worker.close()
        rescuer.close()
        led.close()


def test_a_killed_session_frees_its_workspace_and_the_retry_answers(
        pg_url: str, tmp_path: Path) -> None:
    """Guard (attack 4): w1's apply stalls in its builder having renamed its write (w1's
    lock held, not the chain's); a whole step of w2 commits meanwhile; the stalled
    session is killed; the worker hears DatabaseUnavailable and takes back what it had
    exchanged (its session, and so its lock, is gone: a takeover may own the files); its
    retry, same journal key, applies once, and the ledger verifies."""
    from ledger.errors import DatabaseUnavailable
    from ledger.invariants import check
    led, epochs = _world(pg_url, tmp_path)
    assert led.workspaces.admit("w1", epochs["w1"], [StepPlan("s1", [Write("app.py", b"v1", h("v0"))])]) \
        == [None]
    paused, go = threading.Event(), threading.Event()
    seen: list[str] = []
    pid: list[int] = []
    holder: list[Ledger] = []

    def on_op(name: str) -> None:
        seen.append(name)
        if name == "ws-dirfsync" and "ws-rename" in seen and not paused.is_set():
            pid.append(holder[0].storage._conn.info.backend_pid)  # type: ignore[attr-defined]
            paused.set()
            go.wait(20)

    worker = Ledger.open(pg_url, on_op=on_op)
    holder.append(worker)
    out: dict[str, Any] = {}

    def apply() -> None:
        try:
            out["apply"] = worker.workspaces.apply("s1", epoch=epochs["w1"]).verdict
        except LedgerError as exc:
            out["apply"] = exc

    t = threading.Thread(target=apply)
    t.start()
    other = Ledger.open(pg_url, busy_timeout_ms=5000)
    try:
        assert paused.wait(20)
        started = time.monotonic()
        assert other.workspaces.admit("w2", epochs["w2"], [StepPlan("t1", [Write("app.py", b"x", h("v0"))])]) \
            == [None]
        assert other.workspaces.apply("t1", epoch=epochs["w2"]).verdict == "applied"
        other.publish("t1")
        other.ack("t1")
        assert time.monotonic() - started < 4  # w2 never waited for w1's stalled builder
        _terminate(pg_url, pid[0])
    finally:
        go.set()
        t.join(30)
    try:
        assert isinstance(out["apply"], DatabaseUnavailable), out
        # its session ended inside the builder: what it had exchanged went back (a
        # takeover may own the files by now), and the retry applies anew
        assert (tmp_path / "dir-0" / "app.py").read_bytes() == b"v0"
        again = worker.workspaces.apply("s1", epoch=epochs["w1"])
        assert again.verdict == "applied" and again.receipt is not None
        assert not again.receipt.settled
        assert worker.workspaces.apply("s1", epoch=epochs["w1"]).verdict == "deduped"
        worker.publish("s1")
        worker.ack("s1")
        report = led.verify()
        assert report.ok, report.findings
        assert check(led.log.read()) == []
    finally:
        worker.close()
        other.close()
        led.close()


# -- attack 5: copy while writers write ---------------------------------------------------------


BIG = 70 * 1024  # above the default inline threshold: chunk rows


def _artifact_step(led: Ledger, step: str, data: bytes) -> None:
    led.plan(step)
    row = led.step(step)
    led.store(step, row.attempt, "out.bin", data)
    led.publish(step)
    led.ack(step)


def test_copy_while_writers_write_is_one_snapshot_into_another_schema(
        pg_url: str, pg_server: Any, tmp_path: Path) -> None:
    """Guard (attack 5): `copy` of a PostgreSQL ledger while a writer keeps committing
    large artifacts, and one more stored and published after the copy's snapshot began,
    into a database whose search_path names another schema: the copy verifies, its head
    is one the source really had, and every blob its manifests name is in it."""
    from ledger.copying import copy_ledger
    from ledger.gc.audit import audit
    led = Ledger.init(pg_url)
    for i in range(3):
        _artifact_step(led, f"pre{i}", bytes([i]) * BIG)
    dest_db = "rt_copy_dest_other_schema"
    dest_url = pg_server.create_database(dest_db)
    with psycopg.connect(dest_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA other")
    dest = dest_url + "?options=-csearch_path%3Dother"
    stop = threading.Event()
    errors: list[BaseException] = []
    done: list[str] = []

    def writer() -> None:
        mine = Ledger.open(pg_url)
        try:
            i = 0
            while not stop.is_set():
                _artifact_step(mine, f"bg{i}", (b"bg%d " % (i % 3)) * (BIG // 4))
                done.append(f"bg{i}")
                i += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            mine.close()

    late: list[str] = []

    def progress(_what: str, _n: int) -> None:
        if not late:  # inside the copy: the source's snapshot is taken
            late.append("late")
            _artifact_step(led, "late", b"late " * (BIG // 4))

    t = threading.Thread(target=writer)
    t.start()
    try:
        while len(done) < 2 and not errors:
            time.sleep(0.05)
        report = copy_ledger(pg_url, dest, progress=progress)
    finally:
        stop.set()
        t.join(60)
    try:
        assert errors == []
        assert late == ["late"]
        with Ledger.open(dest) as copy:
            v = copy.verify()
            assert v.ok, v.findings
            assert f"{v.head_seq}:{v.head_hash}" == report.head
            seq = v.head_seq
            real = next(led.log.read(seq - 1, limit=1))
            assert real.seq == seq and real.hash.hex() == v.head_hash
            entries = copy.storage.view.entry_rows()
            assert len(entries) >= 5
            for row in entries:
                digest = next(c for c in row if isinstance(c, str) and len(c) == 64)
                copy.check_blob(digest, copy.storage.view.blob_size(digest)[0])
            a = audit(copy, deep=True)
            assert a.ok, a
            assert copy.find_step("late") is None  # published after the snapshot
        with psycopg.connect(dest_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM other.events").fetchone()[0] == seq
            assert conn.execute("SELECT to_regclass('public.events')").fetchone()[0] is None
    finally:
        led.close()
        with contextlib.suppress(Exception):
            pg_server.drop_database(dest_db)


# -- attacks 1 and 3: workers of two workspaces, a collector at grace 0, registrations --------


_WORKER = r'''
import json, sys, time, traceback, os
sys.path.insert(0, {root!r})
from ledger import Ledger
from ledger.step.values import StepPlan
from ledger.gc.collector import collect

def pool(i):
    # both workspaces write the same contents in the same order: the same digests, at once
    if i % 2:
        return (b"big %d " % (i // 2)) * 12000          # ~100 KiB: chunk rows
    return b"small %d" % (i // 2)                        # inline

role, url, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
led = Ledger.open(url, busy_timeout_ms=20000)
deadline = time.monotonic() + seconds
out = {{"role": role, "steps": 0, "errors": []}}
try:
    if role.startswith("ws:"):
        name, epoch = role[3:].split("@")
        epoch = int(epoch)
        i = 0
        while time.monotonic() < deadline:
            step = f"{{name}}-s{{i}}"
            read = led.workspaces.read_file(name, "app.py")
            plan = StepPlan(step, [read.write(pool(i))], run=name)
            assert led.workspaces.admit(name, epoch, [plan]) == [None]
            verdict = led.workspaces.apply(step, epoch=epoch).verdict
            assert verdict == "applied", verdict
            if i % 3 == 2:
                led.workspaces.compensate(step, epoch=epoch, reason="undo")
            else:
                led.publish(step)
                led.ack(step)
            out["steps"] += 1
            i += 1
    else:
        k = 0
        while time.monotonic() < deadline:
            collect(led, grace_s=0, force=True, wait=True)
            d = os.path.join({tmp!r}, f"extra{{k}}")
            os.mkdir(d)
            led.workspaces.add(f"extra{{k}}", d)
            step = f"g{{k}}"
            led.plan(step)
            led.store(step, 1, "x.bin", pool(k))
            led.workspaces.compensate(step, reason="gc fodder")
            for ws, ep in (("w1", 1), ("w2", 1)):
                led.workspaces.settle(ws, ep)
            out["steps"] += 1
            k += 1
        collect(led, grace_s=0, force=True, wait=True)
except BaseException as exc:
    out["errors"].append(f"{{type(exc).__name__}}: {{exc}}")
    out["traceback"] = traceback.format_exc()
finally:
    led.close()
print(json.dumps(out))
'''


def test_two_workspaces_and_a_collector_at_grace_zero_keep_the_ledger_whole(
        pg_url: str, tmp_path: Path) -> None:
    """Guard (attacks 1, 3): a process per workspace (w1, w2) admits, applies, publishes
    or compensates steps whose contents are the same digests at the same moment (inline
    and chunk rows), while a third runs `gc` with grace 0, registers workspaces,
    compensates artifact steps of no workspace and settles: no worker sees an error, the
    chain verifies, no invariant breaks, and the audit finds every referenced blob."""
    import json
    import subprocess
    import sys

    from ledger.gc.audit import audit
    from ledger.invariants import check
    root = str(Path(__file__).resolve().parents[2])
    led, epochs = _world(pg_url, tmp_path)
    assert epochs == {"w1": 1, "w2": 1}
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=root, tmp=str(tmp_path)))
    roles = ["ws:w1@1", "ws:w2@1", "gc"]
    procs = [subprocess.Popen([sys.executable, str(script), role, pg_url, "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for role in roles]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=90)
        assert p.returncode == 0, stderr
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    try:
        problems = {r["role"]: (r["errors"], r.get("traceback", "")[-800:])
                    for r in results if r["errors"]}
        assert problems == {}
        assert all(r["steps"] >= 3 for r in results), results
        assert any(True for _ in led.log.read(kind="blob-collected"))  # gc did collect
        v = led.verify()
        assert v.ok, v.findings
        assert check(led.log.read()) == []
        a = audit(led, deep=True, grace_s=0)
        assert a.ok, a
    finally:
        led.close()


# -- attack 3: a collector at grace 0 and a writer that deduplicates before it pins ------------


def test_replan_pins_its_post_image_before_a_collector_can_take_it(
        pg_url: str, tmp_path: Path) -> None:
    """`replan` re-stamps an ended (here rejected) attempt: its large post-image, which
    the ended attempt no longer pins, is "put again" (the dedup path) and only then
    pinned by the new attempt's commit. A collector that runs in between (another
    process; grace 0 here, or any ended attempt older than the 24 h default) sees an
    unpinned orphan and deletes it: the new attempt is planned, pinned, and its
    post-image is gone, so it can never apply (docs/design.md "GC": pins are committed
    before a blob is written or deduplicated)."""
    from ledger.gc.collector import collect
    led, epochs = _world(pg_url, tmp_path, ("w1",))
    wsdir = tmp_path / "dir-0"
    post = b"new content " * 8000  # ~94 KiB: chunk rows
    assert led.workspaces.admit("w1", epochs["w1"], [StepPlan("s1", [Write("app.py", post, h("v0"))])]) \
        == [None]
    (wsdir / "app.py").write_text("someone else")
    assert led.workspaces.apply("s1", epoch=epochs["w1"]).verdict == "rejected:pre_hash"
    (wsdir / "app.py").write_text("v0")  # put back: the plan's pre-image holds again
    collector = Ledger.open(pg_url)
    replanner = Ledger.open(pg_url)
    files = replanner.storage.files  # type: ignore[attr-defined]
    real_put = files.put_stream
    collected: list[int] = []

    def put_stream(chunks: Any, digest: str) -> Any:
        result = real_put(chunks, digest)
        # another process's `steptrail gc --grace 0 --force` runs now
        collected.append(collect(collector, grace_s=0, force=True).collected)
        return result

    files.put_stream = put_stream
    try:
        attempt = replanner.workspaces.replan("s1", epoch=epochs["w1"])
        assert attempt == 2
        assert collected and collected[0] >= 0
        assert led.storage.view.blob_size(h(post)) is not None, \
            "the replanned attempt's pinned post-image was collected"
        assert led.workspaces.apply("s1", epoch=epochs["w1"]).verdict == "applied"
    finally:
        files.put_stream = real_put
        replanner.close()
        collector.close()
        led.close()


@pytest.mark.parametrize("how", ["terminated"])
def test_a_fence_whose_session_was_killed_does_not_rename_over_a_later_committed_step(
        pg_url: str, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same hole without a new epoch: once the server has freed w1's lock, the next
    transaction of w1 (another step of the same live epoch) fences, renames and commits
    app.py; the killed worker's builder then renames its own app.py over it. The ledger
    says app.py holds s2's committed bytes; the disk holds s1's, which nothing records.
    (A builder merely slower than the idle timeout is not ended at all:
    `test_a_builder_slower_than_the_idle_timeout_keeps_its_workspaces_lock`.)"""
    led, epochs = _world(pg_url, tmp_path, ("w1",))
    wsdir = tmp_path / "dir-0"
    (wsdir / "a.py").write_text("a0")
    epoch = epochs["w1"]
    s1 = StepPlan("s1", [Write("a.py", b"a1", h("a0")), Write("app.py", b"v1", h("v0"))])
    assert led.workspaces.admit("w1", epoch, [s1]) == [None]
    assert led.workspaces.admit("w1", epoch, [StepPlan("s2", [Write("app.py", b"s2", h("v0"))])]) == [None]
    paused, go = threading.Event(), threading.Event()
    seen: list[str] = []
    pid: list[int] = []
    holder: list[Ledger] = []

    def on_op(name: str) -> None:
        seen.append(name)
        if name == "ws-rename" and seen.count("ws-rename") == 2 and not paused.is_set():
            pid.append(holder[0].storage._conn.info.backend_pid)  # type: ignore[attr-defined]
            paused.set()  # a.py exchanged; app.py next
            go.wait(20)

    worker = Ledger.open(pg_url, on_op=on_op)
    holder.append(worker)
    out: dict[str, Any] = {}

    def apply() -> None:
        try:
            out["apply"] = worker.workspaces.apply("s1", epoch=epoch).verdict
        except LedgerError as exc:
            out["apply"] = exc

    t = threading.Thread(target=apply)
    t.start()
    other = Ledger.open(pg_url)
    try:
        assert paused.wait(20)
        if how == "terminated":
            _terminate(pg_url, pid[0])
        assert other.workspaces.apply("s2", epoch=epoch).verdict == "applied"
        other.publish("s2")
        other.ack("s2")
        assert (wsdir / "app.py").read_text() == "s2"
    finally:
        go.set()
        t.join(30)
    try:
        assert isinstance(out["apply"], LedgerError), out  # the append met the ended session
        committed = other.workspaces.paths("w1")["app.py"][1]
        assert committed == h("s2")
        assert (wsdir / "app.py").read_text() == "s2", \
            "the killed worker renamed s1's app.py over s2's committed one"
    finally:
        worker.close()
        other.close()
        led.close()


def test_a_builder_slower_than_the_idle_timeout_keeps_its_workspaces_lock(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's idle-in-transaction timeout (1 s here) never ends a write transaction
    (the write transaction sets none): a builder slower than it — hashing, renaming —
    still holds its workspace's lock, and its apply commits."""
    import ledger.store.postgres as pg
    monkeypatch.setattr(pg, "IDLE_IN_TRANSACTION_MS", 1000)
    led, epochs = _world(pg_url, tmp_path, ("w1",))
    epoch = epochs["w1"]
    assert led.workspaces.admit("w1", epoch, [StepPlan("s1", [Write("app.py", b"v1", h("v0"))])]) == [None]
    slept: list[str] = []

    def on_op(name: str) -> None:
        if name == "ws-rename" and not slept:
            slept.append(name)
            time.sleep(2.0)  # idle inside the transaction, twice the timeout

    worker = Ledger.open(pg_url, on_op=on_op)
    try:
        assert worker.workspaces.apply("s1", epoch=epoch).verdict == "applied"
        assert worker.verify().ok
    finally:
        worker.close()
        led.close()


def test_a_read_transaction_the_server_ended_for_idling_is_database_unavailable(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server ends a session idle inside a read transaction longer than the store's
    timeout (FATAL: psycopg's InternalError subclass IdleInTransactionSessionTimeout):
    the caller hears DatabaseUnavailable, as for any lost connection, not a disk failure."""
    import ledger.store.postgres as pg
    from ledger.errors import DatabaseUnavailable
    Ledger.init(pg_url).close()
    monkeypatch.setattr(pg, "IDLE_IN_TRANSACTION_MS", 300)
    led = Ledger.open(pg_url)
    try:
        with pytest.raises(LedgerError) as raised:
            with led.storage.read() as view:
                time.sleep(1.0)
                view.head()
        assert isinstance(raised.value, DatabaseUnavailable), repr(raised.value)
    finally:
        led.close()


def test_a_stalled_builder_of_w1_and_a_queued_registration_do_not_stop_w2(
        pg_url: str, tmp_path: Path) -> None:
    """Liveness (attack 1, once a strict xfail): a transaction of w1 is in its builder
    (ledger lock shared, w1's lock) — a slow builder (an apply's was one, before its
    file work left the transaction: docs/design.md "Epochs and leases"); an
    `add_workspace` (the ledger lock exclusive) waits for it; then a heartbeat of w2
    arrives. PostgreSQL grants locks in queue order, so had the registration queued, w2
    would wait behind it for w1's builder and hear LedgerBusy: a whole-ledger
    transaction asks without queuing first (`EXCLUSIVE_POLL_MS`), so w2 commits at once,
    and the registration gets its turn when w1's transaction is done."""
    from ledger.errors import LedgerBusy
    from ledger.events import LeaseRenewed
    from ledger.store import Scope
    led, epochs = _world(pg_url, tmp_path)
    paused, go = threading.Event(), threading.Event()

    def slow(tx: Any, now: int) -> list[Any]:
        row = tx.workspace("w1")  # w1's state read, under w1's lock
        paused.set()
        go.wait(20)
        return [LeaseRenewed(workspace="w1", epoch=epochs["w1"],
                             expires_ns=max(row.expires_ns, now + 3600 * 10**9))]

    worker = Ledger.open(pg_url)
    registrar = Ledger.open(pg_url)
    w2 = Ledger.open(pg_url, busy_timeout_ms=2000)
    (tmp_path / "w9").mkdir()
    out: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            out[name] = fn()
        except LedgerError as exc:
            out[name] = exc

    ta = threading.Thread(target=run, args=("apply", lambda: type(worker.log.append(
        slow, scope=Scope("w1"))[0].event).__name__))
    ta.start()
    tg = threading.Thread(target=run, args=("add", lambda: registrar.workspaces.add(
        "w9", str(tmp_path / "w9")).name))
    try:
        assert paused.wait(20)
        tg.start()
        with psycopg.connect(pg_url, autocommit=True) as conn:  # the registration waits
            for _ in range(100):
                if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE"
                                " '%pg_try_advisory_xact_lock%' AND pid <> pg_backend_pid()"
                                ).fetchone()[0]:
                    break
                time.sleep(0.02)
            else:
                raise AssertionError("the registration never asked for the ledger lock")
        try:
            w2.workspaces.heartbeat("w2", epochs["w2"], ttl_s=3600)
            out["w2"] = "committed"
        except LedgerBusy as exc:
            out["w2"] = exc
    finally:
        go.set()
        ta.join(30)
        tg.join(30)
    try:
        assert out["apply"] == "LeaseRenewed" and out["add"] == "w9", out
        assert out["w2"] == "committed", out
    finally:
        worker.close()
        registrar.close()
        w2.close()
        led.close()


def test_copy_with_a_password_in_the_url_never_prints_it_and_refuses_itself(
        pg_url: str, pg_server: Any, tmp_path: Path) -> None:
    """Guard (attack 5): `steptrail copy` between URLs that carry a password (the server
    trusts the role, so any password connects): the report, the refusal of a destination
    that is not new, and the refusal of a ledger copied into itself show `***`."""
    from conftest import run_cli
    secret = "hunter2-Sekr3t"
    led = Ledger.init(pg_url)
    _artifact_step(led, "a", b"a" * BIG)
    led.close()
    dest_db = "rt_copy_dest_pw"
    dest = pg_server.create_database(dest_db)
    with_pw = {u: u.replace("://steptrail@", f"://steptrail:{secret}@", 1)
               for u in (pg_url, dest)}
    assert all(secret in u for u in with_pw.values())
    try:
        outs = [run_cli(["copy", with_pw[pg_url], with_pw[dest], "--json"]),
                run_cli(["copy", with_pw[pg_url], with_pw[dest], "--json"]),
                run_cli(["copy", with_pw[pg_url], with_pw[pg_url], "--json"]),
                run_cli(["copy", with_pw[pg_url] + f"&password={secret}"
                         if "?" in pg_url else with_pw[pg_url] + f"?password={secret}",
                         str(tmp_path / "c.db")])]
        assert [o.code for o in outs] == [0, 2, 2, 0], outs
        assert outs[0].json["ok"] and outs[0].json["same_head"]
        for o in outs:
            assert secret not in o.out + o.err, o
    finally:
        with contextlib.suppress(Exception):
            pg_server.drop_database(dest_db)


def test_one_large_blob_put_by_two_sessions_at_once_is_stored_once_intact(
        pg_url: str) -> None:
    """Guard (attack 3): two sessions put the same 3-chunk blob, the second starting while
    the first's chunk rows are uncommitted: the second's first chunk insert waits on the
    first's row, meets the unique key once it commits, and answers from the committed
    copy (re-hashed); both return, the blob reads back whole, nothing is duplicated."""
    from ledger.blobs import CHUNK
    Ledger.init(pg_url).close()
    a, b = Ledger.open(pg_url), Ledger.open(pg_url)
    data = bytes(range(256)) * (3 * CHUNK // 256)
    digest = h(data)
    inside, results, errors = threading.Event(), {}, []

    def slow() -> Any:
        for i in range(0, len(data), CHUNK):
            yield data[i:i + CHUNK]
            inside.set()
            time.sleep(0.3)

    def put(name: str, led: Ledger, chunks: Any) -> None:
        try:
            results[name] = led.blobs.put_stream(chunks, digest)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ta = threading.Thread(target=put, args=("a", a, slow()))
    ta.start()
    assert inside.wait(10)
    tb = threading.Thread(target=put, args=("b", b, iter([data])))
    tb.start()
    ta.join(30)
    tb.join(30)
    try:
        assert errors == []
        assert {results["a"].deduped, results["b"].deduped} == {False, True}
        assert a.read_blob(digest) == data
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM blob_chunks WHERE digest = %s",
                                (digest,)).fetchone()[0] == 3
    finally:
        a.close()
        b.close()

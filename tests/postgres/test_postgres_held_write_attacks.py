"""Attacks on the PostgreSQL store's held writes (`PgStore._defer`), by a red team.

What they found, fixed (each failed before): a held write refused at COMMIT with an
error psycopg classes as `OperationalError` (a lock timeout, a statement timeout, a
deadlock, a program limit) was reported as a lost connection ("may or may not have
committed") and never rolled back, so the next read met an aborted transaction; a
unique violation of a held write escaped as a raw driver error; a COMMIT the server
answered with ROLLBACK (a transaction whose failed statement the caller had caught)
was reported done. Now: a lost connection alone is "may or may not"; an error the
server answered is a typed error with nothing committed, the transaction rolled back;
a COMMIT answered ROLLBACK is a StorageFailure. The rest are attacks that held: group
commit parts, flushes of their own (the pulse, the size cap), a cut connection, hostile
bytes with either string syntax, redelivery, two writers of the same blobs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ledger import Ledger, run_step
from ledger.errors import DatabaseUnavailable, LedgerBusy, LedgerError
from ledger.store import Scope

psycopg = pytest.importorskip("psycopg")


def _plant(url: str, table: str, errcode: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION red_refusal() RETURNS trigger LANGUAGE plpgsql AS"
                     f" $$ BEGIN RAISE EXCEPTION 'red refusal' USING ERRCODE = '{errcode}';"
                     " END $$")
        conn.execute(f"CREATE TRIGGER red BEFORE INSERT OR UPDATE ON {table}"
                     " FOR EACH ROW EXECUTE FUNCTION red_refusal()")


def _lift(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER red ON {table}")
        conn.execute("DROP FUNCTION red_refusal()")


@pytest.mark.parametrize("errcode", ["lock_not_available", "query_canceled",
                                     "deadlock_detected", "program_limit_exceeded"])
def test_a_held_write_refused_at_commit_is_typed_and_the_ledger_keeps_working(
        pg_url: str, errcode: str) -> None:
    """The step's projection row (held, sent with the COMMIT) refused with an error
    psycopg classes as OperationalError (lock timeout, statement timeout, deadlock, a
    program limit such as an index row too large)."""
    with Ledger.init(pg_url) as led:
        run_step(led, "before", {"a.bin": b"first"})
        with led.storage.read() as view:
            head = view.head()
        _plant(pg_url, "steps", errcode)
        with pytest.raises(Exception) as caught:
            run_step(led, "refused", {"b.bin": b"second, refused"})
        err = caught.value
        assert isinstance(err, LedgerError), f"untyped: {type(err).__module__}.{type(err).__name__}: {err}"
        if errcode in ("lock_not_available", "deadlock_detected"):
            assert isinstance(err, LedgerBusy), repr(err)
        assert "may or may not have committed" not in str(err), repr(err)
        _lift(pg_url, "steps")
        # the ledger object keeps working: a read, then a step
        with led.storage.read() as view:
            assert view.head() == head
            assert view.step("refused") is None
        run_step(led, "after", {"c.bin": b"third"})
        assert led.verify().ok


def test_a_unique_violation_of_a_held_write_is_not_a_raw_psycopg_error(pg_url: str) -> None:
    """Claim 1 says never a raw psycopg error. PRE-EXISTING (fails on ed5961c too):
    `_translated` lets UniqueViolation through for `_insert_many`, and `_end` re-raises a
    held write's error through `_translated`, so a UniqueViolation on a projection row
    escapes run_step as psycopg.errors.UniqueViolation."""
    with Ledger.init(pg_url) as led:
        run_step(led, "before", {"a.bin": b"first"})
        _plant(pg_url, "steps", "unique_violation")
        with pytest.raises(Exception) as caught:
            run_step(led, "refused", {"b.bin": b"second, refused"})
        _lift(pg_url, "steps")
        assert isinstance(caught.value, LedgerError), repr(caught.value)


def test_a_lock_timeout_on_a_held_write_at_commit_is_ledger_busy_and_rolled_back(
        pg_url: str) -> None:
    """No planted trigger: another session holds a SHARE lock on `steps` (what a plain
    CREATE INDEX takes) past the writer's busy timeout. The step's projection row rides
    with the COMMIT, waits, and the server refuses it (lock_timeout). Before held writes
    this was LedgerBusy from the INSERT's own round trip; the transaction certainly did
    not commit. The ledger must then keep working."""
    with Ledger.init(pg_url, busy_timeout_ms=300) as led:
        run_step(led, "before", {"a.bin": b"first"})
        with led.storage.read() as view:
            head = view.head()
        blocker = psycopg.connect(pg_url, autocommit=True)
        try:
            blocker.execute("BEGIN")
            blocker.execute("LOCK TABLE steps IN SHARE MODE")
            with pytest.raises(LedgerError) as caught:
                run_step(led, "refused", {"b.bin": b"second"})
            err = caught.value
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        problems = []
        if not isinstance(err, LedgerBusy):
            problems.append(f"not LedgerBusy: {type(err).__name__}: {err}")
        # the ledger object keeps working once the lock is gone
        try:
            with led.storage.read() as view:
                if view.head() != head:
                    problems.append("the refused step committed")
        except LedgerError as exc:
            problems.append(f"the next read failed: {exc!r}")
        try:
            led.storage.view.meta("ledger_id")
        except LedgerError as exc:
            problems.append(f"a read outside a transaction failed: {exc!r}")
        try:
            run_step(led, "after", {"c.bin": b"third"})
        except LedgerError as exc:
            problems.append(f"the next step failed: {exc!r}")
        assert not problems, problems
        assert led.verify().ok


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_chain_lock_held_to_commit_times_out_as_ledger_busy(pg_url: str) -> None:
    """A workspace transaction whose only write is held: the chain lock statement rides
    with the COMMIT. Another session holds the chain lock past the busy timeout: the
    writer must hear LedgerBusy (claim 7), not 'may or may not have committed', and its
    connection must be usable after."""
    import ledger.store.postgres as pg

    with Ledger.init(pg_url, busy_timeout_ms=300) as led:
        store = led.storage
        blocker = psycopg.connect(pg_url, autocommit=True)
        try:
            blocker.execute("BEGIN")
            blocker.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                            (pg.LOCK_CLASS, store._chain_key))  # type: ignore[attr-defined]
            with pytest.raises(LedgerError) as caught:
                with store.transaction(Scope(workspace="w")) as tx:
                    tx.set_meta("red-chain", "x")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        problems = []
        if not isinstance(caught.value, LedgerBusy):
            problems.append(f"{type(caught.value).__name__}: {caught.value}")
        try:
            assert store.view.meta("red-chain") is None
        except LedgerError as exc:
            problems.append(f"next read: {type(exc).__name__}: {exc}")
        assert not problems, problems


def test_group_commit_a_refused_part_after_held_inline_rows_undoes_only_that_part(
        pg_url: str) -> None:
    """Three callers in one group transaction, each with an inline blob held: the middle
    one is refused (IdempotencyConflict) after its inline row and savepoint were held.
    The others' events and inline rows commit; the refused part's row does not."""
    from ledger import Planned
    from ledger.errors import IdempotencyConflict
    from ledger.log import _Call

    with Ledger.init(pg_url) as led:
        led.append(Planned(step="dup", attempt=1))
        log = led._log  # type: ignore[attr-defined]
        blobs = {k: f"inline of {k} '; $$ %s".encode() for k in ("a", "b", "c")}
        calls = [
            _Call(log._prepare([Planned(step="a", attempt=1)]), None,
                  {_sha(blobs["a"]): blobs["a"]}, 0, None),
            _Call(log._prepare([Planned(step="dup", attempt=1, run="other")]), None,
                  {_sha(blobs["b"]): blobs["b"]}, 0, None),
            _Call(log._prepare([Planned(step="c", attempt=1),
                                Planned(step="c2", attempt=1)]), None,
                  {_sha(blobs["c"]): blobs["c"]}, 0, None),
        ]
        with led.storage.lock:
            log._group(calls)
        assert calls[0].error is None and calls[2].error is None, (calls[0].error, calls[2].error)
        assert isinstance(calls[1].error, IdempotencyConflict), repr(calls[1].error)
        assert not led.storage._pending  # type: ignore[attr-defined]
        with led.storage.read() as view:
            assert view.inline_blob(_sha(blobs["a"]))[1] == blobs["a"]
            assert view.inline_blob(_sha(blobs["c"]))[1] == blobs["c"]
            assert view.inline_blob(_sha(blobs["b"])) is None
            assert view.step("a") is not None and view.step("c2") is not None
        assert led.verify().ok


def test_group_commit_a_held_write_refused_fails_every_caller_and_commits_nothing(
        pg_url: str) -> None:
    """A group whose second part's inline row is refused by the server (held, sent with
    a later statement): every caller hears a typed error, nothing of any part commits,
    and the ledger works after."""
    from ledger import Planned
    from ledger.log import _Call

    with Ledger.init(pg_url) as led:
        led.append(Planned(step="first", attempt=1))
        with led.storage.read() as view:
            head = view.head()
        log = led._log  # type: ignore[attr-defined]
        good, bad = b"good inline", b"REFUSE ME"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION red_refusal() RETURNS trigger LANGUAGE plpgsql AS"
                         " $$ BEGIN IF NEW.data = 'REFUSE ME'::bytea THEN"
                         " RAISE EXCEPTION 'red refusal'; END IF; RETURN NEW; END $$")
            conn.execute("CREATE TRIGGER red BEFORE INSERT OR UPDATE ON blob_data"
                         " FOR EACH ROW EXECUTE FUNCTION red_refusal()")
        calls = [
            _Call(log._prepare([Planned(step="a", attempt=1)]), None, {_sha(good): good}, 0, None),
            _Call(log._prepare([Planned(step="b", attempt=1)]), None, {_sha(bad): bad}, 0, None),
            _Call(log._prepare([Planned(step="c", attempt=1)]), None, None, 0, None),
        ]
        with led.storage.lock:
            log._group(calls)
        for call in calls:
            assert isinstance(call.error, LedgerError), repr(call.error)
            assert "red refusal" in str(call.error), repr(call.error)
        with led.storage.read() as view:
            assert view.head() == head
            assert view.inline_blob(_sha(good)) is None
        _lift(pg_url, "blob_data")
        led.append(Planned(step="after", attempt=1))
        assert led.verify().ok


@pytest.mark.parametrize("where", ["pulse", "size"])
def test_a_held_write_refused_at_a_flush_of_its_own_is_typed_and_rolled_back(
        pg_url: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The held writes go on their own (the pulse bound, the size cap) and the server
    refuses one: a typed error at that `_defer`, nothing commits, the ledger works."""
    import time

    import ledger.store.postgres as pg

    if where == "pulse":
        monkeypatch.setattr(pg, "PULSE_S", 0.05)
    else:
        monkeypatch.setattr(pg, "PENDING_MAX", 1000)
    with Ledger.init(pg_url) as led:
        store = led.storage
        _plant(pg_url, "meta", "P0001")
        with pytest.raises(LedgerError) as caught:
            with store.transaction() as tx:
                tx.set_meta("red-1", "1")
                if where == "pulse":
                    time.sleep(0.1)
                    tx.set_meta("red-2", "2")
                else:
                    tx.set_meta("red-2", "x" * 2000)
                raise AssertionError("the flush did not raise")
        assert "red refusal" in str(caught.value)
        assert not store._pending  # type: ignore[attr-defined]
        _lift(pg_url, "meta")
        assert store.view.meta("red-1") is None
        with store.transaction() as tx:
            tx.set_meta("red-3", "3")
        assert store.view.meta("red-3") == "3"


def test_many_inline_blobs_past_the_size_cap_all_commit_intact(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte value, 60 blobs of 60 KiB in one transaction (7 MiB of hex text: the
    cap sends them in several messages): each stored as it was."""
    import os

    with Ledger.init(pg_url) as led:
        store = led.storage
        blobs = {}
        for i in range(60):
            data = bytes(range(256)) * 16 + os.urandom(60 * 1024 - 4096) + bytes([i])
            blobs[_sha(data)] = data
        sent = []
        real = psycopg.Cursor.execute

        def execute(self, query, *a, **k):  # type: ignore[no-untyped-def]
            sent.append(len(str(query)))
            return real(self, query, *a, **k)

        monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        with store.transaction() as tx:
            now = tx.time_ns
            for d, data in blobs.items():
                tx.put_inline({d: data}, now)
        monkeypatch.setattr(psycopg.Cursor, "execute", real)
        assert max(sent) < 2 * (4 << 20), max(sent)
        assert len([n for n in sent if n > (4 << 20)]) >= 1
        with store.read() as view:
            for d, data in blobs.items():
                assert bytes(view.inline_blob(d)[1]) == data


def test_a_held_write_refused_at_a_read_mid_transaction_then_the_ledger_works(
        pg_url: str) -> None:
    """The refusal arrives on a read inside the transaction (not the COMMIT): typed, the
    caller's `with` ends in that error, nothing commits, the next transaction works."""
    with Ledger.init(pg_url) as led:
        store = led.storage
        _plant(pg_url, "meta", "P0001")
        with pytest.raises(LedgerError) as caught:
            with store.transaction() as tx:
                tx.set_meta("red-mid", "1")
                tx.meta("anything")  # the read carries the held write
        assert "red refusal" in str(caught.value)
        _lift(pg_url, "meta")
        assert store.view.meta("red-mid") is None
        with store.transaction() as tx:
            tx.set_meta("red-after", "2")
            assert tx.meta("red-after") == "2"
        assert store.view.meta("red-after") == "2"


@pytest.mark.parametrize("when", ["read", "commit"])
def test_a_connection_cut_while_writes_are_held(pg_url: str, when: str) -> None:
    """The server ends the session (pg_terminate_backend) while writes are held: the next
    round trip is DatabaseUnavailable, nothing commits, the ledger reconnects."""
    with Ledger.init(pg_url) as led:
        store = led.storage
        with pytest.raises(DatabaseUnavailable):
            with store.transaction() as tx:
                tx.set_meta("red-cut", "1")
                pid = store._conn.info.backend_pid  # type: ignore[attr-defined]
                with psycopg.connect(pg_url, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                if when == "read":
                    tx.meta("anything")
        assert not store._pending  # type: ignore[attr-defined]
        assert store.view.meta("red-cut") is None
        with store.transaction() as tx:
            tx.set_meta("red-after", "2")
        assert store.view.meta("red-after") == "2"


HOSTILE = [
    "plain",
    "quote ' and '' and \\' and \\\\'",
    "back\\slash\\x00\\n E'\\x41'",
    "semi; DROP TABLE meta; --",
    "%s %(x)s %% %",
    "$$ $tag$ dollar $$",
    "unicode ü 🧪 \u2028 \u00a0 \ufeff",
    "newline\nand\ttab\r",
    "'::bytea); SELECT pg_sleep(10); --",
]


@pytest.mark.parametrize("scs", ["on", "off"])
def test_hostile_strings_and_bytes_through_held_writes_round_trip(
        pg_url: str, scs: str) -> None:
    """meta keys and values and inline blob bytes through held writes, with the
    database's standard_conforming_strings on and off (client-side binding must quote
    for the connection it binds for): every one reads back as written."""
    if scs == "off":
        with psycopg.connect(pg_url, autocommit=True) as conn:
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(f'ALTER DATABASE "{db}" SET standard_conforming_strings = off')
            conn.execute(f'ALTER DATABASE "{db}" SET escape_string_warning = off')
    with Ledger.init(pg_url) as led:
        store = led.storage
        if scs == "off":
            assert store._connect().execute("SHOW standard_conforming_strings").fetchone()[0] == "off"  # type: ignore[attr-defined]
        payloads = [s.encode() for s in HOSTILE] + [bytes(range(256)), b"\\x41\\\\'", b"'"]
        with store.transaction() as tx:
            now = tx.time_ns
            for i, s in enumerate(HOSTILE):
                tx.set_meta(f"red {i} {s}", s)
            for data in payloads:
                tx.put_inline({_sha(data): data}, now)
        with store.read() as view:
            for i, s in enumerate(HOSTILE):
                assert view.meta(f"red {i} {s}") == s
            for data in payloads:
                got = view.inline_blob(_sha(data))
                assert got is not None and bytes(got[1]) == data, (data, got)
        assert led.verify().ok


def test_a_redelivered_batch_with_held_writes_dedupes(pg_url: str) -> None:
    """A batch (savepoint held) whose first event is a redelivery, with an inline blob
    held before it: the redelivery answers `deduped`, the new event commits once."""
    from ledger import Planned

    with Ledger.init(pg_url) as led:
        first = led.append(Planned(step="a", attempt=1))
        data = b"inline with the batch"
        got = led._log.append([Planned(step="a", attempt=1), Planned(step="b", attempt=1)],  # type: ignore[attr-defined]
                              inline={_sha(data): data})
        assert got[0].deduped and got[0].seq == first.seq, got[0]
        assert not got[1].deduped
        again = led._log.append([Planned(step="a", attempt=1), Planned(step="b", attempt=1)],  # type: ignore[attr-defined]
                                inline={_sha(data): data})
        assert all(r.deduped for r in again), again
        with led.storage.read() as view:
            assert view.head().seq == got[1].seq
        assert led.verify().ok


def test_two_writers_of_the_same_inline_blobs_on_two_workspaces_never_deadlock(
        pg_url: str, tmp_path: Path) -> None:
    """Two ledgers (two sessions), each fencing steps on its own workspace, every step
    writing the same bytes (the same blob_data rows, upserted by both, in opposite
    orders): the chain lock, sent first in each message, serializes them; no deadlock,
    no LedgerBusy, every step applied, verify clean."""
    import threading

    from ledger import run_fenced_step

    Ledger.init(pg_url).close()
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(name: str, order: int) -> None:
        try:
            with Ledger.open(pg_url, busy_timeout_ms=20_000) as led:
                ws = tmp_path / name
                ws.mkdir()
                files = [f"f{i}.txt" for i in range(4)][::order]
                for f in files:
                    (ws / f).write_bytes(b"v0\n")
                led.workspaces.add(name, str(ws))
                epoch = led.workspaces.acquire(name, "held", ttl_s=3600).epoch
                barrier.wait()
                for k in range(12):
                    def plan(read, k=k):  # type: ignore[no-untyped-def]
                        return [read.read(f).write(b"shared %d %s\n" % (k, f.encode()))
                                for f in files]
                    arts = {f"out/{i}": b"shared artifact %d %d" % (k, i) for i in range(3)}
                    arts = dict(list(arts.items())[::order])
                    out = run_fenced_step(led, name, f"{name}-{k}", plan, epoch=epoch,
                                          artifacts=arts)
                    assert out.status == "applied", out
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=("wa", 1)),
               threading.Thread(target=worker, args=("wb", -1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with Ledger.open(pg_url) as led:
        assert led.verify().ok


def test_a_commit_after_a_swallowed_held_write_refusal_does_not_report_success(
        pg_url: str) -> None:
    """A held write's refusal now surfaces at a later read — one the caller may treat as
    best effort (the library has `except LedgerError` handlers around reads and
    workspace operations whose `_alive` flushes held writes). If the caller goes on and
    leaves the `with` normally, the server answers the COMMIT of the aborted transaction
    with ROLLBACK and no error: `_end` reports success for a transaction that committed
    nothing. Expected: a typed error at the exit (the COMMIT's status is not COMMIT)."""
    with Ledger.init(pg_url) as led:
        store = led.storage
        _plant(pg_url, "meta", "P0001")
        swallowed = []
        with pytest.raises(LedgerError):
            with store.transaction() as tx:
                tx.set_meta("red-swallowed", "1")
                try:
                    tx.meta("anything")  # a best-effort read carrying the held write
                except LedgerError as exc:
                    swallowed.append(exc)
        assert swallowed and "red refusal" in str(swallowed[0])
        _lift(pg_url, "meta")
        assert store.view.meta("red-swallowed") is None

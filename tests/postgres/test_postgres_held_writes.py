"""Writes a PostgreSQL transaction holds for its next round trip (`PgStore._defer`).

A write nobody reads the answer of — an inline blob, the projection rows, a savepoint —
is bound as text and sent in one message with the next statement that needs an answer,
or with the COMMIT. What that must not change: a held write that the server refuses
stops the transaction (nothing commits, a typed error, the ledger usable after); a read
in the same transaction sees every write before it; a transaction that fails drops what
it held; and a step sends far fewer round trips than statements (the count is bounded
here so a change that sends each write alone again is caught).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, run_fenced_step, run_step
from ledger.errors import LedgerError
from ledger.events import Planned

psycopg = pytest.importorskip("psycopg")


@contextlib.contextmanager
def round_trips() -> Iterator[list[str]]:
    """Every text the driver sends (`Cursor.execute`: one round trip each)."""
    seen: list[str] = []
    real = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        seen.append(str(query))
        return real(self, query, *a, **k)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = real  # type: ignore[method-assign]


def _workspace(led: Ledger, tmp_path: Path) -> int:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0\n")
    led.workspaces.add("w", str(ws))
    return led.workspaces.acquire("w", "held", ttl_s=3600).epoch


def _step(led: Ledger, epoch: int, k: int) -> None:
    out = run_fenced_step(led, "w", f"f{k}", lambda read: [read.read("app.py").write(b"%d\n" % k)],
                          epoch=epoch, artifacts={"out/log.txt": b"log %d\n" % k})
    assert out.status == "applied", out


def test_the_held_writes_go_with_the_commit_and_a_step_sends_few_round_trips(
        pg_url: str, tmp_path: Path) -> None:
    with Ledger.init(pg_url) as led:
        epoch = _workspace(led, tmp_path)
        for k in range(3):  # warm: caches as a long-running writer has them
            _step(led, epoch, k)
        with round_trips() as seen:
            _step(led, epoch, 3)
        commits = [t for t in seen if t.rstrip().endswith("COMMIT")]
        last = commits[-1]
        # the apply's projection rows ride with its COMMIT, not one round trip each
        assert "INSERT INTO steps" in last and "INSERT INTO ws_paths" in last, last[:300]
        # 63 round trips before writes were held (tools/count_statements.py); 44 after
        assert len(seen) <= 46, len(seen)
        # the chain lock goes with the first shared write and the head, not alone
        lock = [t for t in seen if "pg_advisory_xact_lock" in t and "SELECT seq, hash" in t]
        assert lock and "INSERT INTO blob_data" in lock[-1], seen
        after = seen[seen.index(lock[-1]):]
        assert len(after) <= 5, after  # under the chain lock: 5 round trips, the COMMIT's included
        assert led.verify().ok


def _plant_refusal(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION planted_refusal() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$ BEGIN RAISE EXCEPTION 'planted refusal'; END $$")
        conn.execute(f"CREATE TRIGGER planted BEFORE INSERT OR UPDATE ON {table}"
                     " FOR EACH ROW EXECUTE FUNCTION planted_refusal()")


def _lift_refusal(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER planted ON {table}")
        conn.execute("DROP FUNCTION planted_refusal()")


@pytest.mark.parametrize("table", ["steps", "blob_data", "manifest_entries"])
def test_a_held_write_the_server_refuses_commits_nothing(
        pg_url: str, tmp_path: Path, table: str) -> None:
    """The write is refused at the round trip it rode in (a read, the event insert or the
    COMMIT): a typed error, no event, no row of the step, and the next step commits."""
    with Ledger.init(pg_url) as led:
        run_step(led, "before", {"a.bin": b"first"})
        with led.storage.read() as view:
            head = view.head()
        _plant_refusal(pg_url, table)
        with pytest.raises(LedgerError) as caught:
            run_step(led, "refused", {"b.bin": b"second, refused"})
        assert "planted refusal" in str(caught.value)
        with led.storage.read() as view:
            assert view.head() == head
            assert view.step("refused") is None
            assert view.inline_blob(hashlib.sha256(b"second, refused").hexdigest()) is None
        _lift_refusal(pg_url, table)
        run_step(led, "after", {"c.bin": b"third"})
        assert led.verify().ok


def test_a_read_sees_the_writes_held_before_it(pg_url: str) -> None:
    """In one transaction: an upsert held, then a read of the same row — the read's round
    trip carries the write first."""
    with Ledger.init(pg_url) as led:
        store = led.storage
        with store.transaction() as tx:
            tx.set_meta("held-then-read", "yes")
            assert store._pending, "the write was sent alone: nothing held"  # type: ignore[attr-defined]
            assert tx.meta("held-then-read") == "yes"
        with store.read() as view:
            assert view.meta("held-then-read") == "yes"


def test_a_failed_transaction_drops_what_it_held(pg_url: str) -> None:
    with Ledger.init(pg_url) as led:
        store = led.storage
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.set_meta("dropped", "yes")
            raise RuntimeError("the caller's own failure")
        assert not store._pending  # type: ignore[attr-defined]
        led.append(Planned(step="next", attempt=1))  # the next transaction sends none of it
        with store.read() as view:
            assert view.meta("dropped") is None


def test_writes_are_held_at_most_a_pulse(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held write waits at most `PULSE_S` for company: the server sees the session idle
    while writes are held, and its idle bound must keep ending only a writer that stopped."""
    import time

    import ledger.store.postgres as pg

    monkeypatch.setattr(pg, "PULSE_S", 0.05)
    with Ledger.init(pg_url) as led:
        store = led.storage
        with store.transaction() as tx:
            tx.set_meta("first", "1")
            assert len(store._pending) == 1  # type: ignore[attr-defined]
            time.sleep(0.1)
            tx.set_meta("second", "2")  # the first has waited a pulse: both go now
            assert not store._pending  # type: ignore[attr-defined]
        with store.read() as view:
            assert (view.meta("first"), view.meta("second")) == ("1", "2")


def test_names_that_look_like_sql_are_bound_as_data(pg_url: str, tmp_path: Path) -> None:
    """Held writes are bound client-side (literals in the message's text): a path, a step
    and an artifact name full of quotes, semicolons, placeholders and dollar quotes are
    stored as the bytes they are, and nothing else runs."""
    hostile = "x'; DROP TABLE events; -- %s %(a)s $$ E'x' ü"
    with Ledger.init(pg_url) as led:
        epoch = _workspace(led, tmp_path)
        path = f"dir/{hostile}.txt"
        out = run_fenced_step(led, "w", f"step {hostile}", lambda read: [read.read(path).write(b"ok\n")],
                              epoch=epoch, artifacts={f"out/{hostile}": b"art"})
        assert out.status == "applied", out
        assert (tmp_path / "ws" / path).read_bytes() == b"ok\n"
        with led.storage.read() as view:
            assert view.step(f"step {hostile}") is not None
            assert view.path_state("w", path) is not None
        assert led.verify().ok

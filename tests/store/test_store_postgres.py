"""The PostgreSQL store passes the store contract (tests/store/store_contract.py), on a
throwaway server the test run starts (tests/conftest.py: `pg_url`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store_contract import StoreContract

from ledger.log import EventLog
from ledger.store import Scope, Store
from ledger.store.postgres import PgStore, is_url
from ledger.store.sqlite import SqliteStore
from ledger.store.sqlite.database import Database


def open_pg(location: str, clock: Callable[[], int], create: bool) -> Store:
    """A PostgreSQL store at a URL; a path is a SQLite file (what `snapshot` writes)."""
    if not is_url(location):
        return SqliteStore(Database.open(location), clock)
    if create:
        return PgStore.create(location, clock=clock)[0]
    return PgStore.open(location, clock=clock)


class TestPostgresStore(StoreContract):
    opener = staticmethod(open_pg)

    @pytest.fixture
    def where(self, pg_url: str, tmp_path: Path) -> str:
        self._tmp = tmp_path
        return pg_url

    def snapshot_target(self, where: str) -> str:
        return os.path.join(self._tmp, "snapshot.db")


# -- many writers: workspaces' transactions overlap; the chain stays one ---------------------


def _overlap(url: str) -> dict[str, bool]:
    """Transaction A of workspace w1 starts and stalls before it appends (as a builder
    deciding a fence, or an apply writing files, would); meanwhile B of workspace w2, and
    C of w1, try to commit. Returns whether B committed, and whether C did, while A was
    stalled; then A goes on and appends after B."""
    import threading

    from store_contract import _Clock, append

    from ledger.events import Planned

    a_store, b_store, c_store = (open_pg(url, _Clock(), False) for _ in range(3))
    inside, go = threading.Event(), threading.Event()
    done: dict[str, bool] = {}

    def a() -> None:
        with a_store.transaction(Scope("w1")) as tx:
            tx.step("nothing")  # a read: the workspace is locked, the chain is not
            inside.set()
            go.wait(20)
            prepared = EventLog._prepare([Planned(step="a", attempt=1, workspace="w1")])
            tx.append(prepared, head=tx.head(), time_ns=tx.time_ns, projector=None, guard=None)

    def other(store: Store, name: str, ws: str) -> None:
        append(store, [Planned(step=name, attempt=1, workspace=ws)], scope=Scope(ws))
        done[name] = True

    ta = threading.Thread(target=a)
    ta.start()
    assert inside.wait(20)
    tb = threading.Thread(target=other, args=(b_store, "b", "w2"))
    tc = threading.Thread(target=other, args=(c_store, "c", "w1"))
    tb.start()
    tc.start()
    tb.join(5)
    tc.join(1)
    seen = {"b": done.get("b", False), "c": done.get("c", False)}
    go.set()
    for t in (ta, tb, tc):
        t.join(30)
    rows = list(a_store.view.events())
    prev = a_store.genesis
    for r in rows:  # one chain, dense, whatever order they committed in
        assert r[12] == prev
        prev = r[13]
    assert [r[0] for r in rows] == [1, 2, 3]
    for s in (a_store, b_store, c_store):
        s.close()
    return seen


def test_transactions_of_two_workspaces_overlap_and_one_workspace_takes_turns(
        pg_url: str) -> None:
    open_pg(pg_url, lambda: 1, True).close()
    seen = _overlap(pg_url)
    assert seen == {"b": True, "c": False}  # w2 committed while w1's stood; w1's next waited


def test_the_overlap_check_catches_one_lock_for_every_transaction(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarantee removed (every transaction takes the chain lock at BEGIN, one writer
    at a time): the check above sees w2's commit wait for w1's transaction."""
    open_pg(pg_url, lambda: 1, True).close()
    begin = PgStore._begin

    def eager(self: PgStore, *, write: bool, scope: Scope = Scope()) -> None:
        begin(self, write=write, scope=scope)
        if write:
            self._chain()

    monkeypatch.setattr(PgStore, "_begin", eager)
    import ledger.store.postgres as pg
    monkeypatch.setattr(pg, "CHAIN_IDLE_MS", 60_000)  # (A's stall is not what is judged)
    assert _overlap(pg_url) == {"b": False, "c": False}


def test_a_256_mib_artifact_stores_and_reads_back_in_bounded_memory(pg_url: str,
                                                                    tmp_path: Path) -> None:
    """The issue's size, through the ledger: a 256 MiB artifact of a step is stored as
    chunk rows (content before the pointer, one transaction), published, read back and
    audited, the process's peak traced memory a few chunks, never the artifact."""
    import tracemalloc

    from ledger import Ledger
    from ledger.blobs import hash_chunks
    from ledger.gc.audit import audit

    piece, n = 1 << 20, 256
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        for i in range(n):
            f.write(i.to_bytes(4, "big") * (piece // 4))
    with Ledger.init(pg_url) as led:
        attempt = led.plan("big").attempt
        tracemalloc.start()
        try:
            with open(path, "rb") as f:
                stored = led.store("big", attempt, "big.bin", f)
            put_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            got = hash_chunks(led.blob_chunks(stored.digest))
            read_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert got == (stored.digest, n * piece)
        assert put_peak < 16 * piece and read_peak < 16 * piece, (put_peak, read_peak)
        assert led.storage.blobs.stat(stored.digest).size == n * piece
        led.publish("big")
        led.ack("big")
        report = audit(led)
        assert report.ok and report.committed_bytes == report.stored_bytes == n * piece


def test_the_newest_key_in_a_range_is_found_through_the_key_index_whatever_the_plan(
        pg_url: str) -> None:
    """`journal_newest` (a workspace's newest registration, every step) must read the
    journal key index's few rows, never walk the events table by seq: with `ORDER BY seq
    DESC LIMIT 1` the planner may choose the backward walk (here forced, as statistics
    that overestimate the range do), and a prefix nothing matches then costs a scan of
    every event — each step slower as the ledger grew. The materialized range holds under
    the same planner settings; the old statement is shown to fall into the walk."""
    import psycopg

    from ledger import Ledger
    from ledger.events import Planned
    from ledger.store.postgres import sql as q
    from ledger.store.sqlite import sql as E

    with Ledger.init(pg_url) as led:
        for i in range(20):
            led.append_batch([Planned(step=f"s{i}-{j}", attempt=1, run="r") for j in range(50)])
    args = ('["workspace-restored","w0",', '["workspace-restored","w0"-')
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE events")
        conn.execute("SET enable_sort = off")  # what misleading statistics make of it

        def plan(sql: str) -> str:
            return "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, args).fetchall())

        old = plan(E.JOURNAL_RANGE.replace("?", "%s").format(""))
        assert "Backward using events_pkey" in old and "Filter" in old, old  # the trap
        new = plan(q.JOURNAL_RANGE.format(""))
        assert "Backward" not in new and "events_journal_key_key" in new, new
        with Ledger.open(pg_url) as led:
            assert led.storage.view.journal_newest('["workspace-restored","w0",') is None
            assert led.storage.view.journal_newest('["s3-7",1,') is not None

"""What any store must do (docs/storage.md "The contract").

`StoreContract` is a set of tests written against `ledger.store`'s interface only: a store
runs them by subclassing it in a test module (its name then starts with ``Test``) and
giving `opener`, a module-level function ``opener(location, clock, create) -> Store``
(module-level: the concurrency tests call it in other processes), and `location`. This
module is not collected itself (its name does not start with ``test_``).

Covered: append, a redelivery answered, a conflict and an illegal transition writing
nothing, a failing transaction rolled back, the head and the chain; event reads by every
query field, paged; the journal lookup and the newest key under a prefix (a step named
like a kind is not taken for one); the projection rows written and read back; what GC
and audit read, the condemned rows; a rebuild's sink and verify's scratch copy; inline
blobs, blob bytes read, streamed and checked by one rule (64 MiB in bounded memory);
meta; a read view isolated from later commits; writers in two processes on two scopes;
`exclusive` against another process.
"""

from __future__ import annotations

import multiprocessing
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ledger import BlobCorrupt, BlobNotFound, IdempotencyConflict, IllegalTransition, LedgerError
from ledger.blobs import digest_of, hash_chunks
from ledger.events import (
    EVENT_VERSION,
    Acked,
    BlobPinned,
    Event,
    LeaseAcquired,
    Planned,
    RecordedEvent,
    chain_hash,
    envelope,
    journal_key,
)
from ledger.log import EventLog
import msgspec

from ledger.projections.steps import StepRow
from ledger.projections.workspaces import WsRow
from ledger.store import (FOLLOWS, Checkpoint, EventQuery, Head, Held, ProjectionChanges, Scope,
                          Store)

Opener = Callable[[str, Callable[[], int], bool], Store]
DIGEST = "ab" * 32


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


def append(store: Store, events: Sequence[Event], *, projector: Any = None,
           guard: Any = None, scope: Scope = Scope()) -> list[RecordedEvent]:
    """Append `events` in one transaction, as the log does."""
    prepared = EventLog._prepare(events)
    with store.transaction(scope) as tx:
        return tx.append(prepared, head=tx.head(), time_ns=tx.time_ns, projector=projector,
                         guard=guard)


class Refusing:
    """A projector that refuses every event of step ``refused`` (an illegal transition)."""

    def begin(self, tx: Any) -> None:
        pass

    def prefetch(self, tx: Any, step_ids: set[str]) -> None:
        pass

    def check(self, event: Any, seq: int, time_ns: int) -> object:
        if getattr(event, "step", "") == "refused":
            raise IllegalTransition("refused", 1, "planned", "refused by the test")
        return None

    def accept(self, change: object) -> None:
        pass

    def flush(self, last_seq: int) -> ProjectionChanges:
        return ProjectionChanges()

    def committed(self) -> None:
        pass

    def forget(self) -> None:
        pass


def _writer(opener: Opener, location: str, name: str, n: int, ready: Any) -> None:
    """Another process: append `n` events on scope `name`, one transaction each."""
    store = opener(location, _Clock(), False)
    ready.wait(30)
    try:
        for i in range(n):
            append(store, [Planned(step=f"{name}-{i}", attempt=1, workspace=name)],
                   scope=Scope(name))
    finally:
        store.close()


def _holder(opener: Opener, location: str, held: Any, release: Any) -> None:
    """Another process: hold lock "gc" until told to let go."""
    store = opener(location, _Clock(), False)
    try:
        with store.exclusive("gc"):
            held.set()
            release.wait(30)
    finally:
        store.close()


class StoreContract:
    """The contract (see the module docstring). Subclasses set `opener` and `location`."""

    opener: ClassVar[Opener]

    def location(self, tmp_path: Path) -> str:
        raise NotImplementedError

    @pytest.fixture
    def where(self, tmp_path: Path) -> str:
        return self.location(tmp_path)

    @pytest.fixture
    def store(self, where: str) -> Iterator[Store]:
        store = type(self).opener(where, _Clock(), True)
        yield store
        store.close()

    def snapshot_target(self, where: str) -> str:
        """Where `snapshot` writes its copy (a new file)."""
        return where + "-snapshot"

    def other(self, where: str) -> Store:
        """A second connection to the same store (another writer or reader)."""
        return type(self).opener(where, _Clock(), False)

    # -- append --------------------------------------------------------------------------

    def test_a_store_knows_whether_this_thread_is_inside_it(self, store: Store) -> None:
        """`held_here`: inside a transaction or a read of this thread, not outside, and
        never for another thread (an append from inside joins the transaction)."""
        import threading

        seen: list[bool] = []
        assert not store.held_here()
        with store.read():
            assert store.held_here()
            t = threading.Thread(target=lambda: seen.append(store.held_here()))
            t.start()
            t.join()
        assert not store.held_here()
        with store.transaction():
            assert store.held_here() and not store.reading_here()
            with store.read():
                assert store.held_here() and not store.reading_here()
            assert store.held_here()
        assert not store.held_here() and seen == [False]
        with store.read():
            assert store.reading_here()  # an append here could not commit: refused
        with store.lock:  # a section the caller locked itself: held, not reading
            assert store.held_here() and not store.reading_here()

    def test_an_empty_store_has_the_genesis_head(self, store: Store) -> None:
        assert store.view.head() == Head(0, store.genesis)
        assert store.view.count() == 0
        assert list(store.view.events()) == []

    def test_append_chains_and_moves_the_head(self, store: Store) -> None:
        first = append(store, [Planned(step="a", attempt=1)])
        assert [r.seq for r in first] == [1]
        assert first[0].prev_hash == store.genesis and not first[0].deduped
        more = append(store, [Planned(step="b", attempt=1), Planned(step="c", attempt=1)])
        assert [r.seq for r in more] == [2, 3]
        assert more[0].prev_hash == first[0].hash and more[1].prev_hash == more[0].hash
        assert store.view.head() == Head(3, more[1].hash)
        rows = list(store.view.events())
        assert [r[0] for r in rows] == [1, 2, 3]
        for row in rows:
            seq, time_ns, ws, run, step, attempt, epoch, rev, key, kind, v, payload, prev, h = row
            event = Planned(step=step, attempt=attempt)
            env = envelope(event)
            assert (kind, v, key) == ("planned", EVENT_VERSION, journal_key(event))
            assert chain_hash(prev, seq, time_ns, env, key, kind, v, payload) == h
        # one transaction, one time
        assert rows[1][1] == rows[2][1] != rows[0][1]

    def test_a_redelivery_is_answered_and_writes_nothing(self, store: Store) -> None:
        first = append(store, [Planned(step="a", attempt=1, run="r")])[0]
        again = append(store, [Planned(step="a", attempt=1, run="r")])[0]
        assert again.deduped and (again.seq, again.hash) == (first.seq, first.hash)
        assert again.event == first.event
        assert store.view.count() == 1

    def test_a_batch_with_a_redelivery_answers_it_in_place(self, store: Store) -> None:
        append(store, [Planned(step="a", attempt=1)])
        out = append(store, [Planned(step="b", attempt=1), Planned(step="a", attempt=1),
                             Planned(step="c", attempt=1)])
        assert [(r.seq, r.deduped) for r in out] == [(2, False), (1, True), (3, False)]
        assert store.view.count() == 3

    def test_a_conflict_writes_nothing(self, store: Store) -> None:
        append(store, [Planned(step="a", attempt=1, run="r")])
        head = store.view.head()
        with pytest.raises(IdempotencyConflict):
            append(store, [Planned(step="a", attempt=1, run="other")])
        with pytest.raises(IdempotencyConflict):  # the whole batch, not just the conflict
            append(store, [Planned(step="b", attempt=1), Planned(step="a", attempt=1, run="x")])
        assert store.view.head() == head and store.view.count() == 1

    def test_an_illegal_transition_writes_nothing_but_a_redelivery_is_answered(
            self, store: Store) -> None:
        with pytest.raises(IllegalTransition):
            append(store, [Planned(step="ok", attempt=1), Planned(step="refused", attempt=1)],
                   projector=Refusing())
        assert store.view.count() == 0
        recorded = append(store, [Planned(step="refused", attempt=1)])[0]  # no projector
        again = append(store, [Planned(step="refused", attempt=1)], projector=Refusing())[0]
        assert again.deduped and again.seq == recorded.seq

    def test_a_guard_refusal_writes_nothing(self, store: Store) -> None:
        def guard(tx: Any, event: Event) -> None:
            raise IllegalTransition("a", 1, "blob-pinned", "no")

        with pytest.raises(IllegalTransition):
            append(store, [Planned(step="a", attempt=1),
                           BlobPinned(step="a", attempt=1, digest=DIGEST, epoch=1)], guard=guard)
        assert store.view.count() == 0

    def test_a_failing_transaction_rolls_back_everything(self, store: Store) -> None:
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.put_inline({DIGEST: b"x"}, 1)
            tx.set_meta("k", "v")
            tx.append(EventLog._prepare([Planned(step="a", attempt=1)]), head=tx.head(),
                      time_ns=tx.time_ns, projector=None, guard=None)
            assert tx.count() == 1  # the transaction sees its own writes
            raise RuntimeError("the builder failed")
        view = store.view
        assert view.count() == 0 and view.meta("k") is None and view.blob_size(DIGEST) is None

    def test_the_transaction_time_is_read_once(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.time_ns == tx.time_ns

    # -- reading -------------------------------------------------------------------------

    def _log(self, store: Store) -> list[Any]:
        """2,500 events (more than one page) of several steps, attempts, kinds, runs."""
        events: list[Event] = []
        for i in range(500):
            step, run, ws = f"s{i % 7}-{i}", f"r{i % 3}", f"w{i % 2}"
            events += [Planned(step=step, attempt=1, run=run, workspace=ws),
                       BlobPinned(step=step, attempt=1, run=run, workspace=ws, digest=DIGEST),
                       Planned(step=step, attempt=2, run=run, workspace=ws),
                       BlobPinned(step=step, attempt=2, run=run, workspace=ws, digest=DIGEST),
                       Acked(step=step, attempt=2, run=run, workspace=ws)]
        append(store, events[:1200])
        append(store, events[1200:])
        return list(store.view.events())

    def test_event_queries(self, store: Store) -> None:
        rows = self._log(store)
        assert [r[0] for r in rows] == list(range(1, 2501))
        view = store.view

        def expect(q: EventQuery) -> list[Any]:
            got = [r for r in rows if r[0] > q.after_seq
                   and (q.step is None or r[4] == q.step)
                   and (q.attempt is None or r[5] == q.attempt)
                   and (q.kinds is None or r[9] in q.kinds)
                   and (q.run is None or r[3] == q.run)
                   and (q.workspace is None or r[2] == q.workspace)]
            if q.descending:
                got.reverse()
            return got if q.limit is None else got[:q.limit]

        for q in [EventQuery(), EventQuery(after_seq=1999), EventQuery(after_seq=2500),
                  EventQuery(step="s3-3"), EventQuery(step="s3-3", attempt=2),
                  EventQuery(kinds=frozenset({"acked"})),
                  EventQuery(kinds=frozenset({"acked", "planned"}), run="r1"),
                  EventQuery(run="r2", workspace="w1"), EventQuery(limit=2001),
                  EventQuery(after_seq=10, limit=5), EventQuery(descending=True, limit=3),
                  EventQuery(descending=True, kinds=frozenset({"planned"}), run="r0",
                             workspace="w0", limit=1),
                  EventQuery(descending=True, after_seq=2490), EventQuery(limit=0)]:
            assert list(view.events(q)) == expect(q), q

    def test_event_totals(self, store: Store) -> None:
        """What `steptrail stats` reads: per (run, kind) and per time bucket."""
        rows = self._log(store)
        by_run, by_time = store.view.event_totals(10**6)
        expect: dict[tuple[str, str], tuple[int, int, int, int]] = {}
        buckets: dict[int, tuple[int, int]] = {}
        for r in rows:
            size = len(r[11]) + len(r[8].encode()) + 64
            n, b, t0, t1 = expect.get((r[3], r[9]), (0, 0, r[1], r[1]))
            expect[(r[3], r[9])] = (n + 1, b + size, min(t0, r[1]), max(t1, r[1]))
            start = r[1] // 10**6 * 10**6
            n, b = buckets.get(start, (0, 0))
            buckets[start] = (n + 1, b + size)
        assert [(run, kind) for run, kind, *_ in by_run] == sorted(expect)
        assert {(run, kind): tuple(rest) for run, kind, *rest in by_run} == expect
        assert by_time == [(t, n, b) for t, (n, b) in sorted(buckets.items())]

    def test_fold_rows_are_the_folds_columns(self, store: Store) -> None:
        rows = self._log(store)
        assert list(store.view.fold_rows(100)) == [(r[0], r[1], r[9], r[10], r[11])
                                                   for r in rows if r[0] > 100]

    def test_checked_rows_name_no_problem_in_a_sound_log(self, store: Store) -> None:
        rows = self._log(store)
        assert list(store.view.checked_rows()) == [(r, None) for r in rows]

    def test_journal_lookup(self, store: Store) -> None:
        recorded = append(store, [Planned(step="a", attempt=1), Planned(step="b", attempt=1)])
        row = store.view.journal_lookup(journal_key(Planned(step="b", attempt=1)))
        assert row is not None and row[0] == recorded[1].seq and row[13] == recorded[1].hash
        assert store.view.journal_lookup(journal_key(Planned(step="c", attempt=1))) is None

    def test_journal_newest_under_a_prefix(self, store: Store) -> None:
        def lease(ws: str, epoch: int) -> LeaseAcquired:
            return LeaseAcquired(workspace=ws, epoch=epoch, holder="h", expires_ns=1)

        append(store, [lease("w", 1), lease("w", 2), lease("wx", 9), lease("w\u00e9", 7),
                       Planned(step="lease-acquired", attempt=1),  # a step named like a kind
                       lease("w", 3), lease("v", 5)])
        prefix = journal_key(lease("w", 1)).rsplit(",", 1)[0] + ","  # ["lease-acquired","w",
        newest = store.view.journal_newest(prefix)
        assert newest is not None and newest[9] == "lease-acquired" and newest[0] == 6
        assert store.view.journal_newest('["lease-acquired",') is not None
        assert store.view.journal_newest('["lease-acquired",', "lease-acquired")[0] == 7  # type: ignore[index]
        assert store.view.journal_newest('["lease-acquired",1')[9] == "planned"  # type: ignore[index]
        assert store.view.journal_newest('["lease-acquired",1', "lease-acquired") is None
        assert store.view.journal_newest('["lease-released",') is None

    # -- inline blobs, meta ------------------------------------------------------------

    def test_inline_blobs(self, store: Store) -> None:
        other = "cd" * 32
        with store.transaction() as tx:
            tx.put_inline({DIGEST: b"hello", other: b"x" * 10}, 100)
        view = store.view
        assert view.blob_size(DIGEST) == (5, True)
        assert view.inline_blob(DIGEST) == (5, b"hello")
        assert [(b.digest, b.size, b.inline, b.mtime_ns) for b in view.inline_blobs()] == [
            (DIGEST, 5, True, 100), (other, 10, True, 100)]
        with store.transaction() as tx:
            tx.put_inline({DIGEST: b"hello"}, 200)  # the same bytes: freshened
        assert next(iter(view.inline_blobs())).mtime_ns == 200
        with store.transaction() as tx:
            tx.delete_inline(DIGEST)
        assert view.blob_size(DIGEST) is None and view.inline_blob(DIGEST) is None

    def test_blob_bytes_inline_or_in_the_backend_one_rule(self, store: Store) -> None:
        small, large = b"small bytes", bytes(range(256)) * 4096  # 1 MiB
        ds, dl = digest_of(small), digest_of(large)
        with store.transaction() as tx:
            tx.put_inline({ds: small}, 5)
        store.blobs.put_stream(iter([large[:1000], large[1000:]]), dl)
        view = store.view
        assert view.blob_size(ds) == (len(small), True)
        assert view.blob_size(dl) == (len(large), False)
        assert view.blob_size(DIGEST) is None
        assert store.blobs.read(ds, size=len(small)) == small
        assert store.blobs.read(dl, size=len(large)) == large
        assert b"".join(store.blobs.chunks(ds)) == small
        assert b"".join(store.blobs.chunks(dl, size=len(large))) == large
        stat = store.blobs.stat(ds)
        assert stat is not None and (stat.size, stat.inline, stat.mtime_ns) == (len(small), True, 5)
        stat = store.blobs.stat(dl)
        assert stat is not None and (stat.size, stat.inline) == (len(large), False)
        for digest, size in ((ds, len(small)), (dl, len(large))):
            view.check_blob(digest, size, hash_file=True)
            view.check_blob(digest, size, hash_file=False)
            with pytest.raises(BlobCorrupt):
                view.check_blob(digest, size + 1, hash_file=True)
            with pytest.raises(BlobCorrupt):
                store.blobs.read(digest, size=size - 1)
            with pytest.raises(BlobCorrupt):
                b"".join(store.blobs.chunks(digest, size=size - 1))
        with pytest.raises(BlobNotFound):
            view.check_blob(DIGEST, 1, hash_file=False)
        with pytest.raises(BlobNotFound):
            store.blobs.read(DIGEST)
        with pytest.raises(BlobNotFound):
            store.blobs.chunks(DIGEST)

    def test_a_large_blob_streams_in_bounded_memory(self, store: Store) -> None:
        """64 MiB in and out; neither side holds it whole (docs/storage.md: bytes may be in
        the database, in chunks)."""
        piece, n = 1 << 20, 64

        def pieces() -> Iterator[bytes]:
            for i in range(n):
                yield i.to_bytes(4, "big") * (piece // 4)

        digest = hash_chunks(pieces())[0]
        tracemalloc.start()
        try:
            store.blobs.put_stream(pieces(), digest)
            put_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            got = hash_chunks(store.blobs.chunks(digest, size=n * piece))
            read_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert got == (digest, n * piece)
        assert put_peak < 16 * piece and read_peak < 16 * piece, (put_peak, read_peak)

    def test_projection_rows_round_trip(self, store: Store) -> None:
        step = StepRow(step_id="s", run="r", workspace="w", state="planned", attempt=1,
                       epoch=2, rev=0, manifest_rev=-1, manifest_digest=None, live=False,
                       committed_bytes=0, stored_bytes=0, first_seq=1, last_seq=1, updated_ns=5)
        done = msgspec.structs.replace(step, step_id="t", state="acked", first_seq=2)
        ws = WsRow(name="w", root="/r", rev=1, epoch=2, holder="h", expires_ns=9, acquired_ns=3,
                   last_seq=2)
        assert store.view.checkpoint() is None and store.view.step("s") is None
        with store.transaction() as tx:
            tx.write_projection(ProjectionChanges(
                steps=[step.as_tuple(), done.as_tuple()], workspaces=[ws.as_tuple()],
                paths=[("w", "a.txt", 1, DIGEST, 2), ("w", "gone", 1, None, 2)],
                pins=[("s", 1, DIGEST, "artifact", 1), ("s", 1, "cd" * 32, "pre-image", 1)],
                manifests=[("t", 0, 1, DIGEST, None, 2)],
                entries=[("t", 0, "artifact", "a", DIGEST, 3)],
                checkpoint=Checkpoint(FOLLOWS, 4)))
        view = store.view
        assert view.checkpoint() == Checkpoint(0, 4)  # follows: the (empty) head
        assert view.step("s") == step and view.steps() == [step, done]
        assert view.steps(state="acked") == [done] and view.steps(step_id="s") == [step]
        assert view.steps_in_flight("w") == [("s", 1)]
        assert view.steps_in_flight("w", 2) == [] and view.steps_in_flight("w", 3) == [("s", 1)]
        assert view.steps_in_flight("w", 3, limit=1, oldest_first=True) == [("s", 1)]
        assert view.workspace("w") == ws and view.workspace_rows() == [ws]
        assert view.path_state("w", "a.txt") == (1, DIGEST, 2)
        assert view.path_state("w", "gone") == (1, None, 2) and view.path_state("w", "x") is None
        assert sorted(view.path_rows()) == [("w", "a.txt", 1, DIGEST, 2), ("w", "gone", 1, None, 2)]
        assert sorted(view.pin_rows()) == [("s", 1, DIGEST, "artifact", 1),
                                           ("s", 1, "cd" * 32, "pre-image", 1)]
        assert view.manifest_rows() == [("t", 0, 1, DIGEST, None, 2)]
        assert view.entry_rows() == [("t", 0, "artifact", "a", DIGEST, 3)]
        with store.transaction() as tx:  # an ack releases only the roles it names
            tx.write_projection(ProjectionChanges(releases=[("s", 1, True)],
                                                  released_on_ack=("artifact", "post-image")))
        assert view.pin_rows() == [("s", 1, "cd" * 32, "pre-image", 1)]
        with store.transaction() as tx:  # an end releases them all
            tx.write_projection(ProjectionChanges(releases=[("s", 1, False)]))
        assert view.pin_rows() == [] and view.checkpoint() == Checkpoint(0, 4)

    def _projection(self, store: Store) -> tuple[StepRow, StepRow]:
        """A live (acked, committed) step t with a manifest naming DIGEST, an in-flight
        step s pinning DIGEST and a pre-image."""
        step = StepRow(step_id="s", run="r", workspace="w", state="planned", attempt=1,
                       epoch=2, rev=0, manifest_rev=-1, manifest_digest=None, live=False,
                       committed_bytes=0, stored_bytes=7, first_seq=1, last_seq=1, updated_ns=5)
        done = msgspec.structs.replace(step, step_id="t", state="acked", first_seq=2,
                                       manifest_rev=0, manifest_digest=DIGEST, live=True,
                                       stored_bytes=3)
        with store.transaction() as tx:
            tx.write_projection(ProjectionChanges(
                steps=[step.as_tuple(), done.as_tuple()],
                pins=[("s", 1, DIGEST, "artifact", 1), ("s", 1, "cd" * 32, "pre-image", 1)],
                manifests=[("t", 0, 1, DIGEST, None, 2)],
                entries=[("t", 0, "artifact", "a", DIGEST, 3)],
                checkpoint=Checkpoint(FOLLOWS, 4)))
        return step, done

    def test_what_gc_and_audit_read(self, store: Store) -> None:
        self._projection(store)
        view = store.view
        assert sorted(view.pin_holds()) == [(DIGEST, "artifact", "planned", 1, 1, 5),
                                            ("cd" * 32, "pre-image", "planned", 1, 1, 5)]
        assert view.pin_holds(DIGEST) == [(DIGEST, "artifact", "planned", 1, 1, 5)]
        assert view.pin_holds("ef" * 32) == []
        assert view.manifest_digests() == {DIGEST}
        assert view.names_digest(DIGEST) and not view.names_digest("cd" * 32)
        assert view.entries_naming(DIGEST, 5) == [("t", 0, "a")]
        assert view.live_entries() == [(DIGEST, 3)] and view.live_step_count() == 1
        assert view.step_totals(frozenset({"planned", "fenced"})) == (1, 7)
        assert view.step_totals(frozenset({"rejected"})) == (0, 0)

    def test_condemned_rows(self, store: Store) -> None:
        view = store.view
        assert view.condemned() == {} and view.condemned_count() == 0
        with store.transaction() as tx:
            tx.condemn([(DIGEST, 3, True), ("cd" * 32, 9, False)], 11, "0" * 16)
            tx.condemn([(DIGEST, 99, False)], 12, "1" * 16)  # one already there stays
        assert view.condemned() == {DIGEST: (3, True), "cd" * 32: (9, False)}
        assert view.condemned_entry(DIGEST) == (3, True) and view.condemned_count() == 2
        with store.transaction() as tx:
            tx.uncondemn([DIGEST, "ef" * 32])
        assert view.condemned() == {"cd" * 32: (9, False)} and view.condemned_entry(DIGEST) is None

    def test_a_rebuild_sink_replaces_every_projection_row(self, store: Store) -> None:
        step, done = self._projection(store)
        fresh = msgspec.structs.replace(step, state="fenced")
        with store.transaction() as tx:
            with tx.rebuild_projections() as sink:
                assert sink.step_count() == 0 and sink.step("s") is None  # emptied
                sink.put_steps([fresh.as_tuple()])
                assert sink.step("s") == fresh
                sink.put_manifests([("t", 0, 1, DIGEST, None, 2)],
                                   [("t", 0, "artifact", "b", DIGEST, 4)])
                sink.put_pins([("s", 1, DIGEST, "artifact", 1)])
                sink.put_workspaces([WsRow(name="w", root="/r", rev=1, epoch=2, holder="h",
                                           expires_ns=9, acquired_ns=3, last_seq=2).as_tuple()],
                                    [("w", "b", 1, DIGEST, 2)])
                assert sink.step_count() == 1
        view = store.view
        assert view.steps() == [fresh] and view.pin_rows() == [("s", 1, DIGEST, "artifact", 1)]
        assert view.entry_rows() == [("t", 0, "artifact", "b", DIGEST, 4)]
        assert view.path_rows() == [("w", "b", 1, DIGEST, 2)]
        assert view.manifest_digests() == {DIGEST} and view.names_digest(DIGEST)  # indexes back

    def test_a_failed_rebuild_leaves_the_tables(self, store: Store) -> None:
        step, done = self._projection(store)
        with pytest.raises(RuntimeError), store.transaction() as tx:
            with tx.rebuild_projections() as sink:
                sink.put_steps([])
                raise RuntimeError("the fold failed")
        assert store.view.steps() == [step, done]

    def test_a_scratch_copy_compares_without_writing(self, store: Store) -> None:
        step, done = self._projection(store)
        with store.transaction() as tx:
            tx.condemn([(DIGEST, 3, True)], 11, "0" * 16)
        changed = msgspec.structs.replace(done, stored_bytes=4)
        with store.read() as view, view.scratch() as scratch:
            scratch.put_steps([step.as_tuple(), changed.as_tuple()])
            scratch.put_manifests([("t", 0, 1, DIGEST, None, 2)],
                                  [("t", 0, "artifact", "a", DIGEST, 3)])
            assert scratch.step_count() == 2 and scratch.step("t") == changed
            assert scratch.step_differences() == [("t", changed, done)]
            assert [d for d in scratch.ref_differences() if d[1] or d[2]] == []
            assert list(scratch.live_entries()) == [("t", 0, "artifact", "a", DIGEST, 3)]
            (check,) = list(scratch.condemned_checks())
            assert (check.digest, check.size, check.referenced) == (DIGEST, 3, True)
            scratch.overlay_steps([changed.as_tuple()])  # a lagging tail folded over
            assert scratch.step_differences() == []
        assert store.view.steps() == [step, done]  # the ledger's tables are untouched
        with store.read() as view, view.scratch() as scratch:
            assert scratch.step_count() == 0  # a fresh copy each time

    def test_meta(self, store: Store) -> None:
        assert store.view.meta("nothing") is None
        with store.transaction() as tx:
            tx.set_meta("k", "v1")
            tx.set_meta("k", "v2")
        assert store.view.meta("k") == "v2"
        assert store.view.meta_all()["k"] == "v2"

    def test_a_snapshot_is_a_store_of_its_own(self, store: Store, where: str) -> None:
        append(store, [Planned(step="a", attempt=1), Planned(step="b", attempt=1)])
        with store.transaction() as tx:
            tx.put_inline({digest_of(b"x"): b"x"}, 1)
            tx.set_meta("k", "v")
        target = self.snapshot_target(where)
        other = self.other(where)
        try:
            with other.read() as view:  # a reader elsewhere does not stop it
                store.snapshot(target)
                assert view.count() == 2
        finally:
            other.close()
        append(store, [Planned(step="c", attempt=1)])  # after it: not in it
        copy = type(self).opener(target, _Clock(), False)
        try:
            assert copy.view.count() == 2
            assert copy.view.head() == Head(2, list(store.view.events())[1][13])
            assert copy.genesis == store.genesis
            assert copy.view.meta("k") == "v" and copy.view.inline_blob(digest_of(b"x")) is not None
        finally:
            copy.close()
        with pytest.raises(LedgerError):
            store.snapshot(target)  # never over an existing file

    # -- isolation and concurrency -----------------------------------------------------

    def test_a_read_view_is_one_snapshot(self, store: Store, where: str) -> None:
        append(store, [Planned(step="a", attempt=1)])
        other = self.other(where)
        try:
            before = store.generation()
            with store.read() as view:
                head = view.head()
                append(other, [Planned(step="b", attempt=1)])
                assert view.head() == head and view.count() == 1
                assert [r[4] for r in view.events()] == ["a"]
            assert store.view.head().seq == 2
            assert store.generation() != before  # another connection committed
        finally:
            other.close()

    def test_writers_in_two_processes_on_two_scopes(self, store: Store, where: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        procs = [ctx.Process(target=_writer, args=(type(self).opener, where, f"w{i}", 40, ready))
                 for i in range(2)]
        for p in procs:
            p.start()
        ready.set()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        rows = list(store.view.events())
        assert [r[0] for r in rows] == list(range(1, 81))
        prev = store.genesis
        for r in rows:
            assert r[12] == prev
            prev = r[13]
        assert sorted(r[4] for r in rows) == sorted(f"w{i}-{j}" for i in range(2) for j in range(40))

    def test_exclusive_against_another_process(self, store: Store, where: str) -> None:
        assert not store.held_elsewhere("gc")
        ctx = multiprocessing.get_context("spawn")
        held, release = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_holder, args=(type(self).opener, where, held, release))
        p.start()
        try:
            assert held.wait(60)
            assert store.held_elsewhere("gc")
            with pytest.raises(Held), store.exclusive("gc"):
                pass
        finally:
            release.set()
            p.join(60)
        assert p.exitcode == 0
        deadline = time.monotonic() + 10
        while store.held_elsewhere("gc") and time.monotonic() < deadline:
            time.sleep(0.01)
        with store.exclusive("gc"):
            pass


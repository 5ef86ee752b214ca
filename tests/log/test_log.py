"""The event log: append-only, journal keys, lifecycle refusals, atomic batches, reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest

from conftest import FakeClock, commit_events, copy_ledger, digest_of
from ledger import (
    Acked,
    BlobPinned,
    BlobStored,
    Compensated,
    Fenced,
    Head,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    Ledger,
    ManifestPublished,
    Planned,
    Rejected,
    UnknownStep,
    WorkspaceAdded,
)
from ledger import events as ev
from ledger.errors import BlobNotFound
from ledger.store.sqlite import sql as eventsmod

BLOBS = {digest_of(data): data for data in (b"one", b"two", b"three")}
D1, D2, D3 = BLOBS
M1, M2 = digest_of(b"manifest-1"), digest_of(b"manifest-2")


@pytest.fixture(autouse=True)
def _stored_blobs(ledger: Ledger) -> None:
    """The blobs the events below name are durable (the append guard requires it)."""
    for digest, data in BLOBS.items():
        ledger.blobs.put(data, digest)


def state(ledger: Ledger) -> tuple[int, Head, list[Any]]:
    """Everything an append could change: the count, the head and the step rows."""
    return ledger.count(), ledger.head(), ledger.steps()


# --- append-only, even from raw SQL ----------------------------------------------------

REFUSED_SQL = [
    pytest.param("UPDATE events SET payload = x'00' WHERE seq = 2", "UPDATE", id="update-payload"),
    pytest.param("UPDATE events SET step = 'other' WHERE seq = 2", "UPDATE", id="update-step"),
    pytest.param("UPDATE events SET seq = seq + 100", "UPDATE", id="update-seq"),
    pytest.param("DELETE FROM events WHERE seq = 2", "DELETE", id="delete-one"),
    pytest.param("DELETE FROM events", "DELETE", id="delete-all"),
    pytest.param(
        "INSERT OR REPLACE INTO events SELECT seq, time_ns, workspace, run, 'forged', attempt,"
        " epoch, rev, journal_key, kind, v, payload, prev_hash, hash FROM events WHERE seq = 2",
        "REPLACE", id="replace-by-seq",
    ),
    pytest.param(
        "REPLACE INTO events SELECT seq + 100, time_ns, workspace, run, step, attempt,"
        " epoch, rev, journal_key, kind, v, payload, prev_hash, hash FROM events WHERE seq = 2",
        "REPLACE", id="replace-by-journal-key",
    ),
    pytest.param(
        "INSERT INTO events SELECT * FROM events WHERE seq = 2"
        " ON CONFLICT(seq) DO UPDATE SET payload = x'00'",
        "(REPLACE|UPDATE)", id="upsert",
    ),
]


def _rows(path: Path | str) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(path))
    try:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


@pytest.mark.sqlite_only
@pytest.mark.parametrize(("sql", "what"), REFUSED_SQL)
def test_raw_sql_cannot_change_events(ledger: Ledger, commit_step, sql: str, what: str) -> None:
    commit_step(ledger, "s")
    before = _rows(ledger.path)
    raw = apsw.Connection(ledger.path)
    try:
        with pytest.raises(apsw.ConstraintError,
                           match=f"^stepledger events are append-only: {what} refused$"):
            raw.execute(sql)
    finally:
        raw.close()
    assert _rows(ledger.path) == before
    assert ledger.verify().ok


@pytest.mark.sqlite_only
def test_the_refusals_come_from_our_triggers(ledger: Ledger, commit_step, tmp_path: Path) -> None:
    commit_step(ledger, "s")
    ledger.close()
    raw = apsw.Connection(ledger.path)
    triggers = dict(raw.execute(
        "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = 'events'"
    ).fetchall())
    raw.close()
    assert set(triggers) == {"events_no_update", "events_no_delete", "events_no_replace"}
    assert "BEFORE UPDATE ON events" in triggers["events_no_update"]
    assert "append-only: UPDATE refused" in triggers["events_no_update"]
    assert "BEFORE DELETE ON events" in triggers["events_no_delete"]
    assert "append-only: DELETE refused" in triggers["events_no_delete"]
    assert "BEFORE INSERT ON events" in triggers["events_no_replace"]
    # Control: without the triggers the very same statements go through.
    copy = copy_ledger(ledger.path, tmp_path / "no-triggers.db")
    raw = apsw.Connection(str(copy))
    for name in triggers:
        raw.execute(f"DROP TRIGGER {name}")
    for p in REFUSED_SQL:
        raw.execute(p.values[0])
    raw.close()
    assert _rows(copy) != _rows(ledger.path)


# --- journal keys: dedupe and conflicts ------------------------------------------------


def test_redelivery_returns_the_original(ledger: Ledger) -> None:
    events = commit_events("s", ledger=ledger)
    first = [ledger.append(e) for e in events]
    before = state(ledger)
    for e, original in zip(events, first, strict=True):
        again = ledger.append(e)
        assert again.deduped and not original.deduped
        assert (again.seq, again.hash, again.time_ns, again.journal_key) == (
            original.seq, original.hash, original.time_ns, original.journal_key)
        assert again.event == original.event
        assert state(ledger) == before
    batch = ledger.append_batch(events)
    assert [r.seq for r in batch] == [1, 2, 3, 4]
    assert all(r.deduped for r in batch)
    assert state(ledger) == before


def test_redelivery_of_an_old_attempt_is_still_answered(ledger: Ledger) -> None:
    p1 = Planned(step="s", attempt=1)
    c1 = Compensated(step="s", attempt=1, reason="epoch died")
    ledger.append_batch([p1, c1])
    ledger.append(Planned(step="s", attempt=2))
    before = state(ledger)
    assert ledger.append(p1).seq == 1 and ledger.append(p1).deduped
    assert ledger.append(c1).seq == 2
    assert state(ledger) == before
    assert ledger.step("s").attempt == 2


def test_redelivery_is_answered_even_after_its_blob_is_gone(ledger: Ledger) -> None:
    """The journal answers before the blob guard: a redelivery reports the past."""
    events = commit_events("s", ledger=ledger)
    first = ledger.append_batch(events)
    stored = events[1]
    assert ledger.blobs.delete(stored.digest)
    before = state(ledger)
    again = ledger.append(stored)  # blob-stored is still legal after acked: only the
    assert again.deduped and again.seq == first[1].seq  # journal can answer it
    assert state(ledger) == before
    with pytest.raises(IdempotencyConflict):  # its key with another payload: a conflict
        ledger.append(msgspec.structs.replace(stored, size=stored.size + 1))
    ledger.append(Planned(step="t", attempt=1))
    with pytest.raises(BlobNotFound):  # a new event naming the vanished blob: refused
        ledger.append(msgspec.structs.replace(stored, step="t"))
    assert ledger.count() == 5


def test_dedupe_inside_one_batch(ledger: Ledger) -> None:
    stored = BlobStored(step="s", attempt=1, digest=D1, size=3)
    recs = ledger.append_batch([Planned(step="s", attempt=1), stored, stored])
    assert [(r.seq, r.deduped) for r in recs] == [(1, False), (2, False), (2, True)]
    assert ledger.count() == 2
    assert ledger.step("s").stored_bytes == 3  # counted once


CONFLICTS = [
    pytest.param(Planned(step="s", attempt=1, run="another-run"), 1, id="planned"),
    pytest.param(Planned(step="s", attempt=1, epoch=9), 1, id="planned-epoch"),
    pytest.param(BlobStored(step="s", attempt=1, digest=D1, size=999), 2, id="stored-size"),
    pytest.param(
        ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=M2), 3, id="published"
    ),
    pytest.param(Acked(step="s", attempt=1, manifest_rev=0, run="r2"), 4, id="acked"),
]


@pytest.mark.parametrize(("event", "seq"), CONFLICTS)
def test_same_key_other_payload_is_a_conflict(ledger: Ledger, event: Any, seq: int) -> None:
    ledger.append_batch([
        Planned(step="s", attempt=1),
        BlobStored(step="s", attempt=1, digest=D1, size=3),
        ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=M1),
        Acked(step="s", attempt=1, manifest_rev=0),
    ])
    before = state(ledger)
    with pytest.raises(IdempotencyConflict) as info:
        ledger.append(event)
    assert info.value.seq == seq
    assert info.value.journal_key == ev.journal_key(event)
    assert state(ledger) == before
    with pytest.raises(IdempotencyConflict):  # also inside a batch: nothing of it lands
        ledger.append_batch([Planned(step="t", attempt=1), event])
    assert state(ledger) == before


def test_the_first_refused_event_names_the_error(ledger: Ledger) -> None:
    """A conflicting redelivery the lifecycle allows (a pin), then an illegal event: the
    batch is refused for the conflict, the first thing wrong with it."""
    pin = BlobPinned(step="s", attempt=1, digest=D1)
    ledger.append_batch([Planned(step="s", attempt=1), pin])
    before = state(ledger)
    other_pin = msgspec.structs.replace(pin, role="pre-image")
    with pytest.raises(IdempotencyConflict):
        ledger.append_batch([other_pin, Acked(step="s", attempt=1)])
    with pytest.raises(IllegalTransition):
        ledger.append_batch([pin, Acked(step="s", attempt=1), other_pin])
    assert state(ledger) == before
    recs = ledger.append_batch([pin, Fenced(step="s", attempt=1)])  # a redelivery in a batch
    assert [(r.seq, r.deduped) for r in recs] == [(2, True), (3, False)]


def test_conflict_inside_one_batch_writes_nothing(ledger: Ledger) -> None:
    with pytest.raises(IdempotencyConflict):
        ledger.append_batch([
            Planned(step="s", attempt=1),
            BlobStored(step="s", attempt=1, digest=D1, size=3, path="a.txt"),
            BlobStored(step="s", attempt=1, digest=D1, size=4, path="a.txt"),  # same key
        ])
    assert ledger.count() == 0
    assert ledger.steps() == []


# --- illegal transitions ---------------------------------------------------------------

P1 = Planned(step="s", attempt=1)
P2 = Planned(step="s", attempt=2)
PUB0 = ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=M1)
ACK0 = Acked(step="s", attempt=1, manifest_rev=0)
COMP1 = Compensated(step="s", attempt=1, reason="undo")
REJ1 = Rejected(step="s", attempt=1, reason="stale_rev")

ILLEGAL: list[Any] = [
    # acked needs a published manifest
    pytest.param([P1], Acked(step="s", attempt=1), id="acked-after-planned"),
    pytest.param([P1, Fenced(step="s", attempt=1)], Acked(step="s", attempt=1),
                 id="acked-after-fenced"),
    pytest.param([P1, BlobStored(step="s", attempt=1, digest=D1, size=3)],
                 Acked(step="s", attempt=1), id="acked-after-stored"),
    pytest.param([P1, PUB0], Acked(step="s", attempt=1, manifest_rev=1), id="acked-wrong-rev"),
    # nothing follows compensated within the attempt
    *[pytest.param([P1, COMP1], e, id=f"{ev.kind_of(e)}-after-compensated") for e in [
        Fenced(step="s", attempt=1),
        BlobPinned(step="s", attempt=1, digest=D2),
        BlobStored(step="s", attempt=1, digest=D2, size=3),
        ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=M1),
        Acked(step="s", attempt=1),
        Rejected(step="s", attempt=1, reason="overlap"),
    ]],
    pytest.param([P1, PUB0, ACK0, COMP1], ManifestPublished(
        step="s", attempt=1, manifest_rev=1, expected_rev=0, digest=M2, supersedes=M1),
        id="supersede-after-compensated"),
    # nothing follows rejected within the attempt
    pytest.param([P1, REJ1], Fenced(step="s", attempt=1), id="fenced-after-rejected"),
    pytest.param([P1, REJ1], BlobStored(step="s", attempt=1, digest=D1, size=3),
                 id="stored-after-rejected"),
    pytest.param([P1, REJ1], Compensated(step="s", attempt=1), id="compensated-after-rejected"),
    # a new attempt only after the latest ended
    pytest.param([P1], P2, id="new-attempt-while-planned"),
    pytest.param([P1, Fenced(step="s", attempt=1)], P2, id="new-attempt-while-fenced"),
    pytest.param([P1, BlobStored(step="s", attempt=1, digest=D1, size=3)], P2,
                 id="new-attempt-while-stored"),
    pytest.param([P1, PUB0], P2, id="new-attempt-while-published"),
    pytest.param([P1, PUB0, ACK0], P2, id="new-attempt-while-acked"),
    # attempt numbers never skip, never start above 1
    pytest.param([], P2, id="first-attempt-is-2"),
    pytest.param([P1, REJ1], Planned(step="s", attempt=3), id="attempt-skips"),
    pytest.param([P1, COMP1, P2, Compensated(step="s", attempt=2)], Planned(step="s", attempt=5),
                 id="attempt-skips-later"),
    # events of an older attempt
    pytest.param([P1, REJ1, P2], Fenced(step="s", attempt=1), id="fenced-old-attempt"),
    pytest.param([P1, COMP1, P2], BlobStored(step="s", attempt=1, digest=D3, size=5),
                 id="stored-old-attempt"),
    pytest.param([P1, COMP1, P2], BlobPinned(step="s", attempt=1, digest=D3),
                 id="pinned-old-attempt"),
    pytest.param([P1, COMP1, P2], Fenced(step="s", attempt=3), id="fenced-future-attempt"),
    # the lifecycle order
    pytest.param([], Fenced(step="s", attempt=1), id="never-planned"),
    pytest.param([P1, Fenced(step="s", attempt=1)], Rejected(step="s", attempt=1, reason="overlap"),
                 id="rejected-after-fenced"),
    pytest.param([P1, BlobStored(step="s", attempt=1, digest=D1, size=3)],
                 Fenced(step="s", attempt=1), id="fenced-after-stored"),
    # the manifest compare-and-swap
    pytest.param([P1], ManifestPublished(step="s", attempt=1, manifest_rev=1, digest=M1),
                 id="publish-skips-rev"),
    pytest.param([P1], ManifestPublished(step="s", attempt=1, manifest_rev=0, expected_rev=0,
                                         digest=M1), id="publish-expects-missing-live"),
    pytest.param([P1], ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=M1,
                                         supersedes=M2), id="create-supersedes"),
    pytest.param([P1, PUB0], ManifestPublished(step="s", attempt=1, manifest_rev=1, digest=M2),
                 id="create-while-live"),
    pytest.param([P1, PUB0], ManifestPublished(step="s", attempt=1, manifest_rev=1,
                                               expected_rev=0, digest=M2, supersedes=M2),
                 id="supersede-wrong-digest"),
    pytest.param([P1, PUB0], ManifestPublished(step="s", attempt=1, manifest_rev=1,
                                               expected_rev=0, digest=M2),
                 id="supersede-names-nothing"),
    pytest.param([P1, PUB0, ManifestPublished(step="s", attempt=1, manifest_rev=1, expected_rev=0,
                                              digest=M2, supersedes=M1)],
                 ManifestPublished(step="s", attempt=1, manifest_rev=2, expected_rev=0,
                                   digest=M1, supersedes=M2), id="supersede-stale-expected"),
]


@pytest.mark.parametrize(("setup", "event"), ILLEGAL)
def test_illegal_transition_writes_nothing(ledger: Ledger, setup: list[Any], event: Any) -> None:
    ledger.append(WorkspaceAdded(workspace="w", root="/w"))
    if setup:
        ledger.append_batch(setup)
    before = state(ledger)
    with pytest.raises(IllegalTransition) as info:
        ledger.append(event)
    assert (info.value.step, info.value.attempt) == (event.step, event.attempt)
    assert info.value.kind == ev.kind_of(event)
    assert state(ledger) == before
    # The same event last in a batch: the legal ones before it are not written either.
    with pytest.raises(IllegalTransition):
        ledger.append_batch([Planned(step="other", attempt=1), Fenced(step="other", attempt=1),
                             event])
    assert state(ledger) == before
    with pytest.raises(UnknownStep):
        ledger.step("other")


def test_legal_counterparts_of_the_illegal_cases_are_accepted(ledger: Ledger) -> None:
    """Controls: the lifecycle the refusals carve out does work."""
    ledger.append_batch([P1, COMP1, P2, Rejected(step="s", attempt=2, reason="pre_hash"),
                         Planned(step="s", attempt=3)])
    assert ledger.step("s").attempt == 3
    ledger.append_batch([
        Fenced(step="s", attempt=3, rev=1),
        BlobPinned(step="s", attempt=3, digest=D1),
        BlobStored(step="s", attempt=3, digest=D1, size=3),
        ManifestPublished(step="s", attempt=3, manifest_rev=0, digest=M1),
        Acked(step="s", attempt=3, manifest_rev=0),
        ManifestPublished(step="s", attempt=3, manifest_rev=1, expected_rev=0, digest=M2,
                          supersedes=M1),
        Acked(step="s", attempt=3, manifest_rev=1),
        Compensated(step="s", attempt=3, reason="revert"),
        Planned(step="s", attempt=4),
        ManifestPublished(step="s", attempt=4, manifest_rev=2, digest=M1),
    ])
    row = ledger.step("s")
    assert (row.attempt, row.state, row.manifest_rev, row.live) == (
        4, "manifest-published", 2, True)
    assert ledger.timeline("s")[-1].event.digest == M1


def test_a_batch_is_all_or_nothing(ledger: Ledger) -> None:
    ledger.append(Planned(step="a", attempt=1))
    before = state(ledger)
    batch = commit_events("b", ledger=ledger) + [Fenced(step="b", attempt=1)]  # last one illegal
    with pytest.raises(IllegalTransition):
        ledger.append_batch(batch)
    assert state(ledger) == before
    with pytest.raises(UnknownStep):
        ledger.step("b")
    recs = ledger.append_batch(batch[:-1])  # without it, the batch lands whole
    assert [r.seq for r in recs] == [2, 3, 4, 5]


def test_a_batch_may_depend_on_itself(ledger: Ledger, clock: FakeClock) -> None:
    events = (commit_events("s", attempt=1, ledger=ledger)[:1] + [Compensated(step="s", attempt=1)]
              + commit_events("s", attempt=2, manifest_rev=0, ledger=ledger)
              + commit_events("t", ledger=ledger))
    calls = clock.calls
    recs = ledger.append_batch(events)
    assert clock.calls == calls + 1  # one transaction, one time
    assert [r.seq for r in recs] == list(range(1, len(events) + 1))
    assert {r.time_ns for r in recs} == {clock.last}
    assert not any(r.deduped for r in recs)
    s, t = ledger.step("s"), ledger.step("t")
    assert (s.state, s.attempt, s.live, s.first_seq, s.last_seq) == ("acked", 2, True, 1, 6)
    assert (t.state, t.attempt, t.first_seq, t.last_seq) == ("acked", 1, 7, 10)
    assert ledger.verify().ok


def test_each_append_is_one_clock_reading(ledger: Ledger, clock: FakeClock) -> None:
    r1 = ledger.append(Planned(step="s", attempt=1))
    clock.advance(3600)
    r2 = ledger.append(Fenced(step="s", attempt=1))
    assert r2.time_ns - r1.time_ns >= 3600 * 10**9
    assert ledger.step("s").updated_ns == r2.time_ns


def test_head(ledger: Ledger) -> None:
    empty = ledger.head()
    assert empty.seq == 0 and empty.hash == ev.genesis_hash(ledger.ledger_id)
    recs = ledger.append_batch(commit_events("s", ledger=ledger))
    assert ledger.head() == Head(4, recs[-1].hash)
    assert Head.parse(str(ledger.head())) == ledger.head()


# --- reading ---------------------------------------------------------------------------


@pytest.fixture
def mixed(ledger: Ledger) -> Ledger:
    """Three steps interleaved, plus a workspace event: 13 events."""
    a, b, c = (commit_events(s, ledger=ledger) for s in "abc")
    ledger.append(WorkspaceAdded(workspace="w", root="/w"))
    for i in range(4):
        for events in (a, b, c):
            ledger.append(events[i])
    return ledger


READS = [
    {},
    {"after_seq": 5},
    {"after_seq": 13},
    {"after_seq": 100},
    {"step": "b"},
    {"step": "nobody"},
    {"kind": "acked"},
    {"kind": "workspace-added"},
    {"step": "c", "kind": "blob-stored"},
    {"limit": 0},
    {"limit": 1},
    {"limit": 5},
    {"limit": 100},
    {"step": "a", "after_seq": 4},
    {"step": "a", "after_seq": 4, "limit": 2},
    {"kind": "planned", "limit": 2},
    {"after_seq": 3, "limit": 7},
]


def _expected(all_events: list[Any], q: dict[str, Any]) -> list[int]:
    out = [r.seq for r in all_events
           if r.seq > q.get("after_seq", 0)
           and q.get("step") in (None, r.step)
           and q.get("kind") in (None, r.kind)]
    return out if q.get("limit") is None else out[: q["limit"]]


@pytest.mark.parametrize("read_batch", [eventsmod.READ_BATCH, 1, 2, 3])
def test_read_filters_and_pages(mixed: Ledger, monkeypatch, read_batch: int) -> None:
    all_events = list(mixed.read())
    assert [r.seq for r in all_events] == list(range(1, 14))
    monkeypatch.setattr(eventsmod, "READ_BATCH", read_batch)
    assert [r.seq for r in mixed.read()] == list(range(1, 14))
    for q in READS:
        got = list(mixed.read(**q))
        assert [r.seq for r in got] == _expected(all_events, q), q
        assert not any(r.deduped for r in got)
    assert [r.kind for r in mixed.read(step="b")] == [
        "planned", "blob-stored", "manifest-published", "acked"]
    assert [r.step for r in mixed.read(kind="acked")] == ["a", "b", "c"]
    assert [r.seq for r in mixed.timeline("c")] == [4, 7, 10, 13]


def test_read_refuses_bad_filters(mixed: Ledger) -> None:
    with pytest.raises(InvalidInput):
        list(mixed.read(kind="exploded"))
    with pytest.raises(InvalidInput):
        list(mixed.read(step="a\n"))
    with pytest.raises(UnknownStep):
        mixed.timeline("nobody")
    with pytest.raises(UnknownStep):
        mixed.step("nobody")


def test_two_connections_interleaved_keep_one_chain(tmp_path, ledger_at) -> None:
    """The head and step rows each connection caches are dropped when the other one
    commits (PRAGMA data_version): interleaved writers extend one dense, valid chain."""
    from ledger import Acked, Ledger, Planned
    from ledger.runner import run_step

    path = ledger_at(tmp_path / "shared.db")
    a = Ledger.init(path)
    b = Ledger.open(path)
    try:
        for i in range(20):
            writer, other = (a, b) if i % 2 == 0 else (b, a)
            run_step(writer, f"s{i}", {"out.txt": f"output {i}".encode()})
            # the other connection sees the step as committed and cannot re-plan it
            assert other.step(f"s{i}").live
            assert not run_step(other, f"s{i}", {"out.txt": b"again"}).ran
        a.append(Planned(step="x", attempt=1))
        with pytest.raises(IllegalTransition):
            b.append(Acked(step="x", attempt=1))
        report = a.verify()
        assert report.ok, report.findings
        assert report.events == b.count() and b.head() == a.head()
    finally:
        a.close()
        b.close()


#: The `ledger` fixture runs each test on SQLite and on PostgreSQL (tests/conftest.py).
BOTH_STORES = True


def test_a_callers_events_are_validated_whole_even_wrapped_as_the_librarys_own(
        tmp_path: Path, ledger_at: Any) -> None:
    """`events.Built` (the library's trusted construction path: encoded, not decoded
    again) is not accepted from a caller: an event with a step id its constraints refuse
    (too long)
    is refused, nothing written, wrapped or not."""
    from ledger import InvalidInput, Ledger, Planned
    from ledger.events import Built

    with Ledger.init(ledger_at(tmp_path / "l.db")) as led:
        bad = Planned(step="x" * 5000, attempt=1)  # longer than a step id may be
        head = led.head()
        for attempt in (bad, Built(bad)):
            with pytest.raises(InvalidInput):
                led.append(attempt)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput):
                led.append_batch([attempt])  # type: ignore[list-item]
        assert led.head() == head

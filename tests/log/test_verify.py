"""verify: every edit, deletion, reordering, cut-off tail and projection edit is named.

Tampering happens on a copy, behind the ledger's back: the append-only triggers are
dropped, the rows edited, and the triggers recreated with their exact SQL (conftest
`tamper`), so the schema allow-list still accepts the file and only `verify` can tell.
A ledger whose triggers stay dropped is examined all the same (the other commands refuse
it); edited facts verify once trusted (meta, the projection checkpoint, condemned rows)
are findings; attempts that weakened the fence are warnings; verify's memory follows the
live steps, not the events.

These tests damage the SQLite file itself: they run on SQLite.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest

from conftest import (
    FakeClock,
    commit_step,
    copy_ledger,
    digest_of,
    lock_files_aside,
    raw_connection,
    run_cli,
    snapshot_dir,
    tamper,
)
from test_workdir import MiB, measure, needs_proc  # peak RSS: tools/bench_memory.py
from ledger import (
    BlobStored,
    Head,
    InvalidInput,
    Ledger,
    NotALedger,
    Planned,
    RecordedEvent,
    VerifyReport,
)
from ledger import events as ev
from ledger.step.values import StepPlan, Write
from ledger.runner import run_step

EVENTS = 13  # a, b, c committed (4 events each), d planned


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RecordedEvent], Head]:
    path = tmp_path_factory.mktemp("original") / "ledger.db"
    with Ledger.init(path, clock=FakeClock()) as led:
        for s in "abc":
            commit_step(led, s)
        led.append(Planned(step="d", attempt=1))
        events, head = list(led.read()), led.head()
    assert [r.kind for r in events[4:8]] == [
        "planned", "blob-stored", "manifest-published", "acked"]
    assert len(events) == EVENTS
    return path, events, head


@pytest.fixture
def victim(original: tuple[Path, list[RecordedEvent], Head], tmp_path: Path) -> Path:
    """A fresh copy of the original ledger (and its blobs) to damage."""
    return copy_ledger(original[0], tmp_path / "ledger.db")


def check(path: Path, **kwargs: Any) -> tuple[VerifyReport, set[tuple[str, int]]]:
    """Verify read-only; the report and its findings as (check, seq). Asserts no writes."""
    before = snapshot_dir(path.parent)
    with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
        report = led.verify(**kwargs)
    assert lock_files_aside(snapshot_dir(path.parent)) == lock_files_aside(before)
    return report, {(f.check, f.seq) for f in report.findings}


def rows(path: Path) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(f"file:{path}?immutable=1",
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


def reencoded(event: Any, **changes: Any) -> bytes:
    return ev.encode(msgspec.structs.replace(event, **changes))


# --- clean ---------------------------------------------------------------------------


def test_a_clean_ledger_verifies(original: tuple[Path, list[RecordedEvent], Head],
                                 victim: Path) -> None:
    _, events, head = original
    report, found = check(victim)
    assert report.ok and found == set()
    assert (report.events, report.head_seq, report.head_hash) == (EVENTS, EVENTS, head.hash.hex())
    assert (report.steps, report.projection_lag) == (4, 0)
    with Ledger.open(victim, clock=FakeClock()) as led:  # read-write agrees
        assert led.verify().ok
        calls: list[tuple[int, int]] = []
        assert led.verify(progress=lambda d, t: calls.append((d, t))).ok
        assert calls[-1] == (EVENTS, EVENTS)
    for expect in (head, str(head), f"  {head}\n", Head(0, ev.genesis_hash("whatever")),
                   Head(5, events[4].hash)):
        report, found = check(victim, expect_head=expect)
        assert report.ok, (expect, report.findings)


# --- edits -----------------------------------------------------------------------------


def test_an_edited_payload_is_a_chain_finding_at_its_seq(
    original: tuple[Path, list[RecordedEvent], Head], victim: Path
) -> None:
    _, events, _ = original
    stored = events[5].event
    assert isinstance(stored, BlobStored)
    tamper(victim, [("UPDATE events SET payload = ? WHERE seq = 6",
                     (reencoded(stored, inline=not stored.inline),))])
    report, found = check(victim)
    assert not report.ok
    assert found == {("chain", 6)}  # only that row: the next one still links to its hash
    assert "seq" not in {c for c, _ in found}


def test_an_edit_with_its_hash_recomputed_breaks_the_next_link(
    original: tuple[Path, list[RecordedEvent], Head], victim: Path
) -> None:
    _, events, _ = original
    r = events[5]
    payload = reencoded(r.event, inline=not r.event.inline)
    forged = ev.chain_hash(r.prev_hash, r.seq, r.time_ns, ev.envelope(r.event), r.journal_key,
                           r.kind, r.v, payload)
    tamper(victim, [("UPDATE events SET payload = ?, hash = ? WHERE seq = 6", (payload, forged))])
    report, found = check(victim)
    assert found == {("chain", 7)}


def test_two_edits_are_both_reported(original: tuple[Path, list[RecordedEvent], Head],
                                     victim: Path) -> None:
    _, events, _ = original
    tamper(victim, [
        ("UPDATE events SET payload = ? WHERE seq = 2", (reencoded(events[1].event, path="x"),)),
        ("UPDATE events SET payload = ? WHERE seq = 10", (reencoded(events[9].event, path="y"),)),
    ])
    # each edited path is also in its blob-stored journal key (event v2): a row finding too
    assert check(victim)[1] == {("chain", 2), ("chain", 10), ("row", 2), ("row", 10)}


@pytest.mark.parametrize(("sql", "expected"), [
    pytest.param("UPDATE events SET epoch = 7 WHERE seq = 6", {("row", 6)}, id="epoch"),
    pytest.param("UPDATE events SET step = 'zz' WHERE seq = 6", {("row", 6)}, id="step"),
    pytest.param("UPDATE events SET attempt = 2 WHERE seq = 6", {("row", 6)}, id="attempt"),
    pytest.param("UPDATE events SET workspace = 'w' WHERE seq = 6", {("row", 6)}, id="workspace"),
    pytest.param("UPDATE events SET run = 'r' WHERE seq = 6", {("row", 6)}, id="run"),
    pytest.param("UPDATE events SET rev = 3 WHERE seq = 6", {("row", 6)}, id="rev"),
    pytest.param("UPDATE events SET time_ns = time_ns + 1 WHERE seq = 6", {("chain", 6)},
                 id="time"),
    pytest.param("UPDATE events SET kind = 'fenced' WHERE seq = 6", {("chain", 6), ("row", 6)},
                 id="kind"),
    pytest.param("UPDATE events SET journal_key = 'k' WHERE seq = 6",
                 {("chain", 6), ("row", 6)}, id="journal-key"),
    pytest.param("UPDATE events SET v = 0 WHERE seq = 6", {("chain", 6)}, id="version"),
    pytest.param("UPDATE events SET prev_hash = zeroblob(32) WHERE seq = 6", {("chain", 6)},
                 id="prev-hash"),
    pytest.param("UPDATE events SET hash = zeroblob(32) WHERE seq = 6",
                 {("chain", 6), ("chain", 7)}, id="hash"),
])
def test_an_edited_column_is_reported(
    victim: Path, sql: str, expected: set[tuple[str, int]]
) -> None:
    tamper(victim, [(sql, ())])
    report, found = check(victim)
    assert not report.ok
    assert expected <= found, report.findings
    assert {s for _, s in found} - {0} <= {6, 7}  # it names the seq, nothing unrelated


def test_an_undecodable_payload_is_reported_not_raised(victim: Path) -> None:
    tamper(victim, [("UPDATE events SET payload = ? WHERE seq = 5", (b'{"kind":"planned"}',))])
    report, found = check(victim)
    assert ("row", 5) in found
    assert ("projection", 0) in found  # the steps cannot be folded: reported too


# --- deletion and reordering -----------------------------------------------------------


def test_a_deleted_middle_event_is_reported(victim: Path) -> None:
    tamper(victim, [("DELETE FROM events WHERE seq = 6", ())])
    report, found = check(victim)
    assert {("seq", 7), ("chain", 7)} <= found
    assert report.events == EVENTS - 1


def test_a_deleted_plan_is_reported_not_raised(victim: Path) -> None:
    """Without its `planned`, step b's lifecycle cannot be folded: still a report."""
    tamper(victim, [("DELETE FROM events WHERE seq = 5", ())])
    report, found = check(victim)
    assert {("seq", 6), ("chain", 6), ("projection", 0)} <= found
    assert any("cannot be folded" in f.message for f in report.findings)


def test_swapped_payloads_are_reported(victim: Path) -> None:
    """Two blob-stored events trade payloads (same kind: the swap is easy to miss)."""
    def swap(conn: apsw.Connection) -> None:
        (p2,), (p6,) = (conn.execute("SELECT payload FROM events WHERE seq = ?", (s,)).fetchall()
                        for s in (2, 6))
        conn.execute("UPDATE events SET payload = ? WHERE seq = 2", p6)
        conn.execute("UPDATE events SET payload = ? WHERE seq = 6", p2)

    tamper(victim, swap)
    report, found = check(victim)
    assert {("chain", 2), ("chain", 6)} <= found


def test_reordered_rows_are_reported(victim: Path) -> None:
    """Rows 5 and 9 (b's and c's plans) trade places, every column but seq."""
    def reorder(conn: apsw.Connection) -> None:
        r5, r9 = (conn.execute("SELECT * FROM events WHERE seq = ?", (s,)).fetchone()
                  for s in (5, 9))
        conn.execute("DELETE FROM events WHERE seq IN (5, 9)")
        marks = ",".join("?" * len(r5))
        conn.execute(f"INSERT INTO events VALUES ({marks})", (5, *r9[1:]))
        conn.execute(f"INSERT INTO events VALUES ({marks})", (9, *r5[1:]))

    tamper(victim, reorder)
    report, found = check(victim)
    assert {("chain", 5), ("chain", 9)} <= found
    assert not report.ok


# --- cut-off tails and rewritten history -----------------------------------------------


def test_a_cut_off_tail_needs_the_recorded_head(
    original: tuple[Path, list[RecordedEvent], Head], victim: Path
) -> None:
    _, _, head = original
    tamper(victim, [("DELETE FROM events WHERE seq > ?", (EVENTS - 3,))])
    # The projection still shows what the cut events did: that much is visible...
    assert not check(victim)[0].ok
    with Ledger.open(victim, clock=FakeClock()) as led:  # ...until it is refolded.
        led.rebuild()
    report, found = check(victim)
    assert report.ok, report.findings  # the chain alone cannot see its tail cut off
    assert report.head_seq == EVENTS - 3
    report, found = check(victim, expect_head=head)
    assert found == {("head", 0)}
    report, found = check(victim, expect_head=str(head))
    assert found == {("head", 0)}


@pytest.mark.sqlite_only
def test_an_older_genuine_copy_needs_the_recorded_head(tmp_path: Path) -> None:
    """A rollback to a real earlier state of the file: the chain is intact."""
    path = tmp_path / "live" / "ledger.db"
    with Ledger.init(path, clock=FakeClock()) as led:
        commit_step(led, "a")
    old = copy_ledger(path, tmp_path / "old.db")
    with Ledger.open(path, clock=FakeClock()) as led:
        commit_step(led, "b")
        head = led.head()
    report, found = check(old)
    assert report.ok
    assert check(old, expect_head=head)[1] == {("head", 0)}
    assert check(path, expect_head=head)[0].ok


def test_a_rewritten_history_is_caught_by_the_recorded_head(
    original: tuple[Path, list[RecordedEvent], Head], victim: Path
) -> None:
    """An attacker who edits event 6 and recomputes every hash after it fools the chain,
    but not the head recorded elsewhere."""
    _, events, head = original
    with Ledger.open(victim, readonly=True, clock=FakeClock()) as led:
        ledger_id = led.ledger_id  # not a secret: anyone can recompute the chain

    def rewrite(conn: apsw.Connection) -> None:
        prev = ev.genesis_hash(ledger_id)
        for r in events:
            payload = reencoded(r.event, inline=not r.event.inline) if r.seq == 6 else ev.encode(r.event)
            digest = ev.chain_hash(prev, r.seq, r.time_ns, ev.envelope(r.event), r.journal_key,
                                   r.kind, r.v, payload)
            conn.execute("UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                         (payload, prev, digest, r.seq))
            prev = digest

    tamper(victim, rewrite)
    assert rows(victim) != rows(original[0])
    report, found = check(victim)
    assert report.ok  # a keyless chain can be recomputed: this is what the witness is for
    assert check(victim, expect_head=head)[1] == {("head", EVENTS)}
    assert check(victim, expect_head=Head(6, events[5].hash))[1] == {("head", 6)}
    assert check(victim, expect_head=Head(5, events[4].hash))[0].ok  # before the edit


def test_an_expected_head_off_the_chain_is_caught(
    original: tuple[Path, list[RecordedEvent], Head], victim: Path
) -> None:
    _, events, head = original
    assert check(victim, expect_head=Head(head.seq, b"\x00" * 32))[1] == {("head", EVENTS)}
    assert check(victim, expect_head=Head(3, events[3].hash))[1] == {("head", 3)}
    assert check(victim, expect_head=Head(EVENTS + 1, head.hash))[1] == {("head", 0)}


BAD_HEADS = [
    "", "   ", "12", "12:", ":" + "ab" * 32, "abc", "-1:" + "ab" * 32, "x:" + "ab" * 32,
    "1:" + "ab" * 31 + "a", "1:" + "ab" * 33, "1:" + "zz" * 32, "1:" + "ab " * 32,
    "1_0:" + "ab" * 32, "+1:" + "ab" * 32, "1 :" + "ab" * 32, "1: " + "ab" * 32,
    "\u0661:" + "ab" * 32, "1:" + "ab" * 32 + ":2", "1:0x" + "ab" * 31,
]


@pytest.mark.parametrize("text", BAD_HEADS)
def test_head_parse_rejects_malformed_text(text: str, victim: Path) -> None:
    with pytest.raises(InvalidInput, match="SEQ:HASH"):
        Head.parse(text)
    with Ledger.open(victim, readonly=True, clock=FakeClock()) as led:
        with pytest.raises(InvalidInput):
            led.verify(expect_head=text)


def test_head_parse_round_trips(original: tuple[Path, list[RecordedEvent], Head]) -> None:
    head = original[2]
    assert Head.parse(str(head)) == head
    assert Head.parse(f"{head}\n") == head
    assert Head.parse(f"{head.seq}:{head.hash.hex().upper()}") == head
    assert Head.parse("0:" + "00" * 32) == Head(0, bytes(32))


# --- projections -----------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "UPDATE steps SET state = 'acked' WHERE step_id = 'd'",
    "UPDATE steps SET live = 0, manifest_digest = NULL WHERE step_id = 'a'",
    "UPDATE steps SET stored_bytes = stored_bytes + 1 WHERE step_id = 'b'",
    "DELETE FROM steps WHERE step_id = 'c'",
    "INSERT INTO steps SELECT 'ghost', run, workspace, state, attempt, epoch, rev, manifest_rev,"
    " manifest_digest, live, committed_bytes, stored_bytes, first_seq, last_seq, updated_ns"
    " FROM steps WHERE step_id = 'a'",
])
def test_an_edited_projection_is_a_projection_finding(victim: Path, sql: str) -> None:
    tamper(victim, [(sql, ())])
    report, found = check(victim)
    assert found == {("projection", 0)}, report.findings
    assert report.events == EVENTS  # the log itself is fine
    assert check(victim)[0].findings == report.findings  # deterministic


def test_projection_finding_names_the_step_and_column(victim: Path) -> None:
    tamper(victim, [("UPDATE steps SET state = 'acked' WHERE step_id = 'd'", ())])
    (finding,) = check(victim)[0].findings
    assert "'d'" in finding.message
    assert "state='acked'" in finding.message and "'planned'" in finding.message


def test_a_lagging_projection_is_not_a_finding(victim: Path) -> None:
    tamper(victim, [("DELETE FROM steps", ()),
                    ("UPDATE projection_checkpoint SET last_seq = 0", ())])
    report, found = check(victim)
    assert report.ok, report.findings
    assert report.projection_lag == EVENTS


# --- a ledger whose append-only triggers were dropped (issue 11, item 10) -----------------


def small_ledger(path: Path) -> Path:
    """A closed ledger with committed artifact steps (inline and file blobs)."""
    with Ledger.init(path, clock=FakeClock()) as led:
        for i in range(3):
            run_step(led, f"s{i}", {"small.txt": f"small {i}".encode(),
                                    "big.bin": bytes([i]) * (led.inline_max_bytes + 1)})
    return path


def test_verify_reports_dropped_triggers_and_still_checks_the_chain(tmp_path: Path) -> None:
    """Item 10: on 984aaf7 verify refused such a file ("not a steptrail ledger", exit 2)."""
    path = small_ledger(tmp_path / "ledger.db")
    conn = raw_connection(path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("DROP TRIGGER events_no_delete")
    # what the dropped triggers let through: an event edited in place
    conn.execute("UPDATE events SET time_ns = time_ns + 1 WHERE seq = 2")
    conn.close()
    before = path.read_bytes()
    r = run_cli(["--ledger", str(path), "verify", "--json"])
    assert r.code == 1, r
    findings = [(f["check"], f["seq"], f["message"]) for f in r.json["findings"]]
    schema = [m for c, _, m in findings if c == "schema"]
    assert len(schema) == 2 and "trigger events_no_delete was dropped" in schema[0]
    assert "trigger events_no_update was dropped" in schema[1]
    assert ("chain", 2) in {(c, s) for c, s, _ in findings}  # the chain is still checked
    human = run_cli(["--ledger", str(path), "verify"])
    assert human.code == 1 and "VIOLATION [schema]" in human.out
    assert path.read_bytes() == before
    # every other command keeps refusing it, read-only or not
    for argv in (["events"], ["steps"], ["head"], ["audit"], ["gc", "--dry-run"], ["rebuild"],
                 ["show", "s0"], ["metrics"]):
        r = run_cli(["--ledger", str(path), *argv])
        assert r.code == 2 and "schema differs" in r.err, (argv, r)
    with pytest.raises(NotALedger):
        Ledger.open(path, readonly=True)
    with pytest.raises(InvalidInput):
        Ledger.open(path, forensic=True)  # a forensic open never writes
    assert path.read_bytes() == before


def test_verify_refuses_a_file_whose_tables_changed(tmp_path: Path) -> None:
    """A forensic open needs the tables as a ledger has them (every query means what it
    says); a changed table stays a refusal (exit 2), byte-identical."""
    path = small_ledger(tmp_path / "ledger.db")
    conn = raw_connection(path)
    conn.execute("ALTER TABLE steps ADD COLUMN loot TEXT")
    conn.close()
    before = path.read_bytes()
    r = run_cli(["--ledger", str(path), "verify"])
    assert r.code == 2 and "table steps" in r.err, r
    assert path.read_bytes() == before


# --- 11: facts verify used to trust ------------------------------------------------------


# --- facts verify used to trust (issue 11, item 11) ---------------------------------------


def _edit(path: Path, *statements: str | tuple[str, tuple]) -> None:
    conn = raw_connection(path)
    with conn:
        for sql in statements:
            conn.execute(*(sql if isinstance(sql, tuple) else (sql,)))
    conn.close()


def _verify(path: Path) -> list[tuple[str, str]]:
    r = run_cli(["--ledger", str(path), "verify", "--json"])
    assert r.code == (1 if r.json["findings"] else 0), r
    return [(f["check"], f["message"]) for f in r.json["findings"]]


@pytest.mark.parametrize("window", ["0", "1e300", "-5", "nan", "soon"])
def test_an_edited_compensation_window_is_a_finding(tmp_path: Path, window: str) -> None:
    """Item 11: 0 and 1e300 left verify ok on 984aaf7 (and 1e300 overflowed GC's arithmetic)."""
    path = small_ledger(tmp_path / "ledger.db")
    _edit(path, ("UPDATE meta SET value = ? WHERE key = 'compensation_window_s'", (window,)))
    found = _verify(path)
    assert [c for c, _ in found] == ["meta"] and "compensation_window_s" in found[0][1], found
    for argv in (["gc", "--dry-run"], ["audit"], ["steps"]):  # nothing acts on it
        r = run_cli(["--ledger", str(path), *argv])
        assert r.code == 2 and "compensation_window_s" in r.err and "verify" in r.err, (argv, r)


@pytest.mark.parametrize("sql, what", [
    # (the store refuses a checkpoint at or past the head that does not follow the log:
    # an editor drops the trigger first, and verify names both)
    ("DROP TRIGGER checkpoint_follows_update;"
     " UPDATE projection_checkpoint SET last_seq = 1000", "catching up would skip"),
    ("UPDATE projection_checkpoint SET version = -1", "version -1"),
    ("INSERT INTO projection_checkpoint VALUES ('loot', 1, 1)", "'loot'"),
    ("UPDATE meta SET value = 'not-an-id' WHERE key = 'ledger_id'", "ledger_id"),
    ("UPDATE meta SET value = 'yesterday' WHERE key = 'created_ns'", "created_ns"),
    ("UPDATE blob_data SET size = size + 1", "says"),
])
def test_an_edited_derived_fact_is_a_finding(tmp_path: Path, sql: str, what: str) -> None:
    """Item 11: a checkpoint moved ahead by 1000 left verify ok on 984aaf7 (the lag is
    max(0, head - checkpoint)), and so did the other facts here."""
    path = small_ledger(tmp_path / "ledger.db")
    _edit(path, sql)
    found = _verify(path)
    assert any(what in m for _, m in found), found


def test_stray_condemned_rows_are_findings(tmp_path: Path) -> None:
    """Item 11: rows no collector wrote left verify ok on 984aaf7. A row a collector
    leaves (an orphan condemned by a gc that was killed) is not a finding."""
    path = small_ledger(tmp_path / "ledger.db")
    with Ledger.open(path, clock=FakeClock()) as led:
        referenced = led.manifest("s0").artifacts[0]
        orphan = led.plan("orphan", artifacts=["o.txt"])
        led.store("orphan", orphan.attempt, "o.txt", b"an orphan")
        led.workspaces.compensate("orphan", reason="dropped")
    orphan_digest = digest_of(b"an orphan")
    _edit(path, ("INSERT INTO condemned VALUES (?, ?, 1, 5, '0123456789abcdef')",
                 (orphan_digest, len(b"an orphan"))))
    assert _verify(path) == []  # an interrupted gc's row: the next gc resumes it
    rows = [
        (referenced.digest, referenced.size, int(referenced.size <= 4096), 5, "0123456789abcdef"),
        ("f" * 64, -1, 7, 5, "0123456789abcdef"),
        ("not-a-digest", 1, 1, 5, "0123456789abcdef"),
        (digest_of(b"x"), 1, 1, 5, "planted"),
    ]
    _edit(path, *[("INSERT INTO condemned VALUES (?, ?, ?, ?, ?)", row) for row in rows])
    found = _verify(path)
    assert [c for c, _ in found] == ["gc"] * 4, found
    assert any("manifest references" in m for _, m in found)
    # while a collector runs, a referenced row is its own in-flight state, not a finding
    import fcntl
    fd = os.open(tmp_path / ".steptrail-gc.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert len(_verify(path)) == 3
    finally:
        os.close(fd)


# --- warnings: attempts that weakened the fence -------------------------------------------


def test_verify_lists_weakened_attempts_up_to_a_bound(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    with Ledger.init(tmp_path / "l.db") as led:
        led.workspaces.add("w", str(tmp_path / "ws"))
        epoch = led.workspaces.acquire("w", "a").epoch
        led.workspaces.admit("w", epoch, [StepPlan(f"s{i}", [Write(f"f{i}", b"x", None)])
                               for i in range(55)], fence="plan")
        report = led.verify()
    assert report.ok and not report.findings
    assert len(report.warnings) == 51 and report.warnings[-1].seq == 0
    assert "5 more attempts were" in report.warnings[-1].message
    assert "only against the workspace rev" in report.warnings[0].message


# --- memory follows the live steps, not the events (issue 11, item 16) --------------------


@needs_proc
def test_verify_peak_memory_follows_live_steps_not_events(tmp_path: Path) -> None:
    from bench_ledger import build_ledger, store_blobs

    store_blobs(str(tmp_path))
    peaks = {}
    for n in (6_000, 30_000):  # every step is acked: no live step in either
        path = str(tmp_path / f"l{n}.db")
        build_ledger(path, n)
        peaks[n] = measure(str(tmp_path), "--ledger", path, "verify")["peak"]
    # base: ~800 bytes per event (~19 MiB more for the 24k extra events)
    assert peaks[30_000] - peaks[6_000] < 6 * MiB, {n: p // MiB for n, p in peaks.items()}

"""The collector and the byte audit (ledger/gc; docs/design.md "GC", "Read side", I8).

Behaviour in one process: the grace floor, dry runs that change nothing, what is never
collected (referenced by any manifest revision or a compensation record, pinned, young),
what is (old orphans, inline and file, each recorded as `blob-collected`; stray temp
files), pre-image pins ending with the compensation window, bounded runs that resume,
the collector lock, failing closed, and the audit reconciling exactly against counts
made without the ledger (os.walk and a second SQL connection) on random workloads.
Races between processes are in test_gc_races.py; each case guards against a failure
other systems' collectors have shipped (docs/testing.md).

Blob ages are file mtimes (wall clock) and inline rows' `stored_ns` (ledger clock), so
the ledgers here run on `WallClock` (wall time plus an offset tests move forward) and
blobs are aged with `os.utime` / an UPDATE of `stored_ns` (`age`, `age_everything`).
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import msgspec
import pytest
from conftest import tamper
from gc_workers import (
    INLINE_MAX,
    WallClock,
    abandon,
    age,
    age_everything,
    check_store,
    in_flight,
    independent_bytes,
    present,
    sha,
    walk_bytes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fences import World

from ledger import Ledger
from ledger.errors import (
    BlobCorrupt,
    BlobNotFound,
    CompensationWindowClosed,
    InvalidInput,
    StaleEpoch,
)
from ledger.events import BlobCollected
from ledger.gc import (
    DEFAULT_GRACE_S,
    MIN_GRACE_S,
    CollectorBusy,
    GcRefused,
    audit,
    collect,
    parse_duration,
)
from ledger.gc.collector import collector_lock
from ledger.runner import run_step

DAY = 86400
SMALL = b"a small artifact"  # inline (<= INLINE_MAX bytes)
LARGE = b"a large artifact, stored as a file " * 10  # a blob file
assert len(SMALL) <= INLINE_MAX < len(LARGE)


def small(tag: str) -> bytes:
    return f"small {tag}".encode()


def large(tag: str) -> bytes:
    return (f"large {tag} " * 40).encode()


@pytest.fixture
def wclock() -> WallClock:
    return WallClock()


@pytest.fixture
def led(tmp_path: Path, wclock: WallClock) -> Iterator[Ledger]:
    ledger = Ledger.init(tmp_path / "ledger.db", clock=wclock, inline_max_bytes=INLINE_MAX)
    try:
        yield ledger
    finally:
        ledger.close()


def collected_events(ledger: Ledger) -> list[BlobCollected]:
    out = []
    for recorded in ledger.read(kind="blob-collected"):
        assert isinstance(recorded.event, BlobCollected)
        out.append(recorded.event)
    return out


def condemned(ledger: Ledger) -> set[str]:
    with ledger._store.db.read_transaction() as conn:
        return {d for (d,) in conn.execute("SELECT digest FROM condemned")}


def blob_count(ledger: Ledger) -> int:
    """Inline rows + files under the blob root (os.walk: links not followed)."""
    with ledger._store.db.read_transaction() as conn:
        rows = int(conn.execute("SELECT count(*) FROM blob_data").fetchone()[0])
    return rows + walk_bytes(ledger.blobs.root)[1]


def tree(root: str) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `root`: relative path -> (size, mtime_ns, bytes)."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            data = b"<dir>" if os.path.isdir(p) else Path(p).read_bytes()
            out[os.path.relpath(p, root)] = (st_.st_size if data != b"<dir>" else 0,
                                             st_.st_mtime_ns, data)
    return out


def stray_temp(ledger: Ledger, digest: str, *, age_s: float = 0, data: bytes = b"partial") -> str:
    """A leftover of a put that died: ``tmp/<digest>.<hex>.tmp``, `age_s` old."""
    tmp = os.path.join(ledger.blobs.root, "tmp")
    os.makedirs(tmp, exist_ok=True)
    name = f"{digest}.{secrets.token_hex(6)}.tmp"
    p = os.path.join(tmp, name)
    Path(p).write_bytes(data)
    t = time.time_ns() - int(age_s * 1e9)
    os.utime(p, ns=(t, t))
    return name


def temp_names(ledger: Ledger) -> set[str]:
    return {t.name for t in ledger.blobs.temp_files()}


# --- the window ----------------------------------------------------------------------------


def test_a_window_under_an_hour_is_refused_without_force(led: Ledger) -> None:
    """Gitaly MR 4416 / Iceberg's 24 h floor: a short window is a typed refusal that
    touches nothing; with force it runs."""
    assert (MIN_GRACE_S, DEFAULT_GRACE_S) == (3600, DAY)
    run_step(led, "kept", {"a": LARGE})
    abandon(led, "gone", {"a": large("gone")})
    age_everything(led, 2 * 3600)
    before = independent_bytes(led)
    for grace in (0, 1, 60, 3599.9):
        with pytest.raises(InvalidInput, match="force"):
            collect(led, grace_s=grace)
    with pytest.raises(InvalidInput):
        collect(led, grace_s=-1, force=True)
    with pytest.raises(InvalidInput):
        collect(led, max_delete=-1)
    assert independent_bytes(led) == before
    assert not condemned(led) and not collected_events(led)
    assert collect(led, grace_s=3600).collected == 1  # the floor itself needs no force
    assert collect(led, grace_s=0, force=True).collected == 0
    check_store(led)


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("24h", 86400.0),
    ("7d", 604800.0), ("1.5h", 5400.0), ("500ms", 0.5), (" 2H ", 7200.0),
])
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "-5", "5x", "h", "1h30m", "-1h", -1])
def test_parse_duration_refuses(text: str | int) -> None:
    with pytest.raises(InvalidInput):
        parse_duration(text)


# --- dry run ---------------------------------------------------------------------------------


def test_dry_run_changes_nothing_and_predicts_the_run(led: Ledger, tmp_path: Path) -> None:
    run_step(led, "ref", {"s": SMALL, "l": LARGE})
    in_flight(led, "fly", {"s": small("fly"), "l": large("fly")})
    old = abandon(led, "old", {"s": small("old"), "l": large("old")})
    stray_temp(led, sha(b"lost"), age_s=3 * DAY)
    age_everything(led, 2 * DAY)
    young = abandon(led, "young", {"s": small("young"), "l": large("young")})
    # a bounded run leaves condemned rows behind: the dry run must not act on them either
    assert collect(led, grace_s=DAY, max_delete=0).remaining == 2

    def state() -> tuple[object, ...]:
        files = {n: Path(tmp_path, n).read_bytes() for n in sorted(os.listdir(tmp_path))
                 if not n.endswith("-shm") and os.path.isfile(tmp_path / n)}
        assert "ledger.db-wal" in files  # the ledger is open: its WAL is compared too
        return files, tree(led.blobs.root)

    before = state()
    for kwargs in ({}, {"grace_s": 0, "force": True}, {"grace_s": 3600}):
        report = collect(led, dry_run=True, **kwargs)  # type: ignore[arg-type]
        assert report.dry_run and report.collected == 0 and report.reclaimed_bytes == 0
        assert state() == before
    readonly = Ledger.open(led.path, readonly=True)
    try:
        dry = collect(readonly, dry_run=True)
        with pytest.raises(InvalidInput):
            collect(readonly)
        audit(readonly, deep=True)
    finally:
        readonly.close()
    assert state() == before

    assert (dry.orphans, dry.kept_young, dry.kept_live, dry.temp_removed) == (2, 2, 2, 1)
    assert dry.orphan_bytes == sum(len(x) for x in (small("old"), large("old")))
    truth = independent_bytes(led)
    real = collect(led)
    assert (real.orphans, real.collected, real.temp_removed) == (dry.orphans, dry.orphans,
                                                                 dry.temp_removed)
    assert real.reclaimed_bytes == dry.orphan_bytes
    assert truth - independent_bytes(led) == real.reclaimed_bytes + real.temp_removed_bytes
    assert not any(present(led, d) for d in old) and all(present(led, d) for d in young)
    check_store(led)


# --- what is never collected, what is ------------------------------------------------------


def test_referenced_pinned_and_young_blobs_are_never_collected(led: Ledger) -> None:
    """Referenced by the live manifest, by a superseded revision, by the manifest of a step
    compensated since; pinned by an attempt in flight; young. None go, however old."""
    live = run_step(led, "live", {"s": SMALL, "l": LARGE}).manifest
    run_step(led, "superseded", {"s": small("rev0"), "l": large("rev0")})
    led.store("superseded", 1, "s", small("rev1"))
    led.store("superseded", 1, "l", large("rev1"))
    assert led.publish("superseded", 1, expected_rev=0).manifest_rev == 1
    run_step(led, "undone", {"s": small("undone"), "l": large("undone")})
    led.workspaces.compensate("undone", reason="bad result")
    pinned = in_flight(led, "fly", {"s": small("fly"), "l": large("fly")})
    old = abandon(led, "old", {"s": small("old"), "l": large("old")})
    age_everything(led, 30 * DAY)
    young = abandon(led, "young", {"s": small("young"), "l": large("young")})
    kept = ([e.digest for e in live.artifacts] + pinned + young
            + [sha(x) for x in (small("rev0"), large("rev0"), small("rev1"), large("rev1"),
                                small("undone"), large("undone"))])

    report = collect(led)
    assert {e.digest for e in collected_events(led)} == set(old)
    assert (report.referenced, report.kept_live, report.kept_young, report.orphans) == (8, 2, 2, 2)
    assert all(present(led, d) for d in kept)
    check_store(led)

    report = collect(led, grace_s=0, force=True)  # the young ones go too; nothing else
    assert {e.digest for e in collected_events(led)} == set(old) | set(young)
    assert all(present(led, d) for d in kept if d not in young)
    check_store(led, grace_s=0)
    for step in ("live", "superseded", "undone"):
        for rev in range(2):
            manifest = led.manifest(step, rev)
            for entry in () if manifest is None else manifest.artifacts:
                assert led.read_blob(entry.digest, size=entry.size, verify=True)


def test_old_orphans_inline_and_file_are_collected_and_recorded(led: Ledger) -> None:
    outputs = {"s": small("orphan"), "l": large("orphan")}
    digests = abandon(led, "o", outputs)
    age_everything(led, 2 * DAY)
    truth = independent_bytes(led)
    report = collect(led)
    events = collected_events(led)
    by_digest = {e.digest: e for e in events}
    assert set(by_digest) == set(digests) and len(events) == 2
    for data in outputs.values():
        event = by_digest[sha(data)]
        assert (event.size, event.inline, event.reason, event.collection) == (
            len(data), len(data) <= INLINE_MAX, "orphan", report.collection)
        with pytest.raises(BlobNotFound):
            led.read_blob(sha(data))
    assert report.collected == 2 and report.reclaimed_bytes == sum(map(len, outputs.values()))
    assert truth - independent_bytes(led) == report.reclaimed_bytes
    assert report.remaining == 0 and not condemned(led) and report.stopped == ""
    report_audit = check_store(led)
    assert (report_audit.collected.count, report_audit.collected.bytes) == (
        2, report.reclaimed_bytes)
    # the same content again is simply stored anew
    manifest = run_step(led, "again", outputs).manifest
    for entry in manifest.artifacts:
        assert led.read_blob(entry.digest, size=entry.size) == outputs[entry.path]
    assert collect(led, grace_s=0, force=True).collected == 0
    check_store(led)


def test_stray_temp_files_older_than_the_window_go_unless_pinned(led: Ledger) -> None:
    run_step(led, "s", {"l": LARGE})  # creates tmp/
    lost = stray_temp(led, sha(b"lost"), age_s=2 * DAY)
    recent = stray_temp(led, sha(b"recent"))
    # a writer that pinned its digest and is still writing the temp file (stalled for days)
    row = led.plan("writing", artifacts=("x",))
    led.pin("writing", row.attempt, sha(large("writing")))
    writing = stray_temp(led, sha(large("writing")), age_s=3 * DAY)

    dry = collect(led, dry_run=True)
    assert (dry.temp_removed, dry.temp_kept) == (1, 2)
    report = collect(led)
    assert (report.temp_removed, report.temp_kept) == (1, 2)
    assert report.temp_removed_bytes == len(b"partial")
    assert temp_names(led) == {recent, writing}
    report = collect(led, grace_s=0, force=True)
    assert (report.temp_removed, report.temp_kept) == (1, 1)
    assert temp_names(led) == {writing} and lost not in temp_names(led)
    check_store(led)
    # the writer finishes: its put writes a fresh temp file and renames it in place
    led.store("writing", row.attempt, "x", large("writing"))
    assert led.publish("writing").artifacts[0].digest == sha(large("writing"))
    led.ack("writing")
    check_store(led)


# --- pre-images, compensation records --------------------------------------------------


@pytest.mark.parametrize("inline_max", [INLINE_MAX, 0], ids=["inline", "file"])
def test_pre_image_pins_end_with_the_compensation_window(tmp_path: Path, inline_max: int) -> None:
    clock = WallClock()
    w = World(tmp_path, clock=clock, compensation_window_s=60, inline_max_bytes=inline_max)
    try:
        w.admit(w.write("s1", "v1", "v0"))
        assert w.apply("s1") == "applied"
        w.ledger.publish("s1")  # published, not acked: the pre-image stays pinned
        pre = sha(b"v0")
        clock.advance(1800)
        assert collect(w.ledger, grace_s=0, force=True).collected == 0
        assert present(w.ledger, pre)
        w.ledger.workspaces.heartbeat("w", w.epoch, ttl_s=3600)
        w.ledger.ack("s1")
        clock.advance(30)  # acked, inside the window: still pinned
        report = collect(w.ledger, grace_s=0, force=True)
        assert report.collected == 0 and report.kept_live == 1 and present(w.ledger, pre)
        check_store(w.ledger, grace_s=0)
        clock.advance(31)  # the window has passed: the step can no longer be compensated
        w.ledger.workspaces.heartbeat("w", w.epoch, ttl_s=3600)
        with pytest.raises(CompensationWindowClosed):
            w.ledger.workspaces.compensate("s1", epoch=w.epoch)
        report = collect(w.ledger, grace_s=0, force=True)
        assert [e.digest for e in collected_events(w.ledger)] == [pre]
        assert not present(w.ledger, pre)
        assert present(w.ledger, sha(b"v1"))  # the post-image is referenced
        check_store(w.ledger, grace_s=0)
        restored = w.ledger.workspaces.restore("w", tmp_path / "restored", force=True)
        assert restored.paths == 1 and (tmp_path / "restored" / "app.py").read_text() == "v1"
    finally:
        w.ledger.close()


@pytest.mark.parametrize("inline_max", [INLINE_MAX, 0], ids=["inline", "file"])
def test_compensation_records_keep_the_pre_images_restore_needs(tmp_path: Path,
                                                               inline_max: int) -> None:
    clock = WallClock()
    w = World(tmp_path, clock=clock, compensation_window_s=60, inline_max_bytes=inline_max)
    try:
        w.admit(w.write("s1", "v1", "v0"))
        w.apply("s1")
        w.commit("s1")
        comp = w.ledger.workspaces.compensate("s1", epoch=w.epoch, reason="tests failed")
        assert [r.outcome for r in comp.restored] == ["restored"] and w.disk() == "v0"
        # the pins are released; only the compensation record holds v0 now
        with w.ledger._store.db.read_transaction() as conn:
            assert conn.execute("SELECT count(*) FROM pins").fetchone()[0] == 0
        clock.advance(400 * DAY)
        age_everything(w.ledger, 400 * DAY)
        report = collect(w.ledger, grace_s=0, force=True)
        assert report.collected == 0 and report.referenced == 2  # v0 (compensation), v1 (manifest)
        assert present(w.ledger, sha(b"v0"))
        check_store(w.ledger, grace_s=0)
        out = w.ledger.workspaces.restore("w", tmp_path / "restored", force=True)
        assert out.paths == 1 and (tmp_path / "restored" / "app.py").read_text() == "v0"
    finally:
        w.ledger.close()


# --- bounded, resumable runs; the lock -----------------------------------------------------


def test_max_delete_bounds_a_run_and_reruns_converge(led: Ledger) -> None:
    digests = []
    for i in range(7):
        digests += abandon(led, f"o{i}", {"l": large(f"o{i}")} if i % 2 else {"s": small(f"o{i}")})
    stray_temp(led, sha(b"lost"), age_s=3 * DAY)
    age_everything(led, 2 * DAY)
    seen = []
    for expected_remaining in (4, 1, 0):
        report = collect(led, max_delete=3)
        seen.append((report.collected, report.remaining, report.stopped))
        assert len(condemned(led)) == report.remaining
        check_store(led)
    assert seen == [(3, 4, "max-delete"), (3, 1, "max-delete"), (1, 0, "")]
    assert {e.digest for e in collected_events(led)} == set(digests)
    assert len(collected_events(led)) == 7
    assert not temp_names(led)  # temp files are left to a run that was not stopped


def test_max_runtime_bounds_a_run_and_a_rerun_converges(led: Ledger) -> None:
    for i in range(5):
        abandon(led, f"o{i}", {"l": large(f"o{i}"), "s": small(f"o{i}")})
    age_everything(led, 2 * DAY)
    report = collect(led, max_runtime_s=0)
    assert (report.stopped, report.collected, report.remaining) == ("max-runtime", 0, 10)
    assert len(condemned(led)) == 10
    check_store(led)
    report = collect(led, max_runtime_s=60)
    assert (report.stopped, report.collected, report.remaining) == ("", 10, 0)
    check_store(led)


def test_a_condemned_blob_that_is_used_again_is_spared(led: Ledger) -> None:
    """Phase 1 condemned it; before phase 2 a step pins it (un-condemns) and publishes."""
    abandon(led, "o", {"s": small("x"), "l": large("x")})
    age_everything(led, 2 * DAY)
    assert collect(led, max_delete=0).remaining == 2
    run_step(led, "reuse", {"s": small("x"), "l": large("x")})
    assert not condemned(led)  # the pins lifted the condemnation
    report = collect(led, grace_s=0, force=True)
    assert report.collected == 0 and report.referenced == 2
    check_store(led, grace_s=0)


def test_a_second_collector_is_busy_or_waits(led: Ledger) -> None:
    abandon(led, "o", {"l": LARGE})
    age_everything(led, 2 * DAY)
    taken = threading.Event()
    releasing = threading.Event()  # set while the lock is still held, just before release

    def hold(seconds: float) -> None:
        with collector_lock(led):
            taken.set()
            time.sleep(seconds)
            releasing.set()

    holder = threading.Thread(target=hold, args=(0.5,))
    holder.start()
    try:
        assert taken.wait(5)
        with pytest.raises(CollectorBusy):
            collect(led)
        with pytest.raises(CollectorBusy):
            collect(led, dry_run=True)
        assert present(led, sha(LARGE)) and not condemned(led)
        report = collect(led, wait=True)  # blocks until the holder lets go
        assert releasing.is_set()
        assert report.collected == 1
    finally:
        holder.join()
    check_store(led)


# --- failing closed ------------------------------------------------------------------------


@pytest.fixture
def doomed(led: Ledger) -> tuple[Ledger, list[str], list[str]]:
    """A ledger with two committed steps and old orphans a run would collect."""
    live = run_step(led, "a", {"s": small("a"), "l": large("a")}).manifest
    run_step(led, "b", {"s": small("b"), "l": large("b")})
    orphans = abandon(led, "o", {"s": small("o"), "l": large("o")})
    age_everything(led, 2 * DAY)
    return led, [e.digest for e in live.artifacts], orphans


def assert_refused(ledger: Ledger, orphans: list[str], match: str) -> None:
    count = blob_count(ledger)
    for kwargs in ({}, {"grace_s": 0, "force": True}, {"dry_run": True}):
        with pytest.raises(GcRefused, match=match):
            collect(ledger, **kwargs)  # type: ignore[arg-type]
    assert blob_count(ledger) == count
    assert all(present(ledger, d) for d in orphans)
    assert not condemned(ledger) and not collected_events(ledger)


def test_refuses_when_the_manifest_tables_disagree_with_the_events(
        doomed: tuple[Ledger, list[str], list[str]]) -> None:
    ledger, _live, orphans = doomed
    conn = apsw.Connection(ledger.path)
    try:
        conn.execute("DELETE FROM manifest_entries WHERE step = 'a' AND path = 'l'")
    finally:
        conn.close()
    assert_refused(ledger, orphans, "disagree")
    report = audit(ledger)
    assert not report.ok and any("disagree" in p for p in report.problems)
    assert present(ledger, sha(large("a")))


def test_refuses_when_a_manifest_event_cannot_be_decoded(
        doomed: tuple[Ledger, list[str], list[str]]) -> None:
    ledger, _live, orphans = doomed
    sql = "UPDATE events SET payload = ? WHERE kind = 'manifest-published' AND step = 'b'"
    tamper(ledger.path, [(sql, (b"\xff not json",))])
    assert_refused(ledger, orphans, "cannot be decoded")
    report = audit(ledger)
    assert not report.ok and any("cannot be decoded" in p for p in report.problems)


def test_refuses_when_a_manifest_names_a_malformed_digest(
        doomed: tuple[Ledger, list[str], list[str]]) -> None:
    """The reference reader checks digests' lengths as it decodes and their hex for all of
    a read at once: an upper-case digest in a manifest still fails closed (GC deletes
    nothing, audit reports it)."""
    ledger, _live, orphans = doomed
    conn = apsw.Connection(ledger.path)
    try:
        seq, payload = conn.execute(
            "SELECT seq, payload FROM events WHERE kind = 'manifest-published' AND step = 'b'"
        ).fetchone()
    finally:
        conn.close()
    digest = msgspec.json.decode(payload)["artifacts"][0]["digest"]
    bad = payload.replace(digest.encode(), digest.upper().encode())
    tamper(ledger.path, [("UPDATE events SET payload = ? WHERE seq = ?", (bad, seq))])
    assert_refused(ledger, orphans, "malformed digest")
    report = audit(ledger)
    assert not report.ok and any("malformed digest" in p for p in report.problems)


@pytest.mark.parametrize("which", ["file", "inline"])
def test_refuses_when_a_referenced_blob_is_missing(
        doomed: tuple[Ledger, list[str], list[str]], which: str) -> None:
    """restic #3239: referenced data missing -> delete nothing, name the cause."""
    ledger, _live, orphans = doomed
    if which == "file":
        gone = sha(large("a"))
        os.unlink(os.path.join(ledger.blobs.root, gone[:2], gone))
    else:
        gone = sha(small("a"))
        conn = apsw.Connection(ledger.path)
        try:
            conn.execute("DELETE FROM blob_data WHERE digest = ?", (gone,))
        finally:
            conn.close()
    assert_refused(ledger, orphans, "missing")
    report = audit(ledger)
    assert not report.ok and [d["digest"] for d in report.dangling] == [gone]
    assert ledger.classify("a").startswith("VIOLATION")


@pytest.mark.parametrize("where", ["fan-out directory", "blob file"])
def test_refuses_a_symlink_in_the_fan_out(
        doomed: tuple[Ledger, list[str], list[str]], tmp_path: Path, where: str) -> None:
    ledger, _live, orphans = doomed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"not a blob")
    if where == "fan-out directory":
        name = next(f"{a}{b}" for a in "0123456789abcdef" for b in "0123456789abcdef"
                    if not os.path.exists(os.path.join(ledger.blobs.root, f"{a}{b}")))
        link = os.path.join(ledger.blobs.root, name)
        os.symlink(outside, link)
        bait = outside / (name + "0" * 62)
        bait.write_bytes(b"old, unreferenced-looking")
    else:
        digest = sha(b"planted")
        os.makedirs(os.path.join(ledger.blobs.root, digest[:2]), exist_ok=True)
        link = os.path.join(ledger.blobs.root, digest[:2], digest)
        os.symlink(outside / "precious", link)
        bait = outside / "precious"
    assert os.path.exists(link)  # the planted link resolves: the fixture is effective
    assert_refused(ledger, orphans, "not a blob")
    assert (outside / "precious").read_bytes() == b"not a blob" and bait.exists()
    report = audit(ledger)
    assert not report.ok and report.problems


# --- audit ---------------------------------------------------------------------------------


def test_deep_audit_finds_a_flipped_byte(led: Ledger) -> None:
    run_step(led, "s", {"s": SMALL, "l": LARGE})
    assert audit(led, deep=True).ok
    path = os.path.join(led.blobs.root, sha(LARGE)[:2], sha(LARGE))
    os.chmod(path, 0o644)
    data = bytearray(Path(path).read_bytes())
    data[7] ^= 0x01
    Path(path).write_bytes(bytes(data))
    shallow = audit(led)
    assert shallow.ok  # same size: only re-hashing sees it
    deep = audit(led, deep=True)
    assert not deep.ok and deep.violations == 1
    assert [c["digest"] for c in deep.corrupt] == [sha(LARGE)]
    assert "corrupt" in str(deep.corrupt[0]["problem"])
    with pytest.raises(BlobCorrupt):
        led.read_blob(sha(LARGE), verify=True)
    # an inline row edited behind the ledger's back
    conn = apsw.Connection(led.path)
    try:
        conn.execute("UPDATE blob_data SET data = ? WHERE digest = ?",
                     (SMALL.upper(), sha(SMALL)))
    finally:
        conn.close()
    deep = audit(led, deep=True)
    assert {c["digest"] for c in deep.corrupt} == {sha(SMALL), sha(LARGE)}


def test_audit_of_an_empty_ledger(led: Ledger) -> None:
    report = check_store(led)
    assert report.stored_bytes == 0 and report.ok
    assert collect(led, grace_s=0, force=True).scanned == 0


# Random workloads: after every operation the audit reconciles exactly against counts made
# without it, nothing dangles, and every GC's reclaimed bytes are what left the disk.

POOL = [small(f"p{i}") for i in range(4)] + [large(f"p{i}") for i in range(4)]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["commit", "inflight", "abandon", "ws_commit", "ws_compensate",
                         "temp", "age", "advance", "gc", "dry"]),
        st.integers(0, 2**16),
    ),
    min_size=1, max_size=22,
)


class Workload:
    def __init__(self, root: str, rng: random.Random) -> None:
        self.rng = rng
        self.clock = WallClock()
        self.ws = Path(root, "ws")
        self.ws.mkdir()
        (self.ws / "app.py").write_bytes(b"v0")
        self.ledger = Ledger.init(Path(root, "ledger.db"), clock=self.clock,
                                  inline_max_bytes=INLINE_MAX, synchronous="NORMAL")
        self.ledger.workspaces.add("w", str(self.ws))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        self.n = 0
        self.ws_steps: list[str] = []
        self.grace = DAY

    def step_id(self) -> str:
        self.n += 1
        return f"s{self.n}"

    def outputs(self) -> dict[str, bytes]:
        # distinct contents per step: identical contents within a step are test_regression_two_artifacts_with_identical_bytes
        picks = self.rng.sample(POOL, self.rng.randint(1, 3))
        return {f"a{j}": c for j, c in enumerate(picks)}

    def lease(self) -> None:
        """Keep the workspace lease live: heartbeat it, or (expired) take a new epoch,
        which settles what the old one left in flight."""
        try:
            self.ledger.workspaces.heartbeat("w", self.epoch, ttl_s=3600)
        except StaleEpoch:
            self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def do(self, op: str) -> None:
        led, rng = self.ledger, self.rng
        if op == "commit":
            run_step(led, self.step_id(), self.outputs())
        elif op == "inflight":
            in_flight(led, self.step_id(), self.outputs())
        elif op == "abandon":
            abandon(led, self.step_id(), self.outputs())
        elif op == "ws_commit":
            from ledger.step.values import StepPlan, Write

            current = (self.ws / "app.py").read_bytes()
            new = rng.choice([c for c in POOL if c != current])
            step = self.step_id()
            self.lease()
            led.workspaces.admit("w", self.epoch, [StepPlan(step, [Write("app.py", new, sha(current))])])
            assert led.workspaces.apply(step, epoch=self.epoch).verdict == "applied"
            led.publish(step)
            if rng.random() < 0.7:
                led.ack(step)
            self.ws_steps.append(step)
        elif op == "ws_compensate" and self.ws_steps:
            self.lease()
            try:
                led.workspaces.compensate(self.ws_steps.pop(), epoch=self.epoch, reason="random")
            except CompensationWindowClosed:
                pass
        elif op == "temp":
            with led._store.db.read_transaction() as conn:
                pins = [d for (d,) in conn.execute("SELECT digest FROM pins")]
            digest = rng.choice(pins) if pins and rng.random() < 0.5 else sha(
                rng.randbytes(8))
            stray_temp(led, digest, age_s=rng.choice([0, 2 * 3600, 3 * DAY]),
                       data=rng.randbytes(rng.randint(0, 300)))
        elif op == "age":
            files = [os.path.join(d, n) for d, _, ns in os.walk(led.blobs.root) for n in ns]
            with led._store.db.read_transaction() as conn:
                rows = [d for (d,) in conn.execute("SELECT digest FROM blob_data")]
            seconds = rng.choice([1800, 3 * 3600, 2 * DAY])
            if files and (not rows or rng.random() < 0.6):
                p = rng.choice(files)
                t = os.lstat(p).st_mtime_ns - int(seconds * 1e9)
                os.utime(p, ns=(t, t))
            elif rows:
                age(led, rng.choice(rows), seconds)
        elif op == "advance":
            self.clock.advance(rng.choice([60, 3600, 30 * 3600]))
        elif op in ("gc", "dry"):
            grace = rng.choice([0, 3600, DAY])
            before = independent_bytes(led)
            report = collect(led, grace_s=grace, force=True, dry_run=op == "dry",
                             max_delete=rng.choice([None, None, 0, 1, 3]))
            after = independent_bytes(led)
            if op == "dry":
                assert after == before and report.collected == 0
            else:
                # what left the disk is what the report says it reclaimed
                assert before - after == report.reclaimed_bytes + report.temp_removed_bytes
                assert report.remaining == len(condemned(led))
            self.grace = grace


@settings(max_examples=int(os.environ.get("STEPTRAIL_GC_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, seed=st.integers(0, 2**32))
def test_audit_reconciles_exactly_on_random_workloads(ops: list[tuple[str, int]],
                                                     seed: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        w = Workload(root, random.Random(seed))
        try:
            for op, sub in ops:
                w.rng.seed(sub ^ seed)
                w.do(op)
                check_store(w.ledger, grace_s=w.grace)
            assert w.ledger.verify().ok
        finally:
            w.ledger.close()


# --- regressions: bugs these tests found, fixed in ledger/ ----------------------------------------------------------------------------


def test_regression_file_copy_of_an_inline_blob_is_invisible_to_audit(tmp_path: Path) -> None:
    """Two writers with different inline thresholds (a per-open option) store the same
    content: one as a file, one as an inline row. Reads use the row; the file's bytes are
    counted by no bucket of the audit, and no collection ever reclaims them."""
    path = tmp_path / "ledger.db"
    with Ledger.init(path, inline_max_bytes=0) as files_writer:
        run_step(files_writer, "as-file", {"x": SMALL})
    with Ledger.open(path, inline_max_bytes=INLINE_MAX) as ledger:
        run_step(ledger, "as-row", {"x": SMALL})
        assert ledger.blobs.stat(sha(SMALL)) is not None  # both copies exist
        report = audit(ledger)
        on_disk, _ = walk_bytes(ledger.blobs.root)
        assert report.stored_bytes == independent_bytes(ledger) == on_disk + len(SMALL)


def test_an_entry_in_tmp_that_no_put_wrote_is_kept(led: Ledger) -> None:
    """Only ``<digest>.<hex>.tmp`` leftovers are GC's to delete; a file a human left in
    tmp/ is kept and counted, and never makes a collection fail."""
    run_step(led, "s", {"l": LARGE})
    abandon(led, "o", {"l": large("o")})
    notes = Path(led.blobs.root, "tmp", "notes.txt")
    notes.write_text("a human left this here")
    lost = stray_temp(led, sha(b"lost"))
    age_everything(led, 2 * DAY)
    dry = collect(led, dry_run=True)
    report = collect(led)
    assert (report.collected, report.temp_removed, report.temp_kept) == (1, 1, 1)
    assert (dry.temp_removed, dry.temp_kept) == (1, 1)
    assert notes.exists() and temp_names(led) == {"notes.txt"} and lost not in temp_names(led)
    assert check_store(led).temporary.count == 1


def test_regression_a_symlinked_tmp_dir_is_reported_not_raised(led: Ledger, tmp_path: Path) -> None:
    run_step(led, "s", {"l": LARGE})
    tmp = Path(led.blobs.root, "tmp")
    tmp.rename(tmp_path / "elsewhere")
    tmp.symlink_to(tmp_path / "elsewhere")
    report = audit(led)  # raises BlobCorrupt
    assert not report.ok and report.problems
    with pytest.raises(GcRefused):
        collect(led)


def test_regression_pre_image_pins_follow_the_collectors_window_not_the_ledgers(tmp_path: Path) -> None:
    clock = WallClock()
    w = World(tmp_path, clock=clock, compensation_window_s=3600)
    try:
        w.admit(w.write("s1", "v1", "v0"))
        w.apply("s1")
        w.commit("s1")
        clock.advance(120)  # inside the writer's 1 h window
        with Ledger.open(w.path, clock=clock, compensation_window_s=60) as gc_side:
            collect(gc_side, grace_s=0, force=True)
        w.ledger.workspaces.heartbeat("w", w.epoch, ttl_s=3600)
        comp = w.ledger.workspaces.compensate("s1", epoch=w.epoch)  # allowed: inside the window
        assert [r.outcome for r in comp.restored] == ["restored"], comp.restored
        assert w.disk() == "v0"
    finally:
        w.ledger.close()


def test_regression_two_artifacts_with_identical_bytes(led: Ledger) -> None:
    """Two empty logs (or any two equal artifacts) in one step: the second `store` is
    refused as a conflicting redelivery, and a replay hits it again forever."""
    manifest = run_step(led, "s", {"stdout.log": b"", "stderr.log": b""}).manifest
    assert {e.path for e in manifest.artifacts} == {"stdout.log", "stderr.log"}

"""The SQLite file: init, and opening defensively (refused files stay byte-identical)."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from ledger import (
    InvalidInput,
    Ledger,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    NotALedger,
    Planned,
    ReadOnlyLedger,
)
from ledger.store.sqlite import file as dbmod

from conftest import FakeClock, commit_step, copy_ledger, snapshot_dir


def header(path: Path) -> bytes:
    return path.read_bytes()[:100]


def test_init_creates_a_wal_ledger(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "nested" / "dirs" / "ledger.db"
    with Ledger.init(path, clock=clock) as led:
        assert led.created
        assert not led.readonly
        conn = led._store.db.conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA application_id").fetchone()[0] == dbmod.APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == dbmod.SCHEMA_VERSION
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert len(led.ledger_id) == 32 and int(led.ledger_id, 16) >= 0
        assert led.count() == 0 and led.head().seq == 0
    # The header reached the main file (plain I/O can recognise the ledger).
    head = header(path)
    assert head[:16] == dbmod.SQLITE_MAGIC
    assert head[18] == head[19] == 2  # WAL file format
    user_version, application_id = struct.unpack(">I4xI", head[60:72])
    assert (user_version, application_id) == (dbmod.SCHEMA_VERSION, dbmod.APPLICATION_ID)
    raw = apsw.Connection(str(path))
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    schema = frozenset(raw.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema"))
    raw.close()
    assert schema == dbmod.expected_schema(dbmod.SCHEMA_VERSION)
    assert not os.path.exists(str(path) + "-wal")


def test_init_on_an_existing_ledger_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger.init(path, clock=FakeClock()) as led:
        commit_step(led, "s")
        ledger_id, head = led.ledger_id, led.head()
    before = path.read_bytes()
    with Ledger.init(path, clock=FakeClock()) as again:
        assert not again.created
        assert again.ledger_id == ledger_id
        assert again.head() == head and again.count() == 4
        assert again.step("s").state == "acked"
    assert path.read_bytes() == before
    # the writers' fairness file stays beside the ledger (-wal and -shm go at close)
    assert sorted(os.listdir(tmp_path)) == ["blobs", "ledger.db", "ledger.db-lockq"]


def test_init_with_bad_settings_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.db"
    with pytest.raises(InvalidInput):
        Ledger.init(path, synchronous="sometimes", clock=FakeClock())  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
    # ...so a correct init afterwards is not blocked by a half-made file.
    with Ledger.init(path, clock=FakeClock()) as led:
        assert led.created


def test_init_recovers_from_a_crash_before_the_schema(tmp_path: Path) -> None:
    """A crash inside init can leave an empty file, or a blank SQLite file in WAL mode."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.db"
    conn = apsw.Connection(str(blank))
    conn.execute("PRAGMA journal_mode=WAL")  # writes page 1; no table yet
    conn.close()
    assert blank.stat().st_size > 0
    for path in (empty, blank):
        before = path.read_bytes()
        for readonly in (True, False):  # open refuses them untouched...
            with pytest.raises(NotALedger):
                Ledger.open(path, readonly=readonly, clock=FakeClock())
            assert path.read_bytes() == before
        with Ledger.init(path, clock=FakeClock()) as led:  # ...init adopts them
            assert led.created
            led.append(Planned(step="s", attempt=1))
        with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
            assert led.step("s").state == "planned"


def test_open_a_missing_path_creates_nothing(tmp_path: Path) -> None:
    for readonly in (True, False):
        with pytest.raises(LedgerNotFound):
            Ledger.open(tmp_path / "nope" / "ledger.db", readonly=readonly,
                        clock=FakeClock())
        with pytest.raises(LedgerNotFound):
            Ledger.open(tmp_path / "ledger.db", readonly=readonly, clock=FakeClock())
    assert os.listdir(tmp_path) == []


# --- hostile and foreign files ---------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A healthy, closed ledger with a few committed steps."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    with Ledger.init(path, clock=FakeClock()) as led:
        for i in range(3):
            commit_step(led, f"step-{i}")
        led.append(Planned(step="open", attempt=1))
    assert not os.path.exists(str(path) + "-wal")
    return path


def _raw(path: Path, *statements: str) -> None:
    conn = apsw.Connection(str(path))
    for sql in statements:
        conn.execute(sql)
    conn.close()


def _not_sqlite(d: Path, t: Path) -> Path:
    p = d / "notes.db"
    p.write_bytes(b"these are my notes, not a database\n" * 10)
    return p


def _empty(d: Path, t: Path) -> Path:
    p = d / "empty.db"
    p.write_bytes(b"")
    return p


def _short(d: Path, t: Path) -> Path:
    p = d / "short.db"
    p.write_bytes(dbmod.SQLITE_MAGIC + b"\x10\x00")
    return p


def _directory(d: Path, t: Path) -> Path:
    p = d / "ledger.db"
    p.mkdir()
    return p


def _plain_sqlite(d: Path, t: Path) -> Path:
    p = d / "app.db"
    _raw(p, "CREATE TABLE notes(x TEXT)", "INSERT INTO notes VALUES ('keep me')")
    return p


def _plain_sqlite_wal(d: Path, t: Path) -> Path:
    p = d / "app.db"
    _raw(p, "PRAGMA journal_mode=WAL", "CREATE TABLE notes(x TEXT)",
         "INSERT INTO notes VALUES ('keep me')")
    return p


def _foreign_application_id(d: Path, t: Path) -> Path:
    p = d / "other.db"
    _raw(p, "PRAGMA application_id=305419896", "PRAGMA user_version=1", "CREATE TABLE t(x)")
    return p


def _our_id_no_version(d: Path, t: Path) -> Path:
    p = d / "half.db"
    _raw(p, f"PRAGMA application_id={dbmod.APPLICATION_ID}", "CREATE TABLE t(x)")
    return p


def _our_id_foreign_schema(d: Path, t: Path) -> Path:
    p = d / "impostor.db"
    _raw(p, f"PRAGMA application_id={dbmod.APPLICATION_ID}", "PRAGMA user_version=1",
         "CREATE TABLE events(x)")
    return p


def _too_new_header(d: Path, t: Path) -> Path:
    p = copy_ledger(t, d / "ledger.db")
    data = bytearray(p.read_bytes())
    data[60:64] = struct.pack(">I", dbmod.SCHEMA_VERSION + 1)
    p.write_bytes(bytes(data))
    return p


def _too_new_sqlite(d: Path, t: Path) -> Path:
    p = copy_ledger(t, d / "ledger.db")
    _raw(p, f"PRAGMA user_version={dbmod.SCHEMA_VERSION + 41}")
    assert struct.unpack(">I", p.read_bytes()[60:64])[0] == dbmod.SCHEMA_VERSION + 41
    return p


# Planted objects. The lagging checkpoint makes a naive read-write open fold the log
# into `steps`, which would fire a trigger on it.
_LAG = "UPDATE projection_checkpoint SET version = 0"
_LOOT = "CREATE TABLE loot(what TEXT)"
_PLANTS = {
    "trigger-on-steps": "CREATE TRIGGER evil AFTER INSERT ON steps "
                        "BEGIN INSERT INTO loot VALUES ('steps'); END",
    "trigger-on-checkpoint": "CREATE TRIGGER evil AFTER UPDATE ON projection_checkpoint "
                             "BEGIN INSERT INTO loot VALUES ('checkpoint'); END",
    "trigger-on-events": "CREATE TRIGGER evil AFTER INSERT ON events "
                         "BEGIN INSERT INTO loot VALUES ('events'); END",
    "view": "CREATE VIEW evil AS SELECT * FROM events",
    "index": "CREATE INDEX evil ON events(kind)",
}


def _planted(kind: str) -> Callable[[Path, Path], Path]:
    def build(d: Path, t: Path) -> Path:
        p = copy_ledger(t, d / "ledger.db")
        _raw(p, _LAG, _LOOT, _PLANTS[kind])
        return p

    return build


def _replaced_trigger(d: Path, t: Path) -> Path:
    """Our trigger's name, a body that lets UPDATE through."""
    p = copy_ledger(t, d / "ledger.db")
    _raw(p, "DROP TRIGGER events_no_update",
         "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT 1; END")
    return p


def _dropped_trigger(d: Path, t: Path) -> Path:
    p = copy_ledger(t, d / "ledger.db")
    _raw(p, "DROP TRIGGER events_no_delete")
    return p


REFUSED = [
    pytest.param(_not_sqlite, NotALedger, id="not-sqlite"),
    pytest.param(_empty, NotALedger, id="empty"),
    pytest.param(_short, NotALedger, id="short"),
    pytest.param(_directory, NotALedger, id="directory"),
    pytest.param(_plain_sqlite, NotALedger, id="plain-sqlite"),
    pytest.param(_plain_sqlite_wal, NotALedger, id="plain-sqlite-wal-mode"),
    pytest.param(_foreign_application_id, NotALedger, id="foreign-application-id"),
    pytest.param(_our_id_no_version, NotALedger, id="our-id-no-version"),
    pytest.param(_our_id_foreign_schema, NotALedger, id="our-id-foreign-schema"),
    pytest.param(_too_new_header, LedgerTooNew, id="too-new-header-bytes"),
    pytest.param(_too_new_sqlite, LedgerTooNew, id="too-new-via-sqlite"),
    *[pytest.param(_planted(k), NotALedger, id=f"planted-{k}") for k in _PLANTS],
    pytest.param(_replaced_trigger, NotALedger, id="replaced-trigger"),
    pytest.param(_dropped_trigger, NotALedger, id="dropped-trigger"),
]


HOW = [
    pytest.param(p.values[0], p.values[1], how, id=f"{p.id}-{how}")
    for p in REFUSED
    for how in ("readonly", "readwrite", "init")
    if not (how == "init" and p.id == "empty")  # init adopts an empty file: a crash inside init
]


@pytest.mark.parametrize(("make", "error", "how"), HOW)
def test_refused_files_stay_byte_identical(
    tmp_path: Path, template: Path, make, error: type[LedgerError], how: str
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    path = make(d, template)
    before = snapshot_dir(d)
    with pytest.raises(error) as info:
        if how == "init":
            Ledger.init(path, clock=FakeClock())
        else:
            Ledger.open(path, readonly=how == "readonly", clock=FakeClock())
    assert snapshot_dir(d) == before  # same names (no -wal/-shm) and the same bytes
    assert str(path) in str(info.value)
    if error is LedgerTooNew:
        assert info.value.found > dbmod.SCHEMA_VERSION  # type: ignore[attr-defined]
        assert info.value.supported == dbmod.SCHEMA_VERSION  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["trigger-on-steps", "trigger-on-checkpoint"])
def test_planted_trigger_is_live_but_never_runs(tmp_path: Path, template: Path, kind: str) -> None:
    """The planted trigger would fire on the writes a read-write open makes; it must not."""
    path = _planted(kind)(tmp_path, template)
    before = path.read_bytes()
    for attempt in ("readonly", "readwrite", "init"):
        with pytest.raises(NotALedger, match="schema differs"):
            if attempt == "init":
                Ledger.init(path, clock=FakeClock())
            else:
                Ledger.open(path, readonly=attempt == "readonly", clock=FakeClock())
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["blobs", "ledger.db"]
    conn = apsw.Connection(f"file:{path}?immutable=1",
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    assert conn.execute("SELECT count(*) FROM loot").fetchone()[0] == 0
    conn.close()
    # Control: the trigger is real and does fire for anyone who runs that write.
    probe = copy_ledger(path, tmp_path / "probe.db")
    _raw(probe, "DELETE FROM steps WHERE step_id = 'open'",
         "INSERT INTO steps SELECT 'x', run, workspace, state, attempt, epoch, rev, manifest_rev,"
         " manifest_digest, live, committed_bytes, stored_bytes, first_seq, last_seq, updated_ns"
         " FROM steps LIMIT 1",
         "UPDATE projection_checkpoint SET last_seq = last_seq")
    conn = apsw.Connection(str(probe))
    assert conn.execute("SELECT count(*) FROM loot").fetchone()[0] == 1
    conn.close()


# --- read-only opens -------------------------------------------------------------------


def test_readonly_open_of_a_healthy_ledger_writes_nothing(tmp_path: Path, template: Path) -> None:
    """Nothing but SQLite's lock files: an accepted ledger is read with real locks (so a
    writer beside it cannot tear the read), which creates an empty -wal and a -shm."""
    path = copy_ledger(template, tmp_path / "ledger.db")
    before = snapshot_dir(tmp_path)

    def without_lock_files(snap: dict) -> dict:
        assert snap.get("ledger.db-wal", b"") == b""
        return {n: v for n, v in snap.items() if n not in ("ledger.db-wal", "ledger.db-shm")}

    with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
        assert led.readonly
        assert led.count() == 13
        assert led.head().seq == 13
        assert [s.step_id for s in led.steps()] == ["step-0", "step-1", "step-2", "open"]
        assert led.step("open").state == "planned"
        assert len(led.timeline("step-1")) == 4
        assert len(list(led.read(kind="acked"))) == 3
        assert led.verify().ok
        with pytest.raises(ReadOnlyLedger):
            led.append(Planned(step="new", attempt=1))
        with pytest.raises(ReadOnlyLedger):
            led.rebuild()
        assert without_lock_files(snapshot_dir(tmp_path)) == before  # not even while open
    assert without_lock_files(snapshot_dir(tmp_path)) == before


def test_readonly_open_reads_through_a_live_writer(ledger: Ledger, commit_step) -> None:
    commit_step(ledger, "s")
    with Ledger.open(ledger.path, readonly=True, clock=FakeClock()) as reader:
        assert reader.count() == 4
        assert reader.step("s").state == "acked"
        ledger.append(Planned(step="t", attempt=1))
        assert reader.count() == 5  # a new read transaction sees the new commit
        assert [s.step_id for s in reader.steps()] == ["s", "t"]


def test_readwrite_open_of_a_healthy_ledger_keeps_its_content(
    tmp_path: Path, template: Path
) -> None:
    path = copy_ledger(template, tmp_path / "ledger.db")
    clock = FakeClock()
    with Ledger.open(path, clock=clock) as led:
        assert led.count() == 13
        rec = led.append(Planned(step="new", attempt=1))
        assert rec.seq == 14
        assert rec.time_ns == clock.last
    with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
        assert led.verify().ok
        assert led.count() == 14

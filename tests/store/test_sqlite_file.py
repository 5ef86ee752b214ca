"""The SQLite file: init, and opening defensively (refused files stay byte-identical);
read-only commands beside a writer; the file's modes (private to its owner); a ledger that
cannot be written where it is (its cause named)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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
from ledger.events import Compensated
from ledger.store.sqlite import database as dbmod

from conftest import FakeClock, commit_step, copy_ledger, snapshot_dir
from test_verify import small_ledger


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


def test_the_window_option_is_range_checked(tmp_path: Path) -> None:
    for bad in (0, 1e300, float("nan")):
        with pytest.raises(InvalidInput, match="compensation_window_s"):
            Ledger.init(tmp_path / "l.db", compensation_window_s=bad)
    assert not (tmp_path / "l.db").exists()


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


# --- read-only commands beside a writer (issue 11, item 7) --------------------------------

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
SLOW = os.environ.get("STEPTRAIL_SLOW") == "1"


def cli(ledger: Path, *argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """`steptrail --ledger LEDGER ARGV` in its own process."""
    kwargs.setdefault("cwd", ledger.parent)  # not the checkout: `-m ledger` imports from cwd
    return subprocess.run([sys.executable, "-m", "ledger", "--ledger", str(ledger), *argv],
                          capture_output=True, text=True, env=CLEAN, **kwargs)


def bulk_ledger(path: Path, events: int) -> None:
    """A ledger of `events` events (planned + compensated steps) in a few big commits."""
    with Ledger.init(path, synchronous="OFF") as led:
        batch: list = []
        for i in range(events // 2):
            batch += [Planned(step=f"bulk-{i}", attempt=1, artifacts=(f"out/{i}.txt",)),
                      Compensated(step=f"bulk-{i}", attempt=1, reason="bulk")]
            if len(batch) >= 10_000:
                led.append_batch(batch)
                batch = []
        if batch:
            led.append_batch(batch)


READERS = (("verify",), ("events", "--json"), ("audit",), ("gc", "--dry-run"))


def _has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` holds `path` open (it is past its open, reading)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def _read_bytes(pid: int) -> int:
    """What process `pid` has read so far (`rchar` of /proc/PID/io), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return 0


def _wait_mid_read(procs: list[subprocess.Popen[str]], path: Path, fraction: float) -> None:
    """Until every reader still running has the ledger open and has read `fraction` of
    its size since it opened it: a write then lands in the middle of its read."""
    want = int(path.stat().st_size * fraction)
    opened: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while True:
        waiting = False
        for p in procs:
            if p.poll() is not None:
                continue
            if p.pid not in opened:
                if _has_open(p.pid, path):
                    opened[p.pid] = _read_bytes(p.pid)
                waiting = True
            elif _read_bytes(p.pid) - opened[p.pid] < want:
                waiting = True
        if not waiting:
            return
        assert time.monotonic() < deadline, "the readers never got to read the ledger"
        time.sleep(0.002)


def _readers_beside_a_writer(path: Path, rounds: int) -> list[str]:
    """Rounds of: every read-only command started on the ledger as a closed session leaves
    it (no -wal); once each holds the file open, mid-read, a writer commits a batch and
    closes (its close checkpoints into the main file). Returns what the readers got wrong."""
    bad: list[str] = []
    for r in range(rounds):
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size == 0:  # nobody has it open: as if closed
            wal.unlink()
            Path(f"{path}-shm").unlink(missing_ok=True)
        procs = [(argv, subprocess.Popen(
            [sys.executable, "-m", "ledger", "--ledger", str(path), *argv],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CLEAN,
            cwd=path.parent)) for argv in READERS]
        _wait_mid_read([p for _, p in procs], path, fraction=(1 + r % 3) / 6)
        with Ledger.open(path) as led:
            led.append_batch([e for i in range(300) for e in (
                Planned(step=f"w{r}-{i}", attempt=1, artifacts=("x",)),
                Compensated(step=f"w{r}-{i}", attempt=1))])
        for argv, p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                bad.append(f"{' '.join(argv)}: exit {p.returncode}: {err.strip()}")
    after = cli(path, "verify")  # the ledger is fine: a reader that said otherwise was wrong
    assert after.returncode == 0, after.stdout + after.stderr
    return bad


def test_read_only_commands_beside_a_writer_never_report_damage(tmp_path: Path) -> None:
    """Item 7: on 984aaf7 a reader that opened with no -wal present read `immutable=1`,
    without locks, so the checkpoint of a writer that started mid-read tore its read:
    "database disk image is malformed … restore the file from a backup" (exit 2), or
    quick_check findings (exit 1), on a healthy ledger."""
    path = tmp_path / "ledger.db"
    bulk_ledger(path, 200_000 if SLOW else 20_000)
    assert _readers_beside_a_writer(path, 12 if SLOW else 2) == []


def test_a_refused_file_still_gets_no_lock_files(tmp_path: Path) -> None:
    """Item 7's fix reads an accepted ledger with SQLite's locks (an empty -wal and a -shm
    appear); a refused file is judged without them and is left exactly as found."""
    path = tmp_path / "ledger.db"
    bulk_ledger(path, 10)
    import apsw
    conn = apsw.Connection(str(path))
    conn.execute("CREATE VIEW planted AS SELECT 1")
    conn.close()
    before = sorted(os.listdir(tmp_path)), path.read_bytes()
    for argv in (("events",), ("audit",), ("gc", "--dry-run"), ("steps",)):
        r = cli(path, *argv)
        assert r.returncode == 2 and "schema differs" in r.stderr, r
    assert (sorted(os.listdir(tmp_path)), path.read_bytes()) == before


# --- the ledger keeps its secrets: file modes (issue 11, item 13) -------------------------

IS_ROOT = os.geteuid() == 0


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _as_nobody_read(path: Path) -> str:
    """Try to read `path` as another local user (nobody, with cat): "read" or its error."""
    r = subprocess.run(["cat", str(path)], capture_output=True,
                       preexec_fn=lambda: (os.setgroups([]), os.setgid(65534), os.setuid(65534)))
    return "read" if r.returncode == 0 else r.stderr.decode().strip().rsplit(": ", 1)[-1]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every local user can reach (pytest's tmp_path is its owner's alone),
    as a repository a ledger is made in usually is."""
    d = Path(tempfile.mkdtemp(prefix="steptrail-modes-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_new_ledger_is_private_to_its_owner(shared_tmp: Path) -> None:
    """Item 13: on 984aaf7, under umask 022, ledger.db was 0644 and blob files 0444 in
    0755 directories: another local user read both versions of `TOKEN=` from them."""
    (shared_tmp / ".env").write_text("TOKEN=first\n")
    (shared_tmp / "big.bin").write_bytes(b"TOKEN=in a file blob\n" * 20_000)

    def run(*argv: str) -> None:
        r = subprocess.run([sys.executable, "-m", "ledger", *argv], cwd=shared_tmp, env=CLEAN,
                           capture_output=True, text=True, preexec_fn=lambda: os.umask(0o022))
        assert r.returncode == 0, r.stderr

    run("init")
    run("step", "store", "s1", ".env", "big.bin")
    (shared_tmp / ".env").write_text("TOKEN=second\n")
    run("step", "store", "s2", ".env")
    run("gc", "--dry-run")
    run("gc")
    d = shared_tmp / ".steptrail"
    assert _mode(d) == 0o700
    files = [p for p in d.rglob("*") if p.is_file()]
    blobs = [p for p in files if "blobs" in p.parts]
    assert blobs and all(_mode(p) == 0o400 for p in blobs), {str(p): oct(_mode(p)) for p in blobs}
    assert all(_mode(p) == 0o700 for p in d.rglob("*") if p.is_dir())
    assert all(_mode(p) == 0o600 for p in files if p not in blobs), \
        {str(p): oct(_mode(p)) for p in files}
    with Ledger.open(d / "ledger.db") as led:  # while open: SQLite's -wal and -shm
        led.append(Planned(step="s3", attempt=1))
        assert _mode(d / "ledger.db-wal") == _mode(d / "ledger.db-shm") == 0o600
    if IS_ROOT:  # the attack: another local user
        assert _as_nobody_read(d / "ledger.db") == "Permission denied"
        assert _as_nobody_read(blobs[0]) == "Permission denied"


def test_an_existing_ledger_is_made_private_at_its_next_read_write_open(shared_tmp: Path) -> None:
    """A ledger made before: its files and blob store lose group and other access at the
    next read-write open (not at a read-only one, which never writes)."""
    path = small_ledger(shared_tmp / "ledger.db")
    blobs = shared_tmp / "blobs"
    os.chmod(path, 0o644)
    os.chmod(blobs, 0o755)
    (shared_tmp / "ledger.db-lockq").chmod(0o644)
    r = cli(path, "verify", "--json")
    assert r.returncode == 0  # exposed is not damaged: warnings, which verify reads only
    assert [w["check"] for w in json.loads(r.stdout)["warnings"]] == ["exposure", "exposure"]
    assert (_mode(path), _mode(blobs)) == (0o644, 0o755)
    assert cli(path, "step", "store", "s9", "ledger.db-lockq").returncode == 0
    assert (_mode(path), _mode(blobs), _mode(shared_tmp / "ledger.db-lockq")) == (0o600, 0o700, 0o600)
    assert json.loads(cli(path, "verify", "--json").stdout)["warnings"] == []
    if IS_ROOT:
        blob = next(p for p in blobs.rglob("*") if p.is_file())
        assert _as_nobody_read(blob) == "Permission denied"


# --- 17: a ledger that cannot be written where it is -------------------------------------


# --- a ledger that cannot be written where it is (issue 11, item 17) ----------------------


def _permission_bits_apply() -> list[str]:
    """A command prefix under which permission bits stop this process: nothing for a
    normal user; for root (CI), setpriv dropping the capabilities that bypass them."""
    if not IS_ROOT:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _cli_as(prefix: list[str], ledger: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "ledger", "--ledger", str(ledger), *argv],
                          capture_output=True, text=True, env=CLEAN, cwd=ledger.parent.parent)


def test_a_read_only_ledger_directory_names_the_cause(tmp_path: Path) -> None:
    """Item 17: on 984aaf7 a writer in a directory it may not write failed with exit 3
    "… unable to open database file; free space or fix the disk". Real EACCES (the
    permission bits, with root's override dropped)."""
    prefix = _permission_bits_apply()
    d = tmp_path / "led"
    d.mkdir()
    path = small_ledger(d / "ledger.db")
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "big.bin").write_bytes(b"b" * 100_000)
    d.chmod(0o555)
    try:
        r = _cli_as(prefix, path, "step", "store", "s9", "a.txt")
        assert r.returncode == 2, r  # AccessDenied: not a retry code (issue 37)
        assert "may not create files in" in r.stderr and "free space" not in r.stderr, r.stderr
        assert "write permission" in r.stderr
        for argv in (("verify",), ("events", "--json"), ("audit",)):  # readers still work
            assert _cli_as(prefix, path, *argv).returncode == 0, argv
        d.chmod(0o755)
        (d / "blobs").chmod(0o555)  # the ledger is writable, its blob store is not
        r = _cli_as(prefix, path, "step", "store", "s9", "big.bin")
        assert r.returncode == 2, r
        assert "may not write the blob store" in r.stderr and "free space" not in r.stderr, r.stderr
        # another user's private ledger: named as such, not "not a steptrail ledger"
        (d / "blobs").chmod(0o755)
        os.chown(path, 65534, 65534) if IS_ROOT else path.chmod(0o000)
        r = _cli_as(prefix, path, "events")
        assert r.returncode == 2 and "may not read it" in r.stderr and "owner" in r.stderr, r
        assert "not a steptrail ledger" not in r.stderr
    finally:
        d.chmod(0o755)
        (d / "blobs").chmod(0o755)
        path.chmod(0o600)


def test_a_read_only_file_system_names_the_cause(tmp_path: Path) -> None:
    """Item 17 on a real read-only mount (a bind mount remounted read-only in a private
    mount namespace): EROFS, named as such."""
    d = tmp_path / "led"
    d.mkdir()
    path = small_ledger(d / "ledger.db")
    (tmp_path / "a.txt").write_text("a\n")
    ns = ["unshare", "-m"] if IS_ROOT else ["unshare", "-rm"]
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift'
              ' && exec "$@"')
    probe = subprocess.run([*ns, "sh", "-c", script, "sh", str(d), "true"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip(f"no private read-only mount here: {probe.stderr!r}")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ns, "sh", "-c", script, "sh", str(d), sys.executable, "-m",
                               "ledger", "--ledger", str(path), *argv],
                              capture_output=True, text=True, env=CLEAN, cwd=tmp_path)

    r = run("step", "store", "s9", "a.txt")
    assert r.returncode == 2, r
    assert "read-only file system" in r.stderr and "free space" not in r.stderr, r.stderr
    r = run("--ledger", str(d / "sub" / "ledger.db"), "init")
    assert r.returncode == 2 and "read-only file system" in r.stderr, r
    assert run("verify").returncode == 0


def test_read_filters_by_run_and_workspace(ledger: Ledger) -> None:
    """`Ledger.read(run=..., workspace=...)`: the store filters (a run through its index),
    combined with kind, after_seq and limit; bad names are a typed error."""
    from ledger import InvalidInput, Planned

    ledger.append_batch([Planned(step=f"rf{i}", attempt=1, run="a" if i % 3 == 0 else "b")
                         for i in range(12)])
    assert [r.event.step for r in ledger.read(run="a", kind="planned")] == ["rf0", "rf3", "rf6", "rf9"]
    first = list(ledger.read(run="b", limit=2))
    assert [r.event.step for r in first] == ["rf1", "rf2"]
    assert [r.event.step for r in ledger.read(first[-1].seq, run="b", limit=2)] == ["rf4", "rf5"]
    assert list(ledger.read(run="none-such")) == []
    assert list(ledger.read(workspace="w-none")) == []
    assert len(list(ledger.read(workspace=""))) == len(list(ledger.read()))  # no workspace
    for bad in ({"run": 5}, {"workspace": "x" * 257}, {"run": "\udcff"}):
        with pytest.raises(InvalidInput):
            ledger.read(**bad)  # type: ignore[arg-type]

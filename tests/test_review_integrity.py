"""Issue 11, integrity items: readers beside writers (7), a ledger whose append-only
triggers were dropped (10), unchecked facts (11), file modes (13), a read-only ledger
directory (17).

Each test failed on 984aaf7, before its fix.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FakeClock, digest_of, raw_connection, run_cli

from ledger import Ledger
from ledger.errors import InvalidInput, NotALedger
from ledger.events import Compensated, Planned
from ledger.runner import run_step

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


# --- 7: read-only commands beside a writer ----------------------------------------------

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


# --- 10: verify examines a ledger whose append-only triggers were dropped ----------------


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


def test_the_window_option_is_range_checked(tmp_path: Path) -> None:
    for bad in (0, 1e300, float("nan")):
        with pytest.raises(InvalidInput, match="compensation_window_s"):
            Ledger.init(tmp_path / "l.db", compensation_window_s=bad)
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize("sql, what", [
    ("UPDATE projection_checkpoint SET last_seq = last_seq + 1000", "catching up would skip"),
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


# --- 13: the ledger keeps its secrets ----------------------------------------------------

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
        assert r.returncode == 3, r
        assert "may not create files in" in r.stderr and "free space" not in r.stderr, r.stderr
        assert "write permission" in r.stderr
        for argv in (("verify",), ("events", "--json"), ("audit",)):  # readers still work
            assert _cli_as(prefix, path, *argv).returncode == 0, argv
        d.chmod(0o755)
        (d / "blobs").chmod(0o555)  # the ledger is writable, its blob store is not
        r = _cli_as(prefix, path, "step", "store", "s9", "big.bin")
        assert r.returncode == 3, r
        assert "may not write the blob store" in r.stderr and "free space" not in r.stderr, r.stderr
        # another user's private ledger: named as such, not "not a steptrail ledger"
        (d / "blobs").chmod(0o755)
        os.chown(path, 65534, 65534) if IS_ROOT else path.chmod(0o000)
        r = _cli_as(prefix, path, "events")
        assert r.returncode == 3 and "may not read it" in r.stderr and "owner" in r.stderr, r
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
    assert r.returncode == 3, r
    assert "read-only file system" in r.stderr and "free space" not in r.stderr, r.stderr
    r = run("--ledger", str(d / "sub" / "ledger.db"), "init")
    assert r.returncode == 3 and "read-only file system" in r.stderr, r
    assert run("verify").returncode == 0

"""Issue 11, integrity items: readers beside writers (7), a ledger whose append-only
triggers were dropped (10), unchecked facts (11), file modes (13), a read-only ledger
directory (17).

Each test failed on 984aaf7, before its fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger import Ledger
from ledger.events import Compensated, Planned

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("STEPLEDGER_")}
SLOW = os.environ.get("STEPLEDGER_SLOW") == "1"


def cli(ledger: Path, *argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """`stepledger --ledger LEDGER ARGV` in its own process."""
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

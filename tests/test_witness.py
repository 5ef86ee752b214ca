"""The witness: the chain head outside the ledger file (docs/design.md "Integrity").

An honest crash leaves the ledger at most one commit ahead of its witness (accepted);
a ledger behind its witness, or off its chain, is refused at open — read-only or
read-write, nothing written — and reported by verify. Silent WAL damage (a damaged WAL
that opens "fine" with committed history missing) is caught the same way.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from pathlib import Path

import pytest

from ledger import Ledger, Planned
from ledger.errors import InvalidInput, LedgerError
from ledger.witness import SLOT, Witness, WitnessMismatch


def tree(d: Path) -> dict[str, str]:
    """Every file's hash. A -shm (SQLite's shared-memory WAL index, no data) that reading
    a live WAL needs is left out: the ledger and its WAL are what must not change."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and not p.name.endswith("-shm")}


def snapshot_copy(src: Path, dst: Path) -> None:
    """A copy of a ledger as it is on disk right now (its -wal included)."""
    shutil.copy(src, dst)
    if Path(str(src) + "-wal").exists():
        shutil.copy(str(src) + "-wal", str(dst) + "-wal")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "other-volume").mkdir()
    return tmp_path / "l.db", tmp_path / "other-volume" / "ledger.witness"


def append(ledger: Ledger, n: int, prefix: str = "s") -> None:
    for i in range(n):
        ledger.append(Planned(step=f"{prefix}{i}", attempt=1))


def test_every_commit_updates_the_witness(setup: tuple[Path, Path]) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 3)
        ledger.append_batch([Planned(step="b1", attempt=1), Planned(step="b2", attempt=1)])
        head = ledger.head()
        seen = Witness(w, ledger.ledger_id).read()
        assert seen is not None and (seen.seq, seen.hash) == (head.seq, head.hash)
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 0 and ledger.verify().ok


def test_an_honest_crash_one_commit_ahead_is_accepted(setup: tuple[Path, Path]) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 3)
        ledger._log.on_commit = None  # the process dies between COMMIT and the witness write
        ledger.append_batch([Planned(step="x", attempt=1), Planned(step="y", attempt=1)])
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 1
        assert ledger.verify().ok
        append(ledger, 1, "after")  # the next commit catches the witness up
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 0


def test_two_honest_crashes_in_a_row_stay_one_commit_ahead(setup: tuple[Path, Path]) -> None:
    """A writer that opens a ledger one commit ahead of its witness (an honest crash)
    catches the witness up at once: a second crash between its own COMMIT and witness
    write leaves the ledger one commit ahead again, not two — which verify (rightly)
    calls a tail written without the witness. Found by the model-based machine (a power
    loss, a reopen, a kill)."""
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 2)
        ledger._log.on_commit = None  # dies between COMMIT and the witness write
        append(ledger, 1, "first-crash")
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 1
        ledger._log.on_commit = None  # and again, in the next process
        append(ledger, 1, "second-crash")
    with Ledger.open(path, witness=w, readonly=True) as ledger:
        assert ledger.witness_lag == 1
        assert ledger.verify().ok
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 1  # what this open found; it caught the witness up
    with Ledger.open(path, witness=w, readonly=True) as ledger:
        assert ledger.witness_lag == 0


def test_a_tail_written_without_the_witness_is_refused(setup: tuple[Path, Path]) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 2)
    with Ledger.open(path) as ledger:  # opened without --witness: it keeps the recorded one
        append(ledger, 1, "recorded")
    with Ledger.open(path) as ledger:
        # a writer that does not keep the witness (an older steptrail, a raw SQL writer)
        ledger._log.before_commit = ledger._log.on_commit = None
        append(ledger, 3, "unwitnessed")
    with pytest.raises(WitnessMismatch, match="not written under this witness"):
        Ledger.open(path, witness=w)  # indistinguishable from a forged tail: fail closed
    with Ledger.open(path, witness=w, readonly=True, witness_check=False) as ledger:
        report = ledger.verify()
        assert not report.ok and any("not written under this witness" in f.message
                                     for f in report.findings)


@pytest.mark.sqlite_only
def test_a_rolled_back_copy_is_refused_at_open_and_left_untouched(
        setup: tuple[Path, Path], tmp_path: Path) -> None:
    path, w = setup
    old = tmp_path / "old"
    old.mkdir()
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 4)
        snapshot_copy(path, old / "l.db")  # a genuine, complete, older copy (T9)
        append(ledger, 1, "newer")
    shutil.copy(old / "l.db", path)
    wal = Path(str(path) + "-wal")
    if (old / "l.db-wal").exists():
        shutil.copy(old / "l.db-wal", wal)
    elif wal.exists():
        wal.unlink()
    before = tree(tmp_path)
    for readonly in (True, False):
        with pytest.raises(WitnessMismatch, match="its witness recorded #6"):  # #1: anchored
            Ledger.open(path, witness=w, readonly=readonly)
    assert tree(tmp_path) == before
    with Ledger.open(path, witness=w, readonly=True, witness_check=False) as ledger:
        report = ledger.verify()
    assert not report.ok and {f.check for f in report.findings} >= {"head", "witness"}


@pytest.mark.sqlite_only
def test_a_forked_history_is_refused(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """The same ledger, two futures after seq 3: the witness saw one, the file holds the
    other (a rewritten tail with a valid chain)."""
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 3)
        snapshot_copy(path, tmp_path / "fork.db")
        append(ledger, 2, "real")
    # The forger's own writer: steptrail refuses to open the fork (behind its recorded
    # witness), so it writes without resolving the witness at all.
    with Ledger.open(tmp_path / "fork.db", _witness_resolve=False) as fork:
        append(fork, 3, "forged")  # a valid chain, longer than the witnessed one
    with pytest.raises(WitnessMismatch, match="history rewritten"):
        Ledger.open(tmp_path / "fork.db", witness=w, readonly=True)


def test_a_torn_witness_slot_falls_back_to_the_previous_head(setup: tuple[Path, Path]) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 4)
        head = ledger.head()
    raw = bytearray(w.read_bytes())
    slot = head.seq % 2
    raw[slot * SLOT + 10] ^= 0xFF  # the last write tore
    w.write_bytes(bytes(raw))
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 1  # the other slot: one commit behind, accepted


def test_a_witness_of_another_ledger_is_refused(setup: tuple[Path, Path], tmp_path: Path) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 1)
    with pytest.raises(InvalidInput, match="belongs to ledger"):
        Ledger.init(tmp_path / "other.db", witness=w)


def _damage_wal(src: Path, dst: Path, rng: random.Random) -> bool:
    """Copy a ledger with a live WAL and damage random bytes of its WAL frames."""
    dst.mkdir()
    snapshot_copy(src, dst / "l.db")
    wal = dst / "l.db-wal"
    if not wal.exists() or wal.stat().st_size <= 32:
        return False
    data = bytearray(wal.read_bytes())
    for _ in range(rng.randint(1, 6)):
        data[rng.randrange(32, len(data))] ^= 1 << rng.randrange(8)
    wal.write_bytes(bytes(data))
    return True


@pytest.mark.sqlite_only
def test_silent_wal_damage_is_reported_not_passed(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """Without a witness some damaged WALs open 'fine' with committed history missing;
    with one, every such open is refused (or the file is reported damaged)."""
    path, w = setup
    rng = random.Random(7)
    ledger = Ledger.init(path, witness=w)
    try:
        ledger._store.db.conn.execute("PRAGMA wal_autocheckpoint=0")  # keep the history in the WAL
        append(ledger, 40)
        committed = ledger.head().seq
        outcomes = {"silent loss without witness": 0, "refused by witness": 0,
                    "typed error": 0, "intact": 0}
        for i in range(40):
            case = tmp_path / f"case{i}"
            if not _damage_wal(path, case, rng):
                continue
            shutil.copy(w, case / "w")
            plain = _open_head(case / "l.db", None)
            if isinstance(plain, int) and plain < committed:
                outcomes["silent loss without witness"] += 1
            shutil.rmtree(case / "l.db-shm", ignore_errors=True)
            result = _open_head(case / "l.db", case / "w", fresh_from=case, rng_case=i, src=path)
            if result == "witness":
                outcomes["refused by witness"] += 1
            elif result == "error":
                outcomes["typed error"] += 1
            else:
                assert result == committed, f"case {i}: opened with history missing, not refused"
                outcomes["intact"] += 1
    finally:
        ledger.close()
    print(f"\nWAL damage, 40 cases: {outcomes}")
    assert outcomes["silent loss without witness"] > 0  # the problem is real here
    assert outcomes["refused by witness"] >= outcomes["silent loss without witness"]


def _open_head(path: Path, witness: Path | None, **_: object) -> int | str:
    """Open a damaged copy (read-only, nothing written); its head seq or what refused it."""
    # read-only with a -wal present reads through it; work on a private copy each time
    work = path.parent / f"work-{'w' if witness else 'plain'}"
    work.mkdir(exist_ok=True)
    for suffix in ("", "-wal"):
        if Path(str(path) + suffix).exists():
            shutil.copy(str(path) + suffix, str(work / "l.db") + suffix)
    try:
        with Ledger.open(work / "l.db", witness=witness, readonly=True) as led:
            return led.head().seq
    except WitnessMismatch:
        return "witness"
    except LedgerError:
        return "error"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.sync()


#: Each test runs on SQLite and on PostgreSQL (tests/conftest.py).
BOTH_STORES = True

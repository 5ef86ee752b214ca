"""The witness: the chain head outside the ledger file (docs/design.md "Integrity").

An honest crash leaves the ledger at most one commit ahead of its witness (accepted);
a ledger behind its witness, or off its chain, is refused at open — read-only or
read-write, nothing written — and reported by verify. Silent WAL damage (a damaged WAL
that opens "fine" with committed history missing) is caught the same way. A witnessed
ledger records where its witness is, so every opener uses it and a lost witness fails
closed; `steptrail witness anchor` is the verified, recorded way back.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CliOut, LedgerAt, damage_witness, run_cli, tamper

from ledger import Ledger, PathForbidden, Planned, WitnessAnchored
from ledger.blobs import digest_of
from ledger.errors import InvalidInput, LedgerError
from ledger.step.values import StepPlan, Write
from ledger.witness import (
    SLOT,
    AnchorRefused,
    Witness,
    WitnessElsewhere,
    WitnessMismatch,
    WitnessMissing,
)


def tree(d: Path) -> dict[str, str]:
    """Every file's hash. A -shm (SQLite's shared-memory WAL index, no data) that reading
    a live WAL needs is left out: the ledger and its WAL are what must not change."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and not p.name.endswith("-shm")}


def snapshot_copy(src: Path | str, dst: Path) -> None:
    """A copy of a ledger as it is on disk right now: its -wal included, or a -wal left
    at `dst` removed."""
    shutil.copy(src, dst)
    if Path(str(src) + "-wal").exists():
        shutil.copy(str(src) + "-wal", str(dst) + "-wal")
    elif Path(str(dst) + "-wal").exists():
        os.unlink(str(dst) + "-wal")


#: A ledger's location (its path on SQLite) and its witness's path.
Setup = tuple[Path | str, Path]


@pytest.fixture
def setup(tmp_path: Path, ledger_at: LedgerAt) -> Setup:
    """The ledger's location and its witness, on another volume."""
    (tmp_path / "other-volume").mkdir()
    return ledger_at(tmp_path / "l.db"), tmp_path / "other-volume" / "ledger.witness"


def append(ledger: Ledger, n: int, prefix: str = "s") -> None:
    for i in range(n):
        ledger.append(Planned(step=f"{prefix}{i}", attempt=1))


def test_every_commit_updates_the_witness(setup: Setup) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 3)
        ledger.append_batch([Planned(step="b1", attempt=1), Planned(step="b2", attempt=1)])
        head = ledger.head()
        seen = Witness(w, ledger.ledger_id).read()
        assert seen is not None and (seen.seq, seen.hash) == (head.seq, head.hash)
    with Ledger.open(path, witness=w) as ledger:
        assert ledger.witness_lag == 0 and ledger.verify().ok


def test_an_honest_crash_one_commit_ahead_is_accepted(setup: Setup) -> None:
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


def test_two_honest_crashes_in_a_row_stay_one_commit_ahead(setup: Setup) -> None:
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


def test_a_tail_written_without_the_witness_is_refused(setup: Setup) -> None:
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
        setup: Setup, tmp_path: Path) -> None:
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
def test_a_forked_history_is_refused(setup: Setup, tmp_path: Path) -> None:
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


def test_a_torn_witness_slot_falls_back_to_the_previous_head(setup: Setup) -> None:
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


def test_a_witness_of_another_ledger_is_refused(setup: Setup, tmp_path: Path,
                                               ledger_at: LedgerAt) -> None:
    path, w = setup
    with Ledger.init(path, witness=w) as ledger:
        append(ledger, 1)
    with pytest.raises(InvalidInput, match="belongs to ledger"):
        Ledger.init(ledger_at(tmp_path / "other.db"), witness=w)


def _damage_wal(src: Path | str, dst: Path, rng: random.Random) -> bool:
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
def test_silent_wal_damage_is_reported_not_passed(setup: Setup, tmp_path: Path) -> None:
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



# --- a witness that fails closed, and a recorded way back (issue 11, items 8 and 9) ---------
#
# A witnessed ledger records where its witness is (a chained `witness-anchored` event), so
# every opener — read-only, read-write, `verify` — uses it; a missing, empty, zero-filled or
# unreadable witness fails closed (verify: a finding, exit 1) instead of starting a fresh
# witness from a rolled-back head. Witness paths are absolute. A command without --witness
# keeps the recorded witness, so no supported path leaves a healthy ledger unusable;
# `steptrail witness anchor` is the operator's way back (verified, recorded).


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in tmp_path, which holds `a.txt`: 'step store STEP a.txt' stores it."""
    (tmp_path / "a.txt").write_text("a")
    monkeypatch.chdir(tmp_path)


class World:
    """A ledger in `store/` and its witness on `vol/` (another volume, in spirit)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store, self.vol = tmp / "store", tmp / "vol"
        self.store.mkdir()
        self.vol.mkdir()
        self.path = self.store / "ledger.db"
        self.witness = self.vol / "ledger.witness"

    def cli(self, *args: str, env: dict[str, str] | None = None) -> CliOut:
        return run_cli(["--ledger", str(self.path), *args], env=env)

    def tree(self) -> dict[str, str]:
        """Every file under the ledger's and the witness's directories (SQLite's lock
        files, a -shm and an empty -wal that a read-only open may create, left out):
        what "nothing written" compares."""
        return {str(p.relative_to(self.tmp)): hashlib.sha256(p.read_bytes()).hexdigest()
                for d in (self.store, self.vol) for p in sorted(d.rglob("*"))
                if p.is_file() and not p.name.endswith("-shm")
                and not (p.name.endswith("-wal") and p.stat().st_size == 0)}

    def witnessed_head(self) -> tuple[int, bytes]:
        with Ledger.open(self.path, readonly=True, witness_check=False) as led:
            seen = Witness(self.witness, led.ledger_id).read()
        assert seen is not None
        return seen.seq, seen.hash



def rolled_back(world: World) -> None:
    """Witness a ledger, keep a genuine older copy, write on, then put the copy back."""
    old = world.tmp / "old.db"
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
        snapshot_copy(world.path, old)
        append(led, 2, "newer")
    snapshot_copy(old, world.path)


# --- item 8: a missing, blank or relative witness fails closed ----------------------


@pytest.mark.parametrize("how", ["deleted", "empty", "zeros", "unreadable"])
@pytest.mark.usefixtures("in_tmp")
def test_a_rolled_back_ledger_with_its_witness_removed_is_refused_by_every_opener(
        tmp_path: Path, how: str) -> None:
    """The attack: roll the ledger back to an older genuine copy and remove (or zero)
    the witness. Every opener refuses, with or without --witness, read-only or not;
    verify reports it (exit 1); nothing is written — no fresh witness either."""
    world = World(tmp_path)
    rolled_back(world)
    damage_witness(world.witness, how)
    before = world.tree()
    refused = WitnessMissing if how != "unreadable" else LedgerError
    for readonly in (True, False):
        for witness in (None, world.witness):
            with pytest.raises(refused):
                Ledger.open(world.path, readonly=readonly, witness=witness)
    with pytest.raises(refused):
        Ledger.init(world.path)
    expected_code = 1 if how != "unreadable" else 3
    for args in (["events"], ["steps"], ["head"], ["audit"], ["gc", "--dry-run"],
                 ["step", "store", "x", "a.txt"]):
        r = world.cli(*args)
        assert r.code == expected_code, (args, r)
        if how != "unreadable":
            assert "witness anchor" in r.err, r.err  # names the way back
    r = world.cli("verify", "--json")
    assert r.code == 1, r
    assert "witness" in {f["check"] for f in r.json["findings"]}
    assert world.tree() == before
    if how == "deleted":
        assert not world.witness.exists()


@pytest.mark.usefixtures("in_tmp")
def test_a_relative_witness_is_refused_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = world.cli("init", env={"STEPTRAIL_WITNESS": "ledger.witness"})
    assert r.code == 2 and "relative" in r.err and "absolute" in r.err, r
    assert not world.path.exists() and list(elsewhere.iterdir()) == []
    (elsewhere / "a.txt").write_text("a")
    with pytest.raises(InvalidInput, match="relative"):
        Ledger.init(world.path, witness="ledger.witness")
    assert not world.path.exists()
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 2)
    before = world.tree()
    for args in (["--witness", "ledger.witness", "events"],
                 ["--witness", "../vol/ledger.witness", "step", "store", "x", "a.txt"],
                 ["--witness", "ledger.witness", "verify"]):
        r = run_cli(["--ledger", str(world.path), *args])
        assert r.code == 2 and "relative" in r.err, (args, r)
    with pytest.raises(InvalidInput, match="relative"):
        Ledger.open(world.path, readonly=True, witness="../vol/ledger.witness")
    assert world.tree() == before and [p.name for p in elsewhere.iterdir()] == ["a.txt"]


@pytest.mark.usefixtures("in_tmp")
def test_an_opener_without_witness_uses_the_recorded_one(tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 2)
    with Ledger.open(world.path) as led:  # no witness given
        assert led.witness is not None and led.witness.path == str(world.witness)
        append(led, 2, "more")
        head = led.head()
    assert world.witnessed_head() == (head.seq, head.hash)
    assert world.cli("step", "store", "cli", "a.txt").code == 0
    with Ledger.open(world.path, readonly=True) as led:
        head = led.head()
        assert led.witness is not None
    assert world.witnessed_head() == (head.seq, head.hash)
    r = world.cli("witness", "show", "--json")
    assert r.code == 0 and r.json["witness"] == str(world.witness)
    assert (r.json["state"], r.json["anchored_seq"], r.json["lag"]) == ("ok", 1, 0)


def test_the_recorded_witness_is_out_of_reach_of_steps_without_witness_given(
        tmp_path: Path) -> None:
    """The workspace boundary keeps the ledger's witness out of every step's reach; a
    ledger opened without --witness still knows which file that is."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with Ledger.init(ws / ".steptrail" / "ledger.db", witness=ws / "witness") as led:
        led.workspaces.add("w", str(ws))
    with Ledger.open(ws / ".steptrail" / "ledger.db") as led:  # no witness given
        epoch = led.workspaces.acquire("w", "agent", 3600).epoch
        pre = digest_of((ws / "witness").read_bytes())
        with pytest.raises(PathForbidden):
            led.workspaces.admit("w", epoch, [StepPlan("evil", [Write("witness", b"\0" * 256, pre)])])
        assert led.find_step("evil") is None


@pytest.mark.usefixtures("in_tmp")
def test_a_witness_other_than_the_recorded_one_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 1)
    other = world.vol / "other.witness"
    before = world.tree()
    for readonly in (True, False):
        with pytest.raises(WitnessElsewhere, match="witnessed by"):
            Ledger.open(world.path, readonly=readonly, witness=other)
    r = world.cli("--witness", str(other), "step", "store", "x", "a.txt")
    assert r.code == 2 and "witness anchor" in r.err, r
    assert world.tree() == before and not other.exists()


def test_append_does_not_take_a_witness_anchored_event(tmp_path: Path) -> None:
    """Only the anchoring path (which verifies) records where the witness is."""
    world = World(tmp_path)
    with Ledger.init(world.path) as led:
        forged = WitnessAnchored(witness="/attacker/w", head_seq=0,
                                 head_hash=led.head().hash.hex())
        with pytest.raises(InvalidInput, match="anchor"):
            led.append(forged)
        with pytest.raises(InvalidInput, match="anchor"):
            led.append_batch([Planned(step="a", attempt=1), forged])
        assert led.count() == 0


def test_a_step_named_like_the_anchor_kind_is_not_an_anchor(tmp_path: Path) -> None:
    """Anchors are found by their journal key; a step id cannot pose as one."""
    world = World(tmp_path)
    with Ledger.init(world.path) as led:
        led.append(Planned(step="witness-anchored", attempt=1))
        led.append(Planned(step='witness-anchored",""', attempt=1))
    with Ledger.open(world.path) as led:
        assert not led.witnessed and led.witness is None
        led.append(Planned(step="after", attempt=1))
        assert led.verify().ok


def test_verify_checks_the_recorded_anchors(tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 2)
        # Written past append's refusal: an anchor naming a head that is not its own
        # predecessor, and a location that does not follow the one before it.
        led._witness.append_anchor(WitnessAnchored(witness=str(world.witness), head_seq=1,
                                           head_hash=led.head().hash.hex(),
                                           previous="/somewhere/else"))
        report = led.verify()
    messages = [f.message for f in report.findings if f.check == "witness"]
    assert any("not the event before it" in m for m in messages), messages
    assert any("/somewhere/else" in m for m in messages), messages


# --- item 9: no lockout; an explicit, verified, recorded way back --------------------


@pytest.mark.usefixtures("in_tmp")
def test_a_command_without_witness_leaves_a_witnessed_ledger_usable(tmp_path: Path) -> None:
    world = World(tmp_path)
    assert world.cli("--witness", str(world.witness), "init").code == 0
    for step in ("s1", "s2"):
        r = world.cli("step", "store", step, "a.txt")  # no --witness
        assert r.code == 0, r
    for args in (["--witness", str(world.witness), "verify"], ["verify"], ["events"]):
        r = world.cli(*args)
        assert r.code == 0, (args, r)
    with Ledger.open(world.path, witness=world.witness) as led:
        assert led.witness_lag == 0 and led.verify().ok


@pytest.mark.usefixtures("in_tmp")
def test_anchor_replaces_a_lost_witness_after_verifying(tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
        head = led.head()
    world.witness.unlink()
    r = world.cli("events")
    assert r.code == 1 and "witness anchor" in r.err
    r = world.cli("witness", "anchor", "--json")  # in place: the recorded location
    assert r.code == 0, r
    doc = r.json
    assert (doc["witness"], doc["previous"], doc["previous_state"]) == (
        str(world.witness), str(world.witness), "missing")
    assert (doc["head_seq"], doc["head_hash"], doc["forced"]) == (head.seq, head.hash.hex(), False)
    with Ledger.open(world.path) as led:
        new = led.head()
        assert new.seq == doc["seq"] == head.seq + 1
        last = list(led.read(after_seq=head.seq))
        assert [r.kind for r in last] == ["witness-anchored"]
        assert led.verify().ok
        append(led, 1, "after")
        assert world.witnessed_head() == (led.head().seq, led.head().hash)
        led.rebuild()  # the projections skip the kind; a rebuild equals the tables
        assert led.verify().ok
    assert world.cli("verify").code == 0
    r = world.cli("events", "--kind", "witness-anchored", "--json")
    assert r.code == 0 and [e["seq"] for e in r.json] == [1, doc["seq"]]
    assert r.json[1]["journal_key"] == json.dumps(
        ["witness-anchored", "", str(world.witness), head.seq], separators=(",", ":"))


@pytest.mark.usefixtures("in_tmp")
def test_anchor_refuses_a_damaged_ledger_unless_forced_and_records_the_override(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
    world.witness.unlink()
    tamper(world.path, [("UPDATE events SET time_ns = time_ns + 1 WHERE seq = 2", ())])
    before = world.tree()
    with pytest.raises(AnchorRefused, match="force=True"):
        Ledger.anchor_witness(world.path)
    r = world.cli("witness", "anchor")
    assert r.code == 1 and "chain" in r.err, r
    assert world.tree() == before and not world.witness.exists()
    r = world.cli("witness", "anchor", "--force", "--json")
    assert r.code == 0, r
    assert r.json["forced"] is True and any("chain" in m for m in r.json["overridden"])
    with Ledger.open(world.path, readonly=True) as led:
        event = list(led.read(kind="witness-anchored"))[-1].event
        assert isinstance(event, WitnessAnchored) and event.forced and event.overridden


@pytest.mark.usefixtures("in_tmp")
def test_anchor_refuses_a_rolled_back_ledger_unless_forced(tmp_path: Path) -> None:
    """The witness is intact and says history was lost: re-anchoring accepts the loss,
    so it takes --force, and the event records what the witness said."""
    world = World(tmp_path)
    rolled_back(world)
    with pytest.raises(WitnessMismatch, match="force=True"):
        Ledger.open(world.path)
    before = world.tree()
    r = world.cli("witness", "anchor")
    assert r.code == 1 and "its witness recorded" in r.err, r
    assert world.tree() == before
    r = world.cli("witness", "anchor", "--force", "--json")
    assert r.code == 0 and r.json["previous_state"] == "mismatch", r
    with Ledger.open(world.path) as led:
        assert led.verify().ok


@pytest.mark.usefixtures("in_tmp")
def test_anchor_moves_a_healthy_witness(tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 2)
    moved = tmp_path / "vol2" / "ledger.witness"
    moved.parent.mkdir()
    old_bytes = world.witness.read_bytes()
    r = world.cli("witness", "anchor", "--witness", str(moved), "--json")
    assert r.code == 0 and r.json["previous_state"] == "ok", r
    assert r.json["previous"] == str(world.witness)
    assert oct(moved.stat().st_mode & 0o777) == oct(0o600)  # it holds the key
    assert world.cli("step", "store", "x", "a.txt").code == 0
    r = world.cli("witness", "show", "--json")
    assert r.json["witness"] == str(moved) and r.json["state"] == "ok"
    r = world.cli("--witness", str(world.witness), "events")
    assert r.code == 2 and "witnessed by" in r.err
    assert world.witness.read_bytes() == old_bytes  # no longer written
    before = world.tree()
    for bad in ("relative.witness", str(tmp_path / "nowhere" / "w"), str(world.path)):
        r = world.cli("witness", "anchor", "--witness", bad)  # never clobbers a non-witness
        assert r.code == 2, (bad, r)
    assert world.tree() == before


@pytest.mark.parametrize("first", [True, False], ids=["first-anchor", "re-anchor"])
def test_a_writer_open_across_an_anchor_is_refused_then_reopens(tmp_path: Path,
                                                                first: bool) -> None:
    """A writer that opened before another process anchored would commit a tail the new
    witness does not know (a lockout at the next open): it is refused instead, nothing
    written, and reopening uses the new witness."""
    world = World(tmp_path)
    with Ledger.init(world.path, witness=None if first else world.witness) as led:
        append(led, 2)
    target = world.vol / "new.witness"
    writer = Ledger.open(world.path)
    try:
        Ledger.anchor_witness(world.path, target)
        count = writer.count()
        with pytest.raises(WitnessMismatch, match="open the ledger again"):
            writer.append(Planned(step="late", attempt=1))
        assert writer.count() == count
    finally:
        writer.close()
    with Ledger.open(world.path) as led:
        led.append(Planned(step="late", attempt=1))
        assert led.verify().ok


#: A child that re-anchors and SIGKILLs itself at one point of the anchoring: right after
#: the new witness file is written (inside the transaction, before COMMIT), or right
#: after COMMIT (before the new witness receives the anchor event's head).
KILLED_ANCHOR = """
import os, signal, sys
from ledger import Ledger
from ledger.witness import Witness
point, real = sys.argv[3], getattr(Witness, sys.argv[3])
def killed(self, *args):
    if point == "start":  # the new witness written, the transaction not committed
        real(self, *args)
    os.kill(os.getpid(), signal.SIGKILL)  # "write": committed, the witness not updated
setattr(Witness, point, killed)
Ledger.anchor_witness(sys.argv[1], sys.argv[2])
"""


@pytest.mark.parametrize("point", ["start", "write"])
@pytest.mark.usefixtures("in_tmp")
def test_an_anchor_killed_midway_leaves_a_ledger_that_opens_or_anchors_again(
        tmp_path: Path, point: str) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
        head = led.head()
    world.witness.unlink()  # lost: the operator re-anchors on another volume
    target = tmp_path / "vol2" / "ledger.witness"
    target.parent.mkdir()
    done = subprocess.run([sys.executable, "-c", KILLED_ANCHOR, str(world.path), str(target),
                           point], capture_output=True, timeout=60)
    assert done.returncode == -9, done
    if point == "start":  # not committed: the old (lost) location is still the recorded one
        with pytest.raises(WitnessMissing):
            Ledger.open(world.path)
        with Ledger.open(world.path, readonly=True, witness_check=False) as led:
            assert led.head() == head
        Ledger.anchor_witness(world.path, target)  # the operator runs it again
    with Ledger.open(world.path) as led:  # after COMMIT: one commit ahead, an honest crash
        assert led.witness is not None and led.witness.path == str(target)
        assert led.witness_lag == (1 if point == "write" else 0)
        append(led, 1, "after")
        assert led.verify().ok


def test_a_ledger_witnessed_before_locations_were_recorded_stays_valid(tmp_path: Path) -> None:
    """A ledger written by an older steptrail: its witness tag in meta, no
    witness-anchored event. It is witnessed, so it is not opened without the witness;
    the first writer given it records where it is."""
    world = World(tmp_path)
    with Ledger.init(world.path) as led:  # what an older steptrail left
        witness = Witness(world.witness, led.ledger_id)
        head = led.head()
        witness.write(head.seq, head.hash)
        led.witness, led._witness.witnessed = witness, True
        led._log.on_commit = lambda h: witness.write(h.seq, h.hash)
        append(led, 3)
    with pytest.raises(WitnessMissing, match="records no witness location"):
        Ledger.open(world.path, readonly=True)
    with Ledger.open(world.path, readonly=True, witness=world.witness) as led:
        assert led.verify().ok
    with Ledger.open(world.path, witness=world.witness) as led:
        recorded = list(led.read(kind="witness-anchored"))
        assert [r.event.previous_state for r in recorded] == ["ok"]  # type: ignore[union-attr]
    with Ledger.open(world.path) as led:
        append(led, 1, "later")
        assert led.verify().ok


#: The tests that take `ledger_at` (here through `setup`) run on SQLite and on PostgreSQL
#: (tests/conftest.py); the others on SQLite.
BOTH_STORES = True

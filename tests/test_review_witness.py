"""Issue 11, items 8 and 9: a witness that fails closed, and a recorded way back.

Item 8: a witnessed ledger records where its witness is (a chained `witness-anchored`
event), so every opener — read-only, read-write, `verify` — uses it; a missing, empty,
zero-filled or unreadable witness fails closed (verify: a finding, exit 1) instead of
starting a fresh witness from a rolled-back head. Witness paths are absolute.

Item 9: a command without --witness keeps the recorded witness, so no supported path
leaves a healthy ledger unusable; `steptrail witness anchor` is the operator's way
back (verified, recorded); the shipped GC units work on a witnessed ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CliOut, FakeClock, damage_witness, run_cli, tamper

from ledger import InvalidInput, Ledger, LedgerError, PathForbidden, Planned, WitnessAnchored
from ledger.blobs import digest_of
from ledger.workspace.protocol import StepPlan, Write
from ledger.witness import (
    AnchorRefused,
    Witness,
    WitnessElsewhere,
    WitnessMismatch,
    WitnessMissing,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


def append(ledger: Ledger, n: int, prefix: str = "s") -> None:
    for i in range(n):
        ledger.append(Planned(step=f"{prefix}{i}", attempt=1))


def copy_ledger(src: Path, dst: Path) -> None:
    """The ledger file as it is on disk right now, its -wal included (or absent)."""
    shutil.copy(src, dst)
    for suffix in ("-wal",):
        if Path(f"{src}{suffix}").exists():
            shutil.copy(f"{src}{suffix}", f"{dst}{suffix}")
        elif Path(f"{dst}{suffix}").exists():
            os.unlink(f"{dst}{suffix}")


def rolled_back(world: World) -> None:
    """Witness a ledger, keep a genuine older copy, write on, then put the copy back."""
    old = world.tmp / "old.db"
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
        copy_ledger(world.path, old)
        append(led, 2, "newer")
    copy_ledger(old, world.path)


# --- item 8: a missing, blank or relative witness fails closed ----------------------


@pytest.mark.parametrize("how", ["deleted", "empty", "zeros", "unreadable"])
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
        led._append_anchor(WitnessAnchored(witness=str(world.witness), head_seq=1,
                                           head_hash=led.head().hash.hex(),
                                           previous="/somewhere/else"))
        report = led.verify()
    messages = [f.message for f in report.findings if f.check == "witness"]
    assert any("not the event before it" in m for m in messages), messages
    assert any("/somewhere/else" in m for m in messages), messages


# --- item 9: no lockout; an explicit, verified, recorded way back --------------------


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


def test_anchor_refuses_a_damaged_ledger_unless_forced_and_records_the_override(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    with Ledger.init(world.path, witness=world.witness) as led:
        append(led, 3)
    world.witness.unlink()
    tamper(world.path, [("UPDATE events SET time_ns = time_ns + 1 WHERE seq = 2", ())])
    before = world.tree()
    with pytest.raises(AnchorRefused, match="--force"):
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


def test_anchor_refuses_a_rolled_back_ledger_unless_forced(tmp_path: Path) -> None:
    """The witness is intact and says history was lost: re-anchoring accepts the loss,
    so it takes --force, and the event records what the witness said."""
    world = World(tmp_path)
    rolled_back(world)
    with pytest.raises(WitnessMismatch, match="--force"):
        Ledger.open(world.path)
    before = world.tree()
    r = world.cli("witness", "anchor")
    assert r.code == 1 and "its witness recorded" in r.err, r
    assert world.tree() == before
    r = world.cli("witness", "anchor", "--force", "--json")
    assert r.code == 0 and r.json["previous_state"] == "mismatch", r
    with Ledger.open(world.path) as led:
        assert led.verify().ok


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
        led.witness, led.witnessed = witness, True
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


# --- item 9: the shipped GC units on a witnessed ledger ------------------------------

#: Where the units keep the witness (their comments say so), and the ledger they name.
UNIT_WITNESS_DIR = "/var/lib/steptrail-witness"
UNIT_LEDGER_DIR = "/srv/agent/.steptrail"


def unit_settings(text: str) -> dict[str, list[str]]:
    """A systemd unit's settings (every value of a repeated key), comments skipped."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def witnessed_ledger_with_an_orphan(root: Path) -> tuple[Path, Path]:
    """The units' ledger and witness, relocated under `root`; an orphan blob from 2023
    (past gc's 24 h grace) so that gc commits — and has to write the witness."""
    path = root / UNIT_LEDGER_DIR.lstrip("/") / "ledger.db"
    witness = root / UNIT_WITNESS_DIR.lstrip("/") / "agent.witness"
    witness.parent.mkdir(parents=True)
    with Ledger.init(path, clock=FakeClock(), witness=witness) as led:
        row = led.plan("orph", artifacts=["o.txt"])
        led.store("orph", row.attempt, "o.txt", b"an orphan")
        led.workspaces.compensate("orph", reason="tests failed")
    return path, witness


def relocate(text: str, root: Path) -> str:
    for prefix in ("/srv/agent", UNIT_WITNESS_DIR):
        text = text.replace(prefix, str(root) + prefix)
    return text


def check_gc_ran_witnessed(path: Path, witness: Path, summary: str) -> None:
    assert json.loads(summary.strip().splitlines()[-1])["collected"] == 1, summary
    with Ledger.open(path, readonly=True, witness=witness) as led:
        assert led.witness_lag == 0 and led.verify().ok
        assert [r.kind for r in led.read()][-1] == "blob-collected"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    shim = tmp / "bin"
    shim.mkdir(exist_ok=True)
    exe = shim / "steptrail"  # the units call 'steptrail'; this one runs the tree's
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ledger \"$@\"\n")
    exe.chmod(0o755)
    env["PATH"] = f"{shim}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_systemd_unit_may_write_the_witness_and_its_command_runs_witnessed(
        tmp_path: Path) -> None:
    service = unit_settings((ROOT / "tools" / "steptrail-gc.service").read_text())
    writable = [p.lstrip("-") for v in service["ReadWritePaths"] for p in v.split()]
    mounts = [p for v in service["RequiresMountsFor"] for p in v.split()]
    assert UNIT_LEDGER_DIR in writable and UNIT_WITNESS_DIR in writable
    assert UNIT_WITNESS_DIR in mounts
    assert service["ProtectSystem"] == ["strict"]  # so ReadWritePaths is all it may write
    (exec_start,) = service["ExecStart"]
    path, witness = witnessed_ledger_with_an_orphan(tmp_path)
    argv = shlex.split(relocate(exec_start, tmp_path))
    assert argv[0] == "/usr/local/bin/steptrail"
    argv[0] = "steptrail"
    done = subprocess.run(argv, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    check_gc_ran_witnessed(path, witness, done.stdout)


def test_the_cron_line_runs_gc_witnessed(tmp_path: Path) -> None:
    text = (ROOT / "tools" / "steptrail-gc.cron").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("#", "SHELL",
                                                                                  "PATH"))]
    fields = line.split()
    user, command = fields[5], " ".join(fields[6:])
    assert user == "agent"
    path, witness = witnessed_ledger_with_an_orphan(tmp_path)
    done = subprocess.run(["/bin/sh", "-c", relocate(command, tmp_path)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    log = (path.parent / "gc.log").read_text()
    check_gc_ran_witnessed(path, witness, log)

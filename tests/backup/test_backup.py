"""Issue 18: `steptrail backup` — an online, consistent, incremental, verified copy of
a whole ledger, and a whole ledger restored from it on a fresh machine.

- the seed scenario: a ledger with committed workspace steps and file artifacts is
  backed up, then everything else is deleted (ledger directory, workspace); the ledger
  restored from the backup onto fresh directories, `restore --workspace` gives back the
  committed tree, and verify is ok;
- incremental: a second backup of an unchanged ledger copies nothing; after more steps
  only the new blobs are copied; the older database file is replaced;
- completion: no marker, no backup (an interrupted one is refused as incomplete); a
  failed check leaves no marker;
- a witnessed ledger: the restore refuses without a new witness, and with one anchors
  it at the backup's head and records what it replaced;
- bad destinations and hostile backups: typed refusals, nothing written;
- the command line: `backup`, `backup verify`, `backup restore`, --json, one-line errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import run_cli

from ledger import BackupIncomplete, BackupInvalid, InvalidInput, Ledger, WitnessMissing
from ledger.backup import MARKER, backup, check_backup, read_backup, restore_backup
from ledger.cli import cli
from ledger.step.values import StepPlan, Write
from ledger.runner import run_step

BIG = 100 * 1024  # above the inline threshold: a blob file


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): h(p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def content(i: int, size: int) -> bytes:
    return (f"{i}:".encode() * (size // 3 + 1))[:size]


class World:
    """A ledger with workspace `w` and committed steps writing files (small and large)
    and storing artifacts (small and large)."""

    def __init__(self, tmp: Path, *, witness: str | None = None) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.path = tmp / "src" / "ledger.db"
        self.ledger = Ledger.init(self.path, witness=witness)
        self.ledger.workspaces.add("w", str(self.ws))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        self.steps = 0

    def step(self, writes: dict[str, bytes], artifact: bytes | None = None) -> str:
        self.steps += 1
        sid = f"s{self.steps}"
        led = self.ledger
        plan = [Write(p, data, led.workspaces.snapshot("w", p)[1]) for p, data in writes.items()]
        assert led.workspaces.admit("w", self.epoch, [StepPlan(sid, plan)]) == [None]
        result = led.workspaces.apply(sid, epoch=self.epoch)
        assert result.verdict == "applied"
        if artifact is not None:
            led.store(sid, result.attempt, f"out/{sid}.bin", artifact)
        led.publish(sid, result.attempt)
        led.ack(sid, result.attempt)
        return sid

    def populate(self, n: int = 4) -> None:
        for i in range(n):
            self.step({f"f{i}.txt": content(i, 40), f"big{i}.bin": content(i, BIG)},
                      artifact=content(100 + i, BIG + i) if i % 2 else b"small artifact")

    def close(self) -> None:
        self.ledger.close()


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.populate()
    yield w
    w.close()


def file_blobs(root: Path) -> set[str]:
    return {p.name for p in (root / "blobs").glob("??/*") if p.is_file()}


# -- the seed scenario ------------------------------------------------------------------


def test_seed_scenario_nothing_survives_but_the_backup(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.populate()
    committed = tree(w.ws)
    head = w.ledger.head()
    w.close()
    dest = tmp_path / "backup"
    report = backup(w.path, dest)
    assert report.verified and not report.unchanged and report.head_seq == head.seq
    assert report.blobs_copied == report.blobs > 0
    # everything but the backup is gone
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(w.ws)
    fresh = tmp_path / "fresh"
    restored = restore_backup(dest, fresh / "ledger")
    assert restored.head_seq == head.seq and restored.workspaces == ["w"]
    assert restored.path == str(fresh / "ledger" / "ledger.db")
    with Ledger.open(restored.path) as led:
        assert led.head() == head
        assert led.verify().ok
        led.workspaces.restore("w", fresh / "ws", force=True)
        assert led.verify().ok
    assert tree(fresh / "ws") == committed
    assert len(committed) == 8


def test_the_cli_round_trip(tmp_path: Path, world: World) -> None:
    committed = tree(world.ws)
    world.close()
    runner = CliRunner()
    dest = tmp_path / "b"
    got = runner.invoke(cli, ["--ledger", str(world.path), "backup", str(dest), "--json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert doc["verified"] and doc["blobs_copied"] == doc["blobs"]
    got = runner.invoke(cli, ["backup", "verify", str(dest), "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.output)["head_seq"] == doc["head_seq"]
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(world.ws)
    got = runner.invoke(cli, ["backup", "restore", str(dest), str(tmp_path / "new")])
    assert got.exit_code == 0, got.output
    assert "restore --workspace" in got.output  # the next step is named
    new = str(tmp_path / "new" / "ledger.db")
    got = runner.invoke(cli, ["--ledger", new, "restore", "--workspace", "w",
                              "--to", str(tmp_path / "ws2"), "--force"])
    assert got.exit_code == 0, got.output
    assert tree(tmp_path / "ws2") == committed
    assert runner.invoke(cli, ["--ledger", new, "verify"]).exit_code == 0


# -- incremental ------------------------------------------------------------------------


def test_a_second_backup_of_an_unchanged_ledger_copies_nothing(tmp_path: Path,
                                                                world: World) -> None:
    dest = tmp_path / "b"
    first = backup(world.path, dest)
    second = backup(world.path, dest)
    assert second.unchanged and second.blobs_copied == 0 and second.bytes_copied == 0
    assert second.db == first.db
    deep = backup(world.path, dest, deep=True)
    assert deep.unchanged and deep.blobs_copied == 0


def test_after_more_steps_only_new_blobs_are_copied(tmp_path: Path, world: World) -> None:
    dest = tmp_path / "b"
    first = backup(world.path, dest)
    world.step({"late.bin": content(77, BIG)})
    second = backup(world.path, dest)
    assert not second.unchanged and second.head_seq > first.head_seq
    assert second.blobs_copied == 1 and second.blobs_skipped == first.blobs
    dbs = sorted(p.name for p in dest.glob("ledger-*.db"))
    assert dbs == [second.db]  # the older snapshot is no longer part of the backup
    check_backup(dest)


def test_a_backup_is_taken_while_a_writer_holds_a_transaction(tmp_path: Path,
                                                              world: World) -> None:
    other = Ledger.open(world.path)
    try:
        with other.storage.transaction() as tx:  # the write lock, held
            tx.set_meta("busy", "1")
            report = backup(world.path, tmp_path / "b")  # a reader: not blocked
        assert report.head_seq == world.ledger.head().seq
    finally:
        other.close()


# -- completion -------------------------------------------------------------------------


def test_an_interrupted_backup_is_incomplete(tmp_path: Path, world: World) -> None:
    dest = tmp_path / "b"
    backup(world.path, dest)
    (dest / MARKER).unlink()  # as if killed before the marker
    with pytest.raises(BackupIncomplete, match="take it again"):
        read_backup(dest)
    with pytest.raises(BackupIncomplete):
        restore_backup(dest, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    again = backup(world.path, dest)  # taken again: complete
    assert not again.unchanged and again.blobs_copied == 0
    check_backup(dest)


def test_a_failed_check_leaves_no_marker(tmp_path: Path, world: World,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.backup as bk

    def broken(*_a: object, **_k: object) -> None:
        raise BackupInvalid("x", "injected")

    monkeypatch.setattr(bk, "_check_copy", broken)
    with pytest.raises(BackupInvalid, match="injected"):
        backup(world.path, tmp_path / "b")
    assert not (tmp_path / "b" / MARKER).exists()
    assert list((tmp_path / "b").glob("ledger-*.db")) == []


# -- the witness -------------------------------------------------------------------------


def test_a_witnessed_ledger_restores_with_a_new_witness(tmp_path: Path) -> None:
    (tmp_path / "wv").mkdir()
    w = World(tmp_path, witness=str(tmp_path / "wv" / "ledger.witness"))
    w.populate(2)
    head = w.ledger.head()
    w.close()
    dest = tmp_path / "b"
    backup(w.path, dest)
    assert read_backup(dest).witnessed
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(tmp_path / "wv")  # the fresh machine has no witness either
    with pytest.raises(InvalidInput, match="--witness"):
        restore_backup(dest, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    (tmp_path / "wv2").mkdir()
    new = str(tmp_path / "wv2" / "new.witness")
    got = restore_backup(dest, tmp_path / "r", witness=new)
    assert got.witness == new and got.anchored_seq == head.seq + 1
    with Ledger.open(got.path) as led:
        assert led.witness_status().state == "ok"
        assert led.verify().ok


def test_a_restore_killed_before_its_witness_says_how_to_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore died after renaming the ledger into place, before anchoring its new
    witness: running it again is refused with the command that finishes it (nothing
    written), and that command gives a ledger that verifies under the new witness."""
    (tmp_path / "wv").mkdir()
    w = World(tmp_path, witness=str(tmp_path / "wv" / "ledger.witness"))
    w.populate(1)
    w.close()
    dest = tmp_path / "b"
    backup(w.path, dest)
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(tmp_path / "wv")
    (tmp_path / "wv2").mkdir()
    new = str(tmp_path / "wv2" / "new.witness")

    class Died(Exception):
        pass

    def die(*_a: object, **_k: object) -> None:
        raise Died

    monkeypatch.setattr(Ledger, "anchor_witness", die)
    with pytest.raises(Died):
        restore_backup(dest, tmp_path / "r", witness=new)
    monkeypatch.undo()
    before = sorted(p.name for p in (tmp_path / "r").iterdir())
    with pytest.raises(InvalidInput, match=r"anchor_witness\(.*NEW, force=True\)"):
        restore_backup(dest, tmp_path / "r", witness=new)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before
    target = tmp_path / "r" / read_backup(dest).source_name
    Ledger.anchor_witness(target, new, force=True)
    with Ledger.open(target) as led:
        assert led.witness_status().state == "ok" and led.verify().ok


def test_a_restore_on_the_same_machine_is_forced_over_the_newer_witness(tmp_path: Path) -> None:
    (tmp_path / "wv").mkdir()
    old_witness = str(tmp_path / "wv" / "ledger.witness")
    w = World(tmp_path, witness=old_witness)
    w.populate(1)
    dest = tmp_path / "b"
    backup(w.path, dest)
    w.step({"after.txt": b"after the backup"})  # the witness moves past the backup
    w.close()
    # a plain copy of the backup's database would be refused as rolled back
    shutil.copy(dest / read_backup(dest).db, tmp_path / "copy.db")
    with pytest.raises(WitnessMissing.__mro__[1]):  # WitnessMismatch
        Ledger.open(tmp_path / "copy.db", readonly=True)
    got = restore_backup(dest, tmp_path / "r", witness=str(tmp_path / "wv" / "restored.witness"))
    with Ledger.open(got.path) as led:
        anchor = list(led.read())[-1].event
        assert anchor.previous == old_witness and anchor.previous_state == "mismatch"
        assert anchor.forced and anchor.overridden
        assert led.verify().ok


# -- bad destinations ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside", "equal", "parent", "file", "other-files"])
def test_bad_destinations_are_refused_with_nothing_written(tmp_path: Path, world: World,
                                                           where: str) -> None:
    dest = {"inside": world.path.parent / "bk", "equal": world.path.parent,
            "parent": tmp_path, "file": tmp_path / "f", "other-files": tmp_path / "o"}[where]
    if where == "file":
        dest.write_text("x")
    if where == "other-files":
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")
    before = sorted(os.listdir(world.path.parent))
    with pytest.raises(InvalidInput):
        backup(world.path, dest)
    assert sorted(os.listdir(world.path.parent)) == before
    assert not (world.path.parent / "bk").exists()


def test_another_ledgers_backup_is_refused(tmp_path: Path, world: World) -> None:
    dest = tmp_path / "b"
    backup(world.path, dest)
    other = Ledger.init(tmp_path / "other" / "ledger.db")
    other.close()
    marker = (dest / MARKER).read_bytes()
    with pytest.raises(BackupInvalid, match="not of"):
        backup(tmp_path / "other" / "ledger.db", dest)
    assert (dest / MARKER).read_bytes() == marker


def test_gc_waits_for_a_backup(tmp_path: Path, world: World) -> None:
    from ledger import CollectorBusy
    from ledger.backup import _gc_held
    from ledger.gc import collect

    with Ledger.open(world.path, readonly=True) as reader, _gc_held(reader) as held:
        assert held
        with pytest.raises(CollectorBusy):
            collect(world.ledger, grace_s=3600)
    collect(world.ledger, grace_s=3600)  # after it: runs


def test_a_killed_copys_temporaries_are_removed(tmp_path: Path, world: World) -> None:
    dest = tmp_path / "b"
    backup(world.path, dest)
    (dest / MARKER).unlink()
    tmp = dest / "blobs" / "tmp"
    tmp.mkdir(exist_ok=True)
    (tmp / ("ab" * 32 + ".deadbeef0000.tmp")).write_bytes(b"half")
    (dest / "tmp" / "snap-0123456789ab.db").write_bytes(b"half")
    backup(world.path, dest)
    assert list(tmp.iterdir()) == [] and list((dest / "tmp").iterdir()) == []
    check_backup(dest)


# -- sealed runs: their archives are part of the whole ledger ---------------------------


def test_sealed_runs_archives_are_backed_up_and_restored(tmp_path: Path) -> None:
    """A ledger with a sealed run: the backup holds the run's archive (listed in the
    marker, verified against the snapshot's seal), a second backup copies it no more,
    and a restore on a fresh machine brings it back: the ledger and every archive
    verify there. A damaged archive in the backup is refused."""
    from ledger.seal import sealed_runs, seal_run, verify_sealed

    src = tmp_path / "src" / "ledger.db"
    with Ledger.init(src) as led:
        for i in range(3):
            run_step(led, f"r1/s{i}", {"report.txt": b"ok %d\n" % i}, run="r1")
        run_step(led, "r2/s0", {"report.txt": b"later\n"}, run="r2")
        seal_run(led, "r1")
    dest = tmp_path / "b"
    first = backup(src, dest)
    assert first.archives == first.archives_copied == 1 and first.archives_absent == []
    (name, _size, _sha), = read_backup(dest).archives
    with Ledger.open(src) as led:
        run_step(led, "r2/s1", {"report.txt": b"more\n"}, run="r2")
    second = backup(src, dest)
    assert second.archives == 1 and second.archives_copied == 0
    shutil.rmtree(tmp_path / "src")  # nothing survives but the backup
    got = restore_backup(dest, tmp_path / "r")
    with Ledger.open(got.path) as led:
        assert [s.run for s in sealed_runs(led)] == ["r1"] and sealed_runs(led)[0].present
        report = verify_sealed(led)
        assert report.ok, report.findings
    archive = dest / "archive" / name
    os.chmod(archive, 0o600)
    data = bytearray(archive.read_bytes())
    data[-100] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(BackupInvalid, match="archive"):
        check_backup(dest)
    with pytest.raises(BackupInvalid, match="archive"):
        restore_backup(dest, tmp_path / "r2")
    assert not (tmp_path / "r2").exists()


def test_an_archive_moved_away_by_hand_refuses_the_backup_naming_it(tmp_path: Path) -> None:
    """A backup of a sealed ledger holds every archive its seals name, or is not taken:
    one missing is ArchiveMissing (exit 2) naming it, nothing written; put back, the
    backup is taken (issue 26 item 4: nothing may lose an archive)."""
    from ledger.seal import default_archive_dir, seal_run

    src = tmp_path / "src" / "ledger.db"
    with Ledger.init(src) as led:
        run_step(led, "r1/s0", {"report.txt": b"ok\n"}, run="r1")
        report = seal_run(led, "r1")
        directory = default_archive_dir(led)
    name = os.path.basename(report.archive)
    os.rename(directory, tmp_path / "away")
    with pytest.raises(InvalidInput, match=name) as caught:
        backup(src, tmp_path / "b")
    assert type(caught.value).__name__ == "ArchiveMissing" and caught.value.names == [name]
    assert not (tmp_path / "b").exists()
    got = run_cli(["--ledger", str(src), "backup", str(tmp_path / "b")])
    assert got.code == 2 and name in got.err and not (tmp_path / "b").exists()
    os.rename(tmp_path / "away", directory)
    assert backup(src, tmp_path / "b").archives == 1
    check_backup(tmp_path / "b")


@pytest.mark.parametrize("sub", ["archive", "blobs", "tmp"])
def test_a_symlinked_directory_in_dest_is_refused_before_any_write(
        tmp_path: Path, world: World, sub: str) -> None:
    """DEST/archive, DEST/blobs or DEST/tmp a symlink to elsewhere: a backup would
    write outside DEST. Refused before anything is written, there or anywhere."""
    world.populate(1)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "b"
    dest.mkdir()
    (dest / sub).symlink_to(outside)
    with pytest.raises(InvalidInput, match=f"its {sub}/ is a symlink"):
        backup(world.path, dest)
    assert list(outside.iterdir()) == [] and sorted(p.name for p in dest.iterdir()) == [sub]


@pytest.mark.parametrize("how", ["archive-symlink", "blobs-symlink", "archive-foreign"])
def test_a_restore_target_with_others_directories_is_refused(
        tmp_path: Path, world: World, how: str) -> None:
    """A restore target whose archive/ or blobs/ is a symlink (writes would land
    outside it) or whose archive/ holds files that are not this backup's is not an
    empty target: refused, nothing written."""
    world.populate(1)
    world.close()
    dest = tmp_path / "b"
    backup(world.path, dest)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    target = tmp_path / "r"
    target.mkdir()
    if how == "archive-foreign":
        (target / "archive").mkdir()
        (target / "archive" / "precious.txt").write_text("keep")
    else:
        (target / how.split("-")[0]).symlink_to(outside)
    before = sorted(str(p) for p in tmp_path.rglob("*") if "b" != p.parts[-1])
    with pytest.raises(InvalidInput):
        restore_backup(dest, target)
    assert sorted(str(p) for p in tmp_path.rglob("*") if "b" != p.parts[-1]) == before
    assert [p.name for p in outside.iterdir()] == ["precious.txt"]


def test_a_marker_listing_many_archives_reads_back(tmp_path: Path, world: World) -> None:
    """The writer never writes a marker the reader refuses: found by bench_growth, whose
    900 sealed runs made a 100 KiB marker that the 64 KiB read limit then refused.
    Here 20,000 archive entries (files of their listed size) round-trip."""
    import msgspec

    from ledger import backup as B

    world.populate(1)
    world.close()
    dest = tmp_path / "b"
    backup(world.path, dest)
    marker = read_backup(dest)
    (dest / "archive").mkdir()
    entries = []
    for i in range(20_000):
        name = f"{'a' * 12}-{i:016x}-{i + 1}.slarchive"
        (dest / "archive" / name).write_bytes(b"")
        entries.append((name, 0, "0" * 64))
    marker = msgspec.structs.replace(marker, archives=tuple(entries), digest="")
    marker = msgspec.structs.replace(marker, digest=B._marker_digest(marker))
    raw = msgspec.json.format(B._encoder.encode(marker)) + b"\n"
    assert len(raw) > 1_000_000
    os.chmod(dest / MARKER, 0o600)
    (dest / MARKER).write_bytes(raw)
    assert len(read_backup(dest).archives) == 20_000


def test_a_backups_database_refuses_to_be_written_and_reads_fine(tmp_path: Path) -> None:
    """`--ledger DEST/ledger-…db` of a backup: every command that writes is refused (exit
    2, one line naming `backup restore`) and DEST stays byte for byte (no event, no lock
    file); read-only commands work on it; the next backup into DEST still succeeds."""
    from conftest import run_cli

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"1\n")
    src = tmp_path / "src" / "ledger.db"
    src.parent.mkdir()
    with Ledger.init(src) as led:
        led.workspaces.add("w", str(ws))
        run_step(led, "s1", {"log.txt": b"hello"})
    dest = tmp_path / "dest"
    assert run_cli(["--ledger", str(src), "backup", str(dest)]).code == 0
    db = str(dest / read_backup(dest).db)
    before = tree(dest)
    (tmp_path / "other").mkdir()
    for argv in (["workspace", "add", "w2", str(tmp_path / "other")],
                 ["--workspace", "w", "lease", "acquire", "--holder", "h", "--force"],
                 ["restore", "--workspace", "w", "--to", str(tmp_path / "r"), "--force"],
                 ["gc", "--force"], ["init"]):
        got = run_cli(["--ledger", db, *argv])
        assert got.code == 2 and "backup restore" in got.err, (argv, got)
        assert tree(dest) == before, argv
    for argv in (["verify"], ["events"], ["stats"]):
        got = run_cli(["--ledger", db, *argv])
        assert got.code == 0, (argv, got)
    assert tree(dest) == before
    assert run_cli(["--ledger", str(src), "backup", str(dest)]).code == 0

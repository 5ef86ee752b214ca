"""Sealed runs (docs/design.md "Sealed runs"): sealing removes a settled run's rows and
keeps the chain verifiable across the gap, from the ledger alone and with the archive;
projections and journal keys agree before and after; nothing live is archived; only a
committed seal's rows can be deleted; hostile archives are refused."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
from pathlib import Path

import apsw
import pytest

from ledger import Ledger
from ledger.errors import ArchiveInvalid, InvalidInput, NotSealable, StepSealed
from ledger.events import Acked, Planned
from ledger.gc.collector import collect
from ledger.gc.audit import audit
from ledger.runner import run_step
from ledger.seal import (
    read_archive,
    read_archived_blob,
    seal_run,
    sealable,
    sealed_runs,
    vacuum,
    verify_archive,
    verify_sealed,
)


def _populate(ledger: Ledger, runs: int = 3, steps: int = 4, big: bool = True) -> None:
    """Interleaved runs: step i of every run, then step i+1 (each run's rows are gaps)."""
    for i in range(steps):
        for r in range(runs):
            outputs = {"out.txt": f"run {r} step {i}".encode(), "shared.txt": b"same bytes"}
            if big and i == 0:
                outputs["big.bin"] = bytes([r]) * (ledger.inline_max_bytes * 3)
            run_step(ledger, f"r{r}-s{i}", outputs, run=f"run{r}")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger.init(str(tmp_path / ".steptrail" / "ledger.db")) as ledger:
        yield ledger


def _rows(ledger: Ledger) -> list[tuple[int, bytes]]:
    return [(r.seq, r.hash) for r in ledger.read(0)]


def test_seal_removes_the_run_and_verify_checks_the_chain_across_its_gaps(ledger: Ledger) -> None:
    _populate(ledger)
    before = _rows(ledger)
    run1 = [r for r in ledger.read(0) if getattr(r.event, "run", "") == "run1"]
    report = seal_run(ledger, "run1")
    assert report.events == len(run1) and report.gaps == 4 and report.steps == 4
    assert report.seal_seq == before[-1][0] + 1
    after = _rows(ledger)
    assert {s for s, _ in before} - {s for s, _ in after} == {r.seq for r in run1}
    assert ledger.verify().ok, ledger.verify().findings
    # the archive holds exactly the removed rows, verbatim
    archived = list(read_archive(report.archive))
    assert [(r.seq, r.hash) for r in archived] == [(r.seq, r.hash) for r in run1]
    full = verify_sealed(ledger)
    assert full.ok and len(full.archives) == 1 and full.archives[0].seal_seq == report.seal_seq


def test_adjacent_and_interleaved_seals_tile_the_hole(ledger: Ledger) -> None:
    _populate(ledger, runs=3, big=False)
    for run in ("run0", "run2", "run1"):  # run0's and run2's gaps become adjacent to run1's
        seal_run(ledger, run)
    report = ledger.verify()
    assert report.ok, report.findings
    assert verify_sealed(ledger).ok
    assert [s.run for s in sealed_runs(ledger)] == ["run0", "run2", "run1"]


def test_rebuild_and_verify_agree_before_and_after_sealing(ledger: Ledger) -> None:
    _populate(ledger)
    seal_run(ledger, "run0")
    inline = [r.as_tuple() for r in ledger.steps()]
    manifests = ledger.storage.view.manifest_rows()
    ledger.rebuild()
    assert [r.as_tuple() for r in ledger.steps()] == inline
    assert ledger.storage.view.manifest_rows() == manifests
    assert {r[0] for r in manifests} == {f"r{r}-s{i}" for r in (1, 2) for i in range(4)}
    tomb = ledger.step("r0-s1")
    assert (tomb.state, tomb.live, tomb.run, tomb.first_seq) == ("sealed", False, "run0",
                                                                  ledger.head().seq)
    assert ledger.verify().ok


def test_a_redelivered_event_of_a_sealed_step_is_refused_not_taken_as_new(ledger: Ledger) -> None:
    _populate(ledger, big=False)
    old = [r for r in ledger.read(0) if r.step == "r1-s2"]
    seal_run(ledger, "run1")
    head = ledger.head()
    for r in old:  # every original event, redelivered: its journal key left with it
        with pytest.raises(StepSealed, match="sealed by event"):
            ledger.append(r.event)
    with pytest.raises(StepSealed):
        ledger.append(Planned(step="r1-s2", attempt=2, run="run1"))
    with pytest.raises(StepSealed):
        run_step(ledger, "r1-s2", {"x": b"again"}, run="run1")
    assert ledger.head() == head
    # a new step of the same run is new work, and can be sealed in turn
    run_step(ledger, "r1-s9", {"x": b"later"}, run="run1")
    second = seal_run(ledger, "run1")
    assert second.events == 4 and verify_sealed(ledger).ok


def test_unsettled_pinned_or_workspace_runs_are_refused_and_nothing_is_written(
        ledger: Ledger, tmp_path: Path) -> None:
    _populate(ledger, runs=1, big=False)
    ledger.append(Planned(step="open-1", attempt=1, run="run0"))
    head = ledger.head()
    with pytest.raises(NotSealable, match="'open-1' is planned"):
        seal_run(ledger, "run0")
    with pytest.raises(NotSealable, match="no events"):
        seal_run(ledger, "nobody")
    with pytest.raises(InvalidInput):
        seal_run(ledger, "")
    assert ledger.head() == head
    assert not (tmp_path / ".steptrail" / "archive").exists()
    plan = sealable(ledger)
    assert [(r.run, r.sealable) for r in plan.runs] == [("run0", False)]
    # a workspace step (under a lease) is never sealed: its revisions are folded from it
    root = tmp_path / "ws"
    root.mkdir()
    ledger.workspaces.add("w", str(root))
    lease = ledger.workspaces.acquire("w", "me")
    ledger.workspaces.plan_step("w1", workspace="w", epoch=lease.epoch, run="wsrun")
    with pytest.raises(NotSealable):
        seal_run(ledger, "wsrun")


def test_sealable_reports_what_sealing_would_remove(ledger: Ledger) -> None:
    _populate(ledger, big=False)
    plan = sealable(ledger)
    assert plan.sealable_runs == 3 and plan.events == ledger.count()
    assert all(r.sealable and r.size_bytes > 0 for r in plan.runs)
    seal_run(ledger, "run2")
    again = sealable(ledger)
    assert [(r.run, r.sealable, r.why) for r in again.runs][2] == ("run2", False,
                                                                   "it is sealed already")


def test_a_plain_delete_is_still_refused(ledger: Ledger) -> None:
    _populate(ledger, runs=2, big=False)
    report = seal_run(ledger, "run0")
    path = ledger.path
    conn = apsw.Connection(path)
    first = next(ledger.read(0)).seq  # a row of run1 (run0's are gone)
    with pytest.raises(apsw.ConstraintError, match="append-only: DELETE refused"):
        conn.execute("DELETE FROM events WHERE seq = ?", (first,))
    last = ledger.head().seq
    with pytest.raises(apsw.ConstraintError, match="append-only: DELETE refused"):
        conn.execute("DELETE FROM events WHERE run = 'run1'")
    # a range registered without a seal event naming it allows nothing either
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sealed_ranges VALUES (?, ?, 'run1', ?)", (first, last, last + 5))
    with pytest.raises(apsw.ConstraintError, match="append-only: DELETE refused"):
        conn.execute("DELETE FROM events WHERE run = 'run1'")
    conn.execute("ROLLBACK")
    # nor a seal's range for rows of another run, nor an UPDATE
    with pytest.raises(apsw.ConstraintError):
        conn.execute("DELETE FROM events WHERE seq = ?", (report.seal_seq,))
    with pytest.raises(apsw.ConstraintError, match="UPDATE refused"):
        conn.execute("UPDATE events SET time_ns = 0 WHERE seq = ?", (first,))
    conn.close()
    assert ledger.verify().ok


def test_verify_of_the_ledger_alone_sees_rows_removed_behind_a_seal(ledger: Ledger) -> None:
    _populate(ledger, runs=2, big=False)
    seal_run(ledger, "run0")
    conn = sqlite3.connect(ledger.path)
    conn.execute("DROP TRIGGER events_no_delete")
    victim = next(r.seq for r in ledger.read(0) if r.step == "r1-s1")
    conn.execute("DELETE FROM events WHERE seq = ?", (victim,))
    conn.commit()
    conn.close()
    report = ledger.verify()
    assert not report.ok
    assert {"seq", "chain"} <= {f.check for f in report.findings}


def test_gc_collects_only_what_nothing_else_holds_and_the_archive_keeps_it(
        ledger: Ledger) -> None:
    _populate(ledger, runs=2)
    big0 = bytes([0]) * (ledger.inline_max_bytes * 3)
    report = seal_run(ledger, "run0")
    seal = next(r.event for r in ledger.read(0, kind="run-sealed"))
    digests = {b.digest for b in seal.blobs}
    import hashlib
    big_digest = hashlib.sha256(big0).hexdigest()
    shared = hashlib.sha256(b"same bytes").hexdigest()
    assert {big_digest, shared} <= digests
    later = ledger.clock() + 10 * 86400 * 10**9
    before = audit(ledger, now_ns=later)
    assert before.ok and before.archived.count == len(digests)
    assert before.orphan_archived.count == 1  # the big file: only run0 named it
    gc = collect(ledger, grace_s=0, force=True, now_ns=later)
    assert gc.collected >= 1
    assert ledger.storage.blobs.stat(big_digest) is None  # only run0 named it
    assert ledger.storage.blobs.stat(shared) is not None  # run1's manifests name it too
    assert read_archived_blob(report.archive, big_digest) == big0
    after = audit(ledger, now_ns=later)
    assert after.ok and after.orphan_archived.count == 0
    assert verify_sealed(ledger).ok


def test_vacuum_shrinks_the_file(ledger: Ledger) -> None:
    _populate(ledger, runs=4, steps=20, big=False)
    for run in ("run0", "run1", "run2"):
        seal_run(ledger, run)
    collect(ledger, grace_s=0, force=True, now_ns=ledger.clock() + 10 * 86400 * 10**9)
    before, after = vacuum(ledger)
    assert after < before
    assert ledger.verify().ok


# -- hostile archives -------------------------------------------------------------------


@pytest.fixture
def sealed(ledger: Ledger) -> tuple[Ledger, str]:
    _populate(ledger, runs=2)
    return ledger, seal_run(ledger, "run0").archive


def test_a_foreign_or_damaged_archive_is_refused_with_a_typed_error(
        sealed: tuple[Ledger, str], tmp_path: Path) -> None:
    ledger, archive = sealed
    cases = tmp_path / "cases"
    cases.mkdir()
    random = cases / "random.slarchive"
    random.write_bytes(os.urandom(4096))
    empty = cases / "empty.slarchive"
    empty.write_bytes(b"")
    foreign = cases / "foreign.slarchive"
    c = sqlite3.connect(foreign)
    c.execute("CREATE TABLE t(x)")
    c.commit()
    c.close()
    ledger_file = cases / "ledger.slarchive"
    shutil.copy(ledger.path, ledger_file)
    truncated = cases / "truncated.slarchive"
    data = Path(archive).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    flipped = cases / "flipped.slarchive"
    # one field of the archived payloads (every copy: a page split leaves stale ones)
    assert b'"manifest_rev":0' in data
    flipped.write_bytes(data.replace(b'"manifest_rev":0', b'"manifest_rev":7'))
    for path in (random, empty, foreign, ledger_file, truncated, flipped, cases / "none",
                 cases):
        before = path.read_bytes() if path.is_file() else None
        with pytest.raises(ArchiveInvalid, match="."):  # each case: see its name
            verify_archive(str(path), ledger)
        with pytest.raises(ArchiveInvalid):
            list(read_archive(str(path)))
        if before is not None:
            assert path.read_bytes() == before  # only read
        assert not os.path.exists(str(path) + "-wal") and not os.path.exists(str(path) + "-shm")


def test_another_ledgers_archive_is_refused(sealed: tuple[Ledger, str], tmp_path: Path) -> None:
    _ledger, archive = sealed
    with Ledger.init(str(tmp_path / "other" / "ledger.db")) as other:
        with pytest.raises(ArchiveInvalid, match="belongs to ledger"):
            verify_archive(archive, other)


def test_a_missing_archive_or_a_stray_one_is_a_finding(sealed: tuple[Ledger, str]) -> None:
    ledger, archive = sealed
    stray = os.path.join(os.path.dirname(archive), "x" + os.path.basename(archive))
    shutil.copy(archive, stray)
    found = verify_sealed(ledger)
    assert not found.ok and any("named by no seal" in f.message for f in found.findings)
    os.unlink(stray)
    os.unlink(archive)
    found = verify_sealed(ledger)
    assert not found.ok and any("is missing" in f.message for f in found.findings)
    assert ledger.verify().ok  # the ledger alone still verifies


# -- crash at every operation -------------------------------------------------------------


class _KillAt:
    def __init__(self, k: int | None) -> None:
        self.k, self.n, self.names = k, 0, []

    def __call__(self, name: str) -> None:
        self.n += 1
        self.names.append(name)
        if self.k is not None and self.n >= self.k:
            os.kill(os.getpid(), signal.SIGKILL)


def _seal_in_child(path: str, k: int | None) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            with Ledger.open(path) as ledger:
                counter = _KillAt(k)
                ledger.storage.on_op = counter
                seal_run(ledger, "run1", on_op=counter)
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_seal_killed_before_any_operation_loses_no_run(tmp_path: Path) -> None:
    """Kill the sealing process just before operation k, for every k: the archive's
    create, commit, fsync, rename, directory fsync, the ledger's COMMIT. After each,
    the ledger verifies and holds the run whole or not at all (sealed, with an intact
    archive); sealing again finishes the job (adopting an intact stray archive)."""
    base = tmp_path / "base" / "ledger.db"
    with Ledger.init(str(base)) as ledger:
        _populate(ledger, runs=2)
        original = {r.seq: r.hash for r in ledger.read(0) if getattr(r.event, "run", "") == "run1"}
    counter = _KillAt(None)
    probe = tmp_path / "probe"
    shutil.copytree(base.parent, probe)
    with Ledger.open(str(probe / "ledger.db")) as ledger:
        ledger.storage.on_op = counter
        seal_run(ledger, "run1", on_op=counter)
    total = counter.n
    assert counter.names == ["archive-create", "archive-commit", "archive-fsync",
                             "archive-rename", "archive-dir-fsync", "commit"]
    outcomes = set()
    for k in range(1, total + 2):
        work = tmp_path / f"k{k}"
        shutil.copytree(base.parent, work)
        path = str(work / "ledger.db")
        status = _seal_in_child(path, k if k <= total else None)
        killed = os.WIFSIGNALED(status)
        assert killed == (k <= total), (k, status)
        with Ledger.open(path) as ledger:
            assert ledger.verify().ok, (k, ledger.verify().findings)
            present = {r.seq: r.hash for r in ledger.read(0) if getattr(r.event, "run", "") == "run1"}
            seals = sealed_runs(ledger)
            if present:
                assert present == original and not seals, k  # before: whole
                outcomes.add("before")
                again = seal_run(ledger, "run1")
                assert again.adopted == (k > 4), k  # a renamed archive is adopted
            else:
                outcomes.add("after")
                assert [s.run for s in seals] == ["run1"], k
            full = verify_sealed(ledger)
            assert full.ok, (k, full.findings)
            archived = {r.seq: r.hash for r in read_archive(full.archives[0].path)}
            assert archived == original, k
            assert not [n for n in os.listdir(work / "archive") if ".tmp-" in n], k
    assert outcomes == {"before", "after"}


# -- the command line ---------------------------------------------------------------------


def test_the_cli_seals_lists_verifies_and_shows(ledger: Ledger) -> None:
    import json

    from click.testing import CliRunner

    from ledger.cli import cli

    _populate(ledger, runs=2, big=False)
    path = ledger.path
    ledger.close()
    run = CliRunner().invoke
    r = run(cli, ["--ledger", path, "seal", "plan", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["sealable_runs"] == 2
    r = run(cli, ["--ledger", path, "seal", "run", "run0", "--vacuum", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["sealed"][0]["run"] == "run0" and doc["vacuum"]["after_bytes"] > 0
    archive = doc["sealed"][0]["archive"]
    r = run(cli, ["--ledger", path, "seal", "run", "run0"])
    assert r.exit_code == 1 and "NotSealable" in r.output
    r = run(cli, ["--ledger", path, "seal", "list", "--json"])
    assert [s["run"] for s in json.loads(r.output)] == ["run0"]
    r = run(cli, ["--ledger", path, "seal", "verify", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True
    r = run(cli, ["--ledger", path, "seal", "show", archive, "--json"])
    assert r.exit_code == 0 and all(e["event"]["run"] == "run0" for e in json.loads(r.output))
    r = run(cli, ["--ledger", path, "seal", "show", path])
    assert r.exit_code == 2 and "ArchiveInvalid" in r.output
    r = run(cli, ["--ledger", path, "seal", "run", ""])
    assert r.exit_code == 2
    r = run(cli, ["--ledger", path, "verify"])
    assert r.exit_code == 0, r.output
    with Ledger.open(path) as again:
        assert again.append(Acked(step="r1-s0", attempt=1, run="run1")).deduped
        with pytest.raises(StepSealed):
            again.append(Acked(step="r0-s0", attempt=1, run="run0"))


def test_a_witnessed_ledger_seals_and_reopens(tmp_path: Path) -> None:
    path = str(tmp_path / ".steptrail" / "ledger.db")
    witness = str(tmp_path / "elsewhere" / "ledger.witness")
    os.makedirs(os.path.dirname(witness))
    with Ledger.init(path, witness=witness) as ledger:
        _populate(ledger, runs=2, big=False)
        seal_run(ledger, "run1")
        head = ledger.head()
    with Ledger.open(path) as again:  # the recorded witness is checked at open
        assert again.head() == head
        report = again.verify()
        assert report.ok, report.findings
        assert verify_sealed(again).ok


# -- the outside review's attacks (each failed before its fix) ----------------------------


def _rewrite(src: str, dst: str, blobs_of: object) -> None:
    """Write `dst` as a self-consistent archive with `src`'s header and rows and the
    blobs `blobs_of(original_blobs)` returns (bytes that hash to their names)."""
    from ledger.store.sqlite.archive import ArchiveFile, write_archive

    with ArchiveFile(src) as a:
        header, rows = dict(a.header), list(a.rows())
        blobs = [(d, bytes(x)) for d, _s, x in a.blobs()]
    if os.path.exists(dst):
        os.unlink(dst)
    write_archive(dst, header, rows, blobs_of(blobs))  # type: ignore[operator]


def _evil(blobs: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    import hashlib
    return [(hashlib.sha256(b"EVIL%d" % i).hexdigest(), b"EVIL%d" % i) for i in range(len(blobs))]


def test_an_archive_copied_over_another_seals_is_a_finding(ledger: Ledger) -> None:
    """One seal's archive copied over another's (or two swapped) hashes and chains
    perfectly: verify must still see that the file at seal A's name is not A's."""
    _populate(ledger, runs=2, steps=2, big=False)
    a, b = seal_run(ledger, "run0"), seal_run(ledger, "run1")
    assert verify_sealed(ledger).ok
    os.chmod(a.archive, 0o600)
    shutil.copy(b.archive, a.archive)
    report = verify_sealed(ledger)
    assert not report.ok
    assert any("replaced by hand" in f.message for f in report.findings), report.findings


def test_an_archive_whose_blobs_were_swapped_is_a_finding(ledger: Ledger) -> None:
    """Same header and rows, other (self-consistent) blobs: the seal's blob list
    disagrees, and verify says so."""
    _populate(ledger, runs=1, steps=2, big=False)
    rep = seal_run(ledger, "run0")
    _rewrite(rep.archive, rep.archive, _evil)
    report = verify_sealed(ledger)
    assert not report.ok and any("blobs" in f.message for f in report.findings), report.findings


def test_a_planted_archive_with_other_blobs_is_not_adopted(ledger: Ledger) -> None:
    """An archive planted before the seal with the right rows but other blobs: adopting
    it would delete the only copy of the run's inline blobs. It is replaced instead."""
    from ledger import seal as S
    from ledger.store.sqlite.archive import write_archive

    _populate(ledger, runs=1, steps=2, big=False)
    with ledger.storage.read() as view:
        plan = S._plan(ledger, view, "run0")
    directory = S.default_archive_dir(ledger)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, plan.name)
    real = [(b.digest, ledger.storage.blobs.read(b.digest, size=b.size)) for b in plan.blobs]
    write_archive(path, S._header(ledger, plan), plan.rows, _evil(real))
    rep = seal_run(ledger, "run0")
    assert not rep.adopted
    assert verify_sealed(ledger).ok
    for digest, data in real:
        assert read_archived_blob(rep.archive, digest) == data


def test_a_seal_refused_by_a_concurrent_change_leaves_no_archive(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run changed between the archive's write and the seal's transaction: the seal
    is refused, and the archive it wrote for rows it never sealed is removed (verify
    stays clean)."""
    from ledger import seal as S

    _populate(ledger, runs=1, steps=2, big=False)
    real_write = S.write_archive

    def write_then_change(*a: object, **k: object) -> None:
        real_write(*a, **k)  # type: ignore[arg-type]
        run_step(ledger, "r0-late", {"out.txt": b"late"}, run="run0")  # another writer

    monkeypatch.setattr(S, "write_archive", write_then_change)
    with pytest.raises(NotSealable, match="changed"):
        seal_run(ledger, "run0")
    assert os.listdir(S.default_archive_dir(ledger)) == []
    assert verify_sealed(ledger).ok


def test_an_archive_dir_that_cannot_be_made_is_a_typed_error(ledger: Ledger) -> None:
    _populate(ledger, runs=1, steps=1, big=False)
    with pytest.raises(InvalidInput, match="archive directory"):
        seal_run(ledger, "run0", archive_dir=str(Path(ledger.path).parent / ("d/" * 3000)))


def test_a_forged_seal_range_makes_no_unsealed_event_deletable(ledger: Ledger) -> None:
    """A row forged into `sealed_ranges` (no trigger guards the table) naming an unsealed
    event of run1 and the genuine seal of run0 — or run1 itself as the seal's run — lets
    no DELETE through: the exception holds only for a range and run the seal event
    records. And verify names a range no seal records (a forged row left behind)."""
    _populate(ledger, runs=2, big=False)
    report = seal_run(ledger, "run0")
    victim = next(r.seq for r in ledger.read(0) if r.event.run == "run1")
    conn = apsw.Connection(ledger.path)
    for run in ("run1", "run0"):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO sealed_ranges VALUES (?, ?, ?, ?)",
                     (victim, victim, run, report.seal_seq))
        with pytest.raises(apsw.ConstraintError, match="append-only: DELETE refused"):
            conn.execute("DELETE FROM events WHERE seq = ?", (victim,))
        conn.execute("ROLLBACK")
    conn.execute("INSERT INTO sealed_ranges VALUES (?, ?, 'run1', ?)",
                 (victim, victim, report.seal_seq))
    conn.close()
    found = ledger.verify()
    assert not found.ok
    assert any(f.check == "seal" and "sealed_ranges" in f.message for f in found.findings), \
        found.findings


# -- a sealed ledger copied: its archives come along (issue 26 item 4) -----------------


def test_a_sealed_file_ledger_copies_with_every_archive_verified(ledger: Ledger,
                                                                 tmp_path: Path) -> None:
    """`copy` of a sealed SQLite ledger to a file in another directory carries each
    archive into archive/ beside the copy (hashed, verified against its seal); the copy
    verifies with its archives. Into the source's own directory (the two would share
    one archive directory) it is refused, nothing written."""
    from conftest import run_cli

    from ledger.copying import copy_ledger
    from ledger.seal import default_archive_dir

    _populate(ledger, big=True)
    seal_run(ledger, "run0")
    seal_run(ledger, "run2")
    dest = tmp_path / "elsewhere" / "ledger.db"
    dest.parent.mkdir()
    copy_ledger(ledger.path, str(dest))
    assert sorted(os.listdir(dest.parent / "archive")) == sorted(
        os.listdir(default_archive_dir(ledger)))
    with Ledger.open(str(dest), readonly=True) as copy:
        assert [s.present for s in sealed_runs(copy)] == [True, True]
        full = verify_sealed(copy)
        assert full.ok and len(full.archives) == 2, full.findings
    beside = Path(ledger.path).parent / "copy.db"
    got = run_cli(["copy", ledger.path, str(beside)])
    assert got.code == 2 and "archive directory" in got.err, got.err
    assert not beside.exists()
    got = run_cli(["copy", ledger.path, str(tmp_path / "x.db"), "--archive-dir", "/abs"])
    assert got.code == 2 and "--archive-dir" in got.err and not (tmp_path / "x.db").exists()


def test_a_copy_of_a_sealed_ledger_missing_an_archive_is_refused_naming_it(
        ledger: Ledger, tmp_path: Path) -> None:
    from conftest import run_cli

    from ledger.seal import default_archive_dir

    _populate(ledger, big=False)
    name = os.path.basename(seal_run(ledger, "run1").archive)
    os.unlink(os.path.join(default_archive_dir(ledger), name))
    dest = tmp_path / "elsewhere" / "ledger.db"
    dest.parent.mkdir()
    got = run_cli(["copy", ledger.path, str(dest)])
    assert got.code == 2 and name in got.err and "ArchiveMissing" in got.err, got.err
    assert os.listdir(dest.parent) == []

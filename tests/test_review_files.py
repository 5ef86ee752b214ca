"""Issue 11, "Files, modes, secrets": what an outside review found in the workspace files.

- 12: modes survive apply, compensate and restore (an edited file keeps its bits, a
  created one follows the umask; the bits are recorded in the events);
- 14: a SIGKILLed apply's staged temporaries are removed by the next apply, settle or
  gc — and nothing else is;
- 15: a legal 255-byte multibyte name applies; a name the file system cannot hold is
  refused at admit (exit 2), not "environment failure" forever;
- 17: a directory swapped for a symlink during staging is a typed refusal; a killed
  restore does not make its retry refuse the target as "not empty".

The kills are real: a forked child is SIGKILLed at an exact file operation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import CliOut, FakeClock, run_cli

import ledger.workspace.directory
from ledger import Ledger
from ledger.errors import InvalidInput, PathEscapes
from ledger.workspace.protocol import StepPlan, Write
from ledger.gc import collect


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class World:
    """A ledger and one workspace under a live lease (ttl 1h)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        self.clock = FakeClock()
        self.path = tmp / "ledger.db"
        self.ledger = Ledger.init(self.path, clock=self.clock)
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def file(self, rel: str, data: bytes, bits: int) -> None:
        p = self.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(bits)

    def admit(self, step: str, *writes: Write) -> None:
        assert self.ledger.workspaces.admit("w", self.epoch, [StepPlan(step, list(writes))]) == [None]

    def apply(self, step: str) -> str:
        return self.ledger.workspaces.apply(step, epoch=self.epoch).verdict

    def commit(self, step: str) -> None:
        self.ledger.publish(step)
        self.ledger.ack(step)

    def temporaries(self) -> list[str]:
        """What a killed stager leaves: every name steptrail's staging pattern makes
        (but the strangers a test planted)."""
        return sorted(str(p.relative_to(self.dir)) for p in self.dir.rglob(".*.steptrail-*.tmp")
                      if p.name not in STRANGERS)

    def killed(self, act: Callable[[Ledger], object], at: Callable[[str, list[str]], bool]) -> None:
        """Run `act` on a fresh ledger in a forked child, SIGKILLed before the operation
        `at(name, seen)` picks; reopen the ledger in the parent."""
        self.ledger.close()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            seen: list[str] = []

            def on_op(name: str) -> None:
                seen.append(name)
                if at(name, seen):
                    os.kill(os.getpid(), signal.SIGKILL)

            try:
                act(Ledger.open(self.path, clock=self.clock, on_op=on_op))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        self.ledger = Ledger.open(self.path, clock=self.clock)


def nth(op: str, n: int) -> Callable[[str, list[str]], bool]:
    return lambda name, seen: name == op and seen.count(op) == n


# --- 12: modes -------------------------------------------------------------------------


def test_an_edited_file_keeps_its_mode_and_a_created_one_follows_the_umask(
        tmp_path: Path) -> None:
    """The review: after apply a 0600 .env became 0644, a 0755 script 0644, and under
    umask 077 a 0644 file became 0600."""
    with umask(0o077):
        w = World(tmp_path)
        w.file("run.sh", b"#!/bin/sh\necho 1\n", 0o755)
        w.file(".env", b"TOKEN=old\n", 0o600)
        w.file("README", b"hello\n", 0o644)
        w.admit("s1", Write("run.sh", b"#!/bin/sh\necho 2\n", h(b"#!/bin/sh\necho 1\n")),
                Write(".env", b"TOKEN=new\n", h(b"TOKEN=old\n")),
                Write("README", b"hello again\n", h(b"hello\n")),
                Write("new/made.txt", b"created\n", None))
        assert w.apply("s1") == "applied"
    assert mode(w.dir / "run.sh") == 0o755 and os.access(w.dir / "run.sh", os.X_OK)
    assert mode(w.dir / ".env") == 0o600
    assert mode(w.dir / "README") == 0o644  # umask 077 does not narrow an edited file
    assert mode(w.dir / "new" / "made.txt") == 0o600  # a created file: 0666 less umask 077
    fenced = next(iter(w.ledger.read(step="s1", kind="fenced"))).event
    assert [(a.path, a.pre_mode, a.post_mode) for a in fenced.writes] == [
        ("run.sh", 0o755, 0o755), (".env", 0o600, 0o600), ("README", 0o644, 0o644),
        ("new/made.txt", None, 0o600)]
    with umask(0o022):
        w.admit("s2", Write("other.txt", b"x", None))
        assert w.apply("s2") == "applied"
    assert mode(w.dir / "other.txt") == 0o644
    assert w.ledger.verify().ok


def test_a_chmod_between_staging_and_the_rename_is_kept(tmp_path: Path) -> None:
    """Staging runs outside the lock: a person's chmod after it and before the rename is
    not undone by the rename (and the recorded modes say what happened)."""
    w = World(tmp_path)
    w.file("run.sh", b"v0", 0o644)
    w.admit("s1", Write("run.sh", b"v1", h(b"v0")))
    w.ledger.close()

    def chmod(name: str) -> None:
        if name == "ws-fsync":  # the temporary is written: staged with 0644
            (w.dir / "run.sh").chmod(0o755)

    led = Ledger.open(w.path, clock=w.clock, on_op=chmod)
    assert led.workspaces.apply("s1", epoch=w.epoch).verdict == "applied"
    assert mode(w.dir / "run.sh") == 0o755
    fenced = next(iter(led.read(step="s1", kind="fenced"))).event
    assert (fenced.writes[0].pre_mode, fenced.writes[0].post_mode) == (0o755, 0o755)


def test_compensate_puts_the_recorded_mode_of_the_pre_image_back(tmp_path: Path) -> None:
    """Not just "whatever the file has now": the mode recorded when it was applied — for
    an edited file chmodded since, and for a deleted secret brought back."""
    w = World(tmp_path)
    w.file("run.sh", b"v0", 0o755)
    w.file(".env", b"TOKEN=1", 0o600)
    w.admit("s1", Write("run.sh", b"v1", h(b"v0")), Write(".env", None, h(b"TOKEN=1")))
    assert w.apply("s1") == "applied"
    assert not (w.dir / ".env").exists()
    (w.dir / "run.sh").chmod(0o700)  # same bytes, bits changed since
    done = w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert (w.dir / "run.sh").read_bytes() == b"v0" and mode(w.dir / "run.sh") == 0o755
    assert (w.dir / ".env").read_bytes() == b"TOKEN=1" and mode(w.dir / ".env") == 0o600
    assert {(r.path, r.outcome, r.mode) for r in done.restored} == {
        ("run.sh", "restored", 0o755), (".env", "restored", 0o600)}
    assert w.ledger.verify().ok


def test_restore_writes_the_recorded_modes(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.file("bin/run.sh", b"v0", 0o755)
    w.file(".env", b"TOKEN=1", 0o600)
    w.admit("s1", Write("bin/run.sh", b"v1", h(b"v0")), Write(".env", b"TOKEN=2", h(b"TOKEN=1")),
            Write("plain.txt", b"p", None))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    with umask(0o022):
        report = w.ledger.workspaces.restore("w", tmp_path / "fresh", force=True)
    fresh = tmp_path / "fresh"
    assert report.paths == 3
    assert mode(fresh / "bin" / "run.sh") == 0o755
    assert mode(fresh / ".env") == 0o600
    assert mode(fresh / "plain.txt") == 0o644
    assert (fresh / ".env").read_bytes() == b"TOKEN=2"


# --- 14: temporaries of a killed apply ----------------------------------------------------

BIG = 64 * 1024


def _kill_mid_staging(w: World) -> None:
    """Five writes of 64 KiB; the apply is SIGKILLed before the third temporary's fsync:
    three temporaries are on disk, none renamed."""
    for i in range(5):
        w.file(f"d{i % 2}/f{i}.bin", b"old%d" % i, 0o644)
    w.admit("s1", *(Write(f"d{i % 2}/f{i}.bin", bytes([i]) * BIG, h(b"old%d" % i))
                    for i in range(5)))
    w.killed(lambda led: led.workspaces.apply("s1", epoch=w.epoch), nth("ws-fsync", 3))
    assert len(w.temporaries()) == 3
    assert w.ledger.step("s1").state == "planned"


STRANGERS = (".notes.steptrail-backup.tmp", "f.steptrail-1-abcdef01-abcdef01.tmp",
             ".dir.steptrail-1-abcdef01-abcdef01.tmp", ".ln.steptrail-1-abcdef01-abcdef01.tmp")


def _strangers(w: World) -> list[str]:
    """Names that look like steptrail's temporaries but are not its leftovers."""
    outside = w.tmp / "outside.txt"
    outside.write_text("keep")
    (w.dir / "d0" / ".notes.steptrail-backup.tmp").write_text("a user's file")
    (w.dir / "d0" / "f.steptrail-1-abcdef01-abcdef01.tmp").write_text("no leading dot")
    (w.dir / "d0" / ".dir.steptrail-1-abcdef01-abcdef01.tmp").mkdir()
    (w.dir / "d1" / ".ln.steptrail-1-abcdef01-abcdef01.tmp").symlink_to(outside)
    return list(STRANGERS)


def _strangers_kept(w: World, names: list[str]) -> None:
    for name in names:
        assert (w.dir / "d0" / name).exists() or (w.dir / "d1" / name).is_symlink()
    assert (w.tmp / "outside.txt").read_text() == "keep"


def test_the_next_apply_removes_what_a_killed_apply_staged(tmp_path: Path) -> None:
    """The review: 24 kills of 60 applies left 20 temporaries (~20 MiB) in the user's
    repository, visible in git status; a re-apply did not remove them."""
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    # a sibling step (admitted: in flight) staging under the live epoch right now: its
    # temporary is kept; one of an attempt that is over is removed
    w.admit("sibling", Write("d0/x.bin", b"x", None))
    sibling = w.dir / "d0" / ledger.workspace.directory.temp_name(
        "x.bin", w.epoch, ledger.workspace.directory.attempt_tag("sibling", 1))
    ended = w.dir / "d0" / ledger.workspace.directory.temp_name(
        "y.bin", w.epoch, ledger.workspace.directory.attempt_tag("long-done", 1))
    ended.write_bytes(b"a kill after its commit")
    sibling.write_bytes(b"live")
    assert w.apply("s1") == "applied"
    assert w.temporaries() == [str(sibling.relative_to(w.dir))]
    _strangers_kept(w, names)
    assert all((w.dir / f"d{i % 2}/f{i}.bin").read_bytes() == bytes([i]) * BIG for i in range(5))
    assert w.ledger.verify().ok


def test_the_next_epoch_settling_removes_what_a_killed_apply_staged(tmp_path: Path) -> None:
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    lease = w.ledger.workspaces.acquire("w", "agent-2", ttl_s=60, force=True)
    assert lease.settled == ("s1",)
    assert w.temporaries() == []
    _strangers_kept(w, names)
    assert (w.dir / "d0" / "f0.bin").read_bytes() == b"old0"


def test_gc_removes_what_an_abandoned_killed_apply_staged(tmp_path: Path) -> None:
    """Nobody came back to the attempt: while its lease is live gc keeps the temporaries
    (their stager may be alive); once the lease lapsed, they go."""
    w = World(tmp_path)
    _kill_mid_staging(w)
    names = _strangers(w)
    assert collect(w.ledger).ws_temp_removed == 0
    assert len(w.temporaries()) == 3
    w.clock.advance(2 * 3600)  # the lease (1h) lapsed
    assert collect(w.ledger).ws_temp_removed == 3
    assert w.temporaries() == []
    _strangers_kept(w, names)


def test_the_next_apply_removes_what_a_killed_compensation_staged(tmp_path: Path) -> None:
    """Compensation stages the pre-images it puts back: killed before a rename, the
    retry (same epoch) removes those temporaries too."""
    w = World(tmp_path)
    w.file("a.txt", b"a0", 0o644)
    w.admit("s1", Write("a.txt", b"a1", h(b"a0")))
    assert w.apply("s1") == "applied"
    w.killed(lambda led: led.workspaces.compensate("s1", epoch=w.epoch), nth("ws-rename", 1))
    assert len(w.temporaries()) == 1
    w.ledger.workspaces.compensate("s1", epoch=w.epoch)
    assert w.temporaries() == [] and (w.dir / "a.txt").read_bytes() == b"a0"


# --- 15: long multibyte names ------------------------------------------------------------


def test_a_255_byte_multibyte_name_applies(tmp_path: Path) -> None:
    """The review: 76-85 CJK characters (228-255 bytes) were admitted, then every apply
    failed with StorageFailure "File name too long" (exit 3, "retry later"), forever."""
    w = World(tmp_path)
    name = "漢" * 85
    assert len(name.encode()) == 255
    w.file(name, b"old", 0o640)
    deep = f"{'字' * 85}/{name}"  # a new 255-byte directory, a 255-byte file in it
    w.admit("s1", Write(name, b"new", h(b"old")), Write(deep, b"n", None))
    assert w.apply("s1") == "applied"
    assert (w.dir / name).read_bytes() == b"new" and mode(w.dir / name) == 0o640
    assert (w.dir / deep).read_bytes() == b"n"
    assert w.temporaries() == []


def test_a_name_the_file_system_cannot_hold_is_refused_at_admit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system with a smaller NAME_MAX (eCryptfs: 143 bytes): refused when the
    plan is admitted (exit 2, nothing recorded), never admitted to fail at every apply."""
    w = World(tmp_path)
    monkeypatch.setattr(ledger.workspace.directory, "_name_max", lambda where: 143)
    head = w.ledger.head()
    with pytest.raises(InvalidInput, match="holds at most 143") as err:
        w.ledger.workspaces.admit("w", w.epoch, [StepPlan("s1", [Write("x" * 144, b"n", None)])])
    assert err.value.exit_code == 2
    assert w.ledger.head() == head
    # up to the limit it is admitted and applied (the temporary's name fits the budget)
    w.admit("s2", Write("y" * 143, b"n", None))
    assert w.apply("s2") == "applied"


def test_long_names_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit codes a harness sees: a 255-byte name plans and applies (0); a name the
    file system cannot hold is refused by `step plan` with exit 2, one line, nothing
    recorded — not exit 3 ("retry later") at every apply."""
    (tmp_path / "ws").mkdir()

    def cli(*args: str, input: str | None = None) -> CliOut:
        return run_cli(["--ledger", str(tmp_path / "ledger.db"), "--workspace", "w", *args],
                       input=input)

    assert cli("init").code == 0
    assert cli("workspace", "add", "w", str(tmp_path / "ws")).code == 0
    assert cli("lease", "acquire", "--holder", "a", "--ttl", "10m").code == 0

    def plan(step: str, path: str) -> CliOut:
        doc = {"steps": [{"step": step, "writes": [{"path": path, "pre_hash": None,
                                                    "content": "x"}]}]}
        return cli("step", "plan", "--epoch", "1", "-", input=json.dumps(doc))

    assert plan("s1", "漢" * 85).code == 0
    assert cli("step", "apply", "s1", "--epoch", "1").code == 0
    assert (tmp_path / "ws" / ("漢" * 85)).read_text() == "x"
    monkeypatch.setattr(ledger.workspace.directory, "_name_max", lambda where: 143)
    refused = plan("s2", "y" * 144)
    assert refused.code == 2 and "holds at most 143" in refused.err, refused
    assert cli("step", "apply", "s2", "--epoch", "1").code == 2  # never planned


# --- 17: a symlink swapped in during staging; a killed restore ---------------------------


def test_a_directory_swapped_for_a_symlink_during_staging_is_a_typed_refusal(
        tmp_path: Path) -> None:
    """The review: a directory flipped to a symlink while staging created it raised an
    untyped NotADirectoryError (nothing escaped). Now PathEscapes, and still nothing is
    written outside."""
    w = World(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    w.admit("s1", Write("sub/new.txt", b"n", None))
    w.ledger.close()

    def swap(name: str) -> None:
        if name == "ws-mkdir":  # the parent was missing; before it is made, a symlink
            (w.dir / "sub").symlink_to(outside)

    led = Ledger.open(w.path, clock=w.clock, on_op=swap)
    with pytest.raises(PathEscapes, match="'sub' is a symlink"):
        led.workspaces.apply("s1", epoch=w.epoch)
    assert list(outside.iterdir()) == []
    assert led.step("s1").state == "planned"


def _committed(w: World) -> None:
    w.file("a.txt", b"a0", 0o644)
    w.admit("s1", Write("a.txt", b"a1", h(b"a0")), Write("b/b.txt", b"b1", None),
            Write("c.sh", b"c1", None))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    w.ledger.workspaces.release("w", w.epoch)


def _restored_ok(w: World, target: Path) -> None:
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "a.txt", "b", "b/b.txt", "c.sh"]  # no temporary left
    assert (target / "a.txt").read_bytes() == b"a1"
    assert (target / "b" / "b.txt").read_bytes() == b"b1"
    assert (target / "c.sh").read_bytes() == b"c1"
    assert w.ledger.workspaces.get("w").root == str(target)
    assert w.ledger.verify().ok


def test_a_killed_restore_is_resumed_by_the_retry(tmp_path: Path) -> None:
    """The review: a killed restore left a partial directory and the retry was refused
    as "not empty". Killed with b/b.txt staged and not yet renamed: the retry recognises
    its own partial output, removes the temporary and completes."""
    w = World(tmp_path)
    _committed(w)
    target = tmp_path / "fresh"
    w.killed(lambda led: led.workspaces.restore("w", target), nth("ws-rename", 2))
    assert (target / "a.txt").read_bytes() == b"a1" and not (target / "c.sh").exists()
    assert len(list(target.rglob(".*.steptrail-*.tmp"))) == 1
    report = w.ledger.workspaces.restore("w", target)
    assert report.paths == 3 and not report.deduped
    _restored_ok(w, target)


def test_a_restore_killed_before_its_event_is_recorded_by_the_retry(tmp_path: Path) -> None:
    """Killed after its last file was renamed and before the event: the retry finds the
    target holding the committed content and records it."""
    w = World(tmp_path)
    _committed(w)
    target = tmp_path / "fresh"
    w.killed(lambda led: led.workspaces.restore("w", target), nth("ws-dirfsync", 4))
    assert (target / "c.sh").read_bytes() == b"c1"
    assert w.ledger.workspaces.get("w").root == str(w.dir)  # not recorded yet
    assert w.ledger.workspaces.restore("w", target).paths == 3
    _restored_ok(w, target)


@pytest.mark.parametrize("stranger", ["extra.txt", "a.txt", "b/other", "link"])
def test_a_target_holding_anything_else_is_still_refused(tmp_path: Path, stranger: str) -> None:
    """Recognising a partial restore never writes into a directory that holds anything
    the ledger did not commit there: another file, other bytes, a symlink."""
    w = World(tmp_path)
    _committed(w)
    target = tmp_path / "other"
    (target / "b").mkdir(parents=True)
    (target / "b" / "b.txt").write_bytes(b"b1")  # committed bytes: fine on their own
    if stranger == "link":
        (target / "c.sh").symlink_to(tmp_path / "outside")
    else:
        (target / stranger).write_bytes(b"not committed here")
    with pytest.raises(InvalidInput, match="not an empty directory"):
        w.ledger.workspaces.restore("w", target)
    assert (target / "b" / "b.txt").read_bytes() == b"b1"
    assert w.ledger.workspaces.get("w").root == str(w.dir)

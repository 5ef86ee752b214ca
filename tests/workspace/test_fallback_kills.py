"""A landing without the exchange call killed between its two moves, and the call that
comes next: `placing.finish_aside` links the staged file in only when the ``y`` slot holds
what the landing expected to displace (anything, for a landing that checks nothing), and
`placing.put_aside_back` gives a refusal's file back to its name.

Each test kills a landing without the exchange call (``exchange._CALL = None``) at the
one point that check is about: the name empty, its file moved aside into the ``y``
slot, the staged file not linked in yet (or, on a refusal, the file aside not put back
yet). The kill is an exception (`Crash`, a BaseException no library code catches) raised
from the ledger's `on_op` seam at the ``ws-rename`` that would have ended that window;
the crashed ledger is abandoned and a new one finishes the work, as a new process would.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock

from ledger import Ledger, run_fenced_step
from ledger.step.values import Write
from ledger.workspace import exchange as exchange_mod
from ledger.workspace import placing

PRE, POST = b"a-pre\n", b"a-post\n"
MINE = b"the person's save\n"


def h(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


class Crash(BaseException):
    """The process dies here."""


class Killer:
    """An `on_op` that, once armed, kills the process at the first ``ws-rename`` met
    while `a.txt` is absent (its file aside in the ``y`` slot, nothing at the name)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.armed = False
        self.killed_at: str | None = None

    def __call__(self, op: str) -> None:
        if self.killed_at is not None and op.startswith("ws-"):
            raise Crash(op)  # a dead process does nothing more
        if self.armed and op == "ws-rename" and not (self.root / "a.txt").exists() \
                and any(".a.txt" in n or "a.txt." in n for n in os.listdir(self.root)):
            self.killed_at = op
            raise Crash(op)


def save(root: Path) -> None:
    """A person's save by rename (an editor's)."""
    (root / "a.txt.new").write_bytes(MINE)
    os.replace(root / "a.txt.new", root / "a.txt")


def names(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange_mod, "_CALL", None)


def _person_before_landing(monkeypatch: pytest.MonkeyPatch, root: Path, killer: Killer,
                           role: str) -> None:
    """The person saves a.txt right before the landing of `role` ("x" an apply, "u" an
    undo) begins; the killer is armed from there."""
    land = placing.land

    def landing(wsdir: Any, path: str, *a: Any, **k: Any) -> Any:
        if path == "a.txt" and k.get("role", "x") == role and not killer.armed:
            save(root)
            killer.armed = True
        return land(wsdir, path, *a, **k)

    monkeypatch.setattr(placing, "land", landing)


def _abandon(led: Ledger) -> None:
    with contextlib.suppress(BaseException):
        led.close()


# -- the undo: a refusal cut between its move aside and its put back ------------------------


@pytest.mark.parametrize("then", ["takeover", "again"])
def test_an_undo_killed_while_refusing_gives_the_persons_save_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: None, then: str) -> None:
    """The undo's landing (role "u", expecting the post-image) moves the person's save
    aside, sees it is not the post-image, and is killed before it puts it back. The
    takeover's settle finishes the undo: `finish_aside` (now) refuses to link the
    pre-image in — right, it was a refusal — but nothing else puts the save back: the
    undo sees the name absent ("conflict", digest None) and the save stays in the
    crashed undo's hidden ``y`` slot (then kept under some other name by the
    temporaries' cleanup). Before the change, the pre-image was linked in, the settle
    found it ``already`` undone and its `_found_undone` rolled the ``y`` slot back:
    a.txt held the person's save, a conflict naming it. The same with the undo called
    again under the same epoch ("again"): the ledger keeps the post-image for a.txt
    (a conflict with digest None) while a.txt is absent."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_bytes(PRE)
    db, clock = tmp_path / "ledger.db", FakeClock()
    killer = Killer(root)
    led = Ledger.init(db, clock=clock, on_op=killer)
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
    out = run_fenced_step(led, "w", "s", [Write(path="a.txt", content=POST, pre_hash=h(PRE))],
                          epoch=epoch)
    assert out.committed, out
    _person_before_landing(monkeypatch, root, killer, "u")
    with pytest.raises(Crash):
        led.workspaces.compensate("s", epoch=epoch)
    assert killer.killed_at == "ws-rename"
    assert not (root / "a.txt").exists()  # the save aside, in the undo's y slot
    _abandon(led)

    with Ledger.open(db, clock=clock) as led2:
        if then == "takeover":
            led2.workspaces.acquire("w", "second", ttl_s=3600, force=True)
        else:
            led2.workspaces.compensate("s", epoch=epoch)
        att = led2.attempt("s")
        restored = att.end[1].restored if att.end is not None else None
        on_disk = names(root)
        paths = led2.workspaces.paths("w")
    # the person saved a.txt: it is there, under its name (as before the change)
    assert on_disk.get("a.txt") == MINE, (on_disk, restored, paths)


# -- the apply, fence "none": a landing cut between its move aside and its link ---------------


def test_a_fence_none_apply_killed_between_its_moves_is_finished_on_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: None) -> None:
    """fence="none" lands over whatever the path holds (`land(check=False)`: the move
    aside accepts ANY_FILE). A person saved a.txt after the plan; the landing moved the
    save aside (``y``) and was killed before linking the post-image in. The retry's
    fence calls `finish_aside(…, "x", w.pre_hash)`: the ``y`` slot is not the planned
    pre-image, so it is no longer finished — but it was no refusal (nothing checks under
    fence none). `leftovers.landed` still calls the write landed (the name empty, ``y``
    and ``x`` there), so the fence records it `settled`: the ledger says a.txt holds
    the post-image, while a.txt is absent; `release` then removes both slots (their
    bytes are stored), so nothing of either version is left in the workspace. Before the
    change, `finish_aside` linked the post-image in: a.txt == POST, as recorded."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_bytes(PRE)
    db, clock = tmp_path / "ledger.db", FakeClock()
    killer = Killer(root)
    led = Ledger.init(db, clock=clock, on_op=killer)
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
    writes = [Write(path="a.txt", content=POST, pre_hash=h(PRE))]
    _person_before_landing(monkeypatch, root, killer, "x")
    with pytest.raises(Crash):
        run_fenced_step(led, "w", "s", writes, epoch=epoch, fence="none")
    assert not (root / "a.txt").exists()  # the save aside, the post-image not linked in
    _abandon(led)

    with Ledger.open(db, clock=clock) as led2:  # the same agent, run again (same epoch)
        out = run_fenced_step(led2, "w", "s", writes, epoch=epoch, fence="none")
        paths = led2.workspaces.paths("w")
    on_disk = names(root)
    recorded = paths["a.txt"][1]
    assert h(on_disk.get("a.txt")) == recorded, (out, on_disk, paths)


# -- holding: the apply's refusal cut between its move aside and its put back ---------------


@pytest.mark.parametrize("then", ["retry", "takeover"])
def test_an_apply_killed_while_refusing_gives_the_persons_save_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: None, then: str) -> None:
    """fence "step": the landing moved the person's save aside, saw it is not the
    pre-image and was killed before putting it back. The retry's fence (or the
    takeover's settle) does not finish it (`finish_aside`: not the pre-image) and its
    roll-back puts the save back: a.txt holds it, the ledger keeps the pre-image."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_bytes(PRE)
    db, clock = tmp_path / "ledger.db", FakeClock()
    killer = Killer(root)
    led = Ledger.init(db, clock=clock, on_op=killer)
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
    writes = [Write(path="a.txt", content=POST, pre_hash=h(PRE))]
    _person_before_landing(monkeypatch, root, killer, "x")
    with pytest.raises(Crash):
        run_fenced_step(led, "w", "s", writes, epoch=epoch)
    assert not (root / "a.txt").exists()
    _abandon(led)

    with Ledger.open(db, clock=clock) as led2:
        if then == "retry":
            out = run_fenced_step(led2, "w", "s", writes, epoch=epoch)
            assert not out.committed, out
        else:
            led2.workspaces.acquire("w", "second", ttl_s=3600, force=True)
        paths = led2.workspaces.paths("w")
        assert led2.verify().ok
    on_disk = names(root)
    assert on_disk == {"a.txt": MINE}, (on_disk, paths)
    assert paths.get("a.txt", (0, h(PRE)))[1] == h(PRE)


def test_a_mode_change_killed_between_its_moves_is_finished_on_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: None) -> None:
    """A mode-only write (the same bytes, bits 0o755): the ``y`` slot holds the
    pre-image, whose digest is also the post-image's: finished forward on retry."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_bytes(PRE)
    os.chmod(root / "a.txt", 0o644)
    db, clock = tmp_path / "ledger.db", FakeClock()
    killer = Killer(root)
    led = Ledger.init(db, clock=clock, on_op=killer)
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
    writes = [Write(path="a.txt", content=PRE, pre_hash=h(PRE), mode=0o755)]
    land = placing.land

    def landing(wsdir: Any, path: str, *a: Any, **k: Any) -> Any:
        killer.armed = True
        return land(wsdir, path, *a, **k)

    monkeypatch.setattr(placing, "land", landing)
    with pytest.raises(Crash):
        run_fenced_step(led, "w", "s", writes, epoch=epoch)
    assert not (root / "a.txt").exists()
    _abandon(led)
    with Ledger.open(db, clock=clock) as led2:
        out = run_fenced_step(led2, "w", "s", writes, epoch=epoch)
        assert out.committed, out
    assert names(root) == {"a.txt": PRE}
    assert (root / "a.txt").stat().st_mode & 0o777 == 0o755


# -- older than the change (not made worse by it), documented ---------------------------------


@pytest.mark.xfail(strict=True, reason=(
    "open, older than the finish_aside check: a fence-'none' create (pre_hash None) over a file a person"
    " made lands through the y slot (land(check=False) -> _land_exchange), but neither"
    " finish_aside (called only for pre_hash not None) nor leftovers.landed (the y slot is"
    " evidence only when pre is not None) sees that slot after a kill between the moves:"
    " the retry lands the staged file as a create and records pre_hash None, while the"
    " person's file it displaced ends under a kept name the record does not name (an"
    " undo would then delete a.txt instead of putting the person's file back)"))
def test_a_fence_none_create_over_a_persons_file_killed_between_its_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fallback: None) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    db, clock = tmp_path / "ledger.db", FakeClock()
    killer = Killer(root)
    led = Ledger.init(db, clock=clock, on_op=killer)
    led.workspaces.add("w", str(root))
    epoch = led.workspaces.acquire("w", "first", ttl_s=3600).epoch
    writes = [Write(path="a.txt", content=POST, pre_hash=None)]
    _person_before_landing(monkeypatch, root, killer, "x")
    with pytest.raises(Crash):
        run_fenced_step(led, "w", "s", writes, epoch=epoch, fence="none")
    _abandon(led)
    with Ledger.open(db, clock=clock) as led2:
        run_fenced_step(led2, "w", "s", writes, epoch=epoch, fence="none")
        att = led2.attempt("s")
    applied = att.fenced[-1][1].writes[0]
    # as without the kill: the write displaced the person's file, and says so
    assert applied.pre_hash == h(MINE), (applied, names(root))

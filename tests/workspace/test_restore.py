"""Restore (ledger/restore.py): a workspace's committed content materialized on a fresh
directory, recorded with the new root's identity.

Each path's content is committed in revision order, not publish order. The model-based
fault machine found it (issue 11 review): step ws-1 creates `lib/new.txt` and a power loss
cuts it after `fenced` (before its publish); step ws-2 changes the file (fenced at a
higher rev, published); ws-1 is retried and publishes late. `restore` then wrote ws-1's
content — the last *published* — while the workspace projection (and the directory)
held ws-2's. A path's committed content is its highest-rev committed change: the
post-image of a write whose attempt published (whenever it did), or the pre-image a
compensation put back. Here: the scenario through the library, the machine's own rule
sequence with a real simulated power loss, and a property — after random step sequences,
once nothing is in flight, restore's content is the projection's path state, and
restore writes exactly that.

Also: restore writes the recorded modes, never writes into the ledger, records the new
root's device and inode; a SIGKILLed restore is resumed by its retry (in the library and
through the command line), and a target holding anything else is still refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from conftest import FakeClock, LedgerAt, sqlite_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_model_faults import NEW_PATH, Crash, LedgerModel, replay, workspace_step_trace
from test_workdir import Embedded, mode, nth, tree, umask
from test_workdir import World as WorkdirWorld

from ledger.testing import faults as F
from ledger import InvalidInput, Ledger, WorkspaceMoved
from ledger.blobs import digest_of
from ledger.events import WorkspaceRestored
from ledger.step.values import StepPlan, Write
from ledger.workspace.restore import RestoreReport, committed_content


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Every regular file under `root` -> its hash."""
    return {str(p.relative_to(root)): h(p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def _projection(led: Ledger, ws: str) -> dict[str, str | None]:
    return {p: digest for p, (_rev, digest) in led.workspaces.paths(ws).items()}


class World:
    """A ledger on a fake clock and one workspace `w` under a live lease. The ledger is at
    `tmp`/ledger.db, or where `at` (the `ledger_at` fixture) puts it."""

    def __init__(self, tmp: Path, *, at: LedgerAt = sqlite_at) -> None:
        self.tmp = tmp
        self.dir = tmp / "ws"
        self.dir.mkdir()
        self.ledger = Ledger.init(at(tmp / "ledger.db"), clock=FakeClock())
        self.ledger.workspaces.add("w", str(self.dir))
        self.epoch = self.ledger.workspaces.acquire("w", "agent", ttl_s=3600).epoch

    def apply(self, step: str, writes: dict[str, bytes | None]) -> str:
        """Admit `step` writing `writes` against what the workspace holds now, apply it."""
        plan = [Write(p, data, self.ledger.workspaces.snapshot("w", p)[1]) for p, data in writes.items()]
        assert self.ledger.workspaces.admit("w", self.epoch, [StepPlan(step, plan)]) == [None]
        return self.ledger.workspaces.apply(step, epoch=self.epoch).verdict


def test_a_late_publish_does_not_restore_the_older_content(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """ws-1 creates lib/new.txt and stops after its apply; ws-2 changes the file and
    commits; ws-1 publishes late. Restore must write ws-2's content (rev 2), not
    ws-1's (published last). Before the fix it wrote b"one"."""
    w = World(tmp_path, at=ledger_at)
    assert w.apply("ws-1", {"lib/new.txt": b"one"}) == "applied"  # rev 1, not published
    assert w.apply("ws-2", {"lib/new.txt": b"two"}) == "applied"  # rev 2
    w.ledger.publish("ws-2")
    w.ledger.ack("ws-2")
    w.ledger.publish("ws-1")  # the retry of ws-1 finishes it: the later publish
    w.ledger.ack("ws-1")
    assert w.ledger.workspaces.paths("w") == {"lib/new.txt": (2, h(b"two"))}
    assert committed_content(w.ledger, "w") == {"lib/new.txt": h(b"two")}
    w.ledger.workspaces.release("w", w.epoch)
    w.ledger.workspaces.restore("w", tmp_path / "fresh")
    assert (tmp_path / "fresh" / "lib" / "new.txt").read_bytes() == b"two"
    assert _tree(tmp_path / "fresh") == _tree(w.dir) == _projection(w.ledger, "w")
    assert F.i9_problems(w.ledger) == []
    assert w.ledger.verify().ok


def test_compensating_the_older_step_afterwards_leaves_the_newer_content(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The older step, published late, is then compensated: its write is a conflict
    (a newer step moved the path's rev), nothing goes back, the newer content stays."""
    w = World(tmp_path, at=ledger_at)
    w.apply("ws-1", {"lib/new.txt": b"one", "a.txt": b"a1"})
    w.apply("ws-2", {"lib/new.txt": b"two"})
    w.ledger.publish("ws-2")
    w.ledger.publish("ws-1")
    c = w.ledger.workspaces.compensate("ws-1", epoch=w.epoch, reason="undo")
    assert {(r.path, r.outcome) for r in c.restored} == {
        ("lib/new.txt", "conflict"), ("a.txt", "restored")}
    assert committed_content(w.ledger, "w") == {"a.txt": None, "lib/new.txt": h(b"two")}
    assert committed_content(w.ledger, "w") == _projection(w.ledger, "w")
    w.ledger.workspaces.release("w", w.epoch)
    w.ledger.workspaces.restore("w", tmp_path / "fresh")
    assert _tree(tmp_path / "fresh") == {"lib/new.txt": h(b"two")}


def _after_fenced_commit() -> int:
    """The disk operation (1-based, into the call) just after a one-path workspace
    step's `fenced` commit is durable (the first WAL sync after its rename): a cut
    there keeps `fenced` and loses the publish."""
    trace = workspace_step_trace((NEW_PATH,), 3)
    rename = max(i for i, kind in enumerate(trace, 1) if kind == "ws-rename")
    synced = next(i for i, kind in enumerate(trace, 1) if i > rename and kind == "db-sync")
    return synced + 1


@pytest.mark.sqlite_only
def test_machine_regression_late_publish_then_restore() -> None:
    """The machine's sequence (a real simulated power loss; every invariant after each
    rule, among them: the restored directory holds what the projection says):

        state.workspace_step(paths=('lib/new.txt',), content=3,
                             crash=Crash('power', at=<after fenced>))
        state.workspace_step(paths=('lib/new.txt',), content=0, crash=None)
        state.retry(pick=0, crash=None)        # ws-1 publishes late
        state.restore_workspace(crash=None)    # wrote ws-1's content before the fix
    """
    at = _after_fenced_commit()
    seen: dict[str, object] = {}

    def inspect(state: LedgerModel) -> None:
        led = state.led
        assert led is not None
        seen["kinds"] = [(r.event.step, r.kind) for r in led.read()
                         if r.kind in ("fenced", "manifest-published")]
        root = Path(led.workspaces.get("w").root)
        seen["restored"] = (root / NEW_PATH).read_bytes()
        seen["projection"] = _projection(led, "w")
        seen["committed"] = committed_content(led, "w")

    state = replay(LedgerModel,
                   ("workspace_step", {"paths": (NEW_PATH,), "content": 3,
                                       "crash": Crash("power", at=at)}),
                   ("workspace_step", {"paths": (NEW_PATH,), "content": 0, "crash": None}),
                   ("retry", {"pick": 0, "crash": None}),
                   ("restore_workspace", {"crash": None}), inspect=inspect)
    assert "cut by" in state.history[0], state.history
    # the scenario happened: ws-1 fenced first, published after ws-2
    assert seen["kinds"] == [("ws-1", "fenced"), ("ws-2", "fenced"),
                             ("ws-2", "manifest-published"), ("ws-1", "manifest-published")]
    assert h(seen["restored"]) == seen["projection"][NEW_PATH]  # type: ignore[arg-type,index]
    assert seen["committed"] == seen["projection"]


# --- the property: restore's content is the projection's, once nothing is in flight ------

PATHS = ("a.txt", "lib/new.txt")
CONTENTS = (b"x", b"y", b"zz", None)  # None: delete (or create, when absent)

#: One action: ("step", paths, content index, then: "publish" | "hold" | "compensate"),
#: ("late", pick): publish a held step; ("undo", pick): compensate any earlier step.
ACTION = st.one_of(
    st.tuples(st.just("step"), st.sets(st.sampled_from(PATHS), min_size=1, max_size=2),
              st.integers(0, len(CONTENTS) - 1),
              st.sampled_from(("publish", "hold", "compensate"))),
    st.tuples(st.just("late"), st.integers(0, 7)),
    st.tuples(st.just("undo"), st.integers(0, 7)),
)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(actions=st.lists(ACTION, min_size=1, max_size=8), finish=st.booleans())
def test_restore_equals_the_projection_after_random_steps(
        tmp_path_factory, ledger_at: LedgerAt, actions: list[tuple], finish: bool) -> None:
    """Steps writing overlapping paths, published at once, held and published late (in
    any order), compensated (before or after newer steps wrote the same paths), the
    ones still held published last (`finish`, newest first) or left in flight and
    settled by a new epoch: afterwards committed_content equals the projection's path
    hashes, and restore writes exactly those files."""
    tmp = tmp_path_factory.mktemp("prop")
    w = World(tmp, at=ledger_at)
    led = w.ledger
    held: list[str] = []
    made: list[str] = []
    for n, action in enumerate(actions):
        if action[0] == "step":
            _, paths, k, then = action
            step = f"s{n}"
            writes: dict[str, bytes | None] = {}
            for i, p in enumerate(sorted(paths)):
                data = CONTENTS[(k + i) % len(CONTENTS)]
                if data is None and led.workspaces.snapshot("w", p)[1] is None and not (w.dir / p).exists():
                    data = b"new"  # nothing to delete: create it
                writes[p] = data
            if w.apply(step, writes) not in ("applied", "deduped"):
                continue  # the fence said no: the attempt ended
            made.append(step)
            if then == "publish":
                led.publish(step)
            elif then == "hold":
                held.append(step)
            else:
                led.workspaces.compensate(step, epoch=w.epoch, reason="prop")
        elif action[0] == "late" and held:
            led.publish(held.pop(action[1] % len(held)))
        elif action[0] == "undo" and made:
            step = made[action[1] % len(made)]
            if led.step(step).state not in ("compensated", "rejected"):
                led.workspaces.compensate(step, epoch=w.epoch, reason="prop")
                if step in held:
                    held.remove(step)  # ended: never published
    if finish:
        for step in reversed(held):
            led.publish(step)
    # a new epoch settles whatever is still in flight
    lease = led.workspaces.acquire("w", "agent", ttl_s=3600, force=True)
    assert not led.workspaces.unsettled("w", lease.epoch)
    projection = _projection(led, "w")
    assert committed_content(led, "w") == projection, actions
    assert _tree(w.dir) == {p: d for p, d in projection.items() if d is not None}
    led.workspaces.release("w", lease.epoch)
    report = led.workspaces.restore("w", tmp / "fresh")
    assert _tree(tmp / "fresh") == {p: d for p, d in projection.items() if d is not None}
    assert report.paths == sum(d is not None for d in projection.values())
    assert F.i9_problems(led) == []
    led.close()


def test_a_restore_retried_into_a_recreated_directory_is_recorded_anew(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """A restore whose event was recorded, its directory deleted by hand and the restore
    retried at the same path: a new directory (new device/inode), so a new restore — not
    a redelivery of the first with a different identity (IdempotencyConflict forever,
    before the identity was part of the key). The retry into the same directory is still
    answered by the journal."""
    w = World(tmp_path, at=ledger_at)
    assert w.apply("s1", {"a.txt": b"one"}) == "applied"
    w.ledger.publish("s1")
    w.ledger.ack("s1")
    w.ledger.workspaces.release("w", w.epoch)
    target = tmp_path / "restored"
    report = w.ledger.workspaces.restore("w", target)
    assert isinstance(report, RestoreReport) and (report.paths, report.deduped) == (1, False)
    first = w.ledger.workspaces.registration("w")
    assert w.ledger.workspaces.restore("w", target).deduped  # the same directory: the journal answers
    assert w.ledger.workspaces.registration("w") == first
    target.rename(tmp_path / "aside")  # kept: the new directory cannot reuse its inode
    w.ledger.workspaces.restore("w", target)  # recreated: a new restore, recorded
    again = w.ledger.workspaces.registration("w")
    assert again.seq > first.seq and again.ino != first.ino
    assert (target / "a.txt").read_bytes() == b"one"
    assert w.ledger.verify().ok


KILLED_RESTORE = r"""
import os, signal, sys
from ledger import Ledger
seen = []
def on_op(name):
    seen.append(name)
    if seen.count("ws-rename") == 3:  # three files placed, the rest not
        os.kill(os.getpid(), signal.SIGKILL)
with Ledger.open(sys.argv[1], on_op=on_op) as led:
    led.workspaces.restore("w", sys.argv[2], force=True)
"""


@pytest.mark.sqlite_only  # (a child process opens the ledger file)
def test_a_cli_restore_killed_midway_is_finished_by_running_it_again(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """`steptrail restore` SIGKILLed after three of six files: the same command run again
    resumes into the partial directory (it holds nothing but the restore's own output)
    and writes the rest — the CLI does not refuse the non-empty target first."""
    import signal
    import subprocess
    import sys

    from conftest import run_cli
    from ledger import StepStatus, run_fenced_step

    ws = tmp_path / "ws"
    ws.mkdir()
    db = str(ledger_at(tmp_path / "l.db"))
    files = {f"d/f{i}.txt": f"content {i}\n".encode() for i in range(6)}
    with Ledger.init(db) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "a", ttl_s=3600).epoch
        out = run_fenced_step(led, "w", "s1", lambda r: [r.read(p).write(c)
                                                         for p, c in files.items()],
                              epoch=epoch)
        assert out.status is StepStatus.APPLIED
    target = tmp_path / "restored"
    killed = subprocess.run([sys.executable, "-c", KILLED_RESTORE, db, str(target)],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    placed = [p for p in files if (target / p).exists()]
    assert 0 < len(placed) < len(files), placed
    got = run_cli(["--ledger", db, "restore", "--workspace", "w", "--to", str(target),
                   "--force", "--json"])
    assert got.code == 0, got
    assert {p: (target / p).read_bytes() for p in files} == files


# --- what restore writes, and where it never writes ---------------------------------------


def test_restore_never_writes_into_the_ledger(tmp_path: Path) -> None:
    w = Embedded(tmp_path)
    w.admit("s1", "app.py", b"v1\n", digest_of(b"v0\n"))
    r = w.led.workspaces.apply("s1", epoch=w.epoch)
    w.led.publish("s1", receipt=r.receipt)
    blobs = w.ws / ".steptrail" / "blobs"
    before = tree(w.ws / ".steptrail")
    for target in (blobs / "restored", w.ws / ".steptrail"):
        with pytest.raises(InvalidInput):
            w.led.workspaces.restore("w", target, force=True)
    assert tree(w.ws / ".steptrail").keys() == before.keys()
    report = w.led.workspaces.restore("w", tmp_path / "fresh", force=True)
    assert report.paths == 1


def test_restore_records_the_new_roots_identity(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    led = Ledger.init(tmp_path / "l" / "ledger.db", clock=FakeClock())
    led.workspaces.add("w", str(root), allow_git=True)
    epoch = led.workspaces.acquire("w", "a", 3600).epoch
    led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("x", b"1", None)])])
    led.publish("s1", receipt=led.workspaces.apply("s1", epoch=epoch).receipt)
    led.workspaces.restore("w", tmp_path / "new", force=True)
    ev = list(led.read(kind="workspace-restored"))[-1].event
    assert isinstance(ev, WorkspaceRestored)
    st = os.stat(tmp_path / "new")
    assert (ev.dev, ev.ino, ev.allow_git) == (st.st_dev, st.st_ino, True)
    reg = led.workspaces.registration("w")
    assert reg.identity == (st.st_dev, st.st_ino) and reg.allow_git
    # the restored directory swapped for a copy: refused like any swap
    shutil.copytree(tmp_path / "new", tmp_path / "copy")
    os.rename(tmp_path / "new", tmp_path / "new.old")
    os.rename(tmp_path / "copy", tmp_path / "new")
    with pytest.raises(WorkspaceMoved):
        led.workspaces.snapshot("w", "x")


def test_restore_writes_the_recorded_modes(tmp_path: Path) -> None:
    w = WorkdirWorld(tmp_path)
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


# --- a killed restore is resumed by its retry ---------------------------------------------


def _committed(w: WorkdirWorld) -> None:
    w.file("a.txt", b"a0", 0o644)
    w.admit("s1", Write("a.txt", b"a1", h(b"a0")), Write("b/b.txt", b"b1", None),
            Write("c.sh", b"c1", None))
    assert w.apply("s1") == "applied"
    w.commit("s1")
    w.ledger.workspaces.release("w", w.epoch)


def _restored_ok(w: WorkdirWorld, target: Path) -> None:
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
    w = WorkdirWorld(tmp_path)
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
    w = WorkdirWorld(tmp_path)
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
    w = WorkdirWorld(tmp_path)
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


#: The tests that take `ledger_at` run on SQLite and on PostgreSQL (tests/conftest.py); the
#: others, built on test_workdir's worlds, on SQLite.
BOTH_STORES = True

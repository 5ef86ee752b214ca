"""`observe`: changes made to a workspace outside the steps, found on disk and recorded
(ledger/step/observe.py, docs/time-travel.md).

A person edits with `sed -i`, deletes with `rm`, creates and chmods between an agent's
steps; `observe` records exactly those changes (created, changed, deleted, mode), as a
step of its own attributed to who asked, moving no byte; nothing changed writes nothing
(not even a lease); the baseline is the first observation; .gitignore'd, oversized and
non-regular files are left out and listed; restore, verify and audit see the observed
content; a step's write is never recorded as an outside change; an edit in the same
timestamp tick as the last look is still found (shown failing without that rule).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import LedgerAt

from ledger import LeaseHeld, Ledger, StepPlan, Write
from ledger.events import Observed
from ledger.gc.audit import audit
from ledger.step import observe as observing
from ledger.workspace.statcache import Cached

BOTH_STORES = True


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a ledger in a database keeps its stat cache in the user's cache directory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def tree(root: Path) -> dict[str, str]:
    """Every regular file under `root` (the ledger's directory and .git left out)."""
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] in (".steptrail", ".git") or not p.is_file() or p.is_symlink():
            continue
        out[rel] = h(p.read_bytes())
    return out


def recorded(led: Ledger, ws: str) -> dict[str, str]:
    """What the ledger says each path holds (deleted paths left out)."""
    return {p: d for p, (_rev, d) in led.workspaces.paths(ws).items() if d is not None}


class World:
    def __init__(self, tmp: Path, at: LedgerAt) -> None:
        self.root = tmp / "repo"
        (self.root / "src").mkdir(parents=True)
        (self.root / "src" / "app.py").write_text("def main():\n    print('v0')\n")
        (self.root / "README.md").write_text("hello\n")
        (self.root / "notes.txt").write_text("todo\n")
        self.led = Ledger.init(at(tmp / "ledger.db"))
        self.led.workspaces.add("w", str(self.root))

    def events(self) -> int:
        return self.led.head().seq

    def step(self, name: str, path: str, content: bytes) -> None:
        lease = self.led.workspaces.acquire("w", holder="agent", ttl_s=600)
        read = self.led.workspaces.read_file("w", path) if (self.root / path).exists() else None
        write = read.write(content) if read is not None else Write(path, content=content)
        self.led.workspaces.admit("w", lease.epoch, [StepPlan(name, [write])])
        got = self.led.workspaces.apply(name, epoch=lease.epoch, commit=True)
        assert got.verdict == "applied", got
        self.led.workspaces.release("w", lease.epoch)


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt) -> Any:
    w = World(tmp_path, ledger_at)
    try:
        yield w
    finally:
        w.led.close()


def test_a_baseline_then_a_persons_edits_are_recorded_as_they_are(world: World) -> None:
    first = world.led.workspaces.observe("w", by="cli:alice@laptop", label="start")
    assert first.baseline and len(first.steps) == 1
    assert {(c.path, c.kind) for c in first.changes} == {
        ("README.md", "created"), ("notes.txt", "created"), ("src/app.py", "created")}
    assert recorded(world.led, "w") == tree(world.root)

    world.step("agent-1", "src/app.py", b"def main():\n    print('v1')\n")
    subprocess.run(["sed", "-i", "s/hello/hello world/", str(world.root / "README.md")],
                   check=True)
    (world.root / "notes.txt").unlink()
    (world.root / "src" / "new.py").write_text("x = 1\n")
    os.chmod(world.root / "src" / "app.py", 0o755)
    got = world.led.workspaces.observe("w", by="cli:alice@laptop")
    assert not got.baseline
    assert [(c.path, c.kind) for c in got.changes] == [
        ("README.md", "changed"), ("notes.txt", "deleted"), ("src/app.py", "mode"),
        ("src/new.py", "created")]
    mode_change = got.changes[2]
    assert (mode_change.pre_mode, mode_change.mode) == (0o644, 0o755)
    assert recorded(world.led, "w") == tree(world.root)
    [step] = got.steps
    row = world.led.step(step)
    assert row.state == "acked" and row.run == "observed"
    [obs] = [e.event for e in world.led.read(step=step, kind="observed")]
    assert isinstance(obs, Observed) and obs.by == "cli:alice@laptop" and not obs.baseline
    kinds = [e.kind for e in world.led.read(step=step)]
    assert kinds[:2] == ["planned", "observed"] and kinds[-3:] == [
        "fenced", "manifest-published", "acked"]
    # the agent's own step is not an outside change
    assert "src/app.py" not in {c.path for c in got.changes if c.kind != "mode"}
    assert world.led.verify().ok
    assert audit(world.led, deep=True).ok


def test_nothing_changed_writes_nothing_not_even_a_lease(world: World) -> None:
    world.led.workspaces.observe("w")
    before = world.events()
    again = world.led.workspaces.observe("w")
    assert not again.changes and not again.recorded and not again.dry_run
    assert world.events() == before


def test_a_dry_run_records_nothing(world: World) -> None:
    got = world.led.workspaces.observe("w", dry_run=True)
    assert len(got.changes) == 3 and not got.recorded
    assert world.events() == 1  # workspace-added alone
    assert recorded(world.led, "w") == {}


def test_restore_brings_back_what_was_observed(world: World, tmp_path: Path) -> None:
    world.led.workspaces.observe("w")
    (world.root / "README.md").write_text("a person's words\n")
    world.led.workspaces.observe("w")
    report = world.led.workspaces.restore("w", tmp_path / "again")
    assert report is not None
    assert tree(tmp_path / "again") == tree(world.root)


def test_an_observation_can_be_undone_and_stays_restorable(world: World) -> None:
    world.led.workspaces.observe("w")
    (world.root / "README.md").write_text("a person's words\n")
    got = world.led.workspaces.observe("w")
    lease = world.led.workspaces.acquire("w", holder="person", ttl_s=600)
    comp = world.led.workspaces.compensate(got.steps[0], epoch=lease.epoch, reason="rewind")
    assert [r.outcome for r in comp.restored] == ["restored"]
    assert (world.root / "README.md").read_text() == "hello\n"
    # the person's bytes are still in the ledger: the observation named them
    digest = got.changes[0].post_hash
    assert digest is not None
    assert b"".join(world.led.blob_chunks(digest)) == b"a person's words\n"


def test_leased_by_another_it_is_refused_or_runs_under_the_holders_epoch(world: World) -> None:
    world.led.workspaces.observe("w")
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600)
    (world.root / "README.md").write_text("edited\n")
    with pytest.raises(LeaseHeld):
        world.led.workspaces.observe("w")
    got = world.led.workspaces.observe("w", epoch=lease.epoch, by="mcp:claude")
    assert [c.kind for c in got.changes] == ["changed"] and got.epoch == lease.epoch


def test_a_step_of_a_dead_lease_in_flight_is_settled_not_recorded_as_outside(
        world: World) -> None:
    world.led.workspaces.observe("w")
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600)
    read = world.led.workspaces.read_file("w", "README.md")
    world.led.workspaces.admit("w", lease.epoch, [StepPlan("s1", [read.write(b"agent\n")])])
    assert world.led.workspaces.apply("s1", epoch=lease.epoch).verdict == "applied"
    # the agent dies before its publish; its lease is taken over by the observation's
    world.led.workspaces.acquire("w", holder="another", ttl_s=600, force=True)
    lease2 = world.led.workspaces.lease("w")
    got = world.led.workspaces.observe("w", epoch=lease2.epoch)
    assert world.led.step("s1").state == "compensated"
    assert (world.root / "README.md").read_text() == "hello\n"
    assert not got.changes  # the agent's write was the step's, and it was taken back


def test_a_step_writing_between_the_look_and_the_record_makes_it_look_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.led.workspaces.observe("w")
    (world.root / "README.md").write_text("person\n")
    real = observing.record
    calls = []

    def racing(site: Any, name: str, epoch: int, scan: Any, **kw: Any) -> list[str]:
        if not calls:  # a step of this epoch records notes.txt meanwhile
            calls.append(1)
            read = world.led.workspaces.read_file("w", "notes.txt")
            world.led.workspaces.admit("w", epoch, [StepPlan("s-race", [read.write(b"s\n")])])
            world.led.workspaces.apply("s-race", epoch=epoch, commit=True)
        return real(site, name, epoch, scan, **kw)

    monkeypatch.setattr(observing, "record", racing)
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600)
    (world.root / "notes.txt").write_text("also the person\n")
    got = world.led.workspaces.observe("w", epoch=lease.epoch)
    # the first look saw notes.txt changed; the step wrote it before the record: looked again
    assert [(c.path, c.kind) for c in got.changes] == [("README.md", "changed")]
    assert recorded(world.led, "w") == tree(world.root)
    # the first look's plan was refused in its transaction: nothing of it was written
    assert list(world.led.read(kind="rejected")) == []
    assert len(list(world.led.read(kind="observed"))) == 2


@pytest.mark.sqlite_only
def test_gitignored_oversized_and_non_files_are_left_out_and_listed(world: World) -> None:
    root = world.root
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(b"\0" * 10)
    (root / "x.log").write_text("log\n")
    (root / "big.bin").write_bytes(b"b" * 5000)
    os.symlink("README.md", root / "link")
    os.symlink("/etc/passwd", root / "outside")
    got = world.led.workspaces.observe("w", max_file_bytes=4096)
    paths = {c.path for c in got.changes}
    assert paths == {".gitignore", "README.md", "notes.txt", "src/app.py"}
    assert {(n.path, n.why) for n in got.not_captured} == {
        ("build", "ignored"), ("x.log", "ignored"), ("big.bin", "too-large"),
        ("link", "not-a-file"), ("outside", "not-a-file")}
    assert got.ignore_rules
    [obs] = [e.event for e in world.led.read(kind="observed")]
    assert obs.not_captured_total == 5
    # the .git directory is never looked into, and an ignored file going is no deletion
    assert not any(c.path.startswith(".git/") for c in got.changes)
    with_ignored = world.led.workspaces.observe("w", include_ignored=True,
                                                max_file_bytes=1 << 20)
    assert {c.path for c in with_ignored.changes} == {"build/out.o", "x.log", "big.bin"}
    # without include_ignored again: a file in an ignored directory is not looked at, so
    # it is no deletion; a captured file that is gone is one, ignored or not
    (root / "x.log").unlink()
    after = world.led.workspaces.observe("w", max_file_bytes=1 << 20)
    assert {(c.path, c.kind) for c in after.changes} == {("x.log", "deleted")}


@pytest.mark.sqlite_only
def test_a_large_file_is_stored_as_a_blob_file_and_restores(world: World,
                                                           tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (world.root / "model.bin").write_bytes(data)
    got = world.led.workspaces.observe("w")
    assert ("model.bin", "created") in {(c.path, c.kind) for c in got.changes}
    world.led.workspaces.restore("w", tmp_path / "again")
    assert (tmp_path / "again" / "model.bin").read_bytes() == data
    assert audit(world.led, deep=True).ok


def test_a_file_changed_while_it_is_stored_is_never_recorded_with_other_bytes(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    big = world.root / "model.bin"
    big.write_bytes(b"a" * (2 << 20))
    real = observing._store_large
    changed = []

    def meddle(site: Any, name: str, batch: Any, inline: Any) -> None:
        if not changed:
            changed.append(1)
            big.write_bytes(b"b" * (2 << 20))  # a person saves during the copy
        real(site, name, batch, inline)

    monkeypatch.setattr(observing, "_store_large", meddle)
    got = world.led.workspaces.observe("w")
    assert recorded(world.led, "w")["model.bin"] == h(b"b" * (2 << 20))
    assert [c.post_hash for c in got.changes if c.path == "model.bin"] == [h(b"b" * (2 << 20))]
    assert len(list(world.led.read(kind="rejected"))) == 1
    assert world.led.verify().ok


# -- the timestamp tick ----------------------------------------------------------------------


def _same_tick_edit_found(root: Path, led: Ledger) -> bool:
    """Look at a file in the tick it was written, edit it in place (same size) in that same
    tick, look again: whether the second look finds the edit. The edit's stat is made the
    one the first look cached (what a write in the same tick leaves), so the only thing
    that can find it is not trusting a file modified that close to a look."""
    target = root / "README.md"
    target.write_text("v1 same\n")
    st = target.stat()
    confined = led.workspaces.confined("w")
    known: dict[str, tuple[int, str | None]] = {}
    first = observing.scan(confined, known, {}, looked_ns=st.st_mtime_ns, inline_max=1 << 16,
                           max_file_bytes=1 << 30, ignored=None, recorded_mode=lambda p: None)
    target.write_text("v2 same\n")  # in place: same inode, same size
    now = target.stat()
    cached = {}
    for path, entry in first.cache.items():
        size, _m, _c, ino, mode, digest, trusted = entry
        if path == "README.md":  # the same tick: the stat did not move
            cached[path] = Cached(now.st_size, now.st_mtime_ns, now.st_ctime_ns,
                                             now.st_ino, mode, digest, trusted, 0)
        else:
            cached[path] = Cached(size, _m, _c, ino, mode, digest, trusted, 0)
    second = observing.scan(confined, {"README.md": (1, h(b"v1 same\n"))}, cached,
                            looked_ns=now.st_mtime_ns + 10**9, inline_max=1 << 16,
                            max_file_bytes=1 << 30, ignored=None, recorded_mode=lambda p: None)
    return any(c.path == "README.md" and c.post_hash == h(b"v2 same\n") for c in second.changes)


def test_an_edit_in_the_same_timestamp_tick_as_the_look_is_found(world: World) -> None:
    assert _same_tick_edit_found(world.root, world.led)


def test_the_tick_checker_catches_a_cache_that_trusts_a_fresh_file(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observing, "RACY_NS", -(10**12))  # every file trusted at once
    assert not _same_tick_edit_found(world.root, world.led)


@pytest.mark.sqlite_only
def test_an_unchanged_tree_is_not_read_again(world: World) -> None:
    world.led.workspaces.observe("w")
    old = 1_000_000_000  # 2001: older than any look
    for p in world.root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))
    # ctime is now: the next look hashes (and caches trusted once ctime is old too)
    got = world.led.workspaces.observe("w")
    assert not got.changes
    assert got.hashed == 3 and got.files == 3


def test_the_command_line_records_who_asked(world: World, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from ledger.cli import cli

    location = world.led.path
    world.led.close()
    runner = CliRunner()
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "observe", "--json"])
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads(r.output)
    assert doc["baseline"] and doc["by"].startswith("cli:") and len(doc["changes"]) == 3
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "observe"])
    assert r.exit_code == 0 and "nothing changed" in r.output
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "observe",
                            "--max-file-size", "lots"])
    assert r.exit_code == 2 and "not a size" in r.output
    (world.root / "README.md").write_text("between leases\n")
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "lease", "acquire",
                            "--holder", "agent"])  # (the command line observes by default)
    assert r.exit_code == 0 and "observed 1 edit(s) made outside the steps" in r.output, r.output
    (world.root / "README.md").write_text("left for later\n")
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "lease", "acquire",
                            "--holder", "agent", "--resume", "--no-observe", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["observed"] == [], r.output
    r = runner.invoke(cli, ["--ledger", str(location), "--workspace", "w", "lease", "acquire",
                            "--holder", "agent", "--resume"])
    assert r.exit_code == 0 and "observed 1 edit(s)" in r.output, r.output
    world.led = Ledger.open(location)


def test_an_acquire_that_observes_records_what_happened_while_nobody_held_it(
        world: World) -> None:
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600, observe=True)
    assert len(lease.observed) == 1 and lease.observed_changes == 3  # the baseline
    world.led.workspaces.release("w", lease.epoch)
    (world.root / "README.md").write_text("while nobody held it\n")
    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600, observe=True)
    [step] = lease.observed
    [obs] = [e.event for e in world.led.read(step=step, kind="observed")]
    assert obs.by == "lease:agent" and lease.observed_changes == 1
    world.led.workspaces.release("w", lease.epoch)
    quiet = world.led.workspaces.acquire("w", holder="agent", ttl_s=600, observe=True)
    assert quiet.observed == () and quiet.observed_changes == 0
    # a step the dead holder left in flight is settled first, never observed as outside
    read = world.led.workspaces.read_file("w", "notes.txt")
    world.led.workspaces.admit("w", quiet.epoch, [StepPlan("s1", [read.write(b"agent\n")])])
    assert world.led.workspaces.apply("s1", epoch=quiet.epoch).verdict == "applied"
    taken = world.led.workspaces.acquire("w", holder="other", ttl_s=600, force=True,
                                         observe=True)
    assert taken.settled == ("s1",) and taken.observed == ()
    assert (world.root / "notes.txt").read_text() == "todo\n"


@pytest.mark.sqlite_only
def test_watch_records_each_burst_of_saves_and_stops_on_ctrl_c(world: World) -> None:
    import json
    import signal
    import sys
    import time

    location = world.led.path
    world.led.close()
    steptrail = str(Path(sys.executable).with_name("steptrail"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    proc = subprocess.Popen([steptrail, "--ledger", str(location), "--workspace", "w",
                             "observe", "--watch", "--interval", "0.3s", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    import select

    def line() -> str:  # (a watcher that missed a change fails the test, never hangs it)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no observation within 30 s"
        return proc.stdout.readline()

    try:
        first = json.loads(line())  # the baseline, at once
        assert first["baseline"] and len(first["changes"]) == 3
        time.sleep(0.5)
        for i in range(3):  # a burst of saves: one look after it is quiet
            (world.root / "README.md").write_text(f"save {i}\n")
            time.sleep(0.05)
        got = json.loads(line())
        assert [(c["path"], c["kind"]) for c in got["changes"]] == [("README.md", "changed")]
        assert got["changes"][0]["post_hash"] == h(b"save 2\n")
        (world.root / "newdir").mkdir()
        time.sleep(0.5)  # the new directory is watched once it appears
        (world.root / "newdir" / "deep.txt").write_text("deep\n")
        got = json.loads(line())
        assert [(c["path"], c["kind"]) for c in got["changes"]] == [("newdir/deep.txt",
                                                                      "created")]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # (closes the pipes)
    world.led = Ledger.open(location)
    assert recorded(world.led, "w") == tree(world.root)
    assert world.led.verify().ok


def test_a_step_run_that_observes_first_has_the_persons_edit_in_the_history_before_it(
        world: World) -> None:
    from ledger import StepStatus, run_fenced_step

    lease = world.led.workspaces.acquire("w", holder="agent", ttl_s=600)

    def plan(read: Any) -> Any:
        return [read.read("src/app.py").write(b"v1\n")]

    run_fenced_step(world.led, "w", "s1", plan, epoch=lease.epoch, observe=True)
    (world.root / "README.md").write_text("a person, between steps\n")

    def plan2(read: Any) -> Any:
        return [read.read("src/app.py").write(b"v2\n")]

    out = run_fenced_step(world.led, "w", "s2", plan2, epoch=lease.epoch, observe=True)
    assert out.status is StepStatus.APPLIED
    order = [r.step_id for r in world.led.steps()]
    observed = [s for s in order if s.startswith("observed-")]
    assert len(observed) == 2  # the baseline before s1, the person's edit before s2
    assert order.index(observed[1]) < order.index("s2")
    [obs] = [e.event for e in world.led.read(step=observed[1], kind="observed")]
    assert obs.by == "runner:s2"
    assert recorded(world.led, "w") == tree(world.root)


def test_an_older_steptrail_refuses_an_observation_row_by_its_version(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kinds of time travel are rows of version 3: a steptrail that reads only version 2
    refuses them as newer ('upgrade steptrail'), never as damaged; other rows stay 2."""
    from ledger import InvalidInput
    from ledger import events as ev

    got = world.led.workspaces.observe("w")
    rows = {r.kind: r.v for r in world.led.read(step=got.steps[0])}
    assert rows["observed"] == 3 and rows["planned"] == 2 and rows["fenced"] == 2
    [obs] = [r for r in world.led.read(step=got.steps[0]) if r.kind == "observed"]
    payload = ev.encode(obs.event)
    monkeypatch.setattr(ev, "READ_VERSION", 2)  # an older steptrail
    with pytest.raises(InvalidInput, match="newer than this steptrail"):
        ev.decode(payload, 3)

"""Attacks on retention (ledger/retention.py, the collector's `retention=`, verify's
`released`): a policy, a crafted policy file, a second process or an unlucky sequence of
steps trying to make gc collect bytes it must keep (docs/time-travel.md "Retention").

What was found and fixed, one test each (each failed before its fix):

- a release names (step, path, digest), and the same key can name two records: a step's
  artifact at the path it also wrote, a write that left the bytes as they were and its
  undo, a step run again after its undo. Releasing the old record released the other
  too — an artifact, or the current file, was collected while verify and audit said ok.
- an observation pins no pre-image (no byte moves), so its pre-image version, released,
  was collected inside its compensation window: its undo was a conflict.
- a hold placed after gc collected a released version made every later gc refuse
  ("a referenced blob is missing") and audit report a violation; a hold placed while gc
  ran (after its read) did not keep what gc had found released.
- the default policy file was read whoever wrote it (a ledger in a shared directory:
  anyone could plant ``retention.toml``), a FIFO there hung gc, bytes that are not UTF-8
  were a traceback, and ``keep_versions = 1`` — nothing but the current files, which the
  docs say is refused — was accepted.

The rest show an attack that fails: the code holds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger import Ledger, run_fenced_step
from ledger import retention
from ledger.blobs import digest_of
from ledger.cli import cli
from ledger.errors import CollectorBusy, InvalidInput
from ledger.gc import audit, collect
from ledger.gc import collector
from ledger.gc.collector import collector_lock
from ledger.retention import Policy

DAY = 86_400 * 10**9
KEEP_ONE = Policy(keep_versions=1, source="test")


@pytest.fixture(autouse=True)
def _cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _days_ago(days: float = 3) -> Any:
    """A clock `days` behind: a history a command run now finds that old (out of the
    compensation window)."""
    return lambda: time.time_ns() - int(days * DAY)


def _ledger(tmp_path: Path, content: bytes = b"v0\n", clock: Any = None
            ) -> tuple[Ledger, Path, int]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(content)
    led = Ledger.init(str(tmp_path / ".steptrail" / "ledger.db"), clock=clock)
    led.workspaces.add("w", str(ws))
    led.workspaces.observe("w", by="test")  # the baseline
    return led, ws, led.workspaces.acquire("w", "agent", ttl_s=3600).epoch


def _write(led: Ledger, step: str, epoch: int, data: bytes, path: str = "app.py",
           **kw: Any) -> None:
    run_fenced_step(led, "w", step, lambda read: [read.read(path).write(data)],
                    epoch=epoch, **kw).raise_for_status()


def _stored(led: Ledger, data: bytes) -> bool:
    with led.storage.read() as conn:
        return conn.blob_size(digest_of(data)) is not None


def _gc(led: Ledger, policy: Policy | None, now: int, **kw: Any) -> Any:
    return collect(led, grace_s=0, force=True, now_ns=now, retention=policy, **kw)


def _clean(led: Ledger, now: int) -> None:
    assert led.verify().ok
    found = audit(led, now_ns=now)
    assert found.ok, (found.problems, found.dangling)


# -- the same key naming two records ----------------------------------------------------


def test_an_artifact_at_the_path_its_step_wrote_is_not_a_version(tmp_path: Path) -> None:
    """A step writes app.py and records an artifact app.py with the same bytes (a report
    it also leaves in the tree). Releasing the old version of app.py released the
    artifact's manifest entry too: its bytes were collected, verify accepted it."""
    led, _ws, epoch = _ledger(tmp_path)
    report = b"REPORT\n"
    _write(led, "s1", epoch, report, artifacts={"app.py": report})
    _write(led, "s2", epoch, b"v2\n")
    now = led.clock() + 40 * DAY
    got = _gc(led, KEEP_ONE, now)
    assert got.retention["released"] == 2  # the baseline's v0 and s1's write
    assert _stored(led, report)  # the artifact holds it
    manifest = led.manifest("s1")
    assert manifest is not None and manifest.artifacts[0].digest == digest_of(report)
    _clean(led, now)
    # and verify does not take an artifact for a released version: gone, it is a violation
    with led.storage.transaction() as tx:
        tx.delete_inline(digest_of(report))
    assert not led.verify().ok
    led.close()


def test_undoing_a_write_that_changed_nothing_keeps_the_current_files_bytes(
        tmp_path: Path) -> None:
    """s2 writes app.py with the bytes it already held; undone, its put-back records the
    same (step, path, digest) as its write. The write, old, was released — and with it
    the put-back: the current file's only record. Its bytes were collected, verify and
    audit said ok, and nothing could restore the file any more."""
    led, ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    _write(led, "s2", epoch, b"v1\n")  # no change
    led.workspaces.compensate("s2", epoch=epoch)
    now = led.clock() + 40 * DAY
    _gc(led, KEEP_ONE, now)
    assert (ws / "app.py").read_bytes() == b"v1\n"
    assert _stored(led, b"v1\n")  # the current file's bytes
    _clean(led, now)
    led.close()


def test_a_release_does_not_reach_a_record_made_after_it(tmp_path: Path) -> None:
    """A step killed after its apply is undone by the next lease (its put-back: X), and
    released by gc. Run again, the same step writes X back: a new record with the key the
    release named. The release reached it: the current file's bytes were collected."""
    led, ws, epoch = _ledger(tmp_path, b"X\n")

    class Killed(Exception):
        pass

    def kill(stage: str) -> None:
        if stage == "applied":
            raise Killed

    def toggle(read: Any) -> list[Any]:
        f = read.read("app.py")
        return [f.write(b"A\n" if f.content == b"X\n" else b"X\n")]

    with pytest.raises(Killed):  # a large artifact: published in a later commit
        run_fenced_step(led, "w", "s", toggle, epoch=epoch, on_stage=kill,
                        artifacts={"big.bin": b"x" * (2 << 20)})
    epoch = led.workspaces.acquire("w", "agent", ttl_s=3600, resume=True).epoch
    assert led.step("s").state == "compensated" and (ws / "app.py").read_bytes() == b"X\n"
    _write(led, "t", epoch, b"Y\n")
    now = led.clock() + 40 * DAY
    assert _gc(led, KEEP_ONE, now).retention["released"] >= 1  # s's put-back among them
    run_fenced_step(led, "w", "s", toggle, epoch=epoch).raise_for_status()  # Y -> X
    assert (ws / "app.py").read_bytes() == b"X\n"
    now += 40 * DAY
    _gc(led, KEEP_ONE, now)
    assert _stored(led, b"X\n")
    _clean(led, now)
    led.close()


# -- undo inside the window, holds ------------------------------------------------------


@pytest.mark.parametrize("last", ["observation", "step", "rewind"])
def test_the_last_step_can_still_be_undone_inside_its_window(tmp_path: Path,
                                                           last: str) -> None:
    """gc right after the step, keeping one version: the step's pre-image is no current
    version, yet its undo needs it for a day (the compensation window). A step's and a
    rewind's pin held it; an observation pins none, and its undo was a conflict."""
    led, ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    led.workspaces.release("w", epoch)
    if last == "observation":
        (ws / "app.py").write_bytes(b"v2 by hand\n")
        [step] = led.workspaces.observe("w", by="test").steps
    elif last == "step":
        epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        _write(led, "s2", epoch, b"v2\n")
        led.workspaces.release("w", epoch)
        step = "s2"
    else:
        got = led.workspaces.rewind("w", [r.step for r in led.read(kind="observed")][0])
        assert got.verdict == "applied" and got.step is not None
        step = got.step
    assert (ws / "app.py").read_bytes() != b"v1\n"
    # two days on the pre-image may go (the window has passed): the rule keeps only that
    later = retention.plan(led, KEEP_ONE, now_ns=led.clock() + 2 * DAY)
    assert ("s1", "app.py", digest_of(b"v1\n")) in later.released_keys
    now = led.clock() + 10**9
    _gc(led, KEEP_ONE, now)
    epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch
    undone = led.workspaces.compensate(step, epoch=epoch)
    assert [r.outcome for r in undone.restored] == ["restored"], undone
    assert (ws / "app.py").read_bytes() == b"v1\n"
    _clean(led, now)
    led.close()


def test_an_undo_killed_midway_still_finds_the_bytes_it_puts_back(tmp_path: Path) -> None:
    """An observation's undo killed after its intent, before any file moved: the step is
    compensating (in flight) for as long as nobody settles it — days, maybe. gc then
    released and collected the version it puts back (no pin holds an observation's
    pre-image), and the settle that finishes the undo could not put it back."""
    from test_travel_crashes import kill_at

    led, ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    led.workspaces.release("w", epoch)
    (ws / "app.py").write_bytes(b"v2 by hand\n")
    [obs] = led.workspaces.observe("w", by="test").steps
    path = led.path
    led.close()
    kill_at(path, lambda child: child.workspaces.compensate(
        obs, epoch=child.workspaces.acquire("w", "undoer", ttl_s=1).epoch), "ws-write")
    with Ledger.open(path) as led:
        assert led.step(obs).state == "compensating"
        now = led.clock() + 40 * DAY
        _gc(led, KEEP_ONE, now)
        assert _stored(led, b"v1\n")
        settled = led.workspaces.acquire("w", "agent", ttl_s=3600, force=True)
        assert not settled.conflicts and led.step(obs).state == "compensated"
        assert (ws / "app.py").read_bytes() == b"v1\n"
        _clean(led, now)


def test_a_release_written_by_hand_never_takes_the_current_file(tmp_path: Path) -> None:
    """`history-released` is an event a library user can append: one naming the current
    version of a path released the file's only record, and gc collected its bytes while
    verify and audit said ok. gc keeps the current content of every path, whatever a
    release says (docs: "Always kept, whatever the policy says")."""
    from ledger import HistoryReleased, ReleasedVersion

    led, _ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    led.append(HistoryReleased(workspace="w", versions=(
        ReleasedVersion(step="s1", path="app.py", digest=digest_of(b"v1\n")),)))
    now = led.clock() + 40 * DAY
    _gc(led, None, now)
    assert _stored(led, b"v1\n")
    _clean(led, now)
    led.close()


def test_a_hold_placed_after_the_collection_leaves_gc_and_audit_working(
        tmp_path: Path) -> None:
    """Released and collected, then held: the hold cannot bring the bytes back — but it
    made them count as referenced again, so every later gc refused ("a referenced blob
    is missing") and audit reported a violation until the hold was released."""
    led, _ws, epoch = _ledger(tmp_path)
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % i, run="r")
    now = led.clock() + 40 * DAY
    _gc(led, KEEP_ONE, now)
    assert not _stored(led, b"v1\n")
    led.hold("s1", scope="step")
    led.hold("r")
    again = _gc(led, None, now)  # no refusal
    assert again.collected == 0
    _clean(led, now)
    # a hold placed before the collection still keeps: released, held, collected-not
    _write(led, "s4", epoch, b"v4\n", run="q")
    _write(led, "s5", epoch, b"v5\n", run="q")
    retention.apply(led, KEEP_ONE, now_ns=now + DAY)
    led.hold("q")
    _gc(led, None, now + DAY)
    assert _stored(led, b"v4\n")
    led.release_hold("q")
    _gc(led, None, now + DAY)
    assert not _stored(led, b"v4\n")
    _clean(led, now + DAY)
    led.close()


def test_a_hold_placed_while_gc_runs_keeps_what_gc_found_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process holds the run after gc read the references and before it
    collects: the collection re-checks inside its transaction, and keeps the bytes."""
    led, _ws, epoch = _ledger(tmp_path)
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % i, run="r")
    real = collector._collect_batch

    def racing(ledger: Ledger, *args: Any, **kw: Any) -> Any:
        if not ledger.holds():
            with Ledger.open(ledger.path) as other:
                other.hold("r", reason="a second process, mid-gc")
        return real(ledger, *args, **kw)

    monkeypatch.setattr(collector, "_collect_batch", racing)
    now = led.clock() + 40 * DAY
    got = _gc(led, KEEP_ONE, now)
    assert got.retention["released"] == 3  # v0, v1, v2
    assert _stored(led, b"v1\n") and _stored(led, b"v2\n")
    _clean(led, now)
    # this run kept every released version (it cannot tell which the hold covers); the
    # next one collects the baseline's v0 (run "observed": not held), and only it
    monkeypatch.setattr(collector, "_collect_batch", real)
    assert _gc(led, None, now).collected == 1
    assert not _stored(led, b"v0\n") and _stored(led, b"v1\n") and _stored(led, b"v2\n")
    led.close()


# -- what is shared, what is not --------------------------------------------------------


def test_bytes_a_fork_or_an_observation_shares_stay(tmp_path: Path) -> None:
    led, ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    _write(led, "s2", epoch, b"v2\n")
    led.workspaces.release("w", epoch)
    (ws / "copy.txt").write_bytes(b"v2\n")  # a person's copy of v2, observed
    (ws / "older.txt").write_bytes(b"v0\n")
    led.workspaces.observe("w", by="test")
    led.workspaces.fork("w", "s1", tmp_path / "try", name="try")  # its app.py: v1
    epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch
    _write(led, "s3", epoch, b"v3\n")
    now = led.clock() + 40 * DAY
    got = _gc(led, Policy(keep_versions=1, workspaces=("w",), source="t"), now)
    assert got.retention["released"] == 3  # app.py's v0, v1, v2
    assert got.collected == 0  # each is held by another record
    assert all(_stored(led, b) for b in (b"v0\n", b"v1\n", b"v2\n"))
    _clean(led, now)
    led.close()


def test_verify_accepts_no_missing_blob_but_the_released_version_itself(
        tmp_path: Path) -> None:
    """(s1, app.py, X) released; X is also copy.txt's current content. X's bytes removed
    by something else: verify flags copy.txt's entry — the release names another record
    — and gc refuses."""
    led, _ws, epoch = _ledger(tmp_path)
    big = b"X" * (512 << 10)  # a blob file, not a row
    _write(led, "s1", epoch, big)
    _write(led, "s2", epoch, b"v2\n")
    _write(led, "copy", epoch, big, path="copy.txt")
    now = led.clock() + 40 * DAY
    _gc(led, KEEP_ONE, now)
    assert _stored(led, big)
    _clean(led, now)
    led.blobs.delete(digest_of(big))
    found = led.verify()
    assert not found.ok
    assert any("copy" in f.message and "missing" in f.message for f in found.findings)
    with pytest.raises(Exception, match="referenced blob is missing"):
        _gc(led, None, now)
    led.close()


def test_lost_bytes_are_blamed_on_a_release_only_of_that_very_version(
        tmp_path: Path) -> None:
    """(s1, app.py, X) released; X is also copy.txt's version of step "copy", which no
    release names. X's bytes then lost by something else (damage): a rewind of copy.txt
    said "released by the retention policy" — a release of another path, the same
    bytes. Only the release of that version is named; the damage is said as such."""
    led, _ws, epoch = _ledger(tmp_path)
    big = b"X" * (512 << 10)
    _write(led, "s1", epoch, big)
    _write(led, "s2", epoch, b"v2\n")
    _write(led, "copy", epoch, big, path="copy.txt")
    now = led.clock() + 40 * DAY
    _gc(led, KEEP_ONE, now)
    [release] = [r.seq for r in led.read(kind="history-released")]
    _write(led, "s4", epoch, b"c2\n", path="copy.txt")
    led.blobs.delete(digest_of(big))
    ws = led.workspaces
    [(_, why_copy)] = ws.rewind("w", "copy", paths=["copy.txt"], preview=True).unreachable
    [(_, why_app)] = ws.rewind("w", "s1", paths=["app.py"], preview=True).unreachable
    assert "retention" not in why_copy and "no longer stored" in why_copy, why_copy
    assert f"released by the retention policy (#{release})" in why_app, why_app
    [(_, why_fork)] = ws.fork("w", "copy", tmp_path / "f").unreachable
    assert "retention" not in why_fork and "no longer stored" in why_fork, why_fork
    led.close()


def test_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    led, ws, epoch = _ledger(tmp_path, clock=_days_ago())
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % (i * 1000))
    db = led.path
    led.close()
    policy = tmp_path / ".steptrail" / "retention.toml"
    policy.write_text("[history]\nkeep_versions = 2\n")

    def state() -> Any:
        with Ledger.open(db, readonly=True) as again:
            view = again.storage.view
            ledger_files = {p.relative_to(tmp_path).as_posix(): p.read_bytes()
                            for p in (tmp_path / ".steptrail").rglob("*")
                            if p.is_file() and not p.name.endswith(("-shm", ".lock"))}
            return (again.count(), again.head(), view.condemned_count(),
                    view.meta(collector.LAST_RUN_META), ledger_files,
                    {p.name: p.read_bytes() for p in ws.iterdir()})

    before = state()
    run = CliRunner().invoke
    for args in (["gc", "--dry-run"], ["gc", "--dry-run", "--json", "--grace", "0",
                                        "--force"]):
        got = run(cli, ["--ledger", db, *args])
        assert got.exit_code == 0, got.output
        assert state() == before
    assert json.loads(got.stdout)["retention"]["released"] == 2
    with Ledger.open(db) as led:  # read-write, through the library
        _gc(led, Policy(keep_versions=2, source="t"), led.clock() + 40 * DAY, dry_run=True)
    assert state() == before


def test_a_second_gc_is_turned_away_before_it_releases_anything(tmp_path: Path) -> None:
    led, _ws, epoch = _ledger(tmp_path)
    _write(led, "s1", epoch, b"v1\n")
    count = led.count()
    with Ledger.open(led.path) as other, collector_lock(other):
        with pytest.raises(CollectorBusy):
            _gc(led, KEEP_ONE, led.clock() + 40 * DAY)
    assert led.count() == count and not list(led.read(kind="history-released"))
    led.close()


def test_a_policy_naming_a_workspace_twice_releases_each_version_once(tmp_path: Path) -> None:
    led, _ws, epoch = _ledger(tmp_path)
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % i)
    got = retention.apply(led, Policy(keep_versions=2, workspaces=("w", "w"), source="t"),
                          now_ns=led.clock() + 40 * DAY)
    assert got.released == 2
    [event] = [r.event for r in led.read(kind="history-released")]
    assert len(event.versions) == 2
    led.close()


# -- the policy file --------------------------------------------------------------------


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail, not hang, a test whose gc blocks (a FIFO opened for reading)."""
    def hung(*_: Any) -> None:
        raise TimeoutError("gc blocked reading the policy file")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _plant(policy: Path, how: str, tmp_path: Path) -> None:
    text = "[history]\nkeep_versions = 2\n"
    if how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        policy.write_text(text)
        os.chown(policy, 65534, 65534)
    elif how == "writable by all":
        policy.write_text(text)
        os.chmod(policy, 0o666)
    elif how == "a symlink another user planted":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        mine = tmp_path / "my-other-ledgers-policy.toml"  # aggressive, for another ledger
        mine.write_text(text)
        policy.symlink_to(mine)
        os.lchown(policy, 65534, 65534)
    elif how == "a FIFO":
        os.mkfifo(policy)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["another user's", "writable by all",
                                 "a symlink another user planted", "a FIFO"])
def test_a_default_policy_file_someone_else_could_have_written_is_refused(
        tmp_path: Path, how: str, deadline: None) -> None:
    """A ledger in a shared directory: the default policy file beside it is read by every
    gc. One another user could have planted or edited is refused — one line, exit 2,
    nothing released — and a FIFO never blocks gc."""
    led, _ws, epoch = _ledger(tmp_path, clock=_days_ago())
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % i)
    db, count = led.path, led.count()
    led.close()
    _plant(tmp_path / ".steptrail" / "retention.toml", how, tmp_path)
    got = CliRunner().invoke(cli, ["--ledger", db, "gc"])
    assert got.exit_code == 2, got.output
    assert len(got.output.strip().splitlines()) == 1 and "Traceback" not in got.output
    assert "retention.toml" in got.output and "--no-retention" in got.output
    with Ledger.open(db) as again:
        assert again.count() == count
    ok = CliRunner().invoke(cli, ["--ledger", db, "gc", "--no-retention"])
    assert ok.exit_code == 0, ok.output


def test_ones_own_policy_file_and_symlink_are_read(tmp_path: Path) -> None:
    led, _ws, epoch = _ledger(tmp_path, clock=_days_ago())
    for i in (1, 2, 3):
        _write(led, f"s{i}", epoch, b"v%d\n" % i)
    db = led.path
    led.close()
    mine = tmp_path / "mine.toml"
    mine.write_text("[history]\nkeep_versions = 2\n")
    os.chmod(mine, 0o644)
    (tmp_path / ".steptrail" / "retention.toml").symlink_to(mine)
    got = CliRunner().invoke(cli, ["--ledger", db, "gc", "--dry-run", "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["retention"]["released"] == 2


@pytest.mark.parametrize(("text", "says"), [
    (b"[history]\nkeep_versions = 1\n", "keeps nothing but the current files"),
    (b"[history]\nkeep_days = inf\n", "keep_days"),
    (b"[history]\nkeep_days = 1e400\n", "keep_days"),
    (b"[history]\nkeep_days = 1979-05-27\n", "keep_days"),
    (b"[history]\nkeep_versions = 9223372036854775807\n", "keep_versions"),
    (b"[[history]]\nkeep_versions = 3\n", "no [history] table"),
    (b"[history]\nkeep_versions = 3\nworkspaces = [\"\"]\n", "workspaces"),
    (b"[history]\nkeep_versions = 3 # \xff\xfe\n", "not UTF-8"),
    (b"[history]\nkeep_versions = 3\n" + b"#" * (1 << 20) + b"\n", "bytes"),
])
def test_odd_policy_values_are_refused_in_one_line(tmp_path: Path, text: bytes,
                                                    says: str) -> None:
    f = tmp_path / "p.toml"
    f.write_bytes(text)
    with pytest.raises(InvalidInput) as info:
        retention.load_policy(f)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_ledger_in_postgresql_takes_an_explicit_policy_and_has_no_default(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0\n")
    with Ledger.init(pg_url, clock=_days_ago()) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        for i in (1, 2, 3, 4):
            _write(led, f"s{i}", epoch, b"v%d\n" % i)
        led.workspaces.release("w", epoch)
        assert retention.policy_path(led) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "retention.toml").write_text("[history]\nkeep_versions = 2\n")
    run = CliRunner().invoke
    none = run(cli, ["--ledger", pg_url, "gc", "--dry-run", "--json"])
    assert none.exit_code == 0, none.output
    assert json.loads(none.stdout)["retention"] is None  # no file is looked for
    got = run(cli, ["--ledger", pg_url, "gc", "--json", "--grace", "0", "--force",
                    "--retention", str(tmp_path / "retention.toml")])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["retention"]["released"] == 2  # s1's v1, s2's v2
    with Ledger.open(pg_url) as led:
        assert led.verify().ok and audit(led).ok
        assert (ws / "app.py").read_bytes() == b"v4\n" and _stored(led, b"v4\n")
        assert _stored(led, b"v3\n")  # kept: the last two

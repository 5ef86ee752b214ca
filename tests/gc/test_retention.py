"""Retention: a policy file applied by gc releases old versions of a workspace's files
(ledger/retention.py; docs/time-travel.md "Retention").

The invariant (`kept_but_gone`): after any gc with a policy, every version the policy
keeps — the current one of each path, the last K, those newer than N days, those of a held
step or run or of a step not settled — still has its bytes; and audit and verify stay
clean. The checker is shown catching a policy applier that releases what it must keep.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger, run_fenced_step
from ledger import retention
from ledger.errors import InvalidInput
from ledger.gc import audit, collect
from ledger.retention import Policy

DAY = 86_400 * 10**9


def _ledger(tmp_path: Path, versions: int = 6) -> tuple[Ledger, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_bytes(b"v0\n")
    led = Ledger.init(str(tmp_path / ".steptrail" / "ledger.db"))
    led.workspaces.add("w", str(ws))
    led.workspaces.observe("w", by="test")  # the baseline: v0
    lease = led.workspaces.acquire("w", "agent", ttl_s=3600)
    for i in range(1, versions + 1):
        out = run_fenced_step(led, "w", f"s{i}", lambda read, i=i: [
            read.read("app.py").write(f"v{i}\n".encode())], epoch=lease.epoch, run="r")
        assert out.committed
    return led, ws


def _later(led: Ledger, days: float = 40) -> int:
    return led.clock() + int(days * DAY)


def kept_but_gone(led: Ledger, policy: Policy, now_ns: int) -> list[str]:
    """The checker: versions the policy keeps whose bytes are gone (worked out from the
    events independently of `retention.plan`'s keep rule)."""
    held = {(h.scope, h.target) for h in led.holds()}
    cutoff = now_ns - int(policy.keep_days * DAY) if policy.keep_days else None
    problems = []
    with led.storage.read() as conn:
        for name in [w.name for w in led.workspaces.list() if w.root]:
            for path, versions in retention.history(led, name).items():
                for i, v in enumerate(versions):
                    if v.digest is None:
                        continue
                    row = led.find_step(v.step)
                    keep = (i == len(versions) - 1
                            or (policy.keep_versions and len(versions) - i <= policy.keep_versions)
                            or (cutoff is not None and v.time_ns >= cutoff)
                            or ("step", v.step) in held
                            or (row is not None and ("run", row.run) in held))
                    if keep and conn.blob_size(v.digest) is None:
                        problems.append(f"{name}:{path} of {v.step} (#{v.seq}) is gone")
    return problems


def _gc(led: Ledger, policy: Policy, now: int, dry_run: bool = False):  # type: ignore[no-untyped-def]
    return collect(led, grace_s=0, force=True, now_ns=now, retention=policy, dry_run=dry_run)


def test_keep_versions_releases_the_older_ones_and_gc_collects_them(tmp_path: Path) -> None:
    led, ws = _ledger(tmp_path)
    policy = Policy(keep_versions=2, source="test")
    now = _later(led)
    report = _gc(led, policy, now)
    assert report.retention is not None
    assert report.retention["released"] == 5  # v0 (baseline) .. v4; v5 and v6 kept
    assert report.collected == 5
    assert kept_but_gone(led, policy, now) == []
    assert (ws / "app.py").read_bytes() == b"v6\n"
    assert led.verify().ok
    found = audit(led, now_ns=now)
    assert found.ok, found.problems
    # the events that recorded the released versions are all still there
    assert len(retention.history(led, "w")["app.py"]) == 7
    # rewind says plainly what it cannot reach, and why
    preview = led.workspaces.rewind("w", "s2", preview=True)
    assert not preview.changes
    assert [p for p, _why in preview.unreachable] == ["app.py"]
    assert "retention policy" in preview.unreachable[0][1]
    # a kept version is still reachable
    assert led.workspaces.rewind("w", "s5", preview=True).changes[0].then is not None
    # applied again: nothing new released, no event written
    count = led.count()
    again = _gc(led, policy, now)
    assert again.retention["released"] == 0 and again.collected == 0
    assert led.count() == count + 0
    led.close()


def test_keep_days_keeps_what_is_newer_and_always_the_current_file(tmp_path: Path) -> None:
    led, _ws = _ledger(tmp_path, versions=3)
    policy = Policy(keep_days=30, source="test")
    assert _gc(led, policy, _later(led, 10)).retention["released"] == 0  # all 10 days old
    now = _later(led, 40)
    report = _gc(led, policy, now)
    assert report.retention["released"] == 3  # v0..v2; v3 is the current file
    assert kept_but_gone(led, policy, now) == []
    assert audit(led, now_ns=now).ok
    led.close()


def test_a_held_run_keeps_every_version(tmp_path: Path) -> None:
    led, _ws = _ledger(tmp_path)
    led.hold("r", reason="review")
    policy = Policy(keep_versions=1, source="test")
    now = _later(led)
    report = _gc(led, policy, now)
    assert report.retention["released"] == 1  # only the baseline's v0 (not of run r)
    assert kept_but_gone(led, policy, now) == []
    led.close()


def test_a_hold_placed_after_the_release_keeps_what_gc_has_not_collected(tmp_path: Path) -> None:
    led, _ws = _ledger(tmp_path)
    policy = Policy(keep_versions=1, source="test")
    now = _later(led)
    retention.apply(led, policy, now_ns=now)  # released, not yet collected
    led.hold("s2", scope="step")
    collect(led, grace_s=0, force=True, now_ns=now)
    assert kept_but_gone(led, policy, now) == []
    with led.storage.read() as conn:
        [v2] = [v for v in retention.history(led, "w")["app.py"] if v.step == "s2"]
        assert conn.blob_size(v2.digest) is not None
    led.close()


def test_bytes_a_kept_version_shares_are_kept(tmp_path: Path) -> None:
    """v1's content comes back as the current file of another path: releasing v1 frees
    nothing, and gc keeps the blob."""
    led, ws = _ledger(tmp_path, versions=3)
    lease = led.workspaces.acquire("w", "agent", ttl_s=3600, resume=True)
    run_fenced_step(led, "w", "copy", lambda read: [read.read("copy.txt").write(b"v1\n")],
                    epoch=lease.epoch)
    policy = Policy(keep_versions=1, source="test")
    now = _later(led)
    dry = _gc(led, policy, now, dry_run=True)
    assert dry.retention["released"] == 3 and dry.retention["releasable_blobs"] == 2
    _gc(led, policy, now)
    assert kept_but_gone(led, policy, now) == []
    assert (ws / "copy.txt").read_bytes() == b"v1\n"
    assert audit(led, now_ns=now).ok
    led.close()


def test_a_dry_run_writes_nothing_and_says_what_would_go(tmp_path: Path) -> None:
    led, _ws = _ledger(tmp_path)
    count, head = led.count(), led.head()
    policy = Policy(keep_versions=2, source="test")
    now = _later(led)
    report = _gc(led, policy, now, dry_run=True)
    assert report.retention["dry_run"] and report.retention["released"] == 5
    assert report.retention["releasable_blobs"] == 5
    assert report.remaining == 5  # the dry run counts them as gc would
    assert led.count() == count and led.head() == head
    assert kept_but_gone(led, Policy(keep_versions=7, source="t"), now) == []
    led.close()


def test_the_checker_catches_an_applier_that_releases_what_it_must_keep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    led, _ws = _ledger(tmp_path)
    policy = Policy(keep_versions=3, source="test")
    real = retention.plan

    def greedy(ledger, policy, **kw):  # type: ignore[no-untyped-def]
        return real(ledger, Policy(keep_versions=1, source="broken"), **kw)

    monkeypatch.setattr(retention, "plan", greedy)
    now = _later(led)
    _gc(led, policy, now)
    assert kept_but_gone(led, policy, now)  # v4 and v5 gone though the policy kept them
    led.close()


@pytest.mark.parametrize(("text", "says"), [
    ("", "no [history] table"),
    ("[history]\n", "keeps nothing"),
    ("[history]\nkeep_days = -1\n", "keep_days"),
    ("[history]\nkeep_days = 'x'\n", "keep_days"),
    ("[history]\nkeep_days = nan\n", "keep_days"),
    ("[history]\nkeep_versions = 1.5\n", "keep_versions"),
    ("[history]\nkeep_versions = true\n", "keep_versions"),
    ("[history]\nkeep_version = 3\n", "unknown key 'keep_version'"),
    ("[histroy]\nkeep_versions = 3\n", "unknown table 'histroy'"),
    ("[history]\nkeep_versions = 3\nworkspaces = 'w'\n", "workspaces"),
    ("[history\n", "is not TOML"),
])
def test_a_bad_policy_is_refused_naming_the_fix(tmp_path: Path, text: str, says: str) -> None:
    f = tmp_path / "retention.toml"
    f.write_text(text)
    with pytest.raises(InvalidInput) as info:
        retention.load_policy(f)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_policy_naming_a_workspace_the_ledger_lacks_changes_nothing(tmp_path: Path) -> None:
    led, _ws = _ledger(tmp_path, versions=2)
    count = led.count()
    with pytest.raises(InvalidInput, match="'nope'"):
        _gc(led, Policy(keep_versions=1, workspaces=("nope",), source="t"), _later(led))
    assert led.count() == count
    led.close()


def test_the_command_applies_the_policy_file_beside_the_ledger(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from ledger.cli import cli

    led, _ws = _ledger(tmp_path)
    db = led.path
    led.close()
    policy = tmp_path / ".steptrail" / "retention.toml"
    policy.write_text("[history]\nkeep_versions = 2\n")
    run = CliRunner().invoke
    dry = run(cli, ["--ledger", db, "gc", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "retention:" in dry.output and "would release 5 versions" in dry.output
    with Ledger.open(db) as again:
        assert not list(again.read(kind="history-released"))  # a dry run writes nothing
    off = run(cli, ["--ledger", db, "gc", "--dry-run", "--no-retention", "--json"])
    assert json.loads(off.stdout)["retention"] is None
    done = run(cli, ["--ledger", db, "gc", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["retention"]["released"] == 5
    assert doc["retention"]["policy"]["keep_versions"] == 2
    with Ledger.open(db) as again:
        assert len(list(again.read(kind="history-released"))) == 1
    other = tmp_path / "keep.toml"
    other.write_text("[history]\nkeep_versions = 'all'\n")
    for args in (["--retention", str(other)], ["--retention", str(tmp_path / "none.toml")]):
        bad = run(cli, ["--ledger", db, "gc", *args])
        assert bad.exit_code == 2, bad.output
        assert len(bad.output.strip().splitlines()) == 1 and "Traceback" not in bad.output
    both = run(cli, ["--ledger", db, "gc", "--retention", str(other), "--no-retention"])
    assert both.exit_code == 2

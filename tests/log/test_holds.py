"""Holds (ledger/holds.py, `steptrail hold`): a held run is refused by `seal` and its blobs
are kept by `gc` even after a releasing compensation (a pruned checkpoint's), until the
hold is released; the holds are events, so they survive a rebuild; the checker catches
a collector that forgets them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import Ledger, NotSealable
from ledger.cli import cli
from ledger.events import Compensated
from ledger.gc import holders
from ledger.gc.collector import collect
from ledger.runner import run_step
from ledger.seal import seal_run


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger.init(str(tmp_path / ".steptrail" / "ledger.db")) as led:
        yield led


def _pruned(ledger: Ledger) -> str:
    """A step of run 'keep' whose blob a releasing compensation lets go (as a pruned
    LangGraph checkpoint's): the digest."""
    data = b"only here " * 20
    run_step(ledger, "k1", {"out.bin": data}, run="keep")
    run_step(ledger, "other", {"x.txt": b"x"}, run="other")
    ledger.append(Compensated(step="k1", attempt=1, run="keep", release=True,
                              reason="pruned"))
    from ledger.blobs import digest_of

    return digest_of(data)


def _kept(ledger: Ledger, digest: str) -> bool:
    collect(ledger, grace_s=0, force=True)
    return ledger.workspaces.core.blob_size(digest) is not None


def test_a_held_run_is_not_sealed_until_released(ledger: Ledger) -> None:
    run_step(ledger, "a1", {"o.txt": b"1"}, run="nightly")
    hold = ledger.hold("nightly", reason="audit", by="me")
    assert ledger.hold("nightly").seq == hold.seq  # holding again: the same hold
    with pytest.raises(NotSealable, match="held"):
        seal_run(ledger, "nightly")
    assert ledger.release_hold("nightly") and not ledger.release_hold("nightly")
    assert seal_run(ledger, "nightly").events > 0


def test_a_held_step_keeps_its_run_out_of_seal(ledger: Ledger) -> None:
    run_step(ledger, "a1", {"o.txt": b"1"}, run="nightly")
    run_step(ledger, "a2", {"o.txt": b"2"}, run="nightly")
    ledger.hold("a2", scope="step")
    with pytest.raises(NotSealable, match="its step 'a2' is held"):
        seal_run(ledger, "nightly")


def test_gc_keeps_a_held_runs_released_blobs_until_the_hold_goes(ledger: Ledger) -> None:
    digest = _pruned(ledger)
    ledger.hold("keep")
    assert _kept(ledger, digest)
    ledger.rebuild()  # the holds are events: a rebuild keeps them
    assert _kept(ledger, digest)
    ledger.release_hold("keep")
    assert not _kept(ledger, digest)


def test_the_hold_checker_catches_a_collector_that_forgets_holds(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = _pruned(ledger)
    ledger.hold("keep")
    monkeypatch.setattr(holders, "_KINDS", holders.BLOB_NAMING_KINDS)  # holds unread
    assert not _kept(ledger, digest)


def test_a_rehold_after_a_release_is_a_new_hold(ledger: Ledger) -> None:
    run_step(ledger, "a1", {"o.txt": b"1"}, run="r")
    first = ledger.hold("r")
    ledger.release_hold("r")
    second = ledger.hold("r")
    assert second.n == first.n + 1 and second.seq > first.seq
    assert [h.target for h in ledger.holds()] == ["r"]


def test_the_command_line(ledger: Ledger) -> None:
    run_step(ledger, "a1", {"o.txt": b"1"}, run="nightly")
    location = str(ledger.path)
    ledger.close()
    runner = CliRunner()
    base = ["--ledger", location]
    r = runner.invoke(cli, [*base, "hold", "nightly", "--reason", "audit"])
    assert r.exit_code == 0 and "held run nightly" in r.output, r.output
    r = runner.invoke(cli, [*base, "hold", "--list", "--json"])
    [h] = json.loads(r.output)
    assert (h["scope"], h["target"], h["reason"]) == ("run", "nightly", "audit")
    r = runner.invoke(cli, [*base, "seal", "run", "nightly"])
    assert r.exit_code == 1 and "is held" in r.output, r.output
    r = runner.invoke(cli, [*base, "status"])
    assert "held (seal refuses them" in r.output and "run nightly (audit)" in r.output
    r = runner.invoke(cli, [*base, "status", "--json"])
    assert json.loads(r.output)["holds"][0]["target"] == "nightly"
    r = runner.invoke(cli, [*base, "hold", "nosuch"])
    assert r.exit_code == 2 and "no step of run" in r.output
    r = runner.invoke(cli, [*base, "hold", "--release", "nightly"])
    assert r.exit_code == 0
    r = runner.invoke(cli, [*base, "hold", "--release", "nightly"])
    assert r.exit_code == 1 and "not held" in r.output

"""`steptrail stats`: every figure checked against an independent count of the events."""

from __future__ import annotations

import json
import os
import pathlib

import msgspec
import pytest
from click.testing import CliRunner

from conftest import LedgerAt, lock_files_aside
from ledger import Ledger
from ledger.cli import cli
from ledger.errors import InvalidInput
from ledger.gc.audit import audit
from ledger.runner import run_step
from ledger.stats import BUCKETS, StatsReport, stats

DAY = BUCKETS["day"]


class Clock:
    def __init__(self, start_ns: int) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def build(path: pathlib.Path | str, clock: Clock) -> None:
    """Run r1: settled (two steps acked, one compensated); run r2: a step in flight; a
    step without a run; a file blob; two days of history."""
    with Ledger.init(path, clock=clock) as led:
        run_step(led, "a", {"out.txt": b"a" * 100}, run="r1")
        run_step(led, "b", {"big.bin": b"b" * 100_000}, run="r1")
        row = led.plan("c", run="r1", artifacts=["x"])
        led.workspaces.compensate("c", row.attempt)
        clock.now += DAY
        led.plan("d", run="r2", artifacts=["y"])
        run_step(led, "e", {"e.txt": b"e"})


def check(led: Ledger, r: StatsReport) -> list[str]:
    """What is wrong with the report, computed again from the events one by one."""
    problems = []
    rows = list(led.read())
    size = {x.seq: len(x.journal_key.encode()) + 64 for x in rows}
    with led.storage.read() as view:  # the payload lengths, from the rows as stored
        for row in view.events():
            size[row[0]] += len(row[11])
    if (r.events.count, r.events.bytes) != (len(rows), sum(size.values())):
        problems.append(f"events {r.events} vs {len(rows)}, {sum(size.values())}")
    kinds: dict[str, list[int]] = {}
    runs: dict[str, list[int]] = {}
    for x in rows:
        kinds.setdefault(x.kind, [0, 0])
        kinds[x.kind][0] += 1
        kinds[x.kind][1] += size[x.seq]
        run = getattr(x.event, "run", "")
        runs.setdefault(run, [0, 0])
        runs[run][0] += 1
        runs[run][1] += size[x.seq]
    if {k: [c.count, c.bytes] for k, c in r.by_kind.items()} != kinds:
        problems.append(f"by kind {r.by_kind} vs {kinds}")
    steps = led.steps()
    states: dict[str, int] = {}
    for s in steps:
        states[s.state] = states.get(s.state, 0) + 1
    stored: dict[str, int] = {}
    for st in steps:
        stored[st.state] = stored.get(st.state, 0) + st.stored_bytes
    if r.bytes_by_state != stored:
        problems.append(f"bytes by state {r.bytes_by_state} vs {stored}")
    if (r.steps, r.by_state) != (len(steps), states):
        problems.append(f"steps {r.steps} {r.by_state} vs {len(steps)} {states}")
    listed = {x.run: [x.events, x.event_bytes] for x in r.runs}
    if r.runs_total != len(runs) or any(listed[k] != v for k, v in runs.items() if k in listed):
        problems.append(f"runs {listed} vs {runs}")
    from ledger.seal import sealable
    settled = {c.run for c in sealable(led).runs if c.sealable}
    if any(s.state not in ("acked", "compensated", "rejected") for s in steps if s.run in settled):
        problems.append(f"a sealable run {settled} holds a step not settled")
    expect = [sum(runs[x][0] for x in settled), sum(runs[x][1] for x in settled)]
    if [r.sealable.count, r.sealable.bytes] != expect or r.sealable_runs != len(settled):
        problems.append(f"sealable {r.sealable} {r.sealable_runs} vs {expect} {settled}")
    a = audit(led)
    for name in ("inline", "files", "referenced", "pinned", "temporary"):
        bucket = getattr(a, name)
        if (r.blobs[name].count, r.blobs[name].bytes) != (bucket.count, bucket.bytes):
            problems.append(f"blobs {name} {r.blobs[name]} vs {bucket}")
    if sum(g.events for g in r.growth) != len(rows):
        problems.append("growth does not add up to the events")
    return problems


@pytest.fixture
def filled(tmp_path: pathlib.Path, ledger_at: LedgerAt) -> pathlib.Path | str:
    """The ledger `build` makes, at tmp_path/ledger.db on SQLite."""
    path = ledger_at(tmp_path / "ledger.db")
    build(path, Clock(1_800_000_000 * 10**9))
    return path


@pytest.mark.sqlite_only
def test_every_figure_agrees_with_the_events(filled: pathlib.Path | str) -> None:
    with Ledger.open(filled, readonly=True) as led:
        r = stats(led)
        assert check(led, r) == []
        assert r.runs_total == 3 and r.steps == 5
        assert r.by_state == {"acked": 3, "compensated": 1, "planned": 1}
        assert [x.run for x in r.runs if x.settled] == ["r1"] and r.sealable_runs == 1
        assert r.runs[0].run == "r1"  # the largest first
        assert [x.committed_bytes for x in r.runs if x.run == "r1"] == [100_100]
        assert r.blobs["files"].count == 1 and r.blobs["files"].bytes == 100_000
        assert [g.events for g in r.growth] == [sum(1 for x in led.read() if x.time_ns < r.growth[1].start_ns),
                                                 r.growth[1].events]
        assert len(r.growth) == 2 and r.growth[1].start_ns - r.growth[0].start_ns == DAY
        assert r.file_bytes >= os.path.getsize(filled)


def test_the_checker_catches_a_wrong_figure(filled: pathlib.Path | str) -> None:
    """The negative control: each kind of wrong report is named."""
    with Ledger.open(filled, readonly=True) as led:
        r = stats(led)
        wrong = [
            msgspec.structs.replace(r, events=msgspec.structs.replace(r.events, bytes=1)),
            msgspec.structs.replace(r, by_state={**r.by_state, "acked": 2}),
            msgspec.structs.replace(r, sealable_runs=2),
            msgspec.structs.replace(r, bytes_by_state={**r.bytes_by_state, "acked": 0}),
            msgspec.structs.replace(r, blobs={**r.blobs, "files": r.blobs["inline"]}),
            msgspec.structs.replace(r, growth=r.growth[:1]),
        ]
        for report in wrong:
            assert check(led, report), report


def test_top_and_buckets(filled: pathlib.Path | str) -> None:
    with Ledger.open(filled, readonly=True) as led:
        assert len(stats(led, top=1).runs) == 1 and len(stats(led, top=0).runs) == 3
        assert len(stats(led, by="week").growth) in (1, 2)
        assert len(stats(led, by="hour").growth) == 2
        for bad in ({"by": "month"}, {"top": -1}, {"top": True}):
            with pytest.raises(InvalidInput):
                stats(led, **bad)  # type: ignore[arg-type]


def test_an_empty_ledger(tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    with Ledger.init(ledger_at(tmp_path / "l.db")) as led:
        r = stats(led)
        assert check(led, r) == []
        assert r.steps == 0 and r.runs == [] and r.sealable.count == 0


def test_cli_text_json_and_read_only(filled: pathlib.Path | str, tmp_path: pathlib.Path) -> None:
    runner = CliRunner()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    text = runner.invoke(cli, ["--ledger", str(filled), "stats"])
    assert text.exit_code == 0, text.output
    assert "sealable: 1 of 3 runs" in text.stdout and "growth by day:" in text.stdout
    assert "(no run)" in text.stdout
    # what is not sealable, and why, in words; and per run in --json
    assert "not sealable: " in text.stdout and "1 run with a step not yet acked" in text.stdout
    done = runner.invoke(cli, ["--ledger", str(filled), "stats", "--json", "--top", "0"])
    data = json.loads(done.stdout)
    assert done.exit_code == 0 and data["runs_total"] == 3 and len(data["runs"]) == 3
    assert data["sealable_runs"] == 1
    assert data["not_sealable"] == {"no-run": 1, "unsettled": 1}
    why = {r["run"]: r["why_not"] for r in data["runs"]}
    assert [run for run, w in why.items() if w is None] == [r["run"] for r in data["runs"] if r["settled"]]
    assert any(w and "is planned" in w or w and "is fenced" in w for w in why.values()), why
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert lock_files_aside(after) == lock_files_aside(before)
    bad = runner.invoke(cli, ["--ledger", str(filled), "stats", "--by", "month"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.output


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True


def test_holds_and_released_versions_are_shown(tmp_path: pathlib.Path) -> None:
    """A held run is marked in the runs table and listed under holds, in text and --json;
    a hostile reason is shown escaped, on one line."""
    db = str(tmp_path / "ledger.db")
    with Ledger.init(db) as led:
        run_step(led, "s1", {"a.txt": b"x"}, run="nightly")
        led.hold("nightly", reason="audit\x1b[31m\nnext", by="ops")
        led.hold("s1", scope="step")
        report = stats(led)
    assert [(h.scope, h.target) for h in report.holds] == [("run", "nightly"), ("step", "s1")]
    assert [r.held for r in report.runs if r.run == "nightly"] == [True]
    assert report.history_released == 0
    out = CliRunner().invoke(cli, ["--ledger", db, "stats"])
    assert out.exit_code == 0, out.output
    [line] = [ln for ln in out.output.splitlines() if "holds (2" in ln]
    assert "run nightly" in line and "step s1" in line and "\x1b" not in out.output
    assert "(held)" in out.output
    doc = json.loads(CliRunner().invoke(cli, ["--ledger", db, "stats", "--json"]).stdout)
    assert doc["holds"][0]["reason"].startswith("audit") and doc["history_released"] == 0

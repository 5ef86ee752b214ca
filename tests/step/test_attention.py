"""What needs a person after a night of agents (`ledger.attention`, issue 41): one
definition, told the same by `status`, the UI's overview and the MCP server.

The demo's night held a refused write (s04), an undo after failing tests (s05) and a
killed worker whose attempts the next lease settled (s06, s07), each retried to a
commit, and an artifact step left planned (notes): the overview said "acked 11,
planned 1". Held here: those are named, the retried ones as resolved; a refusal or
undo nobody retried stays open with its fix; an undo that left a person's change is
its own open item; and the three surfaces list the same items.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from ledger import Ledger, run_fenced_step
from ledger.attention import attention

STEPTRAIL = str(Path(sys.executable).parent / "steptrail")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = tmp_path_factory.mktemp("demo") / "d"
    done = subprocess.run([STEPTRAIL, "demo", "--keep", str(keep)], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return keep / ".steptrail" / "ledger.db"


def by_subject(items: list[Any]) -> dict[tuple[str, str], Any]:
    return {(i.kind, i.subject): i for i in items}


def test_the_demos_night_is_named(demo: Path) -> None:
    with Ledger.open(str(demo), readonly=True) as led:
        items = attention(led)
    got = by_subject(items)
    assert got[("refused", "s04")].resolved.startswith("attempt 2 committed")
    assert "pre_hash" in got[("refused", "s04")].reason
    assert got[("compensated", "s05")].resolved and "test_calc.py failed" in \
        got[("compensated", "s05")].reason
    settled = got[("settled", "s06")]
    assert settled.resolved and "settled by epoch 2" in settled.reason
    notes = got[("in-flight", "notes")]
    assert not notes.resolved and notes.fix.startswith("step store notes")
    # open first
    assert [i.resolved == "" for i in items] == sorted((i.resolved == "" for i in items),
                                                       reverse=True)
    with Ledger.open(str(demo), readonly=True) as led:
        assert attention(led, resolved=False) == [notes]


def test_status_and_mcp_tell_the_same_items(demo: Path) -> None:
    pytest.importorskip("mcp", reason="the [mcp] extra")
    from ledger.mcp.service import ClientView, FileTools

    with Ledger.open(str(demo), readonly=True) as led:
        lib = [(i.kind, i.subject, i.resolved) for i in attention(led)]
    r = run_cli(["--ledger", str(demo), "status", "--json"])
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert [(i["kind"], i["subject"], i["resolved"] or "") for i in doc["attention"]] == lib
    text = run_cli(["--ledger", str(demo), "status"]).out
    assert "resolved (a later attempt committed): s04 (refused)" in text
    with Ledger.open(str(demo)) as led:
        tools = FileTools(led, ["repo"])
        try:
            data = tools.status(ClientView()).data
        finally:
            tools.close() if hasattr(tools, "close") else None
    assert [(i["kind"], i["subject"], i["resolved"] or "") for i in data["attention"]] == lib


def _world(tmp_path: Path) -> tuple[Ledger, Path, int]:
    ws = tmp_path / "w"
    ws.mkdir()
    (ws / "a.txt").write_text("a0\n")
    led = Ledger.init(str(tmp_path / ".steptrail" / "ledger.db"))
    led.workspaces.add("w", str(ws))
    epoch = led.workspaces.acquire("w", holder="agent", ttl_s=3600).epoch
    return led, ws, epoch


def test_a_refusal_nobody_retried_is_open_with_its_fix(tmp_path: Path) -> None:
    """The checker of "resolved": a refusal with no later commit is open (a variant
    that called every refusal resolved, or dropped open ones, fails here)."""
    led, ws, epoch = _world(tmp_path)
    try:
        def plan(r: Any) -> list[Any]:
            got = r.read("a.txt")
            (ws / "a.txt").write_text("a person's edit\n")  # between the read and the apply
            return [got.write(b"agent\n")]

        out = run_fenced_step(led, "w", "s1", plan, epoch=epoch)
        assert out.status.value != "committed"
        items = by_subject(attention(led))
        refused = items[("refused", "s1")]
        assert refused.resolved == "" and refused.fix == "step replan s1"
        # the retry commits: the same refusal is now resolved
        run_fenced_step(led, "w", "s1", lambda r: [r.read("a.txt").write(b"agent\n")],
                        epoch=epoch).raise_for_status()
        assert by_subject(attention(led))[("refused", "s1")].resolved.startswith(
            "attempt 2 committed")
    finally:
        led.close()


def test_an_undo_that_left_a_persons_change_is_open(tmp_path: Path) -> None:
    led, ws, epoch = _world(tmp_path)
    try:
        run_fenced_step(led, "w", "s1", lambda r: [r.read("a.txt").write(b"agent\n")],
                        epoch=epoch).raise_for_status()
        (ws / "a.txt").write_text("a person changed it after\n")
        led.workspaces.compensate("s1", epoch=epoch, reason="tests failed")
        items = by_subject(attention(led))
        half = items[("half-undone", "s1")]
        assert not half.resolved and "a.txt" in half.reason
        assert not items[("compensated", "s1")].resolved
        assert (ws / "a.txt").read_text() == "a person changed it after\n"
    finally:
        led.close()

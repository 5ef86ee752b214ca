"""agmi (PyPI agent-memory-integrity), the outside tamper-evidence suite, against steptrail.

agmi's nine at-rest edits (T1 content tamper, T2 tail truncation, T3 middle deletion,
T4 reordering, T5 forged insertion, T6 cross-context replay, T7 rollback replay,
T8 metadata tamper, T9 snapshot rollback) run through agmi's own runner
(``agmi.check.run``: its controls, its landed-edit guard, its verdict words) against the
adapter in ``tests/log/tamper_adapter.py``, in two configurations:

- ``steptrail+witness``: a witness on another directory. All nine are caught; the tail
  and rollback edits (T2, T7, T9) are refused by the open itself (``WitnessMismatch``,
  read-write and read-only, every file byte-identical), and ``verify`` names all nine.
- ``steptrail``: no witness. ``verify`` names seven; it cannot see T2 (the tail cut
  off) or T9 (an older genuine copy restored), which no chain kept inside the store can.

Verdicts: REJECTED = refused on the read path (the open); REPORTED = only ``verify`` (an
audit call) named it; ACCEPTED = served as genuine. ``pytest -s tests/log/test_tamper_evidence.py``
prints agmi's tables. The stronger attacker at the end (not one of agmi's edits)
recomputes the keyless chain.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest

agmi_check = pytest.importorskip(
    "agmi.check", reason="agmi is a test-only dependency: pip install -e '.[test]'")

from tamper_adapter import (
    CTX,
    SteptrailAdapter,
    SteptrailWitnessAdapter,
    event_for,
    rechain,
)

from ledger.witness import WitnessMismatch

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["tamper", "truncate", "delete_middle", "reorder", "forge", "cross_replay",
           "rollback_replay", "metadata_tamper", "snapshot_rollback"]
TAIL_AND_ROLLBACK = ["truncate", "forge", "rollback_replay", "snapshot_rollback"]  # T2, T5, T7, T9

#: agmi's verdict per edit, pinned: docs/guarantees.md's table is rendered from these. The open
#: re-hashes the rows from the witnessed head on and requires a tail past it to carry the
#: witness key's tag, so T5 (a forged insertion at the tail) is refused at open too.
EXPECTED = {
    "steptrail+witness": {
        "tamper": "REPORTED", "truncate": "REJECTED", "delete_middle": "REPORTED",
        "reorder": "REPORTED", "forge": "REJECTED", "cross_replay": "REPORTED",
        "rollback_replay": "REJECTED", "metadata_tamper": "REPORTED",
        "snapshot_rollback": "REJECTED",
    },
    "steptrail": {
        "tamper": "REPORTED", "truncate": "ACCEPTED", "delete_middle": "REPORTED",
        "reorder": "REPORTED", "forge": "REPORTED", "cross_replay": "REPORTED",
        "rollback_replay": "REPORTED", "metadata_tamper": "REPORTED",
        "snapshot_rollback": "ACCEPTED",
    },
}
#: What verify names for each edit (with a witness, T2/T7/T9 read through
#: witness_check=False after the open refused).
VERIFY_NAMES = {
    "tamper": {"chain"}, "truncate": {"head", "witness"}, "delete_middle": {"chain", "seq"},
    "reorder": {"chain"}, "forge": {"chain"}, "cross_replay": {"chain", "row"},
    "rollback_replay": {"chain", "row"}, "metadata_tamper": {"chain"},
    "snapshot_rollback": {"head", "witness"},
}


# --- running agmi --------------------------------------------------------------------


def _run(adapter: SteptrailAdapter) -> list[dict[str, Any]]:
    """agmi's own runner; each row gets the adapter's outcome of that attack."""
    rows = agmi_check.run(adapter)
    assert [r["attack"] for r in rows] == ATTACKS  # agmi 0.6's at-rest list, T1..T9
    assert len(adapter.history) == len(rows)  # one setup() per attack, in order
    for row, outcome in zip(rows, adapter.history, strict=True):
        row["outcome"] = outcome
    return rows


@pytest.fixture(scope="module")
def measured() -> dict[str, list[dict[str, Any]]]:
    return {a.name: _run(a) for a in (SteptrailWitnessAdapter(), SteptrailAdapter())}


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {r["attack"]: r["verdict"] for r in rows}


def _how(row: dict[str, Any]) -> str:
    o = row["outcome"]
    parts = []
    if o.refused_type is not None:
        parts.append(f"open refused ({o.refused_type.__name__})")
    if o.checks:
        parts.append("verify: " + ", ".join(sorted(o.checks)))
    return "; ".join(parts) or "opened and verified clean"


def combined_markdown(measured: dict[str, list[dict[str, Any]]]) -> str:
    """One table for docs/guarantees.md: agmi's edit labels and verdict words, both configurations."""
    w, plain = measured["steptrail+witness"], measured["steptrail"]
    version = importlib.metadata.version("agent-memory-integrity")
    lines = [
        f"| agmi {version} edit | with a witness | without a witness |",
        "|---|---|---|",
    ]
    for a, b in zip(w, plain, strict=True):
        lines.append(f"| {a['edit']} | {a['verdict']}: {_how(a)} | {b['verdict']}: {_how(b)} |")
    return "\n".join(lines)


def agmi_step_summary(tool: str, rows: list[dict[str, Any]], tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> str:
    """agmi-check's own Markdown (its GitHub step summary), verbatim."""
    summary = tmp_path / f"{tool}.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    agmi_check.gha_report(tool, rows)
    return summary.read_text()


# --- agmi's nine edits ---------------------------------------------------------------


def test_agmi_prints_its_tables(measured: dict[str, list[dict[str, Any]]], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    for tool, rows in measured.items():
        print(f"\n{agmi_check.render(tool, rows)}")
        for r in rows:
            print(f"  {r['attack']:<18} {r['detail'][:160]}")
    print()
    for tool, rows in measured.items():
        print(agmi_step_summary(tool, rows, tmp_path, monkeypatch))
    print(combined_markdown(measured))


def test_every_edit_landed_and_was_evaluated(measured: dict[str, list[dict[str, Any]]]) -> None:
    """No cell is agmi's ERROR (the edit did not land) or NOT EVALUABLE (a hook missing or
    a control failed): every verdict is a measurement."""
    for rows in measured.values():
        bad = {r["attack"]: r["detail"] for r in rows if r["verdict"] in ("ERROR", "NOT EVALUABLE")}
        assert not bad


def test_with_a_witness_all_nine_are_caught(measured: dict[str, list[dict[str, Any]]]) -> None:
    """Every edit is refused at open (REJECTED) or named by verify (REPORTED), and verify
    names every one of the nine, whether or not the open refused."""
    rows = measured["steptrail+witness"]
    assert _verdicts(rows) == EXPECTED["steptrail+witness"]
    for r in rows:
        o = r["outcome"]
        assert VERIFY_NAMES[r["attack"]] <= o.checks, (r["attack"], _how(r))
        if r["verdict"] == "REJECTED":
            assert o.refused_type is WitnessMismatch and o.untouched is True, r["attack"]
        else:
            assert o.refused is None, r["attack"]


@pytest.mark.parametrize("attack", TAIL_AND_ROLLBACK)
def test_with_a_witness_tail_and_rollback_edits_are_refused_at_open(
        measured: dict[str, list[dict[str, Any]]], attack: str) -> None:
    """T2, T5, T7, T9: the open itself fails closed, read-write and read-only, and leaves
    the ledger, its WAL and the witness byte-identical (a -shm aside)."""
    row = next(r for r in measured["steptrail+witness"] if r["attack"] == attack)
    o = row["outcome"]
    assert o.refused_type is WitnessMismatch, o.refused
    assert o.refused_readonly is WitnessMismatch
    assert o.untouched is True
    assert row["verdict"] == "REJECTED"
    # and verify, reporting instead, names it (a forged tail breaks the chain, not the head)
    assert "witness" in o.checks and ({"head", "chain"} & o.checks)


def test_without_a_witness_only_the_cut_tail_and_the_rolled_back_copy_pass(
        measured: dict[str, list[dict[str, Any]]]) -> None:
    rows = measured["steptrail"]
    assert _verdicts(rows) == EXPECTED["steptrail"]
    accepted = {r["attack"] for r in rows if r["verdict"] == "ACCEPTED"}
    assert accepted == {"truncate", "snapshot_rollback"}
    for r in rows:
        assert r["outcome"].refused is None  # nothing to refuse against
        if r["attack"] in accepted:
            assert not r["outcome"].findings  # verify is clean: it cannot see these
        else:
            assert VERIFY_NAMES[r["attack"]] <= r["outcome"].checks, r["attack"]


def test_the_careful_attacker_left_no_projection_evidence_for_the_cut_tail(
        measured: dict[str, list[dict[str, Any]]]) -> None:
    """The ACCEPTED cells are not an artifact of a sloppy edit: the attacker refolded the
    projections after cutting the tail, so only the chain could have told."""
    for rows in measured.values():
        trunc = next(r for r in rows if r["attack"] == "truncate")
        assert trunc["outcome"].projections_rederived is True


def test_guarantees_agmi_table_is_current(measured: dict[str, list[dict[str, Any]]]) -> None:
    """docs/guarantees.md's agmi table (between the agmi markers) is what this run renders."""
    text = (ROOT / "docs" / "guarantees.md").read_text()
    found = re.search(r"<!-- agmi:begin -->\n(.*?)\n<!-- agmi:end -->", text, re.DOTALL)
    assert found is not None, "docs/guarantees.md lost its <!-- agmi:begin --> … <!-- agmi:end --> markers"
    assert found[1].strip() == combined_markdown(measured)


# --- beyond agmi: the attacker who recomputes the chain ------------------------------
#
# agmi's edits copy integrity material and never recompute it. The chain is keyless
# sha256 seeded by the ledger id, which the file itself holds, so anyone with the file
# can recompute it after an edit.


@pytest.fixture
def store(request: pytest.FixtureRequest):
    adapter = request.param()
    adapter.setup()
    adapter.seed(5)
    try:
        yield adapter
    finally:
        adapter.teardown()


def _edit_middle_and_rechain(conn) -> None:
    seq = conn.execute("SELECT seq FROM events ORDER BY seq LIMIT 1 OFFSET 2").fetchone()[0]
    conn.execute("UPDATE events SET payload ="
                 " CAST(replace(CAST(payload AS TEXT), '.md\"', '.TAMPERED.md\"') AS BLOB)"
                 " WHERE seq = ?", (seq,))
    rechain(conn)


@pytest.mark.parametrize("store", [SteptrailWitnessAdapter], indirect=True)
def test_with_a_witness_a_rechained_edit_is_refused_at_open(store: SteptrailAdapter) -> None:
    store.edit(_edit_middle_and_rechain)
    store.reload()
    assert store.outcome.refused_type is WitnessMismatch and store.outcome.untouched
    assert store.verify() is False and "witness" in store.outcome.checks


@pytest.mark.parametrize("store", [SteptrailAdapter], indirect=True)
def test_without_a_witness_a_rechained_edit_is_invisible(store: SteptrailAdapter) -> None:
    """The limit docs/guarantees.md must state: without an anchor, verify names an edit only if its
    author did not recompute the chain."""
    store.edit(_edit_middle_and_rechain)
    store.reload()
    assert store.verify() is True  # a documented limitation, not a pass


def _edit_tail_payload(conn) -> None:
    conn.execute("UPDATE events SET payload ="
                 " CAST(replace(CAST(payload AS TEXT), '.md\"', '.TAMPERED.md\"') AS BLOB)"
                 " WHERE seq = (SELECT max(seq) FROM events)")


def _edit_tail_time(conn) -> None:
    conn.execute("UPDATE events SET time_ns = time_ns + 1"
                 " WHERE seq = (SELECT max(seq) FROM events)")


@pytest.mark.parametrize("edit", [_edit_tail_payload, _edit_tail_time], ids=["payload", "time"])
@pytest.mark.parametrize("store", [SteptrailWitnessAdapter], indirect=True)
def test_a_tail_edit_that_keeps_the_hash_column_is_refused_at_open(
        store: SteptrailAdapter, edit) -> None:
    store.edit(edit)
    store.reload()
    assert store.verify() is False and "chain" in store.outcome.checks  # verify sees it
    assert store.outcome.refused_type is WitnessMismatch and store.outcome.untouched


def _forge_rechained_tail(conn) -> None:
    """Three forged events after the witnessed head, one shared time_ns (so they count as
    one commit), the chain recomputed."""
    top, last_ns = conn.execute(
        "SELECT seq, time_ns FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    for k in range(3):
        ev = event_for(CTX, f"forged-{k}")
        row = SteptrailAdapter.row_of(ev, seq=top + 1 + k, time_ns=last_ns + 1_000_000)
        conn.execute(f"INSERT INTO events({', '.join(row)})"
                     f" VALUES ({', '.join('?' for _ in row)})", tuple(row.values()))
    rechain(conn)


@pytest.mark.parametrize("store", [SteptrailWitnessAdapter], indirect=True)
def test_a_forged_rechained_tail_one_commit_ahead_is_refused_at_open(
        store: SteptrailAdapter) -> None:
    store.edit(_forge_rechained_tail)
    assert len(store.read_all_raw()) == 5 + 3  # the forged rows are in the file
    store.reload()
    assert store.outcome.refused_type is WitnessMismatch and store.outcome.untouched
    assert store.verify() is False, "the forged tail opened and verified clean"

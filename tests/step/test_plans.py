"""Plan files in the library (`ledger.plans`): `load_plan`, and `check_settled`
(`ledger.workspaces`), the rules ``steptrail step plan`` / ``step apply`` follow, without
the command line."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import pytest

import ledger
from ledger import (ContentFileEscapes, InvalidInput, OperatorOnly, Plan, StepPlan, Unsettled,
                    Write, check_settled, load_plan)
from ledger.plans import INPUT_READ_MAX


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_one_step_from_bytes() -> None:
    plan = load_plan(json.dumps({"step": "s1", "plan_rev": 4, "writes": [
        {"path": "app.py", "base_rev": 0, "pre_hash": None, "content": "x"},
        {"path": "old.txt", "pre_hash": _h("v0"), "delete": True}]}).encode())
    assert plan == Plan([StepPlan("s1", (Write("app.py", b"x", None, 0),
                                         Write("old.txt", None, _h("v0"), None)), (), "")],
                        "", 4)


def test_a_batch_from_its_file_reads_content_files_beside_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "big.bin").write_bytes(b"\x00\x01")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"run": "r1", "steps": [
        {"step": "s1", "writes": [{"path": "a", "pre_hash": None, "content_b64": "aGk="}]},
        {"step": "s2", "run": "r2", "artifacts": ["log.txt"],
         "writes": [{"path": "b", "pre_hash": None, "content_file": "out/big.bin"}]}]}))
    with load_plan(path) as plan:
        assert [(s.step, s.run, s.writes[0].content) for s in plan.steps] == [
            ("s1", "r1", b"hi"), ("s2", "r2", b"\x00\x01")]
        assert plan.steps[1].artifacts == ("log.txt",) and plan.run == "r1"


def test_a_large_content_file_stays_open_until_the_plan_is_closed(tmp_path: pathlib.Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * (INPUT_READ_MAX + 1))
    plan = load_plan(json.dumps({"step": "s", "writes": [
        {"path": "a", "pre_hash": None, "content_file": "big"}]}).encode(), str(tmp_path))
    content = plan.steps[0].writes[0].content
    assert not isinstance(content, bytes) and not content.closed
    plan.close()
    assert content.closed


@pytest.mark.parametrize("doc, error, says", [
    (b"", InvalidInput, "the plan is empty"),
    (b"{", InvalidInput, "not JSON"),
    (b"[]", InvalidInput, "must be a JSON object"),
    (b'{"step": "s", "writes": [{"path": "a"}]}', InvalidInput, "pre_hash"),
    (b'{"step": "s", "writes": [{"path": "a", "pre_hash": null}]}', InvalidInput,
     "give exactly one of"),
    (b'{"step": "s", "bogus": 1}', InvalidInput, "bogus"),
    (b'{"step": "s", "fence": "none"}', OperatorOnly, "fence='none' to run_fenced_step"),
    (b'{"steps": [{"step": "s"}], "journal": false}', OperatorOnly, "journal=False"),
    (b'{"step": "s", "writes": [{"path": "a", "pre_hash": null, "content_file": "../x"}]}',
     ContentFileEscapes, ".."),
])
def test_a_bad_plan_is_a_typed_error(tmp_path: pathlib.Path, doc: bytes,
                                     error: type[Exception], says: str) -> None:
    with pytest.raises(error) as got:
        load_plan(doc, str(tmp_path))
    assert says in str(got.value)
    if error is OperatorOnly:  # the command line names its flag
        assert got.value.flag in got.value.cli_message
    assert os.listdir(tmp_path) == []  # nothing written


def test_a_plan_file_that_is_not_a_regular_file_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidInput, match="not a regular file"):
        load_plan(tmp_path)
    with pytest.raises(InvalidInput, match="plan file"):
        load_plan(tmp_path / "missing.json")


class _Ledger:
    """The one call `check_settled` makes: `ledger.workspaces.unsettled`."""

    def __init__(self, pending: list[str]) -> None:
        self.pending, self.asked = pending, []
        self.workspaces = self  # `ledger.workspaces`: this fake answers for both

    def unsettled(self, workspace: str, epoch: int) -> list[str]:
        self.asked.append((workspace, epoch))
        return self.pending


def test_new_work_waits_for_the_older_epochs() -> None:
    fake = _Ledger(["s1", "s2"])
    with pytest.raises(Unsettled) as got:
        check_settled(fake, "w", 3)  # type: ignore[arg-type]
    assert got.value.workspace == "w" and got.value.steps == ["s1", "s2"]
    with pytest.raises(Unsettled) as got:
        check_settled(fake, "w", 3, but="s1")  # type: ignore[arg-type]
    assert got.value.steps == ["s2"]
    check_settled(_Ledger(["s1"]), "w", 3, but="s1")  # type: ignore[arg-type]
    check_settled(_Ledger([]), "w", 3)  # type: ignore[arg-type]
    assert fake.asked == [("w", 3), ("w", 3)]


def test_the_plan_api_is_public() -> None:
    assert {"Plan", "load_plan", "check_settled"} <= set(ledger.__all__)



def test_check_settled_still_imports_from_plans() -> None:
    """It moved beside the workspaces it asks; the old import still works."""
    from ledger.plans import check_settled as old
    from ledger.workspaces import check_settled as new

    assert old is new is ledger.check_settled

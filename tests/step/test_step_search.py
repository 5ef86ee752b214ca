"""`Ledger.steps(contains=, limit=)`: the steps whose id holds a text, found by the store
(issue 41: the UI's search read every step row into Python — 7.5 s on a million
events). Case-sensitive, no wildcards (`%` and `_` are themselves), the same on both
stores."""

from __future__ import annotations

import pytest

from ledger import InvalidInput, Ledger

BOTH_STORES = True

IDS = ["alpha-1", "beta-2", "ALPHA-3", "a%b", "a_b", "xalphax"]


def ids(rows: list) -> list[str]:
    return [r.step_id for r in rows]


def test_steps_whose_id_holds_a_text(ledger_location: str) -> None:
    with Ledger.init(ledger_location) as led:
        for step in IDS:
            led.plan(step)
        led.publish("beta-2")
        assert ids(led.steps(contains="alpha")) == ["alpha-1", "xalphax"]
        assert ids(led.steps(contains="%")) == ["a%b"]
        assert ids(led.steps(contains="_")) == ["a_b"]
        assert ids(led.steps(contains="a", limit=2)) == ["alpha-1", "beta-2"]
        assert ids(led.steps("planned", contains="2")) == []
        assert ids(led.steps("manifest-published", contains="2")) == ["beta-2"]
        assert led.steps(contains="nothing such") == []
        assert ids(led.steps(limit=0)) == []
        for bad in ({"contains": "x" * 257}, {"limit": -1}, {"limit": True}):
            with pytest.raises(InvalidInput):
                led.steps(**bad)  # type: ignore[arg-type]

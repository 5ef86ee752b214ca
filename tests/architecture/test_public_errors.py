"""Every error a public call can raise is importable from `ledger`, lives in
`ledger.errors`, and is documented in docs/cli-json.md "Errors" under its exit code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import ledger
from ledger.errors import EXIT_ENVIRONMENT, EXIT_NO, EXIT_USAGE, LedgerError, ProtocolRefused

ROOT = Path(__file__).resolve().parents[2]


def error_classes() -> dict[str, type[LedgerError]]:
    """Every LedgerError subclass defined in any module of the package."""
    found: dict[str, type[LedgerError]] = {}
    for info in pkgutil.walk_packages(ledger.__path__, "ledger."):
        if info.name == "ledger.__main__":
            continue  # running it is the command line
        for obj in vars(importlib.import_module(info.name)).values():
            if inspect.isclass(obj) and issubclass(obj, LedgerError):
                found[obj.__name__] = obj
    return found


def documented_codes(doc: str) -> dict[str, int]:
    """Error type -> the exit code whose list in the "Errors" section names it."""
    section = doc[doc.index("\n## Errors"):]
    section = section[:section.index("\n## ", 1)]
    codes: dict[str, int] = {}
    parts = re.split(r"^- exit ([123])\b", section, flags=re.M)
    for code, body in zip(parts[1::2], parts[2::2], strict=True):
        for name in re.findall(r"`([A-Z][A-Za-z]+)`", body):
            codes.setdefault(name, int(code))
    return codes


def problems(classes: dict[str, type[LedgerError]], doc: str) -> list[str]:
    codes = documented_codes(doc)
    out = []
    for name, cls in sorted(classes.items()):
        if cls.__module__ != "ledger.errors":
            out.append(f"{name} is defined in {cls.__module__}, not ledger.errors")
        if getattr(ledger, name, None) is not cls or name not in ledger.__all__:
            out.append(f"{name} is not exported from ledger")
        if name not in codes:
            out.append(f"{name} is not documented in docs/cli-json.md Errors")
        elif codes[name] != cls.exit_code:
            out.append(f"{name} is documented under exit {codes[name]}, raises {cls.exit_code}")
    return out


def test_every_error_is_public_and_documented_with_its_exit_code() -> None:
    classes = error_classes()
    assert len(classes) >= 40  # the walk found the package's errors
    assert problems(classes, (ROOT / "docs" / "cli-json.md").read_text()) == []


def test_the_check_catches_a_hidden_misfiled_or_undocumented_error() -> None:
    """Negative control: an error defined elsewhere, not exported, undocumented — and
    one documented under the wrong exit code — are each reported."""

    class Hidden(ProtocolRefused):
        pass

    doc = (ROOT / "docs" / "cli-json.md").read_text()
    found = problems({"Hidden": Hidden}, doc)
    assert any("not ledger.errors" in p for p in found)
    assert any("not exported" in p for p in found)
    assert any("not documented" in p for p in found)
    moved = doc.replace("- exit 3, the environment failed", "- exit 3, moved: `StaleEpoch`; the environment failed")
    moved = moved.replace("  - `StaleEpoch`", "  - `Stale`", 1)
    assert problems({"StaleEpoch": ledger.StaleEpoch}, moved) == [
        "StaleEpoch is documented under exit 3, raises 1"]


def test_exit_codes_are_the_three_families() -> None:
    for cls in error_classes().values():
        assert cls.exit_code in (EXIT_NO, EXIT_USAGE, EXIT_ENVIRONMENT), cls


def test_every_error_type_is_documented() -> None:
    doc = (ROOT / "docs" / "cli-json.md").read_text()
    section = doc[doc.index("## Errors"):]
    section = section[:section.index("\n## ", 4)] if "\n## " in section[4:] else section
    # every module's own LedgerError types (not a subclass a test made, as the one above)
    names = set(error_classes()) | {"LedgerError", "UsageError"}
    assert {"StaleEpoch", "GcRefused", "WitnessMismatch"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"error types not in docs/cli-json.md 'Errors': {missing}"
    for listed in ("StaleEpoch", "Unsettled", "ReplanRefused", "LeaseHeld"):
        assert listed in names
    assert re.search(r'"ok": false, "error": \{"type"', section)

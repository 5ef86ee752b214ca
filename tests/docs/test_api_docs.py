"""The API reference (tools/build_api_docs.py) builds offline with no broken link, shows
every exported name, and every exported name's docstring has an example that runs.

Needs pdoc (``pip install pdoc``); without it these tests skip, unless
STEPTRAIL_REQUIRE_DOCS=1 (CI), where a missing pdoc (or a missing ledger.langgraph
extra) fails them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("STEPTRAIL_REQUIRE_DOCS") == "1"

if importlib.util.find_spec("pdoc") is None and not REQUIRED:
    pytest.skip("pdoc is not installed (pip install pdoc) to build the API reference",
                allow_module_level=True)

sys.path.insert(0, str(ROOT / "tools"))
import build_api_docs as api  # noqa: E402

import ledger  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("api")
    return out, api.build(out, require_optional=REQUIRED)


def test_the_reference_has_no_broken_link_and_loads_nothing_remote(
        built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    report = api.check_links(out)
    assert report.pages >= 2 and report.links > 100
    assert report.broken == []
    assert report.remote_assets == []
    assert all(url.startswith("https://") for url in report.external), report.external


def test_every_exported_name_is_in_the_reference(built: tuple[Path, dict[str, Any]]) -> None:
    out, modules = built
    page = api._parse(out / "ledger.html")
    assert sorted(ledger.__all__) == sorted(modules["ledger"].obj.__all__)
    missing = [name for name in ledger.__all__ if name not in page.ids]
    assert missing == []
    if "ledger.langgraph" in modules:
        page = api._parse(out / "ledger" / "langgraph.html")
        assert [n for n in modules["ledger.langgraph"].obj.__all__ if n not in page.ids] == []


def test_every_exported_name_has_a_docstring_with_an_example(
        built: tuple[Path, dict[str, Any]]) -> None:
    _, modules = built
    assert api.check_docstrings(modules) == []


def test_the_examples_run(built: tuple[Path, dict[str, Any]]) -> None:
    _, modules = built
    failures = api.run_examples(modules)
    assert not failures, "\n".join(failures)


def test_pending_entries_are_not_stale(built: tuple[Path, dict[str, Any]]) -> None:
    """A name owed an example leaves PENDING_EXAMPLES once it has one."""
    _, modules = built
    have = {full for full, obj, doc in api.exported(modules)
            if api._runnable(api.examples(api.own_docstring(obj, doc), full))}
    assert sorted(set(api.PENDING_EXAMPLES) & have) == []


# --- the checkers catch what they are for --------------------------------------------------


def test_the_link_checker_catches_broken_links_and_remote_assets(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.html").write_text(
        '<a id="top" href="#top">ok</a> <a href="sub/b.html#there">ok</a>'
        '<a href="#nowhere">x</a> <a href="missing.html">x</a> <a href="sub/b.html#gone">x</a>'
        '<a href="https://example.org/">external</a>'
        '<script src="https://cdn.example.org/x.js"></script>'
        '<style>@font-face { src: url("https://fonts.example.org/f.woff2") }</style>'
        '<script>script.src = "nosuch.js";</script>')
    (tmp_path / "sub" / "b.html").write_text('<h1 id="there">b</h1><a href="../a.html#top">up</a>')
    report = api.check_links(tmp_path)
    assert report.pages == 2
    assert sorted(report.broken) == [
        "a.html: #nowhere (no id 'nowhere')",
        "a.html: missing.html (no file missing.html)",
        "a.html: nosuch.js (no file nosuch.js)",
        "a.html: sub/b.html#gone (no id 'gone')",
    ]
    assert report.remote_assets == ["a.html: loads https://cdn.example.org/x.js",
                                    "a.html: loads https://fonts.example.org/f.woff2"]
    assert report.external == {"https://example.org/"}
    assert not report.ok


def test_the_docstring_checker_catches_a_missing_docstring_or_example(
        built: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    _, modules = built
    module = modules["ledger"]

    class Undocumented(ledger.LedgerError):
        pass

    class NoExample(ledger.LedgerError):
        """Documented, but shows no use."""

    class OnlySkipped(ledger.LedgerError):
        """
        >>> raise OnlySkipped()  # doctest: +SKIP
        """

    planted = {"Undocumented": Undocumented, "NoExample": NoExample, "OnlySkipped": OnlySkipped}
    fake = type(module.obj)("ledger")
    fake.__all__ = [*planted]
    fake.__dict__.update(planted)
    monkeypatch.setattr(module, "obj", fake)
    monkeypatch.setattr(module, "members", {n: object() for n in planted})
    assert api.check_docstrings({"ledger": module}) == [
        "ledger.Undocumented: no docstring of its own",  # LedgerError's does not count
        "ledger.NoExample: its docstring has no example (a '>>>' doctest)",
        "ledger.OnlySkipped: its docstring has no example (a '>>>' doctest)",
    ]
    monkeypatch.setattr(module, "members", {})
    assert api.check_docstrings({"ledger": module})[0] == (
        "ledger.Undocumented: not in the reference (pdoc left it out)")


def test_a_failing_example_is_reported(built: tuple[Path, dict[str, Any]],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, modules = built
    module = modules["ledger"]

    def wrong() -> None:
        """
        >>> 1 + 1
        3
        """

    fake = type(module.obj)("ledger")
    fake.__all__ = ["wrong"]
    fake.wrong = wrong  # type: ignore[attr-defined]
    monkeypatch.setattr(module, "obj", fake)
    monkeypatch.setattr(module, "members", {"wrong": object()})
    [failure] = api.run_examples({"ledger": module})
    assert failure.startswith("ledger.wrong:") and "Expected:\n    3\nGot:\n    2" in failure

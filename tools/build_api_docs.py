"""Build the API reference from the docstrings of the public API, offline, and check it.

    .venv/bin/python tools/build_api_docs.py                 # build docs/api/, then check it
    .venv/bin/python tools/build_api_docs.py -o /tmp/api     # elsewhere
    .venv/bin/python tools/build_api_docs.py --examples      # also run every example

Needs pdoc (``pip install pdoc``: the standalone pdoc, mitmproxy's). What is documented:

- ``ledger``: exactly the names in ``ledger.__all__`` (pdoc honours ``__all__``), none of
  the submodules they live in: the public API is the package's namespace, and
  ``import ledger.events`` is not a promise.
- ``ledger.langgraph`` (its ``__all__``) when its extra is installed: a Python API its
  users call (``LedgerSaver(ledger)``, docs/langgraph.md). ``ledger.mcp`` is not: its
  public surface is the ``steptrail mcp`` command and the MCP tools (docs/mcp.md); its
  classes are the server's insides.

The output (``ledger.html``, ``ledger/langgraph.html``, ``index.html``, ``search.js``)
works from the file system with no network: pdoc inlines its CSS and JavaScript, the
search index is a local ``search.js``, and MathJax/Mermaid (CDN) stay off.

Then three checks, each failing the build (exit 1):

- links: every relative ``href``/``src`` (and the script's ``script.src = "..."``, the
  index's refresh) names an existing file, and its ``#fragment`` an ``id`` in that file;
  external (``http(s)://``) links are listed, not followed;
- offline: no script, style sheet, font or image is loaded from the network;
- docstrings: every exported name has its own docstring (not one inherited from a base
  class) with an example: at least one ``>>>`` line that doctest does not skip.

``--examples`` runs those examples (doctest, each object's in a fresh empty directory);
tests/docs/test_api_docs.py runs them too.
"""

from __future__ import annotations

import argparse
import contextlib
import doctest
import importlib
import inspect
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "api"
#: The modules documented, each with its public names (its ``__all__``).
MODULES = ("ledger", "ledger.langgraph")
#: Those documented only when their extra is installed.
OPTIONAL = frozenset({"ledger.langgraph"})
#: Names whose missing example is known and owed (module.name -> why); see the report.
PENDING_EXAMPLES: dict[str, str] = {}
#: What pdoc writes: the output directory is replaced only if it holds nothing else.
OUTPUT_SUFFIXES = frozenset({".html", ".js"})


# --- building ------------------------------------------------------------------------------


def documented_modules(*, require_optional: bool = False) -> list[str]:
    """The modules to document: ``ledger``, and each optional one that imports."""
    out = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            if name not in OPTIONAL or require_optional:
                raise
            continue
        out.append(name)
    return out


def load(names: list[str]) -> dict[str, Any]:
    """pdoc's model of each module (only these modules: no submodule walk)."""
    import pdoc.doc

    for name in names:  # `ledger` imports its names on first use (PEP 562); pdoc looks
        module = importlib.import_module(name)  # in the module's __dict__: resolve them
        for member in module.__all__:
            getattr(module, member)
    modules = {name: pdoc.doc.Module.from_name(name) for name in names}
    for module in modules.values():
        _reexported_variable_docs(module)
    return modules


def _reexported_variable_docs(module: Any) -> None:
    """pdoc reads a variable's docstring (the string under its assignment) from the
    module being documented; a re-exported variable (``ledger.DEFAULT_PATH``) has its
    docstring where it is assigned, found here among the package's imported modules."""
    import pdoc.doc
    import pdoc.doc_ast

    top = module.modulename.partition(".")[0]
    for name, member in module.members.items():
        if not isinstance(member, pdoc.doc.Variable) or member.docstring:
            continue
        value = getattr(module.obj, name, None)
        for origin in sorted(m for m in sys.modules if m.startswith(f"{top}.")):
            source = sys.modules[origin]
            if source is None or getattr(source, name, object()) is not value:
                continue
            with contextlib.suppress(Exception):
                found = pdoc.doc_ast.walk_tree(source).var_docstrings.get(name)
                if found:
                    member.docstring = found
                    break


def build(out: Path = DEFAULT_OUT, *, require_optional: bool = False) -> dict[str, Any]:
    """Render the reference into `out` (replacing what an earlier build wrote there);
    return pdoc's modules. pdoc's warnings (annotations it cannot evaluate) are printed to
    stderr and fail the build (SystemExit)."""
    import pdoc
    import pdoc.render

    import ledger

    _clear(out)
    pdoc.render.configure(
        docformat="markdown",
        show_source=False,
        search=True,
        math=False,
        mermaid=False,
        footer_text=f"steptrail {ledger.__version__}",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        modules = load(documented_modules(require_optional=require_optional))
        for module in modules.values():
            page = out / f"{module.fullname.replace('.', '/')}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(pdoc.render.html_module(module, modules), encoding="utf-8")
        index = pdoc.render.html_index(modules)
        if index:
            (out / "index.html").write_text(index, encoding="utf-8")
        search = pdoc.render.search_index(modules)
        if search:
            (out / "search.js").write_text(search, encoding="utf-8")
    for w in caught:
        print(f"pdoc: {w.message}", file=sys.stderr)
    if caught:  # a type pdoc cannot read is a broken page: the build fails
        raise SystemExit(f"pdoc reported {len(caught)} problem(s) (above); fix them")
    return modules


def _clear(out: Path) -> None:
    if out.exists():
        other = [p for p in out.rglob("*") if p.is_file() and p.suffix not in OUTPUT_SUFFIXES]
        if other:
            raise SystemExit(f"{out} holds files pdoc did not write ({other[0]}); not replacing it")
        shutil.rmtree(out)
    out.mkdir(parents=True)


# --- links ---------------------------------------------------------------------------------

#: Tag -> attribute: what loads a resource (must be local) and what links.
_ASSETS = {("script", "src"), ("link", "href"), ("img", "src"), ("source", "src"),
           ("iframe", "src"), ("embed", "src"), ("object", "data"), ("video", "src"),
           ("audio", "src"), ("input", "src")}
_LINKS = {("a", "href"), ("area", "href")}
_SCRIPT_SRC = re.compile(r"""\bscript\.src\s*=\s*["']([^"']+)["']""")
_CSS_URL = re.compile(r"""url\(\s*["']?([^"')]+)["']?\s*\)|@import\s+["']([^"']+)["']""")
_REFRESH = re.compile(r"url=(.+)$", re.I)


@dataclass
class LinkReport:
    """What `check_links` found. `broken` and `remote_assets` fail the build."""

    pages: int = 0
    links: int = 0
    broken: list[str] = field(default_factory=list)
    remote_assets: list[str] = field(default_factory=list)
    external: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.broken and not self.remote_assets


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[tuple[str, bool]] = []  # (url, is an asset)
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v for k, v in attrs if v is not None}
        for key in ("id", "name") if tag in ("a", "map") else ("id",):
            if key in a:
                self.ids.add(a[key])
        for t, attr in _ASSETS | _LINKS:
            if tag == t and attr in a:
                asset = (t, attr) in _ASSETS and not (
                    tag == "link" and a.get("rel", "") in ("canonical", "alternate"))
                self.refs.append((a[attr], asset))
        if tag == "meta" and a.get("http-equiv", "").lower() == "refresh":
            m = _REFRESH.search(a.get("content", ""))
            if m:
                self.refs.append((m.group(1).strip(), False))
        if "style" in a:
            self._css(a["style"])
        self._in.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._in:
            while self._in and self._in.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        where = self._in[-1] if self._in else ""
        if where == "script":
            self.refs += [(u, True) for u in _SCRIPT_SRC.findall(data)]
        elif where == "style":
            self._css(data)

    def _css(self, text: str) -> None:
        for url, imported in _CSS_URL.findall(text):
            self.refs.append((url or imported, True))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def check_links(root: Path) -> LinkReport:
    """Every HTML file under `root`: each relative link and asset must name an existing
    file (and an existing id, for a ``#fragment``); no asset may come from the network.
    External links are collected in `external`."""
    report = LinkReport()
    pages = {p.resolve(): _parse(p) for p in sorted(root.rglob("*.html"))}
    report.pages = len(pages)
    for path, page in pages.items():
        shown = path.relative_to(root.resolve()).as_posix()
        for url, asset in page.refs:
            report.links += 1
            parts = urlsplit(url)
            if parts.scheme in ("data", "mailto", "javascript"):
                continue
            if parts.scheme or url.startswith("//"):
                if asset:
                    report.remote_assets.append(f"{shown}: loads {url}")
                else:
                    report.external.add(url)
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.is_file():
                report.broken.append(f"{shown}: {url} (no file {unquote(parts.path)})")
                continue
            if parts.fragment:
                if target.suffix != ".html":
                    report.broken.append(f"{shown}: {url} (a fragment into a non-HTML file)")
                    continue
                if target not in pages:
                    pages[target] = _parse(target)
                if unquote(parts.fragment) not in pages[target].ids:
                    report.broken.append(f"{shown}: {url} (no id {parts.fragment!r})")
    return report


# --- docstrings ----------------------------------------------------------------------------


def exported(modules: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """(``module.name``, the object, pdoc's doc of it) for each name in each documented
    module's ``__all__``; the doc is None if pdoc left the name out."""
    for modname, module in modules.items():
        for name in module.obj.__all__:
            yield f"{modname}.{name}", getattr(module.obj, name), module.members.get(name)


def own_docstring(obj: Any, doc: Any) -> str:
    """The object's own docstring: a class's or function's ``__doc__`` (never one
    inherited from a base class), else what pdoc found (a variable's string)."""
    if inspect.isclass(obj):
        text = vars(obj).get("__doc__")
    elif inspect.isroutine(obj):
        text = getattr(obj, "__doc__", None)
    else:
        text = doc.docstring if doc is not None else None
    return inspect.cleandoc(text) if isinstance(text, str) else ""


def examples(text: str, name: str) -> doctest.DocTest:
    """The doctest examples of one docstring."""
    return doctest.DocTestParser().get_doctest(text, {}, name, None, 0)


def _runnable(test: doctest.DocTest) -> list[doctest.Example]:
    return [e for e in test.examples if not e.options.get(doctest.SKIP)]


def check_docstrings(modules: dict[str, Any]) -> list[str]:
    """One line per exported name without its own docstring, or without an example
    (a ``>>>`` doctest line doctest does not skip), or left out of the reference."""
    problems = []
    for full, obj, doc in exported(modules):
        if doc is None:
            problems.append(f"{full}: not in the reference (pdoc left it out)")
            continue
        text = own_docstring(obj, doc)
        if full in PENDING_EXAMPLES:
            continue
        if not text:
            problems.append(f"{full}: no docstring of its own")
        elif not _runnable(examples(text, full)):
            problems.append(f"{full}: its docstring has no example (a '>>>' doctest)")
    return problems


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="steptrail-example-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(here)


def run_examples(modules: dict[str, Any]) -> list[str]:
    """Run each exported name's examples (doctest, with no globals: each example imports
    what it uses) in a fresh empty directory; one report per failing name."""
    failures = []
    for full, obj, doc in exported(modules):
        test = examples(own_docstring(obj, doc), full)
        if not test.examples:
            continue
        out: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        with _scratch():
            result = runner.run(test, out=out.append, clear_globs=True)
        if result.failed:
            failures.append(f"{full}:\n" + "".join(out))
    return failures


# --- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT,
                        help="where to write the HTML (default: docs/api/)")
    parser.add_argument("--examples", action="store_true",
                        help="also run every exported name's examples")
    parser.add_argument("--require-optional", action="store_true",
                        help="fail if an optional module (ledger.langgraph) does not import")
    args = parser.parse_args(argv)
    try:
        import pdoc  # noqa: F401
    except ImportError:
        print("pdoc is not installed: pip install pdoc", file=sys.stderr)
        return 2
    modules = build(args.output, require_optional=args.require_optional)
    failed = False
    links = check_links(args.output)
    print(f"{links.pages} pages, {links.links} links and assets checked in {args.output}")
    for line in links.broken:
        print(f"broken link: {line}")
    for line in links.remote_assets:
        print(f"loads from the network: {line}")
    for url in sorted(links.external):
        print(f"external link (not followed): {url}")
    failed |= not links.ok
    problems = check_docstrings(modules)
    for line in problems:
        print(f"docstring: {line}")
    failed |= bool(problems)
    names = sum(1 for _ in exported(modules))
    print(f"{names} exported names documented from {', '.join(modules)}")
    if args.examples:
        failures = run_examples(modules)
        for line in failures:
            print(f"example failed: {line}")
        failed |= bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

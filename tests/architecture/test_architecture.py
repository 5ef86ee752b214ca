"""The storage boundary, as a ratchet (docs/storage.md).

The end state: outside the SQLite store's folder (``ledger/store/sqlite/``) no module
imports a SQLite driver (apsw, sqlite3, sqlite_utils) and no string holds SQL, and the
package has no import cycle. Until the migration is done, the modules that still do are
listed below with exactly what they hold: a module that gains a driver import, SQL or a
cycle fails, and so does one that lost some without its entry being lowered (a stale
entry), so every commit that moves storage code tightens the lists.

The module graph is read from the source (AST), every import counted: at module level,
inside functions (lazy imports) and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ledger"
#: Where a SQLite driver and SQL text may live.
SQLITE_STORE = "store/sqlite/"
#: The PostgreSQL store's folder: SQL text and the PostgreSQL driver, no SQLite driver.
POSTGRES_STORE = "store/postgres/"
DRIVERS = frozenset({"apsw", "sqlite3", "sqlite_utils"})
PG_DRIVERS = frozenset({"psycopg", "psycopg_pool"})
#: Modules outside the PostgreSQL store that may import its driver: the throwaway
#: server the tests, benchmarks and demo start (it creates and drops databases).
PG_DRIVER_IMPORTERS = frozenset({"testing/pgserver.py"})

#: Modules outside the SQLite store that still import a driver (to be emptied).
DRIVER_IMPORTERS: dict[str, frozenset[str]] = {
}

#: How many SQL strings each module outside the SQLite store still holds (to be emptied).
SQL_STRINGS: dict[str, int] = {
    "testing/pgserver.py": 4,  # CREATE/DROP DATABASE, ending sessions, finding a database
    "store/sql.py": 75,  # the statements every SQL store renders from its dialect (Dialect)
}

#: Import cycles still present, each as the set of its modules (to be emptied).
CYCLES: list[frozenset[str]] = []

#: What makes a string SQL: a statement keyword at its start, or a clause keyword in it
#: (upper case, as this code base writes SQL; prose does not shout).
_SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|PRAGMA|BEGIN|COMMIT|ROLLBACK|SAVEPOINT"
    r"|RELEASE|WITH|ALTER|REPLACE)\b|\b(FROM|WHERE|VALUES|JOIN|ORDER BY|GROUP BY|ON CONFLICT"
    r"|INTO)\s", re.M)


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _outside_store(path: Path) -> bool:
    return not _rel(path).startswith((SQLITE_STORE, POSTGRES_STORE))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def sql_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string (an f-string counts once) that reads as SQL; docstrings excluded."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in ast.walk(node) if v is not node)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        else:
            continue
        if _SQL.search(text):
            out.append((node.lineno, text))
    return out


def driver_imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & (DRIVERS | PG_DRIVERS)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (lazy and TYPE_CHECKING ones included).
    ``from . import x`` names the submodule when there is one, else the package."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    full = base + ("." + node.module if node.module else "")
                else:
                    full = node.module or ""
                for a in node.names:
                    targets.add(f"{full}.{a.name}" if f"{full}.{a.name}" in mods else full)
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(frozenset(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _trees() -> dict[str, ast.AST]:
    return {_rel(p): ast.parse(p.read_text()) for p in _modules().values() if _outside_store(p)}


def test_sqlite_drivers_only_where_listed() -> None:
    found = {rel: frozenset(d) for rel, tree in _trees().items()
             if (d := driver_imports(tree) & DRIVERS)}
    gained = {r: sorted(d - DRIVER_IMPORTERS.get(r, frozenset())) for r, d in found.items()
              if d - DRIVER_IMPORTERS.get(r, frozenset())}
    assert not gained, f"a SQLite driver imported outside ledger/{SQLITE_STORE}: {gained}"
    stale = {r: sorted(d - found.get(r, frozenset())) for r, d in DRIVER_IMPORTERS.items()
             if d - found.get(r, frozenset())}
    assert not stale, f"stale DRIVER_IMPORTERS entries (lower them): {stale}"


def test_postgres_driver_only_in_its_store() -> None:
    trees = {_rel(p): ast.parse(p.read_text()) for p in _modules().values()}
    found = {rel for rel, tree in trees.items() if driver_imports(tree) & PG_DRIVERS}
    outside = sorted(r for r in found if not r.startswith(POSTGRES_STORE)
                     and r not in PG_DRIVER_IMPORTERS)
    assert not outside, f"psycopg imported outside ledger/{POSTGRES_STORE}: {outside}"
    sqlite_in_pg = sorted(r for r, tree in trees.items() if r.startswith(POSTGRES_STORE)
                          and driver_imports(tree) & DRIVERS)
    assert not sqlite_in_pg, f"a SQLite driver in the PostgreSQL store: {sqlite_in_pg}"


def test_sql_only_where_listed() -> None:
    found = {rel: n for rel, tree in _trees().items() if (n := len(sql_strings(tree)))}
    more = {r: (n, SQL_STRINGS.get(r, 0)) for r, n in found.items() if n > SQL_STRINGS.get(r, 0)}
    assert not more, (f"SQL text outside ledger/{SQLITE_STORE} (found, allowed): {more};"
                      " move it into the SQLite store behind the storage interface")
    stale = {r: (found.get(r, 0), n) for r, n in SQL_STRINGS.items() if found.get(r, 0) < n}
    assert not stale, f"stale SQL_STRINGS entries (found, listed; lower them): {stale}"


def test_no_new_import_cycles() -> None:
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in CYCLES]
    assert not new, f"import cycles (lazy and TYPE_CHECKING imports count): {new}"
    gone = [sorted(c) for c in CYCLES if c not in found]
    assert not gone, f"stale CYCLES entries (remove them): {gone}"


@pytest.mark.parametrize("text, sql", [
    ("SELECT seq FROM events", True),
    ("INSERT OR IGNORE INTO pins(step) VALUES (?)", True),
    (" WHERE step_id = ?", True),
    ("PRAGMA data_version", True),
    ("the step was selected from the events", False),
    ("steptrail: error: UsageError", False),
])
def test_the_sql_detector(text: str, sql: bool) -> None:
    assert bool(sql_strings(ast.parse(f"x = {text!r}"))) is sql


def test_the_detectors_see_lazy_and_type_checking_imports() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import apsw\n"
                     "def f():\n    import sqlite3\n")
    assert driver_imports(tree) == {"apsw", "sqlite3"}
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [frozenset({"a", "b"})]


def test_the_standard_workload_does_the_same_durable_operations(tmp_path: Path) -> None:
    """The fault harness's standard workload, run on a disk that never fails, performs
    exactly the durable operations it did before the storage boundary was drawn (the
    ledger file's writes, syncs and truncates, the blob store's and the workspace's file
    operations, in order): moving code behind the interface must not move a write, an
    fsync or a rename, or every crash point of the fault sweeps would mean another thing.
    A change that alters them on purpose regenerates the file and says why."""
    import json

    from ledger.testing import faults

    total, trace = faults.count_ops(faults.StandardWorkload(), str(tmp_path))
    saved = json.loads((Path(__file__).parent / "standard_workload_ops.json").read_text())
    runs: list[list[object]] = []
    for op in trace:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1  # type: ignore[operator]
        else:
            runs.append([op, 1])
    assert (total, runs) == (saved["total"], saved["trace"])


#: The ledger's collaborators: the places on disk (`ledger.workspace`) and the step's
#: lifecycle (`ledger.step`). They work through `ledger.workspace.core.Core` (the step's
#: `Site` holds it), never the `Ledger`.
COLLABORATORS = tuple(sorted(m for m in _modules()
                             if m.startswith(("ledger.workspace.", "ledger.step."))))
#: What the step's lifecycle never imports, not even for types: the facades above it and
#: every front end.
ABOVE_THE_STEP = ("ledger.ledger", "ledger.workspaces", "ledger.runner", "ledger.demo",
                  "ledger.cli", "ledger.mcp", "ledger.ui", "ledger.langgraph", "ledger.aio")


def lifecycle_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the layering of the step's lifecycle: a module of
    `ledger.step` importing a facade or a front end (`ABOVE_THE_STEP`), and a module of
    `ledger.workspace` importing anything of `ledger.step` but its plain values."""
    out = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            if mod.startswith("ledger.step") and any(
                    t == a or t.startswith(a + ".") for a in ABOVE_THE_STEP):
                out.append(f"{mod} imports {t}")
            if mod.startswith("ledger.workspace.") and t.startswith("ledger.step") \
                    and t not in ("ledger.step", "ledger.step.values"):
                out.append(f"{mod} imports {t}")
    return out


def test_the_collaborators_do_not_import_the_ledger() -> None:
    """The dependency points one way: `ledger.ledger` and ``ledger.workspaces`` compose
    the step's lifecycle (`ledger.step`) over the places on disk (`ledger.workspace`);
    neither imports a facade or a front end, not even for types, and the places import
    nothing of the lifecycle but its values."""
    graph = import_graph()
    assert {"ledger.step.apply", "ledger.workspace.places"} <= set(COLLABORATORS)
    for name in COLLABORATORS:
        assert "ledger.ledger" not in graph[name], f"{name} imports ledger.ledger"
    assert lifecycle_violations(graph) == []


def test_the_lifecycle_checker_catches_a_violation() -> None:
    planted = {"ledger.step.apply": {"ledger.ledger", "ledger.step.fence"},
               "ledger.step.run": {"ledger.cli.step_run"},
               "ledger.workspace.places": {"ledger.step.values", "ledger.step.apply"},
               "ledger.workspace.leases": {"ledger.step"}}
    assert lifecycle_violations(planted) == [
        "ledger.step.apply imports ledger.ledger", "ledger.step.run imports ledger.cli.step_run",
        "ledger.workspace.places imports ledger.step.apply"]


def test_no_mixin_and_no_private_reach_ins() -> None:
    """`Ledger` inherits nothing of the protocol (no method is typed ``self: Ledger``), and
    the collaborators reach no private attribute of another object (``x._db``, ``x._log``,
    ``x._store``): only their own (``self._...``)."""
    tree = ast.parse((PACKAGE / "ledger.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Ledger"]
    assert cls.bases == [], "Ledger inherits a mixin"
    mods = _modules()
    for name in COLLABORATORS:
        tree = ast.parse(mods[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg == "self" and node.annotation is not None:
                raise AssertionError(f"{name}:{node.lineno}: self is annotated (a mixin)")
            if (isinstance(node, ast.Attribute) and node.attr in ("_db", "_log", "_store")
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                raise AssertionError(f"{name}:{node.lineno}: reaches into .{node.attr}")


def imported_names(node: ast.AST, package: str) -> list[str]:
    """What an import statement of a module of `package` (dotted) names, absolute: the
    modules, and for ``from X import a`` both X and X.a (a may be a module); [] for any
    other node."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parent = package
        for _ in range(node.level - 1):
            parent = parent.rpartition(".")[0]
        base = parent + ("." + base if base else "")
    return [base] + [f"{base}.{a.name}" for a in node.names]


#: The test machinery (faults, chaos, fuzz): nothing outside it imports it, not even
#: lazily; its commands (``chaos``, ``fuzz``) reach the command line as entry points
#: (pyproject.toml, ``steptrail.commands``).
TESTING = "ledger.testing"


def machinery_imports(tree: ast.Module, package: str) -> list[tuple[int, bool]]:
    """Where a module of `package` (dotted) imports the test machinery: (line, whether
    inside a function)."""
    lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        names = imported_names(node, package)
        if any(n == TESTING or n.startswith(TESTING + ".") for n in names):
            out.append((node.lineno, id(node) in lazy))
    return out


def _import_lines(sources: dict[str, str], checked: Callable[[str], bool],
                  finder: Callable[[ast.Module, str], list[tuple[int, object]]]
                  ) -> dict[str, list[int]]:
    """Per checked module (path relative to ledger/): the lines `finder` reports in it,
    given its parsed source and its package."""
    out = {}
    for rel, text in sources.items():
        if not checked(rel):
            continue
        package = ".".join(["ledger", *Path(rel).parent.parts])
        bad = [line for line, _what in finder(ast.parse(text), package)]
        if bad:
            out[rel] = bad
    return out


def _testing_violations(sources: dict[str, str]) -> dict[str, list[int]]:
    """Per module (path relative to ledger/) outside ledger/testing/: the lines importing
    it (none is allowed, at module level or inside a function)."""
    return _import_lines(sources, lambda rel: not rel.startswith("testing/"),
                         machinery_imports)


def test_the_runtime_never_imports_the_test_machinery() -> None:
    sources = {_rel(p): p.read_text() for p in _modules().values()}
    assert not _testing_violations(sources), (
        f"ledger.testing imported outside ledger/testing/: {_testing_violations(sources)}")
    assert machinery_imports(ast.parse(sources["testing/commands.py"]), "ledger.testing"), \
        "the checker sees the commands' lazy imports of the machinery"


@pytest.mark.parametrize("rel, source, bad", [
    ("blobs.py", "from .testing import faults\n", [1]),
    ("blobs.py", "import ledger.testing.faults as F\n", [1]),
    ("store/sqlite/database.py", "def f():\n    from ...testing.faults import Fault\n", [2]),
    ("cli/__init__.py", "from ..testing import fuzz\n", [1]),  # the CLI too
    ("cli/chaos.py", "def chaos():\n    from ..testing import faults\n", [2]),  # even lazily
    ("cli/_common.py", "def load():\n    import ledger.testing.commands\n", [2]),
    ("ledger.py", "from . import testing\n", [1]),
    ("gc/audit.py", "from ..testing_notes import x\nfrom .testing import y\n", []),
    ("testing/fuzz.py", "from .faults import Fault\n", []),
])
def test_the_testing_checker_catches_a_violation(rel: str, source: str, bad: list[int]) -> None:
    assert _testing_violations({rel: source}).get(rel, []) == bad


#: The front ends: what they do with a step goes through the library's fenced step
#: (`ledger.runner.run_fenced_step`), never their own string of transitions.
FRONT_ENDS = ("cli/", "demo.py", "mcp/")
#: The transitions a fenced step strings together, in the library only.
TRANSITIONS = frozenset({"admit", "apply", "publish", "ack"})


def strung_transitions(source: str) -> list[str]:
    """Functions of `source` that call two or more of `TRANSITIONS` themselves."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            called = {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr in TRANSITIONS}
            if len(called) >= 2:
                out.append(f"{node.name}: {', '.join(sorted(called))}")
    return out


def test_only_the_library_strings_a_fenced_step_together() -> None:
    """Every front end (the command line, the demo, the MCP tools) runs a step through
    `run_fenced_step`; one that strings admit/apply/publish/ack together itself has a
    copy of the protocol that can drift (the outside review's finding)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if any(rel == f or rel.startswith(f) for f in FRONT_ENDS):
            hits = strung_transitions(path.read_text())
            if hits:
                found[rel] = hits
    assert found == {}


def test_the_transition_checker_catches_a_front_end_copy() -> None:
    copy = ("def step(ledger, s, e):\n    ledger.workspaces.admit('w', e, [s])\n"
            "    r = ledger.workspaces.apply(s.step, epoch=e)\n    ledger.publish(s.step)\n")
    assert strung_transitions(copy) == ["step: admit, apply, publish"]
    assert strung_transitions("def f(led):\n    led.workspaces.apply('s', epoch=1)\n") == []


#: The public API (ARCHITECTURE.md "The public API"): the names `ledger` exports (its
#: ``__all__``) and these modules, each with what its ``__all__`` lists.
PUBLIC_MODULES = frozenset({
    "ledger.errors", "ledger.events", "ledger.plans", "ledger.gc", "ledger.seal",
    "ledger.backup", "ledger.copying", "ledger.stats", "ledger.metrics", "ledger.verify",
    "ledger.demo", "ledger.export", "ledger.mcp", "ledger.langgraph", "ledger.workspace",
    "ledger.diffs", "ledger.witness", "ledger.ui", "ledger.find", "ledger.extras",
    "ledger.attention", "ledger.kinds", "ledger.fmt", "ledger.export_git", "ledger.retention",
    "ledger.holders",
})
#: The command line: it sees the public API only (and its own modules).
CLI = "ledger.cli"


def _declared_all(module: str) -> set[str] | None:
    """The names a module of the package lists in its ``__all__`` (read, not imported)."""
    path = _modules().get(module)
    if path is None:
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                return set(ast.literal_eval(node.value))
    return None


def private_imports(tree: ast.AST, package: str, own: str = CLI) -> list[tuple[int, str]]:
    """Where a module of `package` (dotted, under the front end `own`: ledger.cli,
    ledger.mcp, ...) imports from `ledger` what is not the public API (lazy and
    TYPE_CHECKING imports count; its own modules are its own): (line, what)."""
    import ledger

    top = set(ledger.__all__) | {"__version__"}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ledger.") and not a.name.startswith(own) \
                        and a.name not in PUBLIC_MODULES:
                    out.append((node.lineno, a.name))
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parent = package
            for _ in range(node.level - 1):
                parent = parent.rpartition(".")[0]
            base = parent + ("." + base if base else "")
        if base != "ledger" and not base.startswith("ledger."):
            continue  # not ours (click, msgspec, the standard library)
        if base == own or base.startswith(own + "."):
            continue  # its own modules
        if base == "ledger":
            out.extend((node.lineno, f"ledger.{a.name}") for a in node.names
                       if a.name not in top and f"ledger.{a.name}" not in PUBLIC_MODULES)
        elif base not in PUBLIC_MODULES:
            out.append((node.lineno, base))
        else:
            listed = _declared_all(base)
            out.extend((node.lineno, f"{base}.{a.name}") for a in node.names
                       if a.name.startswith("_") or (listed is not None and a.name not in listed))
    return sorted(out)


def _cli_violations(sources: dict[str, str]) -> dict[str, list[int]]:
    """Per module of ledger/cli/ (path relative to ledger/): the lines importing from
    `ledger` what is not its public API."""
    return _import_lines(sources, lambda rel: rel.startswith("cli/"), private_imports)


def test_the_command_line_imports_only_the_public_api() -> None:
    """Each command is a few calls on the public API plus printing: what it needs of an
    internal module is a name `ledger` exports (`settle_conflicts`, `WsRow`, ...) or a
    function of a public module (`ledger.export.export_rows`), never the module itself."""
    sources = {_rel(p): p.read_text() for p in _modules().values()}
    found = {rel: private_imports(ast.parse(text), ".".join(["ledger", *Path(rel).parent.parts]))
             for rel, text in sources.items() if rel.startswith("cli/")}
    assert not {r: w for r, w in found.items() if w}, f"beyond the public API: {found}"
    assert len(found) > 10, "the checker reads every module of ledger/cli/"
    export = ast.parse(sources["cli/export.py"])
    assert private_imports(ast.parse(ast.unparse(export).replace(
        "ledger.export", "ledger.store.sqlite.export")), CLI), "the checker sees lazy imports"


@pytest.mark.parametrize("rel, source, bad", [
    ("cli/lease.py", "def settle():\n    from ..fences import settle_conflicts\n", [2]),
    ("cli/export.py", "def export():\n    from ledger.store.sqlite.export import exported_rows\n",
     [2]),
    ("cli/workspace.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from ledger.projections.workspaces import WsRow\n", [3]),
    ("cli/step_run.py", "import ledger.runner\n", [1]),
    ("cli/gc.py", "from .. import fences\n", [1]),  # an internal module, through the package
    ("cli/inspect.py", "from ledger import _WHERE\n", [1]),  # not in ledger.__all__
    ("cli/seal.py", "from ledger.seal import ArchiveFile\n", [1]),  # not in seal's __all__
    ("cli/mcp.py", "from ledger.mcp.server import serve\n", [1]),  # ledger.mcp's serve only
    ("cli/x.py", "import ledger.gc\nfrom ledger import Ledger, WsRow, __version__\n"
     "from .. import seal\nfrom ledger.errors import InvalidInput\nfrom ledger.mcp import serve\n"
     "from ._common import _open\nfrom .step import _admit\nimport click\n", []),
    ("demo.py", "from .fences import settle_conflicts\n", []),  # the rule is the CLI's
])
def test_the_public_api_checker_catches_a_violation(rel: str, source: str, bad: list[int]) -> None:
    assert _cli_violations({rel: source}).get(rel, []) == bad


#: The other front ends held to the public API, as the command line is (its own package).
FRONT_END_PACKAGES = {"mcp/": "ledger.mcp", "langgraph/": "ledger.langgraph", "ui/": "ledger.ui"}
def test_the_mcp_server_the_langgraph_saver_and_backup_import_only_the_public_api() -> None:
    found = {}
    for rel, path in ((_rel(p), p) for p in _modules().values()):
        for prefix, own in FRONT_END_PACKAGES.items():
            if rel.startswith(prefix):
                package = ".".join(["ledger", *Path(rel).parent.parts])
                if bad := private_imports(ast.parse(path.read_text()), package, own):
                    found[rel] = bad
    assert not found, f"beyond the public API: {found}"
    backup = private_imports(ast.parse((PACKAGE / "backup.py").read_text()), "ledger",
                             "ledger.backup")
    assert not backup, f"backup.py beyond the public API: {backup}"


@pytest.mark.parametrize("source, bad", [
    ("from ..workspace.confined import Confined\n", [1]),  # inside a public package
    ("from ..ledger import Ledger\n", [1]),
    ("def f():\n    from ..store.postgres import PgStore\n", [2]),
    ("from .. import Ledger, digest_of\nfrom ..workspace import Confined\nfrom .edits import x\n",
     []),
])
def test_the_front_end_checker_catches_a_violation(source: str, bad: list[int]) -> None:
    assert [line for line, _ in private_imports(ast.parse(source), "ledger.mcp",
                                                "ledger.mcp")] == bad


def concrete_store_imports(tree: ast.AST, package: str) -> list[int]:
    """Lines where a module of `package` imports a concrete store (`ledger.store.sqlite`,
    `ledger.store.postgres`, or anything under them), lazily or not."""
    stores = ("ledger.store.sqlite", "ledger.store.postgres")
    out = []
    for node in ast.walk(tree):
        names = imported_names(node, package)
        if any(n == s or n.startswith(s + ".") for n in names for s in stores):
            out.append(node.lineno)
    return out


def test_only_the_store_names_a_concrete_store() -> None:
    """Everything above `ledger/store/` opens a location through the registry
    (`ledger.store.locate`): no module outside the store (or the test machinery) names
    the SQLite or the PostgreSQL store."""
    found = {}
    for rel, path in ((_rel(p), p) for p in _modules().values()):
        if rel.startswith(("store/", "testing/")):
            continue
        package = ".".join(["ledger", *Path(rel).parent.parts])
        if bad := concrete_store_imports(ast.parse(path.read_text()), package):
            found[rel] = bad
    assert not found, f"a concrete store named outside ledger/store/: {found}"


@pytest.mark.parametrize("package, source, bad", [
    ("ledger", "from .store.sqlite import SqliteStore\n", [1]),
    ("ledger.mcp", "def f():\n    from ..store.postgres.location import is_url\n", [2]),
    ("ledger", "import ledger.store.postgres\n", [1]),
    ("ledger", "from .store import sqlite\n", [1]),
    ("ledger", "from .store import locate, open_store\nfrom .store.registry import Unmapped\n", []),
])
def test_the_concrete_store_checker_catches_a_violation(package: str, source: str,
                                                         bad: list[int]) -> None:
    assert concrete_store_imports(ast.parse(source), package) == bad


def _string_constants(tree: ast.AST) -> dict[str, str]:
    """Every ``NAME = "..."`` (or ``NAME: T = "..."``) of a module, wherever it is."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                and isinstance(value.value, str):
            out[target.id] = value.value
    return out


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("environ", "environb")) or (
        isinstance(node, ast.Attribute) and node.attr in ("environ", "environb"))


def environment_reads(tree: ast.AST, imported: dict[str, set[str]] | None = None
                      ) -> list[tuple[int, str]]:
    """Every environment variable a module reads, by name where the source spells it (a
    string, or a name bound to one: in the module, else any of `imported`, the package's
    constants): ``os.environ.get(X)``, ``os.environ[X]``, ``X in os.environ``,
    ``os.getenv(X)`` and click's ``envvar=X``. (line, name)."""
    constants = _string_constants(tree)

    def names(node: ast.AST | None) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in constants:
            return [constants[node.id]]
        if isinstance(node, ast.Name) and node.id in (imported or {}):
            return sorted((imported or {})[node.id])
        if isinstance(node, ast.JoinedStr):
            return ["".join(n for v in node.values for n in names(v) or ["{}"])]
        if isinstance(node, ast.FormattedValue):
            return names(node.value)
        if isinstance(node, ast.List | ast.Tuple):
            return [n for e in node.elts for n in names(e)]
        return []

    out = []
    for node in ast.walk(tree):
        read: list[str] = []
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and _is_environ(f.value) \
                    and f.attr in ("get", "pop", "setdefault") and node.args:
                read = names(node.args[0])
            elif ((isinstance(f, ast.Attribute) and f.attr in ("getenv", "getenvb"))
                  or (isinstance(f, ast.Name) and f.id in ("getenv", "getenvb"))) and node.args:
                read = names(node.args[0])
            read += [n for k in node.keywords if k.arg == "envvar" for n in names(k.value)]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            read = names(node.slice)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            read = names(node.left)
        out.extend((node.lineno, n) for n in read)
    return sorted(out)


def _package_constants(sources: dict[str, str]) -> dict[str, set[str]]:
    """Every string constant of the package's modules, by name (a name may be bound in
    several: all its strings count)."""
    out: dict[str, set[str]] = {}
    for text in sources.values():
        for name, value in _string_constants(ast.parse(text)).items():
            out.setdefault(name, set()).add(value)
    return out


def _test_env_violations(sources: dict[str, str]) -> dict[str, list[int]]:
    """Per module outside ledger/testing/: the lines reading an environment variable whose
    name says it is a test's (``TEST`` in it): a test hooks the runtime through a
    callback it injects, not through the environment."""
    imported = _package_constants(sources)
    out = {}
    for rel, text in sources.items():
        if rel.startswith("testing/"):
            continue
        bad = [line for line, name in environment_reads(ast.parse(text), imported)
               if "TEST" in name]
        if bad:
            out[rel] = bad
    return out


def test_the_runtime_reads_no_test_only_environment_variable() -> None:
    sources = {_rel(p): p.read_text() for p in _modules().values()}
    assert not _test_env_violations(sources), (
        f"test-only environment variables read by the runtime: {_test_env_violations(sources)}")
    imported = _package_constants(sources)
    reads = {name for text in sources.values()
             for _, name in environment_reads(ast.parse(text), imported)}
    assert {"STEPTRAIL_RENAME_EXCHANGE", "STEPTRAIL_LEDGER", "STEPTRAIL_EPOCH"} <= reads, \
        "the checker sees the documented knobs (a constant, click's envvar)"


@pytest.mark.parametrize("rel, source, bad", [
    ("mcp/service.py", 'PAUSE_ENV: Final = "STEPTRAIL_MCP_TEST_PAUSE"\n\ndef pause():\n'
     "    return os.environ.get(PAUSE_ENV)\n", [4]),
    ("cli/step_run.py", 'import os\nif os.environ.get("STEPTRAIL_STEP_RUN_TEST_KILL") == "x":\n'
     "    pass\n", [2]),
    ("ledger.py", 'import os\nhook = os.getenv("MY_TEST_HOOK")\n', [2]),
    ("blobs.py", 'from os import environ\nv = environ["STEPTRAIL_TEST"]\n', [2]),
    ("gc/collector.py", 'import os\nfast = "STEPTRAIL_TESTS" in os.environ\n', [2]),
    ("cli/x.py", '@click.option("--x", envvar="STEPTRAIL_TEST_X")\ndef f(): pass\n', [1]),
    ("cli/y.py", "from ._options import ENV_HOOK\n@click.option('--y', envvar=ENV_HOOK)\n"
     "def f(): pass\n", [2]),  # bound in another module (cli/z.py below)
    ("exchange.py", 'import os\nos.environ.get("STEPTRAIL_RENAME_EXCHANGE", "")\n', []),
    ("testing/faults.py", 'import os\nos.environ.get("STEPTRAIL_FAULTS_TEST")\n', []),
])
def test_the_environment_checker_catches_a_test_hook(rel: str, source: str, bad: list[int]) -> None:
    other = {"cli/z.py": 'ENV_HOOK = "STEPTRAIL_TEST_HOOK"\n'}
    assert _test_env_violations({rel: source, **other}).get(rel, []) == bad


def test_every_public_name_is_listed_once_and_resolves() -> None:
    """`ledger/__init__.py` lists each public name once (its TYPE_CHECKING block); at run
    time each resolves to the object its module defines, and `__all__` is those names."""
    import importlib

    import ledger

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If)
                and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
    listed = [(a.name, a.asname, node.module) for node in block.body
              if isinstance(node, ast.ImportFrom) for a in node.names]
    names = [name for name, _as, _module in listed]
    assert len(names) == len(set(names)), "a public name listed twice"
    assert all(asname == name for name, asname, _ in listed), "re-exported as X as X"
    assert sorted(ledger.__all__) == sorted(names)
    assert export_table_problems(listed, ledger._WHERE) == []
    for name, _as, module in listed:
        assert getattr(ledger, name) is getattr(importlib.import_module(f"ledger.{module}"),
                                                name), name
    with pytest.raises(AttributeError):
        ledger.not_a_public_name  # noqa: B018


def export_table_problems(listed: list[tuple[str, str | None, str | None]],
                          table: dict[str, str]) -> list[str]:
    """Where the run-time export table (`ledger._WHERE`: name -> module) and the
    TYPE_CHECKING block disagree: a name in one only, or from another module."""
    block = {name: module or "" for name, _as, module in listed}
    return sorted([f"{n}: only in the TYPE_CHECKING block" for n in block.keys() - table.keys()]
                  + [f"{n}: only in _WHERE" for n in table.keys() - block.keys()]
                  + [f"{n}: {block[n]} there, {table[n]} in _WHERE"
                     for n in block.keys() & table.keys() if block[n] != table[n]])


def test_the_export_table_checker_catches_a_drift() -> None:
    listed = [("Ledger", "Ledger", "ledger"), ("Write", "Write", "step.values")]
    assert export_table_problems(listed, {"Ledger": "ledger", "Write": "step.values"}) == []
    assert export_table_problems(listed, {"Ledger": "ledger", "Write": "workspace",
                                          "Extra": "x"}) == [
        "Extra: only in _WHERE", "Write: step.values there, workspace in _WHERE"]


def _walk_tool():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "walk_step", PACKAGE.parent / "tools" / "walk_step.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_fenced_step_from_the_command_line_calls_nothing_back_up_into_ledger_py(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One `step run`, traced at run time (tools/walk_step.py): it commits, and no
    module below `ledger.py` in the import graph calls into it (a callback, a bound
    method or a lambda handed down would)."""
    import os

    for var in [v for v in os.environ if v.startswith("STEPTRAIL_")]:
        monkeypatch.delenv(var)  # the tool clears them; restored after the test
    walk = _walk_tool()
    doc = walk.report(*walk.traced_step(tmp_path))
    assert doc["commit"]["state"] == "acked"
    assert doc["into_ledger_py"] == []


def test_the_walk_checker_catches_a_call_back_up_into_ledger_py() -> None:
    """The planted violation: a call from the store's append loop into a function of
    `ledger.py` (what the append guard was, as a closure of `Ledger`)."""
    from collections import Counter

    walk = _walk_tool()
    base, top = str(PACKAGE / "store" / "base.py"), str(PACKAGE / "ledger.py")
    edges = Counter({(base, top): 3})
    names = {(base, top): Counter({"Ledger._guard.<locals>.guard": 3})}
    doc = walk.report(Counter({base: 1, top: 3}), edges, names, {"state": "acked"})
    (found,) = doc["into_ledger_py"]
    assert (found["caller"], found["callee"], found["calls"]) == ("store/base.py", "ledger.py", 3)


# --- every byte move in a workspace goes through the verified primitive ----------------

#: The one module that may remove, rename, replace, link or exchange a workspace's
#: files (issue 36: exchange, then verify what left the namespace).
MOVES_PRIMITIVE = "workspace/moves.py"
#: Modules that move only the ledger's own files — never a workspace's — each with why.
OWN_FILES_MOVERS: dict[str, str] = {
    "blobs.py": "the content-addressed blob store's own temporaries and blobs",
    "backup.py": "backup snapshots and a restore's new ledger directory",
    "seal.py": "seal archives",
    "witness.py": "the witness file",
    "copying.py": "a copy of a ledger into a new place",
    "store/sqlite/database.py": "the ledger's -wal/-shm/-lockq side files and probes",
    "store/sqlite/archive.py": "seal archives of a SQLite ledger",
    "store/sqlite/faultvfs.py": "the fault-injecting VFS's scratch files",
    "ui/__init__.py": "the ui's private launcher file",
    "demo.py": "the demo's own scratch directory",
    "workspace/statcache.py": "observe's stat cache, beside the ledger or in the user's cache",
    "find.py": "a fork's root pointer, in the fork's own .steptrail directory (no workspace file)",
}
#: Calls that change what a name holds: `module.function` or a bare name imported.
_MOVE_CALLS = frozenset({
    "os.unlink", "os.remove", "os.rename", "os.replace", "os.link", "os.rmdir",
    "os.removedirs", "os.renames", "shutil.rmtree", "shutil.move", "exchange.exchange",
    "exchange.rename_noreplace", "_xchg.exchange", "_xchg.rename_noreplace"})
#: Method names that move or remove a file when called on a path object.
_MOVE_METHODS = frozenset({"unlink", "rmdir", "rename", "replace", "hardlink_to"})


def _move_violations(sources: dict[str, str]) -> dict[str, list[int]]:
    """module -> lines of calls that move or remove files outside the primitive (and
    outside the modules that move only the ledger's own files and the test machinery)."""
    out: dict[str, list[int]] = {}
    for rel, source in sources.items():
        if rel == MOVES_PRIMITIVE or rel in OWN_FILES_MOVERS or rel.startswith("testing/"):
            continue
        tree = ast.parse(source)
        strings = {id(n) for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        bad = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f = node.func
            dotted = f"{f.value.id}.{f.attr}" if isinstance(f.value, ast.Name) else ""
            if dotted in _MOVE_CALLS:
                bad.append(node.lineno)
            elif f.attr in _MOVE_METHODS and not (
                    # str.replace(a, b[, n]) and msgspec.structs.replace(x, **kw) are not
                    # moves; nor is a call on the primitive itself (a Mover)
                    f.attr == "replace" and (len(node.args) >= 2 or node.keywords
                                             or id(f.value) in strings
                                             or dotted.endswith("structs.replace")
                                             or isinstance(f.value, ast.Attribute))
                    or "mover" in ast.unparse(f.value).lower()):
                bad.append(node.lineno)
        if bad:
            out[rel] = bad
    return out


def test_every_workspace_byte_move_goes_through_the_verified_primitive() -> None:
    sources = {_rel(p): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert _move_violations(sources) == {}
    for rel in OWN_FILES_MOVERS:  # each entry still moves something (no stale entry)
        assert (PACKAGE / rel).exists(), rel


@pytest.mark.parametrize(("source", "bad"), [
    ("import os\ndef f(d):\n    os.unlink('a', dir_fd=d)\n", [3]),
    ("import os\nos.rename('a', 'b')\n", [2]),
    ("from pathlib import Path\nPath('a').unlink()\n", [2]),
    ("from pathlib import Path\nPath('a').replace('b')\n", [2]),
    ("import shutil\nshutil.rmtree('x')\n", [2]),
    ("from . import exchange\nexchange.exchange(3, 'a', 'b')\n", [2]),
    ("s = 'a'.replace('a', 'b', 1)\nimport msgspec\nmsgspec.structs.replace(x, a=1)\n", []),
    ("def f(self, d):\n    self._mover().rmdir(d, 'x')\n    Mover(o, 't').rmdir(d, 'y')\n", []),
])
def test_the_move_checker_catches_a_violation(source: str, bad: list[int]) -> None:
    """A planted unlink, rename, replace or exchange outside the primitive is caught."""
    assert _move_violations({"workspace/directory.py": source}).get(
        "workspace/directory.py", []) == bad


#: The step states and the names that stand for them: a front end asks a row in words
#: (`StepRow.acked`, `.in_flight`, `.settled_unpublished`, …), never compares its state.
STEP_STATES = frozenset({"planned", "fenced", "blob-stored", "manifest-published", "acked",
                         "compensating", "compensated", "rejected", "sealed"})
STATE_NAMES = frozenset({"PLANNED", "FENCED", "STORED", "PUBLISHED", "ACKED", "COMPENSATING",
                         "COMPENSATED", "REJECTED", "SEALED", "IN_FLIGHT", "ENDED", "UNACKED",
                         "SETTLED"})
STATE_FRONT_ENDS = ("cli/", "mcp/", "ui/", "demo.py", "langgraph/")


def state_comparisons(source: str) -> list[int]:
    """Lines of `source` comparing something's ``.state`` with a step state (a string, a
    name standing for one or a set of them, or a collection of strings)."""
    def is_state(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in STEP_STATES
        if isinstance(node, ast.Name):
            return node.id in STATE_NAMES
        if isinstance(node, ast.Attribute):
            return node.attr in STATE_NAMES
        if isinstance(node, ast.Tuple | ast.Set | ast.List):
            return any(is_state(e) for e in node.elts)
        if isinstance(node, ast.BinOp):
            return is_state(node.left) or is_state(node.right)
        return False

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "state" for s in sides) \
                    and any(is_state(s) for s in sides):
                out.append(node.lineno)
    return out


_TEMPLATE_STATE = re.compile(r"\.state\s*(?:==|!=|in|not in)\s*\(?\s*[\"'](?:"
                             + "|".join(sorted(STEP_STATES)) + r")[\"']")


def test_no_front_end_compares_state_strings() -> None:
    """The MCP server, the command line, the UI (code and templates), the demo and the
    LangGraph saver ask a step's row what it is in words (`StepRow.acked`, `.in_flight`,
    …): a lifecycle re-derived from state strings drifts from the library's."""
    found = {}
    for path in sorted(PACKAGE.rglob("*")):
        rel = str(path.relative_to(PACKAGE))
        if not any(rel == f or rel.startswith(f) for f in STATE_FRONT_ENDS):
            continue
        if path.suffix == ".py":
            hits = state_comparisons(path.read_text())
        elif path.suffix == ".html":
            hits = [i for i, line in enumerate(path.read_text().splitlines(), 1)
                    if _TEMPLATE_STATE.search(line)]
        else:
            continue
        if hits:
            found[rel] = hits
    assert found == {}


@pytest.mark.parametrize("source, bad", [
    ('if row.state == "acked":\n    pass\n', [1]),
    ("x = r.state in IN_FLIGHT\n", [1]),
    ("x = r.state == model.UNACKED\n", [1]),
    ('x = r.state in ("rejected", "compensated")\n', [1]),
    ("x = r.state in IN_FLIGHT | {UNACKED}\n", [1]),
    ('x = witness.state == "none"\nok = r.acked and job.state == "running"\n', []),
])
def test_the_state_checker_catches_a_comparison(source: str, bad: list[int]) -> None:
    assert state_comparisons(source) == bad
    assert _TEMPLATE_STATE.search('{% if row.state == "acked" %}')
    assert not _TEMPLATE_STATE.search('{% if witness.state == "none" %}')


def hand_transitions(source: str) -> list[str]:
    """Calls of `source` that drive a step's transitions by hand (admit, apply, replan,
    store, pin, plan): a front end's step goes through `run_fenced_step`."""
    return sorted({f"{n.lineno}: {n.func.attr}" for n in ast.walk(ast.parse(source))
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr in {"admit", "apply", "replan", "store", "pin", "plan_step"}})


def test_the_demo_runs_every_step_through_run_fenced_step() -> None:
    """The demo (what a newcomer reads first) strings no transition by hand: each step
    is `run_fenced_step`, and its faults are injected at the step's stages (`on_stage`)."""
    assert hand_transitions((PACKAGE / "demo.py").read_text()) == []


def test_the_hand_transition_checker_catches_a_call() -> None:
    assert hand_transitions("ledger.workspaces.admit('w', 1, plans)\nx = 1\n") == ["1: admit"]
    assert hand_transitions("run_fenced_step(ledger, 'w', 's', plan, epoch=1)\n") == []


def attempt_readers(source: str) -> list[str]:
    """Functions of `source` that read one attempt's events themselves: a loop over a
    step's events (``.read(step=…)``, ``.timeline(…)``) that picks them by attempt.
    `ledger.step.attempt.read_attempt` (``Ledger.attempt``) is the one reader."""
    def picks_attempt(node: ast.AST) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Compare):
                for side in (n.left, *n.comparators):
                    if isinstance(side, ast.Attribute) and side.attr == "attempt":
                        return True
                    if (isinstance(side, ast.Call) and isinstance(side.func, ast.Name)
                            and side.func.id == "getattr" and len(side.args) > 1
                            and isinstance(side.args[1], ast.Constant)
                            and side.args[1].value == "attempt"):
                        return True
        return False

    def over_a_step(it: ast.AST) -> bool:
        return (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute)
                and (it.func.attr == "timeline" or (it.func.attr == "read" and any(
                    k.arg == "step" for k in it.keywords))))

    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for loop in ast.walk(fn):
                if isinstance(loop, ast.For | ast.comprehension) and over_a_step(loop.iter) \
                        and picks_attempt(loop):
                    out.append(fn.name)
                    break
    return out


def test_an_attempt_is_read_in_one_place() -> None:
    """The library and every front end read an attempt's events through
    `read_attempt` (``Ledger.attempt``); the test machinery may look for itself."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "step/attempt.py" or rel.startswith("testing/"):
            continue
        hits = attempt_readers(path.read_text())
        if hits:
            found[rel] = hits
    assert found == {}


def test_the_attempt_reader_checker_catches_a_copy() -> None:
    copy = ("def planned_of(led, step, attempt):\n"
            "    for r in led.timeline(step):\n"
            "        if getattr(r.event, 'attempt', None) == attempt:\n"
            "            return r.event\n"
            "def other(log, step, n):\n"
            "    return [r for r in log.read(step=step) if r.event.attempt == n]\n")
    assert attempt_readers(copy) == ["planned_of", "other"]
    assert attempt_readers("def f(led):\n    for r in led.read(kind='acked'):\n"
                           "        x = r.event.attempt == 1\n") == []


# -- a store's capabilities, by name -------------------------------------------------------


def which_store_asks(trees: dict[str, ast.AST]) -> list[str]:
    """Where code outside `ledger/store/` asks which store a location is (`in_database`,
    `.kind ==`) instead of the capability it needs (`local_file`, `shared`,
    `archives_beside`): a third store would fit neither answer."""
    out = []
    for rel, tree in trees.items():
        if rel.startswith("store/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "in_database":
                out.append(f"{rel}:{node.lineno}: .in_database")
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) \
                    and node.left.attr == "kind" and any(
                        isinstance(c, ast.Constant) and c.value in ("sqlite", "postgresql")
                        for c in node.comparators):
                out.append(f"{rel}:{node.lineno}: .kind == a store's name")
    return out


def test_callers_ask_a_capability_not_which_store() -> None:
    assert which_store_asks(_trees()) == []


def test_the_capability_checker_catches_a_store_question() -> None:
    planted = {"copying.py": ast.parse("if locate(dest).in_database:\n    pass\n"),
               "cli/x.py": ast.parse("ok = where.kind == 'postgresql'\n"),
               "store/registry.py": ast.parse("x = self.backend.in_database\n")}
    assert which_store_asks(planted) == ["copying.py:1: .in_database",
                                         "cli/x.py:1: .kind == a store's name"]


#: The longest a class of the package may be (lines, docstrings included): a class past it
#: holds more than one concern — split it by concern into modules (functions over one
#: handle, as ledger/workspace/staging.py, placing.py and leftovers.py are over
#: `WorkspaceDir`), never into mixins over the same state.
CLASS_LINES_MAX = 650


def long_classes(source: str, limit: int = CLASS_LINES_MAX) -> list[tuple[str, int]]:
    """(name, lines) of every class in `source` longer than `limit` lines."""
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > limit]


def test_no_class_holds_more_than_one_concern_by_size() -> None:
    found = {str(p.relative_to(PACKAGE)): long
             for p in sorted(PACKAGE.rglob("*.py")) if (long := long_classes(p.read_text()))}
    assert found == {}, f"classes over {CLASS_LINES_MAX} lines: {found}"


def test_the_class_size_checker_catches_a_long_class() -> None:
    body = "".join(f"    def m{i}(self) -> int:\n        return {i}\n" for i in range(400))
    assert long_classes(f"class Big:\n{body}\nclass Small:\n    pass\n") == [("Big", 801)]
    assert long_classes("class Small:\n    pass\n") == []

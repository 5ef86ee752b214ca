"""Walk one fenced step at run time: which ledger files it enters, and where it calls back up.

Drives `steptrail` in-process (``ledger.cli.main``) on a throwaway SQLite ledger in a temp
directory: ``init``, ``workspace add w DIR``, ``lease acquire``, then one warm-up
``step run`` (imports and caches settle), then a second ``step run PLAN --json``, the
only one traced. During it ``sys.setprofile`` (and ``threading.setprofile``) records
every Python call whose callee's file is in the imported ``ledger`` package, and each
caller-file -> callee-file edge when both files are in it (the immediate caller frame).

Each file's floor comes from the package's static import graph (``ast``): an import of
another ledger module, at top level or inside a function but not under
``if TYPE_CHECKING:``, puts the importer above the imported; ``from pkg import Name``
counts as importing the module ``pkg/__init__.py`` re-exports Name from (lazily or not).
Leaves sit on floor 0; floor = 1 + the highest floor imported; modules in an import cycle
share one floor. A *call back up* is a runtime edge from a lower floor into a higher one
that the caller does not import: a callback, or a call through an object passed down.
Each is told apart: through an *interface* (the method is declared by a Protocol or base
class in a module the caller imports, TYPE_CHECKING included, on its floor or lower:
the caller depends on the interface, the store or projector below implements it), to a
*callback* the caller was handed (a closure, a lambda, a generator), or *back*: neither
— a lower module that knows a higher one's concrete type.

Run:  .venv/bin/python tools/walk_step.py [--json]
(on another checkout: PYTHONPATH=/that/checkout python tools/walk_step.py).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from pathlib import Path
from types import FrameType

import ledger
from ledger.cli import main as steptrail_main

PKG = Path(ledger.__file__).resolve().parent
PREFIX = str(PKG) + os.sep


def modules_of(pkg: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


#: The data model's protocols a caller uses without naming the method.
DATA_MODEL = frozenset({"__enter__", "__exit__", "__iter__", "__next__", "__call__",
                        "__len__", "__contains__", "__getitem__", "__bool__"})


def declared_methods(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the names of the methods its classes declare (Protocols included), and
    of the attributes they declare by annotation (a Protocol's ``info: StoreInfo``, read
    as a property by an implementation, is part of the interface too)."""
    out: dict[str, set[str]] = {}
    for mod, path in mods.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names |= {n.name for n in node.body
                          if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                names |= {n.target.id for n in node.body
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        out[mod] = names
    return out


def import_graph(mods: dict[str, Path], *, typing: bool = False) -> dict[str, set[str]]:
    """Module -> the ledger modules it imports at run time (TYPE_CHECKING blocks skipped,
    unless `typing`)."""
    raw: dict[str, list[tuple[str, str | None]]] = {}
    exports: dict[str, dict[str, tuple[str, str]]] = {}  # package -> name -> (module, name)
    for mod, path in mods.items():
        is_pkg, raw[mod] = path.name == "__init__.py", []

        def visit(node: ast.AST, typing_only: bool, mod: str = mod, is_pkg: bool = is_pkg) -> None:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.body:
                    visit(child, not typing)
                for child in node.orelse:
                    visit(child, typing_only)
                return
            if isinstance(node, ast.Import) and not typing_only:
                raw[mod] += [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = mod.split(".")[: None if is_pkg else -1]
                if node.level:
                    parts = parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                base = ".".join(parts) if node.level else node.module or ""
                for a in node.names:
                    if is_pkg:  # what the package re-exports, eagerly or lazily
                        exports.setdefault(mod, {})[a.asname or a.name] = (base, a.name)
                    if not typing_only:
                        raw[mod].append((base, a.name))
            for child in ast.iter_child_nodes(node):
                visit(child, typing_only)

        visit(ast.parse(path.read_text(encoding="utf-8")), False)

    def target(base: str, name: str | None, depth: int = 0) -> str | None:
        if name is not None:
            if f"{base}.{name}" in mods:
                return f"{base}.{name}"
            if name in exports.get(base, {}) and depth < 10:
                return target(*exports[base][name], depth + 1)
        while base and base not in mods:
            base = base.rpartition(".")[0]
        return base or None

    return {m: {t for b, n in raw[m] if (t := target(b, n)) not in (None, m)} for m in mods}


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Floor of each module: Tarjan's SCCs (emitted callees first), 1 + max floor below."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    floor: dict[str, int] = {}

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = {stack.pop()}
            while v not in comp:
                comp.add(stack.pop())
            f = 1 + max((floor[w] for c in comp for w in graph[c] if w not in comp), default=-1)
            floor.update(dict.fromkeys(comp, f))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in graph:
        if v not in index:
            strong(v)
    return floor


def steptrail(*argv: str) -> tuple[int, str]:
    """`steptrail ARGV` in this process: its exit code and stdout (stderr is kept apart)."""
    sys.argv, out, err = ["steptrail", *argv], io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            steptrail_main()
        except SystemExit as exit_:
            code = exit_.code or 0
    code = code if isinstance(code, int) else 1
    if code:
        sys.exit(f"steptrail {' '.join(argv)}: exit {code}\n{out.getvalue()}{err.getvalue()}")
    return code, out.getvalue()


def traced_step(tmp: Path) -> tuple[Counter, Counter, dict, dict]:
    """Set up a ledger and workspace, run a warm-up step, then trace a second one."""
    for var in [v for v in os.environ if v.startswith("STEPTRAIL_")]:
        del os.environ[var]
    (tmp / "repo").mkdir()
    (tmp / "repo" / "app.py").write_bytes(b"v0\n")
    db = str(tmp / "ledger.db")
    steptrail("--ledger", db, "init")
    steptrail("--ledger", db, "workspace", "add", "w", str(tmp / "repo"))
    _, out = steptrail("--ledger", db, "--workspace", "w", "lease", "acquire",
                       "--holder", "walker", "--ttl", "10m", "--json")
    epoch = str(json.loads(out)["epoch"])
    argv: list[str] = []
    for step, old, new in (("warm-up", b"v0\n", b"v1\n"), ("traced", b"v1\n", b"v2\n")):
        plan = {"step": step, "writes": [{"path": "app.py", "content": new.decode(),
                                          "pre_hash": hashlib.sha256(old).hexdigest()}]}
        (tmp / f"{step}.json").write_text(json.dumps(plan))
        argv = ["--ledger", db, "--workspace", "w", "step", "run", str(tmp / f"{step}.json"),
                "--epoch", epoch, "--json"]
        if step == "warm-up":
            steptrail(*argv)
    calls, edges = Counter(), Counter()
    names: defaultdict[tuple[str, str], Counter] = defaultdict(Counter)

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(PREFIX):
            return
        callee = frame.f_code.co_filename
        calls[callee] += 1
        if frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(PREFIX):
            edges[frame.f_back.f_code.co_filename, callee] += 1
            names[frame.f_back.f_code.co_filename, callee][frame.f_code.co_qualname] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        code, out = steptrail(*argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    doc = json.loads(out)
    _, shown = steptrail("--ledger", db, "show", "traced", "--json")
    state = json.loads(shown)["step"]
    if not (code == 0 and doc.get("ok") and doc.get("committed") and state["committed"]):
        sys.exit(f"the traced step did not commit: {out}")
    commit = {"exit_code": code, "step": doc["step"], "attempt": doc["attempt"],
              "committed": doc["committed"], "state": state["state"],
              "fenced_seq": doc["apply"]["receipt"]["seq"], "workspace_rev": state["rev"],
              "manifest_seq": doc["manifest"]["seq"], "ack_seq": doc["ack"]["seq"],
              "last_seq": state["last_seq"]}
    return calls, edges, names, commit


def report(calls: Counter, edges: Counter, names: dict, commit: dict) -> dict:
    mods = modules_of(PKG)
    graph = import_graph(mods)
    floor = floors(graph)
    module = {str(p): m for m, p in mods.items()}
    rel = {str(p): str(p.relative_to(PKG)) for p in mods.values()}
    files = sorted(calls, key=lambda f: (-floor.get(module.get(f, ""), -1), rel.get(f, f)))
    back_up = {(a, b): n for (a, b), n in edges.items() if a in module and b in module
               and floor[module[a]] < floor[module[b]] and module[b] not in graph[module[a]]}
    typed = import_graph(mods, typing=True)
    source = {f: Path(f).read_text(encoding="utf-8") for f in module}
    declared = declared_methods(mods)

    def kind(a: str, qualname: str) -> str:
        """How a call up reached `qualname`: a function the caller was handed (a closure,
        a lambda, a generator, or a bound method the caller's source never names:
        "callback"), a method of Python's data model (a `with`, a `for`) or a method an interface below the caller
        declares ("interface": a Protocol or base class the caller imports, on its floor
        or lower — the caller knows only that), or neither ("back")."""
        if "<" in qualname:
            return "callback"
        method = qualname.rsplit(".", 1)[-1]
        if method in DATA_MODEL:
            return "interface"  # Python's own protocols: `with`, `for`, a call
        if not re.search(rf"\b{re.escape(method)}\b", source[a]):
            return "callback"  # never named by the caller: a function it was handed
        below = [m for m in (module[a], *typed[module[a]]) if floor[m] <= floor[module[a]]]
        return "interface" if any(method in declared[m] for m in below) else "back"

    ups = []
    for (a, b), n in sorted(back_up.items(), key=lambda e: -e[1]):
        kinds = {q: kind(a, q) for q in names[a, b]}
        ups.append({"caller": rel[a], "caller_floor": floor[module[a]], "callee": rel[b],
                    "callee_floor": floor[module[b]], "calls": n,
                    "functions": dict(names[a, b]), "kinds": kinds})
    by_kind = Counter()
    for u in ups:
        for q, k in u["kinds"].items():
            by_kind[k] += u["functions"][q]
    return {"package": str(PKG), "modules": len(mods), "floors": 1 + max(floor.values()),
            "files_entered": len(calls),
            "files": [{"file": rel.get(f, f), "floor": floor.get(module.get(f, ""), None),
                       "calls": calls[f]} for f in files],
            "call_back_up_edges": len(ups), "call_back_up_calls": sum(back_up.values()),
            "call_back_up_by_kind": {k: by_kind.get(k, 0)
                                     for k in ("interface", "callback", "back")},
            "calls_back_up": ups, "into_ledger_py": [u for u in ups if u["callee"] == "ledger.py"],
            "commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="walk-step-") as tmp:
        doc = report(*traced_step(Path(tmp)))
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"package {doc['package']}: {doc['modules']} modules on {doc['floors']} floors")
    print(f"files entered by one fenced step: {doc['files_entered']}")
    print(f"  {'floor':>5} {'calls':>7}  file")
    for f in doc["files"]:
        print(f"  {f['floor']:>5} {f['calls']:>7}  {f['file']}")
    k = doc["call_back_up_by_kind"]
    print(f"calls back up: {doc['call_back_up_edges']} distinct edges, "
          f"{doc['call_back_up_calls']} calls: {k['interface']} through an interface the"
          f" caller imports, {k['callback']} to a function it was handed, {k['back']} neither")
    for u in doc["calls_back_up"]:
        mark = "  <- into ledger.py" if u["callee"] == "ledger.py" else ""
        print(f"  {u['caller']} ({u['caller_floor']}) -> {u['callee']} ({u['callee_floor']})"
              f" x{u['calls']}{mark}")
        print("      " + ", ".join(f"{f} x{n}" + ("" if u["kinds"][f] == "interface"
                                                      else f" [{u['kinds'][f]}]")
                                   for f, n in u["functions"].items()))
    into = doc["into_ledger_py"]
    print(f"into ledger.py from below: {len(into)} edges, {sum(u['calls'] for u in into)} calls")
    c = doc["commit"]
    print(f"COMMIT: step {c['step']} attempt {c['attempt']} committed={c['committed']} "
          f"state={c['state']} (exit {c['exit_code']}); fenced at seq {c['fenced_seq']} "
          f"(workspace rev {c['workspace_rev']}), manifest seq {c['manifest_seq']}, "
          f"ack seq {c['ack_seq']}")


if __name__ == "__main__":
    main()

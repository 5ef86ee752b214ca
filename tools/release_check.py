#!/usr/bin/env python3
"""Install steptrail the way a user does, and run the documentation against that.

    .venv/bin/python tools/release_check.py            # what `.ci/run` runs after `make test`
    .venv/bin/python tools/release_check.py --keep DIR # keep the dist/ and the venvs in DIR

1. Builds the sdist and the wheel (`python -m build`, in an isolated build environment,
   as a packager does) and checks them (`twine check --strict`): metadata, the README
   as the long description.
2. Looks inside the wheel: one version (the wheel's, the metadata's and
   `ledger.__version__` agree), the `steptrail` console script and the plugin entry
   points, `py.typed`, every package under ledger/, and nothing of tests/ or tools/.
3. Installs the **wheel** (not the checkout, not editable) into fresh venvs, each with
   only the extras it tests, and runs the README's, docs/'s and examples/'s snippets
   there as printed (tests/docs/test_readme.py, tests/docs/test_docs.py, the LangGraph docs test,
   tests/docs/test_examples.py), with ``STEPTRAIL_TEST_INSTALLED=1``: the snippets import the
   installed package (no PYTHONPATH to the checkout; a test checks where `ledger` was
   imported from), and a snippet whose extra the venv lacks is skipped, naming it:

   - ``core``: the wheel alone (apsw, msgspec, click, sqlite-utils): every snippet that
     needs no extra runs here;
   - ``extras``: the wheel with ``[mcp,langgraph,postgres,ui]``: the rest, and the ui's
     pages (its templates and static files must be in the wheel).

The test tools (pytest, hypothesis, and LangGraph's conformance suite the LangGraph
test module imports) are installed beside the wheel; none of them is steptrail's.
Exit 0 when every step passed; each failure is printed with what to look at.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100"]
#: venv name -> (extras, test tools beyond TEST_TOOLS, the tests it runs)
VENVS: dict[str, tuple[str, list[str], list[str]]] = {
    "core": ("", [], [
        "tests/docs/test_readme.py", "tests/docs/test_docs.py", "tests/docs/test_examples.py"]),
    "extras": ("[mcp,langgraph,postgres,ui]", ["langgraph-checkpoint-conformance==0.0.2"], [
        "tests/docs/test_readme.py", "tests/docs/test_docs.py", "tests/docs/test_examples.py",
        "tests/checkpointer/test_langgraph.py::test_the_langgraph_docs_snippets_run_as_printed",
        "tests/ui/test_ui.py"]),  # the ui's templates and static files ship in the wheel
}


class Failed(Exception):
    pass


def run(cmd: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None,
        what: str) -> str:
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise Failed(f"{what} failed (exit {done.returncode}, {took:.0f} s): {' '.join(cmd)}\n{tail}")
    print(f"  ok  {what} ({took:.0f} s)", flush=True)
    return done.stdout


def version() -> str:
    text = (ROOT / "ledger" / "__init__.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if not found:
        raise Failed("ledger/__init__.py has no __version__ = \"X.Y.Z\" line")
    return found[1]


def build(dist: Path) -> tuple[Path, Path]:
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(ROOT)],
        what="build the sdist and the wheel")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise Failed(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}")
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)],
        what="twine check --strict")
    return wheels[0], sdists[0]


def inspect_wheel(wheel: Path) -> None:
    want = version()
    if not wheel.name.startswith(f"steptrail-{want}-"):
        raise Failed(f"the wheel {wheel.name} is not steptrail {want} (ledger.__version__)")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    problems = []
    if meta["Name"] != "steptrail" or meta["Version"] != want:
        problems.append(f"metadata says {meta['Name']} {meta['Version']}, not steptrail {want}")
    extras = set(meta.get_all("Provides-Extra") or [])
    if not {"mcp", "langgraph", "postgres", "ui"} <= extras:
        problems.append(f"extras {sorted(extras)} lack one of mcp, langgraph, postgres, ui")
    for asset in ("ledger/ui/static/ui.js", "ledger/ui/templates/base.html"):
        if asset not in names:
            problems.append(f"{asset} is not in the wheel")
    if "steptrail = ledger.cli:main" not in entry or "[steptrail.commands]" not in entry:
        problems.append("entry_points.txt lacks the steptrail script or the plugin group")
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "ledger").rglob("__init__.py")}
    shipped = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    if packages - shipped:
        problems.append(f"packages not in the wheel: {sorted(packages - shipped)}")
    if "ledger/py.typed" not in names:
        problems.append("ledger/py.typed is not in the wheel")
    strays = [n for n in names if n.startswith(("tests/", "tools/", "docs/")) or "__pycache__" in n]
    if strays:
        problems.append(f"files that are not the package: {strays[:5]}")
    if problems:
        raise Failed("the wheel: " + "; ".join(problems))
    print(f"  ok  the wheel holds steptrail {want}: {len(names)} files,"
          f" extras {', '.join(sorted(extras))}", flush=True)


def venv_with(where: Path, wheel: Path, extras: str, tools: list[str]) -> Path:
    run([sys.executable, "-m", "venv", str(where)], what=f"a fresh venv ({where.name})")
    py = where / "bin" / "python"
    run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"{wheel}{extras}", *TEST_TOOLS, *tools],
        what=f"pip install the wheel{extras or ' (no extra)'}")
    # The installed package, from a directory where the checkout is not importable.
    got = run([str(py), "-c", "import ledger, sys; print(ledger.__file__, ledger.__version__)"],
              cwd=where, what="import ledger from the venv")
    if str(ROOT / "ledger") in got or str(where) not in got:
        raise Failed(f"`import ledger` in {where.name} found {got.strip()}, not the installed wheel")
    return py


def snippets(py: Path, name: str, tests: list[str]) -> None:
    present = [t for t in tests if (ROOT / t.split("::")[0]).exists()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(STEPTRAIL_TEST_INSTALLED="1", PATH=f"{py.parent}{os.pathsep}{env.get('PATH', '')}")
    # `pytest` (the venv's script), not `python -m pytest`: the latter puts the current
    # directory — the checkout — first on sys.path, and the checkout's `ledger` would be
    # imported instead of the wheel's.
    out = run([str(py.parent / "pytest"), "-q", "-p", "no:cacheprovider", "-rs", *present],
              env=env, what=f"the snippets against the installed wheel ({name})")
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|skipped|failed)", line)]
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    print(f"      {summary[-1] if summary else out.strip().splitlines()[-1]}")
    for line in skips:
        print(f"      {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="build and install in DIR and keep it (default: a temporary directory)")
    ap.add_argument("--venvs", default=",".join(VENVS), help=f"which venvs (default {','.join(VENVS)})")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="steptrail-release-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"release check: steptrail {version()} in {base}", flush=True)
    try:
        wheel, _ = build(base / "dist")
        inspect_wheel(wheel)
        for name in args.venvs.split(","):
            extras, tools, tests = VENVS[name]
            where = base / f"venv-{name}"
            shutil.rmtree(where, ignore_errors=True)
            py = venv_with(where, wheel, extras, tools)
            snippets(py, name, tests)
    except Failed as exc:
        print(f"release check: FAILED — {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print("release check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

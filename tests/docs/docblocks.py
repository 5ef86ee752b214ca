"""The code blocks of a Markdown document, and running them as printed.

Shared by tests/docs/test_readme.py and tests/docs/test_docs.py: the documentation's snippets are
run verbatim, each in an empty directory unless the text right before it says it
continues the previous one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The directory of the interpreter running the tests: the venv's bin, which holds the
#: `steptrail` command `pip install -e .` made.
BIN = Path(sys.executable).parent
#: Set by tools/release_check.py: the snippets run against the built wheel installed in
#: this interpreter's venv — not the checkout (no PYTHONPATH) — and a block that needs an
#: extra that venv did not install is skipped, naming it (the check installs each venv
#: with only the extras it tests: the core snippets run with none).
INSTALLED = os.environ.get("STEPTRAIL_TEST_INSTALLED") == "1"
#: extra -> (what in a block's text needs it, the module the extra installs)
EXTRAS = {
    "langgraph": (re.compile(r"\blanggraph\b"), "langgraph"),
    "postgres": (re.compile(r"postgresql://|\bpgserver\b|\$URL\b"), "psycopg"),
    "mcp": (re.compile(r"\bsteptrail mcp\b|\.mcp\.json|\bmcp\.(client|server)\b"), "mcp"),
}
#: The words that mark a block as the continuation of the one before it.
CONTINUES = re.compile(r"continu\w* the previous", re.I)

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6}) (.*)$")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    section: str  # the nearest heading above it
    before: str  # the prose between the previous block or heading and this one

    @property
    def continues(self) -> bool:
        return bool(CONTINUES.search(self.before))

    def where(self, doc: str) -> str:
        return f"{doc}:{self.line} ({self.lang} block under {self.section!r})"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of `path`, in order, its indentation removed."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    section, prose = "", []
    i = 0
    while i < len(lines):
        heading = _HEADING.match(lines[i])
        fence = _FENCE.match(lines[i])
        if heading:
            section, prose = heading[2], []
        elif fence:
            start, indent = i, len(fence["indent"])
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            code = textwrap.dedent("\n".join(body)) + "\n"
            assert all(not line.strip() or line.startswith(" " * indent) for line in body), (
                f"{path.name}:{start + 1}: a block's lines must keep the fence's indentation")
            out.append(Block(fence["lang"], code, start + 1, section, "\n".join(prose)))
            prose = []
        else:
            prose.append(lines[i])
        i += 1
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The user's environment, minus any STEPTRAIL_* setting, with the venv's bin first
    on PATH (a user who installed steptrail has `steptrail` on theirs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if not INSTALLED:
        env["PYTHONPATH"] = str(ROOT)  # the checkout under test, whatever the cwd
    env.update(extra)
    return env


def extras_needed(code: str) -> list[str]:
    """The extras a snippet's text needs (the core needs none)."""
    return [name for name, (words, _) in EXTRAS.items() if words.search(code)]


def skip_without_extras(code: str) -> None:
    """In an installed-wheel run, skip a snippet whose extra this venv does not have."""
    if INSTALLED:
        import importlib.util

        import pytest

        missing = [n for n in extras_needed(code) if importlib.util.find_spec(EXTRAS[n][1]) is None]
        if missing:
            pytest.skip(f"needs the {', '.join(missing)} extra (not in this venv)")


def needs_extra(name: str) -> object:
    """A test's mark: in an installed-wheel run whose venv lacks the extra `name`, skip
    (before any fixture runs, so a PostgreSQL server is not started for nothing)."""
    import importlib.util

    import pytest

    missing = INSTALLED and importlib.util.find_spec(EXTRAS[name][1]) is None
    return pytest.mark.skipif(missing, reason=f"needs the {name} extra (not in this venv)")


def run_python(block: Block, cwd: Path, doc: str, timeout: float = 120) -> str:
    """Run a python block verbatim in `cwd`; return its stdout. Every `print(...)  # X`
    line must have printed a line that X starts with (the comment says what it prints)."""
    skip_without_extras(block.code)
    done = subprocess.run([sys.executable, "-c", block.code], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{block.where(doc)} failed (exit {done.returncode}):\n{block.code}\n{done.stderr}")
    printed = done.stdout.splitlines()
    for line in block.code.splitlines():
        said = re.match(r"\s*print\(.*\)\s+# (.+)$", line)
        if said:
            claim = said[1].strip()
            assert any(p and claim.startswith(p.strip()) for p in printed), (
                f"{block.where(doc)}: `{line.strip()}` says it prints {claim!r};"
                f" it printed {printed}")
    return done.stdout


def run_shell(code: str, cwd: Path, doc: str, what: str, *, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run shell text verbatim with bash, stopping at the first failing command."""
    skip_without_extras(code)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{doc}: {what} failed (exit {done.returncode}):\n{code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done


def commands(code: str) -> list[str]:
    """A shell block's commands, one per line (comments and blank lines dropped); a
    heredoc stays with the command that opens it."""
    out: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            body = [line]
            while i < len(lines):
                body.append(lines[i])
                i += 1
                if lines[i - 1].strip() == heredoc[1]:
                    break
            out.append("\n".join(body))
        else:
            out.append(line)
    return out

"""README.md as a newcomer uses it: every snippet runs as printed, in an empty directory.

- Each ```python block runs verbatim with this interpreter, in its own EMPTY temporary
  directory — unless the prose right before it says it "continues the previous" block,
  then in that block's directory. Nothing is prepared: a file a snippet needs, it makes.
  A `print(...)  # X` line must print what its comment says.
- Each ```sh block runs verbatim with bash (stopping at the first failing command) in an
  empty directory, with the venv's bin first on PATH, as after `pip install`. The one
  exception, by a narrow rule: a set-up block — every command in it is `make …` or
  `pip install …` — is not run here (`make test` is what runs this test; `.ci/run` and
  a fresh clone run both make targets).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from docblocks import BIN, ROOT, Block, blocks, clean_env, commands, run_python, run_shell

README = ROOT / "README.md"
ALL = blocks(README)


def is_setup(block: Block) -> bool:
    """The narrow rule: a shell block made only of `make` and `pip install` commands."""
    cmds = commands(block.code)
    return bool(cmds) and all(re.match(r"(make|pip install) ", c) for c in cmds)


def test_readme_has_the_blocks_a_newcomer_needs() -> None:
    langs = [b.lang for b in ALL]
    assert langs.count("python") >= 2 and langs.count("sh") >= 3
    assert {b.lang for b in ALL} <= {"python", "sh"}, "a block in an untested language"
    assert not ALL[0].continues  # there is nothing to continue


def test_the_two_setup_commands_are_the_ones_ci_and_make_run() -> None:
    setup = [b for b in ALL if b.lang == "sh" and is_setup(b)]
    cmds = [c.split("#")[0].strip() for b in setup for c in commands(b.code)]
    assert cmds[:2] == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    # installing into one's own project: from a path, with the extras by name — and never
    # a distribution name the index gives to another project, nor a placeholder URL
    pips = [c for c in cmds if c.startswith("pip install")]
    assert any(re.fullmatch(r"pip install /path/to/steptrail", c) for c in pips)
    assert any(re.fullmatch(r"pip install '/path/to/steptrail\[[a-z,]+\]'", c) for c in pips)
    assert not re.search(r"YOUR-ORG|git\+https://|pip install '?stepledger", README.read_text())


def test_the_snippets_import_the_package_under_test(tmp_path: Path) -> None:
    """The checkout's `ledger` (PYTHONPATH) in a dev run; the installed wheel's, and never
    the checkout's, under tools/release_check.py (STEPTRAIL_TEST_INSTALLED=1)."""
    import subprocess
    import sys

    from docblocks import INSTALLED

    done = subprocess.run([sys.executable, "-c", "import ledger; print(ledger.__file__)"],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=True)
    found = Path(done.stdout.strip()).resolve()
    assert found.is_relative_to(ROOT / "ledger") != INSTALLED, found


PYTHON = [b for b in ALL if b.lang == "python"]


def chain(k: int) -> list[Block]:
    """Python block k and the blocks it continues, oldest first."""
    start = k
    while start > 0 and PYTHON[start].continues:
        start -= 1
    return PYTHON[start : k + 1]


@pytest.mark.parametrize("k", range(len(PYTHON)))
def test_readme_python_block_runs_as_printed(k: int, tmp_path: Path) -> None:
    for block in chain(k):  # in one directory, empty before the first of them
        run_python(block, tmp_path, "README.md")


def test_readme_shell_blocks_run_as_printed(tmp_path: Path) -> None:
    assert (BIN / "steptrail").exists(), f"{BIN} has no steptrail: pip install -e ."
    ran = 0
    for i, block in enumerate(ALL):
        if block.lang != "sh" or is_setup(block):
            continue
        d = tmp_path / f"sh{i}"
        d.mkdir()
        run_shell(block.code, d, "README.md", block.where("README.md"), env=clean_env())
        ran += 1
    assert ran >= 1


def test_the_cli_quickstart_leaves_what_it_says(tmp_path: Path) -> None:
    """The shell quickstart's outcome: the workspace step is committed and its write on
    disk, the artifact step's run sealed into an archive, verify and audit hold, and the
    backup restored elsewhere holds the archive too."""
    block = next(b for b in ALL if b.lang == "sh" and "steptrail init" in b.code)
    run_shell(block.code, tmp_path, "README.md", block.where("README.md"))
    repo = tmp_path / "repo"
    assert (repo / "app.py").read_text() == 'print("v1")\n# reviewed\n'  # the person's line
    steps = run_shell("steptrail steps --json", repo, "README.md", "steps").stdout
    states = {s["step_id"]: (s["state"], s["committed"]) for s in json.loads(steps)}
    # the lease's observation (the baseline: every file of the new workspace), then the
    # person's edit observed by hand (with the files the quickstart made meanwhile);
    # the artifact step's run sealed: its tombstone stays, its events are archived
    baseline, observed = sorted((s for s in states if s.startswith("observed-repo-")),
                                key=lambda s: int(s.split("-r")[-1].split("-")[0]))
    assert states.pop(baseline) == states.pop(observed) == ("acked", True)
    assert states == {"edit-1": ("acked", True), "tests-1": ("sealed", False)}
    changes = json.loads(run_shell(f"steptrail events --step {observed} --json", repo,
                                   "README.md", "events").stdout)
    [fenced] = [e for e in changes if e["kind"] == "fenced"]
    assert "app.py" in [w["path"] for w in fenced["event"]["writes"]]
    assert len(list((repo / ".steptrail" / "archive").iterdir())) == 1
    fresh = tmp_path / "fresh" / ".steptrail"  # the restored copy, with the archive
    assert (fresh / "ledger.db").is_file() and len(list((fresh / "archive").iterdir())) == 1


def test_the_readme_is_for_users() -> None:
    """Short, no working notes, nothing outside the repository, every doc linked."""
    text = README.read_text()
    assert len(text.splitlines()) <= 235  # the set-up, quickstarts, the integrations, guarantees
    for note in ("this session", "this machine", "Status:", "> Status", "TODO", "issue "):
        assert note not in text, note
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date"
    links = set(re.findall(r"\]\(([^)#]+)", text))
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in links, f"README does not link docs/{doc.name}"
    assert "ARCHITECTURE.md" in links

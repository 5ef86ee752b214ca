"""The command line imports only what a command needs (docs/performance.md "The command
line"): the choices it spells out are the library's, `import ledger.cli` loads neither the
ledger nor the store, and a command loads no other command's heavy modules. No timing
here: the speed is measured by tools/bench_cli.py, as ratios."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ledger
import ledger.cli as cli_mod
from ledger.step.values import FENCE_MODES
from ledger.projections.steps import IN_FLIGHT, STATES


def test_the_choices_spelled_out_are_the_librarys() -> None:
    assert cli_mod.DEFAULT_PATH == ledger.DEFAULT_PATH
    assert tuple(cli_mod.FENCE_MODES) == tuple(FENCE_MODES)
    assert tuple(cli_mod.STATES) == tuple(STATES)
    assert cli_mod.IN_FLIGHT == IN_FLIGHT
    from ledger.ui import model as ui_model

    assert tuple(ui_model.STATES) == tuple(STATES)
    assert set(ui_model.IN_FLIGHT) == set(IN_FLIGHT)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (which may exit)."""
    probe = ("import atexit, json, sys\n"
             "atexit.register(lambda: sys.__stderr__.write('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n'))\n")
    done = subprocess.run([sys.executable, "-c", probe + code], capture_output=True, text=True)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def run_main(*argv: str) -> str:
    return f"import sys\nsys.argv = ['steptrail', *{list(argv)!r}]\nfrom ledger.cli import main\nmain()\n"


HEAVY = {"sqlite_utils", "ledger.gc", "ledger.metrics", "ledger.demo", "ledger.testing.chaos",
         "ledger.testing.faults", "ledger.testing.fuzz", "ledger.mcp", "mcp"}
#: What listing the commands other packages add (the entry points) loads: `--help` only.
ADDED = {"importlib.metadata", "ledger.testing", "ledger.testing.commands"}


def test_importing_the_cli_loads_no_ledger_and_no_store() -> None:
    mods = loaded_after("import ledger.cli")
    assert "ledger.cli" in mods
    assert not {"ledger.ledger", "ledger.workspaces", "ledger.step", "ledger.store", "apsw", *HEAVY} & mods


def test_the_packages_names_are_found_on_first_use() -> None:
    mods = loaded_after("import ledger.errors")
    assert "ledger.ledger" not in mods and "ledger.workspaces" not in mods
    mods = loaded_after("from ledger import StaleEpoch, Ledger, load_plan")
    assert {"ledger.ledger", "ledger.plans"} <= mods
    assert set(dir(ledger)) >= set(ledger.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ledger.nope  # noqa: B018


@pytest.mark.parametrize("argv", [("--help",), ("demo", "--help"), ("step", "--help")])
def test_help_loads_no_ledger(argv: tuple[str, ...]) -> None:
    mods = loaded_after(run_main(*argv))
    assert not {"ledger.ledger", "apsw", *HEAVY} & mods


def test_a_read_command_loads_no_other_commands_modules(tmp_path: object) -> None:
    db = f"{tmp_path}/l.db"
    subprocess.run([sys.executable, "-m", "ledger", "--ledger", db, "init"], check=True,
                   capture_output=True)
    for argv in (("steps",), ("head",), ("steps", "--json")):
        mods = loaded_after(run_main("--ledger", db, *argv))
        assert "ledger.ledger" in mods
        assert not (HEAVY | ADDED) & mods, (argv, (HEAVY | ADDED) & mods)


def test_help_lists_the_added_commands_without_their_machinery() -> None:
    """`steptrail --help` lists chaos and fuzz (entry points of `steptrail.commands`),
    loading their module but none of the machinery they run."""
    done = subprocess.run([sys.executable, "-m", "ledger", "--help"], capture_output=True,
                          text=True, check=True)
    assert {"chaos", "fuzz"} <= {line.split()[0] for line in done.stdout.splitlines()
                                 if line.startswith("  ") and line.split()}
    mods = loaded_after(run_main("--help"))
    assert "ledger.testing.commands" in mods and not HEAVY & mods

"""`steptrail completion bash|zsh|fish`: the script click writes, loaded by a real bash
that completes commands and choices through the installed `steptrail`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import cli

STEPTRAIL = Path(sys.executable).parent / "steptrail"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shell_gets_a_script_that_asks_steptrail(shell: str) -> None:
    r = CliRunner().invoke(cli, ["completion", shell])
    assert r.exit_code == 0, r.output
    assert "_STEPTRAIL_COMPLETE" in r.stdout and "steptrail" in r.stdout


def test_an_unknown_shell_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([str(STEPTRAIL), "completion", "powershell"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'powershell' is not one of 'bash', 'zsh', 'fish'" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, no ledger made


def _bash_complete(words: str, tmp_path: Path) -> list[str]:
    """Load the script into a real bash and ask it to complete `words` (the last word
    partial), as TAB does; return the candidates."""
    script = subprocess.run([str(STEPTRAIL), "completion", "bash"], capture_output=True,
                            text=True, check=True).stdout
    (tmp_path / "complete.bash").write_text(script)
    n = len(words.split()) - (0 if words.endswith(" ") else 1)
    probe = (f'source {tmp_path / "complete.bash"}\n'
             f'COMP_WORDS=({words}); COMP_CWORD={n}\n'
             f'_steptrail_completion {STEPTRAIL}\n'
             'printf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], cwd=tmp_path,
                          capture_output=True, text=True, check=True,
                          env={"PATH": f"{STEPTRAIL.parent}:/usr/bin:/bin"})
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_a_real_bash_completes_commands_and_choices(tmp_path: Path) -> None:
    assert {"steps", "step", "stats", "status"} <= set(_bash_complete("steptrail st", tmp_path))
    assert _bash_complete("steptrail steps --state bl", tmp_path) == ["blob-stored"]
    assert "--in-flight" in _bash_complete("steptrail steps --in", tmp_path)
    assert not (tmp_path / ".steptrail").exists()  # completing opens no ledger

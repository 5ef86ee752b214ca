"""README's Python examples run as written (in order, in one fresh directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_examples_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "app.py").write_text('print("v0")\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i, code in enumerate(blocks):
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"README python block {i + 1} failed:\n{code}\n{done.stderr}"

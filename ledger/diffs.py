"""Unified diffs of two versions of a file, as a person or an agent reads them.

Used where a refused write explains itself: what the planner read against what is on
disk now (`ledger.runner.run_fenced_step`'s conflicts, the MCP tools'). Pure: no I/O.
"""

from __future__ import annotations

import difflib
from typing import Final

#: Diffs are cut to this many lines.
DIFF_LINES_MAX: Final = 400
#: Files larger than this are not diffed (difflib is quadratic at worst).
DIFF_INPUT_MAX: Final = 2 * 1024 * 1024


def unified_diff(before: bytes | None, after: bytes | None, path: str, *,
                 before_label: str = "", after_label: str = "") -> str:
    """A git-style unified diff of two versions of one file, cut to DIFF_LINES_MAX
    lines ('' when they are equal). Bytes that are not UTF-8 are shown replaced."""
    if before == after:
        return ""
    if len(before or b"") > DIFF_INPUT_MAX or len(after or b"") > DIFF_INPUT_MAX:
        return f"(no diff: {path} is larger than {DIFF_INPUT_MAX} bytes)"
    a = [] if before is None else before.decode("utf-8", "replace").splitlines(keepends=True)
    b = [] if after is None else after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = list(difflib.unified_diff(
        a, b, fromfile=f"a/{path}" + (f" ({before_label})" if before_label else ""),
        tofile=f"b/{path}" + (f" ({after_label})" if after_label else "")))
    out = []
    for line in lines[:DIFF_LINES_MAX]:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if len(lines) > DIFF_LINES_MAX:
        out.append(f"... ({len(lines) - DIFF_LINES_MAX} more diff lines not shown)\n")
    return "".join(out)


__all__ = ["DIFF_INPUT_MAX", "DIFF_LINES_MAX", "unified_diff"]

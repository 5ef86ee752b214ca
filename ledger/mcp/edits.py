"""Text edits (the reference filesystem server's ``edit_file``) and unified diffs.

An edit replaces `oldText` with `newText`. It must match exactly once: first exactly,
then — as the reference server does — line by line ignoring each line's leading and
trailing whitespace, the replacement re-indented like the lines it replaces. An edit
that matches nowhere, or more than once, is refused: a wrong-place edit is worse than
none. A file written with CRLF line endings keeps them (the edit's LF become CRLF).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..diffs import DIFF_INPUT_MAX, DIFF_LINES_MAX, unified_diff  # noqa: F401 (re-exported)


class EditRefused(Exception):
    """An edit that cannot be applied; the message is one line for the agent."""


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def apply_edits(text: str, edits: Sequence[tuple[str, str]], path: str) -> str:
    """`text` with every edit applied in order (see the module)."""
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:
        text = text.replace("\r\n", "\n")
    for n, (old, new) in enumerate(edits, 1):
        old = old.replace("\r\n", "\n")
        new = new.replace("\r\n", "\n")
        if old == "":
            raise EditRefused(f"edit {n} of {path}: oldText is empty; give the exact text to"
                              " replace (to write a whole file, use write_file)")
        count = text.count(old)
        if count == 1:
            text = text.replace(old, new, 1)
            continue
        if count > 1:
            raise EditRefused(f"edit {n} of {path}: oldText occurs {count} times; include more"
                              " surrounding lines so it matches exactly once")
        text = _apply_by_lines(text, old, new, n, path)
    return text.replace("\n", "\r\n") if crlf else text


def _apply_by_lines(text: str, old: str, new: str, n: int, path: str) -> str:
    lines = text.split("\n")
    old_lines = old.split("\n")
    while old_lines and old_lines[-1].strip() == "":
        old_lines.pop()
    if not old_lines:
        raise EditRefused(f"edit {n} of {path}: oldText is only whitespace")
    hits = _find_lines([x.strip() for x in lines], [x.strip() for x in old_lines])
    if not hits:
        raise EditRefused(f"edit {n} of {path}: oldText was not found (not even ignoring"
                          " indentation); read the file again and copy the text exactly")
    if len(hits) > 1:
        raise EditRefused(f"edit {n} of {path}: oldText matches more than one place ignoring"
                          " indentation; include more surrounding lines")
    i = hits[0]
    want = old_lines
    base = _indent(lines[i])
    old_base = _indent(old_lines[0])
    out = []
    for line in new.split("\n"):
        if line.startswith(old_base):
            out.append(base + line[len(old_base):])
        else:
            out.append(base + line.lstrip() if line.strip() else line)
    return "\n".join([*lines[:i], *out, *lines[i + len(want):]])


def _find_lines(haystack: list[str], needle: list[str]) -> list[int]:
    """Where the line sequence `needle` starts in `haystack`: at most the first two
    places. Each distinct line becomes one character and the search is `str.find`'s,
    so the time follows the lengths, never their product (an agent-written oldText of
    10,000 lines against a 20,000-line file answers at once)."""
    ids: dict[str, str] = {}

    def code(line: str) -> str:
        got = ids.get(line)
        if got is None:
            n = len(ids)
            if n >= 0x10F000:
                raise EditRefused("the file has too many distinct lines for a match that"
                                  " ignores indentation; give oldText exactly")
            got = ids[line] = chr(n + 0x800 if n >= 0xD800 else n)  # no surrogates
        return got

    hay = "".join(code(x) for x in haystack)
    if any(x not in ids for x in needle):
        return []  # a line the file does not have
    pin = "".join(ids[x] for x in needle)
    first = hay.find(pin)
    if first < 0:
        return []
    second = hay.find(pin, first + 1)
    return [first] if second < 0 else [first, second]



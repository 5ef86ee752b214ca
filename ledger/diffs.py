"""Diffs of two versions of a file, as a person or an agent reads them, bounded by
design: any two inputs cost at most a fixed amount of work.

Used where a refused write explains itself (what the planner read against what is on
disk now: `ledger.runner.run_fenced_step`'s conflicts, the CLI's ``step apply``, the
MCP tools') and by the UI's step and history pages. Pure: no I/O.

A textbook diff (difflib's, git's Myers without its heuristics) costs time quadratic in
the lines that differ: a formatter's rewrite of a 20,000-line file — every other line
changed — took difflib 21 s. Here the work is bounded three ways, and what was not
compared is counted, never silently dropped:

1. the common prefix and suffix are stripped in linear time;
2. the rest is compared a *window* of `WINDOW` lines of each side at a time
   (difflib on at most WINDOW x WINDOW lines); a window's result is kept up to its last
   block of equal lines, where both sides are known to be in step, and the next window
   starts there — so an insertion longer than a window shows as a deletion and an
   insertion (a valid diff, not the smallest one), never as a wrong one;
3. the comparison stops once `max_changed` changed lines are found (the first hunks are
   what a reader reads), after `MAX_WINDOWS` windows (a bound on the work that needs no
   clock: sparse changes among many identical lines reach no change cap), or once a
   `deadline` passes; the lines not compared are reported
   (`Bounded.rest_before`, `rest_after`) with a cheap linear estimate of how many of
   them differ (`rest_removed`, `rest_added`: lines of one side missing from the other,
   counted as multisets).
"""

from __future__ import annotations

import difflib
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

#: Diffs are cut to this many lines of output.
DIFF_LINES_MAX: Final = 400
#: Files larger than this are not diffed at all (their sizes and hashes say enough).
DIFF_INPUT_MAX: Final = 2 * 1024 * 1024
#: Lines of each side compared at once (difflib's cost is at most WINDOW² per window).
WINDOW: Final = 400
#: Windows one comparison may look at: a deterministic bound on its work (at most
#: MAX_WINDOWS x WINDOW² line pairs) whatever the input — sparse changes among many
#: identical lines reach neither the change cap nor, without a deadline, any other.
MAX_WINDOWS: Final = 32
#: What compares one window (difflib's; a test counts its work through this name).
_Matcher = difflib.SequenceMatcher
#: A shown line is cut to this many characters (a minified file is one long line).
LINE_CHARS_MAX: Final = 2000


class Op(NamedTuple):
    """One step of an edit script, as difflib's opcodes: ``equal``, ``replace``,
    ``delete`` or ``insert`` of ``a[i1:i2]`` into ``b[j1:j2]``."""

    tag: str
    i1: int
    i2: int
    j1: int
    j2: int


class Bounded(NamedTuple):
    """An edit script of ``a[:a_done]`` into ``b[:b_done]`` (`ops`), and what was left
    out: `rest_before` lines of `a` and `rest_after` of `b` after those, not compared
    (`stopped` says why: ``""`` none left, ``"lines"`` the change cap, ``"time"`` the
    deadline); of those, at least `rest_removed` lines of `a` are not in `b` and
    `rest_added` of `b` not in `a` (a multiset count: a lower bound on the changes)."""

    ops: tuple[Op, ...]
    a_done: int
    b_done: int
    rest_before: int
    rest_after: int
    rest_removed: int
    rest_added: int
    stopped: str


def compare(a: Sequence[str], b: Sequence[str], *, max_changed: int = DIFF_LINES_MAX,
            deadline: float | None = None, window: int = WINDOW,
            max_windows: int = MAX_WINDOWS) -> Bounded:
    """Compare the lines `a` and `b` with bounded work (see the module): stop once
    `max_changed` changed lines were found, `max_windows` windows were compared, or
    `time.monotonic()` passed `deadline`."""
    n, m = len(a), len(b)
    p = 0
    while p < n and p < m and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and s < m - p and a[n - 1 - s] == b[m - 1 - s]:
        s += 1
    ea, eb = n - s, m - s
    ops: list[Op] = [Op("equal", 0, p, 0, p)] if p else []
    i = j = p
    changed = windows = 0
    stopped = ""
    while i < ea or j < eb:
        if changed >= max_changed or windows >= max_windows:
            stopped = "lines"
            break
        if deadline is not None and time.monotonic() > deadline:
            stopped = "time"
            break
        wa, wb = min(ea, i + window), min(eb, j + window)
        windows += 1
        codes = _Matcher(None, a[i:wa], b[j:wb], autojunk=False).get_opcodes()
        if wa < ea or wb < eb:
            # keep the window's result up to its last equal block: past it, a line may
            # only seem deleted because its match lies beyond the other side's window
            last = max((k for k, c in enumerate(codes) if c[0] == "equal"), default=None)
            if last is None:  # nothing in common in the windows: look further for a line
                ai, bj = _anchor(a, i, ea, b, j, eb, reach=window * 16)  # in both
                codes = [("replace", 0, ai - i, 0, bj - j)]
            else:
                codes = codes[:last + 1]
        for tag, i1, i2, j1, j2 in codes:
            ops.append(Op(tag, i + i1, i + i2, j + j1, j + j2))
            if tag != "equal":
                changed += (i2 - i1) + (j2 - j1)
        i, j = ops[-1].i2, ops[-1].j2
    if not stopped and s:
        ops.append(Op("equal", ea, n, eb, m))
        i, j = n, m
    rest_a, rest_b = a[i:ea] if stopped else (), b[j:eb] if stopped else ()
    ca, cb = Counter(rest_a), Counter(rest_b)
    return Bounded(tuple(_merged(ops)), i, j, len(rest_a), len(rest_b),
                   sum((ca - cb).values()), sum((cb - ca).values()), stopped)


def _anchor(a: Sequence[str], i: int, ea: int, b: Sequence[str], j: int, eb: int, *,
            reach: int) -> tuple[int, int]:
    """Where the two sides may be in step again after two windows with nothing in
    common (a long insertion or deletion): the nearest pair of equal lines within
    `reach` lines of each side (fewest lines skipped), found in linear time; none:
    both windows' ends."""
    best: tuple[int, int, int] | None = None
    for (x, xi, xe), (y, yj, ye), flip in (((a, i, ea), (b, j, eb), False),
                                           ((b, j, eb), (a, i, ea), True)):
        first: dict[str, int] = {}
        for k in range(yj, min(ye, yj + reach)):
            first.setdefault(y[k], k)
        for k in range(xi, min(xe, xi + reach)):
            hit = first.get(x[k])
            if hit is not None:
                cost = (k - xi) + (hit - yj)
                if best is None or cost < best[0]:
                    best = (cost, hit, k) if flip else (cost, k, hit)
                break
    if best is None:
        return min(ea, i + reach // 16), min(eb, j + reach // 16)
    return best[1], best[2]


def _merged(ops: list[Op]) -> Iterator[Op]:
    """Adjacent ops of one kind joined (windows meet inside an equal run); an adjacent
    delete and insert joined into a replace."""
    out: list[Op] = []
    for op in ops:
        if op.i1 == op.i2 and op.j1 == op.j2:
            continue
        if out and out[-1].tag == op.tag or (
                out and out[-1].tag != "equal" and op.tag != "equal"):
            prev = out[-1]
            tag = prev.tag if prev.tag == op.tag else "replace"
            out[-1] = Op(tag, prev.i1, op.i2, prev.j1, op.j2)
        else:
            out.append(op)
    for op in out:
        if op.tag == "replace" and op.i1 == op.i2:
            yield Op("insert", *op[1:])
        elif op.tag == "replace" and op.j1 == op.j2:
            yield Op("delete", *op[1:])
        else:
            yield op


def hunks(ops: Sequence[Op], context: int = 3) -> Iterator[list[Op]]:
    """The ops grouped into hunks with `context` lines around each change (as
    difflib's ``get_grouped_opcodes``)."""
    class _Given(difflib.SequenceMatcher):  # type: ignore[type-arg]
        def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:
            return [tuple(op) for op in ops] or [("equal", 0, 1, 0, 1)]  # type: ignore[misc]

    if not any(op.tag != "equal" for op in ops):
        return
    for group in _Given().get_grouped_opcodes(context):
        yield [Op(*g) for g in group]


def _range(start: int, stop: int) -> str:
    """A hunk header's range, as unified diffs write it (1-based; an empty range names
    the line before it)."""
    length = stop - start
    first = start + 1 if length else start
    return f"{first}" if length == 1 else f"{first},{length}"


def cut_line(line: str) -> str:
    """`line`, cut to LINE_CHARS_MAX characters with what was cut counted."""
    if len(line) <= LINE_CHARS_MAX:
        return line
    return line[:LINE_CHARS_MAX] + f" … ({len(line) - LINE_CHARS_MAX:,} more characters)"


class DiffLine(NamedTuple):
    kind: str  # "meta", "hunk", "add", "del", "ctx", "note"
    text: str


def diff_lines(a: Sequence[str], b: Sequence[str], *, before_name: str, after_name: str,
               max_lines: int = DIFF_LINES_MAX, deadline: float | None = None
               ) -> tuple[list[DiffLine], int, int, Bounded]:
    """A unified diff of the lines `a` into `b` (each without its line end), bounded:
    at most `max_lines` lines, its work bounded as `compare`'s. Returns the lines, the
    lines added and removed in what was compared, and the comparison (what it left
    out). The headers name `before_name` and `after_name` (``/dev/null``: absent)."""
    found = compare(a, b, max_changed=max_lines, deadline=deadline)
    out = [DiffLine("meta", f"--- {before_name}"), DiffLine("meta", f"+++ {after_name}")]
    added = removed = 0
    for group in hunks(found.ops):
        first, last = group[0], group[-1]
        out.append(DiffLine("hunk", f"@@ -{_range(first.i1, last.i2)}"
                                    f" +{_range(first.j1, last.j2)} @@"))
        for op in group:
            if op.tag == "equal":
                out.extend(DiffLine("ctx", " " + cut_line(x)) for x in a[op.i1:op.i2])
                continue
            removed += op.i2 - op.i1
            added += op.j2 - op.j1
            out.extend(DiffLine("del", "-" + cut_line(x)) for x in a[op.i1:op.i2])
            out.extend(DiffLine("add", "+" + cut_line(x)) for x in b[op.j1:op.j2])
    if len(out) > max_lines:
        out = out[:max_lines]
        out.append(DiffLine("note", "… the diff is cut here (more changes follow)"))
    if found.stopped:
        why = "it reached its size" if found.stopped == "lines" else "its time ran out"
        out.append(DiffLine("note", (
            f"… compared up to line {found.a_done} of the old version and line"
            f" {found.b_done} of the new, where {why}: {found.rest_before:,} old and"
            f" {found.rest_after:,} new lines after them were not compared (at least"
            f" {found.rest_removed:,} removed and {found.rest_added:,} added there)")))
    return out, added, removed, found


def split_lines(data: bytes, *, errors: str = "replace") -> list[str]:
    """A file's lines without their line ends, decoded as UTF-8 (a byte that is not:
    as `errors` says — a replacement character, or ``backslashreplace``'s ``\\xNN``);
    a last line without a line end is marked on a line of its own."""
    text = data.decode("utf-8", errors)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines[-1] += "\n\\ No newline at end of file"
    return lines


def unified_diff(before: bytes | None, after: bytes | None, path: str, *,
                 before_label: str = "", after_label: str = "",
                 deadline: float | None = None) -> str:
    """A git-style unified diff of two versions of one file ('' when they are equal),
    bounded (see the module): at most DIFF_LINES_MAX lines, what was left out counted.
    Bytes that are not UTF-8 are shown replaced."""
    if before == after:
        return ""
    if len(before or b"") > DIFF_INPUT_MAX or len(after or b"") > DIFF_INPUT_MAX:
        return f"(no diff: {path} is larger than {DIFF_INPUT_MAX} bytes)"
    a = [] if before is None else split_lines(before)
    b = [] if after is None else split_lines(after)
    lines, _, _, _ = diff_lines(
        a, b, before_name=f"a/{path}" + (f" ({before_label})" if before_label else ""),
        after_name=f"b/{path}" + (f" ({after_label})" if after_label else ""),
        deadline=deadline)
    return "".join(line.text + "\n" for line in lines)


__all__ = ["DIFF_INPUT_MAX", "DIFF_LINES_MAX", "LINE_CHARS_MAX", "MAX_WINDOWS", "WINDOW", "Bounded",
           "DiffLine", "Op", "compare", "cut_line", "diff_lines", "hunks", "split_lines",
           "unified_diff"]

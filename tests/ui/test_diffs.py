"""`ledger.diffs`: diffs bounded by design (issue 41, item 1).

A formatter's rewrite of a 20,000-line file — every other line changed — cost difflib
21 s, and the UI rendered up to 40 such diffs a page. The bounded diff compares a
window at a time and stops at a line cap or a deadline, counting what it left out.
Held here: every diff it makes is a correct patch (checked by applying it, over an
exhaustive set of small cases and a random sweep), its work is bounded (counted in
compared line pairs, not timed), it shows the worst case's first hunks, and the
checker of the bound catches the unbounded variant.
"""

from __future__ import annotations

import difflib
import itertools
import random
import re
from collections.abc import Sequence

import pytest

from ledger import diffs
from ledger.diffs import compare, diff_lines, unified_diff


def apply_ops(a: Sequence[str], b: Sequence[str], ops: Sequence[diffs.Op]) -> list[str]:
    """`b` rebuilt from `a` and the ops (checking every equal op's lines)."""
    out: list[str] = []
    i = j = 0
    for op in ops:
        assert (op.i1, op.j1) == (i, j), f"ops not contiguous at {op}"
        if op.tag == "equal":
            assert list(a[op.i1:op.i2]) == list(b[op.j1:op.j2]), op
        out.extend(b[op.j1:op.j2])
        i, j = op.i2, op.j2
    assert (i, j) == (len(a), len(b))
    return out


def apply_unified(a: Sequence[str], lines: Sequence[str]) -> list[str]:
    """A unified diff (as `diff_lines` makes it) applied to `a`: each hunk's context and
    deleted lines must be where its header says."""
    out: list[str] = []
    pos = 0
    k = 0
    while k < len(lines):
        m = re.fullmatch(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", lines[k])
        if m is None:
            k += 1
            continue
        start = int(m[1]) - (0 if m[2] == "0" else 1)
        out.extend(a[pos:start])
        pos = start
        k += 1
        while k < len(lines) and not lines[k].startswith("@@"):
            line = lines[k]
            if line.startswith(" "):
                assert a[pos] == line[1:], (pos, line)
                out.append(line[1:])
                pos += 1
            elif line.startswith("-"):
                assert a[pos] == line[1:], (pos, line)
                pos += 1
            elif line.startswith("+"):
                out.append(line[1:])
            k += 1
    out.extend(a[pos:])
    return out


def check(a: list[str], b: list[str], window: int) -> None:
    found = compare(a, b, max_changed=10**9, window=window, max_windows=10**9)
    assert not found.stopped and (found.a_done, found.b_done) == (len(a), len(b))
    assert apply_ops(a, b, found.ops) == b
    text, _, _, _ = diff_lines(a, b, before_name="a", after_name="b", max_lines=10**9)
    assert apply_unified(a, [x.text for x in text]) == b


def test_every_small_pair_is_diffed_correctly_with_any_window() -> None:
    """Exhaustion: every pair of sequences of up to 4 lines over a 2-letter alphabet,
    with windows of 1, 2, 3 and 400 lines — the windowed comparison, its re-synchronising
    and the hunk layout produce a patch that turns a into b."""
    seqs = [list(p) for n in range(5) for p in itertools.product("xy", repeat=n)]
    for a, b in itertools.product(seqs, repeat=2):
        for window in (1, 2, 3, 400):
            check(a, b, window)


def test_a_random_sweep_of_edits_is_diffed_correctly() -> None:
    r = random.Random(41)
    for _ in range(1500):
        alpha = r.choice([2, 5, 1000])
        a = [str(r.randrange(alpha)) for _ in range(r.randrange(80))]
        b = list(a)
        for _ in range(r.randrange(12)):
            pos = r.randrange(len(b) + 1)
            k = r.random()
            if k < 0.4:
                b[pos:pos] = [f"new{r.random()}" for _ in range(r.randrange(1, 30))]
            elif b and k < 0.7:
                del b[min(pos, len(b) - 1):min(pos, len(b) - 1) + r.randrange(1, 20)]
            elif b:
                b[min(pos, len(b) - 1)] = f"changed{r.random()}"
        check(a, b, r.choice([3, 7, 16, 400]))


def worst_case(lines: int) -> tuple[list[str], list[str]]:
    """A formatter's rewrite: every other line of a file changed."""
    a = [f"    value_{i} = compute({i}, {i * 7 % 13})" for i in range(lines)]
    b = [f"    value_{i} = compute({i}, {i * 7 % 13}, strict=True)" if i % 2 else x
         for i, x in enumerate(a)]
    return a, b


class Counting:
    """difflib.SequenceMatcher, counting the line pairs each comparison may touch."""

    cells = 0

    def __init__(self, isjunk: object, a: Sequence[str], b: Sequence[str],
                 autojunk: bool = True) -> None:
        Counting.cells += len(a) * len(b)
        self.inner = difflib.SequenceMatcher(isjunk, a, b, autojunk=autojunk)  # type: ignore[arg-type]

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:
        return self.inner.get_opcodes()


#: The most line pairs one diff may compare: a few windows' worth, whatever the input.
WORK_BOUND = 4 * diffs.WINDOW * diffs.WINDOW


def work_of(a: list[str], b: list[str], monkeypatch: pytest.MonkeyPatch, **kw: object) -> int:
    monkeypatch.setattr(diffs, "_Matcher", Counting)
    Counting.cells = 0
    diff_lines(a, b, before_name="a", after_name="b", **kw)  # type: ignore[arg-type]
    monkeypatch.undo()
    return Counting.cells


@pytest.mark.parametrize("lines", [5_000, 20_000, 100_000])
def test_the_worst_case_costs_a_bounded_amount_of_work(lines: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = worst_case(lines)
    assert work_of(a, b, monkeypatch) <= WORK_BOUND


def test_the_work_checker_catches_an_unbounded_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant — one window over the whole file, no cap (what difflib did) —
    fails the bound the test holds."""
    a, b = worst_case(5_000)
    monkeypatch.setattr(diffs, "_Matcher", Counting)
    Counting.cells = 0
    diffs.compare(a, b, window=10**9, max_changed=10**9, max_windows=10**9)
    assert Counting.cells > WORK_BOUND


def test_the_worst_case_shows_its_first_hunks_and_counts_the_rest() -> None:
    """Not only "too different": the first hunks, then a line saying where the
    comparison stopped and how much was left out."""
    a, b = worst_case(20_000)
    text, added, removed, found = diff_lines(a, b, before_name="a/app.py",
                                             after_name="b/app.py", max_lines=400)
    kinds = [x.kind for x in text]
    assert kinds[:3] == ["meta", "meta", "hunk"] and added > 100 and removed > 100
    assert len(text) <= 402 and kinds[-1] == "note"
    assert found.stopped == "lines" and found.rest_before > 19_000
    assert "were not compared" in text[-1].text and f"{found.rest_before:,}" in text[-1].text
    # what was left out is counted: at least the lines that differ there
    assert found.rest_removed >= (20_000 - found.a_done) // 2 - 1


def test_a_deadline_stops_the_comparison_and_says_so() -> None:
    a, b = worst_case(20_000)
    text, _, _, found = diff_lines(a, b, before_name="a", after_name="b", max_lines=10**9,
                                   deadline=0.0)  # already passed
    assert found.stopped == "time" and "its time ran out" in text[-1].text


def test_a_long_insertion_resynchronises() -> None:
    """1,000 lines inserted at the top of a 3,000-line file (longer than a window, and
    no common suffix to strip): shown as the insertion it is, not as everything
    replaced."""
    a = [f"l{i}" for i in range(3000)]
    b = [f"new{i}" for i in range(1000)] + a[:-1] + ["changed"]
    _, added, removed, found = diff_lines(a, b, before_name="a", after_name="b",
                                          max_lines=10**9)
    assert not found.stopped and (added, removed) == (1001, 1)


def test_a_long_line_is_cut_and_counted() -> None:
    out = unified_diff(b"x" * 50_000 + b"\n", b"y\n", "min.js")
    assert "more characters)" in out and len(out) < 3 * diffs.LINE_CHARS_MAX


def test_unified_diff_marks_a_missing_newline_and_equal_files() -> None:
    assert unified_diff(b"a\n", b"a\n", "f") == ""
    out = unified_diff(b"a\n", b"a\nb", "f", before_label="read", after_label="now")
    assert "--- a/f (read)" in out and "+++ b/f (now)" in out
    assert "\\ No newline at end of file" in out


def test_the_window_cap_bounds_sparse_changes_and_says_so() -> None:
    """Sparse changes over a long file reach no change cap: the window cap stops the
    comparison (deterministically, no clock) and the last line says what was left."""
    a = [f"line {k}" for k in range(100_000)]
    b = [x if k % 1000 else "changed" for k, x in enumerate(a)]
    found = compare(a, b)
    assert found.stopped == "lines" and found.a_done <= diffs.MAX_WINDOWS * diffs.WINDOW + 1
    assert found.rest_removed > 0 and found.rest_before > 80_000

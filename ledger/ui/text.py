"""What the UI prints, made safe to print: control characters shown visibly, bytes
that are not UTF-8 shown as escapes, binary content summarised, diffs of two versions
of a file as lines a template marks up, and the geometry of the stats charts.

Pure: no I/O, no HTML. The HTML escaping itself is Jinja's (autoescape, every
template): this module only makes what it is handed *visible* — a BEL in a file name
or a right-to-left override in a step id shows as ``\\x07`` / ``\\u202e`` instead of
acting on the page.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Final, NamedTuple

from ledger import diffs, fmt, kinds
from ledger.fmt import ago, size, span


def iso(time_ns: int) -> str:
    """A time as the command line prints it (UTC, milliseconds); "-" for none."""
    return fmt.iso(time_ns) if time_ns else "-"

from ledger.diffs import DiffLine

#: Diffs are cut to this many lines; files larger than this are not diffed.
DIFF_LINES_MAX: Final = 600
TEXT_MAX: Final = 2 * 1024 * 1024
#: C0 and C1 controls (tab kept), DEL, every Unicode format character (category Cf:
#: the bidirectional overrides, isolates and marks, zero-width ones, the BOM, the soft
#: hyphen, tags, …), the line and paragraph separators, and the characters that are not
#: Cf yet show nothing: the combining grapheme joiner, the Hangul fillers, the Khmer
#: inherent vowels, the Mongolian free variation selectors, the variation selectors, the
#: deprecated format characters, the tag block's unassigned and variation code points.
_SHOWN_AS_NOTHING: Final = (
    (0x00, 0x08), (0x0A, 0x1F), (0x7F, 0x9F), (0x00AD, 0x00AD), (0x034F, 0x034F),
    (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)


def _format_characters() -> list[int]:
    """Every code point of category Cf in this Python's Unicode database."""
    return [c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]


def _char_class(points: set[int]) -> str:
    ranges: list[list[int]] = []
    for c in sorted(points):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "[" + "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                         for a, b in ranges) + "]"


_INVISIBLE_POINTS: Final = frozenset(
    {c for a, b in _SHOWN_AS_NOTHING for c in range(a, b + 1)} | set(_format_characters()))
_INVISIBLE: Final = re.compile(_char_class(set(_INVISIBLE_POINTS)))
_INVISIBLE_KEEP_NL: Final = re.compile(_char_class(set(_INVISIBLE_POINTS) - {0x0A}))


def is_invisible(char: str) -> bool:
    """Whether `visible` writes `char` out as an escape."""
    return ord(char) in _INVISIBLE_POINTS


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def visible(text: str, *, newlines: bool = False) -> str:
    """`text` with every control or invisible formatting character written out as an
    escape (``\\x07``, ``\\u202e``, ``\\U000e0041``); with `newlines`, line feeds are
    kept."""
    return (_INVISIBLE_KEEP_NL if newlines else _INVISIBLE).sub(_escape, text)


def decode(data: bytes) -> str:
    """Bytes as text: UTF-8, each byte that is not shown as ``\\xNN``."""
    return data.decode("utf-8", "backslashreplace")


def is_binary(data: bytes) -> bool:
    """Binary as git judges it: a NUL byte in the first 8 KiB."""
    return b"\x00" in data[:8192]


def text_lines(data: bytes) -> list[str]:
    """A text file's lines, each made visible (its line end dropped)."""
    return [visible(line) for line in decode(data).split("\n")]


class Diff(NamedTuple):
    """What a write changed, as the step page shows it. `kind`: ``text`` (lines),
    ``binary`` (sizes and hashes only), ``same``, ``too-large``, ``unavailable`` (a
    version's bytes are not in the ledger: `note` says which) or ``deferred`` (this
    page's diff budget was spent: the diff has a page of its own). `complete`: every
    line was compared (a diff cut for its size or time says what it left out in its
    last line, kind ``note``)."""

    kind: str
    lines: tuple[DiffLine, ...] = ()
    note: str = ""
    added: int = 0
    removed: int = 0
    cut: int = 0
    complete: bool = True


def diff(before: bytes | None, after: bytes | None, path: str, *,
         deadline: float | None = None) -> Diff:
    """The diff of two versions of `path` (None: absent), bounded as `ledger.diffs`'
    (a window at a time, at most DIFF_LINES_MAX lines, stopping at `deadline`, a
    `time.monotonic()` value): the worst case costs tens of milliseconds, not minutes."""
    if before == after:
        return Diff("same")
    if len(before or b"") > TEXT_MAX or len(after or b"") > TEXT_MAX:
        return Diff("too-large", note=f"larger than {TEXT_MAX:,} bytes: not diffed")
    if is_binary(before or b"") or is_binary(after or b""):
        return Diff("binary")
    a = [] if before is None else diffs.split_lines(before, errors="backslashreplace")
    b = [] if after is None else diffs.split_lines(after, errors="backslashreplace")
    lines, added, removed, found = diffs.diff_lines(
        a, b, before_name=f"a/{path}" if before is not None else "/dev/null",
        after_name=f"b/{path}" if after is not None else "/dev/null",
        max_lines=DIFF_LINES_MAX, deadline=deadline)
    shown = tuple(DiffLine(x.kind, visible(x.text)) for x in lines)
    return Diff("text", shown, added=added, removed=removed,
                complete=not found.stopped and not any(x.kind == "note" for x in lines))


_SHELL_SAFE: Final = re.compile(r"[A-Za-z0-9_@%+:,./-]+")


def shell_quote(word: str) -> str:
    """`word` as one shell word that a POSIX shell reads back as exactly `word`:
    bare when it is only safe characters, else in single quotes — or, when it holds a
    character `visible` would write out (a control or invisible one), in bash's and
    zsh's ``$'...'`` with each such character as its escape, so the command a page shows
    is the one that runs when copied, and shows nothing invisible."""
    if _SHELL_SAFE.fullmatch(word):
        return word
    if not any(is_invisible(c) for c in word):
        return "'" + word.replace("'", "'\"'\"'") + "'"
    out = []
    for c in word:
        if c in "\\'":
            out.append("\\" + c)
        elif is_invisible(c):
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x80 else f"\\u{n:04x}" if n < 0x10000
                       else f"\\U{n:08x}")
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def command(*words: str) -> str:
    """A command line of `words`, each quoted for the shell (`shell_quote`)."""
    return " ".join(shell_quote(w) for w in words)


#: The words the pages use, each in one line (shown when the pointer rests on one):
#: the glossary, inline. An event kind's line is `ledger.kinds`'s (one wording of a kind).
GLOSSARY: Final = {
    **{kind: described.means for kind, described in kinds.DESCRIBED.items()},
    "refused": "the fence refused a write: the file was not what the step read",
    "settled": "a dead worker's attempt, undone by the next lease holder (a later epoch)",
    "half-undone": "an undo left paths a person had changed: never overwritten",
    "unacked": "committed but never acknowledged",
    "in-flight": "planned or applying and not finished",
    "kept": "bytes steptrail would have removed, kept beside their path under a visible name",
    "moved": "the ledger is not where its workspace was registered (a copied project)",
    "verify": "a finding of verify: the chain, rows or projections disagree",
    "epoch": "a lease's number: a worker's writes count only under the live one",
}


def explain(term: str) -> str:
    """A word of the pages in one line ('' when it is not one)."""
    return GLOSSARY.get(term, "")


class Bar(NamedTuple):
    label: str
    value: int
    shown: str  # the value as printed
    x: float
    y: float
    w: float
    h: float


class Chart(NamedTuple):
    """A bar chart's geometry, for a template to draw as SVG."""

    width: int
    height: int
    bars: tuple[Bar, ...]
    horizontal: bool
    title: str
    axis: str = ""


def hbars(title: str, items: Sequence[tuple[str, int]], shown: Sequence[str], *,
          width: int = 640, row: int = 22, label_w: int = 170) -> Chart:
    """Horizontal bars, one a row (a category each: bytes by state)."""
    top = max((v for _, v in items), default=0) or 1
    span = width - label_w - 110
    bars = tuple(Bar(label, v, s, label_w, i * row + 4, max(1.0, span * v / top) if v else 0.0,
                     row - 6) for i, ((label, v), s) in enumerate(zip(items, shown, strict=True)))
    return Chart(width, max(row, len(items) * row + 8), bars, True, title)


def vbars(title: str, items: Sequence[tuple[str, int]], shown: Sequence[str], *,
          width: int = 640, height: int = 180, axis: str = "") -> Chart:
    """Vertical bars in time order (growth per day); the newest `width // 6` buckets."""
    items, shown = list(items)[-(width // 6):], list(shown)[-(width // 6):]
    top = max((v for _, v in items), default=0) or 1
    n = max(1, len(items))
    step = min(40.0, (width - 20) / n)
    plot = height - 36
    bars = []
    for i, ((label, v), s) in enumerate(zip(items, shown, strict=True)):
        h = max(1.0, plot * v / top) if v else 0.0
        bars.append(Bar(label, v, s, 10 + i * step + step * 0.1, 8 + plot - h,
                        max(1.0, step * 0.8), h))
    return Chart(width, height, tuple(bars), False, title, axis)


__all__ = ["GLOSSARY", "Bar", "Chart", "Diff", "DiffLine", "ago", "command", "decode", "diff",
           "explain", "hbars", "is_binary", "is_invisible", "iso", "shell_quote", "size",
           "span", "text_lines", "vbars", "visible"]

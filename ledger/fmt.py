"""Times, durations, sizes and counts in words, one way each, for every front end (the
command line, ``status``, the UI, the MCP server, the event kinds' detail lines).

>>> from ledger import fmt
>>> fmt.iso(1_700_000_000_123_000_000), fmt.duration(86400), fmt.span(185_000_000_000)
('2023-11-14T22:13:20.123Z', '24h', '3m 05s')
>>> fmt.ago(90 * 60 * 10**9), fmt.size(1536), fmt.size_exact(1536), fmt.count(1, "step")
('90m', '1.5 KiB', '1536 B (1.5 KiB)', '1 step')
"""

from __future__ import annotations

import datetime as dt
import unicodedata


def iso(time_ns: int) -> str:
    """A time in UTC with milliseconds (ISO 8601, ``Z``)."""
    return dt.datetime.fromtimestamp(time_ns / 1e9, dt.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """A duration as one would type it (an option's value): 86400 -> "24h", 600 -> "10m",
    90 -> "90s"."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def span(delta_ns: int) -> str:
    """A duration as a person reads it: 850ms, 42s, 3m 05s, 2h 14m, 3d 4h."""
    s = max(0, delta_ns) / 1e9
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600)}h"


def ago(delta_ns: int) -> str:
    """A span in one unit, as a status line shows an age: 45s, 12m, 5h, 3d."""
    s = abs(delta_ns) / 1e9
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.0f}h"
    return f"{s / 86400:.0f}d"


def _binary(n: int) -> tuple[float, str]:
    value, unit = float(n), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return value, unit


def size(n: int | None) -> str:
    """Bytes, in a binary unit once past a KiB ("?" when unknown)."""
    if n is None:
        return "?"
    value, unit = _binary(n)
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def size_exact(n: int) -> str:
    """Exact bytes, with a binary-unit reading once past a KiB: "1536 B (1.5 KiB)"."""
    value, unit = _binary(n)
    return f"{n} B" if unit == "B" else f"{n} B ({value:.1f} {unit})"


def shown(text: str) -> str:
    r"""`text` as one line for a terminal or a log: every control or format character
    (C0, C1, DEL, the bidi overrides and isolates, zero-width and tag characters), a
    line or paragraph separator and a lone surrogate (a name that was not UTF-8) written
    out as its escape — so text from the ledger can neither start a line of its own,
    move the cursor, set the clipboard (OSC 52) nor make a command read differently from
    what it runs.

    >>> print(shown("ok\nfake line\x1b]52;c;AAAA\x07"))
    ok\x0afake line\x1b]52;c;AAAA\x07
    """
    out = []
    for c in text:
        if unicodedata.category(c) in _HIDDEN:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000
                       else f"\\U{n:08x}")
        else:
            out.append(c)
    return "".join(out)


#: The categories `shown` writes out: controls, formats, surrogates, line and paragraph
#: separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def count(n: int, noun: str, plural: str = "") -> str:
    """`n noun`, the noun in its plural unless the count is one: "1 step", "2 steps"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


__all__ = ["ago", "count", "duration", "iso", "shown", "size", "size_exact", "span"]

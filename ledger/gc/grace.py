"""The grace window, one rule: a blob (or a temporary) younger than the window is kept,
whatever else holds it — a writer may be about to pin it, a clock may be skewed, a
person may have placed it by hand. The collector, the audit and the ``gc`` command all
judge age here (`young`), and a window is checked once (`check_grace`).

>>> from ledger.gc.grace import DEFAULT_GRACE_S, young
>>> DEFAULT_GRACE_S, young(since_ns=0, now_ns=10**9, grace_ns=2 * 10**9)
(86400, True)
"""

from __future__ import annotations

import math
from typing import Final

from ..errors import InvalidInput
from ..fmt import duration

#: The window `gc` keeps orphans for by default (24 hours).
DEFAULT_GRACE_S: Final = 24 * 3600
#: The shortest window accepted without `force` (1 hour).
MIN_GRACE_S: Final = 3600


def check_grace(grace_s: float, *, force: bool) -> None:
    """InvalidInput for a window that is not a finite number of seconds, a negative one,
    or one under `MIN_GRACE_S` without `force`."""
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) \
            or not math.isfinite(grace_s):
        raise InvalidInput(f"the grace window must be a finite number of seconds, not"
                           f" {grace_s!r}").at_a_shell(
            f"--grace must be a duration such as 24h or 90m, not {grace_s!r}")
    if grace_s < 0:
        raise InvalidInput("the grace window cannot be negative")
    if grace_s < MIN_GRACE_S and not force:
        why = (f"{duration(grace_s)} is under the {duration(MIN_GRACE_S)} minimum: a writer"
               " stalled longer than the window is still safe (it pinned first), but a short"
               " window leaves no margin for clock skew or a blob placed by hand")
        raise InvalidInput(f"a grace window of {why}; pass force=True to mean it").at_a_shell(
            f"--grace {why}; pass --force to mean it (nothing was read or changed)")


def young(since_ns: int, now_ns: int, grace_ns: int) -> bool:
    """Whether something whose age counts from `since_ns` (a file's mtime, an inline
    row's insert time) is still inside the window at `now_ns`: kept."""
    return now_ns - since_ns < grace_ns


__all__ = ["DEFAULT_GRACE_S", "MIN_GRACE_S", "check_grace", "young"]

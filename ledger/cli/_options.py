"""The options several commands share, and the choices they spell out.

A command imports what it uses (the ledger, plans, gc, export, ...) when it runs:
`steptrail --help` or one command's run pays for no other's imports (docs/performance.md
"The command line"). So the choices of its options are spelled out here, not imported;
tests/cli/test_cli_fast.py checks they are the library's.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import click

from ledger.errors import InvalidInput

from ._common import F

#: `ledger.DEFAULT_PATH`, `fences.FENCE_MODES`, `projections.steps.STATES` and `IN_FLIGHT`.
DEFAULT_PATH = os.path.join(".steptrail", "ledger.db")
FENCE_MODES = ("step", "plan", "none")
STATES = ("planned", "fenced", "blob-stored", "manifest-published", "acked", "compensating",
          "compensated", "rejected", "sealed")
IN_FLIGHT = frozenset({"planned", "fenced", "blob-stored", "compensating"})


ENV_LEDGER = "STEPTRAIL_LEDGER"
ENV_WITNESS = "STEPTRAIL_WITNESS"
ENV_WORKSPACE = "STEPTRAIL_WORKSPACE"
ENV_EPOCH = "STEPTRAIL_EPOCH"


INT64_MAX = 2**63 - 1  # SQLite's INTEGER: larger numbers cannot be stored or compared


DURATION_MAX_S = 100 * 365 * 86400.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*")


class Duration(click.ParamType):
    """A duration such as 60s, 10m, 24h, 2d or 500ms; a plain number is seconds."""

    name = "duration"

    def __init__(self, *, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            m = _DURATION_RE.fullmatch(str(value))
            if m is None:
                self.fail(f"{value!r} is not a duration; write e.g. 60s, 10m, 24h"
                          " (a plain number is seconds)", param, ctx)
            seconds = float(m[1]) * _UNITS[m[2] or "s"]
        if seconds < 0 or (seconds == 0 and not self.allow_zero):
            self.fail(f"{value!r}: a duration must be more than zero", param, ctx)
        if not math.isfinite(seconds) or seconds > DURATION_MAX_S:
            self.fail(f"{str(value)[:40]!r}: a duration must be at most {DURATION_MAX_S:.0f}s"
                      " (100 years)", param, ctx)
        return seconds


DURATION = Duration()

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20,
               "mib": 1 << 20, "mb": 1000 ** 2, "g": 1 << 30, "gib": 1 << 30, "gb": 1000 ** 3}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*")


class Size(click.ParamType):
    """A size such as 64MiB, 500k, 2G or 1000 (bytes)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        m = _SIZE_RE.fullmatch(str(value))
        unit = _SIZE_UNITS.get(m[2].lower()) if m is not None else None
        if m is None or unit is None:
            self.fail(f"{str(value)[:40]!r} is not a size; write e.g. 64MiB, 500k, 2G or a"
                      " number of bytes", param, ctx)
        size = int(float(m[1]) * unit)
        if size > 1 << 50:
            self.fail(f"{str(value)[:40]!r}: a size must be at most 1PiB", param, ctx)
        return size


SIZE = Size()

#: `lease acquire` and `lease heartbeat`'s default TTL: time for a person typing commands
#: between them (the library's default, for a harness that heartbeats, is 60 s).
CLI_LEASE_TTL = "10m"


def workspace_option(f: F) -> F:
    return click.option(
        "--workspace", "ws_name", metavar="NAME",
        help=f"The workspace (default: the global --workspace, or {ENV_WORKSPACE}).",
    )(f)


def fence_options(f: F) -> F:
    """`--fence` and `--journal/--no-journal`: the operator's protections (step plan, run)."""
    f = click.option("--journal/--no-journal", default=True, show_default=True,
                     help="--no-journal: a redelivered apply applies again. Recorded;"
                          " verify warns.")(f)
    return click.option("--fence", type=click.Choice(FENCE_MODES), default="step",
                        show_default=True,
                        help="The operator's choice of fence: 'plan' checks only the workspace"
                             " rev, 'none' nothing (a human's edit is overwritten). Recorded;"
                             " verify warns.")(f)


def _workspace(ctx: click.Context, ws_name: str | None) -> str:
    name = ws_name or ctx.obj.get("workspace")
    if not name and ctx.obj.get("ledger_foreign") is not None:
        raise ctx.obj["ledger_foreign"]  # (what the search refused says more: a copy's)
    if not name:
        raise InvalidInput(f"which workspace? give --workspace NAME (or set {ENV_WORKSPACE});"
                           " 'steptrail workspace list' shows them")
    return str(name)


def epoch_option(help_text: str) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        return click.option(
            "--epoch", type=click.IntRange(min=1, max=INT64_MAX), envvar=ENV_EPOCH, show_envvar=True,
            metavar="N", help=help_text,
        )(f)

    return decorate


def _need_epoch(epoch: int | None, what: str) -> int:
    if epoch is None:
        raise InvalidInput(f"{what} needs the live epoch: give --epoch N (the epoch"
                           f" 'steptrail lease acquire' printed) or set {ENV_EPOCH}")
    return epoch

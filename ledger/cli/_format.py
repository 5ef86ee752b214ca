"""What the commands print: times, counts and sizes as text; events and steps as text
and as JSON (docs/cli-json.md); output held back until a command is done (`_Spool`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import msgspec

from ledger.fmt import count as _n
from ledger.fmt import duration as _dur
from ledger.fmt import iso as _iso
from ledger.fmt import shown as _shown
from ledger.fmt import size_exact as _size

from ledger.events import RecordedEvent, to_builtins

if TYPE_CHECKING:
    from ledger import Compensation, StepRow


def event_json(r: RecordedEvent) -> dict[str, Any]:
    ev = r.event
    return {
        "seq": r.seq,
        "time_ns": r.time_ns,
        "time": _iso(r.time_ns),
        "kind": r.kind,
        "workspace": getattr(ev, "workspace", ""),
        "run": getattr(ev, "run", ""),
        "step": getattr(ev, "step", ""),
        "attempt": getattr(ev, "attempt", 0),
        "epoch": getattr(ev, "epoch", 0),
        "rev": getattr(ev, "rev", 0),
        "journal_key": r.journal_key,
        "hash": r.hash.hex(),
        "prev_hash": r.prev_hash.hex(),
        "v": r.v,
        "event": to_builtins(ev),
    }


def step_json(row: StepRow) -> dict[str, Any]:
    out = msgspec.to_builtins(row)
    out["committed"] = row.live
    out["updated"] = _iso(row.updated_ns)
    return out  # type: ignore[no-any-return]


def _lease_state(live: bool, released: bool, expires_ns: int) -> str:
    """A lease's state and time in words: "live, expires T", "expired at T", "released"."""
    if live:
        return f"live, expires {_iso(expires_ns)}"
    return "released" if released else f"expired at {_iso(expires_ns)}"


def compensation_json(c: Compensation) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(c)
    out["conflicts"] = [r.path for r in c.conflicts]
    return out


def _echo_compensation(c: Compensation) -> None:
    again = " (already recorded)" if c.deduped else ""
    click.echo(f"step {c.step} attempt {c.attempt}: compensated{again} (seq {c.seq})")
    for r in c.restored:
        click.echo(f"  {r.outcome:<9} rev {r.rev:>6}  {r.path}")


class _Spool:
    """Output held back (in memory, then a temporary file) until `done()`, then copied to
    stdout; dropped if the command fails first."""

    def __init__(self) -> None:
        self._file: Any = None

    def __enter__(self) -> _Spool:
        import tempfile

        self._file = tempfile.SpooledTemporaryFile(max_size=32 * 1024 * 1024, mode="w+",
                                                   encoding="utf-8", newline="")
        return self

    def write(self, text: str) -> int:
        return int(self._file.write(text))

    def done(self) -> None:
        self._file.seek(0)
        while chunk := self._file.read(1 << 20):
            sys.stdout.write(chunk)
        sys.stdout.flush()

    def __exit__(self, *exc: object) -> None:
        self._file.close()



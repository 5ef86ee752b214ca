"""The checks before a ledger is opened or created (`Ledger.open`, `Ledger.init` say
what they promise): bad input — an option out of range, a relative witness, a location
a writer must not open, a forensic or immutable open that is not read-only — is refused
before anything is touched. They know nothing of `Ledger` (which calls them)."""

from __future__ import annotations

import os
from typing import Any

from .errors import InvalidInput
from .store import Location, locate
from .verify import window_problem
from .witness import witness_path


def check_options(*, inline_max_bytes: int = 0, hash_check_max_bytes: int = 0,
                   compensation_window_s: float | None = None, **_: Any) -> None:
    """Refuse out-of-range options (InvalidInput) before anything is opened or created."""
    if inline_max_bytes < 0 or hash_check_max_bytes < 0:
        raise InvalidInput("inline_max_bytes and hash_check_max_bytes must be >= 0")
    if compensation_window_s is not None and window_problem(compensation_window_s):
        raise InvalidInput(f"compensation_window_s {window_problem(compensation_window_s)}")


def check_open(path: str | os.PathLike[str], readonly: bool, forensic: bool, immutable: bool,
               options: dict[str, Any]) -> tuple[Location, bool]:
    """`Ledger.open`'s checks: (the location, whether the witness is resolved — a private
    option `anchor_witness` pops)."""
    check_options(**options)
    if forensic and not readonly:
        raise InvalidInput("a forensic open is read-only: pass readonly=True")
    if immutable and not readonly:
        raise InvalidInput("an immutable open is read-only: pass readonly=True")
    # Private: anchor_witness opens without resolving the witness (it replaces it).
    resolve = options.pop("_witness_resolve", True)
    if options.get("witness") is not None:
        witness_path(options["witness"])  # a relative witness is refused before any I/O
    where = locate(path)
    if not readonly:
        where.check_writer()  # before the read-only look that comes next
    if immutable and not where.local_file:
        raise InvalidInput(f"{where.shown} is a database: an immutable open reads a"
                           " SQLite file without changing its directory; open it"
                           " read-only instead")
    return where, bool(resolve)


def check_init(path: str | os.PathLike[str], parents: bool, options: dict[str, Any]) -> Location:
    """`Ledger.init`'s checks (nothing written, not even a file)."""
    check_options(**options)
    where = locate(path)
    where.check_new(parents=parents)
    if options.get("witness") is not None:
        witness_path(options["witness"])  # a relative witness is refused before any I/O
    where.check_writer()  # before the read-only look that comes next
    return where


__all__ = ["check_init", "check_open", "check_options"]

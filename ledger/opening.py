"""The checks before a ledger is opened or created (`Ledger.open`, `Ledger.init` say
what they promise): bad input — an option out of range, a relative witness, a location
a writer must not open, a forensic or immutable open that is not read-only — is refused
before anything is touched. They know nothing of `Ledger` (which calls them)."""

from __future__ import annotations

import os
from typing import Any

from collections.abc import Mapping

from .blobs import check_digest, content_digest
from .errors import CorruptLedger, InvalidInput
from .store import Location, Store, locate
from .step.values import COMPENSATION_WINDOW_S_DEFAULT
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


def compensation_window(store: Store, option: float | None, created: bool) -> float:
    """The ledger's compensation window: a fact of the ledger, fixed at init (GC's
    pre-image pins and `compensate` must agree on it whoever opens the file); the
    option only names it at creation (recorded then), or for a ledger made before it
    was recorded. A stored value out of range was put there by hand: CorruptLedger,
    except for a forensic open (verify reports it)."""
    info = store.info
    stored = store.view.meta("compensation_window_s")
    if stored is not None and window_problem(stored) is None:
        return float(stored)
    if stored is not None and not info.forensic:
        raise CorruptLedger(info.location, f"meta compensation_window_s"
                            f" {window_problem(stored)} (the file was edited)")
    if stored is not None:
        return COMPENSATION_WINDOW_S_DEFAULT
    window = COMPENSATION_WINDOW_S_DEFAULT if option is None else option
    if created and not info.readonly:
        with store.transaction() as tx:
            tx.set_meta("compensation_window_s", repr(float(window)))
    return window


def check_inline(inline: Mapping[str, bytes], max_bytes: int) -> dict[str, bytes]:
    """`Ledger.append_batch`'s inline blobs, each checked (InvalidInput): bytes, at most
    `max_bytes`, keyed by the sha256 of its bytes."""
    small: dict[str, bytes] = {}
    for digest, data in inline.items():
        if not isinstance(data, bytes) or len(data) > max_bytes:
            raise InvalidInput(f"inline blob {str(digest)[:12]} must be bytes of at most"
                               f" {max_bytes} bytes; store a larger one as a blob file"
                               " first (ledger.blobs.put)")
        if content_digest(data)[0] != check_digest(digest, "inline blob digest"):
            raise InvalidInput(f"inline blob {digest[:12]} does not hold the bytes named by"
                               " its digest; key each one by the sha256 of its bytes")
        small[digest] = data
    return small


__all__ = ["check_init", "check_inline", "check_open", "check_options", "compensation_window"]

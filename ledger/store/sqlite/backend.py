"""The SQLite store as the registry knows it (`ledger.store.registry`): every location
no other store claims is a ledger file."""

from __future__ import annotations

import os
import time
from typing import Any, Final

from ...errors import (
    EXIT_ENVIRONMENT,
    EXIT_USAGE,
    InvalidInput,
)
from ..registry import Unmapped


def refuse_missing_parents(path: str) -> None:
    """`init` with ``parents=False``: the ledger's own directory may be created, nothing
    above it, so a mistyped path (`/nonexistent/dir/l.db`) is refused instead of made —
    at the file system's root for root."""
    directory = os.path.dirname(os.path.abspath(path))
    above = os.path.dirname(directory)
    if os.path.isdir(directory) or os.path.isdir(above):
        return
    what = "is not a directory" if os.path.lexists(above) else "does not exist"
    raise InvalidInput(f"cannot create ledger {path}: {above} {what} (only the ledger's own"
                       " directory is created); create it first, or let init create every"
                       " missing directory (steptrail init --parents)")


def _clock(options: dict[str, Any]) -> None:
    if options.get("clock") is None:
        options["clock"] = time.time_ns


class SqliteBackend:
    kind: Final = "sqlite"
    local_file: Final = True
    shared: Final = False
    archives_beside: Final = True

    def matches(self, location: str) -> bool:
        return True  # the last store asked: a file path

    def open(self, location: str, **options: Any) -> Any:
        from . import SqliteStore

        _clock(options)
        return SqliteStore.open(location, **options)

    def create(self, location: str, **options: Any) -> tuple[Any, bool]:
        from . import SqliteStore

        _clock(options)
        options.pop("forensic", None)
        options.pop("readonly", None)
        return SqliteStore.create(location, **options)

    def check_writer(self, location: str) -> None:
        from . import SqliteStore
        from .database import refuse_a_backups_database

        refuse_a_backups_database(location)
        SqliteStore.check_writable(location)

    def check_new(self, location: str, *, parents: bool) -> None:
        if not parents:
            refuse_missing_parents(location)

    def may_exist(self, location: str) -> bool:
        return os.path.exists(location)

    def absolute(self, location: str) -> str:
        return os.path.abspath(location)

    def shown(self, location: str) -> str:
        return location

    def without_secrets(self, text: str, location: str) -> str:
        return text  # a file path holds no password

    def exported_rows(self, location: str, what: str) -> Any:
        """`steptrail export`'s rows of table `what` (a context manager)."""
        from .export import exported_rows

        return exported_rows(location, what)

    def unexportable(self, location: str, exc: BaseException) -> Any:
        from .export import unexportable

        return unexportable(location, exc)

    def unmapped(self, exc: BaseException, location: str) -> Unmapped | None:
        """What SQLite raised past every boundary (each maps its own): what it means."""
        from . import driver as errors

        shown = location or "the ledger"
        if isinstance(exc, errors.BUSY_ERRORS):
            return Unmapped("LedgerBusy", "the ledger stayed locked by another writer; retry"
                            " later", EXIT_ENVIRONMENT, {"path": shown})
        if isinstance(exc, errors.STORAGE_ERRORS):
            return Unmapped("StorageFailure", f"storage failed: {exc}; free space or fix the"
                            " disk, then retry", EXIT_ENVIRONMENT,
                            {"path": shown, "what": str(exc)})
        if isinstance(exc, errors.DAMAGE_ERRORS):
            # A last resort: a read boundary missed a damaged row (each maps it itself).
            why = f"{type(exc).__name__}: {exc}"
            return Unmapped("CorruptLedger", f"ledger {shown} is damaged ({why}); run"
                            " 'steptrail verify' and restore it from a backup", EXIT_USAGE,
                            {"path": shown, "why": why})
        return None


BACKEND: Final = SqliteBackend()

"""A sealed run's archive, whatever the ledger's store: a SQLite file written durably and
read immutable (docs/design.md "Sealed runs"). Its format lives with the SQLite store
(`ledger/store/sqlite/archive.py`, imported on first use); modules above the store reach
it here, so that none of them names a concrete store."""

from __future__ import annotations

from typing import Any


#: What this module offers (the SQLite store's archive names, imported on first use).
NAMES = frozenset({"ArchiveFile", "remove_stray_temporaries", "write_archive"})


def __getattr__(name: str) -> Any:
    if name in NAMES:
        from .sqlite import archive

        return getattr(archive, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


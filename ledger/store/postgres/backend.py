"""The PostgreSQL store as the registry knows it (`ledger.store.registry`): a
``postgresql://`` URL or a libpq keyword/value string. Importing this imports no driver."""

from __future__ import annotations

from typing import Any, Final

from ...errors import EXIT_ENVIRONMENT, InvalidInput
from ..registry import Unmapped
from .location import SCHEMES, is_url, shown_location, without_secrets

#: What only a file ledger takes (refused here before anything is opened).
_FILE_OPTIONS: Final = {
    "vfs": "vfs is a SQLite option; a postgresql:// ledger has no file",
    "blob_root": "blob_root is a SQLite option; a postgresql:// ledger keeps its blobs in the"
                 " database",
}


def _options(options: dict[str, Any]) -> dict[str, Any]:
    for name, why in _FILE_OPTIONS.items():
        if options.pop(name, None) is not None:
            raise InvalidInput(why)
    options.pop("synchronous", None)  # the server's durability is the server's setting
    return options


class PgBackend:
    kind: Final = "postgresql"
    local_file: Final = False
    shared: Final = True
    archives_beside: Final = False
    schemes: Final = SCHEMES  # (the URL schemes it takes: `locate` names them)

    def matches(self, location: str) -> bool:
        return is_url(location)

    def open(self, location: str, **options: Any) -> Any:
        from . import PgStore

        return PgStore.open(location, **_options(options))

    def create(self, location: str, **options: Any) -> tuple[Any, bool]:
        from . import PgStore

        options = _options(options)
        options.pop("forensic", None)
        options.pop("readonly", None)
        return PgStore.create(location, **options)

    def check_writer(self, location: str) -> None:
        pass

    def check_new(self, location: str, *, parents: bool) -> None:
        pass

    def may_exist(self, location: str) -> bool:
        return False  # `create` judges the database itself, under its lock

    def absolute(self, location: str) -> str:
        return location

    def shown(self, location: str) -> str:
        return shown_location(location)

    def without_secrets(self, text: str, location: str) -> str:
        return without_secrets(text, location)

    def exported_rows(self, location: str, what: str) -> Any:
        raise InvalidInput("export reads a SQLite ledger file; for a PostgreSQL ledger copy"
                           " it to a file first: steptrail copy URL ledger.db, then"
                           " steptrail --ledger ledger.db export")

    def unexportable(self, location: str, exc: BaseException) -> Any:
        return self.exported_rows(location, "")

    def unmapped(self, exc: BaseException, location: str) -> Unmapped | None:
        """A driver error no boundary mapped: a lost connection, or a refused statement."""
        from .driver import driver_errors

        lost, failed = driver_errors()
        path = shown_location(location) if location else "the ledger"
        if isinstance(exc, lost):
            what = without_secrets(" ".join(str(exc).split()), location)
            return Unmapped("DatabaseUnavailable", f"the database is unavailable: {what}; start"
                            " the server or fix the URL, then retry with the same journal key",
                            EXIT_ENVIRONMENT, {"path": path})
        if isinstance(exc, failed):
            what = without_secrets(str(exc), location)
            return Unmapped("StorageFailure", "the database refused a statement:"
                            f" {' '.join(what.split())}", EXIT_ENVIRONMENT,
                            {"path": path, "what": what})
        return None


BACKEND: Final = PgBackend()

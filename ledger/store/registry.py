"""Which store a location names: the one place a ledger's location picks its store.

A location is text (or a path): a ``postgresql://`` URL or a libpq keyword/value string
names a ledger in a PostgreSQL database, anything else a SQLite file. Each store
registers a `Backend` (its module's ``BACKEND``), imported on first use — the command
line and the library never import a driver they do not need. Everything outside
``ledger/store/`` reaches a store through `locate`, `open_store` and `create_store`, and
never names a concrete one (tests/architecture/test_architecture.py holds that), as litestream picks
a replica client by the URL's scheme.

A backend answers what differs between stores and the callers above need to know:
whether the location is a local file or a database many machines reach, how it is
shown without its secrets, which options it takes, what a driver error no boundary
mapped means. Adding a store is adding a module with a ``BACKEND`` and a line here.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..errors import InvalidInput

#: A `ledger.store.Store` (named, not imported: the store package imports this module).
Store = Any


@dataclass(frozen=True)
class Unmapped:
    """What a store error no boundary mapped means: the typed error's name, its one-line
    message, its exit code and facts (the command line's last resort prints these)."""

    type_name: str
    message: str
    exit_code: int
    facts: dict[str, Any]


class Backend(Protocol):
    """A store as the registry knows it (each store module's ``BACKEND``)."""

    #: "sqlite" or "postgresql": what `Location.kind` says.
    kind: str
    # What the store can do, by name (what callers ask instead of which store it is):
    #: The ledger is a file of this machine: its path resolves, the directory beside it
    #: holds its blobs, archives and lock files, it can be exported, opened immutable.
    local_file: bool
    #: Many processes on many machines reach it at once: a lock file beside a ledger
    #: does not exclude them (they take turns on the ledger's own locks).
    shared: bool
    #: A seal's archives go in `archive/` beside the file (True), or in the directory
    #: the ledger records at its first seal (False: nothing of it is on one disk).
    archives_beside: bool

    def matches(self, location: str) -> bool:
        """Whether `location` names a ledger of this store (decided from the text)."""
        ...

    def open(self, location: str, **options: Any) -> Store: ...
    def create(self, location: str, **options: Any) -> tuple[Store, bool]: ...

    def check_writer(self, location: str) -> None:
        """Refuse, before anything is opened, a location a writer must not open."""
        ...

    def check_new(self, location: str, *, parents: bool) -> None:
        """Refuse, before anything is created, a new ledger's location (`init`)."""
        ...

    def may_exist(self, location: str) -> bool:
        """Whether a ledger may already be at `location` (`init` looks at it first)."""
        ...

    def absolute(self, location: str) -> str: ...
    def shown(self, location: str) -> str: ...
    def without_secrets(self, text: str, location: str) -> str: ...
    def unmapped(self, exc: BaseException, location: str) -> Unmapped | None: ...

    def exported_rows(self, location: str, what: str) -> Any:
        """`steptrail export`'s rows of table `what`: a context manager yielding dicts
        (a store that cannot be exported in place raises InvalidInput)."""
        ...

    def unexportable(self, location: str, exc: BaseException) -> Any:
        """The typed error for a row of `location` that cannot be written out."""
        ...


#: The registered stores, most specific first; the last one takes every location the
#: others do not (a file path). Module paths, imported on first use.
BACKENDS: Final = ("ledger.store.postgres.backend", "ledger.store.sqlite.backend")

_loaded: dict[str, Backend] = {}


def _backend(module: str) -> Backend:
    found = _loaded.get(module)
    if found is None:
        found = _loaded[module] = importlib.import_module(module).BACKEND
    return found


@dataclass(frozen=True)
class Location:
    """A ledger's location and the store it names (`locate`).

    >>> from ledger import locate
    >>> locate("ledger.db").text
    'ledger.db'
    """

    text: str
    backend: Backend

    @property
    def kind(self) -> str:
        """"sqlite" or "postgresql"."""
        return self.backend.kind

    @property
    def local_file(self) -> bool:
        """The ledger is a file of this machine (`Backend.local_file`)."""
        return self.backend.local_file

    @property
    def shared(self) -> bool:
        """Many machines reach it at once (`Backend.shared`)."""
        return self.backend.shared

    @property
    def archives_beside(self) -> bool:
        """A seal's archives go beside the file (`Backend.archives_beside`)."""
        return self.backend.archives_beside

    @property
    def in_database(self) -> bool:
        """Not a file of this machine (the name before the capabilities above: ask
        the one that is meant)."""
        return not self.backend.local_file

    @property
    def file(self) -> str | None:
        """The local file the ledger is (as given), None for a database."""
        return self.text if self.backend.local_file else None

    @property
    def shown(self) -> str:
        """The location as messages and outputs name it: never a password."""
        return self.backend.shown(self.text)

    def absolute(self) -> str:
        """A file's absolute path; a database's location as given."""
        return self.backend.absolute(self.text)

    def without_secrets(self, text: str) -> str:
        """`text` (an error's message, say) with this location's secrets masked."""
        return self.backend.without_secrets(text, self.text)

    def check_writer(self) -> None:
        self.backend.check_writer(self.text)

    def check_new(self, *, parents: bool) -> None:
        self.backend.check_new(self.text, parents=parents)

    def may_exist(self) -> bool:
        return self.backend.may_exist(self.text)

    def open(self, **options: Any) -> Store:
        """The store at this location (options as the store takes them; an option of
        another store is refused, InvalidInput, before anything is opened)."""
        return self.backend.open(self.text, **options)

    def create(self, **options: Any) -> tuple[Store, bool]:
        """Create the store here, or open the one there; and whether it was created."""
        return self.backend.create(self.text, **options)

    def unmapped(self, exc: BaseException) -> Unmapped | None:
        return self.backend.unmapped(exc, self.text)


def locate(location: str | os.PathLike[str]) -> Location:
    """The store `location` names: a database URL or keyword string, else a file path.

    >>> from ledger import locate
    >>> type(locate("postgresql://agent@db/steptrail").backend).__name__
    'PgBackend'
    """

    text = location if isinstance(location, str) else os.fspath(location)
    schemes: list[str] = []
    for module in BACKENDS:
        backend = _backend(module)
        if backend.matches(text):
            if getattr(backend, "local_file", False):
                # `postgresq://bob:pw@host/db` taken by the file store: a URL of no store,
                # not a file path — never a directory made from it, never its password
                # shown. So is a URL mistyped otherwise (a slash or its colon missing,
                # a space before it) and a keyword/value string with a mistyped keyword.
                _refuse_url_like(text, schemes)
            return Location(text, backend)
        schemes.extend(getattr(backend, "schemes", ()))
    raise AssertionError("the last backend takes every location")  # pragma: no cover


#: ``scheme://`` at the start of a location.
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


#: A scheme mistyped: ``SCHEME:`` with fewer slashes than two, or ``SCHEME//`` (its
#: colon missing), after any whitespace; a space inside the scheme.
_SCHEME_LIKE: Final = re.compile(r"\s*([A-Za-z][A-Za-z0-9+. -]*?)\s*(:/*|//)")
#: ``user@`` or ``user:password@`` right after a scheme: credentials, not a file name.
_USERINFO: Final = re.compile(r"[^/\s]*@")
#: A libpq keyword/value string: ``KEY=VALUE`` pairs (two at least, or a password).
_KEYWORD_PAIRS: Final = re.compile(r"\s*(?:[A-Za-z_]\w*\s*=\s*(?:'[^']*'|\S*)\s+){1,}"
                                   r"[A-Za-z_]\w*\s*=\s*(?:'[^']*'|\S*)\s*")
_PASSWORD_PAIR: Final = re.compile(r"(?i)(?:^|\s)\w*pas\w*\s*=")


def _refuse_url_like(text: str, known: list[str]) -> None:
    """InvalidInput when `text`, a location the file store would take, reads as a
    database URL or keyword/value string gone wrong: its directories would be made
    from it (``init --parents``) and its password shown as a file's name."""
    scheme = _SCHEME.match(text)
    if scheme is not None:
        raise InvalidInput(_unknown_scheme(text, scheme.group(1), known))
    like = _SCHEME_LIKE.match(text)
    if like is not None:
        name, rest = like.group(1), text[like.end():]
        near = difflib.get_close_matches(name.lower().replace(" ", ""), known, n=1,
                                         cutoff=0.8)
        if (text[:1].isspace() and like.group(2).startswith(":/")) \
                or _USERINFO.match(rest) or near:
            raise InvalidInput(_unknown_scheme(text, name.strip(), known, mistyped=True))
    if _KEYWORD_PAIRS.fullmatch(text) or _PASSWORD_PAIR.search(text):
        raise InvalidInput(
            f"{_masked(text)[:200]}: reads as a PostgreSQL keyword/value string, but its first"
            " keyword is not one libpq knows (host, port, dbname, user, password, ...); fix"
            " the keyword, or give a file path; nothing was written")


def _masked(text: str) -> str:
    """`text` with whatever may be a password hidden: between a scheme and ``@``, and
    the value of every keyword that is not plainly harmless."""
    masked = re.sub(r"([^/\s:@]*):[^/\s@]*@", r"\1:***@", text)
    return re.sub(r"(?i)\b(\w*pas\w*|\w*secret\w*|\w*key\w*)(\s*=\s*)('[^']*'?|[^&\s]*)",
                  r"\1\2***", masked)


def _unknown_scheme(text: str, scheme: str, known: list[str], *,
                    mistyped: bool = False) -> str:
    masked = _masked(text)
    if mistyped:
        near = difflib.get_close_matches(scheme.lower().replace(" ", ""), known, n=1,
                                         cutoff=0.6)
        hint = f"did you mean {near[0]}://? " if near else ""
        return (f"{masked[:200]}: reads as a mistyped URL ({hint}a database URL is"
                f" {' / '.join(k + '://USER@HOST/DB' for k in known[:1])}, with no space"
                " before it; a file path that looks like one is refused); nothing was written")
    near = difflib.get_close_matches(scheme.lower(), known, n=1)
    hint = f"did you mean {near[0]}://? " if near else ""
    return (f"{masked[:200]}: {scheme}:// is not a store steptrail knows ({hint}a ledger is a"
            f" file path or a {' / '.join(k + '://' for k in known[:1])} URL); nothing was"
            " written")


def open_store(location: str | os.PathLike[str], **options: Any) -> Store:
    """`locate(location).open(**options)`."""
    return locate(location).open(**options)


def create_store(location: str | os.PathLike[str], **options: Any) -> tuple[Store, bool]:
    """`locate(location).create(**options)`."""
    return locate(location).create(**options)


def shown_location(location: str | os.PathLike[str]) -> str:
    """A location as messages name it: a URL's or keyword string's password masked.

    >>> from ledger import shown_location
    >>> shown_location("postgresql://agent:secret@db/steptrail")
    'postgresql://agent:***@db/steptrail'
    """
    return locate(location).shown


def unmapped_error(exc: BaseException, location: str = "") -> Unmapped | None:
    """What a store's error no boundary mapped means (each store is asked), or None (a
    bug: let it propagate).

    >>> from ledger import unmapped_error
    >>> unmapped_error(ValueError("not a store's error")) is None
    True
    """
    for module in BACKENDS:
        found = _backend(module).unmapped(exc, location)
        if found is not None:
            return found
    return None


__all__ = ["BACKENDS", "Backend", "Location", "Unmapped", "create_store", "locate",
           "open_store", "shown_location", "unmapped_error"]

"""What every page of `steptrail ui` shares: its bounds (how much a page shows, how long
it may take), its two refusals (`NotFound`, `BadRequest`: a 404 or a 400 page), the
request's parameters read and checked, and `Shell`, what a group of pages is handed of
the served ledger (its pool, jobs, holders and `render`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ledger.errors import InvalidInput


from . import model, text

if TYPE_CHECKING:
    from ledger import Ledger


#: Rows a page shows.
PAGE: Final = 50


EVENTS_PAGE: Final = 100


STEP_EVENTS_PAGE: Final = 100


TREE_PAGE: Final = 200


#: Diffs rendered per step page (the rest are listed with their hashes); a refused
#: write's file is hashed on disk within the same budget only.
DIFFS_PER_PAGE: Final = 40


#: Writes, artifacts, undos and restores listed per event or manifest on a step page
#: (an event may hold 10,000): the rest are counted, each path's history has them.
WRITES_PER_EVENT: Final = 2 * DIFFS_PER_PAGE


#: Changes a rewind's preview shows (and diffs) a page; the rest are a page further
#: (``?start=``), every one counted.
REWIND_PAGE: Final = DIFFS_PER_PAGE


#: Times a rewind's preview takes ``?path=`` (a directory stands for what is under it).
REWIND_PATHS_MAX: Final = 64


#: A refused write's file on disk is hashed by its step page only up to this size.
DISK_HASH_MAX: Final = 2 * 1024 * 1024


#: The time one page may spend on diffs (a step of 40 rewritten 20,000-line files):
#: past it, the page's remaining diffs are links to their own page (`/diff`).
PAGE_DIFF_BUDGET_S: Final = 0.75


#: The time the one-diff page may spend (its diff then says what it did not compare).
DIFF_PAGE_BUDGET_S: Final = 3.0


#: Complete diffs kept, by (before, after, path): a page reloaded by the live view, or
#: visited again, costs nothing the second time.
DIFF_CACHE: Final = 256


#: Lines and characters of a file shown per page of the file view.
FILE_PAGE_LINES: Final = 2000


FILE_PAGE_CHARS: Final = 256 * 1024


class NotFound(Exception):
    """A page about something the ledger does not hold."""


class BadRequest(Exception):
    """A query parameter that is not what the page takes."""


def _error_page(status: int, message: str) -> Response:
    return Response(f"{status}: {text.visible(message)}\n", status_code=status,
                    media_type="text/plain; charset=utf-8")


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None or value == "":
        raise BadRequest(f"the page needs ?{name}=")
    return value


def _int(request: Request, name: str, default: int, *, lo: int = 0) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    # ASCII digits only ('²'.isdigit() is true), and short enough for int() and a seq
    if (not (value.isascii() and value.isdigit()) or len(value) > 19
            or not lo <= int(value) <= 2**63 - 1):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise BadRequest(f"?{name}= takes a whole number of at least {lo}, not {shown!r}")
    return int(value)


def _digest(request: Request) -> str:
    digest = request.query_params.get("digest", "")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise BadRequest("?digest= takes a sha256 digest (64 lowercase hex characters)")
    return digest


def _time_range(since: str, until: str) -> tuple[int, int]:
    """?since= and ?until= (an ISO date or date and time, UTC unless it says otherwise)
    as [lo, hi) in nanoseconds; either may be empty (no bound)."""
    import datetime as dt

    def ns(value: str, name: str) -> int:
        try:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise BadRequest(f"?{name}= takes a date or a date and time (2026-12-06 or"
                             f" 2026-12-06T03:00), not {value[:40]!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return int(when.timestamp() * 1e9)

    lo = ns(since, "since") if since else 0
    hi = ns(until, "until") if until else 2**63
    if lo >= hi:
        raise BadRequest("?since= must be before ?until=")
    return lo, hi


def _digest_or_absent(request: Request, name: str) -> str | None:
    """?name= as a blob digest, or None for ``absent`` (a file created or deleted)."""
    value = request.query_params.get(name, "absent")
    if value == "absent":
        return None
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise BadRequest(f"?{name}= takes a sha256 digest (64 lowercase hex characters) or"
                         " 'absent'")
    return value


def _step_id_ok(value: str) -> bool:
    from ledger.events import check_step_id

    try:
        check_step_id(value)
    except InvalidInput:
        return False
    return True


class Shell(Protocol):
    """What a group of pages is handed of the served ledger (`ledger.ui.app.UI`)."""

    pool: model.Pool
    jobs: model.Jobs
    holders: model.Holders
    lineage: model.Lineage
    #: The served ledger's location, and as pages show it (a URL's password masked).
    location: str
    shown: str

    def render(self, request: Request, template: str, led: Ledger, status: int = 200,
               **ctx: Any) -> Response: ...

"""The UI's ASGI application: Starlette routes rendering Jinja templates (autoescape
on), behind `Gate` — the loopback Host check, the token, the security headers.

Every route is a GET (HEAD too) and reads only; each takes a read-only `Ledger` from
the pool for the request and gives it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from ledger.errors import InvalidInput, LedgerError, UnknownStep, UnknownWorkspace

from ledger import kinds

from . import model, text
from .files import FilePages
from .overview import LedgerPages
from .steps import StepPages
from .travel import TravelPages
from .web import BadRequest, NotFound, _error_page

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from ledger import Ledger

HERE: Final = Path(__file__).resolve().parent
#: Pages that read blobs and diff (step, history, diff, file, tree) rendered at once;
#: more wait their turn in the event loop, holding no worker thread, so the live poll
#: and the light pages are always answered.
HEAVY_AT_ONCE: Final = 2
#: The header that asks for a page's main fragment (the live update).
FRAGMENT_HEADER: Final = "x-steptrail-fragment"
#: The live view's fresh nonce (a header on a fragment request, ``?nonce=`` on a poll)
#: and the answer's MAC over it: HMAC-SHA256(live key, nonce + "\n" + body). The key is
#: drawn at each start and delivered only inside a full page's body, which a process
#: that takes the port later never sees: it cannot produce an answer a tab accepts.
NONCE_HEADER: Final = "x-steptrail-nonce"
MAC_HEADER: Final = "x-steptrail-mac"
CSP: Final = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
              " frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
SECURITY_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


# -- the guard --------------------------------------------------------------------------


def cookie_name(port: int) -> str:
    """The session cookie's name (one per served port; its Path is the secret prefix)."""
    return f"steptrail_ui_{port}"


def new_prefix() -> str:
    """A fresh secret path prefix for one server start (not the token)."""
    return "/s-" + secrets.token_urlsafe(16)


#: What a cross-site navigation carrying the token gets instead of a 303: a page of
#: ours that moves on by itself, so the next request is same-origin and carries the
#: SameSite=Strict cookie (a redirect would keep the chain cross-site, cookie-less).
_BOUNCE: Final = ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
                  '<meta name="referrer" content="no-referrer">'
                  '<meta http-equiv="refresh" content="0;url={where}">'
                  '<title>steptrail ui</title></head>\n<body><p><a href="{where}">open the'
                  ' ledger</a></p></body></html>\n')


class Gate:
    """Every request passes here first: a Host header that is not the loopback address
    and port served (DNS rebinding) → 403; a method other than GET/HEAD → 405. The pages
    live under a secret path prefix drawn at each start (`prefix`, not the token):
    a request with the right ``?token=`` (any path) is redirected into it and gets a
    session cookie — a random value, not the token — scoped ``Path=<prefix>``,
    HttpOnly, SameSite=Strict (browsers scope cookies by host, not port: the path is
    what keeps the cookie from other servers on 127.0.0.1). Under the prefix, a request
    needs that cookie; outside it, nothing is served without the token: 403. Every
    response gets the security headers (CSP, nosniff, no framing, no referrer, no
    store)."""

    def __init__(self, app: ASGIApp, *, token: str, port: int, prefix: str) -> None:
        if not (prefix.startswith("/") and len(prefix) > 1 and "/" not in prefix[1:]
                and prefix.isascii() and all(c.isalnum() or c in "-_" for c in prefix[1:])):
            raise ValueError(f"a prefix is '/' and URL-safe characters, not {prefix!r}")
        self.app, self.token, self.port, self.prefix = app, token, port, prefix
        self.session = secrets.token_urlsafe(32)
        #: The token opens one session, once: spent by the first navigation that shows
        #: it (never by a prefetch or a HEAD), so the browser's history keeps nothing
        #: that opens the ledger.
        self.spent = False
        self.hosts = {f"127.0.0.1:{port}".encode(), f"localhost:{port}".encode()}
        self.cookie = cookie_name(port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await _plain(send, 403, "forbidden")
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in names]
            await send(message)

        headers = dict(scope.get("headers") or [])
        if headers.get(b"host", b"").lower() not in self.hosts:
            await _plain(secured, 403, "forbidden: this server answers only to"
                         f" http://127.0.0.1:{self.port}/ (the Host header is checked)")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _plain(secured, 405, "method not allowed: this server only reads")
            return
        path: str = scope.get("path", "/") or "/"
        inside = path == self.prefix or path.startswith(self.prefix + "/")
        rest = path[len(self.prefix):] if inside else path
        query = scope.get("query_string", b"").decode("latin-1")
        params = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in params if k == "token"]
        if given:
            if len(given) != 1 or not self._matches(given[0]):
                await _plain(secured, 403, "forbidden: wrong token; use the URL"
                             " 'steptrail ui' printed")
                return
            kept = urlencode([(k, v) for k, v in params if k != "token"], quote_via=quote)
            where = self._where(rest, kept)
            if scope["method"] == "HEAD" or _is_prefetch(headers):
                # a browser's speculative load must not spend the one use
                await _plain(secured, 503, "not opened by a prefetch: open the URL itself")
                return
            if self.spent:
                # Spent: no new session. Into the pages, where this browser's session
                # cookie (if it has one: a second tab) still lets it in; another
                # browser is told why it is refused (`_NO_SESSION`).
                await secured({"type": "http.response.start", "status": 303, "headers": [
                    (b"location", where.encode("ascii")),
                    (b"content-type", b"text/plain; charset=utf-8")]})
                await secured({"type": "http.response.body", "body": b"see the page\n"})
                return
            self.spent = True
            cookie = (f"{self.cookie}={self.session}; Path={self.prefix}; HttpOnly;"
                      " SameSite=Strict").encode()
            if (headers.get(b"sec-fetch-site") == b"cross-site"
                    and headers.get(b"sec-fetch-mode") == b"navigate"):
                await secured({"type": "http.response.start", "status": 200, "headers": [
                    (b"set-cookie", cookie), (b"content-type", b"text/html; charset=utf-8")]})
                body = _BOUNCE.format(where=html.escape(where, quote=True))
                await secured({"type": "http.response.body", "body": body.encode()})
                return
            await secured({"type": "http.response.start", "status": 303, "headers": [
                (b"location", where.encode("ascii")), (b"set-cookie", cookie),
                (b"content-type", b"text/plain; charset=utf-8")]})
            await secured({"type": "http.response.body", "body": b"see the page\n"})
            return
        if not inside or not self._is_session(
                _cookie(headers.get(b"cookie", b""), self.cookie)):
            await _plain(secured, 403, _NO_SESSION if self.spent else
                         "forbidden: open the URL 'steptrail ui' printed (it carries the"
                         " token)")
            return
        if rest == "":
            await secured({"type": "http.response.start", "status": 303, "headers": [
                (b"location", self._where("/", scope.get("query_string", b"")).encode("ascii"))]})
            await secured({"type": "http.response.body", "body": b""})
            return
        # ASGI: `path` keeps the prefix, `root_path` names it (routing strips it)
        await self.app(dict(scope, root_path=self.prefix), receive, secured)

    def _where(self, rest: str, query: str | bytes) -> str:
        """A Location under our prefix for the decoded path `rest`: one leading slash,
        the rest percent-encoded (no CR, LF, tab, backslash or second slash up front);
        `query` as given, with anything but URL characters percent-encoded."""
        tail = rest.lstrip("/\\").encode("utf-8", "surrogateescape")
        where = f"{self.prefix}/{quote(tail, safe='/')}"
        if query:
            where += "?" + quote(query, safe="=&%+;:@,/-._~!$'()*")
        return where

    def _matches(self, value: str | None) -> bool:
        if value is None:
            return False
        return hmac.compare_digest(value.encode("utf-8", "surrogateescape"),
                                   self.token.encode())

    def _is_session(self, value: str | None) -> bool:
        if value is None:
            return False
        return hmac.compare_digest(value.encode("utf-8", "surrogateescape"),
                                   self.session.encode())


#: What a browser without the session is told once the token was spent.
_NO_SESSION: Final = (
    "forbidden: this browser has no session. The URL 'steptrail ui' printed opens one"
    " browser session, once (its token is then void, so history holds nothing that opens"
    " the ledger); more tabs of that browser work, another browser does not. To open it"
    " elsewhere, stop steptrail ui and start it again for a new URL.")


def _is_prefetch(headers: dict[bytes, bytes]) -> bool:
    """A request the browser makes speculatively (prefetch, prerender, preview), not
    the person's navigation."""
    for name in (b"sec-purpose", b"purpose", b"x-purpose", b"x-moz"):
        value = headers.get(name, b"").lower()
        if b"prefetch" in value or b"prerender" in value or b"preview" in value:
            return True
    return False


def _cookie(header: bytes, name: str) -> str | None:
    for part in header.decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _plain(send: Callable[[Any], Any], status: int, body: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": (body + "\n").encode()})


# -- rendering -----------------------------------------------------------------------------


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` of every template: strings with their control and
    invisible characters made visible (then autoescaped)."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return "" if value is None else value
    return text.visible(value)


def url(where: str, /, **params: Any) -> str:
    """A link to one of our pages, relative to the served prefix (`UI.url` adds it);
    every parameter percent-encoded, a list's values each as the parameter again."""
    kept = [(k, str(x)) for k, v in params.items()
            for x in (v if isinstance(v, list | tuple) else (v,)) if x is not None and x != ""]
    return where + ("?" + urlencode(kept, quote_via=quote, safe="") if kept else "")


def make_env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=True,
                      finalize=_finalize, undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True)
    env.globals.update(size=text.size, iso=text.iso, ago=text.ago, span=text.span,
                       explain=text.explain, detail=kinds.detail)
    env.filters["visible_nl"] = lambda s: text.visible(s, newlines=True)
    return env


# -- the application -------------------------------------------------------------------


class UI:
    """One served ledger: its pool, background jobs, templates and routes."""

    def __init__(self, location: str, *, token: str, port: int, prefix: str,
                 verify: bool = True, shown: str | None = None, immutable: bool = False) -> None:
        self.location = location
        self.shown = shown or location
        self.token, self.port, self.prefix = token, port, prefix
        self.live_key = secrets.token_bytes(32)
        self.pool = model.Pool(location, immutable=immutable)
        self.jobs = model.Jobs(self.pool, verify=verify)
        self.holders = model.Holders()
        self.lineage = model.Lineage()
        self.env = make_env()
        self.env.globals["url"] = self.url
        self.static = {name: (HERE / "static" / name).read_bytes()
                       for name in ("ui.js", "ui.css")}
        self._heavy: asyncio.Semaphore | None = None
        with self.pool.ledger() as led:
            self.ledger_id = led.ledger_id
            head = led.head().seq
        self.jobs.start(head)
        #: The pages, by what they show.
        self.files = FilePages(self)
        self.steps = StepPages(self, self.files)
        self.pages = LedgerPages(self)
        self.travel = TravelPages(self, self.files)

    # the plumbing

    def url(self, where: str, /, **params: Any) -> str:
        """A link to one of our pages as the browser must ask for it: under the secret
        prefix (every link a template renders goes through here)."""
        return self.prefix + url(where, **params)

    def render(self, request: Request, template: str, led: Ledger, status: int = 200,
               **ctx: Any) -> Response:
        head = led.head()
        self.jobs.refresh(head.seq)
        fragment = request.headers.get(FRAGMENT_HEADER) == "1"
        v, s = self.jobs.verify, self.jobs.stats
        page = self.env.get_template(template).render(
            layout="fragment.html" if fragment else "base.html", head=head,
            head_hash=head.hash.hex(), shown=self.shown, ledger_id=self.ledger_id,
            verify=v, stats_job=s, now_ns=time.time_ns(), live_key=self.live_key.hex(),
            **ctx)
        body = page.encode("utf-8")
        headers = {"x-steptrail-head": str(head.seq), "x-steptrail-verify": v.state}
        if fragment:
            headers.update(self.signed(request.headers.get(NONCE_HEADER), body))
        return Response(body, status_code=status, media_type="text/html; charset=utf-8",
                        headers=headers)

    def signed(self, nonce: str | None, body: bytes) -> dict[str, str]:
        """The MAC header for an answer to the live view's `nonce` (none, or not one:
        no header, and the tab rejects the answer)."""
        if not nonce or len(nonce) > 128 or not all(c in "0123456789abcdef" for c in nonce):
            return {}
        mac = hmac.new(self.live_key, nonce.encode() + b"\n" + body, "sha256").hexdigest()
        return {MAC_HEADER: mac}

    def routes(self) -> list[Route]:
        pages: list[tuple[str, Callable[..., Response]]] = [
            ("/", self.pages.overview), ("/events", self.pages.events),
            ("/step", self.steps.step), ("/run", self.steps.run),
            ("/workspace", self.steps.workspace), ("/history", self.steps.history),
            ("/tree", self.files.tree), ("/file", self.files.file),
            ("/stats", self.pages.stats), ("/diff", self.files.diff_page),
            ("/runs", self.pages.runs), ("/search", self.pages.search),
            ("/compare", self.pages.compare), ("/timeline", self.travel.timeline),
            ("/rewind", self.travel.rewind),
        ]
        heavy = {"/step", "/history", "/tree", "/file", "/diff", "/search", "/compare",
                 "/rewind"}
        out = [Route(p, self._page(f, heavy=p in heavy), methods=["GET", "HEAD"])
               for p, f in pages]
        out += [Route("/download", self.files.download, methods=["GET", "HEAD"]),
                Route("/api/head", self.api_head, methods=["GET", "HEAD"]),
                Route("/static/{name}", self.static_file, methods=["GET", "HEAD"]),
                Route("/favicon.ico", lambda _r: Response(status_code=204),
                      methods=["GET", "HEAD"])]
        return out

    def _page(self, handler: Callable[[Request, Ledger], Response], *,
              heavy: bool = False) -> Callable[[Request], Any]:
        sync = self._sync_page(handler)

        async def endpoint(request: Request) -> Response:
            if not heavy:
                return await run_in_threadpool(sync, request)
            if self._heavy is None:  # (made in the server's loop)
                self._heavy = asyncio.Semaphore(HEAVY_AT_ONCE)
            async with self._heavy:
                if await request.is_disconnected():  # gave up while waiting its turn
                    return Response(status_code=204)
                return await run_in_threadpool(sync, request)
        return endpoint

    def _sync_page(self, handler: Callable[[Request, Ledger], Response]
                   ) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                with self.pool.ledger() as led:
                    try:
                        return handler(request, led)
                    except (NotFound, UnknownStep, UnknownWorkspace) as exc:
                        return self.render(request, "error.html", led, 404, title="not found",
                                           message=str(exc))
                    except (BadRequest, InvalidInput) as exc:
                        return self.render(request, "error.html", led, 400,
                                           title="bad request", message=str(exc))
            except LedgerError as exc:
                return _error_page(500, f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - one line, never a traceback in a page
                print(f"steptrail ui: error: {type(exc).__name__}: {exc}", file=sys.stderr)
                return _error_page(500, f"{type(exc).__name__}: {exc}")
        return endpoint

    # the pages


    # not pages


    async def api_head(self, request: Request) -> Response:
        # answered in the event loop, never queued behind pages for a worker thread:
        # reading the head is one indexed row
        with self.pool.ledger() as led:
            head = led.head()
        self.jobs.refresh(head.seq)
        v, s = self.jobs.verify, self.jobs.stats
        doc: dict[str, Any] = {
            "seq": head.seq, "hash": head.hash.hex(),
            "verify": {"state": v.state, "seconds": round(v.seconds(), 1),
                       "ok": None if v.result is None else v.result["ok"],
                       "findings": None if v.result is None else len(v.result["findings"])},
            "stats": {"state": s.state, "head_seq": s.head_seq}}
        body = json.dumps(doc, separators=(",", ":")).encode()
        return Response(body, media_type="application/json",
                        headers=self.signed(request.query_params.get("nonce"), body))

    def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            return _error_page(404, "not found")
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return Response(self.static[name], media_type=f"{kind}; charset=utf-8")


def create_app(location: str, *, token: str, port: int, verify: bool = True,
               shown: str | None = None, prefix: str | None = None,
               immutable: bool = False) -> Gate:
    """The ASGI app serving the ledger at `location` read-only, answering only to
    ``127.0.0.1:port`` / ``localhost:port`` with `token`, its pages under a secret path
    prefix (`prefix`, or a fresh one: the app's ``.prefix``; see `Gate`). Verify
    starts in a child process unless `verify` is False."""
    prefix = prefix or new_prefix()
    ui = UI(location, token=token, port=port, prefix=prefix, verify=verify, shown=shown,
            immutable=immutable)
    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        ui.jobs.stop()
        ui.pool.close()

    app = Starlette(routes=ui.routes(), lifespan=lifespan)
    guarded = Gate(app, token=token, port=port, prefix=prefix)
    guarded.ui = ui  # type: ignore[attr-defined]
    return guarded


#: The name `Gate` had before (kept for its importers).
Guard = Gate

__all__ = ["CSP", "UI", "Gate", "Guard", "cookie_name", "create_app", "new_prefix", "url"]

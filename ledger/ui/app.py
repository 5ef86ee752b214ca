"""The UI's ASGI application: Starlette routes rendering Jinja templates (autoescape
on), behind `Gate` — the loopback Host check, the token, the security headers.

Every route is a GET (HEAD too) and reads only; each takes a read-only `Ledger` from
the pool for the request and gives it back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import html
import json
import re
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from ledger.errors import InvalidInput, LedgerError, UnknownStep, UnknownWorkspace

from ledger import diffs, kinds

from . import model, text

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from ledger import Ledger

HERE: Final = Path(__file__).resolve().parent
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
#: A refused write's file on disk is hashed by its step page only up to this size.
DISK_HASH_MAX: Final = 2 * 1024 * 1024
#: The time one page may spend on diffs (a step of 40 rewritten 20,000-line files):
#: past it, the page's remaining diffs are links to their own page (`/diff`).
PAGE_DIFF_BUDGET_S: Final = 0.75
#: The time the one-diff page may spend (its diff then says what it did not compare).
DIFF_PAGE_BUDGET_S: Final = 3.0
#: Pages that read blobs and diff (step, history, diff, file, tree) rendered at once;
#: more wait their turn in the event loop, holding no worker thread, so the live poll
#: and the light pages are always answered.
HEAVY_AT_ONCE: Final = 2
#: Complete diffs kept, by (before, after, path): a page reloaded by the live view, or
#: visited again, costs nothing the second time.
DIFF_CACHE: Final = 256
#: Lines and characters of a file shown per page of the file view.
FILE_PAGE_LINES: Final = 2000
FILE_PAGE_CHARS: Final = 256 * 1024
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


class NotFound(Exception):
    """A page about something the ledger does not hold."""


class BadRequest(Exception):
    """A query parameter that is not what the page takes."""


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
    every parameter percent-encoded."""
    kept = [(k, str(v)) for k, v in params.items() if v is not None and v != ""]
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
        self.env = make_env()
        self.env.globals["url"] = self.url
        self.static = {name: (HERE / "static" / name).read_bytes()
                       for name in ("ui.js", "ui.css")}
        self._diffs: collections.OrderedDict[tuple[Any, ...], text.Diff] = \
            collections.OrderedDict()
        self._diffs_lock = threading.Lock()
        self._heavy: asyncio.Semaphore | None = None
        with self.pool.ledger() as led:
            self.ledger_id = led.ledger_id
            head = led.head().seq
        self.jobs.start(head)

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
            ("/", self.overview), ("/events", self.events), ("/step", self.step),
            ("/run", self.run), ("/workspace", self.workspace), ("/history", self.history),
            ("/tree", self.tree), ("/file", self.file), ("/stats", self.stats),
            ("/diff", self.diff_page), ("/runs", self.runs), ("/search", self.search),
            ("/compare", self.compare),
        ]
        heavy = {"/step", "/history", "/tree", "/file", "/diff", "/search", "/compare"}
        out = [Route(p, self._page(f, heavy=p in heavy), methods=["GET", "HEAD"])
               for p, f in pages]
        out += [Route("/download", self.download, methods=["GET", "HEAD"]),
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

    def overview(self, request: Request, led: Ledger) -> Response:
        now = led.clock()
        workspaces = []
        waiting = []
        for state in (*model.IN_FLIGHT, model.UNACKED):
            waiting.extend(led.steps(state))
        waiting.sort(key=lambda r: r.last_seq, reverse=True)
        for row in led.workspaces.list():
            live = row.live_epoch(now) is not None
            older = set(led.workspaces.unsettled(row.name, row.epoch)) if row.epoch else set()
            mine = [r for r in waiting if r.workspace == row.name]
            workspaces.append({
                "row": row, "live": live,
                "lease": ("never leased" if row.epoch == 0 else "live" if live else
                          "released" if row.released else "expired"),
                "in_flight": sum(1 for r in mine if r.in_flight),
                "unacked": sum(1 for r in mine if r.unacked),
                "unsettled": len(older)})
        rows = []
        for r in waiting[:PAGE]:
            ws = next((w for w in workspaces if w["row"].name == r.workspace), None)
            what = ("unacked" if r.unacked else
                    "unsettled" if ws is not None and r.epoch < ws["row"].epoch else "in flight")
            rows.append({"row": r, "what": what})
        head = led.head().seq
        recent = list(led.read(max(0, head - 15)))
        recent.reverse()
        items = self._attention()
        return self.render(request, "overview.html", led, workspaces=workspaces, waiting=rows,
                           waiting_total=len(waiting), recent=recent,
                           witness=led.witness_status(), lag=led.projection_lag(),
                           charts=self._charts(small=True),
                           attention_open=[i for i in items if not i.resolved][:PAGE]
                           if items is not None else None,
                           attention_resolved=[i for i in items if i.resolved][:PAGE]
                           if items is not None else None,
                           attention_open_total=self._attention_open(items),
                           runs=self._runs()[:10])

    def _attention(self) -> list[Any] | None:
        """What needs a person (`ledger.attention`, as of the stats job's head) and
        verify's findings; None while the first pass runs."""
        from ledger.attention import Item

        job = self.jobs.stats
        if job.result is None:
            return None
        items: list[Any] = list(job.result.get("attention", []))
        v = self.jobs.verify
        if v.result is not None:
            items = [Item("verify", check, message, seq=seq, fix="verify")
                     for check, seq, message in v.result["findings"]] + items
        return items

    def _attention_open(self, items: list[Any] | None) -> int:
        """How many items are open (verify's findings and every open item the stats
        job counted, not only those it kept)."""
        if items is None or self.jobs.stats.result is None:
            return 0
        counted = self.jobs.stats.result.get("attention_open")
        verify = sum(1 for i in items if i.kind == "verify")
        return verify + counted if counted is not None else sum(
            1 for i in items if not i.resolved)

    def _runs(self, query: str = "") -> list[Any]:
        """Every run the stats job saw, the latest first (a substring of the name
        picks some)."""
        job = self.jobs.stats
        if job.result is None:
            return []
        runs = [r for r in job.result["report"].runs if query in r.run]
        return sorted(runs, key=lambda r: r.last_ns, reverse=True)

    def compare(self, request: Request, led: Ledger) -> Response:
        """A workspace between two points (seqs): every path written between them, what
        it held at the first and at the second, each with its diff a click away."""
        ws = _param(request, "ws")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        head = led.head().seq
        frm = _int(request, "from", 0)
        to = _int(request, "to", head)
        if frm >= to:
            raise BadRequest(f"?from= (#{frm}) must be before ?to= (#{to})")
        written = model.workspace_as_of(led, ws, to, after=frm)  # what changed in (frm, to]
        before = model.workspace_as_of(led, ws, frm) if frm else None
        rows = []
        for path, (_rev, digest, seq, step) in sorted(written.paths.items()):
            was = before.paths.get(path) if before is not None else None
            old = was[1] if was is not None else None
            if old != digest:
                rows.append({"path": path, "pre": old, "post": digest, "seq": seq,
                             "step": step})
        return self.render(request, "compare.html", led, ws=ws, frm=frm, to=to,
                           rows=rows[:TREE_PAGE], total=len(rows),
                           complete=written.complete and (before is None or before.complete),
                           scanned_to=written.scanned_to)

    def runs(self, request: Request, led: Ledger) -> Response:
        query = request.query_params.get("q", "")
        every = self._runs(query)
        start = _int(request, "start", 0)
        return self.render(request, "runs.html", led, runs=every[start:start + PAGE * 2],
                           total=len(every), start=start, q=query,
                           next_start=start + PAGE * 2 if start + PAGE * 2 < len(every) else None,
                           ready=self.jobs.stats.result is not None)

    def search(self, request: Request, led: Ledger) -> Response:
        """Steps, runs and paths whose name holds the text searched for."""
        query = request.query_params.get("q", "").strip()
        if len(query) > 256:
            raise BadRequest("?q= takes at most 256 characters")
        STATES = model.STATES
        state = request.query_params.get("state", "")
        if state and state not in STATES:
            raise BadRequest(f"?state= is one of {', '.join(STATES)}, not {state!r}")
        since, until = request.query_params.get("since", ""), request.query_params.get("until", "")
        lo, hi = _time_range(since, until)
        steps: list[Any] = []
        paths: list[tuple[str, str]] = []
        runs: list[Any] = []
        paths_complete = True
        if query or state or since or until:  # the steps: by name, state and time
            # by the store (a million events: one indexed-free scan in SQL, no rows built)
            steps = [r for r in led.steps(state or None, contains=query or None,
                                          limit=None if (since or until) else PAGE)
                     if lo <= r.updated_ns < hi][:PAGE]
        if query:
            runs = [r for r in self._runs(query) if r.last_ns >= lo and r.first_ns < hi][:PAGE]
            head = led.head().seq
            # one scan budget for the page, shared by every workspace (each its own:
            # a ledger of many workspaces made one search minutes)
            deadline = time.monotonic() + model.SCAN_BUDGET_S
            for ws in led.workspaces.list():
                left = deadline - time.monotonic()
                if left <= 0:
                    paths_complete = False
                    break
                tree = model.workspace_as_of(led, ws.name, head, budget_s=left)
                paths_complete = paths_complete and tree.complete
                paths.extend((ws.name, p) for p, st in sorted(tree.paths.items())
                             if query in p)
                if len(paths) >= PAGE:
                    break
        return self.render(request, "search.html", led, q=query, steps=steps, runs=runs,
                           state=state, since=since, until=until, states=STATES,
                           asked=bool(query or state or since or until),
                           paths=paths[:PAGE], paths_complete=paths_complete)

    def events(self, request: Request, led: Ledger) -> Response:
        filters = {k: request.query_params.get(k, "") for k in ("kind", "step", "run",
                                                                  "workspace", "since", "until")}
        if any(filters.values()):
            return self._filtered_events(request, led, filters)
        head = led.head().seq
        before = _int(request, "before", head + 1, lo=1)
        lo = max(0, before - 1 - EVENTS_PAGE)
        got = [r for r in led.read(lo, limit=EVENTS_PAGE) if r.seq < before]
        got.reverse()
        older = got[-1].seq if got and got[-1].seq > 1 else None
        newer = min(head + 1, before + EVENTS_PAGE) if before <= head else None
        return self.render(request, "events.html", led, events=got, older=older,
                           newer=newer if newer and newer <= head + 1 and before <= head else None)

    def _filtered_events(self, request: Request, led: Ledger,
                         filters: dict[str, str]) -> Response:
        """The events of one kind, step, run or workspace, newest first, a bounded scan
        back from ?before=."""
        from ledger.events import KINDS

        kind = filters["kind"]
        if kind and kind not in KINDS:
            raise BadRequest(f"?kind= is one of {', '.join(KINDS)}, not {kind!r}")
        if filters["step"] and not _step_id_ok(filters["step"]):
            raise BadRequest("?step= is not a step id")
        before = _int(request, "before", 0, lo=0) or None
        by = {k: v for k, v in (("run", filters["run"]), ("workspace", filters["workspace"]))
              if v}
        if filters["step"]:
            by["step"] = filters["step"]  # (the step index: one step's events, a page)
        lo, hi = _time_range(filters["since"], filters["until"])
        scan = model.scan_backward(led, (kind,) if kind else tuple(KINDS),
                                   lambda r: r if lo <= r.time_ns < hi else None,
                                   before=before, want=EVENTS_PAGE, **by)
        got, older, complete = scan.items, scan.next_after, scan.complete
        return self.render(request, "events.html", led, events=got, older=older, newer=None,
                           filters=filters, complete=complete)

    def step(self, request: Request, led: Ledger) -> Response:
        step_id = _param(request, "id")
        row = led.find_step(step_id) if _step_id_ok(step_id) else None
        if row is None:
            raise NotFound(f"no step {step_id!r} in this ledger")
        after = _int(request, "after", 0)
        events = list(led.read(after, step=step_id, limit=STEP_EVENTS_PAGE + 1))
        more = len(events) > STEP_EVENTS_PAGE
        events = events[:STEP_EVENTS_PAGE]
        planned: dict[int, Any] = {}
        budget = [DIFFS_PER_PAGE]
        deadline = time.monotonic() + PAGE_DIFF_BUDGET_S
        items = [self._event_item(led, r, planned, budget, deadline) for r in events]
        manifest = led.manifest(step_id) if row.manifest_rev >= 0 else None
        if manifest is None and row.manifest_rev >= 0:
            manifest = led.manifest(step_id, row.manifest_rev)
        dead, current = self._dead_epochs(led, row, items)
        return self.render(request, "step.html", led, row=row, items=items, manifest=manifest,
                           attempts=_by_attempt(items),
                           listed=WRITES_PER_EVENT, dead=dead, current=current,
                           more_after=events[-1].seq if more else None, after=after,
                           holder=self.holders.get(led, row.workspace, row.epoch)
                           if row.workspace else None)

    def _dead_epochs(self, led: Ledger, row: Any, items: list[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The attempts on this page that ran under an epoch the workspace has left: the
        protocol refuses anything they still send (a late receipt, a publish, an ack:
        StaleEpoch) — the ledger records no refusal, so the page states the rule."""
        if not row.workspace:
            return [], None
        try:
            ws = led.workspaces.get(row.workspace)
        except LedgerError:
            return [], None
        seen: dict[int, dict[str, Any]] = {}
        # an attempt its own worker ended (acked, refused, undone under its epoch) sends
        # nothing more: only one that could still send something is shown
        ended = {getattr(it["ev"], "attempt", 0) for it in items
                 if it["kind"] in ("acked", "rejected", "compensated")
                 and getattr(it["ev"], "epoch", 0) == _planned_epoch(items, it["ev"])}
        for it in items:
            epoch, attempt = getattr(it["ev"], "epoch", 0), getattr(it["ev"], "attempt", 0)
            if epoch and epoch < ws.epoch and attempt not in seen and attempt not in ended:
                seen[attempt] = {"attempt": attempt, "epoch": epoch, "holder": it["holder"]}
        current = {"epoch": ws.epoch,
                   "holder": self.holders.get(led, row.workspace, ws.epoch) if ws.epoch else None}
        return [seen[a] for a in sorted(seen)], current

    def diff_of(self, led: Ledger, pre: str | None, post: str | None, path: str,
                deadline: float) -> tuple[text.Diff, int | None, int | None]:
        """The diff of two blobs (None: absent) as pages show it, bounded by `deadline`
        (past it: ``deferred``, its own page linked), a complete one kept in a small
        cache by (pre, post, path); and the two sizes."""
        key = (pre, post, path)
        with self._diffs_lock:
            hit = self._diffs.get(key)
            if hit is not None:
                self._diffs.move_to_end(key)
                return hit[0], hit[1], hit[2]
        if time.monotonic() >= deadline:
            return text.Diff("deferred", note="this page's time for diffs was spent"), None, None
        a, b = model.read_content(led, pre), model.read_content(led, post)
        missing = [f"{label} {c.why}" for label, c in (("before:", a), ("after:", b))
                   if c.digest is not None and c.data is None]
        if missing:
            return text.Diff("unavailable", note="; ".join(missing)), a.size, b.size
        d = text.diff(a.data, b.data, path, deadline=deadline)
        if d.complete:
            with self._diffs_lock:
                self._diffs[key] = (d, a.size, b.size)
                while len(self._diffs) > DIFF_CACHE:
                    self._diffs.popitem(last=False)
        return d, a.size, b.size

    def diff_page(self, request: Request, led: Ledger) -> Response:
        """One write's diff on a page of its own (a step page's diff it had no time
        for), with a budget of its own."""
        path = request.query_params.get("path", "")
        pre, post = _digest_or_absent(request, "pre"), _digest_or_absent(request, "post")
        if pre is None and post is None:
            raise BadRequest("?pre= and ?post= cannot both be absent")
        d, pre_size, post_size = self.diff_of(led, pre, post, path or "file",
                                              time.monotonic() + DIFF_PAGE_BUDGET_S)
        return self.render(request, "diff.html", led, path=path, pre=pre, post=post,
                           d={"diff": d, "pre": pre, "post": post, "pre_size": pre_size,
                              "post_size": post_size, "path": path},
                           step=request.query_params.get("step", ""))

    def _event_item(self, led: Ledger, r: Any, planned: dict[int, Any],
                    budget: list[int], deadline: float) -> dict[str, Any]:
        ev = r.event
        item: dict[str, Any] = {"r": r, "ev": ev, "kind": r.kind, "diffs": [], "blobs": [],
                                "more": 0}
        ws = getattr(ev, "workspace", "")
        epoch = getattr(ev, "epoch", 0)
        item["holder"] = self.holders.get(led, ws, epoch) if ws and epoch else None

        def diff_of(path: str, pre: str | None, post: str | None, **extra: Any) -> dict[str, Any]:
            d: dict[str, Any] = {"path": path, "pre": pre, "post": post, **extra}
            if budget[0] <= 0:
                d["diff"] = text.Diff("unavailable", note="not diffed on this page (too many"
                                      " writes): see the path's history")
                return d
            budget[0] -= 1
            d["diff"], d["pre_size"], d["post_size"] = self.diff_of(led, pre, post, path,
                                                                    deadline)
            d["step"] = getattr(ev, "step", "")
            return d

        if r.kind == "planned":
            planned[ev.attempt] = ev
        elif r.kind == "fenced":
            item["diffs"] = [diff_of(w.path, w.pre_hash, w.post_hash, rev=w.rev)
                             for w in ev.writes[:WRITES_PER_EVENT]]
            item["more"] = max(0, len(ev.writes) - WRITES_PER_EVENT)
        elif r.kind == "rejected":
            plan = planned.get(ev.attempt) or self._planned(led, ev.step, ev.attempt)
            writes = plan.writes if plan is not None else ()
            # what the fence found on disk, by path, as its detail recorded it
            found = dict(re.findall(r"(\S+) on disk does not hold[^(]*\(on disk: ([0-9a-f]{64})\)",
                                    ev.detail or ""))
            for path, rev in re.findall(r"(\S+) is at rev (\d+), planned against",
                                        ev.detail or ""):
                # a stale rev: what that rev holds is what the write that made it wrote
                def made(x: Any, path: str = path, rev: int = int(rev)) -> Any:
                    hit = [w for w in x.event.writes if w.path == path and w.rev == rev]
                    return hit[0].post_hash if hit else None

                left = deadline - time.monotonic()  # within the page's time only
                if left <= 0:
                    break
                scan = model.scan_backward(led, ("fenced",), made, before=r.seq, want=1,
                                           budget_s=min(0.2, left), workspace=ev.workspace)
                if scan.items and scan.items[0]:
                    found[path] = scan.items[0]
            item["more"] = max(0, len(writes) - WRITES_PER_EVENT)
            for w in writes[:WRITES_PER_EVENT]:
                now_hash: str | None = None
                why = ""
                checked = budget[0] > 0  # hashing the file on disk costs like a diff
                if checked and time.monotonic() >= deadline:
                    why = "not hashed: this page's time was spent"
                elif checked:
                    # read at most DISK_HASH_MAX bytes: a file the agent grew (a sparse
                    # 2 GB file costs no disk) is not hashed on every load of the page
                    try:
                        now_hash = led.workspaces.read_file(
                            ev.workspace, w.path, max_bytes=DISK_HASH_MAX).pre_hash
                    except InvalidInput as exc:
                        why = (f"not hashed: larger than {DISK_HASH_MAX:,} bytes"
                               if "more than max_bytes" in str(exc)
                               else f"{type(exc).__name__}: {exc}")
                    except (LedgerError, OSError) as exc:
                        why = f"{type(exc).__name__}: {exc}"
                d = diff_of(w.path, w.pre_hash, w.post_hash, base_rev=w.base_rev,
                            disk_now=now_hash, disk_why=why, disk_checked=checked,
                            refused=True, found=found.get(w.path), change=None)
                if d["found"] and budget[0] > 0 and d["found"] != w.pre_hash:
                    # the change the step ran into, when the ledger holds its bytes
                    change, _, _ = self.diff_of(led, w.pre_hash, d["found"], w.path, deadline)
                    d["change"] = ({"diff": change, "pre": w.pre_hash, "post": d["found"],
                                    "path": w.path, "step": ev.step, "pre_size": None,
                                    "post_size": None}
                                   if change.kind in ("text", "binary", "deferred") else None)
                item["diffs"].append(d)
        elif r.kind in ("blob-stored",):
            item["blobs"] = [{"path": ev.path or "", "digest": ev.digest, "size": ev.size}]
        elif r.kind == "manifest-published":
            item["blobs"] = [{"path": e.path, "digest": e.digest, "size": e.size}
                             for e in ev.artifacts[:WRITES_PER_EVENT]]
            item["more"] = max(0, len(ev.artifacts) - WRITES_PER_EVENT)
        return item

    @staticmethod
    def _planned(led: Ledger, step: str, attempt: int) -> Any:
        return led.attempt(step, attempt, kind="planned").planned

    def run(self, request: Request, led: Ledger) -> Response:
        run_id = _param(request, "id")
        after = _int(request, "after", 0)

        try:
            scan = model.read_page(led, "planned", after=after, want=PAGE, run=run_id)
        except InvalidInput:  # not a name a run can have
            raise NotFound(f"no step of run {run_id!r} in this ledger") from None
        if not scan.items and after == 0 and scan.complete:
            raise NotFound(f"no step of run {run_id!r} in this ledger")
        return self.render(request, "timeline.html", led, what="run", name=run_id,
                           rows=self._attempt_rows(led, scan.items), scan=scan, after=after,
                           ws=None, paths=None, paths_more=None)

    def workspace(self, request: Request, led: Ledger) -> Response:
        name = _param(request, "name")
        if not _step_id_ok(name):
            raise NotFound(f"no workspace {name!r} in this ledger")
        row = led.workspaces.get(name)  # UnknownWorkspace: 404
        after = _int(request, "after", 0)
        paths_after = request.query_params.get("paths_after", "")
        every = led.workspaces.paths(name)
        names = [p for p in every if p > paths_after][:TREE_PAGE]
        paths = [(p, every[p]) for p in names]
        paths_more = names[-1] if len(names) == TREE_PAGE and names[-1] != max(every) else None

        def match(r: Any) -> Any:
            return r if r.event.workspace == name else None

        scan = model.scan_forward(led, ("planned",), match, after=after, want=PAGE,
                                  workspace=name)
        now = led.clock()
        return self.render(request, "timeline.html", led, what="workspace", name=name,
                           rows=self._attempt_rows(led, scan.items), scan=scan, after=after,
                           ws=row, live=row.live_epoch(now) is not None, paths=paths,
                           paths_more=paths_more, paths_total=len(every))

    def _attempt_rows(self, led: Ledger, planned: list[Any]) -> list[dict[str, Any]]:
        out = []
        for r in planned:
            ev = r.event
            row = led.find_step(ev.step)
            out.append({"r": r, "ev": ev, "row": row,
                        "holder": self.holders.get(led, ev.workspace, ev.epoch)
                        if ev.workspace and ev.epoch else None})
        return out

    def history(self, request: Request, led: Ledger) -> Response:
        ws, path = _param(request, "ws"), _param(request, "path")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        before = _int(request, "before", 0, lo=0) or None

        def match(r: Any) -> Any:
            ev = r.event
            if ev.workspace != ws:
                return None
            if r.kind == "fenced":
                hit = [w for w in ev.writes if w.path == path]
                return (r, hit[0]) if hit else None
            if r.kind == "compensated":
                hit = [x for x in ev.restored if x.path == path]
                return (r, hit[0]) if hit else None
            if r.kind == "rejected":
                plan = self._planned(led, ev.step, ev.attempt)
                hit = [w for w in (plan.writes if plan else ()) if w.path == path]
                return (r, hit[0]) if hit else None
            return None

        scan = model.scan_backward(led, ("fenced", "compensated", "rejected"), match,
                                   before=before, want=PAGE // 2, workspace=ws)
        entries = []
        budget = [DIFFS_PER_PAGE]
        deadline = time.monotonic() + PAGE_DIFF_BUDGET_S
        for r, w in scan.items:
            entry: dict[str, Any] = {"r": r, "ev": r.event, "w": w, "kind": r.kind,
                                     "diff": None}
            if budget[0] > 0 and r.kind != "compensated":
                budget[0] -= 1
                entry["diff"], _, _ = self.diff_of(led, w.pre_hash, w.post_hash, path,
                                                   deadline)
            entries.append(entry)
        return self.render(request, "history.html", led, ws=ws, path=path, entries=entries,
                           scan=scan, before=before)

    def tree(self, request: Request, led: Ledger) -> Response:
        ws = _param(request, "ws")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        head = led.head().seq
        step_id = request.query_params.get("step")
        if step_id:
            row = led.find_step(step_id) if _step_id_ok(step_id) else None
            if row is None:
                raise NotFound(f"no step {step_id!r} in this ledger")
            seq = row.last_seq
        else:
            seq = _int(request, "seq", head, lo=0)
        after = request.query_params.get("after", "")
        since = _int(request, "since", 0, lo=0)
        if since and since >= seq:
            raise BadRequest(f"?since= must be before the seq shown (#{seq})")
        tree = model.workspace_as_of(led, ws, seq, after=since)
        every = tree.paths
        names = sorted(p for p, s in every.items() if s[1] is not None and p > after)
        shown = names[:TREE_PAGE]
        # paths deleted (or undone to absent) by the writes read: only a continuation,
        # whose earlier page may have shown them, needs to say so
        gone = sorted(p for p, s in every.items() if s[1] is None) if since else []
        return self.render(request, "tree.html", led, ws=ws, seq=seq, step_id=step_id,
                           files=[(p, every[p]) for p in shown], tree=tree, since=since,
                           gone=gone[:TREE_PAGE], gone_total=len(gone),
                           total=sum(1 for s in every.values() if s[1] is not None),
                           more=shown[-1] if len(names) > TREE_PAGE else None)

    def file(self, request: Request, led: Ledger) -> Response:
        digest = _digest(request)
        name = request.query_params.get("name", "") or digest[:12]
        content = model.read_content(led, digest, limit=text.TEXT_MAX)
        if content.data is None and content.why.startswith("not in the ledger"):
            raise NotFound(f"blob {digest} is {content.why}")
        binary = content.data is not None and text.is_binary(content.data)
        start = _int(request, "line", 1, lo=1)
        lines: list[str] = []
        total = 0
        next_line = None
        if content.data is not None and not binary:
            # one page: FILE_PAGE_LINES lines or FILE_PAGE_CHARS characters from `start`
            # (a 2 MB file of a million lines was 32 MB of HTML), each line cut long
            every = content.data.split(b"\n")
            if every and every[-1] == b"":
                every.pop()
            total = len(every)
            if start > max(total, 1):
                raise BadRequest(f"?line= is past the file's end (it has {total:,} lines)")
            chars = 0
            for raw in every[start - 1:start - 1 + FILE_PAGE_LINES]:
                line = diffs.cut_line(text.visible(text.decode(raw)))
                chars += len(line) + 1
                lines.append(line)
                if chars >= FILE_PAGE_CHARS:
                    break
            if start - 1 + len(lines) < total:
                next_line = start + len(lines)
        return self.render(request, "file.html", led, digest=digest, name=name,
                           content=content, binary=binary, lines=lines, first=start,
                           total=total, next_line=next_line,
                           prev_line=max(1, start - FILE_PAGE_LINES) if start > 1 else None,
                           ws=request.query_params.get("ws"),
                           seq=request.query_params.get("seq"))

    def stats(self, request: Request, led: Ledger) -> Response:
        return self.render(request, "stats.html", led, charts=self._charts(small=False))

    def _charts(self, *, small: bool) -> dict[str, Any] | None:
        job = self.jobs.stats
        if job.result is None:
            return None
        rep = job.result["report"]
        states = list(rep.by_state.items())
        out: dict[str, Any] = {"report": rep, "gc": job.result["gc"]}
        out["bytes_by_state"] = text.hbars(
            "bytes stored by state", [(k, rep.bytes_by_state.get(k, 0)) for k, _ in states],
            [f"{text.size(rep.bytes_by_state.get(k, 0))} · {n} steps" for k, n in states])
        growth, unit = _growth(rep)
        label = (lambda t: text.iso(t)[:10]) if unit == "day" else (
            lambda t: text.iso(t)[5:13].replace("T", " ") + "h")
        out["growth_events"] = text.vbars(
            f"events per {unit}", [(label(t), n) for t, n, _ in growth],
            [f"{n:,} events" for _, n, _ in growth], height=120 if small else 180)
        if not small:
            out["growth_bytes"] = text.vbars(
                f"bytes per {unit}", [(label(t), b) for t, _, b in growth],
                [text.size(b) for _, _, b in growth])
            kinds = list(rep.by_kind.items())
            out["kinds"] = text.hbars("events by kind", [(k, c.count) for k, c in kinds],
                                      [f"{c.count:,} ({text.size(c.bytes)})" for _, c in kinds])
            blobs = list(rep.blobs.items())
            out["blobs"] = text.hbars("blob bytes (as audit buckets them)",
                                      [(k, c.bytes) for k, c in blobs],
                                      [f"{text.size(c.bytes)} · {c.count}" for _, c in blobs])
        return out

    # not pages

    def download(self, request: Request) -> Response:
        try:
            digest = _digest(request)
        except BadRequest as exc:
            return _error_page(400, str(exc))
        name = request.query_params.get("name", "") or digest
        with self.pool.ledger() as led:
            head = model.read_content(led, digest, limit=0)
        if head.why.startswith("not in the ledger") or head.why.startswith("CORRUPT"):
            return _error_page(404, f"blob {digest}: {head.why}")
        pool = self.pool

        def chunks() -> Any:
            with pool.ledger() as led:
                yield from led.blob_chunks(digest)

        # a name's control and format characters (U+202E turns "txt.exe" around) do
        # not reach the saved file's name, in either form of the header
        base = "".join("_" if text.is_invisible(c) else c
                       for c in name.rsplit("/", 1)[-1]) or "blob"
        ascii_name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_"
                             for c in base)[:120] or "blob"
        return StreamingResponse(chunks(), media_type="application/octet-stream", headers={
            "content-disposition": f"attachment; filename=\"{ascii_name}\";"
                                   f" filename*=UTF-8''{quote(base, safe='')}",
            "x-content-type-options": "nosniff",
            "content-security-policy": "default-src 'none'; sandbox",
        })

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


def _growth(rep: Any) -> tuple[list[tuple[int, int, int]], str]:
    """The stats' growth as (start, events, bytes) bars: by hour when the ledger spans two
    days or less (a night's work: one daily bar says nothing), else added up by day."""
    hours = [(g.start_ns, g.events, g.bytes) for g in rep.growth]
    if rep.bucket != "hour" or not hours or hours[-1][0] - hours[0][0] <= 48 * 3600 * 10**9:
        return hours, rep.bucket if rep.bucket != "hour" or not hours else "hour"
    days: dict[int, list[int]] = {}
    for start, n, b in hours:
        day = start - start % (86400 * 10**9)
        got = days.setdefault(day, [0, 0])
        got[0] += n
        got[1] += b
    return [(d, n, b) for d, (n, b) in sorted(days.items())], "day"


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


def _planned_epoch(items: list[dict[str, Any]], ev: Any) -> int:
    """The epoch attempt `ev.attempt` was planned under (as on this page), else its own."""
    for it in items:
        if it["kind"] == "planned" and it["ev"].attempt == getattr(ev, "attempt", -1):
            return int(it["ev"].epoch)
    return int(getattr(ev, "epoch", 0))


#: How an attempt ended, by its last event's kind.
_OUTCOMES: Final = {"acked": "committed and acknowledged",
                    "manifest-published": "committed, not acknowledged yet",
                    "rejected": "refused: nothing of it stayed",
                    "compensated": "undone", "compensating": "being undone",
                    "planned": "planned, not applied", "fenced": "applied, not committed",
                    "blob-stored": "storing artifacts, not committed",
                    "blob-pinned": "in flight"}


def _by_attempt(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's events grouped by attempt, each with its epoch, start, end, duration
    and outcome in words; `blob-pinned` rows counted, not listed."""
    out: list[dict[str, Any]] = []
    for it in items:
        attempt = getattr(it["ev"], "attempt", 0)
        if not out or out[-1]["attempt"] != attempt:
            out.append({"attempt": attempt, "events": [], "pinned": 0,
                        "epoch": getattr(it["ev"], "epoch", 0), "holder": it["holder"],
                        "first_ns": it["r"].time_ns, "last_ns": it["r"].time_ns, "last": ""})
        group = out[-1]
        group["last_ns"], group["last"] = it["r"].time_ns, it["kind"]
        if it["kind"] == "blob-pinned":
            group["pinned"] += 1
        else:
            group["events"].append(it)
    for group in out:
        ev = group["events"][-1]["ev"] if group["events"] else None
        settled = (group["last"] == "compensated" and ev is not None
                   and getattr(ev, "epoch", 0) > group["epoch"] > 0)
        group["outcome"] = (f"settled by epoch {ev.epoch}: its worker lost the lease, its"
                            " writes were undone" if settled
                            else _OUTCOMES.get(group["last"], group["last"]))
    return out


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

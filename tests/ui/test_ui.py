"""`steptrail ui` (ledger/ui/, docs/ui.md): the token, the Host check, 404s, read-only
serving beside a writer, hostile names and contents shown escaped, downloads that never
render, pagination. Driven in process by Starlette's TestClient; the real browser is
tests/ui/test_ui_browser.py's."""

from __future__ import annotations

import hashlib
import html.parser
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the [ui] extra: pip install 'steptrail[ui]'")
pytest.importorskip("jinja2", reason="the [ui] extra: pip install 'steptrail[ui]'")

from starlette.testclient import TestClient  # noqa: E402

import ui_corpus  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger.ui import check_host, create_app  # noqa: E402
from ledger.ui.app import CSP, cookie_name, url  # noqa: E402

TOKEN = "s3cret-token"
PORT = 8123
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ui_corpus.build(tmp_path_factory.mktemp("ui"))


def _client(path: Path, *, verify: bool = False, base: str = BASE) -> TestClient:
    """A client of a fresh app whose relative URLs are under the app's secret prefix
    (``c.app.prefix``); an absolute URL (``f"{BASE}/..."``) reaches outside it."""
    app = create_app(str(path), token=TOKEN, port=PORT, verify=verify)
    return TestClient(app, base_url=f"{base}{app.prefix}/", follow_redirects=False)


@pytest.fixture(scope="module")
def client(corpus: Path) -> Any:
    with _client(corpus, verify=True) as c:
        r = c.get(f"/?token={TOKEN}")
        assert r.status_code == 303
        _wait_jobs(c)
        yield c


def _wait_jobs(c: TestClient) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        doc = c.get("/api/head").json()
        if doc["verify"]["state"] != "running" and doc["stats"]["state"] != "running":
            return
        time.sleep(0.05)
    raise AssertionError("the background jobs did not finish")


class _Page(html.parser.HTMLParser):
    """Every element and attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _parse(text: str) -> _Page:
    p = _Page()
    p.feed(text)
    return p


def _links(c: TestClient, text: str) -> list[str]:
    """A page's links, each checked to be under the served prefix, without it (as the
    client, whose base URL carries the prefix, asks for them)."""
    prefix = c.app.prefix  # type: ignore[attr-defined]
    out = []
    for h in _parse(text).links:
        assert h.startswith(prefix + "/"), f"a link outside the prefix: {h!r}"
        out.append(h[len(prefix):])
    return out


def _assert_inert(text: str, where: str, prefix: str) -> None:
    """Nothing in the page runs script: one <script>, ours, by src; no event handler
    attribute; no element the corpus planted; none of its raw markup."""
    page = _parse(text)
    scripts = [a for t, a in page.tags if t == "script"]
    assert all(a.get("src") == f"{prefix}/static/ui.js" for a in scripts), (where, scripts)
    handlers = [(t, k) for t, a in page.tags for k in a if k.lower().startswith("on")]
    assert not handlers, (where, handlers)
    assert not [t for t, _ in page.tags if t in ("img", "iframe", "object", "embed")], where
    # forms: ours only (search and filters): GET, to a page under the prefix
    forms = [a for t, a in page.tags if t == "form"]
    assert all(a.get("method") == "get" and (a.get("action") or "").startswith(prefix + "/")
               for a in forms), (where, forms)
    assert [t for t, _ in page.tags if t == "svg"] == [] or all(
        "onload" not in a for t, a in page.tags if t == "svg"), where
    for raw in ui_corpus.RAW:
        assert raw not in text, (where, raw)
    assert not any(h.lower().startswith(("javascript:", "data:")) for h in page.links), where


def _crawl(c: TestClient, start: str = "/", limit: int = 400) -> dict[str, Any]:
    """Every page reachable from `start` (our links only), once."""
    seen: dict[str, Any] = {}
    todo = [start]
    while todo and len(seen) < limit:
        link = todo.pop()
        if link in seen or link.startswith("/download"):
            continue
        r = c.get(link)
        seen[link] = r
        if r.headers.get("content-type", "").startswith("text/html"):
            todo.extend(h for h in _links(c, r.text) if h not in seen)
    return seen


# -- the token and the Host check -----------------------------------------------------------


def test_without_the_token_every_page_is_forbidden(corpus: Path) -> None:
    with _client(corpus) as c:
        prefix = c.app.prefix  # type: ignore[attr-defined]
        for path in ("/", "/step?id=plain-1", "/api/head", "/static/ui.js", "/download?digest="
                     + "0" * 64, "/nope"):
            for where in (path, f"{BASE}{path}"):  # under the prefix, and outside it
                r = c.get(where)
                assert r.status_code == 403, where
                assert "plain-1" not in r.text and prefix not in r.text
        assert c.get("/?token=wrong").status_code == 403
        assert c.get(f"/?token={TOKEN}x").status_code == 403
        assert c.get(f"/?token={TOKEN}&token={TOKEN}").status_code == 403
        c.cookies.set(cookie_name(PORT), "wrong")
        assert c.get("/").status_code == 403
        c.cookies.clear()
        c.cookies.set(cookie_name(PORT), TOKEN)  # the cookie is a session, not the token
        assert c.get("/").status_code == 403


def test_the_prefix_is_secret_fresh_and_not_the_token(corpus: Path) -> None:
    with _client(corpus) as a, _client(corpus) as b:
        pa, pb = a.app.prefix, b.app.prefix  # type: ignore[attr-defined]
        assert pa != pb and re.fullmatch(r"/s-[\w-]{20,}", pa), (pa, pb)
        assert TOKEN not in pa
        assert a.get(f"/?token={TOKEN}").status_code == 303
        session = a.cookies.get(cookie_name(PORT))
        assert session and TOKEN not in session
        # the session of one start is no good at another's prefix
        b.cookies.set(cookie_name(PORT), session, path=pb)
        assert b.get("/").status_code == 403
        # nor anywhere outside its own prefix, even sent along
        r = a.get(f"{BASE}/", headers={"cookie": f"{cookie_name(PORT)}={session}"})
        assert r.status_code == 403
        assert a.get(f"{BASE}{pa}").status_code == 303  # the bare prefix: its '/'
        assert a.get(f"{BASE}{pa}").headers["location"] == f"{pa}/"
        assert a.get(f"{BASE}{pa}x/").status_code == 403  # not a path under it


def test_the_token_sets_a_strict_cookie_and_then_links_work(corpus: Path) -> None:
    with _client(corpus) as c:
        prefix = c.app.prefix  # type: ignore[attr-defined]
        r = c.get(f"/step?id=plain-1&token={TOKEN}")
        assert r.status_code == 303 and r.headers["location"] == f"{prefix}/step?id=plain-1"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{cookie_name(PORT)}=") and TOKEN not in cookie
        assert f"; Path={prefix};" in cookie
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        r = c.get("/step?id=plain-1")
        assert r.status_code == 200 and "plain-1" in r.text
        # the URL printed (no prefix) leads under the prefix; outside it, nothing
        r = c.get(f"{BASE}/?token={TOKEN}")
        assert r.status_code == 303 and r.headers["location"] == f"{prefix}/"
        r = c.get(f"{BASE}/events?token={TOKEN}&before=5")
        assert r.headers["location"] == f"{prefix}/events?before=5"
        assert c.get(f"{BASE}/step?id=plain-1").status_code == 403
        assert c.get(f"{BASE}/api/head").status_code == 403


def test_a_cross_site_navigation_with_the_token_moves_on_from_a_page_of_ours(
        corpus: Path) -> None:
    """The launcher page (file://) is another site: a redirect chain it starts stays
    cross-site, and the SameSite=Strict cookie would not go with the redirected request.
    A page of ours that moves on (meta refresh) makes the next request same-origin."""
    with _client(corpus) as c:
        prefix = c.app.prefix  # type: ignore[attr-defined]
        r = c.get(f"{BASE}/step?id=plain-1&token={TOKEN}",
                  headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "SameSite=Strict" in r.headers["set-cookie"]
        assert f'content="0;url={prefix}/step?id=plain-1"' in r.text
        assert "<script" not in r.text and TOKEN not in r.text
        assert r.headers["content-security-policy"] == CSP
        assert c.get("/step?id=plain-1").status_code == 200
        # without the token, a cross-site navigation gets nothing
        c.cookies.clear()
        r = c.get("/", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})
        assert r.status_code == 403


def test_a_host_other_than_loopback_is_refused(corpus: Path) -> None:
    for base in ("http://evil.example:8123", "http://127.0.0.1:9999", "http://127.0.0.2:8123",
                 "http://testserver"):
        with _client(corpus, base=base) as c:
            assert c.get(f"/?token={TOKEN}").status_code == 403, base
    with _client(corpus, base=f"http://localhost:{PORT}") as c:
        assert c.get(f"/?token={TOKEN}").status_code == 303


def test_only_loopback_is_bound() -> None:
    from ledger.errors import InvalidInput

    assert check_host("127.0.0.1") == "127.0.0.1"
    for host in ("0.0.0.0", "::", "192.168.1.2", "localhost", "example.com"):
        with pytest.raises(InvalidInput):
            check_host(host)


def test_only_reads_are_answered(client: TestClient) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert client.request(method, "/").status_code == 405


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    for path in ("/", "/step?id=plain-1", "/step?id=nope", "/api/head", "/static/ui.js"):
        r = client.get(path)
        assert r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert "script-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    assert "unsafe-inline" not in CSP


# -- pages --------------------------------------------------------------------------------


def test_unknown_things_are_404(client: TestClient) -> None:
    for path in ("/step?id=nope", "/step?id=a%07b", "/workspace?name=nope", "/run?id=nope",
                 "/history?ws=nope&path=a", "/tree?ws=nope", "/tree?ws=w&step=nope",
                 "/file?digest=" + "a" * 64, "/nope"):
        assert client.get(path).status_code == 404, path
    for path in ("/step", "/step?id=plain-1&after=x", "/file?digest=zz", "/events?before=-1"):
        assert client.get(path).status_code == 400, path


def test_every_page_answers_and_runs_no_planted_script(client: TestClient) -> None:
    pages = _crawl(client)
    assert len(pages) > 40
    for link, r in pages.items():
        assert r.status_code == 200, (link, r.status_code, r.text[:200])
        if r.headers["content-type"].startswith("text/html"):
            _assert_inert(r.text, link, client.app.prefix)  # type: ignore[attr-defined]
    shown = "\n".join(r.text for r in pages.values())
    # escaped, and visible: the markup as text, control characters as escapes
    assert "&lt;script&gt;document.title" in shown
    assert "\\x07" in shown and "\\x1b" in shown and "\\u202e" in shown
    assert "\\xff\\xfe" in shown  # bytes that are not UTF-8, shown as escapes
    step_page = client.get(url("/step", id=ui_corpus.STEP)).text
    assert "&lt;script&gt;" in step_page and "binary file" in step_page
    assert "class=\"add\"" in step_page  # the text write's diff


def test_the_refused_write_and_the_undo_are_shown(client: TestClient) -> None:
    page = client.get("/step?id=refused-1").text
    assert "refused: pre_hash" in page and "on disk now" in page and "differs" in page
    page = client.get("/step?id=undone-1").text
    assert "compensated" in page and "restored" in page and "\\x07" in page


def test_downloads_never_render(client: TestClient) -> None:
    page = client.get("/step?id=art-1").text
    links = sorted({h for h in _links(client, page) if h.startswith("/download")})
    assert len(links) == 2  # the manifest's and the blob-stored events' links: 2 blobs
    for link in links:
        r = client.get(link)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-disposition"].startswith("attachment;")
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in r.headers["content-security-policy"]
    html_link = next(h for h in links if "evil.html" in h)
    r = client.get(html_link)
    assert r.content == ui_corpus.HTML_ARTIFACT
    assert 'filename="evil.html"' in r.headers["content-disposition"]
    other = client.get(next(h for h in links if "evil.html" not in h))
    plain = other.headers["content-disposition"].split('filename="')[1].split('"')[0]
    assert set(plain) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert other.content == ui_corpus.CONTENT
    assert client.get("/download?digest=" + "b" * 64).status_code == 404


def test_pages_paginate(client: TestClient) -> None:
    first = client.get("/events").text
    older = [h for h in _links(client, first) if h.startswith("/events?before=")]
    assert older, "the events page links to older events"
    assert first.count('<tr><td>#') == 100
    second = client.get(older[-1]).text
    assert second.count('<tr><td>#') > 0 and second != first
    run = client.get("/run?id=bulk").text
    assert run.count("/step?id=bulk-") == 50
    later = [h for h in _links(client, run) if h.startswith("/run?") and "after=" in h]
    assert later
    rest = client.get(later[0]).text
    assert "bulk-050" in rest and "bulk-000" not in rest


def test_the_live_endpoint_and_the_fragment(client: TestClient) -> None:
    doc = client.get("/api/head").json()
    assert doc["seq"] > 100 and doc["verify"]["state"] == "done" and doc["verify"]["ok"]
    r = client.get("/", headers={"X-Steptrail-Fragment": "1"})
    assert r.status_code == 200 and "<html" not in r.text and "Ledger at a glance" in r.text
    assert r.headers["x-steptrail-head"] == str(doc["seq"])


def test_the_stats_are_svg_drawn_on_the_server(client: TestClient) -> None:
    page = client.get("/stats").text
    assert page.count("<svg") >= 4 and "bytes stored by state" in page


def test_the_workspace_as_of_a_step(client: TestClient) -> None:
    before = client.get("/tree?ws=w&step=plain-1").text
    assert "plain.txt" in before and "&lt;svg onload" not in before
    after = client.get(url("/tree", ws="w", step=ui_corpus.STEP)).text
    assert "&lt;svg onload=alert(1)&gt;.py" in after
    history = client.get("/history?ws=w&path=plain.txt").text
    assert history.count("class=\"hist") >= 3  # plain-1, the hostile step, the undo


# -- read-only ---------------------------------------------------------------------------------


def _digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_browsing_every_page_leaves_the_ledger_file_unchanged(tmp_path: Path) -> None:
    path = ui_corpus.build(tmp_path)
    with Ledger.open(str(path)):
        pass  # checkpointed and closed: no -wal
    before = _digest_of(path)
    with _client(path, verify=True) as c:
        c.get(f"/?token={TOKEN}")
        _wait_jobs(c)
        pages = _crawl(c)
        for r in pages.values():
            assert r.status_code == 200
    assert _digest_of(path) == before
    wal = Path(str(path) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0


WRITER = """
import sys, time
from ledger import Ledger, Planned
with Ledger.open(sys.argv[1]) as led:
    print("ready", flush=True)
    n = 0
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        led.append(Planned(step=f"live-{n}", attempt=1, run="live"))
        n += 1
    print(n, flush=True)
"""


def test_a_writer_keeps_committing_while_pages_are_served(tmp_path: Path) -> None:
    import sqlite3

    path = ui_corpus.build(tmp_path)
    with _client(path, verify=True) as c:
        c.get(f"/?token={TOKEN}")
        start = c.get("/api/head").json()["seq"]
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "2.0"],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        served = 0
        stop = threading.Event()

        def browse() -> None:
            nonlocal served
            while not stop.is_set():
                for link in ("/", "/events", "/step?id=plain-1", "/run?id=live", "/stats"):
                    assert c.get(link).status_code in (200, 404)
                    served += 1

        t = threading.Thread(target=browse)
        t.start()
        # the write lock is free whenever the writer does not hold it: never the UI's
        raw = sqlite3.connect(str(path), timeout=5)
        try:
            for _ in range(20):
                raw.execute("BEGIN IMMEDIATE")
                raw.execute("COMMIT")
        finally:
            raw.close()
        committed = int(writer.communicate(timeout=30)[0].strip())
        stop.set()
        t.join()
        assert writer.returncode == 0 and committed > 20 and served > 5
        head = c.get("/api/head").json()["seq"]
        assert head >= start + committed  # and the UI sees them
        assert "live-" in c.get("/events").text


def test_a_ledger_that_fails_verify_still_opens_with_a_banner(tmp_path: Path) -> None:
    import sqlite3

    path = ui_corpus.build(tmp_path)
    with Ledger.open(str(path)) as led:
        digest = led.manifest("art-1").artifacts[0].digest  # type: ignore[union-attr]
    raw = sqlite3.connect(str(path))
    with raw:
        raw.execute("DELETE FROM blob_data WHERE digest = ?", (digest,))  # a lost blob
    raw.close()
    with _client(path, verify=True) as c:
        c.get(f"/?token={TOKEN}")
        _wait_jobs(c)
        page = c.get("/").text
        assert "verify FAILED" in page and "3 finding(s)" in page and digest[:12] in page
        assert c.get("/step?id=art-1").status_code == 200
        assert c.get("/api/head").json()["verify"]["ok"] is False


def test_the_command_serves_on_loopback_and_prints_the_url(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    path = ui_corpus.build(tmp_path)
    exe = Path(sys.executable).parent / "steptrail"
    proc = subprocess.Popen([str(exe), "--ledger", str(path), "ui", "--port", "0",
                             "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", "".join(lines))
        assert found, lines
        port = int(found.group(1))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
        assert refused.value.code == 403
        refused.value.close()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(found.group(0), timeout=10) as r:
            assert r.status == 200 and b"Ledger at a glance" in r.read()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


# -- bounded work -------------------------------------------------------------------------------


_TREE_ROW = re.compile(r'history\?ws=w&amp;path=([^"]+)"><code>.*?</code></a></td><td>\d+</td>\s*'
                       r'<td><a href="[^"]*file\?digest=([0-9a-f]{64})', re.DOTALL)
_GONE = re.compile(r"deleted after #\d+: (.*?)</p>", re.DOTALL)


def test_the_workspace_as_of_a_seq_stops_on_its_budget_and_goes_on(
        client: TestClient, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.ui import model

    with Ledger.open(str(corpus), readonly=True) as led:
        last = led.find_step("refused-1").last_seq  # type: ignore[union-attr]
    full = client.get(f"/tree?ws=w&seq={last}").text
    assert 'id="tree-stopped"' not in full
    want = dict(_TREE_ROW.findall(full))
    assert len(want) >= 3, want
    monkeypatch.setattr(model, "SCAN_BUDGET_S", 0.0)  # then one event of the workspace a page
    page = client.get(f"/tree?ws=w&seq={last}")
    assert page.status_code == 200
    assert 'id="tree-stopped"' in page.text and "Stopped to answer quickly" in page.text
    got = dict(_TREE_ROW.findall(page.text))
    assert got != want
    link: str | None = page.text
    pages = 1
    while link is not None:
        on = [h for h in _links(client, link) if h.startswith("/tree?") and "since=" in h
              and "after=" not in h]
        if not on:
            break
        assert len(on) == 1, on
        nxt = client.get(on[0])
        assert nxt.status_code == 200 and "Continued: the paths written after #" in nxt.text
        got.update(_TREE_ROW.findall(nxt.text))
        for listed in _GONE.findall(nxt.text):
            for gone in re.findall(r"path=([^\"]+)\"", listed):
                got.pop(gone, None)
        link = nxt.text
        pages += 1
        assert pages < 40
    assert pages >= 4  # plain-1, the hostile step, undone-1 and its undo, refused-1
    assert got == want  # the pages together: the workspace as of the head
    assert client.get("/tree?ws=w&seq=10&since=10").status_code == 400


def test_a_refused_plan_beyond_the_page_says_what_it_left_out(tmp_path: Path) -> None:
    from ledger import run_fenced_step
    from ledger.ui.web import DIFFS_PER_PAGE, WRITES_PER_EVENT

    n = WRITES_PER_EVENT + 7
    repo = tmp_path / "w"
    repo.mkdir()
    for i in range(n):
        (repo / f"f{i:03d}.txt").write_text(f"{i}\n")
    path = tmp_path / "l.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(repo))
        epoch = led.workspaces.acquire("w", holder="h", ttl_s=3600).epoch

        def clash(r: Any) -> Any:
            got = [r.read(f"f{i:03d}.txt") for i in range(n)]
            (repo / "f000.txt").write_text("a person's edit\n")
            return [g.write(b"new\n") for g in got]

        assert run_fenced_step(led, "w", "big", clash, epoch=epoch).status.value == "conflict"
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/step?id=big").text
    assert page.count('<div class="write">') == WRITES_PER_EVENT
    assert page.count("not checked on this page") == WRITES_PER_EVENT - DIFFS_PER_PAGE
    assert "… 7 more planned write(s) not listed on this page" in page
    assert "f000.txt" in page and f"f{n - 1:03d}.txt" not in page.split("<h2>Events")[1]


def test_the_browser_is_opened_on_a_private_page_removed_on_exit(
        corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import stat
    import urllib.parse
    import webbrowser

    import uvicorn

    from ledger import ui

    seen: list[tuple[str, int, int, str]] = []

    def fake_open(u: str, *a: Any, **k: Any) -> bool:
        file = urllib.parse.urlparse(u)
        assert file.scheme == "file", u
        folder = os.path.dirname(file.path)
        seen.append((u, stat.S_IMODE(os.stat(folder).st_mode),
                     stat.S_IMODE(os.stat(file.path).st_mode), Path(file.path).read_text()))
        return True

    monkeypatch.setattr(webbrowser, "open", fake_open)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: time.sleep(1.0))
    printed: list[str] = []
    ui.serve(str(corpus), port=0, open_browser=True, token=TOKEN, echo=printed.append)
    assert seen, "the browser was not opened"
    u, folder_mode, file_mode, text = seen[0]
    assert TOKEN not in u and folder_mode == 0o700 and file_mode == 0o600
    printed_url = next(line.strip() for line in printed if "?token=" in line)
    assert f'content="0;url={printed_url}"' in text and f'href="{printed_url}"' in text
    assert not os.path.exists(urllib.parse.urlparse(u).path)  # removed on exit
    assert not os.path.exists(os.path.dirname(urllib.parse.urlparse(u).path))


def test_the_background_jobs_run_when_the_server_is_embedded_from_stdin(corpus: Path,
                                                                         tmp_path: Path) -> None:
    """Verify and the stats run in a fresh interpreter (not multiprocessing's spawn, which
    re-imports the parent's __main__ and failed for a server started from stdin or a
    notebook): embedded from `python -`, the overview still gets verify's answer."""
    script = f"""
import time
from starlette.testclient import TestClient
from ledger.ui import create_app
app = create_app({str(corpus)!r}, token="t", port=8124)
with TestClient(app, base_url="http://127.0.0.1:8124" + app.prefix + "/") as c:
    c.get("/?token=t")
    for _ in range(300):
        doc = c.get("/api/head").json()
        if doc["verify"]["state"] != "running" and doc["stats"]["state"] != "running":
            break
        time.sleep(0.1)
    print(doc["verify"]["state"], doc["stats"]["state"])
"""
    done = subprocess.run([sys.executable, "-"], input=script, cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["done", "done"], (done.stdout, done.stderr[-2000:])


def test_a_port_whose_server_just_stopped_serves_again_at_once() -> None:
    """Its connections left in TIME_WAIT: `steptrail ui` on the same port right after
    stopping it said "address already in use" for a minute. A port another process
    listens on is still refused."""
    import socket

    from ledger.errors import EnvironmentFailure
    from ledger.ui import bind

    listener = bind(0)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server closes first: its side waits in TIME_WAIT
    client.close()
    listener.close()
    again = bind(port)
    try:
        with pytest.raises(EnvironmentFailure, match="--port"):
            bind(port)  # one is listening there now
    finally:
        again.close()


def test_the_live_answers_are_signed_with_a_key_only_page_bodies_carry(corpus: Path) -> None:
    """The poll and the fragment answer a nonce with HMAC-SHA256(key, nonce, "\\n",
    body); the key is in a full page's body only — never in a fragment, a poll answer
    or a header — so a process that sees the tab's requests cannot forge an answer."""
    import hmac as hmac_mod

    with _client(corpus) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/").text
        key = re.search(r'data-live-key="([0-9a-f]{64})"', page)
        assert key, "the page carries the live key"
        raw = bytes.fromhex(key.group(1))
        poll = c.get("/api/head?nonce=00ff")
        mac = hmac_mod.new(raw, b"00ff\n" + poll.content, "sha256").hexdigest()
        assert poll.headers["x-steptrail-mac"] == mac
        frag = c.get("/", headers={"x-steptrail-fragment": "1", "x-steptrail-nonce": "abcd"})
        mac = hmac_mod.new(raw, b"abcd\n" + frag.content, "sha256").hexdigest()
        assert frag.headers["x-steptrail-mac"] == mac
        for answer in (poll, frag):
            assert key.group(1) not in answer.text
            assert key.group(1) not in str(dict(answer.headers))
        # no nonce, or not one: no MAC (the tab then rejects the answer)
        assert "x-steptrail-mac" not in c.get("/api/head").headers
        assert "x-steptrail-mac" not in c.get("/api/head?nonce=<x>").headers


def test_a_download_name_keeps_no_format_characters(corpus: Path) -> None:
    """A right-to-left override in an artifact's name ("report\\u202etxt.exe" shows as
    "reportexe.txt") reached the saved file's name through filename*."""
    digest = hashlib.sha256(b"one\n2\n").hexdigest()  # plain-1's write, in the corpus
    with _client(corpus) as c:
        c.get(f"/?token={TOKEN}")
        r = c.get(url("/download", digest=digest, name="dir/report\u202etxt.exe\u200b"))
        assert r.status_code == 200
        disposition = r.headers.get("content-disposition", "")
        assert "%E2%80%AE" not in disposition.upper() and "\u202e" not in disposition
        assert "%E2%80%8B" not in disposition.upper()
        assert "report_txt.exe_" in disposition


def test_an_id_outside_ascii_is_flagged(tmp_path: Path) -> None:
    """A Cyrillic "ѕ1" beside "s1" looks identical: the one outside ASCII is marked."""
    from ledger import run_fenced_step

    ws = tmp_path / "w"
    ws.mkdir()
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", holder="h", ttl_s=3600).epoch
        for step in ("s1", "\u04551"):
            run_fenced_step(led, "w", step, lambda r, s=step: [r.read(f"{s}.txt").write(b"x")],
                            epoch=epoch).raise_for_status()
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get(url("/workspace", name="w")).text
        marks = page.count('class="nonascii"')
        assert marks == 1, marks
        assert 'class="nonascii"' in c.get(url("/step", id="\u04551")).text
        assert 'class="nonascii"' not in c.get(url("/step", id="s1")).text


def test_a_step_page_groups_events_by_attempt_and_explains_a_refusal(tmp_path: Path) -> None:
    """The step page by attempt (epoch, start, duration, outcome in words), blob pins
    folded away, and a refusal said in words with the change the step ran into as a
    diff when the ledger holds its bytes; a dead epoch is flagged only for an attempt
    that could still send something."""
    from ledger import run_fenced_step

    ws = tmp_path / "w"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", holder="h", ttl_s=3600).epoch
        run_fenced_step(led, "w", "base", lambda r: [r.read("a.txt").write(b"two\n")],
                        epoch=epoch).raise_for_status()

        def racing(r: Any) -> list[Any]:
            got = r.read("a.txt")
            # a person's save between the read and the apply, recorded by a step of
            # theirs so the ledger holds its bytes
            run_fenced_step(led, "w", "person", lambda q: [q.read("a.txt").write(
                b"two\nthe person's line\n")], epoch=epoch).raise_for_status()
            return [got.write(b"agent\n")]

        run_fenced_step(led, "w", "s1", racing, epoch=epoch)
        run_fenced_step(led, "w", "s1", lambda r: [r.read("a.txt").write(b"agent\n")],
                        epoch=epoch).raise_for_status()
        led.workspaces.acquire("w", holder="h2", ttl_s=3600, force=True)
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get(url("/step", id="s1")).text
        heads = re.findall(r'<h3 class="attempt" id="attempt-(\d)">(.*?)</h3>', page, re.S)
        assert [a for a, _ in heads] == ["1", "2"]
        assert "refused: nothing of it stayed" in heads[0][1]
        assert "committed and acknowledged" in heads[1][1]
        assert "blob pin(s) folded away" in page and 'class="kind k-blob-pinned"' not in page
        assert "In words: the step read" in page and "someone (a person" in page
        assert "the person&#39;s line" in page or "the person's line" in page
        # both attempts ended under their own epoch: nothing can still arrive from them
        assert "dead-epoch" not in page


def test_compare_shows_the_workspace_between_two_points(tmp_path: Path) -> None:
    """Before and after a step (linked from its page), or any two seqs: each path that
    differs, with both hashes and its diff a click away; a reversed range is a 400."""
    from ledger import run_fenced_step

    ws = tmp_path / "w"
    ws.mkdir()
    (ws / "a.txt").write_text("a0\n")
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", holder="h", ttl_s=3600).epoch
        for n in range(3):
            run_fenced_step(led, "w", f"s{n}", lambda r, n=n: [
                r.read("a.txt").write(f"a{n + 1}\n".encode()),
                r.read(f"new{n}.txt").write(b"x\n")], epoch=epoch).raise_for_status()
        row = led.step("s1")
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        step = c.get(url("/step", id="s1")).text
        assert 'class="compare"' in step
        page = c.get(url("/compare", ws="w", to=row.last_seq, **{"from": row.first_seq - 1}))
        assert page.status_code == 200
        rows = re.findall(r'path=([^"&]+)"><code>', page.text)
        assert sorted(rows) == ["a.txt", "new1.txt"], rows
        diff = re.findall(r'class="diff-link" href="([^"]+)"', page.text)[0]
        one = c.get(diff.replace("&amp;", "&")[len(c.app.prefix) + 1:])  # type: ignore[attr-defined]
        assert one.status_code == 200 and "+a2" in one.text and "-a1" in one.text
        everything = c.get(url("/compare", ws="w")).text  # from the start to the head
        assert sorted(re.findall(r'path=([^"&]+)"><code>', everything)) == [
            "a.txt", "new0.txt", "new1.txt", "new2.txt"]
        assert c.get(url("/compare", ws="w", to=3, **{"from": 5})).status_code == 400


def test_a_nights_growth_is_charted_by_the_hour() -> None:
    """One day of data made one daily bar: a ledger spanning two days or less is
    charted by the hour, a longer one added up by day."""
    from types import SimpleNamespace

    from ledger.ui.overview import _growth

    hour = 3600 * 10**9
    night = SimpleNamespace(bucket="hour", growth=[
        SimpleNamespace(start_ns=k * hour, events=k + 1, bytes=10) for k in range(10)])
    bars, unit = _growth(night)
    assert unit == "hour" and len(bars) == 10
    week = SimpleNamespace(bucket="hour", growth=[
        SimpleNamespace(start_ns=k * hour, events=1, bytes=1) for k in range(24 * 7)])
    bars, unit = _growth(week)
    assert unit == "day" and len(bars) == 7 and all(n == 24 for _, n, _ in bars)


def test_event_filters(corpus: Path) -> None:
    """Events of one kind, step, run or workspace, newest first; a kind that is none is
    a 400 naming the kinds."""
    with _client(corpus) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/events?kind=fenced").text
        kinds = set(re.findall(r'<span class="kind k-([a-z-]+)"', page))
        assert kinds == {"fenced"}, kinds
        page = c.get(url("/events", step="plain-1")).text
        steps = set(re.findall(r'class="step" href="[^"]*step\?id=([^"]+)"', page))
        assert steps == {"plain-1"}, steps
        bad = c.get("/events?kind=nope")
        assert bad.status_code == 400 and "fenced" in bad.text


def test_search_by_state_and_time_and_events_by_time(corpus: Path) -> None:
    """The filters the review asked for beyond names: a step's state, a time window
    (steps by their last event, events by their time); bad values are 400s naming the
    form they take."""
    with Ledger.open(str(corpus), readonly=True) as led:
        acked = {r.step_id for r in led.steps("acked")}
        first = next(iter(led.read(0, limit=1))).time_ns
    import datetime as dt

    later = dt.datetime.fromtimestamp(first / 1e9 + 3600, dt.timezone.utc).isoformat()
    with _client(corpus) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/search?state=acked").text
        shown = set(re.findall(r'class="step" href="[^"]*step\?id=([^"]+)"', page))
        assert shown and shown <= {quote_id for quote_id in map(_quoted, acked)}
        assert "no step" not in page
        none = c.get(url("/search", state="acked", since=later)).text
        assert re.findall(r'class="step" href=', none) == []
        assert c.get(url("/events", until=later)).status_code == 200
        assert re.findall(r'<tr><td>#', c.get(url("/events", since=later)).text) == []
        for bad in ("/search?state=nope", "/search?since=yesterday", "/events?until=soon"):
            r = c.get(bad)
            assert r.status_code == 400, bad


def _quoted(step: str) -> str:
    from urllib.parse import quote

    return quote(step, safe="")

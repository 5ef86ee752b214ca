"""Red-team tests of `steptrail ui` (ledger/ui/, docs/ui.md's security model).

Each attack that succeeded is a test stating what should hold (each was marked as an
expected failure until the UI was fixed; now they must pass). Each attack that held,
and that tests/ui/test_ui.py does not already cover, is a plain passing test.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the [ui] extra: pip install 'steptrail[ui]'")
pytest.importorskip("jinja2", reason="the [ui] extra: pip install 'steptrail[ui]'")

from starlette.testclient import TestClient  # noqa: E402

import ui_corpus  # noqa: E402
from ledger import Ledger, run_fenced_step  # noqa: E402
from ledger.runner import run_step  # noqa: E402
from ledger.ui import create_app  # noqa: E402
from ledger.ui import text as ui_text  # noqa: E402
from ledger.ui.app import url  # noqa: E402
from ledger.ui.web import DIFFS_PER_PAGE  # noqa: E402

TOKEN = "r3dteam-token"
PORT = 8124
BASE = f"http://127.0.0.1:{PORT}"
STEPTRAIL = str(Path(sys.executable).parent / "steptrail")


def _client(path: Path, *, verify: bool = False) -> TestClient:
    """A client whose relative URLs are under the app's secret prefix; an absolute URL
    (``f"{BASE}/..."``) reaches outside it."""
    app = create_app(str(path), token=TOKEN, port=PORT, verify=verify)
    return TestClient(app, base_url=f"{BASE}{app.prefix}/", follow_redirects=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ui_corpus.build(tmp_path_factory.mktemp("redteam"))


@pytest.fixture(scope="module")
def client(corpus: Path) -> Iterator[TestClient]:
    with _client(corpus) as c:
        assert c.get(f"/?token={TOKEN}").status_code == 303
        yield c


# == findings (fixed) ======================================================================


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        if not os.access(shutil.which(Path(exe).name) or exe, os.X_OK):
            return f"{exe} is missing"
    return None


@pytest.mark.skipif(_browser_missing() is not None, reason="needs chromium + chromedriver")
def test_the_token_cookie_never_reaches_another_port_on_loopback(tmp_path: Path) -> None:
    """Attack (b): another local user listens on 127.0.0.1:OTHER. The victim, who has
    opened the UI, follows a link from anywhere (here a page on localhost:OTHER, another
    site) to http://127.0.0.1:OTHER/page, whose <img> is a same-site request: Chromium
    sends every 127.0.0.1 cookie with it, the UI's token included."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    ledger = ui_corpus.build(tmp_path)
    proc = subprocess.Popen([STEPTRAIL, "--ledger", str(ledger), "ui", "--port", "0",
                             "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    seen: list[tuple[str, str | None]] = []

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append((self.path, self.headers.get("Cookie")))
            port = self.server.server_address[1]
            body = {"/start": f'<meta http-equiv="refresh" content="0;'
                              f'url=http://127.0.0.1:{port}/page">',
                    "/page": '<img src="/pixel.gif">'}.get(self.path, "")
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    driver = None
    try:
        assert proc.stdout is not None
        lines = "".join(proc.stdout.readline() for _ in range(2))
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", lines)
        assert found, lines
        token = found.group(2)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(
            executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver"),
            options=options)
        driver.set_page_load_timeout(30)
        driver.get(found.group(0))  # the user opens the UI: the cookie is set
        assert "Ledger at a glance" in driver.page_source
        driver.get(f"http://localhost:{evil.server_address[1]}/start")  # any link
        deadline = time.time() + 10
        while time.time() < deadline and not any(p == "/pixel.gif" for p, _ in seen):
            time.sleep(0.1)
        assert any(p == "/pixel.gif" for p, _ in seen), seen
        leaked = [c for _, c in seen if c and token in c]
        assert not leaked, f"another port on 127.0.0.1 received the UI's token: {leaked}"
    finally:
        if driver is not None:
            driver.quit()
        evil.shutdown()
        evil.server_close()
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_opening_the_browser_does_not_put_the_token_on_a_command_line(
        corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    import webbrowser

    from ledger import ui

    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda u, *a, **k: opened.append(u) or True)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: time.sleep(1.5))
    printed: list[str] = []
    ui.serve(str(corpus), port=0, open_browser=True, token=TOKEN, echo=printed.append)
    deadline = time.time() + 5
    while not opened and time.time() < deadline:
        time.sleep(0.05)
    assert opened, "the browser was not opened"
    assert TOKEN not in opened[0], f"the browser is launched with {opened[0]!r} in its argv"


def test_odd_numbers_in_the_query_are_400_not_500(client: TestClient) -> None:
    for query in ("/events?before=%C2%B2", "/tree?ws=w&seq=%C2%B9",
                  "/events?before=" + "9" * 5000, "/step?id=plain-1&after=" + "1" * 4400):
        r = client.get(query)
        assert r.status_code == 400, (query[:60], r.status_code, r.text[:120])


def test_the_token_redirect_stays_on_this_server(client: TestClient) -> None:
    # browsers read '/\\host' as '//host' and drop tabs and newlines from a URL
    for path in ("//evil.example/landing", "/%5Cevil.example/landing",
                 "/%09/evil.example/landing", "/%0d%0aSet-Cookie:%20x=1"):
        r = client.get(f"{BASE}{path}?token={TOKEN}")
        assert r.status_code == 303, path
        where = r.headers["location"]
        assert re.fullmatch(r"/(?![/\\])[\x21-\x7e]*", where), (path, where)


INVISIBLE = ("\u00ad", "\u034f", "\u061c", "\u180e", "\u3164", "\U000e0041")


def test_every_invisible_character_is_written_out(tmp_path: Path) -> None:
    for ch in INVISIBLE:
        assert ch not in ui_text.visible(f"deploy{ch}prod"), repr(ch)
    # and on a page: a step id that looks exactly like another one
    path = tmp_path / "l.db"
    spoof = "deploy-prod" + "".join(INVISIBLE)
    with Ledger.init(str(path)) as led:
        run_step(led, "deploy-prod", {"r.txt": b"real\n"}, run="r")
        run_step(led, spoof, {"r.txt": b"spoofed\n"}, run="r")
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/events").text
        for ch in INVISIBLE:
            assert ch not in page, repr(ch)


def _refused_plan(root: Path, n: int) -> Path:
    """A workspace of `n` files and a step whose plan writes all of them, refused (a
    person edited one between the read and the apply)."""
    repo = root / "w"
    repo.mkdir()
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"{i}\n")
    path = root / "l.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(repo))
        epoch = led.workspaces.acquire("w", holder="h", ttl_s=3600).epoch

        def clash(r: Any) -> Any:
            got = [r.read(f"f{i}.txt") for i in range(n)]
            (repo / "f0.txt").write_text("a person's edit\n")
            return [g.write(b"new\n") for g in got]

        out = run_fenced_step(led, "w", "big", clash, epoch=epoch)
        assert out.status.value == "conflict"
    return path


def test_a_refused_plan_of_many_writes_costs_a_bounded_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.workspace.directory as directory

    path = _refused_plan(tmp_path, 300)
    hashed = [0]
    real = directory.WorkspaceDir.hash

    def counting(self: Any, p: str) -> Any:
        hashed[0] += 1
        return real(self, p)

    monkeypatch.setattr(directory.WorkspaceDir, "hash", counting)
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/step?id=big")
        assert page.status_code == 200
        rows = page.text.count('<div class="write">')
    assert hashed[0] <= DIFFS_PER_PAGE, f"{hashed[0]} workspace files hashed for one page"
    assert rows <= 2 * DIFFS_PER_PAGE, f"{rows} writes listed in one event"


# == attacks that held =====================================================================


def test_hostile_host_headers_are_refused(corpus: Path) -> None:
    from starlette.types import Message

    app = create_app(str(corpus), token=TOKEN, port=PORT, verify=False)

    def call(headers: list[tuple[bytes, bytes]]) -> int:
        got: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(m: Message) -> None:
            got.append(m)

        import anyio

        scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/",
                 "query_string": f"token={TOKEN}".encode(), "headers": headers,
                 "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", PORT),
                 "client": ("127.0.0.1", 5555), "root_path": ""}
        anyio.run(app, scope, receive, send)
        return got[0]["status"]

    try:
        for host in (b"", b"127.0.0.1", b"127.0.0.1:8124.evil.example", b"evil:8124",
                     b"127.0.0.1:8124@evil", b"[::1]:8124", b"127.1:8124",
                     b"0x7f.0.0.1:8124", b"127.0.0.1:08124"):
            assert call([(b"host", host)]) == 403, host
        assert call([]) == 403
        assert call([(b"host", b"LOCALHOST:8124")]) == 303  # case-insensitive, still ours
    finally:
        app.ui.pool.close()  # type: ignore[attr-defined]


def test_traversal_in_every_parameter_is_refused(client: TestClient) -> None:
    for q in ("/static/..%2fapp.py", "/static/ui.js%00", "/static/%2e%2e/app.py",
              "/static/../app.py", "/static/ui.css/..%2f..%2fapp.py"):
        r = client.get(q)
        assert r.status_code == 404 and "import" not in r.text, q
    for q in ("/file?digest=../../../../etc/passwd", "/file?digest=" + "A" * 64,
              "/download?digest=..%2f..%2fetc%2fpasswd", "/file?digest=" + "a" * 63 + "/",
              "/file?digest=" + "a" * 64 + "%00"):
        assert client.get(q).status_code == 400, q
    for q in ("/tree?ws=../../etc", "/history?ws=w/../..&path=x", "/workspace?name=/etc",
              "/tree?ws=w&step=../x%00"):
        assert client.get(q).status_code in (400, 404), q
    page = client.get(url("/history", ws="w", path="../../../../etc/passwd"))
    assert page.status_code == 200 and "root:x:" not in page.text


def test_a_symlink_or_fifo_at_a_refused_path_leaks_nothing_and_never_hangs(
        tmp_path: Path) -> None:
    """Attack (a)/(c): the refused step's page hashes the workspace file now. A symlink
    there to /etc/passwd, or a FIFO, must neither be followed nor block the page."""
    path = ui_corpus.build(tmp_path)
    target = tmp_path / "w" / ui_corpus.NAME
    target.unlink()
    target.symlink_to("/etc/passwd")
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/step?id=refused-1").text
        assert "root:x:" not in page and "unknown (PathEscapes" in page
        import hashlib
        passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
        assert passwd[:12] not in page  # not even its hash
        target.unlink()
        os.mkfifo(target)
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(c.get("/step?id=refused-1")),
                             daemon=True)
        t.start()
        t.join(timeout=20)
        assert got, "the page hung on a FIFO in the workspace"
        assert got[0].status_code == 200 and "unknown (PathEscapes" in got[0].text


def test_a_swapped_ledger_file_shows_one_line_and_no_content(tmp_path: Path) -> None:
    """Attack (c): the ledger is replaced, while the UI runs, by a symlink to a secret
    file: the pages say it is not a ledger (plain text, no traceback), nothing of it."""
    path = ui_corpus.build(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET line\n" * 50)
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        assert c.get("/").status_code == 200
        os.rename(path, str(path) + ".moved")
        for side in ("-wal", "-shm"):
            if os.path.exists(str(path) + side):
                os.rename(str(path) + side, str(path) + ".moved" + side)
        path.symlink_to(secret)
        for _ in range(6):  # every pooled connection, then fresh ones
            for q in ("/", "/step?id=plain-1", "/file?digest=" + "a" * 64):
                r = c.get(q)
                assert "TOPSECRET" not in r.text, q
                assert "Traceback" not in r.text and 'File "' not in r.text, q
                if r.status_code == 500:
                    assert r.headers["content-type"].startswith("text/plain"), q
        doc = c.get("/api/head")
        assert "TOPSECRET" not in doc.text and "Traceback" not in doc.text


def test_browsing_creates_nothing_but_the_sqlite_sidecars(tmp_path: Path) -> None:
    """Read-only, at the file level: the ledger's bytes and mtime, its -lockq (the
    writers' queue) and its blob directory are untouched; only SQLite's -wal (empty)
    and -shm may appear, private."""
    path = ui_corpus.build(tmp_path)
    with Ledger.open(str(path)):
        pass

    def state() -> dict[str, tuple[int, int, int]]:
        out = {}
        for root, _dirs, files in os.walk(path.parent):
            for f in files:
                st = os.lstat(os.path.join(root, f))
                out[os.path.relpath(os.path.join(root, f), path.parent)] = (
                    st.st_size, st.st_mtime_ns, st.st_mode)
        return out

    before = state()
    with _client(path, verify=True) as c:
        c.get(f"/?token={TOKEN}")
        for q in ("/", "/events", "/stats", "/step?id=refused-1", "/tree?ws=w",
                  url("/step", id=ui_corpus.STEP), "/history?ws=w&path=plain.txt"):
            assert c.get(q).status_code == 200
        time.sleep(1)
        after = state()
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed <= {"ledger.db-wal", "ledger.db-shm"}, changed
    for side in changed:
        assert after[side][2] & 0o077 == 0, (side, oct(after[side][2]))
    assert after.get("ledger.db-wal", (0,))[0] == 0


def test_the_fragment_and_error_pages_carry_no_markup_from_input(client: TestClient) -> None:
    """The live swap parses the fragment as HTML: every fragment, 404s echoing the query
    included, must be escaped template output."""
    evil = '<img src=x onerror="alert(1)"></main><script>alert(2)</script>'
    for q in (url("/step", id=evil), url("/run", id=evil), url("/workspace", name=evil),
              url("/history", ws="w", path=evil), url("/file", digest="a" * 64, name=evil),
              url("/tree", ws="w", step=evil)):
        for headers in ({}, {"X-Steptrail-Fragment": "1"}):
            r = client.get(q, headers=headers)
            assert "<img" not in r.text and "<script>alert" not in r.text, (q, r.status_code)
            assert "</main><" not in r.text, q
    # the file view of an existing blob reflects ?name= escaped
    page = client.get(url("/step", id="art-1")).text
    digest = re.search(r"/file\?digest=([0-9a-f]{64})", page)
    assert digest
    r = client.get(url("/file", digest=digest.group(1), name=evil, ws=evil, seq=evil))
    assert r.status_code == 200 and "<img" not in r.text and "<script>alert" not in r.text


def test_a_cross_site_request_never_carries_a_usable_credential(client: TestClient) -> None:
    """CSRF/XS-leaks: the cookie is the only credential; a request with a stale or
    foreign cookie plus a token in the URL that is wrong is refused, and a valid cookie
    does not make a wrong ?token= pass."""
    r = client.get("/?token=wrong")
    assert r.status_code == 403
    r = client.post("/?token=" + TOKEN)
    assert r.status_code == 405 and "set-cookie" not in r.headers


def test_a_module_planted_in_the_working_directory_is_not_run_by_the_background_jobs(
        tmp_path: Path) -> None:
    """`steptrail ui` is run inside workspaces agents write; its verify and stats run in a
    child interpreter started from that directory. A `pickle.py` an agent planted there
    must not be imported by the child (`python -c` puts the working directory first on
    its path; the child is started with -P)."""
    import subprocess
    import sys

    from ledger import Ledger

    work = tmp_path / "repo"
    work.mkdir()
    with Ledger.init(str(work / "l.db")):
        pass
    marker = tmp_path / "planted-ran"
    (work / "pickle.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                    "raise SystemExit('planted')\n")
    script = f"""
import time
from starlette.testclient import TestClient
from ledger.ui import create_app
app = create_app({str(work / 'l.db')!r}, token="t", port=8125)
with TestClient(app, base_url="http://127.0.0.1:8125" + app.prefix + "/") as c:
    c.get("/?token=t")
    for _ in range(300):
        doc = c.get("/api/head").json()
        if doc["verify"]["state"] != "running" and doc["stats"]["state"] != "running":
            break
        time.sleep(0.1)
    print(doc["verify"]["state"], doc["stats"]["state"])
"""
    # the parent runs from elsewhere (its own imports are not the question); the child
    # inherits the working directory the server was started in
    done = subprocess.run([sys.executable, "-P", "-c", f"import os; os.chdir({str(work)!r}); exec({script!r})"],
                          cwd=tmp_path, text=True, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not marker.exists(), "the background job imported a module planted in the cwd"
    assert done.stdout.split() == ["done", "done"], (done.stdout, done.stderr[-2000:])

"""`steptrail ui` in a real headless Chromium (Debian's chromium + chromedriver, driven
by Selenium with the driver's path given: Selenium Manager never downloads anything).

One browser for the module; two servers (`steptrail ui` processes): the demo's ledger
(`steptrail demo --keep`: a SIGKILLed worker, a restore, a settled epoch, a refused
write) and the hostile corpus (tests/ui/ui_corpus.py). Skipped with an install hint where
chromium or chromedriver is missing, unless STEPTRAIL_REQUIRE_BROWSER=1 (CI), where
that fails. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HINT = ("needs a headless browser: apt-get install chromium chromium-driver; pip install"
        " selenium (the test extra)")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(exe) and os.access(exe, os.X_OK)):
            return f"{exe} is missing"
    return None


if (_why := _missing()) is not None:
    if os.environ.get("STEPTRAIL_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"STEPTRAIL_REQUIRE_BROWSER=1 but {_why}: {HINT}")
    pytest.skip(f"{_why}: {HINT}", allow_module_level=True)

pytest.importorskip("starlette", reason="the [ui] extra: pip install 'steptrail[ui]'")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

import ui_corpus  # noqa: E402
from ledger import Ledger, Planned  # noqa: E402
from ledger.ui.app import url  # noqa: E402

STEPTRAIL = str(Path(sys.executable).parent / "steptrail")


class Served:
    """A `steptrail ui` process. Its URL's token opens one browser session, once: the
    module's browser spends it (`enter`), and learns the secret prefix from where it
    lands."""

    def __init__(self, ledger: Path, port: int = 0) -> None:
        self.ledger = ledger
        self.proc = subprocess.Popen([STEPTRAIL, "--ledger", str(ledger), "ui", "--port",
                                      str(port), "--no-browser"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        lines = "".join(self.proc.stdout.readline() for _ in range(2))
        found = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=[\w-]+", lines)
        assert found, lines
        self.url, self.origin, self.port = found.group(0), found.group(1), int(found.group(2))
        self.base = self.prefix = ""

    def enter(self, browser: Any) -> Served:
        """The browser opens the printed URL (the token's one use) and lands under the
        secret prefix with its session cookie; `base` is that prefix's URL."""
        if not self.base:
            browser.get(self.url)
            WebDriverWait(browser, 20).until(
                lambda d: re.fullmatch(re.escape(self.origin) + r"/s-[\w-]+/", d.current_url))
            self.base = browser.current_url.rstrip("/")
            self.prefix = self.base[len(self.origin):]
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _chrome(profile: Path | None = None) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-sync"):
        options.add_argument(arg)
    if profile is not None:  # another browser: its own profile, its own cookies
        options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = _chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    keep = tmp_path_factory.mktemp("demo") / "d"
    done = subprocess.run([STEPTRAIL, "demo", "--keep", str(keep)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    served = Served(keep / ".steptrail" / "ledger.db")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(ui_corpus.build(tmp_path_factory.mktemp("hostile")))
    yield served
    served.stop()


def _no_script_ran(driver: Any, where: str) -> None:
    try:
        alert = driver.switch_to.alert
        raise AssertionError(f"{where}: an alert opened: {alert.text!r}")
    except NoAlertPresentException:
        pass
    assert driver.title != "pwned", where  # (the title may quote the payload as text)
    assert driver.execute_script("return window.__pwned === undefined"), where


def test_the_token_is_enforced(browser: Any, demo: Served) -> None:
    browser.get(demo.origin + "/?token=wrong")
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text
    demo.enter(browser)  # the URL printed: the cookie is set, the token leaves the URL
    assert browser.current_url == demo.base + "/"
    assert "Ledger at a glance" in browser.find_element(By.TAG_NAME, "h1").text
    browser.get(f"http://localhost:{demo.port}{demo.prefix}/")  # another host name: no cookie
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(demo.origin + "/")  # outside the prefix: the cookie does not go there
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text


def test_the_token_opens_one_session_once(browser: Any, demo: Served,
                                          tmp_path: Path) -> None:
    """The token in the browser's history opens nothing: spent by the first
    navigation. The same browser (another tab) still gets in through its cookie; a
    second browser is refused and told why."""
    demo.enter(browser)
    browser.get(demo.url)  # again, in the browser that holds the session
    assert browser.current_url == demo.base + "/"
    assert "Ledger at a glance" in browser.find_element(By.TAG_NAME, "h1").text
    other = _chrome(tmp_path / "profile-2")
    try:
        other.get(demo.url)
        text = other.find_element(By.TAG_NAME, "body").text
        assert "forbidden: this browser has no session" in text
        assert "start it again for a new URL" in text
    finally:
        other.quit()


def test_a_prefetch_does_not_spend_the_token(hostile: Served) -> None:
    """A speculative load (Sec-Purpose: prefetch) is refused without spending the one
    use: the person's navigation after it still opens the session."""
    fresh = Served(hostile.ledger)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", fresh.port, timeout=10)
        try:
            conn.request("GET", fresh.url[len(fresh.origin):],
                         headers={"Sec-Purpose": "prefetch"})
            r = conn.getresponse()
            r.read()
            assert r.status == 503 and r.getheader("set-cookie") is None
            conn.request("GET", fresh.url[len(fresh.origin):])
            r = conn.getresponse()
            r.read()
            assert r.status == 303 and r.getheader("set-cookie")  # not spent before
            conn.request("GET", fresh.url[len(fresh.origin):])
            r = conn.getresponse()
            r.read()
            assert r.status == 303 and r.getheader("set-cookie") is None  # spent now
        finally:
            conn.close()
    finally:
        fresh.stop()


def test_the_launcher_page_opens_the_ui(browser: Any, hostile: Served) -> None:
    """What `steptrail ui` opens the browser on: a private file:// page that forwards
    to the printed URL. A navigation from it is cross-site, so it must still land on
    the overview with the SameSite=Strict cookie set and sent."""
    from ledger.ui import write_launcher

    served = Served(hostile.ledger)  # a server of its own: its token unspent
    folder, page = write_launcher(served.url)
    try:
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert all(os.stat(os.path.join(folder, f)).st_mode & 0o777 == 0o600
                   for f in os.listdir(folder))
        browser.get(page)
        WebDriverWait(browser, 20).until(
            lambda d: re.fullmatch(re.escape(served.origin) + r"/s-[\w-]+/", d.current_url)
            and d.find_elements(By.TAG_NAME, "h1"))
        assert "Ledger at a glance" in browser.find_element(By.TAG_NAME, "h1").text
        base = browser.current_url.rstrip("/")
        browser.find_element(By.LINK_TEXT, "events").click()  # and the cookie stays good
        assert browser.current_url == base + "/events"
        assert "Events, newest first" in browser.find_element(By.TAG_NAME, "h1").text
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        served.stop()


def test_the_demos_story_from_the_overview(browser: Any, demo: Served, tmp_path: Path) -> None:
    browser.get(demo.enter(browser).base + "/")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "repo" in body and "worker-2" in body  # the workspace and its new holder
    WebDriverWait(browser, 20).until(lambda d: "verify: ok" in d.find_element(
        By.ID, "content").text)
    browser.save_screenshot(str(tmp_path / "overview.png"))
    browser.find_element(By.LINK_TEXT, "repo").click()  # the workspace's timeline
    assert "Timeline of steps" in browser.page_source
    browser.find_element(By.LINK_TEXT, "s04").click()  # follow a step
    assert browser.current_url.endswith("/step?id=s04")
    text = browser.find_element(By.ID, "content").text
    assert "refused: pre_hash" in text and "on disk now" in text  # the refused write
    diff = browser.find_elements(By.CSS_SELECTOR, "pre.diff .add")
    assert diff and "def f04" in " ".join(d.text for d in diff)  # its retry's diff
    browser.save_screenshot(str(tmp_path / "step-s04.png"))
    browser.get(demo.base + "/step?id=s06")  # the dead worker's attempt, settled
    text = browser.find_element(By.ID, "content").text
    assert "compensated" in text and "settled by epoch 2" in text and "worker-2" in text
    # the demo's refused late receipt: the ledger records no refusal, the page states
    # the rule that refused it, for the attempt of the dead epoch
    dead = browser.find_element(By.CSS_SELECTOR, "p.dead-epoch").text
    assert "attempt 1 ran under epoch 1 (worker-1)" in dead and "late receipt" in dead
    assert "refused (StaleEpoch)" in dead
    browser.save_screenshot(str(tmp_path / "step-s06.png"))
    browser.get(demo.base + "/stats")
    assert len(browser.find_elements(By.CSS_SELECTOR, "figure.chart svg")) >= 4
    _no_script_ran(browser, "demo")


def test_an_open_page_follows_new_events_without_reloading(browser: Any, demo: Served) -> None:
    browser.get(demo.enter(browser).base + "/")
    WebDriverWait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.verify") == "done")
    browser.execute_script("window.__still_here = 'yes'")
    with Ledger.open(str(demo.ledger)) as led:
        led.append(Planned(step="live-step-from-the-test", attempt=1, run="live"))
    WebDriverWait(browser, 15).until(
        lambda d: "live-step-from-the-test" in d.find_element(By.ID, "content").text)
    assert browser.execute_script("return window.__still_here") == "yes"  # no reload


def test_the_hostile_corpus_runs_no_script(browser: Any, hostile: Served,
                                           tmp_path: Path) -> None:
    browser.get(hostile.enter(browser).base + "/")
    pages = ["/", "/events", url("/step", id=ui_corpus.STEP), "/step?id=undone-1",
             "/step?id=refused-1", "/step?id=art-1", url("/run", id=ui_corpus.RUN),
             "/workspace?name=w", url("/history", ws="w", path=ui_corpus.NAME),
             "/history?ws=w&path=plain.txt", url("/tree", ws="w", step=ui_corpus.STEP),
             "/stats"]
    for page in pages:
        browser.get(hostile.base + page)
        _no_script_ran(browser, page)
        assert browser.find_element(By.ID, "content")
    browser.get(hostile.base + url("/step", id=ui_corpus.STEP))
    shown = browser.find_element(By.ID, "content").text
    assert ui_corpus.STEP in shown  # the step id as text
    assert "\\x07" in shown and "\\u202e" in shown and "\\xff" in shown
    browser.save_screenshot(str(tmp_path / "hostile-step.png"))
    # the files' views and the HTML artifact's link: text, or a download, never a page
    for link in [a.get_attribute("href") for a in
                 browser.find_elements(By.CSS_SELECTOR, "a")][:80]:
        if link and link.startswith(hostile.base) and "/file?" in link:
            browser.get(link)
            _no_script_ran(browser, link)
    time.sleep(0.2)
    _no_script_ran(browser, "end")


def test_a_process_that_takes_the_port_cannot_feed_an_open_tab(
        browser: Any, hostile: Served) -> None:
    """The review's attack: after `ui` stopped, another local process on the same port
    received the tab's polls (with the secret prefix and the cookie) and the tab swapped
    in what it returned — a fake "verify: ok", a meta refresh elsewhere — and said
    "live" again. Now every answer must carry a MAC under a key only the real server's
    page body held: the tab rejects the impostor's first answer, stops polling for
    good and says the server stopped."""
    import http.server
    import json
    import threading

    served = Served(hostile.ledger).enter(browser)
    browser.get(served.base + "/")
    WebDriverWait(browser, 20).until(lambda d: "live" in d.find_element(By.ID, "live").text)
    seen: list[str] = []

    class Impostor(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            if "/api/head" in self.path:
                body = json.dumps({"seq": 10**6, "hash": "0" * 64,
                                   "verify": {"state": "done", "ok": True},
                                   "stats": {"state": "done", "head_seq": 10**6}}).encode()
                kind = "application/json"
            else:
                body = (b"<h1>verify: ok FAKE</h1><meta http-equiv=\"refresh\""
                        b" content=\"0;url=http://example.invalid/\">")
                kind = "text/html"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("x-steptrail-mac", "ab" * 32)  # a guess
            self.send_header("x-steptrail-head", "1000000")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    served.stop()
    deadline = time.time() + 30
    while True:  # the port, as soon as the kernel lets it go
        try:
            impostor = http.server.ThreadingHTTPServer(("127.0.0.1", served.port), Impostor)
            break
        except OSError:
            assert time.time() < deadline, "the port was not released"
            time.sleep(0.2)
    thread = threading.Thread(target=impostor.serve_forever, daemon=True)
    thread.start()
    try:
        WebDriverWait(browser, 20).until(
            lambda d: "server stopped" in d.find_element(By.ID, "live").text)
        assert seen, "the tab never asked the impostor"
        content = browser.find_element(By.ID, "content").text
        assert "FAKE" not in content and "Ledger at a glance" in content
        assert browser.current_url == served.base + "/"
        asked = len(seen)
        time.sleep(5)  # two and a half polling periods: polling stopped for good
        assert len(seen) == asked
        assert "server stopped" in browser.find_element(By.ID, "live").text
    finally:
        impostor.shutdown()
        impostor.server_close()


def test_the_overview_answers_what_happened_overnight(browser: Any, demo: Served,
                                                      tmp_path: Path) -> None:
    """The demo's night on the overview: the needs-attention list holds the open item
    (the artifact step left planned) with the command that resolves it, and one click
    away the resolved ones — s04's refusal, s05's undo, the killed worker's settled s06
    — each with its reason; the runs with their states and duration; the search finds
    a step, a run and a path."""
    browser.get(demo.enter(browser).base + "/")
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "table.attention"))
    table = browser.find_element(By.CSS_SELECTOR, "table.attention").text
    assert "notes" in table and "steptrail step store notes FILE --as NAME" in table
    summary = browser.find_element(By.CSS_SELECTOR, "details.resolved summary")
    summary.click()  # one click away
    resolved = browser.find_elements(By.CSS_SELECTOR, "details.resolved table.attention")[0].text
    for step, words in (("s04", "refused: pre_hash"), ("s05", "tests/test_calc.py failed"),
                        ("s06", "settled by epoch 2")):
        row = next(line for line in resolved.splitlines() if step in line or words in line)
        assert words in resolved and row, (step, resolved)
    browser.save_screenshot(str(tmp_path / "attention.png"))
    runs = browser.find_element(By.CSS_SELECTOR, "table.runs").text
    assert "refactor-run" in runs and "acked" in runs
    # the search box in the header: a step, a run, a path
    for query, expect in (("s04", "/step?id=s04"), ("refactor", "/run?id=refactor-run"),
                          ("util.py", "path=src%2Futil.py")):
        box = browser.find_element(By.CSS_SELECTOR, "form.search input[name=q]")
        box.clear()
        box.send_keys(query)
        box.submit()
        WebDriverWait(browser, 20).until(lambda d: "/search?" in d.current_url)
        hrefs = [a.get_attribute("href") or "" for a in
                 browser.find_elements(By.CSS_SELECTOR, "#content a")]
        assert any(expect in h for h in hrefs), (query, hrefs)
    _no_script_ran(browser, "overnight")


def test_tables_survive_256_character_ids(browser: Any, tmp_path: Path) -> None:
    """A step id, a run and a workspace name of 256 characters (the most an id may
    have) wrap inside their cells: no page is wider than the window."""
    from ledger import run_fenced_step

    long_step, long_run = "s" * 255 + "1", "r" * 256
    ws = tmp_path / "w"
    ws.mkdir()
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w" * 256, str(ws))
        epoch = led.workspaces.acquire("w" * 256, holder="h" * 256, ttl_s=3600).epoch
        run_fenced_step(led, "w" * 256, long_step, lambda r: [r.read("a.txt").write(b"x\n")],
                        epoch=epoch, run=long_run).raise_for_status()
        led.plan("p" * 256, run=long_run)  # one left in flight: listed on the overview
    served = Served(path).enter(browser)
    try:
        for page in ("/", "/runs", url("/search", q="sss"), "/events",
                     url("/step", id=long_step), url("/run", id=long_run)):
            browser.get(served.base + page)
            if page == "/":
                WebDriverWait(browser, 30).until(
                    lambda d: d.find_elements(By.CSS_SELECTOR, "table.runs"))
            wide = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]")
            widest = browser.execute_script(
                "let w = null; for (const e of document.querySelectorAll('body *')) {"
                " if (e.scrollWidth > e.clientWidth + 2) w = e; }"
                " return w ? w.tagName + '.' + w.className + ': ' + w.textContent.slice(0, 80)"
                " : '';")
            assert wide[0] <= wide[1] + 2, (page, wide, widest)
    finally:
        served.stop()


def test_the_timeline_marks_an_observation_and_previews_a_rewind(browser: Any,
                                                                 tmp_path: Path) -> None:
    """A workspace's timeline (`/timeline`): the edit by hand, observed with a hostile
    label, is a row marked "outside the steps"; its link opens a rewind's preview with
    the command that would do it. No planted script runs; nothing is written."""
    from ledger import run_fenced_step

    ws = tmp_path / "w"
    ws.mkdir()
    (ws / "app.py").write_text("v0\n")
    path = tmp_path / ".steptrail" / "ledger.db"
    label = f"by hand <script>{ui_corpus.PWN}</script>"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        led.workspaces.observe("w", by="cli:me@host", label="baseline")
        lease = led.workspaces.acquire("w", holder="agent", ttl_s=600)
        run_fenced_step(led, "w", "edit-1", lambda r: [r.read("app.py").write(b"v1\n")],
                        epoch=lease.epoch).raise_for_status()
        led.workspaces.release("w", lease.epoch)
        (ws / "app.py").write_text("v2 by hand\n")
        led.workspaces.observe("w", by=ui_corpus.RUN, label=label)
        head = led.head().seq
    served = Served(path).enter(browser)
    try:
        browser.get(served.base + "/workspace?name=w")
        browser.find_element(By.CSS_SELECTOR, "a.travel").click()
        assert browser.current_url == served.base + "/timeline?ws=w"
        rows = browser.find_elements(By.CSS_SELECTOR, "table.travel tbody tr")
        assert [r.get_attribute("class") for r in rows] == ["observed", "step", "observed"]
        assert "outside the steps" in rows[2].text and label in rows[2].text
        assert ui_corpus.RUN in rows[2].text  # who asked, as text
        _no_script_ran(browser, "timeline")
        rows[1].find_element(By.CSS_SELECTOR, "a.rewind").click()  # edit-1
        WebDriverWait(browser, 20).until(lambda d: "/rewind?" in d.current_url)
        content = browser.find_element(By.ID, "content").text
        assert "A preview: nothing was written" in content and "M app.py" in content
        command = browser.find_element(By.ID, "rewind-command").text
        assert command.endswith("--workspace w rewind --to edit-1")
        _no_script_ran(browser, "rewind")
    finally:
        served.stop()
    with Ledger.open(str(path), readonly=True) as led:
        assert led.head().seq == head
    assert (ws / "app.py").read_text() == "v2 by hand\n"

"""`steptrail ui` in a real headless Chromium (Debian's chromium + chromedriver, driven
by Selenium with the driver's path given: Selenium Manager never downloads anything).

One browser for the module; two servers (`steptrail ui` processes): the demo's ledger
(`steptrail demo --keep`: a SIGKILLed worker, a restore, a settled epoch, a refused
write) and the hostile corpus (tests/ui_corpus.py). Skipped with an install hint where
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
    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.proc = subprocess.Popen([STEPTRAIL, "--ledger", str(ledger), "ui", "--port", "0",
                                      "--no-browser"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        lines = "".join(self.proc.stdout.readline() for _ in range(2))
        found = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=[\w-]+", lines)
        assert found, lines
        self.url, self.origin, self.port = found.group(0), found.group(1), int(found.group(2))
        # the pages live under a secret prefix: where the printed URL redirects
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", self.url[len(self.origin):])
            r = conn.getresponse()
            r.read()
            assert r.status == 303, r.status
            where = r.getheader("location") or ""
        finally:
            conn.close()
        assert re.fullmatch(r"/s-[\w-]+/", where), where
        self.prefix = where.rstrip("/")
        self.base = self.origin + self.prefix

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-sync"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
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
    browser.get(f"http://localhost:{demo.port}{demo.prefix}/")  # another host name: no cookie
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(demo.base + "/?token=wrong")
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(demo.url)  # the URL printed: the cookie is set, the token leaves the URL
    assert browser.current_url == demo.base + "/"
    assert "Ledger at a glance" in browser.find_element(By.TAG_NAME, "h1").text
    browser.get(demo.origin + "/")  # outside the prefix: the cookie does not go there
    assert "forbidden" in browser.find_element(By.TAG_NAME, "body").text


def test_the_launcher_page_opens_the_ui(browser: Any, hostile: Served) -> None:
    """What `steptrail ui` opens the browser on: a private file:// page that forwards
    to the printed URL. A navigation from it is cross-site, so it must still land on
    the overview with the SameSite=Strict cookie set and sent."""
    from ledger.ui import write_launcher

    browser.delete_all_cookies()
    folder, page = write_launcher(hostile.url)
    try:
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert all(os.stat(os.path.join(folder, f)).st_mode & 0o777 == 0o600
                   for f in os.listdir(folder))
        browser.get(page)
        WebDriverWait(browser, 20).until(
            lambda d: d.current_url == hostile.base + "/" and d.find_elements(By.TAG_NAME, "h1"))
        assert "Ledger at a glance" in browser.find_element(By.TAG_NAME, "h1").text
        browser.find_element(By.LINK_TEXT, "events").click()  # and the cookie stays good
        assert browser.current_url == hostile.base + "/events"
        assert "Events, newest first" in browser.find_element(By.TAG_NAME, "h1").text
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_demos_story_from_the_overview(browser: Any, demo: Served, tmp_path: Path) -> None:
    browser.get(demo.url)
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
    browser.get(demo.base + "/")
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
    browser.get(hostile.url)
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

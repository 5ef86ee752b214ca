"""The UI's time-travel pages (ledger/ui/travel.py, docs/ui.md): a workspace's timeline of
steps and observations, the preview of a rewind (which writes nothing), a fork's lineage,
the holds in force — each bounded, and every string a person or an agent chose (a label,
who asked, a holder, a path, a step id, a fork's name) shown escaped. Driven in process by
Starlette's TestClient, as tests/ui/test_ui.py; the real browser's look is
tests/ui/test_ui_browser.py's."""

from __future__ import annotations

import hashlib
import html
import html.parser
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the [ui] extra: pip install 'steptrail[ui]'")
pytest.importorskip("jinja2", reason="the [ui] extra: pip install 'steptrail[ui]'")

from markupsafe import escape  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import ui_corpus  # noqa: E402
from ledger import Ledger, run_fenced_step  # noqa: E402
from ledger.ui import create_app  # noqa: E402
from ledger.ui import text as ui_text  # noqa: E402
from ledger.ui.app import url  # noqa: E402
from ledger.ui.model import origin_of  # noqa: E402
from ledger.ui.web import PAGE, REWIND_PAGE, REWIND_PATHS_MAX  # noqa: E402

TOKEN = "time-travel-token"
PORT = 8125
#: Strings a person or an agent chose, each planted where a page shows it.
LABEL = f"by hand <script>{ui_corpus.PWN}</script> bell \x07 rtl \u202e end"
ASKED = f'cli:"><img src=x onerror="{ui_corpus.PWN}">@host'
HOLDER = f"<b>{ui_corpus.RUN}</b>"
REASON = f"kept </td><script>{ui_corpus.PWN}</script> \x07"
FORK = f"fork{ui_corpus.RUN}"
LINK = f'"><img src=x onerror="{ui_corpus.PWN}">.lnk'
#: Files the `many` step creates: more than a preview shows a page.
MANY = REWIND_PAGE + 5
#: Lines of `big.txt`: its rewound diff is longer than a page shows of one file.
BIG_LINES = 3000


class Built:
    """The planted ledger: its path, the workspace's directory, and the seqs tests use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws = root / "p"
        self.ledger = root / ".steptrail" / "ledger.db"
        self.before_many = 0
        self.baseline = ""


def _big(changed: bool) -> bytes:
    return "".join(f"line {k}{' changed' if changed and k % 2 else ''}\n"
                   for k in range(BIG_LINES)).encode()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Workspace `p`: a baseline observation (a hostile symlink left out), a step with the
    corpus's hostile id writing a hostile name, an edit by hand observed with a hostile
    label and asker, enough steps to page the timeline, one step creating MANY files and
    one rewriting a long file; a fork of it under a hostile name; holds with hostile
    holders and reasons (one released); a workspace whose baseline forges a lineage."""
    b = Built(tmp_path_factory.mktemp("travel"))
    b.ws.mkdir()
    (b.ws / "app.py").write_text("print('v0')\n")
    (b.ws / "notes.txt").write_text("notes\n")
    os.symlink("app.py", b.ws / LINK)
    with Ledger.init(str(b.ledger)) as led:
        led.workspaces.add("p", str(b.ws))
        b.baseline = led.workspaces.observe("p", by="cli:me@host", label="baseline").steps[0]
        lease = led.workspaces.acquire("p", holder=HOLDER, ttl_s=3600)
        run_fenced_step(led, "p", ui_corpus.STEP, lambda r: [
            r.read(ui_corpus.NAME).write(ui_corpus.CONTENT)], epoch=lease.epoch,
            run=ui_corpus.RUN).raise_for_status()
        run_fenced_step(led, "p", "big-0", lambda r: [r.read("big.txt").write(_big(False))],
                        epoch=lease.epoch, run="r").raise_for_status()
        led.workspaces.release("p", lease.epoch)
        (b.ws / "notes.txt").write_text("edited by hand\n")
        led.workspaces.observe("p", by=ASKED, label=LABEL)
        lease = led.workspaces.acquire("p", holder=HOLDER, ttl_s=3600)
        for i in range(PAGE + 5):
            run_fenced_step(led, "p", f"edit-{i:02d}", lambda r, i=i: [
                r.read("app.py").write(f"print('v{i + 1}')\n".encode())],
                epoch=lease.epoch, run="r").raise_for_status()
        b.before_many = led.head().seq
        run_fenced_step(led, "p", "many", lambda r: [
            r.read(f"many/f{k:02d}.txt").write(f"{k}\n".encode()) for k in range(MANY)],
            epoch=lease.epoch, run="r").raise_for_status()
        run_fenced_step(led, "p", "big-1", lambda r: [r.read("big.txt").write(_big(True))],
                        epoch=lease.epoch, run="r").raise_for_status()
        led.workspaces.release("p", lease.epoch)
        led.workspaces.fork("p", "edit-03", b.root / "fk", name=FORK)
        (b.root / "forged").mkdir()
        (b.root / "forged" / "x.txt").write_text("x\n")
        led.workspaces.add("forged", str(b.root / "forged"))
        led.workspaces.observe("forged", by=f"fork:{ui_corpus.STEP}@3", label=LABEL)
        led.hold(ui_corpus.RUN, reason=REASON, by=HOLDER)
        led.hold("edit-02", scope="step", reason="the step's own", by="reviewer")
        led.hold("r", reason="released since", by="x")
        led.release_hold("r")
    return b


def _client(path: Path) -> TestClient:
    app = create_app(str(path), token=TOKEN, port=PORT, verify=False)
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}{app.prefix}/",
                      follow_redirects=False)


@pytest.fixture(scope="module")
def client(built: Built) -> Iterator[TestClient]:
    with _client(built.ledger) as c:
        assert c.get(f"/?token={TOKEN}").status_code == 303
        yield c


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _inert(c: TestClient, page: str, where: str) -> None:
    """No planted markup or raw control character; no script but ours; no handler."""
    p = _Page()
    p.feed(page)
    prefix = c.app.prefix  # type: ignore[attr-defined]
    assert all(a.get("src") == f"{prefix}/static/ui.js" for t, a in p.tags if t == "script"), where
    assert not [(t, k) for t, a in p.tags for k in a if k.lower().startswith("on")], where
    assert not [t for t, _ in p.tags if t in ("img", "iframe", "object", "embed")], where
    for raw in ui_corpus.RAW:
        assert raw not in page, (where, raw)


def _links(c: TestClient, page: str) -> list[str]:
    prefix = c.app.prefix  # type: ignore[attr-defined]
    p = _Page()
    p.feed(page)
    out = []
    for t, a in p.tags:
        href = a.get("href")
        if t == "a" and href:
            assert href.startswith(prefix + "/"), href
            out.append(href[len(prefix):])
    return out


def _seqs(page: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr class="(?:observed|step)" id="seq-(\d+)"', page)]


# -- the timeline ------------------------------------------------------------------------------


def test_the_timeline_marks_each_observation_outside_the_steps(client: TestClient) -> None:
    page = client.get("/timeline?ws=p").text
    seqs = _seqs(page)
    assert len(seqs) == PAGE and seqs == sorted(seqs)  # a page, in sequence order
    rows = re.findall(r'<tr class="(observed|step)" id="seq-\d+">(.*?)</tr>', page, re.S)
    kinds = [k for k, _ in rows]
    # the baseline first, the hostile step, the long file's, then the edit by hand
    assert kinds[:4] == ["observed", "step", "step", "observed"], kinds[:6]
    assert kinds.count("observed") == 2
    base, by_hand = rows[0][1], rows[3][1]
    for row in (base, by_hand):
        assert "observation · outside the steps" in row and "asked by" in row
    assert "baseline" in base and "cli:me@host" in base
    assert "not-a-file" in base and "&#34;&gt;&lt;img src=x onerror=" in base  # left out
    # the label and who asked: as text, escaped, their control characters made visible
    assert "&lt;script&gt;document.title" in by_hand and "\\x07" in by_hand
    assert "\\u202e" in by_hand
    assert str(escape(ASKED)) in by_hand
    assert all("outside the steps" not in r for k, r in rows if k == "step")
    assert "&lt;b&gt;" in rows[1][1]  # the holder of the step's lease, escaped
    # each row: the files as of it, and a rewind's preview to it
    assert page.count('class="rewind"') == PAGE
    links = _links(client, page)
    assert url("/rewind", ws="p", step=ui_corpus.STEP) in links
    assert url("/rewind", ws="p", step="edit-00") in links
    _inert(client, page, "timeline")


def test_the_timeline_pages_forward_and_back(client: TestClient, built: Built) -> None:
    first = client.get("/timeline?ws=p").text
    assert "← earlier" not in first
    later = [h for h in _links(client, first) if "after=" in h and h.startswith("/timeline")]
    assert len(later) == 1
    second = client.get(later[0]).text
    s1, s2 = _seqs(first), _seqs(second)
    assert s2 and min(s2) > max(s1) and s2 == sorted(s2)
    assert "edit-54" in second and "big-1" in second  # the last steps
    back = url("/timeline", ws="p", before=s2[0])
    assert back in _links(client, second) and "← earlier" in second
    assert _seqs(client.get(back).text) == s1  # the page before it: the first page
    latest = client.get(url("/timeline", ws="p", before=10**6)).text
    assert _seqs(latest)[-1] == s2[-1] and len(_seqs(latest)) == PAGE
    assert not [h for h in _links(client, latest) if "after=" in h]  # nothing later
    back_one = client.get(url("/timeline", ws="p", before=s2[-1])).text
    assert _seqs(back_one)[-1] == s2[-2]
    assert url("/timeline", ws="p", after=s2[-2]) in _links(client, back_one)
    older = [h for h in _links(client, latest) if "before=" in h and "earlier" in h]
    assert not older or _seqs(client.get(older[0]).text)[-1] < _seqs(latest)[0]
    for bad in ("/timeline", "/timeline?ws=p&before=x", "/timeline?ws=p&after=3&before=9",
                "/timeline?ws=p&before=0"):
        assert client.get(bad).status_code == 400, bad
    for unknown in ("/timeline?ws=nope", url("/timeline", ws=ui_corpus.STEP),
                    "/timeline?ws=a%07b", url("/timeline", ws="w" * 300)):
        r = client.get(unknown)
        assert r.status_code == 404, unknown
        _inert(client, r.text, unknown)


def test_the_workspace_page_and_the_overview_link_the_timeline(client: TestClient) -> None:
    assert url("/timeline", ws="p") in _links(client, client.get("/workspace?name=p").text)
    overview = client.get("/").text
    assert url("/timeline", ws="p") in _links(client, overview)
    assert url("/timeline", ws=FORK) in _links(client, overview)


# -- the rewind's preview -----------------------------------------------------------------


def _tree(root: Path) -> dict[str, tuple[bytes | str, int, int]]:
    """Every entry under `root`: its bytes (a link's target), mode and mtime."""
    out: dict[str, tuple[bytes | str, int, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            body: bytes | str = (os.readlink(p) if p.is_symlink() else
                                 b"" if p.is_dir() else p.read_bytes())
            out[str(p.relative_to(root))] = (body, st.st_mode, st.st_mtime_ns)
    return out


def test_the_preview_writes_nothing(built: Built) -> None:
    """Opening every preview the timeline links, and their pages, leaves the ledger's
    events, its file's bytes and the workspace's files as they were; no rewind step."""
    with Ledger.open(str(built.ledger)):
        pass  # checkpointed and closed
    digest = hashlib.sha256(built.ledger.read_bytes()).hexdigest()
    with Ledger.open(str(built.ledger), readonly=True) as led:
        head = led.head()
        events = sum(1 for _ in led.read())
    tree = _tree(built.ws)
    with _client(built.ledger) as c:
        c.get(f"/?token={TOKEN}")
        seen = 0
        for timeline in ("/timeline?ws=p", url("/timeline", ws="p", before=10**6)):
            for link in _links(c, c.get(timeline).text):
                if link.startswith("/rewind"):
                    r = c.get(link)
                    assert r.status_code == 200, (link, r.text[:300])
                    for more in _links(c, r.text):
                        if more.startswith("/rewind"):
                            assert c.get(more).status_code == 200
                    seen += 1
        assert seen >= PAGE
    with Ledger.open(str(built.ledger), readonly=True) as led:
        assert led.head() == head and sum(1 for _ in led.read()) == events
        assert not list(led.read(kind="planned", run="rewind"))
    assert hashlib.sha256(built.ledger.read_bytes()).hexdigest() == digest
    assert _tree(built.ws) == tree


def test_the_preview_pages_its_changes_and_cuts_a_long_diff(client: TestClient,
                                                            built: Built) -> None:
    page = client.get(url("/rewind", ws="p", seq=built.before_many)).text
    total = MANY + 1  # the files `many` created go; big.txt goes back
    assert f"{total} change(s)" in page and f"{MANY} removed (D)" in page
    assert page.count('<div class="write change') == REWIND_PAGE
    assert f"Changes 1–{REWIND_PAGE} of {total}" in page
    more = [h for h in _links(client, page) if "start=" in h]
    assert more == [url("/rewind", ws="p", seq=built.before_many, start=REWIND_PAGE)]
    rest = client.get(more[0]).text
    assert rest.count('<div class="write change') == total - REWIND_PAGE
    assert "← earlier changes" in rest
    assert client.get(url("/rewind", ws="p", seq=built.before_many,
                          start=total)).status_code == 400
    # big.txt: restored (M), its diff cut at what a page shows of one file, said so
    big = client.get(url("/rewind", ws="p", seq=built.before_many, path="big.txt")).text
    assert "1 change(s): 1 restored (M)" in big
    diff = big[big.index('<pre class="diff">'):big.index("</pre>")]
    assert diff.count("\n") <= ui_text.DIFF_LINES_MAX + 2
    assert "not compared" in diff or "more diff lines not shown" in diff
    assert "--path big.txt" in big  # the command names the path too


def test_the_preview_shows_the_command_shell_quoted(client: TestClient, built: Built) -> None:
    page = client.get(url("/rewind", ws="p", step=ui_corpus.STEP)).text
    _inert(client, page, "rewind to the hostile step")
    command = re.search(r'<code class="command" id="rewind-command">(.*?)</code>', page).group(1)
    assert shlex.split(html.unescape(command)) == [
        "steptrail", "--ledger", str(built.ledger), "--workspace", "p", "rewind", "--to",
        ui_corpus.STEP]
    preview = client.get(url("/rewind", ws="p", seq=7)).text
    assert "rewind --to &#39;#7&#39; --preview" in preview
    # a step id the command line would read as a seq is named by its seq
    assert ui_text.command("rewind", "--to", "#12") == "rewind --to '#12'"


@pytest.mark.parametrize("word", [
    "plain", "two words", "it's", "$HOME `id` \\ \"q\"", "-starts-with-dash", "#3", "=cmd",
    "~user", "bell\x07", "rtl\u202eoverride", "c1\x85control", "tag\U000e0041", "a'b\u200bc\\",
    "ünïcödé", "",
])
def test_a_shell_word_reads_back_as_itself(word: str) -> None:
    """What the page shows, pasted into bash, is the word: quoted, and never anything
    invisible (`visible` leaves a quoted word as it is)."""
    quoted = ui_text.shell_quote(word)
    assert ui_text.visible(quoted) == quoted
    done = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True,
                          env={"LC_ALL": "C.UTF-8", "PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0 and done.stdout.decode("utf-8") == word, (word, quoted)


def test_an_unobserved_edit_is_named_with_the_command_that_records_it(
        tmp_path: Path) -> None:
    ws = tmp_path / "w"
    ws.mkdir()
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        lease = led.workspaces.acquire("w", holder="agent", ttl_s=600)
        for i in (1, 2):
            run_fenced_step(led, "w", f"s{i}", lambda r, i=i: [
                r.read("a.txt").write(f"v{i}\n".encode())], epoch=lease.epoch)
    (ws / "a.txt").write_text("a person's edit\n")
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get("/rewind?ws=w&step=s1").text
        assert "would be refused whole" in page and "<code>a.txt</code>" in page
        assert f"steptrail --ledger {path} --workspace w observe" in page
    assert (ws / "a.txt").read_text() == "a person's edit\n"


def test_the_preview_says_what_goes_first_where_a_file_and_a_directory_traded_places(
        tmp_path: Path) -> None:
    ws = tmp_path / "w"
    ws.mkdir()
    path = tmp_path / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(ws))
        lease = led.workspaces.acquire("w", holder="agent", ttl_s=600)
        run_fenced_step(led, "w", "s1", lambda r: [r.read("<b>").write(b"a file\n")],
                        epoch=lease.epoch).raise_for_status()
        run_fenced_step(led, "w", "s2", lambda r: [r.read("<b>").write(None)],
                        epoch=lease.epoch).raise_for_status()
        run_fenced_step(led, "w", "s3", lambda r: [r.read("<b>/x").write(b"in a dir\n")],
                        epoch=lease.epoch).raise_for_status()
    with _client(path) as c:
        c.get(f"/?token={TOKEN}")
        page = c.get(url("/rewind", ws="w", step="s1")).text
        assert 'id="clears"' in page and "<code>&lt;b&gt;/x</code>" in page
        assert "<b>/x" not in page
    assert (ws / "<b>" / "x").read_bytes() == b"in a dir\n"  # a preview writes nothing


def test_the_preview_refuses_what_it_cannot_preview(client: TestClient) -> None:
    for bad in ("/rewind?ws=p", "/rewind?ws=p&step=edit-01&seq=3", "/rewind?ws=p&seq=x",
                "/rewind?ws=p&seq=99999999", "/rewind?ws=p&seq=3&path=../x",
                "/rewind?ws=p&seq=3&path=a%07b", "/rewind?ws=p&seq=3&start=-1",
                "/rewind?ws=p&seq=3&" + "&".join(["path=a"] * (REWIND_PATHS_MAX + 1))):
        r = client.get(bad)
        assert r.status_code == 400, (bad, r.status_code)
        _inert(client, r.text, bad)
    for unknown in ("/rewind?ws=nope&seq=3", url("/rewind", ws="p", step="<script>x"),
                    "/rewind?ws=p&step=a%07b", url("/rewind", ws="p", step="\u202eevil"),
                    url("/rewind", ws="p", step="s" * 300), url("/rewind", ws="p", step="nope"),
                    url("/rewind", ws=ui_corpus.RUN, seq=3)):
        r = client.get(unknown)
        assert r.status_code == 404, (unknown, r.status_code)
        _inert(client, r.text, unknown)
    assert "\\u202eevil" in client.get(url("/rewind", ws="p", step="\u202eevil")).text
    # a hostile path the rewind may take: named as text, in the page and its command
    r = client.get(url("/rewind", ws="p", seq=3, path=ui_corpus.NAME))
    assert r.status_code == 200
    _inert(client, r.text, "a hostile path")
    assert "&lt;img src=x onerror=" in r.text


# -- lineage and holds ------------------------------------------------------------------------


def test_a_fork_names_its_origin_and_the_origin_its_forks(client: TestClient,
                                                          built: Built) -> None:
    fork = client.get(url("/workspace", name=FORK)).text
    lineage = re.search(r'<dd class="lineage">(.*?)</dd>', fork, re.S).group(1)
    with Ledger.open(str(built.ledger), readonly=True) as led:
        seq = next(r.seq for r in led.read(step="edit-03", kind="fenced"))
    prefix = client.app.prefix  # type: ignore[attr-defined]
    assert f'forked from <a href="{prefix}/workspace?name=p">p</a>' in lineage
    assert f"#{seq}</a>" in lineage and "step <a class=\"step\"" in lineage
    assert "edit-03" in lineage
    _inert(client, fork, "the fork")
    origin = client.get("/workspace?name=p").text
    forks = re.search(r'<dd class="forks">(.*?)</dd>', origin, re.S).group(1)
    assert url("/workspace", name=FORK) in _links(client, forks) and f"(as of #{seq})" in forks
    assert "&lt;img src=x" in forks
    assert "lineage" not in re.search(r'<dl class="facts">(.*?)</dl>', origin, re.S).group(1)
    # a baseline that names an origin by hand: shown as it says, escaped
    forged = client.get("/workspace?name=forged").text
    _inert(client, forged, "forged lineage")
    assert "forked from" in forged and "&lt;script&gt;document.title" in forged
    assert origin_of("w", "fork:a@b@12", "forked … (#123)", 9).seq == 123  # the label's whole
    assert origin_of("w", "fork:a@b@12", "", 9).source == "a@b"
    assert origin_of("w", "cli:me", "", 9) is None and origin_of("w", "fork:x@", "", 9) is None


def test_holds_are_shown_where_they_apply(client: TestClient) -> None:
    overview = client.get("/").text
    table = re.search(r'<table class="holds">(.*?)</table>', overview, re.S).group(1)
    assert table.count("<tr><td>") == 2 and "released since" not in table  # released
    assert "&lt;/td&gt;&lt;script&gt;" in table and "\\x07" in table
    assert "reviewer" in table and "the step&#39;s own" in table
    _inert(client, overview, "overview")
    run = client.get(url("/run", id=ui_corpus.RUN)).text
    assert 'id="holds"' in run and "&lt;/td&gt;&lt;script&gt;" in run
    _inert(client, run, "held run")
    step = client.get("/step?id=edit-02").text
    assert 'id="holds"' in step and "the step&#39;s own" in step and "reviewer" in step
    assert 'id="holds"' in client.get(url("/step", id=ui_corpus.STEP)).text  # its run's
    assert 'id="holds"' not in client.get("/step?id=edit-01").text
    run = client.get("/run?id=r").text  # its run's hold was released; its step's is held
    held = run[run.index('id="holds"'):run.index("</div>", run.index('id="holds"'))]
    assert "edit-02" in held and "released since" not in held


def test_every_time_travel_page_runs_no_planted_script(client: TestClient) -> None:
    """Every page reachable from the timelines of `p`, the fork and the forged lineage
    (their previews, diffs, trees, histories) answers and is inert."""
    todo = ["/timeline?ws=p", url("/timeline", ws=FORK), "/timeline?ws=forged",
            url("/workspace", name=FORK), "/"]
    seen: set[str] = set()
    while todo and len(seen) < 200:
        link = todo.pop(0)  # breadth first: every timeline's rows before what they link
        if link in seen or link.startswith(("/download", "/static", "/events", "/run",
                                            "/runs", "/stats", "/search")):
            continue
        seen.add(link)
        r = client.get(link)
        assert r.status_code in (200, 404), (link, r.status_code)
        if r.headers["content-type"].startswith("text/html"):
            _inert(client, r.text, link)
            if link == "/" or link.startswith(("/timeline", "/rewind", "/workspace")):
                todo.extend(h for h in _links(client, r.text) if h not in seen)
    assert sum(1 for s in seen if s.startswith("/rewind")) > PAGE
    assert any(s.startswith("/diff") or s.startswith("/history") for s in seen)

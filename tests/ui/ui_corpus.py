"""A ledger planted with hostile names and contents, for the UI's tests (tests/ui/test_ui.py,
tests/ui/test_ui_browser.py): every string the library admits that a careless page would
run as script or let act on the page."""

from __future__ import annotations

import os
from pathlib import Path

from ledger import Ledger, run_fenced_step
from ledger.runner import run_step

#: Markers of script that must never run: a page that ran any of them set the title
#: or a global the browser test reads.
PWN = "document.title='pwned';window.__pwned=1"
STEP = f"<script>{PWN}</script>"
RUN = f'"><img src=x onerror="{PWN}">'
NAME = f'"><img src=x onerror="{PWN}">.txt'
NAME2 = "<svg onload=alert(1)>.py"
CONTENT = (f"<script>{PWN}</script>\n"
           f'"><img src=x onerror="{PWN}">\n'
           "bell \x07 escape \x1b[31m red, right-to-left \u202e override\n").encode() + \
    b"not utf-8: \xff\xfe\xc3\x28 end\n"
REASON = f"undo </pre><script>{PWN}</script> bell \x07 nul-less"
HTML_ARTIFACT = f"<html><body><script>{PWN}</script>hi</body></html>".encode()
#: What must never appear in a served page as is.
RAW = ("<script>document", "<img src=x", "<svg onload", "\x07", "\x1b", "\u202e")


def build(root: Path) -> Path:
    """A ledger at root/.steptrail/ledger.db with a workspace `w` (root/w) the hostile
    steps wrote; returns the ledger's path."""
    repo = root / "w"
    repo.mkdir(parents=True)
    (repo / "plain.txt").write_text("one\ntwo\n")
    path = root / ".steptrail" / "ledger.db"
    with Ledger.init(str(path)) as led:
        led.workspaces.add("w", str(repo))
        epoch = led.workspaces.acquire("w", holder=f"<b>{RUN}</b>", ttl_s=3600).epoch
        run_fenced_step(led, "w", "plain-1", lambda r: [r.read("plain.txt").write(b"one\n2\n")],
                        epoch=epoch, run="plain")
        run_fenced_step(led, "w", STEP, lambda r: [r.read(NAME).write(CONTENT),
                                                   r.read(NAME2).write(b"\x00\x01binary\xff"),
                                                   r.read("plain.txt").write(CONTENT)],
                        epoch=epoch, run=RUN)
        run_fenced_step(led, "w", "undone-1", lambda r: [r.read("plain.txt").write(b"x\n")],
                        epoch=epoch, run=RUN)
        led.workspaces.compensate("undone-1", reason=REASON, epoch=epoch)

        def clash(r):  # type: ignore[no-untyped-def]
            got = r.read(NAME)
            (repo / NAME).write_bytes(b"a person's edit\n")
            return [got.write(b"late\n")]

        run_fenced_step(led, "w", "refused-1", clash, epoch=epoch, run=RUN)
        run_step(led, "art-1", {"evil.html": HTML_ARTIFACT, NAME: CONTENT}, run=RUN)
        for i in range(130):  # enough for the pages to paginate
            run_step(led, f"bulk-{i:03d}", {"r.txt": f"{i}\n".encode()}, run="bulk")
    os.sync()
    return path

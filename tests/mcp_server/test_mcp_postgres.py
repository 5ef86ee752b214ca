"""`steptrail mcp` over a ledger in PostgreSQL: two servers — standing in for two
machines, each its own connection — share one workspace's ledger by URL; a write is a
fenced step whichever server makes it, a conflict is refused, undo works, and the
ledger verifies from the database alone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio

from mcp_agents import inprocess, repo  # noqa: F401 - the fixture

from ledger import Ledger


def test_two_servers_share_a_postgresql_ledger(repo: Path, pg_url: str) -> None:  # noqa: F811
    app = repo / "src" / "app.py"

    async def go() -> None:
        async with inprocess([str(repo)], pg_url) as a, inprocess([str(repo)], pg_url) as b:
            read = await a.ok("read_text_file", path="src/app.py")
            assert read["hash"] == hashlib.sha256(app.read_bytes()).hexdigest()
            edit = await a.ok("edit_file", path="src/app.py", requestId="a-1",
                              edits=[{"oldText": 'print("v0")', "newText": 'print("v1")'}])
            assert edit["status"] == "applied"
            # b read nothing yet: its write of the same file is read first, never blind
            stale = await b.ok("read_text_file", path="src/app.py")
            assert 'print("v1")' in stale["content"]
            again = await b.ok("edit_file", path="src/app.py", requestId="b-1",
                               edits=[{"oldText": 'print("v1")', "newText": 'print("v2")'}])
            assert again["status"] == "applied"
            await a.ok("read_text_file", path="src/app.py")  # a reads b's v2 ...
            app.write_text('def main():\n    print("person")\n')  # ... a person edits it
            conflict = await a.fails("edit_file", path="src/app.py", requestId="a-2",
                                     edits=[{"oldText": 'print("v2")', "newText": "x"}])
            assert conflict.structured_content["status"] == "conflict", conflict.structured_content
            assert app.read_text() == 'def main():\n    print("person")\n'
            history = await b.ok("history")
            assert len(history["steps"]) >= 2

    anyio.run(go)
    with Ledger.open(pg_url, readonly=True) as led:
        report = led.verify()
        assert report.ok, report.findings
        assert {s.state for s in led.steps()} >= {"acked"}
    assert not (repo / ".steptrail").exists()  # the ledger is in the database, not here

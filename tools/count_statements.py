"""The statements one operation sends to its store, counted: an append of one event, a
batch of 100, `run_step` (an inline artifact, one commit) and `run_fenced_step` (one
write and an inline artifact), on SQLite and, with a PostgreSQL server, on PostgreSQL.

    .venv/bin/python tools/count_statements.py              # SQLite, and PostgreSQL on a
                                                            # throwaway server if it starts
    .venv/bin/python tools/count_statements.py --stores sqlite --list
    .venv/bin/python tools/count_statements.py --url postgresql://u@host/db --json

Each step runs after warm-up steps on the same ledger (caches as a long-running writer
has them). SQLite's statements are what apsw's exec trace sees (every statement,
BEGIN and COMMIT included); PostgreSQL's are the driver's calls (`execute`, and each
statement of an `executemany`) — without pipeline mode, each call is one round trip to
the server; a write the transaction held for its next round trip is sent in that
round trip's text (statements separated by ``;``), so PostgreSQL's count is its round
trips. `--list` prints the first words of each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")) 

from ledger import Ledger  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from count_pages import WORKS  # noqa: E402  (the operations: tools/count_pages.py)

#: A COMMIT, alone or ending a text of several statements (PostgreSQL: the writes a
#: transaction held go with its COMMIT, one round trip).
COMMIT = re.compile(r"(^|;)\s*COMMIT$")


@contextlib.contextmanager
def sqlite_trace(led: Ledger, seen: list[str]) -> Iterator[None]:
    conn = led.storage.db.conn  # type: ignore[attr-defined]

    def trace(_cur: Any, sql: str, _bindings: Any) -> bool:
        seen.append(" ".join(sql.split()))
        return True

    conn.exec_trace = trace
    try:
        yield
    finally:
        conn.exec_trace = None


@contextlib.contextmanager
def pg_trace(_led: Ledger, seen: list[str]) -> Iterator[None]:
    import psycopg

    real_execute, real_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
    real_conn_execute = psycopg.Connection.execute

    def execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        seen.append(" ".join(str(query if isinstance(query, str) else query.as_string(self))
                             .split()))
        return real_execute(self, query, *a, **k)

    def executemany(self: Any, query: Any, params: Any, *a: Any, **k: Any) -> Any:
        params = list(params)
        text = " ".join(str(query if isinstance(query, str) else query.as_string(self)).split())
        seen.extend([f"(many) {text}"] * len(params))
        return real_many(self, query, params, *a, **k)

    def conn_execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        # Connection.execute makes a cursor and calls Cursor.execute: counted there
        return real_conn_execute(self, query, *a, **k)

    psycopg.Cursor.execute, psycopg.Cursor.executemany = execute, executemany  # type: ignore[method-assign]
    psycopg.Connection.execute = conn_execute  # type: ignore[method-assign]
    try:
        yield
    finally:
        psycopg.Cursor.execute, psycopg.Cursor.executemany = real_execute, real_many  # type: ignore[method-assign]
        psycopg.Connection.execute = real_conn_execute  # type: ignore[method-assign]


def with_schema(url: str, schema: str) -> str:
    """`url` with its search path set to `schema` (made first): one schema a work."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def count(location: str, tracer: Callable[..., Any], work: str) -> list[str]:
    from count_pages import workload  # the same operations, written once

    root = tempfile.mkdtemp(prefix="count-statements-")
    with Ledger.init(location) as led:
        one = workload(led, root, work, 3)
        for k in range(5):
            one(k)
        seen: list[str] = []
        with tracer(led, seen):
            one(5)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--url", help="a postgresql:// database (default: a throwaway server)")
    ap.add_argument("--list", action="store_true", help="print every statement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    server = None
    out: dict[str, dict[str, Any]] = {}
    try:
        for store in args.stores.split(","):
            tracer = sqlite_trace if store == "sqlite" else pg_trace
            if store == "postgres" and not args.url:
                from ledger.testing.pgserver import PgServer

                server = PgServer.start(None)
            for work in WORKS:
                if store == "sqlite":
                    location = os.path.join(tempfile.mkdtemp(), "ledger.db")
                elif args.url:
                    location = with_schema(args.url, f"count_{work.replace('-', '_')}")
                else:
                    location = server.create_database(f"count_{work.replace('-', '_')}")
                seen = count(location, tracer, work)
                out.setdefault(store, {})[work] = {
                    "statements": len(seen), "commits": sum(bool(COMMIT.search(s)) for s in seen),
                    "list": seen}
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for store, works in out.items():
        for work, got in works.items():
            what = "round trips" if store == "postgres" else "statements"
            print(f"{store:9} {work:16} {got['statements']:4} {what}, {got['commits']} commits")
            if args.list:
                for s in got["list"]:
                    print(f"    {s[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

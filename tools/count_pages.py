"""The pages one operation makes durable, counted and named: what a commit of an append,
a batch of 100, `run_step` and `run_fenced_step` writes to the write-ahead log, by table
and index, on SQLite and, with a PostgreSQL server, on PostgreSQL.

    .venv/bin/python tools/count_pages.py              # SQLite, and PostgreSQL on a
                                                       # throwaway server if it starts
    .venv/bin/python tools/count_pages.py --stores sqlite --ops 50
    .venv/bin/python tools/count_pages.py --url postgresql://u@host/db --json

The same operations as tools/count_statements.py (one write of `--size` bytes and an
inline artifact for a fenced step), each after warm-up steps on the same ledger, then
`--ops` of them measured; every figure is per operation.

- SQLite: the WAL frames each commit appends (the WAL hook's count; the ledger's own
  checkpoints are held off while measuring, so no frame is lost to a restart), each
  frame's page number read from the WAL file and named by the b-tree that owns it
  (``dbstat``): a table, an index, ``(page 1)`` (the file header: the database grew) or
  ``(free)`` (a page on the free list by the end). A frame is a page size plus 24 bytes
  written and fsynced.
- PostgreSQL: the WAL bytes between the insert positions before and after, and each
  record's block references read back with ``pg_walinspect`` (an extension of
  PostgreSQL 15, created in the measured database; the user must be allowed to), named
  by relation: the blocks each transaction changed (a block once a transaction, as a
  SQLite page once a commit), and the records and bytes (full-page images included). Other sessions' records in the same interval
  (autovacuum) are counted too: the throwaway server runs nothing else.

Say under what load the figures were taken: they do not depend on it (no timing).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import apsw  # noqa: E402

from ledger import Ledger, Planned, run_fenced_step  # noqa: E402
from ledger.runner import run_step  # noqa: E402

#: append: one `planned` event; bulk-100: `append_batch` of 100; run_step: a step with
#: one 4 KiB inline artifact; run_fenced_step: one write and an inline artifact.
WORKS = ("append", "bulk-100", "run_step", "run_fenced_step")
WAL_HEADER, FRAME_HEADER = 32, 24


def workload(led: Ledger, root: str, work: str, size: int) -> Callable[[int], None]:
    """One operation of `work` on `led` (a workspace under `root` for fenced steps)."""
    wsdir = os.path.join(root, "ws")
    os.makedirs(wsdir, exist_ok=True)
    with open(os.path.join(wsdir, "app.py"), "wb") as f:
        f.write(b"v0\n")
    led.workspaces.add("w", wsdir)
    epoch = led.workspaces.acquire("w", "counter", ttl_s=3600).epoch
    result = os.urandom(4096)

    def one(k: int) -> None:
        if work == "append":
            led.append(Planned(step=f"a{k}", attempt=1))
        elif work == "bulk-100":
            led.append_batch([Planned(step=f"b{k}/{i:03d}", attempt=1) for i in range(100)])
        elif work == "run_step":
            run_step(led, f"s{k}", {"result.bin": result})
        else:
            body = (b"%d\n" % k).ljust(size, b"x")
            out = run_fenced_step(
                led, "w", f"f{k}", lambda read: [read.read("app.py").write(body)],
                epoch=epoch, artifacts={"out/log.txt": b"log %d\n" % k})
            assert out.status == "applied", out

    return one


# -- SQLite: WAL frames, named by b-tree ------------------------------------------------


@contextlib.contextmanager
def sqlite_frames(led: Ledger, out: dict[str, Any], _location: str) -> Iterator[None]:
    """Count the WAL frames every commit inside appends, and name their pages."""
    db = led.storage.db  # type: ignore[attr-defined]
    conn: apsw.Connection = db.conn
    page_size = int(conn.execute("PRAGMA page_size").fetchall()[0][0])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL starts empty
    wal = db.path + "-wal"
    commits: list[list[int]] = []
    last = [0]

    def hook(_conn: apsw.Connection, _name: str, pages: int) -> int:
        start = last[0] if pages >= last[0] else 0
        with open(wal, "rb") as f:
            pgnos = []
            for i in range(start, pages):
                f.seek(WAL_HEADER + i * (page_size + FRAME_HEADER))
                pgnos.append(struct.unpack(">I", f.read(4))[0])
        commits.append(pgnos)
        last[0] = pages
        return apsw.SQLITE_OK

    conn.set_wal_hook(hook)  # (replaces the ledger's checkpoint policy while measuring)
    try:
        yield
    finally:
        conn.set_wal_hook(db._wal_hook)  # the policy back
    owner = {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}
    by: collections.Counter[str] = collections.Counter()
    for pgnos in commits:
        for p in pgnos:
            by["(page 1)" if p == 1 else owner.get(p, "(free)")] += 1
    out.update(commits=len(commits), frames=sum(len(c) for c in commits),
               page_size=page_size, by=dict(by))


# -- PostgreSQL: WAL bytes and blocks, named by relation ----------------------------------


def pg_admin(url: str) -> Any:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    return conn


_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)(?: fork (\w+))? blk (\d+)")


@contextlib.contextmanager
def pg_wal(led: Ledger, out: dict[str, Any], url: str) -> Iterator[None]:
    admin = pg_admin(url)
    try:
        start = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        yield
        end = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        rows = admin.execute(
            "SELECT xid, resource_manager, record_type, record_length, fpi_length, block_ref"
            " FROM pg_get_wal_records_info(%s, %s)", (start, end)).fetchall()
        names = dict(admin.execute(
            "SELECT pg_relation_filenode(c.oid)::bigint, c.relname FROM pg_class c"
            " WHERE pg_relation_filenode(c.oid) IS NOT NULL").fetchall())
        wal_bytes = admin.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, start)).fetchone()[0]
    finally:
        admin.close()
    # a block counts once in each transaction that changed it (as a SQLite page once in
    # each commit's frames)
    blocks: dict[str, set[tuple[Any, str, int]]] = collections.defaultdict(set)
    fpi = 0
    commits = 0
    for xid, rmgr, rtype, _length, fpi_len, refs in rows:
        fpi += fpi_len or 0
        if rmgr == "Transaction" and str(rtype).startswith("COMMIT"):
            commits += 1
        for m in _BLOCK.finditer(refs or ""):
            name = names.get(int(m.group(3)), f"(relfilenode {m.group(3)})")
            blocks[name].add((xid, m.group(4) or "main", int(m.group(5))))
    out.update(commits=commits, records=len(rows), wal_bytes=int(wal_bytes), fpi_bytes=fpi,
               frames=sum(len(b) for b in blocks.values()),
               by={k: len(v) for k, v in blocks.items()})


def measure(location: str, observer: Callable[..., Any], work: str, size: int, ops: int
            ) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="count-pages-")
    with Ledger.init(location) as led:
        one = workload(led, root, work, size)
        for k in range(5):
            one(k)
        got: dict[str, Any] = {}
        with observer(led, got, location):
            for k in range(5, 5 + ops):
                one(k)
    per = {k: round(v / ops, 2) for k, v in got.pop("by").items()}
    out = {k: (round(v / ops, 2) if k not in ("page_size",) else v) for k, v in got.items()}
    out["by"] = dict(sorted(per.items(), key=lambda kv: -kv[1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--url", help="a postgresql:// database (default: a throwaway server)")
    ap.add_argument("--ops", type=int, default=20, help="operations measured (default 20)")
    ap.add_argument("--size", type=int, default=1024,
                    help="bytes of a fenced step's write (default 1024)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    server = None
    out: dict[str, dict[str, Any]] = {}
    try:
        for store in args.stores.split(","):
            if store == "postgres" and not args.url:
                from ledger.testing.pgserver import PgServer

                server = PgServer.start(None)
            for work in WORKS:
                name = f"pages_{work.replace('-', '_')}"
                if store == "sqlite":
                    location = os.path.join(tempfile.mkdtemp(), "ledger.db")
                    observer: Callable[..., Any] = sqlite_frames
                elif args.url:
                    from count_statements import with_schema

                    location, observer = with_schema(args.url, name), pg_wal
                else:
                    location, observer = server.create_database(name), pg_wal
                out.setdefault(store, {})[work] = measure(location, observer, work,
                                                          args.size, args.ops)
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for store, works in out.items():
        unit = "WAL frames" if store == "sqlite" else "blocks in WAL"
        for work, got in works.items():
            extra = (f", {got['wal_bytes']:,.0f} WAL bytes ({got['fpi_bytes']:,.0f} full-page"
                     f" images), {got['records']} records" if store == "postgres" else
                     f" of {got['page_size']} bytes")
            print(f"{store:9} {work:16} {got['frames']:6.1f} {unit} an operation in"
                  f" {got['commits']} commits{extra}")
            for k, v in got["by"].items():
                print(f"{'':28}{v:6.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Whether the COMMIT's flush is what binds PostgreSQL writers: `tools/bench_stores.py`
run twice on one throwaway server, once with ``synchronous_commit=on`` (the default: a
COMMIT waits for its WAL flush, with the chain lock held) and once with
``synchronous_commit=off`` (no COMMIT waits for a flush: what any design releasing the
chain lock before the flush could reach at best, and more — nothing waits for the disk
at all).

    .venv/bin/python tools/bench_pg_flush.py                 # 1 and 4 writers, 2 rounds of 2 s
    .venv/bin/python tools/bench_pg_flush.py --writers 1,4,16 --rounds 3 --seconds 3

If steps/s and the chain lock's hold barely move with the flush gone, the flush is not
what serializes the writers: what runs under the lock (the client's work between taking
it and COMMIT) and the machine's CPUs are. The ``off`` run is a measurement only: the
library never runs with it (an acknowledged write must survive a crash).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", default="1,4")
    ap.add_argument("--rounds", default="2")
    ap.add_argument("--seconds", default="2")
    ap.add_argument("--dir", default=None, help="where the throwaway server's files go"
                    " (default: the system's temporary directory)")
    args = ap.parse_args()
    import psycopg

    from ledger.testing.pgserver import PgServer

    # (no --dir: the harness's own temporary directory, which it makes reachable to the
    # 'postgres' user a root run starts the server as — a clone inside a directory only
    # its owner can enter would not be)
    server = PgServer.start(args.dir)
    try:
        for mode in ("on", "off"):
            url = server.create_database(f"flush_{mode}")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"ALTER DATABASE flush_{mode} SET synchronous_commit = {mode}")
            print(f"=== synchronous_commit={mode}", flush=True)
            subprocess.run([sys.executable, os.path.join(HERE, "bench_stores.py"),
                            "--stores", "postgres", "--writers", args.writers,
                            "--rounds", args.rounds, "--seconds", args.seconds, "--url", url],
                           check=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

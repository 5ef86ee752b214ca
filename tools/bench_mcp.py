#!/usr/bin/env python3
"""Benchmark `steptrail mcp`'s fenced writes against a plain MCP file server, over stdio.

Run from the repository root::

    .venv/bin/python tools/bench_mcp.py            # 1 and 4 clients, 300 calls each, 3 rounds
    .venv/bin/python tools/bench_mcp.py --quick    # 100 calls per client, 1 round
    .venv/bin/python tools/bench_mcp.py --json     # machine-readable results on stdout
    .venv/bin/python tools/bench_mcp.py --dir DIR  # scratch directories under DIR
    .venv/bin/python tools/bench_mcp.py --variant='--lease-turn 0'   # and steptrail with
                                                   # these options, in the same rounds

What is measured
----------------
Tool calls per second, end to end as an agent sees them: an `mcp.Client` (the official
SDK) sends ``tools/call`` over stdio to a server process it spawned and waits for the
answer. Each client alternates ``write_file`` (the whole file) and ``edit_file`` (one
replacement) on a file of its own, of about 1 KiB, after reading it once. With N
clients, N client tasks run at once in this process, each with its own server process
(as N agents would), all on one workspace; calls/s is every call of every client over
the wall time of the whole run.

* ``steptrail``: the installed ``steptrail mcp --workspace DIR``. Every call is a
  step: the workspace lease acquired (and released after), the plan admitted with its
  post-image stored, the fence checked and the file replaced (temporary file, fsync,
  rename, directory fsync), the manifest published, the ack — each a durable SQLite
  commit (WAL, ``synchronous=FULL``).
* ``plain``: this script as a minimal MCP server on the same SDK (``--serve-plain``):
  ``write_file`` writes a temporary file beside the target and renames it over it;
  ``edit_file`` reads, replaces, and writes the same way — what the reference filesystem
  server does, with no fsync, no history, no fence.

The ratio is steptrail / plain in the same run, same disk: the price of the ledger's
durability and fencing, per call, next to the protocol round trip. Each case runs
`--rounds` times, the two servers alternating, and the medians are compared (on a
shared machine a single round swings by a factor of two).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def serve_plain(root: str) -> None:
    """A minimal MCP file server: write_file and edit_file, plain atomic writes."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("plain", log_level="WARNING")
    base = os.path.realpath(root)

    def target(path: str) -> str:
        full = os.path.realpath(os.path.join(base, path))
        if not full.startswith(base + os.sep):
            raise ValueError(f"{path} is outside {base}")
        return full

    def put(full: str, content: str) -> None:
        tmp = f"{full}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(content)
        os.replace(tmp, full)

    @server.tool()
    def read_text_file(path: str) -> str:
        """Read a file."""
        with open(target(path)) as f:
            return f.read()

    @server.tool()
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        put(target(path), content)
        return f"Successfully wrote to {path}"

    @server.tool()
    def edit_file(path: str, edits: list[dict[str, str]]) -> str:
        """Edit a file."""
        full = target(path)
        with open(full) as f:
            text = f.read()
        for e in edits:
            if e["oldText"] not in text:
                raise ValueError("oldText not found")
            text = text.replace(e["oldText"], e["newText"], 1)
        put(full, text)
        return "ok"

    server.run("stdio")


def _steptrail() -> str:
    beside = Path(sys.executable).with_name("steptrail")
    return str(beside) if beside.exists() else (shutil.which("steptrail") or "steptrail")


async def _client(params: Any, name: str, calls: int, times: list[float],
                  errors: list[str], start: Any) -> None:
    import anyio
    from mcp import Client

    async with Client(params, read_timeout_seconds=120) as client:
        path = f"bench/{name}.txt"
        body = "x" * 1000
        r = await client.call_tool("write_file", {"path": path, "content": f"0\n{body}\n"})
        if r.is_error:
            errors.append(str(r.content))
        await client.call_tool("read_text_file", {"path": path})
        await start.wait()
        t0 = time.perf_counter()
        for i in range(1, calls + 1):
            if i % 2:
                args = {"path": path, "content": f"{i}\n{body}\n"}
                r = await client.call_tool("write_file", args)
            else:
                args = {"path": path, "edits": [{"oldText": f"{i - 1}\n", "newText": f"{i}\n"}]}
                r = await client.call_tool("edit_file", args)
            if r.is_error:
                errors.append(" ".join(getattr(b, "text", "") for b in r.content)[:200])
        times.append(time.perf_counter() - t0)
        await anyio.sleep(0)


async def _run(kind: str, workspace: Path, clients: int, calls: int,
               variant: list[str] | None = None) -> dict[str, Any]:
    import anyio
    from mcp import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
    if kind in ("steptrail", "variant"):
        extra = (variant or []) if kind == "variant" else []
        params = StdioServerParameters(command=_steptrail(),
                                       args=["mcp", "--workspace", str(workspace), *extra],
                                       env=env)
    else:
        params = StdioServerParameters(command=sys.executable,
                                       args=[__file__, "--serve-plain", str(workspace)], env=env)
    (workspace / "bench").mkdir(parents=True, exist_ok=True)
    times: list[float] = []
    errors: list[str] = []
    start = anyio.Event()

    async def one(n: int) -> None:
        await _client(params, f"{kind}-{n}", calls, times, errors, start)

    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(one, n)
        # every client connected and warmed up: then all start together
        while len(list((workspace / "bench").glob(f"{kind}-*.txt"))) < clients:
            await anyio.sleep(0.05)
        await anyio.sleep(1.0)
        t0 = time.perf_counter()
        start.set()
    wall = time.perf_counter() - t0
    total = clients * calls
    return {"kind": kind, "clients": clients, "calls": total, "seconds": wall,
            "calls_per_s": total / wall, "errors": len(errors),
            "first_error": errors[0] if errors else None,
            "per_client_calls_per_s": sorted(calls / t for t in times)}


def _fs(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()[-1].split()[1]
    except Exception:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 calls per client")
    parser.add_argument("--calls", type=int, help="calls per client (default 300)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, help="rounds per case, alternating the two"
                        " servers (default 3; --quick: 1); the medians are compared")
    parser.add_argument("--json", action="store_true", help="results as JSON on stdout")
    parser.add_argument("--dir", help="where the scratch workspaces go")
    parser.add_argument("--variant", metavar="ARGS",
                        help="also run steptrail mcp with these options (one string, e.g."
                        " '--lease-turn 0') in the same rounds, and print ours / it")
    parser.add_argument("--serve-plain", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_plain:
        serve_plain(args.serve_plain)
        return
    import anyio

    calls = args.calls or (100 if args.quick else 300)
    variant = shlex.split(args.variant) if args.variant else None
    rounds = args.rounds or (1 if args.quick else 3)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-mcp-") as tmp:
        for clients in args.clients:
            kinds = ("plain", "steptrail") + (("variant",) if variant else ())
            got: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for r in range(rounds):  # alternating, so a change of load hits every side
                for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                    ws = Path(tmp) / f"{kind}-{clients}-{r}"
                    ws.mkdir()
                    one = anyio.run(_run, kind, ws, clients, calls, variant)
                    if one["errors"]:
                        sys.exit(f"{kind} with {clients} clients: {one['errors']} calls failed:"
                                 f" {one['first_error']}")
                    got[kind].append(one)
            med = {k: statistics.median(x["calls_per_s"] for x in v) for k, v in got.items()}
            rows.append({"clients": clients, "calls": clients * calls, "rounds": rounds,
                         "steptrail_calls_per_s": med["steptrail"],
                         "plain_calls_per_s": med["plain"],
                         "ratio": med["steptrail"] / med["plain"],
                         "ratios_per_round": [s["calls_per_s"] / p["calls_per_s"] for s, p in
                                              zip(got["steptrail"], got["plain"], strict=True)],
                         "runs": got})
            if variant:
                rows[-1]["variant_calls_per_s"] = med["variant"]
                rows[-1]["over_variant"] = statistics.median(
                    s["calls_per_s"] / v["calls_per_s"]
                    for s, v in zip(got["steptrail"], got["variant"], strict=True))
        fs = _fs(Path(tmp))
    if args.json:
        print(json.dumps({"fs": fs, "calls_per_client": calls, "rows": rows}, indent=2))
        return
    print(f"steptrail mcp vs a plain MCP file server, over stdio ({fs}; {calls} calls per"
          f" client, write_file and edit_file alternating; median of {rounds} rounds)")
    print(f"{'clients':>7} {'calls':>6} {'steptrail calls/s':>19} {'plain calls/s':>14}"
          f" {'ratio':>7}  per round")
    for r in rows:
        per = " ".join(f"{x:.2f}" for x in r["ratios_per_round"])
        print(f"{r['clients']:>7} {r['calls']:>6} {r['steptrail_calls_per_s']:>19.0f}"
              f" {r['plain_calls_per_s']:>14.0f} {r['ratio']:>6.2f}x  {per}")
    if variant:
        print(f"the variant (steptrail mcp {' '.join(variant)}), same rounds:")
        for r in rows:
            print(f"{r['clients']:>7} clients: {r['variant_calls_per_s']:.0f} calls/s;"
                  f" steptrail / variant {r['over_variant']:.2f}x")
    print("target: >= 0.5x")


if __name__ == "__main__":
    main()

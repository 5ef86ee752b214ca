#!/usr/bin/env python3
"""Paired A/B of two checkouts of steptrail: fenced steps a second and a 100k-event rebuild.

Run from the repository root::

    .venv/bin/python tools/bench_ab.py --base /path/to/other/checkout      # 7 pairs
    .venv/bin/python tools/bench_ab.py --base ../base --pairs 11 --steps 3000 --json

Each measurement is its own process (``python -c``) with ``PYTHONPATH`` set to one
checkout, so A and B import their own ``ledger`` and nothing else differs; A and B run
in turn (A B A B ...) and the ratio is taken pair by pair, so a drift of the machine's
speed moves both sides of a pair alike. Quote the median ratio; min and max show the
spread.

- **fenced**: ``run_fenced_step`` on a fresh SQLite ledger (synchronous=FULL), one
  4-KiB write and one inline artifact a step, `--steps` steps after 50 warm-up steps;
  figures: steps a second, and steps a CPU second of the process (higher is better;
  the CPU figure is the steadier on a disk whose fsyncs vary).
- **rebuild**: ``Ledger.rebuild()`` of a copy of one 100k-event ledger (planned +
  manifest-published + acked per step, built once by A's code: the format is shared);
  figures: events a second and a CPU second (higher is better).

A ratio is A/B (the checkout this runs from over `--base`): 1.00 is parity, above is A
faster. `--installed` measures what users run: a wheel built from each checkout,
installed (not editable) into a fresh venv of its own. Say under what load the figures were taken (``uptime`` is printed with them).

`--instructions` settles what timing on a noisy machine cannot: each side's processes run
under valgrind's callgrind (``PYTHONHASHSEED=0``) and the figure is the CPU instructions
one fenced step, or one rebuilt event, costs — the count of a run with N steps (events)
less the count of the same process doing none, over N. It does not see the disk (an
fsync is the kernel's), so it measures the code alone; it repeats to within a fraction of
a percent, where the timings above spread by a third on a shared VM. Lower is better, and
the ratio printed is B/A so that above 1.00 still means A is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

FENCED = r"""
import os, sys, tempfile, time
from pathlib import Path
from ledger import Ledger, run_fenced_step
steps = int(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    ws = Path(d) / "ws"; ws.mkdir()
    for i in range(8):
        (ws / f"f{i}.txt").write_bytes(b"x" * 4096)
    with Ledger.init(Path(d) / "l.db") as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "bench", ttl_s=3600).epoch
        def one(n):
            path = f"f{n % 8}.txt"
            out = run_fenced_step(led, "w", f"s{n}", lambda r: [r.read(path).write(
                n.to_bytes(4, "big") * 1024)], epoch=epoch, artifacts={"r.txt": b"ok %d" % n})
            assert out.committed, out
        for n in range(50):
            one(n)
        t, c = time.perf_counter(), time.process_time()
        for n in range(50, 50 + steps):
            one(n)
        print(steps / max(time.perf_counter() - t, 1e-9),
              steps / max(time.process_time() - c, 1e-9))
"""

BUILD = r"""
import sys
from ledger import Ledger
from ledger.events import Acked, ManifestPublished, Planned
n = int(sys.argv[2]) // 3
with Ledger.init(sys.argv[1]) as led:
    batch = []
    for i in range(n):
        s = f"s{i}"
        batch += [Planned(step=s, attempt=1, run="r"),
                  ManifestPublished(step=s, attempt=1, run="r", manifest_rev=0, expected_rev=-1,
                                    digest="0" * 64),
                  Acked(step=s, attempt=1, run="r", manifest_rev=0)]
        if len(batch) >= 3000:
            led.append_batch(batch); batch = []
    if batch:
        led.append_batch(batch)
    print(led.count())
"""

REBUILD = r"""
import sys, time
from ledger import Ledger
with Ledger.open(sys.argv[1]) as led:
    n = led.count()
    t, c = time.perf_counter(), time.process_time()
    if sys.argv[2:] != ["skip"]:
        led.rebuild()
    print(n / max(time.perf_counter() - t, 1e-9), n / max(time.process_time() - c, 1e-9))
"""


#: Each side's interpreter and the directory its processes run in: a checkout's own
#: sources (`PYTHONPATH`), or with `--installed` a wheel built from it in a fresh venv.
PYTHONS: dict[Path, tuple[str, Path | None]] = {}


def install(checkout: Path, where: Path) -> str:
    """A fresh venv at `where` with a wheel built from `checkout` installed (not
    editable): what a user runs. Returns its interpreter."""
    where.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(where / "wheel"), str(checkout)], check=True)
    (wheel,) = (where / "wheel").glob("*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
    python = str(where / "venv" / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
    return python


def process_of(checkout: Path, **extra: str) -> tuple[str, Path | None, dict[str, str]]:
    """(interpreter, working directory, environment) of `checkout`'s processes: its
    installed venv (`--installed`), or this interpreter with the checkout on PYTHONPATH."""
    python, cwd = PYTHONS.get(checkout, (sys.executable, None))
    env = dict(os.environ, **extra)
    env.pop("PYTHONPATH", None)
    if cwd is None:
        env["PYTHONPATH"] = str(checkout)
    return python, cwd, env


def run(checkout: Path, code: str, *args: str) -> tuple[float, float]:
    python, cwd, env = process_of(checkout)
    out = subprocess.run([python, "-c", code, *args], env=env, capture_output=True,
                         text=True, check=False, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {out.stderr.strip()[-2000:]}")
    wall, _, cpu = out.stdout.strip().splitlines()[-1].partition(" ")
    return float(wall), float(cpu or wall)


def instructions(checkout: Path, code: str, *args: str) -> int:
    """CPU instructions (callgrind's ``Ir``) of one process running `code` from
    `checkout`'s interpreter."""
    python, cwd, env = process_of(checkout, PYTHONHASHSEED="0")
    # valgrind must run the interpreter itself, not a shell shim in front of it
    real = subprocess.run([python, "-c", "import sys; print(sys.executable)"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          real, "-c", code, *args], env=env, capture_output=True, text=True,
                         check=False, cwd=cwd)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {out.stderr.strip()[-2000:]}")
    for line in out.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].strip())
    raise SystemExit(f"callgrind printed no count: {out.stderr[-500:]}")


def count_instructions(args: argparse.Namespace, base: Path, scratch: Path) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    master = scratch / "rebuild.db"
    events = int(run(HERE, BUILD, str(master), str(args.events))[0])
    report: dict = {"a": str(HERE), "b": str(base), "installed": args.installed,
                    "steps": args.steps, "events": events, "unit": "instructions"}
    for side, checkout in (("a", HERE), ("b", base)):
        busy = instructions(checkout, FENCED, str(args.steps))
        idle = instructions(checkout, FENCED, "0")
        report.setdefault("fenced step", {})[side] = (busy - idle) // args.steps
        copy = scratch / f"r-{side}.db"
        shutil.copyfile(master, copy)
        busy = instructions(checkout, REBUILD, str(copy))
        shutil.copyfile(master, copy)
        idle = instructions(checkout, REBUILD, str(copy), "skip")
        report.setdefault("rebuilt event", {})[side] = (busy - idle) // events
        print(f"side {side} counted", file=sys.stderr)
    for name in ("fenced step", "rebuilt event"):
        row = report[name]
        row["b_over_a"] = round(row["b"] / row["a"], 3)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    how = "wheels installed in fresh venvs" if args.installed else "the checkouts' sources"
    print(f"A {report['a']}\nB {report['b']}\n({how}) callgrind, PYTHONHASHSEED=0;"
          f" {args.steps} steps, {events:,} events")
    print(f"{'':<15}{'A instr.':>14}{'B instr.':>14}{'B/A':>8}")
    for name in ("fenced step", "rebuilt event"):
        r = report[name]
        print(f"{name:<15}{r['a']:>14,}{r['b']:>14,}{r['b_over_a']:>8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (B)")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--installed", action="store_true",
                    help="measure a wheel built from each checkout, installed in a fresh"
                         " venv (what users run), not the checkouts' sources")
    ap.add_argument("--instructions", action="store_true",
                    help="count CPU instructions under valgrind instead of timing"
                         " (deterministic; use small --steps and --events, e.g. 300 and"
                         " 30000)")
    args = ap.parse_args()
    base = args.base.resolve()
    if not (base / "ledger" / "__init__.py").is_file():
        raise SystemExit(f"{base} is not a steptrail checkout (no ledger/__init__.py)")
    scratch = Path(tempfile.mkdtemp(prefix="steptrail-ab-"))
    try:
        if args.installed:  # (run outside both checkouts: `python -c` imports from its cwd)
            for side, checkout in (("a", HERE), ("b", base)):
                PYTHONS[checkout] = (install(checkout, scratch / f"install-{side}"), scratch)
        if args.instructions:
            count_instructions(args, base, scratch)
            return
        master = scratch / "rebuild.db"
        count = int(run(HERE, BUILD, str(master), str(args.events))[0])
        rows: dict[str, list[tuple[float, float]]] = {
            "fenced": [], "fenced cpu": [], "rebuild": [], "rebuild cpu": []}
        for i in range(args.pairs):
            a = run(HERE, FENCED, str(args.steps))
            b = run(base, FENCED, str(args.steps))
            rows["fenced"].append((a[0], b[0]))
            rows["fenced cpu"].append((a[1], b[1]))
            copies = []
            for side in ("a", "b"):
                copy = scratch / f"r{i}{side}.db"
                shutil.copyfile(master, copy)
                copies.append(copy)
            a = run(HERE, REBUILD, str(copies[0]))
            b = run(base, REBUILD, str(copies[1]))
            rows["rebuild"].append((a[0], b[0]))
            rows["rebuild cpu"].append((a[1], b[1]))
            for c in copies:
                c.unlink()
            print(f"pair {i + 1}/{args.pairs}", file=sys.stderr)
        load = os.getloadavg()
        report = {"a": str(HERE), "b": str(base), "installed": args.installed,
                  "pairs": args.pairs, "steps": args.steps,
                  "events": count, "loadavg": [round(x, 2) for x in load]}
        for name, pairs in rows.items():
            ratios = [a / b for a, b in pairs]
            report[name] = {"a_median": round(statistics.median(a for a, _ in pairs), 1),
                            "b_median": round(statistics.median(b for _, b in pairs), 1),
                            "ratio_median": round(statistics.median(ratios), 3),
                            "ratio_min": round(min(ratios), 3),
                            "ratio_max": round(max(ratios), 3)}
        if args.json:
            print(json.dumps(report, indent=2))
            return
        how = "wheels installed in fresh venvs" if args.installed else "the checkouts' sources"
        print(f"A {report['a']}\nB {report['b']}\n({how}) {args.pairs} pairs; load average"
              f" {' '.join(map(str, report['loadavg']))}")
        print(f"{'':<13}{'A median':>12}{'B median':>12}{'A/B median':>12}{'min':>8}{'max':>8}")
        for name, unit in (("fenced", "steps/s"), ("fenced cpu", "steps/CPU-s"),
                           ("rebuild", "events/s"), ("rebuild cpu", "events/CPU-s")):
            r = report[name]
            print(f"{name:<13}{r['a_median']:>12,.1f}{r['b_median']:>12,.1f}"
                  f"{r['ratio_median']:>12.3f}{r['ratio_min']:>8.3f}{r['ratio_max']:>8.3f}"
                  f"  ({unit})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

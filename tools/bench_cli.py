"""The command line's cost per call, as a ratio to a baseline measured in the same run.

The baseline is a process that imports the command line's three dependencies and does
nothing: ``python -c "import apsw, msgspec, click"``. Against it, on a small ledger made
in a temporary directory first: ``steptrail steps``, ``head``, ``show STEP --json``,
``workspace read PATH --json`` and ``step run PLAN --json`` (a real fenced step with one
artifact, each call a new one), each the best and the median of N process starts, the
cases interleaved round by round so a load spike hits them alike. Target: ``steps`` at
most 2.0x the baseline (best of N).

Then a replay: N steps driven as a harness in another language drives them, one process
per command — ``workspace read``, ``step plan``, ``step apply``, ``step store``, ``step
publish``, ``step ack`` (six) — against ``workspace read`` and ``step run`` (two), in
steps per second.

The package's bytecode is compiled first (``compileall``), as an installed package has
it: without it every start compiles every module (PYTHONDONTWRITEBYTECODE=1 makes that
the case on each call). ``--compare DIR`` also times another checkout of the package
(DIR holds its ``ledger/``; ``step run`` is skipped if it has none), in the same rounds:
before and after in one run.

    .venv/bin/python tools/bench_cli.py                 # 15 starts a case, 30 replayed steps
    .venv/bin/python tools/bench_cli.py --quick         # 5 and 10
    .venv/bin/python tools/bench_cli.py --compare /tmp/old-checkout --json
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = 2.0  # `steptrail steps` against the baseline, best of N


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Bench:
    """A small ledger in `work`: workspace w (repo/app.py), a live epoch, step s0 committed."""

    def __init__(self, work: pathlib.Path) -> None:
        self.work = work
        self.repo = work / "repo"
        self.repo.mkdir()
        self.content = b"v0\n"
        (self.repo / "app.py").write_bytes(self.content)
        (work / "out").mkdir()
        (work / "out" / "log.txt").write_bytes(b"12 passed\n")
        self.n = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STEPTRAIL_")}
        self.env.update(STEPTRAIL_LEDGER=str(work / "ledger.db"), STEPTRAIL_WORKSPACE="w")

    def call(self, tree: pathlib.Path, *argv: str, stdout: Any = subprocess.DEVNULL) -> float:
        """Run `steptrail ARGV` from `tree`; its wall time in seconds (it must succeed)."""
        env = {**self.env, "PYTHONPATH": str(tree)}
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ledger", *argv], cwd=self.work, env=env,
                              stdout=stdout, stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - t
        if done.returncode != 0:
            raise SystemExit(f"steptrail {' '.join(argv)}: exit {done.returncode}:"
                             f" {done.stderr.decode(errors='replace').strip()}")
        return elapsed

    def setup(self) -> None:
        self.call(ROOT, "init")
        self.call(ROOT, "workspace", "add", "w", str(self.repo))
        out = subprocess.run([sys.executable, "-m", "ledger", "lease", "acquire", "--holder",
                              "bench", "--ttl", "2d", "--json"], cwd=self.work,
                             env={**self.env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                             check=True)
        self.env["STEPTRAIL_EPOCH"] = str(json.loads(out.stdout)["epoch"])
        self.run_plan(ROOT)

    def next_plan(self, artifacts: bool = True) -> str:
        """plan-K.json: step sK writes app.py anew, planned against its current content."""
        self.n += 1
        new = f"v{self.n}\n".encode()
        plan = {"step": f"s{self.n}", "artifacts": ["out/log.txt"] if artifacts else [],
                "writes": [{"path": "app.py", "pre_hash": sha(self.content),
                            "content": new.decode()}]}
        self.content = new
        path = self.work / f"plan-{self.n}.json"
        path.write_text(json.dumps(plan))
        return path.name

    def run_plan(self, tree: pathlib.Path) -> float:
        return self.call(tree, "step", "run", self.next_plan(), "out/log.txt", "--json")

    def step_by_commands(self, tree: pathlib.Path) -> float:
        """One step as six processes; the wall time of all six."""
        plan = self.next_plan()
        step = f"s{self.n}"
        t = self.call(tree, "workspace", "read", "app.py", "--json")
        t += self.call(tree, "step", "plan", plan)
        with open(self.work / "receipt.json", "wb") as f:
            t += self.call(tree, "step", "apply", step, "--json", stdout=f)
        t += self.call(tree, "step", "store", step, "out/log.txt")
        t += self.call(tree, "step", "publish", step, "--receipt", "receipt.json")
        return t + self.call(tree, "step", "ack", step)

    def step_by_run(self, tree: pathlib.Path) -> float:
        """One step as a harness's read and one `step run`."""
        t = self.call(tree, "workspace", "read", "app.py", "--json")
        return t + self.run_plan(tree)


def baseline() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import apsw, msgspec, click"], check=True)
    return time.perf_counter() - t


def _cli_sources(tree: pathlib.Path) -> list[pathlib.Path]:
    """The command line's source files in a checkout: ledger/cli.py, or ledger/cli/."""
    one = tree / "ledger" / "cli.py"
    return [one] if one.is_file() else sorted((tree / "ledger" / "cli").glob("*.py"))


def _has_step_run(tree: pathlib.Path) -> bool:
    """The checkout's command line has `step run`."""
    return any('@step.command("run"' in p.read_text() or '@click.command("run"' in p.read_text()
               for p in _cli_sources(tree))


def measure(runs: int, replay: int, compare: pathlib.Path | None) -> dict[str, Any]:
    trees = {"": ROOT} | ({"compare": compare} if compare else {})
    for tree in trees.values():
        compileall.compile_dir(str(tree / "ledger"), quiet=1)
    has_run = {k: _has_step_run(t) for k, t in trees.items()}
    work = pathlib.Path(tempfile.mkdtemp(prefix="steptrail-bench-cli-"))
    try:
        b = Bench(work)
        b.setup()
        cases: dict[str, Any] = {"baseline: python -c 'import apsw, msgspec, click'": baseline}
        for key, tree in trees.items():
            tag = f" [{key}]" if key else ""
            cases[f"steptrail steps{tag}"] = lambda t=tree: b.call(t, "steps")
            cases[f"steptrail head{tag}"] = lambda t=tree: b.call(t, "head")
            cases[f"steptrail show s1 --json{tag}"] = lambda t=tree: b.call(t, "show", "s1", "--json")
            cases[f"steptrail workspace read app.py --json{tag}"] = (
                lambda t=tree: b.call(t, "workspace", "read", "app.py", "--json"))
            cases[f"steptrail --help{tag}"] = lambda t=tree: b.call(t, "--help")
            if has_run[key]:
                cases[f"steptrail step run PLAN --json{tag}"] = lambda t=tree: b.run_plan(t)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, case in cases.items():
                times[name].append(case())
        base = min(next(iter(times.values())))
        base_median = statistics.median(next(iter(times.values())))
        rows = []
        for name, ts in times.items():
            row = {"case": name, "best_ms": round(min(ts) * 1000, 1),
                   "median_ms": round(statistics.median(ts) * 1000, 1),
                   "ratio_best": round(min(ts) / base, 2),
                   "ratio_median": round(statistics.median(ts) / base_median, 2)}
            if name.startswith("steptrail steps"):
                row["target"] = f"<= {TARGET}x"
                row["pass"] = row["ratio_best"] <= TARGET
            rows.append(row)
        replays = []
        for key, tree in trees.items():
            by_commands = sum(b.step_by_commands(tree) for _ in range(replay))
            by_run = sum(b.step_by_run(tree) for _ in range(replay)) if has_run[key] else None
            replays.append({"tree": key or "this", "steps": replay,
                            "commands_steps_per_s": round(replay / by_commands, 2),
                            "run_steps_per_s": round(replay / by_run, 2) if by_run else None,
                            "speedup": round(by_commands / by_run, 2) if by_run else None})
        return {"python": sys.version.split()[0], "runs": runs, "dir": str(work.parent),
                "compare": str(compare) if compare else None, "cases": rows, "replay": replays}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="process starts per case (default 15)")
    ap.add_argument("--replay", type=int, default=30, help="steps per replay (default 30)")
    ap.add_argument("--quick", action="store_true", help="5 starts a case, 10 replayed steps")
    ap.add_argument("--compare", type=pathlib.Path, metavar="DIR",
                    help="also time the package in DIR (a checkout holding ledger/)")
    ap.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    args = ap.parse_args()
    runs, replay = (5, 10) if args.quick else (args.runs, args.replay)
    compare = args.compare.resolve() if args.compare else None
    if compare is not None and not _cli_sources(compare):
        ap.error(f"--compare {compare}: no ledger/cli.py or ledger/cli/ there")
    report = measure(runs, replay, compare)
    if args.json:
        print(json.dumps(report))
        return
    print(f"steptrail start-up, best and median of {runs} starts (python {report['python']},"
          f" ledger under {report['dir']})")
    print(f"{'case':<52} {'best':>8} {'median':>8} {'ratio':>6} {'(median)':>9}  target")
    for r in report["cases"]:
        verdict = f"{r['target']} {'PASS' if r['pass'] else 'FAIL'}" if "target" in r else ""
        print(f"{r['case']:<52} {r['best_ms']:>6.1f}ms {r['median_ms']:>6.1f}ms"
              f" {r['ratio_best']:>5.2f}x {r['ratio_median']:>8.2f}x  {verdict}")
    for r in report["replay"]:
        run = (f"; workspace read + step run {r['run_steps_per_s']:.2f} steps/s:"
               f" {r['speedup']:.2f}x" if r["speedup"] else "")
        print(f"replay [{r['tree']}] {r['steps']} steps: six commands a step"
              f" {r['commands_steps_per_s']:.2f} steps/s{run}")


if __name__ == "__main__":
    main()

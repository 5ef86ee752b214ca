"""The commands `steptrail` gains from the test machinery: `chaos` (the SIGKILL, power-loss
and I/O-error sweeps) and `fuzz` (the interleaving search).

They are the entry points of the group ``steptrail.commands`` (pyproject.toml), which
the command line loads when one is invoked or the commands are listed: the runtime never
imports ledger.testing. Loading this module imports click and the command line's
plumbing only; each command imports its machinery when it runs.
"""

from __future__ import annotations

import sys

import click

from ledger.cli._common import LedgerCommand, _emit_json, _progress, json_option
from ledger.cli._format import _n
from ledger.errors import EXIT_NO


@click.command("chaos", cls=LedgerCommand)
@click.option("--artifacts", "n", type=click.IntRange(1, 50), default=5, show_default=True,
              help="Artifacts in the step (alternating inline and file blobs).")
@click.option("--wrong-order", is_flag=True, help="Run the broken protocol (manifest before blobs): must report violations.")
@click.option("--fenced", "shape", type=click.Choice(["rotation", "swap", "move"]),
              help="Kill a fenced workspace step of this shape instead (a 6-file rotation,"
              " a swap, a 3-file directory move): after each kill a new epoch must put every"
              " file back (or find the step committed), and a re-run must commit it.")
@click.option("--rewind", "travel", flag_value="rewind",
              help="Kill a rewind instead (a small workspace with a person's observed edit and"
              " a git repository, rewound to its first step): after each kill a new lease must"
              " put every file back (or find the rewind committed), and running the rewind"
              " again must end exactly as of that step.")
@click.option("--fork", "travel", flag_value="fork",
              help="Kill a fork instead (that workspace forked as of its second step into a"
              " new directory): after each kill running the same fork again must complete it"
              " (the files as of the step, registered once with its baseline), the original"
              " untouched.")
@click.option("--power-loss", "power_loss", is_flag=True,
              help="Simulate power loss at every operation of a workload (appends, a step with"
              " inline and file blobs, a workspace step, a rebuild, a GC run) instead.")
@click.option("--model", "models", multiple=True,
              type=click.Choice(["drop", "random", "garbage", "prefix", "torn"]),
              help="With --power-loss: what happens to unsynced writes (repeatable; default:"
              " drop, random, garbage, prefix).")
@click.option("--io-errors", "io_errors", is_flag=True,
              help="Fail the Nth SQLite write/sync/truncate and blob-store operation instead.")
@click.option("--persistent", is_flag=True, help="With --io-errors: every later operation fails too.")
@click.option("--points", type=click.IntRange(min=1),
              help="With --power-loss/--io-errors: a seeded sample of this many points (default: all).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--dir", "workdir", type=click.Path(file_okay=False), help="Scratch directory (default: a temporary one on this disk).")
@json_option
def chaos(n: int, wrong_order: bool, shape: str | None, travel: str | None, power_loss: bool,
          models: tuple[str, ...], io_errors: bool, persistent: bool, points: int | None,
          seed: int, workdir: str | None, as_json: bool) -> None:
    """Kill a real process (SIGKILL) at every operation of a step; check, replay, check.

    Every file write, fsync, rename, directory fsync, mkdir and SQLite COMMIT of one
    N-artifact step is an operation. For each index k the step runs in a child that
    kills itself before operation k; the ledger is reopened, the step classified
    (committed / no-commit / VIOLATION), replayed under the same step id, and
    classified again. Exit 1 if any violation was found.

    With --power-loss (or --io-errors) a simulated disk under the ledger and its blob
    store loses power (or fails an operation) at each operation index of a workload;
    the surviving image is reopened with the ordinary VFS and checked: verify (I1-I9),
    audit, every acknowledged commit present (Jepsen: lost and duplicated must be 0),
    then the workload replayed. Exit 1 on any loss, duplicate or failed check.

    With --fenced SHAPE the step is a fenced workspace step (a rotation, a swap, a
    directory move): after each kill one copy is settled by a new epoch (every file as
    before, or the step committed) and another re-run under the same epoch (committed,
    every file as after, nothing left behind).

    With --rewind (--fork) the protocol killed is a rewind (a fork) of a small workspace
    whose history has a person's edit recorded by observe, then checked against a model
    of what was written: the files, verify, audit, .git byte for byte, the person's bytes
    still stored, no temporary left (see docs/testing.md).

    \b
        steptrail chaos --artifacts 5
        steptrail chaos --fenced rotation  # a 6-file rotation killed at every operation
        steptrail chaos --rewind --json    # a rewind killed at every operation
        steptrail chaos --fork             # a fork killed at every operation, run again
        steptrail chaos --wrong-order      # the negative control: violations > 0
        steptrail chaos --power-loss --points 40
        steptrail chaos --power-loss --model torn --dir /mnt/disk-under-test
        steptrail chaos --io-errors --persistent --points 40
    """
    if power_loss or io_errors:
        _chaos_faults(power_loss, models, persistent, points, seed, workdir, as_json)
        return
    from .chaos import run_chaos, run_fenced_chaos
    from .chaos_travel import run_fork_chaos, run_rewind_chaos

    update, finish = _progress("crash points")
    try:
        if travel == "rewind":
            report = run_rewind_chaos(workdir=workdir, progress=update)
        elif travel == "fork":
            report = run_fork_chaos(workdir=workdir, progress=update)
        elif shape is not None:
            report = run_fenced_chaos(shape, workdir=workdir, progress=update)
        else:
            report = run_chaos(n, wrong_order=wrong_order, workdir=workdir, progress=update)
    finally:
        finish()
    if as_json:
        _emit_json(report.as_json())
    else:
        first = {"rewind": "AFTER SETTLE", "fork": "LEFT BY THE KILL"}.get(
            travel or "", "AFTER SETTLE" if shape else "AFTER CRASH")
        click.echo(f"{'INDEX':>5}  {'OPERATION':<28}  {first:<12}  AFTER REPLAY")
        for r in report.rows:
            click.echo(f"{r.index:>5}  {r.operation:<28}  {r.after_crash:<12}  {r.after_replay}")
        order = "WRONG order (manifest before blobs)" if wrong_order else "correct order"
        if travel:
            again = "settling" if travel == "rewind" else "the kill"
            click.echo(
                f"chaos: a {travel}: {_n(report.indices, 'crash point')},"
                f" {_n(report.violations, 'violation')} after {again},"
                f" {_n(report.violations_after_replay, 'violation')} after running it again,"
                f" {report.committed_after_replay}/{report.indices} complete after that"
                f" ({report.elapsed_s:.1f}s)")
        elif shape:
            click.echo(
                f"chaos: a fenced {shape}: {_n(report.indices, 'crash point')},"
                f" {_n(report.violations, 'violation')} after settling,"
                f" {_n(report.violations_after_replay, 'violation')} after a re-run,"
                f" {report.committed_after_replay}/{report.indices} committed after the re-run"
                f" ({report.elapsed_s:.1f}s)")
        else:
            click.echo(
                f"chaos: {_n(report.artifacts, 'artifact')}, {order}:"
                f" {_n(report.indices, 'crash point')}, {_n(report.violations, 'violation')}"
                " after crash,"
                f" {report.committed_after_replay}/{report.indices} committed after replay"
                f" ({report.elapsed_s:.1f}s)"
            )
    if report.violations or report.violations_after_replay:
        sys.exit(EXIT_NO)


def _chaos_faults(power_loss: bool, models: tuple[str, ...], persistent: bool,
                  points: int | None, seed: int, workdir: str | None, as_json: bool) -> None:
    import shutil
    import tempfile

    from . import faults

    if power_loss and models == ():
        models = faults.MODELS
    scratch = tempfile.mkdtemp(prefix="steptrail-chaos-", dir=workdir or faults.scratch_root())
    try:
        total, trace = faults.count_ops(faults.StandardWorkload(), scratch)

        def pick(n: int) -> list[int]:
            return faults.sample_points(n, n=points, seed=seed) if points else list(range(1, n + 2))

        if power_loss:
            reports = faults.crash_sweep(faults.StandardWorkload(), models=models,
                                         points=pick, scratch=scratch, seed=seed)
        else:
            kinds = tuple(sorted(faults.SQLITE_KINDS | {"write", "fsync", "rename", "dirfsync"}))
            n = sum(1 for k in trace if k in kinds)
            reports = [faults.fault_sweep(
                faults.StandardWorkload(),
                lambda k: [faults.Fault(kinds, at=k, persistent=persistent)],
                points=pick(n)[:-1] or [1], scratch=scratch,
                name=f"io-error/{'persistent' if persistent else 'once'}")]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ok = all(r.ok for r in reports)
    if as_json:
        _emit_json({"ok": ok, "operations": total, "sweeps": [
            {"name": r.name, "points": r.points, "lost": r.lost, "recovered": r.recovered,
             "unexpected": r.unexpected, "duplicated": r.duplicated,
             "failures": r.failures[:20], "elapsed_s": round(r.elapsed_s, 2)} for r in reports]})
    else:
        click.echo(f"chaos: a workload of {_n(total, 'operation')}")
        for r in reports:
            click.echo("  " + r.line())
            for f in r.failures[:10]:
                click.echo(f"    {f}")
        click.echo("0 acknowledged commits lost, 0 duplicated" if ok else "VIOLATIONS found")
    if not ok:
        sys.exit(EXIT_NO)


@click.command("fuzz", cls=LedgerCommand)
@click.option("--seeds", type=click.IntRange(min=1), default=300, show_default=True,
              help="How many seeds (schedules) to run.")
@click.option("--fence", type=click.Choice(["step", "plan", "none"]), default="step",
              show_default=True, help="The fence mode under test.")
@click.option("--journal/--no-journal", default=True, show_default=True,
              help="Use the apply journal (off: a redelivery is fenced, not deduped).")
@click.option("--start", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first seed (seeds START .. START+SEEDS-1).")
@click.option("--length", type=click.IntRange(4, 200), default=16, show_default=True,
              help="Ops per schedule.")
@click.option("--no-shrink", is_flag=True, help="Report the first violation unshrunk.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False),
              help="Scratch directory (default: /dev/shm when writable, else the system temp).")
@json_option
def fuzz(seeds: int, fence: str, journal: bool, start: int, length: int, no_shrink: bool,
         workdir: str | None, as_json: bool) -> None:
    """Search interleavings of interference for a violation of the fence invariants.

    Each seed shuffles {human_edit, preempt, retry, replan, duplicate_delivery,
    late_receipt} over a fixed plan of four chained steps, runs it against a real
    temporary workspace and ledger, and checks after every op: P1 every applied write
    saw its planned base rev and pre_hash; P2 one apply per journal key and a
    redelivery never changes the workspace; P3 no content replaced by a write planned
    against an older revision (compensations included); I5 nothing applied, published
    or acked under a dead epoch. The first violation is shrunk to a minimal op order
    and printed. Exit 1 if any seed violates.

    \b
        steptrail fuzz --seeds 5000                 # fences on: 0 violations
        steptrail fuzz --seeds 300 --fence none     # finds a lost update, shrinks it
        steptrail fuzz --fence none --no-journal --json
    """
    from . import fuzz as fuzz_mod

    update, finish = _progress("seeds")
    try:
        report = fuzz_mod.run(seeds, fence=fence, journal=journal, start=start,
                              workdir=workdir, progress=update, shrink=not no_shrink,
                              length=length)
    finally:
        finish()
    if as_json:
        _emit_json(report.as_dict())
    else:
        d = report.as_dict()
        click.echo(f"fuzz: {_n(report.seeds, 'seed')}, fence={fence},"
                   f" journal={'on' if journal else 'off'}: {_n(report.violations, 'violation')},"
                   f" {_n(report.events, 'event')}"
                   f" in {report.elapsed_s:.1f}s")
        if report.violations and report.first is not None:
            click.echo(f"first: seed {d['seed']}: {d['property']} — {d['detail']}")
            click.echo("minimal event order (counterexample):")
            for i, op in enumerate(report.counterexample or report.first.ops, 1):
                click.echo(f"  {i}. {op}")
            for line in d.get("trace") or ():
                click.echo(f"     {line}")
    if report.violations:
        sys.exit(EXIT_NO)


__all__ = ["chaos", "fuzz"]

"""The `stepledger` command: thin, scriptable, predictable.

Each command parses its arguments, calls the public API and formats the result.
Results go to stdout, progress and logs to stderr, so `--json` output is pure.
Exit codes (DESIGN.md "The command line"): 0 success; 1 the answer is no (a
violation found, or the protocol refused); 2 usage or bad input, including a file
that is not a usable ledger; 3 the environment failed (disk full, I/O error, lock
timeout). User errors are one line on stderr, never a traceback.

This is the only module that imports click.
"""

from __future__ import annotations

import csv
import datetime as dt
import errno
import functools
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import apsw
import click
import msgspec

from . import __version__
from .db import _readonly_uri
from .errors import EXIT_ENVIRONMENT, EXIT_NO, LedgerError
from .events import KINDS, Manifest, RecordedEvent, check_relpath, to_builtins
from .ledger import DEFAULT_PATH, Ledger
from .projections import StepRow
from .projections.steps import STATES

F = TypeVar("F", bound=Callable[..., Any])

ENV_LEDGER = "STEPLEDGER_LEDGER"


# -- plumbing -----------------------------------------------------------------------


class LedgerGroup(click.Group):
    """Maps our typed errors and environment failures to one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LedgerError as exc:
            _fail(str(exc), exc.exit_code)
        except apsw.BusyError:
            _fail("the ledger stayed locked by another writer; retry later", EXIT_ENVIRONMENT)
        except (apsw.FullError, apsw.IOError) as exc:
            _fail(f"storage failed: {exc}; free space or fix the disk, then retry", EXIT_ENVIRONMENT)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                sys.exit(0)  # the reader of our output went away (| head)
            _fail(f"{exc.strerror or exc} ({exc.filename or 'no file'})", EXIT_ENVIRONMENT)


def _fail(message: str, code: int) -> None:
    click.echo(f"stepledger: error: {message}", err=True)
    sys.exit(code)


def json_option(f: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print machine-readable JSON (see docs/cli-json.md)."
    )(f)


def _emit_json(data: Any) -> None:
    click.echo(msgspec.json.encode(data).decode())


def _iso(time_ns: int) -> str:
    return dt.datetime.fromtimestamp(time_ns / 1e9, dt.timezone.utc).isoformat(
        timespec="milliseconds"
    ).replace("+00:00", "Z")


def _progress(label: str) -> Any:
    """A progress callback drawing a bar on a terminal (stderr), silent otherwise."""
    if not sys.stderr.isatty():
        return None, lambda: None
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=max(total, 1), label=label, file=sys.stderr)
            bar.__enter__()
        bar.update(done - bar.pos)

    def finish() -> None:
        if bar is not None:
            bar.__exit__(None, None, None)

    return update, finish


def _open(ctx: click.Context, *, readonly: bool) -> Ledger:
    return Ledger.open(ctx.obj["ledger_path"], readonly=readonly)


def event_json(r: RecordedEvent) -> dict[str, Any]:
    ev = r.event
    return {
        "seq": r.seq,
        "time_ns": r.time_ns,
        "time": _iso(r.time_ns),
        "kind": r.kind,
        "workspace": getattr(ev, "workspace", ""),
        "run": getattr(ev, "run", ""),
        "step": getattr(ev, "step", ""),
        "attempt": getattr(ev, "attempt", 0),
        "epoch": getattr(ev, "epoch", 0),
        "rev": getattr(ev, "rev", 0),
        "journal_key": r.journal_key,
        "hash": r.hash.hex(),
        "prev_hash": r.prev_hash.hex(),
        "v": r.v,
        "event": to_builtins(ev),
    }


def step_json(row: StepRow) -> dict[str, Any]:
    out = msgspec.to_builtins(row)
    out["committed"] = row.live
    out["updated"] = _iso(row.updated_ns)
    return out  # type: ignore[no-any-return]


def _event_detail(r: RecordedEvent) -> str:
    ev = to_builtins(r.event)
    for k in ("kind", "step", "attempt", "run", "workspace", "epoch"):
        ev.pop(k, None)
    parts = []
    for k, v in ev.items():
        if v in ((), [], None, "", False) and k != "expected_rev":
            continue
        if isinstance(v, str) and len(v) == 64:
            v = v[:12] + "…"
        if isinstance(v, list | tuple):
            v = ",".join(x if isinstance(x, str) else x.get("path", "?") for x in v)
        parts.append(f"{k}={v}")
    return " ".join(parts)


# -- the group ----------------------------------------------------------------------


@click.group(cls=LedgerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepledger")
@click.option(
    "--ledger",
    "ledger_path",
    envvar=ENV_LEDGER,
    default=DEFAULT_PATH,
    show_default=True,
    metavar="PATH",
    help=f"The ledger file (or set {ENV_LEDGER}).",
)
@click.pass_context
def cli(ctx: click.Context, ledger_path: str) -> None:
    """Record, inspect and verify durable coding-agent steps.

    Every transition of every step is an immutable, hash-chained event in one
    SQLite WAL file, appended atomically with its journal (idempotency) key.

    \b
    Start here:
        stepledger init                      # create ./.stepledger/ledger.db
        stepledger steps                     # every step and its state
        stepledger show STEP                 # one step's timeline
        stepledger verify                    # chain, seq, projections
        stepledger head                      # record this elsewhere; later:
        stepledger verify --expect-head SEQ:HASH

    \b
    Exit codes: 0 ok, 1 the answer is no (violation or refusal),
    2 usage or bad input (incl. a file that is not a ledger), 3 environment failure.
    """
    ctx.ensure_object(dict)
    ctx.obj["ledger_path"] = ledger_path


@cli.command()
@json_option
@click.pass_context
def init(ctx: click.Context, as_json: bool) -> None:
    """Create a ledger (and its directory); a no-op if one is already there.

    A file that exists and is not a ledger is refused and left untouched.

    \b
        stepledger --ledger ws/.stepledger/ledger.db init
    """
    path = ctx.obj["ledger_path"]
    with Ledger.init(path) as ledger:
        info = {"path": os.path.abspath(path), "created": ledger.created, "ledger_id": ledger.ledger_id}
    if as_json:
        _emit_json(info)
    elif info["created"]:
        click.echo(f"created ledger {info['path']}")
    else:
        click.echo(f"ledger {info['path']} already exists; nothing changed")


@cli.command()
@click.option("--step", "step", metavar="STEP", help="Only this step's events.")
@click.option("--kind", type=click.Choice(KINDS), help="Only events of this kind.")
@click.option("--after", "after_seq", type=click.IntRange(min=0), default=0, help="Only events after this seq.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many events.")
@json_option
@click.pass_context
def events(
    ctx: click.Context, step: str | None, kind: str | None, after_seq: int, limit: int | None,
    as_json: bool,
) -> None:
    """List events in seq order. Read-only.

    \b
        stepledger events --step fetch
        stepledger events --kind manifest-published --json
    """
    with _open(ctx, readonly=True) as ledger:
        it = ledger.read(after_seq, step=step, kind=kind, limit=limit)
        if as_json:
            click.echo("[", nl=False)
            for i, r in enumerate(it):
                click.echo(("," if i else "") + msgspec.json.encode(event_json(r)).decode(), nl=False)
            click.echo("]")
            return
        for r in it:
            ev = r.event
            who = f"{getattr(ev, 'step', '') or getattr(ev, 'workspace', '')}"
            attempt = getattr(ev, "attempt", 0)
            click.echo(
                f"{r.seq:>8}  {_iso(r.time_ns)}  {r.kind:<18}  {who}"
                + (f" #{attempt}" if attempt else "") + f"  {_event_detail(r)}"
            )


@cli.command()
@click.option("--state", type=click.Choice(STATES), help="Only steps in this state.")
@json_option
@click.pass_context
def steps(ctx: click.Context, state: str | None, as_json: bool) -> None:
    """List steps and their current state (their latest attempt's). Read-only.

    A step is committed when it has a live manifest.

    \b
        stepledger steps --state blob-stored     # in flight: replay these
        stepledger steps --json | jq '.[] | select(.committed)'
    """
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.steps(state)
    if as_json:
        _emit_json([step_json(r) for r in rows])
        return
    if not rows:
        click.echo("no steps" + (f" in state {state}" if state else ""), err=True)
        return
    click.echo(f"{'STEP':<32} {'STATE':<18} {'ATTEMPT':>7} {'EPOCH':>5} {'MANIFEST':>8} {'BYTES':>10} {'LAST':>8}")
    for r in rows:
        manifest = f"r{r.manifest_rev}" + ("" if r.live else "-") if r.manifest_rev >= 0 else "-"
        click.echo(
            f"{r.step_id:<32} {r.state:<18} {r.attempt:>7} {r.epoch:>5} {manifest:>8}"
            f" {r.committed_bytes:>10} {r.last_seq:>8}"
        )


@cli.command()
@click.argument("step")
@json_option
@click.pass_context
def show(ctx: click.Context, step: str, as_json: bool) -> None:
    """Show one step: its state and its timeline. Read-only.

    \b
        stepledger show fetch
    """
    with _open(ctx, readonly=True) as ledger:
        row = ledger.step(step)
        timeline = ledger.timeline(step)
    if as_json:
        _emit_json({"step": step_json(row), "events": [event_json(r) for r in timeline]})
        return
    committed = "committed" if row.live else "not committed"
    click.echo(f"step {row.step_id}: {row.state}, attempt {row.attempt}, {committed}")
    if row.run:
        click.echo(f"  run {row.run}" + (f", workspace {row.workspace}" if row.workspace else ""))
    if row.manifest_rev >= 0:
        live = f"live, {row.manifest_digest}" if row.live else "not live"
        click.echo(f"  manifest revision {row.manifest_rev} ({live}), {row.committed_bytes} bytes")
    for r in timeline:
        click.echo(f"  {r.seq:>8}  {_iso(r.time_ns)}  #{r.attempt} {r.kind:<18} {_event_detail(r)}")


@cli.command()
@json_option
@click.pass_context
def rebuild(ctx: click.Context, as_json: bool) -> None:
    """Recompute every projection from the events and swap them in atomically.

    Safe at any time: readers see the old tables or the new ones, never a mix.
    """
    update, finish = _progress("rebuilding")
    with _open(ctx, readonly=False) as ledger:
        try:
            n_steps = ledger.rebuild(progress=update)
        finally:
            finish()
        n_events = ledger.count()
    if as_json:
        _emit_json({"steps": n_steps, "events": n_events})
    else:
        click.echo(f"rebuilt {n_steps} steps from {n_events} events")


@cli.command()
@click.option(
    "--expect-head",
    metavar="SEQ:HASH",
    help="A head printed earlier by 'stepledger head': prove nothing up to it was lost.",
)
@json_option
@click.pass_context
def verify(ctx: click.Context, expect_head: str | None, as_json: bool) -> None:
    """Verify the ledger: SQLite integrity, the hash chain, dense seqs, projections.

    Reads everything and writes nothing. Exit 1 when anything is wrong, listing every
    finding. A hash chain cannot see its own tail cut off or the file rolled back to
    an older copy: record 'stepledger head' elsewhere and pass it as --expect-head.

    \b
        stepledger verify
        stepledger verify --expect-head "$(cat /other/volume/ledger.head)"
    """
    update, finish = _progress("verifying")
    with _open(ctx, readonly=True) as ledger:
        try:
            report = ledger.verify(expect_head=expect_head, progress=update)
        finally:
            finish()
    if as_json:
        _emit_json(report)
    else:
        for f in report.findings:
            click.echo(f"VIOLATION [{f.check}] {f.message}")
        lag = f", projections lag {report.projection_lag} events" if report.projection_lag else ""
        verdict = "ok" if report.ok else f"{len(report.findings)} finding(s)"
        click.echo(
            f"verify: {verdict} — {report.events} events, {report.steps} steps,"
            f" head {report.head_seq}:{report.head_hash[:16]}…{lag}"
        )
    if not report.ok:
        sys.exit(EXIT_NO)


@cli.command()
@json_option
@click.pass_context
def head(ctx: click.Context, as_json: bool) -> None:
    """Print the chain head as SEQ:HASH. Read-only.

    Store it outside the ledger (another volume, your orchestrator) and later run
    'stepledger verify --expect-head SEQ:HASH' to prove no history was cut off.
    """
    with _open(ctx, readonly=True) as ledger:
        h = ledger.head()
    if as_json:
        _emit_json({"seq": h.seq, "hash": h.hash.hex()})
    else:
        click.echo(str(h))


@cli.command()
@click.option("--what", type=click.Choice(["events", "steps"]), default="events", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.pass_context
def export(ctx: click.Context, what: str, fmt: str) -> None:
    """Stream the event log or the step projection to stdout, read-only.

    Reads through sqlite-utils; you can also point sqlite-utils or Datasette at the
    file yourself (open it read-only: 'sqlite-utils rows --help').

    \b
        stepledger export --what events > events.jsonl
        stepledger export --what steps --format csv > steps.csv
    """
    import sqlite_utils

    path = ctx.obj["ledger_path"]
    with _open(ctx, readonly=True) as ledger:  # validates the file before anything reads it
        lagging = what == "steps" and ledger.projection_lag() > 0
        rows: Iterator[dict[str, Any]]
        if lagging:
            rows = (step_json(r) for r in ledger.steps())
        else:
            conn = sqlite3.connect(_readonly_uri(path), uri=True)
            conn.execute("PRAGMA trusted_schema=OFF")
            db = sqlite_utils.Database(conn)
            if what == "events":
                rows = (_export_event(r) for r in db.query("SELECT * FROM events ORDER BY seq"))
            else:
                rows = (
                    dict(r, live=bool(r["live"]))
                    for r in db.query("SELECT * FROM steps ORDER BY first_seq")
                )
        _write_rows(rows, fmt)


def _export_event(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row["payload"] = json.loads(row["payload"])
    row["prev_hash"] = bytes(row["prev_hash"]).hex()
    row["hash"] = bytes(row["hash"]).hex()
    return row


def _write_rows(rows: Iterator[dict[str, Any]], fmt: str) -> None:
    out = sys.stdout
    writer = None
    for row in rows:
        if fmt == "jsonl":
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            continue
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(row))
            writer.writeheader()
        writer.writerow(
            {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()}
        )
    out.flush()


@cli.group()
def step() -> None:
    """Drive one step's artifact protocol by hand (or from a harness in any language).

    \b
        stepledger step store build-7 out/report.xml logs/test.log
        stepledger step publish build-7            # the commit point
        stepledger step ack build-7
    """


def manifest_json(m: Manifest) -> dict[str, Any]:
    return msgspec.to_builtins(m) | {"size": m.size}  # type: ignore[no-any-return]


@step.command("store")
@click.argument("step_id", metavar="STEP")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--run", default="", help="The run this step belongs to (when it starts).")
@json_option
@click.pass_context
def step_store(ctx: click.Context, step_id: str, files: tuple[str, ...], run: str, as_json: bool) -> None:
    """Store FILEs as the step's artifacts, durably, and print their digests.

    Each artifact is named by its path as given (relative, e.g. out/report.xml). The
    step's attempt is planned first if none is in flight. On a committed step the new
    blobs take effect only through a supersede (publish --expected-rev LIVE_REV).
    Small files go inside the ledger, large ones into the blob store beside it.
    """
    for name in files:
        check_relpath(os.path.normpath(name) if not os.path.isabs(name) else name, "artifact path")
    contents = {}
    for name in files:
        with open(name, "rb") as f:
            contents[os.path.normpath(name)] = f.read()
    with _open(ctx, readonly=False) as ledger:
        row = ledger.plan(step_id, run=run, artifacts=tuple(contents))
        if row.live:
            click.echo(
                f"step {step_id} is committed (manifest r{row.manifest_rev}); these blobs"
                f" replace it only when you supersede: 'stepledger step publish {step_id}"
                f" --expected-rev {row.manifest_rev}'", err=True,
            )
        stored = [ledger.store(step_id, row.attempt, p, data) for p, data in contents.items()]
    if as_json:
        _emit_json({"step": step_id, "attempt": row.attempt, "stored": [
            {"path": e.path, "digest": e.digest, "size": e.size, "inline": e.inline} for e in stored
        ]})
        return
    for e in stored:
        where = "inline" if e.inline else "file"
        click.echo(f"{e.digest}  {e.size:>10}  {where:<6}  {e.path}")


@step.command("publish")
@click.argument("step_id", metavar="STEP")
@click.option("--expected-rev", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="-1 creates (a live manifest is returned unchanged); the live revision supersedes it.")
@json_option
@click.pass_context
def step_publish(ctx: click.Context, step_id: str, expected_rev: int, as_json: bool) -> None:
    """Publish the step's manifest: the commit point (a compare-and-swap).

    Every blob the manifest names is re-checked inside the publishing transaction;
    a missing one refuses the publish (exit 1) and nothing changes.
    """
    with _open(ctx, readonly=False) as ledger:
        m = ledger.publish(step_id, expected_rev=expected_rev)
    if as_json:
        _emit_json(manifest_json(m))
        return
    click.echo(f"step {m.step}: manifest r{m.manifest_rev} {m.digest} ({m.size} bytes)")
    for e in (*m.writes, *m.artifacts):
        click.echo(f"  {e.digest}  {e.size:>10}  {e.path}")


@step.command("ack")
@click.argument("step_id", metavar="STEP")
@json_option
@click.pass_context
def step_ack(ctx: click.Context, step_id: str, as_json: bool) -> None:
    """Record that the client learned the step's result (a redelivery changes nothing)."""
    with _open(ctx, readonly=False) as ledger:
        r = ledger.ack(step_id)
    if as_json:
        _emit_json({"step": step_id, "seq": r.seq, "deduped": r.deduped})
    else:
        click.echo(f"step {step_id}: acked" + (" (already)" if r.deduped else ""))


@cli.command()
@json_option
@click.pass_context
def blobs(ctx: click.Context, as_json: bool) -> None:
    """List stored blobs — inline rows and files — and who holds them. Read-only.

    `referenced`: named by some manifest revision; `pinned`: an attempt may still use
    it; neither: an orphan that GC may collect once it is older than the grace window.
    """
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.blob_list()
    if as_json:
        _emit_json(rows)
        return
    click.echo(f"{'DIGEST':<64}  {'SIZE':>10}  {'WHERE':<6}  STATUS")
    for r in rows:
        status = "referenced" if r["referenced"] else "pinned" if r["pinned"] else "orphan"
        click.echo(f"{r['digest']}  {r['size']:>10}  {r['where']:<6}  {status}")
    temps = [r for r in rows if r["where"] == "temp"]
    if temps:
        click.echo(f"{len(temps)} leftover temporary file(s)", err=True)


@cli.command()
@click.option("--artifacts", "n", type=click.IntRange(1, 50), default=5, show_default=True,
              help="Artifacts in the step (alternating inline and file blobs).")
@click.option("--wrong-order", is_flag=True, help="Run the broken protocol (manifest before blobs): must report violations.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), help="Scratch directory (default: a temporary one on this disk).")
@json_option
def chaos(n: int, wrong_order: bool, workdir: str | None, as_json: bool) -> None:
    """Kill a real process (SIGKILL) at every operation of a step; check, replay, check.

    Every file write, fsync, rename, directory fsync, mkdir and SQLite COMMIT of one
    N-artifact step is an operation. For each index k the step runs in a child that
    kills itself before operation k; the ledger is reopened, the step classified
    (committed / no-commit / VIOLATION), replayed under the same step id, and
    classified again. Exit 1 if any violation was found.

    \b
        stepledger chaos --artifacts 5
        stepledger chaos --wrong-order      # the negative control: violations > 0
    """
    from .chaos import run_chaos

    update, finish = _progress("crash points")
    try:
        report = run_chaos(n, wrong_order=wrong_order, workdir=workdir, progress=update)
    finally:
        finish()
    if as_json:
        _emit_json(report.as_json())
    else:
        click.echo(f"{'INDEX':>5}  {'OPERATION':<28}  {'AFTER CRASH':<12}  AFTER REPLAY")
        for r in report.rows:
            click.echo(f"{r.index:>5}  {r.operation:<28}  {r.after_crash:<12}  {r.after_replay}")
        order = "WRONG order (manifest before blobs)" if wrong_order else "correct order"
        click.echo(
            f"chaos: {report.artifacts} artifacts, {order}: {report.indices} crash points,"
            f" {report.violations} violations after crash,"
            f" {report.committed_after_replay}/{report.indices} committed after replay"
            f" ({report.elapsed_s:.1f}s)"
        )
    if report.violations or report.violations_after_replay:
        sys.exit(EXIT_NO)


@cli.command()
@click.option("--keep", metavar="DIR", type=click.Path(file_okay=False), help="Keep the demo's files in DIR.")
@json_option
def demo(keep: str | None, as_json: bool) -> None:
    """Run the end-to-end demonstration on an embedded ledger (the main job).

    Creates a fresh ledger in a temporary directory (or DIR), drives scripted steps
    through it with the failures stepledger exists for, and checks every invariant.
    Exit 0 only if every check held.
    """
    from .demo import run_demo

    report = run_demo(keep, echo=None if as_json else functools.partial(click.echo, err=False))
    if as_json:
        _emit_json(report)
    if not report["ok"]:
        sys.exit(EXIT_NO)


def main() -> None:
    cli(prog_name="stepledger")


__all__ = ["cli", "main"]

"""The `steptrail` command: thin, scriptable, predictable.

Each command parses its arguments, calls the public API and formats the result.
Results go to stdout, progress and logs to stderr, so `--json` output is pure.
Exit codes (docs/design.md "The command line"): 0 success; 1 the answer is no (a
violation found, or the protocol refused); 2 usage or bad input, including a file
that is not a usable ledger; 3 the environment failed (disk full, I/O error, lock
timeout); 130 interrupted (Ctrl-C). Every error is one line on stderr, never a traceback;
a usage error click reports too.

This is the only module that imports click.
"""

from __future__ import annotations

import base64
import codecs
import datetime as dt
import errno
import functools
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import click
import msgspec

from . import __version__
from .errors import (
    EXIT_ENVIRONMENT,
    EXIT_NO,
    EXIT_USAGE,
    CompensationConflict,
    IllegalTransition,
    InvalidInput,
    LedgerError,
    StaleEpoch,
    StepRejected,
    Unsettled,
)
from .events import KINDS, Manifest, RecordedEvent, WitnessAnchored, check_relpath, to_builtins

# A command imports what it uses (the ledger, plans, the store's errors, gc, export, ...)
# when it runs: `steptrail --help` or one command's run pays for no other's imports
# (docs/performance.md "The command line"). Its options' choices are spelled out here;
# tests/test_cli_fast.py checks they are the library's.
if TYPE_CHECKING:
    from .events import BlobStored
    from .workspace.protocol import ApplyResult, Compensation, FileRead, Lease
    from .ledger import Ledger
    from .plans import Plan
    from .projections import StepRow
    from .projections.workspaces import WsRow

#: `ledger.DEFAULT_PATH`, `fences.FENCE_MODES`, `projections.steps.STATES` and `IN_FLIGHT`.
DEFAULT_PATH = os.path.join(".steptrail", "ledger.db")
FENCE_MODES = ("step", "plan", "none")
STATES = ("planned", "fenced", "blob-stored", "manifest-published", "acked", "compensating",
          "compensated", "rejected", "sealed")
IN_FLIGHT = frozenset({"planned", "fenced", "blob-stored", "compensating"})

F = TypeVar("F", bound=Callable[..., Any])

ENV_LEDGER = "STEPTRAIL_LEDGER"
ENV_WITNESS = "STEPTRAIL_WITNESS"
ENV_WORKSPACE = "STEPTRAIL_WORKSPACE"
ENV_EPOCH = "STEPTRAIL_EPOCH"


# -- plumbing -----------------------------------------------------------------------


class Refusal(Exception):
    """A command's answer is no, as a typed `error` (exit per its class); `document` is
    the command's own --json output, which the error object is added to."""

    def __init__(self, error: LedgerError, document: dict[str, Any] | None = None,
                 note: str = "") -> None:
        super().__init__(str(error))
        self.error, self.document, self.note = error, document, note


class _NamesItsParse(click.Command):
    """A usage error of this command's parse names this command (its --help), even when
    click raised it without a context (a flag given a value)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if exc.ctx is None:
                exc.ctx = ctx
            raise


class LedgerCommand(_NamesItsParse, click.Command):
    """Every command of the command line."""


class LedgerSubgroup(_NamesItsParse, click.Group):
    """A group below `steptrail` (workspace, lease, step, witness)."""

    command_class = LedgerCommand
    group_class = type  # its groups are of its class


class LedgerGroup(_NamesItsParse, click.Group):
    """The one place errors leave the command line: every refusal and error becomes one
    line `steptrail: error: TYPE: message` on stderr and its exit code, and under
    --json one error object on stdout (docs/cli-json.md "Errors"). Usage errors (click's
    own: a bad option, a missing argument, an unknown command, wherever parsed) are one
    such line too, `UsageError`, exit 2, naming the --help to read; an interrupt (Ctrl-C)
    is `Interrupted`, exit 130."""

    command_class = LedgerCommand
    group_class = LedgerSubgroup

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        argv = sys.argv[1:] if args is None else list(args)
        prog_name = prog_name or self.name or "steptrail"
        self._main_shell_completion(extra, prog_name, complete_var)
        ctx: click.Context | None = None
        try:
            with self.make_context(prog_name, argv, **extra) as ctx:
                self.invoke(ctx)
        except click.exceptions.Exit as exc:  # --help, --version
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _fail_usage(exc, ctx, _json_requested(ctx, argv))
        except (KeyboardInterrupt, click.Abort):
            _fail_interrupted(ctx, _json_requested(ctx, argv))
        sys.exit(0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Refusal as refusal:
            _fail_typed(ctx, refusal.error, refusal.document, refusal.note)
        except LedgerError as exc:
            _fail_typed(ctx, exc)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own (--help included): `main` reports them
        except Exception as exc:
            _fail_unmapped(ctx, exc)


def _fail_unmapped(ctx: click.Context, exc: Exception) -> None:
    """An exception no typed error carried: the store's (what it means), the OS's, EOF;
    anything else propagates (a bug: its traceback is the report)."""
    from . import unmapped_error

    found = unmapped_error(exc, str((ctx.obj or {}).get("ledger_path", "")))
    if found is not None:  # a store's error no boundary mapped: what it means
        _fail(ctx, found.message, found.exit_code, found.type_name, found.facts)
    try:
        raise exc
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            sys.exit(0)  # the reader of our output went away (| head)
        _fail(ctx, f"{exc.strerror or exc} ({exc.filename or 'no file'})", EXIT_ENVIRONMENT,
              "EnvironmentFailure",
              {"errno": errno.errorcode.get(exc.errno or 0), "filename": _jsonable(exc.filename)})
    except EOFError:
        _fail(ctx, "the input ended before it was complete; give it whole", EXIT_USAGE,
              "InvalidInput")


#: The exit code of a command interrupted by SIGINT (Ctrl-C): 128 + the signal's number.
EXIT_INTERRUPTED = 130


def _json_requested(ctx: click.Context | None, argv: Sequence[str]) -> bool:
    """--json was given: parsed (it is eager), or among the arguments of a parse that
    stopped before reaching it."""
    if ctx is not None and _wants_json(ctx):
        return True
    args = list(argv)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _fail_usage(exc: click.ClickException, ctx: click.Context | None, as_json: bool) -> None:
    """A usage error click raised, as one line naming the --help to read: exit 2."""
    where = getattr(exc, "ctx", None) or ctx
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # a group without its command
        group = exc.ctx.command
        names = group.list_commands(exc.ctx) if isinstance(group, click.Group) else []
        message = f"missing a command: one of {', '.join(names)}"
    else:
        message = exc.format_message().strip()
    message = message[:-1] if message.endswith(".") and not message.endswith("..") else message
    command = where.command_path if where is not None else "steptrail"
    if not command.startswith("steptrail"):  # (an embedding caller's program name)
        command = " ".join(["steptrail", *command.split()[1:]])
    _fail(where, f"{message}; see '{command} --help'", EXIT_USAGE, "UsageError",
          as_json=as_json)


def _fail_interrupted(ctx: click.Context | None, as_json: bool) -> None:
    """Ctrl-C (SIGINT): exit 130 with one line. What an interrupted command leaves is what
    a crash leaves: its transaction in progress rolled back, what it committed kept."""
    try:  # a second Ctrl-C must not cut the one line short
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # (not the main thread)
        previous = None
    try:
        _fail(ctx, "interrupted (SIGINT); what it committed is kept, a transaction in progress"
              " was rolled back, as after a crash: run it again, or 'steptrail verify'",
              EXIT_INTERRUPTED, "Interrupted", as_json=as_json)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


INT64_MAX = 2**63 - 1  # SQLite's INTEGER: larger numbers cannot be stored or compared

#: `ctx.meta` key (shared by every context of one run): the command was given --json.
_JSON_KEY = "steptrail.json"
#: The error object's own keys; an error's facts never take them.
_ERROR_KEYS = frozenset({"type", "message", "exit_code"})


def _ledger_path(ctx: click.Context) -> str:
    """The ledger as messages name it (a URL's password replaced by ***)."""
    from . import shown_location

    return shown_location(str((ctx.obj or {}).get("ledger_path", "the ledger")))


def _wants_json(ctx: click.Context) -> bool:
    """The command was given --json (read first: the option is eager)."""
    return bool(ctx.meta.get(_JSON_KEY))


def _jsonable(value: Any) -> Any:
    """`value` if it is a JSON scalar or a list of them, else its str()."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple) and all(
            x is None or isinstance(x, str | int | float | bool) for x in value):
        return list(value)
    return str(value)


def error_facts(exc: LedgerError) -> dict[str, Any]:
    """The facts a typed error carries (its public attributes; a dict of facts, like
    StepRejected's, is merged in), as JSON values."""
    facts: dict[str, Any] = {}
    for key, value in vars(exc).items():
        if key.startswith("_"):
            continue
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if k not in _ERROR_KEYS:
                facts[k] = _jsonable(v)
    return facts


def _fail_typed(ctx: click.Context, exc: LedgerError,
                document: dict[str, Any] | None = None, note: str = "") -> None:
    """`_fail` for a typed error; `note` is appended to its one line (what still holds)."""
    message = f"{exc}; {note}" if note else str(exc)
    _fail(ctx, message, exc.exit_code, type(exc).__name__, error_facts(exc), document)


def _fail(ctx: click.Context | None, message: str, code: int, type_name: str,
          facts: dict[str, Any] | None = None, document: dict[str, Any] | None = None,
          *, as_json: bool = False) -> None:
    """Exit `code` with one line on stderr naming `type_name`; under --json also print
    one JSON object on stdout: `document` (the command's answer, if it has one) with
    `"ok": false` and `"error": {"type", "message", "exit_code", ...facts}`."""
    message = " ".join(message.split())  # one line, whatever an error quotes
    if as_json or (ctx is not None and _wants_json(ctx)):
        error = {**(facts or {}), "type": type_name, "message": message, "exit_code": code}
        _emit_json({**(document or {}), "ok": False, "error": error})
    click.echo(f"steptrail: error: {type_name}: {message}", err=True)
    sys.exit(code)


def json_option(f: F) -> F:
    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
        if value:
            ctx.meta[_JSON_KEY] = True
        return value

    return click.option(
        "--json", "as_json", is_flag=True, is_eager=True, callback=remember,
        help="Print machine-readable JSON (see docs/cli-json.md).",
    )(f)


def _emit_json(data: Any) -> None:
    click.echo(msgspec.json.encode(data).decode())


def _iso(time_ns: int) -> str:
    return dt.datetime.fromtimestamp(time_ns / 1e9, dt.timezone.utc).isoformat(
        timespec="milliseconds"
    ).replace("+00:00", "Z")


def _n(count: int, noun: str, plural: str = "") -> str:
    """`count noun`, the noun in its plural unless the count is one: "1 step", "2 steps"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


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


def _open(ctx: click.Context, *, readonly: bool, witness_check: bool = True,
          forensic: bool = False) -> Ledger:
    from .ledger import Ledger

    return Ledger.open(ctx.obj["ledger_path"], readonly=readonly, forensic=forensic,
                       witness=ctx.obj.get("witness"), witness_check=witness_check)


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
        if k.endswith("_ns") and isinstance(v, int) and not isinstance(v, bool):
            k, v = k[:-3], _iso(v)  # a time, printed as every time is
        if isinstance(v, bool):
            v = "true" if v else "false"
        if isinstance(v, str) and len(v) == 64:
            v = v[:12] + "…"
        if k == "restored" and isinstance(v, list | tuple):
            # What a compensation did, per outcome: a conflict is not shown as restored.
            by: dict[str, list[str]] = {}
            for x in v:
                by.setdefault(x.get("outcome", "restored"), []).append(x.get("path", "?"))
            parts.extend(f"{outcome}={','.join(paths)}" for outcome, paths in by.items())
            continue
        if isinstance(v, list | tuple):
            v = ",".join(x if isinstance(x, str) else x.get("path", "?") for x in v)
        parts.append(f"{k}={v}")
    return " ".join(parts)


# -- the group ----------------------------------------------------------------------


@click.group("steptrail", cls=LedgerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="steptrail")
@click.option(
    "--ledger",
    "ledger_path",
    envvar=ENV_LEDGER,
    default=DEFAULT_PATH,
    show_default=True,
    metavar="PATH|URL",
    help=f"The ledger file, or a postgresql:// URL (or set {ENV_LEDGER}).",
)
@click.option(
    "--workspace",
    "workspace",
    envvar=ENV_WORKSPACE,
    metavar="NAME",
    help=f"The workspace lease and step commands act on (or set {ENV_WORKSPACE}).",
)
@click.option(
    "--witness",
    "witness",
    envvar=ENV_WITNESS,
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help=f"A witness file outside the ledger (another volume), by absolute path: it receives"
    f" the chain head after every commit, and opening fails closed if the ledger lost or"
    f" rewrote what it witnessed, or the witness is missing (or set {ENV_WITNESS}). The"
    f" ledger records it: later commands use it without this flag; to move it, see"
    f" 'steptrail witness anchor'.",
)
@click.pass_context
def cli(ctx: click.Context, ledger_path: str, workspace: str | None, witness: str | None) -> None:
    """Record, inspect and verify durable coding-agent steps.

    Every transition of every step is an immutable, hash-chained event in one
    SQLite WAL file (or a PostgreSQL database: --ledger postgresql://...),
    appended atomically with its journal (idempotency) key.

    \b
    Start here:
        steptrail init                      # create ./.steptrail/ledger.db
        steptrail steps                     # every step and its state
        steptrail show STEP                 # one step's timeline
        steptrail verify                    # chain, seq, projections
        steptrail head                      # record this elsewhere; later:
        steptrail verify --expect-head SEQ:HASH

    \b
    Drive a workspace from a harness in any language:
        steptrail workspace add w ./repo
        steptrail --workspace w lease acquire --holder agent-1 --ttl 10m --json
        steptrail --workspace w workspace read app.py --json   # rev, pre_hash to plan with
        steptrail --workspace w step plan --epoch 1 plan.json
        steptrail step apply s1 --epoch 1 --json > receipt.json
        steptrail step publish s1 --receipt receipt.json && steptrail step ack s1
        steptrail metrics

    \b
    Account for the bytes, collect orphans, outlive the machine:
        steptrail audit                     # every stored byte in one bucket
        steptrail gc --dry-run              # what gc would collect; then: steptrail gc
        steptrail restore --workspace w --to /mnt/fresh/w
        steptrail copy .steptrail/ledger.db postgresql://me@db/ledger

    \b
    Exit codes: 0 ok, 1 the answer is no (violation or refusal),
    2 usage or bad input (incl. a file that is not a ledger), 3 environment failure,
    130 interrupted (Ctrl-C: what was committed is kept, nothing half done).
    """
    ctx.ensure_object(dict)
    ctx.obj["ledger_path"] = ledger_path
    ctx.obj["workspace"] = workspace or None
    ctx.obj["witness"] = witness or None


@cli.command()
@click.option("--parents", is_flag=True, help="Create every missing directory on the"
              " ledger's path (like mkdir -p). Without it only the ledger's own directory"
              " is created, and a missing directory above it is refused (exit 2).")
@json_option
@click.pass_context
def init(ctx: click.Context, parents: bool, as_json: bool) -> None:
    """Create a ledger (and its own directory); a no-op if one is already there.

    A file that exists and is not a ledger is refused and left untouched. Only the
    directory the ledger file is in is created (ws/.steptrail below): a missing
    directory above it is refused, nothing written, unless --parents.

    \b
        steptrail --ledger ws/.steptrail/ledger.db init
        steptrail --ledger /srv/ledgers/app/ledger.db init --parents
    """
    from . import Ledger, locate

    path = ctx.obj["ledger_path"]
    with Ledger.init(path, witness=ctx.obj.get("witness"), parents=parents) as ledger:
        info = {"path": ledger.path if locate(path).in_database else os.path.abspath(path),
                "created": ledger.created, "ledger_id": ledger.ledger_id}
    if as_json:
        _emit_json(info)
    elif info["created"]:
        click.echo(f"created ledger {info['path']}")
    else:
        click.echo(f"ledger {info['path']} already exists; nothing changed")


@cli.command()
@click.option("--step", "step", metavar="STEP", help="Only this step's events.")
@click.option("--kind", type=click.Choice(KINDS), help="Only events of this kind.")
@click.option("--after", "after_seq", type=click.IntRange(min=0, max=INT64_MAX), default=0, help="Only events after this seq.")
@click.option("--limit", type=click.IntRange(min=1, max=INT64_MAX), help="At most this many events.")
@json_option
@click.pass_context
def events(
    ctx: click.Context, step: str | None, kind: str | None, after_seq: int, limit: int | None,
    as_json: bool,
) -> None:
    """List events in seq order. Read-only.

    \b
        steptrail events --step fetch
        steptrail events --kind manifest-published --json
    """
    # Everything is read before anything is printed: a damaged row fails the command
    # with one error line, not after a partial document.
    with _open(ctx, readonly=True) as ledger, _Spool() as out:
        it = ledger.read(after_seq, step=step, kind=kind, limit=limit)
        if as_json:
            out.write("[")
            for i, r in enumerate(it):
                out.write(("," if i else "") + msgspec.json.encode(event_json(r)).decode())
            out.write("]\n")
        else:
            for r in it:
                ev = r.event
                who = f"{getattr(ev, 'step', '') or getattr(ev, 'workspace', '')}"
                attempt = getattr(ev, "attempt", 0)
                out.write(
                    f"{r.seq:>8}  {_iso(r.time_ns)}  {r.kind:<18}  {who}"
                    + (f" #{attempt}" if attempt else "") + f"  {_event_detail(r)}\n"
                )
        out.done()


@cli.command()
@click.option("--state", "states", type=click.Choice(STATES), multiple=True,
              help="Only steps in this state (repeat it for several).")
@click.option("--in-flight", is_flag=True,
              help="Only steps in flight: planned, fenced or blob-stored (finish or replay them).")
@json_option
@click.pass_context
def steps(ctx: click.Context, states: tuple[str, ...], in_flight: bool, as_json: bool) -> None:
    """List steps and their current state (their latest attempt's). Read-only.

    A step is committed when it has a live manifest.

    \b
        steptrail steps --in-flight             # after a crash: replay or settle these
        steptrail steps --state blob-stored --state fenced
        steptrail steps --json | jq '.[] | select(.committed)'
    """
    wanted = set(states) | (set(IN_FLIGHT) if in_flight else set())
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.steps(next(iter(wanted)) if len(wanted) == 1 else None)
    rows = [r for r in rows if not wanted or r.state in wanted]
    if as_json:
        _emit_json([step_json(r) for r in rows])
        return
    if not rows:
        shown = " or ".join(sorted(wanted))
        click.echo("no steps" + (f" in state {shown}" if wanted else ""), err=True)
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
        steptrail show fetch
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
        click.echo(f"  manifest revision {row.manifest_rev} ({live}),"
                   f" {_n(row.committed_bytes, 'byte')}")
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
        click.echo(f"rebuilt {_n(n_steps, 'step')} from {_n(n_events, 'event')}")


@cli.command()
@click.option(
    "--expect-head",
    metavar="SEQ:HASH",
    help="A head printed earlier by 'steptrail head': prove nothing up to it was lost.",
)
@json_option
@click.pass_context
def verify(ctx: click.Context, expect_head: str | None, as_json: bool) -> None:
    """Verify the ledger: SQLite integrity, the hash chain, dense seqs, projections.

    Reads everything and writes nothing. Exit 1 when anything is wrong, listing every
    finding. A hash chain cannot see its own tail cut off or the file rolled back to
    an older copy: keep a witness (--witness, updated after every commit) or record
    'steptrail head' elsewhere and pass it as --expect-head. With a witness, verify
    reports (rather than refuses) a ledger its witness does not match.

    \b
        steptrail verify
        steptrail --witness /other/volume/ledger.witness verify
        steptrail verify --expect-head "$(cat /other/volume/ledger.head)"
    """
    update, finish = _progress("verifying")
    with _open(ctx, readonly=True, witness_check=False, forensic=True) as ledger:
        try:
            report = ledger.verify(expect_head=expect_head, progress=update)
        finally:
            finish()
    if as_json:
        _emit_json(report)
    else:
        for f in report.findings:
            click.echo(f"VIOLATION [{f.check}] {f.message}")
        for f in report.warnings:
            click.echo(f"WARNING [{f.check}] {f.message}")
        lag = (f", projections lag {_n(report.projection_lag, 'event')}"
               if report.projection_lag else "")
        verdict = "ok" if report.ok else _n(len(report.findings), "finding")
        if report.warnings:
            verdict += f", {_n(len(report.warnings), 'warning')}"
        click.echo(
            f"verify: {verdict} — {_n(report.events, 'event')}, {_n(report.steps, 'step')},"
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
    'steptrail verify --expect-head SEQ:HASH' to prove no history was cut off.
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
        steptrail export --what events > events.jsonl
        steptrail export --what steps --format csv > steps.csv
    """
    from . import locate
    from .store.sqlite.export import exported_rows, unexportable

    path = ctx.obj["ledger_path"]
    if locate(path).in_database:
        raise InvalidInput("export reads a SQLite ledger file; for a PostgreSQL ledger copy"
                           " it to a file first: steptrail copy URL ledger.db, then"
                           " steptrail --ledger ledger.db export")
    # validates the file before anything reads it; the output is spooled, so a damaged
    # row fails the command before anything is printed
    with _open(ctx, readonly=True) as ledger, _Spool() as out:
        try:
            if what == "steps" and ledger.projection_lag() > 0:
                _write_rows((step_json(r) for r in ledger.steps()), fmt, out)
            else:
                with exported_rows(path, what) as rows:
                    _write_rows(rows, fmt, out)
        except LedgerError:
            raise
        except (ValueError, TypeError, KeyError) as exc:  # a row that cannot be written
            raise unexportable(path, exc) from None
        out.done()


class _Spool:
    """Output held back (in memory, then a temporary file) until `done()`, then copied to
    stdout; dropped if the command fails first."""

    def __init__(self) -> None:
        self._file: Any = None

    def __enter__(self) -> _Spool:
        import tempfile

        self._file = tempfile.SpooledTemporaryFile(max_size=32 * 1024 * 1024, mode="w+",
                                                   encoding="utf-8", newline="")
        return self

    def write(self, text: str) -> int:
        return int(self._file.write(text))

    def done(self) -> None:
        self._file.seek(0)
        while chunk := self._file.read(1 << 20):
            sys.stdout.write(chunk)
        sys.stdout.flush()

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def _write_rows(rows: Iterator[dict[str, Any]], fmt: str, out: Any) -> None:
    import csv
    import json

    writer = None
    for row in rows:
        if fmt == "jsonl":
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            continue
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(row))
            writer.writeheader()
        writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(value: Any) -> Any:
    """A CSV cell: a boolean as true/false (as in JSON, not Python's True), an object or
    a list as its JSON text, None as an empty cell."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return value


# -- workspaces, leases and the workspace step protocol ------------------------------


def _examples(*lines: str) -> str:
    """An epilog of examples, kept verbatim by click's help formatter."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


DURATION_MAX_S = 100 * 365 * 86400.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*")


class Duration(click.ParamType):
    """A duration such as 60s, 10m, 24h, 2d or 500ms; a plain number is seconds."""

    name = "duration"

    def __init__(self, *, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            m = _DURATION_RE.fullmatch(str(value))
            if m is None:
                self.fail(f"{value!r} is not a duration; write e.g. 60s, 10m, 24h"
                          " (a plain number is seconds)", param, ctx)
            seconds = float(m[1]) * _UNITS[m[2] or "s"]
        if seconds < 0 or (seconds == 0 and not self.allow_zero):
            self.fail(f"{value!r}: a duration must be more than zero", param, ctx)
        if not math.isfinite(seconds) or seconds > DURATION_MAX_S:
            self.fail(f"{str(value)[:40]!r}: a duration must be at most {DURATION_MAX_S:.0f}s"
                      " (100 years)", param, ctx)
        return seconds


DURATION = Duration()

#: `lease acquire` and `lease heartbeat`'s default TTL: time for a person typing commands
#: between them (the library's default, for a harness that heartbeats, is 60 s).
CLI_LEASE_TTL = "10m"


def workspace_option(f: F) -> F:
    return click.option(
        "--workspace", "ws_name", metavar="NAME",
        help=f"The workspace (default: the global --workspace, or {ENV_WORKSPACE}).",
    )(f)


def fence_options(f: F) -> F:
    """`--fence` and `--journal/--no-journal`: the operator's protections (step plan, run)."""
    f = click.option("--journal/--no-journal", default=True, show_default=True,
                     help="--no-journal: a redelivered apply applies again. Recorded;"
                          " verify warns.")(f)
    return click.option("--fence", type=click.Choice(FENCE_MODES), default="step",
                        show_default=True,
                        help="The operator's choice of fence: 'plan' checks only the workspace"
                             " rev, 'none' nothing (a human's edit is overwritten). Recorded;"
                             " verify warns.")(f)


def _workspace(ctx: click.Context, ws_name: str | None) -> str:
    name = ws_name or ctx.obj.get("workspace")
    if not name:
        raise InvalidInput(f"which workspace? give --workspace NAME (or set {ENV_WORKSPACE});"
                           " 'steptrail workspace list' shows them")
    return str(name)


def epoch_option(help_text: str) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        return click.option(
            "--epoch", type=click.IntRange(min=1, max=INT64_MAX), envvar=ENV_EPOCH, show_envvar=True,
            metavar="N", help=help_text,
        )(f)

    return decorate


def _need_epoch(epoch: int | None, what: str) -> int:
    if epoch is None:
        raise InvalidInput(f"{what} needs the live epoch: give --epoch N (the epoch"
                           f" 'steptrail lease acquire' printed) or set {ENV_EPOCH}")
    return epoch


def _check_live(ledger: Ledger, row: StepRow, epoch: int | None) -> None:
    """With --epoch, a writing step's command is refused unless that epoch is live and no
    older than the epoch its attempt was planned under — its answer too, when the step
    is already done (a zombie must not hear a newer epoch's work as its own)."""
    if epoch is None or not row.workspace or row.epoch == 0:
        return
    lease = ledger.workspaces.lease(row.workspace)
    if not lease.live or lease.epoch != epoch or epoch < row.epoch:
        raise StaleEpoch(row.workspace, epoch, lease.epoch if lease.live else None,
                         f"attempt {row.attempt} of step {row.step_id!r} was planned under"
                         f" epoch {row.epoch}" if epoch < row.epoch else "",
                         latest=lease.epoch, holder=lease.holder)


def workspace_json(row: WsRow, now_ns: int) -> dict[str, Any]:
    return {
        "name": row.name, "root": row.root, "rev": row.rev, "epoch": row.epoch,
        "holder": row.holder, "expires_ns": row.expires_ns,
        "expires": _iso(row.expires_ns) if row.epoch else None,
        "released": row.released, "live": row.live_epoch(now_ns) is not None,
        "acquired_ns": row.acquired_ns, "last_seq": row.last_seq,
    }


def lease_json(lease: Lease, now_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(lease)
    out["expires"] = _iso(lease.expires_ns) if lease.epoch else None
    out["remaining_s"] = max(0.0, (lease.expires_ns - now_ns) / 1e9) if lease.live else 0.0
    return out


def compensation_json(c: Compensation) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(c)
    out["conflicts"] = [r.path for r in c.conflicts]
    return out


def _lease_state(live: bool, released: bool, expires_ns: int) -> str:
    """A lease's state and time in words: "live, expires T", "expired at T", "released"."""
    if live:
        return f"live, expires {_iso(expires_ns)}"
    return "released" if released else f"expired at {_iso(expires_ns)}"


def _lease_line(lease: Lease) -> str:
    if lease.epoch == 0:
        return f"workspace {lease.workspace}: never leased"
    return (f"workspace {lease.workspace}: epoch {lease.epoch} held by {lease.holder},"
            f" {_lease_state(lease.live, lease.released, lease.expires_ns)}")


@cli.group()
def workspace() -> None:
    """Register and inspect workspaces: named directories that steps write to.

    \b
        steptrail workspace add w ./repo
        steptrail workspace show w --json
        steptrail --workspace w workspace read app.py   # the bytes; rev + pre_hash to plan with
    """


@workspace.command("add", epilog=_examples(
    "steptrail workspace add agent-1 ./checkout",
    "steptrail workspace add agent-1 ./checkout --json   # again: a no-op",
    "steptrail workspace add agent-1 ./moved-checkout --rebind   # it moved: re-register",
    "steptrail workspace add dotfiles ~/dots --allow-git   # steps may write .git/",
))
@click.argument("name")
@click.argument("directory", metavar="DIR")
@click.option("--rebind", is_flag=True,
              help="Re-register an added workspace: at DIR (moved, or restored by other"
                   " means), with DIR's device and inode and these options.")
@click.option("--allow-git", is_flag=True,
              help="Let steps write .git internals (hooks, config); refused by default.")
@json_option
@click.pass_context
def workspace_add(ctx: click.Context, name: str, directory: str, rebind: bool, allow_git: bool,
                  as_json: bool) -> None:
    """Register the existing directory DIR as workspace NAME (a no-op if it is already).

    DIR is recorded resolved, with its device and inode: a step's writes are refused
    when the directory there is no longer that one (swapped for a symlink, moved,
    replaced). DIR may not overlap another workspace's directory, nor be the ledger's
    own directory; the ledger's directory may sit inside DIR (like .git in a repository:
    steps never write it).
    """
    with _open(ctx, readonly=False) as ledger:
        existing = next((r for r in ledger.workspaces.list() if r.name == name), None)
        before = ledger.workspaces.registration(name) if existing is not None else None
        row = ledger.workspaces.add(name, directory, allow_git=allow_git, rebind=rebind)
        after = ledger.workspaces.registration(name)
        now = ledger.clock()
    rebound = before is not None and after.seq != before.seq
    if as_json:
        _emit_json(workspace_json(row, now) | {"added": existing is None, "rebound": rebound,
                                               "allow_git": after.allow_git,
                                               "identity": after.identity is not None})
    elif existing is None:
        click.echo(f"added workspace {row.name} at {row.root}")
    elif rebound:
        click.echo(f"re-registered workspace {row.name} at {row.root}")
    else:
        click.echo(f"workspace {row.name} at {row.root} already added; nothing changed")


@workspace.command("list", epilog=_examples("steptrail workspace list",
                                            "steptrail workspace list --json | jq '.[].name'"))
@json_option
@click.pass_context
def workspace_list(ctx: click.Context, as_json: bool) -> None:
    """List workspaces with their revision and lease. Read-only."""
    with _open(ctx, readonly=True) as ledger:
        rows = ledger.workspaces.list()
        now = ledger.clock()
    if as_json:
        _emit_json([workspace_json(r, now) for r in rows])
        return
    if not rows:
        click.echo("no workspaces; add one with 'steptrail workspace add NAME DIR'", err=True)
        return
    click.echo(f"{'NAME':<24} {'REV':>6} {'EPOCH':>5} {'LEASE':<8} {'HOLDER':<20} ROOT")
    for r in rows:
        state = ("live" if r.live_epoch(now) is not None else "released" if r.released
                 else "expired" if r.epoch else "-")
        click.echo(f"{r.name:<24} {r.rev:>6} {r.epoch:>5} {state:<8} {r.holder or '-':<20} {r.root}")


@workspace.command("show", epilog=_examples("steptrail workspace show w",
                                            "steptrail --workspace w workspace show --json"))
@click.argument("name", required=False)
@json_option
@click.pass_context
def workspace_show(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """Show a workspace: revision, lease, and every path a step wrote. Read-only.

    NAME defaults to the global --workspace. Each path shows its rev (of its last
    applied write) and the sha256 of the content it should hold (null: absent).
    """
    name = _workspace(ctx, name)
    with _open(ctx, readonly=True) as ledger:
        row = ledger.workspaces.get(name)
        paths = ledger.workspaces.paths(name)
        unsettled = ledger.workspaces.unsettled(name, row.epoch) if row.epoch else []
        now = ledger.clock()
    data = workspace_json(row, now) | {
        "paths": [{"path": p, "rev": rev, "hash": h} for p, (rev, h) in paths.items()],
        "unsettled": unsettled,
    }
    if as_json:
        _emit_json(data)
        return
    click.echo(f"workspace {row.name} at {row.root}: rev {row.rev}")
    if row.epoch:
        click.echo(f"  lease: epoch {row.epoch} held by {row.holder},"
                   f" {_lease_state(data['live'], row.released, row.expires_ns)}")
    else:
        click.echo("  lease: never leased")
    if unsettled:
        click.echo(f"  unsettled (older epochs, in flight): {', '.join(unsettled)}")
    for p in data["paths"]:
        click.echo(f"  {p['rev']:>6}  {(p['hash'] or 'absent')[:16]:<16}  {p['path']}")


@workspace.command("read", epilog=_examples(
    "steptrail --workspace w workspace read app.py > app.py.seen   # rev, pre_hash: stderr",
    "steptrail workspace read app.py --workspace w --json | jq -r .pre_hash",
))
@click.argument("path", metavar="PATH")
@workspace_option
@json_option
@click.pass_context
def workspace_read(ctx: click.Context, path: str, ws_name: str | None, as_json: bool) -> None:
    """Read PATH as a planner must: its bytes, with their sha256 and the path's rev. Read-only.

    This is where a plan's pre_hash comes from: the hash of exactly the bytes the planner
    read, taken as it read them, and base_rev the rev read with them. A write planned
    from them is refused if anything (another step, a person's edit) changed the path
    after this read. The bytes go to stdout unchanged, and one line to stderr:
    '# rev N pre_hash HASH' ('pre_hash absent': no such file; plan it with
    "pre_hash": null). --json prints them in one object (content as text when it is
    UTF-8, else content_base64). Files up to 1 GiB.
    """
    from .plans import INPUT_FILE_MAX

    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        got = ledger.workspaces.read_file(name, path, max_bytes=INPUT_FILE_MAX)
    if as_json:
        _emit_json(file_read_json(got))
        return
    if got.content is not None:
        sys.stdout.flush()
        sys.stdout.buffer.write(got.content)
        sys.stdout.buffer.flush()
    click.echo(f"# rev {got.rev} pre_hash {got.pre_hash or 'absent'}", err=True)


def file_read_json(got: FileRead) -> dict[str, Any]:
    """The `workspace read --json` document (docs/cli-json.md)."""
    out: dict[str, Any] = {"workspace": got.workspace, "path": got.path, "rev": got.rev,
                           "pre_hash": got.pre_hash, "exists": got.content is not None,
                           "size_bytes": None, "content": None}
    if got.content is not None:
        out["size_bytes"] = len(got.content)
        try:
            out["content"] = got.content.decode("utf-8")
        except UnicodeDecodeError:
            out["content_base64"] = base64.b64encode(got.content).decode("ascii")
    return out


@workspace.command("snapshot", epilog=_examples(
    "steptrail --workspace w workspace snapshot app.py src/util.py --json",
))
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@workspace_option
@json_option
@click.pass_context
def workspace_snapshot(ctx: click.Context, paths: tuple[str, ...], ws_name: str | None,
                       as_json: bool) -> None:
    """Each PATH's rev and the sha256 of what is on disk NOW. Read-only.

    Not a planner's pre_hash: it hashes the disk at this moment, not the bytes the
    planner read, so a person's edit made between the planner's read and this snapshot
    would be hashed in and applied over without a refusal. When planning, take rev and
    pre_hash from 'steptrail workspace read' (the bytes and their hash together). A
    snapshot answers "what is there now" (null: the file is absent).
    """
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        snaps = [(p, *ledger.workspaces.snapshot(name, p)) for p in paths]
    if as_json:
        _emit_json({"workspace": name, "paths": [
            {"path": p, "base_rev": rev, "pre_hash": h} for p, rev, h in snaps]})
        return
    for p, rev, h in snaps:
        click.echo(f"{rev:>6}  {h or 'absent':<64}  {p}")


@cli.group()
def lease() -> None:
    """Acquire, keep alive, release and inspect a workspace's epoch lease.

    A lease is the live epoch of a workspace: every effect of a step that writes the
    workspace carries its epoch and is refused unless it is the live one. Acquiring a
    new epoch first settles (compensates) the older epochs' unfinished attempts.

    \b
        EPOCH=$(steptrail --workspace w lease acquire --holder agent-1 --ttl 10m --json | jq .epoch)
        steptrail --workspace w lease heartbeat --epoch "$EPOCH" --ttl 10m
        steptrail --workspace w lease release --epoch "$EPOCH"
    """


@lease.command("acquire", epilog=_examples(
    "steptrail --workspace w lease acquire --holder agent-1 --ttl 10m",
    "steptrail lease acquire --workspace w --holder agent-2 --force --json",
))
@workspace_option
@click.option("--holder", required=True, metavar="NAME", help="Who holds the lease (shown to others).")
@click.option("--ttl", type=DURATION, default=CLI_LEASE_TTL, show_default=True,
              help="How long the lease lives without a heartbeat: 60s, 10m, 24h (at most 7d)."
                   f" The default, {CLI_LEASE_TTL}, leaves a person typing commands time; the"
                   " library's ledger.workspaces.acquire defaults to 60s (a harness heartbeats).")
@click.option("--force", is_flag=True, help="Take over even while another lease is live (its epoch dies now).")
@json_option
@click.pass_context
def lease_acquire(ctx: click.Context, ws_name: str | None, holder: str, ttl: float, force: bool,
                  as_json: bool) -> None:
    """Start a new epoch on the workspace and print it; settle older epochs first.

    Refused (exit 1) while another lease is live, unless --force. Every attempt of an
    older epoch still in flight is compensated before this returns (listed as settled).
    Exit 1 as `lease settle` when settling left a path for a human (a conflict) or could
    not settle a step: the lease is acquired all the same, its epoch printed.
    """
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.acquire(name, holder, ttl, force=force)
        now = ledger.clock()
    document = lease_json(got, now)
    if not as_json:
        click.echo(f"epoch {got.epoch}: workspace {name} leased by {holder} until"
                   f" {_iso(got.expires_ns)}")
        if got.settled:
            click.echo(f"settled (compensated) older epochs' steps: {', '.join(got.settled)}")
    # the lease is acquired all the same: the error says so, and --json prints its document
    held = f"the lease is held (epoch {got.epoch})"
    if got.unsettled:
        raise Refusal(Unsettled(name, list(got.unsettled)), document if as_json else None,
                      f"{held}; settle them with 'steptrail lease settle --epoch {got.epoch}'"
                      " before new work")
    if got.conflicts:
        raise Refusal(CompensationConflict([f"{c.step}:{c.path}" for c in got.conflicts]),
                      document if as_json else None, f"{held}")
    if as_json:
        _emit_json(document)


@lease.command("heartbeat", epilog=_examples(
    "steptrail --workspace w lease heartbeat --epoch 3 --ttl 10m"))
@workspace_option
@epoch_option("The live epoch to extend.")
@click.option("--ttl", type=DURATION, default=CLI_LEASE_TTL, show_default=True,
              help="Extend the lease to now + TTL (never shortens it). The default is"
                   f" {CLI_LEASE_TTL}, as for 'lease acquire' (the library's: 60s).")
@json_option
@click.pass_context
def lease_heartbeat(ctx: click.Context, ws_name: str | None, epoch: int | None, ttl: float,
                    as_json: bool) -> None:
    """Extend the live lease; an expired one is never revived (exit 1: acquire anew)."""
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "a heartbeat")
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.heartbeat(name, epoch, ttl)
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now))
    else:
        click.echo(_lease_line(got))


@lease.command("release", epilog=_examples("steptrail --workspace w lease release --epoch 3"))
@workspace_option
@epoch_option("The epoch to give up.")
@json_option
@click.pass_context
def lease_release(ctx: click.Context, ws_name: str | None, epoch: int | None, as_json: bool) -> None:
    """Give the lease up so the next acquire needs no --force (idempotent)."""
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "a release")
    with _open(ctx, readonly=False) as ledger:
        got = ledger.workspaces.release(name, epoch)
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now))
    else:
        click.echo(_lease_line(got))


@lease.command("show", epilog=_examples("steptrail --workspace w lease show",
                                        "steptrail lease show --workspace w --json"))
@workspace_option
@json_option
@click.pass_context
def lease_show(ctx: click.Context, ws_name: str | None, as_json: bool) -> None:
    """Show the workspace's lease: epoch, holder, expiry, live or not. Read-only."""
    name = _workspace(ctx, ws_name)
    with _open(ctx, readonly=True) as ledger:
        got = ledger.workspaces.lease(name)
        unsettled = ledger.workspaces.unsettled(name, got.epoch) if got.epoch else []
        now = ledger.clock()
    if as_json:
        _emit_json(lease_json(got, now) | {"unsettled": unsettled})
        return
    click.echo(_lease_line(got))
    if unsettled:
        click.echo(f"unsettled (older epochs, in flight): {', '.join(unsettled)};"
                   f" run 'steptrail lease settle --epoch {got.epoch}'")


@lease.command("settle", epilog=_examples("steptrail --workspace w lease settle --epoch 4 --json"))
@workspace_option
@epoch_option("The live epoch that settles the older ones.")
@json_option
@click.pass_context
def lease_settle(ctx: click.Context, ws_name: str | None, epoch: int | None, as_json: bool) -> None:
    """Compensate every attempt of an older epoch still in flight, under the live epoch.

    `lease acquire` does this itself; run it when an apply answers Unsettled. Exit 1
    when a path conflicts (it was changed since: nothing was overwritten, a human decides).
    """
    from .workspace.protocol import settle_conflicts

    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "settling")
    with _open(ctx, readonly=False) as ledger:
        done = ledger.workspaces.settle(name, epoch)
    conflicts = [f"{c.step}:{r.path}" for c in done for r in c.conflicts]
    document = {"workspace": name, "epoch": epoch,
                "settled": [compensation_json(c) for c in done],
                "conflicts": msgspec.to_builtins(settle_conflicts(done))}
    if not as_json:
        if not done:
            click.echo(f"workspace {name}: nothing to settle")
        for c in done:
            _echo_compensation(c)
    if conflicts:
        raise Refusal(CompensationConflict(conflicts), document if as_json else None)
    if as_json:
        _emit_json(document)


# -- the step group -------------------------------------------------------------------


@cli.group()
def step() -> None:
    """Drive one step's protocol by hand, or from a harness in any language.

    \b
    A step that only stores artifacts (no lease):
        steptrail step store build-7 out/report.xml logs/test.log
        steptrail step publish build-7            # the commit point
        steptrail step ack build-7
    \b
    A step that writes a workspace, under the live epoch (--epoch or STEPTRAIL_EPOCH):
        steptrail --workspace w step plan --epoch 3 plan.json
        steptrail step apply s1 --epoch 3 --json > applied.json
        steptrail step publish s1 --receipt applied.json
        steptrail step ack s1
    \b
    The same in one process (a harness's one call per step; safe to re-run):
        steptrail --workspace w step run plan.json out/log.txt --epoch 3 --json
    """


@step.command("plan", epilog=_examples(
    "steptrail --workspace w step plan --epoch 3 plan.json",
    "echo '{\"step\": \"s1\", \"writes\": [{\"path\": \"app.py\", \"base_rev\": 0,"
    " \"pre_hash\": null, \"content\": \"print(1)\\n\"}]}' |"
    " steptrail --workspace w step plan --epoch 3 -",
))
@click.argument("plan_file", metavar="FILE|-", type=click.Path(dir_okay=False, allow_dash=True, exists=True))
@workspace_option
@epoch_option("The live epoch the steps run under.")
@fence_options
@json_option
@click.pass_context
def step_plan(ctx: click.Context, plan_file: str, ws_name: str | None, epoch: int | None,
              fence: str, journal: bool, as_json: bool) -> None:
    """Admit a plan (JSON from FILE, or stdin with -): each step's durable intent record.

    Every write names the content it was planned against (pre_hash, null: absent) and
    its new content; steps of one plan writing the same path must chain, or they are
    all rejected (overlap, exit 1). A bad plan is exit 2 and writes nothing. The format
    is in docs/cli-json.md ("The plan format"); content_file paths are relative to the
    plan file's directory (the current directory for stdin) and stay inside it.
    Only the operator turns a protection off (--fence plan|none, --no-journal): a plan
    that sets "fence" or "journal" otherwise is refused (exit 2, OperatorOnly).
    """
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "planning")
    plan = _read_plan(ctx, plan_file)
    with _open(ctx, readonly=False) as ledger:
        rows, rejected = _admit(ledger, name, epoch, plan, fence, journal)
    document = {"workspace": name, "epoch": epoch, "ok": rejected is None, "steps": rows}
    if not as_json:
        _echo_admitted(rows)
    if rejected is not None:
        raise Refusal(_rejection(rejected), document if as_json else None)
    if as_json:
        _emit_json(document)


def _read_plan(ctx: click.Context, plan_file: str) -> Plan:
    """The plan in FILE (or stdin, -), checked; its content files are closed with `ctx`."""
    from .plans import load_plan

    with click.open_file(plan_file, "rb") as f:
        raw = f.read()
    base_dir = os.getcwd() if plan_file == "-" else os.path.dirname(os.path.abspath(plan_file))
    plan = load_plan(raw, base_dir)
    ctx.call_on_close(plan.close)
    return plan


def _admit(ledger: Ledger, name: str, epoch: int, plan: Plan, fence: str, journal: bool
           ) -> tuple[list[dict[str, Any]], ApplyResult | None]:
    """Admit `plan` (`step plan`'s work, after the settled check): one row per step as
    `step plan --json` prints it, and the first rejected step's verdict (None: none)."""
    from .plans import check_settled

    check_settled(ledger, name, epoch)
    plans = plan.steps
    before = {p.step: ledger.find_step(p.step) for p in plans}
    verdicts = ledger.workspaces.admit(name, epoch, plans, fence=fence,  # type: ignore[arg-type]
                            journal=journal, plan_rev=plan.plan_rev)
    rows = []
    for p, v in zip(plans, verdicts, strict=True):
        if v is not None:
            rows.append({"step": p.step, "attempt": v.attempt, "verdict": v.verdict,
                         "detail": v.detail})
            continue
        row = ledger.step(p.step)
        old = before[p.step]
        fresh = old is None or row.attempt != old.attempt
        rows.append({"step": p.step, "attempt": row.attempt,
                     "verdict": "admitted" if fresh else "unchanged",
                     "detail": "" if fresh else f"attempt {row.attempt} is {row.state}"
                     + (" (committed)" if row.live else "")
                     + "; this plan is the one recorded for it"})
    rejected = next((v for r, v in zip(rows, verdicts, strict=True)
                     if r["verdict"].startswith("rejected")), None)
    return rows, rejected


def _echo_admitted(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        click.echo(f"{r['verdict']:<18} {r['step']}  attempt {r['attempt']}"
                   + (f"  ({r['detail']})" if r["detail"] else ""))


def _rejection(result: ApplyResult) -> StepRejected:
    """The typed error of a `rejected:<reason>` verdict."""
    return StepRejected(result.step, result.attempt, result.verdict.removeprefix("rejected:"),
                        result.detail, result.facts)


def apply_json(result: ApplyResult) -> dict[str, Any]:
    """The `step apply --json` document (the fence's facts go in the error object)."""
    doc: dict[str, Any] = msgspec.to_builtins(result)
    del doc["facts"]
    del doc["committed"]  # the command line's apply never commits (step publish does)
    del doc["manifest"]
    return doc


@step.command("apply", epilog=_examples(
    "steptrail step apply s1 --epoch 3",
    "steptrail step apply s1 --epoch 3 --json > applied.json   # the receipt for publish",
))
@click.argument("step_id", metavar="STEP")
@click.option("--attempt", type=click.IntRange(min=1, max=INT64_MAX), metavar="N",
              help="The attempt (default: the latest).")
@epoch_option("The live epoch (the one the step was planned under).")
@json_option
@click.pass_context
def step_apply(ctx: click.Context, step_id: str, attempt: int | None, epoch: int | None,
               as_json: bool) -> None:
    """Fence and apply the step's writes; print the verdict and the receipt.

    Exit 0 when applied, or deduped (a redelivery: the first apply's receipt); exit 1
    when rejected (stale_rev, pre_hash, overlap) or the attempt already ended
    (compensated), or when the epoch is not live (a zombie: StaleEpoch).
    """
    from .plans import check_settled

    epoch = _need_epoch(epoch, "applying")
    with _open(ctx, readonly=False) as ledger:
        row = ledger.step(step_id)
        if row.workspace and row.state == "planned" and attempt in (None, row.attempt):
            check_settled(ledger, row.workspace, epoch, but=step_id)
        result = ledger.workspaces.apply(step_id, attempt, epoch=epoch)
    if not as_json:
        _echo_apply(result)
    if not result.applied:
        raise Refusal(_not_applied(result), apply_json(result) if as_json else None)
    if as_json:
        _emit_json(apply_json(result))


def _echo_apply(result: ApplyResult) -> None:
    r = result.receipt
    where = f" — workspace {r.workspace} rev {r.rev}" if r is not None else ""
    detail = f" ({result.detail})" if result.detail else ""
    click.echo(f"step {result.step} attempt {result.attempt}: {result.verdict}{where}{detail}")
    if r is not None:
        for w in r.writes:
            pre, post = (w.pre_hash or "absent")[:12], (w.post_hash or "deleted")[:12]
            click.echo(f"  rev {w.rev:>6}  {pre} -> {post}  {w.path}")
        if result.applied:
            click.echo("receipt: " + msgspec.json.encode(r).decode())


def _not_applied(result: ApplyResult) -> LedgerError:
    """The typed error of an apply that did not apply: rejected, or the attempt ended."""
    if result.verdict.startswith("rejected:"):
        return _rejection(result)
    return IllegalTransition(result.step, result.attempt, "fenced",
                             f"the attempt is {result.verdict}")


@step.command("replan", epilog=_examples("steptrail step replan s1 --epoch 4"))
@click.argument("step_id", metavar="STEP")
@epoch_option("The live epoch the new attempt runs under.")
@json_option
@click.pass_context
def step_replan(ctx: click.Context, step_id: str, epoch: int | None, as_json: bool) -> None:
    """Re-stamp an ended (rejected or compensated) attempt onto the current revisions.

    Allowed when every write's pre_hash still holds on disk (exit 1 otherwise: plan
    anew). Prints the new attempt; apply it next.
    """
    epoch = _need_epoch(epoch, "replanning")
    with _open(ctx, readonly=False) as ledger:
        attempt = ledger.workspaces.replan(step_id, epoch=epoch)
        row = ledger.step(step_id)
    if as_json:
        _emit_json({"step": step_id, "attempt": attempt, "workspace": row.workspace,
                    "epoch": epoch})
    else:
        click.echo(f"step {step_id}: attempt {attempt} planned against the current revisions")


def _echo_compensation(c: Compensation) -> None:
    again = " (already recorded)" if c.deduped else ""
    click.echo(f"step {c.step} attempt {c.attempt}: compensated{again} (seq {c.seq})")
    for r in c.restored:
        click.echo(f"  {r.outcome:<9} rev {r.rev:>6}  {r.path}")


@step.command("compensate", epilog=_examples(
    "steptrail step compensate s1 --reason 'tests failed' --epoch 3",
    "steptrail step compensate build-7 --reason 'bad report'   # artifact-only: no epoch",
))
@click.argument("step_id", metavar="STEP")
@click.option("--reason", required=True, metavar="TEXT", help="Why (recorded for audit).")
@click.option("--attempt", type=click.IntRange(min=1, max=INT64_MAX), metavar="N",
              help="The attempt (default: the latest).")
@epoch_option("The live epoch (needed when the step writes a workspace).")
@json_option
@click.pass_context
def step_compensate(ctx: click.Context, step_id: str, reason: str, attempt: int | None,
                    epoch: int | None, as_json: bool) -> None:
    """End the attempt, putting pre-images back where that is safe.

    Per path: restored (the post-image was there), already (the pre-image was), or
    conflict (changed since: left as it is, exit 1). A committed step's live manifest
    ends; allowed only within the compensation window. A redelivery returns the first.
    """
    with _open(ctx, readonly=False) as ledger:
        c = ledger.workspaces.compensate(step_id, attempt, reason=reason, epoch=epoch)
    if not as_json:
        _echo_compensation(c)
    if c.conflicts:
        raise Refusal(CompensationConflict([f"{c.step}:{r.path}" for r in c.conflicts]),
                      compensation_json(c) if as_json else None)
    if as_json:
        _emit_json(compensation_json(c))


def manifest_json(m: Manifest) -> dict[str, Any]:
    return msgspec.to_builtins(m) | {"size": m.size}  # type: ignore[no-any-return]


@step.command("store", epilog=_examples(
    "steptrail step store build-7 out/report.xml logs/test.log",
    "steptrail step store s1 out/log.txt --json   # a writing step's declared artifact",
    "steptrail step store build-7 /tmp/run/report.xml --as out/report.xml",
    "steptrail step store build-7 ../a.log ../b.log --as logs/a.log --as logs/b.log",
))
@click.argument("step_id", metavar="STEP")
@click.argument("files", nargs=-1, required=True, metavar="FILE...",
                type=click.Path(exists=True, dir_okay=False))
@click.option("--as", "names", multiple=True, metavar="NAME",
              help="Record the k-th FILE as the artifact NAME (repeatable: one --as per FILE,"
                   " in order), so a FILE may be anywhere (an absolute path, outside the"
                   " current directory). NAME is a relative path like out/report.xml.")
@click.option("--run", default="", help="The run this step belongs to (when it starts).")
@json_option
@click.pass_context
def step_store(ctx: click.Context, step_id: str, files: tuple[str, ...], names: tuple[str, ...],
               run: str, as_json: bool) -> None:
    """Store FILEs as the step's artifacts, durably, and print their digests.

    Each artifact is named by its path as given (relative, e.g. out/report.xml), or by
    its --as NAME: a file from anywhere (/tmp/run/report.xml --as out/report.xml). The
    step's attempt is planned first if none is in flight. On a committed step the new
    blobs take effect only through a supersede (publish --expected-rev LIVE_REV).
    Small files go inside the ledger, large ones into the blob store beside it,
    streamed: a file is never held in memory whole, whatever its size.
    """
    contents, seen = _artifact_inputs(ctx, files, names)
    with _open(ctx, readonly=False) as ledger:
        row = ledger.plan(step_id, run=run, artifacts=tuple(contents))
        if row.live:
            click.echo(
                f"step {step_id} is committed (manifest r{row.manifest_rev}); these blobs"
                f" replace it only when you supersede: 'steptrail step publish {step_id}"
                f" --expected-rev {row.manifest_rev}'", err=True,
            )
        stored = [ledger.store(step_id, row.attempt, p, data) for p, data in contents.items()]
    if as_json:
        _emit_json({"step": step_id, "attempt": row.attempt, "stored": stored_json(stored, seen)})
        return
    _echo_stored(stored, seen)


def _artifact_inputs(ctx: click.Context, files: tuple[str, ...], names: tuple[str, ...]
                     ) -> tuple[dict[str, bytes | BinaryIO], dict[str, str]]:
    """FILEs and their --as NAMEs (`step store`, `step run`), checked and opened: artifact
    name -> its content (a large file left open, closed with `ctx`), and -> the FILE."""
    from .plans import input_content, open_input

    if names and len(names) != len(files):
        shown = f"{len(files)} FILE{'' if len(files) == 1 else 's'}"
        raise click.UsageError(f"give one --as NAME per FILE, in order: {shown},"
                               f" {len(names)} --as", ctx)
    artifacts = list(zip(names, files, strict=True)) if names else [
        (_artifact_name(f), f) for f in files]
    seen: dict[str, str] = {}
    for name, file in artifacts:
        if names and name.startswith("/"):
            raise InvalidInput(f"--as {name!r} is absolute; an artifact's name is a relative"
                               " path like out/report.xml")
        check_relpath(name, "artifact name (--as NAME)" if names else "artifact path")
        if name in seen:
            raise InvalidInput(f"artifact {name!r} given twice ({seen[name]} and {file});"
                               " name each file once" + ("" if names else " (--as NAME)"))
        seen[name] = file
    contents: dict[str, bytes | BinaryIO] = {}
    ctx.call_on_close(lambda: [c.close() for c in contents.values() if not isinstance(c, bytes)])
    for name, file in artifacts:
        what = f"artifact file {file}"
        contents[name] = input_content(open_input(file, what), what)
    return contents, seen


def stored_json(stored: Sequence[BlobStored], seen: dict[str, str]) -> list[dict[str, Any]]:
    """The `stored` list of `step store --json` (and `step run --json`)."""
    return [{"path": e.path, "digest": e.digest, "size": e.size, "inline": e.inline,
             "file": seen[e.path]} for e in stored]


def _echo_stored(stored: Sequence[BlobStored], seen: dict[str, str]) -> None:
    for e in stored:
        where = "inline" if e.inline else "file"
        click.echo(f"{e.digest}  {e.size:>10}  {where:<6}  {e.path}"
                   + (f"  (from {seen[e.path]})" if seen[e.path] != e.path else ""))


def _artifact_name(file: str) -> str:
    """The artifact name of a FILE given without --as: its path, normalized; one that is
    absolute or leaves the current directory names no artifact (InvalidInput: --as)."""
    name = os.path.normpath(file)
    if os.path.isabs(name) or name == ".." or name.startswith("../"):
        where = "is absolute" if os.path.isabs(name) else "leaves the current directory"
        raise InvalidInput(f"artifact path {file!r} {where}; give FILE relative to the"
                           " current directory, or name the artifact with --as NAME (e.g."
                           f" --as out/{os.path.basename(name) or 'file'})")
    return name


def _receipt_arg(raw: bytes) -> bytes | dict[str, Any]:
    """A receipt as handed to `step publish --receipt`: the receipt object, or a whole
    `step apply --json` document (its `receipt` is taken)."""
    if not raw.strip():
        return raw  # the ledger refuses it: a 200 with an empty body moves nothing
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"the receipt is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("the receipt is nested too deeply to be a receipt; give the JSON"
                           " object 'step apply --json' printed") from None
    if isinstance(doc, dict) and "verdict" in doc and "receipt" in doc:
        if doc["receipt"] is None:
            raise InvalidInput(f"the apply output holds no receipt (verdict {doc['verdict']}):"
                               " nothing was applied, so there is nothing to publish")
        doc = doc["receipt"]
    if not isinstance(doc, dict):
        raise InvalidInput("the receipt must be a JSON object, as 'steptrail step apply"
                           " --json' prints it")
    return doc  # type: ignore[no-any-return]


@step.command("publish", epilog=_examples(
    "steptrail step publish build-7",
    "steptrail step publish s1 --receipt applied.json        # from 'step apply --json'",
    "executor | steptrail step publish s1 --receipt -        # a receipt on stdin",
))
@click.argument("step_id", metavar="STEP")
@click.option("--expected-rev", type=click.IntRange(min=-1, max=INT64_MAX), default=-1, show_default=True,
              help="-1 creates (a live manifest is returned unchanged); the live revision supersedes it.")
@click.option("--receipt", "receipt_file", metavar="FILE|-",
              type=click.Path(dir_okay=False, allow_dash=True, exists=True),
              help="The receipt of the apply (JSON from 'step apply --json'), from an executor that ran apart.")
@epoch_option("For a step writing a workspace: refuse unless this epoch is live.")
@json_option
@click.pass_context
def step_publish(ctx: click.Context, step_id: str, expected_rev: int, receipt_file: str | None,
                 epoch: int | None, as_json: bool) -> None:
    """Publish the step's manifest: the commit point (a compare-and-swap).

    Every blob the manifest names is re-checked inside the publishing transaction;
    a missing one refuses the publish (exit 1) and nothing changes. With --receipt the
    receipt must match the apply the ledger recorded (an empty one is exit 2: a 200
    with an empty body moves nothing); a dead epoch's receipt is refused (exit 1).
    """
    receipt = None
    if receipt_file is not None:
        with click.open_file(receipt_file, "rb") as f:
            receipt = _receipt_arg(f.read())
    with _open(ctx, readonly=False) as ledger:
        row = ledger.step(step_id)
        _check_live(ledger, row, epoch)  # a published step too: a zombie hears StaleEpoch
        m = ledger.publish(step_id, expected_rev=expected_rev, receipt=receipt)
    if as_json:
        _emit_json(manifest_json(m))
        return
    _echo_manifest(m)


def _echo_manifest(m: Manifest) -> None:
    click.echo(f"step {m.step}: manifest r{m.manifest_rev} {m.digest} ({_n(m.size, 'byte')})")
    for e in (*m.writes, *m.artifacts):
        click.echo(f"  {e.digest}  {e.size:>10}  {e.path}")


@step.command("ack", epilog=_examples("steptrail step ack build-7",
                                      "steptrail step ack s1 --attempt 2 --epoch 3"))
@click.argument("step_id", metavar="STEP")
@click.option("--attempt", type=click.IntRange(min=1, max=INT64_MAX), metavar="N",
              help="The attempt (default: the latest).")
@epoch_option("For a step writing a workspace: refuse unless this epoch is live (and no"
              " older than the attempt's).")
@json_option
@click.pass_context
def step_ack(ctx: click.Context, step_id: str, attempt: int | None, epoch: int | None,
             as_json: bool) -> None:
    """Record that the client learned the step's result (a redelivery changes nothing)."""
    with _open(ctx, readonly=False) as ledger:
        row = ledger.step(step_id)
        _check_live(ledger, row, epoch)  # an acked step too: a zombie hears StaleEpoch
        r = ledger.ack(step_id, attempt, epoch=epoch)
    if as_json:
        _emit_json(ack_json(step_id, r))
    else:
        _echo_ack(step_id, r)


def ack_json(step_id: str, r: RecordedEvent) -> dict[str, Any]:
    return {"step": step_id, "seq": r.seq, "deduped": r.deduped}


def _echo_ack(step_id: str, r: RecordedEvent) -> None:
    click.echo(f"step {step_id}: acked" + (" (already)" if r.deduped else ""))


#: The crash tests' seam (tests/test_cli_run.py): `step run` SIGKILLs itself at the stage
#: this names — after-plan (the plan durable), after-commit (the step committed, before
#: it says so) — as a crash would.
RUN_KILL_ENV = "STEPTRAIL_STEP_RUN_TEST_KILL"


def _killed_here(stage: str) -> None:
    if os.environ.get(RUN_KILL_ENV) == stage:
        os.kill(os.getpid(), signal.SIGKILL)


@step.command("run", epilog=_examples(
    "steptrail step run plan.json --epoch 3 --json            # plan, apply, publish, ack",
    "steptrail step run plan.json out/log.txt --epoch 3       # and store an artifact",
    "steptrail step run plan.json /tmp/pytest.log --as logs/pytest.log --epoch 3",
    "planner | steptrail step run - --epoch 3 --json          # the plan on stdin",
))
@click.argument("plan_file", metavar="PLAN|-", type=click.Path(dir_okay=False, allow_dash=True, exists=True))
@click.argument("files", nargs=-1, metavar="[FILE]...", type=click.Path(exists=True, dir_okay=False))
@click.option("--as", "names", multiple=True, metavar="NAME",
              help="Store the k-th FILE as the artifact NAME (one --as per FILE, in order),"
                   " as for 'step store'.")
@workspace_option
@epoch_option("The live epoch the step runs under.")
@fence_options
@json_option
@click.pass_context
def step_run(ctx: click.Context, plan_file: str, files: tuple[str, ...], names: tuple[str, ...],
             ws_name: str | None, epoch: int | None, fence: str, journal: bool,
             as_json: bool) -> None:
    """Run one step whole from its plan: plan, apply, store, publish, ack, in one process.

    PLAN is one step in the format of 'step plan' (docs/cli-json.md "The plan format");
    each artifact it declares ("artifacts") is a FILE given here (named by its path, or
    by --as NAME), stored before the publish. The same as 'step plan', 'step apply',
    'step store', 'step publish' and 'step ack' one after the other, with the same
    checks, in one process. Run it again after a crash anywhere: the journal answers
    what was done (the same plan is the recorded one, the apply is deduplicated) and it
    goes on from there; a committed step changes nothing (its ack at most, if lost).
    Exit 1 when the fence rejects the step (nothing of it stays in the workspace) or
    the protocol refuses it; 2 bad input, nothing written.
    """
    name = _workspace(ctx, ws_name)
    epoch = _need_epoch(epoch, "running a step")
    plan = _read_plan(ctx, plan_file)
    if len(plan.steps) != 1:
        raise InvalidInput(f"the plan holds {_n(len(plan.steps), 'step')}; 'step run' runs one"
                           " step (give a batch to 'step plan', then apply each step)")
    planned = plan.steps[0]
    contents, seen = _artifact_inputs(ctx, files, names)
    if set(contents) != set(planned.artifacts):
        missing = sorted(set(planned.artifacts) - set(contents))
        extra = sorted(set(contents) - set(planned.artifacts))
        raise InvalidInput(
            f"step {planned.step}: the plan's artifacts and the FILEs given differ"
            + (f"; no FILE for {', '.join(missing)}" if missing else "")
            + (f"; not in the plan's artifacts: {', '.join(extra)}" if extra else "")
            + " (give one FILE per declared artifact, named by its path or --as NAME)")
    doc: dict[str, Any] = {"workspace": name, "epoch": epoch, "step": planned.step,
                           "attempt": None, "ok": True, "committed": False,
                           "already_committed": False, "plan": None, "apply": None,
                           "stored": [], "manifest": None, "ack": None}
    with _open(ctx, readonly=False) as ledger:
        try:
            _run_step(ledger, name, epoch, plan, fence, journal, contents, seen, doc, as_json)
        except Refusal as refusal:
            raise Refusal(refusal.error, doc if as_json else None) from None
        except LedgerError as exc:  # how far it got goes with the error
            raise Refusal(exc, doc if as_json else None) from None
    if as_json:
        _emit_json(doc)


def _run_step(ledger: Ledger, name: str, epoch: int, plan: Plan, fence: str, journal: bool,
              contents: dict[str, bytes | BinaryIO], seen: dict[str, str],
              doc: dict[str, Any], as_json: bool) -> None:
    """`step run`: the plan admitted as `step plan` admits it (a different plan for a step
    in flight or committed is PlanConflict), then the library's fenced step
    (`run_fenced_step`) continues it: apply, artifacts, manifest and ack — in one commit
    when the artifacts fit in rows. Each part fills its key of `doc` as the command that
    does it alone prints it; a refusal raises Refusal."""
    from .workspace.protocol import ApplyResult
    from .runner import StepStatus, run_fenced_step

    planned = plan.steps[0]
    step_id = planned.step
    found = ledger.find_step(step_id)
    doc["already_committed"] = found is not None and found.live
    acked_before = found is not None and found.live and found.state == "acked"
    rows, rejected = _admit(ledger, name, epoch, plan, fence, journal)
    doc["plan"], doc["attempt"] = rows[0], rows[0]["attempt"]
    if not as_json:
        _echo_admitted(rows)
    if rejected is not None:
        raise Refusal(_rejection(rejected))
    _killed_here("after-plan")
    before = ledger.head().seq
    out = run_fenced_step(ledger, name, step_id, list(planned.writes), epoch=epoch,
                          run=planned.run, fence=fence, journal=journal,  # type: ignore[arg-type]
                          plan_rev=plan.plan_rev, irreversible=planned.irreversible,
                          artifacts=contents)
    if out.status is StepStatus.STALE_EPOCH:
        assert out.error is not None
        raise Refusal(out.error)
    new = [r for r in ledger.read(before, step=step_id)
           if getattr(r.event, "attempt", None) == out.attempt]
    fenced_now = any(r.kind == "fenced" for r in new)
    verdict = ("applied" if fenced_now else "deduped") if out.committed else (
        f"rejected:{out.reason.value}" if out.reason is not None else out.detail)
    result = ApplyResult(verdict=verdict, step=step_id, attempt=out.attempt,
                         receipt=out.receipt, detail=out.detail,
                         facts=_conflict_facts(out))
    doc["apply"] = apply_json(result)
    if not as_json:
        _echo_apply(result)
    if not out.committed:
        raise Refusal(_not_applied(result))
    stored = [r.event for r in new if r.kind == "blob-stored"]
    doc["stored"] = stored_json(stored, seen)
    if not as_json and stored:
        _echo_stored(stored, seen)
    assert out.manifest is not None
    doc["manifest"], doc["committed"] = manifest_json(out.manifest), True
    if not as_json:
        _echo_manifest(out.manifest)
    _killed_here("after-commit")
    ack = next(r for r in reversed(ledger.timeline(step_id)) if r.kind == "acked")
    ack = msgspec.structs.replace(ack, deduped=acked_before)
    doc["ack"] = ack_json(step_id, ack)
    if not as_json:
        _echo_ack(step_id, ack)


def _conflict_facts(out: Any) -> dict[str, Any]:
    """What the fence saw, as `step apply` reports it in its error object."""
    if not out.conflicts:
        return {}
    c = out.conflicts[0]
    if out.reason is not None and out.reason.value == "stale_rev":
        return {"path": c.path, "path_rev": c.on_disk_rev, "base_rev": c.read_rev}
    return {"path": c.path, "on_disk": c.on_disk_hash, "pre_hash": c.read_hash}


# -- metrics --------------------------------------------------------------------------


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 120:
        return f"{x:.1f}s"
    if x < 7200:
        return f"{x / 60:.1f}m"
    if x < 2 * 86400:
        return f"{x / 3600:.1f}h"
    return f"{x / 86400:.1f}d"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


@cli.command(epilog=_examples("steptrail metrics", "steptrail metrics --json | jq .checkpoint_age_s.max"))
@json_option
@click.pass_context
def metrics(ctx: click.Context, as_json: bool) -> None:
    """Operational metrics over the whole ledger. Read-only.

    Checkpoint age per workspace, lease-expiration rate, ambiguous (crash-window)
    reconciliations, compensation success rate, time to resume after a new epoch, and
    the plan drift the executor recorded. docs/cli-json.md defines each number.
    """
    from .metrics import compute

    with _open(ctx, readonly=True) as ledger:
        m = compute(ledger)
    if as_json:
        _emit_json(m)
        return
    cp, le, am = m.checkpoint_age_s, m.lease_expiration_rate, m.ambiguous_reconciliations
    cs, tr, dr = m.compensation_success_rate, m.time_to_resume_s, m.drift
    ws = ", ".join(f"{w.workspace} {_secs(w.age_s) if w.age_s is not None else 'never'}"
                   for w in cp.workspaces) or "no workspaces"
    rows = [
        ("checkpoint age (max)", _secs(cp.max), ws),
        ("lease expiration rate", _rate(le.rate),
         (f"{le.expired} expired of {le.ended} ended ({le.released} released,"
          f" {le.preempted} preempted); {le.live} live")),
        ("ambiguous reconciliations", str(am.count),
         (f"{_n(am.settled_applies, 'apply', 'applies')} found"
          f" {'its write' if am.settled_applies == 1 else 'their writes'} on disk,"
          f" {_n(am.already_restores, 'compensation')} found the pre-image back")),
        ("compensation success rate", _rate(cs.rate),
         (f"{cs.succeeded} clean of {cs.with_restores} with writes ({cs.conflicted}"
          f" conflicted); {_n(cs.compensations, 'compensation')} in all")),
        ("time to resume (median)", _secs(tr.median),
         f"max {_secs(tr.max)} over {_n(tr.resumes, 'new epoch')}; {tr.unresumed} applied"
         " nothing yet"),
        ("plan drift (mean)", "-" if dr.mean is None else f"{dr.mean:.2f}",
         (f"max {'-' if dr.max is None else dr.max} over {_n(dr.writes, 'planned write')};"
          f" {dr.drifted} drifted")),
        ("weakened attempts", str(m.weakened.attempts),
         (f"fence plan {m.weakened.fence_plan}, fence none {m.weakened.fence_none},"
          f" journal off {m.weakened.journal_off} (an operator's choice)")),
    ]
    click.echo(f"{'METRIC':<27} {'VALUE':>8}  DETAIL")
    for label, value, detail in rows:
        click.echo(f"{label:<27} {value:>8}  {detail}")
    click.echo(f"over {_n(m.events, 'event')}")  # part of the result: stdout


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
        click.echo(f"{_n(len(temps), 'leftover temporary file')}", err=True)


# -- gc, audit, restore ---------------------------------------------------------------


def _dur(seconds: float) -> str:
    """A duration as one would type it: 86400 -> "24h", 600 -> "10m", 90 -> "90s"."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def _size(n: int) -> str:
    """Exact bytes, with a binary-unit reading once it is more than a KiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{n} B ({value:.1f} {unit})"


def _row(label: str, count: int | str, nbytes: int | str, note: str = "") -> str:
    return (f"  {label:<24} {count!s:>9} {nbytes!s:>14}" + (f"  {note}" if note else "")).rstrip()


GRACE_HELP = "Orphans younger than this are kept (a file's mtime, an inline row's insert time)."


@cli.command("gc", epilog=_examples(
    "steptrail gc --dry-run                      # what would go; changes nothing",
    "steptrail gc                                # orphans older than 24h",
    "steptrail gc --max-runtime 10m --max-delete 10000 --json",
    "steptrail gc --grace 10m --force            # a short window: you mean it",
))
@click.option("--grace", type=Duration(allow_zero=True), default="24h", show_default=True,
              help=GRACE_HELP + " Under 1h only with --force.")
@click.option("--force", is_flag=True, help="Allow a grace window shorter than 1h.")
@click.option("--dry-run", is_flag=True,
              help="Report what would be collected; open the ledger read-only, change nothing.")
@click.option("--max-runtime", type=DURATION, metavar="DURATION",
              help="Stop deleting after this long (e.g. 10m); the next run resumes.")
@click.option("--max-delete", type=click.IntRange(min=0, max=INT64_MAX), metavar="N",
              help="Delete at most N blobs this run; the next run resumes.")
@click.option("--wait", is_flag=True,
              help="Wait for another running collector to finish instead of exiting 3.")
@json_option
@click.pass_context
def gc_cmd(ctx: click.Context, grace: float, force: bool, dry_run: bool,
           max_runtime: float | None, max_delete: int | None, wait: bool, as_json: bool) -> None:
    """Collect orphan blobs: stored, named by no manifest, pinned by no attempt, old.

    Fails closed: on any doubt about what references a blob (a referenced blob
    missing, events and tables disagreeing, something in the blob store that is not
    a blob) it deletes nothing and exits 1 naming the cause. Two phases: condemn the
    candidates, then per batch re-check, unlink and record blob-collected in one
    transaction, so a writer that pins a blob meanwhile keeps it. A progress bar is
    drawn on a terminal (stderr).

    \b
    Exit codes: 0 done (also when a --max-* bound stopped it: run it again);
    1 refused, nothing deleted (a human must look); 2 bad input (a grace window
    under 1h without --force); 3 another gc holds the lock, or storage failed
    (retry later).
    """
    from .gc import MIN_GRACE_S, collect

    if grace < MIN_GRACE_S and not force:
        raise InvalidInput(
            f"--grace {_dur(grace)} is under the {_dur(MIN_GRACE_S)} minimum: a short window"
            " leaves no margin for clock skew or a blob placed by hand; pass --force to mean"
            " it (nothing was read or changed)"
        )
    update, finish = _progress("collecting")
    with _open(ctx, readonly=dry_run) as ledger:
        try:
            report = collect(ledger, grace_s=grace, force=force, dry_run=dry_run,
                             max_runtime_s=max_runtime, max_delete=max_delete, progress=update,
                             wait=wait)
        finally:
            finish()
    if as_json:
        _emit_json(report.as_dict())
    else:
        _echo_gc(report)
    if report.stopped:
        bound = "--max-runtime" if report.stopped == "max-runtime" else "--max-delete"
        click.echo(f"steptrail: gc stopped at {bound}; {_n(report.remaining, 'condemned blob')}"
                   " remain for the next run", err=True)


def _echo_gc(r: Any) -> None:
    grace = _dur(r.grace_s)
    head = "dry run, nothing changed" if r.dry_run else f"collection {r.collection}"
    click.echo(f"gc: {head} (grace {grace})")
    click.echo(_row("", "BLOBS", "BYTES"))
    click.echo(_row("scanned", r.scanned, r.scanned_bytes))
    click.echo(_row("referenced", r.referenced, r.referenced_bytes,
                    "named by a manifest or a compensation"))
    click.echo(_row("kept: live", r.kept_live, r.kept_live_bytes,
                    "pinned: in flight, or a pre-image still compensable"))
    click.echo(_row("kept: young", r.kept_young, r.kept_young_bytes,
                    f"orphans younger than {grace}"))
    click.echo(_row("orphans found", r.orphans, r.orphan_bytes, f"orphans older than {grace}"))
    if r.dry_run:
        earlier = r.remaining - r.orphans
        click.echo(_row("would collect", r.remaining, r.orphan_bytes,
                        f"incl. {earlier} condemned by an earlier run" if earlier > 0 else ""))
        click.echo(_row("temp files to remove", r.temp_removed, r.temp_removed_bytes,
                        f"{r.temp_kept} kept (young or pinned)"))
        click.echo(f"gc: would collect {_n(r.remaining, 'blob')}, {_size(r.orphan_bytes)};"
                   " nothing changed")
        return
    click.echo(_row("collected", r.collected, r.reclaimed_bytes))
    click.echo(_row("temp files removed", r.temp_removed, r.temp_removed_bytes,
                    f"{r.temp_kept} kept (young or pinned)"))
    if r.ws_temp_removed:
        click.echo(_row("workspace temp files", r.ws_temp_removed, "-",
                        "removed: left by killed applies"))
    click.echo(_row("recovered", r.recovered, "-",
                    "condemned earlier, found gone: recorded as collected"))
    click.echo(_row("spared", r.spared, "-", "condemned, then referenced, pinned or fresh: kept"))
    click.echo(_row("remaining", r.remaining, "-", "still condemned (the next run resumes)"))
    stopped = f"; stopped at --{r.stopped}" if r.stopped else ""
    click.echo(f"gc: collected {_n(r.collected, 'blob')}, reclaimed {_size(r.reclaimed_bytes)}"
               f" in {r.elapsed_s:.2f}s{stopped}")


@cli.command("audit", epilog=_examples(
    "steptrail audit",
    "steptrail audit --deep                      # re-hash every blob",
    "steptrail audit --json | jq '.orphan_old.bytes'",
))
@click.option("--deep", is_flag=True, help="Re-hash every blob (reads every byte): finds corrupt blobs.")
@click.option("--grace", type=Duration(allow_zero=True), default="24h", show_default=True,
              help="Where orphans split into young (kept) and old (gc reclaims them now).")
@json_option
@click.pass_context
def audit_cmd(ctx: click.Context, deep: bool, grace: float, as_json: bool) -> None:
    """Account for every stored byte against the committed steps. Read-only.

    Every blob (inline row or file) and temporary file lands in one bucket, first
    match wins: referenced by a manifest or compensation, pinned, orphan inside the
    grace window, orphan outside it, temporary. The reconciliation line checks
    stored = referenced + pinned + orphan(young) + orphan(old) + temporary.
    Exit 1 on any violation: a manifest or compensation naming a missing blob
    (dangling), a blob whose bytes do not hash to its name (corrupt, with --deep),
    a ledger the references cannot be read from, or sums that do not reconcile.
    """
    from .gc import audit

    update, finish = _progress("hashing")
    with _open(ctx, readonly=True) as ledger:
        try:
            report = audit(ledger, deep=deep, grace_s=grace, progress=update if deep else None)
        finally:
            finish()
    if as_json:
        _emit_json(report.as_dict())
    else:
        _echo_audit(report)
    if not report.ok:
        sys.exit(EXIT_NO)


def _echo_audit(r: Any) -> None:
    grace = _dur(r.grace_s)
    click.echo(f"audit{' --deep' if r.deep else ''} (grace {grace})")
    click.echo(_row("committed steps", r.committed_steps, ""))
    click.echo(_row("committed bytes", "", r.committed_bytes,
                    f"named by live manifests; {r.committed_bytes_distinct} distinct"))
    click.echo(_row("pending", r.pending_steps, r.pending_bytes,
                    "steps in flight and the bytes they stored"))
    click.echo(_row("", "BLOBS", "BYTES"))
    click.echo(_row("stored", r.stored_blobs + r.temporary.count, r.stored_bytes,
                    f"{r.inline.count} inline, {_n(r.files.count, 'file')},"
                    f" {r.temporary.count} temporary"))
    click.echo(_row("referenced", r.referenced.count, r.referenced.bytes,
                    "named by a manifest (any revision) or a compensation"))
    click.echo(_row("pinned", r.pinned.count, r.pinned.bytes,
                    "in flight, or a pre-image still compensable"))
    click.echo(_row("orphan, young", r.orphan_young.count, r.orphan_young.bytes,
                    f"younger than {grace}: gc keeps them"))
    click.echo(_row("orphan, old", r.orphan_old.count, r.orphan_old.bytes,
                    f"older than {grace}: gc reclaims them"))
    click.echo(_row("temporary", r.temporary.count, r.temporary.bytes,
                    "leftovers of interrupted writes"))
    unrecorded = (f"; {r.collected_unrecorded} gone but not yet recorded (an interrupted gc)"
                  if r.collected_unrecorded else "")
    click.echo(_row("collected so far", r.collected.count, r.collected.bytes,
                    f"blob-collected events{unrecorded}"))
    if r.condemned:
        click.echo(_row("condemned", r.condemned, "-", "awaiting the next gc's re-check"))
    buckets = (r.referenced.bytes, r.pinned.bytes, r.orphan_young.bytes, r.orphan_old.bytes,
               r.temporary.bytes)
    verdict = "holds" if r.reconciled else f"DOES NOT HOLD (buckets sum to {sum(buckets)})"
    click.echo("stored = referenced + pinned + orphan(young) + orphan(old) + temporary: "
               f"{r.stored_bytes} = {' + '.join(str(b) for b in buckets)} — {verdict}")
    for d in r.dangling:
        click.echo(f"VIOLATION [dangling] blob {d['digest']} is missing; named by"
                   f" {', '.join(d['named_by'])}")
    for c in r.corrupt:
        click.echo(f"VIOLATION [corrupt] blob {c['digest']} ({c['size']} bytes): {c['problem']}")
    for p in r.problems:
        click.echo(f"VIOLATION [ledger] {p}")
    if not r.reconciled:
        click.echo("VIOLATION [reconcile] the buckets do not add up to the bytes stored")
    n = r.violations + (0 if r.reconciled else 1)
    click.echo(f"audit: {'ok' if r.ok else _n(n, 'violation')} ({r.elapsed_s:.2f}s)")



@cli.command("copy", epilog=_examples(
    "steptrail copy .steptrail/ledger.db postgresql://me@db.internal/ledger",
    "steptrail copy postgresql://me@db.internal/ledger ./ledger-copy.db --json",
))
@click.argument("source", metavar="SRC")
@click.argument("dest", metavar="DST")
@click.option("--no-verify", is_flag=True, help="Skip verifying both ends afterwards.")
@click.option("--archive-dir", "archive_dir", metavar="DIR",
              help="Where a database DST keeps sealed runs' archives (absolute; recorded in"
                   " it). A file DST keeps them in archive/ beside it.")
@json_option
@click.pass_context
def copy_cmd(ctx: click.Context, source: str, dest: str, no_verify: bool,
             archive_dir: str | None, as_json: bool) -> None:
    """Copy the ledger SRC to the new ledger DST, between stores (a file or a
    postgresql:// URL each): every event, hash, projection row and blob, unchanged.

    This is how a ledger that started embedded moves to a server, and back. The
    source is read in one snapshot (writers may go on; what they commit after it is
    not in the copy, and gc waits); the copy's tables commit in one transaction, after
    every blob they name is stored. DST must be new: a file that does not exist, or a
    database with no ledger (or an empty one). Then both ends are verified and their
    heads compared. Sealed runs' archives come along, each verified: into archive/ beside
    a file DST, into --archive-dir for a database DST.

    \b
    Exit codes: 0 copied and both ends verify with the same head; 1 a verify found a
    problem or the heads differ; 2 DST is not new, or SRC is not a ledger; 3 storage.
    """
    from .copying import copy_ledger
    from .ledger import Ledger

    update, finish = _progress("copying")
    try:
        report = copy_ledger(source, dest, archive_dir=archive_dir,
                             progress=None if update is None else lambda _w, n: update(n))
    finally:
        finish()
    out: dict[str, Any] = {**report.as_json(), "verified": not no_verify}
    ok = True
    if not no_verify:
        heads = []
        for where, key in ((source, "source_verify"), (dest, "dest_verify")):
            with Ledger.open(where, readonly=True, witness=ctx.obj.get("witness")) as led:
                v = led.verify()
            heads.append(f"{v.head_seq}:{v.head_hash}")
            out[key] = {"ok": v.ok, "findings": len(v.findings), "head": heads[-1]}
            ok = ok and v.ok
        out["same_head"] = heads[1] == report.head
        ok = ok and out["same_head"]
    out["ok"] = ok
    if as_json:
        _emit_json(out)
    else:
        click.echo(f"copied {report.source} -> {report.dest}: {_n(report.events, 'event')},"
                   f" {_n(report.rows, 'row')}, {_n(report.blobs, 'blob')}"
                   f" ({_size(report.blob_bytes)}) outside the inline rows; head {report.head}")
        if not no_verify:
            for key, what in (("source_verify", "source"), ("dest_verify", "copy")):
                v = out[key]
                click.echo(f"  verify {what}: {'ok' if v['ok'] else 'FAILED'}"
                           f" ({_n(v['findings'], 'finding')}), head {v['head']}")
            if not out["same_head"]:
                click.echo("  the copy's head differs from the source's snapshot head", err=True)
    if not ok:
        sys.exit(EXIT_NO)


@cli.command("stats", epilog=_examples(
    "steptrail stats",
    "steptrail stats --by week --top 5",
    "steptrail stats --json | jq '.sealable'",
))
@click.option("--by", "by", type=click.Choice(["hour", "day", "week"]), default="day",
              show_default=True, help="The growth table's bucket.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many runs to list, largest first (0: every run).")
@json_option
@click.pass_context
def stats_cmd(ctx: click.Context, by: str, top: int, as_json: bool) -> None:
    """What the ledger holds and how it grew. Read-only.

    Events by kind, steps by state, runs (their steps, states, events and bytes, the
    largest first), blobs (inline rows and files, bucketed as `audit` does), events and
    bytes per hour, day or week, and what sealing would take out of the ledger file:
    the runs whose every step is settled (acked, compensated or rejected). An event's
    bytes are its payload, journal key and hashes.
    """
    from .stats import stats

    with _open(ctx, readonly=True) as ledger:
        report = stats(ledger, by=by, top=top)
    if as_json:
        _emit_json(report.as_dict())
        return
    r = report
    click.echo(f"stats: {r.path}: {_short(r.file_bytes)} on disk, head #{r.head_seq}")
    click.echo(f"  {_n(r.events.count, 'event')} ({_short(r.events.bytes)}),"
               f" {_n(r.steps, 'step')}, {_n(r.runs_total, 'run')}")
    if r.by_state:
        click.echo("  steps by state: " + ", ".join(
            f"{k} {v} ({_short(r.bytes_by_state.get(k, 0))} stored)" for k, v in r.by_state.items()))
    if r.by_kind:
        click.echo("  events by kind: " + ", ".join(
            f"{k} {c.count} ({_short(c.bytes)})" for k, c in r.by_kind.items()))
    b = r.blobs
    click.echo(f"  blobs: {b['inline'].count} inline ({_short(b['inline'].bytes)}),"
               f" {_n(b['files'].count, 'file')} ({_short(b['files'].bytes)});"
               f" referenced {_short(b['referenced'].bytes)}, pinned {_short(b['pinned'].bytes)},"
               f" orphan {_short(b['orphan_young'].bytes + b['orphan_old'].bytes)},"
               f" temporary {_short(b['temporary'].bytes)}")
    share = f", {r.sealable.bytes * 100 // r.events.bytes}% of the events' bytes" if r.events.bytes else ""
    click.echo(f"  sealable: {r.sealable_runs} of {_n(r.runs_total, 'run')} settled,"
               f" {_n(r.sealable.count, 'event')} ({_short(r.sealable.bytes)}{share})")
    if r.runs:
        shown = f"the {len(r.runs)} largest" if len(r.runs) < r.runs_total else "every run"
        click.echo(f"  runs ({shown}):")
        click.echo(f"    {'RUN':<28} {'STEPS':>6} {'EVENTS':>8} {'BYTES':>10}  {'SETTLED':<7}  STATES")
        for run in r.runs:
            states = ", ".join(f"{k} {v}" for k, v in sorted(run.states.items()))
            click.echo(f"    {(run.run or '(no run)')[:28]:<28} {run.steps:>6} {run.events:>8}"
                       f" {_short(run.event_bytes):>10}  {'yes' if run.settled else 'no':<7}  {states}")
    if r.growth:
        click.echo(f"  growth by {r.bucket}:")
        for g in r.growth:
            click.echo(f"    {_iso(g.start_ns)[:16 if r.bucket == 'hour' else 10]:<17}"
                       f" {g.events:>8} events {_short(g.bytes):>10}")


def _short(n: int) -> str:
    """Bytes, in a binary unit once past a KiB."""
    value, unit = float(n), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"

@cli.command("restore", epilog=_examples(
    "steptrail restore --workspace repo --to /mnt/fresh/repo",
    "steptrail --workspace repo restore --to ./repo-restored --json",
    "steptrail restore --workspace repo --to ./new --force && \\",
    "  steptrail --workspace repo lease acquire --holder agent-2 --force",
))
@workspace_option
@click.option("--to", "target", required=True, metavar="DIR",
              type=click.Path(file_okay=True, dir_okay=True),
              help="Where to write the files: a new or empty directory.")
@click.option("--force", is_flag=True,
              help="Restore even while a lease is live; take a new epoch right after.")
@json_option
@click.pass_context
def restore_cmd(ctx: click.Context, ws_name: str | None, target: str, force: bool,
                as_json: bool) -> None:
    """Write a workspace's committed content to DIR, and make DIR its root.

    Each path steptrail knows goes back to its committed content: the post-image of
    its newest committed write (by revision, whenever its step published), or the
    pre-image a compensation put back; every blob is checked before the first file is
    written. Files steptrail never wrote are not
    in the ledger and are not restored. A workspace-restored event records DIR as the
    workspace's new root: steps write there from now on.

    \b
    Exit codes: 0 restored; 1 a live lease blocks it (its holder may still write to
    the old directory: --force, then take a new epoch) or a blob is missing;
    2 DIR is not a new or empty directory, or the workspace is unknown.
    """
    from .errors import LeaseHeld

    name = _workspace(ctx, ws_name)
    # (a target that is not new or empty is refused by the library, before anything is
    # written — unless it holds nothing but a killed restore's output: then resumed)
    with _open(ctx, readonly=False) as ledger:
        before = ledger.workspaces.get(name)
        live = before.live_epoch(ledger.clock()) is not None
        try:
            report = ledger.workspaces.restore(name, target, force=force)
        except LeaseHeld as exc:
            raise LeaseHeld(
                exc.workspace, exc.epoch, exc.holder, exc.expires_ns,
                f"its holder may still write to {before.root}: wait for the lease to end (or"
                " release it), or pass --force and then take a new epoch ('steptrail"
                f" --workspace {name} lease acquire --holder NAME --force') so its unfinished"
                " attempts are settled against the restored files",
            ) from None
    if as_json:
        _emit_json(msgspec.to_builtins(report) | {"lease_was_live": live})
    else:
        absent = f", {_n(report.absent, 'path')} absent (deleted)" if report.absent else ""
        again = " (already recorded)" if report.deduped else ""
        click.echo(f"restored workspace {report.workspace} to {report.root}:"
                   f" {_n(report.paths, 'path')}, {_size(report.bytes)}{absent}; rev {report.rev},"
                   f" event #{report.seq}{again}")
    if live:
        click.echo(f"steptrail: the lease of epoch {before.epoch} ({before.holder}) was live:"
                   f" take a new epoch now ('steptrail --workspace {name} lease acquire"
                   " --holder NAME --force') so its unfinished attempts are settled against"
                   " the restored files", err=True)


# -- the witness --------------------------------------------------------------------


@cli.group("witness")
def witness_group() -> None:
    """Where the ledger's witness is; move or replace it (re-anchor).

    A witnessed ledger records its witness's location, and every command uses it. A
    missing, blank or damaged witness fails closed; 'witness anchor' verifies the
    ledger and starts a new one, recorded as a witness-anchored event.

    \b
        steptrail witness show
        steptrail witness anchor --witness /other/volume/ledger.witness
    """


def anchor_json(recorded: RecordedEvent) -> dict[str, Any]:
    ev = recorded.event
    assert isinstance(ev, WitnessAnchored)
    return {"seq": recorded.seq, "witness": ev.witness, "previous": ev.previous,
            "previous_state": ev.previous_state, "head_seq": ev.head_seq,
            "head_hash": ev.head_hash, "forced": ev.forced, "overridden": list(ev.overridden)}


@witness_group.command("anchor", epilog=_examples(
    "steptrail witness anchor                      # replace a lost witness where it was",
    "steptrail witness anchor --witness /mnt/b/ledger.witness --json   # move it",
    "steptrail witness anchor --force              # anchor over findings (recorded)",
))
@click.option("--witness", "target", metavar="PATH", type=click.Path(dir_okay=False),
              help="The new witness file, absolute (default: the global --witness, else the"
              " recorded location).")
@click.option("--force", is_flag=True, help="Anchor even if verify has findings or the old"
              " witness says the ledger was cut off or rolled back; the findings are recorded.")
@json_option
@click.pass_context
def witness_anchor(ctx: click.Context, target: str | None, force: bool, as_json: bool) -> None:
    """Verify the whole ledger, then start a new witness and record it.

    The operator's way back when the witness is lost, damaged or moves: nothing else
    replaces a witness. Refused (exit 1, nothing written) when verify has findings or
    the old witness says the ledger lost history, unless --force. Exit 0 anchored,
    1 refused, 2 bad input (a relative path, a file that is not a witness), 3 storage.
    """
    from .ledger import Ledger

    update, finish = _progress("verifying")
    try:
        recorded = Ledger.anchor_witness(ctx.obj["ledger_path"], target or ctx.obj.get("witness"),
                                         force=force, progress=update)
    finally:
        finish()
    out = anchor_json(recorded)
    if as_json:
        _emit_json(out)
        return
    was = (f"replacing {out['previous']} ({out['previous_state']})" if out["previous"]
           else "the ledger's first witness")
    click.echo(f"anchored witness {out['witness']} at head #{out['head_seq']}, {was};"
               f" recorded as event #{out['seq']}")
    if out["forced"]:
        click.echo(f"forced over {_n(len(out['overridden']), 'finding')}, recorded in the event")


@witness_group.command("show", epilog=_examples("steptrail witness show",
                                                "steptrail witness show --json | jq .state"))
@json_option
@click.pass_context
def witness_show(ctx: click.Context, as_json: bool) -> None:
    """Where the witness is and what it says about the ledger. Read-only; always exit 0
    (a state other than ok or none is what opening refuses; 'verify' exits 1 on it)."""
    with _open(ctx, readonly=True, witness_check=False) as ledger:
        status = ledger.witness_status()
    if as_json:
        _emit_json(status)
        return
    if status.witness is None:
        click.echo("not witnessed" if status.state == "none" else f"witness: {status.problem}")
        return
    where = f" (recorded at event #{status.anchored_seq})" if status.anchored_seq else ""
    click.echo(f"witness {status.witness}{where}: {status.state}")
    if status.witnessed_seq is not None:
        click.echo(f"holds head #{status.witnessed_seq}; the ledger is at #{status.head_seq}"
                   f" ({_n(status.lag or 0, 'commit')} ahead)")
    if status.problem:
        click.echo(status.problem)


# -- backups ------------------------------------------------------------------------


class _BackupGroup(LedgerSubgroup):
    """`steptrail backup DEST` takes a backup (the `take` command) when DEST is written
    as a path (it holds a "/": `/mnt/b`, `./b`); `backup verify` and `backup restore` are
    its other commands, and any other word is an unknown command, as in every group."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and os.sep in args[0]:
            args = ["take", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and name not in self.commands and not name.startswith("-"):
            raise click.UsageError(
                f"No such command {name!r}; to back up into a directory named {name},"
                f" write it as a path: 'steptrail backup ./{name}' (or 'backup take {name}')",
                ctx)
        return super().resolve_command(ctx, args)


@cli.group("backup", cls=_BackupGroup, epilog=_examples(
    "steptrail backup /mnt/backup/ledger          # take one (again: only what changed)",
    "steptrail backup verify /mnt/backup/ledger   # check one, read-only",
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail",
    "steptrail --ledger ./new/.steptrail/ledger.db restore --workspace w --to ./w",
))
def backup_group() -> None:
    """Back up the whole ledger while writers run; restore it on a fresh machine.

    'backup DEST' (short for 'backup take DEST'; DEST written as a path: /mnt/b, ./b)
    writes a consistent copy of the ledger
    — events, projections, inline and file blobs — into the directory DEST, verifies it
    and only then writes its completion marker (BACKUP.json). Run it again into the same
    DEST: only what changed is copied. 'backup verify DEST' checks a backup;
    'backup restore DEST LEDGER_DIR' makes a ledger of it (docs/operations.md "Backups").
    """


@backup_group.command("take", epilog=_examples(
    "steptrail backup /mnt/backup/ledger",
    "steptrail backup take /mnt/backup/ledger --json",
    "steptrail backup /mnt/backup/ledger --deep   # re-hash the blobs already there",
))
@click.argument("dest", metavar="DEST", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--deep", is_flag=True, help="Re-hash every blob already in DEST before"
              " trusting it (default: its size; blobs copied now are always hashed).")
@json_option
@click.pass_context
def backup_take(ctx: click.Context, dest: str, deep: bool, as_json: bool) -> None:
    """Write a consistent, verified backup of the ledger into the directory DEST.

    Online: the database snapshot is one read transaction, writers go on; gc waits
    (its lock) until the backup is done. Incremental: blobs already in DEST are not
    copied again, and a DEST that already holds the ledger's head is only checked.
    DEST holds the snapshot, the blob files it needs and BACKUP.json, written last:
    without it a directory is never taken for a backup.

    \b
    Exit codes: 0 backed up (or already up to date); 1 a blob the ledger needs is
    missing; 2 DEST is refused (inside the ledger's directory, a file, another
    ledger's backup, other files) or the copy failed its check (no marker written);
    3 storage failed.
    """
    from .backup import backup

    update, finish = _progress("copying blobs")
    try:
        report = backup(ctx.obj["ledger_path"], dest, deep=deep, progress=update,
                        witness=ctx.obj.get("witness"))
    finally:
        finish()
    if as_json:
        _emit_json(report)
        return
    if report.unchanged:
        click.echo(f"backup {report.dest} is up to date: head #{report.head_seq},"
                   f" {_n(report.blobs, 'blob file')} present; nothing copied")
        return
    click.echo(f"backed up head #{report.head_seq} to {report.dest}: {report.db}"
               f" ({_size(report.db_bytes)}), {_n(report.blobs, 'blob file')}"
               f" ({_n(report.blobs_copied, 'copied', 'copied')}, {_size(report.bytes_copied)};"
               f" {report.blobs_skipped} already there); verified ({report.elapsed_s:.2f}s)")
    if report.archives:
        click.echo(f"  {_n(report.archives, 'sealed-run archive')} ({report.archives_copied}"
                   " copied now)")


@backup_group.command("verify", epilog=_examples(
    "steptrail backup verify /mnt/backup/ledger",
    "steptrail backup verify /mnt/backup/ledger --shallow --json",
))
@click.argument("dest", metavar="DEST", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--shallow", is_flag=True, help="Check blob files by size, not by re-hashing.")
@json_option
@click.pass_context
def backup_verify(ctx: click.Context, dest: str, shallow: bool, as_json: bool) -> None:
    """Check a backup whole, read-only: its marker, its database's digest, verify at
    the marker's head, every blob it needs re-hashed (--shallow: sizes).

    \b
    Exit codes: 0 complete and sound; 2 incomplete (BackupIncomplete: take it again)
    or damaged, edited or not a backup (BackupInvalid).
    """
    from .backup import check_backup

    found = check_backup(dest, deep=not shallow)
    if as_json:
        _emit_json(found)
        return
    click.echo(f"backup {found.path}: ok — ledger {found.ledger_id} at head #{found.head_seq},"
               f" {_n(found.blobs, 'blob file')} ({_size(found.blob_bytes)}), taken"
               f" {_iso(found.created_ns)}")


@backup_group.command("restore", epilog=_examples(
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail",
    "steptrail backup restore /mnt/backup/ledger ./new/.steptrail \\",
    "  --witness /other/volume/new.witness      # the backup was witnessed",
))
@click.argument("backup_dir", metavar="BACKUP_DIR",
                type=click.Path(file_okay=True, dir_okay=True))
@click.argument("ledger_dir", metavar="LEDGER_DIR",
                type=click.Path(file_okay=True, dir_okay=True))
@click.option("--witness", "new_witness", metavar="PATH", type=click.Path(dir_okay=False),
              help="A new witness for the restored ledger, absolute (required when the"
              " backup was witnessed; default: the global --witness).")
@json_option
@click.pass_context
def backup_restore(ctx: click.Context, backup_dir: str, ledger_dir: str,
                   new_witness: str | None, as_json: bool) -> None:
    """Make a ledger of a backup: LEDGER_DIR (new or empty) receives its database and
    blob files, checked whole first, verified after.

    A restored ledger is behind its old witness by construction: a witnessed backup
    needs --witness PATH, a new file, anchored at the backup's head (the
    witness-anchored event records what it replaced). Then restore each workspace:
    'steptrail --ledger LEDGER_DIR/ledger.db restore --workspace NAME --to DIR'.

    \b
    Exit codes: 0 restored; 2 the backup is incomplete or damaged, LEDGER_DIR is not
    new or empty, or --witness is missing or not a new absolute path.
    """
    from .backup import restore_backup

    update, finish = _progress("copying blobs")
    try:
        got = restore_backup(backup_dir, ledger_dir, witness=new_witness or ctx.obj.get("witness"),
                             progress=update)
    finally:
        finish()
    if as_json:
        _emit_json(got)
        return
    witness = (f"; new witness {got.witness} anchored at event #{got.anchored_seq}"
               if got.witness else "")
    click.echo(f"restored ledger {got.path}: head #{got.head_seq},"
               f" {_n(got.blobs, 'blob file')} ({_size(got.blob_bytes)}); verified{witness}")
    for name in got.workspaces:
        # As printed, it runs: a lease live in the backup is live here too, and restore
        # refuses a live lease without --force (issue 26, item 17).
        force = " --force" if name in got.live_leases else ""
        click.echo(f"next: steptrail --ledger {shlex.quote(got.path)} restore --workspace"
                   f" {shlex.quote(name)} --to DIR{force}")
# -- seal: sealed runs (docs/design.md "Sealed runs") ------------------------------------


def archive_dir_option(f: F) -> F:
    return click.option("--archive-dir", "archive_dir", metavar="DIR",
                        type=click.Path(file_okay=False),
                        help="Where the archives are (default: archive/ beside a ledger file;"
                             " for a ledger in a database, the absolute directory its first"
                             " seal recorded, which that seal needs).")(f)


@cli.group("seal")
def seal_group() -> None:
    """Seal settled runs: move their events into archive files and shrink the ledger.

    A sealed run's events leave the ledger for a verifiable archive; the ledger keeps one
    run-sealed event that lets verify check the chain across the gap. Only runs whose
    steps are all settled (acked, compensated, rejected), hold no pin and write no
    workspace can be sealed.

    \b
        steptrail seal plan
        steptrail seal run build-42 --vacuum
        steptrail seal verify
    """


@seal_group.command("plan", epilog=_examples("steptrail seal plan",
                                             "steptrail seal plan --json | jq .events"))
@json_option
@click.pass_context
def seal_plan(ctx: click.Context, as_json: bool) -> None:
    """Which runs could be sealed now, and how many events and bytes that removes. Read-only."""
    from .seal import sealable

    with _open(ctx, readonly=True) as ledger:
        report = sealable(ledger)
    if as_json:
        _emit_json(msgspec.to_builtins(report))
        return
    for r in report.runs:
        click.echo(f"{r.run}  {_n(r.steps, 'step')}  {_n(r.events, 'event')}  {_size(r.size_bytes)}"
                   f"  {'sealable' if r.sealable else 'no: ' + (r.why or '')}")
    click.echo(f"{_n(report.sealable_runs, 'run')} sealable: {_n(report.events, 'event')}"
               f" of {report.ledger_events}, {_size(report.size_bytes)} of payload")


@seal_group.command("run", epilog=_examples(
    "steptrail seal run build-42",
    "steptrail seal run build-41 build-42 --vacuum --json",
))
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@archive_dir_option
@click.option("--vacuum", is_flag=True, help="Then give the freed pages back (VACUUM): the file shrinks.")
@json_option
@click.pass_context
def seal_run_command(ctx: click.Context, runs: tuple[str, ...], archive_dir: str | None,
                     vacuum: bool, as_json: bool) -> None:
    """Seal each RUN: write its archive (durably, verified), then record the seal and
    remove its events in one transaction. A run that cannot be sealed is refused
    (NotSealable) before anything of it is written; runs sealed before it stay sealed."""
    from .events import check_step_id
    from .seal import seal_run, vacuum as vacuum_ledger

    for run in runs:
        check_step_id(run)  # bad input writes nothing
    done = []
    with _open(ctx, readonly=False) as ledger:
        for run in runs:
            done.append(seal_run(ledger, run, archive_dir))
            if not as_json:
                r = done[-1]
                click.echo(f"sealed {r.run}: {_n(r.events, 'event')} in {_n(r.gaps, 'gap')},"
                           f" {_n(r.steps, 'step')}, {_n(r.blobs, 'blob')} -> {r.archive}"
                           f" (seal #{r.seal_seq}{', adopted' if r.adopted else ''})")
        sizes = vacuum_ledger(ledger) if vacuum else None
    if as_json:
        out: dict[str, Any] = {"sealed": [msgspec.to_builtins(r) for r in done]}
        if sizes is not None:
            out["vacuum"] = {"before_bytes": sizes[0], "after_bytes": sizes[1]}
        _emit_json(out)
    elif sizes is not None:
        click.echo(f"vacuum: {_size(sizes[0])} -> {_size(sizes[1])}")


@seal_group.command("list", epilog=_examples("steptrail seal list", "steptrail seal list --json"))
@archive_dir_option
@json_option
@click.pass_context
def seal_list(ctx: click.Context, archive_dir: str | None, as_json: bool) -> None:
    """Every sealed run: its seal event, its archive (and whether it is there). Read-only."""
    from .seal import sealed_runs

    with _open(ctx, readonly=True) as ledger:
        seals = sealed_runs(ledger, archive_dir)
    if as_json:
        _emit_json([msgspec.to_builtins(s) for s in seals])
        return
    for s in seals:
        click.echo(f"#{s.seal_seq}  {s.run}  {_n(s.events, 'event')}  {_n(s.steps, 'step')}"
                   f"  {s.archive}{'' if s.present else '  MISSING'}")


@seal_group.command("verify", epilog=_examples(
    "steptrail seal verify                          # the ledger and every archive",
    "steptrail seal verify archive/0a1b-…-17.slarchive --json",
))
@click.argument("archives", nargs=-1, metavar="[ARCHIVE]...")
@archive_dir_option
@json_option
@click.pass_context
def seal_verify(ctx: click.Context, archives: tuple[str, ...], archive_dir: str | None,
                as_json: bool) -> None:
    """Verify the ledger and every archive its seals name (no ARCHIVE), or each ARCHIVE
    against the ledger. Exit 1 on any finding; a file that is not an intact archive is
    ArchiveInvalid (exit 2). Read-only."""
    from .seal import verify_archive, verify_sealed

    with _open(ctx, readonly=True) as ledger:
        if archives:
            reports = [verify_archive(a, ledger) for a in archives]
            ok = all(r.ok for r in reports)
            doc: dict[str, Any] = {"ok": ok, "archives": [msgspec.to_builtins(r) for r in reports]}
            findings = [f for r in reports for f in r.findings]
        else:
            full = verify_sealed(ledger, archive_dir)
            ok = full.ok
            findings = full.ledger.findings + full.findings
            doc = {"ok": ok, "ledger": {"ok": full.ledger.ok, "events": full.ledger.events,
                                        "head_seq": full.ledger.head_seq,
                                        "findings": msgspec.to_builtins(full.ledger.findings)},
                   "archives": [msgspec.to_builtins(r) for r in full.archives],
                   "findings": msgspec.to_builtins(full.findings)}
    if as_json:
        _emit_json(doc)
    else:
        for f in findings:
            click.echo(f"{f.check}: {f.message}")
        n = len(doc["archives"])
        click.echo(f"{'ok' if ok else 'NOT OK'}: {_n(n, 'archive')} checked")
    if not ok:
        ctx.exit(1)


@seal_group.command("show", epilog=_examples("steptrail seal show archive/0a1b-…-17.slarchive",
                                             "steptrail seal show ARCHIVE --json"))
@click.argument("archive", metavar="ARCHIVE")
@json_option
@click.pass_context
def seal_show(ctx: click.Context, archive: str, as_json: bool) -> None:
    """Read an archived run's events in place (the archive is checked first, never
    changed). Needs no ledger."""
    from .seal import read_archive

    recorded = list(read_archive(archive))  # verified whole before the first event
    if as_json:
        _emit_json([event_json(r) for r in recorded])
        return
    for r in recorded:
        ev = r.event
        attempt = getattr(ev, "attempt", 0)
        click.echo(f"{r.seq:>8}  {_iso(r.time_ns)}  {r.kind:<18}  {getattr(ev, 'step', '')}"
                   + (f" #{attempt}" if attempt else "") + f"  {_event_detail(r)}")


@seal_group.command("vacuum", epilog=_examples("steptrail seal vacuum"))
@json_option
@click.pass_context
def seal_vacuum(ctx: click.Context, as_json: bool) -> None:
    """Give the pages sealed runs freed back to the file system (SQLite VACUUM): the
    ledger file shrinks. Takes the write lock for as long as it rewrites the file."""
    from .seal import vacuum as vacuum_ledger

    with _open(ctx, readonly=False) as ledger:
        before, after = vacuum_ledger(ledger)
    if as_json:
        _emit_json({"before_bytes": before, "after_bytes": after})
    else:
        click.echo(f"vacuum: {_size(before)} -> {_size(after)}")


@cli.command()
@click.option("--artifacts", "n", type=click.IntRange(1, 50), default=5, show_default=True,
              help="Artifacts in the step (alternating inline and file blobs).")
@click.option("--wrong-order", is_flag=True, help="Run the broken protocol (manifest before blobs): must report violations.")
@click.option("--fenced", "shape", type=click.Choice(["rotation", "swap", "move"]),
              help="Kill a fenced workspace step of this shape instead (a 6-file rotation,"
              " a swap, a 3-file directory move): after each kill a new epoch must put every"
              " file back (or find the step committed), and a re-run must commit it.")
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
def chaos(n: int, wrong_order: bool, shape: str | None, power_loss: bool,
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

    \b
        steptrail chaos --artifacts 5
        steptrail chaos --fenced rotation  # a 6-file rotation killed at every operation
        steptrail chaos --wrong-order      # the negative control: violations > 0
        steptrail chaos --power-loss --points 40
        steptrail chaos --power-loss --model torn --dir /mnt/disk-under-test
        steptrail chaos --io-errors --persistent --points 40
    """
    if power_loss or io_errors:
        _chaos_faults(power_loss, models, persistent, points, seed, workdir, as_json)
        return
    from .testing.chaos import run_chaos, run_fenced_chaos

    update, finish = _progress("crash points")
    try:
        if shape is not None:
            report = run_fenced_chaos(shape, workdir=workdir, progress=update)
        else:
            report = run_chaos(n, wrong_order=wrong_order, workdir=workdir, progress=update)
    finally:
        finish()
    if as_json:
        _emit_json(report.as_json())
    else:
        first = "AFTER SETTLE" if shape else "AFTER CRASH"
        click.echo(f"{'INDEX':>5}  {'OPERATION':<28}  {first:<12}  AFTER REPLAY")
        for r in report.rows:
            click.echo(f"{r.index:>5}  {r.operation:<28}  {r.after_crash:<12}  {r.after_replay}")
        order = "WRONG order (manifest before blobs)" if wrong_order else "correct order"
        if shape:
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

    from .testing import faults

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


@cli.command()
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
    from .testing import fuzz as fuzz_mod

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


@cli.command()
@click.option("--keep", metavar="DIR", type=click.Path(file_okay=False), help="Keep the demo's files in DIR.")
@click.option("--ledger", "demo_ledger", metavar="URL", help="Keep the demo's ledger in this"
              " empty PostgreSQL database (the cross-machine scenario); default: a SQLite file.")
@json_option
def demo(keep: str | None, demo_ledger: str | None, as_json: bool) -> None:
    """Run the end-to-end demonstration on an embedded ledger (the main job).

    Creates a fresh ledger in a temporary directory (or DIR), drives scripted steps
    through it with the failures steptrail exists for, and checks every invariant.
    Exit 0 only if every check held.

    With --ledger postgresql://... the ledger lives in that (empty) database and the
    workers share nothing but its URL: the worker SIGKILLed mid-step loses its
    directory, and a worker elsewhere restores the workspace from the database onto a
    fresh directory, takes a new epoch and finishes; the dead worker's late receipt is
    refused.

    \b
        steptrail demo
        steptrail demo --ledger postgresql://me@db.internal/demo
    """
    from . import locate
    from .demo import run_demo

    if demo_ledger is not None and not locate(demo_ledger).in_database:
        raise InvalidInput(f"demo --ledger takes a postgresql:// URL, not {demo_ledger!r}"
                           " (without it the demo makes its own SQLite ledger)")
    try:
        report = run_demo(keep, echo=None if as_json else functools.partial(click.echo, err=False),
                          ledger=demo_ledger)
    except FileExistsError as exc:
        raise InvalidInput(str(exc)) from None
    if as_json:
        _emit_json(report)
    if not report["ok"]:
        sys.exit(EXIT_NO)


#: The modules whose absence means the [mcp] extra is not installed.
_MCP_SDK_MODULES = ("mcp", "mcp_types", "pydantic", "anyio", "starlette", "uvicorn")


@cli.command("mcp", epilog=_examples(
    "steptrail mcp --workspace .                    # stdio: what an MCP client spawns",
    "steptrail mcp --workspace ~/src/app --workspace ~/src/lib",
    "steptrail --ledger /srv/ledger.db mcp --workspace app   # a registered NAME",
    "steptrail mcp --workspace . --http --port 8765  # streamable HTTP on 127.0.0.1",
))
@click.option("--workspace", "workspaces", multiple=True, metavar="DIR|NAME",
              help="A directory to serve (registered as a workspace under its base name if it"
              " is not one yet), or the NAME of a registered workspace; repeat it for several."
              " Relative paths in tool calls are inside the first. Default: the global"
              " --workspace.")
@click.option("--http", is_flag=True,
              help="Serve streamable HTTP (at /mcp) instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="The address --http binds: loopback only, unless --allow-remote.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True,
              help="The port --http binds.")
@click.option("--allow-remote", is_flag=True,
              help="Let --http bind a non-loopback address. The server has no authentication:"
              " only with something else guarding the port.")
@click.option("--lease-ttl", type=Duration(), default="20s", show_default=True,
              help="How long one write's lease lives without a heartbeat (at most 7d): how"
              " soon another server takes over from one that died on another machine.")
@click.option("--lease-wait", type=Duration(), default="30s", show_default=True,
              help="How long a write waits for another server's lease before it gives up.")
@click.option("--lease-linger", type=Duration(allow_zero=True), default="200ms",
              show_default=True,
              help="How long the server keeps the lease after a write for its next one,"
              " unless another server waits for it (0: release after every write).")
@click.pass_context
def mcp(ctx: click.Context, workspaces: tuple[str, ...], http: bool, host: str, port: int,
        allow_remote: bool, lease_ttl: float, lease_wait: float, lease_linger: float) -> None:
    """Serve workspace files to an MCP client: fenced, journaled, undoable writes.

    An MCP server (the official SDK) with the reference filesystem server's tools
    (read_text_file, write_file, edit_file, move_file, ...) and history, undo, status
    and audit. Every write is a steptrail step fenced on what the client read; a
    stale write is a conflict with a diff, never an overwrite. Without --ledger the
    ledger is the first directory's .steptrail/ledger.db, created if absent. Needs
    the extra: pip install 'steptrail[mcp]'. See docs/mcp.md.
    """
    try:
        from .mcp.server import serve
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _MCP_SDK_MODULES:
            raise
        _fail(ctx, f"the MCP SDK is not installed (no module {exc.name!r}); install the"
              " extra: pip install 'steptrail[mcp]'", EXIT_USAGE, "MissingExtra",
              {"extra": "mcp", "module": exc.name})
    specs = list(workspaces) or ([ctx.obj["workspace"]] if ctx.obj.get("workspace") else [])
    if not specs:
        raise click.UsageError("give the workspace to serve: --workspace DIR (e.g."
                               " --workspace .)", ctx=ctx)
    for name, value in (("--lease-ttl", lease_ttl), ("--lease-wait", lease_wait),
                        ("--lease-linger", lease_linger)):
        if value > 7 * 24 * 3600:
            raise click.UsageError(f"{name} must be at most 7d", ctx=ctx)
    if lease_linger >= lease_ttl / 2:
        raise click.UsageError("--lease-linger must be less than half of --lease-ttl", ctx=ctx)
    root = ctx.find_root()
    given = root.get_parameter_source("ledger_path") not in (
        None, click.core.ParameterSource.DEFAULT)
    serve(specs, ledger_path=ctx.obj["ledger_path"] if given else None,
          witness=ctx.obj.get("witness"), http=http, host=host, port=port,
          allow_remote=allow_remote, lease_ttl_s=lease_ttl, lease_wait_s=lease_wait,
          lease_linger_s=lease_linger, echo=functools.partial(click.echo, err=True))


def _ensure_utf8_mode() -> None:
    """Re-run this process in Python's UTF-8 mode when the locale's encoding is not
    UTF-8 (``LC_ALL=C`` with UTF-8 mode turned off, a legacy locale): step ids,
    workspace names and paths are UTF-8 in the ledger, and there Python would decode
    the arguments and file names as ASCII (a UTF-8 name becoming lone surrogates,
    refused) and could not print them. The arguments are handed on as the bytes the
    process received."""
    if sys.flags.utf8_mode or not sys.executable:
        return
    if codecs.lookup(sys.getfilesystemencoding()).name == "utf-8":
        return
    argv = [os.fsencode(a) for a in sys.orig_argv]
    os.execv(sys.executable, [argv[0], b"-X", b"utf8", *argv[1:]])


def main() -> None:
    _ensure_utf8_mode()
    cli(prog_name="steptrail")


__all__ = ["cli", "main"]

"""The command line's plumbing: its group and command classes, the one place errors
leave it (`LedgerGroup`), --json, opening the ledger, progress bars, help epilogs.

Every error is one line on stderr, never a traceback, with its exit code
(docs/design.md "The command line"): 0 success; 1 the answer is no (a violation found,
or the protocol refused); 2 usage or bad input, including a file that is not a usable
ledger; 3 the environment failed (disk full, I/O error, lock timeout); 130 interrupted
(Ctrl-C).
"""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from ledger.errors import EXIT_ENVIRONMENT, EXIT_USAGE, LedgerError, said_at_a_shell

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from ledger import Ledger

F = TypeVar("F", bound=Callable[..., Any])

#: The entry-point group whose commands `steptrail` offers beside its own.
COMMANDS_GROUP = "steptrail.commands"


class Settings(dict):  # type: ignore[type-arg]
    """The group's settings for its commands (``ctx.obj``). Reading ``ledger_path`` when
    the upward search found another user's ledger raises that refusal: every command
    that uses the ledger fails with it, and the ones that do not (completion, demo,
    ``init --nested``, which reads it with ``get``) run."""

    def __getitem__(self, key: str) -> Any:
        if key == "ledger_path" and self.get("ledger_foreign") is not None:
            raise self["ledger_foreign"]
        return super().__getitem__(key)


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
    is `Interrupted`, exit 130.

    Besides its own commands it offers those other packages add, the entry points of
    the group `steptrail.commands` (`ledger.testing`'s chaos and fuzz, pyproject.toml):
    one is loaded when it is invoked, or when the commands are listed (--help, a
    missing command); invoking a command of its own reads no entry points."""

    command_class = LedgerCommand
    group_class = LedgerSubgroup

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._added: dict[str, EntryPoint] | None = None  # read on first need
        self._loaded: dict[str, click.Command] = {}

    def added_commands(self) -> dict[str, EntryPoint]:
        """The commands of the entry-point group `COMMANDS_GROUP`, by name, not loaded."""
        if self._added is None:
            from importlib.metadata import entry_points

            self._added = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
        return self._added

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.added_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)  # its own command wins
        if command is not None or cmd_name not in self.added_commands():
            return command
        if cmd_name not in self._loaded:
            loaded = self.added_commands()[cmd_name].load()
            if not isinstance(loaded, click.Command):
                raise TypeError(f"the entry point {cmd_name!r} of {COMMANDS_GROUP} is not a"
                                f" click command: {loaded!r}")
            self._loaded[cmd_name] = loaded
        return self._loaded[cmd_name]

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
    from ledger import unmapped_error

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


#: `ctx.meta` key (shared by every context of one run): the command was given --json.
_JSON_KEY = "steptrail.json"
#: The error object's own keys; an error's facts never take them.
_ERROR_KEYS = frozenset({"type", "message", "exit_code", "retryable", "cli_message"})


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
    said = said_at_a_shell(exc)  # the command line's words for its fix
    message = f"{said}; {note}" if note else said
    _fail(ctx, message, exc.exit_code, type(exc).__name__, error_facts(exc), document)


def _fail(ctx: click.Context | None, message: str, code: int, type_name: str,
          facts: dict[str, Any] | None = None, document: dict[str, Any] | None = None,
          *, as_json: bool = False) -> None:
    """Exit `code` with one line on stderr naming `type_name`; under --json also print
    one JSON object on stdout: `document` (the command's answer, if it has one) with
    `"ok": false` and `"error": {"type", "message", "exit_code", ...facts}`."""
    message = " ".join(message.split())  # one line, whatever an error quotes
    if as_json or (ctx is not None and _wants_json(ctx)):
        error = {**(facts or {}), "type": type_name, "message": message, "exit_code": code,
                 "retryable": code == EXIT_ENVIRONMENT}
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
    from ledger import Ledger

    return Ledger.open(ctx.obj["ledger_path"], readonly=readonly, forensic=forensic,
                       witness=ctx.obj.get("witness"), witness_check=witness_check)


def _examples(*lines: str) -> str:
    """An epilog of examples, kept verbatim by click's help formatter."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)

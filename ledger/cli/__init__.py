"""The `steptrail` command: thin, scriptable, predictable.

Each command parses its arguments, calls the public API and formats the result.
Results go to stdout, progress and logs to stderr, so `--json` output is pure.
Exit codes (docs/design.md "The command line"): 0 success; 1 the answer is no (a
violation found, or the protocol refused); 2 usage or bad input, including a file
that is not a usable ledger; 3 the environment failed (disk full, I/O error, lock
timeout); 130 interrupted (Ctrl-C). Every error is one line on stderr, never a traceback;
a usage error click reports too.

One module per command or group of commands: `inspect` (init, events, steps, show,
rebuild, verify, head, blobs), `export`, `workspace`, `lease`, `step` (with `step_store`
and `step_run`), `gc` (gc, audit), `copy`, `backup` (backup, restore), `witness`, `seal`,
`stats` (stats, metrics), `status`, `demo`, `mcp`; under them `_common` (the group and command
classes, the one place errors leave, --json, opening the ledger), `_options` (the
shared options) and `_format` (what the commands print). Commands of other packages
come from the entry-point group ``steptrail.commands`` (`ledger.testing.commands`:
chaos, fuzz). This package imports click; it imports only the library's public API
(tests/architecture/test_architecture.py), each command when it runs (tests/cli/test_cli_fast.py).
"""

from __future__ import annotations

import codecs
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from ledger import __version__

# The modules, not their commands, are imported by name: `ledger.cli.step` stays the
# module (its command is `ledger.cli.step.step`).
from . import (
    backup,
    completion,
    copy,
    demo,
    export,
    fork,
    gc,
    hold,
    inspect,
    lease,
    mcp,
    observe,
    rewind,
    seal,
    stats,
    status,
    step,
    step_run,
    step_store,
    ui,
    witness,
    workspace,
)
from ._common import LedgerGroup
from ._options import (
    DEFAULT_PATH,
    ENV_LEDGER,
    ENV_WITNESS,
    ENV_WORKSPACE,
    FENCE_MODES,
    IN_FLIGHT,
    STATES,
    Duration,
)
from ._common import Settings as _Settings


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

    Without --ledger (or STEPTRAIL_LEDGER), a command uses the nearest
    .steptrail/ledger.db at or above the directory it runs in, as git finds
    .git (not across a mount point; STEPTRAIL_CEILING_DIRECTORIES stops it).

    \b
    Start here:
        steptrail init                      # create ./.steptrail/ledger.db
        steptrail status                    # the whole picture, and what to run next
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
    if not isinstance(ctx.obj, _Settings):  # (an embedding caller's hooks carried over)
        ctx.obj = _Settings(ctx.obj or {})
    default = ctx.get_parameter_source("ledger_path") is click.core.ParameterSource.DEFAULT
    ctx.obj["ledger_default"] = default
    if default:
        # no --ledger, no STEPTRAIL_LEDGER: the project's ledger, found upward from here
        # as git finds .git (ledger/find.py); none found: ./.steptrail/ledger.db
        from ledger.errors import LedgerError
        from ledger.find import find_place

        try:
            place = find_place()
        except LedgerError as exc:  # ForeignLedger, a removed working directory, a copied
            # fork's directory: raised when a command needs the ledger, not before
            place, ctx.obj["ledger_foreign"] = None, exc
        found = None if place is None else place[0]
        ctx.obj["ledger_found"] = found
        if found is not None:
            ledger_path = found
        if place is not None and place[1] is not None and not workspace:
            workspace = place[1].workspace  # a fork's directory: its workspace, by default
    ctx.obj["ledger_path"] = ledger_path
    ctx.obj["workspace"] = workspace or None
    ctx.obj["witness"] = witness or None


for _command in (
    inspect.init, inspect.events, inspect.steps, inspect.show, inspect.rebuild, inspect.verify,
    inspect.head, inspect.blobs, export.export, workspace.workspace, lease.lease, step.step,
    gc.gc_cmd, gc.audit_cmd, copy.copy_cmd, backup.backup_group, backup.restore_cmd,
    witness.witness_group, seal.seal_group, stats.stats_cmd, stats.metrics, demo.demo,
    mcp.mcp, observe.observe, rewind.rewind, fork.fork, hold.hold, status.status,
    completion.completion, ui.ui,
):
    cli.add_command(_command)
step.step.add_command(step_store.step_store)
step.step.add_command(step_run.step_run)


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


def main(args: Sequence[str] | None = None, *, obj: dict[str, Any] | None = None) -> None:
    """Run `steptrail` (the console script's entry point) on `args`, by default the
    process's arguments. `obj` starts the context object every command is handed: an
    embedding caller's hooks go there, ``{"on_stage": f}``: `step run` and `steptrail
    mcp` call ``f(STAGE)`` at each stage they reach (a test SIGKILLs or pauses the process
    there, as a crash would)."""
    _ensure_utf8_mode()
    cli.main(args, prog_name="steptrail", obj=obj)


__all__ = ["DEFAULT_PATH", "FENCE_MODES", "IN_FLIGHT", "STATES", "Duration", "cli", "main"]

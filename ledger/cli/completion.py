"""completion: the shell completion script for bash, zsh or fish (click's own)."""

from __future__ import annotations

import click

from ._common import LedgerCommand, _examples

#: The environment variable the script sets when it asks `steptrail` for completions
#: (click's convention: _<PROG>_COMPLETE); `main` answers it before any command runs.
COMPLETE_VAR = "_STEPTRAIL_COMPLETE"


@click.command("completion", cls=LedgerCommand, epilog=_examples(
    "steptrail completion bash > ~/.local/share/bash-completion/completions/steptrail",
    "steptrail completion zsh > \"${fpath[1]}/_steptrail\"",
    "steptrail completion fish > ~/.config/fish/completions/steptrail.fish",
    "eval \"$(steptrail completion bash)\"          # this shell only",
))
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    Install it where your shell loads completions (the examples), then start a new
    shell: commands, options, choices (--state, --fence ...) and file names complete on
    TAB. The script runs `steptrail` itself to complete, so it follows the installed
    version; nothing is read from or written to a ledger. Bash needs version 4.4 or newer.
    """
    from click.shell_completion import get_completion_class

    root = ctx.find_root().command
    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above admits only shells click knows
    click.echo(cls(root, {}, "steptrail", COMPLETE_VAR).source())

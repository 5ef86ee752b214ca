"""`steptrail step store`: files stored as a step's artifacts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from ledger.errors import InvalidInput
from ledger.events import check_relpath

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option

if TYPE_CHECKING:
    from ledger import BlobStored


@click.command("store", cls=LedgerCommand, epilog=_examples(
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
    from ledger.plans import input_content, open_input

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

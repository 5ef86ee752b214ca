"""`steptrail step run`: one step whole from its plan, in one process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from ledger.errors import InvalidInput, LedgerError

from ._common import LedgerCommand, Refusal, _emit_json, _examples, _open, json_option
from ._format import _n
from ._options import (
    _need_epoch,
    _workspace,
    epoch_option,
    fence_options,
    workspace_option,
)
from .step import (
    _admit,
    _echo_ack,
    _echo_admitted,
    _echo_apply,
    _echo_manifest,
    _not_applied,
    _read_plan,
    _rejection,
    ack_json,
    apply_json,
    manifest_json,
)
from .step_store import _artifact_inputs, _echo_stored, stored_json

if TYPE_CHECKING:
    from ledger import FencedOutcome, Ledger
    from ledger.plans import Plan

#: The stages of `step run`, in order, that an embedding caller's hook hears of
#: (``main(obj={"on_stage": f})`` calls ``f(STAGE)``; tests/cli/test_cli_run.py SIGKILLs the
#: process there, as a crash would): after-plan (the plan durable), after-commit (the
#: step committed, before it says so).
STAGES = ("after-plan", "after-commit")


@click.command("run", cls=LedgerCommand, epilog=_examples(
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
    on_stage = ctx.obj.get("on_stage")
    with _open(ctx, readonly=False) as ledger:
        try:
            _run_step(ledger, name, epoch, plan, fence, journal, contents, seen, doc, as_json,
                      on_stage)
        except Refusal as refusal:
            raise Refusal(refusal.error, doc if as_json else None) from None
        except LedgerError as exc:  # how far it got goes with the error
            raise Refusal(exc, doc if as_json else None) from None
    if as_json:
        _emit_json(doc)


def _run_step(ledger: Ledger, name: str, epoch: int, plan: Plan, fence: str, journal: bool,
              contents: dict[str, bytes | BinaryIO], seen: dict[str, str],
              doc: dict[str, Any], as_json: bool,
              on_stage: Callable[[str], None] | None = None) -> None:
    """`step run`: the plan admitted as `step plan` admits it (a different plan for a step
    in flight or committed is PlanConflict), then the library's fenced step
    (`run_fenced_step`) continues it: apply, artifacts, manifest and ack — in one commit
    when the artifacts fit in rows. Each part fills its key of `doc` as the command that
    does it alone prints it; a refusal raises Refusal. `on_stage` hears each of `STAGES`."""
    from ledger import ApplyResult, StepStatus, run_fenced_step

    def reached(stage: str) -> None:
        if on_stage is not None:
            on_stage(stage)

    planned = plan.steps[0]
    step_id = planned.step
    found = ledger.find_step(step_id)
    doc["already_committed"] = found is not None and found.live
    acked_before = found is not None and found.live and found.acked
    rows, rejected = _admit(ledger, name, epoch, plan, fence, journal)
    doc["plan"], doc["attempt"] = rows[0], rows[0]["attempt"]
    if not as_json:
        _echo_admitted(rows)
    if rejected is not None:
        raise Refusal(_rejection(rejected))
    reached("after-plan")
    before = ledger.head().seq
    out = run_fenced_step(ledger, name, step_id, list(planned.writes), epoch=epoch,
                          run=planned.run, fence=fence, journal=journal,  # type: ignore[arg-type]
                          plan_rev=plan.plan_rev, irreversible=planned.irreversible,
                          artifacts=contents)
    if out.status is StepStatus.STALE_EPOCH:
        assert out.error is not None
        raise Refusal(out.error)
    attempt = ledger.attempt(step_id, out.attempt)
    fenced_now = any(seq > before for seq, _ in attempt.fenced)
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
    stored = [e for seq, e in sorted(attempt.stored) if seq > before]
    doc["stored"] = stored_json(stored, seen)
    if not as_json and stored:
        _echo_stored(stored, seen)
    assert out.manifest is not None
    doc["manifest"], doc["committed"] = manifest_json(out.manifest), True
    if not as_json:
        _echo_manifest(out.manifest)
    reached("after-commit")
    acked = ledger.attempt(step_id, out.attempt, kind="acked").acked
    assert acked is not None  # (committed: acked with its manifest)
    doc["ack"] = ack_json(step_id, acked[0], acked_before)
    if not as_json:
        _echo_ack(step_id, acked_before)


def _conflict_facts(out: FencedOutcome) -> dict[str, Any]:
    """What the fence saw, as `step apply` reports it in its error object."""
    if not out.conflicts:
        return {}
    c = out.conflicts[0]
    if out.reason is not None and out.reason.value == "stale_rev":
        return {"path": c.path, "path_rev": c.on_disk_rev, "base_rev": c.read_rev}
    return {"path": c.path, "on_disk": c.on_disk_hash, "pre_hash": c.read_hash}

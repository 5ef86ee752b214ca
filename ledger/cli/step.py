"""`steptrail step`: one step's protocol by hand (plan, apply, replan, compensate,
publish, ack); `step store` and `step run` are in their own modules."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click
import msgspec

from ledger.errors import (
    CompensationConflict,
    IllegalTransition,
    InvalidInput,
    LedgerError,
    StaleEpoch,
    StepRejected,
)
from ledger.events import Manifest

from ._common import LedgerSubgroup, Refusal, _emit_json, _examples, _open, json_option
from ._format import _echo_compensation, _n, compensation_json
from ._options import (
    INT64_MAX,
    _need_epoch,
    _workspace,
    epoch_option,
    fence_options,
    workspace_option,
)

if TYPE_CHECKING:
    from ledger import ApplyResult, Ledger, StepRow
    from ledger.plans import Plan


@click.group("step", cls=LedgerSubgroup)
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
    from ledger.plans import load_plan

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
    from ledger import check_settled

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
    from ledger import check_settled

    epoch = _need_epoch(epoch, "applying")
    with _open(ctx, readonly=False) as ledger:
        row = ledger.step(step_id)
        if row.workspace and row.planned and attempt in (None, row.attempt):
            check_settled(ledger, row.workspace, epoch, but=step_id)
        result = ledger.workspaces.apply(step_id, attempt, epoch=epoch)
        if not as_json:
            if result.applied:
                _echo_apply(result)
            else:  # stderr says why (one line); stdout shows what changed
                _echo_conflict(ledger, row.workspace, result)
    if not result.applied:
        raise Refusal(_not_applied(result), apply_json(result) if as_json else None)
    if as_json:
        _emit_json(apply_json(result))


def _echo_conflict(ledger: Any, workspace: str, result: ApplyResult) -> None:
    """A refused apply's path as a diff on stdout: the bytes the step was planned against
    (when the ledger holds them: a path it committed before) against what is on disk."""
    path, pre = result.facts.get("path"), result.facts.get("pre_hash")
    if not isinstance(path, str) or not workspace:
        return
    from ledger.diffs import unified_diff
    from ledger.errors import LedgerError

    try:
        now = ledger.workspaces.read_file(workspace, path, max_bytes=2 * 1024 * 1024).content
    except LedgerError:
        return
    before = None
    if isinstance(pre, str):
        try:
            before = ledger.read_blob(pre)
        except LedgerError:
            click.echo(f"{path}: planned against {pre[:12]}, on disk now"
                       f" {result.facts.get('on_disk') or 'absent'!s:.12}; the bytes the step"
                       " read are not in the ledger (it never committed them): no diff")
            return
    diff = unified_diff(before, now, path, before_label="what the step read",
                        after_label="on disk now")
    if diff:
        click.echo(diff.rstrip("\n"))


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
        _emit_json(ack_json(step_id, r.seq, r.deduped))
    else:
        _echo_ack(step_id, r.deduped)


def ack_json(step_id: str, seq: int, deduped: bool) -> dict[str, Any]:
    return {"step": step_id, "seq": seq, "deduped": deduped}


def _echo_ack(step_id: str, deduped: bool) -> None:
    click.echo(f"step {step_id}: acked" + (" (already)" if deduped else ""))

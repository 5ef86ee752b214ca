"""The runners, the public front: `run_step` (an artifact-only step) and
`run_fenced_step` (a step that writes a workspace) — a step's whole lifecycle in one
call, safe to call again after a crash. The work is `ledger.step.run`'s, over the
ledger's `Site`; the values they answer are defined there too and exported here and from
`ledger`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .blobs import Content
from .step import run as _run
from .step.run import (
    FencedOutcome,
    Outputs,
    PathConflict,
    Planner,
    RejectReason,
    StepReader,
    StepResult,
    StepStatus,
)
from .step.values import FenceMode

if TYPE_CHECKING:
    from .ledger import Ledger


def run_step(ledger: Ledger, step: str, outputs: Outputs, *, run: str = "") -> StepResult:
    """Run (or finish) one artifact-only step and return its committed manifest.

    `outputs` maps artifact paths to bytes, or is a callable producing them — called
    only when the step is not committed yet (a committed step runs nothing).

    >>> from ledger import Ledger, run_step
    >>> with Ledger.init("ledger.db") as ledger:
    ...     result = run_step(ledger, "build-7", {"report.txt": b"ok\\n"})
    ...     print([a.path for a in result.manifest.artifacts], ledger.step("build-7").state)
    ['report.txt'] acked
    """
    return _run.run_step(ledger.workspaces.site, step, outputs, run=run)


def run_fenced_step(ledger: Ledger, workspace: str, step: str, plan: Planner, *, epoch: int,
                    run: str = "", fence: FenceMode = "step", journal: bool = True,
                    plan_rev: int | None = None, irreversible: bool = False,
                    artifacts: Mapping[str, Content] | None = None,
                    on_planned: Callable[[str], None] | None = None,
                    on_stage: Callable[[str], None] | None = None,
                    observe: bool = False) -> FencedOutcome:
    """Run (or finish) one step that writes `workspace`, under the live `epoch`, and say
    how it came out — the whole protocol in one call, safe to call again after a crash.

    `plan` is the planner: a callable given a `StepReader` (read through it: each write
    is then fenced on exactly those bytes, `FileRead.write`) returning the step's writes,
    or the writes themselves. On a first run: plan, admit (the plan and its post-images
    durable before any workspace write), then apply, publish and ack in one more commit.
    On a re-run: a committed step is answered from the ledger (DEDUPED, nothing runs; a
    published but unacked one is acked); an attempt in flight is continued (a kill
    between its exchanges is finished forward); an attempt a new epoch settled, or one
    the fence refused, is planned again from fresh reads (`ran`). A refusal is an
    outcome, not an exception: CONFLICT with each path's read and on-disk hash and a
    diff, STALE_EPOCH when the lease moved on. Other errors (bad input, the disk) raise.
    `artifacts` (path -> bytes, or a binary file open for reading: a test report, a
    log) are declared in the plan and committed with the step: when all are bytes that
    fit in rows (`inline_max_bytes`), in the apply's commit; otherwise each is stored
    (pinned, durable; a file streamed) after the apply, then the step is published and
    acked (more commits). `fence`, `journal`, `plan_rev` and `irreversible` are
    `admit`'s (an operator's choices, never a plan's). `on_stage(stage)` is a harness's
    observation point (a test injects its fault there, a crash test stops the process):
    ``"planned"`` once this call's plan is durable, before any workspace write;
    ``"applied"`` once the apply is recorded (with the commit itself when every artifact
    fits in a row; otherwise before the artifacts are stored and the step published);
    ``"committed"`` once published and acked by this call. An exception it raises ends
    the call there, as a crash would leave the step (a re-run finishes it).
    `on_planned(step)` is the ``"planned"`` stage alone (kept for its callers).
    `observe`: first record the edits made to the workspace outside the steps
    (`Workspaces.observe` under `epoch`, asked by ``runner:STEP``), so a person's edit
    since the last step is in the history before this one plans — a stat walk of the
    tree each step (docs/performance.md "Observing a workspace").

        with Ledger.open(".steptrail/ledger.db") as led:
            lease = led.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
            out = run_fenced_step(led, "repo", "edit-1",
                                  lambda read: [read.read("app.py").write(b"v1\n")],
                                  epoch=lease.epoch)
            if out.status is StepStatus.CONFLICT:
                print(out.conflicts[0].diff)

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import run_fenced_step
    >>> def plan(read):
    ...     return [read.read("app.py").write(b"v1\\n")]
    >>> run_fenced_step(ledger, "repo", "edit-1", plan, epoch=lease.epoch).status
    <StepStatus.APPLIED: 'applied'>
    >>> ledger.close()
    """
    return _run.run_fenced_step(ledger.workspaces.site, workspace, step, plan, epoch=epoch,
                                run=run, fence=fence, journal=journal, plan_rev=plan_rev,
                                irreversible=irreversible, artifacts=artifacts,
                                on_planned=on_planned, on_stage=on_stage, observe=observe)


__all__ = ["FencedOutcome", "PathConflict", "Planner", "RejectReason", "StepReader",
           "StepResult", "StepStatus", "run_fenced_step", "run_step"]

"""What needs a person's attention after a night of agents: one definition, shown by
`steptrail status`, the UI's overview and the MCP server's `ledger_status`.

    from ledger import Ledger
    from ledger.attention import attention

    with Ledger.open(readonly=True) as ledger:
        for item in attention(ledger):
            print(item.kind, item.subject, item.reason, item.fix)

An item is one of:

- ``refused`` — a write the fence refused (the file changed under the step);
- ``compensated`` — a step whose writes were undone (its tests failed, say);
- ``settled`` — an attempt of a dead worker settled by a later epoch (its lease was
  taken over: the worker was killed or froze);
- ``half-undone`` — a compensation or a refusal's take-back that left paths as they
  were (a person had changed them: never overwritten), for a person to decide;
- ``unacked`` — a committed step nobody acknowledged;
- ``in-flight`` — a step planned or applying and not finished (a worker may have died
  with it);
- ``kept`` — a file steptrail kept beside its path under a visible name instead of
  removing it (``NAME.steptrail-kept-TAG``);
- ``moved`` — the ledger is not where its workspace was registered (a copied project);
- ``verify`` — a finding of verify, when the caller ran it.

Each has a one-line `reason` in words and, where a command resolves it, `fix` (the
command's arguments after ``steptrail``). An item is *resolved* when what it reports
was made good later — a refused or compensated attempt whose retry committed —:
`resolved` says how; open items (`resolved` empty) come first. Reads only: the steps'
projection, and the events of each step that took more than one attempt (by the step
index) or that is not acked.
"""

from __future__ import annotations

import shlex
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ledger import Ledger

#: A step state a worker is still expected to move on from.
IN_FLIGHT = frozenset({"planned", "fenced", "blob-stored", "compensating"})
#: Every kind, in the order items are shown (open ones first, each kind's newest first).
KINDS = ("moved", "verify", "half-undone", "refused", "settled", "compensated", "kept",
         "in-flight", "unacked")


class Item(NamedTuple):
    """One thing to look at (see the module)."""

    kind: str
    subject: str  # the step id; a path for `kept`; the check for `verify`
    reason: str
    workspace: str = ""
    run: str = ""
    step: str = ""
    attempt: int = 0
    seq: int = 0  # the event that reports it (0: none)
    time_ns: int = 0
    fix: str = ""  # the command that resolves it, after "steptrail" ("": none)
    resolved: str = ""  # how it was made good ("": it is open)

    def as_json(self) -> dict[str, Any]:
        return {**self._asdict(), "resolved": self.resolved or None, "fix": self.fix or None}


def _q(text: str) -> str:
    return shlex.quote(text)


def _step_arg(step: str) -> str:
    # an id that reads as an option goes after `--`
    return f"-- {_q(step)}" if step.startswith("-") else _q(step)


def _first_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def attention(ledger: Ledger, *, findings: Iterable[tuple[str, int, str]] = (),
              resolved: bool = True, limit: int = 500,
              workspaces: Container[str] | None = None) -> list[Item]:
    """Every item that needs a person (see the module), open ones first, at most
    `limit`; `findings` are verify's (check, seq, message), when the caller has them;
    without `resolved`, only open items. `workspaces`: only the items of those
    workspaces (and those of none), chosen before `limit` cuts the list — another
    workspace's many items never push these out."""
    items: list[Item] = []
    for check, seq, message in findings:
        items.append(Item("verify", check, _first_line(message), seq=seq, fix="verify"))
    for ws in ledger.workspaces.list():
        moved = ledger.workspaces.ledger_moved(ws.name)
        if moved is not None:
            items.append(Item("moved", ws.name, _first_line(str(moved).split(";")[0]),
                              workspace=ws.name, fix=moved.command.removeprefix("steptrail ")))
        for k in ledger.workspaces.kept(ws.name):
            if not k.present:
                continue
            items.append(Item(
                "kept", k.kept, f"kept beside {k.path} instead of removed: compare, keep what"
                " you need, then delete it", workspace=ws.name, step=k.step,
                attempt=k.attempt, seq=k.seq))
    for row in ledger.steps():
        if row.state == "acked" and row.attempt <= 1:
            continue
        items.extend(_step_items(ledger, row))
    if workspaces is not None:
        items = [it for it in items if not it.workspace or it.workspace in workspaces]
    order = {k: i for i, k in enumerate(KINDS)}
    items.sort(key=lambda it: (bool(it.resolved), order.get(it.kind, 99), -it.seq))
    return items[:limit] if resolved else [it for it in items if not it.resolved][:limit]


def _step_items(ledger: Ledger, row: Any) -> list[Item]:
    """The items one step gives: its current state's, and its earlier attempts'."""
    out: list[Item] = []
    s = row.step_id
    base = {"workspace": row.workspace, "run": row.run, "step": s}
    committed = row.state in ("acked", "manifest-published")
    planned_epoch: dict[int, int] = {}
    # an earlier attempt, or this one ended refused or undone: its events say how (by
    # the step index); a first attempt in flight or unacked has nothing more to say
    told = row.attempt > 1 or row.state in ("rejected", "compensated")
    for r in ledger.timeline(s) if told else ():
        ev: Any = r.event
        if r.kind == "planned":
            planned_epoch[ev.attempt] = ev.epoch
        later = ev.attempt != row.attempt or committed
        how = (f"attempt {row.attempt} committed (#{row.last_seq})" if committed
               else f"superseded by attempt {row.attempt}") if later else ""
        if r.kind == "rejected":
            detail = f" ({_first_line(ev.detail, 160)})" if ev.detail else ""
            out.append(Item("refused", s, f"attempt {ev.attempt}'s write was refused:"
                            f" {ev.reason}{detail}", attempt=ev.attempt, seq=r.seq,
                            time_ns=r.time_ns, resolved=how,
                            fix="" if how else f"step replan {_step_arg(s)}", **base))
            conflicts = [x.path for x in ev.undone if x.outcome == "conflict"]
            if conflicts:
                out.append(_half(s, ev.attempt, r, conflicts, base))
        elif r.kind == "compensated":
            by = ev.epoch
            was = planned_epoch.get(ev.attempt, by)
            if by > was:
                kind, reason = "settled", (f"attempt {ev.attempt} (epoch {was}) was settled by"
                                           f" epoch {by}: its worker lost the lease (killed or"
                                           " frozen) and its writes were undone")
            else:
                kind, reason = "compensated", (f"attempt {ev.attempt} was undone"
                                               + (f": {_first_line(ev.reason, 160)}"
                                                  if ev.reason else ""))
            out.append(Item(kind, s, reason, attempt=ev.attempt, seq=r.seq, time_ns=r.time_ns,
                            resolved=how, **base))
            conflicts = [x.path for x in ev.restored if x.outcome == "conflict"]
            if conflicts:
                out.append(_half(s, ev.attempt, r, conflicts, base))
    if row.state == "manifest-published":
        out.append(Item("unacked", s, f"attempt {row.attempt} committed and was never"
                        " acknowledged", attempt=row.attempt, seq=row.last_seq,
                        time_ns=row.updated_ns,
                        fix=f"step ack {_step_arg(s)}" + (f" --epoch {row.epoch}"
                                                          if row.workspace else ""), **base))
    elif row.state in IN_FLIGHT and row.workspace:
        out.append(Item("in-flight", s, f"attempt {row.attempt} is {row.state} and has not"
                        " finished (its worker may have died: a new lease settles it)",
                        attempt=row.attempt, seq=row.last_seq, time_ns=row.updated_ns,
                        fix=f"--workspace {_q(row.workspace)} lease acquire --holder \"$USER\"",
                        **base))
    elif row.state in IN_FLIGHT:  # an artifact-only step: its own commands finish it
        nxt = {"planned": f"step store {_step_arg(s)} FILE --as NAME",
               "blob-stored": f"step publish {_step_arg(s)}",
               "compensating": f"step compensate {_step_arg(s)} --reason 'finish the undo'",
               "fenced": f"step publish {_step_arg(s)}"}[row.state]
        out.append(Item("in-flight", s, f"artifact step, attempt {row.attempt} is {row.state}"
                        " and has not finished", attempt=row.attempt, seq=row.last_seq,
                        time_ns=row.updated_ns, fix=nxt, **base))
    return out


def _half(step: str, attempt: int, r: Any, paths: list[str], base: dict[str, str]) -> Item:
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return Item("half-undone", step, f"attempt {attempt}'s undo left {shown} as a person had"
                " changed them (never overwritten): decide what each should hold",
                attempt=attempt, seq=r.seq, time_ns=r.time_ns, **base)


__all__ = ["IN_FLIGHT", "KINDS", "Item", "attention"]

"""A workspace through time in `steptrail ui` (docs/time-travel.md): its timeline of steps
and observations — the edits made outside the steps, each marked with who asked and its
label — and what a rewind to any point of it would change.

The rewind page is a preview and nothing else: the changes come from the library's own
preview (`Workspaces.rewind(..., preview=True)`, which writes nothing, on the read-only
ledger every page reads), and the page shows the command that would perform the rewind.
The UI never rewinds, forks or observes. A fork's lineage and the holds in force are shown
on the pages they concern (`StepPages`, `LedgerPages`), read through `model.Lineage` and
`Ledger.holds`.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import Response

from . import model, text
from .files import FilePages
from .web import (
    BadRequest,
    NotFound,
    PAGE,
    PAGE_DIFF_BUDGET_S,
    REWIND_PAGE,
    REWIND_PATHS_MAX,
    Shell,
    TREE_PAGE,
    _int,
    _param,
    _step_id_ok,
)

if TYPE_CHECKING:
    from ledger import Ledger

#: A value the command line's ``--to`` reads as a seq, not a step id (ledger/cli/rewind.py).
_SEQ_LIKE: Final = re.compile(r"(?:#|seq:)[0-9]{1,18}")
#: How many of an observation's left-out files its timeline row names.
LEFT_OUT_SHOWN: Final = 5


class TravelPages:
    """A workspace's timeline with its observations (`/timeline`) and the preview of a
    rewind (`/rewind`); the preview's diffs are `FilePages.diff_of`'s."""

    def __init__(self, ui: Shell, files: FilePages) -> None:
        self.ui, self.files = ui, files

    # -- the timeline ----------------------------------------------------------------------

    def timeline(self, request: Request, led: Ledger) -> Response:
        """Every attempt planned in the workspace — steps and observations — in seq order,
        a page at a time: forward from ``?after=`` (the start), or back from ``?before=``
        (the head's next seq: the latest page)."""
        name = _param(request, "ws")
        if not _step_id_ok(name):
            raise NotFound(f"no workspace {name!r} in this ledger")
        ws = led.workspaces.get(name)  # UnknownWorkspace: 404
        head = led.head().seq
        after = _int(request, "after", 0)
        before = _int(request, "before", 0, lo=1) if request.query_params.get("before") else None
        if before is not None and after:
            raise BadRequest("give ?after= or ?before=, not both")

        def match(r: Any) -> Any:
            return r if r.event.workspace == name else None

        earlier: int | None
        later: int | None
        if before is None:
            scan = model.scan_forward(led, ("planned",), match, after=after, want=PAGE,
                                      workspace=name)
            items = scan.items
            earlier = (items[0].seq if items else after + 1) if after else None
            later = scan.next_after
            stopped = later is not None and len(items) < PAGE
        else:
            scan = model.scan_backward(led, ("planned",), match, before=before, want=PAGE,
                                       workspace=name)
            items = scan.items[::-1]
            earlier = None if scan.complete else scan.next_after
            later = (items[-1].seq if items else before - 1) if before <= head else None
            stopped = earlier is not None and len(items) < PAGE
        origin = self.ui.lineage.origin(led, name)
        return self.ui.render(
            request, "travel_timeline.html", led, name=name, ws=ws, rows=self.rows(led, items),
            after=after, before=before, earlier=earlier, later=later, stopped=stopped,
            latest=head + 1, origin=origin, origin_step=model.step_at(led, origin),
            forks=self.ui.lineage.forks(led, name))

    def rows(self, led: Ledger, planned: list[Any]) -> list[dict[str, Any]]:
        """One row per `planned` event: its step's row now, the lease holder, and for an
        observation its `observed` event (who asked, label, baseline, what it left out);
        the rewind target of the row (the step when it wrote the workspace, else the
        plan's seq: before anything of it was written). Two indexed reads a row."""
        out = []
        for r in planned:
            ev = r.event
            seen = model.first_of(led, "observed", step=ev.step)
            wrote = model.first_of(led, "fenced", step=ev.step) is not None
            obs: Any = seen.event if seen is not None else None
            if obs is not None and obs.attempt != ev.attempt:
                obs = None  # (an observation has one attempt: its own row only)
            out.append({
                "r": r, "ev": ev, "row": led.find_step(ev.step), "obs": obs,
                "left_out": obs.not_captured[:LEFT_OUT_SHOWN] if obs is not None else (),
                "holder": self.ui.holders.get(led, ev.workspace, ev.epoch)
                if ev.workspace and ev.epoch else None,
                "to": {"step": ev.step} if wrote else {"seq": r.seq}})
        return out

    # -- the rewind preview ----------------------------------------------------------------

    def rewind(self, request: Request, led: Ledger) -> Response:
        """What rewinding workspace ``?ws=`` to ``?step=`` (just after its writes) or
        ``?seq=`` (as of that event) would change — only ``?path=`` (repeatable) if given —
        with a page of diffs from ``?start=``: the library's preview, nothing written."""
        name = _param(request, "ws")
        if not _step_id_ok(name):
            raise NotFound(f"no workspace {name!r} in this ledger")
        led.workspaces.get(name)  # UnknownWorkspace: 404
        step = request.query_params.get("step", "")
        seq = request.query_params.get("seq", "")
        target: str | int
        if step and seq:
            raise BadRequest("give ?step= or ?seq=, not both")
        if step:
            if not _step_id_ok(step) or led.find_step(step) is None:
                raise NotFound(f"no step {step!r} in this ledger")
            target = step
        elif seq:
            target = _int(request, "seq", 0)
        else:
            raise BadRequest("the page needs ?step= (a step id) or ?seq= (an event's seq)")
        paths = request.query_params.getlist("path")
        if len(paths) > REWIND_PATHS_MAX:
            raise BadRequest(f"?path= is given {len(paths)} times; the page takes at most"
                             f" {REWIND_PATHS_MAX} (a directory stands for what is under it)")
        start = _int(request, "start", 0)
        # the library's preview (InvalidInput — a step that wrote nothing, a seq past the
        # head, a path outside the workspace — is a 400 page), without its diffs: the page
        # diffs only the changes it shows, within its own budget
        plan = led.workspaces.rewind(name, target, paths=paths or None, preview=True,
                                     diffs=False)
        every = plan.changes
        if start and start >= len(every):
            raise BadRequest(f"?start= is past the last change (there are {len(every)})")
        deadline = time.monotonic() + PAGE_DIFF_BUDGET_S
        shown = []
        for ch in every[start:start + REWIND_PAGE]:
            d, now_size, then_size = self.files.diff_of(led, ch.now, ch.then, ch.path, deadline)
            shown.append({"change": ch, "path": ch.path, "pre": ch.now, "post": ch.then,
                          "diff": d, "pre_size": now_size, "post_size": then_size, "step": ""})
        counts = {k: sum(1 for c in every if c.kind == k) for k in ("restore", "create", "delete", "mode")}
        to_word = (f"#{plan.to_seq}" if plan.to_step is None or _SEQ_LIKE.fullmatch(plan.to_step)
                   else plan.to_step)
        base = self._base_command(name)
        rest = ["rewind", *_option("--to", to_word)]
        for p in paths:
            rest += _option("--path", p)
        return self.ui.render(
            request, "rewind.html", led, name=name, plan=plan, step=step, seq=seq,
            paths=paths, changes=shown, start=start, total=len(every), counts=counts,
            next_start=start + REWIND_PAGE if start + REWIND_PAGE < len(every) else None,
            prev_start=max(0, start - REWIND_PAGE) if start else None,
            unreachable=plan.unreachable[:TREE_PAGE], unobserved=plan.unobserved[:TREE_PAGE],
            preview_command=text.command(*base, *rest, "--preview"),
            rewind_command=text.command(*base, *rest),
            observe_command=text.command(*base, "observe"),
            to_step_row=led.find_step(plan.to_step) if plan.to_step else None)

    def _base_command(self, name: str) -> list[str]:
        """``steptrail [--ledger L] --workspace W``: the ledger named when the page can
        show its location whole (a URL's password is never shown: then the reader adds
        ``--ledger``, or runs it where the ledger is found)."""
        words = ["steptrail"]
        if self.ui.shown == self.ui.location:
            words += _option("--ledger", self.ui.location)
        return words + _option("--workspace", name)


def _option(flag: str, value: str) -> list[str]:
    """An option and its value as shell words: ``--flag=VALUE`` as one word when the
    value starts with ``-`` (never read as an option of its own), else two."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


__all__ = ["TravelPages"]

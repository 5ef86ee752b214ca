"""One step, one run, one workspace in `steptrail ui`: a step's events by attempt (its
writes with their diffs, a refusal in words, its undo), a run's steps, a workspace's
attempts and paths, one path's history."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import Response

from ledger.errors import InvalidInput, LedgerError


from . import model, text

if TYPE_CHECKING:
    from ledger import Ledger

from .web import (
    DIFFS_PER_PAGE,
    DISK_HASH_MAX,
    NotFound,
    PAGE,
    PAGE_DIFF_BUDGET_S,
    STEP_EVENTS_PAGE,
    Shell,
    TREE_PAGE,
    WRITES_PER_EVENT,
    _int,
    _param,
    _step_id_ok,
)
from .files import FilePages


class StepPages:
    """The pages about steps, runs and workspaces (see the module); their diffs are
    `FilePages.diff_of`'s."""

    def __init__(self, ui: Shell, files: FilePages) -> None:
        self.ui, self.files = ui, files

    def step(self, request: Request, led: Ledger) -> Response:
        step_id = _param(request, "id")
        row = led.find_step(step_id) if _step_id_ok(step_id) else None
        if row is None:
            raise NotFound(f"no step {step_id!r} in this ledger")
        after = _int(request, "after", 0)
        events = list(led.read(after, step=step_id, limit=STEP_EVENTS_PAGE + 1))
        more = len(events) > STEP_EVENTS_PAGE
        events = events[:STEP_EVENTS_PAGE]
        planned: dict[int, Any] = {}
        budget = [DIFFS_PER_PAGE]
        deadline = time.monotonic() + PAGE_DIFF_BUDGET_S
        items = [self._event_item(led, r, planned, budget, deadline) for r in events]
        manifest = led.manifest(step_id) if row.manifest_rev >= 0 else None
        if manifest is None and row.manifest_rev >= 0:
            manifest = led.manifest(step_id, row.manifest_rev)
        dead, current = self._dead_epochs(led, row, items)
        return self.ui.render(request, "step.html", led, row=row, items=items, manifest=manifest,
                           attempts=_by_attempt(items),
                           listed=WRITES_PER_EVENT, dead=dead, current=current,
                           more_after=events[-1].seq if more else None, after=after,
                           holds=model.holds_covering(led, step=step_id, run=row.run),
                           holder=self.ui.holders.get(led, row.workspace, row.epoch)
                           if row.workspace else None)

    def _dead_epochs(self, led: Ledger, row: Any, items: list[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The attempts on this page that ran under an epoch the workspace has left: the
        protocol refuses anything they still send (a late receipt, a publish, an ack:
        StaleEpoch) — the ledger records no refusal, so the page states the rule."""
        if not row.workspace:
            return [], None
        try:
            ws = led.workspaces.get(row.workspace)
        except LedgerError:
            return [], None
        seen: dict[int, dict[str, Any]] = {}
        # an attempt its own worker ended (acked, refused, undone under its epoch) sends
        # nothing more: only one that could still send something is shown
        ended = {getattr(it["ev"], "attempt", 0) for it in items
                 if it["kind"] in ("acked", "rejected", "compensated")
                 and getattr(it["ev"], "epoch", 0) == _planned_epoch(items, it["ev"])}
        for it in items:
            epoch, attempt = getattr(it["ev"], "epoch", 0), getattr(it["ev"], "attempt", 0)
            if epoch and epoch < ws.epoch and attempt not in seen and attempt not in ended:
                seen[attempt] = {"attempt": attempt, "epoch": epoch, "holder": it["holder"]}
        current = {"epoch": ws.epoch,
                   "holder": self.ui.holders.get(led, row.workspace, ws.epoch) if ws.epoch else None}
        return [seen[a] for a in sorted(seen)], current

    def _event_item(self, led: Ledger, r: Any, planned: dict[int, Any],
                    budget: list[int], deadline: float) -> dict[str, Any]:
        ev = r.event
        item: dict[str, Any] = {"r": r, "ev": ev, "kind": r.kind, "diffs": [], "blobs": [],
                                "more": 0}
        ws = getattr(ev, "workspace", "")
        epoch = getattr(ev, "epoch", 0)
        item["holder"] = self.ui.holders.get(led, ws, epoch) if ws and epoch else None

        def diff_of(path: str, pre: str | None, post: str | None, **extra: Any) -> dict[str, Any]:
            d: dict[str, Any] = {"path": path, "pre": pre, "post": post, **extra}
            if budget[0] <= 0:
                d["diff"] = text.Diff("unavailable", note="not diffed on this page (too many"
                                      " writes): see the path's history")
                return d
            budget[0] -= 1
            d["diff"], d["pre_size"], d["post_size"] = self.files.diff_of(led, pre, post, path,
                                                                    deadline)
            d["step"] = getattr(ev, "step", "")
            return d

        if r.kind == "planned":
            planned[ev.attempt] = ev
        elif r.kind == "fenced":
            item["diffs"] = [diff_of(w.path, w.pre_hash, w.post_hash, rev=w.rev)
                             for w in ev.writes[:WRITES_PER_EVENT]]
            item["more"] = max(0, len(ev.writes) - WRITES_PER_EVENT)
        elif r.kind == "rejected":
            plan = planned.get(ev.attempt) or self._planned(led, ev.step, ev.attempt)
            writes = plan.writes if plan is not None else ()
            # what the fence found on disk, by path, as its detail recorded it
            found = dict(re.findall(r"(\S+) on disk does not hold[^(]*\(on disk: ([0-9a-f]{64})\)",
                                    ev.detail or ""))
            for path, rev in re.findall(r"(\S+) is at rev (\d+), planned against",
                                        ev.detail or ""):
                # a stale rev: what that rev holds is what the write that made it wrote
                def made(x: Any, path: str = path, rev: int = int(rev)) -> Any:
                    hit = [w for w in x.event.writes if w.path == path and w.rev == rev]
                    return hit[0].post_hash if hit else None

                left = deadline - time.monotonic()  # within the page's time only
                if left <= 0:
                    break
                scan = model.scan_backward(led, ("fenced",), made, before=r.seq, want=1,
                                           budget_s=min(0.2, left), workspace=ev.workspace)
                if scan.items and scan.items[0]:
                    found[path] = scan.items[0]
            item["more"] = max(0, len(writes) - WRITES_PER_EVENT)
            for w in writes[:WRITES_PER_EVENT]:
                now_hash: str | None = None
                why = ""
                checked = budget[0] > 0  # hashing the file on disk costs like a diff
                if checked and time.monotonic() >= deadline:
                    why = "not hashed: this page's time was spent"
                elif checked:
                    # read at most DISK_HASH_MAX bytes: a file the agent grew (a sparse
                    # 2 GB file costs no disk) is not hashed on every load of the page
                    try:
                        now_hash = led.workspaces.read_file(
                            ev.workspace, w.path, max_bytes=DISK_HASH_MAX).pre_hash
                    except InvalidInput as exc:
                        why = (f"not hashed: larger than {DISK_HASH_MAX:,} bytes"
                               if "more than max_bytes" in str(exc)
                               else f"{type(exc).__name__}: {exc}")
                    except (LedgerError, OSError) as exc:
                        why = f"{type(exc).__name__}: {exc}"
                d = diff_of(w.path, w.pre_hash, w.post_hash, base_rev=w.base_rev,
                            disk_now=now_hash, disk_why=why, disk_checked=checked,
                            refused=True, found=found.get(w.path), change=None)
                if d["found"] and budget[0] > 0 and d["found"] != w.pre_hash:
                    # the change the step ran into, when the ledger holds its bytes
                    change, _, _ = self.files.diff_of(led, w.pre_hash, d["found"], w.path, deadline)
                    d["change"] = ({"diff": change, "pre": w.pre_hash, "post": d["found"],
                                    "path": w.path, "step": ev.step, "pre_size": None,
                                    "post_size": None}
                                   if change.kind in ("text", "binary", "deferred") else None)
                item["diffs"].append(d)
        elif r.kind in ("blob-stored",):
            item["blobs"] = [{"path": ev.path or "", "digest": ev.digest, "size": ev.size}]
        elif r.kind == "manifest-published":
            item["blobs"] = [{"path": e.path, "digest": e.digest, "size": e.size}
                             for e in ev.artifacts[:WRITES_PER_EVENT]]
            item["more"] = max(0, len(ev.artifacts) - WRITES_PER_EVENT)
        return item

    @staticmethod
    def _planned(led: Ledger, step: str, attempt: int) -> Any:
        return led.attempt(step, attempt, kind="planned").planned

    def run(self, request: Request, led: Ledger) -> Response:
        run_id = _param(request, "id")
        after = _int(request, "after", 0)

        try:
            scan = model.read_page(led, "planned", after=after, want=PAGE, run=run_id)
        except InvalidInput:  # not a name a run can have
            raise NotFound(f"no step of run {run_id!r} in this ledger") from None
        if not scan.items and after == 0 and scan.complete:
            raise NotFound(f"no step of run {run_id!r} in this ledger")
        return self.ui.render(request, "timeline.html", led, what="run", name=run_id,
                           rows=self._attempt_rows(led, scan.items), scan=scan, after=after,
                           ws=None, paths=None, paths_more=None,
                           holds=model.holds_covering(led, run=run_id))

    def workspace(self, request: Request, led: Ledger) -> Response:
        name = _param(request, "name")
        if not _step_id_ok(name):
            raise NotFound(f"no workspace {name!r} in this ledger")
        row = led.workspaces.get(name)  # UnknownWorkspace: 404
        after = _int(request, "after", 0)
        paths_after = request.query_params.get("paths_after", "")
        every = led.workspaces.paths(name)
        names = [p for p in every if p > paths_after][:TREE_PAGE]
        paths = [(p, every[p]) for p in names]
        paths_more = names[-1] if len(names) == TREE_PAGE and names[-1] != max(every) else None

        def match(r: Any) -> Any:
            return r if r.event.workspace == name else None

        scan = model.scan_forward(led, ("planned",), match, after=after, want=PAGE,
                                  workspace=name)
        now = led.clock()
        origin = self.ui.lineage.origin(led, name)
        return self.ui.render(request, "timeline.html", led, what="workspace", name=name,
                           rows=self._attempt_rows(led, scan.items), scan=scan, after=after,
                           ws=row, live=row.live_epoch(now) is not None, paths=paths,
                           paths_more=paths_more, paths_total=len(every), holds=[],
                           origin=origin, origin_step=model.step_at(led, origin),
                           forks=self.ui.lineage.forks(led, name))

    def _attempt_rows(self, led: Ledger, planned: list[Any]) -> list[dict[str, Any]]:
        out = []
        for r in planned:
            ev = r.event
            row = led.find_step(ev.step)
            out.append({"r": r, "ev": ev, "row": row,
                        "holder": self.ui.holders.get(led, ev.workspace, ev.epoch)
                        if ev.workspace and ev.epoch else None})
        return out

    def history(self, request: Request, led: Ledger) -> Response:
        ws, path = _param(request, "ws"), _param(request, "path")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        before = _int(request, "before", 0, lo=0) or None

        def match(r: Any) -> Any:
            ev = r.event
            if ev.workspace != ws:
                return None
            if r.kind == "fenced":
                hit = [w for w in ev.writes if w.path == path]
                return (r, hit[0]) if hit else None
            if r.kind == "compensated":
                hit = [x for x in ev.restored if x.path == path]
                return (r, hit[0]) if hit else None
            if r.kind == "rejected":
                plan = self._planned(led, ev.step, ev.attempt)
                hit = [w for w in (plan.writes if plan else ()) if w.path == path]
                return (r, hit[0]) if hit else None
            return None

        scan = model.scan_backward(led, ("fenced", "compensated", "rejected"), match,
                                   before=before, want=PAGE // 2, workspace=ws)
        entries = []
        budget = [DIFFS_PER_PAGE]
        deadline = time.monotonic() + PAGE_DIFF_BUDGET_S
        for r, w in scan.items:
            entry: dict[str, Any] = {"r": r, "ev": r.event, "w": w, "kind": r.kind,
                                     "diff": None}
            if budget[0] > 0 and r.kind != "compensated":
                budget[0] -= 1
                entry["diff"], _, _ = self.files.diff_of(led, w.pre_hash, w.post_hash, path,
                                                   deadline)
            entries.append(entry)
        return self.ui.render(request, "history.html", led, ws=ws, path=path, entries=entries,
                           scan=scan, before=before)


def _planned_epoch(items: list[dict[str, Any]], ev: Any) -> int:
    """The epoch attempt `ev.attempt` was planned under (as on this page), else its own."""
    for it in items:
        if it["kind"] == "planned" and it["ev"].attempt == getattr(ev, "attempt", -1):
            return int(it["ev"].epoch)
    return int(getattr(ev, "epoch", 0))


#: How an attempt ended, by its last event's kind.
_OUTCOMES: Final = {"acked": "committed and acknowledged",
                    "manifest-published": "committed, not acknowledged yet",
                    "rejected": "refused: nothing of it stayed",
                    "compensated": "undone", "compensating": "being undone",
                    "planned": "planned, not applied", "fenced": "applied, not committed",
                    "blob-stored": "storing artifacts, not committed",
                    "blob-pinned": "in flight"}


def _by_attempt(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's events grouped by attempt, each with its epoch, start, end, duration
    and outcome in words; `blob-pinned` rows counted, not listed."""
    out: list[dict[str, Any]] = []
    for it in items:
        attempt = getattr(it["ev"], "attempt", 0)
        if not out or out[-1]["attempt"] != attempt:
            out.append({"attempt": attempt, "events": [], "pinned": 0,
                        "epoch": getattr(it["ev"], "epoch", 0), "holder": it["holder"],
                        "first_ns": it["r"].time_ns, "last_ns": it["r"].time_ns, "last": ""})
        group = out[-1]
        group["last_ns"], group["last"] = it["r"].time_ns, it["kind"]
        if it["kind"] == "blob-pinned":
            group["pinned"] += 1
        else:
            group["events"].append(it)
    for group in out:
        ev = group["events"][-1]["ev"] if group["events"] else None
        settled = (group["last"] == "compensated" and ev is not None
                   and getattr(ev, "epoch", 0) > group["epoch"] > 0)
        group["outcome"] = (f"settled by epoch {ev.epoch}: its worker lost the lease, its"
                            " writes were undone" if settled
                            else _OUTCOMES.get(group["last"], group["last"]))
    return out


__all__ = ["StepPages"]

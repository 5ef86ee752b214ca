"""The ledger as a whole in `steptrail ui`: the overview (what needs a person, the
workspaces, recent events, growth), runs, search, the events with their filters, the
comparison of two steps, the stats page."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response



from . import model, text

if TYPE_CHECKING:
    from ledger import Ledger

from .web import (
    BadRequest,
    EVENTS_PAGE,
    NotFound,
    PAGE,
    Shell,
    TREE_PAGE,
    _int,
    _param,
    _step_id_ok,
    _time_range,
)


class LedgerPages:
    """The pages about the ledger as a whole (see the module)."""

    def __init__(self, ui: Shell) -> None:
        self.ui = ui

    def overview(self, request: Request, led: Ledger) -> Response:
        now = led.clock()
        workspaces = []
        waiting = []
        for state in (*model.IN_FLIGHT, model.UNACKED):
            waiting.extend(led.steps(state))
        waiting.sort(key=lambda r: r.last_seq, reverse=True)
        for row in led.workspaces.list():
            live = row.live_epoch(now) is not None
            older = set(led.workspaces.unsettled(row.name, row.epoch)) if row.epoch else set()
            mine = [r for r in waiting if r.workspace == row.name]
            workspaces.append({
                "row": row, "live": live, "origin": self.ui.lineage.origin(led, row.name),
                "forks": len(self.ui.lineage.forks(led, row.name)),
                "lease": ("never leased" if row.epoch == 0 else "live" if live else
                          "released" if row.released else "expired"),
                "in_flight": sum(1 for r in mine if r.in_flight),
                "unacked": sum(1 for r in mine if r.unacked),
                "unsettled": len(older)})
        rows = []
        for r in waiting[:PAGE]:
            ws = next((w for w in workspaces if w["row"].name == r.workspace), None)
            what = ("unacked" if r.unacked else
                    "unsettled" if ws is not None and r.epoch < ws["row"].epoch else "in flight")
            rows.append({"row": r, "what": what})
        head = led.head().seq
        recent = list(led.read(max(0, head - 15)))
        recent.reverse()
        items = self._attention()
        holds = led.holds()
        return self.ui.render(request, "overview.html", led, workspaces=workspaces, waiting=rows,
                           holds=holds[:PAGE], holds_total=len(holds),
                           waiting_total=len(waiting), recent=recent,
                           witness=led.witness_status(), lag=led.projection_lag(),
                           charts=self._charts(small=True),
                           attention_open=[i for i in items if not i.resolved][:PAGE]
                           if items is not None else None,
                           attention_resolved=[i for i in items if i.resolved][:PAGE]
                           if items is not None else None,
                           attention_open_total=self._attention_open(items),
                           runs=self._runs()[:10])

    def _attention(self) -> list[Any] | None:
        """What needs a person (`ledger.attention`, as of the stats job's head) and
        verify's findings; None while the first pass runs."""
        from ledger.attention import Item

        job = self.ui.jobs.stats
        if job.result is None:
            return None
        items: list[Any] = list(job.result.get("attention", []))
        v = self.ui.jobs.verify
        if v.result is not None:
            items = [Item("verify", check, message, seq=seq, fix="verify")
                     for check, seq, message in v.result["findings"]] + items
        return items

    def _attention_open(self, items: list[Any] | None) -> int:
        """How many items are open (verify's findings and every open item the stats
        job counted, not only those it kept)."""
        if items is None or self.ui.jobs.stats.result is None:
            return 0
        counted = self.ui.jobs.stats.result.get("attention_open")
        verify = sum(1 for i in items if i.kind == "verify")
        return verify + counted if counted is not None else sum(
            1 for i in items if not i.resolved)

    def _runs(self, query: str = "") -> list[Any]:
        """Every run the stats job saw, the latest first (a substring of the name
        picks some)."""
        job = self.ui.jobs.stats
        if job.result is None:
            return []
        runs = [r for r in job.result["report"].runs if query in r.run]
        return sorted(runs, key=lambda r: r.last_ns, reverse=True)

    def compare(self, request: Request, led: Ledger) -> Response:
        """A workspace between two points (seqs): every path written between them, what
        it held at the first and at the second, each with its diff a click away."""
        ws = _param(request, "ws")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        head = led.head().seq
        frm = _int(request, "from", 0)
        to = _int(request, "to", head)
        if frm >= to:
            raise BadRequest(f"?from= (#{frm}) must be before ?to= (#{to})")
        written = model.workspace_as_of(led, ws, to, after=frm)  # what changed in (frm, to]
        before = model.workspace_as_of(led, ws, frm) if frm else None
        rows = []
        for path, (_rev, digest, seq, step) in sorted(written.paths.items()):
            was = before.paths.get(path) if before is not None else None
            old = was[1] if was is not None else None
            if old != digest:
                rows.append({"path": path, "pre": old, "post": digest, "seq": seq,
                             "step": step})
        return self.ui.render(request, "compare.html", led, ws=ws, frm=frm, to=to,
                           rows=rows[:TREE_PAGE], total=len(rows),
                           complete=written.complete and (before is None or before.complete),
                           scanned_to=written.scanned_to)

    def runs(self, request: Request, led: Ledger) -> Response:
        query = request.query_params.get("q", "")
        every = self._runs(query)
        start = _int(request, "start", 0)
        return self.ui.render(request, "runs.html", led, runs=every[start:start + PAGE * 2],
                           total=len(every), start=start, q=query,
                           next_start=start + PAGE * 2 if start + PAGE * 2 < len(every) else None,
                           ready=self.ui.jobs.stats.result is not None)

    def search(self, request: Request, led: Ledger) -> Response:
        """Steps, runs and paths whose name holds the text searched for."""
        query = request.query_params.get("q", "").strip()
        if len(query) > 256:
            raise BadRequest("?q= takes at most 256 characters")
        STATES = model.STATES
        state = request.query_params.get("state", "")
        if state and state not in STATES:
            raise BadRequest(f"?state= is one of {', '.join(STATES)}, not {state!r}")
        since, until = request.query_params.get("since", ""), request.query_params.get("until", "")
        lo, hi = _time_range(since, until)
        steps: list[Any] = []
        paths: list[tuple[str, str]] = []
        runs: list[Any] = []
        paths_complete = True
        if query or state or since or until:  # the steps: by name, state and time
            # by the store (a million events: one indexed-free scan in SQL, no rows built)
            steps = [r for r in led.steps(state or None, contains=query or None,
                                          limit=None if (since or until) else PAGE)
                     if lo <= r.updated_ns < hi][:PAGE]
        if query:
            runs = [r for r in self._runs(query) if r.last_ns >= lo and r.first_ns < hi][:PAGE]
            head = led.head().seq
            # one scan budget for the page, shared by every workspace (each its own:
            # a ledger of many workspaces made one search minutes)
            deadline = time.monotonic() + model.SCAN_BUDGET_S
            for ws in led.workspaces.list():
                left = deadline - time.monotonic()
                if left <= 0:
                    paths_complete = False
                    break
                tree = model.workspace_as_of(led, ws.name, head, budget_s=left)
                paths_complete = paths_complete and tree.complete
                paths.extend((ws.name, p) for p, st in sorted(tree.paths.items())
                             if query in p)
                if len(paths) >= PAGE:
                    break
        return self.ui.render(request, "search.html", led, q=query, steps=steps, runs=runs,
                           state=state, since=since, until=until, states=STATES,
                           asked=bool(query or state or since or until),
                           paths=paths[:PAGE], paths_complete=paths_complete)

    def events(self, request: Request, led: Ledger) -> Response:
        filters = {k: request.query_params.get(k, "") for k in ("kind", "step", "run",
                                                                  "workspace", "since", "until")}
        if any(filters.values()):
            return self._filtered_events(request, led, filters)
        head = led.head().seq
        before = _int(request, "before", head + 1, lo=1)
        lo = max(0, before - 1 - EVENTS_PAGE)
        got = [r for r in led.read(lo, limit=EVENTS_PAGE) if r.seq < before]
        got.reverse()
        older = got[-1].seq if got and got[-1].seq > 1 else None
        newer = min(head + 1, before + EVENTS_PAGE) if before <= head else None
        return self.ui.render(request, "events.html", led, events=got, older=older,
                           newer=newer if newer and newer <= head + 1 and before <= head else None)

    def _filtered_events(self, request: Request, led: Ledger,
                         filters: dict[str, str]) -> Response:
        """The events of one kind, step, run or workspace, newest first, a bounded scan
        back from ?before=."""
        from ledger.events import KINDS

        kind = filters["kind"]
        if kind and kind not in KINDS:
            raise BadRequest(f"?kind= is one of {', '.join(KINDS)}, not {kind!r}")
        if filters["step"] and not _step_id_ok(filters["step"]):
            raise BadRequest("?step= is not a step id")
        before = _int(request, "before", 0, lo=0) or None
        by = {k: v for k, v in (("run", filters["run"]), ("workspace", filters["workspace"]))
              if v}
        if filters["step"]:
            by["step"] = filters["step"]  # (the step index: one step's events, a page)
        lo, hi = _time_range(filters["since"], filters["until"])
        scan = model.scan_backward(led, (kind,) if kind else tuple(KINDS),
                                   lambda r: r if lo <= r.time_ns < hi else None,
                                   before=before, want=EVENTS_PAGE, **by)
        got, older, complete = scan.items, scan.next_after, scan.complete
        return self.ui.render(request, "events.html", led, events=got, older=older, newer=None,
                           filters=filters, complete=complete)

    def stats(self, request: Request, led: Ledger) -> Response:
        return self.ui.render(request, "stats.html", led, charts=self._charts(small=False))

    def _charts(self, *, small: bool) -> dict[str, Any] | None:
        job = self.ui.jobs.stats
        if job.result is None:
            return None
        rep = job.result["report"]
        states = list(rep.by_state.items())
        out: dict[str, Any] = {"report": rep, "gc": job.result["gc"]}
        out["bytes_by_state"] = text.hbars(
            "bytes stored by state", [(k, rep.bytes_by_state.get(k, 0)) for k, _ in states],
            [f"{text.size(rep.bytes_by_state.get(k, 0))} · {n} steps" for k, n in states])
        growth, unit = _growth(rep)
        label = (lambda t: text.iso(t)[:10]) if unit == "day" else (
            lambda t: text.iso(t)[5:13].replace("T", " ") + "h")
        out["growth_events"] = text.vbars(
            f"events per {unit}", [(label(t), n) for t, n, _ in growth],
            [f"{n:,} events" for _, n, _ in growth], height=120 if small else 180)
        if not small:
            out["growth_bytes"] = text.vbars(
                f"bytes per {unit}", [(label(t), b) for t, _, b in growth],
                [text.size(b) for _, _, b in growth])
            kinds = list(rep.by_kind.items())
            out["kinds"] = text.hbars("events by kind", [(k, c.count) for k, c in kinds],
                                      [f"{c.count:,} ({text.size(c.bytes)})" for _, c in kinds])
            blobs = list(rep.blobs.items())
            out["blobs"] = text.hbars("blob bytes (as audit buckets them)",
                                      [(k, c.bytes) for k, c in blobs],
                                      [f"{text.size(c.bytes)} · {c.count}" for _, c in blobs])
        return out


def _growth(rep: Any) -> tuple[list[tuple[int, int, int]], str]:
    """The stats' growth as (start, events, bytes) bars: by hour when the ledger spans two
    days or less (a night's work: one daily bar says nothing), else added up by day."""
    hours = [(g.start_ns, g.events, g.bytes) for g in rep.growth]
    if rep.bucket != "hour" or not hours or hours[-1][0] - hours[0][0] <= 48 * 3600 * 10**9:
        return hours, rep.bucket if rep.bucket != "hour" or not hours else "hour"
    days: dict[int, list[int]] = {}
    for start, n, b in hours:
        day = start - start % (86400 * 10**9)
        got = days.setdefault(day, [0, 0])
        got[0] += n
        got[1] += b
    return [(d, n, b) for d, (n, b) in sorted(days.items())], "day"


__all__ = ["LedgerPages"]

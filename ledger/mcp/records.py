"""The tools the reference file server does not have (`Records`): `undo` (a committed
step compensated as a step of its own), `history`, `status`, `audit`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ledger import (
    CompensationWindowClosed,
    IllegalTransition,
    LedgerError,
    Planned,
    RecordedEvent,
    StaleEpoch,
    StepRow,
)

from ..errors import said_at_a_shell
from ..fmt import iso
from ..kinds import detail

from .values import (
    IN_FLIGHT,
    ClientView,
    Result,
    Seen,
    ToolFailure,
    Workspace,
    _REQUEST_ID,
    _summary,
    one_line,
)
from .changes import Changes
from .context import ToolContext


class Records:
    """Undo, history, status and audit over one `ToolContext` (see the module)."""

    def __init__(self, ctx: ToolContext, changes: Changes) -> None:
        self.ctx, self.changes = ctx, changes

    # -- what the reference server does not have -------------------------------------------

    def _resolve_step(self, view: ClientView, step: str | None) -> str:
        if step is None:
            for s in reversed(view.steps):
                with self.ctx.lock:
                    row = self.ctx.ledger.find_step(s)
                if row is not None and row.live:
                    return s
            raise ToolFailure("this session has no committed change to undo; name a step (see"
                              " history)")
        if not isinstance(step, str) or not step:
            raise ToolFailure("step must be a step id (as writes and history return it)")
        with self.ctx.lock:
            if self.ctx.ledger.find_step(step) is not None:
                return step
            for ws in self.ctx.workspaces:
                candidate = self.changes.step_id(ws, step)
                if _REQUEST_ID.fullmatch(step) and self.ctx.ledger.find_step(candidate) is not None:
                    return candidate
        raise ToolFailure(f"no step {step!r} in this ledger (give a step id from history, or"
                          " the requestId of the change)")

    def undo(self, view: ClientView, step: str | None = None, who: str = "mcp") -> Result:
        """Compensate one step back to its pre-images, fenced: a path that no longer holds
        what the step wrote (a person's or a later step's change) is left as found.

        Journaled by the library (`compensating` before the first file is touched), so an
        undo killed half-way — one file back, another not — is finished by the next
        server that takes the lease (its acquire settles it). The answer says what was
        put back: an undo that put nothing back is not reported as done."""
        step = self._resolve_step(view, step)
        with self.ctx.write_lock:
            with self.ctx.lock:
                row = self.ctx.ledger.step(step)
                ws = next((w for w in self.ctx.workspaces if w.name == row.workspace), None)
                if ws is None:
                    raise ToolFailure(f"step {step} is not a change of a workspace this server"
                                      " serves")
                if row.rejected:
                    raise ToolFailure(f"step {step} was refused when made: nothing of it was"
                                      " written, nothing to undo")
                if row.settled_unpublished:
                    raise ToolFailure(f"step {step} never committed (it was settled): nothing"
                                      " to undo")
            for retry in (False, True):
                try:
                    with self.changes.step_lease(ws) as epoch:
                        comp = self.ctx.ledger.workspaces.compensate(step, epoch=epoch,
                                                      reason=one_line(f"undo by {who}")[:200])
                    break
                except StaleEpoch:
                    if retry or not self.ctx.leases.reused:  # a kept lease taken over: once more
                        raise
                except (CompensationWindowClosed, IllegalTransition) as exc:
                    extra = (" (write the old content back with write_file; history shows it)"
                             if isinstance(exc, CompensationWindowClosed) else "")
                    raise ToolFailure(one_line(said_at_a_shell(exc)) + extra) from None
        files = []
        for r in comp.restored:
            if r.outcome != "conflict":
                view.put(ws.name, r.path, Seen(r.rev, r.digest))
            files.append({"path": self.ctx.show(ws, r.path), "outcome": r.outcome, "rev": r.rev,
                          "hash": r.digest,
                          "kept": None if r.kept is None else self.ctx.show(ws, r.kept)})
        conflicts = [f for f in files if f["outcome"] == "conflict"]
        lines = [f"{f['path']}: " + {"restored": "put back" + (" (removed: the step created it)"
                                                              if f["hash"] is None else ""),
                                     "already": "already back",
                                     "conflict": "LEFT AS FOUND: it changed after the step,"
                                                 " or it is where the step moved a file whose"
                                                 " old place could not be given back (nothing"
                                                 " was overwritten or removed)"}[f["outcome"]]
                 + (f"; a file that could not go back is kept as {f['kept']}"
                    if f["kept"] else "")
                 for f in files]
        summary = _summary(comp.restored)
        head = {"undone": "Undone", "partly undone": "Partly undone",
                "not undone": "NOT undone"}[summary]
        if comp.deduped:
            head = f"{head} earlier"
        status = {"undone": "undone", "partly undone": "partly-undone",
                  "not undone": "not-undone"}[summary]
        return Result([f"{head}: step {step}.\n" + "\n".join(lines)], {
            "status": status, "step": step, "workspace": ws.name, "deduped": comp.deduped,
            "files": files, "conflicts": len(conflicts)}, bool(conflicts))


    def _target(self, to: str) -> str | int:
        import re

        m = re.fullmatch(r"#([0-9]{1,18})", to)
        return int(m[1]) if m else to

    def rewind(self, view: ClientView, to: str, paths: list[str] | None = None,
               preview: bool = True) -> Result:
        """`ledger.workspaces.rewind` on the first served workspace, under this server's
        lease when it writes; the answer lists each change (with its diff in a preview)."""
        ws = self.ctx.workspaces[0]
        target = self._target(to)
        try:
            if preview:
                with self.ctx.lock:
                    got = self.ctx.ledger.workspaces.rewind(ws.name, target, paths=paths,
                                                            preview=True)
            else:
                with self.ctx.write_lock, self.changes.step_lease(ws) as epoch:
                    got = self.ctx.ledger.workspaces.rewind(ws.name, target, paths=paths,
                                                            epoch=epoch)
        except LedgerError as exc:
            raise ToolFailure(one_line(said_at_a_shell(exc))) from None
        marks = {"restore": "M", "create": "A", "delete": "D", "mode": "m"}
        lines = [f"{marks[c.kind]} {self.ctx.show(ws, c.path)}" + (f"\n{c.diff}" if c.diff
                                                                  else "")
                 for c in got.changes]
        lines += [f"left as it is: {self.ctx.show(ws, p)} ({why})" for p, why in got.unreachable]
        lines += [f"NOT OBSERVED: {self.ctx.show(ws, p)} holds an edit nobody recorded: call"
                  " observe first" for p in got.unobserved]
        if not got.changes:
            head = "Nothing to rewind: the workspace holds what it held then."
        elif preview:
            head = f"Preview: {len(got.changes)} file(s) would change (nothing written)."
        elif got.applied and got.cleared:
            head = (f"Rewound {len(got.changes)} file(s) as two steps: {got.cleared} removed"
                    f" what stood where a file and a directory traded places, then {got.step}"
                    " (undo takes back each: the second first).")
        elif got.applied:
            head = f"Rewound {len(got.changes)} file(s) as step {got.step} (undo takes it back)."
        else:
            head = (f"NOT rewound ({got.verdict}): nothing was overwritten. {got.detail}"
                    " Call observe to record the edit, then rewind again.")
        doc = {"step": got.step, "verdict": got.verdict or None, "preview": preview,
               "to_seq": got.to_seq, "changes": [
                   {"path": self.ctx.show(ws, c.path), "kind": c.kind, "diff": c.diff or None}
                   for c in got.changes],
               "unreachable": [{"path": p, "why": w} for p, w in got.unreachable],
               "unobserved": list(got.unobserved),
               "clears": [self.ctx.show(ws, p) for p in got.clears], "cleared": got.cleared}
        failed = bool(got.changes) and not preview and not got.applied
        return Result(["\n".join([head, *lines])], doc, failed)

    def fork(self, view: ClientView, at: str, to: str, name: str | None = None) -> Result:
        """`ledger.workspaces.fork` of the first served workspace."""
        import os

        if not os.path.isabs(to):
            raise ToolFailure("give the fork's directory by absolute path, outside the"
                              " workspace")
        ws = self.ctx.workspaces[0]
        try:
            with self.ctx.write_lock, self.ctx.lock:
                got = self.ctx.ledger.workspaces.fork(ws.name, self._target(at), to,
                                                      name=name)
        except LedgerError as exc:
            raise ToolFailure(one_line(said_at_a_shell(exc))) from None
        text = (f"Forked {ws.name} as of #{got.at_seq} into {got.root} as workspace"
                f" {got.workspace}: {got.files} file(s). Serve it with: steptrail mcp"
                f" --workspace {got.root}")
        return Result([text], {"workspace": got.workspace, "root": got.root,
                               "at_seq": got.at_seq, "files": got.files,
                               "baseline": list(got.baseline),
                               "unreachable": [{"path": p, "why": w}
                                               for p, w in got.unreachable]})

    def observe(self, view: ClientView, label: str = "", who: str = "mcp") -> Result:
        """Record the edits made outside the steps in every served workspace (a person's
        editor, a shell — the agent's own shell commands too: the observation names this
        client as the one that asked, never a person). Under the workspace's lease, as a
        write: nothing changed writes nothing."""
        found: list[tuple[Any, Any]] = []
        with self.ctx.write_lock:
            for ws in self.ctx.workspaces:
                quick = None
                with self.ctx.lock:
                    quick = self.ctx.ledger.workspaces.observe(ws.name, by=who, label=label,
                                                               dry_run=True)
                if not quick.changes:
                    found.append((ws, quick))
                    continue
                for retry in (False, True):
                    try:
                        with self.changes.step_lease(ws) as epoch:
                            got = self.ctx.ledger.workspaces.observe(
                                ws.name, epoch=epoch, by=who, label=label)
                        break
                    except StaleEpoch:
                        if retry or not self.ctx.leases.reused:
                            raise
                found.append((ws, got))
        marks = {"created": "A", "changed": "M", "deleted": "D", "mode": "m"}
        lines, docs = [], []
        for ws, o in found:
            changes = [{"path": self.ctx.show(ws, c.path), "kind": c.kind, "rev": c.base_rev,
                        "hash": c.post_hash} for c in o.changes]
            left = [{"path": self.ctx.show(ws, n.path), "why": n.why} for n in o.not_captured]
            docs.append({"workspace": ws.name, "recorded": o.recorded, "steps": list(o.steps),
                         "baseline": o.baseline, "changes": changes, "not_captured": left,
                         "files": o.files})
            if not o.changes:
                lines.append(f"{ws.name}: nothing changed outside the steps"
                             f" ({o.files} files looked at).")
                continue
            what = "a baseline" if o.baseline else "an observation"
            shown = "\n".join(f"{marks[c['kind']]} {c['path']}" for c in changes[:50])
            more = f"\n… and {len(changes) - 50} more" if len(changes) > 50 else ""
            lines.append(f"{ws.name}: recorded {len(changes)} change(s) made outside the steps"
                         f" as {what} ({', '.join(o.steps)}), asked by {who}:\n{shown}{more}")
            if left:
                lines.append("not captured: " + ", ".join(
                    f"{x['path']} ({x['why']})" for x in left[:20])
                    + (f" and {len(left) - 20} more" if len(left) > 20 else ""))
        return Result(["\n".join(lines)], {"workspaces": docs})

    def _outcome(self, row: StepRow | None) -> str:
        if row is None:
            return "unknown"
        if row.live:
            return "committed"
        if row.rejected:
            return "refused"
        if row.compensated:
            if row.settled_unpublished:
                return "settled (never committed)"
            return self.changes.undo_summary(self.changes.latest_attempt(row.step_id, row.attempt)[1])
        return f"in flight ({row.state})"

    def history(self, view: ClientView, path: str | None = None, limit: int = 20) -> Result:
        """The steps that wrote a path (or any path of the served workspaces), newest
        first, with who made them, when, and what became of them."""
        if not 1 <= limit <= self.ctx.limits.history_steps:
            raise ToolFailure(f"limit must be 1 to {self.ctx.limits.history_steps}")
        target: tuple[Workspace, str] | None = None
        if path is not None:
            target = self.ctx.resolve(path)
        names = {w.name: w for w in self.ctx.workspaces}

        def touches(r: RecordedEvent) -> bool:
            e = r.event
            return isinstance(e, Planned) and e.workspace in names and (
                target is None or (e.workspace == target[0].name
                                   and any(w.path == target[1] for w in e.writes)))

        with self.ctx.lock:
            newest, complete = self._newest(touches, limit, kind="planned",
                                            key=lambda r: r.event.step)  # type: ignore[union-attr]
            steps = []
            for r in reversed(newest):
                e = r.event
                assert isinstance(e, Planned)
                step = e.step
                row = self.ctx.ledger.find_step(step)
                ws = names[e.workspace]
                steps.append({
                    "step": step, "who": e.run or "(not recorded)", "planned": iso(r.time_ns),
                    "updated": iso(row.updated_ns) if row is not None else None,
                    "outcome": self._outcome(row), "attempt": e.attempt,
                    "files": [{"path": self.ctx.show(ws, w.path),
                               "change": "created" if w.pre_hash is None else "deleted"
                               if w.post_hash is None else "modified",
                               "from": w.pre_hash, "to": w.post_hash} for w in e.writes]})
        lines = [f"{s['planned']}  {s['step']}  {s['outcome']}  by {s['who']}: "
                 + ", ".join(f"{f['path']} {f['change']}" for f in s["files"][:10])
                 + (" …" if len(s["files"]) > 10 else "") for s in steps]
        shown = self.ctx.show(*target) if target else "the workspaces"
        if not complete:
            lines.append(f"(older steps not searched: the scan stopped after"
                         f" {self.ctx.limits.walk_seconds:g}s)")
        return Result([f"History of {shown} (newest first):\n" + ("\n".join(lines) or "no steps")],
                      {"path": shown, "steps": steps, "complete": complete})

    def _newest(self, match: Callable[[RecordedEvent], bool], want: int, *,
                kind: str | None = None, key: Callable[[RecordedEvent], Any] | None = None
                ) -> tuple[list[RecordedEvent], bool]:
        """The newest `want` events that `match` (oldest first; with `key`, the newest
        one per key), scanning back from the head in growing windows, for at most
        `walk_seconds`: (the events, whether the scan reached the first event). Memory
        follows `want` and the window, never the log."""
        hi = self.ctx.ledger.head().seq
        window = 1024
        found: list[RecordedEvent] = []
        seen: set[Any] = set()
        deadline = time.monotonic() + self.ctx.limits.walk_seconds
        while hi > 0 and len(found) < want:
            lo = max(0, hi - window)
            chunk: list[RecordedEvent] = []
            events = self.ctx.ledger.read(lo, kind=kind)
            try:
                for r in events:
                    if r.seq > hi:
                        break
                    if match(r):
                        chunk.append(r)
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
            for r in reversed(chunk):
                k = key(r) if key is not None else r.seq
                if k not in seen and len(found) < want:
                    seen.add(k)
                    found.append(r)
            hi, window = lo, min(window * 4, 1 << 20)
            if hi > 0 and time.monotonic() > deadline:
                return list(reversed(found)), False
        return list(reversed(found)), True

    def status(self, view: ClientView) -> Result:
        """Leases, steps in flight, anything left unsettled, and this session's view."""
        now = time.time_ns()
        out = []
        with self.ctx.lock:
            rows = [r for state in sorted(IN_FLIGHT) for r in self.ctx.ledger.steps(state)]
            for ws in self.ctx.workspaces:
                lease = self.ctx.ledger.workspaces.lease(ws.name)
                flight = [r.step_id for r in rows if r.workspace == ws.name]
                # in flight under an epoch that is no longer live: the next write settles it
                unsettled = (self.ctx.ledger.workspaces.unsettled(ws.name, lease.epoch if lease.live else
                                                   lease.epoch + 1) if lease.epoch else [])
                unsettled += [f"undo of {r.step_id} (begun, not finished: the next lease"
                              " taken finishes it)" for r in rows
                              if r.workspace == ws.name and r.compensating
                              and r.step_id not in unsettled]
                out.append({
                    "workspace": ws.name, "root": ws.root, "rev": self.ctx.ledger.workspaces.get(ws.name).rev,
                    "lease": {"epoch": lease.epoch, "holder": lease.holder, "live": lease.live,
                              "expires": iso(lease.expires_ns) if lease.expires_ns else None},
                    "in_flight": flight, "unsettled": unsettled})
            from ..attention import attention

            # what needs a person, as status and the UI say it (ledger/attention.py)
            served = {ws.name for ws in self.ctx.workspaces}
            items = [dict(it.as_json(), fix=f"steptrail {it.fix}" if it.fix else None)
                     for it in attention(self.ctx.ledger, limit=200, workspaces=served)]
        data = {"ledger": self.ctx.ledger.path, "holder": self.ctx.holder, "time": iso(now),
                "lease_ttl_s": self.ctx.lease_ttl_s, "workspaces": out, "attention": items,
                "session": {"paths_seen": len(view), "steps": list(view.steps)[-20:]},
                "notices": list(self.ctx.notices)}
        lines = [f"ledger {self.ctx.ledger.path}; this server is {self.ctx.holder}"]
        for w in out:
            lease = w["lease"]
            lines.append(f"workspace {w['workspace']} ({w['root']}): rev {w['rev']}; lease"
                         f" epoch {lease['epoch']} " + (f"held by {lease['holder']} until"
                                                  f" {lease['expires']}" if lease["live"] else "free")
                         + (f"; in flight: {', '.join(w['in_flight'][:10])}" if w["in_flight"] else "")
                         + (f"; UNSETTLED: {', '.join(w['unsettled'][:10])}" if w["unsettled"] else ""))
        open_ = [i for i in items if not i["resolved"]]
        if open_ or len(items) > len(open_):
            lines.append(f"needs attention: {len(open_)} open, {len(items) - len(open_)}"
                         " resolved (a later attempt committed)")
        for i in open_[:10]:
            lines.append(f"  {i['kind']} {i['subject']}: {i['reason']}"
                         + (f" (a person resolves it: {i['fix']})" if i["fix"] else ""))
        lines.append(f"this session has seen {len(view)} paths and made {len(view.steps)} steps")
        lines.extend(f"notice: {n}" for n in self.ctx.notices)
        return Result(["\n".join(lines)], data)

    def audit(self, view: ClientView, limit: int = 50, verify: bool = False) -> Result:
        """The audit log of the served workspaces: their newest events (who did what,
        when: steps planned, applied, committed, refused, undone; leases taken over),
        and, with `verify`, the ledger's full check (hash chain, projections, fences)."""
        if not 1 <= limit <= self.ctx.limits.audit_events:
            raise ToolFailure(f"limit must be 1 to {self.ctx.limits.audit_events}")
        names = {w.name for w in self.ctx.workspaces}
        with self.ctx.lock:
            newest, complete = self._newest(
                lambda r: getattr(r.event, "workspace", None) in names, limit)
            report = self.ctx.ledger.verify() if verify else None
        events = [self._event_json(r) for r in newest]
        counts: dict[str, int] = {}
        for r in newest:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        data: dict[str, Any] = {"events": events, "counts": counts, "complete": complete}
        lines = [f"{e['time']}  #{e['seq']}  {e['kind']}  {e.get('step', '')}  {e.get('detail', '')}".rstrip()
                 for e in events]
        if report is not None:
            findings = [f"{f.check}: {f.message}" for f in report.findings][:20]
            data["verify"] = {"ok": report.ok, "findings": findings,
                              "warnings": [str(getattr(w, "message", w)) for w in report.warnings][:20]}
            lines.append("verify: " + ("ok (chain, projections, fences, blobs)" if report.ok else
                                       f"{len(report.findings)} findings: " + "; ".join(findings[:5])))
        return Result(["\n".join(lines) or "no events"], data)

    @staticmethod
    def _event_json(r: RecordedEvent) -> dict[str, Any]:
        e = r.event
        out: dict[str, Any] = {"seq": r.seq, "time": iso(r.time_ns), "kind": r.kind,
                               "workspace": getattr(e, "workspace", "")}
        if getattr(e, "step", ""):
            out["step"], out["attempt"] = e.step, e.attempt  # type: ignore[union-attr]
        if isinstance(e, Planned):
            out["who"] = e.run
            out["paths"] = [w.path for w in e.writes]
        out["detail"] = detail(e)
        return out


__all__ = ["Records"]

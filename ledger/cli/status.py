"""`steptrail status`: the ledger on one screen, like `git status` — its head, each
workspace's lease and revision, the steps left in flight or unsettled with the command
to run next, the last collection, the audit, the witness. Read-only."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

import click

from ledger.fmt import ago as _ago

from ledger.errors import said_at_a_shell

from ._common import LedgerCommand, _emit_json, _examples, _open, json_option
from ._format import _iso, _n, _shown
from ._options import CLI_LEASE_TTL, IN_FLIGHT, workspace_option

if TYPE_CHECKING:
    from ledger import Ledger, StepRow, WsRow

#: The states a step waits in for someone's next command: in flight, or committed and
#: waiting for its ack.
UNACKED = "manifest-published"
#: How many steps a table shows (--json lists them all).
SHOWN = 20
#: The holder `lease acquire` is given in the commands printed: the shell's user.
HOLDER = '"$USER"'


def _lease_json(row: WsRow, now: int) -> dict[str, Any]:
    live = row.live_epoch(now) is not None
    state = ("never" if row.epoch == 0 else "live" if live else "released" if row.released
             else "expired")
    return {"state": state, "epoch": row.epoch, "holder": row.holder or None,
            "expires_ns": row.expires_ns if row.epoch else None,
            "expires": _iso(row.expires_ns) if row.epoch else None,
            "live": live, "expired": bool(row.epoch) and now >= row.expires_ns,
            "released": row.released,
            "remaining_s": max(0.0, (row.expires_ns - now) / 1e9) if live else 0.0}


def _lease_text(lease: dict[str, Any], now: int) -> str:
    if lease["state"] == "never":
        return "never leased"
    head = f"epoch {lease['epoch']} held by {lease['holder']}, "
    when = lease["expires_ns"] - now
    if lease["state"] == "live":
        return head + f"live, expires in {_ago(when)}"
    if lease["state"] == "released":
        return head + "released"
    return head + f"expired {_ago(when)} ago"


class _Commands:
    """The commands status tells the operator to run, spelled as they would type them:
    `--ledger` only when it was given on the command line (an environment variable
    carries over by itself)."""

    def __init__(self, ctx: click.Context, shown_ledger: str) -> None:
        root = ctx.find_root()
        given = root.get_parameter_source("ledger_path") is click.core.ParameterSource.COMMANDLINE
        self.base = "steptrail" + (f" --ledger {shlex.quote(shown_ledger)}" if given else "")

    def lease(self, ws: str, rest: str) -> str:
        return f"{self.base} --workspace {shlex.quote(ws)} lease {rest}"

    def acquire(self, ws: str, *, force: bool = False) -> str:
        return self.lease(ws, f"acquire --holder {HOLDER} --ttl {CLI_LEASE_TTL}"
                              + (" --force" if force else ""))

    def step(self, verb: str, step: str, rest: str = "") -> str:
        if step.startswith("-") and not rest.startswith("FILE"):
            # an id that reads as an option goes after `--` (options before it)
            return (f"{self.base} step {verb}" + (f" {rest}" if rest else "")
                    + f" -- {shlex.quote(step)}")
        return f"{self.base} step {verb} {shlex.quote(step)}" + (f" {rest}" if rest else "")


def _step_next(cmd: _Commands, row: StepRow, what: str, lease: dict[str, Any] | None) -> str:
    """The one command that moves `row` on (None: nothing a command line should do)."""
    s, epoch = row.step_id, lease["epoch"] if lease else 0
    if lease is None:  # an artifact-only step: no lease, no epoch
        return {"planned": cmd.step("store", s, "FILE --as NAME"),
                "blob-stored": cmd.step("publish", s),
                "compensating": cmd.step("compensate", s, "--reason 'finish the undo'"),
                UNACKED: cmd.step("ack", s)}.get(row.state, "")
    if what == "unsettled":  # an older epoch's attempt: the live epoch compensates it
        return (cmd.lease(row.workspace, f"settle --epoch {epoch}") if lease["live"]
                else cmd.acquire(row.workspace))
    if not lease["live"]:  # the epoch died with the step in flight: a new one settles it
        if row.unacked:  # committed: only the ack is missing, under a new epoch
            return f"{cmd.acquire(row.workspace)} && {cmd.step('ack', s, f'--epoch {epoch + 1}')}"
        return cmd.acquire(row.workspace)
    return {"planned": cmd.step("apply", s, f"--epoch {epoch}"),
            "fenced": cmd.step("publish", s, f"--epoch {epoch}"),
            "blob-stored": cmd.step("publish", s, f"--epoch {epoch}"),
            "compensating": cmd.step("compensate", s,
                                     f"--reason 'finish the undo' --epoch {epoch}"),
            UNACKED: cmd.step("ack", s, f"--epoch {epoch}")}.get(row.state, "")


def _step_json(cmd: _Commands, row: StepRow, what: str,
               lease: dict[str, Any] | None) -> dict[str, Any]:
    return {"step": row.step_id, "what": what, "state": row.state, "attempt": row.attempt,
            "epoch": row.epoch, "run": row.run, "workspace": row.workspace,
            "last_seq": row.last_seq, "next": _step_next(cmd, row, what, lease) or None}


def _waiting(ledger: Ledger) -> list[StepRow]:
    """Every step waiting for a command: in flight, or published and not acked."""
    rows: list[StepRow] = []
    for state in sorted(IN_FLIGHT | {UNACKED}):
        rows.extend(ledger.steps(state))
    return sorted(rows, key=lambda r: r.step_id)


def _workspace_json(cmd: _Commands, ledger: Ledger, row: WsRow, waiting: list[StepRow],
                    now: int) -> dict[str, Any]:
    lease = _lease_json(row, now)
    older = set(ledger.workspaces.unsettled(row.name, row.epoch)) if row.epoch else set()
    steps = []
    for r in waiting:
        if r.workspace != row.name:
            continue
        what = ("unsettled" if r.step_id in older or (r.in_flight and r.epoch < row.epoch)
                else "unacked" if r.unacked else "in-flight")
        steps.append(_step_json(cmd, r, what, lease))
    nxt: list[str] = []
    # what needs an operator before any step can go on: the ledger is not where it was
    # when the workspace was registered (a copied or moved project)
    moved = ledger.workspaces.ledger_moved(row.name)
    attention = [] if moved is None else [{"type": type(moved).__name__, "case": moved.case,
                                           "message": said_at_a_shell(moved),
                                           "next": moved.command}]
    nxt.extend(a["next"] for a in attention)
    if any(s["what"] == "unsettled" for s in steps) and lease["live"]:
        nxt.append(cmd.lease(row.name, f"settle --epoch {row.epoch}"))
    elif steps and not lease["live"]:
        nxt.append(cmd.acquire(row.name))
    takeover = cmd.acquire(row.name, force=True) if steps and lease["live"] else None
    kept = [{"path": k.path, "kept": k.kept, "step": k.step, "attempt": k.attempt,
             "seq": k.seq, "next": f"diff {shlex.quote(os.path.join(row.root, k.path))}"
                                  f" {shlex.quote(os.path.join(row.root, k.kept))}; rm"
                                  f" {shlex.quote(os.path.join(row.root, k.kept))}"}
            for k in ledger.workspaces.kept(row.name) if k.present]
    return {"name": row.name, "root": row.root, "rev": row.rev, "lease": lease,
            "attention": attention, "steps": steps, "next": nxt, "takeover": takeover,
            "kept": kept}


def _gc_json(ledger: Ledger) -> dict[str, Any]:
    """The last collection the ledger recorded (`blob-collected` events; a run that
    collected nothing records nothing), and what every collection took."""
    last: dict[str, Any] | None = None
    blobs = size = 0
    for r in ledger.read(kind="blob-collected"):
        ev: Any = r.event
        blobs, size = blobs + 1, size + ev.size
        if last is None or last["collection"] != ev.collection:
            last = {"collection": ev.collection, "time_ns": r.time_ns, "seq": r.seq,
                    "blobs": 0, "bytes": 0}
        last.update(time_ns=r.time_ns, seq=r.seq)
        last["blobs"] += 1
        last["bytes"] += ev.size
    if last is not None:
        last = {"collection": last["collection"], "time_ns": last["time_ns"],
                "time": _iso(last["time_ns"]), "seq": last["seq"], "blobs": last["blobs"],
                "bytes": last["bytes"]}
    from ledger.gc import last_run

    ran = last_run(ledger)
    if ran is not None:
        ran = {**ran, "time": _iso(int(ran["time_ns"]))}  # type: ignore[arg-type]
    return {"recorded": last is not None, "last": last, "blobs": blobs, "bytes": size,
            "last_run": ran}


def _witness_json(ledger: Ledger, head_seq: int) -> dict[str, Any]:
    w = ledger.witness_status()
    configured = w.witness is not None or w.witnessed
    return {"configured": configured, "path": w.witness, "state": w.state,
            "anchored_seq": w.anchored_seq or None, "witnessed_seq": w.witnessed_seq,
            "head_seq": head_seq, "lag": w.lag,
            "matches": w.state == "ok" if configured else None,
            "at_head": w.witnessed_seq == head_seq if w.witnessed_seq is not None else None,
            "problem": w.problem or None}


def status_document(ctx: click.Context, ledger: Ledger, only: str | None) -> dict[str, Any]:
    """The `status --json` document (docs/cli-json.md)."""
    from ledger import locate

    head = ledger.head()
    now = ledger.clock()
    # A file by its absolute path (as init prints it); a database as `shown_location`
    # names it, its password masked (the store's location already is).
    where = os.path.abspath(ledger.path) if locate(ledger.path).local_file else ledger.path
    cmd = _Commands(ctx, where)
    rows = ledger.workspaces.list()
    if only is not None:
        shown = [ledger.workspaces.get(only)]  # UnknownWorkspace, exit 2, if it is not one
    else:
        shown = rows
    waiting = _waiting(ledger)
    workspaces = [_workspace_json(cmd, ledger, r, waiting, now) for r in shown]
    named = {r.name for r in rows}
    # Steps of no workspace (artifact-only), and of a bare lease (a LangGraph thread's):
    # their owner drives them, so only the artifact-only ones get a command.
    others = [_step_json(cmd, r, "unacked" if r.unacked else "in-flight", None)
              | ({} if not r.workspace else {"next": None})
              for r in waiting if r.workspace not in named and (only is None or not r.workspace)]
    nxt = [c for w in workspaces for c in w["next"]]
    for s in (*(s for w in workspaces for s in w["steps"]), *others):
        if s["next"] and s["next"] not in nxt:
            nxt.append(s["next"])
    from ledger.attention import attention

    # the night's story, as the UI's overview and MCP tell it (ledger/attention.py)
    items = [dict(it.as_json(), fix=f"{cmd.base} {it.fix}" if it.fix else None)
             for it in attention(ledger, limit=sys.maxsize,
                                 workspaces=None if only is None else (only,))]
    return {
        "ledger": where, "head": {"seq": head.seq, "hash": head.hash.hex()},
        "now_ns": now, "now": _iso(now),
        "workspaces": workspaces, "workspaces_not_shown": len(rows) - len(shown),
        "other_steps": others,
        "gc": _gc_json(ledger),
        "audit": {"recorded": False,
                  "note": "audit only reads: the ledger keeps no record of it"},
        "witness": _witness_json(ledger, head.seq),
        "attention": items,
        "holds": [{"scope": h.scope, "target": h.target, "reason": h.reason, "by": h.by,
                   "seq": h.seq} for h in ledger.holds()],
        "next": nxt,
    }


def _say(line: str) -> None:
    """One line of the text report, every ledger-made name in it shown safely."""
    click.echo(_shown(line))


def _runnable(command: str) -> str:
    """A NEXT command as printed: itself, or — when a name in it holds control or format
    characters, which the line shows escaped — a pointer to the exact one in --json."""
    return command if _shown(command) == command else (
        "(a name in it holds control characters, shown escaped; the exact command: --json)")


def _echo_steps(steps: list[dict[str, Any]], indent: str, with_workspace: bool = False) -> None:
    if not steps:
        return
    wide = max(len(s["step"]) for s in steps[:SHOWN])
    wide = min(max(wide, 4), 32)
    ws = ""
    if with_workspace:
        wsw = max(9, *(len(s["workspace"]) for s in steps[:SHOWN]))
        ws = f" {'WORKSPACE':<{wsw}}"
    _say(f"{indent}{'STEP':<{wide}}{ws} {'WAITS':<9} {'STATE':<18} {'ATTEMPT':>7}"
               f" {'EPOCH':>5}  NEXT")
    for s in steps[:SHOWN]:
        ws = f" {s['workspace'] or '-':<{wsw}}" if with_workspace else ""
        _say(f"{indent}{s['step']:<{wide}}{ws} {s['what']:<9} {s['state']:<18}"
                   f" {s['attempt']:>7} {s['epoch'] or '-':>5}  {_runnable(s['next']) or '-'}")
    if len(steps) > SHOWN:
        _say(f"{indent}… and {len(steps) - SHOWN} more: 'steptrail status --json' lists"
                   " them all")


def _echo(doc: dict[str, Any]) -> None:
    now = doc["now_ns"]
    _say(f"{'ledger':<9}{doc['ledger']}")
    _say(f"{'head':<9}{doc['head']['seq']}:{doc['head']['hash']}")
    w = doc["witness"]
    if not w["configured"]:
        text = "none (keep one on another volume: 'steptrail witness anchor --witness PATH')"
    else:
        held = (f"holds #{w['witnessed_seq']}, the head is #{w['head_seq']}"
                if w["witnessed_seq"] is not None else "holds no head")
        verdict = ("matches" if w["matches"] and w["at_head"]
                   else f"matches, the ledger {_n(w['lag'], 'commit')} ahead" if w["matches"]
                   else f"{w['state'].upper()}: {w['problem']}; run 'steptrail witness show'")
        text = f"{w['path'] or '(location not recorded)'}: {held}; {verdict}"
    _say(f"{'witness':<9}{text}")
    g = doc["gc"]
    if g["recorded"]:
        last = g["last"]
        total = ("" if g["blobs"] == last["blobs"]
                 else f"; {_n(g['blobs'], 'blob')}, {_n(g['bytes'], 'byte')} in all")
        ran = g.get("last_run")
        since = (f"; last ran {_ago(now - ran['time_ns'])} ago, nothing to collect"
                 if ran and ran["time_ns"] > last["time_ns"] and not ran.get("collected")
                 else "")
        _say(f"{'gc':<9}last collection {_ago(now - last['time_ns'])} ago ({last['time']}):"
                   f" {_n(last['blobs'], 'blob')}, {_n(last['bytes'], 'byte')} collected{total}"
                   f"{since}")
    elif g.get("last_run"):
        _say(f"{'gc':<9}last ran {_ago(now - g['last_run']['time_ns'])} ago"
             f" ({g['last_run']['time']}): nothing to collect so far")
    else:
        _say(f"{'gc':<9}no run recorded here; 'steptrail gc --dry-run'")
    _say(f"{'audit':<9}not recorded (audit only reads); 'steptrail audit'")
    for ws in doc["workspaces"]:
        _say("")
        _say(f"workspace {ws['name']} at {ws['root']}: rev {ws['rev']}")
        for a in ws["attention"]:
            _say(f"  ATTENTION {a['type']}: {a['message']}")
            _say(f"  next: {_runnable(a['next'])}")
        _say(f"  lease   {_lease_text(ws['lease'], now)}")
        for k in ws["kept"][:SHOWN]:
            _say(f"  KEPT    {k['kept']}: bytes step {k['step']} could not put back beside"
                 f" {k['path']} (a person raced it); compare, keep what you need, then"
                 f" remove it: {_runnable(k['next'])}")
        if len(ws["kept"]) > SHOWN:
            _say(f"  … and {len(ws['kept']) - SHOWN} more kept files: 'steptrail status"
                 " --json' lists them all")
        if not ws["steps"]:
            _say("  nothing in flight")
            continue
        _echo_steps(ws["steps"], "  ")
        said = {s["next"] for s in ws["steps"][:SHOWN]} | {a["next"] for a in ws["attention"]}
        for c in ws["next"]:
            if c not in said:  # not said in a row
                _say(f"  next: {c}")
        if ws["takeover"]:
            # not a second "next": the other branch. The rows' NEXT is what the holder
            # (alive) does; a takeover undoes what it left unfinished instead
            holder = ws["lease"]["holder"]
            flying = [s["step"] for s in ws["steps"] if s.get("what") == "in-flight"]
            undone = (f": its unfinished {', '.join(flying[:3])}"
                      f"{' …' if len(flying) > 3 else ''} will be undone, not finished"
                      if flying else "")
            _say(f"  the NEXT above is {holder}'s while it is alive; if {holder} is gone,"
                 f" take over instead{undone}: {ws['takeover']}")
    if not doc["workspaces"] and not doc["workspaces_not_shown"]:
        _say("")
        _say("no workspaces; add one with 'steptrail workspace add NAME DIR'")
    if doc["workspaces_not_shown"]:
        _say(f"({_n(doc['workspaces_not_shown'], 'other workspace')} not shown:"
                   " --workspace picks one)")
    if doc["other_steps"]:
        _say("")
        _say("steps of no workspace")
        _echo_steps(doc["other_steps"], "  ", with_workspace=any(
            s["workspace"] for s in doc["other_steps"]))
    _echo_attention(doc["attention"])
    if doc.get("holds"):
        _say("")
        _say("held (seal refuses them; gc keeps their blobs): " + ", ".join(
            f"{h['scope']} {h['target']}" + (f" ({h['reason']})" if h["reason"] else "")
            for h in doc["holds"]))


#: The kinds the workspace sections above already show, with their next command.
_SHOWN_ABOVE = frozenset({"moved", "kept", "in-flight", "unacked"})


def _echo_attention(items: list[dict[str, Any]]) -> None:
    """What else needs a look: refusals, undos, settlements (open first); the ones a
    retry made good, in one line."""
    open_ = [i for i in items if not i["resolved"] and i["kind"] not in _SHOWN_ABOVE]
    done = [i for i in items if i["resolved"]]
    if not open_ and not done:
        return
    _say("")
    _say(f"refusals, undos and settlements: {len(open_)} open"
         + (f", {len(done)} resolved" if done else ""))
    for i in open_[:SHOWN]:
        _say(f"  {i['kind'].upper():<12} {i['subject']}: {i['reason']}")
        if i["fix"]:
            _say(f"  {'':<12} next: {_runnable(i['fix'])}")
    if len(open_) > SHOWN:
        _say(f"  … and {len(open_) - SHOWN} more: 'steptrail status --json' lists them all")
    if done:
        shown = ", ".join(f"{i['subject']} ({i['kind']})" for i in done[:8])
        more = f" and {len(done) - 8} more" if len(done) > 8 else ""
        _say(f"  resolved (a later attempt committed): {shown}{more}")


@click.command("status", cls=LedgerCommand, epilog=_examples(
    "steptrail status",
    "steptrail status --workspace repo",
    "steptrail status --json | jq -r '.next[]'   # the commands to run next",
))
@workspace_option
@json_option
@click.pass_context
def status(ctx: click.Context, ws_name: str | None, as_json: bool) -> None:
    """The ledger on one screen, and what to run next. Read-only; exit 0.

    The ledger and its head; each workspace (or only --workspace's) with its root,
    revision and lease (holder, epoch, expiry, live, expired or released); the steps
    waiting for a command — in flight (planned, fenced, blob-stored, compensating),
    unsettled (in flight under an older epoch: the live one compensates them) or
    unacked (published, the ack missing) — each with the command that moves it on;
    a workspace that needs an operator first (ATTENTION: its ledger is not where it
    was when the workspace was registered — a copied or moved project), with the
    command that resolves it;
    the last garbage collection the ledger recorded (an audit only reads: nothing
    records it); the witness and whether it holds the ledger's head. Nothing is
    written: not the ledger, not its lock.
    """
    only = ws_name or ctx.obj.get("workspace") or None
    with _open(ctx, readonly=True, witness_check=False) as ledger:
        doc = status_document(ctx, ledger, only)
    if as_json:
        _emit_json(doc)
    else:
        _echo(doc)

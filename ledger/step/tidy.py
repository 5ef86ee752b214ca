"""What a step leaves beside its paths, collected once nobody can own it: a dead
stager's temporaries, an ended attempt's slots (`remove_temporaries`, `tidy`,
`remove_abandoned_temporaries`). Each file goes only once its bytes are shown held by
the ledger or by the path beside it; anything else is kept under a visible name
(`staging.remove_temporaries`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence


from ..errors import LedgerError
from ..events import PlannedWrite
from ..projections import read_workspaces
from ..projections.steps import IN_FLIGHT
from ..workspace import leftovers, placing, staging
from ..workspace.directory import WorkspaceDir
from ..workspace.names import attempt_tag
from .attempt import read_attempt
from .fence import paths_of
from .site import Site


def remove_temporaries(site: Site, wsdir: WorkspaceDir, writes: Sequence[PlannedWrite],
                        current_epoch: int, restored: Mapping[str, str] | None = None) -> None:
    """Remove the temporaries a killed stager left beside `writes`' targets: those of
    an older epoch than `wsdir`'s (its holder is dead or a zombie whose apply the
    fence refuses) and those of `wsdir`'s own epoch and attempt. Another attempt's of
    the live epoch may be a sibling's, staging now: kept; and so are the slots of
    every attempt in flight (`_slots_in_flight`), the evidence its settling rolls
    back from. Only the directories this attempt writes are looked at — where its
    earlier calls staged — so the cost follows the attempt, not the size of the
    repository. `restored`: after an undo's commit, what it recorded each path holds
    (an older epoch's worker still running may have moved that file aside since: it
    goes back, `staging.remove_temporaries`)."""
    epoch, tag = wsdir.epoch, wsdir.tag
    if not 0 < epoch <= current_epoch:
        return  # not an epoch of this workspace: nothing is known dead
    # dead: an older epoch's; this attempt's own; or an attempt's that is over (no
    # stager of an ended or committed attempt is alive: a kill after its commit). The
    # attempts in flight are read when such a temporary is found, after its directory
    # was listed: an attempt that staged it was planned before, so it is in the read
    # unless it is over (a read made once, earlier, would miss one admitted since).
    staging.remove_temporaries(
        wsdir, {w.path.rpartition("/")[0] for w in writes} | wsdir.also_dirs,
        lambda e, t: e < epoch or (e == epoch and t == tag)
        or (e <= current_epoch and t not in in_flight_tags(site, wsdir.name)),
        lambda: slots_in_flight(site, wsdir.name), site.held, restored)


def in_flight_tags(site: Site, workspace: str) -> frozenset[str]:
    """The temporaries' tags (`attempt_tag`) of the workspace's attempts in flight."""
    with site.core.storage.read() as view:
        return frozenset(attempt_tag(s, a) for s, a in view.steps_in_flight(workspace))


def tidy(site: Site, step: str) -> None:
    """Remove what the step's latest attempt left in its slots, once it is over (a kill
    after its commit, before the displaced files went): a re-run of a committed step calls
    it. (`Workspaces.tidy` says what it promises.)"""
    row = site.core.steps.get(step)
    if row.state in IN_FLIGHT or not row.workspace:
        return
    ev = read_attempt(site.core.log, step, row.attempt)
    if ev.planned is None or not ev.planned.workspace:
        return
    ws = site.places.get(ev.planned.workspace)
    epochs = [(ev.planned.epoch, "xyt")]
    if ev.compensating is not None:
        epochs.append((ev.compensating[1].epoch, "ut"))
    for epoch, roles in epochs:
        wsdir = site.places.wsdir(ws, step, row.attempt, epoch)
        for w in ev.planned.writes:
            placing.discard_slots(wsdir, w.path, roles, site.held)


def slots_in_flight(site: Site, workspace: str,
                     steps: Sequence[tuple[str, int]] | None = None
                     ) -> frozenset[tuple[str, str]]:
    """(directory, name) of every slot (`WorkspaceDir.slot`) in which an attempt in
    flight in the workspace left what a crashed write displaced (`landed`), and every
    slot of an undo in flight. A slot holding only a staged copy is not kept."""
    if steps is None:
        with site.core.storage.read() as view:
            steps = view.steps_in_flight(workspace)
    row = site.places.get(workspace)
    out: set[tuple[str, str]] = set()
    for step, attempt in steps:
        ev = read_attempt(site.core.log, step, attempt)
        if ev.planned is None:
            continue
        epochs = [(ev.planned.epoch, "xy")]
        if ev.compensating is not None:
            epochs.append((ev.compensating[1].epoch, "u"))
        for epoch, roles in epochs:
            wsdir = site.places.wsdir(row, step, attempt, epoch)
            wsdir.planned = paths_of(ev.planned)
            for w in ev.planned.writes:
                d = w.path.rpartition("/")[0]
                if roles == "u":
                    out.add((d, wsdir.slot(w.path, "u")))
                    continue
                with contextlib.suppress(LedgerError, OSError):
                    found = leftovers.landed(wsdir, w.path, w.pre_hash, w.post_hash,
                                             mode=w.mode)
                    if found.landed and found.slot is not None:
                        # and the staged copy beside it: a landing without the
                        # exchange call cut between its moves links it in next
                        out.update({(d, found.slot), (d, wsdir.slot(w.path, "x"))})
    return frozenset(out)


def remove_abandoned_temporaries(site: Site, now: int) -> int:
    """Collect, in every workspace, the temporaries no live stager can own: those of an
    epoch older than the live one (any epoch once the lease has lapsed), and those of
    attempts that are over (a kill after the commit, before the displaced files went; a
    takeover after it). (`Workspaces.remove_abandoned_temporaries` says what it
    promises.)"""
    removed = 0
    known: dict[str, set[str]] = {}
    for (w, p), state in read_workspaces(site.core.log).paths.items():
        if state is not None:
            known.setdefault(w, set()).add(p.rpartition("/")[0])
    for row in site.places.list():
        if row.epoch == 0 or site.places.ledger_moved(row.name) is not None:
            continue  # (a copied ledger's account does not describe that directory)
        with site.core.storage.read() as view:
            steps = view.steps_in_flight(row.name)
        dirs: set[str] = set(known.get(row.name, ()))
        for step, attempt in steps:
            planned = read_attempt(site.core.log, step, attempt).planned
            if planned is not None:
                dirs.update(w.path.rpartition("/")[0] for w in planned.writes)
        if not dirs:
            continue
        flying = frozenset(attempt_tag(s, a) for s, a in steps)
        newest_dead = row.epoch - 1 if row.live_epoch(now) is not None else row.epoch

        def over(tag: str, name: str = row.name, flying: frozenset[str] = flying) -> bool:
            # A temporary of the live epoch is dead only if its attempt is over, judged
            # after the file was seen: an attempt that staged a file was planned before
            # it staged it, so it is in a read made after the listing unless it ended.
            # (The read before the listing misses an attempt admitted since: its staged
            # file was taken for a leftover, and its apply refused.)
            if tag in flying:
                return False
            with site.core.storage.read() as view:
                now_flying = view.steps_in_flight(name)
            return tag not in {attempt_tag(s, a) for s, a in now_flying}

        try:
            removed += staging.remove_temporaries(
                site.places.wsdir(row), dirs,
                lambda e, t, newest_dead=newest_dead, top=row.epoch, over=over:
                e <= newest_dead or (e <= top and over(t)),
                lambda row=row: slots_in_flight(site, row.name),  # read now, after the listing
                site.held)
        except LedgerError:
            continue  # a workspace moved or gone: nothing of it to collect here
    return removed

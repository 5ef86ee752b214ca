"""Rewind: a workspace put back as it was at an earlier point of its history, as a fenced
step (docs/time-travel.md "Rewind").

"As of S" (a seq, or a step: the seq of its latest attempt's `fenced`, i.e. just after its
writes) is what the ledger knew each path held then: the path's newest `fenced` or
`compensated` record at or before S. A path with none is absent as of S when its first
record after S created it (a step's write, or an observation's, with no pre-image); if
that first record is a baseline observation — the ledger learned of a file that was
there before — its state as of S is unknown, and the rewind leaves it as it is and says
so. A blob the collector took is unreachable the same way.

The rewind itself is one step (`rewind-<workspace>-to<S>-<token>`, run ``rewind``), planned
against what the ledger holds now — never against the disk: a file whose bytes the ledger
does not hold (an edit nobody observed) fails the fence and the whole step is refused,
nothing overwritten (observe first, then rewind). It is recorded, undoable and shown like
any step; what it replaced stays in the ledger.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from dataclasses import dataclass
from typing import Any

from .. import holders
from ..diffs import DIFF_INPUT_MAX, unified_diff
from ..errors import InvalidInput, LeaseHeld, LedgerError, StaleEpoch, UnknownStep
from ..events import Compensated, Fenced, check_relpath
from ..workspace import names, staging
from ..workspace.boundary import is_git_name
from .undo import compensate
from ..projections import read_workspaces
from ..retention import released_versions, why_unreachable
from .observe import RUN as OBSERVED_RUN, observation_attempts
from .site import Site
from .tidy import in_flight_tags, slots_in_flight
from .values import ApplyResult, Lease, StepPlan, Write

RUN = "rewind"


@dataclass(frozen=True)
class RewindChange:
    """One path a rewind changes: from what the ledger holds now (`now`, None: absent) to
    what it held as of the target (`then`, None: absent); `diff` a bounded unified diff
    (text), '' when not computed.

    >>> from ledger import RewindChange
    >>> RewindChange("app.py", now="a" * 64, then=None).kind
    'delete'
    """

    path: str
    now: str | None
    then: str | None
    diff: str = ""
    #: the permission bits it had then, when only they differ from now's (`kind` "mode")
    mode: int | None = None

    @property
    def kind(self) -> str:
        if self.then is not None and self.then == self.now:
            return "mode"
        return "delete" if self.then is None else "create" if self.now is None else "restore"


@dataclass(frozen=True)
class Rewind:
    """What a rewind would do (`preview`) or did: the target (`to_seq`, `to_step`), the
    `changes`, the paths it cannot put back and why (`unreachable`), the paths whose
    bytes on disk the ledger does not hold now (`unobserved`: the step would be refused
    on them; observe first), and, once run, its `step` and the apply's `verdict`. Where
    a file and a directory traded places at one name, what stands there now is deleted
    first by a step of its own (`clears`, `cleared`): the rewind is then two steps.

    >>> from pathlib import Path
    >>> from ledger import Ledger, run_fenced_step
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent", ttl_s=600)
    >>> for i in (1, 2):
    ...     _ = run_fenced_step(ledger, "repo", f"s{i}", lambda read, i=i: [
    ...         read.read("app.py").write(f"v{i}\\n".encode())], epoch=lease.epoch)
    >>> back = ledger.workspaces.rewind("repo", "s1", epoch=lease.epoch)
    >>> back.verdict, Path("repo/app.py").read_text()
    ('applied', 'v1\\n')
    >>> ledger.close()
    """

    workspace: str
    to_seq: int
    to_step: str | None
    changes: tuple[RewindChange, ...]
    unreachable: tuple[tuple[str, str], ...]
    unobserved: tuple[str, ...]
    preview: bool
    step: str | None = None
    verdict: str = ""
    detail: str = ""
    #: the paths the rewind deletes first, in a step of their own (`cleared`): what
    #: stands where a file and a directory traded places at one name (a file ``a`` in
    #: the way of ``a/b``, or the files under a directory ``a`` in the way of a file
    #: ``a``) — one step cannot do both, its fence checks every path before it writes
    clears: tuple[str, ...] = ()
    #: once run: the step that deleted `clears` (undone again when the rest is refused)
    cleared: str | None = None

    @property
    def applied(self) -> bool:
        return self.verdict == "applied"


def _target_seq(site: Site, to: str | int) -> tuple[int, str | None]:
    if isinstance(to, int) and not isinstance(to, bool):
        head = site.core.log.head().seq
        if not 0 <= to <= head:
            raise InvalidInput(f"seq {to} is not in this ledger (its head is {head})")
        return to, None
    if not isinstance(to, str) or not to:
        raise InvalidInput(f"rewind to {to!r}: give a step id or a seq number")
    fenced = [r.seq for r in site.core.log.read(step=to, kind="fenced")]
    if not fenced:
        if site.core.steps.find(to) is None:
            raise UnknownStep(to)
        raise InvalidInput(f"step {to!r} wrote nothing to a workspace: rewind to a step that"
                           " did, or to a seq")
    return fenced[-1], to


def state_as_of(site: Site, name: str, seq: int
                ) -> tuple[dict[str, str | None], dict[str, str]]:
    """(path -> its content's digest as of `seq`, None absent; path -> why its state as
    of `seq` is unknown) for every path the workspace's history names."""
    # a path first recorded by an observation was found on disk, not made by a step: it
    # may have been there long before (not captured then, or never looked at) — its state
    # as of an earlier point is unknown, never "absent" (no person's file is deleted on
    # an inference)
    observations = observation_attempts(site.core.log, name)
    before: dict[str, str | None] = {}
    first_after: dict[str, tuple[str | None, bool]] = {}
    for r in site.core.log.read(workspace=name):
        event = r.event
        observed = False
        if isinstance(event, Fenced):
            pairs = [(w.path, w.pre_hash, w.post_hash) for w in event.writes]
            observed = event.run == OBSERVED_RUN and (r.step, event.attempt) in observations
        elif isinstance(event, Compensated):
            pairs = [(x.path, None, x.digest) for x in event.restored if x.outcome != "conflict"]
        else:
            continue
        for path, pre, post in pairs:
            if r.seq <= seq:
                before[path] = post
            elif path not in before and path not in first_after:
                first_after[path] = (pre, observed)
    unknown: dict[str, str] = {}
    for path, (pre, observed) in first_after.items():
        if path in before:
            continue
        if pre is None and not observed:
            before[path] = None  # created after the target: absent then
        else:
            unknown[path] = "the ledger did not know it yet (it was first recorded later)"
    return before, unknown


def modes_as_of(site: Site, name: str, seq: int) -> dict[str, int | None]:
    """The permission bits each path had as of `seq`, as the ledger recorded them."""
    out: dict[str, int | None] = {}
    for r in site.core.log.read(workspace=name):
        if r.seq > seq:
            break
        event = r.event
        if isinstance(event, Fenced):
            for w in event.writes:
                out[w.path] = w.post_mode
        elif isinstance(event, Compensated):
            for x in event.restored:
                if x.outcome != "conflict":
                    out[x.path] = x.mode
    return out


def _normal_paths(site: Site, name: str, paths: Any) -> list[str] | None:
    """`paths` as relative paths inside the workspace (an absolute path inside its root,
    ``./a``, ``a/`` taken as the same path); InvalidInput for anything else."""
    if paths is None:
        return None
    if isinstance(paths, str | bytes) or not all(isinstance(p, str) for p in paths):
        raise InvalidInput("paths must be a list of paths (a path, or a directory and what"
                           " is under it), not a single string")
    root = site.places.registration(name).root.rstrip("/")
    out = []
    for raw in paths:
        p = raw
        if p.startswith("/"):
            if p.rstrip("/") == root or not p.startswith(root + "/"):
                raise InvalidInput(f"path {raw!r} is not inside workspace {name!r} ({root})")
            p = p[len(root) + 1:]
        while p.startswith("./"):
            p = p[2:]
        p = p.rstrip("/")
        if not p or p == ".":
            raise InvalidInput(f"path {raw!r} names no file: give a path inside the"
                               " workspace, or no path for all of it")
        check_relpath(p)  # ('..', a backslash, a control character: refused)
        out.append(p)
    return out


def plan_rewind(site: Site, name: str, to: str | int, *, paths: Any = None,
                diffs: bool = True) -> Rewind:
    """What rewinding workspace `name` to `to` would change (nothing is written)."""
    seq, step = _target_seq(site, to)
    head_seq = site.core.log.head().seq
    site.places.get(name)
    chosen_paths = _normal_paths(site, name, paths)
    then, unknown = state_as_of(site, name, seq)
    now = {p: st[1] for (w, p), st in read_workspaces(site.core.log).paths.items()
           if w == name and st is not None}

    def chosen(path: str) -> bool:
        if is_git_name(path.split("/", 1)[0]):
            return False  # .git is never rewound, even where a workspace lets steps in
        return chosen_paths is None or any(path == p or path.startswith(p + "/")
                                           for p in chosen_paths)

    changes: list[RewindChange] = []
    unreachable = [(p, why) for p, why in sorted(unknown.items()) if chosen(p)
                   and now.get(p) is not None]
    unobserved: list[str] = []
    confined = site.places.confined(name)
    wanted = {}
    released: dict[tuple[str, str, str], int] | None = None
    for path in sorted(set(then) | set(now)):
        if not chosen(path) or path in unknown:
            continue
        target, current = then.get(path), now.get(path)
        if target == current:
            continue
        if target is not None and site.core.blob_size(target) is None:
            if released is None:
                released = released_versions(site.core.log)
            unreachable.append((path, why_unreachable(site.core.log, target, workspace=name,
                                                      path=path, released=released)))
            continue
        wanted[path] = (current, target)
    # a file and a directory that traded places at one name (a -> a/b, or back): one
    # step cannot do both — its fence checks every path before it writes —, so what
    # stands in the way (the file `a` above `a/b`; the files under a directory `a`
    # where a file `a` goes back) is deleted first, by a step of its own, when the
    # rewind deletes it anyway; otherwise the path is said, not rewound
    now_files = {p for p, d in now.items() if d is not None}
    clears: set[str] = set()
    below: dict[str, list[str]] = {}  # a file going back -> the files now under it
    for path, (_cur, tgt) in sorted(wanted.items()):
        parents = {"/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)}
        obstacles = sorted(parents & now_files)
        under = [q for q in now_files if q.startswith(path + "/")] if tgt is not None else []
        if not obstacles and not under:
            continue
        if all(q in wanted and wanted[q][1] is None for q in (*obstacles, *under)):
            clears.update(obstacles, under)
            if under:
                below[path] = under
            continue
        unreachable.append((path, "a file and a directory traded places at this name, and"
                                  " what stands there now is not rewound with it (it is"
                                  " unknown then, or outside --paths): not rewound"))
        del wanted[path]
    creates = any(c is None and t is not None for c, t in wanted.values())
    ledger_dirs = known_dirs(site, name) if creates else set()
    own_tags = clear_tags(site, name) if creates else frozenset()
    for path, (current, target) in wanted.items():
        diff = _diff(site, path, current, target) if diffs else ""
        changes.append(RewindChange(path, current, target, diff))
        if any(path.startswith(q + "/") for q in clears):
            continue  # under a file deleted first: that file is checked as its own change
        if path in below or (current is None and target is not None):
            # nothing there, or a directory holding only the files deleted first (and
            # what a killed rewind left: its temporaries, emptied directories)
            if not _holds_only(confined, path, {q: now[q] for q in below.get(path, ())},
                               path in ledger_dirs, own_tags):
                unobserved.append(path)
        elif _disk_hash(confined, path) != current:
            unobserved.append(path)
    # the same bytes with other permission bits (a chmod an observation recorded): the
    # bytes put back with the mode they had then
    then_modes, now_modes = modes_as_of(site, name, seq), modes_as_of(site, name, head_seq)
    for path in sorted(set(then) & set(now)):
        old, new = then_modes.get(path), now_modes.get(path)
        if (not chosen(path) or path in unknown or path in wanted or then[path] is None
                or then[path] != now[path] or old is None or new is None
                or old & 0o777 == new & 0o777):
            continue
        if site.core.blob_size(then[path]) is None:  # type: ignore[arg-type]
            continue
        changes.append(RewindChange(path, now[path], then[path], "", mode=old & 0o777))
        if _disk_hash(confined, path) != now[path]:
            unobserved.append(path)
    return Rewind(workspace=name, to_seq=seq, to_step=step, changes=tuple(changes),
                  unreachable=tuple(sorted(unreachable)), unobserved=tuple(unobserved),
                  preview=True, clears=tuple(sorted(clears)))


def _bytes(site: Site, digest: str | None) -> bytes | None:
    if digest is None:
        return None
    size = site.core.blob_size(digest)
    if size is None or size[0] > DIFF_INPUT_MAX:
        return None
    return b"".join(site.core.blob_chunks(digest))


def _diff(site: Site, path: str, now: str | None, then: str | None) -> str:
    size_now, size_then = (site.core.blob_size(d) if d else (0, True) for d in (now, then))
    if (size_now and size_now[0] > DIFF_INPUT_MAX) or (size_then and size_then[0] > DIFF_INPUT_MAX):
        return f"(no diff: {path} is larger than {DIFF_INPUT_MAX} bytes)"
    return unified_diff(_bytes(site, now), _bytes(site, then), path,
                        before_label="now", after_label="rewound")


def _disk_hash(confined: Any, path: str) -> str | None:
    """The sha256 of what `path` holds on disk now (None: absent; a marker when something
    that is not a regular file stands there), read as every step reads it."""
    try:
        return confined.wsdir.hash(path)  # type: ignore[no-any-return]
    except LedgerError:
        return "(not a regular file)"  # a directory, a symlink, or a path through one


def known_dirs(site: Site, name: str) -> set[str]:
    """Every directory above a path the workspace's history names (written, deleted,
    observed): the directories the ledger knew files in."""
    out: set[str] = set()
    for (w, p) in read_workspaces(site.core.log).paths:
        if w == name:
            out.update(p.rsplit("/", i)[0] for i in range(1, p.count("/") + 1))
    return out


def clear_tags(site: Site, name: str) -> frozenset[str]:
    """The tags (`names.attempt_tag`) of the workspace's rewinds' first steps (the
    ``-clear`` steps): the only temporaries a rewind treats as its own where a file goes
    back — what one killed after that step's commit left, before its displaced files
    were removed. A file of another name shape, or another tag, is a person's."""
    return frozenset(names.attempt_tag(r.step, r.event.attempt)
                     for r in site.core.log.read(kind="planned", workspace=name)
                     if r.event.run == RUN and r.step.endswith("-clear"))


def _holds_only(confined: Any, path: str, known: dict[str, str | None],
                emptied: bool, tags: frozenset[str] = frozenset()) -> bool:
    """Whether the directory at `path` holds nothing but the files of `known` with the
    bytes the ledger knows (and directories): what the rewind deletes before a file goes
    back at `path`. True too when nothing is there; a symlink, a file the ledger does
    not know, other bytes or an unreadable directory: False (the rewind would refuse).
    A directory the ledger never knew a file in (`emptied` False: a person's own, made
    by hand) is not the rewind's to remove: False too."""
    stack = [path]
    while stack:
        rel = stack.pop()
        try:
            fd = confined.wsdir.open_dir_fd(rel)
        except (LedgerError, OSError):
            return rel == path and _disk_hash(confined, path) is None
        if fd is None:
            return rel == path
        if rel == path and not emptied:
            os.close(fd)
            return False
        try:
            entries = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                       for e in os.scandir(fd)]
        except OSError:
            return False
        finally:
            os.close(fd)
        for leaf, is_dir, is_file in entries:
            child = f"{rel}/{leaf}"
            if is_dir:
                stack.append(child)
            elif is_file and (names.temp_stamp(leaf) or (0, ""))[1] in tags:
                continue  # a killed rewind's first step's: removed (or kept visibly) first
            elif not is_file or child not in known or _disk_hash(confined, child) != known[child]:
                return False
    return True


def _remove_emptied(site: Site, name: str, epoch: int, path: str) -> None:
    """Clear the directory at `path` where a file goes back: the temporaries a rewind's
    first step left in it (`clear_tags`: killed after its commit, before the files it
    displaced were removed; each removed only once its bytes are shown held,
    `staging.remove_temporaries`), then the directories, each only while it is empty.
    Anything else stays (the step's fence then refuses the path)."""
    wsdir = site.places.wsdir(site.places.get(name))
    dirs, only = wsdir.dirs_below(path)
    if not dirs:
        return
    if not only:
        tags = clear_tags(site, name)
        with contextlib.suppress(LedgerError, OSError):
            staging.remove_temporaries(
                wsdir, set(dirs),
                lambda e, t: t in tags and e <= epoch and t not in in_flight_tags(site, name),
                lambda: slots_in_flight(site, name), site.held)
    wsdir.remove_empty_dirs(path)


def rewind(site: Site, name: str, to: str | int, epoch: int, *,
           paths: list[str] | None = None) -> Rewind:
    """Rewind workspace `name` to `to` under the live `epoch`: one fenced step (see the
    module), or two where a file and a directory traded places (`Rewind.clears`: what
    stands in the way is deleted first; when the rest is then refused, that first step
    is undone). Nothing to change: nothing is written."""
    planned = plan_rewind(site, name, to, paths=paths, diffs=False)
    if not planned.changes:
        return Rewind(**{**planned.__dict__, "preview": False, "verdict": "nothing"})
    now = {p: st for (w, p), st in read_workspaces(site.core.log).paths.items()
           if w == name and st is not None}
    modes = modes_as_of(site, name, planned.to_seq)
    step = f"rewind-{name[:100]}-to{planned.to_seq}-{secrets.token_hex(4)}"
    first = [ch for ch in planned.changes if ch.path in planned.clears]
    rest = [ch for ch in planned.changes if ch.path not in planned.clears]
    cleared = None
    if first and planned.unobserved:  # the fence would refuse: nothing is written
        return Rewind(**{**planned.__dict__, "preview": False, "verdict": "rejected:pre_hash",
                         "detail": f"{planned.unobserved[0]} holds what the ledger does not"
                                   " know (an edit nobody observed)"})
    if first:
        cleared = step + "-clear"
        got = _one_step(site, name, epoch, cleared, first, now, modes)
        if got.verdict != "applied":
            return Rewind(**{**planned.__dict__, "preview": False, "step": cleared,
                             "cleared": cleared, "verdict": got.verdict,
                             "detail": got.detail})
    # a file going back where a directory stands that nothing fills any more (emptied
    # by the step just run, or by a killed rewind's): the directories go, only empty
    # (only a directory the ledger knew files in: a person's own, made by hand, stays
    # and the step's fence refuses the path, as the preview said)
    emptied = known_dirs(site, name) if any(
        ch.then is not None and ch.now is None for ch in rest) else set()
    for ch in rest:
        if ch.then is not None and ch.now is None and ch.path in emptied:
            _remove_emptied(site, name, epoch, ch.path)
    got = _one_step(site, name, epoch, step, rest, now, modes)
    if cleared is not None and got.verdict != "applied":
        with contextlib.suppress(LedgerError):
            compensate(site, cleared, epoch=epoch,
                       reason=f"rewind {step} refused: {got.detail[:500]}")
    return Rewind(**{**planned.__dict__, "preview": False, "step": step, "cleared": cleared,
                     "verdict": got.verdict, "detail": got.detail})


def _one_step(site: Site, name: str, epoch: int, step: str, changes: list[RewindChange],
              now: dict[str, Any], modes: dict[str, int | None]) -> ApplyResult:
    """Run `changes` as the fenced step `step` (run ``rewind``) under `epoch`: admitted
    against what the ledger holds (`now`), applied and committed; refused by what it met
    on disk, the attempt is undone and the refusal returned."""
    spools = []
    writes = []
    try:
        for ch in changes:
            content: Any = None
            if ch.then is not None:
                spool = tempfile.SpooledTemporaryFile(max_size=1 << 20)
                spools.append(spool)
                for chunk in site.core.blob_chunks(ch.then):
                    spool.write(chunk)
                spool.seek(0)
                content = spool
            rev = now[ch.path][0] if ch.path in now else 0
            mode = (ch.mode if ch.mode is not None else
                    modes.get(ch.path) if ch.now is None and ch.then is not None else None)
            writes.append(Write(ch.path, content, ch.now, base_rev=rev,
                                mode=None if mode is None else mode & 0o777))
        from . import admit, apply

        refused = admit.admit(site, name, epoch, [StepPlan(step, writes, run=RUN)])
        if refused[0] is not None:
            return refused[0]
        try:
            return apply.apply(site, step, epoch=epoch, commit=True)
        except StaleEpoch:
            raise
        except LedgerError as exc:
            # refused by what it met on disk (a symlink or a file where a directory
            # goes): the attempt ends, nothing of it stays; said as a refusal
            with contextlib.suppress(LedgerError):
                compensate(site, step, epoch=epoch, reason=f"rewind refused: {exc}")
            return ApplyResult(verdict="rejected:pre_hash", step=step, attempt=1,
                               detail=str(exc)[:4000])
    finally:
        for spool in spools:
            spool.close()


def holder_gone(holder: str) -> bool:
    """Whether `holder` names a lease steptrail took for one call of its own — an
    observation, a rewind, a fork (`ledger.holders.holder`) — in a process of this
    machine (this kernel boot and pid namespace) that is gone, a zombie, or another
    process now: a kill left it live until its TTL. Any other holder is not."""
    return holders.is_gone(holder, holders.ONE_CALL)


def own_lease(workspaces: Any, name: str, holder: str, ttl_s: float) -> Lease:
    """`workspaces.acquire(name, holder, ttl_s)` for the lease a rewind or a fork takes
    for itself. A live lease that steptrail took for one call of its own in a process
    that is gone (`holder_gone`: killed midway) is taken over — a new epoch, which settles
    what that call left in flight — instead of being waited out until its TTL, as the MCP
    server takes over a gone server's; any other live lease is LeaseHeld."""
    try:
        return workspaces.acquire(name, holder, ttl_s)  # type: ignore[no-any-return]
    except LeaseHeld as held:
        if not holder_gone(held.holder):
            raise
    return workspaces.acquire(name, holder, ttl_s, force=True)  # type: ignore[no-any-return]


__all__ = ["Rewind", "RewindChange", "holder_gone", "modes_as_of", "own_lease",
           "plan_rewind", "rewind", "state_as_of"]

"""Retention: a policy file that lets the scheduled `gc` release old versions of the files
in a workspace's history (docs/time-travel.md "Retention").

Every step's pre- and post-images stay in the blob store for as long as a manifest or a
compensation record names them: a workspace that an agent edits all day keeps every
version of every file. A policy says which versions to keep::

    # .steptrail/retention.toml
    [history]
    keep_days = 30        # every version recorded in the last 30 days
    keep_versions = 10    # and the last 10 versions of each path, however old
    # workspaces = ["repo"]   # default: every workspace

A version is kept when either rule keeps it; the current version of each path is always
kept, and so is every version of a held step or run (`steptrail hold`) and of a step not
yet settled, and the version an undo may still put back (the one before a step in flight
or inside its compensation window, where that step pinned none: an observation's).
`apply` records the versions it lets go of as `history-released` events
(the step, path and digest of each); from then on those records hold nothing and `gc`
collects their bytes where nothing else holds them (a kept version of another path with
the same content, an artifact, a pin, a hold placed later). The events that recorded the
versions are never removed or rewritten — the chain stays whole, `history` and `export`
still show every step — and restore, rewind and fork name each version they can no
longer reach and why (`why_unreachable`).

Archiving the events too (as `seal` does for runs that write no workspace) is not done:
a workspace's revisions are folded from its steps' events, so removing them would need a
stored fold in their place; the bytes are what grows (a step's events are a few hundred
bytes, its images the files themselves), and those this releases.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import InvalidInput
from .events import ITEMS_MAX, Compensated, Fenced, HistoryReleased, ReleasedVersion

#: A `ledger.Ledger` (not imported: the rewind and the fork read `why_unreachable`, and
#: the ledger imports them).
Ledger = Any

#: The policy file `gc` reads beside a SQLite ledger (in its ``.steptrail`` directory).
POLICY_NAME: Final = "retention.toml"
_DAY_NS: Final = 86_400 * 10**9
_KEYS: Final = {"keep_days", "keep_versions", "workspaces"}
#: Step states whose versions may be released (the step's attempt ended).
_SETTLED: Final = frozenset({"acked", "compensated", "rejected", "sealed"})


@dataclass(frozen=True)
class Policy:
    """What to keep: versions newer than `keep_days` (0: no age rule) and the last
    `keep_versions` of each path (0: no count rule), in `workspaces` (empty: every one);
    `source` the file it was read from."""

    keep_days: float = 0.0
    keep_versions: int = 0
    workspaces: tuple[str, ...] = ()
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "keep_days": self.keep_days,
                "keep_versions": self.keep_versions, "workspaces": list(self.workspaces)}


def policy_path(ledger: Ledger) -> str | None:
    """Where `gc` looks for the policy by default: ``retention.toml`` beside a SQLite
    ledger's file; None for a ledger in a database (give the file explicitly)."""
    if ledger.blobs.root is None:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(ledger.path)), POLICY_NAME)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """The policy in the TOML file at `path` (see the module) — a small regular file only
    its reader, root or its directory's owner can write (`_read_trusted`); InvalidInput
    naming the problem and the fix for anything else."""
    where = os.fspath(path)
    fix = ("write it as docs/time-travel.md \"Retention\" shows: a [history] table with"
           " keep_days and/or keep_versions")
    try:
        doc = tomllib.loads(_read_trusted(where).decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput(f"retention policy {where} is not UTF-8 text; {fix}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"retention policy {where} is not TOML ({exc}); {fix}") from None
    extra = sorted(set(doc) - {"history"})
    if extra or not isinstance(doc.get("history"), dict):
        what = f"unknown table {extra[0]!r}" if extra else "no [history] table"
        raise InvalidInput(f"retention policy {where}: {what}; {fix}")
    table = doc["history"]
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise InvalidInput(f"retention policy {where}: unknown key {unknown[0]!r} in [history]"
                           f" (known: {', '.join(sorted(_KEYS))})")
    days = table.get("keep_days", 0)
    if isinstance(days, bool) or not isinstance(days, int | float) or days < 0 \
            or not math.isfinite(days) or days > 1_000_000:
        raise InvalidInput(f"retention policy {where}: keep_days = {days!r}; give a number of"
                           " days (e.g. 30), or leave it out")
    versions = table.get("keep_versions", 0)
    if isinstance(versions, bool) or not isinstance(versions, int) or not 0 <= versions <= 10**9:
        raise InvalidInput(f"retention policy {where}: keep_versions = {versions!r}; give a"
                           " whole number of versions (e.g. 10), or leave it out")
    names = table.get("workspaces", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InvalidInput(f"retention policy {where}: workspaces must be a list of workspace"
                           " names (e.g. [\"repo\"]), or left out for every workspace")
    if not days and versions <= 1:
        raise InvalidInput(f"retention policy {where} keeps nothing but the current files;"
                           " give keep_days, keep_versions of 2 or more, or both")
    return Policy(float(days), int(versions), tuple(names), os.path.abspath(where))


#: A policy file is a few lines: anything larger is not one (nor read whole).
_POLICY_BYTES_MAX: Final = 64 * 1024


def _read_trusted(where: str) -> bytes:
    """The bytes of the policy file `where`, once it is shown to be one its reader may
    trust: a regular file (a FIFO or a device would block or never end), small, and —
    itself and a symlink that names it — owned by this user, root or the owner of the
    directory it is in, and writable by no one else: a policy lets gc release history,
    so one that another user of a shared directory (``/tmp``) could have planted or
    edited is refused, naming the fix. InvalidInput otherwise."""
    def refuse(why: str) -> InvalidInput:
        return InvalidInput(f"retention policy {where} {why}; gc follows no policy another"
                            " user could have written: fix its owner or mode (chown, chmod"
                            " go-w), or give another file with --retention, or"
                            " --no-retention")

    def check(st: os.stat_result, path: str) -> None:
        parent = os.path.dirname(os.path.abspath(path)) or "/"
        try:
            dir_owner = os.stat(parent).st_uid
        except OSError:
            dir_owner = -1
        if st.st_uid not in (os.geteuid(), 0, dir_owner):
            raise refuse(f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
                         f" nor by the owner of {parent}")
        if st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode):
            raise refuse("is writable by every user")

    try:
        link = os.lstat(where)
        if stat.S_ISLNK(link.st_mode):
            check(link, where)
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInput(f"retention policy {where}: no such file; give an existing"
                           " file, or leave --retention out") from None
    except OSError as exc:
        raise InvalidInput(f"retention policy {where} cannot be read ({exc.strerror})")\
            from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"retention policy {where} is not a regular file; give the"
                               " TOML file itself (or --no-retention)")
        check(st, os.path.realpath(where))
        if st.st_size > _POLICY_BYTES_MAX:
            raise InvalidInput(f"retention policy {where} is {st.st_size} bytes, not a"
                               f" policy (at most {_POLICY_BYTES_MAX}); give the TOML file")
        data = bytearray()
        while chunk := os.read(fd, _POLICY_BYTES_MAX + 1 - len(data)):
            data += chunk
            if len(data) > _POLICY_BYTES_MAX:
                raise InvalidInput(f"retention policy {where} grew past"
                                   f" {_POLICY_BYTES_MAX} bytes while read; give the TOML file")
        return bytes(data)
    except OSError as exc:
        raise InvalidInput(f"retention policy {where} cannot be read ({exc.strerror})")\
            from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Version:
    """One version of a file in a workspace's history: what `step` left at `path` (its
    write, or what its compensation put back), recorded at `seq`/`time_ns`; `digest`
    None: the file was deleted."""

    path: str
    step: str
    digest: str | None
    seq: int
    time_ns: int


@dataclass
class WorkspaceRetention:
    """What a policy does to one workspace: `versions` counted (with content), `kept`,
    `released` now, `already` released by an earlier run; `release` the versions."""

    workspace: str
    versions: int = 0
    kept: int = 0
    already: int = 0
    release: list[Version] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "versions": self.versions, "kept": self.kept,
                "released": len(self.release), "already_released": self.already}


@dataclass
class RetentionReport:
    """A policy applied (or, `dry_run`, worked out): per workspace, and the bytes the
    released versions alone held (`releasable_bytes`: what gc may now collect)."""

    policy: Policy
    cutoff_ns: int
    dry_run: bool
    workspaces: list[WorkspaceRetention] = field(default_factory=list)
    releasable_blobs: int = 0
    releasable_bytes: int = 0
    released_keys: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def released(self) -> int:
        return sum(len(w.release) for w in self.workspaces)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.as_dict(), "cutoff_ns": self.cutoff_ns,
                "dry_run": self.dry_run, "released": self.released,
                "releasable_blobs": self.releasable_blobs,
                "releasable_bytes": self.releasable_bytes,
                "workspaces": [w.as_dict() for w in self.workspaces]}


def history(ledger: Ledger, workspace: str) -> dict[str, list[Version]]:
    """path -> its versions in seq order: each committed step's writes (a `fenced` of a
    step whose manifest was published) and each compensation's put-backs."""
    published = {r.step for r in ledger.read(kind="manifest-published")}
    out: dict[str, list[Version]] = defaultdict(list)
    for r in ledger.read(workspace=workspace):
        event = r.event
        if isinstance(event, Fenced):
            if r.step not in published:
                continue  # never committed: no manifest holds its bytes
            for w in event.writes:
                out[w.path].append(Version(w.path, r.step, w.post_hash, r.seq, r.time_ns))
        elif isinstance(event, Compensated):
            for x in event.restored:
                if x.outcome != "conflict":
                    out[x.path].append(Version(x.path, r.step, x.digest, r.seq, r.time_ns))
    return dict(out)


def released_keys(ledger: Ledger) -> dict[tuple[str, str, str], int]:
    """(step, path, digest) -> the seq of the latest `history-released` that names it. A
    release lets go of the records of that key made before it, never of one made after
    (a step run again, or undone, can record the same key anew)."""
    out: dict[tuple[str, str, str], int] = {}
    for r in ledger.read(kind="history-released"):
        assert isinstance(r.event, HistoryReleased)
        for v in r.event.versions:
            out[(v.step, v.path, v.digest)] = r.seq
    return out


def plan(ledger: Ledger, policy: Policy, *, now_ns: int | None = None,
         dry_run: bool = True) -> RetentionReport:
    """What `policy` releases now (nothing is written)."""
    from .gc.holders import read_references

    now = now_ns if now_ns is not None else ledger.clock()
    cutoff = max(0, now - int(policy.keep_days * _DAY_NS)) if policy.keep_days else 0
    report = RetentionReport(policy, cutoff, dry_run)
    names = [w.name for w in ledger.workspaces.list()]
    for name in policy.workspaces:
        if name not in names:
            raise InvalidInput(f"retention policy {policy.source} names workspace {name!r},"
                               f" which this ledger does not have (it has:"
                               f" {', '.join(names) or 'none'})")
    done = released_keys(ledger)
    held = {(h.scope, h.target) for h in ledger.holds()}
    states: dict[str, tuple[str, str, bool]] = {}
    # A step may still be undone while in flight (compensating included) or, committed,
    # within the compensation window from its publication: its undo puts back the
    # version before it. A step that moved bytes pinned that pre-image for as long (its
    # pin holds the bytes, the record may go); an observation moved none and pinned
    # none: the version before it is kept.
    window_ns = int(ledger.compensation_window_s * 1e9)
    published_ns: dict[str, int] = {}
    for r in ledger.read(kind="manifest-published"):
        published_ns[r.step] = max(published_ns.get(r.step, 0), r.time_ns)
    with ledger.storage.read() as conn:
        pre_pinned = {(str(row[0]), str(row[2])) for row in conn.pin_rows()
                      if row[3] == "pre-image"}

    def state(step: str) -> tuple[str, str, bool]:
        if step not in states:
            row = ledger.find_step(step)
            states[step] = ("", "", False) if row is None else (row.state, row.run, row.live)
        return states[step]

    def undoable(step: str) -> bool:
        st, _run, live = state(step)
        return st not in _SETTLED or (live and now - published_ns.get(step, now) <= window_ns)

    for name in dict.fromkeys(policy.workspaces or names):
        ws = WorkspaceRetention(name)
        for path, versions in sorted(history(ledger, name).items()):
            last = len(versions) - 1
            before_undoable = {i - 1 for i, v in enumerate(versions)
                               if i and versions[i - 1].digest is not None
                               and (v.step, versions[i - 1].digest) not in pre_pinned
                               and undoable(v.step)}
            # A release names (step, path, digest): the same key may be recorded twice (a
            # write that left the bytes as they were, then undone; a step run again after
            # its undo). A key any kept version has is never released.
            kept_keys: set[tuple[str, str, str]] = set()
            candidates: list[Version] = []
            for i, v in enumerate(versions):
                if v.digest is None:
                    continue  # a delete holds no bytes
                ws.versions += 1
                key = (v.step, v.path, v.digest)
                st, run, _live = state(v.step)
                keep = (i == last
                        or (policy.keep_versions and i > last - policy.keep_versions)
                        or (policy.keep_days and v.time_ns >= cutoff)
                        or i in before_undoable
                        or st not in _SETTLED
                        or ("step", v.step) in held or (run and ("run", run) in held))
                if key in done and v.seq < done[key]:
                    ws.already += 1
                elif keep:
                    ws.kept += 1
                    kept_keys.add(key)
                else:
                    candidates.append(v)
            releasing: set[tuple[str, str, str]] = set()
            for v in candidates:
                key = (v.step, v.path, v.digest or "")
                if key in kept_keys:
                    ws.kept += 1
                elif key in releasing:
                    ws.already += 1  # released by this very entry
                else:
                    releasing.add(key)
                    ws.release.append(v)
                    report.released_keys.add(key)
        report.workspaces.append(ws)
    if report.released_keys:
        with ledger.storage.read() as conn:
            before = read_references(conn).referenced
            after = read_references(conn, assume_released=report.released_keys).referenced
            for digest in before - after:
                size = conn.blob_size(digest)
                if size is not None:
                    report.releasable_blobs += 1
                    report.releasable_bytes += size[0]
    return report


def apply(ledger: Ledger, policy: Policy, *, now_ns: int | None = None,
          by: str = "gc") -> RetentionReport:
    """Work out what `policy` releases and record it (`history-released` events, split at
    the list bound, all in one transaction); the report of what was released."""
    report = plan(ledger, policy, now_ns=now_ns, dry_run=False)
    events = []
    counts: dict[str, int] = defaultdict(int)
    for r in ledger.read(kind="history-released"):
        assert isinstance(r.event, HistoryReleased)
        counts[r.event.workspace] += 1
    for ws in report.workspaces:
        for start in range(0, len(ws.release), ITEMS_MAX):
            chunk = ws.release[start:start + ITEMS_MAX]
            events.append(HistoryReleased(
                workspace=ws.workspace, n=counts[ws.workspace],
                keep_s=int(policy.keep_days * 86_400),
                keep_versions=policy.keep_versions, cutoff_ns=report.cutoff_ns,
                versions=tuple(ReleasedVersion(path=v.path, step=v.step, digest=v.digest)
                               for v in chunk if v.digest is not None),
                by=by[:255]))
            counts[ws.workspace] += 1
    if events:
        ledger.append_batch(events)
    return report


def released_versions(ledger_or_log: Any) -> dict[tuple[str, str, str], int]:
    """(workspace, path, digest) -> the seq of the `history-released` event that released
    that version (the first, where two did)."""
    out: dict[tuple[str, str, str], int] = {}
    for r in getattr(ledger_or_log, "read")(kind="history-released"):
        event = r.event
        if isinstance(event, HistoryReleased):
            for v in event.versions:
                out.setdefault((event.workspace, v.path, v.digest), r.seq)
    return out


def why_unreachable(ledger_or_log: Any, digest: str, *, workspace: str, path: str,
                    released: dict[tuple[str, str, str], int] | None = None) -> str:
    """Why the version of `path` in `workspace` whose bytes are `digest` is no longer
    stored, in words for restore/rewind/fork: released by the retention policy only when
    a release named that very version (workspace, path and bytes) — the same bytes
    released under another path or workspace say nothing of this one. `released`:
    `released_versions`, when the caller asks about many paths."""
    index = released_versions(ledger_or_log) if released is None else released
    seq = index.get((workspace, path, digest))
    if seq is not None:
        return (f"its bytes as of then were released by the retention policy"
                f" (#{seq}) and collected")
    return "its bytes as of then are no longer stored (collected)"


__all__ = ["POLICY_NAME", "Policy", "RetentionReport", "Version", "WorkspaceRetention",
           "apply", "history", "load_policy", "plan", "policy_path", "released_keys",
           "released_versions",
           "why_unreachable"]

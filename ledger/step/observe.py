"""Observations: the changes made to a workspace outside the steps — a person's editor, a
shell, a formatter — found on disk and recorded (docs/time-travel.md "Observe").

`observe` walks the workspace as every other walk does (the root reached without following
a symlink, `.git` and the ledger's own files out of reach, steptrail's temporaries not
listed), compares each regular file with what the ledger knows of its path, and records
what differs — created, changed, deleted, a changed mode — as a step of its own:

1. ``planned`` (each change as a write: base rev and pre-image the ledger's, post-image
   the bytes found), ``observed`` (who asked, the label, what was left out) and the
   post-images pinned, in one transaction; the large post-images then stored as files;
2. ``fenced`` (the new path revisions), ``manifest-published`` and ``acked``, in a second
   one. No byte on disk moves: the files already hold what is recorded.

Both transactions check, under the live epoch of the caller's lease, that every path is
still at the revision and content the comparison read: a step's write is never recorded
as an outside change (a step of another epoch in flight was settled by the acquire; a
step of this epoch is the caller's own and must not run meanwhile — `observe` holds the
process's workspace lock). A change that lands while it runs is found by the next
observation. Bytes are recorded as they were read: a file that changed while it was being
stored ends the attempt (``rejected``) and the observation starts again.

Cheap when nothing changed: a stat walk; a file is hashed only when its size, mtime,
ctime, inode or mode differ from the last look (a cache beside the ledger, a hint only:
`full` ignores it), or when it was modified within `RACY_NS` of that look — an edit in
the same timestamp tick as the look leaves the stat as it was, so such a file is never
trusted from the cache (git's "racily clean" rule).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final


from .. import holders
from ..blobs import fd_chunks
from ..errors import (
    ContentChanged,
    EnvironmentFailure,
    InvalidInput,
    LedgerError,
    ProtocolRefused,
    StorageFailure,
    WorkspaceMoved,
)
from ..events import (
    NAME_MAX,
    PATH_MAX,
    AppliedWrite,
    BlobPinned,
    Compensated,
    Event,
    Fenced,
    NotCaptured,
    Observed,
    Planned,
    PlannedWrite,
    Rejected,
    check_relpath,
)
from ..projections import read_workspaces
from ..projections.steps import IN_FLIGHT, PLANNED
from ..store import Tx
from ..workspace.confined import _DIR_FLAGS, Confined, FsRefused
from ..workspace.statcache import Cached, cache_path, load_cache, save_cache
from .apply import commit_events
from .attempt import read_attempt
from .draft import DRAFT_ROUNDS, Moved
from .site import Site

#: Files modified within this long before a look are hashed again at the next one, whatever
#: their stat says (coarse timestamps: 2 s on FAT, 1 s on some network file systems).
RACY_NS: Final = 2_000_000_000
#: The writes one observation step records at most (a baseline of a large tree is several).
WRITES_PER_STEP: Final = 1000
#: A file larger than this is not captured unless the caller raises it.
MAX_FILE_BYTES: Final = 64 * 1024 * 1024
#: How many files changing while stored an observation strikes before such a look counts
#: as one of its DRAFT_ROUNDS (each is struck at most twice, then left out: `changing`).
CHANGING_FILES_MAX: Final = 32
#: How many left-out files an `observed` event names (the count is whole).
NOT_CAPTURED_LISTED: Final = 100
#: The run an observation's step belongs to.
RUN: Final = "observed"
_CHUNK: Final = 1 << 20
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Change:
    """One difference between the disk and the ledger: `kind` created, changed, deleted
    or mode (the same bytes, other permission bits)."""

    path: str
    kind: str
    base_rev: int
    pre_hash: str | None
    post_hash: str | None
    size: int = 0
    mode: int | None = None  # the permission bits found (None: deleted)
    pre_mode: int | None = None  # the bits the last look saw (None: unknown)


@dataclass
class Scan:
    """What a walk found: the changes, what it left out and why, and its cost."""

    changes: list[Change] = field(default_factory=list)
    not_captured: list[NotCaptured] = field(default_factory=list)
    files: int = 0
    hashed: int = 0
    bytes_hashed: int = 0
    #: path -> the bytes of a small changed file (stored inline with the plan)
    small: dict[str, bytes] = field(default_factory=dict)
    #: path -> the cache entry of this look, but for the revision (`statcache.Cached`)
    cache: dict[str, tuple[int, int, int, int, int, str, bool]] = field(default_factory=dict)
    #: files whose names no event can carry (a backslash, a control character, not
    #: UTF-8, longer than a path may be): left out, counted, shown escaped
    bad_names: list[str] = field(default_factory=list)


# -- what git ignores -----------------------------------------------------------------------


def git_ignored(root: str) -> tuple[set[str], set[str]] | None:
    """(files, directories) .gitignore'd under `root`, relative to it, as git decides
    (its own rules: nested .gitignore files, info/exclude, core.excludesFile) — inside
    untracked directories too (`git status --ignored=matching --untracked-files=all`:
    ``ls-files --directory`` would fold an untracked directory and name none of the
    ignored files in it); None when `root` is in no git work tree or git cannot be run.
    Git runs with no hook or file system monitor a repository's config could name: an
    agent that wrote one does not get a command run by a person's observe."""
    safe = ["git", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
            "-c", "core.hooksPath=/dev/null"]
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        prefix = subprocess.run([*safe, "rev-parse", "--show-prefix"], cwd=root,
                                capture_output=True, timeout=60, check=False, env=env)
        if prefix.returncode != 0:
            return None
        out = subprocess.run(
            [*safe, "status", "--porcelain=v1", "-z", "--ignored=matching",
             "--untracked-files=all", "--", "."],
            cwd=root, capture_output=True, timeout=120, check=False, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    below = os.fsdecode(prefix.stdout.strip())  # the root's place in the work tree
    files: set[str] = set()
    dirs: set[str] = set()
    for raw in out.stdout.split(b"\0"):
        if not raw.startswith(b"!! "):
            continue  # (tracked, untracked, and a rename's second name: not ignored)
        name = os.fsdecode(raw[3:])
        if below and not name.startswith(below):
            continue
        name = name[len(below):]
        if name.endswith("/"):
            dirs.add(name.rstrip("/"))
        elif name:
            files.add(name)
    return files, dirs


# -- the walk --------------------------------------------------------------------------------


def _hash_fd(fd: int, keep: bool) -> tuple[str, int, bytes | None]:
    h = hashlib.sha256()
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        h.update(chunk)
        size += len(chunk)
        if keep:
            parts.append(chunk)
    return h.hexdigest(), size, b"".join(parts) if keep else None


def scan(confined: Confined, known: dict[str, tuple[int, str | None]],
         cached: dict[str, Cached], *, looked_ns: int, inline_max: int,
         max_file_bytes: int, ignored: tuple[set[str], set[str]] | None,
         recorded_mode: Callable[[str], int | None],
         busy: frozenset[str] = frozenset(),
         hidden_dirs: frozenset[tuple[int, int]] = frozenset()) -> Scan:
    """Walk the workspace and compare it with `known` (path -> (rev, digest or None));
    `recorded_mode(path)`: the permission bits the ledger last recorded for a path the
    cache does not know. `busy`: files left out as changing (they changed under every
    try to store them); `hidden_dirs`: directories (device, inode) never entered (a stat
    cache kept inside the tree).

    A file the ledger knows is compared even where git ignores it now (git never ignores
    a tracked file either: ignoring a known file must not hide its edits), so an ignored
    directory holding known files is walked for those. A directory that cannot be read
    is left out, and nothing the ledger knows under it counts as deleted."""
    out = Scan()
    ig_files, ig_dirs = ignored or (set(), set())
    known_dirs = {p.rsplit("/", 1)[0] for p in known if "/" in p}
    known_dirs = {"/".join(d.split("/")[:i]) for d in known_dirs
                  for i in range(1, d.count("/") + 2)}
    seen: set[str] = set()
    left_out: set[str] = set()
    unwalked: set[str] = set()  # directories not looked into: nothing under them deleted

    def leave(path: str, why: str) -> None:
        left_out.add(path)
        try:
            out.not_captured.append(NotCaptured(path=path, why=why))  # type: ignore[arg-type]
        except InvalidInput:
            out.bad_names.append(path)  # a name no event can carry

    def file(dir_fd: int, de: os.DirEntry[str], path: str, st: os.stat_result) -> None:
        if st.st_size > max_file_bytes:
            leave(path, "too-large")
            return
        if path in busy:
            leave(path, "changing")
            return
        out.files += 1
        mode = stat.S_IMODE(st.st_mode)
        sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode)
        c = cached.get(path)
        hit = (c is not None and c.trusted
               and (c.size, c.mtime_ns, c.ctime_ns, c.ino, c.mode) == sig)
        rev, want = known.get(path, (0, None))
        small: bytes | None = None
        if hit:
            assert c is not None
            digest = c.digest
        else:
            try:
                fd = os.open(de.name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError:
                leave(path, "unreadable")
                return
            try:
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
                    leave(path, "unreadable")  # swapped between the look and the open
                    return
                digest, size, small = _hash_fd(fd, keep=st.st_size <= inline_max)
            except OSError:
                leave(path, "unreadable")
                return
            finally:
                os.close(fd)
            out.hashed += 1
            out.bytes_hashed += size
            if size != st.st_size:
                sig = (size, *sig[1:])
        seen.add(path)
        # a file modified within RACY_NS of this look is not trusted next time
        out.cache[path] = (*sig, digest, sig[1] < looked_ns - RACY_NS
                           and sig[2] < looked_ns - RACY_NS)
        # the mode the ledger recorded: the last look's, while the path's revision is
        # the same (no step wrote it since), else the event's that set it
        before = c.mode if c is not None and c.rev == rev and c.digest == want else None
        if before is None and want is not None:
            before = recorded_mode(path)
        if want == digest:
            if before is not None and before != mode:
                out.changes.append(Change(path, "mode", rev, digest, digest, sig[0],
                                          mode, before))
            return
        kind = "created" if want is None else "changed"
        out.changes.append(Change(path, kind, rev, want, digest, sig[0], mode, before))
        if small is not None and len(small) <= inline_max:
            out.small[path] = small

    with confined.wsdir.open_dir("") as root_fd:
        if root_fd is None:
            raise StorageFailure(confined.root, "the workspace's directory is gone")
        # (directory descriptor, its path, whether it lies in an ignored directory); an
        # explicit stack: a tree of any depth is walked without recursion
        stack: list[tuple[int, str, bool]] = [(os.dup(root_fd), "", False)]
        try:
            while stack:
                dir_fd, base, in_ignored = stack.pop()
                try:
                    try:
                        with os.scandir(dir_fd) as it:
                            entries = sorted(it, key=lambda e: e.name, reverse=True)
                    except OSError:
                        leave(base or ".", "unreadable")
                        unwalked.add(base)
                        continue
                    for de in entries:
                        path = f"{base}/{de.name}" if base else de.name
                        try:
                            st = de.stat(follow_symlinks=False)
                        except OSError:
                            continue  # gone meanwhile
                        if confined.hides(de.name, st):
                            continue
                        try:
                            # (a plain printable ASCII name under a checked parent is
                            # fine: the whole path is checked only for the others)
                            if not (de.name.isascii() and de.name.isprintable()
                                    and "\\" not in de.name and de.name not in (".", "..")
                                    and len(de.name) <= NAME_MAX
                                    and len(path) <= PATH_MAX):
                                check_relpath(path)
                        except InvalidInput:
                            # (a backslash, a control character, not UTF-8, too long:
                            # no event can name it) — said, never fatal
                            left_out.add(path)
                            out.bad_names.append(path)
                            if stat.S_ISDIR(st.st_mode):
                                unwalked.add(path)
                            continue
                        if stat.S_ISDIR(st.st_mode):
                            if (st.st_dev, st.st_ino) in hidden_dirs:
                                continue
                            ignored_here = in_ignored or path in ig_dirs
                            if ignored_here and path not in known_dirs:
                                leave(path, "ignored")
                                unwalked.add(path)
                                continue
                            try:
                                child = os.open(de.name, _DIR_FLAGS, dir_fd=dir_fd)
                            except OSError:
                                leave(path, "unreadable")
                                unwalked.add(path)
                                continue
                            stack.append((child, path, ignored_here))
                            continue
                        if (in_ignored or path in ig_files) and path not in known:
                            leave(path, "ignored")
                            continue
                        if not stat.S_ISREG(st.st_mode):
                            leave(path, "not-a-file")
                            continue
                        file(dir_fd, de, path, st)
                finally:
                    os.close(dir_fd)
        finally:
            for fd, _base, _ig in stack:
                os.close(fd)
    for path, (rev, want) in sorted(known.items()):
        if want is None or path in seen or path in left_out:
            continue
        if any(path.startswith(d + "/") for d in unwalked if d):
            continue  # inside a directory not looked into: not deleted
        if _hidden(confined, path):
            continue
        out.changes.append(Change(path, "deleted", rev, want, None))
    out.changes.sort(key=lambda ch: ch.path)
    return out


def _recorded_mode(site: Site, path: str, states: dict[str, tuple[int, str | None, int]]
                   ) -> int | None:
    """The permission bits the event that last set `path` recorded (None: unknown)."""
    state = states.get(path)
    if state is None:
        return None
    for recorded in site.core.log.read(after_seq=state[2] - 1, limit=1):
        event = recorded.event
        if isinstance(event, Fenced):
            return next((w.post_mode for w in event.writes if w.path == path), None)
        if isinstance(event, Compensated):
            return next((r.mode for r in event.restored if r.path == path), None)
    return None


def _hidden(confined: Confined, path: str) -> bool:
    return any(confined.hides(part, None) for part in path.split("/"))


# -- recording -------------------------------------------------------------------------------


class InFlight(Moved):
    """A step of the observing epoch is in flight on a path the observation would record:
    its bytes on disk may be that step's, landing now. Observe between steps."""

    def __init__(self, step: str) -> None:
        super().__init__(f"step {step!r} of this epoch is in flight on a path this"
                         " observation would record")
        self.step = step


def _step_id(name: str, rev: int) -> str:
    return f"observed-{name[:120]}-r{rev}-{secrets.token_hex(4)}"


def record(site: Site, name: str, epoch: int, scan_: Scan, *, by: str, label: str,
           baseline: bool) -> list[str]:
    """Record the scan's changes as observation steps (see the module); returns their
    ids. Raises Moved when a path moved since the scan (the caller observes again)."""
    changes = scan_.changes
    steps: list[str] = []
    nc = scan_.not_captured
    for start in range(0, len(changes), WRITES_PER_STEP):
        batch = changes[start:start + WRITES_PER_STEP]
        first = start == 0
        steps.append(_record_one(site, name, epoch, batch, scan_.small, by=by, label=label,
                                 baseline=baseline,
                                 not_captured=tuple(nc[:NOT_CAPTURED_LISTED]) if first else (),
                                 not_captured_total=len(nc) if first else 0))
    return steps


def _check_paths(tx: Tx, name: str, batch: list[Change], site: Site | None = None,
                 epoch: int = 0, own: str = "") -> None:
    """Every path still at the revision and content compared, and none named by a step
    of this epoch in flight (another process of the holder may be landing it: its bytes
    are the step's, not an outside edit) — `Moved` otherwise."""
    if site is not None:
        paths = {ch.path for ch in batch}
        for step, attempt in tx.steps_in_flight(name, epoch + 1):
            if step == own:
                continue
            plan = read_attempt(site.core.log, step, attempt).planned
            if plan is not None and paths & {w.path for w in plan.writes}:
                raise InFlight(step)
    for ch in batch:
        state = tx.path_state(name, ch.path)
        now = (0, None) if state is None else (state[0], state[1])
        if now != (ch.base_rev, ch.pre_hash):
            raise Moved(f"{ch.path} moved (a step wrote it) since it was compared")


def _record_one(site: Site, name: str, epoch: int, batch: list[Change],
                small: dict[str, bytes], *, by: str, label: str, baseline: bool,
                not_captured: tuple[NotCaptured, ...], not_captured_total: int) -> str:
    log, guard = site.core.log, site.core.guard
    decided: dict[str, Planned] = {}

    def plan(tx: Tx, now: int) -> list[Event]:
        ws = site.leases.live_epoch(tx, name, epoch, now)
        _check_paths(tx, name, batch, site, epoch)
        step = _step_id(name, ws.rev)
        common = dict(step=step, attempt=1, run=RUN, workspace=name, epoch=epoch)
        planned = Planned(**common, writes=tuple(  # type: ignore[arg-type]
            PlannedWrite(path=ch.path, base_rev=ch.base_rev, pre_hash=ch.pre_hash,
                         post_hash=ch.post_hash,
                         mode=ch.mode if ch.pre_hash is None and ch.post_hash else None)
            for ch in batch), rev=ws.rev)
        decided["planned"] = planned
        posts = dict.fromkeys(ch.post_hash for ch in batch if ch.post_hash is not None)
        return [planned,
                Observed(**common, by=by, label=label, baseline=baseline,  # type: ignore[arg-type]
                         not_captured=not_captured, not_captured_total=not_captured_total),
                *(BlobPinned(**common, digest=d, role="post-image")  # type: ignore[arg-type]
                  for d in posts)]

    inline = {ch.post_hash: small[ch.path] for ch in batch
              if ch.post_hash is not None and ch.path in small}
    log.append(plan, guard=guard(), inline=inline)
    planned = decided["planned"]
    step = planned.step
    try:
        _store_large(site, name, batch, inline)
    except Busy as busy:
        _reject(site, planned, "pre_hash", busy.why)
        raise
    except BaseException:
        _reject(site, planned, "pre_hash", "the observation stopped before it was recorded")
        raise

    def commit(tx: Tx, now: int) -> list[Event]:
        ws = site.leases.live_epoch(tx, name, epoch, now)
        cur = site.core.steps.in_tx(tx, step)
        if cur is None or cur.attempt != 1 or cur.state != PLANNED:
            raise Moved(f"observation {step!r} moved on")
        _check_paths(tx, name, batch, site, epoch, own=step)
        writes = tuple(AppliedWrite(path=ch.path, rev=ws.rev + i, pre_hash=ch.pre_hash,
                                    post_hash=ch.post_hash, pre_mode=ch.pre_mode,
                                    post_mode=ch.mode)
                       for i, ch in enumerate(batch, 1))
        fenced = Fenced(step=step, attempt=1, run=RUN, workspace=name, epoch=epoch,
                        writes=writes, rev=ws.rev + len(writes))
        return [fenced, *commit_events(tx, now, planned, fenced, {}, cur)]

    try:
        log.append(commit, guard=guard())
    except Moved as moved:
        _reject(site, planned, "stale_rev", moved.why)
        raise
    return step


class Busy(Moved):
    """A file changed (or went, or became something else) while its post-image was being
    stored: the attempt ends and the observation looks again — leaving this path out
    (``changing``) once it has done so on every try."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} {why} while it was stored")
        self.path = path


def _store_large(site: Site, name: str, batch: list[Change], inline: dict[str, bytes]) -> None:
    """The post-images too large for a row, stored as files now that the plan pins them:
    each read again through the confined walk — a regular file of the scanned size — and
    checked to hash as the scan found (`Busy` otherwise, whatever went wrong)."""
    confined = site.places.confined(name)
    files = site.core.storage.files
    for ch in batch:
        if ch.post_hash is None or ch.post_hash in inline:
            continue
        if site.core.blob_size(ch.post_hash) is not None:
            continue  # stored already (the same bytes elsewhere)
        parent, _, leaf = ch.path.rpartition("/")
        try:
            with confined.open_dir(parent) as dir_fd:
                fd = os.open(leaf, _FILE_FLAGS, dir_fd=dir_fd)
        except (OSError, FsRefused, LedgerError):
            raise Busy(ch.path, "went") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != ch.size:
                raise Busy(ch.path, "changed")
            files.put_stream(fd_chunks(fd), ch.post_hash)
        except ContentChanged:
            raise Busy(ch.path, "changed") from None
        except (OSError, StorageFailure) as exc:
            raise Busy(ch.path, f"could not be read ({exc})") from None
        finally:
            os.close(fd)


def _reject(site: Site, planned: Planned, reason: str, detail: str) -> None:
    """End an observation attempt that could not be recorded (nothing of it applied)."""
    with contextlib.suppress(Exception):
        site.core.log.append([Rejected(step=planned.step, attempt=1, run=RUN,
                                       workspace=planned.workspace, epoch=planned.epoch,
                                       reason=reason, detail=detail[:4000])],  # type: ignore[arg-type]
                             guard=site.core.guard())


# -- the whole observation -------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What `observe` found and recorded: the `changes` (each a `Change`), the `steps`
    recording them (none when nothing changed, or `dry_run`), the files left out and why
    (`not_captured`), and its cost (files looked at, files hashed, bytes hashed, seconds).
    `baseline`: the workspace's first observation. `ignore_rules`: whether .gitignore
    rules were applied (False: no git work tree, or `include_ignored`).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> found = ledger.workspaces.observe("repo", by="library:doc")
    >>> found.baseline, [(c.path, c.kind) for c in found.changes]
    (True, [('app.py', 'created')])
    >>> _ = Path("repo/app.py").write_text("v1\\n")
    >>> [(c.path, c.kind) for c in ledger.workspaces.observe("repo", by="library:doc").changes]
    [('app.py', 'changed')]
    >>> ledger.close()
    """

    workspace: str
    changes: tuple[Change, ...]
    steps: tuple[str, ...]
    not_captured: tuple[NotCaptured, ...]
    files: int
    hashed: int
    bytes_hashed: int
    seconds: float
    baseline: bool
    by: str
    label: str
    epoch: int
    dry_run: bool
    ignore_rules: bool
    #: files left out because no event can carry their names (a backslash, a control
    #: character, not UTF-8, too long); as found, for a person to rename
    bad_names: tuple[str, ...] = ()

    @property
    def recorded(self) -> bool:
        return bool(self.steps)


def observation_attempts(log: Any, workspace: str) -> set[tuple[str, int]]:
    """(step, attempt) of every observation of `workspace`: an observation is the attempt
    its `observed` event names, of the run observations record under (`RUN`). A step id
    alone says nothing: an ended observation's id is free for a new attempt (`admit`,
    `replan`), and `ledger.append` takes an `observed` event for any step planned —
    neither makes another attempt's write an observation."""
    return {(r.step, r.event.attempt) for r in log.read(kind="observed", workspace=workspace)
            if isinstance(r.event, Observed) and r.event.run == RUN}


def default_by() -> str:
    """Who asks when the caller does not say: the library in this process."""
    return f"library:{_user()}@{socket.gethostname()}"[:255]


def default_holder(what: str = "observe") -> str:
    """The holder of a lease an observation (or a rewind: `what`) takes for itself."""
    return holders.holder(what)


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "unknown")


def _first(site: Site, name: str) -> bool:
    """Whether the next observation of workspace `name` is its first (its baseline): no
    observation recorded anything yet — one killed before it committed, and settled
    since, did not (read past only then: the usual answer is one event)."""
    def recorded(step: str) -> bool:  # committed (even if undone since), or in flight
        row = site.core.steps.find(step)
        return row is not None and (row.manifest_rev >= 0 or row.state in IN_FLIGHT)

    first = next(iter(site.core.log.read(kind="observed", workspace=name, limit=1)), None)
    return first is None or not (recorded(first.step) or any(
        recorded(r.step) for r in site.core.log.read(first.seq, kind="observed",
                                                     workspace=name)))


def observe(site: Site, name: str, epoch: int, *, by: str, label: str = "",
            dry_run: bool = False, include_ignored: bool = False,
            max_file_bytes: int = MAX_FILE_BYTES, full: bool = False) -> Observation:
    """Find and record workspace `name`'s changes made outside the steps, under the live
    `epoch` (see the module)."""
    if not by or len(by) > 255:
        raise InvalidInput("by must name who asks for the observation (1 to 255 characters)")
    if len(label) > 4096:
        raise InvalidInput("label is longer than 4096 characters; shorten it")
    if type(max_file_bytes) is not int or max_file_bytes < 0:
        raise InvalidInput(f"max_file_bytes {max_file_bytes!r} must be an integer >= 0")
    started = time.monotonic()
    strikes: dict[str, int] = {}  # path -> tries it changed under
    why = ""
    with site.leases.workspace_lock(name):
        # A look that a step moved under counts against DRAFT_ROUNDS; one a file changed
        # under strikes that file instead (two strikes leave it out), so the files a
        # server keeps writing end as `changing` rather than failing the observation —
        # up to CHANGING_FILES_MAX of them, after which each such look counts too.
        _round = 0
        while _round <= DRAFT_ROUNDS:
            confined = site.places.confined(name)
            root = confined.root
            with confined.wsdir.open_dir("") as fd:  # (a moved root: WorkspaceMoved)
                if fd is None:
                    raise WorkspaceMoved(name, root, "it is gone")
                st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            place = site.core.own.place()
            where = cache_path(None if place is None else place[0],
                               site.core.storage.genesis.hex(), name)
            cached = {} if full else load_cache(where, root, ident)
            hidden: set[tuple[int, int]] = set()
            with contextlib.suppress(OSError):  # a cache kept inside the tree is not in it
                cst = os.stat(os.path.dirname(where))
                hidden.add((cst.st_dev, cst.st_ino))
            site.places.get(name)  # UnknownWorkspace first
            states = {p: st for (w, p), st in read_workspaces(site.core.log).paths.items()
                      if w == name and st is not None}
            known = {p: (st[0], st[1]) for p, st in states.items()}
            # the workspace's first observation: every file it holds that no step wrote
            baseline = _first(site, name)
            ignored = None if include_ignored else git_ignored(root)
            looked_ns = time.time_ns()
            found = scan(confined, known, cached, looked_ns=looked_ns,
                         inline_max=site.core.options.inline_max_bytes,
                         max_file_bytes=max_file_bytes, ignored=ignored,
                         recorded_mode=lambda path: _recorded_mode(site, path, states),
                         busy=frozenset(p for p, n in strikes.items() if n >= 2),
                         hidden_dirs=frozenset(hidden))
            steps: list[str] = []
            if found.changes and not dry_run:
                try:
                    steps = record(site, name, epoch, found, by=by, label=label,
                                   baseline=baseline)
                except Busy as b:
                    # a file that changed under this try is read again; under two, it is
                    # left out (``changing``): the rest is recorded, it by a later look
                    strikes[b.path] = strikes.get(b.path, 0) + 1
                    why = b.why
                    if len(strikes) > CHANGING_FILES_MAX:
                        _round += 1
                    continue
                except InFlight as f:
                    why = f.why
                    if _round >= DRAFT_ROUNDS - 1:
                        raise ProtocolRefused(
                            f"workspace {name!r}: {f.why}; nothing was recorded: observe"
                            " between your own steps (or without an epoch, under a lease"
                            " of its own)") from None
                    time.sleep(0.05 * (_round + 1))
                    _round += 1
                    continue
                except Moved as m:
                    why = m.why
                    _round += 1
                    continue  # something moved under the walk: look again
            if steps or not found.changes:
                # (a look whose changes were not recorded is no baseline for modes)
                if steps:
                    states = {p: st for (w, p), st in
                              read_workspaces(site.core.log).paths.items()
                              if w == name and st is not None}
                save_cache(where, root, ident, looked_ns,
                           {p: (*v, states[p][0] if p in states else 0)
                            for p, v in found.cache.items()})
            return Observation(
                workspace=name, changes=tuple(found.changes), steps=tuple(steps),
                not_captured=tuple(found.not_captured), files=found.files,
                hashed=found.hashed, bytes_hashed=found.bytes_hashed,
                seconds=time.monotonic() - started, baseline=baseline and bool(steps),
                by=by, label=label, epoch=epoch, dry_run=dry_run,
                ignore_rules=ignored is not None, bad_names=tuple(found.bad_names))
    raise EnvironmentFailure(f"workspace {name!r} kept changing under {DRAFT_ROUNDS + 1}"
                             f" looks in a row (last: {why}); nothing was recorded: observe"
                             " again when it is quiet")


__all__ = ["Change", "MAX_FILE_BYTES", "Observation", "RACY_NS", "default_by", "default_holder",
           "observation_attempts",
           "observe"]

"""Where workspaces live and their rules: `Places` — registration (a named directory,
recorded resolved with its device and inode), the checks every way in makes (the
ledger where it was registered, no overlap with another workspace or the ledger's own
files), the one confined walk from a root (`wsdir`), reads a planner fences on
(`read_file`, `snapshot`), the files steptrail kept under a visible name (`kept`),
`restore`."""

from __future__ import annotations

import builtins  # (annotations: `Workspaces.list` shadows the builtin in the class)
import contextlib
import os
import re
import stat
from typing import Final


from ..blobs import digest_of, fd_chunks
from ..errors import InvalidInput, LedgerError, LedgerMoved, UnknownWorkspace, WorkspaceOverlap
from ..events import Event, Rejected, WorkspaceAdded, WorkspaceRebound, check_relpath, check_step_id
from .confined import Confined
from .core import Core
from .moves import KEPT_MARK, stat_at
from .place import ledger_moved
from .restore import RestoreReport, restore
from ..projections import read_workspaces
from ..projections.steps import VERSION as STEPS_VERSION
from ..projections.workspaces import REGISTRATION_KINDS, Registration, WsRow, load_registration
from ..store import Head, Tx
from .boundary import FileIdentity, identity_of
from .directory import WorkspaceDir
from .names import attempt_tag
from ..step.values import KeptFile, FileRead


class _Unchanged(Exception):
    """A registration that changes nothing: its transaction ends, writing nothing."""


class Places:
    """The ledger's workspaces: their registrations and their directories, over the
    ledger's `Core` (see the module)."""

    def __init__(self, core: Core) -> None:
        #: What this works through (the log, the storage, the clock, the options, …).
        self.core = core
        #: name -> (the head it was read at, registration events appended, registration)
        self._registrations: dict[str, tuple[Head, int, Registration]] = {}

    def add(self, name: str, root: str | os.PathLike[str], *,
                      allow_git: bool = False, rebind: bool = False) -> WsRow:
        """Register a workspace: a named, existing directory, recorded resolved with its
        device and inode (every later walk checks them). (`Workspaces.add` says what it
        promises.)"""
        check_step_id(name)
        if not isinstance(root, str | os.PathLike) or not os.fspath(root):
            raise InvalidInput("give the workspace directory")
        if type(allow_git) is not bool or type(rebind) is not bool:
            raise InvalidInput("allow_git and rebind are booleans")
        real = os.path.realpath(os.fspath(root))
        try:
            st = os.stat(real)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise InvalidInput(f"workspace directory {root} does not exist; create it first"
                               if st is None else f"workspace directory {root} is not a"
                               " directory (a file, a device or a FIFO); give a directory")
        ident = identity_of(st)
        here = self.core.own.place()  # where the ledger is: recorded with the registration
        place = {} if here is None else dict(zip(("ledger_dir", "ledger_dev", "ledger_ino"),
                                                 here, strict=True))

        def build(tx: Tx, now: int) -> list[Event]:
            self.check_root(name, real, ident)  # under the lock: two adds cannot race
            reg = load_registration(tx, name)
            if reg is None:
                if rebind:
                    raise InvalidInput(f"workspace {name!r} was never added; add it without"
                                       " --rebind")
                return [WorkspaceAdded(workspace=name, root=real, dev=ident[0], ino=ident[1],
                                       allow_git=allow_git, **place)]
            same = (reg.root == real and reg.identity == ident and reg.allow_git == allow_git)
            # (adding it again never records the ledger's place: in a copy that would
            # bless the copy; only a rebind does)
            if (same and (not rebind or reg.ledger_place == here)) or (
                    not rebind and reg.root == real and reg.identity is None
                    and reg.allow_git == allow_git):
                raise _Unchanged  # nothing changed (an old registration keeps no identity)
            if not rebind:
                if reg.root != real:
                    differs = f"directory {reg.root}"
                elif reg.allow_git != allow_git:
                    differs = f"allow_git={reg.allow_git}"
                else:
                    differs = "another directory at that path (device and inode differ)"
                fact = (f"workspace {name!r} is already added with {differs}; give this one"
                        " another name, or re-register it with")
                raise InvalidInput(
                    f"{fact} ledger.workspaces.add({name!r}, {real!r}, rebind=True"
                    f"{', allow_git=True' if allow_git else ''})"
                ).at_a_shell(f"{fact} 'steptrail workspace add {name} {real} --rebind"
                             f"{' --allow-git' if allow_git else ''}'")
            return [WorkspaceRebound(workspace=name, root=real, dev=ident[0], ino=ident[1],
                                     allow_git=allow_git, after=reg.seq, **place)]

        with contextlib.suppress(_Unchanged):
            self.core.log.append(build)
        return self.get(name)

    def registration(self, name: str) -> Registration:
        """Where workspace `name` lives and what it may write (its newest
        `workspace-added`/`-restored`/`-rebound` event); UnknownWorkspace if never added."""
        check_step_id(name)
        # Kept while nothing can have changed it: every event appended since it was read
        # is this log's own (the head now, one statement, against the head it was read
        # at: `EventLog.only_mine_since` — exact on every store) and none of those was a
        # registration event (counted before its commit). Read inside a transaction or
        # read already open, it is not kept (it may be uncommitted).
        seen = sum(self.core.log.appended[k] for k in REGISTRATION_KINDS)
        nested = self.core.storage.held_here()
        hit = self._registrations.get(name)
        if hit is not None and not nested and hit[1] == seen:
            if self.core.log.only_mine_since(hit[0], self.core.storage.view.head()):
                return hit[2]
        with self.core.storage.read() as view:
            head = view.head()
            reg = load_registration(view, name)
        if reg is None:
            raise UnknownWorkspace(name)
        if not nested:
            self._registrations[name] = (head, seen, reg)
        return reg

    def ledger_moved(self, name: str) -> LedgerMoved | None:
        """Why a step on workspace `name` is refused because the ledger is not where it was
        when the workspace was registered (a copied or moved project: `LedgerMoved`, its
        `command` resolves it), or None. (`Workspaces.ledger_moved` says what it
        promises.)"""
        return ledger_moved(name, self.registration(name), self.core.own)

    def check_root(self, name: str, real: str, ident: FileIdentity | None) -> None:
        """Refuse a root that is, contains or lies inside another workspace's root, or is
        the ledger's own directory or inside its blob root: by resolved path, and by device
        and inode of the root (None: it does not exist yet) and of its ancestors (a bind
        mount, a case-variant name). (`Workspaces.check_root` says what it promises.)"""
        def ancestors(path: str) -> dict[FileIdentity, str]:
            out: dict[FileIdentity, str] = {}
            while True:
                with contextlib.suppress(OSError):
                    out.setdefault(identity_of(os.stat(path)), path)
                up = os.path.dirname(path)
                if up == path:
                    return out
                path = up

        def inside(a: str, b: str) -> bool:
            return a == b or a.startswith(b.rstrip("/") + "/")

        boundary = self.core.own.boundary()
        mine = ancestors(real)  # identity -> path, the root itself included when it exists
        if boundary.dir_paths:  # (a ledger in a database has no directory here)
            ledger_dir, blob_root = boundary.dir_paths
            if real == ledger_dir or (ident is not None
                                      and ident in boundary.dirs - boundary.stores):
                raise WorkspaceOverlap(real, "", ledger_dir, "is")
            if inside(real, blob_root) or any(i in boundary.stores for i in mine):
                raise WorkspaceOverlap(real, "", blob_root, "is or lies inside the blob store of")
        for other in self.list():
            if other.name == name:
                continue
            theirs = self.registration(other.name).identity
            if other.root == real or (ident is not None and theirs == ident):
                how = "is the directory of"
            elif inside(real, other.root) or (theirs is not None and theirs in mine):
                how = "lies inside"
            elif inside(other.root, real) or (ident is not None
                                              and ident in ancestors(other.root)):
                how = "contains"
            else:
                continue
            raise WorkspaceOverlap(real, other.name, other.root, how)

    def get(self, name: str) -> WsRow:
        """A workspace's row (revision, lease); UnknownWorkspace if it was never added."""
        check_step_id(name)
        if self.core.steps.current():
            # a writer's tables, as it left them: one statement
            row = self.core.storage.view.workspace(name)
        else:
            # the row and the lag check in one statement; a fold only when they lag
            current, row = self.core.storage.view.workspace_if_current(name, STEPS_VERSION)
            if not current:
                row = read_workspaces(self.core.log).rows.get(name)
        if row is None:
            raise UnknownWorkspace(name)
        return row

    def list(self) -> builtins.list[WsRow]:
        """Every workspace's row, by name (a bare lease has no directory: not listed)."""
        fold = read_workspaces(self.core.log)
        return sorted((r for r in fold.rows.values() if r is not None and r.root),
                      key=lambda r: r.name)

    def paths(self, name: str) -> dict[str, tuple[int, str | None]]:
        """Every path a step wrote: its rev and the hash of the content it should hold."""
        self.get(name)
        fold = read_workspaces(self.core.log)
        return {p: (s[0], s[1]) for (w, p), s in sorted(fold.paths.items())
                if w == name and s is not None}

    def kept(self, name: str) -> builtins.list[KeptFile]:
        """The files steptrail kept in workspace `name` under a visible name
        (``NAME.steptrail-kept-TAG``) instead of removing them, as its refusals and
        compensations recorded them (`Restored.kept`), each with whether it is still on
        disk: `status` shows those still there as needing attention. (`Workspaces.kept` says
        what it promises.)"""
        row = self.get(name)
        out: list[KeptFile] = []
        for kind in ("rejected", "compensated"):
            for r in self.core.log.read(kind=kind):
                ev = r.event
                if getattr(ev, "workspace", None) != name:
                    continue
                entries = ev.undone if isinstance(ev, Rejected) else ev.restored  # type: ignore[union-attr]
                for x in entries:
                    if x.kept is None:
                        continue
                    try:
                        present = os.path.isfile(os.path.join(row.root, x.kept)) and not \
                            os.path.islink(os.path.join(row.root, x.kept))
                    except OSError:
                        present = False
                    out.append(KeptFile(workspace=name, path=x.path, kept=x.kept,
                                        step=ev.step, attempt=ev.attempt,  # type: ignore[union-attr]
                                        seq=r.seq, present=present))
        out.extend(self._kept_on_disk(row, {k.kept for k in out}))
        return sorted(out, key=lambda k: (k.seq == 0, k.seq, k.kept))

    def _kept_on_disk(self, row: WsRow, recorded: set[str]) -> builtins.list[KeptFile]:
        """Kept files no refusal or compensation recorded — kept after a commit, by the
        removal of what a write displaced (a writer appended to it after the landing),
        of an attempt's slots, or of a dead stager's temporaries (gc) — found by name
        (``.steptrail-kept-``) in the directories of the paths the ledger knows in the
        workspace; each named after the attempt whose tag it carries where the ledger
        knows it (``seq`` 0: found on disk, not recorded)."""
        if row.epoch == 0 or self.ledger_moved(row.name) is not None:
            return []
        dirs = {p.rpartition("/")[0] for (w, p), state
                in read_workspaces(self.core.log).paths.items() if w == row.name}
        dirs.update(k.rpartition("/")[0] for k in recorded)
        if not dirs:
            return []
        tags: dict[str, tuple[str, int]] | None = None
        out: list[KeptFile] = []
        try:
            wsdir = self.wsdir(row)
        except LedgerError:
            return []
        for d in sorted(dirs):
            try:
                with wsdir.open_dir(d) as fd:
                    names = [] if fd is None else [
                        n for n in os.listdir(fd) if _KEPT_NAME.fullmatch(n)
                        and (st := stat_at(fd, n)) is not None and stat.S_ISREG(st.st_mode)]
            except (LedgerError, OSError):
                continue
            for n in sorted(names):
                rel = f"{d}/{n}" if d else n
                if rel in recorded:
                    continue
                leaf, _, tail = n.partition(KEPT_MARK)
                if tags is None:
                    with self.core.storage.read() as view:
                        tags = {attempt_tag(s.step_id, a): (s.step_id, a)
                                for s in view.steps() if s.workspace == row.name
                                for a in range(1, s.attempt + 1)}
                step, attempt = tags.get(tail.split("-")[0], ("", 0))
                out.append(KeptFile(workspace=row.name, path=f"{d}/{leaf}" if d else leaf,
                                    kept=rel, step=step, attempt=attempt, seq=0,
                                    present=True))
        return out

    def directory(self, name: str) -> WorkspaceDir:
        """Workspace `name`'s directory, confined as every step's write is: the root reached
        without following symlinks and checked against its registration, the ledger's own
        files and (unless allowed) ``.git`` out of reach. (`Workspaces.directory` says what
        it promises.)"""
        return self.wsdir(self.get(name))

    def restore(self, workspace: str, to: str | os.PathLike[str], *,
                force: bool = False, replace: bool = False) -> RestoreReport:
        """Materialize the workspace's committed content under `to` (a new or empty
        directory; with `replace`, any directory: what held other bytes at a restored path
        is kept beside it) and record it (`ledger.workspace.restore.restore`).
        (`Workspaces.restore` says what it promises.)"""
        return restore(self, workspace, to, force=force, replace=replace)

    def confined(self, name: str) -> Confined:
        """Workspace `name`'s directory as a tool may list, walk, search and ``mkdir -p`` it
        (`Confined`): every walk the protocol's own, under the same boundary — the ledger's
        files, ``.git`` unless the workspace allows it, no symlink followed.
        (`Workspaces.confined` says what it promises.)"""
        row = self.get(name)
        return Confined(self.wsdir(row), self.core.own.boundary(),
                        allow_git=self.registration(name).allow_git)

    def wsdir(self, row: WsRow, step: str = "", attempt: int = 0,
               epoch: int = 0) -> WorkspaceDir:
        """The workspace's directory, confined (its registered identity, the ledger's
        boundary, its `.git` opt-in); staging for `step`'s `attempt` under `epoch` (the
        stamp its temporaries carry, see `_remove_temporaries`). The one way in to a
        workspace's files: refused (`LedgerMoved`) while the ledger is not where it was."""
        reg = self.registration(row.name)
        moved = ledger_moved(row.name, reg, self.core.own)
        if moved is not None:
            raise moved
        return WorkspaceDir(row.name, row.root, self.core.storage.files.ops,
                            identity=reg.identity if reg.root == row.root else None,
                            boundary=self.core.own.boundary(), allow_git=reg.allow_git,
                            epoch=epoch, tag=attempt_tag(step, attempt))

    def snapshot(self, workspace: str, path: str) -> tuple[int, str | None]:
        """What a planner reads before it plans a write: (the path's rev, the sha256 of
        its bytes on disk now, None when absent)."""
        row = self.get(workspace)
        check_relpath(path)
        with self.core.storage.read() as conn:
            state = conn.path_state(workspace, path)
        return (0 if state is None else state[0]), self.wsdir(row).hash(path)

    def read_file(self, workspace: str, path: str, *,
                  max_bytes: int | None = None) -> FileRead:
        """Read a workspace file as a planner must: its bytes, with the sha256 of those very
        bytes and the path's rev, taken together (`FileRead`). (`Workspaces.read_file` says
        what it promises.)"""

        row = self.get(workspace)
        check_relpath(path)
        if max_bytes is not None and max_bytes < 0:
            raise InvalidInput(f"max_bytes must be 0 or more, not {max_bytes}")
        state = self.core.storage.view.path_state(workspace, path)  # one statement
        rev = 0 if state is None else state[0]
        with self.wsdir(row).open(path) as fd:
            if fd is None:
                return FileRead(workspace, path, rev, None, None)
            size = os.fstat(fd).st_size
            if max_bytes is not None and size > max_bytes:
                raise InvalidInput(
                    f"{workspace}:{path} holds {size} bytes, more than max_bytes={max_bytes};"
                    " read it with a larger limit, or plan it from a file (Write content"
                    " may be an open binary file)")
            content = b"".join(fd_chunks(fd))
        return FileRead(workspace, path, rev, digest_of(content), content)


#: A name `Mover.keep` gives: the leaf, the mark, the attempt's 8-hex tag and a counter.
#: Not a name of text that is not UTF-8 (no path steptrail writes is) — a person's
#: ``notes.steptrail-kept-mine`` is not one either.
_KEPT_NAME: Final = re.compile(r"(?s)[^\udc80-\udcff]+" + re.escape(KEPT_MARK)
                               + r"[0-9a-f]{8}(?:-[0-9]+)?")


__all__ = ["Places"]

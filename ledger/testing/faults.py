"""Power loss, I/O errors and disk full under a steptrail ledger: one simulated disk.

The test suite's harness, shipped so that ``steptrail chaos --power-loss`` and
``--io-errors`` run the same sweeps on a user's own machine. It imports nothing beyond
the stdlib and the ledger; what is the SQLite driver's (the VFS, what plain SQLite reads
of a file) is the SQLite store's, in `ledger.store.sqlite.faultvfs`. One `PowerLossDisk`
sits under both halves of a ledger's storage and gives them a single operation counter,
so "crash at operation k" is one instant for the SQLite files and the blob directory
alike:

- the SQLite files, through `FaultVFS` (the store's fault VFS, over the default unix
  VFS), which reports every ``xWrite`` / ``xTruncate`` / ``xSync`` to the disk
  (``sql_op``: count it, fail it, or lose power) before doing it;
- the blob directory, through `PowerLossFileOps`, a `ledger.blobs.FileOps` (the blob
  store's seam: ``write``, ``fsync``, ``rename``, ``dirfsync``, ``unlink``, ``mkdir``).
  The workspace directory's operations (``ws-write``, ``ws-fsync``, ``ws-rename``, ...)
  reach the same object through `FileOps.tick`: they are counted (crash points), they
  can be made to fail, but what they did is not modelled (SIGKILL semantics; see
  "Limits").

Durability model
----------------
SQLite files (SQLite's own ``src/test6.c`` model): a write survives power loss only
after an ``xSync`` of its file; creating and deleting a file are atomic and durable; the
``-shm`` file never survives (WAL recovery rebuilds it).

Blob files (ALICE / CrashMonkey style): a file's bytes survive only after ``fsync`` of
the file; a directory entry (create, ``mkdir``, ``rename``, ``unlink``) survives only
after ``fsync`` of its directory. Names are tracked per inode, so a rename carries the
file's (durable or not) bytes with it.

A failed fsync loses what it was asked to make durable: Linux marks the dirty pages
clean after a writeback error, so a later fsync that succeeds does not write them (the
"fsyncgate" lesson). Reads still see the bytes (page cache); only a power loss shows
they are gone. A failed directory fsync keeps its entries pending (a later directory
fsync persists them: the in-memory directory is written as it is).

At a power loss the operations not yet durable reach the platter per `model`:

=========  ==================================================================
drop       none of them
random     each one independently with p = 1/2
garbage    like random, but a lost data write may leave random bytes over its
           range instead (torn sectors; powersafe-overwrite holds)
prefix     the first r of them in issue order, r random (a FIFO write-back cache)
=========  ==================================================================

API
---
``PowerLossDisk(crash_at=None, model="drop", seed=0, faults=(), quota=None)``
    ``.ops`` operations so far, ``.trace`` their kinds, ``.targets`` their paths,
    ``.failed`` the injected failures, ``.crashed``; ``.freeze()`` power loss now
    (idempotent); ``.materialize(src_root, dst_root)`` writes what the platter holds
    (the frozen image; without a crash, everything durable so far) below `dst_root`.
    Models: `MODELS` (swept) and ``"torn"`` (every unsynced write garbage).
    Negative-control switches: ``.swallow_sync_errors`` (a failed fsync reported as
    success), ``.swallow_full`` (a write past the quota silently dropped).
``Fault(kinds, at=1, persistent=False, error="eio", target=None)``
    the `at`-th operation whose kind is in `kinds` (and whose path is `target`, if
    given) fails, and every later one if `persistent`; `error` ``"eio"`` or ``"full"``
    (SQLITE_IOERR_* or SQLITE_FULL / EIO or ENOSPC). Kinds: ``db-write db-sync
    db-truncate`` (SQLite), ``write fsync rename dirfsync unlink mkdir`` (blob store),
    ``ws-write ws-fsync ws-rename ws-hide ws-dirfsync ws-unlink ws-mkdir ws-rmdir``
    (workspace; ``ws-hide`` a rename between steptrail's own hidden names).
    ``quota=bytes`` on the disk: writes past that many bytes fail as disk full until
    ``disk.quota`` is raised or set to None ("space freed").
``FaultVFS(disk)``
    a registered SQLite VFS over the default one; ``vfs=FaultVFS(disk).name``; a context
    manager (unregisters on exit).
``PowerLossFileOps(disk, skip=())``
    ``ledger.blobs = BlobStore(root, PowerLossFileOps(disk))``; `skip` turns ``fsync``
    / ``dirfsync`` into no-ops (negative controls). ``FailingFileOps(faults)``: plain
    file ops that fail per `faults` (ENOSPC / EIO on blob and workspace writes), with
    nothing modelled.
``History`` / ``Op`` / ``classify(history, observed) -> Verdict``
    Jepsen's bookkeeping: ``with history.op("append:3"): ...`` records an attempted
    operation and, if the block returns, its ack; `observed` maps a key to the copies
    a recovered ledger holds. Verdict: lost (acked, gone: must be empty), recovered
    (indeterminate, present), unexpected (present, never attempted), duplicated
    (present more than once: must be empty).
``Env`` / ``run_with_disk(disk, root, fn)``
    one run's world (directory, disk, VFS name, file ops, clock, history);
    ``env.open()`` is ``Ledger.init`` through them; ``env.do(key, fn)`` runs one
    operation under the history. `run_with_disk` runs ``fn(env)`` on a disk and closes
    the ledger: the building block for custom scenarios and state machines.
``StandardWorkload(include_init=True, workspace=True, gc=True, ...)``
    init, appends, an artifact step with inline and file blobs, a compensated step
    (orphans for GC), a workspace step (lease, fence, apply, publish, ack), a rebuild,
    a GC run, more appends. Idempotent by id: running it again on a recovered ledger is
    the replay. ``.observe(ledger)`` -> key -> copies.
``run_point(workload, disk, scratch, restart=False, after=None)``
    run the workload on the disk, lose power (at the crash point, or right after the
    workload), materialize the platter beside the run and `check_recovery` it: open
    with the ordinary VFS read-write (catches projections up), verify (chain, seq,
    projections == rebuild, I3/I4/I5, I1 durability), classify every step, GC audit
    --deep (no dangling, no corrupt), the Jepsen verdict, then replay the workload and
    check again (every operation commits, nothing twice, temporary files collected).
    `restart`: also check the live files (a process restart). -> `PointResult`.
``crash_sweep(workload, models=MODELS, points=None, ...)`` -> [SweepReport per model]
``fault_sweep(workload, faults=lambda k: [...], points=[...], name=...)`` -> SweepReport
    `sample_points(total, every=, n=, seed=)` picks crash points; `full_mode()` is
    STEPTRAIL_FAULTS_FULL=1; `publish_report` prints a sweep's line (and appends JSON
    to $STEPTRAIL_FAULTS_REPORT). `KNOWN_BUGS`: ledger bugs a sweep may meet; a point
    that meets one records it in ``.known``, works around it, and checks the rest.
``sqlite_view(path)``
    what plain SQLite (WAL recovery included) reads from a copy of a ledger file.

Limits
------
- The workspace directory is not in the power-loss model (its renames and fsyncs go
  through `FileOps.tick` only, not through the seam's methods); a crash keeps what was
  done to it.
- Files SQLite creates are durable from creation (as in test6.c); directories the
  ledger creates outside the blob store (``os.makedirs`` in ``Database.create``) are
  not seen.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import random
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import Ledger, Planned, StepPlan, Write
from ..blobs import BLOB_DIR_MODE, BlobStore, FileOps
from ..errors import (
    LedgerError,
    LedgerNotFound,
    NotALedger,
)
from ..gc import audit, collect
from ..projections.steps import ENDED
from ..workspace.restore import CommittedFold
from ..runner import run_step
from ..store.sqlite.faultvfs import FaultVFS, quiet_vfs_errors, recover_wal, sqlite_view

MODELS: tuple[str, ...] = ("drop", "random", "garbage", "prefix")
#: Not swept by default: "torn" turns every unsynced data write into garbage (and drops
#: every unsynced directory entry) — the deterministic worst case of "garbage".
EXTRA_MODELS: tuple[str, ...] = ("torn",)
SQLITE_KINDS = frozenset({"db-write", "db-sync", "db-truncate"})
BLOB_KINDS = frozenset({"write", "fsync", "rename", "dirfsync", "unlink", "mkdir"})
WS_KINDS = frozenset({"ws-write", "ws-fsync", "ws-rename", "ws-hide", "ws-dirfsync", "ws-unlink",
                      "ws-mkdir", "ws-rmdir"})
ALL_KINDS = SQLITE_KINDS | BLOB_KINDS | WS_KINDS
SYNC_KINDS = frozenset({"db-sync", "fsync", "dirfsync", "ws-fsync", "ws-dirfsync"})
WRITE_KINDS = frozenset({"db-write", "write", "ws-write"})

_DIR = "<dir>"


def scratch_root() -> str:
    """/dev/shm when writable (fsync is nearly free there), else the temp dir."""
    for cand in (os.environ.get("STEPTRAIL_SCRATCH"), "/dev/shm"):
        if cand and os.path.isdir(cand) and os.access(cand, os.W_OK):
            return cand
    return tempfile.gettempdir()


class PowerLost(OSError):
    """Raised by every operation at and after the crash point (the machine is off)."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "power lost (simulated)")


# --- the disk ------------------------------------------------------------------------


@dataclass
class Fault:
    """The `at`-th operation whose kind is in `kinds` fails (every later one too if
    `persistent`). `error`: "eio" (SQLITE_IOERR_* / EIO) or "full" (SQLITE_FULL / ENOSPC)."""

    kinds: frozenset[str] | set[str] | Sequence[str]
    at: int = 1
    persistent: bool = False
    error: str = "eio"
    target: str | None = None  # only operations on this exact path (file or directory)
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        self.kinds = frozenset(self.kinds)
        unknown = set(self.kinds) - ALL_KINDS
        if unknown:
            raise ValueError(f"unknown operation kinds {sorted(unknown)}")
        if self.error not in ("eio", "full"):
            raise ValueError("error must be 'eio' or 'full'")

    def check(self, kind: str, target: str = "") -> str | None:
        if kind not in self.kinds or (self.target is not None and target != self.target):
            return None
        self.seen += 1
        if self.seen == self.at or (self.persistent and self.seen > self.at):
            self.fired += 1
            return self.error
        return None


@dataclass
class _Pending:
    seq: int
    target: tuple[str, Any]  # ("sql", path) | ("ino", ino) | ("dir", dirpath)
    op: tuple[Any, ...]  # data: (off, bytes) | ("T", size); dir: ("link", path, ino|DIR) | ("unlink", path)


class PowerLossDisk:
    """The simulated platter under one run (see the module docstring)."""

    def __init__(
        self,
        *,
        crash_at: int | None = None,
        model: str = "drop",
        seed: int = 0,
        faults: Iterable[Fault] = (),
        quota: int | None = None,
        real_fsync: bool = False,
    ) -> None:
        if model not in MODELS + EXTRA_MODELS:
            raise ValueError(f"model {model!r} is not one of {MODELS + EXTRA_MODELS}")
        self.crash_at, self.model, self.seed = crash_at, model, seed
        self.rng = random.Random(seed)
        self.faults = list(faults)
        self.quota, self.written = quota, 0
        self.real_fsync = real_fsync
        self.ops = 0
        self.trace: list[str] = []
        self.targets: list[str] = []  # per operation: the file or directory it touched ("" unknown)
        self.failed: list[tuple[int, str, str]] = []  # (op index, kind, error)
        self.crashed = False
        self._seq = itertools.count()
        # durable content: SQLite files by path, blob-store files by inode
        self.sql: dict[str, bytearray | None] = {}
        self.ino: dict[int, bytearray] = {}
        self.pending: dict[tuple[str, Any], list[_Pending]] = {}
        # blob-store namespace: path -> inode or _DIR, durable and current
        self.ns: dict[str, int | str] = {}
        self.ns_now: dict[str, int | str] = {}
        self.lost_fsyncs = 0
        #: Negative control: a failed xSync / fsync is reported as success (what a retry
        #: of fsync after EIO does on Linux: the pages were marked clean). Never set it
        #: outside a negative control.
        self.swallow_sync_errors = False
        #: Negative control: a write past the quota silently does nothing and reports
        #: success (a lost write), instead of SQLITE_FULL / ENOSPC.
        self.swallow_full = False
        self.swallowed = 0
        self.image: tuple[dict[str, bytes | None], dict[str, int | str], dict[int, bytes]] | None = None

    # -- counting, faults, the crash -------------------------------------------------

    def tick(self, kind: str, target: str = "") -> str | None:
        """Count one operation; return None (go on), "eio" or "full" (fail it), or raise
        PowerLost (the crash point, or any operation after it)."""
        if self.crashed:
            raise PowerLost()
        self.ops += 1
        self.trace.append(kind)
        self.targets.append(target)
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.freeze()
            raise PowerLost()
        verdict = None
        for fault in self.faults:
            v = fault.check(kind, target)
            if v is not None and verdict is None:
                verdict = v
        if verdict is not None:
            self.failed.append((self.ops, kind, verdict))
        return verdict

    def charge(self, nbytes: int) -> bool:
        """Account a write against the quota; False when it does not fit."""
        if self.quota is not None and self.written + nbytes > self.quota:
            return False
        self.written += nbytes
        return True

    def _pend(self, target: tuple[str, Any], op: tuple[Any, ...]) -> None:
        self.pending.setdefault(target, []).append(_Pending(next(self._seq), target, op))

    def _durable(self, target: tuple[str, Any]) -> None:
        """An fsync of `target` succeeded: its pending operations are on the platter."""
        for p in self.pending.pop(target, []):
            self._apply_durable(p)

    def _lose(self, target: tuple[str, Any]) -> None:
        """An fsync of `target` failed: its pending writes are lost (pages marked clean)."""
        if self.pending.pop(target, None):
            self.lost_fsyncs += 1

    def _apply_durable(self, p: _Pending) -> None:
        kind, key = p.target
        if kind == "sql":
            self.sql[key] = _apply_data(self.sql.get(key), p.op)
        elif kind == "ino":
            self.ino[key] = _apply_data(self.ino.get(key, bytearray()), p.op)
        else:
            _apply_ns(self.ns, p.op)

    def freeze(self) -> None:
        """Power loss now: fix what the platter holds (durable + a subset of pending)."""
        if self.image is not None:
            self.crashed = True
            return
        self.crashed = True
        sql = {p: (None if d is None else bytearray(d)) for p, d in self.sql.items()}
        ino = {i: bytearray(d) for i, d in self.ino.items()}
        ns = dict(self.ns)
        allp = sorted((p for ps in self.pending.values() for p in ps), key=lambda p: p.seq)
        cut = self.rng.randint(0, len(allp)) if self.model == "prefix" else len(allp)
        for i, p in enumerate(allp):
            kind, key = p.target
            if self.model == "drop":
                break
            if self.model == "prefix":
                if i >= cut:
                    break
                keep = True
            elif self.model == "torn":
                if kind == "dir" or p.op[0] == "T":
                    continue
                off, data = p.op
                p = _Pending(p.seq, p.target, (off, self.rng.randbytes(len(data))))
                keep = True
            else:
                r = self.rng.random()
                keep = r < 0.5
                if not keep and self.model == "garbage" and r > 0.75 and kind != "dir" \
                        and p.op[0] != "T":
                    off, data = p.op
                    p = _Pending(p.seq, p.target, (off, self.rng.randbytes(len(data))))
                    keep = True
            if not keep:
                continue
            if kind == "sql":
                sql[key] = _apply_data(sql.get(key), p.op)
            elif kind == "ino":
                ino[key] = _apply_data(ino.get(key, bytearray()), p.op)
            else:
                _apply_ns(ns, p.op)
        self.image = ({p: None if d is None else bytes(d) for p, d in sql.items()}, ns,
                      {i: bytes(d) for i, d in ino.items()})

    def materialize(self, src_root: str, dst_root: str) -> None:
        """Write what the platter holds (every file below `src_root` this disk tracked)
        below `dst_root`. Without a crash: everything made durable so far."""
        if self.image is not None:
            sql, ns, ino = self.image
        else:
            sql = {p: None if d is None else bytes(d) for p, d in self.sql.items()}
            ns, ino = dict(self.ns), {i: bytes(d) for i, d in self.ino.items()}
        src_root = os.path.abspath(src_root)
        os.makedirs(dst_root, exist_ok=True)
        for path, data in sql.items():
            if data is None or path.endswith("-shm") or not _below(path, src_root):
                continue
            out = os.path.join(dst_root, os.path.relpath(path, src_root))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(data)
        for path in sorted(ns):
            if not _below(path, src_root) or not _reachable(ns, path, src_root):
                continue
            out = os.path.join(dst_root, os.path.relpath(path, src_root))
            if ns[path] == _DIR:
                os.makedirs(out, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(ino.get(ns[path], b""))  # type: ignore[arg-type]

    # -- the SQLite side (called by the store's fault VFS, `FaultVFS`) -------------

    def sql_opened(self, path: str) -> None:
        if path not in self.sql:
            try:
                with open(path, "rb") as f:
                    self.sql[path] = bytearray(f.read())
            except FileNotFoundError:
                self.sql[path] = None

    def sql_deleted(self, path: str) -> None:
        if not self.crashed:
            self.sql[path] = None
            self.pending.pop(("sql", path), None)

    def sql_op(self, kind: str, path: str, nbytes: int = 0) -> str | None:
        """Count one SQLite file operation (``db-write`` of `nbytes`, ``db-sync``,
        ``db-truncate``): None (do it), "skip" (a negative control swallowed its failure:
        report success, do nothing), "eio" or "full" (fail it); PowerLost at the crash."""
        verdict = self.tick(kind, path)
        if verdict is not None:
            if kind == "db-sync":
                self._lose(("sql", path))
                if self.swallow_sync_errors:  # negative control: "retried into success"
                    self.swallowed += 1
                    return "skip"
            return verdict
        if kind == "db-write" and not self.charge(nbytes):
            self.failed.append((self.ops, "db-write", "full"))
            if self.swallow_full:
                self.swallowed += 1
                return "skip"
            return "full"
        return None

    def sql_written(self, path: str, offset: int, data: bytes) -> None:
        self._pend(("sql", path), (offset, data))

    def sql_truncated(self, path: str, size: int) -> None:
        self._pend(("sql", path), ("T", size))

    def sql_synced(self, path: str) -> None:
        self._durable(("sql", path))

    # -- the blob-store side (called by PowerLossFileOps) ----------------------------

    def adopt_tree(self, root: str) -> None:
        """Everything already below `root` (and `root` itself) is durable."""
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            return
        self.ns[root] = self.ns_now[root] = _DIR
        for dp, dns, fns in os.walk(root):
            for n in dns:
                p = os.path.join(dp, n)
                self.ns[p] = self.ns_now[p] = _DIR
            for n in fns:
                p = os.path.join(dp, n)
                st = os.lstat(p)
                with open(p, "rb") as f:
                    self.ino[st.st_ino] = bytearray(f.read())
                self.ns[p] = self.ns_now[p] = st.st_ino

    def _register(self, path: str, ino: int) -> None:
        """A file we see for the first time was created by a plain open (O_CREAT)."""
        if self.ns_now.get(path) != ino:
            self.ns_now[path] = ino
            self.ino.setdefault(ino, bytearray())
            self._pend(("dir", os.path.dirname(path)), ("link", path, ino))


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _reachable(ns: dict[str, int | str], path: str, root: str) -> bool:
    parent = os.path.dirname(path)
    while _below(parent, root) and parent != root:
        if ns.get(parent) != _DIR:
            return False
        parent = os.path.dirname(parent)
    return True


def _apply_data(buf: bytearray | None, op: tuple[Any, ...]) -> bytearray:
    buf = bytearray() if buf is None else buf
    if op[0] == "T":
        del buf[op[1]:]
        return buf
    off, data = op
    if len(buf) < off:
        buf.extend(b"\0" * (off - len(buf)))
    buf[off:off + len(data)] = data
    return buf


def _apply_ns(ns: dict[str, int | str], op: tuple[Any, ...]) -> None:
    if op[0] == "link":
        ns[op[1]] = op[2]
    elif op[0] == "unlink":
        ns.pop(op[1], None)


# --- the blob-store side: the FileOps seam -------------------------------------------


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _os_error(verdict: str, what: str) -> OSError:
    code = errno.ENOSPC if verdict == "full" else errno.EIO
    return OSError(code, os.strerror(code) + f" (injected: {what})")


class PowerLossFileOps(FileOps):
    """`FileOps` whose effects are tracked by `disk` (and whose operations can fail).

    `tick` (the workspace directory's hook) counts and can fail operations it does not
    see the effects of. `skip` names operations to turn into no-ops (negative controls:
    ``{"dirfsync"}`` drops every directory fsync, ``{"fsync"}`` every file fsync) — they
    are still counted, they just make nothing durable.
    """

    def __init__(self, disk: PowerLossDisk, *, skip: Iterable[str] = (),
                 on_op: Callable[[str], None] | None = None) -> None:
        super().__init__(on_op)
        self.disk = disk
        self.skip = frozenset(skip)

    def _check(self, kind: str, target: str = "") -> None:
        if self.on_op is not None:
            self.on_op(kind)
        verdict = self.disk.tick(kind, target)  # PowerLost propagates: an OSError (EIO)
        if verdict is not None:
            raise _os_error(verdict, kind)

    def tick(self, name: str) -> None:
        """Workspace operations (``ws-*``): counted, may fail, effects not modelled."""
        self._check(name)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        disk = self.disk
        path = _fd_path(fd)
        self._check("write", path)
        if not disk.charge(len(data)):
            disk.failed.append((disk.ops, "write", "full"))
            if disk.swallow_full:
                disk.swallowed += 1
                return len(data)
            raise _os_error("full", "write")
        st = os.fstat(fd)
        disk._register(path, st.st_ino)
        off = os.lseek(fd, 0, os.SEEK_CUR)
        n = os.write(fd, data)
        disk._pend(("ino", st.st_ino), (off, bytes(data[:n])))
        return n

    def fsync(self, fd: int) -> None:
        st = os.fstat(fd)
        try:
            self._check("fsync", _fd_path(fd))
        except PowerLost:
            raise
        except OSError:
            self.disk._lose(("ino", st.st_ino))  # the fsyncgate semantics
            if self.disk.swallow_sync_errors:  # negative control: "retried into success"
                self.disk.swallowed += 1
                return
            raise
        if "fsync" in self.skip:
            return
        self.disk._register(_fd_path(fd), st.st_ino)
        if self.disk.real_fsync:
            os.fsync(fd)
        self.disk._durable(("ino", st.st_ino))

    def dirfsync(self, fd: int) -> None:
        self._check("dirfsync", _fd_path(fd))
        if "dirfsync" in self.skip:
            return
        if self.disk.real_fsync:
            os.fsync(fd)
        self.disk._durable(("dir", _fd_path(fd)))

    def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        sdir, ddir = _fd_path(src_dir_fd), _fd_path(dst_dir_fd)
        self._check("rename", os.path.join(ddir, dst))
        spath, dpath = os.path.join(sdir, src), os.path.join(ddir, dst)
        ino = os.stat(src, dir_fd=src_dir_fd, follow_symlinks=False).st_ino
        self.disk._register(spath, ino)
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        self.disk.ns_now.pop(spath, None)
        self.disk.ns_now[dpath] = ino
        self.disk._pend(("dir", ddir), ("link", dpath, ino))
        self.disk._pend(("dir", sdir), ("unlink", spath))

    def unlink(self, name: str, dir_fd: int) -> None:
        d = _fd_path(dir_fd)
        self._check("unlink", os.path.join(d, name))
        os.unlink(name, dir_fd=dir_fd)
        self.disk.ns_now.pop(os.path.join(d, name), None)
        self.disk._pend(("dir", d), ("unlink", os.path.join(d, name)))

    def mkdir(self, name: str, dir_fd: int) -> None:
        d = _fd_path(dir_fd)
        self._check("mkdir", os.path.join(d, name))
        os.mkdir(name, BLOB_DIR_MODE, dir_fd=dir_fd)
        self.disk.ns_now[os.path.join(d, name)] = _DIR
        self.disk._pend(("dir", d), ("link", os.path.join(d, name), _DIR))


class FailingFileOps(FileOps):
    """Plain `FileOps` (real I/O, nothing modelled) whose operations fail per `faults`
    — for tests that need ENOSPC or EIO on blob and workspace writes and nothing else."""

    def __init__(self, faults: Iterable[Fault], on_op: Callable[[str], None] | None = None) -> None:
        super().__init__(on_op)
        self.faults = list(faults)
        self.trace: list[str] = []
        self.targets: list[str] = []  # per operation: the file or directory it touched ("" unknown)
        self.failed: list[str] = []

    def tick(self, name: str) -> None:
        super().tick(name)
        self.trace.append(name)
        for fault in self.faults:
            verdict = fault.check(name)
            if verdict is not None:
                self.failed.append(name)
                raise _os_error(verdict, name)


# --- Jepsen bookkeeping --------------------------------------------------------------


@dataclass
class Op:
    key: str
    acked: bool = False
    error: str = ""
    observable: bool = True  # False: leaves nothing to count (a rebuild)


@dataclass
class Verdict:
    """Jepsen's classification of one history against what a recovered ledger holds."""

    lost: list[str] = field(default_factory=list)  # acknowledged, gone: must be empty
    recovered: list[str] = field(default_factory=list)  # indeterminate, present
    unexpected: list[str] = field(default_factory=list)  # present, never attempted
    duplicated: list[str] = field(default_factory=list)  # present more than once
    acked: int = 0
    present: int = 0
    attempted: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.duplicated)


class History:
    """Operations attempted (the call started) and acknowledged (the call returned)."""

    def __init__(self) -> None:
        self.ops: dict[str, Op] = {}

    @contextlib.contextmanager
    def op(self, key: str, *, observable: bool = True) -> Iterator[Op]:
        op = self.ops.setdefault(key, Op(key, observable=observable))
        try:
            yield op
        except BaseException as exc:
            op.error = op.error or f"{type(exc).__name__}: {exc}"
            raise
        op.acked = True

    def acked(self) -> set[str]:
        return {k for k, o in self.ops.items() if o.acked}


def classify(history: History, observed: dict[str, int]) -> Verdict:
    v = Verdict()
    for key, op in history.ops.items():
        if not op.observable:
            continue
        copies = observed.get(key, 0)
        v.attempted += 1
        v.acked += op.acked
        v.present += copies > 0
        if op.acked and copies == 0:
            v.lost.append(key)
        if not op.acked and copies > 0:
            v.recovered.append(key)
        if copies > 1:
            v.duplicated.append(key)
    v.unexpected = sorted(k for k, n in observed.items() if n and k not in history.ops)
    return v


# --- a run's world ---------------------------------------------------------------------

START_NS = 2_100_000_000_000_000_000  # 2036: after any real file mtime, so GC sees age


class Clock:
    """Strictly increasing fake nanoseconds (the ledger never reads wall time here)."""

    def __init__(self, start_ns: int = START_NS, step_ns: int = 1_000) -> None:
        self.now, self.step_ns = start_ns, step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now


@dataclass
class Env:
    """One run: a directory, a disk (None: the ordinary one), how to open the ledger."""

    root: str
    disk: PowerLossDisk | None = None
    vfs: str | None = None
    ops: FileOps | None = None
    synchronous: str = "FULL"
    clock: Clock = field(default_factory=Clock)
    history: History = field(default_factory=History)
    ws_root: str = ""  # the workspace directory (outside the modelled storage)
    retries: int = 0  # in-process retries of a failed operation (I/O-error runs)
    ledger: Ledger | None = None
    untyped: list[str] = field(default_factory=list)  # failures that were not a LedgerError

    @property
    def path(self) -> str:
        return os.path.join(self.root, "ledger.db")

    def open(self) -> Ledger:
        """Ledger.init (creates or opens) through this run's VFS and file ops."""
        if self.ledger is not None:
            return self.ledger
        ledger = Ledger.init(self.path, vfs=self.vfs, synchronous=self.synchronous,  # type: ignore[arg-type]
                             clock=self.clock)
        if self.ops is not None:
            ledger.blobs = BlobStore(ledger.blobs.root, self.ops)
        self.ledger = ledger
        return ledger

    def close(self) -> None:
        if self.ledger is not None:
            try:
                self.ledger.close()
            except LedgerError:
                pass
            except Exception as exc:  # noqa: BLE001
                if not self.dead:
                    self.untyped.append(f"close: {type(exc).__name__}: {exc}")
            self.ledger = None

    @property
    def dead(self) -> bool:
        return self.disk is not None and self.disk.crashed

    def do(self, key: str, fn: Callable[[Ledger], Any], *, observable: bool = True) -> bool:
        """Run one operation of the workload under `key`; True if it was acknowledged.
        A failure is recorded; with `retries`, the same operation is retried in-process
        (the client retrying), and once the machine is off nothing runs any more."""
        for attempt in range(self.retries + 1):
            if self.dead:
                return False
            phase = "open"
            try:
                with self.history.op(key, observable=observable):
                    led = self.open()  # Ledger.init: also after an init that failed
                    phase = key
                    fn(led)
                return True
            except Exception as exc:  # noqa: BLE001 - recorded and classified by the caller
                if not isinstance(exc, LedgerError) and not self.dead:
                    self.untyped.append(f"{phase}: {type(exc).__name__}: {exc}")
        return False


# --- the workload ----------------------------------------------------------------------


def _blob(tag: str, size: int) -> bytes:
    seed = hashlib.sha256(tag.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@dataclass
class StandardWorkload:
    """init, appends, an artifact step (inline + file blobs), a compensated step whose
    blobs become orphans, a workspace step, a rebuild, a GC run, more appends.

    Idempotent by id: running it again on a recovered ledger is the replay.
    """

    appends: int = 3
    late_appends: int = 2
    #: False: the ledger file is created (with the ordinary VFS) before the disk starts,
    #: so no crash point falls inside `Ledger.init` (see test_regression_crash_inside_init_*).
    include_init: bool = True
    #: True: the client acks the artifact step itself after `run_step` (a replay of a
    #: committed, unacked step does not ack it; see test_regression_replayed_commit_*).
    client_acks: bool = True
    workspace: bool = True
    rebuild: bool = True
    gc: bool = True
    small: int = 3_000  # inline (<= 64 KiB)
    large: int = 100_000  # blob file

    def __post_init__(self) -> None:
        self.art = {"log.txt": _blob("log", self.small), "report.bin": _blob("report", self.large),
                    "trace.bin": _blob("trace", self.large - 7)}
        self.doomed = {"note.txt": _blob("note", self.small + 11),
                       "scratch.bin": _blob("scratch", self.large + 13)}
        self.doomed_digests = sorted(hashlib.sha256(b).hexdigest() for b in self.doomed.values())
        self.ws_v0, self.ws_v1 = b"v0\n", _blob("app-v1", self.large + 29)

    # keys, in order
    def keys(self) -> list[str]:
        out = ["init", *(f"append:{i}" for i in range(self.appends)), "step:art", "compensate:doomed"]
        if self.workspace:
            out.append("ws:wstep")
        if self.rebuild:
            out.append("rebuild")
        if self.gc:
            out.append("gc")
        out += [f"append:{i}" for i in range(self.appends, self.appends + self.late_appends)]
        return out

    def prepare(self, root: str) -> str:
        """What exists before the disk starts (not modelled): the workspace directory."""
        ws = os.path.realpath(os.path.join(root, "ws"))
        os.makedirs(ws, exist_ok=True)
        if not self.include_init and not os.path.exists(os.path.join(root, "ledger.db")):
            Ledger.init(os.path.join(root, "ledger.db"), clock=Clock()).close()
        if not os.path.exists(os.path.join(ws, "app.py")):
            with open(os.path.join(ws, "app.py"), "wb") as f:
                f.write(self.ws_v0)
        return ws

    def run(self, env: Env) -> None:
        env.do("init", lambda led: None)
        for i in range(self.appends):
            env.do(f"append:{i}", lambda led, i=i: led.append(Planned(step=f"app-{i}", attempt=1, run="r")))
        env.do("step:art", self._art)
        env.do("compensate:doomed", self._doomed)
        if self.workspace:
            env.do("ws:wstep", lambda led: self._wstep(led, env.ws_root))
        if self.rebuild:
            env.do("rebuild", lambda led: led.rebuild(), observable=False)
        if self.gc:
            # only a GC that ran after the doomed step ended has orphans to collect
            doomed = env.history.ops.get("compensate:doomed")
            env.do("gc", lambda led: collect(led, grace_s=0, force=True),
                   observable=doomed is not None and doomed.acked)
        for i in range(self.appends, self.appends + self.late_appends):
            env.do(f"append:{i}", lambda led, i=i: led.append(Planned(step=f"app-{i}", attempt=1, run="r")))

    def _art(self, led: Ledger) -> None:
        result = run_step(led, "art", self.art, run="r")
        if self.client_acks:
            led.ack("art", result.attempt)

    def _doomed(self, led: Ledger) -> None:
        row = led.find_step("doomed")
        if row is not None and row.state in ENDED:
            return
        row = led.plan("doomed", run="r", artifacts=tuple(self.doomed))
        for path in sorted(self.doomed):
            led.store("doomed", row.attempt, path, self.doomed[path])
        led.workspaces.compensate("doomed", reason="the tests failed")

    def _wstep(self, led: Ledger, ws: str) -> None:
        led.workspaces.add("w", ws)
        row = led.workspaces.get("w")
        epoch = row.live_epoch(led.clock())
        if epoch is None:
            epoch = led.workspaces.acquire("w", "agent", ttl_s=24 * 3600).epoch
        pre = hashlib.sha256(self.ws_v0).hexdigest()
        led.workspaces.admit("w", epoch, [StepPlan("wstep", [Write("app.py", self.ws_v1, pre)], run="r")])
        step = led.step("wstep")
        if not step.live:
            verdict = led.workspaces.apply("wstep", epoch=epoch).verdict
            if verdict not in ("applied", "deduped"):
                raise AssertionError(f"workspace step: apply said {verdict}")
            led.publish("wstep")
        led.ack("wstep")

    def observe(self, led: Ledger, known: list[str] | None = None) -> dict[str, int]:
        """Key -> how many copies of its effect the ledger holds. A known bug met on the
        way is appended to `known` (and not counted as a duplicate)."""
        out: dict[str, int] = {"init": 1}
        planned: dict[str, int] = {}
        published: dict[str, int] = {}
        compensated: dict[str, int] = {}
        collected: dict[str, int] = {}
        for r in led.read():
            e = r.event
            kind = r.kind
            step = getattr(e, "step", None)
            if kind == "planned":
                planned[step] = planned.get(step, 0) + 1
            elif kind == "manifest-published":
                published[step] = published.get(step, 0) + 1
            elif kind == "compensated":
                compensated[step] = compensated.get(step, 0) + 1
            elif kind == "blob-collected":
                collected[e.digest] = collected.get(e.digest, 0) + 1
        for step, n in planned.items():
            if step.startswith("app-"):
                out[f"append:{step[4:]}"] = n
            elif step not in ("art", "doomed", "wstep"):
                out[f"unknown-step:{step}"] = n
        out["step:art"] = published.get("art", 0)
        out["compensate:doomed"] = compensated.get("doomed", 0)
        if self.workspace:
            out["ws:wstep"] = published.get("wstep", 0)
        if self.gc:
            counts = [collected.get(d, 0) for d in self.doomed_digests]
            out["gc"] = 0 if min(counts) == 0 else max(counts)
            if out["gc"] > 1 and known is not None:
                known.append("gc-double-collect")
                out["gc"] = 1
        return out

    def committed_steps(self) -> list[str]:
        return ["art", "wstep"] if self.workspace else ["art"]


def run_with_disk(disk: PowerLossDisk, root: str, fn: Callable[[Env], Any], *,
                  skip: Iterable[str] = (), synchronous: str = "FULL") -> Env:
    """Run `fn(env)` against a ledger at `root`/ledger.db whose SQLite files and blob
    store live on `disk` (the building block for custom scenarios and state machines).
    The ledger is closed afterwards; `disk.freeze()` + `disk.materialize(root, image)`
    then give what a power loss leaves."""
    disk.adopt_tree(os.path.join(root, "blobs"))
    with quiet_vfs_errors(), FaultVFS(disk) as vfs:
        env = Env(root, disk, vfs.name, PowerLossFileOps(disk, skip=skip), synchronous=synchronous)
        try:
            fn(env)
        finally:
            env.close()
    return env


# --- one point: run, lose power, recover, check, replay, check -----------------------


@dataclass
class PointResult:
    label: str
    ops: int
    crashed: bool
    verdict: Verdict
    problems: list[str]
    replay: Verdict | None = None
    failed_ops: list[tuple[int, str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lost_fsyncs: int = 0
    known: list[str] = field(default_factory=list)  # KNOWN_BUGS met (and worked around)

    @property
    def ok(self) -> bool:
        return not self.problems


def i9_problems(led: Ledger) -> list[str]:
    """I9: every workspace path's committed content is a retrievable blob."""
    committed = CommittedFold()
    for r in led.read():
        committed.feed(r.event)
    problems = []
    for (ws, path), digest in sorted(committed.committed.items()):
        if digest is not None:
            try:
                led.read_blob(digest)
            except LedgerError as exc:
                problems.append(f"I9 {ws}:{path}: {type(exc).__name__}: {exc}")
    return problems


def audit_problems(led: Ledger) -> list[str]:
    """The deep byte audit: nothing dangling or corrupt, every byte in one bucket."""
    a = audit(led, deep=True)
    if a.ok:
        return []
    return [f"audit: dangling={a.dangling[:3]} corrupt={a.corrupt[:3]}"
            f" problems={a.problems[:3]} reconciled={a.reconciled}"]


def check_ledger(led: Ledger, workload: StandardWorkload, *, after_replay: bool) -> list[str]:
    """verify (chain, seq, projections == rebuild, I3/I4/I5, I1 durability), classify
    every step, I9 (each workspace path's committed content readable), GC audit --deep
    (no dangling or corrupt blob, every byte in one bucket): every finding as a string."""
    problems: list[str] = []
    rep = led.verify()
    if not rep.ok:
        problems += [f"verify: {f.check} #{f.seq}: {f.message}" for f in rep.findings[:5]]
    for s in led.steps():
        c = led.classify(s.step_id)
        if c.startswith("VIOLATION"):
            problems.append(f"I1 {s.step_id}: {c}")
    problems += i9_problems(led)
    problems += audit_problems(led)
    if after_replay:
        for step in workload.committed_steps():
            c = led.classify(step)
            if c != "committed":
                problems.append(f"replay: step {step} is {c}, not committed")
        temps = [t.name for t in led.blobs.temp_files()]
        if temps:
            problems.append(f"replay+gc left temporary files: {temps}")
    return problems


#: Bugs in ledger/ the sweeps met, each fixed since and kept as a test_regression_* test.
#: A sweep point that meets one again records it (`PointResult.known`; the tests fail on
#: it), works around it the way an operator would, and goes on checking everything else.
KNOWN_BUGS = {
    "header-in-wal": "Ledger.open refuses (NotALedger) a file whose page 1 was torn by an"
                     " interrupted checkpoint, though SQLite recovers it from the -wal"
                     " (test_regression_torn_checkpoint_header_refused)",
    "dirfsync-retry-trusted": "a blob whose rename (or whose store directory's creation)"
                              " was never made durable — its directory fsync failed — is"
                              " trusted by the retry, which only checks that the name exists;"
                              " after power loss the manifest names a missing blob"
                              " (test_regression_admit_retry_trusts_a_post_image_rename_that_is_not_durable,"
                              " test_regression_blob_root_entry_never_made_durable_after_failed_dirfsync)",
    "gc-double-collect": "GC records blob-collected for a blob whose unlink was never made"
                         " durable; after power loss the file is back and the next GC"
                         " records it again (test_regression_gc_records_a_collection_that_is_not_durable)",
    "close-untyped": "Ledger.close lets the SQLite driver's IOError / FullError escape when"
                     " the closing checkpoint fails (test_regression_close_lets_an_untyped_driver_error_escape)",
    "init-untyped": "an I/O error inside Ledger.init escapes as the SQLite driver's SQLError"
                    " ('cannot rollback - no transaction is active') or IOError"
                    " (test_regression_io_error_inside_init_escapes_untyped)",
}


#: Outcomes a sweep may meet that are not bugs (recorded like KNOWN_BUGS, never a failure).
KNOWN_BENIGN = {
    "init-torn": "power loss inside an init that never returned tore the new file's first,"
                 " never-synced page: init refuses a file that is not SQLite at all (fail"
                 " closed: it cannot tell it from a foreign file); nothing was acknowledged,"
                 " an operator deletes it",
}


def _open_after_crash(path: str, clock: Clock, init_acked: bool,
                      problems: list[str], known: list[str]) -> Ledger | None:
    """Ledger.open (read-write: catches projections up); the two known refusals are
    recorded and worked around; anything else refused is a problem if init was acked."""
    try:
        return Ledger.open(path, clock=clock)
    except (LedgerNotFound, NotALedger) as exc:
        view = sqlite_view(path)
        if view is not None and view["quick_check"] == "ok" and view["schema"] > 0 \
                and view["application_id"] == 0x53544C47 and isinstance(exc, NotALedger):
            known.append("header-in-wal")
            recover_wal(path)  # what an operator would do: let SQLite recover it
            try:
                return Ledger.open(path, clock=clock)
            except LedgerError as again:
                problems.append(f"reopen failed even after SQLite recovered the file: {again}")
                return None
        if init_acked:
            problems.append(f"lost the ledger after an acknowledged init: {exc}")
            return None
        try:  # a crash inside init: init must be able to finish the job
            Ledger.init(path, clock=clock).close()
        except NotALedger as again:
            if view is None and "not a SQLite database" in again.why:
                known.append("init-torn")
            else:
                problems.append(f"init refuses what a crash inside init left: {again}")
                return None
            for suffix in ("", "-wal", "-shm"):  # what an operator does: start over
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)
        except LedgerError as again:
            problems.append(f"init after a crash inside init failed: {again}")
        return None
    except LedgerError as exc:
        problems.append(f"reopen failed: {type(exc).__name__}: {exc}")
        return None


def check_recovery(env: Env, image_root: str, workload: StandardWorkload,
                   known: list[str] | None = None) -> tuple[Verdict, list[str], Verdict | None]:
    """Reopen the platter's image with the ordinary VFS, check it, replay, check again."""
    problems: list[str] = []
    known = known if known is not None else []
    path = os.path.join(image_root, "ledger.db")
    clock = Clock(env.clock.now + 10_000_000_000)
    init_acked = env.history.ops.get("init", Op("init")).acked
    observed: dict[str, int] = {}
    led = _open_after_crash(path, clock, init_acked, problems, known)
    if led is not None:
        try:
            problems += check_ledger(led, workload, after_replay=False)
            observed = workload.observe(led, known)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"check raised {type(exc).__name__}: {exc}")
        finally:
            led.close()
    verdict = classify(env.history, observed)
    if verdict.lost:
        problems.append(f"lost acknowledged: {verdict.lost}")
    if verdict.duplicated:
        problems.append(f"duplicated: {verdict.duplicated}")
    if verdict.unexpected:
        problems.append(f"unexpected: {verdict.unexpected}")
    if any(p.startswith(("reopen failed", "lost the ledger", "init ")) for p in problems):
        return verdict, problems, None
    # replay: the same workload, ordinary VFS, no faults; every operation must commit
    renv = Env(image_root, clock=clock, ws_root=env.ws_root)
    try:
        workload.run(renv)
        led2 = renv.open()
        problems += check_ledger(led2, workload, after_replay=True)
        replay = classify(renv.history, workload.observe(led2, known))
    except Exception as exc:  # noqa: BLE001
        problems.append(f"replay raised {type(exc).__name__}: {exc}")
        replay = None
    finally:
        renv.close()
    if replay is not None:
        failed = [k for k, o in renv.history.ops.items() if not o.acked]
        if failed:
            problems.append("replay failed: " + "; ".join(
                f"{k}: {renv.history.ops[k].error}" for k in failed[:3]))
        if replay.duplicated or replay.lost or replay.unexpected:
            problems.append(f"after replay: lost={replay.lost} duplicated={replay.duplicated}"
                            f" unexpected={replay.unexpected}")
    return verdict, problems, replay


def run_point(
    workload: StandardWorkload,
    disk: PowerLossDisk,
    scratch: str,
    *,
    label: str = "",
    synchronous: str = "FULL",
    skip: Iterable[str] = (),
    retries: int = 0,
    check: Callable[..., tuple[Verdict, list[str], Verdict | None]] | None = None,
    restart: bool = False,
    after: Callable[[Env], None] | None = None,
    keep: bool = False,
) -> PointResult:
    """Run `workload` on `disk` in a fresh directory under `scratch`, then check what
    survives a power loss — at the crash point, or right after the workload if it did
    not crash: what the platter holds is materialized beside the run and reopened.

    `restart`: also check the live files (a process restart without power loss: the
    page cache is the truth), with the workspace directory as the workload left it.
    `after(env)` runs once the workload is done, in the same process and connection
    (e.g. free the disk and run the workload again: the ledger must stay usable).
    """
    run_root = tempfile.mkdtemp(prefix="run-", dir=scratch)
    image = run_root + "-img"
    try:
        ws_root = workload.prepare(run_root)
        disk.adopt_tree(os.path.join(run_root, "blobs"))
        ops = PowerLossFileOps(disk, skip=skip)
        with quiet_vfs_errors(), FaultVFS(disk) as vfs:
            env = Env(run_root, disk, vfs.name, ops, synchronous=synchronous, retries=retries,
                      ws_root=ws_root)
            try:
                workload.run(env)
                if after is not None:
                    after(env)
            finally:
                env.close()
        crashed = disk.crashed
        disk.freeze()
        disk.materialize(run_root, image)
        if restart:
            shutil.copytree(ws_root, ws_root + ".snap", symlinks=True)
        known: list[str] = []
        verdict, problems, replay = (check or check_recovery)(env, image, workload, known)
        if restart:
            # back to the workspace as it was at the crash, in the same directory: a power
            # loss keeps a directory's device and inode, which the workspace's walk checks
            for entry in os.scandir(ws_root):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            shutil.copytree(ws_root + ".snap", ws_root, symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(ws_root + ".snap")
            v2, p2, _ = (check or check_recovery)(env, run_root, workload, known)
            problems += [f"after restart: {p}" for p in p2]
            verdict.lost += [f"restart:{k}" for k in v2.lost]
            verdict.duplicated += [f"restart:{k}" for k in v2.duplicated]
            verdict.unexpected += [f"restart:{k}" for k in v2.unexpected]
        problems = _known_dirfsync(disk, run_root, problems, known)
        for u in env.untyped:
            if u.startswith(("close: IOError", "close: FullError")):
                known.append("close-untyped")
            elif u.startswith(("open: SQLError", "open: IOError")):
                known.append("init-untyped")
            else:
                problems.append(f"untyped error: {u}")
        return PointResult(label, disk.ops, crashed, verdict, problems, replay,
                           list(disk.failed),
                           [o.error for o in env.history.ops.values() if o.error],
                           disk.lost_fsyncs, known)
    finally:
        if not keep:
            shutil.rmtree(run_root, ignore_errors=True)
            shutil.rmtree(run_root + "-img", ignore_errors=True)


_MISSING = re.compile(r"blob ([0-9a-f]{12})…(?:,)? (?:which )?is missing|'digest': '([0-9a-f]{12})"
                      r"|missing, e\.g\. ([0-9a-f]{12})")


def _known_dirfsync(disk: PowerLossDisk, run_root: str, problems: list[str],
                    known: list[str]) -> list[str]:
    """Set aside the durability violations explained by "dirfsync-retry-trusted": every
    blob found missing lives below a directory whose fsync failed in this run."""
    suspects = {disk.targets[i - 1] for i, kind, _ in disk.failed if kind == "dirfsync"}
    if not suspects:
        return problems
    blob_root = os.path.join(os.path.realpath(run_root), "blobs")
    fan_outs = {os.path.basename(t) for t in suspects if os.path.dirname(t) == blob_root}
    root_lost = os.path.realpath(run_root) in suspects
    keep = []
    for p in problems:
        ms = ["".join(groups) for groups in _MISSING.findall(p)]
        if ms and ("missing" in p or "dangling" in p) and \
                all(root_lost or m[:2] in fan_outs for m in ms):
            known.append("dirfsync-retry-trusted")
            continue
        keep.append(p)
    return keep


# --- sweeps ------------------------------------------------------------------------------


@dataclass
class SweepReport:
    """Per sweep: crash points covered and Jepsen's counts summed over them."""

    name: str
    total_ops: int = 0
    points: int = 0
    lost: int = 0
    recovered: int = 0
    unexpected: int = 0
    duplicated: int = 0
    crashed: int = 0
    failures: list[str] = field(default_factory=list)
    known: dict[str, int] = field(default_factory=dict)  # KNOWN_BUGS met: points per bug
    errors_seen: set[str] = field(default_factory=set)
    elapsed_s: float = 0.0

    def add(self, r: PointResult) -> None:
        self.points += 1
        self.lost += len(r.verdict.lost)
        self.recovered += len(r.verdict.recovered)
        self.unexpected += len(r.verdict.unexpected)
        self.duplicated += len(r.verdict.duplicated)
        self.crashed += r.crashed
        for e in r.errors:
            self.errors_seen.add(e.split(":")[0])
        for k in set(r.known):
            self.known[k] = self.known.get(k, 0) + 1
        if r.problems:
            self.failures.append(f"{r.label}: " + " | ".join(r.problems[:4]))

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    def line(self) -> str:
        return (f"{self.name}: {self.points} points over {self.total_ops} ops, lost={self.lost}"
                f" recovered={self.recovered} unexpected={self.unexpected}"
                f" duplicated={self.duplicated} failures={len(self.failures)}"
                + (f" known-bugs={self.known}" if self.known else "")
                + f" in {self.elapsed_s:.1f}s")


def count_ops(workload: StandardWorkload, scratch: str, **kwargs: Any) -> tuple[int, list[str]]:
    """Run the workload on a disk that never fails: how many operations, which kinds."""
    disk = PowerLossDisk()
    r = run_point(workload, disk, scratch, label="baseline", **kwargs)
    if r.problems:
        raise AssertionError(f"the fault-free baseline fails its own checks: {r.problems}")
    return disk.ops, list(disk.trace)


def point_seed(seed: int, model: str, k: int) -> int:
    """A stable per-point seed (Python's str hash is randomized per process)."""
    return zlib.crc32(f"{seed}:{model}:{k}".encode())


def sample_points(total: int, *, every: int = 1, seed: int = 0, n: int | None = None) -> list[int]:
    """Crash points 1..total+1 (the last one: after everything); every `every`-th, or a
    seeded subset of `n` (always including the first and the last)."""
    allp = list(range(1, total + 2))
    if n is not None and n < len(allp):
        rng = random.Random(seed)
        return sorted({1, total + 1, *rng.sample(allp, n)})
    return allp[::every] if every > 1 else allp


def crash_sweep(
    workload: StandardWorkload,
    *,
    models: Sequence[str] = MODELS,
    points: Callable[[int], Sequence[int]] | None = None,
    scratch: str | None = None,
    seed: int = 0,
    synchronous: str = "FULL",
    skip: Iterable[str] = (),
    name: str = "power-loss",
    progress: Callable[[PointResult], None] | None = None,
) -> list[SweepReport]:
    """Power loss at each chosen operation index, for each model; one report per model."""
    own = scratch is None
    scratch = scratch or tempfile.mkdtemp(prefix="faultfs-", dir=scratch_root())
    try:
        total, _ = count_ops(workload, scratch, synchronous=synchronous, skip=skip) \
            if not skip and synchronous in ("FULL", "EXTRA") else _count_raw(workload, scratch, synchronous, skip)
        chosen = list(points(total)) if points is not None else sample_points(total)
        reports = []
        for model in models:
            rep = SweepReport(f"{name}/{model}", total_ops=total)
            t0 = time.perf_counter()
            for k in chosen:
                disk = PowerLossDisk(crash_at=k, model=model, seed=point_seed(seed, model, k))
                r = run_point(workload, disk, scratch, label=f"{model}@{k}",
                              synchronous=synchronous, skip=skip)
                rep.add(r)
                if progress is not None:
                    progress(r)
            rep.elapsed_s = time.perf_counter() - t0
            reports.append(rep)
        return reports
    finally:
        if own:
            shutil.rmtree(scratch, ignore_errors=True)


def _count_raw(workload: StandardWorkload, scratch: str, synchronous: str, skip: Iterable[str]) -> tuple[int, list[str]]:
    """Count operations without requiring the baseline to pass (negative controls)."""
    disk = PowerLossDisk()
    run_point(workload, disk, scratch, label="baseline", synchronous=synchronous, skip=skip)
    return disk.ops, list(disk.trace)


def fault_sweep(
    workload: StandardWorkload,
    faults: Callable[[int], Sequence[Fault]],
    *,
    points: Sequence[int],
    name: str,
    scratch: str | None = None,
    retries: int = 1,
    restart: bool = True,
    progress: Callable[[PointResult], None] | None = None,
) -> SweepReport:
    """For each index in `points`, run the workload with `faults(index)`; the client
    retries a failed operation `retries` times in-process. Then lose power right after
    the workload (what was acknowledged must be durable: an fsync error retried into
    success shows up as a lost commit) and — `restart` — restart the process on the live
    files; check both."""
    own = scratch is None
    scratch = scratch or tempfile.mkdtemp(prefix="faultfs-", dir=scratch_root())
    rep = SweepReport(name)
    t0 = time.perf_counter()
    try:
        for k in points:
            disk = PowerLossDisk(faults=faults(k))
            r = run_point(workload, disk, scratch, label=f"{name}@{k}", retries=retries,
                          restart=restart)
            rep.total_ops = max(rep.total_ops, r.ops)
            rep.add(r)
            if progress is not None:
                progress(r)
    finally:
        rep.elapsed_s = time.perf_counter() - t0
        if own:
            shutil.rmtree(scratch, ignore_errors=True)
    return rep


def full_mode() -> bool:
    """STEPTRAIL_FAULTS_FULL=1: every index x every model (the exhaustive sweep)."""
    return os.environ.get("STEPTRAIL_FAULTS_FULL", "") not in ("", "0")


def publish_report(*reports: SweepReport) -> None:
    """Print each sweep's line; with STEPTRAIL_FAULTS_REPORT=path also append it as JSON."""
    import json

    out = os.environ.get("STEPTRAIL_FAULTS_REPORT")
    for rep in reports:
        print(rep.line())
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({
                    "name": rep.name, "total_ops": rep.total_ops, "points": rep.points,
                    "crashed": rep.crashed, "lost": rep.lost, "recovered": rep.recovered,
                    "unexpected": rep.unexpected, "duplicated": rep.duplicated,
                    "failures": len(rep.failures), "known_bugs": rep.known,
                    "errors_seen": sorted(rep.errors_seen), "elapsed_s": round(rep.elapsed_s, 2),
                    "full": full_mode(),
                }) + "\n")


__all__ = [
    "ALL_KINDS",
    "BLOB_KINDS",
    "KNOWN_BENIGN",
    "KNOWN_BUGS",
    "MODELS",
    "SQLITE_KINDS",
    "SYNC_KINDS",
    "WRITE_KINDS",
    "WS_KINDS",
    "Clock",
    "Env",
    "FailingFileOps",
    "Fault",
    "FaultVFS",
    "History",
    "Op",
    "PointResult",
    "PowerLossDisk",
    "PowerLossFileOps",
    "PowerLost",
    "StandardWorkload",
    "SweepReport",
    "Verdict",
    "check_ledger",
    "check_recovery",
    "classify",
    "count_ops",
    "crash_sweep",
    "fault_sweep",
    "full_mode",
    "publish_report",
    "run_point",
    "run_with_disk",
    "sample_points",
    "scratch_root",
    "sqlite_view",
]

"""Fork: a workspace as of an earlier step, materialized in a new directory and registered
as a new workspace of the same ledger (docs/time-travel.md "Fork").

The content is what the ledger knew each path held as of the target (`state_as_of`, as a
rewind reads it), with the permission bits recorded then; paths the ledger did not know
then are not in the fork and are listed. Each file is written through the verified
primitive (staged under a temporary name, fsynced, moved in without replacing anything);
then the directory is registered (`workspace-added`) and observed once — the fork's
baseline, asked by ``fork:<workspace>@<seq>`` and labelled with its origin (`lineage`):
that observation is its lineage, and its blobs are the original's (content-addressed:
nothing is copied in the ledger). A second agent works in the fork under its own lease
while the first goes on in the original.

A fork killed at any point is finished by running the same fork again — the same
directory and name. Before its registration, the directory holds nothing but files of
this fork (each checked by hashing to hold exactly the bytes planned for its path), the
directories above them, and the fork's own temporaries (`resumable`); the re-run removes
the temporaries — each only once its bytes, read after it left the visible namespace, are
shown a prefix of the file it was staging, else it is kept under a visible name and the
fork refused — writes what is missing and goes on. Anything else in the directory is
refused, nothing written. After its registration, a re-run answers with the fork when its
baseline is recorded (`registered_fork`), and takes the baseline when it is not.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ..blobs import CHUNK
from ..errors import InvalidInput, LedgerError, StorageFailure
from ..events import Observed, check_step_id
from ..find import LEDGER_DIR, POINTER_FILE
from ..projections.workspaces import Registration
from ..workspace import staging
from ..workspace.boundary import identity_of
from ..workspace.directory import READ_FLAGS, WorkspaceDir
from ..workspace.moves import Seen, look
from ..workspace.names import leaf_of_temp, temp_stamp
from ..retention import released_versions, why_unreachable
from .rewind import _target_seq, modes_as_of, state_as_of
from .observe import observation_attempts
from .site import Site

#: The stamp of the temporaries a fork stages (`WorkspaceDir`'s defaults: epoch 0, no
#: attempt): what `resumable` recognises as the fork's own.
TEMP_STAMP: Final = (0, "00000000")


@dataclass(frozen=True)
class Fork:
    """A fork: the new `workspace` at `root`, made from `source` as of `at_seq` (`at_step`
    when given by step), holding `files` files; `unreachable` the paths left out (unknown
    then, or their bytes collected); `baseline` the observation steps that record it.

    >>> from pathlib import Path
    >>> from ledger import Ledger, run_fenced_step
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent", ttl_s=600)
    >>> for i in (1, 2):
    ...     _ = run_fenced_step(ledger, "repo", f"s{i}", lambda read, i=i: [
    ...         read.read("app.py").write(f"v{i}\\n".encode())], epoch=lease.epoch)
    >>> fork = ledger.workspaces.fork("repo", "s1", "repo-try2")
    >>> fork.workspace, Path("repo-try2/app.py").read_text()
    ('repo-try2', 'v1\\n')
    >>> ledger.close()
    """

    workspace: str
    root: str
    source: str
    at_seq: int
    at_step: str | None
    files: int
    unreachable: tuple[tuple[str, str], ...]
    baseline: tuple[str, ...]
    #: ``DIR/.steptrail/root``: how commands run in the fork's directory find this ledger
    #: (None: a ledger in a database — name it there — or it could not be written)
    pointer: str | None = None


def plan_fork(site: Site, name: str, at: str | int) -> tuple[int, str | None,
                                                             dict[str, str],
                                                             dict[str, int | None],
                                                             list[tuple[str, str]]]:
    """(seq, step, path -> digest, path -> mode, unreachable) of a fork of `name` at `at`."""
    seq, step = _target_seq(site, at)
    site.places.get(name)
    then, unknown = state_as_of(site, name, seq)
    modes = modes_as_of(site, name, seq)
    unreachable = sorted(unknown.items())
    content: dict[str, str] = {}
    released: dict[tuple[str, str, str], int] | None = None
    for path, digest in sorted(then.items()):
        if digest is None or path in unknown:
            continue
        if site.core.blob_size(digest) is None:
            if released is None:
                released = released_versions(site.core.log)
            unreachable.append((path, why_unreachable(site.core.log, digest, workspace=name,
                                                      path=path, released=released)))
            continue
        content[path] = digest
    return seq, step, content, modes, unreachable


def lineage(source: str, seq: int, step: str | None) -> str:
    """The label of a fork's baseline: where it came from."""
    return f"forked from workspace {source!r} as of " + (
        f"step {step!r} (#{seq})" if step else f"#{seq}")


def _same_origin(label: str, source: str, seq: int) -> bool:
    """Whether `label` is `lineage`'s for a fork of `source` as of `seq` (given by step or
    by seq: the same fork)."""
    return label.startswith(f"forked from workspace {source!r} as of ") and (
        label.endswith(f"(#{seq})") or label.endswith(f" as of #{seq}"))


def registered_fork(site: Site, name: str, reg: Registration, target: str, source: str,
                    seq: int) -> tuple[str, ...] | None:
    """For a fork whose name `name` is registered already (`reg`): the steps of its
    recorded baseline — the fork is complete — or None when it was registered and killed
    before its baseline committed (the caller takes it). InvalidInput when `name` is not
    this fork: another directory, another origin, or a workspace that has moved on."""
    exists = InvalidInput(f"workspace {name!r} exists already; give the fork another name")
    if reg.root != target:
        raise exists
    ours: list[str] = []
    observations = observation_attempts(site.core.log, name)
    for r in site.core.log.read(kind="observed", workspace=name):
        event = r.event
        row = site.core.steps.find(r.step)
        if isinstance(event, Observed) and (r.step, event.attempt) in observations \
                and _same_origin(event.label, source, seq) and row is not None and row.live \
                and row.attempt == event.attempt and r.step not in ours:
            ours.append(r.step)
    if ours:
        return tuple(ours)
    for r in site.core.log.read(workspace=name):
        row = site.core.steps.find(r.step) if r.step else None
        if row is not None and row.live:
            raise exists  # its first committed step is not this fork's baseline
    return None


def resumable(site: Site, target: str, content: dict[str, str]
              ) -> dict[str, list[str]] | None:
    """What `target` holds when a fork of `content` may be written there: directory
    (relative, "" the target) -> this fork's temporaries in it; {} for a new or empty
    directory. Besides those, only files of the fork holding exactly their planned bytes
    (hashed) and the directories above them. None for anything else — a file the fork
    does not write, other bytes, a symlink, a temporary that is not a prefix of what the
    fork stages under its name: never written into."""
    if not os.path.lexists(target):
        return {}
    if os.path.islink(target) or not os.path.isdir(target):
        return None
    above = {p.rsplit("/", i)[0] for p in content for i in range(1, p.count("/") + 1)}
    out = WorkspaceDir("(fork)", target)
    temps: dict[str, list[str]] = {}
    try:
        for top, dirs, files in os.walk(target, onerror=_unreadable):
            rel = os.path.relpath(top, target)
            rel = "" if rel == "." else rel
            prefix = rel + "/" if rel else ""
            if not rel and LEDGER_DIR in dirs and _own_pointer_dir(top):
                dirs.remove(LEDGER_DIR)  # a fork run before wrote its pointer, last
            for name in dirs:
                if os.path.islink(os.path.join(top, name)) or prefix + name not in above:
                    return None
            dir_fd = out.open_dir_fd(rel)
            if dir_fd is None:
                return None  # (moved under the walk)
            try:
                for name in files:
                    if _temp_target(name, prefix, content) is not None:
                        if _staged_prefix(site, dir_fd, name, prefix, content) is None:
                            return None
                        temps.setdefault(rel, []).append(name)
                    elif prefix + name not in content or \
                            out.hash(prefix + name) != content[prefix + name]:
                        return None
            finally:
                os.close(dir_fd)
    except (LedgerError, OSError):
        return None
    finally:
        out.close()
    return temps


def _own_pointer_dir(target: str) -> bool:
    """Whether `target`'s ``.steptrail`` holds nothing but what `Workspaces.fork` writes
    there (the root pointer, its ``.gitignore``, a pointer's temporary a kill left): a
    real directory, regular files only."""
    meta = os.path.join(target, LEDGER_DIR)
    try:
        if os.path.islink(meta):
            return False
        names = os.listdir(meta)
    except OSError:
        return False
    for name in names:
        own = name in (POINTER_FILE, ".gitignore") or (
            name.startswith(POINTER_FILE + ".") and name.endswith(".tmp"))
        if not own or not os.path.isfile(os.path.join(meta, name)) \
                or os.path.islink(os.path.join(meta, name)):
            return False
    return True


def _unreadable(exc: OSError) -> None:
    raise exc  # a directory that cannot be listed may hold anything: not resumed into


def _temp_target(name: str, prefix: str, content: dict[str, str]) -> str | None:
    """The fork's path a temporary named `name` in directory `prefix` stages (its leaf
    may be cut short in the name), or None: not the fork's temporary."""
    if temp_stamp(name) != TEMP_STAMP:
        return None
    leaf = leaf_of_temp(name)
    if not leaf:
        return None
    found = [p for p in content if p.startswith(prefix) and "/" not in p[len(prefix):]
             and p[len(prefix):].startswith(leaf)]
    exact = prefix + leaf
    return exact if exact in content else found[0] if len(found) == 1 else None


def _staged_prefix(site: Site, dir_fd: int, name: str, prefix: str,
                   content: dict[str, str]) -> Seen | None:
    """What the temporary `name` holds (its digest and its stat after the read) when its
    bytes are a prefix of the content it stages — all of it, or a copy a kill cut short:
    nothing but the ledger's bytes — else None."""
    path = _temp_target(name, prefix, content)
    if path is None:
        return None
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        want = _reader(site.core.blob_chunks(content[path]))
        h = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            if want(len(chunk)) != chunk:
                return None
            h.update(chunk)
        st = os.fstat(fd)
        return Seen(h.hexdigest(), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns,
                    st.st_ctime_ns)
    finally:
        os.close(fd)


def _reader(chunks: Iterable[bytes]) -> Any:
    """A function giving the next `n` bytes of `chunks` (fewer at the end)."""
    pieces = iter(chunks)
    held = bytearray()

    def take(n: int) -> bytes:
        while len(held) < n:
            nxt = next(pieces, None)
            if nxt is None:
                break
            held.extend(nxt)
        out = bytes(held[:n])
        del held[:n]
        return out

    return take


def materialize(site: Site, target: str, content: dict[str, str],
                modes: dict[str, int | None],
                temps: dict[str, list[str]] | None = None) -> int:
    """Write `content` under `target` — new, empty, or what `resumable` found there — each
    file through the verified primitive (`staging.put`: staged, fsynced, moved in without
    replacing anything that appeared there meanwhile; a file already holding its bytes is
    left). `temps` (`resumable`'s) are removed first, each verified again (see the
    module)."""
    ops = site.core.storage.files.ops
    if os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target):
            raise InvalidInput(f"fork target {target} exists and is not a directory; give"
                               " a new or empty directory (nothing was written)")
    else:
        missing = []
        up = target
        while up and not os.path.lexists(up):
            missing.append(up)
            up = os.path.dirname(up)
        try:
            ops.tick("ws-mkdir")
            os.makedirs(target)
        except OSError as exc:
            raise InvalidInput(f"fork target {target} cannot be created ({exc.strerror});"
                               " give a new or empty directory") from None
        for made in reversed(missing):  # each new name durable in its parent
            try:
                fd = os.open(os.path.dirname(made), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    ops.tick("ws-dirfsync")
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StorageFailure(made, os.strerror(exc.errno or 0)) from None
    st = os.stat(target)
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"fork target {target} is not a directory")
    out = WorkspaceDir("(fork)", target, ops, identity=identity_of(st),
                       boundary=site.core.own.boundary(), allow_git=False)
    try:
        for rel, names in sorted((temps or {}).items()):
            _remove_temporaries(site, out, rel, names, content)
        for path, digest in content.items():
            mode = modes.get(path)
            staging.put(out, path, site.core.blob_chunks(digest),
                        mode=None if mode is None else mode & 0o777)
    finally:
        out.close()
    return len(content)


def _remove_temporaries(site: Site, out: WorkspaceDir, rel: str, names: list[str],
                        content: dict[str, str]) -> None:
    """Remove the fork's temporaries `names` in directory `rel`, each only once its bytes
    are shown a prefix of what it stages (`Mover.drop`: the file it checked, unchanged);
    one that is not is kept under a visible name and the fork refused."""
    dir_fd = out.open_dir_fd(rel)
    if dir_fd is None:
        return
    prefix = rel + "/" if rel else ""
    mover = out.mover()
    try:
        for name in names:
            seen = _staged_prefix(site, dir_fd, name, prefix, content)
            path = _temp_target(name, prefix, content) or prefix + leaf_of_temp(name)
            leaf = path.rpartition("/")[2]
            if seen is None:
                if look(dir_fd, name).digest is None:
                    continue  # gone meanwhile
                kept: str | None = mover.keep(dir_fd, name, leaf)
            else:
                kept = mover.drop(dir_fd, name, seen, keep_for=leaf)
            if kept is not None:
                raise InvalidInput(
                    f"fork target {out.root}: {prefix + name} changed while the fork removed"
                    f" it and is kept as {prefix + kept}; look at it, move it away, then run"
                    " the fork again")
        out.ops.tick("ws-dirfsync")
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_new_name(name: str) -> str:
    check_step_id(name)
    if ":" in name and name.startswith("/"):
        raise InvalidInput(f"workspace name {name!r} looks like a path; give a name")
    return name


__all__ = ["Fork", "TEMP_STAMP", "check_new_name", "lineage", "materialize", "plan_fork",
           "registered_fork", "resumable"]

"""Fork: a workspace as of an earlier step, materialized in a new directory and registered
as a new workspace of the same ledger (docs/time-travel.md "Fork").

The content is what the ledger knew each path held as of the target (`state_as_of`, as a
rewind reads it), with the permission bits recorded then; paths the ledger did not know
then are not in the fork and are listed. Each file is written through the verified primitive
(staged under a temporary name, fsynced, moved in without replacing anything); then the directory is registered (`workspace-added`) and observed once — the fork's
baseline, asked by ``fork:<workspace>@<seq>`` and labelled with its origin: that
observation is its lineage, and its blobs are the original's (content-addressed: nothing
is copied in the ledger). A second agent works in the fork under its own lease while the
first goes on in the original.

A fork killed before its registration leaves a directory no workspace names (run it again
with a new directory, or remove it); killed after, the fork is registered and its
baseline is taken by the next observation.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import InvalidInput
from ..events import check_step_id
from ..workspace import staging
from ..workspace.boundary import identity_of
from ..workspace.directory import WorkspaceDir
from .rewind import _target_seq, modes_as_of, state_as_of
from .site import Site


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
    for path, digest in sorted(then.items()):
        if digest is None or path in unknown:
            continue
        if site.core.blob_size(digest) is None:
            unreachable.append((path, "its bytes as of then are no longer stored (collected)"))
            continue
        content[path] = digest
    return seq, step, content, modes, unreachable


def materialize(site: Site, target: str, content: dict[str, str],
                modes: dict[str, int | None]) -> int:
    """Write `content` under the new or empty directory `target` (see the module), each
    file through the verified primitive (`staging.put`: staged, fsynced, moved in without
    replacing anything that appeared there meanwhile)."""
    if os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target) or os.listdir(target):
            raise InvalidInput(f"fork target {target} exists and is not an empty directory;"
                               " give a new or empty directory (nothing was written)")
    else:
        try:
            os.makedirs(target)
        except OSError as exc:
            raise InvalidInput(f"fork target {target} cannot be created ({exc.strerror});"
                               " give a new or empty directory") from None
    st = os.stat(target)
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"fork target {target} is not a directory")
    out = WorkspaceDir("(fork)", target, site.core.storage.files.ops, identity=identity_of(st),
                       boundary=site.core.own.boundary(), allow_git=False)
    for path, digest in content.items():
        mode = modes.get(path)
        staging.put(out, path, site.core.blob_chunks(digest),
                    mode=None if mode is None else mode & 0o777)
    return len(content)


def check_new_name(name: str) -> str:
    check_step_id(name)
    if ":" in name and name.startswith("/"):
        raise InvalidInput(f"workspace name {name!r} looks like a path; give a name")
    return name


__all__ = ["Fork", "check_new_name", "materialize", "plan_fork"]

"""A run as git history: `export_git` (``steptrail export git``, docs/time-travel.md
"A run in git").

One commit per step of the run that wrote the workspace and was acknowledged, in the
order of the acknowledgments, and one per observation of the workspace made while the
run went on (edits made outside its steps, attributed to who asked); a compensation of an
exported step is a revert commit. Steps that wrote no workspace (artifacts only) have no
commit and are listed in `skipped`. Each commit's message names the step, its attempt,
epoch, lease holder and artifacts; author and committer are `author` (default
``steptrail <steptrail@localhost>``), dated from the events, so a re-export writes the
same commits byte for byte, and an export after more steps only adds commits.

The first commit's parent is `base` (a revision; by default what an earlier export of the
run started from, else the repository's HEAD), and every commit's tree is the base's tree
with the run's changes applied — never a tree of only the files the ledger knows. It is
written by ``git fast-import`` onto `ref` (default ``refs/steptrail/<run>``), which must
lie outside ``refs/heads``: HEAD, the index, the working tree and every branch are left
as they are. Git runs with no hook or file system monitor a repository could name.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import InvalidInput, ProtocolRefused
from .events import Acked, Compensated, Fenced, LeaseAcquired, Observed, Planned

DEFAULT_AUTHOR: Final = "steptrail <steptrail@localhost>"
_SAFE: Final = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
                "-c", "core.untrackedCache=false")
_AUTHOR_RE: Final = re.compile(r"[^<>\n]+ <[^<>\n]*>")


@dataclass
class GitExport:
    """What an export wrote: the `ref`, its `head` commit, the `base`, the number of
    `commits` on the ref for the run (all of them: a re-export writes the same ones),
    the steps without a commit and why (`skipped`)."""

    ref: str
    head: str
    base: str | None
    commits: int
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _git(repo: str, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *_SAFE, *args], cwd=repo, input=data,
                              capture_output=True, check=False, timeout=600,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0",
                                   "GIT_TERMINAL_PROMPT": "0"})
    except FileNotFoundError:
        raise InvalidInput("git is not installed here: install git to export a run as"
                           " history") from None


def _line(out: subprocess.CompletedProcess[bytes]) -> str:
    return " ".join(out.stderr.decode("utf-8", "replace").split())[:500]


def default_ref(run: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._/-]+", "-", run).strip("/.-") or "run"
    name = re.sub(r"\.\.+|/\.|\.lock(?=/|$)|//+", "-", name)
    return f"refs/steptrail/{name}"


def _quote(path: str) -> str:
    """A path as fast-import reads it (C-quoted when it must be)."""
    if not path.startswith('"') and "\n" not in path and "\\" not in path:
        return path
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def export_git(ledger: Any, run: str, *, repo: str | None = None, ref: str | None = None,
               base: str | None = None, author: str | None = None) -> GitExport:
    """Write run `run` as commits on `ref` of the git repository holding its workspace (or
    `repo`). See the module."""
    if not run:
        raise InvalidInput("which run? give its name (steptrail steps shows each step's run)")
    who = author or DEFAULT_AUTHOR
    if not _AUTHOR_RE.fullmatch(who):
        raise InvalidInput(f"author {who!r} is not 'Name <email>'")
    rows = [r for r in ledger.steps() if r.run == run]
    if not rows:
        raise InvalidInput(f"no step of run {run!r} in this ledger; 'steptrail steps' lists"
                           " the runs")
    workspaces = {r.workspace for r in rows if r.workspace}
    skipped = [(r.step_id, "wrote no workspace (artifacts only)") for r in rows
               if not r.workspace]
    if len(workspaces) != 1:
        raise InvalidInput(f"run {run!r} wrote {len(workspaces)} workspaces; a git export"
                           " is of one workspace's history" if workspaces else
                           f"run {run!r} wrote no workspace: nothing to export as commits")
    [ws] = workspaces
    root = ledger.workspaces.registration(ws).root
    repo = repo or root
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise InvalidInput(f"{repo} is in no git repository: give --repo DIR (any"
                           " repository: the export writes objects and one ref)")
    prefix = ""
    if os.path.realpath(repo) == os.path.realpath(root) or repo == root:
        got = _git(root, "rev-parse", "--show-prefix")
        prefix = got.stdout.decode().strip() if got.returncode == 0 else ""
    ref = ref or default_ref(run)
    if ref == "HEAD" or ref.startswith("refs/heads/") or not ref.startswith("refs/"):
        raise InvalidInput(f"ref {ref!r}: an export never writes a branch or HEAD; give a"
                           " ref outside refs/heads (default refs/steptrail/RUN)")
    if _git(repo, "check-ref-format", ref).returncode != 0:
        raise InvalidInput(f"ref {ref!r} is not a valid git ref name")

    existing = _git(repo, "rev-parse", "--verify", "--quiet", ref + "^{commit}")
    if base is None and existing.returncode == 0:
        # what the earlier export started from: the parent of its first commit (the
        # oldest carrying the run's trailer)
        first = _git(repo, "log", "--reverse", "-F", f"--grep=Steptrail-Run: {run}",
                     "--format=%H %P", ref)
        line = first.stdout.decode().splitlines()[:1]
        parts = line[0].split() if line else []
        base = parts[1] if len(parts) > 1 else None
    elif base is None:
        head = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        base = head.stdout.decode().strip() if head.returncode == 0 else None
    else:
        got = _git(repo, "rev-parse", "--verify", "--quiet", base + "^{commit}")
        if got.returncode != 0:
            raise InvalidInput(f"base {base!r} is not a commit of {repo}")
        base = got.stdout.decode().strip()

    stream, commits = _stream(ledger, run, ws, ref, base, who, prefix, skipped)
    if commits == 0:
        raise InvalidInput(f"run {run!r} has no acknowledged step that wrote workspace"
                           f" {ws!r}: nothing to export yet")
    out = _git(repo, "fast-import", "--quiet", "--date-format=raw", data=stream)
    if out.returncode != 0:
        why = _line(out)
        if "not a fast-forward" in why or "does not contain" in why:
            raise ProtocolRefused(f"{ref} holds another history (an export from another"
                                  f" base, or a branch of its own); give another --ref or"
                                  f" remove that one: {why}")
        raise ProtocolRefused(f"git fast-import refused the export: {why}")
    head = _git(repo, "rev-parse", ref).stdout.decode().strip()
    return GitExport(ref=ref, head=head, base=base, commits=commits, skipped=skipped)


def _stream(ledger: Any, run: str, ws: str, ref: str, base: str | None, who: str,
            prefix: str, skipped: list[tuple[str, str]]) -> tuple[bytes, int]:
    """The fast-import stream of the run's commits (see the module)."""
    holders: dict[int, str] = {}
    planned: dict[tuple[str, int], Planned] = {}
    fenced: dict[tuple[str, int], Fenced] = {}
    observed: dict[str, Observed] = {}
    exported: dict[tuple[str, int], str] = {}  # (step, attempt) -> its commit's subject
    rows = [r for r in ledger.steps() if r.run == run]
    in_run = {r.step_id for r in rows}
    last_seq = max(r.last_seq for r in rows)
    first_seq: int | None = None
    chunks: list[bytes] = [f"reset {ref}\n".encode()]
    if base:
        chunks.append(f"from {base}\n".encode())
    commits = 0

    def blob(digest: str) -> bytes:
        data = b"".join(ledger.blob_chunks(digest))
        return b"data %d\n%s\n" % (len(data), data)

    def commit(subject: str, body: str, time_ns: int, ops: list[bytes]) -> None:
        nonlocal commits
        message = (subject + "\n\n" + body + "\n").encode()
        when = f"{time_ns // 1_000_000_000} +0000"
        chunks.append(f"commit {ref}\n".encode())
        chunks.append(f"author {who} {when}\ncommitter {who} {when}\n".encode())
        chunks.append(b"data %d\n%s\n" % (len(message), message))
        chunks.extend(ops)
        chunks.append(b"\n")
        commits += 1

    def op(path: str, digest: str | None, mode: int | None) -> bytes:
        full = _quote(prefix + path)
        if digest is None:
            return f"D {full}\n".encode()
        kind = "100755" if mode is not None and mode & 0o111 else "100644"
        return f"M {kind} inline {full}\n".encode() + blob(digest)

    for r in ledger.read(workspace=ws):
        event = r.event
        if isinstance(event, LeaseAcquired):
            holders[event.epoch] = event.holder
            continue
        step = getattr(event, "step", "")
        mine = step in in_run
        if mine and first_seq is None:
            first_seq = r.seq
        if isinstance(event, Planned):
            planned[(step, event.attempt)] = event
        elif isinstance(event, Observed):
            observed[step] = event
        elif isinstance(event, Fenced):
            fenced[(step, event.attempt)] = event
        elif isinstance(event, Acked):
            key = (step, event.attempt)
            f = fenced.get(key)
            if f is None:
                continue
            is_observation = step in observed
            if not mine and not (is_observation and first_seq is not None
                                 and r.seq <= last_seq):
                continue
            p = planned.get(key)
            paths = [w.path for w in f.writes]
            if is_observation:
                o = observed[step]
                subject = (f"observed: {', '.join(paths[:3])}"
                           + (f" (+{len(paths) - 3})" if len(paths) > 3 else ""))
                body = (f"Edits made outside the steps, asked by {o.by}"
                        + (f" ({o.label})" if o.label else "") + ".\n\n")
            else:
                subject = (f"{step}: {', '.join(paths[:3])}"
                           + (f" (+{len(paths) - 3})" if len(paths) > 3 else ""))
                body = ""
            artifacts = ", ".join(p.artifacts) if p is not None and p.artifacts else "-"
            body += (f"Step: {step}\nAttempt: {event.attempt}\nEpoch: {event.epoch}\n"
                     f"Holder: {holders.get(event.epoch, '-')}\nArtifacts: {artifacts}\n"
                     f"Seq: {r.seq}\nSteptrail-Run: {run}")
            commit(subject, body, r.time_ns,
                   [op(w.path, w.post_hash, w.post_mode) for w in f.writes])
            exported[key] = subject
        elif isinstance(event, Compensated):
            key = (step, event.attempt)
            if key not in exported:
                continue
            moved = [x for x in event.restored if x.outcome != "conflict"]
            if not moved:
                continue
            body = (f"This reverts the commit of step {step} (attempt {event.attempt})"
                    + (f": {event.reason}" if event.reason else "") + ".\n\n"
                    f"Step: {step}\nSeq: {r.seq}\nSteptrail-Run: {run}")
            commit(f'Revert "{exported[key]}"', body, r.time_ns,
                   [op(x.path, x.digest, x.mode) for x in moved])
    for key, f in fenced.items():
        if key[0] in in_run and key not in exported and not any(
                s == key[0] for s, _ in skipped):
            row = ledger.step(key[0])
            if row.attempt == key[1] and row.state not in ("acked",):
                skipped.append((key[0], f"not acknowledged ({row.state})"))
    return b"".join(chunks), commits


__all__ = ["DEFAULT_AUTHOR", "GitExport", "default_ref", "export_git"]

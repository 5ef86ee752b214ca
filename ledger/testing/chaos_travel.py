"""`steptrail chaos --rewind` / `--fork`: kill a real process at every operation of a
rewind and of a fork (docs/time-travel.md), then check against a model.

A small workspace gets a history — a baseline observation, three steps (edits, files
created later, one in a new subdirectory, a delete, a file `cfg` that a directory `cfg/`
replaces), a person's edit recorded by `observe` — and a git repository in ``.git``. The expected trees are folded here from
the writes this module makes (`MODEL`), never read from the ledger. Then, as
`run_fenced_chaos` does, the protocol is counted once and, for each operation k, run in
a forked child that kills itself with SIGKILL just before operation k (every file
write, fsync, rename, directory fsync, mkdir, unlink and SQLite COMMIT):

- `run_rewind_chaos`: ``ledger.workspaces.rewind(w, "s1")`` — two steps, as `cfg` and
  `cfg/` traded places: the first removes `cfg/local.toml` (`CLEARS`). One copy is
  settled by a new lease (force): the files exactly as before the rewind, exactly as
  before but for `CLEARS` when only the first step committed, or exactly as of s1 when
  both did; another runs the same rewind again: exactly as of s1.
- `run_fork_chaos`: ``ledger.workspaces.fork(w, "s2", DIR)``. The same fork run again
  (same directory, same name) completes it: DIR exactly as of s2 (the recorded modes
  too), the fork registered once with one live baseline observation naming its origin
  (its lineage), no lease of the dead process left on it.

Always: `verify` and `audit` clean, no steptrail temporary left in a workspace (but the
displaced files a kill after the rewind's commit leaves, which the next apply in their
directories removes: said in the row), the person's observed edit still in the blob
store (restorable), ``.git`` byte for byte as it was, and for a fork the original
workspace untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, Final

from .. import Ledger, LedgerError
from ..runner import run_fenced_step
from .chaos import ChaosReport, ChaosRow, _Counter

WS: Final = "w"
#: The rewind's target and the fork's.
REWIND_TO: Final = "s1"
FORK_AT: Final = "s2"
FORK_NAME: Final = "w-try2"

#: The files before any step (the baseline observation records them), their modes.
BASELINE: Final = {"app.py": b"v0\n", "notes.txt": b"notes\n", "sub/mod.py": b"m0\n",
                   "run.sh": b"#!/bin/sh\necho hi\n"}
MODES: Final = {"run.sh": 0o755}
#: The steps, in order: path -> new bytes, or None (deleted).
STEPS: Final[tuple[tuple[str, dict[str, bytes | None]], ...]] = (
    ("s1", {"app.py": b"v1\n", "sub/mod.py": b"m1\n", "cfg": b"c1\n"}),
    ("s2", {"later.txt": b"created later\n", "sub/deep/new.py": b"new\n", "cfg": None}),
    ("s3", {"notes.txt": None, "app.py": b"v3\n", "cfg/local.toml": b"x\n"}),
)
#: What the rewind to s1 removes first, by a step of its own: the file `cfg` of s1 came
#: back where a directory `cfg/` stands now (a file and a directory traded places).
CLEARS: Final = ("cfg/local.toml",)
#: What a person saves by hand after the steps (then observed).
PERSON: Final = {"app.py": b"a person's edit\n"}


def model() -> dict[str, dict[str, bytes]]:
    """The tree after the baseline (``"baseline"``), after each step, and after the
    person's edit (``"now"``), folded from the writes above."""
    states = {"baseline": dict(BASELINE)}
    tree = dict(BASELINE)
    for step, writes in STEPS:
        for path, data in writes.items():
            if data is None:
                tree.pop(path, None)
            else:
                tree[path] = data
        states[step] = dict(tree)
    tree.update(PERSON)
    states["now"] = dict(tree)
    return states


MODEL: Final = model()


# -- the world ------------------------------------------------------------------------


def _tree(root: str) -> dict[str, bytes]:
    """Every regular file under `root` but ``.git``, the ledger's and steptrail's own
    temporaries (judged apart: `_temporaries`)."""
    out = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in (".git", ".steptrail")]
        for name in names:
            if ".steptrail-" in name:
                continue
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _temporaries(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root)
                  for d, _s, names in os.walk(root) for n in names if ".steptrail-" in n)


def _git_state(ws: str) -> dict[str, bytes]:
    """Every byte of ``.git`` (HEAD, the index, the refs, the objects), by path."""
    out = {}
    git = os.path.join(ws, ".git")
    for d, _dirs, names in os.walk(git):
        for name in names:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, git)] = f.read()
    return out


def _git_template(root: str) -> str | None:
    """A git repository holding the baseline, made once and copied into each world
    (None: no git here; the sweep runs without it)."""
    git = shutil.which("git")
    if git is None:
        return None
    repo = os.path.join(root, "git-template")
    _write(repo, BASELINE)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "chaos", "GIT_AUTHOR_EMAIL": "chaos@localhost",
           "GIT_COMMITTER_NAME": "chaos", "GIT_COMMITTER_EMAIL": "chaos@localhost"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "baseline"]):
        subprocess.run([git, *args], cwd=repo, env=env, check=True, capture_output=True)
    return os.path.join(repo, ".git")


def _write(root: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if rel in MODES:
            os.chmod(path, MODES[rel])


def _setup(root: str, git: str | None) -> tuple[str, str]:
    """The world in `root`: (the ledger's path, the workspace's root), its history
    recorded as the module says."""
    ws = os.path.join(root, "ws")
    _write(ws, BASELINE)
    if git is not None:
        shutil.copytree(git, os.path.join(ws, ".git"), symlinks=True)
    path = os.path.join(root, "ledger.db")
    with Ledger.init(path) as ledger:
        ledger.workspaces.add(WS, ws)
        ledger.workspaces.observe(WS, by="chaos:setup", label="baseline")
        lease = ledger.workspaces.acquire(WS, "chaos-agent", ttl_s=3600)
        for step, writes in STEPS:
            def plan(read: Any, writes: dict[str, bytes | None] = writes) -> list[Any]:
                return [read.read(p).write(d) for p, d in sorted(writes.items())]

            run_fenced_step(ledger, WS, step, plan, epoch=lease.epoch).raise_for_status()
        ledger.workspaces.release(WS, lease.epoch)
        _write(ws, PERSON)
        ledger.workspaces.observe(WS, by="chaos:person", label="by hand")
    return path, ws


@contextlib.contextmanager
def _label_phases(counter: _Counter, ledger: Ledger) -> Iterator[None]:
    """Name each operation after the part of the protocol it belongs to (for the
    table): the facade's lease calls and the step lifecycle's functions, wrapped while
    the protocol runs."""
    from ..step import admit, apply, undo
    from ..step import fork as forking
    from ..step import observe as observing

    targets: list[tuple[Any, str, str]] = [
        (admit, "admit", "plan"), (apply, "apply", "apply"), (undo, "settle_all", "settle"),
        (forking, "materialize", "files"), (observing, "observe", "baseline"),
    ]
    facade = ledger.workspaces
    own = [("acquire", "lease"), ("release", "release"), ("add", "register")]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def labelled(*args: Any, **kwargs: Any) -> Any:
            before, counter.phase = counter.phase, label
            try:
                return fn(*args, **kwargs)
            finally:
                counter.phase = before
        return labelled

    for obj, name, label in targets:
        setattr(obj, name, wrap(label, getattr(obj, name)))
    for name, label in own:
        setattr(facade, name, wrap(label, getattr(facade, name)))
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
        for name, _ in own:
            with contextlib.suppress(AttributeError):
                delattr(facade, name)


Protocol = Callable[[Ledger], Any]


def _run(path: str, protocol: Protocol, on_op: _Counter | None) -> Any:
    with Ledger.open(path, on_op=on_op) as ledger, (
            _label_phases(on_op, ledger) if on_op is not None else contextlib.nullcontext()):
        return protocol(ledger)


def _killed_at(path: str, protocol: Protocol, k: int) -> bool:
    """Run `protocol` in a forked child that kills itself before operation k; True when
    it really died by SIGKILL."""
    pid = os.fork()
    if pid == 0:  # the child: run until operation k kills it
        try:
            _run(path, protocol, _Counter(k))
            os._exit(0)
        except BaseException:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _always(ledger: Ledger, ws: str, git: dict[str, bytes]) -> str | None:
    """The checks every row makes; None when they all hold, else the violation."""
    from ..gc.audit import audit

    if not ledger.verify().ok:
        return "verify failed"
    found = audit(ledger)
    if found.violations:
        return f"audit: {(found.dangling + found.corrupt + found.problems)[:2]}"
    for path, data in PERSON.items():
        try:
            held = ledger.read_blob(_digest(data))
        except LedgerError:
            held = b""
        if held != data:
            return f"the person's observed edit of {path} is no longer restorable"
    if _git_state(ws) != git:
        return ".git changed"
    return None


def _diff(files: dict[str, bytes], want: dict[str, bytes]) -> str:
    wrong = sorted(p for p in {*files, *want} if files.get(p) != want.get(p))
    return ", ".join(wrong[:4])


def _report(rows: list[ChaosRow], started: float, shape: str) -> ChaosReport:
    return ChaosReport(
        artifacts=0, wrong_order=False, indices=len(rows),
        violations=sum(r.after_crash.startswith("VIOLATION") for r in rows),
        violations_after_replay=sum(r.after_replay.startswith("VIOLATION") for r in rows),
        committed_after_crash=sum(r.after_crash.startswith("committed") for r in rows),
        committed_after_replay=sum(r.after_replay.startswith("committed") for r in rows),
        elapsed_s=round(time.perf_counter() - started, 3), rows=rows, shape=shape)


def _indices(total: int, only: Collection[int] | None) -> list[int]:
    return [k for k in range(1, total + 1) if only is None or k in only]


def _count(root: str, git: str | None, protocol: Protocol) -> list[str]:
    here = os.path.join(root, "count")
    path, _ws = _setup(here, git)
    counter = _Counter(None)
    _run(path, protocol, counter)
    shutil.rmtree(here, ignore_errors=True)
    return counter.names


# -- rewind ---------------------------------------------------------------------------


def _rewind(ledger: Ledger) -> Any:
    return ledger.workspaces.rewind(WS, REWIND_TO)


def _rewind_steps(ledger: Ledger) -> list[str]:
    return [s.step_id for s in ledger.steps(contains="rewind-")
            if s.step_id.startswith("rewind-")]


def _rewind_row(root: str, git: str | None, k: int, branch: str) -> tuple[bool, str]:
    here = os.path.join(root, f"k{k:04d}-{branch}")
    path, ws = _setup(here, git)
    git_before = _git_state(ws)
    before, target = MODEL["now"], MODEL[REWIND_TO]
    cleared = {p: d for p, d in before.items() if p not in CLEARS}
    died = _killed_at(path, _rewind, k)
    try:
        with Ledger.open(path) as ledger:
            if branch == "settle":
                lease = ledger.workspaces.acquire(WS, "chaos-2", ttl_s=3600, force=True)
                if lease.unsettled:
                    return died, f"VIOLATION: settling left {list(lease.unsettled)} in flight"
                done = [s for s in _rewind_steps(ledger) if ledger.step(s).live]
                want, label = ((target, "committed") if len(done) == 2 else
                               (cleared, "cleared") if done and done[0].endswith("-clear")
                               else (before, "rolled back"))
            else:
                got = ledger.workspaces.rewind(WS, REWIND_TO)
                want = target
                if got.verdict in ("applied", "nothing"):
                    label = f"committed ({got.verdict})"
                else:
                    label = f"VIOLATION: the re-run came out {got.verdict}: {got.detail}"
            files = _tree(ws)
            left = _temporaries(ws)
            live = [s for s in _rewind_steps(ledger) if ledger.step(s).live]
            kept = [n for n in left if ".steptrail-kept-" in n]  # (nothing here is a person's)
            if files != want:
                label = f"VIOLATION: {_diff(files, want)} not as {label}"
            elif kept or (left and not live):
                label = f"VIOLATION: left {', '.join(left[:3])}"
            elif len(live) != (2 if want is target else 1 if want is cleared else 0):
                label = f"VIOLATION: {len(live)} live rewind steps"
            elif (problem := _always(ledger, ws, git_before)) is not None:
                label = f"VIOLATION: {problem}"
            elif left:
                # a kill after the commit, before the displaced files went: the next
                # apply in those directories removes them (docs/guarantees.md)
                label += f" ({len(left)} displaced files left)"
    except LedgerError as exc:
        label = f"VIOLATION: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(here, ignore_errors=True)
    return died, label


def run_rewind_chaos(*, workdir: str | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     only: Collection[int] | None = None) -> ChaosReport:
    """Kill ``rewind(w, "s1")`` before each of its operations, twice per index: then (a)
    a new lease (force) settles it — the files exactly as before, or, if the rewind
    committed, exactly as of s1 — and (b) the same rewind run again ends exactly as of s1.
    Either way the module's checks hold. `after_crash` is (a), `after_replay` (b).
    `only`: these operation indices (a negative control's few), not every one."""
    started = time.perf_counter()
    own = workdir is None
    root = workdir or tempfile.mkdtemp(prefix="steptrail-chaos-")
    try:
        git = _git_template(root)
        names = _count(root, git, _rewind)
        rows = []
        for k in _indices(len(names), only):
            settle = _rewind_row(root, git, k, "settle")
            replay = _rewind_row(root, git, k, "replay")
            rows.append(ChaosRow(k, names[k - 1], settle[0] and replay[0], settle[1],
                                 replay[1]))
            if progress is not None:
                progress(k, len(names))
        return _report(rows, started, "rewind")
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


# -- fork -----------------------------------------------------------------------------


def _fork_protocol(target: str) -> Protocol:
    def protocol(ledger: Ledger) -> Any:
        return ledger.workspaces.fork(WS, FORK_AT, target)
    return protocol


def _baselines(ledger: Ledger, origin: str) -> list[str]:
    """The fork's live observations asked by its origin (``fork:w@SEQ``), baselines."""
    from ..events import Observed

    out = []
    for r in ledger.read(kind="observed"):
        event = r.event
        if isinstance(event, Observed) and event.by == origin and event.baseline \
                and ledger.step(r.step).live and r.step not in out:
            out.append(r.step)
    return out


def _fork_left(ledger: Ledger) -> str:
    """What a kill left of the fork (for the table)."""
    try:
        ledger.workspaces.registration(FORK_NAME)
    except LedgerError:
        return "not registered"
    observed = [r for r in ledger.read(kind="observed")
                if getattr(r.event, "by", "").startswith("fork:")]
    return "registered, baseline taken" if any(ledger.step(r.step).live for r in observed) \
        else "registered, no baseline"


def _fork_row(root: str, git: str | None, k: int) -> tuple[bool, str, str]:
    here = os.path.join(root, f"k{k:04d}")
    path, ws = _setup(here, git)
    target = os.path.join(here, FORK_NAME)
    git_before, original = _git_state(ws), _tree(ws)
    died = _killed_at(path, _fork_protocol(target), k)
    after_crash = after_replay = ""
    try:
        with Ledger.open(path) as ledger:
            problem = _always(ledger, ws, git_before)
            if _tree(ws) != original or _temporaries(ws):
                problem = "the original workspace changed"
            after_crash = f"VIOLATION: {problem}" if problem else _fork_left(ledger)
            try:
                got = ledger.workspaces.fork(WS, FORK_AT, target)
            except LedgerError as exc:
                after_replay = f"VIOLATION: the re-run failed: {type(exc).__name__}: {exc}"
                return died, after_crash, after_replay
            want = MODEL[FORK_AT]
            files = _tree(target)
            origin = f"fork:{WS}@{got.at_seq}"
            baselines = _baselines(ledger, origin)
            added = [r for r in ledger.read(kind="workspace-added")
                     if getattr(r.event, "workspace", "") == FORK_NAME]
            modes = {p: stat.S_IMODE(os.stat(os.path.join(target, p)).st_mode) & 0o777
                     for p in MODES if p in files}
            lease = ledger.workspaces.lease(FORK_NAME)
            if files != want:
                after_replay = f"VIOLATION: {_diff(files, want)} not as of {FORK_AT}"
            elif any(modes[p] != m for p, m in MODES.items() if p in want):
                after_replay = f"VIOLATION: modes {modes}"
            elif _temporaries(target):
                after_replay = f"VIOLATION: left {', '.join(_temporaries(target)[:3])}"
            elif len(added) != 1:
                after_replay = f"VIOLATION: registered {len(added)} times"
            elif len(baselines) != 1 or tuple(baselines) != got.baseline:
                after_replay = (f"VIOLATION: live baselines {baselines}, the re-run said"
                                f" {list(got.baseline)}")
            elif lease.live:
                after_replay = f"VIOLATION: the fork's lease is still held by {lease.holder}"
            elif _tree(ws) != original or _git_state(ws) != git_before:
                after_replay = "VIOLATION: the original workspace changed"
            elif (problem := _always(ledger, ws, git_before)) is not None:
                after_replay = f"VIOLATION: {problem}"
            else:
                after_replay = "committed"
    except LedgerError as exc:
        after_replay = after_replay or f"VIOLATION: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(here, ignore_errors=True)
    return died, after_crash, after_replay


def run_fork_chaos(*, workdir: str | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   only: Collection[int] | None = None) -> ChaosReport:
    """Kill ``fork(w, "s2", DIR)`` before each of its operations; then run the same fork
    again (same directory, same name): it must complete the fork (see the module).
    `after_crash` says what the kill left (or the violation: the original touched, a
    check failed), `after_replay` how the re-run ended. `only`: as `run_rewind_chaos`."""
    started = time.perf_counter()
    own = workdir is None
    root = workdir or tempfile.mkdtemp(prefix="steptrail-chaos-")
    try:
        git = _git_template(root)
        names = _count(root, git, _fork_protocol(os.path.join(root, "count", FORK_NAME)))
        rows = []
        for k in _indices(len(names), only):
            died, after_crash, after_replay = _fork_row(root, git, k)
            rows.append(ChaosRow(k, names[k - 1], died, after_crash, after_replay))
            if progress is not None:
                progress(k, len(names))
        return _report(rows, started, "fork")
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


__all__ = ["CLEARS", "FORK_AT", "MODEL", "REWIND_TO", "model", "run_fork_chaos", "run_rewind_chaos"]

"""`steptrail chaos`: kill a real process at every operation of a step, then check.

The whole artifact protocol of one N-artifact step (plan with its pins, durable blob
files, then inline rows, every `blob-stored`, the publish and the ack in one commit; a
step whose artifacts are all inline is one commit) runs in a forked child that kills
itself with SIGKILL just before operation k — every file write, fsync, rename,
directory fsync, mkdir and SQLite COMMIT is an operation — for every k from 1 to
the total. The parent then reopens the ledger from the file, classifies the step
with the durability checker, replays it under the same step id (continuing the
same attempt) and classifies again.

SIGKILL keeps the page cache, so this finds ordering bugs (a manifest published
before its blobs), not lost fsyncs; power loss is the fault-injecting VFS's job.
`wrong_order=True` runs the broken protocol (manifest before blobs) through a
test-only path that skips the publish check: the checker must report violations.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from .. import Ledger, LedgerError
from ..runner import run_fenced_step, run_step
from .broken import run_step_wrong_order

STEP_ID = "chaos-step"


def chaos_outputs(n: int, inline_max: int) -> dict[str, bytes]:
    """N artifacts, alternating small (inline rows) and large (blob files)."""
    out = {}
    for i in range(n):
        size = 4096 if i % 2 == 0 else inline_max * 2
        seed = f"artifact {i}\n".encode()
        out[f"a{i}.bin"] = (seed * (size // len(seed) + 1))[:size]
    return out


class _Counter:
    """Counts operations; kills this process just before operation `kill_at`."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at, self.n, self.names = kill_at, 0, []
        self.phase = ""

    def __call__(self, name: str) -> None:
        self.n += 1
        self.names.append(f"{name} ({self.phase})" if self.phase else name)
        if self.kill_at is not None and self.n >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class ChaosRow:
    index: int
    operation: str
    died: bool
    after_crash: str
    after_replay: str


@dataclass
class ChaosReport:
    artifacts: int
    wrong_order: bool
    indices: int
    violations: int
    violations_after_replay: int
    committed_after_crash: int
    committed_after_replay: int
    elapsed_s: float
    rows: list[ChaosRow] = field(default_factory=list)
    #: `--fenced SHAPE`: the fenced step killed (rotation, swap, move); "" the artifacts
    shape: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@contextlib.contextmanager
def _label_phases(counter: _Counter) -> Iterator[None]:
    """Name each operation after the protocol step it belongs to (for the table): the
    artifact protocol's functions (`ledger.step.artifacts`, which the runner and the
    `Ledger` facade both call) wrapped while the protocol runs."""
    from ..step import artifacts as artifacts_mod

    saved = {name: getattr(artifacts_mod, name) for name in PHASES}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def labelled(*args: Any, **kwargs: Any) -> Any:
            counter.phase = PHASES[name] if name != "store" else f"store {args[3]}"
            return fn(*args, **kwargs)
        return labelled

    for name, fn in saved.items():
        setattr(artifacts_mod, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(artifacts_mod, name, fn)


#: The artifact protocol's functions the runner calls, named in the table
#: (`step_in_one_commit`, `store_and_publish`: its fast paths).
PHASES = {"step_in_one_commit": "whole step", "plan": "plan", "store": "store",
          "store_and_publish": "store + publish + ack", "publish": "publish", "ack": "ack"}


def _protocol(path: str, outputs: dict[str, bytes], wrong_order: bool, on_op: Callable[[str], None] | None) -> None:
    with Ledger.open(path, on_op=on_op) as ledger, (
            _label_phases(on_op) if isinstance(on_op, _Counter) else contextlib.nullcontext()):
        if wrong_order:
            run_step_wrong_order(ledger, STEP_ID, outputs)
        else:
            run_step(ledger, STEP_ID, outputs)


def count_operations(workdir: str, outputs: dict[str, bytes], wrong_order: bool) -> list[str]:
    path = os.path.join(workdir, "count", "ledger.db")
    Ledger.init(path).close()
    counter = _Counter(None)
    _protocol(path, outputs, wrong_order, counter)
    return counter.names


def _classify(path: str) -> str:
    with Ledger.open(path, readonly=True) as ledger:
        return ledger.classify(STEP_ID)


def run_chaos(
    artifacts: int = 5,
    *,
    wrong_order: bool = False,
    workdir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ChaosReport:
    """Kill the protocol at every operation index; classify after the crash and after replay."""
    started = time.perf_counter()
    own = workdir is None
    root = workdir or tempfile.mkdtemp(prefix="steptrail-chaos-")
    try:
        inline_max = Ledger.INLINE_MAX_DEFAULT
        outputs = chaos_outputs(artifacts, inline_max)
        names = count_operations(root, outputs, wrong_order)
        rows = []
        for k in range(1, len(names) + 1):
            path = os.path.join(root, f"k{k:04d}", "ledger.db")
            Ledger.init(path).close()
            pid = os.fork()
            if pid == 0:  # the child: run until operation k kills it
                try:
                    _protocol(path, outputs, wrong_order, _Counter(k))
                    os._exit(0)
                except BaseException:
                    os._exit(70)
            _, status = os.waitpid(pid, 0)
            died = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            after_crash = _classify(path)
            try:
                _protocol(path, outputs, wrong_order, None)
            except LedgerError as exc:
                after_replay = f"replay failed: {exc}"
            else:
                after_replay = _classify(path)
            rows.append(ChaosRow(k, names[k - 1], died, after_crash, after_replay))
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            if progress is not None:
                progress(k, len(names))
        return ChaosReport(
            artifacts=artifacts,
            wrong_order=wrong_order,
            indices=len(rows),
            violations=sum(r.after_crash.startswith("VIOLATION") for r in rows),
            violations_after_replay=sum(r.after_replay.startswith("VIOLATION") for r in rows),
            committed_after_crash=sum(r.after_crash == "committed" for r in rows),
            committed_after_replay=sum(r.after_replay == "committed" for r in rows),
            elapsed_s=round(time.perf_counter() - started, 3),
            rows=rows,
        )
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


# -- a fenced step: rotations, swaps and moves killed at every operation ---------------

#: The permutations `run_fenced_chaos` kills (docs/guarantees.md "Any permutation").
FENCED_SHAPES: Final = ("rotation", "swap", "move")
_WS = "w"


def fenced_shape(shape: str, n: int = 6) -> tuple[dict[str, bytes], dict[str, bytes | None]]:
    """(the files before, what the step makes of each path: bytes, or None: deleted)."""
    if shape == "rotation":  # f_i := f_(i+1): every pre-image is another path's post-image
        before = {f"f{i}.txt": f"content {i}\n".encode() for i in range(n)}
        names = sorted(before)
        return before, {names[i]: before[names[(i + 1) % n]] for i in range(n)}
    if shape == "swap":
        before = {"a.txt": b"A\n", "b.txt": b"B\n"}
        return before, {"a.txt": b"B\n", "b.txt": b"A\n"}
    if shape == "move":  # a directory moved: deletes and creates of the same bytes
        before = {f"src/m{i}.txt": f"moved {i}\n".encode() for i in range(n // 2)}
        after: dict[str, bytes | None] = {p: None for p in before}
        after.update({"dst/" + p[4:]: data for p, data in before.items()})
        return before, after
    raise ValueError(f"no shape {shape!r}; one of {', '.join(FENCED_SHAPES)}")


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".steptrail"]
        for name in names:
            if ".steptrail-" in name:
                continue  # steptrail's own temporaries: judged apart (`_leftovers`)
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _fenced_setup(root: str, before: dict[str, bytes]) -> tuple[str, str]:
    ws = os.path.join(root, "ws")
    for rel, data in before.items():
        os.makedirs(os.path.dirname(os.path.join(ws, rel)), exist_ok=True)
        with open(os.path.join(ws, rel), "wb") as f:
            f.write(data)
    os.makedirs(ws, exist_ok=True)
    path = os.path.join(root, "ledger.db")
    with Ledger.init(path) as ledger:
        ledger.workspaces.add(_WS, ws)
        ledger.workspaces.acquire(_WS, "chaos-1", ttl_s=3600)
    return path, ws


def _fenced_protocol(path: str, after: dict[str, bytes | None],
                     on_op: Callable[[str], None] | None) -> Any:
    with Ledger.open(path, on_op=on_op) as ledger:
        def plan(read: Any) -> list[Any]:
            return [read.read(p).write(data) for p, data in sorted(after.items())]

        return run_fenced_step(ledger, _WS, STEP_ID, plan, epoch=1)


def _killed_at(path: str, after: dict[str, bytes | None], k: int) -> bool:
    pid = os.fork()
    if pid == 0:  # the child: run until operation k kills it
        try:
            _fenced_protocol(path, after, _Counter(k))
            os._exit(0)
        except BaseException:
            os._exit(70)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _leftovers(ws: str) -> list[str]:
    return sorted(n for _d, _s, names in os.walk(ws) for n in names if ".steptrail-" in n)


def run_fenced_chaos(shape: str = "rotation", *, workdir: str | None = None,
                     progress: Callable[[int, int], None] | None = None) -> ChaosReport:
    """Kill a fenced step of `shape` before each of its operations, twice per index:
    then (a) a new epoch settles it — the files must be exactly as before, or, if the
    step committed, exactly as after — and (b) the same step run again under the same
    epoch must commit, the files exactly as after. Either way verify must hold and no
    temporary may be left in the workspace. `after_crash` is (a), `after_replay` (b)."""
    started = time.perf_counter()
    own = workdir is None
    root = workdir or tempfile.mkdtemp(prefix="steptrail-chaos-")
    before, after = fenced_shape(shape)
    expected = {p: d for p, d in {**before, **after}.items() if d is not None}
    try:
        count_root = os.path.join(root, "count")
        path, _ = _fenced_setup(count_root, before)
        counter = _Counter(None)
        _fenced_protocol(path, after, counter)
        names = counter.names
        shutil.rmtree(count_root, ignore_errors=True)
        rows = []
        for k in range(1, len(names) + 1):
            results = []
            for branch in ("settle", "replay"):
                here = os.path.join(root, f"k{k:04d}-{branch}")
                path, ws = _fenced_setup(here, before)
                died = _killed_at(path, after, k)
                try:
                    with Ledger.open(path) as ledger:
                        committed = ledger.find_step(STEP_ID) is not None \
                            and ledger.step(STEP_ID).live
                        if branch == "settle":
                            if not committed:
                                ledger.workspaces.acquire(_WS, "chaos-2", ttl_s=3600, force=True)
                            want, label = (expected, "committed") if committed else (
                                before, "rolled back")
                        else:
                            out = run_fenced_step(ledger, _WS, STEP_ID, lambda read: [
                                read.read(p).write(d) for p, d in sorted(after.items())],
                                epoch=1)
                            want, label = expected, f"committed ({out.status.value})"
                            if not out.committed:
                                label = f"VIOLATION: the re-run came out {out.status.value}"
                        files = _files(ws)
                        if files != want:
                            wrong = sorted(p for p in {*files, *want}
                                           if files.get(p) != want.get(p))
                            label = f"VIOLATION: {', '.join(wrong[:4])} not as {label}"
                        elif _leftovers(ws) and not (branch == "settle" and committed):
                            label = f"VIOLATION: left {', '.join(_leftovers(ws)[:3])}"
                        elif _leftovers(ws):
                            # a kill after the commit, before the displaced files went:
                            # the next apply in those directories removes them
                            label += f" ({len(_leftovers(ws))} displaced files left)"
                        elif not ledger.verify().ok:
                            label = "VIOLATION: verify failed"
                except LedgerError as exc:
                    label = f"VIOLATION: {type(exc).__name__}: {exc}"
                results.append((died, label))
                shutil.rmtree(here, ignore_errors=True)
            rows.append(ChaosRow(k, names[k - 1], results[0][0], results[0][1], results[1][1]))
            if progress is not None:
                progress(k, len(names))
        return ChaosReport(
            artifacts=0, wrong_order=False, indices=len(rows),
            violations=sum(r.after_crash.startswith("VIOLATION") for r in rows),
            violations_after_replay=sum(r.after_replay.startswith("VIOLATION") for r in rows),
            committed_after_crash=sum(r.after_crash.startswith("committed") for r in rows),
            committed_after_replay=sum(r.after_replay.startswith("committed") for r in rows),
            elapsed_s=round(time.perf_counter() - started, 3), rows=rows, shape=shape)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


__all__ = ["FENCED_SHAPES", "ChaosReport", "ChaosRow", "chaos_outputs", "fenced_shape",
           "run_chaos", "run_fenced_chaos"]

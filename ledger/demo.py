"""`steptrail demo`: the main job, end to end, on an embedded ledger.

A scripted agent (no model calls) works through a run of steps on a real workspace —
a git repository with a few source files — beside an embedded ledger, and meets every
failure steptrail exists for: a lost ack and its redelivery, a human editing a file
under a step, a step whose tests fail (compensated), a worker killed with SIGKILL
between renaming a file into place and recording it, and the late receipt of that
reclaimed sandbox. A fresh worker process on a fresh directory restores the workspace
from the ledger, takes a new epoch (settling the dead worker's attempts) and finishes
the run. Then the collector and the audit run, and every invariant is checked. The
report lists each check; the demo passes only if all hold.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .blobs import digest_of
from .errors import IdempotencyConflict, IllegalTransition, StaleEpoch
from .events import Acked, Planned
from .step.values import Write
from .runner import FencedOutcome, StepReader, StepStatus, run_fenced_step
from .ledger import Ledger
from .store import shown_location

Echo = Callable[[str], None] | None
Say = Callable[[str], None]

WS = "repo"
RUN = "refactor-run"
STEPS = 10  # s01 .. s10, each edits one source file; a few carry a large log (a file blob)

INITIAL = {
    "README.md": "# calc\n\nA tiny calculator.\n",
    "src/calc.py": "def add(a, b):\n    return a + b\n",
    "src/util.py": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "tests/test_calc.py": "from src.calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}


def step_change(i: int, before: bytes) -> tuple[str, bytes]:
    """Step i's edit: (path, new content) given the file's current bytes."""
    path = ["src/calc.py", "src/util.py", "tests/test_calc.py"][i % 3]
    line = f"\n\ndef f{i:02d}(x):  # added by step s{i:02d}\n    return x + {i}\n"
    return path, before + line.encode()


def step_outputs(i: int) -> dict[str, bytes]:
    """Step i's artifacts: a small test report (inline) and, every third step, a large
    build log (a blob file)."""
    out = {f"reports/s{i:02d}.txt": f"s{i:02d}: 12 passed\n".encode()}
    if i % 3 == 0:
        out[f"logs/s{i:02d}.log"] = f"s{i:02d} build log line\n".encode() * 7000  # ~150 KiB
    return out


def _read(root: str, path: str) -> bytes:
    with open(os.path.join(root, path), "rb") as f:
        return f.read()


class Agent:
    """The scripted agent: each step through the library's fenced step
    (`run_fenced_step`: read, plan, admit, apply, store its artifacts, publish, ack; or,
    called again, resumed from what the ledger recorded). The demo injects its faults at
    the step's stages (`on_stage`): a person's edit once the plan is durable, a worker
    that stops once its apply is recorded."""

    def __init__(self, ledger: Ledger, epoch: int, counts: dict[str, int]) -> None:
        self.ledger, self.epoch, self.counts = ledger, epoch, counts

    def finish(self, i: int, on_stage: Callable[[str], None] | None = None) -> str:
        """Run step i to its end; its verdict ("applied", "rejected:<reason>")."""
        out = self.run(i, on_stage)
        if not out.committed:
            self.counts["rejected"] += 1
            return f"rejected:{out.reason.value}" if out.reason is not None else out.detail
        self.counts["committed"] += 1
        return "applied"

    def run(self, i: int, on_stage: Callable[[str], None] | None = None) -> FencedOutcome:
        out = run_fenced_step(self.ledger, WS, f"s{i:02d}", lambda read: self._writes(i, read),
                              epoch=self.epoch, run=RUN, artifacts=step_outputs(i),
                              on_stage=on_stage)
        self.counts["steps_started"] += out.ran
        return out

    @staticmethod
    def _writes(i: int, read: StepReader) -> list[Write]:
        path, _ = step_change(i, b"")
        got = read.read(path)
        return [got.write(step_change(i, got.content or b"")[1])]


def run_demo(keep: str | None = None, echo: Echo = print, *, ledger: str | None = None
             ) -> dict[str, Any]:
    """Run the demo. `ledger`: a postgresql:// URL of an empty database to keep the
    ledger in (default: a SQLite file in the demo's directory); the workers then share
    nothing but that URL: each works in a directory of its own."""
    say: Say = echo or (lambda _m: None)
    url = ledger  # (the name `ledger` is the open Ledger below)
    # Everything that can refuse the demo is judged before its directory exists, so a
    # refused demo leaves nothing behind (issue 26, item 16).
    if ledger is not None:
        path = ledger
        with Ledger.init(path) as fresh_ledger:
            if fresh_ledger.head().seq:
                raise FileExistsError(f"{fresh_ledger.path} already holds a ledger; give the"
                                      " demo an empty database")
    elif keep is not None and os.path.exists(os.path.join(keep, ".steptrail", "ledger.db")):
        raise FileExistsError(f"{os.path.join(keep, '.steptrail', 'ledger.db')} exists; give"
                              " --keep an empty directory")
    root = keep or tempfile.mkdtemp(prefix="steptrail-demo-")
    os.makedirs(root, exist_ok=True)
    if ledger is None:
        path = os.path.join(root, ".steptrail", "ledger.db")
    checks: dict[str, bool] = {}
    counts = {"steps_started": 0, "committed": 0, "rejected": 0, "deduped": 0,
              "compensated": 0, "refused": 0}
    t0 = time.perf_counter()

    def check(name: str, ok: bool) -> None:
        checks[name] = bool(ok)
        say(f"  [{'ok' if ok else 'FAIL'}] {name}")

    repo = os.path.join(root, "workspace")
    _make_repo(repo, say)
    shown = shown_location(path)
    say(f"steptrail demo: workspace {repo}, ledger {shown}")
    if url is not None:
        say("   the workers are processes that share nothing but the database URL; each"
            " works in its own directory")
    with Ledger.init(path) as ledger:
        _first_worker(ledger, repo, check, say, counts)
    _killed_worker(path, root, check, say, counts)
    fresh = os.path.join(root, "workspace-restored")
    _fresh_worker(path, fresh, check, say, counts)
    with Ledger.open(path) as ledger:
        _late_receipt(ledger, root, check, say, counts)
        result = _closing_checks(ledger, fresh, check, say, counts)

    elapsed = time.perf_counter() - t0
    ok = all(checks.values())
    report = {"ok": ok, "ledger": shown, "workspace": fresh, **counts, **result,
              "checks": checks, "elapsed_s": round(elapsed, 3)}
    say("")
    say(f"steps started {counts['steps_started']}, committed {counts['committed']},"
        f" rejected {counts['rejected']}, deduped {counts['deduped']},"
        f" compensated {counts['compensated']}, refused {counts['refused']}")
    say(f"bytes stored {result['bytes_stored']:,}, referenced {result['bytes_referenced']:,},"
        f" reclaimed by gc {result['bytes_reclaimed']:,}; {result['events']} events")
    say(f"{sum(checks.values())}/{len(checks)} checks held in {elapsed:.2f}s"
        f" — demo {'PASSED' if ok else 'FAILED'}")
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
        report["workspace"] = None
        if url is None:  # a database outlives the demo's directory
            report["ledger"] = None
    return report


def _make_repo(repo: str, say: Say) -> None:
    for rel, text in INITIAL.items():
        os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
        with open(os.path.join(repo, rel), "w") as f:
            f.write(text)
    git = shutil.which("git")
    if git is None:
        say("  (git not found: the workspace is a plain directory)")
        return
    env = {**os.environ, "GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@example.invalid",
           "GIT_COMMITTER_NAME": "demo", "GIT_COMMITTER_EMAIL": "demo@example.invalid"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "initial"]):
        subprocess.run([git, *args], cwd=repo, env=env, check=False, capture_output=True)


def _first_worker(ledger: Ledger, repo: str, check: Callable[[str, bool], None], say: Say,
                  counts: dict[str, int]) -> None:
    say("1. worker 1 takes a lease on the repository and records its files (step s00)")
    ledger.workspaces.add(WS, repo)
    epoch = ledger.workspaces.acquire(WS, "worker-1", ttl_s=600).epoch
    # Recording the files as they are (a write whose new content is its current
    # content) makes them committed content: restore can rebuild them anywhere.
    out = run_fenced_step(ledger, WS, "s00", lambda read: [
        read.read(p).write(read.read(p).content) for p in sorted(INITIAL)], epoch=epoch, run=RUN)
    counts["steps_started"] += 1
    counts["committed"] += out.status is StepStatus.APPLIED
    agent = Agent(ledger, epoch, counts)

    say("2. the agent runs steps s01-s05 (plan -> fence -> apply -> artifacts -> publish -> ack)")
    for i in (1, 2):
        agent.finish(i)
    check("s01, s02 committed; their edits are on disk",
          ledger.step("s01").live and ledger.step("s02").live
          and b"def f02" in _read(repo, step_change(2, b"")[0]))

    say("3. s03's answer is lost: the harness redelivers the whole step")
    first = agent.run(3)
    before = ledger.head()
    again = agent.run(3)  # the same call again: the ledger answers, nothing runs
    counts["deduped"] += 1
    check("the redelivered step returns the first receipt and manifest, writing nothing",
          first.status is StepStatus.APPLIED and again.status is StepStatus.DEDUPED
          and again.receipt == first.receipt and again.manifest == first.manifest
          and ledger.head() == before)
    counts["committed"] += 1

    target = step_change(4, b"")[0]
    say(f"4. a human edits {target} while s04 (which writes it) is planned")

    def human_edits(stage: str) -> None:
        if stage == "planned":  # the plan is durable, nothing is written yet
            with open(os.path.join(repo, target), "ab") as f:
                f.write(b"\n# human: handle overflow before merging\n")

    verdict = agent.finish(4, on_stage=human_edits)
    say(f"     s04: {verdict}")
    check("s04 is rejected (pre_hash): the human's edit is not overwritten",
          verdict == "rejected:pre_hash" and b"# human:" in _read(repo, target))
    # run again: planned anew from the file as it is now (a rebase), attempt 2
    check("s04 re-planned on the human's edit applies and keeps it",
          agent.finish(4) == "applied" and b"# human:" in _read(repo, target)
          and ledger.step("s04").attempt == 2)

    say("5. s05's tests fail after it is committed: compensate it")
    before5 = _read(repo, step_change(5, b"")[0])
    r5 = agent.run(5)
    comp = ledger.workspaces.compensate("s05", epoch=epoch, reason="tests/test_calc.py failed")
    counts["compensated"] += 1
    check("compensation puts the pre-image back", r5.committed
          and [r.outcome for r in comp.restored] == ["restored"]
          and _read(repo, step_change(5, b"")[0]) == before5)
    agent.finish(5)  # the agent fixes it: a new attempt from the current state

    say("6. a buggy harness resends s01's plan with other content; another acks out of order")
    head = ledger.head()
    try:
        ledger.append(Planned(step="s01", attempt=1, run=RUN, artifacts=("other",)))
        check("a conflicting payload under a used journal key is refused", False)
    except IdempotencyConflict:
        counts["refused"] += 1
        check("a conflicting payload under a used journal key is refused, nothing written",
              ledger.head() == head)
    ledger.append(Planned(step="notes", attempt=1, run=RUN))
    counts["steps_started"] += 1
    mark = ledger.head()
    try:
        ledger.append(Acked(step="notes", attempt=1, run=RUN))
        check("an ack before any manifest is refused", False)
    except IllegalTransition:
        counts["refused"] += 1
        check("an ack before any manifest is refused, nothing written", ledger.head() == mark)


_KILLED = """
import json, os, signal, sys
sys.path.insert(0, {pkg!r})
from ledger import Ledger, run_fenced_step
from ledger.demo import RUN, WS, Agent
class Stopped(Exception):
    pass
def answered(stage):
    if stage == "applied":  # the sandbox applied s06 and answers 200 ...
        receipt = ledger.attempt("s06").receipt
        with open({receipt!r}, "wb") as f:
            f.write(__import__("msgspec").json.encode(receipt))
        raise Stopped  # ... which is in flight when its worker moves on
seen = []
def on_op(name):
    seen.append(name)
    if name == "ws-dirfsync" and "ws-rename" in seen:
        os.kill(os.getpid(), signal.SIGKILL)  # renamed into place, not yet recorded
counts = dict(steps_started=0, committed=0, rejected=0)
with Ledger.open({path!r}) as ledger:
    agent = Agent(ledger, ledger.workspaces.lease({ws!r}).epoch, counts)
    try:
        agent.run(6, on_stage=answered)
    except Stopped:
        pass
with Ledger.open({path!r}, on_op=on_op) as ledger:
    agent.ledger = ledger
    agent.run(7)                                              # ... and dies inside s07
"""


def _killed_worker(path: str, root: str, check: Callable[[str, bool], None], say: Say,
                   counts: dict[str, int]) -> None:
    say("7. worker 1 applies s06 (its 200 is in flight, never published) and is SIGKILLed"
        " inside s07, after the rename, before the commit")
    code = _KILLED.format(pkg=_package_root(), path=path, ws=WS,
                          receipt=os.path.join(root, "late-receipt.json"))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=False)
    check("worker 1 died by SIGKILL mid-step", child.returncode == -signal.SIGKILL)
    with Ledger.open(path, readonly=True) as ledger:
        s06, s07 = ledger.step("s06"), ledger.step("s07")
        say(f"     the ledger says: s06 {s06.state}, s07 {s07.state} (nothing committed)")
        check("neither s06 nor s07 is committed", not s06.live and not s07.live)
        counts["steps_started"] += 2  # (worker 1 planned both before it died)
    say("   the machine is gone: its workspace directory is lost")
    shutil.rmtree(os.path.join(root, "workspace"))


_FRESH = """
import sys
sys.path.insert(0, {pkg!r})
from ledger.demo import _fresh_worker_main
_fresh_worker_main({path!r}, {fresh!r})
"""


def _fresh_worker(path: str, fresh: str, check: Callable[[str, bool], None], say: Say,
                  counts: dict[str, int]) -> None:
    say("8. a fresh worker process on a fresh directory restores the workspace from the"
        " ledger, takes a new epoch (settling worker 1's attempts) and finishes the run")
    child = subprocess.run([sys.executable, "-c", _FRESH.format(pkg=_package_root(), path=path,
                                                                  fresh=fresh)],
                           capture_output=True, text=True, check=False)
    if child.returncode != 0:
        say(child.stderr.strip()[-2000:])
    out = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {}
    for line in out.get("log", []):
        say(f"     {line}")
    check("the fresh worker restored, settled and finished the run", child.returncode == 0)
    check("settling compensated worker 1's two unpublished attempts",
          sorted(out.get("settled", [])) == ["s06", "s07"])
    for key in ("steps_started", "committed"):
        counts[key] += out.get(key, 0)


def _fresh_worker_main(path: str, fresh: str) -> None:
    """Worker 2 (its own process): restore, new epoch, finish s06..s10."""
    log: list[str] = []
    counts = {"steps_started": 0, "committed": 0, "rejected": 0}
    with Ledger.open(path) as ledger:
        restored = ledger.workspaces.restore(WS, fresh, force=True)  # worker 1's lease is still live
        log.append(f"restored {restored.paths} files ({restored.bytes} bytes) into {fresh}")
        lease = ledger.workspaces.acquire(WS, "worker-2", ttl_s=600, force=True)
        log.append(f"epoch {lease.epoch}; settled {', '.join(lease.settled)}")
        agent = Agent(ledger, lease.epoch, counts)
        for i in range(6, STEPS + 1):  # s06, s07 were settled: planned anew from fresh reads
            agent.finish(i)
        log.append(f"committed s06..s{STEPS:02d}; workspace rev {ledger.workspaces.get(WS).rev}")
    print(json.dumps({"log": log, "settled": list(lease.settled), **counts}))


def _late_receipt(ledger: Ledger, root: str, check: Callable[[str, bool], None], say: Say,
                  counts: dict[str, int]) -> None:
    say("9. worker 1's late 200 for s06 arrives after its sandbox was reclaimed")
    with open(os.path.join(root, "late-receipt.json"), "rb") as f:
        late = f.read()
    try:
        ledger.publish("s06", receipt=late)
        check("the late receipt is refused", False)
    except StaleEpoch as exc:
        counts["refused"] += 1
        say(f"     refused: {exc}")
        check("the late receipt of a dead epoch commits nothing (StaleEpoch)",
              ledger.step("s06").attempt == 2)


def _closing_checks(ledger: Ledger, fresh: str, check: Callable[[str, bool], None],
                    say: Say, counts: dict[str, int]) -> dict[str, Any]:
    from .gc import audit, collect
    from .workspace.restore import committed_content

    say("10. the restored workspace holds exactly the committed content")
    content = committed_content(ledger, WS)
    check("every committed file reads back with its committed hash (I9)",
          all(digest_of(_read(fresh, p)) == d for p, d in content.items() if d is not None))
    check(f"all {STEPS} steps and s00 are committed",
          all(ledger.step(f"s{i:02d}").live for i in range(STEPS + 1)))

    say("11. orphan-blob GC (grace forced to 0 for the demo) and the byte audit")
    before = audit(ledger, grace_s=0)
    gc = collect(ledger, grace_s=0, force=True)
    after = audit(ledger, grace_s=0)
    say(f"     gc: scanned {gc.scanned} blobs, {gc.orphans} orphans, reclaimed"
        f" {gc.reclaimed_bytes:,} bytes; kept {gc.kept_live} live, {gc.referenced} referenced")
    say(f"     audit: stored {after.stored_bytes:,} = referenced {after.referenced.bytes:,}"
        f" + pinned {after.pinned.bytes:,} + orphans {after.orphan_young.bytes + after.orphan_old.bytes:,}"
        f" + temporary {after.temporary.bytes:,}")
    check("gc collected the compensated attempt's orphan artifacts",
          gc.collected >= 1 and gc.reclaimed_bytes > 0)
    check("audit reconciles every byte, nothing dangling, before and after gc",
          before.ok and after.ok and after.orphan_old.count == 0)

    say("12. projections are rebuilt from the events; the chain and I3/I4/I5 re-checked")
    inline = ledger.steps()
    ledger.rebuild()
    check("inline projections == rebuild", ledger.steps() == inline)
    report = ledger.verify()
    check("verify: chain, seqs, projections, fences, journal, epochs all hold", report.ok)
    return {"events": report.events, "head": f"{report.head_seq}:{report.head_hash}",
            "bytes_stored": after.stored_bytes, "bytes_referenced": after.referenced.bytes,
            "bytes_reclaimed": gc.reclaimed_bytes, "audit": after.as_dict(), "gc": gc.as_dict()}


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


__all__ = ["run_demo", "step_change", "step_outputs"]

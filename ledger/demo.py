"""`stepledger demo`: the main job, end to end, on an embedded ledger.

A scripted agent (no model calls) drives steps through a fresh ledger and meets
the failures stepledger exists for. Every failure is real: the crash is a child
process killed with SIGKILL between two commits, and the ledger is reopened from
the file afterwards. The report lists each check; the demo passes only if all hold.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Any

from .blobs import digest_of
from .errors import IdempotencyConflict, IllegalTransition, StaleEpoch
from .events import Acked, Planned
from .fences import StepPlan, Write
from .ledger import Ledger
from .steps import run_step

Echo = Callable[[str], None] | None


def outputs_for(i: int) -> dict[str, bytes]:
    """Step i's artifacts: a small report (inline) and, every fifth step, a large log (a file)."""
    out = {f"out/{i}.txt": f"step {i} output\n".encode() * (i + 1)}
    if i % 5 == 0:
        out[f"logs/{i}.log"] = (f"step {i} log line\n".encode()) * 8000  # ~140 KiB
    return out


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from ledger import Ledger
    with Ledger.open({path!r}) as ledger:
        row = ledger.plan("s-crash", run="demo-run", artifacts=["report.txt"])
        ledger.store("s-crash", row.attempt, "report.txt", b"crash-test output")  # durable
        os.kill(os.getpid(), signal.SIGKILL)   # dies before publishing
    """
)


_APPLY_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from ledger import Ledger
    seen = []
    def on_op(name):
        seen.append(name)
        if name == "ws-dirfsync" and "ws-rename" in seen:
            os.kill(os.getpid(), signal.SIGKILL)   # renamed into place, not yet recorded
    with Ledger.open({path!r}, on_op=on_op) as ledger:
        ledger.apply("w-3", epoch={epoch})
    """
)


def _workspace_part(ledger: Ledger, root: str, check: Callable[[str, bool], None],
                    say: Callable[[str], None], counts: dict[str, int]) -> tuple[int, int]:
    """Sections 5-6: fences, the apply journal, epoch leases. Returns (epoch, w-3's attempt)."""
    repo = os.path.join(root, "repo")
    os.makedirs(repo)
    app = os.path.join(repo, "app.py")
    with open(app, "w") as f:
        f.write("v0\n")

    def disk() -> str:
        with open(app) as f:
            return f.read()

    def write(step: str, new: str, pre: str, base: int | None = None) -> StepPlan:
        return StepPlan(step, [Write("app.py", new.encode(), digest_of(pre.encode()), base)],
                        run="edit-run")

    say("5. an agent edits a workspace under a lease; a human edits it too")
    ledger.add_workspace("repo", repo)
    epoch = ledger.acquire("repo", "agent-1", ttl_s=600).epoch
    ledger.admit("repo", epoch, [write("w-1", "v1\n", "v0\n"), write("w-2", "v2\n", "v1\n")])
    counts["steps_started"] += 2
    first = ledger.apply("w-1", epoch=epoch)
    ledger.publish("w-1", receipt=first.receipt)
    ledger.ack("w-1")
    check("w-1 applied and committed (fence: rev and pre_hash held)",
          first.verdict == "applied" and disk() == "v1\n" and ledger.step("w-1").live)
    again = ledger.apply("w-1", 1, epoch=epoch)
    counts["deduped"] += 1
    check("a redelivered apply is answered by the journal, nothing applied twice",
          again.verdict == "deduped" and again.receipt == first.receipt
          and ledger.workspace("repo").rev == 1)
    with open(app, "w") as f:
        f.write("v1 + a human's edit\n")
    stale = ledger.apply("w-2", epoch=epoch)
    counts["refused"] += 1
    say(f"     w-2 after the human's edit: {stale.verdict} ({stale.detail})")
    check("a step planned before the human's edit is rejected; the edit survives",
          stale.verdict == "rejected:pre_hash" and disk() == "v1 + a human's edit\n")
    rev, current = ledger.snapshot("repo", "app.py")
    ledger.admit("repo", epoch, [StepPlan("w-2b", [Write("app.py", b"v2 on the human's edit\n",
                                                         current, rev)], run="edit-run")])
    counts["steps_started"] += 1
    rebased = ledger.apply("w-2b", epoch=epoch)
    ledger.publish("w-2b")
    ledger.ack("w-2b")
    check("re-planned from the current state (a rebase), it applies", rebased.verdict == "applied")

    say("6. the sandbox is reclaimed mid-step: a new epoch, and a zombie of the old one")
    ledger.admit("repo", epoch, [write("w-3", "v3\n", "v2 on the human's edit\n")])
    counts["steps_started"] += 1
    new = ledger.acquire("repo", "agent-2", ttl_s=600, force=True)
    try:
        ledger.apply("w-3", epoch=epoch)
        check("the zombie's apply is refused", False)
    except StaleEpoch as exc:
        counts["refused"] += 1
        say(f"     refused: {exc}")
        check("the zombie of epoch 1 cannot apply (StaleEpoch), the file is untouched",
              disk() == "v2 on the human's edit\n" and new.settled == ("w-3",))
    return new.epoch, ledger.replan("w-3", epoch=new.epoch)


def _workspace_crash(ledger: Ledger, root: str, epoch: int, attempt: int,
                     check: Callable[[str, bool], None], say: Callable[[str], None]) -> None:
    """The second half of section 8, after the SIGKILL: replay, then compensate."""
    app = os.path.join(root, "repo", "app.py")

    def disk() -> str:
        with open(app) as f:
            return f.read()

    row = ledger.step("w-3")
    say(f"     after reopen: w-3 attempt {row.attempt} is {row.state}, app.py holds {disk()!r}")
    check("the killed apply is not recorded, its rename is on disk",
          row.state == "planned" and disk() == "v3\n")
    replay = ledger.apply("w-3", attempt, epoch=epoch)
    check("the replay under the same epoch records what is on disk (settled)",
          replay.verdict == "applied" and replay.receipt is not None and replay.receipt.settled)
    ledger.publish("w-3")
    comp = ledger.compensate("w-3", epoch=epoch, reason="its tests failed")
    check("compensation puts the pre-image back and ends the live manifest",
          [r.outcome for r in comp.restored] == ["restored"]
          and disk() == "v2 on the human's edit\n" and not ledger.step("w-3").live)


def run_demo(keep: str | None = None, echo: Echo = print) -> dict[str, Any]:
    say = echo or (lambda _m: None)
    root = keep or tempfile.mkdtemp(prefix="stepledger-demo-")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, ".stepledger", "ledger.db")
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists; give --keep an empty directory")
    checks: dict[str, bool] = {}
    counts = {"steps_started": 0, "committed": 0, "deduped": 0, "refused": 0}
    t0 = time.perf_counter()

    def check(name: str, ok: bool) -> None:
        checks[name] = bool(ok)
        say(f"  [{'ok' if ok else 'FAIL'}] {name}")

    say(f"stepledger demo: ledger {path}")
    with Ledger.init(path) as ledger:
        say("1. an agent commits 20 steps (plan -> pin -> durable blobs -> publish -> ack)")
        for i in range(20):
            run_step(ledger, f"s-{i:02d}", outputs_for(i), run="demo-run")
            counts["steps_started"] += 1
        check("20 steps committed", sum(r.live for r in ledger.steps()) == 20)
        check("every committed step's blobs are intact",
              all(ledger.classify(f"s-{i:02d}") == "committed" for i in range(20)))

        say("2. a lost ack: the harness redelivers step s-03 (with byte-different output)")
        before = ledger.head()
        first = ledger.manifest("s-03")
        again = run_step(ledger, "s-03", {"out/3.txt": b"different bytes, same meaning"})
        counts["deduped"] += 1
        check("redelivery returns the first manifest and writes nothing",
              not again.ran and again.manifest == first and ledger.head() == before)

        say("3. a buggy retry sends a different plan under the same journal key")
        try:
            ledger.append(Planned(step="s-04", attempt=1, run="demo-run", artifacts=("other",)))
            check("conflicting payload refused", False)
        except IdempotencyConflict as exc:
            counts["refused"] += 1
            say(f"     refused: {exc}")
            check("conflicting payload refused, nothing written", ledger.head() == before)

        say("4. an out-of-order ack (before any manifest) for a new step")
        ledger.append(Planned(step="s-early", attempt=1, run="demo-run"))
        counts["steps_started"] += 1
        mark = ledger.head()
        try:
            ledger.append(Acked(step="s-early", attempt=1, run="demo-run"))
            check("illegal transition refused", False)
        except IllegalTransition as exc:
            counts["refused"] += 1
            say(f"     refused: {exc}")
            check("illegal transition refused, nothing written", ledger.head() == mark)

        epoch, attempt = _workspace_part(ledger, root, check, say, counts)

    say("7. a worker is killed with SIGKILL after storing its output, before publishing")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=_package_root(), path=path)],
        capture_output=True, text=True, check=False,
    )
    counts["steps_started"] += 1
    check("worker died by SIGKILL", child.returncode == -signal.SIGKILL)
    say("8. a worker is SIGKILLed after renaming w-3's file into place, before recording it")
    child = subprocess.run(
        [sys.executable, "-c", _APPLY_CHILD.format(root=_package_root(), path=path, epoch=epoch)],
        capture_output=True, text=True, check=False,
    )
    check("worker died by SIGKILL mid-apply", child.returncode == -signal.SIGKILL)
    with Ledger.open(path) as ledger:
        crashed = ledger.step("s-crash")
        say(f"     after reopen: s-crash is {crashed.state}, committed={crashed.live}")
        check("the dead worker's step is recorded but not committed",
              crashed.state == "blob-stored" and not crashed.live)
        say("   a fresh worker replays s-crash with the same step id (same attempt)")
        replay = run_step(ledger, "s-crash", {"report.txt": b"crash-test output"}, run="demo-run")
        counts["deduped"] += 1
        check("replay continues attempt 1 and commits it",
              replay.ran and replay.attempt == 1 and ledger.classify("s-crash") == "committed")

        say("   and w-3's replay under the live epoch")
        _workspace_crash(ledger, root, epoch, attempt, check, say)

        say("9. projections are rebuilt from the events and compared")
        inline = ledger.steps()
        ledger.rebuild()
        check("inline projections == rebuild", ledger.steps() == inline)
        counts["committed"] = sum(r.live for r in ledger.steps())
        head = ledger.head()
        report = ledger.verify(expect_head=head)
        check("verify: chain, seqs and projections ok", report.ok)
        n_events = report.events

    say("10. someone restores an older copy of the ledger (the tail is cut off)")
    old = os.path.join(root, "rolled-back.db")
    _copy_prefix(path, old, head.seq - 2)
    blob_root = os.path.join(os.path.dirname(path), "blobs")
    with Ledger.open(old, readonly=True, blob_root=blob_root) as rolled:
        plain = rolled.verify()
        anchored = rolled.verify(expect_head=head)
    check("the chain alone cannot see a cut-off tail", plain.ok)
    check("verify --expect-head catches it", not anchored.ok)

    elapsed = time.perf_counter() - t0
    ok = all(checks.values())
    result = {
        "ok": ok,
        "ledger": path,
        "events": n_events,
        "head": str(head),
        **counts,
        "checks": checks,
        "elapsed_s": round(elapsed, 3),
    }
    say("")
    say(f"steps started {counts['steps_started']}, committed {counts['committed']},"
        f" deduped events {counts['deduped']}, refused {counts['refused']};"
        f" {n_events} events, head {head.seq}")
    say(f"{sum(checks.values())}/{len(checks)} checks held in {elapsed:.2f}s"
        f" — demo {'PASSED' if ok else 'FAILED'}")
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)
        result["ledger"] = None
    return result


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_prefix(src: str, dst: str, last_seq: int) -> None:
    """A genuine older copy: the same ledger as it was at `last_seq` (a rollback)."""
    import apsw

    shutil.copy(src, dst)
    if os.path.exists(src + "-wal"):
        shutil.copy(src + "-wal", dst + "-wal")
    conn = apsw.Connection(dst)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE seq > ?", (last_seq,))
    from .db import MIGRATIONS

    trigger = MIGRATIONS[1].split("CREATE TRIGGER events_no_delete", 1)[1].split("END;", 1)[0]
    conn.execute("CREATE TRIGGER events_no_delete" + trigger + "END;")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with Ledger.open(dst) as ledger:
        ledger.rebuild()


__all__ = ["outputs_for", "run_demo"]

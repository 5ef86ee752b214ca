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

from .errors import IdempotencyConflict, IllegalTransition
from .events import Acked, Planned
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

    say("5. a worker is killed with SIGKILL after storing its output, before publishing")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=_package_root(), path=path)],
        capture_output=True, text=True, check=False,
    )
    counts["steps_started"] += 1
    check("worker died by SIGKILL", child.returncode == -signal.SIGKILL)
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

        say("6. projections are rebuilt from the events and compared")
        inline = ledger.steps()
        ledger.rebuild()
        check("inline projections == rebuild", ledger.steps() == inline)
        counts["committed"] = sum(r.live for r in ledger.steps())
        head = ledger.head()
        report = ledger.verify(expect_head=head)
        check("verify: chain, seqs and projections ok", report.ok)
        n_events = report.events

    say("7. someone restores an older copy of the ledger (the tail is cut off)")
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

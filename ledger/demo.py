"""`stepledger demo`: the main job, end to end, on an embedded ledger.

A scripted agent (no model calls) drives steps through a fresh ledger and meets
the failures stepledger exists for. Every failure is real: the crash is a child
process killed with SIGKILL between two commits, and the ledger is reopened from
the file afterwards. The report lists each check; the demo passes only if all hold.
"""

from __future__ import annotations

import hashlib
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
from .events import Acked, BlobStored, ManifestEntry, ManifestPublished, Planned
from .ledger import Ledger
from .log import Head

Echo = Callable[[str], None] | None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def step_events(step: str, attempt: int, outputs: dict[str, bytes], run: str = "demo-run") -> list[Any]:
    """The artifact protocol of one step as events: plan, store each output, publish, ack."""
    entries = tuple(
        ManifestEntry(path=p, digest=_digest(b), size=len(b)) for p, b in sorted(outputs.items())
    )
    manifest = _digest(b"".join(f"{e.path}\0{e.digest}\0{e.size}\n".encode() for e in entries))
    return [
        Planned(step=step, attempt=attempt, run=run, artifacts=tuple(sorted(outputs))),
        *(BlobStored(step=step, attempt=attempt, run=run, digest=e.digest, size=e.size, path=e.path)
          for e in entries),
        ManifestPublished(step=step, attempt=attempt, run=run, manifest_rev=0, digest=manifest,
                          artifacts=entries),
        Acked(step=step, attempt=attempt, run=run, manifest_rev=0),
    ]


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from ledger import Ledger
    from ledger.demo import step_events
    events = step_events("s-crash", 1, {{"report.txt": b"crash-test output"}})
    with Ledger.open({path!r}) as ledger:
        for event in events[:2]:          # planned, blob-stored: durable
            ledger.append(event)
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
        say("1. an agent commits 20 steps (plan -> store outputs -> publish -> ack)")
        for i in range(20):
            outputs = {f"out/{i}.txt": f"step {i} output\n".encode() * (i + 1)}
            ledger.append_batch(step_events(f"s-{i:02d}", 1, outputs))
            counts["steps_started"] += 1
        check("20 steps committed", sum(r.live for r in ledger.steps()) == 20)

        say("2. a lost ack: the harness redelivers step s-03's events")
        before = ledger.head()
        again = ledger.append_batch(step_events("s-03", 1, {"out/3.txt": b"step 3 output\n" * 4}))
        counts["deduped"] += sum(r.deduped for r in again)
        check("redelivery returns the first result and writes nothing",
              all(r.deduped for r in again) and ledger.head() == before)

        say("3. a buggy retry sends different bytes under the same journal key")
        try:
            ledger.append_batch(step_events("s-04", 1, {"out/4.txt": b"something else"}))
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
        replay = ledger.append_batch(step_events("s-crash", 1, {"report.txt": b"crash-test output"}))
        counts["deduped"] += sum(r.deduped for r in replay)
        check("replay continues the attempt: 2 deduped, publish+ack new",
              [r.deduped for r in replay] == [True, True, False, False])
        check("s-crash committed after replay", ledger.step("s-crash").live)

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
    with Ledger.open(old, readonly=True) as rolled:
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


__all__ = ["run_demo", "step_events", "Head"]

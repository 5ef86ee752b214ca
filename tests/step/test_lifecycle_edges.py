"""The edges of a step's lifecycle after it moved to ledger/step/, found by a red-team
pass on that move (each failed before its fix): the store's lock held by the caller
while another thread leads a group commit, re-acking a superseded manifest, a stage
hook's exception, a journal-off step stopped after its apply, detail lines that could
forge a line of output, an append inside a read, `Ledger.attempt`'s bad input, the names
that moved, a grace window that is not a finite number."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

from conftest import FakeClock, run_cli

from ledger import (
    CorruptLedger,
    Ledger,
    LedgerError,
    StaleEpoch,
    run_fenced_step,
    run_step,
)


def _ledger_with_workspace(tmp_path: Path) -> tuple[Ledger, Path, int]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("v0\n")
    led = Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock())
    led.workspaces.add("repo", str(repo))
    lease = led.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    return led, repo, lease.epoch


def _edit(content: bytes):
    return lambda read: [read.read("app.py").write(content)]


# -- 1. ack after a supersede answers with the superseded manifest's ack ---------------


def test_ack_again_after_a_supersede_answers_the_newest_ack(tmp_path: Path) -> None:
    """`Ledger.ack` on an attempt already acked now answers its FIRST ack (read_attempt
    keeps `acked = acked or ...`); e07a068 answered the newest one. After a supersede
    (publish expected_rev=0, ack r1), the idempotent re-ack says manifest r0 — the
    superseded manifest — and a client checking `manifest_rev` is told the wrong one."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "s", {"a": b"1"})
        led.store("s", 1, "a", b"2")
        led.publish("s", 1, expected_rev=0)
        fresh = led.ack("s", 1)
        assert fresh.event.manifest_rev == 1 and not fresh.deduped
        again = led.ack("s", 1)
        assert again.deduped
        assert again.event.manifest_rev == led.step("s").manifest_rev == 1, (
            f"the re-ack answered ack #{again.seq} of manifest r{again.event.manifest_rev},"
            f" not #{fresh.seq} of the live r1")
        assert again.seq == fresh.seq


# -- 2. on_stage raising StaleEpoch is swallowed into a lying outcome ----------------


def test_on_stage_exception_is_not_turned_into_a_stale_epoch_outcome(tmp_path: Path) -> None:
    """A hook that raises StaleEpoch (here: it heartbeats another workspace with a wrong
    epoch) at "applied" — the step committed in that very commit — is caught by
    run_fenced_step's `except StaleEpoch` and returned as STALE_EPOCH ("this caller
    commits nothing") although the step is committed and acked. The docstring says an
    exception from on_stage ends the call there, as a crash would."""
    led, _repo, epoch = _ledger_with_workspace(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    led.workspaces.add("other", str(other))
    other_lease = led.workspaces.acquire("other", holder="agent-2", ttl_s=600)

    def hook(stage: str) -> None:
        if stage == "applied":
            led.workspaces.heartbeat("other", other_lease.epoch + 5)  # raises StaleEpoch

    try:
        out = run_fenced_step(led, "repo", "e1", _edit(b"v1\n"), epoch=epoch, on_stage=hook)
    except StaleEpoch:
        return  # the hook's exception reached the caller: fine
    finally:
        row = led.step("e1")
    assert not (row.live and not out.committed), (
        f"the step is {row.state} (live) but the outcome says {out.status.value}:"
        f" {out.detail}")


# -- 3. Ledger.attempt: a kind that is not one, an attempt that does not exist ----------


@pytest.mark.parametrize("kind", ["bogus", "Planned", "", 5])
def test_attempt_refuses_a_kind_that_is_not_an_event_kind(tmp_path: Path, kind: object) -> None:
    """`ledger.attempt(step, kind="bogus")` returns an empty Attempt (no plan, no ack):
    a typo reads as "this attempt never began". It should raise InvalidInput naming the
    kinds (ledger.events.KIND_SPECS)."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "s1", {"a.txt": b"x"})
        with pytest.raises(LedgerError, match="kind"):
            led.attempt("s1", kind=kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("attempt", [2, 5, 2**62])
def test_attempt_refuses_an_attempt_the_step_never_had(tmp_path: Path, attempt: int) -> None:
    """Attempt 5 of a step that had one attempt is answered as an empty Attempt(attempt=5)
    — indistinguishable from an attempt whose events were lost. An unknown step raises
    UnknownStep; an unknown attempt should raise too (naming the latest attempt)."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "s1", {"a.txt": b"x"})
        with pytest.raises(LedgerError, match="attempt"):
            led.attempt("s1", attempt)


def test_attempt_names_a_non_string_step_correctly(tmp_path: Path) -> None:
    """`ledger.attempt(123)` says "step id 123 is empty" (check_step_id's message for a
    non-str): the fix it names is wrong."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        with pytest.raises(LedgerError) as got:
            led.attempt(123)  # type: ignore[arg-type]
        assert "empty" not in str(got.value), str(got.value)


# -- 4. hostile text in detail lines forges lines of `show` / `events` / MCP audit -----


FORGED = "       77  2024-01-01T00:00:00.000Z  #1 acked              acknowledged (manifest r0)"


def test_show_and_events_escape_control_characters_in_detail_lines(tmp_path: Path) -> None:
    """A compensation reason (Text: no control-character check) holding a newline and
    an OSC 52 sequence is printed raw by `steptrail show` and `steptrail events`
    (ledger.kinds.detail feeds them, nothing escapes it): the reason forges a whole
    timeline line (indistinguishable from a real one now that the detail is prose, not
    key=value) and can set the terminal's clipboard. The CLI already has `_shown`
    (status uses it); show/events/seal show should pass every detail through it."""
    led, _repo, epoch = _ledger_with_workspace(tmp_path)
    run_fenced_step(led, "repo", "e1", _edit(b"v1\n"), epoch=epoch).raise_for_status()
    led.workspaces.compensate("e1", epoch=epoch,
                              reason="oops\n" + FORGED + "\x1b]52;c;ZXZpbA==\x07")
    n_events = len(led.timeline("e1"))
    led.close()
    env = {"STEPTRAIL_LEDGER": str(tmp_path / "ledger.db")}
    shown = run_cli(["show", "e1"], env=env)
    assert shown.code == 0
    assert "\x1b" not in shown.out and "\x07" not in shown.out
    timeline = [line for line in shown.out.splitlines() if re.match(r"^\s+\d+\s+\d{4}-", line)]
    assert len(timeline) == n_events, shown.out
    events = run_cli(["events", "--step", "e1"], env=env)
    assert "\x1b" not in events.out
    assert len(events.out.splitlines()) == n_events, events.out


def test_a_workspace_root_with_a_newline_does_not_forge_an_events_line(tmp_path: Path) -> None:
    """A directory name may hold a newline; `workspace-added`'s detail line is the root
    itself (kinds._registered), so `steptrail events` prints two lines for one event."""
    root = tmp_path / ("ws\n" + FORGED)
    root.mkdir()
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        led.workspaces.add("repo", str(root))
        n = led.count()
    out = run_cli(["events"], env={"STEPTRAIL_LEDGER": str(tmp_path / "ledger.db")})
    assert len(out.out.splitlines()) == n, out.out


def test_kinds_detail_is_one_line_of_printable_text() -> None:
    """`ledger.kinds.detail` is "the line that shows one event": it should be one line
    whatever the event holds (the MCP audit joins these with newlines for the model)."""
    from ledger.events import Compensating, Rejected
    from ledger.kinds import detail

    for event in (Compensating(step="s", attempt=1, reason="a\nb\rc\x1b[2J"),
                  Rejected(step="s", attempt=1, reason="pre_hash", detail="x\ny\u202ez")):
        line = detail(event)
        assert not any(c in line for c in "\n\r\x1b\u202e"), repr(line)


# -- 5. held_here / appends inside a read: a false "damaged ledger" --------------------


def test_append_inside_a_read_is_a_typed_refusal_not_a_damaged_ledger(tmp_path: Path) -> None:
    """`Store.held_here()` says an append from inside this thread's read "is nested: it
    joins that transaction". On SQLite it cannot: BEGIN IMMEDIATE inside the read's BEGIN
    fails and the error is translated to CorruptLedger "ledger … is damaged … restore
    the file from a backup" — an operator told to restore a healthy ledger. It should be
    a refusal that names the fix (append after the read, or in a transaction)."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "a", {"x": b"1"})
        with pytest.raises(LedgerError) as got:
            with led.storage.read():
                run_step(led, "b", {"x": b"2"})
        assert not isinstance(got.value, CorruptLedger), str(got.value)
        assert not led.storage.held_here()
        assert led.verify().ok


def test_a_callers_exception_inside_a_read_is_not_a_damaged_ledger(tmp_path: Path) -> None:
    """A ValueError raised by the caller's own code inside `with ledger.storage.read():`
    came out as CorruptLedger ("a row cannot be read (ValueError: x) … restore the file
    from a backup" — advice that could cost a person their newest work):
    Database.read_transaction translated every ROW_ERRORS exception thrown into its
    `yield`. Now the view names a row it cannot read where it meets it, and the caller's
    own exception passes through as it is."""
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "a", {"x": b"1"})
        for exc in (ValueError("the caller's own bug"), KeyError("k"), TypeError("t")):
            with pytest.raises(type(exc)):
                with led.storage.read():
                    raise exc
        assert not led.storage.held_here()


@pytest.mark.parametrize("read", ["call", "paged", "iterating"])
def test_a_row_the_view_cannot_read_is_a_damaged_ledger_inside_a_read_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str) -> None:
    """The other half: a row the view cannot make (a damaged cell) inside a read
    transaction is still CorruptLedger, named where it is met — by a plain read
    (`journal_lookup`), a paged one (`events`) and an iterating one (`table_rows`'s
    cursor); shown failing when the view lets it out raw (`raw`)."""
    import ledger.store.view as view_mod
    from ledger.errors import CorruptLedger

    def broken(*_: object) -> object:
        raise ValueError("a damaged cell")

    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "a", {"x": b"1"})
        key = next(iter(led.read())).journal_key
        monkeypatch.setattr(view_mod, "make_event_row", broken)
        with pytest.raises(CorruptLedger, match="a damaged cell"):
            with led.storage.read() as view:
                if read == "call":
                    view.journal_lookup(key)
                elif read == "paged":
                    list(view.events())
                else:
                    rows = view.table_rows("events")
                    monkeypatch.setattr(rows, "_it", map(broken, range(1)))
                    list(rows)


def test_the_damaged_row_checker_catches_a_raw_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above fails on a view that lets the row's error out raw: without the
    translation in `store.base._locked`, the ValueError passes a read transaction now."""
    import ledger.store.base as base_mod
    import ledger.store.view as view_mod

    def broken(*_: object) -> object:
        raise ValueError("a damaged cell")

    monkeypatch.setattr(base_mod, "ROW_ERRORS", ())  # the translation gone
    monkeypatch.setattr(view_mod, "ROW_ERRORS", ())
    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "a", {"x": b"1"})
        key = next(iter(led.read())).journal_key
        monkeypatch.setattr(view_mod, "make_event_row", broken)
        with pytest.raises(ValueError, match="a damaged cell"):
            with led.storage.read() as view:
                view.journal_lookup(key)


# -- 6. the journal off: a crash after the apply is never finished by a re-run ---------


def test_rerun_finishes_a_journal_off_step_stopped_after_its_apply(tmp_path: Path) -> None:
    """on_stage's contract: "An exception it raises ends the call there, as a crash would
    leave the step (a re-run finishes it)". With journal=False and an artifact too large
    for a row, a stop at "applied" leaves the step `fenced`; every re-run then reports
    CONFLICT ("app.py is at rev 1, planned against rev 0" — the step's own write) and the
    step stays `fenced` for ever. (The same with e07a068 when the store fails there.)"""
    led, repo, epoch = _ledger_with_workspace(tmp_path)
    big = {"out.bin": os.urandom(led.inline_max_bytes + 1)}

    class Stop(Exception):
        pass

    def stop(stage: str) -> None:
        if stage == "applied":
            raise Stop

    with pytest.raises(Stop):
        run_fenced_step(led, "repo", "e1", _edit(b"v1\n"), epoch=epoch, artifacts=big,
                        journal=False, on_stage=stop)
    out = run_fenced_step(led, "repo", "e1", _edit(b"v1\n"), epoch=epoch, artifacts=big,
                          journal=False)
    assert out.committed, (out.status.value, out.detail, led.step("e1").state)
    assert (repo / "app.py").read_bytes() == b"v1\n"
    assert led.verify().ok


# -- 7. public names gone -------------------------------------------------------------


@pytest.mark.parametrize("module, name", [
    ("ledger.workspace", "Workspaces"),
    ("ledger.workspace", "StepPlan"),
    ("ledger.workspace", "Write"),
    ("ledger.workspace", "ApplyResult"),
    ("ledger.workspace", "settle_conflicts"),
])
def test_names_ledger_workspace_exported_still_import(module: str, name: str) -> None:
    """`ledger.workspace` is a public module: the names it exported before the move
    still import from it (aliases of `ledger.workspaces` and `ledger.step.values`)."""
    import ledger

    mod = importlib.import_module(module)
    assert getattr(mod, name) is getattr(ledger, name)


@pytest.mark.parametrize("gone", ["ledger.workspace.protocol", "ledger.store.sqlite.file",
                                  "ledger.store.Guard", "ledger.log.Guard"])
def test_internal_names_that_went_are_in_the_changelog(gone: str) -> None:
    """Internal modules and names that were renamed are said in CHANGELOG.md."""
    root = Path(__file__).resolve().parents[2]
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"`{gone}`" in changelog, gone


def test_docs_name_no_module_that_is_gone() -> None:
    root = Path(__file__).resolve().parents[2]
    gone = []
    for doc in ["ARCHITECTURE.md", "docs/internals.md", "ledger/ledger.py",
                "ledger/workspace/core.py"]:
        text = (root / doc).read_text(encoding="utf-8")
        for ref in ("workspace/protocol.py", "ledger.workspace.Workspaces"):
            if ref in text:
                gone.append(f"{doc}: {ref}")
    assert not gone, gone


# -- 8. check_grace: "a window is checked once" lets NaN / inf / str through ----------


@pytest.mark.parametrize("grace", [float("nan"), float("inf"), "3600"])
def test_gc_refuses_a_grace_window_that_is_not_a_finite_number(tmp_path: Path,
                                                               grace: object) -> None:
    """`ledger.gc.collect(grace_s=nan)` passes check_grace (every comparison with NaN is
    False) and dies in int(nan) with ValueError; inf → OverflowError; "3600" → TypeError.
    check_grace is the one check: it should refuse them with InvalidInput."""
    from ledger.gc import collect

    with Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock()) as led:
        run_step(led, "s", {"a": b"1"})
        with pytest.raises(LedgerError):
            collect(led, grace_s=grace, dry_run=True, force=True)  # type: ignore[arg-type]


def test_append_inside_a_read_on_postgres_is_a_typed_refusal(pg_url: str) -> None:
    """The same on PostgreSQL: `held_here()` sends the append down the nested path, and
    PgStore._begin raises a bare RuntimeError("a write transaction inside a read
    transaction") — not a LedgerError, so the CLI/MCP print a traceback or 'internal
    error'."""
    with Ledger.init(pg_url, clock=FakeClock()) as led:
        run_step(led, "a", {"x": b"1"})
        with pytest.raises(LedgerError):
            with led.storage.read():
                run_step(led, "b", {"x": b"2"})
        assert not led.storage.held_here()


def test_an_append_while_holding_the_store_lock_does_not_deadlock(tmp_path: Path) -> None:
    """REGRESSION (e07a068 passes). `Store.lock` is public ("re-entrant; held by every use
    of the store's connection"). EventLog.append used to take the nested path whenever
    this thread owned the lock (`lock._is_owned()`); it now asks `held_here()`, which
    counts only `read()`/`transaction()`. A thread that holds `storage.lock` and appends
    while another thread's append is leading (waiting for that lock) joins the group
    queue and waits for the leader, which waits for the lock it holds: deadlock."""
    import threading
    import time

    led = Ledger.init(str(tmp_path / "ledger.db"), clock=FakeClock())
    run_step(led, "x", {"a": b"0"})
    done: dict[str, bool] = {}

    def other() -> None:
        run_step(led, "b", {"a": b"b"})
        done["b"] = True

    second = threading.Thread(target=other, daemon=True)

    def holder() -> None:
        with led.storage.lock:
            second.start()
            time.sleep(0.3)  # the other append leads now, waiting for the store's lock
            run_step(led, "a", {"a": b"a"})
            done["a"] = True

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "deadlock: the append under storage.lock never returned"
    # Both appends end before the ledger closes: a thread still appending when it closes
    # raises in the thread, and pytest charges that to whichever test runs next.
    second.join(10)
    assert not second.is_alive(), "the second append never returned"
    assert done == {"a": True, "b": True}
    led.close()

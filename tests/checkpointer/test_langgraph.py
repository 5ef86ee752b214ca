"""ledger.langgraph: LangGraph's own conformance suite, write ownership, bad input.

The conformance suite (langgraph-checkpoint-conformance 0.0.2) drives the saver's async
API on an embedded ledger, every capability, base and optional; its report is the one
README.md shows between the `langgraph-conformance` markers. The test fails when the
README's copy differs from what this run produced; STEPTRAIL_UPDATE_README=1 rewrites
it instead.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LedgerAt

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from ledger import InvalidInput, Ledger, LeaseHeld, StaleEpoch
from ledger.langgraph import LedgerSaver

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BEGIN = "<!-- langgraph-conformance:begin -->"
END = "<!-- langgraph-conformance:end -->"
SUITE = "langgraph-checkpoint-conformance 0.0.2"


def render(report: Any) -> str:
    """The report as the README shows it: one line, each capability and its tests."""
    data = report.to_dict()
    names = sorted(data["results"])
    cells = []
    for name in names:
        r = data["results"][name]
        mark = {True: "✅", False: "❌", None: "skipped"}[r["passed"]]
        cells.append(f"{mark} {r['tests_passed']}/{r['tests_passed'] + r['tests_failed']}")
    passed = sum(1 for r in data["results"].values() if r["passed"] is True)
    line = " · ".join(f"{name} {cell}" for name, cell in zip(names, cells, strict=True))
    return "\n".join([BEGIN, f"{line} — **{data['conformance_level']}**, {passed}/{len(names)}"
                      f" capabilities passed ({SUITE})", END])


def every_capability_passed(report: Any) -> bool:
    """Every capability the suite knows, base and optional, detected and passed (the
    suite's own FULL counts only the capabilities a saver implements)."""
    results = report.to_dict()["results"]
    return set(results) == {c.value for c in ALL_CAPABILITIES} and all(
        r["detected"] and r["passed"] is True for r in results.values())


def run_suite(tmp: Path, at: LedgerAt, make: Any = LedgerSaver) -> Any:
    """The conformance suite, each of its savers on a fresh ledger under `tmp`, where `at`
    (the `ledger_at` fixture) puts it."""
    counter = iter(range(1_000))

    @checkpointer_test(name="LedgerSaver")
    async def factory() -> AsyncIterator[LedgerSaver]:
        ledger = Ledger.init(at(tmp / f"suite-{next(counter)}" / "ledger.db"))
        saver = make(ledger)
        yield saver
        await saver.aclose()
        assert ledger.verify().ok
        ledger.close()

    return asyncio.run(validate(factory))


def test_the_conformance_suite_passes_every_capability_and_the_readme_says_so(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    report = run_suite(tmp_path, ledger_at)
    results = report.to_dict()["results"]
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    failed = {name: r["failures"] for name, r in results.items() if r["passed"] is not True}
    assert failed == {}, failed
    assert report.conformance_level() == "FULL" and every_capability_passed(report)
    produced = render(report)
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "the README lost its markers"
    current = text[text.index(BEGIN):text.index(END) + len(END)]
    if os.environ.get("STEPTRAIL_UPDATE_README") == "1":
        README.write_text(text.replace(current, produced))
    else:
        assert current == produced, ("README.md's conformance report is not this run's;"
                                     " rerun with STEPTRAIL_UPDATE_README=1 to rewrite it")


def test_the_report_check_catches_a_saver_that_skips_a_capability(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Negative control: a saver without the async prune is reported as not passing."""

    class NoPrune(LedgerSaver):
        aprune = LedgerSaver.__mro__[1].aprune  # BaseCheckpointSaver's: not implemented

    report = run_suite(tmp_path, ledger_at, NoPrune)
    assert not every_capability_passed(report)
    assert "skipped 0/0" in render(report)


# --- write ownership: a superseded worker's writes never become durable ------------------

def checkpoint_at(saver: LedgerSaver, thread: str, value: str,
                  parent: dict[str, Any] | None = None) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"answer": value}
    cp["channel_versions"] = {"answer": saver.get_next_version(None, None)}
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return saver.put(config, cp, {"source": "loop", "step": 1},  # type: ignore[arg-type]
                     dict(cp["channel_versions"]))


def stale_writes_landed(ledger: Ledger, thread: str, stale_value: str) -> list[str]:
    """The checker: every committed value of the thread that the stale worker wrote
    after the takeover (it must be none)."""
    fresh = LedgerSaver(ledger)  # a reader in its own right: folds the events from zero
    found = []
    for tup in fresh.list({"configurable": {"thread_id": thread}}):
        if tup.checkpoint["channel_values"].get("answer") == stale_value:
            found.append(tup.config["configurable"]["checkpoint_id"])
        found += [f"write {w[1]}" for w in tup.pending_writes or () if w[2] == stale_value]
    fresh.close()
    return found


def takeover_scenario(location: Path | str, make: Any) -> tuple[Ledger, list[str]]:
    """Two workers on one thread, a takeover, the first one writing late. Returns the
    ledger and what the stale worker's calls raised."""
    ledger = Ledger.init(location)
    a, b = make(ledger), make(ledger)
    a.claim("t1", "worker-a")
    first = checkpoint_at(a, "t1", "a-before")
    with pytest.raises(LeaseHeld):
        b.claim("t1", "worker-b")  # a's claim is live: not without a takeover
    b.claim("t1", "worker-b", takeover=True)  # worker-a is presumed dead
    checkpoint_at(b, "t1", "b-after", first)
    refused = []
    try:
        checkpoint_at(a, "t1", "a-stale", first)  # the zombie wakes up
    except StaleEpoch as exc:
        refused.append(str(exc))
    try:
        a.put_writes(first, [("answer", "a-stale")], "task-1")
    except StaleEpoch as exc:
        refused.append(str(exc))
    a.close()
    b.close()
    return ledger, refused


def test_a_superseded_workers_put_and_put_writes_are_refused(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    ledger, refused = takeover_scenario(ledger_at(tmp_path / "ledger.db"), LedgerSaver)
    assert len(refused) == 2
    assert all("'t1' was taken over by another worker" in r for r in refused), refused
    assert stale_writes_landed(ledger, "t1", "a-stale") == []
    tup = LedgerSaver(ledger).get_tuple({"configurable": {"thread_id": "t1"}})
    assert tup is not None and tup.checkpoint["channel_values"] == {"answer": "b-after"}
    assert ledger.verify().ok
    ledger.close()


def test_without_the_epoch_fence_the_stale_write_lands(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Negative control: a saver whose writes carry no epoch and are fenced on no lease
    (what a saver that does not fence ownership does) lets the zombie's checkpoint and
    write become durable, and the checker sees both."""

    class Unfenced(LedgerSaver):
        def _owner(self, thread_id: str) -> tuple[str, int]:
            return "", 0

        def _fence(self, threads: Any) -> dict[str, int]:
            return {}

    ledger, refused = takeover_scenario(ledger_at(tmp_path / "ledger.db"), Unfenced)
    assert refused == []
    landed = stale_writes_landed(ledger, "t1", "a-stale")
    assert len(landed) == 2 and "write answer" in landed
    ledger.close()


def test_the_fence_is_checked_inside_the_transaction(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The takeover lands between the stale worker's last look and its commit: the
    append guard still refuses, because it reads the live epoch in the transaction."""
    ledger = Ledger.init(ledger_at(tmp_path / "ledger.db"))
    a, b = LedgerSaver(ledger), LedgerSaver(ledger)
    a.claim("t1", "worker-a")
    real = a._commit

    def commit_after_takeover(*args: Any, **kwargs: Any) -> Any:
        b.claim("t1", "worker-b", takeover=True)  # after a built its events
        return real(*args, **kwargs)

    a._commit = commit_after_takeover  # type: ignore[method-assign]
    with pytest.raises(StaleEpoch):
        checkpoint_at(a, "t1", "a-stale")
    assert stale_writes_landed(ledger, "t1", "a-stale") == []
    ledger.close()


def test_a_superseded_worker_stays_fenced_after_its_release_is_refused(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Issue 26 (10): B takes the thread over; A's release() raises StaleEpoch, and A's
    claim must not be dropped by it: A's next put, put_writes and delete are refused as
    stale (before the fix the release forgot the claim first and A's put landed
    unfenced, the latest checkpoint B then saw). A writes again only by claiming again."""
    ledger = Ledger.init(ledger_at(tmp_path / "ledger.db"))
    a, b = LedgerSaver(ledger), LedgerSaver(ledger)
    a.claim("t1", "worker-a")
    first = checkpoint_at(a, "t1", "a-before")
    b.claim("t1", "worker-b", takeover=True)
    latest = checkpoint_at(b, "t1", "b-after", first)
    with pytest.raises(StaleEpoch):
        a.release("t1")
    with pytest.raises(StaleEpoch, match="'t1' was taken over by another worker"):
        checkpoint_at(a, "t1", "a-stale", latest)
    with pytest.raises(StaleEpoch):
        a.put_writes(latest, [("answer", "a-stale")], "task-1")
    with pytest.raises(StaleEpoch):
        a.delete_thread("t1")
    b.release("t1")  # nobody holds it now: A's lost claim is still refused
    with pytest.raises(StaleEpoch):
        checkpoint_at(a, "t1", "a-stale", latest)
    assert stale_writes_landed(ledger, "t1", "a-stale") == []
    tup = LedgerSaver(ledger).get_tuple({"configurable": {"thread_id": "t1"}})
    assert tup is not None and tup.checkpoint["channel_values"] == {"answer": "b-after"}
    assert a.claim("t1", "worker-a").epoch == 3  # a deliberate new claim writes again
    checkpoint_at(a, "t1", "a-again", latest)
    a.release("t1")
    assert ledger.verify().ok
    a.close()
    b.close()
    ledger.close()


def test_a_saver_without_a_claim_cannot_write_a_claimed_thread(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Issue 26 (10): ownership binds every saver, not only claimants: while a claim on a
    thread is live, a saver holding none gets a typed LeaseHeld naming the thread for
    every write (put, put_writes, delete, prune, copy into it) and nothing is recorded;
    once the claim is released its writes land again."""
    ledger = Ledger.init(ledger_at(tmp_path / "ledger.db"))
    owner, other = LedgerSaver(ledger), LedgerSaver(ledger)
    first = checkpoint_at(other, "t1", "before")  # unclaimed: anyone writes
    second = checkpoint_at(other, "t1", "before-2", first)
    checkpoint_at(other, "t0", "source")
    owner.claim("t1", "worker-a")
    before = ledger.head().seq
    for write in (lambda: checkpoint_at(other, "t1", "intruder", second),
                  lambda: other.put_writes(second, [("answer", "intruder")], "task-1"),
                  lambda: other.delete_thread("t1"),
                  lambda: other.prune(["t1"], strategy="keep_latest"),
                  lambda: other.copy_thread("t0", "t1")):
        with pytest.raises(LeaseHeld, match="thread 't1''s claim and this saver holds none"):
            write()
    assert ledger.head().seq == before  # nothing of them was recorded
    assert stale_writes_landed(ledger, "t1", "intruder") == []
    checkpoint_at(owner, "t1", "owner", second)  # the claimant writes
    owner.delete_thread("t1")  # ends attempts planned before its claim, fenced all the same
    assert LedgerSaver(ledger).get_tuple({"configurable": {"thread_id": "t1"}}) is None
    owner.release("t1")
    checkpoint_at(other, "t1", "after")  # released: unclaimed writes land again
    assert ledger.verify().ok
    owner.close()
    other.close()
    ledger.close()


def test_an_expired_claim_lets_others_write_and_fences_its_holder(
        tmp_path: Path, ledger_at: LedgerAt, clock: Any) -> None:
    ledger = Ledger.init(ledger_at(tmp_path / "ledger.db"), clock=clock)
    owner, other = LedgerSaver(ledger), LedgerSaver(ledger)
    owner.claim("t1", "worker-a", ttl_s=60)
    first = checkpoint_at(owner, "t1", "owner")
    with pytest.raises(LeaseHeld):
        checkpoint_at(other, "t1", "other", first)
    clock.advance(61)  # the claimant is presumed dead: its lease lapsed
    checkpoint_at(other, "t1", "other", first)
    with pytest.raises(StaleEpoch):
        checkpoint_at(owner, "t1", "zombie", first)
    assert stale_writes_landed(ledger, "t1", "zombie") == []
    ledger.close()


def test_claim_works_with_the_ledger_inside_a_workspace(tmp_path: Path, ledger_at: LedgerAt,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26 (12): the README's layout, the ledger in repo/.steptrail and repo a
    workspace. A claim is a lease in the ledger, no directory: before the fix claim()
    registered a directory under the ledger's (inside repo: WorkspaceOverlap), and on
    PostgreSQL under the working directory (``postgresql:/…``, made in the cwd)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    ledger = Ledger.init(ledger_at(repo / ".steptrail" / "ledger.db"))
    ledger.workspaces.add("repo", repo)
    saver = LedgerSaver(ledger)
    own = saver.claim("t1", "worker-a")
    checkpoint_at(saver, "t1", "x")
    lease = ledger.workspaces.lease(own.workspace)
    assert (lease.epoch, lease.holder, lease.live) == (1, "worker-a", True)
    assert [w.name for w in ledger.workspaces.list()] == ["repo"]  # a lease, not a workspace
    # nothing on disk for it: not in the workspace, not beside the ledger, not in the cwd
    assert [p.name for p in repo.iterdir() if p.name != ".steptrail"] == []
    assert list(tmp_path.rglob("langgraph-owners")) == []
    assert ledger.verify().ok
    saver.close()
    ledger.close()


def test_claims_on_different_threads_do_not_interfere(tmp_path: Path, ledger_at: LedgerAt) -> None:
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        a, b = LedgerSaver(ledger), LedgerSaver(ledger)
        a.claim("t1", "worker-a")
        b.claim("t2", "worker-b")
        checkpoint_at(a, "t1", "x")
        checkpoint_at(b, "t2", "y")
        a.renew("t1")
        a.release("t1")
        b.claim("t1", "worker-b")  # released: no takeover needed
        checkpoint_at(b, "t1", "z")
        assert ledger.verify().ok


# --- bad input: typed errors naming the problem and the fix -------------------------------

@pytest.mark.parametrize("call, needle", [
    (lambda s: s.get_tuple({}), "['thread_id'] is missing"),
    (lambda s: s.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": 3}}),
     "checkpoint_ns 3 is not a string"),
    (lambda s: s.put({"configurable": {"thread_id": "t"}}, {}, {}, {}), "has no string 'id'"),
    (lambda s: s.put_writes({"configurable": {"thread_id": "t"}}, [], "task"),
     "has no checkpoint_id"),
    (lambda s: list(s.list(None, limit=-1)), "limit -1 must be a non-negative integer"),
    (lambda s: s.prune(["t"], strategy="oldest"), "strategy 'oldest' is not one of"),
    (lambda s: s.prune("t"), "a list of thread ids, not one string"),
    (lambda s: s.delete_for_runs("r"), "a list of run ids"),
    (lambda s: s.renew("t"), "not claimed by this saver; claim it first"),
])
def test_bad_input_is_a_typed_error_naming_the_fix(tmp_path: Path, ledger_at: LedgerAt, call: Any,
                                                   needle: str) -> None:
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        saver = LedgerSaver(ledger)
        before = ledger.head().seq
        with pytest.raises(InvalidInput, match=re.escape(needle)):
            call(saver)
        assert ledger.head().seq == before  # nothing written
        saver.close()


def put_at(saver: LedgerSaver, conf: dict[str, Any], cp_id: str | None = None,
           channel: str = "answer", version: str = "1") -> Any:
    cp = empty_checkpoint()
    if cp_id is not None:
        cp["id"] = cp_id
    cp["channel_values"] = {channel: "v"}
    cp["channel_versions"] = {channel: version}
    return saver.put({"configurable": conf}, cp, {}, {channel: version})  # type: ignore[arg-type]


LONE = "\ud800"  # a lone surrogate: what a bad decode with surrogateescape leaves
WRITTEN = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c"}}


@pytest.mark.parametrize("call, needle", [
    (lambda s: put_at(s, {"thread_id": LONE}), "put: thread id '\\ud800'"),
    (lambda s: put_at(s, {"thread_id": "t" + LONE}), "put: thread id 't\\ud800'"),
    (lambda s: s.get_tuple({"configurable": {"thread_id": LONE}}), "get_tuple: thread id"),
    (lambda s: list(s.list({"configurable": {"thread_id": LONE}})), "list: thread id"),
    (lambda s: put_at(s, {"thread_id": "t", "checkpoint_ns": LONE}), "put: checkpoint_ns"),
    (lambda s: put_at(s, {"thread_id": "t"}, cp_id=LONE), "put: checkpoint id"),
    (lambda s: put_at(s, {"thread_id": "t", "checkpoint_id": LONE}), "put: checkpoint_id"),
    (lambda s: put_at(s, {"thread_id": "t"}, channel=LONE), "put: channel name"),
    (lambda s: put_at(s, {"thread_id": "t"}, version=LONE), "put: channel 'answer''s version"),
    (lambda s: s.put_writes(WRITTEN, [("a", 1)], LONE), "put_writes: task_id"),
    (lambda s: s.put_writes(WRITTEN, [("a", 1)], "task", LONE), "put_writes: task_path"),
    (lambda s: s.put_writes(WRITTEN, [(LONE, 1)], "task"), "put_writes: channel name"),
    (lambda s: s.put_writes({"configurable": {**WRITTEN["configurable"], "checkpoint_id": LONE}},
                            [("a", 1)], "task"), "put_writes: checkpoint_id"),
    (lambda s: s.claim(LONE, "worker-a"), "claim: thread id"),
    (lambda s: s.copy_thread("t", LONE), "copy_thread: thread id"),
    (lambda s: s.delete_thread(LONE), "delete_thread: thread id"),
    (lambda s: s.prune([LONE]), "prune: thread id"),
])
def test_a_lone_surrogate_is_a_typed_error_naming_the_input(
        tmp_path: Path, ledger_at: LedgerAt, call: Any, needle: str) -> None:
    """Issue 26 (14): every text the saver hashes or stores (thread id, namespace,
    checkpoint ids, task id and path, channel names and versions) is checked: InvalidInput
    naming it, nothing written — before the fix, a raw UnicodeEncodeError (or TypeError)
    from deep inside the hashing and encoding."""
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        saver = LedgerSaver(ledger)
        before = ledger.head().seq
        with pytest.raises(InvalidInput, match=re.escape(needle) + ".*lone surrogate"):
            call(saver)
        assert ledger.head().seq == before
        saver.close()


def test_the_saver_takes_a_ledger() -> None:
    with pytest.raises(InvalidInput, match="takes a ledger.Ledger"):
        LedgerSaver("ledger.db")  # type: ignore[arg-type]


# --- pruning: recorded as events, reads skip it, GC reclaims what it released ------------

def grow_thread(saver: LedgerSaver, thread: str, n: int, size: int = 100_000,
                seed: int = 0) -> dict[str, Any]:
    """n checkpoints, each with a new big value (a file blob) and a small counter."""
    parent = None
    for i in range(n):
        cp = empty_checkpoint()
        cp["channel_values"] = {"big": bytes([seed + i]) * size, "count": i}
        cp["channel_versions"] = {"big": f"{i + 1}", "count": f"{i + 1}"}
        conf: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if parent is not None:
            conf["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        parent = saver.put(conf, cp, {"source": "loop", "step": i},  # type: ignore[arg-type]
                           dict(cp["channel_versions"]))
    assert parent is not None
    return parent


def stored_bytes(ledger: Ledger) -> int:
    from ledger.gc import audit
    return audit(ledger).stored_bytes


def collect_now(ledger: Ledger) -> Any:
    from ledger.gc import collect
    return collect(ledger, grace_s=0, force=True, now_ns=ledger.clock() + 10**12)


def test_prune_keeps_what_a_resume_needs_and_gc_reclaims_the_rest(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    from ledger.gc import audit
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        saver = LedgerSaver(ledger)
        latest = grow_thread(saver, "t", 5)
        grow_thread(saver, "other", 2, seed=100)  # other bytes: nothing shared
        # a human-in-the-loop interrupt: the latest checkpoint's pending writes
        saver.put_writes(latest, [("__interrupt__", {"question": "ok?"})], "task-1")
        before = stored_bytes(ledger)
        saver.prune(["t"], strategy="keep_latest")
        report = collect_now(ledger)
        assert report.reclaimed_bytes >= 4 * 100_000  # the four pruned big values
        assert before - stored_bytes(ledger) == report.reclaimed_bytes
        tup = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert tup is not None and tup.checkpoint["channel_values"]["count"] == 4
        assert tup.checkpoint["channel_values"]["big"] == bytes([4]) * 100_000
        assert tup.pending_writes == [("task-1", "__interrupt__", {"question": "ok?"})]
        assert len(list(saver.list({"configurable": {"thread_id": "other"}}))) == 2
        # a fresh reader (another process, say) sees the same after the collection
        assert LedgerSaver(ledger).get_tuple({"configurable": {"thread_id": "t"}}) == tup
        assert ledger.verify().ok and audit(ledger).ok
        saver.close()


def test_an_unchanged_value_is_stored_once(tmp_path: Path, ledger_at: LedgerAt) -> None:
    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        saver = LedgerSaver(ledger)
        parent = None
        for i in range(20):  # the big value keeps its version: only the counter moves
            cp = empty_checkpoint()
            cp["channel_values"] = {"big": b"x" * 100_000, "count": i}
            cp["channel_versions"] = {"big": "1", "count": f"{i + 1}"}
            conf: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            if parent is not None:
                conf["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            new = {"big": "1", "count": f"{i + 1}"} if i == 0 else {"count": f"{i + 1}"}
            parent = saver.put(conf, cp, {"step": i}, new)  # type: ignore[arg-type]
        assert stored_bytes(ledger) < 2 * 100_000
        saver.close()


def test_without_release_gc_reclaims_nothing(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Negative control: pruning that only compensates (no `release`) leaves every
    blob referenced — the reclaim check sees nothing collected."""
    import msgspec

    from ledger.events import Compensated

    class NoRelease(LedgerSaver):
        def _commit(self, events: list[Any], data: Any, threads: set[str]) -> Any:
            events = [msgspec.structs.replace(e, release=False) if isinstance(e, Compensated)
                      else e for e in events]
            return super()._commit(events, data, threads)

    with Ledger.init(ledger_at(tmp_path / "ledger.db")) as ledger:
        saver = NoRelease(ledger)
        grow_thread(saver, "t", 5)
        saver.prune(["t"], strategy="keep_latest")
        assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1
        assert collect_now(ledger).reclaimed_bytes == 0
        saver.close()


# --- seal: never takes a live thread's state -------------------------------------------

def test_seal_leaves_a_live_thread_alone_and_takes_a_deleted_one(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Issue 26 (11): a thread's run was listed sealable and `seal run` took it, after
    which a fresh saver saw no checkpoint (invoke(None) raised EmptyInputError). A
    thread's run is not sealable while the thread lives (pruned or not: its latest
    checkpoint is its state); once the thread is deleted, its run may be sealed."""
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    from ledger import NotSealable
    from ledger.seal import seal_run, sealable

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("inc", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "inc")
    config: Any = {"configurable": {"thread_id": "t1"}}
    archive = str(tmp_path / "archive")
    ledger = Ledger.init(ledger_at(tmp_path / "ledger.db"))
    saver = LedgerSaver(ledger)
    assert builder.compile(checkpointer=saver).invoke({"n": 1}, config) == {"n": 2}
    assert builder.compile(checkpointer=saver).invoke({"n": 5}, config) == {"n": 6}
    for prune in (False, True):
        if prune:
            saver.prune(["t1"], strategy="keep_latest")
        (run,) = [r for r in sealable(ledger).runs if r.run == "t1"]
        assert not run.sealable and "LangGraph thread's live state" in (run.why or "")
        with pytest.raises(NotSealable, match="only once the thread is deleted"):
            seal_run(ledger, "t1", archive)
        fresh = LedgerSaver(ledger)  # another process, say: the thread is all there
        assert builder.compile(checkpointer=fresh).invoke(None, config) == {"n": 6}
        fresh.close()
    saver.delete_thread("t1")
    (run,) = [r for r in sealable(ledger).runs if r.run == "t1"]
    assert run.sealable, run.why
    assert seal_run(ledger, "t1", archive).events > 0
    assert LedgerSaver(ledger).get_tuple(config) is None  # deleted before, as it was
    assert ledger.verify().ok
    saver.close()
    ledger.close()


def test_the_langgraph_docs_snippets_run_as_printed(tmp_path: Path) -> None:
    from docblocks import blocks, run_python
    python = [b for b in blocks(ROOT / "docs" / "langgraph.md") if b.lang == "python"]
    assert len(python) >= 2
    for i, block in enumerate(python):
        cwd = tmp_path / str(i)
        cwd.mkdir()
        run_python(block, cwd, "docs/langgraph.md")


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True

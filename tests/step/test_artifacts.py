"""Durable artifacts: inline and file blobs, pins, the manifest CAS, the runner, replay policy."""

from __future__ import annotations

import hashlib
import io
import os
import pathlib

import pytest
from conftest import LedgerAt

from ledger.gc.audit import audit
from ledger import (
    BlobStored,
    ContentChanged,
    IllegalTransition,
    Ledger,
    ManifestEntry,
    ManifestPublished,
    Planned,
)
from ledger.errors import BlobCorrupt, BlobNotFound, ManifestConflict
from ledger.events import manifest_digest
from ledger.runner import run_step
from ledger.projections import StepLookup
from ledger.step import artifacts as artifacts_mod
from ledger.testing.broken import run_step_wrong_order

SMALL = b"small artifact\n" * 10  # inline
LARGE = os.urandom(200_000)  # a file (default inline limit 64 KiB)
MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def ledger(ledger_location: str) -> Ledger:
    with Ledger.init(ledger_location) as lg:
        yield lg


def blob_file(ledger: Ledger, digest: str) -> pathlib.Path:
    return pathlib.Path(ledger.blobs.root) / digest[:2] / digest


@pytest.mark.sqlite_only
def test_small_artifacts_inline_large_ones_as_files(ledger: Ledger) -> None:
    result = run_step(ledger, "s", {"a.txt": SMALL, "b.bin": LARGE})
    assert result.ran and result.manifest.manifest_rev == 0
    events = [r.event for r in ledger.read(kind="blob-stored")]
    assert {(e.path, e.inline) for e in events} == {("a.txt", True), ("b.bin", False)}
    assert not blob_file(ledger, sha(SMALL)).exists()
    assert blob_file(ledger, sha(LARGE)).is_file()
    assert ledger.read_blob(sha(SMALL)) == SMALL and ledger.read_blob(sha(LARGE)) == LARGE
    assert ledger.classify("s") == "committed"
    assert ledger.verify().ok


def test_pins_are_taken_before_the_bytes_and_released_by_the_ack(ledger: Ledger) -> None:
    row = ledger.plan("s", artifacts=["a"])
    ledger.store("s", row.attempt, "a", LARGE)
    kinds = [r.kind for r in ledger.timeline("s")]
    assert kinds == ["planned", "blob-pinned", "blob-stored"]
    assert [b["pinned"] for b in ledger.blob_list()] == [True]
    ledger.publish("s")
    ledger.ack("s")
    assert [(b["pinned"], b["referenced"]) for b in ledger.blob_list()] == [(False, True)]


def test_identical_content_is_stored_once(ledger: Ledger) -> None:
    run_step(ledger, "s1", {"x": LARGE, "y": SMALL})
    run_step(ledger, "s2", {"x": LARGE, "z": SMALL})
    listed = ledger.blob_list()
    assert sorted((b["where"], b["size"]) for b in listed) == [("file", len(LARGE)), ("inline", len(SMALL))]


@pytest.mark.sqlite_only
def test_publish_refuses_a_missing_blob_and_writes_nothing(ledger: Ledger) -> None:
    row = ledger.plan("s", artifacts=["b.bin"])
    ledger.store("s", row.attempt, "b.bin", LARGE)
    blob_file(ledger, sha(LARGE)).unlink()
    head = ledger.head()
    with pytest.raises(BlobNotFound):
        ledger.publish("s")
    assert ledger.head() == head and not ledger.step("s").live
    # the runner re-stores and publishes (a collector raced it)
    result = run_step(ledger, "s", {"b.bin": LARGE})
    assert result.ran and ledger.classify("s") == "committed"


@pytest.mark.sqlite_only
def test_publish_refuses_a_corrupt_small_blob(ledger: Ledger) -> None:
    data = os.urandom(100_000)  # a file, below the hash-check limit
    row = ledger.plan("s", artifacts=["f"])
    ledger.store("s", row.attempt, "f", data)
    path = blob_file(ledger, sha(data))
    path.chmod(0o644)
    path.write_bytes(b"\0" * len(data))  # same size, wrong bytes
    with pytest.raises(BlobCorrupt):
        ledger.publish("s")
    assert not ledger.step("s").live


def test_append_cannot_publish_before_the_blobs(ledger: Ledger) -> None:
    """The public API refuses a manifest (or a blob-stored) naming bytes never stored."""
    ledger.append(Planned(step="s", attempt=1, artifacts=("a",)))
    entry = ManifestEntry(path="a", digest=sha(b"never stored"), size=12)
    head = ledger.head()
    with pytest.raises(BlobNotFound):
        ledger.append(ManifestPublished(step="s", attempt=1, manifest_rev=0,
                                        digest=manifest_digest("s", (), (entry,)), artifacts=(entry,)))
    with pytest.raises(BlobNotFound):
        ledger.append(BlobStored(step="s", attempt=1, digest=entry.digest, size=12, path="a"))
    assert ledger.head() == head


def test_declared_artifacts_must_be_stored_before_publish(ledger: Ledger) -> None:
    row = ledger.plan("s", artifacts=["a", "b"])
    ledger.store("s", row.attempt, "a", SMALL)
    with pytest.raises(IllegalTransition, match="never stored: b"):
        ledger.publish("s")


def test_replay_of_a_committed_step_returns_its_manifest_and_writes_nothing(ledger: Ledger) -> None:
    first = run_step(ledger, "s", {"a": SMALL})
    head = ledger.head()
    calls = []

    def produce() -> dict[str, bytes]:
        calls.append(1)
        return {"a": b"byte-different but equivalent"}

    again = run_step(ledger, "s", produce)
    assert not again.ran and again.manifest == first.manifest
    assert calls == [] and ledger.head() == head


def test_create_when_live_returns_the_live_manifest(ledger: Ledger) -> None:
    first = run_step(ledger, "s", {"a": SMALL})
    head = ledger.head()
    assert ledger.publish("s", expected_rev=-1) == first.manifest
    assert ledger.head() == head


def test_cas_conflict_on_a_stale_expected_revision(ledger: Ledger) -> None:
    run_step(ledger, "s", {"a": SMALL})
    head = ledger.head()
    with pytest.raises(ManifestConflict) as info:
        ledger.publish("s", expected_rev=3)
    assert info.value.exit_code == 1 and info.value.live == 0
    assert ledger.head() == head


def test_supersede_records_both_digests(ledger: Ledger) -> None:
    first = run_step(ledger, "s", {"a": SMALL}).manifest
    ledger.store("s", 1, "a", b"replacement content")
    second = ledger.publish("s", expected_rev=0)
    assert second.manifest_rev == 1 and second.supersedes == first.digest
    assert second.digest != first.digest
    published = [r.event for r in ledger.read(kind="manifest-published")]
    assert [(e.manifest_rev, e.digest, e.supersedes) for e in published] == [
        (0, first.digest, None), (1, second.digest, first.digest)]
    assert ledger.manifest("s") == second
    assert ledger.manifest("s", 0).live is False
    with pytest.raises(ManifestConflict):  # the old revision is no longer live
        ledger.publish("s", expected_rev=0)
    assert ledger.verify().ok


def test_a_dead_attempt_is_ended_and_the_next_attempt_publishes_its_own(ledger: Ledger) -> None:
    row = ledger.plan("s", artifacts=["a"])
    ledger.store("s", row.attempt, "a", b"attempt one output")
    ledger.workspaces.compensate("s", reason="worker died before publishing")
    assert ledger.step("s").state == "compensated"
    result = run_step(ledger, "s", {"a": b"attempt two output"})
    assert result.ran and result.attempt == 2
    assert result.manifest.artifacts[0].digest == sha(b"attempt two output")
    # the dead attempt's blob is neither referenced nor pinned: an orphan for GC
    orphan = [b for b in ledger.blob_list() if b["digest"] == sha(b"attempt one output")]
    assert orphan and not orphan[0]["referenced"] and not orphan[0]["pinned"]


def test_runner_continues_the_same_attempt_after_a_crash(ledger: Ledger) -> None:
    row = ledger.plan("s", artifacts=["a", "b"])
    ledger.store("s", row.attempt, "a", SMALL)  # ... and the worker died here
    head = ledger.head()
    result = run_step(ledger, "s", {"a": SMALL, "b": LARGE})
    assert result.ran and result.attempt == 1
    kinds = [r.kind for r in ledger.read(after_seq=head.seq)]
    # 'a' is re-pinned and re-stored idempotently (journal hits), 'b' is new
    assert kinds == ["blob-pinned", "blob-stored", "manifest-published", "acked"]


def test_wrong_order_leaves_a_dangling_manifest_the_checker_catches(ledger: Ledger) -> None:
    class Died(Exception):
        pass

    original = ledger.store

    def store_then_die(*args: object, **kwargs: object) -> object:
        raise Died

    ledger.store = store_then_die  # type: ignore[method-assign]
    with pytest.raises(Died):
        run_step_wrong_order(ledger, "s", {"a": LARGE})
    ledger.store = original  # type: ignore[method-assign]
    assert ledger.classify("s").startswith("VIOLATION")
    report = ledger.verify()
    assert not report.ok and any(f.check == "durability" for f in report.findings)


@pytest.mark.sqlite_only
def test_stray_temp_files_are_ignored_by_readers(ledger: Ledger) -> None:
    run_step(ledger, "s", {"b": LARGE})
    tmp = pathlib.Path(ledger.blobs.root) / "tmp"
    tmp.mkdir(exist_ok=True)
    (tmp / f"{sha(b'x')}.deadbeef.tmp").write_bytes(b"partial")
    assert ledger.classify("s") == "committed" and ledger.verify().ok
    assert [b["where"] for b in ledger.blob_list()].count("temp") == 1
    with pytest.raises(BlobNotFound):
        ledger.read_blob(sha(b"x"))


@pytest.mark.sqlite_only
def test_inline_row_corruption_is_detected(ledger: Ledger, tmp_path: pathlib.Path) -> None:
    import apsw

    run_step(ledger, "s", {"a": SMALL})
    raw = apsw.Connection(str(tmp_path / "ledger.db"))
    raw.execute("UPDATE blob_data SET data = ?", (b"X" * len(SMALL),))
    raw.close()
    with pytest.raises(BlobCorrupt):
        ledger.read_blob(sha(SMALL))
    assert ledger.classify("s").startswith("VIOLATION")
    # storing the same content again repairs the damaged row
    ledger.store("s", 1, "a", SMALL)
    assert ledger.classify("s") == "committed"


def test_inline_threshold_is_configurable(tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    with Ledger.init(ledger_at(tmp_path / "l.db"), inline_max_bytes=0) as lg:
        run_step(lg, "s", {"a": SMALL})
        assert [b["where"] for b in lg.blob_list()] == ["file"]


class _ShiftingFile(io.BytesIO):
    """A file whose bytes change after they were read through once (a writer racing
    the second read)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.passes = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        if pos == 0 and whence == 0 and self.tell() > 0:
            self.passes += 1
            self.getbuffer()[0] ^= 1
        return super().seek(pos, whence)


def test_store_from_a_file_streams_and_refuses_one_that_changed(tmp_path: pathlib.Path) -> None:
    data = os.urandom(2 * MiB)
    src = tmp_path / "art.bin"
    src.write_bytes(data)
    with Ledger.init(tmp_path / "ledger.db") as led:
        led.plan("s1", artifacts=("out/art.bin",))
        with open(src, "rb") as f:
            event = led.store("s1", 1, "out/art.bin", f)
        assert (event.digest, event.size, event.inline) == (sha(data), len(data), False)
        assert led.read_blob(event.digest) == data

        led.plan("s2", artifacts=("out/b.bin",))
        shifting = _ShiftingFile(os.urandom(MiB))
        with pytest.raises(ContentChanged):
            led.store("s2", 1, "out/b.bin", shifting)
        assert shifting.passes >= 1
        assert [r.event.__struct_config__.tag for r in led.timeline("s2")] == [
            "planned", "blob-pinned"]  # pinned, never recorded as stored
        assert led.verify().ok


def test_pin_then_store_is_one_pin(ledger: Ledger) -> None:
    """An explicit pin and the pin `store` takes are the same event: no conflict."""
    row = ledger.plan("s", run="r", artifacts=["b"])
    first = ledger.pin("s", row.attempt, sha(LARGE))
    ledger.store("s", row.attempt, "b", LARGE)
    pins = [r for r in ledger.timeline("s") if r.kind == "blob-pinned"]
    assert [p.seq for p in pins] == [first.seq]


# --- the runner's fast paths: one commit inline, two with a file ---------------------


@pytest.mark.sqlite_only
def test_a_fresh_step_with_a_file_is_two_commits_pins_first(
        tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """plan + every pin; (the file made durable) every blob-stored + the manifest + the
    ack. The file is written only after the pins commit, and the manifest commits with
    the stores, after the file is durable."""
    ops: list[str] = []
    with Ledger.init(ledger_at(tmp_path / "l.db"), on_op=ops.append) as lg:
        ops.clear()
        run_step(lg, "s", {"a.txt": SMALL, "b.bin": LARGE, "c.txt": b"c"})
        assert ops.count("commit") == 2, ops
        first, second = ops.index("commit"), ops.index("commit", ops.index("commit") + 1)
        assert first < ops.index("write") < ops.index("dirfsync", ops.index("rename")) < second
        kinds = [r.kind for r in lg.timeline("s")]
        assert kinds == ["planned"] + ["blob-pinned"] * 3 + ["blob-stored"] * 3 + [
            "manifest-published", "acked"]
        # one transaction's events share its time: the plan and its pins, then the stores,
        # the manifest and the ack
        times = [r.time_ns for r in lg.timeline("s")]
        assert len(set(times[:4])) == 1 and len(set(times[4:])) == 1, times
        assert times[0] < times[4]
        assert lg.classify("s") == "committed" and lg.verify().ok
        assert [b["pinned"] for b in lg.blob_list()] == [False] * 3  # the ack released them


def test_a_fresh_inline_step_is_one_commit(tmp_path: pathlib.Path, ledger_at: LedgerAt) -> None:
    """Every artifact inline: plan, bytes, stores, manifest and ack in one transaction —
    the multi-commit path's events, in its order, without the pins."""
    ops: list[str] = []
    with Ledger.init(ledger_at(tmp_path / "l.db"), on_op=ops.append) as lg:
        ops.clear()
        result = run_step(lg, "s", {"a.txt": SMALL, "c.txt": b"c", "d.txt": b"c"})
        assert result.ran and result.attempt == 1
        assert ops.count("commit") == 1 and "write" not in ops, ops
        kinds = [r.kind for r in lg.timeline("s")]
        # no pins: the blobs come into existence in the commit that publishes them
        assert kinds == ["planned"] + ["blob-stored"] * 3 + ["manifest-published", "acked"]
        assert len({r.time_ns for r in lg.timeline("s")}) == 1
        assert lg.classify("s") == "committed" and lg.verify().ok and audit(lg, deep=True).ok
        assert [b["pinned"] for b in lg.blob_list()] == [False] * 2
        assert lg.manifest("s") == result.manifest
        again = run_step(lg, "s", {"a.txt": b"other"})
        assert not again.ran and again.manifest == result.manifest


def test_a_fresh_inline_attempt_after_a_compensated_one_is_one_commit(ledger: Ledger) -> None:
    """Attempt 2 of a step whose attempt 1 was compensated: one commit, a new manifest."""
    row = ledger.plan("s", artifacts=["a.txt"])
    ledger.workspaces.compensate("s", row.attempt)
    result = run_step(ledger, "s", {"a.txt": SMALL})
    assert result.ran and result.attempt == 2
    assert ledger.step("s").state == "acked" and ledger.manifest("s") == result.manifest
    assert ledger.verify().ok


def test_the_one_commit_path_yields_to_a_runner_that_planned_first(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another runner planned attempt 1 between this runner's look and its commit: the
    one-commit transaction writes nothing, and this runner continues that attempt."""
    ledger.plan("s", artifacts=["a.txt"])
    real = ledger.find_step
    looks = [None]  # the runner's first look saw no step yet

    def find_step(step: str) -> object:
        return looks.pop() if looks else real(step)

    monkeypatch.setattr(ledger, "find_step", find_step)
    head = ledger.head().seq
    result = run_step(ledger, "s", {"a.txt": SMALL})
    assert result.ran and result.attempt == 1
    kinds = [r.kind for r in ledger.timeline("s")]
    assert kinds.count("planned") == 1 and kinds[-2:] == ["manifest-published", "acked"]
    assert ledger.head().seq > head and ledger.verify().ok


def test_a_blob_gone_before_the_commit_falls_back_and_still_commits(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's guard finds a file blob missing (a collector, a human, between
    the put and the commit): nothing is published, and the runner stores again step by
    step and commits."""
    real_put = ledger.blobs.put
    calls: list[str] = []

    def lost_put(data: bytes, digest: str | None = None, **kw: object) -> object:
        calls.append(digest or "")
        if len(calls) == 1:
            return None  # the bytes never reach the store
        return real_put(data, digest, **kw)

    monkeypatch.setattr(ledger.blobs, "put", lost_put)
    result = run_step(ledger, "s", {"b.bin": LARGE})
    assert result.ran and len(calls) == 2
    assert ledger.classify("s") == "committed" and ledger.verify().ok
    assert ledger.read_blob(sha(LARGE)) == LARGE


@pytest.mark.parametrize("data", [LARGE, SMALL], ids=["file: two commits", "inline: one commit"])
def test_the_fast_path_only_publishes_what_the_plan_declared(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """Another runner planned the attempt, with other artifacts, between this runner's
    look and its plan (for a file blob; an inline step looks inside the transaction
    that would record it, where it finds the attempt): the runner does not publish its
    own set in one commit; step by step, publish names what is missing."""
    ledger.plan("s", artifacts=["a.txt", "b.txt"])
    if data is LARGE:
        real = StepLookup.find
        looks = [None]  # the runner's first look saw no step yet

        def find_step(self: StepLookup, step: str) -> object:
            return looks.pop() if looks else real(self, step)

        monkeypatch.setattr(StepLookup, "find", find_step)
    stores: list[str] = []
    fast = "store_and_publish" if data is LARGE else "step_in_one_commit"
    real_fast = getattr(artifacts_mod, fast)
    monkeypatch.setattr(artifacts_mod, fast, lambda *a: stores.append("fast") or real_fast(*a))
    head = ledger.head().seq
    with pytest.raises(IllegalTransition, match="never stored: b.txt"):
        run_step(ledger, "s", {"a.txt": data})
    assert stores == ["fast"]  # it was asked, and declined
    # what the step-by-step path recorded: a.txt's pin and store, no manifest
    assert [r.kind for r in ledger.read(head)] == ["blob-pinned", "blob-stored"]
    assert ledger.manifest("s") is None and ledger.verify().ok


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True


@pytest.mark.parametrize("same_transaction", [True, False])
def test_inline_bytes_not_of_their_name_are_refused_when_published(
        ledger: Ledger, same_transaction: bool) -> None:
    """Bytes written inline under a digest they do not hash to — in the very transaction
    that publishes them, or in an earlier one — are refused at the publish (BlobCorrupt),
    and nothing of that transaction is written. (A transaction answers the guard from
    the inline rows it wrote only for bytes it checked against their name.)"""
    real = b"the bytes the name is of\n"
    fake = real[::-1]  # the same size
    assert len(real) == len(fake) and sha(real) != sha(fake)
    digest = sha(real)
    ledger.append(Planned(step="s", attempt=1, artifacts=("a.txt",)))
    stored = BlobStored(step="s", attempt=1, digest=digest, size=len(fake), path="a.txt",
                        inline=True)
    entry = ManifestEntry(path="a.txt", digest=digest, size=len(fake))
    published = ManifestPublished(step="s", attempt=1, manifest_rev=0, artifacts=(entry,),
                                  digest=manifest_digest("s", (), (entry,)))
    events = [stored, published] if same_transaction else [published]
    if not same_transaction:
        ledger.log.append([stored], inline={digest: fake}, guard=ledger._guard())
    head = ledger.head().seq
    with pytest.raises(BlobCorrupt, match="do not hash to its name"):
        ledger.log.append(events, inline={digest: fake}, guard=ledger._guard())
    assert ledger.head().seq == head and ledger.manifest("s") is None

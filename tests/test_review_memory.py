"""Memory does not follow file size or event count (issue 11, item 16).

Hashing and copying stream in bounded pieces: `workspace snapshot`, `step plan` with a
`content_file`, `step apply` (the pre-image pinned into the blob store, the post-image
staged from it) and `step store` of a large file peak at about the same resident set
size whatever the file's size. `verify` folds its rebuild beside the tables (TEMP
tables), so its peak follows the live steps, not the events.

Peaks are measured, not timed: each command runs in a fresh process through the real
CLI entry point, its peak RSS read from /proc (VmHWM after a reset: see
tools/bench_memory.py, whose worker these tests use), at two sizes; the peak may grow
by far less than the size difference.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from ledger import ContentChanged, Ledger
from ledger.blobs import BlobStore, digest_of
from ledger.events import Acked, Fenced, AppliedWrite, Planned, PlannedWrite, Rejected
from ledger.workspace.protocol import StepPlan, Write
from ledger.invariants import Checker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from bench_memory import measure, write_file  # noqa: E402

MiB = 1 << 20

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                                reason="peak RSS is read from /proc (Linux)")


def _file_peaks(tmp: Path, size_mib: int) -> dict[str, int]:
    """Peak RSS of snapshot, plan (content_file), apply and store of `size_mib` files."""
    d = tmp / f"n{size_mib}"
    ws = d / "ws"
    ws.mkdir(parents=True)
    pre = write_file(str(ws / "big.bin"), size_mib * MiB, b"pre-image ")
    post = write_file(str(d / "new.bin"), size_mib * MiB, b"post-image ")
    art = write_file(str(d / "art.bin"), size_mib * MiB, b"artifact ")
    with Ledger.init(d / "ledger.db") as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "test", ttl_s=3600).epoch
    (d / "plan.json").write_text(json.dumps({"step": "s1", "writes": [
        {"path": "big.bin", "pre_hash": pre, "content_file": "new.bin"}]}))
    g = ["--ledger", str(d / "ledger.db"), "--workspace", "w"]
    peaks = {
        "snapshot": measure(str(d), *g, "workspace", "snapshot", "big.bin")["peak"],
        "plan": measure(str(d), *g, "step", "plan", "--epoch", str(epoch), "plan.json")["peak"],
        "apply": measure(str(d), *g, "step", "apply", "s1", "--epoch", str(epoch))["peak"],
        "store": measure(str(d), *g, "step", "store", "s2", "art.bin")["peak"],
    }
    with Ledger.open(d / "ledger.db", readonly=True) as led:
        assert led.workspaces.snapshot("w", "big.bin")[1] == post  # the apply really wrote it
        assert led.blobs.size(pre) == led.blobs.size(art) == size_mib * MiB  # pinned, stored
        assert led.verify().ok
    return peaks


@needs_proc
def test_file_commands_peak_memory_does_not_follow_file_size(tmp_path: Path) -> None:
    small, large = 8, 40
    a, b = _file_peaks(tmp_path, small), _file_peaks(tmp_path, large)
    # Holding the file once would add 32 MiB (snapshot and apply held it twice); the
    # streaming commands stay within noise of each other.
    for op in a:
        assert b[op] - a[op] < 8 * MiB, (op, a[op] // MiB, b[op] // MiB)


@needs_proc
def test_verify_peak_memory_follows_live_steps_not_events(tmp_path: Path) -> None:
    from bench_ledger import build_ledger, store_blobs

    store_blobs(str(tmp_path))
    peaks = {}
    for n in (6_000, 30_000):  # every step is acked: no live step in either
        path = str(tmp_path / f"l{n}.db")
        build_ledger(path, n)
        peaks[n] = measure(str(tmp_path), "--ledger", path, "verify")["peak"]
    # base: ~800 bytes per event (~19 MiB more for the 24k extra events)
    assert peaks[30_000] - peaks[6_000] < 6 * MiB, {n: p // MiB for n, p in peaks.items()}


def test_invariant_checker_forgets_attempts_that_ended(tmp_path: Path) -> None:
    """The I3/I4 checker keeps an attempt's plan only while it may still be applied or
    compensated as planned: acked and rejected attempts leave nothing behind."""
    checker = Checker()
    seq = 0
    for i in range(500):
        step = f"s{i}"
        write = PlannedWrite(path=f"f{i % 7}", base_rev=0, pre_hash=None, post_hash="a" * 64)
        events = [Planned(step=step, attempt=1, workspace="w", writes=(write,))]
        if i % 2:
            events += [Fenced(step=step, attempt=1, workspace="w", rev=i + 1, writes=(
                AppliedWrite(path=write.path, rev=i + 1, pre_hash=None, post_hash="a" * 64),)),
                Acked(step=step, attempt=1)]
        else:
            events.append(Rejected(step=step, attempt=1, workspace="w", reason="stale_rev"))
        for e in events:
            seq += 1
            checker.feed(seq, seq, e)
    assert checker.st.plans == {}
    assert len(checker.st.path_rev) == 7  # one entry per path, not per write


def test_put_stream_stores_nothing_when_the_content_changed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = b"x" * (3 * MiB + 5)
    with pytest.raises(ContentChanged):
        store.put_stream(iter([data[:MiB], b"y" * MiB, data[2 * MiB:]]), digest_of(data))
    assert store.size(digest_of(data)) is None
    assert list(store.temp_files()) == []
    got = store.put_stream(iter([data[:MiB], data[MiB:]]), digest_of(data))
    assert (got.size, got.deduped) == (len(data), False)

    def untouchable() -> object:
        raise AssertionError("a dedup hit must not read its source")
        yield b""

    assert store.put_stream(untouchable(), digest_of(data)).deduped  # type: ignore[arg-type]
    assert b"".join(store.chunks(digest_of(data))) == data


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


def test_store_from_a_file_streams_and_refuses_one_that_changed(tmp_path: Path) -> None:
    data = os.urandom(2 * MiB)
    src = tmp_path / "art.bin"
    src.write_bytes(data)
    with Ledger.init(tmp_path / "ledger.db") as led:
        led.plan("s1", artifacts=("out/art.bin",))
        with open(src, "rb") as f:
            event = led.store("s1", 1, "out/art.bin", f)
        assert (event.digest, event.size, event.inline) == (digest_of(data), len(data), False)
        assert led.read_blob(event.digest) == data

        led.plan("s2", artifacts=("out/b.bin",))
        shifting = _ShiftingFile(os.urandom(MiB))
        with pytest.raises(ContentChanged):
            led.store("s2", 1, "out/b.bin", shifting)
        assert shifting.passes >= 1
        assert [r.event.__struct_config__.tag for r in led.timeline("s2")] == [
            "planned", "blob-pinned"]  # pinned, never recorded as stored
        assert led.verify().ok


def test_a_write_planned_from_a_file_applies_and_compensates_large_files(tmp_path: Path) -> None:
    """Post-image from an open file (admission streams it into the blob store); a large
    pre-image pinned as a blob file at apply and put back, piece by piece, by
    compensation and by restore."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old, new = os.urandom(3 * MiB + 1), os.urandom(2 * MiB + 3)
    (ws / "big.bin").write_bytes(old)
    (tmp_path / "new.bin").write_bytes(new)
    with Ledger.init(tmp_path / "ledger.db") as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "t", ttl_s=3600).epoch
        assert led.workspaces.snapshot("w", "big.bin")[1] == digest_of(old)
        with open(tmp_path / "new.bin", "rb") as f:
            assert led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("big.bin", f, digest_of(old))])]) \
                == [None]
        assert led.workspaces.apply("s1", epoch=epoch).verdict == "applied"
        assert (ws / "big.bin").read_bytes() == new
        assert led.blobs.size(digest_of(old)) == len(old)  # the pre-image, as a blob file
        restored = led.workspaces.compensate("s1", epoch=epoch).restored
        assert [r.outcome for r in restored] == ["restored"]
        assert (ws / "big.bin").read_bytes() == old
        assert not [p for p in os.listdir(ws) if p != "big.bin"]  # no staged leftovers
        assert led.verify().ok

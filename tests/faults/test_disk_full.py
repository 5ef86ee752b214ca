"""Disk full: through the fault VFS (SQLITE_FULL past a byte quota), through the blob
store's FileOps seam (ENOSPC on blob and workspace writes), and on a real small tmpfs
mounted by the test where mounting is permitted (skipped with the reason elsewhere).

A step that does not fit fails with a typed error (StorageFailure, exit code 3) that
names the disk (the ledger's or the blob store's path) and says it is full; the ledger
stays consistent (verify, I1, audit); once space is freed the same process and
connection go on and the failed step commits on replay; partial temporary files are
removed, or collected by GC.

Default: a sample of quotas. STEPTRAIL_FAULTS_FULL=1: a quota every 6 KiB.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

from ledger.testing import faults as F
import pytest

from ledger import Ledger, Planned
from ledger.errors import EXIT_ENVIRONMENT, StorageFailure
from ledger.gc import audit, collect
from ledger.runner import run_step

FULL = F.full_mode()


def _bytes_written(scratch: str) -> int:
    disk = F.PowerLossDisk()
    F.run_point(F.StandardWorkload(include_init=False), disk, scratch, label="baseline")
    return disk.written


def _free_and_go_on(env: F.Env) -> None:
    """The disk filled up: the first failure is typed and names the disk. Free the space
    (lift the quota) and run the workload again in the same process and connection."""
    assert env.disk is not None
    failed = [o for o in env.history.ops.values() if o.error]
    if not failed:  # the budget ends inside the closing checkpoint: nothing failed yet
        env.disk.quota = None
        return
    first = failed[0].error
    assert first.startswith("StorageFailure:") and "full" in first, first
    assert env.root in first, f"the error does not name the disk: {first}"
    env.disk.quota = None
    F.StandardWorkload(include_init=False).run(env)
    assert all(o.acked for o in env.history.ops.values() if o.observable), \
        [(k, o.error) for k, o in env.history.ops.items() if not o.acked]


def _quota_sweep(scratch: str, quotas: list[int], *, swallow: bool = False) -> F.SweepReport:
    rep = F.SweepReport("disk-full/vfs-quota" + ("/negative-control" if swallow else ""))
    t0 = time.perf_counter()
    for q in quotas:
        disk = F.PowerLossDisk(quota=q)
        disk.swallow_full = swallow
        r = F.run_point(F.StandardWorkload(include_init=False), disk, scratch,
                        label=f"quota={q}", restart=True,
                        after=None if swallow else _free_and_go_on)
        rep.total_ops = max(rep.total_ops, r.ops)
        rep.add(r)
    rep.elapsed_s = time.perf_counter() - t0
    return rep


def test_disk_full_through_the_vfs_quota(scratch: str) -> None:
    """SQLite (SQLITE_FULL) and blob writes (ENOSPC) share one byte budget; the workload
    hits it at every kind of step."""
    total = _bytes_written(scratch)
    step = 6 * 1024 if FULL else total // 24
    quotas = list(range(step, total, step))
    rep = _quota_sweep(scratch, quotas)
    F.publish_report(rep)
    assert rep.failures == [], "\n".join(rep.failures[:10])
    assert (rep.lost, rep.duplicated, rep.unexpected) == (0, 0, 0)
    assert rep.errors_seen == {"StorageFailure"}
    assert set(rep.known) <= {"close-untyped"}, rep.known


def test_negative_control_lost_writes_are_caught(scratch: str) -> None:
    """A disk that silently drops writes past the quota instead of failing them."""
    total = _bytes_written(scratch)
    rep = _quota_sweep(scratch, [total // 3, total // 2], swallow=True)
    F.publish_report(rep)
    assert rep.failures and (rep.lost > 0 or any(
        "verify" in f or "corrupt" in f or "VIOLATION" in f or "reopen" in f
        for f in rep.failures))


@pytest.mark.parametrize("mode", ["once", "persistent"])
def test_blob_and_workspace_enospc_through_the_seam(mode: str, scratch: str) -> None:
    _, trace = F.count_ops(F.StandardWorkload(), scratch)
    kinds = ("write", "ws-write")
    n = sum(trace.count(k) for k in kinds)
    errors: list[str] = []
    rep = F.fault_sweep(
        F.StandardWorkload(),
        lambda k: [F.Fault(kinds, at=k, persistent=mode == "persistent", error="full")],
        points=list(range(1, n + 1)), name=f"disk-full/enospc/{mode}", scratch=scratch,
        progress=lambda r: errors.extend(r.errors))
    F.publish_report(rep)
    assert rep.failures == [], "\n".join(rep.failures[:10])
    assert (rep.lost, rep.duplicated, rep.unexpected) == (0, 0, 0)
    assert errors and all(e.startswith("StorageFailure") for e in errors), errors
    blob = [e for e in errors if "blob store" in e]
    assert blob and all("full (ENOSPC)" in e for e in blob), blob
    assert any("No space left on device" in e for e in errors if "blob store" not in e)


def test_a_blob_that_does_not_fit_leaves_no_temporary_file(scratch: str) -> None:
    root = tempfile.mkdtemp(dir=scratch)
    Ledger.init(os.path.join(root, "ledger.db")).close()
    big = os.urandom(300_000)
    disk = F.PowerLossDisk(quota=200_000)

    def work(env: F.Env) -> None:
        led = env.open()
        with pytest.raises(StorageFailure) as info:
            run_step(led, "s", {"big.bin": big})
        assert info.value.exit_code == EXIT_ENVIRONMENT
        assert "ENOSPC" in str(info.value) and led.blobs.root in str(info.value)
        assert list(led.blobs.temp_files()) == []
        assert led.blobs.size(hashlib.sha256(big).hexdigest()) is None
        assert led.verify().ok and audit(led).ok
        env.disk.quota = None  # space freed
        assert run_step(led, "s", {"big.bin": big}).ran
        assert led.classify("s") == "committed"

    F.run_with_disk(disk, root, work)


# --- a real full disk: a small tmpfs -------------------------------------------------------


@pytest.fixture
def small_tmpfs() -> Iterator[str]:
    mnt = tempfile.mkdtemp(prefix="steptrail-tmpfs-")
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", mnt],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        os.rmdir(mnt)
        pytest.skip(f"cannot run mount to create a small tmpfs: {exc}")
    if proc.returncode != 0:
        os.rmdir(mnt)
        pytest.skip("mounting a 2 MiB tmpfs is not permitted here (needs root /"
                    f" CAP_SYS_ADMIN): {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        done = subprocess.run(["umount", mnt], capture_output=True, timeout=20, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20, check=False)
        os.rmdir(mnt)


def _fill(path: str, leave: int) -> None:
    """Write a filler file until only about `leave` bytes stay free."""
    st = os.statvfs(os.path.dirname(path))
    free = st.f_bavail * st.f_frsize
    with open(path, "wb") as f:
        remaining = max(0, free - leave)
        chunk = b"\0" * 65536
        try:
            while remaining > 0:
                remaining -= f.write(chunk[:remaining])
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_tmpfs_disk_full(small_tmpfs: str) -> None:
    path = os.path.join(small_tmpfs, "ledger.db")
    outputs = {"log.txt": b"l" * 3000, **{f"part{i}.bin": os.urandom(120_000) for i in range(4)}}
    with Ledger.init(path) as led:
        led.append(Planned(step="before", attempt=1))
        _fill(os.path.join(small_tmpfs, "filler"), leave=200_000)

        # a step that does not fit: typed, names the disk, says it is full
        with pytest.raises(StorageFailure) as info:
            run_step(led, "big", outputs)
        assert info.value.exit_code == EXIT_ENVIRONMENT
        assert small_tmpfs in str(info.value) and "full" in str(info.value), str(info.value)
        # consistent, nothing visible, every stored byte accounted for
        assert led.verify().ok
        assert led.classify("big") == "no-commit"
        report = audit(led)
        assert report.ok and not report.dangling, report

        # the ledger file itself cannot grow either: appends fail typed, then recover
        _fill(os.path.join(small_tmpfs, "filler2"), leave=0)
        with pytest.raises(StorageFailure, match="full"):
            for i in range(200):
                led.append(Planned(step=f"more-{i}", attempt=1, run="x" * 250,
                                   artifacts=tuple(f"a{j}/" + "y" * 200 for j in range(20))))
        assert led.verify().ok

        # space freed: the same connection goes on, the step commits on replay
        os.unlink(os.path.join(small_tmpfs, "filler"))
        os.unlink(os.path.join(small_tmpfs, "filler2"))
        led.append(Planned(step="after", attempt=1))
        assert run_step(led, "big", outputs).ran
        assert led.classify("big") == "committed"
        gc_report = collect(led, grace_s=0, force=True)
        assert list(led.blobs.temp_files()) == [], gc_report
        assert led.verify().ok and audit(led).ok
    with Ledger.open(path) as led:  # and it reopens clean
        assert led.verify().ok and led.classify("big") == "committed"
        assert {"before", "after"} <= {s.step_id for s in led.steps()}

"""`ledger.workspaces.read_file`: the planner's read, whose hash is the `pre_hash` to plan with.

The fence protects what the planner actually read. A hash taken later (`snapshot`)
hashes a person's edit made in between into the plan, and the step is applied over
it; a plan built from the read is refused instead.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import LedgerAt

from ledger import FileRead, InvalidInput, Ledger, PathEscapes, PathForbidden, StepPlan, Write


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def world(tmp_path: Path, ledger_at: LedgerAt):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_bytes(b"v0\n")
    ledger = Ledger.init(str(ledger_at(repo / ".steptrail" / "ledger.db")))
    ledger.workspaces.add("repo", str(repo))
    lease = ledger.workspaces.acquire("repo", holder="agent", ttl_s=300)
    yield ledger, repo, lease.epoch
    ledger.close()


def test_a_read_returns_the_bytes_with_their_hash_and_the_paths_rev(world) -> None:
    ledger, repo, epoch = world
    read = ledger.workspaces.read_file("repo", "app.py")
    assert read == FileRead("repo", "app.py", 0, h(b"v0\n"), b"v0\n")
    ledger.workspaces.admit("repo", epoch, [StepPlan("s1", [read.write(b"v1\n")])])
    assert ledger.workspaces.apply("s1", epoch=epoch).verdict == "applied"
    again = ledger.workspaces.read_file("repo", "app.py")
    assert (again.rev, again.pre_hash, again.content) == (1, h(b"v1\n"), b"v1\n")
    missing = ledger.workspaces.read_file("repo", "new.txt")
    assert (missing.rev, missing.pre_hash, missing.content) == (0, None, None)
    assert missing.write(b"x") == Write("new.txt", b"x", pre_hash=None, base_rev=0)


def test_a_persons_edit_after_the_read_is_refused_not_applied_over(world) -> None:
    ledger, repo, epoch = world
    read = ledger.workspaces.read_file("repo", "app.py")  # the planner reads v0 ...
    (repo / "app.py").write_bytes(b"a person's edit\n")  # ... a person edits ...
    ledger.workspaces.admit("repo", epoch, [StepPlan("s1", [read.write(b"v1\n")])])
    result = ledger.workspaces.apply("s1", epoch=epoch)  # ... the plan made from v0 is refused
    assert result.verdict == "rejected:pre_hash"
    assert (repo / "app.py").read_bytes() == b"a person's edit\n"


def test_the_hazard_a_later_snapshot_hides_the_edit(world) -> None:
    """Why the docs say read, not snapshot: the same story with the hash taken after
    the edit applies the step over the person's bytes (the broken variant)."""
    ledger, repo, epoch = world
    (repo / "app.py").write_bytes(b"a person's edit\n")
    rev, pre = ledger.workspaces.snapshot("repo", "app.py")
    ledger.workspaces.admit("repo", epoch, [StepPlan("s1", [Write("app.py", b"v1\n", pre, rev)])])
    assert ledger.workspaces.apply("s1", epoch=epoch).verdict == "applied"
    assert (repo / "app.py").read_bytes() == b"v1\n"


def test_a_step_applied_after_the_read_makes_its_plan_stale(world) -> None:
    ledger, repo, epoch = world
    read = ledger.workspaces.read_file("repo", "app.py")
    ledger.workspaces.admit("repo", epoch, [StepPlan("other", [read.write(b"other\n")])])
    assert ledger.workspaces.apply("other", epoch=epoch).verdict == "applied"
    ledger.workspaces.admit("repo", epoch, [StepPlan("mine", [read.write(b"mine\n")])])
    assert ledger.workspaces.apply("mine", epoch=epoch).verdict == "rejected:stale_rev"
    assert (repo / "app.py").read_bytes() == b"other\n"


@pytest.mark.parametrize("path, error", [
    (".steptrail/ledger.db", PathForbidden),
    (".git/config", PathForbidden),
    ("../outside", InvalidInput),
    ("/etc/passwd", InvalidInput),
    ("link", PathEscapes),
])
@pytest.mark.sqlite_only
def test_a_read_keeps_the_workspace_boundary(world, path: str, error: type) -> None:
    ledger, repo, _ = world
    (repo / "link").symlink_to("/etc/passwd")
    with pytest.raises(error):
        ledger.workspaces.read_file("repo", path)


def test_max_bytes_refuses_a_larger_file_instead_of_reading_it(world) -> None:
    ledger, _, _ = world
    with pytest.raises(InvalidInput, match="max_bytes=2"):
        ledger.workspaces.read_file("repo", "app.py", max_bytes=2)
    assert ledger.workspaces.read_file("repo", "app.py", max_bytes=3).content == b"v0\n"
    with pytest.raises(InvalidInput):
        ledger.workspaces.read_file("repo", "app.py", max_bytes=-1)


def test_a_write_named_like_steptrails_temporaries_is_refused_at_admit(world) -> None:
    """Such a file would be committed, then removed by the next apply's or settle's sweep
    of a crash's leftovers: a committed change silently lost."""
    ledger, repo, epoch = world
    name = ".x.steptrail-1-abcdef12-abcdef12.tmp"
    before = ledger.count()
    with pytest.raises(PathForbidden, match="temporary files"):
        ledger.workspaces.admit("repo", epoch, [StepPlan("s1", [Write(f"sub/{name}", b"x", None)])])
    assert ledger.count() == before and not (repo / "sub").exists()
    ledger.workspaces.admit("repo", epoch, [StepPlan("s2", [Write(".x.steptrail-notes.txt", b"x", None)])])


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True

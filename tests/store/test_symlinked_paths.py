"""A ledger under a symlinked directory works; a ledger file that is a symlink is refused
(issue 26, item 8).

A writer opens the ledger with SQLITE_OPEN_NOFOLLOW, which refuses a symlink anywhere in
the path, so a ledger under a symlinked directory (every ``$TMPDIR`` on macOS, where
``/tmp`` and ``/var`` are symlinks) failed every writer with exit 3 "free space or fix the
disk", and `init` left a 0-byte ``ledger.db`` that later commands called NotALedger. The
directory is now resolved once; only the ledger's own files (the database, its -wal,
-shm, -lockq, the gc lock) must not be symlinks, and one that is is refused with exit 2
and the reason, nothing created. An `init` that fails leaves no file behind.

The commands run as the user runs them: ``python -m ledger`` in a child process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest
from conftest import CLEAN_ENV, commit_step, run_cli

from ledger import Ledger
from ledger.errors import StorageFailure


def steptrail(*argv: str, cwd: Path, input: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    return subprocess.run([sys.executable, "-m", "ledger", *argv], check=False, cwd=cwd,
                          input=input,
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


def ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert r.returncode == 0, (r.args, r.returncode, r.stdout, r.stderr)
    return r


def tree(root: Path) -> dict[str, Any]:
    """Every entry under `root` (symlinks not followed): a file's bytes, a symlink's
    target, None for a directory."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = (("->", os.readlink(path)) if path.is_symlink()
                    else None if path.is_dir() else path.read_bytes())
    return out


def refused(r: subprocess.CompletedProcess[str], names: str) -> None:
    """Exit 2, one line naming the symlink `names` and the fix, no traceback."""
    assert r.returncode == 2, (r.args, r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("steptrail: error: NotALedger: ") and "Traceback" not in r.stderr
    assert names in r.stderr and "symlink" in r.stderr and "give the real path" in r.stderr


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """tmp_path/real, and tmp_path/link -> real (a relative symlink, as /tmp -> private/tmp)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    return tmp_path


def test_every_writer_works_under_a_symlinked_directory(linked: Path) -> None:
    ws = linked / "real" / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v0")
    led = ["--ledger", "link/l.db"]
    assert "created ledger" in ok(steptrail(*led, "init", cwd=linked)).stdout
    assert (linked / "real" / "l.db").stat().st_size > 0
    ok(steptrail(*led, "workspace", "add", "w", "link/ws", cwd=linked))
    lease = json.loads(ok(steptrail(*led, "--workspace", "w", "lease", "acquire", "--holder",
                                    "a", "--ttl", "10m", "--json", cwd=linked)).stdout)
    epoch = str(lease["epoch"])
    plan = {"step": "s1", "writes": [{"path": "app.py", "content": "v1",
                                      "pre_hash": hashlib.sha256(b"v0").hexdigest()}]}
    ok(steptrail(*led, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
                 input=json.dumps(plan), cwd=linked))
    receipt = ok(steptrail(*led, "step", "apply", "s1", "--epoch", epoch, "--json",
                           cwd=linked)).stdout
    ok(steptrail(*led, "step", "publish", "s1", "--receipt", "-", "--epoch", epoch,
                 input=json.dumps(json.loads(receipt)["receipt"]), cwd=linked))
    ok(steptrail(*led, "step", "ack", "s1", "--epoch", epoch, cwd=linked))
    assert (ws / "app.py").read_text() == "v1"
    # the library: open, append (a blob file, over the inline limit, beside the ledger)
    with Ledger.open(linked / "link" / "l.db") as ledger:
        commit_step(ledger, "s2", content=os.urandom(2_000_000))
    assert "s2" in ok(steptrail(*led, "steps", cwd=linked)).stdout
    ok(steptrail(*led, "verify", cwd=linked))
    ok(steptrail(*led, "gc", cwd=linked))
    (linked / "other").mkdir()
    (linked / "other-link").symlink_to("other")
    ok(steptrail(*led, "backup", "./other-link/backup", cwd=linked))
    ok(steptrail("backup", "verify", "other-link/backup", cwd=linked))
    ok(steptrail("copy", "link/l.db", "link/copy.db", cwd=linked))
    ok(steptrail("--ledger", "link/new/l.db", "init", cwd=linked))  # its directory made too
    assert (linked / "real" / "new" / "l.db").stat().st_size > 0
    assert (linked / "other" / "backup" / "BACKUP.json").exists()


def test_a_ledger_under_a_symlinked_tmpdir_works(linked: Path) -> None:
    """macOS: $TMPDIR is under /var, a symlink; the demo's ledger is made there."""
    r = ok(steptrail("demo", cwd=linked, env={"TMPDIR": str(linked / "link")}))
    assert "demo PASSED" in r.stdout


@pytest.mark.parametrize("own", ["", "-wal", "-shm", "-lockq"])
def test_a_symlinked_ledger_file_is_refused_and_nothing_is_created(linked: Path,
                                                                   own: str) -> None:
    real = linked / "real"
    Ledger.init(real / "l.db").close()
    ws = linked / "ws"
    ws.mkdir()
    if own == "":  # the ledger itself a symlink to a real ledger, and one to nothing
        (linked / "sym.db").symlink_to("real/l.db")
        (linked / "dangling.db").symlink_to("real/nowhere.db")
        targets = {"sym.db": "sym.db", "dangling.db": "dangling.db"}
    else:  # a file of its own beside a real ledger a symlink (to a file not there)
        (real / f"l.db{own}").unlink(missing_ok=True)  # (init made a -lockq)
        (real / f"l.db{own}").symlink_to("elsewhere")
        targets = {"real/l.db": f"l.db{own}"}
    before = tree(linked)
    for ledger, names in targets.items():
        for argv in (["init"], ["workspace", "add", "w", "ws"], ["gc"]):
            refused(steptrail("--ledger", ledger, *argv, cwd=linked), names)
    assert tree(linked) == before
    assert not (real / "nowhere.db").exists() and not (real / "elsewhere").exists()


def test_a_symlinked_gc_lock_is_refused(linked: Path) -> None:
    Ledger.init(linked / "real" / "l.db").close()
    (linked / "real" / ".steptrail-gc.lock").symlink_to("elsewhere")
    r = steptrail("--ledger", "real/l.db", "gc", cwd=linked)
    assert r.returncode == 2 and "symlink" in r.stderr and r.stderr.count("\n") == 1, r
    assert not (linked / "real" / "elsewhere").exists()


def test_an_init_that_fails_leaves_nothing_behind(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.store.sqlite import database as file

    def broken(*_a: Any, **_k: Any) -> None:
        raise apsw.IOError("injected: the disk failed")

    monkeypatch.setattr(file, "_harden", broken)
    with pytest.raises(StorageFailure):
        Ledger.init(tmp_path / "l.db")
    assert sorted(os.listdir(tmp_path)) == []
    r = run_cli(["--ledger", str(tmp_path / "sub" / "l.db"), "init"])
    assert r.code == 3 and "StorageFailure" in r.err, r
    assert sorted(os.listdir(tmp_path / "sub")) == []  # (the directory it made stays)
    monkeypatch.undo()
    assert Ledger.init(tmp_path / "l.db").created  # and a later init is a clean one

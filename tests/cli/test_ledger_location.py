"""Red team of issue 37 ("a newcomer's second hour"): the upward ledger search, URL
handling, restore --replace, each surface's words. Each test is an attack that once
worked (or still does: xfail)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from ledger import InvalidInput, Ledger, StepPlan
from ledger.find import ENV_CEILINGS

SECRET = "s3cret"


# -- URL handling: a mistyped URL is a file path nowhere --------------------------------


@pytest.mark.parametrize("location", [
    f" postgresql://bob:{SECRET}@db/x",      # a space pasted before it
    f"postgresql:/bob:{SECRET}@db/x",        # a slash missing
    f"postgresql:bob:{SECRET}@db/x",         # both slashes missing
    f"postgresql//bob:{SECRET}@db/x",        # its colon missing
    f"postgres ql://bob:{SECRET}@db/x",      # a space inside the scheme
    "postgresql:/db/x",                      # a slash missing, no credentials
    f"hostt=db password={SECRET} dbname=x",  # a keyword string, its first keyword mistyped
])
def test_a_mistyped_url_makes_no_directory_and_shows_no_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    """The attack: each of these was taken as a file path — `init --parents` made the
    directories ``postgresql:/bob:s3cret@db`` and printed ``created ledger
    .../bob:s3cret@db/x`` (the password in a directory's name and on the screen)."""
    monkeypatch.chdir(tmp_path)
    for argv in (["--ledger", location, "init", "--parents"],
                 ["--ledger", location, "status", "--json"]):
        r = run_cli(argv)
        assert r.code == 2, r
        assert SECRET not in r.out + r.err, r
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InvalidInput) as caught:
        Ledger.init(location, parents=True)
    assert SECRET not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("location", ["ledger.db", "a b/c:d.db", "backups//x.db", "x=1.db",
                                      "C:/x.db"])
def test_file_paths_that_are_not_urls_are_still_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["--ledger", location, "init", "--parents"]).code == 0
    assert (tmp_path / location).is_file()


@pytest.mark.parametrize("location", [
    f"host=db pasword={SECRET} dbname=x",
    f"postgresql://bob@db/x?pasword={SECRET}&sslmode=require",
])
def test_a_mistyped_password_keyword_is_not_shown(location: str) -> None:
    """The attack: ``pasword=s3cret`` (a keyword libpq does not know) was echoed in the
    refusal, --json included: only the keywords libpq marks secret were masked."""
    pytest.importorskip("psycopg")
    r = run_cli(["--ledger", location, "status", "--json"])
    assert r.code == 2, r
    assert SECRET not in r.out + r.err, r


# -- a removed working directory: bad input, not a retry --------------------------------


def test_a_removed_working_directory_is_bad_input_that_names_its_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: from a directory removed under the shell, every command failed
    "EnvironmentFailure: No such file or directory (no file)", exit 3 (retry: it never
    helps), and `Ledger.open()` raised a bare FileNotFoundError."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("STEPTRAIL_LEDGER", raising=False)
    for argv in (["status"], ["init"], ["init", "--nested"], ["steps", "--json"]):
        r = run_cli(argv)
        assert r.code == 2, r
        assert "working directory" in r.err and "cd to a directory" in r.err, r
        assert "os.chdir" not in r.err, r
    with pytest.raises(InvalidInput) as caught:
        Ledger.open()
    assert "os.chdir()" in str(caught.value) and "'steptrail" not in str(caught.value)


# -- restore --replace: what is in the way is named, not the ledger's path --------------


def _committed_repo(tmp_path: Path) -> Ledger:
    repo = tmp_path / "repo"
    (repo / "d").mkdir(parents=True)
    (repo / "a.txt").write_text("a0\n")
    (repo / "d" / "b.txt").write_text("b0\n")
    led = Ledger.init(str(repo / ".steptrail" / "ledger.db"))
    led.workspaces.add("repo", str(repo))
    lease = led.workspaces.acquire("repo", holder="x", ttl_s=60)
    ra = led.workspaces.read_file("repo", "a.txt")
    rb = led.workspaces.read_file("repo", "d/b.txt")
    led.workspaces.admit("repo", lease.epoch, [StepPlan("s1", [ra.write(b"a1\n"),
                                                               rb.write(b"b1\n")])])
    assert led.workspaces.apply("s1", epoch=lease.epoch).verdict == "applied"
    led.publish("s1")
    led.ack("s1", epoch=lease.epoch)
    led.workspaces.release("repo", lease.epoch)
    return led


@pytest.mark.parametrize("in_the_way", ["symlink-file", "symlink-dir", "file-for-dir",
                                        "dir-for-file"])
def test_restore_replace_names_what_is_in_the_way(tmp_path: Path, in_the_way: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is written outside the target (held); but the refusal was PathEscapes'
    "give a plain relative path inside the workspace that crosses no symlink" — advice
    for a step's author, about a path the restoring person never gave."""
    led = _committed_repo(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("S\n")
    target = tmp_path / "target"
    target.mkdir()
    if in_the_way == "symlink-file":
        (target / "a.txt").symlink_to(outside / "secret")
    elif in_the_way == "symlink-dir":
        (target / "d").symlink_to(outside)
    elif in_the_way == "file-for-dir":
        (target / "d").write_text("mine\n")
    else:
        (target / "a.txt").mkdir()
    with pytest.raises(InvalidInput) as caught:
        led.workspaces.restore("repo", str(target), replace=True)
    assert "move that entry away" in str(caught.value), caught.value
    assert "plain relative path" not in str(caught.value)
    assert [p.name for p in outside.iterdir()] == ["secret"]
    assert (outside / "secret").read_text() == "S\n"
    led.close()
    monkeypatch.chdir(tmp_path / "repo")
    r = run_cli(["restore", "--workspace", "repo", "--to", str(target), "--replace"])
    assert r.code == 2 and "move that entry away" in r.err, r


# -- the upward search: a ledger swapped in after the ownership check -------------------


def _give_away(root: Path, uid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, -1)


@pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                    reason="needs root to give a file to another user (CI runs as root)")
@pytest.mark.xfail(strict=True, reason=(
    "find_ledger checks the owner of .steptrail and ledger.db by path, then the store"
    " opens the path again: whoever can rename entries in the directory holding"
    " .steptrail (another user owning the project's or a shared parent directory) can"
    " put their ledger there between the check and the open. A fix opens what was"
    " checked (a directory descriptor, or the identity checked compared with the file"
    " SQLite opened), or refuses a project directory another user can rename in, as"
    " git's safe.directory checks the worktree's owner"))
def test_a_ledger_swapped_in_after_the_ownership_check_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap is made deterministic: right after the check returns (the window a
    process of the other user races for), .steptrail is another user's."""
    import ledger.find as find
    from ledger.errors import ForeignLedger

    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    Ledger.init(str(proj / ".steptrail" / "ledger.db")).close()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    with Ledger.init(str(theirs / ".steptrail" / "ledger.db")) as led:
        (tmp_path / "victim").mkdir()
        led.workspaces.add("planted", str(tmp_path / "victim"))
    _give_away(theirs / ".steptrail", 65534)
    checked = find._check_yours

    def check_then_swap(candidate: str, env: dict[str, str]) -> None:
        checked(candidate, env)
        os.rename(proj / ".steptrail", tmp_path / "mine-moved-away")
        os.rename(theirs / ".steptrail", proj / ".steptrail")

    monkeypatch.setattr(find, "_check_yours", check_then_swap)
    monkeypatch.chdir(proj / "sub")
    monkeypatch.delenv("STEPTRAIL_LEDGER", raising=False)
    monkeypatch.delenv(ENV_CEILINGS, raising=False)
    try:
        with pytest.raises(ForeignLedger):
            with Ledger.open() as led:
                names = [w.name for w in led.workspaces.list()]
                assert "planted" not in names  # (the foreign one's registration)
    finally:
        shutil.rmtree(proj / ".steptrail", ignore_errors=True)

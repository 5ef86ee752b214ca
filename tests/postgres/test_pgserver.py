"""The throwaway PostgreSQL server harness (ledger/testing/pgserver.py) itself.

A server starts on a private socket, takes a commit, survives a crash (``kill``: pg_ctl
stop -m immediate) with the commit and without the uncommitted work, and `close()`
leaves nothing behind; `terminate_backends` ends exactly the sessions asked for; the
command line's DIR-based server persists across stop and start; the module imports
without psycopg; as root without a ``postgres`` user it refuses with the fix named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from ledger.testing import pgserver
from ledger.testing.pgserver import PgServer, PgServerError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory under the system's temporary directory: short enough for a unix socket
    path, and searchable by the 'postgres' user a root run starts the server as (pytest's
    tmp_path under /tmp/pytest-of-root is not)."""
    d = Path(tempfile.mkdtemp(prefix="pgt-"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_server_keeps_a_commit_across_a_crash_and_close_removes_it(pg_bindir: str,
                                                                     short_tmp: Path) -> None:
    began = time.monotonic()
    server = PgServer.start(str(short_tmp))
    started = time.monotonic() - began
    try:
        assert server.running and server.root.parent == short_tmp.resolve()
        assert started < 30, started
        # The unix socket URL, host percent-encoded; no TCP listener.
        url = server.create_database("crash db")
        assert url.startswith("postgresql://steptrail@/crash%20db?host=%2F")
        assert conninfo_to_dict(url) == {"user": "steptrail", "dbname": "crash db",
                                         "host": server.host, "port": str(server.port)}
        assert (os.stat(server.host).st_mode & 0o777) == 0o700
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            assert conn.execute("SHOW max_connections").fetchone() == ("300",)
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
        pending = psycopg.connect(url)
        pending.execute("INSERT INTO t VALUES (2)")  # open transaction: never committed

        server.kill()
        assert not server.running
        with pytest.raises(psycopg.OperationalError):
            pending.execute("SELECT 1")
        pending.close()
        port = server.port
        server.restart()
        assert server.running and server.port == port
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        assert "database system was interrupted" in server.log_path.read_text()

        server.stop()
        assert not server.running
        server.restart()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        server.close()
    assert not server.running
    assert not server.root.exists()
    server.close()  # idempotent


def test_terminate_backends_ends_the_sessions_asked_for(pg_server: PgServer,
                                                        pg_url: str) -> None:
    dbname = conninfo_to_dict(pg_url)["dbname"]
    assert pg_url == f"postgresql://steptrail@127.0.0.1:{pg_server.port}/{dbname}"
    victim = psycopg.connect(pg_url, application_name="victim")
    bystander = psycopg.connect(pg_url, application_name="bystander")
    try:
        assert pg_server.terminate_backends(dbname, application_name="victim") == 1
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        assert pg_server.terminate_backends(dbname) == 1
        with pytest.raises(psycopg.OperationalError):
            bystander.execute("SELECT 1")
        assert pg_server.terminate_backends(dbname) == 0
    finally:
        victim.close()
        bystander.close()


def test_drop_database_ends_its_sessions(pg_server: PgServer) -> None:
    url = pg_server.create_database("dropped")
    conn = psycopg.connect(url)
    try:
        pg_server.drop_database("dropped")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(url)
    pg_server.drop_database("dropped")  # absent: nothing to do


def test_a_failed_start_shows_the_log_and_leaves_nothing(pg_bindir: str,
                                                         short_tmp: Path) -> None:
    with pytest.raises(PgServerError) as e:
        PgServer.start(str(short_tmp), settings={"shared_buffers": "lots"})
    assert "did not start" in e.value.message and "\n" not in e.value.message
    assert 'shared_buffers' in (e.value.log_tail or "")
    assert "server log" in str(e.value)
    assert list(short_tmp.iterdir()) == []


def test_as_root_without_a_postgres_user_it_names_the_fix(
        pg_bindir: str, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgserver.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pgserver, "RUN_AS_USER", "steptrail-no-such-user")
    with pytest.raises(PgServerError, match="'steptrail-no-such-user' system user, which does"
                                            " not exist.*apt-get install postgresql"):
        PgServer.start(str(short_tmp))
    assert list(short_tmp.iterdir()) == []


def pgserver_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledger.testing.pgserver", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_command_line_keeps_a_server_in_a_directory(
        pg_bindir: str, short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = short_tmp / "pg"
    first = pgserver_cli("start", str(d))
    try:
        assert first.returncode == 0, first.stderr
        url = first.stdout.strip()
        assert first.stdout == url + "\n" and first.stderr == ""
        assert conninfo_to_dict(url)["dbname"] == "steptrail"
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        again = pgserver_cli("start", str(d))  # running: the URL again
        assert (again.returncode, again.stdout) == (0, first.stdout), again.stderr

        stop = pgserver_cli("stop", str(d))
        assert (stop.returncode, stop.stdout, stop.stderr) == (0, "", "")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url)
        assert (d / "data").is_dir()
        restarted = pgserver_cli("start", str(d))
        assert (restarted.returncode, restarted.stdout) == (0, first.stdout), restarted.stderr
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]
    finally:
        pgserver_cli("stop", str(d))
    # Errors: one line on stderr, exit 1 (in-process: the same main()).
    for args in (["stop", str(short_tmp / "absent")], ["start", str(ROOT / "ledger")],
                 ["start", str(d), "--tcp"], ["nonsense"], []):
        code, out, err = main_in_process(capsys, *args)
        assert code == 1 and out == "", (args, code, out, err)
        assert err.startswith("pgserver: error: ") and err.count("\n") == 1, (args, err)
    code, out, _ = main_in_process(capsys, "--help")
    assert code == 0 and "STEPTRAIL_LEDGER=$(python -m" in out


def main_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = pgserver.main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_module_imports_without_psycopg() -> None:
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from ledger.testing import pgserver\n"
            "print(pgserver.INSTALL_HINT.count(chr(10)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr

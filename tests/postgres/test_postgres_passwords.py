"""A database password never leaves steptrail: not on stdout, not on stderr, not in a
file it writes (issue 26, item 2).

libpq accepts a password holding ``?``, ``#``, ``:`` or quotes unencoded in a URL, and
any password in a keyword/value string (``host=... password='...'``); Python's
``urlsplit`` reads such a URL otherwise (``?`` starts its query), so a location shown by
splitting it showed the password. Every location is now shown through one function,
`ledger.store.postgres.location.shown_location`, which reads it with libpq's own parser.

The session's throwaway server gets a login role per hostile password, which must
authenticate with it (scram-sha-256 over 127.0.0.1, one pg_hba.conf line each, taken
out again afterwards): each location of the matrix (a URL with the password raw,
percent-encoded, or in the query; a keyword/value string) really connects. Every
command that shows or stores a location runs over each: init, stats, verify, metrics,
audit, witness, seal, copy (both ways, and refused), backup (take, verify, restore, its
BACKUP.json), mcp's start-up lines, demo, and the errors (no such database, a closed
port, a wrong password, a URL libpq cannot parse or reads otherwise than it looks).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from conftest import CLEAN_ENV, closed_port, run_cli
from psycopg import sql

#: name -> password. Each holds a marker (letters and digits, 6+) that any encoding of
#: the password keeps: the marker found anywhere is the password found.
PASSWORDS = {
    "issue": "Hunter2?Secret99",  # the issue's own: urlsplit took '?Secret99@...' for a query
    "hash-colon-quotes": "Qq#Zx:Mark3r42'Dq\"?",
    "everything": "Sl/Slash7@AtAt9%zz Spc'\"#?:\\",
}
MARKERS = {"issue": ("Hunter2", "Secret99"), "hash-colon-quotes": ("Mark3r42",),
           "everything": ("Slash7", "AtAt9")}
#: Passwords libpq reads raw in a URL's user info (no '/', '@', '%', space, backslash).
RAW_OK = ("issue", "hash-colon-quotes")
FORMS = ("url-raw", "url-encoded", "url-query", "keywords")
_numbers = itertools.count(1)


def kv_escaped(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def location(form: str, role: str, password: str, port: int, db: str) -> str:
    """`db` as `role` with `password`, written in `form`."""
    host = f"127.0.0.1:{port}"
    if form == "url-raw":
        return f"postgresql://{role}:{password}@{host}/{db}"
    if form == "url-encoded":
        return f"postgresql://{role}:{quote(password, safe='')}@{host}/{db}"
    if form == "url-query":
        return f"postgresql://{role}@{host}/{db}?password={quote(password, safe='')}"
    assert form == "keywords"
    return f"host=127.0.0.1 port={port} dbname={db} user={role} password={kv_escaped(password)}"


def secrets_in(text: str) -> list[str]:
    """Which passwords (their markers) `text` holds."""
    return [name for name, marks in MARKERS.items() if any(m in text for m in marks)]


def files_holding_secrets(root: Path) -> list[str]:
    """Every file or directory under `root` whose name or bytes hold a password."""
    found = []
    for path in sorted(root.rglob("*")):
        if secrets_in(path.name):
            found.append(f"name: {path}")
        elif path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(m.encode() in data for marks in MARKERS.values() for m in marks):
                found.append(f"content: {path}")
    return found


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


@pytest.fixture(scope="module")
def roles(pg_server: Any) -> Iterator[dict[str, str]]:
    """name -> a login role whose password is PASSWORDS[name], which the server checks
    (scram-sha-256 for these roles over 127.0.0.1; every other role as before)."""
    if not pg_server.running:
        pg_server.restart()
    made = {name: f"pwt_{os.getpid()}_{i}" for i, name in enumerate(PASSWORDS)}
    hba = pg_server.data_dir / "pg_hba.conf"
    before = hba.read_bytes()
    with admin(pg_server.url()) as conn:
        for name, role in made.items():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORDS[name])))
    lines = "".join(f"host all {role} 127.0.0.1/32 scram-sha-256\n" for role in made.values())
    hba.write_bytes(lines.encode() + before)
    try:
        with admin(pg_server.url()) as conn:
            conn.execute("SELECT pg_reload_conf()")
        _wait_for_password_checks(pg_server, made)
        yield made
    finally:
        hba.write_bytes(before)
        with admin(pg_server.url()) as conn:
            conn.execute("SELECT pg_reload_conf()")
            for role in made.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _wait_for_password_checks(pg_server: Any, made: dict[str, str]) -> None:
    """Until the reloaded pg_hba.conf refuses a wrong password (reloads are signalled)."""
    role = next(iter(made.values()))
    deadline = time.monotonic() + 10
    while True:
        try:
            psycopg.connect(host="127.0.0.1", port=pg_server.port, dbname="postgres",
                            user=role, password="wrong", connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            assert "password authentication failed" in str(exc), exc
            return
        assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
        time.sleep(0.05)


@pytest.fixture
def databases(pg_server: Any) -> Iterator[Callable[[str], str]]:
    """make(owner) -> the name of a fresh database `owner` owns; all dropped afterwards."""
    made: list[str] = []

    def make(owner: str) -> str:
        name = f"pwt_db_{os.getpid()}_{next(_numbers)}"
        with admin(pg_server.url()) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0").format(
                sql.Identifier(name), sql.Identifier(owner)))
        made.append(name)
        return name

    yield make
    for name in made:
        with contextlib.suppress(Exception):
            pg_server.drop_database(name)


def _cases() -> list[Any]:
    return [pytest.param(form, name, id=f"{form}-{name}") for form in FORMS
            for name in PASSWORDS if form != "url-raw" or name in RAW_OK]


@pytest.mark.parametrize("form, name", _cases())
def test_no_command_shows_or_stores_the_password(
        form: str, name: str, roles: dict[str, str], databases: Callable[[str], str],
        pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a location taken for a file path lands here, and is seen
    role, password, port = roles[name], PASSWORDS[name], pg_server.port
    url = location(form, role, password, port, databases(role))
    empty = location(form, role, password, port, databases(role))
    third = location(form, role, password, port, databases(role))
    missing = location(form, role, password, port, f"pwt_no_such_{os.getpid()}")
    closed = location(form, role, password, closed_port(), "postgres")
    other = next(n for n in PASSWORDS if n != name)  # another role's password: wrong here
    wrong = location(form, role, PASSWORDS[other], port, "postgres")
    assert secrets_in(url) == [name]
    work = tmp_path / "work"
    (work / "repo").mkdir(parents=True)
    f = str(work)
    runs: list[tuple[list[str], int | None, dict[str, str] | None]] = [
        (["--ledger", url, "init"], 0, None),
        (["--ledger", url, "init", "--json"], 0, None),
        (["--ledger", url, "workspace", "add", "w", f"{f}/repo"], 0, None),
        (["--ledger", url, "stats"], 0, None),
        (["--ledger", url, "stats", "--json"], 0, None),
        (["stats", "--json"], 0, {"STEPTRAIL_LEDGER": url}),
        (["--ledger", url, "verify"], 0, None),
        (["--ledger", url, "verify", "--json"], 0, None),
        (["--ledger", url, "metrics"], 0, None),
        (["--ledger", url, "metrics", "--json"], 0, None),
        (["--ledger", url, "audit"], None, None),
        (["--ledger", url, "head"], 0, None),
        (["--ledger", url, "steps", "--json"], 0, None),
        (["--ledger", url, "witness", "show"], None, None),
        (["--ledger", url, "seal", "plan"], None, None),
        (["--ledger", url, "seal", "list"], None, None),
        (["copy", url, f"{f}/copy.db"], 0, None),
        (["copy", url, f"{f}/copy2.db", "--json"], 0, None),
        (["copy", f"{f}/copy.db", empty, "--json"], 0, None),
        (["copy", f"{f}/copy.db", url], 2, None),  # the destination holds a ledger
        (["copy", url, url, "--json"], 2, None),
        (["--ledger", url, "backup", f"{f}/backup"], 0, None),
        (["--ledger", url, "backup", "take", f"{f}/backup", "--json"], 0, None),
        (["backup", "verify", f"{f}/backup"], 0, None),
        (["backup", "verify", f"{f}/backup", "--json"], 0, None),
        (["backup", "restore", f"{f}/backup", f"{f}/restored"], 0, None),
        (["--ledger", third, "init"], 0, None),
        (["--ledger", third, "backup", f"{f}/backup"], 2, None),  # another ledger's backup
    ]
    for bad, code in ((missing, 2), (closed, 3), (wrong, 2)):  # wrong password: AccessDenied, exit 2
        runs += [(["--ledger", bad, "init"], code, None), (["--ledger", bad, "stats"], code, None),
                 (["--ledger", bad, "stats", "--json"], code, None),
                 (["--ledger", bad, "verify", "--json"], code, None),
                 (["copy", bad, f"{f}/never.db"], code, None),
                 (["--ledger", bad, "backup", f"{f}/never-backup"], code, None)]
    for argv, code, env in runs:
        r = run_cli(argv, env=env)
        assert code is None or r.code == code, (argv, r)
        assert not secrets_in(r.out + r.err), (argv, r)
        if r.code == 0 and ("init" in argv or "stats" in argv):
            assert (role in r.out) and ("***" in r.out), (argv, r.out)  # shown, not dropped
    marker = json.loads((work / "backup" / "BACKUP.json").read_text())
    assert role in marker["source"] and "***" in marker["source"], marker["source"]
    assert not files_holding_secrets(tmp_path), files_holding_secrets(tmp_path)
    assert not (work / "never.db").exists() and not (work / "never-backup").exists()


# A URL libpq cannot parse, or reads otherwise than it looks, is refused before any
# connection: a typed one-line error showing no part of the password, nothing written.
UNUSABLE = {
    # an unencoded '/' and '@' in the password: libpq reads the user info up to the first
    # of them, so the rest of the password would be the host (and be looked up in DNS)
    "slash-and-at": ("postgresql://{role}:{pw}@127.0.0.1:{port}/postgres", "everything",
                     "percent-encode"),
    "at-only": ("postgresql://{role}:Be4r@Slash7Tail@127.0.0.1:{port}/postgres", None,
                "percent-encode"),
    "slash-only": ("postgresql://{role}:Slash7/AtAt9@127.0.0.1:{port}/postgres", None,
                   "percent-encode"),
    # spaces and a bad percent escape: libpq refuses the URL and quotes the password
    "spaces": ("postgresql://{role}:Slash7 AtAt9@127.0.0.1:{port}/postgres", None,
               "not a usable"),
    "bad-escape": ("postgresql://{role}:Slash7%zzAtAt9@127.0.0.1:{port}/postgres", None,
                   "not a usable"),
    "keywords-unterminated-quote": (("host=127.0.0.1 port={port} user={role}"
                                     " password='Slash7 AtAt9"), None, "not a usable"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_unusable_location_is_refused_without_any_of_the_password(
        case: str, roles: dict[str, str], pg_server: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    template, name, says = UNUSABLE[case]
    role = roles["everything"]
    url = template.format(role=role, pw=PASSWORDS[name] if name else "", port=pg_server.port)
    monkeypatch.chdir(tmp_path)
    for argv in (["--ledger", url, "init"], ["--ledger", url, "stats", "--json"],
                 ["--ledger", url, "verify"], ["copy", url, "c.db"],
                 ["--ledger", url, "backup", "./b"]):
        r = run_cli(argv)
        assert r.code == 2 and "InvalidInput" in r.err and says in r.err, (argv, r)
        assert not secrets_in(r.out + r.err), (argv, r)
    assert not list(tmp_path.iterdir())  # nothing written (no file named after it either)


def _steptrail(argv: list[str], *, cwd: Path, stdin: Any = subprocess.DEVNULL,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    return subprocess.run([sys.executable, "-m", "ledger", *argv], check=False, cwd=cwd, env=env,
                          stdin=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("form", FORMS)
def test_mcp_and_demo_never_show_the_password(
        form: str, roles: dict[str, str], databases: Callable[[str], str], pg_server: Any,
        tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    name = "issue" if form == "url-raw" else "everything"
    role = roles[name]
    url = location(form, role, PASSWORDS[name], pg_server.port, databases(role))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    # stdin closed: the server starts (its lines on stderr), reads EOF and stops
    r = _steptrail(["--ledger", url, "mcp", "--workspace", str(repo)], cwd=tmp_path)
    assert "serving" in r.stderr and role in r.stderr, r
    assert not secrets_in(r.stdout + r.stderr), r
    demo = location(form, role, PASSWORDS[name], pg_server.port, databases(role))
    r = _steptrail(["demo", "--ledger", demo, "--keep", str(tmp_path / "demo")], cwd=tmp_path)
    assert r.returncode == 0 and "demo PASSED" in r.stdout, r
    assert not secrets_in(r.stdout + r.stderr), r
    r = _steptrail(["demo", "--ledger", demo, "--json"], cwd=tmp_path)  # refused: not empty
    assert r.returncode == 2 and not secrets_in(r.stdout + r.stderr), r
    assert not files_holding_secrets(tmp_path), files_holding_secrets(tmp_path)


# === the one function, with and without libpq ===============================================

#: Locations libpq reads as they look: shown as libpq reads them, secrets as ***.
READABLE = [
    "postgresql://stepledger:Hunter2?Secret99@db.internal:5432/ledger",
    "postgres://u:Qq#Zx:Mark3r42'Dq\"?@db/l",
    "postgresql://u:Sl%2FSlash7%40AtAt9%25zz%20Spc'%22%23%3F%3A%5C@db/l?sslmode=disable",
    "postgresql://u@[::1]:5432,db2:5433/l?password=Slash7%20AtAt9&application_name=x",
    "postgresql://u:Hunter2?Secret99@/l?host=%2Frun%2Fpg&port=5433",
    "postgresql://h/l?pass%77ord=Secret99&sslpassword=Mark3r42&options=-csearch_path%3Ds",
    "host=db port=5432 dbname=l user=u password='Sl/Slash7@AtAt9%zz Spc\\'\"#?:\\\\'",
    "host=db password=Hunter2?Secret99 dbname=l",
    "  dbname = l   password = Secret99 sslpassword='Mark3r42 x'",
]
#: Locations libpq refuses, or reads otherwise than they look: masked conservatively.
UNREADABLE = [
    "postgresql://u:Sl/Slash7@AtAt9@db/l",
    "postgresql://u:Slash7@AtAt9@db/l",
    "postgresql://u:Slash7 AtAt9@db/l",
    "postgresql://u:Slash7%zz@db/l?password=Mark3r42",
    "postgresql://u:Hunter2?Secret99@[bad/l",
    "postgresql:///l?host=/run/pg&user=u@x&password=Hunter2?Secret99",
    "host=db password='Slash7 AtAt9",
]
SHOWN_MATRIX = READABLE + UNREADABLE


@pytest.mark.parametrize("loc", SHOWN_MATRIX)
def test_shown_location_keeps_everything_but_the_secrets(loc: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from ledger.store.postgres.location import is_url, location_secrets, shown_location

    assert is_url(loc)
    shown = shown_location(loc)
    assert not secrets_in(shown) and "***" in shown, shown
    if loc in UNREADABLE:
        return
    assert shown == shown_location(shown)  # showing what is shown changes nothing
    # libpq reads the shown form as the location itself, every secret as ***
    read = conninfo_to_dict(loc)
    secret_keys = {"password", "sslpassword"}
    assert conninfo_to_dict(shown) == {k: "***" if k in secret_keys else v
                                       for k, v in read.items()}, shown
    assert {read[k] for k in secret_keys if k in read} <= location_secrets(loc)


@pytest.mark.parametrize("path", [".steptrail/ledger.db", "/tmp/a@b:c?d#e.db",
                                  "./host.db", "hostname=x.db", "C:ledger.db"])
def test_a_file_path_is_shown_as_it_is(path: str) -> None:
    from ledger.store.postgres.location import is_url, shown_location

    assert not is_url(path) and shown_location(path) == path


_WITHOUT_PSYCOPG = r"""
import json, sys
sys.modules["psycopg"] = None  # as if the [postgres] extra were not installed
import ledger, ledger.cli, ledger.backup, ledger.copying, ledger.demo
from ledger.store.postgres.location import shown_location
print(json.dumps({"shown": [shown_location(x) for x in json.loads(sys.argv[1])],
                  "imported": sorted(m for m in sys.modules if m.startswith("psycopg")
                                     and sys.modules[m] is not None)}))
"""


def test_without_psycopg_nothing_imports_it_and_no_password_is_shown(tmp_path: Path) -> None:
    """Without the [postgres] extra: the core imports no psycopg, a file path is shown as
    it is, a PostgreSQL location is masked conservatively (everything between // and the
    last @, every secret keyword's value), and a command given one says which extra it
    needs, showing no password."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    r = subprocess.run([sys.executable, "-c", _WITHOUT_PSYCOPG, json.dumps(SHOWN_MATRIX)],
                       check=False, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["imported"] == []
    for loc, shown in zip(SHOWN_MATRIX, got["shown"]):
        assert not secrets_in(shown) and "***" in shown, (loc, shown)
    assert got["shown"][0] == "postgresql://***@db.internal:5432/ledger"
    code = ("import sys; sys.modules['psycopg'] = None; from ledger.cli import main;"
            " sys.argv = ['steptrail', '--ledger', sys.argv[1], 'stats']; main()")
    for loc in READABLE[:3] + READABLE[6:8]:
        r = subprocess.run([sys.executable, "-c", code, loc], check=False, env=env,
                           capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
        assert r.returncode == 2 and "[postgres]" in r.stderr and "pip install" in r.stderr, r
        assert not secrets_in(r.stdout + r.stderr), r
    assert not list(tmp_path.iterdir())

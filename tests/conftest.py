"""Shared fixtures: a fake clock, a ledger on tmp_path, event-building helpers, a
throwaway PostgreSQL server (`pg_server`, one per session; `pg_url`, a database per test),
and where a test's ledgers are (`ledger_at`, `ledger_location`): on SQLite, and in a
``BOTH_STORES`` module on PostgreSQL too (`pytest_generate_tests`).

Every ledger in the tests runs on the fake clock; nothing reads wall time. Fixtures
expose the helpers (`digest`, `commit_step`, ...); module-level code imports them with
``from conftest import ...`` (pytest's default import mode puts tests/ on sys.path).

The tests live in one folder per subject (docs/testing.md "The layout"); each folder is
on sys.path too (pyproject.toml's `pythonpath`), so a module imports a helper or another
test module of any folder by its bare name (`from mcp_agents import ...`). The rules
that keep this working are checked at start (`pytest_configure`): every folder is
listed there, no two modules under tests/ share a name, and no folder is named like an
installed package.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest
from click.testing import CliRunner

from ledger import (
    Acked,
    BlobStored,
    Ledger,
    ManifestEntry,
    ManifestPublished,
    Planned,
    RecordedEvent,
)
from ledger.testing.pgserver import INSTALL_HINT, PgServer, find_bindir

START_NS = 1_700_000_000_000_000_000


class FakeClock:
    """A callable returning strictly increasing Unix nanoseconds.

    Each call moves time forward by `step_ns`; `advance(seconds)` jumps ahead.
    `calls` counts the reads, `last` is the value returned most recently.
    """

    def __init__(self, start_ns: int = START_NS, step_ns: int = 1_000) -> None:
        self.now = start_ns
        self.step_ns = step_ns
        self.calls = 0
        self.last: int | None = None

    def __call__(self) -> int:
        self.now += self.step_ns
        self.calls += 1
        self.last = self.now
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self.now += int(seconds * 1_000_000_000)


#: The environment every in-process CLI call runs with: none of the user's defaults.
CLEAN_ENV: dict[str, str | None] = {
    "STEPTRAIL_LEDGER": None, "STEPTRAIL_WORKSPACE": None, "STEPTRAIL_EPOCH": None,
    "STEPTRAIL_WITNESS": None}


@dataclass
class CliOut:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def run_cli(argv: list[str], *, input: str | bytes | None = None,
            env: dict[str, str] | None = None) -> CliOut:
    """`steptrail ARGV` in-process, checked for the rules of the command line: no
    traceback, one-line errors, no result on a usage or environment failure (exit 2, 3)."""
    from ledger.cli import cli

    result = CliRunner().invoke(cli, argv, input=input, env={**CLEAN_ENV, **(env or {})},
                                catch_exceptions=False)
    out = CliOut(result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in out.out + out.err, out
    if out.err.startswith("steptrail: error:"):
        assert out.err.count("\n") == 1, out.err  # one line
    if out.code in (2, 3):
        problem = error_output_problem(out.code, out.out, out.err)
        assert problem is None, (problem, out)
    return out


def error_output_problem(code: int, stdout: str, stderr: str) -> str | None:
    """What breaks the rule for an error's output (None: it holds): stdout is empty, or
    (under --json) exactly one error object `{"ok": false, "error": {"type", "message",
    "exit_code", ...}}` whose type and exit code are the ones on stderr and the exit."""
    if not stdout:
        return None
    try:
        doc = json.loads(stdout)
    except ValueError:
        return f"exit {code} printed a result that is not an error object: {stdout[:200]!r}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or doc.get("ok") is not False or stdout.count("\n") != 1:
        return f"exit {code} printed something else than one error object: {stdout[:200]!r}"
    if error.get("exit_code") != code or not isinstance(error.get("message"), str):
        return f"the error object's exit_code/message are wrong: {error!r}"
    if not stderr.startswith(f"steptrail: error: {error.get('type')}: "):
        return f"stderr does not name the error object's type {error.get('type')!r}: {stderr!r}"
    return None


def digest_of(data: bytes | str) -> str:
    """sha256 hex of `data` (a str is UTF-8 encoded): a valid blob digest."""
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def commit_events(
    step_id: str,
    *,
    ledger: Ledger | None = None,
    attempt: int = 1,
    content: bytes | None = None,
    manifest_rev: int = 0,
    expected_rev: int = -1,
    supersedes: str | None = None,
    run: str = "",
    workspace: str = "",
    epoch: int = 0,
) -> list:
    """Planned -> BlobStored -> ManifestPublished -> Acked for one attempt of a step.

    With `ledger`, the artifact's bytes are put into its blob store first: the append
    guard refuses a blob-stored or manifest-published naming a blob that is not durable.
    """
    content = content if content is not None else f"artifact of {step_id}".encode()
    blob = digest_of(content)
    if ledger is not None:
        ledger.blobs.put(content, blob)
    common = dict(step=step_id, attempt=attempt, run=run, workspace=workspace, epoch=epoch)
    entry = ManifestEntry(path=f"out/{attempt}.txt", digest=blob, size=len(content))
    manifest = digest_of(b"manifest:" + step_id.encode() + b":" + blob.encode()
                         + b":" + str(manifest_rev).encode())
    return [
        Planned(**common, artifacts=(entry.path,)),
        BlobStored(**common, digest=blob, size=len(content), path=entry.path, inline=False),
        ManifestPublished(**common, manifest_rev=manifest_rev, expected_rev=expected_rev,
                          digest=manifest, supersedes=supersedes, artifacts=(entry,)),
        Acked(**common, manifest_rev=manifest_rev),
    ]


def commit_step(ledger: Ledger, step_id: str, **kwargs) -> list[RecordedEvent]:
    """Store the artifact, then append a whole committed attempt of `step_id`, one event
    per transaction."""
    return [ledger.append(e) for e in commit_events(step_id, ledger=ledger, **kwargs)]


def snapshot_dir(directory: Path) -> dict[str, bytes | None]:
    """Every entry of a directory with its bytes (None for a subdirectory)."""
    out: dict[str, bytes | None] = {}
    for name in sorted(os.listdir(directory)):
        p = directory / name
        out[name] = None if p.is_dir() else p.read_bytes()
    return out


def lock_files_aside(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without SQLite's lock files: a ``-shm`` (the WAL index, no data) and an
    empty ``-wal``. A read-only open of an accepted ledger reads with SQLite's locks,
    which creates those two; it must create nothing else (a refused file not even them)."""
    out = {}
    for name, value in snap.items():
        data = value[0] if isinstance(value, tuple) else value
        if name.endswith("-shm") or (name.endswith("-wal") and data == b""):
            continue
        out[name] = value
    return out


def raw_connection(path: Path | str) -> apsw.Connection:
    """A plain apsw connection, as an attacker or another tool would open the file."""
    return apsw.Connection(os.fspath(path))


def tamper(path: Path | str, statements: Iterable[tuple[str, tuple]] | Callable) -> None:
    """Edit `events` behind the ledger's back and leave a file that still opens.

    Drops the append-only triggers, runs `statements` (or calls it with the connection),
    and recreates the triggers with their exact original SQL, so the schema allow-list
    accepts the file and only `verify` can notice.
    """
    conn = raw_connection(path)
    try:
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' ORDER BY name"
        ).fetchall()
        assert {"events_no_update", "events_no_delete"} <= {n for n, _ in triggers}
        with conn:
            for name, _ in triggers:
                conn.execute(f"DROP TRIGGER {name}")
            if callable(statements):
                statements(conn)
            else:
                for sql, params in statements:
                    conn.execute(sql, params)
            for _, sql in triggers:
                conn.execute(sql)
    finally:
        conn.close()


def copy_ledger(src: Path | str, dst: Path | str) -> Path:
    """Copy a closed ledger file (it has no -wal once every connection closed) and, when
    the copy lands in another directory, its blob store beside it."""
    assert not os.path.exists(os.fspath(src) + "-wal"), "close the ledger before copying it"
    shutil.copyfile(src, dst)
    blobs, dst_blobs = Path(src).parent / "blobs", Path(dst).parent / "blobs"
    if blobs.is_dir() and not dst_blobs.exists():
        shutil.copytree(blobs, dst_blobs, symlinks=True)
    return Path(dst)


def damage_witness(witness: Path | str, how: str) -> None:
    """Take a witness away the ways an attacker hiding a rollback would: ``deleted``,
    ``empty``, ``zeros`` (zero-filled, its length kept), or ``unreadable`` (a directory
    where the file was)."""
    path = os.fspath(witness)
    if how == "deleted":
        os.unlink(path)
    elif how == "empty":
        with open(path, "wb"):
            pass
    elif how == "zeros":
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(bytes(size))
    elif how == "unreadable":
        os.unlink(path)
        os.mkdir(path)
    else:
        raise ValueError(f"unknown witness damage {how!r}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def make_clock() -> type[FakeClock]:
    """The FakeClock class, for tests (hypothesis) that need a fresh clock per example."""
    return FakeClock


@pytest.fixture(scope="session")
def digest() -> Callable[[bytes | str], str]:
    """`digest(b"...")`: the sha256 hex digest of some bytes."""
    return digest_of


@pytest.fixture(scope="session", name="commit_step")
def commit_step_fixture() -> Callable[..., list[RecordedEvent]]:
    """`commit_step(ledger, step_id, ...)`: Planned -> BlobStored -> ManifestPublished -> Acked."""
    return commit_step


@pytest.fixture(scope="session", name="commit_events")
def commit_events_fixture() -> Callable[..., list]:
    """`commit_events(step_id, ...)`: the four events of `commit_step`, not appended."""
    return commit_events


@pytest.fixture(scope="session", name="tamper")
def tamper_fixture() -> Callable[..., None]:
    return tamper


@pytest.fixture(scope="session", name="snapshot_dir")
def snapshot_dir_fixture() -> Callable[[Path], dict[str, bytes | None]]:
    return snapshot_dir


@pytest.fixture(scope="session", name="copy_ledger")
def copy_ledger_fixture() -> Callable[..., Path]:
    return copy_ledger


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``BOTH_STORES = True`` runs each of its tests that asks where its
    ledgers are — `ledger_at`, `ledger_location`, `ledger`, or a fixture built on them —
    once per store: SQLite and PostgreSQL (ids ``[sqlite]``, ``[postgres]``). A test marked
    ``sqlite_only`` (it reads the SQLite file itself, or a child process opens it) runs on
    SQLite only. The module's other tests run once, as in any module."""
    if getattr(metafunc.module, "BOTH_STORES", False) and "ledger_at" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("store_kind", ["sqlite"] if only else ["sqlite", "postgres"],
                             indirect=True)


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """Which store the test's ledgers are in: SQLite unless parametrized."""
    return getattr(request, "param", "sqlite")


#: The `ledger_at` fixture's type: a ledger's path -> its location on the test's store.
LedgerAt = Callable[[Path | str], Path | str]


def sqlite_at(path: Path | str) -> Path | str:
    """`ledger_at` on SQLite: a ledger's location is its path, as given."""
    return path


@pytest.fixture
def ledger_at(store_kind: str, request: pytest.FixtureRequest) -> Iterator[LedgerAt]:
    """`ledger_at(path)`: the location to give `Ledger.init` / `Ledger.open` (or the command
    line's ``--ledger``) for the ledger the test keeps at `path`. On SQLite the path itself,
    as given (`sqlite_at`); on PostgreSQL (`store_kind`) a database of its own on the
    session's server, made the first time the path is named (the same path, the same
    database) and dropped after the test. A child process is given the location too. Files
    beside a ledger (blob files, -wal) exist on SQLite only: tests of them are
    ``sqlite_only``."""
    if store_kind != "postgres":
        yield sqlite_at
        return
    server = request.getfixturevalue("pg_server")
    if not server.running:  # an earlier test stopped or killed it
        server.restart()
    made: dict[str, tuple[str, str]] = {}  # path -> (database name, URL)

    def at(path: Path | str) -> Path | str:
        key = os.path.abspath(os.fspath(path))
        if key not in made:
            name = _database_name(request)
            made[key] = (name, server.create_database(name))
        return made[key][1]

    try:
        yield at
    finally:
        for name, _ in made.values():
            with contextlib.suppress(Exception):  # a test that killed the server, say
                server.drop_database(name)


@pytest.fixture
def ledger_location(ledger_at: LedgerAt, ledger_path: Path) -> str:
    """Where the test's ledger is: a SQLite file, or a fresh PostgreSQL database's URL."""
    return os.fspath(ledger_at(ledger_path))


@pytest.fixture
def ledger(ledger_location: str, clock: FakeClock) -> Iterator[Ledger]:
    led = Ledger.init(ledger_location, clock=clock)
    assert led.created
    try:
        yield led
    finally:
        led.close()


@pytest.fixture(scope="module")
def scratch(request: pytest.FixtureRequest) -> Iterator[str]:
    """A directory for one module's fault-harness runs, on the harness's scratch root
    (/dev/shm where writable), removed afterwards."""
    from ledger.testing.faults import scratch_root

    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    d = tempfile.mkdtemp(prefix=f"{name}-", dir=scratch_root())
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- PostgreSQL: one throwaway server per session, a fresh database per test ---------------

#: Set when a test needing PostgreSQL was skipped because it is not installed.
_PG_SKIPPED: list[str] = []
_pg_db_numbers = itertools.count(1)


def _database_name(request: pytest.FixtureRequest) -> str:
    """A fresh database name on the session's server, after the test's name."""
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    return f"t{next(_pg_db_numbers)}_{slug}"[:63]


@pytest.fixture(scope="session")
def pg_bindir() -> str:
    """The PostgreSQL server binaries' directory. Without them the test is skipped with
    the install hint, or fails when STEPTRAIL_REQUIRE_PG=1 (CI)."""
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("STEPTRAIL_REQUIRE_PG") == "1":
            pytest.fail(f"STEPTRAIL_REQUIRE_PG=1: {INSTALL_HINT}", pytrace=False)
        _PG_SKIPPED.append(INSTALL_HINT)
        pytest.skip(INSTALL_HINT)
    return bindir


@pytest.fixture(scope="session")
def pg_server(pg_bindir: str) -> Iterator[PgServer]:
    """One `ledger.testing.pgserver.PgServer` for the session, also on 127.0.0.1 (so a
    proxy can sit in front of it), closed at the end."""
    server = PgServer.start(tcp=True)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a fresh database on the session's server, dropped after the test."""
    name = _database_name(request)
    if not pg_server.running:  # an earlier test stopped or killed it
        pg_server.restart()
    url = pg_server.create_database(name)
    try:
        yield url
    finally:
        try:
            pg_server.drop_database(name)
        except Exception:  # noqa: BLE001 - a test that killed the server, say
            pass


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _PG_SKIPPED:
        terminalreporter.write_line(f"PostgreSQL tests skipped: {_PG_SKIPPED[0]}")


def pytest_configure(config: pytest.Config) -> None:
    """The layout's rules: every folder of tests/ is on sys.path (pyproject.toml's
    `pythonpath`); every module name under tests/ is unique (each is imported by its bare
    name: two of one name would be one module to Python and a mismatch to pytest); and no
    folder is named like an installed package (it would import as that package where the
    package is missing)."""
    here = Path(__file__).resolve().parent
    modules = [*here.glob("*.py"), *here.glob("*/*.py")]
    listed = {Path(p).resolve() for p in config.getini("pythonpath")}
    folders = {m.parent for m in modules}
    unlisted = sorted(str(d.relative_to(here.parent)) for d in folders - listed)
    if unlisted:
        raise pytest.UsageError(f"add {', '.join(unlisted)} to pythonpath in pyproject.toml"
                                " ([tool.pytest.ini_options]): a test folder not on sys.path")
    twice = sorted(name for name, n in Counter(m.name for m in modules).items() if n > 1)
    if twice:
        raise pytest.UsageError(f"two modules under tests/ named {', '.join(twice)}: module"
                                " names are imported bare (docs/testing.md \"The layout\")")
    # a folder named like a package (tests/mcp) is importable as one, a namespace package,
    # wherever that package is not installed: `import mcp` then succeeds in a venv
    # without the extra, and a test that skips without it runs and fails
    installed = importlib.metadata.packages_distributions()
    shadowing = sorted(d.name for d in folders if d != here and d.name in installed)
    if shadowing:
        raise pytest.UsageError(f"tests/{', tests/'.join(shadowing)} is named like an installed"
                                " package: rename the folder (it would import as that package"
                                " where the package is missing)")

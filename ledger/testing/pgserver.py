"""A throwaway PostgreSQL server for the tests, the benchmarks and the demo.

`PgServer.start()` runs ``initdb`` into a fresh temporary directory, starts the server
with ``pg_ctl`` on a private unix socket directory (and, with ``tcp=True``, on
127.0.0.1 with a free port), and `close()` stops it and removes the directory (also at
interpreter exit, so an aborted test run leaves no server behind)::

    with PgServer.start() as pg:
        url = pg.create_database("t1")   # postgresql://steptrail@/t1?host=...&port=...
        ...
        pg.kill()                        # a crash (pg_ctl stop -m immediate) ...
        pg.restart()                     # ... recovered on the next start

The server is a durable one (fsync and synchronous_commit on), so a kill loses nothing
committed. Authentication is ``trust`` for the one role ``steptrail``: nothing but the
socket directory's permissions (0700) and 127.0.0.1 guard it.

``initdb`` and ``pg_ctl`` refuse to run as root. As root the server runs as the
``postgres`` system user (the one the Debian/Ubuntu package creates), which owns the
temporary directory; root still reaches the socket.

A command line keeps a server whose data persists in a directory (for a user's demo)::

    export STEPTRAIL_LEDGER=$(python -m ledger.testing.pgserver start /tmp/pg)
    python -m ledger.testing.pgserver stop /tmp/pg

The module needs only the standard library to import (and to run ``bindir``, ``stop``);
psycopg is imported inside the functions that connect.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: The one role of the cluster (initdb -U), and the database the command line creates.
USER = "steptrail"
#: How to get the server binaries when `find_bindir` finds none.
INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them"
                " (Debian/Ubuntu: apt-get install postgresql) or set STEPTRAIL_PG_BINDIR to"
                " the directory holding them")
#: The system user the server runs as when we are root (initdb refuses root).
RUN_AS_USER = "postgres"
#: The file in a command-line DIR that records its server (port, socket directory).
MARKER = "pgserver.json"

_BINARIES = ("initdb", "pg_ctl", "postgres")
#: A unix socket path must fit sockaddr_un.sun_path (108 bytes on Linux, NUL included).
_SUN_PATH_MAX = 107
_SETTING_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")
_START_TIMEOUT = 60


class PgServerError(RuntimeError):
    """The server could not be set up, started or stopped. `message` is one line;
    `log_tail` (when there is one) the last lines of the server's log, and str() shows
    both."""

    def __init__(self, message: str, log_tail: str | None = None) -> None:
        self.message = message
        self.log_tail = log_tail
        super().__init__(message if not log_tail else f"{message}\n--- server log (tail) ---\n"
                         f"{log_tail}")


# --- finding the binaries -----------------------------------------------------------------


def _has_binaries(bindir: str | os.PathLike[str]) -> bool:
    return all(os.access(os.path.join(bindir, b), os.X_OK) for b in _BINARIES)


def _version_key(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in path.parent.name.split("."))
    except ValueError:
        return (-1,)


def find_bindir() -> str | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None.

    In order: ``$STEPTRAIL_PG_BINDIR`` (an error if it is set but lacks them: a wrong
    setting should not silently fall back), the newest ``/usr/lib/postgresql/*/bin``
    (Debian/Ubuntu), ``pg_config --bindir`` when pg_config is on PATH, and last the
    directory of an ``initdb`` on PATH."""
    env = os.environ.get("STEPTRAIL_PG_BINDIR")
    if env:
        if not _has_binaries(env):
            raise PgServerError(f"STEPTRAIL_PG_BINDIR={env} does not hold executable"
                                f" {', '.join(_BINARIES)}")
        return os.path.abspath(env)
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    for d in debian:
        if _has_binaries(d):
            return str(d)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_binaries(out):
            return out
    initdb = shutil.which("initdb")
    if initdb:
        d = os.path.dirname(os.path.realpath(initdb))
        if _has_binaries(d):
            return d
    return None


# --- helpers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _tail(path: Path, lines: int = 20) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


def _clean_env() -> dict[str, str]:
    """Our environment without the PG* variables a user's shell may set (PGDATA, PGPORT,
    PGHOST...: pg_ctl and libpq would read them), messages in English."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) of the user to run the server binaries as: None unless we are root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pw = pwd.getpwnam(RUN_AS_USER)
    except KeyError:
        raise PgServerError(
            f"running as root, and initdb/pg_ctl refuse root: the server runs as the"
            f" '{RUN_AS_USER}' system user, which does not exist; install the PostgreSQL"
            f" package (Debian/Ubuntu: apt-get install postgresql, which creates it), create"
            f" it (useradd --system {RUN_AS_USER}), or run as an unprivileged user") from None
    return pw.pw_uid, pw.pw_gid


def _check_reachable(path: Path, uid: int) -> None:
    """As root: every directory above `path` must let the server's user through."""
    for parent in path.parents:
        st = parent.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            raise PgServerError(
                f"{parent} is not searchable by the '{RUN_AS_USER}' user the server runs as"
                f" (mode {st.st_mode & 0o777:o}): put the server's directory elsewhere"
                f" (e.g. under {tempfile.gettempdir()})")


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def _connect(url: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=10,
                           application_name="steptrail-pgserver", **kwargs)


# --- the server ---------------------------------------------------------------------------


class PgServer:
    """One PostgreSQL cluster in a directory of its own: ``data/`` (the cluster),
    ``sock/`` (the unix socket, mode 0700) and ``server.log``.

    `start` makes a throwaway one (removed by `close`); `in_dir` one whose directory
    persists (the command line's)."""

    def __init__(self, root: Path, *, port: int, tcp: bool, socket_dir: Path,
                 bindir: str, owned: bool) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.log_path = root / "server.log"
        self._socket_dir = socket_dir
        self._port = port
        self.tcp = tcp
        self.bindir = bindir
        self._owned = owned
        self._run_as = _run_as()
        self._closed = False
        self._pid = os.getpid()

    # --- making one

    @classmethod
    def start(cls, base_dir: str | None = None, *, tcp: bool = False,
              settings: dict[str, Any] | None = None) -> PgServer:
        """A fresh cluster in a new temporary directory under `base_dir` (default: the
        system's temporary directory), started; `close()` (or interpreter exit) stops it
        and removes the directory. `settings` add to or override postgresql.conf's."""
        bindir = find_bindir()
        if bindir is None:
            raise PgServerError(INSTALL_HINT)
        run_as = _run_as()  # before making anything: a root without 'postgres' fails here
        root = Path(tempfile.mkdtemp(prefix="steptrail-pg-", dir=base_dir)).resolve()
        server = cls(root, port=_free_port(), tcp=tcp, socket_dir=root / "sock", bindir=bindir,
                     owned=True)
        atexit.register(server._close_at_exit)
        try:
            if run_as:
                _check_reachable(root, run_as[0])
            server._init_cluster(settings, no_sync=True)
            for attempt in range(3):
                try:
                    server._pg_ctl_start()
                    break
                except PgServerError as e:
                    # Another process took the free port between our probe and the bind.
                    if not tcp or attempt == 2 or "already in use" not in (e.log_tail or ""):
                        raise
                    server._port = _free_port()
                    server._write_conf({"port": server._port})
        except BaseException:
            server.close()
            raise
        return server

    @classmethod
    def in_dir(cls, path: str | os.PathLike[str], *, tcp: bool = False,
               settings: dict[str, Any] | None = None) -> PgServer:
        """The server whose data persists in `path`, started: made there on the first call
        (`path` absent or empty), started again (if stopped) on later ones. Its port and
        socket directory are recorded in ``path/pgserver.json``; `close()` stops it and
        leaves the directory."""
        root = Path(path).absolute()
        marker = root / MARKER
        bindir = find_bindir()
        if bindir is None:
            raise PgServerError(INSTALL_HINT)
        run_as = _run_as()
        if marker.exists():
            info = cls._read_marker(root)
            if bool(info["tcp"]) != tcp:
                was = "with" if info["tcp"] else "without"
                raise PgServerError(f"{root} holds a server made {was} --tcp: stop it and"
                                    " remove the directory to change that")
            server = cls(root, port=info["port"], tcp=tcp, socket_dir=Path(info["socket_dir"]),
                         bindir=bindir, owned=False)
            if not server.data_dir.is_dir():
                raise PgServerError(f"{root} has a {MARKER} but no data/ directory")
            if not server.running:
                server._pg_ctl_start()
            return server
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise PgServerError(f"{root} exists and is not an empty directory nor a pgserver"
                                f" directory (no {MARKER})")
        root.mkdir(parents=True, exist_ok=True)
        server = cls(root, port=_free_port(), tcp=tcp, socket_dir=root / "sock", bindir=bindir,
                     owned=False)
        if run_as:
            _check_reachable(root, run_as[0])
        try:
            server._init_cluster(settings, no_sync=False)
        except BaseException:
            shutil.rmtree(root / "data", ignore_errors=True)
            shutil.rmtree(root / "sock", ignore_errors=True)
            raise
        tmp = root / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"port": server._port, "socket_dir": str(server._socket_dir),
                                   "tcp": tcp, "data_dir": str(server.data_dir)}) + "\n")
        os.replace(tmp, marker)
        server._pg_ctl_start()
        return server

    @staticmethod
    def _read_marker(root: Path) -> dict[str, Any]:
        try:
            info = json.loads((root / MARKER).read_text())
            if not (isinstance(info, dict) and isinstance(info.get("port"), int)
                    and isinstance(info.get("socket_dir"), str)):
                raise ValueError("missing port or socket_dir")
        except (OSError, ValueError) as e:
            raise PgServerError(f"{root / MARKER} is unreadable: {e}") from None
        info.setdefault("tcp", False)
        return info

    def _init_cluster(self, settings: dict[str, Any] | None, *, no_sync: bool) -> None:
        sock = self._socket_dir
        if len(os.fsencode(sock / f".s.PGSQL.{self._port}.lock")) > _SUN_PATH_MAX:
            raise PgServerError(f"the socket directory {sock} is too long for a unix socket"
                                f" path ({_SUN_PATH_MAX} bytes): use a shorter base directory")
        sock.mkdir(mode=0o700)
        os.chmod(sock, 0o700)
        if self._run_as:
            _chown_tree(self.root, *self._run_as)
        # --no-sync for a throwaway cluster only: it skips initdb's final fsync of the
        # fresh files (a second saved per start); the running server syncs as usual.
        args = [self._bin("initdb"), "-D", str(self.data_dir), "--auth=trust", "-U", USER,
                "--encoding=UTF8", "--locale=C", *(["--no-sync"] if no_sync else [])]
        done = self._run(args, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise PgServerError(f"initdb failed (exit {done.returncode}): " + " | ".join(said))
        conf: dict[str, Any] = {
            "listen_addresses": "127.0.0.1" if self.tcp else "",
            "port": self._port,
            "unix_socket_directories": str(sock),
            # Both are PostgreSQL's defaults, written out because the tests and benchmarks
            # measure a durable server: a commit is on disk when it returns.
            "fsync": True,
            "synchronous_commit": True,
            "max_connections": 300,
            "shared_buffers": "128MB",
            # Quiet: warnings and worse, to server.log (pg_ctl -l), no checkpoint chatter.
            "log_destination": "stderr",
            "logging_collector": False,
            "log_min_messages": "warning",
            "log_checkpoints": False,
            "log_connections": False,
            "log_disconnections": False,
            "log_line_prefix": "%m [%p] ",
            **(settings or {}),
        }
        self._write_conf(conf)

    def _write_conf(self, conf: dict[str, Any]) -> None:
        """Append settings to postgresql.conf (a later line overrides an earlier one)."""
        lines = ["", "# steptrail pgserver"]
        for name, value in conf.items():
            if not _SETTING_NAME.match(name):
                raise PgServerError(f"not a setting name: {name!r}")
            lines.append(f"{name} = {_conf_value(value)}")
        path = self.data_dir / "postgresql.conf"
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    # --- running the binaries

    def _bin(self, name: str) -> str:
        return os.path.join(self.bindir, name)

    def _run(self, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._run_as:
            uid, gid = self._run_as
            kwargs = {"user": uid, "group": gid, "extra_groups": []}
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                                  cwd=self.root, env=_clean_env(), check=False, **kwargs)
        except subprocess.TimeoutExpired:
            raise PgServerError(f"{os.path.basename(args[0])} did not finish in {timeout} s",
                                _tail(self.log_path)) from None
        except OSError as e:
            raise PgServerError(f"cannot run {args[0]}: {e}") from None

    def _pg_ctl_start(self) -> None:
        done = self._run([self._bin("pg_ctl"), "start", "-w", "-t", str(_START_TIMEOUT),
                          "-D", str(self.data_dir), "-l", str(self.log_path)],
                         timeout=_START_TIMEOUT + 10)
        if done.returncode != 0:
            raise PgServerError(
                f"the PostgreSQL server in {self.data_dir} did not start (pg_ctl exit"
                f" {done.returncode}; log: {self.log_path})", _tail(self.log_path))
        self._wait_accepting()

    def _wait_accepting(self, timeout: float = 30) -> None:
        """Until a connection succeeds (pg_ctl -w already waited for "ready")."""
        try:
            import psycopg
        except ImportError:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                _connect(self.url()).close()
                return
            except psycopg.OperationalError as e:
                if time.monotonic() > deadline:
                    raise PgServerError(f"the server does not accept connections: {e}",
                                        _tail(self.log_path)) from None
                time.sleep(0.05)

    def _pg_ctl_stop(self, mode: str) -> None:
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown stop mode {mode!r}")
        if not self.running:
            return
        done = self._run([self._bin("pg_ctl"), "stop", "-w", "-t", str(_START_TIMEOUT),
                          "-m", mode, "-D", str(self.data_dir)], timeout=_START_TIMEOUT + 10)
        if done.returncode != 0 and self.running:
            raise PgServerError(f"pg_ctl stop -m {mode} failed (exit {done.returncode}): "
                                + " | ".join(done.stderr.strip().splitlines()[-3:]),
                                _tail(self.log_path))

    # --- the public surface

    @property
    def host(self) -> str:
        """The unix socket directory (libpq's ``host`` for a socket)."""
        return str(self._socket_dir)

    @property
    def port(self) -> int:
        return self._port

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL of `dbname` as the ``steptrail`` role: over the unix socket, or over
        127.0.0.1 for a server started with ``tcp=True``."""
        db = quote(dbname, safe="")
        if self.tcp:
            return f"postgresql://{USER}@127.0.0.1:{self._port}/{db}"
        return f"postgresql://{USER}@/{db}?host={quote(self.host, safe='')}&port={self._port}"

    @property
    def running(self) -> bool:
        """Whether the postmaster of this data directory is alive."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (from template0) and return its URL."""
        from psycopg import sql

        with _connect(self.url()) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(
                sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE `name` if it exists, ending its sessions first (WITH FORCE)."""
        from psycopg import sql

        with _connect(self.url()) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    def terminate_backends(self, dbname: str, *, application_name: str | None = None) -> int:
        """pg_terminate_backend every other session on `dbname` (only those with
        `application_name`, when given), waiting up to 5 s for each to end; returns how
        many ended."""
        with _connect(self.url()) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = %(db)s AND pid <> pg_backend_pid()"
                " AND (%(app)s::text IS NULL OR application_name = %(app)s::text)",
                {"db": dbname, "app": application_name}).fetchall()
        return sum(1 for (ended,) in rows if ended)

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop -m `mode` (smart, fast, immediate); nothing if it is not running."""
        self._pg_ctl_stop(mode)

    def kill(self) -> None:
        """A crash: pg_ctl stop -m immediate (no shutdown checkpoint; the next start runs
        crash recovery, and nothing committed is lost)."""
        self._pg_ctl_stop("immediate")

    def restart(self) -> None:
        """Start again on the same data directory and port (after `stop` or `kill`; a running
        server is stopped first), and wait until it accepts connections."""
        if self._closed:
            raise PgServerError("the server was closed")
        if self.running:
            self.stop()
        self._pg_ctl_start()

    def close(self) -> None:
        """Stop the server if it runs and, for a throwaway one, remove its directory.
        Idempotent; also run at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        try:
            self.stop("fast")
        except PgServerError:
            try:
                self.stop("immediate")
            except PgServerError:
                pass
        finally:
            if self._owned:
                shutil.rmtree(self.root, ignore_errors=True)

    def _close_at_exit(self) -> None:
        # Not in a forked child that exits normally: the server is its parent's.
        if os.getpid() == self._pid:
            self.close()

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self.running else "stopped"
        return f"<PgServer {self.root} port={self._port} {state}>"


# --- the command line ---------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 1 (argparse: usage + exit 2)
        print(f"pgserver: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(1)


_DESCRIPTION = """\
A PostgreSQL server whose data lives in DIR, for trying steptrail on PostgreSQL.

  start DIR [--tcp]  make a cluster in DIR (absent or empty) and start it, or start the one
                     already there; create the database 'steptrail' and print its URL
                     (one line), e.g.
                       export STEPTRAIL_LEDGER=$(python -m ledger.testing.pgserver start /tmp/pg)
                     The server listens on a unix socket in DIR/sock only, or also on
                     127.0.0.1 (a free port) with --tcp; its role 'steptrail' needs no
                     password. DIR/pgserver.json records the port and socket directory;
                     DIR/server.log is the server's log.
  stop DIR           stop it (the data stays; start DIR again later, or rm -r DIR)
  bindir             print the directory of initdb/pg_ctl/postgres found (exit 1: none)

Errors are one line on stderr, exit status 1."""


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m ledger.testing.pgserver", description=_DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{start,stop,bindir}")
    start = sub.add_parser("start", help="start the server in DIR, print its database's URL")
    start.add_argument("dir", metavar="DIR")
    start.add_argument("--tcp", action="store_true", help="also listen on 127.0.0.1")
    stop = sub.add_parser("stop", help="stop the server in DIR")
    stop.add_argument("dir", metavar="DIR")
    sub.add_parser("bindir", help="print the PostgreSQL binaries' directory")
    args = parser.parse_args(argv)
    try:
        if args.command == "bindir":
            bindir = find_bindir()
            if bindir is None:
                raise PgServerError(INSTALL_HINT)
            print(bindir)
        elif args.command == "start":
            try:
                import psycopg
            except ImportError:
                raise PgServerError("psycopg is not installed (pip install 'psycopg[binary]')"
                                    ) from None
            server = PgServer.in_dir(args.dir, tcp=args.tcp)
            with _connect(server.url()) as conn:
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                      (USER,)).fetchone()
            if not exists:
                try:
                    server.create_database(USER)
                except psycopg.errors.DuplicateDatabase:
                    pass
            print(server.url(USER))
        else:
            root = Path(args.dir).absolute()
            if not (root / MARKER).exists():
                raise PgServerError(f"{root} is not a pgserver directory (no {MARKER})")
            info = PgServer._read_marker(root)
            bindir = find_bindir()
            if bindir is None:
                raise PgServerError(INSTALL_HINT)
            PgServer(root, port=info["port"], tcp=bool(info["tcp"]),
                     socket_dir=Path(info["socket_dir"]), bindir=bindir, owned=False).stop()
    except PgServerError as e:
        print(f"pgserver: error: {e.message}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the command line's contract: no traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"pgserver: error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

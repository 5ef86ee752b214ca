"""What every file tool shares (`ToolContext`): the ledger and its locks, the leases, the
limits, the served workspaces; a path argument resolved to (workspace, path), a
failure made one line, a file read within the limits."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ledger import Ledger, LedgerError

from .edits import EditRefused
from ..workspace import FsRefused, is_ledger_dir_name
from ..errors import said_at_a_shell
from .leases import TURN_S, LeaseBusy, Leases, holder_name

from .values import Limits, Result, Seen, ToolFailure, Workspace, log, one_line


class ToolContext:
    """What every tool shares: the ledger, its locks and leases, the limits, the served
    workspaces, and how a path argument becomes a (workspace, path) and a failure one line."""

    def __init__(self, ledger: Ledger, workspaces: Sequence[str], *,
                 lease_ttl_s: float = 20.0, lease_wait_s: float = 30.0,
                 lease_linger_s: float = 0.2, lease_turn_s: float = TURN_S,
                 observe_on_lease: bool = False,
                 limits: Limits | None = None, holder: str | None = None,
                 given_roots: dict[str, str] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        if not workspaces:
            raise ToolFailure("serve at least one workspace")
        self.ledger = ledger
        #: around every ledger call (reads too: they never wait for a lease)
        self.lock = threading.RLock()
        #: one change at a time per server: held across a write's lease wait and its step
        self.write_lock = threading.RLock()
        self.limits = limits or Limits()
        self.notices: deque[str] = deque(maxlen=50)
        #: hears each of `STAGES` a write reaches (after-exchange: through the ledger's
        #: `on_op`, see `exchange_hook`)
        self.on_stage = on_stage
        self.leases = Leases(ledger, self.lock, self.notices, holder=holder or holder_name(),
                             write_lock=self.write_lock,
                             ttl_s=lease_ttl_s, wait_s=lease_wait_s, linger_s=lease_linger_s,
                             turn_s=lease_turn_s, observe=observe_on_lease)
        self.holder = self.leases.holder
        self.lease_ttl_s = lease_ttl_s
        self.workspaces: list[Workspace] = []
        for name in workspaces:
            reg = ledger.workspaces.registration(name)
            prefixes = {reg.root}
            given = (given_roots or {}).get(name)
            if given:
                prefixes.add(os.path.normpath(os.path.abspath(given)))
            self.workspaces.append(Workspace(
                name, reg.root, tuple(sorted(prefixes, key=len, reverse=True)), reg.allow_git,
                ledger.workspaces.confined(name)))
        self.default = self.workspaces[0]
        self.leases.workspaces = [w.name for w in self.workspaces]

    # -- plumbing -----------------------------------------------------------------------

    def reached(self, stage: str) -> None:
        """Tell the `on_stage` hook, if any, that a write reached `stage`."""
        if self.on_stage is not None:
            self.on_stage(stage)

    def resolve(self, arg: object, *, directory: bool = False, what: str = "path"
                ) -> tuple[Workspace, str]:
        """(workspace, path relative to its root) for a path argument: relative to the
        first workspace, or absolute inside any workspace's root. `..` is refused, never
        normalized away; '.' components and a trailing '/' are dropped."""
        if not isinstance(arg, str):
            raise ToolFailure(f"{what} must be a string, not {type(arg).__name__}")
        if "\x00" in arg:
            raise ToolFailure(f"{what} {arg!r} contains a NUL byte")
        if arg.startswith("~"):
            raise ToolFailure(f"{what} {arg!r}: '~' is not expanded; give a path relative to the"
                              f" workspace ({self.default.root}) or an absolute one inside it")
        parts = arg.split("/")
        if ".." in parts:
            raise ToolFailure(f"{what} {arg!r} contains '..': paths may not climb out of a"
                              " directory; give a plain path inside the workspace")
        ws = self.default
        if arg.startswith("/"):
            norm = "/" + "/".join(p for p in parts if p not in ("", "."))
            for candidate in self.workspaces:
                for prefix in candidate.prefixes:
                    if norm == prefix or norm.startswith(prefix.rstrip("/") + "/"):
                        ws, rel = candidate, norm[len(prefix):].strip("/")
                        break
                else:
                    continue
                break
            else:
                allowed = ", ".join(w.root for w in self.workspaces)
                raise ToolFailure(f"{what} {arg!r} is outside every workspace served (allowed:"
                                  f" {allowed}); see list_allowed_directories")
        else:
            rel = "/".join(p for p in parts if p not in ("", "."))
        if any(is_ledger_dir_name(p) for p in rel.split("/")):
            # a ledger's directory (this server's is refused by identity further down;
            # another's — a nested project's, or one an earlier set of roots made — here)
            raise ToolFailure(f"{what} {arg!r} is or lies inside a .steptrail directory: a"
                              " ledger's files are not served; its history changes only"
                              " through steptrail")
        if not rel and not directory:
            raise ToolFailure(f"{what} {arg!r} is the workspace root, a directory; give a file"
                              " path")
        return ws, rel

    def show(self, ws: Workspace, rel: str) -> str:
        """A path as results name it: relative for the first workspace, else absolute
        (either can be passed back)."""
        if ws is self.default:
            return rel or "."
        return os.path.join(ws.root, rel) if rel else ws.root

    def fail(self, exc: BaseException) -> ToolFailure:
        if isinstance(exc, ToolFailure):
            return exc
        if isinstance(exc, LedgerError | FsRefused | EditRefused | LeaseBusy):
            return ToolFailure(one_line(said_at_a_shell(exc)))
        if isinstance(exc, OSError):
            return ToolFailure(one_line(f"{exc.strerror or exc}"
                                        + (f": {exc.filename}" if exc.filename else "")))
        log.exception("unexpected failure in a tool")
        return ToolFailure(one_line(f"internal error ({type(exc).__name__}: {exc}); the server"
                                    " is still running and nothing half-done was kept"))

    def call(self, fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
        """Run one tool; every failure is a one-line error result, never a traceback."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the boundary: one line, whatever went wrong
            failure = self.fail(exc)
            return Result([str(failure)], {"status": "error", "error": str(failure)}, True)

    def read(self, ws: Workspace, rel: str) -> Any:
        st = ws.fs.lstat(rel)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > self.limits.read_bytes:
            raise ToolFailure(f"{self.show(ws, rel)} holds {st.st_size} bytes, more than the"
                              f" {self.limits.read_bytes} one read returns; it is not read or"
                              " written through this server (get_file_info gives its hash)")
        return self.ledger.workspaces.read_file(ws.name, rel, max_bytes=self.limits.read_bytes)

    def content_of(self, seen: Seen | None) -> bytes | None:
        """The bytes a client saw: kept in its view, else the ledger's blob of that hash
        (every post-image and stored pre-image is one); None when unknown or absent."""
        if seen is None or seen.hash is None:
            return None
        if seen.content is not None:
            return seen.content
        with contextlib.suppress(LedgerError):
            return self.ledger.read_blob(seen.hash)
        return None

    @staticmethod
    def text(data: bytes, shown: str) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailure(f"{shown} is not UTF-8 text (byte {exc.start} is not valid"
                              " UTF-8): a binary file is not read as text") from None

    def close(self) -> None:
        """Release every lease this server still holds."""
        self.leases.close()


__all__ = ["ToolContext"]

"""`steptrail mcp`: the file tools of `ledger.mcp.service` as an MCP server.

Built on the official MCP SDK (2.x, ``mcp.server.mcpserver.MCPServer``). Each tool is
a thin function: its arguments, typed and described for the agent (the schema
`list_tools` shows), are handed to `FileTools`, and its `Result` becomes a
`CallToolResult` — the text an agent reads, the structured document a program reads,
`is_error` for a failure or a conflict. Every failure is one line; arguments that do
not fit the schema (a missing field, a wrong type, an unknown name) are one line too.

One server process serves one MCP client over stdio (each client spawns its own): the
client's view (what it read and wrote) is the process's. Over streamable HTTP, a view
per ``Mcp-Session-Id``; a request without one shares the server's default view.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, Self

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import ListRoots, Resolve
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp.types import (CLIENT_CAPABILITIES_META_KEY, INVALID_REQUEST, PARSE_ERROR,
                       PROTOCOL_VERSION_META_KEY, CallToolResult, ErrorData, JSONRPCError,
                       JSONRPCNotification, JSONRPCRequest, ListRootsRequest, ListRootsResult,
                       NotificationParams, TextContent, ToolAnnotations, jsonrpc_message_adapter)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.responses import Response

from ledger import InvalidInput, Ledger, LedgerError, NotALedger, __version__
from ledger.errors import said_at_a_shell

from .leases import TURN_S, open_lock_file
from ..workspace import is_git_name, is_ledger_dir_name
from .service import (ClientView, FileTools, Limits, Result, ToolFailure, exchange_hook,
                      one_line)

LOOPBACK: Final = ("127.0.0.1", "localhost", "::1")

INSTRUCTIONS: Final = """\
File tools for a workspace whose every write is a steptrail step: fenced, journaled,
undoable. Read a file (read_text_file) before you write or edit it: each read returns
the file's rev and sha256, and your next write of that path is applied only if the file
still holds what you read — if a person or another agent changed it meanwhile, you get
a conflict with a diff instead of an overwrite. Give a write a requestId (a UUID) so a
retry is answered from the ledger, never applied twice. history, undo, status and audit
show and revert what was done. Paths are relative to the first allowed directory, or
absolute inside one (list_allowed_directories)."""

# -- argument types (their descriptions are what an agent reads in list_tools) -------------

PathArg = Annotated[str, Field(description="A file path: relative to the first allowed"
                               " directory (e.g. 'src/app.py'), or absolute inside an allowed"
                               " directory. '..', '~' and symlinks are refused.")]
DirArg = Annotated[str, Field(description="A directory path: '.' for the workspace root,"
                              " relative to it, or absolute inside an allowed directory.")]
ExpectedHash = Annotated[str | None, Field(
    default=None, description="Optional: the sha256 the file must hold now (as a read"
    " returned it; 'absent' for a file that must not exist). Without it the write is fenced"
    " on what this session last read or wrote of the path; an existing file this session"
    " never read is refused until you read it.")]
RequestId = Annotated[str | None, Field(
    default=None, description="Optional but recommended: a unique id for this change (a"
    " UUID). Retrying with the same id returns the first result from the ledger instead of"
    " applying the change twice. Use a new id for a new change.")]


class Edit(BaseModel):
    """One text replacement."""

    model_config = ConfigDict(extra="forbid")
    oldText: Annotated[str, Field(description="The exact text to replace, copied from the file"
                                  " with enough surrounding lines to match exactly once.")]
    newText: Annotated[str, Field(description="The text that replaces it.")]


class FileChange(BaseModel):
    """One file of a multi-file change: exactly one of content, edits or delete."""

    model_config = ConfigDict(extra="forbid")
    path: PathArg
    content: Annotated[str | None, Field(default=None, description="The file's complete new"
                                         " content (creates or replaces it).")] = None
    edits: Annotated[list[Edit] | None, Field(default=None, description="Text replacements"
                                              " applied in order, as edit_file.")] = None
    delete: Annotated[bool, Field(default=False, description="true: delete the file.")] = False
    expectedHash: ExpectedHash = None


def _clean(value: Any) -> Any:
    """`value` with every lone surrogate (a file name that is not UTF-8, decoded with
    surrogateescape) shown as U+FFFD: the SDK cannot serialize one, and would fail the
    whole connection."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _result(r: Result) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=_clean(t)) for t in r.texts],
                          structured_content=_clean(r.data), is_error=r.is_error)


#: The argument `guard_stdin` and `RequestCap` put in place of the arguments of a tool
#: call they refuse (one too large to take), so that the call is answered with a
#: one-line tool error saying why.
REFUSED: Final = "__steptrail_refused_request__"

#: The method of the notification `guard_stdin` puts in place of a request the SDK would
#: drop without an answer; `_Answering` turns it into the JSON-RPC error it carries. The
#: per-process token keeps a client from sending one itself.
_ANSWER: Final = f"steptrail/answer-{secrets.token_hex(8)}"

_MISSING: Final = object()

#: The keys of a request's ``params._meta`` that are the protocol's envelope.
_PROTOCOL_KEYS: Final = "io.modelcontextprotocol/"

#: One JSON token after optional whitespace: a string, a structural character, or a
#: run of anything else (a number, true, false, null — or garbage, decoded later).
_TOKEN: Final = re.compile(rb'\s*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([][{}:,])|([^][{}:,"\s]+))')


def _is_id(value: Any) -> bool:
    """Whether `value` can be a request's id in MCP: a string or an integer."""
    return isinstance(value, str) or type(value) is int


def _envelope(data: bytes) -> tuple[Any, Any, Any]:
    """The ``id``, ``method`` and ``params.name`` of the JSON-RPC message in `data`
    (`_MISSING` for each not found), read token by token without building the values
    around them: for a message nested too deep, too long or too broken to parse. It
    reads until the message's object closes or something is not JSON, and never
    recurses, however deep the nesting."""
    wanted = {("id",), ("method",), ("params", "name")}
    found: dict[tuple[Any, ...], Any] = {}
    objects = bytearray()  # per open container: 1 an object, 0 an array
    keys: list[Any] = []  # per open container: its current key (None: none yet, an array)
    expect_key = False
    pos = 0
    while (m := _TOKEN.match(data, pos)) is not None:
        pos = m.end()
        text, punct, atom = m.groups()
        if punct in (b"{", b"["):
            objects.append(punct == b"{")
            keys.append(None)
            expect_key = punct == b"{"
        elif punct in (b"}", b"]"):
            if not objects:
                break
            objects.pop()
            keys.pop()
            expect_key = False
            if not objects:
                break  # the message's object is closed
        elif punct == b",":
            expect_key = bool(objects) and objects[-1] == 1
        elif punct == b":":
            expect_key = False
        elif not objects:
            break  # a message is an object
        elif expect_key and text is not None:
            keys[-1] = _decoded(text) if len(keys) <= 2 else ""
            expect_key = False
        else:
            where = tuple(keys)
            if where in wanted and where not in found:
                found[where] = _decoded(text if text is not None else atom)
                method = found.get(("method",))
                if ("id",) in found and method is not None \
                        and (method != "tools/call" or ("params", "name") in found):
                    break
    return (found.get(("id",), _MISSING), found.get(("method",), _MISSING),
            found.get(("params", "name"), _MISSING))


def _decoded(token: bytes) -> Any:
    try:
        return json.loads(token)
    except ValueError:  # an integer past Python's 4,300 digits, garbage
        return _MISSING


def _answer(request_id: Any, code: int, message: str) -> bytes:
    """The line `_Answering` turns into a JSON-RPC error for `request_id` (None when it
    cannot be given back: the spec's null id)."""
    for rid in ((_clean(request_id) if _is_id(request_id) else None), None):
        line = json.dumps({"jsonrpc": "2.0", "method": _ANSWER, "params": {
            "id": rid, "code": code, "message": one_line(message)}}).encode() + b"\n"
        try:  # an integer id the SDK's parser cannot read is answered with the null id
            jsonrpc_message_adapter.validate_json(line, by_name=False)
            return line
        except ValidationError:
            continue
    raise AssertionError("an answer with the null id always validates")


def _validation_detail(exc: ValidationError) -> str:
    """The first thing wrong with a message as a request, in one line."""
    errors = exc.errors()
    err = next((e for e in errors if e.get("loc", ())[:1] == ("JSONRPCRequest",)), errors[0])
    where = ".".join(str(x) for x in err.get("loc", ())[1:])
    what = one_line(err.get("msg", "invalid"))
    return f"{where}: {what}" if where else what


def _screen(line: bytes, envelope: dict[str, Any]) -> bytes:
    """What the SDK's stdio reader gets for one line of stdin (issue 26, item 13).

    A message the SDK takes passes, with any carriage return in it made a space: the
    SDK splits lines on a lone CR too, and in valid JSON a CR is only whitespace. A
    request it would drop without an answer becomes an `_answer`: a parse error
    (-32700: not JSON, an integer past 4,300 digits, nesting too deep to parse) or an
    invalid request (-32600: JSON, but not a request the SDK can decode — a lone
    surrogate, a missing field, an id that is neither a string nor an integer), with
    the request's id when it can be recovered, else the null id. A notification or a
    response that fails passes as is: nobody waits for an answer.

    `envelope` keeps the protocol's keys of the last request's ``params._meta`` (the
    2026-07-28 protocol wants them on every request) for `_too_large`."""
    if not line.strip():
        return line
    try:
        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        detail = _validation_detail(exc)
    else:
        meta = message.params.get("_meta") if isinstance(message, JSONRPCRequest) \
            and message.params else None
        if isinstance(meta, dict):
            envelope.clear()
            envelope.update((k, v) for k, v in meta.items() if k.startswith(_PROTOCOL_KEYS))
        # {"id": true, "method": ...} or "id": null validates as a notification (the SDK
        # ignores the extra field) and would be dropped: a request whose id is refused.
        if not isinstance(message, JSONRPCNotification) or b'"id"' not in line \
                or "id" not in (json.loads(line) or {}):
            return line.replace(b"\r", b" ")
        return _answer(None, INVALID_REQUEST, "Invalid Request: the id must be a string or"
                       " an integer; nothing was done")
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as exc:
        rid, method, _name = _envelope(line)
        reason = ("it is nested too deeply to parse" if isinstance(exc, RecursionError)
                  else str(exc).split(";")[0])
        return _answer(rid if isinstance(method, str) else None, PARSE_ERROR,
                       f"Parse error: {reason}; nothing was done")
    if isinstance(msg, dict):
        if "id" not in msg and isinstance(msg.get("method"), str):
            return line  # a notification
        if "method" not in msg and ("result" in msg or "error" in msg):
            return line  # a response to a request of the server's
    elif isinstance(msg, list):
        detail = "a batch (a JSON array) is not taken; send one request a line"
    rid = msg.get("id") if isinstance(msg, dict) else None
    return _answer(rid, INVALID_REQUEST, f"Invalid Request: {detail}; nothing was done")


def _too_large(prefix: bytes, cap: int, envelope: dict[str, Any]
               ) -> tuple[bytes | None, Any, str]:
    """A request of more than `cap` bytes, of which `prefix` was kept, refused on either
    transport: a tool call whose id and tool name come before the bulk (as every SDK
    writes them) becomes one the server answers with a one-line tool error (the first
    item), carrying `envelope` as its ``params._meta`` (the request's own comes after
    the bulk); anything else gets a JSON-RPC error for the id (the second, None: the
    null id) saying the third."""
    rid, method, name = _envelope(prefix)
    why = (f"the request is more than {cap} bytes ({cap / 1024 / 1024:g} MiB), the most one"
           " request may carry; nothing was done")
    rid = _clean(rid) if _is_id(rid) and isinstance(method, str) else None
    if method == "tools/call" and rid is not None and isinstance(name, str):
        call: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": _clean(name), "arguments": {REFUSED: why}}}
        if envelope:
            call["params"]["_meta"] = envelope
        return json.dumps(call).encode() + b"\n", rid, why
    return None, rid, f"Invalid Request: {why}"


def guard_stdin(cap: int) -> None:
    """Put a filter between the process's stdin and the SDK's stdio transport (a pipe
    on fd 0, fed by a thread line by line through `_screen`), so that every request
    with an id gets an answer; a line of more than `cap` bytes is refused (`_too_large`)
    holding no more than `cap` bytes of it. The filter ends when stdin does."""
    try:
        source = os.dup(0)
        read_end, write_end = os.pipe()
        os.dup2(read_end, 0)
        os.close(read_end)
    except OSError:
        return  # no stdin to guard: the SDK reads what there is

    def skip_rest(src: Any, prefix: bytes) -> None:
        while prefix and not prefix.endswith(b"\n"):  # read and dropped
            prefix = src.readline(1 << 20)

    def pump() -> None:
        envelope: dict[str, Any] = {}
        with os.fdopen(source, "rb") as src, os.fdopen(write_end, "wb") as dst:
            while line := src.readline(cap + 1):
                try:
                    if len(line) > cap and not line.endswith(b"\n"):
                        skip_rest(src, line)
                        call, rid, why = _too_large(line, cap, envelope)
                        out = call or _answer(rid, INVALID_REQUEST, why)
                    else:
                        out = _screen(line, envelope)
                    dst.write(out)
                    dst.flush()
                except BrokenPipeError:
                    return
                except Exception:  # never lose a line to the filter itself
                    dst.write(line if len(line) <= cap else b"\n")
                    dst.flush()

    threading.Thread(target=pump, name="steptrail-mcp-stdin", daemon=True).start()


class _Answering:
    """The stdio transport's read stream, with the requests `guard_stdin` refused
    answered on the spot: each `_ANSWER` notification becomes the JSON-RPC error it
    carries, sent through the transport's own writer (so it never tears a frame)."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner, self._write = inner, write_stream

    @property
    def last_context(self) -> Any:  # the sender's context, which the SDK looks for
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            message = getattr(item, "message", None)
            if not isinstance(message, JSONRPCNotification) or message.method != _ANSWER:
                return item
            p = message.params or {}
            await self._write.send(SessionMessage(JSONRPCError(
                jsonrpc="2.0", id=p.get("id"),
                error=ErrorData(code=p["code"], message=p["message"]))))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Answering:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RequestCap:
    """ASGI middleware in front of the streamable HTTP app: the same bound on a request
    as over stdio, refused the same way — a tool call over `cap` bytes with a one-line
    tool error, anything else with a JSON-RPC error (HTTP 413) — where the SDK's own
    limit (4 MiB by default) answers a bare 413. At most `cap` bytes are held; the rest
    is read and dropped."""

    def __init__(self, app: Any, cap: int) -> None:
        self.app, self.cap = app, cap

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, over = bytearray(), False
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its request was whole
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > self.cap:
                over = True
                chunk = chunk[:self.cap - len(body)]
            body += chunk
            if not message.get("more_body", False):
                break
        if over:
            # Over HTTP the 2026-07-28 protocol's envelope is in a header as well.
            version = next((v.decode("latin-1") for k, v in scope["headers"]
                            if k.lower() == b"mcp-protocol-version"), None)
            envelope = {} if version is None else {
                PROTOCOL_VERSION_META_KEY: version, CLIENT_CAPABILITIES_META_KEY: {}}
            call, rid, why = _too_large(bytes(body), self.cap, envelope)
            if call is None:
                error = JSONRPCError(jsonrpc="2.0", id=rid,
                                     error=ErrorData(code=INVALID_REQUEST, message=why))
                await Response(error.model_dump_json(by_alias=True, exclude_unset=True),
                               status_code=413, media_type="application/json",
                               )(scope, receive, send)
                return
            body = bytearray(call)
            scope = {**scope, "headers": [
                *((k, v) for k, v in scope["headers"] if k.lower() != b"content-length"),
                (b"content-length", str(len(body)).encode())]}
        replay = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def again() -> Any:
            return replay.pop() if replay else await receive()

        await self.app(scope, again, send)


def _error(message: str) -> CallToolResult:
    message = one_line(message)
    return CallToolResult(content=[TextContent(type="text", text=message)],
                          structured_content={"status": "error", "error": message}, is_error=True)


def _refusal(exc: RootRefused) -> CallToolResult:
    """A tool error for roots that cannot be served: one line, and its kind."""
    message = str(exc)
    data: dict[str, Any] = {"status": "error", "error": message, "kind": exc.kind}
    if exc.root is not None:
        data["root"] = exc.root
    return CallToolResult(content=[TextContent(type="text", text=message)],
                          structured_content=data, is_error=True)


def _validation_line(tool: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "arguments") or "arguments"
        parts.append(f"{where}: {one_line(err.get('msg', 'invalid'))}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return f"invalid arguments for {tool}: " + "; ".join(parts) + more


# -- the client's roots: the workspaces of a server started without --workspace -----------


class RootRefused(ToolFailure):
    """Why the client's roots cannot be served; `kind` names the case for a program
    (``NoRoots``, ``InvalidRoot``, ``RootsUnavailable``), `root` the URI at fault."""

    def __init__(self, kind: str, message: str, root: str | None = None) -> None:
        super().__init__(one_line(message))
        self.kind, self.root = kind, root


#: What the fix is, in every refusal of roots: the two ways to name a workspace.
_ROOTS_FIX: Final = ("Start the server with --workspace DIR (e.g. --workspace /path/to/project),"
                     " or announce the project's directory as a file:// root from the client")


def _refused_roots(exc: ValidationError) -> RootRefused:
    """A client's roots/list answer that is not a list of file:// roots."""
    for err in exc.errors():
        loc = err.get("loc", ())
        if loc and loc[-1] == "uri":
            uri = _clean(str(err.get("input")))
            return RootRefused("InvalidRoot", f"the client's root {uri!r} is not a file:// URI"
                               f" ({one_line(err.get('msg', 'invalid'))}); nothing was created."
                               f" Fix the client's roots. {_ROOTS_FIX}", root=uri)
    return RootRefused("InvalidRoot", "the client's roots/list answer is not a list of roots"
                       f" ({_validation_detail(exc)}); nothing was created. {_ROOTS_FIX}")


#: At most this many roots are served from one announcement (each becomes a workspace).
MAX_ROOTS: Final = 64


def _unservable(path: str, real: str) -> str | None:
    """Why an existing directory may not be a root (None: it may): the file system's
    root (every file on the machine), a directory that is or lies inside a `.git` (a
    step writing git's internals runs code at the next git command) or a ledger's
    `.steptrail` directory (another ledger's files), or a name that is not UTF-8."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if real == "/":
        return "is the file system's root: give the project's directory"
    for part in (*path.split("/"), *real.split("/")):
        if is_git_name(part):
            return "is or lies inside a .git directory: git's internals are not a workspace"
        if is_ledger_dir_name(part):
            return "is or lies inside a .steptrail directory: a ledger's files are not a workspace"
    return None


def root_directories(roots: Sequence[Any]) -> list[str]:
    """The absolute directories of announced roots (each a ``Root`` with a ``uri``), in
    order, the same directory once. A root that is not a ``file://`` URI of an existing
    directory on this machine (a host other than localhost, a relative or '..' path, a
    path that does not exist or is not a directory) is a `RootRefused`: nothing is
    created for any of them."""
    if not roots:
        raise RootRefused("NoRoots", f"the client announced no roots, and no --workspace was"
                          f" given: nothing to serve. {_ROOTS_FIX}")
    if len(roots) > MAX_ROOTS:
        raise RootRefused("InvalidRoot", f"the client announced {len(roots)} roots; at most"
                          f" {MAX_ROOTS} are served (each is a workspace registered for good);"
                          f" nothing was created. {_ROOTS_FIX}")
    out: list[str] = []
    seen: set[str] = set()
    for root in roots:
        uri = _clean(str(getattr(root, "uri", root)))
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme.lower() != "file":
            raise RootRefused("InvalidRoot", f"the client's root {uri!r} is not a file:// URI;"
                              f" nothing was created. {_ROOTS_FIX}", root=uri)
        if parts.netloc not in ("", "localhost"):
            raise RootRefused("InvalidRoot", f"the client's root {uri!r} names the host"
                              f" {parts.netloc!r} (a relative path?): a root is"
                              f" file:///absolute/path; nothing was created", root=uri)
        path = urllib.parse.unquote(parts.path, errors="surrogateescape")
        why = ("is not an absolute path" if not path.startswith("/") else
               "contains '..'" if ".." in path.split("/") else
               "contains a NUL byte" if "\x00" in path else
               "does not exist" if not os.path.lexists(path) else
               "is not a directory" if not os.path.isdir(path) else None)
        if why is not None:
            raise RootRefused("InvalidRoot", f"the client's root {uri!r}: {_clean(path)} {why};"
                              f" nothing was created. {_ROOTS_FIX}", root=uri)
        path = os.path.normpath(path)
        real = os.path.realpath(path)
        why = _unservable(path, real)
        if why is not None:
            raise RootRefused("InvalidRoot", f"the client's root {uri!r}: {_clean(path)} {why};"
                              f" nothing was created. {_ROOTS_FIX}", root=uri)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


class _Served:
    """The workspaces of one set of roots: their ledger and tools, and the calls using
    them (a set replaced while calls run is closed when the last one ends)."""

    def __init__(self, key: tuple[str, ...], ledger: Ledger, tools: FileTools) -> None:
        self.key, self.ledger, self.tools = key, ledger, tools
        self.users = 0
        self.retired = False

    def close(self) -> None:
        try:
            self.tools.close()
        finally:
            self.ledger.close()


class ClientRoots:
    """The workspaces of a server started without ``--workspace``: the directories the
    client announces as roots (MCP's roots capability), opened as ``--workspace`` would
    open them (`open_workspaces`: without ``--ledger``, the nearest
    ``.steptrail/ledger.db`` at or above the first root), and opened again when the
    roots change.

    On a handshake-era connection (up to 2025-11-25) the server asks ``roots/list``
    at the first tool call and keeps the answer until the client sends
    ``notifications/roots/list_changed``; on 2026-07-28, which has no notifications,
    each tool call carries the question (an ``InputRequiredResult`` the client's SDK
    answers)."""

    def __init__(self, *, ledger_path: str | None = None, witness: str | None = None,
                 echo: Callable[[str], None] | None = None,
                 on_op: Callable[[str], None] | None = None, **tools_kw: Any) -> None:
        self.ledger_path, self.witness, self.echo, self.on_op = ledger_path, witness, echo, on_op
        self.tools_kw = tools_kw
        self.limits: Limits = tools_kw.get("limits") or Limits()
        self._lock = threading.Lock()
        self._current: _Served | None = None
        self._generation = 0
        self._cached: Any = None

    def changed(self) -> None:
        """The client said its roots changed: ask again at the next tool call."""
        self._generation += 1
        self._cached = None

    async def ask(self, ctx: Context) -> Any:
        """The resolver's answer for one tool call: the client's roots (a
        ``ListRootsResult``, or the `ListRoots` marker for the SDK to ask them), or a
        `RootRefused` to answer the call with."""
        caps = ctx.client_capabilities
        if caps is None or caps.roots is None:
            return RootRefused("NoRoots", "no --workspace was given and the client does not"
                               f" announce roots (the MCP roots capability): nothing to serve."
                               f" {_ROOTS_FIX}")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return ListRoots()
        cached, generation = self._cached, self._generation
        if cached is not None:
            return cached
        try:
            got = await ctx.session.send_request(
                ListRootsRequest(), ListRootsResult,
                metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        except ValidationError as exc:
            return _refused_roots(exc)
        except Exception as exc:  # the client's error, a timeout, the connection gone
            return RootRefused("RootsUnavailable", "could not get the client's roots"
                               f" (roots/list: {type(exc).__name__}: {exc}). {_ROOTS_FIX}")
        if generation == self._generation:
            self._cached = got
        return got

    def acquire(self, roots: Any) -> tuple[_Served, bool]:
        """The workspaces of `roots` (opened, or the ones already open), counted as in
        use until `release`; and whether the ledger is another one than before."""
        dirs = root_directories(getattr(roots, "roots", None) or [])
        key = tuple(dirs)
        with self._lock:
            cur = self._current
            moved = False
            if cur is None or cur.key != key:
                try:
                    ledger, names, given = open_workspaces(
                        dirs, self.ledger_path, witness=self.witness, echo=self.echo,
                        on_op=self.on_op)
                except LedgerError as exc:
                    raise ToolFailure(one_line("cannot serve the client's roots: "
                                               + said_at_a_shell(exc))) from None
                try:
                    tools = FileTools(ledger, names, given_roots=given, **self.tools_kw)
                except LedgerError as exc:
                    ledger.close()
                    raise ToolFailure(one_line("cannot serve the client's roots: "
                                               + said_at_a_shell(exc))) from None
                except BaseException:
                    ledger.close()
                    raise
                new = _Served(key, ledger, tools)
                moved = cur is None or cur.ledger.path != ledger.path
                if self.echo is not None:
                    served = ", ".join(f"{w.name} ({w.root})" for w in tools.workspaces)
                    self.echo(f"steptrail mcp: serving the client's roots: {served} from"
                              f" {ledger.path}")
                self._current = new
                if cur is not None:
                    cur.retired = True
                    if cur.users == 0:
                        cur.close()
                cur = new
            cur.users += 1
            return cur, moved

    def release(self, served: _Served) -> None:
        with self._lock:
            served.users -= 1
            last = served.retired and served.users == 0
        if last:
            served.close()

    def close(self) -> None:
        with self._lock:
            cur, self._current = self._current, None
        if cur is not None:
            cur.close()


async def _client_roots(ctx: Context) -> Any:
    """The resolver every tool's `client_roots` parameter is filled by: None for a
    server with fixed workspaces, else `ClientRoots.ask`."""
    server = ctx.mcp_server
    roots = server.roots if isinstance(server, SteptrailServer) else None
    if roots is None:
        return None
    return await roots.ask(ctx)


#: The hidden parameter of every tool (not in its schema): the client's roots.
RootsArg = Annotated[Any, Resolve(_client_roots)]


class SteptrailServer(MCPServer):
    """The MCP server of `steptrail mcp` over one `FileTools` (fixed workspaces), or
    over the client's roots (`ClientRoots`: ``roots``, with `tools` None)."""

    def __init__(self, tools: FileTools | None, *, roots: ClientRoots | None = None,
                 name: str = "steptrail", failed: str | None = None) -> None:
        if failed is None and (tools is None) == (roots is None):
            raise ValueError("give the tools of fixed workspaces or the client's roots")
        #: The configuration could not be served (a mistyped --workspace, a ledger that
        #: cannot be opened): every tool answers with this one line, and the server stays
        #: up, so the client shows it (it saw only "Connection closed").
        self.failed = failed
        super().__init__(name, title="steptrail", version=__version__,
                         instructions=INSTRUCTIONS, log_level="WARNING",
                         website_url=None)
        self.tools = tools
        self.roots = roots
        self._views: OrderedDict[str, ClientView] = OrderedDict()
        self._params: dict[str, frozenset[str]] = {}
        self._register()
        if roots is not None:
            async def roots_changed(_ctx: Any, _params: Any) -> None:
                roots.changed()

            self._lowlevel_server.add_notification_handler(
                "notifications/roots/list_changed", NotificationParams, roots_changed)

    @property
    def limits(self) -> Limits:
        if self.tools is None and self.roots is None:
            return Limits()
        return self.tools.limits if self.tools is not None else self.roots.limits  # type: ignore[union-attr]

    def close(self) -> None:
        """Release the leases this server holds; close the ledgers it opened for the
        client's roots (a ledger of fixed workspaces is its caller's to close)."""
        if self.tools is not None:
            self.tools.close()
        if self.roots is not None:
            self.roots.close()

    # -- plumbing -------------------------------------------------------------------------

    def view(self, ctx: Context | None) -> ClientView:
        """The calling client's view: per HTTP session, else the process's own."""
        key = ""
        if ctx is not None:
            try:
                headers = ctx.headers
            except Exception:  # no request context (a direct call): the process's view
                headers = None
            if headers is not None:
                key = str(headers.get("mcp-session-id") or "")
        got = self._views.get(key)
        if got is None:
            got = self._views[key] = ClientView()
            while len(self._views) > 256:
                self._views.popitem(last=False)
        self._views.move_to_end(key)
        return got

    @staticmethod
    def who(ctx: Context | None) -> str:
        """Who made a step, as its `run` records it: ``mcp:<client name>``."""
        name = ""
        try:
            params = ctx.session.client_params if ctx is not None else None
            if params is not None and params.client_info is not None:
                name = f"{params.client_info.name} {params.client_info.version or ''}".strip()
        except Exception:
            name = ""
        name = re.sub(r"[\x00-\x1f\x7f]", "", name)[:120] or "unnamed client"
        return f"mcp:{name}"

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> Any:
        if isinstance(arguments, dict) and REFUSED in arguments:
            return _error(f"{name}: {arguments[REFUSED]}")
        allowed = self._params.get(name)
        if allowed is not None and isinstance(arguments, dict):
            unknown = sorted(set(arguments) - allowed)
            if unknown:
                return _error(f"invalid arguments for {name}: unknown argument"
                              f" {', '.join(repr(u) for u in unknown)}; it takes"
                              f" {', '.join(sorted(allowed))}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError) and _client_roots.__name__ in str(exc):
                # the client's roots/list answer (2026-07-28), refused by the SDK
                return _refusal(_refused_roots(exc.__cause__))
            if isinstance(exc.__cause__, ValidationError):
                return _error(_validation_line(name, exc.__cause__))
            return _error(str(exc))

    async def run_stdio_async(self) -> None:
        """Serve stdio as `MCPServer.run_stdio_async` does, with the requests
        `guard_stdin` refused answered (`_Answering`)."""
        async with stdio_server() as (read_stream, write_stream):
            await self._lowlevel_server.run(
                _Answering(read_stream, write_stream), write_stream,
                self._lowlevel_server.create_initialization_options())

    def streamable_http_app(self, **options: Any) -> Starlette:
        """The SDK's streamable HTTP app behind `RequestCap` (the stdio bound)."""
        app = super().streamable_http_app(**options)
        app.add_middleware(RequestCap, cap=self.limits.request_bytes)
        return app

    def _tool(self, fn: Callable[..., CallToolResult], *, read_only: bool,
              destructive: bool = False, idempotent: bool = False, title: str) -> None:
        self.add_tool(fn, name=fn.__name__, title=title, description=fn.__doc__,
                      annotations=ToolAnnotations(title=title, read_only_hint=read_only,
                                                  destructive_hint=destructive,
                                                  idempotent_hint=idempotent,
                                                  open_world_hint=False),
                      structured_output=False)
        import inspect
        self._params[fn.__name__] = frozenset(
            p for p in inspect.signature(fn).parameters if p not in ("ctx", "client_roots"))

    def _run(self, roots: Any, ctx: Context | None, method: Callable[..., Result], *args: Any,
             **kwargs: Any) -> CallToolResult:
        """Run `method` (a `FileTools` method, e.g. ``FileTools.write_file``) for the
        calling client (its view first) on the fixed workspaces, or on the workspaces of
        the client's `roots`."""
        if self.failed is not None:
            return _error(self.failed)
        if self.roots is None:
            assert self.tools is not None
            return _result(self.tools.call(method.__get__(self.tools), self.view(ctx),
                                           *args, **kwargs))
        if isinstance(roots, RootRefused):
            return _refusal(roots)
        try:
            served, moved = self.roots.acquire(roots)
        except RootRefused as exc:
            return _refusal(exc)
        except ToolFailure as exc:
            return _error(str(exc))
        try:
            if moved:  # what a client read is of the ledger it read it from
                self._views.clear()
            tools = served.tools
            return _result(tools.call(method.__get__(tools), self.view(ctx), *args, **kwargs))
        finally:
            self.roots.release(served)

    # -- the tools --------------------------------------------------------------------------

    def _register(self) -> None:

        def read_text_file(
            path: PathArg,
            head: Annotated[int | None, Field(default=None, ge=0, description="Only the first N"
                                              " lines.")] = None,
            tail: Annotated[int | None, Field(default=None, ge=0, description="Only the last N"
                                              " lines.")] = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Read a text file (UTF-8). Returns its content, and its rev and sha256: your next
            write or edit of this path is applied only if the file still holds what you read.
            Read a file before you write or edit it."""
            return self._run(client_roots, ctx, FileTools.read_text_file, path, head, tail)

        def read_multiple_files(
            paths: Annotated[list[str], Field(description="File paths (as for"
                                              " read_text_file), at most 100.")],
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Read several text files at once; each comes with its rev and sha256, and a file
            that cannot be read reports its error without failing the others."""
            return self._run(client_roots, ctx, FileTools.read_multiple_files, paths)

        def write_file(
            path: PathArg,
            content: Annotated[str, Field(description="The file's complete new content.")],
            expectedHash: ExpectedHash = None,
            requestId: RequestId = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Create a file or replace its whole content, as one committed, undoable step.
            Fenced: an existing file must still hold what this session read (or expectedHash);
            if it changed, nothing is written and you get a conflict with the current hash and
            a diff from what you read. A new file must not have appeared meanwhile."""
            return self._run(client_roots, ctx, FileTools.write_file, path, content, expectedHash,
                             requestId, self.who(ctx))

        def edit_file(
            path: PathArg,
            edits: Annotated[list[Edit], Field(description="Replacements, applied in order;"
                                               " each oldText must match exactly once.")],
            dryRun: Annotated[bool, Field(default=False, description="true: only show the diff,"
                                          " write nothing.")] = False,
            expectedHash: ExpectedHash = None,
            requestId: RequestId = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Edit a text file by exact text replacements (whitespace-tolerant line matching
            as a fallback) and return the git-style diff. The edits are made to the content
            this session read; if the file changed since, nothing is written and you get a
            conflict with a diff. One committed, undoable step."""
            return self._run(client_roots, ctx, FileTools.edit_file, path,
                             [(e.oldText, e.newText) for e in edits], dryRun, expectedHash,
                             requestId, self.who(ctx))

        def write_files(
            files: Annotated[list[FileChange], Field(description="The files of the change:"
                                                     " each with content, edits or delete.")],
            dryRun: Annotated[bool, Field(default=False, description="true: only show the"
                                          " diffs of the edits, write nothing.")] = False,
            requestId: RequestId = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Write, edit or delete several files of one workspace as ONE atomic step: every
            file lands or none does (a conflict on one refuses them all). Each file is fenced
            as in write_file/edit_file. Undo reverts them together."""
            return self._run(client_roots, ctx, FileTools.write_files,
                             [{"path": f.path, "content": f.content, "delete": f.delete,
                               "expectedHash": f.expectedHash,
                               "edits": None if f.edits is None else
                               [(e.oldText, e.newText) for e in f.edits]} for f in files],
                             requestId, self.who(ctx), dryRun)

        def delete_file(
            path: PathArg,
            expectedHash: ExpectedHash = None,
            requestId: RequestId = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Delete a file, as one committed step that undo can revert. Fenced like
            write_file: the file must still hold what this session read (read it first)."""
            return self._run(client_roots, ctx, FileTools.delete_file, path, expectedHash, requestId,
                             self.who(ctx))

        def create_directory(path: DirArg, client_roots: RootsArg = None, ctx: Context | None = None) -> CallToolResult:
            """Create a directory and any missing parents (succeeds if it exists). Symlinks are
            not followed; the ledger's own directory and .git are refused. Not a step: files
            written into it are."""
            return self._run(client_roots, ctx, FileTools.create_directory, path)

        def list_directory(path: DirArg, client_roots: RootsArg = None, ctx: Context | None = None) -> CallToolResult:
            """List a directory: [FILE], [DIR] and [LINK] (a symlink, never followed) entries,
            by name. The ledger's own directory, .git and steptrail's temporaries are not
            shown; a huge directory is cut short (said so)."""
            return self._run(client_roots, ctx, FileTools.list_directory, path)

        def list_directory_with_sizes(
            path: DirArg,
            sortBy: Annotated[str, Field(default="name", pattern="^(name|size)$",
                                         description="'name' or 'size'.")] = "name",
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """List a directory as list_directory does, with file sizes and totals."""
            return self._run(client_roots, ctx, FileTools.list_directory, path, True, sortBy)

        def directory_tree(
            path: DirArg,
            excludePatterns: Annotated[list[str] | None, Field(
                default=None, description="Glob patterns of paths to leave out, e.g."
                " 'node_modules', '**/*.pyc'.")] = None,
            maxDepth: Annotated[int | None, Field(default=None, ge=1, le=64, description="How"
                                                  " many levels to descend.")] = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """A recursive tree of a directory as JSON ({name, type, children}); symlinks are
            listed, never followed. Bounded in entries, depth and time: a huge tree comes back
            truncated, with the reason."""
            return self._run(client_roots, ctx, FileTools.directory_tree, path, excludePatterns or [], maxDepth)

        def move_file(
            source: Annotated[str, Field(description="The file or directory to move (path as"
                                         " for read_text_file).")],
            destination: Annotated[str, Field(description="Where it goes; must not exist.")],
            requestId: RequestId = None,
            expectedHash: ExpectedHash = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Move or rename a file or a directory (with its files) within a workspace, as
            one committed, undoable step. Fenced like delete_file: each moved file must
            still hold what this session read of it (read it first; expectedHash fences a
            single file instead); the destination is created fenced on its absence. Never
            replaces anything; a file's permission bits come along."""
            return self._run(client_roots, ctx, FileTools.move_file, source, destination, requestId,
                             self.who(ctx), expectedHash)

        def search_files(
            path: DirArg,
            pattern: Annotated[str, Field(description="A glob ('*.py', 'src/**/test_*.py') or"
                                          " plain text found case-insensitively in names.")],
            excludePatterns: Annotated[list[str] | None, Field(
                default=None, description="Glob patterns of paths to skip.")] = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Find files and directories below a directory by name or glob. Symlinks are not
            followed; results are bounded (said so when cut short)."""
            return self._run(client_roots, ctx, FileTools.search_files, path, pattern, excludePatterns or [])

        def get_file_info(path: DirArg, client_roots: RootsArg = None, ctx: Context | None = None) -> CallToolResult:
            """Metadata of a file or directory: type, size, times, permissions; for a file also
            its rev and sha256 (the hash a write's expectedHash compares with)."""
            return self._run(client_roots, ctx, FileTools.get_file_info, path)

        def list_allowed_directories(client_roots: RootsArg = None, ctx: Context | None = None) -> CallToolResult:
            """The directories this server may read and write (its steptrail workspaces).
            Relative paths are inside the first one."""
            return self._run(client_roots, ctx, FileTools.list_allowed_directories)

        def history(
            path: Annotated[str | None, Field(default=None, description="A file path; omit it"
                                              " for every path.")] = None,
            limit: Annotated[int, Field(default=20, ge=1, le=200, description="How many steps,"
                                        " newest first.")] = 20,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """The steps that changed a file (or any file): when, by whom (which client), what
            each did to which path, and what became of it (committed, refused, undone). Any
            step id shown can be given to undo."""
            return self._run(client_roots, ctx, FileTools.history, path, limit)

        def undo(
            step: Annotated[str | None, Field(default=None, description="The step to undo (as a"
                                              " write or history returned it), or the requestId"
                                              " of the change. Omit it: this session's last"
                                              " committed change.")] = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Undo one committed change: each file it wrote goes back to what it held before
            (a file it created is removed). Fenced: a file changed since (by a person or a
            later step) is left exactly as found and reported, never overwritten."""
            return self._run(client_roots, ctx, FileTools.undo, step, self.who(ctx))

        def observe(
            label: Annotated[str, Field(default="", max_length=4096, description="Words"
                                        " recorded with the observation.")] = "",
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Record the edits made to the workspace outside this server's writes — a
            person's editor, a shell command (yours too), a formatter: every file created,
            changed, deleted or chmodded since the ledger last knew it, as one step of its
            own that history shows and undo can take back. Nothing is written to the files.
            It records that this client asked; .gitignore'd, very large and non-regular
            files are left out and listed."""
            return self._run(client_roots, ctx, FileTools.observe, label, self.who(ctx))

        def rewind(
            to: Annotated[str, Field(description="A step id (as history shows it: the"
                                     " workspace as it was just after that step's writes)"
                                     " or '#N' for the ledger's event N.")],
            paths: Annotated[list[str] | None, Field(default=None, description="Only these"
                                                     " paths (a file, or a directory and what"
                                                     " is under it); omit for all.")] = None,
            preview: Annotated[bool, Field(default=True, description="true (the default):"
                                           " show what would change, with diffs, and write"
                                           " nothing. false: do it.")] = True,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Put the workspace back as it was at an earlier step: every file (or each of
            paths) gets the content it had then; files created since are removed, deleted
            ones come back. Preview first (the default). Doing it is one step history shows
            and undo takes back (two where a file and a directory traded places: 'cleared'
            names the first, undone after the second); a file holding an edit nobody
            recorded refuses it (call observe first); .git is never touched."""
            return self._run(client_roots, ctx, FileTools.rewind, to, paths, preview)

        def fork(
            at: Annotated[str, Field(description="A step id (as history shows it) or '#N'.")],
            to: Annotated[str, Field(description="A new or empty directory, by absolute path,"
                                     " outside the workspace.")],
            name: Annotated[str | None, Field(default=None, description="The fork's"
                                              " workspace name (default: the directory's"
                                              " name).")] = None,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """Copy the workspace as it was at an earlier step into a new directory, as a new
            workspace of the same ledger (its lineage recorded), for another agent to
            continue from there while this one goes on. This server does not serve the
            fork: start one with --workspace on that directory."""
            return self._run(client_roots, ctx, FileTools.fork, at, to, name)

        def status(client_roots: RootsArg = None, ctx: Context | None = None) -> CallToolResult:
            """The ledger and its workspaces now: each workspace's rev and lease (who holds it,
            until when), steps in flight, anything an interrupted server left unsettled (the
            next write settles it), what needs a person (refused writes, undone or settled
            steps, unacked steps, kept files: open first, then the ones a retry resolved),
            and what this session has read and done."""
            return self._run(client_roots, ctx, FileTools.status)

        def audit(
            limit: Annotated[int, Field(default=50, ge=1, le=500, description="How many of the"
                                        " newest events.")] = 50,
            verify: Annotated[bool, Field(default=False, description="true: also verify the"
                                          " whole ledger (hash chain, projections, fences,"
                                          " blobs); slower on a big ledger.")] = False,
            client_roots: RootsArg = None, ctx: Context | None = None,
        ) -> CallToolResult:
            """The audit log: the newest events of the served workspaces — every step planned,
            applied, committed, refused or undone, with who and when, and every lease taken
            (over). With verify, the ledger's tamper-evident check."""
            return self._run(client_roots, ctx, FileTools.audit, limit, verify)

        reads = [read_text_file, read_multiple_files, list_directory, list_directory_with_sizes,
                 directory_tree, search_files, get_file_info, list_allowed_directories, history,
                 status, audit]
        for fn in reads:
            self._tool(fn, read_only=True, idempotent=True, title=fn.__name__.replace("_", " "))
        for fn in (write_file, edit_file, write_files, move_file):
            self._tool(fn, read_only=False, destructive=True, title=fn.__name__.replace("_", " "))
        self._tool(delete_file, read_only=False, destructive=True, title="delete file")
        self._tool(create_directory, read_only=False, idempotent=True, title="create directory")
        self._tool(undo, read_only=False, destructive=True, idempotent=True, title="undo")
        self._tool(observe, read_only=False, destructive=False, idempotent=True,
                   title="observe")
        self._tool(rewind, read_only=False, destructive=True, title="rewind")
        self._tool(fork, read_only=False, destructive=False, title="fork")


# -- opening the ledger and its workspaces -------------------------------------------------


def _workspace_name(root: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(root.rstrip("/")))[:64] or "workspace"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


def _register(ledger: Ledger, real: str, echo: Callable[[str], None] | None) -> str:
    """The name of the workspace whose root is `real`, registering it if none is (under
    its base name; another server registering at the same time is no harm: the same
    name and directory again is a no-op, a name taken meanwhile is chosen again)."""
    for _ in range(5):
        rows = {w.name: w for w in ledger.workspaces.list()}
        name = next((w.name for w in rows.values() if w.root == real), None)
        if name is not None:
            return name
        for w in rows.values():
            # a copied or moved project: its ledger registered this directory's project
            # at the original place; say so (the operator rebinds) rather than register
            # the copy beside it under another name
            moved = ledger.workspaces.ledger_moved(w.name)
            if moved is not None and moved.new_root == real:
                raise moved
        name = _workspace_name(real, set(rows))
        try:
            ledger.workspaces.add(name, real)
        except InvalidInput:
            if name not in {w.name for w in ledger.workspaces.list()}:
                raise  # not a race: the directory itself is refused
            continue
        if echo is not None:
            echo(f"steptrail mcp: registered workspace {name!r} ({real})")
        return name
    raise InvalidInput(f"could not register {real} as a workspace: its name kept being taken")


def _init(ledger_path: str, witness: str | None,
          on_op: Callable[[str], None] | None = None) -> Ledger:
    """`Ledger.init`, safe when several servers start at once on a fresh workspace (as
    an agent's sub-agents do): the servers of this machine take turns on a lock file in
    the ledger's directory, and a file that another process is still creating (not yet
    a ledger, and new) is waited for, a few seconds at most."""
    from .. import locate

    if not locate(ledger_path).local_file:  # a database: concurrent inits make one ledger by themselves
        return Ledger.init(ledger_path, witness=witness, on_op=on_op)
    directory = os.path.dirname(os.path.abspath(ledger_path))
    lock_fd = None
    deadline = time.monotonic() + 5
    with contextlib.suppress(OSError):
        # The ledger's own directory only, as `steptrail init` without --parents: a
        # mistyped --ledger is refused by Ledger.init below, not made.
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode=0o700)
        lock_fd = open_lock_file(ledger_path + "-mcp-init.lock")
    while lock_fd is not None:  # never blocks: a stuck holder delays a start 5 s at most
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    try:
        while True:
            try:
                return Ledger.init(ledger_path, witness=witness, parents=False, on_op=on_op)
            except NotALedger:
                try:
                    young = time.time() - os.stat(ledger_path).st_mtime < 5
                except OSError:
                    young = True
                if not young or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def open_workspaces(specs: Sequence[str], ledger_path: str | None, *,
                    witness: str | None = None, create: bool = True,
                    echo: Callable[[str], None] | None = None,
                    on_op: Callable[[str], None] | None = None
                    ) -> tuple[Ledger, list[str], dict[str, str]]:
    """The ledger and the names of the workspaces to serve, from ``--workspace`` values:
    a directory (registered under its base name if it is not yet a workspace) or the
    NAME of a registered workspace. Without `ledger_path` the ledger is the nearest
    ``.steptrail/ledger.db`` at or above the first directory (`ledger.find`), else that
    directory's own, created (when `create`). `on_op`:
    the ledger's hook before each durable operation (`Ledger.open`)."""
    if not specs:
        raise InvalidInput("give the workspace to serve: --workspace DIR (e.g. --workspace .)")
    if ledger_path is None:
        first = specs[0]
        if not os.path.isdir(first):
            raise InvalidInput(f"--workspace {first}: not a directory (a workspace NAME needs"
                               " --ledger PATH, the ledger that registered it)")
        home = os.path.realpath(first)
        # the project's ledger, found upward from the workspace as git finds .git (never
        # from the server's own working directory); none: a new one in the workspace
        from ..find import find_ledger

        ledger_path = find_ledger(home) or os.path.join(home, ".steptrail", "ledger.db")
    else:
        home = None
    if create:
        ledger = _init(ledger_path, witness, on_op)
        if ledger.created and echo is not None:
            echo(f"steptrail mcp: created ledger {ledger.path}")
            if home is not None and not os.path.lexists(os.path.join(home, ".git")):
                echo(f"steptrail mcp: notice: {home} is not a project (no .git, no ledger"
                     f" before this one): its new ledger is {ledger.path}. If that is not the"
                     " directory you meant, remove its .steptrail and serve the project's"
                     " directory (--workspace /path/to/project, or the client's root)")
    else:
        ledger = Ledger.open(ledger_path, witness=witness, on_op=on_op)  # LedgerNotFound
    try:
        names: list[str] = []
        given: dict[str, str] = {}
        for spec in specs:
            rows = {w.name: w for w in ledger.workspaces.list()}
            if os.path.isdir(spec):
                real = os.path.realpath(spec)
                name = _register(ledger, real, echo)
                given[name] = os.path.abspath(spec)
            elif spec in rows:
                name = spec
            else:
                raise InvalidInput(f"--workspace {spec}: neither a directory nor a workspace of"
                                   f" {ledger.path} (steptrail workspace list)")
            if name in names:
                raise InvalidInput(f"--workspace {spec}: workspace {name!r} is given twice")
            names.append(name)
    except BaseException:
        ledger.close()
        raise
    return ledger, names, given


def check_bind(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback HTTP bind unless the operator forces it: the server has no
    authentication, so whoever reaches the port could read and write the workspace."""
    loopback = host in LOOPBACK
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback and not allow_remote:
        raise InvalidInput(f"--host {host} is not a loopback address: steptrail mcp has no"
                           " authentication, so anyone who can reach the port could read and"
                           " write the workspace; serve 127.0.0.1 (the default) and put an"
                           " authenticating proxy in front, or pass --allow-remote if something"
                           " else guards the port")


def transport_security(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection for whatever address is bound: only requests whose Host
    (and Origin, when sent) name that address or a loopback name are served — so a web
    page that rebinds a name to the port gets 421/403, on 127.0.0.2 as on 127.0.0.1."""
    def bracket(h: str) -> str:
        return f"[{h}]" if ":" in h and not h.startswith("[") else h

    names = list(dict.fromkeys([bracket(host), "127.0.0.1", "localhost", "[::1]"]))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names],
        allowed_origins=[f"http://{n}:*" for n in names])


def serve(specs: Sequence[str], *, ledger_path: str | None = None, witness: str | None = None,
          http: bool = False, host: str = "127.0.0.1", port: int = 8765,
          allow_remote: bool = False, lease_ttl_s: float = 20.0, lease_wait_s: float = 30.0,
          lease_linger_s: float = 0.2, lease_turn_s: float = TURN_S,
          observe_on_lease: bool = False, limits: Limits | None = None,
          echo: Callable[[str], None] | None = None,
          on_stage: Callable[[str], None] | None = None) -> None:
    """Run `steptrail mcp` until the client goes away (stdio) or it is interrupted.
    `on_stage` hears each stage a write reaches (`ledger.mcp.service.STAGES`)."""
    if http:
        check_bind(host, allow_remote)
    if not specs:
        if http:
            raise InvalidInput("--http needs --workspace DIR: over HTTP one server has many"
                               " clients, each with its own roots; the client's roots are"
                               " served over stdio only")
        _serve_roots(ledger_path=ledger_path, witness=witness, lease_ttl_s=lease_ttl_s,
                     lease_wait_s=lease_wait_s, lease_linger_s=lease_linger_s,
                     lease_turn_s=lease_turn_s, observe_on_lease=observe_on_lease,
                     limits=limits,
                     echo=echo, on_stage=on_stage)
        return
    try:
        ledger, names, given = open_workspaces(specs, ledger_path, witness=witness,
                                               echo=echo, on_op=exchange_hook(on_stage))
    except LedgerError as exc:
        if http:
            raise  # (no client is connected yet: the command fails, one line)
        # over stdio the client is waiting for a handshake: answer it, and every tool
        # call with the error, rather than exit ("Connection closed" tells it nothing)
        message = (f"steptrail mcp cannot serve this: {type(exc).__name__}:"
                   f" {said_at_a_shell(exc)}")
        failed = SteptrailServer(None, failed=message)
        guard_stdin(failed.limits.request_bytes)
        failed.run("stdio")
        raise  # the session is over: the command fails as it would have (one line, exit 2)
    with ledger:
        tools = FileTools(ledger, names, lease_ttl_s=lease_ttl_s, lease_wait_s=lease_wait_s,
                          lease_linger_s=lease_linger_s, lease_turn_s=lease_turn_s,
                          observe_on_lease=observe_on_lease, limits=limits, given_roots=given,
                          on_stage=on_stage)
        try:
            server = SteptrailServer(tools)
            if echo is not None:
                where = f"http://{host}:{port}/mcp" if http else "stdio"
                served = ", ".join(f"{w.name} ({w.root})" for w in tools.workspaces)
                echo(f"steptrail mcp: serving {served} from {ledger.path} over {where}")
            if not http:
                guard_stdin(tools.limits.request_bytes)
                server.run("stdio")
                return
            # The SDK's own body limit is set to the same bound: RequestCap, in front of
            # it, has refused every larger request already.
            server.run("streamable-http", host=host, port=port,
                       transport_security=transport_security(host),
                       max_request_body_size=tools.limits.request_bytes)
        finally:
            tools.close()


def _serve_roots(*, ledger_path: str | None, witness: str | None,
                 echo: Callable[[str], None] | None, on_stage: Callable[[str], None] | None,
                 **tools_kw: Any) -> None:
    """`serve` without workspaces: the client's roots, over stdio (`ClientRoots`)."""
    roots = ClientRoots(ledger_path=ledger_path, witness=witness, echo=echo,
                        on_op=exchange_hook(on_stage), on_stage=on_stage, **tools_kw)
    server = SteptrailServer(None, roots=roots)
    try:
        if echo is not None:
            echo("steptrail mcp: no --workspace: serving the directories the client announces"
                 " as its roots" + (f", from {ledger_path}" if ledger_path else "")
                 + " over stdio")
        guard_stdin(roots.limits.request_bytes)
        server.run("stdio")
    finally:
        server.close()


__all__ = ["ClientRoots", "RootRefused", "SteptrailServer", "check_bind", "open_workspaces",
           "root_directories", "serve"]


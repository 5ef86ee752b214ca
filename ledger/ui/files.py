"""Bytes in `steptrail ui`: a workspace's tree as of an event, one blob's content
(paged), a download, and the diff of two blobs (bounded, cached by pair)."""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse


from ledger import diffs

from . import model, text

if TYPE_CHECKING:
    from ledger import Ledger

from .web import (
    BadRequest,
    DIFF_CACHE,
    DIFF_PAGE_BUDGET_S,
    FILE_PAGE_CHARS,
    FILE_PAGE_LINES,
    NotFound,
    Shell,
    TREE_PAGE,
    _digest,
    _digest_or_absent,
    _error_page,
    _int,
    _param,
    _step_id_ok,
)


class FilePages:
    """The pages about bytes (see the module), and the diff cache every page shares."""

    def __init__(self, ui: Shell) -> None:
        self.ui = ui
        self._diffs: collections.OrderedDict[tuple[Any, ...], text.Diff] = \
            collections.OrderedDict()
        self._diffs_lock = threading.Lock()

    def diff_of(self, led: Ledger, pre: str | None, post: str | None, path: str,
                deadline: float) -> tuple[text.Diff, int | None, int | None]:
        """The diff of two blobs (None: absent) as pages show it, bounded by `deadline`
        (past it: ``deferred``, its own page linked), a complete one kept in a small
        cache by (pre, post, path); and the two sizes."""
        key = (pre, post, path)
        with self._diffs_lock:
            hit = self._diffs.get(key)
            if hit is not None:
                self._diffs.move_to_end(key)
                return hit[0], hit[1], hit[2]
        if time.monotonic() >= deadline:
            return text.Diff("deferred", note="this page's time for diffs was spent"), None, None
        a, b = model.read_content(led, pre), model.read_content(led, post)
        missing = [f"{label} {c.why}" for label, c in (("before:", a), ("after:", b))
                   if c.digest is not None and c.data is None]
        if missing:
            return text.Diff("unavailable", note="; ".join(missing)), a.size, b.size
        d = text.diff(a.data, b.data, path, deadline=deadline)
        if d.complete:
            with self._diffs_lock:
                self._diffs[key] = (d, a.size, b.size)
                while len(self._diffs) > DIFF_CACHE:
                    self._diffs.popitem(last=False)
        return d, a.size, b.size

    def diff_page(self, request: Request, led: Ledger) -> Response:
        """One write's diff on a page of its own (a step page's diff it had no time
        for), with a budget of its own."""
        path = request.query_params.get("path", "")
        pre, post = _digest_or_absent(request, "pre"), _digest_or_absent(request, "post")
        if pre is None and post is None:
            raise BadRequest("?pre= and ?post= cannot both be absent")
        d, pre_size, post_size = self.diff_of(led, pre, post, path or "file",
                                              time.monotonic() + DIFF_PAGE_BUDGET_S)
        return self.ui.render(request, "diff.html", led, path=path, pre=pre, post=post,
                           d={"diff": d, "pre": pre, "post": post, "pre_size": pre_size,
                              "post_size": post_size, "path": path},
                           step=request.query_params.get("step", ""))

    def tree(self, request: Request, led: Ledger) -> Response:
        ws = _param(request, "ws")
        if not _step_id_ok(ws):
            raise NotFound(f"no workspace {ws!r} in this ledger")
        led.workspaces.get(ws)
        head = led.head().seq
        step_id = request.query_params.get("step")
        if step_id:
            row = led.find_step(step_id) if _step_id_ok(step_id) else None
            if row is None:
                raise NotFound(f"no step {step_id!r} in this ledger")
            seq = row.last_seq
        else:
            seq = _int(request, "seq", head, lo=0)
        after = request.query_params.get("after", "")
        since = _int(request, "since", 0, lo=0)
        if since and since >= seq:
            raise BadRequest(f"?since= must be before the seq shown (#{seq})")
        tree = model.workspace_as_of(led, ws, seq, after=since)
        every = tree.paths
        names = sorted(p for p, s in every.items() if s[1] is not None and p > after)
        shown = names[:TREE_PAGE]
        # paths deleted (or undone to absent) by the writes read: only a continuation,
        # whose earlier page may have shown them, needs to say so
        gone = sorted(p for p, s in every.items() if s[1] is None) if since else []
        return self.ui.render(request, "tree.html", led, ws=ws, seq=seq, step_id=step_id,
                           files=[(p, every[p]) for p in shown], tree=tree, since=since,
                           gone=gone[:TREE_PAGE], gone_total=len(gone),
                           total=sum(1 for s in every.values() if s[1] is not None),
                           more=shown[-1] if len(names) > TREE_PAGE else None)

    def file(self, request: Request, led: Ledger) -> Response:
        digest = _digest(request)
        name = request.query_params.get("name", "") or digest[:12]
        content = model.read_content(led, digest, limit=text.TEXT_MAX)
        if content.data is None and content.why.startswith("not in the ledger"):
            raise NotFound(f"blob {digest} is {content.why}")
        binary = content.data is not None and text.is_binary(content.data)
        start = _int(request, "line", 1, lo=1)
        lines: list[str] = []
        total = 0
        next_line = None
        if content.data is not None and not binary:
            # one page: FILE_PAGE_LINES lines or FILE_PAGE_CHARS characters from `start`
            # (a 2 MB file of a million lines was 32 MB of HTML), each line cut long
            every = content.data.split(b"\n")
            if every and every[-1] == b"":
                every.pop()
            total = len(every)
            if start > max(total, 1):
                raise BadRequest(f"?line= is past the file's end (it has {total:,} lines)")
            chars = 0
            for raw in every[start - 1:start - 1 + FILE_PAGE_LINES]:
                line = diffs.cut_line(text.visible(text.decode(raw)))
                chars += len(line) + 1
                lines.append(line)
                if chars >= FILE_PAGE_CHARS:
                    break
            if start - 1 + len(lines) < total:
                next_line = start + len(lines)
        return self.ui.render(request, "file.html", led, digest=digest, name=name,
                           content=content, binary=binary, lines=lines, first=start,
                           total=total, next_line=next_line,
                           prev_line=max(1, start - FILE_PAGE_LINES) if start > 1 else None,
                           ws=request.query_params.get("ws"),
                           seq=request.query_params.get("seq"))

    def download(self, request: Request) -> Response:
        try:
            digest = _digest(request)
        except BadRequest as exc:
            return _error_page(400, str(exc))
        name = request.query_params.get("name", "") or digest
        with self.ui.pool.ledger() as led:
            head = model.read_content(led, digest, limit=0)
        if head.why.startswith("not in the ledger") or head.why.startswith("CORRUPT"):
            return _error_page(404, f"blob {digest}: {head.why}")
        pool = self.ui.pool

        def chunks() -> Any:
            with pool.ledger() as led:
                yield from led.blob_chunks(digest)

        # a name's control and format characters (U+202E turns "txt.exe" around) do
        # not reach the saved file's name, in either form of the header
        base = "".join("_" if text.is_invisible(c) else c
                       for c in name.rsplit("/", 1)[-1]) or "blob"
        ascii_name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_"
                             for c in base)[:120] or "blob"
        return StreamingResponse(chunks(), media_type="application/octet-stream", headers={
            "content-disposition": f"attachment; filename=\"{ascii_name}\";"
                                   f" filename*=UTF-8''{quote(base, safe='')}",
            "x-content-type-options": "nosniff",
            "content-security-policy": "default-src 'none'; sandbox",
        })


__all__ = ["FilePages"]

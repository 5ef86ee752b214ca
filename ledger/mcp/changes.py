"""The tools that change files (`Changes`): each call one steptrail step under a lease
taken for it (`ledger.mcp.service`'s module docstring): planning it fenced on what the
client read, committing it, answering a retry from the ledger, a conflict as a diff."""

from __future__ import annotations

import contextlib
import stat
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ledger import (
    Compensated,
    FencedOutcome,
    LedgerError,
    Planned,
    PlannedWrite,
    Rejected,
    StaleEpoch,
    StepStatus,
    Write,
    run_fenced_step,
)

from .edits import EditRefused, apply_edits, unified_diff
from ..workspace import FsRefused

from .values import (
    ClientView,
    Result,
    Seen,
    ToolFailure,
    Workspace,
    _Change,
    _HEX64,
    _Matcher,
    _REQUEST_ID,
    _Stale,
    _Unread,
    _summary,
    sha256,
    short,
)
from .context import ToolContext


class Changes:
    """The writing tools over one `ToolContext` (see the module)."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx

    # -- planning a change ---------------------------------------------------------------

    def _fence(self, view: ClientView, ws: Workspace, rel: str, expected: str | None,
               *, what: str) -> tuple[Write | None, Seen | None]:
        """(a Write template — content filled in later — fenced on the expected hash or
        the client's view, or None when the file is absent and unseen; what the client
        saw). Refuses an existing file the client never read ("read it first")."""
        shown = self.ctx.show(ws, rel)
        seen = view.get(ws.name, rel)
        if expected is not None:
            expected = expected.removeprefix("sha256:").lower()
            if expected in ("", "absent", "none", "null"):
                return Write(rel, None, pre_hash=None, base_rev=None), seen
            if not _HEX64.fullmatch(expected):
                raise ToolFailure(f"expectedHash {expected!r} for {shown} is not a sha256 (64 hex"
                                  " digits, as read_text_file returns it)")
            base = seen.rev if seen is not None and seen.hash == expected else None
            return Write(rel, None, pre_hash=expected, base_rev=base), (
                seen if seen is not None and seen.hash == expected else Seen(-1, expected))
        if seen is not None:
            return Write(rel, None, pre_hash=seen.hash, base_rev=seen.rev), seen
        with self.ctx.lock:
            rev, on_disk = self.ctx.ledger.workspaces.snapshot(ws.name, rel)
        if on_disk is not None:
            raise _Unread(ws, rel, rev, on_disk, what)
        return Write(rel, None, pre_hash=None, base_rev=None), None

    def _check_request_id(self, request_id: str | None) -> None:
        if request_id is not None and not _REQUEST_ID.fullmatch(request_id):
            raise ToolFailure(f"requestId {request_id!r} must be 1 to 128 characters of"
                              " letters, digits and ._/@+=- (a UUID is ideal)")

    def step_id(self, ws: Workspace, request_id: str | None) -> str:
        return f"mcp:{ws.name}:{request_id or uuid.uuid4().hex}"

    # -- committing a change ----------------------------------------------------------------

    def _commit(self, view: ClientView, build: Callable[[], _Change], ws: Workspace,
                request_id: str | None, who: str, matches: _Matcher) -> Result:
        """Plan, apply, publish and ack one change as one step (see the module); a retry
        with the same requestId is answered from the ledger."""
        self._check_request_id(request_id)
        with self.ctx.write_lock:
            try:
                return self._commit_once(view, build, ws, request_id, who, matches)
            except StaleEpoch:
                if not self.ctx.leases.reused:
                    raise
            # the lease this server kept between calls was taken over (forced): nothing
            # of this call was committed; take a lease anew and run it once more
            return self._commit_once(view, build, ws, request_id, who, matches)

    @contextlib.contextmanager
    def step_lease(self, ws: Workspace) -> Iterator[int]:
        """The workspace's lease for one change, then the ledger lock: the wait for the
        lease holds only `write_lock`, so reads go on meanwhile. A lease just taken (not
        kept from the last write) has settled whatever a killed server left in flight, a
        half-done undo included (the library's acquire does)."""
        with self.ctx.leases.hold(ws.name) as epoch, self.ctx.lock:
            yield epoch

    def _build(self, view: ClientView, ws: Workspace, build: Callable[[], _Change]
               ) -> _Change | Result:
        """The call's change, built under the ledger lock from what the client has seen —
        or the conflict it gets instead: an existing file it never read ("read it first"),
        or a file changed since it read it (nothing is written either way)."""
        with self.ctx.lock:
            try:
                return build()
            except _Unread as unread:
                return self._unread_conflict(unread)
            except _Stale as stale:
                return self._conflict(view, _Change("edit", ws, [stale.write],
                                                    {stale.write.path: stale.seen}, {}),
                                      "", "rejected:pre_hash", {})

    def _commit_once(self, view: ClientView, build: Callable[[], _Change], ws: Workspace,
                     request_id: str | None, who: str, matches: _Matcher) -> Result:
        step = self.step_id(ws, request_id)
        with self.ctx.lock:
            known = request_id is not None and self.ctx.ledger.find_step(step) is not None
        if known:
            with self.step_lease(ws) as epoch:
                return self._replay(view, ws, step, epoch, matches, who)
        change = self._build(view, ws, build)
        if isinstance(change, Result):
            return change
        size = sum(len(c) for c in change.posts.values() if c is not None)
        if size > self.ctx.limits.write_bytes:
            raise ToolFailure(f"the new content is {size} bytes, more than the"
                              f" {self.ctx.limits.write_bytes} one call may write")
        with self.step_lease(ws) as epoch:
            if request_id is not None and self.ctx.ledger.find_step(step) is not None:
                return self._replay(view, ws, step, epoch, matches, who)  # raced a retry
            out = run_fenced_step(self.ctx.ledger, ws.name, step, change.writes, epoch=epoch,
                                  run=who, on_planned=lambda _: self.ctx.reached("after-admit"))
            return self._answer(view, ws, step, out, change, change.posts)

    def _answer(self, view: ClientView, ws: Workspace, step: str, out: FencedOutcome,
                change: _Change | None, posts: dict[str, bytes | None], *,
                replayed: bool = False) -> Result:
        """The tool's answer to a fenced step's outcome (the library's `run_fenced_step`)."""
        if out.status is StepStatus.STALE_EPOCH:
            assert out.error is not None
            raise out.error
        if not out.committed:
            if change is None:
                change = self._change_from_plan(ws, step)
            verdict = f"rejected:{out.reason.value}" if out.reason is not None else out.detail
            return self._conflict(view, change, step, verdict, {}, replayed=replayed)
        assert out.receipt is not None
        self.ctx.reached("after-commit")
        return self._applied(view, ws, step, out.receipt.writes, posts,
                             change.diffs if change is not None else {},
                             replayed=replayed or out.status is StepStatus.DEDUPED)

    def _applied(self, view: ClientView, ws: Workspace, step: str, writes: Sequence[Any],
                 posts: dict[str, bytes | None], diffs: dict[str, str], *,
                 replayed: bool = False) -> Result:
        files = []
        for w in writes:
            content = posts.get(w.path)
            view.put(ws.name, w.path, Seen(w.rev, w.post_hash,
                                           content if content is not None and w.post_hash else None))
            files.append({"path": self.ctx.show(ws, w.path), "rev": w.rev, "hash": w.post_hash,
                          "previous_hash": w.pre_hash,
                          "change": "created" if w.pre_hash is None else
                          "deleted" if w.post_hash is None else "modified"})
        if step not in view.steps:
            view.steps.append(step)
        lines = [f"{f['path']}: {f['change']} (rev {f['rev']}, sha256 {short(f['hash'])})"
                 for f in files]
        head = ("Already applied (this requestId was answered from the ledger; nothing was"
                " applied twice)" if replayed else "Applied")
        text = (f"{head}: step {step}, committed.\n" + "\n".join(lines)
                + f"\nUndo it with undo(step={step!r}).")
        for path, diff in diffs.items():
            if diff:
                text += f"\n\n```diff\n{diff}```"
        return Result([text], {"status": "applied", "step": step, "workspace": ws.name,
                               "replayed": replayed, "files": files})

    def _replay(self, view: ClientView, ws: Workspace, step: str, epoch: int,
                matches: _Matcher, who: str) -> Result:
        """Answer a retried requestId from what the ledger recorded for its step: a
        committed step's result, a refusal's conflict, an undo's outcome; a step that died
        in flight or was settled unpublished is run again through the library's fenced
        step — fenced on the same read as first recorded, its new content taken from the
        retried call itself (so a post-image lost in the crash is stored again)."""
        row = self.ctx.ledger.step(step)
        planned, ended = self.latest_attempt(step, row.attempt)
        posts = None
        if row.workspace == ws.name and planned is not None and planned.workspace == ws.name:
            posts = matches(planned.writes)
        if posts is None:
            raise ToolFailure(f"requestId of step {step} was already used for a different"
                              " change; give every change its own requestId (a UUID)")
        assert planned is not None
        if row.rejected:
            change = self._change_from_plan(ws, step, planned)
            reason = ended.reason if isinstance(ended, Rejected) else "pre_hash"
            return self._conflict(view, change, step, f"rejected:{reason}", {}, replayed=True)
        if row.compensated and not row.settled_unpublished:
            summary = self.undo_summary(ended)
            return Result([f"Step {step} of this requestId was applied and later {summary};"
                           " nothing was applied again. Make a new change with a new"
                           " requestId."], {"status": "undone" if summary == "undone" else
                                            "undo-conflict", "step": step,
                                            "workspace": ws.name, "replayed": True})
        settled = row.settled_unpublished  # died unpublished, settled: planned again
        writes = [Write(w.path, posts.get(w.path), pre_hash=w.pre_hash,
                        base_rev=None if settled else w.base_rev, mode=w.mode)
                  for w in planned.writes]
        out = run_fenced_step(self.ctx.ledger, ws.name, step, writes, epoch=epoch, run=who)
        return self._answer(view, ws, step, out, self._change_from_plan(ws, step, planned),
                            posts, replayed=True)

    def latest_attempt(self, step: str, attempt: int) -> tuple[Planned | None, Any]:
        """The attempt's plan and its end (rejected or compensated; None: not ended)."""
        got = self.ctx.ledger.attempt(step, attempt)
        return got.planned, None if got.end is None else got.end[1]

    def _change_from_plan(self, ws: Workspace, step: str, planned: Planned | None = None
                          ) -> _Change:
        if planned is None:
            planned = self.latest_attempt(step, self.ctx.ledger.step(step).attempt)[0]
        assert planned is not None
        writes = [Write(w.path, None, pre_hash=w.pre_hash, base_rev=w.base_rev)
                  for w in planned.writes]
        seen = {w.path: Seen(w.base_rev, w.pre_hash) for w in planned.writes}
        return _Change("replay", ws, writes, dict(seen), {})

    # -- conflicts ----------------------------------------------------------------------------

    def _unread_conflict(self, unread: _Unread) -> Result:
        shown = self.ctx.show(unread.ws, unread.rel)
        text = (f"Conflict: nothing was written. {shown} exists and this session has not read"
                f" it, so {unread.what} would overwrite content you have not seen. Read it first"
                " (read_text_file), then write or edit it: the write is then fenced on that"
                " read.")
        return Result([text], {"status": "conflict", "reason": "unread", "files": [{
            "path": shown, "current_rev": unread.rev, "current_hash": unread.hash}]}, True)

    def _conflict(self, view: ClientView, change: _Change, step: str, verdict: str,
                  facts: dict[str, Any], *, replayed: bool = False) -> Result:
        """A refused change as the agent sees it: per path, what it read and what is
        there now, with a diff between them. Nothing was written."""
        ws = change.ws
        reason = verdict.removeprefix("rejected:")
        files = []
        blocks = []
        for w in change.writes:
            seen = change.seen.get(w.path)
            now: bytes | None = None
            try:
                with self.ctx.lock:
                    got = self.ctx.ledger.workspaces.read_file(ws.name, w.path, max_bytes=self.ctx.limits.read_bytes)
                now_hash, now_rev, now = got.pre_hash, got.rev, got.content
            except LedgerError:
                try:
                    with self.ctx.lock:
                        now_rev, now_hash = self.ctx.ledger.workspaces.snapshot(ws.name, w.path)
                except LedgerError:
                    now_rev, now_hash = -1, "unreadable"
            base_ok = w.base_rev is None or w.base_rev == now_rev
            if now_hash == w.pre_hash and base_ok:
                continue  # this path still holds what was read
            shown = self.ctx.show(ws, w.path)
            before = self.ctx.content_of(seen) if seen is not None else None
            if now_hash == "unreadable":
                what = (f"{shown} is now a symlink, a directory or another kind of file that is"
                        " not a regular file (steptrail never writes through one)")
            elif w.pre_hash is None:
                what = f"{shown} did not exist when you planned this, and now it does"
            elif now_hash is None:
                what = f"{shown} was deleted since you read it"
            elif now_hash == w.pre_hash:
                what = (f"{shown} holds the same bytes but was rewritten since you read it"
                        f" (rev {w.base_rev} -> {now_rev})")
            else:
                what = f"{shown} changed since you read it"
            diff = "" if now_hash in (w.pre_hash, "unreadable") else (
                unified_diff(before, now, w.path, before_label="what you read",
                             after_label="on disk now")
                if (before is not None or w.pre_hash is None) and (now is not None or now_hash is None)
                else "(no diff: the content you read is no longer known to the server)")
            files.append({"path": shown, "read_hash": w.pre_hash, "read_rev": w.base_rev,
                          "current_hash": now_hash, "current_rev": now_rev, "diff": diff,
                          "why": what})
            blocks.append(f"- {what}." if now_hash == "unreadable" else
                          f"- {what}: you read sha256 {short(w.pre_hash)}, it is now"
                          f" sha256 {short(now_hash)} (rev {now_rev})."
                          + (f"\n```diff\n{diff}```" if diff else ""))
        if not files:  # the fence saw something that is gone again: say what it saw
            p = facts.get("path") or (change.writes[0].path if change.writes else "")
            files.append({"path": self.ctx.show(ws, p) if p else "", "why": verdict})
            blocks.append(f"- {self.ctx.show(ws, p) if p else 'a path'} changed while the write was"
                          f" being applied ({verdict}).")
        refused = f"; step {step} was refused ({reason})" if step else ""
        text = ("Conflict: nothing was written" + (" (this requestId was refused when first"
                " made)" if replayed else "") + f"{refused}.\n"
                + "\n".join(blocks)
                + "\nRead the file again and redo your change (use a new requestId), or pass"
                " expectedHash with the current hash to replace it on purpose.")
        return Result([text], {"status": "conflict", "reason": reason, "step": step or None,
                               "workspace": ws.name, "replayed": replayed, "files": files}, True)

    # -- writes -------------------------------------------------------------------------------

    def _encode(self, content: str, shown: str) -> bytes:
        if not isinstance(content, str):
            raise ToolFailure(f"content for {shown} must be a string")
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolFailure(f"content for {shown} is not valid Unicode (a lone surrogate)"
                              ) from None

    def write_file(self, view: ClientView, path: str, content: str,
                   expected_hash: str | None = None, request_id: str | None = None,
                   who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "content": content,
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, tool="write_file")

    def delete_file(self, view: ClientView, path: str, expected_hash: str | None = None,
                    request_id: str | None = None, who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "delete": True,
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, tool="delete_file")

    def edit_file(self, view: ClientView, path: str, edits: Sequence[tuple[str, str]],
                  dry_run: bool = False, expected_hash: str | None = None,
                  request_id: str | None = None, who: str = "mcp") -> Result:
        return self.write_files(view, [{"path": path, "edits": list(edits),
                                        "expectedHash": expected_hash}],
                                request_id=request_id, who=who, dry_run=dry_run, tool="edit_file")

    def write_files(self, view: ClientView, files: Sequence[dict[str, Any]],
                    request_id: str | None = None, who: str = "mcp", dry_run: bool = False,
                    tool: str = "write_files") -> Result:
        """Write, edit or delete several files as one step: all land, or none."""
        if not files:
            raise ToolFailure("give at least one file")
        if len(files) > 1000:
            raise ToolFailure(f"{len(files)} files: one step writes at most 1000")
        resolved = []
        for f in files:
            ws, rel = self.ctx.resolve(f.get("path"))
            kinds = [k for k in ("content", "edits", "delete") if f.get(k) not in (None, False)]
            if len(kinds) != 1:
                raise ToolFailure(f"{self.ctx.show(ws, rel)}: give exactly one of content, edits or"
                                  " delete")
            if kinds[0] == "edits" and len(f["edits"]) > 1000:
                raise ToolFailure(f"{self.ctx.show(ws, rel)}: {len(f['edits'])} edits; one call"
                                  " makes at most 1000 (write the whole file instead)")
            resolved.append((ws, rel, kinds[0], f))
        ws = resolved[0][0]
        if any(r[0] is not ws for r in resolved):
            raise ToolFailure("one step writes one workspace: split the change by workspace")
        rels = [r[1] for r in resolved]
        if len(set(rels)) != len(rels):
            raise ToolFailure("a path is given twice; merge its changes into one entry")

        def post_of(rel: str, kind: str, f: dict[str, Any], before: bytes | None) -> bytes | None:
            shown = self.ctx.show(ws, rel)
            if kind == "delete":
                return None
            if kind == "content":
                return self._encode(f["content"], shown)
            if before is None:
                raise ToolFailure(f"{shown} does not exist: nothing to edit (write_file creates"
                                  " a file)")
            edits = [(e[0], e[1]) for e in f["edits"]]
            return apply_edits(self.ctx.text(before, shown), edits, shown).encode("utf-8")

        def build() -> _Change:
            writes, seen_by, posts, diffs = [], {}, {}, {}
            for ws_, rel, kind, f in resolved:
                template, seen = self._fence(view, ws_, rel, f.get("expectedHash"), what=tool)
                assert template is not None
                before = None
                if (kind == "edits" and template.pre_hash is not None and seen is not None
                        and seen.hash == template.pre_hash and seen.content is not None):
                    # the bytes the client read, kept: the edits are made to them, and
                    # the ledger's fence refuses them if the file no longer holds them
                    before = seen.content
                elif kind == "edits" and template.pre_hash is not None:
                    got = self.ctx.read(ws_, rel)
                    if got.pre_hash == template.pre_hash and (
                            template.base_rev is None or got.rev == template.base_rev):
                        before = got.content
                    else:
                        # stale already: the edits are made to what the client read and
                        # the ledger refuses them (recorded) — if those bytes are known
                        before = self.ctx.content_of(seen)
                        if before is None:
                            raise _Stale(Write(rel, None, pre_hash=template.pre_hash,
                                               base_rev=template.base_rev), seen)
                if kind == "delete" and template.pre_hash is None:
                    raise ToolFailure(f"{self.ctx.show(ws_, rel)} does not exist: nothing to delete")
                post = post_of(rel, kind, f, before)
                if post is not None and post == before and kind == "edits":
                    raise ToolFailure(f"the edits leave {self.ctx.show(ws_, rel)} unchanged")
                writes.append(Write(rel, post, pre_hash=template.pre_hash,
                                    base_rev=template.base_rev))
                seen_by[rel], posts[rel] = seen, post
                if kind == "edits":
                    diffs[rel] = unified_diff(before, post, rel)
            return _Change(tool, ws, writes, seen_by, posts, diffs)

        if dry_run:
            change = self._build(view, ws, build)
            if isinstance(change, Result):
                return change
            text = "\n".join(f"```diff\n{d}```" for d in change.diffs.values() if d) or "no change"
            return Result([f"Dry run: nothing was written.\n{text}"], {
                "status": "dry-run", "files": [{"path": self.ctx.show(ws, w.path),
                                                "diff": change.diffs.get(w.path, "")}
                                               for w in change.writes]})

        def matches(planned: tuple[PlannedWrite, ...]) -> dict[str, bytes | None] | None:
            recorded = {p.path: p for p in planned}
            if set(recorded) != set(rels):
                return None
            posts: dict[str, bytes | None] = {}
            for _ws, rel, kind, f in resolved:
                p = recorded[rel]
                if kind == "delete":
                    if p.post_hash is not None:
                        return None
                    posts[rel] = None
                elif kind == "content":
                    data = self._encode(f["content"], rel)
                    if p.post_hash != sha256(data):
                        return None
                    posts[rel] = data
                else:
                    before = None
                    if p.pre_hash is not None:
                        with contextlib.suppress(LedgerError):
                            before = self.ctx.ledger.read_blob(p.pre_hash)
                        if before is None:  # never stored (died before its apply):
                            with contextlib.suppress(LedgerError, ToolFailure, FsRefused):
                                got = self.ctx.read(ws, rel)  # the file, if it still holds it
                                if got.pre_hash == p.pre_hash:
                                    before = got.content
                    if before is None:
                        return None  # cannot be told apart from another change: refused
                    try:
                        post = post_of(rel, kind, f, before)
                    except (ToolFailure, EditRefused):
                        return None
                    if post is None or sha256(post) != p.post_hash:
                        return None
                    posts[rel] = post
            return posts

        return self._commit(view, build, ws, request_id, who, matches)

    @staticmethod
    def _empty_dir(ws: Any, rel: str) -> bool:
        """Whether the directory `rel` holds nothing at all (no entry, hidden or not)."""
        try:
            walk = ws.fs.list_dir(rel, max_entries=1)
        except (LedgerError, OSError, FsRefused):
            return False
        return not walk.entries and not walk.hidden and not walk.truncated

    def move_file(self, view: ClientView, source: str, destination: str,
                  request_id: str | None = None, who: str = "mcp",
                  expected_hash: str | None = None) -> Result:
        """One step: every file under `source` deleted and created at `destination`
        (fenced on its absence). Each moved file is fenced on what this client read of it,
        like delete_file: a file it never read is refused ("read it first"), one changed
        since it read it is a conflict; `expected_hash` fences a single file instead.
        Symlinks and special files are refused; a file's permission bits follow it, set
        before the moved file is visible under its new name."""
        sws, srel = self.ctx.resolve(source, what="source")
        dws, drel = self.ctx.resolve(destination, what="destination")
        if sws is not dws:
            raise ToolFailure("source and destination must be in the same workspace")
        ws = sws
        if drel == srel or drel.startswith(srel + "/"):
            raise ToolFailure(f"cannot move {self.ctx.show(ws, srel)} into itself")
        with self.ctx.lock:
            st = ws.fs.lstat(srel)
            if st is None:
                raise ToolFailure(f"{self.ctx.show(ws, srel)} does not exist")
            dst = ws.fs.lstat(drel)
            if dst is not None and not (stat.S_ISDIR(dst.st_mode) and stat.S_ISDIR(st.st_mode)
                                        and self._empty_dir(ws, drel)):
                # (an empty directory holds nothing to replace: a killed move's, settled,
                # leaves one — its retry goes on into it)
                raise ToolFailure(f"{self.ctx.show(ws, drel)} already exists; move_file never"
                                  " replaces anything")
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise ToolFailure(f"{self.ctx.show(ws, srel)} is a symlink or special file: only"
                                  " regular files and directories move")
            if stat.S_ISDIR(st.st_mode):
                walk = ws.fs.walk(srel, max_entries=self.ctx.limits.move_files * 4,
                                  max_depth=64, max_scan=self.ctx.limits.scan_entries,
                                  deadline_s=self.ctx.limits.walk_seconds)
                if walk.truncated:
                    raise ToolFailure(f"{self.ctx.show(ws, srel)} is too big to move as one step"
                                      f" ({walk.why})")
                if walk.hidden:
                    raise ToolFailure(f"{self.ctx.show(ws, srel)} holds {len(walk.hidden)} entries"
                                      " the tools leave alone (.git, steptrail's temporaries,"
                                      " the ledger's own, names that are not UTF-8): it is not"
                                      " moved, so nothing of it is left behind")
                odd = [e for e in walk.entries if e.kind not in ("file", "directory")]
                if odd:
                    raise ToolFailure(f"{self.ctx.show(ws, odd[0].path)} is a {odd[0].kind}: a"
                                      " directory holding one is not moved")
                files = [e.path for e in walk.entries if e.kind == "file"]
                dirs = [e.path for e in walk.entries if e.kind == "directory"]
                if len(files) > self.ctx.limits.move_files:
                    raise ToolFailure(f"{self.ctx.show(ws, srel)} holds {len(files)} files; one"
                                      f" move moves at most {self.ctx.limits.move_files}")
            else:
                files, dirs = [srel], []
        if not files:  # directories only: nothing of content moves, so no step
            with self.ctx.lock:
                for d in [drel, *(drel + d[len(srel):] for d in dirs)]:
                    ws.fs.mkdir(d)
                for d in sorted([*dirs, srel], key=len, reverse=True):
                    ws.fs.rmdir_empty(d)
            return Result([f"Moved the empty directory {self.ctx.show(ws, srel)} to"
                           f" {self.ctx.show(ws, drel)} (no files: not a step)."],
                          {"status": "moved", "moved": {"from": self.ctx.show(ws, srel),
                                                        "to": self.ctx.show(ws, drel)}})
        pairs = [(f, drel + f[len(srel):]) for f in files]
        if expected_hash is not None and len(pairs) != 1:
            raise ToolFailure("expectedHash fences one file: a directory moves file by file,"
                              " each fenced on what you read of it")

        def build() -> _Change:
            writes, seen, posts = [], {}, {}
            unread = []
            for src, dst in pairs:
                try:
                    template, read = self._fence(view, ws, src, expected_hash, what="move_file")
                except _Unread as exc:
                    unread.append(exc)
                    continue
                assert template is not None
                if template.pre_hash is None:
                    raise ToolFailure(f"{self.ctx.show(ws, src)} does not exist: nothing to move")
                got = self.ctx.read(ws, src)
                if got.content is None:
                    raise ToolFailure(f"{self.ctx.show(ws, src)} disappeared while moving")
                if got.pre_hash != template.pre_hash:
                    # changed since the client read it: the fence refuses it, recorded
                    content = self.ctx.content_of(read)
                    if content is None:
                        raise _Stale(Write(src, None, pre_hash=template.pre_hash,
                                           base_rev=template.base_rev), read)
                else:
                    content = got.content
                mode = None
                with contextlib.suppress(OSError, FsRefused):
                    s = ws.fs.lstat(src)
                    if s is not None:
                        mode = stat.S_IMODE(s.st_mode) & 0o777
                writes.append(Write(src, None, pre_hash=template.pre_hash,
                                    base_rev=template.base_rev))
                writes.append(Write(dst, content, pre_hash=None, base_rev=None, mode=mode))
                seen[src], posts[src] = read, None
                seen[dst], posts[dst] = None, content
            if unread:
                if len(unread) == 1:
                    raise unread[0]
                raise ToolFailure(f"{len(unread)} files under {self.ctx.show(ws, srel)} were never"
                                  " read in this session (" + ", ".join(
                                      self.ctx.show(ws, u.rel) for u in unread[:5])
                                  + (", ..." if len(unread) > 5 else "") + "): a move"
                                  " deletes them where they are, so read each first"
                                  " (read_multiple_files)")
            return _Change("move_file", ws, writes, seen, posts)

        def matches(planned: tuple[PlannedWrite, ...]) -> dict[str, bytes | None] | None:
            recorded = {p.path: p for p in planned}
            want = {p for pair in pairs for p in pair}
            if set(recorded) != want or not all(
                    recorded[s].post_hash is None and recorded[d].pre_hash is None
                    and recorded[d].post_hash == recorded[s].pre_hash for s, d in pairs):
                return None
            posts: dict[str, bytes | None] = {}
            for s, d in pairs:
                digest = recorded[d].post_hash
                assert digest is not None
                data = None
                with contextlib.suppress(LedgerError):
                    data = self.ctx.ledger.read_blob(digest)
                if data is None:
                    with contextlib.suppress(LedgerError, ToolFailure, FsRefused):
                        got = self.ctx.read(ws, s)
                        data = got.content if got.pre_hash == digest else None
                if data is None:
                    return None
                posts[s], posts[d] = None, data
            return posts

        with self.ctx.write_lock:
            result = self._commit(view, build, ws, request_id, who, matches)
            if result.is_error:
                return result
            with self.ctx.lock:
                for d in [drel + d[len(srel):] for d in dirs]:
                    with contextlib.suppress(OSError, FsRefused):
                        ws.fs.mkdir(d)  # empty directories come along
                # a directory's move leaves no empty source behind (it did when the
                # directory held files only); a file's move removes no directory
                for d in sorted([*dirs, srel] if files != [srel] else [], key=len,
                                reverse=True):
                    ws.fs.rmdir_empty(d)
            result.data["moved"] = {"from": self.ctx.show(ws, srel), "to": self.ctx.show(ws, drel)}
            result.texts[0] = (f"Moved {self.ctx.show(ws, srel)} to {self.ctx.show(ws, drel)}.\n"
                               + result.texts[0])
        return result

    def undo_summary(self, ended: object) -> str:
        """How a compensation of a committed step came out, in words (`_summary`)."""
        return _summary(ended.restored if isinstance(ended, Compensated) else ())


__all__ = ["Changes"]

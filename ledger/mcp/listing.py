"""The tools that read (`Listing`): files, directories, a tree, a search, a file's
info, the allowed directories — and `create_directory` (a directory is not a step)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from typing import Any


from ..workspace import Entry, glob_match
from ..fmt import iso

from .values import ClientView, Result, Seen, ToolFailure, Workspace
from .context import ToolContext


class Listing:
    """The reading tools over one `ToolContext` (see the module)."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx

    # -- reads --------------------------------------------------------------------------

    def _seen_after_read(self, view: ClientView, ws: Workspace, rel: str, got: Any) -> None:
        view.put(ws.name, rel, Seen(got.rev, got.pre_hash, got.content))

    def read_text_file(self, view: ClientView, path: str, head: int | None = None,
                       tail: int | None = None) -> Result:
        ws, rel = self.ctx.resolve(path)
        shown = self.ctx.show(ws, rel)
        if head is not None and tail is not None:
            raise ToolFailure("give head or tail, not both")
        with self.ctx.lock:
            got = self.ctx.read(ws, rel)
        if got.content is None:
            raise ToolFailure(f"{shown} does not exist")
        text = self.ctx.text(got.content, shown)
        self._seen_after_read(view, ws, rel, got)
        shown_text, part = text, "whole"
        if head is not None or tail is not None:
            lines = text.splitlines(keepends=True)
            n = head if head is not None else tail
            assert n is not None
            if n < 0:
                raise ToolFailure("head and tail count lines: give 0 or more")
            shown_text = "".join(lines[:n] if head is not None else (lines[-n:] if n else []))
            part = f"{'first' if head is not None else 'last'} {n} lines of {len(lines)}"
        data = {"path": shown, "rev": got.rev, "hash": got.pre_hash, "size": len(got.content),
                "lines": part, "content": shown_text}
        return Result([shown_text, f"[steptrail] {shown}: rev {got.rev}, sha256 {got.pre_hash},"
                       f" {len(got.content)} bytes ({part}). Your next write or edit of it is"
                       " fenced on this read."], data)

    def read_multiple_files(self, view: ClientView, paths: Sequence[str]) -> Result:
        if not paths:
            raise ToolFailure("give at least one path")
        if len(paths) > 100:
            raise ToolFailure(f"{len(paths)} paths: read at most 100 per call")
        files: list[dict[str, Any]] = []
        blocks: list[str] = []
        budget = self.ctx.limits.read_bytes
        for p in paths:
            try:
                ws, rel = self.ctx.resolve(p)
                shown = self.ctx.show(ws, rel)
                with self.ctx.lock:
                    got = self.ctx.read(ws, rel)
                if got.content is None:
                    raise ToolFailure(f"{shown} does not exist")
                if len(got.content) > budget:
                    raise ToolFailure(f"{shown}: the files of this call exceed"
                                      f" {self.ctx.limits.read_bytes} bytes; read it on its own")
                text = self.ctx.text(got.content, shown)
                budget -= len(got.content)
                self._seen_after_read(view, ws, rel, got)
                files.append({"path": shown, "rev": got.rev, "hash": got.pre_hash,
                              "size": len(got.content), "content": text})
                blocks.append(f"{shown} (rev {got.rev}, sha256 {got.pre_hash}):\n{text}")
            except Exception as exc:  # one file's failure is its own line, not the call's
                failure = self.ctx.fail(exc)
                files.append({"path": p, "error": str(failure)})
                blocks.append(f"{p}: Error - {failure}")
        return Result(["\n---\n".join(blocks)], {"files": files})

    # -- directories --------------------------------------------------------------------------

    def create_directory(self, view: ClientView, path: str) -> Result:
        ws, rel = self.ctx.resolve(path, directory=True)
        with self.ctx.lock:
            created = ws.fs.mkdir(rel)
        shown = self.ctx.show(ws, rel)
        text = (f"Created {shown}" + (f" ({len(created)} directories)" if len(created) > 1 else "")
                if created else f"{shown} already exists")
        return Result([text + ". (Directories are not steps: an empty directory holds no"
                       " content; the files you write in it are.)"],
                      {"path": shown, "created": [self.ctx.show(ws, c) for c in created]})

    def list_directory(self, view: ClientView, path: str, with_sizes: bool = False,
                       sort_by: str = "name") -> Result:
        ws, rel = self.ctx.resolve(path, directory=True)
        with self.ctx.lock:
            walk = ws.fs.list_dir(rel, max_entries=self.ctx.limits.list_entries)
        entries = walk.entries
        if sort_by == "size":
            entries = sorted(entries, key=lambda e: -e.size)
        tag = {"file": "[FILE]", "directory": "[DIR]", "symlink": "[LINK]", "other": "[OTHER]"}
        lines = [f"{tag[e.kind]} {e.name}" + (f"  {e.size}" if with_sizes and e.kind == "file" else "")
                 for e in entries]
        if walk.truncated:
            lines.append(f"... (truncated: {walk.why})")
        if with_sizes:
            total = sum(e.size for e in entries if e.kind == "file")
            lines.append(f"\n{sum(e.kind == 'file' for e in entries)} files,"
                         f" {sum(e.kind == 'directory' for e in entries)} directories, {total} bytes")
        return Result(["\n".join(lines) or "(empty)"], {
            "path": self.ctx.show(ws, rel), "truncated": walk.truncated,
            "entries": [{"name": e.name, "type": e.kind, **({"size": e.size} if e.kind == "file" else {})}
                        for e in entries]})

    def directory_tree(self, view: ClientView, path: str,
                       exclude_patterns: Sequence[str] = (), max_depth: int | None = None) -> Result:
        ws, rel = self.ctx.resolve(path, directory=True)
        depth = min(max_depth or self.ctx.limits.tree_depth, self.ctx.limits.tree_depth)
        if depth < 1:
            raise ToolFailure("maxDepth must be 1 or more")
        with self.ctx.lock:
            walk = ws.fs.walk(rel, max_entries=self.ctx.limits.tree_entries, max_depth=depth,
                              max_scan=self.ctx.limits.scan_entries,
                              deadline_s=self.ctx.limits.walk_seconds, exclude=list(exclude_patterns))
        root: list[dict[str, Any]] = []
        nodes: dict[str, list[dict[str, Any]]] = {rel: root}
        for e in walk.entries:
            parent = e.path.rpartition("/")[0] if "/" in e.path else ""
            siblings = nodes.get(parent)
            if siblings is None:
                continue
            node: dict[str, Any] = {"name": e.name, "type": e.kind}
            if e.kind == "directory":
                node["children"] = nodes[e.path] = []
            siblings.append(node)
        import json
        data: dict[str, Any] = {"path": self.ctx.show(ws, rel), "tree": root,
                                "truncated": walk.truncated}
        text = json.dumps(root, indent=2)
        if walk.truncated:
            data["why"] = walk.why
            text += f"\n(truncated: {walk.why}; list a subdirectory, or narrow excludePatterns)"
        return Result([text], data)

    def search_files(self, view: ClientView, path: str, pattern: str,
                     exclude_patterns: Sequence[str] = ()) -> Result:
        ws, rel = self.ctx.resolve(path, directory=True)
        if not isinstance(pattern, str) or not pattern:
            raise ToolFailure("give a pattern, e.g. '*.py' or 'src/**/test_*.py'")
        plain = not any(c in pattern for c in "*?[")
        with self.ctx.lock:
            walk = ws.fs.walk(rel, max_entries=self.ctx.limits.scan_entries,
                              max_depth=64, max_scan=self.ctx.limits.scan_entries,
                              deadline_s=self.ctx.limits.walk_seconds, exclude=list(exclude_patterns))
        hits: list[Entry] = []
        for e in walk.entries:
            inside = e.path[len(rel):].lstrip("/") if rel else e.path
            ok = (pattern.casefold() in e.name.casefold()) if plain else (
                glob_match(inside, pattern) or glob_match(e.path, pattern))
            if ok:
                hits.append(e)
                if len(hits) >= self.ctx.limits.search_results:
                    break
        truncated = walk.truncated or len(hits) >= self.ctx.limits.search_results
        lines = [self.ctx.show(ws, e.path) + ("/" if e.kind == "directory" else "") for e in hits]
        if truncated:
            lines.append(f"... (truncated: {walk.why or f'more than {self.ctx.limits.search_results} matches'})")
        return Result(["\n".join(lines) or "No matches found"], {
            "path": self.ctx.show(ws, rel), "pattern": pattern, "truncated": truncated,
            "matches": [{"path": self.ctx.show(ws, e.path), "type": e.kind} for e in hits]})

    def get_file_info(self, view: ClientView, path: str) -> Result:
        ws, rel = self.ctx.resolve(path, directory=True)
        shown = self.ctx.show(ws, rel)
        with self.ctx.lock:
            st = ws.fs.lstat(rel)
            if st is None:
                raise ToolFailure(f"{shown} does not exist")
            info: dict[str, Any] = {
                "path": shown, "type": ("file" if stat.S_ISREG(st.st_mode) else "directory"
                                        if stat.S_ISDIR(st.st_mode) else "symlink"
                                        if stat.S_ISLNK(st.st_mode) else "other"),
                "size": st.st_size, "modified": iso(st.st_mtime_ns),
                "accessed": iso(st.st_atime_ns), "changed": iso(st.st_ctime_ns),
                "permissions": oct(stat.S_IMODE(st.st_mode))[2:]}
            if stat.S_ISREG(st.st_mode) and rel:
                rev, digest = self.ctx.ledger.workspaces.snapshot(ws.name, rel)
                info.update(rev=rev, hash=digest)
        return Result(["\n".join(f"{k}: {v}" for k, v in info.items())], info)

    def list_allowed_directories(self, view: ClientView) -> Result:
        lines = [f"{w.root}" + (" (default: relative paths are inside it)" if w is self.ctx.default
                                else "") for w in self.ctx.workspaces]
        return Result(["Allowed directories (steptrail workspaces):\n" + "\n".join(lines)], {
            "directories": [{"path": w.root, "workspace": w.name, "default": w is self.ctx.default}
                            for w in self.ctx.workspaces]})


__all__ = ["Listing"]

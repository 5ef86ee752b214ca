"""The blob inventory: every stored blob (inline rows, files) and leftover temporary
file, with what holds it (`Ledger.blob_list`, `steptrail blob list`). Read-only."""

from __future__ import annotations

from typing import Any


def list_blobs(log: Any, store: Any, files: Any) -> list[dict[str, Any]]:
    """Every stored blob (inline rows, files) and leftover temporary file, with its
    holders: `referenced` (named by some manifest revision) and `pinned`."""
    from ..projections import read_refs

    refs = read_refs(log)
    referenced = {e.digest for e in refs.entries}
    pinned = {d for (_s, _a, d) in refs.pins}
    out: list[dict[str, Any]] = []
    with store.read() as view:
        for b in view.inline_blobs():
            out.append({"digest": b.digest, "size": b.size, "where": "inline",
                        "mtime_ns": b.mtime_ns, "referenced": b.digest in referenced,
                        "pinned": b.digest in pinned})
    for f in files.scan():
        out.append({"digest": f.digest, "size": f.size, "where": "file",
                    "mtime_ns": f.mtime_ns, "referenced": f.digest in referenced,
                    "pinned": f.digest in pinned})
    for t in files.temp_files():
        out.append({"digest": None, "name": t.name, "size": t.size, "where": "temp",
                    "mtime_ns": t.mtime_ns, "referenced": False, "pinned": False})
    return out


__all__ = ["list_blobs"]

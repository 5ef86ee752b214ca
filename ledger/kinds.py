"""Every event kind in words, once: what it means (one line) and its detail line.

The command line (``show``, ``events``, ``seal show``), the UI (each event's row, its
tooltip and the glossary), ``status`` and the MCP server read these, and nothing else
words a kind: a kind added to `ledger.events.KIND_SPECS` without its entry here fails
tests/log/test_kinds.py, and `describe` has no fallback (a KeyError names the kind).

>>> from ledger.kinds import describe, detail, means
>>> means("fenced")
"the step's writes were checked against the bytes it read, and applied"
>>> from ledger.events import Acked
>>> detail(Acked(step="build-1", attempt=1, manifest_rev=0))
'acknowledged (manifest r0)'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from .events import Event, kind_of, to_builtins
from .fmt import count, shown
from .fmt import iso as _iso

#: The fields every step event carries, shown in their own columns, not in the detail.
_COLUMNS: Final = frozenset({"kind", "step", "attempt", "run", "workspace", "epoch"})


def fields(event: Event) -> str:
    """An event's own fields as ``key=value`` (its columns — step, attempt, run,
    workspace, epoch — left out; empty values left out; a time in ISO 8601; a digest
    cut to 12 characters; a list by its paths; a compensation's paths by outcome)."""
    ev = to_builtins(event)
    parts = []
    for k, v in ev.items():
        if k in _COLUMNS or (v in ((), [], None, "", False) and k != "expected_rev"):
            continue
        if k.endswith("_ns") and isinstance(v, int) and not isinstance(v, bool):
            k, v = k[:-3], _iso(v)  # a time, printed as every time is
        if isinstance(v, bool):
            v = "true" if v else "false"
        if isinstance(v, str) and len(v) == 64:
            v = v[:12] + "…"
        if k == "restored" and isinstance(v, list | tuple):
            # what a compensation did, per outcome: a conflict is not shown as restored
            by: dict[str, list[str]] = {}
            for x in v:
                by.setdefault(x.get("outcome", "restored"), []).append(x.get("path", "?"))
            parts.extend(f"{outcome}={','.join(paths)}" for outcome, paths in by.items())
            continue
        if isinstance(v, list | tuple):
            v = ",".join(x if isinstance(x, str) else x.get("path", "?") for x in v)
        parts.append(f"{k}={v}")
    return " ".join(parts)


class Described(NamedTuple):
    """One kind in words: `means`, one line a person reads (a tooltip, the glossary);
    `detail`, the line that shows one event of the kind."""

    means: str
    detail: Callable[[Any], str]


def _h(digest: str | None) -> str:
    return "absent" if digest is None else digest[:12]


def _listed(items: list[str], most: int = 5) -> str:
    more = len(items) - most
    return ", ".join(items[:most]) + (f" (+{more} more)" if more > 0 else "")


def _planned(e: Any) -> str:
    parts = [f"by {e.run}" if e.run else "planned"]
    if e.writes:
        parts.append(f"writes {_listed([w.path for w in e.writes])}")
    if e.artifacts:
        parts.append(f"artifacts {_listed(list(e.artifacts))}")
    if e.workspace:
        parts.append(f"at rev {e.rev}" + ("" if e.fence == "step" else f", fence {e.fence}")
                     + ("" if e.journal else ", journal off")
                     + (", irreversible" if e.irreversible else ""))
    return "; ".join(parts)


def _fenced(e: Any) -> str:
    writes = [f"{w.path} rev {w.rev}" for w in e.writes]
    return (f"applied at rev {e.rev}: {_listed(writes)}"
            + (" (found on disk after a crash)" if e.settled else ""))


def _outcomes(entries: Any) -> str:
    return _listed([f"{x.path} {x.outcome}" + (f" (kept as {x.kept})" if x.kept else "")
                    for x in entries])


def _compensated(e: Any) -> str:
    return (e.reason or "undone") + (f": {_outcomes(e.restored)}" if e.restored
                                     else ": nothing to restore")


def _rejected(e: Any) -> str:
    return (f"refused ({e.reason})" + (f": {e.detail}" if e.detail else "")
            + (f"; put back: {_outcomes(e.undone)}" if e.undone else ""))


def _published(e: Any) -> str:
    return (f"committed: manifest r{e.manifest_rev} {_h(e.digest)}, {len(e.writes)} write(s),"
            f" {len(e.artifacts)} artifact(s)"
            + (f", superseding {_h(e.supersedes)}" if e.supersedes else ""))


def _lease(e: Any) -> str:
    return (f"epoch {e.epoch} by {e.holder}, expires {_iso(e.expires_ns)}"
            + (" (forced: a live lease taken over)" if e.forced else "")
            + (" (a bare lease)" if e.bare else ""))


def _registered(e: Any) -> str:
    return e.root + (" (.git writable)" if e.allow_git else "")


#: Every kind of `ledger.events.KIND_SPECS`, in words (tests/log/test_kinds.py holds them
#: equal).
DESCRIBED: Final[dict[str, Described]] = {
    "planned": Described(
        "the step's plan is recorded: what it will write, read against which bytes,"
        " before anything is written", _planned),
    "observed": Described(
        "changes made outside the steps (a person, a shell, a tool), found on disk and"
        " recorded as this step's writes; no byte was moved",
        lambda e: f"asked by {e.by}" + (f" ({e.label})" if e.label else "")
                  + (", the workspace's baseline" if e.baseline else "")
                  + (f"; {e.not_captured_total} file(s) not captured"
                     if e.not_captured_total else "")),
    "fenced": Described(
        "the step's writes were checked against the bytes it read, and applied", _fenced),
    "blob-pinned": Described(
        "a blob held for an attempt in flight, so gc keeps it",
        lambda e: f"pins the {e.role} {_h(e.digest)}"),
    "blob-stored": Described(
        "an artifact's bytes are stored, content-addressed",
        lambda e: f"{e.path or 'a blob'}: {count(e.size, 'byte')} {_h(e.digest)}"
                  f" ({'in the ledger' if e.inline else 'a blob file'})"),
    "manifest-published": Described(
        "committed: the step's result is published (its manifest); an ack is still owed",
        _published),
    "acked": Described(
        "committed and acknowledged: done",
        lambda e: f"acknowledged (manifest r{e.manifest_rev})"),
    "compensating": Described(
        "the step's writes are being undone (the intent, recorded before any file is"
        " touched)", lambda e: "undoing" + (f": {e.reason}" if e.reason else "")),
    "compensated": Described(
        "the step's writes were undone where that was safe; a path someone changed since"
        " is left as found", _compensated),
    "rejected": Described(
        "refused: a file was not what the step read (or its lease moved on); nothing of"
        " it stayed", _rejected),
    "workspace-added": Described(
        "a directory registered as a workspace, with its device and inode", _registered),
    "workspace-restored": Described(
        "a workspace's committed content restored into a directory, registered there",
        lambda e: f"{e.root} at rev {e.rev}, {e.paths} path(s)"),
    "workspace-rebound": Described(
        "a workspace registered again: moved, restored by other means, or the ledger's"
        " new place", _registered),
    "lease-acquired": Described(
        "a new epoch began on a workspace: its holder's writes count, older epochs' are"
        " settled", _lease),
    "lease-renewed": Described(
        "a live lease was extended",
        lambda e: f"epoch {e.epoch}, expires {_iso(e.expires_ns)}"),
    "lease-released": Described(
        "a lease was given up", lambda e: f"epoch {e.epoch} released"),
    "blob-collected": Described(
        "gc removed a blob no manifest or pin holds",
        lambda e: f"{_h(e.digest)}, {count(e.size, 'byte')} ({e.reason})"
                  + (f", collection {e.collection}" if e.collection else "")),
    "witness-anchored": Described(
        "the ledger's head recorded in its witness (a copy kept elsewhere that catches a"
        " cut tail)",
        lambda e: f"{e.witness} at #{e.head_seq} (was {e.previous_state})"
                  + (" (forced)" if e.forced else "")),
    "held": Described(
        "a run or a step held: kept out of seal, and its blobs out of gc, until released",
        lambda e: f"{e.scope} {e.target}" + (f": {e.reason}" if e.reason else "")
                  + (f" (by {e.by})" if e.by else "")),
    "hold-released": Described(
        "a hold released: seal and gc treat the run or step as before",
        lambda e: f"{e.scope} {e.target}" + (f" (by {e.by})" if e.by else "")),
    "history-released": Described(
        "a retention policy let old versions of a workspace's files go: gc may collect"
        " their bytes; the events that recorded them stay",
        lambda e: f"workspace {e.workspace}: {count(len(e.versions), 'version')}"
                  + (f", keep {e.keep_s / 86400:g} day(s)" if e.keep_s else "")
                  + (f", keep the last {e.keep_versions}" if e.keep_versions else "")
                  + (f" (by {e.by})" if e.by else "")),
    "run-sealed": Described(
        "a finished run's events archived and removed from the ledger, their chain kept",
        lambda e: f"run {e.sealed_run}: {e.events} event(s) to {e.archive}"
                  f" {_h(e.archive_digest)}"),
}


def describe(kind: str) -> Described:
    """Kind `kind` in words (KeyError for a kind that is not one: no fallback)."""
    return DESCRIBED[kind]


def means(kind: str) -> str:
    """What an event of kind `kind` means, in one line."""
    return DESCRIBED[kind].means


def detail(event: Event) -> str:
    """The line that shows `event` (its kind's `Described.detail`), one line whatever
    its text holds: a reason, a detail or a directory name with a newline or a terminal
    escape in it is written out escaped (`ledger.fmt.shown`), never as a line of its own."""
    return shown(DESCRIBED[kind_of(event)].detail(event))


__all__ = ["DESCRIBED", "Described", "describe", "detail", "fields", "means"]

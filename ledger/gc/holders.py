"""What holds a blob: the facts GC and audit both stand on, read from the ledger.

- referenced: named by any manifest revision (`manifest-published`, read from the
  events themselves and cross-checked against the projection) or by any compensation
  record (the pre-image it put back: `restore` needs it);
- pinned: a live pin (`pins`), except a pre-image pin of an acked step whose
  compensation window has passed (it can no longer be compensated);
- otherwise an orphan, young or old by its age (a file's mtime, an inline row's
  `stored_ns`; both freshened by a dedup hit).

A record can be let go of: a step's manifest revisions by its releasing compensation (a
pruned checkpoint), a workspace version by a retention policy (`history-released`: the
records of its (step, path, digest) made before it — a manifest's write or a
compensation's put-back, never an artifact). A released record holds nothing, unless a
hold in force covers its step or run and its bytes were not collected before the hold
was placed. Whatever a release says, the current content of every path stays referenced.

Any doubt raises `GcRefused`: an event that cannot be decoded, a projection that
disagrees with the events, a referenced blob that is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Union

import msgspec

from ..errors import GcRefused
from ..store import BlobIndex, EventQuery, EventReader, PinHold, ReadView
from ..events import BLOB_NAMING_KINDS, READ_VERSION


#: 64 characters, checked as decoded; that they are lower-case hex is checked for all the
#: digests of a read at once (`_check_hex`): one regex, not one per digest.
_Digest64 = Annotated[str, msgspec.Meta(min_length=64, max_length=64)]
_LOWER_HEX: Final = re.compile(r"[0-9a-f]*")


class _Ref(msgspec.Struct):
    digest: _Digest64
    path: str = ""


class _Restored(msgspec.Struct):
    digest: _Digest64 | None = None
    outcome: str = "restored"
    path: str = ""


class _Version(msgspec.Struct):
    step: str
    path: str
    digest: _Digest64


def _check_hex(digests: set[str], what: str) -> None:
    """Fail closed on a digest that is not lower-case hex (the decoder checked lengths)."""
    if _LOWER_HEX.fullmatch("".join(digests)) is None:
        bad = sorted(d for d in digests if _LOWER_HEX.fullmatch(d) is None)[:3]
        raise GcRefused(f"{what} names a malformed digest: {bad}")


class _Published(msgspec.Struct, tag="manifest-published", tag_field="kind"):
    step: str = ""
    run: str = ""
    manifest_rev: int = 0
    writes: tuple[_Ref, ...] = ()
    artifacts: tuple[_Ref, ...] = ()


class _Held(msgspec.Struct, tag="held", tag_field="kind"):
    scope: str = ""
    target: str = ""
    n: int = 0


class _HoldReleased(msgspec.Struct, tag="hold-released", tag_field="kind"):
    scope: str = ""
    target: str = ""
    n: int = 0


class _Compensated(msgspec.Struct, tag="compensated", tag_field="kind"):
    step: str = ""
    run: str = ""
    restored: tuple[_Restored, ...] = ()
    release: bool = False


class _HistoryReleased(msgspec.Struct, tag="history-released", tag_field="kind"):
    workspace: str = ""
    versions: tuple[_Version, ...] = ()


class _Collected(msgspec.Struct, tag="blob-collected", tag_field="kind"):
    digest: _Digest64
    reason: str = "orphan"


#: The `blob-collected` reason of a file copy of a blob whose inline row stays: its
#: bytes are still stored (the collector writes it; a collection of it is not a loss).
COPY_REASON: Final = "a file copy of an inline blob"

#: Reads only the digests a manifest or a compensation names (still validated: a bad
#: digest fails closed), not the whole event: GC and audit decode every one of them.
_refs_decoder = msgspec.json.Decoder(Union[_Published, _Compensated, _Held, _HoldReleased,
                                           _HistoryReleased, _Collected])
#: The kinds whose events this reads: what names blobs, the holds (a held run's or step's
#: releasing compensation releases nothing) and the versions a retention policy released
#: (and, only where a hold covers something released, the collections: a hold placed
#: after its bytes were collected holds nothing).
_KINDS: Final = BLOB_NAMING_KINDS | {"held", "hold-released", "history-released"}


@dataclass
class Holders:
    """Every digest that is referenced, and the live pins (digest -> its pin facts)."""

    referenced: set[str] = field(default_factory=set)
    compensation_refs: set[str] = field(default_factory=set)
    manifest_refs: set[str] = field(default_factory=set)
    head_seq: int = 0
    #: step -> the newest manifest revision a releasing compensation let go of: that
    #: revision and the older ones no longer hold their blobs (unless held).
    released: dict[str, int] = field(default_factory=dict)
    #: (step, path, digest) of the workspace versions a retention policy released
    #: (`history-released`) -> the seq of its latest release: the records of that key
    #: made before it hold nothing (unless held); one made after it does.
    history: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: (step, manifest revision) -> the seq of its `manifest-published`.
    published: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (step, manifest revision, path, digest) of the manifests' artifacts: a retention
    #: policy releases versions of workspace files, never an artifact.
    artifacts: set[tuple[str, int, str, str]] = field(default_factory=set)
    #: (scope, target) of each hold in force -> the seq it was placed at.
    holds_in_force: dict[tuple[str, str], int] = field(default_factory=dict)
    #: step -> its run (for the run holds).
    runs: dict[str, str] = field(default_factory=dict)
    #: digest -> the seq of its latest collection (a file copy's aside).
    collected: dict[str, int] = field(default_factory=dict)

    def held_since(self, step: str) -> int | None:
        """The seq since which a hold in force covers `step` (of it, or of its run)."""
        run = self.runs.get(step, "")
        found = [seq for key, seq in self.holds_in_force.items()
                 if key == ("step", step) or (run and key == ("run", run))]
        return min(found, default=None)

    def record_holds(self, step: str, seq: int, digest: str, *, rev: int | None = None,
                     path: str = "", artifact: bool = False) -> bool:
        """Whether a record of `step` made at `seq` — a manifest entry of revision `rev`,
        or (`rev` None) a compensation's put-back — naming `path` with `digest` still
        holds its blob: not released (by a releasing compensation, or by a retention
        policy after it), or released and held since — unless its bytes were collected
        between the record and the hold (nothing can bring them back)."""
        released = rev is not None and rev <= self.released.get(step, -1)
        if not artifact and self.history.get((step, path, digest), -1) > seq:
            released = True
        if not released:
            return True
        since = self.held_since(step)
        if since is None:
            return False
        gone = self.collected.get(digest)
        return not (gone is not None and seq < gone < since)

    def entry_holds(self, step: str, manifest_rev: int, path: str = "",
                    digest: str = "") -> bool:
        """Whether a manifest entry of (step, revision) — naming `path` with `digest` —
        still holds its blob (one published after these were read: yes)."""
        seq = self.published.get((step, manifest_rev))
        if seq is None:
            return True
        return self.record_holds(step, seq, digest, rev=manifest_rev, path=path,
                                 artifact=(step, manifest_rev, path, digest) in self.artifacts)

    def holds(self, digest: str) -> bool:
        return digest in self.referenced


def read_references(conn: ReadView, *, cross_check: bool = True,
                    assume_released: set[tuple[str, str, str]] | frozenset[Any] = frozenset()
                    ) -> Holders:
    """Referenced digests, from the events (ground truth), checked against the tables.

    GC cross-checks (fail closed: it is about to delete); audit, which only reports,
    takes the manifests from the tables and decodes only the compensation records.
    `assume_released`: (step, path, digest) versions counted as released by a retention
    policy too, after every record (what a dry run would let go)."""
    out = Holders()
    out.head_seq = conn.head().seq
    # Manifests are read from the events either way: a releasing compensation (a
    # pruned checkpoint) un-references the revisions its step published before it.
    latest: dict[str, int] = {}
    # (step, revision, seq, entries: (path, digest, is an artifact))
    by_manifest: list[tuple[str, int, int, list[tuple[str, str, bool]]]] = []
    holds: dict[tuple[str, str], tuple[int, int]] = {}  # (scope, target) -> (n, seq)
    restores: list[tuple[str, int, str, str]] = []  # (step, seq, path, digest) put back
    for row in conn.events(EventQuery(kinds=_KINDS)):
        seq, kind, v, payload = row.seq, row.kind, row.v, row.payload
        try:
            if v > READ_VERSION:
                raise ValueError(f"event version {v} is newer than this steptrail")
            event = _refs_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise GcRefused(f"{kind} event #{seq} cannot be decoded ({exc})") from None
        if isinstance(event, _Published):
            entries = [(e.path, e.digest, False) for e in event.writes]
            entries += [(e.path, e.digest, True) for e in event.artifacts]
            out.manifest_refs.update(d for _p, d, _a in entries)
            by_manifest.append((event.step, event.manifest_rev, seq, entries))
            out.published[(event.step, event.manifest_rev)] = seq
            out.artifacts.update((event.step, event.manifest_rev, e.path, e.digest)
                                 for e in event.artifacts)
            out.runs[event.step] = event.run
            latest[event.step] = max(latest.get(event.step, -1), event.manifest_rev)
        elif isinstance(event, _Compensated):
            put_back = [(event.step, seq, r.path, r.digest) for r in event.restored
                        if r.outcome != "conflict" and r.digest is not None]
            out.compensation_refs.update(d for _s, _q, _p, d in put_back)
            restores.extend(put_back)
            out.runs.setdefault(event.step, event.run)
            if event.release and event.step in latest:
                out.released[event.step] = latest[event.step]
        elif isinstance(event, _Held):
            holds[(event.scope, event.target)] = (event.n, seq)
        elif isinstance(event, _HoldReleased):
            if holds.get((event.scope, event.target), (None, 0))[0] == event.n:
                del holds[(event.scope, event.target)]
        elif isinstance(event, _HistoryReleased):
            for x in event.versions:
                out.history[(x.step, x.path, x.digest)] = seq
    for key in assume_released:
        out.history[key] = out.head_seq + 1
    out.holds_in_force = {key: seq for key, (_n, seq) in holds.items()}
    if out.holds_in_force and (out.released or out.history):
        for row in conn.events(EventQuery(kinds=frozenset({"blob-collected"}))):
            try:
                if row.v > READ_VERSION:
                    raise ValueError(f"event version {row.v} is newer than this steptrail")
                gone = _refs_decoder.decode(row.payload)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                raise GcRefused(f"blob-collected event #{row.seq} cannot be decoded ({exc})")\
                    from None
            if isinstance(gone, _Collected) and gone.reason != COPY_REASON:
                out.collected[gone.digest] = row.seq
    _check_hex({d for _s, _p, d in out.history}, "a history release")
    _check_hex(out.manifest_refs, "a manifest")
    _check_hex(out.compensation_refs, "a compensation record")
    table = conn.manifest_digests()
    if not cross_check:
        out.manifest_refs = table
    if table != out.manifest_refs:
        extra = sorted(table - out.manifest_refs)[:3]
        missing = sorted(out.manifest_refs - table)[:3]
        raise GcRefused(f"the manifest tables disagree with the events (unexpected {extra},"
                        f" missing {missing})", ("rebuild them with ledger.rebuild()",
                                                 "run 'steptrail rebuild'"))
    held = out.manifest_refs
    put_back = out.compensation_refs
    if out.released or out.history:
        held = {d for step, rev, seq, entries in by_manifest for path, d, artifact in entries
                if out.record_holds(step, seq, d, rev=rev, path=path, artifact=artifact)}
        put_back = {d for step, seq, path, d in restores
                    if out.record_holds(step, seq, d, path=path)}
    out.referenced = held | put_back
    if out.history:
        # Whatever a release names, the current content of every path stays (the one
        # rule no policy, nor a release written by hand, can change): a digest a record
        # names and a workspace's path holds now is referenced.
        current = {str(row[3]) for row in conn.path_rows() if row[3]}
        out.referenced |= current & (out.manifest_refs | out.compensation_refs)
    return out


def holds_placed_since(conn: EventReader, seq: int) -> bool:
    """Whether a hold was placed after `seq` (the collector's re-check: a hold placed
    while it runs may keep what its first read found released)."""
    return any(True for _row in conn.events(EventQuery(after_seq=seq,
                                                       kinds=frozenset({"held"}))))


def compensation_refs_since(conn: EventReader, seq: int) -> set[str]:
    """Digests compensations recorded after `seq` (the collector's re-check)."""
    out: set[str] = set()
    for row in conn.events(EventQuery(after_seq=seq, kinds=frozenset({"compensated"}))):
        event = _refs_decoder.decode(row.payload)
        assert isinstance(event, _Compensated)
        out.update(r.digest for r in event.restored if r.outcome != "conflict" and r.digest)
    _check_hex(out, "a compensation record")
    return out


def live_pins(conn: BlobIndex, now_ns: int, window_ns: int) -> dict[str, str]:
    """digest -> the role of a pin that still holds it."""
    out: dict[str, str] = {}
    for hold in conn.pin_holds():
        if not _pin_expired(hold, now_ns, window_ns):
            out.setdefault(hold.digest, hold.role)
    return out


def pinned_now(conn: BlobIndex, digest: str, now_ns: int, window_ns: int) -> bool:
    """Whether a live pin holds `digest` (the collector's re-check, inside its lock)."""
    return any(not _pin_expired(h, now_ns, window_ns) for h in conn.pin_holds(digest))


def _pin_expired(hold: PinHold, now_ns: int, window_ns: int) -> bool:
    """A pre-image pin stops holding once its step is acked and the compensation window
    has passed (docs/design.md "GC"); every other live pin holds."""
    _digest, role, state, pinned_attempt, attempt, updated_ns = hold
    return (role == "pre-image" and state == "acked" and attempt == pinned_attempt
            and updated_ns is not None and now_ns - updated_ns > window_ns)


__all__ = ["COPY_REASON", "GcRefused", "Holders", "compensation_refs_since",
           "holds_placed_since", "live_pins", "pinned_now", "read_references"]

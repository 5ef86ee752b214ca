"""What holds a blob: the facts GC and audit both stand on, read from the ledger.

- referenced: named by any manifest revision (`manifest-published`, read from the
  events themselves and cross-checked against the projection) or by any compensation
  record (the pre-image it put back: `restore` needs it);
- pinned: a live pin (`pins`), except a pre-image pin of an acked step whose
  compensation window has passed (it can no longer be compensated);
- otherwise an orphan, young or old by its age (a file's mtime, an inline row's
  `stored_ns`; both freshened by a dedup hit).

Any doubt raises `GcRefused`: an event that cannot be decoded, a projection that
disagrees with the events, a referenced blob that is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Final, Union

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


class _Restored(msgspec.Struct):
    digest: _Digest64 | None = None
    outcome: str = "restored"


def _check_hex(digests: set[str], what: str) -> None:
    """Fail closed on a digest that is not lower-case hex (the decoder checked lengths)."""
    if _LOWER_HEX.fullmatch("".join(digests)) is None:
        bad = sorted(d for d in digests if _LOWER_HEX.fullmatch(d) is None)[:3]
        raise GcRefused(f"{what} names a malformed digest: {bad}")


class _Published(msgspec.Struct, tag="manifest-published", tag_field="kind"):
    step: str = ""
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


#: Reads only the digests a manifest or a compensation names (still validated: a bad
#: digest fails closed), not the whole event: GC and audit decode every one of them.
_refs_decoder = msgspec.json.Decoder(Union[_Published, _Compensated, _Held, _HoldReleased])
#: The kinds whose events this reads: what names blobs, and the holds (a held run's or
#: step's releasing compensation releases nothing).
_KINDS: Final = BLOB_NAMING_KINDS | {"held", "hold-released"}


@dataclass
class Holders:
    """Every digest that is referenced, and the live pins (digest -> its pin facts)."""

    referenced: set[str] = field(default_factory=set)
    compensation_refs: set[str] = field(default_factory=set)
    manifest_refs: set[str] = field(default_factory=set)
    head_seq: int = 0
    #: step -> the newest manifest revision a releasing compensation let go of: that
    #: revision and the older ones no longer hold their blobs.
    released: dict[str, int] = field(default_factory=dict)

    def entry_holds(self, step: str, manifest_rev: int) -> bool:
        """Whether a manifest entry of (step, revision) still holds its blob."""
        return manifest_rev > self.released.get(step, -1)

    def holds(self, digest: str) -> bool:
        return digest in self.referenced


def read_references(conn: ReadView, *, cross_check: bool = True) -> Holders:
    """Referenced digests, from the events (ground truth), checked against the tables.

    GC cross-checks (fail closed: it is about to delete); audit, which only reports,
    takes the manifests from the tables and decodes only the compensation records."""
    out = Holders()
    out.head_seq = conn.head().seq
    # Manifests are read from the events either way: a releasing compensation (a
    # pruned checkpoint) un-references the revisions its step published before it.
    latest: dict[str, int] = {}
    by_manifest: list[tuple[str, int, list[str]]] = []
    holds: dict[tuple[str, str], int] = {}
    releasing: list[tuple[str, str]] = []  # (step, run) of each releasing compensation
    for row in conn.events(EventQuery(kinds=_KINDS)):
        seq, kind, v, payload = row.seq, row.kind, row.v, row.payload
        try:
            if v > READ_VERSION:
                raise ValueError(f"event version {v} is newer than this steptrail")
            event = _refs_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise GcRefused(f"{kind} event #{seq} cannot be decoded ({exc})") from None
        if isinstance(event, _Published):
            digests = [e.digest for e in (*event.writes, *event.artifacts)]
            out.manifest_refs.update(digests)
            by_manifest.append((event.step, event.manifest_rev, digests))
            latest[event.step] = max(latest.get(event.step, -1), event.manifest_rev)
        elif isinstance(event, _Compensated):
            out.compensation_refs.update(r.digest for r in event.restored
                                         if r.outcome != "conflict" and r.digest is not None)
            if event.release and event.step in latest:
                out.released[event.step] = latest[event.step]
                releasing.append((event.step, event.run))
        elif isinstance(event, _Held):
            holds[(event.scope, event.target)] = event.n
        elif isinstance(event, _HoldReleased):
            if holds.get((event.scope, event.target)) == event.n:
                del holds[(event.scope, event.target)]
    for step, run in releasing:  # a held step's (or run's) blobs stay held
        if ("step", step) in holds or (run and ("run", run) in holds):
            out.released.pop(step, None)
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
    if out.released:
        held = {d for step, rev, digests in by_manifest if out.entry_holds(step, rev)
                for d in digests}
    out.referenced = held | out.compensation_refs
    return out


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


__all__ = ["GcRefused", "Holders", "compensation_refs_since", "live_pins", "pinned_now",
           "read_references"]

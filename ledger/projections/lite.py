"""Fold-only decoding: the four kinds every step has, read with just what the folds use.

A full `events.decode` checks every field constraint of every event (patterns on ids
and digests, path rules in ``__post_init__``): 3-9 µs an event, most of a rebuild.
The folds need a few fields of the hot kinds — `planned`, `blob-stored`,
`manifest-published`, `acked` — so those are decoded here into slim structs that
carry exactly the attributes the folds read (same names, same tag), with types still
checked (a damaged payload is still a decode error) but no constraint checks. Every
other kind is decoded in full.

Why skipping the constraints is sound: every payload was validated in full when it
was appended; a payload changed since breaks the hash chain, which `verify` checks
with the full decoder; and projection tables are derived data, never more trusted
than the tables of the same file. The folds dispatch on the kind (the tag), so they
take a slim event and a full one alike.
"""

from __future__ import annotations

from typing import Final, Union

import msgspec

from ..events import EVENT_VERSION, AnyEvent, decode


class _Slim(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    step: str
    attempt: int
    run: str = ""
    workspace: str = ""
    epoch: int = 0


class SlimPlanned(_Slim, frozen=True, kw_only=True, tag="planned"):
    rev: int = 0


class SlimStored(_Slim, frozen=True, kw_only=True, tag="blob-stored"):
    size: int


class SlimEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    path: str
    digest: str
    size: int


class SlimPublished(_Slim, frozen=True, kw_only=True, tag="manifest-published"):
    manifest_rev: int
    expected_rev: int = -1
    digest: str
    supersedes: str | None = None
    writes: tuple[SlimEntry, ...] = ()
    artifacts: tuple[SlimEntry, ...] = ()


class SlimAcked(_Slim, frozen=True, kw_only=True, tag="acked"):
    manifest_rev: int


SlimEvent = Union[SlimPlanned, SlimStored, SlimPublished, SlimAcked]
#: The kinds decoded slim.
SLIM_KINDS: Final = frozenset({"planned", "blob-stored", "manifest-published", "acked"})
_slim = msgspec.json.Decoder(SlimEvent)


def decode_for_fold(kind: str, payload: bytes, v: int) -> AnyEvent | SlimEvent:
    """The event of a row, as the folds need it (slim for the hot kinds)."""
    if kind in SLIM_KINDS and v <= EVENT_VERSION:
        event = _slim.decode(payload)
        if event.__struct_config__.tag != kind:
            raise msgspec.ValidationError(f"the payload is a {event.__struct_config__.tag!r}"
                                          f" event, the row says {kind!r}")
        return event
    return decode(payload, v)


__all__ = ["SLIM_KINDS", "SlimEvent", "decode_for_fold"]

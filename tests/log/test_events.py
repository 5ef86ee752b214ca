"""Events: validation at the boundary, encoding, journal keys and the chain hash."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import (
    Acked,
    AppliedWrite,
    BlobCollected,
    BlobPinned,
    BlobStored,
    Compensated,
    Fenced,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    Ledger,
    ManifestEntry,
    ManifestPublished,
    Planned,
    PlannedWrite,
    Rejected,
    Restored,
    WorkspaceAdded,
    WorkspaceRebound,
    WorkspaceRestored,
    journal_key,
)
from ledger import events as ev

GOOD = "0123456789abcdef" * 4
D1, D2 = "1" * 64, "2" * 64

# --- validation at the boundary --------------------------------------------------------

BAD_STEP_IDS = [
    pytest.param("", id="empty"),
    pytest.param("x" * (ev.STEP_ID_MAX + 1), id="too-long"),
    pytest.param("step\n", id="trailing-newline"),
    pytest.param("\nstep", id="leading-newline"),
    pytest.param("st\x00ep", id="nul"),
    pytest.param("step\x00", id="trailing-nul"),
    pytest.param("a\tb", id="tab"),
    pytest.param("a\rb", id="cr"),
    pytest.param("a\x1bb", id="escape"),
    pytest.param("a\x7f", id="del"),
]

BAD_DIGESTS = [
    pytest.param("", id="empty"),
    pytest.param(GOOD[:63], id="63-chars"),
    pytest.param(GOOD + "0", id="65-chars"),
    pytest.param(GOOD.upper(), id="uppercase"),
    pytest.param("A" + GOOD[1:], id="one-uppercase"),
    pytest.param("g" + GOOD[1:], id="non-hex"),
    pytest.param(" " + GOOD[1:], id="space"),
    pytest.param(GOOD + "\n", id="trailing-newline"),
    pytest.param("\n" + GOOD, id="leading-newline"),
    pytest.param(GOOD[:32], id="half"),
]

BAD_PATHS = [
    pytest.param("", id="empty"),
    pytest.param("..", id="dotdot"),
    pytest.param("../etc/passwd", id="dotdot-prefix"),
    pytest.param("a/../b", id="dotdot-middle"),
    pytest.param("a/..", id="dotdot-suffix"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("a//b", id="double-slash"),
    pytest.param("./a", id="dot-prefix"),
    pytest.param("a/./b", id="dot-middle"),
    pytest.param(".", id="dot"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("..\\x", id="backslash-dotdot"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a/", id="trailing-slash"),
    pytest.param("x" * (ev.PATH_MAX + 1), id="too-long"),
]

GOOD_PATHS = ["a", "src/app.py", "a.b/c..d", "..a/b..", ".hidden/x", "dir with space/f", "ü/ß"]


def unchecked(struct: Any, **fields: Any) -> Any:
    """Force fields onto a built struct, skipping its __post_init__ checks (a forged event)."""
    for name, value in fields.items():
        msgspec.structs.force_setattr(struct, name, value)
    return struct


@pytest.mark.parametrize("bad", BAD_STEP_IDS)
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda s: Planned(step=s, attempt=1), id="planned"),
        pytest.param(lambda s: Acked(step=s, attempt=1), id="acked"),
        pytest.param(lambda s: BlobStored(step=s, attempt=1, digest=GOOD, size=1), id="stored"),
        pytest.param(lambda s: WorkspaceAdded(workspace=s, root="/w"), id="workspace"),
        pytest.param(
            lambda s: LeaseAcquired(workspace=s, epoch=1, holder="h", expires_ns=1), id="lease"
        ),
    ],
)
def test_bad_step_id_is_refused_and_writes_nothing(ledger: Ledger, build, bad: str) -> None:
    head = ledger.head()
    with pytest.raises(InvalidInput):
        ledger.append(build(bad))
    assert ledger.count() == 0
    assert ledger.head() == head


@pytest.mark.parametrize("bad", BAD_STEP_IDS)
def test_check_step_id_refuses_what_the_decoder_refuses(ledger: Ledger, bad: str) -> None:
    with pytest.raises(InvalidInput):
        ev.check_step_id(bad)
    with pytest.raises(InvalidInput):
        ledger.step(bad)
    with pytest.raises(InvalidInput):
        list(ledger.read(step=bad))


@pytest.mark.parametrize("good", ["s", "x" * ev.STEP_ID_MAX, "ステップ-1", "a b/c:d", "\u2028"])
def test_good_step_ids_are_accepted(ledger: Ledger, good: str) -> None:
    assert ev.check_step_id(good) == good
    rec = ledger.append(Planned(step=good, attempt=1))
    assert rec.seq == 1
    assert ledger.step(good).state == "planned"


DIGEST_FIELDS: list[Any] = [
    pytest.param(lambda d: BlobPinned(step="s", attempt=1, digest=d), id="pinned.digest"),
    pytest.param(lambda d: BlobStored(step="s", attempt=1, digest=d, size=3), id="stored.digest"),
    pytest.param(
        lambda d: ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=d),
        id="published.digest",
    ),
    pytest.param(
        lambda d: ManifestPublished(step="s", attempt=1, manifest_rev=1, expected_rev=0,
                                    digest=GOOD, supersedes=d),
        id="published.supersedes",
    ),
    pytest.param(
        lambda d: ManifestPublished(
            step="s", attempt=1, manifest_rev=0, digest=GOOD,
            artifacts=(ManifestEntry(path="a", digest=d, size=1),),
        ),
        id="manifest-entry.digest",
    ),
    pytest.param(
        lambda d: Planned(step="t", attempt=1,
                          writes=(PlannedWrite(path="a", base_rev=0, pre_hash=d),)),
        id="planned-write.pre_hash",
    ),
    pytest.param(
        lambda d: Planned(step="t", attempt=1,
                          writes=(PlannedWrite(path="a", base_rev=0, post_hash=d),)),
        id="planned-write.post_hash",
    ),
    pytest.param(
        lambda d: Fenced(step="s", attempt=1, writes=(AppliedWrite(path="a", rev=1, post_hash=d),)),
        id="applied-write.post_hash",
    ),
    pytest.param(
        lambda d: Compensated(step="s", attempt=1, restored=(Restored(path="a", rev=1, digest=d),)),
        id="restored.digest",
    ),
    pytest.param(lambda d: BlobCollected(digest=d, size=1), id="collected.digest"),
]


@pytest.mark.parametrize("bad", BAD_DIGESTS)
@pytest.mark.parametrize("build", DIGEST_FIELDS)
def test_bad_digest_is_refused_and_writes_nothing(ledger: Ledger, build, bad: str) -> None:
    ledger.append(Planned(step="s", attempt=1))
    head, count = ledger.head(), ledger.count()
    ev.validate(build(GOOD))  # the same event with a good digest is valid
    with pytest.raises(InvalidInput):
        ledger.append(build(bad))
    assert (ledger.count(), ledger.head()) == (count, head)
    assert ledger.step("s").state == "planned"


@pytest.mark.parametrize("bad", BAD_DIGESTS)
def test_check_digest(bad: str) -> None:
    with pytest.raises(InvalidInput):
        ev.check_digest(bad)
    assert ev.check_digest(GOOD) == GOOD


PATH_FIELDS: list[Any] = [
    pytest.param(
        lambda p: Planned(step="t", attempt=1,
                          writes=(unchecked(PlannedWrite(path="ok", base_rev=0), path=p),)),
        id="planned-write",
    ),
    pytest.param(
        lambda p: unchecked(Planned(step="t", attempt=1, artifacts=("ok",)), artifacts=("x", p)),
        id="planned.artifacts",
    ),
    pytest.param(
        lambda p: Fenced(step="s", attempt=1,
                         writes=(unchecked(AppliedWrite(path="ok", rev=1), path=p),)),
        id="applied-write",
    ),
    pytest.param(
        lambda p: unchecked(BlobStored(step="s", attempt=1, digest=GOOD, size=1, path="ok"),
                            path=p),
        id="stored.path",
    ),
    pytest.param(
        lambda p: ManifestPublished(
            step="s", attempt=1, manifest_rev=0, digest=GOOD,
            writes=(unchecked(ManifestEntry(path="ok", digest=GOOD, size=1), path=p),),
        ),
        id="manifest-entry",
    ),
    pytest.param(
        lambda p: Compensated(step="s", attempt=1,
                              restored=(unchecked(Restored(path="ok", rev=0), path=p),)),
        id="restored",
    ),
]

# The same fields built the ordinary way: the constructor refuses at once.
PATH_CONSTRUCTORS: list[Any] = [
    pytest.param(lambda p: PlannedWrite(path=p, base_rev=0), id="planned-write"),
    pytest.param(lambda p: Planned(step="t", attempt=1, artifacts=(p,)), id="planned.artifacts"),
    pytest.param(lambda p: AppliedWrite(path=p, rev=1), id="applied-write"),
    pytest.param(lambda p: BlobStored(step="s", attempt=1, digest=GOOD, size=1, path=p),
                 id="stored.path"),
    pytest.param(lambda p: ManifestEntry(path=p, digest=GOOD, size=1), id="manifest-entry"),
    pytest.param(lambda p: Restored(path=p, rev=0), id="restored"),
]


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("build", PATH_FIELDS)
def test_bad_path_is_refused_by_append_even_if_forged(ledger: Ledger, build, bad: str) -> None:
    """An event whose constructor check was bypassed is still refused by append."""
    ledger.append(Planned(step="s", attempt=1))
    head, count = ledger.head(), ledger.count()
    ev.validate(build("src/app.py"))  # control: a good path passes
    with pytest.raises(InvalidInput):
        ledger.append(build(bad))
    with pytest.raises(InvalidInput):
        ledger.append_batch([Fenced(step="s", attempt=1), build(bad)])
    assert (ledger.count(), ledger.head()) == (count, head)
    assert ledger.step("s").state == "planned"


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("build", PATH_CONSTRUCTORS)
def test_bad_path_is_refused_at_construction(build, bad: str) -> None:
    with pytest.raises(InvalidInput):
        build(bad)
    with pytest.raises(InvalidInput):
        ev.check_relpath(bad)


@pytest.mark.parametrize("good", GOOD_PATHS)
@pytest.mark.parametrize("build", PATH_CONSTRUCTORS)
def test_good_paths_are_accepted(build, good: str) -> None:
    assert ev.check_relpath(good) == good
    built = build(good)
    if isinstance(built, ev.Event):
        ev.validate(built)


def test_invalid_numbers_and_literals_are_refused(ledger: Ledger) -> None:
    ledger.append(Planned(step="s", attempt=1))
    bad_events = [
        Planned(step="t", attempt=0),
        Planned(step="t", attempt=-1),
        Planned(step="t", attempt=1, epoch=-1),
        Planned(step="t", attempt=1, fence="sometimes"),  # type: ignore[arg-type]
        Planned(step="t", attempt=1, writes=(PlannedWrite(path="a", base_rev=-1),)),
        BlobStored(step="s", attempt=1, digest=GOOD, size=-1),
        ManifestPublished(step="s", attempt=1, manifest_rev=0, expected_rev=-2, digest=GOOD),
        Rejected(step="s", attempt=1, reason="bored"),  # type: ignore[arg-type]
        Compensated(step="s", attempt=1, reason="x" * (ev.TEXT_MAX + 1)),
        Planned(step="t", attempt=1, run="r\n"),
        Planned(step="t", attempt=1, workspace="w" * (ev.STEP_ID_MAX + 1)),
    ]
    for event in bad_events:
        with pytest.raises(InvalidInput):
            ledger.append(event)
    with pytest.raises(InvalidInput):
        ledger.append("planned")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        ledger.append_batch([])
    assert ledger.count() == 1


# --- encoding round-trips --------------------------------------------------------------

_SAFE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f",
                           min_codepoint=0x20),
    max_size=12,
)
_DIGESTS = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_SEGMENT = st.text(alphabet="abcxyz._-ü0", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
_RELPATHS = st.lists(_SEGMENT, min_size=1, max_size=4).map("/".join)
_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """A hypothesis strategy producing valid values of a msgspec type description."""
    if isinstance(t, mi.StructType):
        fields = {f.name: strategy_for(f.type) for f in t.fields}
        return st.fixed_dictionaries(fields).map(lambda kw: t.cls(**kw))
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy_for(x) for x in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.IntType):
        lo = -(2**63) if t.ge is None else t.ge
        hi = 2**63 - 1 if t.le is None else t.le
        return st.one_of(st.integers(lo, lo + 3), st.integers(lo, hi))
    if isinstance(t, mi.VarTupleType):
        return st.lists(strategy_for(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.StrType):
        if t.pattern == ev.Digest.__metadata__[0].pattern:
            return _DIGESTS
        if t.pattern == ev.AbsPath.__metadata__[0].pattern:  # a witness location
            return _RELPATHS.map(lambda p: "/" + p)
        if t.pattern is not None:  # step ids and names: no control characters
            return _SAFE_TEXT.filter(lambda s: len(s) >= (t.min_length or 0))
        if t.min_length == 1 and t.max_length == ev.PATH_MAX:
            return _RELPATHS
        return st.text(max_size=12)  # free text: any character
    raise AssertionError(f"no strategy for {t!r}")  # a new field type: teach the test


EVENT_STRATEGIES = {
    kind: strategy_for(mi.type_info(cls)) for kind, cls in ev.EVENT_TYPES.items()
}
ANY_EVENT = st.one_of(*EVENT_STRATEGIES.values())


@pytest.mark.parametrize("kind", ev.KINDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_event_type_round_trips(kind: str, data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[kind])
    payload = ev.encode(event)
    assert ev.validate(event) == payload
    decoded = ev.decode(payload)
    assert decoded == event
    assert type(decoded) is type(event)
    assert ev.kind_of(decoded) == kind
    assert json.loads(payload)["kind"] == kind
    assert ev.encode(decoded) == payload  # deterministic bytes: the chain hashes them
    assert ev.journal_key(decoded) == ev.journal_key(event)
    assert ev.to_builtins(event)["kind"] == kind


def test_the_round_trip_strategies_cover_every_kind() -> None:
    assert set(EVENT_STRATEGIES) == set(ev.KINDS)
    assert set(ev.STEP_KINDS) == {
        "planned", "observed", "fenced", "blob-pinned", "blob-stored", "manifest-published",
        "acked", "compensating", "compensated", "rejected",
    }


@settings(max_examples=60, deadline=None)
@given(events=st.lists(ANY_EVENT, min_size=1, max_size=5))
def test_encoding_is_independent_of_field_order(events: list[Any]) -> None:
    for event in events:
        payload = ev.encode(event)
        reordered = json.dumps(dict(reversed(json.loads(payload).items()))).encode()
        again = ev.decode(reordered)
        assert again == event
        assert ev.encode(again) == payload


def test_decode_refuses_a_newer_event_version() -> None:
    payload = ev.encode(Planned(step="s", attempt=1))
    assert ev.decode(payload, ev.EVENT_VERSION) == Planned(step="s", attempt=1)
    with pytest.raises(InvalidInput, match="newer"):
        ev.decode(payload, ev.READ_VERSION + 1)
    with pytest.raises(msgspec.ValidationError):
        ev.decode(b'{"kind":"teleported","step":"s","attempt":1}')


def test_appended_events_read_back_identical(ledger: Ledger) -> None:
    events = [
        WorkspaceAdded(workspace="w", root="/srv/w"),
        LeaseAcquired(workspace="w", epoch=1, holder="agent-1", expires_ns=4 * 10**18),
        Planned(step="s", attempt=1, workspace="w", run="r", epoch=1, rev=0,
                writes=(PlannedWrite(path="a.txt", base_rev=0, pre_hash=D1, post_hash=D2),),
                artifacts=("log/out.txt",)),
        Fenced(step="s", attempt=1, workspace="w", run="r", epoch=1, rev=1,
               writes=(AppliedWrite(path="a.txt", rev=1, pre_hash=D1, post_hash=D2),)),
        LeaseRenewed(workspace="w", epoch=1, expires_ns=5 * 10**18),
        LeaseReleased(workspace="w", epoch=1),
        WorkspaceRestored(workspace="w", root="/new", rev=4, paths=1, dev=5, ino=2**64 - 1),
        WorkspaceRebound(workspace="w", root="/newer", dev=5, ino=7, allow_git=True, after=8),
        BlobCollected(digest=D1, size=3, collection="gc-1"),
    ]
    recorded = ledger.append_batch(events)
    assert [r.event for r in recorded] == events
    assert [r.event for r in ledger.read()] == events
    assert [r.kind for r in ledger.read()] == [ev.kind_of(e) for e in events]


# --- journal keys ----------------------------------------------------------------------

# docs/design.md: a transition is keyed (step, attempt, kind[, digest]); publish and ack by
# the manifest revision. Written out here, not derived from `key_extra`.
STEP_EVENTS_AND_EXTRA: list[tuple[Any, list[Any]]] = [
    (Planned(step="s", attempt=2, run="r", epoch=3), []),
    (BlobPinned(step="s", attempt=2, digest=D1), [D1]),
    (BlobStored(step="s", attempt=2, digest=D2, size=5), [None, D2]),  # path, digest (v2)
    (ManifestPublished(step="s", attempt=2, manifest_rev=4, expected_rev=3, digest=D1), [4]),
    (Acked(step="s", attempt=2, manifest_rev=4), [4]),
    (Compensated(step="s", attempt=2, reason="undo"), []),
    (Rejected(step="s", attempt=2, reason="stale_rev"), []),
]


@pytest.mark.parametrize(
    ("event", "extra"), STEP_EVENTS_AND_EXTRA, ids=[ev.kind_of(e) for e, _ in STEP_EVENTS_AND_EXTRA]
)
def test_journal_key_of_a_step_transition(event: Any, extra: list[Any]) -> None:
    key = journal_key(event)
    assert json.loads(key) == ["s", 2, ev.kind_of(event), *extra]
    assert ev.kind_of(event) in ev.STEP_KINDS


def test_apply_is_keyed_by_workspace_step_and_attempt() -> None:
    """docs/design.md: applying is keyed (workspace, step, attempt); with the journal off (the
    comparison mode) every apply gets a key of its own, so nothing dedupes it."""
    assert json.loads(journal_key(Fenced(step="s", attempt=2, workspace="w", rev=9))) == [
        "apply", "w", "s", 2,
    ]
    off = Fenced(step="s", attempt=2, workspace="w", rev=9, journal=False)
    assert json.loads(journal_key(off)) == ["apply", "w", "s", 2, 9]


def test_journal_key_ignores_payload_outside_the_key() -> None:
    """The same key with other payload is what makes an IdempotencyConflict possible."""
    pairs = [
        (Planned(step="s", attempt=1), Planned(step="s", attempt=1, run="other", epoch=7)),
        (BlobStored(step="s", attempt=1, digest=D1, size=1),
         BlobStored(step="s", attempt=1, digest=D1, size=2)),
        (ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=D1),
         ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=D2)),
        (Compensated(step="s", attempt=1, reason="a"),
         Compensated(step="s", attempt=1, reason="b")),
    ]
    for a, b in pairs:
        assert a != b
        assert journal_key(a) == journal_key(b)


def test_journal_key_separates_what_it_keys() -> None:
    events = [
        Planned(step="s", attempt=1),
        Planned(step="s", attempt=2),
        Planned(step="t", attempt=1),
        Planned(step='s", 1, "planned', attempt=1),  # no separator can collide
        Planned(step="s,1", attempt=1),
        BlobStored(step="s", attempt=1, digest=D1, size=1),
        BlobStored(step="s", attempt=1, digest=D2, size=1),
        BlobPinned(step="s", attempt=1, digest=D1),
        ManifestPublished(step="s", attempt=1, manifest_rev=0, digest=D1),
        ManifestPublished(step="s", attempt=1, manifest_rev=1, expected_rev=0, digest=D1),
        Acked(step="s", attempt=1, manifest_rev=0),
        Acked(step="s", attempt=1, manifest_rev=1),
        WorkspaceAdded(workspace="s", root="/r"),
        WorkspaceAdded(workspace="t", root="/r"),
        WorkspaceRebound(workspace="s", root="/r", dev=1, ino=2, after=1),
        WorkspaceRebound(workspace="s", root="/r", dev=1, ino=2, after=9),
        WorkspaceRestored(workspace="s", root="/r", rev=1),
        LeaseAcquired(workspace="s", epoch=1, holder="h", expires_ns=1),
        LeaseAcquired(workspace="s", epoch=2, holder="h", expires_ns=1),
        LeaseRenewed(workspace="s", epoch=1, expires_ns=1),
        LeaseRenewed(workspace="s", epoch=1, expires_ns=2),
        LeaseReleased(workspace="s", epoch=1),
        BlobCollected(digest=D1, size=1, collection="a"),
        BlobCollected(digest=D1, size=1, collection="b"),
    ]
    keys = [journal_key(e) for e in events]
    assert len(set(keys)) == len(keys)


# --- the chain hash --------------------------------------------------------------------

BASE: dict[str, Any] = dict(
    prev_hash=b"\x01" * 32,
    seq=7,
    time_ns=1_700_000_000_000_000_000,
    env=ev.Envelope("ws", "run", "step", 2, 3, 4),
    journal_key='["step",2,"planned"]',
    kind="planned",
    v=1,
    payload=b'{"attempt":2,"kind":"planned","step":"step"}',
)

ENV_VARIANTS = {
    "workspace": ev.Envelope("ws2", "run", "step", 2, 3, 4),
    "run": ev.Envelope("ws", "run2", "step", 2, 3, 4),
    "step": ev.Envelope("ws", "run", "step2", 2, 3, 4),
    "attempt": ev.Envelope("ws", "run", "step", 1, 3, 4),
    "epoch": ev.Envelope("ws", "run", "step", 2, 4, 4),
    "rev": ev.Envelope("ws", "run", "step", 2, 3, 5),
    "workspace/run boundary": ev.Envelope("wsr", "un", "step", 2, 3, 4),
    "run/step boundary": ev.Envelope("ws", "ru", "nstep", 2, 3, 4),
    "attempt/epoch swapped": ev.Envelope("ws", "run", "step", 3, 2, 4),
}

OTHER_VARIANTS = {
    "prev_hash": b"\x02" * 32,
    "seq": 8,
    "time_ns": BASE["time_ns"] + 1,
    "journal_key": '["step",2,"fenced"]',
    "kind": "fenced",
    "v": 2,
    "payload": BASE["payload"] + b" ",
}


def _chain(**over: Any) -> bytes:
    return ev.chain_hash(**{**BASE, **over})


def test_chain_hash_is_deterministic() -> None:
    assert _chain() == _chain()
    assert len(_chain()) == 32


@pytest.mark.parametrize("column", list(ENV_VARIANTS))
def test_chain_hash_covers_every_envelope_column(column: str) -> None:
    assert _chain(env=ENV_VARIANTS[column]) != _chain()


@pytest.mark.parametrize("column", list(OTHER_VARIANTS))
def test_chain_hash_covers_position_key_kind_version_and_payload(column: str) -> None:
    assert _chain(**{column: OTHER_VARIANTS[column]}) != _chain()


def test_chain_hash_variants_are_all_distinct() -> None:
    hashes = {_chain()}
    hashes |= {_chain(env=e) for e in ENV_VARIANTS.values()}
    hashes |= {_chain(**{c: v}) for c, v in OTHER_VARIANTS.items()}
    assert len(hashes) == 1 + len(ENV_VARIANTS) + len(OTHER_VARIANTS)


def test_envelope_is_derived_from_the_event() -> None:
    e = Planned(step="s", attempt=2, run="r", workspace="w", epoch=5, rev=6)
    assert ev.envelope(e) == ev.Envelope("w", "r", "s", 2, 5, 6)
    assert ev.envelope(LeaseAcquired(workspace="w", epoch=3, holder="h", expires_ns=1)) == (
        ev.Envelope("w", "", "", 0, 3, 0)
    )
    assert ev.envelope(BlobCollected(digest=D1, size=1)) == ev.Envelope("", "", "", 0, 0, 0)


def test_genesis_binds_the_chain_to_its_ledger() -> None:
    assert ev.genesis_hash("a") != ev.genesis_hash("b")
    assert ev.genesis_hash("a") == ev.genesis_hash("a")


def test_recorded_hashes_are_the_chain_of_the_rows(ledger: Ledger, commit_step) -> None:
    commit_step(ledger, "one")
    ledger.append(WorkspaceAdded(workspace="w", root="/w"))
    commit_step(ledger, "two")
    prev = ev.genesis_hash(ledger.ledger_id)
    rows = list(ledger.read())
    assert [r.seq for r in rows] == list(range(1, 10))
    for r in rows:
        assert r.prev_hash == prev
        expected = ev.chain_hash(prev, r.seq, r.time_ns, ev.envelope(r.event), r.journal_key,
                                 r.kind, r.v, ev.encode(r.event))
        assert r.hash == expected
        assert r.journal_key == journal_key(r.event)
        prev = r.hash
    assert ledger.head().hash == prev
    assert str(ledger.head()) == f"9:{prev.hex()}"


def test_conflict_and_illegal_are_not_invalid_input() -> None:
    """The three refusals are distinct types: callers handle them differently."""
    assert not issubclass(IllegalTransition, InvalidInput)
    assert not issubclass(IdempotencyConflict, InvalidInput)
    assert not issubclass(InvalidInput, IllegalTransition)


#: The `ledger` fixture runs each test on SQLite and on PostgreSQL (tests/conftest.py).
BOTH_STORES = True

"""Every event kind is declared once (`ledger.events.KIND_SPECS`) and nothing forgets one.

Adding a kind means: its struct in the `AnyEvent` union, its `KindSpec` (which
projections fold it, whether the append guard checks its blobs, whether GC keeps the
blobs it names), the fold code of each projection it names, and its line in the docs.
These tests fail when any of those is missing: a kind with no declaration, no decoder
(the event and the fold's slim decoder), a projection that is declared to fold it but
never mentions it (or mentions a kind it is not declared to fold), a guarded or
blob-naming kind the guard or GC cannot read, a kind the docs do not list. Each checker
is shown catching the broken variant.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import events as ev
from ledger.gc import holders
from ledger.projections import lite
from ledger.projections import refs as refs_mod
from ledger.projections import steps as steps_mod
from ledger.projections import workspaces as ws_mod
from ledger.store import base
from test_events import EVENT_STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
#: The module whose fold code each projection is.
FOLD_MODULES = {"steps": steps_mod, "workspaces": ws_mod, "refs": refs_mod}


def undeclared(union_types: tuple[type, ...], specs: dict[str, ev.KindSpec]) -> list[str]:
    """What differs between the union's kinds and the declarations."""
    tags = {t.__struct_config__.tag: t for t in union_types}
    out = [f"{k}: in the union, not declared" for k in sorted(tags.keys() - specs.keys())]
    out += [f"{k}: declared, not in the union" for k in sorted(specs.keys() - tags.keys())]
    out += [f"{k}: declared as {s.type.__name__}, the union's is {tags[k].__name__}"
            for k, s in specs.items() if k in tags and tags[k] is not s.type]
    return out


def mentioned_kinds(source: str) -> set[str]:
    """The kinds a module's code names: as a string (``"acked"``) or by its class."""
    by_class = {s.type.__name__: k for k, s in ev.KIND_SPECS.items()}
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in ev.KIND_SPECS:
            out.add(node.value)
        elif isinstance(node, ast.Name) and node.id in by_class:
            out.add(by_class[node.id])
        elif isinstance(node, ast.alias) and node.name in by_class:
            continue  # an import is not a fold
    return out


def fold_problems(projection: str, source: str) -> list[str]:
    """A projection that never names a kind it is declared to fold (its fold forgot it),
    or names in its code a kind it is not declared to fold (it would never be fed it)."""
    declared = ev.kinds_folded_by(projection)
    named = mentioned_kinds(source)
    out = [f"{projection} is declared to fold {k!r} but its code never names it"
           for k in sorted(declared - named)]
    out += [f"{projection}'s code names {k!r}, which KIND_SPECS does not give it"
            for k in sorted(named - declared)]
    return out


def undocumented(doc: str) -> list[str]:
    return [k for k in ev.KINDS if f"`{k}`" not in doc]


# -- declared once -----------------------------------------------------------------------


def test_every_kind_is_declared_once() -> None:
    assert undeclared(ev.AnyEvent.__args__, ev.KIND_SPECS) == []  # type: ignore[attr-defined]
    assert all(s.folds <= set(ev.PROJECTIONS) for s in ev.KIND_SPECS.values())


def test_the_declaration_checker_catches_a_forgotten_kind() -> None:
    class Teleported(ev.Event, frozen=True, kw_only=True, tag="teleported"):
        pass

    union = (*ev.AnyEvent.__args__, Teleported)  # type: ignore[attr-defined]
    assert undeclared(union, ev.KIND_SPECS) == ["teleported: in the union, not declared"]
    fewer = {k: s for k, s in ev.KIND_SPECS.items() if k != "acked"}
    assert undeclared(ev.AnyEvent.__args__, fewer) == ["acked: in the union, not declared"]  # type: ignore[attr-defined]


def test_the_kind_lists_are_derived() -> None:
    assert ev.KINDS == tuple(ev.KIND_SPECS)
    assert set(ev.EVENT_TYPES) == set(ev.KIND_SPECS)
    # the steps projection folds the step transitions and the seal (its tombstones)
    assert steps_mod.STEP_KIND_TAGS == ev.kinds_folded_by("steps") == {*ev.STEP_KINDS, ev.SEAL_KIND}
    assert ws_mod.KINDS == ev.kinds_folded_by("workspaces")
    assert refs_mod.KINDS == ev.kinds_folded_by("refs")
    assert base.GUARDED_KINDS is ev.GUARDED_KINDS
    # a step transition is exactly a StepEvent
    assert {k for k, s in ev.KIND_SPECS.items() if issubclass(s.type, ev.StepEvent)} == \
        ev.kinds_folded_by("steps") - {ev.SEAL_KIND}
    with pytest.raises(ValueError, match="no projection"):
        ev.kinds_folded_by("stepz")


# -- decoders ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ev.KINDS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_kind_decodes_for_the_folds(kind: str, data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[kind])
    payload = ev.encode(event)
    assert ev.decode(payload) == event
    slim = lite.decode_for_fold(kind, payload, ev.EVENT_VERSION)
    assert slim.__struct_config__.tag == kind  # type: ignore[union-attr]
    for field in getattr(type(slim), "__struct_fields__", ()):
        assert getattr(slim, field) == getattr(event, field) or field in ("writes", "artifacts")


@pytest.mark.parametrize("kind", sorted(ev.BLOB_NAMING_KINDS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_gc_reads_every_kind_that_names_blobs(kind: str, data: st.DataObject) -> None:
    """GC decodes only the digests of the kinds that name blobs: its decoder must take
    each one (a kind it cannot read would make every collection refuse)."""
    event = data.draw(EVENT_STRATEGIES[kind])
    decoded = holders._refs_decoder.decode(ev.encode(event))
    assert decoded.__struct_config__.tag == kind


def test_only_kinds_that_name_blobs_are_guarded_or_kept() -> None:
    for kind in ev.GUARDED_KINDS | ev.BLOB_NAMING_KINDS:
        fields = ev.KIND_SPECS[kind].type.__struct_fields__
        assert {"digest", "writes", "artifacts", "restored"} & set(fields), kind


# -- folds -------------------------------------------------------------------------------


@pytest.mark.parametrize("projection", ev.PROJECTIONS)
def test_every_projection_folds_exactly_its_declared_kinds(projection: str) -> None:
    source = Path(FOLD_MODULES[projection].__file__).read_text()  # type: ignore[arg-type]
    assert fold_problems(projection, source) == []


def test_the_fold_checker_catches_a_forgotten_branch() -> None:
    source = Path(refs_mod.__file__).read_text()  # type: ignore[arg-type]
    broken = source.replace('"blob-pinned"', '"blob-pinnedX"')
    assert fold_problems("refs", broken) == [
        "refs is declared to fold 'blob-pinned' but its code never names it"]
    extra = source + '\nif kind == "witness-anchored":\n    pass\n'
    assert fold_problems("refs", extra) == [
        "refs's code names 'witness-anchored', which KIND_SPECS does not give it"]


# -- docs --------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", ["docs/design.md", "docs/cli-json.md"])
def test_every_kind_is_documented(doc: str) -> None:
    text = (ROOT / doc).read_text()
    if doc == "docs/design.md":  # the list of kinds under the events heading
        text = re.split(r"^## ", text.split("## Events and the attempt lifecycle", 1)[1],
                        maxsplit=1, flags=re.M)[0]
    assert undocumented(text) == []


def test_the_doc_checker_catches_an_undocumented_kind() -> None:
    text = (ROOT / "docs/cli-json.md").read_text().replace("`lease-renewed`", "lease-renewed")
    assert undocumented(text) == ["lease-renewed"]


def test_a_kind_spec_is_a_plain_value() -> None:
    spec = ev.KIND_SPECS["manifest-published"]
    assert spec.guarded and spec.names_blobs and spec.folds == {"steps", "refs"}
    with pytest.raises((AttributeError, TypeError)):
        spec.guarded = False  # type: ignore[misc]
    assert msgspec.structs.replace(spec, guarded=False) != spec


# --- every kind in words, once (`ledger.kinds`) ------------------------------------------


def undescribed(specs: dict[str, ev.KindSpec], described: dict[str, object]) -> list[str]:
    """Kinds declared with no words, and words for kinds that are not declared."""
    return sorted(set(specs) ^ set(described))


def test_every_kind_is_described_once() -> None:
    """The command line, the UI, status and the MCP server word a kind through
    `ledger.kinds` only: a kind added without its description fails here."""
    from ledger import kinds

    assert undescribed(ev.KIND_SPECS, kinds.DESCRIBED) == []
    for kind, described in kinds.DESCRIBED.items():
        assert described.means and described.means[0].islower(), kind
    with pytest.raises(KeyError):
        kinds.describe("made-up")  # no fallback: an unknown kind is not worded as another


def test_the_description_checker_catches_a_kind_without_words() -> None:
    from ledger import kinds

    fewer = {k: v for k, v in kinds.DESCRIBED.items() if k != "lease-renewed"}
    assert undescribed(ev.KIND_SPECS, fewer) == ["lease-renewed"]
    assert undescribed(ev.KIND_SPECS, {**kinds.DESCRIBED, "x": None}) == ["x"]


@settings(max_examples=60, deadline=None)
@given(st.one_of(*EVENT_STRATEGIES.values()))
def test_every_event_has_a_detail_line(event: ev.Event) -> None:
    from ledger import kinds

    line = kinds.detail(event)
    assert isinstance(line, str) and "\n" not in line


def test_no_front_end_words_a_kind_itself() -> None:
    """The MCP audit, the CLI's timelines and the UI's event rows take a kind's words
    from `ledger.kinds`; none keeps a chain of its own per kind."""
    src = (ROOT / "ledger" / "mcp" / "records.py").read_text()  # (the audit tool)
    assert "isinstance(e, LeaseAcquired)" not in src and "detail(e)" in src
    for rel in ("ledger/cli/inspect.py", "ledger/cli/seal.py"):
        assert "detail(r.event)" in (ROOT / rel).read_text(), rel
    assert "detail(e)" in (ROOT / "ledger" / "ui" / "templates" / "_events_table.html").read_text()

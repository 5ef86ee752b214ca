"""The README read top to bottom defines or links every term of the project before it
relies on it (issue 37, item 8): the first use of each term in the README's prose (code
blocks aside) is a link into docs/glossary.md, and every term has a glossary entry."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The project's words a newcomer does not know, and the glossary anchor each links to.
TERMS = {
    "journal key": "journal-key", "epoch": "lease-holder-epoch", "lease": "lease-holder-epoch",
    "fence": "fence-fenced", "fenced": "fence-fenced", "exchanged in": "exchanged-in",
    "publish": "manifest-publish", "manifest": "manifest-publish", "ack": "ack",
    "settle": "settle", "compensate": "compensate-undo", "seal": "seal-archive",
    "witness": "witness", "projection": "projection", "orphan": "gc-orphan-blob",
    "kept file": "kept-file", "take back": "take-back", "blob": "blob",
}


def prose(text: str) -> str:
    """The README without its fenced code blocks and inline code."""
    text = re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)


def first_use_unlinked(text: str, term: str, anchor: str) -> str | None:
    """None when the first prose use of `term` is inside a link to its glossary entry;
    else the line it is on."""
    body = prose(text)
    m = re.search(rf"(?i)(?<![\w-]){re.escape(term)}(?:s|ed|es)?(?![\w-])", body)
    if m is None:
        return None
    links = [(l.start(), l.end()) for l in re.finditer(
        rf"\[[^\]]*\]\(docs/glossary\.md#{re.escape(anchor)}\)", text)]
    if any(a <= m.start() < b for a, b in links):
        return None
    return body[body.rfind("\n", 0, m.start()) + 1:body.find("\n", m.start())].strip()


def test_every_term_is_linked_on_its_first_use() -> None:
    text = (ROOT / "README.md").read_text()
    bad = {t: line for t, a in TERMS.items() if (line := first_use_unlinked(text, t, a))}
    assert not bad, "first uses not linked to docs/glossary.md:\n" + "\n".join(
        f"  {t!r}: {line}" for t, line in bad.items())


def test_every_anchor_exists_in_the_glossary() -> None:
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    anchors = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
               for h in re.findall(r"^### (.+)$", glossary, flags=re.M)}
    assert set(TERMS.values()) <= anchors, set(TERMS.values()) - anchors


def test_the_check_catches_an_unlinked_term() -> None:
    assert first_use_unlinked("An epoch is a thing.", "epoch", "lease-holder-epoch")
    assert first_use_unlinked("See [epoch](docs/glossary.md#lease-holder-epoch); epoch.",
                              "epoch", "lease-holder-epoch") is None
    assert first_use_unlinked("```\nepoch\n```\nno use", "epoch", "lease-holder-epoch") is None

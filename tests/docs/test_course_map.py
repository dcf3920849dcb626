"""The course map tells the truth: a "coming" label never names a part that exists.

A label `<span class="coming">coming — PART</span>` marks a topic whose lesson is not
written yet, and names the part of the course plan that will teach it. Once that part has
its pages, the topic must be a link instead; a part outside the plan is a typo.
"""

import re

import pytest

from helpers import ROOT

DOCS = ROOT / "docs"
# Every part of the plan (../shared/seeds), with the page that opens it.
PARTS = {
    "Session A": "workshop/session-a.md",
    "Session B": "workshop/session-b.md",
    "Session C": "workshop/session-c.md",
    "Week 1": "week-1/index.md",
    "Week 2": "week-2/index.md",
    "Week 3": "week-3/index.md",
    "Week 4": "week-4/index.md",
    "Practical workflows": "workflows/index.md",
    "Operations": "operations/gpu-stack.md",
}
LABEL = re.compile(r'<span class="coming">coming — (?P<parts>[^<]+)</span>')


def labels(text: str) -> list[str]:
    """The parts every label on a page names ("coming — Week 1, Operations": two)."""
    return [part.strip() for m in LABEL.finditer(text) for part in m["parts"].split(",")]


def test_every_part_of_the_plan_has_its_page() -> None:
    assert [part for part, page in PARTS.items() if not (DOCS / page).exists()] == []


@pytest.mark.parametrize(
    "path", sorted(p for p in DOCS.rglob("*.md") if "generated" not in p.parts), ids=str
)
def test_no_label_names_a_part_that_exists_or_is_not_planned(path) -> None:
    for part in labels(path.read_text()):
        assert part in PARTS, f"{path}: 'coming — {part}' names no part of the plan"
        assert not (DOCS / PARTS[part]).exists(), (
            f"{path}: 'coming — {part}': {part} exists; link the topic's page instead"
        )


def test_self_check_labels_are_found_and_split() -> None:
    text = 'a <span class="coming">coming — Week 1, Practical workflows</span> b'
    assert labels(text) == ["Week 1", "Practical workflows"]
    assert labels("coming — Week 1, without the span") == []

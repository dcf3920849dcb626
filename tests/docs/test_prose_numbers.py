"""Every measurement-shaped number in the pages' prose is tied to data (tools/prose_numbers.py).

A number with a unit, a decimal, a big count, a power of ten or a word that states a
ratio must be in a compared output or included generated file of its page, read by a
test, or listed with its rule in tests/docs/prose_rules/. The last tests show the check
failing on a broken copy of a page.
"""

from __future__ import annotations

import pytest

from helpers import load_tool

prose_numbers = load_tool("prose_numbers")


@pytest.fixture(scope="module")
def report():
    return prose_numbers.check()


def test_every_number_in_the_prose_is_tied(report) -> None:
    untied = [f"docs/{n.page}:{n.line}: {n.text!r}" for n in report.untied]
    assert not untied, (
        f"{len(untied)} numbers tied to nothing (tie each to data, a test or a rule in "
        "tests/docs/prose_rules/; python tools/prose_numbers.py lists them):\n"
        + "\n".join(untied[:60])
    )


def test_every_rule_names_a_phrase_on_its_page(report) -> None:
    stale = [f"docs/{page}: {phrase!r}: {why}" for page, phrase, why in report.stale_rules]
    assert not stale, "\n".join(stale)


def test_the_check_finds_every_kind_of_number() -> None:
    page = prose_numbers.Page.read(
        "x.md",
        "The step took 12.5 s, twice as long, at 1,024 tokens/s and 26 % of the peak.\n"
        "Its loss was 6.9146 and the tolerance 1e-6, or 10⁻⁸.\n"
        "In `code 3.5 s` and a link [12 s](https://example.com/7.5) nothing counts.\n"
        "```bash\necho 9.5 s\n```\n"
        "ZeRO-3 on 8 GPUs of an H200, in fp8 and 2D, with torch 2.14.1 and DeepSpeed 0.19.\n",
    )
    found = [(n.text, n.tie) for n in prose_numbers.candidates(page)]
    assert found == [
        ("12.5 s", ""),
        ("1,024 tokens/s", ""),
        ("26 %", ""),
        ("6.9146", ""),
        ("1e-6", ""),
        ("10⁻⁸", ""),
        ("12 s", ""),
        ("0.19", "version"),
        ("twice", ""),
    ]


def test_the_check_fails_on_a_broken_copy() -> None:
    """A measurement added to a real page, and a rule whose phrase is gone, both fail."""
    name = "week-4/parallelism-2d-3d.md"
    text = (prose_numbers.DOCS / name).read_text()
    broken = text + "\nThe 3D step took 12.5 s and halves the saved activations.\n"
    report = prose_numbers.check([name], texts={name: broken})
    untied = {n.text for n in report.untied}
    assert {"12.5 s", "halves"} <= untied


def test_a_number_in_the_pages_data_is_tied_and_a_changed_one_is_not() -> None:
    raw = (
        "The run ended at loss 5.5884.\n\n"
        "```bash\npython train.py\n```\n\n<!--pytest-codeblocks:expected-output-->\n\n"
        "```\nstep 150 | loss 5.58843\n```\n"
    )
    page = prose_numbers.Page.read("x.md", raw)
    (number,) = prose_numbers.check_page(page, [], [])[0]
    assert number.tie == "data"
    page = prose_numbers.Page.read("x.md", raw.replace("5.5884.", "5.5891."))
    (number,) = prose_numbers.check_page(page, [], [])[0]
    assert number.tie == ""

"""Lab 1's run-derived numbers that tests/docs/test_prose.py does not read (issue 13:
numbers in prose come from data). That module checks the challenge's answer against its
table; this one checks the rest of the page:

- "What to notice" quotes the run of docs/generated/lab1/train.txt and metrics.jsonl
  (`python tools/make_figures.py lab1`): the first and last held-out loss, the last
  perplexity, the time.
- The answers quote counts of that run (parameters and so bytes of the weights, training
  blocks, steps) and of the 4-layer run of docs/generated/lab1/layers_2_vs_4.md.

Each check reads the sentence from the page and compares it, at the page's rounding, with
the data; the self-check changes one number in a copy of the text and sees it fail.
"""

from __future__ import annotations

import re

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.metrics import read_metrics

PAGE = "workshop/lab-1.md"
LAB1 = ROOT / "docs" / "generated" / "lab1"


def heldout() -> list[dict]:
    return [r for r in read_metrics(LAB1 / "metrics.jsonl") if r["split"] == "heldout"]


def check_what_to_notice(text: str) -> None:
    first, last, tokens = said(
        text,
        r"The untrained model scores \*\*([\d.]+)\*\* on the held-out set .*? After two epochs "
        r"it is near \*\*([\d.]+)\*\*: the model now hesitates between about (\d+) tokens",
    )
    records = heldout()
    assert float(first) == round(records[0]["loss"], 2)
    assert float(last) == round(records[-1]["loss"], 1)
    assert int(tokens) == round(records[-1]["perplexity"], -1)
    said(text, r"It takes well under a minute\.")
    summary = re.search(r"^done: \d+ steps in ([\d.]+) s ", (LAB1 / "train.txt").read_text(), re.M)
    assert float(summary[1]) < 30, "well under a minute"


def check_counts(text: str) -> None:
    """Counts the page's answers take from the recorded run and the page's own outputs."""
    header = (LAB1 / "train.txt").read_text().splitlines()[0]
    params, blocks = (
        int(x.replace(",", ""))
        for x in re.findall(r"([\d,]+) (?:parameters|training blocks)", header)
    )
    steps = int(re.search(r"^done: (\d+) steps", (LAB1 / "train.txt").read_text(), re.M)[1])

    (weights,) = said(text, r"The optimizer state is exactly twice the weights \(([\d,]+) B × 2\)")
    (optimizer,) = said(
        text, r"optimizer state +56 tensors \(Adam exp_avg, exp_avg_sq\) ([\d,]+) B"
    )
    assert int(weights.replace(",", "")) == 4 * params
    assert int(optimizer.replace(",", "")) == 2 * 4 * params

    (deep,) = said(text, r"about as many parameters as the 4-layer model \(([\d,]+)\)")
    table = (LAB1 / "layers_2_vs_4.md").read_text()
    four = int(re.search(r"^\| 4 \| ([\d,]+) \|", table, re.M)[1].replace(",", ""))
    assert int(deep.replace(",", "")) == round(four, -4)

    said_blocks, said_steps = said(
        text,
        r"([\d,]+) training blocks of 64 tokens = .*? the (\d+) steps of two epochs in the output above",
    )
    assert (int(said_blocks.replace(",", "")), int(said_steps)) == (blocks, steps)


@pytest.mark.parametrize("check", [check_what_to_notice, check_counts])
def test_the_pages_numbers_are_those_of_the_recorded_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_what_to_notice, "scores **6.94**", "scores **6.93**"),
        (check_what_to_notice, "near **5.1**", "near **5.3**"),
        (check_what_to_notice, "between about 160 tokens", "between about 150 tokens"),
        (check_counts, "(678,912 B × 2)", "(169,728 B × 2)"),
        (check_counts, "4-layer model (270,000)", "4-layer model (300,000)"),
        (check_counts, "the 414 steps of two epochs", "the 424 steps of two epochs"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

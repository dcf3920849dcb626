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

import dataclasses
import inspect
import math
import re

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.config import load_model_config
from tinyscale.core.data import build_datasets
from tinyscale.core.memory import RECIPES
from tinyscale.core.metrics import read_metrics
from tinyscale.core.model import count_parameters

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

    per_param, session_a = said(
        text, r"Together, (\d+) bytes per parameter — \[Session A's (\d+)\]\(session-a\.md"
    )
    (total,) = said(text, r"total +([\d,]+) B")
    assert int(per_param) == int(total.replace(",", "")) / params == 12
    assert int(session_a) == sum(RECIPES["fp32"]), "weights, gradients, Adam"
    assert int(per_param) == int(session_a) - RECIPES["fp32"][1], "minus the gradients"


def check_shapes(text: str) -> None:
    """Doubling hidden_size more than doubles the count, in the page's output and the code."""
    said(text, r"Doubling `hidden_size` more than doubles the model, because the matrices")
    base = load_model_config(ROOT / "code" / "config" / "config.json")
    wide = dataclasses.replace(base, hidden_size=2 * base.hidden_size)
    counts = dict(
        re.findall(r"(config\.json|\{'hidden_size': (?:\d+)\}) +([\d,]+) parameters", text)
    )
    shown = {k: int(v.replace(",", "")) for k, v in counts.items()}
    assert shown == {
        "config.json": count_parameters(base),
        f"{{'hidden_size': {wide.hidden_size}}}": count_parameters(wide),
    }
    assert count_parameters(wide) > 2 * count_parameters(base)


def check_heldout(text: str) -> None:
    """The held-out share (the code's default) and the uniform guess's loss (ln vocab)."""
    (percent,) = said(text, r"And the last (\d+) % of the stream is held out — never trained on")
    fraction = inspect.signature(build_datasets).parameters["heldout_fraction"].default
    assert int(percent) == round(100 * fraction)
    header = (LAB1 / "train.txt").read_text().splitlines()[0]
    train, held = (
        int(x.replace(",", ""))
        for x in re.findall(r"([\d,]+) (?:training|held-out) blocks", header)
    )
    assert round(100 * held / (train + held)) == int(percent), "the recorded run's split"
    asked, vocab, ln_of, loss = said(
        text,
        r"Why is the first held-out loss about ([\d.]+)\?\" The untrained model's logits are near "
        r"zero, so its prediction is close to uniform over (\d+) tokens\. The cross-entropy of a "
        r"uniform guess is ln\((\d+)\) ≈ ([\d.]+)\.",
    )
    assert int(vocab) == int(ln_of) == load_model_config().vocab_size
    assert float(asked) == float(loss) == round(math.log(int(vocab)), 2)
    assert abs(heldout()[0]["loss"] - float(loss)) < 0.05, "the recorded first held-out loss"


@pytest.mark.parametrize("check", [check_what_to_notice, check_counts, check_shapes, check_heldout])
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
        (check_counts, "Together, 12 bytes", "Together, 8 bytes"),
        (check_shapes, "more than doubles the model", "more than triples the model"),
        (check_heldout, "the last 10 % of", "the last 20 % of"),
        (check_heldout, "ln(1024) ≈ 6.93.", "ln(1024) ≈ 6.94."),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

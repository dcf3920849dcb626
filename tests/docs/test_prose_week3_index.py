"""The numbers in the prose of docs/week-3/index.md, against the model and the code.

- the embedding both stages hold: vocab × hidden of the Lab preset, the stages' sum minus
  the model's parameters (the page's expected output is compared by pytest-codeblocks);
- the embeddings' share of the 4-block Lab model the page cuts;
- the schedule table's activations for zero bubble: p on every rank, 1F1B's rank 0;
- the reading rate of the page times: tools/page_times.py's constant.
"""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.pipeline_parallel.schedules import make_schedule, peak_in_flight

sys.path.insert(0, str(ROOT / "tools"))
import page_times

PAGE = "week-3/index.md"


def page_model() -> TinyTransformer:
    """The model the page cuts in two: the Lab preset with four blocks."""
    return TinyTransformer(preset("lab", num_hidden_layers=4))


def check_tied_embedding(text: str) -> None:
    difference, vocab, hidden = said(
        text,
        r"169,600 \+ 165,632 − 269,696 = ([\d,]+) = ([\d,]+) × (\d+), the token-embedding matrix",
    )
    cfg = preset("lab")
    assert (int(vocab.replace(",", "")), int(hidden)) == (cfg.vocab_size, cfg.hidden_size)
    assert int(difference.replace(",", "")) == page_model().tok_emb.weight.numel()
    assert int(difference.replace(",", "")) == cfg.vocab_size * cfg.hidden_size


def check_embedding_share(text: str) -> None:
    (share,) = said(text, r"the embeddings \(tokens and positions\) are (\d+) % of this one")
    model = page_model()
    embeddings = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert int(share) == round(100 * embeddings / model.num_parameters())


def check_zero_bubble_row(text: str) -> None:
    said(
        text,
        r"\| zero bubble \| split backward into input and weight gradients \| smaller still "
        r"\| p on every rank \(1F1B's rank 0\) \|",
    )
    for p, m in ((2, 4), (4, 8), (8, 16)):
        zero_bubble = [peak_in_flight(acts) for acts in make_schedule("zb-h1", p=p, m=m)]
        one_f_one_b = [peak_in_flight(acts) for acts in make_schedule("1f1b", p=p, m=m)]
        assert zero_bubble == [p] * p == [one_f_one_b[0]] * p, (p, m)


def check_reading_rate(text: str) -> None:
    (rate,) = said(text, r"Minutes are reading \((\d+) words a minute\)")
    assert int(rate) == page_times.WORDS_PER_MINUTE


CHECKS = [check_tied_embedding, check_embedding_share, check_zero_bubble_row, check_reading_rate]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_model_and_code(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_tied_embedding, "= 1,024 × 64", "= 2,048 × 64"),
        (check_embedding_share, "are 26 % of", "are 33 % of"),
        (check_zero_bubble_row, "(1F1B's rank 0)", "(1F1B's rank p − 1)"),
        (check_reading_rate, "(200 words a minute)", "(250 words a minute)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

"""torchtitan, read through its code: the page's numbers are those of our config function,
torchtitan's debug model and the recorded run (numbers in prose come from data).

- the model: torchtitan's llama3 debug flavor as tinyscale.compat.titan_config's
  tinyscale_debug() builds it (layers, dim, vocabulary), our tokenizer's VOCAB_SIZE, and
  the parameter count of the recorded run;
- the run: the first and last losses and the steps of the recorded output, the tokens
  each rank sees per step (the config's local batch × sequence length), and ln(vocabulary)
  as the loss of a uniform guess.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from helpers import fails_when_changed, prose, recorded_output, said

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

PAGE = "week-2/torchtitan.md"


@pytest.fixture(scope="module")
def config():
    """tinyscale_debug() as the run uses it, without writing the tokenizer and corpus."""
    from tinyscale.compat import titan_config

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(titan_config, "prepare_assets", lambda: Path("assets"))
        return titan_config.tinyscale_debug()


def recorded() -> str:
    return "\n".join(recorded_output(PAGE, "--config tinyscale_debug 2>&1"))


def check_model(text: str, config) -> None:
    from tinyscale.compat.titan_config import VOCAB_SIZE

    model = config.model_spec.model
    entries, ours = said(
        text,
        r"The model keeps the debug flavor's ([\d,]+)-entry vocabulary; our tokenizer uses the "
        r"first (\d+)\.",
    )
    params, layers, dim, vocab = said(
        text,
        r"\*\*The model\*\*: ([\d,]+) parameters \((\d+) layers, dim (\d+), vocabulary ([\d,]+)\)\.",
    )
    assert int(entries.replace(",", "")) == int(vocab.replace(",", "")) == model.vocab_size
    assert int(ours) == VOCAB_SIZE < model.vocab_size
    assert (int(layers), int(dim)) == (len(model.layers), model.dim)
    assert f"debugmodel size: {params} total parameters" in recorded()


def check_run(text: str, config) -> None:
    first, last, steps, tokens, sequences, length, vocab, uniform = said(
        text,
        r"\*\*The loss falls\*\*: ([\d.]+) → ([\d.]+) in (\d+) steps of (\d+) tokens per rank "
        r"\((\d+) sequences of (\d+)\)\. The first loss is above ln (\d+) = ([\d.]+), the loss "
        r"of a uniform guess",
    )
    losses = [float(x) for x in re.findall(r"step: +\d+ +loss: +([\d.]+)", recorded())]
    assert (float(first), float(last)) == (round(losses[0], 2), round(losses[-1], 2))
    assert int(steps) == len(losses) == config.training.steps
    training = config.training
    assert (int(sequences), int(length)) == (training.local_batch_size, training.seq_len)
    assert int(tokens) == int(sequences) * int(length)
    assert int(vocab) == config.model_spec.model.vocab_size
    assert float(uniform) == round(math.log(int(vocab)), 2) < losses[0]


@pytest.mark.parametrize("check", [check_model, check_run])
def test_the_pages_numbers_are_those_of_the_config_and_the_run(check, config) -> None:
    check(prose(PAGE), config)


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_model, "the debug flavor's 2,048-entry", "the debug flavor's 4,096-entry"),
        (
            check_model,
            "(6 layers, dim 256, vocabulary 2,048)",
            "(8 layers, dim 256, vocabulary 2,048)",
        ),
        (check_run, "in 6 steps of 256 tokens per rank", "in 6 steps of 512 tokens per rank"),
        (check_run, "ln 2048 = 7.62", "ln 2048 = 7.60"),
    ],
)
def test_self_check_a_changed_number_fails(check, config, old: str, new: str) -> None:
    fails_when_changed(lambda text: check(text, config), prose(PAGE), old, new)

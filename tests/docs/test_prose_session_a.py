"""Session A's numbers, read from the page and compared with the data (numbers in prose come
from data):

- the memory estimate: the bytes per parameter of `tinyscale.core.memory.RECIPES`, the
  GPUs a 70B model needs, the answer of the 3B question;
- the measured activations, against the page's own compared output;
- the held-out share (the code's default) and the loss of a uniform guess (ln vocab).
"""

from __future__ import annotations

import inspect
import math
import re

import pytest

from helpers import fails_when_changed, prose, said
from tinyscale.core.config import load_model_config
from tinyscale.core.data import build_datasets
from tinyscale.core.memory import RECIPES, model_state_bytes

PAGE = "workshop/session-a.md"


def check_model_states(text: str) -> None:
    (gpu, gpus) = said(
        text,
        r"more than the (\d+) GB of an H100 \(NVIDIA's datasheet\)\. A 70B model needs a "
        r"terabyte: at least (\d+) such GPUs just to hold it",
    )
    (llama70,) = said(text, r'\("Llama 2 70B", ([\d.e]+)\)')
    total = model_state_bytes(float(llama70), "bf16").total
    assert int(gpus) == math.ceil(total / (int(gpu) * 1e9))
    weights, grads, optimizer = said(
        text, r"compare with the formula \((\d+) \+ (\d+) \+ (\d+) bytes per parameter\)"
    )
    assert (int(weights), int(grads), int(optimizer)) == RECIPES["fp32"]
    kept, per_param, share = said(
        text,
        r"\(in fp32, (\d+) of the (\d+) bytes per parameter a checkpoint keeps: (two-thirds|half|a third)\)",
    )
    w, _, o = RECIPES["fp32"]
    assert (int(kept), int(per_param)) == (o, w + o), "the optimizer state; no gradients"
    assert {"two-thirds": 2 / 3, "half": 1 / 2, "a third": 1 / 3}[share] == o / (w + o)


def check_activations(text: str) -> None:
    mib, batch, states = said(
        text,
        r"the \*activations\* \((\d+) MiB at batch (\d+)\) dwarf the model states \(([\d.]+) MiB\), "
        r"and they double when the batch doubles",
    )
    measured = {
        int(b): float(m)
        for b, m in re.findall(r"activations, batch +(\d+) x 64 tokens: ([\d.]+) MiB", text)
    }
    assert int(mib) == round(measured[int(batch)])
    assert [round(measured[2 * b] / measured[b], 1) for b in (16, 32)] == [2.0, 2.0]
    (formula,) = set(re.findall(r"formula: +weights .* = ([\d.]+) MiB", text))
    assert states == formula


def check_heldout(text: str) -> None:
    (percent,) = said(text, r"We keep the last (\d+) % of the token stream aside")
    fraction = inspect.signature(build_datasets).parameters["heldout_fraction"].default
    assert int(percent) == round(100 * fraction)
    vocab, start, ln_of, loss = said(
        text,
        r"An untrained model with a vocabulary of (\d+) starts near (\d+) \(loss ≈ ln (\d+) ≈ ([\d.]+)\)",
    )
    assert int(vocab) == int(start) == int(ln_of) == load_model_config().vocab_size
    assert float(loss) == round(math.log(int(vocab)), 2)


def check_three_billion(text: str) -> None:
    gpu, per_param, billions, states, gib, total, used, left, seven, bigger = said(
        text,
        r"Does it fit for training on one (\d+) GB GPU with mixed-precision Adam\?\" Model states "
        r"alone are (\d+) bytes × (\d+) × 10⁹ = (\d+) GB \(([\d.]+) GiB\), so they fit, leaving "
        r"(\d+) − (\d+) = (\d+) GB for activations\. .*? At 7B \(16 × (\d+) = (\d+) GB\)",
    )
    assert int(per_param) == sum(RECIPES["bf16"])
    assert int(states) == int(per_param) * int(billions) < int(gpu)
    assert float(gib) == round(int(states) * 1e9 / 2**30, 1)
    assert (int(total), int(used), int(left)) == (int(gpu), int(states), int(gpu) - int(states))
    assert int(bigger) == int(per_param) * int(seven) > int(gpu)


CHECKS = [check_model_states, check_activations, check_heldout, check_three_billion]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_model_states, "at least 14 such GPUs", "at least 13 such GPUs"),
        (check_model_states, "keeps: two-thirds)", "keeps: half)"),
        (check_activations, "(20 MiB at batch 16)", "(40 MiB at batch 16)"),
        (check_heldout, "≈ ln 1024 ≈ 6.93)", "≈ ln 1024 ≈ 6.39)"),
        (check_three_billion, "(44.7 GiB)", "(48.0 GiB)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

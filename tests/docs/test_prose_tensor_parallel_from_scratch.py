"""Tensor parallelism from scratch: the numbers in its prose are those of its data.

- the collectives per block, against the demo's recorded count (a CI-compared output);
- why a contiguous cut of the fused qkv fails: rank 0 of 2 gets q and half of k;
- the weights' difference after 3 AdamW steps (recorded), the learning rate (the code),
  and the tolerances the page quotes, against the constants of
  tests/tinyscale/tensor_parallel/test_tp_model.py;
- fp32's 4 bytes in the all-reduce formula; the parameters per rank at t = 2 and 4, and the
  sizes t must divide, from the formula and the presets;
- Exercise 2's recorded run: plain TP's norm gradients are one process's on every rank,
  SP's are not until `sync_sequence_parallel_grads` sums them.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from helpers import fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.core.config import load_model_config, preset
from tinyscale.core.errors import UsageError
from tinyscale.tensor_parallel import tp_parity
from tinyscale.tensor_parallel.tp_model import (
    check_tensor_parallel_size,
    parameters_per_rank,
)

PAGE = "week-4/tensor-parallel-from-scratch.md"
TIMES = {"once": 1, "twice": 2}


def tolerances():
    """The parity test's constants, read from its module."""
    return load_script("test_tp_model", folder="tests/tinyscale/tensor_parallel")


def demo_output() -> str:
    return "\n".join(recorded_output(PAGE, "tp_parity import demo"))


def check_messages_per_block(text: str) -> None:
    forward, backward = said(
        text,
        r"combine partial results inside the layer, (\w+) per block in the forward pass and "
        r"(\w+) in the backward pass",
    )
    recorded = re.search(r"one block: forward \{'all_reduce': (\d)\}, backward "
                         r"\{'all_reduce': (\d)\}", demo_output())  # fmt: skip
    assert recorded and (TIMES[forward], TIMES[backward]) == tuple(map(int, recorded.groups()))


def check_qkv_cut(text: str) -> None:
    (share,) = said(
        text, r"If you cut it into t contiguous pieces, rank 0 of 2 gets all of q and (\w+) of k\."
    )
    for cfg in (preset("tiny"), load_model_config()):
        rows, h = 3 * cfg.hidden_size, cfg.hidden_size  # [q | k | v], h rows each
        first = rows // 2  # rank 0's contiguous piece
        assert first >= h, "all of q"
        assert {"half": 2}[share] * (first - h) == h, "and a share of k"


def check_adam_and_tolerances(text: str) -> None:
    (weights,) = said(text, r"The weights after 3 AdamW steps differ by ([\d.]+e-\d+)\.")
    worst = max(float(x) for x in re.findall(r"weights after 3 steps ([\d.e+-]+)", demo_output()))
    assert float(weights) == float(f"{worst:.1e}")
    (lr,) = said(text, r"move the weight by a visible part of the learning rate \(([\de-]+)\)")
    assert re.findall(r"AdamW\(m\.parameters\(\), lr=([\de.-]+)\)", inspect.getsource(tp_parity))
    assert {float(x) for x in re.findall(r"lr=([\de.-]+)\)", inspect.getsource(tp_parity))} == {
        float(lr)
    }
    loss, values, weights_bound = said(
        text,
        r"It requires loss < ([\de-]+), logits and gradients < ([\de-]+), and "
        r"weights < ([\de-]+)\.",
    )
    test = tolerances()
    assert float(loss) == test.LOSS_TOLERANCE
    assert float(values) == test.VALUE_TOLERANCE
    assert float(weights_bound) == test.WEIGHT_TOLERANCE


def check_bytes_formula(text: str) -> None:
    size, again = said(
        text,
        r"an all-reduce of a buffer of b × s × h × (\d) bytes sends 2\(t − 1\)/t × b·s·h·(\d) "
        r"bytes per rank",
    )
    assert int(size) == int(again) == torch.finfo(torch.float32).bits // 8


def check_parameters_per_rank(text: str) -> None:
    two, four = said(
        text,
        r"\(([\d,]+) on each of 2 ranks for the tiny preset above, and ([\d,]+) on each of 4\)",
    )
    cfg = preset("tiny")
    assert int(two.replace(",", "")) == parameters_per_rank(cfg, 2)
    assert int(four.replace(",", "")) == parameters_per_rank(cfg, 4)


def check_what_limits_t(text: str) -> None:
    heads, channels, vocab = said(
        text,
        r"t must divide the (\d+) heads, the (\d+) FFN channels and the ([\d,]+) vocabulary "
        r"entries, so t ∈ \{1, 2, 4\}",
    )
    cfg = load_model_config()  # the course model: code/config/config.json
    assert (int(heads), int(channels), int(vocab.replace(",", ""))) == (
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
    )
    fits = []
    for t in range(1, 9):
        try:
            check_tensor_parallel_size(cfg, t)
            fits.append(t)
        except UsageError:
            pass
    assert fits == [1, 2, 4]


def check_norm_exercise(text: str) -> None:
    said(text, r"Plain TP: both ranks hold one process's gradient, to the last bits of a float32")
    said(text, r"TP \+ SP: each rank holds its own positions' part, far from it")
    lines = recorded_output(PAGE, "run_on_ranks(norm_gradients, 2)")
    bound = tolerances().VALUE_TOLERANCE
    rows = {}
    for line in lines:
        name, numbers = line.split(":", 1)
        rows[name.strip()] = [float(x) for x in re.findall(r"\d\.\de[-+]\d+", numbers)]
    assert max(rows["TP"]) < bound, "plain TP: every rank has one process's gradient"
    before, after = rows["TP + SP"][:2], rows["TP + SP"][2:]
    assert min(before) > 100 * bound and before[0] != before[1], "SP: partial, and different"
    assert max(after) < bound, "summed: one process's"


CHECKS = [
    check_messages_per_block,
    check_qkv_cut,
    check_adam_and_tolerances,
    check_bytes_formula,
    check_parameters_per_rank,
    check_what_limits_t,
    check_norm_exercise,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_messages_per_block, "twice in the backward pass", "once in the backward pass"),
        (check_adam_and_tolerances, "differ by 1.1e-4", "differ by 1.5e-4"),
        (check_adam_and_tolerances, "and weights < 1e-3", "and weights < 1e-2"),
        (check_parameters_per_rank, "and 7,216 on each of 4", "and 7,200 on each of 4"),
        (check_what_limits_t, "the 1,024 vocabulary entries", "the 2,048 vocabulary entries"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

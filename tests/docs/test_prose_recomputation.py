"""Activation recomputation: the numbers in its prose are those of its data.

The page's demos are CI-compared outputs (`recorded_output`); the rest, checked here:

- fp32's 4 bytes per saved element (core.precision's table, through the calculator);
- "each block's forward runs twice": full recomputation adds one forward of the blocks;
- the FLOPs it adds on the bench preset (25% and 1%), against the formulas, and the
  forward pass as a third of a step's work (core.flops);
- the 70B question, the `70b` preset of the Week 4 planner;
- Exercise 1's FFN, 4h wide in the `lab` preset.
"""

from __future__ import annotations

import pytest

from helpers import fails_when_changed, prose, recorded_output, said
from tinyscale.core.config import preset
from tinyscale.core.flops import flops_per_token, matmul_weights
from tinyscale.core.model import count_parameters
from tinyscale.core.recompute import recompute_flops_per_token
from tinyscale.data_parallel.memory_calculator import activation_element_bytes

PAGE = "week-5/recomputation.md"
WORDS = {"twice": 2, "third": 1 / 3}


def check_element_bytes(text: str) -> None:
    (fp32,) = said(text, r"a the heads \(fp32: (\d) bytes each\)")
    assert activation_element_bytes("fp32") == int(fp32)


def check_runs_twice(text: str) -> None:
    (times,) = said(text, r"the table, and each block's forward runs (twice)\.")
    cfg, T = preset("tiny"), 16
    d, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    forward = 2 * L * (4 * d * d + 2 * d * i) + 4 * L * T * d  # the blocks' forward, once
    assert recompute_flops_per_token(cfg, T, "full") == (WORDS[times] - 1) * forward


def check_costs(text: str) -> None:
    full, third, selective = said(
        text,
        r"Full recomputation adds (\d+)% to a step's FLOPs here;.{0,80}?the forward pass is the "
        r"cheaper (third) of the work.{0,200}?Selective recomputation, with a fused kernel, "
        r"costs (\d+)%",
    )
    cfg, T = preset("bench"), 64
    shown = recorded_output(PAGE, "time_demo()")
    for mode, share in (("full", full), ("selective", selective)):
        extra = recompute_flops_per_token(cfg, T, mode) / flops_per_token(cfg, T)
        assert round(100 * extra) == int(share)
        assert any(line.split()[:2] == [mode, f"{share}%"] for line in shown)
    forward = 2 * matmul_weights(cfg) + 4 * cfg.num_hidden_layers * T * cfg.hidden_size
    assert forward / flops_per_token(cfg, T) == pytest.approx(WORDS[third])


def check_seventy_b(text: str) -> None:
    (size,) = said(text, r"The (\d+)B question of Week 4, with full recomputation:")
    assert f"--model {size}b" in text
    params = count_parameters(preset(f"{size}b"))  # the planner's first line, compared by CI
    assert recorded_output(PAGE, "--recompute full")[0].startswith(f"{size}b: {params / 1e9:.1f} B")


def check_ffn_width(text: str) -> None:
    (width,) = said(text, r"In a model whose FFN is (\d)h wide \(the `lab` preset")
    cfg = preset("lab")
    assert cfg.intermediate_size == int(width) * cfg.hidden_size


CHECKS = [check_element_bytes, check_runs_twice, check_costs, check_seventy_b, check_ffn_width]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_element_bytes, "(fp32: 4 bytes each)", "(fp32: 2 bytes each)"),
        (check_runs_twice, "forward runs twice.", "forward runs thrice."),
        (check_costs, "adds 25% to a step's", "adds 33% to a step's"),
        (check_costs, "costs 1% and", "costs 2% and"),
        (check_ffn_width, "FFN is 4h wide", "FFN is 2h wide"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

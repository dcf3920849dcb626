"""The DeepSpeed page's numbers in prose are those of the model, the runs and the tests.

The page's outputs (the ZeRO-2 run, the `deepspeed_costs` table) are compared by CI; what
the page says of them in its own words is read here and checked against the same data:

- the bf16 loss line: each rank's loss is a bf16 number, the logged loss the mean of two;
- the memory table: the optimizer state halves from stage 1, the weights at stage 3;
- the tied embedding's share of Ψ, gathered twice per pass: the 3.77Ψ of row *f*;
- the tolerances the page states are the ones `deepspeed_costs` and the script's test use,
  and the steps that test trains.

The config settings the page lists are rules (tests/docs/prose_rules/workshop.py), each
checked against code/config/deepspeed/*.json when it was written.
"""

from __future__ import annotations

import importlib.util
import math
import re
from types import ModuleType

import pytest
import torch

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.compat.deepspeed_costs import LOSS_TOLERANCE, TRAFFIC_TOLERANCE
from tinyscale.core.config import load_model_config
from tinyscale.core.memory import human_bytes
from tinyscale.core.model import TinyTransformer

PAGE = "workshop/deepspeed.md"


def script_test() -> ModuleType:
    """tests/scripts/test_deepspeed_train.py, for its constants (steps, tolerance)."""
    path = ROOT / "tests" / "scripts" / "test_deepspeed_train.py"
    spec = importlib.util.spec_from_file_location("prose_deepspeed_train_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def num_params() -> int:
    return sum(p.numel() for p in TinyTransformer(load_model_config()).parameters())


def costs_table(text: str) -> dict[str, tuple[str, str, float]]:
    """The page's `deepspeed_costs` block (compared by CI): label -> (weights, optimizer
    state, as printed; measured traffic in Ψ, 2 for the no-ZeRO row, the paper's)."""
    size = r"([\d.]+ (?:B|KiB|MiB))"
    rows = {}
    for label, weights, optimizer, traffic in re.findall(
        r"(no ZeRO|ZeRO-\d(?: [rf])?) "
        + size
        + r"(?: \([^)]*\))? "
        + size
        + r"(?: \([^)]*\))? ([\d.]+) Ψ",
        text,
    ):
        rows[label] = (weights, optimizer, float(traffic))
    assert set(rows) == {"no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-2 r", "ZeRO-3", "ZeRO-3 f"}
    return rows


def check_bf16_loss(text: str) -> None:
    bits, precision, low, high, step, first, second, mean_step = said(
        text,
        r"Each rank's loss is a bf16 number \((\d+) bits of mantissa stored, (\d+) with the "
        r"implicit leading 1: between (\d+) and (\d+) its steps are 1/(\d+)\), and the line "
        r"prints the mean of the two ranks' losses, so ([\d.]+) and ([\d.]+) are multiples of "
        r"1/(\d+): the model runs in bf16",
    )
    eps = torch.finfo(torch.bfloat16).eps
    assert eps == 2.0 ** -int(bits) and int(precision) == int(bits) + 1
    assert int(low) * eps == 1 / int(step) and int(high) == 2 * int(low)
    worlds = set(re.findall(r"backend gloo \| device cpu \| world (\d+)", text))
    assert worlds == {"2"} and int(mean_step) == int(step) * 2, "the mean of two: half a step"
    for loss in (first, second):
        assert int(low) <= float(loss) < int(high)
        on_grid = round(float(loss) * int(mean_step)) / int(mean_step)
        assert round(on_grid, 4) == float(loss), loss
    # 6.5781 is a mean of two ranks' losses, not itself a bf16 number
    assert torch.tensor(float(first)).bfloat16().item() != pytest.approx(float(first), abs=1e-4)


def check_memory_halves(text: str) -> None:
    said(
        text, r"The optimizer state halves from stage 1 on \(N = 2\); the weights halve at stage 3"
    )
    rows = costs_table(text)
    psi = num_params()
    assert rows["no ZeRO"][1] == human_bytes(12 * psi)  # fp32 master weights and two moments
    for stage in ("ZeRO-1", "ZeRO-2", "ZeRO-3"):
        assert rows[stage][1] == human_bytes(12 * psi / 2), stage
    for stage in ("no ZeRO", "ZeRO-1", "ZeRO-2"):
        assert rows[stage][0] == human_bytes(2 * psi), stage  # bf16 weights, whole
    assert rows["ZeRO-3"][0] == human_bytes(2 * psi / 2)


def check_tied_embedding(text: str) -> None:
    share, vocab, width, params, used, gathered = said(
        text,
        r"the traffic is the paper's 3Ψ plus 2 × ([\d.]+)Ψ\. The [\d.]+Ψ is the tied embedding "
        r"\((\d+) × (\d+) of the ([\d,]+) parameters\): it is used (twice) per pass \(input "
        r"embedding and output layer\), so it is gathered (twice) per pass\.",
    )
    cfg = load_model_config()
    model = TinyTransformer(cfg)
    assert model.lm_head.weight is model.tok_emb.weight, "tied: one tensor, two uses"
    assert (int(vocab), int(width)) == (cfg.vocab_size, cfg.hidden_size)
    assert int(params.replace(",", "")) == num_params()
    assert round(int(vocab) * int(width) / num_params(), 3) == float(share)
    assert used == gathered == "twice"
    measured = costs_table(text)["ZeRO-3 f"][2]
    assert round(3 + 2 * float(share), 2) == measured
    again, seen = said(
        text,
        r"Expected 3Ψ, plus 2 × ([\d.]+)Ψ because the tied embedding is gathered twice per "
        r"pass; measured ([\d.]+)Ψ\.",
    )
    assert again == share and float(seen) == measured


def check_tolerances(text: str) -> None:
    (traffic,) = said(text, r"moves other traffic than the paper says \(within ([\d.]+) Ψ\)")
    (again,) = said(text, r"leaves that number by more than ([\d.]+)Ψ\.")
    assert float(traffic) == float(again) == TRAFFIC_TOLERANCE
    (loss,) = said(text, r"a row leaves the first by more than one bf16 rounding step \(([\d.]+)\)")
    assert float(loss) == LOSS_TOLERANCE
    assert round(4 * torch.finfo(torch.bfloat16).eps, 3) == LOSS_TOLERANCE, "a step near 6"
    module = script_test()
    half, steps, exponent = said(
        text,
        r"trains ZeRO-3 in fp32 with dropout 0 for (\d+) steps, then relaunches with `--resume "
        r"auto` to step (\d+) .*? batches within 10⁻([¹²³⁴⁵⁶⁷⁸⁹]) per step",
    )
    assert (int(half), int(steps)) == (module.HALF, module.STEPS)
    (to_lab1,) = said(
        text, r"With `--precision fp32 --dropout 0` the losses are Lab 1's to 10⁻([¹²³⁴⁵⁶⁷⁸⁹]) "
    )
    (compared,) = said(
        text, r"the tests train in fp32 so that losses can be compared to 10⁻([¹²³⁴⁵⁶⁷⁸⁹])\)"
    )
    for said_here in (exponent, to_lab1, compared):
        power = int(said_here.translate(str.maketrans("¹²³⁴⁵⁶⁷⁸⁹", "123456789")))
        assert math.isclose(10.0**-power, module.LAB1_TOLERANCE), said_here


CHECKS = [check_bf16_loss, check_memory_halves, check_tied_embedding, check_tolerances]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_bf16_loss, "(7 bits of mantissa stored", "(8 bits of mantissa stored"),
        (check_tied_embedding, "plus 2 × 0.386Ψ. The", "plus 2 × 0.486Ψ. The"),
        (check_tolerances, "(within 0.01 Ψ)", "(within 0.02 Ψ)"),
        (check_tolerances, "for 3 steps, then", "for 4 steps, then"),
        (check_tolerances, "can be compared to 10⁻⁵)", "can be compared to 10⁻⁶)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

"""FSDP2 and HSDP: the page's numbers are those of its recorded runs, the formulas and the
tests (numbers in prose come from data).

The runs are the page's code blocks, compared by CI with their recorded outputs;
tests/tinyscale/data_parallel/test_fsdp.py reads those outputs (its ``facts``) and holds
the tolerances. This module checks the sentences about them:

- the fp32 tolerance: test_fsdp's PARITY_TOLERANCE, the ZeRO lesson's (test_zero.py);
- the bytes sent at N = 2 (all-gather twice, reduce-scatter once) and what bf16 halves;
- bf16's bytes per parameter, the bytes held (4 + 4 + 8), the loss difference against
  one bf16 step (test_fsdp's BF16_LOSS_STEP, from torch.finfo), the steps and the lr;
- HSDP: its difference from our ZeRO-3 at N = 4, and what each rank holds against FSDP
  over 4 (tinyscale.data_parallel.memory_calculator).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from helpers import fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.data_parallel.fsdp import compare_with_zero3
from tinyscale.data_parallel.memory_calculator import zero_state_bytes

PAGE = "week-2/fsdp.md"
SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def fsdp_tests():
    """tests/tinyscale/data_parallel/test_fsdp.py: its tolerances, and ``facts`` of a run."""
    return load_script("test_fsdp", folder="tests/tinyscale/data_parallel")


def number(text: str) -> int:
    return int(text.replace(",", ""))


def check_fp32(text: str) -> None:
    tests = fsdp_tests()
    zero_tests = load_script("test_zero", folder="tests/tinyscale/data_parallel")
    (allowed,) = said(text, r"The test allows ([\d.e-]+) \(the tolerance of the ZeRO lesson\)\.")
    assert float(allowed) == tests.PARITY_TOLERANCE == zero_tests.PARITY_TOLERANCE

    gather, twice, scatter, total = said(
        text,
        r"\*\*The same bytes sent\*\*: all-gather ([\d,]+) \((twice) \(N−1\)/N · 4Ψ: forward and "
        r"backward\) plus reduce-scatter ([\d,]+) \(\(N−1\)/N · 4Ψ\) = ([\d,]+) = 3\(N−1\)/N · 4Ψ",
    )
    f = tests.facts(tests.FP32)
    one_way = (2 - 1) / 2 * 4 * f["psi"]  # (N−1)/N · 4Ψ at N = 2
    sent = f["sent"]
    assert twice == "twice" and number(gather) == sent["all_gather_single"] == 2 * one_way
    assert number(scatter) == sent["reduce_scatter_single"] == one_way
    assert number(total) == number(gather) + number(scatter) == 3 * one_way


def check_bf16_bytes(text: str) -> None:
    tests = fsdp_tests()
    fp32, bf16 = tests.facts(tests.FP32), tests.facts(tests.BF16)
    gather_fp32, gather_bf16 = (f["sent"]["all_gather_single"] for f in (fp32, bf16))
    (objective,) = said(
        text, r"Add a mixed-precision policy and see the all-gather bytes (halve)\."
    )
    word, smaller, larger = said(
        text,
        r"The all-gather (halves) \(([\d,]+) against ([\d,]+)\); the reduce-scatter stays fp32\.",
    )
    assert (objective, word) == ("halve", "halves") and 2 * gather_bf16 == gather_fp32
    assert (number(smaller), number(larger)) == (gather_bf16, gather_fp32)
    assert bf16["sent"]["reduce_scatter_single"] == fp32["sent"]["reduce_scatter_single"]

    low, high = said(
        text,
        r"the all-gather moves (\d) bytes per parameter instead of (\d), and forward and "
        r"backward run in bf16",
    )
    per_parameter = {  # forward and backward gathers, (N−1)/N of Ψ each, at N = 2
        name: f["sent"]["all_gather_single"] / (2 * (2 - 1) / 2 * f["psi"])
        for name, f in (("bf16", bf16), ("fp32", fp32))
    }
    assert per_parameter == {"bf16": int(low), "fp32": int(high)}

    weights, grads, optimizer = said(
        text,
        r"the master weights, fp32 gradients and the moments are still (\d) \+ (\d) \+ (\d+) bytes\.",
    )
    per_rank = [int(n) * bf16["psi"] / 2 for n in (weights, grads, optimizer)]  # N = 2
    assert bf16["held"][:3] == per_rank == fp32["held"][:3]


def check_bf16_loss(text: str) -> None:
    tests = fsdp_tests()
    bf16 = tests.facts(tests.BF16)
    diff, loss, exponent, step, bits = said(
        text,
        r"The losses now differ from fp32 by up to ([\d.]+), less than one bf16 step at ([\d.]+) "
        r"\(2⁻([⁰¹²³⁴⁵⁶⁷⁸⁹]) = ([\d.]+)\): bf16 keeps (\d+) bits of mantissa",
    )
    worst = max(abs(a - b) for a, b in zip(bf16["fsdp"], bf16["ours"], strict=True))
    assert float(diff) == round(worst, 3)
    eps = torch.finfo(torch.bfloat16).eps  # 2^-7: 7 stored bits and the implicit one
    assert int(bits) == 1 - math.log2(eps)
    spacing = 2 ** math.floor(math.log2(float(loss))) * eps  # between bf16 numbers near the loss
    assert spacing == 2.0 ** -int(exponent.translate(SUPERSCRIPTS)) == tests.BF16_LOSS_STEP
    assert float(step) == round(spacing, 3) and worst < spacing
    binade = math.floor(math.log2(float(loss)))  # [4, 8): one bf16 step for every loss
    assert all(math.floor(math.log2(x)) == binade for x in bf16["ours"] + bf16["fsdp"])

    weights, steps, lr = said(
        text, r"The weights differ by ([\d.e-]+) after (\d+) steps at lr ([\d.e-]+) —"
    )
    run = "\n".join(recorded_output(PAGE, tests.BF16))
    assert f"after {steps} steps: {float(weights):.1e}" in run  # 2.8e-03
    defaults = inspect.signature(compare_with_zero3).parameters
    assert (int(steps), float(lr)) == (defaults["steps"].default, defaults["lr"].default)


def check_hsdp(text: str) -> None:
    tests = fsdp_tests()
    hsdp = tests.facts(tests.HSDP)
    (diff,) = said(
        text,
        r"HSDP over 4 ranks trains \*\*the same model\*\* as our ZeRO-3 over 4 ranks "
        r"\(([\d.e-]+): the four gradients",
    )
    assert float(diff) == hsdp["diff"]
    (word,) = said(
        text, r"Each rank holds 16Ψ/\*\*2\*\*, (twice) what FSDP over 4 ranks would hold"
    )
    fsdp4 = zero_state_bytes(hsdp["psi"], stage=3, world_size=4, precision="fp32").total
    assert word == "twice" and hsdp["held"][3] == 2 * fsdp4


CHECKS = [check_fp32, check_bf16_bytes, check_bf16_loss, check_hsdp]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_recorded_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_fp32, "The test allows 1e-5 (", "The test allows 1e-6 ("),
        (check_fp32, "= 155,904 = 3(N−1)/N", "= 155,000 = 3(N−1)/N"),
        (check_bf16_bytes, "The all-gather halves (", "The all-gather doubles ("),
        (
            check_bf16_bytes,
            "moves 2 bytes per parameter instead of 4",
            "moves 1 bytes per parameter instead of 4",
        ),
        (check_bf16_bytes, "are still 4 + 4 + 8 bytes", "are still 2 + 2 + 12 bytes"),
        (check_bf16_loss, "by up to 0.025,", "by up to 0.018,"),
        (check_bf16_loss, "(2⁻⁵ = 0.031)", "(2⁻⁵ = 0.063)"),
        (check_bf16_loss, "keeps 8 bits of mantissa", "keeps 7 bits of mantissa"),
        (check_bf16_loss, "after 3 steps at lr 1e-3", "after 3 steps at lr 1e-4"),
        (check_hsdp, "over 4 ranks (8.4e-7:", "over 4 ranks (9.4e-7:"),
        (check_hsdp, "16Ψ/**2**, twice what", "16Ψ/**2**, half what"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

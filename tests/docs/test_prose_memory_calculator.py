"""The memory calculator page: its numbers are those of the formulas, the recorded outputs
and the tests (numbers in prose come from data).

- bytes per parameter of each layout: tinyscale.core.memory.RECIPES;
- the checks the page cites: FORMULA_TOLERANCE of tests/tinyscale/data_parallel/test_zero.py
  (and the held bytes of docs/generated/week2/zero_memory.json, equal to the formula),
  the paper's Figure 1 recomputed with zero_state_bytes;
- how far CPU autocast's activations exceed the bf16 estimate, measured again on the
  configs of tests/tinyscale/data_parallel/test_memory_calculator.py;
- activations against model states in the page's recorded runs, and a 7 B model's states;
- HSDP's model states against ZeRO-3 over all 4 ranks, from the recorded output.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import ROOT, fails_when_changed, load_script, prose, recorded_output, said
from tinyscale.core.memory import RECIPES, model_state_bytes
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate, zero_state_bytes

PAGE = "week-2/memory-calculator.md"
LAPTOP = "--precision bf16 --world-size 4 --stage 2 --micro-batch 8"
CLUSTER = "--precision bf16 --world-size 64 --stage 3 --micro-batch 32"
HSDP = "--precision bf16 --world-size 4 --stage 3 --shard-size 2 --micro-batch 8"


def report(flags: str) -> dict[str, int]:
    """A recorded run of the calculator: its parameters, and bytes per rank by line."""
    lines = recorded_output(PAGE, flags)
    out = {"parameters": int(lines[0].split()[0].replace(",", ""))}
    for line in lines[1:]:
        m = re.match(r"([a-z ]+?)\s+([\d,]+) B ", line)
        if m:
            out[m[1]] = int(m[2].replace(",", ""))
    return out


def states(r: dict[str, int]) -> int:
    return r["weights"] + r["gradients"] + r["optimizer states"]


def check_layouts(text: str) -> None:
    bf16 = said(
        text,
        r"16-bit weights and gradients beside an fp32 master copy inside the optimizer "
        r"\((\d+) \+ (\d+) \+ (\d+) bytes\)",
    )
    *autocast, both = said(
        text,
        r"keeps the fp32 weights as the master copy and casts on the fly \((\d+) \+ (\d+) \+ "
        r"(\d+)\)\. Both are (\d+) bytes per parameter",
    )
    assert tuple(int(b) for b in bf16) == RECIPES["bf16"]
    assert tuple(int(b) for b in autocast) == RECIPES["fp32"]
    assert int(both) == sum(RECIPES["bf16"]) == sum(RECIPES["fp32"])


def check_cited_tests(text: str) -> None:
    (percent,) = said(
        text, r"component by component, at N = 2 and 4, within (\d+) % \(in practice, exactly\)"
    )
    zero_tests = load_script("test_zero", folder="tests/tinyscale/data_parallel")
    assert int(percent) == round(100 * zero_tests.FORMULA_TOLERANCE)
    rows = json.loads((ROOT / "docs" / "generated" / "week2" / "zero_memory.json").read_text())[
        "rows"
    ]
    assert all(r["held"] == r["formula"] for r in rows), "in practice, exactly"

    billions, gpus, *cells = said(
        text,
        r"\(([\d.]+) B parameters, (\d+) GPUs: (\d+), ([\d.]+), ([\d.]+) and ([\d.]+) GB\)",
    )
    for stage, cell in enumerate(cells):
        total = zero_state_bytes(
            float(billions) * 1e9, stage=stage, world_size=int(gpus), precision="bf16"
        ).total
        digits = len(cell.split(".")[1]) if "." in cell else 0
        assert float(cell) == round(total / 1e9, digits), (stage, cell)


def check_autocast(text: str) -> None:
    (most,) = said(text, r"CPU autocast measures more — up to ([\d.]+) × on our configs")
    calculator_tests = load_script("test_memory_calculator", folder="tests/tinyscale/data_parallel")
    ratios = [
        calculator_tests.measured(cfg, b, s, bf16=True)
        / activation_bytes_estimate(cfg, micro_batch=b, seq_len=s, precision="bf16")
        for cfg, b, s in calculator_tests.CONFIGS
    ]
    assert float(most) == round(max(ratios), 1) and min(ratios) > 1


def check_activations_against_states(text: str) -> None:
    laptop, cluster = said(
        text,
        r"For our tiny model the activations are ([\d.]+) × the model states in the laptop's run "
        r"and (\d+) × in the cluster's",
    )
    for said_ratio, flags in ((laptop, LAPTOP), (cluster, CLUSTER)):
        r = report(flags)
        digits = len(said_ratio.split(".")[1]) if "." in said_ratio else 0
        assert float(said_ratio) == round(r["activations"] / states(r), digits), flags

    billions, per_parameter, again, gigabytes = said(
        text,
        r"A (\d+) B model holds (\d+) bytes × (\d+) B = (\d+) GB of model states before any sharding",
    )
    total = model_state_bytes(int(billions) * 1e9, "bf16").total
    assert billions == again and int(per_parameter) == sum(RECIPES["bf16"])
    assert int(gigabytes) == total / 1e9


def check_hybrid(text: str) -> None:
    (word,) = said(text, r"(Twice) the model states of ZeRO-3 over 4 ranks: the price of keeping")
    r = report(HSDP)
    over_4 = zero_state_bytes(r["parameters"], stage=3, world_size=4, precision="bf16").total
    assert word == "Twice" and states(r) == 2 * over_4


CHECKS = [
    check_layouts,
    check_cited_tests,
    check_autocast,
    check_activations_against_states,
    check_hybrid,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_layouts, "(2 + 2 + 12 bytes)", "(2 + 2 + 8 bytes)"),
        (check_layouts, "Both are 16 bytes per parameter", "Both are 12 bytes per parameter"),
        (check_cited_tests, "within 2 % (in practice", "within 1 % (in practice"),
        (check_cited_tests, "120, 31.4, 16.6 and 1.88 GB", "120, 31.4, 16.6 and 1.90 GB"),
        (check_autocast, "up to 1.9 × on our configs", "up to 2.5 × on our configs"),
        (check_activations_against_states, "are 4.7 × the model", "are 25 × the model"),
        (check_activations_against_states, "and 412 × in the", "and 41 × in the"),
        (check_activations_against_states, "= 112 GB of model states", "= 120 GB of model states"),
        (check_hybrid, "Twice the model states of ZeRO-3", "Half the model states of ZeRO-3"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

"""Week 2's intro page: its numbers are those of the formulas and the tools they name
(numbers in prose come from data).

- the paper's example, 7.5 B parameters: 120 GB of model states in either precision, and
  the table of bytes per rank at N = 64 for stages 0-3 (the paper's Figure 1), computed
  again with tinyscale.data_parallel.memory_calculator.zero_state_bytes, rounded as the
  page rounds;
- the reading speed behind the page times, tools/page_times.py's WORDS_PER_MINUTE.
"""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT, fails_when_changed, load_tool, prose, said
from tinyscale.core.memory import model_state_bytes
from tinyscale.data_parallel.memory_calculator import zero_state_bytes

PAGE = "week-2/index.md"


def check_example_model(text: str) -> None:
    total, billions = said(text, r"(\d+) GB for a ([\d.]+) B model, before one activation")
    for precision in ("fp32", "bf16"):
        assert model_state_bytes(float(billions) * 1e9, precision).total / 1e9 == int(total)


def check_stage_table(text: str) -> None:
    billions, n, *cells = said(
        text,
        r"\| stage \| shards \| bytes per rank \| ([\d.]+) B, N = (\d+) \| \|---\|---\|---\|---\| "
        r"\| 0 \(DDP\) \| nothing \| 2Ψ \+ 2Ψ \+ 12Ψ = 16Ψ \| ([\d.]+) GB \| "
        r"\| 1 \| optimizer states \| 4Ψ \+ 12Ψ/N \| ([\d.]+) GB \| "
        r"\| 2 \| \+ gradients \| 2Ψ \+ 14Ψ/N \| ([\d.]+) GB \| "
        r"\| 3 \| \+ weights \| 16Ψ/N \| ([\d.]+) GB \|",
    )
    psi = float(billions) * 1e9
    for stage, cell in enumerate(cells):
        total = zero_state_bytes(psi, stage=stage, world_size=int(n), precision="bf16").total
        digits = len(cell.split(".")[1]) if "." in cell else 0
        assert float(cell) == round(total / 1e9, digits), (stage, cell, total)


def check_reading_speed(text: str) -> None:
    (words,) = said(text, r"Minutes are reading \((\d+) words a minute\)")
    sys.path.insert(0, str(ROOT / "tools"))  # page_times imports its neighbour figures_testing
    try:
        assert int(words) == load_tool("page_times").WORDS_PER_MINUTE
    finally:
        sys.path.remove(str(ROOT / "tools"))


@pytest.mark.parametrize("check", [check_example_model, check_stage_table, check_reading_speed])
def test_the_pages_numbers_are_those_of_the_formulas(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_example_model, "120 GB for a 7.5 B model", "120 GB for a 7.0 B model"),
        (check_stage_table, "| 16.6 GB |", "| 16.4 GB |"),
        (check_stage_table, "| 1.9 GB |", "| 1.8 GB |"),
        (check_reading_speed, "(200 words a minute)", "(250 words a minute)"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

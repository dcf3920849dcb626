"""ZeRO from scratch: the numbers in prose are those of its data (issue 13: numbers in prose
come from data).

- "Peak memory per rank" describes docs/generated/week2/zero_memory.json
  (`python tools/figures_week2_memory.py`): the model's size, and what stages 0-2 peak
  at (stage 3's peak at N = 4 is compared in tests/docs/test_prose.py).
- The ring's share of the paper's 2Ψ and 3Ψ at N = 2 and N = 64: (N − 1) / N.

The |ZeRO-DDP| the tests measure at N = 4 is checked in
tests/tinyscale/data_parallel/test_zero.py, where the parity run is.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, fails_when_changed, load_tool, prose, said
from tinyscale.core.model import TinyTransformer

PAGE = "week-2/zero-from-scratch.md"
MEMORY = ROOT / "docs" / "generated" / "week2" / "zero_memory.json"


def rows() -> dict[tuple[int, int], dict]:
    data = json.loads(MEMORY.read_text())
    return {(r["world"], r["stage"]): r for r in data["rows"]}


def figure_model() -> TinyTransformer:
    return TinyTransformer(load_tool("figures_week2_memory").FIG_CFG)


def check_peaks(text: str) -> None:
    blocks, params = said(
        text, r"runs the same code on a model with (\d+) blocks \(([\d,]+) parameters\)"
    )
    model = figure_model()
    assert int(blocks) == len(model.blocks)
    assert int(params.replace(",", "")) == json.loads(MEMORY.read_text())["params"]
    assert int(params.replace(",", "")) == sum(p.numel() for p in model.parameters())

    recorded = rows()
    said(text, r"Stages 0 and 1 peak at what they hold: they allocate nothing during the step\.")
    assert all(r["peak"] == r["held"] for (_, stage), r in recorded.items() if stage < 2)
    said(
        text,
        r"Stage 2 peaks above what it holds by about \*\*two copies of one block's gradients\*\*",
    )
    block = sum(p.numel() for p in model.blocks[0].parameters())
    norm = sum(p.numel() for p in model.ln_f.parameters())
    extra = {r["peak"] - r["held"] for (_, stage), r in recorded.items() if stage == 2}
    assert extra == {(2 * block + norm) * 4}, "two blocks' fp32 gradients and the final norm's"


def check_ring_share(text: str) -> None:
    at2, n, share = said(
        text,
        r"at N = 2 the ring sends (half) as much, at N = (\d+) (\d+) %",
    )
    assert at2 == "half" and round(100 * (int(n) - 1) / int(n)) == int(share)


@pytest.mark.parametrize("check", [check_peaks, check_ring_share])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_peaks, "(318,720 parameters)", "(318,000 parameters)"),
        (check_ring_share, "at N = 64 98 %", "at N = 64 95 %"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

"""DeepSpeed ZeRO 1-3 against tinyscale.zero (tinyscale.zero_vs_deepspeed).

The run is the page's code block (docs/week-2/deepspeed-zero.md): CI executes it and
compares its output with the recorded table, so the table is a real run's. These tests
check the recorded table: every stage present, DeepSpeed's losses equal ours within
LOSS_TOLERANCE and its weights within PARAM_TOLERANCE, and the same losses at every stage.
"""

import re
from pathlib import Path

import pytest

from tinyscale.errors import run_cli
from tinyscale.zero_vs_deepspeed import STAGES, main

PAGE = Path(__file__).parents[2] / "docs" / "week-2" / "deepspeed-zero.md"
LOSS_TOLERANCE = 1e-6  # the printed precision: fp32, the same AdamW, the same batches
PARAM_TOLERANCE = 1e-5  # the ZeRO lesson's tolerance (summation order at N > 2)


def table() -> dict[int, tuple[list[float], list[float], float]]:
    text = PAGE.read_text()
    block = text[text.index("python -m tinyscale.zero_vs_deepspeed") :]
    block = block[block.index("```text") : block.index("```", block.index("```text") + 7)]
    rows = {}
    for line in block.splitlines():
        fields = line.split()
        if re.fullmatch(r"\d+ \d+\.\d+ .*", " ".join(fields)):  # "stage loss ...": a row
            values = [float(v) for v in fields[1:]]
            steps = (len(values) - 1) // 2
            rows[int(fields[0])] = (values[:steps], values[steps:-1], values[-1])
    return rows


def test_every_stage_is_recorded() -> None:
    assert sorted(table()) == list(STAGES) == [1, 2, 3]


@pytest.mark.parametrize("stage", STAGES)
def test_deepspeed_matches_our_zero(stage) -> None:
    ours, deepspeed, param_diff = table()[stage]
    assert len(ours) == len(deepspeed) == 3
    assert max(abs(a - b) for a, b in zip(ours, deepspeed, strict=True)) <= LOSS_TOLERANCE
    assert param_diff <= PARAM_TOLERANCE


def test_the_stage_does_not_change_the_arithmetic() -> None:
    rows = table()
    assert rows[1][0] == rows[2][0] == rows[3][0]


def test_bad_steps_is_one_line(capsys) -> None:
    assert run_cli(main, ["--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--steps must be at least 1" in err and err.count("\n") == 1

"""Week 3's pipeline training script, code/scripts/pipeline_train.py.

The runs are the pipeline page's code blocks: CI runs them (torchrun, 2 gloo ranks, 8
steps of 1F1B; then, with step 8's manifest removed as if the save never finished,
``--resume auto``) and compares their output with the recorded text. These tests check
that text — the stage split, the loss logged from the last stage, a resume that picks the
last complete checkpoint and repeats the same losses — and the bad input in-process:
one ``error:`` line naming the flag, exit code 2, nothing written.
"""

import re
from collections.abc import Callable

import pytest

from helpers import recorded_output

PAGE = "week-3/pipeline-torchtitan.md"


def losses(lines: list[str]) -> dict[int, float]:
    found = (re.search(r"step +(\d+)/\d+ \| loss ([\d.]+)", line) for line in lines)
    return {int(m[1]): float(m[2]) for m in found if m}


def test_recorded_run_splits_two_blocks_over_two_ranks_and_logs_the_last_stage() -> None:
    lines = recorded_output(PAGE, "rm -rf runs/pipeline")
    text = "\n".join(lines)
    assert "pp 2 x dp 1 | 1f1b | 4 micro-batches of 4 | loss on rank 1" in text
    assert "rank 0: stage 0 = blocks [0]" in text and "rank 1: stage 1 = blocks [1]" in text
    first = losses(lines)
    assert sorted(first) == [2, 4, 6, 8] and first[8] < first[2]
    assert [line.split("| ")[-1] for line in lines if "saved" in line] == [
        "saved runs/pipeline/checkpoints/step_000004",
        "saved runs/pipeline/checkpoints/step_000008",
    ]


def test_recorded_resume_skips_the_uncommitted_step_and_repeats_the_losses() -> None:
    first = losses(recorded_output(PAGE, "rm -rf runs/pipeline"))
    resumed_lines = recorded_output(PAGE, "--resume auto")
    assert any(line.endswith("resumed from step 4") for line in resumed_lines)
    assert losses(resumed_lines) == {6: first[6], 8: first[8]}


@pytest.mark.parametrize(
    ("argv", "world", "message"),
    [
        (["--pp", "3"], "2", "--pp 3 does not divide the world of 2 processes"),
        (["--pp", "4"], "2", "--pp 4 does not divide the world of 2 processes"),
        (["--pp", "0"], "2", "--pp 0 is not a number of ranks: give a whole number >= 1"),
        (["--schedule", "zb1"], "2", "--schedule 'zb1' is not known"),
        (["--schedule", "interleaved"], "2", "--pp 2 with --schedule interleaved makes 4 stages"),
        (["--microbatches", "3"], "2", "--microbatches 3 does not divide the 16 samples"),
        (["--microbatches", "3"], "4", "--microbatches 3 does not divide the 8 samples"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag_exit_2_nothing_written(
    argv: list[str], world: str, message: str, bad_input: Callable[..., str]
) -> None:
    assert bad_input("pipeline_train", argv, WORLD_SIZE=world).startswith(f"error: {message}")

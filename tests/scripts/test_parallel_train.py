"""Week 4's training script on any shape, code/scripts/parallel_train.py.

The runs are the page's code blocks: CI runs them (torchrun, 4 gloo ranks: FSDP 2 x TP 2
for two steps, resumed as PP 2 x DP 2 for two more, then as PP 2 x TP 2 for two more; and
one process for six steps) and compares their output with the recorded text. These tests
check that text: every shape's losses and gradient norms are those of one process, the
resumes name the shape that saved them, and the parameters a rank holds are the page's
count. The bad input runs in-process: one ``error:`` line naming the fix, exit code 2,
nothing written.
"""

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import recorded_output
from tinyscale.core.config import load_model_config

PAGE = "week-4/train-any-shape.md"


def steps(lines: list[str]) -> dict[int, tuple[str, str]]:
    """step -> (loss, grad norm), as printed."""
    found = (re.search(r"step +(\d+)/\d+ \| loss ([\d.]+) \| grad norm ([\d.]+)", x) for x in lines)
    return {int(m[1]): (m[2], m[3]) for m in found if m}


def held(lines: list[str]) -> tuple[int, int]:
    m = next(re.search(r"holds ([\d,]+) of its stage's ([\d,]+)", x) for x in lines if "holds" in x)
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


def test_every_shape_trains_like_one_process_across_two_resumes() -> None:
    one = steps(recorded_output(PAGE, "--nproc-per-node 1"))
    first = recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0")
    second = recorded_output(PAGE, "--pp 2 --dp 2 --dropout 0")
    third = recorded_output(PAGE, "--pp 2 --tp 2 --dropout 0")
    assert sorted(one) == [1, 2, 3, 4, 5, 6] and float(one[6][0]) < float(one[1][0])
    assert steps(first) == {1: one[1], 2: one[2]}
    assert steps(second) == {3: one[3], 4: one[4]}
    assert steps(third) == {5: one[5], 6: one[6]}
    assert "resumed from step 2, saved by {'pp': 1, 'dp': 1, 'fsdp': 2, 'tp': 2}" in second[0]
    assert "resumed from step 4, saved by {'pp': 2, 'dp': 2, 'fsdp': 1, 'tp': 1}" in third[0]
    prose = " ".join(Path("docs", PAGE).read_text().split())  # lines wrapped anywhere
    assert ", ".join(one[s][0] for s in (1, 2, 3, 4)) in prose
    assert f"{one[5][0]} and {one[6][0]}" in prose


def test_each_rank_holds_the_parameters_the_page_counts() -> None:
    cfg = load_model_config("code/config/config.json")
    h, i, v, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    T = cfg.max_position_embeddings
    split = 3 * h * h + 3 * h + h * h + h * i + i + i * h  # a block's TP-split tensors
    whole = h + h + 4 * h  # the row-parallel biases and the norms: whole on every TP rank
    # FSDP 2 x TP 2, one stage: the embedding and the split tensors / 4, the rest / 2
    model = v * h + T * h + L * (split + whole) + 2 * h
    assert held(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0")) == (
        (v * h + L * split) // 4 + (T * h + L * whole + 2 * h) // 2,
        model,
    )
    stage0 = v * h + T * h + split + whole  # PP 2: the embedding and block 0
    assert held(recorded_output(PAGE, "--pp 2 --dp 2 --dropout 0")) == (stage0, stage0)
    assert held(recorded_output(PAGE, "--pp 2 --tp 2 --dropout 0")) == (
        (v * h + split) // 2 + T * h + whole,
        stage0,
    )
    assert recorded_output(PAGE, "by_four // 4") == [
        str(held(recorded_output(PAGE, "--fsdp 2 --tp 2 --dropout 0"))[0])
    ]


@pytest.mark.parametrize(
    ("argv", "world", "message"),
    [
        (["--tp", "2"], "4", "--tp 2 make 2 ranks but the job has 4: make the product of the"),
        (["--dp", "0", "--tp", "4"], "4", "--dp 0 is not a number of ranks: give a whole number"),
        (["--tp", "3"], "3", "tensor-parallel size 3 does not divide the model's 4 attention"),
        (["--pp", "4"], "4", "4 pipeline stages but the model has 2 blocks"),
        (["--dp", "3"], "3", "--global-batch-size 16 does not split into dp x fsdp = 3"),
        (["--pp", "2", "--dp", "2", "--microbatches", "3"], "4", "copies of 3 equal micro"),
        (["--resume", "nowhere"], "1", "nowhere is not a complete DCP checkpoint"),
        (["--dropout", "1"], "1", "--dropout must be in [0, 1), got 1.0"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix_exit_2_nothing_written(
    argv: list[str], world: str, message: str, bad_input: Callable[..., str]
) -> None:
    assert message in bad_input("parallel_train", argv, WORLD_SIZE=world)

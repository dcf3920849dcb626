"""tinyscale.composed.two_d: our tensor parallelism inside our ZeRO-1 data parallelism, on a
2 x 2 grid of gloo ranks (docs/week-4/parallelism-2d-3d.md shows the same run):

- the mean loss and the weights after 3 steps equal one process on the whole batch;
- the bytes each rank sends to its tensor group and to its data group are the formulas;
- a rank holds the tensor shard (the TP formula) and about 1/dp of its optimizer state.
"""

import pytest

from tinyscale.comm.launch import run_on_ranks
from tinyscale.composed.two_d import data_step_bytes, tensor_step_bytes, train_2d
from tinyscale.core.config import preset
from tinyscale.data_parallel.memory_calculator import zero_state_bytes
from tinyscale.model_parallel.tensor_parallel import parameters_per_rank

LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-3  # Adam after 3 steps, as in test_tensor_parallel.py (measured 3.6e-5)


@pytest.fixture(scope="module")
def runs() -> list:
    return run_on_ranks(train_2d, 4, 2, 2)


def test_two_d_trains_like_one_process(runs) -> None:
    assert [(r.coordinate["dp"], r.coordinate["tp"]) for r in runs] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    for r in runs:
        assert r.loss < LOSS_TOLERANCE and r.weights < WEIGHT_TOLERANCE


def test_bytes_per_group_are_the_formulas(runs) -> None:
    cfg = preset("tiny")
    tensor = tensor_step_bytes(cfg, batch=4, seq_len=cfg.max_position_embeddings, tp=2)
    for r in runs:
        assert r.tensor_bytes == tensor
        assert r.data_bytes == data_step_bytes(r.params, dp=2)


def test_memory_per_rank_against_the_calculator(runs) -> None:
    shard = parameters_per_rank(preset("tiny"), 2)
    adam = zero_state_bytes(shard, stage=1, world_size=2).optimizer  # 8 bytes/param, / dp
    for r in runs:
        assert r.params == shard
        assert abs(4 * r.state - adam) <= 8 * 32  # whole parameters: within one 32-vector
    assert sum(r.state for r in runs[:2]) + sum(r.state for r in runs[2:]) == 4 * shard

"""tinyscale.data_parallel.ddp_training without a process group: the batch arithmetic, the shards, and
gradient accumulation.

- BatchSplit: global = micro x accum x world, and a global batch that does not divide
  is a one-line UsageError that names two valid sizes.
- rank_batches: step k's shards of every rank, put together, are exactly step k's batch
  of a single process reading the same permutation — the premise of the DDP parity test.
- accumulate_gradients: k micro-batches with loss / k give the gradients of one big batch
  (tolerance 1e-6 absolute: the same sums in a different order).
"""

import pytest
import torch

from tinyscale.comm.dist import DistEnv
from tinyscale.core.accumulation import accumulate_gradients
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp_training import (
    BatchSplit,
    make_sampler,
    rank_batches,
)

GRAD_TOLERANCE = 1e-6  # absolute, on gradients of size ~1e-2: float32 summation order only


def env(rank: int, world: int) -> DistEnv:
    return DistEnv(
        rank=rank,
        local_rank=rank,
        world_size=world,
        local_world_size=world,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=1,
        launcher="torchrun",
    )


@pytest.mark.parametrize(
    "global_batch,accum,world,micro", [(32, 1, 1, 32), (32, 1, 2, 16), (32, 2, 2, 8), (32, 1, 4, 8)]
)
def test_effective_batch_formula(global_batch: int, accum: int, world: int, micro: int) -> None:
    plan = BatchSplit(global_batch_size=global_batch, grad_accum_steps=accum, world_size=world)
    assert plan.micro_batch_size == micro
    assert plan.micro_batch_size * plan.grad_accum_steps * plan.world_size == global_batch
    assert plan.per_rank_batch_size == micro * accum


def test_a_global_batch_that_does_not_divide_is_refused() -> None:
    with pytest.raises(UsageError) as err:
        BatchSplit(global_batch_size=30, grad_accum_steps=1, world_size=4)
    assert str(err.value) == (
        "--global-batch-size 30 is not divisible by world size 4 x --grad-accum-steps 1 = 4: "
        "use a multiple of 4, e.g. 28 or 32"
    )
    with pytest.raises(UsageError, match="must be positive"):
        BatchSplit(global_batch_size=32, grad_accum_steps=0, world_size=2)


@pytest.mark.parametrize("world,accum", [(2, 1), (4, 1), (2, 2)])
def test_shards_of_a_step_make_the_single_process_batch(world: int, accum: int) -> None:
    data = list(range(103))
    single_plan = BatchSplit(global_batch_size=16, grad_accum_steps=1, world_size=1)
    plan = BatchSplit(global_batch_size=16, grad_accum_steps=accum, world_size=world)
    for epoch in (0, 1):
        single = rank_batches(
            make_sampler(data, env(0, 1), single_plan, seed=3), single_plan, epoch
        )  # type: ignore[arg-type]
        ranks = [
            rank_batches(make_sampler(data, env(r, world), plan, seed=3), plan, epoch)  # type: ignore[arg-type]
            for r in range(world)
        ]
        assert {len(b) for b in ranks} == {len(single)} == {103 // 16}
        for step, batch in enumerate(single):
            together = torch.cat([ranks[r][step] for r in range(world)])
            assert len(together) == 16
            assert sorted(together.tolist()) == sorted(batch.tolist())


def test_more_processes_than_samples_is_refused() -> None:
    plan = BatchSplit(global_batch_size=8, grad_accum_steps=1, world_size=8)
    with pytest.raises(UsageError, match="8 processes but only 5 training samples"):
        make_sampler(list(range(5)), env(0, 8), plan, seed=0)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="lower --global-batch-size"):
        make_sampler(
            list(range(20)),
            env(0, 2),
            BatchSplit(global_batch_size=32, grad_accum_steps=1, world_size=2),
            seed=0,
        )  # type: ignore[arg-type]


def test_accumulated_micro_batches_equal_one_big_batch() -> None:
    cfg = preset("lab", dropout=0.0, vocab_size=260, max_position_embeddings=16)
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (16, 16))  # (B, T)
    y = torch.randint(0, cfg.vocab_size, (16, 16))
    grads = {}
    for k in (1, 4):
        torch.manual_seed(0)
        model = TinyTransformer(cfg)
        loss = accumulate_gradients(
            model, list(zip(x.split(16 // k), y.split(16 // k), strict=False))
        )
        grads[k] = (loss, [p.grad.clone() for p in model.parameters()])
    assert grads[4][0] == pytest.approx(grads[1][0], abs=1e-6)  # the mean loss, too
    worst = max((a - b).abs().max().item() for a, b in zip(grads[1][1], grads[4][1], strict=True))
    assert worst < GRAD_TOLERANCE, worst
    # Without dividing by k the gradients would be k times too large: the test can fail.
    assert max(g.abs().max().item() for g in grads[1][1]) > 100 * GRAD_TOLERANCE

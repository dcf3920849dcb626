# --8<-- [start:config]
"""The pieces of a data-parallel training loop: batch arithmetic, sharding, sync, checkpoints.

Launch:  torchrun --nproc_per_node=2 code/scripts/ddp_simulation_train.py

Data parallelism in one sentence: every rank holds a full copy of the model, reads a
different shard of every batch, and the gradients are averaged across ranks before each
update, so every copy takes the same step. The loop itself lives in the Lab 2 script;
this module holds what the loop and the tests share.
"""

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, DistributedSampler, Subset

from tinyscale.comm.dist import DistEnv
from tinyscale.core.checkpoint import save_checkpoint
from tinyscale.core.data import get_batch
from tinyscale.core.errors import UsageError
from tinyscale.core.training import StepPlan, TrainConfig, plan_steps


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSplit:
    """How one optimizer step's global batch is cut up: global = micro x accum x world."""

    global_batch_size: int  # samples per optimizer step, summed over every rank
    grad_accum_steps: int  # micro-batches per rank per optimizer step
    world_size: int  # ranks (processes, one per GPU)

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0 or self.grad_accum_steps <= 0:
            raise UsageError(
                f"--global-batch-size and --grad-accum-steps must be positive, got "
                f"{self.global_batch_size} and {self.grad_accum_steps}"
            )
        per_step = self.world_size * self.grad_accum_steps
        if self.global_batch_size % per_step:
            lower = self.global_batch_size // per_step * per_step or per_step
            raise UsageError(
                f"--global-batch-size {self.global_batch_size} is not divisible by world size "
                f"{self.world_size} x --grad-accum-steps {self.grad_accum_steps} = {per_step}: "
                f"use a multiple of {per_step}, e.g. {lower} or {lower + per_step}"
            )

    @property
    def micro_batch_size(self) -> int:
        """Samples in one forward/backward pass on one rank."""
        return self.global_batch_size // (self.world_size * self.grad_accum_steps)

    @property
    def per_rank_batch_size(self) -> int:
        """Samples one rank consumes per optimizer step: micro x accum."""
        return self.micro_batch_size * self.grad_accum_steps


# --8<-- [end:config]


# --8<-- [start:sampler]
def make_sampler(
    dataset: Dataset, env: DistEnv, split: BatchSplit, *, seed: int
) -> DistributedSampler:
    """This rank's shard of the data: every world_size-th sample of one shared permutation.

    Every rank draws the same permutation (same seed, same epoch), then keeps the samples
    at positions rank, rank + world, rank + 2 world, ... — disjoint shards that together
    cover the data set. drop_last=True trims the tail so every rank has as many samples.
    """
    num_samples = len(dataset)  # type: ignore[arg-type]
    if env.world_size > num_samples:
        raise UsageError(
            f"{env.world_size} processes but only {num_samples} training samples: every rank "
            "needs at least one; use fewer processes (--nproc_per_node) or more data"
        )
    sampler = DistributedSampler(
        dataset,
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )
    if len(sampler) < split.per_rank_batch_size:
        raise UsageError(
            f"each of the {env.world_size} ranks gets {len(sampler)} samples, fewer than its "
            f"{split.per_rank_batch_size} per step: lower --global-batch-size"
        )
    return sampler


def rank_batches(sampler: DistributedSampler, split: BatchSplit, epoch: int) -> list[torch.Tensor]:
    """This rank's batches for one epoch, each of split.per_rank_batch_size sample indices.

    set_epoch reseeds the shared permutation: without it every epoch repeats the first
    epoch's order. Shard k of every rank together make global batch k of a single process
    that reads the same permutation in order.
    """
    sampler.set_epoch(epoch)
    indices = torch.tensor(list(sampler))  # (len(sampler),)
    usable = len(indices) - len(indices) % split.per_rank_batch_size
    return list(indices[:usable].split(split.per_rank_batch_size))


def rank_step_plan(sampler: DistributedSampler, split: BatchSplit, cfg: TrainConfig) -> StepPlan:
    """Lab 1's step plan, for a rank that reads its shard of every batch through ``sampler``."""
    batches = len(rank_batches(sampler, split, epoch=0))  # the same on every rank
    return plan_steps(batches, cfg, samples=len(sampler.dataset))  # type: ignore[arg-type]


# --8<-- [end:sampler]


# --8<-- [start:sync]
def parameter_fingerprint(model: nn.Module) -> torch.Tensor:
    """Two float64 numbers per parameter tensor (sum and norm): equal models, equal prints.

    Cheap enough to compare across ranks after every step (``rank_spread``): 56 numbers
    for the lab's model instead of 170 k weights.
    """
    return torch.stack(
        [t for p in model.parameters() for t in (p.double().sum(), p.double().norm())]
    ).cpu()


# --8<-- [end:sync]


# --8<-- [start:evaluate]
@torch.no_grad()
def evaluate_sharded(
    model: nn.Module, dataset: Dataset, env: DistEnv, *, batch_size: int, device: torch.device
) -> float:
    """Held-out loss over the whole set, each rank scoring every world_size-th block.

    all_reduce sums (loss x blocks, blocks) over ranks: every rank gets the same mean as
    one process scoring everything, in 1/world of the time.
    """
    was_training = model.training
    model.eval()
    shard = Subset(dataset, range(env.rank, len(dataset), env.world_size))  # type: ignore[arg-type]
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, blocks)
    for indices in torch.arange(len(shard)).split(batch_size):
        x, y = get_batch(shard, indices, device)  # type: ignore[arg-type]
        _, loss = model(x, y)
        count = torch.tensor(len(indices), dtype=torch.float64, device=device)  # beside loss
        totals += torch.stack([loss.double() * len(indices), count])
    dist.all_reduce(totals)  # SUM over ranks
    model.train(was_training)
    return (totals[0] / totals[1]).item()


# --8<-- [end:evaluate]


# --8<-- [start:checkpoint]
def gather_rng_states(device: torch.device) -> dict[str, list[torch.Tensor] | None]:
    """Every rank's random-number state: each rank draws its own dropout masks."""
    world = dist.get_world_size()
    cpu: list[Any] = [None] * world
    dist.all_gather_object(cpu, torch.get_rng_state())
    cuda: list[Any] | None = None
    if device.type == "cuda":
        cuda = [None] * world
        dist.all_gather_object(cuda, torch.cuda.get_rng_state(device))
    return {"rng_cpu": cpu, "rng_device": cuda}


def save_replicated(state: dict[str, Any], path: Path, env: DistEnv, device: torch.device) -> Path:
    """Save what every rank holds alike, once: rank 0 writes, the others wait at a barrier.

    The weights and the optimizer state are replicated (the same on every rank), so one
    file holds them; each rank's own RNG state goes in beside them, restored by rank
    (``restore_training_state(..., rank=)``). All ranks must call this: gathering the RNG
    states and the barrier are collectives. After the barrier the file exists for
    everyone, so no rank races ahead of it. (Session C's ``save_ranked`` is the other
    protocol: every rank writes its own file, for states that differ between ranks.)
    """
    state = {**state, **gather_rng_states(device), "world_size": env.world_size}
    if env.is_main:
        save_checkpoint(state, path)
    dist.barrier()  # bounded by the process group's timeout, like every collective
    return path


def tokens_per_second(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else math.nan


# --8<-- [end:checkpoint]

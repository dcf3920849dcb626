# --8<-- [start:header]
"""What each rank of a data-parallel job logs per step: its own numbers beside the global ones.

Launch:  torchrun --nproc_per_node=2 code/scripts/ddp_simulation_train.py --max-steps 3

Every rank trains on its own shard of the batch, so its loss, its speed and the samples it
read are its own; the global loss (an all-reduce) and the largest parameter difference
from rank 0 are the job's. Lab 2 logs both on one line per rank. ``RANK_METRICS`` is a
module-level dict: a launcher adds a metric without editing the lab's script.
"""

import dataclasses
from collections.abc import Callable

import torch

# --8<-- [end:header]


# --8<-- [start:metrics]
@dataclasses.dataclass(frozen=True, kw_only=True)
class StepStats:
    """What one rank measured in one optimizer step."""

    step: int
    loss: float  # this rank's own loss: the mean over its shard of the batch
    samples: int  # samples this rank consumed this step: micro x accum
    tokens: int
    seconds: float
    inputs: torch.Tensor  # (micro x accum, T) the token ids this rank read


# Rank-specific metrics: each rank computes these from its own step and logs them.
RANK_METRICS: dict[str, Callable[[StepStats], float]] = {
    "tokens/s": lambda s: s.tokens / s.seconds,
    "samples": lambda s: s.samples,
}


def log_line(stats: StepStats, total: int, global_loss: float, sync: float) -> str:
    fields = [f"step {stats.step:4d}/{total}", f"loss {stats.loss:.4f}"]
    fields.append(f"global loss {global_loss:.4f}")
    fields += [f"{name} {fn(stats):,.0f}" for name, fn in RANK_METRICS.items()]
    fields.append(f"max param diff vs rank 0 {sync:.1e}")
    return " | ".join(fields)


# --8<-- [end:metrics]

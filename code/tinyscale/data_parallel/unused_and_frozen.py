# --8<-- [start:header]
"""A parameter without a gradient and a frozen one, under every sharded wrapper, vs one process.

Try it:  python -c "from tinyscale.data_parallel.unused_and_frozen import demo; demo()"

Real models have both. A branch a batch does not take, or an expert that gets no tokens,
leaves its parameters without a gradient after backward; LoRA freezes every weight but
its adapters (``requires_grad=False``). Each wrapper here trains a small model with both
on 2 ranks, each rank on its own data and, at some steps, through its own layers, and one
process trains a copy on the whole batch. A missing gradient counts as zeros, as the
ranks count it, so both runs must end with the same weights, and the frozen bias must not
move.
"""

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tinyscale.core.errors import UsageError
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.fully_sharded import FullyShardedModel
from tinyscale.data_parallel.sharded_optimizer import ShardedOptimizer
from tinyscale.data_parallel.zero import ZeRO
from tinyscale.data_parallel.zero_prefetch import PrefetchZeRO3

# --8<-- [end:header]


# --8<-- [start:model]
LR, STEPS = 1e-2, 3
# The layers each rank's batch goes through at steps 1-3. Step 1: the ranks take different
# branches. Step 2: rank 0 uses both, rank 1 leaves b without a gradient. Step 3: nobody uses b.
BRANCHES = (("a", "ab", "a"), ("b", "a", "a"))


class Branches(nn.Module):
    """Two layers; a batch goes through those ``branch`` names: "a", "b" or "ab"."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, h: torch.Tensor, branch: str) -> torch.Tensor:
        for name in branch:
            h = torch.tanh(getattr(self, name)(h))
        return h


class TwoBranches(nn.Module):
    """inp -> one branch -> head. Both branches sit in one unit, so every rank gathers the
    same units whichever branch it takes. The head's bias is frozen (and comes last)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.branches, self.head = nn.Linear(4, 8), Branches(), nn.Linear(8, 1)
        self.head.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor, branch: str) -> torch.Tensor:
        return self.head(self.branches(torch.tanh(self.inp(x)), branch))


# --8<-- [end:model]


# --8<-- [start:wrappers]
WRAPPERS = ("ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 prefetch", "FullyShardedModel",
            "ShardedOptimizer")  # fmt: skip
Wrapped = tuple[nn.Module, Callable[[], None], Callable[[], torch.Tensor]]


def wrap(name: str, model: TwoBranches) -> Wrapped:
    """The model to call, its update (exchange gradients, step, zero them), and every
    parameter afterwards, in ``parameters()`` order, as one flat tensor."""
    units = [model.inp, model.branches]  # the root unit: the head's weight
    if name.startswith("ZeRO"):
        if name.endswith("prefetch"):
            zero = PrefetchZeRO3(model, units=units, lr=LR)
        else:
            zero = ZeRO(model, stage=int(name[-1]), units=units, lr=LR)
        return zero, lambda: (zero.step(), zero.zero_grad()), zero.full_parameters
    if name == "FullyShardedModel":
        fsdp = FullyShardedModel(model, units=units)
        adamw = torch.optim.AdamW(fsdp.parameters(), lr=LR)  # the shards, and the frozen bias
        frozen = model.head.bias  # not sharded: every rank keeps it whole, last in the order
        weights = lambda: torch.cat([fsdp.full_parameters(), frozen.detach()])  # noqa: E731
        return fsdp, lambda: (adamw.step(), adamw.zero_grad()), weights
    zero1 = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=LR)
    update = lambda: (zero1.reduce_gradients(), zero1.step(), zero1.zero_grad())  # noqa: E731
    return model, update, lambda: flat_parameters(model)


# --8<-- [end:wrappers]


# --8<-- [start:compare]
def against_one_process(name: str) -> dict[str, Any]:
    """Wrapper ``name`` on every rank, one process on the whole batch: the same 3 steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    one = TwoBranches()
    model, frozen = copy.deepcopy(one), one.head.bias.detach().clone()
    wrapped, update, weights = wrap(name, model)
    adamw = torch.optim.AdamW(one.parameters(), lr=LR)
    data = torch.Generator().manual_seed(1)  # every rank draws the whole batch alike
    x = torch.randn(STEPS, world, 2, 4, generator=data)  # step, rank, 2 samples, 4 features
    y = torch.randn(STEPS, world, 2, 1, generator=data)
    for step in range(STEPS):
        branch = [BRANCHES[r % 2][step] for r in range(world)]
        losses = [F.mse_loss(one(x[step, r], branch[r]), y[step, r]) for r in range(world)]
        (sum(losses) / world).backward()  # the ranks' mean: what the wrappers average
        for p in one.parameters():
            if p.requires_grad and p.grad is None:  # unused by every rank: zeros, as they count
                p.grad = torch.zeros_like(p)
        adamw.step()
        adamw.zero_grad()
        F.mse_loss(wrapped(x[step, rank], branch[rank]), y[step, rank]).backward()
        update()
    return {
        "vs one process": largest_difference(weights(), flat_parameters(one)),
        "frozen kept": torch.equal(model.head.bias, frozen),
    }


def facts(names: tuple[str, ...] = WRAPPERS) -> dict[str, dict[str, Any]]:
    return {name: against_one_process(name) for name in names}


def demo(*names: str, world_size: int = 2) -> None:
    """One line per wrapper: how far from one process, and whether the frozen bias moved."""
    from tinyscale.comm.launch import run_on_ranks

    unknown = [name for name in names if name not in WRAPPERS]
    if unknown:
        raise UsageError(f"no wrapper {unknown[0]!r}: name some of {', '.join(WRAPPERS)}")
    ranks = run_on_ranks(facts, world_size, names or WRAPPERS)
    for r in range(world_size):
        print(f"rank {r}, layers per step: {', '.join(BRANCHES[r % 2])}")
    for name in names or WRAPPERS:
        worst = max(r[name]["vs one process"] for r in ranks)
        kept = all(r[name]["frozen kept"] for r in ranks)
        print(f"{name:<18} largest weight difference from one process {worst:.1e}, "
              f"frozen bias unchanged: {kept}")  # fmt: skip


# --8<-- [end:compare]

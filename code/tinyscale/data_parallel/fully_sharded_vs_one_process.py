# --8<-- [start:header]
"""FullyShardedModel against one process: the same losses, weights and clipping, half the bytes.

Try it:  python -c "from tinyscale.data_parallel.fully_sharded_vs_one_process import demo; demo()"

Each rank trains the tiny preset on its share of the batch under FullyShardedModel
(tinyscale.data_parallel.fully_sharded) with torch's own SGD and AdamW; one process trains
a copy on the whole batch with the same optimizer, and Week 2's ZeRO(stage=3) a third copy
with its FlatAdamW. The demo prints the losses, the largest weight differences, the bytes
each rank holds, and checks micro-batches and clip_grad_norm_.
"""

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import measured_state_bytes
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.fully_sharded import FullyShardedModel
from tinyscale.data_parallel.zero import ZeRO

# --8<-- [end:header]


# --8<-- [start:parity]
LR, MAX_NORM = 1e-2, 0.1
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": LR}),  # weight_decay 0.01, as ZeRO's FlatAdamW
}


def against_one_process(optimizer_name: str, steps: int = 3) -> dict[str, Any]:
    """One process on the whole batch against FullyShardedModel, each rank on its share,
    with the same torch optimizer; for AdamW, also against Week 2's ZeRO(stage=3)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer_class, kwargs = OPTIMIZERS[optimizer_name]
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = TinyTransformer(cfg)
    model, zero_model = copy.deepcopy(one), copy.deepcopy(one)  # before wrapping changes them
    fsdp = FullyShardedModel(model, units=list(model.blocks))
    optimizers = [optimizer_class(one.parameters(), **kwargs)]
    optimizers.append(optimizer_class(fsdp.parameters(), **kwargs))  # the shards only
    zero = None  # AdamW only: Week 2's ZeRO-3 with its own AdamW
    if optimizer_name == "AdamW":
        zero = ZeRO(zero_model, stage=3, units=list(zero_model.blocks), lr=LR)
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 4 * world, cfg.max_position_embeddings))
    mine = slice(rank * 4, (rank + 1) * 4)  # this rank's share of the batch
    losses: dict[str, list[float]] = {"one process": [], "sharded": []}
    for x, y in batches:
        loss = one(x, y)[1]
        loss.backward()
        losses["one process"].append(loss.item())
        loss = fsdp(x[mine], y[mine])[1]
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the batch's loss: the mean of the ranks' equal shares
        losses["sharded"].append(mean.item() / world)
        if zero is not None:
            zero(x[mine], y[mine])[1].backward()
            zero.step()
            zero.zero_grad()
        for optimizer in optimizers:
            optimizer.step()
        held = [measured_state_bytes(m, o) for m, o in zip((one, fsdp), optimizers, strict=True)]
        for optimizer in optimizers:
            optimizer.zero_grad()  # sets shard.grad to None: the next backward creates it
    params = fsdp.full_parameters()
    one_params = flat_parameters(one)
    return {
        "losses": losses,
        "vs one process": largest_difference(params, one_params),
        "vs ZeRO-3": zero and largest_difference(params, zero.full_parameters()),
        "bytes": {"one process": held[0], "sharded": held[1]},
        "gathered": fsdp.gathered_bytes(),
        "numel": one_params.numel(),
    }


def micro_batches_and_clipping(max_norm: float = MAX_NORM) -> dict[str, float]:
    """Two micro-batches against one batch; clip_grad_norm_ against torch's on one process."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = TinyTransformer(cfg)
    whole, split = (copy.deepcopy(one) for _ in range(2))
    whole, split = (FullyShardedModel(m, units=list(m.blocks)) for m in (whole, split))
    x, y = torch.randint(0, cfg.vocab_size, (2, 4 * world, cfg.max_position_embeddings))
    mine = slice(rank * 4, (rank + 1) * 4)
    whole(x[mine], y[mine])[1].backward()
    for half in (slice(rank * 4, rank * 4 + 2), slice(rank * 4 + 2, (rank + 1) * 4)):
        (split(x[half], y[half])[1] / 2).backward()  # two halves: the mean of the four
    accumulated = largest_difference(whole.full_gradients(), split.full_gradients())
    one(x, y)[1].backward()
    torch_norm = torch.nn.utils.clip_grad_norm_(one.parameters(), max_norm)
    norm = whole.clip_grad_norm_(max_norm)
    one_grads = flat_parameters(one, grads=True)
    return {
        "micro-batches": accumulated,
        "norm": norm.item(),
        "torch norm": torch_norm.item(),
        "clipped": largest_difference(whole.full_gradients(), one_grads),
    }


def facts() -> dict[str, Any]:
    """Everything the demo prints, from one launch."""
    return {name: against_one_process(name) for name in OPTIMIZERS} | {
        "checks": micro_batches_and_clipping()
    }


# --8<-- [end:parity]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    """Losses per step, the weights' largest difference, and the bytes each rank holds."""
    from tinyscale.comm.launch import run_on_ranks  # the launcher imports torch.multiprocessing

    ranks = run_on_ranks(facts, world_size)
    sgd, adamw = ranks[0]["SGD"], ranks[0]["AdamW"]
    print(f"Ψ = {sgd['numel']:,} parameters, N = {world_size} ranks, "
          f"3 steps on {4 * world_size} sequences")  # fmt: skip
    print("step  SGD: one process   sharded  AdamW: one process   sharded")
    for step in range(3):
        row = [r["losses"][k][step] for r in (sgd, adamw) for k in ("one process", "sharded")]
        print(f"{step + 1:>4}  {row[0]:17.6f}  {row[1]:8.6f}  {row[2]:18.6f}  {row[3]:8.6f}")
    worst = {name: max(r[name]["vs one process"] for r in ranks) for name in OPTIMIZERS}
    vs_zero = max(r["AdamW"]["vs ZeRO-3"] for r in ranks)
    print(f"largest weight difference after 3 steps: SGD {worst['SGD']:.1e}, "
          f"AdamW {worst['AdamW']:.1e} from one process; AdamW {vs_zero:.1e} from ZeRO-3")  # fmt: skip
    print(
        f"{'bytes per rank':<22} {'one process':>12}"
        + "".join(f"  rank {r:>3}" for r in range(world_size))
    )
    rows = [("weights", "SGD", "params"), ("gradients", "SGD", "grads"),
            ("SGD momentum", "SGD", "optimizer"), ("AdamW m and v", "AdamW", "optimizer")]  # fmt: skip
    for label, name, field in rows:
        one = getattr(ranks[0][name]["bytes"]["one process"], field)
        mine = [getattr(r[name]["bytes"]["sharded"], field) for r in ranks]
        print(f"{label:<22} {one:12,}" + "".join(f"  {b:8,}" for b in mine))
    print(f"full buffers left after the last step: {[r['SGD']['gathered'] for r in ranks]}")
    checks = ranks[0]["checks"]
    micro = max(r["checks"]["micro-batches"] for r in ranks)
    clipped = max(r["checks"]["clipped"] for r in ranks)
    print(f"two micro-batches against one batch: largest gradient difference {micro:.1e}")
    print(f"clip_grad_norm_({MAX_NORM}): norm {checks['norm']:.6f}, torch on one process "
          f"{checks['torch norm']:.6f}; clipped gradients differ by {clipped:.1e}")  # fmt: skip


def optimizer_built_too_early() -> str:
    """Exercise: an AdamW built on a model's parameters, then the model wrapped."""
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    fsdp = FullyShardedModel(model)
    fsdp(torch.ones(1, 4)).sum().backward()
    try:
        optimizer.step()
    except UsageError as err:
        return str(err)
    return "no error: the step changed nothing"


# --8<-- [end:demo]

# --8<-- [start:header]
"""ZeRO-1 around any torch.optim optimizer: each rank steps, and keeps the state of, 1/N
of the parameters.

Try it:  python -c "from tinyscale.data_parallel.sharded_optimizer import demo; demo()"

Week 2's ZeRO owns its optimizer (one flat AdamW). To compose with tensor and pipeline
parallelism, and with SGD or any other optimizer, ZeRO-1 must wrap an ordinary one, as
torch's ZeroRedundancyOptimizer does: the same three arguments (the parameters, the
optimizer class, its keyword arguments). Each parameter gets one owner rank. The owner
alone builds its optimizer state and steps it; then every owner broadcasts what it
updated. The gradients must be averaged over the group first: by DDP's all-reduce, or,
at half its traffic, by ``reduce_gradients``, which sends each owner only its own.
"""

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.dist import in_one_call, require_process_group
from tinyscale.core.errors import UsageError
from tinyscale.core.parity import flat_parameters, largest_difference

# --8<-- [end:header]


# --8<-- [start:partition]
def partition(sizes: list[int], ranks: int) -> list[int]:
    """The owner of each parameter: the largest first, each to the least-loaded rank.

    Whole parameters, so the shares are nearly, not exactly, 1/N: the most loaded rank
    holds at most the fair share plus one parameter.
    """
    if len(sizes) < ranks:
        raise UsageError(
            f"{len(sizes)} parameters cannot give each of {ranks} ranks one to own: "
            "use fewer data-parallel ranks or shard a bigger model"
        )
    owners, load = [0] * len(sizes), [0] * ranks
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owners[i] = min(range(ranks), key=lambda r: load[r])
        load[owners[i]] += sizes[i]
    return owners


# --8<-- [end:partition]


# --8<-- [start:optimizer]
class ShardedOptimizer:
    """ZeRO-1: ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        optimizer_class: type[torch.optim.Optimizer],
        *,
        group: dist.ProcessGroup | None = None,
        **defaults: Any,
    ) -> None:
        require_process_group("ShardedOptimizer")
        self.params, self.group = list(params), group
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        self.owners = partition([p.numel() for p in self.params], ranks)
        self.mine = [p for p, owner in zip(self.params, self.owners, strict=True) if owner == rank]
        self.optimizer = optimizer_class(self.mine, **defaults)  # state for my share only
        self.senders = [dist.get_global_rank(group, r) if group else r for r in range(ranks)]

    def reduce_gradients(self) -> None:
        """ZeRO's own gradient exchange, in place of DDP's all-reduce: each owner receives the
        average of its parameters' gradients, nobody else does. One reduce per owner sends
        (N - 1)/N of the gradients per rank, half an all-reduce's 2(N - 1)/N."""
        for owner, receiver in enumerate(self.senders):
            params = [p for p, o in zip(self.params, self.owners, strict=True) if o == owner]
            flat = flat_parameters(params, grads=True)
            dist.reduce(flat, dst=receiver, group=self.group)
            if owner == dist.get_rank(self.group):  # the others' sums are not theirs to use
                flat /= dist.get_world_size(self.group)
                for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    p.grad.copy_(g.view_as(p))

    def step(self) -> None:
        self.optimizer.step()  # my parameters, with the averaged gradients
        with torch.no_grad():
            for owner, sender in enumerate(self.senders):  # one broadcast per owner
                params = [p for p, o in zip(self.params, self.owners, strict=True) if o == owner]
                in_one_call(
                    params, lambda flat, src=sender: dist.broadcast(flat, src=src, group=self.group)
                )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_elements(self) -> int:
        """Elements of optimizer state this rank holds (tensors only: Adam's 'step' aside)."""
        return sum(
            t.numel()
            for state in self.optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t) and t.dim() > 0
        )


# --8<-- [end:optimizer]


# --8<-- [start:demo]
def average_gradients(params: Iterable[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """What DDP does, in one call: all-reduce the gradients, flattened, and divide by N."""

    def average(flat: torch.Tensor) -> None:
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)

    in_one_call([p.grad for p in params], average)


def against_torch(optimizer_name: str, steps: int = 3) -> dict:
    """Ours and torch's ZeroRedundancyOptimizer, each rank on its half of the batch, against
    one process on the whole batch."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from tinyscale.core.config import preset
    from tinyscale.core.model import TinyTransformer

    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer_class = {"AdamW": torch.optim.AdamW, "SGD": torch.optim.SGD}[optimizer_name]
    kwargs = {"lr": 1e-2} | ({"momentum": 0.9} if optimizer_name == "SGD" else {})
    cfg = preset("tiny")
    torch.manual_seed(0)
    models = [TinyTransformer(cfg) for _ in range(3)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    one, ours, torchs = models
    optimizers = [
        optimizer_class(one.parameters(), **kwargs),
        ShardedOptimizer(ours.parameters(), optimizer_class, **kwargs),
        ZeroRedundancyOptimizer(torchs.parameters(), optimizer_class=optimizer_class, **kwargs),
    ]
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 4 * world, cfg.max_position_embeddings))
    for x, y in batches:
        one(x, y)[1].backward()
        half = slice(rank * 4, (rank + 1) * 4)  # this rank's share of the batch
        for model in (ours, torchs):
            model(x[half], y[half])[1].backward()
            average_gradients(model.parameters(), None)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    flat = [flat_parameters(m) for m in models]
    return {
        "ours vs one process": largest_difference(flat[1], flat[0]),
        "ours vs torch": largest_difference(flat[1], flat[2]),
        "state": optimizers[1].state_elements(),
        "params": sum(p.numel() for p in ours.parameters()),
    }


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    for name in ("AdamW", "SGD"):
        facts = run_on_ranks(against_torch, world_size, name)
        worst = {
            key: max(f[key] for f in facts) for key in ("ours vs one process", "ours vs torch")
        }
        states = ", ".join(f"{f['state']:,}" for f in facts)
        print(f"{name}: largest difference from one process {worst['ours vs one process']:.1e}, "
              f"from ZeroRedundancyOptimizer {worst['ours vs torch']:.1e}; "
              f"state elements per rank {states} (parameters {facts[0]['params']:,})")  # fmt: skip


# --8<-- [end:demo]

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

from collections.abc import Callable, Iterable
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
class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``.

    A torch optimizer itself: ``params`` may be dict groups with their own settings, an
    LR scheduler changes ``param_groups``, and ``state_dict()`` is this rank's shard.
    A frozen parameter (``requires_grad=False``) gets no owner: nobody steps or sends it.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict[str, Any]],
        optimizer_class: type[torch.optim.Optimizer],
        *,
        group: dist.ProcessGroup | None = None,
        **defaults: Any,
    ) -> None:
        require_process_group("ShardedOptimizer")
        super().__init__(params, defaults)  # self.param_groups: every parameter, every setting
        self.group, self.rank = group, dist.get_rank(group)
        self.params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self.owners = partition([p.numel() for p in self.params], dist.get_world_size(group))
        self.mine = self.owned_by(self.rank)
        mine = set(self.mine)
        self.optimizer = optimizer_class(  # one group per group, with my parameters only
            [{**g, "params": [p for p in g["params"] if p in mine]} for g in self.param_groups]
        )
        for ours, inner in zip(self.param_groups, self.optimizer.param_groups, strict=True):
            for key, value in inner.items():  # the class's defaults (betas, eps ...) show too
                ours.setdefault(key, value)
        self.state = self.optimizer.state  # state for my share only: what state_dict() saves
        ranks = range(dist.get_world_size(group))
        self.senders = [dist.get_global_rank(group, r) if group else r for r in ranks]

    def owned_by(self, owner: int) -> list[nn.Parameter]:
        return [p for p, o in zip(self.params, self.owners, strict=True) if o == owner]

    def reduce_gradients(self) -> None:
        """ZeRO's own gradient exchange, in place of DDP's all-reduce: each owner receives the
        average of its parameters' gradients, nobody else does. One reduce per owner sends
        (N - 1)/N of the gradients per rank, half an all-reduce's 2(N - 1)/N. A parameter
        this rank's batch did not use adds zeros, so every rank sends the same sizes."""
        for owner, receiver in enumerate(self.senders):
            params = self.owned_by(owner)
            flat = torch.cat([p.new_zeros(p.numel()) if p.grad is None else p.grad.flatten()
                              for p in params])  # fmt: skip
            dist.reduce(flat, dst=receiver, group=self.group)
            if owner == self.rank:  # the others' sums are not theirs to use
                flat /= dist.get_world_size(self.group)
                for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    p.grad = g.view_as(p)  # a view of my owners' flat average

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        for ours, inner in zip(self.param_groups, self.optimizer.param_groups, strict=True):
            inner.update({k: v for k, v in ours.items() if k != "params"})  # a scheduler's lr
        loss = self.optimizer.step(closure)  # my parameters, with the averaged gradients
        with torch.no_grad():
            for owner, sender in enumerate(self.senders):  # one broadcast per owner
                in_one_call(
                    self.owned_by(owner),
                    lambda flat, src=sender: dist.broadcast(flat, src=src, group=self.group),
                )
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard, in torch's format (``state`` keyed by place in param_groups),
        with the rank and the partition it belongs to: each rank saves its own."""
        return super().state_dict() | {"rank": self.rank, "owners": self.owners}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved on this rank, for the same parameters."""
        rank, owners = state_dict.get("rank"), state_dict.get("owners")
        if (rank, owners) != (self.rank, self.owners):
            whose = "no ShardedOptimizer's" if owners is None else f"rank {rank}'s shard"
            raise UsageError(
                f"this optimizer state is {whose}, not rank {self.rank}'s of these parameters: "
                "each rank loads the file it saved, with the same parameters and world size"
            )
        super().load_state_dict({k: state_dict[k] for k in ("state", "param_groups")})
        self.optimizer.state = self.state  # torch made a new dict: the inner one steps it

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

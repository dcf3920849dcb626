# --8<-- [start:header]
"""DDP from scratch, step 1: copies of one model, kept identical by averaging gradients.

Try it:  python -c "from tinyscale.data_parallel.ddp_buckets import demo; demo()"

Data parallelism: every rank holds the whole model, reads its own batch, and before
each optimizer step the gradients are averaged over the ranks — so every copy takes the
same step and the copies stay identical. This module is the naive version; the buckets
and the overlap of communication with backward live in ``tinyscale.data_parallel.ddp_buckets``.

The three steps follow Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training" (VLDB), §3.2: a naive solution, gradient
bucketing, overlapping computation with communication.
"""

import copy
import itertools

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.dist import require_process_group
from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError
from tinyscale.core.parity import flat_parameters

# --8<-- [end:header]


# --8<-- [start:broadcast]
def broadcast_from_rank0(module: nn.Module) -> None:
    """Overwrite every rank's parameters and buffers with rank 0's, in place.

    Each rank built its model with its own random init (or loaded a different file):
    copies that start apart stay apart, even with identical gradients. One broadcast
    per tensor at construction, never again — after that, averaged gradients keep them equal.
    """
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(tensor, src=0)


# --8<-- [end:broadcast]


# --8<-- [start:naive]
class NaiveDDP(nn.Module):
    """Step 1: one all-reduce per gradient tensor, after backward, then divide by world size.

    Usage (every rank):  loss.backward(); ddp.finish_gradient_synchronization(); opt.step()
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        require_process_group(type(self).__name__)
        self.module = module
        self.world_size = dist.get_world_size()
        # Frozen parameters (requires_grad=False) get no gradient: nothing to average.
        self.params = [p for p in module.parameters() if p.requires_grad]
        if not self.params:
            raise UsageError(
                "every parameter has requires_grad=False: nothing to train or synchronise; "
                "unfreeze some with p.requires_grad_(True)"
            )
        self.num_collectives = 0  # all-reduces launched so far (the tests count them)
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Average every gradient over the ranks: call after backward, before the step."""
        for p in self.params:
            if p.grad is None:  # unused in this step on this rank: it contributes zeros,
                p.grad = torch.zeros_like(p)  # and every rank still calls the same collectives
            dist.all_reduce(p.grad)  # SUM over ranks, in place, the same result everywhere
            p.grad.div_(self.world_size)  # the sum of the ranks' mean losses / N = the mean
            self.num_collectives += 1


# --8<-- [end:naive]


# --8<-- [start:check]
def random_batch(
    cfg: ModelConfig, *, batch_size: int, seq_len: int, step: int, seed: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (inputs, targets) at ``step``: random token ids, different on every rank."""
    gen = torch.Generator().manual_seed(seed + 1000 * step + dist.get_rank())
    ids = torch.randint(cfg.vocab_size, (batch_size, seq_len + 1), generator=gen)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)  # (B, T)


# --8<-- [end:check]


# --8<-- [start:forgetful]
class ForgetfulDDP(NaiveDDP):
    """Exercise: a DDP with one bug. Train with it and measure: what goes wrong?"""

    def finish_gradient_synchronization(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            self.num_collectives += 1


def update_size_ratio(*, optimizer: str, lr: float = 0.1, seed: int = 0) -> float:
    """|update of ForgetfulDDP| / |update of NaiveDDP| after one step from the same init.

    A two-layer MLP, each rank its own batch; ``optimizer`` is "sgd" or "adamw".
    """
    torch.manual_seed(seed)  # the same init and, below, a different batch on every rank
    base = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed + 1 + dist.get_rank()))
    sizes = []
    for wrapper in (NaiveDDP, ForgetfulDDP):
        model = wrapper(copy.deepcopy(base))
        before = flat_parameters(model)
        if optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=lr)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        model(x).square().mean().backward()
        model.finish_gradient_synchronization()
        opt.step()
        after = flat_parameters(model)
        sizes.append((after - before).norm().item())
    return sizes[1] / sizes[0]


# --8<-- [end:forgetful]

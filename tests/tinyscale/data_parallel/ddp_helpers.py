"""What test_ddp.py and test_ddp_views.py run on their ranks alike, imported by name.

A model with a frozen parameter and one only rank 0 uses, and one step's order of
events (gradients arriving, all-reduces launched). Their fixtures are in conftest.py.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from helpers import CallTimeline


class Branchy(nn.Module):
    """A frozen layer, and a layer only rank 0 uses (an unused parameter elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.used = nn.Linear(4, 4)
        self.rank0_only = nn.Linear(4, 4)
        self.extra = True  # False: rank 0 skips the layer too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.used(self.frozen(x))
        if dist.get_rank() == 0 and self.extra:
            x = self.rank0_only(x)
        return x.square().mean()


def branchy_case(wrap: Callable[[nn.Module], Any]) -> tuple[Any, torch.Tensor, Any]:
    """Branchy wrapped by ``wrap`` (each rank seeded apart: the broadcast at construction
    matters), this rank's input, and on rank 0 the gradient rank0_only must end with: its
    own, averaged with the other ranks' zeros (None on the other ranks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = wrap(Branchy())
    x = torch.full((2, 4), float(rank + 1))
    expected = None
    if rank == 0:  # the gradient rank 0 computes alone; the average divides it by world
        local = Branchy()
        local.load_state_dict(model.module.state_dict())
        local(x).backward()
        expected = local.rank0_only.weight.grad / world
    return model, x, expected


def step_events(model: Any, step: Callable[[], object]) -> list[tuple[str, Any]]:
    """``step()`` seen from outside the class, in order: ("grad", name) as each gradient
    of ``model.params`` arrives, (op, numel) as each collective is launched."""
    timeline = CallTimeline()
    names = {p: n for n, p in model.module.named_parameters()}
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p: timeline.events.append(("grad", names[p])))
        for p in model.params
    ]
    try:
        with timeline:
            step()
    finally:
        for hook in hooks:
            hook.remove()
    calls = timeline.calls
    return [
        (calls[what].op, calls[what].numel) if kind == "call" else (kind, what)
        for kind, what in timeline.events
        if kind != "wait"
    ]

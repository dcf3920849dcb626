# --8<-- [start:step]
"""One optimizer step, the one every hand-written loop of the course calls.

Try it:  python -c "import torch; from tinyscale.core.step import train_step; w = torch.nn.Parameter(torch.ones(2)); print(train_step(loss_fn=lambda x, y: ((w * x - y) ** 2).mean(), micro_batches=[(torch.ones(2), torch.zeros(2))], optimizer=torch.optim.SGD([w]), lr=0.1, max_norm=1.0, clip_params=[w]))"
"""

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets)
Context = Callable[[], contextlib.AbstractContextManager]
ClipFn = Callable[[Any, float], torch.Tensor | float]  # (parameters, max_norm) -> norm


def every_micro_batch_syncs(last: bool) -> contextlib.AbstractContextManager:
    """The default ``sync``: nothing to switch off (one process, or no accumulation)."""
    return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What a loop logs after a step."""

    loss: float  # the mean of the micro-batches' losses (the weights before the update)
    grad_norm: float | None  # the global gradient norm before clipping; None: not clipped


def train_step(
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],  # (x, y) -> loss: the forward
    micro_batches: Iterable[Batch],  # Lab 1: [(x, y)], one batch
    optimizer: torch.optim.Optimizer,
    lr: float,  # this step's value of the schedule
    autocast: Context = contextlib.nullcontext,  # precision: core.precision.autocast_context
    max_norm: float | None = None,  # clip the global gradient norm to this; None: no clipping
    clip_params: Iterable[nn.Parameter] = (),  # the parameters whose norm is clipped
    clip_fn: ClipFn = nn.utils.clip_grad_norm_,  # or one that adds up the norm across ranks
    accumulation_steps: int = 1,  # k, the micro-batches micro_batches yields
    # the context of each micro-batch's forward and backward, told whether it is the last
    sync: Callable[[bool], contextlib.AbstractContextManager] = every_micro_batch_syncs,
    backward: Callable[[torch.Tensor], Any] | None = None,  # replaces (loss / k).backward()
    scaler: Any = None,  # fp16's loss scaler (core.precision.make_scaler)
) -> StepResult:
    """Set the learning rate; forward and backward every micro-batch; clip; update.

    Lab 1 passes the loss, one batch, the optimizer, the learning rate and the clipping.
    A later lesson passes only what it changes: Session B autocast, micro-batches, a
    ``sync`` that is DDP's ``no_sync()`` on all but the last micro-batch (one all-reduce
    per step) and fp16's scaler; Accelerate its ``backward`` (which divides by k itself),
    ``sync`` and clipping; pipelines a ``clip_fn`` across their stages.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr  # every parameter group: AdamW's decay and no-decay groups
    optimizer.zero_grad(set_to_none=True)  # the last step's gradients are spent
    k, seen, total = accumulation_steps, 0, 0.0
    for x, y in micro_batches:  # read one at a time: a loader may track where it is
        seen += 1
        with sync(seen == k):
            with autocast():
                loss = loss_fn(x, y)  # forward: builds the autograd graph
            if backward is not None:
                backward(loss)
            else:  # backward: adds this micro-batch's share to p.grad of every parameter
                (loss / k if scaler is None else scaler.scale(loss / k)).backward()
        total += loss.item()
    if seen != k:
        raise ValueError(f"{seen} micro-batches for accumulation_steps={k}: pass as many")
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    grad_norm = None if max_norm is None else float(clip_fn(clip_params, max_norm))
    if scaler is not None:
        scaler.step(optimizer)  # skipped if a gradient overflowed
        scaler.update()
    else:
        optimizer.step()  # update: p -= lr * adam_direction(p.grad)
    return StepResult(loss=total / k, grad_norm=grad_norm)


# --8<-- [end:step]

# --8<-- [start:effective_batch]
"""Gradient accumulation: a big batch in small pieces, and what it costs in memory.

Try it:  python -c "from tinyscale.core.accumulation import effective_batch_size as e; print(e(micro_batch=8, accumulation_steps=4, world_size=2))"
"""

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import nn

from tinyscale.core.errors import UsageError


def effective_batch_size(*, micro_batch: int, accumulation_steps: int, world_size: int) -> int:
    """Samples behind one optimizer step: micro-batch x accumulation steps x world size."""
    if min(micro_batch, accumulation_steps, world_size) < 1:
        raise UsageError("micro_batch, accumulation_steps and world_size must all be >= 1")
    return micro_batch * accumulation_steps * world_size


def scaled_lr(*, base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): k times
    the batch, k times the learning rate — reached through a warmup, not from step one."""
    return base_lr * batch / base_batch


# --8<-- [end:effective_batch]


# --8<-- [start:accumulate]
def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scale: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
) -> float:
    """Forward and backward every micro-batch; leave the summed gradients in ``.grad``.

    Each loss is divided by k, so the gradients add up to the gradient of the mean loss
    over all k micro-batches — the same as one batch k times larger. Under DDP, every
    backward would all-reduce; ``no_sync()`` skips that on all but the last micro-batch
    (gradients just accumulate locally) and the last backward all-reduces the sum once.
    ``autocast`` wraps each forward (mixed precision) and ``scale`` each loss (an fp16
    loss scaler). Returns the mean loss; the caller zeroes the gradients first and steps.
    """
    k = len(micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        skip_sync = isinstance(model, nn.parallel.DistributedDataParallel) and not last
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            with autocast():
                _, loss = model(x, y)  # the mean over this micro-batch
            scale(loss / k).backward()  # this micro-batch's graph (its activations) is freed
        total += loss.item()
    return total / k


# --8<-- [end:accumulate]


# --8<-- [start:peak]
class PeakSavedBytes:
    """Measure the most activation bytes alive at one moment, over a whole block of code.

    Like ``tinyscale.core.memory.activation_bytes``, but across several forward and backward
    passes: every tensor saved for backward is counted (once per storage, parameters
    excluded) from the moment it is saved until its graph is freed.
    """

    def __init__(self, model: nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._live: dict[int, list[int]] = {}  # storage -> [saved references alive, bytes]
        self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> "PeakSavedBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: torch.Tensor) -> object:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._params:
            return t
        entry = self._live.setdefault(ptr, [0, t.untyped_storage().nbytes()])
        entry[0] += 1
        self.peak = max(self.peak, sum(nbytes for _, nbytes in self._live.values()))
        return _Saved(self._live, ptr, t)

    @staticmethod
    def _unpack(saved: object) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved  # type: ignore[return-value]


class _Saved:
    """A saved tensor that, when autograd drops it, marks its storage as freed."""

    def __init__(self, live: dict[int, list[int]], ptr: int, tensor: torch.Tensor) -> None:
        self.live, self.ptr, self.tensor = live, ptr, tensor

    def __del__(self) -> None:
        entry = self.live[self.ptr]
        entry[0] -= 1
        if entry[0] == 0:
            del self.live[self.ptr]


# --8<-- [end:peak]

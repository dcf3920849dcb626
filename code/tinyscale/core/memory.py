# --8<-- [start:model_states]
"""How many bytes training needs: the estimate on paper, and the same thing measured.

Try it:  python -c "from tinyscale.core.memory import model_state_bytes as m; print(m(7e9, 'bf16'))"
"""

import dataclasses
from collections.abc import Iterable

import torch
from torch import nn

from tinyscale.core.precision import check_precision

# Bytes per parameter for (weights, gradients, optimizer state) with Adam, per precision
# (tinyscale.core.precision's names), laid out as the ZeRO paper counts them (§3.1):
#   fp32:       4 + 4 + (4 momentum + 4 variance)                                 = 16
#   bf16, fp16: 2 (16-bit weights) + 2 (grads) + (4 master + 4 + 4) (fp32 Adam)   = 16
# Autocast keeps the fp32 weights as the master copy instead (4 + 4 + 8): the same 16
# bytes, split differently, which matters once ZeRO shards only some of them.
RECIPES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


@dataclasses.dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def __str__(self) -> str:
        return (
            f"weights {human_bytes(self.params)} + gradients {human_bytes(self.grads)} + "
            f"optimizer {human_bytes(self.optimizer)} = {human_bytes(self.total)}"
        )


MiB = 1024 * 1024  # what torch's bucket_cap_mb and the CUDA allocator call "MB"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': binary units, as memory is sold and reported."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    raise AssertionError("unreachable")


def model_state_bytes(num_params: float, precision: str = "fp32") -> StateBytes:
    """The paper estimate: bytes per parameter times the number of parameters."""
    per_param = RECIPES[check_precision(precision)]
    return StateBytes(*(int(num_params * b) for b in per_param))


# --8<-- [end:model_states]


# --8<-- [start:measure]
def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements, each counted once per tensor."""
    return sum(t.numel() * t.element_size() for t in tensors)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the memory behind the tensors: views of one buffer count it once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measured_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> StateBytes:
    """The same three numbers, counted from the tensors that really exist (after a step)."""
    params = list(model.parameters())
    state = [
        t
        for s in optimizer.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    ]
    return StateBytes(
        params=nbytes(params),
        grads=nbytes([p.grad for p in params if p.grad is not None]),
        optimizer=nbytes(state),  # Adam: exp_avg and exp_avg_sq (the scalar 'step' skipped)
    )


def activation_bytes(model: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward pass during one forward: the activations.

    Every tensor an operation saves for backward passes through ``pack``; we count each
    storage once and leave out the parameters (those are model states, counted above).
    """
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_storages:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    del out
    return sum(seen.values())


# --8<-- [end:measure]

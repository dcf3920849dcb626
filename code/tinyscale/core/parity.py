# --8<-- [start:parity]
"""Parity: how far apart two runs' weights are, measured one way in every lesson.

Try it:  python -c "import torch; from tinyscale.core.parity import largest_difference as d; print(d(torch.ones(3), torch.zeros(3)))"

Every parallel version of the training step is checked against a reference (one process,
torch's own implementation, another ZeRO stage): both flatten all their parameters into
one vector, in ``parameters()`` order, and report the largest difference of any entry.
"""

from collections.abc import Iterable

import torch
from torch import nn

from tinyscale.core.errors import UsageError


def flat_parameters(
    params: nn.Module | Iterable[torch.Tensor], *, grads: bool = False
) -> torch.Tensor:
    """Every parameter of a model (or every tensor given), in order, as one flat copy;
    with ``grads=True``, their gradients instead."""
    tensors = list(params.parameters() if isinstance(params, nn.Module) else params)
    if not tensors:
        raise UsageError("flat_parameters: no parameters given: pass a model or its tensors")
    if grads and any(t.grad is None for t in tensors):
        raise UsageError("flat_parameters: a parameter has no gradient: call backward first")
    return torch.cat([(t.grad if grads else t).detach().flatten() for t in tensors])


def largest_difference(a: torch.Tensor | nn.Module, b: torch.Tensor | nn.Module) -> float:
    """The largest |a - b| of any entry: of two tensors, or of two models' parameters.

    0.0 means bit-identical. The same sums added in another order (over other ranks, in
    other buckets) round differently: expect float32's rounding error, not 0.0.
    """
    a, b = (flat_parameters(x) if isinstance(x, nn.Module) else x for x in (a, b))
    if a.shape != b.shape:
        raise UsageError(
            f"largest_difference: shapes {tuple(a.shape)} and {tuple(b.shape)} differ: "
            "compare the same parameters, in the same order"
        )
    return (a - b).abs().max().item()


# --8<-- [end:parity]

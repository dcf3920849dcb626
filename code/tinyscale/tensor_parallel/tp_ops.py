# --8<-- [start:header]
"""The communication of tensor parallelism: two pairs of conjugate autograd operators.

Try it:  python -c "from tinyscale.tensor_parallel.tp_ops import demo; demo()"

Megatron-LM (Shoeybi et al. 2019, §3) splits a layer's weights over t ranks and needs
only two operators around each split region, each the other's conjugate:

    f  identity forward, all-reduce backward   enters a region: the input is replicated
    g  all-reduce forward, identity backward   leaves it: each rank holds a partial sum

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) keeps the activations between
the regions split along the sequence and swaps the pair for another:

    all-gather forward, reduce-scatter backward   enters: the region needs every position
    reduce-scatter forward, all-gather backward   leaves: each rank keeps its positions' sum

An all-reduce is a reduce-scatter followed by an all-gather, so the second pair moves the
same bytes as the first.
"""

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from tinyscale.core.errors import UsageError

Group = dist.ProcessGroup | None

# --8<-- [end:header]


# --8<-- [start:f_and_g]
class CopyToRegion(torch.autograd.Function):
    """f: every rank already holds the input; the gradients each rank computes from its
    part of the weights are partial, and the input's gradient is their sum."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous().clone()  # all_reduce works in place
        dist.all_reduce(grad, group=ctx.group)  # type: ignore[attr-defined]
        return grad, None


class ReduceFromRegion(torch.autograd.Function):
    """g: each rank's output is a partial sum; the sum is the layer's output, and every
    rank gets it. The gradient of a sum reaches each term unchanged."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def copy_to_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    return CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    return ReduceFromRegion.apply(x, group)


# --8<-- [end:f_and_g]


# --8<-- [start:sequence]
def gather_positions(x: torch.Tensor, group: Group) -> torch.Tensor:
    """(B, T/t, C) on each rank -> (B, T, C), the ranks' positions in rank order."""
    t = dist.get_world_size(group)
    mine = x.transpose(0, 1).contiguous()  # (T/t, B, C): the collectives cut dim 0
    out = mine.new_empty((t * mine.shape[0], *mine.shape[1:]))
    dist.all_gather_single(out, mine, group=group)
    return out.transpose(0, 1).contiguous()  # (B, T, C)


def sum_my_positions(x: torch.Tensor, group: Group) -> torch.Tensor:
    """(B, T, C) partial sums on each rank -> (B, T/t, C): the sum at this rank's positions."""
    t, T = dist.get_world_size(group), x.shape[1]
    if T % t:
        raise UsageError(
            f"sequence length {T} does not split over {t} ranks: "
            f"use a sequence length that is a multiple of the tensor-parallel size"
        )
    full = x.transpose(0, 1).contiguous()  # (T, B, C)
    out = full.new_empty((T // t, *full.shape[1:]))
    dist.reduce_scatter_single(out, full, group=group)
    return out.transpose(0, 1).contiguous()  # (B, T/t, C)


class GatherSequence(torch.autograd.Function):
    """All-gather forward, reduce-scatter backward: enters a tensor-parallel region."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group  # type: ignore[attr-defined]
        return gather_positions(x, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return sum_my_positions(grad, ctx.group), None  # type: ignore[attr-defined]


class ScatterSequence(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward: leaves a tensor-parallel region."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group  # type: ignore[attr-defined]
        return sum_my_positions(x, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return gather_positions(grad, ctx.group), None  # type: ignore[attr-defined]


class SplitSequence(torch.autograd.Function):
    """Keep this rank's positions of a replicated tensor (no message); backward all-gathers."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: Group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group  # type: ignore[attr-defined]
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        if x.shape[1] % t:
            sum_my_positions(x, group)  # raises the one-line error
        return x.chunk(t, dim=1)[rank].clone()

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return gather_positions(grad, ctx.group), None  # type: ignore[attr-defined]


def gather_sequence(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    return GatherSequence.apply(x, group)


def scatter_sequence(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    return ScatterSequence.apply(x, group)


def split_sequence(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    return SplitSequence.apply(x, group)


# --8<-- [end:sequence]


# --8<-- [start:demo]
def show_operators() -> list[str]:
    """On each rank: x = rank + 1 at t positions; each operator's output and x's gradient,
    for the loss sum(out * w) with weights w = 1, 2, 3... along the positions."""
    rank, t = dist.get_rank(), dist.get_world_size()
    lines = []
    for name, op in [
        ("f", copy_to_region),
        ("g", reduce_from_region),
        ("all-gather", gather_sequence),
        ("reduce-scatter", scatter_sequence),
    ]:
        x = torch.full((1, t, 1), float(rank + 1), requires_grad=True)  # (B, T, C)
        out = op(x)
        (out * (torch.arange(out.shape[1]) + 1).view(1, -1, 1)).sum().backward()
        lines.append(
            f"rank {rank} {name:>14}: out {out.flatten().tolist()}, grad {x.grad.flatten().tolist()}"
        )
    return lines


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    per_rank = run_on_ranks(show_operators, world_size)
    for lines in zip(*per_rank, strict=True):  # operator by operator, rank by rank
        print("\n".join(lines))


# --8<-- [end:demo]

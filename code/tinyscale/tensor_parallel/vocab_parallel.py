# --8<-- [start:header]
"""The embedding and the loss split by vocabulary: no rank ever holds a (B, T, V) tensor.

Try it:  python -c "from tinyscale.tensor_parallel.vocab_parallel import demo; demo()"

The embedding table and the head's weight are (V, C). Split over t ranks by rows, rank r
holds the tokens [r·V/t, (r+1)·V/t). The embedding looks up the tokens it holds and
contributes zeros for the others; one all-reduce sums the rows into place. The head
gives each rank the logits of its tokens only, and the cross-entropy is computed from
three all-reduces of one number per position (Megatron-LM, Shoeybi et al. 2019, §3):
the largest logit, the sum of the exponentials and the target's logit.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx

from tinyscale.core.parity import largest_difference
from tinyscale.tensor_parallel.tp_ops import Group, reduce_from_region

# --8<-- [end:header]


# --8<-- [start:embedding]
class VocabParallelEmbedding(nn.Module):
    """This rank's rows of an embedding table, consecutive tokens [start, stop); the
    looked-up vectors summed over ranks. ``weight`` is the rank's shard (``shard``)."""

    def __init__(self, weight: nn.Parameter, *, group: Group) -> None:
        super().__init__()
        self.weight, self.group = weight, group
        self.rows = weight.tp_index  # type: ignore[attr-defined]
        self.start, self.stop = int(self.rows[0]), int(self.rows[-1]) + 1

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.start) & (input_ids < self.stop)  # (B, T)
        local = torch.where(mine, input_ids - self.start, 0)  # others' tokens look up row 0...
        vectors = F.embedding(local, self.weight)  # (B, T, C)
        vectors = vectors * mine.unsqueeze(-1)  # ...and are zeroed, with their gradient
        return reduce_from_region(vectors, self.group)  # each token's vector from its owner


# --8<-- [end:embedding]


# --8<-- [start:loss]
class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits split by vocabulary: logits (N, V/t), targets (N,)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, logits: torch.Tensor, targets: torch.Tensor, start: int, group: Group
    ) -> torch.Tensor:
        logits = logits.float()
        top = logits.max(dim=1).values  # (N,)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)  # the largest logit of all V
        shifted = logits - top.unsqueeze(1)  # exp() of these cannot overflow
        exp = shifted.exp()
        total = exp.sum(dim=1)  # (N,)
        dist.all_reduce(total, group=group)  # sum of exp over all V
        mine = (targets >= start) & (targets < start + logits.shape[1])  # (N,)
        local = torch.where(mine, targets - start, 0)
        target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1) * mine  # 0 if not mine
        dist.all_reduce(target_logit, group=group)  # the target's logit, from its owner
        ctx.save_for_backward(exp.div_(total.unsqueeze(1)), local, mine)  # softmax (N, V/t)
        return (total.log() - target_logit).mean()  # log(sum exp) - logit[target]

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        softmax, local, mine = ctx.saved_tensors  # type: ignore[attr-defined]
        # d loss / d logits = (softmax - one_hot(target)) / N, for this rank's columns
        grad_logits = softmax.clone()
        rows = torch.arange(len(local))
        grad_logits[rows, local] -= mine.to(grad_logits.dtype)
        return grad_logits * (grad / len(local)), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, vocab_start: int, group: Group = None
) -> torch.Tensor:
    """What ``TinyTransformer.loss`` computes, from this rank's logits (B, T, V/t)."""
    B, T, V_local = logits.shape
    return VocabParallelCrossEntropy.apply(
        logits.reshape(B * T, V_local), targets.reshape(B * T), vocab_start, group
    )


# --8<-- [end:loss]


# --8<-- [start:demo]
def compare_loss(seed: int = 0) -> str:
    """On each rank: the split loss and gradient against F.cross_entropy on all V logits."""
    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)  # the same full logits and targets on every rank
    logits, targets = torch.randn(6, 12) * 3, torch.randint(0, 12, (6,))
    full = logits.clone().requires_grad_()
    expected = F.cross_entropy(full, targets)
    expected.backward()
    cols = slice(rank * 12 // t, (rank + 1) * 12 // t)
    part = logits[:, cols].clone().requires_grad_()
    loss = VocabParallelCrossEntropy.apply(part, targets, cols.start, None)
    loss.backward()
    grad_error = largest_difference(part.grad, full.grad[:, cols])
    return (
        f"rank {rank}: columns {cols.start}..{cols.stop - 1}, loss {loss.item():.6f} "
        f"(F.cross_entropy {expected.item():.6f}), largest gradient difference {grad_error:.1e}"
    )


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    print("\n".join(run_on_ranks(compare_loss, world_size)))


# --8<-- [end:demo]

# --8<-- [start:header]
"""The course's TinyTransformer on a sequence split across ranks: context parallelism.

Try it:  python -c "from tinyscale.context_parallel.cp_model import demo; demo()"

Every layer but attention works position by position, so a rank runs it on its own
positions unchanged. Attention is swapped for ``context_parallel_attention`` (the ring,
or the all-gather of keys and values); the position embeddings read the rank's *global*
positions; each rank's loss is its share of the whole sequence's mean, and the weights'
gradients, partial sums over the rank's positions, are summed over the ranks as data
parallelism sums them over samples.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tinyscale.comm.dist import in_one_call, require_process_group
from tinyscale.context_parallel.allgather_kv import VARIANTS
from tinyscale.context_parallel.load_balance import SequenceSplit
from tinyscale.core.errors import UsageError
from tinyscale.core.model import CausalSelfAttention, TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference

# --8<-- [end:header]


# --8<-- [start:attention]
def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    split: SequenceSplit,
    variant: str = "ring",
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on the rank's positions."""
    if variant not in VARIANTS:
        raise UsageError(
            f"context-parallel variant {variant!r} is unknown: use one of {', '.join(VARIANTS)}"
        )
    return VARIANTS[variant](q, k, v, split=split)


class ContextParallelAttention(nn.Module):
    """A CausalSelfAttention's own qkv and proj, its attention run across the ranks."""

    def __init__(self, attn: CausalSelfAttention, *, split: SequenceSplit, variant: str) -> None:
        super().__init__()
        if attn.dropout:
            raise UsageError(
                f"attention dropout {attn.dropout} is not split across ranks: set dropout=0.0"
            )
        self.qkv, self.proj, self.head_dim = attn.qkv, attn.proj, attn.head_dim  # the parent's
        self.split, self.variant = split, variant

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T/N, C), the rank's positions
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=2)
        )
        y = context_parallel_attention(q, k, v, split=self.split, variant=self.variant)
        return self.proj(y.transpose(1, 2).flatten(2))


# --8<-- [end:attention]


# --8<-- [start:model]
class ContextParallelTransformer(nn.Module):
    """A TinyTransformer's modules, each block's attention swapped in place for the
    context-parallel one (pass a copy to keep the original). Parameter names stay the
    parent's (``blocks.0.attn.qkv.weight``)."""

    head = TinyTransformer.head  # the model's own code, on the same modules

    def __init__(
        self, model: TinyTransformer, *, split: SequenceSplit, variant: str = "ring"
    ) -> None:
        super().__init__()
        self.cfg, self.split = model.cfg, split
        self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop
        for block in model.blocks:
            block.attn = ContextParallelAttention(block.attn, split=split, variant=variant)
        self.blocks, self.ln_f, self.lm_head = model.blocks, model.ln_f, model.lm_head

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rank's positions of the ids (B, T/N) -> its logits and its share of the loss.

        Summed over the ranks, the shares are the mean loss over all B x T positions.
        """
        require_process_group("a context-parallel model")
        seq_len = input_ids.shape[1] * self.split.world
        if seq_len > self.cfg.max_position_embeddings:
            raise UsageError(f"sequence length {seq_len} exceeds max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}: use shorter sequences")  # fmt: skip
        positions = self.split.positions(dist.get_rank(), seq_len).to(input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(positions))  # global positions
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        if targets is None:
            return logits, None
        total = targets.shape[0] * seq_len  # positions of the whole batch, all ranks
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / total
        return logits, loss


def sum_gradients(model: nn.Module) -> None:
    """Each rank's gradients cover its positions: sum them over the ranks, in one call."""
    in_one_call([p.grad for p in model.parameters() if p.grad is not None], dist.all_reduce)


# --8<-- [end:model]


# --8<-- [start:parity]
def parity(kind: str = "headtail", variant: str = "ring", seed: int = 0) -> dict[str, float]:
    """On every rank: one process's loss, logits and gradients against the split model's."""
    from tinyscale.core.config import preset

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = preset("tiny")
    torch.manual_seed(seed)
    reference = TinyTransformer(cfg)
    split_model = TinyTransformer(cfg)
    split_model.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(cfg.vocab_size, (2, cfg.max_position_embeddings + 1), generator=g)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # same on every rank
    logits, loss = reference(inputs, targets)
    loss.backward()
    split = SequenceSplit(world, kind)  # type: ignore[arg-type]
    cp = ContextParallelTransformer(split_model, split=split, variant=variant)
    cp_logits, share = cp(split.shard(inputs, rank), split.shard(targets, rank))
    share.backward()
    sum_gradients(cp)
    whole = share.detach().clone()
    dist.all_reduce(whole)
    return {
        "loss": abs(whole.item() - loss.item()),
        "logits": largest_difference(cp_logits.detach(), split.shard(logits.detach(), rank)),
        "gradients": largest_difference(
            flat_parameters(cp, grads=True), flat_parameters(reference, grads=True)
        ),
    }


def both_variants(kind: str = "headtail") -> dict[str, dict[str, float]]:
    return {variant: parity(kind, variant) for variant in VARIANTS}


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(both_variants, world_size)
    for variant in VARIANTS:
        worst = {k: max(r[variant][k] for r in ranks) for k in ("loss", "logits", "gradients")}
        print(f"{variant:<10} (head-tail, {world_size} ranks), largest difference from one "
              "process: " + ", ".join(f"{name} {d:.1e}" for name, d in worst.items()))  # fmt: skip


# --8<-- [end:parity]

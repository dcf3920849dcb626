# --8<-- [start:header]
"""Tensor parallelism from scratch: every weight matrix of the course model split over t ranks.

Try it:  python -c "from tinyscale.tensor_parallel.tp_model import demo; demo()"

Megatron-LM's recipe (Shoeybi et al. 2019): in each block, the first linear layer of
attention (qkv) and of the FFN (up) is split by output features, *column-parallel*; the
second (proj, down) by input features, *row-parallel*. Between the two, each rank works
on its own heads or its own FFN channels and nothing moves; the operators of tp_ops run
at the edges. The embedding and the head are split by vocabulary. With sequence
parallelism (Korthikanti et al. 2022) the norms, dropout and residuals between the
regions run on 1/t of the positions.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tinyscale.comm.dist import in_one_call, require_process_group
from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer, head_channels, qkv_rows
from tinyscale.tensor_parallel.tp_ops import (
    Group,
    copy_to_region,
    gather_sequence,
    reduce_from_region,
    scatter_sequence,
    split_sequence,
)
from tinyscale.tensor_parallel.vocab_parallel import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

# --8<-- [end:header]


# --8<-- [start:linear]
def shard(param: torch.Tensor, dim: int, index: torch.Tensor) -> nn.Parameter:
    """This rank's part of a full weight: the entries ``index`` along ``dim``.

    The parameter remembers where it came from (``tp_dim``, ``tp_index``), so a test can
    compare it, or its gradient, with the same entries of the unsplit model.
    """
    part = nn.Parameter(param.detach().index_select(dim, index).clone())
    part.tp_dim, part.tp_index = dim, index  # type: ignore[attr-defined]
    return part


class ParallelLinear(nn.Module):
    """A linear layer's part on this rank: the weight (and bias) it is given, already split."""

    def __init__(
        self,
        weight: nn.Parameter,
        bias: nn.Parameter | None,
        *,
        group: Group,
        sequence_parallel: bool,
    ) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.group, self.sequence_parallel = group, sequence_parallel


class ColumnParallelLinear(ParallelLinear):
    """Y_r = X A_r + b_r: this rank's output features. X is the whole input on every rank.

    weight (out/t, in) and bias (out/t,): this rank's rows.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # enter the region: f, or the all-gather of every rank's positions
        x = (
            gather_sequence(x, self.group)
            if self.sequence_parallel
            else copy_to_region(x, self.group)
        )
        return F.linear(x, self.weight, self.bias)  # (B, T, out/t)


class RowParallelLinear(ParallelLinear):
    """Y = sum over ranks of X_r B_r, plus b once: this rank's input features.

    weight (out, in/t): this rank's columns; bias (out,): whole, on every rank.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)  # (B, T, out): this rank's share of the sum
        # leave the region: g, or the reduce-scatter that keeps this rank's positions
        if self.sequence_parallel:
            y = scatter_sequence(partial, self.group)  # (B, T/t, out)
        else:
            y = reduce_from_region(partial, self.group)  # (B, T, out)
        return y if self.bias is None else y + self.bias  # added once, after the sum


# --8<-- [end:linear]


# --8<-- [start:check]
def check_tensor_parallel_size(cfg: ModelConfig, t: int) -> None:
    """Every split must be even: heads, FFN channels and the vocabulary over t ranks."""
    for what, size in [
        ("attention heads", cfg.num_attention_heads),
        ("FFN channels (intermediate_size)", cfg.intermediate_size),
        ("vocabulary entries (vocab_size)", cfg.vocab_size),
    ]:
        if size % t:
            fits = [d for d in range(1, size + 1) if size % d == 0 and d <= 8]
            raise UsageError(
                f"tensor-parallel size {t} does not divide the model's {size} {what}: "
                f"use a size that divides it ({', '.join(map(str, fits))})"
            )


# --8<-- [end:check]


# --8<-- [start:block]
def parallelize_block(
    block: nn.Module, cfg: ModelConfig, *, group: Group, sequence_parallel: bool
) -> None:
    """Replace a Block's four linear layers with this rank's parts, in place.

    Attention is split by heads: rank r keeps heads [r·a/t, (r+1)·a/t), their rows of
    the fused qkv weight (q, k and v pieces, see ``qkv_rows``) and their columns of proj.
    The FFN is split by channels: rows of up, the same columns of down. The attention
    code itself is unchanged: it reads its head count from the width it is given.
    """
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    heads = range(rank * cfg.num_attention_heads // t, (rank + 1) * cfg.num_attention_heads // t)
    width = cfg.intermediate_size // t
    channels = torch.arange(rank * width, (rank + 1) * width)
    mine = {"group": group, "sequence_parallel": sequence_parallel}
    attn, ffn = block.attn, block.ffn
    rows, cols = qkv_rows(cfg, heads), head_channels(cfg, heads)
    attn.qkv = ColumnParallelLinear(
        shard(attn.qkv.weight, 0, rows), shard(attn.qkv.bias, 0, rows), **mine
    )
    attn.proj = RowParallelLinear(shard(attn.proj.weight, 1, cols), attn.proj.bias, **mine)
    ffn.up = ColumnParallelLinear(
        shard(ffn.up.weight, 0, channels), shard(ffn.up.bias, 0, channels), **mine
    )
    ffn.down = RowParallelLinear(shard(ffn.down.weight, 1, channels), ffn.down.bias, **mine)
    if sequence_parallel:  # these see only this rank's positions: their gradients are partial
        for param in [
            *block.ln1.parameters(),
            *block.ln2.parameters(),
            attn.proj.bias,
            ffn.down.bias,
        ]:
            param.sequence_parallel = True  # type: ignore[union-attr]


# --8<-- [end:block]


# --8<-- [start:model]
class TensorParallelTransformer(nn.Module):
    """This rank's part of a TinyTransformer: the model's own modules, split in place.

    Its parameters keep the model's names (``blocks.0.attn.qkv.weight``). The logits it
    returns are this rank's slice of the vocabulary, (B, T, V/t); the loss is the whole
    model's, on every rank.
    """

    embed = TinyTransformer.embed  # the model's own code, run on the split modules
    head = TinyTransformer.head

    def __init__(
        self, model: TinyTransformer, *, group: Group = None, sequence_parallel: bool = False
    ) -> None:
        super().__init__()
        require_process_group("TensorParallelTransformer")
        cfg = self.cfg = model.cfg
        self.group, self.sequence_parallel = group, sequence_parallel
        check_tensor_parallel_size(cfg, dist.get_world_size(group))
        t, rank, V = dist.get_world_size(group), dist.get_rank(group), cfg.vocab_size
        rows = torch.arange(rank * V // t, (rank + 1) * V // t)  # this rank's vocabulary
        self.tok_emb = VocabParallelEmbedding(shard(model.tok_emb.weight, 0, rows), group=group)
        self.pos_emb, self.drop = model.pos_emb, model.drop  # replicated
        for block in model.blocks:
            parallelize_block(block, cfg, group=group, sequence_parallel=sequence_parallel)
        self.blocks, self.ln_f = model.blocks, model.ln_f
        if cfg.tie_word_embeddings:  # the head's rows are the embedding's rows: one parameter
            head_weight = self.tok_emb.weight
        else:
            head_weight = shard(model.lm_head.weight, 0, rows)
        self.lm_head = ColumnParallelLinear(
            head_weight, None, group=group, sequence_parallel=sequence_parallel
        )
        if sequence_parallel:
            for param in self.ln_f.parameters():
                param.sequence_parallel = True  # type: ignore[attr-defined]

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.embed(input_ids)  # (B, T, C): the same on every rank
        if self.sequence_parallel:
            x = split_sequence(x, self.group)  # (B, T/t, C): this rank's positions
        for block in self.blocks:
            x = block(x)  # (B, T, C), or (B, T/t, C) with sequence parallelism
        logits = self.head(x)  # (B, T, V/t): this rank's slice of the vocabulary
        if targets is None:
            return logits, None
        return logits, vocab_parallel_cross_entropy(
            logits, targets, vocab_start=self.tok_emb.start, group=self.group
        )

    def sync_sequence_parallel_grads(self) -> None:
        """After backward, with sequence parallelism: sum the partial gradients of the
        parameters that saw 1/t of the positions (the norms, two biases), in one call."""
        params = [p for p in self.parameters() if getattr(p, "sequence_parallel", False)]
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            in_one_call(grads, lambda flat: dist.all_reduce(flat, group=self.group))


# --8<-- [end:model]


# --8<-- [start:count]
def parameters_per_rank(cfg: ModelConfig, t: int) -> int:
    """What one rank of TensorParallelTransformer holds: the split weights / t, plus the
    parameters every rank keeps whole (norms, position embeddings, the biases added after
    a sum)."""
    check_tensor_parallel_size(cfg, t)
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    vocab = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)  # embedding (+ head)
    split = (3 * h * h + 3 * h) + h * h + (h * i + i) + i * h  # qkv, proj, up, down weights
    whole = 2 * (2 * h) + h + h  # two LayerNorms, proj's and down's biases
    return (vocab + L * split) // t + cfg.max_position_embeddings * h + L * whole + 2 * h


def demo() -> None:
    """The course model (the lab preset) split over 1, 2 and 4 ranks, on paper."""
    from tinyscale.core.config import preset

    cfg = preset("lab")
    whole = parameters_per_rank(cfg, 1)
    for t in (1, 2, 4):
        n = parameters_per_rank(cfg, t)
        print(f"t = {t}: {n:>7,} parameters per rank ({n / whole:.1%} of {whole:,})")


# --8<-- [end:count]

# --8<-- [start:attention]
"""TinyTransformer: a GPT-style decoder small enough to train on a laptop in seconds.

Defined once here and imported by every lab. A big language model is this same code
with bigger numbers in ``code/config/config.json``.

Try it:  python -c "from tinyscale.core.model import TinyTransformer; print(TinyTransformer())"
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError


class CausalSelfAttention(nn.Module):
    """Each token mixes in the tokens before it, in ``num_attention_heads`` parallel heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim  # channels per head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # q, k, v in one matmul
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, T, 3C): q, k and v of every head, in one matmul
        B, T, _ = qkv.shape  # batch, time (sequence)
        q, k, v = qkv.chunk(3, dim=2)  # 3 x (B, T, C), C = hidden_size
        # split channels into heads: (B, T, C) -> (B, nh, T, hs). Shapes are read from qkv's
        # output, not stored: a rank holding some of the heads (Week 4) runs this code too.
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hs): token t only attends to tokens <= t
        y = y.transpose(1, 2).flatten(2)  # heads back side by side: (B, T, nh * hs)
        return self.proj(y)


# --8<-- [end:attention]


# --8<-- [start:block]
class FeedForward(nn.Module):
    """The per-token MLP (the FFN): widen to intermediate_size, GELU, narrow back."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))  # residual connections keep gradients flowing
        return x + self.drop(self.ffn(self.ln2(x)))


# --8<-- [end:block]


# --8<-- [start:model]
class TinyTransformer(nn.Module):
    """Token + position embeddings, a stack of blocks, and a head that scores the next token."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_emb = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:  # weight tying: one matrix, used twice
            # A pipeline (Week 3) puts tok_emb on the first stage and lm_head on the last, so a
            # tied matrix lives on two ranks whose gradients must be summed; untied, each owns one.
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return next-token logits (B, T, vocab) and, given targets (B, T), the mean loss.

        Written as embed -> blocks -> head -> loss so that a pipeline stage (``ModelStage``)
        can run a part of it with the same code.
        """
        x = self.embed(input_ids)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        logits = self.head(x)  # (B, T, vocab)
        loss = None if targets is None else self.loss(logits, targets)
        return logits, loss

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> token + position embeddings, after dropout (B, T, C)."""
        T = input_ids.shape[1]
        if T > self.cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings "
                f"{self.cfg.max_position_embeddings}: use shorter blocks or raise it in the config"
            )
        pos = torch.arange(T, device=input_ids.device)  # (T,)
        return self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))  # (B, T, C)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, C) -> a score for every token of the vocabulary (B, T, vocab)."""
        return self.lm_head(self.ln_f(x))

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every position at once: logits (B, T, vocab), targets (B, T)."""
        B, T, V = logits.shape
        return F.cross_entropy(logits.view(B * T, V), targets.view(B * T))

    def num_parameters(self) -> int:
        """Unique parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())


# --8<-- [end:model]


# --8<-- [start:count]
def count_parameters(cfg: ModelConfig) -> int:
    """The parameter count, on paper: what ``TinyTransformer(cfg).num_parameters()`` returns."""
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    embeddings = cfg.vocab_size * h + cfg.max_position_embeddings * h
    if not cfg.tie_word_embeddings:
        embeddings += cfg.vocab_size * h  # lm_head's own matrix (tied, it reuses tok_emb's)
    attention = (h * 3 * h + 3 * h) + (h * h + h)  # qkv and output projection, with biases
    ffn = (h * i + i) + (i * h + h)
    norms = 2 * (2 * h)  # two LayerNorms per block, each a weight and a bias
    return embeddings + L * (attention + ffn + norms) + 2 * h  # + the final LayerNorm


# --8<-- [end:count]


# --8<-- [start:stages]
class ModelStage(nn.Module):
    """A contiguous part of a TinyTransformer: a pipeline stage (Week 3).

    It holds references to the parent's modules, not copies: its parameters are the
    parent's ``Parameter`` objects, under the parent's names (``blocks.2.attn.qkv.weight``),
    so a gradient computed through a stage lands in the parent. The first stage embeds
    token ids, the last one scores the vocabulary; the loss is ``TinyTransformer.loss``.
    """

    embed = TinyTransformer.embed  # the model's own code, run on the same modules
    head = TinyTransformer.head

    def __init__(
        self, model: TinyTransformer, *, layers: range, first: bool = False, last: bool = False
    ) -> None:
        super().__init__()
        L = model.cfg.num_hidden_layers
        if not layers:
            raise UsageError(f"stage layers {layers} is empty: give every stage at least one block")
        if layers.step != 1:
            raise UsageError(f"stage layers {layers} skips blocks: use a range with step 1")
        if layers.start < 0 or layers.stop > L:
            raise UsageError(
                f"stage layers {layers} is outside the model's blocks: stay within range(0, {L})"
            )
        self.cfg, self.layers, self.first, self.last = model.cfg, layers, first, last
        if first:
            self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})  # parent's names
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) into the first stage, activations (B, T, C) into the others.

        Returns the activations (B, T, C) for the next stage, or on the last the logits.
        """
        if self.first != (x.dim() == 2 and not x.is_floating_point()):
            wanted = "token ids (B, T)" if self.first else "the previous stage's output (B, T, C)"
            raise UsageError(
                f"stage with blocks {self.layers} takes {wanted}, got {x.dtype} {tuple(x.shape)}: "
                "run the stages in order, the first on input_ids"
            )
        if self.first:
            x = self.embed(x)  # (B, T, C)
        for block in self.blocks.values():
            x = block(x)  # (B, T, C)
        return self.head(x) if self.last else x  # (B, T, vocab) on the last stage


def cut_into_stages(model: TinyTransformer, layers: Sequence[range]) -> list[ModelStage]:
    """Cut ``model`` into pipeline stages, stage s running the blocks ``layers[s]``.

    The ranges must cover the blocks in order, each once: ``[range(0, 2), range(2, 4)]``.
    Tied embeddings put one ``Parameter`` on the first and the last stage (see
    ``tie_word_embeddings``).
    """
    if not layers:
        raise UsageError("no stages: pass one range of blocks per stage, e.g. [range(0, 2)]")
    stages = [
        ModelStage(model, layers=run, first=s == 0, last=s == len(layers) - 1)
        for s, run in enumerate(layers)
    ]
    stop = 0  # where the stages so far end
    for s, run in enumerate(layers):
        if run.start != stop:
            problem = "overlaps the stage before" if run.start < stop else "leaves a gap"
            raise UsageError(f"stage {s} ({run}) {problem}: start it at block {stop}")
        stop = run.stop
    if stop != model.cfg.num_hidden_layers:
        raise UsageError(
            f"the stages end at block {stop} but the model has {model.cfg.num_hidden_layers}: "
            f"end the last stage at {model.cfg.num_hidden_layers}"
        )
    return stages


# --8<-- [end:stages]


# --8<-- [start:heads]
def head_channels(cfg: ModelConfig, heads: range) -> torch.Tensor:
    """The channels of ``heads`` in a (B, T, C) activation: head n owns n*hs .. (n+1)*hs - 1.

    These are also the columns of ``attn.proj.weight`` that read those heads' output.
    """
    if not heads or min(heads) < 0 or max(heads) >= cfg.num_attention_heads:
        raise UsageError(
            f"heads {heads} is not a non-empty part of the model's heads: "
            f"pick them from range(0, {cfg.num_attention_heads})"
        )
    hs = cfg.head_dim
    return torch.cat([torch.arange(n * hs, (n + 1) * hs) for n in heads])


def qkv_rows(cfg: ModelConfig, heads: range) -> torch.Tensor:
    """The rows of ``attn.qkv.weight`` (and entries of its bias) that compute q, k, v of ``heads``.

    The fused weight stacks [q of all heads | k | v], each ``hidden_size`` rows, so one
    head's rows come in three pieces, ``hidden_size`` apart. Tensor parallelism (Week 4)
    gives each rank some heads: their rows of ``qkv`` and their columns of ``proj``.
    """
    channels = head_channels(cfg, heads)
    return torch.cat([part * cfg.hidden_size + channels for part in range(3)])  # q, k, v


# --8<-- [end:heads]

# --8<-- [start:header]
"""Attention over one block of keys at a time: the online softmax that ring attention needs.

Try it:  python -c "from tinyscale.context_parallel.online_softmax import demo; demo()"

Attention over all keys is softmax(q kᵀ / √d) v. Split the keys (and their values) into
blocks: each block gives a partial output and, per query, the log of its softmax's
denominator, the log-sum-exp (lse). Two partial results merge exactly with the lse rule
below, in any order: this is the online softmax of flash attention (Dao et al. 2022),
and it lets a rank attend to keys it holds one block at a time. The backward pass needs
only the merged output and lse: each block's probabilities are exp(s - lse).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

Merge = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]

# --8<-- [end:header]


# --8<-- [start:tile]
def scores(q: torch.Tensor, k: torch.Tensor, *, diagonal: bool) -> torch.Tensor:
    """q kᵀ / √d for one tile (B, H, Tq, Tk). On the diagonal tile (q and k the same
    positions) a key after its query is masked to -inf: causal attention."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if diagonal:
        later = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(later, float("-inf"))
    return s


def tile_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, diagonal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile's partial attention: its output (B, H, Tq, d) and lse (B, H, Tq)."""
    s = scores(q, k, diagonal=diagonal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial results over disjoint keys -> the result over both, exactly.

    out_a is a softmax-weighted mean over keys A, with denominator exp(lse_a); the mean
    over A and B weighs each part by its share of the joint denominator.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    out = (
        torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    )
    return out, lse


def tile_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    diagonal: bool,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tile's share of dq, dk, dv, from the *merged* lse and delta = rowsum(dout * out).

    p = exp(s - lse) is the tile's part of the whole softmax; softmax's backward is
    ds = p * (dp - delta), with delta summed over all keys, hence given.
    """
    p = torch.exp(scores(q, k, diagonal=diagonal) - lse.unsqueeze(-1))  # masked -> 0
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    scale = q.shape[-1] ** -0.5
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


# --8<-- [end:tile]


# --8<-- [start:check]
def blockwise_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, blocks: int, merge_fn: Merge = merge
) -> torch.Tensor:
    """Causal attention in one process, the sequence cut into ``blocks`` chunks: each
    query chunk merges its tiles, one key chunk at a time, as a ring rank would."""
    c = q.shape[2] // blocks
    outs = []
    for i in range(blocks):
        qi = q[:, :, i * c : (i + 1) * c]
        out, lse = tile_forward(qi, k[:, :, i * c : (i + 1) * c], v[:, :, i * c : (i + 1) * c],
                                diagonal=True)  # fmt: skip
        for j in range(i):  # the earlier chunks, each seen whole
            part = tile_forward(qi, k[:, :, j * c : (j + 1) * c], v[:, :, j * c : (j + 1) * c],
                                diagonal=False)  # fmt: skip
            out, lse = merge_fn(out, lse, *part)
        outs.append(out)
    return torch.cat(outs, dim=2)


def merge_error(merge_fn: Merge = merge, *, blocks: int = 4, seed: int = 0) -> float:
    """The largest difference from F.scaled_dot_product_attention(is_causal=True) when
    the tiles are merged by ``merge_fn``: the check of Exercise 2 (float32)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 8 * blocks, 16, generator=g) for _ in range(3))
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (
        (blockwise_attention(q, k, v, blocks=blocks, merge_fn=merge_fn) - reference)
        .abs()
        .max()
        .item()
    )


# --8<-- [end:check]


# --8<-- [start:demo]
def demo() -> None:
    """Two halves of the keys, attended to apart, merged: one softmax over all of them."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    whole, lse = tile_forward(q, k, v, diagonal=False)
    halves = [
        tile_forward(q, k[:, :, s], v[:, :, s], diagonal=False) for s in (slice(0, 2), slice(2, 4))
    ]
    out, merged_lse = merge(*halves[0], *halves[1])
    print(f"lse of the halves {halves[0][1][0, 0, 0]:.4f}, {halves[1][1][0, 0, 0]:.4f} -> "
          f"merged {merged_lse[0, 0, 0]:.4f} (all keys at once: {lse[0, 0, 0]:.4f})")  # fmt: skip
    print(
        f"largest difference of the merged output from one softmax: {(out - whole).abs().max():.1e}"
    )
    print(f"causal, 4 blocks, against F.scaled_dot_product_attention: {merge_error():.1e}")


# --8<-- [end:demo]

# --8<-- [start:header]
"""All-gather the keys and values, then attend locally: Llama 3's context parallelism.

Try it:  python -c "from tinyscale.context_parallel.allgather_kv import demo; demo()"

Instead of passing blocks around a ring, every rank all-gathers the whole sequence's
keys and values once, attends with its own queries (head-tail split, so the causal work
is even), and in the backward pass reduce-scatters their gradients: each rank gets the
sum of every rank's share for its own positions. Llama 3 chose it (Dubey et al. 2024,
§3.3.2): with grouped-query attention the keys and values are much smaller than the
queries, and a document mask is easy to apply to a whole sequence. The price is memory:
a rank holds all T positions of k and v, where the ring holds T/N. This module also
counts both variants' bytes and saved tensors against their formulas.
"""

import torch
import torch.distributed as dist

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.dist import require_process_group
from tinyscale.context_parallel.load_balance import SequenceSplit, tiles_needed
from tinyscale.context_parallel.online_softmax import merge, tile_backward, tile_forward
from tinyscale.context_parallel.ring_attention import check_inputs, ring_attention

# --8<-- [end:header]


# --8<-- [start:allgather]
class AllGatherKVAttention(torch.autograd.Function):
    """Causal attention of the rank's queries over all-gathered keys and values."""

    @staticmethod
    def forward(ctx, q, k, v, split: SequenceSplit):  # type: ignore[override]
        rank, world = dist.get_rank(), dist.get_world_size()
        c = q.shape[2] // len(split.chunks(rank))
        kv = torch.stack([k, v])  # (2, B, H, T/N, d)
        gathered = kv.new_empty((world * 2, *kv.shape[1:]))
        dist.all_gather_single(gathered, kv)  # rank j's k and v at rows 2j, 2j + 1
        outs: list = [None] * len(split.chunks(rank))
        for source in range(world):
            ks, vs = gathered[2 * source], gathered[2 * source + 1]
            for a, b, diagonal in tiles_needed(split, rank, source):
                qa, kb, vb = (
                    q[:, :, a * c : (a + 1) * c],
                    ks[:, :, b * c : (b + 1) * c],
                    vs[:, :, b * c : (b + 1) * c],
                )
                part = tile_forward(qa, kb, vb, diagonal=diagonal)
                outs[a] = part if outs[a] is None else merge(*outs[a], *part)
        out, lse = (torch.cat(parts, dim=2) for parts in zip(*outs, strict=True))
        ctx.save_for_backward(q, gathered, out, lse)  # all T positions of k and v
        ctx.split = split
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, gathered, out, lse = ctx.saved_tensors
        split: SequenceSplit = ctx.split
        rank, world = dist.get_rank(), dist.get_world_size()
        c = q.shape[2] // len(split.chunks(rank))
        delta = (dout * out).sum(-1)
        dq, dgathered = torch.zeros_like(q), torch.zeros_like(gathered)
        for source in range(world):
            for a, b, diagonal in tiles_needed(split, rank, source):
                qs, ks = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
                dq_t, dk_t, dv_t = tile_backward(
                    q[:, :, qs], gathered[2 * source][:, :, ks], gathered[2 * source + 1][:, :, ks],
                    diagonal=diagonal, lse=lse[:, :, qs], dout=dout[:, :, qs], delta=delta[:, :, qs],
                )  # fmt: skip
                dq[:, :, qs] += dq_t
                dgathered[2 * source][:, :, ks] += dk_t
                dgathered[2 * source + 1][:, :, ks] += dv_t
        dkv = gathered.new_empty((2, *gathered.shape[1:]))
        dist.reduce_scatter_single(dkv, dgathered)  # every rank's share of my positions, summed
        return dq, dkv[0], dkv[1], None


def allgather_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: SequenceSplit
) -> torch.Tensor:
    """The same drop-in as ``ring_attention``, with one all-gather instead of a ring."""
    require_process_group("all-gather attention")
    check_inputs(q, k, v, split=split)
    return AllGatherKVAttention.apply(q, k, v, split)


VARIANTS = {"ring": ring_attention, "all-gather": allgather_attention}

# --8<-- [end:allgather]


# --8<-- [start:formulas]
def sent_bytes_formula(variant: str, world: int, kv_bytes: int) -> tuple[int, int]:
    """Bytes one rank sends in (forward, backward); ``kv_bytes`` is its own k (= its own v).

    Ring: N - 1 hops of k and v forward; backward N - 1 hops again, plus N hops of dk, dv.
    All-gather: (N-1)/N of the 2·N·kv buffer forward, the same reduce-scattered backward.
    """
    once = 2 * (world - 1) * kv_bytes
    home = 2 * world * kv_bytes if world > 1 else 0  # one process sends nothing
    return (once, once + home) if variant == "ring" else (once, once)


def saved_bytes_formula(variant: str, world: int, kv_bytes: int, head_dim: int) -> int:
    """Bytes of the tensors saved for backward: q, out and the lse (1/d of q), and k, v:
    the rank's own (ring) or all N ranks' (all-gather)."""
    kv_held = 2 * kv_bytes if variant == "ring" else 2 * world * kv_bytes
    return 2 * kv_bytes + kv_bytes // head_dim + kv_held


# --8<-- [end:formulas]


# --8<-- [start:measure]
def measure(variant: str, seq_len: int, *, heads: int = 2, head_dim: int = 16) -> dict:
    """On every rank: bytes sent forward and backward, and bytes saved for backward."""
    world = dist.get_world_size()
    split = SequenceSplit(world, "headtail")
    q, k, v = (
        torch.randn(1, heads, seq_len // world, head_dim, requires_grad=True) for _ in range(3)
    )
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with CollectiveCounter() as counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = VARIANTS[variant](q, k, v, split=split)
        forward = counter.sent_bytes()
        out.sum().backward()
    kv_bytes = k.numel() * k.element_size()
    return {
        "sent": (forward, counter.sent_bytes() - forward),
        "sent formula": sent_bytes_formula(variant, world, kv_bytes),
        "saved": sum(saved.values()),
        "saved formula": saved_bytes_formula(variant, world, kv_bytes, head_dim),
        "ops": dict(counter.ops()),
    }


def measure_all(seq_lens: tuple[int, ...] = (64, 256)) -> dict:
    return {(variant, t): measure(variant, t) for variant in VARIANTS for t in seq_lens}


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    print(
        f"{'':<10} {'T':>4}  {'sent forward':>13}  {'sent backward':>13}  {'saved':>8}   (rank 0; formula)"
    )
    for (variant, t), m in run_on_ranks(measure_all, world_size)[0].items():
        (fwd, bwd), (fwd_f, bwd_f) = m["sent"], m["sent formula"]
        print(f"{variant:<10} {t:>4}  {fwd:>6,.0f} ({fwd_f:>5,})  {bwd:>6,.0f} ({bwd_f:>5,})  "
              f"{m['saved']:>8,} ({m['saved formula']:,})")  # fmt: skip


# --8<-- [end:measure]

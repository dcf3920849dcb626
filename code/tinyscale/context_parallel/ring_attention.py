# --8<-- [start:header]
"""Ring attention: causal attention over a sequence split across ranks, forward and backward.

Try it:  python -c "from tinyscale.context_parallel.ring_attention import demo; demo()"

Each rank holds the queries, keys and values of its positions (a ``SequenceSplit``).
The keys and values travel around the ring, rank r sending to r + 1 and receiving from
r - 1, N - 1 hops; at each hop a rank attends with its queries to the block it holds and
merges the partial result (``online_softmax.merge``). The next block's messages are
posted before the current block is computed, so the transfer overlaps the arithmetic.
The backward pass sends the keys and values around again, with their gradients (dk, dv)
beside them, accumulating each rank's share, and one last hop brings each block's
gradients home. No rank ever holds more than two blocks of keys and values.
"""

import dataclasses

import torch
import torch.distributed as dist

from tinyscale.comm.dist import require_process_group
from tinyscale.context_parallel.load_balance import SequenceSplit, tiles_needed
from tinyscale.context_parallel.online_softmax import merge, tile_backward, tile_forward
from tinyscale.core.errors import UsageError

# --8<-- [end:header]


# --8<-- [start:exchange]
@dataclasses.dataclass
class RingStats:
    """What one rank did: tiles computed and their score entries, and the order of events."""

    tiles: int = 0
    entries: int = 0  # q positions x k positions over the tiles computed (forward)
    trace: list[str] = dataclasses.field(default_factory=list)


def post_exchange(send: torch.Tensor, recv: torch.Tensor, *, tag: int) -> list[dist.Work]:
    """Post ``send`` to rank + 1 and ``recv`` from rank - 1; wait on neither.

    One batch of both: NCCL runs them as one group, so no rank's send waits on a
    neighbour that is itself stuck sending. The tag keeps the forward's key-value
    messages apart from the backward's gradient messages.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    return dist.batch_isend_irecv([
        dist.P2POp(dist.isend, send, (rank + 1) % world, tag=tag),
        dist.P2POp(dist.irecv, recv, (rank - 1) % world, tag=tag),
    ])  # fmt: skip


def wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()  # raises after the process group's timeout, never hangs


# --8<-- [end:exchange]


# --8<-- [start:forward]
KV_TAG, GRAD_TAG = 0, 1


class RingAttention(torch.autograd.Function):
    """softmax(q kᵀ/√d, causal) v over the whole sequence, each rank holding its positions."""

    @staticmethod
    def forward(ctx, q, k, v, split: SequenceSplit, stats: RingStats):  # type: ignore[override]
        rank, world = dist.get_rank(), dist.get_world_size()
        c = q.shape[2] // len(split.chunks(rank))  # positions per chunk
        kv = torch.stack([k, v])  # one message: (2, B, H, T/N, d)
        outs: list = [None] * len(split.chunks(rank))  # per query chunk: (out, lse)
        for step in range(world):
            source = (rank - step) % world  # whose keys and values we hold now
            if step < world - 1:  # post the next block first: it travels while we compute
                incoming = torch.empty_like(kv)
                works = post_exchange(kv, incoming, tag=KV_TAG)
                stats.trace.append(f"step {step}: post send to {(rank + 1) % world}, "
                                   f"receive from {(rank - 1) % world}")  # fmt: skip
            tiles = tiles_needed(split, rank, source)
            for a, b, diagonal in tiles:
                qa, kb, vb = q[:, :, a * c : (a + 1) * c], *kv[:, :, :, b * c : (b + 1) * c]
                part = tile_forward(qa, kb, vb, diagonal=diagonal)
                outs[a] = part if outs[a] is None else merge(*outs[a], *part)
                stats.tiles, stats.entries = stats.tiles + 1, stats.entries + c * c
            stats.trace.append(
                f"step {step}: compute {len(tiles)} tile(s) with rank {source}'s keys"
            )
            if step < world - 1:
                wait(works)
                kv = incoming
                stats.trace.append(f"step {step}: wait for rank {(rank - 1 - step) % world}'s keys")
        out, lse = (torch.cat(parts, dim=2) for parts in zip(*outs, strict=True))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.split = split
        return out

    # --8<-- [end:forward]

    # --8<-- [start:backward]
    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        split: SequenceSplit = ctx.split
        rank, world = dist.get_rank(), dist.get_world_size()
        c = q.shape[2] // len(split.chunks(rank))
        delta = (dout * out).sum(-1)  # softmax's backward needs it summed over every key
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        grads_in: torch.Tensor | None = None  # dk, dv of the block we hold, from the ranks before
        grad_works: list[dist.Work] = []
        for step in range(world):
            source = (rank - step) % world
            if step < world - 1:
                incoming = torch.empty_like(kv)
                kv_works = post_exchange(kv, incoming, tag=KV_TAG)
            dkv = torch.zeros_like(kv)  # this rank's share of the block's dk, dv
            for a, b, diagonal in tiles_needed(split, rank, source):
                qs, ks = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
                dq_t, dk_t, dv_t = tile_backward(
                    q[:, :, qs], kv[0, :, :, ks], kv[1, :, :, ks], diagonal=diagonal,
                    lse=lse[:, :, qs], dout=dout[:, :, qs], delta=delta[:, :, qs],
                )  # fmt: skip
                dq[:, :, qs] += dq_t
                dkv[0, :, :, ks] += dk_t
                dkv[1, :, :, ks] += dv_t
            if grads_in is not None:  # the shares of the ranks this block visited before
                wait(grad_works)
                dkv += grads_in
            if world > 1:  # pass the sum on; after step N - 1 this brings each block home
                grads_in = torch.empty_like(dkv)
                grad_works = post_exchange(dkv, grads_in, tag=GRAD_TAG)
            else:
                grads_in = dkv
            if step < world - 1:
                wait(kv_works)
                kv = incoming
        wait(grad_works)  # the last hop: our own block's dk, dv, summed over every rank
        assert grads_in is not None
        return dq, grads_in[0], grads_in[1], None, None


# --8<-- [end:backward]


# --8<-- [start:api]
def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    split: SequenceSplit,
    stats: RingStats | None = None,
) -> torch.Tensor:
    """Causal attention of the rank's queries (B, H, T/N, d) over the whole sequence.

    The drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` when each
    rank holds ``split``'s positions of q, k and v.
    """
    require_process_group("ring attention")
    check_inputs(q, k, v, split=split)
    return RingAttention.apply(q, k, v, split, stats if stats is not None else RingStats())


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, split: SequenceSplit
) -> None:
    """One line, before any message: the shapes, the ring's size, the chunks."""
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        raise UsageError(
            f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: pass "
            "three tensors of one shape (batch, heads, positions of this rank, head_dim)"
        )
    if split.world != dist.get_world_size():
        raise UsageError(
            f"the split is over {split.world} ranks but the process group has "
            f"{dist.get_world_size()}: build SequenceSplit(world=dist.get_world_size())"
        )
    split.check_length(q.shape[2] * split.world)


# --8<-- [end:api]


# --8<-- [start:demo]
def against_one_process(kind: str = "headtail", seq_len: int = 32, seed: int = 0) -> dict:
    """On every rank: the ring's output and gradients against one process's SDPA."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)  # the same full q, k, v on every rank
    q, k, v = (torch.randn(2, 2, seq_len, 16, generator=g) for _ in range(3))
    weights = torch.randn(2, 2, seq_len, 16, generator=g)  # loss = (out * weights).sum()
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = torch.nn.functional.scaled_dot_product_attention(*full, is_causal=True)
    (reference * weights).sum().backward()
    split = SequenceSplit(world, kind)  # type: ignore[arg-type]
    mine = [split.shard(t, rank, dim=2).requires_grad_() for t in (q, k, v)]
    stats = RingStats()
    out = ring_attention(*mine, split=split, stats=stats)
    (out * split.shard(weights, rank, dim=2)).sum().backward()
    diff = {"out": (out - split.shard(reference, rank, dim=2)).abs().max().item()}
    for name, local, whole in zip("qkv", mine, full, strict=True):
        diff[f"d{name}"] = (local.grad - split.shard(whole.grad, rank, dim=2)).abs().max().item()
    return {"diff": diff, "tiles": stats.tiles, "entries": stats.entries, "trace": stats.trace}


def work_per_rank(seq_len: int = 64) -> dict[str, tuple[int, int]]:
    """On every rank: (tiles, score entries) the ring computed, for each split (Exercise 1)."""
    work = {}
    for kind in ("contiguous", "headtail"):
        result = against_one_process(kind, seq_len)
        work[kind] = (result["tiles"], result["entries"])
    return work


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(against_one_process, world_size)
    print("rank 0, in order:\n  " + "\n  ".join(ranks[0]["trace"]))
    for rank, result in enumerate(ranks):
        worst = ", ".join(f"{name} {d:.1e}" for name, d in result["diff"].items())
        print(f"rank {rank}: largest difference from one process's SDPA: {worst}")


# --8<-- [end:demo]

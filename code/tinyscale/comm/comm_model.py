# --8<-- [start:ring]
"""How NCCL all-reduces gradients, as formulas and as small simulations that check them.

Ring all-reduce: a reduce-scatter, then an all-gather, around a ring of N ranks (Patarasuk
and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", 2009).
Double binary tree: two complementary binary trees, each reducing half of the data
(Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth broadcast, reduction
and scan", 2009) — what NCCL uses for small messages and many nodes. Time model: the
alpha-beta model of Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH", 2005.

Try it:  python -c "from tinyscale.comm.comm_model import simulate_ring_allreduce as s; print(s([[1, 2], [3, 4]]))"
"""

import dataclasses
import itertools
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.core.memory import MiB, nbytes


@dataclasses.dataclass(frozen=True)
class AllReduceRun:
    """What a simulated all-reduce left on every rank, and what it cost."""

    result: list[list[float]]  # the reduced vector, as each rank holds it at the end
    elements_sent: list[int]  # per rank; bytes = elements x bytes per element
    steps: int  # communication rounds, one after the other: the latency term


def ring_allreduce_bytes(*, size_bytes: float, world_size: int) -> float:
    """Bytes each rank sends: (N-1)/N of the data twice (reduce-scatter, then all-gather)."""
    return 2 * (world_size - 1) / world_size * size_bytes


def ring_allreduce_steps(world_size: int) -> int:
    return 2 * (world_size - 1)


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """Split range(size) into n contiguous chunks; the first size % n are one longer."""
    base, extra = divmod(size, n)
    starts = [i * base + min(i, extra) for i in range(n + 1)]
    return list(itertools.pairwise(starts))


def simulate_ring_allreduce(data: Sequence[Sequence[float]]) -> AllReduceRun:
    """Sum ``data[r]`` (rank r's vector) over ranks, by passing chunks around a ring."""
    n, size = len(data), len(data[0])
    buf = [list(map(float, d)) for d in data]
    chunks = chunk_bounds(size, n)
    sent = [0] * n
    # Reduce-scatter: in step k, rank r sends chunk (r - k) to rank r + 1, which adds it in.
    # After N - 1 steps rank r holds the complete sum of chunk (r + 1) mod N.
    for k in range(n - 1):
        outgoing = [(r, chunks[(r - k) % n]) for r in range(n)]  # all ranks send at once
        payloads = [buf[r][lo:hi] for r, (lo, hi) in outgoing]
        for (r, (lo, hi)), payload in zip(outgoing, payloads, strict=True):
            dst = (r + 1) % n
            buf[dst][lo:hi] = [a + b for a, b in zip(buf[dst][lo:hi], payload, strict=True)]
            sent[r] += hi - lo
    # All-gather: in step k, rank r forwards the finished chunk (r + 1 - k) to rank r + 1.
    for k in range(n - 1):
        outgoing = [(r, chunks[(r + 1 - k) % n]) for r in range(n)]
        payloads = [buf[r][lo:hi] for r, (lo, hi) in outgoing]
        for (r, (lo, hi)), payload in zip(outgoing, payloads, strict=True):
            buf[(r + 1) % n][lo:hi] = payload
            sent[r] += hi - lo
    return AllReduceRun(buf, sent, steps=2 * (n - 1))


# --8<-- [end:ring]


# --8<-- [start:tree]
def binary_tree_parents(n: int) -> list[int | None]:
    """NCCL's in-order binary tree over ranks 0..n-1: parent of each rank (None: the root).

    Number the ranks v = 1..n. The lowest set bit b of v is its height: odd v are leaves,
    and v's parent is (v - b) | 2b. A parent past n is skipped over (climb to its parent).
    The depth is floor(log2 n): the tree is as shallow as a binary tree can be.
    """
    parents: list[int | None] = []
    for rank in range(n):
        v = rank + 1
        while True:
            b = v & -v
            if b > n:  # climbed above every rank: this is the root
                parents.append(None)
                break
            parent = (v - b) | (2 * b)
            if parent <= n:
                parents.append(parent - 1)
                break
            v = parent
    return parents


def double_binary_tree(n: int) -> tuple[list[int | None], list[int | None]]:
    """Two trees in which every rank is an inner node in at most one (as NCCL builds them).

    The second tree is the first mirrored (n even) or shifted by one rank (n odd): the
    leaves of one tree are the inner nodes of the other, so no rank forwards data twice.
    """
    first = binary_tree_parents(n)
    moved = [(n - 1 - r) if n % 2 == 0 else (r + 1) % n for r in range(n)]
    second: list[int | None] = [None] * n
    for r, parent in enumerate(first):
        second[moved[r]] = None if parent is None else moved[parent]
    return first, second


def depth_of(parents: Sequence[int | None], rank: int) -> int:
    parent = parents[rank]
    return 0 if parent is None else 1 + depth_of(parents, parent)


def tree_allreduce_bytes(*, size_bytes: float, world_size: int) -> float:
    """Bytes the busiest rank sends: half the data up one tree and twice down the same tree
    (two children) plus half up the other tree — 2S, the ring's bandwidth, for N >= 4."""
    return 2 * size_bytes if world_size >= 4 else (world_size - 1) / 2 * size_bytes + size_bytes / 2


def tree_allreduce_steps(world_size: int) -> int:
    return 2 * (world_size.bit_length() - 1)  # floor(log2 N) up to the root, then back down


def simulate_tree_allreduce(data: Sequence[Sequence[float]]) -> AllReduceRun:
    """Sum over ranks with a double binary tree: each tree reduces and broadcasts one half."""
    n, size = len(data), len(data[0])
    buf = [list(map(float, d)) for d in data]
    sent = [0] * n
    trees = double_binary_tree(n)
    for parents, (lo, hi) in zip(trees, chunk_bounds(size, 2), strict=True):
        by_depth = sorted(range(n), key=lambda r: -depth_of(parents, r))
        for r in by_depth:  # reduce: deepest ranks first, each adds its partial sum upward
            parent = parents[r]
            if parent is not None:
                buf[parent][lo:hi] = [
                    a + b for a, b in zip(buf[parent][lo:hi], buf[r][lo:hi], strict=True)
                ]
                sent[r] += hi - lo
        for r in reversed(by_depth):  # broadcast: the root's total flows back down
            parent = parents[r]
            if parent is not None:
                buf[r][lo:hi] = buf[parent][lo:hi]
                sent[parent] += hi - lo
    depth = max(depth_of(parents, r) for parents in trees for r in range(n))
    return AllReduceRun(buf, sent, steps=2 * depth)  # both trees run at the same time


# --8<-- [end:tree]


# --8<-- [start:cost]
def allreduce_time(
    algorithm: str, *, size_bytes: float, world_size: int, alpha_s: float, bandwidth_bps: float
) -> float:
    """Seconds for one all-reduce: steps x latency alpha + bytes per rank / link bandwidth."""
    if algorithm == "ring":
        steps = ring_allreduce_steps(world_size)
        sent = ring_allreduce_bytes(size_bytes=size_bytes, world_size=world_size)
    elif algorithm == "tree":
        steps = tree_allreduce_steps(world_size)
        sent = tree_allreduce_bytes(size_bytes=size_bytes, world_size=world_size)
    else:
        raise ValueError(f"algorithm must be 'ring' or 'tree', not {algorithm!r}")
    return steps * alpha_s + sent / bandwidth_bps


# --8<-- [end:cost]


# --8<-- [start:doubling]
def recursive_doubling_steps(world_size: int) -> int:
    """Steps of recursive doubling: log2 P swaps among the largest power of two P <= N, and
    for any other N one step to fold the N - P extra ranks in and one to hand them the sum."""
    power = 1 << (world_size.bit_length() - 1)
    return power.bit_length() - 1 + (2 if world_size > power else 0)


def recursive_doubling_bytes(*, size_bytes: float, world_size: int) -> float:
    """Bytes the busiest rank sends: the whole tensor at every swap, and once more to hand
    a folded rank the sum (N not a power of two)."""
    power = 1 << (world_size.bit_length() - 1)
    return (power.bit_length() - 1 + (world_size > power)) * size_bytes


def doubling_crossover_bytes(*, world_size: int, alpha_s: float, bandwidth_bps: float) -> float:
    """S*: below it recursive doubling beats the ring in the alpha-beta model; inf: always.

    Equal times, steps x alpha + bytes / B, for S = (saved steps) alpha B / (extra bytes
    per byte of tensor). At N = 2 doubling sends what the ring sends, in one step not two.
    """
    saved_steps = ring_allreduce_steps(world_size) - recursive_doubling_steps(world_size)
    extra = recursive_doubling_bytes(size_bytes=1, world_size=world_size)
    extra -= ring_allreduce_bytes(size_bytes=1, world_size=world_size)
    return math.inf if extra <= 0 else saved_steps * alpha_s * bandwidth_bps / extra


# --8<-- [end:doubling]


# --8<-- [start:buckets]
DEFAULT_BUCKET_CAP_MB = 25  # DDP's bucket_cap_mb, in MiB as torch counts it
DEFAULT_FIRST_BUCKET_MB = 1  # DDP's first bucket, when bucket_cap_mb is left at its default


def assign_buckets(
    sizes_in_bytes: Sequence[int], *, cap_bytes: int, first_cap_bytes: int | None = None
) -> list[list[int]]:
    """Group tensors, in the order given, into buckets; one all-reduce per bucket.

    A bucket closes once it holds ``cap_bytes`` or more, so it may overshoot by one tensor
    (and one tensor larger than the cap gets a bucket of its own): the rule of torch's
    ``dist._compute_bucket_assignment_by_size``. ``first_cap_bytes``: a smaller cap for the
    first bucket, as DDP's default (1 MiB): the last layer's gradients are ready first,
    and a small bucket lets the first all-reduce start while backward is still running.
    Returns the indices of each bucket's tensors.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes_in_bytes):
        current.append(i)
        filled += size
        cap = first_cap_bytes if first_cap_bytes is not None and not buckets else cap_bytes
        if filled >= cap:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def ddp_bucket_plan(
    params: Sequence[tuple[str, torch.Tensor]], *, bucket_cap_mb: float | None = None
) -> list[list[str]]:
    """The buckets DDP builds: (name, tensor) in the order their gradients become ready —
    the reverse of the order the forward pass uses them — cut with DDP's caps.

    Each dtype fills its own buckets (a flat buffer has one dtype). Left at the default,
    the first bucket is 1 MiB and the others 25 MiB.
    """
    if bucket_cap_mb is None:
        caps = {
            "cap_bytes": DEFAULT_BUCKET_CAP_MB * MiB,
            "first_cap_bytes": DEFAULT_FIRST_BUCKET_MB * MiB,
        }
    else:
        caps = {"cap_bytes": int(bucket_cap_mb * MiB)}
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in params:
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    return [
        [group[i][0] for i in bucket]
        for group in by_dtype.values()
        for bucket in assign_buckets([nbytes([t]) for _, t in group], **caps)
    ]


# --8<-- [end:buckets]


# --8<-- [start:ddp_buckets]
def ddp_buckets(
    model: nn.Module,
    loss_fn: Callable[[nn.Module], torch.Tensor],
    *,
    bucket_cap_mb: float | None = None,
) -> list[list[str]]:
    """The buckets torch's DDP really builds for ``model``, read with a communication hook.

    DDP starts with every gradient in one bucket, records the order in which gradients
    become ready during the first backward, and then rebuilds its buckets in that order:
    so we read the buckets of the second iteration. Runs in a one-process gloo group.
    """
    own_group = not dist.is_initialized()
    store = tempfile.mkdtemp(prefix="tinyscale-store-")
    if own_group:
        dist.init_process_group("gloo", init_method=f"file://{store}/s", rank=0, world_size=1)
    try:
        names = {p: n for n, p in model.named_parameters()}
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        seen: list[list[str]] = []

        def record(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            seen.append([names[p] for p in bucket.parameters()])
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(bucket.buffer())  # one rank: the sum is the buffer itself
            return done

        ddp.register_comm_hook(None, record)
        for _ in range(2):
            seen.clear()
            loss_fn(ddp).backward()
        model.zero_grad(set_to_none=True)
        return seen
    finally:
        if own_group:
            dist.destroy_process_group()
        shutil.rmtree(store, ignore_errors=True)


# --8<-- [end:ddp_buckets]

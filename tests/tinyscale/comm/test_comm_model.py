"""tinyscale.comm.comm_model: the all-reduce formulas measured by simulation (bytes per rank and
steps, ring and double binary tree, N = 2..8, sizes that do and do not divide by N), the
simulated results equal the true sum, the alpha-beta crossover, and our bucket assignment
against the buckets torch's DDP really builds (read with a communication hook).
"""

import random

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.comm_model import (
    allreduce_time,
    assign_buckets,
    binary_tree_parents,
    chunk_bounds,
    ddp_bucket_plan,
    ddp_buckets,
    depth_of,
    double_binary_tree,
    ring_allreduce_bytes,
    ring_allreduce_steps,
    simulate_ring_allreduce,
    simulate_tree_allreduce,
    tree_allreduce_bytes,
    tree_allreduce_steps,
)
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.memory import MiB
from tinyscale.core.model import TinyTransformer

ITEMSIZE = 4  # fp32 gradients


def rank_data(n: int, size: int, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    return [[float(rng.randint(-100, 100)) for _ in range(size)] for _ in range(n)]


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("size", [24, 840, 1001, 5])  # 840 divides by 2..8; 1001 and 5 not all
def test_ring_simulation_measures_the_formula(n: int, size: int) -> None:
    data = rank_data(n, size)
    run = simulate_ring_allreduce(data)
    total = [sum(col) for col in zip(*data, strict=True)]
    assert all(r == total for r in run.result)  # every rank ends with the true sum
    assert run.steps == ring_allreduce_steps(n) == 2 * (n - 1)
    sent = [e * ITEMSIZE for e in run.elements_sent]
    formula = ring_allreduce_bytes(size_bytes=size * ITEMSIZE, world_size=n)
    assert sum(sent) == 2 * (n - 1) * size * ITEMSIZE  # on average exactly the formula
    if size % n == 0:
        assert sent == [formula] * n  # and to the byte on every rank
    else:  # uneven chunks: each rank within two elements of it
        assert all(abs(s - formula) < 2 * ITEMSIZE for s in sent)


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("size", [24, 840, 1001, 5])
def test_tree_simulation_measures_the_formula(n: int, size: int) -> None:
    data = rank_data(n, size, seed=1)
    run = simulate_tree_allreduce(data)
    total = [sum(col) for col in zip(*data, strict=True)]
    assert all(r == total for r in run.result)
    assert run.steps == tree_allreduce_steps(n)
    sent = [e * ITEMSIZE for e in run.elements_sent]
    assert sum(sent) == 2 * (n - 1) * size * ITEMSIZE  # the same total traffic as the ring
    busiest = tree_allreduce_bytes(size_bytes=size * ITEMSIZE, world_size=n)
    assert abs(max(sent) - busiest) <= ITEMSIZE  # halves of an odd size differ by one element


@pytest.mark.parametrize("n", range(2, 65))
def test_double_binary_tree_shape(n: int) -> None:
    for parents in double_binary_tree(n):
        assert sum(p is None for p in parents) == 1  # one root; every rank reaches it
        children = [sum(p == r for p in parents) for r in range(n)]
        assert max(children) <= 2
        assert max(depth_of(parents, r) for r in range(n)) == n.bit_length() - 1  # floor log2
    first, second = double_binary_tree(n)
    inner = [{r for r in range(n) if r in set(t)} for t in (first, second)]
    assert not inner[0] & inner[1]  # no rank forwards data in both trees
    assert binary_tree_parents(8) == [1, 3, 1, 7, 5, 3, 5, None]


def test_chunk_bounds_cover_the_vector() -> None:
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_latency_favours_tree_for_small_messages_and_ring_for_large() -> None:
    link = dict(world_size=64, alpha_s=5e-6, bandwidth_bps=25e9)
    small, large = 64 * 1024, 1024**3
    assert allreduce_time("tree", size_bytes=small, **link) < allreduce_time(
        "ring", size_bytes=small, **link
    )
    assert allreduce_time("ring", size_bytes=large, **link) < allreduce_time(
        "tree", size_bytes=large, **link
    )
    with pytest.raises(ValueError, match="ring"):
        allreduce_time("star", size_bytes=1, **link)


def test_buckets_match_ddp_default_caps() -> None:
    """8 x 4 MiB layers: a 1 MiB first bucket (the last layer), then 25 MiB buckets that
    close once they reach the cap (so they overshoot by one tensor)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
    ready_order = list(reversed(list(model.named_parameters())))
    ours = ddp_bucket_plan(ready_order)
    assert ours[0] == ["7.bias", "7.weight"] and len(ours) == 2
    theirs = ddp_buckets(model, lambda m: m(torch.randn(2, 1024)).sum())
    assert ours == theirs


@pytest.mark.parametrize("cap_mb", [0.05, 0.2])
def test_buckets_match_ddp_on_the_tiny_transformer(cap_mb: float) -> None:
    """Same buckets; inside a bucket DDP lists LayerNorm's weight before its bias, because
    that is the order backward really produces them (it records the order, we guess it)."""
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(dropout=0.0))
    x = torch.randint(0, 1024, (2, 64))
    ours = ddp_bucket_plan(list(reversed(list(model.named_parameters()))), bucket_cap_mb=cap_mb)
    theirs = ddp_buckets(model, lambda m: m(x, x)[1], bucket_cap_mb=cap_mb)
    assert len(ours) > 1
    assert [set(b) for b in ours] == [set(b) for b in theirs]


def test_buckets_split_by_dtype() -> None:
    params = [("a", torch.zeros(4)), ("b", torch.zeros(4, dtype=torch.bfloat16))]
    assert ddp_bucket_plan(params, bucket_cap_mb=1) == [["a"], ["b"]]


def test_bucket_assignment_is_torchs_rule() -> None:
    params = [p for p in TinyTransformer(preset("tiny")).parameters()][::-1]
    sizes = [p.numel() * p.element_size() for p in params]
    for cap_mb in (0.001, 0.01, 0.05, 1.0, 25.0):
        cap = int(cap_mb * MiB)
        torchs, _ = dist._compute_bucket_assignment_by_size(params, [cap], [False] * len(params))
        assert assign_buckets(sizes, cap_bytes=cap) == torchs, cap_mb
    first, cap = int(0.005 * MiB), int(0.02 * MiB)  # torch's small first bucket, scaled down
    torchs, _ = dist._compute_bucket_assignment_by_size(params, [first, cap], [False] * len(params))
    ours = assign_buckets(sizes, cap_bytes=cap, first_cap_bytes=first)
    assert ours == torchs and len(ours[0]) < len(ours[1])


def test_assign_buckets_by_hand() -> None:
    assert assign_buckets([40, 4000, 400, 400_000, 20], cap_bytes=1000) == [[0, 1], [2, 3], [4]]
    assert assign_buckets([5000], cap_bytes=1000) == [[0]], "too big: a bucket of its own"
    assert assign_buckets([1, 2, 3], cap_bytes=10**9) == [[0, 1, 2]]
    assert assign_buckets([40, 40, 400], cap_bytes=1000, first_cap_bytes=50) == [[0, 1], [2]]

"""tinyscale.data_parallel.data_sharding: index for index what Accelerate's BatchSamplerShard and torch's
DistributedSampler give each rank; disjoint and covering up to the counted padding; the
same number of batches on every rank with even_batches; one-line errors; and, on real
processes, gather-then-trim evaluation and the hang that uneven batch counts cause."""

import itertools
import random

import pytest
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, DistributedSampler

from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.core.errors import UsageError
from tinyscale.data_parallel.data_sharding import (
    shard_batches,
    sharded_sum_of_squares,
    show,
    strided_shard,
    uneven_steps,
    unshard,
)

SIZES = [0, 1, 3, 7, 10, 16, 23, 33]
BATCH_SIZES = [1, 2, 3, 4, 8]
WORLDS = [1, 2, 3, 4]
SETTINGS = list(itertools.product([False, True], repeat=3))  # split, even, drop_last


def order(n: int, shuffled: bool) -> list[int]:
    """The sampler's order: sequential, or a fixed permutation (shuffling happens upstream)."""
    indices = list(range(n))
    if shuffled:
        random.Random(n).shuffle(indices)
    return indices


def accelerate_shards(indices, batch_size, world, split, even, drop) -> list[list[list[int]]]:
    sampler = BatchSampler(indices, batch_size, drop)
    return [
        [list(b) for b in BatchSamplerShard(sampler, world, rank, split, even)]
        for rank in range(world)
    ]


def ours(indices, batch_size, world, split, even, drop) -> list[list[list[int]]]:
    kw = dict(batch_size=batch_size, world_size=world, split_batches=split)
    return [
        shard_batches(indices, rank=rank, even_batches=even, drop_last=drop, **kw)
        for rank in range(world)
    ]


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("split,even,drop", SETTINGS)
def test_same_indices_as_accelerate(split: bool, even: bool, drop: bool, shuffled: bool) -> None:
    checked = 0
    for n, batch_size, world in itertools.product(SIZES, BATCH_SIZES, WORLDS):
        if split and batch_size % world:
            continue  # Accelerate refuses it too (test_split_needs_divisible_batch below)
        indices = order(n, shuffled)
        expected = accelerate_shards(indices, batch_size, world, split, even, drop)
        got = ours(indices, batch_size, world, split, even, drop)
        assert got == expected, f"n={n} batch={batch_size} world={world}"
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n,batch_size,world", [(10, 4, 2), (23, 4, 4), (5, 6, 3), (33, 8, 4)])
def test_even_batches_disjoint_covering_and_equal(n, batch_size, world, split) -> None:
    shards = ours(list(range(n)), batch_size, world, split, True, False)
    counts = {len(batches) for batches in shards}
    assert len(counts) == 1, f"ranks get different numbers of batches: {counts}"
    sizes = {len(b) for batches in shards for b in batches}
    assert sizes == {batch_size // world if split else batch_size}, "a short batch slipped in"
    flat = [i for batches in shards for b in batches for i in b]
    assert set(flat) == set(range(n)), "some sample is on no rank"
    step = batch_size if split else batch_size * world
    padding = -n % step
    assert len(flat) == n + padding, "exactly the wrap-around padding is extra"
    if n >= step:  # with fewer samples than one step, samples repeat more than once
        assert len(flat) - len(set(flat)) == padding


@pytest.mark.parametrize("split", [False, True])
def test_without_even_batches_nothing_repeats_but_counts_differ(split: bool) -> None:
    n, batch_size, world = 10, 4, 2
    shards = ours(list(range(n)), batch_size, world, split, False, False)
    flat = [i for batches in shards for b in batches for i in b]
    assert sorted(flat) == list(range(n)), "every sample exactly once"
    if not split:  # 3 batches over 2 ranks: rank 0 gets 2, rank 1 gets 1
        assert [len(batches) for batches in shards] == [2, 1]
    else:  # the last batch [8, 9] fills rank 0's slice only
        assert [len(batches) for batches in shards] == [3, 2]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n,batch_size,world", [(10, 4, 2), (23, 4, 4), (5, 6, 3), (7, 2, 2)])
def test_unshard_gives_back_the_data_set_once(n, batch_size, world, split) -> None:
    indices = order(n, shuffled=True)
    for even in (True, False):
        shards = ours(indices, batch_size, world, split, even, False)
        assert unshard(shards, n) == indices


@pytest.mark.parametrize("n", [0, 1, 10, 11, 12, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_strided_shard_matches_distributed_sampler(n: int, world: int, drop_last: bool) -> None:
    data = list(range(n))
    for rank in range(world):
        sampler = DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
        )
        assert strided_shard(data, world_size=world, rank=rank, drop_last=drop_last) == list(
            sampler
        )


def test_split_needs_divisible_batch() -> None:
    with pytest.raises(UsageError) as err:
        shard_batches(range(10), batch_size=6, world_size=4, rank=0, split_batches=True)
    message = str(err.value)
    assert "\n" not in message
    assert "divisible by 4" in message and "split_batches=False" in message
    with pytest.raises(ValueError, match="round multiple"):  # Accelerate refuses it too
        BatchSamplerShard(BatchSampler(range(10), 6, False), 4, 0, split_batches=True)


@pytest.mark.parametrize(
    "kwargs,fix",
    [
        (dict(batch_size=4, world_size=2, rank=2), "0 <= rank < world"),
        (dict(batch_size=4, world_size=0, rank=0), "0 <= rank < world"),
        (dict(batch_size=0, world_size=2, rank=0), "at least 1"),
    ],
)
def test_bad_input_is_one_line(kwargs: dict, fix: str) -> None:
    with pytest.raises(UsageError, match=fix):
        shard_batches(range(10), **kwargs)


def test_show_prints_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    show(10, batch_size=4, world_size=2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "split_batches=False:"
    assert lines[1] == "  rank 0: [[0, 1, 2, 3], [8, 9, 0, 1]]"
    assert lines[3] == "split_batches=True:"
    assert lines[5] == "  rank 1: [[2, 3], [6, 7], [0, 1]]"
    show(7, batch_size=2, world_size=3)  # 2 does not split over 3 ranks: the error, one line
    lines = capsys.readouterr().out.splitlines()
    assert lines[4:] == [
        "split_batches=True:",
        "  split_batches=True cuts each batch of 2 into 3 "
        "equal slices, and 2 % 3 != 0: use a batch size divisible by 3, or split_batches=False",
    ]


def test_on_real_ranks_trim_fixes_the_sum_and_uneven_batches_fail() -> None:
    n, batch_size, world = 10, 4, 2
    true_sum = float(sum(i * i for i in range(n)))
    results = run_on_ranks(sharded_sum_of_squares, world, n, batch_size)
    padded = list(range(n)) + list(range(-n % (batch_size * world)))  # 0..9, then 0..5
    for naive, trimmed, seen in results:
        assert trimmed == true_sum
        assert naive == float(sum(i * i for i in padded)) > true_sum
        assert seen == batch_size * 2  # 2 batches of 4 on each rank, padding included
    # even_batches=False: rank 1 runs out one batch early and rank 0 waits for it.
    with pytest.raises(RankFailed) as err:
        run_on_ranks(uneven_steps, world, n, batch_size, timeout_s=3)
    assert str(err.value).startswith("rank 0 of 2 raised:")

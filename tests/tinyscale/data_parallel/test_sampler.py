"""DistributedSampler, the way Lab 2 uses it: no process group needed, just (rank, world).

- The shards of all ranks are disjoint and together cover the data set (drop_last=False:
  every sample, plus padding; drop_last=True: all but a short tail).
- When the world size does not divide the data set, drop_last=False pads by repeating
  the first samples of the permutation; drop_last=True trims the tail instead.
- set_epoch reshuffles; forgetting it repeats the same order every epoch.
- shuffle=False deals the samples round-robin: rank r gets r, r + world, ...
"""

import pytest
from torch.utils.data import DistributedSampler


def shards(n: int, world: int, **kwargs: object) -> list[list[int]]:
    data = list(range(n))
    return [
        list(DistributedSampler(data, num_replicas=world, rank=r, seed=0, **kwargs))  # type: ignore[arg-type]
        for r in range(world)
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_drop_last_shards_are_disjoint_equal_and_cover_all_but_a_tail(world: int) -> None:
    n = 3319  # the Lab 1/2 training blocks
    parts = shards(n, world, shuffle=True, drop_last=True)
    flat = [i for part in parts for i in part]
    assert len(set(flat)) == len(flat), "a sample appears on two ranks"
    assert {len(p) for p in parts} == {n // world}, "every rank gets as many samples"
    assert len(flat) == n - n % world  # covers everything but the n % world dropped samples


@pytest.mark.parametrize("n,world", [(10, 3), (10, 4), (3319, 4)])
def test_padding_repeats_samples_so_every_rank_gets_as_many(n: int, world: int) -> None:
    parts = shards(n, world, shuffle=True, drop_last=False)
    flat = [i for part in parts for i in part]
    padded = -n % world
    assert {len(p) for p in parts} == {-(-n // world)}  # ceil(n / world) each
    assert set(flat) == set(range(n)), "every sample is on some rank"
    assert len(flat) - len(set(flat)) == padded, "exactly the padding is repeated"


def test_no_shuffle_deals_round_robin() -> None:
    assert shards(10, 3, shuffle=False, drop_last=False) == [
        [0, 3, 6, 9],
        [1, 4, 7, 0],
        [2, 5, 8, 1],
    ]
    assert shards(10, 3, shuffle=False, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_set_epoch_reshuffles_and_forgetting_it_repeats_the_order() -> None:
    sampler = DistributedSampler(list(range(100)), num_replicas=2, rank=0, seed=0)  # type: ignore[arg-type]
    first = list(sampler)
    assert list(sampler) == first, "without set_epoch, epoch 2 repeats epoch 1"
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    sampler.set_epoch(0)
    assert list(sampler) == first, "the order is a function of (seed, epoch) only"


def test_every_rank_agrees_on_the_permutation_each_epoch() -> None:
    """Disjointness holds in every epoch because all ranks draw the same permutation."""
    for epoch in range(3):
        parts = []
        for r in range(4):
            s = DistributedSampler(list(range(50)), num_replicas=4, rank=r, seed=7, drop_last=True)  # type: ignore[arg-type]
            s.set_epoch(epoch)
            parts.append(list(s))
        flat = [i for p in parts for i in p]
        assert len(set(flat)) == len(flat) == 48

"""tinyscale.ops.allocator: the caching-allocator model's rules (rounding, pools, splitting,
merging, max_split_size, expandable segments), its invariants after every operation of a
random workload, its one-line errors, and, where a GPU exists, the model against the real
allocator.
"""

import os
import random

import pytest
import torch

from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.ops.allocator import (
    LARGE_BUFFER,
    MIN_BLOCK,
    SMALL_BUFFER,
    AllocatorConfig,
    CachingAllocator,
    OutOfMemory,
    round_size,
    segment_size,
)
from tinyscale.ops.fragmentation import SETTINGS

GiB = 1024 * MiB


def check_invariants(alloc: CachingAllocator) -> None:
    """What must hold after every malloc, free and empty_cache."""
    s = alloc.stats()
    assert 0 <= s.allocated <= s.reserved <= alloc.config.capacity
    assert s.requested <= s.allocated
    for seg in alloc.segments:
        assert seg.blocks, "an empty segment should have been removed"
        for a, b in zip(seg.blocks, seg.blocks[1:], strict=False):
            assert a.addr + a.size == b.addr, "blocks must tile their segment, no gap, no overlap"
            assert not (a.free and b.free), "two neighbouring free blocks were not merged"
            assert a.mapped or b.mapped, "two neighbouring unmapped ranges were not merged"
        page = SMALL_BUFFER if seg.small else LARGE_BUFFER
        for b in seg.blocks:
            assert b.size > 0 and b.segment is seg
            if b.allocated:
                assert b.size % MIN_BLOCK == 0 and b.requested <= b.size
                assert (b.size <= 1 * MiB) == seg.small, "a block in the wrong pool"
            if not b.mapped:  # pages are mapped whole: unmapped ranges start and end on pages
                assert seg.expandable and b.addr % page == 0 and b.size % page == 0


@pytest.mark.parametrize(
    ("nbytes", "rounded", "allocated", "segment"),
    [
        (1, 512, 512, 2 * MiB),
        (513, 1024, 1024, 2 * MiB),
        (1 * MiB, 1 * MiB, 1 * MiB, 2 * MiB),  # the largest small request
        (1 * MiB + 1, 1 * MiB + 512, 1 * MiB + 512, 20 * MiB),  # large pool, 20 MiB shared
        (10 * MiB - 1, 10 * MiB, 10 * MiB, 10 * MiB),  # 10 MiB: a segment of its own
        # its own segment, rounded up to 2 MiB; the 1.5 MiB rest is split off, stays cached
        (25 * MiB // 2, 25 * MiB // 2, 25 * MiB // 2, 14 * MiB),
        # the 1 MiB left over is not more than 1 MiB: not split off, the block keeps it
        (11 * MiB, 11 * MiB, 12 * MiB, 12 * MiB),
    ],
)
def test_rounding_and_segment_sizes(
    nbytes: int, rounded: int, allocated: int, segment: int
) -> None:
    assert round_size(nbytes) == rounded
    assert segment_size(rounded) == segment
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB))
    alloc.malloc(nbytes)
    s = alloc.stats()
    assert (s.requested, s.allocated, s.reserved) == (nbytes, allocated, segment)


def test_cached_blocks_are_reused_split_and_merged() -> None:
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB))
    a = alloc.malloc(4 * MiB)
    b = alloc.malloc(4 * MiB)  # best fit: the 16 MiB left of a's 20 MiB segment, split
    assert alloc.stats().reserved == 20 * MiB and b.addr == a.addr + 4 * MiB
    alloc.free(a)
    alloc.free(b)  # merged with a and with the 12 MiB tail: one free 20 MiB block
    [seg] = alloc.segments
    assert [(x.size, x.free) for x in seg.blocks] == [(20 * MiB, True)]
    big = alloc.malloc(64 * MiB)  # nothing cached fits: a new segment
    assert alloc.stats().segments == 2
    alloc.free(big)
    alloc.empty_cache()  # every segment is whole and free: all go back
    assert alloc.stats().reserved == 0 and alloc.segments == []
    check_invariants(alloc)


def test_one_small_block_pins_its_segment() -> None:
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB))
    act = alloc.malloc(100 * MiB)
    alloc.free(act)
    kept = alloc.malloc(8 * MiB)  # best fit carves it out of the cached 100 MiB block
    assert kept.segment is act.segment and alloc.stats().segments == 1
    alloc.empty_cache()
    assert alloc.stats().reserved == 100 * MiB  # 92 MiB free, but not returnable


def test_max_split_size_keeps_big_blocks_whole() -> None:
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB, max_split_size=64 * MiB))
    act = alloc.malloc(100 * MiB)
    alloc.free(act)
    kept = alloc.malloc(8 * MiB)  # may not split the oversize 100 MiB block
    assert kept.segment is not act.segment
    alloc.empty_cache()  # so the big one can go back to the driver
    assert alloc.stats().reserved == 20 * MiB
    with pytest.raises(UsageError, match="more than 20 MiB"):
        CachingAllocator(AllocatorConfig(capacity=GiB, max_split_size=20 * MiB))


def test_expandable_segment_grows_its_free_tail_and_unmaps_free_pages() -> None:
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB, expandable_segments=True))
    a = alloc.malloc(30 * MiB)  # maps 2 pages of 20 MiB
    assert alloc.stats().reserved == 40 * MiB
    b = alloc.malloc(30 * MiB)  # the free 10 MiB tail plus one more page: contiguous with a
    assert b.addr == a.addr + 30 * MiB and alloc.stats().reserved == 60 * MiB
    assert alloc.stats().segments == 1
    alloc.free(a)
    alloc.empty_cache()  # a's range holds one whole free page (0-20 MiB): unmapped
    assert alloc.stats().reserved == 40 * MiB
    check_invariants(alloc)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_invariants_hold_after_every_operation(setting: str) -> None:
    rng = random.Random(0)
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB, **SETTINGS[setting]))
    live = []
    sizes = [100, 4096, 700_000, 3 * MiB, 9 * MiB, 25 * MiB, 90 * MiB]
    for _ in range(600):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(alloc.malloc(rng.choice(sizes) + rng.randrange(1, 4096)))
            except OutOfMemory:
                alloc.free(live.pop(0))
        if rng.random() < 0.02:
            alloc.empty_cache()
        check_invariants(alloc)
    for block in live:
        alloc.free(block)
    alloc.empty_cache()
    assert alloc.stats().reserved == 0, "with nothing allocated, everything must go back"


def test_bad_input_is_one_line() -> None:
    alloc = CachingAllocator(AllocatorConfig(capacity=GiB))
    block = alloc.malloc(1)
    alloc.free(block)
    with pytest.raises(UsageError, match="freed twice"):
        alloc.free(block)
    with pytest.raises(UsageError, match="positive"):
        alloc.malloc(0)
    with pytest.raises(UsageError, match="capacity"):
        CachingAllocator(AllocatorConfig(capacity=0))
    with pytest.raises(OutOfMemory, match="tried to allocate 2048 MiB; capacity 1024 MiB"):
        alloc.malloc(2 * GiB)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif("PYTORCH_CUDA_ALLOC_CONF" in os.environ, reason="default allocator only")
def test_model_matches_the_real_allocator_on_a_gpu() -> None:
    """On a GPU: the same requests through torch's allocator give the same two numbers."""
    torch.cuda.empty_cache()
    if torch.cuda.memory_allocated() or torch.cuda.memory_reserved():
        pytest.skip("this process already holds CUDA memory")
    capacity = torch.cuda.get_device_properties(0).total_memory
    alloc = CachingAllocator(AllocatorConfig(capacity=capacity))
    rng = random.Random(1)
    live_model, live_real = [], []
    for _ in range(200):
        if live_model and rng.random() < 0.4:
            i = rng.randrange(len(live_model))
            alloc.free(live_model.pop(i))
            del live_real[i]
        else:
            n = rng.choice([300, 5000, 800_000, 3 * MiB, 12 * MiB, 40 * MiB]) + rng.randrange(512)
            live_model.append(alloc.malloc(n))
            live_real.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        s = alloc.stats()
        assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (
            s.allocated,
            s.reserved,
        )
    del live_real
    torch.cuda.empty_cache()

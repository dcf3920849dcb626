# --8<-- [start:rules]
"""A model of PyTorch's CUDA caching allocator: malloc, free and empty_cache, on a CPU.

Try it:  python -c "from tinyscale.core.memory import MiB; from tinyscale.ops.allocator import AllocatorConfig, CachingAllocator as C; a = C(AllocatorConfig(capacity=1024 * MiB)); a.malloc(100 * MiB); print(a.stats())"

A model, not the allocator. Its rules follow c10/cuda/CUDACachingAllocator.cpp (torch 2.x):
sizes rounded to 512 bytes, a small pool (<= 1 MiB) carved from 2 MiB segments, a large pool
carved from 20 MiB segments (requests under 10 MiB) or from a segment of its own (rounded to
2 MiB), best-fit reuse of cached blocks, splitting, merging on free, max_split_size,
expandable segments, and the retry that frees the cache before an out-of-memory error.
Left out: streams and events, CUDA graph pools, garbage_collection_threshold,
roundup_power2_divisions. Addresses are numbers; no byte of memory is allocated.
tinyscale.ops.fragmentation drives it with a training workload.
"""

import dataclasses
import math

from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB

MIN_BLOCK = 512  # every request is rounded up to a multiple of 512 bytes
SMALL_SIZE = 1 * MiB  # requests up to 1 MiB use the small pool ...
SMALL_BUFFER = 2 * MiB  # ... whose segments are 2 MiB
MIN_LARGE_ALLOC = 10 * MiB  # large requests under 10 MiB share a 20 MiB segment ...
LARGE_BUFFER = 20 * MiB
ROUND_LARGE = 2 * MiB  # ... bigger ones get a segment of their own, rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """The block size a request really gets: a multiple of 512 bytes."""
    return max(MIN_BLOCK, math.ceil(nbytes / MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """How much one cudaMalloc asks the driver for, when no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return math.ceil(size / ROUND_LARGE) * ROUND_LARGE


@dataclasses.dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """What PYTORCH_CUDA_ALLOC_CONF sets, and how big the modelled GPU is."""

    capacity: int  # bytes the allocator may reserve from the driver
    max_split_size: int | None = None  # max_split_size_mb: never split blocks this big
    expandable_segments: bool = False  # expandable_segments:True


class OutOfMemory(Exception):
    """The model's 'CUDA out of memory': no cached block fits and the driver has no room."""


# --8<-- [end:rules]


# --8<-- [start:blocks]
@dataclasses.dataclass(eq=False)
class Block:
    """A contiguous range of one segment: in use, cached (free), or not backed by memory."""

    addr: int
    size: int
    segment: "Segment"
    allocated: bool = False
    mapped: bool = True  # False only inside an expandable segment: address space, no memory
    requested: int = 0  # bytes the caller asked for (size is rounded up)

    @property
    def free(self) -> bool:
        return self.mapped and not self.allocated


@dataclasses.dataclass(eq=False)
class Segment:
    """One cudaMalloc (or one expandable address range); its blocks tile it in address order."""

    small: bool
    expandable: bool
    blocks: list[Block] = dataclasses.field(default_factory=list)

    def merge_free_neighbours(self) -> None:
        """Coalesce adjacent blocks in the same state: freed memory becomes one bigger block."""
        merged: list[Block] = []
        for b in self.blocks:
            prev = merged[-1] if merged else None
            same_state = prev is not None and not prev.allocated and not b.allocated
            if same_state and prev.mapped == b.mapped:
                prev.size += b.size
            else:
                merged.append(b)
        self.blocks = merged


@dataclasses.dataclass(frozen=True)
class Stats:
    """The numbers torch.cuda.memory_stats() reports, from the model."""

    allocated: int  # bytes in blocks handed out (memory_allocated)
    requested: int  # bytes the callers asked for
    reserved: int  # bytes taken from the driver (memory_reserved)
    largest_free: int  # the biggest cached block: the largest request served without cudaMalloc
    segments: int

    @property
    def reserved_unallocated(self) -> int:
        return self.reserved - self.allocated


# --8<-- [end:blocks]


# --8<-- [start:malloc]
class CachingAllocator:
    """malloc, free and empty_cache with the caching allocator's rules (see the module docs)."""

    def __init__(self, config: AllocatorConfig) -> None:
        if config.capacity <= 0:
            raise UsageError(f"capacity must be positive, got {config.capacity}")
        if config.max_split_size is not None and config.max_split_size <= LARGE_BUFFER:
            # torch enforces max_split_size_mb > 20 in its config parser
            raise UsageError("max_split_size must be more than 20 MiB (max_split_size_mb > 20)")
        self.config = config
        self.segments: list[Segment] = []
        self._next_addr = 0

    def malloc(self, nbytes: int) -> Block:
        if nbytes <= 0:
            raise UsageError(f"allocate a positive number of bytes, got {nbytes}")
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small) or self._grow(size, small)
        if block is None:  # torch frees every cached block it can, then tries once more
            self.empty_cache()
            block = self._grow(size, small)
        if block is None:
            raise OutOfMemory(self._oom_message(nbytes))
        if self._should_split(block, size):
            rest = Block(block.addr + size, block.size - size, block.segment)
            blocks = block.segment.blocks
            blocks.insert(blocks.index(block) + 1, rest)
            block.size = size
        block.allocated, block.requested = True, nbytes
        return block

    def _best_fit(self, size: int, small: bool) -> Block | None:
        """The smallest cached block that is big enough (lowest address on a tie)."""
        limit = self.config.max_split_size
        fits = [
            b
            for seg in self.segments
            if seg.small == small
            for b in seg.blocks
            if b.free and b.size >= size
        ]
        if limit is not None:  # keep big blocks whole: small requests may not carve them up
            fits = [b for b in fits if b.size < limit or size >= limit]
            fits = [b for b in fits if size < limit or b.size < size + LARGE_BUFFER]
        return min(fits, key=lambda b: (b.size, b.addr), default=None)

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.segment.small or block.segment.expandable:  # pages can be unmapped later
            return remaining >= MIN_BLOCK
        limit = self.config.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    # --8<-- [end:malloc]

    # --8<-- [start:grow]
    def _grow(self, size: int, small: bool) -> Block | None:
        """Ask the 'driver' for memory: a new segment, or more pages of the expandable one."""
        if self.config.expandable_segments:
            return self._map_pages(size, small)
        new = segment_size(size)
        if self.stats().reserved + new > self.config.capacity:
            return None
        seg = Segment(small=small, expandable=False)
        seg.blocks.append(Block(self._new_address(new), new, seg))
        self.segments.append(seg)
        return seg.blocks[0]

    def _new_address(self, span: int) -> int:
        """A fresh address range, aligned like the driver's (to 20 MiB, a whole page)."""
        addr = math.ceil(self._next_addr / LARGE_BUFFER) * LARGE_BUFFER
        self._next_addr = addr + span
        return addr

    def _map_pages(self, size: int, small: bool) -> Block | None:
        """Expandable segments: one address range per pool, memory mapped in pages on demand.

        The free tail of what is mapped joins the new pages, so a bigger request grows
        the range instead of opening a separate segment beside the cached ones.
        """
        page = SMALL_BUFFER if small else LARGE_BUFFER
        found = ((seg, self._first_run(seg, size)) for seg in self.segments if seg.small == small)
        seg, run = next(((s, r) for s, r in found if r is not None), (None, None))
        if seg is None or run is None:  # address space is cheap: reserve a device's worth
            seg = Segment(small=small, expandable=True)
            span = math.ceil(max(self.config.capacity, size) / page) * page
            seg.blocks.append(Block(self._new_address(span), span, seg, mapped=False))
            self.segments.append(seg)
            run = seg.blocks[:]
        start = run[0].addr
        end = math.ceil((start + size) / page) * page  # whole pages; unmapped ones start on one
        to_map = sum(
            min(b.addr + b.size, end) - max(b.addr, start)
            for b in run
            if not b.mapped and b.addr < end
        )
        if self.stats().reserved + to_map > self.config.capacity:
            return None
        for b in run:
            if not b.mapped and b.addr < end:
                if b.addr + b.size > end:  # keep the part beyond `end` unmapped
                    tail = Block(end, b.addr + b.size - end, seg, mapped=False)
                    seg.blocks.insert(seg.blocks.index(b) + 1, tail)
                    b.size = end - b.addr
                b.mapped = True
        seg.merge_free_neighbours()
        return next(b for b in seg.blocks if b.addr == start)

    @staticmethod
    def _first_run(seg: Segment, size: int) -> list[Block] | None:
        """The first run of neighbouring unallocated blocks, some unmapped, of >= size bytes."""
        run: list[Block] = []
        for b in [*seg.blocks, None]:
            if b is not None and not b.allocated:
                run.append(b)
                continue
            if sum(r.size for r in run) >= size and any(not r.mapped for r in run):
                return run
            run = []
        return None

    # --8<-- [end:grow]

    # --8<-- [start:free]
    def free(self, block: Block) -> None:
        """Back to the cache, not to the driver: merged with free neighbours, kept for reuse."""
        if not block.allocated:
            raise UsageError(f"block at {block.addr} is not allocated: freed twice?")
        block.allocated, block.requested = False, 0
        block.segment.merge_free_neighbours()

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): give back what holds no allocated byte.

        A fixed segment goes back only when it is entirely free: one small block still in
        use pins the whole segment. An expandable segment gives back every whole page
        that no allocated block touches.
        """
        kept: list[Segment] = []
        for seg in self.segments:
            if not seg.expandable:
                if not (len(seg.blocks) == 1 and seg.blocks[0].free):
                    kept.append(seg)
                continue
            page = SMALL_BUFFER if seg.small else LARGE_BUFFER
            pieces: list[Block] = []
            for b in seg.blocks:
                lo = math.ceil(b.addr / page) * page
                hi = (b.addr + b.size) // page * page
                if not b.free or hi <= lo:
                    pieces.append(b)
                    continue
                bounds = [(b.addr, lo, True), (lo, hi, False), (hi, b.addr + b.size, True)]
                pieces += [Block(s, e - s, seg, mapped=m) for s, e, m in bounds if e > s]
            seg.blocks = pieces
            seg.merge_free_neighbours()
            kept.append(seg)
        self.segments = kept

    def stats(self) -> Stats:
        blocks = [b for seg in self.segments for b in seg.blocks]
        return Stats(
            allocated=sum(b.size for b in blocks if b.allocated),
            requested=sum(b.requested for b in blocks if b.allocated),
            reserved=sum(b.size for b in blocks if b.mapped),
            largest_free=max((b.size for b in blocks if b.free), default=0),
            segments=len(self.segments),
        )

    def _oom_message(self, nbytes: int) -> str:
        s = self.stats()
        return (
            f"out of memory (model): tried to allocate {nbytes / MiB:g} MiB; capacity "
            f"{self.config.capacity / MiB:g} MiB, {(self.config.capacity - s.reserved) / MiB:g}"
            f" MiB free; {s.allocated / MiB:g} MiB allocated, "
            f"{s.reserved_unallocated / MiB:g} MiB reserved but unallocated"
        )


# --8<-- [end:free]

# --8<-- [start:rules]
"""A model of PyTorch's CUDA caching allocator: GPU memory fragmentation, reproduced on a CPU.

Try it:  python -m tinyscale.ops.fragmentation

A model, not the allocator. Its rules follow c10/cuda/CUDACachingAllocator.cpp (torch 2.x):
sizes rounded to 512 bytes, a small pool (<= 1 MiB) carved from 2 MiB segments, a large pool
carved from 20 MiB segments (requests under 10 MiB) or from a segment of its own (rounded to
2 MiB), best-fit reuse of cached blocks, splitting, merging on free, max_split_size,
expandable segments, and the retry that frees the cache before an out-of-memory error.
Left out: streams and events, CUDA graph pools, garbage_collection_threshold,
roundup_power2_divisions. Addresses are numbers; no byte of memory is allocated.
"""

import argparse
import dataclasses
import math
import os
from collections.abc import Iterable, Sequence

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

MiB = 1024 * 1024
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


# --8<-- [start:workload]
def training_steps(
    steps: Sequence[Sequence[int]], *, keep_bytes: int
) -> list[tuple[str, str, int]]:
    """A training loop as allocator calls: ("malloc", name, bytes) and ("free", name, 0).

    ``steps[i]`` lists the activations step i allocates, one per layer, in forward order.
    Each step also keeps a small tensor for the rest of the run (a logged metric, a cache
    entry), allocated while the activations are alive; the backward pass then frees the
    activations, last layer first.
    """
    ops: list[tuple[str, str, int]] = []
    for i, activations in enumerate(steps):
        names = [f"step{i}.layer{j}" for j in range(len(activations))]
        ops += [("malloc", name, nbytes) for name, nbytes in zip(names, activations, strict=True)]
        ops.append(("malloc", f"step{i}.kept", keep_bytes))
        ops += [("free", name, 0) for name in reversed(names)]
    return ops


@dataclasses.dataclass(frozen=True)
class Replay:
    ops_done: int  # operations completed before the end or the out-of-memory error
    oom: str | None  # the error message, or None if every operation succeeded
    peak_allocated: int
    peak_reserved: int
    allocator: CachingAllocator  # as it was at the end (or at the error)


def replay(ops: Iterable[tuple[str, str, int]], config: AllocatorConfig) -> Replay:
    """Run the operations on a fresh model allocator and record what it needed."""
    alloc = CachingAllocator(config)
    live: dict[str, Block] = {}
    done = peak_alloc = peak_res = 0
    oom = None
    for op, name, nbytes in ops:
        try:
            if op == "malloc":
                live[name] = alloc.malloc(nbytes)
            else:
                alloc.free(live.pop(name))
        except OutOfMemory as err:
            oom = str(err)
            break
        done += 1
        s = alloc.stats()
        peak_alloc, peak_res = max(peak_alloc, s.allocated), max(peak_res, s.reserved)
    return Replay(done, oom, peak_alloc, peak_res, alloc)


def memory_map(alloc: CachingAllocator) -> list[str]:
    """One line per segment: its blocks in address order (unmapped address space left out)."""
    lines = []
    for i, seg in enumerate(alloc.segments):
        parts = [
            f"{'used' if b.allocated else 'free'} {b.size / MiB:g}" for b in seg.blocks if b.mapped
        ]
        reserved = sum(b.size for b in seg.blocks if b.mapped) / MiB
        lines.append(f"segment {i} ({reserved:g} MiB): " + " | ".join(parts))
    return lines


# --8<-- [end:workload]


# --8<-- [start:gpu]
def replay_on_gpu(ops: Iterable[tuple[str, str, int]], *, capacity: int) -> Replay:
    """The same operations through torch's real caching allocator, on a GPU.

    PYTORCH_CUDA_ALLOC_CONF is read once, when CUDA starts: set it before the process runs.
    set_per_process_memory_fraction caps what the allocator may reserve: the model's capacity.
    """
    import torch  # here, not at the top: the model runs without torch

    if not torch.cuda.is_available():
        raise UsageError("--gpu needs a CUDA GPU: run without --gpu to use the model")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.set_per_process_memory_fraction(min(1.0, capacity / total))
    live: dict[str, torch.Tensor] = {}
    done, oom = 0, None
    try:
        for op, name, nbytes in ops:
            if op == "malloc":
                live[name] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            else:
                del live[name]
            done += 1
    except torch.OutOfMemoryError as err:
        oom = str(err).split("See documentation")[0].strip()
    peak_alloc, peak_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    live.clear()
    torch.cuda.set_per_process_memory_fraction(1.0)
    no_model = CachingAllocator(AllocatorConfig(capacity=capacity))  # its memory_map is empty
    return Replay(done, oom, peak_alloc, peak_res, no_model)


# --8<-- [end:gpu]


# --8<-- [start:main]
SETTINGS = {  # the three values of PYTORCH_CUDA_ALLOC_CONF the page compares
    "(default)": {},
    "max_split_size_mb:64": {"max_split_size": 64 * MiB},
    "expandable_segments:True": {"expandable_segments": True},
}


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity-mib", type=int, default=1024, help="the modelled GPU's memory")
    p.add_argument("--layers", type=int, default=4, help="activations per step")
    p.add_argument("--long-mib", type=int, default=210, help="one activation, long batch")
    p.add_argument("--short-mib", type=int, default=50, help="one activation, short batch")
    p.add_argument("--keep-mib", type=int, default=10, help="kept for the rest of the run")
    p.add_argument("--gpu", action="store_true", help="replay on the real allocator (CUDA)")
    args = p.parse_args(argv)
    sizes = (args.capacity_mib, args.layers, args.long_mib, args.short_mib, args.keep_mib)
    if min(sizes) <= 0:
        raise UsageError("every size and --layers must be positive")
    long_step, short_step = ([mib * MiB] * args.layers for mib in (args.long_mib, args.short_mib))
    ops = training_steps([long_step, short_step, long_step], keep_bytes=args.keep_mib * MiB)
    capacity = args.capacity_mib * MiB
    if args.gpu:  # one setting only: the one this process started with
        label = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(default)") + " [GPU]"
        results = {label: replay_on_gpu(ops, capacity=capacity)}
    else:
        results = {
            label: replay(ops, AllocatorConfig(capacity=capacity, **kwargs))
            for label, kwargs in SETTINGS.items()
        }
    print(
        f"steps: long ({args.layers} x {args.long_mib} MiB), short ({args.layers} x "
        f"{args.short_mib} MiB), long again; {args.keep_mib} MiB kept per step; "
        f"{'GPU capped at' if args.gpu else 'modelled GPU'} {args.capacity_mib} MiB"
    )
    print(f"{'PYTORCH_CUDA_ALLOC_CONF':<26}{'ops':>6}{'peak allocated':>16}{'peak reserved':>15}")
    for label, r in results.items():
        peak_a, peak_r = r.peak_allocated / MiB, r.peak_reserved / MiB
        print(f"{label:<26}{r.ops_done:>3}/{len(ops):<2}{peak_a:>12g} MiB{peak_r:>11g} MiB")
    for label, r in results.items():
        if r.oom is not None:
            print(f"{label}: {r.oom}")
            for line in memory_map(r.allocator):  # none for the real allocator
                print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]

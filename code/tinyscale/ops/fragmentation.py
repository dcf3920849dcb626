# --8<-- [start:workload]
"""GPU memory fragmentation, reproduced on a CPU: a training loop through the allocator model.

Try it:  python -m tinyscale.ops.fragmentation

The model of PyTorch's CUDA caching allocator is tinyscale.ops.allocator. This module turns
a training loop whose batches change length into malloc and free calls, replays them on the
model with each PYTORCH_CUDA_ALLOC_CONF setting, and prints where the memory went. With
--gpu, the same calls go through torch's real allocator.
"""

import argparse
import dataclasses
import os
from collections.abc import Iterable, Sequence

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.memory import MiB
from tinyscale.ops.allocator import AllocatorConfig, Block, CachingAllocator, OutOfMemory


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

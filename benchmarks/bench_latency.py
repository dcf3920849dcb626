"""Many small all-reduces against one big one: the latency term, measured and predicted.

Run:  make bench   (or: python benchmarks/bench_latency.py [--world-size 2])

First the sweep of ``tinyscale.comm.latency`` (4 B to 16 MiB) and its fit t = a + b·S. Then
1 MiB of gradients all-reduced two ways in the same processes, interleaved round by
round: as one all-reduce, and as 256 all-reduces of 4 KiB (what DDP would do with no
buckets and small tensors). The measured ratio is printed next to the one the fit
predicts, (256·a + b·S) / (a + b·S).
"""

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tinyscale.comm.latency import fit_latency, many_small_vs_one, measure, report
from tinyscale.comm.launch import run_on_ranks

# The ranks are spawned processes: they import _split_vs_whole from this file by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

TOTAL_BYTES = 2**20
MESSAGES = 256


def _split_vs_whole(rounds: int) -> dict[str, float]:
    """Seconds to all-reduce 1 MiB whole and as 256 pieces, best round of each."""
    whole = torch.zeros(TOTAL_BYTES // 4)
    pieces = list(whole.split(TOTAL_BYTES // 4 // MESSAGES))
    impls = {
        "one": lambda: dist.all_reduce(whole),
        "many": lambda: [dist.all_reduce(p) for p in pieces],
    }
    times: dict[str, list[float]] = {name: [] for name in impls}
    for fn in impls.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in impls.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


LIMITS = """\
Here: two processes on one machine talk over loopback TCP, so a = tens of microseconds of
system calls and gloo bookkeeping, and b is a memory copy rate, shared with the sender.
On GPUs with NCCL: a is a few microseconds per launch within a node (more across nodes,
where the network's latency adds), b is NVLink's or the NIC's rate, and the ratio of many
small to one big grows, because b shrinks far more than a does."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    points = measure(world_size=args.world_size)
    print("\n".join(report(points, world_size=args.world_size)))
    fit = fit_latency([s for s, _ in points], [t for _, t in points])
    # As the ranks will find it (run_all.py loads this file by path): import it by name.
    split_vs_whole = importlib.import_module(__name__)._split_vs_whole
    per_rank = run_on_ranks(split_vs_whole, args.world_size, 10, timeout_s=60, deadline_s=300)
    one = max(r["one"] for r in per_rank)
    many = max(r["many"] for r in per_rank)
    predicted = many_small_vs_one(fit, total_bytes=TOTAL_BYTES, messages=MESSAGES)
    print()
    print(
        f"1 MiB in 1 all-reduce: {one * 1e3:.2f} ms | in {MESSAGES} of 4 KiB: {many * 1e3:.2f} ms"
    )
    print(f"measured {many / one:.1f}x slower, the fit predicted {predicted:.1f}x")
    print(f"*N = {args.world_size} processes, gloo over loopback TCP, torch {torch.__version__}.*")


if __name__ == "__main__":
    main()

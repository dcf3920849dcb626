"""All-reduce bus bandwidth: our send/recv ring against gloo's dist.all_reduce, 4 KiB to 64 MiB.

Run:  make bench   (or: python benchmarks/bench_collectives.py [--world-size 2] [--sizes 4096,1048576])

The numbers nccl-tests prints (its doc/PERFORMANCE.md): for a tensor of S bytes that
takes t seconds to all-reduce, the algorithm bandwidth is algbw = S / t and the bus
bandwidth is busbw = algbw · 2 (N − 1) / N — the rate at which each rank pushes bytes
into its link, since a ring all-reduce sends 2 (N − 1) / N · S per rank. busbw can be
compared across world sizes and against the link's speed; algbw cannot.

Both implementations run in the same processes, interleaved round by round, so noise
from the machine hits both alike. Ours runs with ``check=False``: the shape check adds
N − 1 tiny messages that belong to no algorithm, and gloo checks nothing either.
"""

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.collectives import ring_all_reduce
from tinyscale.comm.launch import run_on_ranks

# The ranks are spawned processes: they import _time_both from this file by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZES = [4096 * 4**k for k in range(8)]  # bytes: 4 KiB ... 64 MiB, float32 tensors
TARGET_BYTES = 256 * 2**20  # each timed block all-reduces about this much in total ...
MAX_ITERS = 200  # ... in at most this many calls (small sizes) and at least min_iters


def _time_both(sizes: list[int], rounds: int, min_iters: int) -> list[dict[str, float]]:
    """On every rank: seconds per all-reduce of each size, ours and gloo's, best round.

    The best of the rounds, not the median: on a shared machine most disturbances only
    ever add time, so the fastest round is the least disturbed one.
    """
    rows = []
    for size in sizes:
        x = torch.zeros(size // 4)  # zeros stay zeros: no overflow after many sums
        iters = max(min_iters, min(MAX_ITERS, TARGET_BYTES // size))
        impls = {
            "ours": lambda x=x: ring_all_reduce(x, check=False),
            "gloo": lambda x=x: dist.all_reduce(x),
        }
        for fn in impls.values():
            fn()  # warm-up: first-use allocations and connections
        times: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(rounds):
            for name, fn in impls.items():
                dist.barrier()  # start together: an all-reduce waits for the slowest rank
                start = time.perf_counter()
                for _ in range(iters):
                    fn()
                times[name].append((time.perf_counter() - start) / iters)
        rows.append({"bytes": size, **{f"{n}_s": min(t) for n, t in times.items()}})
    return rows


def measure(
    *, world_size: int = 2, sizes: list[int] = SIZES, rounds: int = 5, min_iters: int = 3
) -> list[dict[str, Any]]:
    """One row per size: seconds, algbw and busbw (bytes/s) of both, and ours / gloo."""
    # As the ranks will find it: loaded from a path (run_all.py does), this file is not
    # in sys.modules, and pickle sends functions by module name; import it by that name.
    time_both = importlib.import_module(__name__)._time_both
    per_rank = run_on_ranks(
        time_both, world_size, sizes, rounds, min_iters, timeout_s=120, deadline_s=600
    )
    factor = 2 * (world_size - 1) / world_size  # bytes each rank sends per byte reduced
    rows = []
    for i, size in enumerate(sizes):
        row: dict[str, Any] = {"bytes": size, "world_size": world_size}
        for impl in ("ours", "gloo"):
            seconds = max(ranks[i][f"{impl}_s"] for ranks in per_rank)  # the slowest rank
            row[f"{impl}_s"] = seconds
            row[f"{impl}_algbw"] = size / seconds
            row[f"{impl}_busbw"] = size / seconds * factor
        row["ratio"] = row["ours_busbw"] / row["gloo_busbw"]
        rows.append(row)
    return rows


def human(size: int) -> str:
    return f"{size // 2**20} MiB" if size >= 2**20 else f"{size // 2**10} KiB"


def format_table(rows: list[dict[str, Any]], *, world_size: int) -> str:
    """A Markdown table: readable in a terminal, and included as is on the course page."""
    lines = [
        "| size | ours: time (µs) | ours: busbw (GB/s) | gloo: time (µs) "
        "| gloo: busbw (GB/s) | busbw ours / gloo |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {human(row['bytes'])} | {row['ours_s'] * 1e6:,.0f} | {row['ours_busbw'] / 1e9:.3f} "
            f"| {row['gloo_s'] * 1e6:,.0f} | {row['gloo_busbw'] / 1e9:.3f} | {row['ratio']:.2f} |"
        )
    lines.append("")
    lines.append(
        f"*N = {world_size} processes on one machine, gloo over loopback TCP, float32, "
        f"1 thread each; busbw = S / t · 2(N−1)/N; torch {torch.__version__}.*"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--sizes", default=None, help="bytes, comma-separated (default: 4 KiB-64 MiB)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    rows = measure(world_size=args.world_size, sizes=sizes, rounds=args.rounds)
    print(format_table(rows, world_size=args.world_size))


if __name__ == "__main__":
    main()

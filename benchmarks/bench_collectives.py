"""All-reduce bus bandwidth: our send/recv rings (plain, pipelined) against gloo's, 4 KiB-64 MiB.

Run:  make bench   (or: python benchmarks/bench_collectives.py [--world-size 2] [--sizes 4096,1048576])

The numbers nccl-tests prints (its doc/PERFORMANCE.md): for a tensor of S bytes that
takes t seconds to all-reduce, the algorithm bandwidth is algbw = S / t and the bus
bandwidth is busbw = algbw · 2 (N − 1) / N — the rate at which each rank pushes bytes
into its link, since a ring all-reduce sends 2 (N − 1) / N · S per rank. busbw can be
compared across world sizes and against the link's speed; algbw cannot.

All implementations run in the same processes, interleaved round by round, so noise
from the machine hits them alike; a round's time is its slowest rank's, and each column
is the median over rounds, with the interquartile range of the per-round ratio beside it.
Ours run with ``check=False``: the shape check adds N − 1 tiny messages that belong to no
algorithm, and gloo checks nothing either. ``sweep`` times the pipelined ring at several
segment sizes against gloo, which is how its default segment size was chosen.
"""

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.collectives import ring_all_reduce
from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.pipelined_ring import SEGMENT_BYTES, pipelined_ring_all_reduce

# The ranks are spawned processes: they import _time_sizes from this file by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZES = [4096 * 4**k for k in range(8)]  # bytes: 4 KiB ... 64 MiB, float32 tensors
IMPLS = ("ours", "pipelined", "gloo")  # the table's columns, in this order
TARGET_BYTES = 64 * 2**20  # each timed block all-reduces about this much in total ...
MAX_ITERS = 100  # ... in at most this many calls (small sizes) and at least min_iters
ROUNDS = 15
SWEEP_SIZES = [4 * 2**20, 16 * 2**20, 64 * 2**20]
SWEEP_SEGMENTS = [2**16, 2**18, 2**20, 2**22, 2**24, 2**25]  # 64 KiB ... 32 MiB
SWEEP_ROUNDS = 7

LIMITS = """\
Here: two processes and gloo's I/O threads share two CPU cores, so the add the pipeline
overlaps with a transfer competes for the same cores as the kernel copies that make the
transfer; the best segment balances Python's cost per message (tens of microseconds)
against the add left exposed at the end. On GPUs with NCCL the same overlap is built in:
NCCL cuts each chunk into slices (NCCL_BUFFSIZE, over several channels), its kernels add
while NVLink moves the next slice, and busbw nears the link's rate from a few MiB on."""


def _implementations(x: torch.Tensor, segments: list[int]) -> dict[str, Callable[[], Any]]:
    """The calls to time on this rank's tensor: gloo's last, the pipelined ones by segment."""
    if not segments:  # the main table: one of each
        return {
            "ours": lambda: ring_all_reduce(x, check=False),
            "pipelined": lambda: pipelined_ring_all_reduce(x, check=False),
            "gloo": lambda: dist.all_reduce(x),
        }
    impls: dict[str, Callable[[], Any]] = {
        f"seg{s}": (lambda s=s: pipelined_ring_all_reduce(x, segment_bytes=s, check=False))
        for s in segments
    }
    impls["gloo"] = lambda: dist.all_reduce(x)
    return impls


def _time_sizes(
    sizes: list[int], rounds: int, min_iters: int, segments: list[int]
) -> list[dict[str, list[float]]]:
    """On every rank: per size, seconds per all-reduce of each implementation, per round."""
    out = []
    for size in sizes:
        x = torch.zeros(size // 4)  # zeros stay zeros: no overflow after many sums
        iters = max(min_iters, min(MAX_ITERS, TARGET_BYTES // size))
        impls = _implementations(x, segments)
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
        out.append(times)
    return out


def _run(sizes: list[int], rounds: int, min_iters: int, segments: list[int], world_size: int):
    """Per size, per implementation, per round: the slowest rank's seconds."""
    # As the ranks will find it: loaded from a path (run_all.py does), this file is not
    # in sys.modules, and pickle sends functions by module name; import it by that name.
    time_sizes = importlib.import_module(__name__)._time_sizes
    per_rank = run_on_ranks(
        time_sizes, world_size, sizes, rounds, min_iters, segments, timeout_s=120, deadline_s=900
    )
    return [
        {name: [max(r) for r in zip(*(ranks[i][name] for ranks in per_rank), strict=True)]
         for name in per_rank[0][i]}
        for i in range(len(sizes))
    ]  # fmt: skip


def _spread(ratios: list[float]) -> list[float]:
    """The interquartile range of the per-round ratios (both ends equal for one round)."""
    if len(ratios) < 2:
        return [ratios[0], ratios[0]]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return [q1, q3]


def _columns(row: dict[str, Any], name: str, rounds: list[float], factor: float) -> None:
    seconds = statistics.median(rounds)
    row[f"{name}_s"] = seconds
    row[f"{name}_algbw"] = row["bytes"] / seconds
    row[f"{name}_busbw"] = row["bytes"] / seconds * factor


def measure(
    *, world_size: int = 2, sizes: list[int] = SIZES, rounds: int = ROUNDS, min_iters: int = 2
) -> list[dict[str, Any]]:
    """One row per size: seconds, algbw and busbw (bytes/s) of each, and ratios to gloo.

    ``ratio`` is ours / gloo and ``pipelined_ratio`` pipelined / gloo, both of the median
    bus bandwidths; ``*_iqr`` is the interquartile range of that ratio round by round.
    """
    factor = 2 * (world_size - 1) / world_size  # bytes each rank sends per byte reduced
    rows = []
    for size, times in zip(sizes, _run(sizes, rounds, min_iters, [], world_size), strict=True):
        row: dict[str, Any] = {"bytes": size, "world_size": world_size, "rounds": rounds}
        row["segment_bytes"] = SEGMENT_BYTES
        for name in IMPLS:
            _columns(row, name, times[name], factor)
        for name, key in (("ours", "ratio"), ("pipelined", "pipelined_ratio")):
            row[key] = row[f"{name}_busbw"] / row["gloo_busbw"]
            per_round = [g / t for g, t in zip(times["gloo"], times[name], strict=True)]
            row[f"{key}_iqr"] = _spread(per_round)
        rows.append(row)
    return rows


def sweep(
    *,
    world_size: int = 2,
    sizes: list[int] = SWEEP_SIZES,
    segments: list[int] = SWEEP_SEGMENTS,
    rounds: int = SWEEP_ROUNDS,
    min_iters: int = 2,
) -> list[dict[str, Any]]:
    """The pipelined ring at each segment size against gloo: one row per (size, segment)."""
    factor = 2 * (world_size - 1) / world_size
    rows = []
    for size, times in zip(
        sizes, _run(sizes, rounds, min_iters, segments, world_size), strict=True
    ):
        gloo = {"bytes": size}
        _columns(gloo, "gloo", times["gloo"], factor)
        for segment in segments:
            row: dict[str, Any] = {"bytes": size, "world_size": world_size, "rounds": rounds}
            row["segment_bytes"] = segment
            _columns(row, "pipelined", times[f"seg{segment}"], factor)
            row |= {k: v for k, v in gloo.items() if k.startswith("gloo")}
            row["pipelined_ratio"] = row["pipelined_busbw"] / row["gloo_busbw"]
            per_round = [g / t for g, t in zip(times["gloo"], times[f"seg{segment}"], strict=True)]
            row["pipelined_ratio_iqr"] = _spread(per_round)
            rows.append(row)
    return rows


def human(size: int) -> str:
    return f"{size // 2**20} MiB" if size >= 2**20 else f"{size // 2**10} KiB"


def _ratio(row: dict[str, Any], key: str) -> str:
    low, high = row[f"{key}_iqr"]
    return f"{row[key]:.2f} ({low:.2f}–{high:.2f})"


def _caption(world_size: int, rounds: int) -> str:
    return (
        f"*N = {world_size} processes on one machine, gloo over loopback TCP, float32, "
        f"1 thread each; busbw = S / t · 2(N−1)/N; median of {rounds} interleaved rounds, "
        f"ratio (interquartile range over rounds); torch {torch.__version__}.*"
    )


def format_table(rows: list[dict[str, Any]], *, world_size: int) -> str:
    """A Markdown table: readable in a terminal, and included as is on the course page."""
    segment = human(rows[0]["segment_bytes"])
    lines = [
        "| size | ours: time (µs) | ours: busbw (GB/s) "
        f"| pipelined ({segment} segments): time (µs) | pipelined: busbw (GB/s) "
        "| gloo: time (µs) | gloo: busbw (GB/s) | busbw ours / gloo | busbw pipelined / gloo |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [human(row["bytes"])]
        for name in IMPLS:
            cells += [f"{row[f'{name}_s'] * 1e6:,.0f}", f"{row[f'{name}_busbw'] / 1e9:.3f}"]
        cells += [_ratio(row, "ratio"), _ratio(row, "pipelined_ratio")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", _caption(world_size, rows[0]["rounds"])])


def format_sweep(rows: list[dict[str, Any]], *, world_size: int) -> str:
    """The segment-size sweep as a Markdown table, one line per (size, segment)."""
    lines = [
        "| size | segment | segments per chunk | pipelined: time (µs) "
        "| pipelined: busbw (GB/s) | gloo: busbw (GB/s) | busbw pipelined / gloo |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        per_chunk = max(1, -(-row["bytes"] // world_size // row["segment_bytes"]))
        lines.append(
            f"| {human(row['bytes'])} | {human(row['segment_bytes'])} | {per_chunk} "
            f"| {row['pipelined_s'] * 1e6:,.0f} | {row['pipelined_busbw'] / 1e9:.3f} "
            f"| {row['gloo_busbw'] / 1e9:.3f} | {_ratio(row, 'pipelined_ratio')} |"
        )
    return "\n".join([*lines, "", _caption(world_size, rows[0]["rounds"])])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--sizes", default=None, help="bytes, comma-separated (default: 4 KiB-64 MiB)"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--sweep-rounds", type=int, default=SWEEP_ROUNDS, help="0: no sweep")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    rows = measure(world_size=args.world_size, sizes=sizes, rounds=args.rounds)
    print(format_table(rows, world_size=args.world_size))
    if args.sweep_rounds:
        print()
        rows = sweep(world_size=args.world_size, rounds=args.sweep_rounds)
        print(format_sweep(rows, world_size=args.world_size))


if __name__ == "__main__":
    main()

"""All-reduce bus bandwidth: our send/recv all-reduces against gloo's, 4 KiB-64 MiB.

Run:  make bench   (or: python benchmarks/bench_collectives.py [--world-size 2] [--sizes 4096,1048576])

Ours: the plain ring, the pipelined ring, recursive doubling, and the course's
``all_reduce``, which picks one of the last two by the alpha-beta model's crossover.

The numbers nccl-tests prints (its doc/PERFORMANCE.md): for a tensor of S bytes that
takes t seconds to all-reduce, the algorithm bandwidth is algbw = S / t and the bus
bandwidth is busbw = algbw · 2 (N − 1) / N — the rate at which each rank pushes bytes
into its link, since a ring all-reduce sends 2 (N − 1) / N · S per rank. busbw can be
compared across world sizes and against the link's speed; algbw cannot.

All implementations run in the same processes, interleaved round by round (and every
round times every size), so noise from the machine hits them alike; a round's time is
its slowest rank's, and each column is the median over rounds; a ratio to gloo is the
median of the rounds' ratios, with their interquartile range beside it. The order of
the implementations turns by one each round, so none always runs first or last.
Ours run with ``check=False``: the shape check adds N − 1 tiny messages that belong to no
algorithm, and gloo checks nothing either. ``sweep`` times the pipelined ring at several
segment sizes against gloo, which is how its default segment size was chosen.
``measure_link`` times one swap of S bytes between two ranks, the step of both the ring
and recursive doubling, and fits t = alpha + S / B: the link constants of the model.
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

from tinyscale.comm.choose_allreduce import all_reduce, choose
from tinyscale.comm.collectives import ring_all_reduce
from tinyscale.comm.comm_model import (
    doubling_crossover_bytes,
    recursive_doubling_bytes,
    recursive_doubling_steps,
    ring_allreduce_bytes,
    ring_allreduce_steps,
)
from tinyscale.comm.latency import fit_latency
from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.pipelined_ring import SEGMENT_BYTES, pipelined_ring_all_reduce
from tinyscale.comm.recursive_doubling import _exchange, recursive_doubling_all_reduce

# The ranks are spawned processes: they import _time_sizes from this file by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZES = [4096 * 4**k for k in range(8)]  # bytes: 4 KiB ... 64 MiB, float32 tensors
IMPLS = ("ring", "pipelined", "doubling", "all_reduce", "gloo")  # the table's, in this order
TARGET_BYTES = 64 * 2**20  # each timed block all-reduces about this much in total ...
MAX_ITERS = 100  # ... in at most this many calls (small sizes) and at least min_iters
ROUNDS = 15
SWEEP_SIZES = [4 * 2**20, 16 * 2**20, 64 * 2**20]
SWEEP_SEGMENTS = [2**16, 2**18, 2**20, 2**22, 2**24, 2**25]  # 64 KiB ... 32 MiB
SWEEP_ROUNDS = 7
TARGET = 0.9  # all_reduce's bus bandwidth over gloo's, the least the course aims for
LINK_SIZES = [4096 * 4**k for k in range(7)]  # bytes: 4 KiB ... 16 MiB
LINK_ROUNDS = 15
WARMUP_SWAPS = 20

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
            "ring": lambda: ring_all_reduce(x, check=False),
            "pipelined": lambda: pipelined_ring_all_reduce(x, check=False),
            "doubling": lambda: recursive_doubling_all_reduce(x, check=False),
            "all_reduce": lambda: all_reduce(x, check=False),
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
    """On every rank: per size, seconds per all-reduce of each implementation, per round.

    Rounds are the outer loop: each round times every size, so a slow spell of the
    machine that lasts seconds spoils a few rounds of every size, not every round of one.
    """
    tensors = [torch.zeros(size // 4) for size in sizes]  # zeros: no overflow after sums
    impls = [_implementations(x, segments) for x in tensors]
    for by_name in impls:
        for fn in by_name.values():
            fn()  # warm-up: first-use allocations and connections
    out: list[dict[str, list[float]]] = [{name: [] for name in by_name} for by_name in impls]
    for r in range(rounds):
        for size, by_name, times in zip(sizes, impls, out, strict=True):
            iters = max(min_iters, min(MAX_ITERS, TARGET_BYTES // size))
            names = list(by_name)
            for name in names[r % len(names) :] + names[: r % len(names)]:  # turn the order
                dist.barrier()  # start together: an all-reduce waits for the slowest rank
                start = time.perf_counter()
                for _ in range(iters):
                    by_name[name]()
                times[name].append((time.perf_counter() - start) / iters)
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


def _ratios(row: dict[str, Any], key: str, gloo: list[float], ours: list[float]) -> None:
    """Round by round, gloo's time over ours (= our busbw over gloo's): the median, and the
    interquartile range. A round's pair ran back to back, so a slow spell of the machine
    that lasts longer than a round cancels out of it."""
    per_round = [g / t for g, t in zip(gloo, ours, strict=True)]
    row[key], row[f"{key}_iqr"] = statistics.median(per_round), _spread(per_round)


def _columns(row: dict[str, Any], name: str, rounds: list[float], factor: float) -> None:
    seconds = statistics.median(rounds)
    row[f"{name}_s"] = seconds
    row[f"{name}_algbw"] = row["bytes"] / seconds
    row[f"{name}_busbw"] = row["bytes"] / seconds * factor


def measure(
    *, world_size: int = 2, sizes: list[int] = SIZES, rounds: int = ROUNDS, min_iters: int = 2
) -> list[dict[str, Any]]:
    """One row per size: seconds, algbw and busbw (bytes/s) of each, and ratios to gloo.

    ``<name>_ratio`` is that implementation's bus bandwidth over gloo's, the median of the
    rounds' ratios, and ``<name>_ratio_iqr`` their interquartile range; ``picks`` is what
    ``all_reduce`` chose for the size.
    """
    factor = 2 * (world_size - 1) / world_size  # bytes each rank sends per byte reduced
    rows = []
    for size, times in zip(sizes, _run(sizes, rounds, min_iters, [], world_size), strict=True):
        row: dict[str, Any] = {"bytes": size, "world_size": world_size, "rounds": rounds}
        row["segment_bytes"] = SEGMENT_BYTES
        row["picks"] = choose(size, world_size)
        for name in IMPLS:
            _columns(row, name, times[name], factor)
        for name in IMPLS[:-1]:
            _ratios(row, f"{name}_ratio", times["gloo"], times[name])
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
            _ratios(row, "pipelined_ratio", times["gloo"], times[f"seg{segment}"])
            rows.append(row)
    return rows


def _time_swaps(sizes: list[int], rounds: int) -> list[list[float]]:
    """On each of two ranks: per size, seconds per swap of that many bytes, per round
    (rounds the outer loop, as in ``_time_sizes``)."""
    buffers = [(torch.zeros(size // 4), torch.zeros(size // 4)) for size in sizes]
    peer = 1 - dist.get_rank()
    for send, recv in buffers:
        for _ in range(WARMUP_SWAPS):  # first-use buffers, and TCP's start on a fresh pair
            _exchange(send, recv, peer)
    out: list[list[float]] = [[] for _ in sizes]
    for _ in range(rounds):
        for size, (send, recv), times in zip(sizes, buffers, out, strict=True):
            iters = max(2, min(MAX_ITERS, TARGET_BYTES // 4 // size))
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                _exchange(send, recv, peer)
            times.append((time.perf_counter() - start) / iters)
    return out


def measure_link(*, sizes: list[int] = LINK_SIZES, rounds: int = LINK_ROUNDS) -> dict[str, Any]:
    """One swap of S bytes between two ranks, median over rounds (the slower rank's), and
    the fit t = alpha + S / B: the link constants of the alpha-beta model."""
    time_swaps = importlib.import_module(__name__)._time_swaps
    per_rank = run_on_ranks(time_swaps, 2, sizes, rounds, timeout_s=120, deadline_s=600)
    seconds = [statistics.median(map(max, zip(*rank_rows, strict=True)))
               for rank_rows in zip(*per_rank, strict=True)]  # fmt: skip
    fit = fit_latency(sizes, seconds)
    return {
        "bytes": sizes,
        "seconds": seconds,
        "rounds": rounds,
        "alpha_s": fit.latency_s,
        "bandwidth_bps": 1 / fit.seconds_per_byte,
        "worst_error": max(
            abs(fit.predict(s) / t - 1) for s, t in zip(sizes, seconds, strict=True)
        ),
    }


def format_link(
    link: dict[str, Any], *, world_sizes: tuple[int, ...] = (2, 3, 4, 8, 16, 64)
) -> str:
    """The swap's times against the fit, then each N's crossover from the fitted alpha and B."""
    alpha, bandwidth = link["alpha_s"], link["bandwidth_bps"]
    lines = ["| size | one swap: measured (µs) | α + S / B (µs) |", "|---:|---:|---:|"]
    for size, seconds in zip(link["bytes"], link["seconds"], strict=True):
        lines.append(
            f"| {human(size)} | {seconds * 1e6:,.0f} | {(alpha + size / bandwidth) * 1e6:,.0f} |"
        )
    lines += [
        "",
        f"*Fit: α = {alpha * 1e6:.0f} µs per message, B = {bandwidth / 1e9:.2f} GB/s each way, "
        f"α · B = {alpha * bandwidth / 1e3:.0f} kB (worst relative error "
        f"{link['worst_error']:.0%}); median of {link['rounds']} rounds, two processes.*",
        "",
        "| N | ring: steps | ring: bytes / S | doubling: steps | doubling: bytes / S "
        "| crossover S* | all_reduce picks doubling for |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in world_sizes:
        crossover = doubling_crossover_bytes(world_size=n, alpha_s=alpha, bandwidth_bps=bandwidth)
        shown = "∞" if crossover == float("inf") else f"{crossover / 1e6:.2f} MB"
        below = "every size" if crossover == float("inf") else f"S < {shown}"
        lines.append(
            f"| {n} | {ring_allreduce_steps(n)} | {ring_allreduce_bytes(size_bytes=1, world_size=n):.2f} "
            f"| {recursive_doubling_steps(n)} | {recursive_doubling_bytes(size_bytes=1, world_size=n):.0f} "
            f"| {shown} | {below} |"
        )
    return "\n".join(lines)


def human(size: int) -> str:
    return f"{size // 2**20} MiB" if size >= 2**20 else f"{size // 2**10} KiB"


def _ratio(row: dict[str, Any], key: str) -> str:
    low, high = row[f"{key}_iqr"]
    return f"{row[key]:.2f} ({low:.2f}–{high:.2f})"


def _caption(world_size: int, rounds: int) -> str:
    return (
        f"*N = {world_size} processes on one machine, gloo over loopback TCP, float32, "
        f"1 thread each; busbw = S / t · 2(N−1)/N; median of {rounds} interleaved rounds, "
        f"ratio: median of the rounds' ratios (their interquartile range); "
        f"torch {torch.__version__}.*"
    )


def format_table(rows: list[dict[str, Any]], *, world_size: int) -> str:
    """A Markdown table: readable in a terminal, and included as is on the course page."""
    segment = human(rows[0]["segment_bytes"])
    lines = [
        "| size | ring: time (µs) | pipelined: time (µs) | doubling: time (µs) "
        "| gloo: time (µs) | gloo: busbw (GB/s) | busbw ring / gloo "
        f"| busbw pipelined ({segment} segments) / gloo | busbw doubling / gloo "
        "| all_reduce picks | busbw all_reduce / gloo |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        cells = [human(row["bytes"])]
        cells += [f"{row[f'{name}_s'] * 1e6:,.0f}" for name in ("ring", "pipelined", "doubling")]
        cells += [f"{row['gloo_s'] * 1e6:,.0f}", f"{row['gloo_busbw'] / 1e9:.3f}"]
        cells += [_ratio(row, f"{name}_ratio") for name in ("ring", "pipelined", "doubling")]
        cells += [row["picks"], _ratio(row, "all_reduce_ratio")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", _caption(world_size, rows[0]["rounds"]), "", verdict(rows)])


def verdict(rows: list[dict[str, Any]]) -> str:
    """One line: did all_reduce reach TARGET x gloo's bus bandwidth at every size?"""
    below = [row for row in rows if round(row["all_reduce_ratio"], 2) < TARGET]  # as shown
    lowest = min(rows, key=lambda row: row["all_reduce_ratio"])
    sizes = f"from {human(rows[0]['bytes'])} to {human(rows[-1]['bytes'])}"
    if not below:
        return (
            f"**all_reduce / gloo ≥ {TARGET:.2f} at every size {sizes}**; the lowest, "
            f"{_ratio(lowest, 'all_reduce_ratio')} at {human(lowest['bytes'])}."
        )
    missed = ", ".join(
        f"{_ratio(row, 'all_reduce_ratio')} at {human(row['bytes'])}" for row in below
    )
    return (
        f"**all_reduce / gloo below {TARGET:.2f}** at {len(below)} of the sizes {sizes}: {missed}."
    )


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
    parser.add_argument("--link-rounds", type=int, default=LINK_ROUNDS, help="0: no link fit")
    parser.add_argument("--sweep-rounds", type=int, default=SWEEP_ROUNDS, help="0: no sweep")
    args = parser.parse_args(argv)
    if args.link_rounds:
        print(format_link(measure_link(rounds=args.link_rounds)))
        print()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    rows = measure(world_size=args.world_size, sizes=sizes, rounds=args.rounds)
    print(format_table(rows, world_size=args.world_size))
    if args.sweep_rounds:
        print()
        rows = sweep(world_size=args.world_size, rounds=args.sweep_rounds)
        print(format_sweep(rows, world_size=args.world_size))


if __name__ == "__main__":
    main()

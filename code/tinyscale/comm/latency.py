# --8<-- [start:header]
"""Latency or bandwidth? Time all-reduces from 4 bytes to 16 MiB and fit t(S) = a + b·S.

Launch:  python -m tinyscale.comm.latency --world-size 2

``a`` is the fixed cost of one all-reduce, paid even for 4 bytes: the latency term. ``b``
is the cost per byte: the bandwidth term. For a ring all-reduce on N ranks the α–β model
of ``tinyscale.comm.comm_model`` says t = 2(N−1)·α + 2(N−1)/N · S / B, so the fit gives the
per-step latency α = a / (2(N−1)) and the link bandwidth B = 2(N−1)/N / b. Below the
size S½ = a / b the fixed cost dominates: many small all-reduces cost far more than one
big one of the same total size — which is why DDP packs gradients into buckets.
"""

import dataclasses
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

# --8<-- [end:header]


# --8<-- [start:fit]
@dataclasses.dataclass(frozen=True, kw_only=True)
class LatencyFit:
    """t(S) = latency_s + seconds_per_byte · S, for one collective of S bytes."""

    latency_s: float  # a: what an all-reduce costs however small it is
    seconds_per_byte: float  # b

    def predict(self, size_bytes: float) -> float:
        return self.latency_s + self.seconds_per_byte * size_bytes

    @property
    def half_size_bytes(self) -> float:
        """S½ = a / b: the size at which latency and bandwidth cost the same."""
        return self.latency_s / self.seconds_per_byte

    def ring_alpha_beta(self, world_size: int) -> tuple[float, float]:
        """(α seconds per step, B bytes/s) of a ring all-reduce that would take this time."""
        steps = 2 * (world_size - 1)
        return self.latency_s / steps, steps / world_size / self.seconds_per_byte


def fit_latency(sizes_bytes: Sequence[float], seconds: Sequence[float]) -> LatencyFit:
    """Least squares on *relative* errors: minimise Σ ((a + b·S − t) / t)².

    Sizes span seven decades; plain least squares would let the largest sizes decide a
    and fit the small ones badly. Weighting each point by 1/t² makes every size count.
    Closed form: the 2×2 weighted normal equations.
    """
    if len(sizes_bytes) != len(seconds) or len(sizes_bytes) < 2:
        raise UsageError("need at least two (size, time) pairs of equal length to fit a line")
    if min(seconds) <= 0:
        raise UsageError("every time must be positive")
    w = [1 / t**2 for t in seconds]
    sw = sum(w)
    sx = sum(wi * s for wi, s in zip(w, sizes_bytes, strict=True))
    sy = sum(wi * t for wi, t in zip(w, seconds, strict=True))
    sxx = sum(wi * s * s for wi, s in zip(w, sizes_bytes, strict=True))
    sxy = sum(wi * s * t for wi, s, t in zip(w, sizes_bytes, seconds, strict=True))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise UsageError("all sizes are equal: time at least two different sizes")
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    return LatencyFit(latency_s=a, seconds_per_byte=b)


def many_small_vs_one(fit: LatencyFit, *, total_bytes: float, messages: int) -> float:
    """Predicted slowdown of sending total_bytes as `messages` all-reduces instead of one."""
    return (messages * fit.latency_s + fit.seconds_per_byte * total_bytes) / fit.predict(
        total_bytes
    )


# --8<-- [end:fit]


# --8<-- [start:measure]
SIZES = [4 * 4**k for k in range(12)]  # bytes: 4 B, 16 B, ... 16 MiB of float32


def time_allreduce(sizes: Sequence[int], budget_s: float) -> list[float]:
    """On every rank: seconds per all-reduce of each size, the best of 10 timed blocks."""
    best = []
    for size in sizes:
        x = torch.zeros(max(1, size // 4))  # zeros stay zeros: no overflow after many sums
        dist.all_reduce(x)  # warm-up: first-use buffers and connections
        start = time.perf_counter()
        dist.all_reduce(x)
        guess = max(1, min(100, int(budget_s / 10 / max(time.perf_counter() - start, 1e-6))))
        # Every rank must run the same number of all-reduces, or they deadlock: agree on one
        # (each rank's own guess differs, and a count that depends on local data is a hang).
        iters = torch.tensor([guess])
        dist.all_reduce(iters, op=dist.ReduceOp.MIN)
        iters = int(iters.item())
        rounds = []
        for _ in range(10):
            dist.barrier()  # start together: an all-reduce waits for the slowest rank
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            rounds.append((time.perf_counter() - start) / iters)
        best.append(min(rounds))  # on a shared machine noise only ever adds time
    return best


def measure(
    *, world_size: int = 2, sizes: Sequence[int] = SIZES, budget_s: float = 0.3
) -> list[tuple[int, float]]:
    """(bytes, seconds) per size; a size takes as long as its slowest rank."""
    per_rank = run_on_ranks(
        time_allreduce, world_size, list(sizes), budget_s, timeout_s=60, deadline_s=300
    )
    return [(s, max(r[i] for r in per_rank)) for i, s in enumerate(sizes)]


# --8<-- [end:measure]


# --8<-- [start:report]
def human(size: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.3g} B"


def report(points: Sequence[tuple[int, float]], *, world_size: int) -> list[str]:
    fit = fit_latency([s for s, _ in points], [t for _, t in points])
    alpha, bandwidth = fit.ring_alpha_beta(world_size)
    lines = ["| size | measured (µs) | a + b·S (µs) | regime |", "|---:|---:|---:|---|"]
    for size, seconds in points:
        regime = "latency-bound" if size < fit.half_size_bytes else "bandwidth-bound"
        lines.append(
            f"| {human(size)} | {seconds * 1e6:,.1f} | {fit.predict(size) * 1e6:,.1f} | {regime} |"
        )
    worst = max(abs(fit.predict(s) / t - 1) for s, t in points)
    lines += [
        "",
        f"fit: a = {fit.latency_s * 1e6:.1f} µs, b = {fit.seconds_per_byte * 1e9:.3f} ns/byte "
        f"(1/b = {1 / fit.seconds_per_byte / 1e9:.2f} GB/s), worst relative error {worst:.0%}",
        f"S½ = a / b = {human(fit.half_size_bytes)}: below it the fixed cost dominates",
        f"ring model, N = {world_size}: α = a / {2 * (world_size - 1)} = {alpha * 1e6:.1f} µs "
        f"per step, B = {bandwidth / 1e9:.2f} GB/s",
        f"1 MiB as 256 all-reduces of 4 KiB instead of 1: predicted "
        f"{many_small_vs_one(fit, total_bytes=2**20, messages=256):.1f}x slower",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    if not 2 <= args.world_size <= 8:
        raise UsageError(f"--world-size {args.world_size}: use 2 to 8 (one machine)")
    for line in report(measure(world_size=args.world_size), world_size=args.world_size):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:report]

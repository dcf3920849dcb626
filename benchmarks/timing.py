"""The one timing loop of the multi-process benchmarks: interleaved rounds, the slowest rank.

Not a benchmark itself (run_all.py runs bench_*.py only). Each round runs every variant
in turn, so a disturbance of the machine hits them alike; each variant's time is the
slowest rank's, because every step of data parallelism waits for the slowest rank.
"""

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist


def rates_by_round(
    steps: Mapping[str, Callable[[], object]], *, rounds: int, steps_per_round: int,
    warmup: int, tokens_per_step: int,
) -> dict[str, list[float]]:  # fmt: skip
    """On every rank: tokens/s of every variant in every round (take the median)."""
    for step in steps.values():
        for _ in range(warmup):  # first-use allocations, connections, DDP's bucket rebuild
            step()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            dist.barrier()  # start together
            t0 = time.perf_counter()
            for _ in range(steps_per_round):
                step()
            elapsed = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            rates[name].append(tokens_per_step * steps_per_round / elapsed.item())
    return rates

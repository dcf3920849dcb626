"""The one timing loop of the multi-process benchmarks: interleaved rounds, the slowest rank.

Not a benchmark itself (run_all.py runs bench_*.py only). Each round runs every variant
in turn, so a disturbance of the machine hits them alike; each variant's time is the
slowest rank's, because every step of data parallelism waits for the slowest rank.
"""

import resource
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist


def cpu_seconds() -> float:
    """CPU seconds this process has used so far: every thread (Python, gloo's I/O threads),
    in user mode and in the kernel (the loopback copies of its sends and receives)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rates_by_round(
    steps: Mapping[str, Callable[[], object]], *, rounds: int, steps_per_round: int,
    warmup: int, tokens_per_step: int, cpu_s: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:  # fmt: skip
    """On every rank: tokens/s of every variant in every round (take the median).

    ``cpu_s``, when given, receives each variant's CPU seconds per step in every round, all
    ranks together: on a machine with C cores no step can take less than that / C.
    """
    for step in steps.values():
        for _ in range(warmup):  # first-use allocations, connections, DDP's bucket rebuild
            step()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            dist.barrier()  # start together
            t0, c0 = time.perf_counter(), cpu_seconds()
            for _ in range(steps_per_round):
                step()
            elapsed = torch.tensor(time.perf_counter() - t0)
            used = torch.tensor(cpu_seconds() - c0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            rates[name].append(tokens_per_step * steps_per_round / elapsed.item())
            if cpu_s is not None:
                dist.all_reduce(used)  # every rank's CPU time, added up
                cpu_s.setdefault(name, []).append(used.item() / steps_per_round)
    return rates

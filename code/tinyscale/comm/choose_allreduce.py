# --8<-- [start:header]
"""The course's all-reduce: recursive doubling below the α–β model's crossover, the ring above.

    python -c "from tinyscale.comm.choose_allreduce import demo; demo()"

NCCL picks an algorithm per call from a cost model of the hardware (its tuning tables:
a latency and a bandwidth per algorithm); this does the same with the α–β model of
``comm_model``: ``doubling_crossover_bytes`` turns the link's α and B into the size S*
below which recursive doubling's fewer steps beat the ring's fewer bytes. Small tensors
go to ``recursive_doubling_all_reduce``, large ones to ``pipelined_ring_all_reduce``.
The link's numbers are this machine's, measured by ``benchmarks/bench_collectives.py``
(``measure_link``); pass your own ``Link`` for another.
"""

import dataclasses

import torch
import torch.distributed as dist

from tinyscale.comm.collectives import check_same
from tinyscale.comm.comm_model import doubling_crossover_bytes
from tinyscale.comm.latency import human
from tinyscale.comm.launch import run_on_ranks
from tinyscale.comm.pipelined_ring import pipelined_ring_all_reduce
from tinyscale.comm.recursive_doubling import recursive_doubling_all_reduce

# --8<-- [end:header]


# --8<-- [start:choose]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Link:
    """One message of S bytes between two ranks takes alpha_s + S / bandwidth_bps seconds."""

    alpha_s: float  # Python, gloo's threads and the kernel's TCP, per message
    bandwidth_bps: float  # bytes per second, each way at once


# The course machine's (2 cores, gloo over loopback), rounded from its recorded fit:
# docs/generated/week1/allreduce_link.md
THIS_MACHINE = Link(alpha_s=140e-6, bandwidth_bps=2.1e9)
ALGORITHMS = {
    "recursive doubling": recursive_doubling_all_reduce,
    "pipelined ring": pipelined_ring_all_reduce,
}


def choose(size_bytes: int, world_size: int, link: Link = THIS_MACHINE) -> str:
    """The algorithm the model says is faster for a tensor of ``size_bytes`` on N ranks."""
    crossover = doubling_crossover_bytes(
        world_size=world_size, alpha_s=link.alpha_s, bandwidth_bps=link.bandwidth_bps
    )
    return "recursive doubling" if size_bytes < crossover else "pipelined ring"


def all_reduce(
    tensor: torch.Tensor, *, average: bool = False, check: bool = True, link: Link = THIS_MACHINE
) -> torch.Tensor:
    """Like ``dist.all_reduce(tensor)`` (op SUM), or the mean if ``average``: in place.

    The check comes first and under this name: ranks that passed different sizes could
    otherwise choose different algorithms, and wait for messages that never come.
    """
    if check:
        integer = average and not tensor.is_floating_point()
        problem = (
            "average=True needs a floating-point tensor; convert it first" if integer else None
        )
        check_same("all_reduce", tensor, problem=problem)
    algorithm = ALGORITHMS[choose(tensor.nbytes, dist.get_world_size(), link)]
    return algorithm(tensor, average=average, check=False)


# --8<-- [end:choose]


# --8<-- [start:demo]
def show_choices() -> list[str]:
    """On every rank: what all_reduce picks for a small and a large tensor, and its sums."""
    world = dist.get_world_size()
    lines = []
    for numel in (2**10, 2**22):  # 4 KiB and 16 MiB of float32, far from S* on either side
        x = torch.ones(numel)
        right = torch.equal(all_reduce(x), torch.full((numel,), float(world)))
        lines.append(
            f"N = {world} | {human(x.nbytes):>6} -> {choose(x.nbytes, world)} | sums right: {right}"
        )
    return lines


def demo() -> None:
    for world_size in (2, 4):
        print("\n".join(run_on_ranks(show_choices, world_size)[0]))


# --8<-- [end:demo]

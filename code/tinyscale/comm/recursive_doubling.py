# --8<-- [start:header]
"""Recursive doubling: the latency-optimal all-reduce, log₂ N steps, with send and recv only.

    python -c "from tinyscale.comm.recursive_doubling import demo; demo()"

In step k = 0, 1, 2 ... every rank swaps its whole tensor with the rank whose number
differs in bit k (``rank ^ 2**k``) and adds what arrives: after step k each rank holds the
sum of a group of 2**(k+1) ranks, so log₂ N steps sum all N (Thakur, Rabenseifner and
Gropp, "Optimization of collective communication operations in MPICH", 2005).
Each step sends all S bytes: log₂ N · S per rank, against the ring's 2 (N − 1) / N · S in
2 (N − 1) steps (``comm_model.recursive_doubling_steps``, ``recursive_doubling_bytes``).
A non-power-of-two N is folded: with P the largest power of two below N, the first
2 (N − P) ranks pair up, each even one hands its tensor to the odd one after it and waits,
the P that remain double, and the odd ones hand the sum back: two steps more.
Built from the messages of ``collectives.py`` (``dist.isend``, ``dist.irecv``), so
``comm.counter.CollectiveCounter`` counts what it sends.
"""

import torch
import torch.distributed as dist

from tinyscale.comm.collectives import check_same, ring_all_reduce, scratch
from tinyscale.comm.comm_model import recursive_doubling_bytes, recursive_doubling_steps
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks


def _exchange(send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
    """Swap with ``peer``: both messages posted, then both waited for.

    The lower rank posts its send first and the higher its receive first, so a backend
    that runs the two in order (NCCL may) pairs them up instead of closing a cycle. The
    receive is waited for first: it usually finishes last, and then the send is done too,
    so this thread sleeps once per swap, not twice (each wake-up needs a free core).
    """
    if dist.get_rank() < peer:
        sent, received = dist.isend(send, peer), dist.irecv(recv, peer)
    else:
        received, sent = dist.irecv(recv, peer), dist.isend(send, peer)
    received.wait()
    sent.wait()


# --8<-- [end:header]


# --8<-- [start:doubling]
def recursive_doubling_all_reduce(
    tensor: torch.Tensor, *, average: bool = False, check: bool = True
) -> torch.Tensor:
    """Like ``dist.all_reduce(tensor)`` (op SUM), or the mean if ``average``: in place.

    Partners add the same two tensors in opposite order, a + b and b + a, which float
    addition gives bit for bit alike: every rank ends with the same bits, as with the ring.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if check:
        integer = average and not tensor.is_floating_point()
        problem = (
            "average=True needs a floating-point tensor; convert it first" if integer else None
        )
        check_same("recursive_doubling_all_reduce", tensor, problem=problem)
    flat = tensor.view(-1)
    if not flat.numel():
        return tensor  # nothing to send, on every rank alike
    arrived = scratch(flat, flat.numel())  # kept between calls: no fresh pages per call
    power = 1 << (world.bit_length() - 1)  # P: the largest power of two <= N
    folded = world - power  # ranks 0, 2, ..., 2 (folded - 1) sit the doubling out
    if rank < 2 * folded and rank % 2 == 0:
        dist.isend(flat, rank + 1).wait()  # my share goes to the odd rank after me ...
        dist.irecv(flat, rank + 1).wait()  # ... which sends back the finished sum
        return tensor
    if rank < 2 * folded:
        dist.irecv(arrived, rank - 1).wait()
        flat += arrived  # I now hold rank - 1's share too
    me = rank // 2 if rank < 2 * folded else rank - folded  # my place among the P ranks
    bit = 1
    while bit < power:
        partner = me ^ bit  # a place among the P; its rank undoes the fold's numbering
        _exchange(flat, arrived, 2 * partner + 1 if partner < folded else partner + folded)
        flat += arrived  # now the sum over my group of 2 · bit places
        bit *= 2
    if average:
        flat.div_(world)  # the same bits on every rank, divided alike
    if rank < 2 * folded:
        dist.isend(flat, rank - 1).wait()
    return tensor


# --8<-- [end:doubling]


# --8<-- [start:demo]
def compare_doubling_with_ring() -> str:
    """Against dist.all_reduce and the ring: equal, bytes and steps against the formulas."""
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = torch.arange(1000.0) * (rank + 1)  # whole numbers: exact sums in any order
    ring = ring_all_reduce(whole.clone())
    with CollectiveCounter() as counter:
        ours = recursive_doubling_all_reduce(whole.clone(), check=False)
    sent = counter.sent_bytes()
    formula = recursive_doubling_bytes(size_bytes=whole.nbytes, world_size=world)
    return (
        f"rank {rank} | = ring_all_reduce, bit for bit: {torch.equal(ours, ring)} | sent "
        f"{sent:.0f} B in {counter.ops()['isend']} messages | formula for the busiest rank: "
        f"{formula:.0f} B, {recursive_doubling_steps(world)} steps"
    )


def demo(world_size: int = 3) -> None:
    print("\n".join(run_on_ranks(compare_doubling_with_ring, world_size)))


# --8<-- [end:demo]

# --8<-- [start:header]
"""The pipelined ring all-reduce: chunks cut into segments, each add overlapped with a send.

    python -c "from tinyscale.comm.pipelined_ring import demo; demo()"

The same ring as ``collectives.ring_all_reduce`` (same chunks, same order of additions,
so the same bits), built from the same messages (``dist.isend``, ``dist.irecv``,
``dist.get_rank``, ``dist.get_world_size``), with one change in the reduce-scatter: a
chunk no longer travels as one message. It is cut into P segments of at most
``segment_bytes``, and the N − 1 steps become one stream of (N − 1) · P messages in
which segment k + 1 is already on its way while segment k is added. gloo's ring does
the same (gloo/allreduce.cc); NCCL's slices are the same idea on a GPU. The all-gather
adds nothing, so there is nothing to overlap: it sends whole chunks, as the plain ring.

Two messages are in flight at a time, so two segment-sized receive buffers suffice; they
are allocated once per dtype and device and reused by every later call. Segmenting adds
no bytes: ``comm.counter.CollectiveCounter`` counts exactly what the plain ring sends.
Every rank must pass the same ``segment_bytes``, as it passes the same shape: both ends
of a message compute its length from them.
"""

from math import ceil

import torch
import torch.distributed as dist

from tinyscale.comm.collectives import (
    _chunks,
    _ring_all_gather,
    check_same,
    ring_all_reduce,
    scratch,
)
from tinyscale.comm.comm_model import ring_allreduce_steps
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import UsageError

SEGMENT_BYTES = 4 * 2**20  # the default, picked by benchmarks/bench_collectives.py's sweep


def segments_per_chunk(numel: int, world: int, itemsize: int, segment_bytes: int) -> int:
    """P: how many segments every chunk is cut into, the same number on every rank.

    Just enough that no segment exceeds ``segment_bytes``; the largest chunk (the first
    of ``tensor_split``'s) decides. A chunk that fits in one segment travels whole.
    """
    largest = ceil(numel / world) * itemsize
    return max(1, ceil(largest / segment_bytes))


def _scratch(like: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two receive buffers of ``numel`` elements each, halves of ``collectives.scratch``."""
    buffer = scratch(like, 2 * numel)
    return buffer[:numel], buffer[numel:]


# --8<-- [end:header]


# --8<-- [start:stream]
def _post(send: torch.Tensor, recv: torch.Tensor) -> tuple[dist.Work | None, dist.Work | None]:
    """Post one segment's send (to the right) and receive (from the left); wait on neither.

    As in ``collectives._ring_step``: odd ranks post the receive first, and an empty
    segment is skipped by both of its ends alike.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    sent = received = None
    if rank % 2 and recv.numel():
        received = dist.irecv(recv, (rank - 1) % world)
    if send.numel():
        sent = dist.isend(send, (rank + 1) % world)
    if not rank % 2 and recv.numel():
        received = dist.irecv(recv, (rank - 1) % world)
    return sent, received


def _stream(
    sends: list[torch.Tensor], recvs: list[torch.Tensor], adds: list[torch.Tensor], ahead: int
) -> None:
    """Message k + ``ahead`` is posted before message k is waited for and added.

    With ``ahead`` = 1, segment k + 1 is copied through the network (by gloo's I/O
    thread) while this thread adds segment k. Safe when P ≥ 2: the segment sent as
    message k + 1 was received as message k + 1 − P ≤ k − 1 and is already added, and
    message k + 1's receive buffer was message k − 1's. With P = 1 every send is the
    sum just made, so ``ahead`` must be 0: post, wait, add, in turn, as the plain ring.
    """
    posted = [_post(sends[k], recvs[k]) for k in range(min(ahead, len(sends)))]
    for k in range(len(sends)):
        if k + ahead < len(sends):
            posted.append(_post(sends[k + ahead], recvs[k + ahead]))
        sent, received = posted[k]
        if received is not None:
            received.wait()
            adds[k].add_(recvs[k])  # in place, while message k + 1 is on the wire
        if sent is not None:
            sent.wait()


# --8<-- [end:stream]


# --8<-- [start:pipelined]
def _pipelined_reduce_scatter(chunks: list[torch.Tensor], parts: int) -> None:
    """The ring's reduce-scatter, one segment per message: (N − 1) · P messages.

    Message k = s · P + j is step s's segment j: send segment j of chunk r − s − 1,
    receive segment j of chunk r − s − 2 into buffer k mod 2, and add it there.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    segments = [chunk.tensor_split(parts) for chunk in chunks]  # segments[c][j], views
    buffers = _scratch(chunks[0], segments[0][0].numel())  # the largest segment's size
    sends, recvs, adds = [], [], []
    for step in range(world - 1):
        sends += segments[(rank - step - 1) % world]
        for into in segments[(rank - step - 2) % world]:
            recvs.append(buffers[len(recvs) % 2][: into.numel()])
            adds.append(into)
    _stream(sends, recvs, adds, ahead=min(1, parts - 1))


def pipelined_ring_all_reduce(
    tensor: torch.Tensor,
    *,
    segment_bytes: int = SEGMENT_BYTES,
    average: bool = False,
    check: bool = True,
) -> torch.Tensor:
    """Like ``dist.all_reduce(tensor)`` (op SUM), or the mean if ``average``: in place.

    Bit for bit the result of ``ring_all_reduce``, the same bytes on the wire, in
    (N − 1) · (P + 1) messages per rank instead of 2 (N − 1).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    problem = None
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes <= 0:
        problem = f"segment_bytes={segment_bytes!r}; pass a positive int (e.g. {SEGMENT_BYTES})"
    elif average and not tensor.is_floating_point():
        problem = "average=True needs a floating-point tensor; convert it first"
    if check:
        check_same("pipelined_ring_all_reduce", tensor, problem=problem)
    elif problem is not None:  # unchecked: only this rank raises; the others time out
        raise UsageError(f"pipelined_ring_all_reduce: {problem}")
    chunks = _chunks(tensor.view(-1))
    parts = segments_per_chunk(tensor.numel(), world, tensor.element_size(), segment_bytes)
    _pipelined_reduce_scatter(chunks, parts)
    if average:
        chunks[rank].div_(world)  # only my finished chunk, as the plain ring does
    _ring_all_gather(chunks)  # whole chunks: nothing to add, so nothing to overlap
    return tensor


# --8<-- [end:pipelined]


# --8<-- [start:demo]
def compare_with_ring(segment_bytes: int = 256) -> str:
    """Ours against dist.all_reduce and the plain ring: equal, same bytes, more messages."""
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = torch.arange(1000.0) * (rank + 1)  # whole numbers: exact sums in any order
    ref = whole.clone()
    dist.all_reduce(ref)
    same_sum = torch.equal(pipelined_ring_all_reduce(whole, segment_bytes=segment_bytes), ref)
    random = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    with CollectiveCounter() as ring:
        plain = ring_all_reduce(random.clone(), check=False)
    with CollectiveCounter() as counter:
        ours = pipelined_ring_all_reduce(random.clone(), segment_bytes=segment_bytes, check=False)
    parts = segments_per_chunk(random.numel(), world, random.element_size(), segment_bytes)
    return (
        f"rank {rank} | = dist.all_reduce: {same_sum} | bits = ring_all_reduce: "
        f"{torch.equal(ours, plain)} | sent {counter.sent_bytes():.0f} B (plain ring: "
        f"{ring.sent_bytes():.0f} B) | P = {parts}: {(world - 1) * (parts + 1)} messages "
        f"(plain ring: {ring_allreduce_steps(world)})"
    )


def demo(world_size: int = 3) -> None:
    print("\n".join(run_on_ranks(compare_with_ring, world_size)))


# --8<-- [end:demo]

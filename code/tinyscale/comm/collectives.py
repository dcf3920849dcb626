# --8<-- [start:header]
"""Collectives from scratch: the ring all-reduce and its friends, with only send and recv.

    python -c "from tinyscale.comm.collectives import demo; demo()"

Every function here is built from point-to-point messages alone (``dist.isend``,
``dist.irecv``, plus ``dist.get_rank`` and ``dist.get_world_size``) and mirrors the
``torch.distributed`` call it replaces: in place, on the default group, any shape, any
size. N ranks need not divide the size: chunks follow ``torch.tensor_split``, so they
differ by at most one element (and some are empty when there are fewer elements than ranks).

The all-reduce is the bandwidth-optimal ring, a reduce-scatter followed by an all-gather:
P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", J. Parallel Distrib. Comput. 69(2), 2009 — the "ring all-reduce" Baidu
brought to deep learning (A. Gibiansky, 2017). Each rank sends 2 (N − 1) / N · S bytes for
a tensor of S bytes, in 2 (N − 1) steps (``comm_model.ring_allreduce_bytes``). Every byte
leaves through ``dist.isend``, which ``comm.counter.CollectiveCounter`` wraps: so a test
counts what was sent instead of trusting the formula.
"""

import os

import torch
import torch.distributed as dist

from tinyscale.comm.comm_model import ring_allreduce_bytes
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.device import select_device
from tinyscale.core.errors import UsageError


def _ring_step(send: torch.Tensor, recv: torch.Tensor) -> None:
    """Send ``send`` to the right neighbour while ``recv`` arrives from the left.

    Both messages are posted before we wait on either. A blocking ``dist.send`` first
    would deadlock: gloo's send waits until the receiver has posted its recv, and every
    rank's right neighbour is busy sending too (see ``naive_ring_step``). Odd ranks post
    the receive first, so a backend that runs the two in order (NCCL may) cannot close a
    cycle either. Each ``wait`` raises after the process group's timeout, never hangs.
    The receive is waited for first: it usually finishes last, so the thread sleeps once.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    posts = [(dist.isend, send, (rank + 1) % world), (dist.irecv, recv, (rank - 1) % world)]
    if rank % 2:
        posts.reverse()
    # An empty chunk (fewer elements than ranks) is skipped by both ends alike.
    works = [post(tensor, peer) for post, tensor, peer in posts if tensor.numel()]
    for work in works if rank % 2 else works[::-1]:
        work.wait()


def _chunks(flat: torch.Tensor) -> list[torch.Tensor]:
    """N views of a 1-D tensor, sizes differing by at most one: chunk r belongs to rank r."""
    return list(torch.tensor_split(flat, dist.get_world_size()))


# Receive buffers, one per (dtype, device), kept between calls: a fresh buffer costs an
# allocation and a page fault per 4 KiB page on first use, on every call.
_SCRATCH: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def scratch(like: torch.Tensor, numel: int) -> torch.Tensor:
    """A receive buffer of ``numel`` elements of ``like``'s dtype and device, kept between
    calls and shared by every algorithm here: valid until the next call that asks for one."""
    key = (like.dtype, like.device)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = _SCRATCH[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buffer[:numel]


# --8<-- [end:header]


# --8<-- [start:check]
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
MAX_DIMS = 8
META = 5 + MAX_DIMS  # int64s per rank: bad?, dtype, numel, ndim, src, shape padded with -1


def check_same(
    name: str, tensor: torch.Tensor, *, src: int = -1, problem: str | None = None
) -> None:
    """Raise the same one-line UsageError on every rank unless all passed alike tensors.

    Mismatched shapes fail badly on their own: chunks of different sizes make gloo abort
    the process, or hang, or add garbage. So first every rank describes its tensor in
    META int64s and the rows go round the ring (an all-gather: N − 1 steps of 104 bytes,
    on top of the data's). Every rank then sees every row and reaches the same verdict.
    ``problem`` is an error the caller found on this rank alone (a bad output size): it is
    raised only after the other ranks heard of it, so they raise too instead of hanging.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    problem = _local_problem(tensor) or problem
    dtype = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else -1
    mine = [int(problem is not None), dtype, tensor.numel(), tensor.dim(), src, *tensor.shape]
    mine = mine[:META]
    rows = torch.full((world, META), -1, dtype=torch.int64, device=tensor.device)  # (N, META)
    rows[rank, : len(mine)] = torch.tensor(mine)
    _ring_all_gather(list(rows.unbind()))
    table = rows.tolist()
    if problem is not None:
        raise UsageError(f"{name}: {problem}")
    if bad := [r for r in range(world) if table[r][0]]:
        raise UsageError(f"{name}: rank {bad[0]} passed bad arguments; fix them (see its error)")
    if differ := [r for r in range(world) if table[r] != table[0]]:
        seen = ", ".join(f"rank {r}: {_describe(table[r])}" for r in [0, *differ])
        what = "shape, dtype and src" if src >= 0 else "shape and dtype"
        raise UsageError(f"{name}: ranks passed different tensors ({seen}); pass the same {what}")


def _local_problem(tensor: torch.Tensor) -> str | None:
    if tensor.dtype not in DTYPES:
        return f"dtype {tensor.dtype} is not supported; use one of {[str(d) for d in DTYPES]}"
    if tensor.dim() > MAX_DIMS:
        return f"the tensor has {tensor.dim()} dimensions; reshape it to at most {MAX_DIMS}"
    if not tensor.is_contiguous():
        return "the tensor is not contiguous; pass tensor.contiguous() and copy the result back"
    return None


def _describe(row: list[int]) -> str:
    _, dtype, _, ndim, src, *shape = row
    text = f"{str(DTYPES[dtype]).removeprefix('torch.')}{shape[:ndim]}"
    return text + (f" src={src}" if src >= 0 else "")


# --8<-- [end:check]


# --8<-- [start:reduce_scatter]
def _ring_reduce_scatter(chunks: list[torch.Tensor], buffer: torch.Tensor) -> None:
    """N − 1 steps: pass a partial sum to the right, add the one arriving from the left.

    At step s rank r sends chunk r − s − 1 and receives chunk r − s − 2 (mod N): chunk c
    starts on rank c + 1, collects one more rank's share per step, and arrives complete at
    rank c after N − 1 steps. Rank r sends every chunk but its own: S − |chunk r| bytes.
    ``buffer`` receives: at least as long as the largest chunk, ``chunks[0]``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(world - 1):
        send = chunks[(rank - step - 1) % world]
        recv = chunks[(rank - step - 2) % world]
        arrived = buffer[: recv.numel()]
        _ring_step(send, arrived)
        recv += arrived  # the sum so far of this chunk, one rank more


def ring_reduce_scatter(tensor: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """In place: rank r's chunk r of ``tensor`` becomes the sum over ranks; return it (a view).

    The other chunks are left holding partial sums, which the all-gather overwrites.
    ZeRO-3 calls it on every unit in every backward, so it receives into ``scratch``.
    """
    if check:
        check_same("ring_reduce_scatter", tensor)
    chunks = _chunks(tensor.view(-1))
    _ring_reduce_scatter(chunks, scratch(tensor, chunks[0].numel()))
    return chunks[dist.get_rank()]


# --8<-- [end:reduce_scatter]


# --8<-- [start:all_gather]
def _ring_all_gather(chunks: list[torch.Tensor]) -> None:
    """N − 1 steps: forward the chunk you last got (your own first), copy in the next.

    Received straight into place: each chunk is a contiguous view of the flat tensor.
    Rank r sends every chunk but chunk r + 1 (it is the last to arrive): S − |chunk r+1|.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(world - 1):
        _ring_step(chunks[(rank - step) % world], chunks[(rank - step - 1) % world])


def ring_all_gather(tensor: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """In place: rank r's chunk r of ``tensor`` is copied into chunk r on every rank."""
    if check:
        check_same("ring_all_gather", tensor)
    _ring_all_gather(_chunks(tensor.view(-1)))
    return tensor


# --8<-- [end:all_gather]


# --8<-- [start:all_reduce]
def ring_all_reduce(
    tensor: torch.Tensor, *, average: bool = False, check: bool = True
) -> torch.Tensor:
    """Like ``dist.all_reduce(tensor)`` (op SUM), or the mean over ranks if ``average``.

    Reduce-scatter, then all-gather, on the same chunk views of the flat tensor. Rank r
    sends (S − |chunk r|) + (S − |chunk r+1|) bytes: 2 (N − 1) / N · S when N divides the
    size, and 2 (N − 1) · S over all ranks in any case.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if check:
        integer = average and not tensor.is_floating_point()
        problem = (
            "average=True needs a floating-point tensor; convert it first" if integer else None
        )
        check_same("ring_all_reduce", tensor, problem=problem)
    chunks = _chunks(tensor.view(-1))
    _ring_reduce_scatter(chunks, torch.empty_like(chunks[0]))  # fresh: see the benchmark
    if average:
        chunks[rank].div_(world)  # only my finished chunk: S / N divisions, not S
    _ring_all_gather(chunks)  # copies, not sums: every rank ends bit-for-bit identical
    return tensor


# --8<-- [end:all_reduce]


# --8<-- [start:broadcast]
def broadcast(tensor: torch.Tensor, src: int, *, check: bool = True) -> torch.Tensor:
    """Like ``dist.broadcast(tensor, src)``: a binomial tree, ⌈log₂ N⌉ rounds.

    Number the ranks from src (src is 0). In the round with ``mask`` = 1, 2, 4 ... every
    rank below ``mask`` has the data and sends all of it to the rank ``mask`` further on:
    the ranks holding it double each round. A chain (src → src+1 → ...) needs N − 1 whole
    steps; split into pieces and pipelined it is faster for big tensors — what NCCL does.
    Every rank but src receives S bytes once; all ranks together send (N − 1) · S.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if check:
        problem = None if 0 <= src < world else f"src={src} is no rank; use 0 to {world - 1}"
        check_same("broadcast", tensor, src=src, problem=problem)
    me = (rank - src) % world  # my place in the tree
    mask = 1
    while mask < world:
        if me < mask and me + mask < world:  # I have the data: pass it on
            dist.isend(tensor, (rank + mask) % world).wait()
        elif mask <= me < 2 * mask:  # my round to receive it
            dist.irecv(tensor, (rank - mask) % world).wait()
        mask *= 2
    return tensor


# --8<-- [end:broadcast]


# --8<-- [start:torch_like]
def all_gather_single(output: torch.Tensor, input: torch.Tensor, *, check: bool = True) -> None:
    """Like ``dist.all_gather_single`` (formerly ``all_gather_into_tensor``).

    ``output`` holds N × input's elements; rank r's input lands in its r-th chunk. Each
    rank sends its input's S bytes N − 1 times: (N − 1) · S.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if check:
        fits = output.numel() == world * input.numel() and output.dtype == input.dtype
        problem = None
        if not (fits and output.is_contiguous()):
            problem = (
                f"output must be a contiguous {input.dtype} tensor of {world} x {input.numel()}"
            )
        check_same("all_gather_single", input, problem=problem)
    chunks = _chunks(output.view(-1))
    chunks[rank].copy_(input.view(-1))
    _ring_all_gather(chunks)


def all_gather(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, *, check: bool = True
) -> None:
    """Like ``dist.all_gather``: ``tensor_list[r]`` receives rank r's tensor."""
    world = dist.get_world_size()
    if check:
        alike = all(t.shape == tensor.shape and t.dtype == tensor.dtype for t in tensor_list)
        problem = None
        if not (alike and len(tensor_list) == world):
            problem = f"tensor_list must hold {world} tensors shaped like the input; use empty_like"
        check_same("all_gather", tensor, problem=problem)
    gathered = tensor.new_empty((world, *tensor.shape))  # (N, *shape)
    all_gather_single(gathered, tensor, check=False)
    for out, part in zip(tensor_list, gathered, strict=True):
        out.copy_(part)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, *, check: bool = True) -> None:
    """Like ``dist.reduce_scatter_single`` (formerly ``reduce_scatter_tensor``), op SUM.

    ``output`` gets rank r's chunk of the sum. torch wants N to divide the input; here
    the chunks may be uneven, so ``output`` has ``tensor_split``'s size for this rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    size = input.numel() // world + (rank < input.numel() % world)  # my tensor_split chunk
    if check:
        problem = None
        if output.numel() != size or output.dtype != input.dtype:
            problem = f"output must be a {input.dtype} tensor of {size} elements on rank {rank}"
        check_same("reduce_scatter_single", input, problem=problem)
    chunks = _chunks(input.flatten().clone())  # a copy: the input stays untouched, as in torch
    _ring_reduce_scatter(chunks, scratch(input, chunks[0].numel()))
    output.copy_(chunks[rank].view_as(output))


# --8<-- [end:torch_like]


# --8<-- [start:ping_pong]
def ping_pong() -> str:
    """Point to point: rank 0 sends three numbers to rank 1, which sends back their double."""
    rank = dist.get_rank()
    x = torch.zeros(3)
    if rank == 0:
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=1)  # returns once rank 1 has it
        dist.recv(x, src=1)  # blocks until rank 1's message arrives
        return f"rank 0 sent [1.0, 2.0, 3.0] and got back {x.tolist()}"
    dist.recv(x, src=0)
    dist.send(2 * x, dst=0)
    return f"rank 1 received {x.tolist()} and sent back {(2 * x).tolist()}"


# --8<-- [end:ping_pong]


# --8<-- [start:compare]
def compare_with_torch(device: str = "cpu") -> str:
    """ring_all_reduce against dist.all_reduce, and the bytes each rank sent."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # The GPU is picked by the rank on this node: on two nodes of 8, global rank 8 is cuda:0.
    dev = select_device(device, local_rank=int(os.environ["LOCAL_RANK"]))
    lines = []
    for shape in [(7,), (3, 4), (1000,)]:
        # Whole numbers: float sums of them are exact in any order, so "equal" means equal.
        x = torch.arange(torch.Size(shape).numel(), device=dev).view(shape).float() * (rank + 1)
        ours, ref = x.clone(), x.clone()
        with CollectiveCounter() as counter:  # the data alone: no shape check (its 104 B rows)
            ring_all_reduce(ours, check=False)
        dist.all_reduce(ref)
        size = x.numel() * x.element_size()
        formula = ring_allreduce_bytes(size_bytes=size, world_size=world)
        lines.append(
            f"rank {rank} | shape {list(shape)} | equal: {torch.equal(ours, ref)} | "
            f"S = {size} B | sent {counter.sent_bytes():.0f} B | 2(N-1)/N*S = {formula:.1f} B"
        )
    return "\n".join(lines)


def demo(world_size: int = 3) -> None:
    print("\n".join(run_on_ranks(compare_with_torch, world_size)))


# --8<-- [end:compare]


# --8<-- [start:naive]
def naive_ring_step() -> None:
    """One ring step with a blocking send first: a deadlock (every rank is sending)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, theirs = torch.full((4,), float(rank)), torch.empty(4)
    dist.send(mine, (rank + 1) % world)  # waits for the right neighbour's recv ...
    dist.recv(theirs, (rank - 1) % world)  # ... which it never reaches: it is sending too


# --8<-- [end:naive]

# --8<-- [start:header]
"""Which samples each rank reads: data sharding the way Hugging Face Accelerate does it.

Try it:  python -c "from tinyscale.data_parallel.data_sharding import show; show(10, batch_size=4, world_size=2)"

Every rank runs the same data loader over the same data set; a shard is the rule that
tells rank r which of those batches are its own. Accelerate's ``BatchSamplerShard`` shards
*batches*; torch's ``DistributedSampler`` shards *samples*. Both must give every rank the
same number of steps, or the ranks stop calling their collectives together.
Small pure functions of (indices, rank, world size): no process group needed.
``tests/tinyscale/data_parallel/test_data_sharding.py`` proves them index for index against
``accelerate.data_loader.BatchSamplerShard`` and ``torch.utils.data.DistributedSampler``.
"""

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist

from tinyscale.core.errors import UsageError

# --8<-- [end:header]


# --8<-- [start:batches]
def make_batches(
    indices: Sequence[int], batch_size: int, *, drop_last: bool = False
) -> list[list[int]]:
    """Cut the sampler's order into batches, as torch's BatchSampler does."""
    batches = [list(indices[i : i + batch_size]) for i in range(0, len(indices), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def wrap_around(indices: Sequence[int], multiple: int) -> list[int]:
    """Pad to a multiple of ``multiple`` by starting again from the first indices."""
    padding = -len(indices) % multiple if indices else 0
    return list(indices) + list(itertools.islice(itertools.cycle(indices), padding))


# --8<-- [end:batches]


# --8<-- [start:check]
def _check(batch_size: int, world_size: int, rank: int, split_batches: bool) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in a world of {world_size}: use 0 <= rank < world")
    if batch_size < 1:
        raise UsageError(f"batch_size must be at least 1, got {batch_size}")
    if split_batches and batch_size % world_size:
        raise UsageError(
            f"split_batches=True cuts each batch of {batch_size} into {world_size} equal "
            f"slices, and {batch_size} % {world_size} != 0: use a batch size divisible by "
            f"{world_size}, or split_batches=False"
        )


# --8<-- [end:check]


# --8<-- [start:shard_batches]
def shard_batches(
    indices: Sequence[int],
    *,
    batch_size: int,
    world_size: int,
    rank: int,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
) -> list[list[int]]:
    """The batches rank ``rank`` reads, in order: what BatchSamplerShard yields.

    ``batch_size`` is the loader's batch size: per rank when ``split_batches=False``
    (rank r takes whole batches r, r + world, ...), the global batch when
    ``split_batches=True`` (every rank takes slice r of every batch).
    ``even_batches=True`` wraps around to the first indices, so every rank gets as many
    full batches; ``drop_last=True`` drops what does not fill a step on every rank.
    """
    _check(batch_size, world_size, rank, split_batches)
    # One step of the whole world consumes `step` indices.
    step = batch_size if split_batches else batch_size * world_size
    if even_batches and not drop_last:
        indices = wrap_around(indices, step)
    batches = make_batches(indices, batch_size, drop_last=drop_last)
    if split_batches:
        width = batch_size // world_size
        slices = [batch[rank * width : (rank + 1) * width] for batch in batches]
        return [piece for piece in slices if piece]  # a short last batch may miss a rank
    if drop_last:  # a step where some rank would have no batch is dropped for all
        batches = batches[: len(batches) - len(batches) % world_size]
    return batches[rank::world_size]


# --8<-- [end:shard_batches]


# --8<-- [start:strided]
def strided_shard(
    indices: Sequence[int], *, world_size: int, rank: int, drop_last: bool = False
) -> list[int]:
    """DistributedSampler's rule: every world_size-th sample, starting at ``rank``.

    To give every rank as many samples it pads by repeating the first ones
    (``drop_last=False``) or trims the tail (``drop_last=True``).
    """
    _check(1, world_size, rank, split_batches=False)
    if drop_last:
        indices = indices[: len(indices) - len(indices) % world_size]
    else:
        indices = wrap_around(indices, world_size)
    return list(indices[rank::world_size])


# --8<-- [end:strided]


# --8<-- [start:unshard]
def unshard(per_rank: Sequence[Sequence[Sequence[int]]], n: int) -> list[int]:
    """Undo the sharding of an evaluation: interleave the ranks' batches, drop the padding.

    Step s of the loader gave rank r its batch ``per_rank[r][s]``; concatenated in rank
    order, the step's batches are the global batch again. The wrap-around padding comes
    last, so keeping the first ``n`` entries drops exactly the duplicates.
    """
    steps = max((len(batches) for batches in per_rank), default=0)
    order = [
        i for s in range(steps) for batches in per_rank if s < len(batches) for i in batches[s]
    ]
    return order[:n]


# --8<-- [end:unshard]


# --8<-- [start:show]
def show(n: int, *, batch_size: int, world_size: int) -> None:
    """Print which indices every rank reads, for both of Accelerate's modes."""
    for split in (False, True):
        print(f"split_batches={split}:")
        kw = dict(batch_size=batch_size, world_size=world_size, split_batches=split)
        try:
            shards = [shard_batches(range(n), rank=r, **kw) for r in range(world_size)]
        except UsageError as err:
            print(f"  {err}")
            continue
        for rank, mine in enumerate(shards):
            print(f"  rank {rank}: {mine}")


# --8<-- [end:show]


# --8<-- [start:evaluate]
def sharded_sum_of_squares(n: int, batch_size: int) -> tuple[float, float, int]:
    """Evaluate f(i) = i * i over a data set of n samples, sharded over the ranks.

    Returns (sum with the duplicates, sum after gather-and-trim, samples seen by this rank).
    The gathered sum is what one process would compute; the naive all-reduce is not.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = shard_batches(range(n), batch_size=batch_size, world_size=world, rank=rank)
    values = [torch.tensor([float(i * i) for i in batch]) for batch in mine]
    naive = torch.stack([v.sum() for v in values]).sum()
    dist.all_reduce(naive)  # counts every padded duplicate once more
    gathered = []
    for step in values:  # even_batches: every rank has as many steps, of the same size
        parts = [torch.empty_like(step) for _ in range(world)]
        dist.all_gather(parts, step)
        gathered.extend(torch.cat(parts).tolist())
    trimmed = sum(gathered[:n])  # the padding comes last: drop it
    return naive.item(), trimmed, sum(len(batch) for batch in mine)


def uneven_steps(n: int, batch_size: int) -> int:
    """even_batches=False: each rank all-reduces a loss per batch, as training would."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = shard_batches(
        range(n), batch_size=batch_size, world_size=world, rank=rank, even_batches=False
    )
    for _ in mine:  # rank 1 has one batch fewer: rank 0's last all-reduce has no partner
        dist.all_reduce(torch.ones(1))
    return len(mine)


# --8<-- [end:evaluate]

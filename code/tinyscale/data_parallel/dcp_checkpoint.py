# --8<-- [start:dcp]
"""Sharded checkpoints with torch.distributed.checkpoint (DCP): saved on N ranks, loaded on any number.

Try it:  python -c "from tinyscale.data_parallel.checkpoint_demo import demo; demo()"

DCP follows the protocol of ``tinyscale.data_parallel.ranked_checkpoint`` — every rank
writes its own file, rank 0 writes ``.metadata`` last: its manifest — and adds
resharding: a checkpoint saved by 4 ranks loads on 2, 3 or 1.
"""

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.errors import UsageError


def shard_state(
    state: dict[str, torch.Tensor], device_type: str, shard: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """The tensors named in ``shard`` become DTensors split by rows over all ranks; the
    others stay plain tensors, the same on every rank (replicated)."""
    layout = ParallelLayout(dp_shard=dist.get_world_size())  # one axis: every rank a shard
    mesh = layout.build(device_type=device_type).mesh["dp_shard"]
    return {
        name: distribute_tensor(t, mesh, [Shard(0)]) if name in shard else t
        for name, t in state.items()
    }


def save_dcp(state: dict[str, Any], path: str | Path, *, background: bool = False) -> Any:
    """Every rank writes its own shards (__<rank>_0.distcp); rank 0 writes .metadata last.

    ``background=True``: dcp.async_save copies the state to CPU memory and writes it in a
    thread, so training goes on; wait on the returned future before the next save.
    """
    if background:
        return dcp.async_save(state, checkpoint_id=path)
    return dcp.save(state, checkpoint_id=path)


def load_dcp(template: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """Fill ``template`` — tensors laid out for *this* job — in place, whatever world size
    saved the checkpoint: each rank reads only the byte ranges that overlap its shards."""
    if not Path(path, ".metadata").is_file():
        raise UsageError(
            f"{path} has no .metadata: not a DCP checkpoint, or its save never finished; "
            "check the path or load an earlier checkpoint"
        )
    dcp.load(template, checkpoint_id=path)
    return template


def full_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Gather every DTensor into the whole tensor (a collective), on the CPU."""
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).cpu() for name, t in state.items()
    }


# --8<-- [end:dcp]

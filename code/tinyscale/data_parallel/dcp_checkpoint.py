# --8<-- [start:dcp]
"""Sharded checkpoints with torch.distributed.checkpoint (DCP): saved on N ranks, loaded on any number.

Try it:  python -c "from tinyscale.data_parallel.checkpoint_demo import demo; demo()"

DCP follows the protocol of ``tinyscale.data_parallel.ranked_checkpoint`` — every rank
writes its own file, rank 0 writes ``.metadata`` once all have — and adds resharding: a
checkpoint saved by 4 ranks loads on 2, 3 or 1. Rank 0 then commits it as a ranked
checkpoint is committed: a manifest, written last, lists every file with its size, so a
file cut short later is found before anything is read.
"""

from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.checkpoint import verify_checkpoint
from tinyscale.core.errors import UsageError
from tinyscale.data_parallel.ranked_checkpoint import write_manifest

DCP_FORMAT = "tinyscale.dcp_checkpoint.v1"


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


def save_dcp(
    state: dict[str, Any], path: str | Path, *, background: bool = False,
    also: Sequence[str] = (),
) -> Any:  # fmt: skip
    """Every rank writes its own shards (__<rank>_0.distcp); rank 0 writes .metadata, then
    the manifest, last. ``also``: files the caller put in ``path`` first, committed too.

    ``background=True``: dcp.async_save copies the state to CPU memory and writes it in a
    thread, so training goes on; the returned future is done once the manifest is written:
    wait on it before the next save.
    """
    if background:
        committed: Future[None] = Future()

        def commit_when_written(written: Future) -> None:
            try:
                written.result()
                commit_dcp(path, also=also)
                committed.set_result(None)
            except BaseException as err:  # the waiter sees why, instead of a lost thread
                committed.set_exception(err)

        dcp.async_save(state, checkpoint_id=path).add_done_callback(commit_when_written)
        return committed
    dcp.save(state, checkpoint_id=path)
    commit_dcp(path, also=also)
    if dist.is_initialized():
        dist.barrier()  # no rank moves on (or deletes an older checkpoint) before the commit


def commit_dcp(path: str | Path, *, also: Sequence[str] = ()) -> None:
    """Rank 0 (or the one process): the manifest of .metadata and every file it names.

    .metadata is written once every rank's shards are: then their sizes are final.
    """
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    path = Path(path)
    stored = dcp.FileSystemReader(path).read_metadata().storage_data.values()
    names = sorted({".metadata", *also, *(item.relative_path for item in stored)})
    files = [{"file": name, "bytes": (path / name).stat().st_size} for name in names]
    write_manifest(path, {"format": DCP_FORMAT, "files": files})


def load_dcp(template: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """Fill ``template`` — tensors laid out for *this* job — in place, whatever world size
    saved the checkpoint: each rank reads only the byte ranges that overlap its shards."""
    if not Path(path, ".metadata").is_file():
        raise UsageError(
            f"{path} has no .metadata: not a DCP checkpoint, or its save never finished; "
            "check the path or load an earlier checkpoint"
        )
    verify_checkpoint(path)  # the manifest, and every file's size: a torn file is one line
    dcp.load(template, checkpoint_id=path)
    return template


def full_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Gather every DTensor into the whole tensor (a collective), on the CPU."""
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).cpu() for name, t in state.items()
    }


# --8<-- [end:dcp]

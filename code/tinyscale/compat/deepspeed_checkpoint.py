# --8<-- [start:find]
"""DeepSpeed's checkpoints with the course's sidecar: find one, check it, save and load.

Launch:  torchrun --nproc-per-node 2 code/scripts/deepspeed_train.py \
             --deepspeed-config code/config/deepspeed/zero2.json --precision fp32 --resume auto

``engine.save_checkpoint`` writes one folder per tag (every rank its own ZeRO shard, rank
0 the weights) and then the file ``latest``, naming the tag. Our small tinyscale.json goes
into the folder first: the step and what wrote it (world size, ZeRO stage, precision,
config), so that a resume refuses another world or stage with one line, before
DeepSpeed fails on a missing shard.
"""

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.compat.deepspeed_config import precision_of, zero_stage
from tinyscale.core.checkpoint import checkpoint_name, restore_rng
from tinyscale.core.errors import UsageError
from tinyscale.data_parallel.ddp_training import gather_rng_states

SIDECAR = "tinyscale.json"  # beside DeepSpeed's files in every checkpoint: what wrote it


def latest_tag(checkpoints: Path) -> Path | None:
    """--resume auto: the folder DeepSpeed's ``latest`` names (written last), or None."""
    latest = checkpoints / "latest"
    return latest.parent / latest.read_text().strip() if latest.is_file() else None


def check_resume(
    folder: Path | None, *, output_dir: str, world_size: int, ds_config: dict[str, Any]
) -> dict[str, Any] | None:
    """The checkpoint's sidecar, after checking it was written by a run like this one."""
    if folder is None:
        return None
    if not (folder / SIDECAR).is_file():
        raise UsageError(
            f"{folder} is not a checkpoint of this script (no {SIDECAR}): pass a folder like "
            f"{output_dir}/checkpoints/step_000050, or --resume auto"
        )
    saved = json.loads((folder / SIDECAR).read_text())
    if saved["world_size"] != world_size or saved["zero_stage"] != zero_stage(ds_config):
        raise UsageError(
            f"{folder} holds ZeRO-{saved['zero_stage']} shards of {saved['world_size']} ranks, "
            f"this run is ZeRO-{zero_stage(ds_config)} on {world_size}: relaunch with "
            f"{saved['world_size']} processes and a ZeRO-{saved['zero_stage']} config"
        )
    return saved


# --8<-- [end:find]


# --8<-- [start:save]
def save_deepspeed(
    engine: Any, checkpoints: Path, *, step: int, device: torch.device,
    ds_config: dict[str, Any], config_path: str,
) -> Path:  # fmt: skip
    """Every rank writes its own ZeRO shard; rank 0 also writes the weights and 'latest'."""
    tag = checkpoint_name(step)
    client_state = {"step": step, **gather_rng_states(device)}  # a collective
    if dist.get_rank() == 0:  # before DeepSpeed's files: 'latest' never names a folder without it
        (checkpoints / tag).mkdir(parents=True, exist_ok=True)
        sidecar = {
            "step": step,
            "world_size": dist.get_world_size(),
            "zero_stage": zero_stage(ds_config),
            "precision": precision_of(ds_config),
            "deepspeed_config": config_path,
        }
        (checkpoints / tag / SIDECAR).write_text(json.dumps(sidecar, indent=2))
    dist.barrier()
    engine.save_checkpoint(str(checkpoints), tag=tag, client_state=client_state)
    return checkpoints / tag


def load_deepspeed(engine: Any, folder: Path, *, device: torch.device) -> int:
    """Weights, optimizer shards, lr schedule and this rank's RNG; returns the step."""
    path, client_state = engine.load_checkpoint(str(folder.parent), tag=folder.name)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load {folder}")
    restore_rng(client_state, device=device, rank=dist.get_rank())
    return client_state["step"]


# --8<-- [end:save]

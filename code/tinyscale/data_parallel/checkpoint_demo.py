# --8<-- [start:demo_model]
"""The Checkpoints page's demo: a tiny model saved by several ranks, ranked and with DCP.

Try it:  python -c "from tinyscale.data_parallel.checkpoint_demo import demo; demo()"

Gloo on CPU processes by default; ``device_type="cuda"`` runs the same workers on GPUs
(launch them with backend="nccl").
"""

import os
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.core.checkpoint import latest_checkpoint
from tinyscale.core.config import preset
from tinyscale.core.device import select_device
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.dcp_checkpoint import full_tensors, load_dcp, save_dcp, shard_state
from tinyscale.data_parallel.ranked_checkpoint import (
    load_ranked,
    rank_file,
    rank_state,
    restore_rank_state,
    save_ranked,
    step_dir,
    write_rank_file,
)

SHARDED = ("tok_emb.weight", "blocks.0.attn.qkv.weight", "blocks.0.ffn.up.weight")
Shapes = dict[str, tuple[int, ...]]  # each sharded weight's local shape on this rank


def demo_params(seed: int = 0, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tiny model's parameters, the same on every rank for the same seed; the tied
    lm_head.weight is the embedding and is listed once (named_parameters skips it)."""
    torch.manual_seed(seed)
    model = TinyTransformer(preset("micro")).to(device)
    return {name: p.detach() for name, p in model.named_parameters()}


def rank_device(device_type: str) -> torch.device:
    """This rank's device, from the course's one picker: cpu, or the GPU its LOCAL_RANK
    names, made current before nccl's first call."""
    device = select_device(device_type, local_rank=int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


# --8<-- [end:demo_model]


# --8<-- [start:demo_ranked]
def ranked_worker(ckpt_dir: str, step: int, crash: bool = False, device_type: str = "cpu") -> str:
    """Train one step, save a ranked checkpoint, draw the next random number as evidence."""
    rank, device = dist.get_rank(), rank_device(device_type)
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP has
    model = TinyTransformer(preset("micro")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.arange(16, device=device).view(2, 8)  # one batch for all: the replicas stay equal
    model(x, x)[1].backward()
    optimizer.step()
    torch.manual_seed(1000 + rank)  # ...but every rank has its own random stream
    sampler = {"epoch": 0, "position": 8 * step}
    state = rank_state(model, optimizer, step=step, device=device, sampler=sampler)
    if crash:
        write_rank_file(state, step_dir(ckpt_dir, step))
        if rank == 0:
            os._exit(1)  # rank 0 dies after every rank file is written, before the manifest
    path = rank_file(save_ranked(state, ckpt_dir, step=step), rank)
    draw = torch.rand(1).item()  # CPU stream: dropout on a GPU draws from rng_device
    return f"rank {rank} wrote {path.name} ({path.stat().st_size:,} bytes), next draw {draw:.6f}"


def resume_worker(ckpt_dir: str, device_type: str = "cpu") -> str:
    """Find the newest complete checkpoint, read this rank's file, continue its RNG."""
    rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device(device_type)
    directory = latest_checkpoint(ckpt_dir)
    if directory is None:
        raise UsageError(f"no complete checkpoint in {ckpt_dir}: train first")
    model = TinyTransformer(preset("micro")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = load_ranked(directory, rank=rank, world_size=world)
    at = restore_rank_state(state, model, optimizer, device=device)["position"]
    draw = torch.rand(1).item()
    return f"rank {rank} resumed {directory.name} at sample {at}, next draw {draw:.6f}"


# --8<-- [end:demo_ranked]


# --8<-- [start:demo_dcp]
def _local_shapes(state: dict[str, Any]) -> Shapes:
    return {name: tuple(state[name].to_local().shape) for name in SHARDED}


def dcp_save_worker(path: str, device_type: str = "cpu", background: bool = False) -> Shapes:
    """Save the tiny model's parameters, three of them sharded by rows; return my shapes."""
    state = shard_state(demo_params(0, rank_device(device_type)), device_type, SHARDED)
    done = save_dcp(state, path, background=background)
    if background:
        done.result(timeout=60)  # training would run here; wait before the next save
    return _local_shapes(state)


def dcp_load_worker(path: str, device_type: str = "cpu") -> tuple[bool, Shapes]:
    """Load into a template of *this* world size; compare the whole tensors bit for bit."""
    device = rank_device(device_type)
    template = {name: torch.zeros_like(t) for name, t in demo_params(0, device).items()}
    state = load_dcp(shard_state(template, device_type, SHARDED), path)
    reloaded, saved = full_tensors(state), full_tensors(demo_params(0, device))
    equal = all(torch.equal(reloaded[name], saved[name]) for name in saved)  # bitwise
    return equal, _local_shapes(state)


def demo() -> None:
    from tinyscale.comm.launch import run_on_ranks

    run_on_ranks(dcp_save_worker, 4, "runs/checkpoints/demo_w4")
    for world in (2, 3):
        results = run_on_ranks(dcp_load_worker, world, "runs/checkpoints/demo_w4")
        print(f"saved on 4 ranks, reloaded on {world}: equal {all(ok for ok, _ in results)}")


# --8<-- [end:demo_dcp]

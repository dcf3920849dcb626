# --8<-- [start:header]
"""Checkpoints across nodes: one file per rank and a manifest written last; DCP's sharded ones.

Try it:  python -c "from tinyscale.data_parallel.sharded_checkpoint import demo; demo()"

One process writes one file atomically (``tinyscale.core.checkpoint``). N ranks on several
nodes need a protocol: every rank writes its own file atomically, all meet at a barrier,
and only then does rank 0 write a small manifest — last, and atomically. A directory
without its manifest is incomplete and is never loaded. ``torch.distributed.checkpoint``
(DCP) follows the same protocol (its ``.metadata`` file is the manifest) and adds
resharding: a checkpoint saved by 4 ranks loads on 2, 3 or 1.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

from tinyscale.core.checkpoint import load_checkpoint, save_checkpoint
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "tinyscale.ranked_checkpoint.v1"
# --8<-- [end:header]


# --8<-- [start:layout]
def step_dir(ckpt_dir: str | Path, step: int) -> Path:
    """ckpt_dir/step_000010: one directory per checkpoint, sorted by name = sorted by step."""
    return Path(ckpt_dir) / f"step_{step:06d}"


def rank_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank_{rank:05d}.pt"


def file_entry(path: Path) -> dict[str, Any]:
    """What the manifest records for one rank's file: its name, size and sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


# --8<-- [end:layout]


# --8<-- [start:save]
def write_rank_file(state: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    """Phase 1, every rank: write my own file atomically, then wait for all the others.

    Returns every rank's manifest entry. The all-gather is the barrier: it returns on no
    rank before every rank has written, fsynced and renamed its file.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    path = save_checkpoint({**state, "rank": rank, "world_size": world}, rank_file(directory, rank))
    entries: list[Any] = [None] * world
    dist.all_gather_object(entries, file_entry(path))  # each rank hashes its own file
    return entries


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """Phase 2, rank 0 only: the commit. Temp file, fsync, rename — as save_checkpoint does.

    JSON rather than torch.save, so ``cat manifest.json`` shows what a checkpoint holds.
    """
    path, tmp = directory / MANIFEST, directory / f".{MANIFEST}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(directory, os.O_RDONLY)  # make the rename itself survive a power cut
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def save_ranked(state: dict[str, Any], ckpt_dir: str | Path, *, step: int) -> Path:
    """Every rank calls this with its own state; returns the committed step directory."""
    directory = step_dir(ckpt_dir, step)
    entries = write_rank_file({**state, "step": step}, directory)
    if dist.get_rank() == 0:
        manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": len(entries)}
        write_manifest(directory, {**manifest, "files": entries})
    dist.barrier()  # no rank moves on (or deletes an older checkpoint) before the commit
    return directory


# --8<-- [end:save]


# --8<-- [start:load]
def latest_complete(ckpt_dir: str | Path) -> Path | None:
    """The newest step directory that has a manifest; incomplete ones are skipped."""
    for directory in sorted(Path(ckpt_dir).glob("step_*"), reverse=True):
        if (directory / MANIFEST).is_file():
            return directory
    return None


def read_manifest(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.is_dir():
        raise UsageError(
            f"checkpoint directory {directory} not found: check the path, or pass "
            "latest_complete(<ckpt_dir>)"
        )
    path = directory / MANIFEST
    if not path.is_file():
        raise UsageError(
            f"{directory} has no {MANIFEST}: the save never finished (a rank died before "
            "rank 0 committed it); load latest_complete(<ckpt_dir>) instead"
        )
    manifest = json.loads(path.read_text())  # written atomically: complete or absent
    if manifest.get("format") != MANIFEST_FORMAT:
        raise UsageError(f"{path} is not a tinyscale manifest: pass a directory from save_ranked")
    return manifest


def load_ranked(directory: str | Path, *, rank: int, world_size: int) -> dict[str, Any]:
    """Each rank reads its own file, after checking it against the manifest."""
    manifest = read_manifest(directory)
    saved = manifest["world_size"]
    if saved != world_size:
        raise UsageError(
            f"{directory} was saved by {saved} ranks but this job has {world_size}: relaunch "
            f"with {saved} ranks, or save a DCP checkpoint (save_dcp) and reshard with load_dcp"
        )
    path, expected = rank_file(directory, rank), manifest["files"][rank]
    if not path.is_file():
        raise UsageError(
            f"{path} is missing but {MANIFEST} lists it: node-local disk? copy it to storage "
            "every node sees, or resume from an earlier checkpoint"
        )
    found = file_entry(path)
    if found != expected:  # cut short by a full disk or a failed copy, or altered since
        why = (
            f"{found['bytes']:,} bytes, {MANIFEST} lists {expected['bytes']:,}"
            if found["bytes"] != expected["bytes"]
            else f"its sha256 differs from {MANIFEST}'s"
        )
        raise UsageError(f"{path} is damaged ({why}): resume from an earlier checkpoint")
    return load_checkpoint(path)  # weights_only: tensors and plain data, never code


# --8<-- [end:load]


# --8<-- [start:rank_state]
def rank_state(model: nn.Module, optimizer: torch.optim.Optimizer, *, sampler: dict) -> dict:
    """What one rank needs to go on exactly: weights, optimizer, its RNG, its data position."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng_cpu": torch.get_rng_state(),  # this rank's dropout masks continue where they were
        "rng_cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
        "sampler": dict(sampler),  # e.g. {"epoch": 0, "position": 40}: where its shard stops
    }


def restore_rank_state(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse of rank_state; returns the sampler position to start the data from."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] is not None:
        torch.cuda.set_rng_state(state["rng_cuda"])
    return state["sampler"]


# --8<-- [end:rank_state]


# --8<-- [start:dcp]
def shard_state(
    state: dict[str, torch.Tensor], device_type: str, shard: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """The tensors named in ``shard`` become DTensors split by rows over all ranks; the
    others stay plain tensors, the same on every rank (replicated)."""
    mesh = init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("dp",))
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


# --8<-- [start:demo_model]
SHARDED = ("tok_emb.weight", "blocks.0.attn.qkv.weight", "blocks.0.ffn.up.weight")


def demo_params(seed: int = 0, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tiny model's parameters, the same on every rank for the same seed; the tied
    lm_head.weight is the embedding and is listed once (named_parameters skips it)."""
    torch.manual_seed(seed)
    model = TinyTransformer(preset("micro")).to(device)
    return {name: p.detach() for name, p in model.named_parameters()}


def use_device(device_type: str) -> torch.device:
    """cpu, or this rank's own GPU picked by LOCAL_RANK (set before nccl's first call)."""
    if device_type != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    return device


# --8<-- [end:demo_model]


# --8<-- [start:demo_ranked]
def ranked_worker(ckpt_dir: str, step: int, crash: bool = False, device_type: str = "cpu") -> str:
    """Train one step, save a ranked checkpoint, draw the next random number as evidence."""
    rank, device = dist.get_rank(), use_device(device_type)
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP has
    model = TinyTransformer(preset("micro")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.arange(16, device=device).view(2, 8)  # one batch for all: the replicas stay equal
    model(x, x)[1].backward()
    optimizer.step()
    torch.manual_seed(1000 + rank)  # ...but every rank has its own random stream
    state = rank_state(model, optimizer, sampler={"epoch": 0, "position": 8 * step})
    if crash:
        write_rank_file({**state, "step": step}, step_dir(ckpt_dir, step))
        if rank == 0:
            os._exit(1)  # rank 0 dies after every rank file is written, before the manifest
    path = rank_file(save_ranked(state, ckpt_dir, step=step), rank)
    draw = torch.rand(1).item()  # CPU stream: dropout on a GPU draws from rng_cuda
    return f"rank {rank} wrote {path.name} ({path.stat().st_size:,} bytes), next draw {draw:.6f}"


def resume_worker(ckpt_dir: str, device_type: str = "cpu") -> str:
    """Find the newest complete checkpoint, read this rank's file, continue its RNG."""
    rank, world, device = dist.get_rank(), dist.get_world_size(), use_device(device_type)
    directory = latest_complete(ckpt_dir)
    if directory is None:
        raise UsageError(f"no complete checkpoint in {ckpt_dir}: train first")
    model = TinyTransformer(preset("micro")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = load_ranked(directory, rank=rank, world_size=world)
    at = restore_rank_state(state, model, optimizer)["position"]
    draw = torch.rand(1).item()
    return f"rank {rank} resumed {directory.name} at sample {at}, next draw {draw:.6f}"


# --8<-- [end:demo_ranked]


# --8<-- [start:demo_dcp]
def _local_shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(state[name].to_local().shape) for name in SHARDED}


def dcp_save_worker(path: str, device_type: str = "cpu", background: bool = False) -> dict:
    """Save the tiny model's parameters, three of them sharded by rows; return my shapes."""
    state = shard_state(demo_params(0, use_device(device_type)), device_type, SHARDED)
    done = save_dcp(state, path, background=background)
    if background:
        done.result(timeout=60)  # training would run here; wait before the next save
    return _local_shapes(state)


def dcp_load_worker(path: str, device_type: str = "cpu") -> tuple[bool, dict]:
    """Load into a template of *this* world size; compare the whole tensors bit for bit."""
    device = use_device(device_type)
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

# --8<-- [start:header]
"""Ranked checkpoints: every rank writes its own file atomically, then rank 0 writes a manifest last.

Try it:  python -c "from tinyscale.comm.launch import run_on_ranks as run; from tinyscale.data_parallel.checkpoint_demo import ranked_worker; print(run(ranked_worker, 2, 'runs/checkpoints/ranked', 10))"

One process writes one file atomically (``tinyscale.core.checkpoint``). N ranks on several
nodes need a protocol: every rank writes its own file atomically, all meet at a barrier,
and only then does rank 0 write a small manifest — last, and atomically. A directory
without its manifest is incomplete and is never loaded.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.core.checkpoint import (
    MANIFEST,
    RESUME_FIX,
    checkpoint_name,
    load_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
    verify_checkpoint,
)
from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError

MANIFEST_FORMAT = "tinyscale.ranked_checkpoint.v1"
# --8<-- [end:header]


# --8<-- [start:layout]
def step_dir(ckpt_dir: str | Path, step: int) -> Path:
    """ckpt_dir/step_000010: one directory per checkpoint, sorted by name = sorted by step."""
    return Path(ckpt_dir) / checkpoint_name(step)


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
def read_manifest(directory: str | Path, *, fix: str = RESUME_FIX) -> dict[str, Any]:
    """The manifest, once it and every file it lists are checked (verify_checkpoint)."""
    directory = Path(directory)
    if directory.is_file():
        raise UsageError(
            f"checkpoint {directory} is a file, not a ranked checkpoint's folder (step_N/ with "
            f"{MANIFEST}): pass a step's folder, or --resume auto for the newest whole one"
        )
    if not directory.is_dir():
        raise UsageError(
            f"checkpoint {directory} not found: check the path, or pass --resume auto (the "
            "newest whole checkpoint) or an earlier step's folder"
        )
    path = verify_checkpoint(directory, fix=fix) / MANIFEST  # present, parsed, sizes right
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise UsageError(f"{path} is not a ranked manifest: pass a directory from save_ranked")
    return manifest


def load_ranked(
    directory: str | Path, *, rank: int, world_size: int, expect: ModelConfig | None = None,
    fix: str = RESUME_FIX,
) -> dict[str, Any]:  # fmt: skip
    """Each rank reads its own file, after checking it against the manifest.

    ``expect``: refuse another model's checkpoint (load_checkpoint); ``fix``: what a
    one-line error about a damaged checkpoint tells its reader to do.
    """
    manifest = read_manifest(directory, fix=fix)  # every rank checks every file's size
    saved = manifest["world_size"]
    if saved != world_size:
        raise UsageError(
            f"{directory} was saved by {saved} ranks but this job has {world_size}: relaunch "
            f"with {saved} ranks, or save a DCP checkpoint (save_dcp) and reshard with load_dcp"
        )
    path, expected = rank_file(directory, rank), manifest["files"][rank]
    if file_entry(path) != expected:  # the same size, other bytes: altered since, or a bad copy
        raise UsageError(f"{path} is damaged (its sha256 differs from {MANIFEST}'s); {fix}")
    return load_checkpoint(path, expect=expect, fix=fix)  # weights_only: never code


# --8<-- [end:load]


# --8<-- [start:rank_state]
def rank_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, device: torch.device,
    sampler: dict[str, int],
) -> dict[str, Any]:  # fmt: skip
    """What one rank needs to go on exactly: the training state of Session A — weights,
    optimizer, step, this rank's RNG — plus where this rank's shard of the data stops,
    ``sampler`` = {"epoch": 0, "position": 40}."""
    return training_state(
        model=model, optimizer=optimizer, cfg=None, step=step, epoch=sampler["epoch"],
        device=device, sampler=dict(sampler),
    )  # fmt: skip


def restore_rank_state(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, *,
    device: torch.device,
) -> dict[str, int]:  # fmt: skip
    """The inverse of rank_state; returns the sampler position to start the data from."""
    restore_training_state(state, model, optimizer, device=device)  # RNG: this rank's own
    return state["sampler"]


# --8<-- [end:rank_state]

# --8<-- [start:save]
"""Checkpoints that are never half-written and never load blindly.

Try it:  python -c "from tinyscale.core.checkpoint import *; print(describe_checkpoint(latest_checkpoint('runs/lab1/checkpoints')))"
"""

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError

FORMAT = "tinyscale.checkpoint.v1"
MANIFEST = "manifest.json"  # what a checkpoint of several files writes last (Session C)


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically: to a temporary file first, then rename.

    A crash (or Ctrl-C) mid-write leaves the previous checkpoint intact: ``os.replace``
    swaps the name in one step, so readers see the old file or the new one, never half.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left if something above failed
    return path


def remove_stale_temps(ckpt_dir: str | Path) -> list[Path]:
    """Delete what saves that never finished left behind; return what was deleted.

    A process killed with SIGKILL between writing its temporary file and renaming it runs
    no ``finally``: its ``.<name>.tmp-<pid>`` stays (in the step directories too, for
    several ranks' files). Call it when a run starts, before it saves anything: no save of
    this run is in flight then. The checkpoints themselves are never touched.
    """
    stale = sorted(Path(ckpt_dir).glob("**/.*.tmp-*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


# --8<-- [end:save]


# --8<-- [start:load]
def load_checkpoint(path: str | Path, *, expect: ModelConfig | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never code.

    With ``expect``, refuse a checkpoint trained with a different model config, with an
    error that says which field differs, instead of a wall of size-mismatch messages.
    """
    path = Path(path)
    if not path.is_file():
        saved = sorted(path.parent.glob("step_*.pt")) if path.parent.is_dir() else []
        near = f" ({path.parent} holds {', '.join(p.name for p in saved[-3:])})" if saved else ""
        raise UsageError(f"checkpoint {path} not found: check the path{near}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, not a zip, pickled code: all mean "do not trust it"
        raise UsageError(
            f"checkpoint {path} is corrupt or not a tinyscale checkpoint ({type(err).__name__}): "
            "resume from an earlier checkpoint or start without --resume"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(
            f"{path} is not a tinyscale checkpoint (no '{FORMAT}' marker): "
            "pass a runs/<name>/checkpoints/step_*.pt file written by the course scripts"
        )
    if expect is not None:
        # a field added to ModelConfig after the save has its default in the old file
        saved = {**dataclasses.asdict(ModelConfig()), **state["model_config"]}
        for key, value in dataclasses.asdict(expect).items():
            if saved.get(key) != value:
                raise UsageError(
                    f"checkpoint {path} was trained with {key}={saved.get(key)}, but the config "
                    f"says {key}={value}: pass the --config it was trained with, or start a new run"
                )
    return state


# --8<-- [end:load]


# --8<-- [start:state]
def training_state(
    *, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Any, step: int, epoch: int,
    device: torch.device, scaler: Any = None, history: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """Everything a run needs to go on exactly where it stopped: what a course checkpoint holds.

    The weights and Adam's state, the step, the random-number state that draws the next
    dropout masks, the loss scaler's scale (fp16), the configs it was trained with, and
    the metrics so far. ``extra``: what one script adds, e.g. its world size. ``cfg=None``:
    a state with no training config (Session C's ranked checkpoints).
    """
    return {
        "model_config": dataclasses.asdict(model.cfg),
        "train_config": dataclasses.asdict(cfg) if cfg is not None else None,
        "step": step,
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng_cpu": torch.get_rng_state(),
        "rng_device": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "history": history,
        **extra,
    }


def restore_training_state(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, *,
    device: torch.device, scaler: Any = None, rank: int | None = None,
) -> int:  # fmt: skip
    """Put back everything that decides what happens next; return the step to go on from.

    ``rank``: a checkpoint written for several ranks holds one RNG state per rank, a list
    (each rank draws its own dropout masks): take this rank's.
    """
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    restore_rng(state, device=device, rank=rank)
    return state["step"]


def restore_rng(state: dict[str, Any], *, device: torch.device, rank: int | None = None) -> None:
    """Put back the random-number state, so the dropout masks go on where they stopped."""
    rng_cpu, rng_device = state["rng_cpu"], state["rng_device"]
    if rank is not None:
        rng_cpu = rng_cpu[rank]
        rng_device = rng_device[rank] if rng_device is not None else None
    torch.set_rng_state(rng_cpu)
    if device.type == "cuda" and rng_device is not None:  # saved on a GPU too
        torch.cuda.set_rng_state(rng_device, device)


def checkpoint_name(step: int) -> str:
    """The name of the checkpoint saved after ``step`` steps: step_000100, a directory
    (several files) or, with ".pt", one file. Every saving loop of the course uses it."""
    return f"step_{step:06d}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint's name says (step_000100.pt: 100); None for any other name."""
    found = re.fullmatch(r"step_(\d+)(\.pt)?", Path(path).name)
    return int(found[1]) if found else None


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in ``ckpt_dir``, or None (what --resume auto picks).

    A ``step_*.pt`` file is complete once it has its name (save_checkpoint renames it into
    place). A ``step_*`` directory, written by several ranks, is complete once the file
    written last is there: our manifest, or DCP's .metadata. Newest: the highest step.
    """
    named = [p for p in Path(ckpt_dir).glob("step_*") if checkpoint_step(p) is not None]
    for path in sorted(named, key=checkpoint_step, reverse=True):
        if path.is_file() or any((path / name).is_file() for name in (MANIFEST, ".metadata")):
            return path
    return None


# --8<-- [end:state]


# --8<-- [start:describe]
def describe_checkpoint(path: str | Path) -> str:
    """What a checkpoint holds: its keys, every weight's shape and bytes, the optimizer's total."""
    state = load_checkpoint(path)
    lines = [f"{path}: step {state['step']}, epoch {state['epoch']}", f"keys: {', '.join(state)}"]
    total, seen = 0, {}
    for name, tensor in state["model"].items():
        nbytes = tensor.numel() * tensor.element_size()
        shape = f"{tuple(tensor.shape)!s:<12} {tensor.dtype}"
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen:  # a tied weight: torch.save writes shared storage once
            lines.append(f"  {name:<28} {shape}  = {seen[storage]} (tied)")
            continue
        seen[storage] = name
        total += nbytes
        lines.append(f"  {name:<28} {shape} {nbytes:>9,} B")
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim() > 0]
    optimizer_bytes = sum(t.numel() * t.element_size() for t in moments)
    lines.append(
        f"  {'optimizer state':<28} {len(moments)} tensors (Adam exp_avg, exp_avg_sq) {optimizer_bytes:>9,} B"
    )
    lines.append(f"  {'total':<28} {total + optimizer_bytes:>39,} B")
    return "\n".join(lines)


# --8<-- [end:describe]

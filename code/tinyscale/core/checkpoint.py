# --8<-- [start:save]
"""Checkpoints that are never half-written and never load blindly.

Try it:  python -c "from tinyscale.core.checkpoint import *; print(describe_checkpoint(latest_checkpoint('runs/lab1/checkpoints')))"
"""

import dataclasses
import json
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError

FORMAT = "tinyscale.checkpoint.v1"
MANIFEST = "manifest.json"  # what a checkpoint of several files writes last (Session C)
RESUME_FIX = "resume from an earlier checkpoint: latest_checkpoint (--resume auto) skips this one"


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
    several ranks' files). A job that died before rank 0 wrote a step directory's manifest
    leaves the directory: never chosen, but taking space until that step is saved again.
    Call it when a run starts, on rank 0, before it saves anything: no save of this run is
    in flight then. Complete checkpoints, and damaged ones (evidence), are never touched.
    """
    ckpt_dir = Path(ckpt_dir)
    stale = sorted(ckpt_dir.glob("**/.*.tmp-*"))
    for path in stale:
        path.unlink(missing_ok=True)
    unfinished = [
        p for p in sorted(ckpt_dir.glob("step_*"))
        if p.is_dir() and checkpoint_step(p) is not None and not (p / MANIFEST).exists()
    ]  # fmt: skip
    for path in unfinished:
        shutil.rmtree(path, ignore_errors=True)
    return stale + unfinished


# --8<-- [end:save]


# --8<-- [start:load]
def load_checkpoint(
    path: str | Path, *, expect: ModelConfig | None = None,
    fix: str = "resume from an earlier checkpoint or start without --resume",
) -> dict[str, Any]:  # fmt: skip
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never code.

    With ``expect``, refuse a checkpoint trained with a different model config, with an
    error that says which field differs, instead of a wall of size-mismatch messages.
    ``fix``: what the one-line error of a damaged file tells its reader to do.
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
            f"{fix}"
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
    weights: bool = True, **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """Everything a run needs to go on exactly where it stopped: what a course checkpoint holds.

    The weights and Adam's state, the step, the random-number state that draws the next
    dropout masks, the loss scaler's scale (fp16), the configs it was trained with, and
    the metrics so far. ``extra``: what one script adds, e.g. its world size. ``cfg=None``:
    a state with no training config (Session C's ranked checkpoints). ``weights=False``:
    the rest without the weights and Adam's state, which a DCP checkpoint saves sharded.
    """
    return {
        "model_config": dataclasses.asdict(model.cfg),
        "train_config": dataclasses.asdict(cfg) if cfg is not None else None,
        "step": step,
        "epoch": epoch,
        "model": model.state_dict() if weights else None,
        "optimizer": optimizer.state_dict() if weights else None,
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
    (each rank draws its own dropout masks): take this rank's. A state saved with
    ``weights=False`` leaves the weights and Adam's state to their own loader (DCP).
    """
    if state["model"] is not None:
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


# --8<-- [end:state]


# --8<-- [start:choose]
def checkpoint_name(step: int) -> str:
    """The name of the checkpoint saved after ``step`` steps: step_000100, a directory
    (several files) or, with ".pt", one file. Every saving loop of the course uses it."""
    return f"step_{step:06d}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint's name says (step_000100.pt: 100); None for any other name."""
    found = re.fullmatch(r"step_(\d+)(\.pt)?", Path(path).name)
    return int(found[1]) if found else None


def checkpoint_problem(path: str | Path) -> str | None:
    """What makes ``path`` no checkpoint to go on from, in a few words; None when it is whole.

    Cheap, so every rank can ask before it starts: names and sizes, never the tensors. A
    ``.pt`` file ends in the zip directory torch.save writes last, and a file cut short
    has none. A directory of several files holds its manifest, written last, and every
    file the manifest lists, at the listed size.
    """
    path = Path(path)
    if path.is_file():
        try:
            zipfile.ZipFile(path).close()
        except (zipfile.BadZipFile, OSError):
            return f"{path} is cut short (no zip directory at its end: torch.save writes it last)"
        return None
    if not path.is_dir():
        return f"{path} not found"
    manifest = path / MANIFEST
    if not manifest.is_file():
        return (f"{path} has no {MANIFEST}: the save never finished (a rank died before rank 0 "
                "committed it)")  # fmt: skip
    try:
        files = json.loads(manifest.read_text())["files"]
        listed = {entry["file"]: entry["bytes"] for entry in files}
    except (ValueError, KeyError, TypeError):  # cut short, or not what a save writes
        return f"{manifest} is damaged (not the JSON a save writes)"
    for name, size in listed.items():
        file = path / name
        if not file.is_file():
            return (f"{file} is missing but {MANIFEST} lists it (node-local disk? copy it to "
                    "storage every node sees)")  # fmt: skip
        if file.stat().st_size != size:
            return f"{file} is damaged ({file.stat().st_size:,} bytes, {MANIFEST} lists {size:,})"
    return None


def verify_checkpoint(path: str | Path, *, fix: str = RESUME_FIX) -> Path:
    """``path``, once checked whole; else one line naming what is wrong and ``fix``."""
    problem = checkpoint_problem(path)
    if problem is not None:
        raise UsageError(f"{problem}; {fix}")
    return Path(path)


def report_skipped(line: str) -> None:
    """One line on stderr, from one process of a job: rank 0, or a run without ranks."""
    if os.environ.get("RANK", "0") == "0":
        print(f"warning: {line}", file=sys.stderr, flush=True)


def latest_checkpoint(
    ckpt_dir: str | Path, *, report: Callable[[str], None] | None = report_skipped
) -> Path | None:
    """The newest whole checkpoint in ``ckpt_dir``, or None: what --resume auto picks.

    Newest: the highest step. Whole: ``checkpoint_problem`` finds nothing wrong. A newer
    one that is not is skipped, and ``report`` gets one line saying why.
    """
    named = [p for p in Path(ckpt_dir).glob("step_*") if checkpoint_step(p) is not None]
    for path in sorted(named, key=checkpoint_step, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if report is not None:
            report(f"skipped {path.name}: {problem}")
    return None


# --8<-- [end:choose]


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

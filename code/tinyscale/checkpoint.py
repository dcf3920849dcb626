# --8<-- [start:save]
"""Checkpoints that are never half-written and never load blindly.

Try it:  python -c "from tinyscale.checkpoint import describe_checkpoint as d; print(d('runs/lab1/checkpoints/latest.pt'))"
"""

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from tinyscale.config import ModelConfig
from tinyscale.errors import UsageError

FORMAT = "tinyscale.checkpoint.v1"


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


# --8<-- [end:save]


# --8<-- [start:load]
def load_checkpoint(path: str | Path, *, expect: ModelConfig | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain data, never code.

    With ``expect``, refuse a checkpoint trained with a different model config, with an
    error that says which field differs, instead of a wall of size-mismatch messages.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint {path} not found: check the path, or start without --resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, not a zip, pickled code: all mean "do not trust it"
        raise UsageError(
            f"checkpoint {path} is corrupt or not a tinyscale checkpoint ({type(err).__name__}): "
            "resume from an earlier checkpoint or start without --resume"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"{path} is not a tinyscale checkpoint (no '{FORMAT}' marker)")
    if expect is not None:
        saved = state["model_config"]
        for key, value in dataclasses.asdict(expect).items():
            if saved.get(key) != value:
                raise UsageError(
                    f"checkpoint {path} was trained with {key}={saved.get(key)}, but the config "
                    f"says {key}={value}: pass the --config it was trained with, or start a new run"
                )
    return state


# --8<-- [end:load]


# --8<-- [start:describe]
def describe_checkpoint(path: str | Path) -> str:
    """A table of what a checkpoint holds: every tensor's name, shape and bytes."""
    state = load_checkpoint(path)
    lines = [f"{path}: step {state['step']}, epoch {state['epoch']}"]
    total = 0
    for section in ("model", "optimizer"):
        for name, tensor in _tensors(state[section], prefix=section):
            nbytes = tensor.numel() * tensor.element_size()
            total += nbytes
            lines.append(f"  {name:<44} {tuple(tensor.shape)!s:<14} {nbytes:>9,} B")
    lines.append(f"  {'total tensor bytes':<59} {total:>9,} B")
    return "\n".join(lines)


def _tensors(obj: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, dict):
        return [t for k, v in obj.items() for t in _tensors(v, f"{prefix}.{k}")]
    if isinstance(obj, list | tuple):
        return [t for i, v in enumerate(obj) for t in _tensors(v, f"{prefix}.{i}")]
    return []


# --8<-- [end:describe]

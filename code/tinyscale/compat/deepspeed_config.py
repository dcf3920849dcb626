# --8<-- [start:load]
"""DeepSpeed JSON configs: read one, check it, and settle its precision before DeepSpeed sees it.

Launch:  torchrun --nproc-per-node 2 code/scripts/deepspeed_train.py \
             --deepspeed-config code/config/deepspeed/zero2.json --precision fp32

The files in code/config/deepspeed/ are plain DeepSpeed JSON: the `deepspeed` launcher on a
GPU cluster takes them as they are. Here they are read once, and every mistake DeepSpeed
would report as a traceback from deep inside its engine becomes one line that names the fix.
"""

import copy
from pathlib import Path
from typing import Any

from tinyscale.core.config import read_json_object
from tinyscale.core.errors import UsageError
from tinyscale.core.precision import DEEPSPEED_BLOCKS, check_precision
from tinyscale.data_parallel.zero import ZERO_STAGES

DS_CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "deepspeed"


def shipped_configs() -> list[str]:
    return sorted(p.name for p in DS_CONFIG_DIR.glob("*.json"))


def load_ds_config(path: str | Path, *, precision: str | None = None) -> dict[str, Any]:
    """The JSON as a dict, with a ZeRO stage DeepSpeed knows and the precision asked for."""
    config = read_json_object(
        path,
        missing=f"DeepSpeed config {path} not found: use one of code/config/deepspeed/ "
        f"({', '.join(shipped_configs())}), e.g. code/config/deepspeed/zero2.json",
        invalid_fix="fix it, or start from code/config/deepspeed/zero2.json",
    )
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if type(stage) is not int or stage not in ZERO_STAGES:
        raise UsageError(
            f"{path}: unknown ZeRO stage {stage!r}: set zero_optimization.stage to 0, 1, 2 or 3"
        )
    return with_precision(config, precision)


# --8<-- [end:load]


# --8<-- [start:precision]
def with_precision(config: dict[str, Any], precision: str | None) -> dict[str, Any]:
    """A copy with exactly one of fp32, bf16, fp16 switched on; None keeps the JSON's.

    The course's precision names (tinyscale.core.precision) in DeepSpeed's words: a "bf16"
    or "fp16" block with "enabled": true, or neither for fp32. The fp16 block keeps its
    loss-scaling fields, so zero2_fp16.json's settings survive.
    """
    out = copy.deepcopy(config)
    if precision is None:
        return out
    check_precision(precision)
    for block in DEEPSPEED_BLOCKS:
        out[block] = {**out.get(block, {}), "enabled": precision == block}
    return out


def precision_of(config: dict[str, Any]) -> str:
    for name in DEEPSPEED_BLOCKS:
        if config.get(name, {}).get("enabled", False):
            return name
    return "fp32"


def zero_stage(config: dict[str, Any]) -> int:
    return config.get("zero_optimization", {}).get("stage", 0)


def offloads(config: dict[str, Any]) -> list[str]:
    """Where ZeRO-Offload moves things: e.g. ['optimizer -> cpu', 'param -> nvme']."""
    zero = config.get("zero_optimization", {})
    return [
        f"{what} -> {zero[f'offload_{what}']['device']}"
        for what in ("optimizer", "param")
        if zero.get(f"offload_{what}", {}).get("device", "none") != "none"
    ]


# --8<-- [end:precision]


# --8<-- [start:batch]
def batch_sizes(config: dict[str, Any], world_size: int) -> tuple[int, int, int]:
    """(micro, accumulation, global) from any two of DeepSpeed's three batch fields.

    DeepSpeed insists that train_batch_size = micro x accumulation x world size. The
    shipped configs give micro and accumulation only, so the global batch grows with the
    number of GPUs and the same file serves 2 CPU processes and 64 GPUs.
    """
    keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    for key in keys:
        value = config.get(key)
        if value is not None and (type(value) is not int or value <= 0):
            raise UsageError(f"{key} must be a positive integer, got {value!r}")
    micro, accum, total = (config.get(key) for key in keys)
    if micro is None and total is None:
        raise UsageError("the config sets no batch size: add train_micro_batch_size_per_gpu")
    if micro is None:  # from the global batch: DeepSpeed's rule
        accum = accum or 1
        micro = max(1, total // (accum * world_size))
    elif accum is None:
        accum = max(1, total // (micro * world_size)) if total is not None else 1
    if total is not None and total != micro * accum * world_size:
        raise UsageError(
            f"train_batch_size {total} != micro {micro} x accumulation {accum} x world "
            f"{world_size}: delete train_batch_size and let DeepSpeed compute it"
        )
    return micro, accum, micro * accum * world_size


# --8<-- [end:batch]


# --8<-- [start:shm]
def skip_unused_shm_build() -> bool:
    """Tell DeepSpeed on a CPU that its shared-memory all-reduce op cannot be built here.

    DeepSpeed's CPU backend JIT-compiles ``deepspeed_shm_comm`` (about a minute) when it
    starts, but only its *inference* all-reduce (tensor-parallel DeepSpeed-Inference)
    calls it; ZeRO training uses torch.distributed. No env var or config key turns the
    build off, so mark the op incompatible in DeepSpeed's own table, the way it skips the
    op on non-Linux systems, and it falls back to gloo. A GPU, or an op that was built at
    install time (DS_BUILD_SHM_COMM=1), is left alone. Returns whether the build is skipped.
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    name = "deepspeed_shm_comm"
    if get_accelerator().device_name() != "cpu" or installed_ops.get(name, False):
        return False
    deepspeed.ops.__compatible_ops__[name] = False  # read by deepspeed.comm.torch.build_shm_op
    return True


# --8<-- [end:shm]

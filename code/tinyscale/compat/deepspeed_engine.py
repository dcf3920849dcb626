# --8<-- [start:header]
"""The DeepSpeed engine around the course's model: Lab 1's optimizer and schedule handed over.

Launch:  deepspeed --num_gpus 2 code/scripts/deepspeed_train.py --deepspeed-config code/config/deepspeed/zero2.json

The Lab 2 script keeps flags, checks and the loop; this builds what DeepSpeed runs: the
model with Lab 2's initial weights, Lab 1's AdamW parameter groups (or DeepSpeed's own
optimizer when the JSON names one) and Lab 1's warmup-and-cosine schedule, inside a
process group the script joined itself, with its timeout. DeepSpeed prints its whole
config at INFO level; ``quiet_deepspeed`` keeps its warnings only.
"""

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from tinyscale.compat.deepspeed_config import skip_unused_shm_build
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, lr_at, make_optimizer, seed_everything

# --8<-- [end:header]


# --8<-- [start:engine]
def build_engine(
    cfg: TrainConfig, model_cfg: ModelConfig, ds_config: dict[str, Any], *, total_steps: int
) -> "deepspeed.DeepSpeedEngine":  # type: ignore[name-defined] # noqa: F821
    """Model and optimizer in, a DeepSpeed engine out: it owns partitioning from here on."""
    import deepspeed

    skip_unused_shm_build()  # on a CPU: no minute-long compile of an op training never calls
    seed_everything(cfg.seed)  # every rank builds Lab 2's initial weights
    model = TinyTransformer(model_cfg)
    # The optimizer is ours (Lab 1's AdamW and parameter groups) unless the JSON names one:
    # the offload configs do, so that DeepSpeed steps the CPU-side partitions with its
    # vectorised CPU Adam instead of torch's. Either way the groups keep Lab 1's settings.
    own = make_optimizer(model, cfg)
    groups = [{k: g[k] for k in ("params", "lr", "weight_decay")} for g in own.param_groups]
    if "optimizer" in ds_config:
        own = None

    def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        # Lab 1's warmup and cosine, as a factor on the peak lr; DeepSpeed steps it once
        # per optimizer step and saves it in every checkpoint
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_at(step, cfg, total_steps) / cfg.lr
        )

    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=own,
        model_parameters=groups if own is None else None,
        lr_scheduler=schedule,
        config=ds_config,
        dist_init_required=False,  # we joined the process group ourselves, with a timeout
    )
    return engine


# --8<-- [end:engine]


# --8<-- [start:quiet]
@contextlib.contextmanager
def quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed logs its whole config at INFO on stdout; keep warnings, drop the rest."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# --8<-- [end:quiet]

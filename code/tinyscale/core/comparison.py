# --8<-- [start:train]
"""Train variants of the course model on the same batches and score them: Week 3's comparisons.

Try it:  python -c "from tinyscale.core.comparison import *; from tinyscale.core.data import build_datasets; from tinyscale.core.model import TinyTransformer; from tinyscale.core.config import ModelConfig; print(train_and_score(lambda: TinyTransformer(ModelConfig()), build_datasets(vocab_size=1024, block_size=64), steps=4, eval_every=2).curve)"

The fp8 comparison (tinyscale.low_precision.compare) and the MoE comparison
(tinyscale.expert_parallel.moe_compare) each build their variants and pass what differs
(autocast, an extra loss, an update after each step); the training is this one.
"""

import dataclasses
import time
from collections.abc import Callable

import torch

from tinyscale.core.data import LMData, epoch_batches, get_batch
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import autocast_context
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, evaluate, lr_at, make_optimizer

CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class ScoredRun:
    curve: list[tuple[int, float]]  # (step, held-out loss)
    seconds_per_step: float  # CPU time, its share of the held-out evaluations included
    model: TinyTransformer = dataclasses.field(repr=False)  # as trained


def train_and_score(
    build: Callable[[], TinyTransformer], data: LMData, *, steps: int, eval_every: int,
    seed: int = 0, max_steps: int | None = None, precision: str = "fp32",
    extra_loss: Callable[[TinyTransformer], torch.Tensor] | None = None,
    after_step: Callable[[TinyTransformer], None] | None = None,
) -> ScoredRun:  # fmt: skip
    """Lab 1's loop (AdamW, warmup and cosine, clipping) on the model ``build()`` makes: a
    schedule of ``steps`` steps of 16 blocks, stopped after ``max_steps`` if given (as if
    interrupted), the held-out loss every ``eval_every`` steps and at the end.

    ``precision``: the autocast of the forward passes and of the evaluations after step 0.
    ``extra_loss(model)``: added to the task loss before backward. ``after_step(model)``:
    called after each update, before any evaluation (the model's last forward is the step's).
    """
    cfg = TrainConfig(lr=3e-3, warmup_steps=max(1, steps // 10), seed=seed)
    schedule = epoch_batches(len(data.train), cfg.global_batch_size, seed=seed, epoch=0)
    batches = schedule[: check_steps(steps, data)][:max_steps]
    model = build()
    optimizer = make_optimizer(model, cfg)

    def loss_fn(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _, loss = model(inputs, targets)
        return loss + extra_loss(model) if extra_loss is not None else loss

    curve = [(0, evaluate(model, data.heldout, batch_size=64, device=CPU)["loss"])]
    start = time.process_time()
    for step, indices in enumerate(batches, start=1):
        model.train()
        train_step(
            loss_fn=loss_fn, micro_batches=[get_batch(data.train, indices, CPU)],
            optimizer=optimizer, lr=lr_at(step - 1, cfg, steps),
            autocast=lambda: autocast_context(CPU, precision),
            max_norm=cfg.grad_clip, clip_params=model.parameters(),
        )  # fmt: skip
        if after_step is not None:
            after_step(model)
        if step % eval_every == 0 or step == len(batches):
            with autocast_context(CPU, precision):
                curve.append(
                    (step, evaluate(model, data.heldout, batch_size=64, device=CPU)["loss"])
                )
    seconds = (time.process_time() - start) / len(batches)
    return ScoredRun(curve=curve, seconds_per_step=seconds, model=model)


# --8<-- [end:train]


# --8<-- [start:one_epoch]
def check_steps(steps: int, data: LMData) -> int:
    """``steps`` if one epoch of 16-block batches holds them: every variant trains on the
    same fresh batches (each batch seen once)."""
    per_epoch = len(data.train) // TrainConfig().global_batch_size
    if not 1 <= steps <= per_epoch:
        raise UsageError(
            f"--steps {steps}: one epoch holds {per_epoch} steps; use 1 to {per_epoch}"
        )
    return steps


# --8<-- [end:one_epoch]

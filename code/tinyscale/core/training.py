# --8<-- [start:config]
"""The training loop, written by hand: no Trainer, every step visible.

Launch:  python code/scripts/train_tiny_transformer.py --epochs 2
"""

import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from tqdm import tqdm

from tinyscale.core.checkpoint import (
    checkpoint_name,
    remove_stale_temps,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from tinyscale.core.cli import flag, option
from tinyscale.core.config import DEFAULT_CONFIG_PATH, ModelConfig
from tinyscale.core.data import LMData, TokenBlocks, build_datasets, epoch_batches, get_batch
from tinyscale.core.device import DEVICES
from tinyscale.core.errors import UsageError
from tinyscale.core.metrics import WANDB_MODES, MetricsLogger, Mirror, plot_loss_curves
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import PRECISIONS
from tinyscale.core.step import train_step

B = TypeVar("B")  # one batch, whatever a loop's order yields


@dataclasses.dataclass(kw_only=True)
class TrainConfig:
    """Everything about *how* we train (the model's shape lives in ModelConfig).

    Every field is also a command-line flag of the training scripts, with this default
    and this help (tinyscale.core.cli): each script picks the flags it needs.
    """

    config: str = option(str(DEFAULT_CONFIG_PATH), "the model's shape, a JSON file")
    corpus: str = option("stdlib", "stdlib (offline), tinyshakespeare, or a text file")
    epochs: int = option(2, "passes over the training data")
    global_batch_size: int = option(16, "samples per optimizer step, all processes together")
    grad_accum_steps: int = option(1, "micro-batches per process per optimizer step")
    lr: float = option(3e-3, "peak learning rate, reached after the warmup")
    warmup_steps: int = option(20, "steps of linear warmup up to the peak")
    min_lr_ratio: float = option(0.1, "the cosine decay ends at the peak times this")
    weight_decay: float = option(0.1, "AdamW's decoupled weight decay, on matrices only")
    grad_clip: float = option(1.0, "largest global gradient norm")
    seed: int = option(0, "the same seed gives the same weights, data order and dropout")
    precision: str | None = option("fp32", "fp32, bf16 or fp16 (fp16 needs a GPU)")
    device: str = option("auto", "auto, cpu, mps or cuda")
    eval_every: int = option(50, "steps between held-out evaluations")
    log_every: int = option(10, "steps between log lines")
    checkpoint_every: int = option(100, "steps between checkpoints (and one at the end)")
    max_steps: int | None = option(None, "stop early, as if interrupted: the schedule is kept")
    resume: str | None = option(None, "a checkpoint to continue from, or 'auto': the newest")
    output_dir: str = option("runs/lab1", "checkpoints, metrics and TensorBoard files")
    log_dir: str = option("logs", "one train.log per rank, in rank_<N>/")
    timeout_s: float = option(60.0, "seconds a collective may wait for the other ranks")
    progress: bool | None = option(None, "the progress bar (shown only in a terminal)")
    wandb: str | None = option(None, "off (default), offline or online: Weights & Biases logging")

    def __post_init__(self) -> None:
        """Check every value, whichever script set it: one line that names the flag."""
        positive = ("epochs", "global_batch_size", "grad_accum_steps", "eval_every",
                    "log_every", "checkpoint_every", "max_steps", "lr", "grad_clip", "timeout_s")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{flag(name)} must be a positive number, got {value}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise UsageError(
                "need --warmup-steps >= 0, --weight-decay >= 0 and 0 <= --min-lr-ratio <= 1"
            )
        if self.precision is not None and self.precision not in PRECISIONS:
            raise UsageError(
                f"unknown precision {self.precision!r}: use one of {', '.join(PRECISIONS)}"
            )
        if self.wandb is not None and self.wandb not in WANDB_MODES:
            raise UsageError(
                f"unknown --wandb mode {self.wandb!r}: use offline or online, or leave --wandb out"
            )
        if self.device not in DEVICES:
            raise UsageError(f"unknown device '{self.device}': use one of {', '.join(DEVICES)}")
        for name in ("output_dir", "log_dir"):
            if Path(getattr(self, name)).is_file():
                raise UsageError(
                    f"{flag(name)} {getattr(self, name)} is a file: pass a directory "
                    "(it is created if missing)"
                )


# --8<-- [end:config]


# --8<-- [start:schedule]
def seed_everything(seed: int) -> None:
    """Same seed, same initial weights, same dropout masks, same data order."""
    random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU generator and every CUDA/MPS device


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warmup to cfg.lr, then cosine decay to cfg.lr * cfg.min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # 1 -> 0
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only, not on biases and LayerNorm weights."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


# --8<-- [end:schedule]


# --8<-- [start:plan]
@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Where a run is in its schedule; every hand-written loop of the course keeps one.

    E epochs of S steps make a schedule of E x S steps, which the learning rate spans;
    --max-steps stops the run earlier, as if it were interrupted, without changing it.
    """

    steps_per_epoch: int
    total_steps: int  # the schedule's length
    stop_at: int  # the step this run stops after

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch within it) of the next step after ``step``: where a resume goes on."""
        return divmod(step, self.steps_per_epoch)

    def check_steps_left(self, step: int) -> None:
        """A resumed run must have steps to train: a checkpoint at its end is one line that
        names the flag which set the end (--max-steps, or else --epochs)."""
        if step >= self.stop_at:
            flag = "--epochs" if self.stop_at == self.total_steps else "--max-steps"
            raise UsageError(
                f"the checkpoint is at step {step}, the end of this run: raise {flag} to train "
                "further"
            )

    def batches(self, step: int, order: Callable[[int], Sequence[B]]) -> Iterator[tuple[int, B]]:
        """(epoch, batch) of every step after ``step``, up to ``stop_at``: ``order(epoch)``
        is that epoch's batches, and a resume goes on mid-epoch where it stopped."""
        while step < self.stop_at:
            epoch, within = self.position(step)
            for batch in order(epoch)[within:]:
                yield epoch, batch
                step += 1
                if step == self.stop_at:
                    return


def plan_steps(steps_per_epoch: int, cfg: TrainConfig, *, samples: int) -> StepPlan:
    """The plan of a run whose every epoch has ``steps_per_epoch`` optimizer steps."""
    if steps_per_epoch == 0:
        raise UsageError(
            f"--global-batch-size {cfg.global_batch_size} leaves no full step in an epoch of "
            f"{samples} training samples: lower --global-batch-size"
        )
    total = cfg.epochs * steps_per_epoch
    return StepPlan(steps_per_epoch, total, min(total, cfg.max_steps or total))


def data_and_plan(
    cfg: TrainConfig, model_cfg: ModelConfig, *, resume_step: int | None = None
) -> tuple[LMData, StepPlan]:
    """A script's data and plan of steps, before any process group exists: the corpus's
    blocks, E epochs of its whole global batches, and (resuming) the steps left checked."""
    data = build_datasets(corpus=cfg.corpus, vocab_size=model_cfg.vocab_size,
                          block_size=model_cfg.max_position_embeddings)  # fmt: skip
    plan = plan_steps(len(data.train) // cfg.global_batch_size, cfg, samples=len(data.train))
    if resume_step is not None:
        plan.check_steps_left(resume_step)
    return data, plan


# --8<-- [end:plan]


# --8<-- [start:evaluate]
@torch.no_grad()  # no graph, no gradients: evaluation costs a forward pass only
def evaluate(
    model: TinyTransformer, dataset: TokenBlocks, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Mean loss over every held-out block, and perplexity = exp(loss)."""
    was_training = model.training
    model.eval()  # dropout off: the same weights always give the same score
    total, count = 0.0, 0
    for indices in torch.arange(len(dataset)).split(batch_size):
        x, y = get_batch(dataset, indices, device)
        _, loss = model(x, y)
        total += loss.item() * len(indices)
        count += len(indices)
    model.train(was_training)
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(loss)}


def log_heldout(
    model: TinyTransformer, data: LMData, logger: MetricsLogger, *, step: int,
    plan: StepPlan, cfg: TrainConfig, device: torch.device,
    tokens_per_second: float | None = None,
) -> str:  # fmt: skip
    """Score the held-out set, log the scores, and return the line the loops print.

    The line says where we are, the recent train loss, and the held-out scores.
    """
    scores = evaluate(model, data.heldout, batch_size=cfg.global_batch_size, device=device)
    logger.log(step, "heldout", **scores)
    recent = [r["loss"] for r in logger.records[-cfg.eval_every - 2 :] if r["split"] == "train"]
    line = f"step {step:4d}/{plan.total_steps} | epoch {step / plan.steps_per_epoch:4.2f}"
    if recent:
        line += f" | train loss {sum(recent) / len(recent):.3f}"
    line += f" | held-out loss {scores['loss']:.3f} | perplexity {scores['perplexity']:7.1f}"
    if tokens_per_second:
        line += f" | {tokens_per_second:,.0f} tokens/s"
    return line


# --8<-- [end:evaluate]


# --8<-- [start:result]
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainResult:
    steps: int
    seconds: float
    tokens_per_second: float
    first_heldout_loss: float
    final_heldout_loss: float
    final_checkpoint: Path
    history: list[dict[str, Any]]


# --8<-- [end:result]


# --8<-- [start:train_setup]
def train(
    model: TinyTransformer,
    data: LMData,
    cfg: TrainConfig,
    device: torch.device,
    *,
    resume: dict[str, Any] | None = None,
    mirror: Mirror | None = None,
) -> TrainResult:
    """Train for cfg.epochs; evaluate, log and checkpoint on the way; resume exactly.

    ``mirror``, a W&B run, gets every logged value too, and each step's tokens/s.
    """
    out = Path(cfg.output_dir)
    batches_per_epoch = len(data.train) // cfg.global_batch_size
    plan = plan_steps(batches_per_epoch, cfg, samples=len(data.train))
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    step = 0
    if resume is not None:  # put back everything that decides what happens next
        step = restore_training_state(resume, model, optimizer, device=device)
    plan.check_steps_left(step)
    history = resume["history"] if resume else None
    logger = MetricsLogger(out, history=history, resume_step=step, mirror=mirror)
    remove_stale_temps(out / "checkpoints")  # left by a save that was killed mid-write
    # --8<-- [end:train_setup]

    # --8<-- [start:checkpoint_and_eval]
    def checkpoint() -> Path:
        logger.flush()
        epoch = step // plan.steps_per_epoch
        state = training_state(model=model, optimizer=optimizer, cfg=cfg, step=step,
                               epoch=epoch, device=device, history=logger.records)  # fmt: skip
        return save_checkpoint(state, out / "checkpoints" / f"{checkpoint_name(step)}.pt")

    def show_heldout(tokens_per_second: float | None = None) -> None:
        tqdm.write(log_heldout(model, data, logger, step=step, plan=plan, cfg=cfg,
                               device=device, tokens_per_second=tokens_per_second))  # fmt: skip

    # --8<-- [end:checkpoint_and_eval]

    # --8<-- [start:loop]
    if step == 0:
        show_heldout()  # the untrained model's score: about ln(vocab_size)
    tokens_per_step = cfg.global_batch_size * data.train.block_size
    hide_bar = None if cfg.progress is None else not cfg.progress  # None: tqdm decides (tty)
    bar = tqdm(
        total=plan.stop_at, initial=step, disable=hide_bar, desc="training", unit="step",
        leave=False,
    )  # fmt: skip
    start, trained_seconds, first_step = time.perf_counter(), 0.0, step
    final = None

    def order(epoch: int) -> list[list[int]]:  # the same shuffle on a resume: seed and epoch
        return epoch_batches(len(data.train), cfg.global_batch_size, seed=cfg.seed, epoch=epoch)

    for epoch, indices in plan.batches(step, order):
        t0 = time.perf_counter()
        x, y = get_batch(data.train, indices, device)
        lr = lr_at(step, cfg, plan.total_steps)
        result = train_step(
            loss_fn=lambda inputs, targets: model(inputs, targets)[1],  # (logits, loss)
            micro_batches=[(x, y)], optimizer=optimizer, lr=lr,
            max_norm=cfg.grad_clip, clip_params=model.parameters(),
        )  # fmt: skip
        step += 1
        seconds = time.perf_counter() - t0
        trained_seconds += seconds
        logger.log(
            step, "train", loss=result.loss, lr=lr, grad_norm=result.grad_norm, epoch=epoch + 1,
            measured={"tokens_per_second": tokens_per_step / seconds},
        )  # fmt: skip
        bar.update()
        bar.set_postfix(loss=f"{result.loss:.3f}")
        if step % cfg.eval_every == 0 or step == plan.total_steps:  # not at an early stop:
            show_heldout((step - first_step) * tokens_per_step / trained_seconds)  # resumes match
        if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
            final = checkpoint()
    bar.close()
    logger.close()
    plot_loss_curves({"TinyTransformer": logger.records}, out / "loss_curve.png")
    heldout = [r["loss"] for r in logger.records if r["split"] == "heldout"]
    steps_run = step - first_step
    return TrainResult(
        steps=step,
        seconds=time.perf_counter() - start,
        tokens_per_second=steps_run * tokens_per_step / max(trained_seconds, 1e-9),
        first_heldout_loss=heldout[0],
        final_heldout_loss=heldout[-1],
        final_checkpoint=final,
        history=logger.records,
    )


# --8<-- [end:loop]

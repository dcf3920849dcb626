# --8<-- [start:config]
"""The training loop, written by hand: no Trainer, every step visible.

Launch:  python code/scripts/train_tiny_transformer.py --epochs 2
"""

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tinyscale.core.checkpoint import save_checkpoint
from tinyscale.core.data import LMData, TokenBlocks
from tinyscale.core.errors import UsageError
from tinyscale.core.metrics import MetricsLogger, plot_loss_curves
from tinyscale.core.model import TinyTransformer


@dataclasses.dataclass(kw_only=True)
class TrainConfig:
    """Everything about *how* we train (the model's shape lives in ModelConfig)."""

    epochs: int = 2
    batch_size: int = 16  # blocks per optimizer step
    lr: float = 3e-3  # peak learning rate, reached after warmup
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm
    seed: int = 0
    eval_every: int = 50  # steps between held-out evaluations
    checkpoint_every: int = 100  # steps between checkpoints (one is always saved at the end)
    max_steps: int | None = (
        None  # stop early, as if interrupted; the schedule still spans all epochs
    )
    output_dir: str = "runs/lab1"
    progress: bool | None = None  # progress bar: None shows it only in a terminal

    def __post_init__(self) -> None:
        positive = ["epochs", "batch_size", "eval_every", "checkpoint_every"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise UsageError(f"--max-steps must be positive, got {self.max_steps}")
        if self.warmup_steps < 0 or self.grad_clip <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise UsageError("need --warmup-steps >= 0, grad_clip > 0 and 0 <= min_lr_ratio <= 1")


# --8<-- [end:config]


# --8<-- [start:device]
DEVICES = ("auto", "cpu", "mps", "cuda")


def select_device(name: str = "auto") -> torch.device:
    """cuda if there is a GPU, else mps on an Apple-silicon Mac, else cpu; or exactly what was asked."""
    if name not in DEVICES:
        raise UsageError(f"unknown device '{name}': use one of {', '.join(DEVICES)}")
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
    }
    if name == "auto":
        return torch.device(next(d for d in ("cuda", "mps", "cpu") if available[d]))
    if not available[name]:
        raise UsageError(
            f"device '{name}' is not available on this machine: use --device auto or cpu"
        )
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Same seed, same initial weights, same dropout masks, same data order."""
    random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU generator and every CUDA/MPS device


# --8<-- [end:device]


# --8<-- [start:schedule]
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


# --8<-- [start:batches]
def epoch_batches(
    num_samples: int, batch_size: int, *, seed: int, epoch: int
) -> list[torch.Tensor]:
    """This epoch's batches of sample indices: a fresh shuffle per epoch, reproducible from
    (seed, epoch) alone, so a resumed run can skip to batch k of epoch e. Drops the last
    incomplete batch, so every step sees the same number of tokens."""
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator)
    usable = num_samples - num_samples % batch_size
    return list(order[:usable].split(batch_size)) if usable else []


def get_batch(
    dataset: TokenBlocks, indices: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [dataset[i] for i in indices.tolist()]
    x = torch.stack([p[0] for p in pairs]).to(device)  # (B, T) input token ids
    y = torch.stack([p[1] for p in pairs]).to(device)  # (B, T) the next token at each position
    return x, y


# --8<-- [end:batches]


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


def progress_line(
    step: int,
    total_steps: int,
    steps_per_epoch: int,
    records: list[dict[str, Any]],
    eval_every: int,
    scores: dict[str, float],
    tokens_per_second: float | None = None,
) -> str:
    """The line printed at each evaluation: where we are, recent train loss, held-out scores."""
    recent = [r["loss"] for r in records[-eval_every - 1 :] if r["split"] == "train"]
    line = f"step {step:4d}/{total_steps} | epoch {step / steps_per_epoch:4.2f}"
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
) -> TrainResult:
    """Train for cfg.epochs; evaluate, log and checkpoint on the way; resume exactly."""
    out = Path(cfg.output_dir)
    steps_per_epoch = len(data.train) // cfg.batch_size
    if steps_per_epoch == 0:
        raise UsageError(
            f"batch size {cfg.batch_size} exceeds the {len(data.train)} training blocks: lower --batch-size"
        )
    total_steps = cfg.epochs * steps_per_epoch
    stop_at = min(total_steps, cfg.max_steps or total_steps)
    model.to(device).train()
    optimizer = make_optimizer(model, cfg)
    step = 0
    if resume is not None:  # put back everything that decides what happens next
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        torch.set_rng_state(resume["rng_cpu"])  # dropout masks continue where they stopped
        if device.type == "cuda" and resume["rng_device"] is not None:  # saved on a GPU too
            torch.cuda.set_rng_state(resume["rng_device"])
        step = resume["step"]
    if step >= stop_at:
        raise UsageError(
            f"the checkpoint is at step {step}, the end of this run: raise --epochs to train further"
        )
    logger = MetricsLogger(out, history=resume["history"] if resume else None, resume_step=step)
    # --8<-- [end:train_setup]

    # --8<-- [start:checkpoint_and_eval]
    def checkpoint() -> Path:
        logger.flush()
        return save_checkpoint(
            {
                "model_config": dataclasses.asdict(model.cfg),
                "train_config": dataclasses.asdict(cfg),
                "step": step,
                "epoch": step // steps_per_epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng_cpu": torch.get_rng_state(),
                "rng_device": torch.cuda.get_rng_state() if device.type == "cuda" else None,
                "history": logger.records,
            },
            out / "checkpoints" / f"step_{step:06d}.pt",
        )

    def log_heldout(tokens_per_second: float | None = None) -> None:
        metrics = evaluate(model, data.heldout, batch_size=cfg.batch_size, device=device)
        logger.log(step, "heldout", **metrics)
        tqdm.write(
            progress_line(
                step,
                total_steps,
                steps_per_epoch,
                logger.records,
                cfg.eval_every,
                metrics,
                tokens_per_second,
            )
        )

    # --8<-- [end:checkpoint_and_eval]

    # --8<-- [start:loop]
    if step == 0:
        log_heldout()  # the untrained model's score: about ln(vocab_size)
    tokens_per_step = cfg.batch_size * data.train.block_size
    hide_bar = None if cfg.progress is None else not cfg.progress  # None: tqdm decides (tty)
    bar = tqdm(
        total=stop_at, initial=step, disable=hide_bar, desc="training", unit="step", leave=False
    )
    start, trained_seconds, first_step = time.perf_counter(), 0.0, step
    final = None
    while step < stop_at:
        epoch, batch_in_epoch = divmod(step, steps_per_epoch)
        batches = epoch_batches(len(data.train), cfg.batch_size, seed=cfg.seed, epoch=epoch)
        for indices in batches[batch_in_epoch:]:
            t0 = time.perf_counter()
            x, y = get_batch(data.train, indices, device)
            lr = lr_at(step, cfg, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            _, loss = model(x, y)  # forward: builds the autograd graph
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # backward: fills p.grad for every parameter
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()  # update: p -= lr * adam_direction(p.grad)
            step += 1
            trained_seconds += time.perf_counter() - t0
            logger.log(
                step, "train", loss=loss.item(), lr=lr, grad_norm=grad_norm.item(), epoch=epoch + 1
            )
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step % cfg.eval_every == 0 or step == total_steps:  # not at an early stop:
                log_heldout(
                    (step - first_step) * tokens_per_step / trained_seconds
                )  # resumes match
            if step % cfg.checkpoint_every == 0 or step == stop_at:
                final = checkpoint()
            if step == stop_at:
                break
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

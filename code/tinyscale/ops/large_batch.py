# --8<-- [start:header]
"""Large batches: how to scale the learning rate, why warm up, and when a bigger batch stops helping.

Launch:  python -m tinyscale.ops.large_batch

k times the GPUs means k times the batch: each step sees k times more samples, so the
run takes k times fewer steps for the same data. To cover the same distance in fewer
steps, each step must be bigger: the *linear scaling rule* (Goyal et al. 2017, "Accurate,
Large Minibatch SGD: Training ImageNet in 1 Hour") multiplies SGD's learning rate by k
and reaches it through a *warmup*, because the first steps of a fresh model are where a
large learning rate diverges. For Adam, the rule that keeps the training dynamics the
same is the *square root* rule, lr × √k (Malladi et al. 2022, "On the SDEs and Scaling
Rules for Adaptive Gradient Algorithms"). Neither rule holds beyond the *critical batch
size* (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"), which the
gradient noise scale B_noise = tr(Σ) / |G|² estimates: above it, k times the batch no
longer buys k times fewer steps.
"""

import dataclasses
import math
from collections.abc import Sequence

import torch

from tinyscale.core.accumulation import scaled_lr
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import LMData, build_datasets, epoch_batches, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, evaluate, lr_at, make_optimizer, seed_everything

# --8<-- [end:header]


# --8<-- [start:rules]
def linear_lr(*, base_lr: float, base_batch: int, batch: int) -> float:
    """SGD: k times the batch, k times the learning rate (Goyal et al. 2017)."""
    return scaled_lr(base_lr=base_lr, base_batch=base_batch, batch=batch)


def sqrt_lr(*, base_lr: float, base_batch: int, batch: int) -> float:
    """Adam: k times the batch, √k times the learning rate (Malladi et al. 2022)."""
    return base_lr * math.sqrt(batch / base_batch)


def noise_scale(*, small: int, sq_norm_small: float, big: int, sq_norm_big: float) -> float:
    """B_noise = tr(Σ) / |G|² from the mean squared gradient norm at two batch sizes.

    A batch of B samples gives the true gradient G plus noise of covariance Σ / B, so
    E|g_B|² = |G|² + tr(Σ) / B: a line in 1/B. Two batch sizes give its two unknowns
    (McCandlish et al. 2018, appendix A.1).
    """
    if not 0 < small < big:
        raise UsageError(f"need 0 < small < big batch sizes, got {small} and {big}")
    true_sq = (big * sq_norm_big - small * sq_norm_small) / (big - small)  # |G|²
    trace = (sq_norm_small - sq_norm_big) / (1 / small - 1 / big)  # tr(Σ)
    return trace / true_sq


# --8<-- [end:rules]


# --8<-- [start:recipe]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """One way to train on the same samples: batch size, peak learning rate, warmup."""

    name: str
    batch_size: int
    lr: float
    warmup_fraction: float  # of the run's steps, linear from ~0 to lr; then cosine decay


def recipes(*, base_batch: int, base_lr: float, k: int) -> list[Recipe]:
    """The baseline, and k times its batch with each way of setting the learning rate."""
    big = base_batch * k
    lin = linear_lr(base_lr=base_lr, base_batch=base_batch, batch=big)
    root = sqrt_lr(base_lr=base_lr, base_batch=base_batch, batch=big)
    return [
        Recipe(name=f"B={base_batch}, lr {base_lr:.3g}", batch_size=base_batch, lr=base_lr, warmup_fraction=0.2),
        Recipe(name=f"B={big}, same lr", batch_size=big, lr=base_lr, warmup_fraction=0.2),
        Recipe(name=f"B={big}, linear lr {lin:.3g}, no warmup", batch_size=big, lr=lin, warmup_fraction=0),
        Recipe(name=f"B={big}, linear lr {lin:.3g}, warmup", batch_size=big, lr=lin, warmup_fraction=0.2),
        Recipe(name=f"B={big}, sqrt lr {root:.3g}, warmup", batch_size=big, lr=root, warmup_fraction=0.2),
    ]  # fmt: skip


# --8<-- [end:recipe]


# --8<-- [start:train]
def train_recipe(recipe: Recipe, data: LMData, *, samples: int, seed: int = 0) -> dict[str, float]:
    """Train a fresh TinyTransformer on `samples` blocks with this recipe; held-out loss.

    Lab 1's pieces (optimizer, schedule, batches, its step, evaluation), not its loop: no
    checkpoints or logs, only what differs between recipes. Same seed: same initial weights.
    """
    steps = samples // recipe.batch_size
    if steps < 2:
        raise UsageError(
            f"{samples} samples give {steps} step(s) of {recipe.batch_size}: raise --samples"
        )
    seed_everything(seed)
    model = TinyTransformer(ModelConfig(max_position_embeddings=data.train.block_size))
    cfg = TrainConfig(global_batch_size=recipe.batch_size, lr=recipe.lr, seed=seed,
                      warmup_steps=round(recipe.warmup_fraction * steps))  # fmt: skip
    optimizer = make_optimizer(model, cfg)
    batches = epoch_batches(len(data.train), recipe.batch_size, seed=seed, epoch=0)
    model.train()
    for step, indices in enumerate(batches[:steps]):
        result = train_step(
            loss_fn=lambda inputs, targets: model(inputs, targets)[1],
            micro_batches=[get_batch(data.train, indices, torch.device("cpu"))],
            optimizer=optimizer, lr=lr_at(step, cfg, steps),
            max_norm=cfg.grad_clip, clip_params=model.parameters(),
        )  # fmt: skip
    heldout = evaluate(model, data.heldout, batch_size=64, device=torch.device("cpu"))["loss"]
    return {"steps": steps, "final_train_loss": result.loss, "heldout_loss": heldout}


# --8<-- [end:train]


# --8<-- [start:measure_noise]
def mean_sq_grad_norm(model: TinyTransformer, data: LMData, *, batch: int, draws: int) -> float:
    """E|g_B|²: the squared norm of the mini-batch gradient, averaged over `draws` batches."""
    model.eval()  # no dropout: the only noise is which samples the batch holds
    generator = torch.Generator().manual_seed(batch)
    total = 0.0
    for _ in range(draws):
        indices = torch.randint(len(data.train), (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        model(*get_batch(data.train, indices, torch.device("cpu")))[1].backward()
        total += sum(p.grad.pow(2).sum().item() for p in model.parameters())
    model.zero_grad(set_to_none=True)
    return total / draws


def measured_noise_scale(data: LMData, *, small: int = 4, big: int = 64, draws: int = 16) -> float:
    """B_noise of a freshly initialised TinyTransformer on our corpus."""
    seed_everything(0)
    model = TinyTransformer(ModelConfig(max_position_embeddings=data.train.block_size))
    sq_small = mean_sq_grad_norm(model, data, batch=small, draws=draws)
    sq_big = mean_sq_grad_norm(model, data, batch=big, draws=draws)
    return noise_scale(small=small, sq_norm_small=sq_small, big=big, sq_norm_big=sq_big)


# --8<-- [end:measure_noise]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-batch", type=int, default=8)
    parser.add_argument("--base-lr", type=float, default=1e-3)
    parser.add_argument("--k", type=int, default=4, help="the large batch is k x --base-batch")
    parser.add_argument("--samples", type=int, default=960, help="blocks of 64 tokens per run")
    args = parser.parse_args(argv)
    if args.base_batch < 1 or args.k < 2 or not args.base_lr > 0:
        raise UsageError("need --base-batch >= 1, --k >= 2 and --base-lr > 0")
    torch.set_num_threads(1)  # the same arithmetic on every machine: comparable losses
    data = build_datasets(vocab_size=1024, block_size=64)
    print(f"every run sees the same {args.samples} samples ({args.samples * 64:,} tokens)")
    print(f"{'recipe':<36} {'steps':>5} {'held-out loss':>14}")
    for recipe in recipes(base_batch=args.base_batch, base_lr=args.base_lr, k=args.k):
        r = train_recipe(recipe, data, samples=args.samples)
        print(f"{recipe.name:<36} {r['steps']:>5} {r['heldout_loss']:>14.3f}")
    print(
        f"gradient noise scale at initialisation: B_noise = {measured_noise_scale(data):.0f} samples"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]

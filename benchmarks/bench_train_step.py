"""Training-step throughput of TinyTransformer: depth and batch size, side by side.

Run:  make bench   (or: python benchmarks/bench_train_step.py)

Answers Lab 1's "per second" question with a measurement instead of one run's log line:
every variant is timed in the same process, interleaved round by round, so machine
noise hits all of them alike. Reports tokens/s and the ratio to the default config.
"""

import dataclasses
import statistics
import time

import torch

from tinyscale.core.config import load_model_config
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, make_optimizer

ROUNDS, STEPS, WARMUP = 5, 10, 3


def variants() -> dict[str, tuple]:
    base = load_model_config()
    return {
        "default (2 layers, batch 16)": (base, 16),
        "4 layers, batch 16": (dataclasses.replace(base, num_hidden_layers=4), 16),
        "2 layers, batch 32": (base, 32),
        "hidden 128, batch 16": (
            dataclasses.replace(base, hidden_size=128, intermediate_size=512),
            16,
        ),
    }


LIMITS = """\
Here: one process, one thread; a step is bound by matmuls too small to reach the core's
peak and by per-op Python overhead. On a GPU a model this small is bound by kernel
launches; throughput grows with batch size until the GPU is full, far beyond this range."""


def main() -> None:
    torch.manual_seed(0)
    setups = {}
    for name, (cfg, batch) in variants().items():
        model = TinyTransformer(cfg)
        opt = make_optimizer(model, TrainConfig())
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.max_position_embeddings))
        setups[name] = (model, opt, x)

    def step(model: TinyTransformer, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        _, loss = model(x, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for model, opt, x in setups.values():
        for _ in range(WARMUP):
            step(model, opt, x)
    rates: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(ROUNDS):  # interleave variants, round by round
        for name, (model, opt, x) in setups.items():
            t0 = time.perf_counter()
            for _ in range(STEPS):
                step(model, opt, x)
            rates[name].append(STEPS * x.numel() / (time.perf_counter() - t0))
    baseline = statistics.median(rates[next(iter(rates))])
    print(
        f"{'variant':<30} {'tokens/s':>10} {'ratio':>7}   (median of {ROUNDS} rounds x {STEPS} steps)"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<30} {median:>10,.0f} {median / baseline:>6.2f}x")


if __name__ == "__main__":
    main()

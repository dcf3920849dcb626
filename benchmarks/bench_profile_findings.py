"""The profiling page's findings acted on: dropout, AdamW's kernels, torch.compile, width.

Run:  make bench   (or: python benchmarks/bench_profile_findings.py)

First one profile of the Lab model's CPU step (where the time goes), then every change the
profile suggests, timed side by side in one process, interleaved round by round so that
machine noise hits all variants alike: tokens/s, the ratio to the Lab's step, and the
FLOP/s the model's formula (6 N + 12 L T d per token) says each variant achieves, as a
share of this CPU's measured matmul peak (MFU). One thread, as the tests and figures run.
"""

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from tinyscale.core.config import load_model_config
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig, make_optimizer
from tinyscale.workflows.mfu import flops_per_token, matmul_peak
from tinyscale.workflows.profiling import (
    MATMULS,
    RNG,
    ProfileConfig,
    attention_kernel,
    build,
    grouped_times,
    profile_steps,
    share_of,
    train_step,
    with_kernels,
)

ROUNDS, STEPS, WARMUP = 5, 5, 2


def profile_lines() -> list[str]:
    """Where the Lab step's time goes (one profile of 3 steps), and the shares it claims."""
    prof, _, _ = profile_steps(ProfileConfig(trace_dir=ProfileConfig.trace_dir / "bench"))
    times = grouped_times(prof)
    total = sum(times.values())
    parts = ", ".join(f"{part} {100 * t / total:.0f} %" for part, t in times.items())
    return [
        f"profile of the Lab step (dropout 0.1, for-loop AdamW): {parts}",
        f"matmuls {100 * share_of(prof, MATMULS):.0f} %, dropout's bernoulli_ "
        f"{100 * share_of(prof, RNG):.0f} %, attention kernel: {attention_kernel(prof)}",
    ]


def wider(hidden: int) -> Callable[[], tuple]:
    """The Lab step with a wider model: hidden ``hidden``, FFN 4x, same depth and heads."""

    def make() -> tuple:
        torch.manual_seed(0)
        cfg = dataclasses.replace(load_model_config(), hidden_size=hidden,
                                  intermediate_size=4 * hidden)  # fmt: skip
        model = TinyTransformer(cfg)
        opt = with_kernels(make_optimizer(model, TrainConfig()), "fused")
        _, _, batch = build(ProfileConfig())
        return model, opt, batch

    return make


def compiled() -> tuple:
    model, opt, batch = build(ProfileConfig(dropout=0.0, adamw="fused"))
    return torch.compile(model), opt, batch  # compiles on the first call (warmup)


VARIANTS: dict[str, Callable[[], tuple]] = {
    "Lab step (dropout 0.1, for-loop AdamW)": lambda: build(ProfileConfig()),
    "dropout 0 (fused attention, no RNG)": lambda: build(ProfileConfig(dropout=0.0)),
    "AdamW foreach=True": lambda: build(ProfileConfig(adamw="foreach")),
    "AdamW fused=True": lambda: build(ProfileConfig(adamw="fused")),
    "dropout 0 + fused AdamW": lambda: build(ProfileConfig(dropout=0.0, adamw="fused")),
    "dropout 0 + fused AdamW + torch.compile": compiled,
    "dropout 0.1, fused AdamW, hidden 128": wider(128),
    "dropout 0.1, fused AdamW, hidden 256": wider(256),
}


LIMITS = """\
Here: one thread; MFU is measured against that thread's own fp32 matmul peak, and the
wider models reach more of it because their matmuls are bigger. On a GPU the peak is the
data sheet's dense bf16 figure, far above what a model this small can use: the same
fixes (no dropout RNG, fused optimizer, compile) matter more there, launches being dearer."""


def main() -> None:
    torch.set_num_threads(1)
    for line in profile_lines():
        print(line)
    setups, flops = {}, {}
    for name, make in VARIANTS.items():
        model, opt, batch = make()
        try:
            for _ in range(WARMUP):
                train_step(model, opt, batch)
        except Exception as err:  # torch.compile needs a C++ compiler: say so, go on
            print(f"{name}: skipped, {type(err).__name__}: {str(err).splitlines()[0][:80]}")
            continue
        setups[name] = (model, opt, batch)
        cfg = getattr(model, "_orig_mod", model).cfg
        flops[name] = flops_per_token(cfg, batch[0].shape[1])
    rates: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(ROUNDS):  # interleave the variants, round by round
        for name, (model, opt, batch) in setups.items():
            t0 = time.perf_counter()
            for _ in range(STEPS):
                train_step(model, opt, batch)
            rates[name].append(STEPS * batch[0].numel() / (time.perf_counter() - t0))
    peak = matmul_peak()
    baseline = statistics.median(rates[next(iter(rates))])
    print(f"{'variant':<42} {'tokens/s':>9} {'ratio':>6} {'GFLOP/s':>8} {'MFU':>6}")
    for name, values in rates.items():
        rate = statistics.median(values)
        achieved = rate * flops[name]
        print(f"{name:<42} {rate:>9,.0f} {rate / baseline:>5.2f}x "
              f"{achieved / 1e9:>8.2f} {100 * achieved / peak:>5.1f}%")  # fmt: skip
    print(f"(median of {ROUNDS} rounds x {STEPS} steps, batch 16 x 64 tokens, 1 thread; "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s, torch {torch.__version__})")  # fmt: skip


if __name__ == "__main__":
    main()

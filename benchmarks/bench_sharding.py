"""Tokens/s of our ZeRO-3, FSDP2 (fp32 and bf16 compute) and DeepSpeed ZeRO-3, side by side.

Run:  make bench   (or: python benchmarks/bench_sharding.py)

Two ranks (gloo over loopback) train the same TinyTransformer, sharded four ways, in the
same two processes; the rounds interleave them, so machine noise hits them alike, and
each figure is the median over rounds, timed by the slowest rank. Week 2's pages prove
the four compute the same thing (fp32); this measures what each costs on a CPU.
"""

import contextlib
import copy
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from bench_zero import BATCH, CFG, SEQ, WORLD  # the same model and batch as our ZeRO's bench
from timing import rates_by_round

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.fsdp import make_mesh, shard_model
from tinyscale.data_parallel.zero import ZeRO

ROUNDS, STEPS, WARMUP = 5, 2, 1
VARIANTS = ("our ZeRO-3", "FSDP2", "FSDP2 bf16", "DeepSpeed ZeRO-3")


def build(name: str, base: TinyTransformer):
    """A step function for one variant, on its own copy of the model."""
    model = copy.deepcopy(base)
    if name == "our ZeRO-3":
        zero = ZeRO(model, stage=3, units=list(model.blocks), lr=1e-4)
        return lambda x, y: (zero(x, y)[1].backward(), zero.step(), zero.zero_grad())
    if name.startswith("FSDP2"):
        shard_model(model, make_mesh(WORLD), precision="bf16" if name.endswith("bf16") else "fp32")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        return lambda x, y: (model(x, y)[1].backward(), opt.step(), opt.zero_grad())
    import deepspeed

    from tinyscale.compat.deepspeed_config import (
        DS_CONFIG_DIR,
        load_ds_config,
        skip_unused_shm_build,
    )

    skip_unused_shm_build()
    config = load_ds_config(DS_CONFIG_DIR / "zero3.json", precision="fp32")
    config.update(train_micro_batch_size_per_gpu=BATCH, gradient_accumulation_steps=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=opt, config=config, dist_init_required=False
    )
    return lambda x, y: (engine.backward(engine(x, y)[1]), engine.step())


def measure(rounds: int = ROUNDS, steps: int = STEPS) -> dict[str, list[float]]:
    """On every rank: tokens/s per variant and round (the slowest rank's time)."""
    torch.manual_seed(0)
    base = TinyTransformer(CFG)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints; keep stdout for the table
        steppers = {name: build(name, base) for name in VARIANTS}
    x, y = random_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)
    return rates_by_round(
        {name: functools.partial(step, x, y) for name, step in steppers.items()},
        rounds=rounds, steps_per_round=steps, warmup=WARMUP, tokens_per_step=WORLD * BATCH * SEQ,
    )  # fmt: skip


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    """Median tokens/s of each variant over the rounds."""
    return {name: statistics.median(rates[name]) for name in VARIANTS}


def table(tokens_per_s: dict[str, float]) -> list[str]:
    """The rows printed for one run: tokens/s and the ratio to our ZeRO-3."""
    base = tokens_per_s[VARIANTS[0]]
    lines = [f"{'variant':<18} {'tokens/s':>9} {'vs our ZeRO-3':>14}"]
    for name in VARIANTS:
        lines.append(f"{name:<18} {tokens_per_s[name]:>9,.0f} {tokens_per_s[name] / base:>13.2f}x")
    return lines


FOOTER = (
    f"(world size {WORLD}, gloo, batch {BATCH}x{SEQ} per rank, median of {ROUNDS} rounds "
    f"x {STEPS} steps, torch {torch.__version__})"
)


def run(rounds: int = ROUNDS, steps: int = STEPS) -> dict[str, float]:
    """One run of the benchmark on WORLD spawned ranks: median tokens/s per variant."""
    rates = run_on_ranks(measure, WORLD, rounds, steps, timeout_s=120, deadline_s=400)[0]
    return medians(rates)


LIMITS = """\
Here: two ranks on two cores, fp32 on a CPU (bf16 only halves the bytes gloo moves and
the copies); the libraries' overlap machinery has no idle hardware to use. On GPUs with
NCCL, FSDP2 and DeepSpeed prefetch on CUDA streams of their own and compute in bf16 on
tensor cores: expect them, not a from-scratch Python wrapper, to lead."""


def main() -> None:
    print("\n".join([*table(run()), FOOTER]))


if __name__ == "__main__":
    main()

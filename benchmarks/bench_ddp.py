"""Tokens/s of our DDPs (naive, bucketed, overlapped, views) vs torch DDP, across bucket sizes.

Run:  make bench   (or: python benchmarks/bench_ddp.py)

Two ranks (gloo over loopback, one thread each) train the same TinyTransformer from the
same init. Every variant lives in the same two processes, and the rounds interleave them
(round 1: A B C ..., round 2: A B C ...), so machine noise hits all of them alike; each
variant's figure is the median over rounds, and its spread is that of the per-round ratio
to torch DDP (both measured in the same round). At the sweep's 5 and 25 MB points the
ablation of step 4 (tinyscale.data_parallel.ddp_views) adds one change at a time to the
overlapped DDP: gradients as bucket views, a 1 MB first bucket, lean hooks. Used by
tools/figures_week1_ddp.py for the tables and the bucket-size plot on
docs/week-1/ddp-from-scratch.md.
"""

import functools
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from timing import rates_by_round

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import NaiveDDP, random_batch
from tinyscale.data_parallel.ddp_buckets import BucketedDDP, OverlappedDDP
from tinyscale.data_parallel.ddp_views import ablation

# Big enough that gradients (4.2 M parameters, 16 MB) take real time to all-reduce,
# small enough that a step takes ~0.1 s on one core.
CFG = preset("bench")
BATCH, SEQ, WORLD = 4, 32, 2
ROUNDS, STEPS, WARMUP = 15, 3, 1
SWEEP_MB = (0.01, 0.1, 1.0, 5.0, 25.0)
ABLATION_MB = (5.0, 25.0)  # the sweep points where step 4's changes are measured one by one
STEPS_OF_4 = list(ablation())[1:]  # after "copy (step 3)", which is the sweep's overlapped row


def variants(sweep: tuple[float, ...]) -> dict[str, tuple[str, float]]:
    """Name -> (kind, bucket_cap_mb). Ours overlapped at 25 MB is both a row and a sweep point.

    The ablation's rows join at the sweep's points in ABLATION_MB, with torch DDP at its
    defaults (bucket_cap_mb=None: 25 MB, and a 1 MB first bucket).
    """
    out = {
        "torch DDP": ("torch", 25.0),
        "ours: naive (1 all-reduce per tensor)": ("naive", 0.0),
        "ours: bucketed, no overlap": ("bucketed", 25.0),
    }
    for cap in sweep:
        out[f"ours: overlapped, {cap:g} MB"] = ("overlapped", cap)
    ablated = [cap for cap in sweep if cap in ABLATION_MB]
    if ablated:
        out["torch DDP, defaults (1 MB first bucket)"] = ("torch default", 25.0)
    for cap in ablated:
        for kind in STEPS_OF_4:
            out[f"ours: {kind}, {cap:g} MB"] = (kind, cap)
    return out


def wrap(kind: str, model: torch.nn.Module, cap: float) -> torch.nn.Module:
    if kind == "torch":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    if kind == "torch default":  # bucket_cap_mb=None: torch's only way to a small first bucket
        return torch.nn.parallel.DistributedDataParallel(model)
    if kind in STEPS_OF_4:
        return ablation()[kind](model, cap)
    if kind == "naive":
        return NaiveDDP(model)
    return (BucketedDDP if kind == "bucketed" else OverlappedDDP)(model, bucket_cap_mb=cap)


def measure(specs: dict[str, tuple[str, float]], rounds: int, steps: int) -> dict:
    """On every rank: tokens/s of every variant, per round (the slowest rank's time)."""
    torch.manual_seed(0)
    base = TinyTransformer(CFG)
    models, opts = {}, {}
    for name, (kind, cap) in specs.items():
        models[name] = model = wrap(kind, TinyTransformer(CFG), cap)
        model.module.load_state_dict(base.state_dict())
        opts[name] = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = random_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)

    def step(name: str) -> None:
        _, loss = models[name](*batch)
        loss.backward()
        if hasattr(models[name], "finish_gradient_synchronization"):
            models[name].finish_gradient_synchronization()
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)

    rates = rates_by_round(
        {name: functools.partial(step, name) for name in specs}, rounds=rounds,
        steps_per_round=steps, warmup=WARMUP, tokens_per_step=dist.get_world_size() * BATCH * SEQ,
    )  # fmt: skip
    params = sum(p.numel() for p in base.parameters())
    return {"rates": rates, "params": params, "grad_mb": params * 4 / 2**20}


def rows(
    *, sweep: tuple[float, ...] = SWEEP_MB, rounds: int = ROUNDS, steps: int = STEPS
) -> list[dict]:
    """One row per variant: name, kind, bucket_cap_mb, median tokens/s, ratio to torch DDP.

    ``ratio_quartiles``: min, 25th percentile, median, 75th, max of the per-round ratio
    to torch DDP (the same round's torch DDP): the spread of ``vs_torch``.
    """
    specs = variants(sweep)
    fn = functools.partial(measure, specs, rounds, steps)
    result = run_on_ranks(fn, WORLD, timeout_s=120, deadline_s=300)[0]
    rates = result["rates"]
    medians = {name: statistics.median(r) for name, r in rates.items()}
    return [
        {
            "variant": name,
            "kind": kind,
            "bucket_cap_mb": cap,
            "tokens_per_s": medians[name],
            "vs_torch": medians[name] / medians["torch DDP"],
            "ratio_quartiles": quartiles(
                [a / b for a, b in zip(rates[name], rates["torch DDP"], strict=True)]
            ),
            "grad_mb": result["grad_mb"],
        }
        for name, (kind, cap) in specs.items()
    ]


def quartiles(values: list[float]) -> list[float]:
    """Min, lower quartile, median, upper quartile, max (one value: five times itself)."""
    if len(values) == 1:
        return values * 5
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [min(values), q1, q2, q3, max(values)]


def report(table: list[dict]) -> str:
    lines = [f"{'variant':<50} {'tokens/s':>9} {'vs torch DDP':>13}  per-round IQR"]
    for r in table:
        _, q1, _, q3, _ = r["ratio_quartiles"]
        lines.append(
            f"{r['variant']:<50} {r['tokens_per_s']:>9,.0f} {r['vs_torch']:>12.2f}x"
            f"  {q1:.2f}-{q3:.2f}"
        )
    lines.append(
        f"(world size {WORLD}, gloo, {table[0]['grad_mb']:.1f} MB of gradients, batch {BATCH}x{SEQ}"
        f" per rank, median of {ROUNDS} rounds x {STEPS} steps, torch {torch.__version__})"
    )
    return "\n".join(lines)


LIMITS = """\
Here: two ranks on two cores, and gloo's all-reduce is CPU work (copies over loopback)
that competes with the backward it overlaps; one copy of the 16 MB of gradients is a small
share of a step, so the gains of views, first bucket and lean hooks sit inside the spread.
On GPUs with NCCL the all-reduce runs on its own stream and links while backward computes:
overlap pays, and views also save a full copy of the gradients in GPU memory."""


def main() -> None:
    print(report(rows()))


if __name__ == "__main__":
    main()

"""Tokens/s of our DDPs (naive, bucketed, overlapped) vs torch DDP, and across bucket sizes.

Run:  make bench   (or: python benchmarks/bench_ddp.py)

Two ranks (gloo over loopback, one thread each) train the same TinyTransformer from the
same init. Every variant lives in the same two processes, and the rounds interleave them
(round 1: A B C ..., round 2: A B C ...), so machine noise hits all of them alike; each
variant's figure is the median over rounds. Used by tools/figures_week1_ddp.py for the
table and the bucket-size plot on docs/week-1/ddp-from-scratch.md.
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

# Big enough that gradients (4.2 M parameters, 16 MB) take real time to all-reduce,
# small enough that a step takes ~0.1 s on one core.
CFG = preset("bench")
BATCH, SEQ, WORLD = 4, 32, 2
ROUNDS, STEPS, WARMUP = 15, 2, 1
SWEEP_MB = (0.01, 0.1, 1.0, 5.0, 25.0)


def variants(sweep: tuple[float, ...]) -> dict[str, tuple[str, float]]:
    """Name -> (kind, bucket_cap_mb). Ours overlapped at 25 MB is both a row and a sweep point."""
    out = {
        "torch DDP": ("torch", 25.0),
        "ours: naive (1 all-reduce per tensor)": ("naive", 0.0),
        "ours: bucketed, no overlap": ("bucketed", 25.0),
    }
    for cap in sweep:
        out[f"ours: overlapped, {cap:g} MB"] = ("overlapped", cap)
    return out


def wrap(kind: str, model: torch.nn.Module, cap: float) -> torch.nn.Module:
    if kind == "torch":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
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
    """One row per variant: name, kind, bucket_cap_mb, median tokens/s, ratio to torch DDP."""
    specs = variants(sweep)
    fn = functools.partial(measure, specs, rounds, steps)
    result = run_on_ranks(fn, WORLD, timeout_s=120, deadline_s=300)[0]
    medians = {name: statistics.median(r) for name, r in result["rates"].items()}
    return [
        {
            "variant": name,
            "kind": kind,
            "bucket_cap_mb": cap,
            "tokens_per_s": medians[name],
            "vs_torch": medians[name] / medians["torch DDP"],
            "grad_mb": result["grad_mb"],
        }
        for name, (kind, cap) in specs.items()
    ]


def report(table: list[dict]) -> str:
    lines = [f"{'variant':<40} {'tokens/s':>9} {'vs torch DDP':>13}"]
    for r in table:
        lines.append(f"{r['variant']:<40} {r['tokens_per_s']:>9,.0f} {r['vs_torch']:>12.2f}x")
    lines.append(
        f"(world size {WORLD}, gloo, {table[0]['grad_mb']:.1f} MB of gradients, batch {BATCH}x{SEQ}"
        f" per rank, median of {ROUNDS} rounds x {STEPS} steps, torch {torch.__version__})"
    )
    return "\n".join(lines)


def main() -> None:
    print(report(rows()))


if __name__ == "__main__":
    main()

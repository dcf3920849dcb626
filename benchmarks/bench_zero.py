"""Tokens/s and bytes sent per step of our ZeRO stages 0-3, and stage 3 with prefetching.

Run:  make bench   (or: python benchmarks/bench_zero.py)

Two ranks (gloo over loopback, one thread each) train the same TinyTransformer with
ZeRO stages 0 (DDP), 1, 2 and 3 (tinyscale.data_parallel.zero) and stage 3 with
prefetching (tinyscale.data_parallel.zero_prefetch). All live in the same two processes
and the rounds interleave them, so machine noise hits them alike; each figure is the
median over rounds, and the spread is the range of the per-round ratio to stage 0 (the
middle half of the rounds: the 25th to the 75th percentile). Bytes per step are counted
by wrapping the collectives (tinyscale.comm.counter.CollectiveCounter), as in the tests;
the peak is the largest model-state footprint the wrapper sampled in the step.
Used by tools/figures_week2_zero_bench.py for docs/week-2/zero-from-scratch.md.
"""

import functools
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from timing import rates_by_round

from tinyscale.comm.collectives import ring_reduce_scatter
from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.zero import ZeRO
from tinyscale.data_parallel.zero_prefetch import PrefetchZeRO3

CFG = preset("bench")
BATCH, SEQ, WORLD = 4, 32, 2
ROUNDS, STEPS, WARMUP = 15, 4, 1
VARIANTS = ("0 (DDP)", "1", "2", "3", "3 + prefetch", "3 + prefetch, async RS")
COLLECTIVES = ("gloo all_reduce", "gloo reduce_scatter", "gloo all_gather", "ring reduce_scatter")


def build(name: str, model: torch.nn.Module) -> ZeRO:
    units = list(model.blocks)
    if name.startswith("3 + prefetch"):
        rs = "async" if name.endswith("async RS") else "ring"
        return PrefetchZeRO3(model, units=units, prefetch=1, reduce_scatter=rs, lr=1e-4)
    return ZeRO(model, stage=int(name[0]), units=units, lr=1e-4)


def collective_ms(numel: int, rounds: int, calls: int = 10) -> dict[str, float]:
    """On every rank: milliseconds per call of each collective on one block's gradients,
    median of interleaved rounds (the slowest rank's time)."""
    full, mine = torch.randn(numel), torch.empty(numel // WORLD)
    calls_by_name = {
        "gloo all_reduce": lambda: dist.all_reduce(full),
        "gloo reduce_scatter": lambda: dist.reduce_scatter_single(mine, full),
        "gloo all_gather": lambda: dist.all_gather_single(full, mine),
        "ring reduce_scatter": lambda: ring_reduce_scatter(full, check=False),
    }
    times: dict[str, list[float]] = {name: [] for name in COLLECTIVES}
    for _ in range(rounds):
        for name in COLLECTIVES:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                calls_by_name[name]()
            elapsed = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[name].append(elapsed.item() / calls * 1e3)
    return {name: statistics.median(times[name]) for name in COLLECTIVES}


def measure(rounds: int = ROUNDS, steps: int = STEPS) -> dict:
    """On every rank: tokens/s per variant and round (the slowest rank's time), bytes per step."""
    torch.manual_seed(0)
    zeros = {name: build(name, TinyTransformer(CFG)) for name in VARIANTS}
    batch = random_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)

    def step(name: str) -> None:
        zeros[name](*batch)[1].backward()
        zeros[name].step()
        zeros[name].zero_grad()

    sent = {}
    for name in VARIANTS:
        step(name)  # the prefetching one records its order in its first step
        with CollectiveCounter() as counter:
            step(name)
        sent[name] = counter.sent_bytes()
    rates = rates_by_round(
        {name: functools.partial(step, name) for name in VARIANTS}, rounds=rounds,
        steps_per_round=steps, warmup=WARMUP, tokens_per_step=dist.get_world_size() * BATCH * SEQ,
    )  # fmt: skip
    peaks = {name: zero.peak_state_bytes for name, zero in zeros.items()}
    block = zeros["3"].units[0].flat.numel()
    ms = collective_ms(block, rounds)
    return {"rates": rates, "sent": sent, "peak": peaks, "ms": ms, "block_bytes": 4 * block}


def rows(*, rounds: int = ROUNDS, steps: int = STEPS) -> list[dict]:
    """One row per variant; the last row holds the collectives' milliseconds."""
    result = run_on_ranks(measure, WORLD, rounds, steps, timeout_s=120, deadline_s=600)[0]
    rates, base = result["rates"], result["rates"][VARIANTS[0]]
    out = []
    for name in VARIANTS:
        ratios = sorted(r / b for r, b in zip(rates[name], base, strict=True))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out.append(
            {
                "variant": name,
                "tokens_per_s": statistics.median(rates[name]),
                "vs_stage0": statistics.median(ratios),
                "vs_stage0_q1": quartiles[0],
                "vs_stage0_q3": quartiles[2],
                "bytes_sent_per_step": result["sent"][name],
                "peak_bytes": result["peak"][name],
            }
        )
    return [*out, {"collective_ms": result["ms"], "block_bytes": result["block_bytes"]}]


def report(table: list[dict], *, rounds: int = ROUNDS) -> str:
    *variants, last = table
    head = f"{'stage':<23} {'tokens/s':>9} {'vs stage 0':>11} {'middle half':>12}"
    lines = [head + f" {'MB sent/step/rank':>18} {'peak MB':>8}"]
    for r in variants:
        spread = f"{r['vs_stage0_q1']:.2f}-{r['vs_stage0_q3']:.2f}"
        lines.append(
            f"{r['variant']:<23} {r['tokens_per_s']:>9,.0f} {r['vs_stage0']:>10.2f}x"
            f" {spread:>12} {r['bytes_sent_per_step'] / 1e6:>18.2f} {r['peak_bytes'] / 1e6:>8.2f}"
        )
    lines.append("")
    block = f"one block, {last['block_bytes'] / 1e6:.2f} MB"
    lines.append(f"{block:<23} {'ms per call':>11}")
    for name, ms in last["collective_ms"].items():
        lines.append(f"{name:<23} {ms:>11.2f}")
    lines.append(
        f"(world size {WORLD}, gloo, fp32, batch {BATCH}x{SEQ} per rank, median of "
        f"{rounds} interleaved rounds x {STEPS} steps, torch {torch.__version__})"
    )
    return "\n".join(lines)


LIMITS = """\
Here: two ranks on two cores, so communication is CPU work (gloo's threads copying over
loopback) that competes with the computation it overlaps; prefetching recovers the time
a rank waited, not the cycles the bytes cost. On GPUs with NCCL the gathers and
reduce-scatters run on their own CUDA streams and links while the SMs compute: with units
whose compute outlasts their gather, stage 3 runs close to DDP's speed."""


def main() -> None:
    print(report(rows()))


if __name__ == "__main__":
    main()

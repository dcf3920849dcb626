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

Why stage 3 is slower, in two numbers (``bounds``): its collectives' time per step if none
of it overlapped computation (the bytes it sends with each collective, at the rate that
collective reached alone on one block), against stage 0's; and the CPU time of its step,
all ranks and threads together, which two cores cannot run in less than half of.
Used by tools/figures_week2_zero_bench.py for docs/week-2/zero-from-scratch.md.
"""

import functools
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from timing import cpu_seconds, rates_by_round

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
OPS = {  # what CollectiveCounter logs -> the collective timed on one block
    "all_reduce": "gloo all_reduce",
    "reduce_scatter_single": "gloo reduce_scatter",
    "all_gather_single": "gloo all_gather",
    "isend": "ring reduce_scatter",  # the ring's messages: its reduce-scatter is the only user
}
BOUNDED = "3 + prefetch"  # the variant whose distance from stage 0 ``bounds`` explains


def build(name: str, model: torch.nn.Module) -> ZeRO:
    units = list(model.blocks)
    if name.startswith("3 + prefetch"):
        rs = "async" if name.endswith("async RS") else "ring"
        return PrefetchZeRO3(model, units=units, prefetch=1, reduce_scatter=rs, lr=1e-4)
    return ZeRO(model, stage=int(name[0]), units=units, lr=1e-4)


def collective_ms(numel: int, rounds: int, calls: int = 10) -> dict[str, dict[str, float]]:
    """On every rank: milliseconds per call of each collective on one block's gradients,
    median of interleaved rounds (the slowest rank's time), and its CPU milliseconds (all
    ranks' threads together)."""
    full, mine = torch.randn(numel), torch.empty(numel // WORLD)
    calls_by_name = {
        "gloo all_reduce": lambda: dist.all_reduce(full),
        "gloo reduce_scatter": lambda: dist.reduce_scatter_single(mine, full),
        "gloo all_gather": lambda: dist.all_gather_single(full, mine),
        "ring reduce_scatter": lambda: ring_reduce_scatter(full, check=False),
    }
    times: dict[str, list[float]] = {name: [] for name in COLLECTIVES}
    cpus: dict[str, list[float]] = {name: [] for name in COLLECTIVES}
    for _ in range(rounds):
        for name in COLLECTIVES:
            dist.barrier()
            t0, c0 = time.perf_counter(), cpu_seconds()
            for _ in range(calls):
                calls_by_name[name]()
            elapsed = torch.tensor(time.perf_counter() - t0)
            used = torch.tensor(cpu_seconds() - c0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            dist.all_reduce(used)
            times[name].append(elapsed.item() / calls * 1e3)
            cpus[name].append(used.item() / calls * 1e3)
    return {
        "ms": {name: statistics.median(times[name]) for name in COLLECTIVES},
        "cpu_ms": {name: statistics.median(cpus[name]) for name in COLLECTIVES},
    }


def measure(rounds: int = ROUNDS, steps: int = STEPS) -> dict:
    """On every rank: tokens/s per variant and round (the slowest rank's time), bytes per step."""
    torch.manual_seed(0)
    zeros = {name: build(name, TinyTransformer(CFG)) for name in VARIANTS}
    batch = random_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)

    def step(name: str) -> None:
        zeros[name](*batch)[1].backward()
        zeros[name].step()
        zeros[name].zero_grad()

    sent, by_op = {}, {}
    for name in VARIANTS:
        step(name)  # the prefetching one records its order in its first step
        with CollectiveCounter() as counter:
            step(name)
        sent[name], by_op[name] = counter.sent_bytes(), {}
        for call in counter.calls:
            if call.sent_bytes():
                by_op[name][call.op] = by_op[name].get(call.op, 0.0) + call.sent_bytes()
    cpu: dict[str, list[float]] = {}
    rates = rates_by_round(
        {name: functools.partial(step, name) for name in VARIANTS}, rounds=rounds,
        steps_per_round=steps, warmup=WARMUP, tokens_per_step=dist.get_world_size() * BATCH * SEQ,
        cpu_s=cpu,
    )  # fmt: skip
    peaks = {name: zero.peak_state_bytes for name, zero in zeros.items()}
    block = zeros["3"].units[0].flat.numel()
    ms = collective_ms(block, rounds)
    return {"rates": rates, "sent": sent, "by_op": by_op, "cpu": cpu, "peak": peaks,
            "ms": ms["ms"], "cpu_ms": ms["cpu_ms"], "block_bytes": 4 * block}  # fmt: skip


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
                "sent_by_op": result["by_op"][name],
                "cpu_s_per_step": statistics.median(result["cpu"][name]),
                "peak_bytes": result["peak"][name],
            }
        )
    last = {"collective_ms": result["ms"], "collective_cpu_ms": result["cpu_ms"]}
    last |= {"block_bytes": result["block_bytes"]}
    return [*out, last | {"cores": os.cpu_count()}]


def collectives_alone_s(row: dict, last: dict, *, key: str = "collective_ms") -> float:
    """Seconds per step of a variant's collectives if nothing overlapped them: the bytes it
    sends with each collective, at the rate that collective reached alone on one block
    (``key="collective_cpu_ms"``: the CPU seconds they cost, all ranks together)."""
    seconds = 0.0
    for op, sent in row["sent_by_op"].items():
        per_call = last["block_bytes"] * (WORLD - 1) / WORLD * (2 if op == "all_reduce" else 1)
        seconds += sent / per_call * last[key][OPS[op]] / 1e3
    return seconds


def bounds(table: list[dict]) -> dict:
    """Stage 3 with prefetching against stage 0: step times, collectives alone, CPU, ratios.

    ``no_overlap``: the ratio if stage 3's extra collective time added to stage 0's step in
    full. ``same_busy``: the ratio if stage 3 kept the cores as busy as stage 0 does, so
    that time grows with CPU work (C0 / C3). ``cpu_bound``: the ratio if the cores never
    idled, T0 / (C3 / cores): no schedule on this machine beats it.
    """
    *variants, last = table
    by_name = {row["variant"]: row for row in variants}
    base, bounded = by_name[VARIANTS[0]], by_name[BOUNDED]
    tokens, cores = WORLD * BATCH * SEQ, last["cores"]
    t0, t3 = tokens / base["tokens_per_s"], tokens / bounded["tokens_per_s"]
    k0, k3 = collectives_alone_s(base, last), collectives_alone_s(bounded, last)
    c0, c3 = base["cpu_s_per_step"], bounded["cpu_s_per_step"]
    cpu_k0, cpu_k3 = (
        collectives_alone_s(r, last, key="collective_cpu_ms") for r in (base, bounded)
    )
    return {
        "step_s": [t0, t3], "collectives_s": [k0, k3], "cpu_s": [c0, c3],
        "collectives_cpu_s": [cpu_k0, cpu_k3],
        "busy": [c0 / cores / t0, c3 / cores / t3], "measured": bounded["vs_stage0"],
        "no_overlap": t0 / (t0 + k3 - k0), "same_busy": c0 / c3, "cpu_bound": t0 / (c3 / cores),
    }  # fmt: skip


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
    lines.append(f"{block:<23} {'ms per call':>11} {'CPU ms':>7}")
    for name, ms in last["collective_ms"].items():
        lines.append(f"{name:<23} {ms:>11.2f} {last['collective_cpu_ms'][name]:>7.2f}")
    b = bounds(table)
    lines += ["", f"{'per step':<23} {'stage 0':>9} {BOUNDED:>13}"]
    for label, key in (("step (ms)", "step_s"), ("collectives alone (ms)", "collectives_s")):
        lines.append(f"{label:<23} {b[key][0] * 1e3:>9.1f} {b[key][1] * 1e3:>13.1f}")
    cpu = f"CPU, {WORLD} ranks (ms)"
    lines.append(f"{cpu:<23} {b['cpu_s'][0] * 1e3:>9.1f} {b['cpu_s'][1] * 1e3:>13.1f}")
    cpu = "... of it collectives"
    lines.append(
        f"{cpu:<23} {b['collectives_cpu_s'][0] * 1e3:>9.1f} {b['collectives_cpu_s'][1] * 1e3:>13.1f}"
    )
    busy = f"{last['cores']} cores busy"
    lines.append(f"{busy:<23} {b['busy'][0]:>9.0%} {b['busy'][1]:>13.0%}")
    lines.append(
        f"{BOUNDED} / stage 0: measured {b['measured']:.2f}x; if its extra collective time "
        f"overlapped nothing {b['no_overlap']:.2f}x;"
    )
    lines.append(
        f"at stage 0's busy cores {b['same_busy']:.2f}x; with every core busy throughout "
        f"{b['cpu_bound']:.2f}x"
    )
    lines.append(
        f"(world size {WORLD}, gloo, fp32, batch {BATCH}x{SEQ} per rank, median of "
        f"{rounds} interleaved rounds x {STEPS} steps, torch {torch.__version__})"
    )
    return "\n".join(lines)


LIMITS = """\
Here: two ranks on two cores, so communication is CPU work (gloo's threads copying over
loopback) that competes with the computation it overlaps; prefetching recovers the time
a rank waited, not the cycles the bytes cost: stage 3's step does more CPU work than
stage 0's, and at stage 0's busy cores runs at their ratio (the last lines). On GPUs with NCCL the gathers and
reduce-scatters run on their own CUDA streams and links while the SMs compute: with units
whose compute outlasts their gather, stage 3 runs close to DDP's speed."""


def main() -> None:
    print(report(rows()))


if __name__ == "__main__":
    main()

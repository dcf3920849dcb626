"""Tokens/s and bytes sent per step of our ZeRO stages 0-3, side by side.

Run:  make bench   (or: python benchmarks/bench_zero.py)

Two ranks (gloo over loopback, one thread each) train the same TinyTransformer with
ZeRO stages 0 (DDP), 1, 2 and 3 (tinyscale.data_parallel.zero). All four live in the same two
processes and the rounds interleave them, so machine noise hits them alike; each
figure is the median over rounds. Bytes per step are counted by wrapping the
collectives (tinyscale.comm.counter.CollectiveCounter), as in the tests.
"""

import functools
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from timing import rates_by_round

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.zero import ZERO_STAGES, ZeRO

CFG = preset("bench")
BATCH, SEQ, WORLD = 4, 32, 2
ROUNDS, STEPS, WARMUP = 7, 2, 1


def measure(rounds: int = ROUNDS, steps: int = STEPS) -> dict:
    """On every rank: tokens/s per stage and round (the slowest rank's time), bytes per step."""
    torch.manual_seed(0)
    zeros = {}
    for stage in ZERO_STAGES:
        model = TinyTransformer(CFG)
        zeros[stage] = ZeRO(model, stage=stage, units=list(model.blocks), lr=1e-4)
    batch = random_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)

    def step(stage: int) -> None:
        zeros[stage](*batch)[1].backward()
        zeros[stage].step()
        zeros[stage].zero_grad()

    sent = {}
    for stage in ZERO_STAGES:
        with CollectiveCounter() as counter:
            step(stage)
        sent[stage] = counter.sent_bytes()
    rates = rates_by_round(
        {stage: functools.partial(step, stage) for stage in ZERO_STAGES}, rounds=rounds,
        steps_per_round=steps, warmup=WARMUP, tokens_per_step=dist.get_world_size() * BATCH * SEQ,
    )  # fmt: skip
    return {"rates": rates, "sent": sent}


def rows(*, rounds: int = ROUNDS, steps: int = STEPS) -> list[dict]:
    result = run_on_ranks(measure, WORLD, rounds, steps, timeout_s=120, deadline_s=300)[0]
    base = statistics.median(result["rates"][0])
    return [
        {
            "stage": stage,
            "tokens_per_s": statistics.median(result["rates"][stage]),
            "vs_stage0": statistics.median(result["rates"][stage]) / base,
            "bytes_sent_per_step": result["sent"][stage],
        }
        for stage in ZERO_STAGES
    ]


def report(table: list[dict]) -> str:
    lines = [f"{'stage':<14} {'tokens/s':>9} {'vs stage 0':>11} {'MB sent/step/rank':>18}"]
    for r in table:
        name = "0 (DDP)" if r["stage"] == 0 else str(r["stage"])
        lines.append(
            f"{name:<14} {r['tokens_per_s']:>9,.0f} {r['vs_stage0']:>10.2f}x"
            f" {r['bytes_sent_per_step'] / 1e6:>18.2f}"
        )
    lines.append(
        f"(world size {WORLD}, gloo, fp32, batch {BATCH}x{SEQ} per rank, median of "
        f"{ROUNDS} rounds x {STEPS} steps, torch {torch.__version__})"
    )
    return "\n".join(lines)


def main() -> None:
    print(report(rows()))


if __name__ == "__main__":
    main()

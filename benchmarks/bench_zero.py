"""Tokens/s and bytes sent per step of our ZeRO stages 0-3, side by side.

Run:  make bench   (or: python benchmarks/bench_zero.py)

Two ranks (gloo over loopback, one thread each) train the same TinyTransformer with
ZeRO stages 0 (DDP), 1, 2 and 3 (tinyscale.data_parallel.zero). All four live in the same two
processes and the rounds interleave them, so machine noise hits them alike; each
figure is the median over rounds. Bytes per step are counted by wrapping the
collectives (tinyscale.data_parallel.zero_vs_ddp.counting_collectives), as in the tests.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this file

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp import rank_batch
from tinyscale.data_parallel.zero import STAGES, ZeRO
from tinyscale.data_parallel.zero_vs_ddp import counting_collectives, ring_bytes_sent

CFG = preset("bench")
BATCH, SEQ, WORLD = 4, 32, 2
ROUNDS, STEPS, WARMUP = 7, 2, 1


def measure(rounds: int = ROUNDS, steps: int = STEPS) -> dict:
    """On every rank: tokens/s per stage and round (the slowest rank's time), bytes per step."""
    torch.manual_seed(0)
    zeros = {}
    for stage in STAGES:
        model = TinyTransformer(CFG)
        zeros[stage] = ZeRO(model, stage=stage, units=list(model.blocks), lr=1e-4)
    batch = rank_batch(CFG, batch_size=BATCH, seq_len=SEQ, step=0, seed=0)

    def step(stage: int) -> None:
        zeros[stage](*batch)[1].backward()
        zeros[stage].step()
        zeros[stage].zero_grad()

    sent = {}
    for stage in STAGES:
        for _ in range(WARMUP):
            step(stage)
        log: list = []
        with counting_collectives(log):
            step(stage)
        sent[stage] = sum(ring_bytes_sent(op, n, ranks) for op, n, ranks in log)
    tokens = dist.get_world_size() * BATCH * SEQ * steps
    rates: dict[int, list[float]] = {stage: [] for stage in STAGES}
    for _ in range(rounds):
        for stage in STAGES:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(stage)
            elapsed = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            rates[stage].append(tokens / elapsed.item())
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
        for stage in STAGES
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

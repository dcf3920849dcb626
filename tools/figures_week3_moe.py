"""Regenerate the measurements of docs/week-3/moe.md: the course model dense, dense and wide,
and as a mixture of experts balanced three ways, trained on the same data.

Run:  python tools/figures_week3_moe.py   (about 3 minutes on 2 CPU cores; part of `make figures`)

Each variant runs tinyscale.expert_parallel.moe_compare.train_variant for STEPS steps (one
schedule, held-out loss every EVAL_EVERY steps) in this one process, one thread, with
moe_compare's default MoE (8 experts, top 1, dropless). Then, on each trained MoE, the
drop rate on 64 held-out blocks for each capacity factor, and the tokens per expert.
Writes, under docs/generated/week3/: moe_curves.json (everything), moe_curves.png (the plots),
moe_compare.md and moe_balance.md (the tables the page includes).
tests/docs/test_generated_week3_moe.py re-runs the first EVAL_EVERY steps of two variants
and compares them with the JSON, and rebuilds the tables from it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from tinyscale.core.data import build_datasets
from tinyscale.expert_parallel.moe import parameter_counts
from tinyscale.expert_parallel.moe_compare import (
    BALANCING,
    VARIANTS,
    build,
    drop_rates,
    step_flops,
    train_variant,
)
from tinyscale.expert_parallel.moe_routing import MoEConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week3"
STEPS, EVAL_EVERY = 200, 20
FACTORS = (1.0, 1.25, 1.5, 2.0, None)  # None: dropless


def factor_name(factor: float | None) -> str:
    return "dropless" if factor is None else f"{factor:g}"


def compare_table(runs: dict) -> str:
    """Markdown: each variant's size, cost and final held-out loss."""
    rows = [
        "| variant | parameters | used per token | GFLOP per step | held-out loss, end |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant, run in runs.items():
        rows.append(
            f"| {variant} | {run['parameters']:,} | {run['active']:,} "
            f"| {run['flops'] / 1e9:.2f} | {run['curve'][-1][1]:.3f} |"
        )
    return "\n".join(rows) + "\n"


def balance_table(runs: dict) -> str:
    """Markdown: load max/mean at the start and end of training, and the drop rates."""
    head = " | ".join(f"dropped, C×{f:g}" if f else "dropped, dropless" for f in FACTORS)
    rows = [f"| balance | max/mean, steps 1-{EVAL_EVERY} | max/mean, end | {head} |",
            "|---|---:|---:|" + "---:|" * len(FACTORS)]  # fmt: skip
    for variant, run in runs.items():
        if variant not in BALANCING:
            continue
        rates = " | ".join(f"{run['drop_rate'][factor_name(f)]:.1%}" for f in FACTORS)
        rows.append(
            f"| {BALANCING[variant]} | {run['imbalance'][0][1]:.2f} "
            f"| {run['imbalance'][-1][1]:.2f} | {rates} |"
        )
    return "\n".join(rows) + "\n"


def plot(runs: dict, path: Path) -> None:
    fig, (by_flop, by_param, uneven, histogram) = plt.subplots(1, 4, figsize=(17, 4))
    for variant in ("dense", "dense-wide", "moe"):
        run = runs[variant]
        steps, losses = zip(*run["curve"], strict=True)
        by_flop.plot([s * run["flops"] / 1e12 for s in steps], losses, marker=".", label=variant)
        by_param.scatter(run["parameters"], losses[-1], label=variant)
    by_flop.set(xlabel="training TFLOP", ylabel="held-out loss", title="Per FLOP")
    by_param.set(xlabel="parameters", ylabel=f"held-out loss after {STEPS} steps",
                 title="Per parameter")  # fmt: skip
    for variant, balance in BALANCING.items():
        uneven.plot(*zip(*runs[variant]["imbalance"], strict=True), marker=".", label=balance)
    uneven.axhline(1.0, color="grey", linewidth=0.8)
    uneven.set(xlabel="step", ylabel="tokens per expert, max / mean", title="Balance")
    width = 0.8 / len(BALANCING)
    for i, (variant, balance) in enumerate(BALANCING.items()):
        load = runs[variant]["load"][-1]  # the last layer, trained, on 4,096 held-out tokens
        histogram.bar([e + i * width for e in range(len(load))], load, width, label=balance)
    histogram.axhline(sum(load) / len(load), color="grey", linewidth=0.8)
    histogram.set(xlabel="expert", ylabel="tokens", title="Tokens per expert, last layer, end")
    for ax in (by_flop, by_param, uneven, histogram):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    torch.set_num_threads(1)
    data = build_datasets(vocab_size=1024, block_size=64)
    moe = MoEConfig()
    runs = {}
    for variant in VARIANTS:
        fresh = build(variant, data, moe)  # sizes and FLOPs, before training
        total, active = parameter_counts(fresh)
        result = train_variant(variant, data, moe, steps=STEPS, eval_every=EVAL_EVERY)
        run = {
            "parameters": total,
            "active": active,
            "flops": step_flops(fresh, data),
            "curve": [list(p) for p in result.curve],
            "cpu_seconds_per_step": round(result.seconds_per_step, 4),
        }
        if variant in BALANCING:
            drops = drop_rates(result.model, data, FACTORS)
            run["imbalance"] = [list(p) for p in result.imbalance]
            run["drop_rate"] = {factor_name(f): r for f, r in drops["drop_rate"].items()}
            run["load"] = drops["load"]
        runs[variant] = run
        print(f"{variant}: {run['curve'][-1][1]:.3f}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {
        "steps": STEPS,
        "eval_every": EVAL_EVERY,
        "moe": dataclasses.asdict(moe),
        "runs": runs,
    }
    (OUT / "moe_curves.json").write_text(json.dumps(payload, indent=1) + "\n")
    (OUT / "moe_compare.md").write_text(compare_table(runs))
    (OUT / "moe_balance.md").write_text(balance_table(runs))
    plot(runs, OUT / "moe_curves.png")
    print(f"wrote {OUT.relative_to(ROOT)}/moe_curves.{{json,png}}, moe_compare.md, moe_balance.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate the ZeRO memory figure of docs/week-2/zero-from-scratch.md.

Run:  python tools/figures_week2_memory.py   (about 30 s on 2 CPU cores)

For world sizes 1, 2 and 4, trains FIG_CFG one AdamW step with ZeRO stages 0-3
(tinyscale.data_parallel.zero_vs_ddp.compare_stages) and records, on rank 0, the model-state bytes held
after the step (counted from the tensors) and the peak model-state bytes sampled inside
the step (at every gather, reduce-scatter and optimizer step). Activations are not part
of these numbers. Writes docs/generated/week2/zero_memory.json and zero_memory.png.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.config import preset
from tinyscale.data_parallel.memory_calculator import zero_state_bytes
from tinyscale.data_parallel.zero_vs_ddp import compare_stages

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week2"
# Six blocks and a small vocabulary: the blocks hold most parameters, as in a real LLM,
# so sharding them one at a time is what decides stage 3's peak.
FIG_CFG = preset("tiny", hidden_size=64, num_hidden_layers=6, intermediate_size=256,
                 max_position_embeddings=32)  # fmt: skip
WORLDS = (1, 2, 4)


def measure() -> dict:
    rows = []
    for world in WORLDS:
        fn = functools.partial(compare_stages, cfg=FIG_CFG, steps=1, seq_len=32)
        r = run_on_ranks(fn, world, deadline_s=300)[0]
        for stage in range(4):
            s = r[stage]
            formula = zero_state_bytes(r["numel"], stage=stage, world_size=world)
            rows.append({"world": world, "stage": stage, "held": sum(s["held"]),
                         "peak": s["peak"], "formula": formula.total,
                         "sent_per_step": s["sent"]})  # fmt: skip
    return {"params": r["numel"], "precision": "fp32", "rows": rows}


def plot(data: dict) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(WORLDS)
    for k, world in enumerate(WORLDS):
        rows = [r for r in data["rows"] if r["world"] == world]
        xs = [r["stage"] + (k - 1) * width for r in rows]
        ax.bar(xs, [r["held"] / 2**20 for r in rows], width, label=f"N = {world}: held")
        ax.scatter(xs, [r["peak"] / 2**20 for r in rows], color="k", marker="_", s=200, zorder=3)
    ax.scatter([], [], color="k", marker="_", s=200, label="peak inside the step")
    ax.set_xticks(range(4), ["stage 0 (DDP)", "stage 1", "stage 2", "stage 3"])
    ax.set_ylabel("model-state MiB per rank")
    ax.set_title(f"ZeRO from scratch: {data['params']:,} parameters, fp32 AdamW, gloo")
    ax.set_ylim(top=1.3 * max(r["peak"] for r in data["rows"]) / 2**20)  # room for the legend
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "zero_memory.png", dpi=120)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    data = measure()
    (OUT / "zero_memory.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data)
    print(f"wrote {OUT}/zero_memory.json, zero_memory.png")


if __name__ == "__main__":
    main()

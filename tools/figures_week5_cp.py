"""Regenerate the memory and bytes of docs/week-5/context-parallel.md: ring attention and the
all-gather of keys and values, per rank, against the sequence length.

Run:  python tools/figures_week5_cp.py   (about 20 s on 2 CPU cores; part of `make figures`)

For each world size in WORLDS (gloo ranks started by run_on_ranks) and each sequence length
in LENGTHS, tinyscale.context_parallel.allgather_kv.measure runs one attention layer (batch 1,
2 heads of 16 channels, fp32, head-tail split) forward and backward with each variant, and
rank 0 reports the bytes saved for backward (saved-tensor hooks) and the bytes it sent
(CollectiveCounter), beside their formulas. World size 1 is one process (the ring with no
neighbour). Writes, under docs/generated/week5/: cp_memory.json (everything), cp_memory.png
(saved bytes per rank against the length) and cp_memory.md (the table the page includes).
tests/tinyscale/context_parallel/test_context_parallel.py re-runs one point and compares.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tinyscale.comm.launch import run_on_ranks
from tinyscale.context_parallel.allgather_kv import VARIANTS, measure

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week5"
WORLDS = (1, 2, 4)
LENGTHS = (256, 512, 1024, 2048, 4096)


def measure_lengths(lengths: tuple[int, ...]) -> list[dict]:
    """On every rank: both variants at every length (one process: the ring only)."""
    import torch.distributed as dist

    variants = ["ring"] if dist.get_world_size() == 1 else list(VARIANTS)
    rows = []
    for variant in variants:
        for seq_len in lengths:
            m = measure(variant, seq_len)
            rows.append({"variant": variant, "seq_len": seq_len, **m})
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| variant | ranks | T | saved for backward, per rank | formula | sent per rank (fwd + bwd) | formula |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = "one process" if r["world"] == 1 else r["variant"]
        lines.append(
            f"| {name} | {r['world']} | {r['seq_len']:,} | {r['saved']:,} | {r['saved formula']:,} "
            f"| {sum(r['sent']):,.0f} | {sum(r['sent formula']):,} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for world in WORLDS:
        for variant in VARIANTS:
            points = [r for r in rows if r["world"] == world and r["variant"] == variant]
            if not points:
                continue
            label = "one process" if world == 1 else f"{variant}, {world} ranks"
            style = "-" if variant == "ring" else "--"
            ax.plot([r["seq_len"] for r in points], [r["saved"] / 1024 for r in points], style,
                    marker="o", label=label)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("KiB saved for backward, per rank")
    ax.set_title("One attention layer (2 heads x 16, fp32), rank 0")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for world in WORLDS:
        for r in run_on_ranks(measure_lengths, world, LENGTHS)[0]:
            rows.append({"world": world, **r, "sent": list(r["sent"]),
                         "sent formula": list(r["sent formula"])})  # fmt: skip
    data = {"worlds": WORLDS, "lengths": LENGTHS, "rows": rows}
    (OUT / "cp_memory.json").write_text(json.dumps(data, indent=1) + "\n")
    (OUT / "cp_memory.md").write_text(table(rows))
    plot(rows, OUT / "cp_memory.png")
    print(table(rows))


if __name__ == "__main__":
    main()

"""Regenerate the loss curves of docs/week-3/fp8.md: the course model trained in fp32, bf16
and fp8 (tensorwise, rowwise, delayed, unscaled) on the same data.

Run:  python tools/figures_week3_fp8.py   (about 3 minutes on 2 CPU cores; part of `make figures`)

Each variant runs tinyscale.low_precision.compare.train_variant for STEPS steps (one
schedule, held-out loss every EVAL_EVERY steps) in this one process, one thread. Writes,
under docs/generated/week3/: fp8_curves.json (every curve and CPU seconds per step),
fp8_curves.png (the plot) and fp8_curves.md (the final losses, the table the page
includes). tests/docs/test_generated_week3_fp8.py re-runs the first EVAL_EVERY steps of
two variants and compares them with the curves, and rebuilds the table from the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from tinyscale.core.data import build_datasets
from tinyscale.low_precision.compare import VARIANTS, train_variant

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week3"
STEPS, EVAL_EVERY = 200, 20


def table(curves: dict[str, list[list[float]]]) -> str:
    """Markdown: each variant's final held-out loss, and its gap to fp32."""
    base = curves["fp32"][-1][1]
    rows = [
        "| variant | held-out loss, step 0 | held-out loss, end | vs fp32 |",
        "|---|---:|---:|---:|",
    ]
    for variant, curve in curves.items():
        rows.append(
            f"| {variant} | {curve[0][1]:.3f} | {curve[-1][1]:.3f} | {curve[-1][1] - base:+.3f} |"
        )
    return "\n".join(rows) + "\n"


def main() -> int:
    torch.set_num_threads(1)
    data = build_datasets(vocab_size=1024, block_size=64)
    results = {v: train_variant(v, data, steps=STEPS, eval_every=EVAL_EVERY) for v in VARIANTS}
    curves = {v: [list(p) for p in r.curve] for v, r in results.items()}
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {
        "steps": STEPS,
        "eval_every": EVAL_EVERY,
        "curves": curves,
        "cpu_seconds_per_step": {v: round(r.seconds_per_step, 4) for v, r in results.items()},
    }
    (OUT / "fp8_curves.json").write_text(json.dumps(payload, indent=1) + "\n")
    (OUT / "fp8_curves.md").write_text(table(curves))
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant, curve in curves.items():
        ax.plot(*zip(*curve, strict=True), marker=".", label=variant)
    ax.set(xlabel="step", ylabel="held-out loss", title="Same data, same seed: fp32, bf16, fp8")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "fp8_curves.png", dpi=120)
    print(f"wrote {OUT.relative_to(ROOT)}/fp8_curves.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

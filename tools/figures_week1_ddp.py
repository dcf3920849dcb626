"""Regenerate the benchmark tables and the bucket-size plot of docs/week-1/ddp-from-scratch.md.

Run:  python tools/figures_week1_ddp.py

Runs benchmarks/bench_ddp.py's measurement once (about 2 minutes on 2 CPU cores: 2 ranks
over gloo) and writes docs/generated/week1/ddp_bench.md (steps 1-3 and the bucket sweep),
ddp_ablation.md (step 4, one change at a time), ddp_bench.json (every row) and
ddp_bucket_sweep.png (tokens/s vs bucket size). Timings: run it on a quiet machine.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week1"


def load_bench():
    path = ROOT / "benchmarks" / "bench_ddp.py"
    spec = importlib.util.spec_from_file_location("bench_ddp", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ddp"] = module  # the spawned ranks find it by this name
    spec.loader.exec_module(module)
    return module


LESSON = ("torch", "naive", "bucketed", "overlapped")  # steps 1-3; the rest is step 4's ablation


def iqr(r: dict) -> str:
    """The per-round ratio's middle half: 25th to 75th percentile over the rounds."""
    _, q1, _, q3, _ = r["ratio_quartiles"]
    return f"{q1:.2f}–{q3:.2f}"


def caption(bench, rows: list[dict]) -> str:
    return (
        f"*World size {bench.WORLD} on 2 CPU cores (gloo over loopback, 1 thread per rank), "
        f"{rows[0]['grad_mb']:.1f} MB of fp32 gradients, batch {bench.BATCH}×{bench.SEQ} tokens "
        f"per rank; median of {bench.ROUNDS} interleaved rounds × {bench.STEPS} steps; "
        "per-round IQR: the middle half of the rounds' ratios to the same round's torch DDP "
        "(min and max in ddp_bench.json). Recorded by `python tools/figures_week1_ddp.py`.*"
    )


def table(bench, rows: list[dict]) -> str:
    lines = [
        "| variant | bucket cap | tokens/s | vs torch DDP | per-round IQR |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["kind"] not in LESSON:
            continue
        cap = "—" if r["kind"] == "naive" else f"{r['bucket_cap_mb']:g} MB"
        lines.append(
            f"| {r['variant']} | {cap} | {r['tokens_per_s']:,.0f} | {r['vs_torch']:.2f}× "
            f"| {iqr(r)} |"
        )
    return "\n".join([*lines, "", caption(bench, rows)]) + "\n"


def ablation_table(bench, rows: list[dict]) -> str:
    """Step 3's copying DDP, then one change at a time, at each of the ablation's caps."""
    caps = list(bench.ABLATION_MB)
    steps = ["overlapped", *bench.STEPS_OF_4]
    cell = {(r["kind"], r["bucket_cap_mb"]): r for r in rows}
    head = "| change | " + " | ".join(
        f"{c:g} MB: tokens/s | vs torch DDP | per-round IQR" for c in caps
    )
    lines = [head + " |", "|---|" + "---:|---:|---:|" * len(caps)]
    for kind in steps:
        name = "copy (step 3)" if kind == "overlapped" else kind
        cells = [cell[kind, c] for c in caps]
        lines.append(
            f"| {name} | "
            + " | ".join(
                f"{r['tokens_per_s']:,.0f} | {r['vs_torch']:.2f}× | {iqr(r)}" for r in cells
            )
            + " |"
        )
    torch_row = cell["torch", 25.0]
    default = cell["torch default", 25.0]
    lines += [
        "",
        f"*torch DDP (`bucket_cap_mb=25`), the reference: {torch_row['tokens_per_s']:,.0f} "
        f"tokens/s; torch DDP with its defaults (`bucket_cap_mb=None`: 25 MB and a 1 MB first "
        f"bucket): {default['tokens_per_s']:,.0f} tokens/s, {default['vs_torch']:.2f}× "
        f"(per-round IQR {iqr(default)}). " + caption(bench, rows).removeprefix("*"),
    ]
    return "\n".join(lines) + "\n"


def sweep_plot(rows: list[dict]) -> None:
    sweep = [r for r in rows if r["kind"] == "overlapped"]
    ref = {r["kind"]: r["tokens_per_s"] for r in rows if r["kind"] != "overlapped"}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(
        [r["bucket_cap_mb"] for r in sweep],
        [r["tokens_per_s"] for r in sweep],
        "o-",
        label="ours: overlapped",
    )
    step4 = [r for r in rows if r["kind"] == "views + first bucket + lean hooks"]
    ax.plot(
        [r["bucket_cap_mb"] for r in step4],
        [r["tokens_per_s"] for r in step4],
        "s",
        color="C1",
        label="ours: step 4, views + first bucket + lean hooks",
    )
    styles = {"torch": ("k--", "torch DDP (25 MB)"), "bucketed": ("g:", "ours: bucketed, no overlap (25 MB)"), "naive": ("r-.", "ours: naive")}  # fmt: skip
    for kind, (style, label) in styles.items():
        ax.axhline(ref[kind], color=style[0], linestyle=style[1:], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("bucket_cap_mb (log scale)")
    ax.set_ylabel("tokens/s (2 ranks together)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Bucket size sweep: {rows[0]['grad_mb']:.0f} MB of gradients, 2 ranks, gloo")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "ddp_bucket_sweep.png", dpi=120)
    plt.close(fig)


def main() -> int:
    bench = load_bench()
    rows = bench.rows()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ddp_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "ddp_bench.md").write_text(table(bench, rows))
    (OUT / "ddp_ablation.md").write_text(ablation_table(bench, rows))
    sweep_plot(rows)
    print(bench.report(rows))
    for name in ("ddp_bench.md", "ddp_ablation.md", "ddp_bench.json", "ddp_bucket_sweep.png"):
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

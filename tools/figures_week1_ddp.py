"""Regenerate the benchmark table and the bucket-size plot of docs/week-1/ddp-from-scratch.md.

Run:  python tools/figures_week1_ddp.py

Runs benchmarks/bench_ddp.py's measurement once (about 40 s on 2 CPU cores: 2 ranks over
gloo) and writes docs/generated/week1/ddp_bench.md (the table the page includes),
ddp_bench.json (the same rows) and ddp_bucket_sweep.png (tokens/s vs bucket size).
Timings: run it on a quiet machine.
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


def table(bench, rows: list[dict]) -> str:
    lines = [
        "| variant | bucket cap | tokens/s | vs torch DDP |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        cap = "—" if r["kind"] == "naive" else f"{r['bucket_cap_mb']:g} MB"
        lines.append(
            f"| {r['variant']} | {cap} | {r['tokens_per_s']:,.0f} | {r['vs_torch']:.2f}× |"
        )
    lines.append("")
    lines.append(
        f"*World size {bench.WORLD} on 2 CPU cores (gloo over loopback, 1 thread per rank), "
        f"{rows[0]['grad_mb']:.1f} MB of fp32 gradients, batch {bench.BATCH}×{bench.SEQ} tokens "
        f"per rank; median of {bench.ROUNDS} interleaved rounds × {bench.STEPS} steps. "
        "Recorded by `python tools/figures_week1_ddp.py`.*"
    )
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
    sweep_plot(rows)
    print(bench.report(rows))
    for name in ("ddp_bench.md", "ddp_bench.json", "ddp_bucket_sweep.png"):
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the benchmark plot and table of the Week 1 collectives page.

Run:  python tools/figures_week1_collectives.py   (about 2 minutes on 2 CPU cores)

Calls benchmarks/bench_collectives.py's ``measure`` (our plain and pipelined ring
all-reduces and gloo's, interleaved in the same two processes) and ``sweep`` (the
pipelined ring's segment sizes against gloo) and writes, under docs/generated/week1/:
collectives_busbw.png (bus bandwidth against message size, log-log), collectives_busbw.md
(the table the page includes), collectives_busbw.json (its rows), collectives_sweep.md
(the sweep's table) and collectives_sweep.json (its rows).
Timings: regenerate on a quiet machine, not in a test.
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
WORLD_SIZE = 2


def load_bench():
    path = ROOT / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the spawned ranks import it by this name
    spec.loader.exec_module(module)
    return module


def main() -> int:
    bench = load_bench()
    OUT.mkdir(parents=True, exist_ok=True)
    link = bench.measure_link()
    (OUT / "allreduce_link.json").write_text(json.dumps(link, indent=1) + "\n")
    (OUT / "allreduce_link.md").write_text(bench.format_link(link) + "\n")
    rows = bench.measure(world_size=WORLD_SIZE)
    (OUT / "collectives_busbw.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "collectives_busbw.md").write_text(
        bench.format_table(rows, world_size=WORLD_SIZE) + "\n"
    )
    sweep = bench.sweep(world_size=WORLD_SIZE)
    (OUT / "collectives_sweep.json").write_text(json.dumps(sweep, indent=1) + "\n")
    (OUT / "collectives_sweep.md").write_text(
        bench.format_sweep(sweep, world_size=WORLD_SIZE) + "\n"
    )
    sizes = [row["bytes"] for row in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for impl, label, marker in (
        ("ring", "ring_all_reduce (ours: isend/irecv, Python)", "o"),
        ("pipelined", "pipelined_ring_all_reduce (ours, segmented)", "^"),
        ("doubling", "recursive_doubling_all_reduce (ours)", "v"),
        ("all_reduce", "all_reduce (ours, picks by size)", "x"),
        ("gloo", "dist.all_reduce (gloo, C++)", "s"),
    ):
        ax.plot(sizes, [row[f"{impl}_busbw"] / 1e9 for row in rows], marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # small messages are 100x slower: show both regimes
    ax.set_xticks(sizes, [bench.human(s) for s in sizes])
    ax.set_xlabel("message size S (float32 tensor)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"All-reduce, N = {WORLD_SIZE} processes, one machine, loopback TCP")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "collectives_busbw.png", dpi=120)
    plt.close(fig)
    names = ("allreduce_link.md", "allreduce_link.json", "collectives_busbw.png")
    names += ("collectives_busbw.md", "collectives_busbw.json")
    for name in (*names, "collectives_sweep.md", "collectives_sweep.json"):
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

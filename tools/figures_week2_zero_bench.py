"""Record the speed table of Week 2's ZeRO page: stages 0-3 and stage 3 with prefetching.

Run:  python tools/figures_week2_zero_bench.py   (about a minute on 2 CPU cores)

Runs benchmarks/bench_zero.py (the rows `make bench` prints, median of 15 interleaved
rounds, with each step's CPU time and the collectives' per-call times and CPU) and writes,
under docs/generated/week2/: zero_bench.json (the rows) and zero_bench.txt (the table, as
the benchmark prints it, ending with stage 3 + prefetch against stage 0 and its bounds).
tests/docs/test_generated_week2.py rebuilds the table from the rows;
tests/docs/test_prose_zero_speed.py checks the page's speed section against them.
Timings: regenerate on a quiet machine, not in a test.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week2"


def load_bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the spawned ranks import it by name
    return importlib.import_module("bench_zero")


def main() -> None:
    bench = load_bench()
    rows = bench.rows()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "zero_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "zero_bench.txt").write_text(bench.report(rows) + "\n")
    print((OUT / "zero_bench.txt").read_text(), end="")


if __name__ == "__main__":
    main()

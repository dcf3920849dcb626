"""Record the speed table of Week 2's "Side by side": our ZeRO-3, FSDP2 (fp32, bf16) and
DeepSpeed ZeRO-3 on the same model, in the same two processes, twice.

Run:  python tools/figures_week2_sharding.py   (about 2 minutes on 2 CPU cores; part of `make figures`)

Writes, under docs/generated/week2/: sharding_bench.json (median tokens/s per variant, per
run), sharding_bench.txt (the two tables, as benchmarks/bench_sharding.py prints them) and
sharding_bench_numbers.md (the page's sentence about them). The same benchmark is part of
`make bench`; tests/docs/test_generated_week2.py rebuilds the text from the numbers.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week2"
RUNS = 2  # two runs: the page reads only what repeats


def load_bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the spawned ranks import it by name
    return importlib.import_module("bench_sharding")


def text(bench, runs: list[dict[str, float]]) -> str:
    """The runs' tables, a blank line between, the benchmark's footer at the end."""
    blocks = ["\n".join(bench.table(run)) for run in runs]
    return "\n\n".join(blocks) + "\n" + bench.FOOTER + "\n"


def prose(bench, runs: list[dict[str, float]]) -> str:
    """What repeats: the fastest variant, and the range of the fp32 libraries' ratios."""
    base = bench.VARIANTS[0]
    fastest = [max(run, key=run.__getitem__) for run in runs]
    ratios = [run[name] / run[base] for run in runs for name in ("FSDP2", "DeepSpeed ZeRO-3")]
    if len(set(fastest)) == 1:
        first = f"In both runs the fastest is {fastest[0]}"
    else:
        first = f"The fastest is {fastest[0]} in the first run and {fastest[1]} in the second"
    return (
        f"{first}; fp32 FSDP2 and DeepSpeed ZeRO-3 ran at {min(ratios):.2f}× to "
        f"{max(ratios):.2f}× the tokens/s of our ZeRO-3.\n"
    )


def write(bench, runs: list[dict[str, float]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sharding_bench.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    (OUT / "sharding_bench.txt").write_text(text(bench, runs))
    (OUT / "sharding_bench_numbers.md").write_text(prose(bench, runs))


def main() -> int:
    bench = load_bench()
    write(bench, [bench.run() for _ in range(RUNS)])
    print(f"wrote {OUT.relative_to(ROOT)}/sharding_bench.{{json,txt}}, sharding_bench_numbers.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

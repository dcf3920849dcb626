"""Regenerate the latency sweep that "NCCL and the network" shows.

Run:  python tools/figures_operations.py   (about 20 s on 2 CPU cores; part of `make figures`)

Measures ``tinyscale.comm.latency`` on 2 gloo processes (4 B to 16 MiB, each size as long
as its slowest rank) and writes, under docs/generated/operations/: bench_latency.json
(the measured points, in seconds), bench_latency.txt (the table and fit the page
includes, ``report`` of those points) and bench_latency_numbers.md (the fit's numbers as
the page's prose quotes them). tests/tinyscale/comm/test_latency.py rebuilds the text
files from the points and re-runs two cheap sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tinyscale.comm.latency import fit_latency, many_small_vs_one, measure, report

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "operations"
WORLD_SIZE = 2


def prose(points: list[tuple[int, float]]) -> str:
    """The sentence the page includes: the fixed cost and what it costs small messages."""
    fit = fit_latency([s for s, _ in points], [t for _, t in points])
    slower = many_small_vs_one(fit, total_bytes=2**20, messages=256)
    return (
        f"a ≈ {fit.latency_s * 1e3:.2f} ms, 1 / b ≈ {1 / fit.seconds_per_byte / 1e9:.1f} GB/s; "
        f"1 MiB sent as 256 all-reduces of 4 KiB: predicted {slower:.0f}× slower than one\n"
    )


def write(points: list[tuple[int, float]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"world_size": WORLD_SIZE, "points": [[s, t] for s, t in points]}
    (OUT / "bench_latency.json").write_text(json.dumps(payload, indent=1) + "\n")
    (OUT / "bench_latency.txt").write_text("\n".join(report(points, world_size=WORLD_SIZE)) + "\n")
    (OUT / "bench_latency_numbers.md").write_text(prose(points))


def main() -> int:
    write(measure(world_size=WORLD_SIZE))
    print(f"wrote {OUT.relative_to(ROOT)}/bench_latency.{{json,txt}}, bench_latency_numbers.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

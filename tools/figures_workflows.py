"""Regenerate the benchmark run that "Profiling and MFU" shows.

Run:  python tools/figures_workflows.py   (about 2 minutes on 2 CPU cores; part of `make figures`)

Runs benchmarks/bench_profile_findings.py once (one profile of the Lab step, then every
variant the profile suggests, timed side by side) and writes its printout to
docs/generated/workflows/profile_bench.txt, which the page includes.
tests/tinyscale/workflows/test_profiling.py reads it back: every variant of the benchmark
is there, the FLOP/s and MFU columns follow from tokens/s and the FLOPs formula of today's
code, and the page's prose says what the file measured.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "workflows"


def main() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_profile_findings

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench_profile_findings.main()
    OUT.mkdir(parents=True, exist_ok=True)
    temp = OUT / "profile_bench.txt.tmp"
    temp.write_text(printed.getvalue())
    temp.replace(OUT / "profile_bench.txt")
    print(printed.getvalue(), end="")


if __name__ == "__main__":
    main()

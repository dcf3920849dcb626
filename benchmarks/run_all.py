"""Run every benchmark: `make bench`.

Each benchmarks/bench_*.py has a `main()` that measures its variants side by side, in
one process and one run, and prints ratios against a baseline; then run_all prints its
LIMITS: what bounds it on a 2-core machine, and what would change on GPUs with NCCL.
Timings live here, never in pass/fail tests.
"""

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    # Imported by name, not by path: benchmarks that spawn ranks pass module-level
    # functions to them, and a spawned process finds those only through sys.path.
    sys.path.insert(0, str(HERE))
    for path in sorted(HERE.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        print(f"== {path.name}: {(module.__doc__ or '').strip().splitlines()[0]}")
        module.main()
        print(f"What limits it: {module.LIMITS}\n")  # this machine's limits, and a GPU's
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark: `make bench`.

Each benchmarks/bench_*.py has a `main()` that measures its variants side by side, in
one process and one run, and prints ratios against a baseline. Timings live here, never
in pass/fail tests.
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    for path in sorted(HERE.glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"== {path.name}: {(module.__doc__ or '').strip().splitlines()[0]}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())

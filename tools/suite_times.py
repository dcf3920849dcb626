"""python tools/suite_times.py   (after a full `make test`)
   python tools/suite_times.py --add   (after `pytest` on a new page or test file)

Records what each page and each test file cost the last full `make test`: conftest.py
writes build/suite_times.json in every run; this keeps a full run's in
docs/generated/testing/suite_times.json, and the ten slowest beside their budgets
(tests/suite_budget.py) in suite_times.md, which the testing page includes.
tests/test_suite_budget.py reads the record: every unit measured, none over its budget.
A partial run (pytest on some files) is refused: its record would miss units. `--add`
records the units of the last run (build/suite_times_last.json, any run) that the record
does not have yet, so a new page or test file can be measured without a full run.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from suite_budget import SUITE_BUDGET_S, WORKERS, budget  # noqa: E402

LAST_RUN = ROOT / "build" / "suite_times.json"
ANY_RUN = ROOT / "build" / "suite_times_last.json"
OUT = ROOT / "docs" / "generated" / "testing"
RECORD = OUT / "suite_times.json"


def units() -> set[str]:
    """Every unit the suite runs: each test file, and each page with a block that runs."""
    from helpers import runnable_blocks

    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    pages = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if "generated" not in p.parts and runnable_blocks(p)
    }
    return files | pages


def table(times: dict[str, float], n: int = 10) -> str:
    rows = sorted(times.items(), key=lambda kv: -kv[1])[:n]
    lines = ["| page or test file | seconds | budget |", "|---|---:|---:|"]
    lines += [f"| `{u}` | {s:.0f} | {budget(u):.0f} |" for u, s in rows]
    total = sum(times.values())
    lines += [
        "",
        f"{len(times)} pages and test files, {total / 60:.1f} minutes of tests in all, run on "
        f"{WORKERS} workers: at most {WORKERS * SUITE_BUDGET_S / 60:.0f} minutes summed "
        f"for the suite's {SUITE_BUDGET_S / 60:.0f} minutes.",
    ]
    return "\n".join(lines) + "\n"


def add() -> int:
    """Record the units the last run measured and the record lacks; keep the rest."""
    record = json.loads(RECORD.read_text())
    new = {u: s for u, s in json.loads(ANY_RUN.read_text()).items() if u not in record["seconds"]}
    merged = {**record["seconds"], **{u: round(s, 1) for u, s in new.items()}}
    record["seconds"] = dict(sorted(merged.items()))
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    (OUT / "suite_times.md").write_text(table(record["seconds"]))
    print(f"added {', '.join(new) or 'nothing'} to {RECORD.relative_to(ROOT)}")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--add"]:
        return add()
    if not LAST_RUN.is_file():
        print("error: no build/suite_times.json: run `make test` first", file=sys.stderr)
        return 2
    times = json.loads(LAST_RUN.read_text())
    missing = sorted(units() - set(times))
    if missing:
        print(f"error: the last run was partial ({len(missing)} units missing, e.g. "
              f"{missing[0]}): run `make test`, then this", file=sys.stderr)  # fmt: skip
        return 2
    record = {
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores",
        "date": datetime.date.today().isoformat(),
        "seconds": {u: round(s, 1) for u, s in sorted(times.items())},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    (OUT / "suite_times.md").write_text(table(record["seconds"]))  # what the test reads
    print(f"wrote {RECORD.relative_to(ROOT)} and suite_times.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

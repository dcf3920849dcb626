"""What each page's blocks and each test file may cost `make test`, and how it is counted.

A unit is a page (all its blocks) or a test file (all its tests): the time is the sum of
its tests' setup, call and teardown, as pytest reports them (`--durations` counts the
same). conftest.py adds them up in every run, prints the ten slowest units beside their
budgets and writes build/suite_times.json; `python tools/suite_times.py` records a full
run's in docs/generated/testing/suite_times.json, and tests/test_suite_budget.py fails
when a recorded unit is over its budget or a unit has no record: a new page or test file
is measured and pays for itself before it lands.

The default budgets are definitions: a minute of blocks for a page, forty seconds for a
test file. A unit that needs more names its reason here. The suite's own budget is the
15 minutes of tests this 2-core machine gives `make test` (three workers: 45 minutes of
summed unit time at most).
"""

from __future__ import annotations

PAGE_BUDGET_S = 60.0
FILE_BUDGET_S = 40.0
SUITE_BUDGET_S = 15 * 60.0
WORKERS = 3  # the Makefile's TEST_WORKERS: units run side by side on three workers

# unit -> (seconds, why it needs more than the default)
LARGER: dict[str, tuple[float, str]] = {
    "docs/workshop/lab-1.md": (240.0, "the lab is the training loop: it trains the Lab model "
                               "whole, interrupted and resumed, wider and deeper"),
    "docs/workshop/lab-2.md": (120.0, "torchrun on 1, 2 and 4 processes, and a crash and a hang "
                               "that each wait out the job's timeout"),
    "docs/workshop/lab-3.md": (90.0, "real torchrun agents per simulated node meeting at one "
                               "rendezvous, and failures that wait out their timeouts"),
    "docs/workshop/deepspeed.md": (90.0, "DeepSpeed's engine and launcher, ZeRO-2 and ZeRO-3 on "
                                   "two processes; importing DeepSpeed alone takes seconds"),
    "docs/operations/large-batch.md": (120.0, "trains the same model at several batch sizes to "
                                       "find where a larger batch stops paying"),
    "docs/operations/hangs.md": (90.0, "each hang waits out a real collective timeout before "
                                 "the page reads what it left"),
    "docs/week-3/pipeline-torchtitan.md": (90.0, "torch's pipeline schedules and torchtitan's "
                                           "trainer, on two and four processes"),
    "docs/week-4/train-any-shape.md": (120.0, "trains on three parallel shapes, resumes DCP "
                                       "checkpoints across them, and resumes past a torn shard"),
    "tests/docs/test_browser.py": (120.0, "a headless browser opens every page of the built site "
                                   "and takes its screenshots"),
    "tests/tinyscale/compat/test_titan_compat.py": (60.0, "torchtitan's own trainer, imported "
                                                    "and run on the course's model"),
    "tests/tinyscale/comm/test_launch.py": (60.0, "starts, stalls and kills worker processes, "
                                            "waiting out their timeouts"),
}  # fmt: skip


def budget(unit: str) -> float:
    """The seconds a unit may take: its own budget, or the default of its kind."""
    if unit in LARGER:
        return LARGER[unit][0]
    return PAGE_BUDGET_S if unit.endswith(".md") else FILE_BUDGET_S


def unit_of(nodeid: str) -> str:
    """The page or test file a test belongs to: "docs/x.md::line 12" -> "docs/x.md"."""
    return nodeid.split("::", 1)[0]


def over_budget(times: dict[str, float]) -> list[str]:
    """One line per unit over its budget, slowest first."""
    over = [(s, u) for u, s in times.items() if s > budget(u)]
    return [f"{u}: {s:.0f} s, budget {budget(u):.0f} s" for s, u in sorted(over, reverse=True)]


def slowest(times: dict[str, float], n: int = 10) -> list[str]:
    """The n slowest units as table rows: unit, seconds, budget."""
    rows = sorted(times.items(), key=lambda kv: -kv[1])[:n]
    return [f"{u:<62} {s:>6.1f} s  (budget {budget(u):.0f} s)" for u, s in rows]

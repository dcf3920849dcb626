"""Every page and test file is measured and within its budget (tests/suite_budget.py).

The record is a full `make test` on this machine (tools/suite_times.py keeps it): a new
page or test file has no record until it is measured, and a unit that grew past its
budget fails here until it is made cheaper or its larger budget is written down with a
reason. The live run's times are printed by conftest.py at the end of every run; they are
not checked here (a timed pass/fail test would fail on a slow day), the recorded ones are.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, load_tool, prose, said
from suite_budget import (
    FILE_BUDGET_S,
    LARGER,
    PAGE_BUDGET_S,
    SUITE_BUDGET_S,
    WORKERS,
    budget,
    over_budget,
    unit_of,
)

RECORD = ROOT / "docs" / "generated" / "testing" / "suite_times.json"


@pytest.fixture(scope="module")
def recorded() -> dict[str, float]:
    return json.loads(RECORD.read_text())["seconds"]


def test_every_page_and_test_file_has_a_recorded_time(recorded) -> None:
    missing = sorted(load_tool("suite_times").units() - set(recorded))
    assert not missing, (
        f"{len(missing)} units never measured, e.g. {missing[:3]}: run `make test`, then "
        "`python tools/suite_times.py`"
    )


def test_no_unit_is_over_its_budget(recorded) -> None:
    assert not over_budget(recorded), "make these cheaper, or give them a budget and a reason"


def test_the_suite_fits_its_fifteen_minutes(recorded) -> None:
    assert sum(recorded.values()) <= WORKERS * SUITE_BUDGET_S


def test_every_larger_budget_says_why_and_is_used(recorded) -> None:
    for unit, (seconds, why) in LARGER.items():
        assert unit in recorded, f"{unit} has a budget but no longer exists"
        assert seconds > (PAGE_BUDGET_S if unit.endswith(".md") else FILE_BUDGET_S)
        assert len(why) > 20, f"{unit}: say why it needs {seconds:.0f} s"


def test_the_check_fails_a_unit_over_its_budget(recorded) -> None:
    """Shown failing: the slowest unit, recorded at twice its budget, is reported."""
    unit = max(recorded, key=recorded.get)
    assert over_budget({unit: 2 * budget(unit)}) == [
        f"{unit}: {2 * budget(unit):.0f} s, budget {budget(unit):.0f} s"
    ]
    assert unit_of("docs/workshop/lab-1.md::line 324") == "docs/workshop/lab-1.md"


def test_the_testing_page_states_the_budgets_of_this_module() -> None:
    text = prose("start/testing.md")
    (minutes,) = said(text, r"The suite has (\d+) minutes of tests on a 2-core machine")
    assert int(minutes) * 60 == SUITE_BUDGET_S
    page, file = said(text, r"a \*\*budget\*\*: (a minute) for a page, (forty seconds) for a test")
    words = {"a minute": 60.0, "forty seconds": 40.0}
    assert (words[page], words[file]) == (PAGE_BUDGET_S, FILE_BUDGET_S)


def test_the_testing_pages_table_is_the_record(recorded) -> None:
    """docs/generated/testing/suite_times.md, which the testing page includes, is the
    record's ten slowest beside their budgets, as tools/suite_times.py writes it."""
    shown = (ROOT / "docs" / "generated" / "testing" / "suite_times.md").read_text()
    assert shown == load_tool("suite_times").table(recorded)

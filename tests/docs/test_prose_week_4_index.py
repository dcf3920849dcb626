"""Week 4's index: the numbers in its prose are those of the course's data.

- tensor parallelism combines partial results twice per block in each pass: the count
  the TP lesson's demo records (docs/week-4/tensor-parallel-from-scratch.md, CI-compared);
- the reading rates of the page times, from tools/page_times.py.

The 7B and 70B models are the planner's worked examples (tests/docs/prose_rules/week_4.py).
"""

from __future__ import annotations

import re
import sys

import pytest

from helpers import ROOT, fails_when_changed, prose, recorded_output, said

sys.path.insert(0, str(ROOT / "tools"))
import page_times

PAGE = "week-4/index.md"
TIMES = {"once": 1, "twice": 2}


def check_messages_per_block(text: str) -> None:
    (times,) = said(text, r"the ranks combine their partial results (\w+) per block in each pass")
    demo = "\n".join(
        recorded_output("week-4/tensor-parallel-from-scratch.md", "tp_parity import demo")
    )
    counts = re.findall(r"forward \{'all_reduce': (\d)\}, backward \{'all_reduce': (\d)\}", demo)
    assert counts and {int(n) for pair in counts for n in pair} == {TIMES[times]}


def check_reading_rates(text: str) -> None:
    prose_rate, code_rate = said(
        text, r"Minutes are reading \((\d+) words a minute, code at (\d+)\) plus the measured"
    )
    assert int(prose_rate) == page_times.WORDS_PER_MINUTE
    assert int(code_rate) == page_times.CODE_WORDS_PER_MINUTE


@pytest.mark.parametrize("check", [check_messages_per_block, check_reading_rates])
def test_the_pages_numbers_are_those_of_the_data(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_messages_per_block, "results twice per block", "results once per block"),
        (check_reading_rates, "(200 words a minute", "(250 words a minute"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

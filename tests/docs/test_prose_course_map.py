"""The course map's reading rates are the ones tools/page_times.py counts with, and its
session split is the slots the page-time check enforces."""

from __future__ import annotations

import sys

from helpers import ROOT, fails_when_changed, prose, said

sys.path.insert(0, str(ROOT / "tools"))
import page_times

PAGE = "start/course-map.md"


def check_rates(text: str) -> None:
    prose_rate, code_rate = said(
        text, r"Reading time counts (\d+) words a minute of prose and (\d+) of code"
    )
    assert int(prose_rate) == page_times.WORDS_PER_MINUTE
    assert int(code_rate) == page_times.CODE_WORDS_PER_MINUTE
    demo, lab = said(text, r"slides and demo in the first (\d+), the lab in the last (\d+)\.")
    assert int(lab) == page_times.SLOTS["workshop/lab-1.md"]
    assert int(demo) == page_times.SLOTS["workshop/session-a.md"]
    assert int(demo) + int(lab) == 90  # "A workshop session is 90 minutes"


def test_the_rates_and_slots_are_the_tools() -> None:
    check_rates(prose(PAGE))


def test_self_check_a_changed_rate_fails() -> None:
    fails_when_changed(check_rates, prose(PAGE), "100 of code", "120 of code")

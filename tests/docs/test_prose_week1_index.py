"""The numbers in the prose of Week 1's introduction (docs/week-1/index.md), against the
code they describe:

- the reading rates of the page times, against tools/page_times.py;
- how often `run_on_ranks` looks for a dead rank, and the grace it gives the others'
  reports, against its source;
- the collective timeout of the second exercise, against the exercise's own code and
  its compared output;
- the default process-group timeouts of gloo and NCCL, against torch's constants.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from datetime import timedelta

import pytest
import torch.distributed.constants as pg_constants

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.comm.launch import run_on_ranks

PAGE = "week-1/index.md"


def check_reading_rates(text: str) -> None:
    prose_rate, code_rate = said(
        text, r"Minutes are reading \((\d+) words a minute of prose, (\d+) of code\)"
    )
    if str(ROOT / "tools") not in sys.path:  # page_times imports its neighbours by name
        sys.path.insert(0, str(ROOT / "tools"))
    page_times = importlib.import_module("page_times")
    assert int(prose_rate) == page_times.WORDS_PER_MINUTE
    assert int(code_rate) == page_times.CODE_WORDS_PER_MINUTE


def check_launcher_polling(text: str) -> None:
    """The parent's poll interval, said twice, and the grace the other ranks get."""
    (every,) = said(text, r"It never waits blindly: every ([\d.]+) s it checks whether a rank")
    (within,) = said(text, r"a dead rank is noticed within ([\d.]+) s;")
    (grace,) = said(text, r"When a rank fails, the others get (two) seconds for their own reports")
    source = inspect.getsource(run_on_ranks)
    (poll,) = re.findall(r"results\.get\(timeout=([\d.]+)\)", source)
    assert float(every) == float(within) == float(poll)
    (extra,) = re.findall(r"time\.monotonic\(\) \+ (\d+)\)  # let the root cause arrive", source)
    assert {"two": 2}[grace] == int(extra)


def check_exercise_timeout(text: str) -> None:
    (said_s,) = said(text, r"until the collective timeout \(here (\d+) s\), then raises")
    (code_s,) = said(text, r"pool = WorkerPool\(2, timeout_s=(\d+)\)")
    (output_s,) = said(text, r"failed in a collective \(timed out after (\d+) s, or a peer")
    assert said_s == code_s == output_s


def check_default_timeouts(text: str) -> None:
    gloo, nccl = said(
        text, r"wait for the default timeout — (\d+) minutes for gloo, (\d+) for NCCL —"
    )
    assert timedelta(minutes=int(gloo)) == pg_constants.default_pg_timeout
    assert timedelta(minutes=int(nccl)) == pg_constants.default_pg_nccl_timeout


CHECKS = [
    check_reading_rates,
    check_launcher_polling,
    check_exercise_timeout,
    check_default_timeouts,
]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_code(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_reading_rates, "(200 words a minute", "(250 words a minute"),
        (check_launcher_polling, "within 0.2 s;", "within 0.5 s;"),
        (check_exercise_timeout, "(here 2 s)", "(here 3 s)"),
        (check_default_timeouts, "30 minutes for gloo", "60 minutes for gloo"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

"""The numbers in the prose of docs/week-3/pipeline-from-scratch.md that
tests/docs/test_generated_week3.py and the runtime's tests do not read:

- ZB-H1's idle time against 1F1B's when F, B and W take the same time, by the simulator;
- the stand-in compute of the recorded runs (docs/generated/week3/pipeline_*.json);
- interleaving's boundaries and its formula gain over 1F1B, from the formula the recorded
  runs' simulated column equals.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.pipeline_parallel.schedules import bubble_fraction, make_schedule, simulate

PAGE = "week-3/pipeline-from-scratch.md"
RECORDED = ROOT / "docs" / "generated" / "week3"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / f"pipeline_{name}.json").read_text())


def idle(name: str, *, p: int, m: int, t: int) -> list[Fraction]:
    """Per rank, the idle time of one step, every F, B and W taking ``t``."""
    timeline = simulate(make_schedule(name, p=p, m=m), t_f=t, t_b=t, t_w=t)
    total = max(a.end for rank in timeline for a in rank) - min(a.start for a in timeline[0])
    return [total - sum(a.end - a.start for a in rank) for rank in timeline]


def check_zb_h1_share(text: str) -> None:
    (share,) = said(
        text,
        r"idles \(p − 1\)\(t_f \+ t_b − t_w\), against 1F1B's \(p − 1\)\(t_f \+ t_b \+ t_w\) "
        r"for the same work — (a third|a half|two thirds) when t_f = t_b = t_w",
    )
    want = {"a third": Fraction(1, 3), "a half": Fraction(1, 2), "two thirds": Fraction(2, 3)}
    for p, m in ((2, 4), (4, 8), (8, 16)):
        ratios = {
            z / o
            for z, o in zip(idle("zb-h1", p=p, m=m, t=1), idle("1f1b", p=p, m=m, t=1), strict=True)
        }
        assert ratios == {want[share]}, (p, m, ratios)


def check_stand_in_compute(text: str) -> None:
    forward, backward, ratio, zb = said(
        text,
        r"a stand-in compute \(a (\d+) ms sleep in every forward, (\d+) ms in every backward; "
        r"(half|a third|a quarter) that per\s+chunk for interleaved; (\d+) ms each for ZB-H1's "
        r"F, B and W\)",
    )
    plain = [int(forward) / 1000, int(backward) / 1000, 0]
    for name in ("naive", "gpipe", "1f1b"):
        assert recorded(name)["sleep_s"] == plain, name
    v = {"half": 2, "a third": 3, "a quarter": 4}[ratio]
    interleaved = recorded("interleaved")
    assert interleaved["v"] == v
    assert interleaved["sleep_s"] == [t / v for t in plain]
    assert recorded("zb-h1")["sleep_s"] == [int(zb) / 1000] * 3


def check_interleaved_gain(text: str) -> None:
    crossed, plain = said(
        text,
        r"a micro-batch crosses p·v − 1 = (\d+)\s+stage boundaries each way instead of "
        r"p − 1 = (\d+)",
    )
    run = recorded("interleaved")
    assert (int(crossed), int(plain)) == (run["p"] * run["v"] - 1, run["p"] - 1)
    one_f_one_b, interleaved, gain = said(
        text, r"the formula's (\d+/\d+) − (\d+/\d+) = (0\.\d+)\. The"
    )
    p, m, v = run["p"], run["m"], run["v"]
    assert (
        Fraction(one_f_one_b)
        == bubble_fraction(p, m)
        == Fraction(recorded("1f1b")["simulated_bubble"][0])
    )
    assert Fraction(interleaved) == bubble_fraction(p, m, v) == Fraction(run["simulated_bubble"][0])
    digits = len(gain.split(".")[1])
    assert float(gain) == round(float(Fraction(one_f_one_b) - Fraction(interleaved)), digits)


CHECKS = [check_zb_h1_share, check_stand_in_compute, check_interleaved_gain]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_simulator_and_the_runs(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_zb_h1_share, "— a third when", "— a half when"),
        (check_stand_in_compute, "a 20 ms sleep in", "a 10 ms sleep in"),
        (check_stand_in_compute, "half that per chunk", "a third that per chunk"),
        (check_interleaved_gain, "3/19 = 0.115", "3/19 = 0.125"),
        (check_interleaved_gain, "p·v − 1 = 7", "p·v − 1 = 8"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

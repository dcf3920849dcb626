"""Pipeline schedules as data (tinyscale.pipeline_parallel.schedules): the event simulator
reproduces the bubble formulas exactly (Fractions), and the action lists give the peak
micro-batches in flight that the page teaches. In-process, no ranks: a second at most.
"""

import itertools
import re
from fractions import Fraction

import pytest

from helpers import fails_when_changed, one_line_error, prose, said
from tinyscale.pipeline_parallel.schedules import (
    SCHEDULES,
    Action,
    bubble,
    bubble_fraction,
    make_schedule,
    peak_in_flight,
    simulate,
    stage_of,
    zb_h1_bubble_fraction,
)

PS, MS = (1, 2, 3, 4, 8), (1, 2, 3, 4, 6, 8, 16)
TIMES = ((1, 1), (1, 2), (2, 3))  # (t_f, t_b): equal, the usual 1:2, and an odd ratio


def every_action_once(acts: list[list[Action]], m: int, v: int, kinds: str) -> None:
    for rank in acts:
        want = sorted((k, i, c) for k in kinds for i in range(m) for c in range(v))
        assert sorted((a.kind, a.microbatch, a.chunk) for a in rank) == want


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("t_f", "t_b"), TIMES)
def test_gpipe_and_1f1b_bubble_is_the_formula_exactly(name, t_f, t_b) -> None:
    for p in PS:
        for m in MS:
            acts = make_schedule(name, p=p, m=m)
            every_action_once(acts, m, 1, "FB")
            got = bubble(simulate(acts, t_f=t_f, t_b=t_b))
            assert got == [bubble_fraction(p, m)] * p, (p, m, got)


@pytest.mark.parametrize(("t_f", "t_b"), TIMES)
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_the_formula_exactly(t_f, t_b, v) -> None:
    for p in PS:
        for m in (k * p for k in (1, 2, 3, 4)):
            acts = make_schedule("interleaved", p=p, m=m, v=v)
            every_action_once(acts, m, v, "FB")
            # a chunk holds 1/v of a rank's layers: 1/v of the time
            got = bubble(simulate(acts, v=v, t_f=Fraction(t_f, v), t_b=Fraction(t_b, v)))
            assert got == [bubble_fraction(p, m, v)] * p, (p, m, v, got)


def test_interleaving_divides_the_bubble_time_by_v() -> None:
    p, m, t_f, t_b = 4, 8, 1, 2
    one = simulate(make_schedule("1f1b", p=p, m=m), t_f=t_f, t_b=t_b)
    two = simulate(make_schedule("interleaved", p=p, m=m, v=2), v=2,
                   t_f=Fraction(t_f, 2), t_b=Fraction(t_b, 2))  # fmt: skip
    idle = [max(t.end for t in one[0]) - m * (t_f + t_b), max(t.end for t in two[0]) - m * 3]
    assert idle == [(p - 1) * (t_f + t_b), Fraction((p - 1) * (t_f + t_b), 2)]


@pytest.mark.parametrize(("t_f", "t_b", "t_w"), [(1, 1, 1), (2, 3, 1), (1, 2, Fraction(1, 2))])
def test_zero_bubble_idles_p_minus_1_times_f_plus_b_minus_w(t_f, t_b, t_w) -> None:
    for p in PS:
        for m in (m for m in MS if m >= p):
            acts = make_schedule("zb-h1", p=p, m=m)
            every_action_once(acts, m, 1, "FBW")
            got = bubble(simulate(acts, t_f=t_f, t_b=t_b, t_w=t_w))
            assert got == [zb_h1_bubble_fraction(p, m, t_f=t_f, t_b=t_b, t_w=t_w)] * p
            # the same work as one 1F1B backward of t_b + t_w, with a smaller bubble
            ref = bubble(simulate(make_schedule("1f1b", p=p, m=m), t_f=t_f, t_b=t_b, t_w=t_w))
            assert p == 1 or got[0] < ref[0] == bubble_fraction(p, m)


def test_zero_bubble_formula_needs_w_no_longer_than_f_and_b() -> None:
    """Outside m >= p and t_w <= t_f, t_b the simulator finds more idle than the formula."""
    acts = make_schedule("zb-h1", p=4, m=8)
    assert bubble(simulate(acts, t_f=3, t_b=1, t_w=2))[0] > zb_h1_bubble_fraction(
        4, 8, t_f=3, t_b=1, t_w=2
    )
    acts = make_schedule("zb-h1", p=4, m=2)
    assert bubble(simulate(acts))[0] > zb_h1_bubble_fraction(4, 2)


def test_naive_bubble_is_p_minus_1_over_p() -> None:
    for p in PS:
        for m in MS:
            assert bubble(simulate(make_schedule("naive", p=p, m=m))) == [Fraction(p - 1, p)] * p


def test_the_simulator_respects_every_dependency() -> None:
    p, m, v = 4, 8, 2
    timeline = simulate(make_schedule("interleaved", p=p, m=m, v=v), v=v, t_comm=Fraction(1, 3))
    end = {(t.action.kind, t.action.microbatch, stage_of(t.rank, t.action.chunk, p)): t.end
           for rank in timeline for t in rank}  # fmt: skip
    start = {k: e - (1 if k[0] == "F" else 2) for k, e in end.items()}
    for (kind, i, s), t in start.items():
        if kind == "F" and s > 0:
            assert t >= end["F", i, s - 1] + Fraction(1, 3)
        if kind == "B":
            assert t >= (end["B", i, s + 1] + Fraction(1, 3) if s < p * v - 1 else end["F", i, s])
    for rank in timeline:  # one action at a time, in the list's order
        assert all(a.end <= b.start for a, b in itertools.pairwise(rank))


def test_comm_time_adds_to_the_critical_path() -> None:
    p, m = 4, 4
    quiet = simulate(make_schedule("gpipe", p=p, m=m))
    slow = simulate(make_schedule("gpipe", p=p, m=m), t_comm=1)
    end = [max(t.end for r in tl for t in r) for tl in (quiet, slow)]
    assert end[1] - end[0] == 2 * (p - 1)  # p - 1 hops forward, p - 1 back


def test_a_deadlocking_order_is_reported() -> None:
    acts = [[Action("B", 0), Action("F", 0)], [Action("F", 0), Action("B", 0)]]
    assert "deadlocks" in one_line_error(simulate, acts)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_peak_micro_batches_in_flight(p, m) -> None:
    assert [peak_in_flight(a) for a in make_schedule("gpipe", p=p, m=m)] == [m] * p
    assert [peak_in_flight(a) for a in make_schedule("1f1b", p=p, m=m)] == [
        min(p - r, m) for r in range(p)
    ]
    assert [peak_in_flight(a) for a in make_schedule("naive", p=p, m=m)] == [1] * p
    # zb-h1 keeps a micro-batch until its W: rank r defers r of them, so p each (m >= p)
    if m >= p:
        assert [peak_in_flight(a) for a in make_schedule("zb-h1", p=p, m=m)] == [p] * p


def test_1f1b_warmup_is_p_minus_rank_minus_1() -> None:
    p, m = 4, 8
    for r, acts in enumerate(make_schedule("1f1b", p=p, m=m)):
        first_b = next(k for k, a in enumerate(acts) if a.kind == "B")
        assert first_b == p - r  # p - r - 1 warm-up forwards, then one more before the first B


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [("zigzag", {}, "unknown schedule 'zigzag': use --schedule naive, gpipe, 1f1b"),
     ("interleaved", {"m": 6, "v": 2}, r"multiple of the pipeline ranks \(4\): use --microbatches 8"),
     ("1f1b", {"v": 2}, "runs one chunk per rank: use --chunks 1"),
     ("gpipe", {"m": 0}, "must be >= 1")],
)  # fmt: skip
def test_bad_schedules_are_one_line_usage_errors(name, kwargs, message) -> None:
    args = {"p": 4, "m": 8, "v": 1} | kwargs
    assert re.search(message, one_line_error(make_schedule, name, **args))


def test_every_schedule_has_a_generator() -> None:
    for name in SCHEDULES:
        v = 2 if name == "interleaved" else 1
        assert len(make_schedule(name, p=2, m=4, v=v)) == 2


def check_interleaving_prose(text: str) -> None:
    """pipeline-from-scratch.md's answer to "when does interleaving pay?", recomputed."""
    saved, lo, hi = said(
        text,
        r"\(1 − 1/v\) of bubble \((\d+) time units here\).*?loses only between (\d+) and "
        r"(\d+) units per message",
    )
    p, m, v, t_f, t_b = 4, 8, 2, 2, 4

    def step(name: str, chunks: int, t_comm) -> Fraction:
        acts = make_schedule(name, p=p, m=m, v=chunks)
        timeline = simulate(acts, v=chunks, t_f=Fraction(t_f, chunks), t_b=Fraction(t_b, chunks),
                            t_comm=t_comm)  # fmt: skip
        return max(t.end for rank in timeline for t in rank)

    assert int(saved) == step("1f1b", 1, 0) - step("interleaved", v, 0)
    assert int(saved) == (p - 1) * (t_f + t_b) * (1 - Fraction(1, v))
    assert step("interleaved", v, int(lo)) < step("1f1b", 1, int(lo))
    assert step("interleaved", v, int(hi)) > step("1f1b", 1, int(hi))


def test_the_page_says_what_the_simulator_computes() -> None:
    text = prose("week-3/pipeline-from-scratch.md")
    check_interleaving_prose(text)
    fails_when_changed(check_interleaving_prose, text, "(9 time units here)", "(8 time units here)")

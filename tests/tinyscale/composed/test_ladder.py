"""tinyscale.composed.ladder: docs/week-4/parallelism-2d-3d.md runs the ladder and CI compares
its table with the recorded one; these tests hold every rung of that table to one process."""

import re

from helpers import recorded_output
from tinyscale.composed.ladder import RUNGS

PAGE = "week-4/parallelism-2d-3d.md"
TOLERANCE = 1e-5  # float32 sums in another order: the recorded rungs differ by 4.8e-7


def rows() -> dict[str, tuple[list[float], float]]:
    found = {}
    for line in recorded_output(PAGE, "ladder import demo")[1:]:
        m = re.match(r"(.+?) +(\d) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.e+-]+)$", line)
        assert m, line
        found[m[1]] = ([float(m[3]), float(m[4]), float(m[5])], float(m[6]))
    return found


def test_the_ladder_has_every_rung() -> None:
    assert list(rows()) == ["one process", *RUNGS, "2D: TP 2 x ZeRO-1 2"]


def test_every_rung_trains_like_one_process() -> None:
    table = rows()
    reference, _ = table["one process"]
    for name, (losses, worst) in table.items():
        assert worst < TOLERANCE, name
        assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < TOLERANCE
    assert reference[2] < reference[0]  # it trains


def test_a_broken_rung_leaves_the_curve() -> None:
    """Exercise 3's recorded answer: without the norm-gradient sum, SP drifts from step 2."""
    lines = recorded_output(PAGE, "sync_norms=False")
    gaps = [float(line.split(": ")[1]) for line in lines]
    assert gaps[0] == 0.0 and gaps[1] > 10 * TOLERANCE and gaps[2] > gaps[1]

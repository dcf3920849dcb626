"""NCCL and the network: the words around the latency sweep are true of the recorded sweep
(issue 13: numbers in prose come from data).

The fit's numbers are included from docs/generated/operations/bench_latency_numbers.md,
which tools/figures_operations.py writes with the sweep (tests/tinyscale/comm/test_latency.py
rebuilds it). What the page says in its own words is read here and checked against the
recorded points, docs/generated/operations/bench_latency.json: the two regimes and where
they meet, the scatter of the small sizes, the span of the times, the predicted slowdown.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.comm.latency import LatencyFit, fit_latency, many_small_vs_one

PAGE = "operations/nccl-network.md"
KIB, MIB = 2**10, 2**20


def recorded() -> tuple[list[tuple[int, float]], LatencyFit]:
    path = ROOT / "docs" / "generated" / "operations" / "bench_latency.json"
    points = [(int(s), t) for s, t in json.loads(path.read_text())["points"]]
    return points, fit_latency([s for s, _ in points], [t for _, t in points])


UNITS = {"B": 1, "KiB": KIB, "MiB": MIB}


def check_regimes(text: str) -> None:
    points, fit = recorded()
    low, low_unit, high, high_unit, top, top_unit = said(
        text,
        r"From (\d+) (B|KiB|MiB) to (\d+) (B|KiB|MiB) the time hardly grows: every all-reduce "
        r"costs a few hundred µs whatever it carries\. From (\d+) (B|KiB|MiB) on, time grows "
        r"with size\.",
    )
    sizes = [s for s, _ in points]
    first, last, border = (
        int(n) * UNITS[u] for n, u in ((low, low_unit), (high, high_unit), (top, top_unit))
    )
    assert (first, border) == (sizes[0], sizes[sizes.index(last) + 1]), "the sweep's sizes"
    assert all(100e-6 <= t < 1e-3 for s, t in points if s <= last), "a few hundred µs"
    # the table's regime column: latency-bound below S½, bandwidth-bound from there on
    assert last < fit.half_size_bytes <= border
    (near,) = said(text, r"The fit puts the border, S½ = a / b, near (half a MiB)\.")
    assert round(fit.half_size_bytes / MIB, 1) == 0.5, near
    said(text, r"The small sizes scatter by tens of percent")
    scatter = [abs(t - fit.predict(s)) / fit.predict(s) for s, t in points if s < 64 * KIB]
    assert 0.1 <= max(scatter) < 1, "tens of percent"


def check_span(text: str) -> None:
    said(text, r"times from a fraction of a millisecond to more than ten\.")
    times = [t for _, t in recorded()[0]]
    assert min(times) < 1e-3 and max(times) > 10e-3


def check_many_small(text: str) -> None:
    said(text, r"costs dozens of times one all-reduce of 1 MiB: 256 latencies instead of one")
    slower = many_small_vs_one(recorded()[1], total_bytes=MIB, messages=256)
    assert 24 <= slower < 144, slower


@pytest.mark.parametrize("check", [check_regimes, check_span, check_many_small])
def test_the_pages_words_are_true_of_the_recorded_sweep(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_regimes, "From 4 B to 256 KiB the time", "From 4 B to 1 MiB the time"),
        (check_regimes, "From 1 MiB on, time grows", "From 4 MiB on, time grows"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

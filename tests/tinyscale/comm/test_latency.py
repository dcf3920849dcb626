"""tinyscale.comm.latency: the fit recovers a known latency and bandwidth, agrees with the ring
formula of tinyscale.comm.comm_model, and the measuring worker returns one time per size.
Timings themselves are compared in benchmarks/bench_latency.py, never here."""

import json
import random

import pytest

from helpers import ROOT, assert_timing, load_tool
from tinyscale.comm.comm_model import allreduce_time
from tinyscale.comm.latency import (
    SIZES,
    fit_latency,
    human,
    main,
    many_small_vs_one,
    measure,
    report,
)
from tinyscale.core.errors import UsageError, run_cli


def test_exact_points_give_back_a_and_b() -> None:
    a, b = 50e-6, 1 / 5e9  # 50 µs, 5 GB/s
    fit = fit_latency(SIZES, [a + b * s for s in SIZES])
    assert fit.latency_s == pytest.approx(a, rel=1e-9)
    assert fit.seconds_per_byte == pytest.approx(b, rel=1e-9)
    assert fit.half_size_bytes == pytest.approx(a / b)


def test_noisy_points_are_fitted_in_relative_terms() -> None:
    """±10 % noise on every point: plain least squares would miss a by far (the 16 MiB
    point's noise alone is almost 30x a); relative weights recover it within the noise."""
    rng = random.Random(0)
    a, b = 30e-6, 1 / 2e9
    times = [(a + b * s) * (1 + rng.uniform(-0.1, 0.1)) for s in SIZES]
    fit = fit_latency(SIZES, times)
    assert fit.latency_s == pytest.approx(a, rel=0.1)
    assert fit.seconds_per_byte == pytest.approx(b, rel=0.1)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fit_of_the_ring_model_returns_its_alpha_and_bandwidth(world_size: int) -> None:
    """Times from comm_model's ring formula, fitted: ring_alpha_beta inverts the formula."""
    alpha, bandwidth = 5e-6, 25e9
    times = [
        allreduce_time(
            "ring", size_bytes=s, world_size=world_size, alpha_s=alpha, bandwidth_bps=bandwidth
        )
        for s in SIZES
    ]
    got_alpha, got_bandwidth = fit_latency(SIZES, times).ring_alpha_beta(world_size)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)
    assert got_bandwidth == pytest.approx(bandwidth, rel=1e-9)


def test_many_small_messages_pay_the_latency_each_time() -> None:
    fit = fit_latency([0, 1000], [10e-6, 11e-6])  # a = 10 µs, b = 1 ns/byte
    assert many_small_vs_one(fit, total_bytes=1000, messages=1) == pytest.approx(1)
    assert many_small_vs_one(fit, total_bytes=1000, messages=10) == pytest.approx(101 / 11)


def test_human_sizes() -> None:
    assert [human(s) for s in (4, 4096, 16 * 2**20, 397.9 * 1024)] == [
        "4 B",
        "4 KiB",
        "16 MiB",
        "398 KiB",
    ]


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="at least two"):
        fit_latency([1], [1.0])
    with pytest.raises(UsageError, match="different sizes"):
        fit_latency([8, 8], [1.0, 2.0])
    with pytest.raises(UsageError, match="positive"):
        fit_latency([1, 2], [0.0, 1.0])
    assert run_cli(main, ["--world-size", "1"]) == 2
    assert capsys.readouterr().err == "error: --world-size 1: use 2 to 8 (one machine)\n"


RECORDED = ROOT / "docs" / "generated" / "operations"


def recorded_points() -> list[tuple[int, float]]:
    return [(s, t) for s, t in json.loads((RECORDED / "bench_latency.json").read_text())["points"]]


def test_the_recorded_sweep_is_the_report_of_its_points() -> None:
    """tools/figures_operations.py wrote the table, the fit and the prose from these points."""
    tool, points = load_tool("figures_operations"), recorded_points()
    assert [s for s, _ in points] == SIZES
    text = "\n".join(report(points, world_size=2)) + "\n"
    assert (RECORDED / "bench_latency.txt").read_text() == text
    assert (RECORDED / "bench_latency_numbers.md").read_text() == tool.prose(points)


@pytest.mark.timeout(120)
def test_measure_gives_one_positive_time_per_size_and_a_report() -> None:
    """A cheap point of the recorded sweep: 4 B and 4 KiB are latency-bound there too.

    Tolerance on the times: helpers.TIMING_FACTORS["microseconds"].
    """
    points = measure(world_size=2, sizes=[4, 4096, 2**20], budget_s=0.01)
    assert [s for s, _ in points] == [4, 4096, 2**20]
    recorded = dict(recorded_points())
    for size, seconds in points[:2]:
        assert_timing(seconds, recorded[size], "microseconds", f"latency {size} B")
    lines = report(points, world_size=2)
    assert lines[0].startswith("| size |") and len(lines) == 2 + 3 + 5

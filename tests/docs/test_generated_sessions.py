"""The plots and the benchmark table of Sessions A and B are what the code gives today.

Each plot's numbers are written beside it by its tools/ script; these tests recompute
them with the script's own ``*_data`` function and compare (exactly: formulas, seeded
runs, counted bytes). The fused-kernel table is a timing: its columns must agree with each
other, its rows must be the benchmark's variants, and one cheap round must land within
helpers.TIMING_FACTORS["microseconds"] of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import ROOT, assert_timing, load_script, load_tool

GENERATED = ROOT / "docs" / "generated"


def recorded(relative: str) -> object:
    return json.loads((GENERATED / relative).read_text())


def test_model_states_by_size_is_the_formula() -> None:
    fresh = load_tool("make_figures").model_states_data()
    assert recorded("session_a/model_states_by_size.json") == fresh
    seven_b = fresh["7B"]
    assert sum(seven_b.values()) == 16 * 7e9  # the page's 16 bytes per parameter


def close(a: object, b: object) -> bool:
    """Equal structure, floats within 1e-9 relative (JSON round trip of the same numbers)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == pytest.approx(b, rel=1e-9)


def test_allreduce_plot_is_the_simulation_and_the_model() -> None:
    fresh = load_tool("figures_session_b").allreduce_data()
    assert close(recorded("session_b/allreduce.json"), fresh)


def test_loss_scale_plot_is_both_scalers_trajectories() -> None:
    fresh = load_tool("figures_session_b").loss_scale_data()
    assert recorded("session_b/loss_scale.json") == fresh
    ours, torchs = fresh.values()
    assert ours == torchs  # the plot's claim: ours follows GradScaler step for step


def test_accumulation_memory_plot_is_measured_today() -> None:
    """Two cheap points of the six (micro-batches 1 and 4): the bytes are counted, exact."""
    was = recorded("session_b/accumulation_memory.json")
    fresh = load_tool("figures_session_b").accumulation_memory_data(micro_batches=(1, 4))
    peaks = dict(zip(was["micro_batches"], was["peak_activations_mib"], strict=True))
    assert fresh["peak_activations_mib"] == [peaks[1], peaks[4]]
    assert fresh["states_mib"] == was["states_mib"]
    assert was["peak_activations_mib"] == sorted(was["peak_activations_mib"])  # grows with it


ROW = re.compile(r"^(?P<name>.+?)\s+(?P<us>[\d,]+)\s+(?P<speedup>[\d.]+)x$")


def fused_table() -> list[tuple[str, float, float]]:
    lines = (GENERATED / "session_b" / "fused_kernels.txt").read_text().splitlines()
    rows = [ROW.match(line) for line in lines[1:-1]]
    assert all(rows), lines
    return [(m["name"], float(m["us"].replace(",", "")), float(m["speedup"])) for m in rows]


def test_fused_kernels_table_agrees_with_itself_and_with_a_cheap_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = load_script("bench_fused_kernels", folder="benchmarks")
    table = fused_table()
    groups = [bench.adamw_variants(), bench.gelu_variants()]
    assert [name for name, _, _ in table] == [n for g in groups for n in g]
    start = 0
    for group in groups:  # each group's first row is its baseline
        rows = table[start : start + len(group)]
        base = rows[0][1]
        for _, us, speedup in rows:
            assert speedup == pytest.approx(base / us, abs=0.05 + 0.01 * base / us)
        start += len(group)
    monkeypatch.setattr(bench, "ROUNDS", 1)
    monkeypatch.setattr(bench, "REPEATS", 2)
    monkeypatch.setattr(bench, "WARMUP", 1)
    fresh = bench.time_group(bench.gelu_variants())
    was = {name: us for name, us, _ in table}
    for name, us in fresh.items():
        assert_timing(us, was[name], "microseconds", f"session_b {name}")


def test_the_tools_write_what_these_tests_read() -> None:
    """The files above come from `make figures` (tools/make_figures.py, figures_session_b.py)."""
    for name in ("make_figures.py", "figures_session_b.py"):
        assert (ROOT / "tools" / name).is_file()
    for rel in ("session_a/model_states_by_size", "session_b/allreduce", "session_b/loss_scale"):
        assert (GENERATED / f"{rel}.png").is_file() and (GENERATED / f"{rel}.json").is_file()
    assert Path(GENERATED / "session_b" / "fused_kernels.txt").is_file()

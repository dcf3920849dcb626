"""Week 2's speed table (docs/generated/week2/sharding_bench.*) is what the benchmark prints.

tools/figures_week2_sharding.py ran benchmarks/bench_sharding.py twice and wrote the
medians, the tables and the sentence the page quotes. These tests rebuild the text from
the medians and run one cheap round of the benchmark (1 round of 1 step), whose tokens/s
must land within helpers.TIMING_FACTORS["training"] of the recording.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, assert_timing, load_tool

RECORDED = ROOT / "docs" / "generated" / "week2"


@pytest.fixture(scope="module")
def tool():
    return load_tool("figures_week2_sharding")


def test_the_table_and_the_sentence_are_those_of_the_recorded_medians(tool) -> None:
    bench = tool.load_bench()
    runs = json.loads((RECORDED / "sharding_bench.json").read_text())["runs"]
    assert len(runs) == tool.RUNS and all(list(run) == list(bench.VARIANTS) for run in runs)
    assert (RECORDED / "sharding_bench.txt").read_text() == tool.text(bench, runs)
    assert (RECORDED / "sharding_bench_numbers.md").read_text() == tool.prose(bench, runs)


def test_the_sentence_names_the_fastest_and_the_range() -> None:
    runs = [
        {"our ZeRO-3": 100.0, "FSDP2": 75.0, "FSDP2 bf16": 120.0, "DeepSpeed ZeRO-3": 96.0},
        {"our ZeRO-3": 100.0, "FSDP2": 85.0, "FSDP2 bf16": 121.0, "DeepSpeed ZeRO-3": 77.0},
    ]
    tool = load_tool("figures_week2_sharding")
    assert tool.prose(tool.load_bench(), runs) == (
        "In both runs the fastest is FSDP2 bf16; fp32 FSDP2 and DeepSpeed ZeRO-3 ran at "
        "0.75× to 0.96× the tokens/s of our ZeRO-3.\n"
    )


@pytest.mark.timeout(240)
def test_one_cheap_round_runs_every_variant(tool) -> None:
    bench = tool.load_bench()
    fresh = bench.run(rounds=1, steps=1)
    recorded = json.loads((RECORDED / "sharding_bench.json").read_text())["runs"][0]
    for name, tokens_per_s in fresh.items():
        was = recorded[name]
        assert_timing(tokens_per_s, was, "training", f"sharding bench {name} tokens/s")


def test_the_zero_table_is_the_benchmarks_report_of_the_recorded_rows() -> None:
    tool = load_tool("figures_week2_zero_bench")
    bench = tool.load_bench()
    rows = json.loads((RECORDED / "zero_bench.json").read_text())
    assert [r["variant"] for r in rows[:-1]] == list(bench.VARIANTS)
    assert (RECORDED / "zero_bench.txt").read_text() == bench.report(rows) + "\n"

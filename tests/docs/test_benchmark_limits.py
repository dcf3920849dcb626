"""`make bench` prints, after each benchmark, what limits it here and what changes on GPUs."""

import ast

import pytest

from helpers import ROOT

BENCHES = sorted((ROOT / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHES, ids=[p.stem for p in BENCHES])
def test_every_benchmark_says_what_limits_it(path) -> None:
    tree = ast.parse(path.read_text())
    limits = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["LIMITS"]
    ]
    assert limits, f"{path.name}: add LIMITS, printed by run_all.py after the table"
    assert limits[0].startswith("Here: ") and "GPU" in limits[0]

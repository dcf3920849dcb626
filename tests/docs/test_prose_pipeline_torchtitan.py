"""The numbers in the prose of docs/week-3/pipeline-torchtitan.md, against the tests that
enforce them and the arithmetic they come from:

- the parity tolerances the page states are those of
  tests/tinyscale/pipeline_parallel/test_torch_pipeline.py (PARITY_TOLERANCE, and the bound
  that shows torch's default scaling wrong), and the table's threshold (grad_diff);
- the exercise's weighting of a 16-layer model into 4 stages.
"""

from __future__ import annotations

import ast
import re

import pytest

from helpers import ROOT, fails_when_changed, prose, said
from tinyscale.pipeline_parallel.torch_pipeline import grad_diff

PAGE = "week-3/pipeline-torchtitan.md"
PARITY_TESTS = ROOT / "tests" / "tinyscale" / "pipeline_parallel" / "test_torch_pipeline.py"


def parity_tolerance() -> float:
    """PARITY_TOLERANCE of the parity tests, read from their source (importing them would
    import their fixtures and launch helpers for one constant)."""
    tree = ast.parse(PARITY_TESTS.read_text())
    (value,) = (
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["PARITY_TOLERANCE"]
    )
    return value


def check_scaling_bounds(text: str) -> None:
    off, ours = said(
        text,
        r"a V of one rank: the default is off by more than ([\de.-]+), ours within ([\de.-]+)\.",
    )
    assert float(ours) == parity_tolerance()
    (bound,) = re.findall(r"one_rank_v\(scale_grads=True\) > ([\de.-]+)", PARITY_TESTS.read_text())
    assert float(off) == float(bound)


def check_parity_tolerance(text: str) -> None:
    tolerance = parity_tolerance()
    (below,) = said(text, r"one process's gradients\*\*: below ([\de.-]+) on every parameter")
    (allowed,) = said(text, r"the tests allow ([\de.-]+) \(fp32\) at p = 2 \(this table\)")
    (within,) = said(
        text, r"`test_our_from_scratch_pipeline_equals_torchs` finds the same gradients within "
        r"([\de.-]+)\."
    )  # fmt: skip
    assert float(below) == float(allowed) == float(within) == tolerance
    assert grad_diff(tolerance / 2) == f"< {below}"  # the table's column reads the same


def check_sixteen_layers(text: str) -> None:
    layers, weighted, total, per_two, stages, quotient = said(
        text,
        r"(\d+) \+ (\d+) = (\d+) \"blocks\": (\d+) per stage for 2 stages, .*? For (\d) stages "
        r"\3 / \5 = ([\d.]+): two stages weigh",
    )
    assert int(layers) + int(weighted) == int(total)
    assert int(per_two) == int(total) // 2
    assert float(quotient) == int(total) / int(stages)


CHECKS = [check_scaling_bounds, check_parity_tolerance, check_sixteen_layers]


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_tests(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_scaling_bounds, "more than 1e-3, ours", "more than 1e-2, ours"),
        (check_scaling_bounds, "ours within 1e-6.", "ours within 1e-5."),
        (check_parity_tolerance, "tests allow 1e-6 (fp32)", "tests allow 1e-5 (fp32)"),
        (check_sixteen_layers, "18 / 4 = 4.5", "18 / 4 = 4.25"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

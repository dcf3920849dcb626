"""The GPU stack page's compute capabilities in prose agree with its table and its rules.

The table of compute capabilities cites NVIDIA's list of CUDA GPUs (a rule in
tests/docs/prose_rules/operations.py); what the page then says with those numbers is read
here: the sm_86 example follows tinyscale.ops.gpu_compat.check_kernels, and the exercise's
GPUs have the table's capabilities, as its code block passes them.
"""

from __future__ import annotations

import re

import pytest

from helpers import fails_when_changed, prose, said
from tinyscale.ops.gpu_compat import check_kernels

PAGE = "operations/gpu-stack.md"
# a cell of the table: its numbers pass by their cited source, not by this test
TABLE_ROW = r"\| ([A-Z][\w ,]+?) \| (\d+)\.(\d) \|"


def capabilities(text: str) -> dict[str, tuple[int, int]]:
    """GPU -> compute capability, from the page's two-column table."""
    found: dict[str, tuple[int, int]] = {}
    for names, major, minor in re.findall(TABLE_ROW, text):
        for name in names.split(", "):
            found[name] = (int(major), int(minor))
    assert {"V100", "T4", "A100", "L4", "H100", "B200"} <= set(found)
    return found


def check_sm86(text: str) -> None:
    l4, h100 = said(
        text, r"So `sm_86` kernels run on an L4 \((\d+\.\d)\), but not on an H100 \((\d+\.\d)\)\."
    )
    table = capabilities(text)
    assert (l4, h100) == tuple(".".join(map(str, table[g])) for g in ("L4", "H100"))
    assert check_kernels(table["L4"], ["sm_86"]).ok
    assert not check_kernels(table["H100"], ["sm_86"]).ok


def check_exercise(text: str) -> None:
    v100, t4, l4 = said(
        text, r"Your cluster has V100 \((\d+\.\d)\), T4 \((\d+\.\d)\) and L4 \((\d+\.\d)\) nodes\."
    )
    table = capabilities(text)
    said_here = {"V100": v100, "T4": t4, "L4": l4}
    for gpu, cc in said_here.items():
        assert cc == "{}.{}".format(*table[gpu]), gpu
    (code,) = said(text, r"for gpu, cc in (\[\(\"V100\".*?\)\]):")
    passed = {g: (int(a), int(b)) for g, a, b in re.findall(r'\("(\w+)", \((\d+), (\d+)\)\)', code)}
    assert passed == {gpu: table[gpu] for gpu in said_here}


@pytest.mark.parametrize("check", [check_sm86, check_exercise])
def test_the_pages_capabilities_agree(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_sm86, "run on an L4 (8.9)", "run on an L4 (8.6)"),
        (check_exercise, "T4 (7.5) and L4", "T4 (7.0) and L4"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)

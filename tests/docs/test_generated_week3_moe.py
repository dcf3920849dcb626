"""The MoE measurements of docs/week-3/moe.md (docs/generated/week3/moe*).

tools/figures_week3_moe.py trained every variant for 200 steps. Here: the two tables the
page includes are rebuilt from the JSON; the page's short run (the first 20 steps of the
same 200-step schedule, for the MoE, which pytest-codeblocks re-runs) must show the
recorded sizes, FLOPs, held-out losses and load at step 20; and every number the page's
prose takes from the runs holds for the data.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import ROOT, fails_when_changed, load_tool, prose, recorded_output, said

RECORDED = ROOT / "docs" / "generated" / "week3"
DATA = json.loads((RECORDED / "moe_curves.json").read_text())
RUNS = DATA["runs"]
PERCENT_ROUNDING = 0.05  # a percentage printed to one decimal
PAGE_COMMAND = next(
    line for line in (ROOT / "docs" / "week-3" / "moe.md").read_text().splitlines()
    if "--max-steps 20 --variants moe" in line
)  # fmt: skip


@pytest.fixture(scope="module")
def tool():
    return load_tool("figures_week3_moe")


def test_the_tables_are_the_json(tool) -> None:
    assert (RECORDED / "moe_compare.md").read_text() == tool.compare_table(RUNS)
    assert (RECORDED / "moe_balance.md").read_text() == tool.balance_table(RUNS)


def test_the_pages_short_run_reproduces_the_first_evaluation() -> None:
    """The page runs the MoE's first 20 steps of the same 200-step schedule;
    pytest-codeblocks checks its output is today's, and here it must be the JSON's."""
    page = recorded_output("week-3/moe.md", "--max-steps 20 --variants moe")
    assert f"--steps {DATA['steps']} --max-steps {DATA['eval_every']}" in PAGE_COMMAND
    rows = {line.split()[0]: line.split() for line in page[1:]}
    assert sorted(rows) == ["moe"]
    for variant, cells in rows.items():
        run = RUNS[variant]
        assert RUNS[variant]["curve"][1][0] == DATA["eval_every"]
        assert cells[1:4] == [f"{run['parameters']:,}", f"{run['active']:,}",
                              f"{run['flops'] / 1e6:,.0f}"]  # fmt: skip
        assert float(cells[4]) == round(run["curve"][1][1], 3)
    assert float(rows["moe"][5]) == round(RUNS["moe"]["imbalance"][0][1], 2)


def final(variant: str) -> float:
    return RUNS[variant]["curve"][-1][1]


def test_the_pages_claims_hold_for_the_runs() -> None:
    text = prose("week-3/moe.md")
    gap, from_step = said(text, r"it ends\s+(\d\.\d+) lower in held-out loss, and is ahead at "
                                r"every evaluation from step (\d+) on")  # fmt: skip
    assert float(gap) == round(final("dense") - final("moe"), 2)
    dense, moe = (dict((int(s), v) for s, v in RUNS[n]["curve"]) for n in ("dense", "moe"))
    ahead = [s for s in moe if s and all(moe[t] < dense[t] for t in moe if t >= s)]
    assert min(ahead) == int(from_step)
    (flops,) = said(text, r"spends (\d\.\d+) times the FLOPs per step")
    assert float(flops) == round(RUNS["dense-wide"]["flops"] / RUNS["moe"]["flops"], 1)
    assert final("dense-wide") == max(final(v) for v in RUNS)  # "the worst of the five"
    (behind,) = said(text, r"the MoE ends (\d\.\d+) behind\s+the aux-loss version")
    assert float(behind) == round(final("moe-none") - final("moe"), 2)


def check_balance(text: str) -> None:
    (peak,) = said(text, r"max/mean averaged (\d\.\d) over steps 21 to 40")
    assert float(peak) == round(dict(RUNS["moe-none"]["imbalance"])[40], 1)
    assert min(min(layer) for layer in RUNS["moe-none"]["load"]) == 0  # "no token at all"
    (even,) = said(text, r"the load ends within (\d\.\d)× of even")
    assert all(RUNS[v]["imbalance"][-1][1] < float(even) for v in ("moe", "moe-bias"))
    low, high = said(text, r"A factor of 1 drops (\d+) % to (\d+) % of the")
    at_one = [RUNS[v]["drop_rate"]["1"] for v in ("moe", "moe-bias")]
    assert (int(low), int(high)) == (round(min(at_one) * 100), round(max(at_one) * 100))
    assert all(RUNS[v]["drop_rate"]["2"] == 0 for v in ("moe", "moe-bias"))  # "2 drops none"
    assert all(RUNS[v]["drop_rate"]["dropless"] == 0 for v in ("moe", "moe-bias", "moe-none"))
    (collapsed,) = said(
        text, r"The collapsed router still drops (\d+\.\d) % of its assignments at 1\.5"
    )
    # the page gives the percentage to one decimal: within half of its last digit
    assert abs(100 * RUNS["moe-none"]["drop_rate"]["1.5"] - float(collapsed)) <= PERCENT_ROUNDING
    share, few = said(text, r"without balancing, (\d+) % of the 4,096\s+held-out tokens go to "
                            r"three of the eight experts, and four get fewer than (\d+) each")  # fmt: skip
    last = sorted(RUNS["moe-none"]["load"][-1], reverse=True)
    assert sum(last) == 4096 and round(100 * sum(last[:3]) / 4096) == int(share)
    assert max(last[4:]) < int(few) <= last[3]


def test_the_pages_balance_claims_hold_for_the_runs() -> None:
    check_balance(prose("week-3/moe.md"))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("still drops 24.5 % of", "still drops 25.0 % of"),
        ("averaged 7.8 over", "averaged 6.8 over"),
    ],
)
def test_self_check_a_changed_balance_number_fails(old: str, new: str) -> None:
    fails_when_changed(check_balance, prose("week-3/moe.md"), old, new)


def test_the_pages_parameter_claims_hold_for_its_demo() -> None:
    text = prose("week-3/moe.md")
    rows = recorded_output("week-3/moe.md", "expert_parallel.moe import demo")
    found = (re.search(r"([\d,]+) parameters,\s+([\d,]+) used per token", line) for line in rows)
    counts = [[int(n.replace(",", "")) for n in match.groups()] for match in found if match]
    (dense, _), (top1, top1_used), _ = counts
    (ratio,) = said(text, r"Top 1 of 8 full-width experts holds (\d\.\d) times")
    assert float(ratio) == round(top1 / dense, 1)
    (more,) = said(text, r"a token uses\s+([\d,]+) more than the dense model")
    assert int(more.replace(",", "")) == top1_used - dense == 2 * 64 * 8  # the routers
    assert (
        f"{ratio} times the\n    dense model's parameters"
        in (ROOT / "docs/week-3/moe.md").read_text()
    )  # and in the answer

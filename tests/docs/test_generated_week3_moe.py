"""The MoE measurements of docs/week-3/moe.md (docs/generated/week3/moe*).

tools/figures_week3_moe.py trained every variant for 200 steps. Here: the two tables the
page includes are rebuilt from the JSON; the first 20 steps of dense and of moe (the same
200-step schedule, stopped early) are run again and must reproduce the recorded held-out
losses and the MoE's load at step 20; and every number the page's prose takes from the
runs holds for the data.
"""

from __future__ import annotations

import json

import pytest

from helpers import ROOT, load_tool, prose, said

RECORDED = ROOT / "docs" / "generated" / "week3"
DATA = json.loads((RECORDED / "moe_curves.json").read_text())
RUNS = DATA["runs"]
SAME_ARITHMETIC = 1e-4  # the same code on the same kernels (one thread, pinned ISA)


@pytest.fixture(scope="module")
def tool():
    return load_tool("figures_week3_moe")


def test_the_tables_are_the_json(tool) -> None:
    assert (RECORDED / "moe_compare.md").read_text() == tool.compare_table(RUNS)
    assert (RECORDED / "moe_balance.md").read_text() == tool.balance_table(RUNS)


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_a_fresh_run_reproduces_the_first_evaluation(variant: str) -> None:
    from tinyscale.core.data import build_datasets
    from tinyscale.model_parallel.moe_compare import train_variant
    from tinyscale.model_parallel.moe_routing import MoEConfig

    data = build_datasets(vocab_size=1024, block_size=64)
    every = DATA["eval_every"]
    moe = MoEConfig(**DATA["moe"])
    fresh = train_variant(variant, data, moe, steps=DATA["steps"], eval_every=every,
                          max_steps=every)  # fmt: skip
    recorded = dict((int(s), loss) for s, loss in RUNS[variant]["curve"])
    assert [s for s, _ in fresh.curve] == [0, every]
    for step, loss in fresh.curve:
        assert abs(loss - recorded[step]) < SAME_ARITHMETIC, (variant, step, loss, recorded[step])
    if variant == "moe":
        assert fresh.imbalance[0][1] == pytest.approx(RUNS["moe"]["imbalance"][0][1], abs=1e-6)


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


def test_the_pages_balance_claims_hold_for_the_runs() -> None:
    text = prose("week-3/moe.md")
    (peak,) = said(text, r"max/mean averaged (\d\.\d) over steps 21 to 40")
    assert float(peak) == round(dict(RUNS["moe-none"]["imbalance"])[40], 1)
    assert min(min(layer) for layer in RUNS["moe-none"]["load"]) == 0  # "no token at all"
    (even,) = said(text, r"the load ends within (\d\.\d)× of even")
    assert all(RUNS[v]["imbalance"][-1][1] < float(even) for v in ("moe", "moe-bias"))
    low, high = said(text, r"A factor of 1 drops (\d+) % to (\d+) % of the")
    at_one = [RUNS[v]["drop_rate"]["1"] for v in ("moe", "moe-bias")]
    assert (int(low), int(high)) == (round(min(at_one) * 100), round(max(at_one) * 100))
    assert all(RUNS[v]["drop_rate"]["2"] == 0 for v in ("moe", "moe-bias"))  # "2 drops none"
    assert round(RUNS["moe-none"]["drop_rate"]["1.5"], 1) == 0.2  # "a quarter ... at 1.5"

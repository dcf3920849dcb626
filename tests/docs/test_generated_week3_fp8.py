"""The fp8 loss curves of docs/week-3/fp8.md (docs/generated/week3/fp8_curves.*).

tools/figures_week3_fp8.py trained every variant for 200 steps. Here: the table the page
includes is rebuilt from the JSON; the first 20 steps of fp32 and of fp8-tensorwise (the
same 200-step schedule, stopped early) are run again and must reproduce the recorded
held-out losses at step 20; and the page's sentences about the curves hold for the data.
"""

from __future__ import annotations

import json
import math

import pytest

from helpers import ROOT, load_tool, prose, said

RECORDED = ROOT / "docs" / "generated" / "week3"
CURVES = json.loads((RECORDED / "fp8_curves.json").read_text())
SAME_ARITHMETIC = 1e-4  # the same code on the same kernels (one thread, pinned ISA)


@pytest.fixture(scope="module")
def tool():
    return load_tool("figures_week3_fp8")


def test_the_table_is_the_json(tool) -> None:
    assert (RECORDED / "fp8_curves.md").read_text() == tool.table(CURVES["curves"])


@pytest.mark.parametrize("variant", ["fp32", "fp8-tensorwise"])
def test_a_fresh_run_reproduces_the_first_evaluation(tool, variant: str) -> None:

    from tinyscale.core.data import build_datasets
    from tinyscale.low_precision.compare import train_variant

    data = build_datasets(vocab_size=1024, block_size=64)
    every = CURVES["eval_every"]
    fresh = train_variant(variant, data, steps=CURVES["steps"], eval_every=every, max_steps=every)
    recorded = dict((int(s), loss) for s, loss in CURVES["curves"][variant])
    assert [s for s, _ in fresh.curve] == [0, every]
    for step, loss in fresh.curve:
        assert abs(loss - recorded[step]) < SAME_ARITHMETIC, (variant, step, loss, recorded[step])


def test_the_pages_claims_hold_for_the_curves() -> None:
    curves = CURVES["curves"]
    final = {v: c[-1][1] for v, c in curves.items()}
    text = prose("week-3/fp8.md")
    (gap,) = said(text, r"every scaled recipe ends within (\d\.\d+) of fp32's held-out loss")
    scaled = ["bf16", *(v for v in final if v.startswith("fp8-") and v != "fp8-unscaled")]
    assert max(abs(final[v] - final["fp32"]) for v in scaled) < float(gap)
    assert (
        min(final[v] - final["fp32"] for v in scaled)
        < 0
        < max(final[v] - final["fp32"] for v in scaled)
    )
    keeps_up, low, high, behind = said(
        text,
        r"For (\d+) steps it keeps up .*? then it stays flat, between (\d\.\d+) and (\d\.\d+), while "
        r"the others go on down, and ends (\d\.\d+) above fp32 after 200 steps",
    )
    unscaled = dict((int(s), loss) for s, loss in curves["fp8-unscaled"])
    fp32 = dict((int(s), loss) for s, loss in curves["fp32"])
    assert unscaled[int(keeps_up)] < fp32[int(keeps_up)] + 0.01  # not behind at that step
    later = [loss for s, loss in unscaled.items() if s > int(keeps_up)]
    assert (float(low), float(high)) == (  # flat: the range of every later evaluation
        math.floor(min(later) * 100) / 100,
        math.ceil(max(later) * 100) / 100,
    )
    assert float(high) - float(low) < 0.1
    assert fp32[CURVES["steps"]] < fp32[int(keeps_up)] - 0.4  # while fp32 goes on down
    assert float(behind) == round(final["fp8-unscaled"] - final["fp32"], 2)


def test_the_pages_cpu_times_are_the_recorded_ones() -> None:
    fp8, fp32, bf16 = said(
        prose("week-3/fp8.md"),
        r"a step took (\d\.\d+) s of CPU in fp8-tensorwise against (\d\.\d+) s in fp32, and "
        r"(\d\.\d+) s in bf16",
    )
    per_step = CURVES["cpu_seconds_per_step"]
    assert (float(fp8), float(fp32), float(bf16)) == tuple(
        round(per_step[v], 2) for v in ("fp8-tensorwise", "fp32", "bf16")
    )

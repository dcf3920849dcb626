"""The numbers in the prose of docs/week-3/fp8.md that tests/docs/test_generated_week3_fp8.py
and the compat tests do not read, against the formats, the page's compared outputs and the
code:

- the widths of the formats (bits, bytes per parameter, "half", "halving") and e5m2's max,
  from torch's dtypes; what e5m2fnuz makes of 1.125;
- Step 2's gradients: the median, the smallest subnormals, the shares lost, from the page's
  expected outputs (compared with a fresh run by pytest-codeblocks);
- the model states' bytes per parameter, from the memory calculator's table;
- the 200-step runs' settings, from docs/generated/week3/fp8_curves.json;
- Week 2's fp32 torchtitan losses the fp8 run is compared with, from that page's output;
- the compute capability fp8 needs, from torchtitan's float8 converter;
- the two exercises' numbers, from their compared outputs and a fresh run of the history.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from helpers import ROOT, fails_when_changed, prose, recorded_output, said
from tinyscale.core.memory import RECIPES
from tinyscale.low_precision.scaling import E4M3, DelayedScaling

PAGE = "week-3/fp8.md"
CURVES = json.loads((ROOT / "docs" / "generated" / "week3" / "fp8_curves.json").read_text())


def byte_size(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def check_widths(text: str) -> None:
    fp8, bf16, fp32 = byte_size(E4M3), byte_size(torch.bfloat16), byte_size(torch.float32)
    assert byte_size(torch.float8_e5m2) == fp8
    said(text, r"Half the bits means half the bytes to move, and tensor cores")
    assert 2 * fp8 == bf16
    (bits,) = said(text, r"this page goes one step further, to (\d+) bits")
    assert int(bits) == torch.finfo(E4M3).bits == 8 * fp8
    gathered = said(
        text, r"which moves (\d+) byte per parameter instead of (\d+) \(or (\d+) in bf16\)"
    )
    assert tuple(map(int, gathered)) == (fp8, fp32, bf16)
    said(text, r"the matmul's operands \(half of bf16's bytes through the tensor cores\)")
    gathered = said(text, r"the weights gathered before every layer: (\d+) byte per parameter "
                          r"instead of (\d+) in bf16")  # fmt: skip
    assert tuple(map(int, gathered)) == (fp8, bf16)
    said(text, r"all-gather the weights in fp8, halving the bytes of every gather against bf16")
    (e5m2_max,) = said(text, r"e5m2 reaches ([\d,]+) and overflows to inf")
    assert int(e5m2_max.replace(",", "")) == torch.finfo(torch.float8_e5m2).max


def check_fnuz_step(text: str) -> None:
    eps, value, back = said(
        text,
        r"it reports eps = ([\d.]+) for `float8_e5m2fnuz`, yet ([\d.]+) cast to it comes back "
        r"as ([\d.]+);",
    )
    assert torch.finfo(torch.float8_e5m2fnuz).eps == float(eps)
    cast = torch.tensor(float(value)).to(torch.float8_e5m2fnuz).float().item()
    assert cast == float(back) != float(value)


def lost_to_zero(kind: str) -> dict[str, float]:
    """Step 2's compared output: format -> share of ``kind`` lost to zero."""
    lines = recorded_output(PAGE, "one_step_tensors()")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{kind} ("))
    rows = (re.match(r"(\w+)\s+lost to zero\s+([\d.]+)%", line) for line in lines[start + 1 :])
    shares = {}
    for row in rows:
        if not row:
            break
        shares[row[1]] = float(row[2]) / 100
    return shares


def check_gradients(text: str) -> None:
    median, e4m3_sub, e5m2_sub = said(
        text,
        r"the median output gradient is ([\de.-]+), below e4m3's smallest subnormal "
        r"\(([\d.]+)\) and near e5m2's \(([\de.-]+)\)",
    )
    (recorded,) = (
        re.search(r"median \|x\| ([\de.+-]+)", line)[1]
        for line in recorded_output(PAGE, "one_step_tensors()")
        if line.startswith("output gradients")
    )
    assert float(median) == float(recorded)
    smallest = {
        d: torch.finfo(d).smallest_normal * torch.finfo(d).eps for d in (E4M3, torch.float8_e5m2)
    }
    assert float(e4m3_sub) == round(smallest[E4M3], 3)
    assert float(e5m2_sub) == float(f"{smallest[torch.float8_e5m2]:.1e}")
    said(text, r"e4m3 loses almost all of them and e5m2 over a third; bf16 loses none")
    said(text, r"a plain cast to e5m2 flushing over a third of their output gradients to zero")
    lost = lost_to_zero("output gradients")
    assert lost["e4m3"] > 0.95 and 1 / 3 < lost["e5m2"] < 1 / 2 and lost["bf16"] == 0


def check_model_states(text: str) -> None:
    found = said(
        text, r"fp32 AdamW state: (\d+) \+ (\d+) \+ (\d+) = (\d+) bytes per parameter again"
    )
    weights, grads, optimizer, total = map(int, found)
    assert (weights, grads, optimizer) == tuple(RECIPES["fp32"])
    assert total == sum(RECIPES["fp32"])


def check_runs(text: str) -> None:
    steps, variants = said(text, r"The same for (\d+) steps and all (\w+) variants")
    assert int(steps) == CURVES["steps"]
    assert {"six": 6}[variants] == len(CURVES["curves"])
    (first,) = said(text, r"re-runs the first (\d+) steps of fp32 and fp8-tensorwise")
    assert int(first) == CURVES["eval_every"]


def check_week2_losses(text: str) -> None:
    first, last = said(text, r"of the fp32 run's at every step \(([\d.]+) at step 1 there, "
                             r"([\d.]+) at step 6\)")  # fmt: skip
    lines = recorded_output("week-2/torchtitan.md", "--config tinyscale_debug 2>&1")
    steps = (re.match(r"step: +(\d+) +loss: +([\d.]+)", line) for line in lines)
    losses = {int(m[1]): m[2] for m in steps if m}
    assert (first, last) == (losses[1], losses[6])


def check_exercise_range(text: str) -> None:
    low, high = said(text, r"A tensor's values are all between ([\de.-]+) and ([\de.-]+)\. Cast")
    exponents = round(math.log10(float(low))), round(math.log10(float(high)))
    assert f"torch.logspace({exponents[0]}, {exponents[1]}, 201)" in text
    lines = recorded_output(PAGE, "torch.logspace(")
    (lost,) = (re.match(r"no scale: +(\d+)% lost", line)[1] for line in lines[:1])
    (scale,) = (re.search(r"scale (\d+)$", line)[1] for line in lines[1:])
    threshold, share = said(
        text,
        r"below half of e4m3's smallest subnormal \(2\^−10 ≈ ([\d.]+)\) rounds to zero: "
        r"(\d+) % of these values, the lower of the two decades",
    )
    assert math.ldexp(1, -10) == torch.finfo(E4M3).smallest_normal * torch.finfo(E4M3).eps / 2
    assert float(threshold) == round(math.ldexp(1, -10), 3)
    assert int(share) == int(lost)
    (smallest,) = said(text, r"the largest value lands on 448 and the smallest on ([\d.]+):")
    assert float(smallest) == round(float(low) * int(scale), 2)


def spike_scales(history: int, spike_at: int, steps: int) -> list[float]:
    delayed = DelayedScaling(history=history)
    return [
        delayed.scale(torch.tensor([100.0 if step == spike_at else 1.0]), E4M3).item()
        for step in range(steps)
    ]


def check_exercise_spike(text: str) -> None:
    history, jump = said(
        text, r"With a history of (\d+) steps, an activation's amax jumps from 1 to (\d+) for"
    )
    assert f"DelayedScaling(history={history})" in text
    window, first, last = said(text, r"sits in the history for (\d+) steps, (\d+) to (\d+):")
    scales = spike_scales(int(history), spike_at=2, steps=20)
    small = [step for step, s in enumerate(scales) if s < scales[0]]
    assert small == list(range(int(first), int(last) + 1))
    assert len(small) == int(window) == int(history)
    rows = [line.split() for line in recorded_output(PAGE, "DelayedScaling(history=16)")[1:]]
    by_step = {int(row[0]): row for row in rows}
    assert by_step[2][1] == jump and by_step[2][3] == "1.0"  # the spike, saturated
    smaller, lands, lost, usual, sooner = said(
        text,
        r"the scale is (\d+) times smaller than it needs to be, the ordinary values, around 1, "
        r"land on ([\d.]+) instead of 448, about 7 powers of two lower, and their smaller "
        r"neighbours are lost below ([\de.-]+) instead of ([\de.-]+), (\d+) times sooner",
    )
    assert round(float(by_step[0][2]) / float(by_step[3][2])) == int(smaller) == int(jump)
    assert by_step[3][4] == lands and round(math.log2(448 / float(lands))) == 7
    assert (by_step[3][5], by_step[0][5]) == (lost, usual)
    assert round(float(lost) / float(usual)) == int(sooner)


CHECKS = [
    check_widths, check_fnuz_step, check_gradients, check_model_states, check_runs,
    check_week2_losses, check_exercise_range, check_exercise_spike,
]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS)
def test_the_pages_numbers_are_those_of_the_formats_runs_and_code(check) -> None:
    check(prose(PAGE))


def torchtitan_float8_source() -> str:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtitan is in the cluster extra: make setup")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return (folder / "components" / "quantization" / "float8.py").read_text()


def check_capability(text: str) -> None:
    (before,) = said(text, r"anything before compute capability ([\d.]+) or an MI300")
    (more,) = said(
        text, r"compute capability ([\d.]+) or more, the check torchtitan's float8 converter makes"
    )
    major, minor = (int(x) for x in before.split("."))
    assert before == more
    assert f"has_cuda_capability({major}, {minor})" in torchtitan_float8_source()


def test_the_capability_is_the_one_torchtitan_checks() -> None:
    check_capability(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_widths, "to 8 bits", "to 4 bits"),
        (check_widths, "reaches 57,344", "reaches 65,504"),
        (check_fnuz_step, "comes back as 1.0;", "comes back as 1.25;"),
        (check_gradients, "gradient is 1.6e-5", "gradient is 1.6e-6"),
        (check_gradients, "e5m2 over a third;", "e5m2 over a half;"),
        (check_model_states, "4 + 4 + 8 = 16 bytes per parameter again", "4 + 4 + 8 = 12 bytes per parameter again"),
        (check_runs, "re-runs the first 20 steps", "re-runs the first 40 steps"),
        (check_week2_losses, "(8.16075 at step 1", "(8.16076 at step 1"),
        (check_exercise_range, "rounds to zero: 49 %", "rounds to zero: 50 %"),
        (check_exercise_range, "smallest on 4.48:", "smallest on 0.448:"),
        (check_exercise_spike, "for 16 steps, 3 to 18:", "for 16 steps, 3 to 19:"),
        (check_exercise_spike, "land on 4.5 instead", "land on 4.48 instead"),
        (check_capability, "before compute capability 8.9", "before compute capability 9.0"),
    ],
)  # fmt: skip
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    if check is check_capability:
        torchtitan_float8_source()  # skips where torchtitan is not installed
    fails_when_changed(check, prose(PAGE), old, new)

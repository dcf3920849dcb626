"""tinyscale.low_precision.formats: each format's range and precision, measured by casting,
agree with torch.finfo and the bit layouts; what a cast does to a real training step's
gradients and weights. In-process, a second.
"""

import math

import pytest
import torch

from helpers import one_line_error
from tinyscale.low_precision.formats import (
    FORMATS,
    main,
    measure,
    one_step_tensors,
    roundtrip,
    survival,
)

# The bit layouts the standards give: (exponent bits, mantissa bits); the sign is the last bit
LAYOUT = {
    "fp32": (8, 23), "bf16": (8, 7), "fp16": (5, 10),
    "e4m3": (4, 3), "e5m2": (5, 2), "e4m3fnuz": (4, 3), "e5m2fnuz": (5, 2),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FORMATS))
def test_measured_facts_agree_with_the_layout_and_finfo(name: str) -> None:
    facts, info = measure(name), torch.finfo(FORMATS[name])
    assert (facts.exponent_bits, facts.mantissa_bits) == LAYOUT[name]
    assert facts.eps == 2.0**-facts.mantissa_bits
    assert facts.smallest_subnormal == facts.smallest_normal * facts.eps  # every mantissa bit
    assert facts.smallest_normal == info.smallest_normal
    if name != "e5m2fnuz":  # finfo says 0.125 there; the cast says 0.25, as 2 bits give
        assert facts.eps == info.eps
    else:
        assert info.eps == 0.125 != facts.eps  # the page's warning: if finfo is fixed, update it


def test_what_a_value_past_the_max_becomes() -> None:
    big = torch.tensor([500.0, 1e6, -1e6])
    assert roundtrip(big, "e4m3").tolist() == [448.0, 448.0, -448.0]  # saturates
    assert math.isinf(roundtrip(big, "e5m2")[1].item())  # overflows
    assert roundtrip(big, "e4m3fnuz").isnan()[1:].all()  # no inf to go to
    assert survival(big, "e4m3").saturated == 1.0 and survival(big, "e4m3").overflowed == 0
    assert survival(big, "e5m2").overflowed == 2 / 3 and survival(big, "e5m2").saturated == 0
    assert [measure(n).on_overflow for n in ("e4m3", "e5m2", "e4m3fnuz", "bf16")] == [
        "max", "inf", "nan", "inf",
    ]  # fmt: skip


def test_gradient_sized_values_underflow_in_fp8_and_not_in_bf16() -> None:
    # values around 1e-5: below e4m3's smallest subnormal (2^-9), around e5m2's (2^-16)
    tiny = torch.logspace(-5.5, -4.5, 1001)
    assert survival(tiny, "e4m3").flushed == 1.0
    assert 0.2 < survival(tiny, "e5m2").flushed < 0.6
    assert survival(tiny, "bf16").flushed == survival(tiny, "fp16").flushed == 0.0


@pytest.fixture(scope="module")
def real_step() -> dict[str, torch.Tensor]:
    return one_step_tensors()


def test_a_real_steps_gradients_need_scaling_for_e4m3(real_step) -> None:
    weights, grads = real_step["weights"], real_step["weight gradients"]
    lost = {name: survival(grads, name).flushed for name in ("bf16", "e5m2", "e4m3")}
    assert lost["bf16"] == 0 and lost["e5m2"] < 0.1 < 0.5 < lost["e4m3"]
    assert survival(weights, "e4m3").flushed < 0.1  # weights are larger: most survive
    assert survival(grads, "bf16").rel_error < 0.004 < survival(grads, "e5m2").rel_error


def test_bad_format_is_one_line() -> None:
    message = one_line_error(main, ["e3m4"])
    assert message.startswith("unknown format 'e3m4': use one of fp32, bf16, fp16, e4m3")

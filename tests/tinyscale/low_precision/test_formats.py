"""tinyscale.low_precision.formats: each format's range and precision, measured by casting,
agree with torch.finfo and the bit layouts; what a cast does to a real training step's
gradients and weights. In-process, a second.
"""

import math

import pytest
import torch

from helpers import one_line_error
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import build_datasets, get_batch
from tinyscale.core.model import TinyTransformer
from tinyscale.low_precision.formats import FORMATS, LAYOUT, main, measure, roundtrip, survival


@pytest.mark.parametrize("name", list(FORMATS))
def test_measured_facts_agree_with_finfo_and_the_layout(name: str) -> None:
    facts, info = measure(name), torch.finfo(FORMATS[name])
    exponent, mantissa = LAYOUT[name]
    assert facts.bits == info.bits == 1 + exponent + mantissa
    assert facts.max == info.max and facts.smallest_normal == info.smallest_normal
    if name != "e5m2fnuz":  # finfo says 0.125 there; the cast says 0.25, as 2 bits give
        assert facts.eps == info.eps
    assert facts.eps == 2.0**-mantissa
    assert roundtrip(torch.tensor(1 + facts.eps / 2), name).item() == 1.0  # ties to even
    assert roundtrip(torch.tensor(facts.max), name).item() == facts.max


def test_what_a_value_past_the_max_becomes() -> None:
    big = torch.tensor([500.0, 1e6, -1e6])
    assert roundtrip(big, "e4m3").tolist() == [448.0, 448.0, -448.0]  # saturates
    assert math.isinf(roundtrip(big, "e5m2")[1].item())  # overflows
    assert roundtrip(big, "e4m3fnuz").isnan()[1:].all()  # no inf to go to
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
def real_step() -> tuple[torch.Tensor, torch.Tensor]:
    """All weights and gradients of the course model after one real backward pass."""
    torch.manual_seed(0)
    data = build_datasets(vocab_size=1024, block_size=64)
    model = TinyTransformer(ModelConfig())
    model(*get_batch(data.train, torch.arange(16), torch.device("cpu")))[1].backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return weights, grads


def test_a_real_steps_gradients_need_scaling_for_e4m3(real_step) -> None:
    weights, grads = real_step
    lost = {name: survival(grads, name).flushed for name in ("bf16", "e5m2", "e4m3")}
    assert lost["bf16"] == 0 and lost["e5m2"] < 0.1 < 0.5 < lost["e4m3"]
    assert survival(weights, "e4m3").flushed < 0.1  # weights are larger: most survive
    assert survival(grads, "bf16").rel_error < 0.004 < survival(grads, "e5m2").rel_error


def test_bad_format_is_one_line() -> None:
    message = one_line_error(main, ["e3m4"])
    assert message.startswith("unknown format 'e3m4': use one of fp32, bf16, fp16, e4m3")

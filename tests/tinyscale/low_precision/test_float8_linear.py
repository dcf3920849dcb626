"""tinyscale.low_precision.scaling and float8_linear: scales, delayed scaling, and the three
fp8 matmuls of Float8Linear against an fp32 emulation of the same casts (parity), then
against fp32 itself (the error fp8 costs). In-process, a few seconds.
"""

import pytest
import torch
from torch import nn

from helpers import one_line_error
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import TinyTransformer
from tinyscale.low_precision.float8_linear import (
    RECIPES,
    Float8Linear,
    convert_to_float8,
    fp8_matmul,
)
from tinyscale.low_precision.scaling import (
    E4M3,
    E5M2,
    DelayedScaling,
    compute_scale,
    dequantize,
    quantize,
)


def emulated(t: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """What an fp8 operand stands for, in fp32: the reference _scaled_mm must reproduce."""
    return dequantize(quantize(t, dtype, scale), scale)


def test_scales_put_the_amax_on_the_formats_max() -> None:
    x = torch.randn(8, 16) * 1e-3
    s = compute_scale(x, E4M3, "tensorwise", dim=1)
    assert quantize(x, E4M3, s).float().abs().max().item() == 448.0
    rows = compute_scale(x, E4M3, "rowwise", dim=1)
    assert rows.shape == (8, 1)
    assert (quantize(x, E4M3, rows).float().abs().amax(dim=1) == 448.0).all()
    assert compute_scale(torch.zeros(3), E5M2, "tensorwise", dim=0).isfinite()


def test_rowwise_keeps_an_outlier_in_its_own_row() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 64) * 1e-3
    x[0, 0] = 50.0
    err = {}
    for how in ("tensorwise", "rowwise"):
        s = compute_scale(x, E4M3, how, dim=1)
        err[how] = ((emulated(x, E4M3, s) - x).abs() / x.abs())[1:].mean().item()
    assert err["rowwise"] < 0.04 < 0.1 < err["tensorwise"]


def test_delayed_scaling_uses_the_past_amax_and_saturates_one_step_on_a_jump() -> None:
    history = DelayedScaling(history=2, margin=1)
    ones = torch.ones(4)
    first = history.scale(ones, E4M3)  # no past yet: its own amax
    assert first.item() == 448.0 / 2  # margin 1: half the scale
    jump = history.scale(ones * 100, E4M3)  # scaled with the past amax 1
    assert jump.item() == first.item()
    assert quantize(ones * 100, E4M3, jump).float().max().item() == 448.0  # saturated
    assert history.scale(ones, E4M3).item() == pytest.approx(448.0 / 200)  # the jump is history
    history.scale(ones, E4M3)
    assert history.scale(ones, E4M3).item() == 448.0 / 2  # it left the 2-step window
    assert "history >= 1" in one_line_error(DelayedScaling, history=0)


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise"])
def test_scaled_mm_equals_the_fp32_emulation_of_its_casts(granularity: str) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(32, 64), torch.randn(64, 48) * 0.02
    sa = compute_scale(a, E4M3, granularity, dim=1)
    sb = compute_scale(b, E5M2, granularity, dim=0)
    reference = emulated(a, E4M3, sa) @ emulated(b, E5M2, sb)
    torch.testing.assert_close(
        fp8_matmul(a, b, E4M3, E5M2, sa, sb), reference, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("recipe", RECIPES)
def test_float8_linear_forward_and_backward_equal_their_emulation(recipe: str) -> None:
    """Parity: every one of the three matmuls uses the formats and scales it should."""
    torch.manual_seed(0)
    layer = Float8Linear(64, 32, recipe=recipe)
    x = torch.randn(2, 8, 64, requires_grad=True)
    dy = torch.randn(2, 8, 32) * 1e-2
    y = layer(x)
    dx, dw, db = torch.autograd.grad(y, (x, layer.weight, layer.bias), dy)
    flat_x, flat_dy, w = x.detach().reshape(-1, 64), dy.reshape(-1, 32), layer.weight.detach()

    def scale(t: torch.Tensor, dtype: torch.dtype, dim: int) -> torch.Tensor:
        if recipe == "unscaled":
            return torch.tensor(1.0)
        return compute_scale(t, dtype, "rowwise" if recipe == "rowwise" else "tensorwise", dim)

    y_ref = emulated(flat_x, E4M3, scale(flat_x, E4M3, 1)) @ emulated(
        w.t(), E4M3, scale(w.t(), E4M3, 0)
    )
    dx_ref = emulated(flat_dy, E5M2, scale(flat_dy, E5M2, 1)) @ emulated(w, E4M3, scale(w, E4M3, 0))
    dw_ref = emulated(flat_dy.t(), E5M2, scale(flat_dy.t(), E5M2, 1)) @ emulated(
        flat_x, E4M3, scale(flat_x, E4M3, 0)
    )
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(y.detach(), (y_ref + layer.bias.detach()).reshape(2, 8, 32), **close)
    torch.testing.assert_close(dx, dx_ref.reshape(2, 8, 64), **close)
    torch.testing.assert_close(dw, dw_ref, **close)
    torch.testing.assert_close(db, dy.sum((0, 1)))  # the bias stays fp32


def test_fp8_costs_a_few_percent_of_accuracy_against_fp32() -> None:
    torch.manual_seed(0)
    ref, x = nn.Linear(256, 128), torch.randn(64, 256)
    layer = Float8Linear(256, 128)
    layer.load_state_dict(ref.state_dict())
    err = ((layer(x) - ref(x)).norm() / ref(x).norm()).item()
    assert 0.005 < err < 0.06  # e4m3 keeps 3 mantissa bits: a few percent, not zero


def test_convert_swaps_every_linear_but_the_output_and_keeps_the_tied_weight() -> None:
    model = TinyTransformer(ModelConfig())
    before = {name: p for name, p in model.named_parameters()}
    convert_to_float8(model, recipe="delayed")
    swapped = [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    assert linears == ["lm_head"] and len(swapped) == 4 * ModelConfig().num_hidden_layers
    assert model.lm_head.weight is model.tok_emb.weight  # still tied
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)  # the same Parameter objects


def test_unknown_recipe_is_one_line() -> None:
    message = one_line_error(Float8Linear, 4, 4, recipe="fp4")
    assert message == "unknown fp8 recipe 'fp4': use one of tensorwise, rowwise, delayed, unscaled"
    assert "unknown scaling" in one_line_error(compute_scale, torch.ones(2), E4M3, "blockwise", 0)

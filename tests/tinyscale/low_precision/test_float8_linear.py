"""tinyscale.low_precision.scaling and float8_linear: scales, delayed scaling, and the three
fp8 matmuls of Float8Linear against an fp32 emulation of the same casts (parity), then
against fp32 itself (the error fp8 costs). In-process, a few seconds.

Delayed scaling is checked twice: on its own, over a history whose max is not the current
tensor's amax, and inside Float8Linear after steps that filled its histories (on a first
step, with no history, it is tensorwise).
"""

import pytest
import torch
from torch import nn

from helpers import one_line_error, prose, said
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
    amax_scale,
    compute_scale,
    dequantize,
    quantize,
)

# Parity: our fp8 matmuls against the fp32 emulation of their casts. The same casts, one
# product summed in another order by the fp8 kernel: float32 rounding only.
PARITY_RTOL, PARITY_ATOL = 1e-5, 1e-6
PARITY = {"rtol": PARITY_RTOL, "atol": PARITY_ATOL}


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


def test_delayed_scaling_follows_the_historys_max_not_the_current_amax() -> None:
    history = DelayedScaling(history=3)
    amaxes = [8.0, 2.0, 1.0, 0.5, 0.25, 4.0]
    # The max of the last 3 amaxes before each step (the first step has none: its own):
    # 8 | 8 | 8, 2 | 8, 2, 1 | 2, 1, 0.5 | 1, 0.5, 0.25; and fmax / that max.
    expected = [448 / 8, 448 / 8, 448 / 8, 448 / 8, 448 / 2, 448 / 1]
    got = [history.scale(torch.tensor([-a, a / 3]), E4M3).item() for a in amaxes]
    assert got == expected
    current = [448 / a for a in amaxes]
    assert all(g != c for g, c in zip(got[1:], current[1:], strict=True))  # not tensorwise
    assert history.amaxes == amaxes[-3:]  # the window keeps the last 3
    x = torch.tensor([4.0, 0.5])  # the last step: its amax 4 is past the history's max 1
    assert quantize(x, E4M3, torch.tensor(got[-1])).float().max().item() == 448.0  # saturated


def test_float8_linear_delayed_uses_its_amax_histories_after_the_first_step() -> None:
    """Step 1 fills the histories with large amaxes; step 2's x, weight and dy are smaller,
    so step 2 must scale them by step 1's amaxes, and its three matmuls must equal the
    emulation with those scales (and differ from the tensorwise ones of step 2's own)."""
    torch.manual_seed(0)
    layer = Float8Linear(64, 32, recipe="delayed", history=4)
    x1, dy1 = torch.randn(16, 64) * 4, torch.randn(16, 32) * 1e-1
    y1 = layer(x1.requires_grad_())
    torch.autograd.grad(y1, (x1, layer.weight), dy1)
    w1 = layer.weight.detach().clone()
    with torch.no_grad():
        layer.weight.mul_(0.25)  # as if an update shrank it
    x2 = (torch.randn(16, 64) * 0.5).requires_grad_()
    dy2 = torch.randn(16, 32) * 1e-3
    y2 = layer(x2)
    dx, dw = torch.autograd.grad(y2, (x2, layer.weight), dy2)
    w2 = layer.weight.detach()
    amax = {  # the largest amax of the history, step 1's for each of the three operands
        "x": max(x1.abs().max(), x2.abs().max()),
        "w": max(w1.abs().max(), w2.abs().max()),
        "dy": max(dy1.abs().max(), dy2.abs().max()),
    }
    assert amax["x"] == x1.abs().max() and amax["w"] == w1.abs().max()
    assert amax["dy"] == dy1.abs().max()
    s_x, s_w = amax_scale(amax["x"], E4M3), amax_scale(amax["w"], E4M3)
    s_dy = amax_scale(amax["dy"], E5M2)

    def matmuls(s_x, s_w, s_dy):
        x = x2.detach()
        return (
            emulated(x, E4M3, s_x) @ emulated(w2.t(), E4M3, s_w) + layer.bias.detach(),
            emulated(dy2, E5M2, s_dy) @ emulated(w2, E4M3, s_w),
            emulated(dy2.t(), E5M2, s_dy) @ emulated(x, E4M3, s_x),
        )

    for ours, reference in zip((y2.detach(), dx, dw), matmuls(s_x, s_w, s_dy), strict=True):
        torch.testing.assert_close(ours, reference, **PARITY)
    own = matmuls(*(compute_scale(t, d, "tensorwise", 0)
                    for t, d in ((x2.detach(), E4M3), (w2, E4M3), (dy2, E5M2))))  # fmt: skip
    for ours, tensorwise in zip((y2.detach(), dx, dw), own, strict=True):
        assert not torch.allclose(ours, tensorwise, **PARITY)  # the history, not step 2's amax


def test_the_page_states_the_parity_tolerance() -> None:
    (tolerance,) = said(
        prose("week-3/fp8.md"),
        r"to match within a relative tolerance of ([\de.-]+), for every recipe",
    )
    assert float(tolerance) == PARITY_RTOL


@pytest.mark.parametrize("granularity", ["tensorwise", "rowwise"])
def test_scaled_mm_equals_the_fp32_emulation_of_its_casts(granularity: str) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(32, 64), torch.randn(64, 48) * 0.02
    sa = compute_scale(a, E4M3, granularity, dim=1)
    sb = compute_scale(b, E5M2, granularity, dim=0)
    reference = emulated(a, E4M3, sa) @ emulated(b, E5M2, sb)
    torch.testing.assert_close(fp8_matmul(a, b, E4M3, E5M2, sa, sb), reference, **PARITY)


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
    close = PARITY
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

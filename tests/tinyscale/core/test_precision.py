"""tinyscale.core.precision: autocast dtypes on CPU, the one-line errors, and the from-scratch
dynamic loss scaler — a forced overflow skips the step and backs off, clean steps grow the
scale, and a step-by-step parity run against torch.amp.GradScaler (on CPU) with injected
overflows gives the same scale, the same skipped steps and bit-identical weights.
"""

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import PRECISIONS, DynamicLossScaler, autocast_context, make_scaler

CPU = torch.device("cpu")


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def backward(model: nn.Module, scaler, *, step: int, poison: float | None = None) -> None:
    """Forward/backward of a fixed batch through ``scaler``; optionally poison one gradient."""
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if poison is not None:  # what an fp16 overflow looks like after backward
        model[0].weight.grad[0, 0] = poison


# --- autocast ---------------------------------------------------------------------------


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16_and_keeps_the_loss_fp32() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(vocab_size=300, max_position_embeddings=16))
    x = torch.randint(0, 300, (2, 16))
    with autocast_context(CPU, "bf16"):
        hidden = model.blocks[0].ffn.up(torch.randn(2, 16, 64))
        logits, loss = model(x, x)
        mse = F.mse_loss(logits, torch.zeros_like(logits))
        probs = torch.softmax(logits, dim=-1)
    assert hidden.dtype == torch.bfloat16  # Linear: a matmul, cast down
    assert logits.dtype == torch.bfloat16
    assert loss is not None and loss.dtype == torch.float32  # cross-entropy: kept in fp32
    assert mse.dtype == torch.float32  # every loss is on CPU autocast's fp32 list
    # CPU autocast's fp32 list is shorter than CUDA's: softmax follows its input here
    # (CUDA autocast runs softmax in fp32). The page says so; this pins the CPU behaviour.
    assert probs.dtype == torch.bfloat16
    assert model.blocks[0].ffn.up.weight.dtype == torch.float32  # the weights stay fp32
    loss.backward()
    assert model.blocks[0].ffn.up.weight.grad.dtype == torch.float32


def test_fp32_is_a_no_op_context() -> None:
    ctx = autocast_context(CPU, "fp32")
    assert isinstance(ctx, contextlib.nullcontext)
    with ctx:
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32


@pytest.mark.parametrize(
    ("device", "precision", "fix"),
    [
        ("cpu", "fp16", "use bf16 on CPU"),
        ("cpu", "fp8", "use one of fp32, bf16, fp16"),
        ("meta", "bf16", "use fp32"),
    ],
)
def test_bad_precision_is_a_one_line_usage_error(device: str, precision: str, fix: str) -> None:
    for factory in (autocast_context, make_scaler):
        with pytest.raises(UsageError, match=fix) as err:
            factory(torch.device(device), precision)
        assert "\n" not in str(err.value)


def test_make_scaler_only_for_fp16() -> None:
    assert PRECISIONS == ("fp32", "bf16", "fp16")
    assert make_scaler(CPU, "fp32") is None and make_scaler(CPU, "bf16") is None
    with warnings.catch_warnings():  # torch warns that CUDA is unavailable on this machine
        warnings.simplefilter("ignore")
        scaler = make_scaler(torch.device("cuda"), "fp16")
    assert isinstance(scaler, DynamicLossScaler) and scaler.get_scale() == 2.0**16


# --- the scaler -------------------------------------------------------------------------


@pytest.mark.parametrize("poison", [float("inf"), float("-inf"), float("nan")])
def test_forced_overflow_skips_the_step_and_backs_off(poison: float) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    backward(model, scaler, step=0)
    assert scaler.step(opt) is True
    scaler.update()
    assert scaler.state_dict()["_growth_tracker"] == 1  # one clean step counted
    before = [p.detach().clone() for p in model.parameters()]

    opt.zero_grad()
    backward(model, scaler, step=1, poison=poison)
    assert scaler.step(opt) is False  # skipped ...
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    scaler.update()
    assert scaler.get_scale() == 512.0  # ... backed off by backoff_factor ...
    assert scaler.state_dict()["_growth_tracker"] == 0  # ... and the clean-step count reset


def test_growth_after_growth_interval_clean_steps() -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = DynamicLossScaler(init_scale=4.0, growth_factor=2.0, growth_interval=3)
    scales = []
    for step in range(7):
        opt.zero_grad()
        backward(model, scaler, step=step)
        assert scaler.step(opt) is True
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_unscale_gives_the_true_gradients_and_only_once() -> None:
    plain, scaled = tiny_model(), tiny_model()
    opt = torch.optim.SGD(scaled.parameters(), lr=0.1)
    scaler = DynamicLossScaler(init_scale=2.0**10)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    F.cross_entropy(plain(x), y).backward()
    backward(scaled, scaler, step=0)
    assert scaler.unscale_(opt) is False
    for p, q in zip(plain.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)  # a power-of-two scale: exact up to rounding
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale_(opt)
    assert scaler.step(opt) is True  # step() does not unscale a second time
    scaler.update()
    with pytest.raises(RuntimeError, match="before step"):
        scaler.update()


def test_bad_scaler_settings_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=2.0)


def test_matches_torch_grad_scaler_step_by_step() -> None:
    """Same model, data and injected overflows through ours and torch.amp.GradScaler('cpu')."""
    settings = dict(init_scale=2.0**8, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours_model, ref_model = tiny_model(), tiny_model()
    ours_opt = torch.optim.AdamW(ours_model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    ours = DynamicLossScaler(**settings)
    ref = torch.amp.GradScaler("cpu", **settings)
    overflow_at = {2: float("inf"), 3: float("nan"), 9: float("inf")}
    ours_skipped, ref_skipped = [], []
    for step in range(14):
        poison = overflow_at.get(step)
        for model, opt, scaler, skipped in (
            (ours_model, ours_opt, ours, ours_skipped),
            (ref_model, ref_opt, ref, ref_skipped),
        ):
            opt.zero_grad(set_to_none=True)
            backward(model, scaler, step=step, poison=poison)
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            if all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)):
                skipped.append(step)
        assert ours.get_scale() == ref.get_scale(), f"step {step}"
        for p, q in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
            assert torch.equal(p, q), f"step {step}: weights differ"
    assert ours_skipped == ref_skipped == sorted(overflow_at)
    assert ours.state_dict() == ref.state_dict()
    # 256 -> 128 -> 64 (two overflows) -> 128 (3 clean) -> 64 (overflow) -> 128 (3 clean)
    assert ours.get_scale() == 128.0


def test_state_dict_round_trip() -> None:
    a = DynamicLossScaler(init_scale=64.0, growth_interval=5)
    a._growth_tracker = 3
    b = DynamicLossScaler()
    b.load_state_dict(a.state_dict())
    assert (
        b.state_dict()
        == a.state_dict()
        == {
            "scale": 64.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 5,
            "_growth_tracker": 3,
        }
    )

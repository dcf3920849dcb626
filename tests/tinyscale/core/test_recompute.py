"""Activation recomputation: what it keeps, what it brings back, what it costs, and parity.

One measured step per (shape, mode, implementation), shared by the checks that read it.
"""

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers import one_line_error
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.composed.planner import Cluster, Workload, evaluate, main
from tinyscale.core.config import preset
from tinyscale.core.flops import flops_per_token
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.core.recompute import (
    RECOMPUTE,
    apply_recompute,
    check_recompute,
    from_scratch,
    measure,
    recompute_flops_per_token,
    torch_checkpoint,
)
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    activation_peak_bytes,
)

SHAPES = {  # (preset changes, micro-batch, sequence)
    "tiny": ({}, 4, 16),
    "three blocks": ({"num_hidden_layers": 3, "num_attention_heads": 2}, 2, 8),
}


@functools.cache
def measured(shape: str, mode: str, how: str) -> dict:
    changes, b, s = SHAPES[shape]
    recompute = {"torch": torch_checkpoint, "scratch": from_scratch}[how]
    return measure(preset("tiny", **changes), mode, micro_batch=b, seq_len=s, recompute=recompute)


def formula_shape(shape: str) -> tuple:
    changes, b, s = SHAPES[shape]
    return preset("tiny", **changes), {"micro_batch": b, "seq_len": s}


@pytest.mark.parametrize("how", ["torch", "scratch"])
@pytest.mark.parametrize("mode", RECOMPUTE)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_saved_bytes_are_the_formulas_to_the_byte(shape: str, mode: str, how: str) -> None:
    cfg, kw = formula_shape(shape)
    run = measured(shape, mode, how)
    assert run["model"] == activation_bytes_estimate(cfg, recompute=mode, **kw)
    b, s, h = kw["micro_batch"], kw["seq_len"], cfg.hidden_size
    if mode == "full":  # a block keeps its input and nothing else
        assert run["block"] == run["block_math"] == 4 * b * s * h


@pytest.mark.parametrize("mode", RECOMPUTE)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_peak_from_scratch_is_the_peak_formula(shape: str, mode: str) -> None:
    """From scratch, the rerun saves through our hooks: the block's activations come back."""
    cfg, kw = formula_shape(shape)
    stored = activation_bytes_estimate(cfg, recompute=mode, **kw)
    assert measured(shape, mode, "scratch")["peak"] == activation_peak_bytes(
        cfg, recompute=mode, **kw
    )
    # torch's checkpoint reruns under its own saved-tensor hooks: ours see only the forward
    assert measured(shape, mode, "torch")["peak"] == stored
    if mode == "full":
        assert activation_peak_bytes(cfg, recompute=mode, **kw) > stored


@pytest.mark.parametrize("how", ["torch", "scratch"])
@pytest.mark.parametrize("mode", RECOMPUTE)
def test_the_forward_flops_added_are_the_formula(mode: str, how: str) -> None:
    cfg, kw = formula_shape("tiny")
    tokens = kw["micro_batch"] * kw["seq_len"]
    added = measured("tiny", mode, how)["flops"] - measured("tiny", "none", "torch")["flops"]
    assert added == recompute_flops_per_token(cfg, kw["seq_len"], mode) * tokens


def test_selective_keeps_no_attention_weights_full_keeps_only_block_inputs() -> None:
    """The math kernel keeps the (T, T) weights of every head; selective drops them."""
    cfg, kw = formula_shape("tiny")
    b, s, a = kw["micro_batch"], kw["seq_len"], cfg.num_attention_heads
    none, selective = measured("tiny", "none", "torch"), measured("tiny", "selective", "torch")
    lse = 4 * b * a * s  # the fused kernel's log-sum-exp, fp32
    assert none["block"] - selective["block"] == lse
    assert none["block_math"] - none["block"] == 4 * a * s * s * b - lse  # softmax, not lse
    assert selective["block_math"] == selective["block"]


@pytest.mark.parametrize("how", ["torch", "scratch"])
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_gradients_are_identical_with_dropout_on(mode: str, how: str) -> None:
    """Tolerance 0: the same ops on the same numbers, the dropout masks replayed."""
    recompute = {"torch": torch_checkpoint, "scratch": from_scratch}[how]
    assert torch.equal(dropout_gradients("none", None), dropout_gradients(mode, recompute))


def dropout_gradients(mode: str, recompute: object) -> torch.Tensor:
    torch.manual_seed(0)
    model = apply_recompute(TinyTransformer(preset("tiny", dropout=0.1)), mode, recompute=recompute)
    x, y = torch.randint(260, (2, 4, 16))
    model(x, y)[1].backward()
    return flat_parameters(model, grads=True)


def test_without_the_rng_state_dropout_draws_other_masks() -> None:
    """The failing twin of the parity test: preserve_rng_state=False changes the gradients."""
    forgetful = functools.partial(checkpoint, use_reentrant=False, preserve_rng_state=False)
    assert (
        largest_difference(dropout_gradients("none", None), dropout_gradients("full", forgetful))
        > 0
    )


def test_the_planner_holds_the_measured_peak_and_the_flops() -> None:
    cfg, kw = formula_shape("tiny")
    b, s = kw["micro_batch"], kw["seq_len"]
    cluster = Cluster(gpus=1)
    for mode in RECOMPUTE:
        w = Workload(model=cfg, seq_len=s, global_batch=b, micro_batch=b, precision="fp32",
                     recompute=mode)  # fmt: skip
        plan = evaluate(w, cluster, ParallelLayout(), zero=0)
        assert plan.activations == measured("tiny", mode, "scratch")["peak"]
        assert plan.activations == activation_peak_bytes(cfg, recompute=mode, **kw)
        flops = (flops_per_token(cfg, s) + recompute_flops_per_token(cfg, s, mode)) * b * s
        assert plan.step_s == pytest.approx(flops / (cluster.peak_tflops * 1e12), rel=1e-12)


def test_a_bad_mode_is_one_line_before_any_work() -> None:
    assert one_line_error(check_recompute, "yes").endswith("use one of none, selective, full")
    model = TinyTransformer(preset("tiny"))
    assert one_line_error(apply_recompute, model, "partial").startswith("unknown recompute mode")
    assert one_line_error(Workload, model=preset("tiny"), seq_len=16, global_batch=4,
                          recompute=True).startswith("unknown recompute mode True")  # fmt: skip
    flags = ["--gpus", "8", "--global-batch", "8", "--recompute", "yes"]
    assert "--recompute: invalid choice: 'yes'" in one_line_error(main, flags)
    x = torch.zeros(1, 1, 32, device="meta")
    assert "use torch_checkpoint on a GPU" in one_line_error(from_scratch, torch.relu, x)

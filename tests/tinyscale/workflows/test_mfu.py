"""FLOPs per token (tinyscale.core.flops) against torch's FLOP counter, MFU's arithmetic,
the memory report."""

import dataclasses

import pytest
import torch

from helpers import one_line_error
from tinyscale.core.config import load_model_config
from tinyscale.core.errors import run_cli
from tinyscale.core.flops import flops_per_token, matmul_weights
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate
from tinyscale.workflows.mfu import (
    Utilization,
    counted_flops,
    main,
    matmul_peak,
    measure,
    memory_report,
)
from tinyscale.workflows.profiling import ProfileConfig


def counted(dropout: float, batch: int = 2, seq_len: int = 32) -> tuple[int, int]:
    """(counted, formula) FLOPs of one forward + backward of the Lab model in training mode."""
    cfg = dataclasses.replace(load_model_config(), dropout=dropout)
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, seq_len))
    return counted_flops(TinyTransformer(cfg), x, x), flops_per_token(cfg, seq_len) * x.numel()


def test_formula_equals_the_counter_on_the_math_path() -> None:
    """Dropout > 0 runs attention as plain bmm's, which the counter sees: equal, tolerance 0.
    Both count only the matmuls (biases, norms, softmax, GELU and the optimizer are left out
    of both)."""
    got, formula = counted(dropout=0.1)
    assert got == formula


def test_the_counter_misses_the_fused_cpu_attention_kernel() -> None:
    """torch 2.14.1's FlopCounterMode has no formula for the CPU flash kernel: it counts
    exactly 6 N per token and no attention. The day it learns it, this test says so."""
    got, formula = counted(dropout=0.0, seq_len=32)
    cfg = load_model_config()
    attention = 12 * cfg.num_hidden_layers * 32 * cfg.hidden_size * 2 * 32
    assert got == formula - attention
    assert got == 6 * matmul_weights(cfg) * 2 * 32


def test_matmul_weights_are_the_linear_layers() -> None:
    """N: every nn.Linear weight (the tied head counted once), no embedding lookups, no biases."""
    model = TinyTransformer()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_weights(model.cfg) == linear
    assert matmul_weights(model.cfg) < model.num_parameters()


def test_utilization_arithmetic() -> None:
    use = Utilization(flops_per_token=1000, tokens_per_step=10, seconds_per_step=0.5,
                      peak_flops=100_000)  # fmt: skip
    assert use.achieved == 20_000 and use.mfu == pytest.approx(0.2)
    assert matmul_peak(n=64, repeats=1) > 0


def test_memory_report_counts_what_autograd_saves() -> None:
    """Dropout 0: exactly the calculator's estimate; dropout 0.1 saves more (masks, and the
    math path keeps the T x T attention weights)."""
    cfg = load_model_config()
    estimate = activation_bytes_estimate(cfg, micro_batch=2, seq_len=64)
    zero, _ = memory_report(ProfileConfig(dropout=0.0, batch_size=2))
    assert zero.endswith("difference 0 B")
    drop, rss = memory_report(ProfileConfig(dropout=0.1, batch_size=2))
    assert "difference 0 B" not in drop and rss.startswith("peak resident memory")
    assert estimate > 0


def test_bf16_autocasts_the_timed_steps() -> None:
    """--precision bf16 times the same step under autocast (the precision vocabulary's)."""
    use = measure(ProfileConfig(batch_size=2, warmup=0, steps=1), 1e12, precision="bf16")
    assert use.seconds_per_step > 0 and use.tokens_per_step == 2 * 64


def test_bad_input_is_one_line(capsys) -> None:
    assert run_cli(main, ["--device", "cuda"]) == 2
    assert "--peak-tflops" in capsys.readouterr().err
    assert run_cli(main, ["--precision", "fp8"]) == 2  # the course's PRECISIONS only
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fp32, bf16, fp16" in err, err
    # fp16 autocast needs a GPU: one line, before the model is built
    assert "fp16" in one_line_error(measure, ProfileConfig(), 1e12, precision="fp16")
    assert "--max-steps" in one_line_error(ProfileConfig, steps=0)

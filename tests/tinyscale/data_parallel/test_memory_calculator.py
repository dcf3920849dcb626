"""The memory calculator: model-state formulas, activations counted against autograd, CLI.

The per-stage model-state formula is also checked against the bytes ZeRO really holds,
in tests/tinyscale/data_parallel/test_zero.py (within 2 %). Here: the paper's mixed-precision numbers,
the activation estimate against tinyscale.core.memory.activation_bytes (measured from the
tensors autograd saves), DeepSpeed's own estimators, and bad input.
"""

import importlib.util

import pytest
import torch

from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.memory import activation_bytes, model_state_bytes
from tinyscale.core.model import TinyTransformer, count_parameters
from tinyscale.data_parallel.memory_calculator import (
    activation_bytes_estimate,
    estimate,
    main,
    zero_state_bytes,
    zero_step_bytes,
    zero_traffic,
)

SMALL = preset("tiny", num_hidden_layers=3)
CONFIGS = [
    (ModelConfig(dropout=0.0), 4, 64),
    (SMALL, 2, 16),
    (ModelConfig(hidden_size=128, num_attention_heads=8, num_hidden_layers=4, dropout=0.0), 3, 32),
]


class LossOf(torch.nn.Module):
    """model(x, targets) -> the loss, so that activation_bytes sees the whole training forward."""

    def __init__(self, model: torch.nn.Module, targets: torch.Tensor, bf16: bool) -> None:
        super().__init__()
        self.model, self.targets, self.bf16 = model, targets, bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            return self.model(x, self.targets)[1]


def measured(cfg: ModelConfig, b: int, s: int, *, bf16: bool = False) -> int:
    torch.manual_seed(0)
    x, y = (torch.randint(cfg.vocab_size, (b, s)) for _ in range(2))
    return activation_bytes(LossOf(TinyTransformer(cfg), y, bf16), x)


@pytest.mark.parametrize(("cfg", "b", "s"), CONFIGS)
def test_fp32_activation_estimate_is_exactly_what_autograd_saves(cfg, b, s) -> None:
    assert activation_bytes_estimate(cfg, micro_batch=b, seq_len=s) == measured(cfg, b, s)


def test_bf16_estimate_is_a_lower_bound_of_cpu_autocast() -> None:
    """CPU autocast keeps fp32 and bf16 copies side by side: more than the pure-bf16 count."""
    cfg, b, s = CONFIGS[0]
    est = activation_bytes_estimate(cfg, micro_batch=b, seq_len=s, precision="bf16")
    assert est < measured(cfg, b, s, bf16=True)
    assert est < activation_bytes_estimate(cfg, micro_batch=b, seq_len=s)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_mixed_precision_stages_are_the_papers_formulas(n) -> None:
    psi = 7_500_000_000  # the paper's 7.5 B example (Figure 1)
    got = [zero_state_bytes(psi, stage=s, world_size=n, precision="bf16").total
           for s in range(4)]  # fmt: skip
    want = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n]
    assert got == pytest.approx(want, abs=2)


def test_paper_figure_1_numbers() -> None:
    """7.5 B parameters on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB (decimal GB)."""
    psi, n = 7.5e9, 64
    totals = [zero_state_bytes(psi, stage=s, world_size=n, precision="bf16").total / 1e9
              for s in range(4)]  # fmt: skip
    assert [round(t, 2) for t in totals] == [120.0, 31.41, 16.64, 1.88]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed missing")
@pytest.mark.parametrize("n", [2, 4, 16])
def test_deepspeed_estimators_add_an_fp32_gradient_copy(n) -> None:
    """DeepSpeed counts 18 bytes per sharded parameter where the paper counts 14 (ZeRO-2)
    or 16 (ZeRO-3): it adds the fp32 gradient partition (4 bytes) and, at stage 3, the
    largest layer's gathered fp32 weights."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    psi, largest = 10_000_000, 400_000
    _, ds2 = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=n, cpu_offload=False)
    ours2 = zero_state_bytes(psi, stage=2, world_size=n, precision="bf16").total
    assert ds2 - ours2 == pytest.approx(4 * psi / n, abs=2)
    _, ds3, _ = estimate_zero3_model_states_mem_needs(
        psi, largest, num_gpus_per_node=n, cpu_offload=False
    )
    ours3 = zero_state_bytes(psi, stage=3, world_size=n, precision="bf16").total
    assert ds3 - ours3 == pytest.approx(4 * largest + 2 * psi / n, abs=2)


def test_cli_prints_every_component_and_the_total(capsys) -> None:
    argv = ["--precision", "bf16", "--world-size", "4", "--stage", "2",
            "--micro-batch", "8"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    psi = count_parameters(ModelConfig())
    r = estimate(ModelConfig(), precision="bf16", world_size=4, stage=2, micro_batch=8)
    assert f"{psi:,} parameters, bf16, ZeRO-2, 4 ranks" in out
    assert f"{2 * psi:,} B" in out  # bf16 weights, not sharded at stage 2
    assert f"{r.total:,} B" in out and "activations" in out


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_sharding_divides_by_the_group_not_the_world(stage) -> None:
    """HSDP over 2 groups of 4 holds what ZeRO over 4 ranks holds: replicas add no sharding."""
    hybrid = zero_state_bytes(1e9, stage=stage, world_size=8, shard_size=4, precision="bf16")
    assert hybrid == zero_state_bytes(1e9, stage=stage, world_size=4, precision="bf16")
    full = zero_state_bytes(1e9, stage=stage, world_size=8, precision="bf16")
    assert hybrid.optimizer == 2 * full.optimizer  # sharded over 4, not 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--stage", "4"], "ZeRO stage 4 does not exist: use --stage 0, 1, 2 or 3"),
     (["--precision", "fp8"], "invalid choice: 'fp8'"),
     (["--world-size", "0"], "world size must be at least 1"),
     (["--micro-batch", "0"], "micro-batch must be >= 1"),
     (["--world-size", "4", "--shard-size", "3"], "--shard-size 3 does not divide --world-size 4")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys) -> None:
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_precision_in_the_api_names_the_choices() -> None:
    with pytest.raises(UsageError, match=r"unknown precision .*: use one of fp32, bf16, fp16"):
        zero_state_bytes(1000, stage=0, world_size=1, precision="int4")


# --- the ZeRO formulas at the paper's scale (Rajbhandari et al. 2020, Figure 1, §7.2) ---

PSI = 7_000_000_000  # a 7B model, the paper's running example size


@pytest.mark.parametrize(
    ("stage", "per_param"),
    [
        (0, 2 + 2 + 12),  # 16 Ψ: what plain data parallelism keeps on every GPU
        (1, 2 + 2 + 12 / 64),  # 4Ψ + 12Ψ/N
        (2, 2 + (2 + 12) / 64),  # 2Ψ + 14Ψ/N
        (3, 16 / 64),  # 16Ψ/N
    ],
)
def test_zero_bytes_per_rank_on_64_gpus(stage: int, per_param: float) -> None:
    got = zero_state_bytes(PSI, stage=stage, world_size=64, precision="bf16")
    assert got.total == pytest.approx(per_param * PSI, rel=1e-9)


def test_stage_0_is_the_mixed_precision_estimate_of_session_a() -> None:
    assert zero_state_bytes(PSI, stage=0, world_size=8, precision="bf16") == model_state_bytes(
        PSI, "bf16"
    )


def test_one_rank_saves_nothing() -> None:
    assert {
        zero_state_bytes(10**6, stage=s, world_size=1, precision="bf16").total for s in range(4)
    } == {16 * 10**6}


@pytest.mark.parametrize(
    ("stage", "world", "words"),
    [(4, 2, "ZeRO stage 4 does not exist"), (-1, 2, "ZeRO stage -1"), (1, 0, "world size")],
)
def test_bad_stage_or_world(stage: int, world: int, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        zero_state_bytes(100, stage=stage, world_size=world)
    with pytest.raises(UsageError, match="ZeRO stage 4 does not exist"):
        zero_traffic(4)


def test_traffic_paper_values() -> None:
    assert [zero_traffic(s) for s in range(4)] == [2, 2, 2, 3]
    assert zero_traffic(3, shared=0.25) == 3.5  # a quarter of Ψ gathered twice per pass
    # the ring's exact cost is (N-1)/N of it; the paper's is the large-N limit
    assert zero_step_bytes(stage=3, numel=1000, world=4) == 3 * 3 / 4 * 1000 * 4
    assert zero_step_bytes(stage=1, numel=1000, world=10**6) == pytest.approx(2 * 4000, rel=1e-5)

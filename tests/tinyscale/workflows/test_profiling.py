"""Profiling the course model's step: the parts sum to the total, the attention kernel and
dropout's ops read from the profile, AdamW's kernels give the same training, and the
command line's flags are the training scripts'. (DDP's all-reduce in the trace:
test_ddp_overlap.py; py-spy on a blocked rank: tests/tinyscale/ops/test_live_hang.py.)"""

import json

import pytest
import torch

from helpers import one_line_error
from tinyscale.core.errors import run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.workflows.profiling import (
    GROUPS,
    ProfileConfig,
    attention_kernel,
    build,
    grouped_times,
    main,
    profile_steps,
    train_step,
)

TINY = {"batch_size": 2, "warmup": 1, "steps": 1}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[float, tuple]:
    out = tmp_path_factory.mktemp("profiling")
    return {p: profile_steps(ProfileConfig(dropout=p, trace_dir=out, **TINY), name=f"d{p}")
            for p in (0.0, 0.1)}  # fmt: skip


def test_the_parts_sum_to_the_tables_total(profiles) -> None:
    prof, _, _ = profiles[0.1]
    times = grouped_times(prof)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    assert sum(times.values()) == pytest.approx(total, rel=1e-9)
    assert all(times[part] > 0 for part in GROUPS), times
    # p = 0: nn.Dropout still calls aten::dropout, which returns its input and runs no op
    dropouts = [e for e in profiles[0.0][0].events() if e.name == "aten::dropout"]
    assert dropouts and not any(e.cpu_children for e in dropouts)


def test_dropout_sends_attention_to_the_math_path(profiles) -> None:
    """With dropout_p > 0 the CPU's fused (flash) kernel is not used: the unfused math path."""
    assert attention_kernel(profiles[0.0][0]) == "fused (flash, CPU)"
    assert attention_kernel(profiles[0.1][0]) == "math (unfused)"
    calls = {e.key: e.count for e in profiles[0.1][0].key_averages()}
    layers = TinyTransformer().cfg.num_hidden_layers
    # one mask after the embeddings, three per block: attention weights, attention, MLP
    assert calls["aten::bernoulli_"] == 1 + 3 * layers
    assert "aten::bernoulli_" not in {e.key for e in profiles[0.0][0].key_averages()}


def test_the_trace_holds_the_parts_ranges(profiles) -> None:
    _, _, trace = profiles[0.1]
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"attention", "mlp", "embeddings/head", "optimizer", "train_step"} <= names
    assert not list(trace.parent.glob("*.tmp"))


# for-loop, foreach and fused AdamW train alike: the weights after ADAMW_STEPS steps agree
# within ADAMW_ATOL (docs/workflows/profiling.md states both; tests/docs/test_prose_profiling.py
# compares them)
ADAMW_STEPS = 3
ADAMW_ATOL = 3e-5


def test_adamw_kernels_train_alike() -> None:
    """for-loop, foreach and fused AdamW: the same losses and weights, to float rounding."""
    runs = {}
    for adamw in ("for-loop", "foreach", "fused"):
        model, opt, batch = build(ProfileConfig(dropout=0.0, adamw=adamw, batch_size=2))
        losses = [train_step(model, opt, batch) for _ in range(ADAMW_STEPS)]
        runs[adamw] = (losses, torch.cat([p.detach().flatten() for p in model.parameters()]))
    for adamw in ("foreach", "fused"):
        assert runs[adamw][0] == pytest.approx(runs["for-loop"][0], rel=1e-6)
        # Adam divides by sqrt(v): on weights whose gradients are tiny, rounding differences
        # grow to ~1e-5 after 3 steps, against steps of up to lr = 3e-3
        torch.testing.assert_close(runs[adamw][1], runs["for-loop"][1], atol=ADAMW_ATOL, rtol=0)
    assert runs["for-loop"][0][-1] < runs["for-loop"][0][0]  # it trains


BAD_FLAGS = {  # a bad value of each kind of flag, and what its one line names
    "--adamw": ["--adamw", "fast"],
    "--max-steps": ["--max-steps", "0"],  # TrainConfig's check, as in every training script
    "--global-batch-size": ["--global-batch-size", "0"],
    "device 'tpu'": ["--device", "tpu"],
}


def test_bad_input_is_one_line(capsys) -> None:
    assert "--adamw" in one_line_error(ProfileConfig, adamw="fast")
    assert "--max-steps" in one_line_error(ProfileConfig, steps=0)
    for named, flags in BAD_FLAGS.items():
        assert run_cli(main, flags) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err

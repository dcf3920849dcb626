"""torchtitan's float8 on CPU (tinyscale.compat.titan_config.tinyscale_float8).

The run is the FP8 page's code block: CI runs it (FSDP over 2 gloo ranks, emulated fp8)
and compares its output with the recorded text. These tests check what the page says
about it: the losses stay close to the fp32 run of the Week 2 page without being equal
to them, and emulation swaps the logged rowwise recipe for tensorwise scales.
"""

import re

import pytest

from helpers import ROOT, recorded_output

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")
pytest.importorskip("torchao", reason="torchao is in the cluster extra: make setup")

PAGE = "week-3/fp8.md"


def losses(lines: list[str]) -> dict[int, float]:
    steps = [re.match(r"step: +(\d+) +loss: +([\d.]+)", x) for x in lines]
    return {int(m[1]): float(m[2]) for m in steps if m}


def float8_configs() -> list:
    """The torchao configuration of every linear layer of tinyscale_float8's model."""
    from torchtitan.models.common.linear import Linear

    from tinyscale.compat.titan_config import tinyscale_float8

    model = tinyscale_float8().model_spec.model
    return [
        (type(c).__qualname__, c._torchao_config) for _, c, _, _ in model.traverse(Linear.Config)
    ]


def test_config_is_the_fsdp_run_with_every_linear_in_float8() -> None:
    from tinyscale.compat.titan_config import tinyscale_debug, tinyscale_float8

    config, base = tinyscale_float8(), tinyscale_debug()
    assert config.training == base.training and config.parallelism == base.parallelism
    assert config.hf_assets_path == base.hf_assets_path and config.debug.seed == base.debug.seed
    linears = float8_configs()
    assert len(linears) == 31  # 6 blocks x (wqkv, wo, w1, w2, w3) + the output layer, lm_head
    assert {kind for kind, _ in linears} == {"Float8Linear.Config"}


def test_emulation_runs_tensorwise_whatever_the_log_says() -> None:
    import torch
    from torchao.float8.config import ScalingGranularity
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    assert Float8LinearConverter.Config().recipe_name == "rowwise"  # what the log prints
    for _, fp8 in float8_configs():
        assert fp8.emulate
        casts = (fp8.cast_config_input, fp8.cast_config_weight, fp8.cast_config_grad_output)
        assert {c.scaling_granularity for c in casts} == {ScalingGranularity.TENSORWISE}
        assert [c.target_dtype for c in casts] == [
            torch.float8_e4m3fn,
            torch.float8_e4m3fn,
            torch.float8_e5m2,
        ]


def test_recorded_losses_stay_close_to_fp32_and_differ_from_it() -> None:
    ours = recorded_output(PAGE, "--config tinyscale_float8 2>&1")
    fp32 = losses(recorded_output("week-2/torchtitan.md", "--config tinyscale_debug 2>&1"))
    fp8 = losses(ours)
    assert sorted(fp8) == sorted(fp32) == [1, 2, 3, 4, 5, 6]
    gap = max(abs(fp8[s] - fp32[s]) for s in fp8)
    assert 0 < gap < 0.01
    page = (ROOT / "docs" / PAGE).read_text()
    claim = re.search(r"stay within ([\d.]+) of the fp32 run's", page)
    assert claim and float(claim[1]) == round(gap + 0.0005, 3), (claim, gap)
    assert ours[:2] == [
        "Float8 training active with recipe rowwise",
        "Swapped to Float8Linear layers",
    ]

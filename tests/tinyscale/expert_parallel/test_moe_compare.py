"""tinyscale.expert_parallel.moe_compare: bad input is one line before any training; the
FLOP count and the drop rates measure what they say. (Its training runs are checked
against the recorded curves in tests/docs/test_generated_week3_moe.py.)"""

import pytest
import torch

from helpers import one_line_error
from tinyscale.core.data import build_datasets
from tinyscale.expert_parallel.moe import moe_layers
from tinyscale.expert_parallel.moe_compare import build, drop_rates, main, step_flops
from tinyscale.expert_parallel.moe_routing import MoEConfig


@pytest.mark.parametrize(("argv", "message"), [
    (["--variants", "moe", "sparse"], "unknown variant 'sparse': use one of dense, dense-wide, moe"),
    (["--top-k", "9"], "top_k 9 with 8 experts: route each token to 1 to 8 experts"),
    (["--capacity-factor", "0"], "capacity_factor 0.0: use a positive factor"),
    (["--steps", "500"], "--steps 500: one epoch holds 207 steps; use 1 to 207"),
    (["--eval-every", "0"], "--eval-every 0: use 1 or more"),
    (["--steps", "50", "--max-steps", "60"], "--max-steps 60: use 1 to --steps (50)"),
])  # fmt: skip
def test_bad_input_is_one_line_before_anything_runs(capsys, argv, message) -> None:
    assert one_line_error(main, argv).startswith(message)
    assert capsys.readouterr().out == ""


@pytest.fixture(scope="module")
def data():
    return build_datasets(vocab_size=1024, block_size=64)


def test_flops_count_the_experts_a_token_uses(data) -> None:
    """Top 1 of 8 experts as wide as the FFN: the FLOPs of the dense model, plus the
    router's 2 * 3 * tokens * hidden * E (forward, and two backward products)."""
    moe = MoEConfig()
    dense, sparse = (step_flops(build(v, data, moe), data) for v in ("dense", "moe"))
    tokens, hidden, layers = 16 * 64, 64, 2
    assert sparse - dense == 6 * tokens * hidden * moe.num_experts * layers


def test_drop_rates_follow_capacity_and_leave_the_model_as_it_was(data) -> None:
    torch.manual_seed(0)
    model = build("moe-none", data, MoEConfig())
    with torch.no_grad():  # a skewed router: expert 0 gets more than its share
        for layer in moe_layers(model):
            layer.router.gate.weight[0] += 0.05
    found = drop_rates(model, data, [0.5, 1.0, 2.0, 8.0, None])
    rates = list(found["drop_rate"].values())
    assert rates[0] > rates[1] > rates[2] > 0 and rates[3] == rates[4] == 0  # C = T at 8
    assert [sum(load) for load in found["load"]] == [64 * 64] * 2  # top 1: every token once
    assert all(layer.cfg.capacity_factor is None for layer in moe_layers(model))

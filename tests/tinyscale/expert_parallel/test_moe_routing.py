"""tinyscale.expert_parallel.moe_routing: the router, its losses, capacity and dispatch.

- capacity is ceil(k*T/E * factor), and dispatch keeps exactly min(load, C) assignments
  per expert, the earliest tokens first;
- the load-balancing loss is E * sum f_i P_i: 1.0 (so the layer adds exactly its
  coefficient) when the router's probabilities are uniform, E/k... when it collapses;
- the z-loss is mean(logsumexp^2): (log E)^2 for all-zero logits;
- the bias moves the choice, never the gates, and evens a skewed load;
- bad input is one line.
"""

import math

import pytest
import torch

from tinyscale.core.errors import UsageError
from tinyscale.expert_parallel.moe import MoE
from tinyscale.expert_parallel.moe_routing import (
    MoEConfig,
    Router,
    capacity,
    dispatch,
    load_balancing_loss,
    z_loss,
)


@pytest.mark.parametrize(("tokens", "k", "experts", "factor", "slots"), [
    (12, 2, 4, 0.8, 5), (4096, 1, 8, 1.0, 512), (4096, 1, 8, 1.25, 640),
    (100, 2, 8, 1.5, 38), (10, 1, 3, 2.0, 7),
])  # fmt: skip
def test_capacity_is_the_formula(tokens, k, experts, factor, slots) -> None:
    cfg = MoEConfig(num_experts=experts, top_k=k, capacity_factor=factor)
    assert capacity(tokens, cfg) == slots == math.ceil(k * tokens / experts * factor)
    assert capacity(tokens, MoEConfig(num_experts=experts, top_k=k)) is None  # dropless


def test_dispatch_keeps_the_first_tokens_of_each_queue() -> None:
    torch.manual_seed(0)
    experts = torch.stack([torch.randperm(5)[:2] for _ in range(40)])  # 40 tokens, top 2 of 5
    load = torch.bincount(experts.flatten(), minlength=5)
    for slots in (None, 30, 16, 9, 1):
        plan = dispatch(experts, 5, slots)
        assert plan.load.tolist() == load.tolist()
        kept = load if slots is None else load.clamp(max=slots)
        assert plan.counts.tolist() == kept.tolist()
        assert plan.dropped == int(load.sum() - kept.sum())
        chosen = experts.flatten()[plan.order]
        assert chosen.tolist() == sorted(chosen.tolist())  # grouped by expert
        for e in range(5):  # each queue: the earliest tokens that picked e, in order
            picked = [t for t in range(40) if e in experts[t].tolist()]
            assert plan.tokens[chosen == e].tolist() == picked[: int(kept[e])]


def test_uniform_routing_adds_exactly_the_coefficient() -> None:
    cfg = MoEConfig(num_experts=8, top_k=2, aux_loss_coef=0.01, z_loss_coef=0.0)
    layer = MoE(16, 32, cfg)
    torch.nn.init.zeros_(layer.router.gate.weight)  # every probability 1/8
    layer(torch.randn(4, 10, 16))
    assert layer.aux_loss.item() == pytest.approx(0.01, abs=1e-9)


def test_the_aux_loss_is_e_sum_f_p_and_grows_with_collapse() -> None:
    probs = torch.softmax(torch.randn(64, 4), dim=-1)
    experts = probs.topk(2, dim=-1).indices
    f = torch.bincount(experts.flatten(), minlength=4).float() / 128
    assert load_balancing_loss(probs, experts).item() == pytest.approx(
        4 * (f * probs.mean(0)).sum().item()
    )
    collapsed = torch.tensor([[0.9, 0.1, 0.0, 0.0]]).repeat(64, 1)  # everything to expert 0
    assert load_balancing_loss(collapsed, collapsed.topk(1).indices).item() == pytest.approx(3.6)


def test_z_loss_is_mean_squared_logsumexp() -> None:
    assert z_loss(torch.zeros(10, 8)).item() == pytest.approx(math.log(8) ** 2)
    logits = torch.randn(10, 8) * 5
    expected = (torch.logsumexp(logits, -1) ** 2).mean()
    assert z_loss(logits).item() == pytest.approx(expected.item())


def test_top_1_gates_stay_probabilities_so_the_router_learns() -> None:
    router = Router(16, MoEConfig(num_experts=4, top_k=1))
    routing = router(torch.randn(32, 16))
    assert (routing.gates < 1).all()
    routing.gates.sum().backward()
    assert router.gate.weight.grad.abs().sum() > 0
    two = Router(16, MoEConfig(num_experts=4, top_k=2))(torch.randn(32, 16))
    assert torch.allclose(two.gates.sum(-1), torch.ones(32))


def test_the_bias_moves_the_choice_not_the_gates_and_evens_the_load() -> None:
    torch.manual_seed(0)
    router = Router(16, MoEConfig(num_experts=4, top_k=1, balance="bias", bias_rate=0.01))
    x = torch.randn(256, 16)
    x[:, 0] = 2.0
    with torch.no_grad():
        router.gate.weight[0, 0] = 0.5  # +1 on expert 0's logit: everyone's favourite
    before = torch.bincount(router(x).experts.flatten(), minlength=4)
    probs = router.gate(x).softmax(-1)
    for _ in range(100):
        routing = router(x)
        router.update_bias(torch.bincount(routing.experts.flatten(), minlength=4))
    after = torch.bincount(routing.experts.flatten(), minlength=4)
    assert (before.max() / before.float().mean()) > 2 > 1.3 > (after.max() / after.float().mean())
    assert router.bias[0] < 0 < router.bias[1:].max()  # the favourite was pushed down
    # the gates are still the router's own probabilities of the chosen experts
    assert torch.equal(routing.gates.flatten(), probs.gather(-1, routing.experts).flatten())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_experts": 2, "top_k": 3}, "top_k 3 with 2 experts: route each token to 1 to 2 experts"),
    ({"capacity_factor": 0.0}, "capacity_factor 0.0: use a positive factor (1.25 is common), "
                               "or none for dropless routing"),
    ({"capacity_factor": -1.0}, "capacity_factor -1.0: use a positive factor"),
    ({"balance": "loss"}, "balance 'loss': use one of aux, bias, none"),
    ({"num_experts": 0}, "num_experts 0: use 1 or more experts"),
    ({"aux_loss_coef": -0.1}, "aux_loss_coef -0.1: use 0 or more"),
])  # fmt: skip
def test_bad_configs_are_one_line(kwargs, message) -> None:
    with pytest.raises(UsageError) as err:
        MoEConfig(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.filterwarnings("ignore:In CPU autocast")  # torchtitan's fp32 autocast, on a CPU
def test_our_router_chooses_and_weighs_as_torchtitans() -> None:
    """torchtitan's TokenChoiceTopKRouter (softmax scores, gates renormalised for k > 1,
    the bias added for the choice only) with our gate weights: the same experts, the same
    gates, exactly."""
    pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    torch.manual_seed(0)
    for k in (1, 2, 3):
        for balance in ("aux", "bias"):
            ours = Router(32, MoEConfig(num_experts=8, top_k=k, balance=balance))
            theirs = TokenChoiceTopKRouter(TokenChoiceTopKRouter.Config(
                num_experts=8, gate=Linear.Config(in_features=32, out_features=8), top_k=k,
                score_func="softmax", route_norm=k > 1,
            ))  # fmt: skip
            with torch.no_grad():
                theirs.gate.weight.copy_(ours.gate.weight)
                ours.bias.copy_(torch.randn(8) * 0.1 if balance == "bias" else 0)
            x = torch.randn(2, 16, 32)
            routing = ours(x.reshape(-1, 32))
            bias = ours.bias.clone() if balance == "bias" else None
            gates, experts, _ = (t.reshape(32, -1) for t in theirs(x, bias))
            # torchtitan's top k is unsorted: compare each token's experts in id order
            mine, theirs_sorted = routing.experts.sort(dim=-1), experts.sort(dim=-1)
            assert torch.equal(mine.values, theirs_sorted.values), (k, balance)
            assert torch.equal(
                routing.gates.gather(-1, mine.indices), gates.gather(-1, theirs_sorted.indices)
            ), (k, balance)

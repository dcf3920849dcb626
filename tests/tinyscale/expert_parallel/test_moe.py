"""tinyscale.expert_parallel.moe: the layer against the obvious per-token loop, one expert
against the course's own FFN, and the parameter counts against their formula."""

import pytest
import torch
import torch.nn.functional as F

from helpers import prose, said
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import FeedForward, TinyTransformer
from tinyscale.expert_parallel.moe import (
    MoE,
    convert_to_moe,
    moe_layers,
    moe_loss,
    parameter_counts,
)
from tinyscale.expert_parallel.moe_routing import MoEConfig, capacity

SAME_SUMS_REORDERED = 1e-6  # the loop and the layer add the same terms in another order


def per_token(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """The definition, token by token: sum over its top-k experts of gate * expert(x),
    skipping an assignment once its expert's C slots are taken by earlier tokens."""
    ex, cfg = layer.experts, layer.cfg
    slots = capacity(len(x), cfg)
    taken = [0] * cfg.num_experts
    probs = layer.router.gate(x).softmax(-1)
    out = torch.zeros_like(x)
    for t in range(len(x)):
        top = probs[t].topk(cfg.top_k)
        gates = top.values / top.values.sum() if cfg.top_k > 1 else top.values
        for gate, e in zip(gates, top.indices.tolist(), strict=True):
            if slots is not None and taken[e] == slots:
                continue
            taken[e] += 1
            out[t] += gate * (F.gelu(x[t] @ ex.w_up[e] + ex.b_up[e]) @ ex.w_down[e] + ex.b_down[e])
    return out


@pytest.mark.parametrize("factor", [None, 1.0, 0.5])
@pytest.mark.parametrize("k", [1, 2])
def test_the_layer_is_the_per_token_definition(k, factor) -> None:
    torch.manual_seed(k)
    layer = MoE(16, 24, MoEConfig(num_experts=4, top_k=k, capacity_factor=factor))
    x = torch.randn(3, 20, 16)
    out = layer(x)
    assert (
        out.reshape(-1, 16) - per_token(layer, x.reshape(-1, 16))
    ).abs().max() < SAME_SUMS_REORDERED
    assert (layer.dropped > 0) == (factor is not None)  # random routing overflows C = kT/E


def test_the_page_states_the_tolerance() -> None:
    (tolerance,) = said(
        prose("week-3/moe.md"), r"requires the same output to ([\de.-]+), for k = 1 and 2"
    )
    assert float(tolerance) == SAME_SUMS_REORDERED


def test_one_expert_is_the_dense_ffn() -> None:
    cfg = ModelConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4)
    ffn, layer = FeedForward(cfg), MoE(16, 32, MoEConfig(num_experts=1, top_k=1))
    with torch.no_grad():  # nn.Linear stores (out, in); the experts store (in, out)
        layer.experts.w_up[0].copy_(ffn.up.weight.T)
        layer.experts.b_up[0].copy_(ffn.up.bias)
        layer.experts.w_down[0].copy_(ffn.down.weight.T)
        layer.experts.b_down[0].copy_(ffn.down.bias)
    x = torch.randn(2, 8, 16)
    assert torch.equal(layer(x), ffn(x))  # one expert: its gate is softmax of one logit, 1


def test_parameter_counts_follow_the_formula() -> None:
    cfg = ModelConfig()
    dense = sum(p.numel() for p in TinyTransformer(cfg).parameters())
    H, F_, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    ffn = 2 * H * F_ + F_ + H
    for E, k in ((8, 1), (8, 2), (4, 4)):
        model = convert_to_moe(TinyTransformer(cfg), MoEConfig(num_experts=E, top_k=k))
        expert = 2 * H * (F_ // k) + F_ // k + H
        total, active = parameter_counts(model)
        assert total == dense + L * (E * expert + H * E - ffn)  # experts and router, not the FFN
        assert active == total - L * (E - k) * expert


def test_the_converted_model_trains_and_reports_its_losses() -> None:
    torch.manual_seed(0)
    model = convert_to_moe(TinyTransformer(ModelConfig()), MoEConfig(num_experts=4))
    ids = torch.randint(0, 1024, (2, 16))
    _, loss = model(ids, ids)
    extra = moe_loss(model)
    assert len(moe_layers(model)) == 2 and extra.item() > 0
    (loss + extra).backward()
    for layer in moe_layers(model):
        assert layer.router.gate.weight.grad.abs().sum() > 0
        assert int(layer.load.sum()) == 32  # every token, once (top 1)

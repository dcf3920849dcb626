# --8<-- [start:header]
"""A mixture-of-experts layer from scratch, and the course model with one in every block.

Try it:  python -c "from tinyscale.expert_parallel.moe import demo; demo()"

Each block's FFN becomes E smaller FFNs (the experts) and a router. A token runs through
its k experts only, so the model holds about E/k times the FFN parameters of the dense
model while a token pays for the same FFN arithmetic.
"""

import torch
import torch.nn.functional as F
from torch import nn

from tinyscale.core.config import ModelConfig
from tinyscale.core.model import TinyTransformer
from tinyscale.expert_parallel.moe_routing import (
    Dispatch,
    MoEConfig,
    Router,
    Routing,
    capacity,
    dispatch,
)

# --8<-- [end:header]


# --8<-- [start:experts]
class Experts(nn.Module):
    """E feed-forward networks as batched weights: w_up is (E, hidden, width), and so on."""

    def __init__(self, num_experts: int, hidden_size: int, width: int) -> None:
        super().__init__()
        self.w_up = nn.Parameter(torch.randn(num_experts, hidden_size, width) * 0.02)
        self.b_up = nn.Parameter(torch.zeros(num_experts, width))
        self.w_down = nn.Parameter(torch.randn(num_experts, width, hidden_size) * 0.02)
        self.b_down = nn.Parameter(torch.zeros(num_experts, hidden_size))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x`` holds runs of tokens; ``counts[s, e]`` is the length of the run for expert e
        from source s (one source on one process; one per rank under expert parallelism)."""
        runs = x.split(counts.flatten().tolist())
        outputs = []
        for i, run in enumerate(runs):  # a grouped GEMM does this loop in one kernel
            e = i % counts.shape[1]
            outputs.append(
                F.gelu(run @ self.w_up[e] + self.b_up[e]) @ self.w_down[e] + self.b_down[e]
            )
        return torch.cat(outputs)

    def local(self, start: int, stop: int) -> "Experts":
        """A copy holding experts start..stop-1 only: one rank's share."""
        part = Experts(stop - start, self.w_up.shape[1], self.w_up.shape[2])
        with torch.no_grad():
            for name, param in part.named_parameters():
                param.copy_(getattr(self, name)[start:stop])
        return part


# --8<-- [end:experts]


# --8<-- [start:layer]
class RoutedLayer(nn.Module):
    """What every MoE layer keeps from its last forward, for the loss and the logs."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.aux_loss: torch.Tensor | float = 0.0  # what this layer adds to the loss
        self.load = torch.zeros(cfg.num_experts)  # assignments per expert, before dropping
        self.dropped = 0  # assignments over capacity

    def track(self, routing: Routing, plan: Dispatch) -> None:
        cfg = self.cfg
        aux = cfg.aux_loss_coef * routing.aux_loss if cfg.balance == "aux" else 0.0
        self.aux_loss = aux + cfg.z_loss_coef * routing.z_loss
        self.load, self.dropped = plan.load.detach(), plan.dropped


class MoE(RoutedLayer):
    """Route, dispatch by expert, run the experts, combine weighted by the gates."""

    def __init__(self, hidden_size: int, width: int, cfg: MoEConfig) -> None:
        super().__init__(cfg)
        self.router = Router(hidden_size, cfg)
        self.experts = Experts(cfg.num_experts, hidden_size, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, H): routing ignores the batch's shape
        routing = self.router(tokens)
        plan = dispatch(routing.experts, self.cfg.num_experts, capacity(len(tokens), self.cfg))
        out = self.experts(tokens[plan.tokens], plan.counts.unsqueeze(0))  # expert by expert
        self.track(routing, plan)
        return combine(out, plan, routing.gates, tokens).reshape(x.shape)


def combine(
    out: torch.Tensor, plan: Dispatch, gates: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """Each token gets the gate-weighted sum of its kept experts' outputs; zero if none."""
    weights = gates.flatten()[plan.order].unsqueeze(-1)
    return torch.zeros_like(tokens).index_add(0, plan.tokens, out * weights)


# --8<-- [end:layer]


# --8<-- [start:convert]
def expert_width(cfg: ModelConfig, moe: MoEConfig) -> int:
    """intermediate_size // k unless set: k experts per token cost one dense FFN."""
    return moe.expert_size or cfg.intermediate_size // moe.top_k


def convert_to_moe(model: TinyTransformer, moe: MoEConfig) -> TinyTransformer:
    """Replace every block's FFN with a freshly initialised MoE layer, in place."""
    for block in model.blocks:
        block.ffn = MoE(model.cfg.hidden_size, expert_width(model.cfg, moe), moe)
    return model


def moe_layers(model: nn.Module) -> list[RoutedLayer]:
    return [m for m in model.modules() if isinstance(m, RoutedLayer)]


def moe_loss(model: nn.Module) -> torch.Tensor | float:
    """The sum of every MoE layer's auxiliary and z-losses from the last forward."""
    return sum((layer.aux_loss for layer in moe_layers(model)), 0.0)


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(parameters, parameters a token uses): a token skips E - k experts of each layer."""
    total = sum(p.numel() for p in model.parameters())
    skipped = 0
    for layer in moe_layers(model):
        per_expert = sum(p[0].numel() for p in layer.experts.parameters())
        skipped += (layer.cfg.num_experts - layer.cfg.top_k) * per_expert
    return total, total - skipped


# --8<-- [end:convert]


# --8<-- [start:demo]
def demo() -> None:
    """The course model, dense and with 8 experts in each block: top 1, then top 2."""
    torch.manual_seed(0)
    models = {"dense": TinyTransformer(ModelConfig())}
    for k in (1, 2):
        moe = MoEConfig(num_experts=8, top_k=k)
        models[f"MoE, 8 experts, top {k}"] = convert_to_moe(TinyTransformer(ModelConfig()), moe)
    for name, model in models.items():
        total, active = parameter_counts(model)
        print(f"{name:<22} {total:>9,} parameters, {active:>9,} used per token")


# --8<-- [end:demo]

# --8<-- [start:header]
"""Routing for a mixture of experts: which expert sees which token, and how to keep it fair.

Try it:  python -c "from tinyscale.expert_parallel.moe_routing import demo; demo()"

A router scores every token against E experts and sends it to its top k. Three ways keep
the load fair (``MoEConfig.balance``): an auxiliary loss (Switch Transformer, Fedus et al.
2021, eq. 4), nothing, or a per-expert bias that moves the choice and not the gates
(auxiliary-loss-free balancing, DeepSeek-V3, 2024). A capacity per expert bounds the
work; a token beyond it is dropped (it skips the layer through the residual connection).
"""

import dataclasses
import math

import torch
from torch import nn

from tinyscale.core.errors import UsageError

BALANCE = ("aux", "bias", "none")

# --8<-- [end:header]


# --8<-- [start:config]
@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts layer, replacing a block's FFN."""

    num_experts: int = 8  # E
    top_k: int = 1  # k: experts per token (1: Switch Transformer; 2: Mixtral, GShard)
    capacity_factor: float | None = None  # None: dropless; else C = ceil(k*T/E * factor)
    expert_size: int | None = None  # each expert's FFN width; None: intermediate_size // k
    balance: str = "aux"  # "aux", "bias" or "none"
    aux_loss_coef: float = 0.01  # alpha of the load-balancing loss (balance="aux")
    z_loss_coef: float = 0.001  # the router z-loss, whatever the balance
    bias_rate: float = 0.01  # u: how far the bias moves per step (balance="bias")

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise UsageError(f"num_experts {self.num_experts}: use 1 or more experts")
        if not 1 <= self.top_k <= self.num_experts:
            raise UsageError(
                f"top_k {self.top_k} with {self.num_experts} experts: "
                f"route each token to 1 to {self.num_experts} experts"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise UsageError(
                f"capacity_factor {self.capacity_factor}: use a positive factor "
                "(1.25 is common), or none for dropless routing"
            )
        if self.balance not in BALANCE:
            raise UsageError(f"balance {self.balance!r}: use one of {', '.join(BALANCE)}")
        for name in ("aux_loss_coef", "z_loss_coef", "bias_rate"):
            if not getattr(self, name) >= 0:
                raise UsageError(f"{name} {getattr(self, name)}: use 0 or more")


# --8<-- [end:config]


# --8<-- [start:router]
@dataclasses.dataclass
class Routing:
    """What the router decided for N tokens."""

    experts: torch.Tensor  # (N, k) expert ids, best first
    gates: torch.Tensor  # (N, k) the weights of their outputs
    aux_loss: torch.Tensor  # E * sum_i f_i * P_i (1.0 when routing is uniform)
    z_loss: torch.Tensor  # mean over tokens of logsumexp(logits) ** 2


class Router(nn.Module):
    """A linear layer scores the experts; softmax; keep the top k."""

    def __init__(self, hidden_size: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(hidden_size, cfg.num_experts, bias=False)
        # Auxiliary-loss-free balancing: added to the scores to choose, never to the gates.
        self.register_buffer("bias", torch.zeros(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> Routing:
        logits = self.gate(x).float()  # (N, E); fp32 even under autocast: softmax is touchy
        probs = logits.softmax(dim=-1)
        choose = probs + self.bias if self.cfg.balance == "bias" else probs
        experts = choose.topk(self.cfg.top_k, dim=-1).indices  # (N, k)
        gates = probs.gather(-1, experts)
        if self.cfg.top_k > 1:  # the k weights sum to 1; with k = 1 the gate stays p, so
            gates = gates / gates.sum(dim=-1, keepdim=True)  # the router still learns
        return Routing(
            experts, gates.to(x.dtype), load_balancing_loss(probs, experts), z_loss(logits)
        )

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor) -> None:
        """After a step: raise the bias of experts below the mean load, lower the others."""
        self.bias += self.cfg.bias_rate * torch.sign(load.float().mean() - load.float())


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """E * sum_i f_i * P_i: f_i the share of assignments that went to expert i, P_i the
    mean probability the router gave it. Only P carries a gradient."""
    num_experts = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=num_experts).float() / experts.numel()
    return num_experts * (f * probs.mean(dim=0)).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Keeps the router's logits small (ST-MoE, Zoph et al. 2022): large ones overflow."""
    return torch.logsumexp(logits, dim=-1).square().mean()


# --8<-- [end:router]


# --8<-- [start:dispatch]
def capacity(num_tokens: int, cfg: MoEConfig) -> int | None:
    """Slots per expert: C = ceil(k * T / E * capacity_factor); None when dropless."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.top_k * num_tokens / cfg.num_experts * cfg.capacity_factor)


@dataclasses.dataclass
class Dispatch:
    """The token-expert assignments sorted by expert, the ones over capacity removed."""

    order: torch.Tensor  # indices into the N*k flattened assignments, expert by expert
    tokens: torch.Tensor  # the token of each kept assignment (order // k)
    counts: torch.Tensor  # (E,) kept assignments per expert
    load: torch.Tensor  # (E,) assignments per expert before dropping

    @property
    def dropped(self) -> int:
        return int(self.load.sum() - self.counts.sum())


def dispatch(experts: torch.Tensor, num_experts: int, slots: int | None) -> Dispatch:
    """Sort the (token, expert) assignments by expert; keep the first ``slots`` of each."""
    flat = experts.flatten()  # token-major: an earlier token comes first in every queue
    order = torch.argsort(flat, stable=True)
    load = torch.bincount(flat, minlength=num_experts)
    if slots is not None:
        queue_start = torch.cumsum(load, 0) - load  # where each expert's queue begins
        place = torch.arange(flat.numel()) - queue_start[flat[order]]  # place in its queue
        order = order[place < slots]
    counts = torch.bincount(flat[order], minlength=num_experts)
    return Dispatch(order, order // experts.shape[1], counts, load)


# --8<-- [end:dispatch]


# --8<-- [start:demo]
def demo() -> None:
    """Route 12 random tokens to 4 experts, top 2, with room for 5 assignments each."""
    torch.manual_seed(0)
    cfg = MoEConfig(num_experts=4, top_k=2, capacity_factor=0.8)
    routing = Router(8, cfg)(torch.randn(12, 8))
    plan = dispatch(routing.experts, cfg.num_experts, capacity(12, cfg))
    print(f"capacity per expert: {capacity(12, cfg)}")
    print(f"load:   {plan.load.tolist()}")
    print(f"kept:   {plan.counts.tolist()}  ({plan.dropped} dropped)")
    print(f"aux loss {routing.aux_loss.item():.3f}, z-loss {routing.z_loss.item():.3f}")


# --8<-- [end:demo]

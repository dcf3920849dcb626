# --8<-- [start:header]
"""Expert parallelism from scratch: each rank holds E/ep experts; tokens travel to them.

Try it:  python -c "from tinyscale.expert_parallel.ep_moe import demo; demo()"

Every rank routes its own tokens (the router is replicated, like the attention layers),
sends each token to the rank that holds its expert with one all-to-all, runs its local
experts on what arrives, and sends the results back with a second all-to-all. The
backward pass runs the same two exchanges in reverse. Sizes differ from rank to rank and
step to step, so the ranks first exchange how many tokens each will send.
"""

import copy

import torch
import torch.distributed as dist

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.dist import require_process_group
from tinyscale.core.errors import UsageError
from tinyscale.core.parity import largest_difference
from tinyscale.expert_parallel.moe import MoE, RoutedLayer, combine
from tinyscale.expert_parallel.moe_routing import MoEConfig, capacity, dispatch

# --8<-- [end:header]


# --8<-- [start:all_to_all]
class AllToAll(torch.autograd.Function):
    """Rows ``send[i]`` go to rank i; rows ``recv[i]`` arrive from it. Backward: the reverse."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        send: list[int],
        recv: list[int],
        group: dist.ProcessGroup | None,
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group  # type: ignore[attr-defined]
        return exchange(x, send, recv, group)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        # the gradient of a row goes back to the rank the row came from
        return exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None  # type: ignore[attr-defined]


def exchange(
    x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    # the list form dist.all_to_all fails on gloo for unequal sizes; the single form works
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


# --8<-- [end:all_to_all]


# --8<-- [start:layer]
class ExpertParallelMoE(RoutedLayer):
    """One rank's part of an MoE layer: the whole router, experts [r*E/ep, (r+1)*E/ep)."""

    def __init__(self, moe: MoE, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(moe.cfg)
        require_process_group("ExpertParallelMoE")
        self.group = group
        self.ep, rank = dist.get_world_size(group), dist.get_rank(group)
        if moe.cfg.num_experts % self.ep:
            raise UsageError(
                f"{moe.cfg.num_experts} experts do not split over {self.ep} ranks: "
                "make num_experts a multiple of the expert-parallel size"
            )
        self.per_rank = moe.cfg.num_experts // self.ep
        self.router = moe.router  # replicated: its gradient is all-reduced like DDP's
        self.experts = moe.experts.local(rank * self.per_rank, (rank + 1) * self.per_rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self.router(tokens)
        plan = dispatch(routing.experts, self.cfg.num_experts, capacity(len(tokens), self.cfg))
        # 1. how many rows each rank will send to each of my experts: (ep, E/ep)
        incoming = torch.empty_like(plan.counts)
        dist.all_to_all_single(incoming, plan.counts, group=self.group)
        incoming = incoming.view(self.ep, self.per_rank)
        send = plan.counts.view(self.ep, self.per_rank).sum(dim=1).tolist()
        recv = incoming.sum(dim=1).tolist()
        # 2. the rows themselves: sorted by expert, they are already sorted by rank
        arrived = AllToAll.apply(tokens[plan.tokens], send, recv, self.group)
        out = self.experts(arrived, incoming)  # runs (source rank, local expert)
        # 3. the results go home, in the order they left
        back = AllToAll.apply(out, recv, send, self.group)
        self.track(routing, plan)
        return combine(back, plan, routing.gates, tokens).reshape(x.shape)


def all_to_all_bytes(num_tokens: int, top_k: int, hidden_size: int, element_size: int = 4) -> int:
    """Bytes one rank hands to the all-to-alls of one MoE layer in one training step, dropless.

    Four exchanges (dispatch and combine, forward and backward), each of the k*T rows this
    rank routed: 4 * k * T * hidden * bytes. With an even load (ep - 1)/ep of it leaves
    the rank; the rest is the rank's own tokens for its own experts.
    """
    return 4 * top_k * num_tokens * hidden_size * element_size


# --8<-- [end:layer]


# --8<-- [start:parity]
def parity(seed: int = 0, capacity_factor: float | None = None, tokens: int = 48) -> dict:
    """On each rank: this rank's outputs and gradients against one process running the
    whole layer on every rank's tokens; and the bytes its all-to-alls were handed, counted.
    Returns the largest differences, the loads and the bytes."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    cfg = MoEConfig(num_experts=2 * ep, top_k=2, capacity_factor=capacity_factor)
    torch.manual_seed(seed)
    whole = MoE(16, 32, cfg)  # the same layer on every rank: one seed
    inputs = [torch.randn(tokens, 16, requires_grad=True) for _ in range(ep)]  # all ranks' tokens
    probes = [torch.randn(tokens, 16) for _ in range(ep)]  # loss = sum(out * probe)
    layer = ExpertParallelMoE(copy.deepcopy(whole))  # a copy: its own parameters
    counter = CollectiveCounter()
    # the reference: one process, each rank's tokens routed as that rank routes them
    reference = [whole(x) for x in inputs]
    sum((out * p).sum() for out, p in zip(reference, probes, strict=True)).backward()
    mine = inputs[rank].detach().requires_grad_()
    with counter:  # one forward and one backward: a training step's exchanges
        out = layer(mine)
        (out * probes[rank]).sum().backward()
    router_grad = layer.router.gate.weight.grad.clone()
    dist.all_reduce(router_grad)  # replicated: each rank saw only its own tokens
    held = slice(rank * layer.per_rank, (rank + 1) * layer.per_rank)
    experts = [largest_difference(p.grad, getattr(whole.experts, name).grad[held])
               for name, p in layer.experts.named_parameters()]  # fmt: skip
    return {
        "output": largest_difference(out, reference[rank]),
        "input grad": largest_difference(mine.grad, inputs[rank].grad),
        "experts": max(experts),
        "router": largest_difference(router_grad, whole.router.gate.weight.grad),
        "load": layer.load.tolist(),
        "dropped": layer.dropped,
        "all_to_alls": counter.ops()["all_to_all_single"],
        "bytes": sum(call.nbytes for call in counter.calls),
        "formula": all_to_all_bytes(tokens, cfg.top_k, 16) + 8 * cfg.num_experts,  # + counts
    }


# --8<-- [end:parity]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    """EP = world_size, dropless, 48 tokens per rank: parity and bytes, rank by rank."""
    from tinyscale.comm.launch import run_on_ranks

    facts = run_on_ranks(parity, world_size)
    for rank, f in enumerate(facts):
        worst = max(f[key] for key in ("output", "input grad", "experts", "router"))
        print(f"rank {rank}: load {f['load']}, {f['all_to_alls']} all-to-alls, "
              f"{f['bytes']:,} bytes, largest difference {worst:.1e}")  # fmt: skip
    total = sum(f["bytes"] for f in facts)
    print(f"all ranks: {total:,} bytes = {world_size} x {facts[0]['formula']:,} (formula)")


# --8<-- [end:demo]

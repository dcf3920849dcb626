# --8<-- [start:header]
"""ZeRO-3 as a from-scratch FSDP: wrap the modules, give any torch optimizer the local shards.

Try it:  python -c "from tinyscale.data_parallel.fully_sharded import demo; demo()"

Week 2's ZeRO-3 owns its optimizer (FlatAdamW). Here the wrapper owns no optimizer: the
module's parameters are replaced by one flat shard per unit, registered as the wrapper's
parameters, so ``torch.optim.AdamW(fsdp.parameters())`` or SGD with momentum steps the
shards unchanged. That is FSDP1's design (flat parameters); FSDP2 shards each parameter
as a DTensor instead, which also suits per-tensor optimizers (LAMB, Adafactor, Muon).

Only core collectives, each over ``group`` (default: the world): broadcast,
all_gather_single, reduce_scatter_single, all_reduce.
"""

import copy
import functools
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tinyscale.comm.dist import require_process_group
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import measured_state_bytes, storage_bytes
from tinyscale.data_parallel.zero import Unit, ZeRO, install_gather_hooks

# --8<-- [end:header]


# --8<-- [start:init]
class FullyShardedModel(nn.Module):
    """ZeRO-3 for any elementwise torch optimizer: ``AdamW(fsdp.parameters(), lr=1e-3)``.

    ``units``: submodules gathered one at a time (e.g. the transformer blocks); every
    trainable parameter outside them belongs to the root unit. ``group``: the ranks that
    share the shards (default: the world; a data-parallel group next to tensor parallelism).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        units: Iterable[nn.Module] = (),
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        require_process_group("FullyShardedModel")
        units, inside = list(units), set(module.modules())
        for unit in units:
            if unit not in inside:
                raise UsageError(
                    f"unit {type(unit).__name__} is not a submodule of the wrapped "
                    f"{type(module).__name__}: pass units from the module you wrap"
                )
        self.module, self.group = module, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        claimed: set[nn.Parameter] = set()
        groups = []
        for m in [*units, module]:  # inner units first; the root takes what is left
            params = [p for p in m.parameters() if p.requires_grad and p not in claimed]
            claimed.update(params)
            if params:
                groups.append((m, params))
        if not groups:
            raise UsageError(
                f"{type(module).__name__} has no trainable parameters: nothing to shard"
            )
        order = [p for p in module.parameters() if p in claimed]  # the module's order
        self.units = [
            Unit(type(m).__name__, ps, rank=self.rank, world=self.world) for m, ps in groups
        ]
        for unit in self.units:
            dist.broadcast(unit.flat, group=group, group_src=0)  # every copy: the same start
            unit.shard = nn.Parameter(unit.flat[unit.own].clone())  # all this rank keeps
        self.shards = nn.ParameterList(unit.shard for unit in self.units)  # = parameters()
        full = self._unregister(module, order)
        self.full = [full[id(p)] for p in order]
        for (m, _), unit in zip(groups, self.units, strict=True):
            unit.params = [full[id(p)] for p in unit.params]
            self._install_hooks(m, unit)
            self._free(unit)
        refuse = functools.partial(refuse_replaced, {id(p): weakref.ref(p) for p in order})
        weakref.finalize(self, register_optimizer_step_pre_hook(refuse).remove)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @staticmethod
    def _unregister(module: nn.Module, params: list[nn.Parameter]) -> dict[int, torch.Tensor]:
        """Replace each parameter by a plain tensor on the same memory (a view of its unit's
        buffer): the module keeps computing with it, but no longer lists it as a parameter."""
        full = {id(p): p.detach().requires_grad_() for p in params}  # leaves, same storage
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and id(p) in full:
                    del m._parameters[name]
                    setattr(m, name, full[id(p)])  # a tied weight: both modules, one tensor
        return full

    # --8<-- [end:init]

    # --8<-- [start:hooks]
    def _free(self, unit: Unit) -> None:
        """Give the unit's full buffer back; its views keep their shapes for the next gather."""
        unit.flat.untyped_storage().resize_(0)
        unit.gathered = False

    @torch.no_grad()
    def _gather(self, unit: Unit) -> None:
        """Every rank's shard, concatenated into the unit's buffer: the full weights again."""
        if unit.gathered:
            return
        unit.flat.untyped_storage().resize_(unit.flat.numel() * unit.flat.element_size())
        dist.all_gather_single(unit.flat, unit.shard.detach(), group=self.group)
        unit.gathered = True

    def _install_hooks(self, module: nn.Module, unit: Unit) -> None:
        """Gather before forward, free after; gather again when backward reaches the outputs;
        reduce-scatter once the unit's last gradient has arrived (Week 2's hooks)."""
        gather = functools.partial(self._gather, unit)
        install_gather_hooks(module, forward=gather, backward=gather, free=lambda: self._free(unit))
        for p in unit.params:
            p.register_post_accumulate_grad_hook(lambda p: self._reduce_scatter(unit))

    # --8<-- [end:hooks]

    # --8<-- [start:reduce]
    @torch.no_grad()
    def _reduce_scatter(self, unit: Unit) -> None:
        """The group's average of my slice of the unit's gradient, into ``shard.grad``."""
        unit.arrived += 1
        if unit.arrived < len(unit.params):
            return
        unit.arrived = 0
        full = unit.flat_grads()  # padded with zeros: the padding's gradient is 0
        for p in unit.params:
            p.grad = None  # the full gradients are gone ...
        mine = full.new_empty(unit.shard_size)
        dist.reduce_scatter_single(mine, full, group=self.group)  # ... but my slice of the sum
        mine /= self.world
        if unit.shard.grad is None:  # the optimizer's zero_grad() set it to None
            unit.shard.grad = mine
        else:  # micro-batches accumulate, as p.grad does without FSDP
            unit.shard.grad += mine
        self._free(unit)  # backward is done with this unit's weights

    # --8<-- [end:reduce]

    # --8<-- [start:clip]
    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the whole model: the norm of all the shards.

        Each rank sums the squares of its own shards; one all_reduce adds the ranks' sums.
        The padding's gradients are 0, so they add nothing.
        """
        grads = [unit.shard.grad for unit in self.units if unit.shard.grad is not None]
        squares = sum((g.pow(2).sum() for g in grads), torch.zeros(()))
        dist.all_reduce(squares, group=self.group)
        norm = squares.sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # as torch: never scale up
        for g in grads:
            g.mul_(scale)
        return norm

    # --8<-- [end:clip]

    # --8<-- [start:measure]
    def full_parameters(self) -> torch.Tensor:
        """Every parameter, in the module's order, as one flat tensor (every rank)."""
        return self._unshard([unit.shard for unit in self.units])

    def full_gradients(self) -> torch.Tensor:
        """The averaged gradients, gathered the same way: to compare with one process."""
        return self._unshard([unit.shard.grad for unit in self.units])

    @torch.no_grad()
    def _unshard(self, shards: list[torch.Tensor]) -> torch.Tensor:
        """One all-gather per unit into a new tensor; padding dropped; the module's order."""
        pieces = {}
        for unit, shard in zip(self.units, shards, strict=True):
            whole = shard.new_empty(unit.flat.numel())  # a new tensor, not the unit's buffer
            dist.all_gather_single(whole, shard.detach(), group=self.group)
            sizes = [p.numel() for p in unit.params]
            for p, piece in zip(unit.params, whole[: unit.numel].split(sizes), strict=True):
                pieces[id(p)] = piece
        return torch.cat([pieces[id(p)] for p in self.full])

    def gathered_bytes(self) -> int:
        """Bytes of full unit buffers alive now: 0 between steps, one or two units inside."""
        return storage_bytes(unit.flat for unit in self.units)


def refuse_replaced(
    replaced: dict[int, weakref.ref], optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
) -> None:
    """Before any optimizer steps: does it hold parameters that a wrapper replaced?

    Such an optimizer was built before wrapping. Its parameters never get a gradient
    again, so its step would silently do nothing.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            ref = replaced.get(id(p))
            if ref is not None and ref() is p:
                raise UsageError(
                    f"{type(optimizer).__name__} holds the module's full-size parameters, which "
                    "FullyShardedModel replaced: build the optimizer after wrapping, from "
                    "fsdp.parameters() (the shards)"
                )


# --8<-- [end:measure]


# --8<-- [start:parity]
LR, MAX_NORM = 1e-2, 0.1
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": LR}),  # weight_decay 0.01, as ZeRO's FlatAdamW
}


def against_one_process(optimizer_name: str, steps: int = 3) -> dict[str, Any]:
    """One process on the whole batch against FullyShardedModel, each rank on its share,
    with the same torch optimizer; for AdamW, also against Week 2's ZeRO(stage=3)."""
    from tinyscale.core.config import preset
    from tinyscale.core.model import TinyTransformer

    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer_class, kwargs = OPTIMIZERS[optimizer_name]
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = TinyTransformer(cfg)
    model, zero_model = copy.deepcopy(one), copy.deepcopy(one)  # before wrapping changes them
    fsdp = FullyShardedModel(model, units=list(model.blocks))
    optimizers = [optimizer_class(one.parameters(), **kwargs)]
    optimizers.append(optimizer_class(fsdp.parameters(), **kwargs))  # the shards only
    zero = None  # AdamW only: Week 2's ZeRO-3 with its own AdamW
    if optimizer_name == "AdamW":
        zero = ZeRO(zero_model, stage=3, units=list(zero_model.blocks), lr=LR)
    batches = torch.randint(0, cfg.vocab_size, (steps, 2, 4 * world, cfg.max_position_embeddings))
    mine = slice(rank * 4, (rank + 1) * 4)  # this rank's share of the batch
    losses: dict[str, list[float]] = {"one process": [], "sharded": []}
    for x, y in batches:
        loss = one(x, y)[1]
        loss.backward()
        losses["one process"].append(loss.item())
        loss = fsdp(x[mine], y[mine])[1]
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the batch's loss: the mean of the ranks' equal shares
        losses["sharded"].append(mean.item() / world)
        if zero is not None:
            zero(x[mine], y[mine])[1].backward()
            zero.step()
            zero.zero_grad()
        for optimizer in optimizers:
            optimizer.step()
        held = [measured_state_bytes(m, o) for m, o in zip((one, fsdp), optimizers, strict=True)]
        for optimizer in optimizers:
            optimizer.zero_grad()  # sets shard.grad to None: the next backward creates it
    params = fsdp.full_parameters()
    one_params = torch.cat([p.detach().flatten() for p in one.parameters()])
    return {
        "losses": losses,
        "vs one process": (params - one_params).abs().max().item(),
        "vs ZeRO-3": zero and (params - zero.full_parameters()).abs().max().item(),
        "bytes": {"one process": held[0], "sharded": held[1]},
        "gathered": fsdp.gathered_bytes(),
        "numel": one_params.numel(),
    }


def micro_batches_and_clipping(max_norm: float = MAX_NORM) -> dict[str, float]:
    """Two micro-batches against one batch; clip_grad_norm_ against torch's on one process."""
    from tinyscale.core.config import preset
    from tinyscale.core.model import TinyTransformer

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = preset("tiny")
    torch.manual_seed(0)
    one = TinyTransformer(cfg)
    whole, split = (copy.deepcopy(one) for _ in range(2))
    whole, split = (FullyShardedModel(m, units=list(m.blocks)) for m in (whole, split))
    x, y = torch.randint(0, cfg.vocab_size, (2, 4 * world, cfg.max_position_embeddings))
    mine = slice(rank * 4, (rank + 1) * 4)
    whole(x[mine], y[mine])[1].backward()
    for half in (slice(rank * 4, rank * 4 + 2), slice(rank * 4 + 2, (rank + 1) * 4)):
        (split(x[half], y[half])[1] / 2).backward()  # two halves: the mean of the four
    accumulated = (whole.full_gradients() - split.full_gradients()).abs().max().item()
    one(x, y)[1].backward()
    torch_norm = torch.nn.utils.clip_grad_norm_(one.parameters(), max_norm)
    norm = whole.clip_grad_norm_(max_norm)
    one_grads = torch.cat([p.grad.flatten() for p in one.parameters()])
    return {
        "micro-batches": accumulated,
        "norm": norm.item(),
        "torch norm": torch_norm.item(),
        "clipped": (whole.full_gradients() - one_grads).abs().max().item(),
    }


def facts() -> dict[str, Any]:
    """Everything the demo prints, from one launch."""
    return {name: against_one_process(name) for name in OPTIMIZERS} | {
        "checks": micro_batches_and_clipping()
    }


# --8<-- [end:parity]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    """Losses per step, the weights' largest difference, and the bytes each rank holds."""
    from tinyscale.comm.launch import run_on_ranks

    ranks = run_on_ranks(facts, world_size)
    sgd, adamw = ranks[0]["SGD"], ranks[0]["AdamW"]
    print(f"Ψ = {sgd['numel']:,} parameters, N = {world_size} ranks, "
          f"3 steps on {4 * world_size} sequences")  # fmt: skip
    print("step  SGD: one process   sharded  AdamW: one process   sharded")
    for step in range(3):
        row = [r["losses"][k][step] for r in (sgd, adamw) for k in ("one process", "sharded")]
        print(f"{step + 1:>4}  {row[0]:17.6f}  {row[1]:8.6f}  {row[2]:18.6f}  {row[3]:8.6f}")
    worst = {name: max(r[name]["vs one process"] for r in ranks) for name in OPTIMIZERS}
    vs_zero = max(r["AdamW"]["vs ZeRO-3"] for r in ranks)
    print(f"largest weight difference after 3 steps: SGD {worst['SGD']:.1e}, "
          f"AdamW {worst['AdamW']:.1e} from one process; AdamW {vs_zero:.1e} from ZeRO-3")  # fmt: skip
    print(
        f"{'bytes per rank':<22} {'one process':>12}"
        + "".join(f"  rank {r:>3}" for r in range(world_size))
    )
    rows = [("weights", "SGD", "params"), ("gradients", "SGD", "grads"),
            ("SGD momentum", "SGD", "optimizer"), ("AdamW m and v", "AdamW", "optimizer")]  # fmt: skip
    for label, name, field in rows:
        one = getattr(ranks[0][name]["bytes"]["one process"], field)
        mine = [getattr(r[name]["bytes"]["sharded"], field) for r in ranks]
        print(f"{label:<22} {one:12,}" + "".join(f"  {b:8,}" for b in mine))
    print(f"full buffers left after the last step: {[r['SGD']['gathered'] for r in ranks]}")
    checks = ranks[0]["checks"]
    micro = max(r["checks"]["micro-batches"] for r in ranks)
    clipped = max(r["checks"]["clipped"] for r in ranks)
    print(f"two micro-batches against one batch: largest gradient difference {micro:.1e}")
    print(f"clip_grad_norm_({MAX_NORM}): norm {checks['norm']:.6f}, torch on one process "
          f"{checks['torch norm']:.6f}; clipped gradients differ by {clipped:.1e}")  # fmt: skip


def optimizer_built_too_early() -> str:
    """Exercise: an AdamW built on a model's parameters, then the model wrapped."""
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    fsdp = FullyShardedModel(model)
    fsdp(torch.ones(1, 4)).sum().backward()
    try:
        optimizer.step()
    except UsageError as err:
        return str(err)
    return "no error: the step changed nothing"


# --8<-- [end:demo]

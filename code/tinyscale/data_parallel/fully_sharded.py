# --8<-- [start:header]
"""ZeRO-3 as a from-scratch FSDP: wrap the modules, give any torch optimizer the local shards.

Try it:  python -c "from tinyscale.data_parallel.fully_sharded_vs_one_process import demo; demo()"

Week 2's ZeRO-3 owns its optimizer (FlatAdamW). Here the wrapper owns no optimizer: the
module's parameters are replaced by one flat shard per unit, registered as the wrapper's
parameters, so ``torch.optim.AdamW(fsdp.parameters())`` or SGD with momentum steps the
shards unchanged. That is FSDP1's design (flat parameters); FSDP2 shards each parameter
as a DTensor instead, which also suits per-tensor optimizers (LAMB, Adafactor, Muon).

Only core collectives, each over ``group`` (default: the world): broadcast,
all_gather_single, reduce_scatter_single, all_reduce.
"""

import functools
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tinyscale.comm.dist import in_one_call, require_process_group
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import storage_bytes
from tinyscale.data_parallel.reduce_order import ReduceOrder
from tinyscale.data_parallel.zero import Unit, claim_units, install_gather_hooks

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
        groups = claim_units(module, units)  # Week 2's rule: inner units first, then the root
        if not groups:
            raise UsageError(
                f"{type(module).__name__} has no trainable parameters: nothing to shard"
            )
        claimed = {p for _, params in groups for p in params}
        order = [p for p in module.parameters() if p in claimed]  # the module's order
        frozen = [p for p in module.parameters() if p not in claimed]  # requires_grad=False
        if frozen:  # not sharded: every rank keeps them whole, as the group's first rank has them
            in_one_call(frozen, lambda flat: dist.broadcast(flat, group=group, group_src=0))
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
        root = self.units[-1] if groups[-1][0] is module else None
        self.reduce_order = ReduceOrder(self.units, root=root, reduce=self._reduce_scatter)
        for (m, _), unit in zip(groups, self.units, strict=True):
            self.reduce_order.watch(m, unit)
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
        """Gather before forward, free after; gather again when backward reaches the outputs
        (Week 2's hooks). The reduce-scatters: ReduceOrder, Week 2's too."""
        gather = functools.partial(self._gather, unit)
        install_gather_hooks(module, forward=gather, backward=gather, free=lambda: self._free(unit))

    # --8<-- [end:hooks]

    # --8<-- [start:reduce]
    @torch.no_grad()
    def _reduce_scatter(self, unit: Unit) -> None:
        """The group's average of my slice of the unit's gradient, into ``shard.grad``.

        Called once per backward and unit, in the same order on every rank: when backward
        has passed the unit, or when it ends (ReduceOrder, Week 2's).
        """
        full = unit.flat_grads()  # padded with zeros; a missing gradient is zeros too
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

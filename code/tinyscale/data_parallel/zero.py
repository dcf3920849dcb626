# --8<-- [start:header]
"""ZeRO stages 0-3 from scratch: shard the optimizer states, then the gradients, then the weights.

Try it:  python -c "from tinyscale.data_parallel.zero_vs_ddp import demo; demo()"

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv:1910.02054). Data parallelism keeps N identical copies of the model
states; ZeRO keeps each state once, cut into N shards, one per rank (§5, Figure 1):

    stage 0  DDP baseline: every rank holds everything          (the paper's "baseline")
    stage 1  P_os:         optimizer states sharded              (§5.1)
    stage 2  P_os+g:       gradients sharded too                 (§5.2)
    stage 3  P_os+g+p:     parameters sharded too                (§5.3; traffic in §7.2)

Only core collectives: all_reduce, reduce_scatter_single, all_gather_single, broadcast
(torch 2.14's names for reduce_scatter_tensor and all_gather_into_tensor).
"""

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.dist import require_process_group
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import storage_bytes
from tinyscale.core.parity import flat_parameters
from tinyscale.data_parallel.reduce_order import ReduceOrder

ZERO_STAGES = (0, 1, 2, 3)
OPTIMIZERS = ("adamw",)


def check_zero_stage(stage: object) -> int:
    """``stage`` if it is a ZeRO stage; else one line that says which are."""
    if type(stage) is not int or stage not in ZERO_STAGES:
        raise UsageError(f"ZeRO stage {stage!r} does not exist: use --stage 0, 1, 2 or 3")
    return stage


# --8<-- [end:header]


# --8<-- [start:unit]
class Unit:
    """Parameters sharded together: one flat buffer, padded to a multiple of N.

    Every parameter becomes a view of the flat buffer, so one collective moves the
    whole unit and writing the buffer writes the model. Rank r owns the contiguous
    slice ``flat[r*S:(r+1)*S]``, S = padded size / N (the last rank's slice ends in padding).
    """

    def __init__(self, name: str, params: list[nn.Parameter], *, rank: int, world: int) -> None:
        self.name, self.params = name, params
        self.numel = sum(p.numel() for p in params)
        if world > self.numel:
            raise UsageError(
                f"world size {world} is larger than unit '{name}' ({self.numel} parameters): "
                "a rank would own nothing but padding; use at most "
                f"{self.numel} ranks or shard bigger units"
            )
        self.shard_size = math.ceil(self.numel / world)  # S
        self.own = slice(rank * self.shard_size, (rank + 1) * self.shard_size)
        self.flat = torch.zeros(self.shard_size * world, dtype=params[0].dtype)  # padded
        offset = 0
        for p in params:
            with torch.no_grad():
                self.flat[offset : offset + p.numel()].copy_(p.flatten())
            p.data = self.flat[offset : offset + p.numel()].view_as(p)  # a view, no copy
            offset += p.numel()
        self.gathered = True

    def flat_grads(self) -> torch.Tensor:
        """The unit's gradients in one padded buffer (a new tensor: stages 2 and 3).
        A parameter without a gradient (unused by this rank's batch) adds zeros."""
        grads = [self.flat.new_zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                 for p in self.params]  # fmt: skip
        return torch.cat([*grads, self.flat.new_zeros(self.flat.numel() - self.numel)])


def claim_units(
    module: nn.Module, units: Iterable[nn.Module]
) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """(module, its parameters) per unit: each named unit claims its trainable parameters,
    inner units first; the root, ``module``, takes the rest (it comes last, if it has any).
    A frozen parameter (``requires_grad=False``) joins no unit: it stays whole on every rank."""
    claimed: set[nn.Parameter] = set()
    groups = []
    for m in [*units, module]:
        params = [p for p in m.parameters() if p.requires_grad and p not in claimed]
        claimed.update(params)
        if params:
            groups.append((m, params))
    return groups


# --8<-- [end:unit]


# --8<-- [start:hooks]
def install_gather_hooks(
    module: nn.Module, *, forward: Callable[[], None], backward: Callable[[], None],
    free: Callable[[], None],
) -> None:  # fmt: skip
    """Stage 3's hooks: ``forward()`` before the module's forward (gather its unit),
    ``free()`` after it, ``backward()`` when backward reaches the module's outputs."""

    def before(mod: nn.Module, args: Any) -> None:
        forward()

    def after(mod: nn.Module, args: Any, output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        for out in outs:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: backward())
        free()

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


# --8<-- [end:hooks]


# --8<-- [start:adamw]
class FlatAdamW:
    """AdamW (Loshchilov and Hutter 2019) on flat tensors, written out so every state byte shows.

    The same arithmetic, in the same order, as ``torch.optim.AdamW(foreach=False)``:
    two fp32 buffers per parameter element (first and second moment) = 8 bytes each.
    """

    def __init__(self, *, lr: float, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.exp_avg: list[torch.Tensor] = []
        self.exp_avg_sq: list[torch.Tensor] = []
        self.steps = 0

    def add(self, like: torch.Tensor) -> None:
        """State for one flat tensor: as many elements as the slice this rank updates."""
        self.exp_avg.append(torch.zeros_like(like))
        self.exp_avg_sq.append(torch.zeros_like(like))

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        self.steps += 1
        beta1, beta2 = self.betas
        bias1, bias2 = 1 - beta1**self.steps, 1 - beta2**self.steps
        for p, g, m, v in zip(params, grads, self.exp_avg, self.exp_avg_sq, strict=True):
            p.mul_(1 - self.lr * self.weight_decay)  # decoupled weight decay
            m.lerp_(g, 1 - beta1)  # m = beta1 m + (1 - beta1) g
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
            denom = (v.sqrt() / math.sqrt(bias2)).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / bias1)


# --8<-- [end:adamw]


# --8<-- [start:init]
class ZeRO(nn.Module):
    """Data parallelism with ZeRO stage 0, 1, 2 or 3, and its own AdamW.

    Usage (every rank):  loss.backward(); zero.step(); zero.zero_grad()
    ``units``: submodules sharded (and, at stage 3, gathered) one at a time, e.g. the
    transformer blocks; every parameter not inside one belongs to the root unit.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        stage: int,
        units: list[nn.Module] = (),
        optimizer: str = "adamw",
        lr: float = 1e-3,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        check_zero_stage(stage)
        if optimizer not in OPTIMIZERS:
            raise UsageError(
                f"optimizer {optimizer!r} is not supported by tinyscale.data_parallel.zero: use 'adamw' "
                "(its states are sharded by hand; add another optimizer to FlatAdamW's pattern)"
            )
        require_process_group("ZeRO")
        self.module, self.stage = module, stage
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        groups = claim_units(module, units)
        self.units = [
            Unit(type(m).__name__, ps, rank=self.rank, world=self.world) for m, ps in groups
        ]
        self.opt = FlatAdamW(lr=lr, weight_decay=weight_decay)
        for unit in self.units:
            dist.broadcast(unit.flat, src=0)  # every copy starts from rank 0's weights
            self._allocate(unit)
        if stage == 3:
            for (m, _), unit in zip(groups, self.units, strict=True):
                self._install_gather_hooks(m, unit)
        if stage >= 2:  # reduce-scatter inside backward, in one order on every rank
            root = self.units[-1] if groups and groups[-1][0] is module else None
            self.reduce_order = ReduceOrder(self.units, root=root, reduce=self._reduce_scatter)
            for (m, _), unit in zip(groups, self.units, strict=True):
                self.reduce_order.watch(m, unit)
        self.peak_state_bytes = 0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # --8<-- [end:init]

    # --8<-- [start:allocate]
    def _allocate(self, unit: Unit) -> None:
        """Create what this stage keeps between steps, and nothing more."""
        if self.stage <= 1:  # full gradients: p.grad is a view of one flat buffer per unit
            unit.grad = torch.zeros_like(unit.flat)
            offset = 0
            for p in unit.params:
                p.grad = unit.grad[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        else:  # stages 2 and 3 keep only this rank's slice of the averaged gradient
            unit.grad = torch.zeros(unit.shard_size, dtype=unit.flat.dtype)
        # stage 0: optimizer state for every element; stages 1-3: for my slice only
        self.opt.add(unit.flat if self.stage == 0 else unit.flat[unit.own])
        if self.stage == 3:  # the weights too: keep my slice, free the full buffer
            unit.shard = unit.flat[unit.own].clone()
            self._free(unit)

    # --8<-- [end:allocate]

    # --8<-- [start:stage2]
    def _reduce_scatter(self, unit: Unit) -> None:
        """Stages 2-3: reduce-scatter a unit's gradients and free them (ReduceOrder calls this
        once backward has passed the unit, or when backward ends).

        Runs inside backward: in a stack of blocks, only this unit has full gradients now.
        """
        full = unit.flat_grads()
        self.sample(extra=full.nbytes)  # the peak: this unit's gradients are alive twice now
        for p in unit.params:
            p.grad = None  # the full gradient is gone ...
        mine = torch.empty_like(unit.grad)
        dist.reduce_scatter_single(mine, full)  # ... except my slice of the sum
        unit.grad.add_(mine.div_(self.world))  # add: micro-batches accumulate
        if self.stage == 3:
            self._free(unit)  # backward is done with this unit's weights

    # --8<-- [end:stage2]

    # --8<-- [start:stage3]
    def _free(self, unit: Unit) -> None:
        """Stage 3: give the full weight buffer's memory back; the views keep their shapes."""
        unit.flat.untyped_storage().resize_(0)
        unit.gathered = False

    def _gather(self, unit: Unit) -> None:
        """Stage 3: rebuild the full weights from every rank's slice, into the same storage."""
        if unit.gathered:
            return
        unit.flat.untyped_storage().resize_(unit.flat.numel() * unit.flat.element_size())
        dist.all_gather_single(unit.flat, unit.shard)
        unit.gathered = True
        self.sample()

    def _install_gather_hooks(self, module: nn.Module, unit: Unit) -> None:
        gather = functools.partial(self._gather, unit)
        install_gather_hooks(module, forward=gather, backward=gather, free=lambda: self._free(unit))

    # --8<-- [end:stage3]

    # --8<-- [start:step]
    @torch.no_grad()
    def step(self) -> None:
        """Average the gradients (stages 0-1), update my slice, share the new weights."""
        if self.stage == 0:  # DDP: everyone sums everything and updates everything
            for unit in self.units:
                dist.all_reduce(unit.grad)
                unit.grad.div_(self.world)
            self.opt.step([u.flat for u in self.units], [u.grad for u in self.units])
        elif self.stage == 1:  # the full gradient stays; only my slice of it is used
            for unit in self.units:
                mine = torch.empty(unit.shard_size, dtype=unit.grad.dtype)
                dist.reduce_scatter_single(mine, unit.grad)
                unit.grad[unit.own].copy_(mine.div_(self.world))
            self.opt.step([u.flat[u.own] for u in self.units], [u.grad[u.own] for u in self.units])
        elif self.stage == 2:  # gradients were reduce-scattered during backward
            self.opt.step([u.flat[u.own] for u in self.units], [u.grad for u in self.units])
        else:  # stage 3: update the slice; the next forward gathers it
            self.opt.step([u.shard for u in self.units], [u.grad for u in self.units])
        self.sample()
        if self.stage in (1, 2):  # every rank needs every updated weight for the next forward
            for unit in self.units:
                dist.all_gather_single(unit.flat, unit.flat[unit.own].clone())

    def zero_grad(self) -> None:
        for unit in self.units:
            unit.grad.zero_()  # keep the buffers (and, stages 0-1, the p.grad views)

    # --8<-- [end:step]

    # --8<-- [start:measure]
    def state_bytes(self) -> tuple[int, int, int]:
        """(params, grads, optimizer) bytes this rank holds now, counted from the tensors.

        By storage: the views of one flat buffer count it once (a freed one counts 0).
        """
        params = storage_bytes(
            [u.flat for u in self.units] + [getattr(u, "shard", u.flat) for u in self.units]
        )
        loose = [p.grad for u in self.units for p in u.params if p.grad is not None]
        grads = storage_bytes([u.grad for u in self.units] + loose)
        return params, grads, storage_bytes(self.opt.exp_avg + self.opt.exp_avg_sq)

    def sample(self, *, extra: int = 0) -> None:
        """Record the largest model-state footprint so far (called where it may peak)."""
        self.peak_state_bytes = max(self.peak_state_bytes, sum(self.state_bytes()) + extra)

    @torch.no_grad()
    def full_parameters(self) -> torch.Tensor:
        """Every parameter, in ``module.parameters()`` order, as one flat tensor (all ranks)."""
        gathered, peak = [], self.peak_state_bytes  # a check, not training: keep the peak
        for unit in self.units:
            if self.stage == 3 and not unit.gathered:
                self._gather(unit)
                gathered.append(unit)
        flat = flat_parameters(self.module)
        for unit in gathered:
            self._free(unit)
        self.peak_state_bytes = peak
        return flat


# --8<-- [end:measure]

# --8<-- [start:header]
"""ZeRO-3 with prefetching: the next unit's all-gather runs while this unit computes.

Try it:  python -c "from tinyscale.data_parallel.zero_prefetch import demo; demo()"

Week 2's stage 3 gathers a unit when its forward (or backward) starts and waits for the
gather: every all-gather sits on the critical path. Here each gather is started one use
*ahead*: the step records the order in which units are used (forward, then backward), and
the next step, while unit k computes, gathers the unit it used after k last time. That is
FSDP's forward and backward prefetch, and its ``limit_all_gathers``: prefetching costs
the memory of the units gathered early, so their number is bounded (``prefetch``, units
ahead).

The reduce-scatter of a unit's gradients either runs in the background while backward
computes the units before it (``reduce_scatter="async"``, at most one in flight: what FSDP
does on GPUs, on a CUDA stream of its own) or, the default, is Week 1's ring
(``"ring"``), which waits but costs half of gloo's reduce-scatter on a CPU.

Core collectives (all_gather_single and reduce_scatter_single with ``async_op=True``)
and Week 1's ring_reduce_scatter.
"""

import weakref

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.collectives import ring_reduce_scatter
from tinyscale.core.errors import UsageError
from tinyscale.data_parallel.zero import Unit, ZeRO, install_gather_hooks

REDUCE_SCATTERS = ("ring", "async")

# --8<-- [end:header]


# --8<-- [start:init]
class PrefetchZeRO3(ZeRO):
    """ZeRO stage 3 whose all-gathers and reduce-scatters overlap computation.

    ``prefetch``: how many uses ahead to gather (0: none). ``reduce_scatter``: "ring"
    (Week 1's, waits) or "async" (torch's, in the background). The same sums as
    ``ZeRO(stage=3)``: at N = 2 the same weights, bit for bit.
    """

    def __init__(
        self, module: nn.Module, *, prefetch: int = 1, reduce_scatter: str = "ring", **kwargs
    ) -> None:
        if type(prefetch) is not int or prefetch < 0:
            raise UsageError(f"prefetch={prefetch!r}: use 0 (off), 1 or 2 units ahead")
        if reduce_scatter not in REDUCE_SCATTERS:
            raise UsageError(f"reduce_scatter={reduce_scatter!r}: use 'ring' or 'async'")
        self.prefetch, self.reduce_scatter = prefetch, reduce_scatter
        self.gathering: dict[int, dist.Work] = {}  # id(unit) -> its all-gather in flight
        self.reducing: list[tuple[Unit, torch.Tensor, torch.Tensor, dist.Work]] = []
        self.trace: list[Unit] = []  # units in the order this step used them
        self.plan: list[Unit] = []  # ... and the previous step's order: what to prefetch
        super().__init__(module, stage=3, **kwargs)
        weakref.finalize(self, _drop, self.gathering, self.reducing)  # collected, or at exit

    def _install_gather_hooks(self, module: nn.Module, unit: Unit) -> None:
        use = lambda: self._use(unit)  # noqa: E731 (forward and backward alike)
        install_gather_hooks(module, forward=use, backward=use, free=lambda: self._release(unit))

    # --8<-- [end:init]

    # --8<-- [start:prefetch]
    def _use(self, unit: Unit) -> None:
        """Unit ``unit`` computes now: have it gathered, then start the next ones' gathers."""
        self._gather(unit)  # waits only if its prefetch is still in flight
        if self.trace[-1:] == [unit]:
            return  # a second output of the unit just used (logits and loss): the same use
        k = len(self.trace)
        self.trace.append(unit)
        if self.plan[k : k + 1] != [unit]:
            return  # this step departs from the last one: no guess about what comes next
        for ahead in self.plan[k + 1 : k + 1 + self.prefetch]:
            self._start_gather(ahead)

    def _release(self, unit: Unit) -> None:
        """After a unit's forward: free it, unless it is the very next use (the root:
        backward starts with the layers that ended forward). FSDP2 keeps the root too."""
        if self.plan[len(self.trace) : len(self.trace) + 1] != [unit]:
            self._free(unit)

    def _start_gather(self, unit: Unit) -> None:
        """Allocate the full buffer and start filling it; do not wait."""
        if unit.gathered or id(unit) in self.gathering:
            return
        unit.flat.untyped_storage().resize_(unit.flat.numel() * unit.flat.element_size())
        self.gathering[id(unit)] = dist.all_gather_single(unit.flat, unit.shard, async_op=True)
        self.sample()  # the buffer exists from now on: the price of prefetching

    def _gather(self, unit: Unit) -> None:
        if id(unit) not in self.gathering:
            return super()._gather(unit)  # not prefetched: gather and wait, as in Week 2
        self.gathering.pop(id(unit)).wait()
        unit.gathered = True

    def _free(self, unit: Unit) -> None:
        if id(unit) in self.gathering:  # never resize a buffer a collective writes into
            self._gather(unit)
        super()._free(unit)

    # --8<-- [end:prefetch]

    # --8<-- [start:reduce]
    def _reduce_scatter(self, unit: Unit) -> None:
        """Week 2's stage-2/3 reduce-scatter: the ring's, or one in the background."""
        in_flight = sum(full.nbytes for _, _, full, _ in self.reducing)
        self.sample(extra=in_flight)  # the unit before's gradients are still on the wire
        self._finish_reduce()  # at most one in flight: its full gradients are freed now
        full = unit.flat_grads()
        self.sample(extra=full.nbytes)
        for p in unit.params:
            p.grad = None
        if self.reduce_scatter == "ring":  # my chunk of ``full`` is my slice: rank r owns chunk r
            unit.grad.add_(ring_reduce_scatter(full, check=False).div_(self.world))
        else:
            mine = torch.empty_like(unit.grad)
            work = dist.reduce_scatter_single(mine, full, async_op=True)
            self.reducing.append((unit, mine, full, work))
        self._free(unit)

    def _finish_reduce(self) -> None:
        """Wait for the reduce-scatter in flight and add its slice, as Week 2 adds it."""
        while self.reducing:
            unit, mine, _full, work = self.reducing.pop(0)  # dropped once waited for
            work.wait()
            unit.grad.add_(mine.div_(self.world))

    @torch.no_grad()
    def step(self) -> None:
        self._finish_reduce()  # the last unit's slice, before the optimizer reads it
        super().step()
        self.plan, self.trace = self.trace, []  # this step's order guides the next one
        for unit in self.plan[: self.prefetch]:  # the first units' new weights travel
            self._start_gather(unit)  # while the caller gets the next batch

    def close(self) -> None:
        """After the last step: wait for every collective in flight and drop its handle,
        and free the units gathered early. (Collected or at exit, ``_drop`` does it.)"""
        self._finish_reduce()
        for unit in self.units:
            if id(unit) in self.gathering:
                self._free(unit)  # waits for its gather first


def _drop(gathering: dict[int, dist.Work], reducing: list) -> None:
    """Wait for the collectives still in flight and drop their handles: a gloo work object
    that still holds its tensors when the interpreter tears down can abort the process
    ("terminate called without an active exception")."""
    try:
        for work in [*gathering.values(), *(work for *_, work in reducing)]:
            if dist.is_initialized():  # else its group is gone: nothing left to wait for
                work.wait()
    finally:
        gathering.clear()
        reducing.clear()


# --8<-- [end:reduce]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    """Prefetching changes when the bytes move, not what arrives: same weights, more memory."""
    from tinyscale.comm.launch import run_on_ranks

    for line in run_on_ranks(compare_prefetch, world_size, 3)[0]:
        print(line)


def compare_prefetch(steps: int) -> list[str]:
    """On every rank: train Week 2's stage 3 and the prefetching one; compare weights, peaks."""
    from tinyscale.core.config import preset
    from tinyscale.core.model import TinyTransformer
    from tinyscale.data_parallel.ddp import random_batch

    cfg = preset("tiny")
    runs = {}
    for name, prefetch in (("stage 3", None), ("prefetch 1", 1), ("prefetch 2", 2)):
        torch.manual_seed(0)
        model = TinyTransformer(cfg)
        units = list(model.blocks)
        if prefetch is None:
            zero = ZeRO(model, stage=3, units=units)
        else:
            zero = PrefetchZeRO3(model, units=units, prefetch=prefetch)
        for step in range(steps):
            batch = random_batch(cfg, batch_size=2, seq_len=16, step=step, seed=dist.get_rank())
            zero(*batch)[1].backward()
            zero.step()
            zero.zero_grad()
        runs[name] = (zero.full_parameters(), zero.peak_state_bytes)
        if isinstance(zero, PrefetchZeRO3):
            zero.close()  # nothing left in flight, no handle kept
    block = max(u.flat.numel() * u.flat.element_size() for u in zero.units[:-1])
    base_weights, base_peak = runs["stage 3"]
    lines = [f"one block unit: {block:,} B (full, fp32)"]
    for name, (weights, peak) in runs.items():
        same = torch.equal(weights, base_weights)
        lines.append(
            f"{name:<11} peak {peak:>9,} B  extra {peak - base_peak:>7,} B  same weights: {same}"
        )
    return lines


# --8<-- [end:demo]

# --8<-- [start:header]
"""Every unit's gradients reduce-scattered once per backward, in one order on every rank.

Try it:  python -c "from tinyscale.data_parallel.unused_and_frozen import demo; demo()"

ZeRO-2, ZeRO-3 and FSDP reduce-scatter a unit's gradients inside backward. When? Not
"when its last gradient has arrived": a parameter that a rank's batch did not use (a
branch not taken, an expert without tokens) gets no gradient on that rank, so the unit
would be skipped, or its count carried into the next step; and a rank whose unit is
complete would reduce-scatter at another moment than a rank whose unit is not, so the
ranks' collectives (the reduce-scatters, and stage 3's gathers in backward) would pair up
the wrong tensors. The moment must be the same on every rank, whatever each used. So a
unit is ready when backward has passed it (the gradient of its inputs is complete:
FSDP2's post-backward), units go in one order fixed when wrapping, and what is left goes
when backward ends (a callback queued on the autograd engine: FSDP2's
``_root_post_backward_final_callback``), a missing gradient counted as zeros.
"""

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn
from torch.autograd import Variable

from tinyscale.core.errors import UsageError

# --8<-- [end:header]


# --8<-- [start:passed]
class PassedUnit(torch.autograd.Function):
    """The identity on a unit's inputs. Its backward runs once the inputs' gradients are
    complete: backward has passed the unit, and every gradient of the unit has arrived."""

    @staticmethod
    def forward(ctx: Any, passed: Callable[[], None], *inputs: torch.Tensor) -> Any:
        ctx.passed = passed
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.passed()
        return None, *grads


def watch_inputs(module: nn.Module, passed: Callable[[], None]) -> None:
    """Before each forward of ``module``, pass its tensor arguments that need a gradient
    through PassedUnit. A unit with none (the root: token ids) waits for the end."""

    def before(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        values = [*args, *kwargs.values()]
        wanted = [i for i, x in enumerate(values) if torch.is_tensor(x) and x.requires_grad]
        if not wanted or not torch.is_grad_enabled():
            return None
        outs = PassedUnit.apply(passed, *(values[i] for i in wanted))
        for i, out in zip(wanted, outs, strict=True):
            values[i] = out
        return tuple(values[: len(args)]), dict(zip(kwargs, values[len(args) :], strict=True))

    module.register_forward_pre_hook(before, with_kwargs=True)


# --8<-- [end:passed]


# --8<-- [start:order]
class HasParams(Protocol):  # zero.Unit: the parameters reduce-scattered together
    name: str
    params: list[torch.Tensor]


U = TypeVar("U", bound=HasParams)


class ReduceOrder(Generic[U]):
    """Call ``reduce(unit)`` for every unit, once per backward, in one order on every rank.

    A unit goes when backward has passed it and every unit before it has gone; what is
    left goes when backward ends (``reduce`` counts a missing gradient as zeros). The
    order is backward's: the named units in reverse, then the root (its embeddings get
    their gradients last).
    """

    def __init__(self, units: Sequence[U], *, root: U | None, reduce: Callable[[U], None]) -> None:
        self.order = [u for u in reversed(units) if u is not root]  # the blocks in reverse
        if root is not None:
            self.order.append(root)
        self.reduce = reduce
        self.reset()
        me = weakref.ref(self)  # a parameter's hooks outlive what torch can collect: no cycle
        for i, unit in enumerate(self.order):
            for p in unit.params:
                p.register_post_accumulate_grad_hook(lambda p, i=i: me() and me()._arrived(i))

    def watch(self, module: nn.Module, unit: U) -> None:
        """Learn when backward has passed ``module``, the unit's module."""
        i = self.order.index(unit)

        def passed() -> None:
            self.pending[i] -= 1  # one forward call of the unit fewer left to pass
            self._go()

        watch_inputs(module, passed)
        module.register_forward_pre_hook(lambda mod, args: self._called(i))

    def reset(self) -> None:
        self.pending = [0] * len(self.order)  # forward calls not yet passed by backward
        self.done = 0  # self.order[: self.done] are reduced
        self.queued = False  # the end-of-backward callback is queued

    def _called(self, i: int) -> None:
        if torch.is_grad_enabled():
            self.pending[i] += 1

    def _arrived(self, i: int) -> None:
        """A gradient of order[i]: queue the end of this backward; refuse a late one."""
        if i < self.done:
            raise UsageError(
                f"a parameter of unit {self.order[i].name} got its gradient after the unit was "
                "reduce-scattered: a parameter that two units use belongs in a unit around both"
            )
        if not self.queued:
            Variable._execution_engine.queue_callback(self._finish)
            self.queued = True

    def _go(self) -> None:
        while self.done < len(self.order) and self.pending[self.done] == 0:
            self.done += 1
            self.reduce(self.order[self.done - 1])

    def _finish(self) -> None:
        """The end of backward: the units still waiting, in order, on every rank alike."""
        try:
            for unit in self.order[self.done :]:
                self.done += 1
                self.reduce(unit)
        finally:  # the next backward (a micro-batch, the next step) starts from zero
            self.reset()


# --8<-- [end:order]

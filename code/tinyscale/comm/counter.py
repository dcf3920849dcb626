# --8<-- [start:header]
"""Count what torch.distributed's collectives and point-to-point calls move, call by call.

Try it:  python -c "from tinyscale.comm.counter import demo; demo()"

While a ``CollectiveCounter`` is installed, the functions below go through it first and
each call is logged as a ``Call``: the operation, the bytes of the whole buffer it works
on (all N ranks' share, for the gathering and scattering ones) and the ranks in its
group. From that log come two accountings: the bytes one rank really sends with ring
algorithms, and the ZeRO paper's volume (Rajbhandari et al. 2020, §7.2: an all-reduce
moves its buffer twice, a reduce-scatter or an all-gather once), which Weeks 2-4
compare with their formulas.
"""

import dataclasses
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.comm_model import ring_allreduce_bytes

# operation -> the argument that holds the whole buffer
BUFFER_ARGUMENT = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "reduce": "tensor",
    "reduce_scatter_single": "input",  # the input holds all N shards
    "reduce_scatter_tensor": "input",  # its name before torch 2.10, which DeepSpeed calls
    "all_gather_single": "output_tensor",  # the output holds all N shards
    "all_gather_into_tensor": "output_tensor",
    "all_to_all_single": "input",
    "send": "tensor",
    "recv": "tensor",
    "isend": "tensor",
    "irecv": "tensor",
}
RECEIVES = ("recv", "irecv")  # they move bytes, but this rank sends none of them

# --8<-- [end:header]


# --8<-- [start:call]
@dataclasses.dataclass(frozen=True)
class Call:
    """One call, as this rank saw it."""

    op: str
    nbytes: int  # of the whole buffer: what the N ranks hold together
    numel: int
    ranks: int  # in the group it ran on (HSDP runs collectives on subgroups)

    def sent_bytes(self) -> float:
        """Bytes this rank sends, with ring algorithms: (N-1)/N of the buffer per pass.

        An all-reduce is two passes (reduce-scatter, then all-gather: Week 1's
        ring_allreduce_bytes); any other collective is one of them, half of it (broadcast
        and reduce on average); a point-to-point send sends it all.
        """
        if self.op in ("send", "isend"):
            return self.nbytes
        if self.op in RECEIVES:
            return 0.0
        ring = ring_allreduce_bytes(size_bytes=self.nbytes, world_size=self.ranks)
        return ring if self.op == "all_reduce" else ring / 2

    def volume(self) -> int:
        """Elements moved in the paper's accounting: an all-reduce counts its buffer twice."""
        if self.op in RECEIVES:
            return 0
        return 2 * self.numel if self.op == "all_reduce" else self.numel


# --8<-- [end:call]


# --8<-- [start:counter]
class CollectiveCounter:
    """Wrap torch.distributed's communication calls; while ``counting``, log each one.

    Use it as a context manager around a step, or ``install()`` it for good: DeepSpeed
    keeps references to some of these functions from ``deepspeed.initialize`` on, so
    there the counter must be installed first and switched on and off with ``counting``.
    ``batch_isend_irecv`` is logged op by op (its sends and receives).
    """

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.counting = True
        self._originals: dict[str, Callable[..., Any]] = {}

    def install(self) -> "CollectiveCounter":
        if self._originals:
            return self
        for op in [*BUFFER_ARGUMENT, "batch_isend_irecv", "P2POp"]:
            self._originals[op] = getattr(dist, op)
        for op in BUFFER_ARGUMENT:
            setattr(dist, op, self._wrap(op, self._originals[op]))
        dist.batch_isend_irecv = self._wrap_batch(self._originals["batch_isend_irecv"])
        dist.P2POp = _unwrapping_p2p_op(self._originals["P2POp"])
        return self

    def remove(self) -> None:
        for op, original in self._originals.items():
            setattr(dist, op, original)
        self._originals = {}

    def __enter__(self) -> "CollectiveCounter":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run collectives that are not part of what is measured (a check, a log line)."""
        before, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = before

    def _log(self, op: str, tensor: torch.Tensor, group: Any) -> None:
        if self.counting:
            size = tensor.numel() * tensor.element_size()
            self.calls.append(Call(op, size, tensor.numel(), dist.get_world_size(group)))

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)  # sets __wrapped__: P2POp below unwraps it
        def counted(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            self._log(op, bound.arguments[BUFFER_ARGUMENT[op]], bound.arguments.get("group"))
            return original(*args, **kwargs)

        counted.counted_by_tinyscale = True  # type: ignore[attr-defined]
        return counted

    def _wrap_batch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(p2p_op_list: list[Any]) -> Any:
            for p2p in p2p_op_list:  # the ops hold the real isend / irecv, never ours
                op = "isend" if p2p.op is self._originals["isend"] else "irecv"
                self._log(op, p2p.tensor, p2p.group)
            return original(p2p_op_list)

        return counted

    # the summaries
    def ops(self) -> Counter[str]:
        return Counter(call.op for call in self.calls)

    def sent_bytes(self) -> float:
        return sum(call.sent_bytes() for call in self.calls)

    def volume(self) -> int:
        return sum(call.volume() for call in self.calls)

    def clear(self) -> None:
        self.calls.clear()


def _unwrapping_p2p_op(original: type) -> type:
    """dist.P2POp that accepts our counted isend/irecv: P2POp checks for torch's own."""

    def unwrap(op: Callable[..., Any]) -> Callable[..., Any]:
        return op.__wrapped__ if getattr(op, "counted_by_tinyscale", False) else op

    class P2POp(original):  # type: ignore[misc, valid-type]
        def __new__(cls, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return super().__new__(cls, unwrap(op), *args, **kwargs)

        def __init__(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
            super().__init__(unwrap(op), *args, **kwargs)

    return P2POp


# --8<-- [end:counter]


# --8<-- [start:demo]
def count_a_step() -> str:
    """On every rank: an all-reduce, an all-gather and a ring exchange, counted."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = torch.ones(1000)  # 4,000 bytes
    with CollectiveCounter() as counter:
        dist.all_reduce(grads)
        gathered = torch.empty(world * 10)
        dist.all_gather_single(gathered, torch.full((10,), float(rank)))
        right, left = (rank + 1) % world, (rank - 1) % world
        ops = [
            dist.P2POp(dist.isend, grads[:10], right),
            dist.P2POp(dist.irecv, grads[10:20], left),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    calls = ", ".join(f"{op} {n}" for op, n in sorted(counter.ops().items()))
    return (
        f"rank {rank}: {calls} | sent {counter.sent_bytes():,.0f} B | volume {counter.volume():,}"
    )


def demo(world_size: int = 2) -> None:
    from tinyscale.comm.launch import run_on_ranks

    print("\n".join(run_on_ranks(count_a_step, world_size)))


# --8<-- [end:demo]

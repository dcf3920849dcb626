# --8<-- [start:header]
"""DDP from scratch, step 4: gradients that live in their buckets, at torch DDP's speed.

Try it:  python -c "from tinyscale.data_parallel.ddp_views import demo; demo()"

Step 3 (``tinyscale.data_parallel.ddp_buckets.OverlappedDDP``) copies every gradient into
its bucket and, after the all-reduce, back out into ``.grad``: two passes over all the
gradient bytes per step, and a second copy of them in memory. Step 4 makes each ``.grad``
a view into its bucket, torch's ``gradient_as_bucket_view=True``: autograd adds the
gradient straight into the flat buffer that the all-reduce sends, and the average lands
where the optimizer reads it. Two smaller changes finish torch's recipe: a small first
bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB), so the first all-reduce starts
sooner, and a hook per gradient that only counts down. ``benchmarks/bench_ddp.py``
measures each change on its own (the ablation).
"""

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.data_parallel.ddp_buckets import (
    NOT_SYNCHRONISED,
    NOTHING_ARRIVED,
    BucketedDDP,
    OverlappedDDP,
    compare_with_torch_ddp,
)

FIRST_BUCKET_MB = dist._DEFAULT_FIRST_BUCKET_BYTES / MiB  # 1.0: torch DDP's default first cap

# --8<-- [end:header]


# --8<-- [start:views]
class ViewDDP(BucketedDDP):
    """Step 4: each .grad is a view into its bucket: the average is all-reduced in place.

    Usage (every rank), as step 3:  loss.backward(); ddp.finish_gradient_synchronization()
    then opt.step(); opt.zero_grad() with either set_to_none (see adopt_grad).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float = 25.0,
        first_bucket_mb: float | None = FIRST_BUCKET_MB,
        lean_hooks: bool = True,
    ) -> None:
        super().__init__(module, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb)
        self.require_sync = True  # False inside no_sync(): gradients only accumulate
        self.events: list[tuple[str, str]] = []  # ("grad", name) / ("all-reduce", bucket)
        self._next_bucket = 0  # buckets launch in index order, as in step 3
        self._full = [len(b.params) for b in self.buckets]
        self._left = list(self._full)  # per bucket: gradients still to come this backward
        self._slot = {}  # parameter -> (bucket, index), for the step-3-style hook only
        for bucket in self.buckets:
            for i, (p, view) in enumerate(zip(bucket.params, bucket.views, strict=True)):
                self._slot[p] = (bucket, i)
                hook = self._lean_hook(bucket.index, view) if lean_hooks else self._grad_ready
                p.register_post_accumulate_grad_hook(hook)

    no_sync = OverlappedDDP.no_sync  # the same switch: inside it, the hooks do not count

    def forward(self, *args, **kwargs):
        if self._next_bucket or self._left != self._full:
            raise UsageError(NOT_SYNCHRONISED)
        self.events.clear()
        return self.module(*args, **kwargs)

    def _lean_hook(self, k: int, view: torch.Tensor) -> Callable[[torch.Tensor], None]:
        """One parameter's hook, bound to its view and its bucket's index: no lookups."""
        left = self._left  # the same list object for the hook's whole life

        def ready(p: torch.Tensor) -> None:
            if p.grad is not view:
                adopt_grad(p, view)
            if self.require_sync:
                left[k] -= 1
                if left[k] == 0 and k == self._next_bucket:
                    self._launch_ready()

        return ready

    def _grad_ready(self, p: torch.Tensor) -> None:
        """Step 3's hook without the copy out (lean_hooks=False): a lookup, an event, a call."""
        bucket, i = self._slot[p]
        if p.grad is not bucket.views[i]:
            adopt_grad(p, bucket.views[i])
        if not self.require_sync:
            return
        self._left[bucket.index] -= 1
        self.events.append(("grad", bucket.names[i]))
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_bucket < len(self.buckets) and self._left[self._next_bucket] == 0:
            bucket = self.buckets[self._next_bucket]
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)  # the .grads' bytes
            self.num_collectives += 1
            self.events.append(("all-reduce", f"bucket {bucket.index}"))
            self._next_bucket += 1

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce and divide in place: .grad is the average."""
        if self._left == self._full:
            raise UsageError(NOTHING_ARRIVED)
        for bucket in self.buckets[self._next_bucket :]:
            if self._left[bucket.index]:  # a parameter unused this step fired no hook:
                for p, view in zip(bucket.params, bucket.views, strict=True):
                    if p.grad is not view:  # no gradient: it sends zeros, and no rank hangs
                        adopt_grad(p, view)
        self._left[:] = [0] * len(self.buckets)  # in place: the hooks hold this list
        self._launch_ready()
        for bucket in self.buckets:
            bucket.work.wait()  # bounded by the process group's timeout
            bucket.work = None
            bucket.buffer.div_(self.world_size)  # every .grad of the bucket at once
        self._left[:] = self._full
        self._next_bucket = 0


def adopt_grad(p: torch.Tensor, view: torch.Tensor) -> None:
    """Move ``p.grad`` into its bucket's view and make the view ``p.grad``.

    Once ``p.grad`` is the view, autograd adds each new gradient into the bucket in place
    (``p.grad += g``) and nothing is copied. ``zero_grad(set_to_none=True)`` (the default)
    drops the view: the next backward gives ``p.grad`` a fresh tensor, which the hook
    copies in once, as torch's reducer does; no gradient at all counts as zeros.
    """
    if p.grad is None:
        view.zero_()
    else:
        view.copy_(p.grad)
    p.grad = view


# --8<-- [end:views]


# --8<-- [start:ablation]
def ablation(
    first_bucket_mb: float = FIRST_BUCKET_MB,
) -> dict[str, Callable[[nn.Module, float], nn.Module]]:
    """Step 3, then one change at a time: name -> wrap(model, bucket_cap_mb).

    The benchmark's ablation rows, and the variants the parity test trains (picklable,
    so that run_on_ranks can hand them to the ranks).
    """
    view = functools.partial(view_ddp, first_bucket_mb=first_bucket_mb)
    return {
        "copy (step 3)": copy_ddp,
        "views": functools.partial(view, first_bucket_mb=None, lean_hooks=False),
        "views + first bucket": functools.partial(view, lean_hooks=False),
        "views + first bucket + lean hooks": functools.partial(view, lean_hooks=True),
    }


def copy_ddp(model: nn.Module, cap: float) -> nn.Module:
    """Step 3 as the page taught it: the ablation's first row."""
    return OverlappedDDP(model, bucket_cap_mb=cap)


def view_ddp(
    model: nn.Module, cap: float, *, first_bucket_mb: float | None, lean_hooks: bool
) -> nn.Module:
    """A module-level function, not a lambda: functools.partial of it pickles."""
    return ViewDDP(model, bucket_cap_mb=cap, first_bucket_mb=first_bucket_mb, lean_hooks=lean_hooks)


def torch_ddp_views(model: nn.Module, cap: float) -> nn.Module:
    """torch's DDP with the same option: the reference of the parity check."""
    return nn.parallel.DistributedDataParallel(
        model, bucket_cap_mb=cap, gradient_as_bucket_view=True
    )


def demo(world_size: int = 2, backend: str = "gloo") -> None:
    """Train every ablation variant and torch DDP from the same inits; print the facts."""
    from tinyscale.comm.launch import run_on_ranks  # the launcher imports torch.multiprocessing

    # The test model has 0.1 MB of gradients: caps scaled down, 0.02 MB and a 0.005 MB first.
    variants = {**ablation(first_bucket_mb=0.005), "torch DDP": torch_ddp_views}
    fn = functools.partial(compare_with_torch_ddp, bucket_cap_mb=0.02, variants=variants)
    report = run_on_ranks(fn, world_size, backend=backend)[0]
    print(f"world size {world_size}, 5 SGD steps, zero_grad(set_to_none=True) after each")
    for name, r in report.items():
        calls = f"{r['all_reduces_per_step']:.0f}" if name != "torch DDP" else "-"
        print(
            f"{name:>33}: all-reduces/step {calls}, ranks identical: {r['rank_spread'] == 0.0}, "
            f"max |ours - torch DDP| = {r['vs_torch']:g}"
        )


# --8<-- [end:ablation]

# --8<-- [start:header]
"""DDP from scratch, steps 2 and 3: gradients in buckets, all-reduced while backward runs.

Try it:  python -c "from tinyscale.data_parallel.ddp_buckets import demo; demo()"

Step 1 (``tinyscale.data_parallel.ddp.NaiveDDP``) launches one all-reduce per parameter tensor: for a
model with hundreds of small tensors, the fixed cost of each collective dominates.
Step 2 packs the gradients into a few flat buckets (``bucket_cap_mb`` each, as in
``torch.nn.parallel.DistributedDataParallel``) and all-reduces each bucket once. Step 3
starts each bucket's all-reduce (``async_op=True``) from a gradient hook the moment its
last gradient exists, so communication runs while backward computes earlier layers —
Li et al. 2020, "PyTorch Distributed", §3.2.2 and §3.2.3.
"""

import contextlib
import copy
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.comm_model import assign_buckets
from tinyscale.comm.dist import rank_spread
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.device import select_device
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import MiB
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.ddp import NaiveDDP, random_batch

# --8<-- [end:header]


# --8<-- [start:assign]
@dataclasses.dataclass(eq=False)
class Bucket:
    """Some parameters whose gradients travel together in one flat buffer."""

    index: int
    names: list[str]
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (sum of numels,): what one all-reduce sends
    views: list[torch.Tensor]  # one view of the buffer per parameter, shaped like it
    pending: set[int] = dataclasses.field(default_factory=set)  # slots without a grad yet
    work: dist.Work | None = None  # the handle of the in-flight async all-reduce

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


# --8<-- [end:assign]


# --8<-- [start:bucketed]
def check_megabytes(name: str, mb: object) -> None:
    """A bucket size must be a positive, finite number of MB (MiB, as torch counts them)."""
    if not (isinstance(mb, int | float) and 0 < mb < math.inf):
        raise UsageError(
            f"{name} must be a positive number of MB, got {mb!r}: "
            "use e.g. 25 (torch's default cap), 1 (its first bucket) or 0.1 for a small model"
        )


class BucketedDDP(NaiveDDP):
    """Step 2: one all-reduce per bucket of gradients instead of one per tensor."""

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float = 25.0,
        first_bucket_mb: float | None = None,
    ) -> None:
        check_megabytes("bucket_cap_mb", bucket_cap_mb)
        if first_bucket_mb is not None:  # None: the first bucket is like the others
            check_megabytes("first_bucket_mb", first_bucket_mb)
        super().__init__(module)
        if len({(p.dtype, p.device) for p in self.params}) > 1:
            raise UsageError(
                "parameters of mixed dtypes or devices cannot share a flat bucket: "
                "move the model to one dtype and device (model.to(...)) before wrapping it"
            )
        names = {p: n for n, p in module.named_parameters()}
        # Backward produces gradients roughly in reverse order of registration (last
        # layer first), so reversed registration order approximates the order of use.
        order = self.params[::-1]
        sizes = [p.numel() * p.element_size() for p in order]
        self.buckets = []
        # step 4 (ddp_views) caps the first bucket lower, as torch's DDP: it is sent sooner
        first = None if first_bucket_mb is None else int(min(first_bucket_mb, bucket_cap_mb) * MiB)
        plan = assign_buckets(sizes, cap_bytes=int(bucket_cap_mb * MiB), first_cap_bytes=first)
        for index, members in enumerate(plan):
            params = [order[i] for i in members]
            numels = [p.numel() for p in params]
            buffer = params[0].new_zeros(sum(numels))  # same dtype and device
            views = [v.view_as(p) for v, p in zip(buffer.split(numels), params, strict=True)]
            self.buckets.append(Bucket(index, [names[p] for p in params], params, buffer, views))

    def finish_gradient_synchronization(self) -> None:
        for bucket in self.buckets:
            for p, view in zip(bucket.params, bucket.views, strict=True):
                view.copy_(p.grad) if p.grad is not None else view.zero_()  # flatten
            dist.all_reduce(bucket.buffer)  # one collective for the whole bucket
            self.num_collectives += 1
            self._unflatten(bucket)

    def _unflatten(self, bucket: Bucket) -> None:
        """Divide the summed bucket by the world size and copy it back into each .grad."""
        bucket.buffer.div_(self.world_size)
        for p, view in zip(bucket.params, bucket.views, strict=True):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)

    def describe_buckets(self) -> list[str]:
        """One line per bucket: how many tensors, how many bytes, first and last name."""
        return [
            f"bucket {b.index}: {len(b.params):2d} tensors, {b.nbytes:9,d} bytes, "
            f"{b.names[0]} ... {b.names[-1]}"
            for b in self.buckets
        ]


# --8<-- [end:bucketed]


# --8<-- [start:overlapped]
NOT_SYNCHRONISED = (
    "gradients of the last backward are not synchronised yet: call "
    "finish_gradient_synchronization() before the optimizer step and the next "
    "forward (or run the earlier micro-batches under no_sync())"
)
NOTHING_ARRIVED = (
    "no gradient arrived since the last synchronisation: call loss.backward() "
    "(outside no_sync()) before finish_gradient_synchronization()"
)


class OverlappedDDP(BucketedDDP):
    """Step 3: each bucket's all-reduce starts during backward, as soon as it is full.

    Usage (every rank):  loss.backward(); ddp.finish_gradient_synchronization(); opt.step()
    """

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float = 25.0) -> None:
        super().__init__(module, bucket_cap_mb=bucket_cap_mb)
        self.require_sync = True  # False inside no_sync(): gradients only accumulate
        self.events: list[tuple[str, str]] = []  # ("grad", name) / ("all-reduce", bucket)
        self._next_bucket = 0  # buckets launch in index order, the same order on every rank
        self._slot = {}
        for bucket in self.buckets:
            bucket.pending = set(range(len(bucket.params)))
            for i, p in enumerate(bucket.params):
                self._slot[p] = (bucket, i)
                # fires once per backward, after autograd has added this step's gradient
                # into p.grad (a weight used twice, like a tied embedding, fires once)
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        if any(b.work is not None or len(b.pending) < len(b.params) for b in self.buckets):
            raise UsageError(NOT_SYNCHRONISED)
        self.events.clear()
        return self.module(*args, **kwargs)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self.require_sync:
            return
        bucket, i = self._slot[p]
        bucket.views[i].copy_(p.grad)  # into the flat buffer, while backward goes on
        bucket.pending.discard(i)
        self.events.append(("grad", bucket.names[i]))
        self._launch_full_buckets()

    def _launch_full_buckets(self) -> None:
        # Bucket k waits for buckets < k: if ranks launched in different orders, the k-th
        # collective of one rank would meet a different bucket on another and mix them.
        while self._next_bucket < len(self.buckets):
            bucket = self.buckets[self._next_bucket]
            if bucket.pending:
                return
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)  # returns at once
            self.num_collectives += 1
            self.events.append(("all-reduce", f"bucket {bucket.index}"))
            self._next_bucket += 1

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce, then put the averages into .grad."""
        if all(len(b.pending) == len(b.params) for b in self.buckets):
            raise UsageError(NOTHING_ARRIVED)
        # A parameter that got no gradient in this backward (unused on this rank) never
        # fired its hook: it contributes what it has (earlier no_sync micro-batches) or
        # zeros, so its bucket completes and no rank hangs.
        for bucket in self.buckets[self._next_bucket :]:
            for i in bucket.pending:
                grad = bucket.params[i].grad
                bucket.views[i].copy_(grad) if grad is not None else bucket.views[i].zero_()
            bucket.pending.clear()
        self._launch_full_buckets()
        for bucket in self.buckets:
            bucket.work.wait()  # bounded by the process group's timeout
            bucket.work = None
            self._unflatten(bucket)
            bucket.pending = set(range(len(bucket.params)))
        self._next_bucket = 0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes in here only add into .grad locally;
        the first backward after it all-reduces the sum once."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True


# --8<-- [end:overlapped]


# --8<-- [start:parity]
VARIANTS = {
    "naive": lambda model, cap: NaiveDDP(model),
    "bucketed": lambda model, cap: BucketedDDP(model, bucket_cap_mb=cap),
    "overlapped": lambda model, cap: OverlappedDDP(model, bucket_cap_mb=cap),
    "torch DDP": lambda model, cap: nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap),
}
# Ours and torch's add the same gradients, in another order (see compare_with_torch_ddp):
# float32 sums then differ in the last bits (~1e-7 relative). SGD's update is linear in the
# gradient, so after 5 steps of lr 0.1 on weights of size ~0.1 that stays far below 1e-6.
PARITY_TOLERANCE = 1e-6


def compare_with_torch_ddp(
    *,
    cfg: ModelConfig | None = None,
    steps: int = 5,
    batch_size: int = 4,
    seq_len: int = 16,
    bucket_cap_mb: float = 0.01,
    optimizer: str = "sgd",
    lr: float = 0.1,
    seed: int = 0,
    variants: Mapping[str, Callable[[nn.Module, float], nn.Module]] = VARIANTS,
) -> dict[str, dict[str, Any]]:
    """Train our three DDPs and torch's from the same init on the same data; call on every rank.

    Each rank first builds its *own* random model (seed + rank): every wrapper must
    broadcast rank 0's weights. Returns, per variant: the largest parameter difference
    from torch DDP after ``steps`` optimizer steps, the largest difference between ranks
    after any step, all-reduces per step, and OverlappedDDP's timeline. Ours and torch's
    sum the same numbers, but the all-reduce adds an element's N contributions in an
    order that may depend on where it sits in the buffer, and our buckets are laid out
    differently from torch's: results may differ in the last bits (PARITY_TOLERANCE).
    ``variants``: other wrappers to train (step 4's), with torch's under "torch DDP".
    """
    cfg = cfg or preset("tiny")
    # nccl moves CUDA tensors: one GPU per rank; gloo, CPU tensors
    kind = "cuda" if dist.get_backend() == "nccl" else "cpu"
    device = select_device(kind, local_rank=int(os.environ["LOCAL_RANK"]))  # this node's rank
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(seed + dist.get_rank())
    base = TinyTransformer(cfg)
    batches = [
        random_batch(cfg, batch_size=batch_size, seq_len=seq_len, step=s, seed=seed, device=device)
        for s in range(steps)
    ]
    final, report = {}, {}
    for name, wrap in variants.items():
        model = wrap(copy.deepcopy(base).to(device), bucket_cap_mb)
        if optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
        spread = 0.0
        for x, y in batches:
            _, loss = model(x, y)
            loss.backward()  # torch DDP all-reduces inside backward; ours needs one more call:
            if name != "torch DDP":
                model.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
            spread = max(spread, rank_spread(flat_parameters(model)))
        final[name] = flat_parameters(model)
        report[name] = {
            "rank_spread": spread,
            "all_reduces_per_step": getattr(model, "num_collectives", math.nan) / steps,
            "timeline": getattr(model, "events", []),  # the last step's, for OverlappedDDP
        }
    for name in variants:
        report[name]["vs_torch"] = largest_difference(final[name], final["torch DDP"])
    return report


def demo(world_size: int = 2, backend: str = "gloo") -> None:
    """Print the parity facts and the overlap timeline (deterministic: no timings)."""
    from tinyscale.comm.launch import run_on_ranks  # the launcher imports torch.multiprocessing

    report = run_on_ranks(compare_with_torch_ddp, world_size, backend=backend)[0]
    print(f"world size {world_size}, 5 SGD steps, every rank its own batch, 0.01 MB buckets")
    for name, r in report.items():
        calls = (
            f"{r['all_reduces_per_step']:2.0f} all-reduces/step, " if name != "torch DDP" else ""
        )
        print(
            f"{name:>10}: {calls}ranks identical: {r['rank_spread'] == 0.0}, "
            f"max |ours - torch DDP| < {PARITY_TOLERANCE:g}: {r['vs_torch'] < PARITY_TOLERANCE}"
        )
    timeline = report["overlapped"]["timeline"]
    total = sum(kind == "grad" for kind, _ in timeline)
    print(f"overlapped, one backward ({total} gradients):")
    done = 0
    for kind, what in timeline:
        done += kind == "grad"
        if kind == "all-reduce":
            print(f"  after gradient {done:2d}/{total}: all-reduce of {what} starts")


# --8<-- [end:parity]

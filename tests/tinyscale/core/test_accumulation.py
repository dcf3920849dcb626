"""tinyscale.core.accumulation: the effective-batch formula, k micro-batches give the gradient of
one k-times-larger batch, no_sync leaves one all-reduce per bucket per optimizer step
(counted with a DDP communication hook), and the memory trade-off measured: the peak of
activations alive during accumulation is one micro-batch's, not the effective batch's.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tinyscale.core.accumulation import (
    PeakSavedBytes,
    accumulate_gradients,
    effective_batch_size,
    scaled_lr,
)
from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import UsageError
from tinyscale.core.memory import activation_bytes
from tinyscale.core.model import TinyTransformer

CFG = ModelConfig(dropout=0.0, max_position_embeddings=32)


def batch(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (n, 32), generator=torch.Generator().manual_seed(seed))


def test_effective_batch_size_formula() -> None:
    assert effective_batch_size(micro_batch=8, accumulation_steps=4, world_size=1) == 32
    assert effective_batch_size(micro_batch=8, accumulation_steps=4, world_size=4) == 128
    assert scaled_lr(base_lr=1e-3, base_batch=32, batch=128) == pytest.approx(4e-3)
    with pytest.raises(UsageError, match=">= 1"):
        effective_batch_size(micro_batch=8, accumulation_steps=0, world_size=1)


def test_accumulating_4_x_8_gives_the_gradient_of_32() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG)
    x = batch(32)
    loss_big = accumulate_gradients(model, [(x, x)])
    big = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_acc = accumulate_gradients(model, [(x[i : i + 8], x[i : i + 8]) for i in (0, 8, 16, 24)])
    assert loss_acc == pytest.approx(loss_big, rel=1e-5)
    for g_big, p in zip(big, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g_big, rtol=1e-4, atol=1e-6)


def test_accumulation_holds_the_activations_of_one_micro_batch() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(CFG)
    x = batch(32)
    micro, full = activation_bytes(model, x[:8], x[:8]), activation_bytes(model, x, x)
    assert full == pytest.approx(4 * micro, rel=0.02)  # activations scale with the batch
    with PeakSavedBytes(model) as acc:
        accumulate_gradients(model, [(x[i : i + 8], x[i : i + 8]) for i in (0, 8, 16, 24)])
    with PeakSavedBytes(model) as one:
        accumulate_gradients(model, [(x, x)])
    assert acc.peak == micro  # 4 x 8 holds the activations of 8 ...
    assert one.peak == full  # ... one batch of 32 holds those of 32


def test_no_sync_all_reduces_once_per_optimizer_step(process_group_of_one) -> None:
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(TinyTransformer(CFG))
    calls: list[int] = []

    def count(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls.append(bucket.index())
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])  # the all-reduced bucket

    ddp.register_comm_hook(None, count)
    x = batch(32)
    micro = [(x[i : i + 8], x[i : i + 8]) for i in (0, 8, 16, 24)]
    accumulate_gradients(ddp, micro)
    per_step = len(calls)  # buckets all-reduced for one optimizer step of 4 micro-batches
    calls.clear()
    for mb in micro:  # without no_sync: every backward all-reduces every bucket
        _, loss = ddp(*mb)
        loss.backward()
    assert per_step >= 1 and len(calls) == 4 * per_step

"""tinyscale.core.step: train_step is Lab 1's hand-written step bit for bit, with one batch
or k micro-batches (the same arithmetic as accumulate_gradients), through an fp16 loss
scaler, and with every hook a later lesson passes (sync, backward, clip_fn).
"""

import contextlib

import pytest
import torch

from tinyscale.core.accumulation import accumulate_gradients
from tinyscale.core.config import ModelConfig
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import DynamicLossScaler
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, make_optimizer

CFG = ModelConfig(max_position_embeddings=32)  # with dropout: the RNG must be drawn alike


def setup() -> tuple[TinyTransformer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyTransformer(CFG)
    return model, make_optimizer(model, TrainConfig())


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, CFG.vocab_size, (n, 32), generator=torch.Generator().manual_seed(n))
    return x, x.roll(-1, dims=1)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def loss_of(model: TinyTransformer):
    return lambda inputs, targets: model(inputs, targets)[1]


def test_one_batch_is_lab_1s_step_bit_for_bit() -> None:
    x, y = batch(8)
    mine, opt = setup()
    step = dict(loss_fn=loss_of(mine), optimizer=opt, lr=1e-3, max_norm=0.5)
    found = [train_step(**step, micro_batches=[(x, y)], clip_params=mine.parameters())
             for _ in range(3)]  # fmt: skip
    theirs, opt = setup()
    for result in found:  # Lab 1's loop as it was written before train_step
        for group in opt.param_groups:
            group["lr"] = 1e-3
        _, loss = theirs(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        opt.step()
        assert (result.loss, result.grad_norm) == (loss.item(), norm.item())
    assert same_weights(mine, theirs)


@pytest.mark.parametrize("fp16", [False, True])
def test_micro_batches_are_accumulate_gradients_bit_for_bit(fp16: bool) -> None:
    x, y = batch(16)
    micro = list(zip(x.split(4), y.split(4), strict=True))
    mine, opt = setup()
    scaler = DynamicLossScaler() if fp16 else None
    result = train_step(loss_fn=loss_of(mine), micro_batches=micro, accumulation_steps=4,
                        optimizer=opt, lr=1e-3, scaler=scaler, max_norm=1.0,
                        clip_params=mine.parameters())  # fmt: skip
    theirs, opt = setup()
    scaler = DynamicLossScaler() if fp16 else None
    opt.zero_grad(set_to_none=True)
    for group in opt.param_groups:
        group["lr"] = 1e-3
    loss = accumulate_gradients(theirs, micro, scale=scaler.scale if scaler else lambda v: v)
    if scaler is not None:
        scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
    scaler.step(opt) if scaler is not None else opt.step()
    assert (result.loss, result.grad_norm) == (loss, norm.item())
    assert same_weights(mine, theirs)


def test_the_hooks_a_later_lesson_passes() -> None:
    model, opt = setup()
    told, calls = [], []

    def sync(last: bool) -> contextlib.AbstractContextManager:
        told.append(last)
        return contextlib.nullcontext()

    def backward(loss: torch.Tensor) -> None:  # e.g. Accelerate's: it divides by k itself
        calls.append("backward")
        (loss / 3).backward()

    def clip_fn(params, max_norm: float) -> float:  # e.g. a norm across pipeline stages
        calls.append(("clip", max_norm))
        return 2.5

    result = train_step(loss_fn=loss_of(model), micro_batches=iter([batch(2)] * 3),
                        accumulation_steps=3, optimizer=opt, lr=0.25, sync=sync,
                        backward=backward, max_norm=7.0, clip_fn=clip_fn)  # fmt: skip
    assert told == [False, False, True]  # only the last micro-batch is told it is the last
    assert calls == ["backward"] * 3 + [("clip", 7.0)]
    assert result.grad_norm == 2.5 and {g["lr"] for g in opt.param_groups} == {0.25}
    unclipped = train_step(loss_fn=loss_of(model), micro_batches=[batch(2)], optimizer=opt,
                           lr=0.25)  # fmt: skip
    assert unclipped.grad_norm is None


def test_a_wrong_count_of_micro_batches_is_refused() -> None:
    model, opt = setup()
    with pytest.raises(ValueError, match="2 micro-batches for accumulation_steps=3"):
        train_step(loss_fn=loss_of(model), micro_batches=[batch(2)] * 2, accumulation_steps=3,
                   optimizer=opt, lr=1e-3)  # fmt: skip

# --8<-- [start:header]
"""Activation recomputation: keep less for the backward pass, run part of the forward again.

Try it:  python -c "from tinyscale.core.recompute import demo; demo()"

Full recomputation keeps each block's input and runs the block again in the backward
pass; selective recomputation (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models") runs again only the attention core,
softmax(q kᵀ) v. Both go through PyTorch's ``torch.utils.checkpoint.checkpoint``; a
from-scratch ``Recompute`` shows what it hides: the recomputed block's activations come
back, one block at a time, during the backward pass.
"""

import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from tinyscale.core.accumulation import PeakSavedBytes
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.flops import flops_per_token
from tinyscale.core.memory import activation_bytes, human_bytes
from tinyscale.core.model import Block, CausalSelfAttention, TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference

RECOMPUTE = ("none", "selective", "full")


def check_recompute(mode: str) -> str:
    if mode not in RECOMPUTE:
        raise UsageError(f"unknown recompute mode {mode!r}: use one of {', '.join(RECOMPUTE)}")
    return mode


# --8<-- [end:header]


# --8<-- [start:apply]
def torch_checkpoint(run: Callable, *inputs: torch.Tensor, **kwargs: object) -> torch.Tensor:
    """PyTorch's own: keep ``inputs``, run ``run`` again in backward, the RNG replayed."""
    return checkpoint(run, *inputs, use_reentrant=False, **kwargs)


class AttentionCoreRecomputed(TorchFunctionMode):
    """Every ``F.scaled_dot_product_attention`` call goes through ``recompute``."""

    def __init__(self, recompute: Callable) -> None:
        super().__init__()
        self.recompute = recompute

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:  # the core: softmax(q kᵀ / √d) v
            return self.recompute(func, *args, **(kwargs or {}))  # q, k, v kept, no more
        return func(*args, **(kwargs or {}))


def apply_recompute(
    model: nn.Module, mode: str, *, recompute: Callable = torch_checkpoint
) -> nn.Module:
    """Recompute in ``model``'s backward: nothing, the attention cores, or every Block.

    Each module's ``forward`` is replaced in place, so the parameters keep their names.
    ``checkpoint`` saves the RNG state and replays it (``preserve_rng_state=True``, its
    default), so dropout draws the same masks again and the gradients are identical.
    """
    check_recompute(mode)
    for module in model.modules():
        if mode == "full" and isinstance(module, Block):
            module.forward = functools.partial(recompute, module.forward)
        if mode == "selective" and isinstance(module, CausalSelfAttention):
            module.forward = _under(AttentionCoreRecomputed(recompute), module.forward)
    return model


def _under(mode: TorchFunctionMode, forward: Callable) -> Callable:
    @functools.wraps(forward)
    def run(*args: torch.Tensor) -> torch.Tensor:
        with mode:  # only inside this module's forward
            return forward(*args)

    return run


# --8<-- [end:apply]


# --8<-- [start:scratch]
class Recompute(torch.autograd.Function):
    """Recomputation from scratch: save the inputs, run ``run`` again in the backward pass."""

    @staticmethod
    def forward(ctx, run: Callable, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.run, ctx.rng = run, torch.get_rng_state()  # dropout's draws (on the CPU)
        ctx.save_for_backward(*inputs)  # the only activations kept
        return run(*inputs)  # autograd is off inside Function.forward: nothing else is saved

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.set_rng_state(ctx.rng)  # the same dropout masks as the first time
            out = ctx.run(*inputs)  # the activations exist again, for this part only
        torch.autograd.backward(out, grad)  # the weights' gradients land in .grad
        return None, *(x.grad for x in inputs)


def from_scratch(run: Callable, *inputs: torch.Tensor, **kwargs: object) -> torch.Tensor:
    """``torch_checkpoint``'s drop-in (CPU only: it replays the CPU's random numbers)."""
    if any(x.device.type != "cpu" for x in inputs):
        raise UsageError("from_scratch replays the CPU's RNG only: use torch_checkpoint on a GPU")
    return Recompute.apply(functools.partial(run, **kwargs), *inputs)


# --8<-- [end:scratch]


# --8<-- [start:flops]
def recompute_flops_per_token(cfg: ModelConfig, seq_len: int, mode: str) -> int:
    """The forward FLOPs recomputation adds per token (``core.flops``: 6 N + 12 L T d).

    Full runs every block's forward again: 2 FLOPs per matmul weight of the blocks, and
    the attention core's 4 T d. Selective runs only the core again: 4 T d per block.
    """
    d, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    core = 4 * L * seq_len * d  # q kᵀ, and the weights times v: 2 T d each
    blocks = 2 * L * (4 * d * d + 2 * d * i)  # qkv, proj, up, down
    return {"none": 0, "selective": core, "full": blocks + core}[check_recompute(mode)]


def step_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass, counted by torch's FlopCounterMode.

    It has no formula for the CPU's fused attention kernel; under the math kernel the
    same products are two ``bmm`` calls, which it counts. Early stop is off, so the
    recomputation runs every op again, as the formula counts (on, see the exercises).
    """
    math_kernel = sdpa_kernel(SDPBackend.MATH)
    with math_kernel, set_checkpoint_early_stop(False), FlopCounterMode(display=False) as flops:
        model(x, y)[1].backward()
    return flops.get_total_flops()


# --8<-- [end:flops]


# --8<-- [start:measure]
def measure(
    cfg: ModelConfig, mode: str, *, micro_batch: int, seq_len: int,
    recompute: Callable = torch_checkpoint,
) -> dict:  # fmt: skip
    """Saved bytes (one block, the model, the peak), FLOPs and gradients of one step."""
    torch.manual_seed(0)
    model = apply_recompute(TinyTransformer(cfg), mode, recompute=recompute)
    x, y = torch.randint(cfg.vocab_size, (2, micro_batch, seq_len))
    h = torch.randn(micro_batch, seq_len, cfg.hidden_size, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):  # the kernel that keeps the (T, T) attention weights
        block_math = activation_bytes(model.blocks[0], h)
    with PeakSavedBytes(model) as peak:
        model(x, y)[1].backward()
    grads = flat_parameters(model, grads=True)  # a copy
    model.zero_grad()
    return {
        "block": activation_bytes(model.blocks[0], h),
        "block_math": block_math,
        "model": activation_bytes(model, x, y),
        "peak": peak.peak,
        "flops": step_flops(model, x, y),
        "grads": grads,
    }


def demo(name: str = "tiny", *, micro_batch: int = 4, seq_len: int = 16) -> None:
    """Each mode, with torch's checkpoint and from scratch, measured on one step."""
    cfg = preset(name)
    runs = [(mode, torch_checkpoint) for mode in RECOMPUTE]
    runs += [("selective", from_scratch), ("full", from_scratch)]
    print(f"{name}, micro-batch {micro_batch}, sequence {seq_len}: bytes saved for backward")
    print(f"{'mode':<18} {'one block':>11} {'math kernel':>13} {'model':>9} {'peak':>9} "
          f"{'FLOPs added':>12}  gradients")  # fmt: skip
    none = measure(cfg, "none", micro_batch=micro_batch, seq_len=seq_len)
    for mode, recompute in runs:
        r = measure(cfg, mode, micro_batch=micro_batch, seq_len=seq_len, recompute=recompute)
        differ = largest_difference(r["grads"], none["grads"])
        how = "torch" if recompute is torch_checkpoint else "scratch"
        print(f"{mode + ', ' + how:<18} {r['block']:>11,} {r['block_math']:>13,} "
              f"{r['model']:>9,} {r['peak']:>9,} {r['flops'] - none['flops']:>12,}  {differ:.1e}")  # fmt: skip


def time_demo(
    name: str = "bench", *, micro_batch: int = 4, seq_len: int = 64, steps: int = 5,
    device: str = "cpu",
) -> None:  # fmt: skip
    """Seconds per forward and backward pass (the median of ``steps``), each mode in turn;
    on a GPU also the most memory allocated in a step (weights and gradients included)."""
    cfg, cuda = preset(name), torch.device(device).type == "cuda"
    x, y = torch.randint(cfg.vocab_size, (2, micro_batch, seq_len), device=device)
    print(f"{name}, micro-batch {micro_batch}, sequence {seq_len}: one forward and backward")
    for mode in RECOMPUTE:
        torch.manual_seed(0)
        model = apply_recompute(TinyTransformer(cfg).to(device), mode)
        times = []
        for _ in range(steps + 1):  # the first one warms up
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            model(x, y)[1].backward()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        extra = recompute_flops_per_token(cfg, seq_len, mode) / flops_per_token(cfg, seq_len)
        memory = f", {human_bytes(torch.cuda.max_memory_allocated())} at most" if cuda else ""
        print(f"  {mode:<9} {extra:4.0%} more FLOPs, {statistics.median(times[1:]):.3f} s{memory}")


# --8<-- [end:measure]

# --8<-- [start:header]
"""What a training step costs: FLOPs per token, model FLOPs utilization (MFU), and memory.

Try it:  python -m tinyscale.workflows.mfu

MFU = the FLOPs the model needs per second of training / the peak FLOP/s of the hardware.
The FLOPs are tinyscale.core.flops's formula, checked here against torch's counter. The
peak of this CPU is measured (a square fp32 matmul, timed); a GPU's is its data sheet's
dense bf16 number, passed with --peak-tflops.
"""

import dataclasses
import resource
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.device import select_device
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.flops import flops_per_token
from tinyscale.core.memory import activation_bytes, human_bytes
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import autocast_context
from tinyscale.core.training import TrainConfig
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate
from tinyscale.workflows.profiling import ProfileConfig, build, train_step

# --8<-- [end:header]


# --8<-- [start:counted]
def counted_flops(model: TinyTransformer, x: torch.Tensor, y: torch.Tensor) -> int:
    """The FLOPs torch's counter sees in one forward + backward: matmuls and attention only."""
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, y)
        loss.backward()
    return counter.get_total_flops()


# --8<-- [end:counted]


# --8<-- [start:peak]
def matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` square fp32 matmuls (2 n^3 FLOPs each), on the
    threads torch uses here: the most this machine does on dense, well-shaped work."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # first use: allocation, kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


@dataclasses.dataclass(frozen=True)
class Utilization:
    flops_per_token: int
    tokens_per_step: int
    seconds_per_step: float
    peak_flops: float

    @property
    def achieved(self) -> float:
        return self.flops_per_token * self.tokens_per_step / self.seconds_per_step

    @property
    def mfu(self) -> float:
        return self.achieved / self.peak_flops


def measure(cfg: ProfileConfig, peak_flops: float, *, precision: str = "fp32") -> Utilization:
    """Time cfg.steps training steps (after cfg.warmup): the formula's FLOPs over the median.

    ``precision``: one of core.precision.PRECISIONS; bf16 to compare with a GPU's bf16 peak.
    """
    autocast = autocast_context(select_device(cfg.device), precision)  # checked before work
    model, opt, (x, y) = build(cfg)
    times = []
    with autocast:
        for step in range(cfg.warmup + cfg.steps):
            t0 = time.perf_counter()
            train_step(model, opt, (x, y))  # its loss.item() waits for a GPU to finish
            if step >= cfg.warmup:
                times.append(time.perf_counter() - t0)
    per_token = flops_per_token(model.cfg, x.shape[1])
    return Utilization(per_token, x.numel(), statistics.median(times), peak_flops)


# --8<-- [end:peak]


# --8<-- [start:memory]
def memory_report(cfg: ProfileConfig) -> list[str]:
    """Saved activations (counted by autograd's saved-tensor hooks) against the calculator's
    estimate, and this process's peak resident memory."""
    model, _, (x, y) = build(cfg)
    loss_of = LossOf(model, y)
    saved = activation_bytes(loss_of, x)  # every tensor autograd keeps for the backward
    estimate = activation_bytes_estimate(model.cfg, micro_batch=x.shape[0], seq_len=x.shape[1])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    if sys.platform == "darwin":
        peak_kib //= 1024  # bytes on macOS
    return [
        f"dropout {model.cfg.dropout:g}: saved activations {human_bytes(saved)}, "
        f"calculator (dropout 0) {human_bytes(estimate)}, "
        f"difference {human_bytes(saved - estimate)}",
        f"peak resident memory of this process: {human_bytes(peak_kib * 1024)}",
    ]


class LossOf(torch.nn.Module):
    """model(x, targets) -> the loss: activation_bytes then sees the whole training forward."""

    def __init__(self, model: TinyTransformer, targets: torch.Tensor) -> None:
        super().__init__()
        self.model, self.targets = model, targets

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, self.targets)[1]


# --8<-- [end:memory]


# --8<-- [start:main]
# The flags a training script has for the same things (tinyscale.core.cli): the batch, the
# steps, the device, the precision. Here: the Lab's batch, 10 steps, the CPU, fp32.
DEFAULTS = TrainConfig(device="cpu", max_steps=10)
FLAGS = ("global_batch_size", "max_steps", "device", "precision")


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_flags(parser, DEFAULTS, FLAGS, notes={"max_steps": "here: the steps timed",
                                              "precision": "bf16 to compare with a GPU's peak"})  # fmt: skip
    parser.add_argument("--dropout", type=float, default=None, help="default: the config's")
    parser.add_argument("--peak-tflops", type=float, help="the card's peak; default: measured")
    args = parser.parse_args(argv)
    train = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    if train.device != "cpu" and args.peak_tflops is None:  # auto included: it may be a GPU
        raise UsageError("--peak-tflops is needed off the CPU: the card's dense peak, e.g. 989")
    cfg = ProfileConfig(device=train.device, batch_size=train.global_batch_size,
                        dropout=args.dropout, steps=train.max_steps)  # fmt: skip
    peak = args.peak_tflops * 1e12 if args.peak_tflops else matmul_peak()
    use = measure(cfg, peak, precision=train.precision)
    print(f"FLOPs per token: {use.flops_per_token:,} x {use.tokens_per_step:,} tokens per step")
    print(f"achieved: {use.achieved / 1e9:,.2f} GFLOP/s, peak: {peak / 1e9:,.1f} GFLOP/s, "
          f"MFU: {100 * use.mfu:.1f} %")  # fmt: skip
    if train.device == "cpu":
        for line in memory_report(cfg):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]

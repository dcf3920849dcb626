# --8<-- [start:header]
"""What a training step costs: FLOPs per token, model FLOPs utilization (MFU), and memory.

Try it:  python -m tinyscale.workflows.mfu

MFU = the FLOPs the model needs per second of training / the peak FLOP/s of the hardware.
The peak of this CPU is measured (a square fp32 matmul, timed); a GPU's is its data
sheet's dense bf16 number, passed with --peak-tflops.
"""

import dataclasses
import resource
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from tinyscale.core.config import ModelConfig
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.memory import activation_bytes, human_bytes
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.memory_calculator import activation_bytes_estimate
from tinyscale.workflows.profiling import ProfileConfig, build, train_step

# --8<-- [end:header]


# --8<-- [start:formula]
def matmul_weights(cfg: ModelConfig) -> int:
    """N: the weights that multiply activations in a matmul, each token once.

    Per block q, k, v and the output projection (4 d^2) and the MLP (2 d i); then the head
    (V d), the tied embedding matrix used as a matmul. Left out: the embedding *lookups*
    (no arithmetic), biases and LayerNorms (d numbers each, not d^2).
    """
    d, i, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    return L * (4 * d * d + 2 * d * i) + V * d


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Forward + backward FLOPs per token: 6 N + 12 L T d.

    6 N: a matmul costs 2 FLOPs per weight per token (multiply, add) in the forward, and
    twice that in the backward (the gradient of the input and of the weight). 12 L T d:
    attention's two T x T matmuls (q k^T, then the weights times v) cost 2 T d each per
    token and layer forward, 4 T d backward; counted over the whole T x T square, the way
    the math kernel computes it, although causal attention needs only half of it.
    """
    return 6 * matmul_weights(cfg) + 12 * cfg.num_hidden_layers * seq_len * cfg.hidden_size


def counted_flops(model: TinyTransformer, x: torch.Tensor, y: torch.Tensor) -> int:
    """The FLOPs torch's counter sees in one forward + backward: matmuls and attention only."""
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, y)
        loss.backward()
    return counter.get_total_flops()


# --8<-- [end:formula]


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


def measure(cfg: ProfileConfig, peak_flops: float, *, bf16: bool = False) -> Utilization:
    """Time cfg.steps training steps (after cfg.warmup): the formula's FLOPs over the median."""
    model, opt, (x, y) = build(cfg)
    times = []
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
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
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    parser.add_argument("--batch-size", type=int, default=ProfileConfig.batch_size)
    parser.add_argument("--dropout", type=float, default=None, help="default: the config's")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, help="the card's peak; default: measured")
    parser.add_argument("--bf16", action="store_true", help="autocast to bf16 (on a GPU)")
    args = parser.parse_args(argv)
    if args.device != "cpu" and args.peak_tflops is None:
        raise UsageError("--peak-tflops is needed off the CPU: the card's dense peak, e.g. 989")
    cfg = ProfileConfig(device=args.device, batch_size=args.batch_size, dropout=args.dropout,
                        steps=args.steps)  # fmt: skip
    peak = args.peak_tflops * 1e12 if args.peak_tflops else matmul_peak()
    use = measure(cfg, peak, bf16=args.bf16)
    print(f"FLOPs per token: {use.flops_per_token:,} x {use.tokens_per_step:,} tokens per step")
    print(f"achieved: {use.achieved / 1e9:,.2f} GFLOP/s, peak: {peak / 1e9:,.1f} GFLOP/s, "
          f"MFU: {100 * use.mfu:.1f} %")  # fmt: skip
    if args.device == "cpu":
        for line in memory_report(cfg):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]

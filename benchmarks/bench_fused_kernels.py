"""Many small kernels vs one fused kernel: AdamW's three implementations, and GELU by hand.

Run:  make bench   (or: python benchmarks/bench_fused_kernels.py)

Session B's "CUDA kernels vs fused kernels", measured on a CPU. Every variant is timed in
the same process, interleaved round by round, so machine noise hits all of them alike.
On a GPU the gaps are larger: each kernel launch costs a few microseconds of CPU time,
and each unfused op reads and writes the whole tensor in GPU memory again.
"""

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tinyscale.core.model import TinyTransformer

ROUNDS, REPEATS, WARMUP = 7, 20, 3


def adamw_variants() -> dict[str, Callable[[], None]]:
    """One optimizer step over TinyTransformer's 28 parameter tensors, three ways."""
    steps = {}
    for name, kwargs in {
        "AdamW foreach=False (a loop: ~10 ops per tensor)": dict(foreach=False),
        "AdamW foreach=True (multi-tensor ops)": dict(foreach=True),
        "AdamW fused=True (one kernel)": dict(fused=True),
    }.items():
        torch.manual_seed(0)
        model = TinyTransformer()
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
        steps[name] = opt.step
    return steps


def gelu_by_hand(x: torch.Tensor) -> torch.Tensor:
    """tanh-GELU as six separate ops: each one reads and writes the whole tensor."""
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))
    return 0.5 * x * (1.0 + torch.tanh(inner))


def gelu_variants() -> dict[str, Callable[[], None]]:
    x = torch.randn(16 * 64, 256, generator=torch.Generator().manual_seed(0))  # (B*T, ffn)
    assert torch.allclose(gelu_by_hand(x), F.gelu(x, approximate="tanh"), atol=1e-6)
    return {
        "GELU by hand (6 kernels)": lambda: gelu_by_hand(x),
        "F.gelu (1 fused kernel)": lambda: F.gelu(x, approximate="tanh"),
    }


def time_group(variants: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Median microseconds per call of each variant, interleaved round by round."""
    for fn in variants.values():
        for _ in range(WARMUP):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(REPEATS):
                fn()
            times[name].append((time.perf_counter() - t0) / REPEATS * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def report() -> str:
    torch.set_num_threads(1)  # one core: the cost of many small kernels, not parallel speed-up
    lines = [f"{'variant':<50} {'µs/call':>9} {'speed-up':>9}"]
    for group in (adamw_variants(), gelu_variants()):
        medians = time_group(group)
        baseline = next(iter(medians.values()))
        for name, us in medians.items():
            lines.append(f"{name:<50} {us:>9,.0f} {baseline / us:>8.1f}x")
    lines.append(
        f"(median of {ROUNDS} rounds x {REPEATS} calls, 1 thread, torch {torch.__version__})"
    )
    return "\n".join(lines)


LIMITS = """\
Here: one CPU core; an unfused op costs a pass over memory and a Python dispatch, so the
fused versions win by what those passes cost. On a GPU each unfused op is also a kernel
launch (microseconds of CPU time while the GPU may idle), and memory bandwidth, not
arithmetic, bounds elementwise work: fusing saves more there."""


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()

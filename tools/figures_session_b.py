"""Regenerate the plots and recorded outputs of the Session B page.

Run:  python tools/figures_session_b.py [allreduce scaler accumulation fused]

Plots come from the course code itself: the all-reduce simulations, a real run of our
loss scaler beside torch.amp.GradScaler, activation bytes measured during accumulation,
and the fused-kernel benchmark's printed table.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "session_b"


def save(fig: plt.Figure, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / name)
    plt.close(fig)
    print(f"wrote {OUT.relative_to(ROOT)}/{name}")


def allreduce() -> None:
    """Bytes per rank (simulated points on the formula lines) and the alpha-beta crossover."""
    from tinyscale.comm.comm_model import (
        allreduce_time,
        ring_allreduce_bytes,
        simulate_ring_allreduce,
        simulate_tree_allreduce,
        tree_allreduce_bytes,
    )

    size = 840  # elements; divisible by 2..8
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    ns = list(range(2, 17))
    for name, formula, simulate, color in (
        ("ring", ring_allreduce_bytes, simulate_ring_allreduce, "C0"),
        ("double binary tree", tree_allreduce_bytes, simulate_tree_allreduce, "C1"),
    ):
        ax1.plot(ns, [formula(size_bytes=1, world_size=n) for n in ns], color=color, label=name)
        sims = [max(simulate([[1.0] * size] * n).elements_sent) / size for n in ns]
        ax1.plot(ns, sims, "o", color=color, ms=4, label=f"{name}: simulated, busiest rank")
    ax1.set(xlabel="ranks N", ylabel="bytes sent per rank / gradient bytes S")
    ax1.set_title("Bandwidth: both send about 2S per rank")
    ax1.legend(fontsize=8)
    link = dict(world_size=256, alpha_s=5e-6, bandwidth_bps=25e9)
    sizes = [2.0**k for k in range(10, 33)]
    for name, color in (("ring", "C0"), ("tree", "C1")):
        times = [allreduce_time(name, size_bytes=s, **link) * 1e3 for s in sizes]
        ax2.loglog(sizes, times, color=color, label=name)
    ax2.set(xlabel="message size (bytes)", ylabel="model time (ms)")
    ax2.set_title("Latency: N=256, α=5 µs, 25 GB/s (a model)")
    ax2.legend(fontsize=8)
    save(fig, "allreduce.png")


def scaler() -> None:
    """The scale of our scaler and of torch.amp.GradScaler through forced overflows."""
    import torch.nn.functional as F
    from torch import nn

    from tinyscale.core.precision import DynamicLossScaler

    settings = dict(init_scale=2.0**10, growth_interval=4)
    overflow_at = {3, 4, 12}
    trajectories: dict[str, list[float]] = {}
    for name, make in (
        ("DynamicLossScaler (ours)", lambda: DynamicLossScaler(**settings)),
        ("torch.amp.GradScaler", lambda: torch.amp.GradScaler("cpu", **settings)),
    ):
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s = make()
        scales = [s.get_scale()]
        for step in range(20):
            opt.zero_grad()
            loss = F.mse_loss(model(torch.randn(16, 8)), torch.zeros(16, 4))
            s.scale(loss).backward()
            if step in overflow_at:
                model.weight.grad[0, 0] = float("inf")
            s.step(opt)
            s.update()
            scales.append(s.get_scale())
        trajectories[name] = scales
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    (ours, ours_scales), (ref, ref_scales) = trajectories.items()
    ax.step(range(len(ours_scales)), ours_scales, where="post", label=ours)
    ax.plot(range(len(ref_scales)), ref_scales, "o", ms=4, label=ref)
    for step in overflow_at:
        ax.axvline(step + 1, color="red", lw=0.8, ls=":")
    ax.set_yscale("log", base=2)
    ax.set(xlabel="optimizer step (red: forced overflow, step skipped)", ylabel="loss scale")
    ax.set_title("Back off x0.5 on overflow, grow x2 after 4 clean steps")
    ax.legend(fontsize=8)
    save(fig, "loss_scale.png")


def accumulation() -> None:
    """Effective batch 32 reached with different micro-batches: peak activations measured."""
    from tinyscale.core.accumulation import PeakSavedBytes, accumulate_gradients
    from tinyscale.core.memory import measured_state_bytes
    from tinyscale.core.model import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 1024, (32, 64))
    micro_batches = [1, 2, 4, 8, 16, 32]
    peaks = []
    for mb in micro_batches:
        with PeakSavedBytes(model) as peak:
            accumulate_gradients(model, [(x[i : i + mb], x[i : i + mb]) for i in range(0, 32, mb)])
        peaks.append(peak.peak / 2**20)
    opt.step()
    states = measured_state_bytes(model, opt).total / 2**20
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    labels = [f"{mb} x {32 // mb}" for mb in micro_batches]
    ax.bar(labels, peaks, label="activations (peak, measured)")
    ax.bar(labels, [states] * len(labels), bottom=peaks, label="model states (fp32 AdamW)")
    ax.set(xlabel="micro-batch x accumulation steps (effective batch 32)", ylabel="MiB")
    ax.set_title("Same effective batch: memory follows the micro-batch")
    ax.legend(fontsize=8)
    save(fig, "accumulation_memory.png")


def fused() -> None:
    """The fused-kernel benchmark's table, as printed by a real run."""
    path = ROOT / "benchmarks" / "bench_fused_kernels.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fused_kernels.txt").write_text(bench.report() + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}/fused_kernels.txt")


FIGURES = {"allreduce": allreduce, "scaler": scaler, "accumulation": accumulation, "fused": fused}

if __name__ == "__main__":
    for name in sys.argv[1:] or FIGURES:
        FIGURES[name]()

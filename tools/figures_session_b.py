"""Regenerate the plots and recorded outputs of the Session B page.

Run:  python tools/figures_session_b.py [allreduce scaler accumulation fused]

Plots come from the course code itself: the all-reduce simulations, a real run of our
loss scaler beside torch.amp.GradScaler, activation bytes measured during accumulation,
and the fused-kernel benchmark's printed table. Each plot's numbers are written beside it
(allreduce.json, loss_scale.json, accumulation_memory.json): tests/docs/test_generated_plots.py
recomputes them with the ``*_data`` functions and compares.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "session_b"


def save_data(data: dict, name: str) -> None:
    """The plotted numbers, beside the plot: what a test compares with a fresh computation."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}/{name}")


def save(fig: plt.Figure, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / name)
    plt.close(fig)
    print(f"wrote {OUT.relative_to(ROOT)}/{name}")


LINK = dict(world_size=256, alpha_s=5e-6, bandwidth_bps=25e9)  # the right panel's model


def allreduce_data() -> dict:
    """Bytes per rank (formula, and simulated on the busiest rank) and modelled times."""
    from tinyscale.comm.comm_model import (
        allreduce_time,
        ring_allreduce_bytes,
        simulate_ring_allreduce,
        simulate_tree_allreduce,
        tree_allreduce_bytes,
    )

    size = 840  # elements; divisible by 2..8
    ns = list(range(2, 17))
    data: dict = {"ranks": ns, "sizes_bytes": [2.0**k for k in range(10, 33)]}
    for name, formula, simulate in (
        ("ring", ring_allreduce_bytes, simulate_ring_allreduce),
        ("tree", tree_allreduce_bytes, simulate_tree_allreduce),
    ):
        data[name] = {
            "formula": [formula(size_bytes=1, world_size=n) for n in ns],
            "simulated": [max(simulate([[1.0] * size] * n).elements_sent) / size for n in ns],
            "time_ms": [
                allreduce_time(name, size_bytes=s, **LINK) * 1e3 for s in data["sizes_bytes"]
            ],
        }
    return data


def allreduce() -> None:
    """Bytes per rank (simulated points on the formula lines) and the alpha-beta crossover."""
    data = allreduce_data()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for key, name, color in (("ring", "ring", "C0"), ("tree", "double binary tree", "C1")):
        ax1.plot(data["ranks"], data[key]["formula"], color=color, label=name)
        ax1.plot(
            data["ranks"], data[key]["simulated"], "o", color=color, ms=4,
            label=f"{name}: simulated, busiest rank",
        )  # fmt: skip
    ax1.set(xlabel="ranks N", ylabel="bytes sent per rank / gradient bytes S")
    ax1.set_title("Bandwidth: both send about 2S per rank")
    ax1.legend(fontsize=8)
    for key, color in (("ring", "C0"), ("tree", "C1")):
        ax2.loglog(data["sizes_bytes"], data[key]["time_ms"], color=color, label=key)
    ax2.set(xlabel="message size (bytes)", ylabel="model time (ms)")
    ax2.set_title("Latency: N=256, α=5 µs, 25 GB/s (a model)")
    ax2.legend(fontsize=8)
    save(fig, "allreduce.png")
    save_data(data, "allreduce.json")


OVERFLOW_AT = {3, 4, 12}  # optimizer steps whose gradient we set to inf


def loss_scale_data() -> dict[str, list[float]]:
    """The scale of our scaler and of torch.amp.GradScaler through forced overflows."""
    import torch.nn.functional as F
    from torch import nn

    from tinyscale.core.precision import DynamicLossScaler

    settings = dict(init_scale=2.0**10, growth_interval=4)
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
            if step in OVERFLOW_AT:
                model.weight.grad[0, 0] = float("inf")
            s.step(opt)
            s.update()
            scales.append(s.get_scale())
        trajectories[name] = scales
    return trajectories


def scaler() -> None:
    """The scale of our scaler and of torch.amp.GradScaler through forced overflows."""
    trajectories = loss_scale_data()
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    (ours, ours_scales), (ref, ref_scales) = trajectories.items()
    ax.step(range(len(ours_scales)), ours_scales, where="post", label=ours)
    ax.plot(range(len(ref_scales)), ref_scales, "o", ms=4, label=ref)
    for step in OVERFLOW_AT:
        ax.axvline(step + 1, color="red", lw=0.8, ls=":")
    ax.set_yscale("log", base=2)
    ax.set(xlabel="optimizer step (red: forced overflow, step skipped)", ylabel="loss scale")
    ax.set_title("Back off x0.5 on overflow, grow x2 after 4 clean steps")
    ax.legend(fontsize=8)
    save(fig, "loss_scale.png")
    save_data(trajectories, "loss_scale.json")


def accumulation_memory_data(micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> dict:
    """Effective batch 32 reached with different micro-batches: peak activations measured."""
    from tinyscale.core.accumulation import PeakSavedBytes, accumulate_gradients
    from tinyscale.core.memory import measured_state_bytes
    from tinyscale.core.model import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 1024, (32, 64))
    peaks = []
    for mb in micro_batches:
        with PeakSavedBytes(model) as peak:
            accumulate_gradients(model, [(x[i : i + mb], x[i : i + mb]) for i in range(0, 32, mb)])
        peaks.append(peak.peak / 2**20)
    opt.step()
    states = measured_state_bytes(model, opt).total / 2**20
    return {
        "micro_batches": list(micro_batches),
        "peak_activations_mib": peaks,
        "states_mib": states,
    }


def accumulation() -> None:
    """Effective batch 32 reached with different micro-batches: peak activations measured."""
    data = accumulation_memory_data()
    micro_batches, peaks = data["micro_batches"], data["peak_activations_mib"]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    labels = [f"{mb} x {32 // mb}" for mb in micro_batches]
    ax.bar(labels, peaks, label="activations (peak, measured)")
    ax.bar(
        labels, [data["states_mib"]] * len(labels), bottom=peaks, label="model states (fp32 AdamW)"
    )
    ax.set(xlabel="micro-batch x accumulation steps (effective batch 32)", ylabel="MiB")
    ax.set_title("Same effective batch: memory follows the micro-batch")
    ax.legend(fontsize=8)
    save(fig, "accumulation_memory.png")
    save_data(data, "accumulation_memory.json")


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

# --8<-- [start:header]
"""What ZeRO moves and holds, counted from the real calls and tensors, against the paper.

Try it:  python -c "from tinyscale.data_parallel.zero_vs_ddp import demo; demo()"

Rajbhandari et al. 2020 (arXiv:1910.02054) §7.2: stages 0-2 move 2Ψ per step and rank
(an all-reduce is a reduce-scatter plus an all-gather), stage 3 moves 3Ψ (the weights
are all-gathered twice: for forward and again for backward). Those are the large-N
limits of the ring's exact cost, (N-1)/N of the data per pass: memory_calculator's
formulas, against what tinyscale.comm.counter counts.
"""

import copy
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.dist import rank_spread
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.memory_calculator import zero_state_bytes, zero_step_bytes
from tinyscale.data_parallel.zero import ZERO_STAGES, ZeRO

# --8<-- [end:header]


# --8<-- [start:compare]


def compare_stages(
    *, cfg: ModelConfig | None = None, steps: int = 3, batch_size: int = 4, seq_len: int = 16,
    lr: float = 1e-3, seed: int = 0, stages: tuple[int, ...] = ZERO_STAGES,
) -> dict[Any, Any]:  # fmt: skip
    """On every rank: torch DDP + torch AdamW, then our ZeRO stages, from the same init and data.

    Returns per stage: the largest parameter difference from the DDP baseline after
    ``steps`` steps, the largest difference between ranks, the bytes held per component
    after the last step, the peak model-state bytes, and the last step's collectives.
    """
    cfg = cfg or preset("tiny")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)  # each rank its own init: the broadcast must fix it
    base = TinyTransformer(cfg)
    batches = [
        random_batch(cfg, batch_size=batch_size, seq_len=seq_len, step=s, seed=seed)
        for s in range(steps)
    ]
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr, weight_decay=0.01, foreach=False)
    for x, y in batches:
        ddp(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    baseline = flat_parameters(ddp.module)
    report: dict[Any, Any] = {"numel": baseline.numel(), "world": world}
    for stage in stages:
        model = copy.deepcopy(base)
        zero = ZeRO(model, stage=stage, units=list(model.blocks), lr=lr)
        with CollectiveCounter() as counter:
            for i, (x, y) in enumerate(batches):
                counter.counting = i == steps - 1  # the last step's collectives
                zero(x, y)[1].backward()
                zero.step()
                held = zero.state_bytes()
                zero.zero_grad()
        full = zero.full_parameters()
        report[stage] = {
            "vs_ddp": largest_difference(full, baseline),
            "rank_spread": rank_spread(full),
            "held": held,
            "peak": zero.peak_state_bytes,
            "padded": sum(u.flat.numel() for u in zero.units),
            "calls": counter.ops(),
            "sent": counter.sent_bytes(),
        }
    return report


# --8<-- [end:compare]


# --8<-- [start:demo]
def demo(world_size: int = 2) -> None:
    """Print, per stage: parity with DDP, bytes held vs the formula, bytes sent vs the formula."""
    from tinyscale.comm.launch import run_on_ranks  # the launcher imports torch.multiprocessing

    r = run_on_ranks(compare_stages, world_size, deadline_s=300)[0]
    psi, n = r["numel"], r["world"]
    print(f"Ψ = {psi:,} parameters, N = {n} ranks, fp32, 3 AdamW steps; bytes per rank")
    print("stage  |ZeRO-DDP|  params   grads  optimizer  formula   sent/step  formula")
    for stage in ZERO_STAGES:
        s = r[stage]
        formula = zero_state_bytes(psi, stage=stage, world_size=n, precision="fp32")
        sent_formula = zero_step_bytes(stage=stage, numel=s["padded"], world=n)
        p, g, o = s["held"]
        print(
            f"{stage:>5}  {s['vs_ddp']:9.1e}  {p:7,} {g:7,}  {o:9,}  {formula.total:8,}"
            f"  {s['sent']:10,.0f}  {sent_formula:7,.0f}"
        )


def bad_world_size() -> str:
    """One rank more than a 1-parameter unit can be cut into: the error every rank raises."""
    try:
        ZeRO(torch.nn.Linear(1, 1, bias=False), stage=1)
    except UsageError as err:
        return str(err)
    return "no error"


# --8<-- [end:demo]

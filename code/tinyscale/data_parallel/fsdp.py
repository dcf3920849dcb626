# --8<-- [start:header]
"""FSDP2 (torch's ``fully_shard``) and HSDP on CPU with gloo, proven equal to our ZeRO-3.

    python -m tinyscale.data_parallel.fsdp --world-size 2                  # FSDP2 against our ZeRO-3
    python -m tinyscale.data_parallel.fsdp --world-size 4 --shard-size 2   # HSDP: 2 replicas of 2 shards
    python -m tinyscale.data_parallel.fsdp --world-size 2 --precision bf16  # with a mixed-precision policy

Week 2 built ZeRO-3 by hand (tinyscale.data_parallel.zero); from here on the course may use PyTorch's.
``fully_shard`` does what our stage 3 does, unit by unit: it keeps each parameter as a
DTensor sharded by rows (Shard(0)), all-gathers a unit before its forward and again
before its backward, frees it after, and reduce-scatters its gradients. On a 2-D mesh
(replicate × shard) it is HSDP: shard inside a group, all-reduce across the groups.
"""

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.comm.parallel_layout import ParallelLayout
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.core.precision import PRECISIONS, check_precision
from tinyscale.data_parallel.dcp_checkpoint import load_dcp, save_dcp
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.memory_calculator import check_shard_size
from tinyscale.data_parallel.zero import ZeRO

# --8<-- [end:header]


# --8<-- [start:wrap]
def make_mesh(
    world_size: int, shard_size: int | None = None, device_type: str = "cpu"
) -> DeviceMesh:
    """A 1-D mesh (FSDP: shard over every rank) or a 2-D one (HSDP: replicate × shard).

    Both are cut from the course's one layout, ``ParallelLayout(dp_replicate=R, dp_shard=S)``,
    whose groups carry the job's timeout.
    """
    shard = check_shard_size(world_size, shard_size)
    layout = ParallelLayout(dp_replicate=world_size // shard, dp_shard=shard)
    mesh = layout.build(device_type=device_type).mesh
    return mesh["dp_shard"] if shard == world_size else mesh["dp_replicate", "dp_shard"]


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for one of the course's precisions. bf16: compute in bf16 (gathered
    weights, activations), reduce gradients in fp32; the sharded master weights and the
    optimizer stay fp32."""
    if check_precision(precision) == "fp16":
        raise UsageError("--precision fp16 needs a loss scaler, which this run has not: use bf16")
    bf16 = precision == "bf16"
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.float32 if bf16 else None,
    )


def shard_model(
    model: TinyTransformer, mesh: DeviceMesh, *, precision: str = "fp32",
    reshard_after_forward: bool = True,
) -> TinyTransformer:  # fmt: skip
    """fully_shard each block, then the root: the same units as tinyscale.data_parallel.zero's stage 3.

    Every rank must build the same model first (same seed): unlike our ZeRO, fully_shard
    does not broadcast rank 0's weights, it keeps the slice of the local copy.
    """
    policy = mixed_precision(precision)
    for block in model.blocks:  # inner units first: the root takes what is left
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


# --8<-- [end:wrap]


# --8<-- [start:held]
def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank stores for a tensor: its own shard if it is a DTensor."""
    t = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return t.numel() * t.element_size()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) this rank holds, counted from the tensors."""
    params = list(model.parameters())
    weights = sum(local_bytes(p) for p in params)
    grads = sum(local_bytes(p.grad) for p in params if p.grad is not None)
    states = sum(
        local_bytes(t)
        for state in optimizer.state.values()
        for name, t in state.items()
        if name != "step"  # AdamW's step counter: one scalar per parameter
    )
    return weights, grads, states


# --8<-- [end:held]


# --8<-- [start:compare]
def adamw(model: nn.Module, *, lr: float) -> torch.optim.Optimizer:
    """The optimizer of the ZeRO lesson's parity runs: torch AdamW, one tensor at a time."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=False)


def train(
    model: nn.Module, batches: list, *, lr: float, counter: CollectiveCounter
) -> tuple[list[float], torch.optim.Optimizer]:
    """AdamW steps; ``counter`` logs the collectives of the last step."""
    opt = adamw(model, lr=lr)
    losses = []
    with counter:
        for i, (x, y) in enumerate(batches):
            counter.counting = i == len(batches) - 1
            loss = model(x, y)[1]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # keep the gradient shards, to count them
            losses.append(loss.item())
    return losses, opt


def compare_with_zero3(
    shard_size: int | None = None, precision: str = "fp32", checkpoint_dir: str | None = None,
    *, steps: int = 3, lr: float = 1e-3, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """On every rank: our ZeRO-3 over all ranks, then FSDP2 (or HSDP) from the same init.

    Returns the largest parameter difference after ``steps`` AdamW steps, the bytes each
    holds, what the last step's collectives sent, and — with ``checkpoint_dir`` — the loss
    of one more step after a DCP save and a reload into a fresh sharded model.
    """
    world = dist.get_world_size()
    torch.manual_seed(seed)  # the same model on every rank: fully_shard needs it
    base = TinyTransformer(preset("tiny"))
    data = [
        random_batch(preset("tiny"), batch_size=4, seq_len=16, step=s, seed=seed)
        for s in range(steps + 1)
    ]
    batches, extra = data[:steps], data[steps]

    ours = copy.deepcopy(base)
    zero = ZeRO(ours, stage=3, units=list(ours.blocks), lr=lr)
    zero_losses = []
    for x, y in batches:
        loss = zero(x, y)[1]
        loss.backward()
        zero.step()
        zero.zero_grad()
        zero_losses.append(loss.item())
    reference = zero.full_parameters()

    mesh = make_mesh(world, shard_size)
    model = shard_model(copy.deepcopy(base), mesh, precision=precision)
    counter = CollectiveCounter()
    losses, optimizer = train(model, batches, lr=lr, counter=counter)
    held = held_bytes(model, optimizer)
    full = flat_parameters(p.full_tensor() for p in model.parameters())
    report = {
        "world": world, "shard": shard_size or world, "numel": full.numel(),
        "vs_zero3": largest_difference(full, reference),
        "losses": losses, "zero3_losses": zero_losses, "held": held,
        "sent": {op: sum(c.sent_bytes() for c in counter.calls if c.op == op)
                 for op in sorted(counter.ops())},
        "placements": str(next(iter(model.parameters())).placements),
    }  # fmt: skip
    if checkpoint_dir:
        report["resumed"] = dcp_roundtrip(
            model, optimizer, base, mesh, checkpoint_dir, extra, precision=precision, lr=lr
        )
    return report


# --8<-- [end:compare]


# --8<-- [start:checkpoint]
def dcp_roundtrip(
    model: nn.Module, optimizer: torch.optim.Optimizer, base: nn.Module, mesh: DeviceMesh,
    path: str, batch: tuple, *, precision: str, lr: float,
) -> dict[str, float]:  # fmt: skip
    """Save the sharded model and optimizer with DCP, reload both into a fresh sharded
    model, and compute the next batch's loss with each: the losses must be equal."""
    model_state, optim_state = get_state_dict(model, optimizer)
    save_dcp({"model": model_state, "optim": optim_state}, path)  # a file per rank + .metadata

    fresh = shard_model(copy.deepcopy(base), mesh, precision=precision)  # the wrong weights...
    fresh_opt = adamw(fresh, lr=lr)
    template_model, template_optim = get_state_dict(fresh, fresh_opt)
    state = load_dcp({"model": template_model, "optim": template_optim}, path)  # ...until now
    set_state_dict(
        fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )

    x, y = batch
    return {"continued": model(x, y)[1].item(), "reloaded": fresh(x, y)[1].item()}


# --8<-- [end:checkpoint]


# --8<-- [start:cli]
def main(argv: Sequence[str] | None = None) -> int:
    from tinyscale.comm.launch import run_on_ranks
    from tinyscale.core.errors import ArgumentParser

    parser = ArgumentParser(description="FSDP2 / HSDP on gloo against our ZeRO-3.")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=None, help="HSDP: ranks per shard group")
    parser.add_argument("--precision", default="fp32",
                        help=f"one of {', '.join(PRECISIONS)}; bf16: bf16 compute")  # fmt: skip
    parser.add_argument("--checkpoint-dir", default=None, help="save and reload a DCP checkpoint")
    args = parser.parse_args(argv)
    if args.world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {args.world_size}")
    check_shard_size(args.world_size, args.shard_size)  # before any process starts
    mixed_precision(args.precision)  # the same
    r = run_on_ranks(compare_with_zero3, args.world_size, args.shard_size, args.precision,
                     args.checkpoint_dir, deadline_s=240)[0]  # fmt: skip
    kind = (
        "FSDP2" if r["shard"] == r["world"] else f"HSDP ({r['world'] // r['shard']} x {r['shard']})"
    )
    compute = "bf16 compute" if args.precision == "bf16" else "fp32"
    print(f"{kind}, {r['world']} ranks, {compute}, "
          f"Ψ = {r['numel']:,}; placements {r['placements']}")  # fmt: skip
    print(f"losses  ours {' '.join(f'{v:.4f}' for v in r['zero3_losses'])}")
    print(f"        fsdp {' '.join(f'{v:.4f}' for v in r['losses'])}")
    print(f"max |FSDP - our ZeRO-3| after {len(r['losses'])} steps: {r['vs_zero3']:.1e}")
    w, g, o = r["held"]
    print(f"held by rank 0: weights {w:,} + grads {g:,} + optimizer {o:,} = {w + g + o:,} B")
    sent = ", ".join(f"{name} {b:,.0f}" for name, b in r["sent"].items())
    print(f"sent by rank 0 in the last step: {sent} B")
    if "resumed" in r:
        print(f"after DCP save + reload: loss {r['resumed']['reloaded']:.6f} "
              f"(uninterrupted {r['resumed']['continued']:.6f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:cli]

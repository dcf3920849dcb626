# --8<-- [start:header]
"""DeepSpeed's ZeRO 1, 2 and 3 against ours: the same steps, weights, bytes held and traffic.

    python -m tinyscale.compat.zero_vs_deepspeed            # 2 gloo ranks, fp32, 3 AdamW steps

For each stage, every rank trains our ZeRO (tinyscale.data_parallel.zero) and a DeepSpeed engine built
from the course's config (code/config/deepspeed/zero<stage>.json, switched to fp32) from
the same initial weights on the same batches, with the same AdamW; then compares the
losses, the weights, the bytes each rank holds and the elements its collectives move.
Only what the configs must change for an exact comparison is changed: fp32, no gradient
clipping, our micro-batch.
"""

import contextlib
import copy
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.compat.deepspeed_config import DS_CONFIG_DIR, load_ds_config, skip_unused_shm_build
from tinyscale.compat.deepspeed_costs import engine_state_bytes
from tinyscale.core.config import preset
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.parity import flat_parameters, largest_difference
from tinyscale.data_parallel.ddp import random_batch
from tinyscale.data_parallel.zero import ZeRO

COMPARED_STAGES = (1, 2, 3)  # ZeRO stages both implement (stage 0 is DDP)
BATCH, SEQ, LR, WEIGHT_DECAY = 4, 16, 1e-3, 0.01


@dataclasses.dataclass(kw_only=True)
class Trained:
    losses: list[float]  # one per step, this rank's
    weights: torch.Tensor | None  # every parameter after the last step, flat (gathered at stage 3)
    held: tuple[int, int]  # bytes of weights and of optimizer state this rank keeps
    moved: float  # elements the last step's collectives moved (the paper's accounting)
    calls: dict[str, int]  # the last step's collectives by name


# --8<-- [end:header]


# --8<-- [start:ours]
def ours(base: TinyTransformer, stage: int, batches: list, counter: CollectiveCounter) -> Trained:
    model = copy.deepcopy(base)
    zero = ZeRO(model, stage=stage, units=list(model.blocks), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for i, (x, y) in enumerate(batches):
        counter.clear()
        counter.counting = i == len(batches) - 1  # the last step's collectives
        loss = zero(x, y)[1]
        loss.backward()
        zero.step()
        counter.counting = False
        zero.zero_grad()
        losses.append(loss.item())
    weights, _, optimizer = zero.state_bytes()
    return Trained(
        losses=losses,
        weights=zero.full_parameters(),
        held=(weights, optimizer),
        moved=counter.volume(),  # elements, in the paper's accounting
        calls=dict(counter.ops()),
    )


# --8<-- [end:ours]


# --8<-- [start:deepspeed]
def deepspeeds(
    base: TinyTransformer, stage: int, batches: list, counter: CollectiveCounter, **zero_settings
) -> Trained:
    import deepspeed

    config = load_ds_config(DS_CONFIG_DIR / f"zero{stage}.json", precision="fp32")
    config["gradient_clipping"] = 0.0  # ours does not clip
    config["train_micro_batch_size_per_gpu"] = BATCH
    config["gradient_accumulation_steps"] = 1
    config["zero_optimization"].update(zero_settings)
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=False
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    losses = []
    for i, (x, y) in enumerate(batches):
        counter.clear()
        counter.counting = i == len(batches) - 1  # the last step's collectives
        loss = engine(x, y)[1]
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    counter.counting = False
    held = engine_state_bytes(engine)
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):  # ZeRO-3: gather the shards; else no-op
        full = flat_parameters(params)
    engine.destroy()  # ZeRO-3 leaves hooks on the module
    return Trained(
        losses=losses,
        weights=full,
        held=(held.params, held.optimizer),
        moved=counter.volume(),
        calls=dict(counter.ops()),
    )


# --8<-- [end:deepspeed]


# --8<-- [start:compare]
def compare(steps: int = 3, seed: int = 0, threshold: int = 100) -> dict[Any, Any]:
    """On every rank: for each stage, ours and DeepSpeed's from the same init and batches;
    then DeepSpeed's ZeRO-3 once more with weights of <= ``threshold`` elements kept whole."""
    torch.manual_seed(seed + dist.get_rank())  # a different init per rank: both must broadcast
    base = TinyTransformer(preset("tiny"))
    batches = [
        random_batch(preset("tiny"), batch_size=BATCH, seq_len=SEQ, step=s, seed=seed)
        for s in range(steps)
    ]
    report: dict[Any, Any] = {"psi": sum(p.numel() for p in base.parameters())}
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints to stdout; keep it clean
        skip_unused_shm_build()
        # installed before the first deepspeed.initialize: DeepSpeed keeps references
        counter = CollectiveCounter().install()
        counter.counting = False
        runs = [(stage, stage, {}) for stage in COMPARED_STAGES]
        runs.append(("3p", 3, {"stage3_param_persistence_threshold": threshold}))
        for label, stage, settings in runs:
            if not settings:  # 3p compares with ZeRO-3's run of ours: nothing of ours changes
                a = ours(base, stage, batches, counter)
            b = deepspeeds(base, stage, batches, counter, **settings)
            diff = torch.tensor(largest_difference(a.weights, b.weights))
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)  # the largest on any rank
            report[label] = {  # numbers, not the model, go back to the parent process
                "ours": dataclasses.replace(a, weights=None),
                "deepspeed": dataclasses.replace(b, weights=None),
                "max_param_diff": diff.item(),
            }
        counter.remove()
    return report


# --8<-- [end:compare]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    from tinyscale.comm.launch import run_on_ranks

    p = ArgumentParser(
        description="DeepSpeed ZeRO 1-3 against tinyscale.data_parallel.zero, on gloo ranks."
    )
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes), 2 to 8")
    p.add_argument("--persistence-threshold", type=int, default=100, help="for the row 3p")
    args = p.parse_args(argv)
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if not 2 <= args.world_size <= 8:
        raise UsageError(f"--world-size {args.world_size}: use 2 to 8 processes on one machine")
    if args.persistence_threshold < 0:
        raise UsageError(f"--persistence-threshold must be >= 0, got {args.persistence_threshold}")
    r = run_on_ranks(
        compare, args.world_size, args.steps, 0, args.persistence_threshold,
        timeout_s=60, deadline_s=300,
    )[0]  # fmt: skip
    n, psi = args.world_size, r["psi"]
    print(f"{n} ranks, fp32, {args.steps} AdamW steps; rank 0's losses")
    width = 9 * args.steps - 1  # "5.556125 " per step
    print(f"stage  {'ours':<{width}}  {'DeepSpeed':<{width}}  max |weights ours - DS|")
    for stage in COMPARED_STAGES:
        row = r[stage]
        ours_l = " ".join(f"{v:.6f}" for v in row["ours"].losses)
        ds_l = " ".join(f"{v:.6f}" for v in row["deepspeed"].losses)
        print(f"{stage:>5}  {ours_l}  {ds_l}  {row['max_param_diff']:.1e}")
    print(f"bytes held per rank after the last step (Ψ = {psi:,}, N = {n})")
    print("stage  weights: ours       DS  optimizer: ours       DS")
    for label in (*COMPARED_STAGES, "3p"):
        (wa, oa), (wb, ob) = r[label]["ours"].held, r[label]["deepspeed"].held
        print(f"{label:>5}  {wa:>13,}  {wb:>7,}  {oa:>15,}  {ob:>7,}")
    print("elements moved by the last step, in Ψ (an all-reduce counts twice its tensor)")
    print("stage  ours  DeepSpeed  DeepSpeed's calls")
    for label in (*COMPARED_STAGES, "3p"):
        a, b = r[label]["ours"], r[label]["deepspeed"]
        calls = ", ".join(f"{name} {k}" for name, k in sorted(b.calls.items()))
        print(f"{label:>5}  {a.moved / psi:4.2f}  {b.moved / psi:9.2f}  {calls}")
    print(f"3p: ZeRO-3 with stage3_param_persistence_threshold {args.persistence_threshold}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:main]

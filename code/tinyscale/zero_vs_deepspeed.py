# --8<-- [start:header]
"""DeepSpeed's ZeRO 1, 2 and 3 against ours: the same steps, the same weights.

    python -m tinyscale.zero_vs_deepspeed            # 2 gloo ranks, fp32, 3 AdamW steps

For each stage, every rank trains our ZeRO (tinyscale.zero) and a DeepSpeed engine built
from the course's config (code/config/deepspeed/zero<stage>.json, switched to fp32) from
the same initial weights on the same batches, with the same AdamW; then compares the
losses and the weights. Only what the configs must change for an exact comparison is
changed: fp32, no gradient clipping, our micro-batch.
"""

import contextlib
import copy
import sys
from collections.abc import Sequence
from typing import Any

import torch

from tinyscale.ddp import rank_batch
from tinyscale.deepspeed_config import DS_CONFIG_DIR, load_ds_config, skip_unused_shm_build
from tinyscale.errors import ArgumentParser, UsageError, run_cli
from tinyscale.model import TinyTransformer
from tinyscale.zero import ZeRO
from tinyscale.zero_comm import TEST_CFG

STAGES = (1, 2, 3)
BATCH, SEQ, LR, WEIGHT_DECAY = 4, 16, 1e-3, 0.01

# --8<-- [end:header]


# --8<-- [start:ours]
def ours(base: TinyTransformer, stage: int, batches: list) -> tuple[list[float], torch.Tensor]:
    model = copy.deepcopy(base)
    zero = ZeRO(model, stage=stage, units=list(model.blocks), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for x, y in batches:
        loss = zero(x, y)[1]
        loss.backward()
        zero.step()
        zero.zero_grad()
        losses.append(loss.item())
    return losses, zero.full_parameters()


# --8<-- [end:ours]


# --8<-- [start:deepspeed]
def deepspeeds(
    base: TinyTransformer, stage: int, batches: list
) -> tuple[list[float], torch.Tensor]:
    import deepspeed

    config = load_ds_config(DS_CONFIG_DIR / f"zero{stage}.json", precision="fp32")
    config["gradient_clipping"] = 0.0  # ours does not clip
    config["train_micro_batch_size_per_gpu"] = BATCH
    config["gradient_accumulation_steps"] = 1
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=False
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    losses = []
    for x, y in batches:
        loss = engine(x, y)[1]
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):  # ZeRO-3: gather the shards; else no-op
        full = torch.cat([p.detach().flatten().clone() for p in params])
    engine.destroy()  # ZeRO-3 leaves hooks on the module
    return losses, full


# --8<-- [end:deepspeed]


# --8<-- [start:compare]
def compare(steps: int = 3, seed: int = 0) -> dict[int, dict[str, Any]]:
    """On every rank: for each stage, ours and DeepSpeed's from the same init and batches."""
    torch.manual_seed(seed)  # the same model on every rank
    base = TinyTransformer(TEST_CFG)
    batches = [
        rank_batch(TEST_CFG, batch_size=BATCH, seq_len=SEQ, step=s, seed=seed) for s in range(steps)
    ]
    report = {}
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints to stdout; keep it clean
        skip_unused_shm_build()
        for stage in STAGES:
            our_losses, our_params = ours(base, stage, batches)
            ds_losses, ds_params = deepspeeds(base, stage, batches)
            report[stage] = {
                "ours": our_losses,
                "deepspeed": ds_losses,
                "max_param_diff": (our_params - ds_params).abs().max().item(),
            }
    return report


def main(argv: Sequence[str] | None = None) -> int:
    from tinyscale.launch import run_on_ranks

    p = ArgumentParser(description="DeepSpeed ZeRO 1-3 against tinyscale.zero, on 2 gloo ranks.")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    r = run_on_ranks(compare, 2, args.steps, timeout_s=60, deadline_s=300)[0]
    print(f"2 ranks, fp32, {args.steps} AdamW steps; rank 0's losses")
    print("stage  ours                       DeepSpeed                  max |weights ours - DS|")
    for stage, row in r.items():
        ours_l = " ".join(f"{v:.6f}" for v in row["ours"])
        ds_l = " ".join(f"{v:.6f}" for v in row["deepspeed"])
        print(f"{stage:>5}  {ours_l}  {ds_l}  {row['max_param_diff']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))

# --8<-- [end:compare]

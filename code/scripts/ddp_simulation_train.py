# --8<-- [start:args]
"""Lab 2: the Lab 1 model, trained by N processes with DistributedDataParallel.

Launch:  torchrun --nproc_per_node=2 code/scripts/ddp_simulation_train.py
         torchrun --nproc_per_node=4 code/scripts/ddp_simulation_train.py --max-steps 40
Elastic: torchrun --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:29400 \
             --max-restarts 1 code/scripts/ddp_simulation_train.py \
             --resume auto --fail-rank 1 --fail-step 20

torchrun starts the same script N times; each copy reads its rank from the environment,
joins the process group (gloo on CPU, nccl on CUDA), trains on its own shard of every
batch and writes its own log, logs/rank_<N>/train.log.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from tinyscale.comm.dist import DistEnv, device_for, dist_env, distributed, rank_logger
from tinyscale.core.accumulation import accumulate_gradients
from tinyscale.core.checkpoint import load_checkpoint
from tinyscale.core.config import DEFAULT_CONFIG_PATH, ModelConfig, load_model_config
from tinyscale.core.data import LMData, build_datasets
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import TinyTransformer
from tinyscale.core.precision import PRECISIONS, autocast_context, make_scaler
from tinyscale.core.training import TrainConfig, get_batch, lr_at, make_optimizer, seed_everything
from tinyscale.data_parallel.ddp_training import (
    BatchPlan,
    evaluate_sharded,
    latest_checkpoint,
    make_sampler,
    rank_batches,
    ranks_in_sync,
    restore_rng,
    save_ranked_checkpoint,
    steps_and_total,
    tokens_per_second,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="model config JSON")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=32, help="samples per step, all ranks")
    p.add_argument("--grad-accum-steps", type=int, default=1, help="micro-batches per step")
    p.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="stop early, as if interrupted")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps")
    p.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    p.add_argument("--output-dir", default="runs/ddp", help="checkpoints and summary.json")
    p.add_argument("--log-dir", default="logs", help="one train.log per rank under rank_<N>/")
    p.add_argument("--resume", default=None, help="a checkpoint, or 'auto': the newest, if any")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (one GPU per rank)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--timeout-s", type=float, default=60.0, help="collective timeout")
    p.add_argument("--fail-rank", type=int, default=None, help="this rank raises ...")
    p.add_argument("--fail-step", type=int, default=None, help="... at this step (1st attempt)")
    p.add_argument("--hang-rank", type=int, default=None, help="this rank skips a collective ...")
    p.add_argument("--hang-step", type=int, default=None, help="... at this step")
    return p.parse_args(argv)


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """Everything checked before joining the process group."""

    env: DistEnv
    device: torch.device
    model_cfg: ModelConfig
    cfg: TrainConfig
    plan: BatchPlan
    resume: dict[str, Any] | None
    args: argparse.Namespace


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad input becomes a one-line UsageError here, before any rank joins or writes.

    Under torchrun every rank runs these checks and fails the same way, so no rank is
    left waiting for a peer that will never come.
    """
    env = dist_env()  # no RANK/WORLD_SIZE, MASTER_ADDR or MASTER_PORT: a one-line error
    device = device_for(env, args.device)
    autocast_context(device, args.precision)  # fp16 on a CPU: a one-line error
    for flag in ("fail", "hang"):
        rank, step = getattr(args, f"{flag}_rank"), getattr(args, f"{flag}_step")
        if (rank is None) != (step is None):
            raise UsageError(f"--{flag}-rank and --{flag}-step go together: give both or neither")
        if rank is not None and not 0 <= rank < env.world_size:
            raise UsageError(
                f"--{flag}-rank {rank} is outside the world: ranks are 0..{env.world_size - 1}"
            )
    for name in ("log_every", "timeout_s"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    plan = BatchPlan(
        global_batch_size=args.global_batch_size,
        grad_accum_steps=args.grad_accum_steps,
        world_size=env.world_size,
    )
    model_cfg = load_model_config(args.config)
    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.global_batch_size,
        lr=args.lr,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        max_steps=args.max_steps,
        output_dir=args.output_dir,
    )
    path = latest_checkpoint(args.output_dir) if args.resume == "auto" else args.resume
    resume = load_checkpoint(path, expect=model_cfg) if path else None
    if resume is not None and resume["world_size"] != env.world_size:
        raise UsageError(
            f"checkpoint {path} was written by {resume['world_size']} ranks, this run has "
            f"{env.world_size}: relaunch with --nproc_per_node={resume['world_size']}"
        )
    return Run(
        env=env, device=device, model_cfg=model_cfg, cfg=cfg, plan=plan, resume=resume, args=args
    )


# --8<-- [end:check]


# --8<-- [start:metrics]
@dataclasses.dataclass(frozen=True, kw_only=True)
class StepStats:
    """What one rank measured in one optimizer step."""

    step: int
    loss: float  # this rank's own loss: the mean over its shard of the batch
    samples: int  # samples this rank consumed this step: micro x accum
    tokens: int
    seconds: float
    inputs: torch.Tensor  # (micro x accum, T) the token ids this rank read


# Rank-specific metrics: each rank computes these from its own step and logs them.
RANK_METRICS: dict[str, Callable[[StepStats], float]] = {
    "tokens/s": lambda s: s.tokens / s.seconds,
    "samples": lambda s: s.samples,
}


def log_line(stats: StepStats, total: int, global_loss: float, sync: float) -> str:
    fields = [f"step {stats.step:4d}/{total}", f"loss {stats.loss:.4f}"]
    fields.append(f"global loss {global_loss:.4f}")
    fields += [f"{name} {fn(stats):,.0f}" for name, fn in RANK_METRICS.items()]
    fields.append(f"max param diff vs rank 0 {sync:.1e}")
    return " | ".join(fields)


# --8<-- [end:metrics]


# --8<-- [start:setup]
def train(run: Run, data: LMData) -> dict[str, Any]:
    """The Lab 1 loop, distributed: the same steps, each on a shard of the global batch."""
    env, device, cfg, plan, args = run.env, run.device, run.cfg, run.plan, run.args
    log = rank_logger(env, args.log_dir)
    seed_everything(cfg.seed)  # every rank builds the same initial weights ...
    model = TinyTransformer(run.model_cfg).to(device)
    # ... and DDP broadcasts rank 0's anyway. It all-reduces gradients during backward.
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    torch.manual_seed(cfg.seed + 1 + env.rank)  # but each rank draws its own dropout masks
    optimizer = make_optimizer(model, cfg)
    scaler = make_scaler(device, args.precision)
    sampler = make_sampler(data.train, env, plan, seed=cfg.seed)
    steps_per_epoch = len(rank_batches(sampler, plan, epoch=0))
    total_steps, stop_at = steps_and_total(steps_per_epoch, cfg)
    step = 0
    if run.resume is not None:  # every rank loads the same file, then its own RNG state
        model.load_state_dict(run.resume["model"])
        optimizer.load_state_dict(run.resume["optimizer"])
        if scaler is not None and run.resume.get("scaler"):
            scaler.load_state_dict(run.resume["scaler"])
        restore_rng(run.resume, env, device)
        step = run.resume["step"]
        log.info(f"resumed from step {step}")
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log.info(
        f"{env.launcher} | backend {dist.get_backend()} | device {device} | restart {restarts} | "
        f"global batch {plan.global_batch_size} = micro {plan.micro_batch_size} x accum "
        f"{plan.grad_accum_steps} x world {env.world_size} | {len(sampler)} samples on this rank"
    )
    # --8<-- [end:setup]

    # --8<-- [start:loop]
    tokens_seen, seconds, own_losses, last_global = 0, 0.0, [], float("nan")
    while step < stop_at:
        epoch, batch_in_epoch = divmod(step, steps_per_epoch)
        for indices in rank_batches(sampler, plan, epoch)[batch_in_epoch:]:
            if step + 1 == args.fail_step and env.rank == args.fail_rank and restarts == 0:
                raise RuntimeError(f"injected failure on rank {env.rank} at step {step + 1}")
            t0 = time.perf_counter()
            x, y = get_batch(data.train, indices, device)  # (micro x accum, T) each
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg, total_steps)
            optimizer.zero_grad(set_to_none=True)
            micro = list(
                zip(x.split(plan.micro_batch_size), y.split(plan.micro_batch_size), strict=False)
            )
            loss = accumulate_gradients(
                ddp,
                micro,
                autocast=lambda: autocast_context(device, args.precision),
                scale=scaler.scale if scaler else lambda loss: loss,
            )  # after this, p.grad is the same on every rank: the average over all of them
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            scaler.step(optimizer) if scaler is not None else optimizer.step()
            if scaler is not None:
                scaler.update()
            step += 1
            stats = StepStats(
                step=step,
                loss=loss,
                samples=len(indices),
                tokens=x.numel(),
                seconds=time.perf_counter() - t0,
                inputs=x,
            )
            tokens_seen, seconds = tokens_seen + stats.tokens, seconds + stats.seconds
            own_losses.append(loss)
            global_loss = torch.tensor([loss], dtype=torch.float64, device=device)
            if not (step == args.hang_step and env.rank == args.hang_rank):  # the hang lab
                dist.all_reduce(global_loss)  # SUM, only for the log: the mean over ranks
            last_global = global_loss.item() / env.world_size
            sync = ranks_in_sync(model, device)  # cheap: two numbers per parameter tensor
            if sync != 0.0:
                raise RuntimeError(f"parameters diverged across ranks at step {step}: {sync}")
            if step % args.log_every == 0 or step == stop_at:
                log.info(log_line(stats, total_steps, last_global, sync))
            if step % cfg.checkpoint_every == 0 or step == stop_at:
                state = {
                    "model_config": dataclasses.asdict(run.model_cfg),
                    "train_config": dataclasses.asdict(cfg),
                    "step": step,
                    "epoch": step // steps_per_epoch,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                }
                path = Path(cfg.output_dir) / "checkpoints" / f"step_{step:06d}.pt"
                save_ranked_checkpoint(state, path, env, device)
            if step == stop_at:
                break
    # --8<-- [end:loop]

    # --8<-- [start:summary]
    heldout = evaluate_sharded(model, data.heldout, env, batch_size=32, device=device)
    mine = torch.tensor(
        [sum(own_losses) / max(1, len(own_losses)), tokens_seen, seconds], dtype=torch.float64
    ).to(device)
    every = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(every, mine)  # (mean loss, tokens, seconds) of every rank
    per_rank = [
        {"rank": r, "mean_loss": t[0].item(), "tokens": int(t[1]), "seconds": t[2].item()}
        for r, t in enumerate(every)
    ]
    summary = {
        "world_size": env.world_size,
        "steps": step,
        "global_batch_size": plan.global_batch_size,
        "micro_batch_size": plan.micro_batch_size,
        "grad_accum_steps": plan.grad_accum_steps,
        "final_loss": last_global,
        "heldout_loss": heldout,
        # the slowest rank sets the pace: every step waits for it in the all-reduce
        "tokens_per_second": tokens_per_second(
            sum(r["tokens"] for r in per_rank), max(r["seconds"] for r in per_rank)
        ),
        "per_rank": per_rank,
    }
    if env.is_main:
        for r in per_rank:
            log.info(
                f"summary rank {r['rank']}: mean loss {r['mean_loss']:.4f} | "
                f"{r['tokens']:,} tokens | {tokens_per_second(r['tokens'], r['seconds']):,.0f} tokens/s"
            )
        log.info(
            f"summary: {step} steps | final loss {last_global:.4f} | held-out loss {heldout:.4f} | "
            f"{summary['tokens_per_second']:,.0f} tokens/s over {env.world_size} ranks"
        )
        Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# --8<-- [end:summary]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    run = check_inputs(parse_args(argv))  # all checks first: a bad flag fails every rank alike
    data = build_datasets(
        vocab_size=run.model_cfg.vocab_size, block_size=run.model_cfg.max_position_embeddings
    )
    sampler = make_sampler(data.train, run.env, run.plan, seed=run.cfg.seed)  # enough data?
    _, stop_at = steps_and_total(len(rank_batches(sampler, run.plan, epoch=0)), run.cfg)
    if run.resume is not None and run.resume["step"] >= stop_at:
        raise UsageError(
            f"the checkpoint is at step {run.resume['step']}, the end of this run: raise --epochs"
        )
    with distributed(run.args.device, timeout_s=run.args.timeout_s):  # joins, always leaves
        train(run, data)
    return 0


@record  # an uncaught exception's traceback goes to TORCHELASTIC_ERROR_FILE, for torchrun
def cli() -> int:
    return run_cli(main)  # bad input: one line on stderr and exit code 2, no traceback


if __name__ == "__main__":
    sys.exit(cli())
# --8<-- [end:main]

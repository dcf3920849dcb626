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
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tinyscale.comm.dist import distributed, exit_without_teardown, rank_logger, rank_spread
from tinyscale.comm.job import Job, check_job, run_job
from tinyscale.comm.step_stats import RANK_METRICS, StepStats, log_line
from tinyscale.core.checkpoint import (
    checkpoint_name,
    load_checkpoint,
    remove_stale_temps,
    restore_training_state,
    training_state,
)
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.data import LMData, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError
from tinyscale.core.metrics import Mirror
from tinyscale.core.model import TinyTransformer
from tinyscale.core.outputs import check_writable
from tinyscale.core.precision import autocast_context, make_scaler
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, lr_at, make_optimizer, seed_everything
from tinyscale.data_parallel.ddp_training import (
    BatchSplit,
    evaluate_sharded,
    make_sampler,
    parameter_fingerprint,
    rank_batches,
    rank_step_plan,
    save_replicated,
    tokens_per_second,
)
from tinyscale.workflows.shard_loader import SHARDS_NOTE, lab_datasets
from tinyscale.workflows.wandb_log import wandb_run, wandb_setup

# Lab 1's flags, with Lab 2's defaults; the flags of the failure drills are Lab 2's own
DEFAULTS = TrainConfig(epochs=1, global_batch_size=32, checkpoint_every=50, output_dir="runs/ddp")
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "grad_accum_steps", "lr",
         "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip", "seed", "precision",
         "device", "log_every", "checkpoint_every", "max_steps", "resume", "output_dir",
         "log_dir", "timeout_s", "wandb")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    notes = {"device": "auto picks one GPU per rank, or the CPU", "corpus": SHARDS_NOTE}
    add_flags(p, DEFAULTS, FLAGS, notes=notes)
    p.add_argument("--fail-rank", type=int, default=None, help="this rank raises ...")
    p.add_argument("--fail-step", type=int, default=None, help="... at this step (1st attempt)")
    p.add_argument("--hang-rank", type=int, default=None, help="this rank skips a collective ...")
    p.add_argument("--hang-step", type=int, default=None, help="... at this step")
    p.add_argument("--wandb-every-rank", action="store_true", help="with --wandb: a run per rank")
    args = p.parse_args(argv)
    args.cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    return args


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run(Job):
    """The job (env, device, model_cfg, cfg, checkpoint) and what Lab 2 checks besides."""

    split: BatchSplit
    resume: dict[str, Any] | None  # the checkpoint, loaded
    args: argparse.Namespace


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad input is a one-line UsageError here, the same on every rank, before any
    rank joins or writes: no rank is left waiting for a peer that will never come."""
    job = check_job(args.cfg)  # the launcher's environment, device, folders, model, --resume
    cfg, env = job.cfg, job.env
    check_writable(cfg.output_dir, "--output-dir", "summary.json", file=True)  # at the end
    autocast_context(job.device, cfg.precision)  # fp16 on a CPU: a one-line error
    for flag in ("fail", "hang"):
        rank, step = getattr(args, f"{flag}_rank"), getattr(args, f"{flag}_step")
        if (rank is None) != (step is None):
            raise UsageError(f"--{flag}-rank and --{flag}-step go together: give both or neither")
        if rank is not None and not 0 <= rank < env.world_size:
            raise UsageError(
                f"--{flag}-rank {rank} is outside the world: ranks are 0..{env.world_size - 1}"
            )
        if step is not None and step < 1:  # 0 or less would never fire
            raise UsageError(f"--{flag}-step {step} never comes: steps count from 1, give one >= 1")
    if args.wandb_every_rank and cfg.wandb is None:
        raise UsageError("--wandb-every-rank needs --wandb offline or --wandb online")
    split = BatchSplit(global_batch_size=cfg.global_batch_size,
                       grad_accum_steps=cfg.grad_accum_steps, world_size=env.world_size)  # fmt: skip
    resume = load_checkpoint(job.checkpoint, expect=job.model_cfg) if job.checkpoint else None
    if resume is not None and resume["world_size"] != env.world_size:
        raise UsageError(
            f"checkpoint {job.checkpoint} was written by {resume['world_size']} ranks, this run "
            f"has {env.world_size}: relaunch with --nproc_per_node={resume['world_size']}"
        )
    return Run(**vars(job), split=split, resume=resume, args=args)


# --8<-- [end:check]


# --8<-- [start:setup]
def train(run: Run, data: LMData, tracker: Mirror | None = None) -> dict[str, Any]:
    """The Lab 1 loop, distributed: the same steps, each on a shard of the global batch.

    Every step is Lab 1's (``tinyscale.core.step.train_step``), given what DDP changes: its
    forward, this rank's micro-batches, and ``no_sync()`` on all but the last.

    ``tracker``, a W&B run (--wandb), gets each step's numbers as this rank sees them.
    """
    env, device, cfg, split, args = run.env, run.device, run.cfg, run.split, run.args
    log = rank_logger(env, cfg.log_dir)
    seed_everything(cfg.seed)  # every rank builds the same initial weights ...
    model = TinyTransformer(run.model_cfg).to(device)
    # ... and DDP broadcasts rank 0's anyway. It all-reduces gradients during backward.
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    torch.manual_seed(cfg.seed + 1 + env.rank)  # but each rank draws its own dropout masks
    optimizer = make_optimizer(model, cfg)
    scaler = make_scaler(device, cfg.precision)
    sampler = make_sampler(data.train, env, split, seed=cfg.seed)
    plan = rank_step_plan(sampler, run.split, run.cfg)
    step = 0
    if run.resume is not None:  # every rank loads the same file, then its own RNG state
        step = restore_training_state(
            run.resume, model, optimizer, device=device, scaler=scaler, rank=env.rank
        )
        log.info(f"resumed from step {step}")
    if env.is_main:  # the one writer of this run's checkpoints (save_replicated)
        remove_stale_temps(Path(cfg.output_dir, "checkpoints"))
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log.info(
        f"{env.launcher} | backend {dist.get_backend()} | device {device} | restart {restarts} | "
        f"global batch {split.global_batch_size} = micro {split.micro_batch_size} x accum "
        f"{split.grad_accum_steps} x world {env.world_size} | {len(sampler)} samples on this rank"
    )
    # --8<-- [end:setup]

    # --8<-- [start:loop]
    tokens_seen, seconds, own_losses, last_global = 0, 0.0, [], float("nan")
    for _, indices in plan.batches(step, lambda epoch: rank_batches(sampler, split, epoch)):
        if step + 1 == args.fail_step and env.rank == args.fail_rank and restarts == 0:
            raise RuntimeError(f"injected failure on rank {env.rank} at step {step + 1}")
        t0 = time.perf_counter()
        x, y = get_batch(data.train, indices, device)  # (micro x accum, T) each
        lr = lr_at(step, cfg, plan.total_steps)
        micro = split.micro_batch_size
        result = train_step(
            loss_fn=lambda inputs, targets: ddp(inputs, targets)[1],  # DDP's forward
            micro_batches=zip(x.split(micro), y.split(micro), strict=True),
            accumulation_steps=split.grad_accum_steps,
            # DDP all-reduces in every backward; no_sync() skips that but on the last
            # micro-batch, whose backward all-reduces the sum: once per step
            sync=lambda last: contextlib.nullcontext() if last else ddp.no_sync(),
            optimizer=optimizer,
            lr=lr,
            # mixed precision: autocast around every forward; with fp16, the scaler
            # scales each loss and unscales the gradients before they are clipped
            autocast=lambda: autocast_context(device, cfg.precision),
            scaler=scaler,
            max_norm=cfg.grad_clip,
            clip_params=model.parameters(),
        )  # after the backward passes, p.grad is the same on every rank: their average
        loss = result.loss  # this rank's: the mean over its micro-batches
        step += 1
        stats = StepStats(step=step, loss=loss, samples=len(indices), tokens=x.numel(),
                          seconds=time.perf_counter() - t0, inputs=x)  # fmt: skip
        tokens_seen, seconds = tokens_seen + stats.tokens, seconds + stats.seconds
        own_losses.append(loss)
        global_loss = torch.tensor([loss], dtype=torch.float64, device=device)
        if not (step == args.hang_step and env.rank == args.hang_rank):  # the hang lab
            dist.all_reduce(global_loss)  # SUM, only for the log: the mean over ranks
        last_global = global_loss.item() / env.world_size
        sync = rank_spread(parameter_fingerprint(model).to(device))  # 0.0: all in sync
        if sync != 0.0:
            raise RuntimeError(f"parameters diverged across ranks at step {step}: {sync}")
        if step % cfg.log_every == 0 or step == plan.stop_at:
            log.info(log_line(stats, plan.total_steps, last_global, sync))
        if tracker is not None:  # every step: this rank's loss and speed, the job's loss
            values = dict(loss=loss, global_loss=last_global, lr=lr, grad_norm=result.grad_norm)
            values |= {name: fn(stats) for name, fn in RANK_METRICS.items()}
            tracker.log({f"train/{k}": v for k, v in values.items()}, step=step)
        if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
            state = training_state(model=model, optimizer=optimizer, cfg=cfg, step=step,
                                   epoch=step // plan.steps_per_epoch, device=device,
                                   scaler=scaler)  # fmt: skip
            path = Path(cfg.output_dir) / "checkpoints" / f"{checkpoint_name(step)}.pt"
            save_replicated(state, path, env, device)  # with every rank's RNG state
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
        "world_size": env.world_size, "steps": step, "global_batch_size": split.global_batch_size,
        "micro_batch_size": split.micro_batch_size, "grad_accum_steps": split.grad_accum_steps,
        "final_loss": last_global, "heldout_loss": heldout,
        # the slowest rank sets the pace: every step waits for it in the all-reduce
        "tokens_per_second": tokens_per_second(sum(r["tokens"] for r in per_rank),
                                               max(r["seconds"] for r in per_rank)),
        "per_rank": per_rank,
    }  # fmt: skip
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
    data = lab_datasets(  # with --corpus shards:DIR, each rank reads only its blocks
        corpus=run.cfg.corpus,
        vocab_size=run.model_cfg.vocab_size,
        block_size=run.model_cfg.max_position_embeddings,
    )
    sampler = make_sampler(data.train, run.env, run.split, seed=run.cfg.seed)  # enough data?
    if run.resume is not None:  # and steps left to train?
        rank_step_plan(sampler, run.split, run.cfg).check_steps_left(run.resume["step"])
    setup = wandb_setup(run.cfg.wandb, run.cfg.output_dir, rank=run.env.rank,
                        every_rank=run.args.wandb_every_rank)  # fmt: skip
    config = dataclasses.asdict(run.cfg) | {"rank": run.env.rank, "world_size": run.env.world_size}
    with (
        distributed(run.cfg.device, timeout_s=run.cfg.timeout_s),  # joins, always leaves
        wandb_run(setup, config=config) as tracker,  # None without --wandb
    ):
        train(run, data, tracker)
    return 0


if __name__ == "__main__":  # run_job: @record around run_cli, for torchrun's report
    exit_without_teardown(run_job(main))  # a finished run must not die in the teardown
# --8<-- [end:main]

# --8<-- [start:args]
"""Lab 2's model, data and schedule, trained by DeepSpeed's ZeRO engine instead of DDP.

Launch:  torchrun --nproc-per-node 2 code/scripts/deepspeed_train.py \
             --deepspeed-config code/config/deepspeed/zero2.json --precision fp32
GPUs:    deepspeed --num_gpus 8 code/scripts/deepspeed_train.py \
             --deepspeed-config code/config/deepspeed/zero3.json
Cluster: deepspeed --hostfile code/config/hostfile.example code/scripts/deepspeed_train.py \
             --deepspeed-config code/config/deepspeed/zero3_offload.json

Both launchers start one process per GPU (or, on a laptop, per CPU slot) and set RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the `deepspeed` launcher also passes
--local_rank. The JSON file says what ZeRO partitions, in which precision, with which
batch; this script brings the model, the data and the learning-rate schedule.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tinyscale.comm.dist import dist_env, distributed, rank_logger
from tinyscale.comm.job import Job, check_job
from tinyscale.compat.deepspeed_checkpoint import (
    check_resume,
    latest_tag,
    load_deepspeed,
    save_deepspeed,
)
from tinyscale.compat.deepspeed_config import (
    batch_sizes,
    load_ds_config,
    offloads,
    precision_of,
    zero_stage,
)
from tinyscale.compat.deepspeed_costs import engine_state_bytes
from tinyscale.compat.deepspeed_engine import build_engine, quiet_deepspeed
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.data import LMData, build_datasets, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.memory import human_bytes
from tinyscale.core.metrics import MetricsLogger, read_metrics
from tinyscale.core.outputs import check_writable
from tinyscale.core.training import (
    TrainConfig,
)
from tinyscale.data_parallel.ddp_training import (
    BatchSplit,
    make_sampler,
    rank_batches,
    rank_step_plan,
    tokens_per_second,
)

# Lab 2's flags and defaults; the batch and the clipping come from the DeepSpeed JSON
DEFAULTS = TrainConfig(epochs=1, checkpoint_every=50, precision=None, output_dir="runs/deepspeed",
                       log_dir="logs/deepspeed")  # fmt: skip
FLAGS = ("config", "corpus", "epochs", "lr", "warmup_steps", "min_lr_ratio", "weight_decay",
         "seed", "precision", "device", "log_every", "checkpoint_every", "max_steps", "resume",
         "output_dir", "log_dir", "timeout_s")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deepspeed-config", required=True, help="a JSON in code/config/deepspeed/")
    add_flags(p, DEFAULTS, FLAGS, notes={
        "precision": "default: what the JSON says",
        "resume": "a checkpoint folder here",
    })  # fmt: skip
    p.add_argument("--dropout", type=float, default=None, help="override the model's dropout")
    # the `deepspeed` launcher appends --local_rank=N; LOCAL_RANK in the environment says the same
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run(Job):
    """The job (env, device, model_cfg, cfg, checkpoint) and what DeepSpeed adds."""

    ds_config: dict[str, Any]
    split: BatchSplit
    resume_step: int  # the checkpoint's step, 0 without one
    args: argparse.Namespace


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad input is a one-line UsageError on every rank alike, before any rank joins."""
    env = dist_env()
    ds_config = load_ds_config(args.deepspeed_config, precision=args.precision)
    micro, accum, global_batch = batch_sizes(ds_config, env.world_size)
    # the JSON's batch is the run's: Lab 2's schedule and data order follow from it
    cfg = from_args(DEFAULTS, args)
    cfg = dataclasses.replace(cfg, global_batch_size=global_batch, grad_accum_steps=accum)
    job = check_job(cfg, env=env, dropout=args.dropout, newest=latest_tag)
    for name, file in (("metrics.jsonl", True), ("tensorboard", False), ("summary.json", True)):
        check_writable(cfg.output_dir, "--output-dir", name, file=file)  # rank 0 writes them
    if precision_of(ds_config) == "fp16" and job.device.type == "cpu":
        raise UsageError("fp16 training needs a GPU: on a CPU use --precision bf16 or fp32")
    split = BatchSplit(
        global_batch_size=global_batch, grad_accum_steps=accum, world_size=env.world_size
    )
    assert split.micro_batch_size == micro
    saved = check_resume(job.checkpoint, output_dir=cfg.output_dir, world_size=env.world_size,
                         ds_config=ds_config)  # fmt: skip
    return Run(**vars(job), ds_config=ds_config, split=split,
               resume_step=saved["step"] if saved else 0, args=args)  # fmt: skip


# --8<-- [end:check]


# --8<-- [start:loop]
def train(run: Run, data: LMData) -> dict[str, Any]:
    env, device, cfg, split = run.env, run.device, run.cfg, run.split
    log = rank_logger(env, cfg.log_dir)
    sampler = make_sampler(data.train, env, split, seed=cfg.seed)
    plan = rank_step_plan(sampler, run.split, run.cfg)
    engine = build_engine(run.cfg, run.model_cfg, run.ds_config, total_steps=plan.total_steps)
    torch.manual_seed(cfg.seed + 1 + env.rank)  # each rank its own dropout masks, as in Lab 2
    step = resume_step = 0
    if run.checkpoint is not None:  # weights, optimizer shards, lr schedule, this rank's RNG
        step = resume_step = load_deepspeed(engine, run.checkpoint, device=device)
    if step:
        log.info(f"resumed from {run.checkpoint} at step {step}")
    log.info(
        f"DeepSpeed {engine.__class__.__name__} | ZeRO-{zero_stage(run.ds_config)} | "
        f"{precision_of(run.ds_config)} | offload {', '.join(offloads(run.ds_config)) or 'none'}"
        f" | backend {dist.get_backend()} | device {device} | world {env.world_size}"
    )
    log.info(
        f"global batch {engine.train_batch_size()} = micro {split.micro_batch_size} x accum "
        f"{split.grad_accum_steps} x world {env.world_size} | {plan.steps_per_epoch} steps per"
        " epoch"
    )
    metrics = None
    if env.is_main:  # on resume, keep the records up to the checkpoint's step, drop the rest
        old = Path(cfg.output_dir, "metrics.jsonl")
        history = read_metrics(old) if step and old.is_file() else None
        metrics = MetricsLogger(Path(cfg.output_dir), history=history, resume_step=step)
    tokens, seconds, loss_now = 0, 0.0, math.nan
    for _, indices in plan.batches(step, lambda epoch: rank_batches(sampler, split, epoch)):
        t0 = time.perf_counter()
        x, y = get_batch(data.train, indices, device)  # (micro x accum, T) each
        lr = engine.get_lr()[0]  # what this step uses: the schedule at `step`
        losses = []
        micro = zip(x.split(split.micro_batch_size), y.split(split.micro_batch_size), strict=True)
        for xm, ym in micro:
            _, loss = engine(xm, ym)
            engine.backward(loss)  # scales by 1/accum; ZeRO reduces (and partitions) grads
            engine.step()  # clips, steps and zeroes only at the accumulation boundary
            losses.append(loss.item())
        step += 1
        seconds += time.perf_counter() - t0
        tokens += x.numel()
        mean = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64, device=device)
        dist.all_reduce(mean)  # SUM over ranks, for the log: the loss of the global batch
        loss_now = mean.item() / env.world_size
        if metrics is not None:
            metrics.log(step, "train", loss=loss_now, lr=lr)
        if step == resume_step + 1:
            held = engine_state_bytes(engine)  # after a step: Adam's moments exist now
            log.info(
                f"this rank holds weights {human_bytes(held.params)} + optimizer state "
                f"{human_bytes(held.optimizer)}"
            )
        if step % cfg.log_every == 0 or step == plan.stop_at:
            log.info(f"step {step:4d}/{plan.total_steps} | loss {loss_now:.4f} | lr {lr:.2e}")
        if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
            if metrics is not None:
                metrics.flush()
            path = save_deepspeed(engine, Path(cfg.output_dir, "checkpoints"), step=step,
                                  device=device, ds_config=run.ds_config,
                                  config_path=run.args.deepspeed_config)  # fmt: skip
            log.info(f"saved {path}")
    # --8<-- [end:loop]

    # --8<-- [start:summary]
    if metrics is not None:
        metrics.close()
    summary = {
        "steps": step,
        "final_loss": loss_now,
        "world_size": env.world_size,
        "zero_stage": zero_stage(run.ds_config),
        "precision": precision_of(run.ds_config),
        "global_batch_size": engine.train_batch_size(),
        "tokens_per_second": tokens_per_second(tokens * env.world_size, seconds),
    }
    if env.is_main:
        Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
        log.info(
            f"summary: {step} steps | final loss {loss_now:.4f} | "
            f"{summary['tokens_per_second']:,.0f} tokens/s over {env.world_size} ranks"
        )
    engine.destroy()
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    run = check_inputs(parse_args(argv))  # all checks first: a bad flag fails every rank alike
    if run.device.type == "cpu":  # before DeepSpeed's import: on a Mac it would pick MPS
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    data = build_datasets(
        corpus=run.cfg.corpus,
        vocab_size=run.model_cfg.vocab_size,
        block_size=run.model_cfg.max_position_embeddings,
    )
    sampler = make_sampler(data.train, run.env, run.split, seed=run.cfg.seed)  # enough data?
    rank_step_plan(sampler, run.split, run.cfg).check_steps_left(run.resume_step)
    with distributed(run.cfg.device, timeout_s=run.cfg.timeout_s), quiet_deepspeed():
        train(run, data)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:summary]

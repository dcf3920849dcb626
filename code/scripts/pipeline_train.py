# --8<-- [start:args]
"""Week 3: the Lab model trained by a pipeline of processes (torch.distributed.pipelining).

Launch:  torchrun --standalone --nproc-per-node 2 code/scripts/pipeline_train.py \
             --pp 2 --microbatches 4 --schedule 1f1b
Resume:  the same command with --resume auto (the newest complete checkpoint)
PP x DP: torchrun --standalone --nproc-per-node 4 code/scripts/pipeline_train.py --pp 2
GPUs:    torchrun --nproc-per-node 8 code/scripts/pipeline_train.py --pp 2 --global-batch-size 64

The world is a pp x dp grid (a ParallelLayout): dp pipelines of pp ranks each. Every
pipeline runs the whole model on its share of the global batch, cut into pp (or 2 pp)
stages; the dp copies of a stage average their gradients, as DDP would. Each rank saves its own stages
in a checkpoint directory whose manifest rank 0 writes last.
"""

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tinyscale.comm.dist import rank_logger
from tinyscale.comm.job import Job, check_job, run_job, training_main
from tinyscale.comm.parallel_layout import ParallelLayout, add_layout_flags
from tinyscale.core.checkpoint import remove_stale_temps, restore_training_state, training_state
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import ModelConfig
from tinyscale.core.data import LMData, epoch_batches, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError
from tinyscale.core.model import ModelStage, TinyTransformer
from tinyscale.core.step import train_step
from tinyscale.core.training import (
    StepPlan,
    TrainConfig,
    lr_at,
    make_optimizer,
    seed_everything,
)
from tinyscale.data_parallel.ranked_checkpoint import load_ranked, save_ranked
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.pipeline_parallel.torch_pipeline import (
    SCHEDULES,
    build_schedule,
    check_schedule,
    clip_grad_norm,
    held_parameters,
    last_stage_rank,
    stage_placement,
    sync_tied_embedding,
)

DEFAULTS = TrainConfig(
    epochs=1, global_batch_size=16, checkpoint_every=50, output_dir="runs/pipeline"
)
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "lr", "warmup_steps", "min_lr_ratio",
         "weight_decay", "grad_clip", "seed", "device", "log_every", "checkpoint_every",
         "max_steps", "resume", "output_dir", "log_dir", "timeout_s")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS, notes={"device": "auto picks one GPU per rank, or the CPU"})
    add_layout_flags(p, ("pp",), pp=2)  # --pp; --dp takes the ranks that are left
    p.add_argument("--microbatches", type=int, default=4, help="per pipeline and step")
    p.add_argument("--schedule", default="1f1b", help=f"one of {', '.join(SCHEDULES)}")
    args = p.parse_args(argv)
    args.cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    return args


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run(Job):
    """The job (env, device, model_cfg, cfg, checkpoint) and the pipeline's own inputs."""

    layout: ParallelLayout  # pp x dp_replicate
    microbatches: int
    schedule: str
    blocks: list[list[int]]  # the blocks of every pipeline stage, in order
    stages: list[int]  # the pipeline stages this rank runs
    resume: dict[str, Any] | None  # this rank's file of the checkpoint, loaded


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad flag fails here, the same way on every rank, before anything is written."""
    job = check_job(args.cfg)  # the launcher's environment, device, folders, model, --resume
    cfg, env, model_cfg = job.cfg, job.env, job.model_cfg
    _, per_rank = check_schedule(args.schedule)
    layout = ParallelLayout.filling(env.world_size, "dp_replicate", pp=args.pp)
    dp = layout.dp_replicate  # pipelines side by side
    stages = args.pp * per_rank
    if stages > model_cfg.num_hidden_layers:
        raise UsageError(
            f"--pp {args.pp} with --schedule {args.schedule} makes {stages} stages but the "
            f"model has {model_cfg.num_hidden_layers} blocks: lower --pp, or use a --config "
            "with more num_hidden_layers"
        )
    if args.microbatches < 1:
        raise UsageError(f"--microbatches must be a whole number >= 1, got {args.microbatches}")
    batch = cfg.global_batch_size // dp  # each pipeline's share
    if cfg.global_batch_size % dp or batch % args.microbatches:
        raise UsageError(
            f"--microbatches {args.microbatches} does not divide the {batch} samples each of "
            f"the {dp} pipelines gets (--global-batch-size {cfg.global_batch_size} / dp {dp})"
        )
    blocks = [list(r) for r in split_layers(model_cfg.num_hidden_layers, stages)]
    mine = stage_placement(args.schedule, rank=layout.coordinate(env.rank)["pp"], pp=args.pp)
    path = job.checkpoint
    resume = (  # every file whole (the manifest's sizes, mine its sha256), and this model's
        load_ranked(path, rank=env.rank, world_size=env.world_size, expect=model_cfg)
        if path else None
    )  # fmt: skip
    if resume is not None and (resume["layout"], resume["stages"]) != (blocks, mine):
        raise UsageError(
            f"checkpoint {path} was cut by --pp {resume['pp']} --schedule {resume['schedule']}, "
            f"not as --pp {args.pp} --schedule {args.schedule}: relaunch with its flags"
        )
    return Run(**vars(job), layout=layout, microbatches=args.microbatches,
               schedule=args.schedule, blocks=blocks, stages=mine, resume=resume)  # fmt: skip


# --8<-- [end:check]


# --8<-- [start:setup]
class LocalStages(nn.ModuleList):
    """This rank's pipeline stages as one module: what its optimizer and checkpoint hold."""

    def __init__(self, stages: Sequence[nn.Module], cfg: ModelConfig) -> None:
        super().__init__(stages)
        self.cfg = cfg  # training_state records the model's shape


def train(run: Run, data: LMData, plan: StepPlan) -> None:
    env, cfg, device, layout = run.env, run.cfg, run.device, run.layout
    # rank = stage * dp + replica (the layout's order, pp outermost): a pipeline's ranks
    # are dp apart, the copies of a stage are neighbours. On a cluster, the heavy gradient
    # all-reduce stays inside a node, the light activations of a stage boundary cross the
    # network. Every group gets --timeout-s: a stopped rank fails its partners, not hangs.
    parallel = layout.build(device_type=device.type, timeout_s=cfg.timeout_s)
    pp_group, dp_group = parallel.group("pp"), parallel.group("dp_replicate")
    stage_rank, replica = layout.coordinate(env.rank)["pp"], layout.data_rank(env.rank)
    log = rank_logger(env, cfg.log_dir)
    seed_everything(cfg.seed)  # every rank builds the same whole model, then keeps its stages
    model = TinyTransformer(run.model_cfg).to(device)
    torch.manual_seed(cfg.seed + 1 + env.rank)  # each rank draws its own dropout masks
    runner, mine = build_schedule(model, schedule=run.schedule, microbatches=run.microbatches,
                                  group=pp_group, device=device)  # fmt: skip
    local = LocalStages(mine, run.model_cfg)
    optimizer = make_optimizer(local, cfg)
    last = last_stage_rank(run.schedule, layout.pp)
    pipelines = layout.groups("pp")  # each pipeline's ranks, in stage order
    # Each pipeline's first and last stage sum the tied embedding's gradients (a V has
    # both on rank 0: no group). Every rank creates every pair's group, with the timeout.
    tied = None if last == 0 else parallel.subgroup([[p[0], p[last]] for p in pipelines])
    step = 0
    if run.resume is not None:  # this rank's own file: its stages, optimizer and RNG
        step = restore_training_state(run.resume, local, optimizer, device=device)
        log.info(f"resumed from step {step}")
    if env.is_main:
        remove_stale_temps(Path(cfg.output_dir, "checkpoints"))
    held: list[Any] = [None] * env.world_size
    dist.all_gather_object(held, run.stages)
    ranks = ", ".join(str(p[last]) for p in pipelines)  # the last stage's
    micro = cfg.global_batch_size // layout.dp_replicate // run.microbatches
    log.info(f"pp {layout.pp} x dp {layout.dp_replicate} | {run.schedule} | {run.microbatches} "
             f"micro-batches of {micro} | loss on rank {ranks}")  # fmt: skip
    for r, stages in enumerate(held):
        log.info(f"rank {r}: " + ", ".join(f"stage {s} = blocks {run.blocks[s]}" for s in stages))
    # --8<-- [end:setup]

    # --8<-- [start:loop]
    params = held_parameters(mine)
    per_pipeline = cfg.global_batch_size // layout.dp_replicate

    def run_schedule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Every micro-batch's forward and backward, in the schedule's order; their losses."""
        losses: list[torch.Tensor] = []  # filled on the last stage's rank only
        inputs = (x,) if 0 in run.stages else ()  # the first stage's rank feeds the tokens
        runner.step(*inputs, target=y, losses=losses)
        return torch.stack(losses).sum() if losses else torch.zeros((), device=device)

    def after_backward(loss: torch.Tensor) -> None:  # the schedule has run every backward
        sync_tied_embedding(model, tied)  # embedding + head gradients, on both ranks
        if layout.dp_replicate > 1:  # plain data parallel across the pipelines: average
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad.div_(layout.dp_replicate)

    def clip_pipeline(stages: list[ModelStage], max_norm: float) -> float:
        """clip_grad_norm_ over every stage of the pipeline: the norm of them all."""
        return clip_grad_norm(stages, max_norm, group=pp_group, tied_copy=stage_rank == last != 0)

    def order(epoch: int) -> list[list[int]]:  # this epoch's batches: seed and epoch
        return epoch_batches(len(data.train), cfg.global_batch_size, seed=cfg.seed, epoch=epoch)

    for epoch, indices in plan.batches(step, order):
        t0 = time.perf_counter()
        mine_idx = indices[replica * per_pipeline : (replica + 1) * per_pipeline]
        x, y = get_batch(data.train, mine_idx, device)  # (B/dp, T) each
        result = train_step(  # Lab 1's step, given what the pipeline changes
            loss_fn=run_schedule,
            micro_batches=[(x, y)],  # the schedule cuts it into --microbatches
            backward=after_backward,
            optimizer=optimizer,
            lr=lr_at(step, cfg, plan.total_steps),
            max_norm=cfg.grad_clip,
            clip_params=mine,
            clip_fn=clip_pipeline,
        )
        step += 1
        if step % cfg.log_every == 0 or step == plan.stop_at:
            loss = torch.tensor(result.loss, device=device)  # 0 off the last stage
            dist.all_reduce(loss)  # only the dp last-stage ranks add: / dp is the mean
            seconds = time.perf_counter() - t0
            speed = cfg.global_batch_size * x.shape[1] / seconds  # all pipelines' tokens
            mean = loss.item() / layout.dp_replicate
            log.info(f"step {step:4d}/{plan.total_steps} | loss {mean:.4f} "
                     f"| {speed:,.0f} tokens/s")  # fmt: skip
        if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
            state = training_state(model=local, optimizer=optimizer, cfg=cfg, step=step,
                                   epoch=epoch, device=device, pp=layout.pp, stages=run.stages,
                                   schedule=run.schedule, layout=run.blocks)  # fmt: skip
            path = save_ranked(state, Path(cfg.output_dir, "checkpoints"), step=step)
            log.info(f"saved {path}")


# --8<-- [end:loop]


# --8<-- [start:main]
main = training_main(parse_args, check_inputs, train)  # check, plan, join, train, leave


if __name__ == "__main__":
    sys.exit(run_job(main))  # run_cli under torchrun's @record (tinyscale.comm.job)
# --8<-- [end:main]

# --8<-- [start:args]
"""Week 4: the Lab model trained on any parallel shape, checkpointed in DCP, resumed on another.

Launch:  torchrun --standalone --nproc-per-node 4 code/scripts/parallel_train.py --fsdp 2 --tp 2
Resume:  the same command with --resume auto, on this shape or another (--dp 4, --pp 2 --dp 2)
GPUs:    torchrun --nnodes 8 --nproc-per-node 8 ... parallel_train.py --fsdp 8 --tp 8

The world is a 4-D grid, pp x dp x fsdp x tp = the number of processes (a ParallelLayout,
one DeviceMesh): tensor parallelism (DTensor, sequence parallel on) inside each pipeline
stage, FSDP2 over the data-parallel ranks (HSDP: shard over fsdp, replicate over dp), and
torch's 1F1B pipeline schedule over pp. A checkpoint is one DCP directory whatever the
shape: every tensor is saved under its name in the model, in the model's own layout, so a
run saved on one shape resumes on any other.
"""

import argparse
import dataclasses
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tinyscale.comm.dist import rank_logger
from tinyscale.comm.job import Job, check_job, run_job, training_main
from tinyscale.comm.parallel_layout import AXES, ParallelLayout, ParallelMesh, add_layout_flags
from tinyscale.composed.parallelize import StageStep, parallelize
from tinyscale.composed.shape_checkpoint import load_any_shape, read_training_state, save_any_shape
from tinyscale.core.checkpoint import remove_stale_temps
from tinyscale.core.cli import add_flags, from_args
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
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.tensor_parallel.tp_model import check_tensor_parallel_size

# Gathering a 2-D sharded qkv for the checkpoint takes two all-gathers; torch warns each time.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
# The TP head's logits are a view; FSDP2 warns against in-place ops on it, and we do none.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
COMPOSED = tuple(a for a in AXES if a != "cp")  # every axis of the layout but context
DEFAULTS = TrainConfig(epochs=1, global_batch_size=16, checkpoint_every=50, log_every=1,
                       output_dir="runs/shape")  # fmt: skip
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "lr", "warmup_steps", "min_lr_ratio",
         "weight_decay", "grad_clip", "seed", "device", "log_every", "checkpoint_every", "max_steps",
         "resume", "output_dir", "log_dir", "timeout_s")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS, notes={"device": "auto picks one GPU per rank, or the CPU"})
    add_layout_flags(p, COMPOSED)  # --pp --dp --fsdp --tp
    p.add_argument("--microbatches", type=int, default=2, help="per pipeline step (--pp > 1)")
    p.add_argument("--dropout", type=float, default=None, help="override the config's dropout")
    args = p.parse_args(argv)
    args.cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    return args


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run(Job):
    """The job (env, device, model_cfg, cfg, checkpoint) and its parallel shape."""

    layout: ParallelLayout  # pp x dp_replicate x dp_shard x tp
    microbatches: int
    resume: dict[str, Any] | None  # the checkpoint's training state: step, shape, RNG states


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad flag fails here, the same way on every rank, before anything is written."""
    job = check_job(args.cfg, dropout=args.dropout)  # environment, folders, model, --resume
    cfg, model_cfg = job.cfg, job.model_cfg
    layout = ParallelLayout.from_args(args, COMPOSED)  # each degree a whole number >= 1
    layout.validate(job.env.world_size)  # and their product the number of processes
    check_tensor_parallel_size(model_cfg, layout.tp)  # heads and widths divide by tp
    split_layers(model_cfg.num_hidden_layers, layout.pp)  # at most one stage per block
    copies = layout.data_parallel  # dp x fsdp: the ranks that see different data
    per_copy = cfg.global_batch_size // copies
    if args.microbatches < 1:
        raise UsageError(f"--microbatches must be a whole number >= 1, got {args.microbatches}")
    micro = args.microbatches if layout.pp > 1 else 1
    if cfg.global_batch_size % copies or per_copy % micro:
        raise UsageError(
            f"--global-batch-size {cfg.global_batch_size} does not split into dp x fsdp = "
            f"{copies} copies of {micro} equal micro-batches: pick a multiple of {copies * micro}"
        )
    if model_cfg.max_position_embeddings % layout.tp:
        raise UsageError(
            f"sequence parallelism cuts {model_cfg.max_position_embeddings} positions into "
            f"--tp {layout.tp} parts: pick a --tp that divides max_position_embeddings"
        )
    # whole (its manifest's sizes) and this model's, or one line; --resume auto chose a whole one
    path = job.checkpoint
    resume = read_training_state(path, expect=model_cfg) if path is not None else None
    return Run(**vars(job), layout=layout, microbatches=micro, resume=resume)


# --8<-- [end:check]


# --8<-- [start:build]
def build(run: Run, parallel: ParallelMesh) -> tuple[ModelStage, torch.optim.Optimizer]:
    """This rank's stage: cut from the whole model, split by tp, sharded over dp x fsdp."""
    seed_everything(run.cfg.seed)  # every rank builds the same whole model ...
    model = TinyTransformer(run.model_cfg).to(run.device)
    stage = parallelize(model, parallel, rank=run.env.rank)  # ... and keeps its stage
    del model  # the other stages' blocks are freed
    # The dp x fsdp copies draw different dropout masks; a tensor group draws the same ones
    layout, pp_rank = run.layout, run.layout.coordinate(run.env.rank)["pp"]
    torch.manual_seed(run.cfg.seed + 1 + layout.data_rank(run.env.rank) + 1000 * pp_rank)
    optimizer = make_optimizer(stage, run.cfg)
    for group in optimizer.param_groups:
        group["foreach"] = False  # parameters on different meshes (or none) in one group
    return stage, optimizer


# --8<-- [end:build]


# --8<-- [start:loop]
def local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if isinstance(t, DTensor) else t.numel()


def train(run: Run, data: LMData, plan: StepPlan) -> None:
    env, cfg, layout = run.env, run.cfg, run.layout
    parallel = layout.build(device_type=run.device.type, timeout_s=cfg.timeout_s)  # every group
    log = rank_logger(env, cfg.log_dir)
    stage, optimizer = build(run, parallel)
    copy, copies = layout.data_rank(env.rank), layout.data_parallel
    composed = StageStep.build(stage, parallel, rank=env.rank, microbatches=run.microbatches,
                               device=run.device)  # fmt: skip
    step, shape = 0, layout.by_flag(COMPOSED)
    if run.checkpoint is not None:  # saved on any shape: DCP hands this rank its pieces
        step = load_any_shape(stage, optimizer, run.checkpoint, state=run.resume, tp=layout.tp,
                              shape=shape, device=run.device)  # fmt: skip
        log.info(f"resumed from step {step}, saved by {run.resume['shape']}")
    checkpoints = Path(cfg.output_dir, "checkpoints")
    if env.is_main:  # what a killed save left: temp files, step folders without a manifest
        remove_stale_temps(checkpoints)

    whole = sum(p.numel() for p in stage.parameters())  # a DTensor's numel is the whole's
    held = sum(local_numel(p) for p in stage.parameters())
    log.info(" x ".join(f"{a} {n}" for a, n in layout.by_flag(COMPOSED).items())
             + f" | this rank holds {held:,} of its stage's {whole:,} parameters")  # fmt: skip

    def order(epoch: int) -> list[list[int]]:  # this epoch's batches: seed and epoch
        return epoch_batches(len(data.train), cfg.global_batch_size, seed=cfg.seed, epoch=epoch)

    for epoch, indices in plan.batches(step, order):
        t0 = time.perf_counter()
        per_copy = cfg.global_batch_size // copies
        x, y = get_batch(data.train, indices[copy * per_copy : (copy + 1) * per_copy],
                         run.device)  # fmt: skip
        result = train_step(  # Lab 1's step, given what the shape changes
            loss_fn=composed.loss,
            micro_batches=[(x, y)],  # with --pp > 1 the schedule cuts it
            backward=composed.backward,
            optimizer=optimizer,
            lr=lr_at(step, cfg, plan.total_steps),
            max_norm=cfg.grad_clip,
            clip_params=stage,
            clip_fn=composed.clip,
        )
        step += 1
        mean = torch.tensor(result.loss, device=run.device)  # a last-stage rank: its copy's
        dist.all_reduce(mean)
        mean /= copies * layout.tp  # the tp ranks of a copy hold the same loss
        if step % cfg.log_every == 0 or step == plan.stop_at:
            speed = cfg.global_batch_size * x.shape[1] / (time.perf_counter() - t0)
            log.info(f"step {step:4d}/{plan.total_steps} | loss {mean.item():.4f} | "
                     f"grad norm {result.grad_norm:.3f} | {speed:,.0f} tokens/s")  # fmt: skip
        if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
            path = save_any_shape(stage, optimizer, checkpoints, step=step, epoch=epoch, cfg=cfg,
                                  tp=layout.tp, shape=shape, device=run.device)  # fmt: skip
            log.info(f"saved {path}")


# --8<-- [end:loop]


# --8<-- [start:main]
main = training_main(parse_args, check_inputs, train)  # check, plan, join, train, leave


if __name__ == "__main__":
    sys.exit(run_job(main))  # run_cli under torchrun's @record (tinyscale.comm.job)
# --8<-- [end:main]

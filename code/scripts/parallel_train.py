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
import functools
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor

from tinyscale.comm.dist import distributed, rank_logger
from tinyscale.comm.job import Job, check_job, run_job
from tinyscale.comm.parallel_layout import AXES, ParallelLayout, ParallelMesh, add_layout_flags
from tinyscale.composed.shape_checkpoint import SHAPE_FILE, load_any_shape, save_any_shape
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.data import build_datasets, epoch_batches, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError
from tinyscale.core.model import ModelStage, TinyTransformer
from tinyscale.core.step import train_step
from tinyscale.core.training import TrainConfig, lr_at, make_optimizer, plan_steps, seed_everything
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.pipeline_parallel.torch_pipeline import clip_sharded_grad_norm, microbatch_loss
from tinyscale.tensor_parallel.tp_model import check_tensor_parallel_size
from tinyscale.tensor_parallel.tp_stage import parallelize_stage, sum_tied_gradients

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
    if job.checkpoint is not None and not Path(job.checkpoint, ".metadata").is_file():
        raise UsageError(f"{job.checkpoint} is not a complete DCP checkpoint: resume from another")
    return Run(**vars(job), layout=layout, microbatches=micro)


# --8<-- [end:check]


# --8<-- [start:build]
def build(run: Run, parallel: ParallelMesh) -> tuple[ModelStage, torch.optim.Optimizer]:
    """This rank's stage: cut from the whole model, split by tp, sharded over dp x fsdp."""
    cfg, layout, mesh = run.model_cfg, run.layout, parallel.mesh
    seed_everything(run.cfg.seed)  # every rank builds the same whole model ...
    model = TinyTransformer(cfg).to(run.device)
    pp_rank = layout.coordinate(run.env.rank)["pp"]
    layers = split_layers(cfg.num_hidden_layers, layout.pp)[pp_rank]
    stage = ModelStage(model, layers=layers, first=pp_rank == 0, last=pp_rank == layout.pp - 1)
    del model  # ... and keeps its stage: the other blocks are freed
    if layout.tp > 1:
        parallelize_stage(stage, mesh["tp"])
    if layout.data_parallel > 1:  # FSDP2 on a 2-D mesh: HSDP, shard inner, copy outer
        data_mesh = mesh["dp_replicate", "dp_shard"]
        for block in stage.blocks.values():
            fully_shard(block, mesh=data_mesh)
        fully_shard(stage, mesh=data_mesh)
    # The dp x fsdp copies draw different dropout masks; a tensor group draws the same ones
    torch.manual_seed(run.cfg.seed + 1 + layout.data_rank(run.env.rank) + 1000 * pp_rank)
    optimizer = make_optimizer(stage, run.cfg)
    for group in optimizer.param_groups:
        group["foreach"] = False  # parameters on different meshes (or none) in one group
    return stage, optimizer


def tied_pairs(parallel: ParallelMesh, run: Run) -> dist.ProcessGroup | None:
    """With --pp > 1 and tied embeddings, the first and the last stage each hold the matrix:
    one group per pair of ranks at the same (dp, fsdp, tp) place sums their gradients."""
    if run.layout.pp == 1 or not run.model_cfg.tie_word_embeddings:
        return None
    return parallel.subgroup([[line[0], line[-1]] for line in run.layout.groups("pp")])


# --8<-- [end:build]


# --8<-- [start:loop]
def local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if isinstance(t, DTensor) else t.numel()


def train(run: Run, data, batches_per_epoch: int) -> None:
    env, cfg, layout = run.env, run.cfg, run.layout
    parallel = layout.build(device_type=run.device.type, timeout_s=cfg.timeout_s)  # every group
    log = rank_logger(env, cfg.log_dir)
    stage, optimizer = build(run, parallel)
    tied = tied_pairs(parallel, run)
    copy, copies = layout.data_rank(env.rank), layout.data_parallel
    schedule = None
    if layout.pp > 1:
        pp_stage = PipelineStage(stage, layout.coordinate(env.rank)["pp"], layout.pp,
                                 run.device, group=parallel.group("pp"))  # fmt: skip
        loss_fn = functools.partial(microbatch_loss, microbatches=run.microbatches)
        schedule = Schedule1F1B(pp_stage, n_microbatches=run.microbatches, loss_fn=loss_fn,
                                scale_grads=False)  # fmt: skip
    plan = plan_steps(batches_per_epoch, cfg, samples=len(data.train))
    step = 0
    if run.checkpoint is not None:  # saved on any shape: DCP hands this rank its pieces
        step = load_any_shape(stage, optimizer, run.checkpoint, cfg=run.model_cfg, tp=layout.tp)
        saved = json.loads(Path(run.checkpoint, SHAPE_FILE).read_text())
        log.info(f"resumed from step {step}, saved by {saved}")
    checkpoints = Path(cfg.output_dir, "checkpoints")

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of this copy's batch; with --pp > 1, the schedule's forwards and backwards."""
        if schedule is None:
            return TinyTransformer.loss(stage(x), y)
        losses: list[torch.Tensor] = []  # filled on the last stage only
        schedule.step(*((x,) if stage.first else ()), target=y, losses=losses)
        return torch.stack(losses).sum() if losses else torch.zeros((), device=run.device)

    def backward(loss: torch.Tensor) -> None:
        if schedule is None:  # with --pp > 1 the schedule has run every backward
            loss.backward()
        if tied is not None:  # the embedding's and the head's gradients, summed
            sum_tied_gradients(stage.tok_emb.weight if stage.first else stage.lm_head.weight,
                               tied)  # fmt: skip

    def clip(module: ModelStage, max_norm: float) -> float:  # the norm of every shard and stage
        pp_group = parallel.group("pp") if layout.pp > 1 else None
        return clip_sharded_grad_norm(module, max_norm, group=pp_group, tied_copy=layout.pp > 1)

    whole = sum(p.numel() for p in stage.parameters())  # a DTensor's numel is the whole's
    held = sum(local_numel(p) for p in stage.parameters())
    log.info(" x ".join(f"{a} {n}" for a, n in layout.by_flag(COMPOSED).items())
             + f" | this rank holds {held:,} of its stage's {whole:,} parameters")  # fmt: skip
    while step < plan.stop_at:
        epoch, batch_in_epoch = plan.position(step)
        order = epoch_batches(len(data.train), cfg.global_batch_size, seed=cfg.seed, epoch=epoch)
        for indices in order[batch_in_epoch:]:
            t0 = time.perf_counter()
            per_copy = cfg.global_batch_size // copies
            x, y = get_batch(data.train, indices[copy * per_copy : (copy + 1) * per_copy],
                             run.device)  # fmt: skip
            result = train_step(  # Lab 1's step, given what the shape changes
                loss_fn=forward,
                micro_batches=[(x, y)],  # with --pp > 1 the schedule cuts it
                backward=backward,
                optimizer=optimizer,
                lr=lr_at(step, cfg, plan.total_steps),
                max_norm=cfg.grad_clip,
                clip_params=stage,
                clip_fn=clip,
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
                path = save_any_shape(stage, optimizer, checkpoints, step=step, cfg=run.model_cfg,
                                      tp=layout.tp, shape=layout.by_flag(COMPOSED))  # fmt: skip
                log.info(f"saved {path}")
            if step == plan.stop_at:
                break


# --8<-- [end:loop]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    run = check_inputs(parse_args(argv))  # all checks first: a bad flag fails every rank alike
    data = build_datasets(corpus=run.cfg.corpus, vocab_size=run.model_cfg.vocab_size,
                          block_size=run.model_cfg.max_position_embeddings)  # fmt: skip
    batches = len(epoch_batches(len(data.train), run.cfg.global_batch_size, seed=0, epoch=0))
    with distributed(run.cfg.device, timeout_s=run.cfg.timeout_s):  # joins, always leaves
        train(run, data, batches)
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))  # run_cli under torchrun's @record (tinyscale.comm.job)
# --8<-- [end:main]

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
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from tinyscale.comm.dist import DistEnv, device_for, dist_env, distributed, rank_logger
from tinyscale.comm.parallel_layout import ParallelLayout, ParallelMesh, add_layout_flags
from tinyscale.core.checkpoint import checkpoint_name, latest_checkpoint
from tinyscale.core.cli import add_flags, from_args
from tinyscale.core.config import ModelConfig, load_model_config
from tinyscale.core.data import build_datasets, epoch_batches, get_batch
from tinyscale.core.errors import ArgumentParser, UsageError, run_cli
from tinyscale.core.model import ModelStage, TinyTransformer
from tinyscale.core.training import TrainConfig, lr_at, make_optimizer, plan_steps, seed_everything
from tinyscale.data_parallel.dcp_checkpoint import load_dcp, save_dcp
from tinyscale.pipeline_parallel.pipeline import split_layers
from tinyscale.pipeline_parallel.torch_pipeline import microbatch_loss
from tinyscale.tensor_parallel.tp_dtensor import block_plan, heads_in_rank_order
from tinyscale.tensor_parallel.tp_model import check_tensor_parallel_size

# Gathering a 2-D sharded qkv for the checkpoint takes two all-gathers; torch warns each time.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
# The TP head's logits are a view; FSDP2 warns against in-place ops on it, and we do none.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
AXES = ("pp", "dp_replicate", "dp_shard", "tp")  # the layout's axes this script composes
DEFAULTS = TrainConfig(epochs=1, global_batch_size=16, checkpoint_every=50, log_every=1,
                       output_dir="runs/shape")  # fmt: skip
FLAGS = ("config", "corpus", "epochs", "global_batch_size", "lr", "warmup_steps", "min_lr_ratio",
         "weight_decay", "grad_clip", "seed", "device", "log_every", "checkpoint_every", "max_steps",
         "resume", "output_dir", "log_dir", "timeout_s")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, DEFAULTS, FLAGS, notes={"device": "auto picks one GPU per rank, or the CPU"})
    add_layout_flags(p, AXES)  # --pp --dp --fsdp --tp
    p.add_argument("--microbatches", type=int, default=2, help="per pipeline step (--pp > 1)")
    p.add_argument("--dropout", type=float, default=None, help="override the config's dropout")
    args = p.parse_args(argv)
    args.cfg = from_args(DEFAULTS, args)  # every TrainConfig flag is checked here
    return args


# --8<-- [end:args]


# --8<-- [start:check]
@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """Everything checked before joining the process group."""

    env: DistEnv
    device: torch.device
    model_cfg: ModelConfig
    cfg: TrainConfig
    layout: ParallelLayout  # pp x dp_replicate x dp_shard x tp
    microbatches: int
    resume: Path | None


def check_inputs(args: argparse.Namespace) -> Run:
    """Every bad flag fails here, the same way on every rank, before anything is written."""
    cfg, env = args.cfg, dist_env()
    layout = ParallelLayout.from_args(args, AXES)  # each degree a whole number >= 1
    layout.validate(env.world_size)  # and their product the number of processes
    model_cfg = load_model_config(cfg.config)
    if args.dropout is not None:
        model_cfg = dataclasses.replace(model_cfg, dropout=args.dropout)
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
    checkpoints = Path(cfg.output_dir, "checkpoints")
    resume = latest_checkpoint(checkpoints) if cfg.resume == "auto" else cfg.resume
    if resume is not None and not Path(resume, ".metadata").is_file():
        raise UsageError(f"{resume} is not a complete DCP checkpoint: resume from another")
    return Run(env=env, device=device_for(env, cfg.device), model_cfg=model_cfg, cfg=cfg,
               layout=layout, microbatches=micro, resume=Path(resume) if resume else None)  # fmt: skip


# --8<-- [end:check]


# --8<-- [start:tp]
def parallelize_stage(stage: ModelStage, mesh: DeviceMesh) -> None:
    """Tensor + sequence parallelism on one pipeline stage, over the 1-D ``mesh``.

    The blocks take Week 4's plan (tp_dtensor.block_plan): activations between blocks,
    and between stages, are cut by position (Shard(1)), so a stage sends 1/t of them.
    The embedding is cut by vocabulary rows; the head gathers the logits (Replicate), so
    the loss and the pipeline's loss function stay those of one process.
    """
    order = heads_in_rank_order(stage.cfg, mesh.size())
    for block in stage.blocks.values():
        with torch.no_grad():  # the fused qkv rows in rank order (see in_model_order)
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
        parallelize_module(block, mesh, block_plan(sequence_parallel=True))
    plan = {}
    if stage.first:  # tokens in, replicated; the sum with pos_emb is cut by position
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
        plan[f"blocks.{stage.layers.start}"] = PrepareModuleInput(
            input_layouts=Replicate(), desired_input_layouts=Shard(1), use_local_output=True
        )
    if stage.last:
        plan["ln_f"] = SequenceParallel()
        plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(stage, mesh, plan)
    if stage.first and stage.last and stage.cfg.tie_word_embeddings:
        stage.lm_head.weight = stage.tok_emb.weight  # each style made its own DTensor: retie


def in_model_order(name: str, tensor: torch.Tensor, cfg: ModelConfig, tp: int) -> torch.Tensor:
    """A tensor as the model lays it out. Only qkv differs: its rows are in rank order."""
    if not name.split(".exp_avg")[0].endswith(("attn.qkv.weight", "attn.qkv.bias")):
        return tensor
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return full[torch.argsort(heads_in_rank_order(cfg, tp))]  # the inverse permutation


# --8<-- [end:tp]


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


# --8<-- [start:checkpoint]
def checkpoint_state(stage: ModelStage, optimizer: torch.optim.Optimizer, run: Run, *,
                     for_loading: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """Name -> tensor for DCP: parameters and AdamW moments under the model's names.

    DTensors keep their shards: DCP writes each rank's pieces and reshards on load. The
    tied head is saved as tok_emb.weight (one name, whichever stage holds it). qkv is
    saved whole, in the model's row order (``in_model_order``); to load, a template.
    """
    cfg, tp = run.model_cfg, run.layout.tp
    state: dict[str, torch.Tensor] = {}
    for name, p in stage.named_parameters():
        key = "tok_emb.weight" if cfg.tie_word_embeddings and name == "lm_head.weight" else name
        moments = optimizer.state[p]
        if not moments:  # a fresh optimizer: zero moments, to be filled by the load
            moments.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                           exp_avg_sq=torch.zeros_like(p))  # fmt: skip
        for suffix, t in (("", p.detach()), (".exp_avg", moments["exp_avg"]),
                          (".exp_avg_sq", moments["exp_avg_sq"])):  # fmt: skip
            if key.endswith(("attn.qkv.weight", "attn.qkv.bias")) and tp > 1:
                full_shape = t.shape  # a DTensor's shape is the whole tensor's
                t = (
                    torch.empty(full_shape, device=p.device)
                    if for_loading
                    else in_model_order(key + suffix, t, cfg, tp)
                )
            state[key + suffix] = t
        state["adamw.step"] = moments["step"]
    return state


def place_qkv(stage: ModelStage, optimizer: torch.optim.Optimizer, loaded: dict, run: Run) -> None:
    """After a load: qkv's whole tensors back into rank order and into this rank's shards."""
    order = heads_in_rank_order(run.model_cfg, run.layout.tp)
    for name, p in stage.named_parameters():
        if not name.endswith(("attn.qkv.weight", "attn.qkv.bias")) or run.layout.tp == 1:
            continue
        moments = optimizer.state[p]
        for suffix, target in (("", p), (".exp_avg", moments["exp_avg"]),
                               (".exp_avg_sq", moments["exp_avg_sq"])):  # fmt: skip
            mine = distribute_tensor(loaded[name + suffix][order.to(p.device)], target.device_mesh,
                                     target.placements)  # fmt: skip
            with torch.no_grad():
                target.to_local().copy_(mine.to_local())


def save(stage: ModelStage, optimizer: torch.optim.Optimizer, run: Run, step: int) -> Path:
    """One DCP directory per step: complete once rank 0 has written .metadata, last."""
    path = Path(run.cfg.output_dir, "checkpoints", checkpoint_name(step))
    if run.env.is_main:
        if path.exists():  # saved before by a run we resumed from an earlier step: new
            shutil.rmtree(path)  # files under the old .metadata would be a corrupt mix
        path.mkdir(parents=True)
        shape = run.layout.by_flag(AXES)  # {"pp": 1, "dp": 1, "fsdp": 2, "tp": 2}
        (path / "shape.json").write_text(json.dumps(shape))  # for people; any shape loads
    dist.barrier()
    state = checkpoint_state(stage, optimizer, run)
    state["step"] = torch.tensor(step)
    save_dcp(state, path)  # every rank writes its pieces; rank 0 writes .metadata last
    return path


def load(stage, optimizer, run: Run) -> int:
    """Fill this shape's tensors from a checkpoint saved on any shape; returns its step."""
    state = checkpoint_state(stage, optimizer, run, for_loading=True)
    state["step"] = torch.tensor(0)
    load_dcp(state, run.resume)
    place_qkv(stage, optimizer, state, run)
    for p in stage.parameters():  # one AdamW step count for every parameter
        optimizer.state[p]["step"] = state["adamw.step"].clone()
    return int(state["step"])


# --8<-- [end:checkpoint]


# --8<-- [start:loop]
def sum_tied_gradients(weight: nn.Parameter, group: dist.ProcessGroup) -> None:
    """The embedding's gradient (first stage) plus the head's (last stage), on both ranks."""
    if isinstance(weight, DTensor):  # the embedding's comes out whole: keep the shard's rows
        weight.grad = weight.grad.redistribute(weight.device_mesh, weight.placements)
    grad = weight.grad.to_local() if isinstance(weight.grad, DTensor) else weight.grad
    dist.all_reduce(grad, group=group)  # the same rows on both: the same shard of the grid


def local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if isinstance(t, DTensor) else t.numel()


def clip_gradients(stage: ModelStage, max_norm: float, run: Run, parallel: ParallelMesh) -> float:
    """The global gradient norm over every shard and stage; the tied matrix counted once."""
    squares = torch.zeros((), device=run.device)
    for name, p in stage.named_parameters():
        if run.layout.pp > 1 and name == "lm_head.weight" and run.model_cfg.tie_word_embeddings:
            continue  # stage 0 counts it
        norm = torch.linalg.vector_norm(p.grad)
        squares += (norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2
    if run.layout.pp > 1:
        dist.all_reduce(squares, group=parallel.group("pp"))
    total = squares.sqrt().item()
    scale = min(1.0, max_norm / (total + 1e-6))
    for p in stage.parameters():
        p.grad.mul_(scale)
    return total


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
    step = load(stage, optimizer, run) if run.resume else 0
    if run.resume:
        saved = json.loads(Path(run.resume, "shape.json").read_text())
        log.info(f"resumed from step {step}, saved by {saved}")
    whole = sum(p.numel() for p in stage.parameters())  # a DTensor's numel is the whole's
    held = sum(local_numel(p) for p in stage.parameters())
    log.info(" x ".join(f"{a} {n}" for a, n in layout.by_flag(AXES).items())
             + f" | this rank holds {held:,} of its stage's {whole:,} parameters")  # fmt: skip
    while step < plan.stop_at:
        epoch, batch_in_epoch = plan.position(step)
        order = epoch_batches(len(data.train), cfg.global_batch_size, seed=cfg.seed, epoch=epoch)
        for indices in order[batch_in_epoch:]:
            t0 = time.perf_counter()
            per_copy = cfg.global_batch_size // copies
            x, y = get_batch(data.train, indices[copy * per_copy : (copy + 1) * per_copy],
                             run.device)  # fmt: skip
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg, plan.total_steps)
            optimizer.zero_grad(set_to_none=True)
            if schedule is None:
                loss = TinyTransformer.loss(stage(x), y)
                loss.backward()
            else:
                losses: list[torch.Tensor] = []  # filled on the last stage only
                schedule.step(*((x,) if stage.first else ()), target=y, losses=losses)
                loss = torch.stack(losses).sum() if losses else torch.zeros((), device=run.device)
            if tied is not None:  # the embedding's and the head's gradients, summed
                sum_tied_gradients(stage.tok_emb.weight if stage.first else stage.lm_head.weight,
                                   tied)  # fmt: skip
            norm = clip_gradients(stage, cfg.grad_clip, run, parallel)
            optimizer.step()
            step += 1
            mean = loss.detach().clone()  # every last-stage rank: its copy's loss
            dist.all_reduce(mean)
            mean /= copies * layout.tp  # the tp ranks of a copy hold the same loss
            if step % cfg.log_every == 0 or step == plan.stop_at:
                speed = cfg.global_batch_size * x.shape[1] / (time.perf_counter() - t0)
                log.info(f"step {step:4d}/{plan.total_steps} | loss {mean.item():.4f} | "
                         f"grad norm {norm:.3f} | {speed:,.0f} tokens/s")  # fmt: skip
            if step % cfg.checkpoint_every == 0 or step == plan.stop_at:
                log.info(f"saved {save(stage, optimizer, run, step)}")
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


@record  # an uncaught exception's traceback goes to TORCHELASTIC_ERROR_FILE, for torchrun
def cli() -> int:
    return run_cli(main)


if __name__ == "__main__":
    sys.exit(cli())
# --8<-- [end:main]
